//! When the longest-running hold of this process began, as a gauge of Unix time: a lock held
//! far too long (a stuck job, a handler that never returns) shows while it is still held,
//! where the hold histogram records a hold only once it ends.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::OLDEST_HOLD_START;

/// The holds running in this process, oldest first (two begun at one instant told apart by
/// their number).
static RUNNING: Mutex<BTreeSet<(Instant, u64)>> = Mutex::new(BTreeSet::new());
static NUMBERS: AtomicU64 = AtomicU64::new(0);

/// One hold's place among those running: the gauge moves when the oldest begins or ends.
#[derive(Debug)]
pub(crate) struct RunningHold {
    place: (Instant, u64),
}

impl RunningHold {
    /// A hold that began at `since` (now).
    pub(crate) fn begin(since: Instant) -> Self {
        let place = (since, NUMBERS.fetch_add(1, Ordering::Relaxed));
        let mut running = RUNNING.lock().expect("running holds");
        running.insert(place);
        // Set under the lock, so two threads cannot leave an older value last.
        if running.first() == Some(&place) {
            publish(Some(since));
        }
        Self { place }
    }
}

impl Drop for RunningHold {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().expect("running holds");
        let was_oldest = running.first() == Some(&self.place);
        running.remove(&self.place);
        if was_oldest {
            publish(running.first().map(|(since, _)| *since));
        }
    }
}

/// Sets the gauge to the Unix time `oldest` began at, on this host's wall clock (Prometheus
/// compares it with its own `time()`), or 0 when nothing is held.
fn publish(oldest: Option<Instant>) {
    let began = oldest.map_or(0.0, |since| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        now.saturating_sub(since.elapsed()).as_secs_f64()
    });
    metrics::gauge!(OLDEST_HOLD_START).set(began);
}

//! What this client knows of the server's epoch (see `scripts/epoch.lua`): the life of the
//! Redis data it has seen. A Redis that lost its data (a restart without persistence, a
//! failover to an empty replica) is noticed by the first script that runs there, and the
//! holders of the lost locks are told before the quarantine lets anyone else take them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::scripts::EpochTerms;

#[derive(Debug)]
pub(crate) struct Epoch {
    key: String,
    quarantine_ms: u64,
    /// 0 until a script told one. Learning a new epoch and collecting the leases it ends
    /// happen under this mutex, so no lease taken in the new epoch is counted among them.
    known: Mutex<u64>,
    /// When the restart quarantine this client last heard of ends, on this client's clock;
    /// `None` once its end has been logged.
    quarantine_until: Arc<Mutex<Option<Instant>>>,
}

impl Epoch {
    pub(crate) fn new(key: String, quarantine: Duration) -> Self {
        Self {
            key,
            quarantine_ms: quarantine.as_millis() as u64,
            known: Mutex::new(0),
            quarantine_until: Arc::default(),
        }
    }

    /// What the scripts need: the key, the epoch known now, and the quarantine to start.
    pub(crate) fn terms(&self) -> EpochTerms<'_> {
        EpochTerms {
            key: &self.key,
            known: *self.known.lock().expect("epoch"),
            quarantine_ms: self.quarantine_ms,
        }
    }

    /// Records the epoch a script told; when it replaces an earlier one, Redis lost the data
    /// of that one, and `lost` collects what went with it (while no new lease can start).
    pub(crate) fn learn<T>(&self, epoch: u64, lost: impl FnOnce() -> T) -> Option<T> {
        let mut known = self.known.lock().expect("epoch");
        let earlier = std::mem::replace(&mut *known, epoch);
        (earlier != 0 && earlier != epoch).then(lost)
    }

    /// Records a restart quarantine a script reported, `left` from now. Its start and its end
    /// are logged once each (WARN): every lock of this Redis waits meanwhile, and operators
    /// should see why.
    pub(crate) fn note_quarantine(&self, left: Duration) {
        let ends = Instant::now() + left;
        let started = {
            let mut until = self.quarantine_until.lock().expect("quarantine");
            let running = until.is_some_and(|end| end > Instant::now());
            if until.is_none_or(|end| end < ends) {
                *until = Some(ends);
            }
            !running
        };
        if !started {
            return;
        }
        tracing::warn!(
            left_ms = left.as_millis() as u64,
            "restart quarantine: Redis lost its data (a restart without persistence, a \
             failover to an empty replica, a flush), so no lock is granted until every holder \
             of a lost lock has been told"
        );
        let until = self.quarantine_until.clone();
        tokio::spawn(async move {
            loop {
                let Some(end) = *until.lock().expect("quarantine") else {
                    return;
                };
                if end > Instant::now() {
                    sleep_until(end).await;
                    continue;
                }
                // Logged by the one task that clears this end, if another started meanwhile.
                let mut current = until.lock().expect("quarantine");
                if *current == Some(end) {
                    *current = None;
                    drop(current);
                    tracing::warn!("restart quarantine over: locks are granted again");
                }
                return;
            }
        });
    }

    /// How long the restart quarantine this client heard of still runs, if it does.
    pub(crate) fn quarantine_left(&self) -> Option<Duration> {
        let until = *self.quarantine_until.lock().expect("quarantine");
        until
            .map(|end| end.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_quarantine_is_known_until_it_ends_and_a_later_report_extends_it() {
        let epoch = Epoch::new("lock:epoch".into(), Duration::from_secs(5));
        assert_eq!(epoch.quarantine_left(), None);
        epoch.note_quarantine(Duration::from_secs(3));
        assert_eq!(epoch.quarantine_left(), Some(Duration::from_secs(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        epoch.note_quarantine(Duration::from_secs(4));
        assert_eq!(epoch.quarantine_left(), Some(Duration::from_secs(4)));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(epoch.quarantine_left(), None);
    }
}

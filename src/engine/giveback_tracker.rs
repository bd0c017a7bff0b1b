//! The give-backs under way (`giveback.rs`), which shutdown waits for: a process that exits
//! right after a wait it gave up (a timeout) would otherwise leave its place in the queue,
//! and a grant from the queue to it would keep the lock one lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// How many give-backs are under way, and a signal when none is left.
#[derive(Debug, Default)]
pub(crate) struct GiveBackTracker {
    running: AtomicUsize,
    settled: Notify,
}

/// One give-back under way: it ends when this is dropped (in the give-back's task, so also
/// when that task is cancelled).
pub(crate) struct Running<'a>(&'a GiveBackTracker);

impl<'a> Running<'a> {
    /// The end of a give-back [`GiveBackTracker::begin`] counted.
    pub(crate) fn ends(tracker: &'a GiveBackTracker) -> Self {
        Self(tracker)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.settled.notify_waiters();
        }
    }
}

impl GiveBackTracker {
    /// Counts a give-back about to be spawned (before it is, so shutdown sees it).
    pub(crate) fn begin(&self) {
        self.running.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits until no give-back is under way, for at most `bound`.
    pub(crate) async fn settled(&self, bound: Duration) {
        let _ = tokio::time::timeout(bound, async {
            loop {
                let notified = self.settled.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.running.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_every_give_back_and_no_longer_than_its_bound() {
        let tracker = GiveBackTracker::default();
        tracker.settled(Duration::from_secs(1)).await;
        tracker.begin();
        tracker.begin();
        let started = tokio::time::Instant::now();
        let first = Running::ends(&tracker);
        let second = Running::ends(&tracker);
        drop(first);
        tokio::join!(tracker.settled(Duration::from_secs(10)), async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(second);
        });
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(2),
            "until the last one ended"
        );
        tracker.begin();
        tracker.settled(Duration::from_secs(3)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(5), "bounded");
    }
}

//! Several guards held as one: the combined lost signal, and releasing them all.

use futures_util::StreamExt;
use futures_util::future::join_all;
use futures_util::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::error::Result;
use crate::guard::{LockGuard, LostSignal};
use crate::keys::display_name;

/// The guards of a lock kind's parts, and a lost signal that fires when fewer than
/// `must_hold` of them are still held.
#[derive(Debug)]
pub(crate) struct Parts {
    guards: Vec<LockGuard>,
    must_hold: usize,
    lost: LostSignal,
    /// The task that watches the parts' signals; stopped when the parts are let go, so a
    /// release on purpose never fires the combined signal.
    watcher: Option<AbortHandle>,
}

impl Parts {
    /// Holds `guards`; the whole counts as lost once fewer than `must_hold` are held.
    ///
    /// Must be called within a Tokio runtime when it needs a watcher task (more than one
    /// part).
    pub(crate) fn new(guards: Vec<LockGuard>, must_hold: usize) -> Self {
        let must_hold = must_hold.min(guards.len());
        // One part: its own signal says it all, no task needed.
        if guards.len() == 1 && must_hold == 1 {
            let lost = guards[0].lost_signal();
            return Self {
                guards,
                must_hold,
                lost,
                watcher: None,
            };
        }
        let (fire, lost) = watch::channel(None);
        let tolerated = guards.len() - must_hold;
        let signals: Vec<LostSignal> = guards.iter().map(LockGuard::lost_signal).collect();
        let watcher = (!signals.is_empty()).then(|| {
            tokio::spawn(async move {
                let mut losses: FuturesUnordered<_> =
                    signals.iter().map(LostSignal::lost).collect();
                let mut lost = 0;
                while let Some(reason) = losses.next().await {
                    lost += 1;
                    if lost > tolerated {
                        // The reason of the part whose loss broke the whole.
                        fire.send_replace(Some(reason));
                        return;
                    }
                }
            })
            .abort_handle()
        });
        Self {
            guards,
            must_hold,
            lost: LostSignal::from_receiver(lost),
            watcher,
        }
    }

    pub(crate) fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    pub(crate) fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// How many parts are still held, as far as this process knows.
    pub(crate) fn held(&self) -> usize {
        self.guards.iter().filter(|guard| guard.is_held()).count()
    }

    /// Whether the whole is still held: enough parts held, and no loss reported.
    pub(crate) fn is_held(&self) -> bool {
        !self.lost.is_lost() && self.held() >= self.must_hold
    }

    /// Releases every part at once (in parallel) and waits for each; the first error, if
    /// any, in the parts' order.
    pub(crate) async fn release(mut self) -> Result<()> {
        self.stop_watching();
        release_all(std::mem::take(&mut self.guards)).await
    }

    fn stop_watching(&mut self) {
        if let Some(watcher) = self.watcher.take() {
            watcher.abort();
        }
    }
}

impl Drop for Parts {
    /// The guards are dropped after this, each releasing its lock in the background.
    fn drop(&mut self) {
        self.stop_watching();
    }
}

/// Releases `guards` in parallel and waits for each; the first error in their order.
pub(crate) async fn release_all(guards: Vec<LockGuard>) -> Result<()> {
    join_all(guards.into_iter().map(LockGuard::release))
        .await
        .into_iter()
        .collect()
}

/// Releases `guards` for an acquisition that gave up: errors are only logged, since the
/// caller reports why it gave up, and a lock that could not be released runs out with its
/// lease (or is given back by the engine in the background).
pub(crate) async fn give_up(guards: Vec<LockGuard>) {
    for outcome in join_all(guards.into_iter().map(|guard| {
        let name = guard.name().to_owned();
        async move { (name, guard.release().await) }
    }))
    .await
    {
        if let (name, Err(err)) = outcome {
            tracing::debug!(lock = %display_name(&name), error = %err, "release after a failed acquisition");
        }
    }
}

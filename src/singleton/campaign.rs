//! The campaign: wait in the leadership lock's queue, lead while it is held, step down, and
//! campaign again, until shut down.

use std::future::Future;
use std::pin::{Pin, pin};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};
use tracing::{Instrument, info, info_span, warn};

use crate::error::{ErrorKind, Result};
use crate::guard::LockGuard;
use crate::lease::LostReason;
use crate::meter::{LeadershipChange, leadership_changed};
use crate::singleton::leadership::{Leadership, StopReason};
use crate::singleton::within_lease::{TaskOutcome, WithinLease};
use crate::singleton::{AfterTaskEnd, Singleton};

/// The first pause after a campaign that failed (Redis unreachable), doubled up to
/// [`RETRY_MOST`] while it keeps failing.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between failed campaigns.
const RETRY_MOST: Duration = Duration::from_secs(5);

/// How one term of leadership ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermEnd {
    /// The task returned while this instance led.
    TaskEnded,
    /// The lease was lost or ran out.
    Lost,
    /// The campaign was shut down.
    ShutDown,
}

/// Campaigns for `singleton` and runs `task` in every term this instance wins, until
/// `shutdown` resolves, the client shuts down, or (as the singleton says) the task ends.
pub(crate) async fn campaign<F, Fut, S>(
    singleton: Singleton,
    shutdown: S,
    mut task: F,
) -> Result<()>
where
    F: FnMut(Leadership) -> Fut,
    Fut: Future<Output = ()>,
    S: Future<Output = ()>,
{
    let mut shutdown = pin!(shutdown);
    let mut retry = RETRY_FIRST;
    loop {
        let campaigning = singleton
            .lock
            .acquire()
            .instrument(info_span!("campaign", name = singleton.lock.name()));
        let acquired = tokio::select! {
            biased;
            () = &mut shutdown => return Ok(()),
            acquired = campaigning => acquired,
        };
        let guard = match acquired {
            Ok(guard) => guard,
            Err(error) if error.kind() == ErrorKind::ShutDown => return Ok(()),
            Err(error) if gives_up_on(error.kind()) => return Err(error),
            Err(error) => {
                warn!(name = singleton.lock.name(), %error, pause = ?retry, "campaign failed; campaigning again");
                tokio::select! {
                    biased;
                    () = &mut shutdown => return Ok(()),
                    () = sleep(retry) => {}
                }
                retry = (retry * 2).min(RETRY_MOST);
                continue;
            }
        };
        retry = RETRY_FIRST;
        match lead(&singleton, guard, &mut task, shutdown.as_mut()).await {
            TermEnd::ShutDown => return Ok(()),
            TermEnd::TaskEnded if singleton.after_task_ends == AfterTaskEnd::Resign => {
                return Ok(());
            }
            TermEnd::TaskEnded | TermEnd::Lost => {}
        }
    }
}

/// Errors that campaigning again cannot mend: the configuration or the server's refusal
/// must change first.
fn gives_up_on(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::AccessDenied | ErrorKind::InvalidConfig | ErrorKind::InvalidName
    )
}

/// One term: runs the task while `guard` holds the leadership, tells it to stop when the
/// lease is lost or on shutdown, drops it after the grace or at the lease's end, whichever
/// comes first, and then gives the lock up so the next candidate leads at once.
async fn lead<F, Fut>(
    singleton: &Singleton,
    guard: LockGuard,
    task: &mut F,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> TermEnd
where
    F: FnMut(Leadership) -> Fut,
    Fut: Future<Output = ()>,
{
    let name = singleton.lock.name();
    let lease_end = guard.lease_end();
    let lost = guard.lost_signal();
    let (leadership, control) = Leadership::begin(name, guard);
    let span = info_span!("lead", name, term = leadership.term());
    leadership_changed(name, LeadershipChange::Gained);
    info!(parent: &span, "leading");
    let mut running = Box::pin(WithinLease::new(task(leadership), lease_end.clone()));
    let told = tokio::select! {
        outcome = &mut running => match outcome {
            TaskOutcome::Finished => None,
            // Paused past the lease before the watchdog could say so.
            TaskOutcome::LeaseRanOut => Some(StopReason::Lost(lost.reason().unwrap_or(LostReason::Unreachable))),
        },
        reason = lost.lost() => Some(StopReason::Lost(reason)),
        () = &mut shutdown => Some(StopReason::ShutDown),
    };
    let end = match told {
        None => TermEnd::TaskEnded,
        Some(reason) => {
            control.tell_stop(reason);
            info!(parent: &span, ?reason, "told to stop");
            let stop_by = (Instant::now() + singleton.grace).min(lease_end.at());
            tokio::select! {
                _ = &mut running => {}
                () = sleep_until(stop_by) => {
                    warn!(parent: &span, ?reason, "the task did not stop in time; dropped");
                }
            }
            match reason {
                StopReason::ShutDown => TermEnd::ShutDown,
                _ => TermEnd::Lost,
            }
        }
    };
    drop(running);
    step_down(control.end().await, end).instrument(span).await;
    leadership_changed(
        name,
        if end == TermEnd::Lost {
            LeadershipChange::Lost
        } else {
            LeadershipChange::Resigned
        },
    );
    end
}

/// Gives the leadership's lock up once the task is gone: released on purpose, so Redis grants
/// it to the next candidate at once; a lost one is only dropped.
async fn step_down(guard: Option<LockGuard>, end: TermEnd) {
    let Some(guard) = guard else { return };
    if end == TermEnd::Lost {
        drop(guard);
        info!("stepped down: the lease was lost");
        return;
    }
    match guard.release().await {
        Ok(()) => info!("stepped down: handed over"),
        Err(error) => warn!(%error, "stepped down; the release failed, the lease runs out instead"),
    }
}

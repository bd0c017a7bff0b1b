//! One term under a held lock: the task runs while the lease lasts, is told to stop when the
//! lease is lost or on shutdown, and is dropped after its grace or at the lease's end,
//! whichever comes first. What singletons and schedules share.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tracing::{Instrument, Span, info, info_span, warn};

use crate::error::ErrorKind;
use crate::guard::LockGuard;
use crate::lease::LostReason;
use crate::singleton::leadership::{Leadership, StopReason};
use crate::singleton::within_lease::{TaskOutcome, WithinLease};

/// The first pause after an attempt that failed (Redis unreachable), doubled up to
/// [`RETRY_MOST`] while attempts keep failing.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between failed attempts.
pub(crate) const RETRY_MOST: Duration = Duration::from_secs(5);

/// Errors that trying again cannot mend: the configuration or the server's refusal must
/// change first.
pub(crate) fn gives_up_on(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::AccessDenied | ErrorKind::InvalidConfig | ErrorKind::InvalidName
    )
}

/// How one term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TermEnd {
    /// The task returned while the lock was held.
    TaskEnded,
    /// The lease was lost or ran out.
    Lost,
    /// The run was shut down.
    ShutDown,
}

/// Runs the task `start` makes while `guard` holds the lock, until it returns, the lease is
/// lost or `shutdown` resolves; returns how it ended and the lock, taken back from the
/// leadership (a clone of it kept past the term writes nothing from then on).
pub(crate) async fn run_term<Fut>(
    name: &str,
    guard: LockGuard,
    start: impl FnOnce(Leadership) -> Fut,
    grace: Duration,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    span: &Span,
) -> (TermEnd, Option<LockGuard>)
where
    Fut: Future<Output = ()>,
{
    let lease_end = guard.lease_end();
    let lost = guard.lost_signal();
    let (leadership, control) = Leadership::begin(name, guard);
    let mut running = Box::pin(WithinLease::new(start(leadership), lease_end.clone()));
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
            info!(parent: span, ?reason, "told to stop");
            let stop_by = (Instant::now() + grace).min(lease_end.at());
            tokio::select! {
                _ = &mut running => {}
                () = sleep_until(stop_by) => {
                    warn!(parent: span, ?reason, "the task did not stop in time; dropped");
                }
            }
            match reason {
                StopReason::ShutDown => TermEnd::ShutDown,
                _ => TermEnd::Lost,
            }
        }
    };
    drop(running);
    (end, control.end().await)
}

/// Gives the lock up once the task is gone: released on purpose, so Redis grants it to the
/// next candidate at once; a lost one is only dropped.
pub(crate) async fn step_down(guard: Option<LockGuard>, end: TermEnd, term: Span) {
    let Some(guard) = guard else { return };
    let span = info_span!(parent: &term, "step_down", end = ?end);
    async move {
        if end == TermEnd::Lost {
            drop(guard);
            info!("stepped down: the lease was lost");
            return;
        }
        match guard.release().await {
            Ok(()) => info!("stepped down: handed over"),
            Err(error) => {
                warn!(%error, "stepped down; the release failed, the lease runs out instead")
            }
        }
    }
    .instrument(span)
    .await;
}

//! The campaign: wait in the leadership lock's queue, lead while it is held, step down, and
//! campaign again, until shut down.

use std::future::Future;
use std::pin::{Pin, pin};

use tokio::time::sleep;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::error::{ErrorKind, Result};
use crate::guard::LockGuard;
use crate::meter::{LeadershipChange, leadership_changed};
use crate::singleton::leadership::Leadership;
use crate::singleton::term::{RETRY_FIRST, RETRY_MOST, TermEnd, gives_up_on, run_term, step_down};
use crate::singleton::{AfterTaskEnd, Singleton};

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
        guard.held_for_a_term();
        match lead(&singleton, guard, &mut task, shutdown.as_mut()).await {
            TermEnd::ShutDown => return Ok(()),
            TermEnd::TaskEnded if singleton.after_task_ends == AfterTaskEnd::Resign => {
                return Ok(());
            }
            TermEnd::TaskEnded | TermEnd::Lost => {}
        }
    }
}

/// One term of leadership: runs the task while `guard` holds it, then gives the lock up so
/// the next candidate leads at once.
async fn lead<F, Fut>(
    singleton: &Singleton,
    guard: LockGuard,
    task: &mut F,
    shutdown: Pin<&mut impl Future<Output = ()>>,
) -> TermEnd
where
    F: FnMut(Leadership) -> Fut,
    Fut: Future<Output = ()>,
{
    let name = singleton.lock.name();
    let span = info_span!("lead", name, term = guard.fencing_token());
    leadership_changed(name, LeadershipChange::Gained);
    info!(parent: &span, "leading");
    // For operators only (`lockctl inspect` shows the leader since when): a failure costs
    // the task nothing.
    if let Err(error) = guard.record_leader().await {
        debug!(parent: &span, %error, "the leader could not be recorded");
    }
    let (end, guard) = run_term(name, guard, task, singleton.grace, shutdown, &span).await;
    step_down(guard, end, span).await;
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

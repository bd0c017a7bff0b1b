//! Releasing a guard: carries out what [`ending::decide`] says. A release before the last
//! takes one hold off the count in Redis. The last release of an acquisition ends in one of
//! four ways:
//!
//! 1. **Hand over locally** ([`Step::Carry`]): another task of this client waits for the key
//!    and the fairness budget allows: the lock passes to it with no round trip.
//! 2. **Hand over through Redis** ([`hand_over_through_redis`]): tasks of this client wait
//!    but the budget is spent: one script passes the lock to the first waiting instance and
//!    queues this client's next task behind it, or keeps the lock with a fresh budget when no
//!    other instance waits.
//! 3. **Release** ([`release_last`]): nobody of this client waits: the release script frees
//!    the lock (every hold of its owner) and grants it to the first waiting instance.
//! 4. **Give back in the background** ([`Step::GiveBack`]): a release Redis did not confirm
//!    is retried on fresh connections while what it left could still keep the lock.
//!
//! A release on purpose takes the lease out of the watchdog first, so it is not reported
//! lost.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::budget::Budget;
use crate::engine::deadlines::{Registration, lost_deadline};
use crate::engine::ending::{self, Answer, Entry, Event, Sent, Step, Whose};
use crate::engine::gathered_releases;
use crate::engine::hold::{Acquisition, Baton, Holder, PassingHold};
use crate::engine::waiter::{LastLook, QueuedPlace, Waiter};
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::display_name;
use crate::wire::scripts::{self, HandoverReply};

/// One hold of an acquisition, as one guard owns it. Dropping it releases the hold in the
/// background and never blocks.
#[derive(Debug)]
pub(crate) struct GuardHold {
    holder: Arc<Holder>,
    released: bool,
}

impl GuardHold {
    /// The hold a new guard of `holder` owns (its lease's local holder counts it already).
    pub(crate) fn new(holder: Arc<Holder>) -> Self {
        Self {
            holder,
            released: false,
        }
    }

    /// The local holder this hold belongs to.
    pub(crate) fn holder(&self) -> &Arc<Holder> {
        &self.holder
    }

    /// Releases the hold and waits for Redis to confirm what needs confirming.
    pub(crate) async fn release(mut self) -> Result<()> {
        self.released = true;
        match release_guard(&self.holder) {
            None => Ok(()),
            // Boxed, so a task that awaits a release does not carry the script's large future
            // in its own state while it waits for a lock.
            Some(step) => Box::pin(in_redis(self.holder.clone(), step)).await,
        }
    }
}

/// A dropped guard tells the entry it is released; what needs Redis runs in the background.
impl Drop for GuardHold {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let Some(step) = release_guard(&self.holder) else {
            return;
        };
        let holder = self.holder.clone();
        let runtime = holder.acquisition.shared.runtime.clone();
        runtime.spawn(async move {
            let name = holder.acquisition.name.clone();
            if let Err(err) = in_redis(holder, step).await {
                tracing::debug!(lock = %display_name(&name), error = %err, "background release failed");
            }
        });
    }
}

/// Tells `holder`'s lease that one of its guards is released, and carries the lock to the
/// next local task right here when that is the step. Returns the step left for Redis.
fn release_guard(holder: &Holder) -> Option<Step> {
    let acquisition = &holder.acquisition;
    let budget_left = holder.budget.allows_handover();
    let (step, turn) = acquisition
        .lease_state
        .release_guard(holder.number, budget_left);
    if let Some(mut turn) = turn {
        *turn.baton() = Baton::Passing(PassingHold::new(acquisition.clone(), holder.budget));
    }
    matches!(
        step,
        Step::ReleaseOne | Step::HandOverThroughRedis | Step::ReleaseLast
    )
    .then_some(step)
}

/// The steps of a release that need Redis.
async fn in_redis(holder: Arc<Holder>, step: Step) -> Result<()> {
    match step {
        Step::ReleaseOne => release_one(&holder.acquisition).await,
        Step::HandOverThroughRedis => hand_over_through_redis(&holder).await,
        Step::ReleaseLast => release_last(&holder.acquisition).await,
        // Carried out without Redis, or nothing to do.
        _ => Ok(()),
    }
}

/// A release before the last: one hold less, never the last in Redis (another guard of the
/// acquisition still holds it), so a release sent twice cannot free the lock.
async fn release_one(acquisition: &Acquisition) -> Result<()> {
    let scope = acquisition.holds.release(false);
    let reply = acquisition.run_release_script(scope).await;
    settle_release(acquisition, Sent::ReleaseOne, reply)
}

/// The last release with nobody of this client waiting: every hold of the owner (one, for a
/// read within a write lock, whose owner's other read holds are other guards').
async fn release_last(acquisition: &Acquisition) -> Result<()> {
    acquisition
        .shared
        .watchdog
        .unregister(acquisition.watchdog_id);
    let scope = acquisition.holds.release(true);
    let reply = gathered_releases::release(acquisition, scope).await;
    settle_release(acquisition, Sent::ReleaseLast, reply)
}

/// Carries out Redis's `reply` to the release `sent` (the holds left, or `None` when the
/// owner held nothing), and returns it to the caller.
fn settle_release(acquisition: &Acquisition, sent: Sent, reply: Result<Option<u64>>) -> Result<()> {
    let answer = match &reply {
        Ok(Some(_)) => Answer::Released,
        Ok(None) => Answer::NotOwner,
        Err(err) => failed(err),
    };
    if let Step::GiveBack(whose) = answered(sent, answer) {
        give_back(acquisition, whose, None);
    }
    match reply? {
        Some(_) => Ok(()),
        None => Err(not_owner()),
    }
}

/// The last release while more tasks of this client wait and the budget is spent: one
/// script passes the lock to the first waiting instance and queues this client's next task
/// behind it, or, when no other instance waits, keeps the lock with a fresh budget.
async fn hand_over_through_redis(holder: &Holder) -> Result<()> {
    let acquisition = &holder.acquisition;
    let shared = &acquisition.shared;
    // Released on purpose: out of the watchdog first, so it is not reported lost; a lock
    // Redis keeps for this client is registered again.
    shared.watchdog.unregister(acquisition.watchdog_id);
    let next_owner = shared.new_owner();
    // Registered before the script runs, so the grant to it cannot arrive unheard.
    let slot = shared.pubsub.register(next_owner.clone());
    let sent_at = Instant::now();
    let reply = handover_in_redis(acquisition, &next_owner).await;
    let lease = Duration::from_millis(acquisition.terms.lease_ms);
    let answer = match &reply {
        // Redis renewed the lease when the script ran, after `sent_at`.
        Ok(HandoverReply::Kept { .. }) => Answer::Kept {
            in_time: Instant::now() < lost_deadline(sent_at, lease),
        },
        Ok(HandoverReply::Passed { .. }) => Answer::Passed,
        Ok(HandoverReply::NotOwner) => Answer::NotOwner,
        Err(err) => failed(err),
    };
    let step = answered(Sent::Handover, answer);
    if let Step::GiveBack(whose) = step {
        give_back(acquisition, whose, Some(next_owner.clone()));
    }
    match (step, reply?) {
        (Step::KeepForNextTask, HandoverReply::Kept { token, reserved }) => {
            // The block Redis reserved is the next holders': the first token is the next
            // task's own.
            let window = shared.config.local_handover_window;
            let budget = Budget::reserved(token, reserved, window);
            keep_for_next_task(acquisition, budget, lost_deadline(sent_at, lease));
        }
        (
            Step::PassPlace,
            HandoverReply::Passed {
                server_ms,
                last_token,
            },
        ) => {
            let place = QueuedPlace {
                keys: acquisition.keys.clone(),
                owner: next_owner,
                slot,
                queued_by: LastLook {
                    sent_at,
                    server_ms,
                    last_token,
                },
                undo_within: lease,
            };
            pass_on(acquisition, Baton::Queued(Waiter::queued(shared, place)));
        }
        (_, HandoverReply::NotOwner) => return Err(not_owner()),
        _ => {}
    }
    Ok(())
}

/// The hand-over script of `acquisition`'s lock: passed to the first waiting instance with
/// `next_owner` queued behind it, or kept.
async fn handover_in_redis(
    acquisition: &Acquisition,
    next_owner: &Arc<str>,
) -> Result<HandoverReply> {
    let shared = &acquisition.shared;
    shared
        .connections
        .run(acquisition.keys.hash(), |mut conn| {
            let next_owner = next_owner.clone();
            async move {
                scripts::handover(
                    &mut conn,
                    &acquisition.keys,
                    shared.scope_keys(&acquisition.keys),
                    &acquisition.owner,
                    &next_owner,
                    &acquisition.terms,
                )
                .await
            }
        })
        .await
}

/// Redis kept the lock for this client: back to the watchdog until `expires_at`, and into
/// the key's turn for the next task with the token block Redis reserved.
fn keep_for_next_task(acquisition: &Arc<Acquisition>, budget: Budget, expires_at: Instant) {
    acquisition.shared.watchdog.register(Registration {
        id: acquisition.watchdog_id,
        keys: acquisition.keys.clone(),
        owner: acquisition.owner.clone(),
        lease_state: acquisition.lease_state.clone(),
        kind: acquisition.terms.kind,
        lease_mode: acquisition.lease_mode,
        expires_at,
    });
    let passing = PassingHold::new(acquisition.clone(), budget);
    pass_on(acquisition, Baton::Passing(passing));
}

/// Leaves `baton` in the releasing holder's turn for the next local task. When the turn is
/// gone meanwhile (the lease was reported lost), the baton is dropped, which gives back what
/// it holds.
fn pass_on(acquisition: &Acquisition, baton: Baton) {
    match acquisition.lease_state.take_turn() {
        Some(mut turn) => *turn.baton() = baton,
        None => drop(baton),
    }
}

/// The decision for Redis's `answer` to what a release `sent` (the same for a holder that
/// still has guards, after a release before the last, as for one releasing its last).
fn answered(sent: Sent, answer: Answer) -> Step {
    ending::decide(Entry::Releasing, Event::Answered { sent, answer })
}

/// How a release that failed with `err` was answered: unconfirmed when Redis could not be
/// reached (the script may have run unseen), refused otherwise.
fn failed(err: &LockError) -> Answer {
    if err.kind() == ErrorKind::RedisUnavailable {
        Answer::Unconfirmed
    } else {
        Answer::Refused
    }
}

/// Gives back in the background `whose` holds: the acquisition's, or the place `next_owner`
/// was queued with, or both.
fn give_back(acquisition: &Acquisition, whose: Whose, next_owner: Option<Arc<str>>) {
    if matches!(whose, Whose::Lock | Whose::Both) {
        acquisition.give_back_later(acquisition.owner.clone());
    }
    if let (Whose::Place | Whose::Both, Some(next_owner)) = (whose, next_owner) {
        acquisition.give_back_later(next_owner);
    }
}

fn not_owner() -> LockError {
    LockError::new(
        ErrorKind::NotOwner,
        "the lock was no longer held by this guard (lease lost or force-unlocked)",
    )
}

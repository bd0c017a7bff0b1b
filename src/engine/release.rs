//! Releasing a guard. A release before the last takes one hold off the count in Redis. The
//! last release of an acquisition ends in one of four ways:
//!
//! 1. **Hand over locally** ([`try_carry`]): another task of this client waits for the key
//!    and the fairness budget allows: the lock passes to it with no round trip.
//! 2. **Hand over through Redis** ([`hand_over_through_redis`]): tasks of this client wait
//!    but the budget is spent: one script passes the lock to the first waiting instance and
//!    queues this client's next task behind it, or keeps the lock with a fresh budget when no
//!    other instance waits.
//! 3. **Release** ([`release_last`]): nobody of this client waits: the release script frees
//!    the lock (every hold of its owner) and grants it to the first waiting instance.
//! 4. **Give back in the background** (`RedisHold::give_back_later`): a release Redis did not
//!    confirm is retried on fresh connections while what it left could still keep the lock.
//!
//! A release on purpose takes the lease out of the watchdog first, so it is not reported
//! lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::deadlines::{Registration, lost_deadline};
use crate::engine::gathered_releases;
use crate::engine::hold::{Budget, PassedOn, PassingHold, RedisHold, TaskHold};
use crate::engine::waiter::{LastLook, QueuedPlace, Waiter};
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::display_name;
use crate::wire::scripts::{self, HandoverReply};

/// One hold of an acquisition, as one guard owns it. Dropping it releases the hold in the
/// background and never blocks.
#[derive(Debug)]
pub(crate) struct GuardHold {
    holder: Arc<TaskHold>,
    released: bool,
}

impl GuardHold {
    /// The hold a new guard of `holder` owns (its holds count it already).
    pub(crate) fn new(holder: Arc<TaskHold>) -> Self {
        Self {
            holder,
            released: false,
        }
    }

    /// The local holder this hold belongs to.
    pub(crate) fn holder(&self) -> &Arc<TaskHold> {
        &self.holder
    }

    /// Releases the hold and waits for Redis to confirm what needs confirming.
    pub(crate) async fn release(mut self) -> Result<()> {
        self.released = true;
        match release_hold(&self.holder) {
            None => Ok(()),
            // Boxed, so a task that awaits a release does not carry the script's large future
            // in its own state while it waits for a lock.
            Some(last) => Box::pin(finish_release(self.holder.clone(), last)).await,
        }
    }
}

impl Drop for GuardHold {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // A local hand-over needs no Redis, so it happens right here.
        let Some(last) = release_hold(&self.holder) else {
            return;
        };
        let holder = self.holder.clone();
        let runtime = holder.acquisition.shared.runtime.clone();
        runtime.spawn(async move {
            let name = holder.acquisition.name.clone();
            if let Err(err) = finish_release(holder, last).await {
                tracing::debug!(lock = %display_name(&name), error = %err, "background release failed");
            }
        });
    }
}

/// Takes one guard's hold off `holder`; the last hands the lock to the next local task when
/// it can, right here. Returns what is left to do in Redis: `None` (nothing), or whether
/// the hold released was the last (see [`finish_release`]).
fn release_hold(holder: &TaskHold) -> Option<bool> {
    let last = holder.holds.fetch_sub(1, Ordering::SeqCst) == 1;
    if last && try_carry(holder) {
        return None;
    }
    Some(last)
}

/// The Redis part of a release: one hold less, or the last one (outcomes 2 to 4).
async fn finish_release(holder: Arc<TaskHold>, last: bool) -> Result<()> {
    if !last {
        return release_one(&holder).await;
    }
    if wants_handover(&holder) {
        return hand_over_through_redis(&holder).await;
    }
    release_last(&holder).await
}

/// Outcome 1: hands the lock to the next local task if one waits and the budget allows, with
/// no round trip. Returns whether it did; if not, the lock must be released through Redis.
fn try_carry(holder: &TaskHold) -> bool {
    let acquisition = &holder.acquisition;
    if !carriable(holder) || !holder.budget.allows_handover() {
        return false;
    }
    let Some(mut turn) = acquisition.lease.take_turn_if(|turn| turn.others_waiting()) else {
        return false;
    };
    *turn.baton() = PassedOn::Held(PassingHold::new(acquisition.clone(), holder.budget));
    true
}

/// Whether this holding's lock may stay with this client for its next task.
fn carriable(holder: &TaskHold) -> bool {
    let acquisition = &holder.acquisition;
    acquisition.renewed()
        && acquisition.lease.is_live()
        && holder.reentering.load(Ordering::SeqCst) == 0
}

/// Whether the last release should hand over through Redis (keeping a place in the queue for
/// this client's next task) rather than just release.
fn wants_handover(holder: &TaskHold) -> bool {
    carriable(holder) && holder.acquisition.lease.turn_has_others_waiting()
}

/// Outcome 2, the last release while more tasks of this client wait and the budget is spent:
/// one script passes the lock to the first waiting instance and queues this client's next task
/// behind it, or, when no other instance waits, keeps the lock with a fresh budget.
async fn hand_over_through_redis(holder: &TaskHold) -> Result<()> {
    let acquisition = &holder.acquisition;
    let shared = &acquisition.shared;
    // Released on purpose: out of the watchdog first, so it is not reported lost; a lock
    // Redis keeps for this client is registered again below.
    shared.watchdog.unregister(acquisition.watchdog_id);
    let next_owner = shared.new_owner();
    // Registered before the script runs, so the grant to it cannot arrive unheard.
    let slot = shared.pubsub.register(next_owner.clone());
    let sent_at = Instant::now();
    let reply = match handover_in_redis(acquisition, &next_owner).await {
        Ok(reply) => reply,
        Err(err) => {
            if err.kind() == ErrorKind::RedisUnavailable {
                // Unconfirmed, as a release can be: the script may not have run (the hold
                // stays, renewed by nobody) or ran unseen (the next owner is queued, kept alive
                // by nobody). Both are given back in the background rather than left to their
                // leases; this client's next task then asks Redis anew.
                acquisition.give_back_later(acquisition.owner.clone());
                acquisition.give_back_later(next_owner);
            }
            return Err(err);
        }
    };
    match reply {
        HandoverReply::Kept { token, reserved } => {
            keep_for_next_task(holder, token, reserved, sent_at);
            Ok(())
        }
        HandoverReply::Passed {
            server_ms,
            last_token,
        } => {
            let queued_by = LastLook {
                sent_at,
                server_ms,
                last_token,
            };
            let place = QueuedPlace {
                keys: acquisition.keys.clone(),
                owner: next_owner,
                slot,
                queued_by,
                undo_within: Duration::from_millis(acquisition.terms.lease_ms),
            };
            let queued = Waiter::queued(shared, place);
            match acquisition.lease.take_turn_if(|_| true) {
                Some(mut turn) => *turn.baton() = PassedOn::Queued(queued),
                None => drop(queued),
            }
            Ok(())
        }
        HandoverReply::NotOwner => Err(not_owner()),
    }
}

/// The hand-over script of `acquisition`'s lock: passed to the first waiting instance with
/// `next_owner` queued behind it, or kept.
async fn handover_in_redis(
    acquisition: &RedisHold,
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
                    shared.names(&acquisition.keys),
                    &acquisition.owner,
                    &next_owner,
                    &acquisition.terms,
                )
                .await
            }
        })
        .await
}

/// A release before the last: one hold less, never the last in Redis (another guard of the
/// acquisition still holds it), so a release sent twice cannot free the lock.
async fn release_one(holder: &TaskHold) -> Result<()> {
    let acquisition = &holder.acquisition;
    match acquisition
        .run_release_script(acquisition.holds.release(false))
        .await?
    {
        Some(_) => Ok(()),
        None => Err(not_owner()),
    }
}

/// Outcome 3, the last release with nobody of this client waiting: every hold of the owner
/// (one, for a read within a write lock, whose owner's other read holds are other guards').
/// Outcome 4 when Redis cannot confirm it.
async fn release_last(holder: &TaskHold) -> Result<()> {
    let acquisition = &holder.acquisition;
    acquisition
        .shared
        .watchdog
        .unregister(acquisition.watchdog_id);
    let scope = acquisition.holds.release(true);
    match gathered_releases::release(acquisition, scope).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(not_owner()),
        Err(err) => {
            if err.kind() == ErrorKind::RedisUnavailable {
                // Unconfirmed: keep trying in the background rather than leave the lock to
                // its lease.
                acquisition.give_back_later(acquisition.owner.clone());
            }
            Err(err)
        }
    }
}

/// After a hand-over through Redis that kept the lock for this client (nobody else waits,
/// and Redis renewed the lease when the script ran, after `sent_at`): the lock goes to the
/// next task with the token block Redis reserved, and back to the watchdog; or, answered too
/// late to vouch for the lease, back to Redis, and the next task asks anew.
fn keep_for_next_task(holder: &TaskHold, token: u64, reserved: u64, sent_at: Instant) {
    let acquisition = &holder.acquisition;
    let shared = &acquisition.shared;
    let expires_at = lost_deadline(sent_at, Duration::from_millis(acquisition.terms.lease_ms));
    if Instant::now() >= expires_at {
        acquisition.give_back_later(acquisition.owner.clone());
        return;
    }
    shared.watchdog.register(Registration {
        id: acquisition.watchdog_id,
        keys: acquisition.keys.clone(),
        owner: acquisition.owner.clone(),
        lease: acquisition.lease.clone(),
        kind: acquisition.terms.kind,
        lease_mode: acquisition.lease_mode,
        expires_at,
    });
    // The block Redis reserved is the next holders': the first token is the next task's own.
    let window = shared.config.local_handover_window;
    let budget = Budget::reserved(token, reserved, window);
    let carried = PassingHold::new(acquisition.clone(), budget);
    match acquisition.lease.take_turn_if(|_| true) {
        Some(mut turn) => *turn.baton() = PassedOn::Held(carried),
        // Reported lost meanwhile: the carried hold is dropped, which releases it.
        None => drop(carried),
    }
}

fn not_owner() -> LockError {
    LockError::new(
        ErrorKind::NotOwner,
        "the lock was no longer held by this guard (lease lost or force-unlocked)",
    )
}

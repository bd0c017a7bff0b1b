//! Cohort hand-over: a lock held in Redis passes from one task of this client to the next
//! that waits for it, without a Redis round trip, within a fairness budget; past the budget it
//! goes back through Redis, so other instances get their turn.
//!
//! Correctness of what a successor gets:
//! - **Fencing tokens.** Every Redis acquisition reserves a block of tokens (one plus the
//!   hand-overs allowed) with one `INCRBY`; each local successor takes the next token of the
//!   block, in the order the critical sections start, and the next Redis acquisition anywhere
//!   reserves a block above it. Tokens keep growing strictly per lock.
//! - **The lost signal.** The lease belongs to the Redis acquisition, and successors share
//!   it: a hold is only handed over while its lease is not reported lost, a successor checks
//!   again when it picks it up, and a loss after that fires the signal the successor holds.
//! - Only watchdog-mode leases are handed over: a fixed lease belongs to one holder.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, LockError, Result};
use crate::giveback::give_back;
use crate::guard::{Hold, Holding};
use crate::waiter::QueuedWait;
use crate::watchdog::{Registration, lost_deadline};
use crate::wire::scripts::{self, HandoffReply};

/// What one task of a client leaves for the next task waiting on the same key.
#[derive(Debug, Default)]
pub(crate) enum Baton {
    /// Nothing: the next task goes to Redis.
    #[default]
    Free,
    /// The lock, still held in Redis.
    Held(CarriedHold),
    /// A place in the Redis queue, taken by the release that passed the lock on.
    Queued(QueuedWait),
}

/// What is left of the fairness budget of one Redis acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    next_token: u64,
    tokens_left: u64,
    until: Instant,
}

impl Budget {
    /// The budget of an acquisition whose token block starts at `first_token`; the first
    /// token is the acquirer's own.
    pub(crate) fn new(first_token: u64, block: u64, window: Duration) -> Self {
        Self::reserved(first_token + 1, block.saturating_sub(1), window)
    }

    /// The budget of a block of `block` tokens from `first_token` that nobody holds yet: the
    /// first is the next holder's (a lock a hand-over through Redis kept for this client).
    pub(crate) fn reserved(first_token: u64, block: u64, window: Duration) -> Self {
        Self {
            next_token: first_token,
            tokens_left: block,
            until: Instant::now() + window,
        }
    }

    fn allows_handoff(&self) -> bool {
        self.tokens_left > 0 && Instant::now() < self.until
    }

    /// The next token of the block; `None` once the block is spent.
    fn take_token(&mut self) -> Option<u64> {
        self.tokens_left = self.tokens_left.checked_sub(1)?;
        let token = self.next_token;
        self.next_token += 1;
        Some(token)
    }
}

/// A hold on its way to the next local task. If nobody picks it up (every waiter left), it
/// is released in Redis when dropped.
#[derive(Debug)]
pub(crate) struct CarriedHold {
    hold: Option<Arc<Hold>>,
    budget: Budget,
}

impl CarriedHold {
    fn new(hold: Arc<Hold>, budget: Budget) -> Self {
        Self {
            hold: Some(hold),
            budget,
        }
    }

    /// The hold and the successor's token, if the successor wants a watchdog lease, the
    /// lease is intact and within its deadline, and a token is left; otherwise the hold is
    /// released in the background.
    pub(crate) fn pick_up(mut self, wants_watchdog: bool) -> Option<(Arc<Hold>, u64, Budget)> {
        let usable = self
            .hold
            .as_ref()
            .is_some_and(|hold| wants_watchdog && hold.lease.is_live());
        if !usable {
            return None;
        }
        let token = self.budget.take_token()?;
        let hold = self.hold.take()?;
        Some((hold, token, self.budget))
    }
}

impl Drop for CarriedHold {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else {
            return;
        };
        hold.inner.watchdog.unregister(hold.watchdog_id);
        // Released in the background, retried on fresh connections while the hold could
        // still keep the lock, as any release nobody waits for.
        give_back(
            hold.inner.clone(),
            hold.keys.clone(),
            hold.terms.kind,
            hold.owner.clone(),
            None,
            Duration::from_millis(hold.terms.lease_ms),
        );
    }
}

/// Hands the lock to the next local task if one waits and the budget allows: no round trip.
/// Returns whether it did; if not, the lock must be released through Redis.
pub(crate) fn try_carry(holding: &Holding) -> bool {
    let hold = &holding.hold;
    if !carriable(holding) || !holding.budget.allows_handoff() {
        return false;
    }
    let Some(mut turn) = hold.lease.take_turn_if(|turn| turn.others_waiting()) else {
        return false;
    };
    holding.passed.store(true, Ordering::SeqCst);
    *turn.baton() = Baton::Held(CarriedHold::new(hold.clone(), holding.budget));
    true
}

/// Whether this holding's lock may stay with this client for its next task.
fn carriable(holding: &Holding) -> bool {
    let hold = &holding.hold;
    hold.renewed && hold.lease.is_live() && holding.reentering.load(Ordering::SeqCst) == 0
}

/// Whether the last release should hand over through Redis (keeping a place in the queue for
/// this client's next task) rather than just release.
pub(crate) fn wants_handoff(holding: &Holding) -> bool {
    carriable(holding) && holding.hold.lease.turn_has_others_waiting()
}

/// The last release while more tasks of this client wait and the budget is spent: one
/// script passes the lock to the first waiting instance and queues this client's next task
/// behind it, or, when no other instance waits, keeps the lock with a fresh budget.
pub(crate) async fn hand_over_through_redis(holding: &Holding) -> Result<()> {
    let hold = &holding.hold;
    let inner = &hold.inner;
    // Released on purpose: out of the watchdog first, so it is not reported lost; a lock
    // Redis keeps for this client is registered again below.
    inner.watchdog.unregister(hold.watchdog_id);
    let next_owner = inner.new_owner();
    // Registered before the script runs, so the grant to it cannot arrive unheard.
    let slot = inner.pubsub.register(next_owner.clone());
    let sent_at = Instant::now();
    let reply = inner
        .connections
        .run(hold.keys.hash(), |mut conn| {
            let next_owner = next_owner.clone();
            async move {
                scripts::handoff(
                    &mut conn,
                    &hold.keys,
                    &inner.wake_prefix,
                    &hold.owner,
                    &next_owner,
                    &hold.terms,
                )
                .await
            }
        })
        .await;
    let reply = match reply {
        Ok(reply) => reply,
        Err(err) => {
            if err.kind() == ErrorKind::RedisUnavailable {
                // Unconfirmed, as a release can be: the script may not have run (the hold
                // stays, renewed by nobody) or ran unseen (the next owner is queued, kept alive
                // by nobody). Both are given back in the background rather than left to their
                // leases; this client's next task then asks Redis anew.
                let lease = Duration::from_millis(hold.terms.lease_ms);
                for owner in [hold.owner.clone(), next_owner] {
                    give_back(
                        inner.clone(),
                        hold.keys.clone(),
                        hold.terms.kind,
                        owner,
                        None,
                        lease,
                    );
                }
            }
            return Err(err);
        }
    };
    match reply {
        HandoffReply::Kept { token } => {
            // Redis renewed the lease when the script ran, after it was sent.
            let lease = Duration::from_millis(hold.terms.lease_ms);
            let expires_at = lost_deadline(sent_at, lease);
            if Instant::now() >= expires_at {
                // Answered too late to vouch for the lease: given back, and this client's
                // next task asks Redis anew.
                give_back(
                    inner.clone(),
                    hold.keys.clone(),
                    hold.terms.kind,
                    hold.owner.clone(),
                    None,
                    lease,
                );
                return Ok(());
            }
            inner.watchdog.register(Registration {
                id: hold.watchdog_id,
                keys: hold.keys.clone(),
                owner: hold.owner.clone(),
                lease: hold.lease.clone(),
                kind: hold.terms.kind,
                renew: hold.renewed,
                expires_at,
            });
            // The block Redis reserved is the next holders': the first token is the next
            // task's own.
            let window = inner.config.local_handoff_window;
            let budget = Budget::reserved(token, hold.terms.block, window);
            let carried = CarriedHold::new(hold.clone(), budget);
            holding.passed.store(true, Ordering::SeqCst);
            match hold.lease.take_turn_if(|_| true) {
                Some(mut turn) => *turn.baton() = Baton::Held(carried),
                // Reported lost meanwhile: the carried hold is dropped, which releases it.
                None => drop(carried),
            }
            Ok(())
        }
        HandoffReply::Passed { server_ms } => {
            let queued = QueuedWait::queued(
                inner,
                hold.keys.clone(),
                next_owner,
                slot,
                sent_at,
                server_ms,
                hold.terms.claim_ms,
            );
            match hold.lease.take_turn_if(|_| true) {
                Some(mut turn) => *turn.baton() = Baton::Queued(queued),
                None => drop(queued),
            }
            Ok(())
        }
        HandoffReply::NotOwner => Err(LockError::new(
            ErrorKind::NotOwner,
            "the lock was no longer held by this guard (lease lost or force-unlocked)",
        )),
    }
}

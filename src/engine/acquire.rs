//! The acquire loop: a task takes its turn on the key among this client's tasks, picks up
//! what the task before it left (the lock itself, or a place in the Redis queue), and
//! otherwise asks Redis: it takes the lock, or joins the queue and sleeps until a grant, a
//! wake-up or the re-poll bound. A grant is handed out only while its lease can be vouched
//! for.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Engine;
use crate::engine::hold::{Acquisition, Baton, Budget, Holder};
use crate::engine::lease::LeaseState;
use crate::engine::local::LocalTurn;
use crate::engine::shared::Shared;
use crate::engine::waiter::Waiter;
use crate::engine::watchdog::{Registration, lost_deadline};
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::{LockKeys, shown};
use crate::kind::LockKind;
use crate::lease::Lease;
use crate::wire::scripts::{AcquireMode, AcquireReply, Terms};

/// What is acquired: one named lock of a kind, on a lease.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) lease: Lease,
    pub(crate) kind: LockKind,
}

impl Target {
    /// Acquires this target, waiting (`wait`) or not: the holder of the acquisition, or
    /// `None` when it is held and `wait` is false.
    pub(crate) async fn acquire(&self, engine: &Engine, wait: bool) -> Result<Option<Holder>> {
        engine.shared.ensure_running()?;
        self.lease.validate()?;
        let started = Instant::now();
        // Only an exclusive lock's tasks queue locally; the others each wait in Redis.
        let turn = if !self.kind.queues_locally() {
            None
        } else if wait {
            Some(engine.local.turn(self.keys.hash()).await)
        } else {
            match engine.local.try_turn(self.keys.hash()) {
                Some(turn) => Some(turn),
                None => return Ok(None),
            }
        };
        // Boxed: most waiting tasks are parked above, in the local queue, and should not
        // carry the state of talking to Redis, which only the head of each queue needs.
        Box::pin(self.acquire_with_turn(&engine.shared, turn, wait, started)).await
    }

    /// The rest of an acquisition, once this task has the key's local turn (when its kind
    /// queues locally).
    async fn acquire_with_turn(
        &self,
        shared: &Arc<Shared>,
        mut turn: Option<LocalTurn<Baton>>,
        wait: bool,
        started: Instant,
    ) -> Result<Option<Holder>> {
        shared.ensure_running()?;
        let watchdog = self.lease == Lease::Watchdog;
        let baton = turn
            .as_mut()
            .map_or(Baton::Free, |turn| std::mem::take(turn.baton()));
        let queued = match baton {
            Baton::Held(carried) => match carried.pick_up(watchdog) {
                Some((acquisition, token, budget)) => {
                    if let Some(turn) = turn {
                        acquisition.lease.put_turn(turn);
                    }
                    tracing::debug!(lock = %shown(&self.name), token, "lock handed over locally");
                    return Ok(Some(Holder::new(acquisition, token, budget)));
                }
                // Lost, or not for this lease mode: released in the background.
                None => None,
            },
            // A place queued on the terms of a watchdog lease, which a fixed lease does not
            // share: such a task leaves it (dropping it gives it back) and queues anew.
            Baton::Queued(queued) if wait => watchdog.then_some(queued),
            Baton::Queued(queued) => {
                // Not ours to wait in: left to the next task, or given back with the entry.
                if let Some(turn) = turn.as_mut() {
                    *turn.baton() = Baton::Queued(queued);
                }
                return Ok(None);
            }
            Baton::Free => None,
        };
        let mut waiter =
            queued.unwrap_or_else(|| Waiter::new(shared, self.keys.clone(), self.kind));
        let terms = shared.config.terms(self.lease, self.kind);
        let mode = if wait {
            AcquireMode::Wait
        } else {
            AcquireMode::Try
        };
        let mut nap = shared.config.repoll_interval;
        let mut look = !waiter.is_queued();
        loop {
            shared.ensure_running()?;
            if !look {
                if let Some(grant) = waiter.wait(nap).await {
                    // A grant that cannot be vouched for any more (it lapsed while this task
                    // or its runtime stalled) is never handed out: the lock is looked at again.
                    let deadline = waiter.grant_deadline(grant);
                    if let Some(expires_at) = deadline {
                        let granted = Duration::from_millis(grant.lease_ms);
                        let lease = self.full_lease(&mut waiter, expires_at, granted, &terms);
                        if let Some(expires_at) = Box::pin(lease).await? {
                            let holder = self.grant(
                                shared,
                                turn,
                                Granted {
                                    owner: waiter.settle(),
                                    token: grant.token,
                                    expires_at,
                                    terms,
                                },
                            );
                            self.trace_acquired(&holder, started, "lock handed over by Redis");
                            return Ok(Some(holder));
                        }
                    }
                }
                shared.ensure_running()?;
            }
            look = false;
            let sent_at = Instant::now();
            // Boxed: the script's future is large, and a waiting head should only carry it
            // while it talks to Redis, not while it waits for a grant.
            match Box::pin(waiter.attempt(&terms, mode)).await? {
                AcquireReply::Acquired {
                    token,
                    lease_left_ms,
                } => {
                    let left = u64::try_from(lease_left_ms).unwrap_or(terms.lease_ms);
                    let granted = Duration::from_millis(left);
                    let expires_at = lost_deadline(sent_at, granted);
                    // A reply read back past its deadline (a stall) is not handed out either.
                    if Instant::now() < expires_at {
                        let lease = self.full_lease(&mut waiter, expires_at, granted, &terms);
                        if let Some(expires_at) = Box::pin(lease).await? {
                            let holder = self.grant(
                                shared,
                                turn,
                                Granted {
                                    owner: waiter.settle(),
                                    token,
                                    expires_at,
                                    terms,
                                },
                            );
                            self.trace_acquired(&holder, started, "lock acquired");
                            return Ok(Some(holder));
                        }
                    }
                    look = true;
                }
                AcquireReply::Waiting { lease_left_ms, .. } if wait => {
                    // Woken by the grant; the nap bounds what a missed message or a dead
                    // holder's lease running out can cost.
                    nap = match u64::try_from(lease_left_ms) {
                        Ok(ms) => {
                            Duration::from_millis(ms.max(1)).min(shared.config.repoll_interval)
                        }
                        Err(_) => shared.config.repoll_interval,
                    };
                }
                AcquireReply::Quarantined { left_ms, .. } if wait => {
                    nap = Duration::from_millis(left_ms.max(1)).min(shared.config.repoll_interval);
                }
                AcquireReply::Waiting { .. } | AcquireReply::Quarantined { .. } => {
                    return Ok(None);
                }
                AcquireReply::NotOwner | AcquireReply::EpochChanged { .. } => {
                    return Err(LockError::new(
                        ErrorKind::Redis,
                        "the acquire script refused a first acquisition",
                    ));
                }
            }
        }
    }

    /// The deadline of a lock this waiter was granted with `granted` of lease left: a fixed
    /// lease granted shorter than asked (from the queue, on its claim lease) is extended to
    /// its full length first, as nothing renews it later. `None` when the grant turned out
    /// to be no longer this owner's.
    async fn full_lease(
        &self,
        waiter: &mut Waiter,
        expires_at: Instant,
        granted: Duration,
        terms: &Terms,
    ) -> Result<Option<Instant>> {
        let asked = Duration::from_millis(terms.lease_ms);
        if self.lease == Lease::Watchdog || granted >= asked {
            return Ok(Some(expires_at));
        }
        let sent_at = waiter.extend_to(terms.lease_ms).await?;
        Ok(sent_at.map(|sent_at| lost_deadline(sent_at, asked)))
    }

    fn trace_acquired(&self, holder: &Holder, started: Instant, how: &'static str) {
        tracing::debug!(
            lock = %shown(&self.name),
            token = holder.token,
            waited_ms = started.elapsed().as_millis() as u64,
            how
        );
    }

    /// Builds the holder of an acquisition Redis granted and hands its lease to the watchdog.
    fn grant(
        &self,
        shared: &Arc<Shared>,
        turn: Option<LocalTurn<Baton>>,
        granted: Granted,
    ) -> Holder {
        self.grant_of(shared, turn, granted, true)
    }

    /// [`Target::grant`], for an owner that may hold other guards' holds too
    /// (`owns_every_hold` false: a read within its write lock).
    pub(crate) fn grant_of(
        &self,
        shared: &Arc<Shared>,
        turn: Option<LocalTurn<Baton>>,
        granted: Granted,
        owns_every_hold: bool,
    ) -> Holder {
        let Granted {
            owner,
            token,
            expires_at,
            terms,
        } = granted;
        let lease = Arc::new(LeaseState::new(turn, expires_at));
        let watchdog_id = shared.new_holder_id();
        shared.watchdog.register(Registration {
            id: watchdog_id,
            keys: self.keys.clone(),
            owner: owner.clone(),
            lease: lease.clone(),
            kind: self.kind,
            renew: self.lease == Lease::Watchdog,
            expires_at,
        });
        let budget = Budget::new(token, terms.block, shared.config.local_handoff_window);
        let acquisition = Acquisition {
            shared: shared.clone(),
            name: self.name.clone(),
            keys: self.keys.clone(),
            terms,
            owner,
            lease,
            watchdog_id,
            lease_mode: self.lease,
            owns_every_hold,
        };
        Holder::new(Arc::new(acquisition), token, budget)
    }
}

/// An acquisition Redis granted: to which owner, its first fencing token, when its holder
/// must be told it is lost unless renewed, and the terms it was asked on.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) owner: Arc<str>,
    pub(crate) token: u64,
    pub(crate) expires_at: Instant,
    pub(crate) terms: Terms,
}

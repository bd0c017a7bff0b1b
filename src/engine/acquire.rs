//! The acquire loop: a task takes its turn on the key among this client's tasks, picks up
//! what the task before it left (the lock itself, or a place in the Redis queue), and
//! otherwise asks Redis: it takes the lock, or joins the queue and sleeps until a grant, a
//! wake-up or the re-poll bound. A grant is handed out only while its lease can be vouched
//! for.

use std::ops::ControlFlow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Engine;
use crate::engine::budget::Budget;
use crate::engine::deadlines::{Registration, lost_deadline};
use crate::engine::ending::{self, Event};
use crate::engine::hold::{Acquisition, Baton, Holder, OwnerHolds};
use crate::engine::lease_state::LeaseState;
use crate::engine::local::LocalTurn;
use crate::engine::replicas;
use crate::engine::shared::ClientState;
use crate::engine::wait_bound;
use crate::engine::waiter::Waiter;
use crate::error::{ErrorKind, LockError, Result};
use crate::keys::{LockKeys, display_name};
use crate::lease::Lease;
use crate::lock_kind::LockKind;
use crate::meter::{HandoverPath, kind_label};
use crate::wire::scripts::{AcquireMode, AcquireReply, AcquireTerms};

/// What is acquired: one named lock of a kind, on a lease.
#[derive(Debug, Clone)]
pub(crate) struct LockRequest {
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) lease_mode: Lease,
    pub(crate) kind: LockKind,
}

/// Whether an acquisition waits for a lock that is held, or only tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// Waits its turn: locally, then in the Redis queue.
    Wait,
    /// Takes the lock only if it is free now; never queues.
    Try,
}

impl Patience {
    /// How the acquire script is asked.
    fn mode(self) -> AcquireMode {
        match self {
            Patience::Wait => AcquireMode::Wait,
            Patience::Try => AcquireMode::Try,
        }
    }
}

impl LockRequest {
    /// Acquires this target, as `patience` says: the holder of the acquisition, or `None`
    /// when it is held and this task only tries.
    pub(crate) async fn acquire(
        &self,
        engine: &Engine,
        patience: Patience,
    ) -> Result<Option<Holder>> {
        engine.shared.ensure_running()?;
        self.lease_mode.validate(engine.shared.config.lease_limit)?;
        let started = Instant::now();
        // Only an exclusive lock's tasks queue locally; the others each wait in Redis.
        let turn = if !self.kind.queues_locally() {
            None
        } else {
            match patience {
                Patience::Wait => Some(engine.local.turn(self.keys.shared_hash()).await),
                Patience::Try => match engine.local.try_turn(self.keys.shared_hash()) {
                    Some(turn) => Some(turn),
                    None => return Ok(None),
                },
            }
        };
        // Boxed: most waiting tasks are parked above, in the local queue, and should not
        // carry the state of talking to Redis, which only the head of each queue needs.
        Box::pin(self.acquire_with_turn(&engine.shared, turn, patience, started)).await
    }

    /// The rest of an acquisition, once this task has the key's local turn (when its kind
    /// queues locally): what the task before it left, then Redis.
    async fn acquire_with_turn(
        &self,
        shared: &Arc<ClientState>,
        mut turn: Option<LocalTurn<Baton>>,
        patience: Patience,
        started: Instant,
    ) -> Result<Option<Holder>> {
        shared.ensure_running()?;
        let queued = match self.pick_up(&mut turn, patience) {
            PickedUp::Lock(holder) => return Ok(Some(holder)),
            PickedUp::NotForThisTask => return Ok(None),
            PickedUp::Place(queued) => queued,
        };
        let waiter = queued.unwrap_or_else(|| Waiter::new(shared, self.keys.clone(), self.kind));
        let asking = AcquireLoop {
            target: self,
            shared,
            terms: shared.config.terms(self.lease_mode, self.kind),
            turn,
            waiter,
            started,
        };
        asking.run(patience).await
    }

    /// Takes what the task before this one left in the key's turn, as
    /// [`ending::decide`] says.
    fn pick_up(&self, turn: &mut Option<LocalTurn<Baton>>, patience: Patience) -> PickedUp {
        let baton = turn
            .as_mut()
            .map_or(Baton::Free, |turn| std::mem::take(turn.baton()));
        let arrived = Event::NextArrived {
            watchdog: self.lease_mode == Lease::Watchdog,
            waits: patience == Patience::Wait,
        };
        match (ending::decide(baton.entry(), arrived), baton) {
            (ending::Step::TakeOver, Baton::Passing(passing)) => match passing.take_over() {
                Some((acquisition, token, budget)) => {
                    let turn = turn.take().expect("a lock is passed in a turn");
                    let number = acquisition.lease_state.next_holder(turn);
                    tracing::debug!(
                        lock = %display_name(&self.name),
                        token,
                        handover = HandoverPath::Local.as_str(),
                        "lock handed over locally"
                    );
                    let local = Some(HandoverPath::Local);
                    PickedUp::Lock(Holder::new(acquisition, token, budget, local, number))
                }
                None => PickedUp::Place(None),
            },
            (ending::Step::TakeOver, Baton::Queued(queued)) => PickedUp::Place(Some(queued)),
            (ending::Step::LeaveForNext, baton) => {
                if let Some(turn) = turn.as_mut() {
                    *turn.baton() = baton;
                }
                PickedUp::NotForThisTask
            }
            // Given back (dropping it does), or nothing was left: this task asks Redis.
            (_, baton) => {
                drop(baton);
                PickedUp::Place(None)
            }
        }
    }

    /// Builds the holder of an acquisition Redis granted and hands its lease to the watchdog.
    fn grant(
        &self,
        shared: &Arc<ClientState>,
        turn: Option<LocalTurn<Baton>>,
        granted: Granted,
        handed_over: Option<HandoverPath>,
    ) -> Holder {
        self.grant_of(shared, turn, granted, OwnerHolds::Every, handed_over)
    }

    /// [`LockRequest::grant`], for an owner that may hold other guards' holds too
    /// ([`OwnerHolds::OnlyItsOwn`]: a read within its write lock).
    pub(crate) fn grant_of(
        &self,
        shared: &Arc<ClientState>,
        turn: Option<LocalTurn<Baton>>,
        granted: Granted,
        holds: OwnerHolds,
        handed_over: Option<HandoverPath>,
    ) -> Holder {
        let Granted {
            owner,
            tokens,
            expires_at,
            terms,
        } = granted;
        let token = tokens.first;
        let renewed = self.lease_mode == Lease::Watchdog;
        let lease_state = Arc::new(LeaseState::new(turn, expires_at, renewed));
        let watchdog_id = shared.new_holder_id();
        shared.watchdog.register(Registration {
            id: watchdog_id,
            keys: self.keys.clone(),
            owner: owner.clone(),
            lease_state: lease_state.clone(),
            kind: self.kind,
            lease_mode: self.lease_mode,
            expires_at,
        });
        let budget = Budget::new(token, tokens.reserved, shared.config.local_handover_window);
        let acquisition = Acquisition {
            shared: shared.clone(),
            name: self.name.clone(),
            keys: self.keys.clone(),
            terms,
            owner,
            lease_state,
            watchdog_id,
            lease_mode: self.lease_mode,
            holds,
            reads_within: OnceLock::new(),
            taken_unqueued: handed_over.is_none(),
        };
        Holder::new(Arc::new(acquisition), token, budget, handed_over, 0)
    }
}

/// What the task before this one left in the key's turn, for this one.
enum PickedUp {
    /// The lock itself, handed over without Redis.
    Lock(Holder),
    /// A place in the Redis queue (or nothing): this task asks Redis.
    Place(Option<Waiter>),
    /// A place this task cannot use (it does not wait): left for the next task.
    NotForThisTask,
}

/// One task asking Redis for a lock: it looks, and sleeps in the queue until a grant, a
/// wake-up or the re-poll bound, as long as it waits.
struct AcquireLoop<'a> {
    target: &'a LockRequest,
    shared: &'a Arc<ClientState>,
    terms: AcquireTerms,
    turn: Option<LocalTurn<Baton>>,
    waiter: Waiter,
    started: Instant,
}

/// The steps of [`AcquireLoop::run`]: look, and while queued, listen and sleep, until a look or a
/// grant ends it.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Run the acquire script: take the lock, or join (or keep) a place in the queue.
    Look,
    /// Queued: make sure the wake channel is subscribed before sleeping `nap`.
    Listen { nap: Duration },
    /// Queued and listening: sleep until a grant, a wake-up or `nap`.
    Sleep { nap: Duration },
}

/// What a step leads to: the next step, or the end of the acquisition (the holder, or `None`
/// when the lock is held and this task only tries). Kept apart from [`Step`], which the
/// acquire loop carries across every await, so that its future has no room for a holder.
type Next = ControlFlow<Option<Holder>, Step>;

/// How a grant reached a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HowGranted {
    /// Its look took the lock, before it had a place in the queue.
    Taken,
    /// A queued waiter's look found the lock granted to it from the queue, not the grant's
    /// message: a hand-over through Redis all the same.
    FoundByLook,
    /// The grant's message told it (a releaser granted it from the queue).
    Told,
}

impl HowGranted {
    /// The hand-over a grant was: through Redis, when it came from the queue.
    fn handed_over(self) -> Option<HandoverPath> {
        match self {
            HowGranted::Taken => None,
            HowGranted::FoundByLook | HowGranted::Told => Some(HandoverPath::Redis),
        }
    }
}

impl AcquireLoop<'_> {
    /// Steps from look to listen to sleep and back, until a look or a grant ends the
    /// acquisition.
    async fn run(mut self, patience: Patience) -> Result<Option<Holder>> {
        self.shared.ensure_running()?;
        let mut step = if self.waiter.is_queued() {
            Step::Listen {
                nap: self.shared.config.repoll_interval,
            }
        } else {
            Step::Look
        };
        loop {
            let next = match step {
                Step::Look => self.look(patience).await?,
                Step::Listen { nap } => ControlFlow::Continue(self.listen(nap).await),
                Step::Sleep { nap } => self.sleep(nap).await?,
            };
            match next {
                ControlFlow::Continue(next) => step = next,
                ControlFlow::Break(holder) => return Ok(holder),
            }
        }
    }

    /// Goes on to `step` after a look or a sleep, unless the client shut down meanwhile.
    fn go_on(&self, step: Step) -> Result<Next> {
        self.shared.ensure_running()?;
        Ok(ControlFlow::Continue(step))
    }

    /// Makes sure this waiter hears its grant before it sleeps.
    async fn listen(&mut self, nap: Duration) -> Step {
        // Subscribed just now (on a cluster, the first wait in a slot): a grant may have
        // come before, so the lock is looked at again first.
        if self.waiter.start_listening().await {
            Step::Look
        } else {
            Step::Sleep { nap }
        }
    }

    /// Sleeps in the queue until a grant, a wake-up or `nap`; the grant is handed out, or
    /// the lock looked at again.
    async fn sleep(&mut self, nap: Duration) -> Result<Next> {
        if let Some(grant) = self.waiter.wait(nap).await {
            // A grant that cannot be vouched for any more (it lapsed while this task or its
            // runtime stalled) is never handed out: the lock is looked at again.
            if let Some(expires_at) = self.waiter.grant_deadline(grant) {
                let granted = Duration::from_millis(grant.lease_ms);
                let tokens = ReservedTokens {
                    first: grant.token,
                    reserved: grant.reserved,
                };
                let handed = self.hand_out(tokens, expires_at, granted, HowGranted::Told);
                if let Some(holder) = handed.await? {
                    return Ok(ControlFlow::Break(Some(holder)));
                }
            }
        }
        self.go_on(Step::Look)
    }

    /// Runs the acquire script once, and reads what its reply means for this task.
    async fn look(&mut self, patience: Patience) -> Result<Next> {
        let sent_at = Instant::now();
        // Only a waiter queued before this look can find a grant from the queue.
        let how = if self.waiter.is_queued() {
            HowGranted::FoundByLook
        } else {
            HowGranted::Taken
        };
        // Boxed: the script's future is large, and a waiter should only carry it while it
        // talks to Redis, not while it waits for a grant.
        let reply = Box::pin(self.waiter.attempt(&self.terms, patience.mode())).await?;
        match reply {
            AcquireReply::Acquired {
                token,
                lease_left_ms,
                reserved,
            } => {
                let tokens = ReservedTokens {
                    first: token,
                    reserved,
                };
                self.found(tokens, lease_left_ms, sent_at, how).await
            }
            // Woken by the grant; the nap bounds what a missed message or a dead holder's
            // lease running out can cost.
            AcquireReply::Waiting { lease_left_ms, .. } if patience == Patience::Wait => {
                let repoll = self.shared.config.repoll_interval;
                let nap = u64::try_from(lease_left_ms)
                    .map_or(repoll, |ms| Duration::from_millis(ms.max(1)).min(repoll));
                self.go_on(Step::Listen { nap })
            }
            AcquireReply::Quarantined { left_ms, .. } if patience == Patience::Wait => {
                let nap = self.quarantined(Duration::from_millis(left_ms))?;
                self.go_on(Step::Listen { nap })
            }
            AcquireReply::Waiting { .. } | AcquireReply::Quarantined { .. } => {
                Ok(ControlFlow::Break(None))
            }
            AcquireReply::PermitsMismatch { stored } => Err(self.permits_mismatch(stored)),
            AcquireReply::NotOwner | AcquireReply::EpochChanged { .. } => Err(LockError::new(
                ErrorKind::Redis,
                "the acquire script refused a first acquisition",
            )),
        }
    }

    /// A look found the lock this waiter's (`tokens`, `lease_left_ms` left as the script ran,
    /// sent at `sent_at`): handed out, or looked at again.
    async fn found(
        &mut self,
        tokens: ReservedTokens,
        lease_left_ms: i64,
        sent_at: Instant,
        how: HowGranted,
    ) -> Result<Next> {
        if how == HowGranted::FoundByLook {
            // Granted from the queue, but found by a look, not by the grant's message: the
            // wake channel may be deaf (on a cluster, a subscription lost with a node), so
            // it is subscribed again.
            self.waiter.resubscribe();
        }
        let left = u64::try_from(lease_left_ms).unwrap_or(self.terms.lease_ms);
        let granted = Duration::from_millis(left);
        let expires_at = lost_deadline(sent_at, granted);
        // A reply read back past its deadline (a stall) is not handed out either.
        if Instant::now() < expires_at {
            let handed = self.hand_out(tokens, expires_at, granted, how);
            if let Some(holder) = handed.await? {
                return Ok(ControlFlow::Break(Some(holder)));
            }
        }
        self.go_on(Step::Look)
    }

    /// The nap of a waiter Redis keeps out while it recovers from a loss of its data
    /// (`left` of the quarantine), or the error when the wait cannot outlast it.
    fn quarantined(&self, left: Duration) -> Result<Duration> {
        if wait_bound::outlasted_by(left) {
            return Err(LockError::restart_quarantine(
                &format!(
                    "lock '{}' cannot be acquired before its wait bound",
                    display_name(&self.target.name)
                ),
                left,
            ));
        }
        let repoll = self.shared.config.repoll_interval;
        Ok(left.max(Duration::from_millis(1)).min(repoll))
    }

    /// The error of a semaphore held in Redis with `stored` permits, other than this
    /// client's.
    fn permits_mismatch(&self, stored: u64) -> LockError {
        let LockKind::Semaphore { permits, .. } = self.target.kind else {
            unreachable!("only a semaphore's script counts permits")
        };
        LockError::new(
            ErrorKind::PermitsMismatch,
            format!(
                "semaphore '{}' is held with {stored} permits in Redis, and this client asked \
                 with {permits}",
                display_name(&self.target.name)
            ),
        )
    }

    /// The holder of what Redis granted this waiter (`tokens`, `granted` of lease left, to be
    /// told it is lost at `expires_at`), once a fixed lease found with less left than asked
    /// (by a look, a while after its grant) is extended to its full length, as nothing renews
    /// it later. `how` it was granted says whether it was a hand-over through Redis. `None`
    /// when the grant turned out to be no longer this owner's: look again.
    async fn hand_out(
        &mut self,
        tokens: ReservedTokens,
        expires_at: Instant,
        granted: Duration,
        how: HowGranted,
    ) -> Result<Option<Holder>> {
        let terms = self.terms;
        let asked = Duration::from_millis(terms.lease_ms);
        let extension_needed = self.target.lease_mode != Lease::Watchdog && granted < asked;
        let expires_at = if extension_needed || replicas::asked(self.shared) {
            // Boxed, and only here: most grants need no more round trips, and the acquire
            // loop should not carry their large futures.
            match Box::pin(self.confirm(expires_at, extension_needed)).await? {
                Some(expires_at) => expires_at,
                None => return Ok(None),
            }
        } else {
            expires_at
        };
        let granted = Granted {
            owner: self.waiter.take_owner(),
            tokens,
            expires_at,
            terms,
        };
        let handed_over = how.handed_over();
        let holder = self
            .target
            .grant(self.shared, self.turn.take(), granted, handed_over);
        tracing::debug!(
            lock = %display_name(&self.target.name),
            kind = kind_label(self.target.kind),
            token = tokens.first,
            waited_ms = self.started.elapsed().as_millis() as u64,
            handover = handed_over.map_or("none", HandoverPath::as_str),
            "lock acquired"
        );
        Ok(Some(holder))
    }

    /// The round trips a grant needs before it is handed out (lease left `expires_at`): the
    /// extension of a fixed lease granted shorter than asked (`extension_needed`), and the
    /// replicas' acknowledgement when asked for. Returns when the holder must be told the
    /// lease is lost, or `None` when the grant turned out to be no longer this owner's.
    async fn confirm(
        &mut self,
        expires_at: Instant,
        extension_needed: bool,
    ) -> Result<Option<Instant>> {
        let lease_ms = self.terms.lease_ms;
        let expires_at = if extension_needed {
            match self.waiter.extend_to(lease_ms).await? {
                Some(sent_at) => lost_deadline(sent_at, Duration::from_millis(lease_ms)),
                None => return Ok(None),
            }
        } else {
            expires_at
        };
        // Not acknowledged: the error drops the waiter, which gives the lock back. The write
        // it makes first covers a grant another client wrote (see `replicas`).
        replicas::acknowledged(self.shared, &self.target.keys).await?;
        Ok(Some(expires_at))
    }
}

/// The fencing tokens Redis reserved for a grant: its own, `first`, and those of the local
/// hand-overs after it, `reserved` in all (fewer than asked when the scope's counter ran ahead
/// of the clock: see `lua/lib/tokens.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReservedTokens {
    pub(crate) first: u64,
    pub(crate) reserved: u64,
}

/// An acquisition Redis granted: to which owner, its fencing tokens, when its holder must be
/// told it is lost unless renewed, and the terms it was asked on.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) owner: Arc<str>,
    pub(crate) tokens: ReservedTokens,
    pub(crate) expires_at: Instant,
    pub(crate) terms: AcquireTerms,
}

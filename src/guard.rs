//! What a holder gets: the guard, its fencing token and its lost signal.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::client::Inner;
use crate::cohort::{self, Baton, Budget};
use crate::error::{ErrorKind, LockError, Result};
use crate::giveback::give_back;
use crate::keys::{LockKeys, shown};
use crate::local::LocalTurn;
use crate::wire::scripts::{self, AcquireMode, AcquireReply, ReleaseScope, Terms};

/// Why a lease was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// A fixed lease ran out.
    Expired,
    /// A renewal found the lock deleted or held by another owner.
    Taken,
    /// Redis could not be reached to renew the lease before it would have run out.
    Unreachable,
    /// The client was shut down and released the lock.
    ShutDown,
    /// Redis lost its data (a restart without persistence, a failover to an empty replica,
    /// a flush): every lock held there before is gone.
    DataLost,
}

/// Shared by the local holders of one Redis acquisition and the watchdog: the lost signal,
/// the lease's deadline, and the current holder's turn on the key. A lock released on
/// purpose is taken out of the watchdog first, so it is not reported lost.
#[derive(Debug)]
pub(crate) struct LeaseState {
    lost: watch::Sender<Option<LostReason>>,
    /// When the holder must be told the lease is lost unless a renewal succeeds first; the
    /// watchdog moves it on. Past it the lease is not used, even before the watchdog fires.
    deadline: Mutex<Instant>,
    /// Kept until the lock is released in Redis or handed to the next local task, so no task
    /// of this client overtakes the release; given up as soon as the lease is lost, so this
    /// client's other tasks compete for the lock again instead of queueing behind a guard
    /// that no longer holds it.
    turn: Mutex<Option<LocalTurn<Baton>>>,
}

impl LeaseState {
    /// The state of a lease whose holder has `turn` on the key (none for the kinds that do
    /// not queue locally).
    pub(crate) fn new(turn: Option<LocalTurn<Baton>>, deadline: Instant) -> Self {
        Self {
            lost: watch::Sender::new(None),
            deadline: Mutex::new(deadline),
            turn: Mutex::new(turn),
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Whether the lease can still be vouched for: not reported lost, and its deadline not
    /// passed (a stalled runtime may not have run the watchdog yet).
    pub(crate) fn is_live(&self) -> bool {
        !self.is_lost() && Instant::now() < *self.deadline.lock().expect("lease deadline")
    }

    /// Moves the deadline to `deadline` (a renewal, or a registration with the watchdog).
    pub(crate) fn extend_to(&self, deadline: Instant) {
        *self.deadline.lock().expect("lease deadline") = deadline;
    }

    fn give_up_turn(&self) {
        let turn = self.turn.lock().expect("local turn").take();
        drop(turn);
    }

    /// The current holder's turn, if it still has it and `wanted` says so.
    pub(crate) fn take_turn_if(
        &self,
        wanted: impl FnOnce(&LocalTurn<Baton>) -> bool,
    ) -> Option<LocalTurn<Baton>> {
        let mut turn = self.turn.lock().expect("local turn");
        if turn.as_ref().is_some_and(wanted) {
            turn.take()
        } else {
            None
        }
    }

    /// Whether other tasks of this client wait for the key this lease's holder has.
    pub(crate) fn turn_has_others_waiting(&self) -> bool {
        let turn = self.turn.lock().expect("local turn");
        turn.as_ref().is_some_and(LocalTurn::others_waiting)
    }

    /// Gives the turn of a local successor to this lease.
    pub(crate) fn put_turn(&self, turn: LocalTurn<Baton>) {
        *self.turn.lock().expect("local turn") = Some(turn);
        if self.is_lost() {
            self.give_up_turn();
        }
    }

    /// Fires the lost signal once.
    pub(crate) fn fire(&self, lock: &str, reason: LostReason) {
        let fired = self.lost.send_if_modified(|lost| {
            let first = lost.is_none();
            if first {
                *lost = Some(reason);
            }
            first
        });
        if fired {
            tracing::warn!(lock = %shown(lock), ?reason, "lock lease lost");
            self.give_up_turn();
        }
    }

    fn signal(&self) -> LostSignal {
        LostSignal {
            lost: self.lost.subscribe(),
        }
    }
}

/// Tells a holder that its lease was lost: after that, another owner may hold the lock.
///
/// Cheap to clone; hand it to the code that works under the lock so it can stop in time.
#[derive(Debug, Clone)]
pub struct LostSignal {
    lost: watch::Receiver<Option<LostReason>>,
}

impl LostSignal {
    /// A signal fed by `lost`: the lock kinds that hold several guards as one
    /// (`crate::kinds`) fire it from the signals of their parts.
    pub(crate) fn from_receiver(lost: watch::Receiver<Option<LostReason>>) -> Self {
        Self { lost }
    }

    /// A signal that never fires: the lease of a lock held outside this client (a test's).
    pub(crate) fn never() -> Self {
        let (_, lost) = watch::channel(None);
        Self { lost }
    }

    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Why the lease was lost, if it was.
    pub fn reason(&self) -> Option<LostReason> {
        *self.lost.borrow()
    }

    /// Resolves when the lease is lost; never resolves for a lock that is released normally.
    pub async fn lost(&self) -> LostReason {
        let mut lost = self.lost.clone();
        // Copy the reason out so no borrow of the channel lives across an await.
        let reason = lost
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|reason| *reason);
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }
}

/// One acquisition of a lock in Redis, handed from local holder to local holder.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) inner: Arc<Inner>,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) terms: Terms,
    pub(crate) owner: Arc<str>,
    pub(crate) lease: Arc<LeaseState>,
    pub(crate) watchdog_id: u64,
    /// Renewed by the watchdog; only such holds are handed over locally.
    pub(crate) renewed: bool,
    /// Every hold of the owner belongs to this acquisition, so its last release releases
    /// them all (a hold Redis counted whose reply was lost included). Not so for a read
    /// within a write lock, whose owner's other read holds are other guards'.
    pub(crate) owns_every_hold: bool,
}

impl Hold {
    /// Runs the acquire script for this hold's owner on `terms`: a re-entry, or a read
    /// within its write lock.
    pub(crate) async fn acquire_in_redis(
        &self,
        terms: &Terms,
        mode: AcquireMode,
    ) -> Result<AcquireReply> {
        self.inner
            .connections
            .run(self.keys.hash(), |mut conn| async move {
                let epoch = self.inner.watchdog.epoch().terms(terms.lease_ms);
                scripts::acquire(
                    &mut conn,
                    &self.keys,
                    &self.inner.wake_prefix,
                    &self.owner,
                    terms,
                    mode,
                    &epoch,
                )
                .await
            })
            .await
    }

    /// Runs the release script for this hold's owner: one hold, or all of them. Returns the
    /// holds left, or `None` when the owner held nothing.
    pub(crate) async fn release_in_redis(&self, scope: ReleaseScope) -> Result<Option<u64>> {
        self.inner
            .connections
            .run(self.keys.hash(), |mut conn| async move {
                scripts::release(
                    &mut conn,
                    &self.keys,
                    self.terms.kind,
                    &self.inner.wake_prefix,
                    &self.owner,
                    scope,
                )
                .await
            })
            .await
    }
}

/// One local holder of a hold: its guard and the guard's re-entries.
#[derive(Debug)]
pub(crate) struct Holding {
    pub(crate) hold: Arc<Hold>,
    pub(crate) token: u64,
    pub(crate) budget: Budget,
    /// Guards of this holding not yet released.
    pub(crate) holds: AtomicUsize,
    /// Re-entries on their way to Redis; the lock is not handed over meanwhile.
    pub(crate) reentering: AtomicUsize,
    /// The hold went on to the next local task with its watchdog registration.
    pub(crate) passed: AtomicBool,
}

impl Holding {
    pub(crate) fn new(hold: Arc<Hold>, token: u64, budget: Budget) -> Self {
        Self {
            hold,
            token,
            budget,
            holds: AtomicUsize::new(1),
            reentering: AtomicUsize::new(0),
            passed: AtomicBool::new(false),
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if self.passed.load(Ordering::SeqCst) {
            return;
        }
        self.hold.inner.watchdog.unregister(self.hold.watchdog_id);
        self.hold.lease.give_up_turn();
    }
}

/// Proof of holding a lock. Release it with [`LockGuard::release`] to see the result;
/// dropping it releases in the background and never blocks.
///
/// Ownership belongs to the guard, not to a thread or task: it may move between tasks, and
/// [`LockGuard::reenter`] adds a hold for code that needs the same lock again.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    holding: Arc<Holding>,
    released: bool,
}

impl LockGuard {
    pub(crate) fn new(holding: Holding) -> Self {
        Self {
            holding: Arc::new(holding),
            released: false,
        }
    }

    /// The acquisition this guard holds, shared with its re-entries.
    pub(crate) fn holding(&self) -> &Arc<Holding> {
        &self.holding
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.holding.hold.name
    }

    /// The fencing token of this acquisition: it only grows per lock name, across every
    /// client, in the order critical sections start. Pass it to the resource you protect and
    /// let it refuse older tokens. A re-entry shares the token of the acquisition it
    /// re-enters.
    pub fn fencing_token(&self) -> u64 {
        self.holding.token
    }

    /// The owner id stored in Redis for this acquisition (client instance id and holder id).
    /// Tasks of one client that receive the lock from each other locally share it.
    pub fn owner_id(&self) -> &str {
        &self.holding.hold.owner
    }

    /// A signal that fires if the lease is lost while this guard is held.
    pub fn lost_signal(&self) -> LostSignal {
        self.holding.hold.lease.signal()
    }

    /// Whether this guard still holds the lock, as far as this process knows: not released,
    /// no lost lease reported, and the lease not past the deadline its last renewal gave it.
    pub fn is_held(&self) -> bool {
        !self.released && self.holding.hold.lease.is_live()
    }

    /// Takes the lock once more for the same owner: the hold count in Redis goes up, and the
    /// lock is freed only when every guard is released. The lease is not changed.
    ///
    /// Cancelling the call is safe: a hold Redis granted after the caller left is released
    /// again. Only when the connection breaks mid-call is the outcome unknown; a hold counted
    /// then is released with the last guard, which releases every hold of its owner.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`] when the lock is no longer held by this owner,
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate), and
    /// [`ErrorKind::ShutDown`] after shutdown.
    pub async fn reenter(&self) -> Result<LockGuard> {
        let holding = self.holding.clone();
        let inner = holding.hold.inner.clone();
        inner.ensure_running()?;
        let (deliver, delivered) = oneshot::channel();
        holding.reentering.fetch_add(1, Ordering::SeqCst);
        // The script runs in its own task so that a hold granted to a caller who has left is
        // handed to a guard that is dropped, which releases it.
        inner.runtime.clone().spawn(async move {
            let hold = holding.hold.clone();
            let reply = hold
                .acquire_in_redis(&hold.terms, AcquireMode::Reenter)
                .await;
            // A hold counts only while a guard of the acquisition lives: once the last is
            // released (or the lock passed to the next local task), the hold Redis counted is
            // taken by that last release, which releases every hold of the owner.
            let counted = matches!(reply, Ok(AcquireReply::Acquired { .. }))
                && holding
                    .holds
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |holds| {
                        (holds > 0).then_some(holds + 1)
                    })
                    .is_ok();
            let outcome = match reply {
                Ok(_) if counted => Ok(LockGuard {
                    holding: holding.clone(),
                    released: false,
                }),
                Ok(_) => Err(LockError::new(
                    ErrorKind::NotOwner,
                    "the lock is no longer held by this owner",
                )),
                Err(err) => Err(err),
            };
            holding.reentering.fetch_sub(1, Ordering::SeqCst);
            let _ = deliver.send(outcome);
        });
        delivered
            .await
            .unwrap_or_else(|_| Err(LockError::shut_down()))
    }

    /// Releases this hold. The last hold hands the lock to the next task of this client
    /// that waits for it, when the fairness budget allows (no round trip), or releases it in
    /// Redis and waits for Redis to confirm; Redis then hands it to the first waiting
    /// instance.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`] when the lock was no longer held (its lease was lost or it was
    /// force-unlocked), [`ErrorKind::RedisUnavailable`] when Redis could not be reached (the
    /// lease then runs out on its own, as the watchdog stops renewing it), and
    /// [`ErrorKind::ShutDown`] after shutdown.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        let holding = self.holding.clone();
        let last = holding.holds.fetch_sub(1, Ordering::SeqCst) == 1;
        if last && cohort::try_carry(&holding) {
            return Ok(());
        }
        // Boxed, so a task that awaits a release does not carry the script's large future
        // in its own state while it waits for a lock.
        Box::pin(finish_release(holding, last)).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let holding = self.holding.clone();
        let last = holding.holds.fetch_sub(1, Ordering::SeqCst) == 1;
        // A local hand-over needs no Redis, so it happens right here.
        if last && cohort::try_carry(&holding) {
            return;
        }
        let runtime = holding.hold.inner.runtime.clone();
        runtime.spawn(async move {
            let name = holding.hold.name.clone();
            if let Err(err) = finish_release(holding, last).await {
                tracing::debug!(lock = %shown(&name), error = %err, "background release failed");
            }
        });
    }
}

/// The Redis part of a release: one hold less, or the last hold through Redis.
async fn finish_release(holding: Arc<Holding>, last: bool) -> Result<()> {
    if last && cohort::wants_handoff(&holding) {
        return cohort::hand_over_through_redis(&holding).await;
    }
    let hold = &holding.hold;
    let scope = if last {
        // Released on purpose: out of the watchdog first, so it is not reported lost.
        hold.inner.watchdog.unregister(hold.watchdog_id);
        if hold.owns_every_hold {
            ReleaseScope::All
        } else {
            ReleaseScope::One
        }
    } else {
        ReleaseScope::One
    };
    match hold.release_in_redis(scope).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(LockError::new(
            ErrorKind::NotOwner,
            "the lock was no longer held by this guard (lease lost or force-unlocked)",
        )),
        Err(err) => {
            if last && err.kind() == ErrorKind::RedisUnavailable {
                // Unconfirmed: keep trying in the background rather than leave the lock to
                // its lease. Every hold of this owner is this guard's (it was the last).
                give_back(
                    hold.inner.clone(),
                    hold.keys.clone(),
                    hold.terms.kind,
                    hold.owner.clone(),
                    None,
                    Duration::from_millis(hold.terms.lease_ms),
                );
            }
            Err(err)
        }
    }
}

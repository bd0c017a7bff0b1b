//! What a holder gets: the guard, its fencing token and its lost signal.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::hold::Baton;
use crate::engine::lease_state::LeaseState;
use crate::engine::reenter;
use crate::engine::release::GuardHold;
use crate::error::Result;
use crate::guarded_write::{self, GuardedWrites};
use crate::lease::{Lease, LostReason};
use crate::meter::HandoverPath;
use crate::singleton_records::{self, ClaimMode, TickReply};

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
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only waits.
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

/// Resolves when the lease of any of `guards` is lost, with its reason; never while all are
/// held, nor for no guard. For a handler that holds locks itself (from
/// [`LockClient::acquire_all`](crate::LockClient::acquire_all)) and must stop its work when
/// another owner may take them: `tokio::select!` its work against it.
///
/// # Cancel safety
///
/// Cancel-safe: it only waits.
pub async fn any_lost(guards: &[LockGuard]) -> LostReason {
    let signals: Vec<LostSignal> = guards.iter().map(LockGuard::lost_signal).collect();
    if signals.is_empty() {
        return std::future::pending().await;
    }
    select_all(signals.iter().map(|signal| Box::pin(signal.lost())))
        .await
        .0
}

/// Proof of holding a lock. Release it with [`LockGuard::release`] to see the result;
/// dropping it releases in the background and never blocks.
///
/// Ownership belongs to the guard, not to a thread or task: it may move between tasks, and
/// [`LockGuard::reenter`] adds a hold for code that needs the same lock again.
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    hold: GuardHold,
}

impl LockGuard {
    pub(crate) fn new(hold: GuardHold) -> Self {
        Self { hold }
    }

    /// Marks this hold as a singleton's leadership, held for its term by design: it is left
    /// out of `redis_lock_oldest_hold_start_time_seconds`.
    pub(crate) fn held_for_a_term(&self) {
        self.hold.holder().meter.held_for_a_term();
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.holder().acquisition.name
    }

    /// The fencing token of this acquisition: it only grows per lock name, across every
    /// client, in the order critical sections start. Pass it to the resource you protect and
    /// let it refuse older tokens. A re-entry shares the token of the acquisition it
    /// re-enters.
    pub fn fencing_token(&self) -> u64 {
        self.hold.holder().token
    }

    /// The owner id stored in Redis for this acquisition (client instance id and holder id).
    /// Tasks of one client that receive the lock from each other locally share it.
    pub fn owner_id(&self) -> &str {
        &self.hold.holder().acquisition.owner
    }

    /// How this guard's holder got the lock, for the layer's span: `local` or `redis` when
    /// the holder before it handed it over, `none` when it was taken as found.
    pub(crate) fn handover(&self) -> &'static str {
        self.hold
            .holder()
            .handed_over
            .map_or("none", HandoverPath::as_str)
    }

    /// A signal that fires if the lease is lost while this guard is held.
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal::from_receiver(self.hold.holder().acquisition.lease_state.subscribe())
    }

    /// When this guard's lease runs out in Redis at the earliest, as this process reckons it,
    /// kept current as the watchdog renews it.
    pub(crate) fn lease_end(&self) -> LeaseEnd {
        let acquisition = &self.hold.holder().acquisition;
        let lease = match acquisition.lease_mode {
            Lease::Watchdog => acquisition.shared.config.watchdog_lease,
            Lease::Fixed(lease) => lease,
        };
        LeaseEnd {
            lease_state: Arc::clone(&acquisition.lease_state),
            told_before: lease / 10,
        }
    }

    /// Whether this guard still holds the lock, as far as this process knows: no lost lease
    /// reported, and the lease not past the deadline its last renewal gave it.
    pub fn is_held(&self) -> bool {
        self.hold.holder().acquisition.lease_state.is_live()
    }

    /// Takes the lock once more for the same owner: the hold count in Redis goes up, and the
    /// lock is freed only when every guard is released. The lease is not changed.
    ///
    /// Only when the connection breaks mid-call is the outcome unknown; a hold counted then
    /// is released with the last guard, which releases every hold of its owner.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a hold Redis grants after the caller left is released again.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`](crate::ErrorKind::NotOwner) when the lock is no longer held by
    /// this owner, [`ErrorKind::RedisUnavailable`](crate::ErrorKind::RedisUnavailable) or
    /// [`ErrorKind::Redis`](crate::ErrorKind::Redis) when Redis fails,
    /// [`ErrorKind::AccessDenied`](crate::ErrorKind::AccessDenied) when it refuses this client
    /// (credentials, ACL, certificate), and [`ErrorKind::ShutDown`](crate::ErrorKind::ShutDown)
    /// after shutdown.
    pub async fn reenter(&self) -> Result<LockGuard> {
        reenter::reenter(self.hold.holder().clone())
            .await
            .map(Self::new)
    }

    /// Takes a read hold of this write guard's lock for the same owner, at once (the writer
    /// excludes everyone else, so there is nothing to wait for). It has a fencing token of its
    /// own and the write guard's kind of lease, and outlives the write lock: releasing every
    /// write hold while read holds remain leaves the lock read-held by this owner (a
    /// downgrade, as in Redisson), and readers may then join. A writer that wants the lock
    /// back must acquire it anew.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: a hold Redis grants after the caller left is released.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`](crate::ErrorKind::NotOwner) when this is not a write guard of a
    /// [`ReadWriteLock`](crate::ReadWriteLock), or when its write lock is no longer held
    /// (lease lost, force-unlocked, released),
    /// [`ErrorKind::RedisUnavailable`](crate::ErrorKind::RedisUnavailable) or
    /// [`ErrorKind::Redis`](crate::ErrorKind::Redis) when Redis fails,
    /// [`ErrorKind::AccessDenied`](crate::ErrorKind::AccessDenied) when it refuses this
    /// client, and [`ErrorKind::ShutDown`](crate::ErrorKind::ShutDown) after shutdown.
    pub async fn read_within(&self) -> Result<LockGuard> {
        reenter::read_within(self.hold.holder().clone())
            .await
            .map(Self::new)
    }

    /// The lock's cluster hash tag, `{<escaped name>}`: a key that contains it lands in the
    /// lock's slot, so a guarded write ([`LockGuard::write_if_held`]) can reach it on a Redis
    /// Cluster too: `format!("balance:{}", guard.hash_tag())`.
    pub fn hash_tag(&self) -> &str {
        self.hold.holder().acquisition.keys.hash_tag()
    }

    /// Applies `writes` in one script only while this guard holds the lock: `Ok(true)`
    /// applied, `Ok(false)` refused (nothing written). Redis itself checks, in the script that
    /// writes, that the lock hash still has this guard's owner (its expiry is the lease) and,
    /// for a read-write lock, that it is write-held; so a holder whose lease lapsed while it
    /// was paused, that was force-unlocked or whose Redis lost its data writes nothing, even
    /// before it is told. A guard whose [lost signal](LockGuard::lost_signal) fired answers
    /// `Ok(false)` without asking Redis. Empty `writes` only check the lock.
    ///
    /// Exclusive and fair locks and the write side of a read-write lock can write so: a
    /// reader or a semaphore's permit shares its lock with others. A part of a
    /// [`RedLock`](crate::RedLock) guards writes on its own server by that server's lock,
    /// not by the quorum.
    ///
    /// On a Redis Cluster every key must carry the lock's [hash tag](LockGuard::hash_tag)
    /// (any key works on one server, but tagged ones keep working on a cluster). In a
    /// migrating slot the script runs where the slot's keys go, as every script of the lock
    /// does. With [`min_replicas_acked`](crate::LockClientBuilder::min_replicas_acked), writes
    /// are reported applied once the replicas asked for have them.
    ///
    /// A write Redis rejects when it runs (a key of another type) ends the script, and the
    /// writes before it stay, as in `MULTI`/`EXEC`: Redis does not roll back. A refusal never
    /// writes anything: the check comes first. On a cluster, whose client sends a script
    /// again when its connection dropped before the reply, the writes are applied once: their
    /// first run leaves a key of its own for twice the command timeout, which a second run
    /// finds ([`crate::guide::topologies`]).
    ///
    /// # Cancel safety
    ///
    /// Once sent, the script runs whether or not the caller waits for its answer: cancelling
    /// may leave the writes applied. Nothing is held or queued by it.
    ///
    /// # Errors
    ///
    /// Before anything is sent: [`ErrorKind::UnsupportedGuard`](crate::ErrorKind::UnsupportedGuard)
    /// for a read guard (one taken with [`LockGuard::read_within`] too) or a semaphore's
    /// permit, [`ErrorKind::WrongSlot`](crate::ErrorKind::WrongSlot) on a cluster for a key
    /// outside the lock's slot, [`ErrorKind::InvalidName`](crate::ErrorKind::InvalidName) for a
    /// key of the library's own (a lock's hash, queue or fence, an epoch, a token counter),
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for a command of more
    /// than [`MAX_WRITE_ARGS`](crate::MAX_WRITE_ARGS) arguments, and
    /// [`ErrorKind::ShutDown`](crate::ErrorKind::ShutDown) after shutdown.
    /// [`ErrorKind::Redis`](crate::ErrorKind::Redis) when Redis rejects a write (see above),
    /// [`ErrorKind::RedisUnavailable`](crate::ErrorKind::RedisUnavailable) when Redis could
    /// not be reached or did not answer in time (the writes may or may not have been
    /// applied), [`ErrorKind::AccessDenied`](crate::ErrorKind::AccessDenied) when it refuses
    /// this client (an ACL that does not allow a command or key), and
    /// [`ErrorKind::ReplicasBehind`](crate::ErrorKind::ReplicasBehind) when the writes were
    /// applied but too few replicas acknowledged them in time.
    pub async fn write_if_held(&self, writes: &GuardedWrites) -> Result<bool> {
        guarded_write::write_if_held(self.hold.holder(), writes).await
    }

    /// Claims the current tick of a schedule of `period` whose lock this guard holds.
    pub(crate) async fn claim_tick(&self, period: Duration, mode: ClaimMode) -> Result<TickReply> {
        singleton_records::claim_tick(self.hold.holder(), period, mode).await
    }

    /// Records this guard's owner as its singleton's leader since now, for operators.
    pub(crate) async fn record_leader(&self) -> Result<bool> {
        singleton_records::record_leader(self.hold.holder()).await
    }

    /// Releases this hold. The last hold hands the lock to the next task of this client
    /// that waits for it, when the fairness budget allows (no round trip), or releases it in
    /// Redis and waits for Redis to confirm; Redis then hands it to the first waiting
    /// instance.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call leaves the release to finish in the background, as a dropped
    /// guard's does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`](crate::ErrorKind::NotOwner) when the lock was no longer held
    /// (its lease was lost or it was force-unlocked),
    /// [`ErrorKind::RedisUnavailable`](crate::ErrorKind::RedisUnavailable) when Redis could not
    /// be reached (the lease then runs out on its own, as the watchdog stops renewing it), and
    /// [`ErrorKind::ShutDown`](crate::ErrorKind::ShutDown) after shutdown.
    pub async fn release(self) -> Result<()> {
        self.hold.release().await
    }
}

/// When a lease runs out in Redis at the earliest, as this process reckons it: the lost
/// signal's deadline (its last renewal's or grant's sending plus the lease, less a tenth)
/// plus that tenth. Redis started the lease after the sending, so by its clock it runs out
/// later still. Read again on every call: a renewal moves it on.
#[derive(Debug, Clone)]
pub(crate) struct LeaseEnd {
    lease_state: Arc<LeaseState<Baton>>,
    /// How long before the lease runs out its holder is told it is lost.
    told_before: Duration,
}

impl LeaseEnd {
    /// The moment, as this process's monotonic clock counts.
    pub(crate) fn at(&self) -> Instant {
        self.lease_state.deadline() + self.told_before
    }
}

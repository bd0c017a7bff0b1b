//! `Lock`: one named lock, and the acquire loop.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Inner, LockClient};
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::{Holding, LeaseState, LockGuard};
use crate::keys::LockKeys;
use crate::local::LocalTurn;
use crate::pubsub::Subscription;
use crate::scripts::{self, AcquireReply, ReleaseScope};
use crate::watchdog::Registration;

/// How long an acquired lock lasts without its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Lease {
    /// Renewed by the client's watchdog while the guard lives (the default); the lock outlives
    /// a dead holder by at most the watchdog lease (30 s by default).
    #[default]
    Watchdog,
    /// Never renewed: the lock is released by Redis when this runs out, and the guard's lost
    /// signal fires.
    Fixed(Duration),
}

/// What Redis holds for a lock, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// Owner ids and their hold counts (empty when the lock is free).
    pub holders: Vec<(String, u64)>,
    /// Time left on the lease, when the lock is held.
    pub ttl: Option<Duration>,
    /// The last fencing token handed out for this name, if any.
    pub fence: Option<u64>,
}

/// One named lock of a [`LockClient`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Lock {
    client: LockClient,
    name: Arc<str>,
    keys: Arc<LockKeys>,
    lease: Lease,
}

impl Lock {
    pub(crate) fn new(client: LockClient, name: &str, keys: LockKeys) -> Self {
        Self {
            client,
            name: name.into(),
            keys: Arc::new(keys),
            lease: Lease::Watchdog,
        }
    }

    /// The same lock, acquired with `lease` (default [`Lease::Watchdog`]).
    #[must_use]
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Redis keys behind this lock.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// Waits until the lock is acquired, however long that takes. Cancel by dropping the
    /// future: nothing stays held or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails, and
    /// [`ErrorKind::ShutDown`] after shutdown.
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.acquire_inner(true)
            .await
            .map(|guard| guard.expect("a waiting acquire returns a guard"))
    }

    /// Waits at most `wait` for the lock.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when `wait` passes first, and the errors of
    /// [`Lock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<LockGuard> {
        match tokio::time::timeout(wait, self.acquire()).await {
            Ok(acquired) => acquired,
            Err(_) => Err(LockError::timeout(&format!(
                "lock '{}' not acquired within {wait:?}",
                self.name
            ))),
        }
    }

    /// Takes the lock if it is free now; `Ok(None)` when it is held (here or elsewhere).
    ///
    /// # Errors
    ///
    /// The errors of [`Lock::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_inner(false).await
    }

    async fn acquire_inner(&self, wait: bool) -> Result<Option<LockGuard>> {
        let inner = &self.client.inner;
        inner.ensure_running()?;
        let started = Instant::now();
        let turn = if wait {
            inner.local.turn(self.keys.hash()).await
        } else {
            match inner.local.try_turn(self.keys.hash()) {
                Some(turn) => turn,
                None => return Ok(None),
            }
        };
        let (owner, holder) = inner.new_owner();
        let lease = self.lease_duration();
        let mut subscription: Option<Subscription> = None;
        loop {
            inner.ensure_running()?;
            if let Some(subscription) = subscription.as_mut() {
                subscription.mark_seen();
            }
            let sent_at = Instant::now();
            match self.attempt(inner, &owner, lease).await? {
                AcquireReply::Acquired(token) => {
                    let guard = self.grant(turn, owner, holder, token, sent_at + lease);
                    tracing::debug!(
                        lock = %self.name,
                        token,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "lock acquired"
                    );
                    return Ok(Some(guard));
                }
                AcquireReply::Held(pttl) if wait => {
                    self.wait_for_release(&mut subscription, pttl).await;
                }
                AcquireReply::Held(_) => return Ok(None),
                AcquireReply::NotOwner => {
                    return Err(LockError::new(
                        ErrorKind::Redis,
                        "the acquire script refused a first acquisition",
                    ));
                }
            }
        }
    }

    fn lease_duration(&self) -> Duration {
        match self.lease {
            Lease::Watchdog => self.client.inner.config.watchdog_lease,
            Lease::Fixed(lease) => lease,
        }
    }

    /// Sleeps until the lock may be free. The first call subscribes to the release channel
    /// and returns once the server confirmed it, so the next look sees a release published
    /// before the subscription landed. Later calls wake on a release message, when the
    /// holder's lease runs out, or at the re-poll bound, whichever comes first.
    async fn wait_for_release(&self, subscription: &mut Option<Subscription>, pttl: i64) {
        let inner = &self.client.inner;
        let repoll = inner.config.repoll_interval;
        match subscription {
            None => {
                let fresh = subscription.insert(inner.pubsub.subscribe(self.keys.channel()));
                fresh.confirmed(repoll).await;
            }
            Some(subscription) => {
                let nap = match u64::try_from(pttl) {
                    Ok(ms) => Duration::from_millis(ms.max(1)).min(repoll),
                    // No expiry on the key: only a message or the re-poll tells.
                    Err(_) => repoll,
                };
                subscription.wait(nap).await;
            }
        }
    }

    /// Builds the guard of a granted acquisition and hands its lease to the watchdog.
    fn grant(
        &self,
        turn: LocalTurn,
        owner: Arc<str>,
        holder: u64,
        token: u64,
        expires_at: Instant,
    ) -> LockGuard {
        let inner = &self.client.inner;
        let lease = Arc::new(LeaseState::new(turn));
        inner.watchdog.register(Registration {
            id: holder,
            keys: self.keys.clone(),
            owner: owner.clone(),
            lease: lease.clone(),
            renew: self.lease == Lease::Watchdog,
            expires_at,
        });
        LockGuard::new(Holding {
            inner: inner.clone(),
            name: self.name.clone(),
            keys: self.keys.clone(),
            owner,
            token,
            lease,
            watchdog_id: holder,
            holds: AtomicUsize::new(1),
        })
    }

    /// One run of the acquire script. If the caller leaves before seeing the answer
    /// (cancelled, or the command timed out), a lock Redis may have granted is released.
    async fn attempt(
        &self,
        inner: &Arc<Inner>,
        owner: &Arc<str>,
        lease: Duration,
    ) -> Result<AcquireReply> {
        let mut conn = inner.connections.get().await?;
        let pending = PendingAcquire {
            undo: Some(Undo {
                inner: inner.clone(),
                keys: self.keys.clone(),
                owner: owner.clone(),
                conn: conn.clone(),
            }),
        };
        let lease_ms = lease.as_millis().max(1) as u64;
        let reply = inner
            .connections
            .bounded(scripts::acquire(
                &mut conn, &self.keys, owner, lease_ms, false,
            ))
            .await?;
        pending.disarm();
        Ok(reply)
    }

    /// What Redis holds for this lock: owners, hold counts, lease left, last fencing token.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails.
    pub async fn inspect(&self) -> Result<LockState> {
        let keys = self.keys.clone();
        let (holders, pttl, fence): (Vec<(String, u64)>, i64, Option<u64>) = self
            .client
            .inner
            .connections
            .run(|mut conn| async move {
                redis::pipe()
                    .cmd("HGETALL")
                    .arg(keys.hash())
                    .cmd("PTTL")
                    .arg(keys.hash())
                    .cmd("GET")
                    .arg(keys.fence())
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(LockState {
            holders,
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence,
        })
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    ///
    /// As [`Lock::inspect`].
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(!self.inspect().await?.holders.is_empty())
    }

    /// Time left on the current holder's lease; `None` when the lock is free.
    ///
    /// # Errors
    ///
    /// As [`Lock::inspect`].
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>> {
        Ok(self.inspect().await?.ttl)
    }

    /// The holder's hold count (1 plus its re-entries); 0 when the lock is free.
    ///
    /// # Errors
    ///
    /// As [`Lock::inspect`].
    pub async fn hold_count(&self) -> Result<u64> {
        Ok(self.inspect().await?.holders.iter().map(|(_, n)| n).sum())
    }

    /// Removes the lock whoever holds it and wakes its waiters; for operators. The holder
    /// learns of it at its next renewal (its lost signal fires). Returns whether a lock was
    /// removed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails.
    pub async fn force_unlock(&self) -> Result<bool> {
        let keys = self.keys.clone();
        self.client
            .inner
            .connections
            .run(|mut conn| async move { scripts::force_unlock(&mut conn, &keys).await })
            .await
    }
}

/// Releases a lock Redis may have granted to an attempt whose caller never saw the answer.
/// The undo goes out on the same multiplexed connection, so it runs after the attempt.
struct PendingAcquire {
    undo: Option<Undo>,
}

struct Undo {
    inner: Arc<Inner>,
    keys: Arc<LockKeys>,
    owner: Arc<str>,
    conn: redis::aio::MultiplexedConnection,
}

impl PendingAcquire {
    fn disarm(mut self) {
        self.undo = None;
    }
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        let Some(Undo {
            inner,
            keys,
            owner,
            mut conn,
        }) = self.undo.take()
        else {
            return;
        };
        let runtime = inner.runtime.clone();
        runtime.spawn(async move {
            inner.connections.note_sent();
            let undone = tokio::time::timeout(
                inner.connections.command_timeout(),
                scripts::release(&mut conn, &keys, &owner, ReleaseScope::All),
            )
            .await;
            tracing::debug!(
                lock = keys.hash(),
                ?undone,
                "released an acquisition nobody saw"
            );
        });
    }
}

impl LockClient {
    /// Acquires every lock in `names`, all or nothing, in one canonical order (by Redis key),
    /// so two callers naming the same locks in different orders never deadlock. Duplicate
    /// names are taken once. The guards come back in canonical order; on an error the locks
    /// already taken are released.
    ///
    /// Bound the wait with `tokio::time::timeout`: dropping the future releases what it took.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] for a bad name (before anything is taken), and the errors
    /// of [`Lock::acquire`].
    pub async fn acquire_all<N: AsRef<str>>(
        &self,
        names: &[N],
        lease: Lease,
    ) -> Result<Vec<LockGuard>> {
        let mut locks = names
            .iter()
            .map(|name| Ok(self.lock(name.as_ref())?.with_lease(lease)))
            .collect::<Result<Vec<_>>>()?;
        locks.sort_by(|a, b| a.keys.hash().cmp(b.keys.hash()));
        locks.dedup_by(|a, b| a.keys.hash() == b.keys.hash());
        let mut guards = Vec::with_capacity(locks.len());
        for lock in &locks {
            guards.push(lock.acquire().await?);
        }
        Ok(guards)
    }
}

//! `Lock`: one named lock, and the acquire loop.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::LockClient;
use crate::cohort::{Baton, Budget};
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::{Hold, Holding, LeaseState, LockGuard};
use crate::keys::{LockKeys, shown, shown_all};
use crate::kind::LockKind;
use crate::local::LocalTurn;
use crate::waiter::QueuedWait;
use crate::watchdog::{Registration, lost_deadline};
use crate::wire::scripts::{self, AcquireMode, AcquireReply, Terms};

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
    /// Owner ids and their hold counts (empty when the lock is free): one owner, or each
    /// reader of a read-write lock.
    pub holders: Vec<(String, u64)>,
    /// Time left on the lease, when the lock is held.
    pub ttl: Option<Duration>,
    /// The top of the fencing counter: the last token reserved for this name, while the
    /// counter lives (it expires a lease after its last reservation).
    pub fence: Option<u64>,
}

/// One named lock of a [`LockClient`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Lock {
    client: LockClient,
    name: Arc<str>,
    keys: Arc<LockKeys>,
    lease: Lease,
    kind: LockKind,
}

impl Lock {
    pub(crate) fn new(client: LockClient, name: &str, keys: LockKeys, kind: LockKind) -> Self {
        Self {
            client,
            name: name.into(),
            keys: Arc::new(keys),
            lease: Lease::Watchdog,
            kind,
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

    /// How this lock is shared and in which order waiters get it.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The client this lock belongs to.
    pub fn client(&self) -> &LockClient {
        &self.client
    }

    /// Waits until the lock is acquired, however long that takes. Cancel by dropping the
    /// future: nothing stays held or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate), and
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
    /// [`ErrorKind::Timeout`] when `wait` passes first
    /// ([`ErrorKind::RestartQuarantine`] when it passes while Redis recovers from a loss of
    /// its data), and the errors of [`Lock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<LockGuard> {
        match tokio::time::timeout(wait, self.acquire()).await {
            Ok(acquired) => acquired,
            Err(_) => Err(self.client.wait_bound_passed(&format!(
                "lock '{}' not acquired within {wait:?}",
                shown(&self.name)
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
        // Only an exclusive lock's tasks queue locally; the others each wait in Redis.
        let turn = if !self.kind.queues_locally() {
            None
        } else if wait {
            Some(inner.local.turn(self.keys.hash()).await)
        } else {
            match inner.local.try_turn(self.keys.hash()) {
                Some(turn) => Some(turn),
                None => return Ok(None),
            }
        };
        // Boxed: most waiting tasks are parked above, in the local queue, and should not
        // carry the state of talking to Redis, which only the head of each queue needs.
        Box::pin(self.acquire_with_turn(turn, wait, started)).await
    }

    /// The rest of an acquisition, once this task has the key's local turn (when its kind
    /// queues locally).
    async fn acquire_with_turn(
        &self,
        mut turn: Option<LocalTurn<Baton>>,
        wait: bool,
        started: Instant,
    ) -> Result<Option<LockGuard>> {
        let inner = &self.client.inner;
        inner.ensure_running()?;
        let watchdog = self.lease == Lease::Watchdog;
        let baton = turn
            .as_mut()
            .map_or(Baton::Free, |turn| std::mem::take(turn.baton()));
        let queued = match baton {
            Baton::Held(carried) => match carried.pick_up(watchdog) {
                Some((hold, token, budget)) => {
                    if let Some(turn) = turn {
                        hold.lease.put_turn(turn);
                    }
                    tracing::debug!(lock = %shown(&self.name), token, "lock handed over locally");
                    return Ok(Some(LockGuard::new(Holding::new(hold, token, budget))));
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
            queued.unwrap_or_else(|| QueuedWait::new(inner, self.keys.clone(), self.kind));
        let terms = self.terms();
        let mode = if wait {
            AcquireMode::Wait
        } else {
            AcquireMode::Try
        };
        let mut nap = inner.config.repoll_interval;
        let mut look = !waiter.is_queued();
        loop {
            inner.ensure_running()?;
            if !look {
                if let Some(grant) = waiter.wait(nap).await {
                    // A grant that cannot be vouched for any more (it lapsed while this task
                    // or its runtime stalled) is never handed out: the lock is looked at again.
                    let deadline = waiter.grant_deadline(grant);
                    if let Some(expires_at) = deadline {
                        let granted = Duration::from_millis(grant.lease_ms);
                        let lease = self.full_lease(&mut waiter, expires_at, granted, &terms);
                        if let Some(expires_at) = Box::pin(lease).await? {
                            let guard =
                                self.grant(turn, waiter.settle(), grant.token, expires_at, terms);
                            self.trace_acquired(&guard, started, "lock handed over by Redis");
                            return Ok(Some(guard));
                        }
                    }
                }
                inner.ensure_running()?;
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
                            let guard = self.grant(turn, waiter.settle(), token, expires_at, terms);
                            self.trace_acquired(&guard, started, "lock acquired");
                            return Ok(Some(guard));
                        }
                    }
                    look = true;
                }
                AcquireReply::Waiting { lease_left_ms, .. } if wait => {
                    // Woken by the grant; the nap bounds what a missed message or a dead
                    // holder's lease running out can cost.
                    nap = match u64::try_from(lease_left_ms) {
                        Ok(ms) => {
                            Duration::from_millis(ms.max(1)).min(inner.config.repoll_interval)
                        }
                        Err(_) => inner.config.repoll_interval,
                    };
                }
                AcquireReply::Quarantined { left_ms, .. } if wait => {
                    nap = Duration::from_millis(left_ms.max(1)).min(inner.config.repoll_interval);
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
        waiter: &mut QueuedWait,
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

    fn trace_acquired(&self, guard: &LockGuard, started: Instant, how: &'static str) {
        tracing::debug!(
            lock = %shown(&self.name),
            token = guard.fencing_token(),
            waited_ms = started.elapsed().as_millis() as u64,
            how
        );
    }

    /// What this lock asks of Redis: its lease, how long a queued place lives without a
    /// refresh, the lease of a hand-over from the queue, and the token block.
    pub(crate) fn terms(&self) -> Terms {
        let config = &self.client.inner.config;
        let alive_ms = millis(config.waiter_alive());
        match self.lease {
            Lease::Watchdog => {
                let lease_ms = millis(config.watchdog_lease);
                Terms {
                    lease_ms,
                    alive_ms,
                    // A waiter that died since its last refresh holds the lock this long at
                    // most; a live one's watchdog extends it at its next tick.
                    claim_ms: lease_ms.min(alive_ms),
                    // Tokens for the local hand-overs, which only an exclusive lock makes.
                    block: if self.kind.queues_locally() {
                        u64::from(config.local_handoff_limit) + 1
                    } else {
                        1
                    },
                    kind: self.kind,
                }
            }
            Lease::Fixed(lease) => Terms {
                lease_ms: millis(lease),
                alive_ms,
                claim_ms: millis(lease),
                block: 1,
                kind: self.kind,
            },
        }
    }

    /// Builds the guard of an acquisition Redis granted and hands its lease to the watchdog.
    pub(crate) fn grant(
        &self,
        turn: Option<LocalTurn<Baton>>,
        owner: Arc<str>,
        token: u64,
        expires_at: Instant,
        terms: Terms,
    ) -> LockGuard {
        self.grant_of(turn, owner, token, expires_at, terms, true)
    }

    /// [`Lock::grant`], for an owner that may hold other guards' holds too
    /// (`owns_every_hold` false: a read within its write lock).
    pub(crate) fn grant_of(
        &self,
        turn: Option<LocalTurn<Baton>>,
        owner: Arc<str>,
        token: u64,
        expires_at: Instant,
        terms: Terms,
        owns_every_hold: bool,
    ) -> LockGuard {
        let inner = &self.client.inner;
        let lease = Arc::new(LeaseState::new(turn, expires_at));
        let watchdog_id = inner.new_holder_id();
        let renewed = self.lease == Lease::Watchdog;
        inner.watchdog.register(Registration {
            id: watchdog_id,
            keys: self.keys.clone(),
            owner: owner.clone(),
            lease: lease.clone(),
            kind: self.kind,
            renew: renewed,
            expires_at,
        });
        let budget = Budget::new(token, terms.block, inner.config.local_handoff_window);
        let hold = Hold {
            inner: inner.clone(),
            name: self.name.clone(),
            keys: self.keys.clone(),
            terms,
            owner,
            lease,
            watchdog_id,
            renewed,
            owns_every_hold,
        };
        LockGuard::new(Holding::new(Arc::new(hold), token, budget))
    }

    /// What Redis holds for this lock: owners, hold counts, lease left, last fencing token.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate).
    pub async fn inspect(&self) -> Result<LockState> {
        let keys = self.keys.clone();
        let (fields, pttl, fence): (Vec<(String, String)>, i64, Option<u64>) = self
            .client
            .inner
            .connections
            .run(self.keys.hash(), |mut conn| async move {
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
            holders: holders(fields),
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

    /// The holder's hold count (1 plus its re-entries; of a read-write lock, every holder's
    /// together); 0 when the lock is free.
    ///
    /// # Errors
    ///
    /// As [`Lock::inspect`].
    pub async fn hold_count(&self) -> Result<u64> {
        Ok(self.inspect().await?.holders.iter().map(|(_, n)| n).sum())
    }

    /// Removes the lock whoever holds it, and hands it to the first waiting instance (of a
    /// read-write lock: one writer, or the readers first in line together); for operators.
    /// The holder learns of it at its next renewal (its lost signal fires). Returns whether a
    /// lock was removed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate).
    pub async fn force_unlock(&self) -> Result<bool> {
        let keys = self.keys.clone();
        self.client
            .inner
            .connections
            .run(self.keys.hash(), |mut conn| async move {
                scripts::force_unlock(&mut conn, &keys, self.kind, &self.client.inner.wake_prefix)
                    .await
            })
            .await
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
        self.acquire_all_of_kind(names, lease, LockKind::Exclusive)
            .await
    }

    /// [`LockClient::acquire_all`] with a bound on the wait: when `wait` passes first, the
    /// locks already taken are released in the background, as dropped guards are. For locks
    /// whose names a handler finds in the request body, which the layer never sees: take them
    /// with the layer's `key_prefix`, and answer a failure as the layer would with
    /// [`Rejection::from_lock_error`](crate::layer::Rejection::from_lock_error).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when `wait` passes first ([`ErrorKind::RestartQuarantine`] when
    /// it passes while Redis recovers from a loss of its data), and the errors of
    /// [`LockClient::acquire_all`].
    pub async fn acquire_all_timeout<N: AsRef<str>>(
        &self,
        names: &[N],
        lease: Lease,
        wait: Duration,
    ) -> Result<Vec<LockGuard>> {
        self.acquire_all_of_kind_within(names, lease, LockKind::Exclusive, wait)
            .await
    }

    /// [`LockClient::acquire_all_timeout`] for locks of `kind` (the layer's sharing mode).
    pub(crate) async fn acquire_all_of_kind_within<N: AsRef<str>>(
        &self,
        names: &[N],
        lease: Lease,
        kind: LockKind,
        wait: Duration,
    ) -> Result<Vec<LockGuard>> {
        match tokio::time::timeout(wait, self.acquire_all_of_kind(names, lease, kind)).await {
            Ok(acquired) => acquired,
            Err(_) => {
                let names: Vec<String> = names.iter().map(|n| n.as_ref().to_owned()).collect();
                Err(self.wait_bound_passed(&format!(
                    "locks {} not acquired within {wait:?}",
                    shown_all(&names)
                )))
            }
        }
    }

    /// [`LockClient::acquire_all`] for locks of `kind`.
    async fn acquire_all_of_kind<N: AsRef<str>>(
        &self,
        names: &[N],
        lease: Lease,
        kind: LockKind,
    ) -> Result<Vec<LockGuard>> {
        let mut locks = names
            .iter()
            .map(|name| Ok(self.lock_of_kind(name.as_ref(), kind)?.with_lease(lease)))
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

/// The owners and hold counts among a lock hash's fields. A read-write lock's hash also
/// holds its mode, a reader's lease deadline after its count, and the read holds its writer
/// took (`<owner>:r`, counted with the owner's); see `wire/lua/rw.lua`.
fn holders(fields: Vec<(String, String)>) -> Vec<(String, u64)> {
    let mut holders: Vec<(String, u64)> = Vec::with_capacity(fields.len());
    for (field, value) in fields {
        let Some(count) = value
            .split(' ')
            .next()
            .and_then(|count| count.parse::<u64>().ok())
        else {
            continue;
        };
        let owner = field.strip_suffix(":r").unwrap_or(&field);
        match holders.iter_mut().find(|(known, _)| known == owner) {
            Some((_, holds)) => *holds += count,
            None => holders.push((owner.to_owned(), count)),
        }
    }
    holders
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::holders;

    fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(field, value)| ((*field).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn a_plain_lock_hash_is_its_holders() {
        assert_eq!(
            holders(fields(&[("a:1", "3")])),
            vec![("a:1".to_owned(), 3)]
        );
    }

    #[test]
    fn a_read_write_lock_hash_counts_holds_not_its_mode_or_deadlines() {
        let read = fields(&[
            ("mode", "read"),
            ("a:1", "2 1700000000000"),
            ("b:7", "1 1700000000500"),
        ]);
        assert_eq!(
            holders(read),
            vec![("a:1".to_owned(), 2), ("b:7".to_owned(), 1)]
        );
        // A writer's read holds count as its own.
        let write = fields(&[("mode", "write"), ("a:1", "1"), ("a:1:r", "2")]);
        assert_eq!(holders(write), vec![("a:1".to_owned(), 3)]);
    }
}

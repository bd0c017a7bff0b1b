//! `Lock`: one named lock, a handle on the engine's acquire loop; and the constructors of
//! locks on [`LockClient`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::LockClient;
use crate::engine::acquire::{LockRequest, Patience};
use crate::engine::release::GuardHold;
use crate::engine::wait_bound;
use crate::meter::{counted, counted_try, kind_label};
// The docs name the error kinds.
#[cfg(doc)]
use crate::error::ErrorKind;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::keys::{LockKeys, display_name, display_names};
use crate::layout::{self, HashField, Holds};
use crate::lease::Lease;
use crate::lock_kind::LockKind;
use crate::wire::scripts;

/// What Redis holds for a lock, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockState {
    /// Owner ids and their hold counts (empty when the lock is free): one owner, or each
    /// reader of a read-write lock.
    pub holders: Vec<(String, u64)>,
    /// Time left on the lease, when the lock is held.
    pub ttl: Option<Duration>,
    /// The last token of the block last granted to this name from its queue, while that
    /// grant's lease lives. `None` for a lock taken free (its token went to its holder alone)
    /// and once the grant's lease ran out.
    pub fence: Option<u64>,
}

/// One named lock of a [`LockClient`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Lock {
    client: LockClient,
    target: LockRequest,
}

impl Lock {
    fn new(client: LockClient, name: &str, keys: LockKeys, kind: LockKind) -> Self {
        let target = LockRequest {
            name: name.into(),
            keys: Arc::new(keys),
            lease_mode: Lease::Watchdog,
            kind,
        };
        Self { client, target }
    }

    /// The same lock, acquired with `lease` (default [`Lease::Watchdog`]).
    #[must_use]
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.target.lease_mode = lease;
        self
    }

    /// The same lock taken as `kind` (a semaphore's, for another number of permits).
    pub(crate) fn of_kind(&self, kind: LockKind) -> Self {
        let mut lock = self.clone();
        lock.target.kind = kind;
        lock
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// The Redis keys behind this lock.
    pub fn keys(&self) -> &LockKeys {
        &self.target.keys
    }

    /// The lock's cluster hash tag, `{<escaped name>}`, the same as its guards'
    /// ([`LockGuard::hash_tag`]): for naming, before the lock is taken, the keys its guarded
    /// writes will write.
    pub fn hash_tag(&self) -> &str {
        self.target.keys.hash_tag()
    }

    /// How this lock is shared and in which order waiters get it.
    pub fn kind(&self) -> LockKind {
        self.target.kind
    }

    /// The client this lock belongs to.
    pub fn client(&self) -> &LockClient {
        &self.client
    }

    /// How long the lock lasts without its holder: the watchdog lease, or the fixed one.
    pub(crate) fn lease_length(&self) -> Duration {
        match self.target.lease_mode {
            Lease::Watchdog => self.client.engine.shared.config.watchdog_lease,
            Lease::Fixed(lease) => lease,
        }
    }

    /// Puts `locks` in the one order every caller takes them in, so two callers naming the
    /// same locks in different orders never deadlock, and drops duplicates. Key first, server
    /// second: the server only breaks ties between locks of the same key, so processes that
    /// spell a server differently still agree on every other pair.
    pub(crate) fn sort_canonically(locks: &mut Vec<Lock>) {
        fn canonical(lock: &Lock) -> (&str, &str) {
            (lock.target.keys.hash(), lock.client.server())
        }
        locks.sort_by(|a, b| canonical(a).cmp(&canonical(b)));
        locks.dedup_by(|a, b| canonical(a) == canonical(b));
    }

    /// Waits until the lock is acquired, however long that takes.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future leaves nothing held, queued or subscribed (a lock
    /// Redis granted meanwhile is given back in the background).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate),
    /// [`ErrorKind::InvalidConfig`] for a
    /// [`Lease::Fixed`] shorter than a millisecond or longer than the client's
    /// [lease limit](crate::LockClientBuilder::lease_limit) (before anything is written), and
    /// [`ErrorKind::ShutDown`] after shutdown.
    pub async fn acquire(&self) -> Result<LockGuard> {
        counted(kind_label(self.target.kind), self.acquire_part()).await
    }

    /// [`Lock::acquire`] as one part of an acquisition that counts itself (a multi-lock's, a
    /// quorum's, the layer's).
    pub(crate) async fn acquire_part(&self) -> Result<LockGuard> {
        self.acquire_inner(Patience::Wait)
            .await
            .map(|guard| guard.expect("a waiting acquire returns a guard"))
    }

    /// [`Lock::try_acquire`] as one part of an acquisition that counts itself.
    pub(crate) async fn try_acquire_part(&self) -> Result<Option<LockGuard>> {
        self.acquire_inner(Patience::Try).await
    }

    async fn acquire_inner(&self, patience: Patience) -> Result<Option<LockGuard>> {
        let acquired = self.target.acquire(&self.client.engine, patience).await?;
        Ok(acquired.map(|holder| LockGuard::new(GuardHold::new(Arc::new(holder)))))
    }

    /// Waits at most `wait` for the lock.
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::acquire`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`] when `wait` passes first
    /// ([`ErrorKind::RestartQuarantine`] when it passes while Redis recovers from a loss of
    /// its data), and the errors of [`Lock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<LockGuard> {
        let bounded = async {
            match wait_bound::until(Instant::now() + wait, self.acquire_part()).await {
                Ok(acquired) => acquired,
                Err(_) => Err(self.client.wait_bound_error(&format!(
                    "lock '{}' not acquired within {wait:?}",
                    display_name(&self.target.name)
                ))),
            }
        };
        counted(kind_label(self.target.kind), bounded).await
    }

    /// Takes the lock if it is free now; `Ok(None)` when it is held (here or elsewhere).
    ///
    /// # Cancel safety
    ///
    /// As [`Lock::acquire`].
    ///
    /// # Errors
    ///
    /// The errors of [`Lock::acquire`].
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        counted_try(kind_label(self.target.kind), self.try_acquire_part()).await
    }

    /// What Redis holds for this lock: owners, hold counts, lease left, last fencing token.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate).
    pub async fn inspect(&self) -> Result<LockState> {
        let keys = self.target.keys.clone();
        let (fields, pttl, fence): (Vec<(String, String)>, i64, Option<String>) = self
            .client
            .engine
            .shared
            .connections
            .run(self.target.keys.hash(), |mut conn| async move {
                redis::pipe()
                    .cmd("HGETALL")
                    .arg(keys.hash())
                    .cmd("PTTL")
                    .arg(keys.hash())
                    .cmd("GET")
                    .arg(keys.last_grant())
                    .query_async(&mut conn)
                    .await
            })
            .await?;
        Ok(LockState {
            holders: holders(fields),
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence: fence.as_deref().and_then(layout::last_granted_token),
        })
    }

    /// Whether anyone holds the lock.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
    ///
    /// # Errors
    ///
    /// As [`Lock::inspect`].
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(!self.inspect().await?.holders.is_empty())
    }

    /// Time left on the current holder's lease; `None` when the lock is free.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
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
    /// # Cancel safety
    ///
    /// Cancel-safe: it only reads.
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
    /// # Cancel safety
    ///
    /// Once sent, the script runs whether or not the caller waits for its answer: cancelling
    /// does not undo it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`] when Redis fails,
    /// [`ErrorKind::AccessDenied`] when it refuses this client (credentials, ACL, certificate).
    pub async fn force_unlock(&self) -> Result<bool> {
        let keys = self.target.keys.clone();
        self.client
            .engine
            .shared
            .connections
            .run(self.target.keys.hash(), |mut conn| async move {
                let shared = &self.client.engine.shared;
                let operation = format!("force-unlock:{}", shared.new_owner());
                let scope_keys = shared.scope_keys(&keys);
                scripts::force_unlock(&mut conn, &keys, self.target.kind, scope_keys, &operation)
                    .await
            })
            .await
    }
}

impl LockClient {
    /// The lock called `name`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidName`] when the name is empty or longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        self.lock_of_kind(name, LockKind::Exclusive)
    }

    /// The lock called `name`, taken as `kind`.
    pub(crate) fn lock_of_kind(&self, name: &str, kind: LockKind) -> Result<Lock> {
        let keys = LockKeys::new(&self.engine.shared.config.prefix, name)?;
        Ok(Lock::new(self.clone(), name, keys, kind))
    }

    /// The semaphore called `name` as a lock handle on its own keys, taken as `kind` (a
    /// number of its permits).
    pub(crate) fn semaphore_of_kind(&self, name: &str, kind: LockKind) -> Result<Lock> {
        let keys = LockKeys::semaphore(&self.engine.shared.config.prefix, name)?;
        Ok(Lock::new(self.clone(), name, keys, kind))
    }

    /// The fair lock called `name`: every task, of every client, gets it in the order it
    /// asked. It shares its Redis keys with [`LockClient::lock`] of the same name, so the two
    /// exclude each other.
    ///
    /// # Errors
    ///
    /// As [`LockClient::lock`].
    pub fn fair_lock(&self, name: &str) -> Result<Lock> {
        self.lock_of_kind(name, LockKind::Fair)
    }

    /// Acquires every lock in `names`, all or nothing, in one canonical order (by Redis key),
    /// so two callers naming the same locks in different orders never deadlock. Duplicate
    /// names are taken once. The guards come back in canonical order; on an error the locks
    /// already taken are released.
    ///
    /// Bound the wait with `tokio::time::timeout`: dropping the future releases what it took.
    /// The metrics count it as one `multi` acquisition, as a [`MultiLock`](crate::MultiLock).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
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
        let acquiring = self.acquire_all_of_kind(names, lease, LockKind::Exclusive);
        counted("multi", acquiring).await
    }

    /// [`LockClient::acquire_all`] with a bound on the wait: when `wait` passes first, the
    /// locks already taken are released in the background, as dropped guards are. For locks
    /// whose names a handler finds where no key extractor looks (a body that is not JSON;
    /// keys in a JSON body are `JsonKeys`'s, feature `json`): take them with the layer's
    /// `key_prefix`, and answer a failure as the layer would with
    /// [`Rejection::from_lock_error`](crate::layer::Rejection::from_lock_error); stop the work
    /// when a lease is lost ([`any_lost`](crate::any_lost)) and answer
    /// [`Rejection::from_lost_lease`](crate::layer::Rejection::from_lost_lease).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
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
        let bounded = self.acquire_all_of_kind_until(names, lease, LockKind::Exclusive, wait);
        counted("multi", bounded).await
    }

    /// [`LockClient::acquire_all_timeout`] for locks of `kind` (the layer's sharing mode; of
    /// a semaphore's kind, one permit of each name's semaphore: the layer's per-key limit),
    /// counted as one acquisition of `kind`, whatever the number of names: one per request.
    pub(crate) async fn acquire_all_of_kind_within<N: AsRef<str>>(
        &self,
        names: &[N],
        lease: Lease,
        kind: LockKind,
        wait: Duration,
    ) -> Result<Vec<LockGuard>> {
        let bounded = self.acquire_all_of_kind_until(names, lease, kind, wait);
        counted(kind_label(kind), bounded).await
    }

    /// [`LockClient::acquire_all_of_kind`] bounded by `wait`, uncounted.
    async fn acquire_all_of_kind_until<N: AsRef<str>>(
        &self,
        names: &[N],
        lease: Lease,
        kind: LockKind,
        wait: Duration,
    ) -> Result<Vec<LockGuard>> {
        let acquiring = self.acquire_all_of_kind(names, lease, kind);
        match wait_bound::until(Instant::now() + wait, acquiring).await {
            Ok(acquired) => acquired,
            Err(_) => {
                let names: Vec<String> = names.iter().map(|n| n.as_ref().to_owned()).collect();
                Err(self.wait_bound_error(&format!(
                    "locks {} not acquired within {wait:?}",
                    display_names(&names)
                )))
            }
        }
    }

    /// [`LockClient::acquire_all`] for locks of `kind`, uncounted.
    async fn acquire_all_of_kind<N: AsRef<str>>(
        &self,
        names: &[N],
        lease: Lease,
        kind: LockKind,
    ) -> Result<Vec<LockGuard>> {
        let mut locks = names
            .iter()
            .map(|name| {
                let lock = match kind {
                    LockKind::Semaphore { .. } => self.semaphore_of_kind(name.as_ref(), kind)?,
                    _ => self.lock_of_kind(name.as_ref(), kind)?,
                };
                Ok(lock.with_lease(lease))
            })
            .collect::<Result<Vec<_>>>()?;
        Lock::sort_canonically(&mut locks);
        let mut guards = Vec::with_capacity(locks.len());
        for lock in &locks {
            guards.push(lock.acquire_part().await?);
        }
        Ok(guards)
    }
}

/// One owner among a lock hash's fields: its hold count, and a reader's own lease deadline
/// (server ms) when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HashHolder {
    pub(crate) owner: String,
    pub(crate) holds: u64,
    pub(crate) deadline_ms: Option<u64>,
}

/// A lock hash's mode (a read-write lock's `read` or `write`) and its owners with their hold
/// counts, a writer's reads within its lock counted with its own (see [`crate::layout`]).
pub(crate) fn hash_holders(fields: Vec<(String, String)>) -> (Option<String>, Vec<HashHolder>) {
    let mut mode = None;
    let mut holders: Vec<HashHolder> = Vec::with_capacity(fields.len());
    for (field, value) in fields {
        let owner = match layout::hash_field(&field) {
            HashField::Mode => {
                mode = Some(value);
                continue;
            }
            HashField::Nobodys => continue,
            HashField::Owner { owner, .. } => owner,
        };
        let Some(Holds { holds, deadline_ms }) = layout::holds(&value) else {
            continue;
        };
        match holders.iter_mut().find(|known| known.owner == owner) {
            Some(known) => known.holds += holds,
            None => holders.push(HashHolder {
                owner: owner.to_owned(),
                holds,
                deadline_ms,
            }),
        }
    }
    (mode, holders)
}

/// The owners and hold counts among a lock hash's fields (see [`hash_holders`]).
fn holders(fields: Vec<(String, String)>) -> Vec<(String, u64)> {
    hash_holders(fields)
        .1
        .into_iter()
        .map(|holder| (holder.owner, holder.holds))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{hash_holders, holders};

    /// Hash fields from pairs.
    pub(crate) fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
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
        // The sign that someone may wait is no holder.
        assert_eq!(
            holders(fields(&[("queued", "1"), ("a:1", "1"), ("queued.2", "1")])),
            vec![("a:1".to_owned(), 1)]
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

    #[test]
    fn a_semaphore_hash_is_its_holders_with_their_permits_and_deadlines_not_its_counts() {
        let semaphore = fields(&[
            ("permits", "3"),
            ("used", "3"),
            ("a:1", "2 1700000000000"),
            ("b:7", "1 1700000000500"),
        ]);
        let (mode, parsed) = hash_holders(semaphore);
        assert_eq!(mode, None);
        let parsed: Vec<(&str, u64, Option<u64>)> = parsed
            .iter()
            .map(|holder| (holder.owner.as_str(), holder.holds, holder.deadline_ms))
            .collect();
        assert_eq!(
            parsed,
            [
                ("a:1", 2, Some(1_700_000_000_000)),
                ("b:7", 1, Some(1_700_000_000_500))
            ]
        );
    }
}

//! `MultiLock`: several locks, possibly on different Redis servers, taken all or nothing.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::parts::{Parts, give_up};
use crate::engine::wait_bound;
use crate::error::Result;
use crate::guard::{LockGuard, LostSignal};
use crate::keys::display_name;
use crate::lock::Lock;
use crate::meter::{counted, counted_try};

/// Several [`Lock`]s taken as one, all or nothing: a transfer between two accounts, or one
/// record kept on two Redis servers. The locks may belong to different
/// [`LockClient`](crate::LockClient)s, i.e. different Redis servers.
///
/// The locks are taken one after the other in ONE canonical order (by Redis key, then by
/// the client's [`server`](crate::LockClient::server)), whatever order they were given in,
/// so two callers naming the same locks in opposite orders never wait for each other in a
/// circle. A lock named twice (same key on the same server) is taken once, with the lease of
/// the first one given. Each lock keeps its own lease ([`Lock::with_lease`]).
///
/// ```no_run
/// # async fn demo(eu: tower_redis_lock::LockClient, us: tower_redis_lock::LockClient)
/// # -> Result<(), tower_redis_lock::LockError> {
/// use std::time::Duration;
/// use tower_redis_lock::MultiLock;
///
/// let both = MultiLock::new([eu.lock("account:7")?, us.lock("account:7")?]);
/// let guard = both.acquire_timeout(Duration::from_secs(5)).await?;
/// // ... both copies of the account are ours ...
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// In canonical order, without duplicates.
    locks: Vec<Lock>,
}

impl fmt::Debug for MultiLock {
    /// Each lock as its server and name, rather than every client's internals.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.locks
                    .iter()
                    .map(|lock| (lock.client().server(), lock.name())),
            )
            .finish()
    }
}

impl MultiLock {
    /// The locks `locks`, to be taken all or nothing. An empty set is allowed: its guard
    /// holds nothing.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> Self {
        let mut locks: Vec<Lock> = locks.into_iter().collect();
        Lock::sort_canonically(&mut locks);
        Self { locks }
    }

    /// The locks, in the order they are taken (duplicates removed).
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Waits until every lock is held, however long that takes. Cancel by dropping the
    /// future: every lock taken so far is released and every pending wait given up.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// The errors of [`Lock::acquire`] for any of the locks; the locks taken before the
    /// error are released first.
    pub async fn acquire(&self) -> Result<MultiGuard> {
        counted("multi", self.acquire_until(None)).await
    }

    /// Waits at most `wait` for every lock; on timeout, the locks taken so far are released.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) when `wait` passes first, and the
    /// errors of [`MultiLock::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<MultiGuard> {
        let bounded = self.acquire_until(Some((Instant::now() + wait, wait)));
        counted("multi", bounded).await
    }

    /// Takes every lock if all are free now; `Ok(None)`, holding none of them, when any is
    /// held (here or elsewhere).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future releases what it took (in the background) and leaves no
    /// place queued or subscribed.
    ///
    /// # Errors
    ///
    /// The errors of [`Lock::try_acquire`] for any of the locks; the locks taken before the
    /// error are released first.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        counted_try("multi", self.try_acquire_all()).await
    }

    async fn try_acquire_all(&self) -> Result<Option<MultiGuard>> {
        let mut taken = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            match lock.try_acquire_part().await {
                Ok(Some(guard)) => taken.push(guard),
                Ok(None) => {
                    give_up(taken).await;
                    return Ok(None);
                }
                Err(err) => {
                    give_up(taken).await;
                    return Err(err);
                }
            }
        }
        Ok(Some(MultiGuard::new(taken)))
    }

    /// Takes the locks in canonical order, each wait bounded by `deadline` (and the wait it
    /// came from, for the message); on any failure releases what it took, explicitly, so the
    /// caller finds the locks free when it returns.
    async fn acquire_until(&self, deadline: Option<(Instant, Duration)>) -> Result<MultiGuard> {
        let mut taken = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let acquired = match deadline {
                None => lock.acquire_part().await,
                Some((deadline, wait)) => {
                    match wait_bound::until(deadline, lock.acquire_part()).await {
                        Ok(acquired) => acquired,
                        Err(_) => Err(lock.client().wait_bound_error(&format!(
                            "{} locks not all acquired within {wait:?} (stuck at '{}')",
                            self.locks.len(),
                            display_name(lock.name())
                        ))),
                    }
                }
            };
            match acquired {
                Ok(guard) => taken.push(guard),
                Err(err) => {
                    give_up(taken).await;
                    return Err(err);
                }
            }
        }
        Ok(MultiGuard::new(taken))
    }
}

/// Proof of holding every lock of a [`MultiLock`]. Release it with [`MultiGuard::release`]
/// to see the result; dropping it releases every lock in the background.
#[derive(Debug)]
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard {
    parts: Parts,
}

impl MultiGuard {
    fn new(guards: Vec<LockGuard>) -> Self {
        let all = guards.len();
        Self {
            parts: Parts::new(guards, all),
        }
    }

    /// The guard of each lock, in canonical order (as [`MultiLock::locks`]).
    pub fn guards(&self) -> &[LockGuard] {
        self.parts.guards()
    }

    /// The fencing token of each lock, in canonical order. Tokens of different locks (and
    /// of different servers) are separate sequences: hand each to what its lock protects.
    pub fn fencing_tokens(&self) -> Vec<u64> {
        self.guards().iter().map(LockGuard::fencing_token).collect()
    }

    /// A signal that fires as soon as any of the locks is lost, with that lock's reason.
    pub fn lost_signal(&self) -> LostSignal {
        self.parts.lost_signal()
    }

    /// Whether every lock is still held, as far as this process knows.
    pub fn is_held(&self) -> bool {
        self.parts.is_held()
    }

    /// Releases every lock (at once, in parallel) and waits for Redis to confirm each.
    ///
    /// # Cancel safety
    ///
    /// Cancelling the call leaves the release to finish in the background, as a dropped guard's
    /// does.
    ///
    /// # Errors
    ///
    /// The first error of [`LockGuard::release`] in canonical order; every lock is released
    /// (or left to its lease) whatever the others' outcome.
    pub async fn release(self) -> Result<()> {
        self.parts.release().await
    }
}

//! The read-write lock: many readers or one writer, with Redisson's `RReadWriteLock`
//! semantics (re-entry, a read taken inside the write lock, downgrade by releasing the write
//! lock), but every reader's lease tracked on its own and no writer starved by readers.
//!
//! The state lives in the lock's hash (see `wire/lua/rw.lua`); the scripts are
//! `wire/lua/rw_acquire.lua` and `wire/lua/rw_release.lua`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Result};
use crate::guard::{Hold, LockGuard};
use crate::keys::LockKeys;
use crate::kind::LockKind;
use crate::lock::{Lease, Lock};
use crate::watchdog::lost_deadline;
use crate::wire::scripts::{AcquireMode, AcquireReply, Terms};

/// A read-write lock: any number of readers at once, or one writer.
///
/// [`read`](Self::read) and [`write`](Self::write) are ordinary [`Lock`]s, so everything a
/// lock does works on both (waiting with or without a bound, `try_acquire`, fixed leases,
/// re-entry, the lost signal, fencing tokens, `inspect`, `force_unlock`).
///
/// - **Fair to writers.** Waiters are served in the order they asked: a release hands the
///   lock to the one writer first in line, or to every reader before the next writer in
///   line, together. A reader that arrives while a writer waits queues behind it, so a
///   stream of readers never starves a writer (Redisson lets new readers in while a writer
///   waits). A reader that arrives while only readers hold the lock and nobody waits joins
///   at once.
/// - **Every reader's lease is its own.** A reader that dies frees its share when its own
///   lease runs out, whatever the other readers do; the lock's key lives as long as the
///   longest lease among the live readers.
/// - **Reading inside the write lock.** [`LockGuard::read_within`] takes a read hold for the
///   writer, which survives the write lock's release: the lock is then read-held by that
///   owner (a downgrade), and other readers may join.
/// - Every acquisition, read or write, gets a fencing token; a writer's is above every
///   earlier reader's.
///
/// It shares its Redis keys with [`LockClient::lock`] of the same name, so a plain lock and
/// a read-write lock of one name exclude each other.
#[derive(Debug, Clone)]
pub struct ReadWriteLock {
    read: Lock,
    write: Lock,
}

impl ReadWriteLock {
    fn new(client: LockClient, name: &str, keys: LockKeys) -> Self {
        Self {
            read: Lock::new(client.clone(), name, keys.clone(), LockKind::Read),
            write: Lock::new(client, name, keys, LockKind::Write),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// The read side: shared with other readers, excluding writers.
    pub fn read(&self) -> Lock {
        self.read.clone()
    }

    /// The write side: one writer, excluding readers and other writers.
    pub fn write(&self) -> Lock {
        self.write.clone()
    }
}

impl LockClient {
    /// The read-write lock called `name` (see [`ReadWriteLock`]). It shares its Redis keys
    /// with [`LockClient::lock`] of the same name, so the two exclude each other.
    ///
    /// # Errors
    ///
    /// As [`LockClient::lock`].
    pub fn read_write_lock(&self, name: &str) -> Result<ReadWriteLock> {
        let keys = LockKeys::new(&self.inner.config.prefix, name)?;
        Ok(ReadWriteLock::new(self.clone(), name, keys))
    }
}

impl LockGuard {
    /// Takes a read hold of this write guard's lock for the same owner, at once (the writer
    /// excludes everyone else, so there is nothing to wait for). It has a fencing token of its
    /// own and the write guard's kind of lease, and outlives the write lock: releasing every
    /// write hold while read holds remain leaves the lock read-held by this owner (a
    /// downgrade, as in Redisson), and readers may then join. A writer that wants the lock
    /// back must acquire it anew.
    ///
    /// Cancelling the call is safe: a hold Redis granted after the caller left is released.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::NotOwner`] when this is not a write guard of a
    /// [`ReadWriteLock`], or when its write lock is no longer held (lease lost,
    /// force-unlocked, released), [`ErrorKind::RedisUnavailable`] or [`ErrorKind::Redis`]
    /// when Redis fails, [`ErrorKind::AccessDenied`] when it refuses this client, and
    /// [`ErrorKind::ShutDown`] after shutdown.
    pub async fn read_within(&self) -> Result<LockGuard> {
        let hold = self.holding().hold.clone();
        if hold.terms.kind != LockKind::Write {
            return Err(LockError::new(
                ErrorKind::NotOwner,
                "only the write guard of a read-write lock can read within its lock",
            ));
        }
        let inner = hold.inner.clone();
        inner.ensure_running()?;
        let (deliver, delivered) = oneshot::channel();
        // The script runs in its own task so that a hold granted to a caller who has left is
        // handed to a guard that is dropped, which releases it.
        inner.runtime.clone().spawn(async move {
            let terms = Terms {
                kind: LockKind::Read,
                ..hold.terms
            };
            let sent_at = Instant::now();
            let reply = hold.acquire_in_redis(&terms, AcquireMode::ReadWithin).await;
            let outcome = match reply {
                Ok(AcquireReply::Acquired {
                    token,
                    lease_left_ms,
                }) => Ok(read_guard(&hold, terms, token, lease_left_ms, sent_at)),
                Ok(_) => Err(LockError::new(
                    ErrorKind::NotOwner,
                    "the write lock is no longer held by this owner",
                )),
                Err(err) => Err(err),
            };
            let _ = deliver.send(outcome);
        });
        delivered
            .await
            .unwrap_or_else(|_| Err(LockError::shut_down()))
    }
}

/// The guard of a read hold taken inside the write lock `hold`: the same owner, a lease of
/// its own registered with the watchdog (renewed if the write lock's is).
fn read_guard(
    hold: &Arc<Hold>,
    terms: Terms,
    token: u64,
    lease_left_ms: i64,
    sent_at: Instant,
) -> LockGuard {
    let lease = if hold.renewed {
        Lease::Watchdog
    } else {
        Lease::Fixed(Duration::from_millis(terms.lease_ms))
    };
    let client = LockClient {
        inner: hold.inner.clone(),
    };
    let lock =
        Lock::new(client, &hold.name, (*hold.keys).clone(), LockKind::Read).with_lease(lease);
    let left = u64::try_from(lease_left_ms).unwrap_or(terms.lease_ms);
    let expires_at = lost_deadline(sent_at, Duration::from_millis(left));
    // The owner's read holds may be other read guards': each releases only its own.
    lock.grant_of(None, hold.owner.clone(), token, expires_at, terms, false)
}

//! The read-write lock: many readers or one writer, with Redisson's `RReadWriteLock`
//! semantics (re-entry, a read taken inside the write lock, downgrade by releasing the write
//! lock), but every reader's lease tracked on its own and no writer starved by readers.
//!
//! The state lives in the lock's hash (see `wire/lua/lib/rw.lua`); the scripts are
//! `wire/lua/rw_acquire.lua` and `wire/lua/rw_release.lua`.

use crate::client::LockClient;
use crate::error::Result;
use crate::lock::Lock;
use crate::lock_kind::LockKind;

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
/// - **Reading inside the write lock.** [`read_within`](crate::LockGuard::read_within) takes
///   a read hold for the writer, which survives the write lock's release: the lock is then
///   read-held by that owner (a downgrade), and other readers may join.
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
        Ok(ReadWriteLock {
            read: self.lock_of_kind(name, LockKind::Read)?,
            write: self.lock_of_kind(name, LockKind::Write)?,
        })
    }
}

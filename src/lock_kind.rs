//! Which kind of lock a name is taken as. The kind picks the scripts that run in Redis and
//! whether the tasks of one client queue for the name locally.

/// How a [`Lock`](crate::Lock) is shared and in which order waiters get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time. Instances get the lock in the order they asked for it; the tasks
    /// of one client queue locally, and only the first of them talks to Redis.
    #[default]
    Exclusive,
    /// One holder at a time, and every task, of every client, gets the lock in the order it
    /// asked for it: each waits in the Redis queue itself.
    Fair,
    /// Shared with other readers; excludes writers. The read side of a
    /// [`ReadWriteLock`](crate::ReadWriteLock).
    Read,
    /// One writer, excluding readers and other writers. The write side of a
    /// [`ReadWriteLock`](crate::ReadWriteLock).
    Write,
    /// `take` of a [`Semaphore`](crate::Semaphore)'s `permits`, shared with other holders as
    /// long as the permits they hold add up to no more than `permits`.
    Semaphore {
        /// How many permits the semaphore has.
        permits: u32,
        /// How many of them this acquisition takes (or waits for).
        take: u32,
    },
}

impl LockKind {
    /// Whether the tasks of one client that want the lock queue locally behind one task that
    /// talks to Redis, and hand the lock to each other. Only an exclusive lock does: fairness
    /// needs every task in the Redis queue, and readers must not wait for each other.
    pub(crate) fn queues_locally(self) -> bool {
        self == Self::Exclusive
    }
}

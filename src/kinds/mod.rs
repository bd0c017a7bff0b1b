//! Locks of other kinds than the plain exclusive one.
//!
//! - [`ReadWriteLock`]: many readers or one writer, in the engine's own scripts; its
//!   `read()` and `write()` are ordinary [`Lock`](crate::Lock)s.
//! - [`Semaphore`]: N permits shared across instances, each acquisition on its own lease, in
//!   the engine's own scripts too.
//!
//! The others are built on plain locks and their guards:
//!
//! - [`MultiLock`]: several locks, possibly on different Redis servers, taken all or nothing
//!   in one canonical order, so callers naming them in any order never deadlock.
//! - [`RedLock`]: one name on N independent Redis servers, held while a majority of them
//!   hold it (the Redlock algorithm), for users who do not want one Redis to be a single
//!   point of failure.
//! - [`SegmentedLock`]: one name split into N plain locks (segments), for a hot resource
//!   that N holders may work on at once (a counter or a stock split in N parts); a holder
//!   takes any free segment, or several.
//!
//! Each guard holds the [`LockGuard`](crate::LockGuard)s of its parts: releasing it
//! releases them all, dropping it releases them in the background, and its lost signal
//! fires when too many parts are lost for the whole to still be held.

mod multi;
mod parts;
mod redlock;
mod rw;
mod segmented;
mod semaphore;

pub use multi::{MultiGuard, MultiLock};
pub use redlock::{
    DEFAULT_REDLOCK_RETRY_DELAY, REDLOCK_MIN_ATTEMPT_TIMEOUT, RedLock, RedLockGuard,
};
pub use rw::ReadWriteLock;
pub use segmented::{MAX_SEGMENTS, SegmentGuard, SegmentedLock};
pub use semaphore::{PermitGuard, Semaphore};

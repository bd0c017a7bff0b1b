#![doc = include_str!("guide.md")]

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

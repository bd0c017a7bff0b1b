//! What the layer does in each situation, with its documented defaults.

use std::time::Duration;

use crate::lock::Lease;

/// Default bound on the wait for a request's locks.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// Default most keys one request may name.
pub const DEFAULT_MAX_KEYS: usize = 16;
/// Default `Retry-After` of a 503 answer.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What to do with a request the extractor finds no key in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Run it without a lock (the default).
    #[default]
    PassThrough,
    /// Answer 400 Bad Request (gRPC `INVALID_ARGUMENT`).
    Reject,
}

/// What to do when Redis cannot be reached to take the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnRedisUnavailable {
    /// Answer 503 with `Retry-After` (gRPC `UNAVAILABLE`) (the default).
    #[default]
    FailClosed,
    /// Run the handler without the lock; it finds no `LockContext` in its extensions.
    FailOpen,
}

/// What to do when a handler's lease is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLeaseLost {
    /// Drop the handler's future and answer 503 (gRPC `ABORTED`) (the default).
    #[default]
    Cancel,
    /// Let the handler finish; it can watch `LockContext::lost` itself.
    Finish,
}

#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub(crate) wait: Duration,
    pub(crate) missing_key: MissingKey,
    pub(crate) redis_unavailable: OnRedisUnavailable,
    pub(crate) lease_lost: OnLeaseLost,
    pub(crate) lease: Lease,
    pub(crate) key_prefix: String,
    pub(crate) max_keys: usize,
    pub(crate) retry_after: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            wait: DEFAULT_WAIT,
            missing_key: MissingKey::default(),
            redis_unavailable: OnRedisUnavailable::default(),
            lease_lost: OnLeaseLost::default(),
            lease: Lease::Watchdog,
            key_prefix: String::new(),
            max_keys: DEFAULT_MAX_KEYS,
            retry_after: DEFAULT_RETRY_AFTER,
        }
    }
}

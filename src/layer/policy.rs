//! What the layer does in each situation, with its documented defaults.

use std::time::Duration;

use http::Method;

use crate::lease::Lease;
use crate::lock_kind::LockKind;

/// Default bound on the wait for a request's locks.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// Default most keys one request may name.
pub const DEFAULT_MAX_KEYS: usize = 16;
/// Default `Retry-After` of a 503 answer.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// What to do with a request the extractor finds no key in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnMissingKey {
    /// Run it without a lock (the default). Unless chosen explicitly with
    /// [`LockLayer::on_missing_key`](super::LockLayer::on_missing_key), the first such request
    /// on each route logs a WARN, since an extractor that never matches (a path under a
    /// prefix, a header of another name) would otherwise leave every request unlocked unseen.
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

/// How the requests for one key share its lock: [`LockLayer::sharing`](super::LockLayer::sharing).
///
/// What it costs against [`Sharing::Exclusive`]: about the same for a free lock; under
/// contention every fair, read-write or limited waiter waits in Redis on its own (a
/// heartbeat script per waiting client each second, a re-poll per waiter), where exclusive
/// waiters of one instance queue locally behind one; and a read lock's scripts read every
/// reader of the key. `docs/benchmarks.md` in the repository gives measured figures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Sharing {
    /// One request at a time; instances take turns in the order they asked (the default).
    #[default]
    Exclusive,
    /// One request at a time, in the order the requests asked, across every instance.
    Fair,
    /// Requests whose method is in `read_methods` share the lock as readers; the others
    /// run alone, as writers.
    ReadWrite {
        /// The methods that only read (default `GET` and `HEAD`).
        read_methods: Vec<Method>,
    },
    /// At most this many requests per key at once, across every instance: each request takes
    /// one permit of the [`Semaphore`](crate::Semaphore) named by its key, in the order they
    /// asked ([`LockLayer::limit`](super::LockLayer::limit)). Zero is refused when the layer
    /// is built.
    Limit(u32),
}

impl Sharing {
    /// Read-write sharing where `GET` and `HEAD` read and every other method writes.
    pub fn read_write() -> Self {
        Self::ReadWrite {
            read_methods: vec![Method::GET, Method::HEAD],
        }
    }

    /// The kind of lock a request with `method` takes.
    pub(crate) fn kind_for(&self, method: &Method) -> LockKind {
        match self {
            Self::Exclusive => LockKind::Exclusive,
            Self::Fair => LockKind::Fair,
            Self::ReadWrite { read_methods } if read_methods.contains(method) => LockKind::Read,
            Self::ReadWrite { .. } => LockKind::Write,
            Self::Limit(permits) => LockKind::Semaphore {
                permits: *permits,
                take: 1,
            },
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub(crate) wait: Duration,
    pub(crate) missing_key: OnMissingKey,
    /// Whether the user chose `missing_key` (no warning for keyless requests then).
    pub(crate) missing_key_chosen: bool,
    pub(crate) redis_unavailable: OnRedisUnavailable,
    pub(crate) lease_lost: OnLeaseLost,
    pub(crate) lease: Lease,
    pub(crate) key_prefix: String,
    pub(crate) max_keys: usize,
    pub(crate) retry_after: Duration,
    pub(crate) sharing: Sharing,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            wait: DEFAULT_WAIT,
            missing_key: OnMissingKey::default(),
            missing_key_chosen: false,
            redis_unavailable: OnRedisUnavailable::default(),
            lease_lost: OnLeaseLost::default(),
            lease: Lease::Watchdog,
            key_prefix: String::new(),
            max_keys: DEFAULT_MAX_KEYS,
            retry_after: DEFAULT_RETRY_AFTER,
            sharing: Sharing::Exclusive,
        }
    }
}

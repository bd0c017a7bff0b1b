//! Distributed locks on Redis for Tokio services, with Redisson's semantics: reentrant hash
//! locks, a lease watchdog, pub/sub wake-ups, fencing tokens and a lost-lock signal.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tower_redis_lock::LockError> {
//! use tower_redis_lock::LockClient;
//!
//! let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let guard = locks.lock("tenant:acme")?.acquire().await?;
//! // Pass the token to the resource you write, so it can refuse a stale holder.
//! let token = guard.fencing_token();
//! # let _ = token;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Besides the exclusive [`Lock`], a client gives fair locks ([`LockClient::fair_lock`]) and
//! read-write locks ([`LockClient::read_write_lock`]) and semaphores
//! ([`LockClient::semaphore`]); [`kinds`] adds multi-locks, RedLock over several servers and
//! segmented locks. The Tower layer takes exclusive, fair or read-write locks, or limits the
//! requests per key in flight across instances ([`layer::Sharing`]).
//!
//! Data kept in Redis beside a lock can be written so that only its holder can write it:
//! [`LockGuard::write_if_held`] applies [`GuardedWrites`] in one script only while the guard
//! still holds the lock, checked by Redis.
//!
//! One client runs ONE watchdog task that renews every lease it holds in batches, and ONE
//! pub/sub connection that wakes every waiter; the tasks of one client that wait for the
//! same lock queue locally, and only the first talks to Redis.
//!
//! # Features
//!
//! - `axum` (default): the layer's answers in axum's body, [`layer::PathParamKey`] (the
//!   route parameters axum matched), [`LockContext`] and `Option<LockContext>` as handler
//!   arguments, and [`layer::Rejection`] as `IntoResponse`.
//! - `tonic`: the layer's answers in tonic 0.14's body.
//! - `json`: `JsonKeys`, lock keys read from a JSON request body (JSON pointers, or a
//!   closure over the parsed body), with its body layer; see [`layer`].
//! - `cli`: the `lockctl` operator tool.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(rustdoc::broken_intra_doc_links)]

mod client;
mod engine;
mod error;
mod guard;
pub mod guide;
mod guarded_write;
pub mod idempotency;
pub mod inspect;
pub mod keys;
pub mod kinds;
pub mod layer;
mod lease;
mod lock;
mod lock_kind;
mod meter;
mod scopes;
mod wire;

pub use client::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECTIONS, DEFAULT_LEASE_LIMIT, DEFAULT_LOCAL_HANDOFF_LIMIT,
    DEFAULT_LOCAL_HANDOFF_WINDOW, DEFAULT_REPOLL_INTERVAL, DEFAULT_WATCHDOG_LEASE, LockClient,
    LockClientBuilder,
};
pub use engine::config::{MAX_CONNECTIONS, MAX_LOCAL_HANDOFF_LIMIT};
pub use error::{ErrorKind, LockError, Result};
pub use guard::{LockGuard, LostSignal};
pub use guarded_write::{GuardedWrites, MAX_WRITE_ARGS};
pub use idempotency::IdempotencyLayer;
pub use inspect::{LockPage, LockSnapshot};
pub use keys::{DEFAULT_PREFIX, LockKeys, MAX_NAME_LEN};
pub use kinds::{
    MultiGuard, MultiLock, PermitGuard, ReadWriteLock, RedLock, RedLockGuard, SegmentGuard,
    SegmentedLock, Semaphore,
};
#[cfg(feature = "json")]
pub use layer::JsonKeys;
pub use layer::{HeaderKey, KeyExtractor, LockContext, LockLayer, LockService};
pub use lease::{Lease, LostReason, MAX_LEASE};
pub use lock::{Lock, LockState};
pub use lock_kind::LockKind;
pub use meter::describe_metrics;

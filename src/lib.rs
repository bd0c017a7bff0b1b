//! Distributed locks on Redis for Tokio services, and a Tower layer that runs the requests for
//! one key (a tenant, an account, an order) one at a time across every instance of an axum or
//! tonic service.
//!
//! The lock client has the semantics Java teams know from Redisson: reentrant locks, a lease
//! watchdog, pub/sub wake-ups, fencing tokens, fair, read-write, multi and quorum locks,
//! semaphores. It keeps them without Redisson's known failures: a lost lease is always
//! signalled to its holder, a missed wake-up costs at most a short re-poll (not a whole
//! lease), and one pub/sub connection per client serves any number of awaited locks.
//!
//! # Quick start
//!
//! Invoices are written one at a time per tenant, whichever instance a request reaches:
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use tower_redis_lock::layer::PathParamKey;
//! use tower_redis_lock::{LockClient, LockContext, LockLayer};
//!
//! /// Runs alone for its tenant across every instance.
//! async fn create_invoice(lock: LockContext) -> String {
//!     // Hand the fencing token to what you write, so it can refuse a stale holder.
//!     format!("written with fencing token {}\n", lock.fencing_token())
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
//!     let app = Router::new()
//!         .route("/tenants/{tenant}/invoices", post(create_invoice))
//!         .layer(LockLayer::new(locks.clone(), PathParamKey::new("tenant")));
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // On SIGTERM: finish the requests under way, then give back what is still held.
//!     axum::serve(listener, app)
//!         .with_graceful_shutdown(termination())
//!         .await?;
//!     locks.shutdown().await;
//!     Ok(())
//! }
//!
//! /// Ctrl-C, or the SIGTERM an orchestrator sends before it kills the process.
//! async fn termination() {
//!     let mut sigterm =
//!         tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
//!     tokio::select! {
//!         _ = tokio::signal::ctrl_c() => {}
//!         _ = sigterm.recv() => {}
//!     }
//! }
//! ```
//!
//! Requests for one tenant wait for each other (10 s at most, then 503 with `Retry-After`);
//! requests for different tenants run in parallel. Your own Cargo.toml needs `axum` 0.8 and
//! `tokio` with the `macros`, `rt-multi-thread` and `signal` features. `examples/quickstart_axum.rs`
//! is this program, and `examples/tonic_accounts.rs` the same for tonic.
//!
//! **The shutdown matters.** A process that dies without [`LockClient::shutdown`] (SIGKILL,
//! a crash, a SIGTERM nobody handles) leaves each lock it held taken until its lease runs
//! out: 30 s by default, during which every request for those keys waits, on every instance.
//! With the drain above, requests under way finish and release their locks as usual.
//!
//! **On a Redis started less than a minute ago,** the first lock waits until the server has
//! been up 60 s (the lease limit): the library cannot tell a new server from one that
//! restarted without its data, whose old holders may still be at work (see
//! [Redis that lost its data](guide::safety#redis-that-lost-its-data)). A server known to be
//! new is waived with `lockctl waive-quarantine`; a test suite that starts one per test calls
//! `locks.waive_restart_quarantine().await?` right after connecting.
//!
//! # The lock client
//!
//! ```no_run
//! # async fn demo() -> Result<(), tower_redis_lock::LockError> {
//! use std::time::Duration;
//! use tower_redis_lock::LockClient;
//!
//! let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let guard = locks.lock("tenant:acme")?.acquire_timeout(Duration::from_secs(10)).await?;
//! // The resource you write refuses a token older than the newest it has seen.
//! let token = guard.fencing_token();
//! # let _ = token;
//! guard.release().await?; // or drop it: released in the background
//! # Ok(())
//! # }
//! ```
//!
//! [`guide::client`] has the rest: waiting, re-entry, fixed leases, the lost signal, errors.
//!
//! # Concepts
//!
//! - **Leases and the watchdog.** A lock is held on a lease: Redis lets it go when the lease
//!   runs out, so a holder that dies frees it by itself. By default ([`Lease::Watchdog`]) the
//!   lease is 30 s and one task per client renews every lease it holds, in batches, while the
//!   guard lives; [`Lease::Fixed`] is never renewed. The watchdog lease is what a crash costs:
//!   how long a dead holder's keys stay locked. Choose it as the longest stall you accept after
//!   a crash, well above a Redis round trip and a garbage-collection-like pause
//!   ([`LockClientBuilder::watchdog_lease`]).
//! - **Fencing tokens and the lost signal.** No lock service can stop a holder paused past
//!   its lease (a stalled VM) from acting late. Every acquisition gets a fencing token that
//!   only grows per lock name, whatever the servers' clocks do, for the resource to refuse a
//!   stale holder; and a holder is told ([`LockGuard::lost_signal`]) when the library can no
//!   longer vouch for its lease, before Redis lets the lock go. The layer cancels its handler
//!   then. When the data lives in Redis beside the lock, [`LockGuard::write_if_held`] writes it
//!   only while the lock is still the guard's, checked by Redis in the same script.
//!   [`guide::client`] shows the full recipe for a read-modify-write.
//! - **Hand-over.** A release hands the lock to the one instance that waited longest, in the
//!   same Redis call, and tells only that one over pub/sub: no herd, no polling, about one
//!   round trip from release to the next holder. Tasks of one client that wait for the same
//!   lock queue locally and hand it to each other without Redis, within a fairness budget.
//! - **Restart quarantine.** When Redis loses its data (a restart without persistence or
//!   from a snapshot, a failover to an empty replica, a flush), no lock of it is granted
//!   until every lease granted before could have run out, and every holder that can reach
//!   Redis is told at once. [`guide::safety`] says what holds and what it rests on.
//!
//! # Where to go next
//!
//! - [`layer`]: the Tower layer: where keys come from (headers, paths, gRPC metadata, a JSON
//!   body), its policies and answers, fair and read-write sharing, a limit per key.
//! - [`idempotency`]: [`IdempotencyLayer`], a request with an `Idempotency-Key` run once
//!   across instances, its duplicates answered with the stored response.
//! - [`kinds`]: fair locks, read-write locks, semaphores, multi-locks, RedLock over several
//!   servers, segmented locks.
//! - [`singleton`] and [`guide::singleton`]: a task on one instance at a time, told and
//!   dropped before another starts; a job every period, at most once per tick.
//! - [`guide::topologies`]: Redis Cluster, Sentinel, replica acknowledgement.
//! - [`guide::safety`]: what is guaranteed, what it rests on, what the server must give.
//! - [`guide::configuration`]: every setting and its default.
//! - [`guide::operating`]: metrics and alerts, traces, `lockctl`, shutting down.
//! - [`guide::security`]: AUTH, ACL and TLS.
//! - [`guide::internals`]: the Redis data model and how the engine works.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! | --- | --- | --- |
//! | `axum` | on | the layer's answers in axum's body, [`layer::PathParamKey`], [`LockContext`] and `Option<LockContext>` as handler arguments, [`layer::Rejection`] as `IntoResponse` |
//! | `metrics` | on | counters, gauges and histograms through the `metrics` facade ([`guide::operating`]) |
//! | `tonic` | off | the layer's answers in tonic 0.14's body |
//! | `json` | off | `JsonKeys`: lock keys read from a JSON request body, with its body layer |
//! | `cli` | off | the `lockctl` operator tool: `cargo install tower-redis-lock --features cli` |
//!
//! Supported: Rust 1.88 or newer, tokio 1.38, tower 0.5.2, axum 0.8, tonic 0.14, redis-rs
//! 1.0.3, Redis 6.2 or newer (tested on Redis 7.0 and Valkey 9.1).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![deny(rustdoc::broken_intra_doc_links)]

mod client;
mod cluster_probe;
mod engine;
mod error;
mod guard;
mod guarded_write;
pub mod guide;
pub mod idempotency;
pub mod inspect;
pub mod keys;
pub mod kinds;
pub mod layer;
#[doc(hidden)]
pub mod layout;
mod lease;
mod lock;
mod lock_kind;
mod meter;
mod rejection_kind;
mod renamed;
mod scopes;
pub mod singleton;
mod singleton_records;
mod wire;

pub use client::{
    DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECTIONS, DEFAULT_LEASE_LIMIT,
    DEFAULT_LOCAL_HANDOVER_LIMIT, DEFAULT_LOCAL_HANDOVER_WINDOW, DEFAULT_REPOLL_INTERVAL,
    DEFAULT_WATCHDOG_LEASE, LockClient, LockClientBuilder,
};
pub use engine::config::{MAX_CONNECTIONS, MAX_LOCAL_HANDOVER_LIMIT};
pub use error::{ErrorKind, LockError, Result};
pub use guard::{LockGuard, LostSignal, any_lost};
pub use guarded_write::{GuardedWrites, MAX_WRITE_ARGS};
pub use idempotency::{IdempotencyContext, IdempotencyLayer};
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
#[cfg(feature = "metrics")]
pub use meter::{HISTOGRAM_BUCKETS, MetricLabel, MetricSeries, MetricShape, metric_series};
#[allow(deprecated)]
pub use renamed::{
    DEFAULT_LOCAL_HANDOFF_LIMIT, DEFAULT_LOCAL_HANDOFF_WINDOW, MAX_LOCAL_HANDOFF_LIMIT,
};
pub use singleton::{Leadership, Schedule, Singleton, SingletonHandle, Tick};

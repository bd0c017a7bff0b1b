//! The Tower layer: take lock keys out of each request and run the handlers for one key one
//! at a time, across every instance of a service (or up to `n` at a time with
//! [`LockLayer::limit`], one permit of a semaphore per key).
//!
//! `LockLayer` → [`LockService`] → [`ResponseFuture`]. The future acquires the request's
//! locks, runs the inner service with the guards held in its own fields, and releases them
//! when the inner response future completes or whatever drops it. The lock covers the
//! handler, not the streaming of the response body.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use tower_redis_lock::{HeaderKey, LockClient, LockContext, LockLayer};
//!
//! async fn create_invoice(lock: LockContext) -> String {
//!     // Runs alone for this tenant across every instance. Hand the token to what you write.
//!     format!("written with fencing token {}", lock.fencing_token())
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let app: Router = Router::new()
//!     .route("/invoices", post(create_invoice))
//!     .layer(LockLayer::new(locks, HeaderKey::new("x-tenant-id")));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! With tonic, `Server::builder().layer(LockLayer::new(locks, MetadataKey::new("account-id")))`
//! (feature `tonic` for tonic 0.14's body); see `examples/tonic_accounts.rs`.
//!
//! Keys in a JSON body (feature `json`): `JsonKeys` names them (JSON pointers, or a
//! closure over the parsed body), and is two things at once: the key extractor of a
//! `LockLayer`, and, with `JsonKeys::layer`, the body layer that reads the body up to a
//! bound (64 KiB by default; 413 past it), finds the keys and hands the request on with its
//! body intact. The body layer must run first, so it goes outside the lock layer: with
//! axum, added after it, `.layer(LockLayer::new(locks, keys.clone())).layer(keys.layer())`;
//! with `ServiceBuilder`, listed before it,
//! `ServiceBuilder::new().layer(keys.layer()).layer(LockLayer::new(locks, keys))`. In the
//! other order the lock layer finds no keys and answers 400 naming the body layer.
//!
//! The layer's own answers carry a one-line body saying why ([`Rejection::message`]), or
//! `application/problem+json` with [`ProblemJson`]. Its logs stay readable under load:
//! rejections log at most one line per kind and second, keys are cut to 64 bytes, and the
//! first request without a key on each route logs a warning ([`OnMissingKey`]).

#[cfg(feature = "axum")]
mod axum_support;
mod body;
pub(crate) mod buffer;
mod context;
mod extract;
#[cfg(feature = "json")]
mod json_keys;
#[allow(clippy::module_inception)]
mod layer;
mod log;
mod policy;
pub(crate) mod reject;
mod service;

pub mod future;

#[cfg(feature = "axum")]
pub use axum_support::{MissingLockContext, PathParamKey};
pub use body::RejectionBody;
pub use buffer::{BufferedBody, DEFAULT_MAX_BODY};
pub use context::LockContext;
pub use extract::{
    ConstantKey, GrpcMethodKey, HeaderKey, InvalidKey, KeyExtractor, Keys, MetadataKey,
    PathSegmentKey, RouteParamKey,
};
pub use future::ResponseFuture;
#[cfg(feature = "json")]
pub use json_keys::{JsonKeys, JsonKeysFuture, JsonKeysLayer, JsonKeysService};
pub use layer::LockLayer;
pub use policy::{
    DEFAULT_MAX_KEYS, DEFAULT_RETRY_AFTER, DEFAULT_WAIT, OnLeaseLost, OnMissingKey,
    OnRedisUnavailable, Sharing,
};
pub use reject::{DefaultRejection, ProblemJson, Reject, Rejection, RejectionKind};
pub use service::LockService;

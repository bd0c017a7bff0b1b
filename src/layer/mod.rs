//! The Tower layer: take lock keys out of each request and run the handlers for one key one
//! at a time, across every instance of a service.
//!
//! `LockLayer` → [`LockService`] → [`ResponseFuture`]. The future acquires the request's
//! locks, runs the inner service with the guards held in its own fields, and releases them
//! when the inner response future completes or whatever drops it. The lock covers the
//! handler, not the streaming of the response body.
//!
//! ```no_run
//! use axum::{Extension, Router, routing::post};
//! use tower_redis_lock::{HeaderKey, LockClient, LockContext, LockLayer};
//!
//! async fn create_invoice(Extension(lock): Extension<LockContext>) -> String {
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
//! With tonic, `Server::builder().layer(LockLayer::new(locks, MetadataKey::new("account-id")))`;
//! see `examples/tonic_accounts.rs`.

mod context;
mod extract;
#[allow(clippy::module_inception)]
mod layer;
mod policy;
mod reject;
mod service;

pub mod future;

pub use context::LockContext;
pub use extract::{
    ConstantKey, GrpcMethodKey, HeaderKey, InvalidKey, KeyExtractor, Keys, MetadataKey,
    PathSegmentKey, RouteParamKey,
};
pub use future::ResponseFuture;
pub use layer::LockLayer;
pub use policy::{
    DEFAULT_MAX_KEYS, DEFAULT_RETRY_AFTER, DEFAULT_WAIT, MissingKey, OnLeaseLost,
    OnRedisUnavailable, Sharing,
};
pub use reject::{DefaultRejection, Reject, Rejection, RejectionKind};
pub use service::LockService;

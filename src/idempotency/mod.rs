//! Idempotent requests across instances: a request that carries an `Idempotency-Key` runs
//! once, and its duplicates (a client's retry after a timeout, a double submit, a webhook
//! delivered again) get the first one's response, whichever instance they reach, as the
//! IETF draft "The Idempotency-Key HTTP Header Field" and the payment APIs describe.
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use tower_redis_lock::{HeaderKey, IdempotencyLayer, LockClient};
//!
//! async fn create_order() -> &'static str {
//!     "order 1 created" // runs once per key; every retry gets this answer
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
//! let app: Router = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new(locks).scope(HeaderKey::new("x-tenant-id")));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! What each request gets:
//!
//! | the request | its answer |
//! | --- | --- |
//! | the first with its key | runs under the key's lock; its response is stored for 24 h |
//! | a duplicate while the first runs | waits for it (10 s at most), then its response; past the wait 409 with `Retry-After` |
//! | a duplicate later | at once, the stored response with `idempotent-replayed: true` |
//! | the key with another method, path, query or body | 422 |
//! | no key (or no scope) | runs as if the layer were not there (or 400, by policy) |
//! | a malformed key (empty, over 255 bytes, not visible ASCII, sent twice) | 400 |
//! | a body over 1 MiB | 413 |
//! | Redis unreachable | 503 (or runs unguarded and stores nothing, by policy) |
//!
//! **What is stored.** Every response but a server error (5xx, or a gRPC status a retry may
//! cure) and 429: those say the request did not do its work, so its retry runs again. A
//! request cancelled because its lock's lease was lost (a paused instance) is answered 503
//! and stores nothing; its retry runs again, or gets the response of the duplicate that
//! took over. The status, the headers the layer keeps ([`IdempotencyLayer::stored_headers`]),
//! the body and the trailers are stored in one Redis hash beside the key's lock, in its
//! slot on a cluster.
//!
//! **Only a holder stores.** The response is written with
//! [`LockGuard::write_if_held`](crate::LockGuard::write_if_held): one script checks that the
//! lock is still this request's and writes, or writes nothing. An instance paused past its
//! lease that comes back with a late response cannot overwrite the response of the
//! duplicate that ran in its place; it is answered as a lost lease.
//!
//! **A response over the bound** (256 KiB by default) still reaches its client, but only
//! the fact that the request ran is kept: a duplicate is answered 500 (the server's bound,
//! not the client's fault), never run a second time, and the layer logs an ERROR.
//!
//! Put the layer outside the lock layer when both are used, so a duplicate is answered
//! before it waits for the business key's lock; the response body is read whole before it
//! is stored, so an idempotent route does not stream its response.
//!
//! **Scope and lifetime.** Scope keys per tenant ([`IdempotencyLayer::scope`], any key
//! extractor) so no tenant can replay another's response, and choose the TTL
//! ([`IdempotencyLayer::ttl`], 24 h) longer than any client retries. A key past its TTL runs
//! again. Every setting and its default: [`crate::guide::configuration`].
//!
//! **gRPC.** The key comes from the `idempotency-key` metadata (gRPC metadata travels as
//! headers); past the wait a duplicate gets `ABORTED`, and the statuses a retry may cure
//! (`UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`,
//! `UNAVAILABLE`, `DATA_LOSS`) are not stored. `examples/tonic_accounts.rs` makes a deposit
//! once across two instances.
//!
//! **Operating it.** `lockctl idempotent KEY --scope acme` prints what is stored for a key
//! (status, fingerprint, body size, headers, time left; exit 1 when nothing is), and
//! [`IdempotencyRecords::get`] reads it from code. The metric `redis_lock_idempotent_total`
//! counts each outcome ([`crate::guide::operating`]).

mod capture;
mod context;
mod durability;
mod fingerprint;
mod flow;
pub mod future;
mod layer;
mod record;
mod replay_body;
mod request_key;
mod service;
mod settings;

pub use context::IdempotencyContext;
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use record::{IdempotencyRecords, KeyRecord, StoredResponse};
pub use replay_body::ReplayableBody;
pub use request_key::MAX_IDEMPOTENCY_KEY_LEN;
pub use service::IdempotencyService;
pub use settings::{
    DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_STORED_BODY, DEFAULT_TTL, OnUnknownOutcome,
    REPLAYED_HEADER,
};

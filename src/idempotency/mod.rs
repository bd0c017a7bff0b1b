//! Idempotent requests across instances: a request that carries an `Idempotency-Key` runs
//! once, and its duplicates (a client's retry after a timeout, a double submit, a webhook
//! delivered again) get the first one's response, whichever instance they reach, as the
//! IETF draft "The Idempotency-Key HTTP Header Field" (draft-ietf-httpapi-idempotency-key-
//! header-07, expired: no standard yet) and the payment APIs describe.
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
//!     // `route_layer`: a request for a method the route lacks is answered 405 first.
//!     .route_layer(IdempotencyLayer::new(locks).scope(HeaderKey::new("x-tenant-id")));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! What each request gets:
//!
//! | the request | its answer |
//! | --- | --- |
//! | the first with its key | marks the key started, runs under the key's lock to its end (a client that went away cancels nothing); its response is stored for 24 h |
//! | a duplicate while the first runs | waits for it (10 s at most), then its response; past the wait 409 with `Retry-After` |
//! | a duplicate later | at once, the stored response with `idempotent-replayed: true` |
//! | a retry of an attempt that ended without an outcome (its instance stopped or paused past its lease) | 500, never run (at most once); or run again ([`OnUnknownOutcome::RunAgain`]) |
//! | a retry of an attempt that committed its outcome and stopped before its response was stored | runs the handler with [`IdempotencyContext::committed`], which answers from it and makes no effect again |
//! | the key with another method, path, query or body | 422 |
//! | no key (or no scope) | runs as if the layer were not there (or 400, by policy) |
//! | a malformed key (empty, over 255 bytes, not visible ASCII, sent twice) | 400 |
//! | a body over 1 MiB | 413 |
//! | Redis unreachable | 503 (or runs unguarded and stores nothing, by policy) |
//!
//! # Effects that happen once
//!
//! What the layer can promise is about the handler's effect (a payment charged, an order
//! made), not only its lock, so it is stated for the three places an attempt can stop: a
//! client that goes away, an instance that stops or pauses past its lease before its
//! effect, and one that stops after its effect and before its response is stored.
//!
//! - **A client that goes away cancels nothing.** hyper and tonic drop a request's future
//!   when its client disconnects, times out or cancels; the layer runs the flow of a request
//!   with a key (take the key, run the handler, store its response) in a task of its own,
//!   so it ends as it would have, and the client's retry waits for it and gets its answer.
//!   It ends when the handler does, or when the key's lease is lost.
//! - **A handler that does nothing more (the default, at most once).** The key is marked
//!   started before its handler runs. An attempt that ends without a response stored (its
//!   instance killed or paused past its lease, its lease lost) leaves it so, and a retry,
//!   whichever instance it reaches, is answered 500
//!   ([`RejectionKind::IdempotencyOutcomeUnknown`](crate::layer::RejectionKind), gRPC
//!   `UNKNOWN`) and not run, until the key's TTL passes: its effect may have been made, and
//!   the layer cannot tell. Reconcile such a key from the resource itself. This is how
//!   payment APIs answer a key whose first attempt failed on their side.
//! - **Data in Redis: commit the effect with the outcome (exactly once).** A handler takes
//!   its [`IdempotencyContext`] from its request and makes its writes with
//!   [`IdempotencyContext::commit`]: one script checks that the key's lock is still this
//!   request's, applies the writes and keeps the outcome (what the answer is built from)
//!   under the key, or writes nothing. An instance paused past its lease before the commit
//!   writes nothing when it resumes; one that stops after it leaves the outcome, and the
//!   retry is answered from it. Such a handler lets a retry of an unknown outcome run
//!   again, with [`OnUnknownOutcome::RunAgain`]: no attempt without a commit made its
//!   effect. On a Redis Cluster every key the commit writes carries the record's
//!   [hash tag](IdempotencyContext::hash_tag) (a key elsewhere is refused before anything
//!   is written); a write that must reach data in another slot (an account's balance) is
//!   no single step, and is for the next recipe.
//! - **Data elsewhere (SQL): record the key in the same transaction.** Insert
//!   [`IdempotencyContext::key`], [`IdempotencyContext::fingerprint`] and the answer into a
//!   table with a unique key, in the transaction that makes the effect; when the insert
//!   conflicts, answer from the row and make nothing. With
//!   [`OnUnknownOutcome::RunAgain`] a retry then runs into that row, whatever happened to
//!   the attempt before it.
//!
//! ```no_run
//! use axum::{Extension, http::StatusCode};
//! use tower_redis_lock::{GuardedWrites, IdempotencyContext};
//!
//! async fn pay(Extension(key): Extension<IdempotencyContext>, body: String) -> (StatusCode, String) {
//!     if let Some(earlier) = key.committed() {
//!         // An earlier attempt charged and stopped before its answer was stored.
//!         return (StatusCode::CREATED, String::from_utf8_lossy(earlier).into_owned());
//!     }
//!     let answer = format!("{{\"charged\":{body}}}");
//!     let charge = GuardedWrites::new().set(&format!("payment:{}", key.hash_tag()), body);
//!     match key.commit(charge, answer.clone()).await {
//!         Ok(true) => (StatusCode::CREATED, answer),
//!         // The lock was lost (a pause past the lease): nothing was written.
//!         Ok(false) => (StatusCode::SERVICE_UNAVAILABLE, "retry".into()),
//!         Err(err) => (StatusCode::SERVICE_UNAVAILABLE, err.to_string()),
//!     }
//! }
//! ```
//!
//! `examples/axum_tenants/payments.rs` is such a payment, and `axum_tenants/ledger.rs` the
//! SQL recipe on SQLite (a ledger row and the key's row, unique, in one `BEGIN IMMEDIATE`
//! transaction; the key's row found means: answer from it). `tests/idempotency_effects.rs`
//! pauses their instances (SIGSTOP) past their lease before and after the charge, has their
//! clients give up mid-handler, and crashes Redis mid-load, and each key is charged once.
//!
//! # What the records rest on
//!
//! A record is a Redis hash, and it is only as safe as Redis's data. A Redis restarted
//! without persistence forgets every record (and every lock), and each key then runs again
//! when it comes back; with snapshots only (`save`), the records since the last snapshot.
//! Keep them in the append-only file (`appendonly yes`; `appendfsync always` loses none on
//! a crash, `everysec` up to a second's), and with replicas ask for their acknowledgement
//! ([`min_replicas_acked`](crate::LockClientBuilder::min_replicas_acked)) so a failover
//! keeps them. The layer reads `appendonly` and `save` once, at its first request, and logs
//! a WARN naming them when a restart would lose records.
//!
//! **What is stored.** Every response but a server error (5xx, or a gRPC status a retry may
//! cure) and 429: those say the request did not do its work, so the layer forgets the key's
//! start (unless its handler committed) and its retry runs again. A handler's 4xx is the
//! request's outcome and is replayed, as payment APIs do (the draft leaves it open);
//! [`StoredAnswers::SuccessOnly`] stores successes only. A retry is the same request when
//! its method, path, query and body are (its fingerprint); [`BodyComparison::Json`] (feature
//! `json`) compares a JSON body parsed, so other spacing or member order is no 422. The status, the headers
//! the layer keeps ([`IdempotencyLayer::stored_headers`]), the body and the trailers are
//! stored in one Redis hash beside the key's lock, in its slot on a cluster.
//!
//! **Only a holder stores.** The start, the commit and the response are written with a
//! guarded write: one script checks that the key's lock is still this request's and writes,
//! or writes nothing. An instance paused past its lease that comes back with a late response
//! cannot overwrite the response of the duplicate that ran in its place; it is answered as a
//! lost lease (or, when it committed, with its own answer, which the committed outcome
//! matches).
//!
//! **A response over the bound** (256 KiB by default) still reaches its client, but only
//! the fact that the request ran is kept: a duplicate is answered 500 (the server's bound,
//! not the client's fault), never run a second time, and the layer logs an ERROR.
//!
//! **Where it goes.** Outside the lock layer, so a duplicate is answered before it waits for
//! the business key's lock, and inside a layer that reads the keys from the body
//! ([`JsonKeysLayer`](crate::layer::JsonKeysLayer)): body keys, then idempotency, then the
//! lock. The response body is read whole before it is stored, so an idempotent route does
//! not stream its response.
//!
//! **Scope, lifetime and size.** Scope keys per tenant ([`IdempotencyLayer::scope`], any key
//! extractor) so no tenant can replay another's response, and choose the TTL
//! ([`IdempotencyLayer::ttl`], 24 h) longer than any client retries. A key past its TTL runs
//! again. A record takes about 920 to 980 bytes of Redis memory for a 110-byte answer
//! committed with its outcome (`MEMORY USAGE` of the example's payment record, with keys of
//! 36 and 40 characters; the outcome is a second copy of the body), about 760 without a
//! commit: size Redis for new keys per second × TTL × that (100 keys a second for 24 h: 8.6
//! million records, about 8 GB). Cut it with a
//! shorter TTL, fewer stored headers, or a smaller outcome than the body. Every setting and
//! its default: [`crate::guide::configuration`].
//!
//! **gRPC.** The key comes from the `idempotency-key` metadata (gRPC metadata travels as
//! headers); past the wait a duplicate gets `ABORTED`, and the statuses a retry may cure
//! (`UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`, `INTERNAL`,
//! `UNAVAILABLE`, `DATA_LOSS`) are not stored. A deadline that passes or a call the client
//! cancels ends the call, not its flow. `examples/tonic_accounts.rs` makes a deposit once
//! across two instances.
//!
//! **Operating it.** `lockctl idempotent KEY --scope acme` prints what is stored for a key
//! (status, fingerprint, body size, headers, time left; exit 1 when nothing is),
//! [`IdempotencyRecords::get`] reads it from code and [`IdempotencyRecords::record`] the
//! whole record (started, committed, answered). The metric `redis_lock_idempotent_total`
//! counts each outcome ([`crate::guide::operating`]).

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
mod storable;

pub use context::IdempotencyContext;
pub use future::ResponseFuture;
pub use layer::IdempotencyLayer;
pub use record::{IdempotencyRecords, KeyRecord, StoredResponse};
pub use replay_body::ReplayableBody;
pub use request_key::MAX_IDEMPOTENCY_KEY_LEN;
pub use service::IdempotencyService;
pub use settings::{
    BodyComparison, DEFAULT_MAX_REQUEST_BODY, DEFAULT_MAX_STORED_BODY, DEFAULT_TTL,
    OnUnknownOutcome, REPLAYED_HEADER, StoredAnswers,
};

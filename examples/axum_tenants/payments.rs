//! `POST /payments`: a payment that must be made once however often the client sends it,
//! behind `IdempotencyLayer`. The client picks an `Idempotency-Key` per payment and sends it
//! with its tenant (`x-tenant-id`, the key's scope); its retries, double submits and
//! duplicates sent to another instance get the first answer, byte for byte, with
//! `idempotent-replayed: true`.
//!
//! ```text
//! curl -i -X POST localhost:3000/payments -H 'x-tenant-id: acme' \
//!      -H 'Idempotency-Key: 8e03978e-40d5' -d '{"amount":1200,"currency":"EUR"}'
//! ```
//!
//! The handler counts its runs per key in Redis (`INCR payments:executions:{<tenant>:<key>}`,
//! one slot per key on a cluster) and puts the count in its answer, with a new payment id and
//! the instance that ran it: a key whose count passes 1 was paid twice. A request header
//! `x-work-ms: N` makes the handler work N ms after it counted itself, so that a test can
//! pause or kill the instance while the handler runs (the count says it started).

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use redis::AsyncCommands;
use serde_json::{Value, json};
use tower_redis_lock::layer::OnMissingKey;
use tower_redis_lock::{HeaderKey, IdempotencyLayer, LockClient};

use crate::Data;

/// The layer's settings the command line may change (`--idempotency-wait-ms`,
/// `--idempotency-ttl-ms`); the library's defaults otherwise (10 s, 24 h).
#[derive(Debug, Default)]
pub(crate) struct Idempotency {
    pub(crate) wait: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
}

#[derive(Clone)]
struct Payments {
    instance: String,
    data: Data,
}

/// The `/payments` route behind its idempotency layer. A request without a key or without a
/// tenant is answered 400: a payment must be safe to retry.
pub(crate) fn router(
    locks: LockClient,
    data: Data,
    instance: String,
    idem: &Idempotency,
) -> Router {
    let mut layer = IdempotencyLayer::new(locks)
        .scope(HeaderKey::new("x-tenant-id"))
        .on_missing_key(OnMissingKey::Reject);
    if let Some(wait) = idem.wait {
        layer = layer.wait_timeout(wait);
    }
    if let Some(ttl) = idem.ttl {
        layer = layer.ttl(ttl);
    }
    Router::new()
        .route("/payments", post(create_payment))
        .with_state(Payments { instance, data })
        .layer(layer)
}

/// The Redis key that counts the runs of the handler for `key` of `tenant`.
pub(crate) fn executions_key(tenant: &str, key: &str) -> String {
    format!("payments:executions:{{{tenant}:{key}}}")
}

/// Makes a payment of `{"amount": <minor units>, "currency": "EUR"}`: counts the run, works
/// `x-work-ms`, answers 201 with the new payment.
async fn create_payment(State(app): State<Payments>, headers: HeaderMap, body: String) -> Response {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
    };
    // The layer let the request in, so both are there; the key as the client wrote it,
    // bare or quoted.
    let tenant = text("x-tenant-id").to_owned();
    let key = text("idempotency-key").trim_matches('"').to_owned();
    let work = Duration::from_millis(text("x-work-ms").parse().unwrap_or(0));
    let payment: Value = match serde_json::from_str(&body) {
        Ok(payment @ Value::Object(_)) => payment,
        // A 4xx is the request's outcome: stored, and replayed to its retries.
        _ => return (StatusCode::BAD_REQUEST, "the body is no JSON object").into_response(),
    };

    let mut data = app.data.clone();
    let execution: u64 = match data.incr(executions_key(&tenant, &key), 1_u64).await {
        Ok(execution) => execution,
        // A 5xx is not stored: the retry runs again.
        Err(err) => return (StatusCode::SERVICE_UNAVAILABLE, err.to_string()).into_response(),
    };
    tokio::time::sleep(work).await;
    let id = format!("pay_{:016x}", rand::random::<u64>());
    let answer = json!({
        "payment": id,
        "tenant": tenant,
        "amount": payment["amount"],
        "currency": payment["currency"],
        "instance": app.instance,
        "execution": execution,
    });
    let location = [(header::LOCATION, format!("/payments/{id}"))];
    (StatusCode::CREATED, location, Json(answer)).into_response()
}

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
//! The charge is a write in Redis, `INCR payments:charges:<tag>` (with `<tag>` the key
//! record's hash tag, so that it shares the record's slot on a cluster): a key whose count
//! passes 1 was charged twice. The handler commits it with the key's outcome in one step
//! (`IdempotencyContext::commit`), so an attempt that paused past its lease charges nothing,
//! and a retry of an attempt that charged is answered from what it committed; the layer runs
//! a retry of an attempt whose outcome is unknown again (`OnUnknownOutcome::RunAgain`).
//! `--payments-commit no` charges with a plain `INCR` instead, under the layer's default
//! (`OnUnknownOutcome::Refuse`: such a retry is answered 500, at most once).
//! `--payments-sql PATH` charges in SQLite instead (`axum_tenants/ledger.rs`): a ledger row
//! and the key's row in one transaction, the key unique, under `OnUnknownOutcome::RunAgain`.
//!
//! The handler counts its runs per key (`INCR payments:runs:<tag>`) before it works
//! `x-work-ms` and charges, and waits `x-after-charge-ms` after the charge: a test pauses or
//! kills the instance there, knowing from the counts where the handler stands. Each answer
//! says which run made it (`execution`) and on which instance.

use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use redis::AsyncCommands;
use serde_json::{Value, json};
use tower_redis_lock::idempotency::OnUnknownOutcome;
use tower_redis_lock::layer::OnMissingKey;
use tower_redis_lock::{
    GuardedWrites, HeaderKey, IdempotencyContext, IdempotencyLayer, LockClient,
};

use crate::Data;
use crate::ledger::{Charged, Ledger, Payment};

/// The layer's settings the command line may change (`--idempotency-wait-ms`,
/// `--idempotency-ttl-ms`); the library's defaults otherwise (10 s, 24 h). And how the
/// handler charges (`--payments-commit no`, `--payments-sql PATH`).
#[derive(Debug, Default)]
pub(crate) struct Idempotency {
    pub(crate) wait: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) charge: Charge,
}

/// How the handler charges.
#[derive(Debug, Clone, Default)]
pub(crate) enum Charge {
    /// In Redis, committed with the key's outcome (`IdempotencyContext::commit`).
    #[default]
    Commit,
    /// In Redis, with a plain `INCR`: the layer's at-most-once default keeps it to once.
    Plain,
    /// In SQL, with the key in the same transaction.
    Sql(Ledger),
}

#[derive(Clone)]
struct Payments {
    instance: String,
    data: Data,
    charge: Charge,
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
    if !matches!(idem.charge, Charge::Plain) {
        // The handler keeps its charge to once itself: a retry of an attempt whose outcome
        // is unknown may run.
        layer = layer.on_unknown_outcome(OnUnknownOutcome::RunAgain);
    }
    if let Some(wait) = idem.wait {
        layer = layer.wait_timeout(wait);
    }
    if let Some(ttl) = idem.ttl {
        layer = layer.ttl(ttl);
    }
    Router::new()
        .route("/payments", post(create_payment))
        .with_state(Payments {
            instance,
            data,
            charge: idem.charge.clone(),
        })
        .layer(layer)
}

/// The Redis key that counts the charges of the payment whose key record has `tag`.
pub(crate) fn charges_key(tag: &str) -> String {
    format!("payments:charges:{tag}")
}

/// The Redis key that counts the runs of the handler for the payment whose record has `tag`.
pub(crate) fn runs_key(tag: &str) -> String {
    format!("payments:runs:{tag}")
}

/// Makes a payment of `{"amount": <minor units>, "currency": "EUR"}`: counts the run, works
/// `x-work-ms`, charges, waits `x-after-charge-ms`, answers 201 with the new payment.
async fn create_payment(
    State(app): State<Payments>,
    Extension(idem): Extension<IdempotencyContext>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let millis = |name: &str| {
        let value = headers.get(name).and_then(|value| value.to_str().ok());
        Duration::from_millis(value.and_then(|v| v.parse().ok()).unwrap_or(0))
    };
    let payment: Value = match serde_json::from_str(&body) {
        Ok(payment @ Value::Object(_)) => payment,
        // A 4xx is the request's outcome: stored, and replayed to its retries.
        _ => return (StatusCode::BAD_REQUEST, "the body is no JSON object").into_response(),
    };
    if let Some(earlier) = idem.committed() {
        // An earlier attempt charged and stopped before its answer was stored: answer what
        // it committed, and charge nothing.
        return created(earlier.clone());
    }

    let mut data = app.data.clone();
    let tag = idem.hash_tag();
    let execution: u64 = match data.incr(runs_key(tag), 1_u64).await {
        Ok(execution) => execution,
        // A 5xx is not stored: the retry runs again.
        Err(err) => return (StatusCode::SERVICE_UNAVAILABLE, err.to_string()).into_response(),
    };
    tokio::time::sleep(millis("x-work-ms")).await;
    let id = format!("pay_{:016x}", rand::random::<u64>());
    let answer = json!({
        "payment": id,
        "tenant": idem.scope().first(),
        "amount": payment["amount"],
        "currency": payment["currency"],
        "instance": app.instance,
        "execution": execution,
    });
    let answer = Bytes::from(answer.to_string());
    let unavailable = |err: String| (StatusCode::SERVICE_UNAVAILABLE, err).into_response();
    match &app.charge {
        Charge::Commit => {
            let charge = GuardedWrites::new().command("INCR", &charges_key(tag), [] as [&str; 0]);
            match idem.commit(charge, answer.clone()).await {
                Ok(true) => {}
                // The lock was lost (a pause past the lease): nothing was charged, and a
                // retry may charge in this attempt's place.
                Ok(false) => {
                    return unavailable("the payment's lock was lost; nothing was charged".into());
                }
                Err(err) => return unavailable(err.to_string()),
            }
        }
        Charge::Plain => {
            if let Err(err) = data.incr::<_, _, u64>(charges_key(tag), 1_u64).await {
                return unavailable(err.to_string());
            }
        }
        Charge::Sql(ledger) => {
            let charged = Payment {
                tenant: idem.scope().first().map_or("", String::as_str),
                key: idem.key(),
                fingerprint: idem.fingerprint(),
                amount: payment["amount"].as_i64().unwrap_or(0),
            };
            match ledger.charge_once(charged, answer.clone()).await {
                Ok(Charged::Now) => {}
                // An earlier attempt charged, and stopped before its answer was stored.
                Ok(Charged::Before(earlier)) => return created(earlier),
                Err(err) => return unavailable(err.to_string()),
            }
        }
    }
    tokio::time::sleep(millis("x-after-charge-ms")).await;
    created(answer)
}

/// The 201 of a payment, from its JSON.
fn created(payment: Bytes) -> Response {
    let id = serde_json::from_slice::<Value>(&payment)
        .ok()
        .and_then(|payment| payment["payment"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let headers = [
        (header::LOCATION, format!("/payments/{id}")),
        (header::CONTENT_TYPE, "application/json".to_owned()),
    ];
    (StatusCode::CREATED, headers, payment).into_response()
}

//! `lockctl idempotent`: what the idempotency layer stored for a key, as one line a field.

use std::process::ExitCode;

use serde_json::json;
use tower_redis_lock::idempotency::IdempotencyRecords;
use tower_redis_lock::{LockClient, LockError};

use crate::out::emit;
use crate::out::sayln;
use crate::show::{human, millis};

/// Prints the stored response of `key` in `scope`: its status, the fingerprint of the
/// request it answered, the body's length (or that it was over the store's bound), the
/// headers kept and the time left; exit 1 when nothing is stored.
pub(crate) async fn show(
    locks: &LockClient,
    key: &str,
    scope: &[String],
    layer_prefix: &str,
    json: bool,
) -> Result<ExitCode, LockError> {
    let records = IdempotencyRecords::new(locks.clone(), layer_prefix);
    let lock = records.lock(scope, key)?;
    let stored = records.get(scope, key).await?;
    let held = lock.is_locked().await?;
    let Some(stored) = stored else {
        if json {
            emit(
                json!({"event": "idempotent", "key": key, "lock": lock.name(), "stored": false, "running": held}),
            );
        } else {
            let running = if held {
                "; a request with it runs now"
            } else {
                ""
            };
            sayln!("{key}: nothing stored (lock {}){running}", lock.name());
        }
        return Ok(ExitCode::from(1));
    };
    let body = stored.body().map(|body| body.len());
    let headers: Vec<String> = stored
        .headers()
        .iter()
        .map(|(name, value)| format!("{name}: {}", String::from_utf8_lossy(value.as_bytes())))
        .collect();
    if json {
        emit(json!({
            "event": "idempotent",
            "key": key,
            "lock": lock.name(),
            "stored": true,
            "running": held,
            "status": stored.status().as_u16(),
            "fingerprint": stored.fingerprint(),
            "body_bytes": body,
            "headers": headers,
            "ttl_ms": stored.ttl().map(millis),
        }));
    } else {
        let body = body.map_or("over the store's bound, not kept".to_owned(), |n| {
            format!("{n} bytes")
        });
        let ttl = stored.ttl().map_or("-".to_owned(), human);
        sayln!(
            "{key}: status {} stored (lock {})",
            stored.status().as_u16(),
            lock.name()
        );
        sayln!("  fingerprint  {}", stored.fingerprint());
        sayln!("  body         {body}");
        sayln!(
            "  headers      {}",
            if headers.is_empty() {
                "-".to_owned()
            } else {
                headers.join(", ")
            }
        );
        sayln!("  expires in   {ttl}");
    }
    Ok(ExitCode::SUCCESS)
}

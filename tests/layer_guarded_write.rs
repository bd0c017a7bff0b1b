//! Guarded writes from a handler behind `LockLayer` (`LockContext::write_if_held`), against
//! a real redis-server: applied while the layer's lock is the request's, refused once
//! another owner took it while the handler stood still (as an instance paused past its
//! lease would find it), and a clear error where no lock is held in Redis.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use support::{RedisServer, client, eventually};
use tokio::sync::Notify;
use tower::ServiceExt;
use tower_redis_lock::layer::OnLeaseLost;
use tower_redis_lock::{ErrorKind, GuardedWrites, HeaderKey, LockContext, LockLayer};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(10);

/// Where a handler that is asked to (`x-stand-still: 1`) waits before it writes, and how
/// the test tells it to go on.
#[derive(Default)]
struct StandStill {
    standing: Notify,
    go_on: Notify,
}

/// Sets the account's balance to the request's `x-balance`, under the account's lock: the
/// answer says whether the write was applied.
async fn set_balance(
    State(still): State<Arc<StandStill>>,
    lock: LockContext,
    headers: HeaderMap,
) -> String {
    let header = |name: &str| headers[name].to_str().unwrap().to_owned();
    if headers.contains_key("x-stand-still") {
        still.standing.notify_one();
        still.go_on.notified().await;
    }
    let key = format!("balance:{}", lock.hash_tag());
    let writes = GuardedWrites::new().set(&key, header("x-balance"));
    match lock.write_if_held(&writes).await {
        Ok(applied) => format!("applied={applied}"),
        Err(err) => format!("error={:?}", err.kind()),
    }
}

async fn send(app: &Router, balance: &str, stand_still: bool) -> (StatusCode, String) {
    let mut request = Request::post("/balance")
        .header("x-account", "acme")
        .header("x-balance", balance);
    if stand_still {
        request = request.header("x-stand-still", "1");
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_writes_under_the_layers_lock_and_writes_nothing_once_it_was_taken() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let still = Arc::new(StandStill::default());
    // The handler finishes whatever happens to its lease: the write itself must refuse.
    let layer = LockLayer::new(locks.clone(), HeaderKey::new("x-account"))
        .on_lease_lost(OnLeaseLost::Finish);
    let app = Router::new()
        .route("/balance", post(set_balance))
        .with_state(still.clone())
        .layer(layer);

    assert_eq!(
        send(&app, "100", false).await,
        (StatusCode::OK, "applied=true".to_owned())
    );
    let balance = || server.cmd::<Option<String>>(&["GET", "balance:{acme}"]);
    assert_eq!(balance().as_deref(), Some("100"));

    // The next handler stands still while an operator takes its lock and another owner
    // holds it, as a paused instance finds it when it resumes.
    let answer = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "999", true).await }
    });
    tokio::time::timeout(SLACK, still.standing.notified())
        .await
        .expect("the handler stands still under its lock");
    let other = client(&server).await;
    let lock = other.lock("acme").unwrap();
    assert!(lock.force_unlock().await.unwrap(), "the lock was held");
    let guard = lock.acquire_timeout(SLACK).await.expect("another owner");
    still.go_on.notify_one();
    let answer = tokio::time::timeout(SLACK, answer).await.unwrap().unwrap();
    assert_eq!(answer, (StatusCode::OK, "applied=false".to_owned()));
    assert_eq!(
        balance().as_deref(),
        Some("100"),
        "a write without the lock"
    );

    // The other owner's guard writes; the request's lock is the layer's again after it.
    assert!(
        guard
            .write_if_held(&GuardedWrites::new().set("balance:{acme}", "150"))
            .await
            .unwrap()
    );
    guard.release().await.unwrap();
    assert_eq!(
        send(&app, "200", false).await,
        (StatusCode::OK, "applied=true".to_owned())
    );
    assert!(
        eventually(SLACK, || balance().as_deref() == Some("200")).await,
        "{:?}",
        balance()
    );
}

#[tokio::test]
async fn a_detached_context_or_a_lock_not_held_is_a_clear_error() {
    let detached = LockContext::detached([("acme", 7)]);
    assert_eq!(detached.hash_tag(), "{acme}");
    let writes = GuardedWrites::new().set("balance:{acme}", "1");
    let err = detached.write_if_held(&writes).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnsupportedGuard);
    assert!(err.to_string().contains("detached"), "{err}");

    let server = RedisServer::start();
    let locks = client(&server).await;
    let app = Router::new()
        .route(
            "/balance",
            post(|lock: LockContext| async move {
                let writes = GuardedWrites::new().set("other", "1");
                match lock.write_if_held_under("tenant:other", &writes).await {
                    Ok(applied) => format!("applied={applied}"),
                    Err(err) => format!("error={:?}", err.kind()),
                }
            }),
        )
        .layer(LockLayer::new(locks, HeaderKey::new("x-account")));
    let request = Request::post("/balance")
        .header("x-account", "acme")
        .body(Body::empty())
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(body, "error=NotOwner");
    assert_eq!(server.cmd::<Option<String>>(&["GET", "other"]), None);
}

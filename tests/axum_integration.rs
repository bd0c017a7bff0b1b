//! The layer inside axum routers against a real redis-server: `PathParamKey` under `nest`,
//! `route_layer` and a layer on the router itself; `LockContext` and `Option<LockContext>`
//! as handler arguments; locks a handler takes for keys in the body, answered as the layer
//! would (its keys named) and given up when a lease is lost; and the layer's answers with
//! readable bodies.

mod support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Json, State};
use axum::routing::post;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use serde::Deserialize;
use support::logs::CapturedLogs;
use support::{RedisServer, client, client_with_lease, eventually};
use tower::ServiceExt;
use tower_redis_lock::layer::{PathParamKey, ProblemJson, Rejection, RouteParamKey};
use tower_redis_lock::{HeaderKey, Lease, LockClient, LockContext, LockLayer, any_lost};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(5);

/// The keys the request holds, or `unlocked`.
async fn keys_held(lock: Option<LockContext>) -> String {
    match lock {
        Some(lock) => lock.keys().collect::<Vec<_>>().join(","),
        None => "unlocked".to_owned(),
    }
}

/// Insists on a lock: 500 when the request has none.
async fn needs_lock(lock: LockContext) -> String {
    lock.fencing_token().to_string()
}

fn invoices() -> Router {
    Router::new()
        .route("/tenants/{tenant}/invoices", post(keys_held))
        .route("/strict/{tenant}", post(needs_lock))
}

async fn post_to(app: &Router, path: &str) -> (StatusCode, String) {
    let request = Request::post(path).body(Body::empty()).unwrap();
    text(app.clone().oneshot(request).await.unwrap()).await
}

async fn text(response: Response<Body>) -> (StatusCode, String) {
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn path_param_key_takes_the_parameter_axum_matched_wherever_the_layer_sits() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let layer = LockLayer::new(locks.clone(), PathParamKey::new("tenant"));

    let on_the_router = invoices().layer(layer.clone());
    let around_the_nest = Router::new().nest("/api", invoices()).layer(layer.clone());
    let inside_the_nest = Router::new().nest("/api", invoices().layer(layer.clone()));
    let on_the_routes = invoices().route_layer(layer.clone());

    assert_eq!(
        post_to(&on_the_router, "/tenants/acme/invoices").await,
        (StatusCode::OK, "acme".to_owned())
    );
    for app in [&around_the_nest, &inside_the_nest] {
        assert_eq!(
            post_to(app, "/api/tenants/acme/invoices").await,
            (StatusCode::OK, "acme".to_owned())
        );
        // Percent-decoded, as axum decodes it.
        assert_eq!(
            post_to(app, "/api/tenants/caf%C3%A9/invoices").await,
            (StatusCode::OK, "café".to_owned())
        );
    }
    assert_eq!(
        post_to(&on_the_routes, "/tenants/acme/invoices").await,
        (StatusCode::OK, "acme".to_owned())
    );
    assert_eq!(
        post_to(&on_the_routes, "/nowhere").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_template_that_misses_the_nest_prefix_runs_unlocked_and_says_so() {
    let logs = CapturedLogs::start();
    let server = RedisServer::start();
    let locks = client(&server).await;
    // The template lacks the `/api` prefix the outer router's layer sees.
    let layer = LockLayer::new(locks, RouteParamKey::new("/tenants/{tenant}", "tenant"));
    let app = Router::new().nest("/api", invoices()).layer(layer);
    for _ in 0..2 {
        assert_eq!(
            post_to(&app, "/api/tenants/acme/invoices").await,
            (StatusCode::OK, "unlocked".to_owned())
        );
    }
    let warnings = logs.lines_with("found no lock key");
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert!(
        warnings[0].contains("/api/tenants/{tenant}/invoices"),
        "the warning names the route axum matched: {}",
        warnings[0]
    );
    // A handler that insists on a lock is told plainly.
    let (status, body) = post_to(&app, "/api/strict/acme").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("the request holds no lock"), "{body}");
}

#[derive(Deserialize)]
struct Transfer {
    from: String,
    to: String,
    /// For the tests: how long the work under the locks takes.
    #[serde(default)]
    work_ms: u64,
}

/// How long the transfer handler waits for its locks: short, so the test sees the answer.
const WAIT: Duration = Duration::from_millis(300);

/// The work under both locks, a stand-in: it takes as long as the body says.
async fn move_money(transfer: &Transfer) -> String {
    tokio::time::sleep(Duration::from_millis(transfer.work_ms)).await;
    format!("moved from {} to {}", transfer.from, transfer.to)
}

const ACCOUNTS: &str = "accounts:"; // the layer's .key_prefix(ACCOUNTS) too

async fn transfer(
    State(locks): State<LockClient>,
    Json(transfer): Json<Transfer>,
) -> Result<String, Rejection> {
    let names = [
        format!("{ACCOUNTS}{}", transfer.from),
        format!("{ACCOUNTS}{}", transfer.to),
    ];
    let guards = locks
        .acquire_all_timeout(&names, Lease::Watchdog, WAIT)
        .await
        .map_err(|err| Rejection::from_lock_error(&err, &names))?; // the layer's 503
    // Both accounts are ours while `guards` lives; a lost lease stops the work, as the layer.
    tokio::select! {
        moved = move_money(&transfer) => Ok(moved),
        lost = any_lost(&guards) => Err(Rejection::from_lost_lease(lost, &names)),
    }
}

/// The transfers route with the handler above, its locks taken with `locks`.
fn transfers(locks: &LockClient) -> Router {
    Router::new()
        .route("/transfers", post(transfer))
        .with_state(locks.clone())
}

/// Posts a transfer whose work takes `work_ms`; the status, `Retry-After` and the body.
async fn send_transfer(
    app: &Router,
    from: &str,
    to: &str,
    work_ms: u64,
) -> (StatusCode, Option<String>, String) {
    let body = format!(r#"{{"from":"{from}","to":"{to}","work_ms":{work_ms}}}"#);
    let request = Request::post("/transfers")
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .map(|value| value.to_str().unwrap().to_owned());
    let (status, body) = text(response).await;
    (status, retry_after, body)
}

#[tokio::test]
async fn keys_in_the_body_are_locked_by_the_handler_and_answered_as_the_layer_would() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let app = transfers(&locks);
    let (status, _, body) = send_transfer(&app, "a", "b", 0).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "moved from a to b")
    );

    // Another instance holds account b: the handler's wait ends, answered 503 like the
    // layer, naming the keys.
    let other = client(&server).await;
    let held = other.lock("accounts:b").unwrap().acquire().await.unwrap();
    let answer = send_transfer(&app, "a", "b", 0).await;
    assert_eq!(
        answer,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("1".to_owned()),
            "lock wait timed out for [accounts:a, accounts:b]; retry later\n".to_owned()
        )
    );
    // What it took is released, in the background as a dropped guard is: account a is free.
    assert!(
        eventually(SLACK, || server
            .cmd::<i64>(&["EXISTS", "lock:{accounts:a}"])
            == 0)
        .await,
        "account a was released"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_handler_whose_lock_is_force_unlocked_stops_and_answers_503_naming_its_keys() {
    let server = RedisServer::start();
    // Renewed every 200 ms: a lock taken from under the handler is found within that.
    let locks = client_with_lease(&server.url(), Duration::from_millis(600)).await;
    let app = transfers(&locks);
    let work = Duration::from_secs(30);
    let started = Instant::now();
    let answer = tokio::spawn({
        let app = app.clone();
        async move { send_transfer(&app, "a", "b", work.as_millis() as u64).await }
    });
    assert!(
        eventually(SLACK, || server.cmd::<i64>(&[
            "EXISTS",
            "lock:{accounts:a}",
            "lock:{accounts:b}"
        ]) == 2)
        .await,
        "the handler holds both accounts"
    );

    // An operator takes account b away while the handler works.
    let operator = client(&server).await;
    assert!(
        operator
            .lock("accounts:b")
            .unwrap()
            .force_unlock()
            .await
            .unwrap()
    );
    let answer = tokio::time::timeout(SLACK, answer)
        .await
        .expect("the handler stops well before its work would end")
        .unwrap();
    assert!(started.elapsed() < work);
    assert_eq!(
        answer,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Some("1".to_owned()),
            "lock lost while the request ran for [accounts:a, accounts:b]; retry\n".to_owned()
        )
    );
    // The handler's other lock is given back.
    assert!(
        eventually(SLACK, || server
            .cmd::<i64>(&["EXISTS", "lock:{accounts:a}"])
            == 0)
        .await,
        "account a was released"
    );
}

#[tokio::test]
async fn answers_have_a_readable_body_in_text_or_problem_json() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let held = client(&server)
        .await
        .lock("acme")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let layer = LockLayer::new(locks, HeaderKey::new("X-Tenant-Id"))
        .wait_timeout(Duration::from_millis(200));
    let plain = invoices().layer(layer.clone());
    let problem = invoices().layer(layer.rejection(ProblemJson));
    let request = || {
        Request::post("/tenants/acme/invoices")
            .header("x-tenant-id", "acme")
            .body(Body::empty())
            .unwrap()
    };

    let response = plain.oneshot(request()).await.unwrap();
    assert_eq!(
        response.headers()[CONTENT_TYPE],
        "text/plain; charset=utf-8"
    );
    assert_eq!(
        text(response).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "lock wait timed out for [acme]; retry later\n".to_owned()
        )
    );
    let response = problem.oneshot(request()).await.unwrap();
    assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
    assert_eq!(response.headers()[RETRY_AFTER], "1");
    assert_eq!(
        text(response).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            r#"{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"lock wait timed out for [acme]; retry later","kind":"timeout"}"#
                .to_owned()
        )
    );
    held.release().await.unwrap();
}

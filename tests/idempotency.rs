//! The idempotency layer in an axum router against a real redis-server (and a cluster):
//! a key runs once and its duplicates get its response, whatever arrives when; a reused key
//! is 422, a key past its TTL runs again; what is not stored (server errors, a response
//! over the bound, a handler whose lease was lost) and the policies for a missing key and
//! an unreachable Redis.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use support::cluster::RedisCluster;
use support::{RedisServer, client, client_with_lease, eventually};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};
use tower_redis_lock::idempotency::{
    BodyComparison, IdempotencyRecords, KeyRecord, OnUnknownOutcome, REPLAYED_HEADER, StoredAnswers,
};
use tower_redis_lock::layer::{OnMissingKey, OnRedisUnavailable};
use tower_redis_lock::{HeaderKey, IdempotencyLayer, LockClient};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(5);
/// Bound on any one answer: far above the 10 s wait of a duplicate.
const ANSWERED_WITHIN: Duration = Duration::from_secs(30);

/// What the handlers share: how often each ran, and a gate the slow one waits at.
#[derive(Clone, Default)]
struct Handlers {
    runs: Arc<AtomicUsize>,
    started: Arc<Notify>,
    gate: Arc<Notify>,
}

impl Handlers {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn router(&self, layer: IdempotencyLayer<HeaderKey>) -> Router {
        Router::new()
            .route("/orders", post(create_order))
            .route("/slow", post(slow_order))
            .route("/failing", post(failing_order))
            .route("/refusing", post(refused_order))
            .route("/big", post(big_report))
            .with_state(self.clone())
            .layer(layer)
    }
}

async fn create_order(State(handlers): State<Handlers>, body: String) -> impl IntoResponse {
    let run = handlers.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [
            (LOCATION, format!("/orders/{run}")),
            (CONTENT_TYPE, "application/json".into()),
        ],
        [("x-request-only", "not kept")],
        format!("{{\"order\":{run},\"body\":{body:?}}}"),
    )
}

async fn slow_order(State(handlers): State<Handlers>) -> String {
    let run = handlers.runs.fetch_add(1, Ordering::SeqCst) + 1;
    handlers.started.notify_one();
    handlers.gate.notified().await;
    format!("slow order {run}")
}

async fn failing_order(State(handlers): State<Handlers>) -> StatusCode {
    handlers.runs.fetch_add(1, Ordering::SeqCst);
    StatusCode::SERVICE_UNAVAILABLE
}

async fn refused_order(State(handlers): State<Handlers>) -> StatusCode {
    handlers.runs.fetch_add(1, Ordering::SeqCst);
    StatusCode::BAD_REQUEST
}

async fn big_report(State(handlers): State<Handlers>) -> Vec<u8> {
    handlers.runs.fetch_add(1, Ordering::SeqCst);
    vec![b'r'; 300 * 1024]
}

fn layer(locks: &LockClient) -> IdempotencyLayer<HeaderKey> {
    IdempotencyLayer::new(locks.clone()).scope(HeaderKey::new("x-tenant-id"))
}

/// What a client sees of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    status: StatusCode,
    replayed: bool,
    location: Option<String>,
    kept_only: bool,
    body: Vec<u8>,
}

async fn send(app: &Router, path: &str, tenant: &str, key: Option<&str>, body: &str) -> Answer {
    let mut request = Request::post(path).header("x-tenant-id", tenant);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(Body::from(body.to_owned())).unwrap();
    // Bounded, so a layer that ran a handler twice fails here instead of waiting at its gate.
    let response = tokio::time::timeout(ANSWERED_WITHIN, app.clone().oneshot(request))
        .await
        .expect("an answer within the bound")
        .unwrap();
    answer(response).await
}

async fn answer(response: Response<Body>) -> Answer {
    let headers = response.headers().clone();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    Answer {
        status,
        replayed: headers.get(REPLAYED_HEADER).is_some_and(|v| v == "true"),
        location: headers
            .get(LOCATION)
            .map(|v| v.to_str().unwrap().to_owned()),
        kept_only: headers.get("x-request-only").is_none(),
        body: body.to_vec(),
    }
}

#[tokio::test]
async fn a_key_runs_once_and_every_duplicate_gets_its_response() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handlers = Handlers::default();
    let app = handlers.router(layer(&locks));

    let first = send(&app, "/orders", "acme", Some("k-1"), "{\"amount\":5}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed && !first.kept_only);
    for _ in 0..3 {
        let again = send(&app, "/orders", "acme", Some("k-1"), "{\"amount\":5}").await;
        assert!(again.replayed, "a duplicate says it is a replay");
        assert!(
            again.kept_only,
            "a header the layer does not keep is not replayed"
        );
        assert_eq!(
            (again.status, &again.location),
            (first.status, &first.location)
        );
        assert_eq!(again.body, first.body);
    }
    assert_eq!(handlers.runs(), 1);

    // Ten copies at once: one runs, nine wait for it and get its answer.
    let copies = (0..10).map(|_| send(&app, "/orders", "acme", Some("k-2"), "{}"));
    let answers = futures_util::future::join_all(copies).await;
    assert_eq!(handlers.runs(), 2);
    assert_eq!(answers.iter().filter(|a| a.replayed).count(), 9);
    assert!(
        answers
            .iter()
            .all(|a| a.body == answers[0].body && a.status == StatusCode::CREATED)
    );

    // Another tenant's key of the same name is another key.
    let other = send(&app, "/orders", "globex", Some("k-1"), "{\"amount\":5}").await;
    assert!(!other.replayed);
    assert_eq!(handlers.runs(), 3);

    let stored = IdempotencyRecords::new(locks.clone(), "")
        .get(&["acme".to_owned()], "k-1")
        .await
        .unwrap()
        .expect("the first response is stored");
    assert_eq!(stored.status(), StatusCode::CREATED);
    assert_eq!(stored.body().unwrap().as_ref(), first.body.as_slice());
    let ttl = stored.ttl().expect("a stored response expires");
    assert!(ttl > Duration::from_secs(23 * 3600) && ttl <= Duration::from_secs(24 * 3600));
}

#[tokio::test]
async fn a_key_reused_with_another_request_is_422_and_a_key_past_its_ttl_runs_again() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handlers = Handlers::default();
    // Long enough that the two requests after the first, on a busy machine, find its record.
    let ttl = Duration::from_secs(2);
    let app = handlers.router(layer(&locks).ttl(ttl));

    let first = send(&app, "/orders", "acme", Some("k"), "{\"amount\":5}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other_body = send(&app, "/orders", "acme", Some("k"), "{\"amount\":6}").await;
    assert_eq!(other_body.status, StatusCode::UNPROCESSABLE_ENTITY);
    let other_path = send(&app, "/failing", "acme", Some("k"), "{\"amount\":5}").await;
    assert_eq!(other_path.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(handlers.runs(), 1, "a reused key runs nothing");

    let records = IdempotencyRecords::new(locks.clone(), "");
    let scope = ["acme".to_owned()];
    let mut gone = false;
    let checked = std::time::Instant::now();
    while checked.elapsed() < ttl * 5 {
        if records.get(&scope, "k").await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone, "the stored response expires with its TTL");
    let later = send(&app, "/orders", "acme", Some("k"), "{\"amount\":6}").await;
    assert_eq!((later.status, later.replayed), (StatusCode::CREATED, false));
    assert_eq!(handlers.runs(), 2);
}

#[tokio::test]
async fn a_duplicate_waits_for_the_first_and_past_the_wait_gets_409() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handlers = Handlers::default();
    let app = handlers.router(layer(&locks).wait_timeout(Duration::from_millis(200)));

    let started = handlers.started.notified();
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/slow", "acme", Some("s"), "").await }
    });
    tokio::time::timeout(SLACK, started)
        .await
        .expect("the first runs");
    let duplicate = send(&app, "/slow", "acme", Some("s"), "").await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert_eq!(handlers.runs(), 1);

    // A duplicate that waits while the first finishes gets its answer.
    let app2 = app.clone();
    let waiting = tokio::spawn(async move { send(&app2, "/slow", "acme", Some("s"), "").await });
    handlers.gate.notify_one();
    let first = first.await.unwrap();
    assert_eq!(
        (first.status, first.body.as_slice()),
        (StatusCode::OK, b"slow order 1".as_slice())
    );
    let waited = waiting.await.unwrap();
    assert_eq!(handlers.runs(), 1);
    assert!(
        waited.status == StatusCode::CONFLICT || (waited.replayed && waited.body == first.body)
    );
    let later = send(&app, "/slow", "acme", Some("s"), "").await;
    assert!(later.replayed && later.body == first.body);
}

#[tokio::test]
async fn a_409_invites_a_retry() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handlers = Handlers::default();
    let app = handlers.router(layer(&locks).wait_timeout(Duration::from_millis(100)));
    let started = handlers.started.notified();
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/slow", "acme", Some("r"), "").await }
    });
    tokio::time::timeout(SLACK, started)
        .await
        .expect("the first runs");
    let request = Request::post("/slow")
        .header("x-tenant-id", "acme")
        .header("idempotency-key", "r")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.headers()[RETRY_AFTER], "1");
    handlers.gate.notify_one();
    first.await.unwrap();
}

#[tokio::test]
async fn server_errors_are_not_stored_and_a_response_over_the_bound_is_not_run_again() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handlers = Handlers::default();
    let app = handlers.router(layer(&locks));

    for _ in 0..2 {
        let failed = send(&app, "/failing", "acme", Some("f"), "").await;
        assert_eq!(
            (failed.status, failed.replayed),
            (StatusCode::SERVICE_UNAVAILABLE, false)
        );
    }
    assert_eq!(handlers.runs(), 2, "a 503 is not stored: the retry runs");

    let big = send(&app, "/big", "acme", Some("b"), "").await;
    assert_eq!(big.status, StatusCode::OK);
    assert_eq!(
        big.body.len(),
        300 * 1024,
        "the first client gets the whole response"
    );
    let duplicate = send(&app, "/big", "acme", Some("b"), "").await;
    assert_eq!(duplicate.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        String::from_utf8_lossy(&duplicate.body).contains("too large to store"),
        "{}",
        String::from_utf8_lossy(&duplicate.body)
    );
    assert_eq!(
        handlers.runs(),
        3,
        "a response over the bound is never run again"
    );
}

#[tokio::test]
async fn missing_and_malformed_keys_and_long_bodies_follow_the_policy() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let handlers = Handlers::default();
    let app = handlers.router(layer(&locks).max_request_body(1024));

    for _ in 0..2 {
        let keyless = send(&app, "/orders", "acme", None, "{}").await;
        assert_eq!(
            (keyless.status, keyless.replayed),
            (StatusCode::CREATED, false)
        );
    }
    assert_eq!(handlers.runs(), 2, "without a key the layer is not there");
    let quoted = send(&app, "/orders", "acme", Some("\"q\""), "{}").await;
    let bare = send(&app, "/orders", "acme", Some("q"), "{}").await;
    assert!(
        !quoted.replayed && bare.replayed,
        "a quoted key is the same key"
    );
    for bad in ["two words", &"k".repeat(256)] {
        let malformed = send(&app, "/orders", "acme", Some(bad), "{}").await;
        assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    }
    let long = send(&app, "/orders", "acme", Some("l"), &"x".repeat(2048)).await;
    assert_eq!(long.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(handlers.runs(), 3);

    let strict = handlers.router(layer(&locks).on_missing_key(OnMissingKey::Reject));
    let keyless = send(&strict, "/orders", "acme", None, "{}").await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST);
    let unscoped = Request::post("/orders")
        .header("idempotency-key", "u")
        .body(Body::empty())
        .unwrap();
    let unscoped = answer(strict.clone().oneshot(unscoped).await.unwrap()).await;
    assert_eq!(
        unscoped.status,
        StatusCode::BAD_REQUEST,
        "no scope is no key"
    );
    assert_eq!(handlers.runs(), 3);
}

#[tokio::test]
async fn redis_down_fails_closed_by_default_and_open_runs_unguarded() {
    let mut server = RedisServer::start();
    let locks = support::client_with_lease(&server.url(), Duration::from_secs(5)).await;
    let handlers = Handlers::default();
    let closed = handlers.router(layer(&locks));
    let open = handlers.router(layer(&locks).on_redis_unavailable(OnRedisUnavailable::FailOpen));
    server.kill();

    let refused = send(&closed, "/orders", "acme", Some("d"), "{}").await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(handlers.runs(), 0, "fail closed runs nothing");
    let ran = send(&open, "/orders", "acme", Some("d"), "{}").await;
    assert_eq!((ran.status, ran.replayed), (StatusCode::CREATED, false));
    assert_eq!(handlers.runs(), 1, "fail open runs the request");
}

#[tokio::test]
async fn what_is_stored_and_how_bodies_compare_are_settings() {
    let server = RedisServer::start();
    let locks = client(&server).await;

    // A handler's 400 is kept by default, and not when only successes are.
    let handlers = Handlers::default();
    let kept = handlers.router(layer(&locks));
    let success_only = handlers.router(layer(&locks).stored_answers(StoredAnswers::SuccessOnly));
    for _ in 0..2 {
        let answer = send(&kept, "/refusing", "acme", Some("bad-1"), "{}").await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    }
    assert_eq!(handlers.runs(), 1, "the 400 was replayed");
    for _ in 0..2 {
        let answer = send(&success_only, "/refusing", "acme", Some("bad-2"), "{}").await;
        assert_eq!(
            (answer.status, answer.replayed),
            (StatusCode::BAD_REQUEST, false)
        );
    }
    assert_eq!(handlers.runs(), 3, "each 400 ran");

    // The same JSON with other spacing and member order: another request byte for byte
    // (422), the same one parsed.
    let first = r#"{"amount":5,"currency":"EUR"}"#;
    let spaced = "{ \"currency\": \"EUR\",\n  \"amount\": 5 }";
    let bytes = handlers.router(layer(&locks));
    let parsed = handlers.router(layer(&locks).body_comparison(BodyComparison::Json));
    for (app, key, second) in [
        (&bytes, "json-1", StatusCode::UNPROCESSABLE_ENTITY),
        (&parsed, "json-2", StatusCode::CREATED),
    ] {
        let answer = send(app, "/orders", "acme", Some(key), first).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{key}");
        let again = send(app, "/orders", "acme", Some(key), spaced).await;
        assert_eq!(again.status, second, "{key}");
        assert_eq!(again.replayed, second == StatusCode::CREATED, "{key}");
    }
    assert_eq!(handlers.runs(), 5);
}

#[tokio::test]
async fn a_handler_whose_lease_is_lost_is_cancelled_and_its_retry_is_refused_or_run_again() {
    let server = RedisServer::start();
    let locks = client_with_lease(&server.url(), Duration::from_millis(600)).await;
    let handlers = Handlers::default();
    let app = handlers.router(layer(&locks));
    let records = IdempotencyRecords::new(locks.clone(), "");
    let scope = ["acme".to_owned()];

    let started = handlers.started.notified();
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "/slow", "acme", Some("lost"), "").await }
    });
    tokio::time::timeout(SLACK, started)
        .await
        .expect("the first runs");
    let operator = client(&server).await;
    let lock = IdempotencyRecords::new(operator, "")
        .lock(&scope, "lost")
        .unwrap();
    assert!(lock.force_unlock().await.unwrap());
    let cancelled = tokio::time::timeout(SLACK, first)
        .await
        .expect("cancelled in time")
        .unwrap();
    assert_eq!(cancelled.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        records.get(&scope, "lost").await.unwrap().is_none(),
        "nothing stored"
    );

    let started = records.record(&scope, "lost").await.unwrap();
    assert!(
        matches!(
            started,
            Some(KeyRecord::Started {
                committed: None,
                ..
            })
        ),
        "{started:?}"
    );

    // Whether the cancelled handler made its effect is unknown: by default its retry is
    // answered 500 and does not run (at most once)...
    let refused = send(&app, "/slow", "acme", Some("lost"), "").await;
    assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        String::from_utf8_lossy(&refused.body).contains("ended without an outcome"),
        "{refused:?}"
    );
    assert_eq!(handlers.runs(), 1);

    // ...and under `OnUnknownOutcome::RunAgain` it runs again, and stores its answer.
    let again = handlers.router(layer(&locks).on_unknown_outcome(OnUnknownOutcome::RunAgain));
    let retry = tokio::spawn({
        let app = again.clone();
        async move { send(&app, "/slow", "acme", Some("lost"), "").await }
    });
    assert!(eventually(SLACK, || handlers.runs() == 2).await);
    handlers.gate.notify_one();
    let retry = retry.await.unwrap();
    assert_eq!(
        (retry.status, retry.body.as_slice()),
        (StatusCode::OK, b"slow order 2".as_slice())
    );
    assert!(records.get(&scope, "lost").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_cluster_the_response_is_stored_in_the_slot_of_its_lock() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let locks = LockClient::builder_cluster(cluster.urls())
        .command_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("cluster client");
    let handlers = Handlers::default();
    let app = handlers.router(layer(&locks));
    for key in ["c-1", "c-2", "c-3", "c-4"] {
        let first = send(&app, "/orders", "acme", Some(key), "{}").await;
        let again = send(&app, "/orders", "acme", Some(key), "{}").await;
        assert_eq!(first.status, StatusCode::CREATED);
        assert!(again.replayed && again.body == first.body);
    }
    assert_eq!(handlers.runs(), 4);
}

/// A gRPC-like service: its status travels in the trailers, as tonic's does.
fn grpc_like(
    runs: Arc<AtomicUsize>,
    status: &'static str,
) -> impl tower::Service<
    Request<UnsyncBoxBody<Bytes, Infallible>>,
    Response = Response<UnsyncBoxBody<Bytes, Infallible>>,
    Error = Infallible,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_request: Request<UnsyncBoxBody<Bytes, Infallible>>| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", status.parse().unwrap());
            let frames = [
                Frame::data(Bytes::from(format!("reply {run}"))),
                Frame::trailers(trailers),
            ];
            let body = StreamBody::new(futures_util::stream::iter(frames.map(Ok)));
            let mut response = Response::new(body.boxed_unsync());
            response
                .headers_mut()
                .insert(CONTENT_TYPE, "application/grpc".parse().unwrap());
            Ok(response)
        }
    })
}

async fn call_grpc_like<S>(service: &S, key: &str) -> (String, Option<String>, bool)
where
    S: tower::Service<
            Request<UnsyncBoxBody<Bytes, Infallible>>,
            Response = Response<UnsyncBoxBody<Bytes, Infallible>>,
            Error = Infallible,
        > + Clone,
{
    let request = Request::post("/orders.Orders/Create")
        .header(CONTENT_TYPE, "application/grpc")
        .header("x-tenant-id", "acme")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")).boxed_unsync())
        .unwrap();
    let response = tokio::time::timeout(ANSWERED_WITHIN, service.clone().oneshot(request))
        .await
        .expect("an answer within the bound")
        .unwrap();
    let replayed = response.headers().contains_key(REPLAYED_HEADER);
    let collected = response.into_body().collect().await.unwrap();
    let status = collected
        .trailers()
        .and_then(|trailers| trailers.get("grpc-status"))
        .map(|status| status.to_str().unwrap().to_owned());
    (
        String::from_utf8(collected.to_bytes().to_vec()).unwrap(),
        status,
        replayed,
    )
}

#[tokio::test]
async fn a_grpc_answer_is_replayed_with_its_trailers_and_a_retryable_status_is_not_stored() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let ok = layer(&locks).layer(grpc_like(runs.clone(), "0"));
    let first = call_grpc_like(&ok, "g-1").await;
    assert_eq!(first, ("reply 1".into(), Some("0".into()), false));
    let again = call_grpc_like(&ok, "g-1").await;
    assert_eq!(again, ("reply 1".into(), Some("0".into()), true));
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let unavailable = layer(&locks).layer(grpc_like(runs.clone(), "14"));
    for _ in 0..2 {
        let (_, status, replayed) = call_grpc_like(&unavailable, "g-2").await;
        assert_eq!((status.as_deref(), replayed), (Some("14"), false));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "UNAVAILABLE is not stored: it runs again"
    );
}

//! What the layer and the client log, read from captured log lines: a warning for keyless
//! requests once per route, rejections one line per kind and second, keys cut to a bounded
//! length, the restart quarantine's start and end, a single-server client given a Redis
//! Cluster node (answered 500 and told once at ERROR), and the idempotency layer's word on
//! whether Redis keeps its records.

mod support;

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use support::cluster::RedisCluster;
use support::logs::CapturedLogs;
use support::{RedisServer, client, client_on_silent_port, eventually, free_port};
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceExt, service_fn};
use tower_redis_lock::layer::{OnMissingKey, RejectionKind};
use tower_redis_lock::{ErrorKind, HeaderKey, IdempotencyLayer, LockClient, LockLayer};

type Http = BoxCloneSyncService<Request<String>, Response<String>, Infallible>;

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(5);

fn ok_handler() -> Http {
    BoxCloneSyncService::new(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new("ok".to_owned()))
    }))
}

fn request(path: &str, tenant: Option<&str>) -> Request<String> {
    let mut builder = Request::builder().uri(path);
    if let Some(tenant) = tenant {
        builder = builder.header("x-tenant-id", tenant);
    }
    builder.body(String::new()).unwrap()
}

async fn send(service: &Http, request: Request<String>) -> Response<String> {
    service.clone().oneshot(request).await.unwrap()
}

#[tokio::test]
async fn a_keyless_request_warns_once_per_route_unless_pass_through_was_chosen() {
    let logs = CapturedLogs::start();
    // Keyless requests never reach Redis: no server is needed.
    let locks = client_on_silent_port(free_port()).await;
    let layer = LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id"));
    let service: Http = BoxCloneSyncService::new(layer.layer(ok_handler()));
    for _ in 0..3 {
        assert_eq!(send(&service, request("/health", None)).await.body(), "ok");
        assert_eq!(send(&service, request("/status", None)).await.body(), "ok");
    }
    let warnings = logs.lines_with("found no lock key");
    assert_eq!(warnings.len(), 2, "one per route: {warnings:#?}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("/health"));
    assert!(warnings[1].contains("/status"));

    // Chosen on purpose: no warning.
    let quiet = LockLayer::new(locks, HeaderKey::new("x-tenant-id"))
        .on_missing_key(OnMissingKey::PassThrough)
        .layer(ok_handler());
    let quiet: Http = BoxCloneSyncService::new(quiet);
    assert_eq!(send(&quiet, request("/other", None)).await.body(), "ok");
    assert_eq!(logs.lines_with("found no lock key").len(), 2);
}

#[tokio::test]
async fn a_burst_of_rejections_logs_one_line() {
    let logs = CapturedLogs::start();
    let locks = client_on_silent_port(free_port()).await;
    let service: Http = BoxCloneSyncService::new(
        LockLayer::new(locks, HeaderKey::new("x-tenant-id")).layer(ok_handler()),
    );
    for _ in 0..50 {
        // A key header sent twice is refused before any key reaches Redis.
        let mut twice = request("/orders", Some("acme"));
        twice
            .headers_mut()
            .append("x-tenant-id", "globex".parse().unwrap());
        let response = send(&service, twice).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        assert!(
            response
                .body()
                .starts_with("invalid lock key: header x-tenant-id is sent more"),
            "{}",
            response.body()
        );
    }
    let lines = logs.lines_with("request rejected");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("kind=\"invalid_key\""), "{}", lines[0]);
}

#[tokio::test]
async fn a_ten_kilobyte_key_is_cut_in_logs_and_in_the_answer() {
    let logs = CapturedLogs::start();
    let locks = client_on_silent_port(free_port()).await;
    let service: Http = BoxCloneSyncService::new(
        LockLayer::new(locks, HeaderKey::new("x-tenant-id")).layer(ok_handler()),
    );
    let huge = "t".repeat(10_000);
    // Over the longest lock name: refused before it reaches Redis.
    let response = send(&service, request("/orders", Some(&huge))).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.body().len() < 300, "{}", response.body());
    let lines = logs.lines_with("request rejected");
    assert_eq!(lines.len(), 1);
    assert!(lines[0].contains("…(+9936 bytes)"), "{}", lines[0]);
    for line in logs.lines() {
        assert!(line.len() < 1_000, "a log line of {} bytes", line.len());
    }
}

#[tokio::test]
async fn a_restart_quarantine_is_logged_and_answered_with_its_own_kind() {
    let logs = CapturedLogs::start();
    let server = RedisServer::start();
    // The quarantine is the lease limit, which a flush starts from when a client finds it:
    // long enough that the layer's answer below comes well within it.
    let quarantine = Duration::from_secs(4);
    let locks = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(1))
        .lease_limit(quarantine)
        .build()
        .await
        .unwrap();
    // The client learns the server's epoch with its first lock.
    let lock = locks.lock("acme").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    let _: () = server.cmd(&["FLUSHALL"]);
    // Far shorter than the quarantine: the wait ends while it runs.
    let err = lock
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RestartQuarantine, "{err}");
    assert!(err.to_string().contains("restart quarantine"), "{err}");
    let left = locks.restart_quarantine_left().expect("a quarantine runs");
    assert!(left <= quarantine, "{left:?}");
    assert_eq!(
        logs.lines_with("Redis lost its data (its epoch changed)")
            .len(),
        1
    );
    let started = logs.lines_with("restart quarantine: this Redis lost its lock epoch");
    assert_eq!(started.len(), 1, "{started:#?}");
    assert!(started[0].contains("WARN"), "{}", started[0]);

    // The layer answers a wait that ends in the quarantine with its own kind.
    let service: Http = BoxCloneSyncService::new(
        LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id"))
            .wait_timeout(Duration::from_millis(200))
            .rejection(|rejection: &tower_redis_lock::layer::Rejection| {
                assert_eq!(rejection.kind(), RejectionKind::RestartQuarantine);
                rejection.default_response()
            })
            .layer(ok_handler()),
    );
    let response = send(&service, request("/orders", Some("globex"))).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.body(),
        "lock service recovering from a possible loss of its data (a new or restarted Redis: its \
         restart quarantine) for [globex]; retry later\n"
    );
    // Retry-After tells the quarantine's end as the client knows it, not the 1 s default.
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (2..=quarantine.as_secs()).contains(&retry_after),
        "Retry-After: {retry_after}"
    );

    // It ends: locks are granted again, and the end is logged once.
    let guard = lock.acquire_timeout(quarantine + SLACK).await.unwrap();
    assert!(guard.is_held());
    assert!(
        eventually(SLACK, || !logs
            .lines_with("restart quarantine over")
            .is_empty())
        .await,
        "the end of the quarantine is logged"
    );
    assert_eq!(locks.restart_quarantine_left(), None);
    assert_eq!(
        logs.lines_with("restart quarantine: this Redis lost its lock epoch")
            .len(),
        1
    );
}

#[tokio::test]
async fn behind_the_layer_a_single_server_client_of_a_cluster_node_is_a_500_logged_once() {
    let logs = CapturedLogs::start();
    let cluster = RedisCluster::start(3);
    let url = format!("redis://127.0.0.1:{}", cluster.masters()[0]);
    let locks = LockClient::connect(&url).await.expect("built");
    let service: Http = BoxCloneSyncService::new(
        LockLayer::new(locks, HeaderKey::new("x-tenant-id")).layer(ok_handler()),
    );
    for tenant in ["acme", "globex", "initech"] {
        let response = send(&service, request("/orders", Some(tenant))).await;
        // Not a 503: no retry cures a configuration, and nothing invites one.
        assert_eq!(
            response.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{tenant}"
        );
        assert!(response.headers().get("retry-after").is_none(), "{tenant}");
        let expected = format!("lock service misconfigured for [{tenant}]\n");
        assert_eq!(response.into_body(), expected);
    }
    // Told once at ERROR (the layer's own INFO line for each rejection aside).
    let told: Vec<String> = logs
        .lines_with("is a node of a Redis Cluster")
        .into_iter()
        .filter(|line| line.contains(" ERROR "))
        .collect();
    assert_eq!(told.len(), 1, "{:?}", logs.lines());
    assert!(told[0].contains("builder_cluster"), "{told:?}");
}

#[tokio::test]
async fn the_idempotency_layer_warns_once_by_name_when_redis_would_lose_its_records() {
    for (persistence, warned) in [
        (&["--appendonly", "no", "--save", ""][..], true),
        (&["--appendonly", "no", "--save", "3600 1"][..], true),
        (&["--appendonly", "yes"][..], false),
    ] {
        let logs = CapturedLogs::start();
        let server = RedisServer::start_with(persistence);
        let locks = client(&server).await;
        let layer = IdempotencyLayer::new(locks).scope(HeaderKey::new("x-tenant-id"));
        let app = axum::Router::new()
            .route("/orders", axum::routing::post(|| async { "ordered" }))
            .layer(layer);
        for key in ["w-1", "w-2"] {
            let request = http::Request::post("/orders")
                .header("x-tenant-id", "acme")
                .header("idempotency-key", key)
                .body(axum::body::Body::empty())
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
        let looked = eventually(SLACK, || !logs.lines_with("idempotency records").is_empty()).await;
        assert!(looked, "{persistence:?}: no word: {:?}", logs.lines());
        let warnings = logs.lines_with("would not survive a restart");
        assert_eq!(
            warnings.len(),
            usize::from(warned),
            "{persistence:?}: {warnings:?}"
        );
        if warned {
            assert!(warnings[0].contains("appendonly=no"), "{warnings:?}");
        }
    }
}

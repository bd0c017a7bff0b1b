//! The axum example over real HTTP: two instances as separate processes, loaded by the
//! load generator, which checks overlaps, fencing tokens and lost updates; and the same
//! with `--limit 3`, checked by the limit's load generator: never more than three handlers
//! of a tenant at once across both, and three reached. Its `GET /metrics` lists every
//! counter an alert watches at 0 before anything was counted.

mod support;

use std::process::Command;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use support::{ChildGuard, RedisServer, axum_instance, example_path};

/// Starts one instance on a free port; its address and the process (killed on drop).
fn instance(server: &RedisServer, name: &str) -> (String, ChildGuard) {
    instance_with(server, name, &[])
}

/// Starts one instance on a free port with extra arguments.
fn instance_with(server: &RedisServer, name: &str, extra: &[&str]) -> (String, ChildGuard) {
    axum_instance(server, name, extra)
}

#[test]
fn two_axum_processes_never_run_one_tenant_twice_at_once() {
    let server = RedisServer::start();
    let (first, _a) = instance(&server, "a");
    let (second, _b) = instance(&server, "b");
    let output = Command::new(example_path("loadgen"))
        .args([
            "--redis",
            &server.url(),
            "--targets",
            &format!("{first},{second}"),
        ])
        .args([
            "--requests",
            "400",
            "--tenants",
            "8",
            "--hot",
            "2",
            "--concurrency",
            "16",
        ])
        .output()
        .expect("loadgen runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("JSON");
    assert_eq!(summary["requests"], 400);
    assert_eq!(summary["instances"], 2);
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["overlaps"], 0);
    assert_eq!(summary["lost_updates"], 0);
    assert_eq!(summary["token_disorder"], 0);
    let stored: u64 = (0..8)
        .map(|t| {
            server
                .cmd::<Option<u64>>(&["GET", &format!("orders:t{t}")])
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(stored, 400, "every order counted once");
}

#[test]
fn two_axum_processes_limited_to_three_run_at_most_three_of_a_tenant_at_once() {
    let server = RedisServer::start();
    let (first, _a) = instance_with(&server, "a", &["--limit", "3"]);
    let (second, _b) = instance_with(&server, "b", &["--limit", "3"]);
    let output = Command::new(example_path("limitgen"))
        .args(["--limit", "3", "--targets", &format!("{first},{second}")])
        .args([
            "--requests",
            "400",
            "--tenants",
            "8",
            "--hot",
            "2",
            "--concurrency",
            "16",
        ])
        .output()
        .expect("limitgen runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("JSON");
    assert_eq!(summary["requests"], 400);
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["most_at_once"], 3, "{stdout}");
    assert_eq!(summary["tenants_over_limit"], 0);
    assert_eq!(summary["shared_tokens"], 0);
    // Counted atomically under the limit: no order lost, none counted twice.
    let stored: u64 = (0..8)
        .map(|t| {
            server
                .cmd::<Option<u64>>(&["GET", &format!("orders:t{t}")])
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(stored, 400, "every order counted once");
}

/// Sends `method` `path` to `target`; the status and the body.
async fn send(target: &str, method: &str, path: &str) -> (u16, String) {
    let http = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = hyper::Request::builder()
        .method(method)
        .uri(format!("{target}{path}"))
        .body(Empty::new())
        .expect("a request");
    let response = http.request(request).await.expect("an answer");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.expect("a body");
    (
        status,
        String::from_utf8(body.to_bytes().to_vec()).expect("UTF-8"),
    )
}

#[tokio::test]
async fn the_metrics_page_lists_every_lost_reason_at_zero_before_any_loss() {
    let server = RedisServer::start();
    let (target, _instance) = instance(&server, "a");
    assert_eq!(send(&target, "POST", "/tenants/acme/orders").await.0, 200);

    let (status, page) = send(&target, "GET", "/metrics").await;
    assert_eq!(status, 200);
    // A series that starts at 1 has no increase: `increase(...[5m]) > 0` needs the 0 first.
    let mut expected: Vec<String> = ["taken", "unreachable", "expired", "data_lost", "shut_down"]
        .iter()
        .map(|reason| format!("redis_lock_lost_total{{reason=\"{reason}\"}} 0"))
        .collect();
    expected.extend([
        "redis_lock_renewals_total{outcome=\"taken\"} 0".to_owned(),
        "redis_lock_layer_rejections_total{reason=\"lease_lost\"} 0".to_owned(),
        "redis_lock_acquisitions_total{kind=\"exclusive\",outcome=\"unavailable\"} 0".to_owned(),
        "redis_lock_acquisitions_total{kind=\"exclusive\",outcome=\"acquired\"} 1".to_owned(),
        // Not `redis_lock_held`: the request's lock may still be on its way back.
        "redis_lock_waiting 0".to_owned(),
    ]);
    let lines: Vec<&str> = page.lines().collect();
    for line in &expected {
        assert!(
            lines.contains(&line.as_str()),
            "{line} is not listed:\n{page}"
        );
    }
}

//! The axum example over real HTTP: two instances as separate processes, loaded by the
//! load generator, which checks overlaps, fencing tokens and lost updates; and the same
//! with `--limit 3`, checked by the limit's load generator: never more than three handlers
//! of a tenant at once across both, and three reached.

mod support;

use std::process::Command;

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

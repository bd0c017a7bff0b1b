//! The tonic example against a real redis-server: two server instances, concurrent deposits
//! per account from metadata, a real gRPC client reading the layer's `UNAVAILABLE`, and a
//! deposit with an idempotency key sent to both instances, made once.

mod support;

use std::process::Command;

use serde_json::Value;
use support::{RedisServer, example_path};

#[test]
fn deposits_through_two_tonic_instances_are_never_lost() {
    let server = RedisServer::start();
    let output = Command::new(example_path("tonic_accounts"))
        .args(["--redis", &server.url()])
        .output()
        .expect("tonic_accounts runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let summary: Value = serde_json::from_str(stdout.lines().last().expect("a summary line"))
        .unwrap_or_else(|err| panic!("{err}: {stdout}"));
    assert_eq!(summary["failed"], 0, "{summary}");
    assert_eq!(summary["lost_updates"], 0, "{summary}");
    assert_eq!(summary["locked_account_answer"], "Some(Unavailable)");
    assert_eq!(summary["idempotent_deposit_made_once"], true, "{summary}");
    assert!(output.status.success());
    let balances: i64 = (0..4)
        .map(|a| server.cmd::<i64>(&["GET", &format!("balance:acct-{a}")]))
        .sum();
    assert_eq!(balances, 205, "200 deposits of 1, and one of 5 sent twice");
}

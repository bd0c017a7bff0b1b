//! The idempotent route of the axum example (`POST /payments`) over real HTTP, its instances
//! separate processes behind one Redis: 1,000 keys sent 5 times at once are charged once
//! each and every copy gets the same answer (idemgen checks); a reused key is 422 and a key
//! past its TTL runs again; an instance paused past its lease before its charge charges
//! nothing and cannot store its late answer over the one of the duplicate that ran in its
//! place; an instance killed mid-handler is run again elsewhere once its lease ran out; and
//! with Redis down or paused, requests fail closed, a key is charged at most once and a
//! record is started or whole, never half.
//!
//! The handler counts its runs and its charges per key in Redis (`support::payments`):
//! the tests poll the runs to know a handler started.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::payments::{
    Counters, Instance, SLACK, Timing, assert_replays, every_charge, paid, pay, payment,
    signal_pid, until,
};
use support::{RedisServer, client, example_path};
use tower_redis_lock::idempotency::IdempotencyRecords;

/// The id of the server's process, as it tells it.
fn server_pid(server: &RedisServer) -> u32 {
    let info: String = server.cmd(&["INFO", "server"]);
    support::process_id(&info).expect("INFO server tells the process id")
}

#[test]
fn three_instances_run_each_of_a_thousand_keys_once_and_answer_every_copy_alike() {
    let server = RedisServer::start();
    let instances: Vec<Instance> = ["a", "b", "c"]
        .iter()
        .map(|name| Instance::start(&server, name, &[]))
        .collect();
    let targets: Vec<&str> = instances.iter().map(|i| i.url.as_str()).collect();
    let started = Instant::now();
    let output = Command::new(example_path("idemgen"))
        .args(["--redis", &server.url(), "--targets", &targets.join(",")])
        .args(["--keys", "1000", "--copies", "5", "--run", "test"])
        .output()
        .expect("idemgen runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).expect("JSON");
    assert_eq!(summary["requests"], 5000, "{stdout}");
    assert_eq!(summary["instances"], 3);
    assert_eq!(summary["executed_once"], 1000, "{stdout}");
    assert_eq!(summary["executed_more"], 0);
    assert_eq!(summary["differing_keys"], 0);
    assert_eq!(summary["replayed"], 4000, "{stdout}");
    assert_eq!(summary["replays_wrong"], 0);
    assert_eq!(summary["in_progress_409"], 0, "{stdout}");
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["reused_key_422"], 3);
    // The counters as Redis has them, read apart from idemgen: one charge per key, 1,000
    // keys.
    let charges = every_charge(&server);
    assert_eq!(charges.len(), 1000);
    assert!(
        charges.iter().all(|charges| *charges == 1),
        "a key charged twice"
    );
    eprintln!("1,000 keys x 5 copies checked in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_is_refused_and_a_key_past_its_ttl_runs_again() {
    let server = RedisServer::start();
    let ttl = ["--idempotency-ttl-ms", "3000"];
    let a = Instance::start(&server, "a", &ttl);
    let b = Instance::start(&server, "b", &ttl);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters::on(&server, &records);
    let scope = ["acme".to_owned()];
    let (first_body, other_body) = (payment(1200), payment(9900));
    let now = Timing::default();

    let first = paid(&a.url, "acme", "k-ttl", &first_body, now).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    assert_eq!(first.json()["execution"], 1);
    let stored = records.get(&scope, "k-ttl").await.unwrap().expect("stored");
    assert_eq!(stored.body(), Some(&first.body));
    let left = stored.ttl().expect("a time to live");
    assert!(left <= Duration::from_secs(3), "the TTL flag: {left:?}");

    // Another body under the key, at either instance: 422, and the handler does not run.
    for target in [&a.url, &b.url] {
        let reused = paid(target, "acme", "k-ttl", &other_body, now).await;
        assert_eq!(reused.status, 422, "{reused:?}");
    }
    let again = paid(&b.url, "acme", "k-ttl", &first_body, now).await;
    assert_replays(&first, &[again]);
    assert_eq!(counters.charges("acme", "k-ttl"), 1);

    until(SLACK, "the record is gone after its TTL", || async {
        records.get(&scope, "k-ttl").await.unwrap().is_none()
    })
    .await;
    // Past its TTL the key is new: the other body runs, as the second payment.
    let later = paid(&b.url, "acme", "k-ttl", &other_body, now).await;
    assert_eq!((later.status, later.replayed), (201, false), "{later:?}");
    assert_eq!(later.json()["execution"], 2);
    assert_eq!(later.json()["amount"], 9900);
    assert_eq!(counters.charges("acme", "k-ttl"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_instance_was_killed_runs_again_elsewhere_once_its_lease_ran_out() {
    let server = RedisServer::start();
    let lease = ["--watchdog-lease-ms", "1000"];
    let mut a = Instance::start(&server, "a", &lease);
    let b = Instance::start(&server, "b", &lease);
    let c = Instance::start(&server, "c", &lease);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters::on(&server, &records);
    let scope = ["acme".to_owned()];
    let lock = records.lock(&scope, "k-kill").unwrap();
    let body = payment(700);
    let now = Timing::default();

    let url = a.url.clone();
    let lost = tokio::spawn({
        let body = body.clone();
        async move { pay(&url, "acme", "k-kill", &body, Timing::work(60_000)).await }
    });
    counters.until_runs("acme", "k-kill", 1).await;
    assert!(lock.is_locked().await.unwrap(), "the first holds the key");
    a.kill();
    assert!(
        lost.await.unwrap().is_err(),
        "a killed instance answers nothing"
    );

    // The client's retry at another instance waits for the dead one's lease, then runs: the
    // dead one had not charged, and the example's handler commits its charge, so the layer
    // runs an attempt whose outcome is unknown again.
    let retry = paid(&b.url, "acme", "k-kill", &body, now).await;
    assert_eq!((retry.status, retry.replayed), (201, false), "{retry:?}");
    assert_eq!(retry.json()["execution"], 2);
    assert_eq!(retry.json()["instance"], "b");

    let mut duplicates = Vec::new();
    for target in [&b.url, &c.url] {
        duplicates.push(paid(target, "acme", "k-kill", &body, now).await);
    }
    assert_replays(&retry, &duplicates);
    assert_eq!(counters.runs("acme", "k-kill"), 2);
    assert_eq!(counters.charges("acme", "k-kill"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_requests_fail_closed_and_a_record_is_never_half_written() {
    let mut server = RedisServer::start();
    let a = Instance::start(&server, "a", &[]);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters::on(&server, &records);
    let scope = ["acme".to_owned()];
    let redis = server_pid(&server);
    let body = payment(300);
    let now = Timing::default();

    // Redis not answering (paused): 503 once the command times out, and the handler did
    // not run; the key is then new.
    signal_pid(redis, "-STOP");
    let refused = pay(&a.url, "acme", "k-down", &body, now).await;
    signal_pid(redis, "-CONT");
    let refused = refused.expect("an answer");
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.retry_after.is_some(), "{refused:?}");
    assert_eq!(counters.runs("acme", "k-down"), 0);
    assert!(records.record(&scope, "k-down").await.unwrap().is_none());
    let first = paid(&a.url, "acme", "k-down", &body, now).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    assert_eq!(first.json()["execution"], 1);

    // Redis paused while a handler runs, until its client has an answer (the charge or the
    // store times out): the record is started, or whole and what the client got; the key
    // is charged once, whichever.
    let url = a.url.clone();
    let answer = tokio::spawn({
        let body = body.clone();
        async move { paid(&url, "acme", "k-half", &body, Timing::work(500)).await }
    });
    counters.until_runs("acme", "k-half", 1).await;
    signal_pid(redis, "-STOP");
    let answer = answer.await;
    signal_pid(redis, "-CONT");
    let answer = answer.unwrap();
    let lock = records.lock(&scope, "k-half").unwrap();
    let record_key = format!("{}:response", lock.keys().hash());
    // Whether the record holds a response: each step's fields whole, with a time to live.
    let check = |when: &str| {
        let mut fields: Vec<String> = server.cmd(&["HKEYS", &record_key]);
        fields.sort();
        let ttl: i64 = server.cmd(&["PTTL", &record_key]);
        assert!(ttl > 0, "{when}: a record without its time to live ({ttl})");
        let whole: [&[&str]; 3] = [
            &["fingerprint", "state"],
            &["fingerprint", "outcome", "state"],
            &[
                "body",
                "fingerprint",
                "headers",
                "kept",
                "outcome",
                "state",
                "status",
            ],
        ];
        let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
        assert!(
            whole.contains(&fields.as_slice()),
            "{when}: a record with some of its fields: {fields:?}"
        );
        fields.contains(&"status")
    };
    let seen_now = check("as Redis went on");
    until(SLACK, "the lock is free", || async {
        !lock.is_locked().await.unwrap()
    })
    .await;
    let seen_later = check("once the lock was free");
    assert!(seen_later || !seen_now, "a stored record vanished");
    let stored = records.get(&scope, "k-half").await.unwrap();
    let duplicate = paid(&a.url, "acme", "k-half", &body, now).await;
    match stored {
        Some(stored) => {
            assert_eq!(
                answer.status, 201,
                "a record of an answer not given: {answer:?}"
            );
            assert_eq!(stored.body(), Some(&answer.body));
            assert_replays(&answer, &[duplicate]);
        }
        None => {
            // Charged and committed, or not: the duplicate is answered from the committed
            // outcome, or charges in the first one's place.
            assert_eq!(duplicate.status, 201, "{duplicate:?}");
            assert!(!duplicate.replayed, "{duplicate:?}");
        }
    }
    assert_eq!(counters.charges("acme", "k-half"), 1, "charged twice");
    eprintln!(
        "with Redis paused the client got {}; the record {} a response",
        answer.status,
        if seen_later { "held" } else { "did not hold" }
    );

    // Redis gone: 503 at once, from an instance that keeps serving.
    server.kill();
    let gone = paid(&a.url, "acme", "k-gone", &body, now).await;
    assert_eq!(gone.status, 503, "{gone:?}");
    assert!(gone.retry_after.is_some(), "{gone:?}");
}

//! The idempotent route of the axum example (`POST /payments`) over real HTTP, its instances
//! separate processes behind one Redis: 1,000 keys sent 5 times at once run once each and
//! every copy gets the same answer (idemgen checks); a reused key is 422 and a key past its
//! TTL runs again; an instance paused past its lease cannot store its late answer over the
//! one of the duplicate that ran in its place; an instance killed mid-handler is run again
//! elsewhere once its lease ran out; and with Redis down or paused, requests fail closed and
//! a record is absent or whole, never half.
//!
//! The handler counts its runs per key in Redis (`payments:executions:{<tenant>:<key>}`)
//! before it works `x-work-ms`: the tests poll that counter to know a handler started.

mod support;

use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use support::{ChildGuard, RedisServer, axum_instance, client, example_path};
use tower_redis_lock::idempotency::{IdempotencyRecords, REPLAYED_HEADER};

/// Bound for what normally takes milliseconds to a few seconds; generous because CI
/// machines are shared.
const SLACK: Duration = Duration::from_secs(20);

/// One instance of the example, killed on drop.
struct Instance {
    url: String,
    process: ChildGuard,
}

impl Instance {
    /// Starts `name` on a free port with extra arguments, and waits for its listening line.
    fn start(server: &RedisServer, name: &str, extra: &[&str]) -> Self {
        let (url, process) = axum_instance(server, name, extra);
        Self { url, process }
    }

    /// Sends the process `signal` (`-STOP`, `-CONT`) by its id.
    fn signal(&self, signal: &str) {
        signal_pid(self.process.0.id(), signal);
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    fn kill(&mut self) {
        self.process.0.kill().expect("the instance is killed");
        self.process.0.wait().expect("the instance is reaped");
    }
}

fn signal_pid(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {signal} {pid}");
}

/// The id of the server's process, as it tells it.
fn server_pid(server: &RedisServer) -> u32 {
    let info: String = server.cmd(&["INFO", "server"]);
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .expect("INFO server tells the process id")
}

/// What a request got.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Option<String>,
    body: Bytes,
}

impl Answer {
    /// The body as JSON (a payment).
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|err| panic!("no JSON ({err}): {:?}", self.body))
    }
}

/// A payment's body.
fn payment(amount: u64) -> String {
    format!("{{\"amount\":{amount},\"currency\":\"EUR\"}}")
}

/// Posts a payment of `tenant` with idempotency `key` to `target`; the handler works
/// `work_ms` after it counted itself. An error when no answer came (an instance killed).
async fn pay(
    target: &str,
    tenant: &str,
    key: &str,
    body: &str,
    work_ms: u64,
) -> Result<Answer, String> {
    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = hyper::Request::post(format!("{target}/payments"))
        .header("x-tenant-id", tenant)
        .header("idempotency-key", key)
        .header("x-work-ms", work_ms.to_string())
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("a request");
    let answer = async {
        let response = http.request(request).await.map_err(|err| err.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|err| err.to_string())?;
        let header = |name: &str| {
            let value = parts.headers.get(name)?;
            Some(value.to_str().expect("ASCII").to_owned())
        };
        Ok(Answer {
            status: parts.status.as_u16(),
            replayed: header(REPLAYED_HEADER).is_some_and(|value| value == "true"),
            retry_after: header("retry-after"),
            body: body.to_bytes(),
        })
    };
    tokio::time::timeout(SLACK * 3, answer)
        .await
        .unwrap_or_else(|_| panic!("no answer from {target} within {:?}", SLACK * 3))
}

/// `pay` that must get an answer.
async fn paid(target: &str, tenant: &str, key: &str, body: &str, work_ms: u64) -> Answer {
    pay(target, tenant, key, body, work_ms)
        .await
        .unwrap_or_else(|err| panic!("{target} did not answer: {err}"))
}

/// How often the handler ran for `key` of `tenant`.
fn executions(server: &RedisServer, tenant: &str, key: &str) -> u64 {
    let counter = format!("payments:executions:{{{tenant}:{key}}}");
    server.cmd::<Option<u64>>(&["GET", &counter]).unwrap_or(0)
}

/// Waits (polling Redis) until the handler ran `runs` times for `key`.
async fn until_executions(server: &RedisServer, tenant: &str, key: &str, runs: u64) {
    let ran = support::eventually(SLACK, || executions(server, tenant, key) >= runs).await;
    assert!(
        ran,
        "the handler did not start run {runs} of {key} within {SLACK:?}"
    );
    assert_eq!(executions(server, tenant, key), runs, "runs of {key}");
}

/// Polls `condition` every 20 ms until it holds; panics with `what` past `bound`.
async fn until<F, Fut>(bound: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < bound, "not within {bound:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that every answer in `duplicates` is `stored`, replayed, byte for byte.
fn assert_replays(stored: &Answer, duplicates: &[Answer]) {
    for duplicate in duplicates {
        assert!(duplicate.replayed, "not a replay: {duplicate:?}");
        assert_eq!(
            (duplicate.status, &duplicate.body),
            (stored.status, &stored.body),
            "a duplicate got another answer"
        );
    }
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
    // The counters as Redis has them, read apart from idemgen: one run per key, 1,000 keys.
    let counters: Vec<String> = server.cmd(&["KEYS", "payments:executions:*"]);
    assert_eq!(counters.len(), 1000);
    let mut mget = vec!["MGET"];
    mget.extend(counters.iter().map(String::as_str));
    let runs: Vec<u64> = server.cmd(&mget);
    assert!(runs.iter().all(|runs| *runs == 1), "a key ran twice");
    eprintln!("1,000 keys x 5 copies checked in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_key_is_refused_and_a_key_past_its_ttl_runs_again() {
    let server = RedisServer::start();
    let ttl = ["--idempotency-ttl-ms", "3000"];
    let a = Instance::start(&server, "a", &ttl);
    let b = Instance::start(&server, "b", &ttl);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let scope = ["acme".to_owned()];
    let (first_body, other_body) = (payment(1200), payment(9900));

    let first = paid(&a.url, "acme", "k-ttl", &first_body, 0).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    assert_eq!(first.json()["execution"], 1);
    let stored = records.get(&scope, "k-ttl").await.unwrap().expect("stored");
    assert_eq!(stored.body(), Some(&first.body));
    let left = stored.ttl().expect("a time to live");
    assert!(left <= Duration::from_secs(3), "the TTL flag: {left:?}");

    // Another body under the key, at either instance: 422, and the handler does not run.
    for target in [&a.url, &b.url] {
        let reused = paid(target, "acme", "k-ttl", &other_body, 0).await;
        assert_eq!(reused.status, 422, "{reused:?}");
    }
    let again = paid(&b.url, "acme", "k-ttl", &first_body, 0).await;
    assert_replays(&first, &[again]);
    assert_eq!(executions(&server, "acme", "k-ttl"), 1);

    until(SLACK, "the record is gone after its TTL", || async {
        records.get(&scope, "k-ttl").await.unwrap().is_none()
    })
    .await;
    // Past its TTL the key is new: the other body runs, as the second payment.
    let later = paid(&b.url, "acme", "k-ttl", &other_body, 0).await;
    assert_eq!((later.status, later.replayed), (201, false), "{later:?}");
    assert_eq!(later.json()["execution"], 2);
    assert_eq!(later.json()["amount"], 9900);
    assert_eq!(executions(&server, "acme", "k-ttl"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_paused_past_its_lease_cannot_store_its_late_answer() {
    let server = RedisServer::start();
    let lease = ["--watchdog-lease-ms", "1000"];
    let a = Instance::start(&server, "a", &lease);
    let b = Instance::start(&server, "b", &lease);
    let c = Instance::start(&server, "c", &lease);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let scope = ["acme".to_owned()];
    let lock = records.lock(&scope, "k-pause").unwrap();
    let body = payment(500);

    let url = a.url.clone();
    let late = tokio::spawn({
        let body = body.clone();
        async move { pay(&url, "acme", "k-pause", &body, 300).await }
    });
    until_executions(&server, "acme", "k-pause", 1).await;
    a.signal("-STOP");
    until(SLACK, "the paused instance's lease runs out", || async {
        !lock.is_locked().await.unwrap()
    })
    .await;

    // The duplicate at another instance runs in its place, and stores its answer.
    let second = paid(&b.url, "acme", "k-pause", &body, 0).await;
    assert_eq!((second.status, second.replayed), (201, false), "{second:?}");
    assert_eq!(second.json()["execution"], 2);
    assert_eq!(second.json()["instance"], "b");

    a.signal("-CONT");
    let late = late.await.unwrap().expect("the paused instance answers");
    assert_eq!(
        late.status, 503,
        "the late answer is a lost lease: {late:?}"
    );
    assert!(late.retry_after.is_some(), "{late:?}");

    let stored = records
        .get(&scope, "k-pause")
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(
        stored.body(),
        Some(&second.body),
        "the late answer overwrote it"
    );
    let mut duplicates = Vec::new();
    for target in [&a.url, &b.url, &c.url] {
        duplicates.push(paid(target, "acme", "k-pause", &body, 0).await);
    }
    assert_replays(&second, &duplicates);
    assert_eq!(executions(&server, "acme", "k-pause"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_instance_was_killed_runs_again_elsewhere_once_its_lease_ran_out() {
    let server = RedisServer::start();
    let lease = ["--watchdog-lease-ms", "1000"];
    let mut a = Instance::start(&server, "a", &lease);
    let b = Instance::start(&server, "b", &lease);
    let c = Instance::start(&server, "c", &lease);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let scope = ["acme".to_owned()];
    let lock = records.lock(&scope, "k-kill").unwrap();
    let body = payment(700);

    let url = a.url.clone();
    let lost = tokio::spawn({
        let body = body.clone();
        async move { pay(&url, "acme", "k-kill", &body, 60_000).await }
    });
    until_executions(&server, "acme", "k-kill", 1).await;
    assert!(lock.is_locked().await.unwrap(), "the first holds the key");
    a.kill();
    assert!(
        lost.await.unwrap().is_err(),
        "a killed instance answers nothing"
    );

    // The client's retry at another instance waits for the dead one's lease, then runs.
    let retry = paid(&b.url, "acme", "k-kill", &body, 0).await;
    assert_eq!((retry.status, retry.replayed), (201, false), "{retry:?}");
    assert_eq!(retry.json()["execution"], 2);
    assert_eq!(retry.json()["instance"], "b");

    let mut duplicates = Vec::new();
    for target in [&b.url, &c.url] {
        duplicates.push(paid(target, "acme", "k-kill", &body, 0).await);
    }
    assert_replays(&retry, &duplicates);
    assert_eq!(executions(&server, "acme", "k-kill"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_requests_fail_closed_and_a_record_is_never_half_written() {
    let mut server = RedisServer::start();
    let a = Instance::start(&server, "a", &[]);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let scope = ["acme".to_owned()];
    let redis = server_pid(&server);
    let body = payment(300);

    // Redis not answering (paused): 503 once the command times out, and the handler did
    // not run; the key is then new.
    signal_pid(redis, "-STOP");
    let refused = pay(&a.url, "acme", "k-down", &body, 0).await;
    signal_pid(redis, "-CONT");
    let refused = refused.expect("an answer");
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.retry_after.is_some(), "{refused:?}");
    assert_eq!(executions(&server, "acme", "k-down"), 0);
    assert!(records.get(&scope, "k-down").await.unwrap().is_none());
    let first = paid(&a.url, "acme", "k-down", &body, 0).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    assert_eq!(first.json()["execution"], 1);

    // Redis paused while a handler runs, until its client has an answer (the store times
    // out): the record is absent, or whole and what the client got.
    let url = a.url.clone();
    let answer = tokio::spawn({
        let body = body.clone();
        async move { paid(&url, "acme", "k-half", &body, 500).await }
    });
    until_executions(&server, "acme", "k-half", 1).await;
    signal_pid(redis, "-STOP");
    let answer = answer.await;
    signal_pid(redis, "-CONT");
    let answer = answer.unwrap();
    let lock = records.lock(&scope, "k-half").unwrap();
    let record_key = format!("{}:response", lock.keys().hash());
    let check = |when: &str| {
        let fields: Vec<String> = server.cmd(&["HKEYS", &record_key]);
        if fields.is_empty() {
            return false;
        }
        let mut fields = fields;
        fields.sort();
        assert_eq!(
            fields,
            ["body", "fingerprint", "headers", "kept", "status"],
            "{when}: a record with some of its fields"
        );
        let ttl: i64 = server.cmd(&["PTTL", &record_key]);
        assert!(ttl > 0, "{when}: a record without its time to live ({ttl})");
        true
    };
    let seen_now = check("as Redis went on");
    until(SLACK, "the lock is free", || async {
        !lock.is_locked().await.unwrap()
    })
    .await;
    let seen_later = check("once the lock was free");
    assert!(seen_later || !seen_now, "a stored record vanished");
    let stored = records.get(&scope, "k-half").await.unwrap();
    let duplicate = paid(&a.url, "acme", "k-half", &body, 0).await;
    match stored {
        Some(stored) => {
            assert_eq!(
                answer.status, 201,
                "a record of an answer not given: {answer:?}"
            );
            assert_eq!(stored.body(), Some(&answer.body));
            assert_replays(&answer, &[duplicate]);
            assert_eq!(executions(&server, "acme", "k-half"), 1);
        }
        None => {
            assert!(!duplicate.replayed, "{duplicate:?}");
            assert_eq!(duplicate.json()["execution"], 2, "{duplicate:?}");
        }
    }
    eprintln!(
        "with Redis paused the client got {}; the record was {}",
        answer.status,
        if seen_later { "whole" } else { "absent" }
    );

    // Redis gone: 503 at once, from an instance that keeps serving.
    server.kill();
    let gone = paid(&a.url, "acme", "k-gone", &body, 0).await;
    assert_eq!(gone.status, 503, "{gone:?}");
    assert!(gone.retry_after.is_some(), "{gone:?}");
}

//! A payment charged once where the user's code runs: the idempotent route of the axum
//! example (`POST /payments`) over real HTTP, its instances separate processes behind one
//! Redis (and a Redis Cluster), with a client that gives up mid-handler and retries, and with
//! instances paused (SIGSTOP) past their lease before and after their charge while the
//! client retries at another instance.
//!
//! The example's handler commits its charge with the key's outcome
//! (`IdempotencyContext::commit`) under `OnUnknownOutcome::RunAgain`; with
//! `--payments-commit no` it charges with a plain write under the layer's default,
//! `OnUnknownOutcome::Refuse`; with `--payments-sql PATH` it charges in SQLite with the key in
//! the same transaction, under `RunAgain`. Each way each key must be charged once. Each pause is made
//! where the handler stands by the counts it leaves in Redis: a run counted and a long wait
//! before the charge, or the charge counted and a long wait after it. Last, Redis itself
//! crashes mid-load and restarts from its append-only file (`appendfsync always`): no key is
//! charged twice.

mod support;

use std::process::{Command, Stdio};

use support::cluster::RedisCluster;
use support::payments::{
    Answer, Counters, Instance, SLACK, Store, Timing, assert_replays, every_charge, paid, pay,
    pay_within, payment, until,
};
use support::{RedisServer, client, eventually, example_path};
use tokio::task::JoinHandle;
use tower_redis_lock::idempotency::{IdempotencyRecords, KeyRecord};
use tower_redis_lock::{Lock, LockClient};

/// The watchdog lease of every instance here: short, so a pause outlasts it soon.
const LEASE: [&str; 2] = ["--watchdog-lease-ms", "1000"];
/// How long a handler waits where a test pauses it: long beside the time a test takes to
/// see where the handler stands (a poll of Redis every 20 ms), on a busy machine too.
const WAIT_AT_PAUSE_MS: u64 = 3_000;

/// Three instances of the payments route, with `extra` arguments, on `server`.
fn three_instances(server: &RedisServer, extra: &[&str]) -> [Instance; 3] {
    let args: Vec<&str> = LEASE.iter().chain(extra).copied().collect();
    ["a", "b", "c"].map(|name| Instance::start(server, name, &args))
}

/// Pauses `instance` until the lease of `lock` ran out.
async fn pause_past_lease(instance: &Instance, lock: &Lock) {
    instance.signal("-STOP");
    until(SLACK, "the paused instance's lease runs out", || async {
        !lock.is_locked().await.unwrap()
    })
    .await;
}

/// Sends a payment of `key` to `instance` and pauses it past its lease where its handler
/// waits: before its charge (a run counted), or after it when `charged`. The paused call.
async fn pay_then_pause(
    instance: &Instance,
    records: &IdempotencyRecords,
    counters: &Counters<'_>,
    key: &'static str,
    body: &str,
    charged: bool,
) -> JoinHandle<Result<Answer, String>> {
    let timing = match charged {
        true => Timing {
            work_ms: 0,
            after_charge_ms: WAIT_AT_PAUSE_MS,
        },
        false => Timing::work(WAIT_AT_PAUSE_MS),
    };
    let (url, body) = (instance.url.clone(), body.to_owned());
    let late = tokio::spawn(async move { pay(&url, "acme", key, &body, timing).await });
    if charged {
        counters.until_charged("acme", key).await;
    } else {
        counters.until_runs("acme", key, 1).await;
    }
    let lock = records.lock(&["acme".to_owned()], key).unwrap();
    pause_past_lease(instance, &lock).await;
    late
}

/// Sends `key` to each instance once more: every copy must be `expected`, replayed.
async fn assert_every_copy_replays(
    instances: &[&Instance],
    key: &str,
    body: &str,
    expected: &Answer,
) {
    let mut copies = Vec::new();
    for instance in instances {
        copies.push(paid(&instance.url, "acme", key, body, Timing::default()).await);
    }
    assert_replays(expected, &copies);
}

/// A client gives up once `key` was charged at `instances[0]`, and retries there at once:
/// the first run goes on without its client, and the retry gets its answer.
async fn give_up_after_the_charge_then_retry(
    instances: &[Instance],
    counters: &Counters<'_>,
    key: &str,
) {
    let body = payment(1500);
    let slow = Timing {
        work_ms: 0,
        after_charge_ms: WAIT_AT_PAUSE_MS,
    };
    // The client gives up (its timeout, a deadline, a cancel): hyper drops the response
    // future and closes the connection.
    let url = instances[0].url.clone();
    let gave_up = tokio::spawn({
        let body = body.clone();
        let key = key.to_owned();
        async move { pay_within(&url, "acme", &key, &body, slow, SLACK * 3).await }
    });
    counters.until_charged("acme", key).await;
    gave_up.abort();
    assert!(gave_up.await.unwrap_err().is_cancelled());

    // It waits for the first run, and gets its answer.
    let retry = paid(&instances[0].url, "acme", key, &body, Timing::default()).await;
    assert_eq!(
        (retry.status, retry.replayed),
        (201, true),
        "{key}: {retry:?}"
    );
    assert_eq!(retry.json()["execution"], 1, "{key}: {retry:?}");
    assert_eq!(counters.charges("acme", key), 1, "{key}: charged twice");
    assert_eq!(counters.runs("acme", key), 1, "{key}");
    assert_every_copy_replays(&instances.iter().collect::<Vec<_>>(), key, &body, &retry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_after_the_charge_cancels_nothing_and_its_retry_gets_the_answer() {
    let server = RedisServer::start();
    let committing = three_instances(&server, &[]);
    let plain = three_instances(&server, &["--payments-commit", "no"]);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters::on(&server, &records);
    give_up_after_the_charge_then_retry(&committing, &counters, "k-gone").await;
    give_up_after_the_charge_then_retry(&plain, &counters, "k-gone-plain").await;
}

/// The first instance of `instances` pauses past its lease before its charge of `key`, and
/// the client retries at the second.
async fn pause_before_the_charge(
    instances: [Instance; 3],
    records: &IdempotencyRecords,
    counters: &Counters<'_>,
    key: &'static str,
) {
    let [a, b, c] = instances;
    let scope = ["acme".to_owned()];
    let lock = records.lock(&scope, key).unwrap();
    let body = payment(500);

    let url = a.url.clone();
    let late = tokio::spawn({
        let body = body.clone();
        async move { pay(&url, "acme", key, &body, Timing::work(WAIT_AT_PAUSE_MS)).await }
    });
    counters.until_runs("acme", key, 1).await;
    pause_past_lease(&a, &lock).await;

    // The retry at another instance finds an attempt that ended without an outcome, and
    // the handler commits its charge: it runs, and charges in the paused one's place.
    let retry = paid(&b.url, "acme", key, &body, Timing::default()).await;
    assert_eq!((retry.status, retry.replayed), (201, false), "{retry:?}");
    assert_eq!(retry.json()["execution"], 2);
    assert_eq!(retry.json()["instance"], "b");
    assert_eq!(counters.charges("acme", key), 1);

    // The paused instance resumes: its charge is refused (its lock is gone) and so is its
    // answer's store; it tells its client it charged nothing.
    a.signal("-CONT");
    let late = late.await.unwrap().expect("the paused instance answers");
    assert_eq!(late.status, 503, "{late:?}");
    assert_eq!(counters.charges("acme", key), 1, "charged twice");
    let stored = records.get(&scope, key).await.unwrap();
    assert_eq!(stored.expect("stored").body(), Some(&retry.body));
    assert_every_copy_replays(&[&a, &b, &c], key, &body, &retry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_paused_past_its_lease_before_its_charge_charges_nothing_when_it_resumes() {
    let server = RedisServer::start();
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters::on(&server, &records);
    let instances = three_instances(&server, &[]);
    pause_before_the_charge(instances, &records, &counters, "k-before").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_too_an_instance_paused_before_its_charge_charges_nothing() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let locks = LockClient::builder_cluster(cluster.urls())
        .build()
        .await
        .expect("a cluster client");
    let records = IdempotencyRecords::new(locks, "");
    let counters = Counters {
        store: Store::Cluster(&cluster),
        records: &records,
        ledger: None,
    };
    let args: Vec<&str> = LEASE.to_vec();
    let instances = ["a", "b", "c"].map(|name| Instance::start_on_cluster(&cluster, name, &args));
    pause_before_the_charge(instances, &records, &counters, "k-cluster").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_paused_past_its_lease_after_its_charge_has_its_retry_answered_from_it() {
    let server = RedisServer::start();
    let [a, b, c] = three_instances(&server, &[]);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters::on(&server, &records);
    let scope = ["acme".to_owned()];
    let lock = records.lock(&scope, "k-after").unwrap();
    let body = payment(800);
    let slow = Timing {
        work_ms: 0,
        after_charge_ms: WAIT_AT_PAUSE_MS,
    };

    let url = a.url.clone();
    let late = tokio::spawn({
        let body = body.clone();
        async move { pay(&url, "acme", "k-after", &body, slow).await }
    });
    counters.until_charged("acme", "k-after").await;
    pause_past_lease(&a, &lock).await;
    let record = records.record(&scope, "k-after").await.unwrap();
    let Some(KeyRecord::Started {
        committed: Some(committed),
        ..
    }) = record
    else {
        panic!("no committed outcome without a response: {record:?}");
    };

    // The retry at another instance finds the charge committed and no response: it is
    // answered from what the paused one committed, and charges nothing.
    let retry = paid(&b.url, "acme", "k-after", &body, Timing::default()).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert_eq!(retry.body, committed, "not the committed payment");
    assert_eq!(retry.json()["instance"], "a");
    assert_eq!(
        counters.runs("acme", "k-after"),
        1,
        "the handler charged again"
    );
    assert_eq!(counters.charges("acme", "k-after"), 1, "charged twice");

    // The paused instance resumes: its store is refused, and its client gets the payment it
    // made, the same one.
    a.signal("-CONT");
    let late = late.await.unwrap().expect("the paused instance answers");
    assert_eq!((late.status, &late.body), (201, &retry.body), "{late:?}");
    assert_eq!(counters.charges("acme", "k-after"), 1, "charged twice");
    assert_every_copy_replays(&[&a, &b, &c], "k-after", &body, &retry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_key_in_the_sql_transaction_a_paused_attempt_is_charged_once_either_way() {
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("ledger-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("payments.sqlite");
    let sql = ["--payments-sql", path.to_str().unwrap()];
    let [a, b, c] = three_instances(&server, &sql);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters {
        ledger: Some(path.clone()),
        ..Counters::on(&server, &records)
    };
    let body = payment(1100);

    // Paused before the charge (a run counted) and after it (the ledger's row written).
    for (key, charged) in [("k-sql-before", false), ("k-sql-after", true)] {
        let late = pay_then_pause(&a, &records, &counters, key, &body, charged).await;

        // The retry runs again (the handler keeps its charge to once): it charges in the
        // paused one's place, or finds its charge and answers from it.
        let retry = paid(&b.url, "acme", key, &body, Timing::default()).await;
        assert_eq!(
            (retry.status, retry.replayed),
            (201, false),
            "{key}: {retry:?}"
        );
        let charger = if charged { "a" } else { "b" };
        assert_eq!(retry.json()["instance"], charger, "{key}: {retry:?}");
        assert_eq!(counters.charges("acme", key), 1, "{key}");

        // The paused one resumes: it loses its lease, charges nothing more.
        a.signal("-CONT");
        let late = late.await.unwrap().expect("the paused instance answers");
        assert_eq!(late.status, 503, "{key}: a lost lease: {late:?}");
        assert_eq!(counters.charges("acme", key), 1, "{key}: charged twice");
        assert_every_copy_replays(&[&a, &b, &c], key, &body, &retry).await;
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_commit_the_retry_of_a_paused_attempt_gets_the_at_most_once_answer() {
    let server = RedisServer::start();
    let [a, b, c] = three_instances(&server, &["--payments-commit", "no"]);
    let records = IdempotencyRecords::new(client(&server).await, "");
    let counters = Counters::on(&server, &records);
    let body = payment(900);

    // Paused before the charge (a run counted) and after it (the charge counted).
    for (key, charged) in [("k-plain-before", false), ("k-plain-after", true)] {
        let late = pay_then_pause(&a, &records, &counters, key, &body, charged).await;

        // Whether the paused attempt charged is unknown: its retry, at any instance, is
        // answered 500 and does not run.
        for instance in [&b, &c] {
            let retry = paid(&instance.url, "acme", key, &body, Timing::default()).await;
            assert_eq!(retry.status, 500, "{key}: {retry:?}");
            let text = String::from_utf8_lossy(&retry.body);
            assert!(text.contains("will not run again"), "{key}: {text}");
        }
        assert_eq!(counters.runs("acme", key), 1, "{key}: the retry ran");

        a.signal("-CONT");
        let late = late.await.unwrap().expect("the paused instance answers");
        assert_eq!(late.status, 503, "{key}: a lost lease: {late:?}");
        // Before its charge, the resumed handler is cancelled when it hears its lease was
        // lost, or charges first: at most once.
        let charges = counters.charges("acme", key);
        assert!(
            charges == 1 || (!charged && charges == 0),
            "{key}: {charges} charges"
        );
        let again = paid(&b.url, "acme", key, &body, Timing::default()).await;
        assert_eq!(again.status, 500, "{key}: {again:?}");
        assert_eq!(
            counters.charges("acme", key),
            charges,
            "{key}: charged again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_crashes_mid_load_and_restarts_from_its_append_only_file_charges_no_key_twice()
{
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut server = RedisServer::start_with(&aof);
    let instances = ["a", "b", "c"].map(|name| Instance::start(&server, name, &[]));
    let targets: Vec<&str> = instances.iter().map(|i| i.url.as_str()).collect();
    let load = Command::new(example_path("idemgen"))
        .args(["--redis", &server.url(), "--targets", &targets.join(",")])
        .args(["--keys", "600", "--copies", "3", "--run", "aof"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("idemgen runs");
    assert!(
        eventually(SLACK, || every_charge(&server).len() >= 50).await,
        "the load did not start"
    );
    server.crash_and_restart(&aof);
    let restarted_at = every_charge(&server).len();

    let output = tokio::task::spawn_blocking(move || load.wait_with_output())
        .await
        .unwrap()
        .expect("idemgen ends");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no summary: {stdout}"));
    eprintln!("{restarted_at} keys charged when Redis restarted; {summary}");
    // Copies sent while Redis was down may have failed (503 five times), and a copy that
    // took over from one whose answer was not stored says it ran: none charged twice.
    let told = String::from_utf8_lossy(&output.stderr);
    assert_eq!(summary["executed_more"], 0, "{summary}\n{told}");
    assert!(summary["executed_once"].as_u64().unwrap() > 50, "{summary}");
    let charges = every_charge(&server);
    assert!(
        charges.iter().all(|charges| *charges == 1),
        "a key charged twice"
    );
    assert!(charges.len() >= restarted_at, "charges lost in the restart");
}

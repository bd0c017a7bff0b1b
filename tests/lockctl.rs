//! `lockctl` as separate processes against a real redis-server.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use support::tls::TestPki;
use support::{ChildGuard, RedisServer};
use tower::Layer;
use tower_redis_lock::inspect::{LIST_MAX_SCANS, LIST_SCAN_COUNT};
use tower_redis_lock::{ErrorKind, HeaderKey, IdempotencyLayer, LockClient, LostReason};

fn lockctl(server: &RedisServer, args: &[&str]) -> Child {
    Command::new(support::lockctl_path())
        .arg("--url")
        .arg(server.url())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("lockctl starts")
}

fn next_event(stdout: &mut BufReader<ChildStdout>) -> Value {
    let mut line = String::new();
    stdout.read_line(&mut line).expect("lockctl output");
    serde_json::from_str(&line).unwrap_or_else(|err| panic!("bad JSON line {line:?}: {err}"))
}

/// Runs lockctl to the end; its exit code and its last event.
fn run(server: &RedisServer, args: &[&str]) -> (i32, Value) {
    support::lockctl_outcome(lockctl(server, args))
}

#[test]
fn a_second_holder_acquires_only_after_the_first_released_with_a_larger_token() {
    let server = RedisServer::start();
    let mut first = lockctl(&server, &["hold", "shared", "--for", "1500ms"]);
    let mut first_out = BufReader::new(first.stdout.take().unwrap());
    let acquired = next_event(&mut first_out);
    assert_eq!(acquired["event"], "acquired");

    let (code, inspected) = run(&server, &["inspect", "shared", "--json"]);
    assert_eq!(code, 0);
    assert_eq!(inspected["hold_count"], 1);
    assert_eq!(inspected["holders"][0]["owner"], acquired["owner"]);
    assert!(inspected["pttl_ms"].as_u64().unwrap() > 0);

    let (code, timed_out) = run(
        &server,
        &["hold", "shared", "--for", "1s", "--wait", "200ms"],
    );
    assert_eq!((code, timed_out["event"].as_str()), (3, Some("timeout")));

    let mut second = lockctl(
        &server,
        &["hold", "shared", "--for", "100ms", "--wait", "20s"],
    );
    let mut second_out = BufReader::new(second.stdout.take().unwrap());
    let released = next_event(&mut first_out);
    assert_eq!(released["event"], "released");
    assert!(first.wait().unwrap().success());

    // The second line is read only after the first process has released and exited.
    let taken = next_event(&mut second_out);
    assert_eq!(taken["event"], "acquired");
    assert!(taken["token"].as_u64() > acquired["token"].as_u64());
    assert!(taken["waited_ms"].as_u64().unwrap() > 0);
    assert_eq!(next_event(&mut second_out)["event"], "released");
    assert!(second.wait().unwrap().success());
}

#[test]
fn a_lost_lease_exits_4_and_force_unlock_frees_the_lock() {
    let server = RedisServer::start();
    let (code, lost) = run(
        &server,
        &["hold", "short", "--for", "10s", "--lease", "300ms"],
    );
    assert_eq!((code, lost["event"].as_str()), (4, Some("lost")), "{lost}");
    assert_eq!(lost["reason"], "Expired");

    let mut holder = lockctl(&server, &["hold", "stuck", "--for", "30s"]);
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    assert_eq!(next_event(&mut out)["event"], "acquired");
    let (code, unlocked) = run(&server, &["force-unlock", "stuck", "--yes", "--json"]);
    assert_eq!((code, unlocked["removed"].as_bool()), (0, Some(true)));
    // The holder learns at its next renewal (10 s with the default 30 s lease) that the lock
    // is gone; it is stopped here rather than waited for.
    let (_, inspected) = run(&server, &["inspect", "stuck", "--json"]);
    assert_eq!(inspected["locked"], false);
    holder.kill().unwrap();
    holder.wait().unwrap();
}

/// A reader that closes the pipe early (`lockctl list | head`, `lockctl --help | grep -q`):
/// no command panics, `hold` still releases its lock rather than leaving it to its lease, and
/// an endless `watch` stops. Before, the first line printed to the closed pipe panicked.
#[tokio::test]
async fn a_reader_that_closes_the_pipe_early_ends_no_command_badly() {
    let server = RedisServer::start();
    let commands: [&[&str]; 3] = [
        &["--help"],
        &["hold", "piped", "--for", "200ms"],
        &["watch", "--interval", "50ms"],
    ];
    for args in commands {
        let mut child = tokio::process::Command::new(support::lockctl_path())
            .arg("--url")
            .arg(server.url())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("lockctl starts");
        drop(child.stdout.take());
        // Generous: each command ends within a second on its own; a watch that did not
        // notice its reader had gone would run until the bound.
        let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("lockctl {args:?} still runs with nobody reading"))
            .expect("lockctl runs");
        let errors = String::from_utf8_lossy(&output.stderr);
        assert!(!errors.contains("panicked"), "{args:?}: {errors}");
        assert_eq!(output.status.code(), Some(0), "{args:?}: {errors}");
    }
    let (code, inspected) = run(&server, &["inspect", "piped", "--json"]);
    assert_eq!((code, &inspected["locked"]), (0, &json!(false)));
}

/// Runs lockctl with its own `--url` arguments (for several servers); exit code and last event.
fn run_with_urls(urls: &[String], args: &[&str]) -> (i32, Value) {
    let mut command = Command::new(support::lockctl_path());
    for url in urls {
        command.arg("--url").arg(url);
    }
    let output = command.args(args).output().expect("lockctl runs");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    let last = stdout.lines().last().unwrap_or("{}");
    let event = serde_json::from_str(last).unwrap_or_else(|err| panic!("bad JSON {last:?}: {err}"));
    (output.status.code().expect("exit code"), event)
}

#[test]
fn readers_share_a_lock_a_writer_waits_for_them_and_fair_waits_in_line() {
    let server = RedisServer::start();
    let mut reader = lockctl(
        &server,
        &["hold", "report", "--kind", "read", "--for", "1500ms"],
    );
    let mut reader_out = BufReader::new(reader.stdout.take().unwrap());
    let first = next_event(&mut reader_out);
    assert_eq!(
        (first["event"].as_str(), first["kind"].as_str()),
        (Some("acquired"), Some("Read"))
    );

    // Another reader gets in while the first holds; a writer does not.
    let (code, second) = run(
        &server,
        &[
            "hold", "report", "--kind", "read", "--for", "10ms", "--wait", "1s",
        ],
    );
    assert_eq!(
        (code, second["event"].as_str()),
        (0, Some("released")),
        "{second}"
    );
    let (code, writer) = run(
        &server,
        &[
            "hold", "report", "--kind", "write", "--for", "10ms", "--wait", "200ms",
        ],
    );
    assert_eq!(
        (code, writer["event"].as_str()),
        (3, Some("timeout")),
        "{writer}"
    );
    assert!(reader.wait().unwrap().success());

    let (code, fair) = run(
        &server,
        &["hold", "report", "--kind", "fair", "--for", "10ms"],
    );
    assert_eq!(
        (code, fair["event"].as_str()),
        (0, Some("released")),
        "{fair}"
    );
    let (code, bad) = run_with_urls(
        &[server.url()],
        &["hold", "report", "--kind", "sideways", "--for", "1s"],
    );
    assert_eq!(code, 2, "{bad}");
}

#[test]
fn a_redlock_over_three_servers_holds_with_one_down_and_fails_typed_with_two() {
    let mut servers = [
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    ];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let mut holder = Command::new(support::lockctl_path())
        .args(urls.iter().flat_map(|url| ["--url", url.as_str()]))
        .args(["hold", "ledger", "--kind", "redlock", "--for", "1500ms"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("lockctl starts");
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let acquired = next_event(&mut out);
    assert_eq!(acquired["event"], "acquired", "{acquired}");
    assert_eq!(
        (acquired["held_on"].as_u64(), acquired["servers"].as_u64()),
        (Some(3), Some(3))
    );

    // Excluded while held.
    let (code, other) = run_with_urls(
        &urls,
        &[
            "hold", "ledger", "--kind", "redlock", "--for", "10ms", "--wait", "300ms",
        ],
    );
    assert_eq!(
        (code, other["event"].as_str()),
        (3, Some("timeout")),
        "{other}"
    );
    assert_eq!(next_event(&mut out)["event"], "released");
    assert!(holder.wait().unwrap().success());

    servers[0].kill();
    let (code, quorum) = run_with_urls(
        &urls,
        &["hold", "ledger", "--kind", "redlock", "--for", "10ms"],
    );
    assert_eq!(
        (code, quorum["event"].as_str()),
        (0, Some("released")),
        "{quorum}"
    );
    servers[1].kill();
    let (code, failed) = run_with_urls(
        &urls,
        &["hold", "ledger", "--kind", "redlock", "--for", "10ms"],
    );
    assert_eq!(
        (code, failed["kind"].as_str()),
        (1, Some("QuorumUnreachable")),
        "{failed}"
    );

    let (code, _) = run_with_urls(&urls, &["hold", "ledger", "--for", "10ms"]);
    assert_eq!(code, 2, "several --url need --kind redlock");
}

#[test]
fn an_operator_waives_the_quarantine_of_a_new_server() {
    let server = RedisServer::start();
    // A new server without the epoch the harness provisions: its first lock would wait.
    let _: i64 = server.cmd(&["DEL", "lock:epoch"]);
    let (code, waived) = run(&server, &["waive-quarantine"]);
    assert_eq!(code, 0);
    assert_eq!(waived["event"], "quarantine-waived");
    assert_eq!(waived["waived"], true);
    let (code, released) = run(&server, &["hold", "first", "--for", "10ms", "--wait", "1s"]);
    assert_eq!((code, released["event"].as_str()), (0, Some("released")));
    let (code, again) = run(&server, &["waive-quarantine"]);
    assert_eq!((code, again["waived"].as_bool()), (0, Some(false)));
}

#[tokio::test]
async fn idempotent_shows_what_the_idempotency_layer_stored_for_a_key() {
    let server = RedisServer::start();
    let locks = support::client(&server).await;
    let layer = IdempotencyLayer::new(locks.clone()).scope(HeaderKey::new("x-tenant-id"));
    let service = layer.layer(tower::service_fn(
        |_: http::Request<UnsyncBoxBody<Bytes, std::convert::Infallible>>| async {
            let mut response =
                http::Response::new(Full::new(Bytes::from_static(b"order 7")).boxed_unsync());
            *response.status_mut() = http::StatusCode::CREATED;
            response
                .headers_mut()
                .insert("location", http::HeaderValue::from_static("/orders/7"));
            Ok::<_, std::convert::Infallible>(response)
        },
    ));
    let request = http::Request::post("/orders")
        .header("x-tenant-id", "acme")
        .header("idempotency-key", "8e03978e")
        .body(Full::new(Bytes::from_static(b"{}")).boxed_unsync())
        .unwrap();
    let answer = tower::ServiceExt::oneshot(service, request).await.unwrap();
    assert_eq!(answer.status(), http::StatusCode::CREATED);

    let (code, stdout, _) = ctl(
        &server,
        &["idempotent", "8e03978e", "--scope", "acme", "--json"],
    )
    .await;
    assert_eq!(code, 0, "{stdout}");
    let shown = &json_lines(&stdout)[0];
    assert_eq!(shown["stored"], true);
    assert_eq!(shown["status"], 201);
    assert_eq!(shown["body_bytes"], 7);
    assert_eq!(shown["headers"][0], "location: /orders/7");
    assert_eq!(shown["fingerprint"].as_str().map(str::len), Some(64));
    assert!(shown["ttl_ms"].as_u64().unwrap() > 23 * 3600 * 1000);
    let (code, stdout, _) = ctl(&server, &["idempotent", "8e03978e", "--scope", "acme"]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.starts_with("8e03978e: status 201 stored"),
        "{stdout}"
    );
    // Another tenant's key of that name has nothing stored.
    let (code, stdout, _) = ctl(&server, &["idempotent", "8e03978e", "--scope", "globex"]).await;
    assert_eq!(code, 1);
    assert!(stdout.contains("nothing stored"), "{stdout}");
}

/// Runs lockctl against `server` to the end, stdin closed (no terminal): its exit code,
/// stdout and stderr.
async fn ctl(server: &RedisServer, args: &[&str]) -> (i32, String, String) {
    ctl_at(&server.url(), args).await
}

/// [`ctl`] with the URL `url` (credentials, TLS).
async fn ctl_at(url: &str, args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(support::lockctl_path())
        .arg("--url")
        .arg(url)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("lockctl runs");
    (
        output.status.code().expect("exit code"),
        String::from_utf8(output.stdout).expect("UTF-8 output"),
        String::from_utf8(output.stderr).expect("UTF-8 errors"),
    )
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|err| panic!("bad JSON line {line:?}: {err}"))
        })
        .collect()
}

/// The JSON object of the lock `name` among `lines`.
fn lock_named<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|line| line["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not among {lines:#?}"))
}

/// The cells of the table row of the lock `name`.
fn row<'a>(table: &'a str, name: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name))
        .unwrap_or_else(|| panic!("no row for {name} in\n{table}"))
}

/// A client whose instance is called `name`.
async fn named(server: &RedisServer, name: &str) -> LockClient {
    LockClient::builder(&server.url())
        .instance_name(name)
        .build()
        .await
        .expect("a named client")
}

/// Waits until `owners` instances are queued in Redis for `name` (server-side state: no
/// signal to wait on).
async fn await_queued(server: &RedisServer, name: &str, owners: usize) {
    let queued = support::eventually(WAIT_BOUND, || support::queued(server, name).len() == owners);
    assert!(queued.await, "{owners} waiters never queued for {name}");
}

/// Generous bound for what takes milliseconds (shared, busy machines).
const WAIT_BOUND: Duration = Duration::from_secs(10);

/// A waiter whose process died: the place `owner` at the back of `name`'s queue, its
/// liveness run out `ago_ms` before the server's clock.
fn queue_dead_waiter(server: &RedisServer, name: &str, owner: &str, ago_ms: u64) {
    let (secs, micros): (u64, u64) = server.cmd(&["TIME"]);
    let now_us = secs * 1_000_000 + micros;
    let alive_until = now_us / 1000 - ago_ms;
    let _: i64 = server.cmd(&[
        "ZADD",
        &format!("lock:{{{name}}}:queue"),
        &now_us.to_string(),
        owner,
    ]);
    let _: i64 = server.cmd(&[
        "HSET",
        &format!("lock:{{{name}}}:waiters"),
        owner,
        &format!("{alive_until} 3000 17"),
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_show_holders_by_instance_and_the_queue_in_order() {
    let server = RedisServer::start();
    let orders = named(&server, "orders-7f9c").await;
    let billing = named(&server, "billing-1").await;
    let unnamed = support::client(&server).await;
    let held = orders.lock("invoice-42").unwrap().acquire().await.unwrap();
    // Two instances queue behind the holder, billing first; then one whose process died.
    let lock = billing.lock("invoice-42").unwrap();
    let first = tokio::spawn(async move { lock.acquire().await.map(drop) });
    await_queued(&server, "invoice-42", 1).await;
    let lock = unnamed.lock("invoice-42").unwrap();
    let second = tokio::spawn(async move { lock.acquire().await.map(drop) });
    await_queued(&server, "invoice-42", 2).await;
    let ghost = "ghost-3.0123456789abcdef0123456789abcdef:1";
    queue_dead_waiter(&server, "invoice-42", ghost, 5_000);
    // A read-write lock: read by orders, a writer waits.
    let reading = orders
        .read_write_lock("report-7")
        .unwrap()
        .read()
        .acquire()
        .await
        .unwrap();
    let lock = unnamed.read_write_lock("report-7").unwrap().write();
    let writer = tokio::spawn(async move { lock.acquire().await.map(drop) });
    await_queued(&server, "report-7", 1).await;
    let unnamed_instance = &unnamed.instance_id()[..8];

    let (code, table, errors) = ctl(&server, &["list"]).await;
    assert_eq!(code, 0, "{errors}");
    assert!(table.starts_with("NAME "), "{table}");
    let invoice = row(&table, "invoice-42");
    assert_eq!(invoice[..3], ["invoice-42", "exclusive", "orders-7f9c(1)"]);
    // Taken free, its tokens came from the server clock: no counter to show.
    assert_eq!(invoice[4], "-", "{table}");
    assert_eq!(invoice[5..], ["3", "(1", "dead)"], "{table}");
    let report = row(&table, "report-7");
    assert_eq!(
        [report[1], report[2], report[5]],
        ["read-write:read", "orders-7f9c(1)", "1"]
    );
    // A read-write lock reserves its tokens through the counter: its top is shown.
    let token: u64 = report[4].parse().expect("a token");
    assert!(token >= reading.fencing_token(), "{table}");

    let (code, out, errors) = ctl(&server, &["list", "--json"]).await;
    assert_eq!(code, 0, "{errors}");
    let lines = json_lines(&out);
    let page = lines.last().expect("the page line");
    assert_eq!(
        (&page["event"], &page["locks"], &page["next_cursor"]),
        (&json!("page"), &json!(2), &Value::Null),
        "{out}"
    );
    let invoice = lock_named(&lines, "invoice-42");
    assert_eq!(
        (&invoice["kind"], &invoice["locked"]),
        (&json!("exclusive"), &json!(true))
    );
    let holder = &invoice["holders"][0];
    assert_eq!(holder["owner"], held.owner_id());
    assert_eq!(
        (&holder["instance"], &holder["count"]),
        (&json!("orders-7f9c"), &json!(1))
    );
    let lease = invoice["pttl_ms"].as_u64().expect("a lease");
    assert!(lease > 0 && lease <= 30_000, "{invoice}");
    assert_eq!(invoice["fence"], Value::Null, "{invoice}");
    assert_eq!(invoice["queued"], 3);
    let waiters = invoice["waiters"].as_array().expect("waiters");
    let instances: Vec<&Value> = waiters.iter().map(|waiter| &waiter["instance"]).collect();
    assert_eq!(
        instances,
        [
            &json!("billing-1"),
            &json!(unnamed_instance),
            &json!("ghost-3")
        ]
    );
    let alive: Vec<&Value> = waiters.iter().map(|waiter| &waiter["alive"]).collect();
    assert_eq!(alive, [&json!(true), &json!(true), &json!(false)]);
    assert!(waiters[0]["alive_left_ms"].as_u64() > Some(0), "{invoice}");
    assert!(
        waiters[2]["dead_for_ms"].as_u64() >= Some(5_000),
        "{invoice}"
    );
    let report = lock_named(&lines, "report-7");
    assert_eq!(
        (&report["kind"], &report["mode"]),
        (&json!("read-write"), &json!("read"))
    );
    assert_eq!(report["holders"][0]["instance"], "orders-7f9c");
    assert_eq!(report["waiters"][0]["wants"], "write");

    let (code, text, errors) = ctl(&server, &["inspect", "invoice-42"]).await;
    assert_eq!(code, 0, "{errors}");
    assert!(text.contains(held.owner_id()), "{text}");
    assert!(text.contains("orders-7f9c"), "{text}");
    assert!(
        text.lines().any(|line| line == "WAITERS  3 (1 dead)"),
        "{text}"
    );
    let queue: Vec<Vec<&str>> = text
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|cells| {
            cells
                .first()
                .is_some_and(|cell| cell.parse::<u32>().is_ok())
        })
        .collect();
    let order: Vec<(&str, &str)> = queue.iter().map(|cells| (cells[0], cells[1])).collect();
    assert_eq!(
        order,
        [
            ("1", "billing-1"),
            ("2", unnamed_instance),
            ("3", "ghost-3")
        ]
    );
    assert_eq!(queue[0][4], "alive,", "{text}");
    assert_eq!(queue[2][4], "dead", "{text}");

    let (code, out, errors) = ctl(&server, &["inspect", "invoice-42", "--json"]).await;
    assert_eq!(code, 0, "{errors}");
    let inspected = &json_lines(&out)[0];
    assert_eq!(
        (
            &inspected["event"],
            &inspected["key"],
            &inspected["hold_count"]
        ),
        (&json!("inspect"), &json!("lock:{invoice-42}"), &json!(1))
    );
    assert_eq!(inspected["waiters"][2]["owner"], ghost);
    assert_eq!(inspected["waiters"][2]["position"], 3);

    // The queue goes on as shown: billing gets the lock first.
    held.release().await.unwrap();
    tokio::time::timeout(WAIT_BOUND, first)
        .await
        .expect("billing was granted the lock")
        .unwrap()
        .unwrap();
    reading.release().await.unwrap();
    tokio::time::timeout(WAIT_BOUND, writer)
        .await
        .expect("the writer was granted the lock")
        .unwrap()
        .unwrap();
    tokio::time::timeout(WAIT_BOUND, second)
        .await
        .expect("the unnamed instance was granted the lock")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_each_refresh_as_plain_lines_without_a_terminal() {
    let server = RedisServer::start();
    let orders = named(&server, "orders-7f9c").await;
    let _held = orders.lock("invoice-42").unwrap().acquire().await.unwrap();
    let (code, out, errors) = ctl(&server, &["watch", "--count", "2", "--interval", "100ms"]).await;
    assert_eq!(code, 0, "{errors}");
    assert!(
        !out.contains('\x1b'),
        "no terminal, no screen clearing: {out:?}"
    );
    assert_eq!(out.lines().count(), 4, "{out}");
    for refresh in ["refresh=1 ", "refresh=2 "] {
        let lines: Vec<&str> = out
            .lines()
            .filter(|line| line.starts_with(refresh))
            .collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].ends_with(" locks=1 more=false"), "{out}");
        for field in [
            " name=invoice-42 ",
            " holders=orders-7f9c(1) ",
            " waiters=0 ",
        ] {
            assert!(lines[1].contains(field), "{field} missing: {out}");
        }
    }
    let (code, out, errors) = ctl(&server, &["watch", "inv*", "--count", "1", "--json"]).await;
    assert_eq!(code, 0, "{errors}");
    let lines = json_lines(&out);
    assert_eq!(
        (&lines[0]["event"], &lines[0]["locks"]),
        (&json!("refresh"), &json!(1))
    );
    assert_eq!(lines[1]["holders"][0]["instance"], "orders-7f9c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_needs_yes_without_a_terminal_and_then_frees_the_lock() {
    let server = RedisServer::start();
    // A short lease: the holder's next renewal (every 300 ms) finds its lock gone.
    let orders = LockClient::builder(&server.url())
        .instance_name("orders-7f9c")
        .watchdog_lease(Duration::from_millis(900))
        .build()
        .await
        .unwrap();
    let held = orders.lock("invoice-42").unwrap().acquire().await.unwrap();
    let lost = held.lost_signal();

    let (code, out, errors) = ctl(&server, &["force-unlock", "invoice-42"]).await;
    assert_eq!(code, 2, "{out}{errors}");
    assert!(errors.contains("--yes"), "{errors}");
    let still = orders.inspect("invoice-42").await.unwrap();
    assert_eq!(still.holders.len(), 1, "refused, yet the lock is gone");
    assert!(!lost.is_lost());

    let (code, out, errors) = ctl(&server, &["force-unlock", "invoice-42", "--yes"]).await;
    assert_eq!(code, 0, "{errors}");
    assert!(out.starts_with("force-unlocked invoice-42"), "{out}");
    assert!(
        orders
            .inspect("invoice-42")
            .await
            .unwrap()
            .holders
            .is_empty()
    );
    let reason = tokio::time::timeout(WAIT_BOUND, lost.lost())
        .await
        .expect("the holder was told");
    assert_eq!(reason, LostReason::Taken);

    let (code, out, _) = ctl(&server, &["force-unlock", "invoice-42", "--yes", "--json"]).await;
    assert_eq!(code, 0);
    assert_eq!(json_lines(&out)[0]["removed"], false);
}

/// Every lock `lockctl list ARGS` finds, page after page, and the SCAN calls of each page
/// (counted by the server, and checked against what the page says).
async fn list_all(server: &RedisServer, args: &[&str]) -> (Vec<String>, Vec<u64>) {
    let (mut names, mut scans) = (Vec::new(), Vec::new());
    let mut cursor: Option<String> = None;
    loop {
        assert!(scans.len() < 50, "the listing never ends: {scans:?}");
        let mut page_args = vec!["list", "--json"];
        page_args.extend_from_slice(args);
        if let Some(cursor) = &cursor {
            page_args.extend(["--cursor", cursor.as_str()]);
        }
        let before = support::command_calls(server, "scan");
        let (code, out, errors) = ctl(server, &page_args).await;
        assert_eq!(code, 0, "{errors}");
        let made = support::command_calls(server, "scan") - before;
        let lines = json_lines(&out);
        let (page, locks) = lines.split_last().expect("the page line");
        assert_eq!(page["scans"], made, "{out}");
        names.extend(
            locks
                .iter()
                .map(|lock| lock["name"].as_str().unwrap().to_owned()),
        );
        scans.push(made);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return (names, scans),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_through_100000_other_keys_with_bounded_scans() {
    let server = RedisServer::start();
    let locks = support::client(&server).await;
    let wanted: Vec<String> = (0..5).map(|n| format!("tenant-{n}")).collect();
    let mut guards = Vec::new();
    for name in &wanted {
        guards.push(locks.lock(name).unwrap().acquire().await.unwrap());
    }
    // Few keys: one SCAN reply holds every lock, and pages of 2 go on inside it.
    let (mut names, scans) = list_all(&server, &["--limit", "2"]).await;
    names.sort();
    assert_eq!(names, wanted, "each lock listed once");
    assert_eq!(scans.len(), 3, "{scans:?}");

    let _: () = server.cmd(&[
        "EVAL",
        "for i = 1, 100000 do redis.call('set', 'other:' .. i, 'x') end",
        "0",
    ]);
    // A key shaped like a lock's hash that is not a hash is no lock.
    let _: () = server.cmd(&["SET", "lock:{imposter}", "x"]);

    let (mut names, scans) = list_all(&server, &["--limit", "2"]).await;
    let pages = scans.len();
    names.sort();
    assert_eq!(names, wanted, "each lock listed once");
    assert!(pages >= 3, "5 locks at 2 a page: {scans:?}");
    assert!(
        scans.iter().all(|&made| made <= u64::from(LIST_MAX_SCANS)),
        "a page made more than {LIST_MAX_SCANS} SCAN calls: {scans:?}"
    );
    // COUNT bounds each call: walking 100,000 keys takes many of them.
    let total: u64 = scans.iter().sum();
    assert!(total >= 100_000 / LIST_SCAN_COUNT as u64 / 2, "{scans:?}");
    assert_eq!(support::command_calls(&server, "keys"), 0);

    let (mut names, _) = list_all(&server, &["tenant-[13]"]).await;
    names.sort();
    assert_eq!(names, ["tenant-1", "tenant-3"]);
}

#[tokio::test]
async fn instance_names_are_checked_and_start_every_owner_id() {
    let server = RedisServer::start();
    let refused = LockClient::builder(&server.url())
        .instance_name("a:b")
        .build()
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidConfig);
    let orders = named(&server, "orders-7f9c").await;
    let guard = orders.lock("invoice-42").unwrap().acquire().await.unwrap();
    assert!(
        guard.owner_id().starts_with("orders-7f9c."),
        "{}",
        guard.owner_id()
    );
    let random = &orders.instance_id()["orders-7f9c.".len()..];
    assert!(random.len() == 32 && random.bytes().all(|byte| byte.is_ascii_hexdigit()));
    let snapshot = orders.inspect("invoice-42").await.unwrap();
    assert_eq!(snapshot.holders[0].instance, "orders-7f9c");
}

#[tokio::test]
async fn lockctl_lists_over_mutual_tls_with_a_password_given_the_files_and_is_refused_without() {
    const PASSWORD: &str = "ops-pass";
    let pki = TestPki::create();
    let server = RedisServer::start_tls(&pki.server(true), &["--requirepass", PASSWORD]);
    let url = server.url_as("", PASSWORD);
    let holder = LockClient::builder(&url)
        .tls_root_certificate(pki.ca_pem())
        .tls_client_certificate(pki.client_cert_pem(), pki.client_key_pem())
        .instance_name("orders-tls")
        .build()
        .await
        .unwrap();
    let guard = holder.lock("invoice-tls").unwrap().acquire().await.unwrap();
    let (ca, cert, key) = (
        pki.file("ca.crt"),
        pki.file("client.crt"),
        pki.file("client.key"),
    );
    let (ca, cert, key) = (
        ca.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );

    let (code, stdout, stderr) = ctl_at(
        &url,
        &[
            "--tls-ca",
            ca,
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "list",
            "--json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let lines = json_lines(&stdout);
    let listed = lock_named(&lines, "invoice-tls");
    assert_eq!(listed["holders"][0]["instance"], "orders-tls", "{listed:#}");
    // Taken free, its tokens came from the server clock: no counter to list.
    assert_eq!(listed["fence"], serde_json::Value::Null, "{listed:#}");

    // Each missing piece is refused as access denied: the CA, the client certificate, the
    // password.
    let without_password = server.url();
    let refusals: [(&str, &[&str]); 3] = [
        (&url, &["--tls-cert", cert, "--tls-key", key]),
        (&url, &["--tls-ca", ca]),
        (
            &without_password,
            &["--tls-ca", ca, "--tls-cert", cert, "--tls-key", key],
        ),
    ];
    for (url, files) in refusals {
        let args: Vec<&str> = files.iter().copied().chain(["list", "--json"]).collect();
        let (code, stdout, _) = ctl_at(url, &args).await;
        assert_eq!(code, 1, "{files:?}: {stdout}");
        let error = &json_lines(&stdout)[0];
        assert_eq!(error["event"], "error", "{files:?}: {error}");
        assert_eq!(error["kind"], "AccessDenied", "{files:?}: {error}");
    }

    // A file that cannot be read, or a certificate without its key, is a usage error.
    let (code, _, stderr) = ctl_at(&url, &["--tls-ca", "/nonexistent/ca.crt", "list"]).await;
    assert_eq!(code, 2);
    assert!(
        stderr.contains("cannot read /nonexistent/ca.crt"),
        "{stderr}"
    );
    let (code, _, stderr) = ctl_at(&url, &["--tls-cert", cert, "list"]).await;
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--tls-cert and --tls-key go together"),
        "{stderr}"
    );
    guard.release().await.unwrap();
}

/// The commands the security chapter's ACL line grants the library's user.
fn documented_library_commands() -> String {
    let chapter = include_str!("../src/guide/security.md");
    let start = "ACL SETUSER locker reset on >CHANGE-ME ~lock:* ~tower-redis-lock:promoted* \
                 resetchannels &lock:wake:* ";
    let line = chapter
        .lines()
        .find_map(|line| line.strip_prefix(start))
        .expect("the security chapter shows the library's ACL line");
    line.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_user_lists_and_inspects_with_the_library_commands_and_scan_zcard() {
    let server = RedisServer::start();
    // The library's commands and keys, plus what the operating chapter's lockctl section adds.
    let rules = format!(
        "reset on >op-pass ~lock:* ~tower-redis-lock:promoted* resetchannels &lock:wake:* {} \
         +scan +zcard",
        documented_library_commands()
    );
    let mut args = vec!["ACL", "SETUSER", "operator"];
    args.extend(rules.split_whitespace());
    let () = server.cmd(&args);
    let orders = named(&server, "orders-7f9c").await;
    let _held = orders.lock("invoice-42").unwrap().acquire().await.unwrap();
    let url = server.url_as("operator", "op-pass");

    for args in [["list", "--json"], ["inspect", "invoice-42"]] {
        let output = tokio::process::Command::new(support::lockctl_path())
            .args(["--url", &url])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("lockctl runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{args:?}: {stdout}");
        assert!(stdout.contains("orders-7f9c"), "{args:?}: {stdout}");
    }
    // But for `client|setinfo`, which redis-rs sends on connect to Redis 7.2 and later (and
    // Valkey) and whose refusal it ignores (the security chapter: grant it there to keep it out of the log).
    let log: Vec<std::collections::HashMap<String, redis::Value>> = server.cmd(&["ACL", "LOG"]);
    let denied: Vec<_> = log
        .iter()
        .filter(|entry| {
            !matches!(entry.get("object"), Some(redis::Value::BulkString(object))
                if object == b"client|setinfo")
        })
        .collect();
    assert!(denied.is_empty(), "{denied:?}");
}

/// The watchdog lease of the semaphore holders these tests kill: short, so that a test waits
/// it out quickly, and long enough that a busy machine's renewals (every third of it) keep
/// a live holder.
const SHORT_LEASE: Duration = Duration::from_secs(3);

/// The words of a command line.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Starts `lockctl hold` with `args` and waits for its `acquired` event; the process is
/// killed (by its id) when the guard drops.
fn hold_until_acquired(
    server: &RedisServer,
    args: &[&str],
) -> (ChildGuard, BufReader<ChildStdout>, Value) {
    let mut holder = lockctl(server, args);
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let acquired = next_event(&mut out);
    assert_eq!(acquired["event"], "acquired", "{acquired}");
    (ChildGuard(holder), out, acquired)
}

/// Waits until `owners` owners are queued in Redis for the semaphore `name` (server-side
/// state: no signal to wait on).
async fn await_semaphore_queued(server: &RedisServer, name: &str, owners: usize) {
    let queued = support::eventually(WAIT_BOUND, || {
        support::semaphore_queued(server, name).len() == owners
    });
    assert!(
        queued.await,
        "{owners} waiters never queued for semaphore {name}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_semaphore_holder_frees_its_permits_at_its_lease_end_and_not_before() {
    let server = RedisServer::start();
    let hold = format!(
        "hold pool --kind semaphore --permits 3 --take 2 --watchdog-lease {}ms --for 60s",
        SHORT_LEASE.as_millis()
    );
    let (mut holder, _out, acquired) = hold_until_acquired(&server, &words(&hold));
    assert_eq!(
        (&acquired["kind"], &acquired["permits"], &acquired["take"]),
        (&json!("Semaphore"), &json!(3), &json!(2))
    );
    assert_eq!(
        acquired["pid"],
        holder.0.id(),
        "the event names the process"
    );

    // One permit is free; a waiter for two queues behind the holder.
    let locks = support::client(&server).await;
    let semaphore = locks.semaphore("pool", 3).unwrap();
    let waiting = tokio::spawn(async move { semaphore.acquire_many(2).await });
    await_semaphore_queued(&server, "pool", 1).await;

    // SIGKILL (std's `Child::kill` on Unix), by the process's id: no release, no last words.
    holder.0.kill().unwrap();
    holder.0.wait().unwrap();
    let killed_at = std::time::Instant::now();
    let after_kill = locks.inspect_semaphore("pool").await.unwrap();
    let dead = after_kill
        .holders
        .iter()
        .find(|holder| holder.owner == acquired["owner"])
        .unwrap_or_else(|| {
            panic!("the killed holder still holds until its lease ends: {after_kill:?}")
        });
    assert_eq!(dead.permits, Some(2));
    let left = dead.lease_left.expect("a holder's own lease");
    assert!(left <= SHORT_LEASE, "{left:?}");

    let guard = tokio::time::timeout(SHORT_LEASE + WAIT_BOUND, waiting)
        .await
        .expect("the dead holder's permits came back within its lease and generous slack")
        .unwrap()
        .unwrap();
    let waited = killed_at.elapsed();
    // Not before the lease it had left at the kill ran out: Redis's clock and ours both run
    // in real time; 250 ms covers the ms rounding of both and the reading's own latency.
    assert!(
        waited + Duration::from_millis(250) >= left,
        "granted {waited:?} after the kill, with {left:?} of its lease left"
    );
    assert_eq!(guard.permits(), 2);
    assert!(guard.fencing_token() > acquired["token"].as_u64().unwrap());
    let now = locks.inspect_semaphore("pool").await.unwrap();
    let permits = now.permits.unwrap();
    assert_eq!((permits.total, permits.used, permits.free), (3, 2, 1));
    assert_eq!(now.holders.len(), 1, "only the waiter holds: {now:?}");
    guard.release().await.unwrap();
}

/// The cells of the table row of the lock or semaphore `name` of `kind`.
fn row_of_kind<'a>(table: &'a str, name: &str, kind: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&name) && cells.get(1) == Some(&kind))
        .unwrap_or_else(|| panic!("no {kind} row for {name} in\n{table}"))
}

/// The instances of a HOLDERS cell (`a(2),b(1)`) with their counts, sorted.
fn holders_in(cell: &str) -> Vec<String> {
    let mut holders: Vec<String> = cell.split(',').map(str::to_owned).collect();
    holders.sort();
    holders
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_show_a_semaphores_permits_its_holders_takes_and_a_queued_waiter() {
    let server = RedisServer::start();
    // lockctl holds two of four permits on a 900 ms watchdog lease (renewed every 300 ms):
    // short, so that it soon learns of the force-unlock at the end.
    let (_holder, mut holder_out, acquired) = hold_until_acquired(
        &server,
        &words(
            "--instance-name orders-7f9c hold pool --kind semaphore --permits 4 --take 2 \
             --watchdog-lease 900ms --for 60s",
        ),
    );
    // The same short lease for billing-1, whose permit the force-unlock takes too.
    let billing = LockClient::builder(&server.url())
        .instance_name("billing-1")
        .watchdog_lease(Duration::from_millis(900))
        .build()
        .await
        .unwrap();
    let one = billing
        .semaphore("pool", 4)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    // One permit is free: a waiter for three queues.
    let reports = named(&server, "reports-3").await;
    let semaphore = reports.semaphore("pool", 4).unwrap();
    let waiting = tokio::spawn(async move { semaphore.acquire_many(3).await });
    await_semaphore_queued(&server, "pool", 1).await;
    // A lock of the same name is another thing, listed apart.
    let lock = billing.lock("pool").unwrap().acquire().await.unwrap();

    let (code, table, errors) = ctl(&server, &["list"]).await;
    assert_eq!(code, 0, "{errors}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "KIND", "HOLDERS", "LEASE", "TOKEN", "WAITERS", "FREE"
        ]
    );
    let sem = row_of_kind(&table, "pool", "semaphore");
    assert_eq!(
        holders_in(sem[2]),
        ["billing-1(1)", "orders-7f9c(2)"],
        "{table}"
    );
    assert_eq!(
        sem[5..],
        ["1", "1/4"],
        "one waiter, one of four permits free: {table}"
    );
    let plain = row_of_kind(&table, "pool", "exclusive");
    assert_eq!([plain[2], plain[6]], ["billing-1(1)", "-"], "{table}");

    let (code, out, errors) = ctl(&server, &["list", "--json"]).await;
    assert_eq!(code, 0, "{errors}");
    let lines = json_lines(&out);
    assert_eq!(lines.last().unwrap()["locks"], 2, "{out}");
    let sem = lines
        .iter()
        .find(|line| line["kind"] == "semaphore")
        .unwrap_or_else(|| panic!("no semaphore in {out}"));
    assert_semaphore_json(sem, &acquired);
    let plain = lines
        .iter()
        .find(|line| line["kind"] == "exclusive")
        .unwrap();
    assert_eq!(
        (&plain["key"], &plain["permits"]),
        (&json!("lock:{pool}"), &Value::Null)
    );

    let (code, text, errors) = ctl(&server, &["inspect", "pool", "--kind", "semaphore"]).await;
    assert_eq!(code, 0, "{errors}");
    for line in [
        "KEY      lock:{pool}:semaphore",
        "KIND     semaphore",
        "PERMITS  4 (3 held, 1 free)",
        "HOLDERS  2",
        "WAITERS  1",
    ] {
        assert!(
            text.lines().any(|shown| shown == line),
            "{line:?} missing:\n{text}"
        );
    }
    let cells = |first: &str| -> Vec<String> {
        text.lines()
            .map(|line| {
                line.split_whitespace()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .find(|cells| cells.first().map(String::as_str) == Some(first))
            .unwrap_or_else(|| panic!("no row starting {first}:\n{text}"))
    };
    assert_eq!(cells("INSTANCE")[..2], ["INSTANCE", "PERMITS"]);
    assert_eq!(cells("orders-7f9c")[1], "2", "{text}");
    assert_eq!(cells("billing-1")[1], "1", "{text}");
    assert_eq!(cells("1")[1..4], ["reports-3", "3", "permits"], "{text}");

    let (code, out, errors) = ctl(
        &server,
        &["inspect", "pool", "--kind", "semaphore", "--json"],
    )
    .await;
    assert_eq!(code, 0, "{errors}");
    let inspected = &json_lines(&out)[0];
    assert_eq!(inspected["event"], "inspect");
    assert_semaphore_json(inspected, &acquired);
    // Without --kind, the name is the lock's.
    let (code, out, _) = ctl(&server, &["inspect", "pool", "--json"]).await;
    assert_eq!(code, 0);
    let inspected = &json_lines(&out)[0];
    assert_eq!(
        (&inspected["kind"], &inspected["hold_count"]),
        (&json!("exclusive"), &json!(1))
    );

    // Force-unlocking the semaphore hands its permits to the queue, leaves the lock alone,
    // and the holders learn of it at their next renewal.
    let lost = one.lost_signal();
    let (code, out, errors) = ctl(
        &server,
        &[
            "force-unlock",
            "pool",
            "--kind",
            "semaphore",
            "--yes",
            "--json",
        ],
    )
    .await;
    assert_eq!(code, 0, "{errors}");
    assert_eq!(json_lines(&out)[0]["removed"], true);
    let granted = tokio::time::timeout(WAIT_BOUND, waiting)
        .await
        .expect("the waiter was granted the freed permits")
        .unwrap()
        .unwrap();
    assert_eq!(granted.permits(), 3);
    let lost_event = next_event(&mut holder_out);
    assert_eq!(
        (&lost_event["event"], &lost_event["reason"]),
        (&json!("lost"), &json!("Taken")),
        "{lost_event}"
    );
    let reason = tokio::time::timeout(WAIT_BOUND, lost.lost())
        .await
        .expect("the library holder was told");
    assert_eq!(reason, LostReason::Taken);
    assert!(lock.is_held(), "the lock of the same name stayed held");
    assert_eq!(billing.inspect("pool").await.unwrap().holders.len(), 1);
    granted.release().await.unwrap();
}

/// The semaphore `pool` as the JSON of `list` and `inspect` show it: four permits, three
/// held (two by lockctl's holder `acquired`, one by billing-1), and reports-3 waiting for
/// three.
fn assert_semaphore_json(sem: &Value, acquired: &Value) {
    assert_eq!(
        (&sem["name"], &sem["key"], &sem["locked"]),
        (
            &json!("pool"),
            &json!("lock:{pool}:semaphore"),
            &json!(true)
        ),
        "{sem}"
    );
    assert_eq!(
        sem["permits"],
        json!({"total": 4, "used": 3, "free": 1}),
        "{sem}"
    );
    let holders = sem["holders"].as_array().expect("holders");
    let mut takes: Vec<(&str, u64)> = holders
        .iter()
        .map(|holder| {
            let lease = holder["lease_left_ms"]
                .as_u64()
                .expect("each holder's own lease");
            assert!(lease > 0 && lease <= 30_000, "{holder}");
            (
                holder["instance"].as_str().unwrap(),
                holder["permits"].as_u64().unwrap(),
            )
        })
        .collect();
    takes.sort_unstable();
    assert_eq!(takes, [("billing-1", 1), ("orders-7f9c", 2)], "{sem}");
    assert!(
        holders
            .iter()
            .any(|holder| holder["owner"] == acquired["owner"]),
        "{sem}"
    );
    assert_eq!(sem["queued"], 1);
    let waiter = &sem["waiters"][0];
    assert_eq!(
        (
            &waiter["instance"],
            &waiter["wants"],
            &waiter["permits"],
            &waiter["alive"]
        ),
        (
            &json!("reports-3"),
            &json!("semaphore"),
            &json!(3),
            &json!(true)
        ),
        "{sem}"
    );
}

/// Runs lockctl with one `--url` per entry of `urls` and no `--cluster`, stdin closed: its
/// exit code, stdout and stderr.
async fn ctl_plain_urls(urls: &[String], args: &[&str]) -> (i32, String, String) {
    let mut command = tokio::process::Command::new(support::lockctl_path());
    for url in urls {
        command.arg("--url").arg(url);
    }
    let output = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("lockctl runs");
    (
        output.status.code().expect("exit code"),
        String::from_utf8(output.stdout).expect("UTF-8 output"),
        String::from_utf8(output.stderr).expect("UTF-8 errors"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn given_a_cluster_node_without_cluster_lockctl_switches_to_cluster_mode_and_says_so() {
    let cluster = support::cluster::RedisCluster::start(3);
    let urls = cluster.urls();
    let node = [urls[0].clone()];
    let note = format!(
        "note: {} is a Redis Cluster node; using cluster mode (pass --cluster to say so)",
        urls[0]
    );

    // Every slot's epoch, on every node, not a redirection from the one named.
    let (code, stdout, stderr) = ctl_plain_urls(&node, &["waive-quarantine"]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(
        json_lines(&stdout),
        [json!({"event": "quarantine-waived", "waived": true})]
    );
    assert_eq!(stderr.trim_end(), note);
    assert_eq!(cluster.keys(), 16384, "one epoch per slot");

    let names: Vec<String> = (0..12).map(|n| format!("tenant-{n}")).collect();
    let nodes: std::collections::HashSet<u16> = names
        .iter()
        .map(|name| cluster.node_of(&format!("lock:{{{name}}}")))
        .collect();
    assert_eq!(nodes.len(), 3, "the locks do not reach every node");
    let locks = LockClient::builder_cluster(&urls)
        .instance_name("orders-7f9c")
        .build()
        .await
        .unwrap();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(locks.lock(name).unwrap().acquire().await.unwrap());
    }
    // From one node, and from several given as plain URLs: every node's locks, JSON alone on
    // stdout.
    for given in [&node[..], &urls[..]] {
        let (code, stdout, stderr) = ctl_plain_urls(given, &["list", "--json"]).await;
        assert_eq!(code, 0, "{stdout}{stderr}");
        assert_eq!(stderr.trim_end(), note);
        let lines = json_lines(&stdout);
        let (page, listed) = lines.split_last().expect("the page line");
        assert_eq!(page["next_cursor"], Value::Null, "{stdout}");
        let mut listed: Vec<&str> = listed
            .iter()
            .map(|lock| lock["name"].as_str().expect("a name"))
            .collect();
        listed.sort_unstable();
        let mut wanted: Vec<&str> = names.iter().map(String::as_str).collect();
        wanted.sort_unstable();
        assert_eq!(listed, wanted);
    }
    // The table too.
    let (code, stdout, _) = ctl_plain_urls(&node, &["list"]).await;
    assert_eq!(code, 0, "{stdout}");
    for name in &names {
        assert_eq!(
            row(&stdout, name)[..3],
            [&**name, "exclusive", "orders-7f9c(1)"]
        );
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    locks.shutdown().await;
}

/// The slot's keys under `lock:` on the node on `port`, each with its `DUMP` (the value,
/// byte for byte), sorted.
fn library_keys(
    cluster: &support::cluster::RedisCluster,
    port: u16,
    slot: u16,
) -> Vec<(String, Vec<u8>)> {
    let mut keys: Vec<(String, Vec<u8>)> = cluster
        .keys_in_slot(port, slot)
        .into_iter()
        .filter(|key| key.starts_with("lock:"))
        .map(|key| {
            let dump: Vec<u8> = cluster.cmd(port, &["DUMP", &key]);
            (key, dump)
        })
        .collect();
    keys.sort();
    keys
}

fn keys_counted(cluster: &support::cluster::RedisCluster, port: u16, slot: u16) -> i64 {
    cluster.cmd(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
}

/// Runs `CLUSTER SETSLOT <slot> ARGS…` on the node on `port`.
fn setslot(cluster: &support::cluster::RedisCluster, port: u16, slot: u16, args: &[&str]) {
    let slot = slot.to_string();
    let mut command = vec!["CLUSTER", "SETSLOT", &slot];
    command.extend(args);
    let _: () = cluster.cmd(port, &command);
}

/// What `stranded --json` listed as stranded: (node, slot, key, owner), sorted.
fn stranded_events(lines: &[Value]) -> Vec<(String, u64, String, String)> {
    let mut found: Vec<_> = lines
        .iter()
        .filter(|line| line["event"] == "stranded")
        .map(|line| {
            (
                line["node"].as_str().expect("a node").to_owned(),
                line["slot"].as_u64().expect("a slot"),
                line["key"].as_str().expect("a key").to_owned(),
                line["owner"].as_str().expect("an owner").to_owned(),
            )
        })
        .collect();
    found.sort();
    found
}

/// An aborted migration: keys of a slot copied to another master (`MIGRATE … COPY`, the
/// owner keeps its own) and one written there after `ASKING`, then the slot set `STABLE` on
/// both. `lockctl stranded` lists exactly those keys, and not those of a slot still
/// importing; `--delete` needs `--yes` without a terminal, then removes them and nothing
/// else (not the owner's keys of the same names, not a key outside the prefix, not the open
/// slot's); the slot, whose migration to that master failed with BUSYKEY before, migrates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stranded_lists_and_deletes_what_an_aborted_migration_left_and_the_slot_migrates_again() {
    let cluster = support::cluster::RedisCluster::start(3);
    cluster.provision_epochs().await;
    let urls = cluster.urls();
    let (name, open_name) = ("stranded-a", "open-b");
    let slot = cluster.slot_of(&format!("lock:{{{name}}}"));
    let open_slot = cluster.slot_of(&format!("lock:{{{open_name}}}"));
    assert_ne!(slot, open_slot);
    let from = cluster.node_of(&format!("lock:{{{name}}}"));
    let to = cluster.other_master(from);

    let locks = LockClient::builder_cluster(&urls).build().await.unwrap();
    locks
        .lock(name)
        .unwrap()
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let owned = library_keys(&cluster, from, slot);
    assert!(
        !owned.is_empty(),
        "the slot has no library key on its owner"
    );

    // The aborted migration.
    let (from_id, to_id) = (cluster.node_id(from), cluster.node_id(to));
    setslot(&cluster, to, slot, &["IMPORTING", &from_id]);
    setslot(&cluster, from, slot, &["MIGRATING", &to_id]);
    let to_port = to.to_string();
    let mut migrate = vec![
        "MIGRATE",
        "127.0.0.1",
        &to_port,
        "",
        "0",
        "5000",
        "COPY",
        "KEYS",
    ];
    migrate.extend(owned.iter().map(|(key, _)| key.as_str()));
    let _: String = cluster.cmd(from, &migrate);
    let ghost = format!("lock:{{{name}}}");
    let _: i64 = cluster.cmd_asking(to, &["HSET", &ghost, "ghost-owner", "1"]);
    let foreign = format!("app:{{{name}}}");
    let _: () = cluster.cmd_asking(to, &["SET", &foreign, "kept"]);
    setslot(&cluster, to, slot, &["STABLE"]);
    setslot(&cluster, from, slot, &["STABLE"]);
    assert_eq!(keys_counted(&cluster, to, slot), owned.len() as i64 + 2);

    // Moving the slot there now fails: its keys are already there.
    setslot(&cluster, to, slot, &["IMPORTING", &from_id]);
    setslot(&cluster, from, slot, &["MIGRATING", &to_id]);
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{from}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap();
    let mut moving = redis::cmd("MIGRATE");
    moving.arg(&["127.0.0.1", &to_port, "", "0", "5000", "KEYS"]);
    moving.arg(
        owned
            .iter()
            .map(|(key, _)| key.as_str())
            .collect::<Vec<_>>(),
    );
    let refused = moving.query::<String>(&mut conn).unwrap_err();
    assert!(refused.to_string().contains("BUSYKEY"), "{refused}");
    setslot(&cluster, to, slot, &["STABLE"]);
    setslot(&cluster, from, slot, &["STABLE"]);

    // A migration under way: its keys on the importing node are not stranded.
    let open_from = cluster.node_of(&format!("lock:{{{open_name}}}"));
    let open_to = cluster.other_master(open_from);
    cluster.start_migration(open_slot, open_from, open_to, &[]);
    let moving_key = format!("lock:{{{open_name}}}:fence");
    let _: () = cluster.cmd_asking(open_to, &["SET", &moving_key, "7"]);

    let node = |port: u16| format!("127.0.0.1:{port}");
    let mut wanted: Vec<(String, u64, String, String)> = owned
        .iter()
        .map(|(key, _)| key.clone())
        .chain([ghost.clone()])
        .map(|key| (node(to), u64::from(slot), key, node(from)))
        .collect();
    wanted.sort();
    let (code, stdout, stderr) = ctl_plain_urls(&urls, &["--cluster", "stranded", "--json"]).await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    let lines = json_lines(&stdout);
    assert_eq!(stranded_events(&lines), wanted, "{stdout}");
    let skipped: Vec<&Value> = lines.iter().filter(|l| l["event"] == "skipped").collect();
    assert_eq!(skipped.len(), 1, "{stdout}");
    assert_eq!(
        (
            &skipped[0]["node"],
            &skipped[0]["slot"],
            &skipped[0]["keys"]
        ),
        (
            &json!(node(open_to)),
            &json!(open_slot),
            &json!([moving_key])
        ),
    );
    let summary = lines.last().expect("a summary");
    assert_eq!(
        (&summary["event"], &summary["stranded"], &summary["skipped"]),
        (&json!("summary"), &json!(wanted.len()), &json!(1))
    );
    assert_eq!(
        (&summary["others"], &summary["deleted"]),
        (&json!(1), &Value::Null)
    );

    // The same as lines for people.
    let (code, stdout, _) = ctl_plain_urls(&urls, &["--cluster", "stranded"]).await;
    assert_eq!(code, 0, "{stdout}");
    let line = format!(
        "stranded {} slot {slot} {ghost} (owner {})",
        node(to),
        node(from)
    );
    assert!(
        stdout.lines().any(|l| l == line),
        "no {line:?} in\n{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with(&format!(
            "skipped {} slot {open_slot}: 1 key",
            node(open_to)
        ))),
        "{stdout}"
    );
    let count = format!("{} stranded keys, 1 skipped", wanted.len());
    assert!(
        stdout.lines().last().unwrap().starts_with(&count),
        "{stdout}"
    );

    // Without a terminal to ask on, --delete needs --yes, and changes nothing.
    let (code, stdout, stderr) =
        ctl_plain_urls(&urls, &["--cluster", "stranded", "--delete"]).await;
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stderr.contains("--yes"), "{stderr}");
    assert_eq!(keys_counted(&cluster, to, slot), owned.len() as i64 + 2);

    let (code, stdout, stderr) = ctl_plain_urls(
        &urls,
        &["--cluster", "stranded", "--delete", "--yes", "--json"],
    )
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    let lines = json_lines(&stdout);
    let deleted: Vec<&Value> = lines.iter().filter(|l| l["event"] == "deleted").collect();
    assert_eq!(deleted.len(), 1, "{stdout}");
    assert_eq!(
        (
            &deleted[0]["node"],
            &deleted[0]["slot"],
            &deleted[0]["keys"]
        ),
        (&json!(node(to)), &json!(slot), &json!(wanted.len()))
    );
    assert_eq!(lines.last().unwrap()["deleted"], json!(wanted.len()));
    // Only the stranded keys went: the key outside the prefix stays, as do the owner's keys
    // of the same names, and the open slot's, still importing.
    let left: Vec<String> = cluster.keys_in_slot(to, slot);
    assert_eq!(left, [foreign.as_str()]);
    assert_eq!(library_keys(&cluster, from, slot), owned);
    assert_eq!(keys_counted(&cluster, open_to, open_slot), 1);
    let open_nodes: String = cluster.cmd(open_to, &["CLUSTER", "NODES"]);
    assert!(
        open_nodes.contains(&format!("[{open_slot}-<-")),
        "{open_nodes}"
    );
    let to_nodes: String = cluster.cmd(to, &["CLUSTER", "NODES"]);
    assert!(
        !to_nodes.contains(&format!("[{slot}-<-")),
        "left importing: {to_nodes}"
    );

    // The foreign key is the operator's to move or remove; then the slot moves whole.
    setslot(&cluster, to, slot, &["IMPORTING", &from_id]);
    let _: i64 = cluster.cmd_asking(to, &["DEL", &foreign]);
    setslot(&cluster, to, slot, &["STABLE"]);
    assert_eq!(keys_counted(&cluster, to, slot), 0);
    cluster.migrate_slot(slot, from, to);
    assert_eq!(keys_counted(&cluster, from, slot), 0);
    // The owner's state is what arrived, and only it.
    assert_eq!(library_keys(&cluster, to, slot), owned);
    assert_eq!(cluster.node_of(&ghost), to);
    let (code, stdout, _) = ctl_plain_urls(&urls, &["--cluster", "stranded", "--json"]).await;
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(
        json_lines(&stdout).last().unwrap()["stranded"],
        0,
        "{stdout}"
    );
    locks.shutdown().await;
}

/// One server owns every key: nothing to check, exit 0.
#[tokio::test]
async fn stranded_on_one_server_has_nothing_to_check() {
    let server = RedisServer::start();
    let (code, stdout, stderr) = ctl(&server, &["stranded"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("nothing to check"), "{stdout}");
    let (code, stdout, _) = ctl(&server, &["stranded", "--delete", "--yes", "--json"]).await;
    assert_eq!(code, 0);
    assert_eq!(json_lines(&stdout)[0]["cluster"], false);
    let (code, _, stderr) = ctl(&server, &["stranded", "--yes"]).await;
    assert_eq!(code, 2, "{stderr}");
}

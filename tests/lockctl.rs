//! `lockctl` as separate processes against a real redis-server.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};

use serde_json::Value;
use support::RedisServer;

fn lockctl(server: &RedisServer, args: &[&str]) -> Child {
    Command::new(support::lockctl_path())
        .arg("--url")
        .arg(server.url())
        .args(args)
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

    let (code, inspected) = run(&server, &["inspect", "shared"]);
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
    let (code, unlocked) = run(&server, &["force-unlock", "stuck"]);
    assert_eq!((code, unlocked["removed"].as_bool()), (0, Some(true)));
    // The holder learns at its next renewal (10 s with the default 30 s lease) that the lock
    // is gone; it is stopped here rather than waited for.
    let (_, inspected) = run(&server, &["inspect", "stuck"]);
    assert_eq!(inspected["locked"], false);
    holder.kill().unwrap();
    holder.wait().unwrap();
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

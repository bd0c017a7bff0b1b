//! The last release of a lock taken with nobody queued goes out as two plain commands (`HDEL`
//! of the owner's field, `EXISTS` of the lock) before any script: what must still hold when
//! someone queued meanwhile, when the script that grants the lock on fails after them, when
//! the connection is cut or the caller gives up between the two, and when the releasing
//! guard's lease was lost to another holder with waiters of its own.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::{RedisServer, Waiting, queue_behind};
use tower_redis_lock::{ErrorKind, LockClient, LockGuard};

/// The watchdog lease of every client here, and how long a queued waiter sleeps without a
/// grant (see [`waiting_client`]). The bounds below are a third of it: they hold on a loaded
/// machine, and still tell a grant from a waiter that looked again by itself.
const LEASE: Duration = Duration::from_secs(30);

/// What a grant may take to reach a waiter on a loaded machine.
const PROMPT: Duration = Duration::from_secs(10);

/// The password of the ACL user whose scripts are refused for a while.
const PASSWORD: &str = "plain-release-test";

/// The lock `waiting` is granted within [`PROMPT`] of now, `when` (what the test did last).
async fn granted(waiting: Waiting, when: &str) -> LockGuard {
    let started = Instant::now();
    let guard = tokio::time::timeout(PROMPT, waiting)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not granted the lock {when}"))
        .unwrap()
        .unwrap();
    println!("granted {:?} {when}", started.elapsed());
    guard
}

/// A client of `url` whose queued tasks look again only after [`LEASE`]: a grant is what
/// wakes them sooner, so one that never comes fails the bounds here.
async fn waiting_client(url: &str) -> LockClient {
    LockClient::builder(url)
        .watchdog_lease(LEASE)
        .lease_limit(LEASE)
        .repoll_interval(LEASE)
        .command_timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("client")
}

/// A proxy in front of `server`, the holder's client through it and the waiter's direct.
/// Commands time out after 5 s, well past any latency the tests give the proxy.
async fn holder_through_proxy(server: &RedisServer) -> (FaultProxy, LockClient, LockClient) {
    let proxy = FaultProxy::start(server.port()).await;
    let holder = waiting_client(&proxy.url()).await;
    let waiter = waiting_client(&server.url()).await;
    (proxy, holder, waiter)
}

/// The fields of the lock `name`'s hash (default prefix).
fn lock_fields(server: &RedisServer, name: &str) -> Vec<String> {
    server.cmd(&["HKEYS", &format!("lock:{{{name}}}")])
}

/// How many scripts Redis refused (its ACL LOG counts the refusals of one command by one
/// user in one entry).
fn refused_scripts(server: &RedisServer) -> i64 {
    let log: Vec<HashMap<String, redis::Value>> = server.cmd(&["ACL", "LOG"]);
    log.iter()
        .filter(|entry| {
            matches!(entry.get("object"), Some(redis::Value::BulkString(object))
                if object.starts_with(b"eval") || object.as_slice() == b"fcall")
        })
        .map(|entry| match entry.get("count") {
            Some(redis::Value::Int(count)) => *count,
            other => panic!("an ACL LOG entry's count: {other:?}"),
        })
        .sum()
}

#[tokio::test]
async fn a_waiter_that_queued_behind_a_lock_taken_with_nobody_queued_is_granted_at_its_release() {
    let server = RedisServer::start();
    let holder = support::client_with_lease(&server.url(), LEASE).await;
    let waiter = waiting_client(&server.url()).await;
    let (held, waiting) = queue_behind(&holder, &waiter, "tenant-1").await;
    let token = held.fencing_token();

    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    held.release().await.unwrap();
    let granted = granted(waiting, "after the release").await;
    assert!(granted.fencing_token() > token, "the tokens went back");
    // The plain commands found the lock marked, and the script granted it and told the
    // waiter's instance: one message, and the grant's own hold.
    assert_eq!(support::command_calls(&server, "publish"), 1);
    let holders = support::holders_among(lock_fields(&server, "tenant-1"));
    assert_eq!(holders.len(), 1, "{holders:?}");
}

#[tokio::test]
async fn a_release_whose_grant_fails_after_its_plain_commands_is_given_back_and_grants_the_waiter()
{
    let server = RedisServer::start();
    let _: () = server.cmd(&[
        "ACL",
        "SETUSER",
        "holder",
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "&*",
        "+@all",
    ]);
    let holder = support::client_with_lease(&server.url_as("holder", PASSWORD), LEASE).await;
    let waiter = waiting_client(&server.url()).await;
    let (held, waiting) = queue_behind(&holder, &waiter, "tenant-1").await;

    // The holder's scripts are refused from now on: its release's plain commands run, and
    // the script that would grant the lock on fails. The hold is released all the same.
    // Redis 6.2 has no functions, and no `fcall` to deny.
    let functions = support::has_functions(&server);
    let refuse: &[&str] = if functions { &["-fcall"] } else { &[] };
    let allow: &[&str] = if functions { &["+fcall"] } else { &[] };
    let acl = |change: &[&str], scripts: [&str; 2]| {
        let mut args = vec!["ACL", "SETUSER", "holder"];
        args.extend(change.iter().chain(&scripts));
        let _: () = server.cmd(&args);
    };
    acl(refuse, ["-evalsha", "-eval"]);
    held.release().await.unwrap();
    // Left marked with no holder: the waiter's look finds it held, and waits.
    let fields = lock_fields(&server, "tenant-1");
    assert!(
        support::holders_among(fields.clone()).is_empty() && !fields.is_empty(),
        "the lock's fields after the plain commands: {fields:?}"
    );
    // The release given back in the background is refused too, and tried again.
    let retried = support::eventually(PROMPT, || refused_scripts(&server) >= 3).await;
    assert!(retried, "refused scripts: {}", refused_scripts(&server));
    assert!(!waiting.is_finished(), "nobody granted the lock yet");

    // Scripts allowed again: the release given back in the background grants the lock.
    acl(allow, ["+evalsha", "+eval"]);
    let granted = granted(waiting, "after scripts were allowed").await;
    assert!(granted.fencing_token() > 0);
}

#[tokio::test]
async fn a_release_after_a_lost_lease_leaves_the_new_holders_waiters_marked() {
    let server = RedisServer::start();
    let lost = support::client_with_lease(&server.url(), LEASE).await;
    let holder = support::client_with_lease(&server.url(), LEASE).await;
    let waiter = waiting_client(&server.url()).await;
    let stale = lost.lock("tenant-1").unwrap().acquire().await.unwrap();
    // Its lease is lost (as when its instance paused past it): another takes the lock, and
    // a third queues behind that one, which marks it.
    let _: i64 = server.cmd(&["DEL", "lock:{tenant-1}"]);
    let (held, waiting) = queue_behind(&holder, &waiter, "tenant-1").await;
    let mut marked = lock_fields(&server, "tenant-1");
    marked.sort();

    let err = stale.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotOwner, "{err}");
    let mut after = lock_fields(&server, "tenant-1");
    after.sort();
    assert_eq!(
        after, marked,
        "the stale release changed the new holder's lock"
    );

    let token = held.fencing_token();
    held.release().await.unwrap();
    let granted = granted(waiting, "after its holder's release").await;
    assert!(granted.fencing_token() > token, "the tokens went back");
}

#[tokio::test]
async fn a_release_given_up_while_its_plain_commands_are_in_flight_still_grants_the_waiter() {
    let server = RedisServer::start();
    let (proxy, holder, waiter) = holder_through_proxy(&server).await;
    // A hand-over first, so that Redis has the release script: the slow proxy below would
    // make loading it take round trips of its own.
    let (held, waiting) = queue_behind(&holder, &waiter, "warm-up").await;
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
    let (held, waiting) = queue_behind(&holder, &waiter, "tenant-1").await;

    let token = held.fencing_token();
    // The plain commands take a second each way: the caller gives up before their answer,
    // which would have told it to grant the lock on.
    proxy.set_latency(Duration::from_secs(1));
    let given_up = tokio::time::timeout(Duration::from_millis(200), held.release()).await;
    assert!(given_up.is_err(), "the release was still in flight");

    let granted = granted(waiting, "after the release was given up").await;
    assert!(granted.fencing_token() > token, "the tokens went back");
}

#[tokio::test]
async fn a_release_whose_connection_is_cut_after_its_plain_commands_ran_still_grants_the_waiter() {
    let server = RedisServer::start();
    let (proxy, holder, waiter) = holder_through_proxy(&server).await;
    let (held, waiting) = queue_behind(&holder, &waiter, "tenant-1").await;
    let token = held.fencing_token();

    // The plain commands reach Redis, and their answer is still on its way when the
    // connection is cut: the release cannot know what they found.
    proxy.set_latency(Duration::from_secs(1));
    let release = tokio::spawn(held.release());
    let ran = support::eventually(PROMPT, || {
        let fields = lock_fields(&server, "tenant-1");
        !fields.is_empty() && support::holders_among(fields).is_empty()
    });
    assert!(
        ran.await,
        "the plain commands left the lock marked with no holder"
    );
    proxy.set_latency(Duration::ZERO);
    assert!(proxy.cut_all() > 0, "a connection was cut");
    let answer = release.await.unwrap();
    println!("the release answered {answer:?}");

    let granted = granted(waiting, "after the release's connection was cut").await;
    assert!(granted.fencing_token() > token, "the tokens went back");
}

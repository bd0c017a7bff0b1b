//! Faults between the clients and Redis, one at a time: a Redis that restarts without its
//! data, a black hole, cut connections, latency, killed connections and killed processes.
//! Network faults go through the fault proxy of the test support; Redis is real.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::{ChildGuard, RedisServer, client, eventually};
use tower_redis_lock::{ErrorKind, LockClient, LockGuard, LostReason};

/// Bound for steps that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(3);

/// Spawns a task that records when `guard`'s lost signal fires, and why.
fn watch_lost(guard: &LockGuard) -> tokio::task::JoinHandle<(Instant, LostReason)> {
    let lost = guard.lost_signal();
    tokio::spawn(async move {
        let reason = lost.lost().await;
        (Instant::now(), reason)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_lost_its_data_tells_holders_before_anyone_else_gets_their_locks() {
    let mut server = RedisServer::start();
    let port = server.port();
    // The quarantine covers the longest lease any client may still believe it holds: the
    // lease limit both clients keep to, longer than their short leases. The holder is vouched
    // for 3.6 s after its last renewal (a 4 s lease, renewed every 1.33 s): the restart and
    // the next renewal after it reach it with `DataLost` well within that on a busy machine.
    let quarantine = Duration::from_secs(6);
    let lease = Duration::from_secs(4);
    let holders = LockClient::builder(&server.url())
        .watchdog_lease(lease)
        .lease_limit(quarantine)
        .build()
        .await
        .unwrap();
    let others = LockClient::builder(&server.url())
        .watchdog_lease(lease)
        .lease_limit(quarantine)
        .build()
        .await
        .unwrap();
    let held = holders.lock("restarted").unwrap().acquire().await.unwrap();
    let token = held.fencing_token();
    let lost = watch_lost(&held);
    // The other client has used this Redis too, so it knows the epoch the data belongs to.
    drop(others.lock("warm-up").unwrap().acquire().await.unwrap());

    server.kill();
    let _restarted = RedisServer::start_on(port);
    let restarted_at = Instant::now();
    let taken = others
        .lock("restarted")
        .unwrap()
        .acquire_timeout(quarantine + SLACK * 2)
        .await
        .expect("the lock is free again after the quarantine");
    let taken_at = Instant::now();

    let (lost_at, reason) = lost.await.unwrap();
    assert_eq!(reason, LostReason::DataLost);
    assert!(
        lost_at < taken_at,
        "the holder was told {:?} after the restart, the lock taken again after {:?}",
        lost_at - restarted_at,
        taken_at - restarted_at
    );
    assert!(
        taken_at - restarted_at >= quarantine - Duration::from_millis(100),
        "nobody gets a lock of a Redis that lost its data before the quarantine ends"
    );
    assert!(taken.fencing_token() > token, "tokens keep growing");
    assert_eq!(
        held.release().await.unwrap_err().kind(),
        ErrorKind::NotOwner,
        "the lost lock is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_in_a_black_hole_is_told_before_another_instance_gets_its_lock() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    let lease = Duration::from_millis(1500);
    let cut_off = support::client_with_lease(&proxy.url(), lease).await;
    let other = support::client_with_lease(&server.url(), lease).await;
    let held = cut_off.lock("dark").unwrap().acquire().await.unwrap();
    let lost = watch_lost(&held);

    proxy.black_hole();
    let taken = other
        .lock("dark")
        .unwrap()
        .acquire_timeout(lease + SLACK)
        .await
        .expect("the lease runs out in Redis");
    let taken_at = Instant::now();
    let (lost_at, reason) = lost.await.unwrap();
    assert_eq!(reason, LostReason::Unreachable);
    assert!(lost_at < taken_at, "told before the lock changed hands");
    assert!(taken.fencing_token() > held.fencing_token());

    // The renewals stalled in the black hole arrive late and must not take the lock back.
    proxy.heal();
    assert_eq!(
        held.release().await.unwrap_err().kind(),
        ErrorKind::NotOwner
    );
    assert!(taken.is_held());
    let owners = support::holders_among(server.cmd(&["HKEYS", "lock:{dark}"]));
    assert_eq!(owners, vec![taken.owner_id().to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_keep_the_lease_and_the_waiter_gets_the_lock_on_release() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    // Long enough that a reconnection after each cut, slowed by a busy machine, still renews
    // within the 1.62 s the holder is vouched for.
    let lease = Duration::from_millis(1800);
    let holder = support::client_with_lease(&proxy.url(), lease).await;
    let waiter = support::client_with_lease(&proxy.url(), lease).await;
    let held = holder.lock("cut").unwrap().acquire().await.unwrap();
    let lock = waiter.lock("cut").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire_timeout(SLACK * 4).await });
    assert!(
        eventually(SLACK, || support::queued(&server, "cut").len() == 1).await,
        "the waiter queued"
    );

    // Cut everything three times, each time for less than the lease: the watchdog
    // reconnects and keeps renewing.
    for _ in 0..3 {
        assert!(proxy.cut_all() >= 2, "both clients had connections open");
        tokio::time::sleep(lease / 2).await;
    }
    assert!(
        held.is_held(),
        "a cut connection is not a lost lease: {:?}",
        held.lost_signal().reason()
    );
    assert!(!waiting.is_finished(), "the waiter still waits");
    let released_at = Instant::now();
    held.release()
        .await
        .expect("released through a new connection");
    let taken = waiting.await.unwrap().expect("the waiter gets the lock");
    assert!(
        released_at.elapsed() < Duration::from_secs(1) + SLACK,
        "woken by the release or the re-poll bound (1 s)"
    );
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_pubsub_connection_costs_at_most_the_repoll_bound() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    let holder = client(&server).await;
    let repoll = Duration::from_secs(1);
    let waiter = LockClient::builder(&proxy.url())
        .repoll_interval(repoll)
        .build()
        .await
        .unwrap();
    let held = holder.lock("deaf").unwrap().acquire().await.unwrap();
    let lock = waiter.lock("deaf").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire_timeout(SLACK * 4).await });
    assert!(eventually(SLACK, || support::queued(&server, "deaf").len() == 1).await);

    assert_eq!(proxy.cut_pubsub(), 1, "the waiter's one pub/sub connection");
    assert!(
        proxy.open_connections() >= 1,
        "its command connection stays"
    );
    let released_at = Instant::now();
    drop(held);
    let taken = waiting.await.unwrap().expect("the waiter gets the lock");
    assert!(released_at.elapsed() < repoll + SLACK);
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_slows_the_locks_but_keeps_them_exclusive() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    proxy.set_latency(Duration::from_millis(20));
    let clients = [
        support::client_with_lease(&proxy.url(), Duration::from_secs(3)).await,
        support::client_with_lease(&proxy.url(), Duration::from_secs(3)).await,
    ];
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for locks in &clients {
        for _ in 0..3 {
            let lock = locks.lock("slow").unwrap();
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = lock.acquire_timeout(SLACK * 10).await.unwrap();
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.store(false, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_during_load_lose_no_exclusion_and_leave_no_lock() {
    let server = RedisServer::start();
    let clients = [
        support::client_with_lease(&server.url(), Duration::from_secs(3)).await,
        support::client_with_lease(&server.url(), Duration::from_secs(3)).await,
    ];
    let inside = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let overlaps = Arc::new(AtomicU64::new(0));
    let acquired = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for locks in &clients {
        for task in 0..4 {
            let key = task % 2;
            let lock = locks.lock(&format!("killed-{key}")).unwrap();
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            let (acquired, stop) = (acquired.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    match lock.acquire_timeout(SLACK * 2).await {
                        Ok(guard) => {
                            if inside[key].swap(true, Ordering::SeqCst) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            acquired.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            inside[key].store(false, Ordering::SeqCst);
                            // A release cut off by the kill leaves the lock to its lease.
                            let _ = guard.release().await;
                        }
                        Err(err) => assert!(
                            matches!(err.kind(), ErrorKind::RedisUnavailable | ErrorKind::Timeout),
                            "a typed error: {err}"
                        ),
                    }
                }
            }));
        }
    }
    for round in 0..10 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let kind = if round % 2 == 0 { "normal" } else { "pubsub" };
        let _: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", kind]);
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(acquired.load(Ordering::SeqCst) > 10, "work went on");
    // Every lock is released, or given back by the undo of an acquisition whose reply was
    // cut off, or runs out with its lease (3 s).
    assert!(
        eventually(Duration::from_secs(3) + SLACK, || {
            server
                .cmd::<Vec<String>>(&["KEYS", "lock:{*}"])
                .iter()
                .all(|key| key.ends_with(":fence"))
        })
        .await,
        "no lock is left: {:?}",
        server.cmd::<Vec<String>>(&["KEYS", "lock:{*}"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_process_frees_its_lock_after_its_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(2);
    let mut holder = ChildGuard(
        Command::new(support::lockctl_path())
            .args(["--url", &server.url(), "hold", "orphan", "--for", "60s"])
            .args(["--lease", "2s"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("lockctl starts"),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.contains("acquired"), "lockctl holds the lock: {line}");

    let waiter = client(&server).await;
    let lock = waiter.lock("orphan").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire_timeout(Duration::from_secs(30)).await });
    holder.0.kill().unwrap();
    let killed_at = Instant::now();
    let taken = waiting
        .await
        .unwrap()
        .expect("the lock is free after the lease");
    let waited = killed_at.elapsed();
    assert!(
        waited < lease + Duration::from_secs(1) + SLACK,
        "freed within the lease plus the re-poll bound: {waited:?}"
    );
    drop(taken);
}

/// A holder cut off from Redis while Redis loses its data (FLUSHALL), and another client
/// that asks for its lock with a wait bound longer than the lease; both keep to a lease limit
/// of that lease, the asking client's restart quarantine. Returns when the holder was told,
/// why, and when the other client got the lock.
async fn lose_data_while_a_holder_is_cut_off(
    asking_knows_the_epoch: bool,
) -> (Instant, LostReason, Instant) {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    // Short so the test is quick.
    let lease = Duration::from_secs(5);
    let cut_off = support::client_with_lease(&proxy.url(), lease).await;
    let held = cut_off
        .lock("partitioned")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lost = watch_lost(&held);
    let other = LockClient::builder(&server.url())
        .watchdog_lease(lease)
        .lease_limit(lease)
        .build()
        .await
        .unwrap();
    if asking_knows_the_epoch {
        drop(other.lock("warm-up").unwrap().acquire().await.unwrap());
    }

    proxy.black_hole();
    let _: () = server.cmd(&["FLUSHALL"]);
    let taken = other
        .lock("partitioned")
        .unwrap()
        .acquire_timeout(lease * 2 + SLACK)
        .await
        .expect("the lock is free once the lease could have run out");
    let taken_at = Instant::now();
    let (lost_at, reason) = lost.await.unwrap();
    assert!(
        taken.fencing_token() > held.fencing_token(),
        "tokens keep growing"
    );
    proxy.heal();
    (lost_at, reason, taken_at)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_while_redis_loses_its_data_is_told_before_its_lock_is_taken() {
    let (lost_at, reason, taken_at) = lose_data_while_a_holder_is_cut_off(true).await;
    assert_eq!(reason, LostReason::Unreachable);
    assert!(
        lost_at < taken_at,
        "the cut-off holder was told {:?} after another client took its lock",
        lost_at - taken_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_new_to_a_redis_that_lost_its_data_waits_for_the_cut_off_holder_too() {
    // The first client to reach the empty Redis never saw its earlier epoch.
    let (lost_at, reason, taken_at) = lose_data_while_a_holder_is_cut_off(false).await;
    assert_eq!(reason, LostReason::Unreachable);
    assert!(
        lost_at < taken_at,
        "the cut-off holder was told {:?} after another client took its lock",
        lost_at - taken_at
    );
}

#[tokio::test]
async fn a_quarantine_covers_the_longest_lease_granted_before_the_loss() {
    let server = RedisServer::start();
    let short = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_secs(1))
        .lease_limit(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let long = client(&server).await;
    // The short-lease client knows the epoch with its own 1 s as the longest lease, and
    // checks it by the epoch's marker from then on.
    drop(short.lock("known").unwrap().acquire().await.unwrap());
    drop(short.lock("known").unwrap().acquire().await.unwrap());
    // Another client takes a fixed lease of 8 s: the epoch records it (which replaces the
    // marker), and the short-lease client learns it at its next acquisition.
    let _held = long
        .lock("long")
        .unwrap()
        .with_lease(tower_redis_lock::Lease::Fixed(Duration::from_secs(8)))
        .acquire()
        .await
        .unwrap();
    drop(short.lock("learn").unwrap().acquire().await.unwrap());

    let _: () = server.cmd(&["FLUSHALL"]);
    let lock = short.lock("after").unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none(), "quarantined");
    let left = short.restart_quarantine_left().expect("a quarantine runs");
    assert!(
        left > Duration::from_secs(7),
        "the quarantine covers the 8 s lease, not the client's own 1 s: {left:?}"
    );
}

#[tokio::test]
async fn an_epoch_key_deleted_alone_is_a_loss_though_its_marker_is_left() {
    let server = RedisServer::start();
    // The marker names the server's last save (its start here), and is written only once
    // the clock is past that second (see `lua/lib/life.lua`).
    server.wait_until_up_for(2);
    let locks = client(&server).await;
    let lock = locks.lock("marked").unwrap();
    // The first acquisition learns the epoch and writes its marker; the second checks the
    // epoch by that marker alone.
    lock.acquire().await.unwrap().release().await.unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
    let markers = || server.cmd::<Vec<String>>(&["KEYS", "lock:epoch:*"]);
    assert_eq!(markers().len(), 1, "{:?}", markers());

    let _: i64 = server.cmd(&["DEL", "lock:epoch"]);
    assert!(lock.try_acquire().await.unwrap().is_none(), "quarantined");
    assert!(
        locks.restart_quarantine_left().is_some(),
        "a quarantine runs"
    );
    // The look that found the epoch missing took the lost epoch's marker with it.
    assert_eq!(markers(), Vec::<String>::new());
}

#[tokio::test]
async fn a_server_started_less_than_the_lease_limit_ago_waits_until_an_operator_waives_it() {
    // The harness gives new servers their epoch; this one is left without, as a new server
    // is (or one restarted without its data: a server up less than the limit cannot tell).
    let server = RedisServer::start_without_epoch();
    let locks = client(&server).await;
    let lock = locks.lock("first").unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none(), "quarantined");
    let left = locks.restart_quarantine_left().expect("a quarantine runs");
    assert!(
        left > Duration::from_secs(50),
        "the default 60 s lease limit, from the server's start: {left:?}"
    );

    assert!(locks.waive_restart_quarantine().await.unwrap(), "waived");
    assert_eq!(locks.restart_quarantine_left(), None);
    let guard = lock.try_acquire().await.unwrap().expect("granted at once");
    assert!(guard.is_held());
    assert!(
        !locks.waive_restart_quarantine().await.unwrap(),
        "nothing left to waive"
    );
    // A server that has no epoch yet gets one without a quarantine.
    let _: i64 = server.cmd(&["DEL", "lock:epoch"]);
    assert!(locks.waive_restart_quarantine().await.unwrap());
    let epoch: String = server.cmd(&["GET", "lock:epoch"]);
    // No quarantine and no lease yet, then the life of the process that wrote it.
    let fields: Vec<&str> = epoch.split(' ').collect();
    assert_eq!(fields[1..3], ["0", "0"], "{epoch}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_longer_than_a_lease_tells_the_holder_and_leaks_nothing() {
    let mut server = RedisServer::start();
    let port = server.port();
    let lease = Duration::from_millis(900);
    let holder = support::client_with_lease(&server.url(), lease).await;
    let held = holder.lock("outage").unwrap().acquire().await.unwrap();
    let lost = watch_lost(&held);
    server.kill();
    let killed_at = Instant::now();
    let (lost_at, reason) = lost.await.unwrap();
    assert_eq!(reason, LostReason::Unreachable);
    assert!(
        lost_at - killed_at < lease,
        "told before the lease would have run out"
    );
    tokio::time::sleep(lease).await;

    let restarted = RedisServer::start_on(port);
    assert!(held.release().await.is_err(), "nothing to release");
    let again = holder
        .lock("outage")
        .unwrap()
        .acquire_timeout(Duration::from_secs(5) + SLACK)
        .await
        .expect("the lock is free once Redis is back and the quarantine is over");
    again.release().await.unwrap();
    let left: Vec<String> = restarted.cmd(&["KEYS", "lock:{*}"]);
    assert!(
        left.iter().all(|key| key.ends_with(":fence")),
        "only the last granted token block stays: {left:?}"
    );
}

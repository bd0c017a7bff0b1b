//! The quarantine after Redis lost its data, and the lease, as users meet them: a quarantine
//! that covers every lease (fixed ones included) and is counted from the server's start, a
//! server up longer than it that grants its first lock at once, a wait that cannot outlast it
//! that fails at once with the time left, losses without a restart that Redis shows, and
//! grants from the queue that hold the whole lease asked for from the moment their holder is
//! told. Real servers; faults through the fault proxy, `kill` and `FLUSHALL`.

mod support;

use std::time::{Duration, Instant};

use support::clock::FakeClock;
use support::proxy::FaultProxy;
use support::{RedisServer, eventually};
use tower_redis_lock::{ErrorKind, Lease, LockClient, LockClientBuilder, LockGuard, LostReason};

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

/// A client of `url` with the lease limit `limit` (the restart quarantine), a watchdog lease
/// within it and 500 ms command timeouts, so an unreachable Redis is noticed in time.
fn limited(url: &str, limit: Duration) -> LockClientBuilder {
    LockClient::builder(url)
        .lease_limit(limit)
        .watchdog_lease(Duration::from_secs(2).min(limit))
        .command_timeout(Duration::from_millis(500))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_of_a_fixed_lease_is_told_before_a_server_restarted_empty_grants_its_lock()
{
    let mut server = RedisServer::start();
    let port = server.port();
    let proxy = FaultProxy::start(port).await;
    // Every client of the Redis keeps to one limit; the fixed lease is the longest it allows,
    // far longer than the watchdog leases of both clients.
    let limit = Duration::from_secs(9);
    let holder = limited(&proxy.url(), limit).build().await.unwrap();
    let held = holder
        .lock("order")
        .unwrap()
        .with_lease(Lease::Fixed(limit))
        .acquire()
        .await
        .unwrap();
    let lost = watch_lost(&held);

    // The holder is cut off (its requests reach nobody, nothing comes back), and Redis
    // restarts without its data. A client that never used this Redis comes first.
    proxy.black_hole();
    server.kill();
    let _restarted = RedisServer::start_on(port);
    let restarted_at = Instant::now();
    let fresh = limited(&server.url(), limit).build().await.unwrap();
    let taken = fresh
        .lock("order")
        .unwrap()
        .acquire_timeout(limit + SLACK * 2)
        .await
        .expect("the lock is granted once the quarantine is over");
    let taken_at = Instant::now();

    let (lost_at, reason) = lost.await.unwrap();
    assert_eq!(reason, LostReason::Expired);
    assert!(
        lost_at < taken_at,
        "the cut-off holder was told {:?} after the restart, the lock granted again after {:?}",
        lost_at - restarted_at,
        taken_at - restarted_at
    );
    assert!(
        taken_at - restarted_at >= limit - Duration::from_millis(100),
        "nobody gets a lock of the restarted Redis before it has been up the lease limit: \
         granted after {:?}",
        taken_at - restarted_at
    );
    assert!(
        taken.fencing_token() > held.fencing_token(),
        "tokens keep growing"
    );
    proxy.heal();
}

#[tokio::test]
async fn a_fixed_lease_longer_than_the_lease_limit_is_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let locks = limited(&server.url(), Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let err = locks
        .lock("long")
        .unwrap()
        .with_lease(Lease::Fixed(Duration::from_secs(6)))
        .acquire()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("lease limit"), "{err}");
    assert_eq!(server.keys_besides_epoch(), 0, "nothing written");
    let err = LockClient::builder(&server.url())
        .lease_limit(Duration::from_secs(5))
        .watchdog_lease(Duration::from_secs(6))
        .build()
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
}

#[tokio::test]
async fn a_server_up_longer_than_the_lease_limit_grants_its_first_lock_at_once() {
    let limit = Duration::from_secs(2);
    // A new server with no epoch, up longer than the limit (its uptime counts whole seconds,
    // from a start rounded down: one more than the limit's).
    let server = RedisServer::start_without_epoch();
    server.wait_until_up_for(limit.as_secs() + 2);
    let locks = limited(&server.url(), limit).build().await.unwrap();

    let guard = locks
        .lock("first")
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .expect("granted at once, with no waiver");
    assert!(guard.is_held());
    assert_eq!(locks.restart_quarantine_left(), None);
    let epoch: String = server.cmd(&["GET", "lock:epoch"]);
    assert_eq!(
        epoch.split(' ').nth(1),
        Some("0"),
        "an epoch with no quarantine: {epoch}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_persistence_is_quarantined_from_the_servers_start_and_a_short_wait_fails_at_once()
 {
    let mut server = RedisServer::start();
    let port = server.port();
    // Up 4 s when the lock is asked for, 6 s left: a reconnection slowed by a busy machine
    // still leaves more than the 2 s wait.
    let limit = Duration::from_secs(10);
    let locks = limited(&server.url(), limit).build().await.unwrap();
    let lock = locks.lock("restarted").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    server.kill();
    let restarted = RedisServer::start_on(port);
    // The first lock is asked for a while after the start, not at it.
    restarted.wait_until_up_for(4);
    let wait = Duration::from_secs(2);
    let asked_at = Instant::now();
    let err = lock.acquire_timeout(wait).await.unwrap_err();
    let answered_in = asked_at.elapsed();
    assert_eq!(err.kind(), ErrorKind::RestartQuarantine, "{err}");
    let left = err.retry_after().expect("the error tells the time left");
    // Up at least 3 s of the 10: at most 7 s left, where a quarantine counted from the first
    // use would have 10.
    assert!(
        left <= limit - Duration::from_secs(3),
        "counted from the server's start: {left:?} left"
    );
    assert!(left > wait, "the wait cannot outlast it: {left:?}");
    // Generous for a shared machine, and still well short of the 2 s wait a failure at the
    // bound would take.
    assert!(
        answered_in < Duration::from_millis(1500),
        "a wait that cannot outlast the quarantine fails at once, not at its bound: \
         {answered_in:?}"
    );
    assert!(
        locks
            .restart_quarantine_left()
            .is_some_and(|now| now <= left),
        "the client knows it too"
    );

    // It ends when the server has been up the limit.
    let guard = lock.acquire_timeout(left + SLACK).await.unwrap();
    assert!(guard.is_held());
    assert!(restarted.uptime_seconds() >= limit.as_secs() - 1);
}

#[tokio::test]
async fn a_server_whose_clock_stepped_back_past_its_start_is_quarantined_the_whole_limit() {
    let limit = Duration::from_secs(2);
    let clock = FakeClock::new();
    let server = RedisServer::start_with_clock(&clock, 0, &[]);
    // The server's own clock goes back a minute: its uptime, which it counts on that clock,
    // is negative, and tells nothing of how long it has been up.
    clock.step_back(Duration::from_secs(60));
    assert!(
        eventually(SLACK, || server
            .cmd::<String>(&["INFO", "server"])
            .contains("uptime_in_seconds:-"))
        .await,
        "the step shows in the server's uptime"
    );
    let locks = limited(&server.url(), limit).build().await.unwrap();
    let lock = locks.lock("stepped").unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none(), "quarantined");
    let left = locks.restart_quarantine_left().expect("a quarantine runs");
    assert!(left > limit - Duration::from_millis(500), "{left:?}");
}

#[tokio::test]
async fn a_flush_on_a_server_up_longer_than_the_limit_is_quarantined_from_when_it_is_found() {
    let limit = Duration::from_secs(2);
    let server = RedisServer::start();
    server.wait_until_up_for(limit.as_secs() + 2);
    let locks = limited(&server.url(), limit).build().await.unwrap();
    let _held = locks.lock("flushed").unwrap().acquire().await.unwrap();

    let _: () = server.cmd(&["FLUSHALL"]);
    let lock = locks.lock("after").unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none(), "quarantined");
    let left = locks.restart_quarantine_left().expect("a quarantine runs");
    assert!(
        left > limit - Duration::from_millis(500),
        "the whole limit from the flush, although the server is up longer: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_running_replica_promoted_after_a_full_sync_from_an_emptied_master_is_quarantined() {
    let limit = Duration::from_secs(2);
    let mut master = RedisServer::start();
    let master_port = master.port();
    let replica = master.start_replica(master_port);
    replica.wait_until_up_for(limit.as_secs() + 2);
    let epoch: Option<String> = replica.cmd(&["GET", "lock:epoch"]);
    assert!(epoch.is_some(), "the replica has the master's epoch");

    // The master restarts empty; the replica syncs in full from it and is emptied too.
    master.kill();
    let _master = RedisServer::start_on(master_port);
    assert!(
        eventually(Duration::from_secs(20), || {
            replica
                .cmd::<Option<String>>(&["GET", "lock:epoch"])
                .is_none()
                && replica
                    .cmd::<String>(&["INFO", "replication"])
                    .contains("master_link_status:up")
        })
        .await,
        "the replica synced from the emptied master"
    );
    let _: () = replica.cmd(&["REPLICAOF", "NO", "ONE"]);

    let locks = limited(&replica.url(), limit).build().await.unwrap();
    assert!(
        locks
            .lock("promoted")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "quarantined, although the server is up longer than the limit"
    );
    let left = locks.restart_quarantine_left().expect("a quarantine runs");
    assert!(left > limit - Duration::from_millis(500), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_from_the_queue_holds_the_whole_lease_through_a_redis_pause() {
    let server = RedisServer::start();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let held = holder.lock("paused").unwrap().acquire().await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock("paused").unwrap().acquire().await.unwrap();
        (waiter, guard)
    });
    assert!(
        eventually(SLACK, || !support::queued(&server, "paused").is_empty()).await,
        "the waiter queued"
    );
    held.release().await.unwrap();
    let (_waiter, granted) = waiting.await.unwrap();
    let lost = granted.lost_signal();
    let left_at_grant: i64 = server.cmd(&["PTTL", "lock:{paused}"]);

    // A stall of Redis right after the grant, shorter than the lease and longer than any
    // short claim would be.
    server.pause_for(Duration::from_millis(2700));
    assert_eq!(lost.reason(), None, "no lost signal");
    assert!(granted.is_held(), "still held");
    assert!(
        left_at_grant > 25_000,
        "the default 30 s lease from the grant on, not a short claim: {left_at_grant} ms"
    );
    let left: i64 = server.cmd(&["PTTL", "lock:{paused}"]);
    assert!(left > 20_000, "{left} ms left after the pause");
    granted.release().await.expect("released by its holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_clients_that_find_their_grants_by_a_look_are_told_nothing_lost() {
    const TRIALS: usize = 10;
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let names: Vec<String> = (0..TRIALS).map(|trial| format!("look-{trial}")).collect();
    let mut held = Vec::new();
    for name in &names {
        held.push(holder.lock(name).unwrap().acquire().await.unwrap());
    }
    // One new client per trial, each waiting for its own lock: the first lock of each.
    let mut waiting = Vec::new();
    for name in names.clone() {
        let fresh = LockClient::connect(&proxy.url()).await.unwrap();
        waiting.push(tokio::spawn(async move {
            let guard = fresh.lock(&name).unwrap().acquire().await.unwrap();
            (fresh, guard)
        }));
    }
    assert!(
        eventually(SLACK, || names
            .iter()
            .all(|name| !support::queued(&server, name).is_empty()))
        .await,
        "every fresh client queued"
    );
    // The grants' messages are held back: each waiter finds its grant by its next look.
    proxy.hold_pubsub();
    for guard in held {
        guard.release().await.unwrap();
    }
    let mut granted = Vec::new();
    for waiting in waiting {
        granted.push(waiting.await.unwrap());
    }
    proxy.release_pubsub();

    // An observation window past any short claim and a few watchdog ticks (there is no
    // signal for nothing happening): nobody is told anything.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let told: Vec<(usize, LostReason)> = granted
        .iter()
        .enumerate()
        .filter_map(|(trial, (_, guard))| guard.lost_signal().reason().map(|why| (trial, why)))
        .collect();
    assert_eq!(told, [], "trials told their lock was lost, and why");
    for (fresh, guard) in granted {
        assert!(guard.is_held());
        guard.release().await.unwrap();
        drop(fresh);
    }
}

/// The witness of a server's promotion (one per server; one per slot on a cluster).
const WITNESS: &str = "tower-redis-lock:promoted";

/// The replication id `server` serves under now.
fn replication_id(info: &str) -> String {
    info.lines()
        .find_map(|line| line.trim_end().strip_prefix("master_replid:"))
        .expect("INFO replication tells the replication id")
        .to_owned()
}

/// A replica of a new server, promoted (`REPLICAOF NO ONE`) and up longer than `limit`: a
/// master with a previous replication id, whose uptime alone would start no quarantine.
async fn promoted_replica(limit: Duration) -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let replica = master.start_replica(master.port());
    let _: () = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    replica.wait_until_up_for(limit.as_secs() + 2);
    (master, replica)
}

/// Waits until the witness on `server` vouches for its current replication id.
async fn vouched_for(server: &RedisServer, witness: &str, limit: Duration) -> bool {
    let id = replication_id(&server.cmd::<String>(&["INFO", "replication"]));
    let expected = format!("{id} {}", limit.as_millis());
    // The lease limit by the client's clock, a look a quarter of it later, and room for a
    // busy machine.
    eventually(limit + Duration::from_secs(20), || {
        server.cmd::<Option<String>>(&["GET", witness]).as_deref() == Some(expected.as_str())
    })
    .await
}

/// A client of `url` with the lease limit `limit`, under a prefix no lock has used yet.
async fn with_new_prefix(url: &str, limit: Duration) -> LockClient {
    limited(url, limit)
        .key_prefix("fresh:")
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_seen_for_the_lease_limit_quarantines_no_new_prefix() {
    let limit = Duration::from_secs(2);
    let (_master, promoted) = promoted_replica(limit).await;
    let running = limited(&promoted.url(), limit).build().await.unwrap();
    assert!(
        vouched_for(&promoted, WITNESS, limit).await,
        "a client that saw the promoted master for the lease limit vouched for it"
    );

    // A prefix never used on this server (nor on the one it replicated).
    let fresh = with_new_prefix(&promoted.url(), limit).await;
    let granted = fresh.lock("first").unwrap().try_acquire().await.unwrap();
    assert!(
        granted.is_some(),
        "a new prefix's first lock is granted at once"
    );
    assert_eq!(fresh.restart_quarantine_left(), None, "no quarantine");
    drop(running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_promotion_is_quarantined_though_an_earlier_one_was_vouched_for() {
    let limit = Duration::from_secs(2);
    let (_master, first) = promoted_replica(limit).await;
    let second = first.start_replica(first.port());
    let running = limited(&first.url(), limit).build().await.unwrap();
    assert!(
        vouched_for(&first, WITNESS, limit).await,
        "first vouched for"
    );
    let _: i64 = first.cmd(&["WAIT", "1", "5000"]);
    let copied: Option<String> = second.cmd(&["GET", WITNESS]);
    assert!(copied.is_some(), "its replica has the witness");

    // The replica is promoted; the first master, cut off from it, grants a lock in a new
    // prefix: the write a failover loses.
    let _: () = second.cmd(&["REPLICAOF", "NO", "ONE"]);
    second.wait_until_up_for(limit.as_secs() + 2);
    let old_side = with_new_prefix(&first.url(), limit).await;
    let held = old_side.lock("job").unwrap().try_acquire().await.unwrap();
    assert!(held.is_some(), "granted on the first master");

    let new_side = with_new_prefix(&second.url(), limit).await;
    let taken = new_side.lock("job").unwrap().try_acquire().await.unwrap();
    assert!(
        taken.is_none(),
        "quarantined: the witness names the first promotion, not this one"
    );
    let left = new_side
        .restart_quarantine_left()
        .expect("a quarantine runs");
    assert!(left > limit - Duration::from_millis(500), "{left:?}");
    drop(running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_cluster_master_seen_for_the_lease_limit_quarantines_no_unused_slot() {
    let limit = Duration::from_secs(2);
    let cluster = support::cluster::RedisCluster::start_with_replicas(3, 1);
    let master = cluster.masters()[0];
    let replica = cluster.replica_of(master);
    // A write the replica receives first: a replica that never received one may have no
    // backlog, and once promoted takes a new replication id without the previous one when
    // its old master asks it for a full sync (Valkey).
    let written = (0..)
        .map(|n| format!("before-{n}"))
        .find(|key| cluster.node_of(key) == master)
        .unwrap();
    let () = cluster.cmd(master, &["SET", &written, "1"]);
    let _: i64 = cluster.cmd(master, &["WAIT", "1", "5000"]);
    assert!(
        cluster.planned_failover(replica).await,
        "the replica took over"
    );
    assert!(
        eventually(Duration::from_secs(20), || {
            cluster
                .cmd::<String>(master, &["INFO", "replication"])
                .contains("master_link_status:up")
        })
        .await,
        "the old master follows it"
    );
    let replication: String = cluster.cmd(replica, &["INFO", "replication"]);
    assert!(
        !replication.contains(&format!("master_replid2:{}", "0".repeat(40))),
        "a master with a previous replication id: {replication}"
    );
    cluster.wait_until_up_for(replica, limit.as_secs() + 2);
    let cluster_client = |prefix: &str| {
        LockClient::builder_cluster(cluster.urls())
            .key_prefix(prefix)
            .lease_limit(limit)
            .watchdog_lease(limit)
            .build()
    };
    let running = cluster_client("lock:").await.unwrap();

    // A lock whose slot the promoted master serves, and which no lock has used.
    let name = (0..)
        .map(|n| format!("job-{n}"))
        .find(|name| cluster.node_of(&format!("fresh:{{{name}}}")) == replica)
        .unwrap();
    let slot = cluster.slot_of(&format!("fresh:{{{name}}}"));
    assert!(
        eventually(limit + Duration::from_secs(30), || {
            cluster
                .keys_in_slot(replica, slot)
                .iter()
                .any(|key| key.starts_with(WITNESS))
        })
        .await,
        "the slot's witness was written"
    );

    let fresh = cluster_client("fresh:").await.unwrap();
    let granted = fresh.lock(&name).unwrap().try_acquire().await.unwrap();
    assert!(
        granted.is_some(),
        "the unused slot's first lock is granted at once"
    );
    assert_eq!(fresh.restart_quarantine_left(), None, "no quarantine");
    drop(running);
}

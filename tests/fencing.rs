//! Fencing tokens against real servers: per lock name they strictly increase across steps of
//! the server's wall clock in either direction, a restart from its append-only file with the
//! clock behind, the promotion of a replica whose clock is behind, and a token counter that
//! went back (a failover to a replica that missed the last reservations); and no lock name
//! leaves a key behind for good.
//!
//! Server clocks are moved by `support/clock_shim.c` (LD_PRELOAD), which steps the wall
//! clock of `redis-server` / `valkey-server` and leaves their monotonic clock alone.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use support::clock::FakeClock;
use support::cluster::RedisCluster;
use support::proxy::FaultProxy;
use support::{RedisServer, client, eventually, queued};
use tower_redis_lock::{ErrorKind, LockClient, MAX_LOCAL_HANDOVER_LIMIT};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(5);

/// Bound for a new replica's first sync (generous: shared, busy machines).
const CATCH_UP: Duration = Duration::from_secs(30);

/// An hour: a large NTP step, or a clock set by hand.
const HOUR: Duration = Duration::from_secs(3600);

/// Takes and releases `name` on `locks` and returns its token.
async fn token_of(locks: &LockClient, name: &str) -> u64 {
    let guard = locks.lock(name).unwrap().acquire().await.unwrap();
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    token
}

#[tokio::test]
async fn tokens_keep_growing_when_the_token_counter_goes_back() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let first = a.lock("rolled").unwrap().acquire().await.unwrap();
    let token = first.fencing_token();
    // A failover to a replica that missed the lock and its last reservations: the lock is
    // gone and the counter is back where it was a while ago; the epoch key survived. The
    // server clock, past every token handed out, keeps the next one growing.
    let _: i64 = server.cmd(&["DEL", "lock:{rolled}"]);
    let _: i64 = server.cmd(&["DECRBY", "lock:tokens", "1000000"]);
    let second = b.lock("rolled").unwrap().acquire().await.unwrap();
    assert!(
        second.fencing_token() > token,
        "a token after the rollback ({}) is above every earlier one ({token})",
        second.fencing_token()
    );
}

#[tokio::test]
async fn tokens_keep_growing_across_clock_steps_of_either_direction() {
    let clock = FakeClock::new();
    let server = RedisServer::start_with_clock(&clock, 0, &[]);
    server.provision_epoch("lock:");
    let locks = client(&server).await;
    let mut last = token_of(&locks, "stepped").await;
    // An NTP step forward and its correction, then a clock set an hour behind, then forward
    // again: after each, the next token of the name is above every earlier one.
    for (step, forward) in [(HOUR, true), (HOUR, false), (HOUR, false), (HOUR, true)] {
        if forward {
            clock.step_forward(step);
        } else {
            clock.step_back(step);
        }
        await_server_clock_off_by(&server, clock.offset()).await;
        for _ in 0..3 {
            let token = token_of(&locks, "stepped").await;
            assert!(
                token > last,
                "after the clock moved to {} µs off, token {token} is not above {last}",
                clock.offset()
            );
            last = token;
        }
    }
}

#[tokio::test]
async fn tokens_keep_growing_across_a_restart_from_the_append_only_file_with_the_clock_behind() {
    let clock = FakeClock::new();
    let dir = tempdir("aof");
    let files = [
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        &dir,
    ];
    let mut server = RedisServer::start_with_clock(&clock, 0, &files);
    server.provision_epoch("lock:");
    let port = server.port();
    let locks = client(&server).await;
    let before = token_of(&locks, "persisted").await;
    drop(locks);
    server.kill();
    // The server comes back from its file with its clock a minute behind.
    clock.step_back(Duration::from_secs(60));
    let server = RedisServer::start_with_clock(&clock, port, &files);
    await_server_clock_off_by(&server, clock.offset()).await;
    let locks = client(&server).await;
    let after = tokio::time::timeout(SLACK, token_of(&locks, "persisted"))
        .await
        .expect("the restarted server kept its epoch: no quarantine");
    assert!(after > before, "{after} <= {before} after the restart");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn tokens_keep_growing_when_a_replica_whose_clock_is_behind_is_promoted() {
    // No delay before the first sync (Redis and Valkey wait 5 s for more replicas by default).
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    // A minute behind: far more than this test takes, so the old clock-only tokens would
    // certainly go back.
    let replica_clock = FakeClock::new();
    replica_clock.step_back(Duration::from_secs(60));
    let master_port = master.port().to_string();
    let replica = RedisServer::start_with_clock(
        &replica_clock,
        0,
        &["--replicaof", "127.0.0.1", &master_port],
    );
    await_server_clock_off_by(&replica, replica_clock.offset()).await;
    let locks = client(&master).await;
    let mut before = 0;
    for _ in 0..20 {
        before = token_of(&locks, "promoted").await;
    }
    // The replica has every write (the counter is where the master's is) when the master
    // dies and it is promoted.
    assert!(
        eventually(CATCH_UP, || repl_offset(&replica) == repl_offset(&master)).await,
        "the replica never caught up"
    );
    drop(locks);
    drop(master);
    let _: () = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    let promoted = client(&replica).await;
    let after = token_of(&promoted, "promoted").await;
    assert!(after > before, "{after} <= {before} after the promotion");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_names_leave_no_key_without_an_expiry() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let names: Vec<String> = (0..10_000).map(|i| format!("order-{i}")).collect();
    for chunk in names.chunks(200) {
        join_all(chunk.iter().map(|name| {
            let lock = locks.lock(name).unwrap();
            async move { lock.acquire().await.unwrap().release().await.unwrap() }
        }))
        .await;
    }
    // Each lock was found free: it leaves nothing behind but the token counter of its scope.
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert_eq!(
        server.keys_besides_epoch(),
        0,
        "{:?}",
        &keys[..keys.len().min(5)]
    );
    // The server's epoch key and its marker must outlive everything: they are how a loss is
    // noticed; so must the token counter, which keeps tokens growing.
    let forever: Vec<&String> = keys
        .iter()
        .filter(|key| !key.starts_with("lock:epoch") && *key != "lock:tokens")
        .filter(|key| server.cmd::<i64>(&["PTTL", key]) < 0)
        .collect();
    assert!(
        forever.is_empty(),
        "keys without an expiry: {:?}",
        &forever[..forever.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_keep_growing_when_a_slot_migrates_to_a_master_whose_clock_is_behind() {
    // Three masters; the third's clock a minute behind the others'.
    let clocks = [FakeClock::new(), FakeClock::new(), FakeClock::new()];
    clocks[2].step_back(Duration::from_secs(60));
    let cluster = RedisCluster::start_with_clocks(&clocks);
    cluster.provision_epochs().await;
    let behind = cluster.ports()[2];
    await_clock_off_by(|| cluster.cmd(behind, &["TIME"]), clocks[2].offset()).await;
    // A lock whose slot a master on time serves.
    let name = (0..)
        .map(|n| format!("migrating-{n}"))
        .find(|name| cluster.node_of(&format!("lock:{{{name}}}")) != behind)
        .expect("some name hashes to a master on time");
    let key = format!("lock:{{{name}}}");
    let (slot, from) = (cluster.slot_of(&key), cluster.node_of(&key));
    let locks = LockClient::builder_cluster(cluster.urls())
        .build()
        .await
        .expect("cluster client");
    let mut before = 0;
    for _ in 0..5 {
        before = token_of(&locks, &name).await;
    }
    // The slot, its token counter and epoch with it, moves to the master a minute behind.
    cluster.migrate_slot(slot, from, behind);
    assert_eq!(cluster.node_of(&key), behind);
    let after = tokio::time::timeout(SLACK * 4, token_of(&locks, &name))
        .await
        .expect("the lock is taken on its new master");
    assert!(after > before, "{after} <= {before} after the migration");
}

#[tokio::test]
async fn a_counter_ahead_of_the_clock_is_followed_and_never_expires() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    // A counter a minute past the server clock, as a clock that stepped back leaves it.
    let (seconds, micros): (u64, u64) = server.cmd(&["TIME"]);
    let ahead = seconds * 1_000_000 + micros + 60_000_000;
    let () = server.cmd(&["SET", "lock:tokens", &ahead.to_string()]);
    let token = token_of(&locks, "ahead").await;
    assert_eq!(token, ahead + 1);
    assert_eq!(server.cmd::<i64>(&["PTTL", "lock:tokens"]), -1);
    assert!(token_of(&locks, "ahead").await > token);
}

#[tokio::test]
async fn tokens_keep_growing_across_a_force_unlock() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let held = a.lock("seized").unwrap().acquire().await.unwrap();
    assert!(b.lock("seized").unwrap().force_unlock().await.unwrap());
    let next = b.lock("seized").unwrap().acquire().await.unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    drop(held);
}

#[tokio::test]
async fn a_local_hand_over_limit_past_its_bound_is_refused() {
    let server = RedisServer::start();
    let refused = LockClient::builder(&server.url())
        .local_handover_limit(MAX_LOCAL_HANDOVER_LIMIT + 1)
        .build()
        .await
        .expect_err("a block of more than a millisecond of the clock was accepted");
    assert_eq!(refused.kind(), ErrorKind::InvalidConfig);
    LockClient::builder(&server.url())
        .local_handover_limit(MAX_LOCAL_HANDOVER_LIMIT)
        .build()
        .await
        .expect("the bound itself is allowed");
}

/// A grant the waiter hears only after it lapsed, and after a look that found the lock held by
/// another: the server's clock stepped back between the grant and that look, so the grant's
/// server time is later than the look's. It must be refused as the stale grant it is (its
/// token is older than the holder's), never handed out while another client holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_heard_after_it_lapsed_is_refused_though_the_servers_clock_stepped_back() {
    /// The waiter's lease: its grant lapses while its message is held back.
    const WAITER_LEASE: Duration = Duration::from_millis(1000);
    /// The waiter looks again only this long after its first look, with the lock taken by
    /// then (the holder's lease is far longer, so this bound is the waiter's nap).
    const REPOLL: Duration = Duration::from_secs(4);
    let clock = FakeClock::new();
    let server = RedisServer::start_with_clock(&clock, 0, &[]);
    server.provision_epoch("lock:");
    let proxy = FaultProxy::start(server.port()).await;
    let holder = client(&server).await;
    let waiter = LockClient::builder(&proxy.url())
        .watchdog_lease(WAITER_LEASE)
        .repoll_interval(REPOLL)
        .build()
        .await
        .unwrap();
    let first = holder.lock("late").unwrap().acquire().await.unwrap();
    let lock = waiter.lock("late").unwrap();
    let mut waiting = tokio::spawn(async move { lock.acquire_timeout(SLACK * 10).await });
    assert!(eventually(SLACK, || queued(&server, "late").len() == 1).await);
    assert!(eventually(SLACK, || proxy.subscribed_connections() == 1).await);

    // The grant to the waiter is published while its messages are held back, and lapses.
    proxy.hold_pubsub();
    first.release().await.unwrap();
    let taken = match holder.lock("late").unwrap().acquire_timeout(SLACK).await {
        Ok(taken) => taken,
        // What Redis holds then, for a failure seen once in CI (not reproduced since).
        Err(err) => panic!(
            "the lapsed grant frees the lock for the holder's client: {err:?}; the lock \
             {:?} with {} ms left, queued {:?}, the waiter finished: {}",
            server.cmd::<Vec<String>>(&["HGETALL", "lock:{late}"]),
            server.cmd::<i64>(&["PTTL", "lock:{late}"]),
            queued(&server, "late"),
            waiting.is_finished(),
        ),
    };
    let taken_token = taken.fencing_token();
    assert!(!waiting.is_finished(), "the waiter heard nothing yet");

    // The clock steps back; the waiter's next look finds the lock held and queues again.
    clock.step_back(Duration::from_secs(30));
    await_server_clock_off_by(&server, clock.offset()).await;
    assert!(
        eventually(REPOLL + SLACK, || queued(&server, "late").len() == 1).await,
        "the waiter looked again and queued behind the holder"
    );
    proxy.release_pubsub();

    // The old grant now arrives: the waiter keeps waiting while the holder holds the lock.
    let early = tokio::time::timeout(SLACK, &mut waiting).await;
    if let Ok(result) = early {
        let guard = result.unwrap().unwrap();
        panic!(
            "the waiter holds token {} while the holder holds {taken_token}",
            guard.fencing_token()
        );
    }
    taken.release().await.unwrap();
    let guard = tokio::time::timeout(SLACK, waiting)
        .await
        .expect("the waiter gets the lock once it is free")
        .unwrap()
        .unwrap();
    assert!(
        guard.fencing_token() > taken_token,
        "{} after {taken_token}",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
}

/// Waits until the server's wall clock (TIME) is `offset_us` off the real one, within a
/// second (every step here is larger), and fails when it is not within `SLACK`: the shim
/// works, so a test that passes is not passing on a clock that never moved. Valkey reads the
/// clock into a cache that a command may find a few milliseconds old, hence the wait.
async fn await_server_clock_off_by(server: &RedisServer, offset_us: i64) {
    await_clock_off_by(|| server.cmd(&["TIME"]), offset_us).await;
}

/// [`await_server_clock_off_by`] for any server: `time` runs its TIME.
async fn await_clock_off_by(time: impl Fn() -> (i64, i64), offset_us: i64) {
    let off = || {
        let (seconds, micros) = time();
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is past 1970")
            .as_micros() as i64;
        seconds * 1_000_000 + micros - real
    };
    assert!(
        eventually(SLACK, || (off() - offset_us).abs() < 1_000_000).await,
        "the server clock is {} µs off, not {offset_us}",
        off()
    );
}

/// How far a server is in its replication stream (a replica: how far it applied it).
fn repl_offset(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "replication"]);
    info.lines()
        .find_map(|line| line.strip_prefix("master_repl_offset:"))
        .and_then(|offset| offset.trim().parse().ok())
        .expect("INFO replication has master_repl_offset")
}

/// A directory of its own for a server's files.
fn tempdir(what: &str) -> String {
    let dir = std::env::temp_dir().join(format!(
        "tower-redis-lock-{what}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("a directory for the server's files");
    dir.display().to_string()
}

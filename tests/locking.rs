//! Lock semantics against a real redis-server: mutual exclusion, reentrancy, leases, the
//! watchdog, lost signals, fencing tokens and names.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::AsyncCommands;
use support::{RedisServer, client};
use tower_redis_lock::{ErrorKind, Lease, LockClient, LostReason, MAX_NAME_LEN};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_clients_of_eight_tasks_never_overlap_on_one_key() {
    const CLIENTS: usize = 4;
    const TASKS: usize = 8;
    const ROUNDS: usize = 25;
    let server = RedisServer::start();
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let locks = client(&server).await;
        for _ in 0..TASKS {
            let lock = locks.lock("counter").unwrap();
            let (inside, overlaps) = (inside.clone(), overlaps.clone());
            let mut data = redis::Client::open(server.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = lock.acquire_timeout(Duration::from_secs(60)).await.unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    // A deliberately non-atomic read-modify-write: only the lock keeps it whole.
                    let value: Option<u64> = data.get("data:counter").await.unwrap();
                    tokio::task::yield_now().await;
                    let () = data
                        .set("data:counter", value.unwrap_or(0) + 1)
                        .await
                        .unwrap();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let counter: u64 = server.cmd(&["GET", "data:counter"]);
    assert_eq!(counter, (CLIENTS * TASKS * ROUNDS) as u64);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn reentry_counts_holds_and_only_the_last_release_frees_the_lock() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let lock = holder.lock("reentrant").unwrap();
    let rival = other.lock("reentrant").unwrap();

    let first = lock.acquire().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    let second = first.reenter().await.unwrap();
    let third = second.reenter().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 3);
    assert_eq!(second.fencing_token(), first.fencing_token());
    assert_eq!(third.owner_id(), first.owner_id());
    let state = lock.inspect().await.unwrap();
    assert_eq!(state.holders, vec![(first.owner_id().to_owned(), 3)]);
    assert!(rival.try_acquire().await.unwrap().is_none());

    let token = first.fencing_token();
    first.release().await.unwrap();
    third.release().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    assert!(rival.try_acquire().await.unwrap().is_none());
    second.release().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());

    let next = rival
        .try_acquire()
        .await
        .unwrap()
        .expect("free after the last release");
    assert!(next.fencing_token() > token);
}

#[tokio::test]
async fn a_fixed_lease_runs_out_fires_lost_and_frees_the_lock() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let lease = Duration::from_millis(300);
    let guard = holder
        .lock("fixed")
        .unwrap()
        .with_lease(Lease::Fixed(lease))
        .acquire()
        .await
        .unwrap();
    let ttl = holder
        .lock("fixed")
        .unwrap()
        .remaining_ttl()
        .await
        .unwrap()
        .unwrap();
    assert!(ttl <= lease);

    let reason = tokio::time::timeout(lease + SLACK, guard.lost_signal().lost())
        .await
        .expect("the lost signal fires when the fixed lease runs out");
    assert_eq!(reason, LostReason::Expired);
    assert!(!guard.is_held());
    // The holder's own client does not queue behind the guard that lost its lease.
    let same_client = support::acquire_within(
        &holder,
        "fixed",
        SLACK,
        "the lost guard gave up its local turn",
    )
    .await;
    same_client.release().await.unwrap();
    let next = support::acquire_within(&other, "fixed", SLACK, "free once the lease ran out").await;
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::NotOwner
    );
    next.release().await.unwrap();
}

#[tokio::test]
async fn the_watchdog_keeps_a_lock_past_several_leases() {
    let server = RedisServer::start();
    // Renewed every 0.5 s and told lost 1.35 s after the last: a stall of a busy machine's
    // runtime or Redis under 0.8 s costs no renewal.
    let lease = Duration::from_millis(1500);
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(lease)
        .build()
        .await
        .unwrap();
    let other = client(&server).await;
    let guard = holder.lock("renewed").unwrap().acquire().await.unwrap();
    // Time passing is what is under test: four leases without the watchdog would free it.
    tokio::time::sleep(lease * 4).await;
    assert!(guard.is_held());
    assert!(!guard.lost_signal().is_lost());
    assert!(
        other
            .lock("renewed")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let ttl = other
        .lock("renewed")
        .unwrap()
        .remaining_ttl()
        .await
        .unwrap();
    assert!(ttl.is_some_and(|ttl| ttl <= lease));
    guard.release().await.unwrap();
    assert!(!other.lock("renewed").unwrap().is_locked().await.unwrap());
}

#[tokio::test]
async fn an_external_delete_fires_lost_within_one_renewal_interval() {
    let server = RedisServer::start();
    let interval = Duration::from_millis(300);
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(interval * 3)
        .build()
        .await
        .unwrap();
    let guard = holder.lock("deleted").unwrap().acquire().await.unwrap();
    let lost = guard.lost_signal();
    let () = server.cmd(&["DEL", "lock:{deleted}"]);
    // The next renewal tick (at most one interval away) finds the key gone.
    let reason = tokio::time::timeout(interval + SLACK, lost.lost())
        .await
        .expect("lost fires at the next renewal");
    assert_eq!(reason, LostReason::Taken);
    assert!(!guard.is_held());
}

#[tokio::test]
async fn an_unreachable_redis_fires_lost_before_the_lease_would_end() {
    let mut server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let holder = LockClient::builder(&server.url())
        .watchdog_lease(lease)
        .command_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let guard = holder.lock("cut-off").unwrap().acquire().await.unwrap();
    server.kill();
    let reason = tokio::time::timeout(lease + SLACK, guard.lost_signal().lost())
        .await
        .expect("lost fires when no renewal can reach redis");
    assert_eq!(reason, LostReason::Unreachable);
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::RedisUnavailable
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_across_clients() {
    let server = RedisServer::start();
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let locks = client(&server).await;
        for _ in 0..4 {
            let (lock, tokens) = (locks.lock("fenced").unwrap(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let guard = lock.acquire().await.unwrap();
                    // Pushed inside the critical section, so the order is the lock's order.
                    tokens.lock().unwrap().push(guard.fencing_token());
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), 120);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
}

#[tokio::test]
async fn fencing_tokens_keep_growing_after_redis_loses_its_data() {
    let mut server = RedisServer::start();
    let port = server.port();
    // A short lease, so the quarantine after the loss is the 5 s default, not a 30 s lease.
    let locks = support::client_with_lease(&server.url(), Duration::from_secs(2)).await;
    let before = locks.lock("fenced").unwrap().acquire().await.unwrap();
    let token = before.fencing_token();
    drop(before);
    server.kill();
    let _restarted = RedisServer::start_on(port);
    let after = locks
        .lock("fenced")
        .unwrap()
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(after.fencing_token() > token);
}

#[tokio::test]
async fn invalid_names_are_typed_errors_and_crafted_names_stay_apart() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    assert_eq!(locks.lock("").unwrap_err().kind(), ErrorKind::InvalidName);
    let oversize = "x".repeat(MAX_NAME_LEN + 1);
    assert_eq!(
        locks.lock(&oversize).unwrap_err().kind(),
        ErrorKind::InvalidName
    );
    let bad_prefix = LockClient::builder(&server.url())
        .key_prefix("a{b")
        .build()
        .await;
    assert_eq!(bad_prefix.unwrap_err().kind(), ErrorKind::InvalidName);

    // A name shaped like another lock's internal keys is a different lock of its own.
    let plain = locks.lock("x").unwrap().acquire().await.unwrap();
    let crafted = locks.lock("x}:fence").unwrap().try_acquire().await.unwrap();
    let crafted = crafted.expect("a crafted name does not collide with 'x'");
    // 'x' was taken free, its block from the server clock: nothing wrote its counter, not
    // even the name spelled like it.
    assert_eq!(server.cmd::<i64>(&["EXISTS", "lock:{x}:fence"]), 0);
    assert_eq!(
        locks.lock("x}:fence").unwrap().keys().hash(),
        "lock:{x%7D:fence}"
    );
    drop((plain, crafted));
}

#[tokio::test]
async fn only_the_owner_releases_and_force_unlock_is_for_operators() {
    let server = RedisServer::start();
    let (holder, operator) = (client(&server).await, client(&server).await);
    let guard = holder.lock("owned").unwrap().acquire().await.unwrap();
    let lock = operator.lock("owned").unwrap();
    assert!(lock.is_locked().await.unwrap());
    assert!(lock.force_unlock().await.unwrap());
    assert!(!lock.is_locked().await.unwrap());
    assert!(!lock.force_unlock().await.unwrap());
    assert_eq!(
        guard.release().await.unwrap_err().kind(),
        ErrorKind::NotOwner
    );
}

#[tokio::test]
async fn shutdown_releases_held_locks_and_stops_waiters() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let held = locks.lock("held").unwrap().acquire().await.unwrap();
    let blocker = other.lock("busy").unwrap().acquire().await.unwrap();
    let waiter = {
        let lock = locks.lock("busy").unwrap();
        tokio::spawn(async move { lock.acquire().await })
    };
    assert!(support::eventually(SLACK, || support::queued(&server, "busy").len() == 1).await);

    locks.shutdown().await;
    assert_eq!(held.lost_signal().reason(), Some(LostReason::ShutDown));
    assert!(!other.lock("held").unwrap().is_locked().await.unwrap());
    let stopped = tokio::time::timeout(SLACK, waiter).await.unwrap().unwrap();
    assert_eq!(stopped.unwrap_err().kind(), ErrorKind::ShutDown);
    let after = locks.lock("other").unwrap().acquire().await;
    assert_eq!(after.unwrap_err().kind(), ErrorKind::ShutDown);
    blocker.release().await.unwrap();
}

#[tokio::test]
async fn a_client_started_before_redis_recovers_once_redis_is_up() {
    let port = support::free_port();
    let locks = support::client_on_silent_port(port).await;
    let down = locks.lock("late").unwrap().try_acquire().await.unwrap_err();
    assert_eq!(down.kind(), ErrorKind::RedisUnavailable);
    let server = RedisServer::start_on(port);
    // A new server, as an operator provisions one (else its first lock waits a quarantine).
    server.provision_epoch("lock:");
    // Operations fail fast while redis is down, so the caller retries; the client needs no
    // restart once redis answers.
    let started = std::time::Instant::now();
    let guard = loop {
        match locks.lock("late").unwrap().try_acquire().await {
            Ok(Some(guard)) => break guard,
            Err(err) if err.kind() == ErrorKind::RedisUnavailable => {
                assert!(started.elapsed() < Duration::from_secs(10), "{err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(guard.is_held());
}

#[tokio::test]
async fn scripts_flushed_from_redis_are_loaded_again() {
    let server = RedisServer::start();
    let interval = Duration::from_millis(500);
    let locks = LockClient::builder(&server.url())
        .watchdog_lease(interval * 3)
        .renew_interval(interval)
        .build()
        .await
        .unwrap();
    let lock = locks.lock("flushed").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    let () = server.cmd(&["SCRIPT", "FLUSH"]);
    let guard = lock.acquire().await.expect("acquire reloads its script");
    let () = server.cmd(&["SCRIPT", "FLUSH"]);
    // Renewals across several leases reload the renew script; a failed reload would let
    // the lease run out and fire the lost signal.
    tokio::time::sleep(interval * 6).await;
    assert!(guard.is_held());
    let () = server.cmd(&["SCRIPT", "FLUSH"]);
    guard.release().await.expect("release reloads its script");
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_names_spread_over_as_many_command_connections_as_the_client_is_given() {
    let server = RedisServer::start();
    // Command connections only (pub/sub ones are of another type), less the one that asks.
    let commands = || {
        server
            .cmd::<String>(&["CLIENT", "LIST", "TYPE", "normal"])
            .lines()
            .count()
            - 1
    };
    let before = commands();
    let server_ref = &server;
    // Until its pub/sub connection has subscribed, a client's listener counts as a command
    // connection: each client is counted once it has.
    let take_many = |locks: LockClient| async move {
        let channel = support::wake_channel(&locks);
        assert!(
            support::eventually(SLACK, || support::subscribers(server_ref, &channel) == 1).await,
            "the client's pub/sub connection never subscribed"
        );
        for i in 0..32 {
            let lock = locks.lock(&format!("spread-{i}")).unwrap();
            lock.acquire().await.unwrap().release().await.unwrap();
        }
        locks
    };
    let default = take_many(client(&server).await).await;
    assert_eq!(commands(), before + 1, "one command connection by default");
    let spread = LockClient::builder(&server.url())
        .connections(3)
        .build()
        .await
        .unwrap();
    let spread = take_many(spread).await;
    assert_eq!(
        commands(),
        before + 1 + 3,
        "32 names over 3 connections use all three"
    );
    drop((default, spread));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_handle_stops_the_actors_and_closes_their_connections() {
    let server = RedisServer::start();
    let connections = || {
        // Less one: the connection that asks.
        server.cmd::<String>(&["CLIENT", "LIST"]).lines().count() - 1
    };
    let before = connections();
    let locks = client(&server).await;
    let guard = locks.lock("last-handle").unwrap().acquire().await.unwrap();
    assert!(
        support::eventually(SLACK, || connections() == before + 2).await,
        "one command connection and one pub/sub connection"
    );
    drop(locks);
    drop(guard);
    assert!(
        support::eventually(SLACK * 5, || connections() == before).await,
        "both connections close once the client and its guards are gone"
    );
}

#[tokio::test]
async fn a_client_runs_its_commands_on_a_pool_the_caller_brings() {
    let server = RedisServer::start();
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let locks = LockClient::builder(&server.url())
        .pool(pool.clone())
        .build()
        .await
        .unwrap();
    let guard = locks.lock("pooled").unwrap().acquire().await.unwrap();
    assert_eq!(
        pool.status().size,
        1,
        "the command connection came from this pool"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_release_frees_every_hold_of_its_owner() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let guard = locks.lock("leftover").unwrap().acquire().await.unwrap();
    let again = guard.reenter().await.unwrap();
    // A re-entry Redis counted whose reply was lost (a cut connection): one hold more in Redis
    // than this owner has guards.
    let _: i64 = server.cmd(&["HINCRBY", "lock:{leftover}", guard.owner_id(), "1"]);
    again.release().await.unwrap();
    guard.release().await.unwrap();
    let left: i64 = server.cmd(&["EXISTS", "lock:{leftover}"]);
    assert_eq!(
        left, 0,
        "the last guard's release leaves the lock held by nobody"
    );
}

//! Quorum locks (Redlock) over five real redis-server processes: exclusion, two servers
//! down, three down (a typed error), a quorum lost while held, and nothing left behind.

mod support;

use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::{RedisServer, client, command_calls, eventually};
use tower_redis_lock::{ErrorKind, Lease, LockClient, LostReason, RedLock};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(5);
/// Per-server attempt bound for these tests: the default (50 ms with the short leases used
/// here) is meant for production servers, not a debug build on two busy cores; killed
/// servers refuse connections at once, so this does not slow the unreachable cases down.
const ATTEMPT: Duration = Duration::from_millis(500);

fn start_servers(count: usize) -> Vec<RedisServer> {
    (0..count).map(|_| RedisServer::start()).collect()
}

async fn clients(servers: &[RedisServer]) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for server in servers {
        clients.push(client(server).await);
    }
    clients
}

/// Clients with a short watchdog lease, so a part on a dead server is reported lost fast.
async fn short_lease_clients(servers: &[RedisServer], lease: Duration) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for server in servers {
        clients.push(support::client_with_lease(&server.url(), lease).await);
    }
    clients
}

fn redlock(clients: Vec<LockClient>, name: &str) -> RedLock {
    RedLock::new(clients, name)
        .unwrap()
        .attempt_timeout(ATTEMPT)
        .retry_delay(Duration::from_millis(50))
}

/// How many servers hold the lock, asked through each server's plain lock.
async fn locked_count(lock: &RedLock) -> usize {
    let mut locked = 0;
    for part in lock.locks() {
        if part.is_locked().await.unwrap_or(false) {
            locked += 1;
        }
    }
    locked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_lock_excludes_others_with_two_of_five_servers_dead_and_fails_typed_with_three() {
    let mut servers = start_servers(5);
    let mine = redlock(clients(&servers).await, "ledger");
    let theirs = redlock(clients(&servers).await, "ledger");
    assert_eq!((mine.servers(), mine.quorum()), (5, 3));

    let guard = mine.acquire_timeout(SLACK).await.unwrap();
    let acquired = Instant::now();
    assert_eq!(guard.held_on(), 5);
    assert!(guard.is_held());
    // Valid for less than the lease (the 30 s watchdog lease) from any time after the
    // attempt started, by at least the drift allowance (1 % + 2 ms).
    let lease = tower_redis_lock::DEFAULT_WATCHDOG_LEASE;
    assert!(guard.validity() <= acquired + lease - lease / 100 - Duration::from_millis(2));
    assert!(guard.validity() > Instant::now(), "still valid");
    let tokens = guard.fencing_tokens();
    assert_eq!(tokens.len(), 5);
    assert!(tokens.iter().all(Option::is_some));

    assert!(theirs.try_acquire().await.unwrap().is_none());
    let err = theirs
        .acquire_timeout(Duration::from_millis(400))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Timeout,
        "held, not unreachable: {err}"
    );
    assert_eq!(
        locked_count(&mine).await,
        5,
        "the loser left the winner's parts alone"
    );
    guard.release().await.unwrap();
    assert_eq!(locked_count(&mine).await, 0);

    // Two of five down: three still make a quorum.
    servers[0].kill();
    servers[1].kill();
    let guard = mine.acquire_timeout(SLACK).await.unwrap();
    assert_eq!(guard.held_on(), 3);
    let tokens = guard.fencing_tokens();
    assert!(tokens[0].is_none() && tokens[1].is_none());
    assert!(theirs.try_acquire().await.unwrap().is_none());
    let err = theirs
        .acquire_timeout(Duration::from_millis(400))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "still excluded: {err}");
    guard.release().await.unwrap();
    for part in &mine.locks()[2..] {
        assert!(!part.is_locked().await.unwrap(), "live parts released");
    }

    // Three of five down: no quorum is possible, and the error says so at once.
    // What the live servers granted so far: a grant writes the lock's hash, one HSET (the
    // token counter is a string).
    let grants_before: Vec<u64> = servers[3..5]
        .iter()
        .map(|server| command_calls(server, "hset"))
        .collect();
    servers[2].kill();
    let started = Instant::now();
    let err = mine.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuorumUnreachable, "{err}");
    let err = mine
        .acquire_timeout(Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuorumUnreachable, "{err}");
    assert!(
        started.elapsed() < SLACK,
        "unreachable servers fail fast, not at the wait bound: {:?}",
        started.elapsed()
    );
    // The two live servers granted their parts, and the failed attempts released them.
    for (server, before) in (3..5).zip(grants_before) {
        let grants = command_calls(&servers[server], "hset");
        assert!(grants > before, "server {server} granted");
        assert!(
            !mine.locks()[server].is_locked().await.unwrap(),
            "nothing left on {server}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_grant_is_undone_and_silent_servers_count_as_unreachable() {
    let servers = start_servers(3);
    let (slow, silent) = (
        FaultProxy::start(servers[1].port()).await,
        FaultProxy::start(servers[2].port()).await,
    );
    let mut clients = vec![client(&servers[0]).await];
    for proxy in [&slow, &silent] {
        clients.push(LockClient::connect(&proxy.url()).await.unwrap());
    }
    let bound = Duration::from_millis(150);
    let lock = RedLock::new(clients, "late")
        .unwrap()
        .attempt_timeout(bound);
    // Warm up: connections made and scripts loaded, so the slow server's next attempt sends
    // its script at once and only the answer is late.
    lock.acquire_timeout(SLACK)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let grants_before = command_calls(&servers[1], "hset");

    // Each byte now takes 400 ms each way: the grant lands after the attempt gave up on it.
    slow.set_latency(Duration::from_millis(400));
    let guard = lock.acquire_timeout(SLACK).await.unwrap();
    assert_eq!(
        guard.held_on(),
        2,
        "a quorum of two without the slow server"
    );
    assert!(guard.fencing_tokens()[1].is_none());
    assert!(
        eventually(SLACK, || command_calls(&servers[1], "hset") > grants_before).await,
        "the late attempt's script ran on the slow server"
    );
    assert!(
        eventually(SLACK, || servers[1].cmd::<i64>(&["EXISTS", "lock:{late}"])
            == 0)
        .await,
        "and its grant was undone"
    );
    guard.release().await.unwrap();
    slow.set_latency(Duration::ZERO);

    // Two servers that do not answer at all: no quorum possible, a typed error after about
    // one attempt bound, and the live server's part released.
    slow.black_hole();
    silent.black_hole();
    let started = Instant::now();
    let err = lock.try_acquire().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::QuorumUnreachable, "{err}");
    assert!(started.elapsed() < bound + SLACK, "{:?}", started.elapsed());
    assert_eq!(servers[0].cmd::<i64>(&["EXISTS", "lock:{late}"]), 0);
    slow.heal();
    silent.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_quorum_lock_is_reported_lost_when_three_of_five_servers_die() {
    // Long enough that the three live parts' renewals, slowed by a busy machine and the dead
    // servers' reconnections, stay within the lease.
    let lease = Duration::from_millis(1500);
    let mut servers = start_servers(5);
    let lock = redlock(short_lease_clients(&servers, lease).await, "payout");
    let guard = lock.acquire_timeout(SLACK).await.unwrap();
    let lost = guard.lost_signal();

    servers[0].kill();
    servers[1].kill();
    // Two lost parts (each reported within a lease) leave a quorum: no signal. Waiting two
    // leases is the only way to see that something does NOT happen.
    assert!(
        tokio::time::timeout(lease * 2, lost.lost()).await.is_err(),
        "three of five still hold the lock"
    );
    assert!(guard.is_held());
    assert_eq!(guard.held_on(), 3);

    servers[2].kill();
    let killed = Instant::now();
    let reason = tokio::time::timeout(lease + SLACK, lost.lost())
        .await
        .expect("the signal fires once fewer than three parts are held");
    assert_eq!(reason, LostReason::Unreachable);
    assert!(
        killed.elapsed() < lease + Duration::from_secs(2),
        "told within about a lease: {:?}",
        killed.elapsed()
    );
    assert!(!guard.is_held());
    assert!(guard.held_on() <= 2);
}

#[tokio::test]
async fn a_fixed_lease_bounds_the_validity_and_ends_the_lock() {
    let servers = start_servers(3);
    let lease = Duration::from_millis(800);
    let lock = redlock(clients(&servers).await, "report").with_lease(Lease::Fixed(lease));
    let rival = redlock(clients(&servers).await, "report");
    let guard = lock.acquire_timeout(SLACK).await.unwrap();
    let acquired = Instant::now();
    // Lease minus the drift allowance (1 % + 2 ms), counted from the attempt's start.
    assert!(guard.validity() <= acquired + lease - lease / 100 - Duration::from_millis(2));
    for part in lock.locks() {
        let ttl = part
            .remaining_ttl()
            .await
            .unwrap()
            .expect("held with a ttl");
        assert!(ttl <= lease);
    }
    let reason = tokio::time::timeout(lease + SLACK, guard.lost_signal().lost())
        .await
        .expect("a fixed lease runs out");
    assert_eq!(reason, LostReason::Expired);
    let taken = rival
        .acquire_timeout(lease + SLACK)
        .await
        .expect("free once the fixed lease ran out");
    // The signal fires a tenth of the lease early, so a part may still be running out when
    // the rival's first attempt lands: a quorum is what counts.
    assert!(taken.held_on() >= rival.quorum());
}

#[tokio::test]
async fn bad_server_sets_are_typed_errors() {
    let servers = start_servers(2);
    let err = RedLock::new(Vec::new(), "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);

    let twice = vec![client(&servers[0]).await, client(&servers[0]).await];
    let err = RedLock::new(twice, "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    // Another database of the same server is not an independent server either.
    let other_db = LockClient::connect(&format!("{}/3", servers[0].url()))
        .await
        .unwrap();
    let err = RedLock::new(vec![client(&servers[0]).await, other_db], "x").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");

    let err = RedLock::new(clients(&servers).await, "").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidName);

    // One server: a quorum of one.
    let single = redlock(vec![client(&servers[1]).await], "solo");
    assert_eq!(single.quorum(), 1);
    let guard = single.try_acquire().await.unwrap().expect("free");
    assert!(single.try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
}

//! The semaphore against a real redis-server: never more holders' permits than it has,
//! across three clients; a waiter for many permits not starved by a stream of waiters for
//! one; waiters served in the order they asked, woken by their grants; a dropped acquire
//! leaving nothing behind; a dead holder's permits coming back at its lease's end; the
//! watchdog renewing holders; the permit count kept in Redis; and fencing tokens.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use support::{RedisServer, client, eventually, semaphore_queued as queued};
use tokio::task::JoinHandle;
use tower_redis_lock::{ErrorKind, Lease, LockClient, PermitGuard, Semaphore};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(5);
/// A re-poll bound far longer than any wait these tests allow: a waiter that meets them was
/// woken by its grant message, not by polling.
const NEVER_POLL: Duration = Duration::from_secs(60);

/// A client that never re-polls within a test: it only learns of a grant from its message.
async fn client_never_polling(server: &RedisServer) -> LockClient {
    LockClient::builder(&server.url())
        .repoll_interval(NEVER_POLL)
        .build()
        .await
        .unwrap()
}

/// How many permits Redis counts as held for the semaphore `name`.
fn used(server: &RedisServer, name: &str) -> u32 {
    let used: Option<u32> = server.cmd(&["HGET", &format!("lock:{{{name}}}:semaphore"), "used"]);
    used.unwrap_or(0)
}

/// How many of the semaphore `name`'s keys exist, besides its last granted token block (which
/// lives a lease past the grant, by design).
fn keys_left(server: &RedisServer, name: &str) -> i64 {
    let hash = format!("lock:{{{name}}}:semaphore");
    let keys: Vec<String> = ["", ":readers", ":queue", ":waiters"]
        .iter()
        .map(|suffix| format!("{hash}{suffix}"))
        .collect();
    let mut exists = vec!["EXISTS"];
    exists.extend(keys.iter().map(String::as_str));
    server.cmd(&exists)
}

/// Starts waiting for `take` permits in a task, and returns once the waiter is the
/// `place`th in the Redis queue of `name`.
async fn queue_for(
    server: &RedisServer,
    semaphore: Semaphore,
    take: u32,
    place: usize,
) -> JoinHandle<PermitGuard> {
    let name = semaphore.name().to_owned();
    let waiting = tokio::spawn(async move { semaphore.acquire_many(take).await.unwrap() });
    assert!(
        eventually(SLACK, || queued(server, &name).len() == place).await,
        "waiter number {place} queued for {name}"
    );
    waiting
}

/// The guard of a waiter that must have acquired within `bound`; `why` says what that proves.
async fn granted(waiting: JoinHandle<PermitGuard>, why: &str) -> PermitGuard {
    let guard = tokio::time::timeout(SLACK, waiting)
        .await
        .unwrap_or_else(|_| panic!("not acquired within {SLACK:?}: {why}"))
        .unwrap();
    assert!(guard.is_held());
    guard
}

/// Counts holders' permits in and out; remembers the most ever held at once.
#[derive(Default)]
struct Occupancy {
    inside: AtomicU32,
    most: AtomicU32,
}

impl Occupancy {
    fn enter(&self, permits: u32) {
        let now = self.inside.fetch_add(permits, Ordering::SeqCst) + permits;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self, permits: u32) {
        self.inside.fetch_sub(permits, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_clients_never_hold_more_permits_than_the_semaphore_has() {
    const PERMITS: u32 = 3;
    const TASKS_PER_CLIENT: usize = 8;
    const ROUNDS: usize = 15;
    let server = RedisServer::start();
    let occupancy = Arc::new(Occupancy::default());
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let locks = client(&server).await;
        for task in 0..TASKS_PER_CLIENT {
            let semaphore = locks.semaphore("exports", PERMITS).unwrap();
            let (occupancy, tokens) = (occupancy.clone(), tokens.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    // Every fourth acquisition of some tasks takes two permits at once.
                    let take = if (task + round) % 4 == 0 { 2 } else { 1 };
                    let guard = semaphore.acquire_many(take).await.unwrap();
                    occupancy.enter(take);
                    tokens.lock().unwrap().push(guard.fencing_token());
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    occupancy.leave(take);
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = occupancy.most.load(Ordering::SeqCst);
    assert!(most <= PERMITS, "{most} permits held at once, of {PERMITS}");
    assert_eq!(most, PERMITS, "the permits were never all in use at once");
    let mut tokens = Arc::try_unwrap(tokens).unwrap().into_inner().unwrap();
    let acquisitions = tokens.len();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        acquisitions,
        "two holders shared a fencing token"
    );
    assert_eq!(used(&server, "exports"), 0, "permits left held in Redis");
    assert_eq!(keys_left(&server, "exports"), 0, "keys left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_for_many_permits_is_not_starved_by_waiters_for_one() {
    let server = RedisServer::start();
    let locks = client_never_polling(&server).await;
    let semaphore = locks.semaphore("partner-api", 4).unwrap();
    // Three of four permits are held: the big waiter (all four) must wait for all of them.
    let mut held: Vec<PermitGuard> = Vec::new();
    for _ in 0..3 {
        held.push(semaphore.acquire().await.unwrap());
    }
    let big = queue_for(&server, semaphore.clone(), 4, 1).await;
    // A stream of one-permit acquirers: one permit is free, yet each queues behind the big
    // waiter instead of overtaking it.
    let mut small = Vec::new();
    for place in 2..=4 {
        small.push(queue_for(&server, semaphore.clone(), 1, place).await);
    }
    assert!(
        semaphore.try_acquire().await.unwrap().is_none(),
        "a try overtook the queue"
    );
    // The holders leave one by one; the big waiter gets all four once the last is gone, and
    // only then do the small ones follow.
    for guard in held.drain(..) {
        assert!(
            !big.is_finished(),
            "the big waiter got permits that were held"
        );
        guard.release().await.unwrap();
    }
    let big = granted(big, "all four permits came free").await;
    assert_eq!(big.permits(), 4);
    assert!(small.iter().all(|waiter| !waiter.is_finished()));
    assert_eq!(used(&server, "partner-api"), 4);
    big.release().await.unwrap();
    // One release hands out three permits to the three small waiters together.
    let mut small_guards = Vec::new();
    for waiter in small {
        small_guards.push(granted(waiter, "the big waiter's release fits all three").await);
    }
    assert_eq!(used(&server, "partner-api"), 3);
    for guard in small_guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_the_order_they_asked_woken_by_their_grants() {
    const WAITERS: usize = 5;
    let server = RedisServer::start();
    let clients = [
        client_never_polling(&server).await,
        client_never_polling(&server).await,
    ];
    let semaphore = |n: usize| clients[n % 2].semaphore("reports", 2).unwrap();
    let first = semaphore(0).acquire().await.unwrap();
    let second = semaphore(1).acquire().await.unwrap();
    let order = Arc::new(AtomicU64::new(0));
    let mut waiters = Vec::new();
    for place in 1..=WAITERS {
        let name = semaphore(place).name().to_owned();
        let (semaphore, order) = (semaphore(place), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = semaphore.acquire().await.unwrap();
            let served = order.fetch_add(1, Ordering::SeqCst) as usize + 1;
            let token = guard.fencing_token();
            // Each holds until the test lets it go: one grant per release, in order.
            (served, token, guard)
        }));
        assert!(
            eventually(SLACK, || queued(&server, &name).len() == place).await,
            "waiter {place} queued"
        );
    }
    let mut last_token = second.fencing_token().max(first.fencing_token());
    let mut holders = vec![first, second];
    for place in 1..=WAITERS {
        // Free one permit: exactly the next waiter in line gets it.
        holders.remove(0).release().await.unwrap();
        let waiter = waiters.remove(0);
        let (served, token, guard) = tokio::time::timeout(SLACK, waiter)
            .await
            .unwrap_or_else(|_| panic!("waiter {place} not woken by its grant"))
            .unwrap();
        assert_eq!(served, place, "served out of order");
        assert!(token > last_token, "fencing tokens must grow");
        last_token = token;
        assert!(waiters.iter().all(|waiter| !waiter.is_finished()));
        holders.push(guard);
    }
    for guard in holders {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_leaves_no_place_and_no_permit_behind() {
    let server = RedisServer::start();
    let locks = client_never_polling(&server).await;
    let semaphore = locks.semaphore("cancelled", 1).unwrap();
    let held = semaphore.acquire().await.unwrap();
    // Dropped while queued: its place goes.
    let waiting = queue_for(&server, semaphore.clone(), 1, 1).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert!(
        eventually(SLACK, || queued(&server, "cancelled").is_empty()).await,
        "the dropped waiter's place stayed queued"
    );
    // Dropped right as the release grants it: whatever Redis granted is given back.
    let waiting = queue_for(&server, semaphore.clone(), 1, 1).await;
    held.release().await.unwrap();
    waiting.abort();
    let _ = waiting.await;
    assert!(
        eventually(SLACK, || used(&server, "cancelled") == 0
            && queued(&server, "cancelled").is_empty())
        .await,
        "a permit granted to a dropped acquire was never given back"
    );
    let again = tokio::time::timeout(SLACK, semaphore.acquire())
        .await
        .expect("the permit came back")
        .unwrap();
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stops_renewing_frees_its_permits_when_its_own_lease_ends() {
    let server = RedisServer::start();
    let locks = client_never_polling(&server).await;
    let lease = Duration::from_millis(1500);
    let semaphore = locks.semaphore("leases", 2).unwrap();
    let lasting = semaphore.acquire().await.unwrap();
    // Forgotten, never released: stands for a holder whose process died (its fixed lease is
    // never renewed).
    let dead = semaphore
        .clone()
        .with_lease(Lease::Fixed(lease))
        .acquire()
        .await
        .unwrap();
    std::mem::forget(dead);
    assert!(semaphore.try_acquire().await.unwrap().is_none());
    let waiting = tokio::spawn({
        let semaphore = semaphore.clone();
        async move { semaphore.acquire().await.unwrap() }
    });
    let freed = tokio::time::timeout(lease + SLACK, waiting)
        .await
        .expect("the dead holder's permit never came back")
        .unwrap();
    // The watchdog kept the other holder's permit all along.
    assert!(lasting.is_held());
    assert_eq!(used(&server, "leases"), 2);
    freed.release().await.unwrap();
    lasting.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_permits_past_their_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1500);
    let locks = support::client_with_lease(&server.url(), lease).await;
    let semaphore = locks.semaphore("renewed", 1).unwrap();
    let held = semaphore.acquire().await.unwrap();
    tokio::time::sleep(lease * 3).await;
    assert!(held.is_held(), "{:?}", held.lost_signal().reason());
    let other = client(&server).await.semaphore("renewed", 1).unwrap();
    assert!(
        other.try_acquire().await.unwrap().is_none(),
        "taken while renewed"
    );
    held.release().await.unwrap();
    assert!(other.try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_that_disagree_on_the_count_get_a_typed_error() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let three = locks.semaphore("tenant-7", 3).unwrap();
    let five = locks.semaphore("tenant-7", 5).unwrap();
    let held = three.acquire().await.unwrap();
    for attempt in [
        five.try_acquire().await.map(|_| ()),
        five.acquire().await.map(|_| ()),
    ] {
        let err = attempt.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermitsMismatch, "{err}");
        assert!(err.to_string().contains("3 permits"), "{err}");
    }
    assert!(
        queued(&server, "tenant-7").is_empty(),
        "the refused waiter stayed queued"
    );
    assert_eq!(used(&server, "tenant-7"), 1);
    held.release().await.unwrap();
    // Nobody holds it now: nothing of it is left, and the next count stands.
    assert_eq!(keys_left(&server, "tenant-7"), 0);
    let now_five = five.acquire_many(5).await.unwrap();
    assert_eq!(
        three.try_acquire().await.unwrap_err().kind(),
        ErrorKind::PermitsMismatch
    );
    now_five.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_counts_are_refused_before_anything_is_written() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    assert_eq!(
        locks.semaphore("s", 0).unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    let semaphore = locks.semaphore("s", 2).unwrap();
    for take in [0, 3] {
        let err = semaphore.acquire_many(take).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{take}: {err}");
    }
    assert_eq!(
        locks.semaphore("", 2).unwrap_err().kind(),
        ErrorKind::InvalidName
    );
    assert_eq!(server.keys_besides_epoch(), 0);
    // A lock of the same name is another thing altogether.
    let lock = locks.lock("s").unwrap().acquire().await.unwrap();
    let permits = semaphore.acquire_many(2).await.unwrap();
    assert_eq!(permits.permits(), 2);
    assert_eq!(
        semaphore
            .acquire_timeout(Duration::from_millis(200))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::Timeout
    );
    permits.release().await.unwrap();
    lock.release().await.unwrap();
}

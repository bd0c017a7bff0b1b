//! Waiting for a lock against a real redis-server: the Redis queue and its wake messages, the
//! re-poll bound when messages are missed, many keys on one connection, and cancel-safety.

mod support;

use std::time::{Duration, Instant};

use support::{RedisServer, client, command_calls, eventually, queued, subscribers, wake_channel};
use tokio::task::JoinHandle;
use tower_redis_lock::{DEFAULT_LOCAL_HANDOVER_LIMIT, ErrorKind, Lease, LockClient, LockGuard};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(2);
/// A re-poll bound far longer than any wait these tests allow: a waiter that meets the
/// bounds below was woken by a message, not by polling.
const NEVER_POLL: Duration = Duration::from_secs(60);

async fn client_with_repoll(server: &RedisServer, repoll: Duration) -> LockClient {
    client_with_url_and_repoll(&server.url(), repoll).await
}

async fn client_with_url_and_repoll(url: &str, repoll: Duration) -> LockClient {
    LockClient::builder(url)
        .repoll_interval(repoll)
        .build()
        .await
        .unwrap()
}

/// Takes `name` with `holder`, starts a task of `waiter` waiting for it, and returns once the
/// waiter is queued in Redis. The task yields when it acquired, and the guard.
async fn contest(
    server: &RedisServer,
    holder: &LockClient,
    waiter: &LockClient,
    name: &str,
) -> (LockGuard, JoinHandle<(Instant, LockGuard)>) {
    let guard = holder.lock(name).unwrap().acquire().await.unwrap();
    let lock = waiter.lock(name).unwrap();
    let waiting = tokio::spawn(async move {
        let guard = lock.acquire().await.unwrap();
        (Instant::now(), guard)
    });
    assert!(
        eventually(SLACK, || queued(server, name).len() == 1).await,
        "the waiter queued for {name}"
    );
    (guard, waiting)
}

/// Asserts that the waiter acquires within `bound`; returns when it did.
async fn acquired_within(
    bound: Duration,
    waiting: JoinHandle<(Instant, LockGuard)>,
    why: &str,
) -> Instant {
    let (at, guard) = tokio::time::timeout(bound, waiting)
        .await
        .unwrap_or_else(|_| panic!("not acquired within {bound:?}: {why}"))
        .unwrap();
    assert!(guard.is_held());
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_client_wakes_on_release_not_on_lease_or_poll() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = client_with_repoll(&server, NEVER_POLL).await;
    let (guard, waiting) = contest(&server, &holder, &waiter, "wake").await;

    let released_at = Instant::now();
    guard.release().await.unwrap();
    let why = "woken by the release message, long before the 30 s lease or 60 s poll";
    let acquired_at = acquired_within(SLACK, waiting, why).await;
    assert!(acquired_at.duration_since(released_at) < SLACK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_an_owner_that_lost_the_lock_leaves_the_holders_waiter_its_wake() {
    let server = RedisServer::start();
    let stale = client(&server).await;
    let holder = client(&server).await;
    let waiter = client_with_repoll(&server, NEVER_POLL).await;
    let lost = stale.lock("lost").unwrap().acquire().await.unwrap();
    // Gone behind the first owner's back (its watchdog is 10 s from noticing): the second
    // takes the lock while nobody waits, and a waiter then queues behind it.
    let () = server.cmd(&["DEL", "lock:{lost}"]);
    let (guard, waiting) = contest(&server, &holder, &waiter, "lost").await;

    // The stale release removes what says someone waits with its own (absent) field, and
    // must put it back: the holder's release below would otherwise skip the queue.
    let stale_release = lost.release().await.unwrap_err();
    assert_eq!(stale_release.kind(), ErrorKind::NotOwner);
    let marks: (Option<String>, Option<String>) =
        server.cmd(&["HMGET", "lock:{lost}", "queued", "queued.2"]);
    assert_eq!(marks, (Some("1".to_owned()), Some("1".to_owned())));
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let why = "woken by the holder's release, long before the 30 s lease or 60 s poll";
    let acquired_at = acquired_within(SLACK, waiting, why).await;
    assert!(acquired_at.duration_since(released_at) < SLACK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_without_a_message_costs_at_most_the_repoll_bound() {
    let server = RedisServer::start();
    let repoll = Duration::from_millis(500);
    let holder = client(&server).await;
    let waiter = client_with_repoll(&server, repoll).await;
    let (_guard, waiting) = contest(&server, &holder, &waiter, "silent").await;

    // Deleted behind the library's back: no release message is ever published, and the
    // holder's lease (30 s) is far away, so only the re-poll can find the lock free.
    let () = server.cmd(&["DEL", "lock:{silent}"]);
    acquired_within(repoll + SLACK, waiting, "the re-poll finds the free lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pubsub_connection_costs_at_most_the_repoll_bound() {
    let server = RedisServer::start();
    let repoll = Duration::from_millis(500);
    let holder = client(&server).await;
    let waiter = client_with_repoll(&server, repoll).await;
    let (guard, waiting) = contest(&server, &holder, &waiter, "cut").await;

    // The grant of this release is published while the waiter has no subscription.
    let killed: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 2, "the pub/sub connections of both clients");
    guard.release().await.unwrap();
    acquired_within(
        repoll + SLACK,
        waiting,
        "a missed message costs the re-poll",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_killed_pubsub_connection_the_wake_channel_is_subscribed_again() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = client_with_repoll(&server, NEVER_POLL).await;
    let (guard, waiting) = contest(&server, &holder, &waiter, "again").await;
    let channel = wake_channel(&waiter);
    let killed: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 2, "the pub/sub connections of both clients");
    assert!(eventually(SLACK, || subscribers(&server, &channel) == 0).await);
    // The actor sees the cut when its stream ends, or at the latest at its next PING (every
    // 5 s), then reconnects within its first backoff; 20 s leaves room for a loaded machine.
    let resubscribed = eventually(Duration::from_secs(20), || {
        subscribers(&server, &channel) == 1
    });
    assert!(
        resubscribed.await,
        "the actor reconnects and subscribes again"
    );

    guard.release().await.unwrap();
    acquired_within(SLACK, waiting, "woken by a message on the new connection").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_keys_are_awaited_on_one_pubsub_connection() {
    const KEYS: usize = 10_000;
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = client_with_repoll(&server, NEVER_POLL).await;
    let names: Vec<String> = (0..KEYS).map(|i| format!("many-{i}")).collect();

    let mut held = Vec::with_capacity(KEYS);
    for chunk in names.chunks(500) {
        let acquired = futures_util::future::join_all(
            chunk
                .iter()
                .map(|name| async { holder.lock(name).unwrap().try_acquire().await }),
        )
        .await;
        held.extend(acquired.into_iter().map(|g| g.unwrap().expect("free key")));
    }
    let waiting: Vec<_> = names
        .iter()
        .map(|name| {
            let lock = waiter.lock(name).unwrap();
            tokio::spawn(async move { lock.acquire().await.unwrap() })
        })
        .collect();

    // Each key: its hash (taken free, it keeps no token block), and once the waiter queued,
    // its queue and terms (the server's epoch key, its marker and the token counter aside).
    let keys_in_redis = || server.keys_besides_epoch() as usize;
    assert!(
        eventually(Duration::from_secs(30), || keys_in_redis() == 3 * KEYS).await,
        "every key has the waiter queued"
    );
    assert_eq!(waiter.queued_waiters(), KEYS);
    let channels: Vec<String> = server.cmd(&["PUBSUB", "CHANNELS", "lock:*"]);
    assert_eq!(
        channels.len(),
        2,
        "one wake channel per client: {channels:?}"
    );
    let pubsub_clients: String = server.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    assert_eq!(
        pubsub_clients.lines().count(),
        2,
        "one pub/sub connection per client"
    );

    drop(held);
    let woken = tokio::time::timeout(
        Duration::from_secs(60),
        futures_util::future::join_all(waiting),
    )
    .await
    .expect("every waiter is woken by its release message");
    let guards: Vec<_> = woken.into_iter().map(Result::unwrap).collect();
    assert_eq!(guards.len(), KEYS);
    assert_eq!(waiter.queued_waiters(), 0);
    assert_eq!(keys_in_redis(), 2 * KEYS, "no queue is left");
    drop(guards);
    assert!(
        eventually(Duration::from_secs(10), || waiter.local_keys() == 0
            && holder.local_keys() == 0)
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_dropped_while_waiting_leaves_no_lock_and_no_place_in_the_queue() {
    let server = RedisServer::start();
    let (holder, waiter) = (client(&server).await, client(&server).await);
    let (guard, waiting) = contest(&server, &holder, &waiter, "dropped").await;
    assert_eq!(waiter.local_keys(), 1);

    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert_eq!(waiter.local_keys(), 0);
    assert_eq!(waiter.queued_waiters(), 0);
    assert!(eventually(SLACK, || queued(&server, "dropped").is_empty()).await);
    guard.release().await.unwrap();
    assert!(!holder.lock("dropped").unwrap().is_locked().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_after_redis_granted_it_leaves_no_lock() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let lock = locks.lock("unseen").unwrap();
    // Warm the shared connection and the script cache, so the acquire below is one EVALSHA.
    let warm = lock.acquire().await.unwrap();
    let block_end = warm.fencing_token() + u64::from(DEFAULT_LOCAL_HANDOVER_LIMIT);
    warm.release().await.unwrap();
    // A grant writes the lock's hash: one HSET (the token counter is a string).
    let grants_before = command_calls(&server, "hset");

    // With the server paused, the acquire is sent but not run; the caller gives up before
    // the answer. When the pause ends Redis grants the lock to an owner nobody will see.
    let () = server.cmd(&["CLIENT", "PAUSE", "500", "ALL"]);
    let cancelled = tokio::time::timeout(Duration::from_millis(100), lock.acquire()).await;
    assert!(cancelled.is_err());

    assert!(
        eventually(SLACK, || command_calls(&server, "hset") > grants_before).await,
        "the paused acquire ran and granted the lock"
    );
    let next = support::acquire_within(
        &other,
        "unseen",
        SLACK,
        "the unseen grant was released, long before its 30 s lease",
    )
    .await;
    assert!(next.fencing_token() > block_end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_cancelled_after_redis_counted_it_is_given_back() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let lock = locks.lock("reenter-unseen").unwrap();
    let guard = lock.acquire().await.unwrap();
    let () = server.cmd(&["CLIENT", "PAUSE", "500", "ALL"]);
    let cancelled = tokio::time::timeout(Duration::from_millis(100), guard.reenter()).await;
    assert!(cancelled.is_err());
    // Once the pause ends the counted hold is released again.
    let counts = || {
        let holds: Vec<(String, u64)> = server.cmd(&["HGETALL", "lock:{reenter-unseen}"]);
        holds.first().map(|(_, count)| *count)
    };
    assert!(eventually(SLACK, || counts() == Some(1)).await);
    guard.release().await.unwrap();
    assert_eq!(counts(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guard_is_released_in_the_background() {
    let server = RedisServer::start();
    let (locks, other) = (client(&server).await, client(&server).await);
    let guard = locks
        .lock("dropped-guard")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    drop(guard);
    assert!(
        started.elapsed() < Duration::from_millis(50),
        "drop does not block"
    );
    let next = support::acquire_within(
        &other,
        "dropped-guard",
        SLACK,
        "released in the background, not after the 30 s lease",
    )
    .await;
    assert!(next.is_held());
}

// One thread, so that a spawned task runs up to its first wait before the test goes on.
#[tokio::test(flavor = "current_thread")]
async fn waiters_of_one_client_queue_locally_and_only_the_head_talks_to_redis() {
    let server = RedisServer::start();
    let repoll = Duration::from_millis(100);
    let (holder, waiter) = (
        client(&server).await,
        client_with_repoll(&server, repoll).await,
    );
    let guard = holder.lock("queue").unwrap().acquire().await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiting = Vec::new();
    for i in 0..5 {
        let (lock, order_tx) = (waiter.lock("queue").unwrap(), order_tx.clone());
        waiting.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            order_tx.send(i).unwrap();
            guard.release().await.unwrap();
        }));
        // Let task i join the local queue before task i + 1 is spawned.
        tokio::task::yield_now().await;
    }
    assert!(eventually(SLACK, || queued(&server, "queue").len() == 1).await);
    // Five tasks wait, but only the head of the local queue looks at the lock: over a
    // window of ten re-polls Redis runs about ten acquire scripts, not fifty, and about ten
    // heartbeats (one per watchdog tick, a third of the 300 ms liveness, for every place
    // the client holds in a queue); the holder's watchdog adds an epoch check or two.
    let () = server.cmd(&["CONFIG", "RESETSTAT"]);
    tokio::time::sleep(repoll * 10).await;
    let scripts = support::script_calls(&server);
    assert!(scripts <= 35, "{scripts} scripts in ten re-polls");
    // A different key of the same client is not held up by the queue.
    let unrelated = waiter
        .lock("elsewhere")
        .unwrap()
        .acquire_timeout(SLACK)
        .await;
    assert!(unrelated.is_ok());

    guard.release().await.unwrap();
    for task in waiting {
        tokio::time::timeout(SLACK * 5, task)
            .await
            .unwrap()
            .unwrap();
    }
    drop(order_tx);
    let mut order = Vec::new();
    while let Some(i) = order_rx.recv().await {
        order.push(i);
    }
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
}

/// The stalled waiter's lease, which a grant from the queue holds.
const STALLED_LEASE: Duration = Duration::from_secs(2);
/// How long the stalled waiter's runtime is blocked: past the lease of its grant, with room
/// for another client to take the lock meanwhile.
const STALL: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_waiter_never_reports_a_lapsed_grant_as_held() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    // Polls often, so it takes the lock soon after the stalled waiter's grant lapses.
    let taker = client_with_repoll(&server, Duration::from_millis(100)).await;
    let first = holder.lock("stalled").unwrap().acquire().await.unwrap();
    let (stall_tx, stall_rx) = tokio::sync::oneshot::channel::<()>();
    let (stalling_tx, stalling_rx) = tokio::sync::oneshot::channel::<()>();
    let (result_tx, result_rx) = tokio::sync::oneshot::channel::<(u64, bool)>();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let url = server.url();
    // The waiter runs on a runtime of one thread, which the stall blocks: neither its task
    // nor its client's watchdog or pub/sub actor runs meanwhile, as with a blocked worker.
    let stalled = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let locks = LockClient::builder(&url)
                .watchdog_lease(STALLED_LEASE)
                .build()
                .await
                .unwrap();
            tokio::spawn(async move {
                let _ = stall_rx.await;
                stalling_tx.send(()).unwrap();
                std::thread::sleep(STALL);
            });
            let guard = locks
                .lock("stalled")
                .unwrap()
                .acquire_timeout(Duration::from_secs(60))
                .await
                .unwrap();
            result_tx
                .send((guard.fencing_token(), guard.is_held()))
                .unwrap();
            let _ = done_rx.await;
            guard.release().await.unwrap();
        });
    });
    assert!(eventually(SLACK, || queued(&server, "stalled").len() == 1).await);
    stall_tx.send(()).unwrap();
    stalling_rx.await.unwrap();
    let stall_started = Instant::now();
    // Grants the lock to the stalled waiter, on a lease that runs out during the stall.
    first.release().await.unwrap();
    let taken = taker
        .lock("stalled")
        .unwrap()
        .acquire_timeout(STALL)
        .await
        .expect("the lapsed grant frees the lock for another client within the stall");
    let taken_token = taken.fencing_token();
    // The stall ends; the waiter must not come back holding the lock the taker now holds.
    let until = STALL.saturating_sub(stall_started.elapsed()) + SLACK;
    let mut result_rx = result_rx;
    if let Ok(result) = tokio::time::timeout(until, &mut result_rx).await {
        let (token, held) = result.unwrap();
        assert!(
            !held,
            "the stalled waiter reports held with token {token} while another holds {taken_token}"
        );
    }
    taken.release().await.unwrap();
    let (token, held) = tokio::time::timeout(SLACK * 3, result_rx)
        .await
        .expect("the stalled waiter gets the lock once it is free")
        .unwrap();
    assert!(held);
    assert!(token > taken_token, "{token} after {taken_token}");
    done_tx.send(()).unwrap();
    tokio::task::spawn_blocking(move || stalled.join().unwrap())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_granted_after_a_wait_keeps_its_length() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = client(&server).await;
    let first = holder.lock("fixed").unwrap().acquire().await.unwrap();
    let lock = waiter
        .lock("fixed")
        .unwrap()
        .with_lease(Lease::Fixed(Duration::from_secs(60)));
    let waiting = tokio::spawn(async move { lock.acquire().await.unwrap() });
    assert!(eventually(SLACK, || queued(&server, "fixed").len() == 1).await);
    // Hands the lock to the waiter from the queue, on the queue's short claim lease.
    first.release().await.unwrap();
    let guard = tokio::time::timeout(SLACK, waiting).await.unwrap().unwrap();
    let left = waiter.lock("fixed").unwrap().remaining_ttl().await.unwrap();
    assert!(
        left.is_some_and(|left| left > Duration::from_secs(50)),
        "a 60 s lease granted from the queue has {left:?} left"
    );
    guard.release().await.unwrap();
}

/// The expiry of `name`'s queue and of its waiters' terms, read at one instant (ms; -2 when
/// the key is gone).
fn queue_expiries(server: &RedisServer, name: &str) -> (i64, i64) {
    redis::pipe()
        .atomic()
        .cmd("PTTL")
        .arg(format!("lock:{{{name}}}:queue"))
        .cmd("PTTL")
        .arg(format!("lock:{{{name}}}:waiters"))
        .query(&mut server.conn())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_and_its_terms_expire_together_outlive_a_live_waiter_and_go_after_a_dead_one() {
    const REPOLL: Duration = Duration::from_millis(200);
    // Three re-polls: how long a place lives without a refresh.
    const ALIVE_MS: i64 = 600;
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiter = client_with_repoll(&server, REPOLL).await;
    let (guard, waiting) = contest(&server, &holder, &waiter, "kept").await;

    // For ten liveness periods the live waiter keeps its place; the two keys always share one
    // expiry, never more than twice a liveness away.
    let until = Instant::now() + Duration::from_millis(10 * ALIVE_MS as u64);
    let mut samples = 0;
    while Instant::now() < until {
        let (queue, terms) = queue_expiries(&server, "kept");
        assert!(
            queue > 0 && queue <= 2 * ALIVE_MS,
            "queue expiry {queue} ms"
        );
        assert!(
            (queue - terms).abs() <= 1,
            "queue {queue} ms, terms {terms} ms"
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(samples >= 20, "{samples} samples");
    assert_eq!(
        queued(&server, "kept").len(),
        1,
        "the live waiter kept its place"
    );
    guard.release().await.unwrap();
    acquired_within(SLACK, waiting, "the release grants the live waiter").await;
    assert_eq!(
        queue_expiries(&server, "kept"),
        (-2, -2),
        "granted: nobody queued"
    );

    // A waiter whose runtime is gone (a process that died) refreshes nothing: with the lock
    // still held, its place and the queue go within two liveness periods of its last refresh.
    let guard = holder.lock("abandoned").unwrap().acquire().await.unwrap();
    let (die, dying) = tokio::sync::oneshot::channel::<()>();
    let url = server.url();
    let doomed = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let waiting = runtime.block_on(async {
            let locks = client_with_url_and_repoll(&url, REPOLL).await;
            let lock = locks.lock("abandoned").unwrap();
            let waiting = tokio::spawn(async move { lock.acquire().await });
            dying.await.unwrap();
            (locks, waiting)
        });
        // Every task of that client stops where it is: nothing more reaches Redis.
        drop(runtime);
        drop(waiting);
    });
    assert!(
        eventually(SLACK, || queued(&server, "abandoned").len() == 1).await,
        "the doomed waiter queued"
    );
    die.send(()).unwrap();
    doomed.join().unwrap();
    let bound = SLACK + Duration::from_millis(2 * ALIVE_MS as u64);
    assert!(
        eventually(bound, || queue_expiries(&server, "abandoned") == (-2, -2)).await,
        "the dead waiter's queue outlived {bound:?}"
    );
    assert!(guard.is_held());
}

//! Multi-locks over two real redis-server processes: one canonical order (no deadlock in
//! opposite orders), mutual exclusion, all or nothing, and cancel-safety.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{RedisServer, client, eventually, queued};
use tower_redis_lock::{ErrorKind, LockClient, LostReason, MultiLock};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(5);

/// Whether the lock `name` (default prefix) exists on `server`, asked with the harness's own
/// connection.
fn locked_on(server: &RedisServer, name: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", &format!("lock:{{{name}}}")]) == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_over_two_servers_never_deadlock_or_overlap() {
    const ROUNDS: usize = 200;
    let (east, west) = (RedisServer::start(), RedisServer::start());
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    // The last fencing token seen per lock (by its place in the canonical order, which both
    // workers share): each must grow in critical-section order.
    let last_tokens = Arc::new(Mutex::new(HashMap::<usize, u64>::new()));
    let mut workers = Vec::new();
    let mut orders = Vec::new();
    for reversed in [false, true] {
        let (e, w) = (client(&east).await, client(&west).await);
        // The same key on both servers (the server breaks the tie) and one more key.
        let mut locks = vec![
            e.lock("account").unwrap(),
            w.lock("account").unwrap(),
            e.lock("ledger").unwrap(),
        ];
        if reversed {
            locks.reverse();
        }
        let multi = MultiLock::new(locks);
        orders.push(
            multi
                .locks()
                .iter()
                .map(|lock| lock.name().to_owned())
                .collect::<Vec<_>>(),
        );
        let (inside, overlaps, last_tokens) =
            (inside.clone(), overlaps.clone(), last_tokens.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = multi.acquire().await.unwrap();
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                {
                    let mut last = last_tokens.lock().unwrap();
                    for (place, token) in guard.fencing_tokens().into_iter().enumerate() {
                        let previous = last.insert(place, token).unwrap_or(0);
                        assert!(token > previous, "tokens grow: {token} after {previous}");
                    }
                }
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    // Names only: which "account" comes first (the server's tie-break) is proven by the run
    // itself, since the two workers give them in opposite orders.
    assert_eq!(orders[0], ["account", "account", "ledger"]);
    assert_eq!(orders[0], orders[1]);
    // 400 acquisitions of three locks take a few seconds; a deadlock would take forever.
    let all = futures_util::future::join_all(workers);
    let finished = tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("both workers finished: opposite orders did not deadlock");
    for worker in finished {
        worker.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "no two holders at once");
    assert!(!locked_on(&east, "account") && !locked_on(&west, "account"));
    assert!(!locked_on(&east, "ledger"));
}

#[tokio::test]
async fn duplicates_are_taken_once_and_locks_are_ordered_by_key() {
    let (east, west) = (RedisServer::start(), RedisServer::start());
    let (e1, e2, w) = (
        client(&east).await,
        client(&east).await,
        client(&west).await,
    );
    let multi = MultiLock::new([
        w.lock("b").unwrap(),
        e1.lock("b").unwrap(),
        e1.lock("a").unwrap(),
        // Another client of the same server: the same lock, taken once.
        e2.lock("a").unwrap(),
    ]);
    let order: Vec<&str> = multi.locks().iter().map(|lock| lock.name()).collect();
    assert_eq!(order, ["a", "b", "b"]);
    assert_ne!(e1.server(), w.server());
    assert_eq!(e1.server(), e2.server());
    let guard = tokio::time::timeout(SLACK, multi.acquire())
        .await
        .expect("a lock named twice does not wait for itself")
        .unwrap();
    assert_eq!(guard.guards().len(), 3);
    assert!(locked_on(&east, "a") && locked_on(&east, "b") && locked_on(&west, "b"));
    guard.release().await.unwrap();
    assert!(!locked_on(&east, "a") && !locked_on(&east, "b") && !locked_on(&west, "b"));
}

#[tokio::test]
async fn one_lock_held_elsewhere_means_none_of_the_others_is_held() {
    let (east, west) = (RedisServer::start(), RedisServer::start());
    let (e, w) = (client(&east).await, client(&west).await);
    let rival = client(&west).await;
    // Canonical order: "x" (east), then "y" (west, held by the rival), then "z" (east).
    let multi = MultiLock::new([
        e.lock("z").unwrap(),
        w.lock("y").unwrap(),
        e.lock("x").unwrap(),
    ]);
    let blocker = rival.lock("y").unwrap().acquire().await.unwrap();

    assert!(multi.try_acquire().await.unwrap().is_none());
    assert!(
        !e.lock("x").unwrap().is_locked().await.unwrap(),
        "x given back"
    );
    assert!(
        !e.lock("z").unwrap().is_locked().await.unwrap(),
        "z never taken"
    );

    let err = multi
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    // Released before the error came back, not in the background.
    assert!(
        !e.lock("x").unwrap().is_locked().await.unwrap(),
        "x released"
    );
    assert!(!e.lock("z").unwrap().is_locked().await.unwrap());
    // The abandoned wait leaves the queue from a background task (the engine's give-back).
    assert!(
        eventually(SLACK, || queued(&west, "y").is_empty()).await,
        "the wait for y was given up"
    );

    blocker.release().await.unwrap();
    let guard = multi
        .try_acquire()
        .await
        .unwrap()
        .expect("all free now: all taken");
    assert_eq!(guard.fencing_tokens().len(), 3);
    assert!(guard.is_held());
    for lock in multi.locks() {
        assert!(lock.is_locked().await.unwrap(), "{} held", lock.name());
    }
    guard.release().await.unwrap();
    for lock in multi.locks() {
        assert!(!lock.is_locked().await.unwrap(), "{} released", lock.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_pending_acquire_releases_everything() {
    let (east, west) = (RedisServer::start(), RedisServer::start());
    let (e, w) = (client(&east).await, client(&west).await);
    let rival = client(&west).await;
    let blocker = rival.lock("y").unwrap().acquire().await.unwrap();
    let multi = MultiLock::new([e.lock("x").unwrap(), w.lock("y").unwrap()]);

    let pending = tokio::spawn(async move { multi.acquire().await });
    // The acquire took "x" and queues for "y" behind the rival.
    assert!(
        eventually(SLACK, || locked_on(&east, "x")
            && queued(&west, "y").len() == 1)
        .await,
        "x taken and the wait for y queued"
    );
    pending.abort();
    assert!(pending.await.unwrap_err().is_cancelled());

    assert!(
        eventually(SLACK, || !locked_on(&east, "x")).await,
        "x released once the acquire was dropped"
    );
    assert!(
        eventually(SLACK, || queued(&west, "y").is_empty()).await,
        "the place in y's queue given back"
    );
    blocker.release().await.unwrap();
    assert!(
        !w.lock("y").unwrap().is_locked().await.unwrap(),
        "y is not handed to the abandoned acquire"
    );
}

#[tokio::test]
async fn losing_one_lock_fires_the_multi_guards_signal() {
    let (east, west) = (RedisServer::start(), RedisServer::start());
    // A short lease, so the watchdog's next renewal (every 200 ms) finds the lock gone soon.
    let short = |server: &RedisServer| {
        LockClient::builder(&server.url())
            .watchdog_lease(Duration::from_millis(600))
            .build()
    };
    let (e, w) = (short(&east).await.unwrap(), short(&west).await.unwrap());
    let operator = client(&west).await;
    let multi = MultiLock::new([e.lock("x").unwrap(), w.lock("y").unwrap()]);
    let guard = multi.acquire().await.unwrap();
    let lost = guard.lost_signal();
    assert!(!lost.is_lost());

    assert!(operator.lock("y").unwrap().force_unlock().await.unwrap());
    let reason = tokio::time::timeout(SLACK, lost.lost())
        .await
        .expect("the signal fires once the renewal of y finds it gone");
    assert_eq!(reason, LostReason::Taken);
    assert!(!guard.is_held());
    assert!(guard.guards()[0].is_held(), "x itself is still held");

    // x is released, y reports that it was no longer held.
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotOwner);
    assert!(!locked_on(&east, "x"));
}

//! Fair locks against a real redis-server: the order of acquisition is the order of arrival
//! across clients and tasks, a release wakes the head waiter only, a dead waiter leaves the
//! queue within its heartbeat timeout, and a live one is never evicted.

mod support;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{ChildGuard, RedisServer, client, eventually, queued};
use tokio::time::Instant;
use tower_redis_lock::{LockClient, LockGuard, LockKind};

/// Generous bound for anything that should take a few round trips: the machine is shared.
const QUICK: Duration = Duration::from_secs(10);

/// Starts a task that waits for the fair lock `name` with `locks` and, once it holds it,
/// records `(index, token)` and releases. Returns when Redis shows the task queued as the
/// `index + 1`-th waiter, so arrival order is fixed by a signal, not a sleep.
async fn queue_waiter(
    server: &RedisServer,
    locks: &LockClient,
    name: &'static str,
    index: usize,
    acquired: &Arc<Mutex<Vec<(usize, u64)>>>,
) -> tokio::task::JoinHandle<()> {
    let lock = locks.fair_lock(name).unwrap();
    let acquired = acquired.clone();
    let task = tokio::spawn(async move {
        let guard = lock.acquire_timeout(Duration::from_secs(60)).await.unwrap();
        acquired
            .lock()
            .unwrap()
            .push((index, guard.fencing_token()));
        guard.release().await.unwrap();
    });
    assert!(
        eventually(QUICK, || queued(server, name).len() == index + 1).await,
        "waiter {index} joined the Redis queue"
    );
    task
}

#[tokio::test]
async fn the_order_of_acquisition_is_the_order_of_arrival_across_three_clients() {
    let server = RedisServer::start();
    let clients = [
        client(&server).await,
        client(&server).await,
        client(&server).await,
    ];
    let holder = clients[0]
        .fair_lock("fair")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let acquired = Arc::new(Mutex::new(Vec::new()));
    // Four tasks per client, interleaved: an exclusive lock would let one client's tasks
    // pass the lock among themselves; a fair one must not.
    let mut tasks = Vec::new();
    for index in 0..12 {
        let locks = &clients[index % 3];
        tasks.push(queue_waiter(&server, locks, "fair", index, &acquired).await);
    }
    holder.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(QUICK * 3, task)
            .await
            .unwrap()
            .unwrap();
    }
    let acquired = acquired.lock().unwrap().clone();
    let order: Vec<usize> = acquired.iter().map(|(index, _)| *index).collect();
    assert_eq!(
        order,
        (0..12).collect::<Vec<_>>(),
        "acquired in arrival order"
    );
    assert!(
        acquired.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "tokens grow in the order of acquisition: {acquired:?}"
    );
    assert!(queued(&server, "fair").is_empty());
}

#[tokio::test]
async fn a_release_wakes_the_head_waiter_only() {
    let server = RedisServer::start();
    let clients = [
        client(&server).await,
        client(&server).await,
        client(&server).await,
    ];
    let mut holder = clients[0]
        .fair_lock("head")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    // Waiters that keep the lock once they have it, so each step can be looked at.
    let mut waiters = Vec::new();
    for (index, locks) in clients.iter().enumerate() {
        let lock = locks.fair_lock("head").unwrap();
        waiters.push(tokio::spawn(async move { lock.acquire().await.unwrap() }));
        assert!(
            eventually(QUICK, || queued(&server, "head").len() == index + 1).await,
            "waiter {index} joined the Redis queue"
        );
    }
    let owners = queued(&server, "head");
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for (index, waiter) in waiters.into_iter().enumerate() {
        holder.release().await.unwrap();
        holder = tokio::time::timeout(QUICK, waiter).await.unwrap().unwrap();
        assert_eq!(holder.owner_id(), owners[index], "the head got it");
        // One wake message per release, to the head's instance; the rest still wait.
        assert_eq!(support::command_calls(&server, "publish"), index as u64 + 1);
        assert_eq!(queued(&server, "head"), owners[index + 1..]);
    }
    holder.release().await.unwrap();
    assert!(
        !clients[0]
            .fair_lock("head")
            .unwrap()
            .is_locked()
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_killed_fair_waiter_blocks_the_queue_no_longer_than_the_lease_it_asked_for() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let other = client(&server).await;
    let holder = locks.fair_lock("killed").unwrap().acquire().await.unwrap();
    let mut dead = ChildGuard(
        Command::new(support::lockctl_path())
            .args(["--url", &server.url(), "hold", "killed", "--kind", "fair"])
            .args(["--for", "10s", "--wait", "60s", "--lease", "3s"])
            .stdout(Stdio::null())
            .spawn()
            .expect("lockctl starts"),
    );
    assert!(
        eventually(QUICK, || queued(&server, "killed").len() == 1).await,
        "the lockctl waiter queued first"
    );
    let live = other.fair_lock("killed").unwrap();
    let live = tokio::spawn(async move { live.acquire().await });
    assert!(
        eventually(QUICK, || queued(&server, "killed").len() == 2).await,
        "the live waiter queued behind it"
    );
    let dead_owner = queued(&server, "killed")[0].clone();
    dead.0.kill().unwrap();
    dead.0.wait().unwrap();
    let killed_at = Instant::now();
    holder.release().await.unwrap();
    let guard: LockGuard = tokio::time::timeout(Duration::from_secs(30), live)
        .await
        .expect("the live waiter got the lock")
        .unwrap()
        .unwrap();
    let waited = killed_at.elapsed();
    // A place lives 3 s past its last heartbeat (3 x the 1 s re-poll interval), a grant to a
    // dead waiter lasts the 3 s lease it asked for (one lease, as for a holder that dies),
    // and the live waiter looks again within 1 s. 2 s of slack for a shared machine.
    let bound = Duration::from_secs(3) + Duration::from_secs(1) + Duration::from_secs(2);
    eprintln!("the live waiter got the lock {waited:?} after the waiter ahead was killed");
    assert!(waited < bound, "the queue was blocked for {waited:?}");
    assert!(!queued(&server, "killed").contains(&dead_owner));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_live_waiter_is_never_evicted_however_long_it_waits() {
    let server = RedisServer::start();
    // A place lives 3 x 50 ms = 150 ms past its last heartbeat here.
    let quick = || {
        LockClient::builder(&server.url())
            .repoll_interval(Duration::from_millis(50))
            .build()
    };
    let (locks, other) = (quick().await.unwrap(), quick().await.unwrap());
    let holder = locks.fair_lock("patient").unwrap().acquire().await.unwrap();
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let first = queue_waiter(&server, &other, "patient", 0, &acquired).await;
    let first_owner = queued(&server, "patient")[0].clone();
    // Twenty heartbeat timeouts: time passing is what this test is about.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        queued(&server, "patient"),
        std::slice::from_ref(&first_owner)
    );
    let second = queue_waiter(&server, &locks, "patient", 1, &acquired).await;
    assert_eq!(queued(&server, "patient")[0], first_owner, "still first");
    holder.release().await.unwrap();
    for task in [first, second] {
        tokio::time::timeout(QUICK, task).await.unwrap().unwrap();
    }
    let order: Vec<usize> = acquired.lock().unwrap().iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1]);
}

#[tokio::test]
async fn the_watchdog_heartbeat_keeps_a_place_alive_from_the_server_clock() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let holder = locks.fair_lock("beat").unwrap().acquire().await.unwrap();
    let other = client(&server).await;
    let acquired = Arc::new(Mutex::new(Vec::new()));
    let waiter = queue_waiter(&server, &other, "beat", 0, &acquired).await;
    let owner = queued(&server, "beat")[0].clone();
    let alive_until = || -> u64 {
        let terms: String = server.cmd(&["HGET", "lock:{beat}:waiters", &owner]);
        terms.split(' ').next().unwrap().parse().unwrap()
    };
    let first = alive_until();
    // Each tick (1 s by default) moves the place's liveness on.
    assert!(
        eventually(QUICK, || alive_until() > first).await,
        "the liveness was extended"
    );
    holder.release().await.unwrap();
    tokio::time::timeout(QUICK, waiter).await.unwrap().unwrap();
    assert_eq!(acquired.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_fair_lock_and_an_exclusive_lock_of_one_name_exclude_each_other() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let fair = locks.fair_lock("both").unwrap();
    assert_eq!(fair.kind(), LockKind::Fair);
    let exclusive = locks.lock("both").unwrap();
    let held = fair.acquire().await.unwrap();
    assert!(exclusive.try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    let held = exclusive.acquire().await.unwrap();
    assert!(fair.try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    assert!(!fair.is_locked().await.unwrap());
}

//! Handing a lock over against a real redis-server: one woken instance per release, in
//! arrival order; a dead waiting instance blocks the queue only briefly; tasks of one client
//! hand the lock over without Redis, within the budget, with tokens and lost signals intact.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::{ChildGuard, RedisServer, client, command_calls, eventually, queued, script_calls};
use tokio::sync::mpsc;
use tower_redis_lock::{LockClient, LockGuard, LostReason};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(2);
/// A re-poll bound far longer than these tests: whatever moves the lock here is a release,
/// not a waiter polling.
const NEVER_POLL: Duration = Duration::from_secs(60);

/// Loads the scripts into the server's cache, so the counts below are one EVALSHA per script
/// run (the first run of a script is counted twice: refused, then loaded and run).
async fn warm_scripts(locks: &LockClient) {
    let lock = locks.lock("warm-up").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();
}

async fn client_with(server: &RedisServer, limit: u32, repoll: Duration) -> LockClient {
    LockClient::builder(&server.url())
        .local_handover_limit(limit)
        .local_handover_window(Duration::from_secs(20))
        .repoll_interval(repoll)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiting_instance_in_arrival_order() {
    const CLIENTS: usize = 8;
    let server = RedisServer::start();
    let holder = client(&server).await;
    warm_scripts(&holder).await;
    let first = holder.lock("herd").unwrap().acquire().await.unwrap();
    let (acquired_tx, mut acquired_rx) = mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..CLIENTS {
        let locks = client_with(&server, 16, NEVER_POLL).await;
        let acquired_tx = acquired_tx.clone();
        let lock = locks.lock("herd").unwrap();
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            acquired_tx.send(i).unwrap();
            guard.release().await.unwrap();
            locks
        }));
        // Queue the clients one after the other, so their arrival order is known.
        assert!(eventually(SLACK, || queued(&server, "herd").len() == i + 1).await);
    }

    let () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let released_at = Instant::now();
    first.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..CLIENTS {
        let next = tokio::time::timeout(SLACK, acquired_rx.recv()).await;
        order.push(next.expect("each release hands the lock on").unwrap());
    }
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(order, (0..CLIENTS).collect::<Vec<_>>(), "arrival order");
    // Eight releases: each published one wake message to one instance, and no instance
    // looked at the lock again (a herd would show up as failed acquire scripts).
    assert_eq!(command_calls(&server, "publish"), CLIENTS as u64);
    // Each client's watchdog may send its heartbeat (one script a second) while the waiters
    // still wait, on a slow machine; a herd would add several scripts per release.
    let ticks = CLIENTS as u64 * (released_at.elapsed().as_secs() + 1);
    let scripts = script_calls(&server);
    assert!(
        (CLIENTS as u64 + 1..=CLIENTS as u64 + 1 + ticks).contains(&scripts),
        "{scripts} scripts for {CLIENTS} releases and the first, {ticks} heartbeats allowed"
    );
    assert!(queued(&server, "herd").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiting_instance_blocks_the_queue_no_longer_than_the_lease_it_asked_for() {
    let server = RedisServer::start();
    let holder = client(&server).await;
    let held = holder.lock("orphan").unwrap().acquire().await.unwrap();
    // Another process queues first, then dies without a word.
    let mut doomed = ChildGuard(
        Command::new(support::lockctl_path())
            .args(["--url", &server.url(), "hold", "orphan", "--for", "1s"])
            .args(["--lease", "3s"])
            .stdout(Stdio::null())
            .spawn()
            .expect("lockctl starts"),
    );
    assert!(eventually(SLACK * 5, || queued(&server, "orphan").len() == 1).await);
    let survivor = client_with(&server, 16, Duration::from_millis(200)).await;
    let waiting = {
        let lock = survivor.lock("orphan").unwrap();
        tokio::spawn(async move { lock.acquire().await.unwrap() })
    };
    assert!(eventually(SLACK, || queued(&server, "orphan").len() == 2).await);
    doomed.0.kill().expect("SIGKILL the waiting process");
    doomed.0.wait().unwrap();

    held.release().await.unwrap();
    // The dead process was first: it gets the lock with the 3 s lease it asked for (a waiter
    // that dies costs one lease, as a holder that dies does), or is skipped once its place
    // expired (three re-polls, 3 s). Either way the survivor has the lock within that lease.
    let bound = Duration::from_secs(3) + SLACK * 2;
    let guard = tokio::time::timeout(bound, waiting)
        .await
        .expect("the survivor gets the lock within the dead waiter's lease")
        .unwrap();
    assert!(guard.is_held());
}

/// Which task held the lock, with which fencing token and owner id.
type Held = (usize, u64, String);

/// Tasks of one client, each waiting for `name` and sending its guard's token and owner when
/// it holds the lock, then releasing it.
fn queue_tasks(
    locks: &LockClient,
    name: &str,
    tasks: usize,
) -> (
    Vec<tokio::task::JoinHandle<()>>,
    mpsc::UnboundedReceiver<Held>,
) {
    let (held_tx, held_rx) = mpsc::unbounded_channel();
    let handles = (0..tasks)
        .map(|i| {
            let (lock, held_tx) = (locks.lock(name).unwrap(), held_tx.clone());
            tokio::spawn(async move {
                let guard = lock.acquire().await.unwrap();
                held_tx
                    .send((i, guard.fencing_token(), guard.owner_id().to_owned()))
                    .unwrap();
                guard.release().await.unwrap();
            })
        })
        .collect();
    (handles, held_rx)
}

// One thread, so that each spawned task joins the local queue before the next one.
#[tokio::test(flavor = "current_thread")]
async fn tasks_of_one_client_hand_the_lock_over_without_redis_with_growing_tokens() {
    let server = RedisServer::start();
    let locks = client_with(&server, 16, NEVER_POLL).await;
    warm_scripts(&locks).await;
    let first = locks.lock("cohort").unwrap().acquire().await.unwrap();
    let (tasks, mut held_rx) = queue_tasks(&locks, "cohort", 5);
    tokio::task::yield_now().await;
    assert_eq!(locks.local_keys(), 1);

    let () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let (first_token, owner) = (first.fencing_token(), first.owner_id().to_owned());
    first.release().await.unwrap();
    let mut tokens = vec![first_token];
    for expected in 0..5 {
        let (i, token, task_owner) = held_rx.recv().await.unwrap();
        assert_eq!(i, expected, "local FIFO order");
        assert_eq!(task_owner, owner, "the same Redis acquisition, handed over");
        tokens.push(token);
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Five hand-overs, then one release: no script (the lock was taken with nobody queued,
    // so its release is an HDEL and an EXISTS), and consecutive tokens from the block the
    // first acquisition reserved.
    assert_eq!(script_calls(&server), 0);
    assert_eq!(command_calls(&server, "hdel"), 1);
    assert_eq!(tokens, (first_token..first_token + 6).collect::<Vec<_>>());
    // Taken free, the block came from the server clock: no counter was written.
    let block_end = first_token + 16;
    assert_eq!(server.cmd::<i64>(&["EXISTS", "lock:{cohort}:fence"]), 0);
    assert!(!locks.lock("cohort").unwrap().is_locked().await.unwrap());

    // The next Redis acquisition, here or anywhere, takes a block above its end (from the
    // counter or from the server clock, whichever is ahead), though a hand-over may have
    // used every token of it.
    let other = client(&server).await;
    let next = other.lock("cohort").unwrap().acquire().await.unwrap();
    assert!(next.fencing_token() > block_end);
}

// One thread: the waiting task is polled only where the test says.
#[tokio::test(flavor = "current_thread")]
async fn a_lock_carried_to_a_local_task_that_left_is_given_back_not_left_to_its_lease() {
    let server = RedisServer::start();
    let locks = client_with(&server, 16, NEVER_POLL).await;
    let lock = locks.lock("left").unwrap();
    let held = lock.acquire().await.unwrap();
    // A second task of this client queues behind the holder (polled once), then leaves
    // after the lock was carried to it and before it ran.
    let mut waiting = Box::pin(lock.acquire());
    tokio::select! {
        biased;
        _ = &mut waiting => panic!("the lock is held"),
        () = std::future::ready(()) => {}
    }
    held.release().await.unwrap();
    assert!(
        lock.is_locked().await.unwrap(),
        "carried to the waiting task without Redis: still held there"
    );
    drop(waiting);
    assert_eq!(locks.local_keys(), 0, "nobody of this client wants the key");

    // Given back in the background: another instance takes it at once, not after the
    // 30-second lease that the watchdog would otherwise have renewed for nobody. The bound
    // is a third of that lease, for a shared machine.
    let other = client(&server).await;
    let taken = tokio::time::timeout(
        Duration::from_secs(10),
        other.lock("left").unwrap().acquire(),
    )
    .await;
    assert!(taken.is_ok(), "the carried lock was left to its lease");
}

// One thread, so that each spawned task joins the local queue before the next one.
#[tokio::test(flavor = "current_thread")]
async fn past_the_budget_the_lock_goes_through_redis_to_the_waiting_instance() {
    let server = RedisServer::start();
    let (here, there) = (
        client_with(&server, 2, NEVER_POLL).await,
        client_with(&server, 2, NEVER_POLL).await,
    );
    let first = here.lock("budget").unwrap().acquire().await.unwrap();
    let (local_tasks, mut local_rx) = queue_tasks(&here, "budget", 4);
    tokio::task::yield_now().await;
    let (remote_tasks, mut remote_rx) = queue_tasks(&there, "budget", 1);
    assert!(eventually(SLACK, || queued(&server, "budget").len() == 1).await);

    first.release().await.unwrap();
    // Two local hand-overs (the budget), then the other instance, then the rest of here.
    let mut sequence = Vec::new();
    for _ in 0..2 {
        sequence.push(("here", local_rx.recv().await.unwrap().1));
    }
    sequence.push(("there", remote_rx.recv().await.unwrap().1));
    for _ in 0..2 {
        sequence.push(("here", local_rx.recv().await.unwrap().1));
    }
    for task in local_tasks.into_iter().chain(remote_tasks) {
        task.await.unwrap();
    }
    assert!(
        sequence.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "tokens grow in the order the lock was held: {sequence:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_not_handed_over_and_a_loss_after_a_hand_over_reaches_the_new_holder() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .watchdog_lease(Duration::from_millis(900))
        .renew_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let operator = client(&server).await.lock("fragile").unwrap();
    let lock = locks.lock("fragile").unwrap();
    let spawn_acquire = || {
        let lock = lock.clone();
        tokio::spawn(async move { lock.acquire().await.unwrap() })
    };

    // Lost while held, with a local task waiting: the waiter gets a fresh Redis acquisition.
    let first = lock.acquire().await.unwrap();
    let waiting = spawn_acquire();
    assert!(eventually(SLACK, || locks.local_keys() == 1).await);
    assert!(operator.force_unlock().await.unwrap());
    let lost = tokio::time::timeout(SLACK, first.lost_signal().lost()).await;
    assert_eq!(lost.expect("the watchdog notices"), LostReason::Taken);
    let second = tokio::time::timeout(SLACK, waiting).await.unwrap().unwrap();
    assert_ne!(second.owner_id(), first.owner_id(), "not handed over");
    assert!(second.fencing_token() > first.fencing_token());
    assert!(second.is_held());

    // Handed over, then lost: the signal reaches the task that holds it now.
    let third = spawn_acquire();
    assert!(eventually(SLACK, || locks.local_keys() == 1).await);
    drop(second);
    let third: LockGuard = tokio::time::timeout(SLACK, third).await.unwrap().unwrap();
    assert!(operator.force_unlock().await.unwrap());
    let lost = tokio::time::timeout(SLACK, third.lost_signal().lost()).await;
    assert_eq!(lost.expect("the new holder is told"), LostReason::Taken);
    assert!(!third.is_held());
    drop(first);
}

// One thread, so that the local task joins the queue before the release.
#[tokio::test(flavor = "current_thread")]
async fn a_hand_over_whose_script_fails_gives_the_lock_back_instead_of_leaving_it_a_lease() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    let lease = Duration::from_secs(20);
    let command_timeout = Duration::from_millis(500);
    // Limit 0: a release while another task of this client waits goes through Redis.
    let here = LockClient::builder(&proxy.url())
        .watchdog_lease(lease)
        .local_handover_limit(0)
        .command_timeout(command_timeout)
        .build()
        .await
        .unwrap();
    let there = client(&server).await;
    let first = here.lock("stalled").unwrap().acquire().await.unwrap();
    let lock = there.lock("stalled").unwrap();
    let remote = tokio::spawn(async move { lock.acquire_timeout(lease).await });
    assert!(eventually(SLACK, || queued(&server, "stalled").len() == 1).await);
    let (local_tasks, _local_rx) = queue_tasks(&here, "stalled", 1);
    tokio::task::yield_now().await;

    // The hand-over script goes into a black hole and times out.
    proxy.black_hole();
    let released_at = Instant::now();
    assert!(
        first.release().await.is_err(),
        "the hand-over was not confirmed"
    );
    proxy.heal();
    let taken = remote
        .await
        .unwrap()
        .expect("the other instance gets the lock");
    let waited = released_at.elapsed();
    // A command timeout, the give-back's retry and a claim lease at most; not the lease.
    assert!(
        waited < command_timeout + SLACK * 2,
        "the other instance waited {waited:?} for a lock nobody held (lease {lease:?})"
    );
    taken.release().await.unwrap();
    for task in local_tasks {
        task.await.unwrap();
    }
}

// One thread, so that the local task joins the queue before the release.
#[tokio::test(flavor = "current_thread")]
async fn a_hand_over_through_redis_that_keeps_the_lock_gives_the_next_task_its_fresh_token() {
    let server = RedisServer::start();
    // Limit 0: a release while another task of this client waits goes through Redis, which
    // keeps the lock for this client when no other instance waits.
    let here = client_with(&server, 0, NEVER_POLL).await;
    let lock = here.lock("kept").unwrap();
    let first = lock.acquire().await.unwrap();
    let (successor_tx, successor_rx) = tokio::sync::oneshot::channel();
    let waiting = lock.clone();
    tokio::spawn(async move { successor_tx.send(waiting.acquire().await.unwrap()) });
    tokio::task::yield_now().await;
    let first_token = first.fencing_token();
    first.release().await.unwrap();
    let second = tokio::time::timeout(SLACK, successor_rx)
        .await
        .expect("the next task holds the lock")
        .unwrap();
    assert!(second.is_held());
    assert_ne!(second.fencing_token(), 0);
    let fence = lock
        .inspect()
        .await
        .unwrap()
        .fence
        .expect("the block granted from the queue");
    assert!(
        second.fencing_token() > first_token && second.fencing_token() <= fence,
        "token {} after {first_token}, within the block Redis reserved (up to {fence})",
        second.fencing_token(),
    );
    let next = second.fencing_token();
    second.release().await.unwrap();
    let elsewhere = client(&server).await;
    let third = elsewhere.lock("kept").unwrap().acquire().await.unwrap();
    assert!(third.fencing_token() > next);
}

/// The lease of the lock the hand-over test below holds: long enough that the hand-over's
/// reply can be held back past nine tenths of it and still reach Redis before it runs out.
const HANDED_LEASE: Duration = Duration::from_secs(5);

// One thread, so that the local task joins the queue before the release.
#[tokio::test(flavor = "current_thread")]
async fn a_hand_over_answered_past_the_lease_deadline_leaves_no_unrenewed_holder() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    // Limit 0: the release goes through Redis; the command timeout outlasts the black hole.
    let here = LockClient::builder(&proxy.url())
        .watchdog_lease(HANDED_LEASE)
        .local_handover_limit(0)
        .command_timeout(HANDED_LEASE * 2)
        .build()
        .await
        .unwrap();
    let there = client(&server).await;
    let lock = here.lock("late").unwrap();
    let first = lock.acquire().await.unwrap();
    let acquired_at = Instant::now();
    let (successor_tx, mut successor_rx) = tokio::sync::oneshot::channel();
    let waiting = lock.clone();
    tokio::spawn(async move { successor_tx.send(waiting.acquire().await.unwrap()) });
    tokio::task::yield_now().await;

    // The hand-over reaches Redis, and its reply this client, only once nine tenths of the
    // lease have passed: the lease is past its deadline when the reply says it was kept.
    proxy.black_hole();
    let releasing = tokio::spawn(first.release());
    tokio::time::sleep_until((acquired_at + HANDED_LEASE.mul_f64(0.94)).into()).await;
    proxy.heal();
    let other = there.lock("late").unwrap();
    let mut elsewhere = tokio::spawn(async move { other.acquire_timeout(HANDED_LEASE * 3).await });
    tokio::select! {
        successor = &mut successor_rx => {
            let successor: LockGuard = successor.unwrap();
            match (&mut elsewhere).await.unwrap() {
                Ok(taken) => assert!(
                    !successor.is_held(),
                    "another client took the lock (token {}) while the next task of this \
                     client still holds it (token {})",
                    taken.fencing_token(),
                    successor.fencing_token()
                ),
                // Renewed all along: nobody else could take it.
                Err(_) => assert!(successor.is_held()),
            }
        }
        taken = &mut elsewhere => {
            let taken = taken.unwrap().expect("the other client holds the lock");
            let taken_token = taken.fencing_token();
            taken.release().await.unwrap();
            let successor = tokio::time::timeout(SLACK * 2, successor_rx)
                .await
                .expect("the next task gets the lock after the other client")
                .unwrap();
            assert!(successor.is_held());
            assert!(successor.fencing_token() > taken_token);
        }
    }
    let _ = releasing.await;
}

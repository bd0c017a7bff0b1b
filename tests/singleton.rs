//! Singleton tasks as their users meet them: candidates of several clients lead one at a
//! time, a leader cut off from Redis is told and dropped before the next one starts, a
//! process paused past its lease never runs its task again, a shutdown hands the leadership
//! over at once, terms only grow, and a stale leader's writes are refused. Real servers;
//! faults through the fault proxy and a runtime blocked as a paused process is.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::terms::{Timeline, cooperative, stubborn};
use support::{RedisServer, client_with_lease};
use tokio::sync::mpsc;
use tower_redis_lock::singleton::{AfterTaskEnd, StopReason};
use tower_redis_lock::{ErrorKind, GuardedWrites, Leadership, LockClient};

/// Bound for steps that normally take milliseconds: generous because CI machines are shared
/// and a debug build on two cores can stall for a while. Far below the 30 s lease of the
/// hand-over tests, so passing it still shows that no lease was waited out.
const SLACK: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_hands_the_leadership_to_the_next_candidate_at_once_not_after_a_lease() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(30);
    let timeline = Timeline::default();
    let mut handles = Vec::new();
    for candidate in 0..3 {
        let locks = client_with_lease(&server.url(), lease).await;
        let singleton = locks.singleton("reconcile").expect("a valid name");
        handles.push(Some(singleton.spawn(cooperative(&timeline, candidate))));
    }
    for change in 0..3 {
        let leader = timeline.leader_after(change, SLACK).await;
        let handle = handles[leader.candidate]
            .take()
            .expect("a candidate leads once");
        let asked = Instant::now();
        handle.shutdown().await.expect("a clean shutdown");
        let handed = Instant::now();
        let ended = timeline.snapshot()[change].clone();
        assert_eq!(
            ended.told.map(|(_, reason)| reason),
            Some(StopReason::ShutDown),
            "the leader is told why it stops"
        );
        assert!(
            ended.ended.is_some_and(|ended| ended <= handed),
            "stopped before the hand-over"
        );
        if change < 2 {
            let next = timeline.leader_after(change + 1, SLACK).await;
            assert_ne!(next.candidate, leader.candidate);
            eprintln!(
                "hand-over {}: the next leader started {:?} after the shutdown was asked",
                change + 1,
                next.started.duration_since(asked)
            );
            assert!(
                next.started.duration_since(asked) < SLACK,
                "the next candidate leads {:?} after the shutdown: a lease is {lease:?}",
                next.started.duration_since(asked)
            );
        }
    }
    timeline.assert_one_at_a_time();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ignores_its_stop_is_dropped_after_the_grace_before_the_next_leader_starts() {
    let server = RedisServer::start();
    let timeline = Timeline::default();
    let grace = Duration::from_millis(300);
    let first = client_with_lease(&server.url(), Duration::from_secs(30)).await;
    let leader = first
        .singleton("reconcile")
        .expect("name")
        .grace(grace)
        .spawn(stubborn(&timeline, 0));
    timeline.leader_after(0, SLACK).await;
    let second = client_with_lease(&server.url(), Duration::from_secs(30)).await;
    let next = second
        .singleton("reconcile")
        .expect("name")
        .spawn(cooperative(&timeline, 1));
    leader.shutdown().await.expect("a clean shutdown");
    let stopped = timeline.snapshot()[0].clone();
    let (told, _) = stopped.told.expect("told to stop");
    let ended = stopped.ended.expect("dropped");
    assert!(
        ended.duration_since(told) >= grace,
        "kept for its grace: {stopped:?}"
    );
    timeline.leader_after(1, SLACK).await;
    timeline.assert_one_at_a_time();
    next.shutdown().await.expect("a clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_redis_is_dropped_before_the_next_leader_starts_and_terms_grow() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(2);
    let timeline = Timeline::default();
    let mut proxies = Vec::new();
    let mut handles = Vec::new();
    for candidate in 0..3 {
        let proxy = FaultProxy::start(server.port()).await;
        let locks = client_with_lease(&proxy.url(), lease).await;
        // A task that ignores its stop: only the drop at the lease's end ends it, so the
        // check below sees that drop, not the task's good will.
        let singleton = locks
            .singleton("reconcile")
            .expect("name")
            .grace(lease * 10);
        handles.push(singleton.spawn(stubborn(&timeline, candidate)));
        proxies.push(proxy);
    }
    // Each cut-off leader is noticed by its renewals, told a tenth of the lease before the
    // lease runs out, and dropped when it does; Redis then lets the lease run out and grants
    // the next candidate. Six changes of leader, every candidate cut off twice.
    for change in 0..6 {
        let leader = timeline.leader_after(change, lease * 5).await;
        proxies[leader.candidate].black_hole();
        timeline.leader_after(change + 1, lease * 5).await;
        proxies[leader.candidate].heal();
    }
    timeline.assert_one_at_a_time();
    for term in &timeline.snapshot()[..6] {
        assert!(
            matches!(term.told, Some((_, StopReason::Lost(_)))),
            "a cut-off leader is told its lease is lost: {term:?}"
        );
    }
    for handle in handles {
        handle.shutdown().await.expect("a clean shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_never_runs_its_task_again_and_its_writes_are_refused() {
    let server = RedisServer::start();
    let lease = Duration::from_secs(2);
    let timeline = Timeline::default();
    // The candidate to be paused runs on a thread and runtime of its own: blocking that
    // thread stops its task, its watchdog and its connections together, as a SIGSTOP does.
    let steps: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let (kept_sender, mut kept) = mpsc::unbounded_channel::<Leadership>();
    let (stop_paused, paused_stopped) = std::sync::mpsc::channel::<()>();
    let paused = {
        let url = server.url();
        let timeline = timeline.clone();
        let steps = steps.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let locks = client_with_lease(&url, lease).await;
                let handle = locks
                    .singleton("reconcile")
                    .expect("name")
                    .spawn(move |leadership| {
                        let timeline = timeline.clone();
                        let steps = steps.clone();
                        let kept_sender = kept_sender.clone();
                        async move {
                            let _record = timeline.begin(0, &leadership);
                            let _ = kept_sender.send(leadership.clone());
                            for step in 0.. {
                                steps.lock().unwrap().push(Instant::now());
                                if step == 3 {
                                    // The pause: three leases long, in the middle of a step.
                                    std::thread::sleep(lease * 3);
                                }
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    });
                let _ = tokio::task::spawn_blocking(move || paused_stopped.recv()).await;
                handle.shutdown().await.expect("a clean shutdown");
            });
        })
    };
    let first = timeline.leader_after(0, SLACK).await;
    assert_eq!(first.candidate, 0);
    let other = client_with_lease(&server.url(), lease).await;
    let other_handle = other
        .singleton("reconcile")
        .expect("name")
        .spawn(cooperative(&timeline, 1));
    let next = timeline.leader_after(1, lease * 5).await;
    assert_eq!(
        next.candidate, 1,
        "the other candidate leads during the pause"
    );
    // Give the paused candidate time to wake up and run whatever it would still run.
    let woke = Instant::now() + lease * 3;
    while Instant::now() < woke && timeline.snapshot()[0].ended.is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last_step = *steps.lock().unwrap().last().expect("steps");
    assert!(
        last_step < next.started,
        "the paused leader's task ran a step after the next leader started"
    );
    assert!(
        timeline.snapshot()[0].ended.is_some(),
        "the paused leader's task is dropped"
    );
    let stale = kept.recv().await.expect("the paused leader's leadership");
    assert!(!stale.is_leading());
    let refused = stale
        .write_if_leading(&GuardedWrites::new().set("reconciled", "stale"))
        .await
        .expect("an answer");
    assert!(!refused, "a stale leader's write is refused");
    let exists: i64 = server.cmd(&["EXISTS", "reconciled"]);
    assert_eq!(exists, 0);
    stop_paused.send(()).expect("the paused candidate listens");
    paused.join().expect("the paused candidate ends");
    other_handle.shutdown().await.expect("a clean shutdown");
    // The paused task is dropped only once its process runs again, after the next leader
    // started; what counts is that none of its steps ran after that (above).
    let terms: Vec<u64> = timeline.snapshot().iter().map(|term| term.term).collect();
    assert!(
        terms.windows(2).all(|pair| pair[0] < pair[1]),
        "terms grow: {terms:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_writes_under_its_term_and_a_task_that_ends_resigns_or_campaigns_again() {
    let server = RedisServer::start();
    let locks = client_with_lease(&server.url(), Duration::from_secs(30)).await;
    let others = client_with_lease(&server.url(), Duration::from_secs(30)).await;
    let terms: Arc<Mutex<Vec<u64>>> = Arc::default();

    // Campaign again: two candidates whose task returns at once take turns, terms growing.
    let runs = |locks: &LockClient| {
        let terms = terms.clone();
        locks
            .singleton("reconcile")
            .expect("name")
            .spawn(move |leadership| {
                let terms = terms.clone();
                async move {
                    let written = leadership
                        .write_if_leading(
                            &GuardedWrites::new().set("last-term", leadership.term().to_string()),
                        )
                        .await
                        .expect("an answer");
                    assert!(written, "a leader's write is applied");
                    terms.lock().unwrap().push(leadership.term());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
    };
    let (first, second) = (runs(&locks), runs(&others));
    let enough = Instant::now() + SLACK;
    while terms.lock().unwrap().len() < 10 {
        assert!(
            Instant::now() < enough,
            "ten terms within {SLACK:?}: {terms:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.shutdown().await.expect("a clean shutdown");
    second.shutdown().await.expect("a clean shutdown");
    let terms = terms.lock().unwrap().clone();
    assert!(
        terms.windows(2).all(|pair| pair[0] < pair[1]),
        "terms grow: {terms:?}"
    );
    let last: String = server.cmd(&["GET", "last-term"]);
    assert_eq!(last, terms.last().unwrap().to_string());

    // Resign: the run ends after one term and the next candidate leads.
    let resigned = locks
        .singleton("report")
        .expect("name")
        .after_task_ends(AfterTaskEnd::Resign)
        .run_until(std::future::pending(), |_| async {});
    tokio::time::timeout(SLACK, resigned)
        .await
        .expect("a resigning run ends")
        .expect("without error");
    let next = others
        .lock("report")
        .expect("name")
        .try_acquire()
        .await
        .expect("an answer");
    assert!(
        next.is_some(),
        "the leadership was handed over when the task ended"
    );
}

#[tokio::test]
async fn a_bad_singleton_name_is_refused_before_anything_is_sent() {
    let locks = support::client_on_silent_port(support::free_port()).await;
    let refused = locks.singleton("").expect_err("an empty name");
    assert_eq!(refused.kind(), ErrorKind::InvalidName);
    let refused = locks
        .singleton(&"x".repeat(tower_redis_lock::MAX_NAME_LEN + 1))
        .expect_err("a name too long");
    assert_eq!(refused.kind(), ErrorKind::InvalidName);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_lockctl_show_the_leader_its_term_since_when_and_the_candidates() {
    let server = RedisServer::start();
    let timeline = Timeline::default();
    let url = server.url();
    let named = async |name: &str| {
        LockClient::builder(&url)
            .instance_name(name)
            .build()
            .await
            .expect("client")
    };
    let (first, second) = (named("orders-a").await, named("orders-b").await);
    let leading = first
        .singleton("reconcile")
        .expect("name")
        .spawn(cooperative(&timeline, 0));
    let term = timeline.leader_after(0, SLACK).await.term;
    let waiting = second
        .singleton("reconcile")
        .expect("name")
        .spawn(cooperative(&timeline, 1));
    assert!(
        support::eventually(SLACK, || support::queued(&server, "reconcile").len() == 1).await,
        "the second candidate waits in line"
    );

    let snapshot = second.inspect("reconcile").await.expect("a snapshot");
    let leader = snapshot.leader.clone().expect("a leader recorded");
    assert_eq!(
        (leader.instance.as_str(), leader.term, leader.leading),
        ("orders-a", term, true)
    );
    assert!(leader.since_ms <= snapshot.server_time_ms);
    assert_eq!(snapshot.waiters[0].instance, "orders-b");

    let shown = std::process::Command::new(support::lockctl_path())
        .args(["--url", &server.url(), "inspect", "reconcile", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("lockctl starts");
    let (code, shown) = support::lockctl_outcome(shown);
    assert_eq!(code, 0);
    assert_eq!(shown["leader"]["instance"], "orders-a");
    assert_eq!(shown["leader"]["term"], term);
    assert_eq!(shown["leader"]["leading"], true);
    assert_eq!(shown["waiters"][0]["instance"], "orders-b");

    // Once every candidate is gone, the last leader shows as no longer leading.
    leading.shutdown().await.expect("a clean shutdown");
    timeline.leader_after(1, SLACK).await;
    waiting.shutdown().await.expect("a clean shutdown");
    let leader = first
        .inspect("reconcile")
        .await
        .expect("a snapshot")
        .leader
        .expect("the last leader");
    assert_eq!(
        (leader.instance.as_str(), leader.leading),
        ("orders-b", false)
    );
}

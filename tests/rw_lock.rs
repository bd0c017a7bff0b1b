//! The read-write lock against a real redis-server: readers share, writers exclude, re-entry,
//! reading inside the write lock and the downgrade, how a release wakes the queue, no writer
//! starvation, every reader's own lease (a dead reader frees its share), the watchdog's
//! renewal of readers, plain and read-write locks of one name, and fencing tokens.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use support::proxy::FaultProxy;
use support::{RedisServer, client, eventually, queued};
use tokio::sync::{Barrier, mpsc, oneshot};
use tokio::task::JoinHandle;
use tower_redis_lock::{ErrorKind, Lease, Lock, LockClient, LockGuard, LostReason};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(2);
/// A re-poll bound far longer than any wait these tests allow: a waiter that meets them was
/// woken by its grant message, not by polling.
const NEVER_POLL: Duration = Duration::from_secs(60);

fn read(locks: &LockClient, name: &str) -> Lock {
    locks.read_write_lock(name).unwrap().read()
}

fn write(locks: &LockClient, name: &str) -> Lock {
    locks.read_write_lock(name).unwrap().write()
}

/// A client that never re-polls within a test: it only learns of a grant from its message.
async fn client_never_polling(server: &RedisServer) -> LockClient {
    LockClient::builder(&server.url())
        .repoll_interval(NEVER_POLL)
        .build()
        .await
        .unwrap()
}

/// Starts waiting for `lock` in a task, and returns once the waiter is the `place`th in the
/// Redis queue of `name`.
async fn queue_for(
    server: &RedisServer,
    lock: Lock,
    name: &str,
    place: usize,
) -> JoinHandle<LockGuard> {
    let waiting = tokio::spawn(async move { lock.acquire().await.unwrap() });
    assert!(
        eventually(SLACK, || queued(server, name).len() == place).await,
        "waiter number {place} queued for {name}"
    );
    waiting
}

/// The guard of a waiter that must have acquired within `bound`; `why` says what that proves.
async fn granted(waiting: JoinHandle<LockGuard>, bound: Duration, why: &str) -> LockGuard {
    let guard = tokio::time::timeout(bound, waiting)
        .await
        .unwrap_or_else(|_| panic!("not acquired within {bound:?}: {why}"))
        .unwrap();
    assert!(guard.is_held());
    guard
}

fn pttl(server: &RedisServer, name: &str) -> i64 {
    server.cmd(&["PTTL", &format!("lock:{{{name}}}")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_readers_of_two_clients_hold_the_lock_at_once() {
    const READERS: usize = 8;
    let server = RedisServer::start();
    let clients = [client(&server).await, client(&server).await];
    let inside = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    // Nobody leaves before all have entered: passing the barrier proves they all held at once.
    let all_in = Arc::new(Barrier::new(READERS));
    let mut readers = Vec::new();
    for i in 0..READERS {
        let lock = read(&clients[i % 2], "shared");
        let (inside, most_inside, all_in) = (inside.clone(), most_inside.clone(), all_in.clone());
        readers.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most_inside.fetch_max(now_inside, Ordering::SeqCst);
            all_in.wait().await;
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.unwrap();
        }));
    }
    let everyone = futures_util::future::join_all(readers);
    let finished = tokio::time::timeout(SLACK * 5, everyone).await;
    assert!(
        finished.is_ok(),
        "the readers could not all hold the lock at once"
    );
    assert_eq!(most_inside.load(Ordering::SeqCst), READERS);
    let keys: Vec<String> = server.cmd(&["KEYS", "lock:{shared}"]);
    assert!(keys.is_empty(), "the last reader's release freed the lock");
}

/// Shared by the tasks of the mixed load: who is inside, and what went wrong.
#[derive(Default)]
struct Detector {
    readers: AtomicUsize,
    writers: AtomicUsize,
    most_readers: AtomicUsize,
    overlaps: AtomicUsize,
    /// The largest token of a writer's section that has ended, and of any section.
    ended_writer_token: AtomicU64,
    ended_token: AtomicU64,
    stale_tokens: AtomicUsize,
}

impl Detector {
    fn enter_read(&self, token: u64) {
        let readers = self.readers.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_readers.fetch_max(readers, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        // A reader granted after a writer left has a later token.
        if token <= self.ended_writer_token.load(Ordering::SeqCst) {
            self.stale_tokens.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave_read(&self, token: u64) {
        if self.writers.load(Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.ended_token.fetch_max(token, Ordering::SeqCst);
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }

    fn enter_write(&self, token: u64) {
        if self.writers.fetch_add(1, Ordering::SeqCst) > 0
            || self.readers.load(Ordering::SeqCst) > 0
        {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        // A writer is granted only after every earlier section left: its token is above all.
        if token <= self.ended_token.load(Ordering::SeqCst) {
            self.stale_tokens.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave_write(&self, token: u64) {
        if self.writers.load(Ordering::SeqCst) > 1 || self.readers.load(Ordering::SeqCst) > 0 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.ended_token.fetch_max(token, Ordering::SeqCst);
        self.ended_writer_token.fetch_max(token, Ordering::SeqCst);
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_exclude_readers_and_each_other_under_a_mixed_load() {
    const CLIENTS: usize = 2;
    const READERS: usize = 6;
    const WRITERS: usize = 2;
    const ROUNDS: usize = 50;
    let server = RedisServer::start();
    let detector = Arc::new(Detector::default());
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let locks = client(&server).await;
        let rw = locks.read_write_lock("mixed").unwrap();
        for task in 0..READERS + WRITERS {
            let writer = task < WRITERS;
            let lock = if writer { rw.write() } else { rw.read() };
            let detector = detector.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = lock.acquire_timeout(Duration::from_secs(60)).await.unwrap();
                    let token = guard.fencing_token();
                    if writer {
                        detector.enter_write(token);
                    } else {
                        detector.enter_read(token);
                    }
                    // The critical section's work: long enough for an overlap to be seen.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    if writer {
                        detector.leave_write(token);
                    } else {
                        detector.leave_read(token);
                    }
                    guard.release().await.unwrap();
                }
            }));
        }
    }
    // About 200 writer hand-overs through Redis; a debug build on two shared cores does them
    // in seconds, the bound only catches a wedged queue.
    let all = futures_util::future::join_all(tasks);
    let finished = tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("every task finished its rounds");
    for task in finished {
        task.unwrap();
    }
    assert_eq!(detector.overlaps.load(Ordering::SeqCst), 0, "overlaps");
    assert_eq!(
        detector.stale_tokens.load(Ordering::SeqCst),
        0,
        "stale tokens"
    );
    assert!(
        detector.most_readers.load(Ordering::SeqCst) > 1,
        "readers shared the lock under load"
    );
    let keys: Vec<String> = server.cmd(&["KEYS", "lock:{mixed}*"]);
    assert_eq!(
        keys,
        vec!["lock:{mixed}:fence".to_owned()],
        "nothing left behind"
    );
}

#[tokio::test]
async fn a_writer_reenters_and_only_its_last_release_lets_readers_in() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let lock = write(&holder, "reenter-w");
    let reader = read(&other, "reenter-w");

    let first = lock.acquire().await.unwrap();
    let second = first.reenter().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert_eq!(second.fencing_token(), first.fencing_token());
    first.release().await.unwrap();
    assert!(
        reader.try_acquire().await.unwrap().is_none(),
        "still written"
    );
    second.release().await.unwrap();
    let read = reader.try_acquire().await.unwrap();
    assert!(read.is_some(), "free after the last write hold");
}

#[tokio::test]
async fn a_reader_reenters_and_only_its_last_release_lets_a_writer_in() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let lock = read(&holder, "reenter-r");
    let writer = write(&other, "reenter-r");

    let first = lock.acquire().await.unwrap();
    let second = first.reenter().await.unwrap();
    let state = lock.inspect().await.unwrap();
    assert_eq!(state.holders, vec![(first.owner_id().to_owned(), 2)]);
    first.release().await.unwrap();
    assert!(writer.try_acquire().await.unwrap().is_none(), "still read");
    second.release().await.unwrap();
    assert!(writer.try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_inside_the_write_lock_survives_its_release_as_a_downgrade() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let rw = holder.read_write_lock("downgrade").unwrap();

    let written = rw.write().acquire().await.unwrap();
    let reading = written.read_within().await.unwrap();
    assert_eq!(reading.owner_id(), written.owner_id());
    assert!(reading.fencing_token() > written.fencing_token());
    let again = reading.reenter().await.unwrap();
    again.release().await.unwrap();
    assert!(
        read(&other, "downgrade")
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "no other reader while the write lock is held"
    );

    written.release().await.unwrap();
    // The owner still reads, alone; the lock is read-held now, so another reader joins.
    assert!(reading.is_held());
    let state = rw.read().inspect().await.unwrap();
    assert_eq!(state.holders, vec![(reading.owner_id().to_owned(), 1)]);
    let joined = read(&other, "downgrade").try_acquire().await.unwrap();
    let joined = joined.expect("a reader joins the downgraded lock");
    assert!(joined.fencing_token() > reading.fencing_token());

    // A writer waits for both reads.
    let writer = queue_for(&server, write(&other, "downgrade"), "downgrade", 1).await;
    joined.release().await.unwrap();
    assert!(!writer.is_finished(), "the downgraded read still holds");
    assert!(
        reading.is_held(),
        "the read inside is the owner's last hold now"
    );
    reading.release().await.unwrap();
    let written = granted(writer, SLACK, "the last read's release grants the writer").await;
    written.release().await.unwrap();
}

#[tokio::test]
async fn only_a_held_write_guard_reads_within() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let reader = read(&locks, "within").acquire().await.unwrap();
    let err = reader.read_within().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotOwner, "a read guard");
    reader.release().await.unwrap();

    let plain = locks.lock("within-plain").unwrap().acquire().await.unwrap();
    let err = plain.read_within().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotOwner, "a plain lock's guard");

    let written = write(&locks, "within").acquire().await.unwrap();
    assert!(write(&locks, "within").force_unlock().await.unwrap());
    let err = written.read_within().await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotOwner,
        "a write lock no longer held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_release_wakes_the_queued_readers_together_and_writers_one_at_a_time() {
    const READERS: usize = 4;
    let server = RedisServer::start();
    let holder = client(&server).await;
    let waiters = [
        client_never_polling(&server).await,
        client_never_polling(&server).await,
    ];
    let first = write(&holder, "wake").acquire().await.unwrap();

    // Readers hold until told, and say when they got in.
    let (entered, mut entries) = mpsc::unbounded_channel();
    let mut leave = Vec::new();
    let mut readers = Vec::new();
    for i in 0..READERS {
        let lock = read(&waiters[i % 2], "wake");
        let (entered, (go, gone)) = (entered.clone(), oneshot::channel::<()>());
        leave.push(go);
        readers.push(tokio::spawn(async move {
            let guard = lock.acquire().await.unwrap();
            entered.send(guard.fencing_token()).unwrap();
            let _ = gone.await;
            guard.release().await.unwrap();
        }));
        assert!(eventually(SLACK, || queued(&server, "wake").len() == i + 1).await);
    }
    let writer_a = queue_for(&server, write(&waiters[0], "wake"), "wake", READERS + 1).await;
    let writer_b = queue_for(&server, write(&waiters[1], "wake"), "wake", READERS + 2).await;

    let first_token = first.fencing_token();
    first.release().await.unwrap();
    // Every reader gets in while the others still hold: one release granted them all.
    let mut tokens = Vec::new();
    for _ in 0..READERS {
        let token = tokio::time::timeout(SLACK, entries.recv())
            .await
            .expect("every queued reader granted by the one release")
            .unwrap();
        assert!(token > first_token);
        tokens.push(token);
    }
    assert_eq!(
        queued(&server, "wake").len(),
        2,
        "only the writers still queue"
    );
    assert!(!writer_a.is_finished() && !writer_b.is_finished());

    for go in leave {
        go.send(()).unwrap();
    }
    for reader in readers {
        reader.await.unwrap();
    }
    let a = granted(
        writer_a,
        SLACK,
        "the last reader's release grants the writer",
    )
    .await;
    assert!(a.fencing_token() > *tokens.iter().max().unwrap());
    assert_eq!(queued(&server, "wake").len(), 1, "one writer at a time");
    assert!(!writer_b.is_finished());
    a.release().await.unwrap();
    let b = granted(writer_b, SLACK, "the next writer's turn").await;
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_do_not_overtake_a_queued_writer() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let reading = read(&holder, "no-overtake").acquire().await.unwrap();
    let writer = queue_for(&server, write(&other, "no-overtake"), "no-overtake", 1).await;

    let late = read(&other, "no-overtake");
    assert!(
        late.try_acquire().await.unwrap().is_none(),
        "a reader does not join while a writer waits"
    );
    let late = queue_for(&server, late, "no-overtake", 2).await;

    reading.release().await.unwrap();
    let written = granted(writer, SLACK, "the writer is next").await;
    assert!(!late.is_finished(), "the late reader waits for the writer");
    written.release().await.unwrap();
    let reading = granted(late, SLACK, "then the reader").await;
    reading.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_with_a_fixed_lease_frees_its_share_when_its_own_lease_runs_out() {
    let server = RedisServer::start();
    let (holder, other) = (client(&server).await, client(&server).await);
    let dead_lease = Duration::from_millis(1500);
    let dead = read(&holder, "own-lease")
        .with_lease(Lease::Fixed(dead_lease))
        .acquire()
        .await
        .unwrap();
    let dead_taken = Instant::now();
    let lost = dead.lost_signal();
    // A live reader with the 30 s watchdog lease: the lock lives as long as the longest lease.
    let live = read(&other, "own-lease").acquire().await.unwrap();
    assert!(pttl(&server, "own-lease") > 20_000);
    let writer = queue_for(&server, write(&other, "own-lease"), "own-lease", 1).await;

    // Now only the fixed-lease reader is left, and the lock's expiry is its lease's.
    live.release().await.unwrap();
    let left = pttl(&server, "own-lease");
    assert!(left > 0 && left <= 1500, "pttl {left}");
    let written = granted(writer, dead_lease + SLACK, "the reader's lease ran out").await;
    // Not before the reader's lease ran out (less a margin for the two machines' clocks).
    assert!(dead_taken.elapsed() >= dead_lease - Duration::from_millis(200));
    assert_eq!(lost.reason(), Some(LostReason::Expired));
    assert!(written.fencing_token() > dead.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_reader_frees_its_share_while_another_keeps_renewing() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port()).await;
    let lease = Duration::from_millis(1200);
    let doomed = support::client_with_lease(&proxy.url(), lease).await;
    let alive = support::client_with_lease(&server.url(), lease).await;
    let writers = client(&server).await;

    let dead = read(&doomed, "cut-reader").acquire().await.unwrap();
    let lost = dead.lost_signal();
    let live = read(&alive, "cut-reader").acquire().await.unwrap();
    let writer = queue_for(&server, write(&writers, "cut-reader"), "cut-reader", 1).await;

    // The doomed client can no longer renew: as if its process had died.
    proxy.black_hole();
    assert_eq!(
        tokio::time::timeout(lease + SLACK, lost.lost()).await,
        Ok(LostReason::Unreachable)
    );
    // Its share goes when its own lease runs out (the writer's re-polls drop it), though
    // the other reader keeps renewing the lock.
    let live_owner = live.owner_id().to_owned();
    let reader_left = eventually(lease + SLACK * 2, || {
        let owners: Vec<String> = server.cmd(&["HKEYS", "lock:{cut-reader}"]);
        owners.len() == 2 && owners.contains(&live_owner)
    })
    .await;
    assert!(reader_left, "only 'mode' and the live reader are left");
    assert!(live.is_held() && !writer.is_finished());
    let left = pttl(&server, "cut-reader");
    assert!(
        left > 0 && left <= 1200,
        "the live reader's lease: pttl {left}"
    );

    live.release().await.unwrap();
    let written = granted(writer, SLACK, "the live reader's release grants the writer").await;
    written.release().await.unwrap();
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_lives_as_long_as_the_longest_reader_and_renewals_never_shorten_it() {
    let server = RedisServer::start();
    let short = support::client_with_lease(&server.url(), Duration::from_millis(900)).await;
    let other = client(&server).await;
    let renewed = read(&short, "longest").acquire().await.unwrap();
    let long = read(&other, "longest")
        .with_lease(Lease::Fixed(Duration::from_secs(8)))
        .acquire()
        .await
        .unwrap();
    assert!(pttl(&server, "longest") > 6_000);

    // Two renewals of the short reader move its own deadline...
    let field = |server: &RedisServer| -> String {
        server.cmd(&["HGET", "lock:{longest}", renewed.owner_id()])
    };
    let before = field(&server);
    for _ in 0..2 {
        let seen = field(&server);
        assert!(
            eventually(SLACK, || field(&server) != seen).await,
            "renewed"
        );
    }
    assert_ne!(field(&server), before);
    // ...and leave the lock's expiry at the long reader's.
    assert!(pttl(&server, "longest") > 4_000);
    assert!(renewed.is_held());

    long.release().await.unwrap();
    let left = pttl(&server, "longest");
    assert!(
        left > 0 && left <= 900,
        "the short reader's lease now: pttl {left}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_readers_past_several_leases() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1200);
    let (one, two) = (
        support::client_with_lease(&server.url(), lease).await,
        support::client_with_lease(&server.url(), lease).await,
    );
    let first = read(&one, "renewed").acquire().await.unwrap();
    let second = read(&two, "renewed").acquire().await.unwrap();
    let (lost_first, lost_second) = (first.lost_signal(), second.lost_signal());

    // Time is the point here: held for five leases, which only renewals can bridge.
    tokio::time::sleep(lease * 5).await;
    assert!(!lost_first.is_lost() && !lost_second.is_lost());
    assert!(first.is_held() && second.is_held());
    let state = read(&one, "renewed").inspect().await.unwrap();
    assert_eq!(state.holders.len(), 2, "both readers still in Redis");
    assert!(state.ttl.is_some_and(|ttl| ttl <= lease));
    let writer = client(&server).await;
    assert!(
        write(&writer, "renewed")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    assert!(
        write(&writer, "renewed")
            .try_acquire()
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_and_a_read_write_lock_of_one_name_exclude_each_other() {
    let server = RedisServer::start();
    let (one, two) = (client(&server).await, client_never_polling(&server).await);
    let plain = one.lock("both").unwrap();

    // Plain held: neither side of the read-write lock gets in; a waiting reader is handed
    // the lock by the plain release (told by its message: it never polls), alone.
    let held = plain.acquire().await.unwrap();
    assert!(read(&two, "both").try_acquire().await.unwrap().is_none());
    assert!(write(&two, "both").try_acquire().await.unwrap().is_none());
    let reader = queue_for(&server, read(&two, "both"), "both", 1).await;
    held.release().await.unwrap();
    let reading = granted(reader, SLACK, "the plain release hands the lock over").await;
    assert!(plain.try_acquire().await.unwrap().is_none());
    assert!(write(&one, "both").try_acquire().await.unwrap().is_none());
    reading.release().await.unwrap();

    // Read-held, and write-held: the plain lock waits, and gets it on the release.
    for writer in [false, true] {
        let lock = if writer {
            write(&two, "both")
        } else {
            read(&two, "both")
        };
        let held = lock.acquire().await.unwrap();
        let held_token = held.fencing_token();
        assert!(plain.try_acquire().await.unwrap().is_none());
        let waiting = queue_for(&server, plain.clone(), "both", 1).await;
        held.release().await.unwrap();
        let got = granted(waiting, SLACK, "the read-write release hands the lock over").await;
        assert!(got.fencing_token() > held_token);
        assert!(read(&two, "both").try_acquire().await.unwrap().is_none());
        got.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_grow_across_readers_and_writers() {
    let server = RedisServer::start();
    let (one, two) = (client(&server).await, client(&server).await);
    let r1 = read(&one, "tokens").acquire().await.unwrap();
    let r2 = read(&two, "tokens").acquire().await.unwrap();
    assert!(
        r2.fencing_token() > r1.fencing_token(),
        "every reader gets a token"
    );
    let writer = queue_for(&server, write(&one, "tokens"), "tokens", 1).await;
    let read_token = r2.fencing_token();
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = granted(writer, SLACK, "readers gone").await;
    assert!(w.fencing_token() > read_token);
    let inside = w.read_within().await.unwrap();
    let inside_token = inside.fencing_token();
    assert!(inside_token > w.fencing_token());
    w.release().await.unwrap();
    inside.release().await.unwrap();
    let r3 = read(&two, "tokens").acquire().await.unwrap();
    assert!(r3.fencing_token() > inside_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_hands_a_read_write_lock_to_the_queued_readers() {
    let server = RedisServer::start();
    let (one, two) = (client(&server).await, client_never_polling(&server).await);
    let written = write(&one, "forced").acquire().await.unwrap();
    let a = queue_for(&server, read(&two, "forced"), "forced", 1).await;
    let b = queue_for(&server, read(&two, "forced"), "forced", 2).await;
    assert!(write(&one, "forced").force_unlock().await.unwrap());
    let a = granted(a, SLACK, "force-unlock grants the readers").await;
    let b = granted(b, SLACK, "both of them").await;
    assert_eq!(
        read(&one, "forced").inspect().await.unwrap().holders.len(),
        2
    );
    a.release().await.unwrap();
    b.release().await.unwrap();
    assert_eq!(
        written.release().await.unwrap_err().kind(),
        ErrorKind::NotOwner
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drops_every_hold_of_a_writer_that_reads_within() {
    let server = RedisServer::start();
    let (one, two) = (client(&server).await, client(&server).await);
    let written = write(&one, "shutdown").acquire().await.unwrap();
    let _inside = written.read_within().await.unwrap();
    let _again = written.reenter().await.unwrap();
    let writer = queue_for(&server, write(&two, "shutdown"), "shutdown", 1).await;
    one.shutdown().await;
    let written = granted(
        writer,
        SLACK,
        "shutdown released the write and the read holds",
    )
    .await;
    written.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_the_queue() {
    let server = RedisServer::start();
    let (one, two) = (client(&server).await, client(&server).await);
    let written = write(&one, "cancel").acquire().await.unwrap();
    let waiting = queue_for(&server, read(&two, "cancel"), "cancel", 1).await;
    let writer = queue_for(&server, write(&two, "cancel"), "cancel", 2).await;
    waiting.abort();
    assert!(
        eventually(SLACK, || queued(&server, "cancel").len() == 1).await,
        "the cancelled reader gave its place back"
    );
    written.release().await.unwrap();
    let _written = granted(writer, SLACK, "the writer behind it is next").await;
    let left: Vec<String> = server.cmd(&["HKEYS", "lock:{cancel}"]);
    assert_eq!(left.len(), 2, "mode and the one writer: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_readers_are_indexed_by_deadline_and_leave_no_key_behind() {
    const READERS: usize = 200;
    let server = RedisServer::start();
    let locks = client(&server).await;
    let mut guards = Vec::with_capacity(READERS);
    for _ in 0..READERS {
        guards.push(read(&locks, "crowd").acquire().await.unwrap());
    }
    let lease = Duration::from_millis(300);
    let dead = read(&locks, "crowd")
        .with_lease(Lease::Fixed(lease))
        .acquire()
        .await
        .unwrap();
    let indexed: i64 = server.cmd(&["ZCARD", "lock:{crowd}:readers"]);
    assert_eq!(indexed, READERS as i64 + 1, "every reader is in the index");
    let ttls: Vec<i64> = vec![
        server.cmd(&["PTTL", "lock:{crowd}"]),
        server.cmd(&["PTTL", "lock:{crowd}:readers"]),
    ];
    assert!(
        ttls.iter().all(|ttl| *ttl > 0),
        "both keys expire: {ttls:?}"
    );

    // The dead reader's lease runs out, on the server's clock too; the next look drops it
    // from the hash and the index.
    let lost = tokio::time::timeout(SLACK, dead.lost_signal().lost()).await;
    assert_eq!(lost.expect("the fixed lease runs out"), LostReason::Expired);
    let deadline: u64 = server.cmd(&["ZSCORE", "lock:{crowd}:readers", dead.owner_id()]);
    let server_ms = || {
        let (seconds, micros): (u64, u64) = server.cmd(&["TIME"]);
        seconds * 1000 + micros / 1000
    };
    assert!(eventually(SLACK, || server_ms() > deadline).await);
    let writer = queue_for(&server, write(&locks, "crowd"), "crowd", 1).await;
    let indexed: i64 = server.cmd(&["ZCARD", "lock:{crowd}:readers"]);
    assert_eq!(indexed, READERS as i64, "the dead reader left the index");
    let holders = read(&locks, "crowd").inspect().await.unwrap().holders;
    assert_eq!(holders.len(), READERS, "and the hash");

    for guard in guards {
        guard.release().await.unwrap();
    }
    let written = granted(writer, SLACK, "the last reader's release hands over").await;
    let indexed: i64 = server.cmd(&["EXISTS", "lock:{crowd}:readers"]);
    assert_eq!(
        indexed, 0,
        "no readers' index while a writer holds the lock"
    );
    written.release().await.unwrap();
    drop(dead);
    let left: i64 = server.cmd(&["EXISTS", "lock:{crowd}", "lock:{crowd}:readers"]);
    assert_eq!(left, 0, "nothing is left once everyone released");
}

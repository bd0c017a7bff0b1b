//! Segmented locks against a real redis-server: distinct segments, waiting for the first
//! freed, taking several without hold-and-wait, and no deadlock or sharing under contention.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use support::{RedisServer, client, eventually, queued};
use tower_redis_lock::{ErrorKind, MAX_NAME_LEN, SegmentGuard, SegmentedLock};

/// Bound for waits that normally take milliseconds; generous because CI machines are shared
/// and a debug build on two cores can stall for a while.
const SLACK: Duration = Duration::from_secs(5);

fn locked_on(server: &RedisServer, name: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", &format!("lock:{{{name}}}")]) == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_holders_get_four_segments_and_a_fifth_gets_the_first_one_freed() {
    let server = RedisServer::start();
    let mut holders: Vec<SegmentGuard> = Vec::new();
    for _ in 0..4 {
        let stock = client(&server).await.segmented_lock("stock", 4).unwrap();
        holders.push(stock.acquire_timeout(SLACK).await.unwrap());
    }
    let mut taken: Vec<usize> = holders.iter().map(|guard| guard.segments()[0]).collect();
    taken.sort_unstable();
    assert_eq!(taken, [0, 1, 2, 3], "four distinct segments");
    let other = client(&server).await.segmented_lock("stock", 4).unwrap();
    assert!(
        other.try_acquire().await.unwrap().is_none(),
        "all four busy"
    );

    let fifth = client(&server).await.segmented_lock("stock", 4).unwrap();
    let waiting = tokio::spawn(async move { fifth.acquire_timeout(Duration::from_secs(30)).await });
    assert!(
        eventually(SLACK, || (0..4).all(|i| queued(
            &server,
            &format!("stock#{i}")
        )
        .len()
            == 1))
        .await,
        "the fifth waits on every segment at once"
    );
    // Free the segment of the third holder, whichever it is.
    let freed_holder = holders.remove(2);
    let freed = freed_holder.segments()[0];
    freed_holder.release().await.unwrap();
    let got = tokio::time::timeout(SLACK, waiting)
        .await
        .expect("the fifth got a segment once one was freed")
        .unwrap()
        .unwrap();
    assert_eq!(got.segments(), [freed], "the segment that was freed");
    assert!(
        eventually(SLACK, || (0..4).all(|i| queued(
            &server,
            &format!("stock#{i}")
        )
        .is_empty()))
        .await,
        "the other waits gave their places back"
    );
    for holder in &holders {
        assert!(holder.is_held());
        assert!(locked_on(
            &server,
            &format!("stock#{}", holder.segments()[0])
        ));
    }
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_takes_the_free_ones_or_waits_holding_nothing() {
    let server = RedisServer::start();
    let (a, b, c) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let stock = a.segmented_lock("stock", 4).unwrap();
    let single = b.lock("stock#1").unwrap().acquire().await.unwrap();

    let three = tokio::time::timeout(SLACK, stock.acquire_many(3))
        .await
        .expect("three are free: no wait")
        .unwrap();
    assert_eq!(three.segments(), [0, 2, 3]);
    assert_eq!(three.fencing_tokens().len(), 3);
    let lost = three.lost_signal();

    let rival = c.segmented_lock("stock", 4).unwrap();
    assert!(rival.try_acquire_many(2).await.unwrap().is_none());
    let err = rival
        .acquire_many_timeout(2, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);

    let waiting = tokio::spawn(async move { rival.acquire_many(2).await });
    assert!(
        eventually(SLACK, || !queued(&server, "stock#1").is_empty()).await,
        "the rival waits for the busy segments"
    );
    single.release().await.unwrap();
    // Segment 1 alone is not enough: the rival must not sit on it while it waits for more.
    assert!(
        eventually(SLACK, || {
            !locked_on(&server, "stock#1")
                && [0, 2, 3]
                    .iter()
                    .all(|i| queued(&server, &format!("stock#{i}")).len() == 1)
        })
        .await,
        "segment 1 given back while the rival waits for 0, 2 and 3"
    );
    assert!(!waiting.is_finished());
    three.release().await.unwrap();
    assert!(!lost.is_lost(), "a release on purpose is not a loss");
    let two = tokio::time::timeout(SLACK, waiting)
        .await
        .expect("two free segments: the rival gets them")
        .unwrap()
        .unwrap();
    assert_eq!(two.segments().len(), 2);
    assert!(two.segments()[0] < two.segments()[1]);
    two.release().await.unwrap();
    // A segment granted to one of the rival's waits it then dropped is given back by a
    // background task (the engine's give-back), so this is awaited, not read at once.
    assert!(
        eventually(SLACK, || (0..4)
            .all(|i| !locked_on(&server, &format!("stock#{i}"))))
        .await,
        "every segment free"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competitors_for_two_of_three_never_deadlock_or_share_a_segment() {
    const COMPETITORS: usize = 3;
    const ROUNDS: usize = 60;
    let server = RedisServer::start();
    let inside: Arc<Vec<AtomicBool>> = Arc::new((0..3).map(|_| AtomicBool::new(false)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..COMPETITORS {
        let stock = client(&server).await.segmented_lock("hot", 3).unwrap();
        let (inside, overlaps) = (inside.clone(), overlaps.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = stock.acquire_many(2).await.unwrap();
                assert_eq!(guard.segments().len(), 2);
                for &segment in guard.segments() {
                    if inside[segment].swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::task::yield_now().await;
                for &segment in guard.segments() {
                    inside[segment].store(false, Ordering::SeqCst);
                }
                guard.release().await.unwrap();
            }
        }));
    }
    // 180 acquisitions take seconds; a deadlock (each holding one, waiting for another)
    // would never finish.
    let finished = tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(workers),
    )
    .await
    .expect("every competitor finished: no deadlock");
    for worker in finished {
        worker.unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "no segment held twice");
    // Waits dropped after a grant are given back in the background.
    assert!(
        eventually(SLACK, || (0..3)
            .all(|i| !locked_on(&server, &format!("hot#{i}"))))
        .await,
        "every segment free"
    );
}

#[tokio::test]
async fn bad_counts_and_names_are_typed_errors() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    assert_eq!(
        locks.segmented_lock("s", 0).unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    let stock = SegmentedLock::new(&locks, "s", 4).unwrap();
    assert_eq!(stock.segment_count(), 4);
    assert_eq!(stock.segment(3).unwrap().name(), "s#3");
    assert_eq!(
        stock.acquire_many(5).await.unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    assert_eq!(
        stock.try_acquire_many(0).await.unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
    // "#3" adds two bytes: a name two bytes short of the limit fits, one byte short does not.
    let fits = "n".repeat(MAX_NAME_LEN - 2);
    assert!(locks.segmented_lock(&fits, 4).is_ok());
    let too_long = "n".repeat(MAX_NAME_LEN - 1);
    assert_eq!(
        locks.segmented_lock(&too_long, 4).unwrap_err().kind(),
        ErrorKind::InvalidName
    );
    // Ten segments: "#9" is the longest suffix.
    assert!(locks.segmented_lock(&fits, 10).is_ok());
    assert_eq!(
        locks.segmented_lock(&fits, 11).unwrap_err().kind(),
        ErrorKind::InvalidName
    );
    assert_eq!(
        locks.segmented_lock("", 2).unwrap_err().kind(),
        ErrorKind::InvalidName
    );
}

//! Fencing tokens against a real redis-server: they keep growing when the counter goes back
//! (a failover to a replica that missed the last reservation) and when it expires, and no
//! lock name leaves a key behind for good.

mod support;

use std::time::Duration;

use futures_util::future::join_all;
use support::{RedisServer, client, eventually};
use tower_redis_lock::{DEFAULT_LOCAL_HANDOFF_LIMIT, Lease};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(5);

#[tokio::test]
async fn tokens_keep_growing_when_the_counter_goes_back() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let first = a.lock("rolled").unwrap().acquire().await.unwrap();
    let token = first.fencing_token();
    // A failover to a replica that missed the lock and its last reservation: the lock is
    // gone and the counter is back where it was a while ago; the epoch key survived.
    let _: i64 = server.cmd(&["DEL", "lock:{rolled}"]);
    let _: i64 = server.cmd(&["DECRBY", "lock:{rolled}:fence", "1000"]);
    let second = b.lock("rolled").unwrap().acquire().await.unwrap();
    assert!(
        second.fencing_token() > token,
        "a token after the rollback ({}) is above every earlier one ({token})",
        second.fencing_token()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_names_leave_no_key_without_an_expiry() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let names: Vec<String> = (0..10_000).map(|i| format!("order-{i}")).collect();
    for chunk in names.chunks(200) {
        join_all(chunk.iter().map(|name| {
            let lock = locks.lock(name).unwrap();
            async move { lock.acquire().await.unwrap().release().await.unwrap() }
        }))
        .await;
    }
    // Each lock was found free: its tokens came from the clock and it left no counter.
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert_eq!(
        server.keys_besides_epoch(),
        0,
        "{:?}",
        &keys[..keys.len().min(5)]
    );
    // The server's epoch key and its marker must outlive everything: they are how a loss is
    // noticed.
    let forever: Vec<&String> = keys
        .iter()
        .filter(|key| !key.starts_with("lock:epoch"))
        .filter(|key| server.cmd::<i64>(&["PTTL", key]) < 0)
        .collect();
    assert!(
        forever.is_empty(),
        "keys without an expiry: {:?}",
        &forever[..forever.len().min(5)]
    );
}

#[tokio::test]
async fn tokens_keep_growing_across_the_expiry_of_the_counter() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let lock = locks
        .lock("short-lived")
        .unwrap()
        .with_lease(Lease::Fixed(Duration::from_secs(1)));
    // A counter 300 ms past the server clock (generous: the acquire below runs within it), as
    // a force-unlock leaves one: the first block is reserved through it, and the counter then
    // lives one lease (1 s), by when the clock has passed it.
    let (seconds, micros): (u64, u64) = server.cmd(&["TIME"]);
    let ahead = seconds * 1_000_000 + micros + 300_000;
    let () = server.cmd(&["SET", "lock:{short-lived}:fence", &ahead.to_string()]);
    let first = lock.acquire().await.unwrap();
    let token = first.fencing_token();
    assert_eq!(token, ahead + 1);
    first.release().await.unwrap();
    assert!(
        eventually(SLACK, || server
            .cmd::<i64>(&["EXISTS", "lock:{short-lived}:fence"])
            == 0)
        .await,
        "the counter expires after its lease"
    );
    let second = lock.acquire().await.unwrap();
    assert!(second.fencing_token() > token);
}

#[tokio::test]
async fn a_force_unlock_raises_the_counter_past_the_block_its_holder_may_still_hand_out() {
    let server = RedisServer::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let held = a.lock("seized").unwrap().acquire().await.unwrap();
    let block_end = held.fencing_token() + u64::from(DEFAULT_LOCAL_HANDOFF_LIMIT);
    assert_eq!(server.cmd::<i64>(&["EXISTS", "lock:{seized}:fence"]), 0);
    assert!(b.lock("seized").unwrap().force_unlock().await.unwrap());
    // Read within its second of life (generous: one round trip after the script).
    let counter: u64 = server.cmd(&["GET", "lock:{seized}:fence"]);
    assert!(counter > block_end, "{counter} <= {block_end}");
    let next = b.lock("seized").unwrap().acquire().await.unwrap();
    assert!(next.fencing_token() > counter);
    drop(held);
}

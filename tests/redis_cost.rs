//! What one lock costs inside Redis, counted by the server itself (`INFO commandstats`,
//! commands run inside scripts included): the work a fleet of instances shares.

mod support;

use std::collections::BTreeMap;

use support::RedisServer;

/// Acquisitions measured, after one that opens the connections and learns the epoch.
const ROUNDS: u64 = 20;

/// Calls per command since the last `CONFIG RESETSTAT`, without the harness's own.
fn calls(server: &RedisServer) -> BTreeMap<String, u64> {
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            let count = rest.split(',').next()?.parse().ok()?;
            (!name.starts_with("config") && name != "info").then(|| (name.to_owned(), count))
        })
        .collect()
}

#[tokio::test]
async fn an_uncontended_acquire_and_release_touch_neither_the_queue_nor_more_than_ten_commands() {
    let server = RedisServer::start();
    let locks = support::client(&server).await;
    let lock = locks.lock("tenant-1").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for _ in 0..ROUNDS {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let calls = calls(&server);
    let per_round: BTreeMap<&str, f64> = calls
        .iter()
        .map(|(name, count)| (name.as_str(), *count as f64 / ROUNDS as f64))
        .collect();
    println!("commands per uncontended acquire + release: {per_round:?}");

    // Two scripts: the acquisition (epoch, lock and queue looked at in one EXISTS, hold,
    // lease, the clock and the fencing counter) and the release (the owner's field, whose
    // removal removes the lock, and the queue).
    assert_eq!(calls.get("evalsha"), Some(&(2 * ROUNDS)));
    // One HDEL per release, the lock's: none in the waiters' terms.
    assert_eq!(calls.get("hdel"), Some(&ROUNDS), "{per_round:?}");
    for queue_command in ["zrem", "zrange", "zscore", "zadd"] {
        assert_eq!(
            calls.get(queue_command),
            None,
            "an uncontended lock ran {queue_command}: {per_round:?}"
        );
    }
    let total: u64 = calls.values().sum();
    assert!(
        total <= 10 * ROUNDS,
        "{} commands per uncontended acquire + release: {per_round:?}",
        total as f64 / ROUNDS as f64
    );
}

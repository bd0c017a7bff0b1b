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
            // The harness's own: CONFIG, INFO, and the two CLIENT SETINFO (library name and
            // version) redis-rs sends on each new connection, which Valkey counts (Redis 7.0
            // has no such command; Redis 6.2 counts the refusal as `client`).
            let own = name.starts_with("config")
                || name == "info"
                || name == "client|setinfo"
                || name == "client";
            (!own).then(|| (name.to_owned(), count))
        })
        .collect()
}

/// Waits until the server has been up 2 s: in the second of its start (its last save) no
/// epoch marker is written (see `lua/lib/life.lua`), and every acquisition reads the epoch.
fn up_past_its_first_second(server: &RedisServer) {
    server.wait_until_up_for(2);
}

/// The script calls among `calls`: functions (`FCALL`), or scripts where a server refuses
/// functions (`EVALSHA`).
fn script_calls(calls: &BTreeMap<String, u64>) -> u64 {
    ["fcall", "evalsha"]
        .iter()
        .filter_map(|name| calls.get(*name))
        .sum()
}

/// Calls per command per round of [`ROUNDS`], for the failure messages.
fn per_round(calls: &BTreeMap<String, u64>) -> BTreeMap<&str, f64> {
    calls
        .iter()
        .map(|(name, count)| (name.as_str(), *count as f64 / ROUNDS as f64))
        .collect()
}

#[tokio::test]
async fn an_uncontended_acquire_and_release_touch_neither_the_queue_nor_the_epoch_nor_more_than_nine_commands()
 {
    let server = RedisServer::start();
    up_past_its_first_second(&server);
    let locks = support::client(&server).await;
    let lock = locks.lock("tenant-1").unwrap();
    lock.acquire().await.unwrap().release().await.unwrap();

    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for _ in 0..ROUNDS {
        lock.acquire().await.unwrap().release().await.unwrap();
    }
    let calls = calls(&server);
    let per_round = per_round(&calls);
    println!("commands per uncontended acquire + release: {per_round:?}");

    // One script, the acquisition (lock, queue, epoch and its marker looked at in one
    // EXISTS, hold, lease, the clock and the token counter), and two plain commands for the
    // release of a lock taken with nobody queued (the owner's field, and whether the lock
    // went with it: nobody queued meanwhile).
    assert_eq!(script_calls(&calls), ROUNDS, "{per_round:?}");
    // The acquisition's look and the release's: neither looks at the queue itself.
    assert_eq!(calls.get("exists"), Some(&(2 * ROUNDS)), "{per_round:?}");
    // One SET, the token counter's, which reads it back in the same command (`SET … GET`):
    // the epoch key is not read (its marker stands for it), and no grant's block is kept.
    assert_eq!(calls.get("set"), Some(&ROUNDS), "{per_round:?}");
    assert_eq!(calls.get("get"), None, "{per_round:?}");
    // One LASTSAVE per acquisition, which the marker's name ends with: a restart from a
    // snapshot or an append-only file moves it, so a marker that came back with the data is
    // never found.
    assert_eq!(calls.get("lastsave"), Some(&ROUNDS), "{per_round:?}");
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
        total <= 9 * ROUNDS,
        "{} commands per uncontended acquire + release: {per_round:?}",
        total as f64 / ROUNDS as f64
    );
}

#[tokio::test]
async fn a_refused_try_acquire_neither_queues_nor_reads_the_token_counter() {
    let server = RedisServer::start();
    up_past_its_first_second(&server);
    let holder = support::client(&server).await;
    let other = support::client(&server).await;
    let _held = holder.lock("tenant-1").unwrap().acquire().await.unwrap();
    let lock = other.lock("tenant-1").unwrap();
    assert!(lock.try_acquire().await.unwrap().is_none());

    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for _ in 0..ROUNDS {
        assert!(lock.try_acquire().await.unwrap().is_none());
    }
    let calls = calls(&server);
    let per_round = per_round(&calls);
    println!("commands per refused try_acquire: {per_round:?}");

    // One script; a waiter's look reads the token counter to check a later grant against,
    // and an owner that does not wait is never granted one.
    assert_eq!(script_calls(&calls), ROUNDS, "{per_round:?}");
    assert_eq!(calls.get("get"), None, "{per_round:?}");
    assert_eq!(calls.get("zadd"), None, "{per_round:?}");
}

/// Waits until `locks` has a task queued in Redis: the look that queued it has returned.
async fn until_queued(locks: &tower_redis_lock::LockClient) {
    let queued = support::eventually(std::time::Duration::from_secs(10), || {
        locks.queued_waiters() == 1
    })
    .await;
    assert!(queued, "the waiter never queued in Redis");
}

#[tokio::test]
async fn a_hand_over_between_instances_costs_redis_at_most_twenty_one_commands() {
    let server = RedisServer::start();
    up_past_its_first_second(&server);
    // Two clients: two instances of a service, taking turns on one lock.
    let clients = [
        support::client(&server).await,
        support::client(&server).await,
    ];
    let locks = [
        clients[0].lock("tenant-1").unwrap(),
        clients[1].lock("tenant-1").unwrap(),
    ];
    let mut held = locks[0].acquire().await.unwrap();

    // Round 0 loads the scripts a hand-over runs; the rounds after it are counted.
    for round in 0..=ROUNDS {
        if round == 1 {
            let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
        }
        // The other instance asks, finds the lock held and queues; the release grants it.
        let next = locks[(round as usize + 1) % 2].clone();
        let waiting = tokio::spawn(async move { next.acquire().await });
        until_queued(&clients[(round as usize + 1) % 2]).await;
        let token = held.fencing_token();
        held.release().await.unwrap();
        held = waiting.await.unwrap().unwrap();
        assert!(
            held.fencing_token() > token,
            "round {round}: the tokens went back"
        );
    }
    let calls = calls(&server);
    let per_round = per_round(&calls);
    println!("commands per hand-over between instances: {per_round:?}");

    // Two scripts per hand-over: the waiter's look that queues it and the release that
    // grants it the lock and tells its instance; the waiter's wake-up costs Redis nothing.
    assert_eq!(calls.get("publish"), Some(&ROUNDS), "{per_round:?}");
    // A look by an owner Redis has never seen does not ask whether it was granted the lock.
    assert_eq!(calls.get("hexists"), None, "{per_round:?}");
    // The grant reserves its block in the token counter and keeps it for a look (two SETs).
    assert_eq!(calls.get("set"), Some(&(2 * ROUNDS)), "{per_round:?}");
    // The look that queues an owner Redis has never seen reads no token counter (no GET):
    // no grant to that owner can come before the look that first queues it.
    assert_eq!(calls.get("get"), None, "{per_round:?}");
    // The look's LASTSAVE, which the epoch marker it checks is named after.
    assert_eq!(calls.get("lastsave"), Some(&ROUNDS), "{per_round:?}");
    // The watchdog's heartbeat of the queued waiter may tick during the run: its own script
    // and commands are allowed for once.
    let total: u64 = calls.values().sum();
    assert!(
        total <= 21 * ROUNDS + 10,
        "{} commands per hand-over: {per_round:?}",
        total as f64 / ROUNDS as f64
    );
}

/// The acquire scripts' modes (`join`, `wait`) in the order MONITOR saw them between the
/// `ECHO`s of `start` and `end`.
async fn modes_sent_between(
    monitor: &mut (impl futures_util::Stream<Item = String> + Unpin),
    start: &str,
    end: &str,
) -> Vec<&'static str> {
    use futures_util::StreamExt;
    let (mut started, mut modes) = (false, Vec::new());
    loop {
        let line = tokio::time::timeout(std::time::Duration::from_secs(10), monitor.next())
            .await
            .expect("MONITOR shows the end marker within 10 s")
            .expect("the MONITOR connection stays open");
        if line.contains(end) {
            return modes;
        }
        started |= line.contains(start);
        let line_lower = line.to_ascii_lowercase();
        if started && (line_lower.contains("\"fcall\"") || line_lower.contains("\"evalsha\"")) {
            modes.extend(
                ["join", "wait"]
                    .into_iter()
                    .filter(|mode| line.contains(&format!("\"{mode}\""))),
            );
        }
    }
}

#[tokio::test]
async fn only_the_first_look_of_an_owner_no_script_has_seen_goes_as_a_newcomers() {
    let server = RedisServer::start();
    up_past_its_first_second(&server);
    server.provision_epoch("lock:");
    let watcher = redis::Client::open(server.url()).unwrap();
    let mut monitor = watcher
        .get_async_monitor()
        .await
        .unwrap()
        .into_on_message::<String>();
    // Another client loads the scripts, so that no look below is a NOSCRIPT sent again.
    let other = support::client(&server).await;
    let guard = other.lock("warm-up").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();

    // The epoch starts a quarantine of a second and a half, as after a restart.
    let (seconds, micros): (u64, u64) = server.cmd(&["TIME"]);
    let quarantine_until_ms = seconds * 1000 + micros / 1000 + 1500;
    let epoch = format!("{} {quarantine_until_ms} 0", seconds * 1_000_000 + micros);
    let _: () = server.cmd(&["SET", "lock:epoch", &epoch]);
    // A client that knows no epoch yet: its first look is told the epoch, its second (in
    // the same attempt) the quarantine, which leaves nothing of the owner in Redis; it looks
    // again while the quarantine lasts, and the look after it takes the lock.
    let locks = support::client(&server).await;
    let _: String = server.cmd(&["ECHO", "start-of-acquisition"]);
    let guard = locks.lock("tenant-1").unwrap().acquire().await.unwrap();
    guard.release().await.unwrap();
    let _: String = server.cmd(&["ECHO", "end-of-acquisition"]);
    let modes =
        modes_sent_between(&mut monitor, "start-of-acquisition", "end-of-acquisition").await;
    // Only a look of an owner no script has seen skips the token counter (`join`): after any
    // reply, a look asks as a waiting owner's does.
    assert!(modes.len() >= 3, "a look after the quarantine: {modes:?}");
    assert_eq!(modes[0], "join", "{modes:?}");
    assert!(modes[1..].iter().all(|mode| *mode == "wait"), "{modes:?}");
}

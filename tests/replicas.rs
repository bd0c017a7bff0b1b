//! Replica acknowledgement (`min_replicas_acked`) on a real master and replica: the failover
//! hole it closes, shown with a replica that lags while the master dies (SIGKILL).
//!
//! The replica reaches its master through a fault proxy, which makes it lag by holding the
//! replication stream back. A frozen replica (SIGSTOP) does not lag: the kernel still takes
//! the stream into its socket buffer, and the replica applies it when it goes on.

mod support;

use std::time::Duration;

use support::RedisServer;
use support::proxy::FaultProxy;
use tower_redis_lock::{ErrorKind, LockClient, LockError, LockGuard, LostReason};

/// The leases of these tests: short, so a holder cut off from its Redis is told soon.
const LEASE: Duration = Duration::from_secs(3);
/// How long a client waits for a replica's acknowledgement (generous: shared, busy machines;
/// below half the lease, as the client requires).
const ACK_TIMEOUT: Duration = Duration::from_secs(1);
/// Generous bound for what should take a few milliseconds (shared, busy machines).
const PROMPTLY: Duration = Duration::from_secs(10);

async fn client(url: &str, acked: bool) -> LockClient {
    let builder = LockClient::builder(url)
        .watchdog_lease(LEASE)
        .command_timeout(Duration::from_millis(500));
    let builder = if acked {
        builder.min_replicas_acked(1, ACK_TIMEOUT)
    } else {
        builder
    };
    builder.build().await.expect("client")
}

/// A master with a replica behind a fault proxy.
async fn master_and_replica() -> (RedisServer, FaultProxy, RedisServer) {
    let master = RedisServer::start();
    let link = FaultProxy::start(master.port()).await;
    let replica = master.start_replica(link.port());
    (master, link, replica)
}

/// Turns the lagging replica into the master after its master died, as a failover does:
/// what the link held back is lost with the link.
fn promote(replica: &RedisServer, link: &FaultProxy) {
    link.cut_all();
    let _: () = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_acknowledgement_a_failover_to_a_lagging_replica_makes_two_holders() {
    let (mut master, link, replica) = master_and_replica().await;
    link.black_hole();
    let first = client(&master.url(), false).await;
    let first_guard = first.lock("account-7").unwrap().acquire().await.unwrap();

    master.kill();
    promote(&replica, &link);
    let second = client(&replica.url(), false).await;
    let second_guard = tokio::time::timeout(PROMPTLY, async {
        second.lock("account-7").unwrap().acquire().await
    })
    .await
    .expect("the promoted replica never had the lock")
    .unwrap();
    // The hole: both are told they hold it, until the first hears otherwise.
    assert!(
        first_guard.is_held() && second_guard.is_held(),
        "first {:?}, second {:?}",
        first_guard.lost_signal().reason(),
        second_guard.lost_signal().reason()
    );
    assert!(second_guard.fencing_token() != first_guard.fencing_token());

    // The first cannot reach its Redis any more: its lost signal fires within its lease.
    let lost = tokio::time::timeout(LEASE + PROMPTLY, first_guard.lost_signal().lost())
        .await
        .expect("the first holder was never told");
    assert_eq!(lost, LostReason::Unreachable);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_acknowledgement_no_acquisition_succeeds_while_the_replica_lags() {
    let (mut master, link, replica) = master_and_replica().await;
    let first = client(&master.url(), true).await;

    // With the replica up, an acknowledged acquisition is on the replica when it returns.
    let guard = first.lock("account-7").unwrap().acquire().await.unwrap();
    let on_replica: i64 = replica.cmd(&["EXISTS", "lock:{account-7}"]);
    assert_eq!(
        on_replica, 1,
        "the holder was told before the replica had it"
    );
    // A re-entry the replica does not get is refused, and its hold taken back.
    link.black_hole();
    let err = guard
        .reenter()
        .await
        .expect_err("re-entered while the replica lags");
    assert_eq!(err.kind(), ErrorKind::ReplicasBehind, "{err}");
    let holds = || master.cmd::<i64>(&["HGET", "lock:{account-7}", guard.owner_id()]);
    assert!(
        support::eventually(PROMPTLY, || holds() == 1).await,
        "the refused re-entry's hold was left on the master"
    );
    link.heal();
    guard.release().await.unwrap();

    link.black_hole();
    let err = first
        .lock("account-7")
        .unwrap()
        .acquire()
        .await
        .expect_err("acquired while the only replica was lagging");
    assert_eq!(err.kind(), ErrorKind::ReplicasBehind, "{err}");
    // Not acknowledged, so given back: the master does not keep it.
    assert!(
        support::eventually(PROMPTLY, || master
            .cmd::<i64>(&["EXISTS", "lock:{account-7}"])
            == 0)
        .await,
        "the unacknowledged acquisition was left on the master"
    );

    master.kill();
    promote(&replica, &link);
    let second = client(&replica.url(), false).await;
    let taken = tokio::time::timeout(PROMPTLY, second.lock("account-7").unwrap().acquire())
        .await
        .expect("the promoted replica did not grant the lock")
        .unwrap();
    assert!(taken.is_held());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_is_told_only_once_a_replica_has_its_grant() {
    let (master, link, replica) = master_and_replica().await;
    let holder_client = client(&master.url(), true).await;
    let waiter_client = client(&master.url(), true).await;

    // Acknowledged grant from the queue.
    let held = holder_client
        .lock("order-1")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lock = waiter_client.lock("order-1").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    assert!(
        support::eventually(PROMPTLY, || !support::queued(&master, "order-1").is_empty()).await,
        "the waiter never queued"
    );
    held.release().await.unwrap();
    let granted = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the waiter was never granted the lock")
        .unwrap()
        .unwrap();
    let on_replica: i64 = replica.cmd(&["EXISTS", "lock:{order-1}"]);
    assert_eq!(
        on_replica, 1,
        "the waiter was told before the replica had its grant"
    );
    granted.release().await.unwrap();

    // Unacknowledged grant: the replica is lagging when the lock passes to the waiter.
    let held = holder_client
        .lock("order-1")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lock = waiter_client.lock("order-1").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    assert!(
        support::eventually(PROMPTLY, || !support::queued(&master, "order-1").is_empty()).await,
        "the waiter never queued"
    );
    link.black_hole();
    // The release itself is not acknowledged: it has nothing to vouch for.
    held.release().await.unwrap();
    refused_and_given_back(waiting, &master, "order-1", "a grant no replica has").await;
    link.heal();
}

/// A waiter that finds its grant by a look (the release's message held back) writes nothing
/// to find it: on Redis 7.2+ and Valkey a WAIT on its own connection would vouch for no write
/// at all. It must still be told only once a replica has the grant.
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_that_finds_its_grant_by_a_look_is_told_only_once_a_replica_has_it() {
    let (master, link, replica) = master_and_replica().await;
    let holder_client = client(&master.url(), true).await;
    // The waiter reaches Redis through a proxy that can hold back its pub/sub messages. It
    // re-polls only every 5 s and its watchdog ticks every 10 s, so what makes it look is its
    // pub/sub connection coming back (which wakes every waiter), and nothing it wrote since
    // the replica's link froze (a re-poll, a heartbeat of its place) covers the grant.
    let waiter_link = FaultProxy::start(master.port()).await;
    let waiter_client = LockClient::builder(&waiter_link.url())
        .watchdog_lease(Duration::from_secs(30))
        .command_timeout(Duration::from_millis(500))
        .repoll_interval(Duration::from_secs(5))
        .min_replicas_acked(1, ACK_TIMEOUT)
        .build()
        .await
        .expect("client");

    let held = holder_client
        .lock("order-2")
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let lock = waiter_client.lock("order-2").unwrap();
    let waiting = tokio::spawn(async move { lock.acquire().await });
    assert!(
        support::eventually(PROMPTLY, || {
            !support::queued(&master, "order-2").is_empty()
                && waiter_link.subscribed_connections() > 0
                && replica.cmd::<i64>(&["EXISTS", "lock:{order-2}:queue"]) == 1
        })
        .await,
        "the waiter never queued and subscribed, or the replica never saw it queue"
    );
    // The master must know that the replica has the waiter's writes (replicas acknowledge
    // once a second): WAIT compares with what the master knows, so a WAIT that vouches for
    // nothing newer than those writes answers at once.
    let queued_at = repl_offset(&master);
    assert!(
        support::eventually(PROMPTLY, || acked_offset(&master) >= queued_at).await,
        "the replica never acknowledged the waiter's place"
    );
    waiter_link.hold_pubsub();
    link.black_hole();
    held.release().await.unwrap();
    // The grant's message is lost with the connection it was held on; the waiter looks once
    // its new connection's subscription is confirmed.
    assert_eq!(waiter_link.cut_pubsub(), 1);
    waiter_link.release_pubsub();
    let grant = "a grant it found by a look and no replica has";
    refused_and_given_back(waiting, &master, "order-2", grant).await;
    link.heal();
}

/// Checks that the waiter `waiting` for `name` was refused its `grant` (`ReplicasBehind`) and
/// that the grant was given back on the master.
async fn refused_and_given_back(
    waiting: tokio::task::JoinHandle<Result<LockGuard, LockError>>,
    master: &RedisServer,
    name: &str,
    grant: &str,
) {
    let outcome = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("the waiter never finished")
        .unwrap();
    let refused = outcome.expect_err(&format!("told it holds {grant}"));
    assert_eq!(refused.kind(), ErrorKind::ReplicasBehind);
    let key = format!("lock:{{{name}}}");
    assert!(
        support::eventually(PROMPTLY, || master.cmd::<i64>(&["EXISTS", &key]) == 0).await,
        "the unacknowledged grant was left on the master"
    );
}

/// How far the master's replication stream is.
fn repl_offset(master: &RedisServer) -> u64 {
    info_field(master, "master_repl_offset:", "")
}

/// How far the master knows its replica has the stream (what WAIT compares with).
fn acked_offset(master: &RedisServer) -> u64 {
    info_field(master, "slave0:", "offset=")
}

/// The number after `inner` (or the whole value when empty) on the line of `INFO
/// replication` that starts with `prefix`.
fn info_field(server: &RedisServer, prefix: &str, inner: &str) -> u64 {
    let info: String = server.cmd(&["INFO", "replication"]);
    let value = info
        .lines()
        .find_map(|line| line.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("INFO replication has no {prefix}"));
    let after = match inner {
        "" => value,
        inner => value.split(inner).nth(1).unwrap_or(value),
    };
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("INFO replication {prefix}{value}: no number"))
}

#[tokio::test]
async fn replica_acknowledgement_settings_are_checked() {
    for (replicas, timeout) in [(0, ACK_TIMEOUT), (1, Duration::ZERO), (1, LEASE)] {
        let err = LockClient::builder("redis://127.0.0.1:1")
            .watchdog_lease(LEASE)
            .min_replicas_acked(replicas, timeout)
            .build()
            .await
            .expect_err("an unusable replica acknowledgement was accepted");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    }
}

/// The scope's token counter (one server: one counter) less the server's clock in µs, read in
/// one script so that both are of the same instant.
fn counter_ahead_of_clock_us(server: &RedisServer) -> i64 {
    let (counter, time): (i64, Vec<i64>) = server.cmd(&[
        "EVAL",
        "return {tonumber(redis.call('get', KEYS[1])), redis.call('time')}",
        "1",
        "lock:tokens",
    ]);
    counter - (time[0] * 1_000_000 + time[1])
}

/// Every acquisition asks for the most tokens a client may reserve (one for itself and one per
/// local hand-over, `MAX_LOCAL_HANDOVER_LIMIT`), as fast as the machine goes: the scope's
/// counter stays within 2 ms of the server clock, so a failover to a replica that missed the
/// last reservation, with the same clock, still hands out a larger token. Before, each
/// acquisition moved the counter 1,001 µs, seconds ahead of the clock within a second, and
/// the promoted replica repeated the last token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_reserved_faster_than_the_clock_runs_grow_across_a_failover_that_missed_the_last() {
    let (mut master, link, replica) = master_and_replica().await;
    // Its start is then clearly before the epoch's first record: a promoted replica that ran
    // before keeps the epoch (no quarantine; see `lua/lib/life.lua`).
    replica.wait_until_up_for(2);
    let locks = LockClient::builder(&master.url())
        .local_handover_limit(tower_redis_lock::MAX_LOCAL_HANDOVER_LIMIT)
        .build()
        .await
        .unwrap();
    let pumped_until = tokio::time::Instant::now() + Duration::from_millis(1500);
    let pumps: Vec<_> = (0..16)
        .map(|task| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let mut count = 0u64;
                while tokio::time::Instant::now() < pumped_until {
                    let lock = locks.lock(&format!("pump-{task}-{count}")).unwrap();
                    lock.acquire().await.unwrap().release().await.unwrap();
                    count += 1;
                }
                count
            })
        })
        .collect();
    let mut acquisitions = 0;
    for pump in pumps {
        acquisitions += pump.await.unwrap();
    }
    let ahead = counter_ahead_of_clock_us(&master);
    assert!(
        ahead <= 2_000,
        "{acquisitions} acquisitions of 1,001 tokens in 1.5 s: the counter is {ahead} µs ahead"
    );

    // The replica has every reservation but the last.
    let acked: i64 = master.cmd(&["WAIT", "1", "5000"]);
    assert_eq!(acked, 1);
    link.black_hole();
    let last = locks.lock("last").unwrap().acquire().await.unwrap();
    let last_token = last.fencing_token();
    master.kill();
    promote(&replica, &link);
    // The promotion and a new client's first script take far longer than the 2 ms the counter
    // may be ahead.
    let promoted = LockClient::builder(&replica.url()).build().await.unwrap();
    let next = tokio::time::timeout(PROMPTLY, promoted.lock("last").unwrap().acquire())
        .await
        .expect("the promoted replica grants the lock")
        .unwrap();
    assert!(
        next.fencing_token() > last_token,
        "the promoted replica's token {} is not above the old master's last, {last_token}",
        next.fencing_token()
    );
}

//! A client behind Redis Sentinel follows a failover: one master, one replica and three
//! sentinels, real processes; the master is SIGKILLed.

mod support;

use std::time::Duration;

use support::RedisServer;
use support::proxy::FaultProxy;
use support::sentinel::Sentinels;
use tower_redis_lock::{ErrorKind, LockClient, LostReason};

/// Long enough to outlast the failover (the master declared down after 1 s, then an
/// election), so a holder keeps its lock through it when the replica had it.
const LEASE: Duration = Duration::from_secs(15);
/// Bound on the failover and on what follows it (generous: shared, busy machines).
const FAILOVER_BOUND: Duration = Duration::from_secs(30);
/// The sentinels' `failover-timeout`: one failover per test, so any length will do.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);

async fn client(sentinels: &Sentinels) -> LockClient {
    LockClient::builder_sentinel(sentinels.urls(), Sentinels::MASTER)
        .watchdog_lease(LEASE)
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("sentinel client")
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_follow_a_failover_and_waiters_are_not_stuck() {
    let mut master = RedisServer::start();
    let replica = master.start_replica(master.port());
    let sentinels = Sentinels::start(
        3,
        master.port(),
        1,
        Duration::from_secs(1),
        FAILOVER_TIMEOUT,
    );
    let holder = client(&sentinels).await;
    let waiter = client(&sentinels).await;

    let held = holder.lock("tenant-9").unwrap().acquire().await.unwrap();
    let first_token = held.fencing_token();
    let lock = waiter.lock("tenant-9").unwrap();
    // A wait that finds no master during the failover fails with `RedisUnavailable`, as on
    // one server that goes away; the waiter asks again, as a service would.
    let waiting = tokio::spawn(async move {
        let mut unavailable = 0;
        loop {
            match lock.acquire().await {
                Err(err) if err.kind() == ErrorKind::RedisUnavailable => {
                    unavailable += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                outcome => return (outcome, unavailable),
            }
        }
    });
    assert!(
        support::eventually(FAILOVER_BOUND, || !support::queued(&master, "tenant-9")
            .is_empty())
        .await,
        "the waiter never queued"
    );
    // The replica has the lock and the queue before the master dies.
    let _: i64 = master.cmd(&["WAIT", "1", "5000"]);
    master.kill();

    assert!(
        support::eventually(FAILOVER_BOUND, || sentinels.master_port()
            == Some(replica.port()))
        .await,
        "the sentinels never promoted the replica"
    );
    // The holder's renewals reach the new master: its lease survives the failover.
    let renewed = support::eventually(FAILOVER_BOUND, || {
        let ttl: i64 = replica.cmd(&["PTTL", "lock:{tenant-9}"]);
        ttl > (LEASE - LEASE / 3).as_millis() as i64 && !held.lost_signal().is_lost()
    })
    .await;
    assert!(
        renewed,
        "the holder's watchdog did not follow the new master"
    );
    assert!(held.is_held());

    // The release goes to the new master, and the grant reaches the waiter through its
    // pub/sub connection there: it is not stuck.
    held.release().await.expect("released on the new master");
    let (granted, unavailable) = tokio::time::timeout(FAILOVER_BOUND, waiting)
        .await
        .expect("the waiter was stuck after the failover")
        .unwrap();
    let granted = granted.expect("acquired");
    println!("the waiter found no master {unavailable} times during the failover");
    assert!(granted.fencing_token() > first_token);
    let holders = support::holders_among(replica.cmd(&["HKEYS", "lock:{tenant-9}"]));
    assert_eq!(holders.len(), 1, "{holders:?}");
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failover_to_a_replica_without_the_lock_tells_the_old_holder_at_its_next_renewal() {
    let mut master = RedisServer::start();
    // The replica reaches its master through a proxy that can hold the stream back.
    let link = FaultProxy::start(master.port()).await;
    let replica = master.start_replica(link.port());
    let sentinels = Sentinels::start(
        3,
        master.port(),
        1,
        Duration::from_secs(1),
        FAILOVER_TIMEOUT,
    );
    let first = client(&sentinels).await;
    let second = client(&sentinels).await;

    link.black_hole();
    let held = first.lock("account-3").unwrap().acquire().await.unwrap();
    master.kill();
    // What the link held back dies with it: the replica never gets the lock.
    link.cut_all();
    assert!(
        support::eventually(FAILOVER_BOUND, || sentinels.master_port()
            == Some(replica.port()))
        .await,
        "the sentinels never promoted the replica"
    );

    // The known hole: the new master grants the lock again.
    let taken = loop {
        match second.lock("account-3").unwrap().try_acquire().await {
            Ok(Some(guard)) => break guard,
            Ok(None) => panic!("the promoted replica had the lock"),
            Err(err) if err.kind() == ErrorKind::RedisUnavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("{err}"),
        }
    };
    let taken_at = std::time::Instant::now();
    assert!(taken.is_held());
    // The first holder's next renewal reaches the new master and finds the lock taken: it
    // is told within a renew interval plus the command timeout (bound doubled for busy
    // machines), long before its own lease would run out.
    let bound = (LEASE / 3 + Duration::from_millis(500)) * 2;
    let reason = tokio::time::timeout(bound, held.lost_signal().lost())
        .await
        .expect("the first holder was not told at its next renewal");
    assert_eq!(reason, LostReason::Taken);
    println!(
        "the first holder was told {:?} after the second took the lock",
        taken_at.elapsed()
    );
}

//! Singleton tasks on a Redis Cluster and behind Sentinel, through a failover of the master
//! that holds the leadership, and through a migration of its slot: at most one leader at a
//! time, and every new term greater than the last. Real processes: a 3-master cluster with a replica each, and one master, one
//! replica and three sentinels; masters are SIGKILLed and replicas promoted.

mod support;

use std::time::Duration;

use support::RedisServer;
use support::cluster::RedisCluster;
use support::sentinel::Sentinels;
use support::terms::{Timeline, cooperative};
use tower_redis_lock::{LockClient, SingletonHandle};

/// Long enough to outlast a failover (a master declared down after 1 s, then an election),
/// so a leader whose replica had its lock keeps leading through it.
const LEASE: Duration = Duration::from_secs(15);
/// Bound on a failover and on a change of leader after it (generous: shared, busy machines).
const FAILOVER_BOUND: Duration = Duration::from_secs(30);
/// The leadership's lock hash, whose master fails.
const KEY: &str = "lock:{reconcile}";

/// Two candidates, the first leading; then the master fails or the slot moves
/// (`fail_master`), the leader hands over by shutting down, and the next shuts down too. Checks that the terms did not overlap
/// and only grew.
async fn through_a_failover(locks: [LockClient; 2], fail_master: impl AsyncFnOnce()) -> Timeline {
    let timeline = Timeline::default();
    let [first, second] = locks;
    let leading = first
        .singleton("reconcile")
        .expect("name")
        .spawn(cooperative(&timeline, 0));
    timeline.leader_after(0, FAILOVER_BOUND).await;
    let waiting = second
        .singleton("reconcile")
        .expect("name")
        .spawn(cooperative(&timeline, 1));
    fail_master().await;
    // The leader keeps leading through the failover or loses its lease and hands over;
    // either way a shutdown of both must find one term after another.
    shut_down(leading).await;
    assert!(
        support::eventually(FAILOVER_BOUND, || timeline
            .snapshot()
            .iter()
            .any(|term| term.candidate == 1))
        .await,
        "the second candidate leads after the failover"
    );
    shut_down(waiting).await;
    timeline.assert_one_at_a_time();
    timeline
}

/// A client of `cluster` whose lease outlasts a failover.
async fn cluster_client(cluster: &RedisCluster) -> LockClient {
    LockClient::builder_cluster(cluster.urls())
        .watchdog_lease(LEASE)
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("cluster client")
}

async fn shut_down(handle: SingletonHandle) {
    tokio::time::timeout(FAILOVER_BOUND, handle.shutdown())
        .await
        .expect("a shutdown within the bound")
        .expect("a clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_of_the_leaderships_master_keeps_one_leader_at_a_time() {
    let mut cluster = RedisCluster::start_with_replicas(3, 1);
    cluster.provision_epochs().await;
    let locks = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let cluster = &mut cluster;
    through_a_failover(locks, async || {
        let master = cluster.node_of(KEY);
        let replica = cluster.replica_of(master);
        let acked: i64 = cluster.cmd(master, &["WAIT", "1", "5000"]);
        assert_eq!(acked, 1, "the replica has the lock and its queue");
        cluster.kill(master);
        let _: () = cluster.cmd(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
        assert!(
            support::eventually(FAILOVER_BOUND, || cluster.node_of(KEY) == replica).await,
            "the slot never moved to the promoted replica"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_of_the_leaderships_slot_keeps_one_leader_at_a_time() {
    let cluster = RedisCluster::start(3);
    cluster.provision_epochs().await;
    let locks = [
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    ];
    let cluster = &cluster;
    through_a_failover(locks, async || {
        let from = cluster.node_of(KEY);
        let to = cluster.other_master(from);
        // Keys and all, as `redis-cli --cluster reshard` moves them.
        cluster.migrate_slot(cluster.slot_of(KEY), from, to);
        assert_eq!(cluster.node_of(KEY), to);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_keeps_one_leader_at_a_time() {
    let mut master = RedisServer::start();
    let _replica = master.start_replica(master.port());
    let sentinels = Sentinels::start(
        3,
        master.port(),
        1,
        Duration::from_secs(1),
        Duration::from_secs(10),
    );
    let client = async || {
        LockClient::builder_sentinel(sentinels.urls(), Sentinels::MASTER)
            .watchdog_lease(LEASE)
            .command_timeout(Duration::from_millis(500))
            .build()
            .await
            .expect("sentinel client")
    };
    let locks = [client().await, client().await];
    let old_master = master.port();
    let master = &mut master;
    let sentinels = &sentinels;
    through_a_failover(locks, async || {
        let _: i64 = master.cmd(&["WAIT", "1", "5000"]);
        master.kill();
        assert!(
            support::eventually(FAILOVER_BOUND, || sentinels
                .master_port()
                .is_some_and(|port| port != old_master))
            .await,
            "the sentinels never promoted the replica"
        );
    })
    .await;
}

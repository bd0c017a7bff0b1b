//! The chaos run on a Redis Cluster of three masters, each with a replica: worker processes
//! (`tools/programs/chaos_worker.rs --cluster`) take hot and cold keys spread over every
//! slot while the cluster changes under them: planned failovers, masters SIGKILLed and
//! replaced by their replicas (then restarted as replicas), slots of held keys migrated to
//! another master (at once, or left half migrated for seconds and then finished, or opened
//! and aborted), and client
//! connections killed at the nodes. Then the checker reads every
//! process's log.
//!
//! The workers acquire with `min_replicas_acked(1)`: an acquisition that a killed master had
//! not passed to its replica is never reported as held.
//!
//! `CHAOS_CLUSTER_SECONDS` (default 60) sets the length and `CHAOS_SEED` the schedule;
//! `CHAOS_KEEP_LOGS` keeps the logs. The summary is one JSON line on stdout.

mod support;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::checker::env_number;
use support::cluster::RedisCluster;
use support::topology_chaos::{HOT_KEYS, Workers, inject_faults, keys_left, report_and_assert};
use tokio::time::sleep;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `CLUSTER FAILOVER` on a master's replica: the replica catches up, then takes over.
    PlannedFailover,
    /// A master SIGKILLed, its replica promoted (`CLUSTER FAILOVER TAKEOVER`), and the dead
    /// node started again (empty) to become the new master's replica.
    KillMaster,
    /// The slot of a hot key migrated to another master, keys and all.
    Reshard,
    /// The slot of a hot key left half migrated for a while (IMPORTING and MIGRATING set,
    /// some of its keys moved), as a resharding that died leaves it, then finished as
    /// `redis-cli --cluster fix` finishes it.
    StalledReshard,
    /// The slot of a hot key set IMPORTING and MIGRATING for a while, no key moved, then
    /// the migration aborted (`CLUSTER SETSLOT … STABLE` on both nodes): nothing of the
    /// slot may be left on the node it never went to.
    AbortedReshard,
    /// `CLIENT KILL TYPE pubsub` on every node.
    KillPubSubClients,
    /// `CLIENT KILL TYPE normal` on every node.
    KillNormalClients,
}

const FAULTS: [Fault; 7] = [
    Fault::PlannedFailover,
    Fault::KillMaster,
    Fault::Reshard,
    Fault::StalledReshard,
    Fault::AbortedReshard,
    Fault::KillPubSubClients,
    Fault::KillNormalClients,
];

/// A master whose replica is in sync, and that replica: the ones a failover may use.
fn master_with_replica(cluster: &RedisCluster, rng: &mut StdRng) -> Option<(u16, u16)> {
    let masters = cluster.masters();
    let master = masters[rng.random_range(0..masters.len())];
    let info: String = cluster.cmd(master, &["INFO", "replication"]);
    info.contains("state=online")
        .then(|| (master, cluster.replica_of(master)))
}

/// Waits until the node on `port` is a master (a failover took effect); whether it did.
async fn becomes_master(cluster: &RedisCluster, port: u16) -> bool {
    support::eventually(Duration::from_secs(15), || {
        cluster.masters().contains(&port)
    })
    .await
}

/// Injects one fault; returns whether it could be (a failover needs a replica in sync).
async fn inject(kind: Fault, rng: &mut StdRng, cluster: &mut RedisCluster) -> bool {
    match kind {
        Fault::PlannedFailover => {
            let Some((_, replica)) = master_with_replica(cluster, rng) else {
                return false;
            };
            // Given up by Redis three times (a busy machine): nothing was injected.
            if !cluster.planned_failover(replica).await {
                return false;
            }
        }
        Fault::KillMaster => {
            let Some((master, replica)) = master_with_replica(cluster, rng) else {
                return false;
            };
            cluster.kill(master);
            let _: () = cluster.cmd(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
            assert!(
                becomes_master(cluster, replica).await,
                "node {replica} never took over from the killed master {master}"
            );
            sleep(Duration::from_millis(rng.random_range(200..1500))).await;
            cluster.restart(master);
        }
        Fault::Reshard | Fault::StalledReshard | Fault::AbortedReshard => {
            let key = format!("lock:{{hot-{}}}", rng.random_range(0..HOT_KEYS));
            let from = cluster.node_of(&key);
            let masters = cluster.masters();
            let others: Vec<u16> = masters.into_iter().filter(|port| *port != from).collect();
            let to = others[rng.random_range(0..others.len())];
            let slot = cluster.slot_of(&key);
            if kind == Fault::Reshard {
                cluster.migrate_slot(slot, from, to);
            } else if kind == Fault::AbortedReshard {
                cluster.start_migration(slot, from, to, &[]);
                sleep(Duration::from_millis(rng.random_range(1000..5000))).await;
                let slot = slot.to_string();
                for port in [from, to] {
                    let () = cluster.cmd(port, &["CLUSTER", "SETSLOT", &slot, "STABLE"]);
                }
                let stranded: i64 = cluster.cmd(to, &["CLUSTER", "COUNTKEYSINSLOT", &slot]);
                assert_eq!(
                    stranded, 0,
                    "slot {slot}: keys left on {to} by an aborted migration"
                );
            } else {
                // Some of the slot's keys (each with an even chance) move before the stall.
                let keys = cluster.keys_in_slot(from, slot);
                let moved: Vec<&str> = keys
                    .iter()
                    .map(String::as_str)
                    .filter(|_| rng.random_bool(0.5))
                    .collect();
                cluster.start_migration(slot, from, to, &moved);
                sleep(Duration::from_millis(rng.random_range(1000..5000))).await;
                cluster.finish_migration(slot, from, to);
            }
        }
        Fault::KillPubSubClients | Fault::KillNormalClients => {
            let kind = if kind == Fault::KillPubSubClients {
                "pubsub"
            } else {
                "normal"
            };
            for port in cluster.masters() {
                let _: i64 = cluster.cmd(port, &["CLIENT", "KILL", "TYPE", kind]);
            }
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_on_a_cluster_keeps_exclusion_and_fencing_and_leaks_nothing() {
    let seconds = env_number("CHAOS_CLUSTER_SECONDS").unwrap_or(60);
    let seed = env_number("CHAOS_SEED").unwrap_or_else(|| rand::random::<u32>().into());
    println!("cluster chaos: {seconds} s, seed {seed} (CHAOS_SEED={seed} repeats the schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cluster = RedisCluster::start_with_replicas(3, 1);
    cluster.provision_epochs().await;
    let urls = cluster.urls();

    // No group commit: a cluster client never gathers its calls.
    let workers = Workers::start("chaos-cluster", &["--cluster"], &[], &urls, seconds, seed);

    let injected = inject_faults(seconds, &mut rng, &FAULTS, &mut cluster, inject).await;
    let verdict = workers.finish().await;
    let masters = cluster.masters();
    let keys = keys_left(|| {
        let mut left = std::collections::BTreeMap::new();
        for &port in &masters {
            for key in cluster.lock_keys_left(&[port]) {
                let time_left: i64 = cluster.cmd(port, &["PTTL", &key]);
                left.insert(key, time_left);
            }
        }
        left
    })
    .await;

    report_and_assert(
        "cluster, 3 masters + 3 replicas",
        (seconds, seed),
        &verdict,
        &keys,
        &injected,
    );
    assert!(
        injected.values().sum::<usize>() >= (seconds as usize / 10),
        "faults were injected: {injected:?}"
    );
}

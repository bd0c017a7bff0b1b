//! The chaos run on a Redis Cluster of three masters, each with a replica: worker processes
//! (`tools/programs/chaos_worker.rs --cluster`) take hot and cold keys spread over every
//! slot while the cluster changes under them: planned failovers, masters SIGKILLed and
//! replaced by their replicas (then restarted as replicas), slots of held keys migrated to
//! another master, and client connections killed at the nodes. Then the checker reads every
//! process's log.
//!
//! The workers acquire with `min_replicas_acked(1)`: an acquisition that a killed master had
//! not passed to its replica is never reported as held.
//!
//! `CHAOS_CLUSTER_SECONDS` (default 60) sets the length and `CHAOS_SEED` the schedule;
//! `CHAOS_KEEP_LOGS` keeps the logs. The summary is one JSON line on stdout.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use support::checker::{check, env_number, read_logs};
use support::cluster::RedisCluster;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

const PROCESSES: usize = 3;
const TASKS: usize = 8;
const HOT_KEYS: usize = 3;
const COLD_KEYS: usize = 2000;
/// Long enough that a holder's renewals reach the new master after a takeover before the
/// lease runs out there.
const LEASE: Duration = Duration::from_millis(6000);
const WAIT: Duration = Duration::from_millis(8000);
/// Generous slack on the wait bound for the checker (shared, busy machines).
const WAIT_SLACK: Duration = Duration::from_secs(4);
const QUARANTINE: Duration = Duration::from_millis(6000);
/// The last seconds of a run have no faults, so every wait can end.
const QUIET_END: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// `CLUSTER FAILOVER` on a master's replica: the replica catches up, then takes over.
    PlannedFailover,
    /// A master SIGKILLed, its replica promoted (`CLUSTER FAILOVER TAKEOVER`), and the dead
    /// node started again (empty) to become the new master's replica.
    KillMaster,
    /// The slot of a hot key migrated to another master, keys and all.
    Reshard,
    /// `CLIENT KILL TYPE pubsub` on every node.
    KillPubSubClients,
    /// `CLIENT KILL TYPE normal` on every node.
    KillNormalClients,
}

const FAULTS: [Fault; 5] = [
    Fault::PlannedFailover,
    Fault::KillMaster,
    Fault::Reshard,
    Fault::KillPubSubClients,
    Fault::KillNormalClients,
];

fn spawn_worker(index: usize, urls: &[String], log: &str, seconds: u64, seed: u64) -> Child {
    let mut command = Command::new(support::example_path("chaos_worker"));
    command.arg("--cluster");
    for url in urls {
        command.args(["--url", url]);
    }
    command
        .args(["--log", log])
        .args(["--seconds", &seconds.to_string()])
        .args(["--tasks", &TASKS.to_string()])
        .args(["--hot", &HOT_KEYS.to_string()])
        .args(["--cold", &COLD_KEYS.to_string()])
        .args(["--lease-ms", &LEASE.as_millis().to_string()])
        .args(["--wait-ms", &WAIT.as_millis().to_string()])
        .args(["--quarantine-ms", &QUARANTINE.as_millis().to_string()])
        .args(["--seed", &(seed + index as u64).to_string()])
        .args(["--replicas-acked", "1"])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("a chaos worker starts")
}

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
        Fault::Reshard => {
            let key = format!("lock:{{hot-{}}}", rng.random_range(0..HOT_KEYS));
            let from = cluster.node_of(&key);
            let masters = cluster.masters();
            let others: Vec<u16> = masters.into_iter().filter(|port| *port != from).collect();
            let to = others[rng.random_range(0..others.len())];
            cluster.migrate_slot(cluster.slot_of(&key), from, to);
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

    let dir = std::env::temp_dir().join(format!("chaos-cluster-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("log directory");
    let logs: Vec<String> = (0..PROCESSES)
        .map(|index| {
            dir.join(format!("worker-{index}.jsonl"))
                .display()
                .to_string()
        })
        .collect();
    let mut workers: Vec<Child> = logs
        .iter()
        .enumerate()
        .map(|(index, log)| spawn_worker(index, &urls, log, seconds, seed))
        .collect();

    let started = Instant::now();
    let faults_end = started + Duration::from_secs(seconds).saturating_sub(QUIET_END);
    let mut injected: BTreeMap<String, usize> = BTreeMap::new();
    while Instant::now() < faults_end {
        sleep(Duration::from_millis(rng.random_range(1500..3500))).await;
        if Instant::now() >= faults_end {
            break;
        }
        let kind = FAULTS[rng.random_range(0..FAULTS.len())];
        if inject(kind, &mut rng, &mut cluster).await {
            *injected.entry(format!("{kind:?}")).or_default() += 1;
        }
    }

    for worker in &mut workers {
        let status = tokio::time::timeout(QUIET_END + WAIT + WAIT_SLACK * 4, worker.wait())
            .await
            .expect("a worker ends soon after its run")
            .expect("worker status");
        assert!(status.success(), "a worker failed: {status}");
    }
    let keys_left: Vec<String> = cluster
        .masters()
        .iter()
        .flat_map(|port| cluster.cmd::<Vec<String>>(*port, &["KEYS", "lock:{*"]))
        .filter(|key| !key.ends_with(":fence"))
        .collect();

    let (sections, failures) = read_logs(&dir, &logs);
    let verdict = check(&sections, &failures, (WAIT + WAIT_SLACK).as_nanos() as i64);
    println!(
        "{}",
        json!({
            "topology": "cluster, 3 masters + 3 replicas",
            "seconds": seconds, "seed": seed, "processes": PROCESSES, "tasks": TASKS,
            "acquisitions": verdict.sections, "failed_acquisitions": verdict.failures,
            "overlaps": verdict.overlaps, "token_regressions": verdict.token_regressions,
            "stuck_waiters": verdict.stuck,
            "lost_signalled": verdict.lost_signalled,
            "lost_found_at_release": verdict.lost_found_at_release,
            "lock_keys_left": keys_left.len(), "faults": injected,
        })
    );
    assert!(verdict.examples.is_empty(), "{:#?}", verdict.examples);
    assert_eq!(verdict.overlaps, 0);
    assert_eq!(verdict.token_regressions, 0);
    assert!(verdict.sections > 0, "the workers took locks");
    assert!(
        verdict.failures.keys().all(|kind| matches!(
            kind.as_str(),
            "timeout" | "redis_unavailable" | "restart_quarantine" | "replicas_behind"
        )),
        "failed acquisitions: {:?}",
        verdict.failures
    );
    assert_eq!(verdict.stuck, 0, "no acquisition outlived its bound");
    assert!(keys_left.is_empty(), "locks left in Redis: {keys_left:?}");
    assert!(
        injected.values().sum::<usize>() >= (seconds as usize / 10),
        "faults were injected: {injected:?}"
    );
}

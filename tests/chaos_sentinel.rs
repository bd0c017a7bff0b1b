//! The chaos run behind Redis Sentinel: one master, one replica and three sentinels, real
//! processes. Worker processes (`tools/programs/chaos_worker.rs --sentinel`) take hot and
//! cold keys while the master is SIGKILLed (its replica promoted by the sentinels, the dead
//! node started again as the new master's replica), failovers are asked of the sentinels
//! (`SENTINEL FAILOVER`), and client connections are killed. Then the checker reads every
//! process's log: no overlap among holders that were not told, tokens increasing per key,
//! no stuck waiter, no key left past its lease.
//!
//! Every other process (one of the three) gathers its calls (group commit); the others send
//! each alone.
//!
//! The workers acquire with `min_replicas_acked(1)`: an acquisition that a killed master had
//! not passed to its replica is never reported as held (`tests/sentinel.rs` shows the hole
//! without it).
//!
//! `CHAOS_SENTINEL_SECONDS` (default 60) sets the length and `CHAOS_SEED` the schedule;
//! `CHAOS_KEEP_LOGS` keeps the logs. The summary is one JSON line on stdout.

mod support;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::RedisServer;
use support::checker::env_number;
use support::sentinel::Sentinels;
use support::topology_chaos::{Workers, inject_faults, keys_left, report_and_assert};
use tokio::time::{Instant, sleep};

/// The sentinels declare a master down after this.
const DOWN_AFTER: Duration = Duration::from_secs(1);
/// A sentinel that led a failover leads none for twice this: failovers are spaced by more.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(4);
/// Bound on a failover taking effect (generous: shared, busy machines).
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// The master SIGKILLed, its replica promoted by the sentinels, and the dead node
    /// started again (empty) as the new master's replica.
    KillMaster,
    /// `SENTINEL FAILOVER`: the sentinels promote the replica while the master still runs,
    /// then turn the old master into its replica.
    SentinelFailover,
    /// `CLIENT KILL TYPE pubsub` on the master.
    KillPubSubClients,
    /// `CLIENT KILL TYPE normal` on the master.
    KillNormalClients,
}

const FAULTS: [Fault; 4] = [
    Fault::KillMaster,
    Fault::SentinelFailover,
    Fault::KillPubSubClients,
    Fault::KillNormalClients,
];

/// The master, its replica and the sentinels that watch them.
struct Topology {
    /// The two data nodes; which one is the master changes with every failover.
    nodes: [RedisServer; 2],
    sentinels: Sentinels,
    /// When the last failover was asked for or caused.
    last_failover: Option<Instant>,
}

impl Topology {
    /// The index in `nodes` of the master every sentinel names.
    fn master(&self) -> Option<usize> {
        let port = self.sentinels.master_port()?;
        self.nodes.iter().position(|node| node.port() == port)
    }

    /// Whether the master has its replica online, so a failover may use it.
    fn replica_in_sync(&self, master: usize) -> bool {
        let info: String = self.nodes[master].cmd(&["INFO", "replication"]);
        info.contains("state=online")
    }

    /// Waits until every sentinel names the node `index` as the master.
    async fn becomes_master(&self, index: usize) -> bool {
        support::eventually(FAILOVER_BOUND, || self.master() == Some(index)).await
    }
}

/// Injects one fault; returns whether it could be (a failover needs a replica in sync and
/// sentinels free to lead one).
async fn inject(kind: Fault, rng: &mut StdRng, topology: &mut Topology) -> bool {
    let Some(master) = topology.master() else {
        return false;
    };
    let replica = 1 - master;
    match kind {
        Fault::KillMaster | Fault::SentinelFailover => {
            let rested = topology
                .last_failover
                .is_none_or(|at| at.elapsed() > FAILOVER_TIMEOUT * 2 + Duration::from_secs(1));
            if !rested || !topology.replica_in_sync(master) {
                return false;
            }
            topology.last_failover = Some(Instant::now());
            if kind == Fault::KillMaster {
                topology.nodes[master].kill();
            } else {
                let sentinel = topology.sentinels.ports()[rng.random_range(0..3)];
                let asked = redis::Client::open(format!("redis://127.0.0.1:{sentinel}"))
                    .and_then(|client| client.get_connection())
                    .and_then(|mut conn| {
                        redis::cmd("SENTINEL")
                            .arg("FAILOVER")
                            .arg(Sentinels::MASTER)
                            .query::<()>(&mut conn)
                    });
                // Refused while the sentinels still settle the last one: nothing injected.
                if asked.is_err() {
                    return false;
                }
            }
            if !topology.becomes_master(replica).await {
                // A failover the sentinels accepted and then gave up (their view of the
                // replica gone stale, as after their links were cut): nothing injected, as
                // long as every sentinel still names the old master. A killed master that is
                // never replaced, or sentinels that disagree, fail the run.
                assert!(
                    kind == Fault::SentinelFailover && topology.master() == Some(master),
                    "the sentinels never promoted node {} ({kind:?}); they name {:?}",
                    topology.nodes[replica].port(),
                    topology.sentinels.master_port()
                );
                return false;
            }
            if kind == Fault::KillMaster {
                sleep(Duration::from_millis(rng.random_range(200..1500))).await;
                let new_master = topology.nodes[replica].port();
                topology.nodes[master].restart_as_replica_of(new_master);
            }
        }
        Fault::KillPubSubClients | Fault::KillNormalClients => {
            let kind = if kind == Fault::KillPubSubClients {
                "pubsub"
            } else {
                "normal"
            };
            let _: i64 = topology.nodes[master].cmd(&["CLIENT", "KILL", "TYPE", kind]);
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_behind_sentinel_keeps_exclusion_and_fencing_and_leaks_nothing() {
    let seconds = env_number("CHAOS_SENTINEL_SECONDS").unwrap_or(60);
    let seed = env_number("CHAOS_SEED").unwrap_or_else(|| rand::random::<u32>().into());
    println!("sentinel chaos: {seconds} s, seed {seed} (CHAOS_SEED={seed} repeats the schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let master = RedisServer::start();
    let replica = master.start_replica(master.port());
    let sentinels = Sentinels::start(3, master.port(), 1, DOWN_AFTER, FAILOVER_TIMEOUT);
    let urls = sentinels.urls();
    let mut topology = Topology {
        nodes: [master, replica],
        sentinels,
        last_failover: None,
    };

    let topology_flags = ["--sentinel", Sentinels::MASTER];
    // Every other process gathers its calls (group commit): every failover meets both paths.
    let gathering = ["--group-commit"];
    let workers = Workers::start(
        "chaos-sentinel",
        &topology_flags,
        &gathering,
        &urls,
        seconds,
        seed,
    );

    let injected = inject_faults(seconds, &mut rng, &FAULTS, &mut topology, inject).await;
    let verdict = workers.finish().await;
    let master = topology
        .master()
        .expect("the sentinels agree on the master");
    let node = &topology.nodes[master];
    let keys = keys_left(|| {
        node.cmd::<Vec<String>>(&["KEYS", "lock:{*"])
            .into_iter()
            .filter(|key| !key.ends_with(":fence"))
            .map(|key| {
                let left: i64 = node.cmd(&["PTTL", &key]);
                (key, left)
            })
            .collect()
    })
    .await;

    report_and_assert(
        "sentinel, 1 master + 1 replica + 3 sentinels",
        (seconds, seed),
        &verdict,
        &keys,
        &injected,
    );
    assert!(
        injected.contains_key("KillMaster") || injected.contains_key("SentinelFailover"),
        "a failover was injected: {injected:?}"
    );
}

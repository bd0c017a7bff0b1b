//! What the chaos runs on a cluster (`tests/chaos_cluster.rs`) and behind Sentinel
//! (`tests/chaos_sentinel.rs`) share: the worker processes and their settings, their logs,
//! and the verdict's report and checks. Each run brings its topology and its faults.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::json;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

use super::checker::{Verdict, check, log_paths, read_logs};

/// Worker processes, each with its own client.
pub const PROCESSES: usize = 3;
/// Tasks per worker.
pub const TASKS: usize = 8;
/// Keys every task takes often; a fault may move their slots.
pub const HOT_KEYS: usize = 3;
const COLD_KEYS: usize = 2000;
/// Long enough that a holder's renewals reach the new master after a failover before the
/// lease runs out there.
const LEASE: Duration = Duration::from_millis(6000);
const WAIT: Duration = Duration::from_millis(8000);
/// Generous slack on the wait bound for the checker (shared, busy machines).
const WAIT_SLACK: Duration = Duration::from_secs(4);
const QUARANTINE: Duration = Duration::from_millis(6000);
/// The last seconds of a run have no faults, so every wait can end.
const QUIET_END: Duration = Duration::from_secs(10);

/// The worker processes of one run and their logs.
pub struct Workers {
    dir: PathBuf,
    logs: Vec<String>,
    children: Vec<Child>,
}

impl Workers {
    /// Starts the workers (`chaos_worker`, with `topology` flags such as `--cluster`, and the
    /// `urls` of the topology) for `seconds`; every other one (the odd-numbered) also gets
    /// `odd_flags`. They acquire with `min_replicas_acked(1)`: an acquisition that a killed
    /// master had not passed to its replica is never reported as held.
    pub fn start(
        run: &str,
        topology: &[&str],
        odd_flags: &[&str],
        urls: &[String],
        seconds: u64,
        seed: u64,
    ) -> Self {
        let (dir, logs) = log_paths(run, seed, PROCESSES);
        let children = logs
            .iter()
            .enumerate()
            .map(|(index, log)| {
                let mut command = Command::new(super::example_path("chaos_worker"));
                command.args(topology);
                if index % 2 == 1 {
                    command.args(odd_flags);
                }
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
            })
            .collect();
        Self {
            dir,
            logs,
            children,
        }
    }

    /// Waits for every worker to end well, then checks their logs.
    pub async fn finish(mut self) -> Verdict {
        for worker in &mut self.children {
            let status = tokio::time::timeout(QUIET_END + WAIT + WAIT_SLACK * 4, worker.wait())
                .await
                .expect("a worker ends soon after its run")
                .expect("worker status");
            assert!(status.success(), "a worker failed: {status}");
        }
        let (sections, failures) = read_logs(&self.dir, &self.logs);
        check(&sections, &failures, (WAIT + WAIT_SLACK).as_nanos() as i64)
    }
}

/// Injects faults of random `kinds` into `topology` every 1.5–3.5 s until `QUIET_END`
/// before the run's end; returns how many of each kind `inject` could inject.
pub async fn inject_faults<Fault: Copy + Debug, Topology>(
    seconds: u64,
    rng: &mut StdRng,
    kinds: &[Fault],
    topology: &mut Topology,
    mut inject: impl AsyncFnMut(Fault, &mut StdRng, &mut Topology) -> bool,
) -> BTreeMap<String, usize> {
    let faults_end = Instant::now() + Duration::from_secs(seconds).saturating_sub(QUIET_END);
    let mut injected = BTreeMap::new();
    while Instant::now() < faults_end {
        sleep(Duration::from_millis(rng.random_range(1500..3500))).await;
        if Instant::now() >= faults_end {
            break;
        }
        let kind = kinds[rng.random_range(0..kinds.len())];
        if inject(kind, rng, topology).await {
            *injected.entry(format!("{kind:?}")).or_default() += 1;
        }
    }
    injected
}

/// The lock keys a run left in Redis: those there when its workers had ended, each with the
/// milliseconds it had left (`PTTL`, -1 for no expiry), and those still there a lease and the
/// slack later.
pub struct KeysLeft {
    pub at_end: BTreeMap<String, i64>,
    pub outliving_leases: Vec<String>,
}

/// Reads the lock keys `read` finds, with their milliseconds left, once the workers have
/// ended, and again until none is left or a lease and the slack have passed.
///
/// A key there at the end need not be leaked. An acquisition that failed in a fault's last
/// seconds (its commands timing out, its replicas behind) gives its lock back in the
/// background, or leaves its queue; when Redis does not answer that in time, the lock or the
/// place stays until its lease or its liveness ends, as a dead holder's does. A leaked key (no
/// expiry, or renewed for no holder) is still there a lease later.
pub async fn keys_left(mut read: impl FnMut() -> BTreeMap<String, i64>) -> KeysLeft {
    let at_end = read();
    let gone =
        at_end.is_empty() || super::eventually(LEASE + WAIT_SLACK, || read().is_empty()).await;
    let outliving_leases = if gone {
        Vec::new()
    } else {
        read().into_keys().collect()
    };
    KeysLeft {
        at_end,
        outliving_leases,
    }
}

/// Prints the run's JSON line and asserts the verdict: no overlap among holders that were
/// not told, tokens increasing per key, only the failures a topology change explains, no
/// stuck waiter, no lock key outliving its lease.
pub fn report_and_assert(
    topology: &str,
    (seconds, seed): (u64, u64),
    verdict: &Verdict,
    keys: &KeysLeft,
    faults: &BTreeMap<String, usize>,
) {
    println!(
        "{}",
        json!({
            "topology": topology,
            "seconds": seconds, "seed": seed, "processes": PROCESSES, "tasks": TASKS,
            "acquisitions": verdict.sections, "failed_acquisitions": verdict.failures,
            "overlaps": verdict.overlaps, "token_regressions": verdict.token_regressions,
            "stuck_waiters": verdict.stuck,
            "lost_signalled": verdict.lost_signalled,
            "lost_found_at_release": verdict.lost_found_at_release,
            "lock_keys_at_end": keys.at_end,
            "lock_keys_left": keys.outliving_leases.len(), "faults": faults,
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
        "failed acquisitions: {:?}, the first of each kind: {:#?}",
        verdict.failures,
        verdict.failure_details
    );
    assert_eq!(verdict.stuck, 0, "no acquisition outlived its bound");
    assert!(
        keys.outliving_leases.is_empty(),
        "locks left in Redis past their leases: {:?} (at the end, with ms left: {:?})",
        keys.outliving_leases,
        keys.at_end
    );
}

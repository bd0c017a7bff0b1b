//! The chaos run: several worker processes (`tools/programs/chaos_worker.rs`), each behind its own
//! fault proxy, take hot and cold keys while faults are injected at random, the server's wall
//! clock among them (`support/clock_shim.c`); then the checker reads every process's log.
//! Half the processes gather their calls (group commit), half send each alone.
//!
//! `CHAOS_SECONDS` (default 90) sets the length and `CHAOS_SEED` the fault schedule (a
//! random one is printed otherwise); `CHAOS_KEEP_LOGS` keeps the workers' logs. The summary is one JSON line on stdout (`cargo test
//! --test chaos -- --nocapture` shows it).

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use support::RedisServer;
use support::checker::{Failure, Section, check, env_number, log_paths, read_logs};
use support::clock::FakeClock;
use support::proxy::FaultProxy;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const HOT_KEYS: usize = 3;
const COLD_KEYS: usize = 2000;
const LEASE: Duration = Duration::from_millis(2000);
const WAIT: Duration = Duration::from_millis(4000);
/// Beyond the wait bound: one command timeout (500 ms) for the look in flight when the bound
/// passes, and seconds of slack for a loaded two-core machine.
const WAIT_SLACK: Duration = Duration::from_secs(3);
/// The workers' restart quarantine: after Redis lost its data, no lock is granted this long.
const QUARANTINE: Duration = Duration::from_millis(2000);
/// What a full run (60 s or more) must reach per 90 s in which Redis granted locks: the time
/// it was down, and each quarantine after it lost its data, grant none by design, and a
/// schedule heavy in restarts would otherwise fail a run that lost nothing.
const MIN_ACQUISITIONS: usize = 100_000;
/// The last seconds run without faults, so every process finishes on a healthy Redis.
const QUIET_END: Duration = Duration::from_secs(6);

/// The kinds of fault the run injects, one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// Every connection of one process (or of all of them) cut at the proxy.
    CutConnections,
    /// Only the pub/sub connections cut at the proxy.
    CutPubSub,
    /// One process's traffic stalled for 0.5–3.5 s (past the 2 s lease sometimes).
    BlackHole,
    /// 5–40 ms added to every chunk of every process for 1–3 s.
    Latency,
    /// `CLIENT KILL TYPE normal` at the server.
    KillNormalClients,
    /// `CLIENT KILL TYPE pubsub` at the server.
    KillPubSubClients,
    /// Redis SIGKILLed and started again on its port at once, its data gone.
    RestartRedis,
    /// Redis SIGKILLed, down for 0.5–3 s, started again without its data.
    RedisDown,
    /// Redis SIGKILLed and started again from its own files: its append-only file
    /// (`appendfsync everysec`: up to a second of writes lost) or its last snapshot (saved
    /// every second: the writes since lost), at random. Whatever came back, the restart is a
    /// loss: no lock may be granted again while a holder from before could still hold it.
    RestartFromFiles,
    /// One process's traffic stalled while Redis restarts without its data, healed 0.5–3.5 s
    /// later: its holders cannot hear of the loss and must be told by their own deadlines
    /// before the quarantine ends.
    CutHolderDuringRestart,
    /// One process's stalling task has its runtime blocked for [`STALL`] while it waits
    /// (SIGUSR1): a grant that lapses meanwhile must not come back as a held lock.
    StallRuntime,
    /// The server's wall clock stepped back 1–30 s (an NTP step, a clock set by hand): leases
    /// then last longer in Redis, and tokens must not follow the clock back.
    ClockStepBack,
    /// The server's wall clock stepped forward by 20–100 ms, within the tenth of a lease a
    /// holder is told early by (200 ms here): every lease then ends that much sooner in
    /// Redis. A forward step past that margin ends leases before their holders are told, on
    /// any lock that lets Redis expire its keys; the safety chapter says so.
    ClockStepForward,
}

/// How long a stall fault blocks a runtime: past the claim lease a grant from the queue
/// starts on (the 2 s lease here).
const STALL: Duration = Duration::from_millis(3000);

const FAULTS: [Fault; 13] = [
    Fault::CutConnections,
    Fault::CutPubSub,
    Fault::BlackHole,
    Fault::Latency,
    Fault::KillNormalClients,
    Fault::KillPubSubClients,
    Fault::RestartRedis,
    Fault::RedisDown,
    Fault::RestartFromFiles,
    Fault::CutHolderDuringRestart,
    Fault::StallRuntime,
    Fault::ClockStepBack,
    Fault::ClockStepForward,
];

fn spawn_worker(index: usize, url: &str, log: &str, seconds: u64, seed: u64) -> Child {
    Command::new(support::example_path("chaos_worker"))
        .args(["--url", url, "--log", log])
        .args(["--seconds", &seconds.to_string()])
        .args(["--tasks", &TASKS.to_string()])
        .args(["--hot", &HOT_KEYS.to_string()])
        .args(["--cold", &COLD_KEYS.to_string()])
        .args(["--lease-ms", &LEASE.as_millis().to_string()])
        .args(["--wait-ms", &WAIT.as_millis().to_string()])
        .args(["--quarantine-ms", &QUARANTINE.as_millis().to_string()])
        .args(["--seed", &(seed + index as u64).to_string()])
        .args(["--stall-ms", &STALL.as_millis().to_string()])
        // Half the processes gather their calls (group commit): every fault meets both paths.
        .args((index % 2 == 1).then_some("--group-commit"))
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("a chaos worker starts")
}

/// The spans of a run in which no lock can be granted: Redis down, and the quarantine after
/// it comes back without its data. A restart during a quarantine starts another that
/// overlaps it, so the time they keep grants away is their union, not their sum.
#[derive(Default)]
struct NoGrants {
    spans: Vec<(Instant, Instant)>,
}

impl NoGrants {
    /// Redis went down at `from` and is back now without its data: no grant until its
    /// quarantine ends, which covers the workers' lease too.
    fn down_since(&mut self, from: Instant) {
        let quarantine = QUARANTINE.max(LEASE);
        self.spans.push((from, Instant::now() + quarantine));
    }

    /// The server's clock stepped back by `step`: a quarantine under way ends by that clock,
    /// so it lasts the step longer.
    fn clock_stepped_back(&mut self, step: Duration) {
        let now = Instant::now();
        if let Some((_, end)) = self.spans.iter_mut().filter(|(_, end)| *end > now).last() {
            *end += step;
        }
    }

    /// How much of `from..to` the spans cover.
    fn within(&self, from: Instant, to: Instant) -> Duration {
        let mut spans: Vec<(Instant, Instant)> = self
            .spans
            .iter()
            .map(|&(start, end)| (start.max(from), end.min(to)))
            .filter(|(start, end)| start < end)
            .collect();
        spans.sort();
        let mut covered = Duration::ZERO;
        let mut reached = from;
        for (start, end) in spans {
            let start = start.max(reached);
            if end > start {
                covered += end - start;
                reached = end;
            }
        }
        covered
    }
}

/// Injects one fault of `kind` and undoes it; Redis may be replaced (same port, no data).
/// What keeps every lock from being granted (Redis down, the quarantine after it comes back
/// without its data, a step back of the server's clock during that quarantine) goes into
/// `no_grants`.
async fn inject(
    kind: Fault,
    rng: &mut StdRng,
    clock: &FakeClock,
    server: &mut RedisServer,
    proxies: &[FaultProxy],
    workers: &[Child],
    no_grants: &mut NoGrants,
) {
    let port = server.port();
    let chosen = rng.random_range(0..proxies.len());
    let one = &proxies[chosen];
    match kind {
        Fault::CutConnections if rng.random_bool(0.5) => {
            one.cut_all();
        }
        Fault::CutConnections => proxies.iter().for_each(|proxy| {
            proxy.cut_all();
        }),
        Fault::CutPubSub => proxies.iter().for_each(|proxy| {
            proxy.cut_pubsub();
        }),
        Fault::BlackHole => {
            one.black_hole();
            sleep(Duration::from_millis(rng.random_range(500..3500))).await;
            one.heal();
        }
        Fault::Latency => {
            let latency = Duration::from_millis(rng.random_range(5..40));
            proxies.iter().for_each(|proxy| proxy.set_latency(latency));
            sleep(Duration::from_millis(rng.random_range(1000..3000))).await;
            proxies
                .iter()
                .for_each(|proxy| proxy.set_latency(Duration::ZERO));
        }
        Fault::KillNormalClients => {
            let _: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
        }
        Fault::KillPubSubClients => {
            let _: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        }
        Fault::RestartRedis => {
            let down = Instant::now();
            server.kill();
            *server = restart_without_data(clock, port);
            no_grants.down_since(down);
        }
        Fault::RedisDown => {
            let down = Instant::now();
            server.kill();
            sleep(Duration::from_millis(rng.random_range(500..3000))).await;
            *server = restart_without_data(clock, port);
            no_grants.down_since(down);
        }
        Fault::RestartFromFiles => {
            clock.set_offset(0);
            let from = if rng.random_bool(0.5) {
                ["--appendonly", "yes"]
            } else {
                ["--appendonly", "no"]
            };
            let mut args = PERSISTENCE.to_vec();
            args.extend(from);
            let down = Instant::now();
            server.crash_and_restart_with_clock(clock, &args);
            no_grants.down_since(down);
        }
        Fault::CutHolderDuringRestart => {
            one.black_hole();
            let down = Instant::now();
            server.kill();
            *server = restart_without_data(clock, port);
            no_grants.down_since(down);
            sleep(Duration::from_millis(rng.random_range(500..3500))).await;
            one.heal();
        }
        Fault::StallRuntime => {
            if let Some(pid) = workers[chosen].id() {
                let signalled = std::process::Command::new("kill")
                    .args(["-USR1", &pid.to_string()])
                    .status()
                    .expect("kill runs");
                assert!(signalled.success(), "the worker takes SIGUSR1");
            }
        }
        Fault::ClockStepBack => {
            let step = Duration::from_millis(rng.random_range(1000..30_000));
            clock.step_back(step);
            no_grants.clock_stepped_back(step);
        }
        Fault::ClockStepForward => {
            clock.step_forward(Duration::from_millis(rng.random_range(20..100)));
        }
    }
}

/// Whether the server's wall clock is within a second of the real one.
fn server_clock_is_right(server: &RedisServer) -> bool {
    let (seconds, micros): (i64, i64) = server.cmd(&["TIME"]);
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_micros() as i64;
    (seconds * 1_000_000 + micros - real).abs() < 1_000_000
}

/// Starts the server again on `port` without its data, its clock set right while it was down
/// (a restart is when a clock is corrected): after a loss of data, tokens start past the
/// server clock, which is only a floor while it did not go back (see the safety chapter).
fn restart_without_data(clock: &FakeClock, port: u16) -> RedisServer {
    clock.set_offset(0);
    RedisServer::start_with_clock(clock, port, &PERSISTENCE)
}

/// How the server persists: a snapshot every second with a write in it, and an append-only
/// file written to disk every second (Redis's default when it is on). A restart from
/// [`Fault::RestartFromFiles`] reloads one of them; a restart without data starts empty.
const PERSISTENCE: [&str; 6] = [
    "--save",
    "1 1",
    "--appendonly",
    "yes",
    "--appendfsync",
    "everysec",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_keeps_exclusion_and_fencing_and_leaks_nothing() {
    let seconds = env_number("CHAOS_SECONDS").unwrap_or(90);
    let seed = env_number("CHAOS_SEED").unwrap_or_else(|| rand::random::<u32>().into());
    println!("chaos: {seconds} s, seed {seed} (CHAOS_SEED={seed} repeats the schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    let clock = FakeClock::new();
    let mut server = RedisServer::start_with_clock(&clock, 0, &PERSISTENCE);
    server.provision_epoch("lock:");
    let mut proxies = Vec::new();
    for _ in 0..PROCESSES {
        proxies.push(FaultProxy::start(server.port()).await);
    }
    let (dir, logs) = log_paths("chaos", seed, PROCESSES);
    let mut workers: Vec<Child> = proxies
        .iter()
        .zip(&logs)
        .enumerate()
        .map(|(index, (proxy, log))| spawn_worker(index, &proxy.url(), log, seconds, seed))
        .collect();

    let started = Instant::now();
    let faults_end = started + Duration::from_secs(seconds).saturating_sub(QUIET_END);
    let mut injected: BTreeMap<String, usize> = BTreeMap::new();
    let mut no_grants = NoGrants::default();
    while Instant::now() < faults_end {
        sleep(Duration::from_millis(rng.random_range(1000..3000))).await;
        if Instant::now() >= faults_end {
            break;
        }
        let kind = FAULTS[rng.random_range(0..FAULTS.len())];
        inject(
            kind,
            &mut rng,
            &clock,
            &mut server,
            &proxies,
            &workers,
            &mut no_grants,
        )
        .await;
        *injected.entry(format!("{kind:?}")).or_default() += 1;
    }
    let run_end = started + Duration::from_secs(seconds);
    let granting = Duration::from_secs(seconds) - no_grants.within(started, run_end);

    for worker in &mut workers {
        let status = tokio::time::timeout(QUIET_END + WAIT + WAIT_SLACK * 4, worker.wait())
            .await
            .expect("a worker ends soon after its run")
            .expect("worker status");
        assert!(status.success(), "a worker failed: {status}");
    }
    // Every worker is done: the clock is set right, so what a step back kept alive in Redis
    // expires as it would have.
    clock.set_offset(0);
    assert!(
        support::eventually(Duration::from_secs(5), || server_clock_is_right(&server)).await,
        "the server clock was never set right"
    );
    let keys_left: Vec<String> = server
        .cmd::<Vec<String>>(&["KEYS", "lock:{*"])
        .into_iter()
        .filter(|key| !key.ends_with(":fence"))
        .collect();

    let (sections, failures) = read_logs(&dir, &logs);
    let bound = (WAIT + WAIT_SLACK).as_nanos() as i64;
    let verdict = check(&sections, &failures, bound);
    println!(
        "{}",
        json!({
            "seconds": seconds, "seed": seed, "processes": PROCESSES, "tasks": TASKS,
            "acquisitions": verdict.sections, "failed_acquisitions": verdict.failures,
            "overlaps": verdict.overlaps, "token_regressions": verdict.token_regressions,
            "stuck_waiters": verdict.stuck, "stalled_waits": verdict.stalled,
            "lost_signalled": verdict.lost_signalled,
            "lost_found_at_release": verdict.lost_found_at_release,
            "lock_keys_left": keys_left.len(), "faults": injected,
            "granting_seconds": granting.as_secs(),
        })
    );
    assert!(verdict.examples.is_empty(), "{:#?}", verdict.examples);
    assert_eq!(verdict.overlaps, 0);
    assert_eq!(verdict.token_regressions, 0);
    assert!(verdict.sections > 0, "the workers took locks");
    // Faults make acquisitions time out, find Redis away or end in a restart quarantine; a
    // script never fails.
    assert!(
        verdict.failures.keys().all(|kind| matches!(
            kind.as_str(),
            "timeout" | "redis_unavailable" | "restart_quarantine"
        )),
        "failed acquisitions: {:?}, the first of each kind: {:#?}",
        verdict.failures,
        verdict.failure_details
    );
    assert_eq!(verdict.stuck, 0, "no acquisition outlived its bound");
    assert!(keys_left.is_empty(), "locks left in Redis: {keys_left:?}");
    if seconds >= 60 {
        let wanted = MIN_ACQUISITIONS as f64 * granting.as_secs_f64() / 90.0;
        assert!(
            verdict.sections as f64 >= wanted,
            "a full run makes at least {MIN_ACQUISITIONS} acquisitions per 90 s in which Redis \
             grants locks: {wanted:.0} in {granting:?}"
        );
    }
    assert!(
        injected.values().sum::<usize>() >= (seconds as usize / 10),
        "faults were injected: {injected:?}"
    );
}

/// The checker itself: it must find what it is there to find.
#[test]
fn the_checker_finds_overlaps_token_regressions_and_stuck_waiters() {
    let section = |process, token, start, end, lost| Section {
        process,
        key: "k".into(),
        token,
        asked: start - 10,
        start,
        end,
        lost,
        reason: lost.map(|_| "DataLost".into()),
        release: "ok".into(),
        stalled: 0,
    };
    let clean = [section(0, 1, 100, 200, None), section(1, 2, 210, 300, None)];
    let verdict = check(&clean, &[], 1_000);
    assert_eq!((verdict.overlaps, verdict.token_regressions), (0, 0));

    let overlapping = [section(0, 1, 100, 200, None), section(1, 2, 150, 300, None)];
    assert_eq!(check(&overlapping, &[], 1_000).overlaps, 1);

    // Told at 140 that its lease was lost: a section from 150 on is no violation.
    let told = [
        section(0, 1, 100, 200, Some(140)),
        section(1, 2, 150, 300, None),
    ];
    assert_eq!(check(&told, &[], 1_000).overlaps, 0);
    let told_late = [
        section(0, 1, 100, 200, Some(160)),
        section(1, 2, 150, 300, None),
    ];
    assert_eq!(check(&told_late, &[], 1_000).overlaps, 1);

    // A long section covers several later ones.
    let covering = [
        section(0, 1, 100, 500, None),
        section(1, 2, 150, 160, None),
        section(2, 3, 300, 310, None),
    ];
    assert_eq!(check(&covering, &[], 1_000).overlaps, 2);

    let regressed = [section(0, 5, 100, 200, None), section(1, 4, 210, 300, None)];
    assert_eq!(check(&regressed, &[], 1_000).token_regressions, 1);

    let slow = [section(0, 1, 5_000, 5_100, None)];
    let timed_out = [Failure {
        process: 1,
        key: "k".into(),
        error: "timeout".into(),
        detail: "lock wait timed out".into(),
        asked: 0,
        failed: 9_000,
        stalled: 0,
    }];
    let verdict = check(&slow, &timed_out, 1_000);
    assert_eq!(
        verdict.stuck, 1,
        "the failure waited 9,000 ns for a bound of 1,000"
    );
    assert_eq!(verdict.failures.get("timeout"), Some(&1));
    assert_eq!(
        verdict.failure_details.get("timeout").map(String::as_str),
        Some("lock wait timed out")
    );

    // A wait its runtime was blocked for on purpose has that much more time.
    let stalled = [Failure {
        stalled: 8_500,
        ..timed_out[0].clone()
    }];
    let verdict = check(&[], &stalled, 1_000);
    assert_eq!((verdict.stuck, verdict.stalled), (0, 1));
}

#[test]
fn spans_without_grants_that_overlap_count_once_and_only_within_the_run() {
    let start = Instant::now();
    let at = |millis: u64| start + Duration::from_millis(millis);
    let no_grants = NoGrants {
        spans: vec![
            (at(1_000), at(3_000)),
            (at(2_000), at(4_000)),
            (at(9_000), at(12_000)),
        ],
    };
    // 1..4 s once, not 2 + 2 s; and the last span up to the run's end at 10 s.
    assert_eq!(no_grants.within(start, at(10_000)), Duration::from_secs(4));
    assert_eq!(
        no_grants.within(at(2_500), at(10_000)),
        Duration::from_millis(2_500)
    );
}

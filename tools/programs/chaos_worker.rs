//! One process of the chaos run (`tests/chaos.rs` starts several, each behind its own fault
//! proxy): tasks take a few hot keys and many cold ones in a loop, one task holds slow keys
//! for seconds, and every acquisition is written to a log for the checker.
//!
//! ```text
//! chaos_worker --url URL --log PATH --seconds N [--tasks 8] [--hot 3] [--cold 2000]
//!              [--lease-ms 2000] [--wait-ms 4000] [--quarantine-ms 2000] [--seed N]
//!              [--stall-ms 0] [--cluster | --sentinel MASTER] [--replicas-acked N]
//!              [--group-commit]
//! ```
//!
//! With `--cluster`, the `--url`s (one or more) are seeds of a Redis Cluster; with
//! `--sentinel MASTER`, they are sentinels that name the master `MASTER`; with
//! `--replicas-acked N`, every acquisition waits for N replicas (`min_replicas_acked`);
//! with `--group-commit`, its clients gather the calls that come while one is in flight
//! (`LockClientBuilder::group_commit`).
//!
//! With `--stall-ms`, one more task runs with a client of its own on a runtime of one thread;
//! on SIGUSR1 that thread is blocked for the given time while the task waits for a lock (never
//! while it holds one), as a blocked worker thread would: a grant that lapses meanwhile must
//! not come back as a held lock. Its records carry how long the acquisition was stalled.
//!
//! Each log line is one JSON record, times in nanoseconds of the system's monotonic clock
//! (shared by every process on the machine): an acquisition with its key, fencing token,
//! start and end of the critical section, when its lost signal fired (if it did) and how
//! the release went; or a failed acquisition with its typed error and how long it waited.
//! The last stdout line is a JSON summary.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::signal::unix::SignalKind;
use tokio::sync::Mutex;
use tower_redis_lock::{ErrorKind, LockClient};

/// Keys the first task of each process holds for seconds.
const SLOW_KEYS: usize = 4;

#[derive(Debug, Clone)]
struct Settings {
    /// The server, the seeds of a cluster, or the sentinels.
    urls: Vec<String>,
    cluster: bool,
    /// The master's name, when the `urls` are sentinels.
    sentinel: Option<String>,
    /// Replicas that must acknowledge an acquisition (0: none).
    replicas_acked: u32,
    /// The clients gather their calls (group commit).
    group_commit: bool,
    log: String,
    seconds: u64,
    tasks: usize,
    hot: usize,
    cold: usize,
    lease: Duration,
    wait: Duration,
    /// The client's `lease_limit` (the restart quarantine): at least the lease.
    quarantine: Duration,
    seed: u64,
    /// How long a SIGUSR1 blocks the stalling task's runtime; zero for no such task.
    stall: Duration,
}

fn parse() -> Result<Settings, String> {
    let mut settings = Settings {
        urls: Vec::new(),
        cluster: false,
        sentinel: None,
        replicas_acked: 0,
        group_commit: false,
        log: String::new(),
        seconds: 10,
        tasks: 8,
        hot: 3,
        cold: 2000,
        lease: Duration::from_millis(2000),
        wait: Duration::from_millis(4000),
        quarantine: Duration::from_millis(2000),
        seed: 1,
        stall: Duration::ZERO,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        // The flags without a value.
        match flag.as_str() {
            "--cluster" => {
                settings.cluster = true;
                continue;
            }
            "--group-commit" => {
                settings.group_commit = true;
                continue;
            }
            _ => {}
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|err| format!("{flag}: {err}"));
        match flag.as_str() {
            "--url" => settings.urls.push(value.clone()),
            "--sentinel" => settings.sentinel = Some(value.clone()),
            "--replicas-acked" => settings.replicas_acked = number()? as u32,
            "--log" => settings.log = value.clone(),
            "--seconds" => settings.seconds = number()?,
            "--tasks" => settings.tasks = number()? as usize,
            "--hot" => settings.hot = number()?.max(1) as usize,
            "--cold" => settings.cold = number()?.max(1) as usize,
            "--lease-ms" => settings.lease = Duration::from_millis(number()?),
            "--wait-ms" => settings.wait = Duration::from_millis(number()?),
            "--quarantine-ms" => settings.quarantine = Duration::from_millis(number()?),
            "--seed" => settings.seed = number()?,
            "--stall-ms" => settings.stall = Duration::from_millis(number()?),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if settings.urls.is_empty() || settings.log.is_empty() {
        return Err("--url and --log are required".into());
    }
    Ok(settings)
}

/// Nanoseconds of the monotonic clock, the same in every process of this machine.
fn now_ns() -> i64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("the monotonic clock");
    now.tv_sec() * 1_000_000_000 + now.tv_nsec()
}

fn error_kind(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Timeout => "timeout",
        ErrorKind::RedisUnavailable => "redis_unavailable",
        ErrorKind::Redis => "redis",
        ErrorKind::NotOwner => "not_owner",
        ErrorKind::ShutDown => "shut_down",
        ErrorKind::RestartQuarantine => "restart_quarantine",
        ErrorKind::ReplicasBehind => "replicas_behind",
        _ => "other",
    }
}

/// What the stalling task and the stall share: whether the task is waiting for a lock, and
/// how long its runtime was blocked during the current wait.
#[derive(Debug, Default)]
struct Stall {
    waiting: AtomicBool,
    stalled_ns: AtomicI64,
}

/// One task: acquire, work while watching the lost signal, release; until the deadline.
async fn run_task(
    locks: LockClient,
    settings: Arc<Settings>,
    index: usize,
    deadline: tokio::time::Instant,
    records: Arc<Mutex<Vec<serde_json::Value>>>,
    stall: Option<Arc<Stall>>,
) {
    let mut rng = StdRng::seed_from_u64(settings.seed * 1000 + index as u64);
    let mut mine = Vec::new();
    while tokio::time::Instant::now() < deadline {
        // The first task holds a few slow keys for seconds, past the lease, so the watchdog
        // renews under the faults; the others take hot keys briefly (their waiters queue)
        // and cold ones in passing.
        let (key, work) = if index == 0 {
            (
                format!("slow-{}", rng.random_range(0..SLOW_KEYS)),
                Duration::from_millis(rng.random_range(500..3000)),
            )
        } else if rng.random_bool(0.5) {
            (
                format!("hot-{}", rng.random_range(0..settings.hot)),
                Duration::from_micros(rng.random_range(0..800)),
            )
        } else {
            (
                format!("cold-{}", rng.random_range(0..settings.cold)),
                Duration::ZERO,
            )
        };
        let lock = locks.lock(&key).expect("a valid name");
        let asked = now_ns();
        if let Some(stall) = &stall {
            stall.waiting.store(true, Ordering::SeqCst);
        }
        let acquired = lock.acquire_timeout(settings.wait).await;
        let stalled = stall.as_ref().map_or(0, |stall| {
            stall.waiting.store(false, Ordering::SeqCst);
            stall.stalled_ns.swap(0, Ordering::SeqCst)
        });
        let guard = match acquired {
            Ok(guard) => guard,
            Err(err) => {
                mine.push(json!({
                    "key": key, "error": error_kind(err.kind()), "detail": err.to_string(), "asked": asked,
                    "failed": now_ns(), "stalled": stalled,
                }));
                // As a service would: a moment before the next try when Redis is away.
                if err.kind() == ErrorKind::RedisUnavailable {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let start = now_ns();
        let lost = guard.lost_signal();
        let lost_at = tokio::select! {
            () = tokio::time::sleep(work) => lost.is_lost().then(now_ns),
            _ = lost.lost() => Some(now_ns()),
        };
        let end = now_ns();
        let token = guard.fencing_token();
        let reason = lost.reason().map(|reason| format!("{reason:?}"));
        let release = match guard.release().await {
            Ok(()) => "ok",
            Err(err) => error_kind(err.kind()),
        };
        mine.push(json!({
            "key": key, "token": token, "asked": asked, "start": start, "end": end,
            "lost": lost_at, "reason": reason, "release": release, "stalled": stalled,
        }));
    }
    records.lock().await.extend(mine);
}

/// Runs one more task on a runtime of one thread with a client of its own; each SIGUSR1
/// blocks that thread for `settings.stall` once the task waits for a lock.
fn spawn_stalling_task(
    settings: Arc<Settings>,
    deadline: tokio::time::Instant,
    records: Arc<Mutex<Vec<serde_json::Value>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let locks = client(&settings).await;
            let stall = Arc::new(Stall::default());
            let mut signals = tokio::signal::unix::signal(SignalKind::user_defined1())
                .expect("a SIGUSR1 handler");
            let stalls = stall.clone();
            let length = settings.stall;
            tokio::spawn(async move {
                while signals.recv().await.is_some() {
                    // Only while the task waits: a holder blocked this long could not be told
                    // its lease ran out, which no lock can prevent (fencing tokens are for that).
                    while !stalls.waiting.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    std::thread::sleep(length);
                    stalls
                        .stalled_ns
                        .fetch_add(length.as_nanos() as i64, Ordering::SeqCst);
                }
            });
            let index = settings.tasks;
            run_task(
                locks.clone(),
                settings,
                index,
                deadline,
                records,
                Some(stall),
            )
            .await;
            locks.shutdown().await;
        });
    })
}

/// A client with the run's lease, timeouts and quarantine.
async fn client(settings: &Settings) -> LockClient {
    let builder = match &settings.sentinel {
        Some(master) => LockClient::builder_sentinel(&settings.urls, master),
        None if settings.cluster => LockClient::builder_cluster(&settings.urls),
        None => LockClient::builder(&settings.urls[0]),
    };
    let builder = builder
        .watchdog_lease(settings.lease)
        .renew_interval(settings.lease / 3)
        .command_timeout(Duration::from_millis(500))
        .lease_limit(settings.quarantine.max(settings.lease))
        .group_commit(settings.group_commit);
    let builder = match settings.replicas_acked {
        0 => builder,
        replicas => builder.min_replicas_acked(replicas, Duration::from_millis(500)),
    };
    builder.build().await.expect("the client starts")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let settings = match parse() {
        Ok(settings) => Arc::new(settings),
        Err(err) => {
            eprintln!("chaos_worker: {err}");
            std::process::exit(2);
        }
    };
    let locks = client(&settings).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(settings.seconds);
    let records = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..settings.tasks)
        .map(|index| {
            tokio::spawn(run_task(
                locks.clone(),
                settings.clone(),
                index,
                deadline,
                records.clone(),
                None,
            ))
        })
        .collect();
    let stalling = (!settings.stall.is_zero())
        .then(|| spawn_stalling_task(settings.clone(), deadline, records.clone()));
    for task in tasks {
        task.await.expect("a task panicked");
    }
    if let Some(stalling) = stalling {
        stalling.join().expect("the stalling task panicked");
    }
    let round_trips = locks.round_trips();
    locks.shutdown().await;

    let records = records.lock().await;
    let mut log = std::io::BufWriter::new(std::fs::File::create(&settings.log).expect("log file"));
    for record in records.iter() {
        serde_json::to_writer(&mut log, record).expect("log write");
        log.write_all(b"\n").expect("log write");
    }
    log.flush().expect("log flush");
    let acquired = records.iter().filter(|r| r.get("token").is_some()).count();
    println!(
        "{}",
        json!({
            "pid": std::process::id(),
            "acquired": acquired,
            "failed": records.len() - acquired,
            "round_trips": round_trips,
        })
    );
}

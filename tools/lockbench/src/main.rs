//! Load benchmark: this library against the `rslock` crate and a naive `SET NX` lock, on the
//! same workloads and the same Redis, in one go; and, where nobody waits, against a bare lock
//! that runs the same commands in Redis as this library and nothing else around them.
//!
//! Workloads, each run for every implementation (the bare lock for the uncontended ones only):
//! uncontended (1 and 16 workers, each on its own key) and contended on one key (2, 8 and 32
//! workers), the contended ones both in one process and spread over two. The second process
//! is this binary re-run with `--child`; the parent drives it over its stdin and stdout (JSON
//! lines) and both start their workers at the same wall-clock instant. Inside every critical
//! section a worker increments a counter with a deliberately non-atomic `GET` then `SET` on a
//! plain connection, so a broken mutual exclusion shows up as lost updates as well as
//! overlapping critical sections.
//!
//! Each run reports acquisitions per second, acquire wait and hand-over gap percentiles, how
//! often the same worker re-took the lock, round trips, server commands and the server's own
//! CPU time per acquisition, and the violations. PING probes on the same runtime (at the
//! start, before every run, at the end) give the round trip to read the latencies against.
//!
//! ```text
//! lockbench --redis URL [--seconds 2] [--reps 3] [--only ours,ours-pw,rslock,naive,bare]
//!           [--workload contended-w32-2proc,uncontended-w1,...]
//! lockbench --cluster --redis SEED [--redis SEED ...] [...]
//! ```
//!
//! With `--cluster`, the `--redis` URLs are seeds of a Redis Cluster and only this library
//! runs (the peers lock on one server); each worker's key hashes to its own slot, and the
//! command statistics and CPU times are summed over every master.
//!
//! Use a throw-away Redis (`./scripts/bench.sh` starts one): every run resets the server's
//! command statistics. Human-readable tables go to stderr; stdout carries only JSON lines,
//! one per run, per summary row and per target, so `> results.jsonl` keeps the data.
//! The summary is the median of the repetitions; overlaps and lost updates are summed.
//!
//! Exit codes: 0 done, 1 a mutual-exclusion violation in some run, 2 usage, 3 the benchmark
//! could not run (Redis or the child process failed).

#[path = "../../programs/commandstats.rs"]
mod commandstats;
mod deployment;

use std::collections::BTreeMap;
use std::ops::Range;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tower_redis_lock::{Lock, LockClient, LockGuard};

use crate::deployment::{Control, Deployment, Store};

const USAGE: &str = "usage: lockbench --redis URL [--seconds 2] [--reps 3] \
[--only ours,ours-pw,rslock,naive,bare] [--workload NAME,...]
       lockbench --cluster --redis SEED [--redis SEED ...] [--seconds 2] [--reps 3] \
[--workload NAME,...]
workloads: uncontended-w1 uncontended-w16 contended-w2 contended-w8 contended-w32
           contended-w2-2proc contended-w8-2proc contended-w32-2proc";

/// Workers run this long before the measured window opens: connections, subscriptions and
/// the lock's queues settle first.
const WARM_UP: Duration = Duration::from_millis(500);
/// Time between fixing the schedule and its start: enough for the child to read it.
const LEAD: Duration = Duration::from_millis(100);
/// Lease of the rslock and naive locks; far longer than any critical section here, so an
/// expiry never excuses an overlap.
const LEASE: Duration = Duration::from_secs(10);
/// How often a naive waiter tries `SET NX` again.
const NAIVE_POLL: Duration = Duration::from_millis(10);
/// Sequential PINGs of the probes at the start and the end of the whole benchmark.
const PINGS: usize = 2000;
/// Sequential PINGs of the probe before each run: the yardstick of that run's latencies,
/// taken close to it, as other work on a shared machine moves round trips a lot.
const RUN_PINGS: usize = 500;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return match child_main().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("lockbench child: {err}");
                ExitCode::from(3)
            }
        };
    }
    let settings = match parse(args) {
        Ok(settings) => settings,
        Err(problem) => {
            eprintln!("lockbench: {problem}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match bench(&settings).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("lockbench: mutual-exclusion violations (see overlaps and lost updates)");
            ExitCode::from(1)
        }
        Err(err) => {
            eprintln!("lockbench: {err}");
            ExitCode::from(3)
        }
    }
}

// ---------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------

struct Settings {
    deployment: Deployment,
    seconds: f64,
    reps: usize,
    locks: Vec<Implementation>,
    workloads: Vec<Workload>,
}

fn parse(args: Vec<String>) -> Result<Settings, String> {
    let mut urls = Vec::new();
    let mut cluster = false;
    let mut only = None;
    let mut settings = Settings {
        deployment: Deployment::server(String::new()),
        seconds: 2.0,
        reps: 3,
        locks: Vec::new(),
        workloads: Workload::ALL.to_vec(),
    };
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err("help".into());
        }
        if flag == "--cluster" {
            cluster = true;
            continue;
        }
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--redis" => urls.push(value),
            "--seconds" => settings.seconds = positive_number(&flag, &value)?,
            "--reps" => settings.reps = positive_count(&flag, &value)?,
            "--only" => only = Some(list(&value, Implementation::from_name)?),
            "--workload" => settings.workloads = list(&value, Workload::from_name)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if urls.is_empty() {
        return Err("--redis is required".into());
    }
    if cluster {
        settings.locks = only.unwrap_or(vec![Implementation::Ours]);
        if !settings.locks.iter().all(|lock| lock.is_ours()) {
            return Err("--cluster runs this library only: the peers lock on one server".into());
        }
        settings.deployment = Deployment::cluster(urls);
    } else {
        if urls.len() > 1 {
            return Err("one --redis without --cluster".into());
        }
        settings.locks = only.unwrap_or(Implementation::ALL.to_vec());
        settings.deployment = Deployment::server(urls.remove(0));
    }
    Ok(settings)
}

fn positive_count(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(count) if count > 0 => Ok(count),
        _ => Err(format!(
            "{flag}: expected a positive whole number, got {value:?}"
        )),
    }
}

fn positive_number(flag: &str, value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(number) if number > 0.0 && number.is_finite() => Ok(number),
        _ => Err(format!("{flag}: expected a positive number, got {value:?}")),
    }
}

/// A comma-separated list of names, each known to `lookup`.
fn list<T>(value: &str, lookup: fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    value
        .split(',')
        .map(|name| lookup(name.trim()).ok_or(format!("unknown name {name:?}")))
        .collect()
}

// ---------------------------------------------------------------------------------------
// What is compared, on what
// ---------------------------------------------------------------------------------------

/// A lock implementation the benchmark compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Implementation {
    /// This library: one `LockClient` per process, cloned by its workers.
    Ours,
    /// This library with one `LockClient` per worker, each standing for an instance of a
    /// service (`ours-pw`).
    OursPerWorker,
    /// The `rslock` crate (Redlock on one server): one `LockManager` per process.
    Rslock,
    /// `SET NX PX` polled every 10 ms, compare-and-delete script to release.
    Naive,
    /// The Redis work of this library's uncontended acquire + release and nothing else: the
    /// same 8 commands in two scripts, on one connection per process, with no engine around
    /// them (a taken lock is polled like the naive one, so it runs uncontended only). What it
    /// reaches is the most any lock with this library's guarantees can reach here.
    Bare,
}

impl Implementation {
    const ALL: [Self; 5] = [
        Self::Ours,
        Self::OursPerWorker,
        Self::Rslock,
        Self::Naive,
        Self::Bare,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Ours => "ours",
            Self::OursPerWorker => "ours-pw",
            Self::Rslock => "rslock",
            Self::Naive => "naive",
            Self::Bare => "bare",
        }
    }

    /// Whether it runs `workload`: the bare lock only where nobody waits.
    fn runs(self, workload: &Workload) -> bool {
        self != Self::Bare || !workload.contended
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Commands this lock's scripts run inside Redis: `INFO commandstats` counts them, but no
    /// client sent them. `None` for this library, which counts its own round trips (and whose
    /// scripts change with it).
    fn commands_inside_scripts(self) -> Option<&'static [&'static str]> {
        match self {
            Self::Ours | Self::OursPerWorker => None,
            // Both release with a compare-and-delete script: GET, then DEL on a match.
            Self::Rslock | Self::Naive => Some(&["get", "del"]),
            Self::Bare => Some(&["exists", "hset", "pexpire", "get", "time", "hdel"]),
        }
    }

    /// Whether its round trips are counted at the server: rslock has no counter.
    fn counted_at_server(self) -> bool {
        self == Self::Rslock
    }

    /// Whether it is this library, in either of its two set-ups.
    fn is_ours(self) -> bool {
        matches!(self, Self::Ours | Self::OursPerWorker)
    }

    fn round_trips_counted_by(self) -> &'static str {
        if self.counted_at_server() {
            "server"
        } else {
            "client"
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Workload {
    workers: usize,
    processes: usize,
    contended: bool,
}

impl Workload {
    const ALL: [Self; 8] = [
        Self::new(1, 1, false),
        Self::new(16, 1, false),
        Self::new(2, 1, true),
        Self::new(8, 1, true),
        Self::new(32, 1, true),
        Self::new(2, 2, true),
        Self::new(8, 2, true),
        Self::new(32, 2, true),
    ];

    const fn new(workers: usize, processes: usize, contended: bool) -> Self {
        Self {
            workers,
            processes,
            contended,
        }
    }

    fn name(&self) -> String {
        match (self.contended, self.processes) {
            (false, 1) => format!("uncontended-w{}", self.workers),
            (false, p) => format!("uncontended-w{}-{p}proc", self.workers),
            (true, 1) => format!("contended-w{}", self.workers),
            (true, p) => format!("contended-w{}-{p}proc", self.workers),
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|workload| workload.name() == name)
    }

    /// The global worker numbers that run in `process`.
    fn workers_of(&self, process: usize) -> Range<usize> {
        let share = self.workers / self.processes;
        process * share..(process + 1) * share
    }

    /// Contended workers share key 0; uncontended ones each have their own.
    fn key_of(&self, worker: usize) -> usize {
        if self.contended { 0 } else { worker }
    }

    fn keys(&self) -> usize {
        if self.contended { 1 } else { self.workers }
    }
}

/// One process's part of one run, as the parent hands it to a child.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct RunSpec {
    deployment: Deployment,
    lock: Implementation,
    workload: Workload,
    process: usize,
    /// Prefix of every key of this run; unique, so no run sees another's leftovers.
    tag: String,
}

impl RunSpec {
    fn lock_name(&self, key: usize) -> String {
        format!("{}:k{key}", self.tag)
    }

    fn counter_key(&self, key: usize) -> String {
        format!("{}:counter:k{key}", self.tag)
    }

    fn counter_keys(&self) -> Vec<String> {
        (0..self.workload.keys())
            .map(|key| self.counter_key(key))
            .collect()
    }

    /// The key each process takes once before the run to open its connections.
    fn scratch_name(&self) -> String {
        format!("{}:scratch:p{}", self.tag, self.process)
    }
}

/// When the workers of every process start, when the measured window opens, and when they
/// stop asking for the lock: wall-clock microseconds, the one clock both processes share.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Schedule {
    start_us: i64,
    measure_us: i64,
    stop_us: i64,
}

impl Schedule {
    fn from_now(seconds: f64) -> Self {
        let start_us = now_us() + micros(LEAD);
        let measure_us = start_us + micros(WARM_UP);
        Self {
            start_us,
            measure_us,
            stop_us: measure_us + (seconds * 1e6) as i64,
        }
    }

    fn in_window(&self, at_us: i64) -> bool {
        (self.measure_us..self.stop_us).contains(&at_us)
    }

    fn window_seconds(&self) -> f64 {
        (self.stop_us - self.measure_us) as f64 / 1e6
    }
}

/// One acquisition, timestamped in wall-clock microseconds.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Record {
    process: u32,
    worker: u32,
    key: u32,
    called_us: i64,
    acquired_us: i64,
    release_called_us: i64,
    released_us: i64,
}

/// What one process reports after a run.
#[derive(Debug, Serialize, Deserialize)]
struct ProcessResult {
    records: Vec<Record>,
    /// Round trips the lock sent during the run, when it counts them.
    round_trips: Option<u64>,
    /// Critical sections run (one GET and one SET each): the benchmark's own commands.
    increments: u64,
}

// ---------------------------------------------------------------------------------------
// The locks behind one interface
// ---------------------------------------------------------------------------------------

/// A process's lock machinery, shared by all its workers (or one client each).
enum Backend {
    Ours(LockClient),
    OursPerWorker(Vec<LockClient>),
    Rslock(rslock::LockManager),
    /// The naive lock or the bare one.
    Hand(HandLock),
}

/// One worker's handle on one key.
enum KeyLock {
    Ours(Lock),
    Rslock {
        manager: rslock::LockManager,
        name: String,
    },
    Hand {
        lock: HandLock,
        key: Arc<str>,
    },
}

/// A held lock.
enum Held {
    Ours(LockGuard),
    Rslock(rslock::LockGuard),
    Hand {
        lock: HandLock,
        key: Arc<str>,
        owner: String,
    },
}

impl Backend {
    async fn connect(kind: Implementation, deployment: &Deployment, workers: usize) -> Res<Self> {
        let url = deployment.url();
        Ok(match kind {
            Implementation::Ours => Self::Ours(deployment.lock_client().await?),
            Implementation::OursPerWorker => {
                let mut clients = Vec::with_capacity(workers);
                for _ in 0..workers.max(1) {
                    clients.push(deployment.lock_client().await?);
                }
                Self::OursPerWorker(clients)
            }
            Implementation::Rslock => Self::Rslock(rslock::LockManager::new(vec![url])),
            Implementation::Naive => Self::Hand(HandLock::connect(url, false).await?),
            Implementation::Bare => Self::Hand(HandLock::connect(url, true).await?),
        })
    }

    /// How many clients this process runs: each is warmed up before the run.
    fn clients(&self) -> usize {
        match self {
            Self::OursPerWorker(clients) => clients.len(),
            _ => 1,
        }
    }

    /// The lock on `name` of the process's `worker`-th worker (counted from 0 in this
    /// process).
    fn key_lock(&self, worker: usize, name: &str) -> Res<KeyLock> {
        Ok(match self {
            Self::Ours(client) => KeyLock::Ours(client.lock(name)?),
            Self::OursPerWorker(clients) => {
                KeyLock::Ours(clients[worker % clients.len()].lock(name)?)
            }
            Self::Rslock(manager) => KeyLock::Rslock {
                manager: manager.clone(),
                name: name.to_owned(),
            },
            Self::Hand(lock) => KeyLock::Hand {
                lock: lock.clone(),
                key: name.into(),
            },
        })
    }

    /// Round trips sent so far, for the locks that count them.
    fn round_trips(&self) -> Option<u64> {
        match self {
            Self::Ours(client) => Some(client.round_trips()),
            Self::OursPerWorker(clients) => Some(clients.iter().map(LockClient::round_trips).sum()),
            Self::Rslock(_) => None,
            Self::Hand(lock) => Some(lock.sent.load(Ordering::Relaxed)),
        }
    }

    async fn shutdown(&self) {
        match self {
            Self::Ours(client) => client.shutdown().await,
            Self::OursPerWorker(clients) => {
                for client in clients {
                    client.shutdown().await;
                }
            }
            Self::Rslock(_) | Self::Hand(_) => {}
        }
    }
}

impl KeyLock {
    /// Waits until the lock is held, however long that takes.
    async fn acquire(&self) -> Res<Held> {
        Ok(match self {
            Self::Ours(lock) => Held::Ours(lock.acquire().await?),
            // `acquire` loops over rslock's bounded retries (3 tries, 0-200 ms apart) until
            // it gets the lock.
            Self::Rslock { manager, name } => {
                Held::Rslock(manager.acquire(name.as_str(), LEASE).await?)
            }
            Self::Hand { lock, key } => Held::Hand {
                owner: lock.acquire(key).await?,
                lock: lock.clone(),
                key: key.clone(),
            },
        })
    }
}

impl Held {
    async fn release(self) -> Res<()> {
        match self {
            Self::Ours(guard) => guard.release().await?,
            // Best effort by design: rslock reports nothing.
            Self::Rslock(guard) => guard.release().await,
            Self::Hand { lock, key, owner } => lock.release(&key, &owner).await?,
        }
        Ok(())
    }
}

/// A lock written by hand on one multiplexed connection per process, polled every
/// [`NAIVE_POLL`] while taken: the naive one ([`Implementation::Naive`]: `SET key owner NX PX
/// lease`, and a compare-and-delete script to release) or the bare one
/// ([`Implementation::Bare`]: [`BARE_ACQUIRE`] and [`BARE_RELEASE`]).
#[derive(Clone)]
struct HandLock {
    conn: MultiplexedConnection,
    /// The bare lock's acquire script; the naive lock sends `SET NX` instead.
    bare_acquire: Option<Arc<redis::Script>>,
    release_script: Arc<redis::Script>,
    /// Acquire attempts and release scripts sent: this lock's round trips.
    sent: Arc<AtomicU64>,
    owner_prefix: Arc<str>,
    next_owner: Arc<AtomicU64>,
}

const NAIVE_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
";

/// This library's free-lock acquire and nothing else: its own clock and token functions
/// (`take_free`: `HSET`, `PEXPIRE`, `TIME` and the token counter's `SET … GET`) after one
/// `EXISTS` over the lock, its queue, an epoch key and its marker, each counted as the
/// library counts it. KEYS: the lock, its last granted block, its queue, the epoch key, the
/// token counter (KEYS[5], where `tokens.lua` finds it), the epoch's marker; ARGV: the owner,
/// the lease ms, the token block. Returns the first token, or 0 when the lock is taken or
/// someone queues.
const BARE_ACQUIRE: &str = concat!(
    include_str!("../../../src/wire/lua/clock.lua"),
    include_str!("../../../src/wire/lua/tokens.lua"),
    r"
local seen = redis.call('exists', KEYS[1], KEYS[3], KEYS[4], KEYS[4], KEYS[4],
  KEYS[6], KEYS[6], KEYS[6])
if seen % 3 ~= 0 then
  return 0
end
return take_free(ARGV[1], ARGV[2], tonumber(ARGV[3]))
"
);

/// The command of this library's free-lock release: `HDEL` of the owner and the waiter marks.
const BARE_RELEASE: &str = r"
return redis.call('hdel', KEYS[1], ARGV[1], 'queued', 'queued.2') % 2
";

/// The bare lock's epoch key and its marker: both exist, as they do for this library's
/// clients between restarts of Redis.
const BARE_EPOCH: [&str; 2] = ["lockbench:bare:epoch", "lockbench:bare:epoch:1:10000"];
/// The bare lock's token counter, as this library keeps one per server.
const BARE_TOKENS: &str = "lockbench:bare:tokens";
/// The token block the bare lock reserves: this library's default (one token and 16 local
/// hand-overs).
const BARE_TOKEN_BLOCK: u64 = 17;

impl HandLock {
    /// Connects and loads the scripts, so no run pays for a NOSCRIPT retry.
    async fn connect(url: &str, bare: bool) -> Res<Self> {
        let mut conn = connect(url).await?;
        let release_script = redis::Script::new(if bare { BARE_RELEASE } else { NAIVE_RELEASE });
        release_script
            .prepare_invoke()
            .load_async(&mut conn)
            .await?;
        let bare_acquire = if bare {
            let script = redis::Script::new(BARE_ACQUIRE);
            script.prepare_invoke().load_async(&mut conn).await?;
            for key in BARE_EPOCH {
                let () = redis::cmd("SET")
                    .arg(key)
                    .arg("1 0 10000")
                    .query_async(&mut conn)
                    .await?;
            }
            Some(Arc::new(script))
        } else {
            None
        };
        Ok(Self {
            conn,
            bare_acquire,
            release_script: Arc::new(release_script),
            sent: Arc::default(),
            owner_prefix: format!("{}:{:x}", std::process::id(), rand::random::<u64>()).into(),
            next_owner: Arc::default(),
        })
    }

    /// Tries to take the lock every [`NAIVE_POLL`] until it succeeds; returns the owner id.
    async fn acquire(&self, key: &str) -> Res<String> {
        let owner = format!(
            "{}:{}",
            self.owner_prefix,
            self.next_owner.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = self.conn.clone();
        loop {
            self.sent.fetch_add(1, Ordering::Relaxed);
            let taken = match &self.bare_acquire {
                None => {
                    let reply: redis::Value = redis::cmd("SET")
                        .arg(key)
                        .arg(&owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(LEASE.as_millis() as u64)
                        .query_async(&mut conn)
                        .await?;
                    matches!(reply, redis::Value::Okay)
                }
                Some(script) => {
                    let first_token: u64 = script
                        .key(key)
                        .key(format!("{key}:fence"))
                        .key(format!("{key}:queue"))
                        .key(BARE_EPOCH[0])
                        .key(BARE_TOKENS)
                        .key(BARE_EPOCH[1])
                        .arg(&owner)
                        .arg(LEASE.as_millis() as u64)
                        .arg(BARE_TOKEN_BLOCK)
                        .invoke_async(&mut conn)
                        .await?;
                    first_token > 0
                }
            };
            if taken {
                return Ok(owner);
            }
            tokio::time::sleep(NAIVE_POLL).await;
        }
    }

    async fn release(&self, key: &str, owner: &str) -> Res<()> {
        self.sent.fetch_add(1, Ordering::Relaxed);
        let released: i64 = self
            .release_script
            .key(key)
            .arg(owner)
            .invoke_async(&mut self.conn.clone())
            .await?;
        if released != 1 {
            return Err(format!("{key}: released a lock it no longer held").into());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// One process's part of a run (the parent's and every child's)
// ---------------------------------------------------------------------------------------

/// The critical section's own connection, apart from the lock's: a plain read-modify-write
/// whose lost updates betray two holders at once.
#[derive(Clone)]
struct CriticalSection {
    conn: Store,
    increments: Arc<AtomicU64>,
}

impl CriticalSection {
    async fn connect(deployment: &Deployment) -> Res<Self> {
        Ok(Self {
            conn: deployment.store().await?,
            increments: Arc::default(),
        })
    }

    /// `GET` then `SET value+1`, deliberately not atomic.
    async fn increment(&self, counter: &str) -> Res<()> {
        let mut conn = self.conn.clone();
        let value: Option<u64> = conn.query(redis::cmd("GET").arg(counter)).await?;
        let () = conn
            .query(redis::cmd("SET").arg(counter).arg(value.unwrap_or(0) + 1))
            .await?;
        self.increments.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A process ready to run: connected, connections warm, waiting for the schedule.
struct Prepared {
    spec: RunSpec,
    backend: Backend,
    section: CriticalSection,
}

/// Connects everything and takes a scratch lock once with every client, so connection
/// set-up happens before the server's statistics are reset and stays out of the figures.
async fn prepare(spec: RunSpec) -> Res<Prepared> {
    let workers = spec.workload.workers_of(spec.process).len();
    let backend = Backend::connect(spec.lock, &spec.deployment, workers).await?;
    let section = CriticalSection::connect(&spec.deployment).await?;
    for client in 0..backend.clients() {
        backend
            .key_lock(client, &spec.scratch_name())?
            .acquire()
            .await?
            .release()
            .await?;
    }
    Ok(Prepared {
        spec,
        backend,
        section,
    })
}

/// Runs this process's workers on `schedule` and reports what they did.
async fn execute(prepared: Prepared, schedule: Schedule) -> Res<ProcessResult> {
    let Prepared {
        spec,
        backend,
        section,
    } = prepared;
    warn_if_late(spec.process, schedule);
    let round_trips_before = backend.round_trips();
    let mut workers = Vec::new();
    for (index, worker) in spec.workload.workers_of(spec.process).enumerate() {
        let key = spec.workload.key_of(worker);
        let plan = WorkerPlan {
            process: spec.process as u32,
            worker: worker as u32,
            key: key as u32,
            lock: backend.key_lock(index, &spec.lock_name(key))?,
            counter: spec.counter_key(key),
        };
        workers.push(tokio::spawn(run_worker(plan, section.clone(), schedule)));
    }
    let mut records = Vec::new();
    for worker in workers {
        records.extend(worker.await??);
    }
    let round_trips = backend
        .round_trips()
        .zip(round_trips_before)
        .map(|(after, before)| after - before);
    backend.shutdown().await;
    Ok(ProcessResult {
        records,
        round_trips,
        increments: section.increments.load(Ordering::Relaxed),
    })
}

/// The barrier is a wall-clock instant; a process that learns it too late starts late, and
/// the run is then not the simultaneous start it claims to be.
fn warn_if_late(process: usize, schedule: Schedule) {
    let late_us = now_us() - schedule.start_us;
    if late_us > 0 {
        eprintln!("warning: process {process} got the schedule {late_us} µs after the start");
    }
}

struct WorkerPlan {
    process: u32,
    worker: u32,
    key: u32,
    lock: KeyLock,
    counter: String,
}

/// Acquire, critical section, release, in a tight loop from the schedule's start until its
/// stop. An acquisition under way at the stop still completes: it counts for the correctness
/// checks and the per-acquisition command counts, not for the window's rates and latencies.
async fn run_worker(
    plan: WorkerPlan,
    section: CriticalSection,
    schedule: Schedule,
) -> Res<Vec<Record>> {
    sleep_until(schedule.start_us).await;
    let mut records = Vec::new();
    loop {
        let called_us = now_us();
        if called_us >= schedule.stop_us {
            return Ok(records);
        }
        let held = plan.lock.acquire().await?;
        let acquired_us = now_us();
        section.increment(&plan.counter).await?;
        let release_called_us = now_us();
        held.release().await?;
        records.push(Record {
            process: plan.process,
            worker: plan.worker,
            key: plan.key,
            called_us,
            acquired_us,
            release_called_us,
            released_us: now_us(),
        });
    }
}

// ---------------------------------------------------------------------------------------
// The second process
// ---------------------------------------------------------------------------------------

/// Parent to child, one JSON line each.
#[derive(Serialize, Deserialize)]
enum ToChild {
    Prepare(RunSpec),
    Go(Schedule),
}

/// Child to parent, one JSON line each.
#[derive(Serialize, Deserialize)]
enum FromChild {
    Ready,
    Done(ProcessResult),
}

/// The child's side: prepare, say ready, wait for the schedule, run, report.
async fn child_main() -> Res<()> {
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut output = tokio::io::stdout();
    let ToChild::Prepare(spec) = read_message(&mut input).await? else {
        return Err("expected Prepare first".into());
    };
    let prepared = prepare(spec).await?;
    write_message(&mut output, &FromChild::Ready).await?;
    let ToChild::Go(schedule) = read_message(&mut input).await? else {
        return Err("expected Go after Prepare".into());
    };
    let result = execute(prepared, schedule).await?;
    write_message(&mut output, &FromChild::Done(result)).await
}

/// The parent's handle on a child process; the child is killed if this is dropped early.
struct ChildProcess {
    process: Child,
    input: ChildStdin,
    output: Lines<BufReader<ChildStdout>>,
}

impl ChildProcess {
    /// Starts this binary again with `--child` and hands it its part of the run.
    async fn start(spec: RunSpec) -> Res<Self> {
        let mut process = tokio::process::Command::new(std::env::current_exe()?)
            .arg("--child")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let input = process.stdin.take().ok_or("child has no stdin")?;
        let output = BufReader::new(process.stdout.take().ok_or("child has no stdout")?).lines();
        let mut child = Self {
            process,
            input,
            output,
        };
        write_message(&mut child.input, &ToChild::Prepare(spec)).await?;
        Ok(child)
    }

    async fn ready(&mut self) -> Res<()> {
        match read_message(&mut self.output).await? {
            FromChild::Ready => Ok(()),
            FromChild::Done(_) => Err("child finished before it was ready".into()),
        }
    }

    async fn go(&mut self, schedule: Schedule) -> Res<()> {
        write_message(&mut self.input, &ToChild::Go(schedule)).await
    }

    async fn finish(mut self) -> Res<ProcessResult> {
        let FromChild::Done(result) = read_message(&mut self.output).await? else {
            return Err("child said Ready twice".into());
        };
        let status = self.process.wait().await?;
        if !status.success() {
            return Err(format!("child exited with {status}").into());
        }
        Ok(result)
    }
}

async fn read_message<T, R>(lines: &mut Lines<R>) -> Res<T>
where
    T: serde::de::DeserializeOwned,
    R: tokio::io::AsyncBufRead + Unpin,
{
    let line = lines
        .next_line()
        .await?
        .ok_or("the other process closed the pipe")?;
    Ok(serde_json::from_str(&line)?)
}

async fn write_message<T: Serialize>(
    writer: &mut (impl tokio::io::AsyncWrite + Unpin),
    message: &T,
) -> Res<()> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    writer.write_all(&line).await?;
    writer.flush().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The parent: runs, server statistics, figures
// ---------------------------------------------------------------------------------------

/// PING round trips from this runtime: the yardstick every latency is read against.
#[derive(Clone, Copy, Debug)]
struct Ping {
    p50_us: f64,
    p99_us: f64,
}

/// `pings` sequential PINGs on one multiplexed connection, after a tenth as many uncounted
/// ones: the first round trips of a fresh connection and runtime run slow.
async fn ping_probe(conn: &mut MultiplexedConnection, pings: usize) -> Res<Ping> {
    for _ in 0..pings / 10 {
        let _: String = redis::cmd("PING").query_async(conn).await?;
    }
    let mut samples = Vec::with_capacity(pings);
    for _ in 0..pings {
        let sent = Instant::now();
        let _: String = redis::cmd("PING").query_async(conn).await?;
        samples.push(sent.elapsed().as_nanos() as i64);
    }
    samples.sort_unstable();
    let us = |p| percentile(&samples, p).unwrap_or(0.0) / 1000.0;
    Ok(Ping {
        p50_us: us(50),
        p99_us: us(99),
    })
}

struct RunReport {
    lock: Implementation,
    workload: Workload,
    rep: usize,
    figures: Figures,
}

/// The whole benchmark; `Ok(false)` when some run broke mutual exclusion.
async fn bench(settings: &Settings) -> Res<bool> {
    let mut control = settings.deployment.control().await?;
    let where_ = if settings.deployment.is_cluster() {
        format!("a Redis Cluster of {} masters", control.masters())
    } else {
        "one Redis server".to_owned()
    };
    emit(json!({"deployment": where_}));
    let ping = ping_probe(&mut control.probe, PINGS).await?;
    eprintln!(
        "on {where_}; PING round trip (start): p50 {:.1} µs, p99 {:.1} µs; load average {}",
        ping.p50_us,
        ping.p99_us,
        load_average()
    );
    let nonce = now_us();
    let mut reports = Vec::new();
    for rep in 1..=settings.reps {
        for workload in &settings.workloads {
            print_run_header(rep, settings.reps, workload);
            for &lock in settings.locks.iter().filter(|lock| lock.runs(workload)) {
                let tag = format!(
                    "lockbench:{nonce}:r{rep}:{}:{}",
                    lock.name(),
                    workload.name()
                );
                let figures = run_once(settings, &mut control, lock, *workload, tag).await?;
                let report = RunReport {
                    lock,
                    workload: *workload,
                    rep,
                    figures,
                };
                print_row(lock.name(), &report.figures, lock);
                emit(run_json(&report));
                reports.push(report);
            }
        }
    }
    let ping_end = ping_probe(&mut control.probe, PINGS).await?;
    let rows = summarise(&reports);
    print_summary(&rows, ping, ping_end);
    for target in targets(&rows, ping) {
        print_target(&target);
        emit(target_json(&target));
    }
    Ok(reports
        .iter()
        .all(|report| report.figures.overlaps + report.figures.lost_updates == 0))
}

/// One run of one implementation on one workload, over as many processes as it asks for.
async fn run_once(
    settings: &Settings,
    control: &mut Control,
    lock: Implementation,
    workload: Workload,
    tag: String,
) -> Res<Figures> {
    let spec = |process| RunSpec {
        deployment: settings.deployment.clone(),
        lock,
        workload,
        process,
        tag: tag.clone(),
    };
    let mut children = Vec::new();
    for process in 1..workload.processes {
        children.push(ChildProcess::start(spec(process)).await?);
    }
    let prepared = prepare(spec(0)).await?;
    for child in &mut children {
        child.ready().await?;
    }
    let ping = ping_probe(&mut control.probe, RUN_PINGS).await?;
    control.reset_stats().await?;
    let cpu_before = control.cpu_seconds().await?;
    let schedule = Schedule::from_now(settings.seconds);
    for child in &mut children {
        child.go(schedule).await?;
    }
    let mut results = vec![execute(prepared, schedule).await?];
    for child in children {
        results.push(child.finish().await?);
    }
    let cpu_used = control.cpu_seconds().await? - cpu_before;
    let calls = control.command_calls().await?;
    let counters = control.take_counters(&spec(0).counter_keys()).await?;
    let mut figures = analyse(&schedule, &results, &counters);
    count_commands(&mut figures, lock, &results, &calls);
    figures.server_cpu_us_per_acq = Some(cpu_used * 1e6 / figures.acquisitions_total.max(1.0));
    figures.ping_p50_us = ping.p50_us;
    figures.ping_p99_us = ping.p99_us;
    Ok(figures)
}

// ---------------------------------------------------------------------------------------
// Figures of one run
// ---------------------------------------------------------------------------------------

/// Everything measured in one run (or, in the summary, the median over repetitions).
/// Latencies in µs; `None` where there was nothing to measure.
#[derive(Clone, Debug, Default)]
struct Figures {
    /// Acquisitions returned inside the measured window.
    acquisitions: f64,
    /// Every acquisition of the run, warm-up and drain included.
    acquisitions_total: f64,
    acq_per_s: f64,
    wait_p50_us: Option<f64>,
    wait_p99_us: Option<f64>,
    /// The longest wait that overlapped the window, including waits that only ended after
    /// the stop: percentiles over granted acquisitions hide a starved waiter, this does not.
    wait_max_us: Option<f64>,
    gap_p50_us: Option<f64>,
    gap_p99_us: Option<f64>,
    gap_change_p50_us: Option<f64>,
    gap_change_p99_us: Option<f64>,
    gap_xproc_p50_us: Option<f64>,
    gap_xproc_p99_us: Option<f64>,
    acq_release_p50_us: Option<f64>,
    acq_release_p99_us: Option<f64>,
    same_worker_share: Option<f64>,
    round_trips_per_acq: Option<f64>,
    server_cmds_per_acq: Option<f64>,
    /// Redis's CPU time (kernel included, every master) per acquisition of the whole run:
    /// the work a lock leaves to the server a fleet shares. It includes the critical
    /// section's GET and SET, which every lock pays alike.
    server_cpu_us_per_acq: Option<f64>,
    overlaps: u64,
    lost_updates: u64,
    /// The PING probe taken just before the run.
    ping_p50_us: f64,
    ping_p99_us: f64,
}

/// Timing and correctness figures from the records of every process.
fn analyse(schedule: &Schedule, results: &[ProcessResult], counters: &[u64]) -> Figures {
    let per_key = records_by_key(results, counters.len());
    let measured: Vec<&Record> = per_key
        .iter()
        .flatten()
        .filter(|record| schedule.in_window(record.acquired_us))
        .collect();
    let waits = sorted(measured.iter().map(|r| r.acquired_us - r.called_us));
    let acq_release = sorted(
        measured
            .iter()
            .map(|r| (r.acquired_us - r.called_us) + (r.released_us - r.release_called_us)),
    );
    let handoffs = handoffs(&per_key, schedule);
    Figures {
        acquisitions: measured.len() as f64,
        acquisitions_total: per_key.iter().map(Vec::len).sum::<usize>() as f64,
        acq_per_s: measured.len() as f64 / schedule.window_seconds(),
        wait_p50_us: percentile(&waits, 50),
        wait_p99_us: percentile(&waits, 99),
        wait_max_us: longest_wait(&per_key, schedule),
        gap_p50_us: percentile(&handoffs.all, 50),
        gap_p99_us: percentile(&handoffs.all, 99),
        gap_change_p50_us: percentile(&handoffs.worker_change, 50),
        gap_change_p99_us: percentile(&handoffs.worker_change, 99),
        gap_xproc_p50_us: percentile(&handoffs.process_change, 50),
        gap_xproc_p99_us: percentile(&handoffs.process_change, 99),
        acq_release_p50_us: percentile(&acq_release, 50),
        acq_release_p99_us: percentile(&acq_release, 99),
        same_worker_share: handoffs.same_worker_share(),
        overlaps: overlaps(&per_key),
        lost_updates: lost_updates(&per_key, counters),
        ..Figures::default()
    }
}

/// Every process's records, grouped by key, each key's in the order the lock was granted.
fn records_by_key(results: &[ProcessResult], keys: usize) -> Vec<Vec<Record>> {
    let mut per_key = vec![Vec::new(); keys];
    for record in results.iter().flat_map(|result| &result.records) {
        per_key[record.key as usize].push(*record);
    }
    for records in &mut per_key {
        records.sort_by_key(|record| record.acquired_us);
    }
    per_key
}

fn longest_wait(per_key: &[Vec<Record>], schedule: &Schedule) -> Option<f64> {
    per_key
        .iter()
        .flatten()
        .filter(|r| r.called_us < schedule.stop_us && r.acquired_us >= schedule.measure_us)
        .map(|r| (r.acquired_us - r.called_us) as f64)
        .reduce(f64::max)
}

/// Gaps between one holder's release returning and the next holder's acquire returning,
/// signed: the next grant may reach its holder before the releaser sees its own reply.
struct Handoffs {
    all: Vec<i64>,
    worker_change: Vec<i64>,
    process_change: Vec<i64>,
    same_worker: usize,
}

impl Handoffs {
    fn same_worker_share(&self) -> Option<f64> {
        (!self.all.is_empty()).then(|| self.same_worker as f64 / self.all.len() as f64)
    }
}

/// The hand-overs whose receiving acquisition falls in the measured window.
fn handoffs(per_key: &[Vec<Record>], schedule: &Schedule) -> Handoffs {
    let mut handoffs = Handoffs {
        all: Vec::new(),
        worker_change: Vec::new(),
        process_change: Vec::new(),
        same_worker: 0,
    };
    for pair in per_key.iter().flat_map(|records| records.windows(2)) {
        let (previous, next) = (&pair[0], &pair[1]);
        if !schedule.in_window(next.acquired_us) {
            continue;
        }
        let gap = next.acquired_us - previous.released_us;
        handoffs.all.push(gap);
        if next.worker == previous.worker {
            handoffs.same_worker += 1;
        } else {
            handoffs.worker_change.push(gap);
        }
        if next.process != previous.process {
            handoffs.process_change.push(gap);
        }
    }
    for gaps in [
        &mut handoffs.all,
        &mut handoffs.worker_change,
        &mut handoffs.process_change,
    ] {
        gaps.sort_unstable();
    }
    handoffs
}

/// Critical sections of one key that overlap: [acquire returned, release called] lies inside
/// the real holding, so any overlap of these intervals is a real double grant.
fn overlaps(per_key: &[Vec<Record>]) -> u64 {
    let mut overlaps = 0;
    for records in per_key {
        let mut latest_end = i64::MIN;
        for record in records {
            if record.acquired_us < latest_end {
                overlaps += 1;
            }
            latest_end = latest_end.max(record.release_called_us);
        }
    }
    overlaps
}

/// Increments the counters lack: critical sections whose GET/SET raced another holder's.
fn lost_updates(per_key: &[Vec<Record>], counters: &[u64]) -> u64 {
    per_key
        .iter()
        .zip(counters)
        .map(|(records, &counter)| (records.len() as u64).saturating_sub(counter))
        .sum()
}

/// Round trips and server commands per acquisition, over the whole run (warm-up and drain
/// included, as the server's statistics are): the benchmark's own commands are taken out.
fn count_commands(
    figures: &mut Figures,
    lock: Implementation,
    results: &[ProcessResult],
    calls: &BTreeMap<String, u64>,
) {
    let acquisitions = figures.acquisitions_total.max(1.0);
    let increments = results.iter().map(|result| result.increments).sum();
    let lock_calls = lock_calls(calls, increments);
    let server_total: u64 = lock_calls.values().sum();
    figures.server_cmds_per_acq = Some(server_total as f64 / acquisitions);
    let from_server = lock
        .commands_inside_scripts()
        .map(|inside| sent_outside_scripts(&lock_calls, inside));
    let from_client: Option<u64> = results.iter().map(|result| result.round_trips).sum();
    if let (Some(client), Some(server)) = (from_client, from_server) {
        warn_if_counts_disagree(lock, client, server);
    }
    let sent = if lock.counted_at_server() {
        from_server
    } else {
        from_client
    };
    figures.round_trips_per_acq = sent.map(|sent| sent as f64 / acquisitions);
}

/// The lock's share of the server's calls: without the critical sections' GET and SET, and
/// without the benchmark's CONFIG RESETSTAT and INFO (no lock sends those).
fn lock_calls(calls: &BTreeMap<String, u64>, increments: u64) -> BTreeMap<String, u64> {
    calls
        .iter()
        .filter(|(name, _)| !name.starts_with("config") && name.as_str() != "info")
        .map(|(name, &count)| {
            let own = if name == "get" || name == "set" {
                increments
            } else {
                0
            };
            (name.clone(), count.saturating_sub(own))
        })
        .collect()
}

/// Commands clients sent: everything but what the lock's scripts ran inside Redis.
fn sent_outside_scripts(lock_calls: &BTreeMap<String, u64>, inside: &[&str]) -> u64 {
    lock_calls
        .iter()
        .filter(|(name, _)| !inside.contains(&name.as_str()))
        .map(|(_, count)| count)
        .sum()
}

/// The naive lock is counted both ways: if the two counts part, the server-side count used
/// for rslock cannot be trusted either.
fn warn_if_counts_disagree(lock: Implementation, client: u64, server: u64) {
    if client.abs_diff(server) > 2 + client / 100 {
        eprintln!(
            "warning: {} round trips: {client} counted in the client, {server} at the server",
            lock.name()
        );
    }
}

// ---------------------------------------------------------------------------------------
// Summary and targets
// ---------------------------------------------------------------------------------------

struct SummaryRow {
    lock: Implementation,
    workload: Workload,
    reps: usize,
    figures: Figures,
}

/// Per (lock, workload), in the order they ran: the median of each figure over the
/// repetitions; overlaps and lost updates summed, so no violation hides behind a median.
fn summarise(reports: &[RunReport]) -> Vec<SummaryRow> {
    let mut rows: Vec<SummaryRow> = Vec::new();
    for report in reports {
        if rows
            .iter()
            .any(|row| row.lock == report.lock && row.workload == report.workload)
        {
            continue;
        }
        let reps: Vec<&Figures> = reports
            .iter()
            .filter(|other| other.lock == report.lock && other.workload == report.workload)
            .map(|other| &other.figures)
            .collect();
        rows.push(SummaryRow {
            lock: report.lock,
            workload: report.workload,
            reps: reps.len(),
            figures: median_figures(&reps),
        });
    }
    rows
}

fn median_figures(reps: &[&Figures]) -> Figures {
    let m = |field: fn(&Figures) -> Option<f64>| median(reps.iter().filter_map(|f| field(f)));
    Figures {
        acquisitions: m(|f| Some(f.acquisitions)).unwrap_or_default(),
        acquisitions_total: m(|f| Some(f.acquisitions_total)).unwrap_or_default(),
        acq_per_s: m(|f| Some(f.acq_per_s)).unwrap_or_default(),
        wait_p50_us: m(|f| f.wait_p50_us),
        wait_p99_us: m(|f| f.wait_p99_us),
        wait_max_us: m(|f| f.wait_max_us),
        gap_p50_us: m(|f| f.gap_p50_us),
        gap_p99_us: m(|f| f.gap_p99_us),
        gap_change_p50_us: m(|f| f.gap_change_p50_us),
        gap_change_p99_us: m(|f| f.gap_change_p99_us),
        gap_xproc_p50_us: m(|f| f.gap_xproc_p50_us),
        gap_xproc_p99_us: m(|f| f.gap_xproc_p99_us),
        acq_release_p50_us: m(|f| f.acq_release_p50_us),
        acq_release_p99_us: m(|f| f.acq_release_p99_us),
        same_worker_share: m(|f| f.same_worker_share),
        round_trips_per_acq: m(|f| f.round_trips_per_acq),
        server_cmds_per_acq: m(|f| f.server_cmds_per_acq),
        server_cpu_us_per_acq: m(|f| f.server_cpu_us_per_acq),
        overlaps: reps.iter().map(|f| f.overlaps).sum(),
        lost_updates: reps.iter().map(|f| f.lost_updates).sum(),
        ping_p50_us: m(|f| Some(f.ping_p50_us)).unwrap_or_default(),
        ping_p99_us: m(|f| Some(f.ping_p99_us)).unwrap_or_default(),
    }
}

/// A goal for this library, checked against the summary.
struct Target {
    name: &'static str,
    workload: String,
    /// What the goal is read on: a ratio, or a plain figure.
    measured: Option<f64>,
    /// `<= limit` or `>= limit`; `None` for a figure only reported.
    limit: Option<(Comparison, f64)>,
    detail: String,
}

#[derive(Clone, Copy)]
enum Comparison {
    AtMost,
    AtLeast,
}

impl Target {
    /// `None` when a figure is missing (a filtered run) or the target is informational.
    fn met(&self) -> Option<bool> {
        let (comparison, limit) = self.limit?;
        let measured = self.measured?;
        Some(match comparison {
            Comparison::AtMost => measured <= limit,
            Comparison::AtLeast => measured >= limit,
        })
    }
}

/// A figure of one summary row.
fn figure(
    rows: &[SummaryRow],
    lock: Implementation,
    workload: Workload,
    field: fn(&Figures) -> Option<f64>,
) -> Option<f64> {
    rows.iter()
        .find(|row| row.lock == lock && row.workload == workload)
        .and_then(|row| field(&row.figures))
}

/// The better of rslock and naive on a figure: the lower when `lower_is_better`.
fn best_other(
    rows: &[SummaryRow],
    workload: Workload,
    field: fn(&Figures) -> Option<f64>,
    lower_is_better: bool,
) -> Option<f64> {
    let others = [Implementation::Rslock, Implementation::Naive]
        .into_iter()
        .filter_map(|lock| figure(rows, lock, workload, field));
    if lower_is_better {
        others.reduce(f64::min)
    } else {
        others.reduce(f64::max)
    }
}

fn ratio(ours: Option<f64>, reference: Option<f64>) -> Option<f64> {
    Some(ours? / reference?)
}

fn targets(rows: &[SummaryRow], ping: Ping) -> Vec<Target> {
    let mut targets = Vec::new();
    let w32_2proc = Workload::new(32, 2, true);
    targets.push(wait_target(rows, w32_2proc));
    targets.push(retake_target(rows, w32_2proc));
    for workload in Workload::ALL
        .iter()
        .filter(|w| w.contended && w.processes > 1)
    {
        targets.push(gap_target(rows, *workload, ping));
    }
    for workload in Workload::ALL.iter().filter(|w| w.contended) {
        targets.push(round_trip_target(rows, *workload));
    }
    targets.push(contended_throughput_target(
        rows,
        Workload::new(32, 1, true),
    ));
    for lock in [Implementation::Ours, Implementation::OursPerWorker] {
        if lock == Implementation::OursPerWorker && !rows.iter().any(|row| row.lock == lock) {
            continue;
        }
        targets.push(uncontended_throughput_target(
            rows,
            lock,
            Workload::new(16, 1, false),
        ));
        targets.push(uncontended_latency_target(
            rows,
            lock,
            Workload::new(1, 1, false),
        ));
    }
    targets.push(server_cpu_report(rows, Workload::new(16, 1, false)));
    targets.push(bare_ceiling_report(rows, Workload::new(16, 1, false)));
    targets
        .into_iter()
        .filter(|target| {
            rows.iter()
                .any(|row| row.workload.name() == target.workload)
        })
        .collect()
}

fn wait_target(rows: &[SummaryRow], workload: Workload) -> Target {
    let field = |f: &Figures| f.wait_p99_us;
    let ours = figure(rows, Implementation::Ours, workload, field);
    let other = best_other(rows, workload, field, true);
    Target {
        name: "p99 wait <= 1/50 of the better of rslock and naive",
        workload: workload.name(),
        measured: ratio(ours, other),
        limit: Some((Comparison::AtMost, 1.0 / 50.0)),
        detail: format!("ours {} µs, better other {} µs", us(ours), us(other)),
    }
}

fn retake_target(rows: &[SummaryRow], workload: Workload) -> Target {
    let share = figure(rows, Implementation::Ours, workload, |f| {
        f.same_worker_share
    });
    Target {
        name: "same-worker re-take share (reported; 2/W for comparison)",
        workload: workload.name(),
        measured: share,
        limit: None,
        detail: format!(
            "ours {}, 2/W = {:.3}",
            fixed(share, 3),
            2.0 / workload.workers as f64
        ),
    }
}

/// Read against the PING probes taken just before this library's runs of the workload (the
/// median over the repetitions); the probe at the start of the benchmark is shown too.
fn gap_target(rows: &[SummaryRow], workload: Workload, start: Ping) -> Target {
    let gap = figure(rows, Implementation::Ours, workload, |f| {
        f.gap_change_p50_us
    });
    let across = figure(rows, Implementation::Ours, workload, |f| f.gap_xproc_p50_us);
    let ping = figure(rows, Implementation::Ours, workload, |f| {
        Some(f.ping_p50_us)
    });
    Target {
        name: "hand-over gap p50 on worker changes <= 1.5 x PING p50",
        workload: workload.name(),
        measured: ratio(gap, ping),
        limit: Some((Comparison::AtMost, 1.5)),
        detail: format!(
            "ours {} µs (between processes only: {} µs), PING p50 before these runs {} µs \
             (at the start: {:.1} µs)",
            us(gap),
            us(across),
            fixed(ping, 1),
            start.p50_us
        ),
    }
}

fn round_trip_target(rows: &[SummaryRow], workload: Workload) -> Target {
    let round_trips = figure(rows, Implementation::Ours, workload, |f| {
        f.round_trips_per_acq
    });
    Target {
        name: "round trips per contended acquisition <= 2.2",
        workload: workload.name(),
        measured: round_trips,
        limit: Some((Comparison::AtMost, 2.2)),
        detail: format!("ours {}", fixed(round_trips, 2)),
    }
}

fn contended_throughput_target(rows: &[SummaryRow], workload: Workload) -> Target {
    let field = |f: &Figures| Some(f.acq_per_s);
    let ours = figure(rows, Implementation::Ours, workload, field);
    let other = best_other(rows, workload, field, false);
    Target {
        name: "acquisitions/s >= 5 x the better of rslock and naive",
        workload: workload.name(),
        measured: ratio(ours, other),
        limit: Some((Comparison::AtLeast, 5.0)),
        detail: format!(
            "ours {}/s, better other {}/s",
            fixed(ours, 0),
            fixed(other, 0)
        ),
    }
}

fn uncontended_throughput_target(
    rows: &[SummaryRow],
    lock: Implementation,
    workload: Workload,
) -> Target {
    let field = |f: &Figures| Some(f.acq_per_s);
    let ours = figure(rows, lock, workload, field);
    let rslock = figure(rows, Implementation::Rslock, workload, field);
    Target {
        name: if lock == Implementation::Ours {
            "acquisitions/s >= 1.0 x rslock"
        } else {
            "acquisitions/s >= 1.0 x rslock, one client per worker"
        },
        workload: workload.name(),
        measured: ratio(ours, rslock),
        limit: Some((Comparison::AtLeast, 1.0)),
        detail: format!("ours {}/s, rslock {}/s", fixed(ours, 0), fixed(rslock, 0)),
    }
}

/// The work inside Redis per acquisition against rslock's, reported: at W=16 the server is
/// busy, so its own CPU per acquisition is what a fleet of instances shares.
fn server_cpu_report(rows: &[SummaryRow], workload: Workload) -> Target {
    let field = |f: &Figures| f.server_cpu_us_per_acq;
    let ours = figure(rows, Implementation::Ours, workload, field);
    let rslock = figure(rows, Implementation::Rslock, workload, field);
    Target {
        name: "Redis CPU per acquisition against rslock (reported)",
        workload: workload.name(),
        measured: ratio(ours, rslock),
        limit: None,
        detail: format!("ours {} µs, rslock {} µs", fixed(ours, 1), fixed(rslock, 1)),
    }
}

/// The bare lock against rslock, reported: the most a lock that runs this library's commands
/// can reach, engine aside; ours is shown beside it.
fn bare_ceiling_report(rows: &[SummaryRow], workload: Workload) -> Target {
    let rate = |lock| figure(rows, lock, workload, |f: &Figures| Some(f.acq_per_s));
    let (ours, bare, rslock) = (
        rate(Implementation::Ours),
        rate(Implementation::Bare),
        rate(Implementation::Rslock),
    );
    Target {
        name: "acquisitions/s of the bare lock (the same commands) against rslock (reported)",
        workload: workload.name(),
        measured: ratio(bare, rslock),
        limit: None,
        detail: format!(
            "bare {}/s, rslock {}/s; ours {}/s, {} of bare",
            fixed(bare, 0),
            fixed(rslock, 0),
            fixed(ours, 0),
            fixed(ratio(ours, bare), 3)
        ),
    }
}

fn uncontended_latency_target(
    rows: &[SummaryRow],
    lock: Implementation,
    workload: Workload,
) -> Target {
    let field = |f: &Figures| f.acq_release_p50_us;
    let ours = figure(rows, lock, workload, field);
    let rslock = figure(rows, Implementation::Rslock, workload, field);
    Target {
        name: if lock == Implementation::Ours {
            "acquire+release p50 <= 1.0 x rslock"
        } else {
            "acquire+release p50 <= 1.0 x rslock, one client per worker"
        },
        workload: workload.name(),
        measured: ratio(ours, rslock),
        limit: Some((Comparison::AtMost, 1.0)),
        detail: format!("ours {} µs, rslock {} µs", us(ours), us(rslock)),
    }
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

const COLUMNS: [(&str, usize); 18] = [
    ("acq/s", 9),
    ("wait50", 8),
    ("wait99", 8),
    ("waitmax", 8),
    ("gap50", 7),
    ("gap99", 8),
    ("chg50", 7),
    ("chg99", 8),
    ("xpr50", 7),
    ("same", 6),
    ("a+r50", 7),
    ("a+r99", 8),
    ("rt/acq", 7),
    ("srv/acq", 8),
    ("cpu/acq", 8),
    ("overlap", 8),
    ("lost", 5),
    ("ping50", 7),
];

fn print_header(label: &str, width: usize) {
    let mut line = format!("{label:<width$}");
    for (name, column) in COLUMNS {
        line.push_str(&format!(" {name:>column$}"));
    }
    eprintln!("{line}");
}

fn print_row(label: &str, figures: &Figures, lock: Implementation) {
    print_labelled_row(label, 8, figures, lock);
}

fn print_labelled_row(label: &str, width: usize, f: &Figures, lock: Implementation) {
    let marker = if lock.counted_at_server() { "*" } else { "" };
    let cells = [
        fixed(Some(f.acq_per_s), 0),
        us(f.wait_p50_us),
        us(f.wait_p99_us),
        us(f.wait_max_us),
        us(f.gap_p50_us),
        us(f.gap_p99_us),
        us(f.gap_change_p50_us),
        us(f.gap_change_p99_us),
        us(f.gap_xproc_p50_us),
        fixed(f.same_worker_share, 3),
        us(f.acq_release_p50_us),
        us(f.acq_release_p99_us),
        format!("{}{marker}", fixed(f.round_trips_per_acq, 2)),
        fixed(f.server_cmds_per_acq, 2),
        fixed(f.server_cpu_us_per_acq, 1),
        f.overlaps.to_string(),
        f.lost_updates.to_string(),
        fixed(Some(f.ping_p50_us), 0),
    ];
    let mut line = format!("{label:<width$}");
    for ((_, column), cell) in COLUMNS.iter().zip(cells) {
        line.push_str(&format!(" {cell:>column$}"));
    }
    eprintln!("{line}");
}

fn print_run_header(rep: usize, reps: usize, workload: &Workload) {
    eprintln!(
        "\n== rep {rep}/{reps}: {} ({} worker{}, {} process{}; load average {})",
        workload.name(),
        workload.workers,
        if workload.workers == 1 { "" } else { "s" },
        workload.processes,
        if workload.processes == 1 { "" } else { "es" },
        load_average()
    );
    print_header("lock", 8);
}

fn print_summary(rows: &[SummaryRow], ping: Ping, ping_end: Ping) {
    eprintln!(
        "\n== summary: median of {} repetition(s); latencies in µs; overlaps and lost updates summed",
        rows.first().map_or(0, |row| row.reps)
    );
    eprintln!(
        "PING round trip: start p50 {:.1} µs p99 {:.1} µs; end p50 {:.1} µs p99 {:.1} µs; \
         load average now {}",
        ping.p50_us,
        ping.p99_us,
        ping_end.p50_us,
        ping_end.p99_us,
        load_average()
    );
    print_header("workload / lock", 28);
    for row in rows {
        let label = format!("{} {}", row.workload.name(), row.lock.name());
        print_labelled_row(&label, 28, &row.figures, row.lock);
        emit(summary_json(row));
    }
    eprintln!(
        "wait = acquire called -> returned (waitmax: longest wait overlapping the window, \
         drain included); gap = release returned -> next acquire returned \
         (chg: worker changes only, xpr: between processes only); same = share of re-takes by \
         the same worker; a+r = acquire + release time; rt = round trips counted in the client \
         (* counted at the server: rslock has no counter); srv = server command calls, script \
         internals included; cpu = Redis CPU µs (kernel included), critical sections' GET and \
         SET included; ping50 = PING p50 just before the run. Per-acquisition counts \
         cover the whole run, warm-up included."
    );
    eprintln!("\n== targets (ours; measured on the summary medians)");
}

fn print_target(target: &Target) {
    let verdict = match target.met() {
        Some(true) => "met",
        Some(false) => "NOT MET",
        None if target.limit.is_none() => "info",
        None => "n/a",
    };
    let goal = match target.limit {
        Some((Comparison::AtMost, limit)) => format!(" (goal <= {limit:.3})"),
        Some((Comparison::AtLeast, limit)) => format!(" (goal >= {limit:.3})"),
        None => String::new(),
    };
    eprintln!(
        "[{verdict:>7}] {:<20} {}: {}{goal}; {}",
        target.workload,
        target.name,
        fixed(target.measured, 3),
        target.detail
    );
}

fn figures_json(f: &Figures) -> serde_json::Value {
    json!({
        "acquisitions": f.acquisitions,
        "acquisitions_total": f.acquisitions_total,
        "acq_per_s": round(f.acq_per_s, 1),
        "wait_p50_us": f.wait_p50_us,
        "wait_p99_us": f.wait_p99_us,
        "wait_max_us": f.wait_max_us,
        "gap_p50_us": f.gap_p50_us,
        "gap_p99_us": f.gap_p99_us,
        "gap_change_p50_us": f.gap_change_p50_us,
        "gap_change_p99_us": f.gap_change_p99_us,
        "gap_xproc_p50_us": f.gap_xproc_p50_us,
        "gap_xproc_p99_us": f.gap_xproc_p99_us,
        "acq_release_p50_us": f.acq_release_p50_us,
        "acq_release_p99_us": f.acq_release_p99_us,
        "same_worker_share": f.same_worker_share.map(|v| round(v, 4)),
        "round_trips_per_acq": f.round_trips_per_acq.map(|v| round(v, 3)),
        "server_cmds_per_acq": f.server_cmds_per_acq.map(|v| round(v, 3)),
        "server_cpu_us_per_acq": f.server_cpu_us_per_acq.map(|v| round(v, 2)),
        "overlaps": f.overlaps,
        "lost_updates": f.lost_updates,
        "ping_p50_us": round(f.ping_p50_us, 1),
        "ping_p99_us": round(f.ping_p99_us, 1),
    })
}

/// `base` with the figures' fields added.
fn with_figures(mut base: serde_json::Value, figures: &Figures) -> serde_json::Value {
    if let (Some(base), serde_json::Value::Object(fields)) =
        (base.as_object_mut(), figures_json(figures))
    {
        base.extend(fields);
    }
    base
}

fn run_json(report: &RunReport) -> serde_json::Value {
    with_figures(
        json!({
            "kind": "run",
            "lock": report.lock.name(),
            "workload": report.workload.name(),
            "workers": report.workload.workers,
            "processes": report.workload.processes,
            "rep": report.rep,
            "round_trips_counted_by": report.lock.round_trips_counted_by(),
        }),
        &report.figures,
    )
}

fn summary_json(row: &SummaryRow) -> serde_json::Value {
    with_figures(
        json!({
            "kind": "summary",
            "lock": row.lock.name(),
            "workload": row.workload.name(),
            "workers": row.workload.workers,
            "processes": row.workload.processes,
            "reps": row.reps,
            "round_trips_counted_by": row.lock.round_trips_counted_by(),
        }),
        &row.figures,
    )
}

fn target_json(target: &Target) -> serde_json::Value {
    let (comparison, limit) = match target.limit {
        Some((Comparison::AtMost, limit)) => (Some("<="), Some(limit)),
        Some((Comparison::AtLeast, limit)) => (Some(">="), Some(limit)),
        None => (None, None),
    };
    json!({
        "kind": "target",
        "target": target.name,
        "workload": target.workload,
        "measured": target.measured.map(|v| round(v, 4)),
        "comparison": comparison,
        "limit": limit,
        "met": target.met(),
        "detail": target.detail,
    })
}

fn emit(value: serde_json::Value) {
    println!("{value}");
}

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

async fn connect(url: &str) -> Res<MultiplexedConnection> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// Wall-clock microseconds since the Unix epoch: comparable between processes on one machine.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as i64)
}

/// The machine's 1-minute load average, for the record: other work on it skews every figure.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

fn micros(duration: Duration) -> i64 {
    duration.as_micros() as i64
}

/// Sleeps until the wall clock reads `at_us`.
async fn sleep_until(at_us: i64) {
    if let Ok(wait) = u64::try_from(at_us - now_us()) {
        tokio::time::sleep(Duration::from_micros(wait)).await;
    }
}

fn sorted(values: impl Iterator<Item = i64>) -> Vec<i64> {
    let mut values: Vec<i64> = values.collect();
    values.sort_unstable();
    values
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[i64], p: usize) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() - 1) * p) / 100] as f64)
}

fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[middle]),
        _ => Some((values[middle - 1] + values[middle]) / 2.0),
    }
}

fn round(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

fn fixed(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".into(), |value| format!("{value:.decimals$}"))
}

fn us(value: Option<f64>) -> String {
    fixed(value, 0)
}

//! What is compared, on what: the lock implementations, the workloads, and the plan of one
//! run that the parent hands to a child (its keys, its schedule, what it reports back).

use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::deployment::Deployment;
use crate::helpers::{micros, now_us};

/// Workers run this long before the measured window opens: connections, subscriptions and
/// the lock's queues settle first.
const WARM_UP: Duration = Duration::from_millis(500);
/// Time between fixing the schedule and its start: enough for the child to read it.
const LEAD: Duration = Duration::from_millis(100);

/// A lock implementation the benchmark compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Implementation {
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
    pub(crate) const ALL: [Self; 5] = [
        Self::Ours,
        Self::OursPerWorker,
        Self::Rslock,
        Self::Naive,
        Self::Bare,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Ours => "ours",
            Self::OursPerWorker => "ours-pw",
            Self::Rslock => "rslock",
            Self::Naive => "naive",
            Self::Bare => "bare",
        }
    }

    /// Whether it runs `workload`: the bare lock only where nobody waits.
    pub(crate) fn runs(self, workload: &Workload) -> bool {
        self != Self::Bare || !workload.contended
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Commands this lock's scripts run inside Redis: `INFO commandstats` counts them, but no
    /// client sent them. `None` for this library, which counts its own round trips (and whose
    /// scripts change with it).
    pub(crate) fn commands_inside_scripts(self) -> Option<&'static [&'static str]> {
        match self {
            Self::Ours | Self::OursPerWorker => None,
            // Both release with a compare-and-delete script: GET, then DEL on a match.
            Self::Rslock | Self::Naive => Some(&["get", "del"]),
            Self::Bare => Some(&["exists", "hset", "pexpire", "get", "time", "hdel"]),
        }
    }

    /// Whether its round trips are counted at the server: rslock has no counter.
    pub(crate) fn counted_at_server(self) -> bool {
        self == Self::Rslock
    }

    /// Whether it is this library, in either of its two set-ups.
    pub(crate) fn is_ours(self) -> bool {
        matches!(self, Self::Ours | Self::OursPerWorker)
    }

    pub(crate) fn round_trips_counted_by(self) -> &'static str {
        if self.counted_at_server() {
            "server"
        } else {
            "client"
        }
    }
}

/// How many workers, over how many processes, on one shared key or on a key each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Workload {
    pub(crate) workers: usize,
    pub(crate) processes: usize,
    pub(crate) contended: bool,
}

impl Workload {
    pub(crate) const ALL: [Self; 8] = [
        Self::new(1, 1, false),
        Self::new(16, 1, false),
        Self::new(2, 1, true),
        Self::new(8, 1, true),
        Self::new(32, 1, true),
        Self::new(2, 2, true),
        Self::new(8, 2, true),
        Self::new(32, 2, true),
    ];

    pub(crate) const fn new(workers: usize, processes: usize, contended: bool) -> Self {
        Self {
            workers,
            processes,
            contended,
        }
    }

    pub(crate) fn name(&self) -> String {
        match (self.contended, self.processes) {
            (false, 1) => format!("uncontended-w{}", self.workers),
            (false, p) => format!("uncontended-w{}-{p}proc", self.workers),
            (true, 1) => format!("contended-w{}", self.workers),
            (true, p) => format!("contended-w{}-{p}proc", self.workers),
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|workload| workload.name() == name)
    }

    /// The global worker numbers that run in `process`.
    pub(crate) fn workers_of(&self, process: usize) -> Range<usize> {
        let share = self.workers / self.processes;
        process * share..(process + 1) * share
    }

    /// Contended workers share key 0; uncontended ones each have their own.
    pub(crate) fn key_of(&self, worker: usize) -> usize {
        if self.contended { 0 } else { worker }
    }

    fn keys(&self) -> usize {
        if self.contended { 1 } else { self.workers }
    }
}

/// One process's part of one run, as the parent hands it to a child.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RunSpec {
    pub(crate) deployment: Deployment,
    pub(crate) lock: Implementation,
    pub(crate) workload: Workload,
    pub(crate) process: usize,
    /// Prefix of every key of this run; unique, so no run sees another's leftovers.
    pub(crate) tag: String,
}

impl RunSpec {
    pub(crate) fn lock_name(&self, key: usize) -> String {
        format!("{}:k{key}", self.tag)
    }

    pub(crate) fn counter_key(&self, key: usize) -> String {
        format!("{}:counter:k{key}", self.tag)
    }

    pub(crate) fn counter_keys(&self) -> Vec<String> {
        (0..self.workload.keys())
            .map(|key| self.counter_key(key))
            .collect()
    }

    /// The key each process takes once before the run to open its connections.
    pub(crate) fn scratch_name(&self) -> String {
        format!("{}:scratch:p{}", self.tag, self.process)
    }
}

/// When the workers of every process start, when the measured window opens, and when they
/// stop asking for the lock: wall-clock microseconds, the one clock both processes share.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct Schedule {
    pub(crate) start_us: i64,
    pub(crate) measure_us: i64,
    pub(crate) stop_us: i64,
}

impl Schedule {
    pub(crate) fn from_now(seconds: f64) -> Self {
        let start_us = now_us() + micros(LEAD);
        let measure_us = start_us + micros(WARM_UP);
        Self {
            start_us,
            measure_us,
            stop_us: measure_us + (seconds * 1e6) as i64,
        }
    }

    pub(crate) fn in_window(&self, at_us: i64) -> bool {
        (self.measure_us..self.stop_us).contains(&at_us)
    }

    pub(crate) fn window_seconds(&self) -> f64 {
        (self.stop_us - self.measure_us) as f64 / 1e6
    }
}

/// One acquisition, timestamped in wall-clock microseconds.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) process: u32,
    pub(crate) worker: u32,
    pub(crate) key: u32,
    pub(crate) called_us: i64,
    pub(crate) acquired_us: i64,
    pub(crate) release_called_us: i64,
    pub(crate) released_us: i64,
}

/// What one process reports after a run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ProcessResult {
    pub(crate) records: Vec<Record>,
    /// Round trips the lock sent during the run, when it counts them.
    pub(crate) round_trips: Option<u64>,
    /// Critical sections run (one GET and one SET each): the benchmark's own commands.
    pub(crate) increments: u64,
    /// The process's CPU time over the measured window; `None` if it could not be read.
    pub(crate) cpu: Option<CpuWindow>,
}

/// One process's CPU time over the measured window, with the wall-clock instants of the two
/// readings (a busy machine may take them late; the acquisitions are counted between them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct CpuWindow {
    /// User plus system CPU µs of the whole process between the two readings.
    pub(crate) cpu_us: i64,
    pub(crate) from_us: i64,
    pub(crate) to_us: i64,
}

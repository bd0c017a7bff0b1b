//! The figures of one run: rates, waits and hand-over gaps from the records, the violations
//! of mutual exclusion, and the commands each acquisition cost.

use std::collections::BTreeMap;

use crate::helpers::{per_mille, percentile, sorted};
use crate::workload::{Implementation, ProcessResult, Record, Schedule};

/// Everything measured in one run (or, in the summary, the median over repetitions).
/// Latencies in µs; `None` where there was nothing to measure.
#[derive(Clone, Debug, Default)]
pub(crate) struct Figures {
    /// Acquisitions returned inside the measured window.
    pub(crate) acquisitions: f64,
    /// Every acquisition of the run, warm-up and drain included.
    pub(crate) acquisitions_total: f64,
    pub(crate) acq_per_s: f64,
    /// The wait's distribution, not only its middle and tail: a chart draws every lock's
    /// from p10 to p99.9 (`lockbench charts`), where two locks with the same p50 and p99
    /// can still part.
    pub(crate) wait_p10_us: Option<f64>,
    pub(crate) wait_p25_us: Option<f64>,
    pub(crate) wait_p50_us: Option<f64>,
    pub(crate) wait_p75_us: Option<f64>,
    pub(crate) wait_p90_us: Option<f64>,
    pub(crate) wait_p99_us: Option<f64>,
    pub(crate) wait_p999_us: Option<f64>,
    /// The longest wait that overlapped the window, including waits that only ended after
    /// the stop: percentiles over granted acquisitions hide a starved waiter, this does not.
    pub(crate) wait_max_us: Option<f64>,
    pub(crate) gap_p50_us: Option<f64>,
    pub(crate) gap_p99_us: Option<f64>,
    pub(crate) gap_change_p50_us: Option<f64>,
    pub(crate) gap_change_p99_us: Option<f64>,
    pub(crate) gap_xproc_p50_us: Option<f64>,
    pub(crate) gap_xproc_p99_us: Option<f64>,
    pub(crate) acq_release_p50_us: Option<f64>,
    pub(crate) acq_release_p99_us: Option<f64>,
    pub(crate) same_worker_share: Option<f64>,
    pub(crate) round_trips_per_acq: Option<f64>,
    pub(crate) server_cmds_per_acq: Option<f64>,
    /// Redis's CPU time (kernel included, every master) per acquisition of the whole run:
    /// the work a lock leaves to the server a fleet shares. It includes the critical
    /// section's GET and SET, which every lock pays alike.
    pub(crate) server_cpu_us_per_acq: Option<f64>,
    /// The benchmark processes' own CPU time (user and system, every thread, children
    /// included) over the measured window, per acquisition inside it: the work a lock
    /// costs each instance of a service. It includes the critical section's GET and SET.
    pub(crate) client_cpu_us_per_acq: Option<f64>,
    pub(crate) overlaps: u64,
    pub(crate) lost_updates: u64,
    /// The PING probe taken just before the run.
    pub(crate) ping_p50_us: f64,
    pub(crate) ping_p99_us: f64,
}

/// Timing and correctness figures from the records of every process.
pub(crate) fn analyse(schedule: &Schedule, results: &[ProcessResult], counters: &[u64]) -> Figures {
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
    let handovers = handovers(&per_key, schedule);
    Figures {
        acquisitions: measured.len() as f64,
        acquisitions_total: per_key.iter().map(Vec::len).sum::<usize>() as f64,
        acq_per_s: measured.len() as f64 / schedule.window_seconds(),
        wait_p10_us: percentile(&waits, 10),
        wait_p25_us: percentile(&waits, 25),
        wait_p50_us: percentile(&waits, 50),
        wait_p75_us: percentile(&waits, 75),
        wait_p90_us: percentile(&waits, 90),
        wait_p99_us: percentile(&waits, 99),
        wait_p999_us: per_mille(&waits, 999),
        wait_max_us: longest_wait(&per_key, schedule),
        gap_p50_us: percentile(&handovers.all, 50),
        gap_p99_us: percentile(&handovers.all, 99),
        gap_change_p50_us: percentile(&handovers.worker_change, 50),
        gap_change_p99_us: percentile(&handovers.worker_change, 99),
        gap_xproc_p50_us: percentile(&handovers.process_change, 50),
        gap_xproc_p99_us: percentile(&handovers.process_change, 99),
        acq_release_p50_us: percentile(&acq_release, 50),
        acq_release_p99_us: percentile(&acq_release, 99),
        same_worker_share: handovers.same_worker_share(),
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
struct Handovers {
    all: Vec<i64>,
    worker_change: Vec<i64>,
    process_change: Vec<i64>,
    same_worker: usize,
}

impl Handovers {
    fn same_worker_share(&self) -> Option<f64> {
        (!self.all.is_empty()).then(|| self.same_worker as f64 / self.all.len() as f64)
    }
}

/// The hand-overs whose receiving acquisition falls in the measured window.
fn handovers(per_key: &[Vec<Record>], schedule: &Schedule) -> Handovers {
    let mut handovers = Handovers {
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
        handovers.all.push(gap);
        if next.worker == previous.worker {
            handovers.same_worker += 1;
        } else {
            handovers.worker_change.push(gap);
        }
        if next.process != previous.process {
            handovers.process_change.push(gap);
        }
    }
    for gaps in [
        &mut handovers.all,
        &mut handovers.worker_change,
        &mut handovers.process_change,
    ] {
        gaps.sort_unstable();
    }
    handovers
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
pub(crate) fn count_commands(
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

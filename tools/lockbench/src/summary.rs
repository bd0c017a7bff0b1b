//! The summary over the repetitions (medians, violations summed) and the targets this
//! library is held to, read on it.

use crate::figures::Figures;
use crate::helpers::{fixed, median, us};
use crate::report::{Ping, RunReport};
use crate::workload::{Implementation, Workload};

/// One (lock, workload) pair over every repetition.
pub(crate) struct SummaryRow {
    pub(crate) lock: Implementation,
    pub(crate) workload: Workload,
    pub(crate) reps: usize,
    /// The load when each repetition of the workload began, in order.
    pub(crate) loads_before: Vec<Option<f64>>,
    pub(crate) figures: Figures,
}

/// Per (lock, workload), in the order they ran: the median of each figure over the
/// repetitions; overlaps and lost updates summed, so no violation hides behind a median.
pub(crate) fn summarise(reports: &[RunReport]) -> Vec<SummaryRow> {
    let mut rows: Vec<SummaryRow> = Vec::new();
    for report in reports {
        if rows
            .iter()
            .any(|row| row.lock == report.lock && row.workload == report.workload)
        {
            continue;
        }
        let same: Vec<&RunReport> = reports
            .iter()
            .filter(|other| other.lock == report.lock && other.workload == report.workload)
            .collect();
        let reps: Vec<&Figures> = same.iter().map(|other| &other.figures).collect();
        rows.push(SummaryRow {
            lock: report.lock,
            workload: report.workload,
            reps: reps.len(),
            loads_before: same.iter().map(|other| other.load_before).collect(),
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
        wait_p10_us: m(|f| f.wait_p10_us),
        wait_p25_us: m(|f| f.wait_p25_us),
        wait_p50_us: m(|f| f.wait_p50_us),
        wait_p75_us: m(|f| f.wait_p75_us),
        wait_p90_us: m(|f| f.wait_p90_us),
        wait_p99_us: m(|f| f.wait_p99_us),
        wait_p999_us: m(|f| f.wait_p999_us),
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
        client_cpu_us_per_acq: m(|f| f.client_cpu_us_per_acq),
        overlaps: reps.iter().map(|f| f.overlaps).sum(),
        lost_updates: reps.iter().map(|f| f.lost_updates).sum(),
        ping_p50_us: m(|f| Some(f.ping_p50_us)).unwrap_or_default(),
        ping_p99_us: m(|f| Some(f.ping_p99_us)).unwrap_or_default(),
    }
}

/// A goal for this library, checked against the summary.
pub(crate) struct Target {
    pub(crate) name: &'static str,
    pub(crate) workload: String,
    /// What the goal is read on: a ratio, or a plain figure.
    pub(crate) measured: Option<f64>,
    /// `<= limit` or `>= limit`; `None` for a figure only reported.
    pub(crate) limit: Option<(Comparison, f64)>,
    pub(crate) detail: String,
}

#[derive(Clone, Copy)]
pub(crate) enum Comparison {
    AtMost,
    AtLeast,
}

impl Target {
    /// `None` when a figure is missing (a filtered run) or the target is informational.
    pub(crate) fn met(&self) -> Option<bool> {
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

/// Every target whose workload ran; a target on a workload left out by `--workload`
/// would only report missing figures.
pub(crate) fn targets(rows: &[SummaryRow], ping: Ping) -> Vec<Target> {
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

//! What the benchmark prints: tables for people on stderr, JSON lines for the record on
//! stdout.

use serde_json::json;

use crate::figures::Figures;
use crate::helpers::{fixed, round, us};
use crate::load::{StartLoad, load_average, shown};
use crate::ratios::Ratio;
use crate::report::{Ping, RunReport};
use crate::summary::{Comparison, SummaryRow, Target};
use crate::workload::{Implementation, Workload};

/// The tables' columns and their widths, so every row lines up under its header.
const COLUMNS: [(&str, usize); 19] = [
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
    ("rcpu/acq", 8),
    ("ccpu/acq", 8),
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

/// A row of a run's table, under the header `print_run_header` printed.
pub(crate) fn print_row(label: &str, figures: &Figures, lock: Implementation) {
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
        fixed(f.client_cpu_us_per_acq, 1),
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

pub(crate) fn print_run_header(rep: usize, reps: usize, workload: &Workload, load: Option<f64>) {
    eprintln!(
        "\n== rep {rep}/{reps}: {} ({} worker{}, {} process{}; load average {})",
        workload.name(),
        workload.workers,
        if workload.workers == 1 { "" } else { "s" },
        workload.processes,
        if workload.processes == 1 { "" } else { "es" },
        shown(load)
    );
    print_header("lock", 8);
}

pub(crate) fn print_summary(rows: &[SummaryRow], ping: Ping, ping_end: Ping, start: &StartLoad) {
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
        shown(load_average())
    );
    eprintln!("{}", start.verdict());
    print_header("workload / lock", 28);
    for row in rows {
        let label = format!("{} {}", row.workload.name(), row.lock.name());
        print_labelled_row(&label, 28, &row.figures, row.lock);
        emit(summary_json(row, start));
    }
    eprintln!(
        "wait = acquire called -> returned (waitmax: longest wait overlapping the window, \
         drain included); gap = release returned -> next acquire returned \
         (chg: worker changes only, xpr: between processes only); same = share of re-takes by \
         the same worker; a+r = acquire + release time; rt = round trips counted in the client \
         (* counted at the server: rslock has no counter); srv = server command calls, script \
         internals included; rcpu = Redis CPU µs (kernel included) over the whole run, \
         warm-up included; ccpu = the benchmark processes' CPU µs (user + system, every thread \
         and process) over the measured window only; both include the critical sections' GET \
         and SET; ping50 = PING p50 just before the run. Round trips and commands per \
         acquisition cover the whole run, warm-up included."
    );
}

/// The ratios against rslock, with the start's mark on each, and their JSON lines.
pub(crate) fn print_ratios(ratios: &[Ratio], start: &StartLoad) {
    if ratios.is_empty() {
        return;
    }
    eprintln!(
        "\n== against rslock, from this run's medians (acq/s: above 1 is faster; CPU per \
         acquisition: above 1 costs more)"
    );
    eprintln!(
        "{:<20} {:<8} {:>7} {:>10} {:>10}",
        "workload", "lock", "acq/s", "client cpu", "redis cpu"
    );
    let times = |value: Option<f64>| value.map_or_else(|| "-".into(), |v| format!("{v:.2}x"));
    for ratio in ratios {
        eprintln!(
            "{:<20} {:<8} {:>7} {:>10} {:>10}{}",
            ratio.workload.name(),
            ratio.lock.name(),
            times(ratio.acq_per_s),
            times(ratio.client_cpu_per_acq),
            times(ratio.server_cpu_per_acq),
            marked(&start.mark())
        );
        emit(ratio_json(ratio, start));
    }
}

pub(crate) fn print_targets_header() {
    eprintln!("\n== targets (ours; measured on the summary medians)");
}

pub(crate) fn print_target(target: &Target, start: &StartLoad) {
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
        "[{verdict:>7}] {:<20} {}: {}{goal}{}; {}",
        target.workload,
        target.name,
        fixed(target.measured, 3),
        marked(&start.mark()),
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
        "wait_p10_us": f.wait_p10_us,
        "wait_p25_us": f.wait_p25_us,
        "wait_p75_us": f.wait_p75_us,
        "wait_p90_us": f.wait_p90_us,
        "wait_p999_us": f.wait_p999_us,
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
        "client_cpu_us_per_acq": f.client_cpu_us_per_acq.map(|v| round(v, 2)),
        "overlaps": f.overlaps,
        "lost_updates": f.lost_updates,
        "ping_p50_us": round(f.ping_p50_us, 1),
        "ping_p99_us": round(f.ping_p99_us, 1),
    })
}

/// A mark, with the space before it when there is one.
pub(crate) fn marked(mark: &str) -> String {
    if mark.is_empty() {
        String::new()
    } else {
        format!(" {mark}")
    }
}

/// `base` with the fields of the object `extra` added.
pub(crate) fn merged(mut base: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(base), serde_json::Value::Object(fields)) = (base.as_object_mut(), extra) {
        base.extend(fields);
    }
    base
}

/// `base` with the figures' fields and the start's load added.
fn with_figures(
    base: serde_json::Value,
    figures: &Figures,
    start: &StartLoad,
) -> serde_json::Value {
    merged(merged(base, figures_json(figures)), start.json())
}

/// The JSON line of one run, for `> results.jsonl`.
pub(crate) fn run_json(report: &RunReport, start: &StartLoad) -> serde_json::Value {
    with_figures(
        json!({
            "kind": "run",
            "lock": report.lock.name(),
            "workload": report.workload.name(),
            "workers": report.workload.workers,
            "processes": report.workload.processes,
            "rep": report.rep,
            "load_before": report.load_before,
            "round_trips_counted_by": report.lock.round_trips_counted_by(),
        }),
        &report.figures,
        start,
    )
}

fn summary_json(row: &SummaryRow, start: &StartLoad) -> serde_json::Value {
    with_figures(
        json!({
            "kind": "summary",
            "lock": row.lock.name(),
            "workload": row.workload.name(),
            "workers": row.workload.workers,
            "processes": row.workload.processes,
            "reps": row.reps,
            "load_before": row.loads_before,
            "round_trips_counted_by": row.lock.round_trips_counted_by(),
        }),
        &row.figures,
        start,
    )
}

fn ratio_json(ratio: &Ratio, start: &StartLoad) -> serde_json::Value {
    let line = json!({
        "kind": "ratio",
        "against": "rslock",
        "lock": ratio.lock.name(),
        "workload": ratio.workload.name(),
        "acq_per_s": ratio.acq_per_s.map(|v| round(v, 4)),
        "client_cpu_per_acq": ratio.client_cpu_per_acq.map(|v| round(v, 4)),
        "server_cpu_per_acq": ratio.server_cpu_per_acq.map(|v| round(v, 4)),
    });
    merged(line, start.json())
}

/// The JSON line of one target, with its verdict.
pub(crate) fn target_json(target: &Target, start: &StartLoad) -> serde_json::Value {
    let (comparison, limit) = match target.limit {
        Some((Comparison::AtMost, limit)) => (Some("<="), Some(limit)),
        Some((Comparison::AtLeast, limit)) => (Some(">="), Some(limit)),
        None => (None, None),
    };
    let target = json!({
        "kind": "target",
        "target": target.name,
        "workload": target.workload,
        "measured": target.measured.map(|v| round(v, 4)),
        "comparison": comparison,
        "limit": limit,
        "met": target.met(),
        "detail": target.detail,
    });
    merged(target, start.json())
}

/// Stdout carries only JSON lines, one value each, so the record stays machine-readable.
pub(crate) fn emit(value: serde_json::Value) {
    println!("{value}");
}

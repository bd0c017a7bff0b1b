//! The parent: runs every implementation on every workload, reads the server's statistics
//! around each run, and hands the records on to the figures and the output.

use std::time::Instant;

use redis::aio::MultiplexedConnection;
use serde_json::json;

use crate::child::ChildProcess;
use crate::cpu::client_cpu_us_per_acq;
use crate::deployment::Control;
use crate::figures::{Figures, analyse, count_commands};
use crate::helpers::Res;
use crate::helpers::{now_us, percentile};
use crate::load::{StartLoad, default_max_load, load_average, online_cores, shown, wait_quiet};
use crate::output::{
    emit, merged, print_ratios, print_row, print_run_header, print_summary, print_target,
    print_targets_header, run_json, target_json,
};
use crate::ratios::against_rslock;
use crate::report::{Ping, RunReport};
use crate::settings::Settings;
use crate::summary::{summarise, targets};
use crate::worker::{execute, prepare};
use crate::workload::{Implementation, RunSpec, Schedule, Workload};

/// Sequential PINGs of the probes at the start and the end of the whole benchmark.
const PINGS: usize = 2000;
/// Sequential PINGs of the probe before each run: the yardstick of that run's latencies,
/// taken close to it, as other work on a shared machine moves round trips a lot.
const RUN_PINGS: usize = 500;

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

/// The whole benchmark; `Ok(false)` when some run broke mutual exclusion.
pub(crate) async fn bench(settings: &Settings) -> Res<bool> {
    let max = settings
        .max_load
        .unwrap_or_else(|| default_max_load(online_cores()));
    let load = match settings.wait_quiet {
        Some(seconds) => wait_quiet(max, seconds).await,
        None => load_average(),
    };
    let start = StartLoad { load, max };
    let mut control = settings.deployment.control().await?;
    let where_ = if settings.deployment.is_cluster() {
        format!("a Redis Cluster of {} masters", control.masters())
    } else {
        "one Redis server".to_owned()
    };
    emit(merged(json!({"deployment": where_}), start.json()));
    let ping = ping_probe(&mut control.probe, PINGS).await?;
    eprintln!(
        "on {where_}; PING round trip (start): p50 {:.1} µs, p99 {:.1} µs; load average {} \
         (quiet below {max:.2})",
        ping.p50_us,
        ping.p99_us,
        shown(start.load)
    );
    let nonce = now_us();
    let mut reports = Vec::new();
    for rep in 1..=settings.reps {
        for workload in &settings.workloads {
            let load_before = load_average();
            print_run_header(rep, settings.reps, workload, load_before);
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
                    load_before,
                    figures,
                };
                print_row(lock.name(), &report.figures, lock);
                emit(run_json(&report, &start));
                reports.push(report);
            }
        }
    }
    let ping_end = ping_probe(&mut control.probe, PINGS).await?;
    let rows = summarise(&reports);
    print_summary(&rows, ping, ping_end, &start);
    print_ratios(&against_rslock(&rows), &start);
    print_targets_header();
    for target in targets(&rows, ping) {
        print_target(&target, &start);
        emit(target_json(&target, &start));
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
    figures.client_cpu_us_per_acq = client_cpu_us_per_acq(&results);
    figures.ping_p50_us = ping.p50_us;
    figures.ping_p99_us = ping.p99_us;
    Ok(figures)
}

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
//! often the same worker re-took the lock, round trips, server commands, the server's own
//! CPU time and the benchmark processes' CPU time (the client's, measured window only) per
//! acquisition, and the violations. PING probes on the same runtime (at the
//! start, before every run, at the end) give the round trip to read the latencies against.
//!
//! ```text
//! lockbench --redis URL [--seconds 2] [--reps 3] [--only ours,ours-pw,rslock,naive,bare]
//!           [--workload contended-w32-2proc,uncontended-w1,...]
//! lockbench --cluster --redis SEED [--redis SEED ...] [...]
//! lockbench charts --from results.jsonl --out DIR
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
//! Beside it, per workload, every lock's rate and CPU per acquisition (client and Redis)
//! over rslock's, from the same run's medians.
//! Every JSON line carries the 1-minute load average at the start (`load_start`), the
//! threshold (`max_load`, `--max-load`) and `loaded`: a run that started at or over it is
//! marked next to every ratio, as its ratios converge toward 1 (`--wait-quiet SECS` waits
//! for the load to fall first).
//!
//! `lockbench charts` runs nothing: it draws SVG charts (rates, Redis CPU and wait
//! distributions per workload, this library against rslock) from the JSON lines of an
//! earlier run, so the charts docs/benchmarks.md shows can be redrawn from kept data.
//!
//! Exit codes: 0 done, 1 a mutual-exclusion violation in some run, 2 usage, 3 the benchmark
//! could not run (Redis or the child process failed) or the charts could not be drawn (an
//! unreadable or malformed input, an unwritable directory).

mod bench;
mod chart_bars;
mod chart_data;
mod chart_parts;
mod chart_waits;
mod charts;
mod child;
#[path = "../../programs/commandstats.rs"]
mod commandstats;
mod cpu;
mod deployment;
mod figures;
mod helpers;
mod load;
mod locks;
mod output;
mod ratios;
mod report;
mod settings;
mod summary;
mod svg;
mod worker;
mod workload;

use std::process::ExitCode;

use crate::bench::bench;
use crate::charts::write_charts;
use crate::child::child_main;
use crate::settings::{ChartPaths, Command, USAGE, parse_command};

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
    let settings = match parse_command(args) {
        Ok(Command::Bench(settings)) => settings,
        Ok(Command::Charts(paths)) => return charts_main(&paths),
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

/// `lockbench charts`: the files written go to stderr, as the benchmark's tables do.
fn charts_main(paths: &ChartPaths) -> ExitCode {
    match write_charts(&paths.from, &paths.out) {
        Ok(written) => {
            for path in written {
                eprintln!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(problem) => {
            eprintln!("lockbench charts: {problem}");
            ExitCode::from(3)
        }
    }
}

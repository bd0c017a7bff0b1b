//! The command line: which locks and workloads run (`--only`, `--workload`), for how long
//! (`--seconds`, `--reps`), on which Redis (`--redis`, `--cluster`), and how loaded the
//! machine may be at the start (`--max-load`, `--wait-quiet`); or, with `charts` first,
//! which JSON lines to draw and where (`--from`, `--out`).

use std::path::PathBuf;

use crate::deployment::Deployment;
use crate::workload::{Implementation, Workload};

/// Printed after every usage error, so a wrong flag shows the right ones.
pub(crate) const USAGE: &str = "usage: lockbench --redis URL [--seconds 2] [--reps 3] \
[--only ours,ours-pw,rslock,naive,bare] [--workload NAME,...] [--max-load L] [--wait-quiet SECS]
       lockbench --cluster --redis SEED [--redis SEED ...] [--seconds 2] [--reps 3] \
[--workload NAME,...] [--max-load L] [--wait-quiet SECS]
       lockbench charts --from RESULTS.jsonl --out DIR
--max-load: a 1-minute load average at the start at or over it marks the run loaded \
(default 0.25 per online core)
--wait-quiet: wait up to SECS for the load average to fall below it before starting
charts: draw SVG charts of the summary and ratio lines a run printed into DIR
workloads: uncontended-w1 uncontended-w16 contended-w2 contended-w8 contended-w32
           contended-w2-2proc contended-w8-2proc contended-w32-2proc";

/// What to do: run the benchmark, or draw charts from the JSON lines of an earlier run
/// (which needs no Redis, so the charts can be redrawn from kept data).
pub(crate) enum Command {
    Bench(Settings),
    Charts(ChartPaths),
}

/// Where `lockbench charts` reads the JSON lines and where it writes the SVG files.
#[derive(Debug, PartialEq)]
pub(crate) struct ChartPaths {
    pub(crate) from: PathBuf,
    pub(crate) out: PathBuf,
}

/// What the benchmark run asks for; `parse` fills in the defaults.
pub(crate) struct Settings {
    pub(crate) deployment: Deployment,
    pub(crate) seconds: f64,
    pub(crate) reps: usize,
    pub(crate) locks: Vec<Implementation>,
    pub(crate) workloads: Vec<Workload>,
    /// The load threshold; `None` for the default of the machine's cores.
    pub(crate) max_load: Option<f64>,
    /// How long to wait for a quiet machine before starting; `None`: start at once.
    pub(crate) wait_quiet: Option<f64>,
}

/// The command `args` ask for: `charts` first draws charts, anything else runs the benchmark.
pub(crate) fn parse_command(mut args: Vec<String>) -> Result<Command, String> {
    if args.first().map(String::as_str) == Some("charts") {
        args.remove(0);
        return parse_charts(args).map(Command::Charts);
    }
    parse(args).map(Command::Bench)
}

/// `--from FILE --out DIR`, both required: a chart drawn over an old one by a default
/// directory would be easy to miss.
fn parse_charts(args: Vec<String>) -> Result<ChartPaths, String> {
    let (mut from, mut out) = (None, None);
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            return Err("help".into());
        }
        let value = args.next().ok_or(format!("charts: {flag} needs a value"))?;
        match flag.as_str() {
            "--from" => from = Some(PathBuf::from(value)),
            "--out" => out = Some(PathBuf::from(value)),
            _ => return Err(format!("charts: unknown option {flag}")),
        }
    }
    Ok(ChartPaths {
        from: from.ok_or("charts: --from RESULTS.jsonl is required")?,
        out: out.ok_or("charts: --out DIR is required")?,
    })
}

/// The settings `args` ask for, or what is wrong with them (`help` for `-h`, so the usage
/// is printed and the exit code is that of a usage error).
pub(crate) fn parse(args: Vec<String>) -> Result<Settings, String> {
    let mut urls = Vec::new();
    let mut cluster = false;
    let mut only = None;
    let mut settings = Settings {
        deployment: Deployment::server(String::new()),
        seconds: 2.0,
        reps: 3,
        locks: Vec::new(),
        workloads: Workload::ALL.to_vec(),
        max_load: None,
        wait_quiet: None,
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
            "--max-load" => settings.max_load = Some(positive_number(&flag, &value)?),
            "--wait-quiet" => settings.wait_quiet = Some(positive_number(&flag, &value)?),
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

#[cfg(test)]
mod tests {
    use super::{ChartPaths, Command, parse, parse_command};

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn the_load_flags_are_optional_positive_numbers() {
        let settings = parse(args("--redis redis://r")).unwrap();
        assert_eq!((settings.max_load, settings.wait_quiet), (None, None));
        let settings = parse(args("--redis redis://r --max-load 0.8 --wait-quiet 120")).unwrap();
        assert_eq!(
            (settings.max_load, settings.wait_quiet),
            (Some(0.8), Some(120.0))
        );
        assert!(parse(args("--redis redis://r --max-load 0")).is_err());
        assert!(parse(args("--redis redis://r --wait-quiet")).is_err());
    }

    #[test]
    fn charts_needs_a_source_and_a_directory() {
        let Ok(Command::Charts(paths)) = parse_command(args("charts --from r.jsonl --out d"))
        else {
            panic!("charts mode not recognised");
        };
        assert_eq!(
            paths,
            ChartPaths {
                from: "r.jsonl".into(),
                out: "d".into()
            }
        );
        for wrong in [
            "charts",
            "charts --from r.jsonl",
            "charts --out d",
            "charts --from",
            "charts --from r.jsonl --out d --reps 3",
        ] {
            assert!(parse_command(args(wrong)).is_err(), "{wrong}");
        }
        assert!(matches!(
            parse_command(args("--redis redis://r")),
            Ok(Command::Bench(_))
        ));
    }
}

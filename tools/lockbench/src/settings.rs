//! The command line: which locks and workloads run (`--only`, `--workload`), for how long
//! (`--seconds`, `--reps`), and on which Redis (`--redis`, `--cluster`).

use crate::deployment::Deployment;
use crate::workload::{Implementation, Workload};

/// Printed after every usage error, so a wrong flag shows the right ones.
pub(crate) const USAGE: &str = "usage: lockbench --redis URL [--seconds 2] [--reps 3] \
[--only ours,ours-pw,rslock,naive,bare] [--workload NAME,...]
       lockbench --cluster --redis SEED [--redis SEED ...] [--seconds 2] [--reps 3] \
[--workload NAME,...]
workloads: uncontended-w1 uncontended-w16 contended-w2 contended-w8 contended-w32
           contended-w2-2proc contended-w8-2proc contended-w32-2proc";

/// What the command line asks for; `parse` fills in the defaults.
pub(crate) struct Settings {
    pub(crate) deployment: Deployment,
    pub(crate) seconds: f64,
    pub(crate) reps: usize,
    pub(crate) locks: Vec<Implementation>,
    pub(crate) workloads: Vec<Workload>,
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

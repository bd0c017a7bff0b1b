//! The machine's load when the benchmark starts. On a machine other work keeps busy every
//! lock's rate converges toward the machine's noise and the ratios between them toward 1,
//! so a run that started loaded says so next to every ratio (and `loaded: true` in its
//! JSON), and `--wait-quiet` can wait for the load to fall first.

use std::time::{Duration, Instant};

use serde_json::json;

/// The default threshold per core: 0.5 on the 2-core machine whose quiet runs (1-minute
/// load under 0.5) gave the ratios loaded runs did not. The benchmark and Redis keep every
/// core of such a machine busy, so half a runnable task of other work already takes a
/// quarter of it.
pub(crate) const MAX_LOAD_PER_CORE: f64 = 0.25;

/// How often the kernel updates its load averages: no point in looking more often.
const LOAD_UPDATE: Duration = Duration::from_secs(5);

/// The machine's 1-minute load average; `None` where `/proc/loadavg` cannot be read.
pub(crate) fn load_average() -> Option<f64> {
    one_minute(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn one_minute(loadavg: &str) -> Option<f64> {
    loadavg.split_whitespace().next()?.parse().ok()
}

/// A load for people: two decimals, or `unknown`.
pub(crate) fn shown(load: Option<f64>) -> String {
    load.map_or_else(|| "unknown".into(), |load| format!("{load:.2}"))
}

/// The default threshold for `cores` online cores.
pub(crate) fn default_max_load(cores: usize) -> f64 {
    MAX_LOAD_PER_CORE * cores.max(1) as f64
}

/// The machine's online cores, counted in `/proc/cpuinfo` as the load average counts them
/// (machine-wide: `taskset`, as under `bench.sh --pin`, does not lower it).
pub(crate) fn online_cores() -> usize {
    let counted = std::fs::read_to_string("/proc/cpuinfo").map_or(0, |text| {
        text.lines()
            .filter(|line| line.starts_with("processor"))
            .count()
    });
    if counted > 0 {
        counted
    } else {
        std::thread::available_parallelism().map_or(1, usize::from)
    }
}

/// The 1-minute load when the benchmark started, before any of its own work, and the
/// threshold it is read against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StartLoad {
    pub(crate) load: Option<f64>,
    pub(crate) max: f64,
}

impl StartLoad {
    /// At or over the threshold; `None` when the load could not be read.
    pub(crate) fn loaded(&self) -> Option<bool> {
        self.load.map(|load| load >= self.max)
    }

    /// What a ratio of this run carries: nothing from a quiet start.
    pub(crate) fn mark(&self) -> String {
        match self.loaded() {
            Some(false) => String::new(),
            Some(true) => format!("(loaded: {})", shown(self.load)),
            None => "(load unknown)".into(),
        }
    }

    /// One sentence on the start, for the summary.
    pub(crate) fn verdict(&self) -> String {
        let start = format!(
            "load average at the start {} (quiet below {:.2})",
            shown(self.load),
            self.max
        );
        match self.loaded() {
            Some(false) => format!("{start}: quiet"),
            Some(true) => format!(
                "{start}: LOADED. Ratios from a loaded start converge toward 1 (every rate \
                 sinks toward the machine's noise): each is marked {}; do not quote them, \
                 rerun quiet (--wait-quiet SECS)",
                self.mark()
            ),
            None => format!("{start}: ratios are marked {}", self.mark()),
        }
    }

    /// The fields every JSON line of the run carries.
    pub(crate) fn json(&self) -> serde_json::Value {
        json!({
            "load_start": self.load,
            "max_load": self.max,
            "loaded": self.loaded(),
        })
    }
}

/// Waits up to `seconds` for the 1-minute load to fall below `max`, and reads it: the
/// load when the benchmark starts.
pub(crate) async fn wait_quiet(max: f64, seconds: f64) -> Option<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut load = load_average();
    if load.is_some_and(|load| load >= max) {
        eprintln!(
            "load average {} >= {max:.2}: waiting up to {seconds:.0} s for it to fall",
            shown(load)
        );
    }
    while load.is_some_and(|load| load >= max) && Instant::now() < deadline {
        tokio::time::sleep(LOAD_UPDATE.min(deadline - Instant::now())).await;
        load = load_average();
    }
    if load.is_some_and(|load| load >= max) {
        eprintln!(
            "load average still {} after {seconds:.0} s: starting; the run is marked loaded",
            shown(load)
        );
    }
    load
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_minute_load_is_the_first_field_of_proc_loadavg() {
        assert_eq!(one_minute("1.84 0.93 0.52 3/102 25922\n"), Some(1.84));
        assert_eq!(one_minute(""), None);
        assert_eq!(one_minute("x 1 2"), None);
    }

    #[test]
    fn the_default_threshold_is_a_quarter_per_core() {
        assert_eq!(default_max_load(2), 0.5);
        assert_eq!(default_max_load(8), 2.0);
        assert_eq!(default_max_load(0), 0.25);
    }

    #[test]
    fn a_start_at_or_over_the_threshold_is_loaded_and_marked() {
        let start = |load| StartLoad { load, max: 0.5 };
        assert_eq!(start(Some(0.49)).loaded(), Some(false));
        assert_eq!(start(Some(0.49)).mark(), "");
        assert!(start(Some(0.49)).verdict().ends_with(": quiet"));
        assert_eq!(start(Some(0.5)).loaded(), Some(true));
        assert_eq!(start(Some(1.844)).mark(), "(loaded: 1.84)");
        assert!(start(Some(1.844)).verdict().contains("LOADED"));
        assert_eq!(start(None).loaded(), None);
        assert_eq!(start(None).mark(), "(load unknown)");
        assert_eq!(
            start(Some(1.84)).json(),
            json!({"load_start": 1.84, "max_load": 0.5, "loaded": true})
        );
    }
}

//! What a run reports to the summary and the output: its figures with what ran, and the
//! PING round trips its latencies are read against.

use crate::figures::Figures;
use crate::workload::{Implementation, Workload};

/// PING round trips from this runtime: the yardstick every latency is read against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ping {
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
}

/// One run's figures with what ran, kept for the summary over the repetitions.
pub(crate) struct RunReport {
    pub(crate) lock: Implementation,
    pub(crate) workload: Workload,
    pub(crate) rep: usize,
    /// The 1-minute load when this repetition of the workload began: after the first, it
    /// includes the benchmark's own earlier runs (the average lags by about a minute).
    pub(crate) load_before: Option<f64>,
    pub(crate) figures: Figures,
}

//! Every series the client records, with its labels and every value each label takes, as a
//! public list: the alert rules and the dashboard in `contrib/` are checked against it, so a
//! renamed metric or label fails a test, not a pager.

use super::labels::{HandoverPath, IdempotentOutcome, Renewal, lost_label};
use super::labels::{KINDS, LOST_REASONS, OUTCOMES, REDIS_ERROR_KINDS};
use super::leadership::{LEADER, LEADERSHIP_CHANGES, LeadershipChange, TICKS, TickOutcome};
use super::{
    ACQUISITIONS, HANDOVERS, HELD, HOLD_SECONDS, IDEMPOTENT, LAYER_REJECTIONS, LOST,
    OLDEST_HOLD_START, QUARANTINED, REDIS_ERRORS, RENEWALS, WAIT_SECONDS, WAITING,
};
use crate::rejection_kind::RejectionKind;

/// What kind of metric a series is, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MetricShape {
    /// Only goes up (`_total`); read it with `rate` or `increase`.
    Counter,
    /// Goes up and down; read as it is.
    Gauge,
    /// Samples of seconds: `_bucket`, `_sum` and `_count` with buckets
    /// ([`HISTOGRAM_BUCKETS`](crate::HISTOGRAM_BUCKETS)), or quantiles without.
    Histogram,
}

/// One label of a metric and the values it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricLabel {
    /// The label's name.
    pub name: &'static str,
    /// Every value the client gives it, or `None` for a name the application chooses (a
    /// singleton's or a schedule's).
    pub values: Option<Vec<&'static str>>,
}

/// One metric the client records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricSeries {
    /// Its name, as the exporter shows it (a histogram's series add `_bucket`, `_sum`,
    /// `_count`).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub shape: MetricShape,
    /// What it counts, as [`describe_metrics`](crate::describe_metrics) registers it.
    pub help: &'static str,
    /// Its labels; none of them is ever a lock's name.
    pub labels: Vec<MetricLabel>,
}

/// The bucket bounds, in seconds, that the alert rules and the dashboard in `contrib/` expect
/// for the wait and hold histograms: from a millisecond (a lock taken at once) to ten minutes
/// (a long job's hold). `metrics-exporter-prometheus` writes summaries unless told buckets,
/// and quantiles of summaries cannot be added up across instances:
///
/// ```
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// let handle = PrometheusBuilder::new()
///     .set_buckets_for_metric(
///         Matcher::Prefix("redis_lock_".into()),
///         tower_redis_lock::HISTOGRAM_BUCKETS,
///     )?
///     .install_recorder()?;
/// # let _ = handle; Ok(()) }
/// ```
pub const HISTOGRAM_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// Every metric the client and its layers record, with each label and its values: what
/// Prometheus rules and dashboards may name. The series of a singleton or a schedule appear
/// once one is made; every other counter series starts at 0 when a client is built.
pub fn metric_series() -> Vec<MetricSeries> {
    use MetricShape::{Counter, Gauge, Histogram};
    let kind = || label("kind", KINDS.to_vec());
    let name = || MetricLabel {
        name: "name",
        values: None,
    };
    vec![
        series(
            ACQUISITIONS,
            Counter,
            "Acquisitions asked for, by kind and outcome (acquired, busy, timeout, unavailable, \
             denied, cancelled, shut_down, error).",
            vec![kind(), label("outcome", OUTCOMES.to_vec())],
        ),
        series(
            WAIT_SECONDS,
            Histogram,
            "Seconds from asking for a lock to holding it, by kind.",
            vec![kind()],
        ),
        series(
            HOLD_SECONDS,
            Histogram,
            "Seconds a lock was held by one holder of this client, by kind.",
            vec![kind()],
        ),
        series(
            HANDOVERS,
            Counter,
            "Locks handed to a waiter, by path: local (between tasks of this client) or redis \
             (granted from the Redis queue).",
            vec![label(
                "path",
                HandoverPath::ALL.map(HandoverPath::as_str).to_vec(),
            )],
        ),
        series(
            LOST,
            Counter,
            "Leases lost while held, by reason (taken, unreachable, expired, data_lost, \
             shut_down).",
            vec![label("reason", LOST_REASONS.map(lost_label).to_vec())],
        ),
        series(HELD, Gauge, "Locks held by this process now.", vec![]),
        series(
            OLDEST_HOLD_START,
            Gauge,
            "Unix time, in seconds, at which the longest-running hold of this process began; \
             0 while nothing is held.",
            vec![],
        ),
        series(
            WAITING,
            Gauge,
            "Acquisitions of this process waiting for a lock now.",
            vec![],
        ),
        series(
            QUARANTINED,
            Gauge,
            "Clients of this process that know of a restart quarantine in force on their \
             Redis: no lock is granted there until it ends.",
            vec![],
        ),
        series(
            RENEWALS,
            Counter,
            "Lease renewals by the watchdog, by outcome (renewed, taken, failed).",
            vec![label("outcome", Renewal::ALL.map(Renewal::as_str).to_vec())],
        ),
        series(
            REDIS_ERRORS,
            Counter,
            "Redis commands that failed, by kind (unavailable, denied, redis, ...).",
            vec![label("kind", REDIS_ERROR_KINDS.to_vec())],
        ),
        series(
            LAYER_REJECTIONS,
            Counter,
            "Requests the layer answered itself instead of running the service, by reason.",
            vec![label(
                "reason",
                RejectionKind::ALL.map(RejectionKind::as_str).to_vec(),
            )],
        ),
        series(
            IDEMPOTENT,
            Counter,
            "Requests the idempotency layer handled, by outcome (first, replayed, mismatch, \
             in_progress, not_stored, over_bound, refused, lease_lost, store_failed, \
             unguarded, no_key, rejected, outcome_unknown).",
            vec![label(
                "outcome",
                IdempotentOutcome::ALL
                    .map(IdempotentOutcome::as_str)
                    .to_vec(),
            )],
        ),
        series(
            LEADER,
            Gauge,
            "1 while this instance leads the singleton task `name`, else 0.",
            vec![name()],
        ),
        series(
            LEADERSHIP_CHANGES,
            Counter,
            "Leaderships of singleton tasks by this instance, by name and change (gained, \
             lost, resigned).",
            vec![
                name(),
                label(
                    "change",
                    LeadershipChange::ALL.map(LeadershipChange::as_str).to_vec(),
                ),
            ],
        ),
        series(
            TICKS,
            Counter,
            "Ticks of schedules, by name and outcome (run, skipped, missed), each counted by \
             the one instance that ran, skipped or found it.",
            vec![
                name(),
                label(
                    "outcome",
                    TickOutcome::ALL.map(TickOutcome::as_str).to_vec(),
                ),
            ],
        ),
    ]
}

fn series(
    name: &'static str,
    shape: MetricShape,
    help: &'static str,
    labels: Vec<MetricLabel>,
) -> MetricSeries {
    MetricSeries {
        name,
        shape,
        help,
        labels,
    }
}

fn label(name: &'static str, values: Vec<&'static str>) -> MetricLabel {
    MetricLabel {
        name,
        values: Some(values),
    }
}

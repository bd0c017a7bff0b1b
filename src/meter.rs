//! What the client counts, through the `metrics` facade (feature `metrics`, on by default):
//! the application installs the recorder and exporter it wants, and without one every call
//! here costs next to nothing. Labels come from small fixed sets (kinds, outcomes, reasons),
//! never from a lock name: names are tenants, accounts, orders, without bound. The one
//! exception is a singleton task's name (`leadership`): a job the code names, a fixed few.

use std::future::Future;
#[cfg(feature = "metrics")]
use std::sync::LazyLock;
use std::time::Instant;

#[cfg(feature = "metrics")]
mod catalog;
mod labels;
mod leadership;
#[cfg(feature = "metrics")]
mod oldest_hold;

use crate::error::ErrorKind;
use crate::lease::LostReason;
use crate::lock_kind::LockKind;
use crate::rejection_kind::RejectionKind;
#[cfg(feature = "metrics")]
pub use catalog::{HISTOGRAM_BUCKETS, MetricLabel, MetricSeries, MetricShape, metric_series};
pub(crate) use labels::{HandoverPath, IdempotentOutcome, Renewal, kind_label, lost_label};
#[cfg(feature = "metrics")]
use labels::{KINDS, LOST_REASONS, OUTCOMES, REDIS_ERROR_KINDS};
use labels::{outcome_of, redis_error_label};
pub(crate) use leadership::{
    LeadershipChange, TickOutcome, leadership_changed, start_leadership_at_zero,
    start_ticks_at_zero, ticks,
};

/// `redis_lock_acquisitions_total{kind, outcome}`.
#[cfg(feature = "metrics")]
pub(crate) const ACQUISITIONS: &str = "redis_lock_acquisitions_total";
/// `redis_lock_wait_seconds{kind}`.
#[cfg(feature = "metrics")]
pub(crate) const WAIT_SECONDS: &str = "redis_lock_wait_seconds";
/// `redis_lock_hold_seconds{kind}`.
#[cfg(feature = "metrics")]
pub(crate) const HOLD_SECONDS: &str = "redis_lock_hold_seconds";
/// `redis_lock_handovers_total{path}`.
#[cfg(feature = "metrics")]
pub(crate) const HANDOVERS: &str = "redis_lock_handovers_total";
/// `redis_lock_lost_total{reason}`.
#[cfg(feature = "metrics")]
pub(crate) const LOST: &str = "redis_lock_lost_total";
/// `redis_lock_held`.
#[cfg(feature = "metrics")]
pub(crate) const HELD: &str = "redis_lock_held";
/// `redis_lock_waiting`.
#[cfg(feature = "metrics")]
pub(crate) const WAITING: &str = "redis_lock_waiting";
/// `redis_lock_renewals_total{outcome}`.
#[cfg(feature = "metrics")]
pub(crate) const RENEWALS: &str = "redis_lock_renewals_total";
/// `redis_lock_redis_errors_total{kind}`.
#[cfg(feature = "metrics")]
pub(crate) const REDIS_ERRORS: &str = "redis_lock_redis_errors_total";
/// `redis_lock_layer_rejections_total{reason}`.
#[cfg(feature = "metrics")]
pub(crate) const LAYER_REJECTIONS: &str = "redis_lock_layer_rejections_total";
/// `redis_lock_idempotent_total{outcome}`.
#[cfg(feature = "metrics")]
pub(crate) const IDEMPOTENT: &str = "redis_lock_idempotent_total";
/// `redis_lock_oldest_hold_start_time_seconds`.
#[cfg(feature = "metrics")]
pub(crate) const OLDEST_HOLD_START: &str = "redis_lock_oldest_hold_start_time_seconds";
/// `redis_lock_quarantined`.
#[cfg(feature = "metrics")]
pub(crate) const QUARANTINED: &str = "redis_lock_quarantined";

/// Registers every metric's description (and, for the wait and hold times, the unit) with
/// the recorder installed now, so an exporter can print them (Prometheus's `# HELP`). Call it
/// once after installing the recorder; without it the metrics are recorded all the same.
///
/// Install the recorder before building a client: each client records every counter series
/// it can count, and the gauges, at 0 when it is built, so an alert on
/// `increase(redis_lock_lost_total[5m]) > 0` sees the first lost lease of a process.
pub fn describe_metrics() {
    #[cfg(feature = "metrics")]
    for series in metric_series() {
        let (name, help) = (series.name, series.help);
        match series.shape {
            MetricShape::Counter => metrics::describe_counter!(name, help),
            MetricShape::Gauge => metrics::describe_gauge!(name, help),
            MetricShape::Histogram => {
                metrics::describe_histogram!(name, metrics::Unit::Seconds, help);
            }
        }
    }
}

/// Records every counter series whose labels are known at 0, and the gauges at 0, with the
/// recorder installed now: a series that first appears at 1 shows no increase, so an alert on
/// `increase(redis_lock_lost_total[5m]) > 0` would miss a process's first lost lease
/// (Prometheus's advice: start the series you know at 0). It adds 0, so what another client
/// of the process counted stays. Called once per client.
pub(crate) fn start_at_zero() {
    #[cfg(feature = "metrics")]
    {
        for kind in KINDS {
            for outcome in OUTCOMES {
                let key = kind_outcome_key(ACQUISITIONS, kind, outcome);
                metrics::with_recorder(|recorder| recorder.register_counter(&key, &METADATA))
                    .increment(0);
            }
        }
        for path in HandoverPath::ALL {
            metrics::counter!(HANDOVERS, "path" => path.as_str()).increment(0);
        }
        for reason in LOST_REASONS {
            metrics::counter!(LOST, "reason" => lost_label(reason)).increment(0);
        }
        for outcome in Renewal::ALL {
            metrics::counter!(RENEWALS, "outcome" => outcome.as_str()).increment(0);
        }
        for kind in REDIS_ERROR_KINDS {
            metrics::counter!(REDIS_ERRORS, "kind" => kind).increment(0);
        }
        for reason in RejectionKind::ALL {
            metrics::counter!(LAYER_REJECTIONS, "reason" => reason.as_str()).increment(0);
        }
        for outcome in IdempotentOutcome::ALL {
            metrics::counter!(IDEMPOTENT, "outcome" => outcome.as_str()).increment(0);
        }
        metrics::gauge!(HELD).increment(0.0);
        metrics::gauge!(OLDEST_HOLD_START).increment(0.0);
        metrics::gauge!(WAITING).increment(0.0);
        metrics::gauge!(QUARANTINED).increment(0.0);
    }
}

/// What the `metrics` macros give a metric recorded in this module.
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The key of `name` labelled with `kind`. Its labels are borrowed from a table built once:
/// the `metrics` macros would collect them into a new `Vec` on every acquisition and hold.
#[cfg(feature = "metrics")]
fn kind_key(name: &'static str, kind: &'static str) -> metrics::Key {
    use metrics::{Key, Label};
    static LABELS: LazyLock<Vec<[Label; 1]>> = LazyLock::new(|| {
        KINDS
            .iter()
            .map(|kind| [Label::from_static_parts("kind", kind)])
            .collect()
    });
    match KINDS.iter().position(|known| *known == kind) {
        Some(index) => Key::from_static_labels(name, &LABELS[index]),
        None => Key::from_parts(name, vec![Label::new("kind", kind)]),
    }
}

/// The key of `name` labelled with `kind` and `outcome`, borrowed as [`kind_key`]'s.
#[cfg(feature = "metrics")]
fn kind_outcome_key(name: &'static str, kind: &'static str, outcome: &'static str) -> metrics::Key {
    use metrics::{Key, Label};
    static LABELS: LazyLock<Vec<[Label; 2]>> = LazyLock::new(|| {
        KINDS
            .iter()
            .flat_map(|kind| {
                OUTCOMES.iter().map(move |outcome| {
                    [
                        Label::from_static_parts("kind", kind),
                        Label::from_static_parts("outcome", outcome),
                    ]
                })
            })
            .collect()
    });
    let kind_index = KINDS.iter().position(|known| *known == kind);
    let outcome_index = OUTCOMES.iter().position(|known| *known == outcome);
    match kind_index.zip(outcome_index) {
        Some((kind, outcome)) => {
            Key::from_static_labels(name, &LABELS[kind * OUTCOMES.len() + outcome])
        }
        None => Key::from_parts(
            name,
            vec![Label::new("kind", kind), Label::new("outcome", outcome)],
        ),
    }
}

/// One acquisition on its way: counted as waiting until it ends, and as cancelled when it is
/// dropped before (its future was dropped, say by a timeout of the caller's own).
#[derive(Debug)]
pub(crate) struct AcquireMeter {
    kind: &'static str,
    started: Instant,
    ended: bool,
}

impl AcquireMeter {
    /// An acquisition of `kind` (a [`kind_label`]) asked for now.
    pub(crate) fn start(kind: &'static str) -> Self {
        #[cfg(feature = "metrics")]
        metrics::gauge!(WAITING).increment(1.0);
        Self {
            kind,
            started: Instant::now(),
            ended: false,
        }
    }

    /// Counts how the acquisition ended (`Ok(None)`: a try that found the lock held), and how
    /// long it waited when it got the lock.
    fn end<T>(mut self, result: Result<Option<&T>, &crate::LockError>) {
        self.ended = true;
        self.count(outcome_of(result));
        #[cfg(feature = "metrics")]
        if matches!(result, Ok(Some(_))) {
            let key = kind_key(WAIT_SECONDS, self.kind);
            metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA))
                .record(self.started.elapsed().as_secs_f64());
        }
    }

    fn count(&self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        {
            let key = kind_outcome_key(ACQUISITIONS, self.kind, outcome);
            metrics::with_recorder(|recorder| recorder.register_counter(&key, &METADATA))
                .increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (self.kind, self.started, outcome);
    }
}

impl Drop for AcquireMeter {
    fn drop(&mut self) {
        if !self.ended {
            self.count("cancelled");
        }
        #[cfg(feature = "metrics")]
        metrics::gauge!(WAITING).decrement(1.0);
    }
}

/// One holder's hold: counted as held until dropped, when its length is recorded.
#[derive(Debug)]
pub(crate) struct HoldMeter {
    kind: &'static str,
    since: Instant,
    /// Its place among the holds running, until it ends or is held for a term by design.
    #[cfg(feature = "metrics")]
    running: std::sync::Mutex<Option<oldest_hold::RunningHold>>,
}

impl HoldMeter {
    /// A hold of `kind` that starts now.
    pub(crate) fn start(kind: LockKind) -> Self {
        #[cfg(feature = "metrics")]
        metrics::gauge!(HELD).increment(1.0);
        let since = Instant::now();
        Self {
            kind: kind_label(kind),
            since,
            #[cfg(feature = "metrics")]
            running: std::sync::Mutex::new(Some(oldest_hold::RunningHold::begin(since))),
        }
    }

    /// Leaves this hold out of the oldest hold: a singleton's leadership is held for its
    /// whole term by design, so it is no stuck hold an alert should page for.
    pub(crate) fn held_for_a_term(&self) {
        #[cfg(feature = "metrics")]
        drop(self.running.lock().expect("running hold").take());
    }
}

impl Drop for HoldMeter {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(HELD).decrement(1.0);
            let key = kind_key(HOLD_SECONDS, self.kind);
            metrics::with_recorder(|recorder| recorder.register_histogram(&key, &METADATA))
                .record(self.since.elapsed().as_secs_f64());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (self.kind, self.since);
    }
}

/// Counts a lock handed to a waiter along `path`.
pub(crate) fn handed_over(path: HandoverPath) {
    #[cfg(feature = "metrics")]
    metrics::counter!(HANDOVERS, "path" => path.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = path;
}

/// Counts a lease lost while held.
pub(crate) fn lost(reason: LostReason) {
    #[cfg(feature = "metrics")]
    metrics::counter!(LOST, "reason" => lost_label(reason)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// Counts `count` lease renewals that ended with `outcome`.
pub(crate) fn renewals(outcome: Renewal, count: usize) {
    #[cfg(feature = "metrics")]
    if count > 0 {
        metrics::counter!(RENEWALS, "outcome" => outcome.as_str()).increment(count as u64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome.as_str(), count);
}

/// Moves the count of this process's clients in a restart quarantine: up when one hears of
/// it, down when it ends.
pub(crate) fn quarantine(in_force: bool) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(QUARANTINED).increment(if in_force { 1.0 } else { -1.0 });
    #[cfg(not(feature = "metrics"))]
    let _ = in_force;
}

/// Counts a failed Redis command by the kind of its error.
pub(crate) fn redis_error(kind: ErrorKind) {
    #[cfg(feature = "metrics")]
    metrics::counter!(REDIS_ERRORS, "kind" => redis_error_label(kind)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = redis_error_label(kind);
}

/// Counts a request a layer answered itself, by the rejection's kind.
pub(crate) fn layer_rejection(reason: RejectionKind) {
    #[cfg(feature = "metrics")]
    metrics::counter!(LAYER_REJECTIONS, "reason" => reason.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// Counts a request of the idempotency layer, by what it did.
pub(crate) fn idempotent(outcome: IdempotentOutcome) {
    #[cfg(feature = "metrics")]
    metrics::counter!(IDEMPOTENT, "outcome" => outcome.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome.as_str();
}

/// Awaits an acquisition of `kind` (a [`kind_label`], or `multi`, `redlock`, `segmented`) and
/// counts it: one count per acquisition asked for, whatever it took in Redis.
pub(crate) async fn counted<T>(
    kind: &'static str,
    acquiring: impl Future<Output = crate::Result<T>>,
) -> crate::Result<T> {
    let meter = AcquireMeter::start(kind);
    let acquired = acquiring.await;
    meter.end(acquired.as_ref().map(Some));
    acquired
}

/// [`counted`] for a try, whose `Ok(None)` found the lock held.
pub(crate) async fn counted_try<T>(
    kind: &'static str,
    trying: impl Future<Output = crate::Result<Option<T>>>,
) -> crate::Result<Option<T>> {
    let meter = AcquireMeter::start(kind);
    let acquired = trying.await;
    meter.end(acquired.as_ref().map(Option::as_ref));
    acquired
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;

    #[test]
    fn a_key_from_the_tables_is_the_key_the_macros_build() {
        let built = |kind: &'static str, outcome: &'static str| {
            metrics::Key::from_parts(
                ACQUISITIONS,
                vec![
                    metrics::Label::new("kind", kind),
                    metrics::Label::new("outcome", outcome),
                ],
            )
        };
        for kind in KINDS {
            assert_eq!(
                kind_key(HOLD_SECONDS, kind),
                metrics::Key::from_parts(HOLD_SECONDS, vec![metrics::Label::new("kind", kind)])
            );
            for outcome in OUTCOMES {
                assert_eq!(
                    kind_outcome_key(ACQUISITIONS, kind, outcome),
                    built(kind, outcome)
                );
            }
        }
        // A value outside the tables still gets its labels.
        assert_eq!(
            kind_outcome_key(ACQUISITIONS, "other", "acquired"),
            built("other", "acquired")
        );
    }
}

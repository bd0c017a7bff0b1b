//! What the client counts, through the `metrics` facade (feature `metrics`, on by default):
//! the application installs the recorder and exporter it wants, and without one every call
//! here costs next to nothing. Labels come from small fixed sets (kinds, outcomes, reasons),
//! never from a lock name: names are tenants, accounts, orders, without bound.

use std::future::Future;
#[cfg(feature = "metrics")]
use std::sync::LazyLock;
use std::time::Instant;

use crate::error::ErrorKind;
use crate::lease::LostReason;
use crate::lock_kind::LockKind;

/// Every metric's name, kind and meaning, as [`describe_metrics`] registers them.
const METRICS: [(&str, Shape, &str); 11] = [
    (
        ACQUISITIONS,
        Shape::Counter,
        "Acquisitions asked for, by kind and outcome (acquired, busy, timeout, unavailable, \
         denied, cancelled, shut_down, error).",
    ),
    (
        WAIT_SECONDS,
        Shape::Histogram,
        "Seconds from asking for a lock to holding it, by kind.",
    ),
    (
        HOLD_SECONDS,
        Shape::Histogram,
        "Seconds a lock was held by one holder of this client, by kind.",
    ),
    (
        HANDOVERS,
        Shape::Counter,
        "Locks handed to a waiter, by path: local (between tasks of this client) or redis \
         (granted from the Redis queue).",
    ),
    (
        LOST,
        Shape::Counter,
        "Leases lost while held, by reason (taken, unreachable, expired, data_lost, shut_down).",
    ),
    (HELD, Shape::Gauge, "Locks held by this client now."),
    (
        WAITING,
        Shape::Gauge,
        "Acquisitions of this client waiting for a lock now.",
    ),
    (
        RENEWALS,
        Shape::Counter,
        "Lease renewals by the watchdog, by outcome (renewed, taken, failed).",
    ),
    (
        REDIS_ERRORS,
        Shape::Counter,
        "Redis commands that failed, by kind (unavailable, denied, redis, ...).",
    ),
    (
        LAYER_REJECTIONS,
        Shape::Counter,
        "Requests the layer answered itself instead of running the service, by reason.",
    ),
    (
        IDEMPOTENT,
        Shape::Counter,
        "Requests the idempotency layer handled, by outcome (first, replayed, mismatch, \
         in_progress, not_stored, over_bound, refused, lease_lost, store_failed, unguarded, \
         no_key, rejected).",
    ),
];

/// `redis_lock_acquisitions_total{kind, outcome}`.
pub(crate) const ACQUISITIONS: &str = "redis_lock_acquisitions_total";
/// `redis_lock_wait_seconds{kind}`.
pub(crate) const WAIT_SECONDS: &str = "redis_lock_wait_seconds";
/// `redis_lock_hold_seconds{kind}`.
pub(crate) const HOLD_SECONDS: &str = "redis_lock_hold_seconds";
/// `redis_lock_handovers_total{path}`.
pub(crate) const HANDOVERS: &str = "redis_lock_handovers_total";
/// `redis_lock_lost_total{reason}`.
pub(crate) const LOST: &str = "redis_lock_lost_total";
/// `redis_lock_held`.
pub(crate) const HELD: &str = "redis_lock_held";
/// `redis_lock_waiting`.
pub(crate) const WAITING: &str = "redis_lock_waiting";
/// `redis_lock_renewals_total{outcome}`.
pub(crate) const RENEWALS: &str = "redis_lock_renewals_total";
/// `redis_lock_redis_errors_total{kind}`.
pub(crate) const REDIS_ERRORS: &str = "redis_lock_redis_errors_total";
/// `redis_lock_layer_rejections_total{reason}`.
pub(crate) const LAYER_REJECTIONS: &str = "redis_lock_layer_rejections_total";
/// `redis_lock_idempotent_total{outcome}`.
pub(crate) const IDEMPOTENT: &str = "redis_lock_idempotent_total";

/// What kind of metric a name is.
#[derive(Clone, Copy)]
enum Shape {
    Counter,
    Gauge,
    Histogram,
}

/// Registers every metric's description (and, for the wait and hold times, the unit) with
/// the recorder installed now, so an exporter can print them (Prometheus's `# HELP`). Call it
/// once after installing the recorder; without it the metrics are recorded all the same.
pub fn describe_metrics() {
    #[cfg(feature = "metrics")]
    for (name, shape, help) in METRICS {
        match shape {
            Shape::Counter => metrics::describe_counter!(name, help),
            Shape::Gauge => metrics::describe_gauge!(name, help),
            Shape::Histogram => {
                metrics::describe_histogram!(name, metrics::Unit::Seconds, help);
            }
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = METRICS;
}

/// The label of a lock kind, or of a composite lock (`multi`, `redlock`, `segmented`).
pub(crate) fn kind_label(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "exclusive",
        LockKind::Fair => "fair",
        LockKind::Read => "read",
        LockKind::Write => "write",
        LockKind::Semaphore { .. } => "semaphore",
    }
}

/// Every value of the `kind` label: the lock kinds ([`kind_label`]) and the composite locks.
#[cfg(feature = "metrics")]
const KINDS: [&str; 8] = [
    "exclusive",
    "fair",
    "read",
    "write",
    "semaphore",
    "multi",
    "redlock",
    "segmented",
];

/// Every value of the `outcome` label of `redis_lock_acquisitions_total`.
#[cfg(feature = "metrics")]
const OUTCOMES: [&str; 8] = [
    "acquired",
    "busy",
    "timeout",
    "unavailable",
    "denied",
    "cancelled",
    "shut_down",
    "error",
];

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

/// How one acquisition ended, as `redis_lock_acquisitions_total` counts it.
fn outcome_of<T>(result: Result<Option<&T>, &crate::LockError>) -> &'static str {
    match result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "busy",
        Err(err) => match err.kind() {
            ErrorKind::Timeout | ErrorKind::RestartQuarantine => "timeout",
            ErrorKind::RedisUnavailable | ErrorKind::QuorumUnreachable => "unavailable",
            ErrorKind::AccessDenied => "denied",
            ErrorKind::ShutDown => "shut_down",
            _ => "error",
        },
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
}

impl HoldMeter {
    /// A hold of `kind` that starts now.
    pub(crate) fn start(kind: LockKind) -> Self {
        #[cfg(feature = "metrics")]
        metrics::gauge!(HELD).increment(1.0);
        Self {
            kind: kind_label(kind),
            since: Instant::now(),
        }
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

/// How a waiter got a lock from the holder before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOverPath {
    /// From a task of the same client, without Redis.
    Local,
    /// Granted from the Redis queue by the holder's release (or found granted by a look).
    Redis,
}

impl HandOverPath {
    /// The label `redis_lock_handovers_total` and the lock span show.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Redis => "redis",
        }
    }
}

/// Counts a lock handed to a waiter along `path`.
pub(crate) fn handed_over(path: HandOverPath) {
    #[cfg(feature = "metrics")]
    metrics::counter!(HANDOVERS, "path" => path.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = path;
}

/// The label of a lost lease's reason.
pub(crate) fn lost_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "expired",
        LostReason::Taken => "taken",
        LostReason::Unreachable => "unreachable",
        LostReason::ShutDown => "shut_down",
        LostReason::DataLost => "data_lost",
    }
}

/// Counts a lease lost while held.
pub(crate) fn lost(reason: LostReason) {
    #[cfg(feature = "metrics")]
    metrics::counter!(LOST, "reason" => lost_label(reason)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// Counts `count` lease renewals that ended with `outcome` (`renewed`, `taken`, `failed`).
pub(crate) fn renewals(outcome: &'static str, count: usize) {
    #[cfg(feature = "metrics")]
    if count > 0 {
        metrics::counter!(RENEWALS, "outcome" => outcome).increment(count as u64);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome, count);
}

/// Counts a failed Redis command by the kind of its error.
pub(crate) fn redis_error(kind: ErrorKind) {
    #[cfg(feature = "metrics")]
    {
        let label = match kind {
            ErrorKind::RedisUnavailable => "unavailable",
            ErrorKind::AccessDenied => "denied",
            ErrorKind::ShutDown => "shut_down",
            ErrorKind::InvalidConfig => "invalid_config",
            _ => "redis",
        };
        metrics::counter!(REDIS_ERRORS, "kind" => label).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// Counts a request the layer answered itself, by the rejection's kind.
pub(crate) fn layer_rejection(reason: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(LAYER_REJECTIONS, "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// What the idempotency layer did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdempotentOutcome {
    /// Ran first for its key, and its response was stored.
    First,
    /// Answered with the stored response of its key.
    Replayed,
    /// Its key was first used with another request: 422.
    Mismatch,
    /// The first request for its key still ran when the wait bound passed: 409.
    InProgress,
    /// Ran, and its response is not kept (a server error, 429, or a body that failed).
    NotStored,
    /// Ran, and its response was over the store's bound: only that it ran is kept.
    OverBound,
    /// Ran, and the store refused its response: the lock was no longer its.
    Refused,
    /// Cancelled: its lock's lease was lost while it ran.
    LeaseLost,
    /// Ran, and its response could not be stored (Redis failed).
    StoreFailed,
    /// Ran without its key, Redis being unreachable and the policy failing open.
    Unguarded,
    /// Had no key (or no scope) and ran as if the layer were not there.
    NoKey,
    /// Answered by the layer: a bad key or body, or Redis unreachable.
    Rejected,
}

impl IdempotentOutcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Replayed => "replayed",
            Self::Mismatch => "mismatch",
            Self::InProgress => "in_progress",
            Self::NotStored => "not_stored",
            Self::OverBound => "over_bound",
            Self::Refused => "refused",
            Self::LeaseLost => "lease_lost",
            Self::StoreFailed => "store_failed",
            Self::Unguarded => "unguarded",
            Self::NoKey => "no_key",
            Self::Rejected => "rejected",
        }
    }
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
    fn every_lock_kind_has_its_labels_in_the_table() {
        let kinds = [
            LockKind::Exclusive,
            LockKind::Fair,
            LockKind::Read,
            LockKind::Write,
            LockKind::Semaphore {
                permits: 2,
                take: 1,
            },
        ];
        for kind in kinds {
            assert!(KINDS.contains(&kind_label(kind)), "{kind:?}");
        }
    }

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

//! What the client and the layer count through the `metrics` facade, read back from a
//! recorder installed for the test's thread (a `#[tokio::test]` runs every task the client
//! spawns on that thread): each acquisition's outcome and wait, holds, hand-overs along each
//! path, lost leases by each reason, renewals, Redis errors and the layer's rejections. The
//! lock span and the lost-lease event carry the fields an operator filters on.

#![cfg(feature = "metrics")]

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use metrics::LocalRecorderGuard;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use support::logs::CapturedLogs;
use support::{RedisServer, client, client_with_lease};
use tower::{Layer, ServiceExt, service_fn};
use tower_redis_lock::{
    HeaderKey, IdempotencyLayer, Lease, LockClient, LockGuard, LockLayer, LostReason, MultiLock,
};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(10);

/// Every metric recorded on this thread since the test began. The recorder's snapshots
/// drain it (counters and gauges go back to 0), so they are summed here.
/// A metric's labels, sorted by name.
type Labels = Vec<(String, String)>;

struct Recorded {
    snapshotter: Snapshotter,
    totals: HashMap<(MetricKind, String, Labels), f64>,
    samples: HashMap<(String, Labels), Vec<f64>>,
    _guard: LocalRecorderGuard<'static>,
}

impl Recorded {
    fn start() -> Self {
        // Leaked: the guard borrows the recorder for the whole test.
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        Self {
            snapshotter: recorder.snapshotter(),
            totals: HashMap::new(),
            samples: HashMap::new(),
            _guard: metrics::set_default_local_recorder(recorder),
        }
    }

    fn take(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, name, labels) = parts(key);
            match value {
                DebugValue::Counter(n) => {
                    *self.totals.entry((kind, name, labels)).or_default() += n as f64
                }
                DebugValue::Gauge(v) => {
                    *self.totals.entry((kind, name, labels)).or_default() += v.into_inner()
                }
                DebugValue::Histogram(values) => self
                    .samples
                    .entry((name, labels))
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
            }
        }
    }

    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.take();
        self.totals
            .get(&(MetricKind::Counter, name.to_owned(), sorted(labels)))
            .copied()
            .unwrap_or(0.0) as u64
    }

    /// The total of the series `name` with `labels`, if it was recorded at all (0 included).
    fn series(&mut self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.take();
        self.totals
            .get(&(kind, name.to_owned(), sorted(labels)))
            .copied()
    }

    fn gauge(&mut self, name: &str) -> f64 {
        self.take();
        self.totals
            .get(&(MetricKind::Gauge, name.to_owned(), Vec::new()))
            .copied()
            .unwrap_or(0.0)
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.take();
        self.samples
            .get(&(name.to_owned(), sorted(labels)))
            .cloned()
            .unwrap_or_default()
    }
}

fn parts(key: CompositeKey) -> (MetricKind, String, Labels) {
    let (kind, key) = key.into_parts();
    let (name, labels) = key.into_parts();
    let mut labels: Labels = labels
        .into_iter()
        .map(|label| {
            let (key, value) = label.into_parts();
            (key.to_string(), value.to_string())
        })
        .collect();
    labels.sort();
    (kind, name.as_str().to_owned(), labels)
}

fn sorted(labels: &[(&str, &str)]) -> Labels {
    let mut labels: Labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    labels
}

/// Whether a log line shows `field` with `value` (quoted or not, as fmt writes strings).
fn has_field(line: &str, field: &str, value: &str) -> bool {
    line.contains(&format!("{field}=\"{value}\"")) || line.contains(&format!("{field}={value} "))
}

const ACQUISITIONS: &str = "redis_lock_acquisitions_total";

fn outcome(kind: &'static str, outcome: &'static str) -> [(&'static str, &'static str); 2] {
    [("kind", kind), ("outcome", outcome)]
}

/// Every counter series a client can count, by name, label and the label's values.
const COUNTER_SERIES: [(&str, &str, &[&str]); 6] = [
    ("redis_lock_handovers_total", "path", &["local", "redis"]),
    (
        "redis_lock_lost_total",
        "reason",
        &["taken", "unreachable", "expired", "data_lost", "shut_down"],
    ),
    (
        "redis_lock_renewals_total",
        "outcome",
        &["renewed", "taken", "failed"],
    ),
    (
        "redis_lock_redis_errors_total",
        "kind",
        &[
            "unavailable",
            "denied",
            "shut_down",
            "invalid_config",
            "redis",
        ],
    ),
    (
        "redis_lock_layer_rejections_total",
        "reason",
        &[
            "timeout",
            "redis_unavailable",
            "lease_lost",
            "missing_key",
            "invalid_key",
            "too_many_keys",
            "shut_down",
            "restart_quarantine",
            "permits_mismatch",
            "body_too_large",
            "body_unreadable",
            "invalid_idempotency_key",
            "idempotency_key_reused",
            "idempotency_in_progress",
            "response_not_stored",
            "idempotency_outcome_unknown",
            "misconfigured",
        ],
    ),
    (
        "redis_lock_idempotent_total",
        "outcome",
        &[
            "first",
            "replayed",
            "mismatch",
            "in_progress",
            "not_stored",
            "over_bound",
            "refused",
            "lease_lost",
            "store_failed",
            "unguarded",
            "no_key",
            "rejected",
            "outcome_unknown",
        ],
    ),
];

#[tokio::test]
async fn a_client_just_built_shows_every_series_it_can_count_at_zero() {
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let _locks = client(&server).await;

    // Before any acquisition: an alert on `increase(...) > 0` sees the first count.
    let kinds = [
        "exclusive",
        "fair",
        "read",
        "write",
        "semaphore",
        "multi",
        "redlock",
        "segmented",
    ];
    let outcomes = [
        "acquired",
        "busy",
        "timeout",
        "unavailable",
        "denied",
        "cancelled",
        "shut_down",
        "error",
    ];
    let mut missing = Vec::new();
    let mut check = |name: &str, labels: &[(&str, &str)], kind: MetricKind| {
        let total = recorded.series(kind, name, labels);
        if total != Some(0.0) {
            missing.push(format!("{name}{labels:?}: {total:?}"));
        }
    };
    for kind in kinds {
        for outcome in outcomes {
            check(
                ACQUISITIONS,
                &[("kind", kind), ("outcome", outcome)],
                MetricKind::Counter,
            );
        }
    }
    for (name, label, values) in COUNTER_SERIES {
        for value in values {
            check(name, &[(label, value)], MetricKind::Counter);
        }
    }
    check("redis_lock_held", &[], MetricKind::Gauge);
    check("redis_lock_waiting", &[], MetricKind::Gauge);
    assert!(missing.is_empty(), "not at 0: {missing:#?}");

    // A second client of the process adds nothing: a count stays as it was.
    let second = client(&server).await;
    drop(second.lock("a").unwrap().acquire().await.unwrap());
    let _third = client(&server).await;
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "acquired")),
        1
    );
}

#[tokio::test]
async fn an_acquisition_counts_its_outcome_wait_and_hold_and_the_gauges_return_to_zero() {
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let locks = client(&server).await;
    let lock = locks.lock("tenant-1").unwrap();

    let guard = lock.acquire().await.unwrap();
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "acquired")),
        1
    );
    assert_eq!(recorded.gauge("redis_lock_held"), 1.0);
    assert_eq!(recorded.gauge("redis_lock_waiting"), 0.0);
    let waits = recorded.histogram("redis_lock_wait_seconds", &[("kind", "exclusive")]);
    assert_eq!(waits.len(), 1);
    assert!(
        waits[0] >= 0.0 && waits[0] < SLACK.as_secs_f64(),
        "{waits:?}"
    );
    guard.release().await.unwrap();
    assert_eq!(recorded.gauge("redis_lock_held"), 0.0);
    assert_eq!(
        recorded
            .histogram("redis_lock_hold_seconds", &[("kind", "exclusive")])
            .len(),
        1
    );

    // A read lock is counted under its own kind; no lock name appears in any label.
    let rw = locks.read_write_lock("report-9").unwrap();
    drop(rw.read().acquire().await.unwrap());
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("read", "acquired")),
        1
    );
    recorded.take();
    for (_, _, labels) in recorded.totals.keys() {
        assert!(
            labels
                .iter()
                .all(|(_, v)| !v.contains("tenant") && !v.contains("report")),
            "a lock name as a label: {labels:?}"
        );
    }
}

/// How many acquisitions of `kind` were counted, whatever their outcome.
fn acquisitions_of(recorded: &mut Recorded, kind: &'static str) -> u64 {
    let outcomes = [
        "acquired",
        "busy",
        "timeout",
        "unavailable",
        "denied",
        "cancelled",
        "shut_down",
        "error",
    ];
    outcomes
        .into_iter()
        .map(|outcome_label| recorded.counter(ACQUISITIONS, &outcome(kind, outcome_label)))
        .sum()
}

#[tokio::test]
async fn acquire_all_counts_one_multi_acquisition_as_a_multi_lock_does_not_its_parts() {
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let locks = client(&server).await;
    let names = ["account-1", "account-2"];

    let guards = locks.acquire_all(&names, Lease::Watchdog).await.unwrap();
    drop(guards);
    let guards = locks
        .acquire_all_timeout(&names, Lease::Watchdog, SLACK)
        .await
        .unwrap();
    drop(guards);
    let both = MultiLock::new(names.map(|name| locks.lock(name).unwrap()));
    drop(both.acquire().await.unwrap());
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("multi", "acquired")),
        3
    );
    assert_eq!(acquisitions_of(&mut recorded, "exclusive"), 0);
    let waits = |recorded: &mut Recorded, kind| {
        recorded
            .histogram("redis_lock_wait_seconds", &[("kind", kind)])
            .len()
    };
    assert_eq!(waits(&mut recorded, "multi"), 3);
    assert_eq!(waits(&mut recorded, "exclusive"), 0);

    // A wait bound that passes is one multi timeout.
    let other = client(&server).await;
    let held = other.lock("account-2").unwrap().acquire().await.unwrap();
    let err = locks
        .acquire_all_timeout(&names, Lease::Watchdog, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), tower_redis_lock::ErrorKind::Timeout);
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("multi", "timeout")),
        1
    );
    // The one exclusive acquisition is `held`'s.
    assert_eq!(acquisitions_of(&mut recorded, "exclusive"), 1);
    drop(held);

    // The layer counts a request with two keys once, under its sharing mode.
    let layer = LockLayer::new(
        locks.clone(),
        (HeaderKey::new("x-from"), HeaderKey::new("x-to")),
    );
    let service = layer.layer(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let request = Request::builder()
        .header("x-from", "account-1")
        .header("x-to", "account-2")
        .body(String::new())
        .unwrap();
    let answer = service.oneshot(request).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "acquired")),
        2
    );
    assert_eq!(acquisitions_of(&mut recorded, "multi"), 4);
}

#[tokio::test]
async fn timeouts_busy_tries_cancellations_and_unavailable_redis_are_counted_apart() {
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let holder = client(&server).await;
    let other = client(&server).await;
    let held = holder.lock("order-5").unwrap().acquire().await.unwrap();
    let lock = other.lock("order-5").unwrap();

    let err = lock
        .acquire_timeout(Duration::from_millis(50))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), tower_redis_lock::ErrorKind::Timeout);
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "timeout")),
        1
    );

    assert!(lock.try_acquire().await.unwrap().is_none());
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "busy")),
        1
    );

    // The caller's own bound drops the future: a cancelled acquisition.
    let dropped = tokio::time::timeout(Duration::from_millis(50), lock.acquire()).await;
    assert!(dropped.is_err());
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "cancelled")),
        1
    );
    assert_eq!(recorded.gauge("redis_lock_waiting"), 0.0);
    drop(held);

    // Redis gone: the acquisition is unavailable, and the failed commands are counted.
    let mut server = server;
    let locks = client_with_lease(&server.url(), Duration::from_secs(3)).await;
    server.kill();
    let err = locks.lock("order-6").unwrap().acquire().await.unwrap_err();
    assert_eq!(err.kind(), tower_redis_lock::ErrorKind::RedisUnavailable);
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "unavailable")),
        1
    );
    assert!(recorded.counter("redis_lock_redis_errors_total", &[("kind", "unavailable")]) >= 1);
}

#[tokio::test]
async fn hand_overs_are_counted_by_path_local_and_redis() {
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let first = client(&server).await;
    let second = client(&server).await;
    let lock = first.lock("account-3").unwrap();

    // Local: a second task of the same client waits behind the first.
    let held = lock.acquire().await.unwrap();
    let waiting = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await.map(|guard| guard.fencing_token()) }
    });
    assert!(
        support::eventually(SLACK, || recorded.gauge("redis_lock_waiting") == 1.0).await,
        "the second task never counted as waiting"
    );
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(
        recorded.counter("redis_lock_handovers_total", &[("path", "local")]),
        1
    );

    // Through Redis: another client waits in the Redis queue and is granted on release.
    let held = lock.acquire().await.unwrap();
    let remote = second.lock("account-3").unwrap();
    let waiting = tokio::spawn(async move { remote.acquire().await.map(drop) });
    assert!(support::eventually(SLACK, || !support::queued(&server, "account-3").is_empty()).await);
    held.release().await.unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(
        recorded.counter("redis_lock_handovers_total", &[("path", "redis")]),
        1
    );
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "acquired")),
        4
    );
}

/// Waits for `guard`'s lease to be lost for `reason`, counted once under `label`.
async fn assert_lost(guard: &LockGuard, recorded: &mut Recorded, reason: LostReason, label: &str) {
    let lost = tokio::time::timeout(SLACK, guard.lost_signal().lost())
        .await
        .expect("the lease is lost within SLACK");
    assert_eq!(lost, reason);
    assert_eq!(
        recorded.counter("redis_lock_lost_total", &[("reason", label)]),
        1,
        "{label}"
    );
}

#[tokio::test]
async fn lost_leases_are_counted_by_reason_with_an_event_naming_it() {
    let logs = CapturedLogs::start();
    let mut recorded = Recorded::start();
    let server = RedisServer::start();

    // Taken: an operator force-unlocks; the next renewal finds the lock gone.
    let locks = client_with_lease(&server.url(), Duration::from_millis(600)).await;
    let lock = locks.lock("invoice-1").unwrap();
    let guard = lock.acquire().await.unwrap();
    assert!(lock.force_unlock().await.unwrap());
    assert_lost(&guard, &mut recorded, LostReason::Taken, "taken").await;
    assert!(recorded.counter("redis_lock_renewals_total", &[("outcome", "taken")]) >= 1);
    drop(guard);

    // Renewed: a held lock is renewed by the watchdog.
    let guard = lock.acquire().await.unwrap();
    assert!(
        support::eventually(SLACK, || {
            recorded.counter("redis_lock_renewals_total", &[("outcome", "renewed")]) >= 1
        })
        .await
    );
    drop(guard);

    // Expired: a fixed lease runs out while held.
    let fixed = lock
        .clone()
        .with_lease(Lease::Fixed(Duration::from_millis(100)));
    let guard = fixed.acquire().await.unwrap();
    assert_lost(&guard, &mut recorded, LostReason::Expired, "expired").await;
    drop(guard);

    // Shut down: the client stops while holding.
    let other = client(&server).await;
    let guard = other.lock("invoice-2").unwrap().acquire().await.unwrap();
    other.shutdown().await;
    assert_lost(&guard, &mut recorded, LostReason::ShutDown, "shut_down").await;

    // Data lost: Redis is flushed under a held lock (its epoch goes with it).
    let guard = lock.acquire().await.unwrap();
    server.cmd::<()>(&["FLUSHALL"]);
    assert_lost(&guard, &mut recorded, LostReason::DataLost, "data_lost").await;
    drop(guard);

    // Unreachable: Redis dies under a held lock (a second server: the first quarantines
    // new locks after losing its data).
    let mut server = RedisServer::start();
    let locks = client_with_lease(&server.url(), Duration::from_millis(900)).await;
    let guard = locks.lock("invoice-3").unwrap().acquire().await.unwrap();
    server.kill();
    assert_lost(
        &guard,
        &mut recorded,
        LostReason::Unreachable,
        "unreachable",
    )
    .await;
    assert!(recorded.counter("redis_lock_renewals_total", &[("outcome", "failed")]) >= 1);

    // Each loss is a warning that names its reason.
    let events = logs.lines_with("lock lease lost");
    for reason in ["taken", "expired", "data_lost", "shut_down", "unreachable"] {
        assert!(
            events.iter().any(|line| has_field(line, "reason", reason)),
            "{reason}: {events:#?}"
        );
    }
}

#[tokio::test]
async fn the_layer_counts_its_rejections_and_its_span_names_kind_hand_over_and_tokens() {
    let logs = CapturedLogs::start();
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let locks: LockClient = client(&server).await;
    let layer = LockLayer::new(locks.clone(), HeaderKey::new("x-tenant-id"))
        .wait_timeout(Duration::from_millis(50));
    let service = layer.layer(service_fn(|_: Request<String>| async {
        tracing::info!("handler ran");
        Ok::<_, Infallible>(Response::new("ok".to_owned()))
    }));
    let request = || {
        Request::builder()
            .uri("/orders")
            .header("x-tenant-id", "acme")
            .body(String::new())
            .unwrap()
    };

    let answer = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let ran = logs.lines_with("handler ran");
    assert_eq!(ran.len(), 1);
    assert!(has_field(&ran[0], "kind", "exclusive"), "{ran:?}");
    assert!(has_field(&ran[0], "handover", "none"), "{ran:?}");
    assert!(ran[0].contains("tokens=["), "{ran:?}");

    let held = locks.lock("acme").unwrap().acquire().await.unwrap();
    let answer = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        recorded.counter(
            "redis_lock_layer_rejections_total",
            &[("reason", "timeout")]
        ),
        1
    );
    assert_eq!(
        recorded.counter(ACQUISITIONS, &outcome("exclusive", "timeout")),
        1
    );
    drop(held);
}

#[tokio::test]
async fn the_idempotency_layer_counts_what_it_did_with_each_request() {
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let locks: LockClient = client(&server).await;
    let layer = IdempotencyLayer::new(locks.clone());
    let service = layer.layer(service_fn(
        |request: Request<UnsyncBoxBody<Bytes, Infallible>>| async move {
            let status = if request.uri().path() == "/fail" {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::CREATED
            };
            let mut response = Response::new(Full::new(Bytes::from_static(b"done")).boxed_unsync());
            *response.status_mut() = status;
            Ok::<_, Infallible>(response)
        },
    ));
    let send = |path: &'static str, key: Option<&'static str>, body: &'static str| {
        let service = service.clone();
        async move {
            let mut request = Request::post(path);
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            let request = request
                .body(Full::new(Bytes::from_static(body.as_bytes())).boxed_unsync())
                .unwrap();
            service.oneshot(request).await.unwrap().status()
        }
    };
    assert_eq!(send("/orders", Some("k"), "a").await, StatusCode::CREATED);
    assert_eq!(send("/orders", Some("k"), "a").await, StatusCode::CREATED);
    assert_eq!(send("/orders", Some("k"), "a").await, StatusCode::CREATED);
    assert_eq!(
        send("/orders", Some("k"), "b").await,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        send("/fail", Some("f"), "").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(send("/orders", None, "").await, StatusCode::CREATED);
    assert_eq!(
        send("/orders", Some("two words"), "").await,
        StatusCode::BAD_REQUEST
    );

    let idempotent = "redis_lock_idempotent_total";
    for (outcome, count) in [
        ("first", 1),
        ("replayed", 2),
        ("mismatch", 1),
        ("not_stored", 1),
        ("no_key", 1),
        ("rejected", 1),
        ("in_progress", 0),
    ] {
        assert_eq!(
            recorded.counter(idempotent, &[("outcome", outcome)]),
            count,
            "{outcome}"
        );
    }
    // Its answers are the layers' rejections too, by reason, as the lock layer's are.
    for (reason, count) in [
        ("idempotency_key_reused", 1),
        ("invalid_idempotency_key", 1),
        ("idempotency_in_progress", 0),
    ] {
        assert_eq!(
            recorded.counter("redis_lock_layer_rejections_total", &[("reason", reason)]),
            count,
            "{reason}"
        );
    }
}

#[tokio::test]
async fn singletons_count_their_leaderships_and_schedules_their_ticks() {
    let mut recorded = Recorded::start();
    let server = RedisServer::start();
    let locks = client_with_lease(&server.url(), Duration::from_secs(5)).await;

    // Every series of a singleton and a schedule starts at 0 when it is made.
    let singleton = locks.singleton("reconcile").unwrap();
    let schedule = locks
        .schedule("report", Duration::from_millis(200))
        .unwrap();
    let changes = "redis_lock_leadership_changes_total";
    let ticks = "redis_lock_ticks_total";
    for change in ["gained", "lost", "resigned"] {
        let labels = [("name", "reconcile"), ("change", change)];
        assert_eq!(
            recorded.series(MetricKind::Counter, changes, &labels),
            Some(0.0)
        );
    }
    for outcome in ["run", "skipped", "missed"] {
        let labels = [("name", "report"), ("outcome", outcome)];
        assert_eq!(
            recorded.series(MetricKind::Counter, ticks, &labels),
            Some(0.0)
        );
    }
    let leader = |recorded: &mut Recorded| {
        recorded.series(
            MetricKind::Gauge,
            "redis_lock_leader",
            &[("name", "reconcile")],
        )
    };
    assert_eq!(leader(&mut recorded), Some(0.0));

    // Leading sets the gauge; a shutdown resigns.
    let (led, leading) = tokio::sync::oneshot::channel();
    let mut led = Some(led);
    let handle = singleton.spawn(move |leadership| {
        if let Some(led) = led.take() {
            let _ = led.send(());
        }
        async move {
            leadership.stopping().await;
        }
    });
    leading.await.expect("the singleton leads");
    assert_eq!(leader(&mut recorded), Some(1.0));
    handle.shutdown().await.unwrap();
    assert_eq!(leader(&mut recorded), Some(0.0));
    assert_eq!(
        recorded.counter(changes, &[("name", "reconcile"), ("change", "gained")]),
        1
    );
    assert_eq!(
        recorded.counter(changes, &[("name", "reconcile"), ("change", "resigned")]),
        1
    );

    // A job of 450 ms every 200 ms runs and skips the ticks it overran.
    let (ran, mut runs) = tokio::sync::mpsc::unbounded_channel();
    let handle = schedule.spawn(move |tick| {
        let ran = ran.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(450)).await;
            let _ = ran.send(tick.number());
        }
    });
    let mut numbers = Vec::new();
    while numbers.len() < 3 {
        numbers.push(
            tokio::time::timeout(SLACK, runs.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    handle.shutdown().await.unwrap();
    let run = recorded.counter(ticks, &[("name", "report"), ("outcome", "run")]);
    let skipped = recorded.counter(ticks, &[("name", "report"), ("outcome", "skipped")]);
    assert!(run >= 3, "three ticks run: {run}");
    // Between the first and the last run each tick was run or skipped, and counted so.
    assert!(
        run + skipped > numbers[2] - numbers[0],
        "runs {numbers:?}: {run} counted run, {skipped} skipped"
    );
    assert!(
        skipped >= 2,
        "a job of 450 ms overran at least one tick twice: {skipped}"
    );
    assert_eq!(
        recorded.counter(ticks, &[("name", "report"), ("outcome", "missed")]),
        0
    );
}

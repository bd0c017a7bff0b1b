//! What Prometheus scrapes, through the exporter the examples use: every series in the text
//! is one the crate lists (`metric_series`), with its labels and their values, so the rules
//! and the dashboard in `contrib/` can rely on the list; the wait and hold histograms carry
//! the buckets the rules read; and the two gauges an alert reads while something lasts (the
//! oldest hold, a restart quarantine) move as it begins and ends, a singleton's leadership
//! left out of the oldest hold.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use support::{RedisServer, client};
use tower_redis_lock::{HISTOGRAM_BUCKETS, MetricShape, metric_series};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(10);

/// One sample line of the exporter's text: its name, labels and value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A recorder with the buckets `contrib/` expects, for this thread only.
fn exporter() -> &'static PrometheusRecorder {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("redis_lock_".into()), HISTOGRAM_BUCKETS)
        .unwrap()
        .build_recorder();
    // Leaked: the thread's recorder is borrowed for the whole test.
    let recorder: &'static PrometheusRecorder = Box::leak(Box::new(recorder));
    std::mem::forget(metrics::set_default_local_recorder(recorder));
    recorder
}

fn scrape(recorder: &PrometheusRecorder) -> Vec<Sample> {
    let text = recorder.handle().render();
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a value");
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').expect("label=value");
                    (key.to_owned(), value.trim_matches('"').to_owned())
                })
                .collect();
            Sample {
                name: name.to_owned(),
                labels,
                value: value.parse().expect("a number"),
            }
        })
        .collect()
}

fn gauge(recorder: &PrometheusRecorder, name: &str) -> f64 {
    scrape(recorder)
        .into_iter()
        .find(|sample| sample.name == name && sample.labels.is_empty())
        .unwrap_or_else(|| panic!("{name} is exported"))
        .value
}

/// Unix time now, in seconds, as the gauge of the oldest hold writes it.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test]
async fn every_series_exported_is_one_the_crate_lists_with_its_labels_and_their_values() {
    let recorder = exporter();
    let server = RedisServer::start();
    let locks = client(&server).await;
    tower_redis_lock::describe_metrics();
    // A wait, a hold, a busy try, a singleton and a schedule: every family shows.
    let guard = locks.lock("a").unwrap().acquire().await.unwrap();
    assert!(
        locks
            .lock("a")
            .unwrap()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
    let _singleton = locks.singleton("reconcile").unwrap();
    let _schedule = locks.schedule("report", Duration::from_secs(60)).unwrap();

    let listed: BTreeMap<_, _> = metric_series()
        .into_iter()
        .map(|series| (series.name, series))
        .collect();
    let samples = scrape(recorder);
    let mut seen = BTreeSet::new();
    let mut buckets = BTreeSet::new();
    for sample in &samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| sample.name.strip_suffix(suffix))
            .filter(|family| {
                listed
                    .get(family)
                    .is_some_and(|s| s.shape == MetricShape::Histogram)
            })
            .unwrap_or(&sample.name);
        let series = listed
            .get(family)
            .unwrap_or_else(|| panic!("{} is not in metric_series()", sample.name));
        seen.insert(series.name);
        let mut labels = sample.labels.clone();
        if let Some(le) = labels.remove("le") {
            assert!(sample.name.ends_with("_bucket"), "{sample:?}");
            buckets.insert(le);
        }
        let names: BTreeSet<&str> = labels.keys().map(String::as_str).collect();
        let expected: BTreeSet<&str> = series.labels.iter().map(|label| label.name).collect();
        assert_eq!(names, expected, "{sample:?}");
        for label in &series.labels {
            if let Some(values) = &label.values {
                assert!(
                    values.contains(&labels[label.name].as_str()),
                    "{sample:?}: {} is not a listed value",
                    label.name
                );
            }
        }
    }
    // Every family the crate lists was exported, histograms with the buckets the rules read.
    let missing: Vec<_> = listed.keys().filter(|name| !seen.contains(*name)).collect();
    assert!(missing.is_empty(), "listed, not exported: {missing:?}");
    for bound in ["0.001", "1", "600", "+Inf"] {
        assert!(buckets.contains(bound), "bucket {bound} in {buckets:?}");
    }
}

#[tokio::test]
async fn the_oldest_hold_gauge_shows_when_the_longest_running_hold_began_and_0_without_one() {
    let recorder = exporter();
    let server = RedisServer::start();
    let locks = client(&server).await;
    let oldest = "redis_lock_oldest_hold_start_time_seconds";
    assert_eq!(gauge(recorder, oldest), 0.0);

    // Whole milliseconds: the gauge is read back from text, and the two clocks are read apart.
    let tolerance = 0.001;
    let before_first = unix_now();
    let first = locks.lock("first").unwrap().acquire().await.unwrap();
    let after_first = unix_now();
    let began = gauge(recorder, oldest);
    assert!(
        began >= before_first - tolerance && began <= after_first + tolerance,
        "{before_first} <= {began} <= {after_first}"
    );
    // A later hold leaves the oldest where it was; its end moves the gauge to the next.
    let before_second = unix_now();
    let second = locks.lock("second").unwrap().acquire().await.unwrap();
    assert_eq!(gauge(recorder, oldest), began);
    first.release().await.unwrap();
    let next = gauge(recorder, oldest);
    assert!(
        next >= before_second - tolerance && next <= unix_now() + tolerance,
        "{before_second} <= {next}"
    );
    second.release().await.unwrap();
    assert_eq!(gauge(recorder, oldest), 0.0);

    // A singleton's leadership is held for its whole term by design: no stuck hold.
    let (led, leading) = tokio::sync::oneshot::channel();
    let mut led = Some(led);
    let handle = locks
        .singleton("reconcile")
        .unwrap()
        .spawn(move |leadership| {
            if let Some(led) = led.take() {
                let _ = led.send(());
            }
            async move {
                leadership.stopping().await;
            }
        });
    leading.await.expect("the singleton leads");
    assert_eq!(gauge(recorder, "redis_lock_held"), 1.0);
    assert_eq!(gauge(recorder, oldest), 0.0);
    handle.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_quarantine_gauge_is_1_while_a_restart_quarantine_keeps_locks_and_0_after() {
    let recorder = exporter();
    let server = RedisServer::start();
    server.wait_until_up_for(2);
    server.provision_epoch("lock:");
    let locks = client(&server).await;
    assert_eq!(gauge(recorder, "redis_lock_quarantined"), 0.0);

    // The epoch starts a quarantine of two seconds, as after a restart.
    let (seconds, micros): (u64, u64) = server.cmd(&["TIME"]);
    let until_ms = seconds * 1000 + micros / 1000 + 2000;
    let epoch = format!("{} {until_ms} 0", seconds * 1_000_000 + micros);
    let _: () = server.cmd(&["SET", "lock:epoch", &epoch]);
    let lock = locks.lock("tenant-1").unwrap();
    let acquiring = lock.acquire();
    tokio::pin!(acquiring);
    // Polled, with a bound: the gauge has no signal of its own to wait on.
    let deadline = Instant::now() + SLACK;
    let mut in_force = false;
    while !in_force && Instant::now() < deadline {
        tokio::select! {
            acquired = &mut acquiring => panic!("acquired during the quarantine: {acquired:?}"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        in_force = gauge(recorder, "redis_lock_quarantined") == 1.0;
    }
    assert!(in_force, "the gauge showed the quarantine");
    let guard = tokio::time::timeout(SLACK, acquiring)
        .await
        .expect("the quarantine ends")
        .unwrap();
    // The quarantine's end is cleared by the client's own timer, at its end.
    let deadline = Instant::now() + SLACK;
    while gauge(recorder, "redis_lock_quarantined") != 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gauge(recorder, "redis_lock_quarantined"), 0.0);
    guard.release().await.unwrap();
}

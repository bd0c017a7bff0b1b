//! What Prometheus scrapes, through the exporter the examples use: every series in the text
//! is one the crate lists (`metric_series`), with its labels and their values, so the rules
//! and the dashboard in `contrib/` can rely on the list; the wait and hold histograms carry
//! the buckets the rules read; and the gauge of a restart quarantine in force moves as it
//! begins and ends (the oldest hold's: `tests/metrics_oldest_hold.rs`).

#![cfg(feature = "metrics")]

mod support;

#[path = "support/exported.rs"]
mod exported;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use exported::{exporter, gauge, scrape};
use support::{RedisServer, client};
use tower_redis_lock::{MetricShape, metric_series};

/// Bound for what normally takes milliseconds; generous because CI machines are shared.
const SLACK: Duration = Duration::from_secs(10);

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

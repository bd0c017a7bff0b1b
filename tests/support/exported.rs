//! The Prometheus exporter the examples use, as a test's own recorder, and its text read
//! back: what Prometheus would scrape. Each test file takes what it needs.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};
use tower_redis_lock::HISTOGRAM_BUCKETS;

/// One sample line of the exporter's text: its name, labels and value.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
}

/// A recorder with the buckets `contrib/` expects, for this thread only.
pub(crate) fn exporter() -> &'static PrometheusRecorder {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("redis_lock_".into()), HISTOGRAM_BUCKETS)
        .unwrap()
        .build_recorder();
    // Leaked: the thread's recorder is borrowed for the whole test.
    let recorder: &'static PrometheusRecorder = Box::leak(Box::new(recorder));
    std::mem::forget(metrics::set_default_local_recorder(recorder));
    recorder
}

pub(crate) fn scrape(recorder: &PrometheusRecorder) -> Vec<Sample> {
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

pub(crate) fn gauge(recorder: &PrometheusRecorder, name: &str) -> f64 {
    scrape(recorder)
        .into_iter()
        .find(|sample| sample.name == name && sample.labels.is_empty())
        .unwrap_or_else(|| panic!("{name} is exported"))
        .value
}

/// Unix time now, in seconds, as the gauge of the oldest hold writes it.
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

//! The traffic both demo load generators send (`loadgen`, `limitgen`): which tenant each
//! request is for, and the concurrent `POST /tenants/{tenant}/orders` that carry it to the
//! instances, each answer read back as the handler's own report.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::de::DeserializeOwned;

/// Which tenant each of `requests` is for (`t0` … `t<tenants - 1>`): half the traffic to the
/// `hot` first ones. Seeded, so every run sends the same.
pub(crate) fn plan(requests: usize, tenants: usize, hot: usize) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(7);
    (0..requests)
        .map(|_| {
            let tenant = if rng.random_bool(0.5) {
                rng.random_range(0..hot)
            } else {
                rng.random_range(hot..tenants)
            };
            format!("t{tenant}")
        })
        .collect()
}

/// What the instances answered: each handler's report, each answered request's latency (µs),
/// and how many requests failed (no answer, an error status, or a body that is no report).
pub(crate) struct Answers<T> {
    pub(crate) reports: Vec<T>,
    pub(crate) latencies_us: Vec<u64>,
    pub(crate) failures: usize,
}

/// Sends `plan` from `concurrency` workers, round-robin over `targets`.
pub(crate) async fn send<T>(
    targets: &[String],
    concurrency: usize,
    plan: Arc<Vec<String>>,
) -> Answers<T>
where
    T: DeserializeOwned + Send + 'static,
{
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let next = Arc::new(AtomicUsize::new(0));
    let targets = Arc::new(targets.to_vec());
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, next, targets, plan) =
                (client.clone(), next.clone(), targets.clone(), plan.clone());
            tokio::spawn(async move {
                let mut answers = Answers {
                    reports: Vec::new(),
                    latencies_us: Vec::new(),
                    failures: 0,
                };
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(tenant) = plan.get(i) else { break };
                    let target = &targets[i % targets.len()];
                    let request = hyper::Request::post(format!("{target}/tenants/{tenant}/orders"))
                        .body(Empty::new())
                        .expect("request");
                    let sent = Instant::now();
                    // Far past the layer's 10 s wait bound: a request that gets no answer by
                    // then is stuck, not waiting.
                    let outcome =
                        tokio::time::timeout(Duration::from_secs(30), client.request(request))
                            .await;
                    let response = match outcome {
                        Ok(Ok(response)) if response.status().is_success() => response,
                        other => {
                            eprintln!("request to {target} for {tenant} failed: {other:?}");
                            answers.failures += 1;
                            continue;
                        }
                    };
                    let body = response.into_body().collect().await.map(|b| b.to_bytes());
                    answers.latencies_us.push(sent.elapsed().as_micros() as u64);
                    match body.ok().and_then(|b| serde_json::from_slice::<T>(&b).ok()) {
                        Some(report) => answers.reports.push(report),
                        None => answers.failures += 1,
                    }
                }
                answers
            })
        })
        .collect();
    let mut all = Answers {
        reports: Vec::new(),
        latencies_us: Vec::new(),
        failures: 0,
    };
    for worker in workers {
        let answers = worker.await.expect("worker");
        all.reports.extend(answers.reports);
        all.latencies_us.extend(answers.latencies_us);
        all.failures += answers.failures;
    }
    all
}

/// The `p`th percentile of `sorted` (0 when empty).
pub(crate) fn percentile(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) * p) / 100]
}

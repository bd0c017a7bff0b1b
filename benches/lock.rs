//! Criterion benches of the lock engine against a real redis-server.
//!
//! Each figure sits next to a PING round trip measured in the same run, so they can be read
//! as ratios. `./scripts/bench.sh` runs them on a throw-away server (passed in as
//! `LOCK_BENCH_REDIS_URL`) next to `redis-benchmark -t ping -c 1`; without that variable the
//! bench starts its own server.

#![allow(missing_docs)]

#[path = "shared/common.rs"]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{bench_ping, runtime, take_turns};
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use tower::{Layer, ServiceExt, service_fn};
use tower_redis_lock::{DEFAULT_PREFIX, LockClient, LockKeys, LockLayer};

/// A two-thread runtime and the URL of the server to bench against: `LOCK_BENCH_REDIS_URL`,
/// or a server of the bench's own (kept alive by the returned handle).
fn setup() -> (
    tokio::runtime::Runtime,
    String,
    Option<support::RedisServer>,
) {
    let runtime = runtime();
    match std::env::var("LOCK_BENCH_REDIS_URL") {
        Ok(url) => (runtime, url, None),
        Err(_) => {
            let server = support::RedisServer::start();
            (runtime, server.url(), Some(server))
        }
    }
}

fn lock_benches(c: &mut Criterion) {
    let (runtime, url, _own_server) = setup();
    let (first, second) = runtime.block_on(async {
        let first = LockClient::connect(&url).await.unwrap();
        let second = LockClient::connect(&url).await.unwrap();
        (first, second)
    });

    let mut group = c.benchmark_group("lock");
    group.measurement_time(Duration::from_secs(5));

    bench_ping(&mut group, &runtime, &url);

    let uncontended = first.lock("bench:uncontended").unwrap();
    group.bench_function("uncontended_acquire_release", |b| {
        b.to_async(&runtime).iter(|| async {
            uncontended
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        });
    });

    // Two clients (two instances) take turns on one key; the figure is the time per
    // acquisition, hand-over included.
    let contended = [
        first.lock("bench:contended").unwrap(),
        second.lock("bench:contended").unwrap(),
    ];
    group.bench_function("contended_handover_two_clients", |b| {
        b.to_async(&runtime)
            .iter_custom(|iterations| take_turns(contended.clone(), iterations));
    });
    group.finish();
    runtime.block_on(async {
        first.shutdown().await;
        second.shutdown().await;
    });
}

/// Lock names to Redis keys: the work done for every lock and every request.
fn key_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("keys");
    let plain = "tenant-4f1c9a7e-acme-orders";
    let braces = "{tenant}%{acme}%{orders}%{4f1c9a7e}";
    group.bench_function("escape_plain_name", |b| {
        b.iter(|| LockKeys::new(DEFAULT_PREFIX, std::hint::black_box(plain)).unwrap());
    });
    group.bench_function("escape_name_with_braces", |b| {
        b.iter(|| LockKeys::new(DEFAULT_PREFIX, std::hint::black_box(braces)).unwrap());
    });
    group.finish();
}

/// The in-process paths: the local key table handing a lock between two tasks of one client
/// (no Redis but once per thousand hand-overs), and the layer around a trivial service with
/// and without locking.
fn local_benches(c: &mut Criterion) {
    let (runtime, url, _own_server) = setup();
    let locks = runtime.block_on(async {
        LockClient::builder(&url)
            .local_handover_limit(1_000)
            .local_handover_window(Duration::from_secs(20))
            .build()
            .await
            .unwrap()
    });
    let mut group = c.benchmark_group("local");
    group.measurement_time(Duration::from_secs(5));

    let cohort = locks.lock("bench:cohort").unwrap();
    group.bench_function("handover_between_two_tasks", |b| {
        b.to_async(&runtime)
            .iter_custom(|iterations| take_turns([cohort.clone(), cohort.clone()], iterations));
    });

    let trivial = service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
    group.bench_function("trivial_service_without_layer", |b| {
        b.to_async(&runtime).iter(|| {
            let service = trivial;
            async move { service.oneshot(Request::new(())).await.unwrap() }
        });
    });
    // A new key per request out of a thousand, so each request pays its acquisition and the
    // release of the one before runs off the request path.
    let layered = LockLayer::new(locks.clone(), |request: &Request<()>| {
        request
            .headers()
            .get("x-key")
            .map(|key| key.to_str().unwrap().to_owned())
    })
    .layer(trivial);
    let counter = AtomicU64::new(0);
    group.bench_function("trivial_service_with_layer", |b| {
        b.to_async(&runtime).iter(|| {
            let service = layered.clone();
            let key = counter.fetch_add(1, Ordering::Relaxed) % 1_000;
            async move {
                let request = Request::builder()
                    .header("x-key", format!("bench:layer:{key}"))
                    .body(())
                    .unwrap();
                let response = service.oneshot(request).await.unwrap();
                assert_eq!(response.status(), 200);
            }
        });
    });
    group.finish();
    runtime.block_on(locks.shutdown());
}

criterion_group!(benches, lock_benches, key_benches, local_benches);
criterion_main!(benches);

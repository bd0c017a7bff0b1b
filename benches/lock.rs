//! Criterion benches of the lock engine against a real redis-server.
//!
//! Each figure sits next to a PING round trip measured in the same run, so they can be read
//! as ratios. `./scripts/bench.sh` runs them on a throw-away server (passed in as
//! `LOCK_BENCH_REDIS_URL`) next to `redis-benchmark -t ping -c 1`; without that variable the
//! bench starts its own server.

#![allow(missing_docs)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tower_redis_lock::LockClient;

fn lock_benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let own_server;
    let url = match std::env::var("LOCK_BENCH_REDIS_URL") {
        Ok(url) => url,
        Err(_) => {
            own_server = support::RedisServer::start();
            own_server.url()
        }
    };
    let (first, second, mut ping_conn) = runtime.block_on(async {
        let first = LockClient::connect(&url).await.unwrap();
        let second = LockClient::connect(&url).await.unwrap();
        let ping_conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        (first, second, ping_conn)
    });

    let mut group = c.benchmark_group("lock");
    group.measurement_time(Duration::from_secs(5));

    group.bench_function("ping_round_trip", |b| {
        b.to_async(&runtime).iter(|| {
            let mut conn = ping_conn.clone();
            async move {
                let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
            }
        });
    });
    let _ = &mut ping_conn;

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
    group.bench_function("contended_handoff_two_clients", |b| {
        b.to_async(&runtime).iter_custom(|iterations| {
            let contended = contended.clone();
            async move {
                let started = Instant::now();
                let tasks: Vec<_> = contended
                    .into_iter()
                    .map(|lock| {
                        tokio::spawn(async move {
                            for _ in 0..iterations.div_ceil(2) {
                                lock.acquire().await.unwrap().release().await.unwrap();
                            }
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await.unwrap();
                }
                started.elapsed()
            }
        });
    });
    group.finish();
    runtime.block_on(async {
        first.shutdown().await;
        second.shutdown().await;
    });
}

criterion_group!(benches, lock_benches);
criterion_main!(benches);

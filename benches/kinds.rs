//! Criterion benches of each lock kind against real redis-server processes, next to the
//! exclusive lock and a PING round trip measured in the same run, so they read as ratios.
//!
//! One server serves every kind but RedLock, which gets five of its own. `./scripts/bench.sh`
//! runs this after the engine's benches; `cargo bench --bench kinds` runs it alone.

#![allow(missing_docs)]

#[path = "shared/common.rs"]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{bench_ping, runtime, take_turns};
use criterion::{Criterion, criterion_group, criterion_main};
use tower_redis_lock::{LockClient, MultiLock, RedLock};

/// Times `iterations` runs of `round`, one after the other.
async fn rounds<F: Future<Output = ()>>(iterations: u64, mut round: impl FnMut() -> F) -> Duration {
    let started = Instant::now();
    for _ in 0..iterations {
        round().await;
    }
    started.elapsed()
}

fn kind_benches(c: &mut Criterion) {
    let runtime = runtime();
    let server = support::RedisServer::start();
    let quorum_servers: Vec<support::RedisServer> =
        (0..5).map(|_| support::RedisServer::start()).collect();
    let (first, second, quorum_clients) = runtime.block_on(async {
        let first = LockClient::connect(&server.url()).await.unwrap();
        let second = LockClient::connect(&server.url()).await.unwrap();
        let mut quorum_clients = Vec::new();
        for quorum_server in &quorum_servers {
            quorum_clients.push(LockClient::connect(&quorum_server.url()).await.unwrap());
        }
        (first, second, quorum_clients)
    });

    let mut group = c.benchmark_group("kinds");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    group.sample_size(20);

    bench_ping(&mut group, &runtime, &server.url());

    // One task taking and releasing a free lock of each kind.
    let rw = first.read_write_lock("bench:rw").unwrap();
    let single = [
        ("exclusive", first.lock("bench:exclusive").unwrap()),
        ("fair", first.fair_lock("bench:fair").unwrap()),
        ("read", rw.read()),
        ("write", rw.write()),
    ];
    for (kind, lock) in single {
        group.bench_function(format!("uncontended_{kind}"), |b| {
            b.to_async(&runtime).iter(|| async {
                lock.acquire().await.unwrap().release().await.unwrap();
            });
        });
    }
    // One permit of a semaphore, next to the exclusive lock above.
    let semaphore = first.semaphore("bench:semaphore", 4).unwrap();
    group.bench_function("uncontended_semaphore_1_of_4", |b| {
        b.to_async(&runtime).iter(|| async {
            semaphore.acquire().await.unwrap().release().await.unwrap();
        });
    });
    let multi = MultiLock::new(
        ["bench:multi:a", "bench:multi:b", "bench:multi:c"].map(|name| first.lock(name).unwrap()),
    );
    group.bench_function("uncontended_multi_of_3", |b| {
        b.to_async(&runtime).iter(|| async {
            multi.acquire().await.unwrap().release().await.unwrap();
        });
    });
    let segmented = first.segmented_lock("bench:segmented", 4).unwrap();
    group.bench_function("uncontended_segment_1_of_4", |b| {
        b.to_async(&runtime).iter(|| async {
            segmented.acquire().await.unwrap().release().await.unwrap();
        });
    });
    let redlock = RedLock::new(quorum_clients.clone(), "bench:redlock").unwrap();
    group.bench_function("uncontended_redlock_5_servers", |b| {
        b.to_async(&runtime).iter(|| async {
            redlock.acquire().await.unwrap().release().await.unwrap();
        });
    });

    // Two clients (two instances) on one name: the time per acquisition, hand-over included
    // for the kinds that exclude, side by side for readers.
    let second_rw = second.read_write_lock("bench:rw:two").unwrap();
    let first_rw = first.read_write_lock("bench:rw:two").unwrap();
    let pairs = [
        (
            "exclusive",
            [
                first.lock("bench:two:exclusive").unwrap(),
                second.lock("bench:two:exclusive").unwrap(),
            ],
        ),
        (
            "fair",
            [
                first.fair_lock("bench:two:fair").unwrap(),
                second.fair_lock("bench:two:fair").unwrap(),
            ],
        ),
        ("write", [first_rw.write(), second_rw.write()]),
        ("read", [first_rw.read(), second_rw.read()]),
    ];
    for (kind, locks) in pairs {
        group.bench_function(format!("two_clients_{kind}"), |b| {
            b.to_async(&runtime)
                .iter_custom(|iterations| take_turns(locks.clone(), iterations));
        });
    }
    // Two clients on a semaphore of one permit: they take turns, as on the exclusive lock.
    let semaphores = [
        first.semaphore("bench:two:semaphore", 1).unwrap(),
        second.semaphore("bench:two:semaphore", 1).unwrap(),
    ];
    group.bench_function("two_clients_semaphore_1_of_1", |b| {
        b.to_async(&runtime).iter_custom(|iterations| {
            let semaphores = semaphores.clone();
            async move {
                let started = Instant::now();
                let tasks = semaphores.map(|semaphore| {
                    tokio::spawn(async move {
                        rounds(iterations.div_ceil(2), || async {
                            semaphore.acquire().await.unwrap().release().await.unwrap();
                        })
                        .await
                    })
                });
                for task in tasks {
                    task.await.unwrap();
                }
                started.elapsed()
            }
        });
    });
    // Two clients sharing four segments: they seldom wait for each other.
    let segments = [
        first.segmented_lock("bench:two:segmented", 4).unwrap(),
        second.segmented_lock("bench:two:segmented", 4).unwrap(),
    ];
    group.bench_function("two_clients_segmented_of_4", |b| {
        b.to_async(&runtime).iter_custom(|iterations| {
            let segments = segments.clone();
            async move {
                let started = Instant::now();
                let tasks = segments.map(|segmented| {
                    tokio::spawn(async move {
                        rounds(iterations.div_ceil(2), || async {
                            segmented.acquire().await.unwrap().release().await.unwrap();
                        })
                        .await
                    })
                });
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
        for client in &quorum_clients {
            client.shutdown().await;
        }
    });
}

criterion_group!(benches, kind_benches);
criterion_main!(benches);

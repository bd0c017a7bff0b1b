//! Shared by the benches: their runtime, the PING round trip each figure is read against,
//! and tasks taking turns on one lock.

use std::time::{Duration, Instant};

use criterion::BenchmarkGroup;
use criterion::measurement::WallTime;
use tower_redis_lock::Lock;

/// The two-thread runtime every bench runs on.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Benches a PING round trip to `url` in `group`: the yardstick of the run's other figures.
pub(crate) fn bench_ping(
    group: &mut BenchmarkGroup<'_, WallTime>,
    runtime: &tokio::runtime::Runtime,
    url: &str,
) {
    let conn = runtime.block_on(async {
        redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    });
    group.bench_function("ping_round_trip", |b| {
        b.to_async(runtime).iter(|| {
            let mut conn = conn.clone();
            async move {
                let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
            }
        });
    });
}

/// Two tasks, one per lock handle, each taking its lock and releasing it
/// `iterations / 2` times (in turn when the kind excludes them); the time it took.
pub(crate) async fn take_turns(locks: [Lock; 2], iterations: u64) -> Duration {
    let started = Instant::now();
    let tasks = locks.map(|lock| {
        tokio::spawn(async move {
            for _ in 0..iterations.div_ceil(2) {
                lock.acquire().await.unwrap().release().await.unwrap();
            }
        })
    });
    for task in tasks {
        task.await.unwrap();
    }
    started.elapsed()
}

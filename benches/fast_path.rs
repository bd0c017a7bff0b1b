//! The uncontended fast path (a free lock, nobody waiting here or in Redis) next to the
//! simplest lock there is on the same redis-rs connection type: `SET key owner NX PX` to take
//! it and a compare-and-delete script to release it. Besides criterion's times, the bench
//! counts the heap allocations of one acquire + release in the whole process (redis-rs's
//! connection task included), for both, before it measures.

#![allow(missing_docs)]

#[allow(dead_code)]
#[path = "shared/common.rs"]
mod common;
#[path = "shared/simplest_lock.rs"]
mod simplest_lock;
#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::System;
use std::time::Duration;

use common::{bench_ping, runtime};
use criterion::{Criterion, criterion_group, criterion_main};
use simplest_lock::SimplestLock;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower_redis_lock::{Lock, LockClient};

/// The system allocator, counting allocations for [`allocations_per_round`].
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Acquisitions whose allocations are averaged.
const COUNTED_ROUNDS: u64 = 2_000;

async fn ours_acquire_release(lock: &Lock) {
    lock.acquire().await.unwrap().release().await.unwrap();
}

/// Allocations and bytes per round of `round`, averaged over [`COUNTED_ROUNDS`] after a
/// warm-up.
fn allocations_per_round<F, Fut>(runtime: &tokio::runtime::Runtime, round: F) -> (f64, f64)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    runtime.block_on(async {
        for _ in 0..100 {
            round().await;
        }
        let region = Region::new(GLOBAL);
        for _ in 0..COUNTED_ROUNDS {
            round().await;
        }
        let change = region.change();
        let count = change.allocations + change.reallocations;
        (
            count as f64 / COUNTED_ROUNDS as f64,
            change.bytes_allocated as f64 / COUNTED_ROUNDS as f64,
        )
    })
}

fn fast_path_benches(c: &mut Criterion) {
    let runtime = runtime();
    let server = support::RedisServer::start();
    let url = server.url();
    let (locks, simplest) = runtime.block_on(async {
        let locks = LockClient::connect(&url).await.unwrap();
        let simplest = SimplestLock::connect(&url).await.unwrap();
        (locks, simplest)
    });
    let lock = locks.lock("bench:fast-path").unwrap();

    let (ours, ours_bytes) = allocations_per_round(&runtime, || ours_acquire_release(&lock));
    let (peer, peer_bytes) =
        allocations_per_round(&runtime, || simplest.acquire_release("bench:simplest"));
    println!(
        "allocations per uncontended acquire + release (whole process): ours {ours:.1} \
         ({ours_bytes:.0} bytes), SET NX + compare-and-delete {peer:.1} ({peer_bytes:.0} \
         bytes); ratio {:.2}",
        ours / peer
    );

    let mut group = c.benchmark_group("fast_path");
    group.measurement_time(Duration::from_secs(5));
    bench_ping(&mut group, &runtime, &url);
    group.bench_function("ours_acquire_release", |b| {
        b.to_async(&runtime).iter(|| ours_acquire_release(&lock));
    });
    group.bench_function("set_nx_compare_and_delete", |b| {
        b.to_async(&runtime)
            .iter(|| simplest.acquire_release("bench:simplest"));
    });
    group.finish();
    runtime.block_on(locks.shutdown());
}

criterion_group!(benches, fast_path_benches);
criterion_main!(benches);

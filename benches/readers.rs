//! What one more reader costs a read-write lock that many readers hold: a read acquire and
//! release next to 10, 100 and 1,000 readers already holding, timed by criterion, and Redis's
//! own time per script call (`INFO commandstats`), printed per size. Flat as readers grow is
//! the goal: every reader's lease is its own, and its bookkeeping must not visit the others.
//!
//! `cargo bench --bench readers`; `./scripts/bench.sh` runs it with the others.

#![allow(missing_docs)]

// Shared with the other benches, which use all of it.
#[allow(dead_code)]
#[path = "shared/common.rs"]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use common::{bench_ping, runtime};
use criterion::{Criterion, criterion_group, criterion_main};
use tower_redis_lock::{Lease, LockClient};

/// How many readers hold the lock while one more comes and goes.
const SIZES: [usize; 3] = [10, 100, 1_000];

/// Redis's own microseconds per `EVALSHA` since the last `CONFIG RESETSTAT`.
fn usec_per_script(server: &support::RedisServer) -> f64 {
    let stats: String = server.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
        .and_then(|fields| {
            fields
                .split(',')
                .find_map(|field| field.strip_prefix("usec_per_call="))
        })
        .map_or(0.0, |value| value.parse().expect("a number"))
}

fn reader_benches(c: &mut Criterion) {
    let runtime = runtime();
    let server = support::RedisServer::start();
    let locks = runtime.block_on(async { LockClient::connect(&server.url()).await.unwrap() });

    let mut group = c.benchmark_group("readers");
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    group.sample_size(20);
    bench_ping(&mut group, &runtime, &server.url());

    let mut redis_cost = Vec::new();
    for size in SIZES {
        let rw = locks
            .read_write_lock(&format!("bench:readers:{size}"))
            .unwrap();
        // Fixed leases far longer than the run: the held readers are never renewed, so the
        // scripts counted below are the measured reader's alone.
        let held_lock = rw.read().with_lease(Lease::Fixed(Duration::from_secs(600)));
        let held = runtime.block_on(async {
            let mut held = Vec::with_capacity(size);
            for _ in 0..size {
                held.push(held_lock.acquire().await.unwrap());
            }
            held
        });
        let reader = rw.read();
        let () = server.cmd(&["CONFIG", "RESETSTAT"]);
        group.bench_function(format!("read_acquire_release/{size}_readers"), |b| {
            b.to_async(&runtime).iter(|| {
                let reader = reader.clone();
                async move { reader.acquire().await.unwrap().release().await.unwrap() }
            });
        });
        redis_cost.push((size, usec_per_script(&server)));
        runtime.block_on(async {
            for guard in held {
                guard.release().await.unwrap();
            }
        });
    }
    group.finish();
    for (size, usec) in &redis_cost {
        println!("readers: {size} holding, Redis {usec:.2} µs per script call");
    }
    if let (Some((_, fewest)), Some((_, most))) = (redis_cost.first(), redis_cost.last()) {
        println!(
            "readers: Redis time per script call, {} readers over {}: {:.2}×",
            SIZES[SIZES.len() - 1],
            SIZES[0],
            most / fewest
        );
    }
}

criterion_group!(benches, reader_benches);
criterion_main!(benches);

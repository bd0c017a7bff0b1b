//! Memory and scale: 100,000 tasks of one client wait for 10,000 locks held by another
//! client, on one pub/sub connection, then all of them get their lock in turn.
//!
//! ```text
//! cargo run --release --example waiters -- --redis redis://127.0.0.1:6379 [--keys 10000] [--per-key 10]
//! ```
//!
//! Heap bytes are counted by a global allocator wrapper, so the figure per waiting task is
//! exact: everything the waiters and the library allocate for them (the task and its
//! future, the local queues, the wake slots), divided by the number of waiters. The last line
//! is one JSON object; the exit code is 1 if a waiter did not get its lock.

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cap::Cap;
use serde_json::json;
use tower_redis_lock::LockClient;

/// The system allocator, counting the bytes currently allocated.
#[global_allocator]
static ALLOCATED: Cap<System> = Cap::new(System, usize::MAX);

struct Settings {
    redis: String,
    keys: usize,
    per_key: usize,
}

fn parse() -> Result<Settings, String> {
    let mut settings = Settings {
        redis: String::new(),
        keys: 10_000,
        per_key: 10,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--redis" => settings.redis = value,
            "--keys" => settings.keys = value.parse().map_err(|_| "bad --keys")?,
            "--per-key" => settings.per_key = value.parse().map_err(|_| "bad --per-key")?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if settings.redis.is_empty() {
        return Err("--redis is required".into());
    }
    Ok(settings)
}

/// Waits until the heap stops growing (every waiter parked), sampling every 100 ms.
async fn settled_heap() -> usize {
    let mut last = ALLOCATED.allocated();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = ALLOCATED.allocated();
        if now == last {
            return now;
        }
        last = now;
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = parse()?;
    let holder = LockClient::connect(&settings.redis).await?;
    let waiter = LockClient::builder(&settings.redis)
        // The holder releases everything at once; nobody needs to poll meanwhile.
        .repoll_interval(Duration::from_secs(30))
        .build()
        .await?;
    let names: Vec<String> = (0..settings.keys).map(|i| format!("scale-{i}")).collect();
    let mut held = Vec::with_capacity(settings.keys);
    for chunk in names.chunks(500) {
        let taken = futures_util::future::join_all(
            chunk
                .iter()
                .map(|name| async { holder.lock(name)?.acquire().await }),
        )
        .await;
        for guard in taken {
            held.push(guard?);
        }
    }
    let locks: Vec<_> = names
        .iter()
        .map(|name| waiter.lock(name))
        .collect::<Result<_, _>>()?;

    let baseline = settled_heap().await;
    let waiting = settings.keys * settings.per_key;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(waiting);
    for round in 0..settings.per_key {
        for lock in &locks {
            let (lock, done) = (lock.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let guard = lock.acquire().await;
                let ok = guard.is_ok();
                if let Ok(guard) = guard {
                    guard.release().await.ok();
                }
                done.fetch_add(1, Ordering::Relaxed);
                ok
            }));
        }
        let _ = round;
    }
    let started = Instant::now();
    while waiter.queued_waiters() < settings.keys && started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let parked = settled_heap().await;
    let bytes_per_waiter = (parked.saturating_sub(baseline)) as f64 / waiting as f64;
    let queued = waiter.queued_waiters();
    let channels = waiter.local_keys();
    println!(
        "{waiting} waiters on {} keys: {queued} queued in Redis (one per key), {} KiB of heap, \
         {bytes_per_waiter:.0} bytes per waiting task (the task's future itself: {} bytes)",
        settings.keys,
        (parked - baseline) / 1024,
        std::mem::size_of_val(&locks[0].acquire()),
    );

    let released_at = Instant::now();
    drop(held);
    let mut acquired = 0;
    for task in tasks {
        if task.await? {
            acquired += 1;
        }
    }
    let drained = released_at.elapsed();
    println!(
        "all {acquired} acquired and released in {:.2} s ({:.0} per second)",
        drained.as_secs_f64(),
        acquired as f64 / drained.as_secs_f64()
    );
    let report = json!({
        "waiters": waiting,
        "keys": settings.keys,
        "queued_in_redis": queued,
        "local_keys": channels,
        "bytes_per_waiter": bytes_per_waiter.round(),
        "acquired": acquired,
        "drain_s": (drained.as_secs_f64() * 100.0).round() / 100.0,
        "left_local_keys": waiter.local_keys(),
        "left_queued": waiter.queued_waiters(),
    });
    println!("{report}");
    holder.shutdown().await;
    waiter.shutdown().await;
    if acquired != waiting || waiter.local_keys() != 0 {
        std::process::exit(1);
    }
    Ok(())
}

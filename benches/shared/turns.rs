//! Shared by the benches: tasks taking turns on one lock.

use std::time::{Duration, Instant};

use tower_redis_lock::Lock;

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

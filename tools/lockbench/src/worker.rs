//! One process's part of a run, the parent's and every child's alike: connect and warm up
//! before the statistics are reset, then run the workers on the schedule and report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cpu::measure_window;
use crate::deployment::{Deployment, Store};
use crate::helpers::Res;
use crate::helpers::{now_us, sleep_until};
use crate::locks::{Backend, KeyLock};
use crate::workload::{ProcessResult, Record, RunSpec, Schedule};

/// The critical section's own connection, apart from the lock's: a plain read-modify-write
/// whose lost updates betray two holders at once.
#[derive(Clone)]
struct CriticalSection {
    conn: Store,
    increments: Arc<AtomicU64>,
}

impl CriticalSection {
    async fn connect(deployment: &Deployment) -> Res<Self> {
        Ok(Self {
            conn: deployment.store().await?,
            increments: Arc::default(),
        })
    }

    /// `GET` then `SET value+1`, deliberately not atomic.
    async fn increment(&self, counter: &str) -> Res<()> {
        let mut conn = self.conn.clone();
        let value: Option<u64> = conn.query(redis::cmd("GET").arg(counter)).await?;
        let () = conn
            .query(redis::cmd("SET").arg(counter).arg(value.unwrap_or(0) + 1))
            .await?;
        self.increments.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// A process ready to run: connected, connections warm, waiting for the schedule.
pub(crate) struct Prepared {
    spec: RunSpec,
    backend: Backend,
    section: CriticalSection,
}

/// Connects everything and takes a scratch lock once with every client, so connection
/// set-up happens before the server's statistics are reset and stays out of the figures.
pub(crate) async fn prepare(spec: RunSpec) -> Res<Prepared> {
    let workers = spec.workload.workers_of(spec.process).len();
    let backend = Backend::connect(spec.lock, &spec.deployment, workers).await?;
    let section = CriticalSection::connect(&spec.deployment).await?;
    for client in 0..backend.clients() {
        backend
            .key_lock(client, &spec.scratch_name())?
            .acquire()
            .await?
            .release()
            .await?;
    }
    Ok(Prepared {
        spec,
        backend,
        section,
    })
}

/// Runs this process's workers on `schedule` and reports what they did.
pub(crate) async fn execute(prepared: Prepared, schedule: Schedule) -> Res<ProcessResult> {
    let Prepared {
        spec,
        backend,
        section,
    } = prepared;
    warn_if_late(spec.process, schedule);
    let cpu = measure_window(schedule);
    let round_trips_before = backend.round_trips();
    let mut workers = Vec::new();
    for (index, worker) in spec.workload.workers_of(spec.process).enumerate() {
        let key = spec.workload.key_of(worker);
        let plan = WorkerPlan {
            process: spec.process as u32,
            worker: worker as u32,
            key: key as u32,
            lock: backend.key_lock(index, &spec.lock_name(key))?,
            counter: spec.counter_key(key),
        };
        workers.push(tokio::spawn(run_worker(plan, section.clone(), schedule)));
    }
    let mut records = Vec::new();
    for worker in workers {
        records.extend(worker.await??);
    }
    let round_trips = backend
        .round_trips()
        .zip(round_trips_before)
        .map(|(after, before)| after - before);
    let cpu = cpu.await?;
    backend.shutdown().await;
    Ok(ProcessResult {
        records,
        round_trips,
        increments: section.increments.load(Ordering::Relaxed),
        cpu,
    })
}

/// The barrier is a wall-clock instant; a process that learns it too late starts late, and
/// the run is then not the simultaneous start it claims to be.
fn warn_if_late(process: usize, schedule: Schedule) {
    let late_us = now_us() - schedule.start_us;
    if late_us > 0 {
        eprintln!("warning: process {process} got the schedule {late_us} µs after the start");
    }
}

struct WorkerPlan {
    process: u32,
    worker: u32,
    key: u32,
    lock: KeyLock,
    counter: String,
}

/// Acquire, critical section, release, in a tight loop from the schedule's start until its
/// stop. An acquisition under way at the stop still completes: it counts for the correctness
/// checks and the per-acquisition command counts, not for the window's rates and latencies.
async fn run_worker(
    plan: WorkerPlan,
    section: CriticalSection,
    schedule: Schedule,
) -> Res<Vec<Record>> {
    sleep_until(schedule.start_us).await;
    let mut records = Vec::new();
    loop {
        let called_us = now_us();
        if called_us >= schedule.stop_us {
            return Ok(records);
        }
        let held = plan.lock.acquire().await?;
        let acquired_us = now_us();
        section.increment(&plan.counter).await?;
        let release_called_us = now_us();
        held.release().await?;
        records.push(Record {
            process: plan.process,
            worker: plan.worker,
            key: plan.key,
            called_us,
            acquired_us,
            release_called_us,
            released_us: now_us(),
        });
    }
}

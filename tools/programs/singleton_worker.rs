//! One instance of a singleton task or a schedule, for the tests that start several as
//! processes (each with a wall clock of its own) and stop, pause or kill them.
//!
//! ```text
//! singleton_worker --url URL --name NAME --instance ID [--lease-ms 2000]
//!                  [--schedule-ms PERIOD [--overrun skip|wait] [--job-ms 0]]
//! ```
//!
//! Without `--schedule-ms` it campaigns for the singleton `NAME`; with it, it runs the
//! schedule `NAME` of that period, whose job takes `--job-ms`. Each stdout line is one JSON
//! record, times in nanoseconds of the system's monotonic clock (shared by every process of
//! the machine): `{"event":"lead","term":..,"started_ns":..}` when a term's task starts,
//! `{"event":"stopped","term":..,"reason":..,"ended_ns":..}` when it ends (told or not), and
//! `{"event":"tick","tick":..,"missed_before":..,"term":..}` for each tick run. SIGTERM
//! shuts it down (the leadership handed over) and prints `{"event":"exit"}`.

use std::io::Write;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tower_redis_lock::singleton::Overrun;
use tower_redis_lock::{Leadership, LockClient, Tick};

#[derive(Debug)]
struct Settings {
    url: String,
    name: String,
    instance: String,
    lease: Duration,
    schedule: Option<Duration>,
    overrun: Overrun,
    job: Duration,
}

fn parse() -> Result<Settings, String> {
    let mut settings = Settings {
        url: String::new(),
        name: "reconcile".to_owned(),
        instance: "0".to_owned(),
        lease: Duration::from_secs(2),
        schedule: None,
        overrun: Overrun::Skip,
        job: Duration::ZERO,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let millis = || {
            value
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| format!("{flag} takes milliseconds"))
        };
        match flag.as_str() {
            "--url" => settings.url = value.clone(),
            "--name" => settings.name = value.clone(),
            "--instance" => settings.instance = value.clone(),
            "--lease-ms" => settings.lease = millis()?,
            "--schedule-ms" => settings.schedule = Some(millis()?),
            "--job-ms" => settings.job = millis()?,
            "--overrun" => {
                settings.overrun = match value.as_str() {
                    "skip" => Overrun::Skip,
                    "wait" => Overrun::Wait,
                    _ => return Err("--overrun is skip or wait".to_owned()),
                }
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if settings.url.is_empty() {
        return Err("--url is required".to_owned());
    }
    Ok(settings)
}

/// Nanoseconds of the monotonic clock, the same in every process of this machine.
fn now_ns() -> i64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("the monotonic clock");
    now.tv_sec() * 1_000_000_000 + now.tv_nsec()
}

/// Prints one record at once: the test reads them as they come.
fn record(instance: &str, mut line: Value) {
    line["instance"] = json!(instance);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Records a term's end when its task is dropped or returns.
struct TermRecord {
    instance: String,
    leadership: Leadership,
}

impl Drop for TermRecord {
    fn drop(&mut self) {
        let reason = self
            .leadership
            .stop_reason()
            .map(|reason| format!("{reason:?}"));
        record(
            &self.instance,
            json!({"event": "stopped", "term": self.leadership.term(), "reason": reason, "ended_ns": now_ns()}),
        );
    }
}

/// A singleton's task: leads until told to stop.
async fn lead(instance: String, leadership: Leadership) {
    record(
        &instance,
        json!({"event": "lead", "term": leadership.term(), "started_ns": now_ns()}),
    );
    let _record = TermRecord {
        instance,
        leadership: leadership.clone(),
    };
    leadership.stopping().await;
}

/// A schedule's job: records its tick and works for `job`.
async fn run_tick(instance: String, tick: Tick, job: Duration) {
    record(
        &instance,
        json!({
            "event": "tick",
            "tick": tick.number(),
            "missed_before": tick.missed_before(),
            "term": tick.leadership().term(),
        }),
    );
    tokio::time::sleep(job).await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let settings = parse().unwrap_or_else(|error| {
        eprintln!("singleton_worker: {error}");
        std::process::exit(2);
    });
    let locks = LockClient::builder(&settings.url)
        .watchdog_lease(settings.lease)
        .lease_limit(settings.lease.max(Duration::from_secs(5)))
        .command_timeout(Duration::from_millis(500))
        .instance_name(&format!("worker-{}", settings.instance))
        .build()
        .await
        .expect("a client");
    let instance = settings.instance.clone();
    let handle = match settings.schedule {
        None => locks
            .singleton(&settings.name)
            .expect("a valid name")
            .spawn(move |leadership| lead(instance.clone(), leadership)),
        Some(period) => {
            let job = settings.job;
            locks
                .schedule(&settings.name, period)
                .expect("a valid schedule")
                .overrun(settings.overrun)
                .spawn(move |tick| run_tick(instance.clone(), tick, job))
        }
    };
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM");
    terminate.recv().await;
    handle.shutdown().await.expect("a clean shutdown");
    record(&settings.instance, json!({"event": "exit"}));
}

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

#[path = "../../examples/axum_tenants/background.rs"]
#[allow(dead_code)]
mod background;

use std::time::Duration;

use background::{reconcile, record, report};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tower_redis_lock::LockClient;
use tower_redis_lock::singleton::Overrun;

/// How often a leader's task steps: each step appends its term to the journal.
const STEP: Duration = Duration::from_millis(20);

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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let settings = parse().unwrap_or_else(|error| {
        eprintln!("singleton_worker: {error}");
        std::process::exit(2);
    });
    // Before anything else: a SIGTERM from now on is a shutdown, not the default death.
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM");
    record(&settings.instance, json!({"event": "ready"}));
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
            .spawn(move |leadership| reconcile(instance.clone(), leadership, STEP)),
        Some(period) => {
            let job = settings.job;
            locks
                .schedule(&settings.name, period)
                .expect("a valid schedule")
                .overrun(settings.overrun)
                .spawn(move |tick| report(instance.clone(), tick, job))
        }
    };
    terminate.recv().await;
    handle.shutdown().await.expect("a clean shutdown");
    record(&settings.instance, json!({"event": "exit"}));
}

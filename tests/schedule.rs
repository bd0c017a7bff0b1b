//! Scheduled jobs as their users meet them: three instances whose own clocks are seconds
//! apart run each tick of the server's clock exactly once, the ticks that pass while every
//! instance is down are counted as missed, and a job that outlives its period skips the
//! ticks it overran or runs the last of them late, as chosen. Real servers; the instances
//! are processes (`singleton_worker`) with wall clocks of their own, through the clock shim.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::clock::FakeClock;
use support::{RedisServer, client_with_lease, example_path};
use tower_redis_lock::singleton::Overrun;
use tower_redis_lock::{ErrorKind, Tick};

/// The period of the process test: long enough that a tick is run on a loaded two-core
/// machine, where a step can stall for a few hundred ms.
const PERIOD: Duration = Duration::from_secs(1);

/// A tick one instance ran, as it printed it.
#[derive(Debug, Clone)]
struct Ran {
    instance: String,
    missed_before: u64,
}

/// The ticks the workers ran, by tick number, each with every instance that ran it.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<Ran>>>>;

/// A `singleton_worker` running the schedule `name` on a wall clock `clock`, its ticks read
/// into `runs`.
fn start_worker(server: &RedisServer, clock: &FakeClock, instance: usize, runs: &Runs) -> Child {
    let mut child = Command::new(example_path("singleton_worker"))
        .args(["--url", &server.url(), "--name", "nightly", "--instance"])
        .arg(instance.to_string())
        .args(["--schedule-ms", &PERIOD.as_millis().to_string()])
        .envs(clock.env())
        .stdout(Stdio::piped())
        .spawn()
        .expect("singleton_worker starts (cargo build --examples)");
    let stdout = child.stdout.take().expect("stdout");
    let runs = runs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let record: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
            if record["event"] == "tick" {
                let ran = Ran {
                    instance: record["instance"].as_str().expect("instance").to_owned(),
                    missed_before: record["missed_before"].as_u64().expect("missed_before"),
                };
                let tick = record["tick"].as_u64().expect("tick");
                runs.lock().unwrap().entry(tick).or_default().push(ran);
            }
        }
    });
    child
}

/// Stops `workers` with SIGTERM, as an orchestrator does, and waits for them.
fn stop_workers(workers: &mut Vec<Child>) {
    for worker in workers.iter() {
        let status = Command::new("kill")
            .args(["-TERM", &worker.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }
    for mut worker in workers.drain(..) {
        assert!(worker.wait().expect("the worker ends").success());
    }
}

/// Waits until `runs` has `count` ticks, within `bound`.
fn wait_for_ticks(runs: &Runs, count: usize, bound: Duration) {
    let deadline = Instant::now() + bound;
    while runs.lock().unwrap().len() < count {
        assert!(
            Instant::now() < deadline,
            "{count} ticks within {bound:?}: {:?}",
            runs.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's current tick of `PERIOD`.
fn server_tick(server: &RedisServer) -> u64 {
    let time: Vec<String> = server.cmd(&["TIME"]);
    let ms = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    ms / PERIOD.as_millis() as u64
}

#[test]
fn instances_with_skewed_clocks_run_each_tick_once_and_count_the_ticks_missed_while_all_are_down() {
    let server = RedisServer::start();
    // Wall clocks 7 s behind, on time, and 11 s ahead: a schedule that read its instances'
    // clocks would run ticks twice or not at all.
    let clocks: Vec<FakeClock> = [-7_000_000, 0, 11_000_000]
        .into_iter()
        .map(|offset| {
            let clock = FakeClock::new();
            clock.set_offset(offset);
            clock
        })
        .collect();
    let runs = Runs::default();
    let mut workers: Vec<Child> = (0..3)
        .map(|instance| start_worker(&server, &clocks[instance], instance, &runs))
        .collect();
    wait_for_ticks(&runs, 60, PERIOD * 60 + Duration::from_secs(30));
    stop_workers(&mut workers);
    let before = runs.lock().unwrap().clone();
    let (&first, _) = before.first_key_value().expect("ticks ran");
    let (&last, _) = before.last_key_value().expect("ticks ran");
    for (tick, ran) in &before {
        assert_eq!(ran.len(), 1, "tick {tick} ran exactly once: {ran:?}");
        assert_eq!(
            ran[0].missed_before, 0,
            "no tick missed while instances ran: {ran:?}"
        );
    }
    assert_eq!(
        before.len() as u64,
        last - first + 1,
        "every tick from the first to the last ran: {before:?}"
    );
    let instances: std::collections::BTreeSet<_> =
        before.values().map(|ran| ran[0].instance.clone()).collect();
    assert!(!instances.is_empty());

    // Every instance down for five ticks, then back.
    while server_tick(&server) < last + 6 {
        std::thread::sleep(Duration::from_millis(20));
    }
    workers = (0..3)
        .map(|instance| start_worker(&server, &clocks[instance], instance, &runs))
        .collect();
    wait_for_ticks(&runs, before.len() + 3, PERIOD * 10);
    stop_workers(&mut workers);
    let after = runs.lock().unwrap().clone();
    let (&back, ran) = after
        .range(last + 1..)
        .next()
        .expect("a tick after the restart");
    assert_eq!(ran.len(), 1, "tick {back} ran exactly once: {ran:?}");
    assert!(
        back >= last + 6,
        "no tick ran while every instance was down"
    );
    assert_eq!(
        ran[0].missed_before,
        back - last - 1,
        "the ticks no instance ran are counted as missed, once"
    );
    for (tick, ran) in after.range(back + 1..) {
        assert_eq!(ran.len(), 1, "tick {tick} ran exactly once: {ran:?}");
    }
}

/// What an in-process job saw of one run: its tick, its term, when it ran.
#[derive(Debug, Clone)]
struct Job {
    tick: u64,
    term: u64,
    started: Instant,
    ended: Instant,
}

/// Runs the schedule `name` of 300 ms on two clients with a job of 700 ms until six jobs ran;
/// returns the jobs that began before the clients were shut down.
async fn overrunning_jobs(server: &RedisServer, name: &str, overrun: Overrun) -> Vec<Job> {
    let jobs: Arc<Mutex<Vec<Job>>> = Arc::default();
    let mut handles = Vec::new();
    for _ in 0..2 {
        let locks = client_with_lease(&server.url(), Duration::from_secs(5)).await;
        let jobs = jobs.clone();
        let schedule = locks
            .schedule(name, Duration::from_millis(300))
            .expect("a schedule")
            .overrun(overrun);
        handles.push(schedule.spawn(move |tick: Tick| {
            let jobs = jobs.clone();
            async move {
                let started = Instant::now();
                tokio::time::sleep(Duration::from_millis(700)).await;
                jobs.lock().unwrap().push(Job {
                    tick: tick.number(),
                    term: tick.leadership().term(),
                    started,
                    ended: Instant::now(),
                });
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while jobs.lock().unwrap().len() < 6 {
        assert!(Instant::now() < deadline, "six jobs within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The clients stop one after the other: a job the other instance starts once the first
    // has handed its lock over is no late tick of the first, so it is left out of what the
    // tests compare below (but not out of the check that one job runs at a time).
    let shutdown_began = Instant::now();
    for handle in handles {
        handle.shutdown().await.expect("a clean shutdown");
    }
    let jobs = jobs.lock().unwrap().clone();
    for pair in jobs.windows(2) {
        assert!(
            pair[0].ended <= pair[1].started,
            "one job at a time: {pair:?}"
        );
    }
    jobs.into_iter()
        .filter(|job| job.started < shutdown_began)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_outlives_its_period_skips_the_ticks_it_overran() {
    let server = RedisServer::start();
    let jobs = overrunning_jobs(&server, "skipping", Overrun::Skip).await;
    for pair in jobs.windows(2) {
        // A job of 700 ms that began in tick n ends in tick n + 2 or later: n + 1 and n + 2
        // were overrun and are not run.
        assert!(
            pair[1].tick >= pair[0].tick + 3,
            "the overrun ticks are skipped: {pair:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_outlives_its_period_runs_the_last_tick_it_overran_at_once() {
    let server = RedisServer::start();
    let jobs = overrunning_jobs(&server, "waiting", Overrun::Wait).await;
    for pair in jobs.windows(2) {
        assert!(
            pair[1].tick >= pair[0].tick + 2,
            "a tick runs once, the ones before the last overrun are skipped: {pair:?}"
        );
        // The instance that overran runs the late tick itself, under the lock it kept.
        assert_eq!(
            pair[0].term, pair[1].term,
            "the late tick ran under the same lock: {pair:?}"
        );
    }
}

#[tokio::test]
async fn a_bad_schedule_is_refused_before_anything_is_sent() {
    let locks = support::client_on_silent_port(support::free_port()).await;
    let refused = locks
        .schedule("nightly", Duration::from_millis(10))
        .expect_err("a period too short");
    assert_eq!(refused.kind(), ErrorKind::InvalidConfig);
    let refused = locks
        .schedule("", Duration::from_secs(60))
        .expect_err("an empty name");
    assert_eq!(refused.kind(), ErrorKind::InvalidName);
}

/// The server's clock in ms.
fn server_ms(server: &RedisServer) -> u64 {
    let time: Vec<String> = server.cmd(&["TIME"]);
    time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_a_snapshot_older_than_a_ticks_claim_does_not_run_that_tick_again() {
    let mut server = RedisServer::start();
    server.provision_epoch("lock:");
    // An hour's period, and a start away from its end: the test stays in one tick.
    let period = Duration::from_secs(3600);
    let period_ms = period.as_millis() as u64;
    while server_ms(&server) % period_ms > period_ms - 60_000 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let tick = server_ms(&server) / period_ms;
    // A first lock records the server's process with its epoch, as any running service has.
    let locks = client_with_lease(&server.url(), Duration::from_secs(2)).await;
    drop(
        locks
            .lock("warm-up")
            .unwrap()
            .acquire()
            .await
            .expect("a lock"),
    );
    // The snapshot has the claim of the tick before, written in the data's life then.
    let epoch: String = server.cmd(&["GET", "lock:epoch"]);
    let life = epoch.split(' ').next().expect("an epoch").to_owned();
    let _: () = server.cmd(&[
        "SET",
        "lock:{nightly}:ticks",
        &format!("{} earlier {life}", tick - 1),
    ]);
    let _: () = server.cmd(&["SAVE"]);

    let runs: Arc<Mutex<Vec<u64>>> = Arc::default();
    let run_schedule = |locks: tower_redis_lock::LockClient| {
        let runs = runs.clone();
        locks
            .schedule("nightly", period)
            .expect("a schedule")
            .spawn(move |tick: Tick| {
                let runs = runs.clone();
                async move { runs.lock().unwrap().push(tick.number()) }
            })
    };
    let first = run_schedule(locks);
    let bound = Instant::now() + Duration::from_secs(30);
    while runs.lock().unwrap().is_empty() {
        assert!(Instant::now() < bound, "the tick ran within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.shutdown().await.expect("a clean shutdown");
    assert_eq!(*runs.lock().unwrap(), [tick]);

    // The restart brings back the snapshot, whose record misses the claim just made.
    server.crash_and_restart(&[]);
    let restored: String = server.cmd(&["GET", "lock:{nightly}:ticks"]);
    assert!(
        restored.starts_with(&format!("{} earlier", tick - 1)),
        "{restored}"
    );
    let again = run_schedule(client_with_lease(&server.url(), Duration::from_secs(2)).await);
    // The next claim (after the restart quarantine) records the tick in the data's new life.
    let claimed = support::eventually(Duration::from_secs(30), || {
        let record: Option<String> = server.cmd(&["GET", "lock:{nightly}:ticks"]);
        record.is_some_and(|record| record.starts_with(&format!("{tick} ")))
    })
    .await;
    again.shutdown().await.expect("a clean shutdown");
    assert!(claimed, "the tick was claimed again after the restart");
    assert_eq!(
        *runs.lock().unwrap(),
        [tick],
        "a tick claimed after the snapshot is not run again after the restart"
    );
}

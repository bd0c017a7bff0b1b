//! Three processes campaign for one leadership through changes of leader made on purpose:
//! SIGKILL, SIGSTOP past the lease, a black-holed connection, SIGTERM (a hand-over), and a
//! Redis restart without persistence, while the instances' wall clocks step by minutes and
//! the server's steps back. A checker over every term's running interval (from its task's
//! start to the last moment its code ran) finds no two that overlap, terms that only grow, and
//! a journal of guarded appends that never goes back to an older term.
//!
//! `SINGLETON_CHAOS_CHANGES` sets how many changes of leader (30 by default; the long runs
//! in `docs/testing.md` use 200).

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use support::clock::FakeClock;
use support::proxy::FaultProxy;
use support::{RedisServer, example_path};

/// The watchdog lease of the workers: every change of leader but a hand-over waits for it.
const LEASE: Duration = Duration::from_secs(2);

/// How long a change of leader may take: a lease, the restart quarantine (5 s) after a
/// restart, the wake-up, and room for a loaded two-core machine.
const CHANGE_BOUND: Duration = Duration::from_secs(30);

/// What a term's task reported, or what the test knows of it.
#[derive(Debug, Clone, Default)]
struct Term {
    instance: usize,
    term: u64,
    started_ns: i64,
    /// When its code last ran: from its `stopped` record, or when its process was killed.
    last_ns: Option<i64>,
    refused: u64,
    /// The steps its task printed, each after a guarded append to the journal.
    steps: u64,
}

/// What the workers printed: every term of every worker, by (instance, term), and how many
/// times each instance said it was ready (once per process started).
#[derive(Debug, Default)]
struct Printed {
    terms: HashMap<(usize, u64), Term>,
    ready: HashMap<usize, usize>,
}

type Terms = Arc<Mutex<Printed>>;

fn now_ns() -> i64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("the monotonic clock");
    now.tv_sec() * 1_000_000_000 + now.tv_nsec()
}

/// One candidate: its process, its connection to Redis (through a fault proxy) and its
/// wall clock.
struct Candidate {
    instance: usize,
    /// How many processes it started.
    starts: usize,
    child: Child,
    proxy: FaultProxy,
    clock: FakeClock,
}

impl Candidate {
    async fn start(server: &RedisServer, instance: usize, terms: &Terms) -> Self {
        let proxy = FaultProxy::start(server.port()).await;
        let clock = FakeClock::new();
        let child = spawn_worker(&proxy, &clock, instance, terms);
        Self {
            instance,
            starts: 1,
            child,
            proxy,
            clock,
        }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal}");
    }

    /// Starts its process again after it ended, on the same proxy and clock.
    fn restart(&mut self, terms: &Terms) {
        let _ = self.child.wait();
        self.child = spawn_worker(&self.proxy, &self.clock, self.instance, terms);
        self.starts += 1;
    }
}

fn spawn_worker(proxy: &FaultProxy, clock: &FakeClock, instance: usize, terms: &Terms) -> Child {
    let mut child = Command::new(example_path("singleton_worker"))
        .args(["--url", &proxy.url(), "--name", "reconcile", "--instance"])
        .arg(instance.to_string())
        .args(["--lease-ms", &LEASE.as_millis().to_string()])
        .envs(clock.env())
        .stdout(Stdio::piped())
        .spawn()
        .expect("singleton_worker starts (cargo build --examples)");
    let stdout = child.stdout.take().expect("stdout");
    let terms = terms.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let record: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
            let term = record["term"].as_u64().unwrap_or(0);
            let mut printed = terms.lock().unwrap();
            match record["event"].as_str() {
                Some("ready") => *printed.ready.entry(instance).or_default() += 1,
                Some("lead") => {
                    printed.terms.insert(
                        (instance, term),
                        Term {
                            instance,
                            term,
                            started_ns: record["started_ns"].as_i64().expect("started_ns"),
                            ..Term::default()
                        },
                    );
                }
                Some("step") => printed.terms.entry((instance, term)).or_default().steps += 1,
                Some("stopped") => {
                    let entry = printed.terms.entry((instance, term)).or_default();
                    entry.last_ns = record["last_step_ns"].as_i64();
                    entry.refused = record["refused"].as_u64().unwrap_or(0);
                }
                _ => {}
            }
        }
    });
    child
}

/// The steps a new leader takes before its fault: each appends to the journal, so every
/// term leaves entries there for the check.
const STEPS_BEFORE_FAULT: u64 = 5;

/// The current leader, once there are more than `seen` terms and the newest has taken
/// [`STEPS_BEFORE_FAULT`] steps.
async fn next_leader(terms: &Terms, seen: usize) -> Term {
    let deadline = tokio::time::Instant::now() + CHANGE_BOUND;
    loop {
        {
            let terms = &terms.lock().unwrap().terms;
            let newest = terms.values().max_by_key(|term| term.started_ns);
            if let Some(newest) = newest.filter(|term| term.steps >= STEPS_BEFORE_FAULT)
                && terms.len() > seen
            {
                return newest.clone();
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new leader within {CHANGE_BOUND:?} after {seen} terms"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What changes the leader.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Pause,
    BlackHole,
    Terminate,
    RestartRedis,
}

const FAULTS: [Fault; 5] = [
    Fault::Kill,
    Fault::Pause,
    Fault::RestartRedis,
    Fault::BlackHole,
    Fault::Terminate,
];

/// Checks that the journal of guarded appends never goes back to an older term, and returns
/// how long it is.
fn check_journal(server: &RedisServer) -> usize {
    let journal: Vec<u64> = server.cmd(&["LRANGE", "{reconcile}:journal", "0", "-1"]);
    assert!(
        journal.windows(2).all(|pair| pair[0] <= pair[1]),
        "a stale leader's write landed after a newer leader's: {journal:?}"
    );
    journal.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_change_hundreds_of_times_without_two_running_at_once() {
    let changes: usize = std::env::var("SINGLETON_CHAOS_CHANGES")
        .ok()
        .and_then(|changes| changes.parse().ok())
        .unwrap_or(30);
    let server_clock = FakeClock::new();
    let mut server = RedisServer::start_with_clock(&server_clock, 0, &[]);
    server.provision_epoch("lock:");
    let terms = Terms::default();
    let mut candidates = Vec::new();
    for instance in 0..3 {
        candidates.push(Candidate::start(&server, instance, &terms).await);
    }
    let mut killed_at: HashMap<(usize, u64), i64> = HashMap::new();
    let mut faults_made: HashMap<String, usize> = HashMap::new();
    let mut journal_entries = 0;
    let mut leader = next_leader(&terms, 0).await;
    for change in 0..changes {
        let fault = FAULTS[change % FAULTS.len()];
        *faults_made.entry(format!("{fault:?}")).or_default() += 1;
        // Clocks that step: the leader's own by up to two minutes either way (it must not
        // matter), the server's back by a second now and then (it must not either).
        let step = Duration::from_secs(1 + (change as u64 * 37) % 120);
        let stepped = &candidates[leader.instance].clock;
        if change % 2 == 0 {
            stepped.step_forward(step);
        } else {
            stepped.step_back(step);
        }
        if change % 7 == 3 {
            server_clock.step_back(Duration::from_secs(1));
        }
        let seen = terms.lock().unwrap().terms.len();
        let candidate = &mut candidates[leader.instance];
        match fault {
            Fault::Kill => {
                candidate.signal("-KILL");
                killed_at.insert((leader.instance, leader.term), now_ns());
                leader = next_leader(&terms, seen).await;
                candidate.restart(&terms);
            }
            Fault::Pause => {
                candidate.signal("-STOP");
                leader = next_leader(&terms, seen).await;
                candidate.signal("-CONT");
            }
            Fault::BlackHole => {
                candidate.proxy.black_hole();
                leader = next_leader(&terms, seen).await;
                candidate.proxy.heal();
            }
            Fault::Terminate => {
                candidate.signal("-TERM");
                leader = next_leader(&terms, seen).await;
                candidate.restart(&terms);
            }
            Fault::RestartRedis => {
                // The journal goes with the data: check it first.
                journal_entries += check_journal(&server);
                server.crash_and_restart_with_clock(&server_clock, &[]);
                leader = next_leader(&terms, seen).await;
            }
        }
    }
    // A worker started a moment ago may not handle SIGTERM yet: wait until each says so.
    for candidate in &candidates {
        let ready = || {
            terms
                .lock()
                .unwrap()
                .ready
                .get(&candidate.instance)
                .copied()
        };
        let deadline = tokio::time::Instant::now() + CHANGE_BOUND;
        while ready() != Some(candidate.starts) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "worker {} never ready",
                candidate.instance
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        candidate.signal("-TERM");
    }
    for candidate in &mut candidates {
        assert!(candidate.child.wait().expect("the worker ends").success());
    }

    let mut all: Vec<Term> = terms.lock().unwrap().terms.values().cloned().collect();
    for term in &mut all {
        if term.last_ns.is_none() {
            term.last_ns = killed_at.get(&(term.instance, term.term)).copied();
        }
    }
    all.sort_by_key(|term| term.started_ns);
    assert!(
        all.len() > changes,
        "{changes} changes of leader: {} terms",
        all.len()
    );
    let mut overlaps = Vec::new();
    for pair in all.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let last = before
            .last_ns
            .unwrap_or_else(|| panic!("term {before:?} never ended"));
        if last > after.started_ns {
            overlaps.push((before.clone(), after.clone()));
        }
        assert!(
            after.term > before.term,
            "terms grow: {before:?} then {after:?}"
        );
    }
    assert!(overlaps.is_empty(), "two leaders at once: {overlaps:#?}");
    journal_entries += check_journal(&server);
    let refused: u64 = all.iter().map(|term| term.refused).sum();
    eprintln!(
        "{}",
        serde_json::json!({
            "leader_changes": all.len() - 1,
            "overlaps": overlaps.len(),
            "faults": faults_made,
            "stale_writes_refused": refused,
            "journal_entries_checked": journal_entries,
        })
    );
}

//! The service's background jobs, each on one instance at a time: a reconciliation loop that
//! checks balances while its instance leads (`LockClient::singleton`), and a balance report
//! once per period of the server's clock (`LockClient::schedule`).
//!
//! Each prints JSON lines for the demo's checker (`tools/programs/singleton_check.rs`), times
//! in nanoseconds of the system's monotonic clock, shared by every process of the machine:
//! `lead` when a term starts, `step` each time its loop runs, `stopped` when its task ends
//! (told or dropped), and `tick` for each tick of the report. What the jobs write goes
//! through `write_if_leading`, so a leader that lost its lock writes nothing: the loop appends
//! its term to `{reconcile-balances}:journal`, the report its tick to `{balance-report}:ticks`.

use std::io::Write;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};
use serde_json::{Value, json};
use tower_redis_lock::{GuardedWrites, Leadership, LockClient, Result, SingletonHandle, Tick};

/// The reconciliation loop's singleton.
pub(crate) const RECONCILE: &str = "reconcile-balances";
/// The balance report's schedule.
pub(crate) const REPORT: &str = "balance-report";
/// How often the loop checks.
const STEP: Duration = Duration::from_millis(100);

/// Nanoseconds of the monotonic clock, the same in every process of this machine.
pub(crate) fn now_ns() -> i64 {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("the monotonic clock");
    now.tv_sec() * 1_000_000_000 + now.tv_nsec()
}

/// Prints one record at once, with the instance's name: the checker reads them as they come.
pub(crate) fn record(instance: &str, mut line: Value) {
    line["instance"] = json!(instance);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// What a term's task did, printed when it is dropped or returns.
struct TermRecord {
    instance: String,
    leadership: Leadership,
    /// When the task's code last ran (a step or its stop).
    last_step_ns: i64,
    applied: u64,
    refused: u64,
}

impl Drop for TermRecord {
    fn drop(&mut self) {
        let reason = self
            .leadership
            .stop_reason()
            .map(|reason| format!("{reason:?}"));
        record(
            &self.instance,
            json!({
                "event": "stopped",
                "term": self.leadership.term(),
                "reason": reason,
                "last_step_ns": self.last_step_ns,
                "ended_ns": now_ns(),
                "applied": self.applied,
                "refused": self.refused,
            }),
        );
    }
}

/// The reconciliation loop, while this instance leads: each step checks the balances and
/// appends its term to the journal, with a write Redis applies only while it leads, until
/// told to stop.
pub(crate) async fn reconcile(instance: String, leadership: Leadership, step: Duration) {
    let started_ns = now_ns();
    record(
        &instance,
        json!({"event": "lead", "term": leadership.term(), "started_ns": started_ns}),
    );
    let journal = format!("{{{}}}:journal", leadership.name());
    let checked = GuardedWrites::new().command("RPUSH", &journal, [leadership.term().to_string()]);
    let mut done = TermRecord {
        instance,
        leadership: leadership.clone(),
        last_step_ns: started_ns,
        applied: 0,
        refused: 0,
    };
    loop {
        done.last_step_ns = now_ns();
        record(
            &done.instance,
            json!({"event": "step", "term": leadership.term(), "at_ns": done.last_step_ns}),
        );
        match leadership.write_if_leading(&checked).await {
            Ok(true) => done.applied += 1,
            Ok(false) => done.refused += 1,
            // Redis unreachable: the next step tries again, or the lease is lost meanwhile.
            Err(_) => {}
        }
        tokio::select! {
            _ = leadership.stopping() => {
                done.last_step_ns = now_ns();
                return;
            }
            () = tokio::time::sleep(step) => {}
        }
    }
}

/// The balance report of one tick: records the tick (and the ticks no instance ran before
/// it), and appends it to the report's list under the tick's lock.
pub(crate) async fn report(instance: String, tick: Tick, work: Duration) {
    record(
        &instance,
        json!({
            "event": "tick",
            "tick": tick.number(),
            "missed_before": tick.missed_before(),
            "term": tick.leadership().term(),
        }),
    );
    let ticks = format!("{{{}}}:ticks", tick.leadership().name());
    let made = GuardedWrites::new().command("RPUSH", &ticks, [tick.number().to_string()]);
    let _ = tick.leadership().write_if_leading(&made).await;
    tokio::time::sleep(work).await;
}

/// Starts both jobs on `locks`: the loop, and the report every `period`.
pub(crate) fn start(
    locks: &LockClient,
    instance: &str,
    period: Duration,
) -> Result<(SingletonHandle, SingletonHandle)> {
    let name = instance.to_owned();
    let reconciling = locks
        .singleton(RECONCILE)?
        .spawn(move |leadership| reconcile(name.clone(), leadership, STEP));
    let name = instance.to_owned();
    let reporting = locks
        .schedule(REPORT, period)?
        .spawn(move |tick| report(name.clone(), tick, Duration::ZERO));
    Ok((reconciling, reporting))
}

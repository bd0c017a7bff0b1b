//! The checker of `./scripts/demo.sh --singleton`: reads the logs of the example service's
//! instances (the JSON lines of `examples/axum_tenants/background.rs`) and what the jobs
//! wrote in Redis, and checks that no two terms of the reconciliation loop ran at once (each
//! from its start to the last moment its code ran: its last `step`, or its `stopped`), that
//! terms only grew, that the loop's guarded journal never went back to an older term, and
//! that the balance report ran each tick at most once. Prints one JSON line; exits 1 when a
//! check fails or there were fewer changes of leader than `--min-changes`.
//!
//! ```text
//! singleton_check --redis URL [--min-changes 0] LOG...
//! ```

#[path = "../../examples/axum_tenants/background.rs"]
#[allow(dead_code)]
mod background;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// One term of the loop as the logs show it.
#[derive(Debug, Default, Clone)]
struct Term {
    term: u64,
    instance: String,
    started_ns: i64,
    last_ns: i64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut redis_url, mut min_changes, mut logs) = (None, 0_usize, Vec::new());
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--redis" => redis_url = args.next(),
            "--min-changes" => min_changes = args.next().ok_or("--min-changes N")?.parse()?,
            _ => logs.push(arg),
        }
    }
    let redis_url = redis_url.ok_or("--redis URL is required")?;

    let mut terms: BTreeMap<u64, Term> = BTreeMap::new();
    let (mut missed, mut refused, mut ticks_logged) = (0_u64, 0_u64, 0_u64);
    for log in &logs {
        for line in std::fs::read_to_string(log)?.lines() {
            let Ok(record) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let number = record["term"].as_u64().unwrap_or(0);
            let instance = record["instance"].as_str().unwrap_or("").to_owned();
            let at = |field: &str| record[field].as_i64().unwrap_or(0);
            match record["event"].as_str() {
                Some("lead") => {
                    let term = terms.entry(number).or_default();
                    term.term = number;
                    term.instance = instance;
                    term.started_ns = at("started_ns");
                    term.last_ns = term.last_ns.max(term.started_ns);
                }
                Some("step") => {
                    let term = terms.entry(number).or_default();
                    term.last_ns = term.last_ns.max(at("at_ns"));
                }
                Some("stopped") => {
                    let term = terms.entry(number).or_default();
                    term.last_ns = term.last_ns.max(at("last_step_ns"));
                    refused += record["refused"].as_u64().unwrap_or(0);
                }
                Some("tick") => {
                    ticks_logged += 1;
                    missed += record["missed_before"].as_u64().unwrap_or(0);
                }
                _ => {}
            }
        }
    }

    let mut by_start: Vec<Term> = terms.into_values().collect();
    by_start.sort_by_key(|term| term.started_ns);
    let mut overlaps = Vec::new();
    let mut term_disorder = 0;
    for pair in by_start.windows(2) {
        if pair[0].last_ns > pair[1].started_ns {
            overlaps.push(json!({
                "earlier": {"term": pair[0].term, "instance": pair[0].instance},
                "later": {"term": pair[1].term, "instance": pair[1].instance},
                "by_ms": (pair[0].last_ns - pair[1].started_ns) as f64 / 1e6,
            }));
        }
        if pair[1].term <= pair[0].term {
            term_disorder += 1;
        }
    }

    let mut redis = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let journal_key = format!("{{{}}}:journal", background::RECONCILE);
    let journal: Vec<u64> = redis::cmd("LRANGE")
        .arg(&journal_key)
        .arg(0)
        .arg(-1)
        .query_async(&mut redis)
        .await?;
    let journal_disorder = journal.windows(2).filter(|pair| pair[1] < pair[0]).count();
    let ticks_key = format!("{{{}}}:ticks", background::REPORT);
    let ticks: Vec<u64> = redis::cmd("LRANGE")
        .arg(&ticks_key)
        .arg(0)
        .arg(-1)
        .query_async(&mut redis)
        .await?;
    let distinct: BTreeSet<u64> = ticks.iter().copied().collect();
    let ticks_twice = ticks.len() - distinct.len();

    let leader_changes = by_start.len().saturating_sub(1);
    let failed = !overlaps.is_empty()
        || term_disorder > 0
        || journal_disorder > 0
        || ticks_twice > 0
        || leader_changes < min_changes;
    println!(
        "{}",
        json!({
            "leader_changes": leader_changes,
            "overlaps": overlaps.len(),
            "term_disorder": term_disorder,
            "journal_entries": journal.len(),
            "journal_disorder": journal_disorder,
            "stale_writes_refused": refused,
            "ticks_run": distinct.len(),
            "ticks_logged": ticks_logged,
            "ticks_twice": ticks_twice,
            "ticks_missed": missed,
            "overlapping": overlaps,
            "ok": !failed,
        })
    );
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

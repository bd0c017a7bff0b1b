//! The mutual-exclusion and fencing checker of the chaos run: reads the critical sections
//! every process logged (on the machine's shared monotonic clock) and checks, per key, that
//! no two overlap unless the earlier one had already been told its lease was lost, that
//! fencing tokens strictly increase in the order sections start, and that no acquisition
//! waited past its bound.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// One critical section, as a process logged it. The recorded span lies inside the real
/// one (`start` after the acquisition returned, `end` before the release was sent), so an
/// overlap of recorded spans is an overlap of real ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Section {
    pub process: usize,
    pub key: String,
    pub token: u64,
    pub asked: i64,
    pub start: i64,
    pub end: i64,
    /// When the holder saw its lost signal, if it fired while the section ran.
    pub lost: Option<i64>,
    pub reason: Option<String>,
    /// How the release went: `ok`, or the kind of its typed error.
    pub release: String,
    /// How long the process's runtime was blocked on purpose while it waited (a stall
    /// fault): added to its bound.
    pub stalled: i64,
}

impl Section {
    /// Until when the section ran believing it held the lock.
    fn protected_until(&self) -> i64 {
        self.lost.map_or(self.end, |lost| lost.min(self.end))
    }
}

/// An acquisition that ended in a typed error.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub process: usize,
    pub key: String,
    pub error: String,
    /// The error's text.
    pub detail: String,
    pub asked: i64,
    pub failed: i64,
    /// As [`Section::stalled`].
    pub stalled: i64,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub sections: usize,
    pub failures: BTreeMap<String, usize>,
    /// The text of the first failure of each kind, for the failure message.
    pub failure_details: BTreeMap<String, String>,
    /// Sections that started while another one still believed it held the same key.
    pub overlaps: usize,
    /// Sections whose token was not larger than the token of the section before them.
    pub token_regressions: usize,
    /// Acquisitions (successful or not) that took longer than their bound plus slack.
    pub stuck: usize,
    /// Acquisitions during which the runtime was blocked on purpose (a stall fault).
    pub stalled: usize,
    /// Lost signals seen by holders, by reason.
    pub lost_signalled: BTreeMap<String, usize>,
    /// Releases that found the lock gone although no lost signal had fired: the holder
    /// learnt of the loss from the release's typed error.
    pub lost_found_at_release: usize,
    /// The first few violations, for the failure message.
    pub examples: Vec<String>,
}

/// Reads one process's log of JSON lines.
pub fn read_log(process: usize, text: &str) -> (Vec<Section>, Vec<Failure>) {
    let (mut sections, mut failures) = (Vec::new(), Vec::new());
    for line in text.lines().filter(|line| !line.is_empty()) {
        let record: Value = serde_json::from_str(line).expect("a JSON record");
        let key = record["key"].as_str().expect("key").to_owned();
        let number = |field: &str| record[field].as_i64().unwrap_or_else(|| panic!("{field}"));
        let stalled = record["stalled"].as_i64().unwrap_or(0);
        if let Some(error) = record["error"].as_str() {
            failures.push(Failure {
                process,
                key,
                error: error.to_owned(),
                detail: record["detail"].as_str().unwrap_or_default().to_owned(),
                asked: number("asked"),
                failed: number("failed"),
                stalled,
            });
        } else {
            sections.push(Section {
                process,
                key,
                token: record["token"].as_u64().expect("token"),
                asked: number("asked"),
                start: number("start"),
                end: number("end"),
                lost: record["lost"].as_i64(),
                reason: record["reason"].as_str().map(str::to_owned),
                release: record["release"].as_str().expect("release").to_owned(),
                stalled,
            });
        }
    }
    (sections, failures)
}

/// A new directory for the logs of `run` and the paths of its `processes` workers' logs in
/// it, in process order.
pub fn log_paths(run: &str, seed: u64, processes: usize) -> (std::path::PathBuf, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("{run}-{}-{seed}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("log directory");
    let logs = (0..processes)
        .map(|index| {
            dir.join(format!("worker-{index}.jsonl"))
                .display()
                .to_string()
        })
        .collect();
    (dir, logs)
}

/// Every worker's log in `dir` (`logs`, one per process, in process order), read and then
/// removed unless `CHAOS_KEEP_LOGS` is set.
pub fn read_logs(dir: &std::path::Path, logs: &[String]) -> (Vec<Section>, Vec<Failure>) {
    let (mut sections, mut failures) = (Vec::new(), Vec::new());
    for (index, log) in logs.iter().enumerate() {
        let text = std::fs::read_to_string(log).expect("a worker's log");
        let (more_sections, more_failures) = read_log(index, &text);
        sections.extend(more_sections);
        failures.extend(more_failures);
    }
    if std::env::var_os("CHAOS_KEEP_LOGS").is_none() {
        std::fs::remove_dir_all(dir).expect("remove the logs");
    }
    (sections, failures)
}

/// A whole number from the environment variable `name`, if set.
pub fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .parse()
            .unwrap_or_else(|err| panic!("{name}={value}: {err}"))
    })
}

/// Checks every key's sections; `bound_ns` is the longest an acquisition may take (its wait
/// bound plus slack).
pub fn check(sections: &[Section], failures: &[Failure], bound_ns: i64) -> Verdict {
    let mut verdict = Verdict {
        sections: sections.len(),
        ..Verdict::default()
    };
    let mut by_key: HashMap<&str, Vec<&Section>> = HashMap::new();
    for section in sections {
        by_key.entry(&section.key).or_default().push(section);
        if section.start - section.asked > bound_ns + section.stalled {
            verdict.stuck += 1;
        }
        if section.stalled > 0 {
            verdict.stalled += 1;
        }
        if let Some(reason) = &section.reason {
            *verdict.lost_signalled.entry(reason.clone()).or_default() += 1;
        } else if section.release == "not_owner" {
            verdict.lost_found_at_release += 1;
        }
    }
    for failure in failures {
        *verdict.failures.entry(failure.error.clone()).or_default() += 1;
        verdict
            .failure_details
            .entry(failure.error.clone())
            .or_insert_with(|| failure.detail.clone());
        if failure.failed - failure.asked > bound_ns + failure.stalled {
            verdict.stuck += 1;
        }
        if failure.stalled > 0 {
            verdict.stalled += 1;
        }
    }
    for (key, mut sections) in by_key {
        sections.sort_by_key(|section| (section.start, section.token));
        // The section that believed it held the key the longest so far.
        let mut latest: Option<&Section> = None;
        let mut previous_token: Option<u64> = None;
        for section in sections {
            if let Some(holder) = latest
                && section.start < holder.protected_until()
            {
                verdict.overlaps += 1;
                note(
                    &mut verdict,
                    format!("overlap on {key}: {holder:?} and {section:?}"),
                );
            }
            if previous_token.is_some_and(|token| section.token <= token) {
                verdict.token_regressions += 1;
                note(
                    &mut verdict,
                    format!("token on {key} did not grow: {previous_token:?} then {section:?}"),
                );
            }
            previous_token = Some(section.token);
            if latest.is_none_or(|holder| section.protected_until() > holder.protected_until()) {
                latest = Some(section);
            }
        }
    }
    verdict
}

fn note(verdict: &mut Verdict, example: String) {
    if verdict.examples.len() < 5 {
        verdict.examples.push(example);
    }
}

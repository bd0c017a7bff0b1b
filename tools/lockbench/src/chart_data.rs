//! The JSON lines of one lockbench run, read back for the charts: the summary rows (medians
//! over the repetitions), the ratios against rslock, the load at the start, and where the
//! run came from (a `source` line `scripts/charts.sh` writes before lockbench's own).
//!
//! The reading is strict about what the charts draw and lenient about the rest: a line that
//! is not JSON, or a summary without its lock, workload or rate, stops it with the line's
//! number, since a chart drawn from half a file would look whole; kinds the charts do not
//! use (`run`, `target`, the deployment line) are skipped, and a figure an older lockbench
//! did not print (the wait's p10 to p99.9) is left out of the chart rather than refused.

use serde_json::{Map, Value};

/// The wait's distribution of one lock on one workload, in µs; `None` where the line has
/// no such figure.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Waits {
    pub(crate) p10: Option<f64>,
    pub(crate) p25: Option<f64>,
    pub(crate) p50: Option<f64>,
    pub(crate) p75: Option<f64>,
    pub(crate) p90: Option<f64>,
    pub(crate) p99: Option<f64>,
    pub(crate) p999: Option<f64>,
    /// The longest wait overlapping the window, drain included.
    pub(crate) max: Option<f64>,
}

impl Waits {
    /// Every figure present, for the extent of a scale.
    pub(crate) fn present(&self) -> impl Iterator<Item = f64> {
        [
            self.p10, self.p25, self.p50, self.p75, self.p90, self.p99, self.p999, self.max,
        ]
        .into_iter()
        .flatten()
    }
}

/// One summary line: a lock's medians on one workload.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Summary {
    pub(crate) workload: String,
    pub(crate) lock: String,
    pub(crate) reps: Option<u64>,
    pub(crate) acq_per_s: f64,
    pub(crate) server_cpu_us_per_acq: Option<f64>,
    pub(crate) waits: Waits,
}

/// One ratio line: a lock's figures over rslock's on one workload.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RatioLine {
    pub(crate) workload: String,
    pub(crate) lock: String,
    pub(crate) acq_per_s: Option<f64>,
    pub(crate) server_cpu_per_acq: Option<f64>,
}

/// The 1-minute load average when the run started and the threshold it was read against.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Start {
    pub(crate) load: Option<f64>,
    pub(crate) max: Option<f64>,
    pub(crate) loaded: Option<bool>,
}

/// Where the run came from, when the file says: the `source` line and the deployment line.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Source {
    pub(crate) date: Option<String>,
    pub(crate) commit: Option<String>,
    pub(crate) uncommitted_changes: Option<bool>,
    pub(crate) redis: Option<String>,
    pub(crate) deployment: Option<String>,
}

/// Everything the charts draw from one run.
#[derive(Debug, Default)]
pub(crate) struct Results {
    pub(crate) summaries: Vec<Summary>,
    pub(crate) ratios: Vec<RatioLine>,
    /// `None` when no line carried `load_start`.
    pub(crate) start: Option<Start>,
    pub(crate) source: Source,
}

impl Results {
    /// The workloads in the order the run first reported them (its `--workload` order).
    pub(crate) fn workloads(&self) -> Vec<&str> {
        let mut workloads: Vec<&str> = Vec::new();
        for summary in &self.summaries {
            if !workloads.contains(&summary.workload.as_str()) {
                workloads.push(&summary.workload);
            }
        }
        workloads
    }

    pub(crate) fn summary(&self, workload: &str, lock: &str) -> Option<&Summary> {
        self.summaries
            .iter()
            .find(|s| s.workload == workload && s.lock == lock)
    }

    pub(crate) fn ratio(&self, workload: &str, lock: &str) -> Option<&RatioLine> {
        self.ratios
            .iter()
            .find(|r| r.workload == workload && r.lock == lock)
    }

    /// The repetitions each summary is the median of: one number, or the range when the
    /// rows differ.
    pub(crate) fn reps(&self) -> Option<(u64, u64)> {
        let reps = self.summaries.iter().filter_map(|s| s.reps);
        Some((reps.clone().min()?, reps.max()?))
    }
}

/// The results of `text`, the JSON lines of one lockbench run; the error names the line.
pub(crate) fn read_results(text: &str) -> Result<Results, String> {
    let mut results = Results::default();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        read_line(&mut results, line).map_err(|problem| format!("line {number}: {problem}"))?;
    }
    if results.summaries.is_empty() {
        return Err("no \"summary\" line: not the output of a whole lockbench run".into());
    }
    Ok(results)
}

fn read_line(results: &mut Results, line: &str) -> Result<(), String> {
    let value: Value =
        serde_json::from_str(line).map_err(|err| format!("not a JSON line ({err})"))?;
    let Value::Object(fields) = value else {
        return Err("not a JSON object".into());
    };
    read_start(results, &fields)?;
    match fields.get("kind").and_then(Value::as_str) {
        Some("summary") => {
            let summary = summary(&fields)?;
            if results.summary(&summary.workload, &summary.lock).is_some() {
                return Err(format!(
                    "a second summary of {} on {}: one run per file",
                    summary.lock, summary.workload
                ));
            }
            results.summaries.push(summary);
        }
        Some("ratio") => results.ratios.push(RatioLine {
            workload: text(&fields, "workload")?,
            lock: text(&fields, "lock")?,
            acq_per_s: number(&fields, "acq_per_s")?,
            server_cpu_per_acq: number(&fields, "server_cpu_per_acq")?,
        }),
        Some("source") => {
            let source = &mut results.source;
            source.date = optional_text(&fields, "date")?;
            source.commit = optional_text(&fields, "commit")?;
            source.redis = optional_text(&fields, "redis")?;
            source.uncommitted_changes = match fields.get("uncommitted_changes") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(changed)) => Some(*changed),
                Some(_) => return Err("\"uncommitted_changes\" is not true or false".into()),
            };
        }
        _ => {
            if let Some(deployment) = optional_text(&fields, "deployment")? {
                results.source.deployment = Some(deployment);
            }
        }
    }
    Ok(())
}

/// Every line of a run carries the same start; a second, different one means two runs were
/// put in one file, whose summaries the charts would mix.
fn read_start(results: &mut Results, fields: &Map<String, Value>) -> Result<(), String> {
    if !fields.contains_key("load_start") {
        return Ok(());
    }
    let start = Start {
        load: number(fields, "load_start")?,
        max: number(fields, "max_load")?,
        loaded: fields.get("loaded").and_then(Value::as_bool),
    };
    match results.start {
        Some(first) if first != start => Err(format!(
            "a load at the start ({:?}) other than the first line's ({:?}): one run per file",
            start.load, first.load
        )),
        _ => {
            results.start = Some(start);
            Ok(())
        }
    }
}

fn summary(fields: &Map<String, Value>) -> Result<Summary, String> {
    let wait = |name| number(fields, name);
    Ok(Summary {
        workload: text(fields, "workload")?,
        lock: text(fields, "lock")?,
        reps: fields.get("reps").and_then(Value::as_u64),
        acq_per_s: number(fields, "acq_per_s")?
            .ok_or("a summary line without its \"acq_per_s\"")?,
        server_cpu_us_per_acq: number(fields, "server_cpu_us_per_acq")?,
        waits: Waits {
            p10: wait("wait_p10_us")?,
            p25: wait("wait_p25_us")?,
            p50: wait("wait_p50_us")?,
            p75: wait("wait_p75_us")?,
            p90: wait("wait_p90_us")?,
            p99: wait("wait_p99_us")?,
            p999: wait("wait_p999_us")?,
            max: wait("wait_max_us")?,
        },
    })
}

/// A required text field.
fn text(fields: &Map<String, Value>, name: &str) -> Result<String, String> {
    optional_text(fields, name)?.ok_or(format!("no \"{name}\" in a line of that kind"))
}

fn optional_text(fields: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(format!("\"{name}\" is not text: {other}")),
    }
}

/// A number field: absent or `null` is `None` (nothing measured); anything else but a
/// finite number is an error.
fn number(fields: &Map<String, Value>, name: &str) -> Result<Option<f64>, String> {
    match fields.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => match number.as_f64() {
            Some(value) if value.is_finite() => Ok(Some(value)),
            _ => Err(format!("\"{name}\" is not a finite number: {number}")),
        },
        Some(other) => Err(format!("\"{name}\" is not a number: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = r#""load_start":0.4,"max_load":0.5,"loaded":false"#;

    fn summary_line(lock: &str, workload: &str, rate: f64) -> String {
        format!(
            r#"{{"kind":"summary","lock":"{lock}","workload":"{workload}","reps":3,"acq_per_s":{rate},"wait_p50_us":300.0,"wait_p99_us":900,"wait_max_us":null,{START}}}"#
        )
    }

    #[test]
    fn summaries_ratios_start_and_source_are_read() {
        let text = [
            r#"{"kind":"source","date":"2026-11-28T10:00:00Z","commit":"abc1234","uncommitted_changes":true,"redis":"7.0.15"}"#.to_owned(),
            format!(r#"{{"deployment":"one Redis server",{START}}}"#),
            String::new(),
            summary_line("ours", "uncontended-w1", 3000.0),
            summary_line("rslock", "uncontended-w1", 3100.0),
            summary_line("ours", "contended-w8", 7000.0),
            format!(r#"{{"kind":"ratio","lock":"ours","workload":"uncontended-w1","acq_per_s":0.97,"client_cpu_per_acq":null,"server_cpu_per_acq":1.12,{START}}}"#),
            format!(r#"{{"kind":"target","target":"t","workload":"uncontended-w1",{START}}}"#),
        ]
        .join("\n");
        let results = read_results(&text).unwrap();
        assert_eq!(results.workloads(), ["uncontended-w1", "contended-w8"]);
        assert_eq!(results.reps(), Some((3, 3)));
        let ours = results.summary("uncontended-w1", "ours").unwrap();
        assert_eq!(ours.acq_per_s, 3000.0);
        assert_eq!(ours.waits.p50, Some(300.0));
        assert_eq!(ours.waits.p10, None);
        assert_eq!(ours.waits.max, None);
        let ratio = results.ratio("uncontended-w1", "ours").unwrap();
        assert_eq!(ratio.server_cpu_per_acq, Some(1.12));
        assert_eq!(
            results.start,
            Some(Start {
                load: Some(0.4),
                max: Some(0.5),
                loaded: Some(false)
            })
        );
        assert_eq!(results.source.commit.as_deref(), Some("abc1234"));
        assert_eq!(results.source.uncommitted_changes, Some(true));
        assert_eq!(
            results.source.deployment.as_deref(),
            Some("one Redis server")
        );
    }

    #[test]
    fn a_bad_line_is_named_with_what_is_wrong() {
        let good = summary_line("ours", "uncontended-w1", 3000.0);
        let cases = [
            (
                format!("{good}\n{{\"kind\":\"summary\",")[..].to_owned(),
                "line 2: not a JSON line",
            ),
            (format!("{good}\n[1,2]"), "line 2: not a JSON object"),
            (
                r#"{"kind":"summary","lock":"ours","workload":"w"}"#.to_owned(),
                "line 1: a summary line without its \"acq_per_s\"",
            ),
            (
                r#"{"kind":"summary","lock":"ours","workload":"w","acq_per_s":"fast"}"#.to_owned(),
                "line 1: \"acq_per_s\" is not a number",
            ),
            (
                r#"{"kind":"ratio","workload":"w"}"#.to_owned(),
                "line 1: no \"lock\"",
            ),
            (
                format!("{good}\n{good}"),
                "line 2: a second summary of ours",
            ),
            (
                format!("{good}\n{}", good.replace("0.4", "0.9")),
                "line 2: a load at the start",
            ),
            (
                r#"{"kind":"run","lock":"ours"}"#.to_owned(),
                "no \"summary\" line",
            ),
        ];
        for (text, expected) in cases {
            let problem = read_results(&text).unwrap_err();
            assert!(
                problem.starts_with(expected),
                "{problem:?} should start with {expected:?}"
            );
        }
    }
}

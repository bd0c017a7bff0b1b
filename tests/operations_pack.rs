//! The operations pack in `contrib/`: the Prometheus rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`), each alert with a case where it fires and one
//! where it stays quiet and a runbook in the guide; the Grafana dashboard reads back
//! unchanged in Grafana's dashboard model and its queries parse; and every metric and label
//! the rules and the dashboard name is one the crate emits (`metric_series`), with values it
//! gives, so a renamed metric fails here, not on a pager.
//!
//! `promtool` comes with Debian's `prometheus` package, and the dashboard's model with the
//! PyPI package `grafana-foundation-sdk`; `./scripts/setup.sh` installs both. Without them
//! these tests fail, naming what is missing.

#![cfg(feature = "metrics")]

#[path = "support/promql.rs"]
mod promql;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use promql::{Query, Selector};
use tower_redis_lock::{MetricSeries, MetricShape, metric_series};

const RULES: &str = "contrib/prometheus/tower-redis-lock.rules.yml";
const RULE_TESTS: &str = "contrib/prometheus/tower-redis-lock.tests.yml";
const DASHBOARD: &str = "contrib/grafana/tower-redis-lock.json";
const DASHBOARD_CHECK: &str = "contrib/grafana/check_dashboard.py";
const GUIDE: &str = "src/guide/operating.md";
/// Where every alert's runbook lives: the guide's operating chapter on docs.rs.
const RUNBOOKS: &str =
    "https://docs.rs/tower-redis-lock/latest/tower_redis_lock/guide/operating/index.html#";

fn repository(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repository(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs a tool the pack is checked with; fails naming the set-up when it is missing.
fn run(program: &str, args: &[&str], dir: &Path) -> String {
    let output = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} cannot run ({e}): run ./scripts/setup.sh"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{program} {args:?} failed:\n{text}"
    );
    text
}

/// The value of each `key:` line of a YAML file (every expression and name of the rules is
/// written on one line; [`one_line_values`] holds them to it).
fn values_of<'a>(yaml: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}:");
    yaml.lines()
        .filter_map(|line| {
            let line = line.trim_start().trim_start_matches("- ");
            line.strip_prefix(&prefix)
        })
        .map(|value| value.trim().trim_matches('"'))
        .collect()
}

/// Each recording rule's name and its expression, in the order of the file.
fn recording_rules(rules: &str) -> Vec<(&str, &str)> {
    let names = values_of(rules, "record");
    let all_exprs = values_of(rules, "expr");
    names.into_iter().zip(all_exprs).collect()
}

#[test]
fn one_line_values() {
    let rules = read(RULES);
    for key in ["expr", "record", "alert", "runbook_url"] {
        for value in values_of(&rules, key) {
            assert!(
                !value.is_empty() && !value.starts_with(['|', '>']),
                "{key}: on one line, so the checks here read it whole"
            );
        }
    }
    let rules_count = values_of(&rules, "record").len() + values_of(&rules, "alert").len();
    assert_eq!(values_of(&rules, "expr").len(), rules_count);
}

#[test]
fn promtool_checks_the_rules_and_passes_their_unit_tests() {
    let dir = repository("contrib/prometheus");
    let checked = run(
        "promtool",
        &["check", "rules", "tower-redis-lock.rules.yml"],
        &dir,
    );
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(
        "promtool",
        &["test", "rules", "tower-redis-lock.tests.yml"],
        &dir,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_has_a_firing_and_a_quiet_case_and_a_runbook_in_the_guide() {
    let rules = read(RULES);
    let tests = read(RULE_TESTS);
    let guide = read(GUIDE);
    let alerts = values_of(&rules, "alert");
    let runbooks = values_of(&rules, "runbook_url");
    assert_eq!(alerts.len(), runbooks.len(), "a runbook per alert");
    assert!(alerts.len() >= 10, "{alerts:?}");

    // Each case: the alert it names and whether it expects it firing.
    let mut cases: BTreeMap<&str, BTreeSet<bool>> = BTreeMap::new();
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for (index, line) in lines.iter().enumerate() {
        if let Some(name) = line.strip_prefix("alertname:") {
            let expected = lines[index + 1]
                .strip_prefix("exp_alerts:")
                .expect("exp_alerts after alertname");
            cases
                .entry(name.trim())
                .or_default()
                .insert(expected.trim() != "[]");
        }
    }
    for (alert, runbook) in alerts.iter().zip(&runbooks) {
        assert_eq!(
            cases.get(alert).map(BTreeSet::len),
            Some(2),
            "{alert}: a firing and a quiet case in {RULE_TESTS}"
        );
        // rustdoc's id of a heading is its text in lower case.
        let anchor = alert.to_ascii_lowercase();
        assert_eq!(*runbook, format!("{RUNBOOKS}{anchor}"), "{alert}");
        assert!(
            guide.lines().any(|line| line == format!("### {alert}")),
            "{alert}: no runbook heading in {GUIDE}"
        );
    }
    // No case tests an alert that is not in the rules.
    let unknown: Vec<_> = cases.keys().filter(|name| !alerts.contains(name)).collect();
    assert!(unknown.is_empty(), "{unknown:?}");
}

#[test]
fn the_dashboard_reads_back_unchanged_in_grafanas_dashboard_model() {
    let checked = run("python3", &[DASHBOARD_CHECK, DASHBOARD], &repository(""));
    assert!(checked.contains("unchanged"), "{checked}");
}

/// Every query of the dashboard: its panels' and its variables'.
fn dashboard_queries() -> Vec<String> {
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            // label_values(SELECTOR, LABEL): the selector is PromQL, the label one of its.
            let inner = query
                .strip_prefix("label_values(")
                .and_then(|rest| rest.strip_suffix(')'))
                .expect("label_values");
            let (selector, label) = inner.rsplit_once(',').expect("selector, label");
            queries.push(format!("group by ({}) ({selector})", label.trim()));
        }
    }
    queries
}

/// The dashboard's query with Grafana's variables given values, as Grafana sends it.
fn as_sent(query: &str) -> String {
    query
        .replace("$__rate_interval", "1m")
        .replace("$job", "orders")
        .replace("$instance", "a:8080")
        .replace("$name", "reconcile")
}

#[test]
fn promtool_parses_every_query_of_the_dashboard() {
    let dir = std::env::temp_dir().join(format!("dashboard-queries-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (index, query) in dashboard_queries().iter().enumerate() {
        let query = as_sent(query).replace('\'', "''");
        rules.push_str(&format!(
            "      - record: dashboard_query_{index}\n        expr: '{query}'\n"
        ));
    }
    std::fs::write(dir.join("queries.yml"), rules).unwrap();
    let checked = run("promtool", &["check", "rules", "queries.yml"], &dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(checked.contains("SUCCESS"), "{checked}");
}

/// What a series name in a query stands for: a series the crate exports (a histogram's by
/// its `_bucket`, `_sum` or `_count`), or a recording rule of the rules file.
enum Known<'a> {
    Emitted(&'a MetricSeries),
    Recorded {
        base: &'a MetricSeries,
        labels: BTreeSet<String>,
    },
}

/// Labels every scraped series has, and the bucket bound of a histogram's buckets.
const SCRAPE_LABELS: [&str; 2] = ["job", "instance"];

fn emitted<'a>(series: &'a [MetricSeries], name: &str) -> Option<&'a MetricSeries> {
    series.iter().find(|s| {
        s.name == name
            || (s.shape == MetricShape::Histogram
                && ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| name.strip_suffix(suffix) == Some(s.name)))
    })
}

/// The series a recording rule's name says it is made from (`level:metric:operations`),
/// and the labels its expression keeps.
fn recorded<'a>(series: &'a [MetricSeries], name: &str, expr: &str) -> Option<Known<'a>> {
    let metric = name.split(':').nth(1)?;
    let base = emitted(series, metric).or_else(|| emitted(series, &format!("{metric}_total")))?;
    let mut labels = Query::parse(expr).kept_labels();
    if expr.starts_with("histogram_quantile(") {
        labels.remove("le");
    }
    Some(Known::Recorded { base, labels })
}

/// What is wrong with one selector of a query: an unknown name, a label its series has
/// not, or a value the crate never gives that label.
fn selector_problems(known: &BTreeMap<String, Known>, selector: &Selector) -> Vec<String> {
    let Some(found) = known.get(&selector.name) else {
        return vec![format!("{}: no such series", selector.name)];
    };
    let (base, labels): (&MetricSeries, BTreeSet<String>) = match found {
        Known::Emitted(series) => {
            let mut labels: BTreeSet<String> =
                series.labels.iter().map(|l| l.name.to_owned()).collect();
            labels.extend(SCRAPE_LABELS.map(str::to_owned));
            if selector.name.ends_with("_bucket") {
                labels.insert("le".to_owned());
            }
            (series, labels)
        }
        Known::Recorded { base, labels } => (base, labels.clone()),
    };
    let mut problems = Vec::new();
    for matcher in &selector.matchers {
        if !labels.contains(&matcher.label) {
            problems.push(format!("{}: no label {}", selector.name, matcher.label));
            continue;
        }
        let values = base
            .labels
            .iter()
            .find(|l| l.name == matcher.label)
            .and_then(|l| l.values.as_ref());
        for value in matcher.literal_values() {
            if values.is_some_and(|values| !values.contains(&value.as_str())) {
                problems.push(format!(
                    "{}: {} never takes the value {value:?}",
                    selector.name, matcher.label
                ));
            }
        }
    }
    problems
}

/// Every name, label and value of `queries` checked against what the crate emits.
fn naming_problems(rules: &str, queries: &[String]) -> Vec<String> {
    let series = metric_series();
    let mut known: BTreeMap<String, Known> = series
        .iter()
        .map(|s| (s.name.to_owned(), Known::Emitted(s)))
        .collect();
    let mut problems = Vec::new();
    for (name, expr) in recording_rules(rules) {
        match recorded(&series, name, expr) {
            Some(rule) => drop(known.insert(name.to_owned(), rule)),
            None => problems.push(format!("{name}: names no series the crate emits")),
        }
    }
    let all_labels: BTreeSet<&str> = series
        .iter()
        .flat_map(|s| s.labels.iter().map(|l| l.name))
        .chain(SCRAPE_LABELS)
        .chain(["le"])
        .collect();
    for query in queries {
        let parsed = Query::parse(query);
        for selector in &parsed.selectors {
            let name = &selector.name;
            if !known.contains_key(name) {
                // A histogram's parts are known by their family.
                if let Some(series) = emitted(&series, name) {
                    known.insert(name.clone(), Known::Emitted(series));
                }
            }
            problems.extend(
                selector_problems(&known, selector)
                    .into_iter()
                    .map(|p| format!("{p} in `{query}`")),
            );
        }
        for label in parsed.grouping_labels() {
            if !all_labels.contains(label.as_str()) {
                problems.push(format!(
                    "label {label} is emitted by no series in `{query}`"
                ));
            }
        }
    }
    problems
}

fn rules_and_dashboard_queries(rules: &str) -> Vec<String> {
    values_of(rules, "expr")
        .into_iter()
        .map(str::to_owned)
        .chain(dashboard_queries())
        .collect()
}

#[test]
fn every_metric_label_and_value_the_rules_and_the_dashboard_use_is_one_the_crate_emits() {
    let rules = read(RULES);
    let queries = rules_and_dashboard_queries(&rules);
    assert!(queries.len() > 40, "{} queries", queries.len());
    let problems = naming_problems(&rules, &queries);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn a_misspelt_metric_label_or_value_in_the_rules_is_found() {
    let rules = read(RULES);
    for (right, wrong, found) in [
        (
            "(redis_lock_lost_total[5m])",
            "(redis_lock_lost_totals[5m])",
            "redis_lock_lost_totals: no such series",
        ),
        (
            "{kind=\"unavailable\"}",
            "{knid=\"unavailable\"}",
            "no label knid",
        ),
        (
            "{outcome=\"failed\"}",
            "{outcome=\"fail\"}",
            "outcome never takes the value \"fail\"",
        ),
        (
            "sum by (job, instance, path)",
            "sum by (job, instance, paths)",
            "label paths is emitted by no series",
        ),
    ] {
        assert!(rules.contains(right), "{right}");
        let misspelt = rules.replacen(right, wrong, 1);
        let problems = naming_problems(&misspelt, &rules_and_dashboard_queries(&misspelt));
        assert!(
            problems.iter().any(|p| p.contains(found)),
            "{wrong}: {problems:#?}"
        );
    }
}

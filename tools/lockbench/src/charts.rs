//! `lockbench charts --from results.jsonl --out DIR`: the SVG charts of one run, drawn from
//! the JSON lines it printed, so docs/benchmarks.md shows its comparisons as pictures that
//! one command (`./scripts/charts.sh`) regenerates from data kept beside them.
//!
//! Three charts: acquisitions per second and Redis CPU per acquisition per workload (grouped
//! bars, this library against rslock), and the wait's distribution per workload and lock.
//! The same input always gives the same bytes: nothing in them depends on the clock, the
//! machine or a map's order, so a chart in the repository changes only with its data.

use std::path::{Path, PathBuf};

use crate::chart_bars::{BarChart, draw_bars};
use crate::chart_data::{Results, read_results};
use crate::chart_parts::{grouped, tenths};
use crate::chart_waits::draw_waits;

/// Acquisitions per second: higher is better.
const RATE: BarChart = BarChart {
    title: "Acquisitions per second: this library against rslock",
    subtitle: "Median per workload; under each value, the lock's rate over rslock's in the \
               same run. Higher is better.",
    y_label: "acquisitions per second (1/s)",
    value: |summary| Some(summary.acq_per_s),
    ratio: |ratio| ratio.acq_per_s,
    label: grouped,
};

/// The server's CPU time per acquisition: what a lock costs the Redis a fleet shares.
const REDIS_CPU: BarChart = BarChart {
    title: "Redis CPU per acquisition: this library against rslock",
    subtitle: "Median per workload; under each value, the lock's CPU over rslock's in the \
               same run. Lower is better.",
    y_label: "Redis CPU time per acquisition (µs)",
    value: |summary| summary.server_cpu_us_per_acq,
    ratio: |ratio| ratio.server_cpu_per_acq,
    label: tenths,
};

/// Every chart of `results`: its file name and its SVG text.
pub(crate) fn draw_charts(results: &Results) -> Vec<(&'static str, String)> {
    vec![
        ("acq-per-s.svg", draw_bars(&RATE, results)),
        ("redis-cpu-per-acq.svg", draw_bars(&REDIS_CPU, results)),
        ("wait-distribution.svg", draw_waits(results)),
    ]
}

/// Reads the JSON lines at `from` and writes every chart into `out` (made if missing);
/// returns the files written. The error says which file and line.
pub(crate) fn write_charts(from: &Path, out: &Path) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string(from)
        .map_err(|err| format!("cannot read {}: {err}", from.display()))?;
    let results =
        read_results(&text).map_err(|problem| format!("{}: {problem}", from.display()))?;
    std::fs::create_dir_all(out).map_err(|err| format!("cannot make {}: {err}", out.display()))?;
    let mut written = Vec::new();
    for (name, svg) in draw_charts(&results) {
        let path = out.join(name);
        std::fs::write(&path, svg)
            .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's lines as lockbench prints them (fields it prints but the charts do not read
    /// left out), with the source line `scripts/charts.sh` adds. `ours-pw` has no Redis CPU
    /// on contended-w8, so that chart has one bar fewer.
    const RUN: &str = r#"{"kind":"source","date":"2026-11-28T10:00:00Z","commit":"abc1234","uncommitted_changes":false,"redis":"7.0.15"}
{"deployment":"one Redis server","load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"run","lock":"ours","workload":"uncontended-w1","rep":1,"acq_per_s":3000.0,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"summary","lock":"ours","workload":"uncontended-w1","reps":3,"acq_per_s":3242.0,"server_cpu_us_per_acq":131.5,"wait_p10_us":150.0,"wait_p25_us":200.0,"wait_p50_us":300.0,"wait_p75_us":350.0,"wait_p90_us":420.0,"wait_p99_us":900.0,"wait_p999_us":2000.0,"wait_max_us":5000.0,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"summary","lock":"ours-pw","workload":"uncontended-w1","reps":3,"acq_per_s":3200.5,"server_cpu_us_per_acq":133.0,"wait_p10_us":160.0,"wait_p25_us":210.0,"wait_p50_us":310.0,"wait_p75_us":360.0,"wait_p90_us":430.0,"wait_p99_us":950.0,"wait_p999_us":2100.0,"wait_max_us":5200.0,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"summary","lock":"rslock","workload":"uncontended-w1","reps":3,"acq_per_s":3344.0,"server_cpu_us_per_acq":117.3,"wait_p10_us":140.0,"wait_p25_us":190.0,"wait_p50_us":290.0,"wait_p75_us":340.0,"wait_p90_us":400.0,"wait_p99_us":800.0,"wait_p999_us":1900.0,"wait_max_us":4000.0,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"summary","lock":"ours","workload":"contended-w8","reps":3,"acq_per_s":7100.0,"server_cpu_us_per_acq":40.1,"wait_p10_us":500.0,"wait_p25_us":800.0,"wait_p50_us":1100.0,"wait_p75_us":1300.0,"wait_p90_us":1500.0,"wait_p99_us":2500.0,"wait_p999_us":6000.0,"wait_max_us":9000.0,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"summary","lock":"ours-pw","workload":"contended-w8","reps":3,"acq_per_s":3400.0,"server_cpu_us_per_acq":null,"wait_p10_us":1500.0,"wait_p25_us":2000.0,"wait_p50_us":2300.0,"wait_p75_us":2600.0,"wait_p90_us":3000.0,"wait_p99_us":4000.0,"wait_p999_us":8000.0,"wait_max_us":12000.0,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"summary","lock":"rslock","workload":"contended-w8","reps":3,"acq_per_s":5000.0,"server_cpu_us_per_acq":70.0,"wait_p10_us":10.0,"wait_p25_us":100.0,"wait_p50_us":1000.0,"wait_p75_us":10000.0,"wait_p90_us":20000.0,"wait_p99_us":40000.0,"wait_p999_us":60000.0,"wait_max_us":90000.0,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"ratio","against":"rslock","lock":"ours","workload":"uncontended-w1","acq_per_s":0.9695,"client_cpu_per_acq":1.03,"server_cpu_per_acq":1.121,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"ratio","against":"rslock","lock":"ours","workload":"contended-w8","acq_per_s":1.42,"client_cpu_per_acq":0.6,"server_cpu_per_acq":0.573,"load_start":0.42,"loaded":false,"max_load":0.5}
{"kind":"target","target":"t","workload":"contended-w8","measured":1.0,"load_start":0.42,"loaded":false,"max_load":0.5}
"#;

    fn charts() -> Vec<(&'static str, String)> {
        draw_charts(&read_results(RUN).unwrap())
    }

    fn chart(name: &str) -> String {
        charts()
            .into_iter()
            .find(|(file, _)| *file == name)
            .map(|(_, svg)| svg)
            .unwrap()
    }

    /// Checks the text is well-formed as XML goes for these files: every tag closed in
    /// order, every attribute quoted, every `&` an entity, no `<` or `>` loose in the text.
    fn well_formed(text: &str) -> Result<(), String> {
        let mut open: Vec<String> = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find(['<', '>', '&']) {
            check_text(&rest[..start])?;
            rest = &rest[start..];
            if let Some(after) = rest.strip_prefix('>') {
                return Err(format!("a loose '>' before {after:.40}"));
            }
            if rest.starts_with('&') {
                let end = rest.find(';').ok_or("an '&' without ';'")?;
                if !["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].contains(&&rest[..=end]) {
                    return Err(format!("an unknown entity {}", &rest[..=end]));
                }
                rest = &rest[end + 1..];
                continue;
            }
            let end = rest.find('>').ok_or("a tag that never ends")?;
            let tag = &rest[1..end];
            rest = &rest[end + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                match open.pop() {
                    Some(expected) if expected == name => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            if tag.contains('<') || tag.matches('"').count() % 2 == 1 {
                return Err(format!("a broken tag <{tag}>"));
            }
            let name: String = tag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if name.is_empty() {
                return Err(format!("a tag without a name <{tag}>"));
            }
            if !tag.ends_with('/') {
                open.push(name);
            }
        }
        check_text(rest)?;
        match open.as_slice() {
            [] => Ok(()),
            unclosed => Err(format!("unclosed {unclosed:?}")),
        }
    }

    fn check_text(text: &str) -> Result<(), String> {
        if text.contains(['<', '>']) {
            return Err(format!("markup in text {text:?}"));
        }
        Ok(())
    }

    #[test]
    fn the_checker_finds_broken_markup() {
        assert!(well_formed("<svg><g/><text a=\"1\">x &amp; y</text></svg>").is_ok());
        for broken in [
            "<svg><text></svg>",
            "<svg></text>",
            "<svg>",
            "<svg>a & b</svg>",
            "<svg>a > b</svg>",
            "<svg a=\"1></svg>",
        ] {
            assert!(well_formed(broken).is_err(), "{broken}");
        }
    }

    #[test]
    fn every_chart_is_well_formed_svg_naming_each_lock() {
        let charts = charts();
        assert_eq!(
            charts.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
            [
                "acq-per-s.svg",
                "redis-cpu-per-acq.svg",
                "wait-distribution.svg"
            ]
        );
        for (name, svg) in &charts {
            well_formed(svg).unwrap_or_else(|problem| panic!("{name}: {problem}"));
            assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
            for text in [
                "ours (one client per process)",
                "ours-pw (one client per worker)",
                ">rslock<",
                "uncontended-w1",
                "contended-w8",
                "load average 0.42 at the start (quiet below 0.50)",
                "2026-11-28 · commit abc1234 · Redis 7.0.15, one Redis server",
            ] {
                assert!(svg.contains(text), "{name} lacks {text:?}");
            }
        }
    }

    #[test]
    fn each_lock_and_workload_gets_a_bar_with_its_value_and_ratio() {
        let rate = chart("acq-per-s.svg");
        assert_eq!(rate.matches("class=\"bar\"").count(), 6);
        for label in [
            ">3,242<", ">3,201<", ">3,344<", ">7,100<", ">0.97×<", ">1.42×<",
        ] {
            assert!(rate.contains(label), "no {label}");
        }
        assert!(rate.contains("acquisitions per second (1/s)"));
        // No Redis CPU for ours-pw on contended-w8: no bar, and it says so.
        let cpu = chart("redis-cpu-per-acq.svg");
        assert_eq!(cpu.matches("class=\"bar\"").count(), 5);
        assert_eq!(cpu.matches(">n/a<").count(), 1);
        assert!(cpu.contains(">131.5<") && cpu.contains(">0.57×<"));
        assert!(cpu.contains("Redis CPU time per acquisition (µs)"));
    }

    #[test]
    fn each_lock_and_workload_gets_a_distribution_on_a_log_scale() {
        let waits = chart("wait-distribution.svg");
        assert_eq!(waits.matches("class=\"box\"").count(), 6);
        // From 10 µs (rslock's p10) to 100 ms (its longest wait), one label per decade.
        for tick in [">10 µs<", ">100 µs<", ">1 ms<", ">10 ms<", ">100 ms<"] {
            assert!(waits.contains(tick), "no tick {tick}");
        }
        assert!(!waits.contains(">1 µs<") && !waits.contains(">1 s<"));
        assert!(waits.contains(">300 µs · 900 µs · 5 ms<"));
        assert!(waits.contains("(log scale)"));
    }

    #[test]
    fn the_subtitles_fit_their_chart() {
        for chart in [RATE, REDIS_CPU] {
            assert!(
                crate::chart_parts::text_width(chart.subtitle, 12.0)
                    < crate::chart_bars::WIDTH - 32.0,
                "{}",
                chart.subtitle
            );
        }
    }

    #[test]
    fn the_same_data_gives_the_same_bytes() {
        assert_eq!(charts(), charts());
    }

    #[test]
    fn a_loaded_start_is_said_in_the_caption() {
        let loaded = RUN
            .replace("\"load_start\":0.42", "\"load_start\":1.84")
            .replace("\"loaded\":false", "\"loaded\":true");
        for (name, svg) in draw_charts(&read_results(&loaded).unwrap()) {
            assert!(
                svg.contains("load average 1.84 at the start: LOADED"),
                "{name}"
            );
        }
    }

    #[test]
    fn files_are_written_and_a_malformed_line_is_reported_with_its_number() {
        let dir = std::env::temp_dir().join(format!("lockbench-charts-{}", std::process::id()));
        let from = dir.join("results.jsonl");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&from, RUN).unwrap();
        let written = write_charts(&from, &dir.join("out")).unwrap();
        assert_eq!(written.len(), 3);
        for path in &written {
            assert!(std::fs::read_to_string(path).unwrap().ends_with("</svg>\n"));
        }
        std::fs::write(
            &from,
            RUN.replacen("{\"kind\":\"run\"", "{\"kind\":\"run\",,", 1),
        )
        .unwrap();
        let problem = write_charts(&from, &dir.join("out")).unwrap_err();
        assert!(
            problem.starts_with(&format!("{}: line 3: not a JSON line", from.display())),
            "{problem}"
        );
        let missing = write_charts(&dir.join("missing.jsonl"), &dir.join("out")).unwrap_err();
        assert!(missing.starts_with("cannot read"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! What every chart shares, so they read alike: which locks are drawn and in which colour,
//! the title, the legend, the caption that says which run the chart is from and how loaded
//! the machine was, the scales' ticks and how numbers are written.

use crate::chart_data::Results;
use crate::svg::{Anchor, Stroke, Svg, TextStyle};

/// A lock the charts draw: its name in the JSON lines, its legend label and its colour.
pub(crate) struct ChartLock {
    pub(crate) name: &'static str,
    pub(crate) label: &'static str,
    pub(crate) colour: &'static str,
}

/// The locks the charts compare, in the order of their bars: this library, with one client
/// per process and with one per worker, against rslock. The other locks lockbench runs
/// (`naive`, `bare`) are reference points for its tables, not what the charts are for.
pub(crate) const LOCKS: [ChartLock; 3] = [
    ChartLock {
        name: "ours",
        label: "ours (one client per process)",
        colour: "#1f5f99",
    },
    ChartLock {
        name: "ours-pw",
        label: "ours-pw (one client per worker)",
        colour: "#6fa8dc",
    },
    ChartLock {
        name: "rslock",
        label: "rslock",
        colour: "#e07b39",
    },
];

pub(crate) const GREY: &str = "#666666";
pub(crate) const GRID: &str = "#dddddd";
pub(crate) const AXIS: &str = "#444444";
/// From one caption line to the next.
const CAPTION_LINE: f64 = 15.0;

/// The locks of `LOCKS` that have a summary line in `results`, so a run without `ours-pw`
/// gets no empty legend entry.
pub(crate) fn charted_locks(results: &Results) -> Vec<&'static ChartLock> {
    LOCKS
        .iter()
        .filter(|lock| results.summaries.iter().any(|s| s.lock == lock.name))
        .collect()
}

/// A workload's name said in words, for the line under its name: `contended-w8-2proc` is
/// "8 workers on one key, 2 processes".
pub(crate) fn describe_workload(name: &str) -> String {
    let mut parts = name.split('-');
    let kind = parts.next().unwrap_or_default();
    let workers = parts
        .next()
        .and_then(|w| w.strip_prefix('w'))
        .unwrap_or("?");
    let worker_s = if workers == "1" { "worker" } else { "workers" };
    let keys = match kind {
        "contended" => "on one key",
        _ if workers == "1" => "on its own key",
        _ => "on their own keys",
    };
    match parts.next().and_then(|p| p.strip_suffix("proc")) {
        Some(processes) => format!("{workers} {worker_s} {keys}, {processes} processes"),
        None => format!("{workers} {worker_s} {keys}"),
    }
}

/// A count with thousands separators: 24129.4 is "24,129".
pub(crate) fn grouped(value: f64) -> String {
    let digits = format!("{:.0}", value.abs().round());
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if value < -0.5 { format!("-{out}") } else { out }
}

/// A figure to a tenth, as lockbench's tables print CPU per acquisition: "131.5".
pub(crate) fn tenths(value: f64) -> String {
    format!("{value:.1}")
}

/// A duration in µs, in the unit that keeps it short, to three significant digits without
/// trailing zeros: "312 µs", "1.2 ms", "12.3 ms", "3 s".
pub(crate) fn duration(us: f64) -> String {
    let (value, unit) = match us {
        us if us >= 1e6 => (us / 1e6, "s"),
        us if us >= 1e3 => (us / 1e3, "ms"),
        us => (us, "µs"),
    };
    let decimals = match value {
        v if v >= 100.0 => 0,
        v if v >= 10.0 => 1,
        _ => 2,
    };
    let fixed = format!("{value:.decimals$}");
    let trimmed = if fixed.contains('.') {
        fixed.trim_end_matches('0').trim_end_matches('.')
    } else {
        &fixed
    };
    format!("{trimmed} {unit}")
}

/// Round ticks from 0 past `max` on a linear scale: steps of 1, 2 or 5 times a power of
/// ten, about five of them; the last tick is the top of the scale.
pub(crate) fn linear_ticks(max: f64) -> Vec<f64> {
    let max = if max > 0.0 { max } else { 1.0 };
    let rough = max / 5.0;
    let power = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|step| *step >= rough)
        .unwrap_or(10.0 * power);
    let count = (max / step).ceil() as usize;
    (0..=count).map(|i| i as f64 * step).collect()
}

/// The decades a log scale spans: from the power of ten at or below `min` to the one at or
/// above `max` (1 µs at least), as exponents.
pub(crate) fn decades(min: f64, max: f64) -> (i32, i32) {
    let low = min.max(1.0).log10().floor() as i32;
    let high = (max.max(1.0).log10().ceil() as i32).max(low + 1);
    (low, high)
}

/// The chart's title, left-aligned at the top.
pub(crate) fn draw_title(svg: &mut Svg, title: &str) {
    svg.text(
        (16.0, 26.0),
        title,
        TextStyle::plain(17.0, Anchor::Start).bold(),
    );
}

/// The locks' colours in a row at `y`; returns the x after the last entry.
pub(crate) fn draw_lock_legend(svg: &mut Svg, locks: &[&ChartLock], x: f64, y: f64) -> f64 {
    let mut x = x;
    for lock in locks {
        svg.rect(x, y - 10.0, 12.0, 12.0, lock.colour, "legend");
        svg.text(
            (x + 17.0, y),
            lock.label,
            TextStyle::plain(12.0, Anchor::Start),
        );
        x += 17.0 + text_width(lock.label, 12.0) + 22.0;
    }
    x
}

/// About how wide a text is drawn: the average glyph of a sans-serif face is a little over
/// half its size. Enough to lay out a legend; nothing is clipped when it is off.
pub(crate) fn text_width(text: &str, size: f64) -> f64 {
    text.chars().count() as f64 * size * 0.56
}

/// The caption's parts: which run (date, commit, Redis), how many repetitions, and the load
/// at the start, which decides how far the ratios can be trusted.
pub(crate) fn caption_parts(results: &Results) -> Vec<String> {
    let mut parts = Vec::new();
    let source = &results.source;
    if let Some(date) = &source.date {
        parts.push(date.split('T').next().unwrap_or(date).to_owned());
    }
    if let Some(commit) = &source.commit {
        let changed = if source.uncommitted_changes == Some(true) {
            " with uncommitted changes"
        } else {
            ""
        };
        parts.push(format!("commit {commit}{changed}"));
    }
    match (&source.redis, &source.deployment) {
        (Some(redis), Some(deployment)) => parts.push(format!("Redis {redis}, {deployment}")),
        (Some(redis), None) => parts.push(format!("Redis {redis}")),
        (None, Some(deployment)) => parts.push(deployment.clone()),
        (None, None) => {}
    }
    match results.reps() {
        Some((low, high)) if low == high => parts.push(format!("medians of {low} repetitions")),
        Some((low, high)) => parts.push(format!("medians of {low} to {high} repetitions")),
        None => {}
    }
    parts.push(load_part(results));
    parts
}

fn load_part(results: &Results) -> String {
    let Some(start) = results.start else {
        return "load average at the start not recorded".into();
    };
    let Some(load) = start.load else {
        return "load average at the start unknown".into();
    };
    let threshold = start.max.map(|max| format!("{max:.2}"));
    match (start.loaded, threshold) {
        (Some(true), Some(max)) => format!(
            "load average {load:.2} at the start: LOADED (at or over {max}; ratios converge \
             toward 1)"
        ),
        (Some(false), Some(max)) => {
            format!("load average {load:.2} at the start (quiet below {max})")
        }
        _ => format!("load average {load:.2} at the start"),
    }
}

/// The caption at the foot of the chart, its first line at `top`, in as many lines as the
/// chart's width takes.
pub(crate) fn draw_caption(svg: &mut Svg, results: &Results, top: f64) {
    let lines = caption_lines(&caption_parts(results), svg.width() - 32.0, 11.0);
    for (index, line) in lines.iter().enumerate() {
        svg.text(
            (16.0, top + CAPTION_LINE * index as f64),
            line,
            TextStyle::plain(11.0, Anchor::Start).colour(GREY),
        );
    }
}

/// The height a chart of `width` pixels needs below its caption's first line.
pub(crate) fn caption_height(results: &Results, width: f64) -> f64 {
    let lines = caption_lines(&caption_parts(results), width - 32.0, 11.0).len();
    CAPTION_LINE * lines.saturating_sub(1) as f64 + 12.0
}

/// The parts joined by " · ", broken between parts where a line would grow wider than
/// `width`.
fn caption_lines(parts: &[String], width: f64, size: f64) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for part in parts {
        match lines.last_mut() {
            Some(line) if text_width(&format!("{line} · {part}"), size) <= width => {
                line.push_str(" · ");
                line.push_str(part);
            }
            _ => lines.push(part.clone()),
        }
    }
    lines
}

/// A tick's label on a linear scale of `step`: whole numbers with separators, else as
/// many decimals as the step has.
pub(crate) fn tick_label(value: f64, step: f64) -> String {
    if step >= 1.0 {
        grouped(value)
    } else if step >= 0.1 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// A horizontal grid line with its tick label at the left of a plot.
pub(crate) fn draw_y_tick(svg: &mut Svg, (left, right): (f64, f64), y: f64, label: &str) {
    svg.line((left, y), (right, y), Stroke::solid(GRID, 1.0));
    svg.text(
        (left - 6.0, y + 4.0),
        label,
        TextStyle::plain(11.0, Anchor::End).colour(GREY),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_said_in_words() {
        assert_eq!(
            describe_workload("uncontended-w1"),
            "1 worker on its own key"
        );
        assert_eq!(
            describe_workload("uncontended-w16"),
            "16 workers on their own keys"
        );
        assert_eq!(
            describe_workload("contended-w8-2proc"),
            "8 workers on one key, 2 processes"
        );
    }

    #[test]
    fn numbers_are_written_short() {
        assert_eq!(grouped(24_129.4), "24,129");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(1_000_000.0), "1,000,000");
        assert_eq!(tenths(28.44), "28.4");
        assert_eq!(tenths(131.5), "131.5");
        assert_eq!(duration(312.0), "312 µs");
        assert_eq!(duration(1_234.0), "1.23 ms");
        assert_eq!(duration(12_345.0), "12.3 ms");
        assert_eq!(duration(1_000_000.0), "1 s");
        assert_eq!(duration(2_500.0), "2.5 ms");
        assert_eq!(duration(10_000.0), "10 ms");
        assert_eq!(duration(0.0), "0 µs");
    }

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        assert_eq!(
            linear_ticks(38_000.0),
            [0.0, 10_000.0, 20_000.0, 30_000.0, 40_000.0]
        );
        assert_eq!(linear_ticks(9.0), [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(linear_ticks(0.0).len(), 6);
        assert_eq!(decades(150.0, 45_000.0), (2, 5));
        assert_eq!(decades(0.0, 1.0), (0, 1));
    }

    #[test]
    fn a_long_caption_is_broken_between_parts() {
        let parts = ["a".repeat(50), "b".repeat(50), "c".repeat(10)];
        let lines = caption_lines(&parts, 400.0, 11.0);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1], format!("{} · {}", "b".repeat(50), "c".repeat(10)));
    }
}

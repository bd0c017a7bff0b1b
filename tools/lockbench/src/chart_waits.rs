//! The wait-time distributions: per workload a panel, per lock a box and whiskers on a log
//! scale of time. Waits span from a round trip (hundreds of µs) to a contended queue's tail
//! (tens of ms), and a p50 and a p99 alone hide whether a lock's waits are spread evenly or
//! a few waiters starve; the box (p25 to p75), the whiskers (p10 to p99.9) and the marks at
//! p90, p99 and the longest wait show which.

use crate::chart_data::{Results, Waits};
use crate::chart_parts::{
    AXIS, ChartLock, GREY, GRID, caption_height, charted_locks, decades, describe_workload,
    draw_caption, draw_lock_legend, draw_title, duration, text_width,
};
use crate::svg::{Anchor, Stroke, Svg, TextStyle};

const WIDTH: f64 = 800.0;
const LEFT: f64 = 112.0;
const RIGHT: f64 = 588.0;
/// Where each row's p50, p99 and longest wait are written out.
const VALUES_X: f64 = 604.0;
const PANELS_TOP: f64 = 112.0;
const HEADING: f64 = 24.0;
const ROW: f64 = 24.0;
const PANEL_GAP: f64 = 10.0;
const DARK: &str = "#111111";
const TITLE: &str = "Acquire wait: the distribution per lock and workload";

/// A log scale of µs across the plot.
struct Scale {
    low: f64,
    high: f64,
}

impl Scale {
    fn x(&self, us: f64) -> f64 {
        let exponent = us.max(1.0).log10();
        LEFT + (RIGHT - LEFT) * (exponent - self.low) / (self.high - self.low)
    }
}

/// The chart's SVG text.
pub(crate) fn draw_waits(results: &Results) -> String {
    let locks = charted_locks(results);
    let workloads = results.workloads();
    let panels: Vec<(&str, Vec<(&ChartLock, Waits)>)> = workloads
        .iter()
        .map(|workload| {
            let rows = locks
                .iter()
                .filter_map(|lock| Some((*lock, results.summary(workload, lock.name)?.waits)))
                .collect();
            (*workload, rows)
        })
        .collect();
    let all = || panels.iter().flat_map(|(_, rows)| rows.iter());
    let least = all()
        .flat_map(|(_, waits)| waits.present())
        .fold(f64::INFINITY, f64::min);
    let most = all()
        .flat_map(|(_, waits)| waits.present())
        .fold(0.0, f64::max);
    let (low, high) = decades(if least.is_finite() { least } else { 1.0 }, most);
    let scale = Scale {
        low: low as f64,
        high: high as f64,
    };
    let panels_height: f64 = panels
        .iter()
        .map(|(_, rows)| HEADING + ROW * rows.len() as f64 + PANEL_GAP)
        .sum();
    let bottom = PANELS_TOP + panels_height;
    let height = bottom + 62.0 + caption_height(results, WIDTH);
    let mut svg = Svg::new(WIDTH, height, TITLE);
    draw_title(&mut svg, TITLE);
    svg.text(
        (16.0, 46.0),
        "Each percentile is the median over the repetitions; log scale of time.",
        TextStyle::plain(12.0, Anchor::Start).colour(GREY),
    );
    draw_lock_legend(&mut svg, &locks, 16.0, 70.0);
    draw_key(&mut svg, 94.0);
    draw_grid(&mut svg, (low, high), &scale, PANELS_TOP, bottom);
    let mut top = PANELS_TOP;
    for (workload, rows) in &panels {
        draw_panel(&mut svg, workload, rows, &scale, top);
        top += HEADING + ROW * rows.len() as f64 + PANEL_GAP;
    }
    svg.text(
        ((LEFT + RIGHT) / 2.0, bottom + 36.0),
        "wait from acquire called to acquire returned (log scale)",
        TextStyle::plain(12.0, Anchor::Middle),
    );
    draw_caption(&mut svg, results, bottom + 62.0);
    svg.finish()
}

/// Vertical lines at every power of ten (labelled below the panels) and fainter ones at
/// two and five times it.
fn draw_grid(svg: &mut Svg, (low, high): (i32, i32), scale: &Scale, top: f64, bottom: f64) {
    for exponent in low..=high {
        let decade = 10f64.powi(exponent);
        let x = scale.x(decade);
        svg.line((x, top), (x, bottom), Stroke::solid(GRID, 1.0));
        svg.text(
            (x, bottom + 16.0),
            &duration(decade),
            TextStyle::plain(11.0, Anchor::Middle).colour(GREY),
        );
        if exponent < high {
            for multiple in [2.0, 5.0] {
                let x = scale.x(decade * multiple);
                svg.line((x, top), (x, bottom), Stroke::dashed(GRID, 0.8));
            }
        }
    }
    svg.line((LEFT, bottom), (RIGHT, bottom), Stroke::solid(AXIS, 1.0));
}

/// One workload: its name, the header of the values' column, and a row per lock.
fn draw_panel(
    svg: &mut Svg,
    workload: &str,
    rows: &[(&ChartLock, Waits)],
    scale: &Scale,
    top: f64,
) {
    svg.text(
        (16.0, top + 16.0),
        workload,
        TextStyle::plain(12.0, Anchor::Start).bold(),
    );
    svg.text(
        (26.0 + bold_width(workload), top + 16.0),
        &describe_workload(workload),
        TextStyle::plain(11.0, Anchor::Start).colour(GREY),
    );
    svg.text(
        (VALUES_X, top + 16.0),
        "p50 · p99 · longest",
        TextStyle::plain(11.0, Anchor::Start).colour(GREY),
    );
    for (index, (lock, waits)) in rows.iter().enumerate() {
        let centre = top + HEADING + ROW * (index as f64 + 0.5);
        svg.text(
            (LEFT - 10.0, centre + 4.0),
            lock.name,
            TextStyle::plain(12.0, Anchor::End),
        );
        draw_row(svg, lock, waits, scale, centre);
        let value = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), duration);
        svg.text(
            (VALUES_X, centre + 4.0),
            &format!(
                "{} · {} · {}",
                value(waits.p50),
                value(waits.p99),
                value(waits.max)
            ),
            TextStyle::plain(11.0, Anchor::Start),
        );
    }
}

/// About how wide a bold 12-pixel text is drawn: wider than `text_width`'s plain glyphs.
fn bold_width(text: &str) -> f64 {
    text.chars().count() as f64 * 7.6
}

/// One lock's box and whiskers; each mark is drawn only where its figure is present (older
/// lockbench lines carry p50, p99 and the longest wait only).
fn draw_row(svg: &mut Svg, lock: &ChartLock, waits: &Waits, scale: &Scale, y: f64) {
    let x = |us: f64| scale.x(us);
    let colour = Stroke::solid(lock.colour, 1.5);
    let low = waits.p10.or(waits.p25).or(waits.p50);
    let high = waits.p999.or(waits.p99).or(waits.p90).or(waits.p75);
    if let (Some(low), Some(high)) = (low, high) {
        svg.line((x(low), y), (x(high), y), colour);
    }
    for cap in [waits.p10, waits.p999].into_iter().flatten() {
        svg.line((x(cap), y - 5.0), (x(cap), y + 5.0), colour);
    }
    if let (Some(p25), Some(p75)) = (waits.p25, waits.p75) {
        svg.outlined_rect(
            (x(p25), y - 7.0, x(p75) - x(p25), 14.0),
            lock.colour,
            0.35,
            Stroke::solid(lock.colour, 1.2),
            "box",
        );
    }
    if let Some(p90) = waits.p90 {
        svg.line(
            (x(p90), y - 6.0),
            (x(p90), y + 6.0),
            Stroke::solid(DARK, 1.0),
        );
    }
    if let Some(p50) = waits.p50 {
        svg.line(
            (x(p50), y - 8.0),
            (x(p50), y + 8.0),
            Stroke::solid(DARK, 2.5),
        );
    }
    if let Some(p99) = waits.p99 {
        svg.circle(
            (x(p99), y),
            3.5,
            Some(lock.colour),
            Stroke::solid(DARK, 1.0),
        );
    }
    if let Some(max) = waits.max {
        svg.circle((x(max), y), 4.0, None, Stroke::solid(DARK, 1.2));
    }
}

/// What each mark of a row stands for, each drawn as in the rows.
fn draw_key(svg: &mut Svg, y: f64) {
    let style = TextStyle::plain(11.0, Anchor::Start).colour(GREY);
    let mut x = 16.0;
    let label = |svg: &mut Svg, x: &mut f64, mark_width: f64, text: &str| {
        svg.text((*x + mark_width + 5.0, y + 4.0), text, style);
        *x += mark_width + 5.0 + text_width(text, 11.0) + 16.0;
    };
    // A vertical mark at `x`, `half` above and below the key's line.
    let tick = |svg: &mut Svg, x: f64, half: f64, stroke: Stroke| {
        svg.line((x, y - half), (x, y + half), stroke);
    };
    let dark = Stroke::solid(DARK, 1.2);
    svg.outlined_rect((x, y - 6.0, 18.0, 12.0), GREY, 0.35, dark, "");
    label(svg, &mut x, 18.0, "box: p25 to p75");
    tick(svg, x + 4.0, 8.0, Stroke::solid(DARK, 2.5));
    label(svg, &mut x, 8.0, "p50");
    svg.line((x, y), (x + 24.0, y), dark);
    tick(svg, x, 5.0, dark);
    tick(svg, x + 24.0, 5.0, dark);
    label(svg, &mut x, 24.0, "whiskers: p10 to p99.9");
    tick(svg, x + 3.0, 6.0, Stroke::solid(DARK, 1.0));
    label(svg, &mut x, 6.0, "p90");
    svg.circle((x + 4.0, y), 3.5, Some(GREY), Stroke::solid(DARK, 1.0));
    label(svg, &mut x, 8.0, "p99");
    svg.circle((x + 4.0, y), 4.0, None, dark);
    label(svg, &mut x, 8.0, "longest wait, drain included");
}

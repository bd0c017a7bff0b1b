//! Grouped bar charts: one group per workload, one bar per lock, each with its value and,
//! for this library's locks, its ratio to rslock's from the same run's `ratio` line, so the
//! comparison the page makes can be read off the chart without a ruler.

use crate::chart_data::{RatioLine, Results, Summary};
use crate::chart_parts::{
    AXIS, ChartLock, GREY, caption_height, charted_locks, describe_workload, draw_caption,
    draw_lock_legend, draw_title, draw_y_tick, linear_ticks, tick_label,
};
use crate::svg::{Anchor, Stroke, Svg, TextStyle};

/// What one bar chart shows: which figure of a summary line, which of a ratio line, and
/// how they are labelled.
pub(crate) struct BarChart {
    pub(crate) title: &'static str,
    pub(crate) subtitle: &'static str,
    /// The vertical axis's label, with its unit.
    pub(crate) y_label: &'static str,
    pub(crate) value: fn(&Summary) -> Option<f64>,
    pub(crate) ratio: fn(&RatioLine) -> Option<f64>,
    /// A bar's value as its label says it.
    pub(crate) label: fn(f64) -> String,
}

pub(crate) const WIDTH: f64 = 760.0;
const LEFT: f64 = 88.0;
const RIGHT: f64 = WIDTH - 20.0;
const PLOT_TOP: f64 = 96.0;
const PLOT_BOTTOM: f64 = 336.0;
/// The gap between two bars of one group.
const BAR_GAP: f64 = 4.0;

/// The chart's SVG text.
pub(crate) fn draw_bars(chart: &BarChart, results: &Results) -> String {
    let height = PLOT_BOTTOM + 86.0 + caption_height(results, WIDTH);
    let mut svg = Svg::new(WIDTH, height, chart.title);
    draw_title(&mut svg, chart.title);
    svg.text(
        (16.0, 46.0),
        chart.subtitle,
        TextStyle::plain(12.0, Anchor::Start).colour(GREY),
    );
    let locks = charted_locks(results);
    draw_lock_legend(&mut svg, &locks, 16.0, 70.0);
    let workloads = results.workloads();
    let highest = workloads
        .iter()
        .flat_map(|workload| locks.iter().map(move |lock| (workload, lock)))
        .filter_map(|(workload, lock)| results.summary(workload, lock.name))
        .filter_map(chart.value)
        .fold(0.0, f64::max);
    // Room above the highest bar for its two lines of labels.
    let ticks = linear_ticks(highest * 1.15);
    let top = ticks.last().copied().unwrap_or(1.0);
    let step = ticks.get(1).copied().unwrap_or(top);
    let y = |value: f64| PLOT_BOTTOM - (PLOT_BOTTOM - PLOT_TOP) * value / top;
    for tick in &ticks {
        draw_y_tick(&mut svg, (LEFT, RIGHT), y(*tick), &tick_label(*tick, step));
    }
    svg.text(
        (22.0, (PLOT_TOP + PLOT_BOTTOM) / 2.0),
        chart.y_label,
        TextStyle::plain(12.0, Anchor::Middle).vertical(),
    );
    let group_width = (RIGHT - LEFT) / workloads.len().max(1) as f64;
    let bar_width = (group_width * 0.78 / locks.len().max(1) as f64 - BAR_GAP).min(64.0);
    for (index, workload) in workloads.iter().enumerate() {
        let centre = LEFT + group_width * (index as f64 + 0.5);
        let group = Group {
            workload,
            centre,
            bar_width,
        };
        draw_group(&mut svg, chart, results, &locks, &group, &y);
    }
    svg.line(
        (LEFT, PLOT_BOTTOM),
        (RIGHT, PLOT_BOTTOM),
        Stroke::solid(AXIS, 1.0),
    );
    svg.text(
        ((LEFT + RIGHT) / 2.0, PLOT_BOTTOM + 58.0),
        "workload (workers, keys, processes)",
        TextStyle::plain(12.0, Anchor::Middle),
    );
    draw_caption(&mut svg, results, PLOT_BOTTOM + 86.0);
    svg.finish()
}

/// Where one workload's bars go.
struct Group<'a> {
    workload: &'a str,
    centre: f64,
    bar_width: f64,
}

/// One workload's bars, their labels, and its name under them.
fn draw_group(
    svg: &mut Svg,
    chart: &BarChart,
    results: &Results,
    locks: &[&ChartLock],
    group: &Group,
    y: &dyn Fn(f64) -> f64,
) {
    let width = locks.len() as f64 * (group.bar_width + BAR_GAP) - BAR_GAP;
    let mut x = group.centre - width / 2.0;
    for lock in locks {
        let summary = results.summary(group.workload, lock.name);
        let mid = x + group.bar_width / 2.0;
        match summary.and_then(chart.value) {
            Some(value) => {
                let top = y(value);
                svg.rect(
                    x,
                    top,
                    group.bar_width,
                    PLOT_BOTTOM - top,
                    lock.colour,
                    "bar",
                );
                let ratio = results
                    .ratio(group.workload, lock.name)
                    .and_then(chart.ratio);
                let value_y = if ratio.is_some() {
                    top - 17.0
                } else {
                    top - 5.0
                };
                svg.text(
                    (mid, value_y),
                    &(chart.label)(value),
                    TextStyle::plain(11.0, Anchor::Middle),
                );
                if let Some(ratio) = ratio {
                    svg.text(
                        (mid, top - 5.0),
                        &format!("{ratio:.2}×"),
                        TextStyle::plain(10.0, Anchor::Middle).colour(GREY),
                    );
                }
            }
            // A lock that ran without this figure, or did not run the workload.
            None => svg.text(
                (mid, PLOT_BOTTOM - 5.0),
                "n/a",
                TextStyle::plain(10.0, Anchor::Middle).colour(GREY),
            ),
        }
        x += group.bar_width + BAR_GAP;
    }
    svg.text(
        (group.centre, PLOT_BOTTOM + 18.0),
        group.workload,
        TextStyle::plain(12.0, Anchor::Middle).bold(),
    );
    svg.text(
        (group.centre, PLOT_BOTTOM + 34.0),
        &describe_workload(group.workload),
        TextStyle::plain(11.0, Anchor::Middle).colour(GREY),
    );
}

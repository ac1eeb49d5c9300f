//! What the benchmarks report beside their times: a progress bar while they run (drawn
//! only on a terminal), the device memory each op held ([`MemorySpan`]), and SVG charts
//! of their tables ([`bar_chart`]).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kfuse::runtime::pool::size_class;
use kfuse::{Device, Tensor};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

/// A bar over `len` steps on standard error, drawn only when standard error is a terminal
/// (hidden otherwise, so that logs and captured output stay as they were). Lines printed
/// while it runs go through [`ProgressBar::suspend`].
pub fn progress(len: usize, what: &str) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(len as u64), target);
    let style = ProgressStyle::with_template("{prefix} [{bar:32}] {pos}/{len} {elapsed_precise} {msg}").map(|s| s.progress_chars("=> "));
    if let Ok(style) = style {
        bar.set_style(style);
    }
    bar.set_prefix(what.to_string());
    bar
}

/// `$KFUSE_BENCH_OUT`, where a benchmark writes its tables and charts, when set.
pub fn out_dir() -> Option<PathBuf> {
    std::env::var_os("KFUSE_BENCH_OUT").map(PathBuf::from)
}

/// The device memory of a span of a benchmark: the most the GPU's pool held above what it
/// held when the span opened ([`kfuse::runtime::MemoryStats`], in the pool's block sizes).
/// Opening a span starts the pool's peak over, so spans do not nest.
pub struct MemorySpan {
    start: usize,
}

impl MemorySpan {
    pub fn open(dev: &Device) -> Self {
        dev.reset_peak_memory_stats();
        MemorySpan { start: dev.memory_stats().allocated_bytes }
    }

    /// Bytes above the start that the pool held at its peak since the span opened.
    pub fn peak(&self, dev: &Device) -> usize {
        dev.memory_stats().peak_allocated_bytes.saturating_sub(self.start)
    }
}

/// What the pool gives these tensors' storage: each rounded up to its block
/// ([`size_class`]). Views sharing one storage count once per entry given.
pub fn pool_bytes(ts: &[&Tensor]) -> usize {
    ts.iter().map(|t| size_class(t.storage_bytes()).unwrap_or(usize::MAX)).fold(0, usize::saturating_add)
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: usize) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 20) as f64)
}

/// One series of a [`Panel`]: its name and a value per group (`None`: no bar there).
pub struct Series {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// A grouped bar chart: a group of bars per label (left to right), one bar per series in
/// each group (a colour per series, named in the legend), and, when given, a horizontal
/// reference line with its name (1.0 for a ratio, a ceiling for bandwidth).
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub labels: Vec<String>,
    pub series: Vec<Series>,
    pub reference: Option<(f64, String)>,
}

/// Writes `panels` as one SVG file, `columns` panels a row.
pub fn bar_charts(path: &Path, panels: &[Panel], columns: usize) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("chart {}: {e}", path.display());
    let columns = columns.clamp(1, panels.len().max(1));
    let rows = panels.len().div_ceil(columns).max(1);
    let width = panels.iter().map(panel_width).max().unwrap_or(640);
    let root = SVGBackend::new(path, (width * columns as u32, 480 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    for (area, panel) in root.split_evenly((rows, columns)).iter().zip(panels) {
        draw_panel(area, panel).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// Room for each group's label, written level under it.
fn panel_width(p: &Panel) -> u32 {
    let longest = p.labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let group = (7 * longest + 12).max(24 * (p.series.len() + 1)) as u32;
    (140 + group * p.labels.len() as u32).clamp(640, 2400)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_panel(area: &Area<'_>, p: &Panel) -> Result<(), String> {
    let per = p.series.len() + 1; // a segment per series, then a gap
    let segments = (p.labels.len() * per).saturating_sub(1) as i32;
    let values = p.series.iter().flat_map(|s| s.values.iter().flatten()).copied();
    let top = values.chain(p.reference.as_ref().map(|r| r.0)).filter(|v| v.is_finite()).fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d((0..segments).into_segmented(), 0.0..top).map_err(text)?;
    // a group's label under its middle bar
    let label_at = |v: &SegmentValue<i32>| match v {
        SegmentValue::CenterOf(j) if (*j as usize) % per == p.series.len() / 2 => p.labels.get(*j as usize / per).cloned().unwrap_or_default(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(segments.max(1) as usize)
        .x_label_formatter(&label_at)
        .x_label_style(("sans-serif", 12))
        .y_desc(p.y_label.as_str())
        .draw().map_err(text)?;
    for (k, s) in p.series.iter().enumerate() {
        let colour = Palette99::pick(k).to_rgba();
        let bars = s.values.iter().enumerate().filter_map(|(g, v)| v.filter(|v| v.is_finite()).map(|v| (g, v))).map(move |(g, v)| {
            let j = (g * per + k) as i32;
            Rectangle::new([(SegmentValue::Exact(j), 0.0), (SegmentValue::Exact(j + 1), v)], colour.filled())
        });
        chart.draw_series(bars).map_err(text)?.label(s.name.clone()).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    if let Some((value, name)) = &p.reference {
        let line = PathElement::new(vec![(SegmentValue::Exact(0), *value), (SegmentValue::Exact(segments + 1), *value)], BLACK.stroke_width(1));
        chart.draw_series(std::iter::once(line)).map_err(text)?.label(name.clone()).legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], BLACK));
    }
    chart.configure_series_labels().position(SeriesLabelPosition::UpperLeft).background_style(WHITE.mix(0.85)).border_style(BLACK).draw().map_err(text)?;
    Ok(())
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}

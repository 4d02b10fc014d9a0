//! Plots of simulated per-job throughput, like PADLL Figs. 7–9 (PNG and SVG).
//!
//! Text is rendered with an embedded DejaVu Sans font (the `dejavu` crate) through
//! plotters' `ab_glyph` backend, so no system font library (fontconfig, freetype) or
//! font package is needed.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;

use crate::sim::{Scenario, SimResult};

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            dejavu::sans::regular(),
        );
    });
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];

/// A plot that could not be drawn: the file and the drawing backend's reason (its
/// error type differs per backend, so it is kept as its message).
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", file.display())]
pub struct PlotError {
    /// The PNG or SVG file.
    pub file: std::path::PathBuf,
    /// Why.
    pub reason: String,
}

impl PlotError {
    fn new(file: &Path, reason: String) -> PlotError {
        PlotError {
            file: file.to_path_buf(),
            reason,
        }
    }
}

/// Draw `r` into `png` and `svg` (either may be `None`): one line per job (kops/s at
/// 1-second intervals), the aggregate in grey and `Max_R` as a dashed red line.
pub fn plot(
    scenario: &Scenario,
    r: &SimResult,
    png: Option<&Path>,
    svg: Option<&Path>,
) -> Result<(), PlotError> {
    let title = format!(
        "{} — {} (makespan {} min)",
        scenario.name,
        r.policy,
        crate::sim::minutes(r.makespan())
    );
    let labels: Vec<String> = scenario
        .jobs
        .iter()
        .map(|j| format!("job {}", j.id))
        .collect();
    plot_rates(&title, &labels, &r.throughput, scenario.max_rate, png, svg)
}

/// Draw per-second rates (`throughput[s][j]`, ops/s) of labelled jobs with their
/// aggregate and `max_rate`: the simulator's plots and the controller demo's. Time is in
/// seconds for runs under five minutes, minutes beyond.
pub fn plot_rates(
    title: &str,
    labels: &[String],
    throughput: &[Vec<f64>],
    max_rate: f64,
    png: Option<&Path>,
    svg: Option<&Path>,
) -> Result<(), PlotError> {
    register_font();
    let chart = Chart {
        title,
        labels,
        throughput,
        max_rate,
    };
    if let Some(p) = png {
        let root = BitMapBackend::new(p, (1100, 420)).into_drawing_area();
        draw(root, &chart).map_err(|e| PlotError::new(p, e))?;
    }
    if let Some(p) = svg {
        let root = SVGBackend::new(p, (1100, 420)).into_drawing_area();
        draw(root, &chart).map_err(|e| PlotError::new(p, e))?;
    }
    Ok(())
}

struct Chart<'a> {
    title: &'a str,
    labels: &'a [String],
    throughput: &'a [Vec<f64>],
    max_rate: f64,
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    c: &Chart,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (unit, unit_name) = if c.throughput.len() < 300 {
        (1.0, "seconds")
    } else {
        (60.0, "minutes")
    };
    let span = (c.throughput.len() as f64 / unit).max(1.0);
    let peak = c
        .throughput
        .iter()
        .map(|row| row.iter().sum::<f64>())
        .fold(c.max_rate, f64::max)
        / 1000.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(c.title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..span, 0f64..peak * 1.05)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(format!("time ({unit_name})"))
        .y_desc("metadata rate (kops/s)")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    let total = c
        .throughput
        .iter()
        .enumerate()
        .map(|(s, row)| (s as f64 / unit, row.iter().sum::<f64>() / 1000.0));
    chart
        .draw_series(LineSeries::new(total, RGBColor(170, 170, 170)))
        .map_err(e)?
        .label("aggregate")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], RGBColor(170, 170, 170)));
    for (k, label) in c.labels.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let pts =
            c.throughput.iter().enumerate().map(move |(s, row)| {
                (s as f64 / unit, row.get(k).copied().unwrap_or(0.0) / 1000.0)
            });
        chart
            .draw_series(LineSeries::new(pts, color))
            .map_err(e)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
    }
    let max_k = c.max_rate / 1000.0;
    // Max_R as a dashed line (short segments).
    let mut x = 0.0;
    while x < span {
        let x2 = (x + span / 120.0).min(span);
        chart
            .draw_series(LineSeries::new(
                [(x, max_k), (x2, max_k)],
                RED.stroke_width(2),
            ))
            .map_err(e)?;
        x += span / 60.0;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// One named series of `(x, y)` points for [`plot_lines`].
pub type Series = (String, Vec<(f64, f64)>);

/// A generic line chart (the placement simulator's Figs. 11, 12 and 17): one line per
/// series, with markers when `markers`; `y_min` is the bottom of the y axis.
#[allow(clippy::too_many_arguments)]
pub fn plot_lines(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    y_min: f64,
    markers: bool,
    png: Option<&Path>,
    svg: Option<&Path>,
) -> Result<(), PlotError> {
    register_font();
    let lines = Lines {
        title,
        x_desc,
        y_desc,
        series,
        y_min,
        markers,
    };
    if let Some(p) = png {
        let root = BitMapBackend::new(p, (900, 420)).into_drawing_area();
        draw_lines(root, &lines).map_err(|e| PlotError::new(p, e))?;
    }
    if let Some(p) = svg {
        let root = SVGBackend::new(p, (900, 420)).into_drawing_area();
        draw_lines(root, &lines).map_err(|e| PlotError::new(p, e))?;
    }
    Ok(())
}

struct Lines<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    series: &'a [Series],
    y_min: f64,
    markers: bool,
}

fn draw_lines<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    c: &Lines,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let pts = || c.series.iter().flat_map(|s| s.1.iter());
    let x0 = pts().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x1 = pts().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let y1 = pts().map(|p| p.1).fold(c.y_min, f64::max);
    let (x0, x1) = if x0.is_finite() && x1 > x0 {
        (x0, x1)
    } else {
        (0.0, 1.0)
    };
    let y1 = if y1 > c.y_min { y1 } else { c.y_min + 1.0 };
    let mut chart = ChartBuilder::on(&root)
        .caption(c.title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(x0..x1, c.y_min..y1 * 1.05)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(c.x_desc)
        .y_desc(c.y_desc)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    for (k, (label, points)) in c.series.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(e)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color));
        if c.markers {
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

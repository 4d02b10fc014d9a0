//! Plots of simulated per-job throughput, like PADLL Figs. 7–9 (PNG and SVG).
//!
//! Text is rendered with an embedded DejaVu Sans font (the `dejavu` crate) through
//! plotters' `ab_glyph` backend, so no system font library (fontconfig, freetype) or
//! font package is needed.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
/// seconds for runs under five minutes, minutes beyond. The legend has a band of its own
/// right of the plot, so it never hides a line.
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
        let root = BitMapBackend::new(p, RATES_SIZE).into_drawing_area();
        draw(root, &chart).map_err(|e| PlotError::new(p, e))?;
    }
    if let Some(p) = svg {
        let root = SVGBackend::new(p, RATES_SIZE).into_drawing_area();
        draw(root, &chart).map_err(|e| PlotError::new(p, e))?;
    }
    Ok(())
}

/// Pixels of a rates plot, and of the legend band at its right.
const RATES_SIZE: (u32, u32) = (1200, 420);
const LEGEND_WIDTH: u32 = 210;

/// The aggregate's colour (the jobs take [`COLORS`]).
const GREY: RGBColor = RGBColor(170, 170, 170);

struct Chart<'a> {
    title: &'a str,
    labels: &'a [String],
    throughput: &'a [Vec<f64>],
    max_rate: f64,
}

/// How a legend entry's sample is drawn.
enum Sample {
    Line(RGBColor),
    Dashed(RGBColor),
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
    let (plot_area, legend_area) = root.split_horizontally(RATES_SIZE.0 - LEGEND_WIDTH);
    // Minutes for long runs, whose dense lines are drawn thin.
    let (unit, unit_name, width) = if c.throughput.len() < 300 {
        (1.0, "seconds", 2)
    } else {
        (60.0, "minutes", 1)
    };
    let span = (c.throughput.len() as f64 / unit).max(1.0);
    let peak = c
        .throughput
        .iter()
        .map(|row| row.iter().sum::<f64>())
        .fold(c.max_rate, f64::max)
        / 1000.0;
    let mut chart = ChartBuilder::on(&plot_area)
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
        .draw_series(LineSeries::new(total, GREY.stroke_width(width)))
        .map_err(e)?;
    for k in 0..c.labels.len() {
        let pts =
            c.throughput.iter().enumerate().map(move |(s, row)| {
                (s as f64 / unit, row.get(k).copied().unwrap_or(0.0) / 1000.0)
            });
        chart
            .draw_series(LineSeries::new(
                pts,
                COLORS[k % COLORS.len()].stroke_width(width),
            ))
            .map_err(e)?;
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

    let mut entries = vec![
        (
            format!("Max_R = {:.0} ops/s", c.max_rate),
            Sample::Dashed(RED),
        ),
        ("aggregate".to_string(), Sample::Line(GREY)),
    ];
    entries.extend(
        c.labels
            .iter()
            .enumerate()
            .map(|(k, label)| (label.clone(), Sample::Line(COLORS[k % COLORS.len()]))),
    );
    draw_legend(&legend_area, &entries).map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}

/// The legend, one entry a line from the top of `area` (level with the plot's top).
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(String, Sample)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let text =
        TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (label, sample)) in entries.iter().enumerate() {
        let y = 50 + 22 * i as i32;
        match sample {
            Sample::Line(color) => {
                area.draw(&PathElement::new([(4, y), (34, y)], color.stroke_width(2)))?
            }
            Sample::Dashed(color) => {
                for x in [4, 16, 28] {
                    area.draw(&PathElement::new(
                        [(x, y), (x + 6, y)],
                        color.stroke_width(2),
                    ))?;
                }
            }
        }
        area.draw(&Text::new(label.as_str(), (42, y), text.clone()))?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The x of each `<text>` of an SVG with its text, and of each point of its
    /// `<polyline>`s with more than two points (the series; dashes and legend samples
    /// have two).
    fn texts_and_series_xs(svg: &str) -> (Vec<(f64, String)>, Vec<f64>) {
        let texts = svg
            .split("<text x=\"")
            .skip(1)
            .map(|t| {
                let x = t.split('"').next().unwrap().parse().unwrap();
                let text = t.split('>').nth(1).unwrap().split('<').next().unwrap();
                (x, text.trim().to_string())
            })
            .collect();
        let series = svg
            .split("points=\"")
            .skip(1)
            .map(|p| p.split('"').next().unwrap())
            .filter(|points| points.split_whitespace().count() > 2)
            .flat_map(|points| points.split_whitespace())
            .map(|point| point.split(',').next().unwrap().parse().unwrap())
            .collect();
        (texts, series)
    }

    #[test]
    fn the_rates_legend_names_max_r_and_stays_clear_of_the_lines() {
        let dir = std::env::temp_dir().join(format!("plot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("rates.svg");
        let labels = ["job-1".to_string(), "job-2".to_string()];
        // Lines at Max_R over the whole time axis, up to its right end.
        let rates: Vec<Vec<f64>> = (0..40).map(|s| vec![3000.0, 3000.0 - s as f64]).collect();
        plot_rates("test", &labels, &rates, 6000.0, None, Some(&svg)).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();

        let (texts, series) = texts_and_series_xs(&text);
        let rightmost = series.iter().copied().fold(f64::MIN, f64::max);
        assert!(
            series.len() >= 3 * 40,
            "three series of 40 points: {series:?}"
        );
        for label in ["Max_R = 6000 ops/s", "aggregate", "job-1", "job-2"] {
            let (x, _) = texts
                .iter()
                .find(|(_, t)| t == label)
                .unwrap_or_else(|| panic!("no legend entry {label}: {texts:?}"));
            assert!(
                *x > rightmost,
                "{label} at x {x}, a line reaches {rightmost}"
            );
        }
    }
}

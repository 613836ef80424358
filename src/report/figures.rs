//! Line charts with plotters, written as PNG and SVG (atomically) or shown inline in an evcxr
//! notebook.
//!
//! One model, [`LineChart`], covers every figure the experiments draw: training curves,
//! precision–recall curves, parameter sweeps (paper markers beside our line) and few-shot
//! accuracies with confidence intervals (error bars or bands). The builders in
//! [`super::standard_charts`] fill it from the library's types.
//!
//! The PNG is drawn into an in-memory RGB buffer and encoded with the `image` crate, so no
//! second image library is linked; the SVG is plotters' own.

use super::fonts::{ensure_font, FONT_FAMILY};
use crate::error::{Error, Result};
use crate::io::write_atomically;
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Default figure size in pixels (width, height).
pub const DEFAULT_SIZE: (u32, u32) = (800, 520);

/// Okabe–Ito colours (distinguishable with the common colour-vision deficiencies), black last.
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

/// Marker shape of a series' points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// Filled circle (our values by convention).
    Circle,
    /// Filled triangle (the paper's values by convention).
    Triangle,
    /// Cross.
    Cross,
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeriesStyle {
    /// A line through the points.
    Line,
    /// Markers only.
    Markers(Marker),
    /// A line with a marker at each point.
    LineAndMarkers(Marker),
}

/// How a series' intervals are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalStyle {
    /// A vertical bar with caps at each point.
    Bars,
    /// A translucent band between the lower and upper ends.
    Band,
}

/// One named series of `(x, y)` points, drawn in its order.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// Points, in drawing order.
    pub points: Vec<(f64, f64)>,
    /// Half-widths of an interval around each `y` (e.g. a 95% confidence half-width), one per
    /// point.
    pub intervals: Option<Vec<f64>>,
    /// Bars or band for `intervals`.
    pub interval_style: IntervalStyle,
    /// Line, markers or both.
    pub style: SeriesStyle,
    /// Index into the palette; `None` = the series' position. Give two series the same colour
    /// to pair them (the paper's markers and our line of one metric).
    pub color: Option<usize>,
}

impl Series {
    /// A plain line.
    pub fn line(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
            intervals: None,
            interval_style: IntervalStyle::Bars,
            style: SeriesStyle::Line,
            color: None,
        }
    }

    /// The same series drawn with `style`.
    pub fn styled(mut self, style: SeriesStyle) -> Self {
        self.style = style;
        self
    }

    /// The same series with interval half-widths (one per point) drawn as `style`.
    pub fn with_intervals(mut self, half_widths: Vec<f64>, style: IntervalStyle) -> Self {
        self.intervals = Some(half_widths);
        self.interval_style = style;
        self
    }

    /// The same series in palette colour `index`.
    pub fn colored(mut self, index: usize) -> Self {
        self.color = Some(index);
        self
    }
}

/// Where the legend goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LegendPosition {
    /// Upper right corner (default).
    #[default]
    UpperRight,
    /// Upper left corner.
    UpperLeft,
    /// Lower right corner.
    LowerRight,
    /// Lower left corner.
    LowerLeft,
}

/// A chart of one or more series on shared axes.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Title above the plot.
    pub title: String,
    /// x-axis label.
    pub x_label: String,
    /// y-axis label.
    pub y_label: String,
    /// The series.
    pub series: Vec<Series>,
    /// Logarithmic x axis (batch sizes, temperatures); every x must then be positive.
    pub log_x: bool,
    /// Fixed x range; `None` = the data's, padded by 5%.
    pub x_range: Option<(f64, f64)>,
    /// Fixed y range; `None` = the data's (intervals included), padded by 5%.
    pub y_range: Option<(f64, f64)>,
    /// Legend corner.
    pub legend: LegendPosition,
}

impl LineChart {
    /// A chart with linear axes, automatic ranges and the legend upper right.
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
        series: Vec<Series>,
    ) -> Self {
        LineChart {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            series,
            log_x: false,
            x_range: None,
            y_range: None,
            legend: LegendPosition::UpperRight,
        }
    }

    /// Errors unless every series has points, finite coordinates, one non-negative finite
    /// half-width per point, positive x on a log axis, and the ranges are non-empty.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Error::invalid("figure", format!("{:?}: {msg}", self.title));
        if self.series.is_empty() {
            return Err(bad("no series to draw".into()));
        }
        for s in &self.series {
            if s.points.is_empty() {
                return Err(bad(format!("series {:?} has no point", s.name)));
            }
            if let Some((x, y)) = s
                .points
                .iter()
                .find(|(x, y)| !x.is_finite() || !y.is_finite())
            {
                return Err(bad(format!(
                    "series {:?} has a non-finite point ({x}, {y})",
                    s.name
                )));
            }
            if self.log_x {
                if let Some((x, _)) = s.points.iter().find(|(x, _)| *x <= 0.0) {
                    return Err(bad(format!(
                        "series {:?} has x = {x}, not allowed on a log axis",
                        s.name
                    )));
                }
            }
            if let Some(h) = &s.intervals {
                if h.len() != s.points.len() {
                    return Err(bad(format!(
                        "series {:?} has {} points but {} intervals",
                        s.name,
                        s.points.len(),
                        h.len()
                    )));
                }
                if let Some(w) = h.iter().find(|w| !w.is_finite() || **w < 0.0) {
                    return Err(bad(format!(
                        "series {:?} has an interval half-width of {w}",
                        s.name
                    )));
                }
            }
        }
        for (name, r) in [("x_range", self.x_range), ("y_range", self.y_range)] {
            if let Some((a, b)) = r {
                if !(a.is_finite() && b.is_finite() && a < b) {
                    return Err(bad(format!("{name} ({a}, {b}) is empty or not finite")));
                }
                if name == "x_range" && self.log_x && a <= 0.0 {
                    return Err(bad(format!("x_range starts at {a} on a log axis")));
                }
            }
        }
        Ok(())
    }

    fn data_x_range(&self) -> (f64, f64) {
        if let Some(r) = self.x_range {
            return r;
        }
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let (lo, hi) = min_max(xs);
        if self.log_x {
            // Pad by a constant factor, i.e. evenly on the log axis.
            let f = if hi > lo { (hi / lo).powf(0.05) } else { 2.0 };
            (lo / f, hi * f)
        } else {
            pad_range((lo, hi))
        }
    }

    fn data_y_range(&self) -> (f64, f64) {
        if let Some(r) = self.y_range {
            return r;
        }
        let ys = self.series.iter().flat_map(|s| {
            s.points.iter().enumerate().flat_map(move |(i, p)| {
                let h = s.intervals.as_ref().map_or(0.0, |h| h[i]);
                [p.1 - h, p.1 + h]
            })
        });
        let (lo, hi) = pad_range(min_max(ys));
        // Room for the legend box above (or below) the data, so that it hides no point: about
        // 22 px per entry plus 30 px of frame on a plot about 400 px high.
        let share = ((22 * self.series.len() + 30) as f64 / 400.0).min(0.6);
        let extra = (hi - lo) * share / (1.0 - share);
        match self.legend {
            LegendPosition::UpperRight | LegendPosition::UpperLeft => (lo, hi + extra),
            LegendPosition::LowerRight | LegendPosition::LowerLeft => (lo - extra, hi),
        }
    }

    /// The distinct x values of the data, sorted, when there are few (≤ 12): the tick
    /// positions of a log axis, where plotters would only mark the powers of ten.
    fn x_key_points(&self) -> Option<Vec<f64>> {
        let mut xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        // Two values closer than a twelfth of the axis (in log scale) would print their
        // labels over each other (0.262 and 0.324 on an axis from 0.012 to 0.515): keep the
        // first. The doubling steps of a batch-size sweep stay far above that.
        if let (Some(&first), Some(&last)) = (xs.first(), xs.last()) {
            let gap = (last.log10() - first.log10()) / 12.0;
            let mut kept: Vec<f64> = Vec::with_capacity(xs.len());
            for x in xs {
                if kept.last().is_none_or(|&k| x.log10() - k.log10() >= gap) {
                    kept.push(x);
                }
            }
            xs = kept;
        }
        (xs.len() <= 12).then_some(xs)
    }
}

/// A tick label: at most 6 decimals, trailing zeros dropped (`1`, `0.25`, `128`).
fn tick_label(v: &f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

fn min_max(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

/// `[lo, hi]` widened by 5% on each side (by 1 when the range is a single value).
fn pad_range((lo, hi): (f64, f64)) -> (f64, f64) {
    let d = if hi > lo { 0.05 * (hi - lo) } else { 1.0 };
    (lo - d, hi + d)
}

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The files of a written figure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FigureFiles {
    /// `dir/stem.png`.
    pub png: PathBuf,
    /// `dir/stem.svg`.
    pub svg: PathBuf,
}

/// Draws `chart` and writes `dir/stem.png` and `dir/stem.svg` ([`DEFAULT_SIZE`]), atomically,
/// creating `dir` if needed.
pub fn line_chart(chart: &LineChart, dir: &Path, stem: &str) -> Result<FigureFiles> {
    if stem.is_empty() || stem.contains(['/', '\\']) {
        return Err(Error::invalid(
            "stem",
            format!("{stem:?} must be a plain file name without extension"),
        ));
    }
    let png = render_png(chart, DEFAULT_SIZE)?;
    let svg = render_svg(chart, DEFAULT_SIZE)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let files = FigureFiles {
        png: dir.join(format!("{stem}.png")),
        svg: dir.join(format!("{stem}.svg")),
    };
    write_atomically(&files.png, |w| w.write_all(&png))?;
    write_atomically(&files.svg, |w| w.write_all(svg.as_bytes()))?;
    Ok(files)
}

/// `chart` as PNG bytes of `size` pixels.
pub fn render_png(chart: &LineChart, size: (u32, u32)) -> Result<Vec<u8>> {
    chart.validate()?;
    ensure_font()?;
    let (w, h) = size;
    let mut rgb = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        draw(&root, chart).map_err(|e| figure_error(chart, e))?;
        root.present()
            .map_err(|e| figure_error(chart, e.to_string()))?;
    }
    let mut png = Vec::new();
    image::ImageEncoder::write_image(
        image::codecs::png::PngEncoder::new(&mut png),
        &rgb,
        w,
        h,
        image::ExtendedColorType::Rgb8,
    )
    .map_err(|e| figure_error(chart, format!("cannot encode PNG: {e}")))?;
    Ok(png)
}

/// `chart` as an SVG document of `size` pixels.
pub fn render_svg(chart: &LineChart, size: (u32, u32)) -> Result<String> {
    chart.validate()?;
    ensure_font()?;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root, chart).map_err(|e| figure_error(chart, e))?;
        root.present()
            .map_err(|e| figure_error(chart, e.to_string()))?;
    }
    Ok(svg)
}

/// Shows `chart` inline in an evcxr (Rust Jupyter) notebook: prints its SVG between evcxr's
/// content markers, as plotters' `evcxr_figure` does.
pub fn evcxr_display(chart: &LineChart) -> Result<()> {
    let svg = render_svg(chart, DEFAULT_SIZE)?;
    println!("EVCXR_BEGIN_CONTENT image/svg+xml\n{svg}\nEVCXR_END_CONTENT");
    Ok(())
}

fn figure_error(chart: &LineChart, msg: String) -> Error {
    Error::invalid("figure", format!("{:?}: {msg}", chart.title))
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &LineChart,
) -> std::result::Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (x0, x1) = chart.data_x_range();
    let (y0, y1) = chart.data_y_range();
    if chart.log_x {
        match chart.x_key_points() {
            Some(ticks) => draw_on(
                root,
                chart,
                (x0..x1).log_scale().with_key_points(ticks),
                y0..y1,
            ),
            None => draw_on(root, chart, (x0..x1).log_scale(), y0..y1),
        }
    } else {
        draw_on(root, chart, x0..x1, y0..y1)
    }
}

fn draw_on<'c, DB, X>(
    root: &'c DrawingArea<DB, Shift>,
    chart: &LineChart,
    x_spec: X,
    y_spec: Range<f64>,
) -> std::result::Result<(), String>
where
    DB: DrawingBackend + 'c,
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut ctx: ChartContext<'c, DB, _> = ChartBuilder::on(root)
        .caption(&chart.title, (FONT_FAMILY, 22))
        .margin(14)
        .x_label_area_size(52)
        .y_label_area_size(72)
        .build_cartesian_2d(x_spec, y_spec)
        .map_err(err)?;
    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .label_style((FONT_FAMILY, 15))
        .axis_desc_style((FONT_FAMILY, 17))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .x_labels(8)
        .y_labels(8)
        .x_label_formatter(&tick_label)
        .y_label_formatter(&tick_label)
        .draw()
        .map_err(err)?;
    for (i, s) in chart.series.iter().enumerate() {
        let c = color(s.color.unwrap_or(i));
        if let Some(h) = &s.intervals {
            match s.interval_style {
                IntervalStyle::Band => {
                    let upper = s.points.iter().zip(h).map(|(p, h)| (p.0, p.1 + h));
                    let lower = s.points.iter().zip(h).rev().map(|(p, h)| (p.0, p.1 - h));
                    let outline: Vec<(f64, f64)> = upper.chain(lower).collect();
                    ctx.draw_series(std::iter::once(Polygon::new(outline, c.mix(0.18).filled())))
                        .map_err(err)?;
                }
                IntervalStyle::Bars => {
                    let style = c.stroke_width(2);
                    for (p, h) in s.points.iter().zip(h) {
                        let (lo, hi) = ((p.0, p.1 - h), (p.0, p.1 + h));
                        ctx.draw_series(std::iter::once(PathElement::new(vec![lo, hi], style)))
                            .map_err(err)?;
                        for end in [lo, hi] {
                            // Caps of a fixed pixel width, whatever the axis scale.
                            let cap = EmptyElement::at(end)
                                + PathElement::new(vec![(-5, 0), (5, 0)], style);
                            ctx.draw_series(std::iter::once(cap)).map_err(err)?;
                        }
                    }
                }
            }
        }
        let line = matches!(s.style, SeriesStyle::Line | SeriesStyle::LineAndMarkers(_));
        let marker = match s.style {
            SeriesStyle::Markers(m) | SeriesStyle::LineAndMarkers(m) => Some(m),
            SeriesStyle::Line => None,
        };
        let anno = if line {
            ctx.draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(3)))
                .map_err(err)?
        } else {
            // Markers only: the legend entry hangs on an empty series.
            ctx.draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
                .map_err(err)?
        };
        anno.label(s.name.as_str()).legend(move |(x, y)| {
            // One element type for every style (plotters' legend wants a concrete type):
            // a 20 px line and the three markers, the unused parts transparent.
            let shown = |m: Marker| {
                if marker == Some(m) {
                    c.to_rgba()
                } else {
                    TRANSPARENT
                }
            };
            let stroke = if line { c.to_rgba() } else { TRANSPARENT };
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (20, 0)], stroke.stroke_width(2))
                + Circle::new((10, 0), 4, shown(Marker::Circle).filled())
                + TriangleMarker::new((10, 0), 7, shown(Marker::Triangle).filled())
                + Cross::new((10, 0), 5, shown(Marker::Cross).stroke_width(2))
        });
        if let Some(m) = marker {
            let points = s.points.iter().copied();
            match m {
                Marker::Circle => ctx.draw_series(points.map(|p| Circle::new(p, 4, c.filled()))),
                Marker::Triangle => {
                    ctx.draw_series(points.map(|p| TriangleMarker::new(p, 7, c.filled())))
                }
                Marker::Cross => {
                    ctx.draw_series(points.map(|p| Cross::new(p, 5, c.stroke_width(2))))
                }
            }
            .map_err(err)?;
        }
    }
    ctx.configure_series_labels()
        .position(match chart.legend {
            LegendPosition::UpperRight => SeriesLabelPosition::UpperRight,
            LegendPosition::UpperLeft => SeriesLabelPosition::UpperLeft,
            LegendPosition::LowerRight => SeriesLabelPosition::LowerRight,
            LegendPosition::LowerLeft => SeriesLabelPosition::LowerLeft,
        })
        .label_font((FONT_FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .margin(10)
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_drop_trailing_zeros() {
        assert_eq!(tick_label(&1.0), "1");
        assert_eq!(tick_label(&0.15000000000000002), "0.15");
        assert_eq!(tick_label(&128.0), "128");
        assert_eq!(tick_label(&-0.0000001), "0");
        assert_eq!(tick_label(&0.001), "0.001");
    }

    #[test]
    fn auto_ranges_pad_the_data_and_leave_room_for_the_legend() {
        let s = Series::line("a", vec![(0.0, 0.0), (10.0, 1.0)])
            .with_intervals(vec![0.5, 0.0], IntervalStyle::Band);
        let mut c = LineChart::new("t", "x", "y", vec![s]);
        assert_eq!(c.data_x_range(), (-0.5, 10.5));
        let (lo, hi) = c.data_y_range();
        // Data with intervals spans [-0.5, 1]; padded [-0.575, 1.075]; the legend (1 entry)
        // takes 52/400 of the height on top.
        assert!((lo + 0.575).abs() < 1e-12, "{lo}");
        let want = 1.075 + 1.65 * (52.0 / 400.0) / (1.0 - 52.0 / 400.0);
        assert!((hi - want).abs() < 1e-12, "{hi} vs {want}");
        c.legend = LegendPosition::LowerLeft;
        assert!(c.data_y_range().0 < -0.575 && c.data_y_range().1 == 1.075);
        c.y_range = Some((0.0, 2.0));
        assert_eq!(c.data_y_range(), (0.0, 2.0));
        c.log_x = true;
        assert!(c.validate().is_err(), "x = 0 on a log axis");
        assert_eq!(c.x_key_points(), Some(vec![0.0, 10.0]));
        // Ticks too close to print apart are thinned; a doubling sweep keeps every one.
        let ticks = |xs: &[f64]| {
            let points = xs.iter().map(|&x| (x, 1.0)).collect();
            let mut c = LineChart::new("t", "x", "y", vec![Series::line("a", points)]);
            c.log_x = true;
            c.x_key_points().unwrap()
        };
        assert_eq!(
            ticks(&[0.515, 0.012, 0.0227, 0.0462, 0.262, 0.324]),
            [0.012, 0.0227, 0.0462, 0.262, 0.515]
        );
        let doubling = [16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
        assert_eq!(ticks(&doubling), doubling);
    }
}

//! Paper-vs-ours tables (polars) and figures (plotters).
//!
//! The experiments reproduce the papers' tables and figures; this module puts each of our
//! numbers beside the number the paper prints, says which data and scale produced ours, and
//! writes the result:
//!
//! - [`published`]: the papers' values, read from `paper_tables/published/<paper>.csv`
//!   ([`Published::for_key`]); never typed into code.
//! - [`provenance`]: [`Provenance`] (dataset, scale, details) of our values.
//! - [`comparison`]: [`Measured`] values joined with the published ones into a
//!   [`Comparison`]: a long `DataFrame` (`method | setting | metric | paper | paper_dataset |
//!   ours | our_dataset | scale | …`) and a paper-shaped one (cells `paper / ours`).
//! - [`tables`]: any `DataFrame` to `stem.csv` and `stem.md` ([`write_table`]), atomically.
//! - [`figures`] and [`standard_charts`]: line charts to PNG + SVG ([`line_chart`]) or inline in
//!   evcxr ([`evcxr_display`]); training curves, precision–recall curves, parameter sweeps and
//!   few-shot accuracies with intervals.
//!
//! ```no_run
//! use rankwise::report::*;
//! # fn main() -> rankwise::Result<()> {
//! let published = Published::for_key(published_dir(), "smooth_ap")?;
//! let ours = Provenance::new("embedded shapes", "quick", "small CNN, 5 epochs");
//! let measured = [Measured::new("Table 2", "Smooth-AP", "SOP", "R@1", 0.170, Unit::Fraction, ours)
//!     .with_setting("batch=224")];
//! let table = Comparison::build("Smooth-AP Table 2", &published.table("Table 2"), &measured)?;
//! table.write("paper_tables".as_ref(), "smooth_ap_table2", SettingPlacement::Rows)?;
//! # Ok(()) }
//! ```

pub mod comparison;
pub mod figures;
mod fonts;
pub mod provenance;
pub mod published;
pub mod standard_charts;
pub mod tables;

pub use comparison::{Comparison, ComparisonRow, Measured, SettingPlacement, Status};
pub use figures::{
    evcxr_display, line_chart, render_png, render_svg, FigureFiles, IntervalStyle, LegendPosition,
    LineChart, Marker, Series, SeriesStyle, DEFAULT_SIZE,
};
pub use fonts::{FONT_ENV, FONT_FAMILY};
pub use provenance::{git_commit, Provenance};
pub use published::{published_dir, CellKey, Published, PublishedRow, Unit};
pub use standard_charts::{
    accuracy_with_intervals, precision_recall, sweep, training_curves, LogCurve, Sweep,
};
pub use tables::{markdown_table, write_table, TableFiles};

//! The experiments of the five papers: each sub-module builds the runs that one paper's tables
//! compare from a recipe of `configs/experiments/`, trains them (through a caching [`Runner`]),
//! and returns our measurements beside the paper's published values, as polars tables, plus the
//! figures.
//!
//! Every recipe has three scales ([`Scale`]): `tiny` (seconds, for CI), `quick` (the embedded
//! dataset, the small CNN, CPU, minutes) and `paper` (the paper's dataset, backbone, batch size,
//! epochs and optimizer, for a user with the data and a GPU). What a table varies (the loss, τ,
//! the batch size, …) is code, mirroring the paper's table; everything else comes from the
//! recipe.

pub mod recipe;
pub mod runs;
pub mod table;

pub mod fastap;
pub mod happier;
pub mod rambo;
pub mod smooth_ap;

pub use recipe::{ExperimentRecipe, Scale};
pub use runs::{MetricValue, RunResult, RunSpec, Runner};
pub use table::{Measured, Variant};

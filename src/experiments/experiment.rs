//! A paper's experiments as a plug-in: one [`Experiment`] per paper, found in
//! [`REGISTRY`]. Everything that runs "every paper" (`rankwise reproduce`, the
//! notebooks, the tests) goes through the registry, so adding a paper is one experiment module
//! `src/experiments/<key>.rs` defining `pub const EXPERIMENT` (its tables, claims and figures),
//! its recipe `configs/experiments/<key>.toml`, its published values
//! `paper_tables/published/<key>.csv` and its notebook — build.rs lists the module.

use super::claim::Claim;
use super::publish::{Figure, ReproducedTable};
use super::runs::Runner;
use super::table::{MeasureFn, Measurements};
use super::{ExperimentRecipe, Scale, REGISTRY};
use crate::error::{Error, Result};
use crate::train::TrainConfig;
use std::path::Path;

/// What an experiment runs with: the repository root (recipes under `configs/experiments/`),
/// the run cache and the scale.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The repository root.
    pub root: &'a Path,
    /// Trains runs, or reads them back from its cache.
    pub runner: &'a Runner,
    /// The scale of every run.
    pub scale: Scale,
    /// TOML merged over the paper's recipe file before anything runs (a notebook's recipe
    /// cell; empty for the file as it is).
    pub changes: &'a str,
}

/// One paper's experiments: the rows of its tables as runs, its claims checked on them, and
/// its figures.
pub trait Experiment: Sync {
    /// The paper's key: `configs/experiments/<key>.toml`, `paper_tables/published/<key>.csv`,
    /// `paper_tables/<key>.md` (`smooth_ap`).
    fn key(&self) -> &'static str;

    /// The paper's method as tables print it (`Smooth-AP`).
    fn name(&self) -> &'static str;

    /// Trains (or reads back from the cache) every row of every table at `cx.scale` and
    /// returns our cells, keyed like the paper's published values.
    fn measure(&self, cx: &Context) -> Result<Measurements>;

    /// The paper's claims, checked on our measurements.
    fn claims(&self, cx: &Context, m: &Measurements) -> Result<Vec<Claim>>;

    /// The figures, from our measurements and the tables joined with the paper's values.
    fn figures(&self, m: &Measurements, tables: &[ReproducedTable]) -> Result<Vec<Figure>>;
}

impl std::fmt::Debug for dyn Experiment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// A paper whose every row is a training run on its recipe's base (`configs/experiments/
/// <key>.toml`): its module's functions, behind the one [`Experiment`] they all share.
#[derive(Debug, Clone, Copy)]
pub struct TrainedPaper {
    /// [`Experiment::key`].
    pub key: &'static str,
    /// [`Experiment::name`].
    pub name: &'static str,
    /// Trains (or reads back) every row on the scale's base recipe.
    pub measure: MeasureFn,
    /// The claims, checked on the measurements (with the scale's base recipe, for claims that
    /// name its batch).
    pub claims: fn(&Measurements, &TrainConfig) -> Vec<Claim>,
    /// The figures.
    pub figures: fn(&Measurements, &[ReproducedTable]) -> Result<Vec<Figure>>,
}

impl Experiment for TrainedPaper {
    fn key(&self) -> &'static str {
        self.key
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn measure(&self, cx: &Context) -> Result<Measurements> {
        let recipe = ExperimentRecipe::for_paper_with(cx.root, self.key, cx.changes)?;
        let mut m = (self.measure)(cx.runner, &recipe, cx.scale)?;
        m.looks = recipe.seeds.looks(cx.scale);
        Ok(m)
    }

    fn claims(&self, cx: &Context, m: &Measurements) -> Result<Vec<Claim>> {
        let base =
            ExperimentRecipe::for_paper_with(cx.root, self.key, cx.changes)?.base(cx.scale)?;
        Ok((self.claims)(m, &base))
    }

    fn figures(&self, m: &Measurements, tables: &[ReproducedTable]) -> Result<Vec<Figure>> {
        (self.figures)(m, tables)
    }
}

/// The keys of [`REGISTRY`], in order.
pub fn keys() -> Vec<&'static str> {
    REGISTRY.iter().map(|e| e.key()).collect()
}

/// The experiment with key or name `paper` (`smooth_ap` or `Smooth-AP`, any case); an error
/// listing the keys otherwise.
pub fn find(paper: &str) -> Result<&'static dyn Experiment> {
    REGISTRY
        .iter()
        .copied()
        .find(|e| paper.eq_ignore_ascii_case(e.key()) || paper.eq_ignore_ascii_case(e.name()))
        .ok_or_else(|| {
            Error::invalid(
                "paper",
                format!("`{paper}`: expected one of {}", keys().join(", ")),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn papers_are_found_by_key_or_name_and_unknown_ones_are_errors() {
        assert_eq!(keys(), ["fastap", "happier", "rambo", "smooth_ap", "ssr"]);
        for e in REGISTRY {
            assert_eq!(find(e.key()).unwrap().key(), e.key());
            assert_eq!(find(&e.name().to_uppercase()).unwrap().key(), e.key());
        }
        let err = find("smoothap").unwrap_err().to_string();
        assert!(
            err.contains("smoothap") && err.contains("rambo, smooth_ap"),
            "{err}"
        );
    }
}

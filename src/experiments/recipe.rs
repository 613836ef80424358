//! An experiment's recipe: the base training recipe of each scale, read from
//! `configs/experiments/<paper>.toml`.

use crate::error::{Error, Result};
use crate::train::TrainConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub use crate::report::Scale;

/// The scale named by the `RANKWISE_SCALE` environment variable (`tiny`, `quick` or `paper`),
/// `default` if unset; an error naming the variable for any other value.
pub fn scale_from_env(default: Scale) -> Result<Scale> {
    match std::env::var("RANKWISE_SCALE") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|e| Error::invalid("RANKWISE_SCALE", format!("{e}"))),
        _ => Ok(default),
    }
}

/// The base recipes of an experiment, one per scale (each a full [`TrainConfig`]; omitted
/// fields take their defaults). `paper` is absent where the paper's data cannot be described
/// yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentRecipe {
    /// CI scale.
    pub tiny: TrainConfig,
    /// CPU scale.
    pub quick: TrainConfig,
    /// The paper's scale.
    #[serde(default)]
    pub paper: Option<TrainConfig>,
}

impl ExperimentRecipe {
    /// Reads a recipe; errors name the file, line and key.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let recipe: ExperimentRecipe =
            toml::from_str(&text).map_err(|e| Error::file(path, e.to_string()))?;
        for (scale, config) in [
            (Scale::Tiny, Some(&recipe.tiny)),
            (Scale::Quick, Some(&recipe.quick)),
            (Scale::Paper, recipe.paper.as_ref()),
        ] {
            if let Some(c) = config {
                c.validate()
                    .map_err(|e| Error::file(path, format!("[{scale}]: {e}")))?;
            }
        }
        Ok(recipe)
    }

    /// The recipe of `configs/experiments/<paper>.toml` under the repository root `root`.
    pub fn for_paper(root: &Path, paper: &str) -> Result<Self> {
        Self::from_toml_file(recipe_path(root, paper))
    }

    /// The base recipe of `scale`; an error if the file has none for the paper scale.
    pub fn base(&self, scale: Scale) -> Result<TrainConfig> {
        match scale {
            Scale::Tiny => Ok(self.tiny.clone()),
            Scale::Quick => Ok(self.quick.clone()),
            Scale::Paper => self.paper.clone().ok_or_else(|| {
                Error::invalid(
                    "scale",
                    "this experiment's recipe has no [paper] section yet (the paper's dataset \
                     cannot be described in it); run the tiny or quick scale",
                )
            }),
        }
    }
}

/// `configs/experiments/<paper>.toml` under `root`.
pub fn recipe_path(root: &Path, paper: &str) -> PathBuf {
    root.join("configs")
        .join("experiments")
        .join(format!("{paper}.toml"))
}

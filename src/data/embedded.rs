//! The embedded dataset's recipe (`[dataset] kind = "embedded"`, the default): the generator's
//! settings ([`crate::data::shapes`]) and the level its class-disjoint retrieval split keeps.

use super::ShapesConfig;
use crate::error::Result;
use serde::{Deserialize, Serialize};

/// The embedded dataset ([`crate::data::shapes`]) and its class-disjoint retrieval split
/// ([`crate::data::retrieval_split`]): training on the first half of the fine classes of each
/// group, evaluation on the rest. A recipe writes it as `[dataset]` with `kind = "embedded"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EmbeddedConfig {
    /// Seed of the images.
    pub seed: u64,
    /// Shape families (coarsest level), `1..=8`.
    pub families: usize,
    /// Variants per family, `1..=6`.
    pub variants_per_family: usize,
    /// Fine classes per variant, `1..=16`.
    pub fine_per_variant: usize,
    /// Images per fine class.
    pub images_per_class: usize,
    /// Image side in pixels.
    pub image_size: usize,
    /// The level whose classes each keep half their fine classes on each side of the split.
    pub split_level: usize,
    /// Label levels, `3..=6` ([`crate::data::ShapesConfig::levels`]): 3 = fine class, variant,
    /// family; 6 adds a form below the variant and an order and a class above the family (the
    /// variant is then level 2). Left out of the recipe text when 3, so the recipes and run
    /// keys of the three-level data read as before the deeper levels existed.
    #[serde(skip_serializing_if = "is_three")]
    pub levels: usize,
}

fn is_three(levels: &usize) -> bool {
    *levels == 3
}

impl Default for EmbeddedConfig {
    /// The embedded dataset's defaults (256 fine classes × 30 images of 32 × 32), split within
    /// each variant.
    fn default() -> Self {
        let s = ShapesConfig::default();
        EmbeddedConfig {
            seed: s.seed,
            families: s.families,
            variants_per_family: s.variants_per_family,
            fine_per_variant: s.fine_per_variant,
            images_per_class: s.images_per_class,
            image_size: s.image_size,
            split_level: 1,
            levels: s.levels,
        }
    }
}

impl EmbeddedConfig {
    /// The dataset configuration (default nuisances).
    pub fn shapes(&self) -> ShapesConfig {
        ShapesConfig {
            seed: self.seed,
            families: self.families,
            variants_per_family: self.variants_per_family,
            fine_per_variant: self.fine_per_variant,
            images_per_class: self.images_per_class,
            image_size: self.image_size,
            levels: self.levels,
            ..ShapesConfig::default()
        }
    }

    /// Errors naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        self.shapes().validate()
    }
}

//! Datasets: in-memory images with hierarchical labels, class-disjoint splits, and the embedded
//! procedurally generated default dataset.

pub mod image_set;
pub mod shapes;
pub mod splits;

pub use image_set::ImageSet;
pub use shapes::{Nuisance, ShapesConfig};
pub use splits::{few_shot_split, retrieval_split, FewShotFractions, FewShotSplit, RetrievalSplit};

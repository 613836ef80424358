//! Datasets: in-memory images with hierarchical labels, class-disjoint splits, the embedded
//! procedurally generated default dataset, loaders for the papers' real datasets, and the image
//! pipeline that decodes and augments their files into batches.

pub mod image_set;
pub mod loaders;
pub mod pipeline;
pub mod shapes;
pub mod splits;

pub use image_set::ImageSet;
pub use shapes::{Nuisance, ShapesConfig};
pub use splits::{few_shot_split, retrieval_split, FewShotFractions, FewShotSplit, RetrievalSplit};

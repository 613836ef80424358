//! Datasets: in-memory images with hierarchical labels, class-disjoint splits, the embedded
//! procedurally generated default dataset, loaders for the papers' real datasets, and the image
//! pipeline that decodes and augments their files into batches, the [`ImageSource`]s that
//! serve either kind to the trainer, and synthetic datasets written in the real datasets'
//! on-disk formats ([`synthetic_on_disk`]) for running the paper recipes without the data.

pub mod dataset;
pub mod embedded;
pub mod image_set;
pub mod loaders;
pub mod pipeline;
pub mod shapes;
pub mod source;
pub mod splits;
pub mod staging;
pub mod synthetic_on_disk;

pub use dataset::{ImageSettings, InputNorm, TransformPreset};
pub use embedded::EmbeddedConfig;
pub use image_set::ImageSet;
pub use loaders::{DatasetConfig, DiskDataset};
pub use shapes::{Nuisance, ShapesConfig};
pub use source::{ImageSource, InMemorySource, Normalization, OnDiskSource, SubsetSource, View};
pub use splits::{few_shot_split, retrieval_split, FewShotFractions, FewShotSplit, RetrievalSplit};

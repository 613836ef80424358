//! # rankwise
//!
//! Rank-based learning for image retrieval and few-shot classification, reimplementing and
//! reproducing Smooth-AP (Brown et al., ECCV 2020), FastAP (Cakir et al., CVPR 2019), RaMBO
//! (Rolínek et al., CVPR 2020), HAPPIER (Ramzi et al., ECCV 2022) and SSR (Shen et al.,
//! NeurIPS 2021).
//!
//! The data flows one way through the modules (`tests/integration/architecture.rs` fails on any import
//! cycle between modules or between files, and on any import of a lower layer); each layer uses
//! only the layers above it (the same table heads `ARCHITECTURE.md`):
//!
//! | layer | modules | what they hold |
//! |---|---|---|
//! | 0 | [`error`], [`progress`], [`stats`], [`switch`] | the error type, progress bars, the tests behind the verdicts, the device paths' on/off switches |
//! | 1 | [`hierarchy`], [`metrics`], [`cpu`], [`kernels`], [`device`] | labels and relevance; the metrics of one ranked list; the CPU engine; the losses' CUDA kernels' compilation and loading; opening a CUDA device (one stream for every thread, its memory pool) |
//! | 2 | [`io`], [`retrieval`], [`samplers`], [`synthetic_embeddings`] | files in and out; the exact evaluation engine (any score source); batch and episode samplers; synthetic embedding sets |
//! | 3 | [`data`], [`losses`], [`models`] | the datasets (one loader file each, listed by build.rs in [`data::loaders::DatasetConfig`]) and image pipeline; every rank loss; backbones and heads |
//! | 4 | [`train`] | recipes, optimisers, schedules, the trainer, run folders |
//! | 5 | [`fewshot`], [`report`] | episodes and few-shot classifiers; tables and figures |
//! | 6 | [`rerank`] | re-rankers (k-reciprocal, query expansion, SSR), scored by the retrieval engine |
//! | 7 | [`experiments`] | one plug-in per paper: recipes, tables, claims |
//!
//! [`hierarchy`] holds the labels and the relevance functions, [`metrics`] scores one ranked
//! list, and [`retrieval`] ranks every query against the references exactly, in chunks, and
//! accumulates the metrics; every re-ranker is scored by that same engine.

pub(crate) mod attach;
pub mod cpu;
pub mod data;
pub mod device;
pub mod error;
pub mod experiments;
pub mod fewshot;
pub mod hierarchy;
pub mod io;
pub mod kernels;
pub mod losses;
pub mod metrics;
pub mod models;
pub mod progress;
pub mod report;
pub mod rerank;
pub mod retrieval;
pub mod samplers;
pub mod stats;
pub mod switch;
pub mod synthetic_embeddings;
pub mod train;

/// candle, re-exported so that notebooks and users name the same `Tensor`, `Device` and `DType`
/// as the library without a dependency (and a rebuild) of their own.
pub use candle_core;
/// candle's layers and optimisers (`VarBuilder`, `VarMap`, …), re-exported like [`candle_core`].
pub use candle_nn;
pub use error::{Error, Result};
pub use hierarchy::{Labels, Relevance};

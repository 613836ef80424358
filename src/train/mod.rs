//! Training: optimizers with PyTorch semantics ([`optim`]), learning-rate schedules and
//! HAPPIER's backbone warm-up ([`schedule`]), the exact large-batch gradient of FastAP / SupRank
//! ([`large_batch`]), checkpoints ([`checkpoint`]), the metrics log ([`log`]), the run
//! configuration ([`config`]), its data ([`data`]: the embedded dataset or a real one on disk),
//! model selection on held-out training classes ([`validation`]) and the [`Trainer`] that ties
//! them together ([`trainer`]).

pub mod checkpoint;
pub mod config;
pub mod data;
pub mod large_batch;
pub mod log;
pub mod optim;
pub mod overrides;
pub mod run_dir;
pub mod schedule;
pub mod trainer;
pub mod validation;

/// The recipe's dataset and input normalisation, defined with the datasets
/// ([`crate::data::dataset`]).
pub use crate::data::dataset::{ImageSettings, InputNorm, TransformPreset};
pub use crate::data::loaders::DatasetConfig;
/// The recipe's sampler, defined beside the samplers ([`crate::samplers::config`]).
pub use crate::samplers::SamplerConfig;
pub use config::{
    DeviceChoice, EvalConfig, GroupConfig, OptimizerConfig, OutputConfig, PretrainStage,
    TrainConfig,
};
pub use data::{check_recipe, load_data, EvalSet, RecipeCheck, RunData, TestProtocol};
pub use log::{LogRow, MetricsLog};
pub use optim::{AdamConfig, Algorithm, Optimizer, ParamGroup, SgdConfig};
pub use overrides::{apply_overrides, load_with_overrides, Override};
pub use run_dir::{
    read_results, train_to_dir, Reuse, RunLock, RunOptions, RunResults, CONFIG_FILE, LOCK_FILE,
    RESULTS_FILE, RUN_FILES,
};
pub use schedule::{BackboneWarmup, Decay, LrSchedule, ScheduleUnit, Warmup};
pub use trainer::{run, run_config, EpochSummary, Evaluation, TrainReport, Trainer};
pub use validation::{Selection, ValidationConfig};

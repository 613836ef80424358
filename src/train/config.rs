//! The configuration of a training run: serde structures (TOML- and JSON-ready; every field has
//! a default, unknown fields are errors) that [`super::run`] turns into a [`super::Trainer`].

use super::optim::{AdamConfig, Algorithm};
use super::schedule::LrSchedule;
use super::validation::ValidationConfig;
use crate::data::dataset::InputNorm;
use crate::data::loaders::DatasetConfig;
use crate::error::{Error, Result};
use crate::losses::config::LossConfig;
use crate::models::EmbeddingNetConfig;
use crate::samplers::SamplerConfig;
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChoice {
    /// The CPU.
    #[default]
    Cpu,
    /// The first CUDA GPU ([`crate::device::open_cuda`]); an error if the crate was built
    /// without the `cuda` feature or no GPU is usable.
    Cuda,
    /// [`crate::device::cuda_if_available`]`(0)`: the first GPU if the crate has the `cuda`
    /// feature and a GPU is usable, the CPU otherwise.
    Auto,
}

impl DeviceChoice {
    /// Parses `cpu`, `cuda` or `auto` (the CLI's `--device`).
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            "auto" => Ok(DeviceChoice::Auto),
            other => Err(Error::invalid(
                "device",
                format!("expected cpu, cuda or auto, got `{other}`"),
            )),
        }
    }

    /// Whether this build can run on the device at all: `cuda` needs a build with the `cuda`
    /// feature. Cheap (opens nothing), so a run can say so before it reads any data or makes
    /// any folder; whether a GPU is there is only known when [`DeviceChoice::device`] opens it.
    /// Not part of [`TrainConfig::validate`]: a CUDA recipe is a valid recipe on any build.
    pub fn check_available(self) -> Result<()> {
        #[cfg(not(feature = "cuda"))]
        if self == DeviceChoice::Cuda {
            return Err(no_cuda());
        }
        Ok(())
    }

    /// The device, opened.
    pub fn device(self) -> Result<Device> {
        match self {
            DeviceChoice::Cpu => Ok(Device::Cpu),
            DeviceChoice::Auto => crate::device::cuda_if_available(0),
            DeviceChoice::Cuda => crate::device::open_cuda(0),
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn no_cuda() -> Error {
    Error::invalid(
        "device",
        "this build has no CUDA support; rebuild with `--features cuda`",
    )
}

/// Algorithm and base learning rate of one parameter group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Base learning rate.
    pub lr: f64,
    /// The algorithm and its hyperparameters.
    pub algorithm: Algorithm,
}

/// The parameter groups of an embedding network (and of the loss's proxies, if it has some).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerConfig {
    /// The backbone's group.
    pub backbone: GroupConfig,
    /// The head's group (HAPPIER: 2× the backbone's rate; Smooth-AP: 5×).
    pub head: GroupConfig,
    /// The group of the loss's own variables — the proxies of HAPPIER's clustering loss and of
    /// the normalised softmax (the authors give them their own optimizer with a much larger
    /// rate, e.g. 10 for HAPPIER on SOP). Unused by losses without variables.
    pub loss: GroupConfig,
}

impl Default for OptimizerConfig {
    /// Adam (coupled L2 4e-4, Smooth-AP's `--decay`), 1e-3 for the backbone and 2e-3 for the
    /// head: rates for training the small CNN from scratch on the embedded dataset.
    fn default() -> Self {
        let adam = Algorithm::Adam(AdamConfig {
            weight_decay: 4e-4,
            ..AdamConfig::default()
        });
        OptimizerConfig {
            backbone: GroupConfig {
                lr: 1e-3,
                algorithm: adam,
            },
            head: GroupConfig {
                lr: 2e-3,
                algorithm: adam,
            },
            // Proxies move fast in the authors' recipes; without weight decay, which would pull
            // the (normalised anyway) proxies towards zero.
            loss: GroupConfig {
                lr: 1e-2,
                algorithm: Algorithm::Adam(AdamConfig::default()),
            },
        }
    }
}

/// Periodic evaluation on the test split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Evaluate every this many epochs (and after the last); 0 = only after the last.
    pub every: u64,
    /// Also evaluate the untrained network before the first epoch.
    pub at_start: bool,
    /// The `k` of R@k and P@k.
    pub recall_ks: Vec<usize>,
    /// Images embedded at a time.
    pub batch_size: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig {
            every: 1,
            at_start: true,
            recall_ks: vec![1, 2, 4, 8],
            batch_size: 256,
        }
    }
}

/// Where the run writes its files.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutputConfig {
    /// Output folder (created if needed) for `checkpoint.safetensors`, `metrics.csv` and
    /// `metrics.parquet`; `None` writes nothing.
    pub dir: Option<PathBuf>,
    /// Save a checkpoint every this many epochs (and after the last); 0 = only after the last.
    pub checkpoint_every: u64,
}

/// A stage trained before a run, from whose network the run starts: fine-tuning from a
/// pretrained embedding, as Smooth-AP's Table 4 fine-tunes a softmax-trained face model with
/// each loss ("both trained on the VGGFace2 train set, then fine-tuned with Smooth-AP appended").
///
/// The stage is the run's own recipe with these fields replaced
/// ([`TrainConfig::pretrain_recipe`]): same seed, data, network, initial weights (`pretrained`
/// included), trained to its last epoch. The run then starts from the stage's network (backbone,
/// head and batch-norm statistics); the stage's loss proxies and optimiser state are dropped, as
/// a fine-tuning run builds a new loss and a new optimiser. Because the stage is a plain recipe,
/// its network is the one a run of [`TrainConfig::pretrain_recipe`] ends with, bit for bit: the
/// "before fine-tuning" row of a table is that run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PretrainStage {
    /// The stage's loss (e.g. `norm_softmax`, a softmax classifier).
    pub loss: LossConfig,
    /// The stage's number of epochs.
    pub epochs: u64,
    /// The stage's batch sampler; `None`: the run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler: Option<SamplerConfig>,
    /// The stage's optimisers; `None`: the run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<OptimizerConfig>,
    /// The stage's learning-rate schedule; `None`: the run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<LrSchedule>,
}

/// Everything a training run needs except the loss.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Seed of the initial weights and of the sampler.
    pub seed: u64,
    /// Device.
    pub device: DeviceChoice,
    /// The dataset trained and evaluated on: the embedded one (default, `kind = "embedded"` with
    /// the generator's settings) or a real dataset on disk ([`super::data`]).
    pub dataset: DatasetConfig,
    /// Image normalisation.
    pub input_norm: InputNorm,
    /// The network.
    pub model: EmbeddingNetConfig,
    /// Pretrained backbone weights (`.safetensors` with torchvision names), if any: a local path
    /// or `hf:<owner>/<repo>[@revision]/<file>` ([`crate::models::pretrained`]). `None`: random
    /// initialisation (`--set pretrained=` removes a recipe's weights).
    pub pretrained: Option<PathBuf>,
    /// A stage trained first, from whose network this run starts (fine-tuning from a pretrained
    /// embedding, [`PretrainStage`]); `None`: the run starts from its initial weights.
    pub pretrain: Option<PretrainStage>,
    /// The batch sampler.
    pub sampler: SamplerConfig,
    /// The loss (used by [`super::Trainer::from_config`]; a loss given to
    /// [`super::Trainer::new`] replaces it).
    pub loss: LossConfig,
    /// Number of epochs.
    pub epochs: u64,
    /// Optimizers of the two parameter groups.
    pub optimizer: OptimizerConfig,
    /// Learning-rate schedule, applied to both groups' base rates.
    pub schedule: LrSchedule,
    /// HAPPIER's backbone warm-up: epochs during which only the head is updated.
    pub backbone_warmup_epochs: u64,
    /// Embed each batch in chunks of this many images with the exact gradient
    /// ([`super::large_batch`]); needs frozen BatchNorm.
    pub large_batch_chunk: Option<usize>,
    /// Evaluation.
    pub eval: EvalConfig,
    /// Classes of the training split held out to select the epoch
    /// ([`super::validation`]); `None`: every training class trains, no selection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub validation: Option<ValidationConfig>,
    /// Output files.
    pub output: OutputConfig,
    /// Resume from this checkpoint.
    pub resume: Option<PathBuf>,
    /// Show progress bars.
    pub progress: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seed: 0,
            device: DeviceChoice::Cpu,
            dataset: DatasetConfig::default(),
            input_norm: InputNorm::Dataset,
            model: EmbeddingNetConfig::default(),
            pretrained: None,
            pretrain: None,
            sampler: SamplerConfig::default(),
            loss: LossConfig::default(),
            epochs: 5,
            optimizer: OptimizerConfig::default(),
            schedule: LrSchedule::default(),
            backbone_warmup_epochs: 0,
            large_batch_chunk: None,
            eval: EvalConfig::default(),
            validation: None,
            output: OutputConfig::default(),
            resume: None,
            progress: true,
        }
    }
}

impl TrainConfig {
    /// This recipe with its dataset root replaced by `root` ([`DatasetConfig::with_root`]; errors
    /// for the embedded dataset).
    pub fn with_dataset_root(&self, root: &std::path::Path) -> Result<TrainConfig> {
        Ok(TrainConfig {
            dataset: self.dataset.with_root(root)?,
            ..self.clone()
        })
    }

    /// The recipe the [`TrainConfig::pretrain`] stage trains: this one with the stage's loss,
    /// epochs and (where given) sampler, optimisers and schedule, without a stage of its own, a
    /// checkpoint to resume or output files. `None` without a stage.
    pub fn pretrain_recipe(&self) -> Option<TrainConfig> {
        let stage = self.pretrain.as_ref()?;
        Some(TrainConfig {
            loss: stage.loss.clone(),
            epochs: stage.epochs,
            sampler: stage
                .sampler
                .clone()
                .unwrap_or_else(|| self.sampler.clone()),
            optimizer: stage.optimizer.unwrap_or(self.optimizer),
            schedule: stage
                .schedule
                .clone()
                .unwrap_or_else(|| self.schedule.clone()),
            pretrain: None,
            resume: None,
            output: OutputConfig::default(),
            // The run's data reaches the stage with its validation classes already held out.
            validation: None,
            ..self.clone()
        })
    }

    /// Reads a TOML recipe (e.g. `configs/embedded_smooth_ap.toml`). Missing fields take their
    /// defaults; an unknown field or a wrong type is an error naming the file, the line and the
    /// key, and the result is validated.
    pub fn from_toml_file(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let config: TrainConfig = toml::from_str(&text)
            .map_err(|e| Error::file(path, with_moved_key_hint(e.to_string())))?;
        config
            .validate()
            .map_err(|e| Error::file(path, e.to_string()))?;
        Ok(config)
    }

    /// The configuration as a TOML recipe (every field written, so it documents itself).
    pub fn to_toml_string(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::invalid("config", e.to_string()))
    }

    /// Errors naming the first invalid field that can be checked without the data.
    pub fn validate(&self) -> Result<()> {
        if self.epochs == 0 {
            return Err(Error::invalid("epochs", "must be ≥ 1"));
        }
        if self.eval.batch_size == 0 {
            return Err(Error::invalid("eval.batch_size", "must be ≥ 1"));
        }
        if self
            .pretrained
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            // An empty path would only fail later as an unreadable file; say how to train from
            // random initialisation instead.
            return Err(Error::invalid(
                "pretrained",
                "empty path: leave the key out (or `--set pretrained=`) to train from random \
                 initialisation",
            ));
        }
        if self.large_batch_chunk == Some(0) {
            return Err(Error::invalid("large_batch_chunk", "must be ≥ 1"));
        }
        for (name, group) in [
            ("backbone", &self.optimizer.backbone),
            ("head", &self.optimizer.head),
            ("loss", &self.optimizer.loss),
        ] {
            if !(group.lr.is_finite() && group.lr >= 0.0) {
                return Err(Error::invalid(
                    format!("optimizer.{name}.lr"),
                    format!("must be finite and ≥ 0, got {}", group.lr),
                ));
            }
        }
        self.schedule.validate()?;
        self.optimizer.backbone.algorithm.validate()?;
        self.optimizer.head.algorithm.validate()?;
        self.optimizer.loss.algorithm.validate()?;
        self.loss.validate()?;
        if let Some(validation) = &self.validation {
            validation.validate(&self.eval.recall_ks)?;
        }
        self.dataset.validate(self.input_norm)?;
        if let Some(stage) = self.pretrain_recipe() {
            // The stage's own fields, named as the recipe writes them.
            stage
                .validate()
                .map_err(|e| Error::invalid("pretrain", e.to_string()))?;
        }
        Ok(())
    }
}

/// `message` (a recipe's parse error) with a hint where it names a key that moved: the embedded
/// dataset's `[data]` table is now `[dataset]` with `kind = "embedded"`.
pub(crate) fn with_moved_key_hint(message: String) -> String {
    if message.contains("unknown field `data`") {
        format!(
            "{message}\nthe embedded dataset's settings moved from `[data]` to `[dataset]` with \
             `kind = \"embedded\"` (the same keys)"
        )
    } else {
        message
    }
}

#[cfg(test)]
mod toml_tests {
    use super::*;

    #[test]
    fn toml_round_trip_and_errors_name_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recipe.toml");
        let config = TrainConfig {
            epochs: 3,
            ..TrainConfig::default()
        };
        std::fs::write(&path, config.to_toml_string().unwrap()).unwrap();
        assert_eq!(TrainConfig::from_toml_file(&path).unwrap(), config);

        std::fs::write(&path, "epochs = 2\nepochz = 3\n").unwrap();
        let e = TrainConfig::from_toml_file(&path).unwrap_err().to_string();
        assert!(e.contains("recipe.toml") && e.contains("epochz"), "{e}");
        std::fs::write(&path, "pretrained = \"\"\n").unwrap();
        let e = TrainConfig::from_toml_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("pretrained") && e.contains("random initialisation"),
            "{e}"
        );
        // A recipe written before the embedded dataset's settings moved into `[dataset]`.
        std::fs::write(&path, "[data]\nfamilies = 2\n").unwrap();
        let e = TrainConfig::from_toml_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("`data`") && e.contains("kind = \"embedded\""),
            "{e}"
        );
        std::fs::write(&path, "[dataset]\nkind = \"embedded\"\nfamilies = 2\n").unwrap();
        let c = TrainConfig::from_toml_file(&path).unwrap();
        assert_eq!(c.dataset.embedded().map(|d| d.families), Some(2));
        std::fs::write(&path, "epochs = 0\n").unwrap();
        let e = TrainConfig::from_toml_file(&path).unwrap_err().to_string();
        assert!(e.contains("recipe.toml") && e.contains("epochs"), "{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips_and_rejects_unknown_fields() {
        let c = TrainConfig::default();
        let json = serde_json::to_string(&c).unwrap();
        let back: TrainConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        let partial: TrainConfig = serde_json::from_str(
            r#"{"epochs": 3, "optimizer": {"backbone": {"lr": 0.1,
                "algorithm": {"kind": "sgd", "momentum": 0.9, "nesterov": true}}},
                "schedule": {"decay": {"kind": "cosine", "t_max": 3}}}"#,
        )
        .unwrap();
        assert_eq!(partial.epochs, 3);
        assert!(partial.validate().is_ok());
        let e = serde_json::from_str::<TrainConfig>(r#"{"epoch": 3}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `epoch`"), "{e}");
        assert!(DeviceChoice::parse("gpu").is_err());
        assert_eq!(DeviceChoice::parse("auto").unwrap(), DeviceChoice::Auto);
        #[cfg(not(feature = "cuda"))]
        assert!(DeviceChoice::Cuda
            .device()
            .unwrap_err()
            .to_string()
            .contains("--features cuda"));
    }
}

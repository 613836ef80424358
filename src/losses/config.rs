//! A loss as a recipe names it (`[loss] kind = "smooth_ap"` and its hyperparameters), and
//! [`LossConfig::build`] that turns it into a [`RankLoss`] for a given training set.
//!
//! Each loss writes its hyperparameters once, in its own file: the loss struct itself is the
//! recipe where it holds nothing but hyperparameters (Smooth-AP, FastAP, ROADMAP, the
//! contrastive and triplet losses: serde on the struct, `Default` = the paper's values, the
//! computation-only fields such as the engine and the chunk size left out of the recipe); a
//! loss with learnable parameters or state (HAPPIER's clustering proxies, the normalised
//! softmax, RaMBO's score memory, the Σ sum of per-level losses) has a recipe type beside it
//! whose `Default` reads the loss's. Both implement [`LossRecipe`] (validation and build), and
//! the one-line-per-loss registry in `losses/mod.rs` makes [`LossConfig`], the enum a recipe
//! deserialises into. Adding a loss touches two files: the loss's own and that registry.
//!
//! Losses with learnable parameters need the training labels and the embedding dimension to be
//! built; their variables are returned by [`RankLoss::trainable_vars`] and trained by the
//! `train` module in their own parameter group.

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use crate::losses::RankLoss;
use candle_core::Device;

pub use crate::losses::LossConfig;

/// A loss's recipe: checked, then built into the loss for one training run.
pub trait LossRecipe {
    /// A short name for tables, logs and run names, e.g. `smooth_ap`, `sum(triplet)`.
    fn name(&self) -> String;

    /// Errors naming the first invalid hyperparameter (`loss.<field>`).
    fn validate(&self) -> Result<()>;

    /// The loss for a training run ([`LossConfig::build`] validates first).
    fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>>;
}

/// What [`LossConfig::build`] needs to know about the training run.
#[derive(Debug, Clone)]
pub struct LossContext<'a> {
    /// The training labels (proxy losses get one proxy per class).
    pub train_labels: &'a Labels,
    /// The embedding dimension.
    pub dim: usize,
    /// Seed of the proxies and of random margins.
    pub seed: u64,
    /// Device of the proxies.
    pub device: &'a Device,
}

/// `loss.<field>` must be finite and > 0.
pub fn positive(field: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("loss.{field}"),
            format!("must be finite and > 0, got {v}"),
        ))
    }
}

/// `loss.<field>` must be finite.
pub fn finite(field: &str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::invalid(
            format!("loss.{field}"),
            format!("must be finite, got {v}"),
        ))
    }
}

/// The registry: `registry! { /// doc \n Variant(path::Recipe), … }` makes [`LossConfig`], one
/// variant per loss, its recipe name in `snake_case` as the TOML `kind`.
macro_rules! registry {
    ($( $(#[$doc:meta])* $variant:ident($recipe:ty), )+) => {
        /// Which loss to train with, and its hyperparameters: `kind` names the variant, the
        /// other keys are the fields of its recipe.
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        pub enum LossConfig {
            $( $(#[$doc])* $variant($recipe), )+
        }

        impl LossConfig {
            /// The recipe of the chosen loss.
            pub fn recipe(&self) -> &dyn $crate::losses::config::LossRecipe {
                match self {
                    $( LossConfig::$variant(recipe) => recipe, )+
                }
            }
        }
    };
}
pub(crate) use registry;

impl LossConfig {
    /// A short name for tables and logs, e.g. `smooth_ap`, `sum(triplet)`.
    pub fn name(&self) -> String {
        self.recipe().name()
    }

    /// Errors naming the first invalid hyperparameter (`loss.<field>`).
    pub fn validate(&self) -> Result<()> {
        self.recipe().validate()
    }

    /// The loss for a training run, after [`LossConfig::validate`]. Proxy losses get one proxy
    /// per class of the training labels (at the level they work on), drawn from `ctx.seed`.
    pub fn build(&self, ctx: &LossContext<'_>) -> Result<Box<dyn RankLoss>> {
        self.validate()?;
        self.recipe().build(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::contrastive::Contrastive;
    use crate::losses::csl::CslConfig;
    use crate::losses::fastap::FastAp;
    use crate::losses::happier::{HappierConfig, RelevanceKind};
    use crate::losses::norm_softmax::NormSoftmaxConfig;
    use crate::losses::proxy_nca::ProxyNcaConfig;
    use crate::losses::proxy_nca_pp::ProxyNcaPpConfig;
    use crate::losses::rambo::{RamboConfig, RamboMetric};
    use crate::losses::roadmap::Roadmap;
    use crate::losses::smooth_ap::SmoothAp;
    use crate::losses::summed_levels::SummedConfig;
    use crate::losses::triplet::Triplet;
    use candle_core::Tensor;
    use serde::{Deserialize, Serialize};

    fn labels() -> Labels {
        // 12 items, 2 levels: fine class = i / 2, coarse = i / 6.
        Labels::new((0..12).map(|i| vec![i / 2, i / 6]).collect()).unwrap()
    }

    fn ctx<'a>(labels: &'a Labels, device: &'a Device) -> LossContext<'a> {
        LossContext {
            train_labels: labels,
            dim: 8,
            seed: 3,
            device,
        }
    }

    fn every_kind() -> Vec<LossConfig> {
        vec![
            LossConfig::SmoothAp(SmoothAp::default()),
            LossConfig::FastAp(FastAp::default()),
            LossConfig::Rambo(RamboConfig::default()),
            LossConfig::Rambo(RamboConfig {
                metric: RamboMetric::Ap,
                memory: 2,
                ..RamboConfig::default()
            }),
            LossConfig::Happier(HappierConfig::default()),
            LossConfig::Happier(HappierConfig {
                relevance: RelevanceKind::WeightedAp,
                lambda: 0.0,
                ..HappierConfig::default()
            }),
            LossConfig::Roadmap(Roadmap::default()),
            LossConfig::Contrastive(Contrastive::default()),
            LossConfig::Triplet(Triplet::default()),
            LossConfig::NormSoftmax(NormSoftmaxConfig::default()),
            LossConfig::Summed(SummedConfig {
                base: Box::new(LossConfig::NormSoftmax(NormSoftmaxConfig::default())),
                levels: None,
            }),
            LossConfig::ProxyNcaPp(ProxyNcaPpConfig::default()),
            LossConfig::Summed(SummedConfig {
                base: Box::new(LossConfig::ProxyNcaPp(ProxyNcaPpConfig::default())),
                levels: None,
            }),
            LossConfig::ProxyNca(ProxyNcaConfig::default()),
            LossConfig::Csl(CslConfig::default()),
            LossConfig::Csl(CslConfig {
                margins: Some(vec![0.1, 0.2]),
                ..CslConfig::default()
            }),
        ]
    }

    #[test]
    fn every_kind_builds_runs_and_round_trips_through_toml() {
        let labels = labels();
        let device = Device::Cpu;
        let e = Tensor::randn(0f32, 1.0, (12, 8), &device).unwrap();
        for config in every_kind() {
            #[derive(Serialize, Deserialize)]
            struct Wrapper {
                loss: LossConfig,
            }
            let text = toml::to_string(&Wrapper {
                loss: config.clone(),
            })
            .unwrap();
            let back: Wrapper = toml::from_str(&text).unwrap();
            assert_eq!(back.loss, config, "{text}");
            let loss = config.build(&ctx(&labels, &device)).unwrap();
            let v = loss.forward(&e, &labels).unwrap();
            let v = v.to_scalar::<f32>().unwrap();
            assert!(v.is_finite(), "{}: {v}", config.name());
            let proxies = !loss.trainable_vars().is_empty();
            let expect = matches!(
                &config,
                LossConfig::Happier(HappierConfig { lambda, .. }) if *lambda > 0.0
            ) || matches!(
                &config,
                LossConfig::NormSoftmax(_)
                    | LossConfig::ProxyNcaPp(_)
                    | LossConfig::ProxyNca(_)
                    | LossConfig::Summed(_)
                    | LossConfig::Csl(_)
            );
            assert_eq!(proxies, expect, "{}", config.name());
        }
    }

    /// Every kind under `guard::deferred` with the CPU standing for a device: a good batch's
    /// value and gradient bit for bit as with the checks made at once; a batch with a NaN row
    /// (or, for the losses that normalise, a zero row) either fails at once with the error of
    /// the checks made at once (a host engine's own check) or gives a value that is not
    /// finite, which `guard::explain` turns into that same error.
    #[test]
    fn every_kind_defers_its_checks_without_changing_a_good_value() {
        use crate::losses::guard::{self, tests::with_cpu_deferring};
        use candle_core::DType;
        let labels = labels();
        let device = Device::Cpu;
        let good = Tensor::randn(0f64, 1.0, (12, 8), &device).unwrap();
        let with_row = |v: f64| {
            let mut rows = good.to_vec2::<f64>().unwrap();
            rows[5] = vec![v; 8];
            Tensor::new(rows, &device).unwrap()
        };
        for config in every_kind() {
            let name = config.name();
            // Each run on a fresh loss (RaMBO's memory then holds the same batches).
            let run = |x: &Tensor, deferred: bool| {
                let loss = config.build(&ctx(&labels, &device)).unwrap();
                let var = candle_core::Var::from_tensor(x).unwrap();
                let value = if deferred {
                    with_cpu_deferring(|| {
                        guard::deferred(|| loss.forward(var.as_tensor(), &labels))
                    })
                } else {
                    loss.forward(var.as_tensor(), &labels)
                };
                (loss, var, value)
            };
            let (_, var, at_once) = run(&good, false);
            let (_, dvar, deferred) = run(&good, true);
            let (at_once, deferred) = (at_once.unwrap(), deferred.unwrap());
            let bits = |t: &Tensor| {
                t.flatten_all()
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&at_once), bits(&deferred), "{name}");
            let g = at_once.backward().unwrap();
            let dg = deferred.backward().unwrap();
            assert_eq!(
                bits(g.get(var.as_tensor()).unwrap()),
                bits(dg.get(dvar.as_tensor()).unwrap()),
                "{name}"
            );
            for bad in [f64::NAN, 0.0] {
                let x = with_row(bad);
                let Err(want) = run(&x, false).2 else {
                    // A zero row is fine for a loss that does not normalise.
                    assert_eq!(bad, 0.0, "{name}: a NaN row passed");
                    continue;
                };
                let (loss, _, got) = run(&x, true);
                let got = match got {
                    Err(e) => e,
                    Ok(v) => {
                        let v = v.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
                        assert!(!v.is_finite(), "{name}: row of {bad} gave {v}");
                        with_cpu_deferring(|| guard::explain(loss.as_ref(), &x, &labels))
                            .unwrap_err()
                    }
                };
                assert_eq!(got.to_string(), want.to_string(), "{name}, row of {bad}");
            }
        }
    }

    /// The recipe surface of the losses that are their own recipe: only the hyperparameters
    /// (the engine, chunking and normalisation stay out), under the keys the recipes use. A
    /// change here changes every run's cache key.
    #[test]
    fn recipes_write_only_the_hyperparameters() {
        let toml_of = |loss: LossConfig| toml::to_string(&loss).unwrap();
        assert_eq!(
            toml_of(LossConfig::SmoothAp(SmoothAp::default())),
            "kind = \"smooth_ap\"\ntau = 0.01\ninclude_self = false\n"
        );
        assert_eq!(
            toml_of(LossConfig::FastAp(FastAp::default())),
            "kind = \"fast_ap\"\nnum_bins = 10\nauthors_gradient = false\n"
        );
        assert_eq!(
            toml_of(LossConfig::Triplet(Triplet::default())),
            "kind = \"triplet\"\nmargin = 0.05\nmining = \"easy_positive_semi_hard_negative\"\n"
        );
        assert_eq!(
            toml_of(LossConfig::Contrastive(Contrastive::default())),
            "kind = \"contrastive\"\npos_margin = 0.9\nneg_margin = 0.6\n"
        );
        assert_eq!(
            toml_of(LossConfig::Roadmap(Roadmap::default())),
            "kind = \"roadmap\"\nsup_ap_weight = 1.0\ncalibration_weight = 1.0\n"
        );
        let authors: LossConfig =
            toml::from_str("kind = \"fast_ap\"\nauthors_gradient = true\n").unwrap();
        assert_eq!(
            authors,
            LossConfig::FastAp(FastAp {
                gradient: crate::losses::fastap::FastApGradient::AuthorsPort,
                ..FastAp::default()
            })
        );
        // Computation-only fields are not hyperparameters: a recipe cannot name them.
        assert!(toml::from_str::<LossConfig>("kind = \"smooth_ap\"\nengine = 1\n").is_err());
    }

    #[test]
    fn summed_norm_softmax_has_one_proxy_set_per_level() {
        let labels = labels();
        let device = Device::Cpu;
        let config = LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::NormSoftmax(NormSoftmaxConfig::default())),
            levels: None,
        });
        let loss = config.build(&ctx(&labels, &device)).unwrap();
        let vars = loss.trainable_vars();
        assert_eq!(vars.len(), 2);
        // 6 fine classes and 2 coarse classes.
        assert_eq!(vars[0].1.dims(), &[6, 8]);
        assert_eq!(vars[1].1.dims(), &[2, 8]);
        assert_ne!(vars[0].0, vars[1].0, "names must be distinct");
    }

    #[test]
    fn toml_names_the_bad_field() {
        let e = toml::from_str::<LossConfig>("kind = \"smooth_ap\"\ntaux = 0.1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("taux"), "{e}");
        let e = toml::from_str::<LossConfig>("kind = \"smoothap\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("smoothap"), "{e}");
        let bad = LossConfig::SmoothAp(SmoothAp {
            tau: 0.0,
            ..SmoothAp::default()
        });
        assert!(bad.validate().unwrap_err().to_string().contains("loss.tau"));
        let nested = LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::Summed(SummedConfig {
                base: Box::new(LossConfig::default()),
                levels: None,
            })),
            levels: None,
        });
        assert!(nested.validate().is_err());
        let labels = labels();
        let device = Device::Cpu;
        let missing_level = LossConfig::Summed(SummedConfig {
            base: Box::new(LossConfig::default()),
            levels: Some(vec![0, 5]),
        });
        let e = match missing_level.build(&ctx(&labels, &device)) {
            Ok(_) => panic!("level 5 of 2 levels must be an error"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("level 5"), "{e}");
    }
}

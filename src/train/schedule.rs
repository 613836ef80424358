//! Learning-rate schedules of the papers (pure functions of the scheduler's step count) and
//! HAPPIER's backbone warm-up.
//!
//! | paper | schedule |
//! |---|---|
//! | HAPPIER, ROADMAP, SupRank | cosine, `T_max` = epochs, `eta_min` 0 or 1e-6, stepped per epoch after the warm-up |
//! | Smooth-AP | multi-step, milestones `[200, 300]` (iNat `[40, 70]`), γ = 0.3 |
//! | FastAP | constant |
//!
//! A schedule maps a base learning rate and a *tick* `t` (the number of times PyTorch's
//! `scheduler.step()` has been called: completed epochs or iterations, see [`ScheduleUnit`]) to
//! the learning rate used for the next updates.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::f64::consts::PI;

/// What one schedule tick is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleUnit {
    /// One epoch (the papers' `on_epoch` schedulers).
    #[default]
    Epoch,
    /// One optimizer step (`on_step` schedulers).
    Iteration,
}

/// The decay part of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Decay {
    /// The base learning rate throughout.
    #[default]
    Constant,
    /// Cosine annealing (Loshchilov & Hutter, SGDR, Eq. (5) without restarts; PyTorch
    /// `CosineAnnealingLR`): `η_t = η_min + (η_base − η_min)(1 + cos(π t / T_max)) / 2`. Past
    /// `T_max` the cosine continues (rises again), as PyTorch's.
    Cosine {
        /// Half period `T_max`, in ticks.
        t_max: u64,
        /// Floor `η_min`.
        #[serde(default)]
        eta_min: f64,
        /// Use PyTorch's recursive (`chainable`) form, which `scheduler.step()` computes and
        /// whose rounding differs from the closed form in the last bits (relative ~1e-16); the
        /// default is the closed form of the paper.
        #[serde(default)]
        torch_recursive: bool,
    },
    /// Step decay at milestones (PyTorch `MultiStepLR`): the rate is multiplied by `gamma` at
    /// each milestone reached (a milestone listed twice multiplies twice), one multiplication
    /// after the other, as PyTorch does.
    MultiStep {
        /// Ticks at which the rate decays.
        milestones: Vec<u64>,
        /// Multiplicative factor.
        gamma: f64,
    },
}

/// Linear warm-up of the learning rate (PyTorch `LinearLR(start_factor, 1.0, total_iters)`,
/// closed form): `factor(t) = s + (1 − s) · t / steps` for `t < steps`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Warmup {
    /// Number of ticks of the warm-up.
    pub steps: u64,
    /// Initial factor `s` of the base rate, in `(0, 1]`.
    pub start_factor: f64,
}

/// A schedule: an optional linear warm-up, then a decay whose own tick starts at 0 when the
/// warm-up ends (PyTorch `SequentialLR([LinearLR, decay], milestones=[steps])`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct LrSchedule {
    /// Linear warm-up, if any.
    pub warmup: Option<Warmup>,
    /// Decay after the warm-up.
    pub decay: Decay,
    /// What a tick is.
    pub unit: ScheduleUnit,
}

impl LrSchedule {
    /// Errors naming the first invalid field.
    pub fn validate(&self) -> Result<()> {
        if let Some(w) = &self.warmup {
            if !(w.start_factor > 0.0 && w.start_factor <= 1.0) {
                return Err(Error::invalid(
                    "start_factor",
                    format!("must be in (0, 1], got {}", w.start_factor),
                ));
            }
        }
        match &self.decay {
            Decay::Constant => Ok(()),
            Decay::Cosine { t_max, eta_min, .. } => {
                if *t_max == 0 {
                    return Err(Error::invalid("t_max", "must be ≥ 1"));
                }
                if !(eta_min.is_finite() && *eta_min >= 0.0) {
                    return Err(Error::invalid(
                        "eta_min",
                        format!("must be finite and ≥ 0, got {eta_min}"),
                    ));
                }
                Ok(())
            }
            Decay::MultiStep { gamma, .. } => {
                if !(gamma.is_finite() && *gamma > 0.0) {
                    return Err(Error::invalid(
                        "gamma",
                        format!("must be finite and > 0, got {gamma}"),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The same schedule shortened (or stretched) in proportion, for a run of `to` epochs
    /// instead of `from`: every tick count — the warm-up's length, the cosine's `T_max`, each
    /// milestone — becomes `⌈n · to / from⌉` (`T_max` and the warm-up at least 1), so that the
    /// rate falls at the same *fractions* of the run. Smooth-AP's Table 4 fine-tunes for a quarter
    /// of the recipe's epochs with its schedule shortened this way; scaling only a cosine would
    /// leave a multi-step schedule's milestones past the end of the shorter run.
    ///
    /// ```
    /// use rankwise::train::schedule::{Decay, LrSchedule};
    /// let steps = LrSchedule {
    ///     decay: Decay::MultiStep { milestones: vec![12, 18], gamma: 0.3 },
    ///     ..Default::default()
    /// };
    /// let short = steps.shortened(24, 6);
    /// assert_eq!(short.decay, Decay::MultiStep { milestones: vec![3, 5], gamma: 0.3 });
    /// ```
    pub fn shortened(&self, from: u64, to: u64) -> LrSchedule {
        let scale = |n: u64| {
            if from == 0 {
                n
            } else {
                (n * to).div_ceil(from)
            }
        };
        let mut s = self.clone();
        if let Some(w) = &mut s.warmup {
            w.steps = scale(w.steps).max(1);
        }
        match &mut s.decay {
            Decay::Constant => {}
            Decay::Cosine { t_max, .. } => *t_max = scale(*t_max).max(1),
            Decay::MultiStep { milestones, .. } => {
                for m in milestones.iter_mut() {
                    *m = scale(*m);
                }
            }
        }
        s
    }

    /// The learning rate after `tick` scheduler steps, for a group whose base rate is `base`.
    pub fn lr(&self, base: f64, tick: u64) -> f64 {
        let mut t = tick;
        if let Some(w) = &self.warmup {
            if t < w.steps {
                let s = w.start_factor;
                return base * (s + (1.0 - s) * t as f64 / w.steps as f64);
            }
            t -= w.steps;
        }
        match &self.decay {
            Decay::Constant => base,
            Decay::Cosine {
                t_max,
                eta_min,
                torch_recursive: false,
            } => eta_min + (base - eta_min) * (1.0 + (PI * t as f64 / *t_max as f64).cos()) / 2.0,
            Decay::Cosine {
                t_max,
                eta_min,
                torch_recursive: true,
            } => cosine_torch_recursive(base, *eta_min, *t_max, t),
            Decay::MultiStep { milestones, gamma } => milestones
                .iter()
                .filter(|&&m| m <= t)
                .fold(base, |lr, _| lr * gamma),
        }
    }
}

/// PyTorch `CosineAnnealingLR.get_lr` applied `t` times from `base` (the recursive form).
fn cosine_torch_recursive(base: f64, eta_min: f64, t_max: u64, t: u64) -> f64 {
    let tm = t_max as f64;
    let mut lr = base;
    for e in 1..=t {
        let e_i = e as i128;
        if (e_i - 1 - t_max as i128).rem_euclid(2 * t_max as i128) == 0 {
            lr += (base - eta_min) * (1.0 - (PI / tm).cos()) / 2.0;
        } else {
            lr = (1.0 + (PI * e as f64 / tm).cos()) / (1.0 + (PI * (e - 1) as f64 / tm).cos())
                * (lr - eta_min)
                + eta_min;
        }
    }
    lr
}

/// HAPPIER's backbone warm-up (`warmup_step`, `warmup_keys: [backbone]`): during the first
/// `epochs` epochs the backbone's optimizer is not stepped (only the head learns) and the
/// per-epoch schedulers of every group do not step either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BackboneWarmup {
    /// Number of warm-up epochs (HAPPIER: 5; 0 = none).
    pub epochs: u64,
}

impl BackboneWarmup {
    /// Whether the backbone is frozen during 0-based epoch `epoch` (HAPPIER's 1-based
    /// `warmup_step >= e`).
    pub fn backbone_frozen(&self, epoch: u64) -> bool {
        epoch < self.epochs
    }

    /// Number of per-epoch scheduler steps taken before 0-based epoch `epoch`: the epochs after
    /// the warm-up that have been completed.
    pub fn epoch_ticks(&self, epoch: u64) -> u64 {
        epoch.saturating_sub(self.epochs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(t_max: u64, eta_min: f64, torch_recursive: bool) -> LrSchedule {
        LrSchedule {
            decay: Decay::Cosine {
                t_max,
                eta_min,
                torch_recursive,
            },
            ..Default::default()
        }
    }

    #[test]
    fn cosine_closed_form() {
        let s = cosine(10, 0.1, false);
        assert_eq!(s.lr(1.0, 0), 1.0);
        assert!((s.lr(1.0, 5) - 0.55).abs() < 1e-15);
        assert!((s.lr(1.0, 10) - 0.1).abs() < 1e-15);
        // t = 3: 0.1 + 0.9 (1 + cos(0.3π)) / 2.
        let expected = 0.1 + 0.9 * (1.0 + (0.3 * PI).cos()) / 2.0;
        assert_eq!(s.lr(1.0, 3), expected);
    }

    #[test]
    fn torch_recursive_cosine_tracks_the_closed_form() {
        let closed = cosine(7, 1e-3, false);
        let rec = cosine(7, 1e-3, true);
        for t in 0..30 {
            let (a, b) = (closed.lr(0.5, t), rec.lr(0.5, t));
            assert!((a - b).abs() < 1e-12, "t = {t}: {a} vs {b}");
        }
    }

    #[test]
    fn multistep_multiplies_at_each_milestone() {
        let s = LrSchedule {
            decay: Decay::MultiStep {
                milestones: vec![2, 4, 4],
                gamma: 0.3,
            },
            ..Default::default()
        };
        assert_eq!(s.lr(1e-5, 1), 1e-5);
        assert_eq!(s.lr(1e-5, 2), 1e-5 * 0.3);
        assert_eq!(s.lr(1e-5, 4), 1e-5 * 0.3 * 0.3 * 0.3);
    }

    #[test]
    fn shortened_keeps_the_fractions_of_the_run() {
        // Cosine: T_max 24 of 24 epochs → 6 of 6; 10 of 24 → ⌈2.5⌉ = 3; never below 1.
        assert_eq!(
            cosine(24, 0.0, false).shortened(24, 6),
            cosine(6, 0.0, false)
        );
        assert_eq!(
            cosine(10, 0.0, false).shortened(24, 6),
            cosine(3, 0.0, false)
        );
        assert_eq!(
            cosine(1, 0.0, false).shortened(24, 1),
            cosine(1, 0.0, false)
        );
        // Milestones and the warm-up scale alike; the rates at matching fractions agree.
        let s = LrSchedule {
            warmup: Some(Warmup {
                steps: 4,
                start_factor: 0.1,
            }),
            decay: Decay::MultiStep {
                milestones: vec![0, 10, 15],
                gamma: 0.3,
            },
            unit: ScheduleUnit::Epoch,
        };
        let short = s.shortened(20, 10);
        assert_eq!(short.warmup.unwrap().steps, 2);
        assert_eq!(
            short.decay,
            Decay::MultiStep {
                milestones: vec![0, 5, 8],
                gamma: 0.3
            }
        );
        for t in [0u64, 2, 6, 12, 18] {
            assert_eq!(s.lr(1.0, t), short.lr(1.0, t / 2), "tick {t}");
        }
        // Constant stays constant; a zero-length source leaves the ticks as they are.
        assert_eq!(
            LrSchedule::default().shortened(24, 6),
            LrSchedule::default()
        );
        assert_eq!(cosine(7, 0.0, false).shortened(0, 6), cosine(7, 0.0, false));
    }

    #[test]
    fn warmup_then_decay_restarts_its_tick() {
        let s = LrSchedule {
            warmup: Some(Warmup {
                steps: 4,
                start_factor: 0.2,
            }),
            decay: Decay::Cosine {
                t_max: 4,
                eta_min: 0.0,
                torch_recursive: false,
            },
            unit: ScheduleUnit::Iteration,
        };
        assert!((s.lr(1.0, 0) - 0.2).abs() < 1e-15);
        assert!((s.lr(1.0, 2) - 0.6).abs() < 1e-15);
        assert_eq!(s.lr(1.0, 4), 1.0);
        assert!((s.lr(1.0, 6) - 0.5).abs() < 1e-15);
        assert!(s.lr(1.0, 8).abs() < 1e-15);
        let bad = LrSchedule {
            warmup: Some(Warmup {
                steps: 1,
                start_factor: 0.0,
            }),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        assert!(cosine(0, 0.0, false).validate().is_err());
    }

    #[test]
    fn happier_warmup_counts_epochs_like_the_authors() {
        // HAPPIER: epochs e = 1..; backbone skipped while warmup_step (5) >= e; the epoch
        // schedulers step at the end of every epoch e > 5.
        let w = BackboneWarmup { epochs: 5 };
        let mut ticks = 0;
        for e in 1..=8u64 {
            let epoch = e - 1;
            assert_eq!(w.backbone_frozen(epoch), 5 >= e);
            assert_eq!(w.epoch_ticks(epoch), ticks);
            if 5 < e {
                ticks += 1;
            }
        }
    }
}

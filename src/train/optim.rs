//! Optimizers with PyTorch's semantics: Adam with *coupled* L2 weight decay
//! (`torch.optim.Adam(weight_decay=…)`, what HAPPIER, Smooth-AP and FastAP use), AdamW
//! (decoupled weight decay, `torch.optim.AdamW`), and SGD with momentum, dampening and Nesterov
//! (`torch.optim.SGD`), over parameter groups that each have their own algorithm, learning rate
//! and on/off switch (HAPPIER steps the backbone's optimizer only after its warm-up).
//!
//! Each update follows the formula and operation order of PyTorch's single-tensor (`foreach=False`)
//! implementation, in the parameters' dtype; the last bit of an `f32` update can still differ from
//! PyTorch's, whose CPU kernels use fused multiply-adds in places. A parameter without a gradient
//! is skipped and its state is not advanced (PyTorch skips `p.grad is None`).

use crate::error::{Error, Result};
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

mod device;

/// Hyperparameters of Adam and AdamW (PyTorch names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdamConfig {
    /// `β₁`, decay of the first moment.
    pub beta1: f64,
    /// `β₂`, decay of the second moment.
    pub beta2: f64,
    /// `ε` added to the denominator.
    pub eps: f64,
    /// Weight decay: L2 added to the gradient for Adam, decoupled shrinkage for AdamW (whose
    /// PyTorch default is 1e-2; this struct's default is 0 for both).
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Hyperparameters of SGD (PyTorch names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SgdConfig {
    /// Momentum factor (0 = plain SGD).
    pub momentum: f64,
    /// Dampening of the gradient added to the momentum buffer.
    pub dampening: f64,
    /// Nesterov momentum (needs `momentum > 0` and `dampening = 0`, as in PyTorch).
    pub nesterov: bool,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f64,
}

/// An optimization algorithm with its hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Algorithm {
    /// `torch.optim.Adam`: weight decay is L2 added to the gradient (coupled):
    /// `g ← g + λθ; m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
    /// θ ← θ − (lr / (1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε)`.
    Adam(AdamConfig),
    /// `torch.optim.AdamW`: `θ ← θ(1 − lr·λ)` then the Adam update without L2.
    #[serde(rename = "adamw")]
    AdamW(AdamConfig),
    /// `torch.optim.SGD`: `g ← g + λθ; b ← μb + (1−d)g` (`b ← g` at the first step);
    /// `g ← g + μb` (Nesterov) or `g ← b`; `θ ← θ − lr·g`.
    Sgd(SgdConfig),
}

impl Algorithm {
    /// Errors naming the first invalid hyperparameter.
    pub fn validate(&self) -> Result<()> {
        let check = |field: &str, v: f64, ok: bool, what: &str| -> Result<()> {
            if !v.is_finite() || !ok {
                return Err(Error::invalid(field, format!("must be {what}, got {v}")));
            }
            Ok(())
        };
        match self {
            Algorithm::Adam(c) | Algorithm::AdamW(c) => {
                check("beta1", c.beta1, (0.0..1.0).contains(&c.beta1), "in [0, 1)")?;
                check("beta2", c.beta2, (0.0..1.0).contains(&c.beta2), "in [0, 1)")?;
                check("eps", c.eps, c.eps >= 0.0, "≥ 0")?;
                check("weight_decay", c.weight_decay, c.weight_decay >= 0.0, "≥ 0")
            }
            Algorithm::Sgd(c) => {
                check("momentum", c.momentum, c.momentum >= 0.0, "≥ 0")?;
                check("dampening", c.dampening, c.dampening.is_finite(), "finite")?;
                check("weight_decay", c.weight_decay, c.weight_decay >= 0.0, "≥ 0")?;
                if c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0) {
                    return Err(Error::invalid(
                        "nesterov",
                        "Nesterov momentum requires a momentum > 0 and zero dampening",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// A named group of parameters optimized with one algorithm and one learning rate (a PyTorch
/// param group; HAPPIER's separate `backbone` / `fc` optimizers are two groups).
#[derive(Debug, Clone)]
pub struct ParamGroup {
    /// Name of the group (`backbone`, `head`, …).
    pub name: String,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Base learning rate (the schedule multiplies or replaces it, see
    /// [`super::schedule::LrSchedule`]).
    pub lr: f64,
    /// The parameters, by name.
    pub params: Vec<(String, Var)>,
}

/// Per-parameter state (PyTorch `optimizer.state[p]`).
#[derive(Debug, Clone, Default)]
struct ParamState {
    /// Number of updates applied to this parameter.
    step: u64,
    /// Adam first moment.
    exp_avg: Option<Tensor>,
    /// Adam second moment.
    exp_avg_sq: Option<Tensor>,
    /// SGD momentum buffer.
    momentum_buffer: Option<Tensor>,
}

#[derive(Debug, Clone)]
struct Param {
    name: String,
    var: Var,
    state: ParamState,
}

#[derive(Debug, Clone)]
struct Group {
    name: String,
    algorithm: Algorithm,
    base_lr: f64,
    lr: f64,
    enabled: bool,
    params: Vec<Param>,
}

/// The serialisable scalar state of one group (tensors are exported separately).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupState {
    /// Group name.
    pub name: String,
    /// Current learning rate.
    #[serde(with = "crate::io::json_f64")]
    pub lr: f64,
    /// Whether the group is stepped.
    pub enabled: bool,
    /// Update count of each parameter.
    pub steps: BTreeMap<String, u64>,
}

/// An optimizer over several parameter groups.
///
/// Not `Clone`: like the variables, its state is updated in place on a CUDA device, so a clone
/// would share it (use [`Optimizer::state_tensors`] and [`Optimizer::load_state`] to copy it).
#[derive(Debug)]
pub struct Optimizer {
    groups: Vec<Group>,
}

/// Names of the state tensors of parameter `param`: `optim.{param}.{buffer}`.
fn state_key(param: &str, buffer: &str) -> String {
    format!("optim.{param}.{buffer}")
}

impl Optimizer {
    /// An optimizer over `groups`. Errors on an invalid hyperparameter or learning rate, an empty
    /// or duplicate group name, or a parameter listed twice.
    pub fn new(groups: Vec<ParamGroup>) -> Result<Self> {
        let mut seen_groups = BTreeSet::new();
        let mut seen_params = BTreeSet::new();
        let mut out = Vec::with_capacity(groups.len());
        for g in groups {
            g.algorithm.validate()?;
            if !(g.lr.is_finite() && g.lr >= 0.0) {
                return Err(Error::invalid(
                    "lr",
                    format!("group `{}`: must be finite and ≥ 0, got {}", g.name, g.lr),
                ));
            }
            if !seen_groups.insert(g.name.clone()) {
                return Err(Error::invalid(
                    "groups",
                    format!("group `{}` appears twice", g.name),
                ));
            }
            if g.params.is_empty() {
                return Err(Error::invalid(
                    "groups",
                    format!("group `{}` has no parameters", g.name),
                ));
            }
            let mut params = Vec::with_capacity(g.params.len());
            for (name, var) in g.params {
                if !seen_params.insert(name.clone()) {
                    return Err(Error::invalid(
                        "groups",
                        format!("parameter `{name}` is in two groups"),
                    ));
                }
                params.push(Param {
                    name,
                    var,
                    state: ParamState::default(),
                });
            }
            out.push(Group {
                name: g.name,
                algorithm: g.algorithm,
                base_lr: g.lr,
                lr: g.lr,
                enabled: true,
                params,
            });
        }
        Ok(Optimizer { groups: out })
    }

    /// Group names, in order.
    pub fn group_names(&self) -> Vec<&str> {
        self.groups.iter().map(|g| g.name.as_str()).collect()
    }

    fn group_mut(&mut self, name: &str) -> Result<&mut Group> {
        self.groups
            .iter_mut()
            .find(|g| g.name == name)
            .ok_or_else(|| Error::invalid("group", format!("no parameter group `{name}`")))
    }

    /// Base learning rate of group `name`.
    pub fn base_lr(&self, name: &str) -> Option<f64> {
        self.groups
            .iter()
            .find(|g| g.name == name)
            .map(|g| g.base_lr)
    }

    /// Current learning rate of group `name`.
    pub fn lr(&self, name: &str) -> Option<f64> {
        self.groups.iter().find(|g| g.name == name).map(|g| g.lr)
    }

    /// Sets the learning rate of group `name` (what a scheduler does).
    pub fn set_lr(&mut self, name: &str, lr: f64) -> Result<()> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::invalid(
                "lr",
                format!("must be finite and ≥ 0, got {lr}"),
            ));
        }
        self.group_mut(name)?.lr = lr;
        Ok(())
    }

    /// Turns the updates of group `name` on or off (HAPPIER's backbone warm-up skips the
    /// backbone's `optimizer.step()`; its state is untouched while off).
    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> Result<()> {
        self.group_mut(name)?.enabled = enabled;
        Ok(())
    }

    /// Applies one update to every parameter of every enabled group that has a gradient in
    /// `grads`.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        for group in self.groups.iter_mut().filter(|g| g.enabled) {
            // The group's Adam updates on a device, made by one launch after the loop.
            let mut on_device = Vec::new();
            for p in &mut group.params {
                let Some(grad) = grads.get(p.var.as_tensor()) else {
                    continue;
                };
                let grad = grad.detach();
                let theta = p.var.as_detached_tensor();
                p.state.step += 1;
                if device::applies(&theta) && theta.elem_count() > 0 {
                    // In place, by kernels (`device`): same values.
                    match group.algorithm {
                        Algorithm::Adam(_) | Algorithm::AdamW(_) => {
                            on_device.push((theta, grad, &mut p.state))
                        }
                        Algorithm::Sgd(c) => {
                            device::sgd_step(&theta, &grad, &mut p.state, group.lr, &c)?
                        }
                    }
                    continue;
                }
                let new = match group.algorithm {
                    Algorithm::Adam(c) => {
                        adam_update(&theta, &grad, &mut p.state, group.lr, &c, false)?
                    }
                    Algorithm::AdamW(c) => {
                        adam_update(&theta, &grad, &mut p.state, group.lr, &c, true)?
                    }
                    Algorithm::Sgd(c) => sgd_update(&theta, &grad, &mut p.state, group.lr, &c)?,
                };
                p.var.set(&new)?;
            }
            if let (false, Algorithm::Adam(c) | Algorithm::AdamW(c)) =
                (on_device.is_empty(), group.algorithm)
            {
                let decoupled = matches!(group.algorithm, Algorithm::AdamW(_));
                device::adam_step_many(on_device, group.lr, &c, decoupled)?;
            }
        }
        Ok(())
    }

    /// The scalar state of every group (for checkpoints).
    pub fn group_states(&self) -> Vec<GroupState> {
        self.groups
            .iter()
            .map(|g| GroupState {
                name: g.name.clone(),
                lr: g.lr,
                enabled: g.enabled,
                steps: g
                    .params
                    .iter()
                    .map(|p| (p.name.clone(), p.state.step))
                    .collect(),
            })
            .collect()
    }

    /// The state tensors (moments, momentum buffers), named `optim.{param}.{exp_avg |
    /// exp_avg_sq | momentum_buffer}`: copies, since a step on a CUDA device updates the state
    /// in place.
    pub fn state_tensors(&self) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for p in self.groups.iter().flat_map(|g| &g.params) {
            let s = &p.state;
            for (buffer, t) in [
                ("exp_avg", &s.exp_avg),
                ("exp_avg_sq", &s.exp_avg_sq),
                ("momentum_buffer", &s.momentum_buffer),
            ] {
                if let Some(t) = t {
                    out.push((state_key(&p.name, buffer), t.copy()?));
                }
            }
        }
        Ok(out)
    }

    /// Restores the state saved by [`Optimizer::group_states`] and
    /// [`Optimizer::state_tensors`]. The groups and parameters must be the same; errors name
    /// `source` and the group, parameter or tensor that does not match.
    pub fn load_state(
        &mut self,
        states: &[GroupState],
        tensors: &BTreeMap<String, Tensor>,
        source: &std::path::Path,
    ) -> Result<()> {
        if states.len() != self.groups.len() {
            return Err(Error::file(
                source,
                format!(
                    "the checkpoint has {} optimizer groups, the optimizer {}",
                    states.len(),
                    self.groups.len()
                ),
            ));
        }
        for (g, s) in self.groups.iter_mut().zip(states) {
            if g.name != s.name || g.params.len() != s.steps.len() {
                return Err(Error::file(
                    source,
                    format!(
                        "optimizer group `{}` ({} parameters) does not match the checkpoint's \
                         `{}` ({} parameters)",
                        g.name,
                        g.params.len(),
                        s.name,
                        s.steps.len()
                    ),
                ));
            }
            g.lr = s.lr;
            g.enabled = s.enabled;
            for p in &mut g.params {
                let step = *s.steps.get(&p.name).ok_or_else(|| {
                    Error::file(
                        source,
                        format!("no optimizer state for parameter `{}`", p.name),
                    )
                })?;
                let get = |buffer: &str| -> Result<Option<Tensor>> {
                    match tensors.get(&state_key(&p.name, buffer)) {
                        None => Ok(None),
                        // A copy: the caller's tensor must not change when a step on a
                        // CUDA device updates the state in place.
                        Some(t) if t.dims() == p.var.dims() => Ok(Some(
                            t.to_dtype(p.var.dtype())?
                                .to_device(p.var.device())?
                                .copy()?,
                        )),
                        Some(t) => Err(Error::file(
                            source,
                            format!(
                                "tensor `{}` has shape {:?}, the parameter {:?}",
                                state_key(&p.name, buffer),
                                t.dims(),
                                p.var.dims()
                            ),
                        )),
                    }
                };
                let state = ParamState {
                    step,
                    exp_avg: get("exp_avg")?,
                    exp_avg_sq: get("exp_avg_sq")?,
                    momentum_buffer: get("momentum_buffer")?,
                };
                let needs = match g.algorithm {
                    Algorithm::Adam(_) | Algorithm::AdamW(_) => {
                        state.exp_avg.is_some() && state.exp_avg_sq.is_some()
                    }
                    Algorithm::Sgd(c) => c.momentum == 0.0 || state.momentum_buffer.is_some(),
                };
                if step > 0 && !needs {
                    return Err(Error::file(
                        source,
                        format!("missing optimizer state tensors of parameter `{}`", p.name),
                    ));
                }
                p.state = state;
            }
        }
        Ok(())
    }
}

/// PyTorch `torch.lerp(start, end, weight)` on CPU: `start + w(end − start)` for `w < 0.5`,
/// `end − (end − start)(1 − w)` otherwise (the form PyTorch uses for accuracy near 1).
fn lerp(start: &Tensor, end: &Tensor, weight: f64) -> Result<Tensor> {
    let diff = (end - start)?;
    Ok(if weight < 0.5 {
        (start + (diff * weight)?)?
    } else {
        (end - (diff * (1.0 - weight))?)?
    })
}

/// One Adam / AdamW update of `theta` (PyTorch `_single_tensor_adam`); returns the new value.
fn adam_update(
    theta: &Tensor,
    grad: &Tensor,
    state: &mut ParamState,
    lr: f64,
    c: &AdamConfig,
    decoupled: bool,
) -> Result<Tensor> {
    let mut theta = theta.clone();
    let mut grad = grad.clone();
    if c.weight_decay != 0.0 {
        if decoupled {
            theta = (theta * (1.0 - lr * c.weight_decay))?;
        } else {
            grad = (grad + (&theta * c.weight_decay)?)?;
        }
    }
    let m = match &state.exp_avg {
        Some(m) => lerp(m, &grad, 1.0 - c.beta1)?,
        None => lerp(&grad.zeros_like()?, &grad, 1.0 - c.beta1)?,
    };
    let v_prev = match &state.exp_avg_sq {
        Some(v) => v.clone(),
        None => grad.zeros_like()?,
    };
    let v = ((v_prev * c.beta2)? + ((&grad * (1.0 - c.beta2))? * &grad)?)?;
    let step = state.step as i32;
    let bias_correction1 = 1.0 - c.beta1.powi(step);
    let bias_correction2 = 1.0 - c.beta2.powi(step);
    let step_size = lr / bias_correction1;
    let denom = ((v.sqrt()? / bias_correction2.sqrt())? + c.eps)?;
    let new = (theta + ((&m / &denom)? * -step_size)?)?;
    state.exp_avg = Some(m);
    state.exp_avg_sq = Some(v);
    Ok(new)
}

/// One SGD update of `theta` (PyTorch `_single_tensor_sgd`); returns the new value.
fn sgd_update(
    theta: &Tensor,
    grad: &Tensor,
    state: &mut ParamState,
    lr: f64,
    c: &SgdConfig,
) -> Result<Tensor> {
    let mut g = grad.clone();
    if c.weight_decay != 0.0 {
        g = (g + (theta * c.weight_decay)?)?;
    }
    if c.momentum != 0.0 {
        let buf = match &state.momentum_buffer {
            None => g.copy()?,
            Some(b) => ((b * c.momentum)? + (&g * (1.0 - c.dampening))?)?,
        };
        g = if c.nesterov {
            (g + (&buf * c.momentum)?)?
        } else {
            buf.clone()
        };
        state.momentum_buffer = Some(buf);
    }
    Ok((theta + (g * -lr)?)?)
}

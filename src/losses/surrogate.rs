//! Step surrogates: the smoothings of the Heaviside step `H(t)`, `t = s_j − s_k`, from which every
//! smooth-rank loss is built (the "rank approximations" of the authors' SupRank code).
//!
//! Each surrogate is available in two equivalent forms:
//! * scalar [`StepSurrogate::value`] / [`StepSurrogate::derivative`] in `f64`, used by the
//!   streaming engine of [`crate::losses::smooth_rank`], which writes its own exact backward pass;
//! * a candle tensor expression [`StepSurrogate::apply`] built only from differentiable candle
//!   ops (`affine`, `exp`, `recip`, `where_cond`), so that candle's autograd gives the gradient on
//!   any device. We chose plain tensor expressions over a `CustomOp` here because they run on
//!   CUDA unchanged and are the independent reference the streaming engine is tested against.
//!
//! Both forms evaluate the same formula with the same floating-point operations (for example
//! `t · (−1/τ)` rather than `−t/τ`, because that is what candle's scalar division does), so their
//! values agree to the last bit on the CPU and their derivatives to a few ulps.
//!
//! Internally each surrogate is also described as a list of `Piece`s over `t`: constant,
//! affine or sigmoid. The streaming engine sums constant pieces by counting (no gradient) and
//! evaluates the others item by item.

use crate::error::{Error, Result};
use candle_core::Tensor;

/// The authors clamp the sigmoid's exponent to `[−50, 50]` (`tau_sigmoid` in the Smooth-AP,
/// ROADMAP and HAPPIER code) so that `exp` never overflows, even in f16/f32 at τ = 0.01. Outside
/// the clamp the value is constant and the derivative is zero. We clamp on `t` at `±50τ`, which
/// is the same set up to one rounding of the boundary (where the function is continuous).
pub const SIGMOID_CLAMP: f64 = 50.0;

/// A smoothing of the Heaviside step, shared by every smooth-rank loss.
pub trait StepSurrogate {
    /// `f(t)`.
    fn value(&self, t: f64) -> f64;
    /// `f'(t)` (zero on constant pieces, including the whole exact Heaviside).
    fn derivative(&self, t: f64) -> f64;
    /// The same function as a candle expression of `t` (any shape, float dtype), with
    /// autograd: the gradient equals [`StepSurrogate::derivative`].
    fn apply(&self, t: &Tensor) -> Result<Tensor>;
    /// Whether the surrogate passes any gradient (false for the exact step).
    fn has_gradient(&self) -> bool;
}

/// The exact step `H(t) = 1{t > 0}`, with a chosen value at `t = 0`. No gradient.
///
/// `zero = 1.0` is the authors' convention in every loss (`torch.heaviside(t, values=1)`), and
/// our default; `0.0` gives Smooth-AP's `1{s_i − s_j < 0}` (Eq. 3), which counts ties as not
/// ranked before.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Heaviside {
    /// `H(0)`.
    pub zero: f64,
}

impl Default for Heaviside {
    fn default() -> Self {
        Heaviside { zero: 1.0 }
    }
}

/// The temperature sigmoid `G(t; τ) = 1 / (1 + exp(−t/τ))` of Smooth-AP Eq. (6), with the
/// authors' exponent clamp at ±50 (see [`SIGMOID_CLAMP`]): it never overflows, in f32 at
/// τ = 0.01 included, and has zero derivative for `|t| > 50τ` (where `G' < 2·10⁻²²/τ`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sigmoid {
    /// Temperature τ (0.01 in Smooth-AP and HAPPIER).
    pub tau: f64,
}

impl Default for Sigmoid {
    fn default() -> Self {
        Sigmoid { tau: 0.01 }
    }
}

/// HAPPIER Eq. (44) (from ROADMAP): the smooth *upper* bound `H_s^<` of the step, used on the
/// pairs where `j` is less relevant than `k` (so that `rank_s ≥ rank`):
///
/// ```text
/// H_s^<(t) = σ(t/τ)              t ≤ 0
///          = σ(t/τ) + start      0 < t ≤ δ
///          = ρ (t − δ) + offset  t > δ
/// ```
///
/// The paper's `offset` is `σ(δ/τ) + start` (= 1.4933 for the defaults), which makes the
/// function continuous at δ; it is used when `offset` is `None`. The authors' configs hard-code
/// `offset = 1.44` on SOP ([`UpperStep::sop_code`]) and `offset = 1.0, start = 0.0` on
/// iNaturalist ([`UpperStep::inat_code`]). `legacy_linear` reproduces the paper-era ROADMAP code,
/// whose linear branch was `ρ t + offset` (no `− δ`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpperStep {
    /// Sigmoid temperature τ (0.01).
    pub tau: f64,
    /// Slope ρ of the linear branch (100).
    pub rho: f64,
    /// Margin δ where the linear branch starts (0.05).
    pub delta: f64,
    /// Jump added on `(0, δ]` (0.5).
    pub start: f64,
    /// Value of the linear branch at δ; `None` = the paper's continuous `σ(δ/τ) + start`.
    pub offset: Option<f64>,
    /// Paper-era ROADMAP code: linear branch `ρ t + offset` instead of `ρ (t − δ) + offset`.
    pub legacy_linear: bool,
}

impl Default for UpperStep {
    /// The paper's setting: τ = 0.01, ρ = 100, δ = 0.05, start = 0.5, continuous offset.
    fn default() -> Self {
        UpperStep {
            tau: 0.01,
            rho: 100.0,
            delta: 0.05,
            start: 0.5,
            offset: None,
            legacy_linear: false,
        }
    }
}

impl UpperStep {
    /// The authors' SOP configs (HAPPIER `HAPPIER_SOP.yaml`, ROADMAP `roadmap.yaml`): offset 1.44.
    pub fn sop_code() -> Self {
        UpperStep {
            offset: Some(1.44),
            ..Self::default()
        }
    }

    /// The authors' iNaturalist configs (`HAPPIER_inat.yaml`, `roadmap_inat.yaml`):
    /// offset 1.0, start 0.0.
    pub fn inat_code() -> Self {
        UpperStep {
            offset: Some(1.0),
            start: 0.0,
            ..Self::default()
        }
    }

    /// The offset actually used: the configured one, or the paper's `σ(δ/τ) + start`.
    pub fn effective_offset(&self) -> f64 {
        self.offset
            .unwrap_or_else(|| Sigmoid { tau: self.tau }.value(self.delta) + self.start)
    }
}

/// HAPPIER Eq. (43): the smooth *lower* bound `H_s^>` of the step, used in `H-rank` on the pairs
/// where `j` is more relevant than `k` (so that `H-rank_s ≤ H-rank`):
///
/// ```text
/// H_s^>(t) = γ t                 t < 0
///          = min(ν t + μ, 1)     t ≥ 0
/// ```
///
/// The paper prints `max(ν t + μ, 1)`, a typo: it must be `min` to be a lower bound, and the
/// code clamps with `max=1`. At exactly `t = 0` the paper gives `μ` while the authors'
/// `step_hrank` puts 0 in the leaky branch (`t ≤ 0`); `origin_in_leak` selects the latter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LowerStep {
    /// Slope γ of the negative branch (10; the code's `leak`).
    pub gamma: f64,
    /// Slope ν of the positive branch (25; the code's `beta`).
    pub nu: f64,
    /// Value μ at 0⁺ (0.5; the code's `gamma`).
    pub mu: f64,
    /// Authors' code: `t = 0` belongs to the leaky branch (value 0).
    pub origin_in_leak: bool,
}

impl Default for LowerStep {
    /// The paper's setting γ = 10, ν = 25, μ = 0.5.
    fn default() -> Self {
        LowerStep {
            gamma: 10.0,
            nu: 25.0,
            mu: 0.5,
            origin_in_leak: false,
        }
    }
}

impl LowerStep {
    /// `t` where `ν t + μ` reaches 1 and the function saturates.
    fn saturation(&self) -> f64 {
        (1.0 - self.mu) / self.nu
    }
}

/// Any of the step surrogates, for configurations that choose one per pair category.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Surrogate {
    /// The exact step (no gradient).
    Heaviside(Heaviside),
    /// Smooth-AP's sigmoid.
    Sigmoid(Sigmoid),
    /// HAPPIER/ROADMAP's `H_s^<`.
    UpperStep(UpperStep),
    /// HAPPIER's `H_s^>`.
    LowerStep(LowerStep),
}

impl From<Heaviside> for Surrogate {
    fn from(s: Heaviside) -> Self {
        Surrogate::Heaviside(s)
    }
}
impl From<Sigmoid> for Surrogate {
    fn from(s: Sigmoid) -> Self {
        Surrogate::Sigmoid(s)
    }
}
impl From<UpperStep> for Surrogate {
    fn from(s: UpperStep) -> Self {
        Surrogate::UpperStep(s)
    }
}
impl From<LowerStep> for Surrogate {
    fn from(s: LowerStep) -> Self {
        Surrogate::LowerStep(s)
    }
}

fn check_finite(field: &str, v: f64) -> Result<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(Error::invalid(field, format!("must be finite, got {v}")))
    }
}

fn check_positive(field: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("must be finite and > 0, got {v}"),
        ))
    }
}

fn check_non_negative(field: &str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("must be finite and ≥ 0, got {v}"),
        ))
    }
}

impl Surrogate {
    /// Errors on parameters that make the surrogate undefined (τ ≤ 0, negative slopes, NaN, μ
    /// outside `[0, 1]`), naming the parameter.
    pub fn validate(&self) -> Result<()> {
        match self {
            Surrogate::Heaviside(h) => check_finite("heaviside zero", h.zero),
            Surrogate::Sigmoid(s) => check_positive("tau", s.tau),
            Surrogate::UpperStep(u) => {
                check_positive("tau", u.tau)?;
                check_non_negative("rho", u.rho)?;
                check_non_negative("delta", u.delta)?;
                check_finite("start", u.start)?;
                if let Some(o) = u.offset {
                    check_finite("offset", o)?;
                }
                Ok(())
            }
            Surrogate::LowerStep(l) => {
                check_non_negative("gamma", l.gamma)?;
                check_positive("nu", l.nu)?;
                if !(0.0..=1.0).contains(&l.mu) {
                    return Err(Error::invalid(
                        "mu",
                        format!("must be in [0, 1], got {}", l.mu),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The surrogate as consecutive pieces over `t`, in increasing `t` order.
    pub(crate) fn pieces(&self) -> Vec<Piece> {
        match self {
            Surrogate::Heaviside(h) => vec![
                Piece::new(Upper::Lt(0.0), PieceFn::Const(0.0)),
                Piece::new(Upper::Le(0.0), PieceFn::Const(h.zero)),
                Piece::new(Upper::Inf, PieceFn::Const(1.0)),
            ],
            Surrogate::Sigmoid(s) => vec![
                Piece::new(
                    Upper::Lt(-SIGMOID_CLAMP * s.tau),
                    PieceFn::Const(sigmoid_clamped_low()),
                ),
                Piece::new(
                    Upper::Le(SIGMOID_CLAMP * s.tau),
                    PieceFn::Sigmoid {
                        tau: s.tau,
                        add: 0.0,
                    },
                ),
                Piece::new(Upper::Inf, PieceFn::Const(sigmoid_clamped_high())),
            ],
            Surrogate::UpperStep(u) => {
                let edge = SIGMOID_CLAMP * u.tau;
                let mut p = vec![
                    Piece::new(Upper::Lt(-edge), PieceFn::Const(sigmoid_clamped_low())),
                    Piece::new(
                        Upper::Le(0.0),
                        PieceFn::Sigmoid {
                            tau: u.tau,
                            add: 0.0,
                        },
                    ),
                ];
                // On (0, δ] the sigmoid may itself be past its clamp when δ > 50τ.
                p.push(Piece::new(
                    Upper::Le(u.delta.min(edge)),
                    PieceFn::Sigmoid {
                        tau: u.tau,
                        add: u.start,
                    },
                ));
                if u.delta > edge {
                    p.push(Piece::new(
                        Upper::Le(u.delta),
                        PieceFn::Const(sigmoid_clamped_high() + u.start),
                    ));
                }
                let (slope, shift) = if u.legacy_linear {
                    (u.rho, 0.0)
                } else {
                    (u.rho, u.delta)
                };
                p.push(Piece::new(
                    Upper::Inf,
                    PieceFn::Affine {
                        slope,
                        shift,
                        intercept: u.effective_offset(),
                    },
                ));
                p
            }
            Surrogate::LowerStep(l) => {
                let leak_end = if l.origin_in_leak {
                    Upper::Le(0.0)
                } else {
                    Upper::Lt(0.0)
                };
                vec![
                    Piece::new(
                        leak_end,
                        PieceFn::Affine {
                            slope: l.gamma,
                            shift: 0.0,
                            intercept: 0.0,
                        },
                    ),
                    Piece::new(
                        Upper::Lt(l.saturation()),
                        PieceFn::Affine {
                            slope: l.nu,
                            shift: 0.0,
                            intercept: l.mu,
                        },
                    ),
                    Piece::new(Upper::Inf, PieceFn::Const(1.0)),
                ]
            }
        }
    }

    fn piece_at(&self, t: f64) -> PieceFn {
        self.pieces()
            .into_iter()
            .find(|p| p.upper.contains(t))
            .map(|p| p.f)
            .unwrap_or(PieceFn::Const(f64::NAN))
    }
}

/// `σ(−50)`: the sigmoid's value below the clamp.
fn sigmoid_clamped_low() -> f64 {
    1.0 / (SIGMOID_CLAMP.exp() + 1.0)
}

/// `σ(50)`: the sigmoid's value above the clamp (1 in f64).
fn sigmoid_clamped_high() -> f64 {
    1.0 / ((-SIGMOID_CLAMP).exp() + 1.0)
}

/// The unclamped temperature sigmoid and its derivative, written with the ops candle uses.
///
/// The derivative is `σ² · E / τ` with `E = exp(−t/τ)`, which, unlike `σ (1 − σ) / τ`, keeps full
/// relative precision when σ is close to 1.
#[inline]
pub(crate) fn sigmoid_value_derivative(t: f64, tau: f64) -> (f64, f64) {
    let e = (t * (-1.0 / tau)).exp();
    let s = 1.0 / (e + 1.0);
    (s, s * s * e / tau)
}

/// The upper end of a piece: `t < b`, `t ≤ b` or unbounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Upper {
    Lt(f64),
    Le(f64),
    Inf,
}

impl Upper {
    /// Whether `t` lies below this end.
    #[inline]
    pub(crate) fn contains(&self, t: f64) -> bool {
        match *self {
            Upper::Lt(b) => t < b,
            Upper::Le(b) => t <= b,
            Upper::Inf => true,
        }
    }
}

/// The function on one piece.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PieceFn {
    /// A constant: summed by counting, no gradient.
    Const(f64),
    /// `slope · (t − shift) + intercept`.
    Affine {
        slope: f64,
        shift: f64,
        intercept: f64,
    },
    /// `σ(t/τ) + add` (inside the clamp).
    Sigmoid { tau: f64, add: f64 },
}

impl PieceFn {
    /// Value and derivative at `t`.
    #[inline]
    pub(crate) fn eval(&self, t: f64) -> (f64, f64) {
        match *self {
            PieceFn::Const(c) => (c, 0.0),
            PieceFn::Affine {
                slope,
                shift,
                intercept,
            } => (slope * (t - shift) + intercept, slope),
            PieceFn::Sigmoid { tau, add } => {
                let (s, d) = sigmoid_value_derivative(t, tau);
                (s + add, d)
            }
        }
    }
}

/// One piece of a surrogate: the function on `(previous upper end, upper]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Piece {
    pub(crate) upper: Upper,
    pub(crate) f: PieceFn,
}

impl Piece {
    fn new(upper: Upper, f: PieceFn) -> Self {
        Piece { upper, f }
    }
}

/// `where_cond` with a scalar on the false branch.
fn select(mask: &Tensor, on_true: &Tensor, on_false: f64) -> Result<Tensor> {
    Ok(mask.where_cond(on_true, &constant_like(on_true, on_false)?)?)
}

impl StepSurrogate for Surrogate {
    fn value(&self, t: f64) -> f64 {
        self.piece_at(t).eval(t).0
    }

    fn derivative(&self, t: f64) -> f64 {
        self.piece_at(t).eval(t).1
    }

    fn apply(&self, t: &Tensor) -> Result<Tensor> {
        match self {
            Surrogate::Heaviside(h) => {
                let dt = t.dtype();
                let above = t.gt(0.0)?.to_dtype(dt)?;
                let tie = t.eq(0.0)?.to_dtype(dt)?;
                Ok((above + (tie * h.zero)?)?.detach())
            }
            Surrogate::Sigmoid(s) => sigmoid_tensor(t, s.tau),
            Surrogate::UpperStep(u) => {
                let sig = sigmoid_tensor(t, u.tau)?;
                let bumped = (&sig + u.start)?;
                let linear = if u.legacy_linear {
                    ((t * u.rho)? + u.effective_offset())?
                } else {
                    (((t - u.delta)? * u.rho)? + u.effective_offset())?
                };
                let inner = t.gt(0.0)?.where_cond(&bumped, &sig)?;
                Ok(t.gt(u.delta)?.where_cond(&linear, &inner)?)
            }
            Surrogate::LowerStep(l) => {
                let leak = (t * l.gamma)?;
                let rise = ((t * l.nu)? + l.mu)?;
                let capped = select(&t.lt(l.saturation())?, &rise, 1.0)?;
                let in_leak = if l.origin_in_leak {
                    t.le(0.0)?
                } else {
                    t.lt(0.0)?
                };
                Ok(in_leak.where_cond(&leak, &capped)?)
            }
        }
    }

    fn has_gradient(&self) -> bool {
        !matches!(self, Surrogate::Heaviside(_))
    }
}

/// The clamped sigmoid as a candle expression. Outside the clamp the exponent is replaced by a
/// detached constant *before* `exp`, so no `inf` (and no `0 · inf = NaN` in the backward pass) can
/// appear, whatever τ and the dtype.
fn sigmoid_tensor(t: &Tensor, tau: f64) -> Result<Tensor> {
    let edge = SIGMOID_CLAMP * tau;
    let below = t.lt(-edge)?;
    let outside = (&below + t.gt(edge)?)?;
    let safe_t = outside.where_cond(&constant_like(t, 0.0)?, t)?;
    let e = safe_t.affine(-1.0 / tau, 0.0)?.exp()?;
    let s = (e + 1.0)?.recip()?;
    let clamped = below.where_cond(
        &constant_like(t, sigmoid_clamped_low())?,
        &constant_like(t, sigmoid_clamped_high())?,
    )?;
    Ok(outside.where_cond(&clamped, &s)?)
}

/// A tensor shaped like `t`, filled with `v`, outside any graph.
fn constant_like(t: &Tensor, v: f64) -> Result<Tensor> {
    Ok(t.zeros_like()?.affine(0.0, v)?)
}

macro_rules! forward_to_enum {
    ($ty:ty) => {
        impl StepSurrogate for $ty {
            fn value(&self, t: f64) -> f64 {
                Surrogate::from(*self).value(t)
            }
            fn derivative(&self, t: f64) -> f64 {
                Surrogate::from(*self).derivative(t)
            }
            fn apply(&self, t: &Tensor) -> Result<Tensor> {
                Surrogate::from(*self).apply(t)
            }
            fn has_gradient(&self) -> bool {
                Surrogate::from(*self).has_gradient()
            }
        }
    };
}

forward_to_enum!(Heaviside);
forward_to_enum!(Sigmoid);
forward_to_enum!(UpperStep);
forward_to_enum!(LowerStep);

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn all() -> Vec<Surrogate> {
        vec![
            Heaviside::default().into(),
            Heaviside { zero: 0.0 }.into(),
            Sigmoid::default().into(),
            Sigmoid { tau: 0.3 }.into(),
            UpperStep::default().into(),
            UpperStep::sop_code().into(),
            UpperStep::inat_code().into(),
            UpperStep {
                legacy_linear: true,
                ..UpperStep::sop_code()
            }
            .into(),
            UpperStep {
                tau: 0.0005,
                ..UpperStep::default()
            }
            .into(),
            LowerStep::default().into(),
            LowerStep {
                origin_in_leak: true,
                ..LowerStep::default()
            }
            .into(),
        ]
    }

    fn grid() -> Vec<f64> {
        let mut t: Vec<f64> = (-300..=300).map(|i| i as f64 * 0.0037).collect();
        t.extend([
            0.0, 0.05, 0.02, -0.5, 0.5, 1e-9, -1e-9, 0.6, -0.6, 3.0, -3.0,
        ]);
        t
    }

    #[test]
    fn tensor_and_scalar_forms_agree() {
        let t = grid();
        for s in all() {
            let var = Var::from_vec(t.clone(), t.len(), &Device::Cpu).unwrap();
            let y = s.apply(var.as_tensor()).unwrap();
            let values = y.to_vec1::<f64>().unwrap();
            let grads = y.sum_all().unwrap().backward().unwrap();
            let d = grads
                .get(var.as_tensor())
                .map(|g| g.to_vec1::<f64>().unwrap())
                .unwrap_or_else(|| vec![0.0; t.len()]);
            for (i, &ti) in t.iter().enumerate() {
                assert!(
                    (values[i] - s.value(ti)).abs() <= 1e-15 * s.value(ti).abs().max(1.0),
                    "{s:?} value at {ti}: {} vs {}",
                    values[i],
                    s.value(ti)
                );
                let ds = s.derivative(ti);
                assert!(
                    (d[i] - ds).abs() <= 1e-12 * ds.abs().max(1.0),
                    "{s:?} derivative at {ti}: {} vs {ds}",
                    d[i]
                );
            }
        }
    }

    #[test]
    fn derivative_matches_finite_differences_away_from_kinks() {
        let h = 1e-8;
        for s in all() {
            for &t in &grid() {
                // Skip points within 2h of a piece boundary.
                let near_kink = s.pieces().iter().any(|p| match p.upper {
                    Upper::Lt(b) | Upper::Le(b) => (t - b).abs() < 2.0 * h,
                    Upper::Inf => false,
                });
                if near_kink {
                    continue;
                }
                let fd = (s.value(t + h) - s.value(t - h)) / (2.0 * h);
                let d = s.derivative(t);
                assert!(
                    (fd - d).abs() <= 1e-5 * d.abs().max(1.0),
                    "{s:?} at {t}: fd {fd} vs {d}"
                );
            }
        }
    }

    #[test]
    fn sigmoid_is_stable_in_f32_at_small_temperature() {
        let t = Tensor::new(&[-1e4f32, -2.0, -0.3, 0.0, 0.3, 2.0, 1e4], &Device::Cpu).unwrap();
        let var = Var::from_tensor(&t).unwrap();
        for s in [
            Surrogate::from(Sigmoid::default()),
            UpperStep::default().into(),
            Sigmoid { tau: 1e-4 }.into(),
        ] {
            let y = s.apply(var.as_tensor()).unwrap();
            assert_eq!(y.dtype(), DType::F32);
            let v = y.to_vec1::<f32>().unwrap();
            assert!(v.iter().all(|x| x.is_finite()), "{s:?}: {v:?}");
            let g = y.sum_all().unwrap().backward().unwrap();
            let g = g.get(var.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
            assert!(g.iter().all(|x| x.is_finite()), "{s:?}: {g:?}");
        }
        let s = Sigmoid::default();
        assert_eq!(s.value(-2.0), 1.0 / (50f64.exp() + 1.0));
        assert_eq!(s.value(2.0), 1.0);
        assert_eq!(s.derivative(2.0), 0.0);
        assert_eq!(s.value(0.0), 0.5);
        assert!((s.derivative(0.0) - 25.0).abs() < 1e-12);
    }

    #[test]
    fn smooth_ap_operating_region_half_width() {
        // Smooth-AP §B.1.4: G'(x) > 0.005 ⇔ |x| < 0.0990 at τ = 0.01.
        let s = Sigmoid::default();
        assert!(s.derivative(0.0989) > 0.005 && s.derivative(-0.0989) > 0.005);
        assert!(s.derivative(0.0991) < 0.005 && s.derivative(-0.0991) < 0.005);
    }

    #[test]
    fn upper_step_offsets_and_bounds() {
        let paper = UpperStep::default();
        // σ(δ/τ) + 0.5 = σ(5) + 0.5.
        let expect = 1.0 / (1.0 + (-5f64).exp()) + 0.5;
        assert!((paper.effective_offset() - expect).abs() < 1e-15);
        assert!((paper.effective_offset() - 1.49331).abs() < 1e-5);
        // Continuous at δ with the paper's offset; the code's 1.44 drops by 0.053.
        let d = paper.delta;
        assert!((paper.value(d) - paper.value(d + 1e-12)).abs() < 1e-9);
        let sop = UpperStep::sop_code();
        assert!((sop.value(d) - sop.value(d + 1e-12) - 0.0533).abs() < 1e-3);
        // iNat config: sigmoid on (0, δ] without the jump, then 1 + ρ (t − δ).
        let inat = UpperStep::inat_code();
        assert_eq!(inat.value(0.03), Sigmoid::default().value(0.03));
        assert!((inat.value(0.06) - (1.0 + 100.0 * (0.06 - 0.05))).abs() < 1e-12);
        // Paper-era ROADMAP: ρ t + offset.
        let legacy = UpperStep {
            legacy_linear: true,
            ..UpperStep::sop_code()
        };
        assert!((legacy.value(0.06) - (100.0 * 0.06 + 1.44)).abs() < 1e-12);
        // An upper bound of H away from the tie (H(0) = 1 > σ(0) = 0.5).
        let h = Heaviside::default();
        for &t in &grid() {
            if t != 0.0 {
                assert!(paper.value(t) >= h.value(t), "{t}");
            }
        }
    }

    #[test]
    fn lower_step_values_and_bound() {
        let l = LowerStep::default();
        assert!((l.value(-0.1) + 1.0).abs() < 1e-15);
        assert_eq!(l.value(0.0), 0.5);
        assert!((l.value(0.01) - 0.75).abs() < 1e-15);
        assert_eq!(l.value(0.03), 1.0);
        assert_eq!(l.derivative(0.03), 0.0);
        assert_eq!(l.derivative(-0.3), 10.0);
        assert_eq!(l.derivative(0.01), 25.0);
        let code = LowerStep {
            origin_in_leak: true,
            ..l
        };
        assert_eq!(code.value(0.0), 0.0);
        let h = Heaviside::default();
        for &t in &grid() {
            assert!(l.value(t) <= h.value(t), "{t}");
        }
    }

    #[test]
    fn heaviside_convention_and_no_gradient() {
        assert_eq!(Heaviside::default().value(0.0), 1.0);
        assert_eq!(Heaviside { zero: 0.0 }.value(0.0), 0.0);
        assert_eq!(Heaviside::default().value(-1e-300), 0.0);
        assert!(!Heaviside::default().has_gradient());
        assert!(Sigmoid::default().has_gradient());
    }

    #[test]
    fn invalid_parameters_are_named() {
        let e = Surrogate::from(Sigmoid { tau: 0.0 })
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("tau"), "{e}");
        let e = Surrogate::from(UpperStep {
            rho: -1.0,
            ..UpperStep::default()
        })
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("rho"), "{e}");
        let e = Surrogate::from(LowerStep {
            mu: 1.5,
            ..LowerStep::default()
        })
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("mu"), "{e}");
        let e = Surrogate::from(UpperStep {
            offset: Some(f64::NAN),
            ..UpperStep::default()
        })
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("offset"), "{e}");
    }
}

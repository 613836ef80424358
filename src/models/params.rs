//! The named parameters of a model: a candle `VarMap` with deterministic, seeded initialisation
//! and loading from `.safetensors` files with errors that name the file and the tensor.
//!
//! Names follow the PyTorch state-dict convention (`layer1.0.conv1.weight`,
//! `layer1.0.bn1.running_mean`, …), so torchvision weights converted to safetensors load by name.
//! Batch-norm running statistics (`*.running_mean`, `*.running_var`) are *buffers*: stored,
//! checkpointed and loaded like parameters but never handed to an optimizer.

use crate::error::{Error, Result};
use crate::samplers::stream_rng;
use candle_core::{DType, Device, Shape, Tensor, Var};
use candle_nn::init::{FanInOut, Init, NormalOrUniform};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{VarBuilder, VarMap};
use rand::Rng;
use rand_distr::{Distribution, Normal};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Suffixes of the names of buffers: tensors of the model that no optimizer updates.
pub const BUFFER_SUFFIXES: [&str; 2] = [".running_mean", ".running_var"];

/// Whether `name` is a buffer (batch-norm running statistics) rather than a trainable parameter.
pub fn is_buffer(name: &str) -> bool {
    BUFFER_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The variables of a model by name, created on first use with a seeded initialisation.
///
/// Every variable draws its initial values from its own ChaCha8 stream, selected by a hash of
/// its name and seeded with [`ParamStore::seed`]: the initial weights depend only on the seed and
/// the name, not on the order in which layers are built (candle's own initialisers use an
/// unseeded thread-local generator on the CPU, which cannot be reproduced).
#[derive(Clone)]
pub struct ParamStore {
    varmap: VarMap,
    seed: u64,
}

impl std::fmt::Debug for ParamStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamStore")
            .field("seed", &self.seed)
            .field("names", &self.names())
            .finish()
    }
}

impl ParamStore {
    /// An empty store whose variables will be initialised from `seed`.
    pub fn new(seed: u64) -> Self {
        ParamStore {
            varmap: VarMap::new(),
            seed,
        }
    }

    /// The initialisation seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A `VarBuilder` that creates missing variables in this store (seeded) and returns existing
    /// ones, for the `new(cfg, vb)` constructors of [`crate::models`].
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        let backend = SeededBackend {
            varmap: self.varmap.clone(),
            seed: self.seed,
        };
        VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
    }

    /// All variable names, sorted.
    pub fn names(&self) -> Vec<String> {
        let data = self.varmap.data().lock().expect("VarMap lock poisoned");
        let mut names: Vec<String> = data.keys().cloned().collect();
        names.sort();
        names
    }

    /// The variable called `name`.
    pub fn get(&self, name: &str) -> Option<Var> {
        let data = self.varmap.data().lock().expect("VarMap lock poisoned");
        data.get(name).cloned()
    }

    /// Every variable (parameters and buffers), sorted by name.
    pub fn all(&self) -> Vec<(String, Var)> {
        let data = self.varmap.data().lock().expect("VarMap lock poisoned");
        let sorted: BTreeMap<&String, &Var> = data.iter().collect();
        sorted
            .into_iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The trainable parameters (not buffers) whose name starts with `prefix`, sorted by name.
    pub fn trainable(&self, prefix: &str) -> Vec<(String, Var)> {
        self.all()
            .into_iter()
            .filter(|(name, _)| name.starts_with(prefix) && !is_buffer(name))
            .collect()
    }

    /// Number of scalar values in the trainable parameters under `prefix`.
    pub fn num_trainable(&self, prefix: &str) -> usize {
        self.trainable(prefix)
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .sum()
    }

    /// Overwrites every variable with the tensor of the same name in `tensors` (converted to the
    /// variable's dtype and device). Errors, naming `source` and the tensor, when one is missing,
    /// has another shape or holds a non-finite value. Extra tensors are ignored.
    pub fn assign_all(&self, tensors: &BTreeMap<String, Tensor>, source: &Path) -> Result<()> {
        for (name, var) in self.all() {
            let t = tensors.get(&name).ok_or_else(|| {
                Error::file(source, format!("missing tensor `{name}` of the model"))
            })?;
            assign(&var, t, &name, source)?;
        }
        Ok(())
    }

    /// Loads pretrained weights from a `.safetensors` file into the variables whose name starts
    /// with `prefix`; the tensor looked up in the file is the variable's name without the prefix
    /// (a torchvision ResNet state dict converted to safetensors loads into `backbone.` with
    /// `prefix = "backbone."`). Tensors of the file that the model does not use (`fc.*`,
    /// `*.num_batches_tracked`) are ignored and returned, sorted.
    ///
    /// Errors name the file and the tensor: file missing or unreadable, not a safetensors file, a
    /// tensor missing, a shape mismatch, a non-finite value.
    pub fn load_safetensors(&self, path: impl AsRef<Path>, prefix: &str) -> Result<Vec<String>> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let file = safetensors::SafeTensors::deserialize(&bytes)
            .map_err(|e| Error::file(path, format!("not a valid safetensors file: {e}")))?;
        let mut unused: BTreeSet<String> = file.names().into_iter().map(String::from).collect();
        let targets: Vec<(String, Var)> = self
            .all()
            .into_iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .collect();
        if targets.is_empty() {
            return Err(Error::invalid(
                "prefix",
                format!("no model variable starts with `{prefix}`"),
            ));
        }
        for (name, var) in targets {
            let key = &name[prefix.len()..];
            let view = file.tensor(key).map_err(|_| {
                Error::file(
                    path,
                    format!("missing tensor `{key}` (needed for the model's `{name}`)"),
                )
            })?;
            let t = candle_core::safetensors::Load::load(&view, var.device())
                .map_err(|e| Error::file(path, format!("tensor `{key}`: {e}")))?;
            assign(&var, &t, key, path)?;
            unused.remove(key);
        }
        Ok(unused.into_iter().collect())
    }
}

/// Copies `t` into `var` after checking shape and finiteness; errors name `name` and `source`.
pub(crate) fn assign(var: &Var, t: &Tensor, name: &str, source: &Path) -> Result<()> {
    if t.dims() != var.dims() {
        return Err(Error::file(
            source,
            format!(
                "tensor `{name}` has shape {:?} but the model expects {:?}",
                t.dims(),
                var.dims()
            ),
        ));
    }
    let t = t.to_dtype(var.dtype())?.to_device(var.device())?;
    let total = t
        .to_dtype(DType::F64)?
        .abs()?
        .sum_all()?
        .to_scalar::<f64>()?;
    if !total.is_finite() {
        return Err(Error::file(
            source,
            format!("tensor `{name}` contains NaN or infinity"),
        ));
    }
    var.set(&t)?;
    Ok(())
}

/// FNV-1a hash of a variable name: selects its random stream.
fn name_stream(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Draws the initial values of variable `name` from its seeded stream (PyTorch's `nn.init`
/// formulas: `Randn` = `normal_`, `Uniform` = `uniform_`, `Kaiming` = `kaiming_normal_` /
/// `kaiming_uniform_` with the given fan and gain).
fn seeded_values(init: Init, shape: &Shape, seed: u64, name: &str) -> Result<Vec<f32>> {
    let n = shape.elem_count();
    let mut rng = stream_rng(seed, name_stream(name));
    let normal = |mean: f64, std: f64, rng: &mut rand_chacha::ChaCha8Rng| -> Result<Vec<f32>> {
        let d =
            Normal::new(mean, std).map_err(|e| Error::invalid("init", format!("{name}: {e}")))?;
        Ok((0..n).map(|_| d.sample(rng) as f32).collect())
    };
    let uniform = |lo: f64, up: f64, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> {
        (0..n)
            .map(|_| (lo + (up - lo) * rng.random::<f64>()) as f32)
            .collect()
    };
    match init {
        Init::Const(c) => Ok(vec![c as f32; n]),
        Init::Randn { mean, stdev } => normal(mean, stdev, &mut rng),
        Init::Uniform { lo, up } => Ok(uniform(lo, up, &mut rng)),
        Init::Kaiming {
            dist,
            fan,
            non_linearity,
        } => {
            let fan = fan.for_shape(shape).max(1);
            let std = non_linearity.gain() / (fan as f64).sqrt();
            match dist {
                NormalOrUniform::Normal => normal(0.0, std, &mut rng),
                NormalOrUniform::Uniform => {
                    let bound = 3f64.sqrt() * std;
                    Ok(uniform(-bound, bound, &mut rng))
                }
            }
        }
    }
}

/// The `VarBuilder` backend of [`ParamStore`].
struct SeededBackend {
    varmap: VarMap,
    seed: u64,
}

impl SimpleBackend for SeededBackend {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut data = self.varmap.data().lock().expect("VarMap lock poisoned");
        if let Some(var) = data.get(name) {
            if var.shape() != &s {
                candle_core::bail!(
                    "variable {name} exists with shape {:?}, requested {s:?}",
                    var.shape()
                );
            }
            return Ok(var.as_tensor().clone());
        }
        let values = seeded_values(h, &s, self.seed, name)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let t = Tensor::from_vec(values, s, dev)?.to_dtype(dtype)?;
        let var = Var::from_tensor(&t)?;
        let out = var.as_tensor().clone();
        data.insert(name.to_string(), var);
        Ok(out)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let data = self.varmap.data().lock().expect("VarMap lock poisoned");
        match data.get(name) {
            Some(v) => v.as_tensor().to_dtype(dtype)?.to_device(dev),
            None => {
                candle_core::bail!("variable {name} does not exist and has no shape to create it")
            }
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        let data = self.varmap.data().lock().expect("VarMap lock poisoned");
        data.contains_key(name)
    }
}

/// Kaiming-normal initialisation with fan-out and the ReLU gain: torchvision's ResNet conv init
/// (`kaiming_normal_(mode="fan_out", nonlinearity="relu")`).
pub const KAIMING_NORMAL_FAN_OUT: Init = Init::Kaiming {
    dist: NormalOrUniform::Normal,
    fan: FanInOut::FanOut,
    non_linearity: candle_nn::init::NonLinearity::ReLU,
};

/// PyTorch's default `nn.Linear` / `nn.Conv2d` weight and bias initialisation for a layer with
/// `fan_in` inputs: `U(−1/√fan_in, 1/√fan_in)` (`kaiming_uniform_(a=√5)` reduces to this bound).
pub fn torch_default_uniform(fan_in: usize) -> Init {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_depends_on_seed_and_name_only() {
        let a = ParamStore::new(3);
        let b = ParamStore::new(3);
        let va = a.var_builder(DType::F32, &Device::Cpu);
        let vb = b.var_builder(DType::F32, &Device::Cpu);
        // Created in different orders.
        let x1 = va.get_with_hints(
            (4, 3),
            "x",
            Init::Randn {
                mean: 0.,
                stdev: 1.,
            },
        );
        let y1 = va.get_with_hints(5, "y", torch_default_uniform(4));
        let y2 = vb.get_with_hints(5, "y", torch_default_uniform(4));
        let x2 = vb.get_with_hints(
            (4, 3),
            "x",
            Init::Randn {
                mean: 0.,
                stdev: 1.,
            },
        );
        let v = |t: candle_core::Result<Tensor>| {
            t.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        let (x1, x2, y1, y2) = (v(x1), v(x2), v(y1), v(y2));
        assert_eq!(x1, x2);
        assert_eq!(y1, y2);
        assert_ne!(x1[..3], y1[..3]);
        assert!(y1.iter().all(|&u| u.abs() <= 0.5));
        let c = ParamStore::new(4).var_builder(DType::F32, &Device::Cpu);
        assert_ne!(
            x1,
            v(c.get_with_hints(
                (4, 3),
                "x",
                Init::Randn {
                    mean: 0.,
                    stdev: 1.
                }
            ))
        );
    }

    #[test]
    fn kaiming_fan_out_has_the_torchvision_scale() {
        let s = ParamStore::new(0);
        let vb = s.var_builder(DType::F32, &Device::Cpu);
        let w = vb
            .get_with_hints((64, 16, 3, 3), "w", KAIMING_NORMAL_FAN_OUT)
            .unwrap();
        let v: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
        let var = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64;
        let expected = 2.0 / (64.0 * 9.0);
        assert!((var / expected - 1.0).abs() < 0.1, "{var} vs {expected}");
    }

    #[test]
    fn buffers_are_not_trainable() {
        let s = ParamStore::new(0);
        let vb = s.var_builder(DType::F32, &Device::Cpu);
        vb.get_with_hints(2, "bn.weight", Init::Const(1.)).unwrap();
        vb.get_with_hints(2, "bn.running_mean", Init::Const(0.))
            .unwrap();
        let names: Vec<String> = s.trainable("").into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["bn.weight"]);
        assert!(is_buffer("a.b.running_var"));
    }
}

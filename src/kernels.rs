//! The library's own CUDA kernels: their switch and, in a build with the `cuda` feature, their
//! compilation and loading.
//!
//! Where a loss's host pass would stall the GPU (the `B × B` scores copied to the host, its
//! cores doing the per-row work, the gradient copied back), a kernel of its own computes the
//! same quantities on the device: `src/losses/smooth_rank/device.cu` (Smooth-AP, ROADMAP,
//! HAPPIER), `src/losses/triplet/device.cu` (the triplet minings), `src/losses/rambo/device.cu`
//! (RaMBO's ranks and blackbox gradient), `src/losses/fastap/device.cu` (FastAP's histograms)
//! and `src/losses/contrastive/device.cu` (the contrastive loss's pairs, also ROADMAP's
//! calibration term); `src/losses/norm_softmax/device.cu` takes the proxy losses' cosines to
//! their mean softmax cross-entropy (HAPPIER's clustering term, NSM) in four launches instead
//! of candle's two dozen. A loss whose gradient is one more kernel implements
//! `loss_op::KernelLoss` (its two passes' launches) and runs as one candle op
//! (`loss_op::apply`: the checks, the dtype dispatch, the state kept between the passes).
//! The optimizers' updates are kernels of the same kind (`src/train/optim/device.cu`: each
//! parameter and its state in place, one launch for a whole group's Adam step and one or two
//! per parameter for SGD, instead of a dozen candle operations per parameter), and so are BatchNorm's running averages (`src/models/layers/running_stats.cu`)
//! and the models' ReLU (`src/models/layers/relu.cu`), the verdicts of the losses' input checks
//! (`src/losses/guard/device.cu`: no read back per step), the losses' L2 normalisation and its
//! gradient (`src/losses/normalize/device.cu`), and the evaluation's ranking
//! (`src/retrieval/device_rank.cu`, its own switch too). The sources are compiled by
//! NVRTC when first used (one PTX module per source and process, loaded once per device by
//! candle), so the build needs no CUDA compiler beyond candle's; `scripts/build_cuda.sh`
//! compiles them with the same NVRTC on the build machine, and the unit tests compile them with
//! the host's C++ compiler under an emulated launch grid (`tests/cuda_emulation/`).
//!
//! **Switch.** [`enabled`] is on unless the environment sets `RANKWISE_DEVICE_KERNELS=0` (or
//! [`set_enabled`] turns it off): the losses and optimizers then take their generic paths, for a
//! side-by-side measurement or as a fallback.

static SWITCH: crate::switch::EnvSwitch = crate::switch::EnvSwitch::new("RANKWISE_DEVICE_KERNELS");

/// Whether the losses and the optimizers use their CUDA kernels (on a CUDA device, within each
/// kernel's size bound): on, unless `RANKWISE_DEVICE_KERNELS` is `0`, `off` or `false` or
/// [`set_enabled`] said otherwise.
pub fn enabled() -> bool {
    SWITCH.on()
}

/// Turns the losses' CUDA kernels on or off for the whole process (the GPU check measures both).
pub fn set_enabled(on: bool) {
    SWITCH.set(on);
}

/// The default bound on the work of one call of the kernels that scan a row per pair (the
/// smooth-rank losses' `Σ_q P_q · N` and the triplet minings' `B · Σ_a P_a`, `P` the positives
/// of a query or anchor) or sort the rows (RaMBO's `B² (32 + ⌈log₂ B⌉²)`): `2³⁶` — `B³` at
/// B = 4096, where the first, cubic kernels were written to take over from the host engines;
/// beyond it, the host engines' sorted algorithms.
pub const DEFAULT_MAX_WORK: usize = 1 << 36;

/// The bound on the work of one call of the cubic kernels: [`DEFAULT_MAX_WORK`], or the value
/// of `RANKWISE_KERNEL_MAX_WORK` (a positive integer, or `2^k`), read once — so that a GPU
/// session can time the kernels against the host engines beyond the default without a rebuild
/// before the default moves. A value that does not parse is reported once on stderr, naming
/// the variable, and the default holds.
pub fn max_work() -> usize {
    static BOUND: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BOUND.get_or_init(|| {
        let Ok(raw) = std::env::var("RANKWISE_KERNEL_MAX_WORK") else {
            return DEFAULT_MAX_WORK;
        };
        parse_work(&raw).unwrap_or_else(|| {
            eprintln!(
                "RANKWISE_KERNEL_MAX_WORK={raw:?} is neither a positive integer nor 2^k \
                 (k < 64): the default 2^36 holds"
            );
            DEFAULT_MAX_WORK
        })
    })
}

/// `123` or `2^40` (a positive integer, or a power of two below `2⁶⁴`).
fn parse_work(raw: &str) -> Option<usize> {
    let raw = raw.trim();
    let value = match raw.strip_prefix("2^") {
        Some(k) => 1usize.checked_shl(k.parse().ok()?)?,
        None => raw.parse().ok()?,
    };
    (value > 0).then_some(value)
}

/// Whether `x` is on a CUDA device in `f32` or `f64`, in a build with the `cuda` feature, with
/// the kernels [`enabled`]: the common condition of every kernel.
pub(crate) fn on_cuda(x: &candle_core::Tensor) -> bool {
    cfg!(feature = "cuda")
        && x.device().is_cuda()
        && matches!(x.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
        && enabled()
}

/// Checks that an op was given a contiguous `rows × cols` matrix (the kernels' ops, and the
/// CPU implementations beside some of them).
pub(crate) fn check_matrix(
    op: &str,
    l: &candle_core::Layout,
    rows: usize,
    cols: usize,
) -> candle_core::Result<()> {
    if l.dims() != [rows, cols] || !l.is_contiguous() {
        return Err(candle_core::Error::Msg(format!(
            "{op}: input {:?} (contiguous: {}), expected a contiguous {rows} × {cols} matrix",
            l.dims(),
            l.is_contiguous()
        )));
    }
    Ok(())
}

#[cfg(feature = "cuda")]
pub(crate) mod loss_op;

#[cfg(feature = "cuda")]
pub(crate) use cuda::{
    check_elementwise, dtype_error, instance, not_on_cpu, per_entry, per_row, ptx, run_into_new,
    view, Float,
};

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
    };
    use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
    use candle_core::{CudaStorage, Layout};
    use std::sync::Mutex;

    /// A scalar type the kernels are instantiated for: their names end in `_f32` or `_f64`.
    pub(crate) trait Float: DeviceRepr + ValidAsZeroBits + CudaDType {
        const SUFFIX: &'static str;
    }
    impl Float for f32 {
        const SUFFIX: &'static str = "f32";
    }
    impl Float for f64 {
        const SUFFIX: &'static str = "f64";
    }

    /// The PTX of `source`, compiled by NVRTC once per process (kept for the process's life).
    pub(crate) fn ptx(
        module: &'static str,
        source: &'static str,
    ) -> candle_core::Result<&'static str> {
        static CACHE: Mutex<Vec<(&'static str, Result<&'static str, String>)>> =
            Mutex::new(Vec::new());
        let mut cache = CACHE
            .lock()
            .map_err(|_| candle_core::Error::Msg("the PTX cache's lock is poisoned".into()))?;
        let entry = match cache.iter().position(|(m, _)| *m == module) {
            Some(i) => &cache[i].1,
            None => {
                let compiled = candle_core::cuda_backend::cudarc::nvrtc::compile_ptx(source)
                    .map(|p| &*Box::leak(p.to_src().into_boxed_str()))
                    .map_err(|e| format!("NVRTC could not compile {module}: {e}"));
                cache.push((module, compiled));
                &cache[cache.len() - 1].1
            }
        };
        match entry {
            Ok(ptx) => Ok(*ptx),
            Err(e) => Err(candle_core::Error::Msg(e.clone())),
        }
    }

    /// The values of a contiguous storage from its layout's offset (also the cuDNN ops').
    pub(crate) fn view<'a, T: CudaDType>(
        s: &'a CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<CudaView<'a, T>> {
        Ok(s.as_cuda_slice::<T>()?.slice(l.start_offset()..))
    }

    /// Threads per block of every kernel launch.
    const BLOCK: u32 = 256;

    /// A launch of one thread per `(row, column)` of a `rows × cols` matrix: block `(r, c)` has
    /// the threads of row `r`, columns `c · BLOCK..`; the kernels read `blockIdx.x` as the row.
    pub(crate) fn per_entry(rows: usize, cols: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (rows as u32, (cols as u32).div_ceil(BLOCK), 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// A launch of one thread per row of `rows`.
    pub(crate) fn per_row(rows: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: ((rows as u32).div_ceil(BLOCK), 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The error of a kernel's op asked to run on the CPU, which takes the host engine instead.
    pub(crate) fn not_on_cpu(op: &str) -> candle_core::Error {
        candle_core::Error::Msg(format!(
            "{op} runs on a CUDA device; on the CPU the loss takes its host engine"
        ))
    }

    /// The error of a kernel's op given another dtype than `f32` or `f64`.
    pub(crate) fn dtype_error(op: &str, d: candle_core::DType) -> candle_core::Error {
        candle_core::Error::Msg(format!("{op}: f32 or f64 input, not {d:?}"))
    }

    /// Checks the operands of an elementwise kernel over `n` values (the in-place updates,
    /// the ReLU): every one contiguous, of `n` values and of one dtype, and `n` within the
    /// 32-bit launch grid of [`per_row`]; returns that dtype.
    pub(crate) fn check_elementwise(
        op: &str,
        n: usize,
        operands: &[(&CudaStorage, &Layout)],
    ) -> candle_core::Result<candle_core::DType> {
        use candle_core::backend::BackendStorage;
        if n > u32::MAX as usize {
            return Err(candle_core::Error::Msg(format!(
                "{op}: {n} values, more than the kernels' 32-bit launch grid"
            )));
        }
        let dtype = operands.first().map(|o| o.0.dtype());
        for (s, l) in operands {
            if !l.is_contiguous() || l.shape().elem_count() != n {
                return Err(candle_core::Error::Msg(format!(
                    "{op}: tensors of {n} contiguous values expected, got {:?} (contiguous: {})",
                    l.dims(),
                    l.is_contiguous()
                )));
            }
            if Some(s.dtype()) != dtype {
                return Err(candle_core::Error::Msg(format!(
                    "{op}: {:?} and {:?} tensors mixed",
                    dtype,
                    s.dtype()
                )));
            }
        }
        dtype.ok_or_else(|| candle_core::Error::Msg(format!("{op}: no operand")))
    }

    /// The name of the kernel `name` instantiated for `T`: `{name}_{T::SUFFIX}`. The caller
    /// loads it with candle's `CudaDevice::get_or_load_custom_func(name, module, ptx)`, which
    /// keeps one loaded module per device.
    pub(crate) fn instance<T: Float>(name: &str) -> String {
        format!("{name}_{}", T::SUFFIX)
    }

    /// The kernel `kernel` of `module` (compiled from `source`) for `T`, launched on the
    /// contiguous storages `inputs` as `kernel(inputs…, out, scalars…)` on
    /// [`per_row`]`(threads)` threads, `out` a new buffer of `len` values, wrapped.
    fn launch_into_new<T: Float>(
        dev: &CudaDevice,
        (module, source): (&'static str, &'static str),
        kernel: &str,
        inputs: &[(&CudaStorage, &Layout)],
        len: usize,
        scalars: &[u64],
        threads: usize,
    ) -> candle_core::Result<CudaStorage> {
        let f =
            dev.get_or_load_custom_func(&instance::<T>(kernel), module, ptx(module, source)?)?;
        let views = inputs
            .iter()
            .map(|(s, l)| view::<T>(s, l))
            .collect::<candle_core::Result<Vec<_>>>()?;
        // SAFETY: the callers' kernels write every value of `out` before anything reads it.
        let mut out: CudaSlice<T> = unsafe { dev.alloc::<T>(len)? };
        let mut l = f.builder();
        for x in &views {
            l.arg(x);
        }
        l.arg(&mut out);
        for v in scalars {
            l.arg(v);
        }
        // SAFETY: the callers check that the inputs and `out` hold what the kernel reads and
        // writes for these scalars and threads.
        unsafe { l.launch(per_row(threads)) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }

    /// [`launch_into_new`] on contiguous f32 or f64 storages of one dtype (`op` names the
    /// caller in errors).
    pub(crate) fn run_into_new(
        op: &str,
        code: (&'static str, &'static str),
        kernel: &str,
        inputs: &[(&CudaStorage, &Layout)],
        len: usize,
        scalars: &[u64],
        threads: usize,
    ) -> candle_core::Result<CudaStorage> {
        use candle_core::backend::BackendStorage;
        let first = inputs
            .first()
            .ok_or_else(|| candle_core::Error::Msg(format!("{op}: no operand")))?
            .0;
        let dtype = first.dtype();
        if inputs.iter().any(|(s, _)| s.dtype() != dtype) {
            return Err(candle_core::Error::Msg(format!("{op}: dtypes mixed")));
        }
        let dev = first.device();
        match dtype {
            candle_core::DType::F32 => {
                launch_into_new::<f32>(dev, code, kernel, inputs, len, scalars, threads)
            }
            candle_core::DType::F64 => {
                launch_into_new::<f64>(dev, code, kernel, inputs, len, scalars, threads)
            }
            d => Err(dtype_error(op, d)),
        }
    }
}

/// The unit tests' access to the kernels without a GPU: a harness of `tests/cuda_emulation/`
/// (which includes a kernel source and emulates its launches) built with the host's C++
/// compiler and run on a binary input.
#[cfg(test)]
pub(crate) mod emulation {
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::sync::Mutex;

    /// The harness `tests/cuda_emulation/{name}.cpp`, built once per test process beside the
    /// test binary (under a name of this process, then renamed into place: atomic).
    fn harness(name: &str) -> PathBuf {
        static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
        let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
        let built = built.get_or_insert_with(HashMap::new);
        if let Some(bin) = built.get(name) {
            return bin.clone();
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let exe = std::env::current_exe().expect("the test binary's path");
        let bin = exe.with_file_name(format!("rankwise-emulation-{name}"));
        let tmp = exe.with_file_name(format!("rankwise-emulation-{name}.{}", std::process::id()));
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = Command::new(&cxx)
            .args(["-std=c++17", "-O2", "-Wall", "-Werror", "-o"])
            .arg(&tmp)
            .arg(root.join(format!("tests/cuda_emulation/{name}.cpp")))
            .output()
            .unwrap_or_else(|e| {
                panic!("the kernel emulation tests need a C++ compiler ({cxx}): {e}")
            });
        assert!(
            out.status.success(),
            "{cxx} could not build tests/cuda_emulation/{name}.cpp:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &bin).expect("renaming the harness into place");
        built.insert(name.to_owned(), bin.clone());
        bin
    }

    /// Appends `values` to a harness input as little-endian `f32` or `f64`.
    pub(crate) fn push_values(input: &mut Vec<u8>, values: &[f64], as_f32: bool) {
        for &v in values {
            if as_f32 {
                input.extend((v as f32).to_le_bytes());
            } else {
                input.extend(v.to_le_bytes());
            }
        }
    }

    /// `n` reproducible values in `[−0.5, 0.5)` (a linear congruential generator): the
    /// emulation tests' embeddings.
    pub(crate) fn uniform(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) - 0.5
            })
            .collect()
    }

    /// A loss `value` and its `∂x` (for an incoming gradient of 1, `x`'s shape) computed by
    /// emulated kernels, attached to the graph of `x` as the device op attaches them, so that
    /// autograd carries `∂x` on to what `x` depends on (the embeddings, for the comparison with
    /// the host engines).
    pub(crate) fn attach_loss(
        x: &candle_core::Tensor,
        value: f64,
        dx: Vec<f64>,
    ) -> candle_core::Tensor {
        use candle_core::{Device, Tensor};
        let dtype = x.dtype();
        let value = Tensor::new(value, &Device::Cpu)
            .and_then(|v| v.to_dtype(dtype))
            .expect("the loss value as a tensor");
        let dx = Tensor::from_vec(dx, x.shape(), &Device::Cpu)
            .and_then(|d| d.to_dtype(dtype))
            .expect("∂x in the shape of x");
        crate::attach::attach(x, &value, move |_, _, grad| {
            Ok(Some(dx.broadcast_mul(&grad.reshape((1, 1))?)?))
        })
        .expect("the attached loss")
    }

    /// Runs the harness `name` on `input`; its standard output as little-endian doubles.
    pub(crate) fn run(name: &str, input: &[u8]) -> Vec<f64> {
        let file = tempfile::NamedTempFile::new().expect("a temporary file");
        std::fs::write(file.path(), input).expect("writing the harness input");
        let out = Command::new(harness(name))
            .arg(file.path())
            .output()
            .expect("running the harness");
        assert!(
            out.status.success(),
            "harness {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_work_bound_reads_integers_and_powers_of_two() {
        assert_eq!(parse_work("4096"), Some(4096));
        assert_eq!(parse_work(" 2^42 "), Some(1 << 42));
        assert_eq!(parse_work("2^63"), Some(1 << 63));
        for bad in ["0", "-5", "2^64", "2^x", "1e12", "", "2^"] {
            assert_eq!(parse_work(bad), None, "{bad:?}");
        }
        assert_eq!(DEFAULT_MAX_WORK, 4096 * 4096 * 4096);
    }
}

//! The CPU engine: everything the crate does to be fast on a CPU, behind one door, so that
//! the domain modules read as the papers do.
//!
//! # Why a CPU engine
//!
//! candle's CPU backend is correct but pays, on the small machines our users train on, costs
//! that have nothing to do with the arithmetic (profiles in `benches/losses_vs_torch.md` and
//! `benches/train_throughput_vs_torch.md`, 2-core VMs):
//!
//! * Every op's output is a fresh `mmap`, page-faulted and unmapped each step (38% of a ResNet
//!   step was in the kernel): [`alloc::tune_allocator`] makes glibc keep freed buffers.
//! * candle's barrier pool spins beside rayon's pool on 2 cores (after each backward pass a
//!   loss step ran on about one core): [`threads::tune_candle_threads`].
//! * One rayon hand-off (wake, run, wait) per parallel loop (37 µs back to back, 62–102 µs
//!   after a gap, per loop): `work_phases::run_phases` runs a step's loops in one hand-off,
//!   with dedicated spinning `helper_threads`.
//! * A running `f64` sum is bound by the add latency (several times slower on `B × 512`
//!   passes): `host_sums` keeps independent partial sums and reads values in place.
//! * Strided packing of a transposed view (125–185 against 175–215 GFLOP/s at SOP scale):
//!   [`gemm::gemm_into`] on laid-out operands.
//!
//! # Who uses it
//!
//! * `retrieval`: the chunked score products of the evaluation engine ([`gemm`]) and the input
//!   checks (`host_sums`).
//! * `losses::pairwise_rows`: the row-loss engine of FastAP, RaMBO, contrastive and triplet; on
//!   the CPU with the batch in one chunk its `fused` path runs each pass in one hand-off
//!   (`work_phases`, `host_sums`).
//! * `losses::normalize`: every loss's L2 normalisation, its gradient one pass per row
//!   (`host_sums`).
//! * `models::conv`, `models::cpu_ops`: the CPU convolution and fused layers ([`gemm`],
//!   `with_values`).
//! * The binary, the trainer's examples and the notebooks call [`alloc::tune_allocator`] and
//!   [`threads::tune_candle_threads`] once at start.
//!
//! # The contract
//!
//! Nothing here changes a result beyond float rounding. Every fast path has a plain candle
//! formulation beside it — the one the CUDA path runs, and the one a reader should read first —
//! and a test that the two agree on values and gradients (`losses::pairwise_rows` against
//! autograd of the same loss, `models::conv` against candle's `conv2d`, the engine against the
//! per-query metrics). Off the CPU the fast paths step aside: the kernels fall back to candle's
//! ops on the tensor's device. A constant tuned to a machine (a chunk size, a spin window) says
//! in its comment which measurement chose it.

pub mod alloc;
pub mod gemm;
pub(crate) mod helper_threads;
pub(crate) mod host_sums;
pub(crate) mod scratch;
pub mod threads;
pub(crate) mod work_phases;

use candle_core::{CpuStorage, Layout, Tensor, WithDType};

/// The contiguous values of a CPU storage as `T`.
pub(crate) fn slice<'a, T: WithDType>(
    s: &'a CpuStorage,
    l: &Layout,
) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => candle_core::bail!("rankwise CPU kernel: expected a contiguous tensor"),
    }
}

/// Runs `f` on the values of a CPU tensor, copied only when not contiguous: kernels read their
/// inputs in place instead of converting them to vectors first.
pub(crate) fn with_values<T: WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(s) => f(slice(s, layout)?),
        _ => candle_core::bail!("rankwise CPU kernel: expected a CPU tensor"),
    }
}

//! Shared CPU kernels: the pieces the tuned CPU paths of several modules build on (the
//! convolution of `models::conv`, the score products of `retrieval`).

pub mod gemm;

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

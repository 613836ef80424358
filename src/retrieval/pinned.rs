//! Score chunks computed on a CUDA device, copied into page-locked host memory that is reused
//! from chunk to chunk.
//!
//! **Why.** At SOP scale the evaluation copies every score to the host for ranking: 60,502²
//! `f32` values, 14.6 GB in 119 chunks of 512 queries. candle's copy (`Tensor::to_device`) lands
//! each chunk in a fresh `Vec`: pageable memory, which the driver copies through a staging
//! buffer of its own, and 123 MB of new pages that the kernel faults in and zeroes on first
//! touch, once per chunk. Here each chunk is copied by DMA straight into a page-locked buffer
//! (allocated once, as a few chunks circulate between the thread that computes them and the one
//! that ranks them, `super::for_each_chunk`), and ranked from there. The buffer is ordinary
//! cached memory (not write-combined, cudarc's `alloc_pinned` default, whose reads by the CPU
//! are uncached: the ranking reads every score).
//!
//! **Switch.** On unless `RANKWISE_PINNED_COPIES` is `0`, `off` or `false` (or [`set_enabled`]
//! said otherwise): the chunks then take candle's copy, for a side-by-side measurement or as a
//! fallback. The GPU check times both (`gpu_check`, the evaluation's "scores only" entries) and
//! its metrics check compares the device's evaluation with the CPU's.

static SWITCH: crate::switch::EnvSwitch = crate::switch::EnvSwitch::new("RANKWISE_PINNED_COPIES");

/// Whether device score chunks are copied into reused page-locked buffers.
pub fn enabled() -> bool {
    SWITCH.on()
}

/// Turns the page-locked copies on or off for the whole process (the GPU check times both).
pub fn set_enabled(on: bool) {
    SWITCH.set(on);
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::PinnedScores;

#[cfg(feature = "cuda")]
mod cuda {
    use crate::error::{Error, Result};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::PinnedHostSlice;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Storage, Tensor};

    /// A page-locked host buffer and how many of its values the last copy wrote.
    #[derive(Default)]
    pub(crate) struct PinnedScores {
        buffer: Option<PinnedHostSlice<f32>>,
        len: usize,
    }

    impl PinnedScores {
        /// Whether the last chunk is here (and not in the chunk's other buffers).
        pub(crate) fn holds(&self) -> bool {
            self.len > 0
        }

        /// Forgets the last chunk (the buffer stays for the next).
        pub(crate) fn clear(&mut self) {
            self.len = 0;
        }

        /// The values of the last copy.
        pub(crate) fn values(&self) -> Result<&[f32]> {
            match &self.buffer {
                Some(b) => Ok(&b.as_slice().w()?[..self.len]),
                None => Ok(&[]),
            }
        }

        /// Copies the contiguous `f32` CUDA tensor `scores` here, growing the buffer when it is
        /// smaller; returns when the values are on the host.
        pub(crate) fn copy_from(&mut self, scores: &Tensor) -> Result<()> {
            let (storage, layout) = scores.storage_and_layout();
            let (Storage::Cuda(cuda), Some((start, end))) =
                (&*storage, layout.contiguous_offsets())
            else {
                return Err(Error::invalid(
                    "scores",
                    "a page-locked copy takes a contiguous tensor on a CUDA device",
                ));
            };
            let n = end - start;
            self.len = 0;
            let stream = cuda.device().cuda_stream();
            if self.buffer.as_ref().is_none_or(|b| b.len() < n) {
                self.buffer = None; // freed before its successor is allocated
                                    // SAFETY: cuMemHostAlloc with no flag (cached, not write-combined); the memory
                                    // is zeroed below, before any reference to it is made.
                let mut b = unsafe { stream.context().alloc_pinned_with_flags::<f32>(n, 0) }.w()?;
                // SAFETY: `n` values were just allocated at this pointer; nothing reads them yet.
                unsafe { std::ptr::write_bytes(b.as_mut_ptr().w()?, 0, n) };
                self.buffer = Some(b);
            }
            let Some(buffer) = self.buffer.as_mut() else {
                unreachable!("allocated above")
            };
            let src = cuda.as_cuda_slice::<f32>()?.slice(start..end);
            let dst = &mut buffer.as_mut_slice().w()?[..n];
            // The copy is asynchronous into page-locked memory: wait for it before reading.
            stream.memcpy_dtoh(&src, dst).w()?;
            stream.synchronize().w()?;
            self.len = n;
            Ok(())
        }
    }
}

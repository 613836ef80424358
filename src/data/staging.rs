//! A loader's batches bound for a CUDA device, assembled in page-locked host memory and copied
//! to the device asynchronously by the loader's own thread.
//!
//! **Why.** A ResNet-50 batch of 256 images at 224 × 224 is 154 MB of `f32`. The trainer moved
//! each batch to the device on its own thread (`Tensor::to_device`): from pageable memory, which
//! the driver copies through a staging buffer of its own, so the call returned only once the
//! stream had drained the previous step's work and the whole copy had passed through that
//! buffer — every step, the host waited and the device copied at pageable speed before the
//! forward pass could be launched. Here the loader's worker thread writes the batch straight
//! into a page-locked buffer (where it assembled it in a `Vec` before) and queues the copy on
//! candle's stream: a DMA at the bus's full speed, queued behind the step in flight, which no
//! thread waits for. The tensor reaches the trainer already on the device, ordered on the
//! stream before any kernel that reads it (PyTorch's `pin_memory=True` with
//! `non_blocking=True`): [`crate::device::open_cuda`] opens the device on one stream that
//! every thread queues on (on candle's per-thread default streams, the worker's copy would not
//! be ordered with the trainer's kernels at all, so on a device opened that way the loader
//! leaves the copy to the consumer's thread: [`crate::device::shared_stream`]).
//!
//! A buffer is written again only after its copy is done: each copy records an event, and a
//! buffer's next batch waits for it. The buffers circulate in order, one more than the
//! batches that can be ahead of the trainer plus the one in copy, so the wait is normally
//! over before it starts; at most that many are allocated (write-combined, as the CPU only
//! writes them), each grown to the largest batch.
//!
//! **Switch.** On unless `RANKWISE_PINNED_UPLOADS` is `0`, `off` or `false` (or
//! [`set_enabled`] said otherwise): the batches are then assembled in a `Vec` and copied by
//! candle from pageable memory, on the worker thread too. The GPU check times training through
//! the image pipeline both ways and compares the uploaded batches with the CPU's.

use crate::error::Result;
use candle_core::{Device, Shape, Tensor};

static SWITCH: crate::switch::EnvSwitch = crate::switch::EnvSwitch::new("RANKWISE_PINNED_UPLOADS");

/// Whether loaders bound for a CUDA device assemble their batches in page-locked memory.
pub fn enabled() -> bool {
    SWITCH.on()
}

/// Turns the page-locked uploads on or off for the whole process (the GPU check times both).
pub fn set_enabled(on: bool) {
    SWITCH.set(on);
}

/// Where a loader assembles its batches: a `Vec` (the CPU, or the switch off) or, bound for a
/// CUDA device, a ring of page-locked buffers.
#[derive(Default)]
pub struct Staging {
    #[cfg(feature = "cuda")]
    ring: Option<cuda::Ring>,
}

impl Staging {
    /// Staging for batches bound for `device`, `ahead` of them at most in the loader's channel
    /// (its prefetch depth): page-locked on a CUDA device with the switch on, a `Vec`
    /// otherwise.
    pub fn for_device(device: &Device, ahead: usize) -> Result<Staging> {
        #[cfg(feature = "cuda")]
        if enabled() {
            if let Device::Cuda(dev) = device {
                // The batches in the channel, the one the trainer holds, the one in copy.
                return Ok(Staging {
                    ring: Some(cuda::Ring::new(dev.clone(), ahead + 2)),
                });
            }
        }
        let _ = (device, ahead);
        Ok(Staging::default())
    }

    /// The `f32` tensor of `shape` on `device` whose values are `parts` concatenated (their
    /// lengths add up to the shape's size).
    pub fn tensor<'a>(
        &mut self,
        parts: impl IntoIterator<Item = &'a [f32]>,
        shape: impl Into<Shape>,
        device: &Device,
    ) -> Result<Tensor> {
        let shape: Shape = shape.into();
        #[cfg(feature = "cuda")]
        if let (Some(ring), Device::Cuda(_)) = (self.ring.as_mut(), device) {
            return ring.tensor(parts, shape, device);
        }
        let mut data = Vec::with_capacity(shape.elem_count());
        for p in parts {
            data.extend_from_slice(p);
        }
        Ok(Tensor::from_vec(data, shape, device)?)
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use crate::error::{Error, Result};
    use candle_core::cuda_backend::cudarc::driver::{CudaEvent, PinnedHostSlice};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{Device, Shape, Tensor};
    use std::collections::VecDeque;

    /// A page-locked buffer and the event recorded after its last copy was queued.
    struct Slot {
        buffer: PinnedHostSlice<f32>,
        copied: Option<CudaEvent>,
    }

    impl Slot {
        /// Waits until the last copy out of the buffer is done.
        fn wait(&mut self) -> Result<()> {
            if let Some(e) = self.copied.take() {
                e.synchronize().w()?;
            }
            Ok(())
        }
    }

    impl Drop for Slot {
        /// The buffer is freed only after its copy is done (the DMA reads it until then).
        fn drop(&mut self) {
            let _ = self.wait();
        }
    }

    /// Up to `depth` buffers, reused oldest first.
    pub(super) struct Ring {
        dev: CudaDevice,
        depth: usize,
        slots: VecDeque<Slot>,
    }

    impl Ring {
        pub(super) fn new(dev: CudaDevice, depth: usize) -> Ring {
            Ring {
                dev,
                depth: depth.max(1),
                slots: VecDeque::new(),
            }
        }

        /// A buffer of at least `n` values whose last copy is done.
        fn take(&mut self, n: usize) -> Result<Slot> {
            let reuse = self.slots.len() >= self.depth;
            let mut slot = match reuse.then(|| self.slots.pop_front()).flatten() {
                Some(mut slot) => {
                    slot.wait()?;
                    slot
                }
                None => Slot {
                    buffer: self.alloc(n)?,
                    copied: None,
                },
            };
            if slot.buffer.len() < n {
                slot.buffer = self.alloc(n)?;
            }
            Ok(slot)
        }

        fn alloc(&self, n: usize) -> Result<PinnedHostSlice<f32>> {
            let ctx = self.dev.cuda_stream().context().clone();
            // SAFETY: the values are written before a copy reads them (`tensor` writes the
            // first `n` of them and copies only those).
            Ok(unsafe { ctx.alloc_pinned::<f32>(n) }.w()?)
        }

        pub(super) fn tensor<'a>(
            &mut self,
            parts: impl IntoIterator<Item = &'a [f32]>,
            shape: Shape,
            device: &Device,
        ) -> Result<Tensor> {
            let n = shape.elem_count();
            let mut slot = self.take(n)?;
            let values = &mut slot.buffer.as_mut_slice().w()?[..n];
            let mut at = 0;
            for p in parts {
                let end = at + p.len();
                if end > n {
                    return Err(Error::invalid(
                        "batch",
                        format!("more values than its shape {shape:?} holds"),
                    ));
                }
                values[at..end].copy_from_slice(p);
                at = end;
            }
            if at != n {
                return Err(Error::invalid(
                    "batch",
                    format!("{at} values for a shape {shape:?} of {n}"),
                ));
            }
            // From page-locked memory the copy is a DMA queued on candle's stream: the call
            // returns at once, and the event says when the buffer may be written again.
            let t = Tensor::from_slice(&values[..], shape, device)?;
            slot.copied = Some(self.dev.cuda_stream().record_event(None).w()?);
            self.slots.push_back(slot);
            Ok(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_the_cpu_the_parts_are_concatenated_in_order() {
        let mut staging = Staging::for_device(&Device::Cpu, 2).unwrap();
        let t = staging
            .tensor(
                [&[1.0f32, 2.0][..], &[3.0], &[4.0, 5.0, 6.0]],
                (2, 3),
                &Device::Cpu,
            )
            .unwrap();
        assert_eq!(
            t.to_vec2::<f32>().unwrap(),
            vec![vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0]]
        );
        let e = staging.tensor([&[1.0f32][..]], (2, 1), &Device::Cpu);
        assert!(e.is_err());
    }
}

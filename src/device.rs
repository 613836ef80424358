//! Opening a CUDA device: one stream for every thread of the process.
//!
//! **Why.** candle's `Device::new_cuda` queues its work on `CU_STREAM_PER_THREAD`, a handle that
//! names *the calling thread's* default stream, and the default streams of two threads are not
//! ordered with each other. The library queues device work from more than one thread: a
//! loader's worker copies each training batch to the device (`data::staging`), and an
//! evaluation computes its next chunk of scores on a thread of its own (`retrieval`). With
//! per-thread streams the trainer's forward pass could read a batch whose copy had not landed,
//! a chunk's product could read embeddings that the main thread's stream was still writing, and
//! the two threads' matrix products would share one cuBLAS handle and its workspace at the same
//! time. Here the device is opened on one stream that every thread queues on
//! (`Device::new_cuda_with_stream`): the order in which the threads queue their work is the
//! order the GPU runs it, and a tensor handed from one thread to another is ready for every
//! operation the receiver queues. PyTorch orders its work the same way, on one current stream.
//!
//! With one stream, cudarc's per-buffer events (two created with every allocation, and
//! recorded and waited on around every launch once a context owns a stream of its own) guard
//! nothing, so they are turned off: every candle operation is then an allocation and a launch,
//! no event calls.

use crate::error::{Error, Result};
use candle_core::Device;

/// CUDA device `ordinal`, its work queued on one stream shared by every thread (see the module
/// documentation). An error naming the device in a build without the `cuda` feature or when
/// the device cannot be opened.
pub fn open_cuda(ordinal: usize) -> Result<Device> {
    #[cfg(feature = "cuda")]
    {
        let device = Device::new_cuda_with_stream(ordinal).map_err(|e| {
            Error::invalid("device", format!("cannot use CUDA device {ordinal}: {e}"))
        })?;
        if let Device::Cuda(dev) = &device {
            // SAFETY: cudarc's events order a buffer's uses across streams; every operation on
            // this device is queued on its one stream, whose order alone orders them.
            unsafe { dev.disable_event_tracking() };
        }
        Ok(device)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(Error::invalid(
            "device",
            format!(
                "cannot use CUDA device {ordinal}: this build has no CUDA support; rebuild with \
                 `--features cuda`"
            ),
        ))
    }
}

/// CUDA device `ordinal` ([`open_cuda`]) in a build with the `cuda` feature and a usable GPU,
/// the CPU otherwise.
pub fn cuda_if_available(ordinal: usize) -> Result<Device> {
    if cfg!(feature = "cuda") {
        if let Ok(device) = open_cuda(ordinal) {
            return Ok(device);
        }
    }
    Ok(Device::Cpu)
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn without_the_feature_cuda_is_an_error_naming_the_device_and_auto_is_the_cpu() {
        let err = open_cuda(1).unwrap_err().to_string();
        assert!(
            err.contains("CUDA device 1") && err.contains("--features cuda"),
            "{err}"
        );
        assert!(cuda_if_available(0).unwrap().is_cpu());
    }
}

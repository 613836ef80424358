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
//!
//! **The memory pool.** Every candle operation allocates its output from the device's
//! stream-ordered pool (`cuMemAllocAsync`). CUDA's default release threshold for that pool is 0:
//! at every synchronisation — each training step reads its loss value, each evaluation chunk
//! its results — the pool hands all its freed memory back to the driver, and the next step maps
//! it again, allocation by allocation (for ResNet-50 at batch 256, gigabytes per step). The
//! device's pool is set to keep what it holds (threshold `u64::MAX`), as PyTorch's caching
//! allocator does and as RMM's and CCCL's pools default to; the memory stays with the process,
//! reused by the next step. `RANKWISE_POOL_RETAIN=0` keeps CUDA's default, and
//! [`set_pool_retention`] switches it for a side-by-side measurement (the GPU check's training
//! entries).

use crate::error::{Error, Result};
use crate::switch::EnvSwitch;
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::cudarc::driver::{
    result, sys::CUmemPool_attribute as PoolAttribute, sys::CUmemoryPool,
};
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::WrapErr;
use candle_core::Device;

static RETAIN: EnvSwitch = EnvSwitch::new("RANKWISE_POOL_RETAIN");

/// Whether [`open_cuda`] sets the device's memory pool to keep its freed memory across
/// synchronisations: on unless `RANKWISE_POOL_RETAIN` is `0`, `off` or `false`.
pub fn pool_retention() -> bool {
    RETAIN.on()
}

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
        // A performance setting: a device whose pool cannot take it still computes the same.
        if pool_retention() {
            if let Err(e) = set_pool_retention(&device, true) {
                eprintln!(
                    "rankwise: CUDA device {ordinal}: the memory pool keeps CUDA's default release \
                     threshold (setting it failed: {e}); RANKWISE_POOL_RETAIN=0 skips the attempt"
                );
            }
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

/// `CU_STREAM_PER_THREAD` of `cuda.h`: the handle candle's `Device::new_cuda` queues on, which
/// names the calling thread's own default stream.
#[cfg(feature = "cuda")]
const CU_STREAM_PER_THREAD: usize = 0x2;

/// Whether work that one thread queues on `device` is ordered with the work other threads
/// queue there: the CPU, and a CUDA device on one stream ([`open_cuda`]); not a device that
/// candle's `Device::new_cuda` opened on per-thread default streams. The library hands device
/// work from one thread to another (a loader's uploads, an evaluation's next chunk) only where
/// this holds; elsewhere that work stays on the thread that uses it.
pub fn shared_stream(device: &Device) -> bool {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        return dev.cuda_stream().cu_stream() as usize != CU_STREAM_PER_THREAD;
    }
    let _ = device;
    true
}

/// Sets the release threshold of `device`'s current memory pool: with `retain`, `u64::MAX` (its
/// freed memory stays in the pool across synchronisations); without, CUDA's default 0 (handed
/// back at every synchronisation). Nothing to do on the CPU, or on a device that allocates
/// without a pool.
pub fn set_pool_retention(device: &Device, retain: bool) -> Result<()> {
    #[cfg(feature = "cuda")]
    pool_attribute(
        device,
        PoolAttribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        Some(if retain { u64::MAX } else { 0 }),
    )?;
    let _ = (device, retain);
    Ok(())
}

/// Hands the freed memory that `device`'s pool keeps back to the driver, once its queued work is
/// done: between phases of different sizes (the GPU check's search for the largest batch that
/// fits must not find the memory held by a smaller one's freed tensors). Nothing to do on the
/// CPU.
pub fn release_pool(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Some(pool) = current_pool(device)? {
        // A free is complete only once the work queued before it is.
        device.synchronize()?;
        // SAFETY: the device's current pool.
        unsafe { result::mem_pool::trim_to(pool, 0) }.w()?;
    }
    let _ = device;
    Ok(())
}

/// The most memory `device`'s pool has had in use at once since [`reset_peak_memory`] (or since
/// it was opened), in bytes: every tensor candle allocated, as PyTorch's
/// `max_memory_allocated`; `None` on the CPU or a device that allocates without a pool.
pub fn peak_memory(device: &Device) -> Result<Option<u64>> {
    #[cfg(feature = "cuda")]
    return pool_attribute(device, PoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, None);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        Ok(None)
    }
}

/// Starts [`peak_memory`] again from the memory in use now.
pub fn reset_peak_memory(device: &Device) -> Result<()> {
    #[cfg(feature = "cuda")]
    pool_attribute(
        device,
        PoolAttribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        Some(0),
    )?;
    let _ = device;
    Ok(())
}

/// The current memory pool of `device`, its context bound to this thread; `None` on the CPU or
/// a device that allocates without a pool.
#[cfg(feature = "cuda")]
fn current_pool(device: &Device) -> Result<Option<CUmemoryPool>> {
    let Device::Cuda(dev) = device else {
        return Ok(None);
    };
    let ctx = dev.cuda_stream().context().clone();
    if !ctx.has_async_alloc() {
        return Ok(None);
    }
    ctx.bind_to_thread().w()?;
    // SAFETY: the context's own device.
    Ok(Some(
        unsafe { result::device::get_mem_pool(ctx.cu_device()) }.w()?,
    ))
}

/// Reads (`set: None`) or sets a `u64` attribute of the current pool of `device`; `None` when
/// it has no pool.
#[cfg(feature = "cuda")]
fn pool_attribute(
    device: &Device,
    attribute: PoolAttribute,
    set: Option<u64>,
) -> Result<Option<u64>> {
    let Some(pool) = current_pool(device)? else {
        return Ok(None);
    };
    let mut value: u64 = set.unwrap_or(0);
    let ptr = (&mut value as *mut u64).cast();
    // SAFETY: a live pool, and a u64 for the attributes asked (release threshold, peak use).
    match set {
        Some(_) => unsafe { result::mem_pool::set_attribute(pool, attribute, ptr) }.w()?,
        None => unsafe { result::mem_pool::get_attribute(pool, attribute, ptr) }.w()?,
    }
    Ok(Some(value))
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
        // On the CPU there is no pool to set, release or measure.
        set_pool_retention(&Device::Cpu, false).unwrap();
        release_pool(&Device::Cpu).unwrap();
        reset_peak_memory(&Device::Cpu).unwrap();
        assert_eq!(peak_memory(&Device::Cpu).unwrap(), None);
        // The CPU has no stream: work from any thread is ordered.
        assert!(shared_stream(&Device::Cpu));
    }
}

//! Allocator tuning for training on the CPU.
//!
//! candle allocates a fresh buffer for the output of every tensor operation and frees it when
//! the tensor is dropped. With glibc's default settings, buffers above the dynamic mmap
//! threshold (128 KiB at start, raised only when such a buffer is freed, at most 32 MiB) are
//! obtained with `mmap` and returned with `munmap`, and the top of the heap is trimmed back to
//! the kernel when more than 128 KiB is free: each training step then maps, page-faults
//! (zero-fills) and unmaps the same hundreds of megabytes of activations and gradients again.
//! [`tune_allocator`] sets the mmap threshold to glibc's maximum (32 MiB on 64-bit) and turns
//! off trimming, so freed buffers are reused from the heap, as `MALLOC_MMAP_THRESHOLD_` and
//! `MALLOC_TRIM_THRESHOLD_` would do from the environment. The measured effect is in
//! `benches/train_throughput_vs_torch.md`.
//!
//! The cost is memory: freed heap memory is kept by the process instead of being returned to
//! the kernel (the peak of a training step stays resident).

/// glibc's largest accepted mmap threshold on 64-bit targets (`HEAP_MAX_SIZE / 2`).
pub const MMAP_THRESHOLD_MAX: i32 = 32 * 1024 * 1024;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::os::raw::c_int;
    /// `M_TRIM_THRESHOLD` of `<malloc.h>`.
    pub const M_TRIM_THRESHOLD: c_int = -1;
    /// `M_MMAP_THRESHOLD` of `<malloc.h>`.
    pub const M_MMAP_THRESHOLD: c_int = -3;
    extern "C" {
        pub fn mallopt(param: c_int, value: c_int) -> c_int;
    }
}

/// Makes glibc keep freed tensor buffers for reuse instead of returning them to the kernel
/// (module documentation). Called at the start of `rankwise train` and `rankwise embed`, and of
/// the throughput example unless told not to. Does nothing (returns `false`) when the variable
/// `RANKWISE_NO_MALLOC_TUNING` is set, or on platforms other than Linux with glibc; returns
/// whether both settings were accepted.
pub fn tune_allocator() -> bool {
    if std::env::var_os("RANKWISE_NO_MALLOC_TUNING").is_some() {
        return false;
    }
    tune()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune() -> bool {
    // SAFETY: mallopt only changes allocator parameters; it is thread-safe in glibc (it takes
    // the arena locks) and both values are in their documented ranges.
    unsafe {
        let mmap = glibc::mallopt(glibc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX);
        let trim = glibc::mallopt(glibc::M_TRIM_THRESHOLD, i32::MAX);
        mmap == 1 && trim == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    fn tuning_is_accepted_on_glibc() {
        let ok = super::tune();
        assert_eq!(ok, cfg!(all(target_os = "linux", target_env = "gnu")));
    }
}

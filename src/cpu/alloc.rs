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
//!
//! glibc cannot keep buffers above 32 MiB: a ResNet's activations at 224 × 224 and batch 64
//! (64 × 64 × 112 × 112 values are 205 MB) are mapped, page-faulted and unmapped by every step
//! whatever the settings. [`LargeBlockCache`], a global allocator for programs that train
//! (`rankwise`, the throughput example), keeps those freed blocks and hands them back to the
//! next request of the same size and alignment — a training step asks for the same sizes every
//! time. It is enabled by [`tune_allocator`] as well, and is the system allocator otherwise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// glibc's largest accepted mmap threshold on 64-bit targets (`HEAP_MAX_SIZE / 2`).
pub const MMAP_THRESHOLD_MAX: i32 = 32 * 1024 * 1024;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::os::raw::c_int;
    /// `M_TRIM_THRESHOLD` of `<malloc.h>`.
    pub const M_TRIM_THRESHOLD: c_int = -1;
    /// `M_MMAP_THRESHOLD` of `<malloc.h>`.
    pub const M_MMAP_THRESHOLD: c_int = -3;
    /// `_SC_PAGESIZE` and `_SC_PHYS_PAGES` of glibc's `<unistd.h>` (`bits/confname.h`).
    pub const SC_PAGESIZE: c_int = 30;
    pub const SC_PHYS_PAGES: c_int = 85;
    extern "C" {
        pub fn mallopt(param: c_int, value: c_int) -> c_int;
        pub fn sysconf(name: c_int) -> std::os::raw::c_long;
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
    KEEP_LARGE_BLOCKS.store(true, Ordering::Relaxed);
    tune()
}

/// Freed blocks of at least this many bytes are kept by [`LargeBlockCache`]: glibc's largest mmap
/// threshold, above which it maps every buffer afresh (smaller ones it reuses itself once tuned).
pub const LARGE_BLOCK: usize = MMAP_THRESHOLD_MAX as usize;

/// How many freed blocks [`LargeBlockCache`] keeps at most. A ResNet-50 training step at
/// 224 × 224 and batch 64 has about 300 tensors of at least [`LARGE_BLOCK`] bytes alive or freed
/// between two uses of their size; the search over the slots is one comparison per slot, nothing
/// next to filling 32 MiB.
const SLOTS: usize = 1024;

/// Whether [`LargeBlockCache`] keeps freed blocks (set by [`tune_allocator`]).
static KEEP_LARGE_BLOCKS: AtomicBool = AtomicBool::new(false);

/// The freed blocks kept: `(address, size, alignment)`.
struct Kept {
    blocks: [(usize, usize, usize); SLOTS],
    len: usize,
    bytes: usize,
    /// The most bytes kept: a quarter of the machine's memory, read once.
    limit: usize,
}

// A std mutex: futex-based on Linux, it never allocates, so it can guard an allocator's state.
static KEPT: Mutex<Kept> = Mutex::new(Kept {
    blocks: [(0, 0, 0); SLOTS],
    len: 0,
    bytes: 0,
    limit: 0,
});

/// A global allocator that keeps freed blocks of at least [`LARGE_BLOCK`] bytes (up to 1,024
/// blocks and a quarter of the machine's memory) and reuses them for requests of exactly the
/// same size and alignment; everything else goes to the system allocator. Enabled by
/// [`tune_allocator`]; until then it is the system allocator.
///
/// Declared by the programs that train (a library cannot choose the allocator of the program
/// that uses it):
/// ```
/// #[global_allocator]
/// static ALLOCATOR: rankwise::cpu::alloc::LargeBlockCache = rankwise::cpu::alloc::LargeBlockCache;
/// ```
/// The blocks kept stay resident while free (at most the limit above): that is the cost of not
/// page-faulting them in again at every step.
#[derive(Debug, Default, Clone, Copy)]
pub struct LargeBlockCache;

impl LargeBlockCache {
    /// A kept block of exactly `layout`, if any.
    fn take(layout: Layout) -> Option<*mut u8> {
        let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        let len = kept.len;
        let i = kept.blocks[..len]
            .iter()
            .position(|&(_, size, align)| size == layout.size() && align == layout.align())?;
        let (address, size, _) = kept.blocks[i];
        kept.blocks[i] = kept.blocks[len - 1];
        kept.len -= 1;
        kept.bytes -= size;
        Some(address as *mut u8)
    }

    /// Keeps the freed block `ptr` of `layout` if enabled and within the limits.
    fn keep(ptr: *mut u8, layout: Layout) -> bool {
        if !KEEP_LARGE_BLOCKS.load(Ordering::Relaxed) {
            return false;
        }
        let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        if kept.limit == 0 {
            kept.limit = physical_memory() / 4;
        }
        if kept.len == SLOTS || kept.bytes + layout.size() > kept.limit {
            return false;
        }
        let len = kept.len;
        kept.blocks[len] = (ptr as usize, layout.size(), layout.align());
        kept.len += 1;
        kept.bytes += layout.size();
        true
    }
}

// SAFETY: every block handed out is either the system allocator's answer for this very layout or
// a block the system allocator gave for an identical layout, freed by its owner and not handed
// out since (it leaves the list under the lock before it is returned).
unsafe impl GlobalAlloc for LargeBlockCache {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE_BLOCK {
            if let Some(ptr) = Self::take(layout) {
                return ptr;
            }
        }
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() >= LARGE_BLOCK {
            if let Some(ptr) = Self::take(layout) {
                // A fresh mapping comes zeroed from the kernel; a kept block must be cleared.
                std::ptr::write_bytes(ptr, 0, layout.size());
                return ptr;
            }
        }
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if layout.size() >= LARGE_BLOCK && Self::keep(ptr, layout) {
            return;
        }
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.size() < LARGE_BLOCK && new_size < LARGE_BLOCK {
            return System.realloc(ptr, layout, new_size);
        }
        // Through `alloc` and `dealloc`, so that a block is only ever kept with the layout it
        // was allocated with.
        let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
        let new = self.alloc(new_layout);
        if !new.is_null() {
            std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        new
    }
}

/// The machine's memory in bytes (`sysconf`), or 4 GiB where it cannot be read.
fn physical_memory() -> usize {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: sysconf only reads system parameters.
        let (pages, size) = unsafe {
            (
                glibc::sysconf(glibc::SC_PHYS_PAGES),
                glibc::sysconf(glibc::SC_PAGESIZE),
            )
        };
        if pages > 0 && size > 0 {
            return (pages as usize).saturating_mul(size as usize);
        }
    }
    4 << 30
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
    use super::*;

    /// A kept block is handed back for the same layout only, cleared when asked zeroed, and a
    /// reallocation across the threshold keeps the contents. Sizes unique to this test: the
    /// list is process-wide (this test binary does not use the cache as its allocator).
    #[test]
    fn large_blocks_are_reused_for_the_same_layout_only() {
        KEEP_LARGE_BLOCKS.store(true, Ordering::Relaxed);
        let cache = LargeBlockCache;
        let layout = Layout::from_size_align(LARGE_BLOCK + 4096 * 7, 64).unwrap();
        let other = Layout::from_size_align(LARGE_BLOCK + 4096 * 9, 64).unwrap();
        unsafe {
            let a = cache.alloc(layout);
            assert!(!a.is_null());
            a.write_bytes(0xAB, layout.size());
            cache.dealloc(a, layout);
            let b = cache.alloc(other);
            assert_ne!(a, b, "another size is not served from the kept block");
            let c = cache.alloc_zeroed(layout);
            assert_eq!(c, a, "the same layout gets the kept block back");
            let values = std::slice::from_raw_parts(c, layout.size());
            assert!(values.iter().all(|&v| v == 0), "cleared when asked zeroed");
            // Small → large → small keeps the contents.
            let small = Layout::from_size_align(1000, 8).unwrap();
            let s = cache.alloc(small);
            s.write_bytes(7, 1000);
            let grown = cache.realloc(s, small, LARGE_BLOCK + 4096 * 11);
            assert!(std::slice::from_raw_parts(grown, 1000)
                .iter()
                .all(|&v| v == 7));
            let grown_layout = Layout::from_size_align(LARGE_BLOCK + 4096 * 11, 8).unwrap();
            let shrunk = cache.realloc(grown, grown_layout, 500);
            assert!(std::slice::from_raw_parts(shrunk, 500)
                .iter()
                .all(|&v| v == 7));
            cache.dealloc(shrunk, Layout::from_size_align(500, 8).unwrap());
            cache.dealloc(b, other);
            cache.dealloc(c, layout);
        }
    }

    #[test]
    fn blocks_beyond_the_limit_go_back_to_the_system() {
        KEEP_LARGE_BLOCKS.store(true, Ordering::Relaxed);
        let limit = physical_memory() / 4;
        // Larger than the limit: never kept (the layout is not allocated, only offered).
        let huge = Layout::from_size_align(limit + 1, 8).unwrap();
        assert!(!LargeBlockCache::keep(std::ptr::null_mut(), huge));
    }

    #[test]
    fn tuning_is_accepted_on_glibc() {
        let ok = super::tune();
        assert_eq!(ok, cfg!(all(target_os = "linux", target_env = "gnu")));
    }
}

//! A fixed set of helper threads that wait for work by spinning for a short while before they
//! sleep, for [`crate::cpu::work_phases::run_phases`] called from outside the rayon pool.
//!
//! Why not rayon's own workers: with them as the helpers of a call made from outside the pool,
//! *both* workers of a 2-thread pool took CPU time (sampled over a second of the contrastive
//! step at B = 256: the caller 100%, the workers 55–61% and 32–35%), so three threads shared the
//! two cores. With one dedicated helper: the caller 100%, the helper 100%, rayon's workers 0%,
//! and the step took 0.55–0.69 ms against 0.78–0.96 ms in interleaved rounds (2-core VM,
//! `benches/losses_vs_torch.md`). Exactly `threads − 1` helpers take part, and a helper that
//! finished a job keeps looking for the next one for [`SPIN_WINDOW`] before it parks, so the
//! backward pass that follows a forward pass (tens to hundreds of µs later) finds it awake, as
//! an OpenMP runtime's threads would be.
//!
//! One job runs at a time: a call made while the helpers are busy (another thread's loss, or a
//! call from inside a job) is refused, and the caller takes the rayon path instead.

use crossbeam_utils::CachePadded;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a helper keeps spinning for the next job after it finished one (or woke up)
/// before it parks. Long enough to span the gap between the forward and the backward pass of a
/// loss step at B = 256 (the candle ops between them), short enough that an idle helper gives
/// its core back within a fraction of a millisecond. (Parking at once instead: contrastive
/// B = 256 0.59 against 0.55 ms per step, 2 × 2000 steps each, alternating.)
const SPIN_WINDOW: Duration = Duration::from_micros(300);

/// Set in [`Shared::state`] while no job is open: a helper that arrives then must not start.
const CLOSED: usize = 1 << (usize::BITS - 1);

/// A job: the work every participating thread runs (it claims its share itself).
type Job<'a> = &'a (dyn Fn() + Sync);

/// What the caller and the helpers share. The counters that threads spin on or update while
/// others spin each have a cache line of their own.
struct Shared {
    /// Bumped when a job is posted; a helper waits for it to change.
    generation: CachePadded<AtomicU64>,
    /// Points at the caller's [`Job`] while a job is open.
    job: AtomicPtr<Job<'static>>,
    /// The helpers that entered the open job, or [`CLOSED`] (plus stray counts) between jobs.
    state: CachePadded<AtomicUsize>,
    /// The helpers that entered the job and have finished it.
    exited: CachePadded<AtomicUsize>,
    /// How many helpers (the first ones by index) the open job asks for.
    wanted: AtomicUsize,
    /// The first panic of a helper in the open job, re-raised by the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// The helper threads of the process.
pub(crate) struct HelperThreads {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    /// Held by the caller of the job that runs.
    busy: AtomicBool,
}

/// The process's helpers: `rayon::current_num_threads() − 1` of them (the global pool's size,
/// so `RAYON_NUM_THREADS` applies), started on first use; `None` when that is zero or a thread
/// could not be started.
pub(crate) fn helpers() -> Option<&'static HelperThreads> {
    static POOL: OnceLock<Option<HelperThreads>> = OnceLock::new();
    POOL.get_or_init(|| HelperThreads::start(rayon::current_num_threads().saturating_sub(1)))
        .as_ref()
}

impl HelperThreads {
    /// Starts `n` helpers; `None` when `n = 0` or a thread cannot be spawned.
    fn start(n: usize) -> Option<Self> {
        if n == 0 {
            return None;
        }
        let shared = Arc::new(Shared {
            generation: CachePadded::new(AtomicU64::new(0)),
            job: AtomicPtr::new(std::ptr::null_mut()),
            state: CachePadded::new(AtomicUsize::new(CLOSED)),
            exited: CachePadded::new(AtomicUsize::new(0)),
            wanted: AtomicUsize::new(0),
            panic: Mutex::new(None),
        });
        let mut threads = Vec::with_capacity(n);
        for index in 0..n {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("rankwise-helper-{index}"))
                .spawn(move || helper_loop(&shared, index))
                .ok()?;
            threads.push(handle.thread().clone());
        }
        Some(HelperThreads {
            shared,
            threads,
            busy: AtomicBool::new(false),
        })
    }

    /// Runs `job` on the calling thread and on up to `wanted` helpers at once, returning when
    /// the caller's run and every helper run that started have finished; a panic in any of them
    /// is re-raised here. Helpers that wake after the caller finished do not start it, so `job`
    /// must let the caller alone complete the work (as `run_phases`'s claimed chunks do).
    /// Returns `false` without running `job` when the helpers are busy with another job.
    pub fn try_run(&self, wanted: usize, job: &(dyn Fn() + Sync)) -> bool {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let shared = &*self.shared;
        let wanted = wanted.min(self.threads.len());
        let slot: Job<'_> = job;
        // SAFETY (lifetime erasure): the pointer is read only by helpers that entered the job
        // (`state` without CLOSED), and `Close` below waits for all of them before this frame,
        // and with it `slot` and `job`, goes away — also when the caller's run panics.
        let slot_ptr = &slot as *const Job<'_> as *mut Job<'static>;
        shared.job.store(slot_ptr, Ordering::Relaxed);
        shared.exited.store(0, Ordering::Relaxed);
        shared.wanted.store(wanted, Ordering::Relaxed);
        // Release: a helper that sees the job open (Acquire on `state`) sees the pointer.
        shared.state.store(0, Ordering::Release);
        shared.generation.fetch_add(1, Ordering::Release);
        for t in &self.threads[..wanted] {
            t.unpark();
        }
        let close = Close(self);
        job();
        drop(close);
        let panic = shared.panic.lock().map(|mut p| p.take()).unwrap_or(None);
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
        true
    }
}

/// Closes the open job when dropped (after the caller's run, or while it unwinds): no helper
/// starts it from then on, and the drop waits for those that did.
struct Close<'a>(&'a HelperThreads);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        let shared = &*self.0.shared;
        let entered = shared.state.fetch_or(CLOSED, Ordering::AcqRel) & !CLOSED;
        // Acquire: pairs with each helper's Release of `exited`, so what the helpers wrote is
        // visible to the caller afterwards.
        while shared.exited.load(Ordering::Acquire) < entered {
            std::hint::spin_loop();
        }
        shared.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.0.busy.store(false, Ordering::Release);
    }
}

/// A helper: wait for a new generation (spinning for [`SPIN_WINDOW`], then parked), enter the
/// job if it is still open and asks for this helper, run it, count itself out.
fn helper_loop(shared: &Shared, index: usize) {
    SLOT.with(|s| s.set(index + 1));
    let mut seen = shared.generation.load(Ordering::Acquire);
    loop {
        seen = wait_for_next(shared, seen);
        if index >= shared.wanted.load(Ordering::Relaxed) {
            continue;
        }
        // Acquire: pairs with the caller's Release store that opened the job.
        let before = shared.state.fetch_add(1, Ordering::Acquire);
        if before & CLOSED != 0 {
            continue; // the job ended before this helper woke; the count is reset on the next
        }
        // SAFETY: the job is open and counts this helper as entered, so the caller's frame that
        // holds the job stays alive until `exited` is incremented below.
        let job: Job<'_> = unsafe { *shared.job.load(Ordering::Relaxed) };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        if let Err(payload) = outcome {
            if let Ok(mut p) = shared.panic.lock() {
                p.get_or_insert(payload);
            }
        }
        shared.exited.fetch_add(1, Ordering::Release);
    }
}

thread_local! {
    /// This thread's slot in a job: helper `i` is `i + 1`, any other thread 0.
    static SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The calling thread's slot in a job: `i + 1` on helper `i`, 0 on any other thread (the
/// caller), so that [`crate::cpu::work_phases`] gives each thread the same share of every call.
pub(crate) fn current_slot() -> usize {
    SLOT.with(|s| s.get())
}

/// Returns the generation once it differs from `seen`: spins for [`SPIN_WINDOW`], then parks
/// (the caller unparks the helpers it wants after bumping the generation, so no wake-up is
/// lost; a spurious wake-up only loops).
fn wait_for_next(shared: &Shared, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let g = shared.generation.load(Ordering::Acquire);
        if g != seen {
            return g;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) && start.elapsed() >= SPIN_WINDOW {
            break;
        }
        std::hint::spin_loop();
    }
    loop {
        let g = shared.generation.load(Ordering::Acquire);
        if g != seen {
            return g;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_helper_that_starts_finishes_before_the_call_returns() {
        let pool = HelperThreads::start(3).unwrap();
        for _ in 0..200 {
            let runs = AtomicUsize::new(0);
            let job = || {
                runs.fetch_add(1, Ordering::Relaxed);
            };
            assert!(pool.try_run(3, &job));
            let n = runs.load(Ordering::Relaxed);
            assert!((1..=4).contains(&n), "{n} runs");
            // Nothing runs the job after the call returned.
            std::thread::sleep(Duration::from_micros(50));
            assert_eq!(runs.load(Ordering::Relaxed), n);
        }
    }

    #[test]
    fn helpers_share_the_work_when_awake() {
        let pool = HelperThreads::start(1).unwrap();
        let mut with_helper = 0;
        for _ in 0..50 {
            let threads = Mutex::new(std::collections::HashSet::new());
            let job = || {
                threads.lock().unwrap().insert(std::thread::current().id());
                // Long enough for a spinning or woken helper to arrive.
                std::thread::sleep(Duration::from_millis(5));
            };
            assert!(pool.try_run(1, &job));
            with_helper += (threads.into_inner().unwrap().len() == 2) as usize;
        }
        assert!(
            with_helper > 10,
            "the helper joined {with_helper} of 50 jobs"
        );
    }

    #[test]
    fn a_busy_pool_refuses_and_a_helper_panic_is_reraised() {
        let pool = HelperThreads::start(1).unwrap();
        let inner = AtomicBool::new(true);
        let job = || {
            if pool.try_run(1, &|| {}) {
                inner.store(false, Ordering::Relaxed);
            }
        };
        assert!(pool.try_run(1, &job));
        assert!(
            inner.load(Ordering::Relaxed),
            "a nested call must be refused"
        );
        let caller = std::thread::current().id();
        let boom = || {
            if std::thread::current().id() != caller {
                panic!("helper fails");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut reraised = false;
        for _ in 0..20 {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.try_run(1, &boom)));
            reraised |= r.is_err();
        }
        assert!(reraised, "the helper's panic never reached the caller");
        // The pool still works afterwards.
        assert!(pool.try_run(1, &|| {}));
    }
}

//! A sequence of parallel loops ("phases") run with a single hand-off to the thread pool.
//!
//! Why: every rayon parallel loop started from a thread outside the pool pays a round trip —
//! the job is injected, a worker that went to sleep is woken, and the caller blocks until it is
//! woken in turn. Measured on the 2-core VM (`benches/losses_vs_torch.md`, 2026-11-25): a
//! parallel sum costs 37 µs back to back but 62–102 µs after a gap of 0.1–1 ms, against 51 µs
//! serially; a loss step made of five such loops separated by serial work pays that cost five
//! times, and in the VM's slow minutes runs no faster on two threads than on one.
//!
//! [`run_phases`] runs all the loops of a step in one go: the calling thread starts on the first
//! phase at once, and `n − 1` other threads join in when they wake: the process's dedicated
//! helpers ([`crate::cpu::helper_threads`]) for a caller outside the rayon pool, else workers of
//! the current pool. Chunks of work are *claimed* rather than assigned: each thread has a slot (the
//! caller 0, helper `i` `i + 1`) that owns the same runs of chunks in every phase ([`owned_runs`])
//! and claims those first, then takes chunks from the back of the other slots' runs; so a thread
//! that wakes late (or never) only means the others claim more, and no thread ever waits for work
//! that nobody has started. Between two phases a thread waits (spinning) only for chunks another
//! thread has claimed and is running, which is what makes the phases ordered: everything phase `p`
//! wrote is visible to phase `p + 1`.
//!
//! [`DisjointChunks`] lets the chunks of a phase write their own parts of one buffer, and a
//! later phase read the whole of it.

use crate::cpu::helper_threads;
use crossbeam_utils::CachePadded;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// One parallel loop: `run(c)` for every chunk `c` in `0..chunks`, in any order, on any thread.
///
/// A chunk may use rayon itself (tested with `rayon::join` inside chunks); the engine's chunks
/// do not, since a thread blocked in a chunk waiting for rayon work holds up every thread that
/// reaches the end of the phase.
pub(crate) struct Phase<'a> {
    /// The number of chunks.
    pub chunks: usize,
    /// The work of one chunk.
    pub run: &'a (dyn Fn(usize) + Sync),
}

impl<'a> Phase<'a> {
    /// A phase of `chunks` chunks.
    pub fn new(chunks: usize, run: &'a (dyn Fn(usize) + Sync)) -> Self {
        Phase { chunks, run }
    }
}

/// Claim state of the phases, shared by the threads of one [`run_phases`] call. Each counter
/// has a cache line of its own: a thread spins on `done[p]` at a phase boundary, and any write
/// to a line it spins on (another counter, or a small allocation malloc put next to it) costs
/// the writer a transfer of the line.
struct Progress {
    /// The number of thread slots the chunks are shared out to.
    slots: usize,
    /// Per phase and run (`p · 2·slots + r`, [`run_of`]): the chunks of run `r` not yet
    /// claimed, `first | end << 32`; its owner claims from the front, others from the back.
    runs: Vec<CachePadded<AtomicU64>>,
    /// Per phase: the number of chunks finished (or abandoned by a panic).
    done: Vec<CachePadded<AtomicUsize>>,
    /// A chunk panicked: the other threads stop claiming, and the panic is re-raised by
    /// rayon's scope once every thread has returned.
    poisoned: CachePadded<AtomicBool>,
}

/// The unclaimed chunks `first..end` of a run as one word: `first | end << 32`.
fn pack(first: usize, end: usize) -> u64 {
    first as u64 | (end as u64) << 32
}

/// `(first, end)` of a word made by [`pack`].
fn unpack(v: u64) -> (usize, usize) {
    ((v & 0xffff_ffff) as usize, (v >> 32) as usize)
}

/// Run `r` of `chunks` chunks cut into `runs` consecutive runs, [`pack`]ed.
fn run_of(chunks: usize, runs: usize, r: usize) -> u64 {
    pack(chunks * r / runs, chunks * (r + 1) / runs)
}

/// The two runs (of `2·slots`) that slot `t` owns: the `t`-th from the start and the `t`-th
/// from the end.
///
/// Why runs that a slot owns, the same in every phase: a thread then mostly reads rows it wrote
/// itself in the previous phase (or pass), from its own cache rather than the other core's
/// (measured, contrastive B = 256 on the 2-core VM: 0.515 → 0.496 ms with one run per slot).
/// Why two mirrored runs: a phase over the upper triangle of `S` costs about `B − i` for row
/// `i`, its mirror copy about `i`, so the first and the last runs together cost the same as
/// the two middle ones in either phase, and with rows cut into as many chunks in every phase
/// each thread keeps its rows throughout; a thread that is done early takes chunks from the
/// back of another's runs.
fn owned_runs(slots: usize, t: usize) -> [usize; 2] {
    [t, 2 * slots - 1 - t]
}

impl Progress {
    /// Nothing claimed or finished yet, for phases of `chunks` chunks each shared out to
    /// `slots` slots.
    fn new(chunks: impl Iterator<Item = usize> + Clone, slots: usize) -> Self {
        let slots = slots.max(1);
        // A run's bounds are packed into 32 bits each.
        assert!(
            chunks.clone().all(|c| c <= u32::MAX as usize),
            "run_phases: too many chunks"
        );
        Progress {
            slots,
            runs: chunks
                .clone()
                .flat_map(|c| (0..2 * slots).map(move |r| run_of(c, 2 * slots, r)))
                .map(|s| CachePadded::new(AtomicU64::new(s)))
                .collect(),
            done: chunks
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            poisoned: CachePadded::new(AtomicBool::new(false)),
        }
    }

    /// Claims a chunk of phase `p` for the thread in `slot`: the next of its own runs, else
    /// the last unclaimed one of another slot's; `None` when every chunk is claimed.
    fn claim(&self, p: usize, slot: usize) -> Option<usize> {
        let n = self.slots;
        let runs = &self.runs[p * 2 * n..(p + 1) * 2 * n];
        let [first, second] = owned_runs(n, slot);
        take(&runs[first], true)
            .or_else(|| take(&runs[second], true))
            .or_else(|| {
                (1..n).find_map(|k| {
                    let [a, b] = owned_runs(n, (slot + k) % n);
                    take(&runs[b], false).or_else(|| take(&runs[a], false))
                })
            })
    }
}

/// Takes the first (`front`) or the last unclaimed chunk of a run, `None` when none is left.
fn take(run: &AtomicU64, front: bool) -> Option<usize> {
    let mut cur = run.load(Ordering::Relaxed);
    loop {
        let (first, end) = unpack(cur);
        if first >= end {
            return None;
        }
        let (next, chunk) = if front {
            (pack(first + 1, end), first)
        } else {
            (pack(first, end - 1), end - 1)
        };
        match run.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(chunk),
            Err(now) => cur = now,
        }
    }
}

/// Counts a chunk as finished when dropped, also while unwinding from a panic: a thread
/// waiting at the end of the phase must not wait forever for a chunk that will never end.
struct Finished<'a> {
    done: &'a AtomicUsize,
    poisoned: &'a AtomicBool,
}

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.poisoned.store(true, Ordering::Relaxed);
        }
        // Release: what the chunk wrote is visible to whoever sees the count.
        self.done.fetch_add(1, Ordering::Release);
    }
}

/// Spins before yielding the core while waiting at the end of a phase. The wait is for chunks
/// that are running (a few µs to a few ms); yielding after a while lets a thread that the
/// operating system has preempted get its core back on an oversubscribed machine.
const SPINS_BEFORE_YIELD: u32 = 1 << 12;

thread_local! {
    /// The [`run_phases`] calls (their `Progress` addresses) whose [`work`] loop is on this
    /// thread's stack.
    static ACTIVE: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Removes a call from [`ACTIVE`] when its loop returns (or unwinds).
struct Active(usize);

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            if let Some(i) = a.iter().rposition(|&p| p == self.0) {
                a.remove(i);
            }
        });
    }
}

/// The loop of one thread: every phase in turn, claiming chunks until none is left, then
/// waiting for the chunks other threads are still running.
///
/// A thread that waits for rayon work inside a chunk may pick up one of this call's own
/// helper jobs; that helper would then wait at the phase boundary for the chunk beneath it on
/// the same stack, forever. So a helper that finds its call already on its thread's stack
/// returns at once (the threads already in the call finish the work).
fn work(progress: &Progress, phases: &[Phase<'_>], slot: usize) {
    let slot = slot % progress.slots;
    let id = progress as *const Progress as usize;
    let nested = ACTIVE.with(|a| {
        let mut a = a.borrow_mut();
        let nested = a.contains(&id);
        if !nested {
            a.push(id);
        }
        nested
    });
    if nested {
        return;
    }
    let _active = Active(id);
    for (p, phase) in phases.iter().enumerate() {
        loop {
            if progress.poisoned.load(Ordering::Relaxed) {
                return;
            }
            let Some(c) = progress.claim(p, slot) else {
                break;
            };
            let _finished = Finished {
                done: &progress.done[p],
                poisoned: &progress.poisoned,
            };
            (phase.run)(c);
        }
        let mut spins = 0u32;
        // Acquire: pairs with the Release of `Finished`, so this thread sees every write of
        // phase `p` before it starts phase `p + 1`.
        while progress.done[p].load(Ordering::Acquire) < phase.chunks {
            if progress.poisoned.load(Ordering::Relaxed) {
                return;
            }
            spins += 1;
            if spins < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Runs the phases in order on the calling thread and up to `rayon::current_num_threads() − 1`
/// other threads — the dedicated helpers when the caller is outside the rayon pool and they are
/// free, else threads of the current pool — with one hand-off for the whole sequence.
/// Phase `p + 1` starts on a thread only when every chunk of phase `p` has finished, so it may
/// read everything phase `p` wrote. With one thread (or a single chunk in all) the phases run
/// on the calling thread without touching the pool. A panic in a chunk is re-raised here.
pub(crate) fn run_phases(phases: &[Phase<'_>]) {
    let most_chunks = phases.iter().map(|p| p.chunks).max().unwrap_or(0);
    let helpers = rayon::current_num_threads()
        .min(most_chunks)
        .saturating_sub(1);
    let progress = Progress::new(phases.iter().map(|p| p.chunks), helpers + 1);
    if helpers == 0 {
        work(&progress, phases, 0);
        return;
    }
    // The caller is slot 0 and helper `i` slot `i + 1`, in every call: the rows a thread
    // wrote in one phase (or pass) are mostly the ones it reads in the next, from its own
    // cache. Threads of the rayon pool all start at slot 0's runs.
    let job = || work(&progress, phases, helper_threads::current_slot());
    // From outside the rayon pool (the usual caller: a training loop or a notebook), the
    // dedicated helpers, which stay awake between the passes of a step; from a rayon worker, or
    // while the helpers run another call, the pool itself.
    if rayon::current_thread_index().is_none() {
        if let Some(pool) = helper_threads::helpers() {
            if pool.try_run(helpers, &job) {
                return;
            }
        }
    }
    // `in_place_scope` keeps the calling thread working (a plain `scope` would move the body
    // into the pool and block the caller), and waits for the helpers before returning, which
    // is what lets the phases borrow the caller's data.
    rayon::in_place_scope(|scope| {
        for _ in 0..helpers {
            scope.spawn(|_| job());
        }
        job();
    });
}

/// A buffer cut into consecutive chunks of `chunk_len` elements (the last may be shorter) that
/// the chunks of a [`run_phases`] phase write concurrently, chunk `c` to part `c` only.
pub(crate) struct DisjointChunks<'a, T> {
    cells: &'a [UnsafeCell<T>],
    chunk_len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: the buffer is only reached through `part_mut` and `whole`, whose contracts (one
// writer per part, no reads of a part while it is written) rule out data races; sending `T`
// between threads is what the writes do.
unsafe impl<T: Send> Sync for DisjointChunks<'_, T> {}

impl<'a, T> DisjointChunks<'a, T> {
    /// Borrows `buffer` exclusively for the lifetime of the wrapper.
    pub fn new(buffer: &'a mut [T], chunk_len: usize) -> Self {
        let len = buffer.len();
        let ptr = buffer.as_mut_ptr() as *const UnsafeCell<T>;
        // SAFETY: `UnsafeCell<T>` has the layout of `T`, and the exclusive borrow of `buffer`
        // is held by the wrapper, so nothing else reads or writes it meanwhile.
        let cells = unsafe { std::slice::from_raw_parts(ptr, len) };
        DisjointChunks {
            cells,
            chunk_len: chunk_len.max(1),
            _borrow: PhantomData,
        }
    }

    /// Part `c` (elements `c·chunk_len ..`), for writing.
    ///
    /// # Safety
    /// No other reference to part `c` may be alive at the same time: call it from chunk `c` of
    /// a phase only (each chunk index runs once per phase), and do not call [`Self::whole`] in
    /// the same phase.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part_mut(&self, c: usize) -> &mut [T] {
        let start = (c * self.chunk_len).min(self.cells.len());
        let end = (start + self.chunk_len).min(self.cells.len());
        let part = &self.cells[start..end];
        // SAFETY: the caller guarantees exclusive access to this part; the cells allow
        // mutation through a shared reference.
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(part.as_ptr()), part.len()) }
    }

    /// Elements `start..start + len`, for writing: the finer-grained form of
    /// [`Self::part_mut`], for a phase whose chunks write and read different elements of the
    /// same parts.
    ///
    /// # Safety
    /// No other reference to any of these elements may be alive at the same time.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, start: usize, len: usize) -> &mut [T] {
        let cells = &self.cells[start..start + len];
        // SAFETY: exclusive access to these elements (caller's guarantee).
        unsafe { std::slice::from_raw_parts_mut(UnsafeCell::raw_get(cells.as_ptr()), len) }
    }

    /// Elements `start..start + len`, for reading.
    ///
    /// # Safety
    /// None of these elements may be written while the slice is alive.
    pub unsafe fn range(&self, start: usize, len: usize) -> &[T] {
        let cells = &self.cells[start..start + len];
        // SAFETY: no writer of these elements is alive (caller's guarantee).
        unsafe { std::slice::from_raw_parts(cells.as_ptr() as *const T, len) }
    }

    /// The whole buffer, for reading.
    ///
    /// # Safety
    /// No part may be written while the returned slice is alive: call it in a phase after the
    /// one that writes the buffer, never in the writing phase.
    pub unsafe fn whole(&self) -> &[T] {
        // SAFETY: no writer is alive (caller's guarantee); `UnsafeCell<T>` has `T`'s layout.
        unsafe { std::slice::from_raw_parts(self.cells.as_ptr() as *const T, self.cells.len()) }
    }
}

/// A buffer of `n` elements that nothing has written yet, for the chunks of a phase to fill:
/// a serial `vec![0.0; n]` of a `B × B` buffer (a `memset` on the calling thread, since the
/// tuned allocator recycles memory) was 6% of a loss step at B = 256.
pub(crate) fn unwritten<T>(n: usize) -> Vec<MaybeUninit<T>> {
    let mut v = Vec::with_capacity(n);
    v.resize_with(n, MaybeUninit::uninit);
    v
}

/// A place a row writer stores a value into: an initialised element, or an element of an
/// [`unwritten`] buffer (so that a buffer whose every element a pass writes need not be filled
/// with zeros first).
pub(crate) trait Slot<T> {
    /// Stores `value`.
    fn set(&mut self, value: T);
}

impl<T> Slot<T> for T {
    #[inline(always)]
    fn set(&mut self, value: T) {
        *self = value;
    }
}

impl<T> Slot<T> for MaybeUninit<T> {
    #[inline(always)]
    fn set(&mut self, value: T) {
        self.write(value);
    }
}

/// `part` with every element set to `value`, as initialised elements.
pub(crate) fn filled<T: Copy>(part: &mut [MaybeUninit<T>], value: T) -> &mut [T] {
    part.fill(MaybeUninit::new(value));
    // SAFETY: every element was just written; `MaybeUninit<T>` has `T`'s layout.
    unsafe { &mut *(part as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// `part` as initialised elements.
///
/// # Safety
/// Every element of `part` must have been written.
pub(crate) unsafe fn assume_written<T>(part: &[MaybeUninit<T>]) -> &[T] {
    // SAFETY: initialised (caller's guarantee); `MaybeUninit<T>` has `T`'s layout.
    unsafe { &*(part as *const [MaybeUninit<T>] as *const [T]) }
}

/// `buffer` as initialised elements, without a copy.
///
/// # Safety
/// Every element of `buffer` must have been written.
pub(crate) unsafe fn into_written<T>(buffer: Vec<MaybeUninit<T>>) -> Vec<T> {
    let mut buffer = std::mem::ManuallyDrop::new(buffer);
    let (ptr, len, cap) = (buffer.as_mut_ptr(), buffer.len(), buffer.capacity());
    // SAFETY: the allocation is `buffer`'s own (not freed: `ManuallyDrop`), with the same
    // layout for `T`, and every element is initialised (caller's guarantee).
    unsafe { Vec::from_raw_parts(ptr as *mut T, len, cap) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn each_phase_sees_everything_the_previous_one_wrote() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let n = 1000;
        let mut squares = vec![0u64; n];
        let mut sums = vec![0u64; n];
        pool.install(|| {
            let sq = DisjointChunks::new(&mut squares, 7);
            let su = DisjointChunks::new(&mut sums, 13);
            let first = |c: usize| {
                // SAFETY: chunk c writes part c of `sq` only.
                let part = unsafe { sq.part_mut(c) };
                for (k, v) in part.iter_mut().enumerate() {
                    let i = (c * 7 + k) as u64;
                    *v = i * i;
                }
            };
            let second = |c: usize| {
                // SAFETY: `sq` was written in the previous phase; part c of `su` is ours.
                let all = unsafe { sq.whole() };
                let total: u64 = all.iter().sum();
                let part = unsafe { su.part_mut(c) };
                for (k, v) in part.iter_mut().enumerate() {
                    *v = total + all[c * 13 + k];
                }
            };
            run_phases(&[
                Phase::new(n.div_ceil(7), &first),
                Phase::new(n.div_ceil(13), &second),
            ]);
        });
        let total: u64 = (0..n as u64).map(|i| i * i).sum();
        for i in 0..n {
            assert_eq!(squares[i], (i * i) as u64);
            assert_eq!(sums[i], total + (i * i) as u64, "row {i}");
        }
    }

    #[test]
    fn every_chunk_runs_exactly_once_on_any_number_of_threads() {
        for threads in [1, 2, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let seen = Mutex::new(Vec::new());
            let record = |c: usize| seen.lock().unwrap().push(c);
            let single = |_: usize| seen.lock().unwrap().push(usize::MAX);
            pool.install(|| {
                run_phases(&[
                    Phase::new(50, &record),
                    Phase::new(0, &record),
                    Phase::new(1, &single),
                ])
            });
            let mut seen = seen.into_inner().unwrap();
            assert_eq!(seen.pop(), Some(usize::MAX), "{threads} threads");
            seen.sort_unstable();
            assert_eq!(seen, (0..50).collect::<Vec<_>>(), "{threads} threads");
        }
    }

    #[test]
    fn slots_claim_their_own_runs_first_then_the_ends_of_others() {
        // Two slots, 16 chunks: runs of 4; slot 0 owns runs 0 and 3, slot 1 runs 1 and 2.
        let p = Progress::new([16].into_iter(), 2);
        let slot0: Vec<usize> = std::iter::from_fn(|| p.claim(0, 0)).take(9).collect();
        // All of its own runs in order, then the last chunk of slot 1's second run.
        assert_eq!(slot0, [0, 1, 2, 3, 12, 13, 14, 15, 11]);
        let slot1: Vec<usize> = std::iter::from_fn(|| p.claim(0, 1)).collect();
        assert_eq!(slot1, [4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(p.claim(0, 0), None);
        // Any number of slots and chunks, claims from slots in a scrambled order: each chunk
        // exactly once, and a slot's own chunks before any other's.
        for slots in 1..=5 {
            for chunks in 0..=37 {
                let p = Progress::new([chunks].into_iter(), slots);
                let mut got = vec![0u32; chunks];
                let mut stole = vec![false; slots];
                let mut k = 0usize;
                while let Some(c) = p.claim(0, k % slots) {
                    let t = k % slots;
                    let own = owned_runs(slots, t).iter().any(|&r| {
                        let (first, end) = unpack(run_of(chunks, 2 * slots, r));
                        (first..end).contains(&c)
                    });
                    if !own {
                        stole[t] = true;
                    } else {
                        assert!(!stole[t], "slot {t} took its own chunk {c} after stealing");
                    }
                    got[c] += 1;
                    k = k.wrapping_mul(7).wrapping_add(3);
                }
                assert!(
                    got.iter().all(|&n| n == 1),
                    "{slots} slots, {chunks}: {got:?}"
                );
            }
        }
    }

    #[test]
    fn a_helper_run_beneath_its_own_chunk_returns_at_once() {
        // What a thread waiting for rayon work inside chunk 0 would do if it picked up this
        // call's own helper job: run `work` on the same call. Without the guard the inner
        // loop would claim chunks 1 and 2 and then wait for chunk 0, beneath it, forever.
        let progress = Progress::new([3].into_iter(), 1);
        let phases_slot: std::sync::OnceLock<&[Phase<'_>]> = std::sync::OnceLock::new();
        let ran = Mutex::new(Vec::new());
        let chunk = |c: usize| {
            if c == 0 {
                work(&progress, phases_slot.get().unwrap(), 0);
            }
            ran.lock().unwrap().push(c);
        };
        let phases = [Phase::new(3, &chunk)];
        phases_slot.set(&phases).ok();
        work(&progress, &phases, 0);
        assert_eq!(ran.into_inner().unwrap(), vec![0, 1, 2]);
        assert!(ACTIVE.with(|a| a.borrow().is_empty()));
    }

    #[test]
    fn chunks_that_wait_on_rayon_work_do_not_deadlock() {
        // Each chunk joins two rayon tasks; while it waits, its thread may run this call's
        // helper job, which must not then wait for the chunk beneath it.
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let total = AtomicUsize::new(0);
            let chunk = |c: usize| {
                let (a, b) = rayon::join(|| c * 2, || (0..1000).map(|i| i % 7).sum::<usize>());
                total.fetch_add(a + b, Ordering::Relaxed);
            };
            for _ in 0..20 {
                pool.install(|| run_phases(&[Phase::new(16, &chunk), Phase::new(16, &chunk)]));
            }
            let per_call: usize = 2 * (0..16).map(|c| c * 2 + 2997).sum::<usize>();
            assert_eq!(
                total.load(Ordering::Relaxed),
                20 * per_call,
                "{threads} threads"
            );
            // The same from a thread outside the pool (the caller is not a worker).
            total.store(0, Ordering::Relaxed);
            for _ in 0..20 {
                run_phases(&[Phase::new(16, &chunk), Phase::new(16, &chunk)]);
            }
            assert_eq!(
                total.load(Ordering::Relaxed),
                20 * per_call,
                "outside the pool"
            );
        }
    }

    #[test]
    fn a_panicking_chunk_is_reraised_without_hanging() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let later = AtomicUsize::new(0);
        let boom = |c: usize| {
            if c == 3 {
                panic!("chunk 3 fails");
            }
        };
        let count = |_: usize| {
            later.fetch_add(1, Ordering::Relaxed);
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| run_phases(&[Phase::new(8, &boom), Phase::new(8, &count)]))
        }));
        assert!(outcome.is_err());
        assert_eq!(later.load(Ordering::Relaxed), 0, "no phase after the panic");
    }

    #[test]
    fn a_panicking_chunk_outside_the_pool_is_reraised_and_the_helpers_recover() {
        // A plain thread is outside every rayon pool: the dedicated helpers take part (unless
        // another test holds them, and then the rayon path does).
        let outcome = std::thread::spawn(|| {
            let boom = |c: usize| {
                if c == 5 {
                    panic!("chunk 5 fails");
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            };
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_phases(&[Phase::new(16, &boom)])
            }))
            .is_err()
        })
        .join()
        .unwrap();
        assert!(outcome, "the chunk's panic was not re-raised");
        // Later calls still run every chunk exactly once.
        for _ in 0..20 {
            let seen = Mutex::new(Vec::new());
            let record = |c: usize| seen.lock().unwrap().push(c);
            run_phases(&[Phase::new(9, &record), Phase::new(3, &record)]);
            let mut seen = seen.into_inner().unwrap();
            seen.sort_unstable();
            let mut want: Vec<usize> = (0..9).chain(0..3).collect();
            want.sort_unstable();
            assert_eq!(seen, want);
        }
    }

    #[test]
    fn unwritten_buffers_are_filled_part_by_part() {
        let mut v = unwritten::<f32>(10);
        {
            let parts = DisjointChunks::new(&mut v, 4);
            let fill = |c: usize| {
                // SAFETY: chunk c writes part c only.
                let part = filled(unsafe { parts.part_mut(c) }, 0.0);
                part.iter_mut().for_each(|x| *x += c as f32);
            };
            run_phases(&[Phase::new(3, &fill)]);
        }
        // SAFETY: the three parts cover the ten elements.
        let v = unsafe { into_written(v) };
        assert_eq!(v, [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn parts_cover_the_buffer_with_a_short_last_part() {
        let mut v = vec![0u8; 10];
        let d = DisjointChunks::new(&mut v, 4);
        // SAFETY: single thread, one part at a time.
        unsafe {
            assert_eq!(d.part_mut(2).len(), 2);
            d.part_mut(0).fill(1);
            assert_eq!(d.whole()[..5], [1, 1, 1, 1, 0]);
        }
    }
}

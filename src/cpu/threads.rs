//! The split of a small CPU between candle's two thread pools.
//!
//! candle runs CPU work on two pools that do not know of each other: rayon's (GEMMs, and the
//! host loops of our losses) and its own barrier pool (element-wise ops on 64 Ki elements or
//! more), whose `n − 1` workers spin for a while after every op (25,000 pause instructions,
//! `CANDLE_BARRIER_POOL_SPIN_LIMIT`) before they park. On a 2-core machine that spinning worker
//! holds one of the two cores while rayon's next parallel step wants both: after the gradient
//! accumulation at the end of a backward pass (an element-wise add of `B × D`), the next loss
//! step runs on about one core.
//!
//! [`tune_candle_threads`] sets `CANDLE_NUM_THREADS=1` on machines with at most two cores
//! (element-wise ops then run on the calling thread; GEMMs and our loops still use every rayon
//! thread). Measured on the 2-core VM (`benches/losses_vs_torch.md`, 2026-11-25): the
//! contrastive loss at B = 256 in 1.13–1.26 ms instead of 1.59–2.21 ms, FastAP 2.29 instead of
//! 3.27–3.45 ms; training throughput unchanged within noise (small CNN 352 / 309 against 347 /
//! 304 images/s, ResNet-18 at 112 px 17.2 / 19.5 against 16.5 / 20.3 images/s, alternating
//! runs). On larger machines it was not measured, so candle's default is left alone there.

/// The environment variable that turns [`tune_candle_threads`] off.
pub const OPT_OUT: &str = "RANKWISE_NO_THREAD_TUNING";

/// What [`tune_candle_threads`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadTuning {
    /// `CANDLE_NUM_THREADS=1` was set: candle's element-wise ops run on the calling thread.
    SingleElementwiseThread,
    /// Nothing was changed, for the reason given.
    Unchanged(&'static str),
}

/// The decision of [`tune_candle_threads`] from what it reads: whether [`OPT_OUT`] is set,
/// whether the user already chose `CANDLE_NUM_THREADS` or the spin limit, and the number of
/// cores.
pub fn decide(opted_out: bool, user_choice: bool, cores: usize) -> ThreadTuning {
    if opted_out {
        ThreadTuning::Unchanged("RANKWISE_NO_THREAD_TUNING is set")
    } else if user_choice {
        ThreadTuning::Unchanged("CANDLE_NUM_THREADS or CANDLE_BARRIER_POOL_SPIN_LIMIT is set")
    } else if cores > 2 {
        ThreadTuning::Unchanged("more than two cores (not measured there)")
    } else {
        ThreadTuning::SingleElementwiseThread
    }
}

/// Sets `CANDLE_NUM_THREADS=1` when [`decide`] says so (module documentation). Call it first
/// thing in `main`, before any other thread runs and before candle's first element-wise op
/// (candle reads the variable once, when it creates its pool). `rankwise train`, `embed` and
/// `reproduce`, the throughput example and the loss benchmark call it; the notebooks do not (an
/// evcxr kernel already runs other threads, and changing the environment under them is not
/// safe: set `CANDLE_NUM_THREADS=1` before starting Jupyter instead).
pub fn tune_candle_threads() -> ThreadTuning {
    let set = |name: &str| std::env::var_os(name).is_some();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let decision = decide(
        set(OPT_OUT),
        set("CANDLE_NUM_THREADS") || set("CANDLE_BARRIER_POOL_SPIN_LIMIT"),
        cores,
    );
    if decision == ThreadTuning::SingleElementwiseThread {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_machines_without_a_user_choice_are_tuned() {
        assert_eq!(
            decide(false, false, 2),
            ThreadTuning::SingleElementwiseThread
        );
        assert_eq!(
            decide(false, false, 1),
            ThreadTuning::SingleElementwiseThread
        );
        assert!(
            matches!(decide(false, false, 16), ThreadTuning::Unchanged(r) if r.contains("two cores"))
        );
        assert!(
            matches!(decide(false, true, 2), ThreadTuning::Unchanged(r) if r.contains("CANDLE_NUM_THREADS"))
        );
        assert!(
            matches!(decide(true, false, 2), ThreadTuning::Unchanged(r) if r.contains(OPT_OUT))
        );
    }
}

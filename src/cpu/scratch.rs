//! Per-thread scratch buffers that keep their memory from one call to the next.
//!
//! The convolutions unfold each part of a batch into a patch matrix and multiply it into another
//! buffer ([`crate::models::conv`]). Allocated per call, those buffers were zero-filled by
//! `Vec::resize` at every layer of every step (most of the `memset` in a training step's
//! profile), though every value is written before it is read. Kept per thread, they are grown
//! (and zero-filled) only when a larger size is first asked for. The threads are rayon's
//! workers and the caller, so the memory kept is one set of buffers per thread, as large as the
//! largest layer's.

use candle_core::WithDType;
use std::any::Any;
use std::cell::RefCell;

thread_local! {
    /// The calling thread's idle buffer sets, one per element type and count.
    static IDLE: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `N` buffers of `T` owned by the calling thread, with the lengths and values the
/// last user on this thread left (empty the first time); use [`prefix`] to get a length.
///
/// The set is taken out of the thread's store for the duration of `f`, so a nested call (a
/// rayon worker picking up another job while it waits) gets a set of its own rather than a
/// borrow error.
pub(crate) fn with_buffers<T: WithDType, R, const N: usize>(
    f: impl FnOnce(&mut [Vec<T>; N]) -> R,
) -> R {
    let taken = IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        // The most recently returned set first: its memory is the warmest.
        let i = idle.iter().rposition(|set| set.is::<[Vec<T>; N]>())?;
        idle.swap_remove(i).downcast::<[Vec<T>; N]>().ok()
    });
    let mut set = taken.unwrap_or_else(|| Box::new(std::array::from_fn(|_| Vec::new())));
    let result = f(&mut set);
    IDLE.with(|idle| idle.borrow_mut().push(set));
    result
}

/// The first `len` values of `buf`, grown with zeros when it is shorter. The values
/// are whatever the buffer held: for callers that write every value before reading it.
pub(crate) fn prefix<T: WithDType>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::zero());
    }
    &mut buf[..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gets_its_buffers_back_and_nested_calls_get_their_own() {
        let first = with_buffers::<f32, _, 2>(|[a, b]| {
            prefix(a, 100).fill(1.0);
            prefix(b, 10).fill(2.0);
            // A nested call while the set is out gets a fresh set.
            with_buffers::<f32, _, 2>(|[c, d]| assert!(c.is_empty() && d.is_empty()));
            a.as_ptr()
        });
        with_buffers::<f32, _, 2>(|[a, b]| {
            assert_eq!(a.as_ptr(), first, "the same memory again");
            assert_eq!(
                prefix(a, 50),
                &[1.0; 50][..],
                "values left by the last user"
            );
            assert_eq!(b.len(), 10);
            assert_eq!(prefix(b, 12)[10..], [0.0, 0.0], "grown with zeros");
        });
        // Another type or count is another set.
        with_buffers::<f64, _, 2>(|[a, _]| assert!(a.is_empty()));
        with_buffers::<f32, _, 3>(|[a, _, _]| assert!(a.is_empty()));
    }
}

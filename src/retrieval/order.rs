//! Deterministic ordering of similarity scores.
//!
//! **Tie rule.** References are ranked by decreasing score; equal scores are broken by
//! increasing reference index. The rule is documented rather than random so that every run, every
//! chunk size and every thread count gives bit-identical metrics. (The authors' torch `topk` and
//! faiss give an implementation-defined order on ties; with float embeddings exact ties are rare
//! except for duplicate images.)
//!
//! Scores are mapped to `u32` keys whose unsigned order is the *decreasing* float order, so the
//! full ranking of a row is a stable LSD radix sort of the keys taken in reference-index order.
//! A radix sort costs three linear passes, about 5× cheaper than a comparison sort on 60k keys,
//! which is what makes full-ranking evaluation at SOP scale fast.

/// Order-reversing key of a finite score: `a > b` ⇔ `key(a) < key(b)`, `-0.0` ≡ `+0.0`.
#[inline]
pub fn descending_key(score: f32) -> u32 {
    // Adding +0.0 turns -0.0 into +0.0 so that the two zeros tie, as they compare equal.
    let bits = (score + 0.0).to_bits();
    let ascending = if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    };
    !ascending
}

/// Reusable buffers for [`sort_by_key_stable`], so ranking 60k rows allocates once per thread.
pub struct RadixScratch<T> {
    keys: Vec<u32>,
    payload: Vec<T>,
}

impl<T> Default for RadixScratch<T> {
    fn default() -> Self {
        RadixScratch {
            keys: Vec::new(),
            payload: Vec::new(),
        }
    }
}

const DIGIT_BITS: [u32; 3] = [11, 11, 10];
const DIGIT_SHIFT: [u32; 3] = [0, 11, 22];

/// Stable sort of `payload` by `keys` (ascending), in place; both slices have the same length.
///
/// LSD radix sort with three digits (11 + 11 + 10 bits). Stability is what makes ties come out in
/// the order the items were given, i.e. by reference index.
pub fn sort_by_key_stable<T: Copy + Default>(
    keys: &mut [u32],
    payload: &mut [T],
    scratch: &mut RadixScratch<T>,
) {
    let n = keys.len();
    debug_assert_eq!(n, payload.len());
    if n < 64 {
        // Small rows: an insertion-free std stable sort is simpler and as fast.
        let mut pairs: Vec<(u32, T)> = keys.iter().copied().zip(payload.iter().copied()).collect();
        pairs.sort_by_key(|p| p.0);
        for (i, (k, p)) in pairs.into_iter().enumerate() {
            keys[i] = k;
            payload[i] = p;
        }
        return;
    }
    let mut hist = [[0usize; 2048]; 3];
    for &k in keys.iter() {
        for d in 0..3 {
            let mask = (1u32 << DIGIT_BITS[d]) - 1;
            hist[d][((k >> DIGIT_SHIFT[d]) & mask) as usize] += 1;
        }
    }
    scratch.keys.resize(n, 0);
    scratch.payload.resize(n, T::default());
    let (mut src_k, mut src_p): (&mut [u32], &mut [T]) = (keys, payload);
    let (mut dst_k, mut dst_p): (&mut [u32], &mut [T]) =
        (&mut scratch.keys[..n], &mut scratch.payload[..n]);
    let mut in_scratch = false;
    for d in 0..3 {
        let mask = (1u32 << DIGIT_BITS[d]) - 1;
        // A digit on which every key agrees needs no pass (common for the top bits of cosines).
        if hist[d].contains(&n) {
            continue;
        }
        let mut offsets = [0usize; 2048];
        let mut acc = 0;
        for (o, &c) in offsets.iter_mut().zip(hist[d].iter()) {
            *o = acc;
            acc += c;
        }
        for i in 0..n {
            let k = src_k[i];
            let b = ((k >> DIGIT_SHIFT[d]) & mask) as usize;
            let pos = offsets[b];
            offsets[b] += 1;
            dst_k[pos] = k;
            dst_p[pos] = src_p[i];
        }
        std::mem::swap(&mut src_k, &mut dst_k);
        std::mem::swap(&mut src_p, &mut dst_p);
        in_scratch = !in_scratch;
    }
    if in_scratch {
        // The sorted data ended in the scratch buffers (`src_*`); copy it back to the caller's.
        dst_k.copy_from_slice(src_k);
        dst_p.copy_from_slice(src_p);
    }
}

/// Packs a score and a reference index into one `u64` whose ascending order is the ranking
/// (decreasing score, then increasing index). Used for partial selection (top-k).
#[inline]
pub fn rank_key(score: f32, index: u32) -> u64 {
    ((descending_key(score) as u64) << 32) | index as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn key_reverses_float_order() {
        let xs = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-30,
            -0.0,
            0.0,
            1e-30,
            0.5,
            1.0,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            if w[0] == w[1] {
                assert_eq!(descending_key(w[0]), descending_key(w[1]));
            } else {
                assert!(descending_key(w[0]) > descending_key(w[1]), "{w:?}");
            }
        }
    }

    #[test]
    fn radix_sort_equals_stable_comparison_sort() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut scratch = RadixScratch::default();
        for &n in &[0usize, 1, 5, 63, 64, 65, 1000, 5000] {
            // Few distinct values, so that ties are frequent and stability is exercised.
            let scores: Vec<f32> = (0..n)
                .map(|_| (rng.random_range(-20i32..20) as f32) / 20.0)
                .collect();
            let mut keys: Vec<u32> = scores.iter().map(|&s| descending_key(s)).collect();
            let mut idx: Vec<u32> = (0..n as u32).collect();
            sort_by_key_stable(&mut keys, &mut idx, &mut scratch);
            let mut expect: Vec<u32> = (0..n as u32).collect();
            expect.sort_by(|&a, &b| {
                scores[b as usize]
                    .partial_cmp(&scores[a as usize])
                    .unwrap()
                    .then(a.cmp(&b))
            });
            assert_eq!(idx, expect, "n = {n}");
        }
    }

    #[test]
    fn rank_key_orders_by_score_then_index() {
        assert!(rank_key(0.9, 5) < rank_key(0.8, 0));
        assert!(rank_key(0.5, 1) < rank_key(0.5, 2));
    }
}

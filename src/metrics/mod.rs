//! Retrieval and classification metrics as pure functions.
//!
//! # The input of every retrieval metric
//!
//! One query's ranked list of **levels**: `ranked[i]` is the level of match (see
//! [`crate::hierarchy`]) of the reference at 0-based position `i`, references in decreasing-score
//! order, the query itself already removed. `L` means the same fine class, `0` a negative. Ties
//! in score are the caller's business: the metrics read the list in the order given, which is
//! the tie policy of the authors' evaluation code (sort order), whereas the papers' Heaviside
//! `H(0)` is undefined.
//!
//! # Cost
//!
//! The exact ranking engine calls these functions once per query over the whole reference set
//! (60,000 × 60,000 on SOP), so each one is a single `O(n)` or `O(n·L)` pass over the list with
//! fixed-size stack buffers (at most 256 levels, the range of `u8`) and no heap allocation, except
//! [`hierarchical_pr_curve`] and [`h_ranks`], which return one value per positive.
//!
//! # `None`
//!
//! Every per-query metric returns `None` when it is undefined for that query — above all when
//! the list holds no positive (a "lone" query, which the authors' code and
//! pytorch-metric-learning skip) — and never panics: an empty list, `k = 0`, `k > n`, a
//! `min_level` of 0, a level outside the relevance table, or a malformed relevance table all give
//! `None`, as documented on each function. Callers that want a clear error for a malformed
//! relevance table check it once with [`check_level_values`].
//!
//! # Modules
//!
//! - [`binary`]: AP (HAPPIER Eq. 1; per-level AP, Eq. 13), mAP@R, R-precision, R@k (recall
//!   rate), P@k, binary ASI.
//! - [`hierarchical`]: H-rank (HAPPIER Eq. 2), H-AP (Eq. 3) and the hierarchical PR curve
//!   (Eqs. 9–11).
//! - [`pr_curve`]: the binary precision–recall curve (its area is AP) and the mean interpolated
//!   curve over queries, for figures.
//! - [`set_intersection`]: hierarchical Average Set Intersection, ASI (HAPPIER supp. B.3).
//! - [`discounted_gain`]: NDCG with gains `2^l − 1` (HAPPIER supp. B.3).
//! - [`revisited`]: the revisited Oxford/Paris protocol (Radenović et al., CVPR 2018; SSR
//!   Table 1): Easy/Medium/Hard mAP and mP@k.
//! - [`fewshot`]: few-shot accuracy, mean ± 95% confidence half-width over episodes (SSR Table 2).

pub mod binary;
pub mod discounted_gain;
pub mod fewshot;
pub mod hierarchical;
pub mod pr_curve;
pub mod revisited;
pub mod set_intersection;

pub use binary::{
    average_precision, binary_asi, map_at_r, precision_at_k, r_precision, recall_at_k, Binary,
};
pub use discounted_gain::ndcg;
pub use hierarchical::{
    check_level_values, h_ap, h_ap_value_matched, h_ranks, hierarchical_pr_curve,
};
pub use pr_curve::precision_recall_curve;
pub use set_intersection::asi;

/// Number of distinct levels a `u8` can hold; the size of the per-level stack counters.
pub(crate) const MAX_LEVELS: usize = 256;

/// A ranked list of levels as the metrics read it: its length and, in rank order, the position
/// and level of every item of level ≥ 1. The negatives only shift the positions of the items
/// after them, so every metric here reads a list through this view; a dense list (`[u8]`, one
/// level per position) and the evaluation engine's sparse list ([`Positives`]) are both one.
pub trait RankedLevels {
    /// Items in the list, negatives included.
    fn list_len(&self) -> usize;
    /// `(position, level)` of every item of level ≥ 1, by increasing 0-based position.
    fn positives(&self) -> impl Iterator<Item = (usize, u8)> + '_;
}

impl RankedLevels for [u8] {
    fn list_len(&self) -> usize {
        self.len()
    }
    fn positives(&self) -> impl Iterator<Item = (usize, u8)> + '_ {
        self.iter()
            .enumerate()
            .filter(|&(_, &l)| l > 0)
            .map(|(i, &l)| (i, l))
    }
}

/// A ranked list given by its items of level ≥ 1 only: their 0-based positions (increasing)
/// and levels, and the length of the whole list. What the evaluation engine builds for each
/// query: it ranks the positives of a row exactly and counts the negatives above each one
/// instead of sorting every reference (`crate::retrieval`).
///
/// ```
/// use rankwise::metrics::{average_precision, Binary, Positives};
/// // The list [0, 2, 0, 0, 1]: positives at positions 1 and 4.
/// let sparse = Positives { positions: &[1, 4], levels: &[2, 1], len: 5 };
/// let ap = Binary::on(&sparse, 1).unwrap().average_precision();
/// assert_eq!(Some(ap), average_precision(&[0, 2, 0, 0, 1], 1));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Positives<'a> {
    /// 0-based positions of the items of level ≥ 1, increasing.
    pub positions: &'a [u32],
    /// Their levels (each ≥ 1), in the same order.
    pub levels: &'a [u8],
    /// Length of the whole list.
    pub len: usize,
}

impl RankedLevels for Positives<'_> {
    fn list_len(&self) -> usize {
        self.len
    }
    fn positives(&self) -> impl Iterator<Item = (usize, u8)> + '_ {
        self.positions
            .iter()
            .zip(self.levels)
            .map(|(&p, &l)| (p as usize, l))
    }
}

/// The level at each position `0..n` of a list read through its positives (0 between them):
/// a walk over the first `n` positions for the metrics that visit every position.
pub(crate) fn levels_up_to(
    positives: impl Iterator<Item = (usize, u8)>,
    n: usize,
) -> impl Iterator<Item = u8> {
    let mut next = positives.peekable();
    (0..n).map(move |i| match next.peek() {
        Some(&(p, l)) if p == i => {
            next.next();
            l
        }
        _ => 0,
    })
}

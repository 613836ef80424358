//! One query's row ranked, and read through its positives.
//!
//! Every metric of a ranked list reads only the positions and levels of its positives and the
//! list's length ([`crate::metrics::RankedLevels`]); the negatives only shift positions. On SOP
//! a query has 2–12 fine and a few thousand coarse positives among 60k references. The row is
//! sorted once (keys of the scores and the levels as payload, [`super::order`]: decreasing
//! score, ties by reference index) and one branch-free pass then writes down where its
//! positives are; each metric then walks a few thousand positives instead of 60k levels (the
//! dense metric passes were 40% of a full-ranking evaluation in the profile, more than the
//! sort). Positions and levels are those of the dense list, so every metric is bit-identical
//! to the dense path (tested here and in `tests/integration/retrieval_engine.rs`).
//!
//! (Counting, for each sorted positive, the negatives ranked before it without sorting the
//! negatives — buckets over the score range — was tried and measured slower on SOP: most
//! negatives share a bucket with a positive there, and the per-negative search mispredicts.)

use super::order::{descending_key, sort_by_key_stable, RadixScratch};
use crate::metrics::Positives;

/// Per-thread buffers for ranking one row.
#[derive(Default)]
pub(crate) struct PositivesScratch {
    /// Keys and levels of the row without the query, sorted together.
    keys: Vec<u32>,
    row_levels: Vec<u8>,
    radix: RadixScratch<u8>,
    /// The result: `p` positions (increasing) and levels of the positives, items per level and
    /// the length of the list. The position and level buffers keep the length of the longest
    /// row (their tail past `p` is stale), so that the branch-free pass can write every slot.
    positions: Vec<u32>,
    levels: Vec<u8>,
    p: usize,
    counts: Vec<usize>,
    len: usize,
}

impl PositivesScratch {
    /// The last ranked row, as the metrics read it.
    pub fn ranked(&self) -> Positives<'_> {
        Positives {
            positions: &self.positions[..self.p],
            levels: &self.levels[..self.p],
            len: self.len,
        }
    }

    /// Items of each level of the last ranked row (`num_levels + 1` entries).
    pub fn counts(&self) -> &[usize] {
        &self.counts
    }
}

/// Ranks one row: `scores[j]` of reference `j`, whose level of match is `level(j)` (at most
/// `num_levels`); reference `skip` (the query itself) is left out, and with `drop_first` the
/// first-ranked item is removed after ranking (pytorch-metric-learning's
/// `ref_includes_query`). The result is read from `scratch`.
pub(crate) fn rank_row(
    scores: &[f32],
    level: impl Fn(usize) -> u8,
    num_levels: usize,
    skip: Option<usize>,
    drop_first: bool,
    scratch: &mut PositivesScratch,
) {
    let s = scratch;
    s.keys.clear();
    s.row_levels.clear();
    for (j, &score) in scores.iter().enumerate() {
        if Some(j) == skip {
            continue;
        }
        s.keys.push(descending_key(score));
        s.row_levels.push(level(j));
    }
    sort_by_key_stable(&mut s.keys, &mut s.row_levels, &mut s.radix);
    let start = usize::from(drop_first && !s.row_levels.is_empty());
    let ranked = &s.row_levels[start..];
    let n = ranked.len();
    if s.positions.len() < n {
        s.positions.resize(n, 0);
        s.levels.resize(n, 0);
    }
    // Write every item's slot and advance past it only for a positive: no branch to
    // mispredict at the positives' few-percent rate.
    let mut p = 0;
    for (i, &l) in ranked.iter().enumerate() {
        s.positions[p] = i as u32;
        s.levels[p] = l;
        p += usize::from(l > 0);
    }
    s.p = p;
    s.len = n;
    s.count_levels(num_levels);
}

impl PositivesScratch {
    /// Takes a row ranked elsewhere (on a device, [`super::device_rank`]): the increasing
    /// `positions` and the `levels` of its positives in a list of `len` items, the query already
    /// left out. With `drop_first`, the first-ranked item is removed, as [`rank_row`] does: the
    /// first positive if it is at position 0, and every position moves up one.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn set_ranked(
        &mut self,
        positions: &[u32],
        levels: &[u8],
        len: usize,
        num_levels: usize,
        drop_first: bool,
    ) {
        let s = self;
        let dropped = drop_first && len > 0;
        let first = usize::from(dropped && positions.first() == Some(&0));
        s.positions.clear();
        s.levels.clear();
        let shift = u32::from(dropped);
        s.positions
            .extend(positions[first..].iter().map(|&i| i - shift));
        s.levels.extend_from_slice(&levels[first..]);
        s.p = s.positions.len();
        s.len = len - usize::from(dropped);
        s.count_levels(num_levels);
    }

    /// The items of each level of the list: its `p` positives' levels, the rest level 0.
    fn count_levels(&mut self, num_levels: usize) {
        self.counts.clear();
        self.counts.resize(num_levels + 1, 0);
        self.counts[0] = self.len - self.p;
        for &l in &self.levels[..self.p] {
            self.counts[l as usize] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RankedLevels;

    /// The dense reference: every item sorted (the engine's order), levels in rank order.
    fn dense(scores: &[f32], levels: &[u8], skip: Option<usize>, drop_first: bool) -> Vec<u8> {
        let mut items: Vec<(u32, usize)> = scores
            .iter()
            .enumerate()
            .filter(|&(j, _)| Some(j) != skip)
            .map(|(j, &s)| (descending_key(s), j))
            .collect();
        items.sort();
        let mut out: Vec<u8> = items.iter().map(|&(_, j)| levels[j]).collect();
        if drop_first && !out.is_empty() {
            out.remove(0);
        }
        out
    }

    fn check(scores: &[f32], levels: &[u8], skip: Option<usize>, drop_first: bool) {
        let mut s = PositivesScratch::default();
        rank_row(scores, |j| levels[j], 3, skip, drop_first, &mut s);
        let want = dense(scores, levels, skip, drop_first);
        let got = s.ranked();
        assert_eq!(got.list_len(), want.len());
        let want_pos: Vec<(usize, u8)> = want.as_slice().positives().collect();
        let got_pos: Vec<(usize, u8)> = got.positives().collect();
        assert_eq!(got_pos, want_pos, "skip {skip:?}, drop {drop_first}");
        let mut counts = [0usize; 4];
        for &l in &want {
            counts[l as usize] += 1;
        }
        assert_eq!(s.counts(), &counts[..]);
    }

    #[test]
    fn positions_are_those_of_the_full_sort_with_ties_and_self_matches() {
        // Scores on a coarse grid (many exact ties, -0.0 and 0.0 among them) and every mix of
        // positive counts, from none to all.
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for n in [0usize, 1, 2, 5, 63, 64, 65, 300, 2000] {
            for positive_rate in [0u32, 3, 30, 100] {
                let scores: Vec<f32> = (0..n)
                    .map(|_| match next() % 7 {
                        0 => -0.0,
                        _ => (next() % 41) as f32 / 20.0 - 1.0,
                    })
                    .collect();
                let levels: Vec<u8> = (0..n)
                    .map(|_| {
                        if next() % 100 < positive_rate {
                            1 + (next() % 3) as u8
                        } else {
                            0
                        }
                    })
                    .collect();
                for skip in [None, Some(0), Some(n / 2)] {
                    let skip = skip.filter(|&k| k < n);
                    for drop_first in [false, true] {
                        check(&scores, &levels, skip, drop_first);
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_ranked_elsewhere_reads_as_the_host_ranking_with_the_first_item_dropped() {
        // The positives of the full ranking, handed over without the drop; the drop applied by
        // `set_ranked` equals `rank_row`'s, whether the first item is a positive or not.
        let cases: [(&[f32], &[u8]); 4] = [
            (&[0.9, 0.1, 0.5, 0.7], &[1, 0, 2, 0]),
            (&[0.9, 0.1, 0.5, 0.7], &[0, 0, 2, 1]),
            (&[0.3], &[1]),
            (&[], &[]),
        ];
        for (scores, levels) in cases {
            let mut full = PositivesScratch::default();
            rank_row(scores, |j| levels[j], 2, None, false, &mut full);
            let (positions, lv, len) = {
                let r = full.ranked();
                (r.positions.to_vec(), r.levels.to_vec(), r.len)
            };
            for drop_first in [false, true] {
                let mut want = PositivesScratch::default();
                rank_row(scores, |j| levels[j], 2, None, drop_first, &mut want);
                let mut got = PositivesScratch::default();
                got.set_ranked(&positions, &lv, len, 2, drop_first);
                let (g, w) = (got.ranked(), want.ranked());
                assert_eq!(
                    (g.positions, g.levels, g.len),
                    (w.positions, w.levels, w.len)
                );
                assert_eq!(got.counts(), want.counts(), "{scores:?} drop {drop_first}");
            }
        }
    }

    #[test]
    fn long_runs_of_equal_scores_with_positives_above_inside_and_below() {
        // Most items share one score; positives above, among and below them.
        let scores = [
            0.5f32, 0.5, 0.5, 0.9, 0.5, 0.1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5,
        ];
        let levels = [0u8, 0, 1, 2, 0, 3, 0, 1, 0, 0, 2, 0, 1];
        check(&scores, &levels, None, false);
        check(&scores, &levels, Some(2), true);
        // Two scores only, positives spread over both runs.
        let scores: Vec<f32> = (0..200)
            .map(|i| if i % 3 == 0 { 0.25 } else { 0.75 })
            .collect();
        let levels: Vec<u8> = (0..200).map(|i| u8::from(i % 2 == 0)).collect();
        check(&scores, &levels, None, false);
        check(&scores, &levels, Some(7), true);
    }
}

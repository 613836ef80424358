//! Hierarchical labels, the level of match between two items, and the relevance functions of
//! HAPPIER (Ramzi et al., ECCV 2022).
//!
//! Convention (the one of the HAPPIER code): a [`Labels`] is an `N × L` matrix of class ids,
//! **finest level first** — column 0 is the fine class, column `L − 1` the coarsest. A flat
//! dataset is `L = 1`. The *level* of an item `j` with respect to a query `q` is the number of
//! columns on which they agree, counted from the coarsest down and stopping at the first
//! disagreement: `L` means the same fine class, `0` means unrelated (a negative). For a consistent
//! hierarchy (checked by [`Labels::new`]) this equals the HAPPIER code's plain count of equal
//! columns and the depth of the lowest common ancestor.

use crate::error::{Error, Result};
use std::collections::HashMap;

/// Class id type. Ids are arbitrary integers (they need not be contiguous).
pub type ClassId = i64;

/// An `N × L` matrix of class ids, finest level first, validated to form a hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    n: usize,
    num_levels: usize,
    /// Row-major `N × L`.
    data: Vec<ClassId>,
}

impl Labels {
    /// Builds labels from one row per item (finest class first).
    ///
    /// Errors on empty input, rows of different lengths (naming the first ragged row), rows with
    /// no column, and a class at some level that maps to two different parents (naming the class,
    /// both parents and the rows where they occur).
    pub fn new(rows: Vec<Vec<ClassId>>) -> Result<Self> {
        let first = rows
            .first()
            .ok_or_else(|| Error::Labels("no items (empty label list)".into()))?;
        let num_levels = first.len();
        let mut data = Vec::with_capacity(rows.len() * num_levels);
        for (i, row) in rows.iter().enumerate() {
            if row.len() != num_levels {
                return Err(Error::Labels(format!(
                    "ragged rows: row {i} has {} levels but row 0 has {num_levels}",
                    row.len()
                )));
            }
            data.extend_from_slice(row);
        }
        Self::from_flat(rows.len(), num_levels, data)
    }

    /// Builds labels from a row-major `n × num_levels` buffer; validated as in [`Labels::new`].
    pub fn from_flat(n: usize, num_levels: usize, data: Vec<ClassId>) -> Result<Self> {
        if n == 0 {
            return Err(Error::Labels("no items (empty label list)".into()));
        }
        if num_levels == 0 {
            return Err(Error::Labels("rows have no label column".into()));
        }
        if num_levels > u8::MAX as usize {
            return Err(Error::Labels(format!(
                "{num_levels} levels; at most {} are supported",
                u8::MAX
            )));
        }
        if data.len() != n * num_levels {
            return Err(Error::Labels(format!(
                "buffer holds {} ids, expected {n} items × {num_levels} levels",
                data.len()
            )));
        }
        let labels = Labels {
            n,
            num_levels,
            data,
        };
        labels.check_consistent()?;
        Ok(labels)
    }

    /// Flat labels (`L = 1`) from one class id per item.
    pub fn from_fine(fine: &[ClassId]) -> Result<Self> {
        Self::from_flat(fine.len(), 1, fine.to_vec())
    }

    /// Every class at level `l < L − 1` must have a single parent at level `l + 1`; otherwise the
    /// "level of match" is not a tree distance and H-AP is ill-defined.
    fn check_consistent(&self) -> Result<()> {
        for l in 0..self.num_levels.saturating_sub(1) {
            let mut parent: HashMap<ClassId, (ClassId, usize)> = HashMap::new();
            for i in 0..self.n {
                let row = self.row(i);
                let (child, par) = (row[l], row[l + 1]);
                match parent.get(&child) {
                    Some(&(p, first_row)) if p != par => {
                        return Err(Error::Labels(format!(
                            "class {child} at level {l} maps to two different level-{} classes: \
                             {p} (row {first_row}) and {par} (row {i}); class ids must be unique \
                             within a level across the whole hierarchy",
                            l + 1
                        )));
                    }
                    Some(_) => {}
                    None => {
                        parent.insert(child, (par, i));
                    }
                }
            }
        }
        Ok(())
    }

    /// Number of items `N`.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always false: empty labels are rejected at construction.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Number of label levels `L` (columns).
    pub fn num_levels(&self) -> usize {
        self.num_levels
    }

    /// The label row of item `i`, finest class first.
    pub fn row(&self, i: usize) -> &[ClassId] {
        &self.data[i * self.num_levels..(i + 1) * self.num_levels]
    }

    /// The fine (column 0) class of item `i`.
    pub fn fine(&self, i: usize) -> ClassId {
        self.data[i * self.num_levels]
    }

    /// The whole column of level `l` (0 = finest).
    pub fn column(&self, l: usize) -> Vec<ClassId> {
        (0..self.n)
            .map(|i| self.data[i * self.num_levels + l])
            .collect()
    }

    /// Row-major `N × L` view of the ids.
    pub fn as_flat(&self) -> &[ClassId] {
        &self.data
    }

    /// Level of match of item `j` with respect to item `i` of the same set (see the module doc).
    pub fn level(&self, i: usize, j: usize) -> u8 {
        match_level(self.row(i), self.row(j))
    }

    /// Level of match of item `j` of `other` with respect to item `i` of `self`.
    ///
    /// Both label sets must have the same number of levels (checked by [`Labels::check_compatible`]).
    pub fn level_against(&self, i: usize, other: &Labels, j: usize) -> u8 {
        match_level(self.row(i), other.row(j))
    }

    /// Errors unless `other` has the same number of levels (e.g. queries vs references).
    pub fn check_compatible(&self, other: &Labels) -> Result<()> {
        if self.num_levels != other.num_levels {
            return Err(Error::Shape(format!(
                "query labels have {} levels but reference labels have {}",
                self.num_levels, other.num_levels
            )));
        }
        Ok(())
    }

    /// Labels keeping only levels `from..L` (e.g. `from = 1` drops the fine level, so that the
    /// former level 1 becomes the fine class). Used for per-level evaluation.
    pub fn coarsen(&self, from: usize) -> Result<Labels> {
        if from >= self.num_levels {
            return Err(Error::invalid(
                "level",
                format!(
                    "level {from} does not exist (labels have {})",
                    self.num_levels
                ),
            ));
        }
        let l = self.num_levels - from;
        let data = (0..self.n)
            .flat_map(|i| self.row(i)[from..].iter().copied())
            .collect();
        Labels::from_flat(self.n, l, data)
    }

    /// Labels of the items at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Result<Labels> {
        let mut data = Vec::with_capacity(indices.len() * self.num_levels);
        for &i in indices {
            if i >= self.n {
                return Err(Error::invalid(
                    "index",
                    format!("{i} out of range for {} items", self.n),
                ));
            }
            data.extend_from_slice(self.row(i));
        }
        Labels::from_flat(indices.len(), self.num_levels, data)
    }
}

/// Level of match between two label rows (finest first): the number of equal columns counted
/// from the coarsest down, stopping at the first difference. `a.len()` means the same fine class.
pub fn match_level(a: &[ClassId], b: &[ClassId]) -> u8 {
    debug_assert_eq!(a.len(), b.len());
    let mut level = 0u8;
    for (x, y) in a.iter().rev().zip(b.iter().rev()) {
        if x != y {
            break;
        }
        level += 1;
    }
    level
}

/// Counts of items at each level `0..=L` in a list of levels.
pub fn level_counts(levels: &[u8], num_levels: usize) -> Vec<usize> {
    let mut counts = vec![0usize; num_levels + 1];
    for &l in levels {
        counts[l as usize] += 1;
    }
    counts
}

/// A relevance function: the relevance `rel(k)` of an item at level `l` for one query, from the
/// populations of the levels in that query's retrieval set. Negatives (level 0) have relevance 0.
#[derive(Debug, Clone, PartialEq)]
pub enum Relevance {
    /// HAPPIER Eq. (4): `rel(k) = (l / L)^α / |Ω^(l)|` for `k ∈ Ω^(l)`.
    ///
    /// `count_query = true` adds the query itself to the population of level `L`, as the
    /// authors' code does (their label matrix keeps the diagonal, while the ranking removes it);
    /// `false` is the paper's formula. The global scale of the weights (the code uses
    /// `(l / (L − 1))^α`) cancels in H-AP and is not reproduced.
    Pop {
        /// Exponent α (1 for the metric; HAPPIER_F trains with 3 or 5).
        alpha: f64,
        /// Count the query in the population of its own fine class (authors' code).
        count_query: bool,
    },
    /// HAPPIER supp. A.2, Property 1 (ΣwAP): `rel(k) = Σ_{p=1..l} w_p / |Ω^{+,p}|`, with
    /// `Ω^{+,p}` the items of level `≥ p`. Then H-AP = Σ_l w_l · AP^(l). `weights[p − 1] = w_p`,
    /// one per level `1..=L`, positive. They are used as given (Property 1 assumes they sum to 1;
    /// H-AP is scale-invariant, so the identity holds for any positive scale). A level with no
    /// item contributes nothing.
    WeightedAp {
        /// `w_1 … w_L` (coarsest level first, as `p` runs from 1 to L).
        weights: Vec<f64>,
    },
    /// Raw level weights `(l / L)^α` with no population normalisation, as in the worked examples
    /// of HAPPIER's figures (Fig. 3, Fig. 8).
    Level {
        /// Exponent α.
        alpha: f64,
    },
}

impl Default for Relevance {
    /// The relevance of the H-AP metric in HAPPIER's tables: `Pop { alpha: 1, count_query: true }`
    /// (the authors' evaluation code, which produced the published numbers).
    fn default() -> Self {
        Relevance::Pop {
            alpha: 1.0,
            count_query: true,
        }
    }
}

impl Relevance {
    /// Relevance value of each level `0..=L` for one query, given `counts[l]` = number of items of
    /// level `l` in the query's retrieval set (the query itself excluded). `values[0] = 0`.
    ///
    /// Levels with no item get the value the formula would give with a population of one; they
    /// never occur in the list, so the value is never used.
    pub fn level_values(&self, counts: &[usize]) -> Vec<f64> {
        let num_levels = counts.len() - 1;
        let big_l = num_levels as f64;
        let mut values = vec![0.0; num_levels + 1];
        match self {
            Relevance::Pop { alpha, count_query } => {
                for (l, v) in values.iter_mut().enumerate().skip(1) {
                    let mut pop = counts[l];
                    if *count_query && l == num_levels {
                        pop += 1;
                    }
                    *v = (l as f64 / big_l).powf(*alpha) / pop.max(1) as f64;
                }
            }
            Relevance::WeightedAp { weights } => {
                let mut cum = 0.0;
                let mut at_least = counts.iter().skip(1).sum::<usize>();
                for (l, v) in values.iter_mut().enumerate().skip(1) {
                    if at_least > 0 {
                        cum += weights[l - 1] / at_least as f64;
                    }
                    at_least -= counts[l];
                    *v = cum;
                }
            }
            Relevance::Level { alpha } => {
                for (l, v) in values.iter_mut().enumerate().skip(1) {
                    *v = (l as f64 / big_l).powf(*alpha);
                }
            }
        }
        values
    }

    /// Errors if the parameters cannot describe `num_levels` levels (wrong weight count, a
    /// negative or non-finite weight or α).
    pub fn validate(&self, num_levels: usize) -> Result<()> {
        match self {
            Relevance::Pop { alpha, .. } | Relevance::Level { alpha } => {
                if !alpha.is_finite() || *alpha < 0.0 {
                    return Err(Error::invalid(
                        "alpha",
                        format!("must be finite and ≥ 0, got {alpha}"),
                    ));
                }
            }
            Relevance::WeightedAp { weights } => {
                if weights.len() != num_levels {
                    return Err(Error::invalid(
                        "weights",
                        format!(
                            "ΣwAP needs one weight per level ({num_levels}), got {}",
                            weights.len()
                        ),
                    ));
                }
                if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w <= 0.0) {
                    return Err(Error::invalid(
                        "weights",
                        format!("ΣwAP weights must be finite and > 0, got {w}"),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sop_like() -> Labels {
        Labels::new(vec![vec![0, 10], vec![0, 10], vec![1, 10], vec![2, 11]]).unwrap()
    }

    #[test]
    fn levels_count_from_the_coarsest() {
        let y = sop_like();
        assert_eq!(y.level(0, 1), 2);
        assert_eq!(y.level(0, 2), 1);
        assert_eq!(y.level(0, 3), 0);
        assert_eq!(y.level(0, 0), 2);
        // Stops at the first coarse mismatch even if a finer id coincides.
        assert_eq!(match_level(&[5, 1, 7], &[5, 2, 7]), 1);
    }

    #[test]
    fn rejects_bad_input_with_a_clear_message() {
        let e = Labels::new(vec![]).unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
        let e = Labels::new(vec![vec![1, 2], vec![3]])
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 1 has 1 levels"), "{e}");
        let e = Labels::new(vec![vec![1, 2], vec![1, 3]])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("class 1 at level 0") && e.contains("row 1"),
            "{e}"
        );
        let e = Labels::new(vec![vec![], vec![]]).unwrap_err().to_string();
        assert!(e.contains("no label column"), "{e}");
    }

    #[test]
    fn coarsen_and_select() {
        let y = sop_like();
        let c = y.coarsen(1).unwrap();
        assert_eq!(c.num_levels(), 1);
        assert_eq!(c.column(0), vec![10, 10, 10, 11]);
        let s = y.select(&[3, 0]).unwrap();
        assert_eq!(s.row(0), &[2, 11]);
        assert!(y.select(&[4]).is_err());
    }

    #[test]
    fn pop_relevance_divides_by_level_population() {
        // Query with 3 same-class items (4 with itself), 4 same-coarse, 10 negatives; L = 2.
        let counts = [10, 4, 3];
        let r = Relevance::Pop {
            alpha: 1.0,
            count_query: false,
        }
        .level_values(&counts);
        assert_eq!(r, vec![0.0, 0.5 / 4.0, 1.0 / 3.0]);
        let r = Relevance::Pop {
            alpha: 1.0,
            count_query: true,
        }
        .level_values(&counts);
        assert_eq!(r, vec![0.0, 0.5 / 4.0, 1.0 / 4.0]);
        let r = Relevance::Pop {
            alpha: 2.0,
            count_query: false,
        }
        .level_values(&counts);
        assert_eq!(r[1], 0.25 / 4.0);
    }

    #[test]
    fn weighted_ap_relevance_is_cumulative() {
        // L = 2, w = (0.25, 0.75); |Ω^{+,1}| = 7, |Ω^{+,2}| = 3.
        let r = Relevance::WeightedAp {
            weights: vec![0.25, 0.75],
        }
        .level_values(&[10, 4, 3]);
        assert!((r[1] - 0.25 / 7.0).abs() < 1e-15);
        assert!((r[2] - (0.25 / 7.0 + 0.75 / 3.0)).abs() < 1e-15);
        // The relevances of all positives sum to Σ w = 1 (HAPPIER Eq. 37).
        let total = 4.0 * r[1] + 3.0 * r[2];
        assert!((total - 1.0).abs() < 1e-12);
    }

    #[test]
    fn relevance_validation() {
        assert!(Relevance::WeightedAp { weights: vec![1.0] }
            .validate(2)
            .is_err());
        assert!(Relevance::WeightedAp {
            weights: vec![1.0, -1.0]
        }
        .validate(2)
        .is_err());
        assert!(Relevance::default().validate(3).is_ok());
        assert!(Relevance::Level { alpha: f64::NAN }.validate(3).is_err());
    }
}

//! Class-disjoint splits of a labelled set: the retrieval train/test split (SOP, CUB, Cars style)
//! and the few-shot base/validation/novel split (CIFAR-FS, mini-ImageNet style).

use crate::error::{Error, Result};
use crate::hierarchy::{ClassId, Labels};
use crate::samplers::stream_rng;
use rand::seq::SliceRandom;
use std::collections::{BTreeMap, BTreeSet};

/// A class-disjoint retrieval split: item indices and fine classes of each side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrievalSplit {
    /// Items of the training classes, in increasing order.
    pub train: Vec<usize>,
    /// Items of the test classes, in increasing order.
    pub test: Vec<usize>,
    /// Fine classes (level 0) of the training side, increasing.
    pub train_classes: Vec<ClassId>,
    /// Fine classes of the test side, increasing.
    pub test_classes: Vec<ClassId>,
}

/// Splits the fine classes in two, like CUB ("first 100 species train, last 100 test"), but
/// within each class of `group_level`: each group's fine classes, in increasing id order, go
/// first half (rounded down) to training and the rest to test, so every group of that level (and
/// every coarser class) appears on both sides while no fine class does.
///
/// `group_level = num_levels` (one past the coarsest) splits all fine classes globally.
/// Errors when the level is out of range, or a group has a single fine class (it cannot be on
/// both sides; the error names it).
pub fn retrieval_split(labels: &Labels, group_level: usize) -> Result<RetrievalSplit> {
    if group_level == 0 || group_level > labels.num_levels() {
        return Err(Error::invalid(
            "group_level",
            format!(
                "must be in 1..={} (a level coarser than the fine class, or {} for a global \
                 split), got {group_level}",
                labels.num_levels(),
                labels.num_levels()
            ),
        ));
    }
    let fine = labels.column(0);
    let mut groups: BTreeMap<ClassId, BTreeSet<ClassId>> = BTreeMap::new();
    for (i, &f) in fine.iter().enumerate() {
        let group = if group_level == labels.num_levels() {
            0
        } else {
            labels.row(i)[group_level]
        };
        groups.entry(group).or_default().insert(f);
    }
    let mut train_classes = BTreeSet::new();
    for (group, classes) in &groups {
        if classes.len() < 2 {
            return Err(Error::invalid(
                "group_level",
                format!(
                    "class {group} at level {group_level} has a single fine class, which cannot \
                     be on both sides of a class-disjoint split"
                ),
            ));
        }
        train_classes.extend(classes.iter().take(classes.len() / 2).copied());
    }
    let (train, test): (Vec<usize>, Vec<usize>) =
        (0..labels.len()).partition(|&i| train_classes.contains(&fine[i]));
    let all: BTreeSet<ClassId> = fine.iter().copied().collect();
    Ok(RetrievalSplit {
        train,
        test,
        test_classes: all.difference(&train_classes).copied().collect(),
        train_classes: train_classes.into_iter().collect(),
    })
}

/// Fractions of the fine classes in the few-shot base / validation / novel splits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FewShotFractions {
    /// Base (meta-training) classes.
    pub base: f64,
    /// Validation classes.
    pub val: f64,
    /// Novel (test) classes: the remainder `1 − base − val`.
    pub novel: f64,
}

impl Default for FewShotFractions {
    /// CIFAR-FS and mini-ImageNet: 64 / 16 / 20 classes out of 100.
    fn default() -> Self {
        FewShotFractions {
            base: 0.64,
            val: 0.16,
            novel: 0.20,
        }
    }
}

/// A class-disjoint few-shot split: item indices and fine classes of each part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FewShotSplit {
    /// Items of the base classes, increasing.
    pub base: Vec<usize>,
    /// Items of the validation classes, increasing.
    pub val: Vec<usize>,
    /// Items of the novel classes, increasing.
    pub novel: Vec<usize>,
    /// Base classes, increasing.
    pub base_classes: Vec<ClassId>,
    /// Validation classes, increasing.
    pub val_classes: Vec<ClassId>,
    /// Novel classes, increasing.
    pub novel_classes: Vec<ClassId>,
}

/// Splits the fine classes into base / validation / novel parts with the given fractions
/// (`round(n · base)` and `round(n · val)` classes, the rest novel), stratified by the coarsest
/// level: each coarsest class's fine classes are shuffled (seeded), the coarsest classes are
/// interleaved round-robin, and the interleaved list is cut in three. Every part therefore spreads
/// over the coarsest classes as evenly as the counts allow.
///
/// Errors when the fractions are not non-negative and summing to 1 (±1e-9), or a part would be
/// empty.
pub fn few_shot_split(
    labels: &Labels,
    fractions: FewShotFractions,
    seed: u64,
) -> Result<FewShotSplit> {
    let FewShotFractions { base, val, novel } = fractions;
    if [base, val, novel]
        .iter()
        .any(|f| !f.is_finite() || *f < 0.0)
        || (base + val + novel - 1.0).abs() > 1e-9
    {
        return Err(Error::invalid(
            "fractions",
            format!("must be ≥ 0 and sum to 1, got {base} / {val} / {novel}"),
        ));
    }
    let coarse_level = labels.num_levels() - 1;
    let mut by_coarse: BTreeMap<ClassId, BTreeSet<ClassId>> = BTreeMap::new();
    for i in 0..labels.len() {
        by_coarse
            .entry(labels.row(i)[coarse_level])
            .or_default()
            .insert(labels.fine(i));
    }
    let mut rng = stream_rng(seed, 0);
    let mut lists: Vec<Vec<ClassId>> = by_coarse
        .into_values()
        .map(|classes| {
            let mut v: Vec<ClassId> = classes.into_iter().collect();
            v.shuffle(&mut rng);
            v
        })
        .collect();
    let order = round_robin(&mut lists);
    let n = order.len();
    let n_base = (n as f64 * base).round() as usize;
    let n_val = (n as f64 * val).round() as usize;
    if n_base == 0 || n_val == 0 || n_base + n_val >= n {
        return Err(Error::invalid(
            "fractions",
            format!(
                "{base} / {val} / {novel} of {n} fine classes gives an empty part \
                 ({n_base} / {n_val} / {})",
                n.saturating_sub(n_base + n_val)
            ),
        ));
    }
    let part = |classes: &[ClassId]| -> (Vec<usize>, Vec<ClassId>) {
        let set: BTreeSet<ClassId> = classes.iter().copied().collect();
        let items = (0..labels.len())
            .filter(|&i| set.contains(&labels.fine(i)))
            .collect();
        (items, set.into_iter().collect())
    };
    let (base_items, base_classes) = part(&order[..n_base]);
    let (val_items, val_classes) = part(&order[n_base..n_base + n_val]);
    let (novel_items, novel_classes) = part(&order[n_base + n_val..]);
    Ok(FewShotSplit {
        base: base_items,
        val: val_items,
        novel: novel_items,
        base_classes,
        val_classes,
        novel_classes,
    })
}

/// Interleaves lists: first elements of every list, then second elements, and so on.
fn round_robin(lists: &mut [Vec<ClassId>]) -> Vec<ClassId> {
    let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest)
        .flat_map(|k| lists.iter().filter_map(move |l| l.get(k).copied()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fine = 0..8, middle = fine / 2, coarse = fine / 4; two items per fine class.
    fn tree() -> Labels {
        let rows = (0..16)
            .map(|i| {
                let f = (i / 2) as ClassId;
                vec![f, 100 + f / 2, 200 + f / 4]
            })
            .collect();
        Labels::new(rows).unwrap()
    }

    #[test]
    fn retrieval_split_halves_each_group() {
        let y = tree();
        let s = retrieval_split(&y, 1).unwrap();
        assert_eq!(s.train_classes, vec![0, 2, 4, 6]);
        assert_eq!(s.test_classes, vec![1, 3, 5, 7]);
        assert_eq!(s.train, vec![0, 1, 4, 5, 8, 9, 12, 13]);
        let s = retrieval_split(&y, 2).unwrap();
        assert_eq!(s.train_classes, vec![0, 1, 4, 5]);
        let s = retrieval_split(&y, 3).unwrap();
        assert_eq!(s.train_classes, vec![0, 1, 2, 3]);
        assert!(retrieval_split(&y, 0).is_err());
        assert!(retrieval_split(&y, 4).is_err());
        let flat = Labels::from_fine(&[0, 1, 1]).unwrap();
        assert!(retrieval_split(&flat, 1).is_ok());
        let lone = Labels::new(vec![vec![0, 5], vec![1, 6], vec![2, 6]]).unwrap();
        let e = retrieval_split(&lone, 1).unwrap_err().to_string();
        assert!(e.contains("class 5 at level 1"), "{e}");
    }

    #[test]
    fn round_robin_interleaves() {
        let mut l = vec![vec![1, 2, 3], vec![10], vec![20, 21]];
        assert_eq!(round_robin(&mut l), vec![1, 10, 20, 2, 21, 3]);
    }

    #[test]
    fn few_shot_split_is_disjoint_and_complete() {
        let y = tree();
        let f = FewShotFractions {
            base: 0.5,
            val: 0.25,
            novel: 0.25,
        };
        let s = few_shot_split(&y, f, 3).unwrap();
        assert_eq!(
            (
                s.base_classes.len(),
                s.val_classes.len(),
                s.novel_classes.len()
            ),
            (4, 2, 2)
        );
        let mut all: Vec<ClassId> = [&s.base_classes, &s.val_classes, &s.novel_classes]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
        assert_eq!(s.base.len() + s.val.len() + s.novel.len(), 16);
        // Round-robin over the two coarse classes: each part has one of each at least.
        for part in [&s.base_classes, &s.val_classes, &s.novel_classes] {
            let coarse: BTreeSet<ClassId> = part.iter().map(|f| f / 4).collect();
            assert_eq!(coarse.len(), 2, "{part:?}");
        }
        assert_eq!(s, few_shot_split(&y, f, 3).unwrap());
        let bad = FewShotFractions {
            base: 0.5,
            val: 0.5,
            novel: 0.5,
        };
        assert!(few_shot_split(&y, bad, 0).is_err());
        let empty = FewShotFractions {
            base: 0.95,
            val: 0.05,
            novel: 0.0,
        };
        assert!(few_shot_split(&y, empty, 0).is_err());
    }
}

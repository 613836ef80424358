//! Invariants of every sampler, checked on every batch of several epochs and seeds.

use rankwise::hierarchy::{ClassId, Labels};
use rankwise::samplers::{
    BatchSampler, EpisodeConfig, EpisodeSampler, FastApConfig, FastApSampler, HierarchicalConfig,
    HierarchicalSampler, MPerClassConfig, MPerClassMode, MPerClassSampler, SamplerState,
};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// A 3-level hierarchy with uneven sizes: `supers` super-classes (level 2, ids 1000+), each with
/// 2 middle classes (ids 100+), each with a varying number of fine classes of varying sizes
/// (`min_size..min_size + 9` items). Items are interleaved across classes, like a real file list.
fn uneven_labels(supers: usize, min_size: usize) -> Labels {
    let mut rows = Vec::new();
    let mut fine = 0;
    for s in 0..supers {
        for m in 0..2 {
            let classes = 3 + (s * 7 + m * 3) % 5;
            for _ in 0..classes {
                let size = min_size + (fine * 5) % 9;
                for _ in 0..size {
                    rows.push(vec![
                        fine as ClassId,
                        (100 + 2 * s + m) as ClassId,
                        (1000 + s) as ClassId,
                    ]);
                }
                fine += 1;
            }
        }
    }
    // Deterministic interleaving: a fixed permutation of the rows.
    let n = rows.len();
    let stride = (1..n).find(|k| gcd(*k, n) == 1 && *k > n / 3).unwrap();
    let rows = (0..n).map(|i| rows[(i * stride) % n].clone()).collect();
    Labels::new(rows).unwrap()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn class_counts(labels: &Labels, batch: &[usize], level: usize) -> BTreeMap<ClassId, usize> {
    let mut counts = BTreeMap::new();
    for &i in batch {
        *counts.entry(labels.row(i)[level]).or_insert(0) += 1;
    }
    counts
}

fn has_duplicates(batch: &[usize]) -> bool {
    batch.iter().collect::<HashSet<_>>().len() != batch.len()
}

fn class_sizes(labels: &Labels, level: usize) -> BTreeMap<ClassId, usize> {
    class_counts(labels, &(0..labels.len()).collect::<Vec<_>>(), level)
}

/// Same seed and epoch → same batches; other epoch or seed → different batches.
fn check_reproducible<S: BatchSampler>(make: impl Fn(u64) -> S) {
    let a = make(5);
    assert_eq!(a.batches(3), make(5).batches(3));
    assert_ne!(a.batches(3), a.batches(4));
    assert_ne!(a.batches(3), make(6).batches(3));
    let state = SamplerState { seed: 5, epoch: 3 };
    assert_eq!(state.batches(&a).unwrap(), a.batches(3));
    assert_eq!(state.next().batches(&a).unwrap(), a.batches(4));
    assert!(SamplerState { seed: 6, epoch: 3 }.batches(&a).is_err());
    let json = serde_json::to_string(&state).unwrap();
    assert_eq!(serde_json::from_str::<SamplerState>(&json).unwrap(), state);
}

#[test]
fn m_per_class_epoch_invariants() {
    let labels = uneven_labels(4, 4);
    let sizes = class_sizes(&labels, 0);
    for shuffle_within_batch in [true, false] {
        let config = MPerClassConfig {
            batch_size: 24,
            samples_per_class: 4,
            level: 0,
            mode: MPerClassMode::Epoch {
                shuffle_within_batch,
            },
        };
        for seed in 0..3 {
            let sampler = MPerClassSampler::new(&labels, config.clone(), seed).unwrap();
            for epoch in 0..4 {
                let batches = sampler.batches(epoch);
                assert!(!batches.is_empty());
                let mut used = vec![0usize; labels.len()];
                for b in &batches {
                    assert_eq!(b.len(), 24);
                    assert!(!has_duplicates(b));
                    let counts = class_counts(&labels, b, 0);
                    assert_eq!(counts.len(), 6, "6 distinct classes per batch");
                    assert!(counts.values().all(|&c| c == 4));
                    if !shuffle_within_batch {
                        for chunk in b.chunks(4) {
                            let c = labels.fine(chunk[0]);
                            assert!(chunk.iter().all(|&i| labels.fine(i) == c));
                        }
                    }
                    for &i in b {
                        used[i] += 1;
                    }
                }
                // One pass without replacement...
                assert!(used.iter().all(|&u| u <= 1));
                // ...that stops only when fewer than 6 classes still have 4 unused items.
                let mut left: BTreeMap<ClassId, usize> = sizes.clone();
                for (i, &u) in used.iter().enumerate() {
                    *left.get_mut(&labels.fine(i)).unwrap() -= u;
                }
                assert!(left.values().filter(|&&l| l >= 4).count() < 6);
                // Leftovers are few: the epoch covers most of the data.
                let covered = used.iter().sum::<usize>() as f64 / labels.len() as f64;
                assert!(covered > 0.6, "covered {covered}");
            }
        }
        check_reproducible(|seed| MPerClassSampler::new(&labels, config.clone(), seed).unwrap());
    }
}

#[test]
fn m_per_class_shuffles_inside_batches_only_when_asked() {
    let labels = uneven_labels(4, 4);
    let config = MPerClassConfig {
        batch_size: 24,
        samples_per_class: 4,
        level: 0,
        mode: MPerClassMode::Epoch {
            shuffle_within_batch: true,
        },
    };
    let batches = MPerClassSampler::new(&labels, config, 1)
        .unwrap()
        .batches(0);
    let contiguous = batches.iter().all(|b| {
        b.chunks(4)
            .all(|c| c.iter().all(|&i| labels.fine(i) == labels.fine(c[0])))
    });
    assert!(!contiguous);
}

#[test]
fn m_per_class_with_replacement_invariants() {
    // Classes of 2..10 items with m = 4: small classes must be drawn with replacement.
    let labels = uneven_labels(3, 2);
    let sizes = class_sizes(&labels, 0);
    let config = MPerClassConfig {
        batch_size: 32,
        samples_per_class: 4,
        level: 0,
        mode: MPerClassMode::WithReplacement {
            batches_per_epoch: 25,
        },
    };
    let sampler = MPerClassSampler::new(&labels, config.clone(), 0).unwrap();
    let mut seen_classes = BTreeSet::new();
    for epoch in 0..3 {
        let batches = sampler.batches(epoch);
        assert_eq!(batches.len(), 25);
        for b in &batches {
            assert_eq!(b.len(), 32);
            let counts = class_counts(&labels, b, 0);
            assert_eq!(counts.len(), 8);
            assert!(counts.values().all(|&c| c == 4));
            for chunk in b.chunks(4) {
                let c = labels.fine(chunk[0]);
                assert!(chunk.iter().all(|&i| labels.fine(i) == c));
                // Repeats only inside a class smaller than m.
                if sizes[&c] >= 4 {
                    assert!(!has_duplicates(chunk));
                }
                seen_classes.insert(c);
            }
        }
    }
    assert_eq!(seen_classes.len(), sizes.len(), "every class is drawn");
    check_reproducible(|seed| MPerClassSampler::new(&labels, config.clone(), seed).unwrap());
}

#[test]
fn m_per_class_rejects_impossible_configurations() {
    let labels = uneven_labels(2, 4);
    let max = *class_sizes(&labels, 0).values().max().unwrap();
    let config = |batch_size, samples_per_class| MPerClassConfig {
        batch_size,
        samples_per_class,
        level: 0,
        mode: MPerClassMode::default(),
    };
    let e = MPerClassSampler::new(&labels, config(2 * (max + 1), max + 1), 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("samples_per_class") && e.contains("largest class"),
        "{e}"
    );
    let e = MPerClassSampler::new(&labels, config(10, 4), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch_size") && e.contains("multiple"), "{e}");
    let e = MPerClassSampler::new(&labels, config(4000, 4), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1000 classes"), "{e}");
    let mut c = config(8, 4);
    c.level = 3;
    let e = MPerClassSampler::new(&labels, c, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("level 3 does not exist"), "{e}");
    let mut c = config(64, 4);
    c.mode = MPerClassMode::WithReplacement {
        batches_per_epoch: 1,
    };
    c.batch_size = 4 * 1000;
    assert!(MPerClassSampler::new(&labels, c, 0).is_err());
}

#[test]
fn hierarchical_invariants() {
    // 5 super-classes, each with ≥ 6 fine classes of ≥ 4 items.
    let labels = uneven_labels(5, 4);
    let config = HierarchicalConfig {
        batch_size: 24,
        samples_per_class: 4,
        batches_per_super_pair: 3,
        super_classes_per_batch: 2,
        class_level: 0,
        super_level: 2,
        max_batches: None,
    };
    let sampler = HierarchicalSampler::new(&labels, config.clone(), 0).unwrap();
    assert_eq!(sampler.num_batches(), 10 * 3);
    assert_eq!(sampler.min_batch_size(), 24);
    for epoch in 0..4 {
        let batches = sampler.batches(epoch);
        assert_eq!(batches.len(), 30);
        let mut pairs: BTreeMap<Vec<ClassId>, usize> = BTreeMap::new();
        let mut classes_seen = BTreeSet::new();
        for b in &batches {
            assert_eq!(b.len(), 24);
            assert!(!has_duplicates(b), "classes are large enough: no repeat");
            let supers = class_counts(&labels, b, 2);
            assert_eq!(supers.len(), 2, "two super-classes per batch");
            assert!(supers.values().all(|&c| c == 12), "half a batch each");
            let fine = class_counts(&labels, b, 0);
            assert!(fine.values().all(|&c| c == 4));
            assert_eq!(fine.len(), 6);
            *pairs.entry(supers.keys().copied().collect()).or_default() += 1;
            classes_seen.extend(fine.keys().copied());
        }
        assert_eq!(pairs.len(), 10, "every pair of super-classes");
        assert!(pairs.values().all(|&c| c == 3));
        assert!(classes_seen.len() > class_sizes(&labels, 0).len() / 2);
    }
    check_reproducible(|seed| HierarchicalSampler::new(&labels, config.clone(), seed).unwrap());

    let restricted = HierarchicalConfig {
        max_batches: Some(7),
        ..config.clone()
    };
    let s = HierarchicalSampler::new(&labels, restricted, 0).unwrap();
    assert_eq!(s.batches(0).len(), 7);
    assert_eq!(s.num_batches(), 7);
}

#[test]
fn hierarchical_draws_small_classes_with_replacement_and_shortens_thin_parts() {
    // Classes of 2..10 items with 4 per class; the middle level has 3..7 classes per group.
    let labels = uneven_labels(3, 2);
    let sizes = class_sizes(&labels, 0);
    let config = HierarchicalConfig {
        batch_size: 64,
        samples_per_class: 4,
        batches_per_super_pair: 2,
        super_classes_per_batch: 2,
        class_level: 0,
        super_level: 1,
        max_batches: None,
    };
    let sampler = HierarchicalSampler::new(&labels, config, 3).unwrap();
    let mid_classes = {
        let mut m: BTreeMap<ClassId, BTreeSet<ClassId>> = BTreeMap::new();
        for i in 0..labels.len() {
            m.entry(labels.row(i)[1])
                .or_default()
                .insert(labels.fine(i));
        }
        m
    };
    assert_eq!(sampler.num_batches(), 15 * 2);
    let mut smallest = usize::MAX;
    for b in sampler.batches(0) {
        let halves = class_counts(&labels, &b, 1);
        assert_eq!(halves.len(), 2);
        for (mid, count) in halves {
            // A part holds min(8, classes of the group) classes.
            assert_eq!(count, 4 * mid_classes[&mid].len().min(8));
        }
        let fine = class_counts(&labels, &b, 0);
        assert!(fine.values().all(|&c| c == 4));
        for (c, _) in fine {
            let items: Vec<usize> = b.iter().copied().filter(|&i| labels.fine(i) == c).collect();
            if sizes[&c] >= 4 {
                assert!(!has_duplicates(&items));
            } else {
                assert!(has_duplicates(&items));
            }
        }
        smallest = smallest.min(b.len());
    }
    assert_eq!(smallest, sampler.min_batch_size());
    assert!(smallest < 64);
}

#[test]
fn hierarchical_rejects_impossible_configurations() {
    // One super-class at level 2.
    let labels = uneven_labels(1, 4);
    let one_super = HierarchicalConfig {
        super_level: 2,
        ..HierarchicalConfig::default()
    };
    let e = HierarchicalSampler::new(&labels, one_super, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("only 1"), "{e}");
    let labels = uneven_labels(3, 4);
    let bad_level = HierarchicalConfig {
        super_level: 0,
        ..HierarchicalConfig::default()
    };
    let e = HierarchicalSampler::new(&labels, bad_level, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("super_level") && e.contains("coarser"), "{e}");
    let bad_size = HierarchicalConfig {
        batch_size: 20,
        ..HierarchicalConfig::default()
    };
    let e = HierarchicalSampler::new(&labels, bad_size, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple") && e.contains("= 8"), "{e}");
}

#[test]
fn fastap_invariants() {
    // 4 meta-classes of 6..10 fine classes with 8..16 items: every meta-class has more than
    // half a batch, so halves never repeat an item.
    let labels = uneven_labels(4, 8);
    let config = FastApConfig {
        batch_size: 40,
        batches_per_meta_pair: 2,
        class_level: 0,
        meta_level: 2,
        shuffle_within_class: false,
    };
    let sampler = FastApSampler::new(&labels, config.clone(), 0).unwrap();
    assert_eq!(sampler.num_batches(), 6 * 2);
    let meta_sizes = class_sizes(&labels, 2);
    for epoch in 0..4 {
        let batches = sampler.batches(epoch);
        assert_eq!(batches.len(), 12);
        let mut pairs: BTreeMap<(ClassId, ClassId), usize> = BTreeMap::new();
        let mut drawn: BTreeMap<ClassId, Vec<usize>> = BTreeMap::new();
        for b in &batches {
            assert_eq!(b.len(), 40);
            assert!(!has_duplicates(b));
            let (first, second) = b.split_at(20);
            let m1 = labels.row(first[0])[2];
            let m2 = labels.row(second[0])[2];
            assert!(m1 < m2, "pairs are m1 < m2, first half from m1");
            assert!(first.iter().all(|&i| labels.row(i)[2] == m1));
            assert!(second.iter().all(|&i| labels.row(i)[2] == m2));
            *pairs.entry((m1, m2)).or_default() += 1;
            for half in [first, second] {
                // Classes are contiguous runs; inside a run, items keep the dataset order.
                let mut runs: Vec<ClassId> = Vec::new();
                for w in half.windows(2) {
                    if labels.fine(w[0]) == labels.fine(w[1]) {
                        assert!(w[0] < w[1], "dataset order inside a class");
                    }
                }
                for &i in half {
                    if runs.last() != Some(&labels.fine(i)) {
                        runs.push(labels.fine(i));
                    }
                }
                let distinct: BTreeSet<_> = runs.iter().collect();
                assert_eq!(
                    distinct.len(),
                    runs.len(),
                    "a class forms one run: {runs:?}"
                );
                drawn
                    .entry(labels.row(half[0])[2])
                    .or_default()
                    .extend_from_slice(half);
            }
        }
        assert_eq!(pairs.len(), 6);
        assert!(pairs.values().all(|&c| c == 2));
        // Each meta-class is read cyclically from a cursor: with 3 pairs × 2 batches × 20 items
        // drawn from it, every item of a meta-class of ≤ 120 items is covered.
        for (meta, items) in drawn {
            assert_eq!(items.len(), 120);
            let distinct: BTreeSet<_> = items.iter().collect();
            assert_eq!(distinct.len(), meta_sizes[&meta].min(120));
        }
    }
    check_reproducible(|seed| FastApSampler::new(&labels, config.clone(), seed).unwrap());
    let shuffled = FastApConfig {
        shuffle_within_class: true,
        ..config
    };
    let b = FastApSampler::new(&labels, shuffled, 0).unwrap().batches(0);
    let ordered = b.iter().all(|b| {
        b.windows(2)
            .all(|w| labels.fine(w[0]) != labels.fine(w[1]) || w[0] < w[1])
    });
    assert!(
        !ordered,
        "shuffle_within_class reorders items inside classes"
    );
}

#[test]
fn fastap_rejects_impossible_configurations() {
    let labels = uneven_labels(1, 4);
    let one_meta = FastApConfig {
        meta_level: 2,
        ..FastApConfig::default()
    };
    let e = FastApSampler::new(&labels, one_meta, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("only 1"), "{e}");
    let labels = uneven_labels(2, 4);
    let odd = FastApConfig {
        batch_size: 7,
        ..FastApConfig::default()
    };
    let e = FastApSampler::new(&labels, odd, 0).unwrap_err().to_string();
    assert!(e.contains("even"), "{e}");
}

#[test]
fn episode_invariants() {
    let labels = uneven_labels(3, 8);
    let config = EpisodeConfig {
        ways: 5,
        shots: 2,
        queries: 6,
        level: 0,
        shuffle_queries: true,
    };
    let sampler = EpisodeSampler::new(&labels, config.clone(), 11).unwrap();
    let mut class_sets = BTreeSet::new();
    for ep in sampler.episodes(0, 50) {
        assert_eq!(ep.classes.len(), 5);
        assert_eq!(ep.classes.iter().collect::<BTreeSet<_>>().len(), 5);
        assert_eq!(ep.support.len(), 10);
        assert_eq!(ep.query.len(), 30);
        let mut all = ep.support.clone();
        all.extend_from_slice(&ep.query);
        assert!(
            !has_duplicates(&all),
            "support and queries are distinct items"
        );
        for (items, labs, per) in [
            (&ep.support, &ep.support_labels, 2),
            (&ep.query, &ep.query_labels, 6),
        ] {
            assert_eq!(items.len(), labs.len());
            for (&i, &l) in items.iter().zip(labs) {
                assert_eq!(labels.fine(i), ep.classes[l], "relabelled class {l}");
            }
            for l in 0..5 {
                assert_eq!(labs.iter().filter(|&&x| x == l).count(), per);
            }
        }
        // Support stays class by class.
        assert_eq!(ep.support_labels, vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
        let mut sorted = ep.classes.clone();
        sorted.sort_unstable();
        class_sets.insert(sorted);
    }
    assert!(class_sets.len() > 40, "episodes draw different classes");
    assert_eq!(
        sampler.episode(7),
        EpisodeSampler::new(&labels, config.clone(), 11)
            .unwrap()
            .episode(7)
    );
    assert_ne!(sampler.episode(7), sampler.episode(8));
    assert_ne!(
        sampler.episode(7),
        EpisodeSampler::new(&labels, config.clone(), 12)
            .unwrap()
            .episode(7)
    );
    let ordered = EpisodeConfig {
        shuffle_queries: false,
        ..config
    };
    let ep = EpisodeSampler::new(&labels, ordered, 11)
        .unwrap()
        .episode(0);
    assert!(ep.query_labels.windows(2).all(|w| w[0] <= w[1]));
    let json = serde_json::to_string(&ep).unwrap();
    assert_eq!(
        serde_json::from_str::<rankwise::samplers::Episode>(&json).unwrap(),
        ep
    );
}

#[test]
fn episodes_reject_impossible_configurations() {
    let labels = uneven_labels(1, 8);
    let classes = class_sizes(&labels, 0).len();
    let too_many = EpisodeConfig {
        ways: classes + 1,
        ..EpisodeConfig::default()
    };
    let e = EpisodeSampler::new(&labels, too_many, 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ways") && e.contains(&format!("only {classes}")),
        "{e}"
    );
    let too_big = EpisodeConfig {
        ways: 2,
        shots: 5,
        queries: 15,
        ..EpisodeConfig::default()
    };
    let e = EpisodeSampler::new(&labels, too_big, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shots + queries = 20"), "{e}");
}

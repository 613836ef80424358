//! The chunked ranking engine against a plain one-shot computation.
//!
//! Embeddings are small integers and the similarity is the raw inner product, so every score is
//! exact in f32 and the reference ranking below (sort by decreasing score, then by index) is the
//! engine's ranking bit for bit — ties included, which are frequent with small integers.

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rankwise::hierarchy::{level_counts, Labels, Relevance};
use rankwise::metrics;
use rankwise::retrieval::dyml::{evaluate_dyml, DymlScale};
use rankwise::retrieval::{
    evaluate, evaluate_scores, knn, knn_with, EvalOptions, ScoreChunk, ScoreSource, SelfMatch,
    Similarity,
};

fn int_embeddings(rng: &mut ChaCha8Rng, n: usize, d: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|_| (0..d).map(|_| rng.random_range(-2i32..=2) as f32).collect())
        .collect()
}

fn tensor(rows: &[Vec<f32>]) -> Tensor {
    let d = rows[0].len();
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (rows.len(), d), &Device::Cpu).unwrap()
}

/// Three-level labels: fine classes of 1–4 items, 2 fine per middle, 2 middle per coarse.
fn hierarchical_labels(rng: &mut ChaCha8Rng, n: usize) -> Labels {
    let mut rows = Vec::new();
    let mut fine = 0i64;
    while rows.len() < n {
        let size = rng.random_range(1..=4);
        for _ in 0..size {
            if rows.len() < n {
                rows.push(vec![fine, 100 + fine / 2, 1000 + fine / 4]);
            }
        }
        fine += 1;
    }
    Labels::new(rows).unwrap()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The ranked levels of query `i`, computed plainly.
fn reference_ranking(
    q: &[f32],
    qi: usize,
    qlab: &Labels,
    refs: &[Vec<f32>],
    rlab: &Labels,
    skip_self: bool,
) -> Vec<u8> {
    let mut order: Vec<usize> = (0..refs.len())
        .filter(|&j| !(skip_self && j == qi))
        .collect();
    order.sort_by(|&a, &b| {
        dot(q, &refs[b])
            .partial_cmp(&dot(q, &refs[a]))
            .unwrap()
            .then(a.cmp(&b))
    });
    order
        .iter()
        .map(|&j| qlab.level_against(qi, rlab, j))
        .collect()
}

fn mean_of(values: impl Iterator<Item = Option<f64>>) -> (f64, usize) {
    let (mut s, mut c) = (0.0, 0);
    for v in values.flatten() {
        s += v;
        c += 1;
    }
    (s / c as f64, c)
}

#[test]
fn engine_equals_one_shot_computation_for_every_chunk_size() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let n = 97;
    let emb = int_embeddings(&mut rng, n, 6);
    let labels = hierarchical_labels(&mut rng, n);
    let x = tensor(&emb);
    let relevance = Relevance::Pop {
        alpha: 1.0,
        count_query: true,
    };
    let base = EvalOptions {
        recall_ks: vec![1, 4, 16],
        relevance: relevance.clone(),
        similarity: Similarity::InnerProduct,
        ..EvalOptions::default()
    };
    let ranked: Vec<Vec<u8>> = (0..n)
        .map(|i| reference_ranking(&emb[i], i, &labels, &emb, &labels, true))
        .collect();
    let first = evaluate(
        &x,
        &labels,
        None,
        &EvalOptions {
            chunk_size: 1,
            ..base.clone()
        },
    )
    .unwrap();
    for chunk in [7, 32, n, 1000] {
        let r = evaluate(
            &x,
            &labels,
            None,
            &EvalOptions {
                chunk_size: chunk,
                ..base.clone()
            },
        )
        .unwrap();
        assert_eq!(r.rows, first.rows, "chunk {chunk} differs from chunk 1");
    }
    assert_eq!(first.num_queries, n);
    assert_eq!(first.num_references, n - 1);

    let l = labels.num_levels();
    let m = first.rows.len();
    let check = |metric: &str, level: Option<usize>, f: &dyn Fn(&[u8]) -> Option<f64>| {
        let (expect, count) = mean_of(ranked.iter().map(|r| f(r)));
        let s = first
            .rows
            .iter()
            .position(|r| r.metric == metric && r.level == level)
            .unwrap_or_else(|| panic!("no row {metric} {level:?}"));
        let row = &first.rows[s];
        // Every query's value is the dense list's to the last bit: the engine ranks only the
        // positives of a row, and the metrics read them in the same order.
        for (q, r) in ranked.iter().enumerate() {
            let got = first.per_query[q * m + s];
            match f(r) {
                Some(v) => assert_eq!(got.to_bits(), v.to_bits(), "{metric} {level:?} query {q}"),
                None => assert!(got.is_nan(), "{metric} {level:?} query {q}: {got}"),
            }
        }
        assert_eq!(row.queries, count, "{metric} {level:?} count");
        assert_eq!(row.skipped, n - count, "{metric} {level:?} skipped");
        assert!(
            (row.value - expect).abs() < 1e-12,
            "{metric} {level:?}: engine {} vs one-shot {expect}",
            row.value
        );
    };
    check("H-AP", None, &|r| {
        metrics::h_ap(r, &relevance.level_values(&level_counts(r, l)))
    });
    check("ASI", None, &|r| metrics::asi(r, l));
    check("NDCG", None, &|r| metrics::ndcg(r));
    for c in 0..l {
        let min = (l - c) as u8;
        check("mAP", Some(c), &|r| metrics::average_precision(r, min));
        check("mAP@R", Some(c), &|r| metrics::map_at_r(r, min));
        check("R-precision", Some(c), &|r| metrics::r_precision(r, min));
        // Each column's binary ASI (the DyML protocol's per-scale ASI).
        check("ASI", Some(c), &|r| metrics::binary_asi(r, min));
        for k in [1, 4, 16] {
            check(&format!("R@{k}"), Some(c), &|r| {
                metrics::recall_at_k(r, min, k)
            });
            check(&format!("P@{k}"), Some(c), &|r| {
                metrics::precision_at_k(r, min, k)
            });
        }
    }
    // Some fine classes have a single item: those queries are lone at level 0 and skipped.
    let fine_map = first
        .rows
        .iter()
        .find(|r| r.metric == "mAP" && r.level == Some(0))
        .unwrap();
    assert!(fine_map.skipped > 0);
}

#[test]
fn separate_query_and_reference_sets() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let refs = int_embeddings(&mut rng, 60, 5);
    let rlab = hierarchical_labels(&mut rng, 60);
    let queries = int_embeddings(&mut rng, 13, 5);
    let qlab = hierarchical_labels(&mut rng, 13);
    let opts = EvalOptions {
        recall_ks: vec![1, 2],
        self_match: SelfMatch::None,
        similarity: Similarity::InnerProduct,
        chunk_size: 4,
        ..EvalOptions::default()
    };
    let r = evaluate(
        &tensor(&queries),
        &qlab,
        Some((&tensor(&refs), &rlab)),
        &opts,
    )
    .unwrap();
    assert_eq!(r.num_references, 60);
    let (expect, _) = mean_of((0..13).map(|i| {
        let ranked = reference_ranking(&queries[i], i, &qlab, &refs, &rlab, false);
        metrics::average_precision(&ranked, 3)
    }));
    assert!((r.get("mAP", Some(0)).unwrap() - expect).abs() < 1e-12);
}

#[test]
fn drop_first_removes_the_query_copy_like_pytorch_metric_learning() {
    // References contain a copy of every query (ref_includes_query); with DropFirst the results
    // must equal SameIndex on the same set, since the copy is each query's best hit.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let n = 40;
    // Distinct continuous embeddings: each query is strictly closest to itself under cosine.
    let emb: Vec<Vec<f32>> = (0..n)
        .map(|_| (0..8).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect();
    let labels = hierarchical_labels(&mut rng, n);
    let x = tensor(&emb);
    let same = evaluate(&x, &labels, None, &EvalOptions::default()).unwrap();
    let drop = evaluate(
        &x,
        &labels,
        Some((&x, &labels)),
        &EvalOptions {
            self_match: SelfMatch::DropFirst,
            ..EvalOptions::default()
        },
    )
    .unwrap();
    assert_eq!(same.rows, drop.rows);
}

#[test]
fn knn_equals_sorted_brute_force_with_ties() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let n = 50;
    let emb = int_embeddings(&mut rng, n, 3);
    let x = tensor(&emb);
    for (self_match, k) in [
        (SelfMatch::SameIndex, 10),
        (SelfMatch::None, 50),
        (SelfMatch::DropFirst, 5),
    ] {
        for chunk in [1, 16, 64] {
            let got = knn_with(
                &x,
                &x,
                k,
                self_match,
                chunk,
                Similarity::InnerProduct,
                &Device::Cpu,
                false,
            )
            .unwrap();
            for i in 0..n {
                let mut order: Vec<usize> = (0..n)
                    .filter(|&j| !(self_match == SelfMatch::SameIndex && j == i))
                    .collect();
                order.sort_by(|&a, &b| {
                    dot(&emb[i], &emb[b])
                        .partial_cmp(&dot(&emb[i], &emb[a]))
                        .unwrap()
                        .then(a.cmp(&b))
                });
                let skip = usize::from(self_match == SelfMatch::DropFirst);
                let expect: Vec<u32> = order[skip..skip + k].iter().map(|&j| j as u32).collect();
                assert_eq!(
                    got.neighbours(i),
                    &expect[..],
                    "query {i}, {self_match:?}, chunk {chunk}"
                );
                for (s, &j) in got.row_scores(i).iter().zip(&expect) {
                    assert_eq!(*s, dot(&emb[i], &emb[j as usize]));
                }
            }
        }
    }
}

#[test]
fn euclidean_ranking_equals_cosine_for_unit_vectors_and_differs_otherwise() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let emb: Vec<Vec<f32>> = (0..30)
        .map(|_| (0..4).map(|_| rng.random_range(-1.0f32..1.0)).collect())
        .collect();
    let x = tensor(&emb);
    let cos = knn(&x, &x, 5, SelfMatch::SameIndex, 8).unwrap();
    let x_unit = x
        .broadcast_div(&x.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap())
        .unwrap();
    let euc = knn_with(
        &x_unit,
        &x_unit,
        5,
        SelfMatch::SameIndex,
        8,
        Similarity::Euclidean,
        &Device::Cpu,
        false,
    )
    .unwrap();
    assert_eq!(cos.indices, euc.indices);
    // On raw vectors, Euclidean neighbours are the plain closest points.
    let raw = knn_with(
        &x,
        &x,
        1,
        SelfMatch::SameIndex,
        8,
        Similarity::Euclidean,
        &Device::Cpu,
        false,
    )
    .unwrap();
    for i in 0..30 {
        let d2 = |j: usize| -> f32 {
            emb[i]
                .iter()
                .zip(&emb[j])
                .map(|(a, b)| (a - b) * (a - b))
                .sum()
        };
        let best = (0..30)
            .filter(|&j| j != i)
            .min_by(|&a, &b| d2(a).partial_cmp(&d2(b)).unwrap())
            .unwrap();
        assert_eq!(raw.neighbours(i)[0] as usize, best);
    }
}

#[test]
fn bad_input_gives_clear_errors() {
    let labels = Labels::from_fine(&[0, 0, 1]).unwrap();
    let ok = Tensor::new(&[[1f32, 0.], [0., 1.], [1., 1.]], &Device::Cpu).unwrap();
    let opts = EvalOptions::default();
    let nan = Tensor::new(&[[1f32, 0.], [0., f32::NAN], [1., 1.]], &Device::Cpu).unwrap();
    let e = evaluate(&nan, &labels, None, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 1") && e.contains("NaN"), "{e}");
    let two = Labels::from_fine(&[0, 1]).unwrap();
    let e = evaluate(&ok, &two, None, &opts).unwrap_err().to_string();
    assert!(
        e.contains("3 query embeddings but 2 query label rows"),
        "{e}"
    );
    let other_dim = Tensor::new(&[[1f32, 0., 1.]], &Device::Cpu).unwrap();
    let one = Labels::from_fine(&[0]).unwrap();
    let e = evaluate(
        &other_dim,
        &one,
        Some((&ok, &labels)),
        &EvalOptions {
            self_match: SelfMatch::None,
            ..opts.clone()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("dimension 3") && e.contains("dimension 2"),
        "{e}"
    );
    let flat = Tensor::new(&[1f32, 2., 3.], &Device::Cpu).unwrap();
    assert!(evaluate(&flat, &labels, None, &opts).is_err());
    let e = knn(&ok, &ok, 3, SelfMatch::SameIndex, 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("between 1 and 2"), "{e}");
    let e = evaluate(
        &ok,
        &labels,
        None,
        &EvalOptions {
            chunk_size: 0,
            ..opts.clone()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("chunk_size"), "{e}");
    let hier = Labels::new(vec![vec![0, 1], vec![0, 1], vec![1, 1]]).unwrap();
    let e = evaluate(&ok, &hier, Some((&ok, &labels)), &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("levels"), "{e}");
}

#[test]
fn dyml_protocol_averages_the_scales() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut scales_data = Vec::new();
    for s in 0..3 {
        let q = int_embeddings(&mut rng, 10, 4);
        let g = int_embeddings(&mut rng, 30, 4);
        let ql: Vec<i64> = (0..10).map(|i| (i % (3 + s)) as i64).collect();
        let gl: Vec<i64> = (0..30).map(|i| (i % (3 + s)) as i64).collect();
        scales_data.push((
            q,
            Labels::from_fine(&ql).unwrap(),
            g,
            Labels::from_fine(&gl).unwrap(),
        ));
    }
    let tensors: Vec<(Tensor, Tensor)> = scales_data
        .iter()
        .map(|(q, _, g, _)| (tensor(q), tensor(g)))
        .collect();
    let scales: Vec<DymlScale> = scales_data
        .iter()
        .zip(&tensors)
        .enumerate()
        .map(|(i, ((_, ql, _, gl), (qt, gt)))| DymlScale {
            name: format!("scale{i}"),
            queries: qt,
            query_labels: ql,
            gallery: gt,
            gallery_labels: gl,
        })
        .collect();
    let opts = EvalOptions {
        similarity: Similarity::InnerProduct,
        ..EvalOptions::default()
    };
    let res = evaluate_dyml(&scales, &opts).unwrap();
    let mut maps = Vec::new();
    for (q, ql, g, gl) in &scales_data {
        let (m, _) = mean_of((0..q.len()).map(|i| {
            metrics::average_precision(&reference_ranking(&q[i], i, ql, g, gl, false), 1)
        }));
        maps.push(m);
    }
    for (r, m) in res.scales.iter().zip(&maps) {
        assert!((r.map - m).abs() < 1e-12);
    }
    assert!((res.map - maps.iter().sum::<f64>() / 3.0).abs() < 1e-12);
    assert!(res.asi > 0.0 && res.asi <= 1.0);
}

#[test]
fn knn_threshold_filter_is_exact_on_long_rows() {
    // Rows of ≥ 16,384 references take the sampled-threshold path; small integer embeddings make
    // ties frequent, so both the filter and the tie rule are exercised.
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let n = 20_000;
    let emb = int_embeddings(&mut rng, n, 4);
    let x = tensor(&emb);
    let q = x.narrow(0, 0, 20).unwrap();
    for (self_match, k) in [
        (SelfMatch::SameIndex, 100),
        (SelfMatch::None, 1),
        (SelfMatch::DropFirst, 700),
    ] {
        let got = knn_with(
            &q,
            &x,
            k,
            self_match,
            7,
            Similarity::InnerProduct,
            &Device::Cpu,
            false,
        )
        .unwrap();
        for i in 0..20 {
            let mut order: Vec<usize> = (0..n)
                .filter(|&j| !(self_match == SelfMatch::SameIndex && j == i))
                .collect();
            order.sort_by(|&a, &b| {
                dot(&emb[i], &emb[b])
                    .partial_cmp(&dot(&emb[i], &emb[a]))
                    .unwrap()
                    .then(a.cmp(&b))
            });
            let skip = usize::from(self_match == SelfMatch::DropFirst);
            let expect: Vec<u32> = order[skip..skip + k].iter().map(|&j| j as u32).collect();
            assert_eq!(got.neighbours(i), &expect[..], "query {i}, {self_match:?}");
        }
    }
}

/// Scores by brute force on the host, claiming to compute off the host so that the engine
/// takes its prefetching path (a device's path), and failing at `fail_at` if set.
struct OffHost {
    queries: Vec<Vec<f32>>,
    refs: Vec<Vec<f32>>,
    fail_at: Option<usize>,
    calls: std::sync::atomic::AtomicUsize,
}

impl ScoreSource for OffHost {
    fn num_queries(&self) -> usize {
        self.queries.len()
    }
    fn num_references(&self) -> usize {
        self.refs.len()
    }
    fn chunk_scores(
        &self,
        start: usize,
        len: usize,
        chunk: &mut ScoreChunk,
    ) -> rankwise::Result<()> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.fail_at == Some(start) {
            return Err(rankwise::Error::invalid(
                "source",
                format!("no scores for query {start}"),
            ));
        }
        let scores = self.queries[start..start + len]
            .iter()
            .flat_map(|q| self.refs.iter().map(move |r| dot(q, r)))
            .collect();
        chunk.set(scores);
        Ok(())
    }
    fn computes_off_host(&self) -> bool {
        true
    }
}

#[test]
fn a_source_computing_off_the_host_is_prefetched_with_the_same_results_and_errors() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let emb = int_embeddings(&mut rng, 70, 6);
    let labels = hierarchical_labels(&mut rng, 70);
    let opts = EvalOptions {
        recall_ks: vec![1, 4],
        self_match: SelfMatch::SameIndex,
        similarity: Similarity::InnerProduct,
        hierarchical: true,
        chunk_size: 8,
        ..EvalOptions::default()
    };
    let plain = evaluate(&tensor(&emb), &labels, None, &opts).unwrap();
    let source = |fail_at| OffHost {
        queries: emb.clone(),
        refs: emb.clone(),
        fail_at,
        calls: Default::default(),
    };
    let prefetched = source(None);
    let r = evaluate_scores(&prefetched, &labels, &labels, &opts).unwrap();
    // 70 queries in chunks of 8: 9 chunks, each computed once.
    assert_eq!(
        prefetched.calls.load(std::sync::atomic::Ordering::SeqCst),
        9
    );
    assert_eq!(r.rows.len(), plain.rows.len());
    for (a, b) in r.rows.iter().zip(&plain.rows) {
        assert_eq!((&a.metric, a.level), (&b.metric, b.level));
        assert_eq!(
            a.value.to_bits(),
            b.value.to_bits(),
            "{} at {:?}",
            a.metric,
            a.level
        );
    }
    assert_eq!(
        r.per_query.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        plain
            .per_query
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    );
    // An error of the source's third chunk stops the evaluation with that error, and no chunk
    // after it is computed beyond the one the channel may hold.
    let failing = source(Some(16));
    let err = evaluate_scores(&failing, &labels, &labels, &opts).unwrap_err();
    assert!(err.to_string().contains("no scores for query 16"), "{err}");
    assert_eq!(failing.calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}

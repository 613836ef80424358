//! Re-ranking baselines against a golden output of the reference algorithms (numpy, made by
//! `tests/fixtures/rerank/make_golden.py`; the same numbers as SSR's own `re_ranking_list` and
//! `test_ssr_QE.py` functions to ≤ 3e-7), and their evaluation through the metrics.

use candle_core::{Device, Tensor};
use rankwise::hierarchy::Labels;
use rankwise::rerank::k_reciprocal::KReciprocal;
use rankwise::rerank::query_expansion::QueryExpansion;
use rankwise::rerank::{CosineRanking, Reranker, TopN};
use rankwise::retrieval::EvalOptions;
use serde_json::Value;

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/rerank/k_reciprocal_golden.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn matrix(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

fn tensor(m: &[Vec<f64>]) -> Tensor {
    let flat: Vec<f32> = m.iter().flatten().map(|&v| v as f32).collect();
    Tensor::from_vec(flat, (m.len(), m[0].len()), &Device::Cpu).unwrap()
}

#[test]
fn k_reciprocal_matches_the_reference_on_a_fixed_matrix() {
    let g = golden();
    let (q_g, q_q, g_g) = (matrix(&g["q_g"]), matrix(&g["q_q"]), matrix(&g["g_g"]));
    let (nq, ng) = (q_g.len(), q_g[0].len());
    let flat = |m: &[Vec<f64>]| m.iter().flatten().copied().collect::<Vec<f64>>();
    let queries = tensor(&matrix(&g["queries"]));
    let references = tensor(&matrix(&g["references"]));
    for case in g["k_reciprocal"].as_array().unwrap() {
        let params = KReciprocal {
            k1: case["k1"].as_u64().unwrap() as usize,
            k2: case["k2"].as_u64().unwrap() as usize,
            lambda: case["lambda"].as_f64().unwrap(),
        };
        let want: Vec<f64> = flat(&matrix(&case["distances"]));
        let dense = params
            .distances_from_matrices(&flat(&q_g), &flat(&q_q), &flat(&g_g), nq, ng)
            .unwrap();
        let sparse = params
            .fit(&queries, Some(&references))
            .unwrap()
            .distances(0, nq)
            .unwrap();
        for (p, ((d, s), w)) in dense.iter().zip(&sparse).zip(&want).enumerate() {
            // The reference computes in float32.
            assert!(
                (d - w).abs() < 2e-6,
                "{params:?} entry {p}: dense {d} vs {w}"
            );
            assert!(
                (s - w).abs() < 2e-5,
                "{params:?} entry {p}: features {s} vs {w}"
            );
        }
    }
}

#[test]
fn query_expansion_matches_the_reference() {
    let g = golden();
    let queries = tensor(&matrix(&g["queries"]));
    let references = tensor(&matrix(&g["references"]));
    for case in g["query_expansion"].as_array().unwrap() {
        let k = case["k"].as_u64().unwrap() as usize;
        let qe = match case["method"].as_str().unwrap() {
            "aqe" => QueryExpansion::aqe(k),
            "aqewd" => QueryExpansion::aqe_with_decay(k),
            "dqe" => QueryExpansion::dqe(k),
            _ => QueryExpansion::alpha_qe(k),
        };
        let got = qe
            .expanded_queries(&queries, Some(&references))
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (a, b) in got
            .iter()
            .flatten()
            .zip(matrix(&case["queries"]).iter().flatten())
        {
            assert!((*a as f64 - b).abs() < 1e-5, "{qe:?}: {a} vs {b}");
        }
    }
}

/// Features of 12 classes × 6 items around random centres.
fn clustered() -> (Tensor, Labels) {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let normal = Normal::new(0.0f32, 1.0).unwrap();
    let (classes, per, dim) = (12, 6, 16);
    let centres: Vec<f32> = (0..classes * dim)
        .map(|_| normal.sample(&mut rng))
        .collect();
    let mut x = Vec::new();
    let mut y = Vec::new();
    for c in 0..classes {
        for _ in 0..per {
            for d in 0..dim {
                x.push(centres[c * dim + d] + 0.9 * normal.sample(&mut rng));
            }
            y.push(c as i64);
        }
    }
    (
        Tensor::from_vec(x, (classes * per, dim), &Device::Cpu).unwrap(),
        Labels::from_fine(&y).unwrap(),
    )
}

#[test]
fn k_reciprocal_with_lambda_one_is_the_cosine_ranking() {
    // λ = 1 keeps only the original distance, a decreasing function of the cosine along each
    // query's row: every metric equals the plain cosine ranking's.
    let (x, y) = clustered();
    let opts = EvalOptions::default();
    let base = CosineRanking::new(&x, None)
        .unwrap()
        .evaluate(&y, None, &opts)
        .unwrap();
    let kr = KReciprocal {
        lambda: 1.0,
        k1: 6,
        k2: 3,
    }
    .fit(&x, None)
    .unwrap();
    let same = kr.evaluate(&y, None, &opts).unwrap();
    for (a, b) in base.rows.iter().zip(&same.rows) {
        assert_eq!(a.metric, b.metric);
        assert!(
            (a.value - b.value).abs() < 1e-12,
            "{}: {} vs {}",
            a.metric,
            a.value,
            b.value
        );
    }
    // The re-ranked lists are proper rankings and can be cut to a top-N for SSR.
    let full = KReciprocal {
        k1: 6,
        k2: 3,
        lambda: 0.3,
    }
    .fit(&x, None)
    .unwrap();
    let top = TopN::from_reranker(&full, 10).unwrap();
    assert_eq!(top.num_queries(), 72);
    for i in 0..72 {
        assert!(!top.row_indices(i).contains(&(i as u32)));
        assert!(top.row_similarities(i).windows(2).all(|w| w[0] >= w[1]));
    }
    let report = full.evaluate(&y, None, &opts).unwrap();
    let map_r = report.rows.iter().find(|r| r.metric == "mAP@R").unwrap();
    assert!(map_r.value > 0.0 && map_r.value <= 1.0 && map_r.queries == 72);
    // And the QE re-ranker runs through the same evaluation.
    let qe = QueryExpansion::alpha_qe(3).fit(&x, None).unwrap();
    assert_eq!(qe.num_references(), 72);
    assert!(qe.evaluate(&y, None, &opts).is_ok());
}

//! Smooth-rank losses (Smooth-AP, SupAP/ROADMAP, HAPPIER): limits to the exact metrics, hand-worked
//! values, finite-difference gradients, chunked == unchunked, streaming == autograd, bad input.
//!
//! Every exact reference is computed plainly here, from the papers' formulas, on `Vec<f64>`.

use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rankwise::losses::cluster::ClusterLoss;
use rankwise::losses::happier::{HapLoss, Happier};
use rankwise::losses::roadmap::{Calibration, Roadmap, SupAp};
use rankwise::losses::smooth_ap::SmoothAp;
use rankwise::losses::smooth_rank::{
    ap_tensor, similarity_matrix, smooth_average_precision, Engine, PairSurrogates, RankProblem,
    EXCLUDED,
};
use rankwise::losses::surrogate::{Heaviside, LowerStep, Sigmoid, UpperStep};
use rankwise::losses::RankLoss;
use rankwise::{Labels, Relevance};

// ---------------------------------------------------------------------------------------------
// Helpers.

fn random_embeddings(b: usize, d: usize, seed: u64) -> Vec<f64> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..b * d)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect()
}

fn var(data: &[f64], b: usize, d: usize) -> Var {
    Var::from_vec(data.to_vec(), (b, d), &Device::Cpu).unwrap()
}

/// Loss value and its gradient with respect to the embeddings.
fn value_and_grad(loss: &dyn RankLoss, v: &Var, labels: &Labels) -> (f64, Vec<f64>) {
    let l = loss.forward(v.as_tensor(), labels).unwrap();
    let g = l.backward().unwrap();
    let grad = g
        .get(v.as_tensor())
        .map(|g| g.flatten_all().unwrap().to_vec1::<f64>().unwrap())
        .unwrap_or_else(|| vec![0.0; v.elem_count()]);
    (l.to_scalar::<f64>().unwrap(), grad)
}

fn value(loss: &dyn RankLoss, data: &[f64], b: usize, d: usize, labels: &Labels) -> f64 {
    let t = Tensor::from_vec(data.to_vec(), (b, d), &Device::Cpu).unwrap();
    loss.forward(&t, labels)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Cosine similarity matrix, plainly.
fn cosine(data: &[f64], b: usize, d: usize) -> Vec<Vec<f64>> {
    let norm: Vec<f64> = (0..b)
        .map(|i| {
            data[i * d..(i + 1) * d]
                .iter()
                .map(|x| x * x)
                .sum::<f64>()
                .sqrt()
        })
        .collect();
    (0..b)
        .map(|i| {
            (0..b)
                .map(|j| {
                    (0..d)
                        .map(|k| data[i * d + k] * data[j * d + k])
                        .sum::<f64>()
                        / (norm[i] * norm[j])
                })
                .collect()
        })
        .collect()
}

/// Hierarchical labels: `per_fine` items per fine class, `fine_per_mid` fine classes per
/// middle class, 2 middle classes per coarse class.
fn three_level_labels(b: usize, per_fine: usize, fine_per_mid: usize) -> Labels {
    let rows = (0..b)
        .map(|i| {
            let f = (i / per_fine) as i64;
            let m = f / fine_per_mid as i64;
            vec![f, 100 + m, 1000 + m / 2]
        })
        .collect();
    Labels::new(rows).unwrap()
}

/// Exact H-AP (HAPPIER Eq. 2–3) of one query: `list` = (score, level, relevance) of the items
/// of its retrieval set; ranks with the strict step (no ties in these tests).
fn exact_hap(list: &[(f64, u8, f64)]) -> Option<f64> {
    let z: f64 = list.iter().map(|x| x.2).sum();
    if z == 0.0 {
        return None;
    }
    let mut total = 0.0;
    for (k, &(sk, _, rk)) in list.iter().enumerate() {
        if rk == 0.0 {
            continue;
        }
        let mut rank = 1.0;
        let mut hrank = rk;
        for (j, &(sj, _, rj)) in list.iter().enumerate() {
            if j != k && sj > sk {
                rank += 1.0;
                hrank += rk.min(rj);
            }
        }
        total += hrank / rank;
    }
    Some(total / z)
}

/// Retrieval list of query `q` of a batch with in-batch relevance (Eq. 4 `pop`).
fn hap_list(
    sims: &[Vec<f64>],
    labels: &Labels,
    q: usize,
    include_self: bool,
    relevance: &Relevance,
) -> Vec<(f64, u8, f64)> {
    let l = labels.num_levels();
    let others: Vec<u8> = (0..labels.len())
        .filter(|&j| j != q)
        .map(|j| labels.level(q, j))
        .collect();
    let rel = relevance.level_values(&rankwise::hierarchy::level_counts(&others, l));
    (0..labels.len())
        .filter(|&j| include_self || j != q)
        .map(|j| {
            let lv = labels.level(q, j);
            (sims[q][j], lv, rel[lv as usize])
        })
        .collect()
}

/// `1 − mean exact H-AP` over the queries with a positive.
fn exact_hap_loss(
    data: &[f64],
    b: usize,
    d: usize,
    labels: &Labels,
    include_self: bool,
    relevance: &Relevance,
) -> f64 {
    let sims = cosine(data, b, d);
    let aps: Vec<f64> = (0..b)
        .filter_map(|q| exact_hap(&hap_list(&sims, labels, q, include_self, relevance)))
        .collect();
    1.0 - aps.iter().sum::<f64>() / aps.len() as f64
}

/// `1 − mean exact AP` (Smooth-AP Eq. 5 with the step) over the queries with a positive; positives
/// share the fine class.
fn exact_ap_loss(data: &[f64], b: usize, d: usize, labels: &Labels, include_self: bool) -> f64 {
    let flat = Labels::from_fine(&labels.column(0)).unwrap();
    let rel = Relevance::Level { alpha: 1.0 };
    let sims = cosine(data, b, d);
    let aps: Vec<f64> = (0..b)
        .filter_map(|q| exact_hap(&hap_list(&sims, &flat, q, include_self, &rel)))
        .collect();
    1.0 - aps.iter().sum::<f64>() / aps.len() as f64
}

/// Smallest `|s_qj − s_qk − b|` over all pairs and the given boundaries `b`: finite
/// differences are only valid away from the surrogates' jumps and kinks.
fn distance_to_kinks(data: &[f64], b: usize, d: usize, kinks: &[f64]) -> f64 {
    let s = cosine(data, b, d);
    let mut best = f64::INFINITY;
    for row in &s {
        for (k, sk) in row.iter().enumerate() {
            for (j, sj) in row.iter().enumerate() {
                if j != k {
                    for &kink in kinks {
                        best = best.min((sj - sk - kink).abs());
                    }
                }
            }
        }
    }
    best
}

fn assert_close(a: f64, b: f64, tol: f64, what: &str) {
    assert!(
        (a - b).abs() <= tol * b.abs().max(1.0),
        "{what}: {a} vs {b} (diff {:e})",
        (a - b).abs()
    );
}

fn assert_all_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-300);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: {x} vs {y} (scale {scale:e})"
        );
    }
}

/// Central finite differences of `loss` with respect to every embedding coordinate.
fn fd_grad(loss: &dyn RankLoss, data: &[f64], b: usize, d: usize, labels: &Labels) -> Vec<f64> {
    let h = 1e-6;
    (0..data.len())
        .map(|i| {
            let mut p = data.to_vec();
            p[i] += h;
            let up = value(loss, &p, b, d, labels);
            p[i] -= 2.0 * h;
            let down = value(loss, &p, b, d, labels);
            (up - down) / (2.0 * h)
        })
        .collect()
}

fn check_fd(loss: &dyn RankLoss, data: &[f64], b: usize, d: usize, labels: &Labels, what: &str) {
    let (_, g) = value_and_grad(loss, &var(data, b, d), labels);
    let fd = fd_grad(loss, data, b, d, labels);
    assert!(g.iter().any(|x| x.abs() > 1e-6), "{what}: zero gradient");
    assert_all_close(&g, &fd, 1e-6, what);
}

// ---------------------------------------------------------------------------------------------
// Limits to the exact metrics.

/// The limit surrogates of `H_s^<` and `H_s^>` (δ = 0, ρ = 0, offset 1; γ = 0, μ = 1) are the
/// exact step away from ties: with them the HAPPIER loss is exactly `1 − H-AP`.
fn exact_limit_hap(tau: f64) -> HapLoss {
    HapLoss {
        rank_lower: UpperStep {
            tau,
            rho: 0.0,
            delta: 0.0,
            start: 0.0,
            offset: Some(1.0),
            legacy_linear: false,
        },
        hrank_higher: LowerStep {
            gamma: 0.0,
            nu: 1.0,
            mu: 1.0,
            origin_in_leak: false,
        },
        ..HapLoss::default()
    }
}

#[test]
fn smooth_ap_tends_to_exact_ap() {
    let (b, d) = (24, 6);
    let labels = Labels::from_fine(&(0..b as i64).map(|i| i / 4).collect::<Vec<_>>()).unwrap();
    for seed in 0..3 {
        let data = random_embeddings(b, d, seed);
        assert!(distance_to_kinks(&data, b, d, &[0.0]) > 1e-5);
        for include_self in [false, true] {
            let exact = exact_ap_loss(&data, b, d, &labels, include_self);
            for engine in [Engine::Streaming, Engine::Autograd] {
                let loss = SmoothAp {
                    tau: 1e-8,
                    include_self,
                    engine,
                    ..SmoothAp::default()
                };
                let got = value(&loss, &data, b, d, &labels);
                assert_close(got, exact, 1e-13, "smooth-AP at τ → 0");
            }
            // At τ = 0.01 the smoothing is visible: the limit test is not vacuous.
            let smooth = value(
                &SmoothAp {
                    include_self,
                    ..SmoothAp::default()
                },
                &data,
                b,
                d,
                &labels,
            );
            assert!((smooth - exact).abs() > 1e-5, "{smooth} vs {exact}");
        }
    }
}

#[test]
fn hap_loss_with_limit_surrogates_is_one_minus_hap() {
    let (b, d) = (32, 5);
    let labels = three_level_labels(b, 4, 2);
    for seed in 10..13 {
        let data = random_embeddings(b, d, seed);
        assert!(distance_to_kinks(&data, b, d, &[0.0]) > 1e-5);
        for (include_self, count_query) in [(false, false), (true, true), (false, true)] {
            let relevance = Relevance::Pop {
                alpha: 1.0,
                count_query,
            };
            let exact = exact_hap_loss(&data, b, d, &labels, include_self, &relevance);
            for with_hrank in [false, true] {
                for engine in [Engine::Streaming, Engine::Autograd] {
                    let loss = HapLoss {
                        relevance: relevance.clone(),
                        include_self,
                        with_hrank,
                        engine,
                        ..exact_limit_hap(1e-8)
                    };
                    let got = value(&loss, &data, b, d, &labels);
                    assert_close(got, exact, 1e-13, "H-AP loss limit");
                }
            }
        }
    }
}

#[test]
fn sigmoid_baseline_tends_to_exact_hap() {
    // HAPPIER Table 5's "sigmoid baseline": a sigmoid in every step of rank and H-rank.
    let (b, d) = (20, 4);
    let labels = three_level_labels(b, 2, 3);
    let data = random_embeddings(b, d, 7);
    assert!(distance_to_kinks(&data, b, d, &[0.0]) > 1e-5);
    let relevance = Relevance::WeightedAp {
        weights: vec![0.2, 0.3, 0.5],
    };
    let exact = exact_hap_loss(&data, b, d, &labels, false, &relevance);
    let scores = similarity_matrix(
        &Tensor::from_vec(data.clone(), (b, d), &Device::Cpu).unwrap(),
        true,
    )
    .unwrap();
    let problem = RankProblem::hierarchical(&labels, false, &relevance).unwrap();
    let sur = PairSurrogates::uniform(Sigmoid { tau: 1e-9 }.into());
    for engine in [Engine::Streaming, Engine::Autograd] {
        let ap = smooth_average_precision(&scores, &problem, &sur, engine, Some(3)).unwrap();
        let got = ap.mean_loss().unwrap().to_scalar::<f64>().unwrap();
        assert_close(got, exact, 1e-13, "sigmoid H-AP at τ → 0");
    }
}

#[test]
fn paper_surrogates_give_upper_bounds_of_the_exact_losses() {
    // H_s^< ≥ H and H_s^> ≤ H, so L^s_{H-AP} ≥ 1 − H-AP and SupAP ≥ 1 − AP (HAPPIER §3.2).
    let (b, d) = (32, 8);
    let labels = three_level_labels(b, 4, 2);
    for seed in 20..25 {
        let data = random_embeddings(b, d, seed);
        let relevance = HapLoss::default().relevance;
        let exact = exact_hap_loss(&data, b, d, &labels, false, &relevance);
        let smooth = value(&HapLoss::default(), &data, b, d, &labels);
        assert!(smooth >= exact, "{smooth} < {exact}");
        let exact_ap = exact_ap_loss(&data, b, d, &labels, false);
        let sup = value(&SupAp::default(), &data, b, d, &labels);
        assert!(sup >= exact_ap, "{sup} < {exact_ap}");
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-worked values.

fn one_query_ap(scores: Vec<f64>, levels: Vec<u8>, rel: Vec<f64>, sur: &PairSurrogates) -> f64 {
    let n = scores.len();
    let l = rel.len() - 1;
    let problem = RankProblem::new(1, n, l, levels, rel).unwrap();
    let s = Tensor::from_vec(scores, (1, n), &Device::Cpu).unwrap();
    let mut out = Vec::new();
    for engine in [Engine::Streaming, Engine::Autograd] {
        let ap = smooth_average_precision(&s, &problem, sur, engine, None).unwrap();
        out.push(ap.ap.to_vec1::<f64>().unwrap()[0]);
    }
    assert_close(out[0], out[1], 1e-15, "engines");
    out[0]
}

#[test]
fn smooth_ap_paper_example_ranking() {
    // Smooth-AP §B.1.6: scores in ranked order (s0 s4 s1 s2 s5 s6 s7 s3), labels 1 0 1 1 0 0 0 1;
    // positives at ranks 1, 3, 4, 8: AP = (1 + 2/3 + 3/4 + 4/8) / 4 = 0.729167.
    let scores: Vec<f64> = (0..8).map(|i| 0.9 - 0.2 * i as f64).collect();
    let levels = vec![1, 0, 1, 1, 0, 0, 0, 1];
    let sur = PairSurrogates::uniform(Sigmoid { tau: 1e-6 }.into());
    let ap = one_query_ap(scores, levels, vec![0.0, 1.0], &sur);
    assert_close(ap, (1.0 + 2.0 / 3.0 + 0.75 + 0.5) / 4.0, 1e-15, "AP");
    assert!((ap - 0.729167).abs() < 5e-7);
}

#[test]
fn hap_figure_8_vectors() {
    // HAPPIER Fig. 8 (digest §A.2.3): raw level weights rel = l/3 (L = 3), ranked lists
    // rel = [2/3, 1, 0, 1/3, 1] → H-AP = 47/60 and [1/3, 1, 0, 1/3, 1] → 107/160. By hand, top:
    // H-rank = 2/3, 1 + 2/3, –, 1/3·3, 1 + 2/3 + 1 + 1/3 over ranks 1, 2, 4, 5 → (2/3 + 5/6 +
    // 1/4 + 3/5) / 3 = 47/60. Binary AP of the rel-1 items (ranks 2 and 5) is 0.45 for both.
    let scores: Vec<f64> = (0..5).map(|i| 0.8 - 0.3 * i as f64).collect();
    let rel = vec![0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0];
    let exact = PairSurrogates::uniform(Heaviside::default().into());
    let limit = exact_limit_hap(1e-9).surrogates();
    for sur in [&exact, &limit] {
        let top = one_query_ap(scores.clone(), vec![2, 3, 0, 1, 3], rel.clone(), sur);
        assert_close(top, 47.0 / 60.0, 1e-15, "top");
        let bottom = one_query_ap(scores.clone(), vec![1, 3, 0, 1, 3], rel.clone(), sur);
        assert_close(bottom, 107.0 / 160.0, 1e-15, "bottom");
        let binary = one_query_ap(scores.clone(), vec![0, 1, 0, 0, 1], vec![0.0, 1.0], sur);
        assert_close(binary, 0.45, 1e-15, "binary AP");
    }
    // Fig. 3: a "Lada" (2/3) then the "Lada #2" query's own model (1): H-rank(2) = 1 + 2/3,
    // so the ratio at rank 2 is 5/6; a generic car (1/3) instead gives 4/3 / 2 = 2/3.
    let lada = one_query_ap(scores[..2].to_vec(), vec![2, 3], rel.clone(), &exact);
    assert_close(
        lada,
        (2.0 / 3.0 + 5.0 / 6.0) / (5.0 / 3.0),
        1e-15,
        "Fig. 3 Lada",
    );
    let car = one_query_ap(scores[..2].to_vec(), vec![1, 3], rel.clone(), &exact);
    assert_close(
        car,
        (1.0 / 3.0 + 2.0 / 3.0) / (4.0 / 3.0),
        1e-15,
        "Fig. 3 car",
    );
}

#[test]
fn include_self_reproduces_the_authors_convention_by_hand() {
    // Four unit vectors at 0°, 60°, 20°, 180°; classes A A B B. Exact ranking (τ → 0).
    //   query 0 (A): s = [1, .5, .940, −1]. Paper: list (2:B .94, 1:A .5, 3:B −1) → the
    //     positive is 2nd → AP 1/2. Code: the query itself (s = 1) leads: 0, 2, 1, 3 →
    //     positives at ranks 1 and 3 → (1/1 + 2/3) / 2 = 5/6.
    //   query 1 (A): s = [.5, 1, .766, −.5]. Paper: 2, 0, 3 → 1/2. Code: 1, 2, 0, 3 → 5/6.
    //   query 2 (B): s = [.940, .766, 1, −.940]. Paper: 0, 1, 3 → positive 3rd → 1/3.
    //     Code: 2, 0, 1, 3 → (1 + 2/4) / 2 = 3/4.
    //   query 3 (B): s = [−1, −.5, −.940, 1]. Paper: 1, 2, 0 → 1/2. Code: 3, 1, 2, 0 → 5/6.
    // Paper loss = 1 − (1/2 + 1/2 + 1/3 + 1/2)/4 = 13/24; code loss = 1 − (5/6·3 + 3/4)/4 = 3/16.
    let deg: [f64; 4] = [0.0, 60.0, 20.0, 180.0];
    let data: Vec<f64> = deg
        .iter()
        .flat_map(|a| [a.to_radians().cos(), a.to_radians().sin()])
        .collect();
    let labels = Labels::from_fine(&[0, 0, 1, 1]).unwrap();
    for engine in [Engine::Streaming, Engine::Autograd] {
        let paper = SmoothAp {
            tau: 1e-7,
            engine,
            ..SmoothAp::default()
        };
        assert_close(
            value(&paper, &data, 4, 2, &labels),
            13.0 / 24.0,
            1e-14,
            "paper",
        );
        let code = SmoothAp {
            tau: 1e-7,
            engine,
            ..SmoothAp::authors_code()
        };
        assert_close(
            value(&code, &data, 4, 2, &labels),
            3.0 / 16.0,
            1e-14,
            "code",
        );
        // SupAP's exact rank⁺ and H_s^< → H give the same exact values.
        let sup = SupAp {
            rank_lower: exact_limit_hap(1e-7).rank_lower,
            include_self: true,
            engine,
            ..SupAp::default()
        };
        assert_close(
            value(&sup, &data, 4, 2, &labels),
            3.0 / 16.0,
            1e-14,
            "SupAP code",
        );
    }
}

#[test]
fn hap_with_one_level_is_sup_ap() {
    // With L = 1 the H-AP loss has the same pairs and surrogates as SupAP (digest Part C).
    let (b, d) = (16, 5);
    let labels = Labels::from_fine(&(0..b as i64).map(|i| i / 4).collect::<Vec<_>>()).unwrap();
    let data = random_embeddings(b, d, 3);
    for include_self in [false, true] {
        let hap = HapLoss {
            include_self,
            relevance: Relevance::Pop {
                alpha: 1.0,
                count_query: include_self,
            },
            ..HapLoss::default()
        };
        let sup = SupAp {
            include_self,
            ..SupAp::default()
        };
        let (a, ga) = value_and_grad(&hap, &var(&data, b, d), &labels);
        let (s, gs) = value_and_grad(&sup, &var(&data, b, d), &labels);
        assert_close(a, s, 1e-14, "value");
        assert_all_close(&ga, &gs, 1e-12, "gradient");
    }
}

#[test]
fn smooth_ap_accepts_any_label_order_and_group_sizes() {
    // Unequal, interleaved classes; the loss is invariant to the order of the batch.
    let (b, d) = (15, 6);
    let fine: Vec<i64> = vec![3, 1, 3, 2, 1, 1, 7, 3, 2, 1, 7, 3, 2, 2, 1];
    let labels = Labels::from_fine(&fine).unwrap();
    let data = random_embeddings(b, d, 4);
    let loss = SmoothAp::default();
    let v = value(&loss, &data, b, d, &labels);
    let perm: Vec<usize> = vec![14, 2, 7, 0, 9, 11, 3, 5, 1, 13, 4, 6, 12, 8, 10];
    let pdata: Vec<f64> = perm
        .iter()
        .flat_map(|&i| data[i * d..(i + 1) * d].to_vec())
        .collect();
    let plabels = Labels::from_fine(&perm.iter().map(|&i| fine[i]).collect::<Vec<_>>()).unwrap();
    assert_close(value(&loss, &pdata, b, d, &plabels), v, 1e-14, "permuted");
}

// ---------------------------------------------------------------------------------------------
// Finite-difference gradients (f64).

#[test]
fn finite_difference_gradients() {
    let (b, d) = (12, 5);
    let labels = three_level_labels(b, 2, 2);
    let tau = 0.1;
    // Jumps and kinks of the surrogates below, in t = s_j − s_k, and of the calibration loss in
    // s: finite differences are only valid away from them. Take the first seed that keeps
    // every pair 1e-4 away (deterministic).
    let kinks = [0.0, 0.05, 0.02, 50.0 * tau, -50.0 * tau];
    let margins = [0.5, -0.2];
    let data = (42..)
        .map(|seed| random_embeddings(b, d, seed))
        .find(|data| {
            let near_margin = cosine(data, b, d)
                .iter()
                .flatten()
                .any(|x| margins.iter().any(|m| (x - m).abs() < 1e-4));
            distance_to_kinks(data, b, d, &kinks) > 1e-4 && !near_margin
        })
        .unwrap();

    check_fd(
        &SmoothAp {
            tau,
            ..SmoothAp::default()
        },
        &data,
        b,
        d,
        &labels,
        "Smooth-AP",
    );
    check_fd(
        &SmoothAp {
            tau,
            ..SmoothAp::authors_code()
        },
        &data,
        b,
        d,
        &labels,
        "Smooth-AP (code)",
    );
    let upper = UpperStep {
        tau,
        ..UpperStep::default()
    };
    let hap = HapLoss {
        rank_lower: upper,
        ..HapLoss::default()
    };
    check_fd(&hap, &data, b, d, &labels, "H-AP (paper)");
    let code = HapLoss {
        rank_lower: UpperStep {
            tau,
            ..UpperStep::sop_code()
        },
        ..HapLoss::authors_code()
    };
    check_fd(&code, &data, b, d, &labels, "H-AP (code)");
    check_fd(
        &HapLoss {
            rank_lower: upper,
            ..HapLoss::happier_f(3.0)
        },
        &data,
        b,
        d,
        &labels,
        "H-AP (α = 3)",
    );
    let sup = SupAp {
        rank_lower: upper,
        ..SupAp::default()
    };
    check_fd(&sup, &data, b, d, &labels, "SupAP");
    let mut classes = labels.column(0);
    classes.dedup();
    let cluster = ClusterLoss::new(&classes, d, 5, DType::F64, &Device::Cpu).unwrap();
    check_fd(&cluster, &data, b, d, &labels, "clustering");
    check_fd(
        &Happier::new(hap, cluster.clone()),
        &data,
        b,
        d,
        &labels,
        "HAPPIER",
    );
    let calib = Calibration {
        pos_margin: margins[0],
        neg_margin: margins[1],
        ..Calibration::default()
    };
    check_fd(&calib, &data, b, d, &labels, "calibration");
    check_fd(
        &Roadmap {
            sup_ap: sup,
            calibration: calib,
            ..Roadmap::default()
        },
        &data,
        b,
        d,
        &labels,
        "ROADMAP",
    );
}

#[test]
fn clustering_loss_gradient_with_respect_to_the_proxies() {
    let (b, d) = (10, 4);
    let labels = Labels::from_fine(&(0..b as i64).map(|i| i % 3).collect::<Vec<_>>()).unwrap();
    let data = random_embeddings(b, d, 9);
    let emb = Tensor::from_vec(data, (b, d), &Device::Cpu).unwrap();
    let loss = ClusterLoss::new(&[0, 1, 2, 5], d, 11, DType::F64, &Device::Cpu).unwrap();
    let l = loss.forward(&emb, &labels).unwrap();
    let g = l.backward().unwrap();
    let g = g
        .get(loss.proxies().as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    let p0 = loss
        .proxies()
        .as_tensor()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    let h = 1e-6;
    for i in 0..p0.len() {
        let eval = |delta: f64| {
            let mut p = p0.clone();
            p[i] += delta;
            let v = Var::from_vec(p, (4, d), &Device::Cpu).unwrap();
            let l = ClusterLoss::with_proxies(&[0, 1, 2, 5], v).unwrap();
            l.forward(&emb, &labels)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        let fd = (eval(h) - eval(-h)) / (2.0 * h);
        assert!((fd - g[i]).abs() < 1e-7, "proxy {i}: {fd} vs {}", g[i]);
    }
    // Class 5 never occurs in the batch: its proxy only appears in the softmax denominators.
    assert!(g[3 * d..].iter().any(|x| x.abs() > 0.0));
}

#[test]
fn clustering_loss_matches_a_plain_softmax() {
    let (b, d) = (6, 3);
    let labels = Labels::from_fine(&[4, 4, 9, 9, 2, 4]).unwrap();
    let data = random_embeddings(b, d, 2);
    let classes = [2, 4, 9];
    let loss = ClusterLoss::new(&classes, d, 1, DType::F64, &Device::Cpu).unwrap();
    let p = loss.proxies().as_tensor().to_vec2::<f64>().unwrap();
    let unit = |v: &[f64]| {
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| x / n).collect::<Vec<_>>()
    };
    // Initialisation U(±1/√d).
    assert!(p
        .iter()
        .flatten()
        .all(|x| x.abs() <= 1.0 / (d as f64).sqrt()));
    let mut total = 0.0;
    for i in 0..b {
        let v = unit(&data[i * d..(i + 1) * d]);
        let logits: Vec<f64> = p
            .iter()
            .map(|row| unit(row).iter().zip(&v).map(|(a, b)| a * b).sum::<f64>() / 0.05)
            .collect();
        let y = classes.iter().position(|&c| c == labels.fine(i)).unwrap();
        let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
        total += lse - logits[y];
    }
    assert_close(
        value(&loss, &data, b, d, &labels),
        total / b as f64,
        1e-12,
        "NormSoftmax",
    );
    let happier = Happier::new(HapLoss::default(), loss.clone());
    let hap = value(&HapLoss::default(), &data, b, d, &labels);
    assert_close(
        value(&happier, &data, b, d, &labels),
        0.9 * hap + 0.1 * total / b as f64,
        1e-12,
        "(1 − λ) L_H-AP + λ L_clust",
    );
}

// ---------------------------------------------------------------------------------------------
// Chunked == unchunked, streaming == autograd == one plain candle graph.

/// Builds a loss for an engine and a query chunk.
type MakeLoss = Box<dyn Fn(Engine, Option<usize>) -> Box<dyn RankLoss>>;

fn smooth_rank_losses() -> Vec<(&'static str, MakeLoss)> {
    vec![
        (
            "Smooth-AP",
            Box::new(|engine, query_chunk| {
                Box::new(SmoothAp {
                    engine,
                    query_chunk,
                    ..SmoothAp::default()
                })
            }),
        ),
        (
            "Smooth-AP code",
            Box::new(|engine, query_chunk| {
                Box::new(SmoothAp {
                    engine,
                    query_chunk,
                    ..SmoothAp::authors_code()
                })
            }),
        ),
        (
            "H-AP paper",
            Box::new(|engine, query_chunk| {
                Box::new(HapLoss {
                    engine,
                    query_chunk,
                    ..HapLoss::default()
                })
            }),
        ),
        (
            "H-AP code",
            Box::new(|engine, query_chunk| {
                Box::new(HapLoss {
                    engine,
                    query_chunk,
                    ..HapLoss::authors_code()
                })
            }),
        ),
        (
            "SupAP",
            Box::new(|engine, query_chunk| {
                Box::new(SupAp {
                    engine,
                    query_chunk,
                    ..SupAp::authors_code()
                })
            }),
        ),
    ]
}

#[test]
fn chunked_equals_unchunked_and_engines_agree() {
    let (b, d) = (20, 8);
    let labels = three_level_labels(b, 2, 3);
    // Scale the embeddings so that many pairs fall in every piece of the surrogates at τ = 0.01.
    let data: Vec<f64> = random_embeddings(b, d, 77)
        .iter()
        .enumerate()
        .map(|(i, x)| if i % d == 0 { 6.0 + 0.3 * x } else { *x * 0.3 })
        .collect();
    for (name, make) in smooth_rank_losses() {
        let (v0, g0) = value_and_grad(
            make(Engine::Autograd, None).as_ref(),
            &var(&data, b, d),
            &labels,
        );
        assert!(g0.iter().any(|x| x.abs() > 0.0), "{name}: no gradient");
        for engine in [Engine::Autograd, Engine::Streaming] {
            for chunk in [Some(1), Some(3), Some(b), None] {
                let (v, g) =
                    value_and_grad(make(engine, chunk).as_ref(), &var(&data, b, d), &labels);
                let what = format!("{name} {engine:?} chunk {chunk:?}");
                assert_close(v, v0, 1e-14, &what);
                assert_all_close(&g, &g0, 1e-12, &what);
            }
        }
    }
}

#[test]
fn attached_jacobian_equals_one_candle_graph() {
    let (b, d) = (14, 6);
    let labels = three_level_labels(b, 2, 2);
    let data = random_embeddings(b, d, 5);
    let hap = HapLoss::default();
    let problem = RankProblem::hierarchical(&labels, false, &hap.relevance).unwrap();
    let run = |direct: bool| {
        let v = var(&data, b, d);
        let s = similarity_matrix(v.as_tensor(), true).unwrap();
        let ap = if direct {
            ap_tensor(&s, &problem, &hap.surrogates()).unwrap()
        } else {
            smooth_average_precision(&s, &problem, &hap.surrogates(), Engine::Streaming, Some(4))
                .unwrap()
                .ap
        };
        let g = ap.sum_all().unwrap().backward().unwrap();
        (
            ap.to_vec1::<f64>().unwrap(),
            g.get(v.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap(),
        )
    };
    let (a0, g0) = run(true);
    let (a1, g1) = run(false);
    assert_all_close(&a1, &a0, 1e-14, "per-query H-AP");
    assert_all_close(&g1, &g0, 1e-12, "gradient");
}

#[test]
fn f32_matches_f64() {
    let (b, d) = (64, 16);
    let labels = three_level_labels(b, 4, 2);
    let data = random_embeddings(b, d, 8);
    let t64 = Tensor::from_vec(data.clone(), (b, d), &Device::Cpu).unwrap();
    let t32 = t64.to_dtype(DType::F32).unwrap();
    let losses: Vec<Box<dyn RankLoss>> = vec![
        Box::new(SmoothAp::default()),
        Box::new(HapLoss::default()),
        Box::new(HapLoss::authors_code()),
        Box::new(SupAp::default()),
    ];
    for loss in &losses {
        let a = loss
            .forward(&t64, &labels)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        let l32 = loss.forward(&t32, &labels).unwrap();
        assert_eq!(l32.dtype(), DType::F32);
        let b32 = l32.to_scalar::<f32>().unwrap() as f64;
        assert!((a - b32).abs() < 1e-5, "{a} vs {b32}");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input.

#[test]
fn singleton_classes_are_left_out_and_documented() {
    let (b, d) = (6, 4);
    let labels = Labels::from_fine(&[0, 0, 1, 2, 2, 3]).unwrap();
    let data = random_embeddings(b, d, 1);
    let t = Tensor::from_vec(data.clone(), (b, d), &Device::Cpu).unwrap();
    let per = SmoothAp::default().per_query(&t, &labels).unwrap();
    assert_eq!(per.valid, vec![true, true, false, true, true, false]);
    let ap = per.ap.to_vec1::<f64>().unwrap();
    assert_eq!((ap[2], ap[5]), (0.0, 0.0));
    let expect = 1.0 - (ap[0] + ap[1] + ap[3] + ap[4]) / 4.0;
    let got = value(&SmoothAp::default(), &data, b, d, &labels);
    assert_close(got, expect, 1e-15, "mean over the queries with positives");
    let (_, g) = value_and_grad(&SmoothAp::default(), &var(&data, b, d), &labels);
    assert!(g.iter().all(|x| x.is_finite()));
    // With the query in its own positive set (authors' code), every query is valid.
    let per = SmoothAp::authors_code().per_query(&t, &labels).unwrap();
    assert!(per.valid.iter().all(|v| *v));
}

#[test]
fn a_batch_without_any_positive_is_an_error() {
    let (b, d) = (4, 3);
    let data = random_embeddings(b, d, 1);
    let t = Tensor::from_vec(data, (b, d), &Device::Cpu).unwrap();
    let singletons = Labels::from_fine(&[0, 1, 2, 3]).unwrap();
    for loss in [
        &SmoothAp::default() as &dyn RankLoss,
        &SupAp::default(),
        &HapLoss::default(),
    ] {
        let e = loss.forward(&t, &singletons).unwrap_err().to_string();
        assert!(e.contains("no query of the batch has a positive"), "{e}");
    }
    // Hierarchical: distinct coarse labels everywhere → no positive at any level.
    let unrelated = Labels::new((0..4).map(|i| vec![i, 10 + i]).collect()).unwrap();
    assert!(HapLoss::default().forward(&t, &unrelated).is_err());
    // Sharing only the coarse label is a positive (level 1) for H-AP.
    let coarse = Labels::new((0..4).map(|i| vec![i, 10]).collect()).unwrap();
    let v = HapLoss::default().forward(&t, &coarse).unwrap();
    assert!(v.to_scalar::<f64>().unwrap().is_finite());
}

#[test]
fn bad_embeddings_and_shapes_are_clear_errors() {
    let labels = Labels::from_fine(&[0, 0, 1, 1]).unwrap();
    let mut data = random_embeddings(4, 3, 1);
    data[7] = f64::NAN;
    let nan = Tensor::from_vec(data.clone(), (4, 3), &Device::Cpu).unwrap();
    let losses: Vec<Box<dyn RankLoss>> = vec![
        Box::new(SmoothAp::default()),
        Box::new(HapLoss::default()),
        Box::new(SupAp::default()),
        Box::new(Calibration::default()),
        Box::new(ClusterLoss::new(&[0, 1], 3, 0, DType::F64, &Device::Cpu).unwrap()),
    ];
    for loss in &losses {
        let e = loss.forward(&nan, &labels).unwrap_err().to_string();
        assert!(e.contains("row 2") && e.contains("NaN"), "{e}");
    }
    data[7] = 0.5;
    let short = Tensor::from_vec(data[..9].to_vec(), (3, 3), &Device::Cpu).unwrap();
    for loss in &losses {
        let e = loss.forward(&short, &labels).unwrap_err().to_string();
        assert!(e.contains("3 embeddings but 4 label rows"), "{e}");
    }
    let mut zero = data.clone();
    zero[3..6].fill(0.0);
    let zero = Tensor::from_vec(zero, (4, 3), &Device::Cpu).unwrap();
    let e = SmoothAp::default()
        .forward(&zero, &labels)
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 1 has zero norm"), "{e}");
    let ok = Tensor::from_vec(data, (4, 3), &Device::Cpu).unwrap();
    let e = SmoothAp {
        tau: -1.0,
        ..SmoothAp::default()
    }
    .forward(&ok, &labels)
    .unwrap_err()
    .to_string();
    assert!(e.contains("tau"), "{e}");
    let e = SmoothAp {
        query_chunk: Some(0),
        ..SmoothAp::default()
    }
    .forward(&ok, &labels)
    .unwrap_err()
    .to_string();
    assert!(e.contains("query_chunk"), "{e}");
    let other = Labels::from_fine(&[0, 0, 7, 1]).unwrap();
    let e = losses[4].forward(&ok, &other).unwrap_err().to_string();
    assert!(e.contains("row 2") && e.contains("class 7"), "{e}");
    let e = ClusterLoss::new(&[0, 0], 3, 0, DType::F64, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    let e = Happier {
        lambda: 1.5,
        ..Happier::new(
            HapLoss::default(),
            ClusterLoss::new(&[0, 1], 3, 0, DType::F64, &Device::Cpu).unwrap(),
        )
    }
    .forward(&ok, &labels)
    .unwrap_err()
    .to_string();
    assert!(e.contains("lambda"), "{e}");
    let e = HapLoss {
        relevance: Relevance::WeightedAp { weights: vec![1.0] },
        ..HapLoss::default()
    }
    .forward(&ok, &Labels::new(vec![vec![0, 1]; 4]).unwrap())
    .unwrap_err()
    .to_string();
    assert!(e.contains("weights"), "{e}");
}

#[test]
fn excluded_marker_is_not_a_level() {
    // A custom problem may leave any item out of a query's list.
    let p = RankProblem::new(1, 3, 1, vec![1, EXCLUDED, 0], vec![0.0, 1.0]).unwrap();
    let s = Tensor::new(&[[0.2f64, 0.9, 0.1]], &Device::Cpu).unwrap();
    let sur = PairSurrogates::uniform(Heaviside::default().into());
    let ap = smooth_average_precision(&s, &p, &sur, Engine::Streaming, None).unwrap();
    assert_eq!(ap.ap.to_vec1::<f64>().unwrap(), vec![1.0]);
}

//! Integration tests of FastAP, RaMBO and the baseline losses (contrastive, triplet, NSM, Σ),
//! in f64 on the CPU: independent reference implementations written with plain candle ops and
//! autograd, finite-difference gradients, chunked vs unchunked computation, hand-worked values
//! and bad input.

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rankwise::losses::blackbox_rank::{blackbox_rank, descending_ranks, RankUnits};
use rankwise::losses::contrastive::{Contrastive, PairReduction};
use rankwise::losses::fastap::{FastAp, FastApGradient};
use rankwise::losses::norm_softmax::NormSoftmax;
use rankwise::losses::pairwise_rows::PairMetric;
use rankwise::losses::proxy_nca::ProxyNca;
use rankwise::losses::proxy_nca_pp::ProxyNcaPp;
use rankwise::losses::rambo::{
    Averaging, MarginMode, Rambo, RamboObjective, RecallCount, RecallWeight, ScoreMemory,
};
use rankwise::losses::summed_levels::{LevelTerm, SummedLevels};
use rankwise::losses::triplet::{Triplet, TripletMining};
use rankwise::losses::RankLoss;
use rankwise::{Error, Labels};

const CPU: Device = Device::Cpu;

// ---------------------------------------------------------------------------------------------
// Helpers

fn gaussian(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.sample(StandardNormal)).collect()
}

/// Fine labels `class_of[i]`, and a two-level hierarchy with coarse class `fine / 2`.
fn flat(class_of: &[i64]) -> Labels {
    Labels::from_fine(class_of).unwrap()
}

fn two_level(class_of: &[i64]) -> Labels {
    Labels::new(class_of.iter().map(|&c| vec![c, 100 + c / 2]).collect()).unwrap()
}

/// Loss value and gradient with respect to the `b × d` embeddings `data`.
fn value_and_grad(loss: &dyn RankLoss, data: &[f64], d: usize, labels: &Labels) -> (f64, Vec<f64>) {
    let b = data.len() / d;
    let v = Var::from_vec(data.to_vec(), (b, d), &CPU).unwrap();
    let l = loss.forward(v.as_tensor(), labels).unwrap();
    let grads = l.backward().unwrap();
    let g = grads
        .get(&v)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    (l.to_scalar::<f64>().unwrap(), g)
}

fn value(loss: &dyn RankLoss, data: &[f64], d: usize, labels: &Labels) -> f64 {
    let b = data.len() / d;
    let t = Tensor::from_vec(data.to_vec(), (b, d), &CPU).unwrap();
    loss.forward(&t, labels)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Central finite differences over every coordinate against the autograd gradient.
fn check_finite_differences(
    loss: &dyn RankLoss,
    data: &[f64],
    d: usize,
    labels: &Labels,
    tol: f64,
) {
    let (_, grad) = value_and_grad(loss, data, d, labels);
    let eps = 1e-6;
    let mut worst: f64 = 0.0;
    for i in 0..data.len() {
        let mut plus = data.to_vec();
        let mut minus = data.to_vec();
        plus[i] += eps;
        minus[i] -= eps;
        let fd = (value(loss, &plus, d, labels) - value(loss, &minus, d, labels)) / (2.0 * eps);
        let err = (fd - grad[i]).abs() / grad[i].abs().max(1.0);
        worst = worst.max(err);
        assert!(
            err < tol,
            "coordinate {i}: finite difference {fd} vs gradient {}",
            grad[i]
        );
    }
    // The check must exercise something: the gradient is not identically zero.
    assert!(
        grad.iter().any(|g| g.abs() > 1e-6),
        "zero gradient; worst error {worst}"
    );
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// Values and gradients for several chunk sizes equal those of the unchunked computation.
fn check_chunking(
    make: impl Fn(Option<usize>) -> Box<dyn RankLoss>,
    data: &[f64],
    d: usize,
    labels: &Labels,
) {
    let (v0, g0) = value_and_grad(make(None).as_ref(), data, d, labels);
    for chunk in [1, 2, 3, 5, labels.len()] {
        let (v, g) = value_and_grad(make(Some(chunk)).as_ref(), data, d, labels);
        assert!((v - v0).abs() < 1e-13, "chunk {chunk}: value {v} vs {v0}");
        assert_close(&g, &g0, 1e-12, &format!("chunk {chunk} gradient"));
    }
}

fn normalized_rows(data: &[f64], d: usize) -> Vec<f64> {
    data.chunks(d)
        .flat_map(|r| {
            let n = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            r.iter().map(move |x| x / n).collect::<Vec<_>>()
        })
        .collect()
}

// A batch with 4 classes of 3 items and one singleton (class 9), D = 5.
const CLASSES: [i64; 13] = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 9];
const D: usize = 5;

fn batch(seed: u64) -> Vec<f64> {
    gaussian(CLASSES.len() * D, seed)
}

// ---------------------------------------------------------------------------------------------
// FastAP

/// pytorch-metric-learning's `FastAPLoss.compute_loss`, written literally with candle ops on the
/// dense `(L, B, B)` pulse tensor, differentiated by candle's autograd.
fn dense_fastap(e: &Tensor, class_of: &[i64], num_bins: usize) -> Tensor {
    let b = class_of.len();
    let norms = e.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
    let x = e.broadcast_div(&norms).unwrap();
    let dist = (x.matmul(&x.t().unwrap()).unwrap() * -2.0)
        .unwrap()
        .affine(1.0, 2.0)
        .unwrap();
    let mut ipos = vec![0.0; b * b];
    let mut ineg = vec![0.0; b * b];
    for i in 0..b {
        for j in 0..b {
            if i != j {
                if class_of[i] == class_of[j] {
                    ipos[i * b + j] = 1.0;
                } else {
                    ineg[i * b + j] = 1.0;
                }
            }
        }
    }
    let npos: Vec<f64> = ipos.chunks(b).map(|r| r.iter().sum()).collect();
    let ipos = Tensor::from_vec(ipos, (b, b), &CPU).unwrap();
    let ineg = Tensor::from_vec(ineg, (b, b), &CPU).unwrap();
    let delta = 4.0 / num_bins as f64;
    let (mut hpos, mut hneg) = (Vec::new(), Vec::new());
    for l in 0..=num_bins {
        let z = 4.0 * l as f64 / num_bins as f64;
        let pulse = ((dist.affine(1.0, -z).unwrap().abs().unwrap() / delta).unwrap() * -1.0)
            .unwrap()
            .affine(1.0, 1.0)
            .unwrap()
            .relu()
            .unwrap();
        hpos.push((&pulse * &ipos).unwrap().sum_keepdim(1).unwrap());
        hneg.push((&pulse * &ineg).unwrap().sum_keepdim(1).unwrap());
    }
    let hpos = Tensor::cat(&hpos, 1).unwrap(); // B × (L+1)
    let hneg = Tensor::cat(&hneg, 1).unwrap();
    let cum_pos = hpos.cumsum(1).unwrap();
    let cum_all = (&hpos + &hneg).unwrap().cumsum(1).unwrap();
    let num = (&hpos * &cum_pos).unwrap();
    let safe = num.gt(0.0).unwrap();
    let ones = num.ones_like().unwrap();
    let zeros = num.zeros_like().unwrap();
    let denom = safe.where_cond(&cum_all, &ones).unwrap();
    let terms = safe.where_cond(&(num / denom).unwrap(), &zeros).unwrap();
    // Keep the queries with a positive, as pml's `safe_N`.
    let valid: Vec<u32> = (0..b as u32).filter(|&i| npos[i as usize] > 0.0).collect();
    let idx = Tensor::new(valid.as_slice(), &CPU).unwrap();
    let n = Tensor::from_vec(
        valid.iter().map(|&i| npos[i as usize]).collect::<Vec<_>>(),
        valid.len(),
        &CPU,
    )
    .unwrap();
    let fastap = (terms.sum(1).unwrap().index_select(&idx, 0).unwrap() / n).unwrap();
    (fastap.mean_all().unwrap() * -1.0)
        .unwrap()
        .affine(1.0, 1.0)
        .unwrap()
}

#[test]
fn fastap_equals_a_plainly_written_dense_histogram_ap_in_value_and_gradient() {
    let data = batch(1);
    for num_bins in [10, 20, 3] {
        let v = Var::from_vec(data.clone(), (CLASSES.len(), D), &CPU).unwrap();
        let reference = dense_fastap(v.as_tensor(), &CLASSES, num_bins);
        let want_g = reference.backward().unwrap();
        let want_g = want_g
            .get(&v)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let want = reference.to_scalar::<f64>().unwrap();
        let loss = FastAp {
            num_bins,
            ..FastAp::default()
        };
        let (got, got_g) = value_and_grad(&loss, &data, D, &flat(&CLASSES));
        assert!(
            (got - want).abs() < 1e-13,
            "{num_bins} bins: {got} vs {want}"
        );
        assert_close(
            &got_g,
            &want_g,
            1e-11,
            "FastAP gradient vs autograd of the dense formula",
        );
    }
}

#[test]
fn fastap_is_the_exact_ap_when_every_distance_sits_on_a_bin_centre() {
    // Unit vectors at 0°, 60°, 180° and 240°: every pairwise squared distance is 1, 3 or 4
    // (cosines ±0.5, −1), distinct within each query's retrieval set, and a bin centre for
    // every num_bins divisible by 4. Each item then puts its whole mass in one bin, so FastAP is
    // the exact AP for every refinement of the histogram (bins → ∞).
    let h = 3f64.sqrt() / 2.0;
    let data = [1.0, 0.0, 0.5, h, -1.0, 0.0, -0.5, -h];
    let class_of = [0, 1, 1, 0];
    let labels = flat(&class_of);
    // Exact AP by sorting the squared distances 2 − 2s of each query.
    let mut want = 0.0;
    for q in 0..4 {
        let mut items: Vec<(f64, bool)> = (0..4)
            .filter(|&j| j != q)
            .map(|j| {
                let s = data[2 * q] * data[2 * j] + data[2 * q + 1] * data[2 * j + 1];
                (2.0 - 2.0 * s, class_of[j] == class_of[q])
            })
            .collect();
        items.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut hits, mut ap) = (0.0, 0.0);
        for (rank, &(_, pos)) in items.iter().enumerate() {
            if pos {
                hits += 1.0;
                ap += hits / (rank + 1) as f64;
            }
        }
        want += ap / hits / 4.0;
    }
    for num_bins in [4, 8, 64, 1024] {
        let loss = FastAp {
            num_bins,
            normalize: false,
            ..FastAp::default()
        };
        let got = 1.0 - value(&loss, &data, 2, &labels);
        assert!(
            (got - want).abs() < 1e-12,
            "{num_bins} bins: {got} vs {want}"
        );
    }
    // Off-centre distances (10 bins: centres at multiples of 0.4) give a different value.
    let got = 1.0
        - value(
            &FastAp {
                normalize: false,
                ..FastAp::default()
            },
            &data,
            2,
            &labels,
        );
    assert!((got - want).abs() > 1e-3, "{got} vs {want}");
}

#[test]
fn fastap_gradient_matches_finite_differences() {
    let data = batch(2);
    check_finite_differences(&FastAp::default(), &data, D, &flat(&CLASSES), 1e-6);
    let coarse = FastAp {
        num_bins: 4,
        ..FastAp::default()
    };
    check_finite_differences(
        &coarse,
        &data,
        D,
        &two_level(&CLASSES).coarsen(1).unwrap(),
        1e-6,
    );
}

#[test]
fn fastap_authors_port_gradient_is_n_over_two_times_the_true_one() {
    let data = normalized_rows(&batch(3), D);
    let labels = flat(&CLASSES);
    let exact = FastAp {
        normalize: false,
        ..FastAp::default()
    };
    let port = FastAp {
        gradient: FastApGradient::AuthorsPort,
        ..exact.clone()
    };
    let (v1, g1) = value_and_grad(&exact, &data, D, &labels);
    let (v2, g2) = value_and_grad(&port, &data, D, &labels);
    assert_eq!(v1, v2);
    // 12 queries have a positive (the singleton does not).
    let scaled: Vec<f64> = g1.iter().map(|g| g * 12.0 / 2.0).collect();
    assert_close(&g2, &scaled, 1e-12, "port gradient");
    // Without internal normalisation the inputs must be unit vectors.
    let e = Tensor::from_vec(batch(3), (CLASSES.len(), D), &CPU).unwrap();
    let err = exact.forward(&e, &labels).unwrap_err().to_string();
    assert!(err.contains("unit vectors"), "{err}");
}

#[test]
fn fastap_leaves_out_queries_without_positives() {
    // The singleton's query has no positive: it is left out of the mean rather than counted
    // as FastAP = 0 (pml's `safe_N`); the dense reference drops it explicitly.
    let data = batch(4);
    let got = value(&FastAp::default(), &data, D, &flat(&CLASSES));
    let t = Tensor::from_vec(data, (CLASSES.len(), D), &CPU).unwrap();
    let want = dense_fastap(&t, &CLASSES, 10).to_scalar::<f64>().unwrap();
    assert!(got.is_finite() && (got - want).abs() < 1e-13);
}

// ---------------------------------------------------------------------------------------------
// Contrastive

#[test]
fn contrastive_hand_worked_value() {
    // e0 = (1, 0), e1 = (0.6, 0.8), e2 = (0, 1); classes 0, 0, 1. Similarities: s01 = 0.6,
    // s02 = 0, s12 = 0.8. Margins 0.9 / 0.6: each ordered positive pair costs 0.3 → 0.3; the
    // negative pairs (1,2), (2,1) cost 0.2 and (0,2), (2,0) nothing → 0.2 over the non-zero ones
    // (0.1 over all four).
    let data = [1.0, 0.0, 0.6, 0.8, 0.0, 1.0];
    let labels = flat(&[0, 0, 1]);
    let got = value(&Contrastive::default(), &data, 2, &labels);
    assert!((got - 0.5).abs() < 1e-15, "{got}");
    let mean = Contrastive {
        reduction: PairReduction::Mean,
        ..Contrastive::default()
    };
    assert!((value(&mean, &data, 2, &labels) - 0.4).abs() < 1e-15);
    // pml's default: Euclidean, m⁺ = 0, m⁻ = 1. d01 = √0.8, d12 = √0.4 < 1 costs 1 − √0.4,
    // d02 = √2 costs nothing.
    let pml = value(&Contrastive::pml_default(), &data, 2, &labels);
    let want = 0.8f64.sqrt() + (1.0 - 0.4f64.sqrt());
    assert!((pml - want).abs() < 1e-15, "{pml} vs {want}");
}

#[test]
fn contrastive_gradient_matches_finite_differences() {
    let data = batch(5);
    let labels = flat(&CLASSES);
    for metric in [PairMetric::Cosine, PairMetric::Euclidean] {
        for reduction in [PairReduction::AvgNonZero, PairReduction::Mean] {
            let loss = Contrastive {
                metric,
                reduction,
                pos_margin: if metric == PairMetric::Cosine {
                    0.9
                } else {
                    0.3
                },
                neg_margin: if metric == PairMetric::Cosine {
                    0.1
                } else {
                    1.3
                },
                ..Contrastive::default()
            };
            check_finite_differences(&loss, &data, D, &labels, 1e-6);
        }
    }
}

#[test]
fn contrastive_without_positive_pairs_is_its_negative_term() {
    let data = [1.0, 0.0, 0.6, 0.8, 0.0, 1.0];
    let got = value(&Contrastive::default(), &data, 2, &flat(&[0, 1, 2]));
    // Negative pairs: (0,1) and (1,0) cost 0.6 − 0.6 = 0; (1,2), (2,1) cost 0.2.
    assert!((got - 0.2).abs() < 1e-15, "{got}");
}

// ---------------------------------------------------------------------------------------------
// Triplet

/// Brute-force triplet loss over the similarity matrix, enumerating every triplet.
fn brute_triplet(data: &[f64], d: usize, class_of: &[i64], loss: &Triplet) -> f64 {
    let x = normalized_rows(data, d);
    let b = class_of.len();
    let sim = |i: usize, j: usize| (0..d).map(|k| x[i * d + k] * x[j * d + k]).sum::<f64>();
    let dist = |i: usize, j: usize| loss.metric.distance(sim(i, j));
    let (mut sum, mut active) = (0.0, 0usize);
    for a in 0..b {
        let pos: Vec<usize> = (0..b)
            .filter(|&j| j != a && class_of[j] == class_of[a])
            .collect();
        let neg: Vec<usize> = (0..b).filter(|&j| class_of[j] != class_of[a]).collect();
        let mut triplets = Vec::new();
        match loss.mining {
            TripletMining::All | TripletMining::SemiHard => {
                for &p in &pos {
                    for &n in &neg {
                        let gap = dist(a, n) - dist(a, p);
                        if loss.mining == TripletMining::All || (gap > 0.0 && gap <= loss.margin) {
                            triplets.push((p, n));
                        }
                    }
                }
            }
            TripletMining::EasyPositiveSemiHardNegative => {
                if let Some(&p) = pos
                    .iter()
                    .min_by(|&&i, &&j| dist(a, i).total_cmp(&dist(a, j)))
                {
                    let farther = neg.iter().filter(|&&n| dist(a, n) > dist(a, p));
                    if let Some(&n) = farther.min_by(|&&i, &&j| dist(a, i).total_cmp(&dist(a, j))) {
                        triplets.push((p, n));
                    }
                }
            }
        }
        for (p, n) in triplets {
            let v = (dist(a, p) - dist(a, n)) + loss.margin;
            if v > 0.0 {
                sum += v;
                active += 1;
            }
        }
    }
    if active == 0 {
        0.0
    } else {
        sum / active as f64
    }
}

const MININGS: [TripletMining; 3] = [
    TripletMining::All,
    TripletMining::SemiHard,
    TripletMining::EasyPositiveSemiHardNegative,
];

#[test]
fn triplet_equals_brute_force_enumeration() {
    for seed in [6, 7] {
        let data = batch(seed);
        for metric in [PairMetric::Cosine, PairMetric::Euclidean] {
            for mining in MININGS {
                for margin in [0.05, 0.3] {
                    let loss = Triplet {
                        margin,
                        metric,
                        mining,
                        query_chunk: None,
                    };
                    let got = value(&loss, &data, D, &flat(&CLASSES));
                    let want = brute_triplet(&data, D, &CLASSES, &loss);
                    assert!(
                        (got - want).abs() < 1e-13,
                        "{metric:?} {mining:?} {margin}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn triplet_gradient_matches_finite_differences() {
    let data = batch(8);
    let labels = flat(&CLASSES);
    for metric in [PairMetric::Cosine, PairMetric::Euclidean] {
        for mining in MININGS {
            let loss = Triplet {
                margin: 0.5,
                metric,
                mining,
                query_chunk: None,
            };
            check_finite_differences(&loss, &data, D, &labels, 1e-6);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Normalised softmax

/// The proxies of a normalised softmax as they are stored, flattened.
fn raw_proxies(loss: &NormSoftmax) -> Vec<f64> {
    raw_proxies_of(loss.proxies())
}

/// Proxies as they are stored, flattened.
fn raw_proxies_of(proxies: &Var) -> Vec<f64> {
    proxies.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

/// The proxies of a normalised softmax, each row scaled to unit length, flattened.
fn unit_proxies(loss: &NormSoftmax) -> Vec<f64> {
    normalized_rows(&raw_proxies(loss), D)
}

#[test]
fn arcface_margin_matches_hand_computed_values_and_finite_differences() {
    // Two proxies on the axes; an embedding 30° from its class's proxy, σ = 0.1 (s = 10),
    // m = 0.5: the logits are (cos(30° + 0.5), cos 60°)·10.
    let proxies =
        Var::from_tensor(&Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0]], &CPU).unwrap()).unwrap();
    let mut arc = NormSoftmax::with_proxies(&[0, 1], proxies).unwrap();
    arc.temperature = 0.1;
    arc.margin = 0.5;
    let t = std::f64::consts::FRAC_PI_6;
    let x = [3.0 * t.cos(), 3.0 * t.sin()];
    let logits = [10.0 * (t + 0.5).cos(), 10.0 * t.sin()];
    let want = logits.iter().map(|l| l.exp()).sum::<f64>().ln() - logits[0];
    let got = value(&arc, &x, 2, &flat(&[0]));
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    // Margin 0 is NSM, bit for bit.
    arc.margin = 0.0;
    let nsm_value = value(&arc, &x, 2, &flat(&[0]));
    let want_nsm = (10.0 * t.cos()).exp() + (10.0 * t.sin()).exp();
    assert!((nsm_value - (want_nsm.ln() - 10.0 * t.cos())).abs() < 1e-12);

    // A random batch, against the formula, with the margin below and past θ = π − m.
    let data = batch(9);
    let labels = flat(&CLASSES);
    let xs = normalized_rows(&data, D);
    for m in [0.5, 2.5] {
        let mut arc = NormSoftmax::for_level(&labels, 0, D, 11, DType::F64, &CPU).unwrap();
        arc.temperature = 0.2;
        arc.margin = m;
        let p = unit_proxies(&arc);
        let (mut want, mut past) = (0.0, 0);
        for (i, &c) in CLASSES.iter().enumerate() {
            let target = arc.classes().iter().position(|&k| k == c).unwrap();
            let mut logits: Vec<f64> = (0..5)
                .map(|k| (0..D).map(|t| xs[i * D + t] * p[k * D + t]).sum::<f64>())
                .collect();
            let cos = logits[target];
            logits[target] = if cos > (std::f64::consts::PI - m).cos() {
                (cos.acos() + m).cos()
            } else {
                past += 1;
                cos - m * m.sin()
            };
            let logits: Vec<f64> = logits.iter().map(|l| l / 0.2).collect();
            let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
            want += lse - logits[target];
        }
        want /= CLASSES.len() as f64;
        let got = value(&arc, &data, D, &labels);
        assert!((got - want).abs() < 1e-12, "m = {m}: {got} vs {want}");
        // m = 0.5 never passes π − m on this batch, m = 2.5 does for some rows.
        assert_eq!(past > 0, m > 1.0, "m = {m}: {past} rows past π − m");
        check_finite_differences(&arc, &data, D, &labels, 1e-6);
    }
    // A margin is an angle in [0, π): the recipe and the loss refuse others, naming it.
    use rankwise::losses::config::LossRecipe;
    use rankwise::losses::norm_softmax::NormSoftmaxConfig;
    for bad in [-0.1, 3.2, f64::NAN] {
        let config = NormSoftmaxConfig {
            margin: bad,
            ..NormSoftmaxConfig::default()
        };
        let e = config.validate().unwrap_err().to_string();
        assert!(e.contains("margin"), "{e}");
        let mut arc = NormSoftmax::for_level(&labels, 0, D, 11, DType::F64, &CPU).unwrap();
        arc.margin = bad;
        let x = Tensor::from_vec(data.clone(), (CLASSES.len(), D), &CPU).unwrap();
        assert!(arc.forward(&x, &labels).is_err());
    }
}

#[test]
fn norm_softmax_matches_a_hand_computed_cross_entropy_and_finite_differences() {
    let data = batch(9);
    let labels = flat(&CLASSES);
    let nsm = NormSoftmax::for_level(&labels, 0, D, 11, DType::F64, &CPU).unwrap();
    assert_eq!(nsm.classes(), &[0, 1, 2, 3, 9]);
    // Hand computation of −mean log softmax(cos/σ).
    let x = normalized_rows(&data, D);
    let w = raw_proxies(&nsm);
    let p = normalized_rows(&w, D);
    let mut want = 0.0;
    for (i, &c) in CLASSES.iter().enumerate() {
        let logits: Vec<f64> = (0..5)
            .map(|k| (0..D).map(|t| x[i * D + t] * p[k * D + t]).sum::<f64>() / 0.05)
            .collect();
        let target = nsm.classes().iter().position(|&k| k == c).unwrap();
        let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
        want += lse - logits[target];
    }
    want /= CLASSES.len() as f64;
    let got = value(&nsm, &data, D, &labels);
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    check_finite_differences(&nsm, &data, D, &labels, 1e-6);

    check_proxy_finite_differences(&nsm, nsm.proxies(), &data, &labels);
}

/// The gradient of `loss` with respect to its `proxies` (`C × D`) against central finite
/// differences, through `Var::set` (restored afterwards).
fn check_proxy_finite_differences(
    loss: &dyn RankLoss,
    proxies: &Var,
    data: &[f64],
    labels: &Labels,
) {
    let e = Tensor::from_vec(data.to_vec(), (labels.len(), D), &CPU).unwrap();
    let l = loss.forward(&e, labels).unwrap();
    let grads = l.backward().unwrap();
    let gw = grads
        .get(proxies)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    let shape = proxies.dims2().unwrap();
    let w = proxies.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let at = |values: Vec<f64>| {
        proxies
            .set(&Tensor::from_vec(values, shape, &CPU).unwrap())
            .unwrap();
        loss.forward(&e, labels)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let eps = 1e-6;
    for i in 0..w.len() {
        let mut plus = w.clone();
        let mut minus = w.clone();
        plus[i] += eps;
        minus[i] -= eps;
        let fd = (at(plus) - at(minus)) / (2.0 * eps);
        assert!(
            (fd - gw[i]).abs() < 1e-6 * gw[i].abs().max(1.0),
            "proxy {i}: {fd} vs {}",
            gw[i]
        );
    }
    at(w);
}

/// `f(x̂_i, p̂_k)` for every proxy row `k` of `p` (rows of `D` values, as `normalized_rows` gives
/// them): one item's terms in the proxy losses' formulas written by hand.
fn item_to_proxies(x: &[f64], p: &[f64], i: usize, f: impl Fn(&[f64], &[f64]) -> f64) -> Vec<f64> {
    let item = &x[i * D..(i + 1) * D];
    p.chunks(D).map(|proxy| f(item, proxy)).collect()
}

// ---------------------------------------------------------------------------------------------
// ProxyNCA++

#[test]
fn proxy_nca_pp_matches_the_authors_formula_and_finite_differences() {
    let data = batch(4);
    let labels = flat(&CLASSES);
    let loss = ProxyNcaPp::for_level(&labels, 0, D, 11, DType::F64, &CPU).unwrap();
    assert_eq!(loss.classes(), &[0, 1, 2, 3, 9]);
    // By hand, as the authors compute it: both unit vectors scaled by 3 = √(1/T), the squared
    // distance expanded as ‖a‖² + ‖b‖² − 2aᵀb and clamped at 0, then −mean log softmax(−D).
    let x = normalized_rows(&data, D);
    let p = normalized_rows(&raw_proxies_of(loss.proxies()), D);
    let scale = 3.0f64;
    let mut want = 0.0;
    for (i, &c) in CLASSES.iter().enumerate() {
        let logits = item_to_proxies(&x, &p, i, |a, b| {
            let dot: f64 = a.iter().zip(b).map(|(u, v)| u * v).sum();
            let sq = |r: &[f64]| r.iter().map(|u| u * u).sum::<f64>();
            -(scale * scale * (sq(a) + sq(b) - 2.0 * dot)).max(0.0)
        });
        let target = loss.classes().iter().position(|&k| k == c).unwrap();
        let lse = logits.iter().map(|l| l.exp()).sum::<f64>().ln();
        want += lse - logits[target];
    }
    want /= CLASSES.len() as f64;
    let got = value(&loss, &data, D, &labels);
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    check_finite_differences(&loss, &data, D, &labels, 1e-6);
    check_proxy_finite_differences(&loss, loss.proxies(), &data, &labels);

    // Σ NCA++ over two levels: one proxy set per level, each level's own classes.
    let two = two_level(&CLASSES);
    let summed = SummedLevels::uniform(2, |level| {
        Ok(Box::new(ProxyNcaPp::for_level(
            &two,
            level,
            D,
            level as u64,
            DType::F64,
            &CPU,
        )?))
    })
    .unwrap();
    assert_eq!(summed.trainable_vars().len(), 2);
    check_finite_differences(&summed, &data, D, &two, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// ProxyNCA (Roth & Brattoli's re-implementation)

#[test]
fn proxy_nca_matches_the_re_implementations_formula_and_finite_differences() {
    let data = batch(4);
    let labels = flat(&CLASSES);
    let loss = ProxyNca::for_level(&labels, 0, D, 13, DType::F64, &CPU).unwrap();
    assert_eq!(loss.classes(), &[0, 1, 2, 3, 9]);
    // By hand, as Roth & Brattoli compute it: both unit vectors scaled by 3, the squared
    // distances from the differences, then mean(d_pos + logsumexp(−d_neg)) over the other
    // classes' proxies.
    let x = normalized_rows(&data, D);
    let p = normalized_rows(&raw_proxies_of(loss.proxies()), D);
    let scale = 3.0f64;
    let mut want = 0.0;
    for (i, &c) in CLASSES.iter().enumerate() {
        let d = item_to_proxies(&x, &p, i, |a, b| {
            a.iter()
                .zip(b)
                .map(|(u, v)| (scale * u - scale * v).powi(2))
                .sum()
        });
        let target = loss.classes().iter().position(|&k| k == c).unwrap();
        let neg: f64 = (0..5).filter(|&k| k != target).map(|k| (-d[k]).exp()).sum();
        want += d[target] + neg.ln();
    }
    want /= CLASSES.len() as f64;
    let got = value(&loss, &data, D, &labels);
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    check_finite_differences(&loss, &data, D, &labels, 1e-6);
    check_proxy_finite_differences(&loss, loss.proxies(), &data, &labels);
}

// ---------------------------------------------------------------------------------------------
// RaMBO

#[test]
fn blackbox_ranks_are_exact_with_ties_broken_by_position() {
    let scores = Tensor::new(&[[0.2f64, 0.9, 0.2, 0.5], [1.0, 1.0, 1.0, -1.0]], &CPU).unwrap();
    let int = blackbox_rank(&scores, 1.0, RankUnits::Integer).unwrap();
    assert_eq!(
        int.to_vec2::<f64>().unwrap(),
        vec![vec![3.0, 1.0, 4.0, 2.0], vec![1.0, 2.0, 3.0, 4.0]]
    );
    let norm = blackbox_rank(&scores, 1.0, RankUnits::Normalised).unwrap();
    assert_eq!(
        norm.to_vec2::<f64>().unwrap(),
        vec![vec![0.75, 0.25, 1.0, 0.5], vec![0.25, 0.5, 0.75, 1.0]]
    );
    // Dtype is preserved; bad input is rejected.
    let f32s = scores.to_dtype(DType::F32).unwrap();
    assert_eq!(
        blackbox_rank(&f32s, 1.0, RankUnits::Integer)
            .unwrap()
            .dtype(),
        DType::F32
    );
    assert!(blackbox_rank(&scores, 0.0, RankUnits::Integer).is_err());
    let nan = Tensor::new(&[0.1f64, f64::NAN], &CPU).unwrap();
    assert!(blackbox_rank(&nan, 1.0, RankUnits::Integer).is_err());
    assert_eq!(descending_ranks(&[0.0, 0.0]), vec![1, 2]);
}

#[test]
fn blackbox_gradient_equals_the_hand_computed_interpolation() {
    // y = (0.5, 0.1, 0.3, 0.7) has integer ranks (2, 4, 3, 1). The loss Σ c_i rk_i has
    // ∂L/∂rk = c.
    // * c = (0, −0.3, 0, 0.1), λ = 1: y_λ = y + λc = (0.5, −0.2, 0.3, 0.8) ranks as y does, so
    //   the gradient is 0.
    // * c = (0, 0.3, 0, −0.1), λ = 2: y_λ = (0.5, 0.7, 0.3, 0.5) ranks (2, 1, 4, 3) (the tie
    //   0.5 = 0.5 goes to the earlier index), so the gradient is −(rk − rk_λ)/λ =
    //   −((2, 4, 3, 1) − (2, 1, 4, 3))/2 = (0, −1.5, 0.5, 1). Its sign is right: c₂ > 0 means the
    //   loss wants a smaller rank for item 2, and descent (−gradient) raises y₂.
    let y = Var::from_vec(vec![0.5f64, 0.1, 0.3, 0.7], 4, &CPU).unwrap();
    let grad_with = |c: [f64; 4], lambda: f64| {
        let rk = blackbox_rank(y.as_tensor(), lambda, RankUnits::Integer).unwrap();
        assert_eq!(rk.to_vec1::<f64>().unwrap(), vec![2.0, 4.0, 3.0, 1.0]);
        let loss = (rk * Tensor::new(&c, &CPU).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        let g = loss.backward().unwrap();
        g.get(&y).unwrap().to_vec1::<f64>().unwrap()
    };
    assert_eq!(grad_with([0.0, -0.3, 0.0, 0.1], 1.0), vec![0.0; 4]);
    assert_eq!(
        grad_with([0.0, 0.3, 0.0, -0.1], 2.0),
        vec![0.0, -1.5, 0.5, 1.0]
    );
    // Normalised units: ranks are rank/4, and the same c perturbs identically; the returned
    // gradient is in normalised units, i.e. 1/4 of the integer one.
    let rk = blackbox_rank(y.as_tensor(), 2.0, RankUnits::Normalised).unwrap();
    let loss = (rk * Tensor::new(&[0.0, 0.3, 0.0, -0.1], &CPU).unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    let g = loss
        .backward()
        .unwrap()
        .get(&y)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    assert_eq!(g, vec![0.0, -0.375, 0.125, 0.25]);
}

/// RaMBO written with the public blackbox op and plain candle autograd on the whole score matrix
/// (the structure of the authors' code), for deterministic margins.
fn rambo_reference(loss: &Rambo, e: &Tensor, class_of: &[i64]) -> Tensor {
    let b = class_of.len();
    let norms = e.sqr().unwrap().sum_keepdim(1).unwrap().sqrt().unwrap();
    let x = e.broadcast_div(&norms).unwrap();
    let s = x.matmul(&x.t().unwrap()).unwrap();
    let cols: Vec<Vec<usize>> = (0..b)
        .map(|q| (0..b).filter(|&j| j != q || loss.include_self).collect())
        .collect();
    let n = cols[0].len();
    let idx: Vec<u32> = (0..b)
        .flat_map(|q| cols[q].iter().map(move |&j| (q * b + j) as u32))
        .collect();
    let seq = s
        .flatten_all()
        .unwrap()
        .index_select(&Tensor::new(idx.as_slice(), &CPU).unwrap(), 0)
        .unwrap()
        .reshape((b, n))
        .unwrap();
    let rel: Vec<f64> = (0..b)
        .flat_map(|q| {
            cols[q]
                .iter()
                .map(move |&j| (class_of[j] == class_of[q]) as u8 as f64)
        })
        .collect();
    let rel_t = Tensor::from_vec(rel.clone(), (b, n), &CPU).unwrap();
    let shifted = (&seq - (rel_t.affine(1.0, -0.5).unwrap() * loss.margin).unwrap()).unwrap();
    let rk = blackbox_rank(&shifted, loss.lambda, loss.units).unwrap();
    // Ranks among the relevant items, constant.
    let rk_vals = rk.to_vec2::<f64>().unwrap();
    let unit = |r: usize| match loss.units {
        RankUnits::Integer => r as f64,
        RankUnits::Normalised => r as f64 / n as f64,
    };
    let mut rk_pos = vec![0.0; b * n];
    let mut npos = vec![0.0; b];
    for q in 0..b {
        let mut order: Vec<usize> = (0..n).filter(|&i| rel[q * n + i] > 0.0).collect();
        order.sort_by(|&i, &j| rk_vals[q][i].total_cmp(&rk_vals[q][j]));
        for (k, &i) in order.iter().enumerate() {
            rk_pos[q * n + i] = unit(k + 1);
        }
        npos[q] = order.len() as f64;
    }
    let rk_pos = Tensor::from_vec(rk_pos, (b, n), &CPU).unwrap();
    let per_item = match loss.objective {
        RamboObjective::Ap => (&rk_pos / &rk).unwrap(),
        RamboObjective::Recall(w) => {
            let per_unit = if loss.units == RankUnits::Integer {
                1.0
            } else {
                n as f64
            };
            let r = ((&rk - &rk_pos).unwrap() * per_unit).unwrap();
            let r = (r * &rel_t).unwrap();
            let l1 = r.affine(1.0, 1.0).unwrap().log().unwrap();
            match w {
                RecallWeight::Log => l1,
                RecallWeight::LogLog => l1.affine(1.0, 1.0).unwrap().log().unwrap(),
            }
        }
    };
    let sums = (per_item * &rel_t).unwrap().sum(1).unwrap();
    let valid: Vec<u32> = (0..b as u32).filter(|&q| npos[q as usize] > 0.0).collect();
    let vidx = Tensor::new(valid.as_slice(), &CPU).unwrap();
    let counts = Tensor::from_vec(
        valid
            .iter()
            .map(|&q| {
                npos[q as usize]
                    + if loss.objective == RamboObjective::Ap {
                        loss.ap_epsilon
                    } else {
                        0.0
                    }
            })
            .collect::<Vec<_>>(),
        valid.len(),
        &CPU,
    )
    .unwrap();
    let per_query = (sums.index_select(&vidx, 0).unwrap() / counts).unwrap();
    let mean = per_query.mean_all().unwrap();
    match loss.objective {
        RamboObjective::Ap => (mean * -1.0).unwrap().affine(1.0, 1.0).unwrap(),
        RamboObjective::Recall(_) => mean,
    }
}

fn rambo_variants() -> Vec<Rambo> {
    let mut out = Vec::new();
    for objective in [
        RamboObjective::Ap,
        RamboObjective::Recall(RecallWeight::Log),
        RamboObjective::Recall(RecallWeight::LogLog),
    ] {
        for units in [RankUnits::Integer, RankUnits::Normalised] {
            for include_self in [false, true] {
                // λ large enough that the perturbation reorders items (with integer ranks
                // ∂L/∂rk is n = 12 times smaller, so λ is n times larger for the same effect).
                let lambda = if units == RankUnits::Integer {
                    12.0 * 20.0
                } else {
                    20.0
                };
                out.push(Rambo {
                    objective,
                    units,
                    include_self,
                    lambda,
                    margin: 0.1,
                    ap_epsilon: if include_self { 1e-5 } else { 0.0 },
                    ..Rambo::default()
                });
            }
        }
    }
    out
}

#[test]
fn rambo_equals_the_blackbox_op_with_autograd_on_the_whole_matrix() {
    let data = batch(12);
    let labels = flat(&CLASSES);
    for loss in rambo_variants() {
        let v = Var::from_vec(data.clone(), (CLASSES.len(), D), &CPU).unwrap();
        let reference = rambo_reference(&loss, v.as_tensor(), &CLASSES);
        // A loss weight of 0.9 enters the blackbox perturbation, as in the authors' code.
        let want_g = (&reference * 0.9).unwrap().backward().unwrap();
        let want_g = want_g
            .get(&v)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let want = reference.to_scalar::<f64>().unwrap();
        for chunk in [None, Some(1), Some(4)] {
            let l = Rambo {
                query_chunk: chunk,
                ..loss.clone()
            };
            let v2 = Var::from_vec(data.clone(), (CLASSES.len(), D), &CPU).unwrap();
            let out = l.forward(v2.as_tensor(), &labels).unwrap();
            let got = out.to_scalar::<f64>().unwrap();
            let g = (&out * 0.9).unwrap().backward().unwrap();
            let g = g
                .get(&v2)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            assert!((got - want).abs() < 1e-14, "{loss:?}: {got} vs {want}");
            assert_close(
                &g,
                &want_g,
                1e-12,
                &format!("{:?} {:?} gradient", loss.objective, loss.units),
            );
            assert!(g.iter().any(|x| x.abs() > 0.0), "{loss:?}: zero gradient");
        }
    }
}

#[test]
fn rambo_gradient_direction_improves_the_loss() {
    // Gradient descent on the embeddings of a small problem with the exact (piecewise constant)
    // RaMBO AP loss: the blackbox direction must decrease it.
    let labels = flat(&[0, 0, 0, 1, 1, 1, 2, 2]);
    for objective in [
        RamboObjective::Ap,
        RamboObjective::Recall(RecallWeight::Log),
    ] {
        let loss = Rambo {
            objective,
            margin: 0.0,
            lambda: 4.0,
            ..Rambo::default()
        };
        let mut data = gaussian(8 * 3, 13);
        let start = value(&loss, &data, 3, &labels);
        for _ in 0..100 {
            let (_, g) = value_and_grad(&loss, &data, 3, &labels);
            for (x, gi) in data.iter_mut().zip(&g) {
                *x -= gi;
            }
        }
        let end = value(&loss, &data, 3, &labels);
        assert!(
            start > 0.05,
            "{objective:?}: the problem must start with errors ({start})"
        );
        assert!(
            end < 0.5 * start,
            "{objective:?}: loss went from {start} to {end}"
        );
    }
}

#[test]
fn rambo_score_memory_adds_its_sequences_and_is_updated_explicitly() {
    let labels = flat(&CLASSES);
    let loss = Rambo {
        margin: 0.05,
        ..Rambo::recall(RecallWeight::Log)
    };
    let first = Tensor::from_vec(batch(14), (CLASSES.len(), D), &CPU).unwrap();
    let second = Tensor::from_vec(batch(15), (CLASSES.len(), D), &CPU).unwrap();
    let mut memory = ScoreMemory::new(1);
    let (l1, rows1) = loss.forward_with_memory(&first, &labels, &memory).unwrap();
    assert!(
        (l1.to_scalar::<f64>().unwrap()
            - loss
                .forward(&first, &labels)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap())
        .abs()
            < 1e-15
    );
    // The stored sequences are the raw similarities without the query.
    assert_eq!(rows1.len(), CLASSES.len());
    let x = normalized_rows(&batch(14), D);
    let (s0, r0) = rows1.iter().next().unwrap();
    assert_eq!(s0.len(), CLASSES.len() - 1);
    let s01: f64 = (0..D).map(|k| x[k] * x[D + k]).sum();
    assert!((s0[0] - s01).abs() < 1e-15 && r0[0] && !r0[3]);
    memory.push(rows1.clone());
    assert_eq!(memory.num_sequences(), CLASSES.len());

    // Loss of the second batch with memory = mean over 12 + 12 valid sequences.
    let (l2, _) = loss.forward_with_memory(&second, &labels, &memory).unwrap();
    let alone = loss
        .forward(&second, &labels)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    let stored: Vec<f64> = rows1
        .iter()
        .filter_map(|(s, r)| loss.sequence_loss(s, r).unwrap())
        .collect();
    assert_eq!(stored.len(), 12);
    let want = (12.0 * alone + stored.iter().sum::<f64>()) / 24.0;
    assert!((l2.to_scalar::<f64>().unwrap() - want).abs() < 1e-14);
    // The memory is constant: the gradient flows to the current batch only, and the memory
    // itself is unchanged by the forward pass.
    assert_eq!(memory.len(), 1);
    let v = Var::from_tensor(&second).unwrap();
    let (l, _) = loss
        .forward_with_memory(v.as_tensor(), &labels, &memory)
        .unwrap();
    assert!(l.backward().unwrap().get(&v).is_some());

    // The code's counting multiplies r by (number of sequences)/(length) = 26/12 here.
    let code = Rambo {
        recall_count: RecallCount::NumSequences,
        averaging: Averaging::PooledPositives,
        ..loss.clone()
    };
    let (l3, _) = code.forward_with_memory(&second, &labels, &memory).unwrap();
    assert!(l3.to_scalar::<f64>().unwrap() > l2.to_scalar::<f64>().unwrap());
}

#[test]
fn rambo_stochastic_margin_is_reproducible_and_chunk_independent() {
    let data = batch(16);
    let labels = flat(&CLASSES);
    let make = |chunk| Rambo {
        query_chunk: chunk,
        margin: 0.3,
        ..Rambo::roadmap_blackbox_ap(7)
    };
    let (a, b) = (make(None), make(Some(3)));
    let (va, ga) = value_and_grad(&a, &data, D, &labels);
    let (vb, gb) = value_and_grad(&b, &data, D, &labels);
    assert_eq!(va, vb);
    assert_close(&ga, &gb, 1e-12, "stochastic margin gradient");
    // A new forward pass draws new magnitudes.
    let values: Vec<f64> = (0..5).map(|_| value(&a, &data, D, &labels)).collect();
    assert!(values.iter().any(|v| *v != values[0]), "{values:?}");
    let c = make(None);
    assert_eq!(value(&c, &data, D, &labels), va);
    assert!(matches!(c.margin_mode, MarginMode::HalfNormal { seed: 7 }));
}

// ---------------------------------------------------------------------------------------------
// Chunking

#[test]
fn chunked_equals_unchunked_for_every_pairwise_loss() {
    let data = batch(17);
    let labels = flat(&CLASSES);
    check_chunking(
        |c| {
            Box::new(FastAp {
                query_chunk: c,
                ..FastAp::default()
            })
        },
        &data,
        D,
        &labels,
    );
    for metric in [PairMetric::Cosine, PairMetric::Euclidean] {
        check_chunking(
            |c| {
                Box::new(Contrastive {
                    query_chunk: c,
                    metric,
                    ..Contrastive::default()
                })
            },
            &data,
            D,
            &labels,
        );
        for mining in MININGS {
            check_chunking(
                |c| {
                    Box::new(Triplet {
                        query_chunk: c,
                        metric,
                        mining,
                        margin: 0.3,
                    })
                },
                &data,
                D,
                &labels,
            );
        }
    }
    check_chunking(
        |c| {
            Box::new(Rambo {
                query_chunk: c,
                ..Rambo::default()
            })
        },
        &data,
        D,
        &labels,
    );
    check_chunking(
        |c| {
            Box::new(Rambo {
                query_chunk: c,
                ..Rambo::ap()
            })
        },
        &data,
        D,
        &labels,
    );
}

// ---------------------------------------------------------------------------------------------
// Σ variants

#[test]
fn summed_levels_is_the_weighted_sum_over_coarsened_labels() {
    let data = batch(18);
    let labels = two_level(&CLASSES);
    let make = || {
        Box::new(Triplet {
            mining: TripletMining::All,
            margin: 0.3,
            ..Triplet::default()
        })
    };
    let sigma = SummedLevels::new(vec![
        LevelTerm {
            level: 0,
            weight: 1.0,
            loss: make(),
        },
        LevelTerm {
            level: 1,
            weight: 0.5,
            loss: make(),
        },
    ])
    .unwrap();
    let (v, g) = value_and_grad(&sigma, &data, D, &labels);
    let (v0, g0) = value_and_grad(make().as_ref(), &data, D, &labels.coarsen(0).unwrap());
    let (v1, g1) = value_and_grad(make().as_ref(), &data, D, &labels.coarsen(1).unwrap());
    assert!((v - (v0 + 0.5 * v1)).abs() < 1e-14);
    let want: Vec<f64> = g0.iter().zip(&g1).map(|(a, b)| a + 0.5 * b).collect();
    assert_close(&g, &want, 1e-13, "Σ gradient");
    // The coarse level has more positives, so the two terms differ.
    assert!((v0 - v1).abs() > 1e-6);

    // Σ NSM: one proxy set per level.
    let nsm = SummedLevels::uniform(2, |level| {
        Ok(Box::new(NormSoftmax::for_level(
            &labels,
            level,
            D,
            level as u64,
            DType::F64,
            &CPU,
        )?))
    })
    .unwrap();
    check_finite_differences(&nsm, &data, D, &labels, 1e-6);

    // A level the labels do not have, and a bad weight.
    let three = SummedLevels::uniform(3, |_| Ok(make() as Box<dyn RankLoss>)).unwrap();
    let err = three
        .forward(
            &Tensor::from_vec(data.clone(), (CLASSES.len(), D), &CPU).unwrap(),
            &labels,
        )
        .unwrap_err();
    assert!(err.to_string().contains("level 2"), "{err}");

    // A level at which the batch is one class has no negative: its term is skipped (zero in
    // pytorch-metric-learning), so the Σ equals the sum of the other levels.
    let one_top = Labels::from_flat(
        CLASSES.len(),
        3,
        labels
            .as_flat()
            .chunks(2)
            .flat_map(|r| [r[0], r[1], 0])
            .collect(),
    )
    .unwrap();
    let (v3, g3) = value_and_grad(&three, &data, D, &one_top);
    let (v01, g01) = value_and_grad(
        &SummedLevels::uniform(2, |_| Ok(make() as Box<dyn RankLoss>)).unwrap(),
        &data,
        D,
        &labels,
    );
    assert_eq!(v3.to_bits(), v01.to_bits());
    assert_eq!(g3, g01);
    // Every level one class: refused, naming why.
    let single = Labels::from_flat(CLASSES.len(), 1, vec![0; CLASSES.len()]).unwrap();
    let one = SummedLevels::uniform(1, |_| Ok(make() as Box<dyn RankLoss>)).unwrap();
    let err = one
        .forward(
            &Tensor::from_vec(batch(18), (CLASSES.len(), D), &CPU).unwrap(),
            &single,
        )
        .unwrap_err();
    assert!(err.to_string().contains("no level has a negative"), "{err}");
    assert!(SummedLevels::new(vec![LevelTerm {
        level: 0,
        weight: -1.0,
        loss: make()
    }])
    .is_err());
}

// ---------------------------------------------------------------------------------------------
// Dtypes and bad input

fn all_losses() -> Vec<(&'static str, Box<dyn RankLoss>)> {
    vec![
        ("fastap", Box::new(FastAp::default())),
        ("contrastive", Box::new(Contrastive::default())),
        ("triplet", Box::new(Triplet::default())),
        ("rambo", Box::new(Rambo::default())),
        ("rambo-ap", Box::new(Rambo::ap())),
        (
            "nsm",
            Box::new(NormSoftmax::new(&[0, 1, 2, 3, 9], D, 0, DType::F64, &CPU).unwrap()),
        ),
    ]
}

#[test]
fn float32_input_gives_float32_loss_and_gradient() {
    let data: Vec<f32> = batch(19).iter().map(|&x| x as f32).collect();
    let labels = flat(&CLASSES);
    for (name, loss) in all_losses() {
        if name == "nsm" {
            continue; // its proxies are f64 here; the cast is covered by `logits`.
        }
        let v = Var::from_vec(data.clone(), (CLASSES.len(), D), &CPU).unwrap();
        let l = loss.forward(v.as_tensor(), &labels).unwrap();
        assert_eq!(l.dtype(), DType::F32, "{name}");
        let g = l.backward().unwrap();
        let g = g.get(&v).unwrap();
        assert_eq!(g.dtype(), DType::F32, "{name}");
        let f64_value = value(loss.as_ref(), &batch(19), D, &labels);
        let f32_value = l.to_scalar::<f32>().unwrap() as f64;
        assert!(
            (f32_value - f64_value).abs() < 1e-4,
            "{name}: {f32_value} vs {f64_value}"
        );
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let labels = flat(&CLASSES);
    let mut nan = batch(20);
    nan[3 * D + 1] = f64::NAN;
    let nan = Tensor::from_vec(nan, (CLASSES.len(), D), &CPU).unwrap();
    let good = Tensor::from_vec(batch(20), (CLASSES.len(), D), &CPU).unwrap();
    let mut zero = batch(20);
    zero[2 * D..3 * D].iter_mut().for_each(|x| *x = 0.0);
    let zero = Tensor::from_vec(zero, (CLASSES.len(), D), &CPU).unwrap();
    let short = flat(&CLASSES[..5]);
    for (name, loss) in all_losses() {
        let e = loss.forward(&nan, &labels).unwrap_err().to_string();
        assert!(e.contains("row 3") && e.contains("NaN"), "{name}: {e}");
        let e = loss.forward(&good, &short).unwrap_err();
        assert!(matches!(e, Error::Shape(_)), "{name}: {e}");
        let e = loss.forward(&zero, &labels).unwrap_err().to_string();
        assert!(
            e.contains("row 2") && e.contains("zero norm"),
            "{name}: {e}"
        );
        // A singleton class among others: a finite loss (its query contributes nothing).
        let v = loss
            .forward(&good, &labels)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(v.is_finite(), "{name}: {v}");
    }
    // No positive anywhere: the rank losses are undefined.
    let distinct = flat(&(0..CLASSES.len() as i64).collect::<Vec<_>>());
    for (name, loss) in [
        ("fastap", Box::new(FastAp::default()) as Box<dyn RankLoss>),
        ("triplet", Box::new(Triplet::default())),
        ("rambo", Box::new(Rambo::default())),
    ] {
        let e = loss.forward(&good, &distinct).unwrap_err().to_string();
        assert!(e.contains("labels"), "{name}: {e}");
    }
    // The contrastive loss keeps its negative term (documented), still finite.
    let v = Contrastive::default()
        .forward(&good, &distinct)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(v.is_finite());
    // Options.
    let e = FastAp {
        query_chunk: Some(0),
        ..FastAp::default()
    }
    .forward(&good, &labels)
    .unwrap_err();
    assert!(e.to_string().contains("query_chunk"));
    let e = FastAp {
        num_bins: 0,
        ..FastAp::default()
    }
    .forward(&good, &labels)
    .unwrap_err();
    assert!(e.to_string().contains("num_bins"));
    let e = Rambo {
        lambda: -1.0,
        ..Rambo::default()
    }
    .forward(&good, &labels)
    .unwrap_err();
    assert!(e.to_string().contains("lambda"));
    let e = Triplet {
        margin: f64::NAN,
        ..Triplet::default()
    }
    .forward(&good, &labels)
    .unwrap_err();
    assert!(e.to_string().contains("margin"));
    let mut nsm = NormSoftmax::new(&[0, 1, 2, 3, 9], D, 0, DType::F64, &CPU).unwrap();
    nsm.temperature = 0.0;
    assert!(nsm
        .forward(&good, &labels)
        .unwrap_err()
        .to_string()
        .contains("temperature"));
}

//! Forward and forward+backward wall time of FastAP, RaMBO and the baseline losses on random
//! L2-normalisable `f32` embeddings, `B ∈ {256, 4096}`, `D = 512`, 4 items per class, on the
//! CPU.
//!
//! ```text
//! cargo run --example baseline_timing            # both batch sizes
//! cargo run --example baseline_timing -- 256     # one batch size
//! ```
//!
//! Each timing is the median over `reps` runs (5 at B = 256, 2 at B = 4096) after one warm-up
//! run. Pairwise losses run unchunked (`query_chunk: None`) and, at B = 4096, also in query
//! chunks of 1024 rows. NSM (not pairwise) has 11,318 proxies (the number of SOP training
//! classes).

use candle_core::{DType, Device, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rankwise::losses::contrastive::Contrastive;
use rankwise::losses::fastap::FastAp;
use rankwise::losses::norm_softmax::NormSoftmax;
use rankwise::losses::rambo::{Rambo, RecallWeight};
use rankwise::losses::summed_levels::SummedLevels;
use rankwise::losses::triplet::{Triplet, TripletMining};
use rankwise::losses::RankLoss;
use rankwise::Labels;
use std::time::Instant;

const DIM: usize = 512;
const PER_CLASS: usize = 4;
const SOP_CLASSES: usize = 11_318;

/// The losses to time, each with its query chunk (`None`: unchunked), NSM only when
/// `with_nsm`.
fn losses(
    chunk: Option<usize>,
    with_nsm: bool,
) -> anyhow::Result<Vec<(String, Box<dyn RankLoss>)>> {
    let classes: Vec<i64> = (0..SOP_CLASSES as i64).collect();
    let mut out: Vec<(String, Box<dyn RankLoss>)> = vec![
        (
            "FastAP (10 bins)".into(),
            Box::new(FastAp {
                query_chunk: chunk,
                ..FastAp::default()
            }),
        ),
        (
            "RaMBO recall log log".into(),
            Box::new(Rambo {
                query_chunk: chunk,
                ..Rambo::recall(RecallWeight::LogLog)
            }),
        ),
        (
            "RaMBO AP (ROADMAP BlackBoxAP)".into(),
            Box::new(Rambo {
                query_chunk: chunk,
                ..Rambo::roadmap_blackbox_ap(0)
            }),
        ),
        (
            "contrastive 0.9/0.6".into(),
            Box::new(Contrastive {
                query_chunk: chunk,
                ..Contrastive::default()
            }),
        ),
    ];
    for (name, mining) in [
        (
            "triplet easy-pos/semi-hard-neg",
            TripletMining::EasyPositiveSemiHardNegative,
        ),
        ("triplet semi-hard", TripletMining::SemiHard),
        ("triplet all", TripletMining::All),
    ] {
        out.push((
            name.into(),
            Box::new(Triplet {
                mining,
                query_chunk: chunk,
                ..Triplet::default()
            }),
        ));
    }
    if with_nsm {
        out.push((
            format!("NSM ({SOP_CLASSES} proxies)"),
            Box::new(NormSoftmax::new(
                &classes,
                DIM,
                0,
                DType::F32,
                &Device::Cpu,
            )?),
        ));
    }
    out.push((
        "Σ triplet (2 levels)".into(),
        Box::new(SummedLevels::uniform(2, |_| {
            Ok(Box::new(Triplet {
                query_chunk: chunk,
                ..Triplet::default()
            }) as Box<dyn RankLoss>)
        })?),
    ));
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median forward and forward + backward time in milliseconds over `reps` runs after a warm-up.
fn time(
    loss: &dyn RankLoss,
    data: &[f32],
    b: usize,
    labels: &Labels,
    reps: usize,
) -> anyhow::Result<(f64, f64)> {
    let mut fwd = Vec::new();
    let mut both = Vec::new();
    for rep in 0..=reps {
        let v = Var::from_vec(data.to_vec(), (b, DIM), &Device::Cpu)?;
        let t0 = Instant::now();
        let l = loss.forward(v.as_tensor(), labels)?;
        let _ = l.to_scalar::<f32>()?;
        let t1 = Instant::now();
        let grads = l.backward()?;
        let g = grads
            .get(&v)
            .ok_or_else(|| anyhow::anyhow!("no gradient"))?;
        let _ = g.sum_all()?.to_scalar::<f32>()?;
        let t2 = Instant::now();
        if rep > 0 {
            fwd.push((t1 - t0).as_secs_f64() * 1e3);
            both.push((t2 - t0).as_secs_f64() * 1e3);
        }
    }
    Ok((median(fwd), median(both)))
}

fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = match std::env::args().nth(1) {
        Some(s) => vec![s.parse()?],
        None => vec![256, 4096],
    };
    println!("| loss | B | D | query chunk | forward (ms) | forward + backward (ms) |");
    println!("|---|---|---|---|---|---|");
    for b in sizes {
        let reps = if b <= 1024 { 5 } else { 2 };
        let mut rng = ChaCha8Rng::seed_from_u64(b as u64);
        let data: Vec<f32> = (0..b * DIM).map(|_| rng.sample(StandardNormal)).collect();
        // Fine class = i / 4; coarse class = fine / 8 (for the Σ variant).
        let labels = Labels::new(
            (0..b as i64)
                .map(|i| {
                    let fine = i / PER_CLASS as i64;
                    vec![fine, 1_000_000 + fine / 8]
                })
                .collect(),
        )?;
        let mut runs = vec![(None, true)];
        if b > 1024 {
            runs.push((Some(1024), false));
        }
        for (chunk, with_nsm) in runs {
            for (name, loss) in losses(chunk, with_nsm)? {
                let (fwd, both) = time(loss.as_ref(), &data, b, &labels, reps)?;
                let chunk = chunk.map_or("none".to_string(), |c| c.to_string());
                println!("| {name} | {b} | {DIM} | {chunk} | {fwd:.1} | {both:.1} |");
            }
        }
    }
    Ok(())
}

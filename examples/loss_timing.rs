//! Times forward + backward of the smooth-rank losses on random embeddings.
//!
//! ```text
//! cargo run --release --example loss_timing -- <loss> <batch> [dim] [engine] [chunk]
//!   loss:   smooth-ap | happier-inat | happier-sop | hap-code-sop
//!   engine: streaming (default) | autograd
//! ```
//!
//! Labels mimic the papers' samplers: 4 images per fine class; `happier-inat` spreads the fine
//! classes over 13 coarse classes (iNat-base super-categories, M-per-class sampler), so a query
//! has ≈ B/13 positives; `happier-sop` uses 2 coarse classes per batch (the hierarchical
//! sampler of SOP), so a query has ≈ B/2 positives, the worst case for H-AP. Run one
//! configuration per process so that `/usr/bin/time -v` reports its peak memory.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rankwise::losses::cluster::ClusterLoss;
use rankwise::losses::happier::{HapLoss, Happier};
use rankwise::losses::smooth_ap::SmoothAp;
use rankwise::losses::smooth_rank::Engine;
use rankwise::losses::RankLoss;
use rankwise::Labels;
use std::time::Instant;

fn labels(b: usize, coarse_classes: i64) -> Result<Labels> {
    let rows = (0..b)
        .map(|i| {
            let fine = (i / 4) as i64;
            vec![fine, 1_000_000 + fine % coarse_classes]
        })
        .collect();
    Ok(Labels::new(rows)?)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: loss_timing <smooth-ap|happier-inat|happier-sop|hap-code-sop> <batch> \
                 [dim] [streaming|autograd] [chunk]";
    let name = args.first().context(usage)?.as_str();
    let b: usize = args.get(1).context(usage)?.parse()?;
    let d: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(512);
    let engine = match args.get(3).map(String::as_str) {
        None | Some("streaming") => Engine::Streaming,
        Some("autograd") => Engine::Autograd,
        Some(other) => bail!("unknown engine {other}; {usage}"),
    };
    let query_chunk = args.get(4).map(|s| s.parse()).transpose()?;

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
    let data: Vec<f32> = (0..b * d)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect();
    let emb = Var::from_tensor(&Tensor::from_vec(data, (b, d), &Device::Cpu)?)?;

    let (y, loss): (Labels, Box<dyn RankLoss>) = match name {
        "smooth-ap" => (
            labels(b, 13)?,
            Box::new(SmoothAp {
                engine,
                query_chunk,
                ..SmoothAp::default()
            }),
        ),
        "happier-inat" | "happier-sop" | "hap-code-sop" => {
            let coarse = if name == "happier-inat" { 13 } else { 2 };
            let y = labels(b, coarse)?;
            let mut classes = y.column(0);
            classes.dedup();
            let hap = if name == "hap-code-sop" {
                HapLoss::authors_code()
            } else {
                HapLoss::default()
            };
            let hap = HapLoss {
                engine,
                query_chunk,
                ..hap
            };
            let cluster = ClusterLoss::new(&classes, d, 0, DType::F32, &Device::Cpu)?;
            (y, Box::new(Happier::new(hap, cluster)))
        }
        other => bail!("unknown loss {other}; {usage}"),
    };

    let t0 = Instant::now();
    let value = loss.forward(emb.as_tensor(), &y)?;
    let forward = t0.elapsed();
    let t1 = Instant::now();
    let grads = value.backward()?;
    let backward = t1.elapsed();
    let g = grads
        .get(emb.as_tensor())
        .context("no gradient for the embeddings")?;
    let gnorm = g.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?;
    println!(
        "{name} B={b} D={d} engine={engine:?} chunk={query_chunk:?}: loss {:.6}, |grad| {gnorm:.3e}, \
         forward {:.3} s, backward {:.3} s, total {:.3} s, threads {}",
        value.to_scalar::<f32>()?,
        forward.as_secs_f64(),
        backward.as_secs_f64(),
        (forward + backward).as_secs_f64(),
        rayon::current_num_threads()
    );
    Ok(())
}

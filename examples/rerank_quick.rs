//! Re-ranking baselines of SSR Table 1 at quick scale: mAP@R and R@1 (every item a query
//! against all the others) of the raw cosine ranking, query expansion (AQE, AQEwD, αQE, DQE)
//! and k-reciprocal re-ranking, on (a) the novel classes of the embedded shapes dataset
//! embedded by the small CNN trained on its base classes (as in `fewshot_quick`) and (b) the
//! small synthetic SOP-like set.
//!
//! ```text
//! cargo run --release --example rerank_quick -- --epochs 5
//! ```

use anyhow::Result;
use candle_core::Tensor;
use clap::Parser;
use rankwise::fewshot::{quick_backbone_features, QuickBackboneConfig};
use rankwise::hierarchy::Labels;
use rankwise::losses::smooth_ap::SmoothAp;
use rankwise::rerank::k_reciprocal::KReciprocal;
use rankwise::rerank::query_expansion::{QueryExpansion, SSR_QE_NEIGHBOURS};
use rankwise::rerank::{CosineRanking, Reranker};
use rankwise::retrieval::EvalOptions;
use rankwise::synthetic_embeddings::SyntheticSpec;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Training epochs of the backbone on the base classes.
    #[arg(long, default_value_t = 5)]
    epochs: u64,
    /// Seed of the weights and the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn report(name: &str, r: &dyn Reranker, labels: &Labels, seconds: f64) -> Result<()> {
    let opts = EvalOptions {
        recall_ks: vec![1],
        hierarchical: false,
        per_level: false,
        chunk_size: 128,
        ..EvalOptions::default()
    };
    let e = r.evaluate(labels, None, &opts)?;
    let get = |m: &str| {
        e.rows
            .iter()
            .find(|row| row.metric == m)
            .map_or(f64::NAN, |row| row.value)
    };
    println!(
        "  {name:32} mAP@R {:6.2}  R@1 {:6.2}  mAP {:6.2}  ({seconds:.2} s)",
        100.0 * get("mAP@R"),
        100.0 * get("R@1"),
        100.0 * get("mAP")
    );
    Ok(())
}

fn table(features: &Tensor, labels: &Labels) -> Result<()> {
    let t = Instant::now();
    let cos = CosineRanking::new(features, None)?;
    report(
        "features only (cosine)",
        &cos,
        labels,
        t.elapsed().as_secs_f64(),
    )?;
    for k in SSR_QE_NEIGHBOURS {
        for (name, qe) in [
            ("AQE", QueryExpansion::aqe(k)),
            ("AQEwD", QueryExpansion::aqe_with_decay(k)),
            ("αQE (α = 3)", QueryExpansion::alpha_qe(k)),
            ("DQE", QueryExpansion::dqe(k)),
        ] {
            let t = Instant::now();
            let r = qe.fit(features, None)?;
            report(
                &format!("{name}, k = {k}"),
                &r,
                labels,
                t.elapsed().as_secs_f64(),
            )?;
        }
    }
    for (k1, k2, lambda) in [
        (20, 6, 0.3),
        (10, 5, 0.3),
        (40, 20, 0.3),
        (20, 6, 0.1),
        (20, 6, 0.5),
    ] {
        let t = Instant::now();
        let r = KReciprocal { k1, k2, lambda }.fit(features, None)?;
        report(
            &format!("k-reciprocal ({k1}, {k2}, {lambda})"),
            &r,
            labels,
            t.elapsed().as_secs_f64(),
        )?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut config = QuickBackboneConfig::default();
    config.train.seed = args.seed;
    config.train.epochs = args.epochs;
    config.train.eval.every = 0;
    config.train.eval.at_start = false;
    let t = Instant::now();
    let backbone = quick_backbone_features(&config, &SmoothAp::default())?;
    println!(
        "(a) embedded shapes, novel classes: {} images of {} classes, small CNN {} epochs of \
         Smooth-AP on {} base classes ({:.0} s)",
        backbone.labels.len(),
        backbone.novel_classes.len(),
        args.epochs,
        backbone.base_classes.len(),
        t.elapsed().as_secs_f64()
    );
    let fine = Labels::from_fine(&backbone.labels.column(0))?;
    table(
        &backbone.features.to_device(&candle_core::Device::Cpu)?,
        &fine,
    )?;
    let set = SyntheticSpec::small().generate()?;
    let fine = Labels::from_fine(&set.labels.column(0))?;
    println!(
        "(b) synthetic SOP-like set: {} items, {} classes, D = {}",
        fine.len(),
        SyntheticSpec::small().num_fine_classes,
        set.embeddings.dims()[1]
    );
    table(&set.embeddings, &fine)
}

//! SOP-scale evaluation benchmark (issue 2): 60,502 × 512 f32 embeddings, 11,316 fine classes of
//! 2–12 images, 12 coarse classes (the synthetic SOP-shaped set of `rankwise gen-embeddings
//! --preset sop`).
//!
//! (a) exact top-1000 kNN of every query (query excluded);
//! (b) full-ranking H-AP + ASI + NDCG + mAP@R + R@{1,10,100,1000} of every query.
//!
//! Reports wall time and peak resident memory of each phase (the peak is reset between phases
//! through `/proc/self/clear_refs`, so it includes the 124 MB of embeddings but not the other
//! phase). Run:
//!
//! ```text
//! cargo bench --bench eval_sop                       # both phases
//! cargo bench --bench eval_sop -- --phase knn --write-npy target/sop_bench.npy --write-knn target/sop_knn.npy
//! python benches/faiss_knn.py target/sop_bench.npy --k 1000 --threads 2 --check target/sop_knn.npy
//! ```
//! Threads: rayon's default (all cores); set `RAYON_NUM_THREADS` to pin.

use rankwise::retrieval::{evaluate, knn_with, EvalOptions, SelfMatch, Similarity};
use rankwise::synthetic_embeddings::SyntheticSpec;
use std::time::Instant;

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn reset_peak_rss() {
    // "5" resets the peak RSS counter (Linux ≥ 4.0); harmless where unsupported.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let phase = arg(&args, "--phase").unwrap_or_else(|| "both".into());
    let chunk: usize =
        arg(&args, "--chunk").map_or(Ok(EvalOptions::default().chunk_size), |s| s.parse())?;
    let threads = rayon::current_num_threads();

    let t = Instant::now();
    let set = SyntheticSpec::sop().generate()?;
    let (n, d) = set.embeddings.dims2()?;
    println!(
        "generated SOP-shaped set: {n} × {d}, {} levels, in {:.1} s; {threads} threads, chunk {chunk}",
        set.labels.num_levels(),
        t.elapsed().as_secs_f64()
    );
    if let Some(path) = arg(&args, "--write-npy") {
        set.embeddings.write_npy(&path)?;
        println!("wrote {path}");
    }

    if phase == "knn" || phase == "both" {
        reset_peak_rss();
        let t = Instant::now();
        let knn = knn_with(
            &set.embeddings,
            &set.embeddings,
            1000,
            SelfMatch::SameIndex,
            chunk,
            Similarity::Cosine,
            &candle_core::Device::Cpu,
            true,
        )?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "(a) top-1000 kNN of {n} queries: {secs:.2} s, peak RSS {:.0} MiB",
            peak_rss_mib()
        );
        if let Some(path) = arg(&args, "--write-knn") {
            let idx = candle_core::Tensor::from_vec(
                knn.indices.clone(),
                (n, 1000),
                &candle_core::Device::Cpu,
            )?;
            idx.write_npy(&path)?;
            println!("wrote {path}");
        }
    }

    if phase == "full" || phase == "both" {
        reset_peak_rss();
        let t = Instant::now();
        let opts = EvalOptions {
            recall_ks: vec![1, 10, 100, 1000],
            chunk_size: chunk,
            progress: true,
            per_level: false,
            ..EvalOptions::default()
        };
        let report = evaluate(&set.embeddings, &set.labels, None, &opts)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "(b) full ranking, H-AP + ASI + NDCG + mAP@R + R@{{1,10,100,1000}} (+ mAP, R-precision, P@k) of {n} queries: {secs:.2} s, peak RSS {:.0} MiB",
            peak_rss_mib()
        );
        for r in &report.rows {
            println!(
                "    {:<12} level {:<5} {:.4}  ({} queries, {} skipped)",
                r.metric,
                r.level.map_or("-".to_string(), |l| l.to_string()),
                r.value,
                r.queries,
                r.skipped
            );
        }
    }
    Ok(())
}

//! Runs the experiments of Smooth-AP, FastAP, RaMBO and HAPPIER at a scale and writes our
//! measurements and the check of each paper's claims to `paper_tables/measured/`:
//!
//! ```text
//! cargo run --release --example reproduce_measurements -- [--scale tiny|quick] [paper …]
//! ```
//!
//! Runs are cached under `target/rankwise-runs/<scale>/` (keyed by the full recipe), so a
//! second call, or a table sharing a run with another, does not train again.

use rankwise::experiments::{self, Runner, Scale};
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let mut scale = Scale::Quick;
    let mut papers = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--scale" {
            let v = args
                .next()
                .ok_or_else(|| anyhow::anyhow!("--scale needs a value"))?;
            scale = Scale::parse(&v)?;
        } else {
            papers.push(a);
        }
    }
    if papers.is_empty() {
        papers = experiments::PAPERS.iter().map(|p| p.to_string()).collect();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let runner = Runner::new(
        Some(root.join("target").join("rankwise-runs").join(scale.name())),
        true,
    );
    let out = root.join("paper_tables").join("measured");
    for paper in &papers {
        println!("== {paper} ({scale})");
        let (m, claims) = experiments::measure_paper(paper, root, &runner, scale)?;
        experiments::write_measurements(&out, paper, scale, &m, &claims)?;
        for c in &claims {
            println!("{}: {} ({})", c.claim, c.verdict(), c.evidence);
        }
    }
    println!("written to {}", out.display());
    Ok(())
}

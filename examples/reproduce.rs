//! Regenerates the paper tables and figures of Smooth-AP, FastAP, RaMBO, HAPPIER and SSR at a scale:
//!
//! ```text
//! cargo run --release --example reproduce -- [--scale tiny|quick|paper] [paper …]
//! ```
//!
//! Writes, per paper, `paper_tables/<paper>.md` (every table, paper / ours, the claims, the
//! figures), `paper_tables/<paper>/<table>.{csv,md}`, `paper_tables/measured/<paper>_<scale>.*`
//! and `figures/<paper>_*.{png,svg}`. The `tiny` scale (seconds, numbers meaningless) writes
//! under `target/reproduce-tiny/` instead, so that it never overwrites the committed tables.
//!
//! Runs are cached under `target/rankwise-runs/<scale>/` (keyed by the full recipe), so a
//! second call, or a table sharing a run with another, does not train again.

use rankwise::experiments::{self, Runner, Scale};
use std::path::Path;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut scale = experiments::scale_from_env(Scale::Quick)?;
    let mut papers = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--scale" {
            let v = args
                .next()
                .ok_or_else(|| anyhow::anyhow!("--scale needs a value: tiny, quick or paper"))?;
            scale = v.parse()?;
        } else if a == "-h" || a == "--help" {
            println!(
                "usage: reproduce [--scale tiny|quick|paper] [smooth_ap|fastap|rambo|happier|ssr …]"
            );
            return Ok(());
        } else {
            papers.push(a);
        }
    }
    if papers.is_empty() {
        papers = experiments::PAPERS.iter().map(|p| p.to_string()).collect();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let runner = Runner::new(
        Some(
            root.join("target")
                .join("rankwise-runs")
                .join(scale.as_str()),
        ),
        true,
    );
    let (tables_dir, figures_dir) = if scale == Scale::Tiny {
        let base = root.join("target").join("reproduce-tiny");
        (base.join("paper_tables"), base.join("figures"))
    } else {
        (root.join("paper_tables"), root.join("figures"))
    };
    let start = Instant::now();
    for paper in &papers {
        println!("== {paper} ({scale}) — runs not in the cache train now, one line each");
        let r = experiments::reproduce_paper(paper, root, &runner, scale)?;
        let (page, figures) = experiments::write_paper(&tables_dir, &figures_dir, &r)?;
        for c in &r.claims {
            println!("  {}: {} ({})", c.claim, c.verdict(), c.evidence);
        }
        println!("  tables: {}", page.display());
        for f in figures {
            println!("  figure: {}", f.display());
        }
    }
    println!("done in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}

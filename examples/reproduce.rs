//! Thin wrapper kept for old instructions: the same as `rankwise reproduce`
//! (`cargo run --release -- reproduce [--scale tiny|quick|paper] [paper …]`), which see.
//!
//! ```text
//! cargo run --release --example reproduce -- [--scale tiny|quick|paper] [paper …]
//! ```

use rankwise::experiments::{self, ReproduceDirs, Scale};
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
                "usage: reproduce [--scale tiny|quick|paper] [smooth_ap|fastap|rambo|happier|ssr …] \
                 (same as `rankwise reproduce`)"
            );
            return Ok(());
        } else {
            papers.push(a);
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let start = Instant::now();
    let dirs = ReproduceDirs::defaults(root, scale);
    experiments::reproduce(&papers, scale, &dirs, true, &mut std::io::stdout())?;
    println!("done in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}

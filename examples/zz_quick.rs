use rankwise::experiments::{self, ExperimentRecipe, Runner, Scale};
use std::path::Path;
fn main() -> anyhow::Result<()> {
    let root = Path::new(".");
    let runner = Runner::new(Some("target/rankwise-runs/quick".into()), true);
    let which: Vec<String> = std::env::args().skip(1).collect();
    for paper in ["smooth_ap", "rambo", "fastap", "happier"] {
        if !which.is_empty() && !which.iter().any(|w| w == paper) {
            continue;
        }
        let recipe = ExperimentRecipe::for_paper(root, paper)?;
        let (m, claims) = match paper {
            "smooth_ap" => {
                let m = experiments::smooth_ap::measure(&runner, &recipe, Scale::Quick)?;
                let c = experiments::smooth_ap::claims(&m);
                (m, c)
            }
            "fastap" => {
                let m = experiments::fastap::measure(&runner, &recipe, Scale::Quick)?;
                let c = experiments::fastap::claims(&m, &recipe.quick);
                (m, c)
            }
            "rambo" => {
                let m = experiments::rambo::measure(&runner, &recipe, Scale::Quick)?;
                let c = experiments::rambo::claims(&m);
                (m, c)
            }
            _ => {
                let m = experiments::happier::measure(&runner, &recipe, Scale::Quick)?;
                let c = experiments::happier::claims(&m);
                (m, c)
            }
        };
        for c in &m.cells {
            println!(
                "CELL {paper} | {} | {} | {} | {} | {:.2}",
                c.table, c.method, c.setting, c.metric, c.value
            );
        }
        for c in &claims {
            println!(
                "CLAIM {paper} | {} | {} | {}",
                c.claim,
                c.verdict(),
                c.evidence
            );
        }
    }
    Ok(())
}

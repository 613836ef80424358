//! Generates the embedded dataset, times it, measures how hard retrieval is without learning, and
//! optionally writes a PNG grid of samples.
//!
//! ```text
//! cargo run --release --example embedded_dataset -- --png figures/embedded_dataset_samples.png
//! ```
//!
//! Difficulty = R@1 at each level (nearest neighbour by cosine similarity, the query excluded)
//! on the test split (second half of the fine classes of every variant), for raw pixels and for a
//! random linear projection of them (a stand-in for an untrained linear embedding).

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use clap::Parser;
use rand_distr::{Distribution, Normal};
use rankwise::data::{retrieval_split, ShapesConfig};
use rankwise::hierarchy::Labels;
use rankwise::samplers::stream_rng;
use std::time::Instant;

#[derive(Parser)]
struct Args {
    /// Images per fine class (default: the dataset default, 30).
    #[arg(long)]
    images_per_class: Option<usize>,
    /// Variants per family (default 4; up to 6 adds the two-tone and checkered patterns).
    #[arg(long)]
    variants_per_family: Option<usize>,
    /// Seed of the dataset.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write a grid of samples (families × variants × 3 images) to this PNG file.
    #[arg(long)]
    png: Option<std::path::PathBuf>,
}

/// Index of the nearest other item of every row of `x` (cosine similarity).
fn nearest_neighbours(x: &Tensor) -> Result<Vec<usize>> {
    let norms = x.sqr()?.sum_keepdim(1)?.sqrt()?;
    let x = x.broadcast_div(&norms)?;
    let sim = x.matmul(&x.t()?)?;
    let n = x.dim(0)?;
    let sim = (sim - (Tensor::eye(n, DType::F32, x.device())? * 1e9)?)?;
    let nn: Vec<u32> = sim.argmax(D::Minus1)?.to_vec1()?;
    Ok(nn.into_iter().map(|j| j as usize).collect())
}

/// R@1 at each level `l`: the fraction of queries whose nearest neighbour shares their level-`l`
/// class.
fn recall_at_1_per_level(nn: &[usize], labels: &Labels) -> Vec<f64> {
    (0..labels.num_levels())
        .map(|l| {
            let hits = (0..nn.len())
                .filter(|&i| labels.row(i)[l] == labels.row(nn[i])[l])
                .count();
            hits as f64 / nn.len() as f64
        })
        .collect()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut config = ShapesConfig {
        seed: args.seed,
        ..ShapesConfig::default()
    };
    if let Some(k) = args.images_per_class {
        config.images_per_class = k;
    }
    if let Some(v) = args.variants_per_family {
        config.variants_per_family = v;
    }
    let threads = rayon::current_num_threads();
    let start = Instant::now();
    let set = config.generate()?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "generated {} images ({} fine / {} variants / {} families, {}×{}) in {secs:.2} s on {threads} threads",
        set.len(),
        config.num_classes(),
        config.families * config.variants_per_family,
        config.families,
        config.image_size,
        config.image_size
    );

    let split = retrieval_split(set.labels(), 1)?;
    let test = set.select(&split.test)?;
    let labels = test.labels();
    let x = test.to_tensor(&Device::Cpu)?.flatten_from(1)?;
    let n = test.len();
    let positives = config.images_per_class - 1;
    println!(
        "test split: {} classes, {n} queries; chance R@1 (fine) = {positives}/{} = {:.4}",
        split.test_classes.len(),
        n - 1,
        positives as f64 / (n - 1) as f64
    );
    let report = |name: &str, feats: &Tensor| -> Result<()> {
        let r = recall_at_1_per_level(&nearest_neighbours(feats)?, labels);
        println!(
            "{name:<34} R@1 fine {:.4}  variant {:.4}  family {:.4}",
            r[0], r[1], r[2]
        );
        Ok(())
    };
    report("raw pixels", &x)?;
    let mean = x.mean_keepdim(0)?;
    report("raw pixels, mean image removed", &x.broadcast_sub(&mean)?)?;
    let d = x.dim(1)?;
    for seed in 0..3u64 {
        // A seeded Gaussian projection 3072 → 128, as an untrained linear embedding layer.
        let mut rng = stream_rng(seed, 0);
        let normal = Normal::new(0f32, 1.0 / (d as f32).sqrt())?;
        let w: Vec<f32> = (0..d * 128).map(|_| normal.sample(&mut rng)).collect();
        let w = Tensor::from_vec(w, (d, 128), &Device::Cpu)?;
        report(
            &format!("random linear 3072→128 (seed {seed})"),
            &x.matmul(&w)?,
        )?;
    }

    if let Some(path) = args.png {
        // One row per family; for each variant, 3 images of one of its fine classes.
        let f = config.fine_per_variant;
        let v = config.variants_per_family;
        let mut indices = Vec::new();
        for family in 0..config.families {
            for variant in 0..v {
                let fine = (family * v + variant) * f + (family + variant) % f;
                for j in 0..3 {
                    indices.push(fine * config.images_per_class + j);
                }
            }
        }
        let (rgb, w, h) = set.grid_rgb8(&indices, 3 * v, 255)?;
        let scale = 2;
        let mut big = vec![0u8; w * h * scale * scale * 3];
        for y in 0..h * scale {
            for x in 0..w * scale {
                let src = ((y / scale) * w + x / scale) * 3;
                big[(y * w * scale + x) * 3..][..3].copy_from_slice(&rgb[src..src + 3]);
            }
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut encoder = png::Encoder::new(file, (w * scale) as u32, (h * scale) as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::High);
        encoder.write_header()?.write_image_data(&big)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

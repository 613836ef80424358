//! RaMBO Sec. 4.3, Fig. 2 (its problem P1): "mini-batch estimates of dataset-wide rank metrics
//! are biased: the expected minibatch mAP is an overly optimistic estimator of the true mAP,
//! especially for small batches".
//!
//! The statement is about the metric, not about training, so it needs fixed scores only (the
//! paper plots it for any fixed embedding). We take SOP-shaped synthetic embeddings
//! ([`crate::synthetic_embeddings`]: class sizes 2–12, as in SOP), compute the dataset mAP
//! exactly (every item a query against all the others), then draw batches as training does —
//! m-per-class with 2 images per class, so every query has a positive in its batch — and compute
//! each batch's mAP (each item of the batch a query against the rest of the batch). Each batch
//! size gives a sample of batch mAPs: its mean is the expected minibatch estimate.

use crate::error::Result;
use crate::report::{Measured, Provenance, Unit};
use crate::retrieval::{evaluate, EvalOptions};
use crate::synthetic_embeddings::SyntheticSpec;
use crate::train::SamplerConfig;
use candle_core::Tensor;

use super::Scale;

/// The table of our cells (the paper prints no numbers for its Fig. 2).
pub const TABLE: &str = "Fig. 2 (ours)";
/// The row of the dataset-wide mAP.
pub const DATASET_ROW: &str = "dataset mAP";
/// The rows of the minibatch estimates (setting `batch=B`).
pub const BATCH_ROW: &str = "minibatch mAP";

/// What one scale measures.
#[derive(Debug, Clone, PartialEq)]
pub struct MinibatchApConfig {
    /// The fixed embeddings.
    pub spec: SyntheticSpec,
    /// The batch sizes, increasing.
    pub batch_sizes: Vec<usize>,
    /// Batches drawn per batch size (the first ones of the sampler's first epoch).
    pub batches: usize,
    /// Images per class in a batch.
    pub samples_per_class: usize,
}

impl MinibatchApConfig {
    /// `tiny`: the 600-item synthetic set, 4 batch sizes, 20 batches each; the other scales:
    /// 6,000 items in 128 dimensions (1,100 classes), batch sizes 8 to 1,024, 50 batches each.
    pub fn for_scale(scale: Scale) -> Self {
        match scale {
            Scale::Tiny => MinibatchApConfig {
                spec: SyntheticSpec::small(),
                batch_sizes: vec![8, 16, 32, 64],
                batches: 20,
                samples_per_class: 2,
            },
            Scale::Quick | Scale::Standard | Scale::Paper => MinibatchApConfig {
                spec: SyntheticSpec {
                    num_items: 6_000,
                    num_fine_classes: 1_100,
                    dim: 128,
                    ..SyntheticSpec::small()
                },
                batch_sizes: vec![8, 16, 32, 64, 128, 256, 512, 1024],
                batches: 50,
                samples_per_class: 2,
            },
        }
    }
}

/// The dataset mAP and, per batch size, each batch's mAP (fine level), as cells of [`TABLE`]
/// standing beside the paper's `dataset` column.
pub fn measure(config: &MinibatchApConfig, scale: Scale, dataset: &str) -> Result<Vec<Measured>> {
    let set = config.spec.generate()?;
    let opts = EvalOptions {
        recall_ks: vec![1],
        ..EvalOptions::default()
    };
    let map = |emb: &Tensor, labels: &crate::hierarchy::Labels| -> Result<f64> {
        let report = evaluate(emb, labels, None, &opts)?;
        report.get("mAP", Some(0)).ok_or_else(|| {
            crate::error::Error::invalid("minibatch mAP", "the evaluation has no mAP")
        })
    };
    let what = format!(
        "SOP-shaped synthetic embeddings ({} items, {} classes of 2–12, dim {}, seed {})",
        config.spec.num_items, config.spec.num_fine_classes, config.spec.dim, config.spec.seed
    );
    let mut cells = vec![Measured::new(
        TABLE,
        DATASET_ROW,
        dataset,
        "mAP",
        map(&set.embeddings, &set.labels)?,
        Unit::Fraction,
        Provenance::new(
            "synthetic embeddings",
            scale,
            format!("{what}; every item a query against all the others"),
        ),
    )];
    for &b in &config.batch_sizes {
        let sampler = SamplerConfig::MPerClass {
            batch_size: b,
            samples_per_class: config.samples_per_class,
            level: 0,
            batches_per_epoch: None,
            shuffle_within_batch: false,
        }
        .build(&set.labels, config.spec.seed)?;
        let mut values = Vec::with_capacity(config.batches);
        for batch in sampler.batches(0).into_iter().take(config.batches) {
            let idx = Tensor::new(
                batch.iter().map(|&i| i as u32).collect::<Vec<u32>>(),
                set.embeddings.device(),
            )?;
            values.push(map(
                &set.embeddings.index_select(&idx, 0)?,
                &set.labels.select(&batch)?,
            )?);
        }
        let n = values.len();
        cells.push(
            Measured::over_seeds(
                TABLE,
                BATCH_ROW,
                dataset,
                "mAP",
                values,
                Unit::Fraction,
                Provenance::new(
                    "synthetic embeddings",
                    scale,
                    format!(
                        "{what}; {n} batches of {b} ({} per class), each item a query against \
                         the rest of its batch; mean ± 95% interval over the batches",
                        config.samples_per_class
                    ),
                ),
            )
            .with_setting(format!("batch={b}")),
        );
    }
    Ok(cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_batches_overestimate_the_dataset_map() {
        let config = MinibatchApConfig::for_scale(Scale::Tiny);
        let cells = measure(&config, Scale::Tiny, "SOP").unwrap();
        assert_eq!(cells.len(), 1 + config.batch_sizes.len());
        let dataset = cells[0].value;
        let batch8 = &cells[1];
        assert_eq!(batch8.samples.len(), config.batches);
        assert_eq!(batch8.setting, "batch=8");
        // A batch of 8 holds 4 classes: each query's positive competes with 6 negatives, not
        // with hundreds, so its AP is far higher.
        assert!(
            batch8.value > dataset + 0.1,
            "{} vs {dataset}",
            batch8.value
        );
    }
}

//! The DyML evaluation protocol (Sun et al., "Dynamic Metric Learning", CVPR 2021), used by
//! HAPPIER Table 2.
//!
//! Each semantic scale (fine, middle, coarse) has its own test set of queries and a gallery with
//! *binary* labels at that scale. mAP, binary ASI and R@1 are computed on each scale separately
//! and then averaged over the scales (HAPPIER supp. B.3; the authors' `overall_accuracy_hook`).
//! H-AP and NDCG are not defined there: the test sets carry no tree.

use super::{evaluate, EvalOptions, SelfMatch};
use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use candle_core::Tensor;
use serde::Serialize;

/// One scale's query and gallery sets, with flat labels (one column).
pub struct DymlScale<'a> {
    /// Name shown in reports (`"fine"`, `"middle"`, `"coarse"`).
    pub name: String,
    /// Query embeddings, `N_q × D`.
    pub queries: &'a Tensor,
    /// Query labels at this scale.
    pub query_labels: &'a Labels,
    /// Gallery embeddings, `N_g × D`.
    pub gallery: &'a Tensor,
    /// Gallery labels at this scale.
    pub gallery_labels: &'a Labels,
}

/// mAP, ASI and R@1 of one scale.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DymlScaleResult {
    /// The scale's name.
    pub name: String,
    /// Mean AP over queries with a positive.
    pub map: f64,
    /// Mean binary ASI.
    pub asi: f64,
    /// Mean R@1.
    pub recall_at_1: f64,
    /// Queries skipped for having no positive in the gallery.
    pub skipped: usize,
}

/// Per-scale results and their averages (HAPPIER Table 2's "mAP", "ASI", "R@1").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DymlResult {
    /// One entry per scale, in the order given.
    pub scales: Vec<DymlScaleResult>,
    /// Average of the per-scale mAPs.
    pub map: f64,
    /// Average of the per-scale ASIs.
    pub asi: f64,
    /// Average of the per-scale R@1.
    pub recall_at_1: f64,
}

/// Evaluates every scale with disjoint query/gallery sets and averages the three metrics.
///
/// `base` supplies the chunk size, similarity, device and progress settings; the metric choice
/// and the self-match rule are fixed by the protocol.
pub fn evaluate_dyml(scales: &[DymlScale<'_>], base: &EvalOptions) -> Result<DymlResult> {
    if scales.is_empty() {
        return Err(Error::invalid(
            "scales",
            "the DyML protocol needs at least one scale",
        ));
    }
    let mut out = Vec::with_capacity(scales.len());
    for s in scales {
        if s.query_labels.num_levels() != 1 || s.gallery_labels.num_levels() != 1 {
            return Err(Error::invalid(
                "labels",
                format!("DyML scale '{}' must have one binary label column", s.name),
            ));
        }
        let opts = EvalOptions {
            recall_ks: vec![1],
            hierarchical: true,
            per_level: false,
            self_match: SelfMatch::None,
            ..base.clone()
        };
        let report = evaluate(
            s.queries,
            s.query_labels,
            Some((s.gallery, s.gallery_labels)),
            &opts,
        )?;
        let get = |m: &str, l: Option<usize>| report.get(m, l).unwrap_or(f64::NAN);
        let skipped = report
            .rows
            .iter()
            .find(|r| r.metric == "mAP")
            .map_or(0, |r| r.skipped);
        out.push(DymlScaleResult {
            name: s.name.clone(),
            map: get("mAP", Some(0)),
            // With one label column, ASI is the binary ASI of the DyML paper.
            asi: get("ASI", None),
            recall_at_1: get("R@1", Some(0)),
            skipped,
        });
    }
    let mean = |f: fn(&DymlScaleResult) -> f64| out.iter().map(f).sum::<f64>() / out.len() as f64;
    Ok(DymlResult {
        map: mean(|r| r.map),
        asi: mean(|r| r.asi),
        recall_at_1: mean(|r| r.recall_at_1),
        scales: out,
    })
}

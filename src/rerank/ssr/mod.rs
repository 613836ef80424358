//! SSR — learned re-ranking by synthetic-gradient feature refinement (Shen, Xiao, Hu, Sbai,
//! Aubry, *Re-ranking for image retrieval and transductive few-shot classification*, NeurIPS
//! 2021).
//!
//! The similarity graph of a query and its top-k references (retrieval) or of an episode's
//! support nodes and queries (transductive few-shot) is decomposed into one subgraph per node
//! with columns sorted by similarity to it ([`graph`], Sec. 2.2); a small MLP predicts an
//! update of every subgraph entry ([`model`], Sec. 2.4), the predictions are summed back into
//! the graph (GraphSum, Eq. 5) and turned into a feature update through the closed-form
//! derivative of cosine similarity (Eq. 4, [`update`]); after `T` updates the refined
//! similarities re-rank the top-k or classify the queries. The MLP and the temperature are
//! meta-trained on the training classes ([`train`], Eqs. 6–7).
//!
//! * [`SsrRanking`] is a [`Reranker`]: it refines each query's top-k list (from the features
//!   or from any other re-ranker's [`TopN`]) and leaves ranks beyond k unchanged.
//! * [`SsrClassifier`] is an [`EpisodeClassifier`].
//!
//! Where the paper and the authors' code differ, both are implemented
//! ([`graph::Layout`], [`model::UpdateRule`], [`model::GroupSchedule`],
//! [`model::RetrievalLoss`], [`SupportNodes`]); the defaults follow the paper.
//!
//! The ablations of Tables 3–4 are switches of [`SsrConfig`]: the rows and columns of `M_i`
//! ([`NodeGroup`]), the local sort ([`ColumnOrder`]), the subgraph decomposition
//! ([`Decomposition`]) and the feature update ([`UpdateSpace`]); Sec. 2.3's k-reciprocal input
//! `D^t = 2α(1 − S^t) + (1 − α)J` (Eq. 9) is [`SsrInput::KReciprocal`].

pub mod alternating;
pub mod graph;
pub mod model;
pub mod select;
pub mod train;
pub mod update;

pub use graph::{ColumnOrder, Decomposition, Layout, NodeGroup, SubgraphIndex, SubgraphSpec, Task};
pub use model::{
    GroupSchedule, RetrievalLoss, SsrConfig, SsrInput, SsrModel, UpdateRule, UpdateSpace,
};
pub use train::{meta_train, FewShotTasks, MetaTrainConfig, RetrievalTasks, Stage, TaskSource};

use super::{CosineRanking, Reranker, TopN};
use crate::error::{Error, Result};
use crate::fewshot::{argmax, EpisodeClassifier, EpisodeFeatures};
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// The support nodes of the few-shot graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupportNodes {
    /// Every support image is a node (the paper: `|S|` = the support set; Eq. 7 sums over
    /// support samples).
    #[default]
    Shots,
    /// One node per class, the mean of its shots (the authors' code, `SupportFeat.mean(1)`).
    Prototypes,
}

/// The node features of an episode (support nodes then queries, in `dtype`) and the class of
/// each support node.
pub fn episode_nodes(
    ep: &EpisodeFeatures,
    support_nodes: SupportNodes,
    dtype: DType,
) -> Result<(Tensor, Vec<usize>)> {
    let (support, labels) = match support_nodes {
        SupportNodes::Shots => (
            ep.support.to_dtype(DType::F64)?.to_vec2::<f64>()?,
            ep.support_labels.clone(),
        ),
        SupportNodes::Prototypes => (ep.prototypes()?, (0..ep.n_way).collect()),
    };
    let query = ep.query_rows()?;
    let dim = query.first().map_or(0, Vec::len);
    let rows: Vec<f64> = support.iter().chain(&query).flatten().copied().collect();
    let n = support.len() + query.len();
    Ok((
        Tensor::from_vec(rows, (n, dim), &Device::Cpu)?.to_dtype(dtype)?,
        labels,
    ))
}

/// SSR as a [`Reranker`] (SSR Table 1, "+ SSR" rows): each query's top-k references (of the
/// first-stage list) refined by the model; their scores become `3 + s^T(q, j)` so that they
/// stay ahead of every other reference, whose scores (cosine similarity) are unchanged.
pub struct SsrRanking {
    cosine: CosineRanking,
    top: TopN,
    refined: Vec<f64>,
}

impl SsrRanking {
    /// Refines `top` (every query's first-stage top-k, e.g. [`TopN::from_features`] or
    /// [`TopN::from_reranker`] of AQE / k-reciprocal) with `model`, on the features of
    /// `queries` and `references` (`None`: the queries are the references).
    ///
    /// Errors if the model was trained for another `k`, if `top` does not list every query,
    /// or on bad features (non-finite, dimension mismatch).
    pub fn new(
        model: &SsrModel,
        queries: &Tensor,
        references: Option<&Tensor>,
        top: TopN,
    ) -> Result<Self> {
        let cosine = CosineRanking::new(queries, references)?;
        let (nq, nr) = (cosine.num_queries(), cosine.num_references());
        if model.task != (Task::Retrieval { k: top.n }) {
            return Err(Error::invalid(
                "top",
                format!(
                    "lists of {} references for a model of {:?}",
                    top.n, model.task
                ),
            ));
        }
        if top.num_queries() != nq || top.indices.iter().any(|&j| j as usize >= nr) {
            return Err(Error::Shape(format!(
                "the top-k lists cover {} queries (references < {nr} expected), the features {nq}",
                top.num_queries()
            )));
        }
        let mut refined = Vec::with_capacity(nq * top.n);
        for q in 0..nq {
            let idx: Vec<u32> = top.row_indices(q).to_vec();
            let idx_t = Tensor::from_vec(idx, top.n, &Device::Cpu)?;
            let nodes = Tensor::cat(
                &[
                    cosine.queries().narrow(0, q, 1)?,
                    cosine.references().index_select(&idx_t, 0)?,
                ],
                0,
            )?;
            refined.extend(model.refine_retrieval(&nodes)?);
        }
        Ok(SsrRanking {
            cosine,
            top,
            refined,
        })
    }

    /// The refined similarities `s^T(q, j)` of query `q`'s top-k, in the first-stage order.
    pub fn refined_row(&self, q: usize) -> &[f64] {
        &self.refined[q * self.top.n..(q + 1) * self.top.n]
    }
}

impl Reranker for SsrRanking {
    fn num_queries(&self) -> usize {
        self.cosine.num_queries()
    }
    fn num_references(&self) -> usize {
        self.cosine.num_references()
    }
    fn queries_are_references(&self) -> bool {
        self.cosine.queries_are_references()
    }
    /// The cosine scores, with each query's top-k replaced by `3 + s^T` (above every cosine).
    fn scores(&self, start: usize, len: usize) -> Result<Vec<f32>> {
        let mut s = self.cosine.scores(start, len)?;
        let nr = self.num_references();
        for r in 0..len {
            let q = start + r;
            for (&j, &v) in self.top.row_indices(q).iter().zip(self.refined_row(q)) {
                s[r * nr + j as usize] = 3.0 + v as f32;
            }
        }
        Ok(s)
    }
}

/// SSR as a transductive few-shot classifier (SSR Table 2, "+ Ours"): the episode's support
/// nodes and queries refined jointly, each query labelled with the class whose mean refined
/// support node is nearest (cosine).
pub struct SsrClassifier<'a> {
    /// The meta-trained model (its task fixes the support-node and query counts).
    pub model: &'a SsrModel,
    /// Prototypes or shots as nodes (must match how the model was trained).
    pub support_nodes: SupportNodes,
}

impl EpisodeClassifier for SsrClassifier<'_> {
    fn predict(&self, ep: &EpisodeFeatures) -> Result<Vec<usize>> {
        let (nodes, labels) = episode_nodes(ep, self.support_nodes, self.model.dtype)?;
        let scores = self.model.few_shot_scores(&nodes, &labels, ep.n_way)?;
        Ok(scores.iter().map(|s| argmax(s)).collect())
    }
}

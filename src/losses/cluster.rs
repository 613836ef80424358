//! HAPPIER's clustering loss `L_clust` (Eq. 6): a normalised softmax over learnable,
//! L2-normalised proxies, one per fine training class,
//!
//! ```text
//! L_clust = − log( exp(v_y·p_y / σ) / Σ_z exp(v_y·p_z / σ) ),   σ = 0.05,
//! ```
//!
//! averaged over the batch (the authors' `ClusterLoss`, adapted from NormSoftmax, with
//! `nn.CrossEntropyLoss`). The paper does not give σ; 0.05 is the code's value. It is exactly
//! the normalised-softmax baseline over the fine classes, so it *is* [`NormSoftmax`] (proxies
//! initialised `U(−1/√d, 1/√d)` as `nn.Linear` weights, σ = 0.05, embeddings normalised): build
//! it with [`NormSoftmax::new`] on the fine training classes or [`NormSoftmax::for_level`] at
//! level 0.

pub use crate::losses::norm_softmax::NormSoftmax;

/// HAPPIER's `L_clust` (Eq. 6): the normalised softmax over fine-class proxies.
pub type ClusterLoss = NormSoftmax;

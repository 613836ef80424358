//! Files in and out: embeddings (`.npy`, `.safetensors`), hierarchical labels (CSV, parquet) and
//! evaluation results, retrieval and few-shot (JSON, CSV, written atomically).
//!
//! Every reader validates what it reads and names the file (and the line, row or column) in its
//! errors, so that a bad input never reaches the ranking engine as a silent NaN or a panic.

pub mod atomic;
pub mod embeddings;
pub mod fewshot_results;
pub(crate) mod json_f64;
pub mod labels;
pub mod results;

pub use atomic::{check_output_dir, check_output_file, write_atomically};
pub use embeddings::{read_embeddings, read_npy, read_safetensors, write_npy};
pub use labels::{read_labels, read_labels_csv, read_labels_parquet, write_labels_csv, LabelTable};
pub use results::{write_results, ResultFormat, ResultRow, ResultTable, Versus};

use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use candle_core::Tensor;
use std::path::Path;

/// Embeddings and their labels, read from two files and checked to describe the same items.
#[derive(Debug, Clone)]
pub struct LabelledEmbeddings {
    /// `N × D` f32 embeddings on the CPU.
    pub embeddings: Tensor,
    /// `N × L` labels, finest level first.
    pub labels: Labels,
    /// One name per label level (the CSV header or parquet column names), finest first.
    pub level_names: Vec<String>,
}

impl LabelledEmbeddings {
    /// Reads `embeddings` (see [`read_embeddings`]) and `labels` (see [`read_labels`]) and checks
    /// that they hold the same number of items.
    ///
    /// The labels are read first: they are small, so a wrong label file fails before the large
    /// embedding file is loaded.
    pub fn read(
        embeddings: &Path,
        labels: &Path,
        label_columns: Option<&[String]>,
        tensor_name: Option<&str>,
    ) -> Result<Self> {
        let table = read_labels(labels, label_columns)?;
        let x = read_embeddings(embeddings, tensor_name)?;
        check_same_items(&x, embeddings, &table.labels, labels)?;
        Ok(LabelledEmbeddings {
            embeddings: x,
            labels: table.labels,
            level_names: table.level_names,
        })
    }

    /// Number of items `N`.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Always false: empty embeddings and labels are rejected when read.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Embedding dimension `D`.
    pub fn dim(&self) -> Result<usize> {
        Ok(self.embeddings.dims2()?.1)
    }
}

/// Errors unless `embeddings` (read from `embeddings_path`) has one row per item of `labels`
/// (read from `labels_path`); the message names both files and both counts.
pub fn check_same_items(
    embeddings: &Tensor,
    embeddings_path: &Path,
    labels: &Labels,
    labels_path: &Path,
) -> Result<()> {
    let (n, _) = embeddings.dims2()?;
    if n != labels.len() {
        return Err(Error::Shape(format!(
            "{} holds {n} embeddings but {} holds {} labels; they must describe the same items, \
             in the same order",
            embeddings_path.display(),
            labels_path.display(),
            labels.len()
        )));
    }
    Ok(())
}

/// Errors unless queries and references can be ranked against each other: the same embedding
/// dimension and the same number of label levels. The message names the files.
pub fn check_compatible_sets(
    queries: &LabelledEmbeddings,
    queries_path: &Path,
    references: &LabelledEmbeddings,
    references_path: &Path,
) -> Result<()> {
    let (dq, dr) = (queries.dim()?, references.dim()?);
    if dq != dr {
        return Err(Error::Shape(format!(
            "queries {} have dimension {dq} but references {} have dimension {dr}",
            queries_path.display(),
            references_path.display()
        )));
    }
    queries.labels.check_compatible(&references.labels)
}

/// `text` split at the commas outside brackets (`()`, `[]`, `{}`) and quotes, pieces untrimmed:
/// a `.npy` header's dictionary, a search's list of TOML values.
pub(crate) fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None::<char>, 0);
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => depth += 1,
            (None, ')' | ']' | '}') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn count_mismatch_names_both_files() {
        let x = Tensor::zeros((3, 2), candle_core::DType::F32, &Device::Cpu).unwrap();
        let y = Labels::from_fine(&[0, 0]).unwrap();
        let e = check_same_items(&x, Path::new("e.npy"), &y, Path::new("l.csv"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("e.npy holds 3") && e.contains("l.csv holds 2"),
            "{e}"
        );
        let y = Labels::from_fine(&[0, 0, 1]).unwrap();
        assert!(check_same_items(&x, Path::new("e.npy"), &y, Path::new("l.csv")).is_ok());
    }

    #[test]
    fn dimension_mismatch_is_a_shape_error() {
        let set = |d: usize| LabelledEmbeddings {
            embeddings: Tensor::zeros((2, d), candle_core::DType::F32, &Device::Cpu).unwrap(),
            labels: Labels::from_fine(&[0, 1]).unwrap(),
            level_names: vec!["class".into()],
        };
        let e = check_compatible_sets(&set(4), Path::new("q.npy"), &set(5), Path::new("r.npy"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dimension 4") && e.contains("dimension 5"),
            "{e}"
        );
        assert!(
            check_compatible_sets(&set(4), Path::new("q.npy"), &set(4), Path::new("r.npy")).is_ok()
        );
    }
}

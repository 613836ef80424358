//! Where one of our numbers comes from: the data, the scale of the run, and the details a reader
//! needs to judge how comparable it is to the paper's.

use serde::{Deserialize, Serialize};

/// The data and run behind one of our values.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Provenance {
    /// The data that produced it, e.g. `embedded shapes` or `SOP`.
    pub dataset: String,
    /// The scale of the run, as the experiments name it (`tiny`, `quick`, `paper`).
    pub scale: String,
    /// What a reader needs to compare, e.g. `3,840 test queries, small CNN, 5 epochs`.
    pub detail: String,
}

impl Provenance {
    /// A provenance record.
    pub fn new(
        dataset: impl Into<String>,
        scale: impl std::fmt::Display,
        detail: impl Into<String>,
    ) -> Self {
        Provenance {
            dataset: dataset.into(),
            scale: scale.to_string(),
            detail: detail.into(),
        }
    }

    /// One line for a table caption: `` `quick` scale, embedded shapes: 3,840 test queries ``.
    pub fn describe(&self) -> String {
        if self.detail.is_empty() {
            format!("`{}` scale, {}", self.scale, self.dataset)
        } else {
            format!("`{}` scale, {}: {}", self.scale, self.dataset, self.detail)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_names_scale_dataset_and_detail() {
        let p = Provenance::new("embedded shapes", "quick", "small CNN, 5 epochs");
        assert_eq!(
            p.describe(),
            "`quick` scale, embedded shapes: small CNN, 5 epochs"
        );
        let p = Provenance::new("SOP", "paper", "");
        assert_eq!(p.describe(), "`paper` scale, SOP");
    }
}

//! Where one of our numbers comes from: the data, the scale of the run, and the details a reader
//! needs to judge how comparable it is to the paper's.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How large a run is. Every regenerated table states it, because a `Quick` number is not
/// expected to equal the paper's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Seconds on CI: a few items and steps, only to exercise the code path.
    Tiny,
    /// Minutes on a CPU: the embedded dataset, a small CNN.
    Quick,
    /// The paper's data and models (a GPU).
    Paper,
}

impl Scale {
    /// `tiny`, `quick`, `paper`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scale::Tiny => "tiny",
            Scale::Quick => "quick",
            Scale::Paper => "paper",
        }
    }
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scale {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "tiny" => Ok(Scale::Tiny),
            "quick" => Ok(Scale::Quick),
            "paper" => Ok(Scale::Paper),
            _ => Err(Error::invalid(
                "scale",
                format!("unknown scale {s:?}; expected tiny, quick or paper"),
            )),
        }
    }
}

/// The data and run behind one of our values.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Provenance {
    /// The data that produced it, e.g. `embedded shapes` or `SOP`.
    pub dataset: String,
    /// The scale of the run.
    pub scale: Scale,
    /// What a reader needs to compare, e.g. `3,840 test queries, small CNN, 5 epochs`.
    pub detail: String,
}

impl Provenance {
    /// A provenance record.
    pub fn new(dataset: impl Into<String>, scale: Scale, detail: impl Into<String>) -> Self {
        Provenance {
            dataset: dataset.into(),
            scale,
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
    fn scale_round_trips_through_text_and_serde() {
        for s in [Scale::Tiny, Scale::Quick, Scale::Paper] {
            assert_eq!(s.to_string().parse::<Scale>().unwrap(), s);
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<Scale>(&json).unwrap(), s);
        }
        let e = "huge".parse::<Scale>().unwrap_err().to_string();
        assert!(e.contains("scale") && e.contains("huge"), "{e}");
    }

    #[test]
    fn describe_names_scale_dataset_and_detail() {
        let p = Provenance::new("embedded shapes", Scale::Quick, "small CNN, 5 epochs");
        assert_eq!(
            p.describe(),
            "`quick` scale, embedded shapes: small CNN, 5 epochs"
        );
        let p = Provenance::new("SOP", Scale::Paper, "");
        assert_eq!(p.describe(), "`paper` scale, SOP");
    }
}

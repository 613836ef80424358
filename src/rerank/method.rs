//! A re-ranking method named by a short string, as `rankwise eval --rerank` takes it: the
//! second stages of SSR Table 1 that need no training, fitted on the features and scored by the
//! crate's one evaluation engine.
//!
//! | string | method |
//! |---|---|
//! | `k-reciprocal` or `k-reciprocal:K1,K2,LAMBDA` | k-reciprocal re-ranking ([`KReciprocal`]; default `20,6,0.3`) |
//! | `aqe:K` | average query expansion over the top `K` |
//! | `aqewd:K` | AQE with decay |
//! | `alpha-qe:K` or `alpha-qe:K,ALPHA` | αQE (default `α = 3`, SSR's) |
//! | `dqe:K` | discriminative query expansion |
//!
//! [`RerankMethod`]'s `Display` writes the same form with every parameter, so a results file
//! names the method exactly and the string parses back to it.

use super::k_reciprocal::KReciprocal;
use super::query_expansion::{QueryExpansion, Weighting};
use super::Reranker;
use crate::error::{Error, Result};
use candle_core::Tensor;
use std::fmt;
use std::str::FromStr;

/// A re-ranking method (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RerankMethod {
    /// k-reciprocal re-ranking (Zhong et al., CVPR 2017).
    KReciprocal(KReciprocal),
    /// AQE, AQEwD, αQE or DQE.
    QueryExpansion(QueryExpansion),
}

/// The forms [`RerankMethod::from_str`] accepts, for its errors.
const FORMS: &str = "k-reciprocal[:K1,K2,LAMBDA], aqe:K, aqewd:K, alpha-qe:K[,ALPHA] or dqe:K";

impl RerankMethod {
    /// Fits the method to `queries` against `references` (or against themselves, each query
    /// removed from its own list, when `references` is `None`): a [`Reranker`] whose
    /// [`Reranker::evaluate`] scores it. Runs on the CPU; errors as the method's own `fit`.
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// use rankwise::rerank::RerankMethod;
    /// use rankwise::retrieval::EvalOptions;
    /// use rankwise::Labels;
    ///
    /// // Two classes of two items on the unit circle.
    /// let x = Tensor::new(&[[1.0f32, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]], &Device::Cpu)?;
    /// let labels = Labels::from_fine(&[0, 0, 1, 1])?;
    /// let method: RerankMethod = "aqe:1".parse()?;
    /// let opts = EvalOptions {
    ///     recall_ks: vec![1],
    ///     progress: false,
    ///     ..EvalOptions::default()
    /// };
    /// let report = method.fit(&x, None)?.evaluate(&labels, None, &opts)?;
    /// let r1 = report.rows.iter().find(|r| r.metric == "R@1").unwrap();
    /// assert_eq!(r1.value, 1.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fit(&self, queries: &Tensor, references: Option<&Tensor>) -> Result<Box<dyn Reranker>> {
        Ok(match self {
            RerankMethod::KReciprocal(k) => Box::new(k.fit(queries, references)?),
            RerankMethod::QueryExpansion(qe) => Box::new(qe.fit(queries, references)?),
        })
    }
}

/// Parameter `i` of `params` (named `name` in errors, under the option `field`), parsed: the
/// re-ranking methods' and the few-shot classifiers' (`super::episode_method`) strings.
pub(super) fn param<T: FromStr>(
    field: &str,
    method: &str,
    params: &[&str],
    i: usize,
    name: &str,
) -> Result<T> {
    let text = params[i].trim();
    text.parse().map_err(|_| {
        Error::invalid(
            field,
            format!("{method}: {name} must be a number, got {text:?}"),
        )
    })
}

impl FromStr for RerankMethod {
    type Err = Error;

    /// Parses one of the forms of the module documentation; errors name the form expected.
    fn from_str(s: &str) -> Result<Self> {
        let (name, params) = match s.split_once(':') {
            Some((name, rest)) => (name.trim(), rest.split(',').collect::<Vec<_>>()),
            None => (s.trim(), Vec::new()),
        };
        let arity = |allowed: &[usize], form: &str| -> Result<()> {
            if allowed.contains(&params.len()) {
                Ok(())
            } else {
                Err(Error::invalid(
                    "rerank",
                    format!(
                        "{s:?}: expected {form} ({} parameter(s) given)",
                        params.len()
                    ),
                ))
            }
        };
        let method = match name {
            "k-reciprocal" => {
                arity(&[0, 3], "k-reciprocal or k-reciprocal:K1,K2,LAMBDA")?;
                let k = if params.is_empty() {
                    KReciprocal::default()
                } else {
                    KReciprocal {
                        k1: param("rerank", name, &params, 0, "K1")?,
                        k2: param("rerank", name, &params, 1, "K2")?,
                        lambda: param("rerank", name, &params, 2, "LAMBDA")?,
                    }
                };
                // The bounds that do not depend on the data (fit checks k1 and k2 against the
                // number of nodes).
                for (what, v) in [("K1", k.k1), ("K2", k.k2)] {
                    if v == 0 {
                        return Err(Error::invalid(
                            "rerank",
                            format!("{s:?}: {what} must be at least 1"),
                        ));
                    }
                }
                if !(0.0..=1.0).contains(&k.lambda) {
                    return Err(Error::invalid(
                        "rerank",
                        format!("{s:?}: LAMBDA must be in [0, 1], got {}", k.lambda),
                    ));
                }
                RerankMethod::KReciprocal(k)
            }
            "aqe" | "aqewd" | "dqe" => {
                arity(&[1], &format!("{name}:K"))?;
                let k = param("rerank", name, &params, 0, "K")?;
                RerankMethod::QueryExpansion(match name {
                    "aqe" => QueryExpansion::aqe(k),
                    "aqewd" => QueryExpansion::aqe_with_decay(k),
                    _ => QueryExpansion::dqe(k),
                })
            }
            "alpha-qe" => {
                arity(&[1, 2], "alpha-qe:K or alpha-qe:K,ALPHA")?;
                let mut qe = QueryExpansion::alpha_qe(param("rerank", name, &params, 0, "K")?);
                if params.len() == 2 {
                    qe.weighting = Weighting::Alpha(param("rerank", name, &params, 1, "ALPHA")?);
                }
                RerankMethod::QueryExpansion(qe)
            }
            _ => {
                return Err(Error::invalid(
                    "rerank",
                    format!("unknown method {name:?}: expected {FORMS}"),
                ))
            }
        };
        if let RerankMethod::QueryExpansion(qe) = &method {
            qe.validate()?;
        }
        Ok(method)
    }
}

impl fmt::Display for RerankMethod {
    /// The method in the form [`RerankMethod::from_str`] reads, every parameter written.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RerankMethod::KReciprocal(k) => {
                write!(f, "k-reciprocal:{},{},{}", k.k1, k.k2, k.lambda)
            }
            RerankMethod::QueryExpansion(qe) => match qe.weighting {
                Weighting::Average => write!(f, "aqe:{}", qe.k),
                Weighting::AverageWithDecay => write!(f, "aqewd:{}", qe.k),
                Weighting::Alpha(a) => write!(f, "alpha-qe:{},{a}", qe.k),
                Weighting::Svm => write!(f, "dqe:{}", qe.k),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hierarchy::Labels;
    use crate::retrieval::EvalOptions;
    use crate::synthetic_embeddings::SyntheticSpec;

    #[test]
    fn every_form_parses_to_its_method_and_prints_back() {
        let cases = [
            (
                "k-reciprocal",
                RerankMethod::KReciprocal(KReciprocal::default()),
            ),
            (
                "k-reciprocal:40, 20,0.1",
                RerankMethod::KReciprocal(KReciprocal {
                    k1: 40,
                    k2: 20,
                    lambda: 0.1,
                }),
            ),
            (
                "aqe:3",
                RerankMethod::QueryExpansion(QueryExpansion::aqe(3)),
            ),
            (
                "aqewd:5",
                RerankMethod::QueryExpansion(QueryExpansion::aqe_with_decay(5)),
            ),
            (
                "alpha-qe:7",
                RerankMethod::QueryExpansion(QueryExpansion::alpha_qe(7)),
            ),
            (
                "alpha-qe:7,2.5",
                RerankMethod::QueryExpansion(QueryExpansion {
                    k: 7,
                    weighting: Weighting::Alpha(2.5),
                }),
            ),
            (
                "dqe:9",
                RerankMethod::QueryExpansion(QueryExpansion::dqe(9)),
            ),
        ];
        for (text, want) in cases {
            let got: RerankMethod = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            // Display writes every parameter, and reads back to the same method.
            let printed = got.to_string();
            assert_eq!(printed.parse::<RerankMethod>().unwrap(), got, "{printed}");
        }
        assert_eq!(
            RerankMethod::KReciprocal(KReciprocal::default()).to_string(),
            "k-reciprocal:20,6,0.3"
        );
        assert_eq!(
            RerankMethod::QueryExpansion(QueryExpansion::alpha_qe(7)).to_string(),
            "alpha-qe:7,3"
        );
    }

    #[test]
    fn bad_strings_are_errors_naming_what_is_wrong() {
        for (text, needle) in [
            ("ssr", "unknown method \"ssr\""),
            ("", "unknown method"),
            ("aqe", "expected aqe:K"),
            ("aqe:1,2", "expected aqe:K"),
            ("aqe:x", "K must be a number, got \"x\""),
            ("aqe:0", "k ≥ 1"),
            ("aqe:-1", "K must be a number"),
            ("dqe:", "K must be a number, got \"\""),
            ("k-reciprocal:20,6", "K1,K2,LAMBDA"),
            ("k-reciprocal:0,6,0.3", "K1 must be at least 1"),
            ("k-reciprocal:20,0,0.3", "K2 must be at least 1"),
            ("k-reciprocal:20,6,1.5", "LAMBDA must be in [0, 1], got 1.5"),
            ("k-reciprocal:20,6,nan", "LAMBDA must be in [0, 1], got NaN"),
            ("alpha-qe:3,inf", "alpha"),
            ("alpha-qe:3,2,1", "alpha-qe:K,ALPHA"),
        ] {
            let e = text.parse::<RerankMethod>().unwrap_err().to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn fit_is_the_methods_own_reranker() {
        let set = SyntheticSpec::small().generate().unwrap();
        let x = set.embeddings.narrow(0, 0, 120).unwrap();
        let labels =
            Labels::from_fine(&(0..120).map(|i| set.labels.row(i)[0]).collect::<Vec<_>>()).unwrap();
        let opts = EvalOptions {
            recall_ks: vec![1, 4],
            progress: false,
            ..EvalOptions::default()
        };
        let kr = KReciprocal {
            k1: 10,
            k2: 3,
            lambda: 0.3,
        };
        let direct = [
            kr.fit(&x, None)
                .unwrap()
                .evaluate(&labels, None, &opts)
                .unwrap(),
            QueryExpansion::dqe(2)
                .fit(&x, None)
                .unwrap()
                .evaluate(&labels, None, &opts)
                .unwrap(),
        ];
        let named = ["k-reciprocal:10,3,0.3", "dqe:2"].map(|m| {
            m.parse::<RerankMethod>()
                .unwrap()
                .fit(&x, None)
                .unwrap()
                .evaluate(&labels, None, &opts)
                .unwrap()
        });
        for (a, b) in direct.iter().zip(&named) {
            assert_eq!(a.rows, b.rows);
        }
        // A method the data cannot take: the fit's error.
        let e = "k-reciprocal:200,6,0.3"
            .parse::<RerankMethod>()
            .unwrap()
            .fit(&x, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("k1"), "{e}");
    }
}

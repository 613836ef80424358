//! The revisited Oxford/Paris evaluation protocol (Radenović et al., "Revisiting Oxford and
//! Paris", CVPR 2018), used by SSR Table 1 (rOxford5k / rParis6k, Medium and Hard), computed
//! exactly as the `revisitop` `compute_map` / `compute_ap` code.
//!
//! Each query has three disjoint lists of reference indices: `easy`, `hard` and `junk`
//! ("unclear") images. A protocol decides which are positives ("ok") and which are ignored
//! ("junk"): junk images are removed from the ranking before scoring, by shifting the ranks of
//! the positives after them.
//!
//! Per query, with `r_0 < r_1 < …` the 0-based ranks of the positives found in the ranking after
//! the junk shift and `nres` the number of positives in the ground truth, AP is the trapezoid
//! rule over the precision-recall curve:
//! `AP = Σ_j (p0_j + p1_j) / 2 · 1/nres`, `p0_j = j / r_j` (1 if `r_j = 0`), `p1_j = (j+1) / (r_j+1)`.
//! This differs from the AP of HAPPIER Eq. (1) (`Σ_j p1_j / nres`) by interpolating each step.
//!
//! The mP@k of revisitop is not the plain P@k: with `pos` the 1-based shifted ranks,
//! `P@k = |{pos ≤ k'}| / k'` with `k' = min(max(pos), k)`, i.e. a query whose last positive is
//! ranked before `k` is not penalised for the positions after it.

use crate::error::{Error, Result};
use std::collections::HashMap;

/// The `k` of the mP@k that revisitop reports.
pub const REVISITOP_KAPPAS: [usize; 3] = [1, 5, 10];

/// Ground truth of one query: indices of the references in each category.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroundTruth {
    /// Clearly visible landmark.
    pub easy: Vec<usize>,
    /// Hard to recognise (occlusion, viewpoint, scale).
    pub hard: Vec<usize>,
    /// Unclear: neither positive nor negative.
    pub junk: Vec<usize>,
}

/// Which ground-truth images count as positives and which are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// ok = easy; junk = junk ∪ hard.
    Easy,
    /// ok = easy ∪ hard; junk = junk (SSR Table 1 "Medium").
    Medium,
    /// ok = hard; junk = junk ∪ easy (SSR Table 1 "Hard").
    Hard,
}

impl Protocol {
    /// The (ok, junk) index lists of `gt` under this protocol, concatenated in revisitop's order
    /// (Easy: junk then hard; Medium: easy then hard; Hard: junk then easy).
    pub fn ok_and_junk(self, gt: &GroundTruth) -> (Vec<usize>, Vec<usize>) {
        let cat = |a: &[usize], b: &[usize]| [a, b].concat();
        match self {
            Protocol::Easy => (gt.easy.clone(), cat(&gt.junk, &gt.hard)),
            Protocol::Medium => (cat(&gt.easy, &gt.hard), gt.junk.clone()),
            Protocol::Hard => (gt.hard.clone(), cat(&gt.junk, &gt.easy)),
        }
    }
}

/// Scores of one query.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryScore {
    /// Trapezoid-rule AP (module doc).
    pub ap: f64,
    /// revisitop P@k for each requested `k`, in order.
    pub precision_at: Vec<f64>,
}

/// AP and P@k of one query in the revisitop way.
///
/// `ranking`: reference indices, best first. `ok`: the positives; `junk`: the ignored images (as
/// [`Protocol::ok_and_junk`] gives them). Membership is tested like `numpy.in1d`: a reference
/// listed in both `ok` and `junk` is both, and `nres = ok.len()` counts repeated entries, as
/// revisitop's `len(qgnd)` does. Positives absent from the ranking lower the AP.
///
/// `None` when `ok` is empty (revisitop skips the query and counts it). When no positive appears
/// in the ranking at all, AP is 0 and every P@k is 0 (revisitop itself would fail there on
/// `max` of an empty array). Every `k` must be `≥ 1` (checked by [`evaluate`]; a 0 here gives a
/// NaN, as revisitop's `0 / 0`).
pub fn query_score(
    ranking: &[usize],
    ok: &[usize],
    junk: &[usize],
    kappas: &[usize],
) -> Option<QueryScore> {
    if ok.is_empty() {
        return None;
    }
    const OK: u8 = 1;
    const JUNK: u8 = 2;
    let mut flags: HashMap<usize, u8> = HashMap::with_capacity(ok.len() + junk.len());
    for &i in ok {
        *flags.entry(i).or_default() |= OK;
    }
    for &i in junk {
        *flags.entry(i).or_default() |= JUNK;
    }
    // 1-based ranks of the positives once the junk images before them are removed.
    let mut pos: Vec<usize> = Vec::new();
    let mut junk_before = 0usize;
    for (p, idx) in ranking.iter().enumerate() {
        let f = flags.get(idx).copied().unwrap_or(0);
        // revisitop shifts a positive by the junk strictly before it, so an item that is both
        // keeps its own position.
        if f & OK != 0 {
            pos.push(p - junk_before + 1);
        }
        if f & JUNK != 0 {
            junk_before += 1;
        }
    }
    let recall_step = 1.0 / ok.len() as f64;
    let mut ap = 0.0;
    for (j, &r1) in pos.iter().enumerate() {
        let rank = r1 - 1;
        let precision_0 = if rank == 0 {
            1.0
        } else {
            j as f64 / rank as f64
        };
        let precision_1 = (j + 1) as f64 / (rank + 1) as f64;
        // Same operation order as revisitop, so that the value matches to the last bit.
        ap += (precision_0 + precision_1) * recall_step / 2.0;
    }
    let precision_at = match pos.last() {
        Some(&last) => kappas
            .iter()
            .map(|&k| {
                let kq = last.min(k);
                pos.iter().filter(|&&p| p <= kq).count() as f64 / kq as f64
            })
            .collect(),
        None => vec![0.0; kappas.len()],
    };
    Some(QueryScore { ap, precision_at })
}

/// Results of the revisited protocol over all queries.
#[derive(Debug, Clone, PartialEq)]
pub struct RevisitedReport {
    /// The protocol evaluated.
    pub protocol: Protocol,
    /// Mean AP over the queries that have a positive.
    pub map: f64,
    /// The `k` of `mean_precision_at`.
    pub kappas: Vec<usize>,
    /// mP@k over the queries that have a positive, one per `kappas` entry.
    pub mean_precision_at: Vec<f64>,
    /// Per-query scores, `None` for a skipped query.
    pub per_query: Vec<Option<QueryScore>>,
    /// Number of queries skipped because they have no positive under this protocol.
    pub skipped: usize,
}

/// revisitop's `compute_map` for one protocol: per-query [`query_score`], then the mean AP and
/// mean P@k over the queries with at least one positive (the others are skipped and counted).
///
/// `rankings[q]`: the ranking of query `q` as reference indices, best first; `gnd[q]` its
/// ground truth. Use [`REVISITOP_KAPPAS`] for the reported `k`.
///
/// Errors if the numbers of rankings and ground truths differ, if a `k` is 0, or if no query has
/// a positive (revisitop would return NaN).
pub fn evaluate<R: AsRef<[usize]>>(
    rankings: &[R],
    gnd: &[GroundTruth],
    protocol: Protocol,
    kappas: &[usize],
) -> Result<RevisitedReport> {
    if rankings.len() != gnd.len() {
        return Err(Error::Shape(format!(
            "{} query rankings but {} ground-truth entries",
            rankings.len(),
            gnd.len()
        )));
    }
    if kappas.contains(&0) {
        return Err(Error::invalid("kappas", "precision@k needs every k ≥ 1"));
    }
    let mut sum_ap = 0.0;
    let mut sum_precision = vec![0.0; kappas.len()];
    let mut skipped = 0;
    let mut per_query = Vec::with_capacity(gnd.len());
    for (ranking, gt) in rankings.iter().zip(gnd) {
        let (ok, junk) = protocol.ok_and_junk(gt);
        let score = query_score(ranking.as_ref(), &ok, &junk, kappas);
        match &score {
            Some(s) => {
                sum_ap += s.ap;
                for (acc, p) in sum_precision.iter_mut().zip(&s.precision_at) {
                    *acc += p;
                }
            }
            None => skipped += 1,
        }
        per_query.push(score);
    }
    let scored = gnd.len() - skipped;
    if scored == 0 {
        return Err(Error::invalid(
            "ground truth",
            format!("no query has a positive under the {protocol:?} protocol"),
        ));
    }
    let n = scored as f64;
    Ok(RevisitedReport {
        protocol,
        map: sum_ap / n,
        kappas: kappas.to_vec(),
        mean_precision_at: sum_precision.into_iter().map(|s| s / n).collect(),
        per_query,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ranking positions: 7→0, 3→1, 9→2, 0→3, 5→4, 1→5, 8→6, 2→7, 4→8, 6→9.
    const RANKING: [usize; 10] = [7, 3, 9, 0, 5, 1, 8, 2, 4, 6];

    fn gt() -> GroundTruth {
        GroundTruth {
            easy: vec![3, 8],
            hard: vec![5],
            junk: vec![9, 2],
        }
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-15, "{a} vs {b}");
    }

    #[test]
    fn medium_by_hand() {
        // ok = {3, 8, 5} at positions 1, 6, 4; junk {9, 2} at 2, 7. Shifted 0-based ranks of the
        // positives: 1, 4 − 1 = 3, 6 − 1 = 5. nres = 3.
        // AP = [(0/1 + 1/2) + (1/3 + 2/4) + (2/5 + 3/6)] / 2 / 3 = 67/180.
        let (ok, junk) = Protocol::Medium.ok_and_junk(&gt());
        let s = query_score(&RANKING, &ok, &junk, &REVISITOP_KAPPAS).unwrap();
        close(s.ap, 67.0 / 180.0);
        // 1-based ranks 2, 4, 6: P@1 = 0/1; P@5 = 2/5; P@10 with k' = min(6, 10) = 6: 3/6.
        assert_eq!(s.precision_at, vec![0.0, 0.4, 0.5]);
    }

    #[test]
    fn easy_and_hard_by_hand() {
        // Easy: ok {3, 8}, junk {9, 2, 5}: shifted ranks 1 and 6 − 2 = 4.
        // AP = [(0 + 1/2) + (1/4 + 2/5)] / 2 / 2 = 23/80; 1-based ranks 2, 5.
        let (ok, junk) = Protocol::Easy.ok_and_junk(&gt());
        let s = query_score(&RANKING, &ok, &junk, &REVISITOP_KAPPAS).unwrap();
        close(s.ap, 23.0 / 80.0);
        assert_eq!(s.precision_at, vec![0.0, 0.4, 0.4]);
        // Hard: ok {5}, junk {9, 2, 3, 8}: position 4 minus 2 junk before = 2.
        // AP = (0/2 + 1/3) / 2 = 1/6; 1-based rank 3: P@1 = 0, P@5 = P@10 = 1/3 (k' = 3).
        let (ok, junk) = Protocol::Hard.ok_and_junk(&gt());
        let s = query_score(&RANKING, &ok, &junk, &REVISITOP_KAPPAS).unwrap();
        close(s.ap, 1.0 / 6.0);
        assert_eq!(s.precision_at, vec![0.0, 1.0 / 3.0, 1.0 / 3.0]);
    }

    #[test]
    fn first_rank_uses_precision_one() {
        // Positive at rank 0: p0 = 1, p1 = 1 → AP = 1 with a single positive.
        let s = query_score(&[4, 1, 2], &[4], &[], &[1]).unwrap();
        assert_eq!(s.ap, 1.0);
        assert_eq!(s.precision_at, vec![1.0]);
        // A positive missing from the ranking halves the recall.
        let s = query_score(&[4, 1, 2], &[4, 99], &[], &[1]).unwrap();
        assert_eq!(s.ap, 0.5);
        // None found: AP 0, P@k 0.
        let s = query_score(&[4, 1, 2], &[99], &[], &[1, 5]).unwrap();
        assert_eq!((s.ap, s.precision_at), (0.0, vec![0.0, 0.0]));
    }

    #[test]
    fn evaluate_skips_and_counts_queries_without_positives() {
        let empty = GroundTruth {
            easy: vec![],
            hard: vec![1],
            junk: vec![],
        };
        let rankings = vec![RANKING.to_vec(), RANKING.to_vec()];
        let r = evaluate(
            &rankings,
            &[gt(), empty.clone()],
            Protocol::Easy,
            &REVISITOP_KAPPAS,
        )
        .unwrap();
        assert_eq!(r.skipped, 1);
        close(r.map, 23.0 / 80.0);
        assert_eq!(r.per_query[1], None);
        let r = evaluate(
            &rankings,
            &[gt(), empty],
            Protocol::Medium,
            &REVISITOP_KAPPAS,
        )
        .unwrap();
        assert_eq!(r.skipped, 0);
        assert!(evaluate(&rankings, &[gt()], Protocol::Easy, &[1]).is_err());
        assert!(evaluate(&rankings[..1], &[gt()], Protocol::Easy, &[0]).is_err());
        let none = GroundTruth::default();
        let e = evaluate(&rankings[..1], &[none], Protocol::Hard, &[1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Hard"), "{e}");
    }
}

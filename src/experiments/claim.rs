//! The papers' claims, decided on our measurements by a stated statistical rule.
//!
//! Every row that enters a claim is measured over several seeds ([`super::SeedCounts`]); a
//! claim compares rows with a two-sided t-test at the 5% level ([`stats::compare`]): paired
//! seed by seed when both rows ran the same seeds (every row of a paper's recipe runs the same
//! seed list, and a seed fixes the initial weights and the batches), paired unit by unit when
//! both rows were scored on the same test units (SSR's episodes and queries), else Welch's
//! ([`stats::welch`]); it ends in one of three verdicts ([`Verdict`]):
//!
//! - **holds**: every comparison the statement makes goes the paper's way beyond the noise;
//! - **contradicted**: some comparison's gap is significantly below the paper's gap carried to
//!   our scale ([`paper_gap_at`]; zero where the paper prints no gap) — the order goes the
//!   other way, or an improvement the size of the paper's is ruled out while none is shown;
//! - **inconclusive**: neither — a gap inside the run-to-run noise never "holds".
//!
//! A paper states its claims with its numbers ("w.o feat. update: −3.8"): a claim whose gap
//! our seeds pin near zero, well below the paper's, has not reproduced, and "inconclusive, a
//! thousand seeds to decide" would hide that. The test against is then the one-sided question
//! of an equivalence test (Schuirmann 1987; Lakens 2017) with the paper's own effect as the
//! margin, so that a claim as true as the paper says (its gap carried to our scale) is
//! contradicted by chance at most at the rule's level; with no printed gap it is the plain test
//! the other way. Our rows sit elsewhere than the paper's (a toy dataset, a small CNN), so the
//! paper's gap in points is not carried over as is: it is scaled to our baseline as the same
//! relative gain or the same relative cut of the error, whichever asks less of the paper.
//!
//! A statement made of several comparisons (a best row among many, a monotone trend) holds only
//! if each comparison is significant at 5%: an intersection–union test, whose level is 5%
//! without a correction. It is contradicted when one comparison is significant against at
//! `5% / m` for its `m` comparisons (Bonferroni), so that a claim with many parts is not
//! contradicted by chance more often than a claim with one. A row measured once has no noise
//! estimate, so any claim resting on it is inconclusive.
//!
//! Where a scale's verdicts were read at smaller seed counts before its rows got more seeds
//! (`[seeds.looks]` of the recipe, [`super::SeedCounts::looks`]), 5% becomes the per-look level
//! of Pocock's group-sequential boundary over those looks ([`stats::sequential_level`], e.g.
//! 1.71% for looks at 3, 5, 8 and 16 seeds), in both directions: seeds added where a gap was
//! undecided would otherwise decide claims by chance more often than the rule states.

use super::table::Measurements;
use crate::stats::{self, Sample};

/// The rule that decides every claim, as printed above each claims table.
pub const RULE: &str = "a two-sided t-test at 5% for each comparison a claim makes: paired \
    (`paired p`) over the seeds' differences when both rows ran the same seeds (a seed fixes \
    the initial weights and the batches, shared by the two rows), or over the test units when \
    both rows were scored on the same ones — SSR's episodes or queries: over the units for one \
    trained model, over the seeds' mean differences for several —, else Welch's test over the \
    seeds; a claim holds when every comparison goes the paper's way \
    significantly, is contradicted when one comparison's gap is significantly below the \
    paper's gap carried to our scale (at 5% / number of comparisons: the order goes the other \
    way, or an improvement the size of the paper's is ruled out while none is shown; the \
    paper's printed gap × min(our baseline / the paper's, (1 − ours) / (1 − the paper's)), \
    the same relative gain or the same relative cut of the error, whichever is smaller; 0 \
    where the paper prints no gap), and is inconclusive otherwise.";

/// What `≈ m seeds to decide` after an undecided comparison means, as printed under [`RULE`].
pub const SEEDS_NOTE: &str = "`≈ m seeds to decide` after a comparison inside the noise: the \
    seeds per row at which the same gap and noise would reach the level the rule asks of it \
    (a gap of exactly that size is then significant about half of the time; `> 1000`: a tie \
    for any practical number of seeds).";

/// What the design's earlier looks do to the rule, as printed under [`RULE`]: `None` without
/// an earlier look; `looks` are the seed counts at which the verdicts were read, the current
/// one last ([`super::SeedCounts::looks`]).
pub fn looks_note(looks: &[usize]) -> Option<String> {
    let (&now, earlier) = looks.split_last()?;
    if earlier.is_empty() {
        return None;
    }
    let list = |v: &[usize]| {
        let v: Vec<String> = v.iter().map(|n| n.to_string()).collect();
        match v.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => v.join(""),
        }
    };
    let level = 100.0 * stats::sequential_level(looks, stats::ALPHA);
    Some(format!(
        "Sequential design: these verdicts were read before at {} seeds (or replicates) and the \
         rows got more seeds after each look, so every comparison over the {now} is held to \
         {level:.2}% instead of 5% (against: {level:.2}% / number of comparisons) — the level of \
         Pocock's boundary for looks at {} (`stats::sequential_level`), which keeps the chance \
         of deciding a claim without an effect at 5% over all the looks; `≈ m seeds to decide` \
         counts at this level, and reading the verdicts at m seeds would be one more look, at a \
         slightly lower level.",
        list(earlier),
        list(looks),
    ))
}

/// The outcome of checking a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Every comparison goes the paper's way, each significant at 5% (or at the level of the
    /// design's looks).
    Holds,
    /// Some comparison's gap is significantly below the paper's gap carried to our scale
    /// ([`paper_gap_at`]; zero where the paper prints none), Bonferroni over the comparisons.
    Contradicted,
    /// The gaps are inside the noise (or a row has a single seed).
    Inconclusive,
    /// A row is missing or degenerate.
    NotMeasured,
}

impl Verdict {
    /// `holds`, `contradicted`, `inconclusive`, `not measured`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::Contradicted => "contradicted",
            Verdict::Inconclusive => "inconclusive",
            Verdict::NotMeasured => "not measured",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One of a paper's claims, checked on our measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The claim, in the paper's words or close to them, with where the paper makes it.
    pub claim: String,
    /// What our numbers say.
    pub verdict: Verdict,
    /// The numbers the verdict rests on: each row's mean ± 95% interval (seeds) and the p-value
    /// of each comparison.
    pub evidence: String,
}

/// One row of a claim: its name and its per-seed values (`None`: not measured or degenerate).
pub type Row = (String, Option<Sample>);

/// A [`Row`].
pub fn row(name: impl Into<String>, values: Option<Sample>) -> Row {
    (name.into(), values)
}

/// The paper's gap `a_p − b_p > 0` between two rows, carried to our scale where our `b` is
/// `b`: `(a_p − b_p) · min(b / b_p, (1 − b) / (1 − b_p))` — the same relative gain over the
/// baseline or the same relative cut of its error (one minus the score), whichever is smaller.
/// Our rows do not sit where the paper's do (a toy dataset, a small CNN), so the paper's gap in
/// points is not ours to expect; a score far from its ceiling reads a gain relative to itself,
/// one near its ceiling a cut of its error, and the smaller of the two keeps a verdict against
/// the paper from asking more of it than either reading. `0` when the paper's printed values
/// do not put `a` above `b`, or are not scores in `[0, 1]`.
///
/// ```
/// use rankwise::experiments::claim::paper_gap_at;
/// // SSR Table 3: Ours 34.0, w.o feat. update 30.2; ours w.o the update 0.49.
/// let gap = paper_gap_at(0.340, 0.302, 0.49);
/// // The error cut (0.51 · 0.038 / 0.698 = 0.0278) is smaller than the gain (0.49 · 0.126).
/// assert!((gap - 0.0278).abs() < 1e-4);
/// assert_eq!(paper_gap_at(0.30, 0.34, 0.49), 0.0); // the paper has b above a
/// ```
pub fn paper_gap_at(a_paper: f64, b_paper: f64, b: f64) -> f64 {
    let in_unit = |v: f64| (0.0..=1.0).contains(&v);
    if !(a_paper > b_paper && b_paper > 0.0 && b_paper < 1.0 && in_unit(a_paper) && in_unit(b)) {
        return 0.0;
    }
    (a_paper - b_paper) * (b / b_paper).min((1.0 - b) / (1.0 - b_paper))
}

/// The paper's gap of `a` over `b` at our scale ([`paper_gap_at`]) over the dataset columns
/// where the paper prints both rows, the smallest; `0` when it prints no such pair.
fn paper_gap(a: &Sample, b: &Sample) -> f64 {
    let ours = b.mean();
    a.published
        .iter()
        .filter_map(|(dataset, a_p)| {
            let (_, b_p) = b.published.iter().find(|(d, _)| d == dataset)?;
            Some(paper_gap_at(*a_p, *b_p, ours))
        })
        .reduce(f64::min)
        .unwrap_or(0.0)
}

/// The outcome of one comparison `a > b` of a statement making `comparisons` of them:
/// `Some(true)` if significant that way at the comparison's level (5%, or the lower level of a
/// design with earlier looks, [`stats::compare`]); `Some(false)` if, at that level divided by
/// `comparisons`, the gap is significantly below the paper's gap carried to our scale
/// ([`paper_gap`]; below zero where the paper prints no gap): the order goes the other way, or
/// an improvement the size of the paper's is ruled out while none is shown; `None` otherwise,
/// with the p-values.
fn compare(a: &Sample, b: &Sample, comparisons: usize) -> (Option<bool>, String) {
    let c = stats::compare(a, b);
    let alpha_against = c.level / comparisons as f64;
    let gap = paper_gap(a, b);
    // Whether `a − b` is below the paper's gap: the test of `a − gap` against `b`.
    let below = (gap > 0.0).then(|| {
        let shifted = a.shifted(-gap);
        (stats::compare(&shifted, b), shifted)
    });
    let against = below.as_ref().map_or(c, |(s, _)| *s);
    let outcome = if c.a_larger() {
        Some(true)
    } else if against.difference < 0.0 && against.p < alpha_against {
        Some(false)
    } else {
        None
    };
    let mut text = p_text(&c);
    if let Some((s, _)) = &below {
        let side = if s.difference < 0.0 { "below" } else { "above" };
        text.push_str(&format!(
            "; {side} the paper's gap at our scale ({}): {}",
            signed(gap),
            p_text(s)
        ));
    }
    if outcome.is_none() {
        // Where a gap is inside the noise, how far it is from a verdict: the seeds per row at
        // which this gap and noise would reach the level the rule asks of it (the comparison's
        // level the paper's way, that level / m below the paper's gap), so a reader tells an
        // under-powered gap from a tie.
        let to_hold = (c.difference > 0.0).then(|| stats::seeds_to_decide(a, b, c.level));
        let to_contradict = match &below {
            Some((s, shifted)) if s.difference < 0.0 => {
                Some(stats::seeds_to_decide(shifted, b, alpha_against))
            }
            Some(_) => None,
            None if c.difference < 0.0 => Some(stats::seeds_to_decide(a, b, alpha_against)),
            None => None,
        };
        let fewest = [to_hold, to_contradict]
            .into_iter()
            .flatten()
            .min_by_key(|s| match s {
                stats::SeedsToDecide::At(m) => (0, *m),
                stats::SeedsToDecide::Beyond => (1, 0),
                stats::SeedsToDecide::NotApplicable => (2, 0),
            });
        match fewest {
            Some(stats::SeedsToDecide::At(m)) => text.push_str(&format!(", ≈{m} seeds to decide")),
            Some(stats::SeedsToDecide::Beyond) => {
                text.push_str(&format!(", > {} seeds to decide", stats::SEEDS_CAP))
            }
            Some(stats::SeedsToDecide::NotApplicable) | None => {}
        }
    }
    (outcome, text)
}

/// A gap with its sign, at [`decimals`].
fn signed(v: f64) -> String {
    format!("{v:+.*}", decimals(v))
}

/// The verdict of a statement made of several comparisons, from each one's outcome.
fn combine(outcomes: &[Option<bool>]) -> Verdict {
    if outcomes.iter().all(|o| *o == Some(true)) {
        Verdict::Holds
    } else if outcomes.contains(&Some(false)) {
        Verdict::Contradicted
    } else {
        Verdict::Inconclusive
    }
}

/// The decimals of a value in the evidence: 2 for percentages, 4 for fractions (values below
/// 1.5), so that close fractions stay distinguishable.
fn decimals(v: f64) -> usize {
    if v.abs() < 1.5 {
        4
    } else {
        2
    }
}

/// A value for the evidence, at [`decimals`].
fn num(v: f64) -> String {
    format!("{v:.*}", decimals(v))
}

/// `name mean ± ci (n)`, `name mean (1 seed)` or `name –`.
fn describe(name: &str, s: Option<&Sample>) -> String {
    match s {
        None => format!("{name} –"),
        Some(s) if s.exact => format!("{name} {} (exact)", num(s.mean())),
        Some(s) if s.n() < 2 => format!("{name} {} (1 seed)", num(s.mean())),
        Some(s) => {
            // The interval at the mean's precision.
            let d = decimals(s.mean());
            format!("{name} {:.d$} ± {:.d$} (n={})", s.mean(), s.ci95(), s.n())
        }
    }
}

/// `p=0.012` (3 decimals), prefixed `paired ` when the test paired the rows' seeds or test
/// units.
fn p_text(c: &stats::Comparison) -> String {
    let p = if c.p < 1e-4 {
        "p<1e-4".to_string()
    } else {
        format!("p={:.3}", c.p)
    };
    match c.test {
        stats::Test::Welch => p,
        stats::Test::PairedUnits | stats::Test::PairedReplicates | stats::Test::PairedSeeds => {
            format!("paired {p}")
        }
    }
}

/// The rows' samples, or the evidence that some are missing.
fn all_measured(rows: &[Row]) -> Result<Vec<&Sample>, String> {
    let missing: Vec<&str> = rows
        .iter()
        .filter(|(_, s)| s.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    if missing.is_empty() && !rows.is_empty() {
        Ok(rows.iter().filter_map(|(_, s)| s.as_ref()).collect())
    } else {
        Err(format!("not measured: {}", missing.join(", ")))
    }
}

impl Claim {
    fn new(claim: &str, verdict: Verdict, evidence: String) -> Self {
        Claim {
            claim: claim.into(),
            verdict,
            evidence,
        }
    }

    fn not_measured(claim: &str, rows: &[Row], why: String) -> Self {
        let shown: Vec<String> = rows.iter().map(|(n, s)| describe(n, s.as_ref())).collect();
        Claim::new(
            claim,
            Verdict::NotMeasured,
            format!("{}; {why}", shown.join(", ")),
        )
    }

    /// A claim that `a` beats `b` (higher is better).
    pub fn greater(claim: &str, a: Row, b: Row) -> Self {
        Claim::greater_all(claim, a, &[b])
    }

    /// A claim that `a` beats every row of `others` (higher is better): holds if `a` is
    /// significantly above each, contradicted if one is significantly above `a` (Bonferroni).
    pub fn greater_all(claim: &str, a: Row, others: &[Row]) -> Self {
        let rows: Vec<Row> = std::iter::once(a.clone())
            .chain(others.iter().cloned())
            .collect();
        if others.is_empty() {
            // Nothing to beat is no evidence of beating anything.
            return Claim::not_measured(claim, &rows, "no row to compare with".into());
        }
        let samples = match all_measured(&rows) {
            Ok(s) => s,
            Err(why) => return Claim::not_measured(claim, &rows, why),
        };
        let mut outcomes = Vec::new();
        let mut parts = Vec::new();
        for (other, s) in others.iter().zip(&samples[1..]) {
            let (o, p) = compare(samples[0], s, others.len());
            outcomes.push(o);
            parts.push(format!(
                "{} vs {}: {p}",
                describe(&a.0, Some(samples[0])),
                describe(&other.0, Some(s)),
            ));
        }
        Claim::new(claim, combine(&outcomes), parts.join("; "))
    }

    /// A claim that the row named `best` is above every other row of `rows`.
    pub fn best_of(claim: &str, best: &str, rows: &[Row]) -> Self {
        let Some(top) = rows.iter().find(|(n, _)| n == best) else {
            return Claim::not_measured(claim, rows, format!("no row {best}"));
        };
        let others: Vec<Row> = rows.iter().filter(|(n, _)| n != best).cloned().collect();
        Claim::greater_all(claim, top.clone(), &others)
    }

    /// A claim that the values increase along `rows` (a monotone effect): every step up
    /// significantly; contradicted if a step goes significantly down (Bonferroni over steps).
    pub fn increasing(claim: &str, rows: &[Row]) -> Self {
        Claim::monotone(claim, rows, true)
    }

    /// A claim that the values decrease along `rows`: every step down significantly;
    /// contradicted if a step goes significantly up (Bonferroni over steps).
    pub fn decreasing(claim: &str, rows: &[Row]) -> Self {
        Claim::monotone(claim, rows, false)
    }

    fn monotone(claim: &str, rows: &[Row], up: bool) -> Self {
        let samples = match all_measured(rows) {
            Ok(s) if s.len() >= 2 => s,
            Ok(_) => return Claim::not_measured(claim, rows, "fewer than two rows".into()),
            Err(why) => return Claim::not_measured(claim, rows, why),
        };
        let steps_count = samples.len() - 1;
        let mut outcomes = Vec::new();
        let mut steps = Vec::new();
        for (i, w) in samples.windows(2).enumerate() {
            let (o, p) = if up {
                compare(w[1], w[0], steps_count)
            } else {
                compare(w[0], w[1], steps_count)
            };
            outcomes.push(o);
            steps.push(format!("→ {} ({p})", describe(&rows[i + 1].0, Some(w[1]))));
        }
        Claim::new(
            claim,
            combine(&outcomes),
            format!(
                "{} {}",
                describe(&rows[0].0, Some(samples[0])),
                steps.join(" ")
            ),
        )
    }

    /// A claim that `x` is closer to `near` than to `far` (e.g. an ablation that brings a
    /// method back to its baseline): holds if it is closer to `near` and significantly different
    /// from `far`; contradicted if it is closer to `far` and significantly different from
    /// `near`; inconclusive otherwise.
    pub fn closer(claim: &str, x: Row, near: Row, far: Row) -> Self {
        let rows = [x.clone(), near.clone(), far.clone()];
        let s = match all_measured(&rows) {
            Ok(s) => s,
            Err(why) => return Claim::not_measured(claim, &rows, why),
        };
        let (to_near, to_far) = (
            (s[0].mean() - s[1].mean()).abs(),
            (s[0].mean() - s[2].mean()).abs(),
        );
        let (c_near, c_far) = (stats::compare(s[0], s[1]), stats::compare(s[0], s[2]));
        let verdict = if to_near < to_far && c_far.p < c_far.level {
            Verdict::Holds
        } else if to_far < to_near && c_near.p < c_near.level {
            Verdict::Contradicted
        } else {
            Verdict::Inconclusive
        };
        Claim::new(
            claim,
            verdict,
            format!(
                "{}: {} from {} ({}), {} from {} ({})",
                describe(&x.0, Some(s[0])),
                num(to_near),
                describe(&near.0, Some(s[1])),
                p_text(&c_near),
                num(to_far),
                describe(&far.0, Some(s[2])),
                p_text(&c_far),
            ),
        )
    }

    /// A claim made of several parts (the same comparison on each metric the paper names):
    /// holds if every part holds, contradicted if one is, not measured if one is not measured,
    /// inconclusive otherwise. Each part's evidence is shown after its label.
    pub fn all_of(claim: &str, parts: Vec<(String, Claim)>) -> Self {
        let verdicts: Vec<Verdict> = parts.iter().map(|(_, c)| c.verdict).collect();
        let verdict = if verdicts.is_empty() || verdicts.contains(&Verdict::NotMeasured) {
            Verdict::NotMeasured
        } else if verdicts.iter().all(|v| *v == Verdict::Holds) {
            Verdict::Holds
        } else if verdicts.contains(&Verdict::Contradicted) {
            Verdict::Contradicted
        } else {
            Verdict::Inconclusive
        };
        let evidence = parts
            .iter()
            .map(|(label, c)| format!("{label} ({}): {}", c.verdict, c.evidence))
            .collect::<Vec<_>>()
            .join(" | ");
        Claim::new(claim, verdict, evidence)
    }

    /// The same statement on each of `labels` (each metric or method the paper names):
    /// [`Claim::all_of`] over `part(label)`, each part shown after its label.
    pub fn on_each<L: AsRef<str>>(claim: &str, labels: &[L], part: impl Fn(&str) -> Claim) -> Self {
        Claim::all_of(
            claim,
            labels
                .iter()
                .map(|l| (l.as_ref().to_string(), part(l.as_ref())))
                .collect(),
        )
    }

    /// A claim that a cost grows slower than `x^bound` (e.g. sub-quadratic): the exponent of a
    /// power law fitted to the repeated timings `points` ([`stats::power_law_exponent`]) holds
    /// when its 95% interval lies below `bound`, is contradicted when it lies above, and is
    /// inconclusive otherwise.
    pub fn exponent_below(claim: &str, points: &[(f64, Vec<f64>)], bound: f64) -> Self {
        let Some((b, ci)) = stats::power_law_exponent(points) else {
            return Claim::cannot_test(
                claim,
                "fewer than two lengths or three timings, or a non-positive time",
            );
        };
        let verdict = if b + ci < bound {
            Verdict::Holds
        } else if b - ci > bound {
            Verdict::Contradicted
        } else {
            Verdict::Inconclusive
        };
        let timings: Vec<String> = points
            .iter()
            .map(|(x, ys)| describe(&format!("n={x}:"), Some(&Sample::new(ys.clone()))))
            .collect();
        Claim::new(
            claim,
            verdict,
            format!(
                "fitted exponent {b:.3} ± {ci:.3} (95%, {} timings at {} lengths) against \
                 {bound}; {}",
                points.iter().map(|p| p.1.len()).sum::<usize>(),
                points.len(),
                timings.join(", ")
            ),
        )
    }

    /// A claim this reproduction cannot test (the data or the model it needs is not here),
    /// with why.
    pub fn cannot_test(claim: &str, why: &str) -> Self {
        Claim::new(claim, Verdict::NotMeasured, why.into())
    }

    /// [`Verdict::as_str`] of the verdict.
    pub fn verdict(&self) -> &'static str {
        self.verdict.as_str()
    }
}

/// How many claims have each verdict: `(holds, contradicted, inconclusive, not measured)`.
pub fn tally(claims: &[Claim]) -> [usize; 4] {
    let mut t = [0; 4];
    for c in claims {
        t[match c.verdict {
            Verdict::Holds => 0,
            Verdict::Contradicted => 1,
            Verdict::Inconclusive => 2,
            Verdict::NotMeasured => 3,
        }] += 1;
    }
    t
}

/// The claims as a Markdown table (claim, verdict, our numbers) after the rule that decides
/// them (and the level its earlier looks set, [`looks_note`]), then whether the runs had
/// converged ([`super::convergence::describe`]) and the degenerate rows that no claim counts, if
/// any.
pub fn claims_markdown(claims: &[Claim], m: &Measurements) -> String {
    let degenerate = &m.degenerate;
    // A `|` inside a cell (e.g. "|P|") would end it.
    let cell = |t: &str| t.replace('|', "\\|");
    let [holds, contradicted, inconclusive, missing] = tally(claims);
    let sequential = looks_note(&m.looks)
        .map(|n| format!("{n} "))
        .unwrap_or_default();
    let mut out = format!(
        "Verdicts: {holds} hold, {contradicted} contradicted, {inconclusive} inconclusive, \
         {missing} not measured. Rule: {RULE} {sequential}Values: mean ± 95% interval (n = seeds). {SEEDS_NOTE}\n\n| claim | verdict | our numbers |\n|---|---|---|\n"
    );
    for c in claims {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            cell(&c.claim),
            c.verdict(),
            cell(&c.evidence)
        ));
    }
    if let Some(c) = super::convergence::describe(m) {
        out.push_str(&format!("\n{c}\n"));
    }
    if !degenerate.is_empty() {
        out.push_str(
            "\nDegenerate runs, left out of the claims (their cells stay in the tables):\n\n",
        );
        for d in degenerate {
            out.push_str(&format!("- {}\n", d.describe()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(values: &[f64]) -> Option<Sample> {
        Some(Sample::new(values.to_vec()))
    }

    #[test]
    fn a_gap_inside_the_noise_is_inconclusive_and_one_outside_decides() {
        let clear = Claim::greater(
            "a > b",
            row("a", s(&[2.0, 2.1, 2.2])),
            row("b", s(&[1.0, 1.1, 1.2])),
        );
        assert_eq!(clear.verdict, Verdict::Holds);
        assert!(
            clear.evidence.contains("a 2.10 ± 0.25 (n=3)"),
            "{}",
            clear.evidence
        );
        let against = Claim::greater(
            "b > a",
            row("b", s(&[1.0, 1.1, 1.2])),
            row("a", s(&[2.0, 2.1, 2.2])),
        );
        assert_eq!(against.verdict, Verdict::Contradicted);
        // 91.52 vs 91.46 with a spread of ±0.5: inside the noise.
        let noisy = Claim::greater(
            "a > b",
            row("a", s(&[91.0, 91.52, 92.04])),
            row("b", s(&[90.9, 91.46, 92.02])),
        );
        assert_eq!(noisy.verdict, Verdict::Inconclusive);
        // How far from a verdict: Welch's statistic for this gap and spread reaches 5% at 625
        // seeds a side (scipy: the first n with 0.06 / √((s_a² + s_b²) / n) ≥ t.ppf(0.975,
        // df_Welch(n))).
        assert!(
            noisy.evidence.ends_with("p=0.898, ≈625 seeds to decide"),
            "{}",
            noisy.evidence
        );
        // Seeds shared by both rows: the paired test's count (scipy: 23 for these
        // differences, mean 0.01, sd 0.0231).
        let seeds: Vec<u64> = (0..4).collect();
        let paired = Claim::greater(
            "a > b",
            row(
                "a",
                Some(Sample::new(vec![0.30, 0.34, 0.29, 0.33]).with_seeds(seeds.clone())),
            ),
            row(
                "b",
                Some(Sample::new(vec![0.31, 0.31, 0.30, 0.30]).with_seeds(seeds)),
            ),
        );
        assert!(
            paired
                .evidence
                .ends_with("paired p=0.450, ≈23 seeds to decide"),
            "{}",
            paired.evidence
        );
        // A decided comparison needs no estimate.
        assert!(!clear.evidence.contains("seeds to decide"));
        // One seed says nothing about the noise, however large the gap.
        let single = Claim::greater("a > b", row("a", s(&[9.0])), row("b", s(&[1.0])));
        assert_eq!(single.verdict, Verdict::Inconclusive);
        assert!(single.evidence.contains("(1 seed)"));
        assert!(!single.evidence.contains("seeds to decide"));
        let missing = Claim::greater("a > b", row("a", None), row("b", s(&[1.0, 2.0])));
        assert_eq!(missing.verdict, Verdict::NotMeasured);
        assert!(
            missing.evidence.contains("not measured: a"),
            "{}",
            missing.evidence
        );
    }

    #[test]
    fn a_tie_well_below_the_papers_gap_is_contradicted_and_a_smaller_real_gain_holds() {
        // SSR Table 3's printed pair (Ours 34.0, w.o feat. update 30.2), as fractions, on
        // CUB; CARS prints a larger gap, so the smaller carried gap (CUB's) is the margin.
        let seeds: Vec<u64> = (0..8).collect();
        let b = [0.48, 0.50, 0.49, 0.51, 0.47, 0.49, 0.50, 0.48];
        let d = [0.004, -0.003, 0.002, -0.001, 0.000, -0.002, 0.003, -0.004];
        let sample = |v: Vec<f64>, paper: &[(&str, f64)]| {
            Some(
                Sample::new(v)
                    .with_seeds(seeds.clone())
                    .with_published(paper.iter().map(|(d, v)| (d.to_string(), *v)).collect()),
            )
        };
        let plus = |shift: f64, d: &[f64]| -> Vec<f64> {
            b.iter().zip(d).map(|(x, y)| x + y + shift).collect()
        };
        let ours = [("CUB", 0.340), ("CARS", 0.500)];
        let base = [("CUB", 0.302), ("CARS", 0.400)];
        // A tie (scipy: paired p = 0.906) whose gap is far below the paper's carried to our
        // scale, 0.038 · min(0.49 / 0.302, 0.51 / 0.698) = 0.0278 (scipy: p = 2.3e-8).
        let tie = Claim::greater(
            "ours > w.o",
            row("ours", sample(plus(0.0, &d), &ours)),
            row("w.o", sample(b.to_vec(), &base)),
        );
        assert_eq!(tie.verdict, Verdict::Contradicted, "{}", tie.evidence);
        assert!(
            tie.evidence.ends_with(
                "paired p=0.906; below the paper's gap at our scale (+0.0278): paired p<1e-4"
            ),
            "{}",
            tie.evidence
        );
        // The same tie where the paper prints no gap (or a single row) stays inconclusive.
        for paper in [&[][..], &ours[..1]] {
            let bare = Claim::greater(
                "ours > w.o",
                row("ours", sample(plus(0.0, &d), paper)),
                row("w.o", sample(b.to_vec(), &base[1..])),
            );
            assert_eq!(bare.verdict, Verdict::Inconclusive, "{}", bare.evidence);
            assert!(!bare.evidence.contains("paper's gap"), "{}", bare.evidence);
        }
        // A real gain smaller than the paper's (scipy: p = 0.0007) holds: the claim is the
        // order; its size is shown.
        let small = Claim::greater(
            "ours > w.o",
            row("ours", sample(plus(0.006, &d), &ours)),
            row("w.o", sample(b.to_vec(), &base)),
        );
        assert_eq!(small.verdict, Verdict::Holds, "{}", small.evidence);
        // A noisy gap near the paper's (scipy: p = 0.175 against 0, 0.406 against 0.0278)
        // decides nothing, and its seeds to decide count the nearer verdict.
        let noisy = [0.05, -0.02, 0.04, 0.01, 0.06, -0.03, 0.03, 0.00];
        let near = Claim::greater(
            "ours > w.o",
            row("ours", sample(plus(0.0, &noisy), &ours)),
            row("w.o", sample(b.to_vec(), &base)),
        );
        assert_eq!(near.verdict, Verdict::Inconclusive, "{}", near.evidence);
        assert!(
            near.evidence.contains(
                "paired p=0.175; below the paper's gap at our scale (+0.0278): paired p=0.406, ≈"
            ),
            "{}",
            near.evidence
        );
        // Times and scores outside [0, 1] carry no gap; nor does a pair the paper orders the
        // other way.
        assert_eq!(paper_gap_at(0.9, 0.8, 1.5), 0.0);
        assert_eq!(paper_gap_at(1.2, 0.8, 0.5), 0.0);
        assert_eq!(paper_gap_at(0.8, 0.9, 0.5), 0.0);
        // Our baseline where the paper's is: the paper's gap as printed.
        assert!((paper_gap_at(0.786, 0.724, 0.724) - 0.062).abs() < 1e-12);
    }

    #[test]
    fn best_of_needs_every_comparison_and_increasing_every_step() {
        let rows = [
            row("x", s(&[1.0, 1.1, 1.2])),
            row("y", s(&[3.0, 3.1, 3.2])),
            row("z", s(&[2.0, 2.1, 2.2])),
        ];
        assert_eq!(Claim::best_of("y best", "y", &rows).verdict, Verdict::Holds);
        assert_eq!(
            Claim::best_of("x best", "x", &rows).verdict,
            Verdict::Contradicted
        );
        // z beats x but not y beyond the noise if y is noisy: not every comparison decides.
        let noisy_y = [
            row("x", s(&[1.0, 1.1, 1.2])),
            row("y", s(&[0.0, 3.0, 6.0])),
            row("z", s(&[2.0, 2.1, 2.2])),
        ];
        assert_eq!(
            Claim::best_of("z best", "z", &noisy_y).verdict,
            Verdict::Inconclusive
        );
        assert_eq!(
            Claim::best_of("w best", "w", &rows).verdict,
            Verdict::NotMeasured
        );
        // A best of one row beats nothing.
        assert_eq!(
            Claim::best_of("x best", "x", &rows[..1]).verdict,
            Verdict::NotMeasured
        );
        let up = [
            row("1", s(&[1.0, 1.1, 1.2])),
            row("2", s(&[2.0, 2.1, 2.2])),
            row("3", s(&[3.0, 3.1, 3.2])),
        ];
        let inc = Claim::increasing("up", &up);
        assert_eq!(inc.verdict, Verdict::Holds);
        assert!(inc.evidence.starts_with("1 1.1000 ± "), "{}", inc.evidence);
        let reversed: Vec<Row> = up.iter().rev().cloned().collect();
        assert_eq!(Claim::decreasing("down", &reversed).verdict, Verdict::Holds);
        assert_eq!(
            Claim::decreasing("down", &up).verdict,
            Verdict::Contradicted
        );
        let down = [up[0].clone(), up[2].clone(), up[1].clone()];
        assert_eq!(
            Claim::increasing("up", &down).verdict,
            Verdict::Contradicted
        );
        let flat = [up[0].clone(), up[1].clone(), row("2b", s(&[1.9, 2.1, 2.3]))];
        assert_eq!(
            Claim::increasing("up", &flat).verdict,
            Verdict::Inconclusive
        );
        assert_eq!(
            tally(&[
                Claim::increasing("up", &up),
                Claim::increasing("up", &down),
                Claim::increasing("up", &flat),
                Claim::cannot_test("needs SOP", "not here"),
            ]),
            [1, 1, 1, 1]
        );
    }

    #[test]
    fn closer_decides_only_against_a_significant_other_side() {
        let base = row("base", s(&[1.0, 1.1, 1.2]));
        let full = row("full", s(&[2.0, 2.1, 2.2]));
        let near_base = Claim::closer(
            "x ≈ base",
            row("x", s(&[1.1, 1.2, 1.3])),
            base.clone(),
            full.clone(),
        );
        assert_eq!(near_base.verdict, Verdict::Holds);
        let near_full = Claim::closer(
            "x ≈ base",
            row("x", s(&[1.9, 2.0, 2.1])),
            base.clone(),
            full.clone(),
        );
        assert_eq!(near_full.verdict, Verdict::Contradicted);
        let between = Claim::closer("x ≈ base", row("x", s(&[0.5, 1.5, 2.5])), base, full);
        assert_eq!(between.verdict, Verdict::Inconclusive);
    }

    #[test]
    fn the_markdown_states_the_rule_and_escapes_bars() {
        let c = Claim::greater(
            "|P| = 4 beats 8",
            row("a", s(&[2.0, 2.1])),
            row("b", s(&[1.0, 1.1])),
        );
        let md = claims_markdown(&[c], &Measurements::default());
        assert!(md.contains("Rule: a two-sided t-test at 5%"), "{md}");
        assert!(md.contains("| \\|P\\| = 4 beats 8 |"), "{md}");
        assert!(md.starts_with("Verdicts: "), "{md}");
        assert!(!md.contains("Sequential design"), "{md}");
        // Earlier looks: the markdown states the level they set.
        let looked = Measurements {
            looks: vec![3, 5, 8, 16],
            ..Measurements::default()
        };
        let md = claims_markdown(&[], &looked);
        assert!(
            md.contains("read before at 3, 5 and 8 seeds")
                && md.contains("over the 16 is held to 1.71% instead of 5%")
                && md.contains("looks at 3, 5, 8 and 16"),
            "{md}"
        );
        assert_eq!(looks_note(&[16]), None);
    }

    #[test]
    fn earlier_looks_hold_every_comparison_to_the_designs_level() {
        // Paired p = 0.048 (scipy) at 8 seeds: holds at 5%, inconclusive at the 2.94% of a
        // design that read the verdicts at 4 seeds before; the other way, contradicted at 5%
        // and inconclusive with the look.
        let seeds: Vec<u64> = (0..8).collect();
        let a = Sample::new(vec![0.31, 0.29, 0.33, 0.305, 0.32, 0.31, 0.30, 0.325])
            .with_seeds(seeds.clone());
        let b = Sample::new(vec![0.30; 8]).with_seeds(seeds);
        let looked = |x: &Sample| Some(x.clone().with_looks(vec![4, 8]));
        let plain = Claim::greater(
            "a > b",
            row("a", Some(a.clone())),
            row("b", Some(b.clone())),
        );
        assert_eq!(plain.verdict, Verdict::Holds);
        let sequential = Claim::greater("a > b", row("a", looked(&a)), row("b", looked(&b)));
        assert_eq!(sequential.verdict, Verdict::Inconclusive);
        // The seeds to decide are counted at the design's level (scipy: 10 at 2.94%).
        assert!(
            sequential
                .evidence
                .ends_with("paired p=0.048, ≈10 seeds to decide"),
            "{}",
            sequential.evidence
        );
        let against = Claim::greater(
            "b > a",
            row("b", Some(b.clone())),
            row("a", Some(a.clone())),
        );
        assert_eq!(against.verdict, Verdict::Contradicted);
        let against = Claim::greater("b > a", row("b", looked(&b)), row("a", looked(&a)));
        assert_eq!(against.verdict, Verdict::Inconclusive);
    }
}

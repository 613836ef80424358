//! Few-shot classification accuracy over test episodes, reported as mean ± 95% confidence
//! half-width (SSR Table 2: 5-way 1/5-shot, 2,000 random test episodes).
//!
//! The half-width is `1.96 · σ / √n` with `σ` the **population** standard deviation
//! (`ddof = 0`): the SSR code (`utils.getCi`, inherited from SIB) computes `np.std(accLog)`,
//! numpy's default. The sums are numpy's pairwise summation, so that the mean, σ and
//! half-width equal numpy's `np.mean`, `np.std` and `1.96 * np.std(a) / np.sqrt(n)` to the last
//! bit (the algorithm was checked bit for bit against numpy 2.4.6 on 3,000 random sums and 2,000
//! random mean/std/half-width triples of 1 to 3,000 values; the tests pin two of them).

use crate::error::{Error, Result};

/// The normal quantile of a two-sided 95% interval used by the few-shot literature.
pub const Z_95: f64 = 1.96;

/// Mean accuracy over episodes with its 95% confidence half-width.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccuracyInterval {
    /// Mean of the per-episode accuracies.
    pub mean: f64,
    /// Population standard deviation (`ddof = 0`) of the per-episode accuracies.
    pub std: f64,
    /// `1.96 · std / √episodes`.
    pub half_width: f64,
    /// Number of episodes.
    pub episodes: usize,
}

/// numpy's pairwise summation of a contiguous float64 array (`np.add.reduce`): blocks of at most
/// 128 values are summed with 8 interleaved accumulators, longer arrays are split in two at a
/// multiple of 8. Reproduced so that means and deviations match numpy bit for bit.
fn numpy_sum(values: &[f64]) -> f64 {
    const BLOCK: usize = 128;
    let n = values.len();
    if n < 8 {
        let mut res = 0.0;
        for &v in values {
            res += v;
        }
        res
    } else if n <= BLOCK {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&values[..8]);
        let whole = n - n % 8;
        let mut i = 8;
        while i < whole {
            for (j, acc) in r.iter_mut().enumerate() {
                *acc += values[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &v in &values[whole..] {
            res += v;
        }
        res
    } else {
        let mut half = n / 2;
        half -= half % 8;
        numpy_sum(&values[..half]) + numpy_sum(&values[half..])
    }
}

/// Mean ± 95% half-width of per-episode accuracies (any unit: fractions or percent, as given):
/// `mean = Σ a_i / n`, `σ = √(Σ (a_i − mean)² / n)`, `half_width = 1.96 · σ / √n`.
///
/// Errors on an empty list and on a non-finite accuracy (naming its episode).
///
/// ```
/// use rankwise::metrics::fewshot::accuracy_interval;
/// // Four episodes (percent): mean 70, population std 10, half-width 1.96 · 10 / √4.
/// let ci = accuracy_interval(&[60.0, 80.0, 60.0, 80.0]).unwrap();
/// assert_eq!((ci.mean, ci.std, ci.episodes), (70.0, 10.0, 4));
/// assert!((ci.half_width - 9.8).abs() < 1e-12);
/// assert!(accuracy_interval(&[]).is_err());
/// ```
pub fn accuracy_interval(accuracies: &[f64]) -> Result<AccuracyInterval> {
    if accuracies.is_empty() {
        return Err(Error::invalid(
            "accuracies",
            "no episode: the mean and confidence interval are undefined",
        ));
    }
    if let Some((i, a)) = accuracies.iter().enumerate().find(|(_, a)| !a.is_finite()) {
        return Err(Error::invalid(
            "accuracies",
            format!("episode {i} has a non-finite accuracy {a}"),
        ));
    }
    let n = accuracies.len() as f64;
    let mean = numpy_sum(accuracies) / n;
    // numpy's _var: the squared deviations are materialised, then pairwise-summed. This is a
    // per-evaluation call over a few thousand episodes, so the allocation does not matter.
    let squared: Vec<f64> = accuracies
        .iter()
        .map(|&a| (a - mean) * (a - mean))
        .collect();
    let std = (numpy_sum(&squared) / n).sqrt();
    Ok(AccuracyInterval {
        mean,
        std,
        half_width: Z_95 * std / n.sqrt(),
        episodes: accuracies.len(),
    })
}

/// Accuracy of one episode: the fraction of queries whose predicted class equals the true class
/// (SSR `utils.accuracy` with top-1, which reports it in percent: multiply by 100 for that).
///
/// Errors if the two lists differ in length or are empty.
///
/// ```
/// use rankwise::metrics::fewshot::episode_accuracy;
/// assert_eq!(episode_accuracy(&[0, 1, 1, 2], &[0, 1, 2, 2]).unwrap(), 0.75);
/// ```
pub fn episode_accuracy(predicted: &[usize], truth: &[usize]) -> Result<f64> {
    if predicted.len() != truth.len() {
        return Err(Error::Shape(format!(
            "{} predictions but {} true labels",
            predicted.len(),
            truth.len()
        )));
    }
    if truth.is_empty() {
        return Err(Error::invalid("truth", "an episode with no query"));
    }
    let correct = predicted.iter().zip(truth).filter(|(p, t)| p == t).count();
    Ok(correct as f64 / truth.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_hand() {
        let ci = accuracy_interval(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(ci.mean, 2.5);
        assert_eq!(ci.std, 1.25f64.sqrt());
        assert_eq!(ci.half_width, 1.96 * 1.25f64.sqrt() / 2.0);
        assert_eq!(ci.episodes, 4);
        let one = accuracy_interval(&[0.7]).unwrap();
        assert_eq!((one.mean, one.std, one.half_width), (0.7, 0.0, 0.0));
    }

    #[test]
    fn matches_numpy_to_the_bit() {
        // 2,000 episodes of 75 queries. Expected values printed by numpy 2.4.6:
        // np.mean(a), np.std(a), 1.96 * np.std(a) / np.sqrt(len(a)) (np.std(a, ddof=1) would be
        // 13.847263910366774).
        let acc: Vec<f64> = (0..2000)
            .map(|i| 100.0 * (40 + (i * 37) % 36) as f64 / 75.0)
            .collect();
        let ci = accuracy_interval(&acc).unwrap();
        assert_eq!(ci.mean, 76.56);
        assert_eq!(ci.std, 13.843801661553968);
        assert_eq!(ci.half_width, 0.6067313590122805);
        // A short list (< 128: one unrolled block plus a remainder).
        let acc: Vec<f64> = (0..37).map(|i| 0.1 * (i % 7) as f64 + 0.3).collect();
        let ci = accuracy_interval(&acc).unwrap();
        assert_eq!(ci.mean, 0.5864864864864865);
        assert_eq!(ci.std, 0.202900804098632);
        assert_eq!(ci.half_width, 0.06537910596582527);
    }

    #[test]
    fn bad_input_is_an_error() {
        let e = accuracy_interval(&[]).unwrap_err().to_string();
        assert!(e.contains("accuracies"), "{e}");
        let e = accuracy_interval(&[0.5, f64::NAN]).unwrap_err().to_string();
        assert!(e.contains("episode 1"), "{e}");
        assert!(episode_accuracy(&[1], &[1, 2]).is_err());
        assert!(episode_accuracy(&[], &[]).is_err());
        assert_eq!(
            episode_accuracy(&[0, 1, 2, 2], &[0, 1, 1, 2]).unwrap(),
            0.75
        );
    }
}

//! The points a hyperparameter search trains ([`super::tune`]): every combination of a grid's
//! values ([`grid`]), or points drawn at random from ranges ([`sample`]).
//!
//! **Why random points.** Bergstra & Bengio (*Random Search for Hyper-Parameter Optimization*,
//! JMLR 2012) showed that when only some hyperparameters matter, which is the usual case and
//! not known beforehand, a grid of `N` points tries only `N^(1/D)` values of each of its `D`
//! axes, while `N` random points try `N` distinct values of each: the same budget explores the
//! axis that matters `N^(1 − 1/D)` times more finely. A range (`loss.tau=loguniform(1e-3,0.3)`)
//! also states what is not known, where a grid's hand-picked values carry the picker's guess.
//! Scales (τ, learning rates, weight decay) are drawn log-uniformly, as in that paper.
//!
//! **Reproducible and extendable.** Point `i` is drawn from its own ChaCha8 stream (the search's
//! seed, stream `i`), each value rounded to three significant digits so that the recipe trains
//! exactly the value its label shows; a draw equal to an earlier point is drawn again from the
//! same stream. The first points of a search therefore do not depend on how many are drawn: with
//! the same seed, `--samples 12` after `--samples 8` draws the same eight first, and the
//! runner's cache trains only the four new ones.

use crate::error::{Error, Result};
use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What a search trains: a grid, or random points. Serialised as `{"grid": {"axes": […]}}` or
/// `{"random": {"ranges": ["loss.tau=loguniform(0.001,0.3)"], "samples": 8, "seed": 0}}`.
///
/// ```
/// use rankwise::experiments::search::Search;
/// let grid = Search::Grid { axes: vec!["loss.tau=0.01,0.1".parse()?] };
/// assert_eq!(grid.points()?, [["loss.tau=0.01"], ["loss.tau=0.1"]]);
/// assert_eq!(grid.describe(), "2 grid points");
/// let random = Search::Random { ranges: vec!["loss.tau=loguniform(0.001,0.3)".parse()?],
///                               samples: 5, seed: 0 };
/// assert_eq!(random.points()?.len(), 5);
/// assert_eq!(random.describe(), "5 random points (drawn with seed 0)");
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Search {
    /// Every combination of the axes' values ([`grid`]).
    Grid {
        /// The grid's axes.
        axes: Vec<GridAxis>,
    },
    /// `samples` points drawn from the ranges ([`sample`]).
    Random {
        /// The keys and what their values are drawn from.
        ranges: Vec<SearchRange>,
        /// How many points.
        samples: usize,
        /// The seed of the draws (not of the runs: every point trains with each of the
        /// search's seeds).
        seed: u64,
    },
}

impl Search {
    /// The points, each the `KEY=VALUE` overrides of one recipe, in the search's order (the
    /// order ties are broken in).
    pub fn points(&self) -> Result<Vec<Vec<String>>> {
        match self {
            Search::Grid { axes } => grid(axes),
            Search::Random {
                ranges,
                samples,
                seed,
            } => sample(ranges, *samples, *seed),
        }
    }

    /// `3 grid points`, or `8 random points (drawn with seed 0)`, for a table's heading (the
    /// number of points is computed; an invalid search says `0`).
    pub fn describe(&self) -> String {
        let n = self.points().map_or(0, |p| p.len());
        match self {
            Search::Grid { .. } => format!("{n} grid points"),
            Search::Random { seed, .. } => format!("{n} random points (drawn with seed {seed})"),
        }
    }

    /// The keys searched, in the order given.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            Search::Grid { axes } => axes.iter().map(|a| a.key.as_str()).collect(),
            Search::Random { ranges, .. } => ranges.iter().map(|r| r.key.as_str()).collect(),
        }
    }

    /// The numeric values a key took over the search's points, for telling whether a choice
    /// lies at the edge of what was searched: the keys whose values are all numbers (a grid
    /// axis of numbers, a uniform, log-uniform or integer range), each with its lowest and
    /// highest value searched.
    pub fn numeric_extent(&self) -> Vec<(String, f64, f64)> {
        let Ok(points) = self.points() else {
            return Vec::new();
        };
        numeric_values(self, &points)
            .into_iter()
            .map(|(key, values)| {
                let low = values.iter().copied().fold(f64::INFINITY, f64::min);
                let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (key, low, high)
            })
            .collect()
    }
}

/// Each key of `search` that takes a number at every one of `points` (its points, or the
/// candidates trained from them), with those numbers in the points' order: a grid axis of
/// numbers, a uniform, log-uniform or integer range (a `choice` never, even of numbers).
pub fn numeric_values(search: &Search, points: &[Vec<String>]) -> Vec<(String, Vec<f64>)> {
    let keys: Vec<&str> = match search {
        Search::Grid { axes } => axes.iter().map(|a| a.key.as_str()).collect(),
        Search::Random { ranges, .. } => ranges
            .iter()
            .filter(|r| !matches!(r.distribution, Distribution::Choice(_)))
            .map(|r| r.key.as_str())
            .collect(),
    };
    keys.into_iter()
        .filter_map(|key| {
            let values: Option<Vec<f64>> = points
                .iter()
                .map(|p| override_value(p, key)?.parse::<f64>().ok())
                .collect();
            let values = values?
                .into_iter()
                .filter(|v| v.is_finite())
                .collect::<Vec<_>>();
            (values.len() == points.len() && !values.is_empty()).then(|| (key.to_string(), values))
        })
        .collect()
}

/// The value `key` takes in a point's `KEY=VALUE` overrides.
pub fn override_value<'a>(point: &'a [String], key: &str) -> Option<&'a str> {
    point
        .iter()
        .find_map(|o| o.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
}

/// The first item equal to an earlier one, if any (a value listed twice, a key given twice).
fn first_repeat<T: PartialEq>(items: &[T]) -> Option<&T> {
    items
        .iter()
        .enumerate()
        .find(|(i, v)| items[..*i].contains(v))
        .map(|(_, v)| v)
}

/// `key` trimmed, if a search may vary it; else why not.
fn searchable_key(key: &str) -> std::result::Result<&str, String> {
    let key = key.trim();
    if key.is_empty() {
        return Err("no key before `=`".into());
    }
    // The recipe's seed is replaced by each seed of the search, and the validation table is
    // the yardstick every point is measured with: a search over either compares nothing.
    if key == "seed" {
        return Err(
            "the seed is not a hyperparameter: every point trains with each of --seeds".into(),
        );
    }
    if key == "validation" || key.starts_with("validation.") {
        return Err(format!(
            "`{key}` defines the held-out classes every point is chosen on; set it once for \
             all points with --set"
        ));
    }
    Ok(key)
}

/// One axis of a grid: a recipe key and the values it takes, written `KEY=V1,V2,…` (each value
/// a TOML value as `rankwise train --set` reads it; commas inside `[…]`, `{…}` or quotes belong
/// to the value).
///
/// ```
/// use rankwise::experiments::search::GridAxis;
/// let axis: GridAxis = "loss.tau=0.001, 0.01,0.1".parse()?;
/// assert_eq!(axis.key, "loss.tau");
/// assert_eq!(axis.values, ["0.001", "0.01", "0.1"]);
/// let ks: GridAxis = "eval.recall_ks=[1,2],[1,4]".parse()?;
/// assert_eq!(ks.values, ["[1,2]", "[1,4]"]);
/// assert!("loss.tau".parse::<GridAxis>().is_err());
/// assert!("loss.tau=0.1,,0.2".parse::<GridAxis>().is_err());
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridAxis {
    /// The dotted recipe key (`loss.tau`, `optimizer.backbone.lr`).
    pub key: String,
    /// Its values, in the order given (the grid's order, and the order ties are broken in).
    pub values: Vec<String>,
}

impl FromStr for GridAxis {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |why: String| Error::invalid(format!("--grid {text:?}"), why);
        let (key, values) = text
            .split_once('=')
            .ok_or_else(|| bad("expected KEY=V1,V2,… (e.g. loss.tau=0.001,0.01,0.1)".into()))?;
        let key = searchable_key(key).map_err(bad)?;
        let values = split_top_level(values);
        if values.iter().any(String::is_empty) {
            return Err(bad(
                "an empty value (two commas in a row, or a trailing one)".into(),
            ));
        }
        if let Some(v) = first_repeat(&values) {
            return Err(bad(format!("value `{v}` is listed twice")));
        }
        Ok(GridAxis {
            key: key.to_string(),
            values,
        })
    }
}

/// `text` split at the commas outside brackets and quotes, each piece trimmed.
fn split_top_level(text: &str) -> Vec<String> {
    crate::io::split_top_level(text)
        .into_iter()
        .map(|p| p.trim().to_string())
        .collect()
}

/// The grid's points, each the `KEY=VALUE` overrides of one recipe: every combination of the
/// axes' values, the first axis varying slowest. Needs distinct keys and at least two points.
///
/// ```
/// use rankwise::experiments::search::{grid, GridAxis};
/// let axes: Vec<GridAxis> = vec!["loss.tau=0.01,0.1".parse()?, "epochs=4,8".parse()?];
/// let points = grid(&axes)?;
/// assert_eq!(points.len(), 4);
/// assert_eq!(points[1], ["loss.tau=0.01", "epochs=8"]);
/// assert!(grid(&axes[1..2].iter().map(|a| GridAxis { values: vec!["4".into()], ..a.clone() })
///     .collect::<Vec<_>>()).is_err()); // one point: nothing to choose from
/// # Ok::<(), rankwise::Error>(())
/// ```
pub fn grid(axes: &[GridAxis]) -> Result<Vec<Vec<String>>> {
    let keys: Vec<&str> = axes.iter().map(|a| a.key.as_str()).collect();
    if let Some(key) = first_repeat(&keys) {
        return Err(Error::invalid(
            "--grid",
            format!("key `{key}` has two axes; list all its values in one"),
        ));
    }
    let mut points: Vec<Vec<String>> = vec![Vec::new()];
    for axis in axes {
        points = points
            .into_iter()
            .flat_map(|p| {
                axis.values.iter().map(move |v| {
                    let mut q = p.clone();
                    q.push(format!("{}={v}", axis.key));
                    q
                })
            })
            .collect();
    }
    if axes.is_empty() || points.len() < 2 {
        return Err(Error::invalid(
            "--grid",
            format!(
                "{} point(s): a search needs at least two (e.g. --grid loss.tau=0.01,0.1)",
                if axes.is_empty() { 0 } else { points.len() }
            ),
        ));
    }
    Ok(points)
}

/// What a random search draws a key's values from.
#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    /// `loguniform(LOW,HIGH)`: `exp` of a uniform draw in `[ln LOW, ln HIGH)`, for scales
    /// (`0 < LOW < HIGH`).
    LogUniform {
        /// The lower bound.
        low: f64,
        /// The upper bound.
        high: f64,
    },
    /// `uniform(LOW,HIGH)`: uniform in `[LOW, HIGH)`.
    Uniform {
        /// The lower bound.
        low: f64,
        /// The upper bound.
        high: f64,
    },
    /// `int(LOW,HIGH)`: an integer, each of `LOW..=HIGH` equally likely.
    Int {
        /// The lowest value.
        low: i64,
        /// The highest value.
        high: i64,
    },
    /// `choice(V1,V2,…)`: one of the values (TOML values, as `--grid` takes them), each equally
    /// likely.
    Choice(Vec<String>),
}

impl Distribution {
    /// The value at `u ∈ [0, 1)` (the inverse of the distribution's CDF), as the TOML text a
    /// recipe override takes: numbers rounded to three significant digits, floats written with
    /// a decimal point.
    pub fn value_at(&self, u: f64) -> String {
        match self {
            Distribution::LogUniform { low, high } => {
                float_text((low.ln() + u * (high.ln() - low.ln())).exp())
            }
            Distribution::Uniform { low, high } => float_text(low + u * (high - low)),
            Distribution::Int { low, high } => {
                // In i128: `high - low` may not fit an i64.
                let (low, high) = (i128::from(*low), i128::from(*high));
                let span = (high - low + 1) as f64;
                (low + ((u * span).floor() as i128).min(high - low)).to_string()
            }
            Distribution::Choice(values) => {
                values[((u * values.len() as f64) as usize).min(values.len() - 1)].clone()
            }
        }
    }

    /// How many distinct values it can give, `None` for a continuous range (more than any
    /// search draws, though rounding to three digits makes it finite).
    fn discrete_size(&self) -> Option<u64> {
        match self {
            Distribution::Int { low, high } => {
                Some(u64::try_from(i128::from(*high) - i128::from(*low) + 1).unwrap_or(u64::MAX))
            }
            Distribution::Choice(values) => Some(values.len() as u64),
            _ => None,
        }
    }
}

/// `x` rounded to three significant digits, written as a TOML float (`0.00316`, `12.0`).
fn float_text(x: f64) -> String {
    let rounded: f64 = format!("{x:.2e}").parse().unwrap_or(x);
    let text = rounded.to_string();
    if text.contains(['.', 'e', 'i', 'N']) {
        text
    } else {
        format!("{text}.0")
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Distribution::LogUniform { low, high } => write!(f, "loguniform({low},{high})"),
            Distribution::Uniform { low, high } => write!(f, "uniform({low},{high})"),
            Distribution::Int { low, high } => write!(f, "int({low},{high})"),
            Distribution::Choice(values) => write!(f, "choice({})", values.join(",")),
        }
    }
}

/// One key of a random search and what its values are drawn from, written
/// `KEY=loguniform(LOW,HIGH)`, `KEY=uniform(LOW,HIGH)`, `KEY=int(LOW,HIGH)` or
/// `KEY=choice(V1,V2,…)`.
///
/// ```
/// use rankwise::experiments::search::{Distribution, SearchRange};
/// let r: SearchRange = "optimizer.backbone.lr = loguniform(1e-5, 1e-3)".parse()?;
/// assert_eq!(r.key, "optimizer.backbone.lr");
/// assert_eq!(r.distribution, Distribution::LogUniform { low: 1e-5, high: 1e-3 });
/// assert_eq!(r.to_string(), "optimizer.backbone.lr=loguniform(0.00001,0.001)");
/// // Halfway in log scale: 1e-4.
/// assert_eq!(r.distribution.value_at(0.5), "0.0001");
/// assert!("loss.tau=loguniform(0,0.1)".parse::<SearchRange>().is_err()); // no log of 0
/// assert!("loss.tau=normal(0,1)".parse::<SearchRange>().is_err());
/// # Ok::<(), rankwise::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SearchRange {
    /// The dotted recipe key.
    pub key: String,
    /// What its values are drawn from.
    pub distribution: Distribution,
}

impl fmt::Display for SearchRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.distribution)
    }
}

impl From<SearchRange> for String {
    fn from(r: SearchRange) -> String {
        r.to_string()
    }
}

impl TryFrom<String> for SearchRange {
    type Error = Error;

    fn try_from(text: String) -> Result<Self> {
        text.parse()
    }
}

impl FromStr for SearchRange {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |why: String| Error::invalid(format!("--sample {text:?}"), why);
        let (key, spec) = text.split_once('=').ok_or_else(|| {
            bad("expected KEY=DISTRIBUTION (e.g. loss.tau=loguniform(0.001,0.3))".into())
        })?;
        let key = searchable_key(key).map_err(bad)?;
        let spec = spec.trim();
        let (name, args) = spec
            .strip_suffix(')')
            .and_then(|s| s.split_once('('))
            .ok_or_else(|| {
                bad(format!(
                    "`{spec}` is not NAME(ARGS): loguniform(LOW,HIGH), uniform(LOW,HIGH), \
                     int(LOW,HIGH) or choice(V1,V2,…)"
                ))
            })?;
        let args = split_top_level(args);
        if args.iter().any(String::is_empty) {
            return Err(bad(format!("an empty argument in `{spec}`")));
        }
        let two = |what: &str| -> std::result::Result<(f64, f64), String> {
            match args.as_slice() {
                [a, b] => {
                    let num = |v: &String| {
                        v.parse::<f64>()
                            .ok()
                            .filter(|x| x.is_finite())
                            .ok_or_else(|| format!("`{v}` is not a finite number"))
                    };
                    let (low, high) = (num(a)?, num(b)?);
                    if low >= high {
                        return Err(format!("{what} needs LOW < HIGH, got {low} and {high}"));
                    }
                    Ok((low, high))
                }
                _ => Err(format!("{what} takes two numbers, LOW and HIGH")),
            }
        };
        let distribution = match name.trim() {
            "loguniform" => {
                let (low, high) = two("loguniform").map_err(bad)?;
                if low <= 0.0 {
                    return Err(bad(format!(
                        "loguniform needs LOW > 0 (it draws in log scale), got {low}"
                    )));
                }
                Distribution::LogUniform { low, high }
            }
            "uniform" => {
                let (low, high) = two("uniform").map_err(bad)?;
                Distribution::Uniform { low, high }
            }
            "int" => {
                let int = |v: &String| {
                    v.parse::<i64>()
                        .map_err(|_| bad(format!("`{v}` is not an integer")))
                };
                match args.as_slice() {
                    [a, b] => {
                        let (low, high) = (int(a)?, int(b)?);
                        if low >= high {
                            return Err(bad(format!("int needs LOW < HIGH, got {low} and {high}")));
                        }
                        Distribution::Int { low, high }
                    }
                    _ => return Err(bad("int takes two integers, LOW and HIGH".into())),
                }
            }
            "choice" => {
                if args.len() < 2 {
                    return Err(bad("choice needs at least two values".into()));
                }
                if let Some(v) = first_repeat(&args) {
                    return Err(bad(format!("value `{v}` is listed twice")));
                }
                Distribution::Choice(args)
            }
            other => {
                return Err(bad(format!(
                    "unknown distribution `{other}`: loguniform, uniform, int or choice"
                )))
            }
        };
        Ok(SearchRange {
            key: key.to_string(),
            distribution,
        })
    }
}

/// The random search's points: `samples` points, point `i` drawn from ChaCha8 stream `i` of
/// `seed`, each range in turn (see the module documentation), a draw equal to an earlier point
/// drawn again. Needs distinct keys, at least two samples, and a space with at least `samples`
/// distinct points: an error says when a grid would train them all.
///
/// ```
/// use rankwise::experiments::search::{sample, SearchRange};
/// let ranges: Vec<SearchRange> = vec!["loss.tau=loguniform(0.001,0.3)".parse()?,
///                                     "loss.kind=choice(\"smooth_ap\",\"fast_ap\")".parse()?];
/// let eight = sample(&ranges, 8, 0)?;
/// assert_eq!(eight.len(), 8);
/// // More samples with the same seed: the same first points (the cache trains only the new).
/// assert_eq!(sample(&ranges, 12, 0)?[..8], eight[..]);
/// assert_ne!(sample(&ranges, 8, 1)?, eight);
/// # Ok::<(), rankwise::Error>(())
/// ```
pub fn sample(ranges: &[SearchRange], samples: usize, seed: u64) -> Result<Vec<Vec<String>>> {
    let bad = |why: String| Error::invalid("--sample", why);
    if ranges.is_empty() {
        return Err(bad("no range to draw from".into()));
    }
    let keys: Vec<&str> = ranges.iter().map(|r| r.key.as_str()).collect();
    if let Some(key) = first_repeat(&keys) {
        return Err(bad(format!("key `{key}` has two ranges")));
    }
    if samples < 2 {
        return Err(Error::invalid(
            "--samples",
            format!("{samples} point(s): a search needs at least two"),
        ));
    }
    let space = ranges.iter().try_fold(1u64, |n, r| {
        r.distribution.discrete_size().map(|k| n.saturating_mul(k))
    });
    if let Some(space) = space.filter(|&n| n < samples as u64) {
        return Err(Error::invalid(
            "--samples",
            format!(
                "the ranges hold only {space} distinct points, fewer than {samples}: a grid \
                 (--grid) trains them all"
            ),
        ));
    }
    // Draws per point before giving up on a distinct one: a continuous range narrower than its
    // three rounded digits can still run out of values.
    const ATTEMPTS: usize = 1000;
    let mut points: Vec<Vec<String>> = Vec::new();
    for i in 0..samples {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(i as u64);
        let point = (0..ATTEMPTS)
            .map(|_| {
                ranges
                    .iter()
                    .map(|r| format!("{}={}", r.key, r.distribution.value_at(unit(&mut rng))))
                    .collect::<Vec<String>>()
            })
            .find(|p| !points.contains(p))
            .ok_or_else(|| {
                bad(format!(
                    "no draw of {ATTEMPTS} gave a point distinct from the first {i}: the ranges, \
                     at three significant digits, hold too few values for {samples} points"
                ))
            })?;
        points.push(point);
    }
    Ok(points)
}

/// A uniform draw in `[0, 1)` from the top 53 bits of one 64-bit output: written here rather
/// than taken from `rand`'s distributions, whose streams may change between versions, so that a
/// seed draws the same points for as long as ChaCha8 is ChaCha8.
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_parse_and_refuse_what_cannot_be_searched() {
        let a: GridAxis = "optimizer.backbone.lr = 1e-4,5e-4".parse().unwrap();
        assert_eq!(
            (a.key.as_str(), a.values.clone()),
            (
                "optimizer.backbone.lr",
                vec!["1e-4".to_string(), "5e-4".to_string()]
            )
        );
        let a: GridAxis = r#"loss.kind="smooth_ap",'fast_ap', {x = 1, y = 2}"#
            .parse()
            .unwrap();
        assert_eq!(a.values, [r#""smooth_ap""#, "'fast_ap'", "{x = 1, y = 2}"]);
        let a: GridAxis = r#"name="a,b",c"#.parse().unwrap();
        assert_eq!(a.values, [r#""a,b""#, "c"]);
        for (text, want) in [
            ("loss.tau", "KEY=V1,V2"),
            ("=0.1,0.2", "no key"),
            ("seed=1,2", "not a hyperparameter"),
            ("validation.fraction=0.1,0.2", "held-out classes"),
            ("validation={fraction=0.1}", "held-out classes"),
            ("loss.tau=0.1,", "empty value"),
            ("loss.tau=0.1,0.1", "listed twice"),
        ] {
            let e = text.parse::<GridAxis>().unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("--grid"), "{text}: {e}");
        }
    }

    #[test]
    fn the_grid_is_every_combination_first_axis_slowest() {
        let axes: Vec<GridAxis> = ["a=1,2,3", "b=x,y"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let g = grid(&axes).unwrap();
        assert_eq!(g.len(), 6);
        assert_eq!(g[0], ["a=1", "b=x"]);
        assert_eq!(g[1], ["a=1", "b=y"]);
        assert_eq!(g[5], ["a=3", "b=y"]);
        let e = grid(&[]).unwrap_err().to_string();
        assert!(e.contains("0 point(s)"), "{e}");
        let twice = vec![axes[0].clone(), axes[0].clone()];
        let e = grid(&twice).unwrap_err().to_string();
        assert!(e.contains("two axes"), "{e}");
    }

    #[test]
    fn ranges_parse_and_refuse_what_cannot_be_drawn() {
        let r: SearchRange = "loss.margin = uniform(-0.5, 1)".parse().unwrap();
        assert_eq!(
            r.distribution,
            Distribution::Uniform {
                low: -0.5,
                high: 1.0
            }
        );
        let r: SearchRange = "data.m=int(2,8)".parse().unwrap();
        assert_eq!(r.distribution, Distribution::Int { low: 2, high: 8 });
        let r: SearchRange = r#"loss.kind=choice("smooth_ap", "fast_ap")"#.parse().unwrap();
        assert_eq!(
            r.distribution,
            Distribution::Choice(vec![r#""smooth_ap""#.into(), r#""fast_ap""#.into()])
        );
        // The text form reads back as the same range (the JSON stores it so).
        for text in [
            "loss.tau=loguniform(0.001,0.3)",
            "a=uniform(-1,2.5)",
            "b=int(-3,4)",
            "c=choice([1,2],[3,4])",
        ] {
            let r: SearchRange = text.parse().unwrap();
            assert_eq!(r.to_string(), text);
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<SearchRange>(&json).unwrap(), r);
        }
        for (text, want) in [
            ("loss.tau", "KEY=DISTRIBUTION"),
            ("seed=int(0,9)", "not a hyperparameter"),
            ("validation.fraction=uniform(0.1,0.3)", "held-out classes"),
            ("loss.tau=0.1", "not NAME(ARGS)"),
            ("loss.tau=normal(0,1)", "unknown distribution"),
            ("loss.tau=loguniform(0,1)", "LOW > 0"),
            ("loss.tau=loguniform(0.1,0.01)", "LOW < HIGH"),
            ("loss.tau=uniform(1)", "two numbers"),
            ("loss.tau=uniform(a,1)", "`a` is not a finite number"),
            ("loss.tau=uniform(0,inf)", "not a finite number"),
            ("data.m=int(2.5,8)", "not an integer"),
            ("data.m=int(4,4)", "LOW < HIGH"),
            ("loss.kind=choice(a)", "at least two"),
            ("loss.kind=choice(a,a)", "listed twice"),
            ("loss.kind=choice(a,,b)", "empty argument"),
        ] {
            let e = text.parse::<SearchRange>().unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("--sample"), "{text}: {e}");
        }
    }

    #[test]
    fn values_are_the_inverse_cdf_rounded_to_three_digits() {
        let log = Distribution::LogUniform {
            low: 1e-3,
            high: 1e-1,
        };
        assert_eq!(log.value_at(0.0), "0.001");
        assert_eq!(log.value_at(0.5), "0.01");
        assert_eq!(log.value_at(0.25), "0.00316");
        let uniform = Distribution::Uniform {
            low: 10.0,
            high: 20.0,
        };
        assert_eq!(uniform.value_at(0.0), "10.0");
        assert_eq!(uniform.value_at(0.123456), "11.2");
        let int = Distribution::Int { low: 2, high: 4 };
        let ints: Vec<String> = [0.0, 0.33, 0.34, 0.66, 0.67, 0.999_999]
            .iter()
            .map(|&u| int.value_at(u))
            .collect();
        assert_eq!(ints, ["2", "2", "3", "3", "4", "4"]);
        // The whole i64 range: no overflow, every value inside it (near the top, to the 53 bits
        // of the draw).
        let wide = Distribution::Int {
            low: i64::MIN,
            high: i64::MAX,
        };
        assert_eq!(wide.value_at(0.0), i64::MIN.to_string());
        let top: i64 = wide.value_at(1.0 - f64::EPSILON / 2.0).parse().unwrap();
        assert!(top > i64::MAX - (1 << 12), "{top}");
        assert_eq!(wide.discrete_size(), Some(u64::MAX));
        let choice = Distribution::Choice(vec!["a".into(), "b".into()]);
        assert_eq!(
            (choice.value_at(0.49), choice.value_at(0.5)),
            ("a".to_string(), "b".to_string())
        );
        // Every value is TOML a recipe reads as a number of the right kind.
        for text in [log.value_at(0.7), uniform.value_at(0.2), int.value_at(0.5)] {
            let v: toml::Value = toml::from_str(&format!("x = {text}")).unwrap();
            assert!(v["x"].is_float() || v["x"].is_integer(), "{text}");
        }
        assert_eq!(float_text(-0.000_123_456), "-0.000123");
        assert_eq!(float_text(123_456.0), "123000.0");
    }

    #[test]
    fn draws_are_uniform_over_each_range_and_distinct() {
        let ranges: Vec<SearchRange> = ["a=loguniform(0.001,1)", "b=int(0,9)", "c=choice(x,y)"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let points = sample(&ranges, 2000, 7).unwrap();
        let value = |p: &Vec<String>, k: &str| override_value(p, k).unwrap().to_string();
        // log10 of a is uniform on [-3, 0): each third of the decades holds about a third.
        let decades: Vec<usize> = (0..3)
            .map(|d| {
                points
                    .iter()
                    .filter(|p| {
                        let x: f64 = value(p, "a").parse().unwrap();
                        (x.log10() + 3.0).floor() as usize == d
                    })
                    .count()
            })
            .collect();
        for c in &decades {
            // 2000/3 ± 4.5 standard deviations (√(2000·(1/3)·(2/3)) ≈ 21).
            assert!((c.abs_diff(667)) < 95, "{decades:?}");
        }
        for k in 0..10 {
            let c = points
                .iter()
                .filter(|p| value(p, "b") == k.to_string())
                .count();
            assert!(c.abs_diff(200) < 60, "b={k}: {c}");
        }
        let xs = points.iter().filter(|p| value(p, "c") == "x").count();
        assert!(xs.abs_diff(1000) < 100, "{xs}");
        for (i, p) in points.iter().enumerate() {
            assert!(!points[..i].contains(p), "point {i} drawn twice");
        }
    }

    #[test]
    fn a_small_discrete_space_is_refused_and_a_full_one_drawn_whole() {
        let ranges: Vec<SearchRange> = ["b=int(0,2)", "c=choice(x,y)"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let e = sample(&ranges, 7, 0).unwrap_err().to_string();
        assert!(
            e.contains("only 6 distinct points") && e.contains("--grid"),
            "{e}"
        );
        // Six draws of a six-point space: every point once (each repeat drawn again).
        let mut all = sample(&ranges, 6, 0).unwrap();
        all.sort();
        let mut want = grid(&[
            "b=0,1,2".parse::<GridAxis>().unwrap(),
            "c=x,y".parse().unwrap(),
        ])
        .unwrap();
        want.sort();
        assert_eq!(all, want);
        // A continuous range narrower than its three digits runs out of values.
        let narrow = vec!["a=uniform(1,1.001)".parse::<SearchRange>().unwrap()];
        let e = sample(&narrow, 5, 0).unwrap_err().to_string();
        assert!(e.contains("too few values"), "{e}");
        let e = sample(&[narrow[0].clone(), narrow[0].clone()], 5, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("two ranges"), "{e}");
        assert!(sample(&narrow, 1, 0).is_err());
    }

    #[test]
    fn the_extent_of_each_numeric_key_is_what_was_searched() {
        let grid = Search::Grid {
            axes: vec![
                "loss.tau=0.1,0.01,1.0".parse().unwrap(),
                r#"loss.kind="a","b""#.parse().unwrap(),
            ],
        };
        assert_eq!(grid.numeric_extent(), [("loss.tau".to_string(), 0.01, 1.0)]);
        let random = Search::Random {
            ranges: vec![
                "lr=loguniform(0.0001,0.01)".parse().unwrap(),
                "k=choice(1,2)".parse().unwrap(),
            ],
            samples: 6,
            seed: 3,
        };
        let extent = random.numeric_extent();
        assert_eq!(extent.len(), 1);
        let (key, low, high) = &extent[0];
        assert_eq!(key, "lr");
        assert!(1e-4 <= *low && low < high && *high <= 1e-2, "{extent:?}");
        let search = serde_json::to_string(&random).unwrap();
        assert!(
            search.starts_with(r#"{"random":{"ranges":["lr=loguniform(0.0001,0.01)""#),
            "{search}"
        );
        assert_eq!(serde_json::from_str::<Search>(&search).unwrap(), random);
    }
}

//! An experiment's recipe: the base training recipe of each scale, read from
//! `configs/experiments/<paper>.toml`.

use crate::error::{Error, Result};
use crate::train::config::with_moved_key_hint;
use crate::train::TrainConfig;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};
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
    /// The `quick` data and network trained towards convergence (the test metric moves by less
    /// than half a point over the last 20% of the epochs, `experiments::convergence`), where a
    /// recipe says so fine-tuned from a backbone pretrained on other classes
    /// ([`ExperimentRecipe::pretraining`]), as the papers fine-tune ImageNet weights: a few
    /// hours on a CPU.
    Standard,
    /// The paper's data and models (a GPU).
    Paper,
}

impl Scale {
    /// `tiny`, `quick`, `standard`, `paper`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scale::Tiny => "tiny",
            Scale::Quick => "quick",
            Scale::Standard => "standard",
            Scale::Paper => "paper",
        }
    }

    /// Every scale, smallest first.
    pub const ALL: [Scale; 4] = [Scale::Tiny, Scale::Quick, Scale::Standard, Scale::Paper];
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
            "standard" => Ok(Scale::Standard),
            "paper" => Ok(Scale::Paper),
            _ => Err(Error::invalid(
                "scale",
                format!("unknown scale {s:?}; expected tiny, quick, standard or paper"),
            )),
        }
    }
}

/// The scale named by the `RANKWISE_SCALE` environment variable (`tiny`, `quick`, `standard` or
/// `paper`),
/// `default` if unset; an error naming the variable for any other value.
pub fn scale_from_env(default: Scale) -> Result<Scale> {
    match std::env::var("RANKWISE_SCALE") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|e| Error::invalid("RANKWISE_SCALE", format!("{e}"))),
        _ => Ok(default),
    }
}

/// How many seeds every table row runs at each scale (`[seeds]` of a recipe). Seed `i` of a
/// row is the base recipe's `seed + i`: it changes the initial weights and the batches, not
/// the data, so the spread over seeds is the run-to-run noise a claim must rise above.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SeedCounts {
    /// CI scale (2 by default: the smallest count that has a spread, so CI runs the interval
    /// and test code on every table).
    pub tiny: usize,
    /// CPU scale (3 by default).
    pub quick: usize,
    /// Converged runs (3 by default).
    pub standard: usize,
    /// The paper's scale (3 by default).
    pub paper: usize,
    /// `[seeds.looks]`: the smaller counts at which a scale's verdicts were read before its
    /// rows got more seeds (none by default).
    pub looks: EarlierLooks,
}

impl Default for SeedCounts {
    fn default() -> Self {
        SeedCounts {
            tiny: 2,
            quick: 3,
            standard: 3,
            paper: 3,
            looks: EarlierLooks::default(),
        }
    }
}

/// For each scale, the seed counts (increasing, each below the scale's count) at which its
/// claims' verdicts were read before the rows got more seeds (`[seeds.looks]`, e.g.
/// `standard = [3, 5, 8]`). Reading verdicts and adding seeds where they were undecided is a
/// group-sequential design: every comparison is then held to the level of
/// [`crate::stats::sequential_level`] over those looks and the current count, not 5%, so that
/// the seeds added after a look cannot decide claims by chance more often than the rule
/// states. A count fixed in advance has no earlier looks.
pub type EarlierLooks = PerScale<Vec<usize>>;

/// One value for each scale: a TOML table whose keys are the scales (`tiny`, `quick`,
/// `standard`, `paper`), each optional (its default when left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    bound(deserialize = "T: Deserialize<'de> + Default")
)]
pub struct PerScale<T> {
    /// At the tiny scale.
    pub tiny: T,
    /// At the quick scale.
    pub quick: T,
    /// At the standard scale.
    pub standard: T,
    /// At the paper's scale.
    pub paper: T,
}

impl<T> PerScale<T> {
    /// The value of `scale`.
    pub fn of(&self, scale: Scale) -> &T {
        match scale {
            Scale::Tiny => &self.tiny,
            Scale::Quick => &self.quick,
            Scale::Standard => &self.standard,
            Scale::Paper => &self.paper,
        }
    }

    /// The value of `scale`, to change.
    pub fn of_mut(&mut self, scale: Scale) -> &mut T {
        match scale {
            Scale::Tiny => &mut self.tiny,
            Scale::Quick => &mut self.quick,
            Scale::Standard => &mut self.standard,
            Scale::Paper => &mut self.paper,
        }
    }
}

impl SeedCounts {
    /// The count of `scale`.
    pub fn count(&self, scale: Scale) -> usize {
        match scale {
            Scale::Tiny => self.tiny,
            Scale::Quick => self.quick,
            Scale::Standard => self.standard,
            Scale::Paper => self.paper,
        }
    }

    /// Every look at `scale`'s verdicts, in order: the earlier looks ([`EarlierLooks`]) and
    /// the current count (just the count when the scale has no earlier look).
    pub fn looks(&self, scale: Scale) -> Vec<usize> {
        let mut looks = self.looks.of(scale).to_vec();
        looks.push(self.count(scale));
        looks
    }

    /// Errors if a scale has no seed, or if its earlier looks are not increasing counts of at
    /// least one seed below its count.
    pub fn validate(&self) -> Result<()> {
        for scale in Scale::ALL {
            let count = self.count(scale);
            if count == 0 {
                return Err(Error::invalid(
                    "seeds",
                    format!("`{scale} = 0`: every row needs at least one seed"),
                ));
            }
            let looks = self.looks.of(scale);
            let increasing = looks.windows(2).all(|w| w[0] < w[1]);
            if !increasing || looks.iter().any(|&l| l == 0 || l >= count) {
                return Err(Error::invalid(
                    "seeds.looks",
                    format!(
                        "`{scale} = {looks:?}`: the earlier looks must be increasing seed counts \
                         below the scale's `{scale} = {count}` (drop the looks at or above it if \
                         you lowered the count)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The base recipes of an experiment, one per scale (each a full [`TrainConfig`]; omitted
/// fields take their defaults), and how many seeds each row runs. `paper` is absent where the
/// paper's data cannot be described yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentRecipe {
    /// Seeds per row at each scale (`[seeds]`; defaults [`SeedCounts::default`]).
    #[serde(default)]
    pub seeds: SeedCounts,
    /// CI scale.
    pub tiny: TrainConfig,
    /// CPU scale.
    pub quick: TrainConfig,
    /// Trained to convergence (absent: not defined for this experiment yet).
    #[serde(default)]
    pub standard: Option<TrainConfig>,
    /// The paper's scale.
    #[serde(default)]
    pub paper: Option<TrainConfig>,
    /// `[pretraining.<scale>]`: how the backbone every run of a scale starts from is
    /// pretrained ([`Self::pretraining`]); a scale without one trains from random weights.
    #[serde(default)]
    pub pretraining: Pretraining,
}

/// For each scale, the changes (TOML, over the scale's base recipe) of the run that pretrains
/// the backbone all of the scale's runs fine-tune — what ImageNet is to the papers' SOP runs:
/// e.g. another draw of the embedded generator (`dataset.seed = 1`: other classes) learnt with a
/// softmax classifier. `loss` and `sampler`, when given, replace the base's whole table (another
/// kind has other fields); every other table merges key by key ([`merge_toml`]).
///
/// A section may start from a shared file: `extends = "shared/pretraining_standard.toml"`
/// (relative to the recipe's folder) reads that file's changes and merges the section's own
/// keys over them when the recipe is read (key by key, `loss` and `sampler` too), so that the papers whose runs fine-tune one backbone
/// state its recipe once. After reading, every section holds its resolved changes.
pub type Pretraining = PerScale<Option<toml::Table>>;

/// The key of a `[pretraining.<scale>]` section naming the shared file it starts from.
pub const EXTENDS: &str = "extends";

/// The shared files the `[pretraining.<scale>]` sections of `recipe` (the raw TOML of the file
/// at `path`) extend, each once in the order of the sections: the name as written, and the path
/// it is read from (relative to the recipe's folder).
pub fn extended_files(path: &Path, recipe: &toml::Table) -> Vec<(String, PathBuf)> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    let sections = recipe.get("pretraining").and_then(toml::Value::as_table);
    for name in sections
        .into_iter()
        .flat_map(|scales| scales.values())
        .filter_map(|section| section.get(EXTENDS)?.as_str())
    {
        if !files.iter().any(|(seen, _)| seen == name) {
            files.push((name.to_string(), shared_file(path, name)));
        }
    }
    files
}

/// The file `extends = "<name>"` names in the recipe at `path`: relative to the recipe's folder.
fn shared_file(path: &Path, name: &str) -> PathBuf {
    path.parent().unwrap_or(Path::new("")).join(name)
}

/// Resolves every `extends = "<file>"` of `pretraining` (read from the recipe at `path`): the
/// file (relative to the recipe's folder; TOML holding the changes at its top level, without an
/// `extends` of its own) with the section's other keys merged over it ([`merge_toml`]). Errors
/// name the recipe and the section, and the shared file where it is missing or not TOML.
pub(crate) fn resolve_extends(path: &Path, pretraining: &mut Pretraining) -> Result<()> {
    for scale in Scale::ALL {
        let Some(section) = pretraining.of_mut(scale).as_mut() else {
            continue;
        };
        let Some(shared) = section.remove(EXTENDS) else {
            continue;
        };
        let in_section = |msg: String| Error::file(path, format!("[pretraining.{scale}]: {msg}"));
        let toml::Value::String(name) = shared else {
            return Err(in_section(format!(
                "`{EXTENDS}` must name a file (a string), not {shared}"
            )));
        };
        let file = shared_file(path, &name);
        let text = std::fs::read_to_string(&file).map_err(|e| {
            in_section(format!("`{EXTENDS} = \"{name}\"`: {}", Error::io(&file, e)))
        })?;
        let mut changes: toml::Table =
            toml::from_str(&text).map_err(|e| Error::file(&file, e.to_string()))?;
        if changes.contains_key(EXTENDS) {
            return Err(Error::file(
                &file,
                format!(
                    "a shared pretraining file cannot `{EXTENDS}` another (read by {})",
                    path.display()
                ),
            ));
        }
        merge_toml(&mut changes, std::mem::take(section));
        *section = changes;
    }
    Ok(())
}

impl ExperimentRecipe {
    /// Reads a recipe; errors name the file, line and key.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_toml_file_with(path, "")
    }

    /// [`Self::from_toml_file`] with `changes`, TOML merged over the file's ([`merge_toml`]):
    /// what a notebook's recipe cell passes.
    pub fn from_toml_file_with(path: impl AsRef<Path>, changes: &str) -> Result<Self> {
        let path = path.as_ref();
        let mut recipe: Self = read_per_scale(
            path,
            changes,
            |r: &ExperimentRecipe| {
                [
                    Some(&r.tiny),
                    Some(&r.quick),
                    r.standard.as_ref(),
                    r.paper.as_ref(),
                ]
            },
            TrainConfig::validate,
        )?;
        resolve_extends(path, &mut recipe.pretraining)?;
        recipe
            .seeds
            .validate()
            .map_err(|e| Error::file(path, format!("[seeds]: {e}")))?;
        check_pretraining(path, |scale| recipe.pretraining(scale))?;
        Ok(recipe)
    }

    /// The seeds every row runs at `scale`: the base recipe's seed and the next ones.
    pub fn seeds(&self, scale: Scale) -> Result<Vec<u64>> {
        let first = self.base(scale)?.seed;
        Ok((0..self.seeds.count(scale) as u64)
            .map(|i| first + i)
            .collect())
    }

    /// The recipe of `configs/experiments/<paper>.toml` under the repository root `root`.
    pub fn for_paper(root: &Path, paper: &str) -> Result<Self> {
        Self::from_toml_file(recipe_path(root, paper))
    }

    /// [`Self::for_paper`] with `changes` merged over the file ([`merge_toml`]).
    pub fn for_paper_with(root: &Path, paper: &str, changes: &str) -> Result<Self> {
        Self::from_toml_file_with(recipe_path(root, paper), changes)
    }

    /// The base recipe of `scale`; an error if the file has none for the standard or paper
    /// scale.
    pub fn base(&self, scale: Scale) -> Result<TrainConfig> {
        match scale {
            Scale::Tiny => Ok(self.tiny.clone()),
            Scale::Quick => Ok(self.quick.clone()),
            Scale::Standard => self.standard.clone().ok_or_else(|| {
                Error::invalid(
                    "scale",
                    "this experiment's recipe has no [standard] section yet; run the tiny or \
                     quick scale",
                )
            }),
            Scale::Paper => self.paper.clone().ok_or_else(|| {
                Error::invalid(
                    "scale",
                    "this experiment's recipe has no [paper] section yet (the paper's dataset \
                     cannot be described in it); run the tiny or quick scale",
                )
            }),
        }
    }
}

impl ExperimentRecipe {
    /// The recipe that pretrains the backbone every run of `scale` starts from: the scale's
    /// base recipe with `[pretraining.<scale>]` merged over it ([`Pretraining`]); `None` when
    /// the scale has no such section. The runs get its weights through
    /// [`super::Runner::pretrained_backbone`] (trained once, cached).
    pub fn pretraining(&self, scale: Scale) -> Result<Option<TrainConfig>> {
        let Some(changes) = self.pretraining.of(scale).as_ref() else {
            return Ok(None);
        };
        pretraining_over(&self.base(scale)?, changes).map(Some)
    }
}

/// Resolves every scale's `[pretraining.<scale>]` recipe with `pretraining` once at load time, so
/// that a bad section fails when the file is read (naming the file and the section), not when a
/// table first needs the backbone.
pub(crate) fn check_pretraining(
    path: &Path,
    pretraining: impl Fn(Scale) -> Result<Option<TrainConfig>>,
) -> Result<()> {
    for scale in Scale::ALL {
        pretraining(scale).map_err(|e| Error::file(path, format!("[pretraining.{scale}]: {e}")))?;
    }
    Ok(())
}

/// `base` with a `[pretraining.<scale>]` section's `changes` merged over it ([`Pretraining`]:
/// `loss` and `sampler` replace the base's whole table, every other table merges key by key),
/// validated: the recipe of the run that pretrains a scale's backbone.
pub(crate) fn pretraining_over(base: &TrainConfig, changes: &toml::Table) -> Result<TrainConfig> {
    let mut table: toml::Table = toml::from_str(&base.to_toml_string()?)
        .map_err(|e| Error::invalid("pretraining", e.to_string()))?;
    for whole in ["loss", "sampler"] {
        if changes.contains_key(whole) {
            table.remove(whole);
        }
    }
    merge_toml(&mut table, changes.clone());
    let config: TrainConfig = table
        .try_into()
        .map_err(|e: toml::de::Error| Error::invalid("pretraining", e.to_string()))?;
    config.validate()?;
    Ok(config)
}

/// Reads a recipe file with one section per scale (`[tiny]`, `[quick]`, optional `[standard]`
/// and `[paper]`, listed by `scales` in the order of [`Scale::ALL`]), with `changes` (TOML,
/// empty for none) merged over it, and validates each section present with `validate`; errors
/// name the file, and the section for a validation error, and say when changes were merged.
pub(crate) fn read_per_scale<R, C>(
    path: &Path,
    changes: &str,
    scales: impl for<'a> Fn(&'a R) -> [Option<&'a C>; 4],
    validate: impl Fn(&C) -> Result<()>,
) -> Result<R>
where
    R: serde::de::DeserializeOwned,
{
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let recipe: R = if !has_changes(changes) {
        toml::from_str(&text).map_err(|e| Error::file(path, with_moved_key_hint(e.to_string())))?
    } else {
        let mut merged: toml::Table =
            toml::from_str(&text).map_err(|e| Error::file(path, e.to_string()))?;
        let changes: toml::Table = toml::from_str(changes)
            .map_err(|e| Error::invalid("recipe changes", format!("not TOML: {e}")))?;
        merge_toml(&mut merged, changes);
        merged.try_into().map_err(|e: toml::de::Error| {
            Error::file(
                path,
                with_moved_key_hint(format!("with the recipe changes merged: {e}")),
            )
        })?
    };
    for (scale, section) in Scale::ALL.into_iter().zip(scales(&recipe)) {
        if let Some(c) = section {
            validate(c).map_err(|e| Error::file(path, format!("[{scale}]: {e}")))?;
        }
    }
    Ok(recipe)
}

/// Whether `changes` (TOML) sets any key: empty text and comments only do not (a notebook's
/// recipe cell holds a commented example). Text that is not TOML counts as changes, so that
/// reading it reports the error.
pub fn has_changes(changes: &str) -> bool {
    toml::from_str::<toml::Table>(changes).map_or(true, |t| !t.is_empty())
}

/// Merges `changes` into `base`: a table merges key by key, recursively; any other value
/// (a number, a string, an array) replaces the one in `base`. So `[quick]` + `epochs = 8`
/// changes one key of the quick recipe and keeps the rest.
pub fn merge_toml(base: &mut toml::Table, changes: toml::Table) {
    for (key, value) in changes {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(c)) => merge_toml(b, c),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// `configs/experiments/<paper>.toml` under `root`.
pub fn recipe_path(root: &Path, paper: &str) -> PathBuf {
    root.join("configs")
        .join("experiments")
        .join(format!("{paper}.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_round_trips_through_text_and_serde() {
        for s in Scale::ALL {
            assert_eq!(s.to_string().parse::<Scale>().unwrap(), s);
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{s}\""));
            assert_eq!(serde_json::from_str::<Scale>(&json).unwrap(), s);
        }
        let e = "huge".parse::<Scale>().unwrap_err().to_string();
        assert!(e.contains("scale") && e.contains("huge"), "{e}");
    }

    /// `extends` reads the shared file and merges the section's own keys over it: the same
    /// resolved recipe as the section written out in full; a missing file, a non-string, a
    /// shared file that extends another, or a shared file that is not TOML is an error naming
    /// the files and the section.
    #[test]
    fn a_pretraining_section_extends_a_shared_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("shared")).unwrap();
        let shared = dir.path().join("shared").join("pre.toml");
        std::fs::write(
            &shared,
            "epochs = 3\n[dataset]\nseed = 1\n[loss]\nkind = \"norm_softmax\"\n",
        )
        .unwrap();
        let base = "[tiny]\nepochs = 1\n[quick]\nepochs = 1\n[standard]\nepochs = 2\n";
        let read = |name: &str, pretraining: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("{base}{pretraining}")).unwrap();
            ExperimentRecipe::from_toml_file(&path)
        };
        let inline = read(
            "inline.toml",
            "[pretraining.standard]\nepochs = 4\n[pretraining.standard.dataset]\nseed = 1\n\
             [pretraining.standard.loss]\nkind = \"norm_softmax\"\n",
        )
        .unwrap();
        let extends = read(
            "extends.toml",
            "[pretraining.standard]\nextends = \"shared/pre.toml\"\nepochs = 4\n",
        )
        .unwrap();
        assert_eq!(extends.pretraining, inline.pretraining);
        let pre = extends.pretraining(Scale::Standard).unwrap().unwrap();
        assert_eq!(
            pre.epochs, 4,
            "the section's own key wins over the shared file's"
        );
        assert_eq!(
            pre.to_toml_string().unwrap(),
            inline
                .pretraining(Scale::Standard)
                .unwrap()
                .unwrap()
                .to_toml_string()
                .unwrap()
        );
        // A notebook's changes merge over the section before the shared file is read.
        let path = dir.path().join("extends.toml");
        let changed =
            ExperimentRecipe::from_toml_file_with(&path, "[pretraining.standard]\nepochs = 5")
                .unwrap();
        assert_eq!(
            changed
                .pretraining(Scale::Standard)
                .unwrap()
                .unwrap()
                .epochs,
            5
        );
        let error =
            |name: &str, pretraining: &str| read(name, pretraining).unwrap_err().to_string();
        let e = error(
            "missing.toml",
            "[pretraining.standard]\nextends = \"shared/none.toml\"\n",
        );
        assert!(
            e.contains("missing.toml")
                && e.contains("[pretraining.standard]")
                && e.contains("none.toml"),
            "{e}"
        );
        let e = error("number.toml", "[pretraining.standard]\nextends = 3\n");
        assert!(
            e.contains("number.toml") && e.contains("extends") && e.contains("string"),
            "{e}"
        );
        // A shared file that extends another, is not TOML, or holds an unknown key: each fails
        // at load, the error naming the shared file and what is wrong with it.
        for (name, text, says) in [
            (
                "chain.toml",
                "extends = \"pre.toml\"\n",
                ["chain.toml", "cannot"],
            ),
            ("bad.toml", "epochs = = 3\n", ["bad.toml", "line 1"]),
            (
                "odd.toml",
                "epochz = 3\n",
                ["[pretraining.standard]", "epochz"],
            ),
        ] {
            std::fs::write(dir.path().join("shared").join(name), text).unwrap();
            let e = error(
                name,
                &format!("[pretraining.standard]\nextends = \"shared/{name}\"\n"),
            );
            assert!(says.iter().all(|s| e.contains(s)), "{name}: {e}");
        }
    }

    #[test]
    fn seeds_follow_the_base_seed_and_zero_seeds_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        let write = |seeds: &str| {
            std::fs::write(
                &path,
                format!("{seeds}\n[tiny]\nseed = 7\nepochs = 1\n[quick]\nepochs = 1\n"),
            )
            .unwrap()
        };
        write("[seeds]\nquick = 4");
        let r = ExperimentRecipe::from_toml_file(&path).unwrap();
        assert_eq!(r.seeds(Scale::Tiny).unwrap(), [7, 8]);
        assert_eq!(r.seeds(Scale::Quick).unwrap(), [0, 1, 2, 3]);
        assert!(r.seeds(Scale::Paper).is_err());
        write("[seeds]\ntiny = 0");
        let e = ExperimentRecipe::from_toml_file(&path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("p.toml") && e.contains("[seeds]") && e.contains("tiny = 0"),
            "{e}"
        );
        // Earlier looks: read back in order with the count; out of order or not below the
        // count is an error naming the scale.
        write("[seeds]\nquick = 8\n[seeds.looks]\nquick = [3, 5]");
        let r = ExperimentRecipe::from_toml_file(&path).unwrap();
        assert_eq!(r.seeds.looks(Scale::Quick), [3, 5, 8]);
        assert_eq!(r.seeds.looks(Scale::Tiny), [2]);
        for bad in ["[5, 3]", "[3, 8]", "[0, 3]"] {
            write(&format!("[seeds]\nquick = 8\n[seeds.looks]\nquick = {bad}"));
            let e = ExperimentRecipe::from_toml_file(&path)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("p.toml") && e.contains("seeds.looks") && e.contains("quick = 8"),
                "{e}"
            );
        }
    }
}

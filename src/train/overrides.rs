//! `--set key=value` overrides of a TOML recipe (`rankwise train --set epochs=3 --set
//! loss.tau=0.05`): dotted keys into the recipe's tables, values parsed as TOML values.
//!
//! Overrides apply to the resolved recipe (the file with every default written out). Setting
//! the `kind` of a tagged table (`--set loss.kind=fast_ap`) starts that table afresh with the new
//! kind's defaults. A value that is not a TOML value but a bare word (`--set loss.kind=fast_ap`,
//! `--set device=cpu`) is taken as a string, so the shell does not need TOML's quotes. An empty
//! value (`--set pretrained=`) removes the key, so that the field takes its default: TOML has no
//! null, and this is how an optional field is unset (`pretrained`: no weights, the backbone
//! starts from random initialisation). An override whose key is unknown, whose value has the
//! wrong type, or that makes the recipe invalid is an error naming that exact override
//! (`--set optimizer.lr=1e-4: unknown field `lr`, expected one of `backbone`, `head`, `loss``).

use super::config::TrainConfig;
use crate::error::{Error, Result};
use std::path::Path;
use toml::{Table, Value};

/// One parsed `key=value` override.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The text as given (`optimizer.backbone.lr=1e-4`), for error messages.
    pub text: String,
    /// The dotted key, split (`["optimizer", "backbone", "lr"]`).
    pub path: Vec<String>,
    /// The value; `None` (an empty value, `pretrained=`) removes the key, so that the field
    /// takes its default.
    pub value: Option<Value>,
}

impl Override {
    /// Parses `key=value` (or `key=`, which removes the key). Errors name the override.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid(format!("--set {text}"), why.to_string());
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| bad("expected key=value (e.g. epochs=3 or loss.tau=0.05)"))?;
        let key = key.trim();
        let path: Vec<String> = key.split('.').map(|p| p.trim().to_string()).collect();
        if key.is_empty() || path.iter().any(String::is_empty) {
            return Err(bad("empty key or key part"));
        }
        let value = match value.trim() {
            "" => None,
            text => Some(parse_value(text).map_err(|e| bad(&e))?),
        };
        Ok(Override {
            text: text.to_string(),
            path,
            value,
        })
    }

    /// Sets the value in `table`, creating missing intermediate tables. Errors (naming the
    /// override) when an intermediate key holds a non-table value.
    pub fn apply(&self, table: &mut Table) -> Result<()> {
        let mut current = table;
        let (last, parents) = self
            .path
            .split_last()
            .expect("parse checks a non-empty key");
        for (depth, part) in parents.iter().enumerate() {
            let entry = current
                .entry(part.clone())
                .or_insert_with(|| Value::Table(Table::new()));
            current = match entry {
                Value::Table(t) => t,
                other => {
                    return Err(Error::invalid(
                        format!("--set {}", self.text),
                        format!(
                            "`{}` is a {}, not a table",
                            self.path[..=depth].join("."),
                            other.type_str()
                        ),
                    ))
                }
            };
        }
        let Some(value) = &self.value else {
            // Removing a key the recipe does not have is not an error: the field already takes
            // its default.
            current.remove(last);
            return Ok(());
        };
        // A new `kind` of a tagged table (`loss.kind`, `sampler.kind`, `model.backbone.kind`,
        // …) starts that table afresh: the old kind's fields would be unknown to the new one,
        // which takes its defaults (set its fields with later overrides).
        if last == "kind" && current.get("kind") != Some(value) {
            current.clear();
        }
        current.insert(last.clone(), value.clone());
        Ok(())
    }
}

/// A TOML value, or a bare word taken as a string.
fn parse_value(text: &str) -> std::result::Result<Value, String> {
    let doc = format!("v = {text}");
    match doc.parse::<Table>() {
        Ok(mut t) => Ok(t.remove("v").expect("the key just written")),
        Err(e) => {
            let bare = text
                .chars()
                .all(|c| c.is_alphanumeric() || "_-./:".contains(c));
            let starts_like_number = text
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '+' || c == '.');
            if bare && !starts_like_number {
                Ok(Value::String(text.to_string()))
            } else {
                Err(format!(
                    "`{text}` is not a TOML value ({})",
                    e.message().trim()
                ))
            }
        }
    }
}

/// The configuration of `table` (a recipe, possibly overridden), validated.
fn config_of(table: &Table) -> Result<TrainConfig> {
    let config: TrainConfig = table.clone().try_into().map_err(|e: toml::de::Error| {
        let message = e.message().trim().to_string();
        Error::invalid("config", super::config::with_moved_key_hint(message))
    })?;
    config.validate()?;
    Ok(config)
}

/// Reads the TOML recipe at `path`, applies `overrides` in order and returns the validated
/// configuration. Errors name the file (a bad recipe) or the first override that makes the
/// recipe unreadable or invalid.
pub fn load_with_overrides(path: &Path, overrides: &[String]) -> Result<TrainConfig> {
    // The recipe alone first, so that its own errors name the file, line and key.
    let base = TrainConfig::from_toml_file(path)?;
    if overrides.is_empty() {
        return Ok(base);
    }
    // Overrides apply to the resolved recipe (every default written out), so that a key of a
    // table the recipe leaves out (`optimizer.head.lr`) lands beside that table's defaults.
    let table = Table::try_from(&base)
        .map_err(|e| Error::file(path, format!("cannot re-serialise the recipe: {e}")))?;
    apply_overrides(table, overrides)
}

/// Applies `overrides` to a recipe's `table` and returns the validated configuration; the error
/// names the first override after which the recipe no longer reads or validates.
pub fn apply_overrides(mut table: Table, overrides: &[String]) -> Result<TrainConfig> {
    let parsed = overrides
        .iter()
        .map(|o| Override::parse(o))
        .collect::<Result<Vec<_>>>()?;
    let mut states = Vec::with_capacity(parsed.len());
    for o in &parsed {
        o.apply(&mut table)?;
        states.push(table.clone());
    }
    match config_of(&table) {
        Ok(config) => Ok(config),
        Err(final_error) => {
            // Blame the first override after which the recipe fails (an intermediate state may
            // fail where the final one would not, e.g. while switching the loss kind, so the
            // search only looks at states that fail like the final one or earlier).
            for (o, state) in parsed.iter().zip(&states) {
                if let Err(e) = config_of(state) {
                    return Err(Error::invalid(format!("--set {}", o.text), e.to_string()));
                }
            }
            Err(Error::invalid(
                format!(
                    "--set {}",
                    parsed.last().map(|o| o.text.as_str()).unwrap_or("")
                ),
                final_error.to_string(),
            ))
        }
    }
}

/// `error` with the `--set` overrides (of `overrides`) that set the field it names, so that an
/// error found after the recipe was resolved — while loading the data, building the sampler, the
/// optimizer or the device — still names the override a user typed (`--set
/// sampler.batch_size=63: invalid batch_size: …`). An [`Error::Invalid`] names its field by the
/// key's last part (`batch_size`) or by a dotted path (`optimizer.backbone.lr`); an override
/// matches when its key is that field or ends with it. When none does, an override whose last
/// key part the message names as a word is blamed instead (`… lower m or batch_size` blames
/// `--set sampler.batch_size=400`: a batch too large for the data is reported on
/// `samples_per_class`). Other errors, and errors that already name an override, are returned
/// unchanged.
pub fn blame(error: Error, overrides: &[String]) -> Error {
    let Error::Invalid { field, msg } = &error else {
        return error;
    };
    if field.starts_with("--set ") {
        return error;
    }
    let parsed: Vec<Override> = overrides
        .iter()
        .filter_map(|o| Override::parse(o).ok())
        .collect();
    let sets_field = |o: &&Override| {
        let key = o.path.join(".");
        key == *field || key.ends_with(&format!(".{field}"))
    };
    let named_in_message = |o: &&Override| {
        let last = o.path.last().expect("parse checks a non-empty key");
        msg.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == last)
    };
    let mut culprits: Vec<&Override> = parsed.iter().filter(sets_field).collect();
    if culprits.is_empty() {
        culprits = parsed.iter().filter(named_in_message).collect();
    }
    let culprits: Vec<String> = culprits
        .into_iter()
        .map(|o| format!("--set {}", o.text))
        .collect();
    if culprits.is_empty() {
        return error;
    }
    Error::invalid(culprits.join(", "), error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blame_names_the_override_that_set_the_field() {
        let set = [
            "epochs=2".to_string(),
            "sampler.batch_size=63".to_string(),
            "optimizer.backbone.lr=-1".to_string(),
        ];
        let e = blame(
            Error::invalid("batch_size", "must be a multiple of 4"),
            &set,
        )
        .to_string();
        assert_eq!(
            e,
            "invalid --set sampler.batch_size=63: invalid batch_size: must be a multiple of 4"
        );
        let e = blame(Error::invalid("optimizer.backbone.lr", "< 0"), &set).to_string();
        assert!(
            e.starts_with("invalid --set optimizer.backbone.lr=-1: "),
            "{e}"
        );
        // A field no override set, another kind of error, an override already named: unchanged.
        for error in [
            Error::invalid("samples_per_class", "x"),
            Error::file("a.csv", "batch_size"),
            Error::invalid("--set epochs=2", "x"),
        ] {
            let text = error.to_string();
            assert_eq!(blame(error, &set).to_string(), text);
        }
        // No override sets the field, but the message names one as the way out.
        let e = blame(
            Error::invalid(
                "samples_per_class",
                "needs 200 classes; lower m or batch_size",
            ),
            &set,
        )
        .to_string();
        assert!(
            e.starts_with("invalid --set sampler.batch_size=63: "),
            "{e}"
        );
        // A suffix must be a whole key part: `size` is not `batch_size`.
        let e = blame(Error::invalid("size", "x"), &set).to_string();
        assert_eq!(e, "invalid size: x");
    }

    #[test]
    fn values_and_bare_words() {
        assert_eq!(parse_value("3").unwrap(), Value::Integer(3));
        assert_eq!(parse_value("1e-4").unwrap(), Value::Float(1e-4));
        assert_eq!(parse_value("true").unwrap(), Value::Boolean(true));
        assert_eq!(
            parse_value("fastap").unwrap(),
            Value::String("fastap".into())
        );
        assert_eq!(parse_value("\"a b\"").unwrap(), Value::String("a b".into()));
        assert!(parse_value("[1, 2").is_err());
        assert!(parse_value("1e-").is_err());
        assert_eq!(Override::parse("pretrained=").unwrap().value, None);
        assert_eq!(Override::parse("pretrained = ").unwrap().value, None);
        assert!(Override::parse("epochs").is_err());
        assert!(Override::parse("a..b=1").is_err());
    }

    #[test]
    fn overrides_set_nested_keys_and_name_the_culprit() {
        let table = Table::try_from(TrainConfig::default()).unwrap();
        let c = apply_overrides(
            table.clone(),
            &[
                "epochs=2".into(),
                "loss.tau=0.05".into(),
                "optimizer.backbone.lr=1e-4".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.epochs, 2);
        assert_eq!(c.optimizer.backbone.lr, 1e-4);
        let toml = c.to_toml_string().unwrap();
        assert!(toml.contains("tau = 0.05"), "{toml}");

        let e = apply_overrides(
            table.clone(),
            &["epochs=2".into(), "optimizer.lr=1e-4".into()],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--set optimizer.lr=1e-4") && e.contains("lr"),
            "{e}"
        );
        let e = apply_overrides(table.clone(), &["epochs=abc".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--set epochs=abc"), "{e}");
        let e = apply_overrides(table.clone(), &["epochs=0".into(), "seed=1".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--set epochs=0") && e.contains("≥ 1"), "{e}");
        let e = apply_overrides(table, &["epochs.x=1".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--set epochs.x=1") && e.contains("not a table"),
            "{e}"
        );
        // A new loss kind drops the old kind's fields and takes its own defaults.
        let c = apply_overrides(
            Table::try_from(TrainConfig::default()).unwrap(),
            &["loss.kind=fast_ap".into()],
        )
        .unwrap();
        assert!(c.loss.validate().is_ok());
        assert!(c.to_toml_string().unwrap().contains("kind = \"fast_ap\""));
    }

    #[test]
    fn an_empty_value_removes_the_key_so_the_field_takes_its_default() {
        let base = TrainConfig {
            pretrained: Some("weights/resnet50.safetensors".into()),
            epochs: 7,
            ..TrainConfig::default()
        };
        let table = Table::try_from(&base).unwrap();
        let c = apply_overrides(table.clone(), &["pretrained=".into()]).unwrap();
        assert_eq!(c.pretrained, None);
        assert_eq!(c.epochs, 7);
        // A key the recipe leaves out is already at its default.
        let c = apply_overrides(table.clone(), &["pretrained=".into(), "pretrained=".into()]);
        assert_eq!(c.unwrap().pretrained, None);
        let c = apply_overrides(table.clone(), &["epochs=".into()]).unwrap();
        assert_eq!(c.epochs, TrainConfig::default().epochs);
        // A field without a default cannot be removed: the error names the override.
        let mut sop = base;
        sop.input_norm = crate::train::InputNorm::Imagenet;
        sop.dataset = crate::train::DatasetConfig::Sop(crate::data::loaders::sop::Sop {
            root: "/data/sop".into(),
            images: Default::default(),
        });
        let e = apply_overrides(Table::try_from(&sop).unwrap(), &["dataset.root=".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--set dataset.root=") && e.contains("root"),
            "{e}"
        );
    }
}

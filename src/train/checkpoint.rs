//! Checkpoint files: named tensors in safetensors format plus a JSON document in the file's
//! metadata (key [`METADATA_KEY`]), written atomically (a temporary file in the same folder, then
//! a rename) so that a crash never leaves a truncated checkpoint behind.

use crate::error::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Metadata key of the JSON document.
pub const METADATA_KEY: &str = "rankwise";

/// Writes `bytes` to `path` atomically: to `path.tmp.<pid>` first, flushed to disk, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        // Best effort: do not leave the partial temporary file behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    Ok(())
}

/// Saves `tensors` and the JSON document `json` to `path` atomically.
pub fn save(path: &Path, tensors: &[(String, Tensor)], json: &str) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    if let Some((dup, _)) = tensors.iter().find(|(n, _)| !seen.insert(n.as_str())) {
        return Err(Error::invalid(
            "checkpoint",
            format!("tensor `{dup}` appears twice"),
        ));
    }
    let metadata = HashMap::from([(METADATA_KEY.to_string(), json.to_string())]);
    let cpu = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(cpu, Some(metadata))
        .map_err(|e| Error::file(path, format!("cannot serialise the checkpoint: {e}")))?;
    write_atomic(path, &bytes)
}

/// Loads the tensors (onto `device`) and the JSON document of a checkpoint written by [`save`].
/// Errors name the file: unreadable, not safetensors, or without the document.
pub fn load(path: &Path, device: &Device) -> Result<(BTreeMap<String, Tensor>, String)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| Error::file(path, format!("not a valid safetensors file: {e}")))?;
    let json = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get(METADATA_KEY))
        .cloned()
        .ok_or_else(|| {
            Error::file(
                path,
                format!("no `{METADATA_KEY}` metadata: not a rankwise checkpoint"),
            )
        })?;
    let tensors = candle_core::safetensors::load_buffer(&bytes, device)
        .map_err(|e| Error::file(path, format!("cannot read the tensors: {e}")))?;
    Ok((tensors.into_iter().collect(), json))
}

/// Serde for `f64` values that must survive a checkpoint bit for bit: written as the string of
/// Rust's shortest round-trip formatting and read back with Rust's correctly rounded parser.
/// serde_json's own float parser (without its `float_roundtrip` feature) can be off by one ulp,
/// and JSON has no NaN, which an evaluation with no countable query produces.
pub(crate) mod exact_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serialises `v` as a string.
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    /// Parses the string written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        let text = String::deserialize(d)?;
        text.parse::<f64>().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_f64_round_trips_every_bit() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct V(#[serde(with = "exact_f64")] f64);
        for v in [
            0.37166003134781045,
            f64::NAN,
            -0.0,
            1e-300,
            f64::INFINITY,
            0.1 + 0.2,
        ] {
            let json = serde_json::to_string(&V(v)).unwrap();
            let back: V = serde_json::from_str(&json).unwrap();
            assert_eq!(back.0.to_bits(), v.to_bits(), "{json}");
        }
    }

    #[test]
    fn round_trip_and_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ck.safetensors");
        let t = Tensor::new(&[1f32, 2., 3.], &Device::Cpu).unwrap();
        save(&path, &[("a".into(), t.clone())], "{\"x\": 1}").unwrap();
        let (tensors, json) = load(&path, &Device::Cpu).unwrap();
        assert_eq!(json, "{\"x\": 1}");
        assert_eq!(tensors["a"].to_vec1::<f32>().unwrap(), vec![1., 2., 3.]);
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let e = save(&path, &[("a".into(), t.clone()), ("a".into(), t)], "{}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`a` appears twice"), "{e}");
        let missing = dir.path().join("nope.safetensors");
        let e = load(&missing, &Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("nope.safetensors"), "{e}");
        std::fs::write(&missing, b"garbage").unwrap();
        let e = load(&missing, &Device::Cpu).unwrap_err().to_string();
        assert!(
            e.contains("nope.safetensors") && e.contains("not a valid"),
            "{e}"
        );
    }
}

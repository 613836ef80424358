//! Checkpoint files: named tensors in safetensors format plus a JSON document in the file's
//! metadata (key [`METADATA_KEY`]), written atomically ([`crate::io::write_atomically`]: a
//! temporary file in the same folder, then a rename) so that a crash never leaves a truncated
//! checkpoint behind.
//!
//! Every tensor's bytes carry a CRC-32 in the metadata (key [`CHECKSUM_KEY`]), verified on load:
//! a flipped bit on disk is an error naming the file and the tensor, not a run that trains on
//! garbage until the loss turns NaN. Files written before checksums existed (no such key) still
//! load.

use crate::error::{Error, Result};
use crate::io::write_atomically;
use candle_core::{Device, Tensor};
use safetensors::View;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Metadata key of the JSON document.
pub const METADATA_KEY: &str = "rankwise";

/// Metadata key of the checksums: a JSON object, tensor name → CRC-32 of its bytes (8 hex
/// digits).
pub const CHECKSUM_KEY: &str = "rankwise.crc32";

/// Writes `bytes` to `path` atomically (see [`write_atomically`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomically(path, |w| w.write_all(bytes))
}

/// The CRC-32 of `bytes`, as 8 hex digits.
fn crc32(bytes: &[u8]) -> String {
    format!("{:08x}", crc32fast::hash(bytes))
}

/// Saves `tensors` and the JSON document `json` to `path` atomically, with the checksum of every
/// tensor.
pub fn save(path: &Path, tensors: &[(String, Tensor)], json: &str) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    if let Some((dup, _)) = tensors.iter().find(|(n, _)| !seen.insert(n.as_str())) {
        return Err(Error::invalid(
            "checkpoint",
            format!("tensor `{dup}` appears twice"),
        ));
    }
    let cpu = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_device(&Device::Cpu)?.contiguous()?)))
        .collect::<Result<Vec<_>>>()?;
    // The bytes safetensors will write for each tensor (its `View`), checksummed before writing.
    let sums: BTreeMap<&str, String> = cpu
        .iter()
        .map(|(n, t)| (n.as_str(), crc32(&t.data())))
        .collect();
    let sums = serde_json::to_string(&sums)
        .map_err(|e| Error::file(path, format!("cannot encode the checksums: {e}")))?;
    let metadata = HashMap::from([
        (METADATA_KEY.to_string(), json.to_string()),
        (CHECKSUM_KEY.to_string(), sums),
    ]);
    let bytes = safetensors::serialize(cpu, Some(metadata))
        .map_err(|e| Error::file(path, format!("cannot serialise the checkpoint: {e}")))?;
    write_atomic(path, &bytes)
}

/// Loads the tensors (onto `device`) and the JSON document of a checkpoint written by [`save`],
/// after checking every tensor against its checksum. Errors name the file: unreadable, not
/// safetensors, without the document, or a tensor whose bytes differ from those written.
pub fn load(path: &Path, device: &Device) -> Result<(BTreeMap<String, Tensor>, String)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| Error::file(path, format!("not a valid safetensors file: {e}")))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes)
        .map_err(|e| Error::file(path, format!("not a valid safetensors file: {e}")))?;
    let metadata = meta.metadata().clone().unwrap_or_default();
    let json = metadata.get(METADATA_KEY).cloned().ok_or_else(|| {
        Error::file(
            path,
            format!("no `{METADATA_KEY}` metadata: not a rankwise checkpoint"),
        )
    })?;
    if let Some(sums) = metadata.get(CHECKSUM_KEY) {
        verify(path, &file, sums)?;
    }
    let tensors = candle_core::safetensors::load_buffer(&bytes, device)
        .map_err(|e| Error::file(path, format!("cannot read the tensors: {e}")))?;
    Ok((tensors.into_iter().collect(), json))
}

/// Checks every tensor of `file` against the checksums `sums` (the [`CHECKSUM_KEY`] document):
/// the same names, and the same CRC-32 of the bytes.
fn verify(path: &Path, file: &safetensors::SafeTensors<'_>, sums: &str) -> Result<()> {
    let sums: BTreeMap<String, String> = serde_json::from_str(sums)
        .map_err(|e| Error::file(path, format!("unreadable `{CHECKSUM_KEY}` metadata: {e}")))?;
    let names: std::collections::BTreeSet<String> =
        file.names().into_iter().map(String::from).collect();
    if let Some(missing) = sums.keys().find(|n| !names.contains(*n)) {
        return Err(Error::file(
            path,
            format!("tensor `{missing}` was written but is not in the file: the file is damaged"),
        ));
    }
    for name in &names {
        let expected = sums.get(name).ok_or_else(|| {
            Error::file(
                path,
                format!("tensor `{name}` has no checksum: the file was altered after writing"),
            )
        })?;
        let view = file
            .tensor(name)
            .map_err(|e| Error::file(path, format!("cannot read tensor `{name}`: {e}")))?;
        let actual = crc32(view.data());
        if &actual != expected {
            return Err(Error::file(
                path,
                format!(
                    "tensor `{name}` is damaged (CRC-32 {actual}, written as {expected}): the \
                     file changed on disk since it was saved; resume from another checkpoint or \
                     train anew"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = save(
            &path,
            &[("a".into(), t.clone()), ("a".into(), t.clone())],
            "{}",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`a` appears twice"), "{e}");
        // A flipped bit in a tensor's bytes is caught, naming the tensor; the checksums cover
        // every tensor, so one without a checksum is an error too.
        let b = Tensor::new(&[0.5f32; 16], &Device::Cpu).unwrap();
        save(&path, &[("a".into(), t.clone()), ("b".into(), b)], "{}").unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let e = load(&path, &Device::Cpu).unwrap_err().to_string();
        assert!(
            e.contains("ck.safetensors") && e.contains("tensor `b` is damaged"),
            "{e}"
        );
        let sums = "{\"a\": \"00000000\"}".to_string();
        let unlisted = safetensors::serialize(
            [("b".to_string(), t.clone())],
            Some(HashMap::from([
                (METADATA_KEY.to_string(), "{}".to_string()),
                (CHECKSUM_KEY.to_string(), sums),
            ])),
        )
        .unwrap();
        std::fs::write(&path, unlisted).unwrap();
        let e = load(&path, &Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("`a` was written but is not in the file"), "{e}");
        // A checkpoint of an earlier version (no checksums) still loads.
        let legacy = safetensors::serialize(
            [("a".to_string(), t.clone())],
            Some(HashMap::from([(
                METADATA_KEY.to_string(),
                "{}".to_string(),
            )])),
        )
        .unwrap();
        std::fs::write(&path, legacy).unwrap();
        assert_eq!(load(&path, &Device::Cpu).unwrap().0.len(), 1);
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

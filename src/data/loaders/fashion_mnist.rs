//! Fashion-MNIST (Xiao et al., 2017) in its IDX format: 60,000 training and 10,000 test grey
//! images of 28 × 28 pixels in 10 classes. Unlike the other loaders this one decodes the images:
//! the files hold them.
//!
//! Layout under the root (the upstream `data/fashion/`, or Debian's package
//! `dataset-fashion-mnist`, installed at [`DEBIAN_ROOT`]):
//! ```text
//! train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
//! t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
//! ```
//! Gzipped or not (a file without `.gz` is taken when present). The IDX format (LeCun et al.'s
//! MNIST page): a big-endian magic `0x0000 TT DD` (`TT` = element type, `0x08` = unsigned byte;
//! `DD` = number of dimensions), `DD` big-endian `u32` sizes, then the elements in row-major
//! order.
//!
//! Images become an [`ImageSet`] of `1 × 28 × 28` values `v / 255` in `[0, 1]` (torchvision's
//! `ToTensor`), with flat labels 0–9.

use super::read_bytes;
use crate::data::ImageSet;
use crate::error::{Error, Result};
use crate::hierarchy::Labels;
use flate2::read::MultiGzDecoder;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where Debian's `dataset-fashion-mnist` package installs the four files.
pub const DEBIAN_ROOT: &str = "/usr/share/datasets/fashion-mnist";

/// The class names, by label.
pub const CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// An IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Sizes of the dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Elements in row-major order.
    pub data: Vec<u8>,
}

/// Training and test sets.
#[derive(Debug, Clone, PartialEq)]
pub struct FashionMnist {
    /// 60,000 training images.
    pub train: ImageSet,
    /// 10,000 test images.
    pub test: ImageSet,
}

/// Loads both sets from `root`.
pub fn load(root: impl AsRef<Path>) -> Result<FashionMnist> {
    let root = root.as_ref();
    super::require_dir(root)?;
    Ok(FashionMnist {
        train: load_pair(root, "train")?,
        test: load_pair(root, "t10k")?,
    })
}

/// Loads `<prefix>-images-idx3-ubyte[.gz]` and `<prefix>-labels-idx1-ubyte[.gz]` from `root`.
pub fn load_pair(root: impl AsRef<Path>, prefix: &str) -> Result<ImageSet> {
    let root = root.as_ref();
    let images_path = find(root, &format!("{prefix}-images-idx3-ubyte"))?;
    let labels_path = find(root, &format!("{prefix}-labels-idx1-ubyte"))?;
    let images = read_idx(&images_path)?;
    let labels = read_idx(&labels_path)?;
    if images.dims.len() != 3 {
        return Err(Error::file(
            &images_path,
            format!("images must have 3 dimensions, found {:?}", images.dims),
        ));
    }
    if labels.dims.len() != 1 {
        return Err(Error::file(
            &labels_path,
            format!("labels must have 1 dimension, found {:?}", labels.dims),
        ));
    }
    if images.dims[0] != labels.dims[0] {
        return Err(Error::file(
            &labels_path,
            format!(
                "{} labels for {} images in {}",
                labels.dims[0],
                images.dims[0],
                images_path.display()
            ),
        ));
    }
    if let Some(k) = labels
        .data
        .iter()
        .position(|&l| l as usize >= CLASSES.len())
    {
        return Err(Error::file(
            &labels_path,
            format!("label {} of item {k} is not a class (0–9)", labels.data[k]),
        ));
    }
    let fine: Vec<i64> = labels.data.iter().map(|&l| l as i64).collect();
    let labels = Labels::from_fine(&fine).map_err(|e| Error::file(&labels_path, e.to_string()))?;
    // torchvision's ToTensor: u8 / 255 in f32.
    let pixels = images.data.iter().map(|&v| v as f32 / 255.0).collect();
    ImageSet::new(pixels, labels, 1, images.dims[1], images.dims[2])
}

/// Reads an IDX file of unsigned bytes, gzipped or not.
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray> {
    let path = path.as_ref();
    let raw = read_bytes(path)?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        MultiGzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| Error::file(path, format!("corrupt gzip data: {e}")))?;
        out
    } else {
        raw
    };
    parse_idx(&bytes).map_err(|msg| Error::file(path, format!("IDX: {msg}")))
}

/// Parses the bytes of an IDX file (see [`read_idx`]).
pub fn parse_idx(b: &[u8]) -> std::result::Result<IdxArray, String> {
    if b.len() < 4 {
        return Err(format!("{} bytes, shorter than the 4-byte magic", b.len()));
    }
    if b[0] != 0 || b[1] != 0 {
        return Err(format!(
            "bad magic {:02x}{:02x}{:02x}{:02x} (must start with two zero bytes)",
            b[0], b[1], b[2], b[3]
        ));
    }
    if b[2] != 0x08 {
        return Err(format!(
            "element type 0x{:02x}; only unsigned bytes (0x08) are supported",
            b[2]
        ));
    }
    let nd = b[3] as usize;
    let header = 4 + 4 * nd;
    if b.len() < header {
        return Err(format!("truncated header ({nd} dimensions)"));
    }
    let dims: Vec<usize> = (0..nd)
        .map(|k| {
            let s: [u8; 4] = b[4 + 4 * k..8 + 4 * k].try_into().expect("4 bytes");
            u32::from_be_bytes(s) as usize
        })
        .collect();
    let count = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or("dimensions overflow")?;
    let data = &b[header..];
    if data.len() != count {
        return Err(format!(
            "dimensions {dims:?} need {count} bytes of data, the file has {}",
            data.len()
        ));
    }
    Ok(IdxArray {
        dims,
        data: data.to_vec(),
    })
}

/// `root/name` if it exists, else `root/name.gz`.
fn find(root: &Path, name: &str) -> Result<PathBuf> {
    let plain = root.join(name);
    if plain.is_file() {
        return Ok(plain);
    }
    let gz = root.join(format!("{name}.gz"));
    if gz.is_file() {
        Ok(gz)
    } else {
        Err(Error::file(
            &gz,
            format!("missing (neither {name} nor {name}.gz is in the folder)"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_idx_and_rejects_bad_sizes() {
        let mut b = vec![0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3];
        b.extend_from_slice(&[1, 2, 3, 4, 5, 6]);
        let a = parse_idx(&b).unwrap();
        assert_eq!(a.dims, vec![2, 3]);
        assert_eq!(a.data, vec![1, 2, 3, 4, 5, 6]);
        b.pop();
        assert!(parse_idx(&b).unwrap_err().contains("need 6 bytes"));
        assert!(parse_idx(&[0, 0, 0x0d, 1, 0, 0, 0, 0])
            .unwrap_err()
            .contains("element type"));
        assert!(parse_idx(&[1, 2]).is_err());
    }
}

//! Embedding matrices from `.npy` (float32/float64, C or Fortran order, either byte order) and
//! `.safetensors` (float16/bfloat16/float32/float64) files, returned as `N × D` f32 candle tensors
//! on the CPU, and `.npy` output.
//!
//! The `.npy` reader is ours rather than candle's `Tensor::read_npy`: it reads the header before
//! the data, so a 1-D or 3-D array, an integer dtype or a truncated file is rejected with a message
//! naming the file before any large allocation; it reads Fortran-order and big-endian arrays (which
//! candle rejects or misreads); and it reports the row and column of the first NaN or infinity.
//! The format is the one of `numpy.lib.format` (versions 1.0, 2.0 and 3.0).
//!
//! float64 inputs are rounded to the nearest float32: the ranking engine scores in f32, as the
//! authors' faiss-based evaluations do. A finite float64 too large for float32 is an error, not an
//! infinity.

use crate::error::{Error, Result};
use crate::io::atomic::write_atomically;
use crate::io::split_top_level;
use candle_core::{DType, Device, Tensor};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

/// The `.npy` magic string.
const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// numpy pads headers so that the data starts on a multiple of this many bytes.
const NPY_ALIGN: usize = 64;

/// Bytes converted per read when streaming the data section (a multiple of 8).
const READ_BLOCK: usize = 1 << 20;

/// Reads an embedding matrix, choosing the format from the extension: `.npy` or `.safetensors`.
///
/// `tensor_name` picks a tensor inside a `.safetensors` file (see [`read_safetensors`]); it is an
/// error for `.npy` files, which hold a single unnamed array.
pub fn read_embeddings(path: &Path, tensor_name: Option<&str>) -> Result<Tensor> {
    match extension(path).as_deref() {
        Some("npy") => {
            if let Some(name) = tensor_name {
                return Err(Error::invalid(
                    "tensor",
                    format!(
                        "{}: a .npy file holds a single unnamed array; the tensor name \
                         '{name}' only applies to .safetensors files",
                        path.display()
                    ),
                ));
            }
            read_npy(path)
        }
        Some("safetensors") => read_safetensors(path, tensor_name),
        _ => Err(Error::file(
            path,
            "unknown embedding format: expected a .npy or .safetensors file",
        )),
    }
}

/// Lower-cased extension of `path`, if any.
pub(crate) fn extension(path: &Path) -> Option<String> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
}

/// Reads a 2-D float32 or float64 `.npy` array (C or Fortran order, little- or big-endian) as an
/// `N × D` f32 tensor on the CPU.
///
/// Errors name the file for: an unreadable file, a bad magic string or header, an array that is
/// not 2-D or has no rows or columns, a dtype other than float32/float64, a data section whose size
/// does not match the header, and a NaN, infinity or float32 overflow (naming its row and column,
/// 0-based as numpy indexes them).
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut reader = BufReader::new(file);
    let (header, header_len) = read_npy_header(&mut reader, path)?;
    let (n, d) = matrix_shape(&header.shape, path)?;
    let count = n
        .checked_mul(d)
        .ok_or_else(|| Error::file(path, format!("shape ({n}, {d}) is too large")))?;
    let expected = count as u128 * header.dtype.size() as u128;
    let actual = file_len as u128 - header_len as u128;
    if actual != expected {
        return Err(Error::file(
            path,
            format!(
                "the header announces a ({n}, {d}) {} array ({expected} bytes of data) but the \
                 file holds {actual} bytes after the header; the file is truncated or corrupt",
                header.dtype.name()
            ),
        ));
    }
    let (values, bad) = read_values(&mut reader, &header, count, path)?;
    if let Some((flat, problem)) = bad {
        let (row, col) = if header.fortran_order {
            (flat % n, flat / n)
        } else {
            (flat / d, flat % d)
        };
        return Err(non_finite_error(path, row, col, problem));
    }
    let values = if header.fortran_order {
        fortran_to_c(&values, n, d)
    } else {
        values
    };
    Ok(Tensor::from_vec(values, (n, d), &Device::Cpu)?)
}

/// Reads one 2-D floating-point tensor of a `.safetensors` file as an `N × D` f32 tensor on the
/// CPU.
///
/// With `name`, that tensor is read. Without, the file's only tensor is read, or the one named
/// `embeddings` when there are several. float16 and bfloat16 convert to f32 exactly; float64 is
/// rounded. Errors name the file for: an unreadable or invalid file, a missing tensor (listing the
/// names present), an array that is not 2-D, a non-float dtype, and a NaN, infinity or float32
/// overflow (naming its row and column).
pub fn read_safetensors(path: &Path, name: Option<&str>) -> Result<Tensor> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
        .map_err(|e| Error::file(path, format!("not a readable safetensors file: {e}")))?;
    drop(bytes);
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let listed = names
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let key = match name {
        Some(name) => name.to_string(),
        None if tensors.len() == 1 => names[0].clone(),
        None if tensors.contains_key("embeddings") => "embeddings".to_string(),
        None => {
            return Err(Error::file(
                path,
                format!(
                    "holds {} tensors ({listed}) and none is named 'embeddings'; choose one by \
                     name (`--tensor` on the command line)",
                    tensors.len()
                ),
            ))
        }
    };
    let tensor = tensors.get(&key).ok_or_else(|| {
        Error::file(
            path,
            format!("has no tensor named '{key}'; it holds: {listed}"),
        )
    })?;
    let (n, d) = matrix_shape(tensor.dims(), path)?;
    let flat = tensor.flatten_all()?;
    let (values, bad) = match tensor.dtype() {
        DType::F32 => {
            let v = flat.to_vec1::<f32>()?;
            let bad = first_non_finite_f32(&v);
            (v, bad)
        }
        DType::F16 | DType::BF16 => {
            let v = flat.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            let bad = first_non_finite_f32(&v);
            (v, bad)
        }
        DType::F64 => f64_to_f32_checked(&flat.to_vec1::<f64>()?),
        other => {
            return Err(Error::file(
                path,
                format!(
                    "tensor '{key}' has dtype {other:?}; embeddings must be a floating-point \
                     tensor (float32, float64, float16 or bfloat16)"
                ),
            ))
        }
    };
    if let Some((i, problem)) = bad {
        return Err(non_finite_error(path, i / d, i % d, problem));
    }
    Ok(Tensor::from_vec(values, (n, d), &Device::Cpu)?)
}

/// Writes a float32 or float64 tensor as a C-order little-endian `.npy` file (format 1.0, header
/// padded to 64 bytes as numpy does), atomically (see [`write_atomically`]).
pub fn write_npy(path: &Path, tensor: &Tensor) -> Result<()> {
    let flat = tensor.flatten_all()?;
    let (descr, data): (&str, Vec<u8>) = match tensor.dtype() {
        DType::F32 => (
            "<f4",
            flat.to_vec1::<f32>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        DType::F64 => (
            "<f8",
            flat.to_vec1::<f64>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        other => {
            return Err(Error::invalid(
                "tensor",
                format!("only float32 and float64 tensors are written as .npy, got {other:?}"),
            ))
        }
    };
    let header = npy_header(descr, tensor.dims());
    write_atomically(path, |w| {
        w.write_all(&header)?;
        w.write_all(&data)
    })
}

/// A shape as numpy prints it: `(3,)`, `(3, 2)`, `()`.
fn python_shape(shape: &[usize]) -> String {
    match shape {
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The bytes of a version-1.0 `.npy` header for a C-order array: magic, version, length and the
/// Python dict literal, space-padded and newline-terminated so that the data is 64-byte aligned.
fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let shape = python_shape(shape);
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // magic (6) + version (2) + length (2) + dict + '\n' must be a multiple of NPY_ALIGN.
    let unpadded = NPY_MAGIC.len() + 4 + dict.len() + 1;
    dict.push_str(&" ".repeat((NPY_ALIGN - unpadded % NPY_ALIGN) % NPY_ALIGN));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(NPY_MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Floating-point element types accepted in `.npy` files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NpyFloat {
    F32,
    F64,
}

impl NpyFloat {
    fn size(self) -> usize {
        match self {
            NpyFloat::F32 => 4,
            NpyFloat::F64 => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            NpyFloat::F32 => "float32",
            NpyFloat::F64 => "float64",
        }
    }
}

/// The parts of an `.npy` header the reader needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NpyHeader {
    dtype: NpyFloat,
    big_endian: bool,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Reads and parses the header; returns it and the byte offset where the data starts.
fn read_npy_header<R: Read>(reader: &mut R, path: &Path) -> Result<(NpyHeader, u64)> {
    let short = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::file(path, "not a .npy file: it ends inside the header")
        } else {
            Error::io(path, e)
        }
    };
    let mut prefix = [0u8; 8];
    reader.read_exact(&mut prefix).map_err(short)?;
    if &prefix[..6] != NPY_MAGIC {
        return Err(Error::file(
            path,
            "not a .npy file (missing the \\x93NUMPY magic string)",
        ));
    }
    let major = prefix[6];
    let len_bytes = match major {
        1 => 2,
        2 | 3 => 4,
        v => {
            return Err(Error::file(
                path,
                format!("unsupported .npy format version {v}.{}", prefix[7]),
            ))
        }
    };
    let mut len = [0u8; 4];
    reader.read_exact(&mut len[..len_bytes]).map_err(short)?;
    let header_len = u32::from_le_bytes(len) as usize;
    let mut dict = vec![0u8; header_len];
    reader.read_exact(&mut dict).map_err(short)?;
    // Version 3.0 differs from 2.0 only by allowing UTF-8 in the header.
    let dict = std::str::from_utf8(&dict)
        .map_err(|_| Error::file(path, "the .npy header is not valid text"))?;
    let header = parse_npy_header(dict).map_err(|msg| Error::file(path, msg))?;
    Ok((header, (8 + len_bytes + header_len) as u64))
}

/// A value of the header's Python dict literal.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PyValue {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
    /// Anything else (e.g. the list of a structured dtype), kept as text for the message.
    Other(String),
}

/// Parses the header dict, e.g. `{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }`.
/// Errors are plain messages; the caller adds the file name.
fn parse_npy_header(text: &str) -> std::result::Result<NpyHeader, String> {
    let entries = parse_py_dict(text)?;
    let get = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
            .ok_or_else(|| format!("the .npy header has no '{key}' entry"))
    };
    let (dtype, big_endian) = match get("descr")? {
        PyValue::Str(descr) => parse_descr(descr)?,
        other => {
            return Err(format!(
                "structured or unusual dtype {other:?}; embeddings must be a plain float32 or \
                 float64 array"
            ))
        }
    };
    let fortran_order = match get("fortran_order")? {
        PyValue::Bool(b) => *b,
        other => return Err(format!("bad 'fortran_order' value {other:?} in the header")),
    };
    let shape = match get("shape")? {
        PyValue::Tuple(s) => s.clone(),
        other => return Err(format!("bad 'shape' value {other:?} in the header")),
    };
    Ok(NpyHeader {
        dtype,
        big_endian,
        fortran_order,
        shape,
    })
}

/// Element type and byte order of a numpy type string such as `<f4`.
fn parse_descr(descr: &str) -> std::result::Result<(NpyFloat, bool), String> {
    let (big_endian, kind) = match descr.as_bytes().first() {
        Some(b'<') | Some(b'=') | Some(b'|') => (false, &descr[1..]),
        Some(b'>') => (true, &descr[1..]),
        _ => (false, descr),
    };
    match kind {
        "f4" => Ok((NpyFloat::F32, big_endian)),
        "f8" => Ok((NpyFloat::F64, big_endian)),
        _ => Err(format!(
            "dtype '{descr}' is not supported: embeddings must be float32 ('<f4') or float64 \
             ('<f8'); convert with `x.astype(np.float32)`"
        )),
    }
}

/// Parses a flat Python dict literal whose keys are strings and whose values are strings,
/// booleans or tuples of integers (anything else is kept as [`PyValue::Other`]).
fn parse_py_dict(text: &str) -> std::result::Result<Vec<(String, PyValue)>, String> {
    let bad = || format!("malformed .npy header: {}", text.trim_end());
    let inner = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(bad)?;
    let mut entries = Vec::new();
    for item in split_top_level(inner) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (key, value) = item.split_once(':').ok_or_else(bad)?;
        let key = unquote(key.trim()).ok_or_else(bad)?;
        entries.push((key, parse_py_value(value.trim())));
    }
    Ok(entries)
}

/// The content of a `'…'` or `"…"` literal.
fn unquote(text: &str) -> Option<String> {
    let q = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    text.strip_prefix(q)?.strip_suffix(q).map(str::to_string)
}

fn parse_py_value(text: &str) -> PyValue {
    if let Some(s) = unquote(text) {
        return PyValue::Str(s);
    }
    match text {
        "True" => return PyValue::Bool(true),
        "False" => return PyValue::Bool(false),
        _ => {}
    }
    if let Some(inner) = text.strip_prefix('(').and_then(|t| t.strip_suffix(')')) {
        let dims: std::result::Result<Vec<usize>, _> = inner
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            // Python 2 era files may write long integers as `3L`.
            .map(|s| s.trim_end_matches('L').parse::<usize>())
            .collect();
        if let Ok(dims) = dims {
            return PyValue::Tuple(dims);
        }
    }
    PyValue::Other(text.to_string())
}

/// `(N, D)` from a shape, or an error naming the file unless it is 2-D with no zero extent.
fn matrix_shape(shape: &[usize], path: &Path) -> Result<(usize, usize)> {
    match *shape {
        [n, d] if n > 0 && d > 0 => Ok((n, d)),
        [n, d] => Err(Error::file(
            path,
            format!("the embedding matrix has shape ({n}, {d}); it needs at least one row and one column"),
        )),
        _ => Err(Error::file(
            path,
            format!(
                "expected a 2-D array (items × dimensions), got a {}-D array of shape {}",
                shape.len(),
                python_shape(shape)
            ),
        )),
    }
}

/// Why a value cannot be used as an f32 embedding coordinate.
#[derive(Debug, Clone, Copy, PartialEq)]
enum NonFinite {
    Nan,
    Infinite,
    /// A finite float64 beyond the float32 range.
    Overflow(f64),
}

/// Values converted to f32, with the flat index of the first unusable one.
type Decoded = (Vec<f32>, Option<(usize, NonFinite)>);

fn non_finite_error(path: &Path, row: usize, col: usize, problem: NonFinite) -> Error {
    let what = match problem {
        NonFinite::Nan => "is NaN".to_string(),
        NonFinite::Infinite => "is infinite".to_string(),
        NonFinite::Overflow(v) => format!("is {v:e}, beyond the float32 range"),
    };
    Error::file(
        path,
        format!(
            "row {row}, column {col} (0-based) {what}; embeddings must be finite (check the \
             model output for this item)"
        ),
    )
}

fn first_non_finite_f32(values: &[f32]) -> Option<(usize, NonFinite)> {
    values.iter().position(|v| !v.is_finite()).map(|i| {
        let kind = if values[i].is_nan() {
            NonFinite::Nan
        } else {
            NonFinite::Infinite
        };
        (i, kind)
    })
}

/// Rounds to f32, reporting the first value that is not finite or does not fit.
fn f64_to_f32_checked(values: &[f64]) -> Decoded {
    let mut bad = None;
    let out = values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let x = v as f32;
            if bad.is_none() && !x.is_finite() {
                bad = Some((
                    i,
                    if v.is_nan() {
                        NonFinite::Nan
                    } else if v.is_infinite() {
                        NonFinite::Infinite
                    } else {
                        NonFinite::Overflow(v)
                    },
                ));
            }
            x
        })
        .collect();
    (out, bad)
}

/// Streams `count` values of the data section into f32, in file order, with the flat index of
/// the first unusable value.
fn read_values<R: Read>(
    reader: &mut R,
    header: &NpyHeader,
    count: usize,
    path: &Path,
) -> Result<Decoded> {
    let size = header.dtype.size();
    let mut out = Vec::with_capacity(count);
    let mut bad = None;
    let mut buf = vec![0u8; READ_BLOCK];
    let mut left = count * size;
    while left > 0 {
        let take = left.min(READ_BLOCK);
        reader
            .read_exact(&mut buf[..take])
            .map_err(|e| Error::io(path, e))?;
        let offset = out.len();
        let (block, block_bad) = decode_block(&buf[..take], header.dtype, header.big_endian);
        if bad.is_none() {
            bad = block_bad.map(|(i, p)| (offset + i, p));
        }
        out.extend_from_slice(&block);
        left -= take;
    }
    Ok((out, bad))
}

/// Decodes whole elements of `bytes` (its length is a multiple of the element size).
fn decode_block(bytes: &[u8], dtype: NpyFloat, big_endian: bool) -> Decoded {
    match dtype {
        NpyFloat::F32 => {
            let v: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| {
                    let b = [c[0], c[1], c[2], c[3]];
                    if big_endian {
                        f32::from_be_bytes(b)
                    } else {
                        f32::from_le_bytes(b)
                    }
                })
                .collect();
            let bad = first_non_finite_f32(&v);
            (v, bad)
        }
        NpyFloat::F64 => {
            let v: Vec<f64> = bytes
                .chunks_exact(8)
                .map(|c| {
                    let b = [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
                    if big_endian {
                        f64::from_be_bytes(b)
                    } else {
                        f64::from_le_bytes(b)
                    }
                })
                .collect();
            f64_to_f32_checked(&v)
        }
    }
}

/// Reorders a column-major `n × d` buffer into row-major.
fn fortran_to_c(values: &[f32], n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * d];
    for (j, column) in values.chunks_exact(n).enumerate() {
        for (i, &v) in column.iter().enumerate() {
            out[i * d + j] = v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A `.npy` file as numpy writes it, built by hand (independently of [`npy_header`]).
    fn npy_bytes(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
        let order = if fortran { "True" } else { "False" };
        let mut dict =
            format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
        while (10 + dict.len() + 1) % 64 != 0 {
            dict.push(' ');
        }
        dict.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn write(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn le32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn parses_numpy_headers() {
        let h = parse_npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }")
            .unwrap();
        assert_eq!(
            h,
            NpyHeader {
                dtype: NpyFloat::F32,
                big_endian: false,
                fortran_order: false,
                shape: vec![3, 2]
            }
        );
        let h = parse_npy_header("{\"descr\": \">f8\", \"fortran_order\": True, \"shape\": (5,)}")
            .unwrap();
        assert_eq!(h.dtype, NpyFloat::F64);
        assert!(h.big_endian && h.fortran_order);
        assert_eq!(h.shape, vec![5]);
        let h =
            parse_npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (), }").unwrap();
        assert!(h.shape.is_empty());
        let e = parse_npy_header("{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }")
            .unwrap_err();
        assert!(e.contains("'<i8' is not supported"), "{e}");
        let e =
            parse_npy_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }")
                .unwrap_err();
        assert!(e.contains("structured"), "{e}");
        assert!(parse_npy_header("'descr': '<f4'").is_err());
        assert!(parse_npy_header("{'fortran_order': False, 'shape': (3,)}").is_err());
    }

    #[test]
    fn written_headers_are_aligned_and_parse_back() {
        for shape in [&[7usize, 3][..], &[5], &[60502, 512]] {
            let h = npy_header("<f4", shape);
            assert_eq!(h.len() % NPY_ALIGN, 0);
            let (parsed, len) = read_npy_header(&mut &h[..], Path::new("x.npy")).unwrap();
            assert_eq!(len as usize, h.len());
            assert_eq!(parsed.shape, shape);
        }
    }

    #[test]
    fn reads_c_and_fortran_order_f32_and_f64() {
        let dir = tempfile::tempdir().unwrap();
        // x = [[1, 2, 3], [4, 5, 6]]
        let c = write(
            &dir,
            "c.npy",
            &npy_bytes("<f4", false, "(2, 3)", &le32(&[1., 2., 3., 4., 5., 6.])),
        );
        let f = write(
            &dir,
            "f.npy",
            &npy_bytes("<f4", true, "(2, 3)", &le32(&[1., 4., 2., 5., 3., 6.])),
        );
        let f64_data: Vec<u8> = [1.0f64, 2., 3., 4., 5., 6.]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let d = write(&dir, "d.npy", &npy_bytes("<f8", false, "(2, 3)", &f64_data));
        let be: Vec<u8> = [1.0f32, 2., 3., 4., 5., 6.]
            .iter()
            .flat_map(|x| x.to_be_bytes())
            .collect();
        let b = write(&dir, "b.npy", &npy_bytes(">f4", false, "(2, 3)", &be));
        let want = vec![vec![1f32, 2., 3.], vec![4., 5., 6.]];
        for p in [c, f, d, b] {
            let t = read_npy(&p).unwrap();
            assert_eq!(t.dtype(), DType::F32);
            assert_eq!(t.to_vec2::<f32>().unwrap(), want, "{}", p.display());
        }
    }

    #[test]
    fn f64_is_rounded_to_nearest_f32() {
        let dir = tempfile::tempdir().unwrap();
        let v = [0.1f64, 1.0 / 3.0];
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let p = write(&dir, "d.npy", &npy_bytes("<f8", false, "(1, 2)", &bytes));
        let t = read_npy(&p).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(t, vec![vec![0.1f32, 1.0f32 / 3.0]]);
    }

    #[test]
    fn rejects_bad_npy_files_naming_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let err = |p: &Path| read_npy(p).unwrap_err().to_string();
        let p = write(
            &dir,
            "one_d.npy",
            &npy_bytes("<f4", false, "(3,)", &le32(&[1., 2., 3.])),
        );
        let e = err(&p);
        assert!(e.contains("one_d.npy") && e.contains("1-D"), "{e}");
        let p = write(
            &dir,
            "three_d.npy",
            &npy_bytes("<f4", false, "(1, 1, 2)", &le32(&[1., 2.])),
        );
        assert!(err(&p).contains("3-D"), "{}", err(&p));
        let p = write(&dir, "empty.npy", &npy_bytes("<f4", false, "(0, 4)", &[]));
        assert!(err(&p).contains("at least one row"), "{}", err(&p));
        let p = write(
            &dir,
            "int.npy",
            &npy_bytes("<i8", false, "(1, 1)", &7i64.to_le_bytes()),
        );
        assert!(err(&p).contains("'<i8' is not supported"), "{}", err(&p));
        let p = write(
            &dir,
            "short.npy",
            &npy_bytes("<f4", false, "(2, 2)", &le32(&[1., 2., 3.])),
        );
        let e = err(&p);
        assert!(e.contains("short.npy") && e.contains("truncated"), "{e}");
        let p = write(
            &dir,
            "nan.npy",
            &npy_bytes(
                "<f4",
                false,
                "(3, 2)",
                &le32(&[1., 2., 3., 4., 5., f32::NAN]),
            ),
        );
        let e = err(&p);
        assert!(e.contains("row 2, column 1") && e.contains("NaN"), "{e}");
        // In Fortran order the flat index maps back to the right (row, column).
        let p = write(
            &dir,
            "inf_f.npy",
            &npy_bytes(
                "<f4",
                true,
                "(3, 2)",
                &le32(&[1., 2., f32::INFINITY, 4., 5., 6.]),
            ),
        );
        let e = err(&p);
        assert!(
            e.contains("row 2, column 0") && e.contains("infinite"),
            "{e}"
        );
        let big: Vec<u8> = [1e300f64, 0.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let p = write(&dir, "big.npy", &npy_bytes("<f8", false, "(1, 2)", &big));
        assert!(err(&p).contains("beyond the float32 range"), "{}", err(&p));
        let p = write(&dir, "text.npy", b"hello, world\n");
        assert!(err(&p).contains("not a .npy file"), "{}", err(&p));
        let p = write(&dir, "tiny.npy", b"\x93NU");
        assert!(err(&p).contains("ends inside the header"), "{}", err(&p));
        let e = err(&dir.path().join("missing.npy"));
        assert!(e.contains("missing.npy"), "{e}");
    }

    #[test]
    fn write_npy_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let x = Tensor::new(&[[1.5f32, -2.0], [0.25, 1e-30], [3.0, 4.0]], &Device::Cpu).unwrap();
        let p = dir.path().join("x.npy");
        write_npy(&p, &x).unwrap();
        assert_eq!(
            read_npy(&p).unwrap().to_vec2::<f32>().unwrap(),
            x.to_vec2::<f32>().unwrap()
        );
        // candle's own reader agrees on our files.
        assert_eq!(
            Tensor::read_npy(&p).unwrap().to_vec2::<f32>().unwrap(),
            x.to_vec2::<f32>().unwrap()
        );
    }

    #[test]
    fn reads_safetensors_by_name_or_alone() {
        let dir = tempfile::tempdir().unwrap();
        let x = Tensor::new(&[[1f32, 2.], [3., 4.]], &Device::Cpu).unwrap();
        let p = dir.path().join("one.safetensors");
        x.save_safetensors("feats", &p).unwrap();
        assert_eq!(
            read_safetensors(&p, None)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap(),
            x.to_vec2::<f32>().unwrap()
        );
        let mut many = HashMap::new();
        many.insert("embeddings", x.to_dtype(DType::F64).unwrap());
        many.insert("other", x.to_dtype(DType::F16).unwrap());
        many.insert("ids", Tensor::new(&[[1u32, 2]], &Device::Cpu).unwrap());
        let p = dir.path().join("many.safetensors");
        candle_core::safetensors::save(&many, &p).unwrap();
        for name in [None, Some("embeddings"), Some("other")] {
            let t = read_safetensors(&p, name).unwrap();
            assert_eq!(t.dtype(), DType::F32);
            assert_eq!(t.to_vec2::<f32>().unwrap(), x.to_vec2::<f32>().unwrap());
        }
        let e = read_safetensors(&p, Some("nope")).unwrap_err().to_string();
        assert!(
            e.contains("no tensor named 'nope'") && e.contains("embeddings, ids, other"),
            "{e}"
        );
        let e = read_safetensors(&p, Some("ids")).unwrap_err().to_string();
        assert!(e.contains("floating-point"), "{e}");
    }

    #[test]
    fn rejects_bad_safetensors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v.safetensors");
        Tensor::new(&[1f32, 2.], &Device::Cpu)
            .unwrap()
            .save_safetensors("embeddings", &p)
            .unwrap();
        let e = read_safetensors(&p, None).unwrap_err().to_string();
        assert!(e.contains("v.safetensors") && e.contains("1-D"), "{e}");
        let p = dir.path().join("nan.safetensors");
        Tensor::new(&[[1f32, 2.], [f32::NAN, 0.]], &Device::Cpu)
            .unwrap()
            .save_safetensors("e", &p)
            .unwrap();
        let e = read_safetensors(&p, None).unwrap_err().to_string();
        assert!(e.contains("row 1, column 0") && e.contains("NaN"), "{e}");
        let p = write(&dir, "junk.safetensors", b"\x08\0\0\0\0\0\0\0{}");
        let e = read_safetensors(&p, None).unwrap_err().to_string();
        assert!(e.contains("junk.safetensors"), "{e}");
    }

    #[test]
    fn dispatches_on_extension() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "x.npy",
            &npy_bytes("<f4", false, "(1, 2)", &le32(&[1., 2.])),
        );
        assert!(read_embeddings(&p, None).is_ok());
        let e = read_embeddings(&p, Some("x")).unwrap_err().to_string();
        assert!(e.contains("only applies to .safetensors"), "{e}");
        let e = read_embeddings(Path::new("x.txt"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.txt") && e.contains(".npy or .safetensors"),
            "{e}"
        );
    }
}

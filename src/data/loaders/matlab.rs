//! A reader for the subset of the MATLAB Level-5 MAT-file format (versions 5 to 7.x, not the
//! HDF5-based 7.3) that dataset annotations use: numeric, logical and char arrays, cell arrays and
//! struct arrays, zlib-compressed or not, little- or big-endian.
//!
//! Used for Cars196's `cars_annos.mat`. The format is MathWorks' "MAT-File Format" document
//! (R2021a), §1: a 128-byte header, then data elements `(type, size, payload)` padded to 8 bytes,
//! with the "small data element" packing of payloads of at most 4 bytes. Numeric payloads may be
//! stored in a narrower type than the array class (MATLAB writes a `double` array of small
//! integers as `miUINT8`); every numeric value is returned as `f64`, exact for integers up to 2⁵³.

use crate::error::{Error, Result};
use flate2::read::ZlibDecoder;
use std::io::Read;
use std::path::Path;

/// One MATLAB value.
#[derive(Debug, Clone, PartialEq)]
pub enum MatValue {
    /// A numeric or logical array (real part), column-major.
    Numeric {
        /// Dimensions, at least two.
        dims: Vec<usize>,
        /// Values in column-major order.
        data: Vec<f64>,
    },
    /// A char array, column-major UTF-16 code units decoded to `char`s.
    Char {
        /// Dimensions, at least two.
        dims: Vec<usize>,
        /// Characters in column-major order.
        chars: Vec<char>,
    },
    /// A cell array, elements in column-major order.
    Cell {
        /// Dimensions.
        dims: Vec<usize>,
        /// The elements.
        items: Vec<MatValue>,
    },
    /// A struct array: `items[element][field]`, elements in column-major order.
    Struct {
        /// Dimensions.
        dims: Vec<usize>,
        /// Field names, in file order.
        fields: Vec<String>,
        /// One row of field values per element.
        items: Vec<Vec<MatValue>>,
    },
}

impl MatValue {
    /// Number of elements (product of the dimensions).
    pub fn len(&self) -> usize {
        match self {
            MatValue::Numeric { data, .. } => data.len(),
            MatValue::Char { chars, .. } => chars.len(),
            MatValue::Cell { items, .. } => items.len(),
            MatValue::Struct { items, .. } => items.len(),
        }
    }

    /// True when the array has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The text of a char row vector (`1 × n`, or empty).
    pub fn as_string(&self) -> Option<String> {
        match self {
            MatValue::Char { dims, chars } if dims.len() == 2 && (dims[0] <= 1) => {
                Some(chars.iter().collect())
            }
            _ => None,
        }
    }

    /// The single value of a `1 × 1` numeric array.
    pub fn as_scalar(&self) -> Option<f64> {
        match self {
            MatValue::Numeric { data, .. } if data.len() == 1 => Some(data[0]),
            _ => None,
        }
    }

    /// The value of `field` in element `element` of a struct array.
    pub fn field(&self, element: usize, field: &str) -> Option<&MatValue> {
        match self {
            MatValue::Struct { fields, items, .. } => {
                let k = fields.iter().position(|f| f == field)?;
                items.get(element).map(|row| &row[k])
            }
            _ => None,
        }
    }
}

/// The named variables of a MAT-file, in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct MatFile {
    /// `(name, value)` pairs.
    pub variables: Vec<(String, MatValue)>,
}

impl MatFile {
    /// The variable called `name`.
    pub fn get(&self, name: &str) -> Option<&MatValue> {
        self.variables
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }
}

/// Reads a MAT-file; errors name the file and the byte offset of the problem.
pub fn read_mat(path: impl AsRef<Path>) -> Result<MatFile> {
    let path = path.as_ref();
    let bytes = super::read_bytes(path)?;
    parse_mat(&bytes).map_err(|msg| Error::file(path, format!("MAT-file: {msg}")))
}

/// Parses the bytes of a MAT-file (see [`read_mat`]).
pub fn parse_mat(bytes: &[u8]) -> std::result::Result<MatFile, String> {
    if bytes.len() < 128 {
        return Err(format!(
            "{} bytes, shorter than the 128-byte header",
            bytes.len()
        ));
    }
    if bytes.starts_with(b"MATLAB 7.3") || bytes.starts_with(b"\x89HDF") {
        return Err("a v7.3 (HDF5) MAT-file; save it with `save -v7` to read it here".into());
    }
    let big_endian = match &bytes[126..128] {
        b"IM" => false,
        b"MI" => true,
        other => {
            return Err(format!(
                "bad endian indicator {other:?} at byte 126 (not a Level-5 MAT-file)"
            ))
        }
    };
    let r = Reader { big_endian };
    let mut variables = Vec::new();
    let mut pos = 128;
    while pos < bytes.len() {
        let el = r.element(bytes, pos)?;
        match el.kind {
            MI_COMPRESSED => {
                let mut inflated = Vec::new();
                ZlibDecoder::new(el.payload)
                    .read_to_end(&mut inflated)
                    .map_err(|e| format!("corrupt compressed element at byte {pos}: {e}"))?;
                let inner = r.element(&inflated, 0)?;
                if inner.kind != MI_MATRIX {
                    return Err(format!(
                        "compressed element at byte {pos} holds type {}, not a matrix",
                        inner.kind
                    ));
                }
                variables.push(r.matrix(inner.payload, pos)?);
                pos = el.end_unpadded;
            }
            MI_MATRIX => {
                variables.push(r.matrix(el.payload, pos)?);
                pos = el.end;
            }
            other => {
                return Err(format!(
                    "top-level element of type {other} at byte {pos} (expected a matrix)"
                ))
            }
        }
    }
    Ok(MatFile { variables })
}

const MI_INT8: u32 = 1;
const MI_UINT8: u32 = 2;
const MI_INT16: u32 = 3;
const MI_UINT16: u32 = 4;
const MI_INT32: u32 = 5;
const MI_UINT32: u32 = 6;
const MI_SINGLE: u32 = 7;
const MI_DOUBLE: u32 = 9;
const MI_INT64: u32 = 12;
const MI_UINT64: u32 = 13;
const MI_MATRIX: u32 = 14;
const MI_COMPRESSED: u32 = 15;
const MI_UTF8: u32 = 16;

const MX_CELL: u8 = 1;
const MX_STRUCT: u8 = 2;
const MX_CHAR: u8 = 4;
/// `mxDOUBLE_CLASS` (6) to `mxUINT64_CLASS` (15) are numeric.
const MX_NUMERIC: std::ops::RangeInclusive<u8> = 6..=15;

/// One data element: its type, payload, and where the next element starts.
struct Element<'a> {
    kind: u32,
    payload: &'a [u8],
    /// Offset after the payload padded to 8 bytes.
    end: usize,
    /// Offset right after the payload (compressed elements are not padded).
    end_unpadded: usize,
}

#[derive(Clone, Copy)]
struct Reader {
    big_endian: bool,
}

impl Reader {
    fn u32_at(&self, b: &[u8], pos: usize) -> std::result::Result<u32, String> {
        let s: [u8; 4] = b
            .get(pos..pos + 4)
            .ok_or_else(|| format!("truncated at byte {pos}"))?
            .try_into()
            .expect("4 bytes");
        Ok(if self.big_endian {
            u32::from_be_bytes(s)
        } else {
            u32::from_le_bytes(s)
        })
    }

    /// The data element starting at `pos` of `b` (8-byte tag, or a 4-byte small-element tag).
    fn element<'a>(&self, b: &'a [u8], pos: usize) -> std::result::Result<Element<'a>, String> {
        let first = self.u32_at(b, pos)?;
        if first >> 16 != 0 {
            // Small data element: size in the upper half-word, payload in the next 4 bytes.
            let size = (first >> 16) as usize;
            if size > 4 {
                return Err(format!("small data element of {size} bytes at byte {pos}"));
            }
            let payload = b
                .get(pos + 4..pos + 4 + size)
                .ok_or_else(|| format!("truncated small element at byte {pos}"))?;
            return Ok(Element {
                kind: first & 0xffff,
                payload,
                end: pos + 8,
                end_unpadded: pos + 8,
            });
        }
        let size = self.u32_at(b, pos + 4)? as usize;
        let start = pos + 8;
        let payload = b.get(start..start + size).ok_or_else(|| {
            format!(
                "element at byte {pos} declares {size} bytes but only {} remain",
                b.len().saturating_sub(start)
            )
        })?;
        Ok(Element {
            kind: first,
            payload,
            end: start + size.div_ceil(8) * 8,
            end_unpadded: start + size,
        })
    }

    /// Decodes a numeric payload of any MAT numeric type to `f64`.
    fn numbers(&self, kind: u32, p: &[u8], at: usize) -> std::result::Result<Vec<f64>, String> {
        macro_rules! decode {
            ($t:ty, $n:expr) => {
                p.chunks_exact($n)
                    .map(|c| {
                        let a: [u8; $n] = c.try_into().expect("chunk");
                        (if self.big_endian {
                            <$t>::from_be_bytes(a)
                        } else {
                            <$t>::from_le_bytes(a)
                        }) as f64
                    })
                    .collect()
            };
        }
        let width = match kind {
            MI_INT8 | MI_UINT8 => 1,
            MI_INT16 | MI_UINT16 => 2,
            MI_INT32 | MI_UINT32 | MI_SINGLE => 4,
            MI_DOUBLE | MI_INT64 | MI_UINT64 => 8,
            other => return Err(format!("element type {other} at byte {at} is not numeric")),
        };
        if !p.len().is_multiple_of(width) {
            return Err(format!(
                "numeric element at byte {at}: {} bytes is not a multiple of {width}",
                p.len()
            ));
        }
        Ok(match kind {
            MI_INT8 => p.iter().map(|&v| v as i8 as f64).collect(),
            MI_UINT8 => p.iter().map(|&v| v as f64).collect(),
            MI_INT16 => decode!(i16, 2),
            MI_UINT16 => decode!(u16, 2),
            MI_INT32 => decode!(i32, 4),
            MI_UINT32 => decode!(u32, 4),
            MI_SINGLE => decode!(f32, 4),
            MI_DOUBLE => decode!(f64, 8),
            MI_INT64 => decode!(i64, 8),
            _ => decode!(u64, 8),
        })
    }

    /// Decodes a char payload (UTF-16 code units, UTF-8, or 8-bit) into characters.
    fn chars(&self, kind: u32, p: &[u8], at: usize) -> std::result::Result<Vec<char>, String> {
        match kind {
            MI_UTF8 => std::str::from_utf8(p)
                .map(|s| s.chars().collect())
                .map_err(|_| format!("invalid UTF-8 text at byte {at}")),
            MI_UINT8 | MI_INT8 => Ok(p.iter().map(|&c| c as char).collect()),
            MI_UINT16 | MI_INT16 => {
                let units: Vec<u16> = self
                    .numbers(kind, p, at)?
                    .iter()
                    .map(|&v| v as u16)
                    .collect();
                char::decode_utf16(units)
                    .collect::<std::result::Result<Vec<char>, _>>()
                    .map_err(|_| format!("invalid UTF-16 text at byte {at}"))
            }
            other => Err(format!("char data of element type {other} at byte {at}")),
        }
    }

    /// Parses the payload of a `miMATRIX` element into `(name, value)`; `at` locates it for errors.
    fn matrix(&self, p: &[u8], at: usize) -> std::result::Result<(String, MatValue), String> {
        if p.is_empty() {
            // An empty matrix element stands for `[]` (e.g. an unset struct field).
            return Ok((
                String::new(),
                MatValue::Numeric {
                    dims: vec![0, 0],
                    data: Vec::new(),
                },
            ));
        }
        let flags_el = self.element(p, 0)?;
        if flags_el.kind != MI_UINT32 || flags_el.payload.len() < 4 {
            return Err(format!("matrix at byte {at}: missing array flags"));
        }
        let flags = self.u32_at(flags_el.payload, 0)?;
        let class = (flags & 0xff) as u8;
        let dims_el = self.element(p, flags_el.end)?;
        let dims: Vec<usize> = self
            .numbers(dims_el.kind, dims_el.payload, at)?
            .into_iter()
            .map(|d| d as usize)
            .collect();
        let count: usize = dims.iter().product();
        let name_el = self.element(p, dims_el.end)?;
        let name = String::from_utf8_lossy(name_el.payload).into_owned();
        let mut pos = name_el.end;
        let value = match class {
            c if MX_NUMERIC.contains(&c) => {
                let re = self.element(p, pos)?;
                let data = self.numbers(re.kind, re.payload, at)?;
                if data.len() != count {
                    return Err(format!(
                        "matrix '{name}' at byte {at}: {} values for dimensions {dims:?}",
                        data.len()
                    ));
                }
                // The imaginary part of a complex array (flag 0x0800) would follow; annotation
                // files have none, and only the real part is returned.
                MatValue::Numeric { dims, data }
            }
            MX_CHAR => {
                let el = self.element(p, pos)?;
                let chars = self.chars(el.kind, el.payload, at)?;
                MatValue::Char { dims, chars }
            }
            MX_CELL => {
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    let el = self.element(p, pos)?;
                    items.push(self.matrix(el.payload, at)?.1);
                    pos = el.end;
                }
                MatValue::Cell { dims, items }
            }
            MX_STRUCT => {
                let len_el = self.element(p, pos)?;
                let name_len = self
                    .numbers(len_el.kind, len_el.payload, at)?
                    .first()
                    .copied()
                    .unwrap_or(0.0) as usize;
                let names_el = self.element(p, len_el.end)?;
                if name_len == 0 || names_el.payload.len() % name_len != 0 {
                    return Err(format!(
                        "struct '{name}' at byte {at}: bad field-name length {name_len}"
                    ));
                }
                let fields: Vec<String> = names_el
                    .payload
                    .chunks(name_len)
                    .map(|c| {
                        let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
                        String::from_utf8_lossy(&c[..end]).into_owned()
                    })
                    .collect();
                pos = names_el.end;
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    let mut row = Vec::with_capacity(fields.len());
                    for _ in 0..fields.len() {
                        let el = self.element(p, pos)?;
                        row.push(self.matrix(el.payload, at)?.1);
                        pos = el.end;
                    }
                    items.push(row);
                }
                MatValue::Struct {
                    dims,
                    fields,
                    items,
                }
            }
            other => {
                return Err(format!(
                    "matrix '{name}' at byte {at} has class {other} (objects, sparse and \
                     function handles are not supported)"
                ))
            }
        };
        Ok((name, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends a data element (8-byte tag, payload padded to 8 bytes), little-endian.
    fn element(out: &mut Vec<u8>, kind: u32, payload: &[u8]) {
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
        out.resize(out.len().div_ceil(8) * 8, 0);
    }

    fn small(out: &mut Vec<u8>, kind: u32, payload: &[u8]) {
        out.extend_from_slice(&(((payload.len() as u32) << 16) | kind).to_le_bytes());
        let mut data = payload.to_vec();
        data.resize(4, 0);
        out.extend_from_slice(&data);
    }

    fn header() -> Vec<u8> {
        let mut h = vec![b' '; 128];
        h[..10].copy_from_slice(b"MATLAB 5.0");
        h[124..126].copy_from_slice(&0x0100u16.to_le_bytes());
        h[126..128].copy_from_slice(b"IM");
        h
    }

    /// A `1 × n` double array stored as `miUINT8`, the compact form MATLAB writes.
    fn uint8_matrix(name: &str, values: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        element(&mut m, MI_UINT32, &[6, 0, 0, 0, 0, 0, 0, 0]);
        let mut dims = Vec::new();
        dims.extend_from_slice(&1i32.to_le_bytes());
        dims.extend_from_slice(&(values.len() as i32).to_le_bytes());
        element(&mut m, MI_INT32, &dims);
        small(&mut m, MI_INT8, name.as_bytes());
        element(&mut m, MI_UINT8, values);
        m
    }

    #[test]
    fn reads_compact_numeric_and_small_name() {
        let mut file = header();
        element(&mut file, MI_MATRIX, &uint8_matrix("ab", &[3, 200, 7]));
        let mat = parse_mat(&file).unwrap();
        assert_eq!(
            mat.get("ab"),
            Some(&MatValue::Numeric {
                dims: vec![1, 3],
                data: vec![3.0, 200.0, 7.0]
            })
        );
    }

    #[test]
    fn reads_compressed_elements() {
        use flate2::write::ZlibEncoder;
        use std::io::Write;
        let mut inner = Vec::new();
        element(&mut inner, MI_MATRIX, &uint8_matrix("x", &[1, 2]));
        let mut enc = ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&inner).unwrap();
        let z = enc.finish().unwrap();
        let mut file = header();
        file.extend_from_slice(&MI_COMPRESSED.to_le_bytes());
        file.extend_from_slice(&(z.len() as u32).to_le_bytes());
        file.extend_from_slice(&z);
        let mat = parse_mat(&file).unwrap();
        assert_eq!(mat.get("x").unwrap().len(), 2);
    }

    #[test]
    fn rejects_hdf5_and_truncation() {
        let mut h = header();
        h[..10].copy_from_slice(b"MATLAB 7.3");
        assert!(parse_mat(&h).unwrap_err().contains("7.3"));
        let mut file = header();
        element(&mut file, MI_MATRIX, &uint8_matrix("ab", &[3, 200, 7]));
        file.truncate(file.len() - 12);
        assert!(parse_mat(&file).unwrap_err().contains("declares"));
    }
}

//! Serde for `f64` values in JSON files that must give back the very value computed (results,
//! metrics logs, checkpoints, the run cache): finite values as JSON numbers, NaN as `null`, ±∞ as
//! the strings `"inf"` / `"-inf"` (JSON has neither).
//!
//! serde_json writes the shortest digits that round-trip and, with its `float_roundtrip` feature
//! (on in our `Cargo.toml`), parses them back correctly rounded, so a number survives bit for bit.
//! Reading also accepts a value written as a string — the format of files written before values
//! became numbers — parsed with Rust's correctly rounded parser.

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;

/// Writes `v`: a number, `null` (NaN) or `"inf"` / `"-inf"`.
pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_nan() {
        s.serialize_none()
    } else if v.is_infinite() {
        s.serialize_str(if *v > 0.0 { "inf" } else { "-inf" })
    } else {
        s.serialize_f64(*v)
    }
}

/// Reads what [`serialize`] writes, and a number written as a string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    d.deserialize_any(F64Visitor)
}

struct F64Visitor;

impl<'de> Visitor<'de> for F64Visitor {
    type Value = f64;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number, null (NaN) or a string holding a number")
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        v.parse::<f64>()
            .map_err(|_| E::custom(format!("`{v}` is not a number")))
    }

    fn visit_unit<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }

    fn visit_none<E: de::Error>(self) -> Result<f64, E> {
        Ok(f64::NAN)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<f64, D::Error> {
        deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct V(#[serde(with = "super")] f64);

    #[test]
    fn every_bit_survives_and_finite_values_are_json_numbers() {
        for v in [
            0.37166003134781045,
            -0.0,
            1e-300,
            5e-324,
            f64::MAX,
            0.1 + 0.2,
            586.0 / 600.0,
            3.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let json = serde_json::to_string(&V(v)).unwrap();
            if v.is_finite() {
                assert!(!json.contains('"'), "{json} is not a number");
            }
            let back: V = serde_json::from_str(&json).unwrap();
            assert_eq!(back.0.to_bits(), v.to_bits(), "{json}");
        }
        assert_eq!(serde_json::to_string(&V(f64::NAN)).unwrap(), "null");
        let back: V = serde_json::from_str("null").unwrap();
        assert!(back.0.is_nan());
        // Files of earlier versions wrote values as strings.
        let back: V = serde_json::from_str("\"0.37166003134781045\"").unwrap();
        assert_eq!(back.0, 0.37166003134781045);
        let back: V = serde_json::from_str("\"NaN\"").unwrap();
        assert!(back.0.is_nan());
        let back: V = serde_json::from_str("7").unwrap();
        assert_eq!(back.0, 7.0);
        let e = serde_json::from_str::<V>("\"abc\"").err().unwrap();
        assert!(e.to_string().contains("`abc` is not a number"), "{e}");
    }
}

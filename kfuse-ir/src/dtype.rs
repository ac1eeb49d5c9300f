//! Element types of tiles and tensors.

use std::fmt;

/// The element type of a tensor, a tile or a scalar.
///
/// `I64` is the type of index arithmetic (`program_id`, offsets, shape extents);
/// `Bool` is the type of comparisons and the condition of `select`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    Bool,
}

impl DType {
    /// Size of one element in memory, in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The name used in the IR printer and in messages (`f32`, `bf16`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses the names [`DType::name`] prints.
    pub fn from_name(s: &str) -> Option<DType> {
        Some(match s {
            "f32" => DType::F32,
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "i64" => DType::I64,
            "bool" => DType::Bool,
            _ => return None,
        })
    }

    /// Rounds an `f64` to the nearest value representable in this type
    /// (round-to-nearest-even), returned as `f64`. Integers truncate toward zero.
    pub fn round(self, v: f64) -> f64 {
        match self {
            DType::F32 => v as f32 as f64,
            DType::F16 => half::f16::from_f32(v as f32).to_f64(),
            DType::BF16 => half::bf16::from_f32(v as f32).to_f64(),
            DType::I64 => v.trunc(),
            DType::Bool => (v != 0.0) as u8 as f64,
        }
    }

    /// Reads element `i` of a little-endian buffer of this type.
    pub fn read(self, bytes: &[u8], i: usize) -> f64 {
        let s = self.size_bytes();
        let b = &bytes[i * s..(i + 1) * s];
        match self {
            DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::Bool => (b[0] != 0) as u8 as f64,
        }
    }

    /// Writes `v` (rounded to this type) as element `i` of a little-endian buffer.
    pub fn write(self, bytes: &mut [u8], i: usize, v: f64) {
        let s = self.size_bytes();
        let b = &mut bytes[i * s..(i + 1) * s];
        match self {
            DType::F32 => b.copy_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => b.copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => b.copy_from_slice(&half::bf16::from_f32(v as f32).to_le_bytes()),
            DType::I64 => b.copy_from_slice(&(v as i64).to_le_bytes()),
            DType::Bool => b[0] = (v != 0.0) as u8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

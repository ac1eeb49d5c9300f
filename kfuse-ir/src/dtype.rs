//! Element types of tiles and tensors.

use std::fmt;

/// The element type of a tensor, a tile or a scalar.
///
/// `I64` is the type of index arithmetic (`program_id`, offsets, shape extents);
/// `Bool` is the type of comparisons and the condition of `select`.
///
/// `F8E4M3` and `F8E5M2` are the 8-bit floats of Hopper's matrix units (OCP FP8:
/// e4m3 "fn" — 4 exponent bits, 3 mantissa bits, no infinities, largest 448 — and e5m2
/// — 5 and 2, IEEE-like, largest finite 57344). Rounding into them is to nearest even
/// and *saturating* (`satfinite`, as the hardware's conversion): a finite value or an
/// infinity beyond the largest finite one becomes that largest value with its sign;
/// NaN stays NaN.
///
/// # Examples
///
/// ```
/// use kfuse_ir::DType;
///
/// assert_eq!(DType::BF16.size_bytes(), 2);
/// assert_eq!(DType::from_name("bf16"), Some(DType::BF16));
/// assert_eq!(DType::F8E4M3.round(1000.0), 448.0); // saturates
/// let mut buf = vec![0u8; 4];
/// DType::F16.write(&mut buf, 1, 0.1);
/// assert_eq!(DType::F16.read(&buf, 1), DType::F16.round(0.1));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16: binary32's exponent, 7 mantissa bits.
    BF16,
    /// OCP FP8 e4m3 ("fn": no infinities, largest finite 448).
    F8E4M3,
    /// OCP FP8 e5m2 (largest finite 57344).
    F8E5M2,
    /// 64-bit signed integer: indices, offsets, shape extents.
    I64,
    /// A truth value: comparisons and `select` conditions (one byte in memory).
    Bool,
}

impl DType {
    /// Size of one element in memory, in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
    }

    /// True for the 8-bit floats.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }

    /// The name used in the IR printer and in messages (`f32`, `bf16`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
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
            "f8e4m3" => DType::F8E4M3,
            "f8e5m2" => DType::F8E5M2,
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
            DType::F8E4M3 | DType::F8E5M2 => fp8_decode(self, fp8_encode(self, v)),
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
            DType::F8E4M3 | DType::F8E5M2 => fp8_decode(self, b[0]),
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
            DType::F8E4M3 | DType::F8E5M2 => b[0] = fp8_encode(self, v),
            DType::I64 => b.copy_from_slice(&(v as i64).to_le_bytes()),
            DType::Bool => b[0] = (v != 0.0) as u8,
        }
    }
}

/// Exponent bits, mantissa bits and largest finite value of an 8-bit float.
fn fp8_format(d: DType) -> (u32, u32, f64) {
    match d {
        DType::F8E4M3 => (4, 3, 448.0),
        _ => (5, 2, 57344.0),
    }
}

/// The bits of an 8-bit float nearest to `v` (ties to even), saturating at the largest
/// finite value; NaN becomes the canonical NaN (`0x7f`).
fn fp8_encode(d: DType, v: f64) -> u8 {
    let (eb, mb, max) = fp8_format(d);
    if v.is_nan() {
        return 0x7f;
    }
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    let a = v.abs().min(max);
    let bias = (1i32 << (eb - 1)) - 1;
    // the spacing of representable values around `a`: subnormals share the smallest
    // normal exponent
    let e = if a == 0.0 { 1 - bias } else { (a.log2().floor() as i32).max(1 - bias) };
    let ulp = (2f64).powi(e - mb as i32);
    let q = a / ulp;
    let mut n = q.floor();
    let frac = q - n;
    if frac > 0.5 || (frac == 0.5 && (n as u64) % 2 == 1) {
        n += 1.0;
    }
    // `n` counts ulps of exponent `e`: `1.m` in [2^mb, 2^(mb+1)] (the top rounds up
    // into the next binade), or a subnormal below 2^mb
    let (mut exp_field, mut mant) = if n >= (1u64 << mb) as f64 { ((e + bias) as u32, n as u32 - (1 << mb)) } else { (0, n as u32) };
    if mant == 1 << mb {
        exp_field += 1;
        mant = 0;
    }
    // `a ≤ max` and `max` is representable, so rounding never passes it
    sign | ((exp_field << mb) | mant) as u8
}

fn decode_magnitude(d: DType, bits: u8) -> f64 {
    let (eb, mb, _) = fp8_format(d);
    let bias = (1i32 << (eb - 1)) - 1;
    let e = ((bits & 0x7f) >> mb) as i32;
    let m = (bits & ((1 << mb) - 1)) as f64;
    if e == 0 {
        m * (2f64).powi(1 - bias - mb as i32)
    } else {
        (1.0 + m / (1u32 << mb) as f64) * (2f64).powi(e - bias)
    }
}

/// The value of an 8-bit float's bits (e4m3: `S.1111.111` is NaN, no infinities;
/// e5m2: exponent 31 holds the infinities and NaNs).
fn fp8_decode(d: DType, bits: u8) -> f64 {
    let neg = bits & 0x80 != 0;
    let mag = bits & 0x7f;
    let v = match d {
        DType::F8E4M3 if mag == 0x7f => f64::NAN,
        DType::F8E5M2 if mag >> 2 == 0x1f => {
            if mag & 3 == 0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => decode_magnitude(d, mag),
    };
    if neg {
        -v
    } else {
        v
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_round_trips_every_pattern() {
        for d in [DType::F8E4M3, DType::F8E5M2] {
            for b in 0..=255u8 {
                let v = fp8_decode(d, b);
                if v.is_nan() {
                    assert!(d.round(v).is_nan());
                    continue;
                }
                if v.is_infinite() {
                    continue;
                }
                let mut buf = [0u8];
                d.write(&mut buf, 0, v);
                // -0 and +0 both exist; every finite pattern round-trips
                assert_eq!(d.read(&buf, 0).to_bits(), v.to_bits(), "{d} {b:#04x} {v}");
            }
        }
    }

    #[test]
    fn fp8_rounds_to_nearest_even_and_saturates() {
        let e4 = DType::F8E4M3;
        assert_eq!(e4.round(1.0), 1.0);
        // spacing 1/8 in [1, 2): 1.0625 ties to 1.0 (even), 1.1875 to 1.25
        assert_eq!(e4.round(1.0625), 1.0);
        assert_eq!(e4.round(1.1875), 1.25);
        assert_eq!(e4.round(1.07), 1.125);
        assert_eq!(e4.round(448.0), 448.0);
        assert_eq!(e4.round(1e6), 448.0);
        assert_eq!(e4.round(f64::NEG_INFINITY), -448.0);
        // smallest subnormal 2^-9; half of it ties to zero
        assert_eq!(e4.round(2f64.powi(-9)), 2f64.powi(-9));
        assert_eq!(e4.round(2f64.powi(-10)), 0.0);
        assert_eq!(e4.round(0.75 * 2f64.powi(-9)), 2f64.powi(-9));
        // rounding up out of the subnormals into the first normal binade
        assert_eq!(e4.round(0.0155), 2f64.powi(-6));
        let e5 = DType::F8E5M2;
        assert_eq!(e5.round(57344.0), 57344.0);
        assert_eq!(e5.round(1e9), 57344.0);
        assert_eq!(e5.round(1.125), 1.0);
        assert_eq!(e5.round(1.375), 1.5);
        assert_eq!(e5.round(2f64.powi(-16)), 2f64.powi(-16));
        assert!(e5.round(f64::NAN).is_nan());
        assert_eq!(DType::from_name("f8e4m3"), Some(e4));
        assert_eq!(e5.name(), "f8e5m2");
    }
}

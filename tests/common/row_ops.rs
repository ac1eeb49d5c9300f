//! The row ops and reductions of `kfuse::ops` as a table, with their float64 references:
//! shared by `tests/rows.rs` (contiguous inputs) and `tests/strided_ops.rs` (views).

use kfuse::DType;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    Sum,
    Mean,
    Max,
    Min,
    Softmax,
    LogSoftmax,
    Rms,
    RmsW,
    RmsWB,
    AddRms,
    AddRmsW,
    LayerNorm,
}

pub const OPS: [Op; 12] =
    [Op::Sum, Op::Mean, Op::Max, Op::Min, Op::Softmax, Op::LogSoftmax, Op::Rms, Op::RmsW, Op::RmsWB, Op::AddRms, Op::AddRmsW, Op::LayerNorm];

pub const EPS: f32 = 1e-5;

/// An output: in the input's dtype `T` (rounded), or an f32 statistic.
#[derive(Clone, Copy, PartialEq)]
pub enum Out {
    T,
    Stat,
}

impl Op {
    pub fn outputs(self) -> &'static [Out] {
        match self {
            Op::Sum | Op::Mean | Op::Max | Op::Min | Op::Softmax | Op::LogSoftmax => &[Out::T],
            Op::Rms | Op::RmsW | Op::RmsWB => &[Out::T, Out::Stat],
            Op::AddRms | Op::AddRmsW => &[Out::T, Out::T, Out::Stat],
            Op::LayerNorm => &[Out::T, Out::Stat, Out::Stat],
        }
    }
    pub fn row_shaped(self, out: usize) -> bool {
        matches!(self, Op::Sum | Op::Mean | Op::Max | Op::Min) || self.outputs()[out] == Out::Stat
    }
    pub fn exact(self) -> bool {
        matches!(self, Op::Max | Op::Min)
    }
    pub fn needs_r(self) -> bool {
        matches!(self, Op::AddRms | Op::AddRmsW)
    }
    pub fn needs_w(self) -> bool {
        matches!(self, Op::RmsW | Op::RmsWB | Op::AddRmsW | Op::LayerNorm)
    }
    pub fn needs_b(self) -> bool {
        matches!(self, Op::RmsWB | Op::LayerNorm)
    }
}

/// The float64 reference of every output (`T` outputs rounded) and the size of the terms
/// behind each element (the measure of `rows.rs`'s `compare`), for `m` rows of `n` of `x` (and `r`,
/// `w`, `b` where the op takes them; empty otherwise).
#[allow(clippy::too_many_arguments)]
pub fn reference(op: Op, dt: DType, m: usize, n: usize, x: &[f64], r: &[f64], w: &[f64], b: &[f64]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let eps = EPS as f64;
    let mut outs: Vec<Vec<f64>> = op.outputs().iter().map(|_| Vec::new()).collect();
    let mut scale: Vec<Vec<f64>> = outs.clone();
    let wj = |j: usize| if w.is_empty() { 1.0 } else { w[j] };
    let bj = |j: usize| if b.is_empty() { 0.0 } else { b[j] };
    let rms = |v: &[f64]| 1.0 / (v.iter().map(|a| a * a).sum::<f64>() / n as f64 + eps).sqrt();
    for row in 0..m {
        let xr = &x[row * n..(row + 1) * n];
        let sum: f64 = xr.iter().sum();
        let abs_sum: f64 = xr.iter().map(|a| a.abs()).sum();
        let max = xr.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let min = xr.iter().cloned().fold(f64::INFINITY, f64::min);
        match op {
            Op::Sum => {
                outs[0].push(dt.round(sum));
                scale[0].push(abs_sum);
            }
            Op::Mean => {
                outs[0].push(dt.round(sum / n as f64));
                scale[0].push(abs_sum / n as f64);
            }
            Op::Max => outs[0].push(max),
            Op::Min => outs[0].push(min),
            Op::Softmax => {
                let z: f64 = xr.iter().map(|a| (a - max).exp()).sum();
                outs[0].extend(xr.iter().map(|a| dt.round((a - max).exp() / z)));
            }
            Op::LogSoftmax => {
                let lz = xr.iter().map(|a| (a - max).exp()).sum::<f64>().ln();
                outs[0].extend(xr.iter().map(|a| dt.round(a - max - lz)));
                scale[0].extend(xr.iter().map(|a| a.abs() + max.abs() + lz.abs()));
            }
            Op::Rms | Op::RmsW | Op::RmsWB => {
                let q = rms(xr);
                outs[0].extend(xr.iter().enumerate().map(|(j, a)| dt.round(a * q * wj(j) + bj(j))));
                scale[0].extend(xr.iter().enumerate().map(|(j, a)| (a * q * wj(j)).abs() + bj(j).abs()));
                outs[1].push(q);
            }
            Op::AddRms | Op::AddRmsW => {
                let c = &r[row * n..(row + 1) * n];
                let s: Vec<f64> = xr.iter().zip(c).map(|(a, c)| dt.round(a + c)).collect();
                let q = rms(&s);
                outs[1].extend(s.iter().enumerate().map(|(j, a)| dt.round(a * q * wj(j))));
                scale[0].extend(xr.iter().zip(c).map(|(a, c)| a.abs() + c.abs()));
                outs[0].extend(s);
                outs[2].push(q);
            }
            Op::LayerNorm => {
                let mu = sum / n as f64;
                let var = xr.iter().map(|a| (a - mu) * (a - mu)).sum::<f64>() / n as f64;
                let q = 1.0 / (var + eps).sqrt();
                outs[0].extend(xr.iter().enumerate().map(|(j, a)| dt.round((a - mu) * q * wj(j) + bj(j))));
                scale[0].extend(xr.iter().enumerate().map(|(j, a)| (a.abs() + mu.abs()) * q * wj(j).abs() + bj(j).abs()));
                outs[1].push(mu);
                scale[1].push(abs_sum / n as f64);
                outs[2].push(q);
            }
        }
    }
    for (s, o) in scale.iter_mut().zip(&outs) {
        if s.is_empty() {
            *s = o.iter().map(|a| a.abs()).collect();
        }
    }
    (outs, scale)
}

//! What the GEMM tests share: a user GEMM with a fused bias + GELU epilogue and its
//! check, specs with the problem's sizes, operands stored row-major or transposed, a
//! float64 reference evaluated on a sample of rows (the whole product of the large
//! shapes would take minutes on the host), and the report of a table of cases.

use kfuse::codegen::Spec;
use kfuse::ir::KernelDef;
use kfuse::prelude::*;
use kfuse::DType;

pub use super::epilogue_kernels::gemm_bias_gelu;

/// A user kernel of three products in one loop: `p + q ⊙ r` of `p = a1·b1`, `q = a2·b2`,
/// `r = a2·b3` (two A tiles, one shared by two dots; three B tiles).
#[kfuse]
pub fn three_products<T: Float>(
    a1: Tensor<T, (M, K)>,
    b1: Tensor<T, (K, N)>,
    a2: Tensor<T, (M, K)>,
    b2: Tensor<T, (K, N)>,
    b3: Tensor<T, (K, N)>,
    out: &mut Tensor<T, (M, N)>,
) {
    let (i, j) = (program_id(0), program_id(1));
    let mut p = zeros::<f32>([BM, BN]);
    let mut q = zeros::<f32>([BM, BN]);
    let mut r = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        let x2 = a2.block([i * BM, k], [BM, BK]).load();
        p += dot(a1.block([i * BM, k], [BM, BK]).load(), b1.block([k, j * BN], [BK, BN]).load());
        q += dot(x2, b2.block([k, j * BN], [BK, BN]).load());
        r += dot(x2, b3.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store((p + q * r).cast::<T>());
}

/// The snapshot spec of a GEMM-shaped kernel with M, N, K set (powers of two: what the
/// heuristic sees). Shape symbols in order of first appearance: M, K, N.
pub fn spec_mnk(def: &KernelDef, m: u32, n: u32, k: u32) -> Spec {
    let mut s = super::snapshot_spec(def);
    s.shape_pow2 = vec![m.next_power_of_two(), k.next_power_of_two(), n.next_power_of_two()];
    s
}

/// An operand `[r, c]` with values `v` (row-major), stored either row-major or as the
/// transpose of a `[c, r]` tensor.
pub fn operand(r: usize, c: usize, dt: DType, seed: u64, transposed: bool, dev: &Device) -> (Tensor, Vec<f64>) {
    if transposed {
        let (t, tv) = super::random_tensor(&[c, r], dt, seed, 0.05, dev);
        let v = (0..r * c).map(|x| tv[(x % c) * r + x / c]).collect();
        (t.t(), v)
    } else {
        super::random_tensor(&[r, c], dt, seed, 0.05, dev)
    }
}

/// All rows of a small matrix, or 48 spread rows plus both ends and the middle.
pub fn sample_rows(m: usize) -> Vec<usize> {
    if m <= 64 {
        (0..m).collect()
    } else {
        let mut r: Vec<usize> = (0..48).map(|i| (i * 7919 + 13) % m).collect();
        r.extend([0, 1, m / 2, m - 2, m - 1]);
        r.sort();
        r.dedup();
        r
    }
}

/// Rows `rows` of `alpha · a·b + beta · c` in float64 (`a: [m, k]`, `b: [k, n]`, `c:
/// [m, n]` row-major values).
#[allow(clippy::too_many_arguments)]
pub fn reference_rows_ex(a: &[f64], b: &[f64], c: Option<&[f64]>, k: usize, n: usize, rows: &[usize], alpha: f64, beta: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows.len() * n);
    for &i in rows {
        let mut acc = vec![0.0f64; n];
        for q in 0..k {
            let x = a[i * k + q];
            for (o, bv) in acc.iter_mut().zip(&b[q * n..(q + 1) * n]) {
                *o += x * bv;
            }
        }
        for (j, o) in acc.iter_mut().enumerate() {
            *o = alpha * *o + c.map_or(0.0, |c| beta * c[i * n + j]);
        }
        out.extend(acc);
    }
    out
}

/// Rows `rows` of `a·b` in float64.
pub fn reference_rows(a: &[f64], b: &[f64], k: usize, n: usize, rows: &[usize]) -> Vec<f64> {
    reference_rows_ex(a, b, None, k, n, rows, 1.0, 0.0)
}

/// The rows `rows` of `got` (`[.., n]` row-major values).
pub fn rows_of(got: &[f64], n: usize, rows: &[usize]) -> Vec<f64> {
    rows.iter().flat_map(|&i| got[i * n..(i + 1) * n].to_vec()).collect()
}

/// [`gemm_bias_gelu`] on random `[m, k]`, `[k, n]` operands and `[n]` bias of dtype `dt`
/// (seeds 1, 2, 3) into a NaN-poisoned output: the launch, and the relative error of
/// the whole output against the float64 reference.
pub fn bias_gelu_error(m: usize, n: usize, k: usize, dt: DType, dev: &Device) -> (kfuse::Launched, f64) {
    let rows: Vec<usize> = (0..m).collect();
    bias_gelu_error_rows(m, n, k, dt, dev, &rows)
}

/// [`bias_gelu_error`] measured on the output rows `rows` only (the float64 reference
/// of every row of the large shapes would take minutes: pass [`sample_rows`]).
pub fn bias_gelu_error_rows(m: usize, n: usize, k: usize, dt: DType, dev: &Device, rows: &[usize]) -> (kfuse::Launched, f64) {
    let (a, av) = super::random_tensor(&[m, k], dt, 1, 0.05, dev);
    let (b, bv) = super::random_tensor(&[k, n], dt, 2, 0.05, dev);
    let (bias, biasv) = super::random_tensor(&[n], dt, 3, 0.05, dev);
    let mut out = super::poisoned(&[m, n], dt, dev);
    let l = gemm_bias_gelu(&a, &b, &bias, &mut out).unwrap();
    let mut want = reference_rows(&av, &bv, k, n, rows);
    for (x, idx) in want.iter_mut().zip(0..) {
        let v = *x + biasv[idx % n];
        *x = 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2));
    }
    (l, super::rel_err(&rows_of(&out.to_vec_f64().unwrap(), n, rows), &want))
}

/// `Ok(e)` when the relative error `e` is within `tol`, else the failure for case `what`.
pub fn within(what: &str, e: f64, tol: f64) -> Result<f64, String> {
    if e <= tol {
        Ok(e)
    } else {
        Err(format!("{what}: relative error {e:.3e} > {tol:.0e}"))
    }
}

/// The outcomes of a table of cases: a report line for each that passed, the message of
/// each that failed.
#[derive(Default)]
pub struct Outcomes {
    report: Vec<String>,
    failures: Vec<String>,
}

impl Outcomes {
    /// Case `what`: its relative error, or why it failed.
    pub fn add(&mut self, what: impl std::fmt::Display, r: Result<f64, String>) {
        match r {
            Ok(e) => self.report.push(format!("{what}: rel err {e:.2e}")),
            Err(e) => self.failures.push(e),
        }
    }

    /// Prints the report; fails with every failure, if any.
    pub fn finish(self) {
        println!("{}", self.report.join("\n"));
        assert!(self.failures.is_empty(), "{}", self.failures.join("\n"));
    }
}

/// The bound on ‖out − ref‖/‖ref‖ of a matrix product rounded to `dt` (f32
/// accumulation): 1e-5 for f32, 1e-2 for 16-bit results.
pub fn product_tol(dt: kfuse::DType) -> f64 {
    match dt {
        kfuse::DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

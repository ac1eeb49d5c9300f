//! The macro's output, run: `build` of each kernel is printed with `kfuse_ir::print`
//! and pinned with insta (`tests/snapshots/`), the `DEF`s are checked field by field,
//! and the wrappers are called against a fake runtime (`support/fake_kfuse.rs`).

use kfuse_ir::{print::print, DType, DTypeSig, IrError, ParamSig};
use kfuse_macros::kfuse;

include!("support/fake_kfuse.rs");
use fake::runtime::{Launched, Tensor};

fn ir(def: &kfuse_ir::KernelDef, dtypes: &[DType]) -> String {
    let k = (def.build)(dtypes).unwrap_or_else(|e| panic!("build {}: {e}", def.name));
    kfuse_ir::grid::derive(&k).unwrap();
    print(&k)
}

/// Adds two vectors.
#[kfuse(crate = "crate::fake")]
pub fn add<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let x = a.block([i * BN], [BN]).load();
    let y = b.block([i * BN], [BN]).load();
    out.block([i * BN], [BN]).store(x + y);
}

#[kfuse(crate = "crate::fake")]
pub fn transpose<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (N, M)>) {
    let (i, j) = (program_id(0), program_id(1));
    let t = x.block([i * BM, j * BN], [BM, BN]).load();
    out.block([j * BN, i * BM], [BN, BM]).store(t.t());
}

#[kfuse(crate = "crate::fake")]
pub fn rmsnorm<T: Float>(x: Tensor<T, (M, N)>, w: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>, eps: f32) {
    let row = program_id(0);
    let xr = x.row(row).load().to_f32();
    let r = rsqrt((xr * xr).mean() + eps);
    out.row(row).store((xr * r * w.load().to_f32()).cast::<T>());
}

#[kfuse(crate = "crate::fake")]
pub fn softmax<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let row = program_id(0);
    let v = x.row(row).load().to_f32();
    let e = (v - v.max()).exp();
    out.row(row).store((e / e.sum()).cast::<T>());
}

/// `let mut` and compound assignment rebind SSA values.
#[kfuse(crate = "crate::fake")]
pub fn accumulate<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<f32, (N,)>, s: f32) {
    let i = program_id(0);
    let mut acc = a.block([i * BN], [BN]).load().to_f32();
    acc += b.block([i * BN], [BN]).load().to_f32();
    acc *= s;
    acc -= 1;
    acc /= 2.0;
    acc = acc.abs();
    out.block([i * BN], [BN]).store(acc);
}

/// Weak literals take the dtype of their operand (here bf16), negative ones too.
#[kfuse(crate = "crate::fake")]
pub fn literals<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let v = x.block([i * 128], [128]).load();
    let w = v * 2 + 0.5 - -1.25;
    out.block([i * 128], [128]).store(max(w, 0.0).min(6.0));
}

#[kfuse(crate = "crate::fake")]
pub fn select_cmp<T: Float>(x: Tensor<T, (N,)>, y: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, lo: f32) {
    let i = program_id(0);
    let a = x.block([i * BN], [BN]).load();
    let b = y.block([i * BN], [BN]).load();
    let inside = (a.to_f32() >= lo) && !(a == b) || a < 0.0;
    out.block([i * BN], [BN]).store(select(inside, a, b * -0.5));
}

/// Reductions along chosen axes, with and without keeping them; permutes; shape
/// symbols as `Full` extents; `i64` scalars in index arithmetic.
#[kfuse(crate = "crate::fake")]
pub fn reductions(x: Tensor<f32, (B, M, N)>, out: &mut Tensor<f32, (N, B)>, rows: &mut Tensor<f32, (B, M)>, stride: i64) {
    let (i, j) = (program_id(0), program_id(1));
    let t = x.block([j * BB, i * stride, 0], [BB, 4, N]).load();
    let centered = t - t.mean_keepdim(-1);
    let s = centered.sum_axis(1);
    out.block([0, j * BB], [N, BB]).store(s.t());
    let p = t.permute([2, 0, 1]).max_axis(0);
    rows.block([j * BB, i * 4], [BB, 4]).store(p + t.min_keepdim(2).sum_axis(-1));
}

/// Two generics: an input dtype and an output dtype.
#[kfuse(crate = "crate::fake")]
pub fn convert<T: Float, U: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<U, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load().cast::<U>().sigmoid());
}

/// Unary functions and methods, `ln`/`log`, `tanh`, `erf`, `sqrt`.
#[kfuse(crate = "crate::fake")]
pub fn gelu<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32();
    let g = 0.5 * v * (1.0 + erf(v * 0.70710677));
    let h = tanh(g).ln() + log(sqrt(g.exp())) + g.log().sqrt();
    out.block([i * BN], [BN]).store((g + h * 0.0).to_bf16().cast::<T>());
}

/// Index dimensions (`_`), an `i64` position tensor read as a scalar offset, `iota`,
/// `sin`/`cos` (methods and functions) and `unsqueeze`: a rotary embedding of one token.
#[kfuse(crate = "crate::fake")]
pub fn rotary<T: Float>(x: &mut Tensor<T, (S, H, R, DH)>, pos: Tensor<i64, (S,)>, base: f32) {
    let t = program_id(0);
    let p = pos.row(t).load();
    let j = iota(DH).to_f32();
    let angle = p.to_f32() * exp(j * (-2.0 * ln(base) / (2 * DH).to_f32()));
    let (c, s) = (angle.cos(), sin(angle));
    let x1 = x.block([t, 0, 0, 0], [_, H, _, DH]).load().to_f32();
    let x2 = x.block([t, 0, 1, 0], [_, H, _, DH]).load().to_f32();
    x.block([t, 0, 0, 0], [_, H, _, DH]).store((x1 * c - x2 * s).cast::<T>());
    x.block([t, 0, 1, 0], [_, H, _, DH]).store((x2 * c + x1 * s).cast::<T>());
    let ms = (x1 * x1).mean_axis(1).unsqueeze(1);
    let first = iota(4) < 2;
    x.block([t, 0, 0, 0], [_, H, _, 4]).store(select(first.unsqueeze(0), (ms * 0.0).cast::<T>(), 0.0));
}

/// A loop carrying an f32 accumulator, `zeros` and `dot`.
#[kfuse(crate = "crate::fake")]
pub fn gemm<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, c: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    c.block([i * BM, j * BN], [BM, BN]).store(acc.cast::<T>());
}

/// Nested loops carrying two values (assigned in the inner loop only, so carried by
/// both), a loop without a step, loop variables in index arithmetic, an epilogue.
#[kfuse(crate = "crate::fake")]
pub fn two_dots<T: Float>(x: Tensor<T, (M, K)>, wg: Tensor<T, (K, N)>, wu: Tensor<T, (K, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut g = zeros::<f32>([BM, BN]);
    let mut u = zeros::<f32>([BM, BN]);
    for k0 in (0..K).step_by(BK * 2) {
        for h in 0..2 {
            let k = k0 + h * BK;
            let xt = x.block([i * BM, k], [BM, BK]).load();
            g += dot(xt, wg.block([k, j * BN], [BK, BN]).load());
            u = u + dot(xt, wu.block([k, j * BN], [BK, BN]).load());
        }
    }
    out.block([i * BM, j * BN], [BM, BN]).store((g * sigmoid(g) * u).cast::<T>());
}

#[test]
fn gemm_bf16() {
    insta::assert_snapshot!(ir(&gemm::DEF, &[DType::BF16]));
}

#[test]
fn two_dots_f16() {
    insta::assert_snapshot!(ir(&two_dots::DEF, &[DType::F16]));
}

#[test]
fn add_bf16() {
    insta::assert_snapshot!(ir(&add::DEF, &[DType::BF16]));
}

#[test]
fn transpose_bf16() {
    insta::assert_snapshot!(ir(&transpose::DEF, &[DType::BF16]));
}

#[test]
fn rmsnorm_bf16() {
    insta::assert_snapshot!(ir(&rmsnorm::DEF, &[DType::BF16]));
}

#[test]
fn softmax_bf16() {
    insta::assert_snapshot!(ir(&softmax::DEF, &[DType::BF16]));
}

#[test]
fn accumulate_bf16() {
    insta::assert_snapshot!(ir(&accumulate::DEF, &[DType::BF16]));
}

#[test]
fn literals_bf16() {
    insta::assert_snapshot!(ir(&literals::DEF, &[DType::BF16]));
}

#[test]
fn select_cmp_bf16() {
    insta::assert_snapshot!(ir(&select_cmp::DEF, &[DType::BF16]));
}

#[test]
fn reductions_ir() {
    insta::assert_snapshot!(ir(&reductions::DEF, &[]));
}

#[test]
fn convert_f16_bf16() {
    insta::assert_snapshot!(ir(&convert::DEF, &[DType::F16, DType::BF16]));
}

#[test]
fn gelu_bf16() {
    insta::assert_snapshot!(ir(&gelu::DEF, &[DType::BF16]));
}

#[test]
fn rotary_bf16() {
    insta::assert_snapshot!(ir(&rotary::DEF, &[DType::BF16]));
    assert_eq!(
        rotary::DEF.params[1],
        ParamSig::Tensor { name: "pos", dtype: DTypeSig::Concrete(DType::I64), dims: &["S"], output: false }
    );
}

#[test]
fn every_kernel_builds_for_every_float() {
    let defs =
        [&add::DEF, &transpose::DEF, &rmsnorm::DEF, &softmax::DEF, &accumulate::DEF, &literals::DEF, &select_cmp::DEF, &gelu::DEF, &rotary::DEF, &gemm::DEF, &two_dots::DEF];
    for def in defs {
        for d in [DType::F32, DType::F16, DType::BF16] {
            ir(def, &[d]);
        }
    }
}

#[test]
fn build_is_deterministic() {
    assert_eq!(ir(&rmsnorm::DEF, &[DType::F16]), ir(&rmsnorm::DEF, &[DType::F16]));
}

#[test]
fn defs_describe_the_signature() {
    let d = &rmsnorm::DEF;
    assert_eq!(d.name, "rmsnorm");
    assert_eq!(d.generics, &["T"]);
    assert_eq!(
        d.params,
        &[
            ParamSig::Tensor { name: "x", dtype: DTypeSig::Generic(0), dims: &["M", "N"], output: false },
            ParamSig::Tensor { name: "w", dtype: DTypeSig::Generic(0), dims: &["N"], output: false },
            ParamSig::Tensor { name: "out", dtype: DTypeSig::Generic(0), dims: &["M", "N"], output: true },
            ParamSig::Scalar { name: "eps", dtype: DType::F32 },
        ]
    );
    let r = &reductions::DEF;
    assert!(r.generics.is_empty());
    assert_eq!(
        r.params,
        &[
            ParamSig::Tensor { name: "x", dtype: DTypeSig::Concrete(DType::F32), dims: &["B", "M", "N"], output: false },
            ParamSig::Tensor { name: "out", dtype: DTypeSig::Concrete(DType::F32), dims: &["N", "B"], output: true },
            ParamSig::Tensor { name: "rows", dtype: DTypeSig::Concrete(DType::F32), dims: &["B", "M"], output: true },
            ParamSig::Scalar { name: "stride", dtype: DType::I64 },
        ]
    );
    assert_eq!(convert::DEF.generics, &["T", "U"]);
}

#[test]
fn build_checks_its_dtypes() {
    assert_eq!(
        (add::DEF.build)(&[]).unwrap_err(),
        IrError::Expected { op: "add".into(), expected: "1 dtype (T)".into(), found: "0".into() }
    );
    assert_eq!(
        (convert::DEF.build)(&[DType::F32]).unwrap_err().to_string(),
        "`convert` expects 2 dtypes (T, U), found 1"
    );
    assert_eq!(
        (add::DEF.build)(&[DType::I64]).unwrap_err().to_string(),
        "`add` expects a float dtype (f32, f16, bf16, f8e4m3, f8e5m2) for `T`, found i64"
    );
}

#[test]
fn wrappers_launch_through_the_runtime() {
    let t = |dtype| Tensor { dtype };
    let (a, b, mut out) = (t(DType::BF16), t(DType::BF16), t(DType::BF16));
    let Launched { ir: text } = add(&a, &b, &mut out).unwrap();
    assert_eq!(text, ir(&add::DEF, &[DType::BF16]));

    let (x, w, mut o) = (t(DType::F16), t(DType::F16), t(DType::F16));
    let launched = rmsnorm(&x, &w, &mut o, 1e-6).unwrap();
    assert!(launched.ir.starts_with("kernel rmsnorm(x: f16[M, N], w: f16[N], out: &mut f16[M, N], eps: f32)"), "{}", launched.ir);

    let (x, mut o, mut r) = (t(DType::F32), t(DType::F32), t(DType::F32));
    reductions(&x, &mut o, &mut r, 4).unwrap();

    let (x, mut o) = (t(DType::BF16), t(DType::F32));
    let launched = convert(&x, &mut o).unwrap();
    assert!(launched.ir.starts_with("kernel convert(x: bf16[N], out: &mut f32[N])"), "{}", launched.ir);
}

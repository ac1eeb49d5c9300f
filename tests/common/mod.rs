//! Shared pieces of the integration tests: the table of ops, random inputs, float64
//! references, the error measure, and the specialization used for snapshots.
#![allow(dead_code)]

use kfuse::codegen::{Spec, TensorSpec};
use kfuse::ir::{KernelDef, ParamSig};
use kfuse::{DType, Device, Result, Tensor};
use rand::{Rng, SeedableRng};

pub const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

pub mod audit;
pub mod epilogue_kernels;
pub mod gemm;
pub mod isolation;
pub mod row_ops;

/// The GPU to test on, for the tests that need one. Such a test is marked
/// `#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: …")]`: ignored (counted as skipped,
/// never as passed) in an ordinary build, run in the GPU build (`scripts/gpu-build.sh`
/// builds with `--cfg kfuse_gpu`). Wherever it runs it needs the GPU: without one it
/// fails.
pub fn gpu() -> Device {
    let dev = Device::best();
    assert!(dev.is_gpu(), "this test needs a GPU and none was found (is the CUDA driver installed?)");
    dev
}

/// Whether a test on `Device::best()` must find a GPU there: in the GPU build (`--cfg
/// kfuse_gpu`) or with `KFUSE_REQUIRE_GPU=1` (the GPU host's script sets it).
pub fn gpu_required() -> bool {
    cfg!(kfuse_gpu) || std::env::var("KFUSE_REQUIRE_GPU").as_deref() == Ok("1")
}

/// How an op is called and checked.
#[derive(Clone, Copy)]
pub enum Kind {
    /// `op(&a, &b)`, elementwise.
    Binary(fn(&Tensor, &Tensor) -> Result<Tensor>, fn(f64, f64) -> f64),
    /// `op(&x)`, elementwise.
    Unary(fn(&Tensor) -> Result<Tensor>, fn(f64) -> f64),
    /// `op(&x)` on a 2-D tensor: the transpose.
    Transpose(fn(&Tensor) -> Result<Tensor>),
    /// `op(&x)` on any tensor: a copy.
    Copy(fn(&Tensor) -> Result<Tensor>),
    /// Snapshots and compile checks only; the numerics of these kernels (rows, whole-tensor
    /// reductions, softmax, norms) live in `tests/rows.rs`. The function gives the dtypes
    /// of the kernel's generics for the snapshot of dtype `dt` (`[dt]` for one generic).
    CompileOnly(fn(DType) -> Vec<DType>),
}

type Launch2 = fn(&Tensor, &Tensor, &mut Tensor) -> Result<kfuse::Launched>;
type Launch1 = fn(&Tensor, &mut Tensor) -> Result<kfuse::Launched>;

/// The kernel launcher behind an op, called with an explicit (poisoned) output.
#[derive(Clone, Copy)]
pub enum Raw {
    Two(Launch2),
    One(Launch1),
    /// A [`Kind::CompileOnly`] entry: not launched from the table.
    None,
}

pub struct OpCase {
    pub name: &'static str,
    pub def: &'static KernelDef,
    pub kind: Kind,
    pub raw: Raw,
}

impl OpCase {
    /// The dtypes of the kernel's generics for the snapshot and compile check of `dt`.
    pub fn generics(&self, dt: DType) -> Vec<DType> {
        match self.kind {
            Kind::CompileOnly(f) => f(dt),
            _ => vec![dt],
        }
    }

    /// Whether the interpreter and GPU tests of this table check its numerics.
    pub fn numeric(&self) -> bool {
        !matches!(self.kind, Kind::CompileOnly(_))
    }
}

fn one(dt: DType) -> Vec<DType> {
    vec![dt]
}
/// A chunked whole-tensor reduction's first stage: `T` in, f32 partials out.
fn to_partials(dt: DType) -> Vec<DType> {
    vec![dt, DType::F32]
}
/// Its last stage: f32 partials in, `T` out.
fn from_partials(dt: DType) -> Vec<DType> {
    vec![DType::F32, dt]
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / 2f64.sqrt()))
}
fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}
fn scale_ref(x: f64) -> f64 {
    x * SCALE as f64
}
pub const SCALE: f32 = 1.7;
fn scale_op(x: &Tensor) -> Result<Tensor> {
    kfuse::ops::scale(x, SCALE)
}
fn scale_raw(x: &Tensor, out: &mut Tensor) -> Result<kfuse::Launched> {
    kfuse::ops::kernels::scale(x, out, SCALE)
}

/// Every op of `kfuse::ops`, with the kernel behind it and its float64 reference.
pub fn ops() -> Vec<OpCase> {
    use kfuse::ops as o;
    use kfuse::ops::kernels as k;
    vec![
        OpCase { name: "add", def: &k::add::DEF, kind: Kind::Binary(o::add, |a, b| a + b), raw: Raw::Two(k::add) },
        OpCase { name: "sub", def: &k::sub::DEF, kind: Kind::Binary(o::sub, |a, b| a - b), raw: Raw::Two(k::sub) },
        OpCase { name: "mul", def: &k::mul::DEF, kind: Kind::Binary(o::mul, |a, b| a * b), raw: Raw::Two(k::mul) },
        OpCase { name: "div", def: &k::div::DEF, kind: Kind::Binary(o::div, |a, b| a / b), raw: Raw::Two(k::div) },
        OpCase { name: "swiglu", def: &k::swiglu::DEF, kind: Kind::Binary(o::swiglu, |g, u| silu(g) * u), raw: Raw::Two(k::swiglu) },
        OpCase { name: "scale", def: &k::scale::DEF, kind: Kind::Unary(scale_op, scale_ref), raw: Raw::One(scale_raw) },
        OpCase { name: "silu", def: &k::silu::DEF, kind: Kind::Unary(o::silu, silu), raw: Raw::One(k::silu) },
        OpCase { name: "gelu", def: &k::gelu::DEF, kind: Kind::Unary(o::gelu, gelu), raw: Raw::One(k::gelu) },
        OpCase { name: "gelu_tanh", def: &k::gelu_tanh::DEF, kind: Kind::Unary(o::gelu_tanh, gelu_tanh), raw: Raw::One(k::gelu_tanh) },
        OpCase { name: "copy", def: &k::copy::DEF, kind: Kind::Copy(o::copy), raw: Raw::One(k::copy) },
        OpCase { name: "copy2d", def: &k::copy2d::DEF, kind: Kind::Copy(o::copy), raw: Raw::One(k::copy2d) },
        OpCase { name: "transpose", def: &k::transpose::DEF, kind: Kind::Transpose(o::transpose), raw: Raw::One(k::transpose) },
        // rows, reductions, softmax, norms: numerics in tests/rows.rs
        OpCase { name: "row_sum", def: &k::row_sum::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "row_mean", def: &k::row_mean::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "row_max", def: &k::row_max::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "row_min", def: &k::row_min::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "sum_chunks", def: &k::sum_chunks::DEF, kind: Kind::CompileOnly(to_partials), raw: Raw::None },
        OpCase { name: "sum_chunks_final", def: &k::sum_chunks::DEF, kind: Kind::CompileOnly(from_partials), raw: Raw::None },
        OpCase { name: "max_chunks", def: &k::max_chunks::DEF, kind: Kind::CompileOnly(to_partials), raw: Raw::None },
        OpCase { name: "max_chunks_final", def: &k::max_chunks::DEF, kind: Kind::CompileOnly(from_partials), raw: Raw::None },
        OpCase { name: "min_chunks", def: &k::min_chunks::DEF, kind: Kind::CompileOnly(to_partials), raw: Raw::None },
        OpCase { name: "min_chunks_final", def: &k::min_chunks::DEF, kind: Kind::CompileOnly(from_partials), raw: Raw::None },
        OpCase { name: "softmax", def: &k::softmax::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "log_softmax", def: &k::log_softmax::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "rms_norm", def: &k::rms_norm::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "rms_norm_w", def: &k::rms_norm_w::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "rms_norm_wb", def: &k::rms_norm_wb::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "add_rms_norm", def: &k::add_rms_norm::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "add_rms_norm_w", def: &k::add_rms_norm_w::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
        OpCase { name: "layer_norm", def: &k::layer_norm::DEF, kind: Kind::CompileOnly(one), raw: Raw::None },
    ]
}

/// Random values in ±`range`, kept at least `floor` away from zero (divisors).
pub fn random(n: usize, seed: u64, range: f64, floor: f64) -> Vec<f64> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let m: f64 = r.random_range(floor..range);
            if r.random_bool(0.5) { m } else { -m }
        })
        .collect()
}

/// A random tensor and its values after rounding to `dtype` (what the kernel sees).
pub fn random_tensor(shape: &[usize], dtype: DType, seed: u64, floor: f64, dev: &Device) -> (Tensor, Vec<f64>) {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = random(n, seed, 3.0, floor).into_iter().map(|x| dtype.round(x)).collect();
    (Tensor::from_f64(&v, shape, dtype, dev).expect("tensor"), v)
}

/// ‖out − ref‖ / ‖ref‖ (infinite when `out` has a NaN or the lengths differ).
pub fn rel_err(out: &[f64], reference: &[f64]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = out.iter().zip(reference).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = reference.iter().map(|b| b * b).sum();
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// ‖out − ref‖ / ‖scale‖, with `scale[i]` the size of the terms that made `ref[i]`
/// (infinite when `out` has a NaN or the lengths differ). With `scale = |ref|` this is
/// `rel_err`; with the terms' sizes it measures rounding the way it arises, so a result
/// whose terms cancel is not held to a bound its own size cannot carry.
pub fn err_against(out: &[f64], reference: &[f64], scale: &[f64]) -> f64 {
    if out.len() != reference.len() || scale.len() != reference.len() || out.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = out.iter().zip(reference).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = scale.iter().map(|s| s * s).sum();
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// The error bound for results rounded to `dtype` (one rounding plus f32 math).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 8e-3,
    }
}

/// A NaN-poisoned output tensor.
pub fn poisoned(shape: &[usize], dtype: DType, dev: &Device) -> Tensor {
    let mut t = Tensor::empty(shape, dtype, dev).expect("alloc");
    t.fill(f64::NAN).expect("poison");
    t
}

fn transposed(v: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut t = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            t[j * m + i] = v[i * n + j];
        }
    }
    t
}

/// Runs one op on `dev` with fresh random inputs of `shape`, twice: through the public
/// API (`kfuse::ops::…`) and through its kernel launcher into a NaN-poisoned output;
/// checks both against a float64 reference and returns the larger relative error.
pub fn check_op(case: &OpCase, dtype: DType, shape: &[usize], dev: &Device, seed: u64) -> std::result::Result<f64, String> {
    let ctx = |e: kfuse::Error| format!("{} {dtype} {shape:?}: {e}", case.name);
    let n: usize = shape.iter().product();
    let flat = |t: &Tensor| t.reshape(&[n]).expect("reshape");
    let (api, raw, reference) = match (case.kind, case.raw) {
        (Kind::Binary(f, r), Raw::Two(k)) => {
            let floor = if case.name == "div" { 0.25 } else { 0.0 };
            let (a, av) = random_tensor(shape, dtype, seed, 0.0, dev);
            let (b, bv) = random_tensor(shape, dtype, seed + 1, floor, dev);
            let mut out = poisoned(&[n], dtype, dev);
            k(&flat(&a), &flat(&b), &mut out).map_err(ctx)?;
            (f(&a, &b).map_err(ctx)?, out, av.iter().zip(&bv).map(|(x, y)| r(*x, *y)).collect::<Vec<_>>())
        }
        (Kind::Unary(f, r), Raw::One(k)) => {
            let (x, xv) = random_tensor(shape, dtype, seed, 0.0, dev);
            let mut out = poisoned(&[n], dtype, dev);
            k(&flat(&x), &mut out).map_err(ctx)?;
            (f(&x).map_err(ctx)?, out, xv.iter().map(|x| r(*x)).collect())
        }
        (Kind::Transpose(f), Raw::One(k)) => {
            let (x, xv) = random_tensor(shape, dtype, seed, 0.0, dev);
            let (m, nn) = (shape[0], shape[1]);
            let mut out = poisoned(&[nn, m], dtype, dev);
            k(&x, &mut out).map_err(ctx)?;
            (f(&x).map_err(ctx)?, out, transposed(&xv, m, nn))
        }
        (Kind::Copy(f), Raw::One(k)) if case.name == "copy2d" => {
            // a strided (transposed) view: the copy must honour its strides
            let (x, xv) = random_tensor(&[shape[1], shape[0]], dtype, seed, 0.0, dev);
            let view = x.t();
            let mut out = poisoned(shape, dtype, dev);
            k(&view, &mut out).map_err(ctx)?;
            (f(&view).map_err(ctx)?, out, transposed(&xv, shape[1], shape[0]))
        }
        (Kind::Copy(f), Raw::One(k)) => {
            let (x, xv) = random_tensor(shape, dtype, seed, 0.0, dev);
            let mut out = poisoned(&[n], dtype, dev);
            k(&flat(&x), &mut out).map_err(ctx)?;
            (f(&x).map_err(ctx)?, out, xv)
        }
        (Kind::CompileOnly(_), _) => return Err(format!("{}: a compile-only entry has no numeric check here (see tests/rows.rs)", case.name)),
        _ => unreachable!("op table pairs kinds and launchers"),
    };
    let reference: Vec<f64> = reference.into_iter().map(|x| dtype.round(x)).collect();
    let mut worst: f64 = 0.0;
    for (which, t) in [("api", api), ("kernel", raw)] {
        let got = t.to_vec_f64().map_err(ctx)?;
        let e = rel_err(&got, &reference);
        if !(e <= tolerance(dtype)) {
            return Err(format!("{} {dtype} {shape:?} ({which}): relative error {e:.3e} > {:.1e}", case.name, tolerance(dtype)));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// Shapes each op is checked on: odd sizes, never multiples of a tile only.
pub fn shapes(case: &OpCase, large: bool) -> Vec<Vec<usize>> {
    match case.kind {
        Kind::Transpose(_) => {
            let mut v = vec![vec![1, 1], vec![1, 1000], vec![1000, 1], vec![37, 53], vec![129, 65]];
            if large {
                v.push(vec![1000, 1003]);
            }
            v
        }
        Kind::Copy(_) if case.name == "copy2d" => vec![vec![1, 9], vec![9, 1], vec![37, 53], vec![200, 131]],
        _ => {
            let mut v = vec![vec![1], vec![7], vec![1000], vec![3, 37], vec![1, 4097], vec![4097, 1]];
            if large {
                v.push(vec![1000003]);
            }
            v
        }
    }
}

/// The dtypes a kernel is checked in: each of [`DTYPES`] for each of its generics, or one
/// pass for a kernel without generics (its build takes none).
pub fn dtypes_of(def: &KernelDef) -> &'static [DType] {
    if def.generics.is_empty() {
        &[DType::F32]
    } else {
        &DTYPES
    }
}

/// The specialization used for snapshots and compile checks: 16-byte-aligned,
/// contiguous tensors of a large shape.
pub fn snapshot_spec(def: &KernelDef) -> Spec {
    let mut shape_syms: Vec<&str> = Vec::new();
    let tensors = def
        .params
        .iter()
        .map(|p| match p {
            ParamSig::Tensor { dims, .. } => {
                for d in dims.iter() {
                    if !shape_syms.contains(d) {
                        shape_syms.push(d);
                    }
                }
                Some(TensorSpec { ptr_align: 16, stride_div: (0..dims.len()).map(|i| if i + 1 == dims.len() { 0 } else { 16 }).collect() })
            }
            ParamSig::Scalar { .. } => None,
        })
        .collect();
    let big = if shape_syms.len() == 1 { 1 << 24 } else { 4096 };
    Spec { tensors, shape_pow2: vec![big; shape_syms.len()], shape_div: vec![], tiles: Default::default(), threads: None, min_blocks: None, grouped: false, register_attempt: 0, ..Spec::default() }
}

/// The ptxas to assemble with (`kfuse::runtime::ptxas::find_ptxas`; panics with how to
/// get one when there is none).
pub fn ptxas() -> std::path::PathBuf {
    use kfuse::runtime::ptxas;
    ptxas::find_ptxas().unwrap_or_else(|| {
        panic!(
            "ptxas not found (looked at {:?}); run scripts/test.sh, which installs it, or {}",
            ptxas::ptxas_candidates(),
            ptxas::PTXAS_INSTALL_HINT
        )
    })
}

/// (registers, spill bytes) from `ptxas -v` output (`PtxasInfo::parse`; 0 and 0 when it
/// names no registers).
pub fn ptxas_resources(log: &str) -> (u32, u32) {
    kfuse::runtime::ptxas::PtxasInfo::parse(log).map_or((0, 0), |i| (i.registers, i.spill_bytes()))
}

/// An error of [`compile_assembled`]: the compiler's, NVRTC's or the assembler's, as text.
#[derive(Debug)]
pub struct BuildError(pub String);

impl From<kfuse::codegen::CodegenError> for BuildError {
    fn from(e: kfuse::codegen::CodegenError) -> Self {
        BuildError(e.to_string())
    }
}

/// Compiles `kernel` as the runtime does — the kernel's register-room attempts in turn
/// while the assembler (`ptxas -v` here, the driver's there) spills —, and returns the
/// emitted kernel taken with its registers and spill bytes.
#[allow(dead_code)]
pub fn compile_assembled(
    kernel: &kfuse::ir::Kernel,
    spec: &kfuse::codegen::Spec,
    target: &kfuse::codegen::Target,
    name: &str,
) -> std::result::Result<(kfuse::codegen::EmittedKernel, u32, u32), BuildError> {
    let e = kfuse::codegen::compile_with_fallbacks(kernel, spec, target, |e| {
        assemble(&e.source, &e.arch, &e.options, name).map(|(_, spill)| spill > 0).map_err(BuildError)
    })?;
    let (regs, spill) = assemble(&e.source, &e.arch, &e.options, name).map_err(BuildError)?;
    Ok((e, regs, spill))
}

/// Compiles CUDA source with NVRTC and assembles it with `ptxas -v`
/// (`kfuse::runtime::ptxas::assemble_with`); returns (registers, spill bytes) or the
/// failure (`name` labels it).
pub fn assemble(source: &str, arch: &str, options: &[String], name: &str) -> std::result::Result<(u32, u32), String> {
    let ptx = kfuse::runtime::nvrtc::compile_ptx(source, arch, options).map_err(|e| format!("{name}: NVRTC: {e}"))?;
    let a = kfuse::runtime::ptxas::assemble_with(&ptxas(), &ptx, arch).map_err(|e| format!("{name}: {e}"))?;
    // a serialized WGMMA pipeline (ptxas C7514 and its kin) is a silent slowdown of up
    // to several times (f16 GEMM at M127: 4.5x with 4 stages): refused like a spill
    if a.log.contains("wgmma.mma_async instructions are serialized") {
        return Err(format!("{name}: ptxas serialized the wgmma pipeline:\n{}", a.log));
    }
    Ok((a.info.registers, a.info.spill_bytes()))
}

/// Compiles each kernel of `defs` (every dtype of `DTYPES`, with `snapshot_spec`) for
/// sm_80 and sm_90a as the runtime builds it (NVRTC, then `ptxas -v`); returns the
/// failures: a compile error, or spills in a kernel marked hot (`true`). Spills of the
/// others are printed.
pub fn compile_for_both_targets(defs: &[(&KernelDef, bool)]) -> Vec<String> {
    use kfuse::codegen::Target;
    let mut failures = Vec::new();
    for &(def, hot) in defs {
        let spec = snapshot_spec(def);
        for &dt in dtypes_of(def) {
            let k = (def.build)(&vec![dt; def.generics.len()]).unwrap();
            for target in [Target::sm80(), Target::sm90a()] {
                let name = format!("{}_{dt}", def.name);
                match compile_assembled(&k, &spec, &target, &name) {
                    Ok((_, _, 0)) => {}
                    Ok((_, regs, spill)) if !hot => eprintln!("{name} {}: {spill} bytes of spills ({regs} registers)", target.arch()),
                    Ok((_, regs, spill)) => failures.push(format!("{name} {}: {spill} bytes of spills ({regs} registers)", target.arch())),
                    Err(e) => failures.push(format!("{name} {}: {}", target.arch(), e.0)),
                }
            }
        }
    }
    failures
}

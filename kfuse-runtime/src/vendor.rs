//! Vendor GEMM baselines: cuBLAS and cuBLASLt on kfuse [`Tensor`]s, in the same process
//! and on the same stream as kfuse's own kernels.
//!
//! **Benchmark and test support**, not part of kfuse's kernel path: kfuse never calls
//! these to run a user's kernel. They exist so that benchmarks (`benches/gemm.rs`) can
//! time cuBLAS beside kfuse under identical conditions and tests can check kfuse's GEMM
//! output against the vendor's.
//!
//! Owns: finding libcublas / libcublasLt ([`ensure_cublas`]), one cuBLAS and one
//! cuBLASLt handle per [`Blas`], its workspace, the row-major GEMM
//! `C[M, N] = A[M, K] · B[K, N]` ([`Blas::gemm_into`], [`Blas::gemm`]) for bf16 and f16
//! (f32 accumulation, output of the input dtype), and f32 (full fp32, or TF32 tensor
//! cores when asked with [`Math::Tf32`]), and the fp8 GEMM
//! `C[M, N] = scale_a · scale_b · (A[M, K] · B[K, N])` ([`Blas::gemm_fp8_into`],
//! [`Blas::gemm_fp8`]; see "fp8" below).
//!
//! Row-major through column-major cuBLAS: a row-major `X[r, c]` with row stride `ld` is
//! the column-major `Xᵀ[c, r]` with leading dimension `ld`, so the call computes
//! `Cᵀ = Bᵀ · Aᵀ` with `m = N, n = M, k = K` and the operands swapped. An operand may
//! also be a transposed view (unit stride on its outer dimension, e.g. `x.t()`), which
//! becomes `CUBLAS_OP_T`; `C` must have a unit inner stride.
//!
//! Finding the libraries. cudarc loads `libcublas.so` / `libcublas.so.13` (and the same
//! for cublasLt) by name, through `LD_LIBRARY_PATH` and the loader's cache. When that
//! fails, [`ensure_cublas`] looks in `$CUDA_HOME`, `$CUDA_PATH` and `/usr/local/cuda`
//! (`lib64`, `lib`, `targets/x86_64-linux/lib`) and in the pip roots `nvrtc.rs` uses,
//! and loads the files found by full path (cublasLt first, which cublas needs), so that
//! cudarc's by-name request then matches their sonames. `scripts/gpu-run.sh` also puts
//! `/usr/local/cuda/lib64` on `LD_LIBRARY_PATH`.
//!
//! fp8. A and B of dtype f8e4m3 or f8e5m2 (e4m3 × e4m3, e4m3 × e5m2, e5m2 × e4m3;
//! cuBLASLt has no e5m2 × e5m2 on Ada / Hopper, which is refused with an error), C of
//! bf16 (the main case), f16 or f32, through cuBLASLt only (`cublasGemmEx` has no fp8:
//! [`Library::Cublas`] is refused): `CUDA_R_8F_E4M3` / `CUDA_R_8F_E5M2` operands,
//! compute type `CUBLAS_COMPUTE_32F`, scale type f32, and
//! `CUBLASLT_MATMUL_DESC_FAST_ACCUM` set from the `fast_accum` argument (`false` is
//! cuBLASLt's default, which promotes the tensor cores' partial sums into f32 at
//! intervals; `true` skips that: faster, less accurate). Needs compute capability 8.9
//! or newer.
//!
//! *Layout rule.* On Ada and Hopper cuBLASLt runs fp8 only in the "TN" layout: the
//! first column-major operand transposed, the second not, i.e. both with K contiguous.
//! For row-major `C = A · B` that means `A` a row-major `[M, K]` (unit stride along K)
//! and `B` *K-major*: `w.t()` of a row-major `[N, K]` tensor `w` (a weight stored as
//! `[out, in]`), which becomes `CUBLAS_OP_T`. Any other layout is refused with
//! [`Error::InvalidArgument`] naming the layout needed; nothing is copied behind the
//! caller's back (`b.t().contiguous()?.t()` makes a K-major copy of a `[K, N]` `b`).
//! cuBLASLt's fp8 kernels also need 16-byte alignment everywhere, checked first with an
//! error saying which: K a multiple of 16, `N · size_of(C)` a multiple of 16 (N a
//! multiple of 8 for a bf16 / f16 output, of 4 for f32), the row strides of `A`, of
//! `w` and of `C` multiples of 16 bytes, and each operand's first element 16-byte aligned.
//!
//! *Scales.* The per-tensor scales are folded into cuBLASLt's `alpha`
//! (`alpha = scale_a · scale_b`, host f32, `beta = 0`) rather than passed through
//! `CUBLASLT_MATMUL_DESC_A_SCALE_POINTER` / `B_SCALE_POINTER`. cuBLASLt computes
//! `D = alpha · scale_a · scale_b · (A · B)` on the f32 accumulator either way, so the
//! result is the same (up to the rounding of the one f32 product of the scales), while
//! the scale pointers would need device f32 scalars written before every call: an extra
//! host-to-device copy on the stream inside a benchmark's timed region, or a device
//! buffer whose contents the caller must manage.
//!
//! The cuBLASLt plan cache keys on the whole problem: sizes, operand layouts, the three
//! dtypes, [`Math`] and `fast_accum` (not on the scales, which are per call).

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use cudarc::cublas::sys as cb;
use cudarc::cublaslt::sys as lt;
use cudarc::driver::{CudaSlice, DevicePtr};
use kfuse_ir::DType;

use crate::device::{panic_text, Device};
use crate::error::{driver, Error, Result};
use crate::tensor::Tensor;

/// Which library runs a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    /// `cublasGemmEx` (its own heuristics; default algorithm).
    Cublas,
    /// `cublasLtMatmul` with the first algorithm `cublasLtMatmulAlgoGetHeuristic` offers
    /// for the workspace given.
    CublasLt,
}

/// How f32 inputs are multiplied (no effect on bf16 / f16, which always accumulate in f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Math {
    /// Full fp32 (`CUBLAS_COMPUTE_32F`, no TF32).
    #[default]
    Fp32,
    /// TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    Tf32,
}

/// Workspace given to cuBLAS and cuBLASLt: 32 MiB, NVIDIA's recommendation for Hopper.
pub const WORKSPACE_BYTES: usize = 32 << 20;

// ---------------------------------------------------------------------------------------
// finding the libraries

fn lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(p) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&p).filter(|d| !d.as_os_str().is_empty()));
    }
    let mut roots: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"].iter().filter_map(std::env::var_os).filter(|p| !p.is_empty()).map(PathBuf::from).collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    for r in roots {
        dirs.push(r.join("lib64"));
        dirs.push(r.join("lib"));
        dirs.push(r.join("targets/x86_64-linux/lib"));
    }
    for d in crate::nvrtc::nvrtc_search_dirs() {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Loads `libNAME.so.13` (or `libNAME.so`) from the first directory of `dirs` holding
/// it, by full path, for the life of the process.
fn preload(name: &str, dirs: &[PathBuf], tried: &mut Vec<String>) -> bool {
    for d in dirs {
        for file in [format!("lib{name}.so.13"), format!("lib{name}.so")] {
            let p = d.join(&file);
            if !p.is_file() {
                tried.push(p.display().to_string());
                continue;
            }
            // SAFETY: loading the library runs its initializers, as cudarc's own load would.
            match unsafe { libloading::Library::new(&p) } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    return true;
                }
                Err(e) => tried.push(format!("{} (found but failed to load: {e})", p.display())),
            }
        }
    }
    false
}

fn present() -> bool {
    crate::device::library_loadable("cublas") && crate::device::library_loadable("cublasLt")
}

/// Makes libcublas and libcublasLt loadable for cudarc (see the module docs); the
/// search runs once per process. Fails with [`Error::Vendor`] listing what was tried.
pub fn ensure_cublas() -> Result<()> {
    static STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATE
        .get_or_init(|| {
            if present() {
                return Ok(());
            }
            let dirs = lib_dirs();
            let mut tried = Vec::new();
            preload("cublasLt", &dirs, &mut tried);
            preload("cublas", &dirs, &mut tried);
            if present() {
                return Ok(());
            }
            Err(format!(
                "libcublas.so.13 / libcublasLt.so.13 could not be loaded: not found by name through the dynamic loader \
                 (LD_LIBRARY_PATH={}), nor at: {}. Put the CUDA toolkit's lib64 on LD_LIBRARY_PATH \
                 (e.g. export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH) or set CUDA_HOME",
                std::env::var("LD_LIBRARY_PATH").unwrap_or_default(),
                tried.join(", ")
            ))
        })
        .clone()
        .map_err(Error::Vendor)
}

// ---------------------------------------------------------------------------------------
// status codes

fn cublas_ok(what: &str, s: cb::cublasStatus_t) -> Result<()> {
    if s == cb::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: returns a static string for any status.
    let text = unsafe { std::ffi::CStr::from_ptr(cb::cublasGetStatusString(s)) }.to_string_lossy().into_owned();
    Err(Error::Vendor(format!("{what}: {s:?} ({text})")))
}

fn lt_ok(what: &str, s: lt::cublasStatus_t) -> Result<()> {
    if s == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: as above.
    let text = unsafe { std::ffi::CStr::from_ptr(lt::cublasLtGetStatusString(s)) }.to_string_lossy().into_owned();
    Err(Error::Vendor(format!("{what}: {s:?} ({text})")))
}

/// Runs a vendor call, turning a panic (a symbol missing from the library) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| Err(Error::Vendor(format!("{what}: {}", panic_text(&p)))))
}

// ---------------------------------------------------------------------------------------
// the problem, in cuBLAS's column-major terms

/// One operand as cuBLAS sees it: transposed or not, and its leading dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Operand {
    trans: bool,
    ld: i64,
}

/// `C[M, N] = A[M, K] · B[K, N]` mapped onto column-major `Cᵀ = op(B') · op(A')`
/// (module docs): sizes, operands, `ldc`, dtypes and options. The key of the cuBLASLt
/// plan cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Problem {
    m: i64,
    n: i64,
    k: i64,
    /// The first cuBLAS operand: our `B`.
    first: Operand,
    /// The second cuBLAS operand: our `A`.
    second: Operand,
    ldc: i64,
    /// Element types of our `A`, `B` and `C` (all three equal outside fp8).
    a_dtype: DType,
    b_dtype: DType,
    c_dtype: DType,
    math: Math,
    /// fp8 only: `CUBLASLT_MATMUL_DESC_FAST_ACCUM` (false: cuBLASLt's default).
    fast_accum: bool,
}

/// `t` seen as a cuBLAS operand with the given orientation, if its strides allow it:
/// not transposed needs a unit inner stride (leading dimension = row stride), transposed
/// a unit outer stride (a transposed view, e.g. `x.t()`). Dimensions of extent 1 may
/// have any stride.
fn operand_as(t: &Tensor, trans: bool) -> Option<Operand> {
    let (r, c) = (t.shape()[0] as i64, t.shape()[1] as i64);
    let (s0, s1) = (t.strides()[0] as i64, t.strides()[1] as i64);
    let (ld, ok) = if trans {
        (if c == 1 { s1.max(r) } else { s1 }, s0 == 1 || r == 1)
    } else {
        (if r == 1 { s0.max(c) } else { s0 }, s1 == 1 || c == 1)
    };
    let rows = if trans { r } else { c };
    (ok && ld >= rows.max(1)).then_some(Operand { trans, ld })
}

/// A row-major `[rows, cols]` operand: not transposed where its strides allow
/// ([`operand_as`]), else transposed.
fn operand(what: &str, t: &Tensor) -> Result<Operand> {
    operand_as(t, false)
        .or_else(|| operand_as(t, true))
        .ok_or_else(|| Error::NonContiguous { what: format!("a cuBLAS GEMM operand ({what})"), shape: t.shape().to_vec(), strides: t.strides().to_vec() })
}

/// Ranks and shapes of `C[M, N] = A[M, K] · B[K, N]`; returns `(M, K, N)`.
fn shapes(a: &Tensor, b: &Tensor, c: &Tensor) -> Result<(usize, usize, usize)> {
    for (n, t) in [("A", a), ("B", b), ("C", c)] {
        if t.rank() != 2 {
            return Err(Error::ShapeMismatch(format!("vendor GEMM: {n} must be a matrix, but it has shape {:?}", t.shape())));
        }
    }
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    if b.shape()[0] != k || c.shape() != [m, n] {
        return Err(Error::ShapeMismatch(format!(
            "vendor GEMM: C[M, N] = A[M, K] · B[K, N], but A is {:?}, B is {:?} and C is {:?}",
            a.shape(),
            b.shape(),
            c.shape()
        )));
    }
    Ok((m, k, n))
}

/// All three tensors on one GPU, and sizes fitting cuBLAS's `int`s.
fn on_one_gpu(a: &Tensor, b: &Tensor, c: &Tensor, (m, k, n): (usize, usize, usize)) -> Result<()> {
    if a.device() != b.device() || a.device() != c.device() || !a.device().is_gpu() {
        return Err(Error::DeviceMismatch(format!("vendor GEMM runs on a GPU: A is on {}, B on {}, C on {}", a.device(), b.device(), c.device())));
    }
    if [m, n, k].iter().any(|&x| x > i32::MAX as usize) {
        return Err(Error::InvalidArgument(format!("vendor GEMM: M={m} N={n} K={k} exceeds cuBLAS's 32-bit sizes")));
    }
    Ok(())
}

/// `ldc` of an output `C[M, N]`: a unit inner stride (or a single row or column).
fn output_ld(c: &Tensor) -> Result<i64> {
    let (m, n) = (c.shape()[0], c.shape()[1]);
    let cl = operand("C", c)?;
    if cl.trans && m > 1 && n > 1 {
        return Err(Error::NonContiguous { what: "the output of a cuBLAS GEMM (C)".into(), shape: c.shape().to_vec(), strides: c.strides().to_vec() });
    }
    Ok(if cl.trans { n.max(1) as i64 } else { cl.ld })
}

/// The dtypes cuBLASLt's fp8 GEMM takes (module docs): fp8 `A` and `B`, not both
/// e5m2, and a bf16, f16 or f32 `C`.
fn fp8_dtypes(a: DType, b: DType, c: DType) -> Result<()> {
    if !a.is_fp8() || !b.is_fp8() {
        return Err(Error::DTypeMismatch(format!("vendor fp8 GEMM: A and B must be f8e4m3 or f8e5m2, but A is {a} and B is {b}")));
    }
    if a == DType::F8E5M2 && b == DType::F8E5M2 {
        return Err(Error::InvalidArgument(
            "vendor fp8 GEMM: cuBLASLt has no f8e5m2 × f8e5m2 GEMM; make A or B f8e4m3 \
             (f8e4m3 × f8e4m3, f8e4m3 × f8e5m2 and f8e5m2 × f8e4m3 are supported)"
                .into(),
        ));
    }
    if !matches!(c, DType::BF16 | DType::F16 | DType::F32) {
        return Err(Error::InvalidArgument(format!("vendor fp8 GEMM: C is {c}, but the output of an fp8 GEMM must be bf16, f16 or f32")));
    }
    Ok(())
}

/// The "TN" layout and 16-byte alignments cuBLASLt's fp8 GEMMs need (module docs):
/// checks `a`, `b`, `c` (of matching shapes) and returns the first cuBLAS operand (our
/// `B`, transposed), the second (our `A`, not transposed) and `ldc`. Never copies.
fn fp8_layout(a: &Tensor, b: &Tensor, c: &Tensor) -> Result<(Operand, Operand, i64)> {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let bad = |msg: String| Error::InvalidArgument(format!("vendor fp8 GEMM: {msg}"));
    let second = operand_as(a, false).ok_or_else(|| {
        bad(format!(
            "A[M, K] must be row-major with K contiguous (unit stride along K), as cuBLASLt runs fp8 only in the \"TN\" layout, \
             but A has shape {:?} and strides {:?}; pass a packed [M, K] tensor (`a.contiguous()?` makes one)",
            a.shape(),
            a.strides()
        ))
    })?;
    let first = operand_as(b, true).ok_or_else(|| {
        bad(format!(
            "B[K, N] must be K-major, `w.t()` of a row-major [N, K] tensor `w` (unit stride along K), as cuBLASLt runs fp8 only \
             in the \"TN\" layout, but B has shape {:?} and strides {:?}; store the weight as [N, K] \
             (`b.t().contiguous()?.t()` makes a K-major copy of a [K, N] `b`)",
            b.shape(),
            b.strides()
        ))
    })?;
    let ldc = output_ld(c)?;
    let cs = c.dtype().size_bytes();
    if !k.is_multiple_of(16) {
        return Err(bad(format!("K = {k} must be a multiple of 16 (cuBLASLt's fp8 kernels read 16-byte-aligned rows of A and of B's [N, K] storage)")));
    }
    if m > 0 && !(n * cs).is_multiple_of(16) {
        return Err(bad(format!(
            "N = {n} must be a multiple of {} for a {} output (cuBLASLt's fp8 kernels need 16-byte rows of C)",
            16 / cs,
            c.dtype()
        )));
    }
    // leading dimensions in bytes (irrelevant where a matrix has a single row, or no K)
    let lds = [("A (its row stride)", second.ld as usize, m > 1 && k > 0), ("B (the row stride of its [N, K] storage)", first.ld as usize, n > 1 && k > 0), ("C (its row stride)", ldc as usize * cs, m > 1)];
    for (what, ld, matters) in lds {
        if matters && !ld.is_multiple_of(16) {
            return Err(bad(format!("the leading dimension of {what} is {ld} bytes; cuBLASLt's fp8 kernels need a multiple of 16")));
        }
    }
    for (what, t) in [("A", a), ("B", b), ("C", c)] {
        // the device address; on the CPU (argument checks only) the offset into the storage
        let addr = t.device_ptr().unwrap_or(t.byte_offset() as u64);
        if !addr.is_multiple_of(16) {
            return Err(bad(format!("{what} starts at byte offset {} of its storage; cuBLASLt's fp8 kernels need 16-byte-aligned operands", t.byte_offset())));
        }
    }
    Ok((first, second, ldc))
}

impl Problem {
    /// Checks `a`, `b`, `c` (ranks, shapes, dtypes, devices, layouts) for a bf16, f16 or
    /// f32 GEMM and maps them.
    pub(crate) fn new(a: &Tensor, b: &Tensor, c: &Tensor, math: Math) -> Result<Problem> {
        let mkn = shapes(a, b, c)?;
        let (m, k, n) = mkn;
        let dtype = a.dtype();
        if b.dtype() != dtype || c.dtype() != dtype {
            return Err(Error::DTypeMismatch(format!("vendor GEMM: A is {dtype}, B is {}, C is {}; they must match", b.dtype(), c.dtype())));
        }
        if !matches!(dtype, DType::BF16 | DType::F16 | DType::F32) {
            let hint = if dtype.is_fp8() { "; fp8 runs through cuBLASLt (`Blas::gemm_fp8_into`) with a bf16, f16 or f32 output" } else { "" };
            return Err(Error::InvalidArgument(format!("vendor GEMM: {dtype} is not supported (bf16, f16, f32){hint}")));
        }
        on_one_gpu(a, b, c, mkn)?;
        let first = operand("B", b)?;
        let second = operand("A", a)?;
        let ldc = output_ld(c)?;
        let pr = Problem { m: n as i64, n: m as i64, k: k as i64, first, second, ldc, a_dtype: dtype, b_dtype: dtype, c_dtype: dtype, math, fast_accum: false };
        pr.check_ld()?;
        Ok(pr)
    }

    /// Checks `a`, `b`, `c` for an fp8 GEMM (shapes, [`fp8_dtypes`], devices,
    /// [`fp8_layout`]) and maps them.
    pub(crate) fn fp8(a: &Tensor, b: &Tensor, c: &Tensor, fast_accum: bool) -> Result<Problem> {
        let mkn = shapes(a, b, c)?;
        let (m, k, n) = mkn;
        fp8_dtypes(a.dtype(), b.dtype(), c.dtype())?;
        on_one_gpu(a, b, c, mkn)?;
        let (first, second, ldc) = fp8_layout(a, b, c)?;
        let pr = Problem {
            m: n as i64,
            n: m as i64,
            k: k as i64,
            first,
            second,
            ldc,
            a_dtype: a.dtype(),
            b_dtype: b.dtype(),
            c_dtype: c.dtype(),
            math: Math::Fp32,
            fast_accum,
        };
        pr.check_ld()?;
        Ok(pr)
    }

    /// cuBLAS wants every leading dimension ≥ the stored rows and fitting an `int`.
    fn check_ld(&self) -> Result<()> {
        // stored (column-major) rows of each operand
        let first_rows = if self.first.trans { self.k } else { self.m };
        let second_rows = if self.second.trans { self.n } else { self.k };
        for (what, ld, rows) in [("B", self.first.ld, first_rows), ("A", self.second.ld, second_rows), ("C", self.ldc, self.m)] {
            if ld < rows.max(1) || ld > i32::MAX as i64 {
                return Err(Error::InvalidArgument(format!("vendor GEMM: {what} has a leading dimension of {ld} for {rows} rows")));
            }
        }
        Ok(())
    }

    fn is_fp8(&self) -> bool {
        self.a_dtype.is_fp8()
    }

    /// The one dtype of a non-fp8 problem, as `cublasGemmEx` names it.
    fn data_type(&self) -> cb::cudaDataType {
        match self.c_dtype {
            DType::BF16 => cb::cudaDataType::CUDA_R_16BF,
            DType::F16 => cb::cudaDataType::CUDA_R_16F,
            _ => cb::cudaDataType::CUDA_R_32F,
        }
    }

    fn tf32(&self) -> bool {
        self.c_dtype == DType::F32 && self.math == Math::Tf32
    }
}

/// An element type as cuBLASLt names it (the dtypes [`Problem`] admits).
fn lt_type(d: DType) -> lt::cudaDataType {
    match d {
        DType::BF16 => lt::cudaDataType::CUDA_R_16BF,
        DType::F16 => lt::cudaDataType::CUDA_R_16F,
        DType::F8E4M3 => lt::cudaDataType::CUDA_R_8F_E4M3,
        DType::F8E5M2 => lt::cudaDataType::CUDA_R_8F_E5M2,
        _ => lt::cudaDataType::CUDA_R_32F,
    }
}

// ---------------------------------------------------------------------------------------
// handles

/// A cuBLASLt plan for one [`Problem`]: descriptors and the algorithm the heuristic chose.
struct LtPlan {
    desc: lt::cublasLtMatmulDesc_t,
    first: lt::cublasLtMatrixLayout_t,
    second: lt::cublasLtMatrixLayout_t,
    c: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    workspace: usize,
}

impl Drop for LtPlan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by this plan and is destroyed once; errors
        // cannot be reported from a drop.
        unsafe {
            let _ = lt::cublasLtMatrixLayoutDestroy(self.c);
            let _ = lt::cublasLtMatrixLayoutDestroy(self.second);
            let _ = lt::cublasLtMatrixLayoutDestroy(self.first);
            let _ = lt::cublasLtMatmulDescDestroy(self.desc);
        }
    }
}

/// cuBLAS and cuBLASLt handles bound to one GPU's stream (the stream all of kfuse's work
/// on that GPU goes to), a shared workspace, and cuBLASLt plans by problem. One per
/// thread: it is `Send` but not `Sync` (cuBLAS handles are not to be used from two
/// threads at once).
///
/// # Examples
///
/// ```no_run
/// use kfuse_runtime::vendor::{Blas, Library, Math};
/// use kfuse_runtime::{DType, Device, Tensor};
///
/// let dev = Device::gpu(0)?;
/// let a = Tensor::full(&[256, 128], 1.0, DType::BF16, &dev)?;
/// let b = Tensor::full(&[128, 64], 0.5, DType::BF16, &dev)?;
/// let blas = Blas::new(&dev)?;
/// let c = blas.gemm(&a, &b, Library::Cublas, Math::default())?; // [256, 64], bf16
/// assert_eq!(c.to_vec_f32()?[0], 64.0);
/// # Ok::<(), kfuse_runtime::Error>(())
/// ```
pub struct Blas {
    device: Device,
    handle: cb::cublasHandle_t,
    lt: lt::cublasLtHandle_t,
    /// The workspace's memory, kept alive as long as the handles that use it.
    _workspace: CudaSlice<u8>,
    workspace_ptr: u64,
    plans: Mutex<HashMap<Problem, LtPlan>>,
}

// SAFETY: the handles may move between threads (cuBLAS allows it when the context is
// bound, which every call here does first); `Blas` is not `Sync`.
unsafe impl Send for Blas {}

impl Blas {
    /// Handles for `device` (a GPU), with [`WORKSPACE_BYTES`] of workspace.
    pub fn new(device: &Device) -> Result<Blas> {
        let gpu = device.gpu_ref().ok_or_else(|| Error::InvalidArgument("cuBLAS runs on a GPU; this device is the CPU".into()))?;
        ensure_cublas()?;
        gpu.bind()?;
        // SAFETY: uninitialized scratch memory, only ever written by cuBLAS.
        let workspace = unsafe { gpu.stream.alloc::<u8>(WORKSPACE_BYTES) }.map_err(driver("allocating the cuBLAS workspace"))?;
        let workspace_ptr = {
            let (p, _rec) = workspace.device_ptr(&gpu.stream);
            p
        };
        guarded("creating cuBLAS handles", || {
            let mut handle: cb::cublasHandle_t = std::ptr::null_mut();
            let mut lth: lt::cublasLtHandle_t = std::ptr::null_mut();
            // SAFETY: out-pointers to locals; the stream belongs to the bound context; the
            // workspace is a live allocation of WORKSPACE_BYTES on it.
            unsafe {
                cublas_ok("cublasCreate", cb::cublasCreate_v2(&mut handle))?;
                // from here on, an error drops `blas`, which destroys what was created
                let mut blas = Blas { device: device.clone(), handle, lt: std::ptr::null_mut(), _workspace: workspace, workspace_ptr, plans: Mutex::default() };
                cublas_ok("cublasSetStream", cb::cublasSetStream_v2(handle, gpu.stream.cu_stream() as cb::cudaStream_t))?;
                cublas_ok("cublasSetWorkspace", cb::cublasSetWorkspace_v2(handle, workspace_ptr as *mut c_void, WORKSPACE_BYTES))?;
                lt_ok("cublasLtCreate", lt::cublasLtCreate(&mut lth))?;
                blas.lt = lth;
                Ok(blas)
            }
        })
    }

    /// The device this runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// `C = A · B` into a new tensor (see [`Blas::gemm_into`]). `C` has the dtype of the
    /// operands, except for fp8 operands, which give a bf16 `C`.
    pub fn gemm(&self, a: &Tensor, b: &Tensor, lib: Library, math: Math) -> Result<Tensor> {
        if a.rank() != 2 || b.rank() != 2 {
            return Err(Error::ShapeMismatch(format!("vendor GEMM: A {:?} and B {:?} must be matrices", a.shape(), b.shape())));
        }
        let out = if a.dtype().is_fp8() { DType::BF16 } else { a.dtype() };
        let mut c = Tensor::empty(&[a.shape()[0], b.shape()[1]], out, &a.device())?;
        self.gemm_into(a, b, &mut c, lib, math)?;
        Ok(c)
    }

    /// Row-major `C[M, N] = A[M, K] · B[K, N]` (overwriting `C`) with `lib`, queued on
    /// the device's stream like a kfuse launch. bf16 and f16 accumulate in f32; f32 uses
    /// `math`. Shapes, dtypes, devices and layouts are checked first (module docs).
    ///
    /// fp8 operands (either of `A`, `B`) go to [`Blas::gemm_fp8_into`] with unit scales and
    /// cuBLASLt's default accumulation (`math` has no effect): with
    /// [`Library::CublasLt`] only, as `cublasGemmEx` has no fp8.
    pub fn gemm_into(&self, a: &Tensor, b: &Tensor, c: &mut Tensor, lib: Library, math: Math) -> Result<()> {
        if a.dtype().is_fp8() || b.dtype().is_fp8() {
            return match lib {
                Library::CublasLt => self.gemm_fp8_into(a, b, c, 1.0, 1.0, false),
                Library::Cublas => Err(Error::InvalidArgument(format!(
                    "vendor GEMM: {} × {} runs through cuBLASLt only (Library::CublasLt); cublasGemmEx has no fp8",
                    a.dtype(),
                    b.dtype()
                ))),
            };
        }
        let p = Problem::new(a, b, c, math)?;
        self.check_device(a)?;
        if p.m == 0 || p.n == 0 {
            return Ok(());
        }
        let gpu = self.device.gpu_ref().expect("a GPU");
        gpu.bind()?;
        let ptrs = (b.address(), a.address(), c.address());
        match lib {
            Library::Cublas => self.gemm_ex(&p, ptrs),
            Library::CublasLt => self.gemm_lt(&p, ptrs, 1.0, gpu.stream.cu_stream() as lt::cudaStream_t),
        }
    }

    /// fp8 `C = scale_a · scale_b · (A · B)` into a new tensor of dtype `out` (bf16, f16
    /// or f32); see [`Blas::gemm_fp8_into`].
    pub fn gemm_fp8(&self, a: &Tensor, b: &Tensor, out: DType, scale_a: f32, scale_b: f32, fast_accum: bool) -> Result<Tensor> {
        if a.rank() != 2 || b.rank() != 2 {
            return Err(Error::ShapeMismatch(format!("vendor fp8 GEMM: A {:?} and B {:?} must be matrices", a.shape(), b.shape())));
        }
        // checked before allocating, so that an fp8 or integer `out` is refused as such
        fp8_dtypes(a.dtype(), b.dtype(), out)?;
        let mut c = Tensor::empty(&[a.shape()[0], b.shape()[1]], out, &a.device())?;
        self.gemm_fp8_into(a, b, &mut c, scale_a, scale_b, fast_accum)?;
        Ok(c)
    }

    /// Row-major fp8 `C[M, N] = scale_a · scale_b · (A[M, K] · B[K, N])` (overwriting
    /// `C`) through cuBLASLt, queued on the device's stream, f32 accumulation.
    ///
    /// `A`, `B`: f8e4m3 or f8e5m2, not both e5m2; `C`: bf16, f16 or f32. Layout ("TN"):
    /// `A` row-major `[M, K]`, `B` K-major (`w.t()` of a row-major `[N, K]` `w`), with the
    /// 16-byte alignments of the module docs (K a multiple of 16, …); anything else is
    /// refused with [`Error::InvalidArgument`] before cuBLASLt is called. The scales are
    /// per tensor (dequantization factors: the real `A` is `scale_a · A`), folded into
    /// `alpha`. `fast_accum` sets `CUBLASLT_MATMUL_DESC_FAST_ACCUM` (`false`: cuBLASLt's
    /// default, more accurate; `true`: faster). Needs compute capability 8.9+.
    pub fn gemm_fp8_into(&self, a: &Tensor, b: &Tensor, c: &mut Tensor, scale_a: f32, scale_b: f32, fast_accum: bool) -> Result<()> {
        let p = Problem::fp8(a, b, c, fast_accum)?;
        self.check_device(a)?;
        if let Some(cc) = self.device.compute_capability() {
            if cc < (8, 9) {
                return Err(Error::Vendor(format!(
                    "cuBLASLt's fp8 GEMMs need compute capability 8.9 or newer (Ada, Hopper, Blackwell); {} is sm_{}{}",
                    self.device.description(),
                    cc.0,
                    cc.1
                )));
            }
        }
        if p.m == 0 || p.n == 0 {
            return Ok(());
        }
        if p.k == 0 {
            // an empty sum: nothing for cuBLASLt to read
            return c.fill(0.0);
        }
        let gpu = self.device.gpu_ref().expect("a GPU");
        gpu.bind()?;
        let ptrs = (b.address(), a.address(), c.address());
        self.gemm_lt(&p, ptrs, scale_a * scale_b, gpu.stream.cu_stream() as lt::cudaStream_t)
    }

    fn check_device(&self, a: &Tensor) -> Result<()> {
        if a.device() != self.device {
            return Err(Error::DeviceMismatch(format!("vendor GEMM: the tensors are on {} but this cuBLAS handle is for {}", a.device(), self.device)));
        }
        Ok(())
    }

    fn gemm_ex(&self, p: &Problem, (first, second, c): (u64, u64, u64)) -> Result<()> {
        let op = |t: bool| if t { cb::cublasOperation_t::CUBLAS_OP_T } else { cb::cublasOperation_t::CUBLAS_OP_N };
        let compute = if p.tf32() { cb::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32 } else { cb::cublasComputeType_t::CUBLAS_COMPUTE_32F };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ty = p.data_type();
        guarded("cublasGemmEx", || {
            // SAFETY: the pointers are live allocations on this device holding the
            // operands with the leading dimensions checked by `Problem::new`; alpha and
            // beta are host f32 (the handle's default pointer mode), as compute type 32F
            // wants.
            let s = unsafe {
                cb::cublasGemmEx(
                    self.handle,
                    op(p.first.trans),
                    op(p.second.trans),
                    p.m as i32,
                    p.n as i32,
                    p.k as i32,
                    (&alpha as *const f32).cast(),
                    first as *const c_void,
                    ty,
                    p.first.ld as i32,
                    second as *const c_void,
                    ty,
                    p.second.ld as i32,
                    (&beta as *const f32).cast(),
                    c as *mut c_void,
                    ty,
                    p.ldc as i32,
                    compute,
                    cb::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            };
            cublas_ok(&format!("cublasGemmEx {p:?}"), s)
        })
    }

    /// The plan of `p`, made on first use (descriptors, heuristic).
    fn plan(&self, p: &Problem) -> Result<LtPlan> {
        let compute = if p.tf32() { lt::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32 } else { lt::cublasComputeType_t::CUBLAS_COMPUTE_32F };
        guarded("planning a cuBLASLt matmul", || {
            // SAFETY: out-pointers to locals; attribute buffers are locals of the size
            // passed; descriptors are owned by the returned plan (or destroyed on error
            // through its Drop).
            unsafe {
                let mut desc: lt::cublasLtMatmulDesc_t = std::ptr::null_mut();
                lt_ok("cublasLtMatmulDescCreate", lt::cublasLtMatmulDescCreate(&mut desc, compute, lt::cudaDataType::CUDA_R_32F))?;
                let mut plan = LtPlan {
                    desc,
                    first: std::ptr::null_mut(),
                    second: std::ptr::null_mut(),
                    c: std::ptr::null_mut(),
                    algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] },
                    workspace: 0,
                };
                for (attr, t) in [
                    (lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, p.first.trans),
                    (lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, p.second.trans),
                ] {
                    let v: i32 = t as i32; // cublasOperation_t: N = 0, T = 1
                    lt_ok("cublasLtMatmulDescSetAttribute", lt::cublasLtMatmulDescSetAttribute(desc, attr, (&v as *const i32).cast(), 4))?;
                }
                if p.is_fp8() {
                    // int8_t; 0 (the default) promotes partial sums to f32 at intervals
                    let fast: i8 = p.fast_accum as i8;
                    lt_ok(
                        "cublasLtMatmulDescSetAttribute(FAST_ACCUM)",
                        lt::cublasLtMatmulDescSetAttribute(desc, lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_FAST_ACCUM, (&fast as *const i8).cast(), 1),
                    )?;
                }
                // stored shapes (column-major rows × cols) of each operand
                let (fr, fc) = if p.first.trans { (p.k, p.m) } else { (p.m, p.k) };
                let (sr, sc) = if p.second.trans { (p.n, p.k) } else { (p.k, p.n) };
                let (ft, st, ct) = (lt_type(p.b_dtype), lt_type(p.a_dtype), lt_type(p.c_dtype));
                lt_ok("cublasLtMatrixLayoutCreate", lt::cublasLtMatrixLayoutCreate(&mut plan.first, ft, fr as u64, fc as u64, p.first.ld))?;
                lt_ok("cublasLtMatrixLayoutCreate", lt::cublasLtMatrixLayoutCreate(&mut plan.second, st, sr as u64, sc as u64, p.second.ld))?;
                lt_ok("cublasLtMatrixLayoutCreate", lt::cublasLtMatrixLayoutCreate(&mut plan.c, ct, p.m as u64, p.n as u64, p.ldc))?;
                let mut pref: lt::cublasLtMatmulPreference_t = std::ptr::null_mut();
                lt_ok("cublasLtMatmulPreferenceCreate", lt::cublasLtMatmulPreferenceCreate(&mut pref))?;
                let ws: u64 = WORKSPACE_BYTES as u64;
                let r = lt_ok(
                    "cublasLtMatmulPreferenceSetAttribute",
                    lt::cublasLtMatmulPreferenceSetAttribute(
                        pref,
                        lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                        (&ws as *const u64).cast(),
                        8,
                    ),
                )
                .and_then(|_| {
                    let mut result: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
                    let mut count = 0i32;
                    lt_ok(
                        "cublasLtMatmulAlgoGetHeuristic",
                        lt::cublasLtMatmulAlgoGetHeuristic(self.lt, desc, plan.first, plan.second, plan.c, plan.c, pref, 1, &mut result, &mut count),
                    )?;
                    if count < 1 {
                        return Err(Error::Vendor(format!("cuBLASLt has no algorithm for {p:?}")));
                    }
                    Ok(result)
                });
                let _ = lt::cublasLtMatmulPreferenceDestroy(pref);
                let result = r?;
                plan.algo = result.algo;
                plan.workspace = result.workspaceSize;
                Ok(plan)
            }
        })
    }

    /// `cublasLtMatmul` of `p` with its cached plan: `C = alpha · op(B') · op(A')`.
    fn gemm_lt(&self, p: &Problem, (first, second, c): (u64, u64, u64), alpha: f32, stream: lt::cudaStream_t) -> Result<()> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if !plans.contains_key(p) {
            let plan = self.plan(p)?;
            plans.insert(*p, plan);
        }
        let plan = &plans[p];
        let beta = 0.0f32;
        guarded("cublasLtMatmul", || {
            // SAFETY: as in `gemm_ex`; the plan's layouts describe these operands; the
            // workspace is ours, WORKSPACE_BYTES ≥ the plan's, on the same stream.
            let s = unsafe {
                lt::cublasLtMatmul(
                    self.lt,
                    plan.desc,
                    (&alpha as *const f32).cast(),
                    first as *const c_void,
                    plan.first,
                    second as *const c_void,
                    plan.second,
                    (&beta as *const f32).cast(),
                    c as *const c_void,
                    plan.c,
                    c as *mut c_void,
                    plan.c,
                    &plan.algo,
                    self.workspace_ptr as *mut c_void,
                    plan.workspace.min(WORKSPACE_BYTES),
                    stream,
                )
            };
            lt_ok(&format!("cublasLtMatmul {p:?}"), s)
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        if let Some(g) = self.device.gpu_ref() {
            let _ = g.bind();
        }
        self.plans.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        // SAFETY: the handles were created by `Blas::new` and are destroyed once; work
        // queued with them is ordered before later frees on the one stream.
        unsafe {
            if !self.lt.is_null() {
                let _ = lt::cublasLtDestroy(self.lt);
            }
            if !self.handle.is_null() {
                let _ = cb::cublasDestroy_v2(self.handle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(shape: &[usize], dt: DType) -> Tensor {
        Tensor::zeros(shape, dt, &Device::cpu()).unwrap()
    }

    #[test]
    fn row_major_maps_to_swapped_column_major() {
        let (a, b) = (cpu(&[3, 5], DType::BF16), cpu(&[5, 7], DType::BF16));
        let a_op = operand("A", &a).unwrap();
        assert_eq!(a_op, Operand { trans: false, ld: 5 });
        assert_eq!(operand("B", &b).unwrap(), Operand { trans: false, ld: 7 });
        // a transposed view is a transposed operand with the parent's row stride
        let bt = cpu(&[7, 5], DType::BF16).t();
        assert_eq!(operand("B", &bt).unwrap(), Operand { trans: true, ld: 5 });
        // a narrowed view keeps the parent's row stride
        let wide = cpu(&[3, 16], DType::BF16).narrow(1, 4, 5).unwrap();
        assert_eq!(operand("A", &wide).unwrap(), Operand { trans: false, ld: 16 });
    }

    #[test]
    fn problems_are_checked_before_any_call() {
        let dt = DType::BF16;
        let (a, b, c) = (cpu(&[4, 8], dt), cpu(&[8, 16], dt), cpu(&[4, 16], dt));
        // the CPU is refused (vendor GEMMs run on a GPU)
        assert!(matches!(Problem::new(&a, &b, &c, Math::Fp32), Err(Error::DeviceMismatch(_))));
        assert!(matches!(Problem::new(&a, &cpu(&[9, 16], dt), &c, Math::Fp32), Err(Error::ShapeMismatch(_))));
        assert!(matches!(Problem::new(&a, &b, &cpu(&[4, 15], dt), Math::Fp32), Err(Error::ShapeMismatch(_))));
        assert!(matches!(Problem::new(&a, &cpu(&[8, 16], DType::F16), &c, Math::Fp32), Err(Error::DTypeMismatch(_))));
        assert!(matches!(Problem::new(&cpu(&[4], dt), &b, &c, Math::Fp32), Err(Error::ShapeMismatch(_))));
        let i = DType::I64;
        assert!(matches!(Problem::new(&cpu(&[4, 8], i), &cpu(&[8, 16], i), &cpu(&[4, 16], i), Math::Fp32), Err(Error::InvalidArgument(_))));
        assert!(Blas::new(&Device::cpu()).is_err());
        // fp8 is pointed at its own entry point
        let e8 = DType::F8E4M3;
        match Problem::new(&cpu(&[4, 16], e8), &cpu(&[16, 16], e8), &cpu(&[4, 16], e8), Math::Fp32) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("gemm_fp8_into"), "{m}"),
            r => panic!("{r:?}"),
        }
    }

    fn invalid(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(Error::InvalidArgument(m)) => m,
            r => panic!("expected InvalidArgument, got {r:?}"),
        }
    }

    #[test]
    fn fp8_dtype_combinations() {
        let (e4, e5) = (DType::F8E4M3, DType::F8E5M2);
        for (a, b) in [(e4, e4), (e4, e5), (e5, e4)] {
            for c in [DType::BF16, DType::F16, DType::F32] {
                fp8_dtypes(a, b, c).unwrap();
            }
        }
        assert!(invalid(fp8_dtypes(e5, e5, DType::BF16)).contains("f8e5m2 × f8e5m2"));
        assert!(invalid(fp8_dtypes(e4, e4, e4)).contains("bf16, f16 or f32"));
        assert!(invalid(fp8_dtypes(e4, e4, DType::I64)).contains("bf16, f16 or f32"));
        assert!(matches!(fp8_dtypes(DType::BF16, e4, DType::BF16), Err(Error::DTypeMismatch(_))));
        assert!(matches!(fp8_dtypes(e4, DType::F16, DType::F16), Err(Error::DTypeMismatch(_))));
    }

    #[test]
    fn fp8_needs_the_tn_layout_and_16_byte_alignment() {
        let e4 = DType::F8E4M3;
        let (m, n, k) = (129, 144, 160);
        let a = cpu(&[m, k], e4);
        let w = cpu(&[n, k], e4); // B = w.t(): K-major
        let c = cpu(&[m, n], DType::BF16);
        let (first, second, ldc) = fp8_layout(&a, &w.t(), &c).unwrap();
        // "TN": the first cuBLAS operand (our B) transposed, the second (our A) not
        assert_eq!(first, Operand { trans: true, ld: k as i64 });
        assert_eq!(second, Operand { trans: false, ld: k as i64 });
        assert_eq!(ldc, n as i64);
        // f32 and f16 outputs lay out the same way
        fp8_layout(&a, &w.t(), &cpu(&[m, n], DType::F32)).unwrap();

        // B stored [K, N] (N contiguous) is refused with the layout needed, not copied
        let msg = invalid(fp8_layout(&a, &cpu(&[k, n], e4), &c));
        assert!(msg.contains("K-major") && msg.contains("[N, K]"), "{msg}");
        // A as a transposed view
        let msg = invalid(fp8_layout(&cpu(&[k, m], e4).t(), &w.t(), &c));
        assert!(msg.contains("A[M, K] must be row-major"), "{msg}");
        // a transposed output
        assert!(matches!(fp8_layout(&a, &w.t(), &cpu(&[n, m], DType::BF16).t()), Err(Error::NonContiguous { .. })));

        // K not a multiple of 16
        let msg = invalid(fp8_layout(&cpu(&[m, 40], e4), &cpu(&[n, 40], e4).t(), &c));
        assert!(msg.contains("K = 40") && msg.contains("multiple of 16"), "{msg}");
        // N · size_of(C) not a multiple of 16: N = 12 is fine for f32 (48 bytes), not for bf16
        let w12 = cpu(&[12, k], e4);
        fp8_layout(&a, &w12.t(), &cpu(&[m, 12], DType::F32)).unwrap();
        let msg = invalid(fp8_layout(&a, &w12.t(), &cpu(&[m, 12], DType::BF16)));
        assert!(msg.contains("N = 12") && msg.contains("multiple of 8"), "{msg}");
        // a row stride that is not a multiple of 16 bytes (A: columns 0..160 of [M, 168])
        let wide = cpu(&[m, k + 8], e4).narrow(1, 0, k).unwrap();
        let msg = invalid(fp8_layout(&wide, &w.t(), &c));
        assert!(msg.contains("leading dimension of A") && msg.contains("168 bytes"), "{msg}");
        // columns 16.. of [M, 176]: row stride 176 bytes, start 16 bytes in: fine
        let wide = cpu(&[m, k + 16], e4).narrow(1, 16, k).unwrap();
        assert_eq!(fp8_layout(&wide, &w.t(), &c).unwrap().1, Operand { trans: false, ld: (k + 16) as i64 });
        // ... but 8 bytes in is misaligned
        let wide = cpu(&[m, k + 16], e4).narrow(1, 8, k).unwrap();
        let msg = invalid(fp8_layout(&wide, &w.t(), &c));
        assert!(msg.contains("A starts at byte offset 8"), "{msg}");
    }

    #[test]
    fn fp8_problems_are_checked_before_any_call() {
        let (e4, e5) = (DType::F8E4M3, DType::F8E5M2);
        let (a, w, c) = (cpu(&[32, 64], e4), cpu(&[48, 64], e4), cpu(&[32, 48], DType::BF16));
        // shapes, then dtypes, then the device (vendor GEMMs run on a GPU)
        assert!(matches!(Problem::fp8(&a, &w, &c, false), Err(Error::ShapeMismatch(_))));
        assert!(matches!(Problem::fp8(&cpu(&[32, 64], e5), &cpu(&[48, 64], e5).t(), &c, false), Err(Error::InvalidArgument(_))));
        assert!(matches!(Problem::fp8(&a, &w.t(), &cpu(&[32, 48], e4), true), Err(Error::InvalidArgument(_))));
        assert!(matches!(Problem::fp8(&a, &w.t(), &c, true), Err(Error::DeviceMismatch(_))));
    }
}

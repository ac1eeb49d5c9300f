//! The configurable matrix products: [`gemm_ex`] (`out = alpha · a·b + beta · c`, any
//! output dtype) and [`gemm_batched`] / [`gemm_batched_ex`] (leading batch dimensions,
//! a shared `b` broadcast over them); and [`swiglu_gemm`], the SwiGLU projection pair
//! `silu(x · wg) ⊙ (x · wu)` in one kernel (`kernels::swiglu_gemm`: two accumulators in
//! one loop); and [`gemm_grouped`] / [`gemm_grouped_ex`], a list of independent
//! problems of any sizes in one launch (`kfuse_runtime::launch_grouped` of
//! `kernels::gemm_scaled`). The plain [`crate::gemm`] lives in the crate root.
//!
//! Kernels (`crate::kernels`), each the loop of `kernels::gemm` with its epilogue:
//! - `gemm_scaled<T, O>`: `out = alpha · a·b` rounded to `O` (no `c`);
//! - `gemm_axpby<T, O>`: `out = alpha · a·b + beta · c`, `c` of dtype `O`;
//! - `gemm_batched_scaled<T, O>`, `gemm_batched_axpby<T, O>`: the same on `[NB, .., ..]`
//!   operands, the batch index a third program id;
//! - `kernels::gemm` itself when `alpha = 1`, no `c` and `O = T` (the module `gemm`
//!   compiles for);
//! - `gemm_tf32_scaled<O>`, `gemm_tf32_axpby<O>` and their batched forms: the same on
//!   f32 operands with `dot_tf32`, when [`GemmOptions::tf32`] asks for it.
//!
//! Batch dimensions become one (`NB`) by a reshape where the strides allow it (packed
//! batches of row-major or of transposed matrices); any other layout of rank > 3 is
//! copied to a packed one first. A `b` without batch dimensions (`[K, N]`) is shared by
//! every product: `a` is then viewed as one `[NB·M, K]` matrix (copied to a packed one
//! first if it is strided) and the product is one 2-D GEMM.

use std::borrow::Cow;

use kfuse_ir::DType;
use kfuse_runtime::{Arg, Error, Result, Scalar, Tensor};

use crate::kernels;

/// Options of [`gemm_ex`] and [`gemm_batched_ex`]: `out = alpha · (a · b) + beta · c`.
///
/// The default is `alpha = 1`, `beta = 0`, no `c`, and an output of the operands' dtype:
/// the plain product. Change fields with struct update syntax:
/// `GemmOptions { alpha: 0.5, c: Some(&c), beta: 1.0, ..Default::default() }`.
#[derive(Clone, Copy, Debug)]
pub struct GemmOptions<'a> {
    /// Scales the product (applied in f32 to the f32 accumulator).
    pub alpha: f32,
    /// Scales `c`. With `beta = 0` `c` is not read (as in BLAS: NaN or Inf in `c` do not
    /// reach the result), though its shape, dtype and device are still checked. Without
    /// `c` it has no effect: the result is the scaled product alone (the grouped
    /// products, which take no `c`, refuse a nonzero `beta` instead).
    pub beta: f32,
    /// The addend, of the output's shape (`[M, N]`, or `[B.., M, N]` batched; any
    /// strides) and of the output's dtype.
    pub c: Option<&'a Tensor>,
    /// The output dtype (f32, f16, bf16, f8e4m3 or f8e5m2); `None`: the operands'
    /// dtype. The sum is f32 whatever it is, rounded to this dtype once (8-bit outputs
    /// saturate at their largest finite value).
    pub out_dtype: Option<DType>,
    /// Per-tensor dequantization scales of `a` and `b` (for 8-bit operands: the real
    /// values are `scale_a · a` and `scale_b · b`). They multiply the product with
    /// `alpha` — `out = alpha · scale_a · scale_b · (a · b) + beta · c` — as one f32
    /// factor in the epilogue; any operand dtype takes them.
    pub scale_a: f32,
    /// The dequantization scale of `b` (see [`GemmOptions::scale_a`]).
    pub scale_b: f32,
    /// Lets f32 operands be read as TF32 (8-bit exponent, 10-bit mantissa) by the
    /// tensor cores: on sm_90a the product runs as `wgmma … tf32` (about 7x the exact
    /// path's speed, relative errors ~1e-3 instead of ~1e-6); the operands are given
    /// K-contiguous, TMA-readable copies where they are not. Elsewhere (sm_80/sm_89,
    /// the interpreter) the products stay exact, except that the interpreter reads the
    /// operands as TF32 too (the low 13 mantissa bits dropped), so that it reproduces
    /// the GPU's rounding. Default `false`: f32 products are exact f32 FMAs. Other
    /// operand dtypes ignore it (their products are exact in f32 already).
    pub tf32: bool,
}

impl Default for GemmOptions<'_> {
    fn default() -> Self {
        GemmOptions { alpha: 1.0, beta: 0.0, c: None, out_dtype: None, scale_a: 1.0, scale_b: 1.0, tf32: false }
    }
}

impl GemmOptions<'_> {
    /// The factor of the product: `alpha · scale_a · scale_b`.
    fn product_scale(&self) -> f32 {
        self.alpha * self.scale_a * self.scale_b
    }

    /// Whether the products of `a` (of the operands' dtype) go through TF32.
    fn tf32_for(&self, a: &Tensor) -> bool {
        self.tf32 && a.dtype() == DType::F32
    }
}

/// Checks shared by every product: float operands of one dtype on one device, an output
/// dtype that is a float, and `c` (when given) of the output's dtype, shape and device.
/// Returns the output dtype.
fn check_common(what: &str, a: &Tensor, b: &Tensor, opts: &GemmOptions<'_>, out_shape: &[usize]) -> Result<DType> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch(format!("{what}: `a` is {} but `b` is {}", a.dtype(), b.dtype())));
    }
    if a.device() != b.device() {
        return Err(Error::DeviceMismatch(format!("{what}: `a` is on {} but `b` is on {}", a.device().name(), b.device().name())));
    }
    let od = opts.out_dtype.unwrap_or(a.dtype());
    if !od.is_float() {
        return Err(Error::InvalidArgument(format!("{what}: the output dtype must be a float (f32, f16, bf16, f8e4m3, f8e5m2), got {od}")));
    }
    if let Some(c) = opts.c {
        if c.dtype() != od {
            return Err(Error::DTypeMismatch(format!("{what}: `c` is {} but the output is {od}; `c` must have the output's dtype", c.dtype())));
        }
        if c.shape() != out_shape {
            return Err(Error::ShapeMismatch(format!("{what}: `c` has shape {:?}, the output {out_shape:?}; they must be equal", c.shape())));
        }
        if c.device() != a.device() {
            return Err(Error::DeviceMismatch(format!("{what}: `c` is on {} but `a` is on {}", c.device().name(), a.device().name())));
        }
    }
    Ok(od)
}

fn check_float(what: &str, t: &Tensor, arg: &str) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("{what}: `{arg}` has dtype {}; the product takes f32, f16, bf16, f8e4m3 or f8e5m2", t.dtype())))
    }
}

/// The matrix product with scaling, an addend and a chosen output dtype:
/// `out = alpha · (a · b) + beta · c` for `a: [M, K]`, `b: [K, N]` and `c: [M, N]`, as a
/// new contiguous `[M, N]` tensor of dtype `opts.out_dtype` (default: the operands').
///
/// `a` and `b` are 2-D, of one float dtype, on one device, with any strides (a
/// transposed view `x.t()` is read as it lies). Products are accumulated in f32, the
/// scaling and the addition happen in f32 in the kernel's epilogue (one launch), and the
/// result is rounded to the output dtype once. Every pair of operand and output dtypes
/// among f32, f16 and bf16 works on the interpreter and on the GPU: f16 and bf16 operands
/// take the matrix path (WGMMA on sm_90a, mma.sync on sm_80/sm_89), f32 operands exact
/// f32 FMAs on the CUDA cores, reading any strides without a copy — or, with
/// `opts.tf32`, TF32 WGMMA on sm_90a (see [`GemmOptions::tf32`]). `M = 0` or `N = 0` gives an empty result, `K = 0` gives
/// `beta · c` (or zeros).
///
/// Errors: a rank other than 2 or an integer dtype (`InvalidArgument`), operands of
/// different dtypes or a `c` not of the output dtype (`DTypeMismatch`), inner dimensions
/// that differ or a `c` not `[M, N]` (`ShapeMismatch`), different devices
/// (`DeviceMismatch`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// use kfuse::ops::GemmOptions;
/// let a = Tensor::full(&[2, 4], 1.0, DType::BF16, &dev)?;
/// let b = Tensor::full(&[4, 3], 0.5, DType::BF16, &dev)?;
/// let c = Tensor::full(&[2, 3], 10.0, DType::F32, &dev)?;
/// // out = 2 · a·b − 1 · c, in f32
/// let opts = GemmOptions { alpha: 2.0, beta: -1.0, c: Some(&c), out_dtype: Some(DType::F32), ..Default::default() };
/// let out = kfuse::ops::gemm_ex(&a, &b, &opts)?;
/// assert_eq!((out.dtype(), out.to_vec_f32()?), (DType::F32, vec![-6.0; 6]));
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gemm_ex(a: &Tensor, b: &Tensor, opts: &GemmOptions<'_>) -> Result<Tensor> {
    product("kfuse::ops::gemm_ex", a, b, opts)
}

/// [`gemm_ex`] (and [`crate::gemm`], its default case) under the caller's name for
/// error messages.
pub(crate) fn product(what: &str, a: &Tensor, b: &Tensor, opts: &GemmOptions<'_>) -> Result<Tensor> {
    let (m, k, n, od) = check_2d(what, a, b, opts)?;
    let mut out = Tensor::empty(&[m, n], od, &a.device())?;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    let c = opts.c.filter(|_| opts.beta != 0.0);
    if k == 0 {
        empty_sum(a, b, c, &mut out, opts.beta, None)?;
        return Ok(out);
    }
    product_2d(a, b, c, &mut out, opts.product_scale(), opts.beta, opts.tf32_for(a))?;
    Ok(out)
}

/// The checks of one 2-D product `a · b` ([`check_common`] and both operands float
/// matrices whose inner sizes agree); returns `(M, K, N)` and the output dtype.
fn check_2d(what: &str, a: &Tensor, b: &Tensor, opts: &GemmOptions<'_>) -> Result<(usize, usize, usize, DType)> {
    for (t, arg) in [(a, "a"), (b, "b")] {
        if t.rank() != 2 {
            return Err(Error::InvalidArgument(format!(
                "{what}: `{arg}` must be a matrix (rank 2), got shape {:?} (batched products: gemm_batched_ex)",
                t.shape()
            )));
        }
        check_float(what, t, arg)?;
    }
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    if b.shape()[0] != k {
        return Err(Error::ShapeMismatch(format!(
            "{what}: `a` is {:?} and `b` is {:?}; the columns of `a` must match the rows of `b`",
            a.shape(),
            b.shape()
        )));
    }
    let od = check_common(what, a, b, opts, &[m, n])?;
    Ok((m, k, n, od))
}

/// `K = 0`: the product is the empty sum. Without `c` the result is zeros; with it,
/// `beta · c`, by the same kernels on zero operands of `K = 1` (so that `c`'s strides,
/// rank and dtype are handled as usual). `batch`: the batch dims of a batched call.
fn empty_sum(a: &Tensor, b: &Tensor, c: Option<&Tensor>, out: &mut Tensor, beta: f32, batch: Option<&[usize]>) -> Result<()> {
    let Some(c) = c else { return out.fill(0.0) };
    let (m, n) = (a.shape()[a.rank() - 2], b.shape()[b.rank() - 1]);
    let dev = a.device();
    let b0 = Tensor::zeros(&[1, n], b.dtype(), &dev)?;
    match batch {
        None => product_2d(&Tensor::zeros(&[m, 1], a.dtype(), &dev)?, &b0, Some(c), out, 1.0, beta, false),
        Some(batch) => batched(&Tensor::zeros(&[batch, &[m, 1]].concat(), a.dtype(), &dev)?, &b0, Some(c), out, 1.0, beta, false),
    }
}

/// Launches the 2-D product into `out` (`[M, N]`, any strides), `K > 0`; `tf32`: f32
/// operands read as TF32 (the `*_tf32_*` kernels). On a GPU the operands get
/// TMA-readable copies where needed and a 16-bit output whose rows are not 16-byte
/// aligned goes through a padded buffer (as in [`crate::gemm`]), so that the epilogue
/// can leave by a TMA store.
#[allow(clippy::too_many_arguments)]
fn product_2d(a: &Tensor, b: &Tensor, c: Option<&Tensor>, out: &mut Tensor, alpha: f32, beta: f32, tf32: bool) -> Result<()> {
    let plain = c.is_none() && alpha == 1.0 && out.dtype() == a.dtype();
    let run = |a: &Tensor, b: &Tensor, o: &mut Tensor| -> Result<()> {
        match (c, tf32) {
            (None, false) if plain => kernels::gemm(a, b, o)?,
            (None, false) => kernels::gemm_scaled(a, b, o, alpha)?,
            (Some(c), false) => kernels::gemm_axpby(a, b, c, o, alpha, beta)?,
            (None, true) => kernels::gemm_tf32_scaled(a, b, o, alpha)?,
            (Some(c), true) => kernels::gemm_tf32_axpby(a, b, c, o, alpha, beta)?,
        };
        Ok(())
    };
    if !a.device().is_gpu() {
        return run(a, b, out);
    }
    let tc = tensor_core_f32(a, tf32);
    let (a, b) = (k_contiguous(a, 1, tc)?, k_contiguous(b, 0, tc)?);
    let (a, b) = (crate::tma_readable(&a, tc)?, crate::tma_readable(&b, tc)?);
    through_aligned_rows(out, |o| run(&a, &b, o))
}

/// Runs `run` on `out` (`[M, N]`), or, for a 16-bit `out` whose rows are not 16-byte
/// aligned, on a buffer with rows padded to 128-byte lines that is then copied into
/// `out`: the matrix path's epilogue leaves by a TMA store only into aligned rows.
fn through_aligned_rows(out: &mut Tensor, run: impl FnOnce(&mut Tensor) -> Result<()>) -> Result<()> {
    let (m, n) = (out.shape()[0], out.shape()[1]);
    let esz = out.dtype().size_bytes().max(1);
    let tma_store = matches!(out.dtype(), DType::F16 | DType::BF16);
    if tma_store && n % (16 / esz) != 0 {
        let line = 128 / esz;
        let storage = Tensor::empty(&[m, n.div_ceil(line) * line], out.dtype(), &out.device())?;
        let mut padded = storage.narrow(1, 0, n)?;
        run(&mut padded)?;
        kernels::copy2d(&padded, out)?;
        Ok(())
    } else {
        run(out)
    }
}

/// The SwiGLU projection pair: `silu(x · wg) ⊙ (x · wu)` for `x: [M, K]` and
/// `wg`, `wu: [K, N]` (one float dtype, one device, any strides), as a new contiguous
/// `[M, N]` tensor of their dtype. `silu(g) = g · sigmoid(g)`.
///
/// One kernel (`kernels::swiglu_gemm`) where the matrix path takes several products in
/// one loop — the sm_90a WGMMA path with f16, bf16, f8e4m3 or f8e5m2 operands — and on
/// the interpreter: both products accumulate in f32 in one loop over `K` that reads
/// each `x` tile once, and the epilogue computes `silu(g) · u` in f32 and rounds once.
/// Elsewhere (sm_80/sm_89, whose `mma.sync` path takes one product a loop; f32
/// operands, whose exact FMA path does too) it is [`crate::gemm`] twice and the
/// elementwise [`crate::swiglu`]: `g` and `u` are rounded to the dtype before the
/// activation (one more rounding, within the dtype's precision). On a GPU the operands
/// get the copies [`gemm_ex`] would make (TMA-readable rows; 8-bit weights K-major:
/// pass `w.t()` of `[N, K]` weights to avoid them). `M = 0` or `N = 0` gives an empty
/// result and `K = 0` zeros (`silu(0) · 0`), without a launch.
///
/// Errors: a rank other than 2 or an integer dtype (`InvalidArgument`), different
/// dtypes (`DTypeMismatch`), shapes that do not fit (`ShapeMismatch`), different devices
/// (`DeviceMismatch`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::full(&[2, 4], 1.0, DType::BF16, &dev)?;
/// let wg = Tensor::zeros(&[4, 3], DType::BF16, &dev)?;
/// let wu = Tensor::full(&[4, 3], 1.0, DType::BF16, &dev)?;
/// // silu(x · wg) ⊙ (x · wu) = silu(0) · 4
/// assert_eq!(kfuse::ops::swiglu_gemm(&x, &wg, &wu)?.to_vec_f32()?, [0.0; 6]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn swiglu_gemm(x: &Tensor, wg: &Tensor, wu: &Tensor) -> Result<Tensor> {
    const WHAT: &str = "kfuse::ops::swiglu_gemm";
    for (t, arg) in [(x, "x"), (wg, "wg"), (wu, "wu")] {
        if t.rank() != 2 {
            return Err(Error::InvalidArgument(format!("{WHAT}: `{arg}` must be a matrix (rank 2), got shape {:?}", t.shape())));
        }
        check_float(WHAT, t, arg)?;
    }
    for (t, arg) in [(wg, "wg"), (wu, "wu")] {
        if t.dtype() != x.dtype() {
            return Err(Error::DTypeMismatch(format!("{WHAT}: `x` is {} but `{arg}` is {}", x.dtype(), t.dtype())));
        }
        if t.device() != x.device() {
            return Err(Error::DeviceMismatch(format!("{WHAT}: `x` is on {} but `{arg}` is on {}", x.device().name(), t.device().name())));
        }
    }
    let (m, k, n) = (x.shape()[0], x.shape()[1], wg.shape()[1]);
    if wg.shape()[0] != k || wu.shape() != wg.shape() {
        return Err(Error::ShapeMismatch(format!(
            "{WHAT}: `x` is {:?}, `wg` {:?} and `wu` {:?}; the weights must both be [K, N] with K the columns of `x`",
            x.shape(),
            wg.shape(),
            wu.shape()
        )));
    }
    let dev = x.device();
    let mut out = Tensor::empty(&[m, n], x.dtype(), &dev)?;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    if k == 0 {
        out.fill(0.0)?;
        return Ok(out);
    }
    if !dev.is_gpu() {
        kernels::swiglu_gemm(x, wg, wu, &mut out)?;
        return Ok(out);
    }
    let fused = dev.target().is_some_and(|t| t.sm == 90) && (matches!(x.dtype(), DType::F16 | DType::BF16) || x.dtype().is_fp8());
    if !fused {
        let g = crate::gemm(x, wg)?;
        let u = crate::gemm(x, wu)?;
        return crate::swiglu(&g, &u);
    }
    let x = crate::tma_readable(&*k_contiguous(x, 1, false)?, false)?.into_owned();
    let wg = crate::tma_readable(&*k_contiguous(wg, 0, false)?, false)?.into_owned();
    let wu = crate::tma_readable(&*k_contiguous(wu, 0, false)?, false)?.into_owned();
    through_aligned_rows(&mut out, |o| kernels::swiglu_gemm(&x, &wg, &wu, o).map(drop))?;
    Ok(out)
}

/// Batched matrix products: `out[z] = a[z] · b[z]` for `a: [B.., M, K]` and
/// `b: [B.., K, N]` (the same leading batch dimensions) or `b: [K, N]` (one `b` for
/// every `a[z]`), as a new contiguous `[B.., M, N]` tensor of the operands' dtype.
/// `gemm_batched_ex(a, b, &GemmOptions::default())`; see there.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// let x = Tensor::full(&[2, 3, 4], 1.0, DType::F32, &dev)?; // a batch of 2 [3, 4]
/// let w = Tensor::full(&[4, 5], 0.25, DType::F32, &dev)?; // one [4, 5] for all
/// let y = kfuse::ops::gemm_batched(&x, &w)?;
/// assert_eq!((y.shape(), y.to_vec_f32()?[0]), (&[2, 3, 5][..], 1.0));
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gemm_batched(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    gemm_batched_ex(a, b, &GemmOptions::default())
}

/// Batched matrix products with scaling, an addend and a chosen output dtype:
/// `out[z] = alpha · (a[z] · b[z]) + beta · c[z]` for `a: [B.., M, K]`, `b: [B.., K, N]`
/// or `[K, N]` (broadcast over the batch), `c: [B.., M, N]`; the result is a new
/// contiguous `[B.., M, N]` tensor of dtype `opts.out_dtype` (default: the operands').
///
/// Any number of leading batch dimensions (zero: the 2-D product of [`gemm_ex`]); they
/// must be equal in `a`, `b` (when it has them) and `c` — no other broadcasting. One
/// launch: batch dimensions are flattened to one by a reshape where the strides allow
/// (packed batches of row-major or transposed matrices; any strides at rank 3), else
/// the operand is first copied to a packed layout (on a GPU, a tensor of rank > 3 that
/// no reshape can flatten is copied through the host). A broadcast `b` makes the whole
/// batch one `[B·M, K] · [K, N]` product (a strided `a` is packed first). Numerics,
/// dtypes and empty sizes as in [`gemm_ex`].
///
/// Errors: `a` of rank < 2, or `b` of rank other than 2 and `a`'s, or an integer dtype
/// (`InvalidArgument`); batch dimensions, inner dimensions or `c`'s shape that do not fit
/// (`ShapeMismatch`); operands of different dtypes or a `c` not of the output dtype
/// (`DTypeMismatch`); different devices (`DeviceMismatch`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// use kfuse::ops::GemmOptions;
/// let a = Tensor::full(&[3, 2, 2], 1.0, DType::F16, &dev)?;
/// let b = Tensor::full(&[3, 2, 2], 1.0, DType::F16, &dev)?; // one b per batch entry
/// let y = kfuse::ops::gemm_batched_ex(&a, &b, &GemmOptions { alpha: 0.5, ..Default::default() })?;
/// assert_eq!(y.to_vec_f32()?, [1.0; 12]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gemm_batched_ex(a: &Tensor, b: &Tensor, opts: &GemmOptions<'_>) -> Result<Tensor> {
    const WHAT: &str = "kfuse::ops::gemm_batched_ex";
    check_float(WHAT, a, "a")?;
    check_float(WHAT, b, "b")?;
    let r = a.rank();
    if r < 2 {
        return Err(Error::InvalidArgument(format!("{WHAT}: `a` must be [B.., M, K] (rank ≥ 2), got shape {:?}", a.shape())));
    }
    if b.rank() != 2 && b.rank() != r {
        return Err(Error::InvalidArgument(format!(
            "{WHAT}: `b` must be [K, N] (shared by the batch) or have `a`'s rank {r} ([B.., K, N]), got shape {:?} for `a` {:?}",
            b.shape(),
            a.shape()
        )));
    }
    let batch = &a.shape()[..r - 2];
    let (m, k) = (a.shape()[r - 2], a.shape()[r - 1]);
    let (kb, n) = (b.shape()[b.rank() - 2], b.shape()[b.rank() - 1]);
    if b.rank() == r && &b.shape()[..r - 2] != batch {
        return Err(Error::ShapeMismatch(format!(
            "{WHAT}: the batch dimensions of `a` {:?} and `b` {:?} differ (shapes {:?} and {:?}); they must be equal, or `b` must be [K, N]",
            batch,
            &b.shape()[..r - 2],
            a.shape(),
            b.shape()
        )));
    }
    if kb != k {
        return Err(Error::ShapeMismatch(format!(
            "{WHAT}: `a` is {:?} and `b` is {:?}; the columns of `a` must match the rows of `b`",
            a.shape(),
            b.shape()
        )));
    }
    let out_shape = [batch, &[m, n]].concat();
    let od = check_common(WHAT, a, b, opts, &out_shape)?;
    let mut out = Tensor::empty(&out_shape, od, &a.device())?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let c = opts.c.filter(|_| opts.beta != 0.0);
    if k == 0 {
        empty_sum(a, b, c, &mut out, opts.beta, Some(batch))?;
        return Ok(out);
    }
    batched(a, b, c, &mut out, opts.product_scale(), opts.beta, opts.tf32_for(a))?;
    Ok(out)
}

/// The batched product into a fresh contiguous `out` (`[B.., M, N]`, not empty), `K > 0`;
/// `tf32` as in [`product_2d`].
#[allow(clippy::too_many_arguments)]
fn batched(a: &Tensor, b: &Tensor, c: Option<&Tensor>, out: &mut Tensor, alpha: f32, beta: f32, tf32: bool) -> Result<()> {
    let r = a.rank();
    let (m, k, n) = (a.shape()[r - 2], a.shape()[r - 1], b.shape()[b.rank() - 1]);
    let nb: usize = a.shape()[..r - 2].iter().product();
    if r == 2 {
        return product_2d(a, b, c, out, alpha, beta, tf32);
    }
    if b.rank() == 2 {
        // one `b` for all: the batch is one tall matrix
        let a2 = packed(a)?.reshape(&[nb * m, k])?;
        let c2 = c.map(|c| packed(c)?.reshape(&[nb * m, n])).transpose()?;
        let mut o2 = out.reshape(&[nb * m, n])?;
        return product_2d(&a2, b, c2.as_ref(), &mut o2, alpha, beta, tf32);
    }
    let (a3, b3) = (batch_view(a)?, batch_view(b)?);
    let c3 = c.map(batch_view).transpose()?;
    let mut o3 = out.reshape(&[nb, m, n])?;
    let (a3, b3) = if a.device().is_gpu() {
        let tc = tensor_core_f32(a, tf32);
        let (a3, b3) = (k_contiguous(&a3, 2, tc)?, k_contiguous(&b3, 1, tc)?);
        (tma_readable3(&a3, tc)?, tma_readable3(&b3, tc)?)
    } else {
        (a3, b3)
    };
    match (c3, tf32) {
        (None, false) => kernels::gemm_batched_scaled(&a3, &b3, &mut o3, alpha)?,
        (Some(c3), false) => kernels::gemm_batched_axpby(&a3, &b3, &c3, &mut o3, alpha, beta)?,
        (None, true) => kernels::gemm_batched_tf32_scaled(&a3, &b3, &mut o3, alpha)?,
        (Some(c3), true) => kernels::gemm_batched_tf32_axpby(&a3, &b3, &c3, &mut o3, alpha, beta)?,
    };
    Ok(())
}

/// `x` (`[B.., R, C]`, rank ≥ 2) as one `[NB, R, C]` view, sharing storage where the
/// strides allow: rank 3 as it is, packed batches of row-major matrices, packed batches
/// of transposed ones; anything else as a packed copy.
fn batch_view(x: &Tensor) -> Result<Tensor> {
    let r = x.rank();
    let (rows, cols) = (x.shape()[r - 2], x.shape()[r - 1]);
    let nb: usize = x.shape()[..r - 2].iter().product();
    if r == 3 {
        return Ok(x.clone());
    }
    if x.is_contiguous() {
        return x.reshape(&[nb, rows, cols]);
    }
    let xt = x.t();
    if xt.is_contiguous() {
        return Ok(xt.reshape(&[nb, cols, rows])?.t());
    }
    // rank 2 is contiguous or transposed-contiguous or handled by `packed`; rank > 3
    // with strides no reshape can merge: the runtime's copy (through the host on a GPU)
    x.contiguous()?.reshape(&[nb, rows, cols])
}

/// `x` (`[B.., R, C]`) packed row-major: itself when it already is, else a copy made
/// on its device (`copy2d` / `copy3d` of its batch view).
fn packed(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        return Ok(x.clone());
    }
    let mut out = Tensor::empty(x.shape(), x.dtype(), &x.device())?;
    if x.rank() == 2 {
        kernels::copy2d(x, &mut out)?;
        return Ok(out);
    }
    let v = batch_view(x)?;
    if v.is_contiguous() {
        // `batch_view` made a packed copy already
        return v.reshape(x.shape());
    }
    let mut o3 = out.reshape(v.shape())?;
    kernels::copy3d(&v, &mut o3)?;
    Ok(out)
}

/// The rank-3 [`crate::tma_readable`]: `t` itself when TMA can read it (a unit stride
/// on one of the two matrix dimensions, every other stride a positive multiple of 16
/// bytes, data 16-byte aligned), else a copy with its rows padded to whole 128-byte
/// lines (viewed at `t`'s shape). f32 operands as they are (the FMA path reads any
/// strides), unless `tf32` sends them to the tensor cores.
fn tma_readable3(t: &Tensor, tf32: bool) -> Result<Tensor> {
    if t.dtype() == DType::F32 && !tf32 {
        return Ok(t.clone());
    }
    let esz = t.dtype().size_bytes();
    let st = t.strides();
    let aligned = |s: isize| s > 0 && (s as usize * esz) & 15 == 0;
    let ok = aligned(st[0]) && ((st[2] == 1 && aligned(st[1])) || (st[1] == 1 && aligned(st[2])));
    if ok && t.address() & 15 == 0 {
        return Ok(t.clone());
    }
    let (nb, r, c) = (t.shape()[0], t.shape()[1], t.shape()[2]);
    let per = 128 / esz.max(1);
    let storage = Tensor::empty(&[nb, r, c.div_ceil(per) * per], t.dtype(), &t.device())?;
    let mut view = storage.narrow(2, 0, c)?;
    kernels::copy3d(t, &mut view)?;
    Ok(view)
}

/// An 8-bit operand (rank 2 or 3), or an f32 one bound for the tensor cores (`tf32`),
/// with unit stride along its K dimension `k_axis`: itself when it has it, else a copy
/// laid out that way (rows padded to 128-byte lines), viewed at its shape. The GPU's
/// matrix units read 8-bit and TF32 operands only with K contiguous (A row-major, B as
/// the transpose of an `[N, K]` matrix); 16-bit operands, and f32 ones for the exact
/// path, pass through untouched.
fn k_contiguous(t: &Tensor, k_axis: usize, tf32: bool) -> Result<Cow<'_, Tensor>> {
    let r = t.rank();
    // the other matrix axis, and the layout [batch.., other, K] the copy is made in
    let other = if k_axis == r - 1 { r - 2 } else { r - 1 };
    // K must be the one unit-stride axis (a `[1, 1]` view has two: ambiguous)
    let wants = t.dtype().is_fp8() || (tf32 && t.dtype() == DType::F32);
    if !wants || (t.strides()[k_axis] == 1 && t.strides()[other] != 1) {
        return Ok(Cow::Borrowed(t));
    }
    let mut perm: Vec<usize> = (0..r - 2).collect();
    perm.extend([other, k_axis]);
    let src = t.permute(&perm)?;
    let kk = t.shape()[k_axis];
    let per = 128 / t.dtype().size_bytes().max(1);
    let padded = kk.div_ceil(per) * per;
    let storage_shape: Vec<usize> = src.shape()[..r - 1].iter().copied().chain([padded]).collect();
    let storage = Tensor::empty(&storage_shape, t.dtype(), &t.device())?;
    let mut view = storage.narrow(r - 1, 0, kk)?;
    if r == 2 {
        kernels::copy2d(&src, &mut view)?;
    } else {
        kernels::copy3d(&src, &mut view)?;
    }
    // back to the operand's axis order (the permutation is its own inverse)
    Ok(Cow::Owned(view.permute(&perm)?))
}

/// True when f32 operands of a product with `tf32` set will be read by the tensor
/// cores — the GPU compiles for sm_90a (`kfuse_codegen`'s TF32 path is WGMMA) — and
/// so need the K-major, TMA-readable layout; on other targets the exact path reads
/// them as they lie.
fn tensor_core_f32(a: &Tensor, tf32: bool) -> bool {
    tf32 && a.dtype() == DType::F32 && a.device().target().is_some_and(|t| t.sm == 90)
}

/// Grouped products: `out[i] = a[i] · b[i]` for a list of independent problems of any
/// sizes (`a[i]: [M_i, K_i]`, `b[i]: [K_i, N_i]`), in one launch. See
/// [`gemm_grouped_ex`].
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// // two problems of different sizes, one launch
/// let (a0, b0) = (Tensor::full(&[2, 3], 1.0, DType::BF16, &dev)?, Tensor::full(&[3, 4], 1.0, DType::BF16, &dev)?);
/// let (a1, b1) = (Tensor::full(&[5, 8], 1.0, DType::BF16, &dev)?, Tensor::full(&[8, 1], 2.0, DType::BF16, &dev)?);
/// let out = kfuse::ops::gemm_grouped(&[&a0, &a1], &[&b0, &b1])?;
/// assert_eq!((out[0].shape(), out[1].shape()), (&[2, 4][..], &[5, 1][..]));
/// assert_eq!((out[0].to_vec_f32()?[0], out[1].to_vec_f32()?[0]), (3.0, 16.0));
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gemm_grouped(a: &[&Tensor], b: &[&Tensor]) -> Result<Vec<Tensor>> {
    gemm_grouped_ex(a, b, &GemmOptions::default())
}

/// Grouped products with scaling and an output dtype: `out[i] = alpha · scale_a ·
/// scale_b · (a[i] · b[i])`, each a new contiguous `[M_i, N_i]` tensor of dtype
/// `opts.out_dtype` (default: the operands').
///
/// One launch of the ordinary product kernel (`kernels::gemm_scaled`) over every
/// problem (`kfuse_runtime::launch_grouped`): each block finds its problem in a table
/// of pointers, strides and shapes, so the sizes need not agree. The operands are
/// 2-D, of one float dtype for all problems, on one device, any strides (16-bit
/// operands whose rows a 16-byte copy cannot read are copied to padded rows first, as
/// in [`crate::gemm`]). On the GPU f16/bf16 operands take the matrix path of the
/// target — on sm_90a TMA + WGMMA with each problem's tensor maps in global memory,
/// one persistent walk over every problem's tiles and the TMA-store epilogue per
/// problem; mma.sync on sm_80/sm_89 — and f32 operands exact f32 FMAs. `K_i = 0` gives zeros; `M_i = 0` or `N_i = 0` an
/// empty result.
///
/// Errors: lists of different lengths, an empty list, a rank other than 2, `K` that
/// differ within a problem, dtypes or devices that differ between problems, and
/// `c`, `beta`, `tf32` or 8-bit operands (not taken by grouped products yet).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let dev = Device::cpu();
/// use kfuse::ops::GemmOptions;
/// let a = Tensor::full(&[4, 4], 1.0, DType::BF16, &dev)?;
/// let opts = GemmOptions { alpha: 0.25, out_dtype: Some(DType::F32), ..Default::default() };
/// let out = kfuse::ops::gemm_grouped_ex(&[&a, &a], &[&a, &a.t()], &opts)?;
/// assert!(out.iter().all(|o| o.dtype() == DType::F32));
/// assert_eq!(out[1].to_vec_f32()?, [1.0; 16]);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn gemm_grouped_ex(a: &[&Tensor], b: &[&Tensor], opts: &GemmOptions<'_>) -> Result<Vec<Tensor>> {
    let what = "kfuse::ops::gemm_grouped";
    if a.len() != b.len() {
        return Err(Error::InvalidArgument(format!("{what}: {} `a` matrices but {} `b` matrices; one of each per problem", a.len(), b.len())));
    }
    if a.is_empty() {
        return Err(Error::InvalidArgument(format!("{what}: no problems")));
    }
    if opts.c.is_some() || opts.beta != 0.0 || opts.tf32 {
        return Err(Error::InvalidArgument(format!("{what}: `c`, `beta` and `tf32` are not taken by grouped products yet (use gemm_ex per problem)")));
    }
    let mut outs = Vec::with_capacity(a.len());
    for (i, (x, w)) in a.iter().zip(b).enumerate() {
        // the error of one problem, said as such (its kind kept)
        let at = |e: Error| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("problem #{i}: {m}")),
            Error::ShapeMismatch(m) => Error::ShapeMismatch(format!("problem #{i}: {m}")),
            Error::DTypeMismatch(m) => Error::DTypeMismatch(format!("problem #{i}: {m}")),
            Error::DeviceMismatch(m) => Error::DeviceMismatch(format!("problem #{i}: {m}")),
            e => e,
        };
        let (m, _, n, od) = check_2d(what, x, w, opts).map_err(at)?;
        if x.dtype().is_fp8() {
            return Err(at(Error::InvalidArgument(format!("{what}: 8-bit operands are not taken by grouped products yet"))));
        }
        if x.dtype() != a[0].dtype() || x.device() != a[0].device() {
            return Err(Error::InvalidArgument(format!(
                "{what}: problem #{i} is {} on {}, problem #0 {} on {}; one launch takes one dtype on one device",
                x.dtype(),
                x.device().name(),
                a[0].dtype(),
                a[0].device().name()
            )));
        }
        outs.push(Tensor::empty(&[m, n], od, &x.device())?);
    }
    // a problem with K = 0 sums nothing: its output is zeros, as `gemm` gives (its
    // operands have no rows for a copy engine to read), and it leaves the launch
    let mut launched = Vec::with_capacity(a.len());
    for (i, o) in outs.iter_mut().enumerate() {
        if a[i].shape()[1] == 0 {
            empty_sum(a[i], b[i], None, o, 0.0, None)?;
        } else {
            launched.push(i);
        }
    }
    // operands the copy engines can read (16-byte rows), on a GPU
    let gpu = a[0].device().is_gpu();
    let mut ops = Vec::with_capacity(launched.len());
    for &i in &launched {
        let (x, w) = (a[i], b[i]);
        ops.push(if gpu { (crate::tma_readable(x, false)?.into_owned(), crate::tma_readable(w, false)?.into_owned()) } else { (x.clone(), w.clone()) });
    }
    let alpha = opts.product_scale();
    let mut targets: Vec<&mut Tensor> = outs.iter_mut().enumerate().filter(|(i, _)| launched.contains(i)).map(|(_, o)| o).collect();
    let mut groups: Vec<Vec<Arg<'_>>> = ops
        .iter()
        .zip(targets.iter_mut())
        .map(|((x, w), o)| vec![Arg::In(x), Arg::In(w), Arg::Out(o), Arg::Scalar(Scalar::F32(alpha))])
        .collect();
    if !groups.is_empty() {
        kfuse_runtime::launch_grouped(&kernels::gemm_scaled::DEF, &mut groups)?;
    }
    drop(groups);
    Ok(outs)
}

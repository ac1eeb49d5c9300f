//! Convolution: [`conv2d`] and its options. NHWC activations, `[K, R, S, C / groups]`
//! filters; `#[kfuse]` kernels picked by the layer's shape and dtype:
//! - `kernels::conv2d_pointwise`: a 1 × 1, stride-1 convolution without padding or
//!   groups is the GEMM of the `[N·H·W, C]` pixels with the `[K, C]` filters read
//!   transposed (no copy), on the matrix path;
//! - `kernels::conv2d_depthwise`: one filter a channel (`groups = C = K`), a memory-bound
//!   walk of the taps;
//! - `kernels::conv2d_winograd_filter`, `_input`, `_output` and the batched product
//!   `kernels::gemm_batched_scaled`: an f32 3 × 3, stride-1 convolution without dilation
//!   or groups, as Winograd F(2 × 2, 3 × 3) (measured faster than the implicit GEMM on
//!   every such layer of `benches/conv2d.rs`: BENCHMARKS.md, "Convolution");
//! - `kernels::conv2d`: everything else, as an implicit GEMM whose rows (output pixels)
//!   gather their input pixels tap by tap.
//!
//! Bias and ReLU run in each kernel's epilogue (`max(y + bias, floor)`); GELU and SiLU
//! run as a second elementwise kernel over the output (`kfuse::ops::gelu` / `silu`).

use kfuse_ir::DType;
use kfuse_runtime::{Error, Result, Tensor};

use crate::kernels;

/// The activation applied after the bias: ReLU in f32 before the output is rounded (in
/// the convolution's epilogue); GELU and SiLU on the rounded output, by a second kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Activation {
    /// None: `y = conv + bias`.
    #[default]
    None,
    /// `max(y, 0)`.
    Relu,
    /// `y · Φ(y)` with the exact (erf) normal CDF, as PyTorch's default GELU.
    Gelu,
    /// `y · sigmoid(y)`.
    Silu,
}

impl Activation {
    /// The kernels' `floor` (their epilogue's `max(y, floor)`): 0 for ReLU.
    fn floor(self) -> f32 {
        match self {
            Activation::Relu => 0.0,
            _ => f32::NEG_INFINITY,
        }
    }

    /// The activation the epilogue does not fuse, applied by a second kernel.
    fn after(self, y: Tensor) -> Result<Tensor> {
        match self {
            Activation::Gelu => crate::gelu(&y),
            Activation::Silu => crate::silu(&y),
            Activation::None | Activation::Relu => Ok(y),
        }
    }
}

/// Options of [`conv2d`]. The default is stride 1, no padding, dilation 1, one group,
/// no bias, no activation. Change fields with struct update syntax:
/// `Conv2dOptions { padding: (1, 1), activation: Activation::Relu, ..Default::default() }`.
#[derive(Clone, Copy, Debug)]
pub struct Conv2dOptions<'a> {
    /// Steps between output pixels, `(rows, columns)`; at least 1.
    pub stride: (usize, usize),
    /// Zeros added on each side of the image, `(rows, columns)`.
    pub padding: (usize, usize),
    /// Steps between filter taps, `(rows, columns)`; at least 1.
    pub dilation: (usize, usize),
    /// Channel groups: input channels `C` and filters `K` split into `groups` equal
    /// parts, each filter seeing its group's `C / groups` channels.
    pub groups: usize,
    /// `[K]`, of the input's dtype, added to every output pixel.
    pub bias: Option<&'a Tensor>,
    /// Applied after the bias.
    pub activation: Activation,
}

impl Default for Conv2dOptions<'_> {
    fn default() -> Self {
        Conv2dOptions { stride: (1, 1), padding: (0, 0), dilation: (1, 1), groups: 1, bias: None, activation: Activation::None }
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(format!("kfuse::ops::conv2d: {msg}"))
}

fn shape_err(msg: String) -> Error {
    Error::ShapeMismatch(format!("kfuse::ops::conv2d: {msg}"))
}

/// The output extent along one spatial axis: `(n + 2·pad − dil·(f − 1) − 1) / stride + 1`,
/// or an error when the dilated filter is larger than the padded input.
fn out_extent(n: usize, f: usize, stride: usize, pad: usize, dil: usize, axis: &str) -> Result<usize> {
    let span = dil * (f - 1) + 1;
    let padded = n + 2 * pad;
    if span > padded {
        return Err(shape_err(format!(
            "along {axis} the filter spans {span} pixels (size {f}, dilation {dil}) but the padded input has {padded} ({n} + 2 × padding {pad}); \
             pad more or use a smaller filter or dilation"
        )));
    }
    Ok((padded - span) / stride + 1)
}

/// Checks the arguments; returns `[N, H, W, C, K, R, S, P, Q]`.
fn check(x: &Tensor, w: &Tensor, opts: &Conv2dOptions) -> Result<[usize; 9]> {
    if x.rank() != 4 || w.rank() != 4 {
        return Err(shape_err(format!(
            "`x` must be NHWC [N, H, W, C] and `w` [K, R, S, C / groups], got shapes {:?} and {:?}",
            x.shape(),
            w.shape()
        )));
    }
    if !matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(invalid(format!("`x` has dtype {}; convolution takes f32, f16 or bf16", x.dtype())));
    }
    if w.dtype() != x.dtype() {
        return Err(Error::DTypeMismatch(format!("kfuse::ops::conv2d: `w` is {} but `x` is {}; they must match", w.dtype(), x.dtype())));
    }
    if w.device() != x.device() {
        return Err(Error::DeviceMismatch(format!("kfuse::ops::conv2d: `w` is on {} but `x` is on {}", w.device().name(), x.device().name())));
    }
    let (g, (sh, sw), (dh, dw)) = (opts.groups, opts.stride, opts.dilation);
    if g == 0 || sh == 0 || sw == 0 || dh == 0 || dw == 0 {
        return Err(invalid(format!("groups ({g}), strides ({sh}, {sw}) and dilations ({dh}, {dw}) must be at least 1")));
    }
    let [n, h, wd, c] = [x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]];
    let [k, r, s, cg] = [w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]];
    if c == 0 || !c.is_multiple_of(g) || !k.is_multiple_of(g) {
        return Err(shape_err(format!("{c} input channels and {k} filters must both be divisible by groups = {g} (and channels at least 1)")));
    }
    if cg != c / g {
        return Err(shape_err(format!("`w` has {cg} channels a filter; with {c} input channels and groups = {g} it must have {}", c / g)));
    }
    if r == 0 || s == 0 {
        return Err(shape_err(format!("the filter must be at least 1 × 1, got {r} × {s}")));
    }
    if x.strides()[3] != 1 && c > 1 {
        return Err(invalid(format!(
            "`x` must be NHWC with its channels adjacent (stride 1), but its strides are {:?}; \
             for an NCHW tensor `t` pass `kfuse::ops::contiguous(&t.permute(&[0, 2, 3, 1])?)?`",
            x.strides()
        )));
    }
    if let Some(b) = opts.bias {
        if b.shape() != [k] {
            return Err(shape_err(format!("`bias` must be [K] = [{k}], got {:?}", b.shape())));
        }
        if b.dtype() != x.dtype() {
            return Err(Error::DTypeMismatch(format!("kfuse::ops::conv2d: `bias` is {} but `x` is {}; they must match", b.dtype(), x.dtype())));
        }
        if b.device() != x.device() {
            return Err(Error::DeviceMismatch(format!("kfuse::ops::conv2d: `bias` is on {} but `x` is on {}", b.device().name(), x.device().name())));
        }
    }
    let p = out_extent(h, r, sh, opts.padding.0, dh, "H")?;
    let q = out_extent(wd, s, sw, opts.padding.1, dw, "W")?;
    Ok([n, h, wd, c, k, r, s, p, q])
}

/// `w` viewed as `shape`, or a packed copy so viewed where its strides do not allow it
/// (filters are small).
fn view_or_copy(t: &Tensor, shape: &[usize]) -> Result<Tensor> {
    match t.view(shape) {
        Ok(v) => Ok(v),
        Err(_) => crate::contiguous(t)?.view(shape),
    }
}

/// Whether a layer takes Winograd F(2 × 2, 3 × 3) (`kernels::conv2d_winograd_*`): f32, a
/// 3 × 3 filter (`rs`), stride 1, no dilation, no groups.
fn winograd_pays(dt: DType, rs: (usize, usize), opts: &Conv2dOptions) -> bool {
    dt == DType::F32 && rs == (3, 3) && opts.stride == (1, 1) && opts.dilation == (1, 1) && opts.groups == 1
}

/// Winograd F(2 × 2, 3 × 3) into `y` (`[N, P, Q, K]`): the filters' and the input's
/// transforms, 16 products of `[TT, C]` by `[C, K]` in one batched launch, and the output's
/// transform with the bias and `floor` (four launches; three f32 scratch tensors of 16 ×
/// the filters, 4 × the input and 4 × the output).
fn winograd(x: &Tensor, w: &Tensor, bias: &Tensor, y: &Tensor, [n, p, q, c, k, ph, pw]: [usize; 7], floor: f32) -> Result<()> {
    let dev = x.device();
    let (tp, tq) = (p.div_ceil(2), q.div_ceil(2));
    let tt = n * tp * tq;
    let mut u = Tensor::empty(&[16, c, k], DType::F32, &dev)?;
    let mut v = Tensor::empty(&[16, tt, c], DType::F32, &dev)?;
    let mut m = Tensor::empty(&[16, tt, k], DType::F32, &dev)?;
    kernels::conv2d_winograd_filter(w, &mut u)?;
    kernels::conv2d_winograd_input(x, &mut v, tq as i64, (tp * tq) as i64, ph as i64, pw as i64)?;
    kernels::gemm_batched_scaled(&v, &u, &mut m, 1.0)?;
    let mut y = y.view(y.shape())?;
    kernels::conv2d_winograd_output(&m, bias, &mut y, tq as i64, (tp * tq) as i64, floor).map(|_| ())
}

/// 2-D convolution (cross-correlation, as PyTorch's `conv2d`) of NHWC `x: [N, H, W, C]`
/// with filters `w: [K, R, S, C / groups]`, plus `bias` and an activation: a new NHWC
/// `[N, P, Q, K]` tensor of `x`'s dtype, `P = (H + 2·pad_h − dil_h·(R − 1) − 1) / stride_h
/// + 1` (likewise `Q`).
///
/// f16 and bf16 accumulate in f32 on the tensor cores; f32 stays f32 (no TF32): exact FMAs
/// of the direct sum, or Winograd's transforms and products (below). `x` may have
/// any strides as long as its channels are adjacent (unit stride); `w` any strides (a
/// packed copy is made where `[R, S]` do not merge). One launch of one of three kernels,
/// or four for Winograd (module docs): a 1 × 1 stride-1 layer without padding or groups
/// is a GEMM reading the pixels and filters in place, depthwise layers (`groups = C = K`)
/// a memory-bound kernel, f32 3 × 3 stride-1 layers without dilation or groups Winograd
/// F(2 × 2, 3 × 3) (its transforms in f32 scratch tensors: 4 × the input, 4 × the output,
/// 16 × the filters; error within a few f32 roundings of the terms' size), the rest an
/// implicit GEMM.
///
/// Errors (nothing is launched): ranks, channel counts not divisible by `groups`, a `w`
/// of the wrong channel count, a dilated filter larger than the padded input, a `bias`
/// not `[K]` (`ShapeMismatch`); strides, dilations or groups of 0, a dtype other than
/// f32/f16/bf16, channels not adjacent in `x` (NCHW strides; the message names the fix)
/// (`InvalidArgument`); dtypes or devices that differ (`DTypeMismatch`,
/// `DeviceMismatch`).
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
/// use kfuse::ops::{Activation, Conv2dOptions};
///
/// let dev = Device::cpu();
/// let x = Tensor::full(&[1, 4, 4, 2], 1.0, DType::F32, &dev)?; // NHWC
/// let w = Tensor::full(&[3, 3, 3, 2], 0.5, DType::F32, &dev)?; // [K, R, S, C]
/// let opts = Conv2dOptions { padding: (1, 1), activation: Activation::Relu, ..Default::default() };
/// let y = kfuse::ops::conv2d(&x, &w, &opts)?;
/// assert_eq!(y.shape(), [1, 4, 4, 3]);
/// // a corner pixel sees 2 × 2 taps of 2 channels: 8 · 0.5
/// assert_eq!(y.to_vec_f32()?[0], 4.0);
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn conv2d(x: &Tensor, w: &Tensor, opts: &Conv2dOptions) -> Result<Tensor> {
    let [n, h, wd, c, k, r, s, p, q] = check(x, w, opts)?;
    let dev = x.device();
    let dt = x.dtype();
    let y = Tensor::empty(&[n, p, q, k], dt, &dev)?;
    if y.numel() == 0 {
        return Ok(y);
    }
    let bias = match opts.bias {
        Some(b) => b.clone(),
        None => Tensor::zeros(&[k], dt, &dev)?,
    };
    let floor = opts.activation.floor();
    let g = opts.groups;
    let (sh, sw) = opts.stride;
    let (ph, pw) = opts.padding;
    let (dh, dw) = opts.dilation;
    let npq = n * p * q;
    let pointwise = r == 1 && s == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0 && g == 1;
    if pointwise {
        if let Ok(xm) = x.view(&[n * h * wd, c]) {
            let wm = view_or_copy(w, &[k, c])?;
            let mut ym = y.view(&[npq, k])?;
            kernels::conv2d_pointwise(&xm, &wm.t(), &bias, &mut ym, floor)?;
            return opts.activation.after(y);
        }
    }
    if winograd_pays(dt, (r, s), opts) {
        winograd(x, w, &bias, &y, [n, p, q, c, k, ph, pw], floor)?;
        return opts.activation.after(y);
    }
    let geom = [q as i64, (p * q) as i64, s as i64, sh as i64, sw as i64, ph as i64, pw as i64, dh as i64, dw as i64];
    let [oq, pq, _, sh, sw, ph, pw, dh, dw] = geom;
    if g == c && k == c {
        // tap-major filters `[R, S, C]` (a small copy)
        let wm = crate::contiguous(&view_or_copy(w, &[c, r * s])?.t())?.view(&[r, s, c])?;
        let mut ym = y.view(&[npq, c])?;
        kernels::conv2d_depthwise(x, &wm, &bias, &mut ym, oq, pq, sh, sw, ph, pw, dh, dw, floor)?;
        return opts.activation.after(y);
    }
    let (cg, kg) = (c / g, k / g);
    let xg = x.view(&[n, h, wd, g, cg])?;
    let wg = view_or_copy(w, &[g, kg, r, s, cg])?;
    let mut yg = y.view(&[npq, g, kg])?;
    kernels::conv2d(&xg, &wg, &bias.view(&[g, kg])?, &mut yg, oq, pq, sh, sw, ph, pw, dh, dw, floor)?;
    opts.activation.after(y)
}

//! The kernels of `kfuse::ops`, each a `#[kfuse]` function. Each one here generates a
//! launcher of the same name (explicit output tensor) and a module with its
//! `KernelDef` and IR builder; the friendly API in the crate root allocates outputs and
//! checks arguments.
//!
//! Elementwise kernels work on tensors viewed as one dimension `N` (contiguous, or one
//! strided dimension), or as `[NB, M, N]` views of any strides (`add3d` …); the scheduler
//! picks the tiles `BN` (and `BM`).

use kfuse_macros::kfuse;

/// `out = a + b`.
#[kfuse(crate = "crate::deps")]
pub fn add<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(a.block([i * BN], [BN]).load() + b.block([i * BN], [BN]).load());
}

/// `out = a - b`.
#[kfuse(crate = "crate::deps")]
pub fn sub<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(a.block([i * BN], [BN]).load() - b.block([i * BN], [BN]).load());
}

/// `out = a * b`.
#[kfuse(crate = "crate::deps")]
pub fn mul<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(a.block([i * BN], [BN]).load() * b.block([i * BN], [BN]).load());
}

/// `out = a / b`.
#[kfuse(crate = "crate::deps")]
pub fn div<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(a.block([i * BN], [BN]).load() / b.block([i * BN], [BN]).load());
}

/// `out = x * s`, computed in f32 and rounded once.
#[kfuse(crate = "crate::deps")]
pub fn scale<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, s: f32) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store((v * s).cast::<T>());
}

/// SiLU: `x * sigmoid(x)`, in f32.
#[kfuse(crate = "crate::deps")]
pub fn silu<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store((v * sigmoid(v)).cast::<T>());
}

/// GELU, erf form: `0.5 x (1 + erf(x / sqrt 2))`, in f32.
#[kfuse(crate = "crate::deps")]
pub fn gelu<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store((0.5 * v * (1.0 + erf(v * 0.7071067811865476))).cast::<T>());
}

/// GELU, tanh form: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, in f32.
#[kfuse(crate = "crate::deps")]
pub fn gelu_tanh<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32();
    let inner = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    out.block([i * BN], [BN]).store((0.5 * v * (1.0 + tanh(inner))).cast::<T>());
}

/// SwiGLU activation: `silu(g) * u`, in f32.
#[kfuse(crate = "crate::deps")]
pub fn swiglu<T: Float>(g: Tensor<T, (N,)>, u: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let gv = g.block([i * BN], [BN]).load().to_f32();
    let uv = u.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store((gv * sigmoid(gv) * uv).cast::<T>());
}

// The elementwise ops on strided tensors: `[NB, M, N]` views of any strides (the API
// merges what dimensions its operands allow and pads the rest to rank 3), one program per
// `BM × BN` tile of one matrix `z` of the batch, as in `copy3d`. The output is contiguous;
// the inputs are read as they lie.

/// `out = a + b` on strided `[NB, M, N]` views.
#[kfuse(crate = "crate::deps")]
pub fn add3d<T: Float>(a: Tensor<T, (NB, M, N)>, b: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let (x, y) = (a.block([z, i * BM, j * BN], [_, BM, BN]).load(), b.block([z, i * BM, j * BN], [_, BM, BN]).load());
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(x + y);
}

/// `out = a - b` on strided `[NB, M, N]` views.
#[kfuse(crate = "crate::deps")]
pub fn sub3d<T: Float>(a: Tensor<T, (NB, M, N)>, b: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let (x, y) = (a.block([z, i * BM, j * BN], [_, BM, BN]).load(), b.block([z, i * BM, j * BN], [_, BM, BN]).load());
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(x - y);
}

/// `out = a * b` on strided `[NB, M, N]` views.
#[kfuse(crate = "crate::deps")]
pub fn mul3d<T: Float>(a: Tensor<T, (NB, M, N)>, b: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let (x, y) = (a.block([z, i * BM, j * BN], [_, BM, BN]).load(), b.block([z, i * BM, j * BN], [_, BM, BN]).load());
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(x * y);
}

/// `out = a / b` on strided `[NB, M, N]` views.
#[kfuse(crate = "crate::deps")]
pub fn div3d<T: Float>(a: Tensor<T, (NB, M, N)>, b: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let (x, y) = (a.block([z, i * BM, j * BN], [_, BM, BN]).load(), b.block([z, i * BM, j * BN], [_, BM, BN]).load());
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(x / y);
}

/// `out = silu(g) * u` on strided `[NB, M, N]` views, in f32.
#[kfuse(crate = "crate::deps")]
pub fn swiglu3d<T: Float>(g: Tensor<T, (NB, M, N)>, u: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let gv = g.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32();
    let uv = u.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32();
    out.block([z, i * BM, j * BN], [_, BM, BN]).store((gv * sigmoid(gv) * uv).cast::<T>());
}

/// `out = x * s` on strided `[NB, M, N]` views, in f32.
#[kfuse(crate = "crate::deps")]
pub fn scale3d<T: Float>(x: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>, s: f32) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let v = x.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32();
    out.block([z, i * BM, j * BN], [_, BM, BN]).store((v * s).cast::<T>());
}

/// SiLU on strided `[NB, M, N]` views, in f32.
#[kfuse(crate = "crate::deps")]
pub fn silu3d<T: Float>(x: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let v = x.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32();
    out.block([z, i * BM, j * BN], [_, BM, BN]).store((v * sigmoid(v)).cast::<T>());
}

/// GELU (erf form) on strided `[NB, M, N]` views, in f32.
#[kfuse(crate = "crate::deps")]
pub fn gelu3d<T: Float>(x: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let v = x.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32();
    out.block([z, i * BM, j * BN], [_, BM, BN]).store((0.5 * v * (1.0 + erf(v * 0.7071067811865476))).cast::<T>());
}

/// GELU (tanh form) on strided `[NB, M, N]` views, in f32.
#[kfuse(crate = "crate::deps")]
pub fn gelu_tanh3d<T: Float>(x: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let v = x.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32();
    let inner = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    out.block([z, i * BM, j * BN], [_, BM, BN]).store((0.5 * v * (1.0 + tanh(inner))).cast::<T>());
}

/// Copies a contiguous tensor.
#[kfuse(crate = "crate::deps")]
pub fn copy<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load());
}

/// Copies a strided 2-D tensor into a contiguous one (`contiguous()`).
#[kfuse(crate = "crate::deps")]
pub fn copy2d<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    out.block([i * BM, j * BN], [BM, BN]).store(x.block([i * BM, j * BN], [BM, BN]).load());
}

/// Copies a strided 3-D tensor into a contiguous one: one program per `BM × BN` tile of
/// one matrix `z` of the batch.
#[kfuse(crate = "crate::deps")]
pub fn copy3d<T: Float>(x: Tensor<T, (NB, M, N)>, out: &mut Tensor<T, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(x.block([z, i * BM, j * BN], [_, BM, BN]).load());
}

/// `out = x^T` for a 2-D tensor.
#[kfuse(crate = "crate::deps")]
pub fn transpose<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (N, M)>) {
    let (i, j) = (program_id(0), program_id(1));
    let t = x.block([i * BM, j * BN], [BM, BN]).load();
    out.block([j * BN, i * BM], [BN, BM]).store(t.t());
}

// ---------------------------------------------------------------------------------------
// Row kernels: one program per block of `BM` rows of an `[M, N]` view, the whole row
// (`N`) in one tile. `BM` is the scheduler's choice (from N and the target); nothing
// here fixes how many rows a block holds. Statistics are f32; results round to `T` once.

/// Sum of each row, accumulated in f32: `out[m] = Σ_n x[m, n]`.
#[kfuse(crate = "crate::deps")]
pub fn row_sum<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M,)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    out.block([i * BM], [BM]).store(t.sum_axis(1).cast::<T>());
}

/// Mean of each row, accumulated in f32.
#[kfuse(crate = "crate::deps")]
pub fn row_mean<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M,)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    out.block([i * BM], [BM]).store(t.mean_axis(1).cast::<T>());
}

/// Maximum of each row (exact).
#[kfuse(crate = "crate::deps")]
pub fn row_max<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M,)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load();
    out.block([i * BM], [BM]).store(t.max_axis(1));
}

/// Minimum of each row (exact).
#[kfuse(crate = "crate::deps")]
pub fn row_min<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M,)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load();
    out.block([i * BM], [BM]).store(t.min_axis(1));
}

/// Softmax of each row: `exp(x - max) / Σ exp(x - max)`, in f32. A row of only `-inf`
/// gives NaN (as PyTorch does).
#[kfuse(crate = "crate::deps")]
pub fn softmax<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let e = exp(t - t.max_keepdim(1));
    out.block([i * BM, 0], [BM, N]).store((e / e.sum_keepdim(1)).cast::<T>());
}

/// Log-softmax of each row: `x - max - ln Σ exp(x - max)`, in f32. A row of only `-inf`
/// gives NaN (as PyTorch does).
#[kfuse(crate = "crate::deps")]
pub fn log_softmax<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let s = t - t.max_keepdim(1);
    out.block([i * BM, 0], [BM, N]).store((s - ln(exp(s).sum_keepdim(1))).cast::<T>());
}

/// RMSNorm without weight: `y = x * rsqrt(mean(x²) + eps)`; `rstd` gets the factor.
#[kfuse(crate = "crate::deps")]
pub fn rms_norm<T: Float>(x: Tensor<T, (M, N)>, y: &mut Tensor<T, (M, N)>, rstd: &mut Tensor<f32, (M,)>, eps: f32) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let r = rsqrt((t * t).mean_axis(1) + eps);
    y.block([i * BM, 0], [BM, N]).store((t * r.unsqueeze(1)).cast::<T>());
    rstd.block([i * BM], [BM]).store(r);
}

/// RMSNorm with weight: `y = x * rsqrt(mean(x²) + eps) * w`.
#[kfuse(crate = "crate::deps")]
pub fn rms_norm_w<T: Float>(x: Tensor<T, (M, N)>, w: Tensor<T, (N,)>, y: &mut Tensor<T, (M, N)>, rstd: &mut Tensor<f32, (M,)>, eps: f32) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let r = rsqrt((t * t).mean_axis(1) + eps);
    y.block([i * BM, 0], [BM, N]).store((t * r.unsqueeze(1) * w.load().to_f32()).cast::<T>());
    rstd.block([i * BM], [BM]).store(r);
}

/// RMSNorm with weight and bias: `y = x * rsqrt(mean(x²) + eps) * w + b`.
#[kfuse(crate = "crate::deps")]
pub fn rms_norm_wb<T: Float>(
    x: Tensor<T, (M, N)>,
    w: Tensor<T, (N,)>,
    b: Tensor<T, (N,)>,
    y: &mut Tensor<T, (M, N)>,
    rstd: &mut Tensor<f32, (M,)>,
    eps: f32,
) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let r = rsqrt((t * t).mean_axis(1) + eps);
    let v = t * r.unsqueeze(1) * w.load().to_f32() + b.load().to_f32();
    y.block([i * BM, 0], [BM, N]).store(v.cast::<T>());
    rstd.block([i * BM], [BM]).store(r);
}

/// Residual add, then RMSNorm without weight: `s = x + r` (rounded to `T`), `y = s *
/// rsqrt(mean(s²) + eps)`.
#[kfuse(crate = "crate::deps")]
pub fn add_rms_norm<T: Float>(
    x: Tensor<T, (M, N)>,
    r: Tensor<T, (M, N)>,
    s: &mut Tensor<T, (M, N)>,
    y: &mut Tensor<T, (M, N)>,
    rstd: &mut Tensor<f32, (M,)>,
    eps: f32,
) {
    let i = program_id(0);
    let sum = (x.block([i * BM, 0], [BM, N]).load().to_f32() + r.block([i * BM, 0], [BM, N]).load().to_f32()).cast::<T>();
    s.block([i * BM, 0], [BM, N]).store(sum);
    let t = sum.to_f32();
    let q = rsqrt((t * t).mean_axis(1) + eps);
    y.block([i * BM, 0], [BM, N]).store((t * q.unsqueeze(1)).cast::<T>());
    rstd.block([i * BM], [BM]).store(q);
}

/// Residual add, then RMSNorm with weight: `s = x + r`, `y = s * rsqrt(mean(s²) + eps) * w`.
#[kfuse(crate = "crate::deps")]
pub fn add_rms_norm_w<T: Float>(
    x: Tensor<T, (M, N)>,
    r: Tensor<T, (M, N)>,
    w: Tensor<T, (N,)>,
    s: &mut Tensor<T, (M, N)>,
    y: &mut Tensor<T, (M, N)>,
    rstd: &mut Tensor<f32, (M,)>,
    eps: f32,
) {
    let i = program_id(0);
    let sum = (x.block([i * BM, 0], [BM, N]).load().to_f32() + r.block([i * BM, 0], [BM, N]).load().to_f32()).cast::<T>();
    s.block([i * BM, 0], [BM, N]).store(sum);
    let t = sum.to_f32();
    let q = rsqrt((t * t).mean_axis(1) + eps);
    y.block([i * BM, 0], [BM, N]).store((t * q.unsqueeze(1) * w.load().to_f32()).cast::<T>());
    rstd.block([i * BM], [BM]).store(q);
}

/// LayerNorm with weight and bias: `y = (x - mean) * rsqrt(var + eps) * w + b`, with the
/// biased variance `mean((x - mean)²)` (as PyTorch); writes the row means and rstds.
#[kfuse(crate = "crate::deps")]
pub fn layer_norm<T: Float>(
    x: Tensor<T, (M, N)>,
    w: Tensor<T, (N,)>,
    b: Tensor<T, (N,)>,
    y: &mut Tensor<T, (M, N)>,
    mean: &mut Tensor<f32, (M,)>,
    rstd: &mut Tensor<f32, (M,)>,
    eps: f32,
) {
    let i = program_id(0);
    let t = x.block([i * BM, 0], [BM, N]).load().to_f32();
    let mu = t.mean_axis(1);
    let c = t - mu.unsqueeze(1);
    let r = rsqrt((c * c).mean_axis(1) + eps);
    y.block([i * BM, 0], [BM, N]).store((c * r.unsqueeze(1) * w.load().to_f32() + b.load().to_f32()).cast::<T>());
    mean.block([i * BM], [BM]).store(mu);
    rstd.block([i * BM], [BM]).store(r);
}

// ---------------------------------------------------------------------------------------
// Whole-tensor reductions: each program reduces one chunk of `CHUNK` elements of a 1-D
// view to one f32 partial (`p[i]`); the caller repeats on the partials until one value
// is left. The chunk is a literal so that the caller can size `p` (`ceil(N / CHUNK)`);
// the order of every sum is fixed by the code, so the result has the same bits on every
// run (no atomics).

/// Elements per program of the chunked reductions (the literal in the kernels below).
pub const CHUNK: usize = 4096;

/// `p[i] = (Σ x[i*CHUNK .. (i+1)*CHUNK]) / d`, accumulated in f32, rounded to `U`.
#[kfuse(crate = "crate::deps")]
pub fn sum_chunks<T: Float, U: Float>(x: Tensor<T, (N,)>, p: &mut Tensor<U, (P,)>, d: f32) {
    let i = program_id(0);
    let v = x.block([i * 4096], [4096]).load().to_f32().sum();
    p.row(i).store((v / d).cast::<U>());
}

/// `p[i] = max x[i*CHUNK .. (i+1)*CHUNK]` (exact).
#[kfuse(crate = "crate::deps")]
pub fn max_chunks<T: Float, U: Float>(x: Tensor<T, (N,)>, p: &mut Tensor<U, (P,)>) {
    let i = program_id(0);
    let v = x.block([i * 4096], [4096]).load().to_f32().max();
    p.row(i).store(v.cast::<U>());
}

/// `p[i] = min x[i*CHUNK .. (i+1)*CHUNK]` (exact).
#[kfuse(crate = "crate::deps")]
pub fn min_chunks<T: Float, U: Float>(x: Tensor<T, (N,)>, p: &mut Tensor<U, (P,)>) {
    let i = program_id(0);
    let v = x.block([i * 4096], [4096]).load().to_f32().min();
    p.row(i).store(v.cast::<U>());
}

// ---------------------------------------------------------------------------------------
// Rotary position embedding (RoPE), in place on `q` and `k` in one launch, one program
// per token. The API (`crate::rope`) views a head of `D` elements as `[R, DH]` with
// `R = 2`, `DH = D / 2`: element `(r, j)` is half `r` of pair `j`. Half-split (NeoX,
// Llama) heads are the contiguous view `[2, D/2]`; interleaved (GPT-J) heads are
// `[D/2, 2]` permuted to `[2, D/2]` (strides `1, 2`): the kernels are the same, the
// strides differ. `_` picks one half: `q.block([t, 0, r, 0], [_, HQ, _, DH])` is the
// `[HQ, DH]` tile of half `r` of every head of token `t`. With `x1`, `x2` the halves and
// the angle `θ_j = pos · base^(-2j/D)`:
//   out1 = x1 cos θ − x2 sin θ,  out2 = x2 cos θ + x1 sin θ  (f32, rounded to T once).
// Every element is loaded before it is stored, by the program that stores it (a token's
// elements belong to that token's program only).
//
// Positions: `offset + t % seq` (scalars), or `pos[t]` read from an `i64` tensor.
// Angles: computed (`exp(-j ln(base) / DH)` from `iota`, then `sin`/`cos`, all in f32),
// or rows `pos` of `cos`/`sin` tables `[P, DH]`. A position outside the table loads no
// lane, so that token is left as it was (the API checks offsets; a position tensor is
// the caller's to keep in range).

/// RoPE with positions `offset + t % seq` and angles computed from `base`.
#[kfuse(crate = "crate::deps")]
pub fn rope_offset<T: Float>(
    q: &mut Tensor<T, (NT, HQ, R, DH)>,
    k: &mut Tensor<T, (NT, HK, R, DH)>,
    seq: i64,
    offset: i64,
    base: f32,
) {
    let t = program_id(0);
    let pos = (offset + t % seq).to_f32();
    let angle = pos * exp(iota(DH).to_f32() * (-ln(base) / DH.to_f32()));
    let (c, s) = (cos(angle), sin(angle));
    let q1 = q.block([t, 0, 0, 0], [_, HQ, _, DH]).load().to_f32();
    let q2 = q.block([t, 0, 1, 0], [_, HQ, _, DH]).load().to_f32();
    q.block([t, 0, 0, 0], [_, HQ, _, DH]).store((q1 * c - q2 * s).cast::<T>());
    q.block([t, 0, 1, 0], [_, HQ, _, DH]).store((q2 * c + q1 * s).cast::<T>());
    let k1 = k.block([t, 0, 0, 0], [_, HK, _, DH]).load().to_f32();
    let k2 = k.block([t, 0, 1, 0], [_, HK, _, DH]).load().to_f32();
    k.block([t, 0, 0, 0], [_, HK, _, DH]).store((k1 * c - k2 * s).cast::<T>());
    k.block([t, 0, 1, 0], [_, HK, _, DH]).store((k2 * c + k1 * s).cast::<T>());
}

/// RoPE with positions read from `pos` (one per token) and angles computed from `base`.
#[kfuse(crate = "crate::deps")]
pub fn rope_pos<T: Float>(
    q: &mut Tensor<T, (NT, HQ, R, DH)>,
    k: &mut Tensor<T, (NT, HK, R, DH)>,
    pos: Tensor<i64, (NT,)>,
    base: f32,
) {
    let t = program_id(0);
    let p = pos.row(t).load().to_f32();
    let angle = p * exp(iota(DH).to_f32() * (-ln(base) / DH.to_f32()));
    let (c, s) = (cos(angle), sin(angle));
    let q1 = q.block([t, 0, 0, 0], [_, HQ, _, DH]).load().to_f32();
    let q2 = q.block([t, 0, 1, 0], [_, HQ, _, DH]).load().to_f32();
    q.block([t, 0, 0, 0], [_, HQ, _, DH]).store((q1 * c - q2 * s).cast::<T>());
    q.block([t, 0, 1, 0], [_, HQ, _, DH]).store((q2 * c + q1 * s).cast::<T>());
    let k1 = k.block([t, 0, 0, 0], [_, HK, _, DH]).load().to_f32();
    let k2 = k.block([t, 0, 1, 0], [_, HK, _, DH]).load().to_f32();
    k.block([t, 0, 0, 0], [_, HK, _, DH]).store((k1 * c - k2 * s).cast::<T>());
    k.block([t, 0, 1, 0], [_, HK, _, DH]).store((k2 * c + k1 * s).cast::<T>());
}

/// RoPE with positions `offset + t % seq` and angles from `cos`/`sin` tables (row = position).
#[kfuse(crate = "crate::deps")]
pub fn rope_table_offset<T: Float, C: Float>(
    q: &mut Tensor<T, (NT, HQ, R, DH)>,
    k: &mut Tensor<T, (NT, HK, R, DH)>,
    cos: Tensor<C, (P, DH)>,
    sin: Tensor<C, (P, DH)>,
    seq: i64,
    offset: i64,
) {
    let t = program_id(0);
    let p = offset + t % seq;
    let c = cos.block([p, 0], [_, DH]).load().to_f32();
    let s = sin.block([p, 0], [_, DH]).load().to_f32();
    let q1 = q.block([t, 0, 0, 0], [_, HQ, _, DH]).load().to_f32();
    let q2 = q.block([t, 0, 1, 0], [_, HQ, _, DH]).load().to_f32();
    q.block([t, 0, 0, 0], [_, HQ, _, DH]).store((q1 * c - q2 * s).cast::<T>());
    q.block([t, 0, 1, 0], [_, HQ, _, DH]).store((q2 * c + q1 * s).cast::<T>());
    let k1 = k.block([t, 0, 0, 0], [_, HK, _, DH]).load().to_f32();
    let k2 = k.block([t, 0, 1, 0], [_, HK, _, DH]).load().to_f32();
    k.block([t, 0, 0, 0], [_, HK, _, DH]).store((k1 * c - k2 * s).cast::<T>());
    k.block([t, 0, 1, 0], [_, HK, _, DH]).store((k2 * c + k1 * s).cast::<T>());
}

/// RoPE with positions read from `pos` and angles from `cos`/`sin` tables.
#[kfuse(crate = "crate::deps")]
pub fn rope_table_pos<T: Float, C: Float>(
    q: &mut Tensor<T, (NT, HQ, R, DH)>,
    k: &mut Tensor<T, (NT, HK, R, DH)>,
    pos: Tensor<i64, (NT,)>,
    cos: Tensor<C, (P, DH)>,
    sin: Tensor<C, (P, DH)>,
) {
    let t = program_id(0);
    let p = pos.row(t).load();
    let c = cos.block([p, 0], [_, DH]).load().to_f32();
    let s = sin.block([p, 0], [_, DH]).load().to_f32();
    let q1 = q.block([t, 0, 0, 0], [_, HQ, _, DH]).load().to_f32();
    let q2 = q.block([t, 0, 1, 0], [_, HQ, _, DH]).load().to_f32();
    q.block([t, 0, 0, 0], [_, HQ, _, DH]).store((q1 * c - q2 * s).cast::<T>());
    q.block([t, 0, 1, 0], [_, HQ, _, DH]).store((q2 * c + q1 * s).cast::<T>());
    let k1 = k.block([t, 0, 0, 0], [_, HK, _, DH]).load().to_f32();
    let k2 = k.block([t, 0, 1, 0], [_, HK, _, DH]).load().to_f32();
    k.block([t, 0, 0, 0], [_, HK, _, DH]).store((k1 * c - k2 * s).cast::<T>());
    k.block([t, 0, 1, 0], [_, HK, _, DH]).store((k2 * c + k1 * s).cast::<T>());
}

// ---------------------------------------------------------------------------------------
// Matrix products.

/// `c = a · b` for `a: [M, K]`, `b: [K, N]`: each program computes one `BM × BN` tile of
/// `c`, walking `K` in steps of `BK` and accumulating `dot`s of tiles in f32; the sum is
/// rounded to `T` once, at the store. Edges of any shape are masked (`K` need not be a
/// multiple of `BK`); `K = 0` stores zeros (the loop runs zero times). The scheduler
/// picks `BM`, `BN` and `BK`.
#[kfuse(crate = "crate::deps")]
pub fn gemm<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, c: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    c.block([i * BM, j * BN], [BM, BN]).store(acc.cast::<T>());
}

// The configurable products of `kfuse::ops::gemm_ex` and `gemm_batched`: the same loop,
// with the scaling (and `beta * c`) in the epilogue, which the compiler fuses after the
// loop. `T` is the operands' dtype, `O` the output's (and `c`'s); accumulation is f32,
// the result is rounded to `O` once.

/// `out = alpha * (a · b)` for `a: [M, K]`, `b: [K, N]`, rounded to `O`.
#[kfuse(crate = "crate::deps")]
pub fn gemm_scaled<T: Float, O: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, out: &mut Tensor<O, (M, N)>, alpha: f32) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store((acc * alpha).cast::<O>());
}

/// `out = alpha * (a · b) + beta * c` for `a: [M, K]`, `b: [K, N]`, `c: [M, N]`, in f32,
/// rounded to `O`.
#[kfuse(crate = "crate::deps")]
pub fn gemm_axpby<T: Float, O: Float>(
    a: Tensor<T, (M, K)>,
    b: Tensor<T, (K, N)>,
    c: Tensor<O, (M, N)>,
    out: &mut Tensor<O, (M, N)>,
    alpha: f32,
    beta: f32,
) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    let y = acc * alpha + c.block([i * BM, j * BN], [BM, BN]).load().to_f32() * beta;
    out.block([i * BM, j * BN], [BM, BN]).store(y.cast::<O>());
}

/// `out[z] = alpha * (a[z] · b[z])` for `NB` independent products (`a: [NB, M, K]`,
/// `b: [NB, K, N]`): program `(i, j, z)` computes tile `(i, j)` of product `z`; `_`
/// indexes the batch and leaves it out of the tile, so the loop is the 2-D one.
#[kfuse(crate = "crate::deps")]
pub fn gemm_batched_scaled<T: Float, O: Float>(
    a: Tensor<T, (NB, M, K)>,
    b: Tensor<T, (NB, K, N)>,
    out: &mut Tensor<O, (NB, M, N)>,
    alpha: f32,
) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([z, i * BM, k], [_, BM, BK]).load(), b.block([z, k, j * BN], [_, BK, BN]).load());
    }
    out.block([z, i * BM, j * BN], [_, BM, BN]).store((acc * alpha).cast::<O>());
}

/// `out[z] = alpha * (a[z] · b[z]) + beta * c[z]`, batched as [`gemm_batched_scaled()`].
#[kfuse(crate = "crate::deps")]
pub fn gemm_batched_axpby<T: Float, O: Float>(
    a: Tensor<T, (NB, M, K)>,
    b: Tensor<T, (NB, K, N)>,
    c: Tensor<O, (NB, M, N)>,
    out: &mut Tensor<O, (NB, M, N)>,
    alpha: f32,
    beta: f32,
) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([z, i * BM, k], [_, BM, BK]).load(), b.block([z, k, j * BN], [_, BK, BN]).load());
    }
    let y = acc * alpha + c.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32() * beta;
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(y.cast::<O>());
}

// The same products with f32 operands whose `dot` may read them as TF32 (`dot_tf32`):
// `kfuse::ops::gemm_ex` and `gemm_batched_ex` with `GemmOptions::tf32`. On sm_90a the
// loop runs on the tensor cores (`wgmma … k8 … tf32`, operands K-major); elsewhere the
// products are exact (the FMA path). `O` is the output's dtype (and `c`'s).

/// `out = alpha * (a · b)` for f32 `a: [M, K]`, `b: [K, N]` read as TF32, rounded to `O`.
#[kfuse(crate = "crate::deps")]
pub fn gemm_tf32_scaled<O: Float>(a: Tensor<f32, (M, K)>, b: Tensor<f32, (K, N)>, out: &mut Tensor<O, (M, N)>, alpha: f32) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot_tf32(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store((acc * alpha).cast::<O>());
}

/// `out = alpha * (a · b) + beta * c` for f32 `a: [M, K]`, `b: [K, N]` read as TF32,
/// `c: [M, N]`, in f32, rounded to `O`.
#[kfuse(crate = "crate::deps")]
pub fn gemm_tf32_axpby<O: Float>(
    a: Tensor<f32, (M, K)>,
    b: Tensor<f32, (K, N)>,
    c: Tensor<O, (M, N)>,
    out: &mut Tensor<O, (M, N)>,
    alpha: f32,
    beta: f32,
) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot_tf32(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    let y = acc * alpha + c.block([i * BM, j * BN], [BM, BN]).load().to_f32() * beta;
    out.block([i * BM, j * BN], [BM, BN]).store(y.cast::<O>());
}

/// `out[z] = alpha * (a[z] · b[z])`, batched as [`gemm_batched_scaled()`], f32 operands
/// read as TF32.
#[kfuse(crate = "crate::deps")]
pub fn gemm_batched_tf32_scaled<O: Float>(
    a: Tensor<f32, (NB, M, K)>,
    b: Tensor<f32, (NB, K, N)>,
    out: &mut Tensor<O, (NB, M, N)>,
    alpha: f32,
) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot_tf32(a.block([z, i * BM, k], [_, BM, BK]).load(), b.block([z, k, j * BN], [_, BK, BN]).load());
    }
    out.block([z, i * BM, j * BN], [_, BM, BN]).store((acc * alpha).cast::<O>());
}

/// `out[z] = alpha * (a[z] · b[z]) + beta * c[z]`, batched as [`gemm_batched_axpby()`],
/// f32 operands read as TF32.
#[kfuse(crate = "crate::deps")]
pub fn gemm_batched_tf32_axpby<O: Float>(
    a: Tensor<f32, (NB, M, K)>,
    b: Tensor<f32, (NB, K, N)>,
    c: Tensor<O, (NB, M, N)>,
    out: &mut Tensor<O, (NB, M, N)>,
    alpha: f32,
    beta: f32,
) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot_tf32(a.block([z, i * BM, k], [_, BM, BK]).load(), b.block([z, k, j * BN], [_, BK, BN]).load());
    }
    let y = acc * alpha + c.block([z, i * BM, j * BN], [_, BM, BN]).load().to_f32() * beta;
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(y.cast::<O>());
}

/// The SwiGLU projection pair in one kernel: `out = silu(x · wg) ⊙ (x · wu)` for
/// `x: [M, K]`, `wg`, `wu: [K, N]`. One loop over `K` carries two f32 accumulators that
/// share the `x` tile (read once per step: the matrix path loads it once a stage and
/// both products read it); the epilogue applies `silu(g) · u` in f32 on the
/// accumulators and rounds to `T` once.
#[kfuse(crate = "crate::deps")]
pub fn swiglu_gemm<T: Float>(x: Tensor<T, (M, K)>, wg: Tensor<T, (K, N)>, wu: Tensor<T, (K, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut g = zeros::<f32>([BM, BN]);
    let mut u = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        let a = x.block([i * BM, k], [BM, BK]).load();
        g += dot(a, wg.block([k, j * BN], [BK, BN]).load());
        u += dot(a, wu.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store((g * sigmoid(g) * u).cast::<T>());
}

// ---------------------------------------------------------------------------------------
// Attention forward (`crate::attention`): one program is `BM` query rows of one query
// head (`program_id(1)`) of one batch (`program_id(2)`), reading key/value head
// `h / group` (grouped-query attention). Query row `r` sits on key `r + SK − SQ` (the
// diagonal, aligned to the bottom right as FlashAttention aligns it) and sees the keys
// from `left` before the diagonal to `right` after it (`right = 0` is causal; the API
// passes `SK + SQ` for "no limit"). The block's keys `[lo, hi)` split in three runs of
// `BN`-key tiles: those some row sees only in part (masked, before and after) and those
// every row of the block sees whole (no mask): three loops, as the language has no
// helper functions and a key offset chosen inside a loop (by `select`) would keep the
// loads out of the rings a producer fills ahead. The unmasked run starts at a multiple
// of `BN` and ends at one no larger than `SK`, so that the compiler sees each of its tiles
// lie wholly inside the keys (`analysis::whole_steps`: no range arithmetic a step); a
// tile the keys end within goes to the masked run after. A row that sees no key at all keeps
// `m = −∞`, `l = 0`: the masked loops shift by 0 instead of `−∞` (no `∞ − ∞`), and the
// row's output is 0 (`acc = 0` over a floor on `l`) and its log-sum-exp `−∞`.

/// Flash attention forward: `o = softmax(q·kᵀ · scale, masked) · v` and the f32
/// log-sum-exp of each row, online over tiles of `BN` keys.
#[kfuse(crate = "crate::deps")]
pub fn attention<T: Float>(
    q: Tensor<T, (B, SQ, HQ, D)>,
    k: Tensor<T, (B, SK, HK, D)>,
    v: Tensor<T, (B, SK, HK, D)>,
    o: &mut Tensor<T, (B, SQ, HQ, D)>,
    lse: &mut Tensor<f32, (B, HQ, SQ)>,
    scale: f32,
    group: i64,
    left: i64,
    right: i64,
) {
    let (i, h, b) = (program_id(0), program_id(1), program_id(2));
    let g = h / group;
    let qt = q.block([b, i * BM, h, 0], [_, BM, _, D]).load();
    let top = i * BM + (SK - SQ);
    let rows = iota(BM).unsqueeze(1) + top;
    let mut m = zeros::<f32>([BM]) + f32::NEG_INFINITY;
    let mut l = zeros::<f32>([BM]);
    let mut acc = zeros::<f32>([BM, D]);
    let lo = max(0, top - left) / BN * BN;
    let hi = max(lo, min(SK, top + BM + right));
    let whole_lo = min((hi + BN - 1) / BN * BN, max(lo, (max(0, top + BM - 1 - left) + BN - 1) / BN * BN));
    let whole_hi = max(whole_lo, min(SK / BN * BN, min(hi, max(0, top + right + 1) / BN * BN)));
    for j in (lo..whole_lo).step_by(BN) {
        let kt = k.block([b, j, g, 0], [_, BN, _, D]).load();
        let vt = v.block([b, j, g, 0], [_, BN, _, D]).load();
        let cols = iota(BN).unsqueeze(0) + j;
        let s = select(cols >= rows - left && cols <= rows + right, dot(qt, kt.t()) * scale, f32::NEG_INFINITY);
        let m_new = max(m, s.max_axis(1));
        let shift = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let p = exp(s - shift.unsqueeze(1));
        let alpha = exp(m - shift);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    for j in (whole_lo..whole_hi).step_by(BN) {
        let kt = k.block([b, j, g, 0], [_, BN, _, D]).load();
        let vt = v.block([b, j, g, 0], [_, BN, _, D]).load();
        // (the scale, positive, applied to the row maximum and inside `exp`: one
        // multiply-add an element, `kf_exp_scaled`)
        let s = dot(qt, kt.t());
        let m_new = max(m, s.max_axis(1) * scale);
        let p = exp(s * scale - m_new.unsqueeze(1));
        let alpha = exp(m - m_new);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    for j in (whole_hi..hi).step_by(BN) {
        let kt = k.block([b, j, g, 0], [_, BN, _, D]).load();
        let vt = v.block([b, j, g, 0], [_, BN, _, D]).load();
        let cols = iota(BN).unsqueeze(0) + j;
        let s = select(cols >= rows - left && cols <= rows + right, dot(qt, kt.t()) * scale, f32::NEG_INFINITY);
        let m_new = max(m, s.max_axis(1));
        let shift = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let p = exp(s - shift.unsqueeze(1));
        let alpha = exp(m - shift);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    // (a row that saw a key has l ≥ 1; one that saw none has acc = 0 and l = 0: 0 / tiny)
    let out = acc / max(l, f32::MIN_POSITIVE).unsqueeze(1);
    o.block([b, i * BM, h, 0], [_, BM, _, D]).store(out.cast::<T>());
    lse.block([b, h, i * BM], [_, _, BM]).store(m + ln(l));
}

/// `attention` over packed sequences of different lengths (`crate::attention_varlen`):
/// sequence `b` (`program_id(2)`) holds rows `cu_q[b]..cu_q[b + 1]` of `q` and `o` and
/// rows `cu_k[b]..cu_k[b + 1]` of `k` and `v`; program `i` takes its query rows `i·BM`
/// onward. The loops run over the packed key positions (`k0 + j`), so that each tile's
/// offset is the loop index itself (what the rings a producer fills ahead take). The key
/// tiles split as in `attention`, each sequence's last one cut at its length by the mask
/// (its rows past the length are the next sequence's); the output
/// rows past the sequence's end are not written (`store_where`), and the log-sum-exp
/// goes to `[B, HQ, MQ]` (`MQ` the longest sequence).
#[kfuse(crate = "crate::deps")]
pub fn attention_varlen<T: Float>(
    q: Tensor<T, (TQ, HQ, D)>,
    k: Tensor<T, (TK, HK, D)>,
    v: Tensor<T, (TK, HK, D)>,
    cu_q: Tensor<i64, (B1,)>,
    cu_k: Tensor<i64, (B1,)>,
    o: &mut Tensor<T, (TQ, HQ, D)>,
    lse: &mut Tensor<f32, (B, HQ, MQ)>,
    scale: f32,
    group: i64,
    left: i64,
    right: i64,
) {
    let (i, h, b) = (program_id(0), program_id(1), program_id(2));
    let g = h / group;
    let (q0, k0) = (cu_q.block([b], [_]).load(), cu_k.block([b], [_]).load());
    let (sq, sk) = (cu_q.block([b + 1], [_]).load() - q0, cu_k.block([b + 1], [_]).load() - k0);
    let qt = q.block([q0 + i * BM, h, 0], [BM, _, D]).load();
    let top = i * BM + (sk - sq);
    let rows = iota(BM).unsqueeze(1) + top;
    let mut m = zeros::<f32>([BM]) + f32::NEG_INFINITY;
    let mut l = zeros::<f32>([BM]);
    let mut acc = zeros::<f32>([BM, D]);
    let lo = max(0, top - left) / BN * BN;
    // (a program past its sequence's rows walks no keys)
    let hi = max(lo, min(select(i * BM < sq, sk, 0), top + BM + right));
    let whole_lo = min(hi, max(lo, (max(0, top + BM - 1 - left) + BN - 1) / BN * BN));
    let whole_hi = max(whole_lo, min(hi, max(0, min(sk, top + right + 1)) / BN * BN));
    for j in (k0 + lo..k0 + whole_lo).step_by(BN) {
        let kt = k.block([j, g, 0], [BN, _, D]).load();
        let vt = v.block([j, g, 0], [BN, _, D]).load();
        let cols = iota(BN).unsqueeze(0) + (j - k0);
        let s = select(cols >= rows - left && cols <= rows + right && cols < sk, dot(qt, kt.t()) * scale, f32::NEG_INFINITY);
        let m_new = max(m, s.max_axis(1));
        let shift = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let p = exp(s - shift.unsqueeze(1));
        let alpha = exp(m - shift);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    for j in (k0 + whole_lo..k0 + whole_hi).step_by(BN) {
        let kt = k.block([j, g, 0], [BN, _, D]).load();
        let vt = v.block([j, g, 0], [BN, _, D]).load();
        // (the scale, positive, applied to the row maximum and inside `exp`: one
        // multiply-add an element, `kf_exp_scaled`)
        let s = dot(qt, kt.t());
        let m_new = max(m, s.max_axis(1) * scale);
        let p = exp(s * scale - m_new.unsqueeze(1));
        let alpha = exp(m - m_new);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    for j in (k0 + whole_hi..k0 + hi).step_by(BN) {
        let kt = k.block([j, g, 0], [BN, _, D]).load();
        let vt = v.block([j, g, 0], [BN, _, D]).load();
        let cols = iota(BN).unsqueeze(0) + (j - k0);
        let s = select(cols >= rows - left && cols <= rows + right && cols < sk, dot(qt, kt.t()) * scale, f32::NEG_INFINITY);
        let m_new = max(m, s.max_axis(1));
        let shift = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let p = exp(s - shift.unsqueeze(1));
        let alpha = exp(m - shift);
        l = l * alpha + p.sum_axis(1);
        acc = acc * alpha.unsqueeze(1) + dot(p.cast::<T>(), vt);
        m = m_new;
    }
    // the block's rows of this sequence: those on a key before `sk` (`rows < sk`, in the
    // layout of the scores that `rows` met)
    // (a row that saw a key has l ≥ 1; one that saw none has acc = 0 and l = 0: 0 / tiny)
    let out = acc / max(l, f32::MIN_POSITIVE).unsqueeze(1);
    let live = iota(BM) + i * BM < sq;
    o.block([q0 + i * BM, h, 0], [BM, _, D]).store_where(live.unsqueeze(1), out.cast::<T>());
    lse.block([b, h, i * BM], [_, _, BM]).store_where(live, m + ln(l));
}

// Convolution (`kfuse::ops::conv2d`), NHWC. Output pixels are the rows of an implicit
// GEMM: row `m` is pixel `(n, p, q)` of the `P × Q` output; its input pixel at filter tap
// `(r, s)` is `(n, p·sh − ph + r·dh, q·sw − pw + s·dw)`, gathered per row (the block
// offsets `n`, `h`, `w` are `i64` tiles); taps outside the image read zeros (the padding).
// The scalars: `oq` = Q, `pq` = P·Q, the strides `sh`, `sw`, paddings `ph`, `pw` and
// dilations `dh`, `dw` (the depthwise kernel's `fs` is S, the filter's width). The
// epilogue adds the bias and takes the maximum with `floor`: 0 is a fused ReLU, −∞ none.

/// Grouped convolution as an implicit GEMM: `y[m, g, k] = max(floor, bias[g, k] + Σ_{r, s, c}
/// x[n, h, w, g, c] · w[g, k, r, s, c])`, walking the taps' rows and columns and, inside
/// each tap, the group's channels in steps of 64 (a gathered row of 64 16-bit channels is
/// one 128-byte line; the compiler's own choice, 128, held 255 registers and spilled on
/// sm_90a). The three loops are one sequence of steps to the compiler's ring, which
/// fetches across taps: on sm_90a two producer warpgroups gather the rows (and copy the
/// filters by TMA) while two consumer warpgroups run the WGMMA steps.
#[kfuse(crate = "crate::deps")]
pub fn conv2d<T: Float>(
    x: Tensor<T, (N, H, W, G, CG)>,
    w: Tensor<T, (G, KG, R, S, CG)>,
    bias: Tensor<T, (G, KG)>,
    y: &mut Tensor<T, (NPQ, G, KG)>,
    oq: i64,
    pq: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
    floor: f32,
) {
    let (i, j, g) = (program_id(0), program_id(1), program_id(2));
    let m = iota(BM) + i * BM;
    let n = m / pq;
    let h0 = (m % pq) / oq * sh - ph;
    let w0 = m % oq * sw - pw;
    let mut acc = zeros::<f32>([BM, BN]);
    for r in 0..R {
        let h = h0 + r * dh;
        for s in 0..S {
            let wc = w0 + s * dw;
            for c in (0..CG).step_by(64) {
                let a = x.block([n, h, wc, g, c], [_, _, _, _, 64]).load();
                let b = w.block([g, j * BN, r, s, c], [_, BN, _, _, 64]).load();
                acc += dot(a, b.t());
            }
        }
    }
    let v = max(acc + bias.block([g, j * BN], [_, BN]).load().to_f32().unsqueeze(0), floor);
    y.block([i * BM, g, j * BN], [BM, _, BN]).store(v.cast::<T>());
}

/// Depthwise convolution (one filter a channel): `y[m, c] = max(floor, bias[c] + Σ_{r, s}
/// x[n, h, w, c] · w[r, s, c])`, a memory-bound walk of the taps over `BM × BC` tiles
/// (the filters tap-major, so that each tap's weights are read in vectors). The tap
/// loops are short: a launch compiles for its `R` and `S` (`Spec::shape_exact`) and
/// unrolls them.
#[kfuse(crate = "crate::deps")]
pub fn conv2d_depthwise<T: Float>(
    x: Tensor<T, (N, H, W, C)>,
    w: Tensor<T, (R, S, C)>,
    bias: Tensor<T, (C,)>,
    y: &mut Tensor<T, (NPQ, C)>,
    oq: i64,
    pq: i64,
    sh: i64,
    sw: i64,
    ph: i64,
    pw: i64,
    dh: i64,
    dw: i64,
    floor: f32,
) {
    let (i, j) = (program_id(0), program_id(1));
    let m = iota(BM) + i * BM;
    let n = m / pq;
    let h0 = (m % pq) / oq * sh - ph;
    let w0 = m % oq * sw - pw;
    let mut acc = zeros::<f32>([BM, BC]);
    for r in 0..R {
        for s in 0..S {
            let xt = x.block([n, h0 + r * dh, w0 + s * dw, j * BC], [_, _, _, BC]).load().to_f32();
            acc = acc + xt * w.block([r, s, j * BC], [_, _, BC]).load().to_f32().unsqueeze(0);
        }
    }
    let v = max(acc + bias.block([j * BC], [BC]).load().to_f32().unsqueeze(0), floor);
    y.block([i * BM, j * BC], [BM, BC]).store(v.cast::<T>());
}

// Winograd F(2 × 2, 3 × 3) for 3 × 3, stride-1, undilated convolutions without groups
// (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): each 2 × 2
// block of output pixels (a tile: `TT = N · ⌈P/2⌉ · ⌈Q/2⌉` of them, `tq = ⌈Q/2⌉` a row
// of the image, `tpq` an image) comes from its 4 × 4 input patch `d` and each filter `g`
// as `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`, summed over the channels, so that the 16 positions of
// a transformed patch are 16 independent products `M[x] = V[x] · U[x]` of `[TT, C]` by
// `[C, K]` (`gemm_batched_scaled`): 2.25 times fewer multiplications than the direct
// sum. The transforms are the three kernels below; `X` (16) indexes the positions
// `x = 4ξ + ν`.

/// The filters' transform `U[4ξ + ν] = (G g Gᵀ)[ξ][ν]` of `w: [K, 3, 3, C]` into `u: [16,
/// C, K]` (f32), `G = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]]`, on 16 × 16 tiles (a
/// small transform spread over several blocks).
#[kfuse(crate = "crate::deps")]
pub fn conv2d_winograd_filter<T: Float>(w: Tensor<T, (K, R, S, C)>, u: &mut Tensor<f32, (X, C, K)>) {
    let (i, j) = (program_id(0), program_id(1));
    let g00 = w.block([i * 16, 0, 0, j * 16], [16, _, _, 16]).load().to_f32();
    let g01 = w.block([i * 16, 0, 1, j * 16], [16, _, _, 16]).load().to_f32();
    let g02 = w.block([i * 16, 0, 2, j * 16], [16, _, _, 16]).load().to_f32();
    let g10 = w.block([i * 16, 1, 0, j * 16], [16, _, _, 16]).load().to_f32();
    let g11 = w.block([i * 16, 1, 1, j * 16], [16, _, _, 16]).load().to_f32();
    let g12 = w.block([i * 16, 1, 2, j * 16], [16, _, _, 16]).load().to_f32();
    let g20 = w.block([i * 16, 2, 0, j * 16], [16, _, _, 16]).load().to_f32();
    let g21 = w.block([i * 16, 2, 1, j * 16], [16, _, _, 16]).load().to_f32();
    let g22 = w.block([i * 16, 2, 2, j * 16], [16, _, _, 16]).load().to_f32();
    // G g along each filter row's taps, then along the rows
    let (q00, q01, q02, q03) = (g00, (g00 + g01 + g02) * 0.5, (g00 - g01 + g02) * 0.5, g02);
    let (q10, q11, q12, q13) = (g10, (g10 + g11 + g12) * 0.5, (g10 - g11 + g12) * 0.5, g12);
    let (q20, q21, q22, q23) = (g20, (g20 + g21 + g22) * 0.5, (g20 - g21 + g22) * 0.5, g22);
    u.block([0, j * 16, i * 16], [_, 16, 16]).store((q00).t());
    u.block([4, j * 16, i * 16], [_, 16, 16]).store(((q00 + q10 + q20) * 0.5).t());
    u.block([8, j * 16, i * 16], [_, 16, 16]).store(((q00 - q10 + q20) * 0.5).t());
    u.block([12, j * 16, i * 16], [_, 16, 16]).store((q20).t());
    u.block([1, j * 16, i * 16], [_, 16, 16]).store((q01).t());
    u.block([5, j * 16, i * 16], [_, 16, 16]).store(((q01 + q11 + q21) * 0.5).t());
    u.block([9, j * 16, i * 16], [_, 16, 16]).store(((q01 - q11 + q21) * 0.5).t());
    u.block([13, j * 16, i * 16], [_, 16, 16]).store((q21).t());
    u.block([2, j * 16, i * 16], [_, 16, 16]).store((q02).t());
    u.block([6, j * 16, i * 16], [_, 16, 16]).store(((q02 + q12 + q22) * 0.5).t());
    u.block([10, j * 16, i * 16], [_, 16, 16]).store(((q02 - q12 + q22) * 0.5).t());
    u.block([14, j * 16, i * 16], [_, 16, 16]).store((q22).t());
    u.block([3, j * 16, i * 16], [_, 16, 16]).store((q03).t());
    u.block([7, j * 16, i * 16], [_, 16, 16]).store(((q03 + q13 + q23) * 0.5).t());
    u.block([11, j * 16, i * 16], [_, 16, 16]).store(((q03 - q13 + q23) * 0.5).t());
    u.block([15, j * 16, i * 16], [_, 16, 16]).store((q23).t());
}

/// The input's transform `V[4ξ + ν][t] = (Bᵀ d B)[ξ][ν]` of each tile's 4 × 4 patch `d`
/// (rows `2·tp − ph …`, columns `2·tq − pw …` of image `n`; outside the image, zeros) into
/// `v: [16, TT, C]` (f32), `Bᵀ = [[1, 0, −1, 0], [0, 1, 1, 0], [0, −1, 1, 0], [0, 1, 0, −1]]`.
#[kfuse(crate = "crate::deps")]
pub fn conv2d_winograd_input<T: Float>(x: Tensor<T, (N, H, W, C)>, v: &mut Tensor<f32, (X, TT, C)>, tq: i64, tpq: i64, ph: i64, pw: i64) {
    let (i, j) = (program_id(0), program_id(1));
    let t = iota(BT) + i * BT;
    let n = t / tpq;
    let h0 = (t % tpq) / tq * 2 - ph;
    let w0 = t % tq * 2 - pw;
    let d00 = x.block([n, h0 + 0, w0 + 0, j * BC], [_, _, _, BC]).load().to_f32();
    let d01 = x.block([n, h0 + 0, w0 + 1, j * BC], [_, _, _, BC]).load().to_f32();
    let d02 = x.block([n, h0 + 0, w0 + 2, j * BC], [_, _, _, BC]).load().to_f32();
    let d03 = x.block([n, h0 + 0, w0 + 3, j * BC], [_, _, _, BC]).load().to_f32();
    let (r00, r01, r02, r03) = (d00 - d02, d01 + d02, d02 - d01, d01 - d03);
    let d10 = x.block([n, h0 + 1, w0 + 0, j * BC], [_, _, _, BC]).load().to_f32();
    let d11 = x.block([n, h0 + 1, w0 + 1, j * BC], [_, _, _, BC]).load().to_f32();
    let d12 = x.block([n, h0 + 1, w0 + 2, j * BC], [_, _, _, BC]).load().to_f32();
    let d13 = x.block([n, h0 + 1, w0 + 3, j * BC], [_, _, _, BC]).load().to_f32();
    let (r10, r11, r12, r13) = (d10 - d12, d11 + d12, d12 - d11, d11 - d13);
    let d20 = x.block([n, h0 + 2, w0 + 0, j * BC], [_, _, _, BC]).load().to_f32();
    let d21 = x.block([n, h0 + 2, w0 + 1, j * BC], [_, _, _, BC]).load().to_f32();
    let d22 = x.block([n, h0 + 2, w0 + 2, j * BC], [_, _, _, BC]).load().to_f32();
    let d23 = x.block([n, h0 + 2, w0 + 3, j * BC], [_, _, _, BC]).load().to_f32();
    let (r20, r21, r22, r23) = (d20 - d22, d21 + d22, d22 - d21, d21 - d23);
    let d30 = x.block([n, h0 + 3, w0 + 0, j * BC], [_, _, _, BC]).load().to_f32();
    let d31 = x.block([n, h0 + 3, w0 + 1, j * BC], [_, _, _, BC]).load().to_f32();
    let d32 = x.block([n, h0 + 3, w0 + 2, j * BC], [_, _, _, BC]).load().to_f32();
    let d33 = x.block([n, h0 + 3, w0 + 3, j * BC], [_, _, _, BC]).load().to_f32();
    let (r30, r31, r32, r33) = (d30 - d32, d31 + d32, d32 - d31, d31 - d33);
    v.block([0, i * BT, j * BC], [_, BT, BC]).store(r00 - r20);
    v.block([4, i * BT, j * BC], [_, BT, BC]).store(r10 + r20);
    v.block([8, i * BT, j * BC], [_, BT, BC]).store(r20 - r10);
    v.block([12, i * BT, j * BC], [_, BT, BC]).store(r10 - r30);
    v.block([1, i * BT, j * BC], [_, BT, BC]).store(r01 - r21);
    v.block([5, i * BT, j * BC], [_, BT, BC]).store(r11 + r21);
    v.block([9, i * BT, j * BC], [_, BT, BC]).store(r21 - r11);
    v.block([13, i * BT, j * BC], [_, BT, BC]).store(r11 - r31);
    v.block([2, i * BT, j * BC], [_, BT, BC]).store(r02 - r22);
    v.block([6, i * BT, j * BC], [_, BT, BC]).store(r12 + r22);
    v.block([10, i * BT, j * BC], [_, BT, BC]).store(r22 - r12);
    v.block([14, i * BT, j * BC], [_, BT, BC]).store(r12 - r32);
    v.block([3, i * BT, j * BC], [_, BT, BC]).store(r03 - r23);
    v.block([7, i * BT, j * BC], [_, BT, BC]).store(r13 + r23);
    v.block([11, i * BT, j * BC], [_, BT, BC]).store(r23 - r13);
    v.block([15, i * BT, j * BC], [_, BT, BC]).store(r13 - r33);
}

/// The output's transform: each tile's 2 × 2 pixels `Aᵀ M A` of its 16 products `m: [16,
/// TT, K]` (`Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]]`), plus the bias, at least `floor`, into `y:
/// [N, P, Q, K]` (pixels past the image's last row or column are not stored). A column
/// `ν` of `M` at a time: `Aᵀ M` of its four tiles, then its share of each pixel.
#[kfuse(crate = "crate::deps")]
pub fn conv2d_winograd_output<T: Float>(m: Tensor<f32, (X, TT, K)>, bias: Tensor<T, (K,)>, y: &mut Tensor<T, (N, P, Q, K)>, tq: i64, tpq: i64, floor: f32) {
    let (i, j) = (program_id(0), program_id(1));
    let (m00, m10) = (m.block([0, i * BT, j * BK], [_, BT, BK]).load(), m.block([4, i * BT, j * BK], [_, BT, BK]).load());
    let (m20, m30) = (m.block([8, i * BT, j * BK], [_, BT, BK]).load(), m.block([12, i * BT, j * BK], [_, BT, BK]).load());
    let (s00, s10) = (m00 + m10 + m20, m10 - m20 - m30);
    let (y00, y10) = (s00, s10);
    let (m01, m11) = (m.block([1, i * BT, j * BK], [_, BT, BK]).load(), m.block([5, i * BT, j * BK], [_, BT, BK]).load());
    let (m21, m31) = (m.block([9, i * BT, j * BK], [_, BT, BK]).load(), m.block([13, i * BT, j * BK], [_, BT, BK]).load());
    let (s01, s11) = (m01 + m11 + m21, m11 - m21 - m31);
    let (y00, y01, y10, y11) = (y00 + s01, s01, y10 + s11, s11);
    let (m02, m12) = (m.block([2, i * BT, j * BK], [_, BT, BK]).load(), m.block([6, i * BT, j * BK], [_, BT, BK]).load());
    let (m22, m32) = (m.block([10, i * BT, j * BK], [_, BT, BK]).load(), m.block([14, i * BT, j * BK], [_, BT, BK]).load());
    let (s02, s12) = (m02 + m12 + m22, m12 - m22 - m32);
    let (y00, y01, y10, y11) = (y00 + s02, y01 - s02, y10 + s12, y11 - s12);
    let (m03, m13) = (m.block([3, i * BT, j * BK], [_, BT, BK]).load(), m.block([7, i * BT, j * BK], [_, BT, BK]).load());
    let (m23, m33) = (m.block([11, i * BT, j * BK], [_, BT, BK]).load(), m.block([15, i * BT, j * BK], [_, BT, BK]).load());
    let (s03, s13) = (m03 + m13 + m23, m13 - m23 - m33);
    let (y01, y11) = (y01 - s03, y11 - s13);
    // (the pixels' coordinates after the loads: no registers held across them)
    let t = iota(BT) + i * BT;
    let n = t / tpq;
    let p = (t % tpq) / tq * 2;
    let q = t % tq * 2;
    let b = bias.block([j * BK], [BK]).load().to_f32().unsqueeze(0);
    y.block([n, p, q, j * BK], [_, _, _, BK]).store(max(y00 + b, floor).cast::<T>());
    y.block([n, p, q + 1, j * BK], [_, _, _, BK]).store(max(y01 + b, floor).cast::<T>());
    y.block([n, p + 1, q, j * BK], [_, _, _, BK]).store(max(y10 + b, floor).cast::<T>());
    y.block([n, p + 1, q + 1, j * BK], [_, _, _, BK]).store(max(y11 + b, floor).cast::<T>());
}

/// A 1 × 1, stride-1 convolution without groups: the GEMM `y = max(floor, x · wᵀ + bias)` on
/// `x: [M, C]` (pixels × channels) and `w: [K, C]` (read transposed, as it lies).
#[kfuse(crate = "crate::deps")]
pub fn conv2d_pointwise<T: Float>(x: Tensor<T, (M, C)>, w: Tensor<T, (C, K)>, bias: Tensor<T, (K,)>, y: &mut Tensor<T, (M, K)>, floor: f32) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for c in (0..C).step_by(BK) {
        acc += dot(x.block([i * BM, c], [BM, BK]).load(), w.block([c, j * BN], [BK, BN]).load());
    }
    let v = max(acc + bias.block([j * BN], [BN]).load().to_f32().unsqueeze(0), floor);
    y.block([i * BM, j * BN], [BM, BN]).store(v.cast::<T>());
}

//! The kernels of `kfuse::ops`, each a `#[kfuse]` function. Each one here generates a
//! launcher of the same name (explicit output tensor) and a module with its
//! `KernelDef` and IR builder; the friendly API in the crate root allocates outputs and
//! checks arguments.
//!
//! Elementwise kernels work on contiguous tensors viewed as one dimension `N`; the
//! scheduler picks the tile `BN`.

use kfuse_macros::kfuse;

#[kfuse(crate = "crate::deps")]
pub fn add<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(a.block([i * BN], [BN]).load() + b.block([i * BN], [BN]).load());
}

#[kfuse(crate = "crate::deps")]
pub fn sub<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(a.block([i * BN], [BN]).load() - b.block([i * BN], [BN]).load());
}

#[kfuse(crate = "crate::deps")]
pub fn mul<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(a.block([i * BN], [BN]).load() * b.block([i * BN], [BN]).load());
}

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

/// `out = x^T` for a 2-D tensor.
#[kfuse(crate = "crate::deps")]
pub fn transpose<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (N, M)>) {
    let (i, j) = (program_id(0), program_id(1));
    let t = x.block([i * BM, j * BN], [BM, BN]).load();
    out.block([j * BN, i * BM], [BN, BM]).store(t.t());
}

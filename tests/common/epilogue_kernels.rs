//! The user kernels of the fused-epilogue checks, one definition for the tests and the
//! benchmarks (`benches/common/mod.rs` includes this file by path): a GEMM with bias +
//! GELU after its loop, and the same bias + GELU as the separate kernel that follows a
//! vendor GEMM.

use kfuse::prelude::*;

/// GEMM with bias and GELU (erf form) fused into its epilogue: one kernel.
#[kfuse]
pub fn gemm_bias_gelu<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, bias: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    let x = acc + bias.block([j * BN], [BN]).load().to_f32();
    out.block([i * BM, j * BN], [BM, BN]).store((0.5 * x * (1.0 + erf(x * 0.7071067811865476))).cast::<T>());
}

/// The same bias + GELU as a separate elementwise kernel (what follows a vendor GEMM).
#[kfuse]
pub fn bias_gelu<T: Float>(x: Tensor<T, (M, N)>, bias: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let v = x.block([i * BM, j * BN], [BM, BN]).load().to_f32() + bias.block([j * BN], [BN]).load().to_f32();
    out.block([i * BM, j * BN], [BM, BN]).store((0.5 * v * (1.0 + erf(v * 0.7071067811865476))).cast::<T>());
}

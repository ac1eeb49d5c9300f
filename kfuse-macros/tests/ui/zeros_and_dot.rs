use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn no_dtype(out: &mut Tensor<f32, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    out.block([i * BM, j * BN], [BM, BN]).store(zeros([BM, BN]));
}

// The inner extents of `dot` must be the same symbol.
#[kfuse(crate = "crate::fake")]
pub fn inner<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, c: &mut Tensor<f32, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let x = a.block([i * BM, 0], [BM, BK]).load();
    let y = b.block([0, j * BN], [BN, BN]).load();
    c.block([i * BM, j * BN], [BM, BN]).store(dot(x, y));
}

// `dot` gives f32: storing it into a T tensor needs a cast.
#[kfuse(crate = "crate::fake")]
pub fn cast<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, c: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let x = a.block([i * BM, 0], [BM, BK]).load();
    let y = b.block([0, j * BN], [BK, BN]).load();
    c.block([i * BM, j * BN], [BM, BN]).store(dot(x, y));
}
fn main() {}

use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let a = x.block([i * BM], [BM, BN]).load();
    out.block([i * BM, j * BN], [BM, BN]).store(a);
}
fn main() {}

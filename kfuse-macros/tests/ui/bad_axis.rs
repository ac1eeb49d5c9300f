use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M,)>) {
    let i = program_id(0);
    let v = x.block([i * BM, 0], [BM, N]).load();
    out.block([i * BM], [BM]).store(v.sum_axis(2));
}
fn main() {}

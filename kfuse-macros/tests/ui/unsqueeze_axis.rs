use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load();
    out.block([i * BN], [BN]).store(v.unsqueeze(2).sum_axis(0));
}
fn main() {}

use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, n: i64) {
    let i = program_id(0);
    out.block([i * n], [n]).store(x.block([i * 64], [64]).load());
}
fn main() {}

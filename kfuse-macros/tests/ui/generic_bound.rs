use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Copy>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load());
}
fn main() {}

use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>, n: i64) {
    let i = program_id(0);
    let j = iota(n).to_f32().sin();
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load() * j);
}
fn main() {}

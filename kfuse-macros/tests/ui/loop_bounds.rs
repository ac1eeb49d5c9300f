use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

// Loop bounds are i64 index expressions.
#[kfuse(crate = "crate::fake")]
pub fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>, s: f32) {
    let i = program_id(0);
    for k in (0..N).step_by(s) {
    }
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load());
}
fn main() {}

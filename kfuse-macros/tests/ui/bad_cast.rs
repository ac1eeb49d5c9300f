use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<f32, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load().cast::<f64>());
}
fn main() {}

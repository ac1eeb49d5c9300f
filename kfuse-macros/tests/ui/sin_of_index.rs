use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k(pos: Tensor<i64, (N,)>, out: &mut Tensor<f32, (N,)>) {
    let i = program_id(0);
    let p = pos.block([i * BN], [BN]).load();
    out.block([i * BN], [BN]).store(cos(p));
}
fn main() {}

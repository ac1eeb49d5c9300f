use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

// A `let` in a loop body ends with the body.
#[kfuse(crate = "crate::fake")]
pub fn k(x: Tensor<f32, (M, N)>, out: &mut Tensor<f32, (M, N)>) {
    let i = program_id(0);
    for j in (0..N).step_by(BN) {
        let t = x.block([i * BM, j], [BM, BN]).load();
    }
    out.block([i * BM, 0], [BM, BN]).store(t);
}
fn main() {}

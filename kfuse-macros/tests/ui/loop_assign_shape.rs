use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

// A scalar accumulator cannot become a tile inside the loop.
#[kfuse(crate = "crate::fake")]
pub fn k(x: Tensor<f32, (M, N)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let mut total = 0.0;
    for j in (0..N).step_by(BN) {
        total = x.block([i * BM, j], [BM, BN]).load().sum();
    }
    out.block([i * BM], [BM]).store(total);
}
fn main() {}

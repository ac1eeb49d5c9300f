use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

// The accumulator is f32; a T tile assigned to it is an error where it is assigned.
#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<f32, (M, N)>) {
    let i = program_id(0);
    let mut acc = zeros::<f32>([BM, BN]);
    for j in (0..N).step_by(BN) {
        acc = x.block([i * BM, j], [BM, BN]).load();
    }
    out.block([i * BM, 0], [BM, BN]).store(acc);
}
fn main() {}

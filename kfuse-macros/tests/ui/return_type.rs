use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (N,)>) -> Tensor<T, (N,)> {
    let i = program_id(0);
}
fn main() {}

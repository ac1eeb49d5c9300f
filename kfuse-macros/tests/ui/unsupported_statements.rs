use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    while i < 4 {
        out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load());
    }
    println!("{}", i);
    let f = |v| v * 2.0;
    let c = i as f32;
}
fn main() {}

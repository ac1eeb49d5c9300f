use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

// `x` is `T` and `out` is `U`: fine when T = U, an error for T = f32, U = f16.
#[kfuse(crate = "crate::fake")]
pub fn k<T: Float, U: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<U, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load());
}

fn main() {}

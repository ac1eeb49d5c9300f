use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

// A float literal in index arithmetic does not adapt to `i64` (an integer literal
// would): the builder's dtype mismatch lands on the expression.
#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * 2.5], [BN]).load());
}

fn main() {}

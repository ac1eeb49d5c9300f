use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (N,)>, n: usize, v: &Tensor<T, (N,)>, s: Tensor<T, (N)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load());
}

fn call_site(x: &fake::runtime::Tensor, out: &mut fake::runtime::Tensor) {
    // The wrapper is still emitted with its arity, so uses of the kernel resolve.
    let _ = k(x, 3usize, x, x, out);
}
fn main() {}

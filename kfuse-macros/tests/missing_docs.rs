//! A crate under `#![deny(missing_docs)]` takes a `#[kfuse]` kernel without docs: the
//! macro documents what it generates (the launcher, the module, `DEF` and `build`), and
//! a kernel's own docs stay on its launcher.
#![deny(missing_docs)]

#[allow(missing_docs)]
mod support {
    include!("support/fake_kfuse.rs");
}

use kfuse_macros::kfuse;
use support::fake::runtime::Tensor;

#[kfuse(crate = "crate::support::fake")]
pub fn scale<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, s: f32) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store((x.block([i * BN], [BN]).load().to_f32() * s).cast::<T>());
}

/// `out = -x`.
#[kfuse(crate = "crate::support::fake")]
pub fn negate<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store(-x.block([i * BN], [BN]).load());
}

#[test]
fn undocumented_and_documented_kernels_compile_and_launch() {
    let x = Tensor { dtype: kfuse_ir::DType::BF16 };
    let mut out = Tensor { dtype: kfuse_ir::DType::BF16 };
    assert!(scale(&x, &mut out, 2.0).is_ok());
    assert!(negate(&x, &mut out).is_ok());
    assert_eq!((scale::DEF.name, negate::DEF.name), ("scale", "negate"));
}

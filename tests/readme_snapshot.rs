use kfuse::codegen::Target;
use kfuse::prelude::*;
use kfuse::runtime::{emit, ArgDesc};

#[kfuse]
pub fn axpy<T: Float>(x: Tensor<T, (N,)>, y: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, a: f32) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32() * a + y.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store(v.cast::<T>());
}

#[test]
fn axpy_bf16_emits_what_it_did() -> kfuse::Result<()> {
    let v = ArgDesc::tensor(DType::BF16, &[1 << 20]); // contiguous, 256-byte aligned
    let args = [v.clone(), v.clone(), v, ArgDesc::Scalar(DType::F32)];
    for target in [Target::sm80(), Target::sm90a()] {
        let k = emit(&axpy::DEF, &args, &target)?; // no GPU, no NVRTC
        insta::assert_snapshot!(format!("axpy_bf16_{}", target.arch()), k.source);
        insta::assert_snapshot!(format!("axpy_bf16_{}_ir", target.arch()), k.ir);
    }
    Ok(())
}

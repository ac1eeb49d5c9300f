//! 8-bit float operands on sm_90a (the general lowering's WGMMA): `wgmma … k32 … e4m3/e5m2`, K tiles
//! of 128 elements (one 128-byte swizzle span), K-major operands only, and the fp8
//! conversions in the prelude; older targets refuse fp8 with the reason.

mod common;

use common::{gemm_kernel_out, spec};
use kfuse_codegen::{compile, Target, TensorSpec};
use kfuse_ir::DType;

#[test]
fn fp8_operands_take_k32_wgmma() {
    for (dt, ty) in [(DType::F8E4M3, "e4m3"), (DType::F8E5M2, "e5m2")] {
        // B stored [N, K] (K contiguous): the layout WGMMA reads 8-bit operands in
        let k = gemm_kernel_out(dt, DType::BF16, false, true, true);
        let e = compile(&k, &spec(&k, [8192, 8192, 8192]), &Target::sm90a()).unwrap();
        assert!(e.source.contains(&format!("wgmma.mma_async.sync.aligned.m64n256k32.f32.{ty}.{ty}")), "{}", e.source);
        // no transpose immediates for 8-bit operands
        assert!(e.source.contains("1, 1, 1;"), "{}", e.source);
        assert_eq!(e.tiles["BK"], 128, "{:?}", e.tiles);
        assert!(e.source.contains("cp.async.bulk.tensor"));
        // the epilogue stores bf16 through the TMA store
        assert!(e.source.contains("cp.async.bulk.tensor.2d.global.shared::cta"), "{}", e.source);
        // four k32 steps per 128-element stage (the general lowering's step loop)
        assert!(e.source.contains("for (int s = 0; s < 4; ++s)"), "{}", e.source);
    }
}

#[test]
fn fp8_outputs_convert_with_satfinite() {
    let k = gemm_kernel_out(DType::F8E4M3, DType::F8E4M3, false, true, false);
    let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap();
    assert!(e.source.contains("cvt.rn.satfinite.e4m3x2.f32"), "{}", e.source);
    assert!(e.source.contains("kf_f32_e4m3("), "{}", e.source);
}

#[test]
fn mn_major_fp8_operands_are_refused_with_the_fix() {
    let k = gemm_kernel_out(DType::F8E4M3, DType::BF16, false, false, false);
    let err = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap_err().to_string();
    assert!(err.contains("f8e4m3") && err.contains("K contiguous") && err.contains("`b`"), "{err}");
    // a transposed view of A ([K, M] storage) likewise
    let k = gemm_kernel_out(DType::F8E4M3, DType::BF16, false, true, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[0] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
    let err = compile(&k, &s, &Target::sm90a()).unwrap_err().to_string();
    assert!(err.contains("first operand"), "{err}");
}

#[test]
fn fp8_needs_sm89() {
    let k = gemm_kernel_out(DType::F8E4M3, DType::BF16, false, true, false);
    let err = compile(&k, &spec(&k, [256, 256, 256]), &Target::sm80()).unwrap_err().to_string();
    assert!(err.contains("sm_80") && err.contains("sm_89"), "{err}");
}

#[test]
fn non_fp8_kernels_carry_no_fp8_helpers() {
    let k = gemm_kernel_out(DType::BF16, DType::BF16, false, false, false);
    let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap();
    assert!(!e.source.contains("e4m3"));
}


#[test]
fn fp8_dot_on_sm89_is_refused_clearly() {
    // sm_89 converts fp8 but has no fp8 matrix path in kfuse (mma.sync takes 16-bit)
    let k = gemm_kernel_out(DType::F8E4M3, DType::BF16, false, true, false);
    let err = compile(&k, &spec(&k, [256, 256, 256]), &Target::sm89()).unwrap_err().to_string();
    assert!(err.contains("f8e4m3") && err.contains("mma.sync") && err.contains("f16 and bf16"), "{err}");
}

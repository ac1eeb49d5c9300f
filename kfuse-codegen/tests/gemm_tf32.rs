//! f32 operands of a `dot_tf32` on the sm_90a matrix path: `wgmma … k8 … tf32`, K
//! tiles of 32 elements (one 128-byte swizzle span, so the stages, TMA boxes and
//! descriptors are the bf16 ones), K-major operands only; sm_80/sm_89 and operands TMA
//! cannot read take the exact FMA path; a plain f32 `dot` never reads TF32.

mod common;

use common::{gemm_kernel, gemm_kernel_tf32, spec};
use kfuse_codegen::{compile, Target, TensorSpec};
use kfuse_ir::{Builder, DType, Extent};

#[test]
fn tf32_operands_take_k8_wgmma() {
    for out in [DType::F32, DType::BF16] {
        // B stored [N, K] (K contiguous): the layout WGMMA reads TF32 operands in
        let k = gemm_kernel_tf32(out, false, true);
        let e = compile(&k, &spec(&k, [8192, 8192, 8192]), &Target::sm90a()).unwrap();
        assert!(e.source.contains("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32"), "{}", e.source);
        // no transpose immediates for TF32 operands
        assert!(e.source.contains("%128, %129, 1, 1, 1;"), "{}", e.source);
        assert_eq!(e.tiles["BK"], 32, "{:?}", e.tiles);
        assert!(e.source.contains("cp.async.bulk.tensor.2d.shared::cluster.global"), "operands arrive by TMA");
        // four k8 steps (32 bytes each) per 32-element stage (the general lowering's
        // step loop)
        assert!(e.source.contains("for (int s = 0; s < 4; ++s)"), "{}", e.source);
        // the plan and the IR say TF32
        assert!(e.plan.to_string().contains("wgmma m64n256k8 over 2 warpgroup(s) (f32 operands read as TF32)") && e.ir.contains("= dot_tf32 %"), "{}", e.plan);
        // only a 16-bit output leaves by a TMA store
        assert_eq!(e.source.contains("cp.async.bulk.tensor.2d.global.shared::cta"), out == DType::BF16);
    }
}

#[test]
fn plain_f32_dot_stays_exact() {
    let k = gemm_kernel(DType::F32, false, true, false);
    for t in [Target::sm80(), Target::sm89(), Target::sm90a()] {
        let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &t).unwrap();
        assert!(e.plan.to_string().contains(": f32 FMAs") && !e.ir.contains("tf32"), "{}", e.ir);
        assert!(!e.source.contains("tf32") && !e.source.contains("wgmma"), "{}", e.source);
    }
}

#[test]
fn tf32_on_sm80_and_sm89_is_computed_exactly() {
    // no TF32 mma.sync path: the FMA rule, which the plan says
    let k = gemm_kernel_tf32(DType::F32, false, true);
    for t in [Target::sm80(), Target::sm89()] {
        let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &t).unwrap();
        assert!(e.plan.to_string().contains(": f32 FMAs") && e.ir.contains("exact f32 products are within what TF32 allows"), "{}", e.ir);
        assert!(e.source.contains("fmaf(") && !e.source.contains("tf32"), "{}", e.source);
        assert_eq!(e.tiles["BK"], 8, "the FMA rule's own tiles: {:?}", e.tiles);
    }
}

#[test]
fn tf32_operands_tma_cannot_read_fall_back_to_exact_fmas() {
    // `a` with rows 4 bytes off a 16-byte multiple
    let k = gemm_kernel_tf32(DType::F32, false, true);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[0] = Some(TensorSpec { ptr_align: 16, stride_div: vec![1, 0] });
    let e = compile(&k, &s, &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains(": f32 FMAs") && !e.source.contains("wgmma"), "{}", e.ir);
}

#[test]
fn mn_major_tf32_operands_are_refused_with_the_fix() {
    // B row-major [K, N]: N contiguous
    let k = gemm_kernel_tf32(DType::F32, false, false);
    let err = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap_err().to_string();
    assert!(err.contains("second operand") && err.contains("dot_tf32") && err.contains("K contiguous") && err.contains("`b`"), "{err}");
    assert!(err.contains("tf32: true"), "{err}");
    // A stored transposed ([K, M], M contiguous)
    let k = gemm_kernel_tf32(DType::F32, true, true);
    let err = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap_err().to_string();
    assert!(err.contains("first operand") && err.contains("`a`"), "{err}");
}

#[test]
fn dot_tf32_takes_f32_tiles_only() {
    let mut b = Builder::new("k");
    let (m, kk) = (b.shape_sym("M"), b.shape_sym("K"));
    let p = b.tensor_param("x", DType::BF16, &[m, kk], false);
    let (bm, bk) = (b.tile_sym("BM"), b.tile_sym("BK"));
    let z = b.literal(kfuse_ir::Literal::Int(0));
    let t = |e| kfuse_ir::AccessDim::Tile(Extent::Tile(e));
    let x = b.load(p, &[z, z], &[t(bm), t(bk)]).unwrap();
    let y = b.permute(x, &[1, 0]).unwrap();
    let err = b.dot_tf32(x, y).unwrap_err().to_string();
    assert!(err.contains("dot_tf32") && err.contains("f32 tiles") && err.contains("bf16"), "{err}");
    // the plain dot of the same tiles is fine
    b.dot(x, y).unwrap();
}

//! What the compiler emits for several `dot`s in one loop (the SwiGLU pair
//! `silu(x · wg) ⊙ (x · wu)`, `kfuse::ops::kernels::swiglu_gemm`, and a user kernel of
//! three products with their own A tiles), on a machine without a GPU: on sm_90a one
//! kernel whose producer warpgroup fills TMA rings and whose consumers keep one
//! accumulator per dot (the general lowering); NVRTC + `ptxas -v` without spills for
//! each shape class; a snapshot of the scheduled IR; and what sm_80/sm_89, f32 operands
//! and too many dots get instead.

mod common;

use common::gemm::{spec_mnk, three_products};

use kfuse::codegen::{compile, Target, TensorSpec};
use kfuse::prelude::*;
use kfuse::DType;

/// Five products in one loop: more than the matrix path takes.
#[kfuse]
pub fn five_products<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let (mut p, mut q, mut r, mut s, mut t) = (zeros::<f32>([BM, BN]), zeros::<f32>([BM, BN]), zeros::<f32>([BM, BN]), zeros::<f32>([BM, BN]), zeros::<f32>([BM, BN]));
    for k in (0..K).step_by(BK) {
        let x = a.block([i * BM, k], [BM, BK]).load();
        let y = b.block([k, j * BN], [BK, BN]).load();
        p += dot(x, y);
        q += dot(x, y);
        r += dot(x, y);
        s += dot(x, y);
        t += dot(x, y);
    }
    out.block([i * BM, j * BN], [BM, BN]).store((p + q + r + s + t).cast::<T>());
}

#[test]
fn several_dot_kernels_assemble_without_spills() {
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut check = |name: &str, e: kfuse::codegen::EmittedKernel| {
        match common::assemble(&e.source, &e.arch, &e.options, name) {
            Ok((regs, spill)) => {
                report.push(format!("{name} tiles {:?}: {regs} registers, {spill} bytes of spills", e.tiles));
                if spill > 0 {
                    failures.push(format!("{name} (tiles {:?}): {spill} bytes of spills ({regs} registers)", e.tiles));
                }
            }
            Err(err) => failures.push(format!("{name}: {err}")),
        }
    };
    // shape classes: 128x128 per accumulator, 64x64 (M = 127), and odd sizes
    let def = &kfuse::ops::kernels::swiglu_gemm::DEF;
    for (m, n, kk) in [(4096, 4096, 4096), (127, 4096, 4096), (1024, 2048, 1024), (17, 33, 65)] {
        for dt in [DType::BF16, DType::F16] {
            let e = compile(&(def.build)(&[dt]).unwrap(), &spec_mnk(def, m, n, kk), &Target::sm90a()).unwrap();
            assert_eq!(e.plan.dots.iter().filter(|d| d.contains(": wgmma m64n")).count(), 2, "{}", e.plan);
            check(&format!("swiglu_gemm_{dt}_{m}_{n}_{kk}"), e);
        }
    }
    // fp8 weights K-major (transposed views of [N, K] tensors)
    let k = (def.build)(&[DType::F8E4M3]).unwrap();
    let mut spec = spec_mnk(def, 4096, 4096, 4096);
    spec.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
    spec.tensors[2] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(e.source.contains("k32.f32.e4m3.e4m3"), "{}", e.ir);
    assert_eq!(e.plan.dots.iter().filter(|d| d.contains(": wgmma m64n")).count(), 2, "{}", e.plan);
    check("swiglu_gemm_fp8", e);
    // three products: two A tiles (one shared by two dots) and three B tiles a stage
    let def = &three_products::DEF;
    let e = compile(&(def.build)(&[DType::BF16]).unwrap(), &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap();
    assert_eq!(e.tiles["BN"], 64, "three 64-wide accumulators: {:?}", e.tiles);
    assert_eq!(e.plan.dots.iter().filter(|d| d.contains(": wgmma m64n64k16")).count(), 3, "{}", e.plan);
    check("three_products", e);
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn several_dots_elsewhere_are_refused_clearly_or_lowered_one_by_one() {
    let def = &kfuse::ops::kernels::swiglu_gemm::DEF;
    // sm_80 / sm_89: the mma.sync path takes one product a loop, so both dots are lowered
    // one by one (and assemble without spills), the plan saying why; so are f32 operands
    // on sm_90a (exact FMAs, one dot at a time)
    let cases = [(DType::BF16, Target::sm80(), "mma.sync path takes one"), (DType::BF16, Target::sm89(), "mma.sync path takes one"), (DType::F32, Target::sm90a(), "exact FMAs")];
    for (dt, t, why) in cases {
        let k = (def.build)(&[dt]).unwrap();
        let spec = spec_mnk(def, 4096, 4096, 4096);
        let e = compile(&k, &spec, &t).unwrap();
        assert!(e.ir.contains("  dots: ") && e.ir.contains("2 `dot`s in one loop") && e.ir.contains(why), "{dt} {}: {}", t.arch(), e.ir);
        let (_, regs, spill) = common::compile_assembled(&k, &spec, &t, &format!("swiglu_one_by_one_{dt}")).map_err(|e| e.0).unwrap();
        assert_eq!(spill, 0, "{dt} {}: {spill} bytes of spills at {regs} registers", t.arch());
    }
    // five dots in one loop: more than the matrix path accumulates at once, so each is
    // lowered where it stands, and the plan says why
    let def = &five_products::DEF;
    let e = compile(&(def.build)(&[DType::BF16]).unwrap(), &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap();
    assert!(e.ir.contains("  dots: ") && e.ir.contains("5 `dot`s") && e.ir.contains("at most 4"), "{}", e.ir);
}

/// The pair goes through the general lowering on sm_90a: both dots on `wgmma` from TMA
/// rings (the shared `x` tile loaded once a stage), no turns between the warpgroups
/// (nothing but the dots and their adds in the loop), the output by TMA bulk stores,
/// without spills; its scheduled IR pinned.
#[test]
fn swiglu_gemm_takes_the_general_lowering_by_default() {
    let def = &kfuse::ops::kernels::swiglu_gemm::DEF;
    let e = compile(&(def.build)(&[DType::BF16]).unwrap(), &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap();
    assert!(e.ir.contains(kfuse::codegen::passes::select_mma_path::GENERAL_TAKES), "{}", e.ir);
    let plan = e.plan.to_string();
    assert_eq!(plan.matches(": wgmma m64n128k16 over 2 warpgroup(s)").count(), 2, "{plan}");
    assert!(plan.contains("(TMA, mbarriers;") && !plan.contains("take turns") && plan.contains("TMA bulk stores"), "{plan}");
    // (both dots read A: the ring's stage is released whole, not by groups)
    assert!(!plan.contains("mbarriers of their own"), "{plan}");
    assert_eq!(e.source.matches("&kf_rtm0, ").count(), 1, "x: one TMA box a stage\n{}", e.source);
    let (_, spill) = common::assemble(&e.source, &e.arch, &e.options, "swiglu_general").unwrap();
    assert_eq!(spill, 0);
    insta::assert_snapshot!("swiglu_gemm_bf16_sm90a_ir", e.ir);
}

/// Three products with their own accumulators (two A tiles, three B tiles, one of them
/// K-major) go through the general lowering by default too: three `wgmma` lines over the
/// producer's TMA rings, accumulators narrowed to 64 columns, without spills.
#[test]
fn three_products_take_the_general_lowering_by_default() {
    let def = &three_products::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let mut spec = spec_mnk(def, 4096, 4096, 4096);
    spec.tensors[3] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
    let (e, _, spill) = common::compile_assembled(&k, &spec, &Target::sm90a(), "three_products_general").unwrap();
    let plan = e.plan.to_string();
    assert!(e.ir.contains(kfuse::codegen::passes::select_mma_path::GENERAL_TAKES), "{}", e.ir);
    assert_eq!(plan.matches(": wgmma m64n64k16 over 2 warpgroup(s), accumulating onto its addend; A from shared memory (K-major, 128-byte swizzle, copied by the producer warpgroup").count(), 3, "{plan}");
    assert!(plan.contains("B from shared memory (K-major"), "{plan}");
    assert_eq!(spill, 0);
}

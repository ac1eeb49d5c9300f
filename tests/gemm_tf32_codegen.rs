//! What the compiler emits for f32 products that allow TF32 (`dot_tf32`; the kernels
//! behind `GemmOptions::tf32`), on a machine without a GPU: on sm_90a `wgmma … k8 …
//! tf32` on K-major operands arriving by TMA (the general lowering for rank-2 operands,
//! the matrix path's template for batched ones), NVRTC + `ptxas -v` without spills for
//! each shape class the tile heuristic distinguishes (and the batched and `beta · c`
//! kernels), a snapshot of the scheduled IR; on sm_80/sm_89 the exact FMA path.

mod common;

use common::gemm::spec_mnk;

use kfuse::codegen::{compile, Spec, Target, TensorSpec};
use kfuse::ir::KernelDef;
use kfuse::DType;

/// The spec of a `[.., M, K] · [.., K, N]` kernel as `gemm_ex` passes its operands on
/// sm_90a with `tf32`: `a` row-major, `b` a transposed view of an `[.., N, K]` tensor
/// (K contiguous), the rest row-major; `shape` in order of first appearance.
fn tf32_spec(def: &KernelDef, shape: &[u32]) -> Spec {
    let mut s = common::snapshot_spec(def);
    s.shape_pow2 = shape.iter().map(|v| v.next_power_of_two()).collect();
    let r = s.tensors[1].as_ref().map_or(2, |t| t.stride_div.len());
    let mut sd = vec![16; r];
    sd[r - 2] = 0;
    s.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: sd });
    s
}

#[test]
fn tf32_gemm_takes_wgmma_on_sm90a() {
    let def = &kfuse::ops::kernels::gemm_tf32_scaled::DEF;
    let k = (def.build)(&[DType::F32]).unwrap();
    let e = compile(&k, &tf32_spec(def, &[4096, 4096, 4096]), &Target::sm90a()).unwrap();
    assert!(e.source.contains("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32"), "{}", e.source);
    assert!(e.source.contains("cp.async.bulk.tensor.2d.shared::cluster.global"), "operands arrive by TMA");
    // the general lowering's: both operands K-major in the producer's rings
    let plan = e.plan.to_string();
    assert!(plan.contains("a matrix loop on the tensor cores") && e.tiles.get("BK") == Some(&32), "{plan}");
    let line = plan.lines().find(|l| l.contains(": wgmma m64n256k8 over 2 warpgroup(s) (f32 operands read as TF32)")).unwrap_or_else(|| panic!("{plan}"));
    assert_eq!(line.matches("K-major, 128-byte swizzle, copied by the producer warpgroup").count(), 2, "{line}");
    assert_eq!(e.persistent, Some(Target::sm90a().num_sms));
    insta::assert_snapshot!("gemm_tf32_sm90a_ir", e.ir);
    // the PTX keeps the instruction
    let ptx = kfuse::runtime::nvrtc::compile_ptx(&e.source, &e.arch, &e.options).unwrap();
    assert!(ptx.contains("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32"));
}

#[test]
fn tf32_gemm_on_sm80_and_sm89_is_exact() {
    let def = &kfuse::ops::kernels::gemm_tf32_scaled::DEF;
    let k = (def.build)(&[DType::F32]).unwrap();
    for t in [Target::sm80(), Target::sm89()] {
        let e = compile(&k, &tf32_spec(def, &[4096, 4096, 4096]), &t).unwrap();
        assert!(e.plan.to_string().contains(": f32 FMAs") && e.ir.contains("exact f32 products are within what TF32 allows"), "{}", e.ir);
        let ptx = kfuse::runtime::nvrtc::compile_ptx(&e.source, &e.arch, &e.options).unwrap();
        assert!(ptx.contains("fma.rn.f32") && !ptx.contains(".tf32") && !ptx.contains("mma."), "{}", e.arch);
    }
    // the plain f32 gemm never reads TF32, on sm_90a either
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::F32]).unwrap();
    let e = compile(&k, &tf32_spec(def, &[4096, 4096, 4096]), &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains(": f32 FMAs") && !e.source.contains("tf32"), "{}", e.ir);
}

#[test]
fn tf32_gemm_kernels_assemble_without_spills() {
    use kfuse::ops::kernels as k;
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut checked = 0;
    // shape classes: 128x256 (4096³), 128x128 (1024 x 2048), 64x64 (M = 127); an
    // epilogue reading a [BM, BN] tile (`beta · c`) caps BN at 128
    for (m, n, kk) in [(4096, 4096, 4096), (1024, 2048, 1024), (127, 4096, 4096)] {
        let cases: Vec<(&str, &KernelDef, Vec<DType>, Vec<u32>)> = vec![
            ("gemm_tf32_scaled", &k::gemm_tf32_scaled::DEF, vec![DType::F32], vec![m, kk, n]),
            ("gemm_tf32_scaled_to_bf16", &k::gemm_tf32_scaled::DEF, vec![DType::BF16], vec![m, kk, n]),
            ("gemm_tf32_axpby", &k::gemm_tf32_axpby::DEF, vec![DType::F32], vec![m, kk, n]),
            ("gemm_batched_tf32_scaled", &k::gemm_batched_tf32_scaled::DEF, vec![DType::F32], vec![4, m, kk, n]),
            ("gemm_batched_tf32_axpby", &k::gemm_batched_tf32_axpby::DEF, vec![DType::F16], vec![4, m, kk, n]),
        ];
        for (name, def, dts, shape) in cases {
            let e = match compile(&(def.build)(&dts).unwrap(), &tf32_spec(def, &shape), &Target::sm90a()) {
                Ok(e) => e,
                Err(err) => {
                    failures.push(format!("{name} M{m} N{n}: {err}"));
                    continue;
                }
            };
            assert!(e.source.contains(".f32.tf32.tf32"), "{name}: {}", e.ir);
            match common::assemble(&e.source, &e.arch, &e.options, &format!("tf32_{name}_{m}_{n}")) {
                Ok((regs, spill)) => {
                    report.push(format!("{name} M{m} N{n} K{kk} tiles {:?}: {regs} registers, {spill} bytes of spills", e.tiles));
                    if spill > 0 {
                        failures.push(format!("{name} M{m} N{n} K{kk} (tiles {:?}): {spill} bytes of spills ({regs} registers)", e.tiles));
                    }
                }
                Err(err) => failures.push(format!("{name} M{m} N{n}: {err}")),
            }
            checked += 1;
        }
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, 15);
}

#[test]
fn tf32_row_major_b_is_refused_by_the_kernel_and_copied_by_the_op() {
    // the kernel on a row-major `b` ([K, N], N contiguous): refused with the fix; the op
    // (`gemm_ex` with `tf32`) makes the K-major copy before it launches
    let def = &kfuse::ops::kernels::gemm_tf32_scaled::DEF;
    let k = (def.build)(&[DType::F32]).unwrap();
    let err = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap_err().to_string();
    assert!(err.contains("K contiguous") && err.contains("tf32: true"), "{err}");
}

/// A 1 × 1 × 1 TF32 product whose operands TMA cannot read as they lie (4-byte rows) is
/// copied to padded rows with K innermost for both: `a` and `b` are `[1, 1]` with unit
/// strides along both dimensions, and the copy picks, of those, the ones that keep each
/// operand K-major (a copy with N innermost would leave `b` MN-major, which WGMMA does
/// not read as TF32).
#[test]
fn a_one_element_tf32_product_is_copied_k_major() {
    use kfuse::runtime::ArgDesc;
    let (a, b, o) = (ArgDesc::tensor(DType::F32, &[1, 1]), ArgDesc::strided(DType::F32, &[1, 1], &[1, 1]), ArgDesc::tensor(DType::F32, &[1, 1]));
    let e = kfuse::runtime::emit(&kfuse::ops::kernels::gemm_tf32_scaled::DEF, &[a, b, o, ArgDesc::Scalar(DType::F32)], &Target::sm90a());
    let e = e.unwrap_or_else(|e| panic!("{e}"));
    assert!(e.plan.to_string().contains("operand `b` copied"), "{}", e.plan);
}

//! What the compiler emits for f32 matrix products (the writer's exact FMA rule), on a
//! machine without a GPU: `kfuse::ops::gemm` and its configurable and batched kernels
//! with f32 operands, a user GEMM with a fused bias + GELU epilogue, and f16/bf16
//! operands the copy engines cannot read (still on the tensor cores, written to their
//! tiles from registers) —
//! on sm_80, sm_89 and sm_90a, for each shape class the tile heuristic distinguishes:
//! NVRTC + `ptxas -v` with no spills, PTX of exact f32 FMAs (`fma.rn.f32`, no TF32, no
//! flush to zero), and a snapshot of the scheduled IR.

mod common;

use common::gemm::{gemm_bias_gelu, spec_mnk};

use kfuse::codegen::{compile, Target};
use kfuse::ir::KernelDef;
use kfuse::DType;

fn targets() -> [Target; 3] {
    [Target::sm80(), Target::sm89(), Target::sm90a()]
}

/// The snapshot spec of `def` with its shape symbols set (in order of first appearance).
fn spec_shape(def: &KernelDef, shape: &[u32]) -> kfuse::codegen::Spec {
    let mut s = common::snapshot_spec(def);
    s.shape_pow2 = shape.iter().map(|v| v.next_power_of_two()).collect();
    s
}

#[test]
fn f32_gemm_takes_the_fma_rule() {
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::F32]).unwrap();
    for t in targets() {
        let e = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &t).unwrap();
        assert!(e.plan.to_string().contains(": f32 FMAs on runs of 4 a thread") && e.ir.contains("exact f32 products"), "{}", e.plan);
        assert_eq!((e.tiles.get("BM"), e.tiles.get("BN"), e.tiles.get("BK")), (Some(&128), Some(&128), Some(&8)));
        assert!(e.source.contains("fmaf(") && !e.source.contains("mma") && !e.source.contains("cp.async"), "{}", e.source);
        assert_eq!((e.block_threads, e.persistent, e.cluster_x), (256, None, 1));
        // the PTX: exact f32 FMAs, nothing of the matrix units, no TF32, no flush to zero
        let ptx = kfuse::runtime::nvrtc::compile_ptx(&e.source, &e.arch, &e.options).unwrap();
        assert!(ptx.matches("fma.rn.f32").count() >= 8 * 8 * 8, "the 8x8 thread tile over BK = 8, unrolled");
        for no in ["mma", "tf32", ".ftz", "approx", "cp.async"] {
            assert!(!ptx.contains(no), "`{no}` in the PTX of the f32 gemm on {}", e.arch);
        }
        if t == Target::sm80() {
            insta::assert_snapshot!("gemm_f32_sm80_ir", e.ir);
        }
    }
}

#[test]
fn f32_gemm_kernels_compile_without_spills() {
    use kfuse::ops::kernels as k;
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut checked = 0;
    // shape classes: 128x128 (8x8 a thread), 128x64 on sm_80/89 or 64x64 on sm_90
    // (1024³), 64x64 (M = 127)
    for (m, n, kk) in [(4096, 4096, 4096), (1024, 1024, 1024), (127, 4096, 4096)] {
        for target in targets() {
            let cases: Vec<(&str, &KernelDef, Vec<DType>, Vec<u32>)> = vec![
                ("gemm", &k::gemm::DEF, vec![DType::F32], vec![m, kk, n]),
                ("gemm_bias_gelu", &gemm_bias_gelu::DEF, vec![DType::F32], vec![m, kk, n]),
                ("gemm_scaled", &k::gemm_scaled::DEF, vec![DType::F32, DType::F32], vec![m, kk, n]),
                ("gemm_scaled_to_bf16", &k::gemm_scaled::DEF, vec![DType::F32, DType::BF16], vec![m, kk, n]),
                ("gemm_axpby", &k::gemm_axpby::DEF, vec![DType::F32, DType::F32], vec![m, kk, n]),
                ("gemm_batched_axpby", &k::gemm_batched_axpby::DEF, vec![DType::F32, DType::F32], vec![4, m, kk, n]),
            ];
            for (name, def, dts, shape) in cases {
                // (the runtime's register-room attempts: the first that builds without spills)
                let kernel = (def.build)(&dts).unwrap();
                match common::compile_assembled(&kernel, &spec_shape(def, &shape), &target, &format!("fma_{name}_{m}_{n}")) {
                    Ok((e, regs, spill)) => {
                        assert!(e.plan.to_string().contains(": f32 FMAs on runs of 4 a thread"), "{name}: {}", e.plan);
                        let tile = format!("tile {}x{}x{}", e.tiles["BM"], e.tiles["BN"], e.tiles["BK"]);
                        let sched = e.ir.lines().find(|l| l.starts_with("schedule:")).unwrap_or("");
                        report.push(format!("{name} {} {tile} ({sched}): {regs} registers, {spill} bytes of spills", e.arch));
                        if spill > 0 {
                            failures.push(format!("{name} {} M{m} N{n} K{kk} ({tile}): {spill} bytes of spills ({regs} registers)", e.arch));
                        }
                    }
                    Err(err) => failures.push(format!("{name} {} M{m} N{n}: {}", target.arch(), err.0)),
                }
                checked += 1;
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, 54);
}

#[test]
fn unreadable_16_bit_operands_fall_back_and_assemble() {
    // `b` with rows 2 bytes off a 16-byte multiple: neither TMA nor cp.async can copy it;
    // the tensor cores still take it, `b` written to its tile from registers each step
    // (`wgmma` on sm_90a, 128 columns wide beside the producer's ring of `a`; `mma.sync`
    // on sm_80/sm_89)
    let def = &gemm_bias_gelu::DEF;
    let mut failures = Vec::new();
    for dt in [DType::BF16, DType::F16] {
        for target in targets() {
            let k = (def.build)(&[dt]).unwrap();
            let mut s = spec_mnk(def, 4096, 4096, 4096);
            s.tensors[1] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![1, 0] });
            // (the runtime's register-room attempts: the first that builds without spills)
            let (e, regs, spill) = match common::compile_assembled(&k, &s, &target, &format!("fma_fallback_{dt}")) {
                Ok(r) => r,
                Err(err) => {
                    failures.push(format!("{dt} {}: {}", target.arch(), err.0));
                    continue;
                }
            };
            if target.sm == 90 {
                let plan = e.plan.to_string();
                assert!(e.source.contains("wgmma.mma_async") && plan.contains("B from shared memory (MN-major, 128-byte swizzle, written where it is defined"), "{plan}");
                assert!(plan.contains("BN=128") && plan.contains("A from shared memory (K-major, 128-byte swizzle, copied by the producer warpgroup"), "{plan}");
            } else {
                assert!(e.source.contains("mma.sync.aligned.m16n8k16") && e.plan.to_string().contains("B from shared memory (MN-major, 128-byte swizzle, written where it is defined"), "{}", e.plan);
            }
            println!("gemm_bias_gelu {dt} {} (unreadable b): {regs} registers, {spill} bytes of spills, attempt {:?}", e.arch, e.register_attempt);
            if spill > 0 {
                failures.push(format!("{dt} {}: {spill} bytes of spills", e.arch));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The FMA rule's structure: 128x128x8 tiles, an accumulator in runs of 4 rows and 4
/// columns a thread read from shared memory as 16-byte vectors (`a` written
/// transposed), the operands' loads an iteration ahead; a store conversion past 48 KiB
/// (an N of 4097, no vector stores) takes dynamic shared memory instead of being
/// refused. Compiles without spills where NVRTC is found.
#[test]
fn fma_rule_reads_runs_of_four() {
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::F32]).unwrap();
    for t in targets() {
        for (m, n, kk) in [(4096, 4096, 4096), (4095, 4097, 255)] {
            let mut spec = spec_mnk(def, m, n, kk);
            if n == 4097 {
                // rows of `c` 4097 elements apart: no 16-byte stores
                spec.tensors[2].as_mut().unwrap().stride_div = vec![1, 1];
            }
            let e = compile(&k, &spec, &t).unwrap();
            let plan = e.plan.to_string();
            assert!(plan.contains("f32 FMAs on runs of 4 a thread") && plan.contains("issued an iteration ahead"), "{plan}");
            assert!(e.source.contains("kf_fa[((k / 32) % 2) * 4 + (k / 4) % 4]") && e.source.contains("reinterpret_cast<const kf_v16*>(kf_da + kk * 132"), "{}", e.source);
            assert_eq!((e.block_threads, e.tiles.get("BM"), e.tiles.get("BN"), e.tiles.get("BK")), (256, Some(&128), Some(&128), Some(&8)));
            if n == 4097 {
                assert!(e.source.contains("extern __shared__ __align__(16) unsigned char kf_smem[];") && e.smem_bytes > 48 * 1024, "{} dynamic bytes", e.smem_bytes);
            }
            if kfuse::runtime::nvrtc::nvrtc_available() {
                // the K tile's walk unrolled: 8 steps of 8x8 FMAs
                let ptx = kfuse::runtime::nvrtc::compile_ptx(&e.source, &e.arch, &e.options).unwrap();
                assert!(ptx.matches("fma.rn.f32").count() >= 8 * 8 * 8, "{} FMAs in the PTX on {}", ptx.matches("fma.rn.f32").count(), t.arch());
                let (regs, spills) = common::assemble(&e.source, &e.arch, &e.options, &format!("general_fma_{}", t.arch())).unwrap();
                assert_eq!(spills, 0, "{regs} registers, {spills} bytes of spills on {}", t.arch());
            }
        }
    }
}

//! What the compiler emits for matrix products on sm_80 (A100) and sm_89 (Ada), on a
//! machine without a GPU: the general lowering's kernel of `kfuse::ops::gemm`
//! (`cp.async` rings, `ldmatrix`, `mma.sync`) — structure checks that do not pin the
//! whole text — and NVRTC + `ptxas -v` with no spills, for `ops::gemm`, a user GEMM with
//! a fused bias + GELU epilogue and `gemm_ex`'s kernels, for each shape class the tile
//! heuristic distinguishes (128x128, 128x64, 64x64 tiles).

mod common;

use common::gemm::{gemm_bias_gelu, spec_mnk};

use kfuse::codegen::{compile, Target};
use kfuse::DType;

#[test]
fn sm80_gemm_takes_the_general_lowering_on_cp_async_rings() {
    let def = &kfuse::ops::kernels::gemm::DEF;
    for (target, stages) in [(Target::sm80(), 4), (Target::sm89(), 3)] {
        for dt in [DType::BF16, DType::F16] {
            let k = (def.build)(&[dt]).unwrap();
            let e = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &target).unwrap();
            let (plan, ty) = (e.plan.to_string(), if dt == DType::BF16 { "bf16" } else { "f16" });
            assert!(plan.contains("a matrix loop on the tensor cores"), "{plan}");
            let ring = format!("copied by cp.async into a {stages}-stage ring {} step(s) ahead; ldmatrix", stages - 1);
            assert!(plan.contains(&format!("mma.sync m16n8k16 over 4x1 warps; A from shared memory (K-major, 64-byte swizzle, {ring}); B from shared memory (MN-major, 128-byte swizzle, {ring})")), "{plan}");
            assert!(e.source.contains(&format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32")), "{}", e.source);
            assert!(e.source.contains("cp.async.cg.shared.global") && e.source.contains("kf_cp_async_wait<"), "operands arrive by cp.async");
            assert!(e.source.contains("kf_ldsm_x4(fa[i],") && e.source.contains("kf_ldsm_x4_t(fb,"), "fragments by ldmatrix, row-major B by ldmatrix.trans");
            assert!(!e.source.contains("kf_wg_fence();") && !e.source.contains("kf_proxy_fence();") && !e.source.contains("CUtensorMap"), "nothing of sm_90 on {}", e.arch);
            assert_eq!((e.block_threads, e.persistent, e.cluster_x), (128, None, 1));
            assert_eq!((e.tiles["BM"], e.tiles["BN"], e.tiles["BK"]), (128, 128, 32));
            assert_eq!(e.smem_bytes, 1024 + stages * (128 * 32 + 32 * 128) * 2);
            assert_eq!(e.arch, target.arch());
        }
    }
}

#[test]
fn sm80_gemm_kernels_compile_without_spills() {
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut checked = 0;
    // shape classes: 128x128 tiles, M = 127 (64x64), and 128x64 in between
    for (m, n, kk, tile) in [(4096, 4096, 4096, [128, 128, 32]), (127, 4096, 4096, [64, 64, 32]), (1024, 1024, 1024, [128, 64, 32])] {
        for target in [Target::sm80(), Target::sm89()] {
            for (name, def) in [("gemm", &kfuse::ops::kernels::gemm::DEF), ("gemm_bias_gelu", &gemm_bias_gelu::DEF)] {
                for dt in [DType::BF16, DType::F16] {
                    let k = (def.build)(&[dt]).unwrap();
                    let spec = spec_mnk(def, m, n, kk);
                    let e = match common::compile_assembled(&k, &spec, &target, &format!("{name}_{dt}_{m}_{n}")) {
                        Ok((e, _, _)) => e,
                        Err(err) => {
                            failures.push(format!("{name} {dt} {} M{m} N{n}: {}", target.arch(), err.0));
                            continue;
                        }
                    };
                    assert_eq!([e.tiles["BM"], e.tiles["BN"], e.tiles["BK"]], tile, "{name} M{m} N{n} {}: {}", e.arch, e.plan);
                    assert!(e.source.contains("mma.sync.aligned.m16n8k16"), "{name} M{m} N{n} {}: {}", e.arch, e.plan);
                    let tile = format!("{}x{}x{}", tile[0], tile[1], tile[2]);
                    match common::assemble(&e.source, &e.arch, &e.options, &format!("{name}_{dt}_{m}_{n}")) {
                        Ok((regs, spill)) => {
                            report.push(format!("{name} {dt} {} {tile} ({} threads): {regs} registers, {spill} bytes of spills", e.arch, e.block_threads));
                            if spill > 0 {
                                failures.push(format!("{name} {dt} {} M{m} N{n} K{kk} (tiles {:?}): {spill} bytes of spills ({regs} registers)", e.arch, e.tiles));
                            }
                        }
                        Err(err) => failures.push(format!("{name} {dt} {} M{m} N{n}: {err}", e.arch)),
                    }
                    checked += 1;
                }
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, 24);
}

/// The configurable products of `kfuse::ops::gemm_ex` and `gemm_batched` (scaling,
/// `beta * c` with a `[BM, BN]` tile of `c` in the epilogue, a batch index, f32
/// output) on sm_80 and sm_89: the general lowering's `mma.sync`, NVRTC + ptxas without
/// spills.
#[test]
fn sm80_gemm_ex_kernels_compile_without_spills() {
    use kfuse::ops::kernels as k;
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for (m, n, kk) in [(4096, 4096, 4096), (127, 4096, 4096), (1024, 1024, 1024)] {
        for target in [Target::sm80(), Target::sm89()] {
            for (dt, od) in [(DType::BF16, DType::BF16), (DType::F16, DType::F32)] {
                for (name, def, shape) in [
                    ("gemm_scaled", &k::gemm_scaled::DEF, vec![m, kk, n]),
                    ("gemm_axpby", &k::gemm_axpby::DEF, vec![m, kk, n]),
                    ("gemm_batched_scaled", &k::gemm_batched_scaled::DEF, vec![4, m, kk, n]),
                    ("gemm_batched_axpby", &k::gemm_batched_axpby::DEF, vec![4, m, kk, n]),
                ] {
                    let mut s = common::snapshot_spec(def);
                    s.shape_pow2 = shape.iter().map(|v: &u32| v.next_power_of_two()).collect();
                    let e = match common::compile_assembled(&(def.build)(&[dt, od]).unwrap(), &s, &target, &format!("{name}_{dt}_{od}_{m}_{n}")) {
                        Ok((e, _, _)) => e,
                        Err(err) => {
                            failures.push(format!("{name} {dt}->{od} {} M{m} N{n}: {}", target.arch(), err.0));
                            continue;
                        }
                    };
                    assert!(e.plan.to_string().contains("a matrix loop on the tensor cores") && e.plan.to_string().contains(": mma.sync m16n8k16 over"), "{}", e.plan);
                    match common::assemble(&e.source, &e.arch, &e.options, &format!("{name}_{dt}_{od}_{m}_{n}")) {
                        Ok((regs, spill)) => {
                            report.push(format!("{name} {dt}->{od} {} {:?} ({} threads): {regs} registers, {spill} bytes of spills", e.arch, e.tiles, e.block_threads));
                            if spill > 0 {
                                failures.push(format!("{name} {dt}->{od} {} M{m} N{n}: {spill} bytes of spills ({regs} registers)", e.arch));
                            }
                        }
                        Err(err) => failures.push(format!("{name} {dt}->{od} {} M{m} N{n}: {err}", e.arch)),
                    }
                }
            }
        }
    }
    println!("{}", report.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

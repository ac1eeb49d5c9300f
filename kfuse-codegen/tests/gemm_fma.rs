//! The writer's exact f32 FMA rule on a GEMM built with the IR builder: which `dot`
//! loops take it (f32 operands on every target; f16/bf16 operands the copy engines
//! cannot read stay on the tensor cores), the tiles and threads the passes choose, the
//! structure of the emitted source for every operand layout, the overrides, and the
//! accumulator layout the rule reads its 16-byte runs by. NVRTC + ptxas checks live in the
//! workspace tests (tests/gemm_fma_codegen.rs), GPU numerics in tests/gpu_gemm_f32.rs.

mod common;

use common::{accumulator_layout, coord, gemm_kernel, gemm_kernel_from, spec};
use kfuse_codegen::layout::RegMap;
use kfuse_codegen::{compile, EmittedKernel, Spec, Target, TensorSpec};
use kfuse_ir::{DType, Kernel, Layout};

fn targets() -> [Target; 3] {
    [Target::sm80(), Target::sm89(), Target::sm90a()]
}

/// The source is plain f32 FMAs on runs of 4 (16-byte reads of both operands): no
/// matrix instruction, no asynchronous copies.
fn assert_fma(e: &EmittedKernel, what: &str) {
    assert!(e.ir.contains("  dots: ") && e.ir.contains("exact f32 products"), "{what}: {}", e.ir);
    assert!(e.plan.dots.iter().any(|d| d.contains("f32 FMAs on runs of 4 a thread")), "{what}: {}", e.plan);
    assert!(e.source.contains("fmaf(") && e.source.contains("kf_v16"), "{what}: {}", e.source);
    for no in ["mma", "cp.async", "ldmatrix", "CUtensorMap", "mbarrier", "__cluster_dims__"] {
        assert!(!e.source.contains(no), "{what}: `{no}` in the FMA kernel");
    }
    assert!(!e.source.contains("tf32") && !e.source.contains("__fmul_rz"), "{what}");
    assert_eq!((e.persistent, e.cluster_x), (None, 1), "{what}");
}

/// The plan's `[BM, BN, BK]`.
fn tiles(e: &EmittedKernel) -> [u32; 3] {
    ["BM", "BN", "BK"].map(|n| e.plan.tiles.get(n).copied().unwrap_or(0))
}

/// `a` and `b` stored with their unit stride on the first dimension (a transposed view)
/// when asked, else the last; `None`: no unit stride at all (both strides 2·x).
fn spec_major(k: &Kernel, mnk: [u32; 3], a_first: Option<bool>, b_first: Option<bool>) -> Spec {
    let mut s = spec(k, mnk);
    for (i, first) in [(0, a_first), (1, b_first)] {
        s.tensors[i] = Some(match first {
            Some(true) => TensorSpec { ptr_align: 16, stride_div: vec![0, 16] },
            Some(false) => TensorSpec { ptr_align: 16, stride_div: vec![16, 0] },
            None => TensorSpec { ptr_align: 4, stride_div: vec![2, 2] },
        });
    }
    s
}

#[test]
fn f32_dots_take_the_fma_rule_on_every_target() {
    let k = gemm_kernel(DType::F32, false, false, true);
    for t in targets() {
        let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &t).unwrap();
        assert_fma(&e, &t.arch());
        assert_eq!(tiles(&e), [128, 128, 8], "{}", e.plan);
        assert_eq!((e.block_threads, e.arch.clone()), (256, t.arch()));
        // [8][128 + 4] floats for A (transposed) and for B, static shared memory
        assert_eq!(e.plan.static_smem_bytes, 2 * 8 * 132 * 4, "{}", e.plan);
        // the operand loads of the next step issued a step ahead
        assert!(e.plan.dots.iter().any(|d| d.contains("issued an iteration ahead")), "{}", e.plan);
        // the grid is the kernel's own program ids
        assert!(e.source.contains("blockIdx.x") && e.source.contains("blockIdx.y"));
        assert_eq!(e.grid_dims(&[300, 200, 1000]), [3, 2, 1]); // M, N, K
    }
}

#[test]
fn every_operand_layout_compiles() {
    // a: [M, K] or [K, M] (`.t()` in the kernel), b: [K, N] or [N, K]; each stored
    // row-major, as a transposed view, or with no unit stride at all
    let layouts = [Some(false), Some(true), None];
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for a_first in layouts {
                for b_first in layouts {
                    let k = gemm_kernel(dt, ta, tb, true);
                    let s = spec_major(&k, [4096, 4096, 4096], a_first, b_first);
                    // f16/bf16 take the matrix path when both are readable (and on
                    // sm_80/sm_89 always: gemm_sm80.rs)
                    let readable = a_first.is_some() && b_first.is_some();
                    if dt != DType::F32 && readable {
                        continue;
                    }
                    for t in targets().into_iter().filter(|t| dt == DType::F32 || t.sm == 90) {
                        let what = format!("{dt} ta={ta} tb={tb} a_first={a_first:?} b_first={b_first:?} {}", t.arch());
                        let e = compile(&k, &s, &t).unwrap_or_else(|err| panic!("{what}: {err}"));
                        if dt != DType::F32 {
                            // 16-bit operands the copies cannot read: written to their
                            // tiles from registers each step, still `wgmma`
                            assert!(e.source.contains("wgmma.mma_async") && e.plan.to_string().contains("written where it is defined"), "{what}: {}", e.plan);
                            continue;
                        }
                        assert_fma(&e, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn sixteen_bit_operands_stay_on_the_tensor_cores_where_the_copies_cannot_read() {
    let k = gemm_kernel(DType::F16, false, false, false);
    // aligned: the general lowering's `mma.sync`
    let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm80()).unwrap();
    assert!(e.ir.contains(kfuse_codegen::passes::select_mma_path::GENERAL_TAKES) && e.source.contains("mma.sync.aligned.m16n8k16"), "{}", e.ir);
    // (on sm_90a the general lowering's `wgmma`)
    let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap();
    assert!(e.ir.contains(kfuse_codegen::passes::select_mma_path::GENERAL_TAKES) && e.source.contains("wgmma.mma_async"), "{}", e.ir);
    // an unaligned operand: written to its tile from registers each step (`wgmma` on
    // sm_90a, a `b` 128 columns wide; `mma.sync` on sm_80/sm_89)
    for t in targets() {
        for (i, bad) in [(0, TensorSpec { ptr_align: 2, stride_div: vec![16, 0] }), (1, TensorSpec { ptr_align: 16, stride_div: vec![1, 0] })] {
            let mut s = spec(&k, [4096, 4096, 4096]);
            s.tensors[i] = Some(bad);
            let e = compile(&k, &s, &t).unwrap();
            let what = format!("f16 operand {i} unaligned on {}", t.arch());
            if t.sm == 90 {
                let plan = e.plan.to_string();
                assert!(e.source.contains("wgmma.mma_async") && plan.contains("written where it is defined"), "{what}: {plan}");
                assert!(i == 0 || plan.contains("BN=128"), "{what}: {plan}");
            } else {
                assert!(e.source.contains("mma.sync.aligned.m16n8k16") && e.plan.to_string().contains("written where it is defined"), "{what}: {}", e.plan);
            }
        }
    }
    // a K loop from 4: cp.async cannot copy the rows of `a` in 16-byte chunks (sm_80,
    // sm_89: `a` from registers, `b` in its ring) — TMA can (sm_90)
    let k4 = gemm_kernel_from(DType::BF16, false, false, false, 4);
    let s = spec(&k4, [4096, 4096, 4096]);
    for t in [Target::sm80(), Target::sm89()] {
        let e = compile(&k4, &s, &t).unwrap();
        let plan = e.plan.to_string();
        assert!(e.source.contains("mma.sync.aligned.m16n8k16") && plan.contains("A from shared memory (K-major, 64-byte swizzle, written where it is defined") && plan.contains("copied by cp.async"), "k0 = 4 on {}: {plan}", t.arch());
    }
    let e = compile(&k4, &s, &Target::sm90a()).unwrap();
    assert!(e.ir.contains(kfuse_codegen::passes::select_mma_path::GENERAL_TAKES) && e.plan.tensor_cores() && e.plan.to_string().contains("(TMA, mbarriers;"), "{}", e.plan);
}

#[test]
fn tiles_follow_the_shape_class() {
    let k = gemm_kernel(DType::F32, false, false, false);
    // the widest tile that still gives each multiprocessor one (108 on sm_80, 132 on sm_90)
    for (mnk, t, tile) in [
        ([4096, 4096, 4096], Target::sm80(), [128, 128, 8]),
        ([1024, 1024, 1024], Target::sm80(), [128, 64, 8]),
        ([1024, 1024, 1024], Target::sm90a(), [64, 64, 16]),
        ([127, 4096, 4096], Target::sm90a(), [64, 64, 16]),
        ([1, 1, 1], Target::sm80(), [64, 64, 16]),
    ] {
        let e = compile(&k, &spec(&k, mnk), &t).unwrap();
        assert_eq!(tiles(&e), tile, "{mnk:?} {}: {}", t.arch(), e.plan);
        assert_eq!(e.block_threads, 256);
    }
}

#[test]
fn overrides_reach_the_plan() {
    let k = gemm_kernel(DType::F32, true, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tiles = [("BM".to_string(), 64), ("BN".to_string(), 128), ("BK".to_string(), 32)].into_iter().collect();
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert_eq!(tiles(&e), [64, 128, 32], "{}", e.plan);
    assert_eq!(e.plan.static_smem_bytes, (32 * 68 + 32 * 132) * 4, "{}", e.plan);
    // BM alone: BK follows it (1024 / BM)
    s.tiles = [("BM".to_string(), 64)].into_iter().collect();
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert_eq!(tiles(&e), [64, 128, 16], "{}", e.plan);
    // threads and minimum blocks
    s.tiles.clear();
    s.threads = Some(128);
    s.min_blocks = Some(1);
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert!(e.ir.contains("threads=128 min_blocks=1") && e.plan.dots.iter().any(|d| d.contains("runs of 4")), "{}", e.ir);
    assert!(e.source.contains("__launch_bounds__(128, 1)"));
    // tiles smaller than a sweep of the block: replicas, still one source
    s.threads = None;
    s.min_blocks = None;
    s.tiles = [("BM".to_string(), 16), ("BN".to_string(), 8), ("BK".to_string(), 4)].into_iter().collect();
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert!(tiles(&e) == [16, 8, 4] && e.ir.contains("threads=32"), "{}", e.ir);
}

#[test]
fn the_accumulator_layout_is_what_the_fmas_assume() {
    // the rule's FMA `i, j` updates register `(i/4)·RS_r + (i%4)·ES_r + (j/4)·RS_c +
    // (j%4)·ES_c`, with row `r0 + (i/4)·chunk_r + i%4` and column likewise: every
    // element of the tile exactly once, runs of 4 a thread
    let k = gemm_kernel(DType::F32, false, false, false);
    for (mnk, t) in [([4096, 4096, 4096], Target::sm80()), ([1024, 1024, 1024], Target::sm80()), ([127, 4096, 4096], Target::sm90a())] {
        let sched = kfuse_codegen::schedule(&k, &spec(&k, mnk), &t).unwrap();
        let Some(l @ Layout::Blocked(b)) = accumulator_layout(&sched) else { panic!() };
        assert!(b.steps.is_empty() && b.size_per_thread == [4, 4] && b.order == [1, 0]);
        let map = RegMap::of(l).unwrap();
        let (r, c) = (&map.axes[0], &map.axes[1]);
        let (bm, bn) = (r.reps * r.chunk, c.reps * c.chunk);
        let (tm, tn) = (r.reps * r.spt, c.reps * c.spt);
        assert_eq!(map.regs, tm * tn);
        let mut seen = std::collections::BTreeSet::new();
        for warp in 0..sched.schedule.num_threads / 32 {
            for lane in 0..32 {
                let (r0, c0) = (coord(&map, 0, 0, warp, lane), coord(&map, 1, 0, warp, lane));
                assert_eq!((r0 % 4, c0 % 4), (0, 0), "16-byte aligned runs");
                for i in 0..tm {
                    for j in 0..tn {
                        let reg = (i / 4) * r.rep_stride + (i % 4) * r.e_stride + (j / 4) * c.rep_stride + (j % 4) * c.e_stride;
                        let (row, col) = (r0 + (i / 4) * r.chunk + i % 4, c0 + (j / 4) * c.chunk + j % 4);
                        assert_eq!((coord(&map, 0, reg, warp, lane), coord(&map, 1, reg, warp, lane)), (row, col));
                        assert!(seen.insert((row, col)));
                    }
                }
            }
        }
        assert_eq!(seen.len() as u32, bm * bn, "every element once");
    }
}

#[test]
fn codegen_is_deterministic() {
    let k = gemm_kernel(DType::F32, true, true, true);
    let s = spec_major(&k, [300, 200, 1000], Some(false), None);
    let a = compile(&k, &s, &Target::sm89()).unwrap();
    let b = compile(&k.clone(), &s.clone(), &Target::sm89()).unwrap();
    assert_eq!(a.source, b.source);
    assert_eq!(a.ir, b.ir);
}

#[test]
fn the_autotuner_gets_fma_candidates() {
    // the heuristic's tiles first, then the BM x BN alternatives the FMA rule takes
    let k = gemm_kernel(DType::F32, false, false, false);
    let c = kfuse_codegen::tuning_candidates(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm80());
    assert!(c.len() >= 3, "{c:?}");
    assert_eq!((c[0]["BM"], c[0]["BN"]), (128, 128));
    for t in &c {
        let s = Spec { tiles: t.clone(), ..spec(&k, [4096, 4096, 4096]) };
        let e = compile(&k, &s, &Target::sm80()).unwrap();
        assert!(e.plan.dots.iter().any(|d| d.contains("f32 FMAs")), "{t:?}: {}", e.plan);
    }
}

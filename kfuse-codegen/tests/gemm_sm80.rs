//! The sm_80/sm_89 matrix path's template (cp.async + ldmatrix + mma.sync; `GENERAL=0`:
//! by default the general lowering takes these loops, tests/gemm_sm80_codegen.rs) on a
//! GEMM built with the IR builder: the plan recorded in the IR, the structure of the
//! emitted source for every combination of operand majorness, the tile heuristic and
//! its overrides, the accumulator layout against the instruction's fragment, and the
//! refusals with their reasons. NVRTC + ptxas checks live in the workspace tests
//! (tests/gemm_sm80_codegen.rs); numerics on a GPU run with `KFUSE_TARGET=sm_80`.

mod common;

use common::{accumulator_layout, coord, gemm_erf_kernel, gemm_kernel, gemm_kernel_from};

/// `common::spec` asking for the template (`GENERAL=0`).
fn spec(k: &Kernel, mnk: [u32; 3]) -> Spec {
    let mut s = common::spec(k, mnk);
    s.tiles.insert("GENERAL".into(), 0);
    s
}
use kfuse_codegen::layout::RegMap;
use kfuse_codegen::{compile, Spec, Target, TensorSpec};
use kfuse_ir::{DType, Kernel, Layout};
use kfuse_codegen::MmaSchedule;

/// The spec of [`gemm_kernel`] with `a` and `b` contiguous along their first dimension
/// when asked (a transposed view), else along their last.
fn spec_major(k: &Kernel, mnk: [u32; 3], a_first: bool, b_first: bool) -> Spec {
    let mut s = spec(k, mnk);
    for (i, first) in [(0, a_first), (1, b_first)] {
        if first {
            s.tensors[i] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 8] });
        }
    }
    s
}

#[test]
fn every_operand_layout_takes_the_mma_sync_path() {
    // a: [M, K] or its transpose [K, M] (`.t()` in the kernel), stored row-major or as a
    // transposed view; likewise b. A is K-major when K is contiguous, B when K is.
    for dt in [DType::BF16, DType::F16] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (a_first, b_first) in [(false, false), (true, false), (false, true), (true, true)] {
                let k = gemm_kernel(dt, ta, tb, true);
                let e = compile(&k, &spec_major(&k, [4096, 4096, 4096], a_first, b_first), &Target::sm80()).unwrap();
                let what = format!("{dt} ta={ta} tb={tb} a_first={a_first} b_first={b_first}");
                let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
                assert!(e.source.contains(&format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32")), "{what}");
                assert!(e.source.contains("cp.async.cg.shared.global") && e.source.contains("cp.async.commit_group"), "{what}");
                assert!(e.source.contains("kf_cp_async_wait<2>();") && e.source.contains("kf_cp_async_wait<0>();"), "{what}");
                assert!(e.source.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"), "{what}");
                assert!(!e.source.contains("wgmma") && !e.source.contains("mbarrier"), "{what}");
                // K is contiguous in a when a's unit-stride dimension is K's
                // a's tensor is [M, K] (or [K, M] when ta): K is its last dimension (first)
                let a_k_major = if ta { a_first } else { !a_first };
                // b's tensor is [K, N] (or [N, K] when tb): K is its first dimension (last)
                let b_k_major = if tb { !b_first } else { b_first };
                let maj = |km: bool| if km { "K-major" } else { "MN-major" };
                let plan = e.ir.lines().find(|l| l.contains("mma MmaSyncCpAsync")).unwrap_or_else(|| panic!("{what}: {}", e.ir));
                let a_part = &plan[plan.find(", A ").unwrap()..plan.find(", B ").unwrap()];
                let b_part = &plan[plan.find(", B ").unwrap()..];
                assert!(a_part.contains(maj(a_k_major)), "{what}: {plan}");
                assert!(b_part.contains(maj(b_k_major)), "{what}: {plan}");
                // MN-major operands are read with ldmatrix.trans
                assert_eq!(e.source.contains("kf_ldsm_x4_t(kf_fa[mi]"), !a_k_major, "{what}");
                assert_eq!(e.source.contains("kf_ldsm_x4_t(t,"), !b_k_major, "{what}");
                assert_eq!((e.block_threads, e.persistent, e.cluster_x, e.arch.as_str()), (128, None, 1, "sm_80"), "{what}");
                assert_eq!(e.smem_bytes, 4 * (128 * 32 + 32 * 128) * 2, "{what}");
            }
        }
    }
}

#[test]
fn tiles_follow_the_shape_class_and_the_target() {
    let k = gemm_kernel(DType::BF16, false, false, false);
    // sm_80, 108 multiprocessors: the widest tile that still gives each one a tile
    for (mnk, tile, warps) in [([4096, 4096, 4096], "tile 128x128x32", "warps 2x2 (warp tile 64x64)"), ([1024, 1024, 1024], "tile 128x64x32", "warps 2x2 (warp tile 64x32)"), ([127, 4096, 4096], "tile 64x64x32", "warps 2x2 (warp tile 32x32)")] {
        let e = compile(&k, &spec(&k, mnk), &Target::sm80()).unwrap();
        assert!(e.ir.contains(tile) && e.ir.contains(warps) && e.ir.contains("4 stages"), "{mnk:?}: {}", e.ir);
        assert!(e.ir.contains("schedule: threads=128 min_blocks=2"), "{}", e.ir);
    }
    // Ada: 99 KiB a block, three 16 KiB stages so that two blocks share a multiprocessor
    let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm89()).unwrap();
    assert!(e.ir.contains("tile 128x128x32") && e.ir.contains("3 stages"), "{}", e.ir);
    assert_eq!((e.arch.as_str(), e.smem_bytes), ("sm_89", 3 * 16384));
    // a transcendental epilogue keeps 64 accumulators a thread: 8 warps of 64x32
    let g = gemm_erf_kernel();
    let e = compile(&g, &spec(&g, [4096, 4096, 4096]), &Target::sm80()).unwrap();
    assert!(e.ir.contains("warps 2x4 (warp tile 64x32)") && e.ir.contains("threads=256 min_blocks=1"), "{}", e.ir);
}

#[test]
fn overrides_reach_the_plan() {
    let k = gemm_kernel(DType::F16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tiles = [("BM".to_string(), 64), ("BN".to_string(), 128), ("BK".to_string(), 64), ("STAGES".to_string(), 3)].into_iter().collect();
    s.threads = Some(256);
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert!(e.ir.contains("tile 64x128x64") && e.ir.contains("warps 2x4 (warp tile 32x32)") && e.ir.contains("3 stages"), "{}", e.ir);
    assert!(e.ir.contains("threads=256 min_blocks=2"), "{}", e.ir);
    assert_eq!(e.smem_bytes, 3 * (64 * 64 + 64 * 128) * 2);
    // 128-byte A rows: the swizzle spans all 8 chunks
    assert!(e.ir.contains(" K-major swizzle 128B, B "), "{}", e.ir);
}

#[test]
fn the_accumulator_layout_is_the_instruction_fragment() {
    // registers 4 (i * J + j) + r of warp (a, b) are d0..d3 of m16n8 tile (i, j) at
    // rows 16 (a + WM i), columns 8 (b + WN j): d_r at row lane/4 + 8 (r / 2), column
    // 2 (lane % 4) + r % 2
    let k = gemm_kernel(DType::BF16, false, false, false);
    for (mnk, [wm, wn]) in [([4096, 4096, 4096], [2u32, 2u32]), ([127, 4096, 4096], [2, 2])] {
        let e = compile(&k, &spec(&k, mnk), &Target::sm80()).unwrap();
        let sched = kfuse_codegen::schedule(&k, &spec(&k, mnk), &Target::sm80()).unwrap();
        let plan = sched.schedule.mma().cloned().unwrap();
        assert_eq!(plan.warps, [wm, wn]);
        let Some(l @ Layout::Blocked(_)) = accumulator_layout(&sched) else { panic!("{}", e.ir) };
        let map = RegMap::of(l).unwrap();
        let [bm, bn, _] = plan.tile;
        let (mi_n, ni_n) = (bm / (16 * wm), bn / (8 * wn));
        assert_eq!(map.regs, mi_n * ni_n * 4);
        let mut seen = std::collections::BTreeSet::new();
        for warp in 0..wm * wn {
            let (a, b) = (warp / wn, warp % wn);
            for lane in 0..32 {
                for i in 0..mi_n {
                    for j in 0..ni_n {
                        for r in 0..4 {
                            let reg = 4 * (i * ni_n + j) + r;
                            let row = 16 * (a + wm * i) + lane / 4 + 8 * (r / 2);
                            let col = 8 * (b + wn * j) + 2 * (lane % 4) + r % 2;
                            assert_eq!((coord(&map, 0, reg, warp, lane), coord(&map, 1, reg, warp, lane)), (row, col));
                            assert!(seen.insert((row, col)));
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len() as u32, bm * bn, "every element once");
    }
}

#[test]
fn operands_the_copies_cannot_read_fall_back_to_fma() {
    // what cp.async cannot copy in 16-byte chunks takes exact f32 FMAs (gemm_fma.rs)
    let fma = |e: &kfuse_codegen::EmittedKernel| e.ir.contains("mma FmaSimt") && e.source.contains("fmaf(") && !e.source.contains("mma.sync");
    let k = gemm_kernel(DType::BF16, false, false, false);
    // a row stride that is not a multiple of 16 bytes
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![1, 0] });
    assert!(fma(&compile(&k, &s, &Target::sm80()).unwrap()));
    // data not 16-byte aligned
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[0] = Some(TensorSpec { ptr_align: 8, stride_div: vec![16, 0] });
    assert!(fma(&compile(&k, &s, &Target::sm80()).unwrap()));
    // a K loop starting at 4: the chunks of `a`'s rows would not be 16-byte aligned
    let k4 = gemm_kernel_from(DType::BF16, false, false, false, 4);
    assert!(fma(&compile(&k4, &spec(&k4, [4096, 4096, 4096]), &Target::sm89()).unwrap()));
    // f32 operands
    let k32 = gemm_kernel(DType::F32, false, false, false);
    assert!(fma(&compile(&k32, &spec(&k32, [4096, 4096, 4096]), &Target::sm80()).unwrap()));
}

#[test]
fn refusals_name_the_reason() {
    // K tiles of 8 elements on readable operands: the override is refused, not rerouted
    let k = gemm_kernel(DType::BF16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tiles.insert("BK".into(), 8);
    let err = compile(&k, &s, &Target::sm80()).unwrap_err().to_string();
    assert!(err.contains("BK = 8") && err.contains("mma.sync"), "{err}");
}

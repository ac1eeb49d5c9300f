//! The sm_80/sm_89 matrix loop (the general lowering's `mma.sync` rule: `cp.async`
//! rings, `ldmatrix`, `mma.sync`) on a GEMM built with the IR builder: the structure of
//! the emitted source for every combination of operand majorness, the tiles, warps and
//! ring depth by target and their overrides, the accumulator layout against the
//! instruction's fragment, operands the copies cannot read written from registers,
//! and the refusals with their reasons. NVRTC + ptxas checks live in the workspace
//! tests (tests/gemm_sm80_codegen.rs); numerics on a GPU run with `KFUSE_TARGET=sm_80`.

mod common;

use common::{accumulator_layout, coord, gemm_erf_kernel, gemm_kernel, gemm_kernel_from, spec};
use kfuse_codegen::layout::RegMap;
use kfuse_codegen::passes::select_mma_path::GENERAL_TAKES;
use kfuse_codegen::{compile, EmittedKernel, Spec, Target, TensorSpec};
use kfuse_ir::{DType, Kernel, Layout};

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

/// The plan's line for the loop's dot (operands, rings, warps).
fn dot_note(e: &EmittedKernel) -> String {
    let plan = e.plan.to_string();
    plan.lines().find(|l| l.contains("`dot` %")).unwrap_or_else(|| panic!("{plan}")).to_string()
}

#[test]
fn every_operand_layout_takes_the_mma_sync_rule() {
    // a: [M, K] or its transpose [K, M] (`.t()` in the kernel), stored row-major or as a
    // transposed view; likewise b. A is K-major when K is contiguous, B when K is.
    for dt in [DType::BF16, DType::F16] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (a_first, b_first) in [(false, false), (true, false), (false, true), (true, true)] {
                let k = gemm_kernel(dt, ta, tb, true);
                let e = compile(&k, &spec_major(&k, [4096, 4096, 4096], a_first, b_first), &Target::sm80()).unwrap();
                let what = format!("{dt} ta={ta} tb={tb} a_first={a_first} b_first={b_first}");
                let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
                assert!(e.ir.contains(GENERAL_TAKES), "{what}: {}", e.ir);
                assert!(e.source.contains(&format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32")), "{what}");
                assert!(e.source.contains("cp.async.cg.shared.global") && e.source.contains("cp.async.commit_group"), "{what}");
                assert!(e.source.contains("kf_cp_async_wait<2>();"), "{what}");
                assert!(e.source.contains("ldmatrix.sync.aligned.m8n8.x4"), "{what}");
                assert!(!e.source.contains("wgmma.mma_async") && !e.source.contains("kf_proxy_fence();"), "{what}");
                // a's tensor is [M, K] (or [K, M] when ta): K is its last dimension (first)
                let a_k_major = if ta { a_first } else { !a_first };
                // b's tensor is [K, N] (or [N, K] when tb): K is its first dimension (last)
                let b_k_major = if tb { !b_first } else { b_first };
                let maj = |km: bool| if km { "K-major" } else { "MN-major" };
                let note = dot_note(&e);
                assert!(note.contains("mma.sync m16n8k16") && note.contains("4-stage ring"), "{what}: {note}");
                let a_part = &note[note.find("; A ").unwrap()..note.find("; B ").unwrap()];
                let b_part = &note[note.find("; B ").unwrap()..];
                assert!(a_part.contains(maj(a_k_major)), "{what}: {note}");
                assert!(b_part.contains(maj(b_k_major)), "{what}: {note}");
                // an MN-major operand is read with ldmatrix.trans
                assert_eq!(e.source.contains("kf_ldsm_x4_t("), !(a_k_major && b_k_major), "{what}");
                assert_eq!((e.block_threads, e.persistent, e.cluster_x, e.arch.as_str()), (128, None, 1, "sm_80"), "{what}");
                // four stages of a 128x32 and a 32x128 tile
                assert!(e.smem_bytes >= 4 * (128 * 32 + 32 * 128) * 2, "{what}: {}", e.smem_bytes);
            }
        }
    }
}

#[test]
fn tiles_and_rings_follow_the_shape_and_the_target() {
    let k = gemm_kernel(DType::BF16, false, false, false);
    // sm_80: 128x128 tiles, four warps, two blocks a multiprocessor, 4-stage rings
    let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm80()).unwrap();
    assert!(e.plan.to_string().contains("tiles: BK=32 BM=128 BN=128") && dot_note(&e).contains("4-stage ring"), "{}", e.plan);
    assert!(e.ir.contains("schedule: threads=128 min_blocks=2"), "{}", e.ir);
    // Ada: 99 KiB a block, three stages so that two blocks share a multiprocessor
    let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm89()).unwrap();
    assert!(dot_note(&e).contains("3-stage ring") && e.arch == "sm_89", "{}", e.plan);
    // a transcendental epilogue keeps fewer accumulators a thread: 8 warps, the
    // multiprocessor alone
    let g = gemm_erf_kernel();
    let e = compile(&g, &spec(&g, [4096, 4096, 4096]), &Target::sm80()).unwrap();
    assert!(e.ir.contains("threads=256 min_blocks=1"), "{}", e.ir);
}

#[test]
fn overrides_reach_the_plan() {
    let k = gemm_kernel(DType::F16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tiles = [("BM".to_string(), 64), ("BN".to_string(), 128), ("BK".to_string(), 64), ("STAGES".to_string(), 3)].into_iter().collect();
    s.threads = Some(256);
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert!(e.plan.to_string().contains("tiles: BK=64 BM=64 BN=128") && dot_note(&e).contains("3-stage ring") && e.block_threads == 256, "{}", e.plan);
    // 128-byte A rows: the swizzle spans all 8 chunks
    assert!(dot_note(&e).contains("A from shared memory (K-major, 128-byte swizzle"), "{}", e.plan);
    // more stages than the default, where one block holds them
    s.tiles.insert("STAGES".into(), 6);
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert!(dot_note(&e).contains("6-stage ring"), "{}", e.plan);
    // the persistent walk's option has nothing to ask for here: the same loop
    s.tiles.insert("STAGES".into(), 3);
    let base = compile(&k, &s, &Target::sm80()).unwrap().source;
    for (o, v) in [("GROUPM", 4)] {
        let mut t = s.clone();
        t.tiles.insert(o.into(), v);
        assert_eq!(compile(&k, &t, &Target::sm80()).unwrap().source, base, "{o}={v}");
    }
}

#[test]
fn the_accumulator_layout_is_the_instruction_fragment() {
    // each warp's registers hold whole m16n8 instruction tiles: d_r of a tile at row
    // lane/4 + 8 (r / 2), column 2 (lane % 4) + r % 2 from its corner, and every element
    // of the block tile once
    let k = gemm_kernel(DType::BF16, false, false, false);
    for mnk in [[4096, 4096, 4096], [127, 4096, 4096]] {
        let sched = kfuse_codegen::schedule(&k, &spec(&k, mnk), &Target::sm80()).unwrap();
        let Some(l @ Layout::Blocked(_)) = accumulator_layout(&sched) else { panic!("{mnk:?}") };
        let map = RegMap::of(l).unwrap();
        let warps = sched.schedule.num_threads / 32;
        let (bm, bn) = (map.axes[0].shape, map.axes[1].shape);
        assert_eq!(map.regs * 32 * warps, bm * bn, "{mnk:?}");
        let mut seen = std::collections::BTreeSet::new();
        for warp in 0..warps {
            for lane in 0..32 {
                for reg in 0..map.regs {
                    let (row, col) = (coord(&map, 0, reg, warp, lane), coord(&map, 1, reg, warp, lane));
                    assert!(seen.insert((row, col)), "{mnk:?}: ({row}, {col}) twice");
                    if reg % 4 == 0 {
                        // a fragment's d0: its tile corner is 16 x 8 aligned
                        assert_eq!(((row - lane / 4) % 16, (col - 2 * (lane % 4)) % 8), (0, 0), "{mnk:?} warp {warp} lane {lane} reg {reg}");
                        for r in 1..4 {
                            let (rr, cc) = (coord(&map, 0, reg + r, warp, lane), coord(&map, 1, reg + r, warp, lane));
                            assert_eq!((rr, cc), (row + 8 * (r / 2), col + r % 2), "{mnk:?} warp {warp} lane {lane} reg {reg} + {r}");
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len() as u32, bm * bn, "every element once");
    }
}

#[test]
fn operands_the_copies_cannot_read_are_written_from_registers() {
    // what cp.async cannot copy in 16-byte chunks is loaded to registers and written to
    // its tile each step: still `mma.sync`; the other operand keeps its ring
    let staged = |e: &EmittedKernel, which: &str| {
        let note = dot_note(e);
        e.source.contains("mma.sync.aligned.m16n8k16") && note.contains(&format!("{which} from shared memory")) && note.contains("written where it is defined") && note.contains("copied by cp.async")
    };
    let k = gemm_kernel(DType::BF16, false, false, false);
    // a row stride that is not a multiple of 16 bytes
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![1, 0] });
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert!(staged(&e, "B"), "{}", e.plan);
    // data not 16-byte aligned
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[0] = Some(TensorSpec { ptr_align: 8, stride_div: vec![16, 0] });
    let e = compile(&k, &s, &Target::sm80()).unwrap();
    assert!(staged(&e, "A"), "{}", e.plan);
    // a K loop starting at 4: the chunks of `a`'s rows would not be 16-byte aligned
    let k4 = gemm_kernel_from(DType::BF16, false, false, false, 4);
    let e = compile(&k4, &spec(&k4, [4096, 4096, 4096]), &Target::sm89()).unwrap();
    assert!(staged(&e, "A"), "{}", e.plan);
    // f32 operands: exact f32 FMAs (gemm_fma.rs)
    let k32 = gemm_kernel(DType::F32, false, false, false);
    let e = compile(&k32, &spec(&k32, [4096, 4096, 4096]), &Target::sm80()).unwrap();
    assert!(e.plan.to_string().contains(": f32 FMAs") && e.source.contains("fmaf(") && !e.source.contains("mma.sync"), "{}", e.ir);
}

#[test]
fn refusals_name_the_reason() {
    // K tiles of 8 elements: mma.sync steps 16 of K at once
    let k = gemm_kernel(DType::BF16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tiles.insert("BK".into(), 8);
    let err = compile(&k, &s, &Target::sm80()).unwrap_err().to_string();
    assert!(err.contains("8") && err.contains("16"), "{err}");
}

//! The FMA path's plan ([`MmaPath::FmaSimt`]): exact f32 fused multiply-adds on the
//! CUDA cores, for every sm_80+ target.
//!
//! Taken by (the fallback list, in `select_mma_path::run`):
//! 1. f32 operands of `dot`, always: no matrix instruction multiplies f32 without
//!    reading the operands as TF32, and `dot` promises exact f32 arithmetic; and those
//!    of `dot_tf32` where the target has no TF32 path (sm_80, sm_89) or TMA cannot
//!    read them — TF32 is a permission, the exact product is within it;
//! 2. f16/bf16 operands of a loop the general lowering does not take (operand tensors
//!    of more than five dimensions)
//!    that the target's matrix path cannot read — a tensor TMA or `cp.async` cannot
//!    copy (no unit-stride dimension, a stride or the data pointer not a multiple of 16
//!    bytes). Their elements become f32 as they are loaded. (The general lowering
//!    writes such operands to their tiles from registers each step, on the tensor
//!    cores; `kfuse::ops::gemm` makes aligned copies, and a GPU launch of a user kernel
//!    copies its read-only operands so, `kfuse_runtime::operand_copy`.)
//!
//! The structure of the loop is checked by `run` before either is considered: the same
//! pattern and the same refusals as the matrix paths. Tile-size refusals of the matrix
//! paths (a `BK` override they cannot take, say) stay refusals: the operands are
//! readable, the tiles were asked for.
//!
//! Threads: one per 16 accumulators (`BM·BN/16`, 32 to 256: 256 for the 128x128 and
//! 64x64 tiles `choose_tiles` picks, thread tiles of 8x8 and 4x4), or `Spec::threads`.
//! Warps ([`fma_warps`]) are added to the axis with the most room left, rows first on
//! a tie, so that the block's grid of threads is as square as the tile allows (fewest
//! shared-memory reads per FMA).

use kfuse_ir::{DType, DotPrecision, Kernel, Op, OpId};

use super::{block_plan, contiguous_tile_axis, cp_async_obstacle, heavy_epilogue, operand_load, tma_obstacle};
use crate::analysis::extent_value;
use crate::layout::{fma_accumulator, RegMap};
use crate::target::{Spec, Target};
use crate::CodegenError;
use crate::mma_plan::{Major, MmaOperand, MmaPath, MmaPlan, MmaSchedule};

/// The recognized dot loop, as `run` found it.
pub(super) struct DotLoop {
    pub for_op: OpId,
    pub dot: OpId,
    pub carried: u32,
    pub yield_pos: usize,
    /// The operand loads and whether a `.t()` swaps each one's axes.
    pub a: (OpId, bool),
    pub b: (OpId, bool),
}

/// Default threads for a `[bm, bn]` accumulator: one per 16 elements, 32 to 256.
pub fn fma_threads(bm: u32, bn: u32) -> u32 {
    (bm * bn / 16).max(1).next_power_of_two().clamp(32, 256)
}

/// The warps `[along M, along N]` of `threads` threads sharing a `[bm, bn]` FMA
/// accumulator (see the module docs and [`fma_accumulator`]).
pub fn fma_warps(bm: u32, bn: u32, threads: u32) -> [u32; 2] {
    let spt = [bm.clamp(1, 4), bn.clamp(1, 4)];
    let tc = (bn / spt[1]).clamp(1, 8);
    let tpw = [32 / tc, tc];
    let ext = [bm, bn];
    let mut w = [1u32, 1u32];
    let mut left = (threads / 32).max(1);
    while left > 1 {
        let room = |a: usize, w: &[u32; 2]| ext[a] / (spt[a] * tpw[a] * w[a]);
        if room(0, &w) >= room(1, &w) && room(0, &w) > 1 {
            w[0] *= 2;
        } else if room(1, &w) > 1 {
            w[1] *= 2;
        } else {
            w[0] *= 2; // the tile is covered: replicas along the rows
        }
        left /= 2;
    }
    w
}

/// `__launch_bounds__`'s minimum blocks for the FMA kernel: two blocks a
/// multiprocessor (at 256 threads a cap of 128 registers, which an 8x8 thread tile's
/// main loop fits: 64 accumulators, 16 operand values, the prefetched slab — 122-127
/// registers from ptxas 13.0 on sm_80/89/90a), except when 64 or more accumulators a
/// thread meet a [`heavy_epilogue`]: capped at 128 registers, bias + GELU spilled 280
/// bytes and `beta · c` 632 (128x128 tiles, sm_80); uncapped they take 161-168 and
/// no spills, one block a multiprocessor, as on the mma.sync path.
pub fn fma_min_blocks(threads: u32, accumulators: u32, heavy: bool) -> u32 {
    if threads > 256 || (heavy && accumulators >= 64) {
        1
    } else {
        2
    }
}

/// True when a `dot` of this kernel will take the FMA path (for `choose_tiles`, which
/// runs first and picks this path's tiles then): f32 operands (but those of a
/// `dot_tf32` on sm_90 that TMA can read), or f16/bf16 operands one of which the
/// target's matrix path cannot read, with the tiles chosen so far.
pub fn expected(k: &Kernel, spec: &Spec, target: &Target, dot: OpId) -> bool {
    let dops = k.operands(dot);
    let tf32 = matches!(k.op(dot), Op::Dot { precision: DotPrecision::Tf32 });
    match k.ty(dops[0]).dtype {
        DType::F32 if tf32 && target.sm == 90 => {
            let (Ok((a, _)), Ok((b, _))) = (operand_load(k, dops[0]), operand_load(k, dops[1])) else { return true };
            [a, b].iter().any(|&l| tma_obstacle(k, spec, l).is_some())
        }
        DType::F32 => true,
        // (the general lowering takes the loops whose operands the copies cannot read,
        // staging them from registers; operand tensors of more than five dimensions
        // fall back here)
        DType::F16 | DType::BF16 if super::general_takes(k, spec, target) => false,
        dt @ (DType::F16 | DType::BF16) => {
            let (Ok((a, _)), Ok((b, _))) = (operand_load(k, dops[0]), operand_load(k, dops[1])) else { return false };
            let esz = dt.size_bytes() as u32;
            [a, b].iter().any(|&l| tma_obstacle(k, spec, l).is_some() || (target.sm != 90 && cp_async_obstacle(k, spec, l, esz).is_some()))
        }
        _ => false,
    }
}

/// Records the FMA plan of the dot loop `l`.
pub(super) fn plan(k: &mut Kernel, spec: &Spec, l: &DotLoop) -> Result<(), CodegenError> {
    let dops = k.operands(l.dot);
    let (at, bt) = (k.ty(dops[0]).shape.clone(), k.ty(dops[1]).shape.clone());
    let (bm, bk, bn) = (extent_value(k, at[0]), extent_value(k, at[1]), extent_value(k, bt[1]));
    let threads = match spec.threads {
        Some(t) if t.is_power_of_two() && (32..=1024).contains(&t) => t,
        Some(t) => return Err(CodegenError::Unsupported(format!("threads override {t}: a power of two from 32 to 1024"))),
        None => fma_threads(bm, bn),
    };
    let warps = fma_warps(bm, bn, threads);
    let map = RegMap::of(&kfuse_ir::Layout::Blocked(fma_accumulator(bm, bn, warps))).expect("a blocked layout");
    let thread_tile = [map.axes[0].reps * map.axes[0].spt, map.axes[1].reps * map.axes[1].spt];
    let heavy = heavy_epilogue(k, l.yield_pos);
    // as loaded from its tensor: which axis of the operand (as the dot sees it) has the
    // unit stride; MN when none has
    let major = |load: OpId, transposed: bool, k_axis: usize| match contiguous_tile_axis(k, spec, load) {
        Some(c) if (if transposed { 1 - c } else { c }) == k_axis => Major::K,
        _ => Major::MN,
    };
    let (a_major, b_major) = (major(l.a.0, l.a.1, 1), major(l.b.0, l.b.1, 0));
    k.schedule.num_threads = threads;
    k.schedule.min_blocks = spec.min_blocks.unwrap_or_else(|| fma_min_blocks(threads, thread_tile[0] * thread_tile[1], heavy));
    let (a, b) = (MmaOperand { load: l.a.0, major: a_major, swizzle: 0 }, MmaOperand { load: l.b.0, major: b_major, swizzle: 0 });
    k.schedule.set_mma(Some(MmaPlan { instr: [thread_tile[0], thread_tile[1], 1], warps, stages: 2, ..block_plan(MmaPath::FmaSimt, l, a, b, [bm, bn, bk]) }));
    Ok(())
}

//! The facts the scheduling passes need about a matrix loop whose `dot`s the writer
//! computes with exact f32 fused multiply-adds on the CUDA cores (`cuda/emit/dot.rs`,
//! its FMA rule; every sm_80+ target): which loops take it ([`expected`]), and the
//! threads and warps of its accumulator.
//!
//! Taken by (`select_mma_path::run` lowers these dots where they stand):
//! 1. f32 operands of `dot`, always: no matrix instruction multiplies f32 without
//!    reading the operands as TF32, and `dot` promises exact f32 arithmetic; and those
//!    of `dot_tf32` where the target has no TF32 path (sm_80, sm_89) or TMA cannot
//!    read them — TF32 is a permission, the exact product is within it;
//! 2. f16/bf16 operands of a loop the general lowering does not take (operand tensors
//!    of more than five dimensions): the loop gets this rule's tiles and threads; the
//!    writer stages the operands at each dot.
//!
//! Threads: one per 16 accumulators (`BM·BN/16`, 32 to 256: 256 for the 128x128 and
//! 64x64 tiles `choose_tiles` picks, thread tiles of 8x8 and 4x4), or `Spec::threads`.
//! Warps ([`fma_warps`]) are added to the axis with the most room left, rows first on
//! a tie, so that the block's grid of threads is as square as the tile allows (fewest
//! shared-memory reads per FMA).

use kfuse_ir::{DType, DotPrecision, Kernel, Op, OpId};

use super::{operand_load, tma_obstacle};
use crate::target::{Spec, Target};

/// Default threads for a `[bm, bn]` accumulator: one per 16 elements, 32 to 256.
pub fn fma_threads(bm: u32, bn: u32) -> u32 {
    (bm * bn / 16).max(1).next_power_of_two().clamp(32, 256)
}

/// The warps `[along M, along N]` of `threads` threads sharing a `[bm, bn]` FMA
/// accumulator (see the module docs and [`crate::layout::fma_accumulator`]).
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

/// True when a matrix loop of this kernel takes the FMA tiles (for `choose_tiles`,
/// which runs first and picks them then): f32 operands (but those of a `dot_tf32` on
/// sm_90 that TMA can read), or f16/bf16 operands of a loop the general lowering does
/// not take, with the tiles chosen so far.
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
        // staging them from registers; a loop of operand tensors of more than five
        // dimensions is lowered where it stands, on these tiles)
        DType::F16 | DType::BF16 => !super::general_takes(k, spec, target),
        _ => false,
    }
}

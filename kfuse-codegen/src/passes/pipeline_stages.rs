//! `pipeline_stages`: how many shared-memory stages the pipelined dot loop keeps in
//! flight.
//!
//! One stage holds an A tile `[BM, BK]` and a B tile `[BK, BN]` (several dots in one
//! loop: each distinct A and B tile once). The pass takes as many
//! stages as fit in the target's shared memory (less the epilogue's output tile when it
//! leaves through a TMA store, and a reserve for layout conversions and the barriers), at most [`MAX_STAGES`], at least 2;
//! a kernel of one tile a block (the last tiles of a split wave) puts its epilogue's
//! shared memory over the ring instead ([`epilogue_reuses_ring`]). An output tile that
//! would leave fewer than [`STORE_RING_MIN_STAGES`] stages (128x320: 80 KiB) goes out box
//! by box through two box-sized buffers instead, when that leaves more
//! (`MmaPlan::store_buffers`). The
//! override `KFUSE_TILES=STAGES=n` (or `Config::tile("STAGES", n)`; any n from 2, not
//! only powers of two) reaches it through `Spec::tiles["STAGES"]`. The FMA path
//! (`MmaPath::FmaSimt`) has two stages by design (register prefetch of the next slab);
//! this pass leaves it alone. (Loops the general lowering takes have no plan: their
//! rings' stages are the writer's, `cuda/emit/operand_ring.rs`.)

use kfuse_ir::{Kernel, OpId};

use crate::target::{Spec, Target};
use crate::CodegenError;
use crate::mma_plan::{MmaPath, MmaSchedule};

/// More stages than this buy nothing measurable: the loads are far enough ahead
/// (M127 N4096 K4096, 128x64 tiles on the H100: 8 stages 213 TFLOP/s, 6 stages 201,
/// 4 stages 157).
pub const MAX_STAGES: u32 = 8;

/// Shared memory kept back for the epilogue (static conversion buffers) and alignment.
pub const RESERVE_BYTES: u32 = 8 * 1024;

/// Bytes of the epilogue's output tiles in shared memory (0 without a TMA store): one
/// tile, or one per consumer warpgroup when they work ping-pong, or
/// [`MmaPlan::store_buffers`](crate::mma_plan::MmaPlan::store_buffers) of its TMA boxes.
pub fn store_bytes(k: &Kernel) -> u32 {
    let Some(p) = k.schedule.mma() else { return 0 };
    match &p.store {
        Some(st) => {
            let v = *k.operands(st.load).last().unwrap();
            let esz = k.ty(v).dtype.size_bytes() as u32;
            if p.store_buffers > 0 {
                return p.store_buffers * p.tile[0] * (st.swizzle / esz) * esz;
            }
            let tiles = if p.pingpong { p.consumers } else { 1 };
            tiles * p.tile[0] * p.tile[1] * esz
        }
        None => 0,
    }
}

/// Stages the WGMMA ring needs before an output tile may take shared memory from it: a
/// tile that would leave fewer goes out through two of its boxes instead
/// ([`MmaPlan::store_buffers`](crate::mma_plan::MmaPlan::store_buffers)) when that leaves
/// more (128x320: 2 stages beside the 80 KiB tile, 3 beside two 16 KiB boxes).
pub const STORE_RING_MIN_STAGES: u32 = 3;

/// Bytes of a block's f32 partial accumulator under a cluster split (0 without one);
/// it shares its shared memory with the output tile (only the first block stores).
pub fn partial_bytes(k: &Kernel) -> u32 {
    match k.schedule.mma() {
        Some(p) if p.split_k > 1 => p.tile[0] * p.tile[1] * 4,
        _ => 0,
    }
}

/// Bytes of one pipeline stage: each distinct A tile `[BM, BK]` and B tile `[BK, BN]`
/// of the plan's dots once (one of each for a single dot).
pub fn stage_bytes(k: &Kernel) -> u32 {
    let Some(p) = k.schedule.mma() else { return 0 };
    let esz = k.ty(k.operands(p.dot)[0]).dtype.size_bytes() as u32;
    let dots = p.all_dots();
    let distinct = |f: fn(&crate::mma_plan::MmaDot) -> OpId| dots.iter().map(f).collect::<std::collections::BTreeSet<_>>().len() as u32;
    let (na, nb) = (distinct(|d| d.a.load), distinct(|d| d.b.load));
    (na * p.tile[0] * p.tile[2] + nb * p.tile[2] * p.tile[1]) * esz
}

/// Runs the pass: sets the stage count of the kernel's `MmaPlan`, if it has one (module
/// docs).
pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    // the FMA path keeps two stages, one computed while the next waits in registers
    // (`select_mma_path` records them)
    if k.schedule.mma().is_none_or(|p| p.path == MmaPath::FmaSimt) {
        return Ok(());
    }
    let per = stage_bytes(k);
    // the epilogue's region (output tile, split partial) has its own shared memory — but
    // in a kernel of one tile a block (the last tiles of a split wave), where it reuses
    // the ring once the loop is done, so it needs a ring at least its size
    let aliased = epilogue_reuses_ring(k);
    let fits = |region: u32| target.smem_per_block.saturating_sub(RESERVE_BYTES + region) / per.max(1);
    if let Some(p) = k.schedule.mma().filter(|p| p.store.is_some() && !p.pingpong && !aliased && p.split_k <= 1) {
        let st = p.store.as_ref().unwrap();
        let esz = k.ty(*k.operands(st.load).last().unwrap()).dtype.size_bytes() as u32;
        let boxes = p.tile[1] / (st.swizzle / esz).max(1);
        let whole = store_bytes(k);
        let two = 2 * whole / boxes.max(1);
        if boxes > 2 && fits(whole) < STORE_RING_MIN_STAGES && fits(two) > fits(whole) {
            k.schedule.mma_mut().unwrap().store_buffers = 2;
        }
    }
    let region = store_bytes(k).max(partial_bytes(k));
    let room = target.smem_per_block.saturating_sub(RESERVE_BYTES + if aliased { 0 } else { region });
    let fit = room / per.max(1);
    let want = spec.tiles.get("STAGES").copied().unwrap_or(MAX_STAGES);
    let stages = want.min(fit);
    if aliased && stages >= 2 && stages * per < region {
        return Err(CodegenError::Unsupported(format!("{stages} stages of {per} bytes cannot hold the epilogue's {region} bytes that reuse them")));
    }
    set_stages(k, stages, fit, per, target)
}

/// Whether the epilogue's shared memory (output tile, split partial) reuses the stage
/// ring: in a kernel whose blocks take one tile each ([`crate::target::Walk::LastTiles`]),
/// nothing is loaded into the ring after the loop.
pub fn epilogue_reuses_ring(k: &Kernel) -> bool {
    k.schedule.mma().is_some_and(|p| matches!(p.walk, crate::target::Walk::LastTiles { .. }))
}

/// Records `stages` in the plan, or refuses a loop with room for fewer than two.
fn set_stages(k: &mut Kernel, stages: u32, fit: u32, per: u32, target: &Target) -> Result<(), CodegenError> {
    if stages < 2 {
        return Err(CodegenError::Unsupported(format!(
            "a pipeline stage of {per} bytes leaves room for {fit} stage(s) in {} bytes of shared memory; the dot loop needs two",
            target.smem_per_block
        )));
    }
    if let Some(p) = k.schedule.mma_mut() {
        p.stages = stages;
    }
    Ok(())
}

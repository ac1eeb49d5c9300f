//! `pipeline_stages`: how many shared-memory stages the pipelined dot loop keeps in
//! flight.
//!
//! One stage holds an A tile `[BM, BK]` and a B tile `[BK, BN]`. The pass takes as many
//! stages as fit in the target's shared memory (less the epilogue's output tile when it
//! leaves through a TMA store, and a reserve for layout conversions and the barriers), at most [`MAX_STAGES`], at least 2. The
//! override `KFUSE_STAGES` reaches it through `Spec::tiles["STAGES"]`.

use kfuse_ir::Kernel;

use crate::target::{Spec, Target};
use crate::CodegenError;

/// More stages than this buy nothing measurable: the loads are far enough ahead.
pub const MAX_STAGES: u32 = 6;

/// Shared memory kept back for the epilogue (static conversion buffers) and alignment.
pub const RESERVE_BYTES: u32 = 8 * 1024;

/// Bytes of the epilogue's output tile in shared memory (0 without a TMA store).
pub fn store_bytes(k: &Kernel) -> u32 {
    let Some(p) = &k.schedule.mma else { return 0 };
    match &p.store {
        Some(st) => {
            let v = *k.operands(st.load).last().unwrap();
            p.tile[0] * p.tile[1] * k.ty(v).dtype.size_bytes() as u32
        }
        None => 0,
    }
}

/// Bytes of one pipeline stage.
pub fn stage_bytes(k: &Kernel) -> u32 {
    let Some(p) = &k.schedule.mma else { return 0 };
    let esz = k.ty(k.operands(p.dot)[0]).dtype.size_bytes() as u32;
    (p.tile[0] * p.tile[2] + p.tile[2] * p.tile[1]) * esz
}

pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    if k.schedule.mma.is_none() {
        return Ok(());
    }
    let per = stage_bytes(k);
    let room = target.smem_per_block.saturating_sub(RESERVE_BYTES + store_bytes(k));
    let fit = room / per.max(1);
    let want = spec.tiles.get("STAGES").copied().unwrap_or(MAX_STAGES);
    let stages = want.min(fit);
    if stages < 2 {
        return Err(CodegenError::Unsupported(format!(
            "a pipeline stage of {per} bytes leaves room for {fit} stage(s) in {} bytes of shared memory; the dot loop needs two",
            target.smem_per_block
        )));
    }
    if let Some(p) = k.schedule.mma.as_mut() {
        p.stages = stages;
    }
    Ok(())
}

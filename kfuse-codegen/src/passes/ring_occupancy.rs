//! Asks for two blocks a multiprocessor for kernels whose dots in loops may take
//! `cp.async` rings on sm_90a (`cuda::emit::operand_ring`), with one block as the
//! fallback (`Schedule::register_attempt`); on sm_80 and sm_89, rings with none as the
//! fallback.
//!
//! Such a block's threads both issue the copies of the next steps and wait for the
//! tensor cores: a step's barrier, its copies and row tables take time in which the
//! block's WGMMA instructions do not run. A second block on the multiprocessor runs its
//! instructions then. The writer sizes the rings for the blocks asked for (as many
//! stages as fit, up to four, in two blocks' shared memory), and the runtime gives such
//! a kernel the largest shared-memory carveout. H100, `kfuse::ops::conv2d` (N64 bf16,
//! TFLOP/s, one call): C64 3x3 56×56 with two blocks and two stages 105.2 against 83.7
//! with one block and four; with two blocks and three stages (16 bytes spilled) C128
//! 3x3 28×28 192.5 against 170.7, C256 3x3 14×14 174.8 against 144.3 (NOTES.md c11).
//!
//! The attempts, each taken where the assembler spills the one before: (0) two blocks
//! (`Schedule::min_blocks`: at most 128 registers for 256 threads) with rings as deep as
//! two blocks' shared memory holds, (1) two blocks with two-stage rings (fewer
//! registers), (2) the schedule as `choose_tiles` left it: one block, the deepest ring
//! that fits. (Every layer of the convolution benchmark takes attempt 0 since a gathered
//! tile's index tiles hold one register a thread, `assign_layouts::gather_rows`.)
//!
//! On sm_80 and sm_89 (the `mma.sync` rule's rings, one block as `choose_tiles` left it)
//! there is one further attempt: no rings, every operand staged from registers where its
//! value is defined (attention at D 256 on small tiles spilled 8 bytes with them).
//!
//! The rule: no cluster split and no persistent
//! walk, at most 256 threads a block, no user `min_blocks`, no other register-room
//! attempts, and a `dot` inside a loop. A kernel whose loop the writer
//! warp-specializes instead has launch bounds of its own and ignores the request.

use kfuse_ir::{Kernel, Op};

use crate::target::{Spec, Target};
use crate::CodegenError;

/// Blocks a multiprocessor attempt 0 asks for.
pub const RING_BLOCKS: u32 = 2;

/// Sets `Schedule::register_attempt` and, by attempt, `Schedule::min_blocks` and
/// `Schedule::ring_stages` (see the module docs).
pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    let s = &k.schedule;
    if s.split_blocks > 1 || s.persistent > 0 || s.num_threads > 256 || spec.min_blocks.is_some() || s.register_attempt.1 > 1 {
        return Ok(());
    }
    let mut depth = 0u32;
    let mut dot_in_loop = false;
    for op in k.ops() {
        match k.op(op) {
            Op::For { .. } => depth += 1,
            Op::Yield { .. } => depth = depth.saturating_sub(1),
            Op::Dot { .. } => dot_in_loop |= depth > 0,
            _ => {}
        }
    }
    if !dot_in_loop {
        return Ok(());
    }
    let a = spec.register_attempt;
    if target.sm < 90 {
        // (the `mma.sync` rule's rings: without them where they spill)
        k.schedule.register_attempt = (a, 2);
        if a == 1 {
            k.schedule.ring_stages = 1;
        }
        return Ok(());
    }
    k.schedule.register_attempt = (a, 3);
    if a < 2 {
        k.schedule.min_blocks = RING_BLOCKS;
    }
    if a == 1 {
        k.schedule.ring_stages = 2;
    }
    Ok(())
}

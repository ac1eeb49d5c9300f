//! `order_grid`: decides which `program_id` axis runs along the launch grid's x
//! (`Schedule::grid_x`), and whether program axis 0 is launched from its last program
//! (`Schedule::longest_first`).
//!
//! Longest first: where some loop's end rises with `program_id(0)` and no loop's start
//! rises while its end stays fixed ([`crate::analysis::rises_with_program`]), a later
//! program along axis 0 runs at least as long as an earlier one, and the writer reads
//! that program id as `gridDim − 1 − blockIdx`: the longest programs start first, the
//! shortest fill the last wave (the work a causal flash attention block does grows with
//! its row block). H200, `kfuse::ops::attention` causal, one call, two runs each
//! (TFLOP/s, before → after): S16384 D128 596.5 → 640.8, D64 454.3 → 463.4, D256 587.5 →
//! 671.0; S4096 D128 491.7 → 496.4, D64 354.7 → 355.8, D256 501.9 → 511.8, GQA 512.5 →
//! 515.0 (NOTES.md a30). Non-causal attention, whose blocks do the same work, takes the
//! same order.
//!
//! CUDA launches up to 2^31 - 1 blocks along x but only 65535 along y and z. Program
//! axis `a` is launched along x, y, z in order, so a kernel whose axis 1 or 2 covers a
//! long dimension in small tiles (a transpose of `[2, N]`, `copy2d` of a strided row
//! `[1, N]` with 64-wide tiles: N above 4M, the `[NB, M, N]` kernels with `NB` above
//! 65535) would need more blocks there than a launch allows. When the specialization
//! says an axis other than 0 may need more than 65535 programs and axis 0 cannot, that
//! axis goes along x and axis 0 takes its place; the writer reads each program id from
//! its block index accordingly and the kernel's `grid` lists the axes in launch order.
//! Otherwise nothing changes (`grid_x = 0`): the source of a kernel at ordinary shapes
//! is the same as without this pass.
//!
//! Bounds come from `Spec::shape_pow2` (the shape rounded up to a power of two):
//! `ceil(shape_pow2 / step)` programs at most; 2^31, the cap of `shape_pow2`, stands for
//! any larger shape; a missing entry is taken as small (the runtime always fills it).
//! Where both axis 0 and another may exceed 65535 (a tensor of more than 2^32 tiles),
//! the order stays and the launch refuses the grid with an error that names the limit.
//!
//! Not for kernels that walk or cluster their programs along x (persistent, grouped,
//! thread-block clusters, L2 prefetch of later programs): they read `blockIdx.x` as
//! program axis 0 themselves.

use kfuse_ir::Kernel;

use crate::analysis::extent_value;
use crate::target::Spec;
use crate::CodegenError;

/// Most blocks a launch may have along y and z.
pub const MAX_BLOCKS_YZ: u64 = 65535;

/// Runs the pass: sets `Schedule::grid_x` (module docs); leaves 0 for kernels that walk
/// or cluster their programs along x.
pub fn run(k: &mut Kernel, spec: &Spec) -> Result<(), CodegenError> {
    k.schedule.grid_x = 0;
    k.schedule.longest_first = false;
    let s = &k.schedule;
    let cluster = s.split_blocks;
    if s.persistent > 0 || s.grouped || cluster > 1 || s.l2_prefetch > 0 {
        return Ok(());
    }
    k.schedule.longest_first = longest_last(k);
    if k.grid_rank() < 2 {
        return Ok(());
    }
    let grid = kfuse_ir::grid::derive(k)?;
    let bounds: Vec<u64> = grid
        .axes
        .iter()
        .map(|a| {
            let step = a.step.map_or(1, |e| extent_value(k, e).max(1)) as u64;
            match spec.shape_pow2.get(a.dim.0 as usize).copied() {
                Some(p) if p >= 1 << 31 => u64::MAX,
                p => (p.unwrap_or(1).max(1) as u64).div_ceil(step),
            }
        })
        .collect();
    if bounds.first().is_some_and(|&b| b > MAX_BLOCKS_YZ) {
        return Ok(());
    }
    // the axis with the most programs, of those that may exceed the y/z limit
    let wide = (1..bounds.len()).filter(|&a| bounds[a] > MAX_BLOCKS_YZ).max_by_key(|&a| (bounds[a], std::cmp::Reverse(a)));
    if let Some(a) = wide {
        k.schedule.grid_x = a as u8;
    }
    Ok(())
}

/// Whether a later program along axis 0 runs longer: some loop's end rises with
/// `program_id(0)` (`analysis::rises_with_program`) and no loop's start rises while its
/// end stays (a loop that would shrink). Flash attention's causal rows see more key
/// tiles the later they are; with a window its loops' starts and ends rise together.
fn longest_last(k: &Kernel) -> bool {
    use crate::analysis::{rises_with_program, Trend};
    let mut rises = false;
    for op in k.ops().filter(|&op| matches!(k.op(op), kfuse_ir::Op::For { .. })) {
        let ops = k.operands(op);
        let (lo, hi) = (rises_with_program(k, ops[0], 0), rises_with_program(k, ops[1], 0));
        if lo == Trend::Rises && hi == Trend::Fixed {
            return false;
        }
        rises |= hi == Trend::Rises;
    }
    rises
}

/// The launch-grid dimension (0 = x, 1 = y, 2 = z) of program axis `axis` under
/// `Schedule::grid_x`: that axis and axis 0 trade places.
pub fn block_dim(k: &Kernel, axis: u8) -> usize {
    let x = k.schedule.grid_x;
    if axis == x {
        0
    } else if axis == 0 {
        x as usize
    } else {
        axis as usize
    }
}

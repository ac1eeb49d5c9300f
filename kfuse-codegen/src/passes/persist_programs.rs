//! Decides whether a kernel's blocks walk several programs each, loading the next
//! program's tiles while they work on the current one (`Schedule::persistent`).
//!
//! A block of 1024 threads has a multiprocessor to itself: between its loads and its
//! stores (a row reduction, its barriers, the math) nothing else keeps memory busy, so
//! a row kernel with 16384-element rows in 1024-thread blocks reached only 50–77% of the
//! copy bandwidth on the H100. With one block per multiprocessor walking the programs
//! and the next program's loads issued ahead (the writer's prologue / prefetch / body),
//! the loads of program `i + grid` are in flight during program `i`'s reductions:
//! RMSNorm 96%, LayerNorm 94%, sum 92% (NOTES.md, r7). `choose_tiles` now gives such
//! rows 512-thread blocks (two per multiprocessor, 97–100%), so this applies where a
//! kernel gets 1024-thread blocks anyway (`KFUSE_THREADS=1024`, user schedules).
//!
//! The rule, for kernels without any loop: blocks of 1024 threads (one or two fit
//! on a multiprocessor), programs on grid axis 0 only, and at least one tile load whose
//! position depends on the program id and on no loaded value, at most
//! [`MAX_PREFETCH_PER_THREAD`] elements of them per thread. The grid is then the
//! number of multiprocessors, which the runtime scales by the blocks a multiprocessor
//! holds (`EmittedKernel::grid_dims_resident`): every block is resident, so none of them
//! waits for a second wave.
//!
//! Not for rows split across a thread-block cluster (the writer refuses that): walking
//! programs per cluster, capped by the clusters the device holds (15 of 8 x 1024
//! threads), lost on the H100 to one cluster per program (1024x131072 bf16: RMSNorm
//! 70% -> 58%, sum 54% -> 38% of the copy bandwidth).
//!
//! Invariant: `persistent > 0` only when the writer can find those loads again
//! (`prefetch_loads`).

use kfuse_ir::{AccessDim, Kernel, Op, OpId, ValueId};

use crate::analysis::concrete_shape;
use crate::target::Target;
use crate::CodegenError;

/// Most prefetched elements per thread (at 1024 threads, 32 elements of a 262144-element
/// row over a cluster of 8 spilled 28-72 bytes with their next-program copy).
pub const MAX_PREFETCH_PER_THREAD: u32 = 16;

/// Runs the pass: sets `Schedule::persistent` for the kernels that qualify (module
/// docs).
pub fn run(k: &mut Kernel, target: &Target) -> Result<(), CodegenError> {
    k.schedule.persistent = 0;
    if k.schedule.grouped {
        // a grouped launch's programs are found through its table, block by block
        return Ok(());
    }
    let only_axis0 = k.ops().all(|op| !matches!(k.op(op), Op::ProgramId { axis } if *axis != 0));
    let uses_pid = k.ops().any(|op| matches!(k.op(op), Op::ProgramId { .. }));
    let loads = prefetch_loads(k);
    // registers per thread the prefetched tiles hold (the next program's copy comes on
    // top of the current one's, so more than 16 elements spill at 1024 threads)
    let per_thread: u32 = loads
        .iter()
        .map(|l| concrete_shape(k, k.ty(l.value())).iter().product::<u32>() / (k.schedule.num_threads.max(1) * k.schedule.split_blocks.max(1)))
        .sum();
    // a loop's loads run once an iteration: the prefetch walks straight-line bodies only
    let loops = k.ops().any(|op| matches!(k.op(op), Op::For { .. }));
    if !loops
        && k.schedule.num_threads == 1024
        && k.schedule.split_blocks <= 1
        && only_axis0
        && uses_pid
        && !loads.is_empty()
        && per_thread <= MAX_PREFETCH_PER_THREAD
        && target.num_sms > 0
    {
        k.schedule.persistent = (target.num_sms / k.schedule.split_blocks.max(1)).max(1);
    }
    Ok(())
}

/// The tile loads a persistent block issues one program ahead: loads of tiles whose
/// offsets depend on a program id and on no other load and no loop's values (an offset
/// computed from a loop's index is not known a program ahead), in program order.
pub fn prefetch_loads(k: &Kernel) -> Vec<OpId> {
    k.ops()
        .filter(|&op| matches!(k.op(op), Op::Load { dims, .. } if !dims.iter().any(AccessDim::is_gather)) && !k.ty(op.value()).is_scalar())
        .filter(|&op| {
            let mut pid = false;
            let mut loaded = false;
            for v in k.operands(op) {
                walk(k, v, &mut pid, &mut loaded);
            }
            pid && !loaded
        })
        .collect()
}

/// Every op a set of ops depends on (themselves included), in program order.
pub fn closure(k: &Kernel, roots: &[OpId]) -> Vec<OpId> {
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<OpId> = roots.to_vec();
    while let Some(op) = stack.pop() {
        if seen.insert(op) {
            stack.extend(k.operands(op).iter().map(|v| v.op()));
        }
    }
    k.ops().filter(|op| seen.contains(op)).collect()
}

fn walk(k: &Kernel, v: ValueId, pid: &mut bool, loaded: &mut bool) {
    match k.op(v.op()) {
        Op::ProgramId { .. } => *pid = true,
        Op::Load { .. } | Op::LoopIndex { .. } | Op::LoopCarried { .. } | Op::LoopResult { .. } => *loaded = true,
        _ => {}
    }
    for u in k.operands(v.op()) {
        walk(k, u, pid, loaded);
    }
}

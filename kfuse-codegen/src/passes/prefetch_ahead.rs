//! `prefetch_ahead`: decides whether a row kernel split across a thread-block cluster asks
//! L2 for the rows a later cluster will read (`Schedule::l2_prefetch`).
//!
//! A cluster row kernel (one row a cluster, the row cut across its blocks) loads its
//! slice of the row, then reduces, exchanges partials through the cluster, and makes a
//! second pass over the registers to write the row back. Only the first phase keeps DRAM
//! busy; with three blocks a multiprocessor and the clusters started in waves, the
//! others leave gaps. Before its own loads, each block now asks L2 for its slice of the
//! row `n` programs ahead with one bulk prefetch (`cp.async.bulk.prefetch.L2`: no
//! registers, nothing to wait for), so the cluster that starts a little later finds its
//! row in L2. NOTES r16: with `n` = multiprocessors / cluster (one
//! block's worth of rows for every multiprocessor, a third of those resident),
//! LayerNorm went from 86 to 92–93% of the copy bandwidth at 256×262144 and from 91 to
//! 97% at 1024×131072; a distance of one wave of resident clusters or more lost (the
//! prefetched lines are evicted before use: softmax 99 → 75%).
//!
//! The rule: a kernel without a matrix loop, not persistent or grouped, split across a
//! cluster on sm_90+, programs on grid axis 0 only, that stores a tile spanning the
//! split extent (a row written back; a reduction-only kernel such as a row sum streams
//! without gaps and lost a point to the extra requests), and has at least one load
//! [`slices`] accepts. Distance: `num_sms / cluster` programs, at least 1.
//!
//! Invariant: `l2_prefetch > 0` only when [`slices`] is non-empty; the writer prefetches
//! exactly those loads.

use kfuse_ir::{AccessDim, Kernel, Op, OpId};

use crate::analysis::extent_value;
use crate::layout::RegMap;
use crate::passes::persist_programs::prefetch_loads;
use crate::target::{Spec, Target};
use crate::CodegenError;

/// Runs the pass: sets `Schedule::l2_prefetch` for the cluster row kernels that qualify
/// (module docs).
pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    k.schedule.l2_prefetch = 0;
    let Some(split) = k.schedule.split else { return Ok(()) };
    let c = k.schedule.split_blocks;
    let only_axis0 = k.ops().all(|op| !matches!(k.op(op), Op::ProgramId { axis } if *axis != 0));
    let writes_rows = k.ops().any(|op| matches!(k.op(op), Op::Store { dims, .. } if dims.contains(&AccessDim::Tile(split))));
    if c > 1
        && target.sm >= 90
        && target.num_sms > 0
        && k.schedule.persistent == 0
        && !k.schedule.grouped
        && only_axis0
        && writes_rows
        && !slices(k, spec).is_empty()
    {
        k.schedule.l2_prefetch = (target.num_sms / c).max(1);
    }
    Ok(())
}

/// The loads whose block slices a cluster kernel can ask L2 for, each with the tile axis
/// split across the cluster: tile loads that depend on the program id and no loaded
/// value (`persist_programs::prefetch_loads`), whose only tile axis of more than one
/// element is the split one, over the tensor's unit-stride dimension, with 16-byte
/// vector accesses and a block piece of whole 16-byte chunks (so each block's slice is
/// one contiguous, 16-byte-aligned range).
pub fn slices(k: &Kernel, spec: &Spec) -> Vec<(OpId, usize)> {
    let Some(split) = k.schedule.split else { return Vec::new() };
    let mut out = Vec::new();
    for op in prefetch_loads(k) {
        let Op::Load { tensor, dims } = k.op(op) else { continue };
        let esz = k.param(*tensor).dtype.size_bytes() as u32;
        let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten().unwrap_or_default();
        let mut axis = None;
        let mut others_one = true;
        let mut t = 0;
        for (d, ad) in dims.iter().enumerate() {
            let AccessDim::Tile(e) = ad else { continue };
            if *e == split && ts.stride_div.get(d) == Some(&0) {
                axis = Some(t);
            } else if extent_value(k, *e) != 1 {
                others_one = false;
            }
            t += 1;
        }
        let Some(axis) = axis else { continue };
        let vec_bytes = k.schedule.vector.get(&op).copied().unwrap_or(1) * esz;
        let piece = k.schedule.layouts.get(&op.value()).and_then(RegMap::of).and_then(|m| m.axes.get(axis).map(|a| (a.ctas, a.piece)));
        if others_one && vec_bytes == 16 && matches!(piece, Some((ctas, p)) if ctas == k.schedule.split_blocks && (p * esz).is_multiple_of(16)) {
            out.push((op, axis));
        }
    }
    out
}

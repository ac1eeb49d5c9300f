//! `vectorize`: the vector width of every load and store.
//!
//! A block access moves `w` consecutive elements per instruction when all of these hold
//! (`w` a power of two, at most 16 bytes):
//! - the value's layout keeps `w` consecutive elements in one thread along the tile
//!   axis over the tensor's unit-stride dimension (its fastest axis);
//! - the data pointer is aligned to `w * size` bytes (`TensorSpec::ptr_align`);
//! - the offset on the unit-stride dimension is divisible by `w`, and for every other
//!   tile or indexed dimension the stride is divisible by `w`.
//!
//! Chunks that hang over the tensor's edge fall back to per-element masked accesses at
//! run time; the width only promises alignment.

use kfuse_ir::{AccessDim, Kernel, Op};

use crate::analysis::divisibility;
use crate::layout::RegMap;
use crate::target::Spec;
use crate::CodegenError;

/// Runs the pass: the vector width of every load and store (module docs).
pub fn run(k: &mut Kernel, spec: &Spec) -> Result<(), CodegenError> {
    for op in k.order.clone() {
        let (tensor, dims, value) = match k.op(op) {
            Op::Load { tensor, dims } => (*tensor, dims.clone(), op.value()),
            // (a masked store writes element by element: its mask is per element)
            Op::Store { .. } if k.store_mask(op).is_some() => continue,
            Op::Store { tensor, dims } => (*tensor, dims.clone(), k.stored_value(op)),
            _ => continue,
        };
        let offs = k.operands(op);
        let dt = k.param(tensor).dtype;
        let mut w = (16 / dt.size_bytes()) as u64;
        let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten().unwrap_or_default();
        // unit-stride dimension and its tile axis
        let unit = ts.stride_div.iter().position(|&s| s == 0);
        // (a gathered dimension is never the vector's)
        let tile_axis = unit.filter(|&d| matches!(dims[d], AccessDim::Tile(_))).and_then(|d| AccessDim::tile_axes(&dims)[d]);
        let width = match (tile_axis, k.schedule.layouts.get(&value).and_then(RegMap::of)) {
            (Some(ax), Some(map)) => {
                let fa = map.fastest_axis();
                if fa != Some(ax) {
                    1
                } else {
                    let am = &map.axes[ax];
                    w = w.min(if am.elem_step == 1 { am.spt as u64 } else { 1 });
                    w = w.min((ts.ptr_align as u64 / dt.size_bytes() as u64).max(1));
                    for (d, _) in dims.iter().enumerate() {
                        if Some(d) == unit {
                            w = w.min(divisibility(k, offs[d]));
                        } else {
                            let sd = ts.stride_div.get(d).copied().unwrap_or(1).max(1) as u64;
                            w = w.min(sd);
                        }
                    }
                    w.max(1)
                }
            }
            _ => 1,
        };
        // vectors are whole 32-bit words (the writer packs 16-bit and 8-bit elements
        // into words): a narrower run of 8-bit elements goes one at a time
        let width = if width > 1 && width * (dt.size_bytes() as u64) < 4 { 1 } else { width };
        k.schedule.vector.insert(op, width as u32);
    }
    Ok(())
}

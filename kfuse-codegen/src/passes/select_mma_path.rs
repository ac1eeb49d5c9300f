//! `select_mma_path`: recognizes a loop that accumulates `dot` of two tile loads and
//! records how the target will run it ([`MmaPlan`] in the schedule).
//!
//! The pattern, whatever the kernel is called:
//! ```text
//! acc = zeros([BM, BN])                      // the loop's carried init
//! for k in lo..hi step s {
//!     a = load A[.., ..]  (or its permute)   // [BM, BK]
//!     b = load B[.., ..]  (or its permute)   // [BK, BN]
//!     acc = acc + dot(a, b)                  // yielded back
//! }
//! ... acc (the loop result) feeds any epilogue ...
//! ```
//! The loop body may also hold scalar index arithmetic. The rows of `a` and the
//! columns of `b` must be addressed by offsets computed before the loop (so the
//! result's valid ranges do not move while it accumulates).
//!
//! Paths, first that applies (the fallback list):
//! 1. [`MmaPath::WgmmaTma`] on sm_90: f16/bf16 operands whose tensors TMA can read
//!    (unit innermost stride, other strides multiples of 16 bytes, 16-byte aligned
//!    data). Each operand is K-major or MN-major as its tensor's unit-stride dimension
//!    says; shared memory is swizzled in 128-byte spans.
//! 2. Otherwise: a clear error naming what is missing (the mma.sync path for sm_80/
//!    sm_89 and an FMA path are not written yet); `kfuse::ops::gemm` makes aligned
//!    copies of operands TMA cannot read.
//!
//! Invariant on success: `schedule.mma` names the `For`, the `Dot`, the carried index
//! and the two operand loads, and `schedule.num_threads` counts the consumer
//! warpgroups' threads (the block has one more warpgroup, the producer).

use kfuse_ir::{AccessDim, BinaryOp, DType, Kernel, Literal, Major, MmaOperand, MmaPath, MmaPlan, Op, OpId, ValueId};

use crate::analysis::extent_value;
use crate::target::{Spec, Target};
use crate::CodegenError;

fn unsupported(m: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported(m.into())
}

/// The `Dot` ops of a kernel, in program order.
pub fn dots(k: &Kernel) -> Vec<OpId> {
    k.ops().filter(|&o| matches!(k.op(o), Op::Dot)).collect()
}

/// An operand of the dot: the load behind it, and whether a permute swaps its axes.
fn operand_load(k: &Kernel, v: ValueId) -> Result<(OpId, bool), CodegenError> {
    match k.op(v.op()) {
        Op::Load { .. } => Ok((v.op(), false)),
        Op::Permute { perm } if perm == &[1, 0] => {
            let src = k.operands(v.op())[0];
            match k.op(src.op()) {
                Op::Load { .. } => Ok((src.op(), true)),
                _ => Err(unsupported("an operand of `dot` must be a tile load (or its transpose `.t()`) for the matrix path")),
            }
        }
        _ => Err(unsupported("an operand of `dot` must be a tile load (or its transpose `.t()`) for the matrix path")),
    }
}

/// True when `v` is a literal zero, or a broadcast of one.
fn is_zeros(k: &Kernel, v: ValueId) -> bool {
    match k.op(v.op()) {
        Op::Const { value } => matches!(value, Literal::Float(f) if *f == 0.0) || matches!(value, Literal::Int(0)),
        Op::Broadcast => is_zeros(k, k.operands(v.op())[0]),
        _ => false,
    }
}

/// Which tile axis of the loaded tile lies along the tensor's unit-stride dimension.
fn contiguous_tile_axis(k: &Kernel, spec: &Spec, load: OpId) -> Option<usize> {
    let Op::Load { tensor, dims } = k.op(load) else { return None };
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten()?;
    let unit = ts.stride_div.iter().position(|&s| s == 0)?;
    let mut t = 0usize;
    for (d, ad) in dims.iter().enumerate() {
        if let AccessDim::Tile(_) = ad {
            if d == unit {
                return Some(t);
            }
            t += 1;
        }
    }
    None
}

/// The tensor dimensions of a load's tensor in the order TMA sees them, innermost
/// first: the unit-stride dimension (the last one if several), then the others from
/// last to first. `None` without a unit-stride dimension.
pub fn tma_order(k: &Kernel, spec: &Spec, load: OpId) -> Option<Vec<u32>> {
    let (Op::Load { tensor, dims } | Op::Store { tensor, dims }) = k.op(load) else { return None };
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten()?;
    let r = dims.len();
    let unit = (0..r).rev().find(|&d| ts.stride_div.get(d) == Some(&0))?;
    let mut order = vec![unit as u32];
    order.extend((0..r).rev().filter(|&d| d != unit).map(|d| d as u32));
    Some(order)
}

/// Why TMA cannot read (or write) this access's tensor, if it cannot.
fn tma_obstacle(k: &Kernel, spec: &Spec, load: OpId) -> Option<String> {
    let (Op::Load { tensor, dims } | Op::Store { tensor, dims }) = k.op(load) else { return Some("not an access".into()) };
    let p = k.param(*tensor);
    let esz = p.dtype.size_bytes() as u32;
    let Some(ts) = spec.tensors.get(tensor.0 as usize).cloned().flatten() else {
        return Some(format!("nothing is known of `{}`'s strides", p.name));
    };
    let Some(order) = tma_order(k, spec, load) else {
        return Some(format!("`{}` has no unit-stride dimension", p.name));
    };
    for &d in &order[1..] {
        // 0 marks a unit stride here too (a second unit-stride dimension): 1 element
        let sd = ts.stride_div.get(d as usize).copied().unwrap_or(1).max(1);
        if sd * esz < 16 {
            return Some(format!("the stride of `{}` along dimension {d} is not a multiple of 16 bytes", p.name));
        }
    }
    if ts.ptr_align < 16 {
        return Some(format!("`{}`'s data is not 16-byte aligned", p.name));
    }
    let _ = dims;
    None
}

pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    let dots = dots(k);
    let Some(&dot) = dots.first() else { return Ok(()) };
    if dots.len() > 1 {
        return Err(unsupported("more than one `dot` in a kernel (one pipelined dot loop per kernel for now)"));
    }
    let nest = k.loop_nest();
    let pos = |o: OpId| k.position(o);
    let Some(lid) = nest[pos(dot)] else {
        return Err(unsupported("a `dot` outside a loop: accumulate it in a `for` loop over K (`acc += dot(..)`)"));
    };
    let info = k.loop_info(lid).ok_or_else(|| unsupported("a loop without its yield"))?;
    // dot → add(carried, dot) → yield
    let users = k.users(dot.value());
    let [add] = users.as_slice() else { return Err(unsupported("the result of `dot` must only be added to the loop's accumulator")) };
    let add = *add;
    if !matches!(k.op(add), Op::Binary(BinaryOp::Add)) {
        return Err(unsupported("the result of `dot` must be added to the loop's accumulator (`acc += dot(..)`)"));
    }
    let add_ops = k.operands(add);
    let other = if add_ops[0] == dot.value() { add_ops[1] } else { add_ops[0] };
    let Op::LoopCarried { id, index } = *k.op(other.op()) else {
        return Err(unsupported("`dot` must be added to a value the loop carries (`acc += dot(..)`)"));
    };
    if id != lid {
        return Err(unsupported("`dot` must accumulate into a value carried by its own loop"));
    }
    let yops = k.operands(info.yield_op);
    if yops.get(index as usize) != Some(&add.value()) || k.users(add.value()).len() != 1 {
        return Err(unsupported("the accumulated `acc + dot(..)` must be what the loop yields, and nothing else may use it"));
    }
    let for_ops = k.operands(info.for_op);
    let init = for_ops[3 + index as usize];
    if !is_zeros(k, init) {
        return Err(unsupported("the accumulator of a dot loop must start as `zeros`"));
    }
    // operands
    let dops = k.operands(dot);
    let (a_load, a_t) = operand_load(k, dops[0])?;
    let (b_load, b_t) = operand_load(k, dops[1])?;
    // the body holds only scalars, the loads, their permutes, the dot and the add
    for &o in &k.order[info.for_pos + 1..info.yield_pos] {
        let ok = match k.op(o) {
            Op::LoopIndex { .. } | Op::Dot => true,
            Op::LoopCarried { index: i, .. } => *i == index,
            Op::Load { .. } => o == a_load || o == b_load,
            Op::Permute { .. } => o == dops[0].op() || o == dops[1].op(),
            Op::Binary(_) if o == add => true,
            _ => k.node(o).ty.as_ref().is_some_and(|t| t.is_scalar()),
        };
        if !ok {
            return Err(unsupported(format!(
                "the loop around `dot` also computes `{}` ({}); the matrix path pipelines a loop of only tile loads, index arithmetic and the dot",
                k.op(o).mnemonic(),
                o.value()
            )));
        }
    }
    for (load, t, what) in [(a_load, a_t, "rows of the first"), (b_load, b_t, "columns of the second")] {
        let Op::Load { dims, .. } = k.op(load) else { unreachable!() };
        let tiles: Vec<usize> = dims.iter().enumerate().filter(|(_, d)| matches!(d, AccessDim::Tile(_))).map(|(i, _)| i).collect();
        if tiles.len() != 2 {
            return Err(unsupported("a `dot` operand must be a 2-D tile load"));
        }
        // tile axis 0 of the operand is M (A) / K (B); the fixed axis is A's 0 and B's 1
        let fixed_axis = if what.starts_with("rows") { 0 } else { 1 };
        let tensor_dim = tiles[if t { 1 - fixed_axis } else { fixed_axis }];
        let off = k.operands(load)[tensor_dim];
        if pos(off.op()) > info.for_pos {
            return Err(unsupported(format!(
                "the {what} operand of `dot` are addressed by an offset computed inside the loop; compute it before the loop"
            )));
        }
    }
    let dtype = k.ty(dops[0]).dtype;
    if target.sm != 90 {
        return Err(CodegenError::Target(
            target.arch(),
            "`dot` loops compile only for sm_90a (TMA + WGMMA) so far; the mma.sync path for sm_80/sm_89 is not written yet".into(),
        ));
    }
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(unsupported(format!("`dot` of {dtype} tiles: the WGMMA path takes f16 and bf16 (an exact f32 path is not written yet)")));
    }
    for l in [a_load, b_load] {
        if let Some(why) = tma_obstacle(k, spec, l) {
            return Err(unsupported(format!("the tensor-memory-accelerator path cannot read this `dot` operand: {why}")));
        }
    }
    // majorness: which axis of the operand (as the dot sees it) is contiguous
    let major = |load: OpId, transposed: bool, k_axis: usize| -> Result<Major, CodegenError> {
        let c = contiguous_tile_axis(k, spec, load).ok_or_else(|| unsupported("a `dot` operand with no unit-stride dimension"))?;
        let c = if transposed { 1 - c } else { c };
        Ok(if c == k_axis { Major::K } else { Major::MN })
    };
    let a_major = major(a_load, a_t, 1)?;
    let b_major = major(b_load, b_t, 0)?;
    let at = &k.ty(dops[0]).shape;
    let bt = &k.ty(dops[1]).shape;
    let (bm, bk, bn) = (extent_value(k, at[0]), extent_value(k, at[1]), extent_value(k, bt[1]));
    let esz = dtype.size_bytes() as u32;
    if bk * esz != 128 {
        return Err(unsupported(format!("BK = {bk}: the WGMMA path takes K tiles of 128 bytes ({} elements)", 128 / esz)));
    }
    if !(bm == 64 || bm == 128) || !(64..=256).contains(&bn) || bn % 64 != 0 {
        return Err(unsupported(format!("a {bm}x{bn} dot tile: the WGMMA path takes BM of 64 or 128 and BN a multiple of 64 up to 256")));
    }
    let consumers = bm / 64;
    // the epilogue store that can go out through shared memory and TMA: the one store
    // after the loop of a 16-bit `[BM, BN]` tile into a 2-D output TMA can write
    let stores: Vec<OpId> = k.order[info.yield_pos + 1..].iter().copied().filter(|&o| matches!(k.op(o), Op::Store { .. })).collect();
    let store = match stores.as_slice() {
        [st] => {
            let Op::Store { tensor, dims } = k.op(*st) else { unreachable!() };
            let v = *k.operands(*st).last().unwrap();
            let ext = |e: &kfuse_ir::Extent| extent_value(k, *e);
            let tile_dims: Vec<u32> = dims.iter().filter_map(|d| if let AccessDim::Tile(e) = d { Some(ext(e)) } else { None }).collect();
            let ok = dims.len() == 2
                && tile_dims == [bm, bn]
                && matches!(k.param(*tensor).dtype, DType::F16 | DType::BF16)
                && k.ty(v).shape.len() == 2
                && tma_order(k, spec, *st).is_some_and(|o| o[0] == 1)
                && tma_obstacle(k, spec, *st).is_none();
            ok.then_some(MmaOperand { load: *st, major: Major::MN, swizzle: 128 })
        }
        _ => None,
    };
    k.schedule.num_threads = 128 * consumers;
    k.schedule.min_blocks = 1;
    k.schedule.mma = Some(MmaPlan {
        path: MmaPath::WgmmaTma,
        for_op: info.for_op,
        dot,
        carried: index,
        a: MmaOperand { load: a_load, major: a_major, swizzle: 128 },
        b: MmaOperand { load: b_load, major: b_major, swizzle: 128 },
        tile: [bm, bn, bk],
        instr: [64, bn, 16],
        consumers,
        stages: 0,
        group_m: 8,
        store,
    });
    Ok(())
}

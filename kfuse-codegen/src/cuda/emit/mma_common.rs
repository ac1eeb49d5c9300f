//! What the dot-loop writers (`wgmma.rs`, `mma_sm80.rs`, `dot_fma.rs`) need of a pipelined dot
//! loop's operands: which tensor dimension feeds which tile axis, the valid range of
//! the accumulator along it, and the scalar index arithmetic that addresses the loads.

use super::*;

/// The tensor dimensions of a load's tile axes, in tile-axis order.
pub(super) fn tile_dims(k: &Kernel, load: OpId) -> Vec<usize> {
    let Op::Load { dims, .. } = k.op(load) else { return vec![] };
    dims.iter().enumerate().filter(|(_, d)| matches!(d, AccessDim::Tile(_))).map(|(i, _)| i).collect()
}

/// The tensor dimension of `load` behind tile axis `axis` of the dot operand `v` (which
/// is the load or its transpose).
pub(super) fn tensor_dim_of(k: &Kernel, v: ValueId, load: OpId, axis: usize) -> usize {
    let axis = if v.op() == load { axis } else { 1 - axis };
    tile_dims(k, load).get(axis).copied().unwrap_or(0)
}

/// The valid range (C expressions `lo`, `hi`) along the tile axis of a load that tensor
/// dimension `d` feeds: the lanes inside the tensor, as the interpreter defines them.
pub(super) fn range_of(e: &mut Emitter, load: OpId, d: usize, ext: u32) -> Result<(String, String), CodegenError> {
    let k = e.k;
    let Op::Load { tensor, .. } = k.op(load) else { unreachable!() };
    let off_v = k.operands(load)[d];
    let off = e.val(off_v).name.clone();
    let n = e.shape_var(k.tensor_dims(*tensor)[d]);
    let lo = if non_negative(k, off_v) {
        "0".to_string()
    } else {
        let v = e.fresh("kf_b");
        e.line(format!("const long long {v} = kf_mini(kf_maxi(-{off}, 0LL), {ext}LL);"))?;
        v
    };
    let hi = e.fresh("kf_b");
    e.line(format!("const long long {hi} = kf_maxi(0LL, kf_mini({n} - {off}, {ext}LL));"))?;
    Ok((lo, hi))
}

/// The scalar ops at or after program position `from` (in program order, loop indices
/// left out: the writer names them) that the values `roots` depend on; an offset
/// computed from a tile value is refused.
pub(super) fn scalar_slice(k: &Kernel, roots: &[ValueId], from: usize) -> Result<Vec<OpId>, CodegenError> {
    let mut seen = std::collections::BTreeSet::new();
    let mut stack: Vec<ValueId> = roots.to_vec();
    while let Some(v) = stack.pop() {
        if k.position(v.op()) < from || !seen.insert(v.op()) {
            continue;
        }
        match k.op(v.op()) {
            Op::LoopIndex { .. } => continue,
            _ if !k.ty(v).is_scalar() => {
                return Err(CodegenError::Unsupported("a block offset of a `dot` operand computed from a tile value".into()));
            }
            _ => stack.extend(k.operands(v.op())),
        }
    }
    Ok(k.ops().filter(|o| seen.contains(o) && !matches!(k.op(*o), Op::LoopIndex { .. })).collect())
}

/// The ops behind the dot loop's zero init that nothing else uses (a broadcast of a
/// literal): the writers zero the accumulator registers instead of materializing them.
pub(super) fn init_only_ops(k: &Kernel, init: ValueId) -> Vec<OpId> {
    let mut v = vec![];
    let mut x = init;
    while k.users(x).len() == 1 && !k.ty(x).is_scalar() {
        v.push(x.op());
        match k.op(x.op()) {
            Op::Broadcast => x = k.operands(x.op())[0],
            _ => break,
        }
    }
    v
}

/// True when an `i64` scalar is provably ≥ 0, seeing through loop indices: a dot
/// loop's step is positive (the writers trap otherwise), so its index is at least its
/// start.
pub(super) fn non_negative_in_loop(k: &Kernel, v: ValueId) -> bool {
    let ops = k.operands(v.op());
    match k.op(v.op()) {
        Op::LoopIndex { id } => k.loop_info(*id).is_some_and(|info| non_negative_in_loop(k, k.operands(info.for_op)[0])),
        Op::Binary(BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max) => non_negative_in_loop(k, ops[0]) && non_negative_in_loop(k, ops[1]),
        _ => non_negative(k, v),
    }
}

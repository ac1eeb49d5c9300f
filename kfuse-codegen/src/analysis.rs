//! Facts about index expressions that the passes and the writer share: concrete
//! shapes, divisibility of offsets (for vector accesses) and non-negativity (to drop
//! lower-bound checks). A loop index is `lo + t · step`: divisible by what divides both,
//! non-negative when `lo` is.

use kfuse_ir::{BinaryOp, Extent, Kernel, Literal, Op, Type, ValueId};

/// The compiled value of a tile extent (after `choose_tiles`).
pub fn extent_value(k: &Kernel, e: Extent) -> u32 {
    match e {
        Extent::Const(c) => c,
        Extent::Tile(t) => k.schedule.tiles.get(&t).copied().unwrap_or(1),
        Extent::Full(s) => k.schedule.full.get(&s).copied().unwrap_or(1),
    }
}

/// The concrete tile shape of a type.
pub fn concrete_shape(k: &Kernel, t: &Type) -> Vec<u32> {
    t.shape.iter().map(|e| extent_value(k, *e)).collect()
}

/// The largest power of two (capped at 2^20) known to divide an `i64` scalar value.
pub fn divisibility(k: &Kernel, v: ValueId) -> u64 {
    const CAP: u64 = 1 << 20;
    let ops = k.operands(v.op());
    match k.op(v.op()) {
        Op::Const { value: Literal::Int(0) } => CAP,
        Op::Const { value: Literal::Int(c) } => (1u64 << c.unsigned_abs().trailing_zeros()).min(CAP),
        Op::TileExtent { extent: e @ (Extent::Const(_) | Extent::Tile(_)) } => {
            let x = extent_value(k, *e) as u64;
            (1u64 << x.trailing_zeros()).min(CAP)
        }
        Op::Binary(BinaryOp::Mul) => (divisibility(k, ops[0]) * divisibility(k, ops[1])).min(CAP),
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) => divisibility(k, ops[0]).min(divisibility(k, ops[1])),
        // `lo + t · step`
        Op::LoopIndex { id } => loop_bounds(k, *id).map_or(1, |b| divisibility(k, b[0]).min(divisibility(k, b[2]))),
        _ => 1,
    }
}

/// The `lo`, `hi` and `step` operands of loop `id`'s `For`.
fn loop_bounds(k: &Kernel, id: kfuse_ir::LoopId) -> Option<[ValueId; 3]> {
    let f = k.loop_info(id)?.for_op;
    let ops = k.operands(f);
    Some([ops[0], ops[1], ops[2]])
}

/// True when an `i64` scalar value is provably 0 (a literal 0, or a product with one).
pub fn is_zero(k: &Kernel, v: ValueId) -> bool {
    let ops = k.operands(v.op());
    match k.op(v.op()) {
        Op::Const { value: Literal::Int(c) } => *c == 0,
        Op::Binary(BinaryOp::Mul) => is_zero(k, ops[0]) || is_zero(k, ops[1]),
        _ => false,
    }
}

/// True when an `i64` scalar value is provably ≥ 0.
pub fn non_negative(k: &Kernel, v: ValueId) -> bool {
    let ops = k.operands(v.op());
    match k.op(v.op()) {
        Op::ProgramId { .. } | Op::ShapeDim { .. } | Op::TileExtent { .. } => true,
        // from `lo` upwards (the step is positive)
        Op::LoopIndex { id } => loop_bounds(k, *id).is_some_and(|b| non_negative(k, b[0])),
        Op::Const { value: Literal::Int(c) } => *c >= 0,
        Op::Binary(BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max) => non_negative(k, ops[0]) && non_negative(k, ops[1]),
        Op::Binary(BinaryOp::Div | BinaryOp::Rem) => non_negative(k, ops[0]) && non_negative(k, ops[1]),
        _ => false,
    }
}

/// The compile-time value of an `i64` scalar: an integer literal, or the extent of a
/// literal or tile-symbol axis (a full extent's value is the tensor's, not known here).
pub fn int_value(k: &Kernel, v: ValueId) -> Option<i64> {
    match k.op(v.op()) {
        Op::Const { value: Literal::Int(c) } => Some(*c),
        Op::TileExtent { extent: e @ (Extent::Const(_) | Extent::Tile(_)) } => Some(extent_value(k, *e) as i64),
        _ => None,
    }
}

/// True when two `i64` scalar values are provably equal at run time: the same value,
/// equal compile-time values ([`int_value`]), program ids of one axis, one shape
/// symbol, or one arithmetic op on operands that are the same in this sense (either
/// order for `+`, `*`, `max`, `min`). Loaded values and loop indices are equal only to
/// themselves.
pub fn same_scalar(k: &Kernel, a: ValueId, b: ValueId) -> bool {
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (int_value(k, a), int_value(k, b)) {
        return x == y;
    }
    let (oa, ob) = (k.operands(a.op()), k.operands(b.op()));
    match (k.op(a.op()), k.op(b.op())) {
        (Op::ProgramId { axis: x }, Op::ProgramId { axis: y }) => x == y,
        (Op::ShapeDim { sym: x }, Op::ShapeDim { sym: y }) => x == y,
        (Op::Binary(x), Op::Binary(y)) if x == y && oa.len() == 2 && ob.len() == 2 => {
            let pairwise = same_scalar(k, oa[0], ob[0]) && same_scalar(k, oa[1], ob[1]);
            let swapped = matches!(x, BinaryOp::Add | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min) && same_scalar(k, oa[0], ob[1]) && same_scalar(k, oa[1], ob[0]);
            pairwise || swapped
        }
        _ => false,
    }
}

/// True when the kernel touches an 8-bit float: a tensor parameter or any value.
pub fn uses_fp8(k: &Kernel) -> bool {
    k.params.iter().any(|p| p.dtype.is_fp8()) || k.ops().any(|o| k.node(o).ty.as_ref().is_some_and(|t| t.dtype.is_fp8()))
}

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

/// True when the kernel touches an 8-bit float: a tensor parameter or any value.
pub fn uses_fp8(k: &Kernel) -> bool {
    k.params.iter().any(|p| p.dtype.is_fp8()) || k.ops().any(|o| k.node(o).ty.as_ref().is_some_and(|t| t.dtype.is_fp8()))
}

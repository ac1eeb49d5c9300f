//! Facts about index expressions that the passes and the writer share: concrete
//! shapes, divisibility of offsets (for vector accesses), non-negativity (to drop
//! lower-bound checks) and loop steps over whole tiles ([`whole_steps`], to drop upper
//! ones). A loop index is `lo + t · step`: divisible by what divides both, non-negative
//! when `lo` is.

use kfuse_ir::{BinaryOp, Extent, Kernel, Literal, Op, Type, ValueId};

/// Whether an index `off` into a tensor dimension of size `dim` is inside it for every
/// program: it is `program_id(a)`, and grid axis `a` launches one program per index of
/// that dimension.
pub fn index_in_grid(k: &Kernel, grid: &[crate::target::GridAxisEval], off: ValueId, dim: kfuse_ir::ShapeSym) -> bool {
    matches!(k.op(off.op()), Op::ProgramId { axis } if grid.get(*axis as usize).is_some_and(|g| g.dim == dim && g.step == 1))
}

/// Whether load `op` gathers its rows (an index tile on a dimension) and no `dot` reads
/// it: a tile computed on in registers (a depthwise convolution's input pixels), not
/// one staged for the tensor cores. `choose_tiles` and `assign_layouts` shape such tiles
/// for whole-line reads.
pub fn gathered_in_registers(k: &Kernel, op: kfuse_ir::OpId) -> bool {
    !k.gathered_offsets(op).is_empty() && !k.users(op.value()).iter().any(|&u| matches!(k.op(u), Op::Dot { .. }))
}

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
        // (`min` and `max` are one of their operands)
        Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Min | BinaryOp::Max) => divisibility(k, ops[0]).min(divisibility(k, ops[1])),
        // `lo + t · step`
        Op::LoopIndex { id } => loop_bounds(k, *id).map_or(1, |b| divisibility(k, b[0]).min(divisibility(k, b[2]))),
        _ => 1,
    }
}

/// True when every tile a loop's steps address along a tensor dimension lies wholly
/// inside it: `off` is the index `j` of a loop that steps by the tile's extent `t` from a
/// multiple of `t`, and each iteration's `j` is below a multiple of `t` that is at most
/// the dimension's extent (shape symbol `sym`), so `j + t ≤ n`. The bounds that show it
/// (`fits_below`): the extent itself where the spec's facts say `t` divides it, `y /
/// c · c` for a non-negative `y ≤ n` and `c` a multiple of `t`, `min` of one such, and
/// `max` of such bounds and the loop's own `lo` (an iteration's `j` is at least `lo`, so
/// below `max(lo, b)` it is below `b`). Flash attention's loop over whole key tiles
/// (`kernels::attention`) drops its per-step range arithmetic by it.
pub fn whole_steps(k: &Kernel, spec: &crate::target::Spec, t: u32, off: ValueId, sym: kfuse_ir::ShapeSym) -> bool {
    let Op::LoopIndex { id } = k.op(off.op()) else { return false };
    let Some([lo, hi, step]) = loop_bounds(k, *id) else { return false };
    let (t64, d) = (t as u64, divisibility(k, lo));
    t > 0 && int_value(k, step) == Some(t as i64) && d >= t64 && d.is_multiple_of(t64) && fits_below(k, spec, t64, lo, hi, sym)
}

/// Whether every `j` with `lo ≤ j < x` is below a multiple of `t` that is at most the
/// extent of shape symbol `sym` (see [`whole_steps`]).
fn fits_below(k: &Kernel, spec: &crate::target::Spec, t: u64, lo: ValueId, x: ValueId, sym: kfuse_ir::ShapeSym) -> bool {
    let ops = k.operands(x.op());
    let is_lo = |v: ValueId| same_scalar(k, v, lo);
    match k.op(x.op()) {
        Op::ShapeDim { sym: s } => *s == sym && spec.divides(sym, t),
        Op::Binary(BinaryOp::Min) => fits_below(k, spec, t, lo, ops[0], sym) || fits_below(k, spec, t, lo, ops[1], sym),
        Op::Binary(BinaryOp::Max) => ops.iter().all(|&o| is_lo(o) || fits_below(k, spec, t, lo, o, sym)),
        Op::Binary(BinaryOp::Mul) => {
            // `y / c · c`, either order
            let rounded = |q: ValueId, c: ValueId| {
                let Op::Binary(BinaryOp::Div) = k.op(q.op()) else { return false };
                let qo = k.operands(q.op());
                let cv = int_value(k, c);
                cv.is_some_and(|c| c > 0 && (c as u64).is_multiple_of(t)) && int_value(k, qo[1]) == cv && non_negative(k, qo[0]) && at_most(k, qo[0], sym)
            };
            rounded(ops[0], ops[1]) || rounded(ops[1], ops[0])
        }
        _ => false,
    }
}

/// Whether a non-negative `i64` value is at most the extent of shape symbol `sym`: the
/// extent, or a `min` with it.
fn at_most(k: &Kernel, v: ValueId, sym: kfuse_ir::ShapeSym) -> bool {
    let ops = k.operands(v.op());
    match k.op(v.op()) {
        Op::ShapeDim { sym: s } => *s == sym,
        Op::Binary(BinaryOp::Min) => at_most(k, ops[0], sym) || at_most(k, ops[1], sym),
        _ => false,
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

/// How an `i64` scalar moves with `program_id(axis)`: not at all, never down (and it
/// reads it), or not known ([`rises_with_program`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trend {
    /// The same for every program along the axis.
    Fixed,
    /// Never lower for a later program, and reads the program id.
    Rises,
    /// Neither shown.
    Unknown,
}

/// The [`Trend`] of `v` with `program_id(axis)`: sums, `min` and `max` of rising and
/// fixed values rise; so do a rising value less a fixed one, times or divided
/// (truncating) by a positive literal. Other values that read a rising or unknown one are
/// unknown.
pub fn rises_with_program(k: &Kernel, v: ValueId, axis: u8) -> Trend {
    trend(k, v, axis, &mut std::collections::BTreeMap::new())
}

fn trend(k: &Kernel, v: ValueId, axis: u8, memo: &mut std::collections::BTreeMap<ValueId, Trend>) -> Trend {
    use Trend::*;
    if let Some(&t) = memo.get(&v) {
        return t;
    }
    let ops = k.operands(v.op());
    let positive = |x: ValueId| int_value(k, x).is_some_and(|c| c > 0);
    let mut t = |x: ValueId| trend(k, x, axis, memo);
    let r = match k.op(v.op()) {
        Op::ProgramId { axis: a } if *a == axis => Rises,
        Op::Binary(BinaryOp::Add | BinaryOp::Min | BinaryOp::Max) => match (t(ops[0]), t(ops[1])) {
            (Unknown, _) | (_, Unknown) => Unknown,
            (Fixed, Fixed) => Fixed,
            _ => Rises,
        },
        Op::Binary(BinaryOp::Sub) => match (t(ops[0]), t(ops[1])) {
            (a, Fixed) => a,
            _ => Unknown,
        },
        Op::Binary(BinaryOp::Mul) if positive(ops[1]) => t(ops[0]),
        Op::Binary(BinaryOp::Mul) if positive(ops[0]) => t(ops[1]),
        Op::Binary(BinaryOp::Div) if positive(ops[1]) => t(ops[0]),
        Op::LoopIndex { .. } => Unknown,
        _ => {
            if ops.iter().all(|&o| t(o) == Fixed) { Fixed } else { Unknown }
        }
    };
    memo.insert(v, r);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use kfuse_ir::{AccessDim, Builder, DType, Extent};

    /// Whether the load in `for j in (lo..hi).step_by(step) { x.block([j], [64]) }` reads
    /// whole tiles, `lo` and `hi` made by `bounds` from `N` (shape symbol 0); the spec's
    /// facts say `div` divides `N`.
    fn whole(step: i64, div: u32, bounds: impl Fn(&mut Builder, ValueId) -> (ValueId, ValueId)) -> bool {
        let mut b = Builder::new("steps");
        let n = b.shape_sym("N");
        let x = b.tensor_param("x", DType::F32, &[n], false);
        let nv = b.shape_dim(n);
        let (lo, hi) = bounds(&mut b, nv);
        let step = b.constant(Literal::Int(step), DType::I64);
        let (id, j, _) = b.begin_for(lo, hi, step, &[]).unwrap();
        b.load(x, &[j], &[AccessDim::Tile(Extent::Const(64))]).unwrap();
        b.end_for(id, &[]).unwrap();
        let spec = crate::target::Spec { shape_div: vec![div], ..Default::default() };
        whole_steps(b.kernel(), &spec, 64, j, n)
    }

    fn int(b: &mut Builder, v: i64) -> ValueId {
        b.constant(Literal::Int(v), DType::I64)
    }

    /// `n / c · c`.
    fn rounded(b: &mut Builder, n: ValueId, c: i64) -> ValueId {
        let c = int(b, c);
        let q = b.binary(BinaryOp::Div, n, c).unwrap();
        b.binary(BinaryOp::Mul, q, c).unwrap()
    }

    #[test]
    fn whole_steps_below_a_rounded_extent() {
        // (0..N / 64 · 64), (0..N / 128 · 128), and `min` with anything
        assert!(whole(64, 1, |b, n| (int(b, 0), rounded(b, n, 64))));
        assert!(whole(64, 1, |b, n| (int(b, 0), rounded(b, n, 128))));
        assert!(whole(64, 1, |b, n| {
            let r = rounded(b, n, 64);
            let c = int(b, 1000);
            (int(b, 0), b.binary(BinaryOp::Min, c, r).unwrap())
        }));
        // from a multiple of 64 (a `max` of them, a rounded value) up to `max(lo, …)`
        assert!(whole(64, 1, |b, n| {
            let r = rounded(b, n, 64);
            let lo = rounded(b, r, 64);
            let hi = b.binary(BinaryOp::Max, lo, r).unwrap();
            (lo, hi)
        }));
        // up to N itself where the facts say 64 divides it
        assert!(whole(64, 128, |b, n| (int(b, 0), n)));
    }

    #[test]
    fn partial_steps_keep_their_bounds() {
        // up to N without the fact, or with a fact too small
        assert!(!whole(64, 1, |b, n| (int(b, 0), n)));
        assert!(!whole(64, 32, |b, n| (int(b, 0), n)));
        // rounded to a multiple of 32 only; past N; from 1; stepping by 32
        assert!(!whole(64, 1, |b, n| (int(b, 0), rounded(b, n, 32))));
        assert!(!whole(64, 1, |b, n| {
            let r = rounded(b, n, 64);
            let c = int(b, 64);
            (int(b, 0), b.binary(BinaryOp::Add, r, c).unwrap())
        }));
        assert!(!whole(64, 1, |b, n| (int(b, 1), rounded(b, n, 64))));
        assert!(!whole(32, 1, |b, n| (int(b, 0), rounded(b, n, 64))));
        // `max` with a value that is not the loop's `lo`
        assert!(!whole(64, 1, |b, n| {
            let r = rounded(b, n, 64);
            let c = int(b, 4096);
            (int(b, 0), b.binary(BinaryOp::Max, c, r).unwrap())
        }));
    }

    #[test]
    fn trends_with_the_program_id() {
        let mut b = Builder::new("trend");
        let n = b.shape_sym("N");
        let nv = b.shape_dim(n);
        let i = b.program_id(0).unwrap();
        let h = b.program_id(1).unwrap();
        let bm = int(&mut b, 128);
        let top = b.binary(BinaryOp::Mul, i, bm).unwrap();
        let end = b.binary(BinaryOp::Add, top, bm).unwrap();
        let hi = b.binary(BinaryOp::Min, nv, end).unwrap(); // min(N, i·128 + 128)
        let lo = b.binary(BinaryOp::Sub, top, nv).unwrap(); // i·128 − N
        let down = b.binary(BinaryOp::Sub, nv, top).unwrap(); // N − i·128
        let neg = int(&mut b, -2);
        let flipped = b.binary(BinaryOp::Mul, i, neg).unwrap();
        let k = b.kernel();
        assert_eq!(rises_with_program(k, hi, 0), Trend::Rises);
        assert_eq!(rises_with_program(k, lo, 0), Trend::Rises);
        assert_eq!(rises_with_program(k, down, 0), Trend::Unknown);
        assert_eq!(rises_with_program(k, flipped, 0), Trend::Unknown);
        assert_eq!(rises_with_program(k, h, 0), Trend::Fixed);
        assert_eq!(rises_with_program(k, hi, 1), Trend::Fixed);
    }
}

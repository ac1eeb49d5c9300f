//! `chunk_rows`: walks a row too long for one block as loops over chunks of the row,
//! where no thread-block cluster can take it (issue 20, item 8).
//!
//! When it applies: `choose_tiles` would cut the row (the widest full extent `N!` of the
//! kernel, [`choose_tiles::row_too_long`]) across a cluster, and the target has none
//! (sm_80, sm_89), or sm_90a's cluster cannot take it either (a row too long for the
//! largest cluster, a grouped launch, or a reduction along the row inside a loop, whose
//! cluster exchange serves one use, not one an iteration). Every other kernel is left
//! exactly as it is.
//!
//! The rule. The values whose type spans the row (`N!` among its extents) are *row
//! values*; a reduction along the row of a row value is a *statistic*. Every row value,
//! statistic and store of a row value must lie directly in one loop body (or all at top
//! level): the *region*. Each row op gets a *pass*: the latest pass of its row operands,
//! and one past the pass of every statistic it needs (directly or through other values);
//! a statistic's pass is its operand's. The region becomes, in order, for each pass `p`:
//! the region's other ops that need only statistics of passes before `p` (in their
//! program order; a loop nested in the region moves whole), then
//!
//! ```text
//!   for c in (0..N).step_by(CH), init [identity of each statistic of pass p] {
//!     the row ops pass p needs, recomputed on the chunk: each load and store of the row
//!       at offset c with extent CH instead of 0 and N!, every N! in a type CH
//!     each statistic of pass p: its chunk's partial combined with the carried value
//!   }
//!   each statistic's value after the loop
//! ```
//!
//! then the ops that need the last pass's statistics. The stores of row values all happen
//! in the last pass (which has every statistic). Combining: `sum` adds partial sums,
//! `max` and `min` take the larger and smaller, `mean` sums and divides by `N` after the
//! loop; floats narrower than f32 accumulate in f32 and are rounded back once, at the
//! end (as the whole-row reduction does). The lanes of the last chunk past the row's
//! end are outside the tensor, so its loads leave them invalid and they take no part,
//! as in any partial tile. So softmax reads its row three times (max; sum of
//! exponentials; write), RMSNorm twice, a row sum once.
//!
//! Refused (the kernel keeps the cluster refusal, with the reason): a row value carried
//! by a loop or used in another loop than the rest, a tile spanning the row twice, a
//! load or store of the row at an offset other than a literal 0 or along a dimension of
//! another size, a statistic of lanes no load bounds (an `iota` or a broadcast along the
//! row: its chunk's lanes past the row's end would count), a tensor the region writes
//! and reads other than by loads of the row before its stores (in place is fine: a pass
//! reads a chunk before the last pass writes it), and a kernel with a `dot`.
//!
//! Chunk: `CH` is the largest power of two that leaves each of [`CHUNK_THREADS`] threads
//! [`ROW_ELEMS_PER_THREAD`] elements of the widest chunk tile (16384 along a row of one
//! row a program; fewer where a tile holds several rows), the shape of the
//! 16384-element rows one block takes at copy bandwidth; `choose_tiles` gives the chunk
//! tiles the row heuristic's threads. Recorded as `Schedule::row_chunks`, which the IR
//! printer shows (`row N of 131072 elements walked in chunks of 16384, 3 passes`).
//!
//! Not done here: the online form (softmax's running maximum with a rescaled sum, one
//! pass fewer), and loads without masks where the row's length is a multiple of `CH`.

use std::collections::{BTreeSet, HashMap, HashSet};

use kfuse_ir::{AccessDim, BinaryOp, DType, Extent, Kernel, Literal, Loc, LoopId, Op, OpId, ParamId, ReduceOp, RowChunks, ShapeSym, Type, ValueId};

use crate::passes::choose_tiles::{self, ROW_ELEMS_PER_THREAD};
use crate::target::{Spec, Target};
use crate::CodegenError;

/// Threads of a chunk's block the chunk size aims at (with [`ROW_ELEMS_PER_THREAD`]
/// elements each: 16384-element chunks of a row a program), unless `Spec::threads` says.
pub const CHUNK_THREADS: u32 = 512;

/// Rewrites `k` where a row too long for one block has no cluster to take it (see the
/// module docs); any other kernel is left unchanged.
pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    if k.ops().any(|o| matches!(k.op(o), Op::Dot { .. })) {
        return Ok(());
    }
    let Some((sym, elems)) = choose_tiles::row_too_long(k, spec, target)? else { return Ok(()) };
    if target.sm >= 90 {
        // a cluster takes the row unless it is refused there too
        let refused = choose_tiles::run(&mut k.clone(), spec, target).is_err() || reduced_in_a_loop(k, sym);
        if !refused {
            return Ok(());
        }
    }
    let chunk = chunk_size(k, spec, sym);
    match rewrite(k, sym, chunk) {
        Ok((chunked, passes)) => {
            *k = chunked;
            k.schedule.row_chunks = Some(RowChunks { sym, row: padded(spec, sym), chunk, passes });
            Ok(())
        }
        // (where the rewrite does not apply, sm_90a's cluster path gives its own refusal)
        Err(_) if target.sm >= 90 => Ok(()),
        Err(NoChunks { why, op }) => Err(CodegenError::Unsupported(format!(
            "a tile of {elems} elements needs a thread-block cluster (sm_90) on this target ({}), and its row cannot be \
             walked in chunks: {why}",
            target.arch()
        ))
        .at(k, op)),
    }
}

/// `k` with the full extent of `sym` walked in chunks of `chunk` elements (see the
/// module docs), and the number of passes over the row; `k` itself is not changed.
/// For any row length and chunk: the interpreter runs the result to the same values
/// (up to the order of float sums). The refusals name the op at fault.
pub fn chunk_kernel(k: &Kernel, sym: ShapeSym, chunk: u32) -> Result<(Kernel, u32), CodegenError> {
    if chunk == 0 {
        return Err(CodegenError::Unsupported("a chunk of 0 elements".into()));
    }
    rewrite(k, sym, chunk).map_err(|NoChunks { why, op }| CodegenError::Unsupported(format!("the row cannot be walked in chunks: {why}")).at(k, op))
}

/// Why a row cannot be walked in chunks, and the op at fault.
struct NoChunks {
    why: String,
    op: Option<OpId>,
}

fn no<T>(why: impl Into<String>, op: OpId) -> Result<T, NoChunks> {
    Err(NoChunks { why: why.into(), op: Some(op) })
}

/// The padded row (the spec's power of two).
fn padded(spec: &Spec, s: ShapeSym) -> u32 {
    spec.shape_pow2.get(s.0 as usize).copied().unwrap_or(1).max(1).next_power_of_two()
}

/// See the module docs: [`ROW_ELEMS_PER_THREAD`] elements a thread of the widest chunk
/// tile, its extents other than the row at their sizes (tile symbols at their override,
/// else 1: `choose_tiles` gives them what the budget leaves).
fn chunk_size(k: &Kernel, spec: &Spec, sym: ShapeSym) -> u32 {
    let budget = ROW_ELEMS_PER_THREAD * spec.threads.unwrap_or(CHUNK_THREADS);
    let mut others = 1u32;
    for op in k.ops() {
        let Some(t) = &k.node(op).ty else { continue };
        if !t.shape.contains(&Extent::Full(sym)) {
            continue;
        }
        let n = t
            .shape
            .iter()
            .map(|&e| match e {
                Extent::Full(s) if s == sym => 1,
                Extent::Full(s) => padded(spec, s),
                Extent::Const(c) => c,
                Extent::Tile(t) => spec.tile(k.tile_name(t)).unwrap_or(1),
            })
            .fold(1u32, |a, b| a.saturating_mul(b.max(1)));
        others = others.max(n);
    }
    let c = (budget / others).max(1);
    (1u32 << (31 - c.leading_zeros())).min(padded(spec, sym))
}

/// Whether a reduction along the row lies in a loop (sm_90a's cluster cannot take it).
fn reduced_in_a_loop(k: &Kernel, sym: ShapeSym) -> bool {
    let nest = k.loop_nest();
    k.order.iter().enumerate().any(|(pos, &op)| {
        nest[pos].is_some() && matches!(k.op(op), Op::Reduce { axis, .. } if k.ty(k.operands(op)[0]).shape.get(*axis as usize) == Some(&Extent::Full(sym)))
    })
}

/// The analysis of the module docs.
struct Plan {
    /// Positions of `order` the region spans (a loop's body, without its `yield`).
    span: (usize, usize),
    /// The pass of each row op (row values, statistics, row stores).
    pass: HashMap<OpId, u32>,
    /// The statistics and the row stores, in program order.
    stats: Vec<OpId>,
    stores: Vec<OpId>,
    /// The stage of every other op of the region: after the loops of passes `< stage`.
    stage: HashMap<OpId, u32>,
    passes: u32,
}

fn spans_row(t: &Type, sym: ShapeSym) -> bool {
    t.shape.contains(&Extent::Full(sym))
}

fn is_row(k: &Kernel, v: ValueId, sym: ShapeSym) -> bool {
    k.node(v.op()).ty.as_ref().is_some_and(|t| spans_row(t, sym))
}

/// A load or store of the row: along a dimension of the row's own size, from offset 0.
fn check_access(k: &Kernel, op: OpId, tensor: ParamId, dims: &[AccessDim], sym: ShapeSym) -> Result<(), NoChunks> {
    let offs = k.operands(op);
    let label = k.op_label(op);
    for (d, ad) in dims.iter().enumerate() {
        if *ad != AccessDim::Tile(Extent::Full(sym)) {
            continue;
        }
        let tdim = k.tensor_dims(tensor)[d];
        if tdim != sym {
            return no(format!("`{label}` spans the row along a dimension of size {}, not {}", k.shape_name(tdim), k.shape_name(sym)), op);
        }
        if !matches!(k.op(offs[d].op()), Op::Const { value: Literal::Int(0) }) {
            return no(format!("`{label}` takes the row from an offset other than a literal 0"), op);
        }
    }
    Ok(())
}

/// Whether the lanes of row value `v` past the row's end are invalid in every chunk:
/// a load of the row bounds them, and an op keeps the bounds of any operand along the
/// row (elementwise ops meet their operands' valid lanes).
fn bounded(k: &Kernel, v: ValueId, sym: ShapeSym, memo: &mut HashMap<ValueId, bool>) -> bool {
    if let Some(&b) = memo.get(&v) {
        return b;
    }
    let ops = k.operands(v.op());
    let b = match k.op(v.op()) {
        Op::Load { .. } => true,
        Op::Unary(_) | Op::Cast { .. } | Op::Convert | Op::ExpandDims { .. } | Op::Permute { .. } | Op::Reduce { .. } | Op::Broadcast => {
            is_row(k, ops[0], sym) && bounded(k, ops[0], sym, memo)
        }
        Op::Binary(_) | Op::Select => ops.iter().any(|&w| is_row(k, w, sym) && bounded(k, w, sym, memo)),
        _ => false,
    };
    memo.insert(v, b);
    b
}

fn plan(k: &Kernel, sym: ShapeSym) -> Result<Plan, NoChunks> {
    let nest = k.loop_nest();
    let mut rows: HashSet<OpId> = HashSet::new();
    let (mut stats, mut stores) = (Vec::new(), Vec::new());
    let mut region: Option<Option<LoopId>> = None;
    let mut memo = HashMap::new();
    for (pos, &op) in k.order.iter().enumerate() {
        let node = k.node(op);
        let label = k.op_label(op);
        if node.ty.as_ref().is_some_and(|t| t.shape.iter().filter(|&&e| e == Extent::Full(sym)).count() > 1) {
            return no(format!("`{label}` spans the row on two axes"), op);
        }
        let operands = k.operands(op);
        let row_result = node.ty.as_ref().is_some_and(|t| spans_row(t, sym));
        if !row_result && !operands.iter().any(|&v| is_row(k, v, sym)) {
            continue;
        }
        if row_result {
            match &node.op {
                Op::Load { tensor, dims } => check_access(k, op, *tensor, dims, sym)?,
                o if lane_wise(o) || matches!(o, Op::Reduce { .. }) => {}
                Op::LoopCarried { .. } | Op::LoopResult { .. } => return no("a loop carries a value that spans the row", op),
                _ => return no(format!("`{label}` gives a value that spans the row"), op),
            }
            rows.insert(op);
        } else {
            match &node.op {
                Op::Reduce { axis, .. } if k.ty(operands[0]).shape.get(*axis as usize) == Some(&Extent::Full(sym)) => {
                    if k.ty(operands[0]).dtype == DType::Bool {
                        return no(format!("`{label}` reduces booleans"), op);
                    }
                    if !bounded(k, operands[0], sym, &mut memo) {
                        return no(
                            format!("`{label}` reduces lanes no load of the row bounds (an iota or a broadcast along the row), which a chunk past the row's end would count"),
                            op,
                        );
                    }
                    stats.push(op);
                }
                Op::Store { tensor, dims } if is_row(k, k.stored_value(op), sym) => {
                    if k.store_mask(op).is_some() {
                        return no("a masked store (`store_where`) of the row", op);
                    }
                    check_access(k, op, *tensor, dims, sym)?;
                    stores.push(op);
                }
                Op::For { .. } | Op::Yield { .. } => return no("a loop carries a value that spans the row", op),
                _ => return no(format!("`{label}` takes a value that spans the row"), op),
            }
        }
        match region {
            None => region = Some(nest[pos]),
            Some(r) if r != nest[pos] => return no("the row's values lie in two loops (or in a loop and outside it)", op),
            Some(_) => {}
        }
    }
    let Some(region) = region else {
        return Err(NoChunks { why: "no value spans the row".into(), op: None });
    };
    if stats.is_empty() && stores.is_empty() {
        return Err(NoChunks { why: "the row's values are neither stored nor reduced".into(), op: None });
    }
    let span = match region {
        None => (0, k.order.len()),
        Some(l) => {
            let (f, y) = k.loop_body(l).expect("verified: a loop has a for and a yield");
            (f + 1, y)
        }
    };
    // a tensor the region writes and reads: only by the row's stores and loads, every
    // load before every store (the loads of a pass run before the stores of the last)
    let body = &k.order[span.0..span.1];
    for (i, &st) in body.iter().enumerate() {
        let Op::Store { tensor, .. } = k.op(st) else { continue };
        for (j, &ld) in body.iter().enumerate() {
            if matches!(k.op(ld), Op::Load { tensor: t, .. } if t == tensor) && (j > i || !rows.contains(&ld) || !stores.contains(&st)) {
                return no(format!("`{}` reads `{}`, which the kernel writes", k.op_label(ld), k.param(*tensor).name), ld);
            }
        }
    }
    // passes and stages
    let stat_set: HashSet<OpId> = stats.iter().copied().collect();
    let store_set: HashSet<OpId> = stores.iter().copied().collect();
    let mut pass: HashMap<OpId, u32> = HashMap::new();
    let mut stage: HashMap<OpId, u32> = HashMap::new();
    let mut unit: HashMap<LoopId, u32> = HashMap::new();
    for pos in span.0..span.1 {
        let op = k.order[pos];
        let mut need = 0;
        for v in k.operands(op) {
            let o = v.op();
            let r = if rows.contains(&o) {
                pass[&o]
            } else if stat_set.contains(&o) {
                pass[&o] + 1
            } else {
                stage.get(&o).copied().unwrap_or(0)
            };
            need = need.max(r);
        }
        if rows.contains(&op) || stat_set.contains(&op) || store_set.contains(&op) {
            pass.insert(op, need);
            continue;
        }
        match *k.op(op) {
            // a loop nested in the region moves whole: its results with it
            Op::LoopResult { id, .. } => need = need.max(unit.get(&id).copied().unwrap_or(0)),
            Op::Yield { id } => {
                let (f, _) = k.loop_body(id).expect("verified");
                let whole = (f..pos).map(|p| stage.get(&k.order[p]).copied().unwrap_or(0)).fold(need, u32::max);
                for p in f..pos {
                    stage.insert(k.order[p], whole);
                }
                unit.insert(id, whole);
                need = whole;
            }
            _ => {}
        }
        stage.insert(op, need);
    }
    let passes = 1 + pass.values().copied().max().unwrap_or(0);
    for s in &stores {
        pass.insert(*s, passes - 1);
    }
    Ok(Plan { span, pass, stats, stores, stage, passes })
}

/// What a statistic accumulates in: f32 for floats (narrower ones rounded back after the
/// loop), `i64` for `i64`.
fn acc_dtype(d: DType) -> DType {
    if d.is_float() {
        DType::F32
    } else {
        d
    }
}

/// The carried value's start and the combining op of a reduction.
fn identity(op: ReduceOp, d: DType) -> (Literal, BinaryOp) {
    let float = d.is_float();
    match op {
        ReduceOp::Sum | ReduceOp::Mean => (if float { Literal::Float(0.0) } else { Literal::Int(0) }, BinaryOp::Add),
        ReduceOp::Max => (if float { Literal::Float(f64::NEG_INFINITY) } else { Literal::Int(i64::MIN) }, BinaryOp::Max),
        ReduceOp::Min => (if float { Literal::Float(f64::INFINITY) } else { Literal::Int(i64::MAX) }, BinaryOp::Min),
    }
}

/// Appends new ops to a kernel, recording them in `out` (the region's new order) with
/// the source location of the op they stand for.
struct Writer {
    n: Kernel,
    out: Vec<OpId>,
    loc: Option<Loc>,
}

impl Writer {
    fn op(&mut self, op: Op, ty: Option<Type>, operands: &[ValueId]) -> ValueId {
        let id = self.n.push(op, ty, operands);
        if let Some(l) = self.loc {
            self.n.locs.insert(id, l);
        }
        self.out.push(id);
        id.value()
    }

    fn value(&mut self, op: Op, ty: Type, operands: &[ValueId]) -> ValueId {
        self.op(op, Some(ty), operands)
    }
}

fn rewrite(k: &Kernel, sym: ShapeSym, chunk: u32) -> Result<(Kernel, u32), NoChunks> {
    let p = plan(k, sym)?;
    let region: Vec<OpId> = k.order[p.span.0..p.span.1].to_vec();
    let first = region.iter().copied().find(|o| p.pass.contains_key(o));
    let cx = Chunks { k, p: &p, region: &region, sym, ch: Extent::Const(chunk) };
    let mut w = Writer { n: k.clone(), out: Vec::new(), loc: None };
    let mut finals: HashMap<OpId, ValueId> = HashMap::new();
    let mut bounds = None;
    for s in 0..=p.passes {
        w.out.extend(region.iter().copied().filter(|o| p.stage.get(o) == Some(&s)));
        if s < p.passes {
            w.loc = first.and_then(|o| k.locs.get(&o).copied());
            let i64t = Type::scalar(DType::I64);
            let b = *bounds.get_or_insert_with(|| {
                [
                    w.value(Op::Const { value: Literal::Int(0) }, i64t.clone(), &[]),
                    w.value(Op::ShapeDim { sym }, i64t.clone(), &[]),
                    w.value(Op::Const { value: Literal::Int(chunk as i64) }, i64t.clone(), &[]),
                ]
            });
            cx.write_pass(&mut w, s, b, &mut finals);
        }
    }
    let n = finish(k, &p, &region, w, &finals)?;
    Ok((n, p.passes))
}

/// What the loops of the passes share: the kernel, its plan, the row and the chunk.
struct Chunks<'a> {
    k: &'a Kernel,
    p: &'a Plan,
    region: &'a [OpId],
    sym: ShapeSym,
    ch: Extent,
}

impl Chunks<'_> {
    /// A type with the chunk for the row.
    fn on_chunk(&self, t: &Type) -> Type {
        Type::tile(t.dtype, t.shape.iter().map(|&e| if e == Extent::Full(self.sym) { self.ch } else { e }).collect())
    }

    /// The type a statistic is carried in: without a kept axis (put back after the loop:
    /// a reduced tile broadcasts back along the row from the layout a reduction leaves),
    /// in its accumulating dtype.
    fn carried_type(&self, st: OpId) -> Type {
        let Op::Reduce { axis, keep_dim, .. } = *self.k.op(st) else { unreachable!("a statistic is a reduction") };
        let t = self.k.ty(st.value());
        let mut shape = t.shape.clone();
        if keep_dim {
            shape.remove(axis as usize);
        }
        Type::tile(acc_dtype(t.dtype), shape)
    }

    /// The row ops pass `s` computes: those its statistics and (in the last pass) the
    /// row stores need.
    fn needed(&self, s: u32, stats: &[OpId]) -> BTreeSet<OpId> {
        let (k, p) = (self.k, self.p);
        let mut needed = BTreeSet::new();
        let mut todo: Vec<OpId> = stats.iter().map(|&st| k.operands(st)[0].op()).collect();
        if s + 1 == p.passes {
            todo.extend(p.stores.iter().copied());
        }
        while let Some(o) = todo.pop() {
            if needed.insert(o) {
                todo.extend(k.operands(o).into_iter().map(|v| v.op()).filter(|x| p.pass.contains_key(x) && !p.stats.contains(x)));
            }
        }
        needed
    }

    /// Loop `s`: the row ops pass `s` needs on chunk `c`, each statistic of the pass
    /// combined into its carried value, and after the loop each statistic's value
    /// (recorded in `finals`, which later passes and the ops kept read).
    fn write_pass(&self, w: &mut Writer, s: u32, [lo, hi, step]: [ValueId; 3], finals: &mut HashMap<OpId, ValueId>) {
        let k = self.k;
        let stats: Vec<OpId> = self.p.stats.iter().copied().filter(|o| self.p.pass[o] == s).collect();
        let carried_ty: Vec<Type> = stats.iter().map(|&st| self.carried_type(st)).collect();
        let mut inits = vec![lo, hi, step];
        for (&st, at) in stats.iter().zip(&carried_ty) {
            let Op::Reduce { op, .. } = *k.op(st) else { unreachable!("a statistic is a reduction") };
            let c = w.value(Op::Const { value: identity(op, at.dtype).0 }, Type::scalar(at.dtype), &[]);
            inits.push(if at.is_scalar() { c } else { w.value(Op::Broadcast, at.clone(), &[c]) });
        }
        let id = w.n.fresh_loop_id();
        w.op(Op::For { id, carried: stats.len() as u32 }, None, &inits);
        let c = w.value(Op::LoopIndex { id }, Type::scalar(DType::I64), &[]);
        let carried: Vec<ValueId> =
            carried_ty.iter().enumerate().map(|(i, t)| w.value(Op::LoopCarried { id, index: i as u32 }, t.clone(), &[])).collect();
        let needed = self.needed(s, &stats);
        let mut map: HashMap<ValueId, ValueId> = HashMap::new();
        for &o in self.region.iter().filter(|o| needed.contains(o)) {
            w.loc = k.locs.get(&o).copied();
            let ops: Vec<ValueId> = k.operands(o).iter().map(|v| map.get(v).or(finals.get(&v.op())).copied().unwrap_or(*v)).collect();
            let new = self.on_chunk_op(w, o, ops, c);
            map.insert(o.value(), new);
            if let Some(name) = k.names.get(&o.value()) {
                w.n.names.insert(new, name.clone());
            }
        }
        // each statistic's partial, combined with its carried value
        let mut next = Vec::new();
        for ((&st, at), &acc) in stats.iter().zip(&carried_ty).zip(&carried) {
            w.loc = k.locs.get(&st).copied();
            let Op::Reduce { op, axis, .. } = *k.op(st) else { unreachable!() };
            let mut x = map[&k.operands(st)[0]];
            if w.n.ty(x).dtype != at.dtype {
                let t = Type::tile(at.dtype, w.n.ty(x).shape.clone());
                x = w.value(Op::Cast { to: at.dtype }, t, &[x]);
            }
            let sum = if op == ReduceOp::Mean { ReduceOp::Sum } else { op };
            let part = w.value(Op::Reduce { op: sum, axis, keep_dim: false }, at.clone(), &[x]);
            next.push(w.value(Op::Binary(identity(op, at.dtype).1), at.clone(), &[acc, part]));
        }
        w.op(Op::Yield { id }, None, &next);
        for (i, (&st, at)) in stats.iter().zip(&carried_ty).enumerate() {
            w.loc = k.locs.get(&st).copied();
            let v = w.value(Op::LoopResult { id, index: i as u32 }, at.clone(), &[]);
            let v = self.statistic(w, st.value(), v, hi);
            finals.insert(st, v);
        }
    }

    /// Row op `o` on the chunk at `c`, its operands `ops` (already the chunk's): a load
    /// or store of the row at offset `c`, an iota of the row shifted by `c`, any other op
    /// as it is, with the chunk for the row in its type.
    fn on_chunk_op(&self, w: &mut Writer, o: OpId, mut ops: Vec<ValueId>, c: ValueId) -> ValueId {
        let k = self.k;
        let ty = k.node(o).ty.as_ref().map(|t| self.on_chunk(t));
        match k.op(o) {
            Op::Load { tensor, dims } | Op::Store { tensor, dims } => {
                let mut nd = dims.clone();
                for (d, ad) in dims.iter().enumerate() {
                    if *ad == AccessDim::Tile(Extent::Full(self.sym)) {
                        nd[d] = AccessDim::Tile(self.ch);
                        ops[d] = c;
                    }
                }
                let op = if matches!(k.op(o), Op::Load { .. }) { Op::Load { tensor: *tensor, dims: nd } } else { Op::Store { tensor: *tensor, dims: nd } };
                w.op(op, ty, &ops)
            }
            Op::Iota { extent: Extent::Full(s) } if *s == self.sym => {
                let t = Type::tile(DType::I64, vec![self.ch]);
                let i = w.value(Op::Iota { extent: self.ch }, t.clone(), &[]);
                let b = w.value(Op::Broadcast, t.clone(), &[c]);
                w.value(Op::Binary(BinaryOp::Add), t, &[i, b])
            }
            op => w.op(op.clone(), ty, &ops),
        }
    }

    /// Statistic `st`'s value from its carried value `v` after the loop: a mean divided
    /// by the row's length `n`, rounded to its dtype, its kept axis put back.
    fn statistic(&self, w: &mut Writer, st: ValueId, v: ValueId, n: ValueId) -> ValueId {
        let k = self.k;
        let Op::Reduce { op, axis, keep_dim } = *k.op(st.op()) else { unreachable!() };
        let at = w.n.ty(v).clone();
        let mut v = v;
        if op == ReduceOp::Mean {
            let i64t = Type::scalar(DType::I64);
            let mut count = if at.dtype.is_float() {
                w.value(Op::Cast { to: at.dtype }, Type::scalar(at.dtype), &[n])
            } else {
                // (an i64 mean of no lane is 0, as the whole row's)
                let one = w.value(Op::Const { value: Literal::Int(1) }, i64t.clone(), &[]);
                w.value(Op::Binary(BinaryOp::Max), i64t, &[n, one])
            };
            if !at.is_scalar() {
                count = w.value(Op::Broadcast, at.clone(), &[count]);
            }
            v = w.value(Op::Binary(BinaryOp::Div), at.clone(), &[v, count]);
        }
        let t = k.ty(st);
        if t.dtype != at.dtype {
            v = w.value(Op::Cast { to: t.dtype }, Type::tile(t.dtype, at.shape.clone()), &[v]);
        }
        if keep_dim {
            v = w.value(Op::ExpandDims { axis }, t.clone(), &[v]);
        }
        if let Some(name) = k.names.get(&st) {
            w.n.names.insert(v, name.clone());
        }
        v
    }
}

/// The rewritten kernel: the region in its new order, the ops kept reading each
/// statistic's value after its loop, the row's old ops gone (and the scalar arithmetic
/// only they used); verified, with the grid of `k`.
fn finish(k: &Kernel, p: &Plan, region: &[OpId], w: Writer, finals: &HashMap<OpId, ValueId>) -> Result<Kernel, NoChunks> {
    let mut n = w.n;
    for &st in &p.stats {
        for u in k.users(st.value()) {
            if !p.pass.contains_key(&u) {
                n.replace_operand(u, st.value(), finals[&st]);
            }
        }
    }
    let mut order: Vec<OpId> = k.order[..p.span.0].to_vec();
    order.extend(w.out.iter().copied());
    order.extend(k.order[p.span.1..].iter().copied());
    n.order = order;
    // in op order: the graph reuses freed slots in the order they were freed, so the ids
    // (and the names the writer gives values) of later passes' new ops depend on it
    // (a hash map's order made two compiles of one kernel differ)
    let mut gone: Vec<OpId> = p.pass.keys().copied().collect();
    gone.sort();
    for o in gone {
        n.remove(o);
    }
    loop {
        let dead: Vec<OpId> = region
            .iter()
            .copied()
            .filter(|&o| n.graph.contains_node(o.0) && pure(n.op(o)) && n.users(o.value()).is_empty())
            .collect();
        if dead.is_empty() {
            break;
        }
        for o in dead {
            n.remove(o);
        }
    }
    kfuse_ir::verify::verify(&n, "chunk_rows").map_err(|e| NoChunks { why: format!("internal error: {e}"), op: None })?;
    let same_grid = match (kfuse_ir::grid::derive(k), kfuse_ir::grid::derive(&n)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same_grid {
        return Err(NoChunks { why: "the stores that set the launch grid would change their order".into(), op: None });
    }
    Ok(n)
}

/// Ops without effects that the rewrite may drop once unused (program ids stay: they
/// set the grid's rank).
fn pure(op: &Op) -> bool {
    lane_wise(op) || matches!(op, Op::Const { .. } | Op::ShapeDim { .. } | Op::TileExtent { .. } | Op::ScalarParam { .. })
}

/// Ops that compute or move a tile's lanes and nothing else (a chunk's as well as a row's).
fn lane_wise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Broadcast
            | Op::ExpandDims { .. }
            | Op::Permute { .. }
            | Op::Convert
            | Op::Iota { .. }
    )
}

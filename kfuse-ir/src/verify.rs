//! The verifier: checks a kernel's invariants. Run after the builder and, in debug and
//! test builds, after every pass (`kfuse-codegen`'s pipeline calls [`verify`]).
//!
//! Invariants:
//! 1. `order` lists every node exactly once, and every operand comes before its user.
//! 2. A node has a result type exactly when its op has a result (`Store`, `For` and
//!    `Yield` have none), and operand edges are numbered 0..n without gaps or repeats.
//! 3. Operands obey the op's rule (see [`crate::kernel::Op`]): offsets are `i64`
//!    scalars, one per tensor dimension; elementwise operands share shape and dtype;
//!    comparisons give `bool`; a `Broadcast` only adds leading axes or widens extent-1
//!    axes; `Permute` is a permutation; `Convert` keeps the type; `Dot` takes rank-2
//!    tiles `[M, K]`, `[K, N]` of one float dtype (f32 for `DotPrecision::Tf32`) and
//!    gives `f32 [M, N]`.
//! 4. Parameters, shape symbols and tile symbols referenced by ops exist; loads read
//!    tensors, stores write output tensors, `ScalarParam` reads a scalar.
//! 5. Loops (see [`crate::kernel`] on their representation):
//!    - every `For` has a `Yield` of the same [`LoopId`] later in `order`, and `For`s and
//!      `Yield`s nest like brackets (a `Yield` closes the innermost open loop); each
//!      `LoopId` has exactly one `For` and one `Yield`;
//!    - a `For` has `lo`, `hi`, `step` (`i64` scalars) and then its `carried` inits as
//!      operands; a `Yield` has one operand per carried value;
//!    - `LoopIndex` (an `i64` scalar) and `LoopCarried` lie directly in their own loop's
//!      body (not in a loop nested in it); a `LoopResult` lies after its loop's `Yield`,
//!      directly in the loop that holds the `For` (or at top level with it);
//!    - at most one `LoopIndex` per loop, one `LoopCarried` and one `LoopResult` per
//!      carried value (a pass may drop unused ones); their `index` is below `carried`;
//!    - the types of init `i`, `LoopCarried` `i`, yielded value `i` and `LoopResult` `i`
//!      are equal;
//!    - scoping: an operand defined in the body of a loop is used only inside that body
//!      (its `Yield` and nested loops included).
//! 6. Once scheduled (`schedule.num_threads > 0`): every tile symbol has a power-of-two
//!    value (but the `N` tile of a `dot`'s B operand, which may be a multiple of 64:
//!    320, two instructions a K step), every
//!    `Full` shape symbol a power-of-two padded extent, and once layouts
//!    are assigned, every value of rank ≥ 1 has one (and none is `Uniform`).

use std::collections::{HashMap, HashSet};

use crate::dtype::DType;
use crate::error::{IrError, Result};
use crate::kernel::*;
use crate::schedule::Layout;

/// Checks every invariant listed in the module docs; `pass` names the pass that just ran.
///
/// # Examples
///
/// A graph edited by hand that loses an operand no longer verifies:
///
/// ```
/// use kfuse_ir::{AccessDim, Builder, DType};
///
/// let mut b = Builder::new("k");
/// let n = b.shape_sym("N");
/// let out = b.tensor_param("out", DType::F32, &[n], true);
/// let i = b.constant(kfuse_ir::Literal::Int(0), DType::I64);
/// let one = b.constant(kfuse_ir::Literal::Float(1.0), DType::F32);
/// b.store(out, &[i], &[AccessDim::Index], one)?;
/// let mut k = b.finish()?;
/// kfuse_ir::verify::verify(&k, "my_pass")?;
/// k.remove(one.op()); // the store's value is gone
/// let e = kfuse_ir::verify::verify(&k, "my_pass").unwrap_err();
/// assert!(e.to_string().contains("after `my_pass`"));
/// # Ok::<(), kfuse_ir::IrError>(())
/// ```
pub fn verify(k: &Kernel, pass: &str) -> Result<()> {
    let fail = |msg: String| IrError::Verify { pass: pass.to_string(), msg };
    // 1. order
    let mut seen = HashSet::new();
    for &op in &k.order {
        if !k.graph.contains_node(op.0) {
            return Err(fail(format!("order names a removed node {}", op.index())));
        }
        if !seen.insert(op) {
            return Err(fail(format!("node {} appears twice in order", op.index())));
        }
        for v in k.operands(op) {
            if !seen.contains(&v.op()) {
                return Err(fail(format!("operand {v} of {} ({}) is not defined before its use", op.value(), k.op(op).mnemonic())));
            }
        }
    }
    if seen.len() != k.graph.node_count() {
        return Err(fail(format!("order lists {} of {} nodes", seen.len(), k.graph.node_count())));
    }
    for &op in &k.order {
        check_op(k, op).map_err(|m| fail(format!("{} = {}: {m}", op.value(), k.op(op).mnemonic())))?;
    }
    check_loops(k).map_err(fail)?;
    if k.schedule.is_scheduled() {
        check_schedule(k).map_err(fail)?;
    }
    Ok(())
}

fn check_extent(k: &Kernel, e: Extent) -> Result<(), String> {
    match e {
        Extent::Const(0) => Err("zero extent".into()),
        Extent::Const(_) => Ok(()),
        Extent::Tile(t) if (t.0 as usize) < k.tile_syms.len() => Ok(()),
        Extent::Full(s) if (s.0 as usize) < k.shape_syms.len() => Ok(()),
        _ => Err(format!("unknown symbol in extent {e:?}")),
    }
}

fn check_op(k: &Kernel, op: OpId) -> Result<(), String> {
    let node = k.node(op);
    if node.op.has_result() != node.ty.is_some() {
        return Err("result type present exactly when the op has a result".into());
    }
    // edge numbering
    let mut idx: Vec<u8> = k
        .graph
        .edges_directed(op.0, petgraph::Direction::Incoming)
        .map(|e| *e.weight())
        .collect();
    idx.sort();
    if idx.iter().enumerate().any(|(i, &w)| i != w as usize) {
        return Err(format!("operand edges are numbered {idx:?}"));
    }
    let ops = k.operands(op);
    for &v in &ops {
        if k.node(v.op()).ty.is_none() {
            return Err(format!("operand {v} has no result"));
        }
    }
    let ty = node.ty.clone();
    if let Some(t) = &ty {
        for e in &t.shape {
            check_extent(k, *e)?;
        }
    }
    let arity = |n: usize| if ops.len() == n { Ok(()) } else { Err(format!("expects {n} operands, has {}", ops.len())) };
    let scalar_i64 = |t: &Type| t.is_scalar() && t.dtype == DType::I64;
    match &node.op {
        Op::ProgramId { axis } => {
            arity(0)?;
            if *axis > 2 || !scalar_i64(ty.as_ref().unwrap()) {
                return Err("program_id is an i64 scalar on axis 0..3".into());
            }
        }
        Op::ScalarParam { param } => {
            arity(0)?;
            let p = k.params.get(param.0 as usize).ok_or("unknown parameter")?;
            if p.is_tensor() || ty.as_ref().unwrap() != &Type::scalar(p.dtype) {
                return Err("reads a scalar parameter with its dtype".into());
            }
        }
        Op::ShapeDim { sym } => {
            arity(0)?;
            if sym.0 as usize >= k.shape_syms.len() || !scalar_i64(ty.as_ref().unwrap()) {
                return Err("an i64 scalar of a known shape symbol".into());
            }
        }
        Op::TileExtent { extent } => {
            arity(0)?;
            check_extent(k, *extent)?;
            if !scalar_i64(ty.as_ref().unwrap()) {
                return Err("an i64 scalar".into());
            }
        }
        Op::Const { value } => {
            arity(0)?;
            let t = ty.as_ref().unwrap();
            let ok = match value {
                Literal::Float(_) => t.dtype.is_float(),
                Literal::Int(_) => t.dtype == DType::I64,
                Literal::Bool(_) => t.dtype == DType::Bool,
            };
            if !t.is_scalar() || !ok {
                return Err(format!("literal {value:?} typed {}", t.dtype));
            }
        }
        Op::Load { tensor, dims } | Op::Store { tensor, dims } => {
            let is_store = matches!(node.op, Op::Store { .. });
            let p = k.params.get(tensor.0 as usize).ok_or("unknown parameter")?;
            let rank = p.dims().len();
            if !p.is_tensor() || dims.len() != rank {
                return Err("accesses a tensor, one access dim per tensor dim".into());
            }
            if is_store && !p.is_output() {
                return Err("stores to an input tensor".into());
            }
            // a store's operands: the offsets, the value, and an optional bool mask
            let masked = is_store && ops.len() == rank + 2;
            if masked {
                let (m, v) = (k.ty(ops[rank + 1]), k.ty(ops[rank]));
                if m.dtype != DType::Bool || m.shape != v.shape {
                    return Err(format!("a store's mask must be a bool tile of the value's shape, got {m:?}"));
                }
            } else {
                arity(rank + is_store as usize)?;
            }
            let shape = AccessDim::tile_shape(dims);
            for (d, &o) in ops[..rank].iter().enumerate() {
                let t = k.ty(o);
                let ok = match dims[d] {
                    AccessDim::Gather(_) => t.dtype == DType::I64 && t.shape == shape,
                    _ => scalar_i64(t),
                };
                if !ok {
                    return Err(format!("offsets must be i64 scalars (on a gathered dimension an i64 tile of the block's shape); offset {d} is {t:?}"));
                }
            }
            let gathers: Vec<Extent> = dims.iter().filter_map(|d| if let AccessDim::Gather(e) = d { Some(*e) } else { None }).collect();
            if gathers.windows(2).any(|w| w[0] != w[1]) {
                return Err("the gathered dimensions of an access must share one extent".into());
            }
            for e in &shape {
                check_extent(k, *e)?;
            }
            let want = Type::tile(p.dtype, shape);
            let got = if is_store { k.ty(ops[rank]).clone() } else { ty.unwrap() };
            if got != want {
                return Err(format!("value type {got:?} does not match the block {want:?}"));
            }
        }
        Op::Unary(u) => {
            arity(1)?;
            if k.ty(ops[0]) != ty.as_ref().unwrap() {
                return Err("unary keeps the type".into());
            }
            let d = k.ty(ops[0]).dtype;
            let ok = match u {
                UnaryOp::Not => d == DType::Bool,
                UnaryOp::Neg | UnaryOp::Abs => d != DType::Bool,
                _ => d.is_float(),
            };
            if !ok {
                return Err(format!("{u:?} on {d}"));
            }
        }
        Op::Binary(b) => {
            arity(2)?;
            let (ta, tb) = (k.ty(ops[0]), k.ty(ops[1]));
            if ta != tb {
                return Err(format!("operands differ: {ta:?} vs {tb:?}"));
            }
            let want = if b.is_comparison() { Type::tile(DType::Bool, ta.shape.clone()) } else { ta.clone() };
            if ty.as_ref().unwrap() != &want {
                return Err("result type".into());
            }
        }
        Op::Select => {
            arity(3)?;
            let (tc, ta, tb) = (k.ty(ops[0]), k.ty(ops[1]), k.ty(ops[2]));
            if tc.dtype != DType::Bool || tc.shape != ta.shape || ta != tb || ty.as_ref().unwrap() != ta {
                return Err("select(bool, T, T) of one shape".into());
            }
        }
        Op::Cast { to } => {
            arity(1)?;
            let t = k.ty(ops[0]);
            if ty.as_ref().unwrap() != &Type::tile(*to, t.shape.clone()) {
                return Err("cast keeps the shape and gives the target dtype".into());
            }
        }
        Op::Reduce { axis, keep_dim, .. } => {
            arity(1)?;
            let t = k.ty(ops[0]);
            if *axis as usize >= t.rank() {
                return Err("axis out of range".into());
            }
            let mut s = t.shape.clone();
            if *keep_dim {
                s[*axis as usize] = Extent::Const(1);
            } else {
                s.remove(*axis as usize);
            }
            if ty.as_ref().unwrap() != &Type::tile(t.dtype, s) {
                return Err("reduce drops (or keeps with extent 1) its axis".into());
            }
        }
        Op::Broadcast => {
            arity(1)?;
            let (t, r) = (k.ty(ops[0]), ty.as_ref().unwrap());
            if t.dtype != r.dtype || t.rank() > r.rank() {
                return Err("broadcast keeps the dtype and does not drop axes".into());
            }
            let off = r.rank() - t.rank();
            for (i, e) in t.shape.iter().enumerate() {
                if *e != r.shape[off + i] && *e != Extent::Const(1) {
                    return Err(format!("operand axis {i} neither equals the result's nor is 1"));
                }
            }
        }
        Op::Permute { perm } => {
            arity(1)?;
            let t = k.ty(ops[0]);
            let mut sorted = perm.clone();
            sorted.sort();
            if sorted != (0..t.rank() as u32).collect::<Vec<_>>() {
                return Err("not a permutation".into());
            }
            let s: Vec<Extent> = perm.iter().map(|&p| t.shape[p as usize]).collect();
            if ty.as_ref().unwrap() != &Type::tile(t.dtype, s) {
                return Err("result shape".into());
            }
        }
        Op::Iota { extent } => {
            arity(0)?;
            check_extent(k, *extent)?;
            if ty.as_ref().unwrap() != &Type::tile(DType::I64, vec![*extent]) {
                return Err("iota is the i64 tile [extent]".into());
            }
        }
        Op::ExpandDims { axis } => {
            arity(1)?;
            let t = k.ty(ops[0]);
            if *axis as usize > t.rank() {
                return Err(format!("axis {axis} out of range 0..={}", t.rank()));
            }
            let mut s = t.shape.clone();
            s.insert(*axis as usize, Extent::Const(1));
            if ty.as_ref().unwrap() != &Type::tile(t.dtype, s) {
                return Err("expand_dims inserts one axis of extent 1 and keeps the dtype".into());
            }
        }
        Op::Convert => {
            arity(1)?;
            if k.ty(ops[0]) != ty.as_ref().unwrap() {
                return Err("convert keeps the type".into());
            }
        }
        Op::For { carried, .. } => {
            arity(3 + *carried as usize)?;
            if !ops[..3].iter().all(|&o| scalar_i64(k.ty(o))) {
                return Err("lo, hi and step must be i64 scalars".into());
            }
        }
        Op::LoopIndex { .. } => {
            arity(0)?;
            if !scalar_i64(ty.as_ref().unwrap()) {
                return Err("the loop index is an i64 scalar".into());
            }
        }
        // operand counts and types against the loop's `For`: `check_loops`
        Op::LoopCarried { .. } | Op::LoopResult { .. } => arity(0)?,
        Op::Yield { .. } => {}
        Op::Dot { precision } => {
            arity(2)?;
            let (ta, tb) = (k.ty(ops[0]), k.ty(ops[1]));
            if *precision == DotPrecision::Tf32 && ta.dtype != DType::F32 {
                return Err(format!("dot_tf32 takes f32 tiles, has {}", ta.dtype));
            }
            if ta.rank() != 2 || tb.rank() != 2 {
                return Err(format!("dot takes rank-2 tiles, has ranks {} and {}", ta.rank(), tb.rank()));
            }
            if !ta.dtype.is_float() || ta.dtype != tb.dtype {
                return Err(format!("dot takes two tiles of one float dtype, has {} and {}", ta.dtype, tb.dtype));
            }
            if ta.shape[1] != tb.shape[0] {
                return Err(format!("dot: inner extents differ ({:?} vs {:?})", ta.shape[1], tb.shape[0]));
            }
            if ty.as_ref().unwrap() != &Type::tile(DType::F32, vec![ta.shape[0], tb.shape[1]]) {
                return Err("dot gives f32 [M, N]".into());
            }
        }
    }
    Ok(())
}

/// Invariant 5: loop structure, loop value types and scoping.
fn check_loops(k: &Kernel) -> Result<(), String> {
    let name = |op: OpId| format!("{} ({})", op.value(), k.op(op).mnemonic());
    // Nesting: the innermost loop around each position, the parent of each loop.
    let mut stack: Vec<LoopId> = Vec::new();
    let mut parent: HashMap<LoopId, Option<LoopId>> = HashMap::new();
    let mut fors: HashMap<LoopId, OpId> = HashMap::new();
    let mut yields: HashMap<LoopId, usize> = HashMap::new();
    let mut nest: Vec<Option<LoopId>> = Vec::with_capacity(k.order.len());
    for (pos, &op) in k.order.iter().enumerate() {
        match k.op(op) {
            Op::For { id, .. } => {
                if fors.insert(*id, op).is_some() {
                    return Err(format!("loop {id} has two `for` ops"));
                }
                parent.insert(*id, stack.last().copied());
                nest.push(stack.last().copied());
                stack.push(*id);
            }
            Op::Yield { id } => {
                match stack.last() {
                    Some(top) if top == id => {}
                    Some(top) => return Err(format!("{} closes loop {id} while loop {top} is open (loops must nest)", name(op))),
                    None => return Err(format!("{} closes loop {id}, which is not open", name(op))),
                }
                nest.push(Some(*id));
                stack.pop();
                yields.insert(*id, pos);
            }
            _ => nest.push(stack.last().copied()),
        }
    }
    if let Some(id) = stack.last() {
        return Err(format!("loop {id} has no `yield`"));
    }
    let inits = |id: LoopId| k.operands(fors[&id])[3..].to_vec();
    let encloses = |outer: LoopId, mut inner: Option<LoopId>| {
        while let Some(l) = inner {
            if l == outer {
                return true;
            }
            inner = parent[&l];
        }
        false
    };
    let at: HashMap<OpId, usize> = k.order.iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut seen: HashSet<(LoopId, u8, u32)> = HashSet::new();
    for (pos, &op) in k.order.iter().enumerate() {
        let node = k.node(op);
        // Loop ops: their loop exists, where they lie, their types.
        let lookup = |id: LoopId| -> Result<u32, String> {
            match fors.get(&id).map(|&f| k.op(f)) {
                Some(Op::For { carried, .. }) => Ok(*carried),
                _ => Err(format!("{} names loop {id}, which has no `for`", name(op))),
            }
        };
        let mut once = |id: LoopId, kind: u8, index: u32, what: &str| {
            if seen.insert((id, kind, index)) {
                Ok(())
            } else {
                Err(format!("loop {id} has two {what} ops"))
            }
        };
        match &node.op {
            Op::LoopIndex { id } => {
                lookup(*id)?;
                once(*id, 0, 0, "loop_index")?;
                if nest[pos] != Some(*id) {
                    return Err(format!("{} lies outside the body of loop {id}", name(op)));
                }
            }
            Op::LoopCarried { id, index } | Op::LoopResult { id, index } => {
                let carried = lookup(*id)?;
                let is_result = matches!(node.op, Op::LoopResult { .. });
                if *index >= carried {
                    return Err(format!("{} takes carried value {index} of loop {id}, which has {carried}", name(op)));
                }
                once(*id, 1 + is_result as u8, *index, if is_result { "loop_result" } else { "loop_carried" })?;
                if is_result {
                    if pos < yields[id] || nest[pos] != parent[id] {
                        return Err(format!("{} must follow the `yield` of loop {id}, in the loop that holds its `for`", name(op)));
                    }
                } else if nest[pos] != Some(*id) {
                    return Err(format!("{} lies outside the body of loop {id}", name(op)));
                }
                let want = k.ty(inits(*id)[*index as usize]);
                if node.ty.as_ref() != Some(want) {
                    return Err(format!("{} has type {:?}, but init {index} of loop {id} has {want:?}", name(op), node.ty));
                }
            }
            Op::Yield { id } => {
                let carried = lookup(*id)?;
                let next = k.operands(op);
                if next.len() != carried as usize {
                    return Err(format!("the `yield` of loop {id} has {} values for {carried} carried", next.len()));
                }
                for (i, (n, init)) in next.iter().zip(inits(*id)).enumerate() {
                    if k.ty(*n) != k.ty(init) {
                        return Err(format!("the `yield` of loop {id} gives {n} of type {:?} for carried value {i} of type {:?}", k.ty(*n), k.ty(init)));
                    }
                }
            }
            _ => {}
        }
        // Scoping: an operand defined in a loop body is used only inside that body.
        for v in k.operands(op) {
            if let Some(l) = nest[at[&v.op()]] {
                if !encloses(l, nest[pos]) {
                    return Err(format!("{v} is defined in the body of loop {l} but used outside it by {}", name(op)));
                }
            }
        }
    }
    Ok(())
}

fn check_schedule(k: &Kernel) -> Result<(), String> {
    let s = &k.schedule;
    // the tile extents that may be other than a power of two, multiples of 64: the `BN`
    // of the first `dot`'s B tile (several instructions a K step), and the rows of any
    // `dot`'s A tile (a warpgroup's 64 rows each)
    let wide = k.order.iter().find(|&&o| matches!(k.op(o), Op::Dot { .. })).and_then(|&d| match k.ty(k.operands(d)[1]).shape.get(1) {
        Some(Extent::Tile(sym)) => Some(*sym),
        _ => None,
    });
    let rows: Vec<TileSym> = k
        .order
        .iter()
        .filter(|&&o| matches!(k.op(o), Op::Dot { .. }))
        .filter_map(|&d| match k.ty(k.operands(d)[0]).shape.first() {
            Some(Extent::Tile(sym)) => Some(*sym),
            _ => None,
        })
        .collect();
    for &op in &k.order {
        let Some(t) = &k.node(op).ty else { continue };
        for e in &t.shape {
            match e {
                Extent::Tile(sym) => match s.tiles.get(sym) {
                    Some(v) if v.is_power_of_two() => {}
                    Some(v) if (Some(*sym) == wide || rows.contains(sym)) && v % 64 == 0 => {}
                    _ => return Err(format!("tile symbol {} has no power-of-two value", k.tile_name(*sym))),
                },
                Extent::Full(sym) => match s.full.get(sym) {
                    Some(v) if v.is_power_of_two() => {}
                    _ => return Err(format!("full extent {} has no power-of-two value", k.shape_name(*sym))),
                },
                Extent::Const(_) => {}
            }
        }
        if t.rank() >= 1 && !s.layouts.is_empty() {
            match s.layouts.get(&op.value()) {
                None => return Err(format!("{} has no layout", op.value())),
                Some(Layout::Uniform) => return Err(format!("{} of rank {} has a uniform layout", op.value(), t.rank())),
                Some(_) => {}
            }
        }
    }
    Ok(())
}

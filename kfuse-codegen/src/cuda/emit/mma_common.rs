//! What the FMA path's writer (`dot_fma.rs`) needs of its dot loop's operands: which tensor dimension feeds which tile axis, the valid range of
//! the accumulator along it, and the scalar index arithmetic that addresses the loads;
//! the accumulators' registers (one array per dot of the loop: `kf_acc`, `kf_acc1`, …).

use super::*;
use kfuse_ir::LoopInfo;
use crate::mma_plan::MmaPlan;

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
    let sym = k.tensor_dims(*tensor)[d];
    let n = e.shape_var(sym);
    let lo = if non_negative(k, off_v) {
        "0".to_string()
    } else {
        let v = e.fresh("kf_b");
        e.line(format!("const long long {v} = kf_mini(kf_maxi(-{off}, 0LL), {ext}LL);"))?;
        v
    };
    let hi = e.fresh("kf_b");
    e.line(format!("const long long {hi} = kf_maxi(0LL, kf_mini({n} - {off}, {ext}LL));"))?;
    e.bounds.insert(hi.clone(), (sym, off_v, ext));
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

/// The tile ops behind the dot loop's zero inits that nothing but the loop's `For`
/// (and each other) uses (a broadcast of a literal): the writers zero the accumulator
/// registers instead of materializing them.
pub(super) fn init_only_ops(k: &Kernel, for_op: OpId, inits: &[ValueId]) -> Vec<OpId> {
    let mut v: Vec<OpId> = vec![];
    for &init in inits {
        let mut x = init;
        while !k.ty(x).is_scalar() && k.users(x).iter().all(|&u| u == for_op || v.contains(&u)) {
            if !v.contains(&x.op()) {
                v.push(x.op());
            }
            match k.op(x.op()) {
                Op::Broadcast => x = k.operands(x.op())[0],
                _ => break,
            }
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

/// The plan's dot loop: a `for` that carries its accumulators alone (one per dot).
pub(super) fn dot_loop(k: &Kernel, plan: &MmaPlan) -> Result<LoopInfo, CodegenError> {
    let unsupported = |m: &str| CodegenError::Unsupported(m.into());
    let Op::For { id, carried } = *k.op(plan.for_op) else { return Err(unsupported("the plan's loop is not a `for`")) };
    if carried as usize != 1 + plan.more.len() {
        return Err(unsupported("a dot loop that carries more than its accumulators"));
    }
    k.loop_info(id).ok_or_else(|| unsupported("a loop without its yield"))
}

/// The dot loop's result (of the plan's first dot) and the register map of its layout.
pub(super) fn accumulator_map(k: &Kernel, info: &LoopInfo) -> Result<(ValueId, RegMap), CodegenError> {
    accumulator_map_of(k, info, 0)
}

/// The loop's result `carried` (the accumulator of one dot) and the register map of its
/// layout.
pub(super) fn accumulator_map_of(k: &Kernel, info: &LoopInfo, carried: u32) -> Result<(ValueId, RegMap), CodegenError> {
    let unsupported = |m: &str| CodegenError::Unsupported(m.into());
    let res = info.results.get(carried as usize).copied().flatten().ok_or_else(|| unsupported("a dot loop whose result is unused"))?;
    let layout = k.schedule.layouts.get(&res).ok_or_else(|| unsupported("the dot loop's result has no layout"))?;
    let map = RegMap::of(layout).ok_or_else(|| unsupported("a uniform accumulator"))?;
    Ok((res, map))
}

/// The valid ranges of a `[BM, BN]` accumulator: `lo` and `hi` (C expressions) per axis.
pub(super) type AccRanges = (Vec<String>, Vec<String>);

/// Writes the ops before the dot loop (program positions below `for_pos`) but those
/// that only feed its zero init, then the accumulator's valid ranges (rows of A,
/// columns of B) and its `regs` f32 registers `kf_acc`, zeroed.
pub(super) fn zeroed_accumulator(e: &mut Emitter, plan: &MmaPlan, for_pos: usize, regs: u32) -> Result<AccRanges, CodegenError> {
    let mut all = zeroed_accumulators(e, plan, for_pos, regs)?;
    Ok(all.remove(0))
}

/// The C name of dot `i`'s accumulator registers (in [`MmaPlan::all_dots`] order):
/// `kf_acc`, `kf_acc1`, `kf_acc2`, …
pub(super) fn accumulator_name(i: usize) -> String {
    if i == 0 {
        "kf_acc".into()
    } else {
        format!("kf_acc{i}")
    }
}

/// [`zeroed_accumulator`] for every dot of the plan: the ops before the loop but those
/// that only feed the zero inits, then per dot its accumulator's valid ranges and its
/// `regs` registers ([`accumulator_name`]), zeroed; the ranges in dot order.
pub(super) fn zeroed_accumulators(e: &mut Emitter, plan: &MmaPlan, for_pos: usize, regs: u32) -> Result<Vec<AccRanges>, CodegenError> {
    let k = e.k;
    let dots = plan.all_dots();
    let inits: Vec<ValueId> = dots.iter().map(|d| k.operands(plan.for_op)[3 + d.carried as usize]).collect();
    let init_only = init_only_ops(k, plan.for_op, &inits);
    for &o in &k.order[..for_pos] {
        if !init_only.contains(&o) {
            e.op(o)?;
        }
    }
    let [bm, bn, _] = plan.tile;
    let mut out = Vec::new();
    for (i, d) in dots.iter().enumerate() {
        let dops = k.operands(d.dot);
        let a_dim = tensor_dim_of(k, dops[0], d.a.load, 0);
        let b_dim = tensor_dim_of(k, dops[1], d.b.load, 1);
        let (rlo, rhi) = range_of(e, d.a.load, a_dim, bm)?;
        let (clo, chi) = range_of(e, d.b.load, b_dim, bn)?;
        let acc = accumulator_name(i);
        e.line(format!("float {acc}[{regs}];"))?;
        e.unroll("i", regs)?;
        e.line(format!("{acc}[i] = 0.0f;"))?;
        e.close()?;
        out.push((vec![rlo, clo], vec![rhi, chi]));
    }
    Ok(out)
}

/// The accumulator registers `kf_acc` as a `[BM, BN]` f32 value of register map `map`.
pub(super) fn accumulator_val(plan: &MmaPlan, map: RegMap, ranges: AccRanges) -> Val {
    accumulator_val_named(plan, "kf_acc", map, ranges)
}

/// Registers `name` as a `[BM, BN]` f32 accumulator value of register map `map`.
pub(super) fn accumulator_val_named(plan: &MmaPlan, name: &str, map: RegMap, (lo, hi): AccRanges) -> Val {
    let [bm, bn, _] = plan.tile;
    Val { name: name.into(), dtype: DType::F32, map: Some(map), axis_map: vec![Some(0), Some(1)], shape: vec![bm, bn], lo, hi, lazy: None }
}

/// The start of a one-tile-per-block dot kernel (the FMA path): a writer
/// whose barrier is `__syncthreads()`, with everything before the loop written but the
/// zeros that only feed its init, the accumulator's `regs` registers zeroed (their valid
/// ranges returned) and the trip count (the loop's start and step returned).
pub(super) fn block_prologue<'a>(
    k: &'a Kernel,
    spec: &'a Spec,
    grid: &[crate::target::GridAxisEval],
    plan: &MmaPlan,
    for_pos: usize,
    regs: u32,
) -> Result<(Emitter<'a>, AccRanges, (String, String)), CodegenError> {
    let mut e = Emitter::new(k, spec, "__syncthreads();", grid);
    e.w.indent();
    let ranges = zeroed_accumulator(&mut e, plan, for_pos, regs)?;
    let bounds = trip_count(&mut e, plan)?;
    Ok((e, ranges, bounds))
}

/// Traps on a non-positive step and writes the dot loop's trip count `kf_n`; gives the
/// C names of the loop's start and step.
pub(super) fn trip_count(e: &mut Emitter, plan: &MmaPlan) -> Result<(String, String), CodegenError> {
    let for_ops = e.k.operands(plan.for_op);
    let (l, h, s) = (e.val(for_ops[0]).name.clone(), e.val(for_ops[1]).name.clone(), e.val(for_ops[2]).name.clone());
    e.line(format!("if (!({s} > 0)) __trap();"))?;
    e.line(format!("const long long kf_n = {h} > {l} ? ({h} - {l} + {s} - 1) / {s} : 0LL;"))?;
    Ok((l, s))
}

/// The scalar ops inside the dot loop that the operand loads' offsets depend on.
pub(super) fn operand_slice(k: &Kernel, plan: &MmaPlan, info: &LoopInfo) -> Result<Vec<OpId>, CodegenError> {
    let roots: Vec<ValueId> = [plan.a.load, plan.b.load].into_iter().flat_map(|o| k.operands(o)).collect();
    scalar_slice(k, &roots, info.for_pos)
}

/// The dot loop's start and step (C names, from [`trip_count`]) and the scalar ops its
/// operands' offsets depend on ([`operand_slice`]): what the copies of an iteration
/// bind ([`bind_iteration`]).
pub(super) struct Trip {
    pub start: String,
    pub step: String,
    pub slice: Vec<OpId>,
}

/// Writes the dot loop's index at iteration `it` (a C expression, counted from the
/// trip's start in its steps) and the scalar ops of the trip's slice that depend on it.
pub(super) fn bind_iteration(e: &mut Emitter, info: &LoopInfo, trip: &Trip, it: &str) -> R {
    if let Some(ix) = info.index {
        let name = format!("v{}", ix.index());
        e.line(format!("const long long {name} = {} + ({it}) * {};", trip.start, trip.step))?;
        e.vals.insert(ix, Val { name, dtype: DType::I64, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None });
    }
    for &o in &trip.slice {
        e.op(o)?;
    }
    Ok(())
}

/// The corner of a dot operand's block along its indexed dimensions (a C pointer from
/// the tensor's data pointer, element offsets times strides) and the bounds conditions
/// of those dimensions; the copy adds the tile axes.
pub(super) fn index_corner(e: &Emitter, load: OpId) -> (String, Vec<String>) {
    let k = e.k;
    let Op::Load { tensor, dims } = k.op(load) else { unreachable!() };
    let tdims = k.tensor_dims(*tensor);
    let offs = k.operands(load);
    let mut corner = format!("p_{}", k.param(*tensor).name);
    let mut ok = Vec::new();
    for (d, ad) in dims.iter().enumerate() {
        if matches!(ad, AccessDim::Index) {
            let (o, st) = (e.val(offs[d]).name.clone(), e.stride(*tensor, d));
            corner = if st == "1" { format!("{corner} + {o}") } else { format!("{corner} + {o} * {st}") };
            let n = e.shape_var(tdims[d]);
            ok.push(if non_negative(k, offs[d]) { format!("{o} < {n}") } else { format!("{o} >= 0 && {o} < {n}") });
        }
    }
    (corner, ok)
}

/// Binds the dot loop's result to the accumulator `acc` and writes everything after
/// the loop (the epilogue) on it.
pub(super) fn epilogue(e: &mut Emitter, info: &LoopInfo, res: ValueId, acc: Val) -> R {
    e.vals.insert(res, acc);
    let k = e.k;
    for &o in &k.order[info.yield_pos + 1..] {
        if !matches!(k.op(o), Op::LoopResult { .. }) {
            e.op(o)?;
        }
    }
    Ok(())
}

/// What finishes a one-tile-per-block dot kernel (the FMA path): its
/// threads, its preludes, the alignment of its dynamic shared memory `kf_smem`, and the
/// bytes of its stage ring with their description for an error (`two stages of …`).
pub(super) struct BlockKernel<'s> {
    pub threads: u32,
    pub preludes: &'s [&'s str],
    pub align: u32,
    pub ring_bytes: u32,
    pub ring: String,
}

/// The kernel around the body `e` wrote: its dynamic shared memory (the ring's, or the
/// epilogue's where that is more; refused past the target's), then the source — the
/// header of [`open_kernel`] with the preludes, `kf_smem`, the body.
pub(super) fn finish_block_kernel(e: Emitter, target: &Target, b: &BlockKernel, decls: &[String], params: Vec<KernelParam>) -> Result<Emitted, CodegenError> {
    let (k, smem) = (e.k, e.smem);
    let dynamic_smem = b.ring_bytes.max(smem.div_ceil(16) * 16);
    let body = e.w.finish();
    if dynamic_smem > target.smem_per_block {
        return Err(CodegenError::Unsupported(format!(
            "{dynamic_smem} bytes of shared memory ({}, the epilogue {smem}); the target allows {}",
            b.ring, target.smem_per_block
        )));
    }
    let mut w = Writer::new(String::new());
    let mut write = || -> std::fmt::Result {
        open_kernel(&mut w, k, target, b.preludes, "", &launch_bounds(k, b.threads), decls, false)?;
        w.line(format!("extern __shared__ __align__({}) unsigned char kf_smem[];", b.align))?;
        w.raw(&body)?;
        w.close()
    };
    write().map_err(fmt_err)?;
    Ok(Emitted { source: w.finish(), params, static_smem: 0, dynamic_smem, block_threads: b.threads, persistent: None, dot_notes: Vec::new(), loop_notes: Vec::new(), min_blocks: None, late_dots: false, ahead_loads: false })
}

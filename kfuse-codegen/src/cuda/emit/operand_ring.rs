//! Tile loads that feed only WGMMA operands, inside a loop, copied global → shared
//! memory with `cp.async` into a two-stage ring, one iteration ahead (sm_90a; the
//! software pipelining of `dot_wgmma`'s staged operands).
//!
//! A load qualifies ([`ring_load`]) when the plan stages it where it is defined
//! (`WgPlan::eager`), it is a rank-2 tile of a tensor the kernel only reads, its
//! contiguous tile axis is the tensor's unit-stride last dimension at an offset that is a
//! provable multiple of 8 elements (0, a tile extent's multiple, a loop index) with a
//! 16-byte aligned pointer and row strides of whole 16-byte units, and every address
//! operand is defined before its innermost loop, is that loop's index, or is computed
//! in the loop by arithmetic on its index and values from outside it
//! ([`address_closure`]: the ring writes that arithmetic again, in a block of its own,
//! at the next index) — so the next iteration's tile is known before this one's math. A
//! gathered tile qualifies too (rows gathered by index tiles broadcast from rank-1 tiles
//! computed so, columns along the last dimension): each row's coordinates go into
//! shared-memory tables of the stage (`kf_gt…[stage]`, before the barrier the copies
//! follow; both stages once, before the loop, where the index tiles come from outside
//! it), and each 16-byte copy reads its row's coordinates there (a row outside the
//! tensor copies zeros). The warp-specialized path takes neither
//! (its producer computes scalar addresses defined outside the loop).
//!
//! Where the kernel is warp-specialized (`warp_specialize.rs`), a producer warpgroup
//! fills the rings instead, on mbarriers, and what follows describes the other kernels.
//!
//! Per loop with such loads: before the loop, the first iteration's tiles are copied
//! into stage 0 (one `cp.async` group). At the first such load in the body: a wait for
//! the thread's copies (this iteration's tiles), `fence.proxy.async` (the copies are
//! generic-proxy writes, WGMMA reads through the async proxy), one barrier (every
//! thread's copies have landed, and the other stage's last readers, the previous
//! iteration's instructions, are done), then the next iteration's tiles into the other
//! stage (when there is a next iteration) and a commit. The stage flips at the end of
//! the body. Each copy is 16
//! bytes (8 elements) of one row into its swizzled place. A thread copies the same
//! columns of rows a fixed step apart, so its source pointer and swizzled place are
//! computed once and each copy adds a constant. A tile valid whole (in a loop, every tile
//! but the last) copies 16 bytes each without a check; otherwise the source size is the
//! elements inside the tensor (0 for rows past its end or an index past its extent), and
//! `cp.async` fills the rest with zeros — the zero lanes outside the valid range that
//! the dot needs. No register holds these tiles.

use std::collections::BTreeMap;

use kfuse_ir::{AccessDim, Kernel, LoopId, Op, ParamKind, ValueId};

use super::dot_wgmma::SmemTile;
use super::{Emitter, Val, R};
use crate::analysis::{concrete_shape, extent_value, is_zero};
use crate::target::Spec;

/// The innermost loop around each op (`None`: none).
pub(super) fn enclosing_loops(k: &Kernel) -> BTreeMap<ValueId, LoopId> {
    let mut stack: Vec<LoopId> = Vec::new();
    let mut out = BTreeMap::new();
    for op in k.ops() {
        match k.op(op) {
            Op::For { id, .. } => {
                if let Some(&l) = stack.last() {
                    out.insert(op.value(), l);
                }
                stack.push(*id);
            }
            Op::Yield { .. } => {
                stack.pop();
            }
            _ => {
                if let Some(&l) = stack.last() {
                    out.insert(op.value(), l);
                }
            }
        }
    }
    out
}

/// Whether `v` is defined inside loop `l` (at any depth).
pub(super) fn inside(k: &Kernel, loops: &BTreeMap<ValueId, LoopId>, v: ValueId, l: LoopId) -> bool {
    let mut cur = loops.get(&v).copied();
    while let Some(c) = cur {
        if c == l {
            return true;
        }
        cur = k.loop_info(c).and_then(|i| loops.get(&i.for_op.value()).copied());
    }
    false
}

/// The loop whose ring takes the staged load `v` with tile `t` (see the module docs).
pub(super) fn ring_load(k: &Kernel, spec: &Spec, loops: &BTreeMap<ValueId, LoopId>, v: ValueId, t: &SmemTile) -> Option<LoopId> {
    let Op::Load { tensor, dims } = k.op(v.op()) else { return None };
    let l = *loops.get(&v)?;
    let p = k.param(*tensor);
    if !matches!(p.kind, ParamKind::Tensor { output: false, .. }) || p.dtype.size_bytes() != 2 {
        return None;
    }
    let tiles: Vec<usize> = (0..dims.len()).filter(|&d| matches!(dims[d], AccessDim::Tile(_))).collect();
    let last = dims.len() - 1;
    // a gathered tile: its rows gathered (index tiles fixed in the loop), its columns
    // the last dimension's
    let gathered = match gather_roots(k, v) {
        Some(g) if !g.is_empty() => {
            if tiles != [last] || g.iter().any(|&(d, x)| d > last || address_closure(k, loops, x, l).is_none()) {
                return None;
            }
            true
        }
        Some(_) => false,
        None => return None,
    };
    if (!gathered && (tiles.len() != 2 || tiles[1] != last)) || t.col_axis != 1 {
        return None;
    }
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten()?;
    // 16-byte copies: an aligned pointer, a unit last stride, every other stride in
    // whole 16-byte units
    if ts.ptr_align < 16 || ts.stride_div.get(last) != Some(&0) || (0..last).any(|d| ts.stride_div.get(d).is_none_or(|&s| s < 8)) {
        return None;
    }
    let ops = k.operands(v.op());
    if !multiple_of(k, ops[last], 8, 4) {
        return None;
    }
    let ok = ops.iter().zip(dims).all(|(&o, d)| d.is_gather() || address_closure(k, loops, o, l).is_some());
    ok.then_some(l)
}

/// The ops inside loop `l` that compute the address value `v` (program order), when
/// they are pure arithmetic on `l`'s index and values from outside `l` — so the ring can
/// compute the next iteration's address ahead (`None`: something else, a load or a
/// carried value, feeds it). Empty for a value from outside `l` or `l`'s index itself.
pub(super) fn address_closure(k: &Kernel, loops: &BTreeMap<ValueId, LoopId>, v: ValueId, l: LoopId) -> Option<Vec<kfuse_ir::OpId>> {
    let mut seen = std::collections::BTreeSet::new();
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        if !inside(k, loops, x, l) || matches!(k.op(x.op()), Op::LoopIndex { id } if *id == l) || !seen.insert(x.op()) {
            continue;
        }
        let pure = matches!(
            k.op(x.op()),
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Broadcast | Op::ExpandDims { .. } | Op::Convert
                | Op::Const { .. } | Op::ShapeDim { .. } | Op::TileExtent { .. } | Op::ScalarParam { .. } | Op::Iota { .. }
        );
        // (an op of a loop nested in `l` runs many times an iteration)
        if !pure || loops.get(&x) != Some(&l) {
            return None;
        }
        stack.extend(k.operands(x.op()));
    }
    let mut ops: Vec<kfuse_ir::OpId> = seen.into_iter().collect();
    ops.sort_by_key(|&o| k.position(o));
    Some(ops)
}

/// A load's gathered dimensions and the rank-1 index tile each is broadcast from
/// (`x` of `broadcast(x.unsqueeze(1))`); `None` where one is no such broadcast.
pub(super) fn gather_roots(k: &Kernel, v: ValueId) -> Option<Vec<(usize, ValueId)>> {
    if !matches!(k.op(v.op()), Op::Load { .. }) {
        return None;
    }
    k.gathered_offsets(v.op())
        .into_iter()
        .map(|(d, mut x)| {
            while matches!(k.op(x.op()), Op::Broadcast | Op::ExpandDims { .. } | Op::Convert) {
                x = k.operands(x.op())[0];
            }
            (k.ty(x).rank() == 1).then_some((d, x))
        })
        .collect()
}

/// Whether the `i64` scalar `v` is provably a multiple of `m` (a power of two): 0, a
/// constant or tile extent that is, a product with such a factor, a sum of such, or a
/// loop's index whose start and step are (`depth` bounds the walk).
fn multiple_of(k: &Kernel, v: ValueId, m: i64, depth: u32) -> bool {
    if is_zero(k, v) {
        return true;
    }
    if depth == 0 {
        return false;
    }
    let ops = k.operands(v.op());
    match k.op(v.op()) {
        Op::Const { value: kfuse_ir::Literal::Int(c) } => c % m == 0,
        Op::TileExtent { extent } => !matches!(extent, kfuse_ir::Extent::Full(_)) && i64::from(extent_value(k, *extent)) % m == 0,
        Op::Binary(kfuse_ir::BinaryOp::Mul) => multiple_of(k, ops[0], m, depth - 1) || multiple_of(k, ops[1], m, depth - 1),
        Op::Binary(kfuse_ir::BinaryOp::Add) => multiple_of(k, ops[0], m, depth - 1) && multiple_of(k, ops[1], m, depth - 1),
        Op::LoopIndex { id } => k.loop_info(*id).is_some_and(|i| {
            let f = k.operands(i.for_op);
            multiple_of(k, f[0], m, depth - 1) && multiple_of(k, f[2], m, depth - 1)
        }),
        _ => false,
    }
}

impl Emitter<'_> {
    /// Before loop `l` opens: its ring's stage variable and the first iteration's tiles.
    pub(super) fn ring_prologue(&mut self, l: LoopId, for_op: kfuse_ir::OpId) -> R {
        let Some(loads) = self.wg.as_ref().and_then(|p| p.rings.get(&l)).cloned() else { return Ok(()) };
        if self.ws.is_some() {
            // the producer fills the ring (`warp_specialize`)
            self.line(format!("int kf_rel{} = -1;", l.0))?;
            return self.line(format!("int kf_st{} = kf_rit % {};", l.0, self.wg.as_ref().unwrap().stages));
        }
        let ops = self.k.operands(for_op);
        let (lo, hi) = (self.val(ops[0]).name.clone(), self.val(ops[1]).name.clone());
        let gathered = self.ring_gather_tables(&loads)?;
        self.line(format!("int kf_st{} = 0;", l.0))?;
        self.open(format!("if ({lo} < {hi})"))?;
        // the addresses computed in the loop, at its first index
        let closure = self.ring_closure(l);
        if !closure.is_empty() {
            self.open("")?;
        }
        let saved = self.bind_closure(l, &closure, &lo)?;
        if gathered {
            // (index tiles from outside the loop: both stages' tables now, once)
            self.write_gather_tables(&loads, "0")?;
            if !self.tables_move(l) {
                self.write_gather_tables(&loads, "1")?;
            }
            self.line(self.barrier)?;
        }
        for v in &loads {
            self.ring_copy(*v, l, &lo, "0")?;
        }
        self.restore(saved);
        if !closure.is_empty() {
            self.close()?;
        }
        self.close()?;
        self.line("kf_cp_async_commit();")
    }

    /// The ops in loop `l` that compute its ring loads' addresses ([`address_closure`]),
    /// in program order.
    fn ring_closure(&self, l: LoopId) -> Vec<kfuse_ir::OpId> {
        let k = self.k;
        let loops = enclosing_loops(k);
        let mut all = std::collections::BTreeSet::new();
        for &v in &self.wg.as_ref().unwrap().rings[&l] {
            let gathered: Vec<ValueId> = gather_roots(k, v).unwrap_or_default().into_iter().map(|(_, x)| x).collect();
            let Op::Load { dims, .. } = k.op(v.op()) else { continue };
            let scalars = k.operands(v.op()).into_iter().zip(dims).filter(|(_, d)| !d.is_gather()).map(|(o, _)| o);
            for r in gathered.into_iter().chain(scalars) {
                all.extend(address_closure(k, &loops, r, l).unwrap_or_default());
            }
        }
        let mut ops: Vec<kfuse_ir::OpId> = all.into_iter().collect();
        ops.sort_by_key(|&o| k.position(o));
        ops
    }

    /// Writes `closure` again with loop `l`'s index bound to the expression `at` (in a
    /// block the caller opened, whose names shadow the iteration's own); returns the
    /// values it replaced, for [`Emitter::restore`].
    fn bind_closure(&mut self, l: LoopId, closure: &[kfuse_ir::OpId], at: &str) -> Result<Vec<(ValueId, Option<Val>)>, crate::CodegenError> {
        let mut saved = Vec::new();
        if closure.is_empty() {
            return Ok(saved);
        }
        let k = self.k;
        if let Some(iv) = k.ops().find(|&o| matches!(k.op(o), Op::LoopIndex { id } if *id == l)).map(|o| o.value()) {
            saved.push((iv, self.vals.remove(&iv)));
            let val = Val { name: format!("({at})"), dtype: kfuse_ir::DType::I64, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None };
            self.vals.insert(iv, val);
        }
        for &op in closure {
            saved.push((op.value(), self.vals.remove(&op.value())));
            self.op_unlocated(op)?;
        }
        Ok(saved)
    }

    /// Puts back the values [`Emitter::bind_closure`] replaced.
    fn restore(&mut self, saved: Vec<(ValueId, Option<Val>)>) {
        for (v, x) in saved.into_iter().rev() {
            match x {
                Some(x) => self.vals.insert(v, x),
                None => self.vals.remove(&v),
            };
        }
    }

    /// At a ring load inside its loop: the first one of the loop fetches the next
    /// iteration and waits for this one; each records its value's valid range.
    pub(super) fn ring_arrive(&mut self, v: ValueId, l: LoopId) -> R {
        let loads = self.wg.as_ref().unwrap().rings[&l].clone();
        if loads[0] == v && self.ws.is_some() {
            // the stage's copies have landed: fence them against WGMMA's async proxy
            self.line(format!("kf_mbar_wait(&kf_full[kf_st{0}], (kf_rit / {1}) & 1);", l.0, self.wg.as_ref().unwrap().stages))?;
            if self.ws.as_ref().is_some_and(|ws| ws.tma.is_empty()) {
                // (TMA's writes are the async proxy's already)
                self.line("kf_proxy_fence();")?;
            }
            self.wg_dirty = false;
        } else if loads[0] == v {
            let ops = self.k.operands(self.k.loop_info(l).unwrap().for_op);
            let (hi, step) = (self.val(ops[1]).name.clone(), self.val(ops[2]).name.clone());
            let iv = super::loops::index_var(l);
            // one barrier an iteration: after it every thread's copies of this
            // iteration have landed and every thread is past the previous iteration,
            // whose instructions read the other stage
            self.line("kf_cp_async_wait<0>();")?;
            self.line("kf_proxy_fence();")?;
            // the next iteration's addresses computed in the loop, and its rows'
            // coordinates into the other stage's tables, before the barrier
            let (next, has_next, other) = (format!("({iv} + ({step}))"), format!("(({hi}) - {iv} > ({step}))"), format!("(kf_st{} ^ 1)", l.0));
            let closure = self.ring_closure(l);
            if !closure.is_empty() {
                self.open("")?;
            }
            let saved = self.bind_closure(l, &closure, &next)?;
            if self.tables_move(l) {
                self.open(format!("if {has_next}"))?;
                self.write_gather_tables(&loads, &other)?;
                self.close()?;
            }
            self.line(self.barrier)?;
            self.open(format!("if {has_next}"))?;
            for x in &loads {
                self.ring_copy(*x, l, &next, &other)?;
            }
            self.close()?;
            self.restore(saved);
            if !closure.is_empty() {
                self.close()?;
            }
            self.line("kf_cp_async_commit();")?;
            self.wg_synced = true;
            self.wg_dirty = false;
        }
        let (_, _, his) = self.ring_addr(v, l, &super::loops::index_var(l))?;
        let layout = self.layout(v)?;
        let map = crate::layout::RegMap::of(&layout);
        let shape = concrete_shape(self.k, self.k.ty(v));
        let his: Vec<String> = his
            .into_iter()
            .map(|h| {
                let n = self.fresh("kf_rb");
                self.line(format!("const long long {n} = {h};")).map(|_| n)
            })
            .collect::<Result<_, _>>()?;
        let name = format!("v{}", v.index());
        self.vals.insert(v, Val { name, dtype: self.k.ty(v).dtype, map, axis_map: vec![Some(0), Some(1)], shape, lo: vec!["0".into(), "0".into()], hi: his, lazy: None });
        Ok(())
    }

    /// The base pointer, whether the index dimensions are in range, and per tile axis
    /// the valid extent, of load `v` at loop index `idx`.
    fn ring_addr(&self, v: ValueId, l: LoopId, idx: &str) -> Result<(String, String, Vec<String>), crate::CodegenError> {
        let k = self.k;
        let Op::Load { tensor, dims } = k.op(v.op()) else { unreachable!() };
        let ops = k.operands(v.op());
        let name = |o: ValueId| if matches!(k.op(o.op()), Op::LoopIndex { id } if *id == l) { idx.to_string() } else { self.val(o).name.clone() };
        // (a gathered dimension's coordinates come per row, from the ring's row tables)
        let offs: Vec<String> = ops.iter().zip(dims).map(|(&o, d)| if d.is_gather() { "0".to_string() } else { name(o) }).collect();
        let p = k.param(*tensor);
        let mut ok = vec!["true".to_string()];
        let mut his = Vec::new();
        for (d, ad) in dims.iter().enumerate() {
            let n = self.shape_var(p.dims()[d]);
            match ad {
                AccessDim::Index => ok.push(format!("{} >= 0 && {} < {n}", offs[d], offs[d])),
                AccessDim::Tile(e) => his.push(format!("kf_maxi(0LL, kf_mini({n} - {}, {}LL))", offs[d], extent_value(k, *e))),
                // every gathered row is valid (one outside the tensor reads zeros)
                AccessDim::Gather(e) if his.is_empty() => his.push(format!("{}LL", extent_value(k, *e))),
                AccessDim::Gather(_) => {}
            }
        }
        let ok = ok.join(" && ");
        let his = his.into_iter().map(|h| format!("(({ok}) ? {h} : 0LL)")).collect();
        Ok((self.element_ptr(*tensor, &offs), ok, his))
    }

    /// Whether a gathered ring load of loop `l` has index tiles computed in the loop (its
    /// row tables are written again for each next iteration; otherwise once, before it).
    fn tables_move(&self, l: LoopId) -> bool {
        let loops = enclosing_loops(self.k);
        self.wg.as_ref().unwrap().rings[&l]
            .iter()
            .flat_map(|&v| gather_roots(self.k, v).unwrap_or_default())
            .any(|(_, x)| address_closure(self.k, &loops, x, l).is_some_and(|c| !c.is_empty()))
    }

    /// Declares the row tables of loop `l`'s gathered ring loads, two stages each
    /// (`kf_gt{load}_{dim}[stage][row]`: each row's coordinate along each gathered
    /// dimension, from the rank-1 index tiles the loads are broadcast from); returns
    /// whether there are any.
    fn ring_gather_tables(&mut self, loads: &[ValueId]) -> Result<bool, crate::CodegenError> {
        let mut any = false;
        for &v in loads {
            let Some(gather) = gather_roots(self.k, v).filter(|g| !g.is_empty()) else { continue };
            let rows = self.wg.as_ref().unwrap().eager[&v].rows;
            any = true;
            for (d, _) in gather {
                self.line(format!("__shared__ long long kf_gt{}_{d}[2][{rows}];", v.index()))?;
            }
        }
        Ok(any)
    }

    /// Each thread's rows of the gathered ring loads' tables for ring stage `stage`.
    fn write_gather_tables(&mut self, loads: &[ValueId], stage: &str) -> R {
        for &v in loads {
            for (d, x) in gather_roots(self.k, v).unwrap_or_default() {
                let xv = self.val(x).clone();
                let map = xv.map.clone().ok_or_else(|| crate::CodegenError::Unsupported("a gathered ring load's index tile in a uniform layout".into()))?;
                let axis = xv.axis_map.first().copied().flatten().ok_or_else(|| crate::CodegenError::Unsupported("a gathered ring load's index tile without its axis".into()))?;
                self.unroll("k", map.regs)?;
                self.line(format!("kf_gt{}_{d}[{stage}][{}] = {};", v.index(), super::coord(&map, axis, "k"), self.reg(x, "k")))?;
                self.close()?;
            }
        }
        Ok(())
    }

    /// The copies of a gathered tile: each 16-byte chunk of a row from the row's
    /// gathered coordinates (its tables), zeros for a row outside the tensor.
    fn gathered_copy(&mut self, v: ValueId, t: &SmemTile, gather: &[(usize, ValueId)], tid: &str, threads: u32, stage: &str) -> R {
        let Op::Load { tensor, .. } = self.k.op(v.op()) else { unreachable!() };
        let tdims = self.k.tensor_dims(*tensor);
        let (cols, rows) = (t.cols, t.rows);
        let per_row = cols / 8;
        self.line("#pragma unroll")?;
        self.open(format!("for (int q = {tid}; q < {}; q += {threads})", rows * cols / 8))?;
        self.line(format!("const int r = q / {per_row}, c = (q % {per_row}) * 8;"))?;
        self.line("long long kf_go = 0;")?;
        self.line("bool kf_gin = true;")?;
        for &(d, _) in gather {
            let (n, st) = (self.shape_var(tdims[d]), self.stride(*tensor, d));
            self.line(format!("{{ const long long x = kf_gt{}_{d}[{stage}][r]; kf_gin = kf_gin && (unsigned long long)x < (unsigned long long){n}; kf_go += x * {st}; }}", v.index()))?;
        }
        self.line("const int kf_n = kf_gin ? (kf_vc - c < 0 ? 0 : kf_vc - c > 8 ? 8 : kf_vc - c) : 0;")?;
        let at = t.at("r", "c");
        self.line(format!(
            "kf_cp_async16(kf_saddr(kf_ops + {} + {stage} * {} + {at}), kf_n > 0 ? kf_src + kf_go + c : kf_src, (unsigned)(kf_n * 2));",
            t.off,
            t.bytes()
        ))?;
        self.close()
    }

    /// The copies of load `v`'s tile at loop index `idx` into ring stage `stage`.
    pub(super) fn ring_copy(&mut self, v: ValueId, l: LoopId, idx: &str, stage: &str) -> R {
        let t = self.wg.as_ref().unwrap().eager[&v].clone();
        let (base, _, his) = self.ring_addr(v, l, idx)?;
        let Op::Load { tensor, dims } = self.k.op(v.op()) else { unreachable!() };
        let row_dim = (0..dims.len()).find(|&d| matches!(dims[d], AccessDim::Tile(_))).unwrap();
        let stride = self.stride(*tensor, row_dim);
        let (cols, rows) = (t.cols, t.rows);
        let chunks = rows * cols / 8;
        // the producer warpgroup's 128 threads (`warp_specialize`), or the block's
        let (tid, threads) = if self.producer {
            (format!("(kf_tid - {})", super::warp_specialize::CONSUMERS), super::warp_specialize::PRODUCER_THREADS)
        } else {
            ("kf_tid".to_string(), self.k.schedule.num_threads)
        };
        let per_row = cols / 8;
        let gather = gather_roots(self.k, v).unwrap_or_default();
        self.open("")?;
        self.line(format!("const kf_u16* kf_src = {base};"))?;
        if !gather.is_empty() {
            self.line(format!("const int kf_vc = (int)({});", his[1]))?;
            return self.gathered_copy(v, &t, &gather, &tid, threads, stage).and_then(|_| self.close());
        }
        // the valid extents lie in [0, tile]: 32-bit from here on
        self.line(format!("const int kf_vr = (int)({}), kf_vc = (int)({});", his[0], his[1]))?;
        // each thread copies the same columns of rows `rs` apart: its source pointer,
        // bytes and (where `rs` rows are whole swizzle periods) its swizzled place are
        // computed once, and each copy adds a constant
        let rs = threads / per_row.max(1);
        let step = if t.padded { Some(rs * t.row_elems() * 2) } else { rs.is_multiple_of(8).then_some(rs * t.span) };
        match step {
            Some(step) if threads.is_multiple_of(per_row) && chunks.is_multiple_of(threads) => {
                let iters = chunks / threads;
                self.line(format!("const int kf_r0 = {tid} / {per_row}, kf_c = ({tid} % {per_row}) * 8;"))?;
                self.line(format!("const char* kf_g = (const char*)(kf_src + (long long)kf_r0 * {stride} + kf_c);"))?;
                self.line(format!("const long long kf_gs = (long long){rs} * {stride} * 2;"))?;
                self.line(format!("const unsigned kf_d = kf_saddr(kf_ops + {} + {stage} * {} + {});", t.off, t.bytes(), t.at("kf_r0", "kf_c")))?;
                // a whole tile (every one but a loop's last): 16 bytes a copy, no checks
                self.open(format!("if (kf_vr >= {rows} && kf_vc >= {cols})"))?;
                self.unroll("it", iters)?;
                self.line(format!("kf_cp_async16(kf_d + it * {step}u, kf_g + it * kf_gs, 16u);"))?;
                self.close()?;
                self.close()?;
                self.open("else")?;
                self.line("const unsigned kf_nb = (unsigned)(kf_vc - kf_c < 0 ? 0 : kf_vc - kf_c > 8 ? 8 : kf_vc - kf_c) * 2u;")?;
                self.unroll("it", iters)?;
                self.line(format!("const unsigned kf_n = kf_r0 + it * {rs} < kf_vr ? kf_nb : 0u;"))?;
                self.line(format!("kf_cp_async16(kf_d + it * {step}u, kf_n > 0 ? (const void*)(kf_g + it * kf_gs) : (const void*)kf_src, kf_n);"))?;
                self.close()?;
                self.close()?;
            }
            _ => {
                self.line("#pragma unroll")?;
                self.open(format!("for (int q = {tid}; q < {chunks}; q += {threads})"))?;
                self.line(format!("const int r = q / {per_row}, c = (q % {per_row}) * 8;"))?;
                self.line("const int kf_n = r < kf_vr ? (kf_vc - c < 0 ? 0 : kf_vc - c > 8 ? 8 : kf_vc - c) : 0;")?;
                let at = t.at("r", "c");
                self.line(format!(
                    "kf_cp_async16(kf_saddr(kf_ops + {} + {stage} * {} + {at}), kf_n > 0 ? kf_src + (long long)r * {stride} + c : kf_src, (unsigned)(kf_n * 2));",
                    t.off,
                    t.bytes()
                ))?;
                self.close()?;
            }
        }
        self.close()
    }
}

/// The `cp.async` helpers of kernels with a ring (the mma.sync path's, `cp_async_helpers`).
pub(super) const RING_PRELUDE: &str = cp_async_helpers!();

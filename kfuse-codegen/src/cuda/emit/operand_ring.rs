//! Tile loads that feed only tensor-core operands (WGMMA's on sm_90a, `ldmatrix` +
//! `mma.sync`'s elsewhere: `dot.rs`, rule 1), inside a loop, copied global → shared
//! memory with `cp.async` into a ring of stages, several steps ahead (the software
//! pipelining of `dot_wgmma`'s staged operands).
//!
//! A load qualifies ([`ring_load`]) when the plan stages it where it is defined
//! (`WgPlan::eager`), it is a rank-2 tile (the tensor's other dimensions indexed) of a
//! tensor the kernel only reads, its contiguous tile axis is the tensor's unit-stride
//! dimension (the last, or the first of a transposed view: [`ring_dims`]) at an offset
//! that is a provable multiple of 16 bytes (0, a tile extent's multiple, a loop index)
//! with a 16-byte aligned pointer and the other strides whole 16-byte units, and every address
//! operand is defined before its innermost loop, is that loop's index, or is computed
//! in the loop by arithmetic on its index and values from outside it
//! ([`nest_closure`]) — so a later step's tile is known before this one's math. A
//! gathered tile qualifies too (rows gathered by index tiles broadcast from rank-1 tiles
//! computed so, columns along the last dimension): each row's element offset (or
//! [`NO_ROW`] for a row outside the tensor, which copies zeros) goes into a shared-memory
//! table of the stage (`kf_gt…[stage]`), and each 16-byte copy reads its row's offset
//! there (the warp-specialized path's producer writes its own tables,
//! `warp_specialize.rs`).
//!
//! Where the kernel is warp-specialized (`warp_specialize.rs`), a producer warpgroup
//! fills the rings instead, on mbarriers, and what follows describes the other kernels.
//!
//! The steps a ring walks are the iterations of its loop and of the loops around it
//! taken as one sequence ([`ring_nest`]: a convolution's taps and channel chunks), so
//! that the copies run ahead across the outer loops' iterations too. A cursor (the
//! indices of the next step to copy, `kf_p<ring>_<level>`, the innermost moving first)
//! walks them; the addresses computed in the nest are written again at the cursor. The
//! ring has `WgPlan::stages` stages (up to [`STAGES`]; as many as the block's shared
//! memory holds, for `ring_occupancy`'s blocks a multiprocessor).
//!
//! Before the outermost loop of the nest: the first `stages - 1` steps' tiles, one
//! `cp.async` group each. At the first ring load of each step: a wait until at most
//! `stages - 2` groups are pending (this step's tiles have landed, for this thread),
//! `fence.proxy.async` where WGMMA reads them (the copies are generic-proxy writes, WGMMA
//! reads through the async proxy; `ldmatrix` is generic), one barrier (every thread's
//! copies have landed; every thread is past the step before, whose instructions read
//! the stage the next copies fill). The copies of the step `stages - 1` ahead follow the
//! step's first dot's WGMMA instructions (issued while the tensor cores run, before the
//! dot waits), or precede an `mma.sync` dot's math, then a commit, and the
//! cursor and the write stage move on; the read stage moves at the end of the loop's
//! body. Moving row tables are written for the cursor's step before the barrier its
//! copies follow: a step ahead, after the copies, while the tensor cores run, where the
//! registers are not capped for two blocks a multiprocessor ([`Emitter::shadow_tables`]),
//! else just before that barrier. Each copy is 16
//! bytes of one row (8 16-bit elements, 16 fp8, 4 f32) into its swizzled place. A thread copies the same
//! columns of rows a fixed step apart, so its source pointer and swizzled place are
//! computed once and each copy adds a constant. A tile valid whole (in a loop, every tile
//! but the last) copies 16 bytes each without a check; otherwise the source size is the
//! elements inside the tensor (0 for rows past its end or an index past its extent), and
//! `cp.async` fills the rest with zeros — the zero lanes outside the valid range that
//! the dot needs. A tile offset not provably ≥ 0 is checked (`__trap()` where it is
//! negative: the copies cannot mask a start before the tensor's). No register holds
//! these tiles.

use std::collections::BTreeMap;

use kfuse_ir::{AccessDim, Kernel, LoopId, Op, ParamKind, ValueId};

use super::dot_wgmma::SmemTile;
use super::{Emitter, Val, R};
use crate::analysis::{concrete_shape, extent_value, is_zero, non_negative};
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
    if !matches!(p.kind, ParamKind::Tensor { output: false, .. }) || p.dtype.size_bytes() as u32 != t.esize {
        return None;
    }
    let tiles: Vec<usize> = (0..dims.len()).filter(|&d| matches!(dims[d], AccessDim::Tile(_))).collect();
    let last = dims.len() - 1;
    let (_, unit) = ring_dims(k, spec, v)?;
    // a gathered tile: its rows gathered (index tiles fixed in the loop), its columns
    // the last dimension's
    let gathered = match gather_roots(k, v) {
        Some(g) if !g.is_empty() => {
            if tiles != [last] || unit != last || t.col_axis != 1 || g.iter().any(|&(d, _)| d > last) {
                return None;
            }
            true
        }
        Some(_) => false,
        None => return None,
    };
    // otherwise two tile dimensions, the tile's columns along the unit-stride one (the
    // last, or the first of a transposed view)
    if !gathered && (tiles.len() != 2 || tiles.get(t.col_axis) != Some(&unit)) {
        return None;
    }
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten()?;
    // 16-byte copies: an aligned pointer, every stride but the unit one in whole 16-byte
    // units
    let ce = 16 / t.esize;
    if ts.ptr_align < 16 || (0..dims.len()).any(|d| d != unit && ts.stride_div.get(d).is_none_or(|&s| s < ce)) {
        return None;
    }
    let ops = k.operands(v.op());
    if !multiple_of(k, ops[unit], ce as i64, 4) {
        return None;
    }
    // (addresses the ring can compute ahead: `nest_closure` of the loop alone)
    let ok = address_roots(k, v).into_iter().all(|r| nest_closure(k, loops, r, &[l]).is_some());
    ok.then_some(l)
}

/// A ring load's tensor dimensions: the first tile dimension other than the unit-stride
/// one (the tile's rows), and the unit-stride one (its columns, the innermost of a
/// tensor map: `select_mma_path::tma_order`); `None` where the tensor has no
/// unit-stride dimension.
pub(super) fn ring_dims(k: &Kernel, spec: &Spec, v: ValueId) -> Option<(usize, usize)> {
    let Op::Load { dims, .. } = k.op(v.op()) else { return None };
    let unit = crate::passes::select_mma_path::tma_order(k, spec, v.op())?[0] as usize;
    let row = (0..dims.len()).find(|&d| d != unit && matches!(dims[d], AccessDim::Tile(_))).unwrap_or(unit);
    Some((row, unit))
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

/// The values a ring load's address is computed from: the rank-1 index tiles of its
/// gathered dimensions and its other offsets.
fn address_roots(k: &Kernel, v: ValueId) -> Vec<ValueId> {
    let mut roots = gathered_roots(k, v);
    roots.extend(scalar_roots(k, v));
    roots
}

/// The rank-1 index tiles a ring load's gathered rows are addressed by (its row tables).
pub(super) fn gathered_roots(k: &Kernel, v: ValueId) -> Vec<ValueId> {
    gather_roots(k, v).unwrap_or_default().into_iter().map(|(_, x)| x).collect()
}

/// A ring load's offsets along its other dimensions (its copies' scalar addresses).
pub(super) fn scalar_roots(k: &Kernel, v: ValueId) -> Vec<ValueId> {
    let Op::Load { dims, .. } = k.op(v.op()) else { return vec![] };
    k.operands(v.op()).into_iter().zip(dims).filter(|(_, d)| !d.is_gather()).map(|(o, _)| o).collect()
}

/// The ops inside the loops of `nest` (outermost first, each the only loop in the one
/// before) that compute `v`, in program order, when they are pure arithmetic on the
/// nest's indices and values from outside it (`None`: something else feeds it). Empty
/// for a value from outside the nest or one of its indices. A ring computes a later
/// step's addresses with them, at its cursor.
pub(super) fn nest_closure(k: &Kernel, loops: &BTreeMap<ValueId, LoopId>, v: ValueId, nest: &[LoopId]) -> Option<Vec<kfuse_ir::OpId>> {
    let mut seen = std::collections::BTreeSet::new();
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        let index = matches!(k.op(x.op()), Op::LoopIndex { id } if nest.contains(id));
        if !inside(k, loops, x, nest[0]) || index || !seen.insert(x.op()) {
            continue;
        }
        let pure = matches!(
            k.op(x.op()),
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Broadcast | Op::ExpandDims { .. } | Op::Convert
                | Op::Const { .. } | Op::ShapeDim { .. } | Op::TileExtent { .. } | Op::ScalarParam { .. } | Op::Iota { .. }
        );
        if !pure || !loops.get(&x).is_some_and(|l| nest.contains(l)) {
            return None;
        }
        stack.extend(k.operands(x.op()));
    }
    let mut ops: Vec<kfuse_ir::OpId> = seen.into_iter().collect();
    ops.sort_by_key(|&o| k.position(o));
    Some(ops)
}

/// The loops whose iterations ring loop `l`'s copies walk as one sequence, outermost
/// first, `l` last: `l`, then each loop around the last one taken while that one is the
/// only loop in it, every dot in it is in `l`, the bounds of the loops taken come from
/// outside it, and the loads' addresses are pure arithmetic on the loops' indices
/// ([`nest_closure`]). The ring then fetches across the outer loops' iterations: a
/// convolution's channel chunks and filter taps are one sequence of steps.
pub(super) fn ring_nest(k: &Kernel, loops: &BTreeMap<ValueId, LoopId>, l: LoopId, loads: &[ValueId]) -> Vec<LoopId> {
    let mut nest = vec![l];
    while let Some(p) = k.loop_info(nest[0]).and_then(|i| loops.get(&i.for_op.value()).copied()) {
        let mut cand = vec![p];
        cand.extend(&nest);
        let alone = k.ops().all(|o| match k.op(o) {
            Op::For { id, .. } => !inside(k, loops, o.value(), p) || cand.contains(id),
            Op::Dot { .. } => !inside(k, loops, o.value(), p) || inside(k, loops, o.value(), l),
            _ => true,
        });
        let bounds = cand.iter().all(|&c| k.loop_info(c).is_some_and(|i| k.operands(i.for_op).iter().take(3).all(|&b| !inside(k, loops, b, p))));
        let addresses = loads.iter().all(|&v| address_roots(k, v).into_iter().all(|r| nest_closure(k, loops, r, &cand).is_some()));
        if !(alone && bounds && addresses) {
            break;
        }
        nest = cand;
    }
    nest
}

/// Most stages of a `cp.async` ring (fewer where the block's shared memory does not
/// hold them).
pub(super) const STAGES: u32 = 4;

/// More ring stages than this buy nothing measurable: the loads are far enough ahead
/// (M127 N4096 K4096, 128x64 tiles on the H100: 8 stages 213 TFLOP/s, 6 stages 201,
/// 4 stages 157). `STAGES=n` asks for n from 2 up to it.
pub(super) const MAX_STAGES: u32 = 8;

/// Adjacent 16-byte pieces of a gathered row one thread copies (where a row has a
/// multiple of them): the row's table read and test serve them all.
const GATHER_PIECES: u32 = 4;

/// The sentinel of a gathered row outside the tensor in a ring's row table.
const NO_ROW: &str = "(-0x7fffffffffffffffLL - 1)";

/// [`NO_ROW`] in a table of 32-bit offsets ([`Emitter::row_table`]): no offset below 2^31
/// equals it.
const NO_ROW32: &str = "0xffffffffu";

impl Emitter<'_> {
    /// The shared-memory address of the operand area's byte `off` (a C expression):
    /// from its address taken once where the kernel takes it so
    /// (`warp_specialize::takes_addresses_once`), else from the pointer at this use.
    fn ops_saddr(&self, off: &str) -> String {
        if self.addresses_once {
            format!("(kf_ops_sa + {off})")
        } else {
            format!("kf_saddr(kf_ops + {off})")
        }
    }

    /// The element type, the outside-row sentinel and the bytes of an entry of gathered
    /// load `v`'s row tables: 32-bit offsets where its tensor's offsets fit them
    /// ([`Spec::offsets32`]; the coordinates are summed in 32 bits too), else 64-bit.
    fn row_table(&self, v: ValueId) -> (&'static str, &'static str, u32) {
        let Op::Load { tensor, .. } = self.k.op(v.op()) else { unreachable!("a gathered ring load") };
        if self.spec.offsets32(*tensor) {
            ("unsigned", NO_ROW32, 4)
        } else {
            ("long long", NO_ROW, 8)
        }
    }

    /// The loops ring loop `l`'s copies walk ([`ring_nest`]; under warp specialization,
    /// `l` alone: the producer walks it).
    pub(super) fn nest_of(&self, l: LoopId) -> Vec<LoopId> {
        self.ring_nests.get(&l).cloned().unwrap_or_else(|| vec![l])
    }

    /// Finds each ring's nest once, when the plan and the warp specialization are
    /// settled ([`Emitter::nest_of`] reads them).
    pub(super) fn find_ring_nests(&mut self) {
        let Some(p) = self.wg.as_ref().filter(|_| self.ws.is_none()) else { return };
        let loops = enclosing_loops(self.k);
        self.ring_nests = p.rings.iter().map(|(&l, loads)| (l, ring_nest(self.k, &loops, l, loads))).collect();
    }

    /// The ring loop whose copies start where loop `id` opens (the outermost loop of its
    /// nest).
    pub(super) fn ring_opened_by(&self, id: LoopId) -> Option<LoopId> {
        let rings = &self.wg.as_ref()?.rings;
        rings.keys().copied().find(|&l| self.consumer_nest(l)[0] == id)
    }

    /// The loops ring loop `l`'s stages and deferred waits span for the block's own
    /// threads: its nest ([`Emitter::nest_of`]), or under warp specialization the nest
    /// the producer walks (`WsPlan::nests`; the consumers' waits and releases are per
    /// step, in `l`) where it spans it (`WsPlan::spans`).
    pub(super) fn consumer_nest(&self, l: LoopId) -> Vec<LoopId> {
        match self.ws.as_ref().filter(|ws| ws.spans.contains(&l)) {
            Some(ws) => ws.nests[&l].clone(),
            None => self.nest_of(l),
        }
    }

    /// Before the outermost loop of ring loop `l`'s nest opens: the ring's stages and
    /// cursor, then the copies of the first `stages - 1` steps.
    pub(super) fn ring_prologue(&mut self, l: LoopId) -> R {
        let Some(loads) = self.wg.as_ref().and_then(|p| p.rings.get(&l)).cloned() else { return Ok(()) };
        let stages = self.wg.as_ref().unwrap().stages;
        if self.ws.is_some() {
            // the producer fills the ring (`warp_specialize`)
            self.line(format!("int kf_rel{} = -1;", l.0))?;
            return self.line(format!("int kf_st{} = kf_rit % {stages};", l.0));
        }
        let nest = self.nest_of(l);
        let moving = self.tables_move(l);
        let gathered = self.ring_gather_tables(&loads, if moving { stages } else { 1 })?;
        self.line(format!("int kf_st{0} = 0, kf_ws{0} = 0;", l.0))?;
        // the cursor: the indices of the next step to copy (the outer ones start past
        // their end, no step at all, where an inner loop is empty)
        let b = self.nest_bounds(&nest);
        let empty: Vec<String> = b.iter().skip(1).map(|(lo, hi, _)| format!("{lo} < {hi}")).collect();
        for (i, (lo, hi, _)) in b.iter().enumerate() {
            let start = if i == 0 && !empty.is_empty() { format!("({}) ? {lo} : {hi}", empty.join(" && ")) } else { lo.clone() };
            self.line(format!("long long kf_p{}_{i} = {start};", l.0))?;
        }
        if gathered && !moving {
            // (index tiles from outside the nest: the one table now)
            self.write_gather_tables(&loads, "0")?;
            self.line(self.barrier)?;
        }
        // (moving tables: each step's rows are written before its copies, a barrier
        // between: just before, or a step before — see `shadow_tables`)
        let shadow = self.shadow_tables();
        if shadow {
            self.fetch_tables(l, &nest)?;
        }
        for _ in 0..stages - 1 {
            if !shadow {
                self.fetch_tables(l, &nest)?;
            }
            if moving {
                self.line(self.barrier)?;
            }
            self.fetch_copies(l, &nest)?;
            if shadow {
                self.fetch_tables(l, &nest)?;
            }
        }
        Ok(())
    }

    /// Whether moving row tables are written a step ahead, after the copies, while the
    /// step's WGMMA instructions run (their registers live beside the accumulator): where
    /// the kernel's registers are not capped for two blocks a multiprocessor
    /// (`ring_occupancy`); else just before the barrier their copies follow.
    fn shadow_tables(&self) -> bool {
        self.k.schedule.min_blocks < 2
    }

    /// `(lo, hi, step)` of each loop of `nest`, as C expressions.
    pub(super) fn nest_bounds(&self, nest: &[LoopId]) -> Vec<(String, String, String)> {
        nest.iter()
            .map(|&n| {
                let ops = self.k.operands(self.k.loop_info(n).unwrap().for_op);
                (self.val(ops[0]).name.clone(), self.val(ops[1]).name.clone(), self.val(ops[2]).name.clone())
            })
            .collect()
    }

    /// The cursor's step of ring loop `l`'s nest: a block in which the addresses
    /// computed in the nest from the loads' `roots` are written again at the cursor,
    /// then `body`.
    fn at_cursor(&mut self, l: LoopId, nest: &[LoopId], roots: fn(&Kernel, ValueId) -> Vec<ValueId>, body: impl FnOnce(&mut Self, &str) -> R) -> R {
        let closure = self.ring_closure(l, nest, roots);
        self.open("")?;
        let binds: Vec<(LoopId, String)> = nest.iter().enumerate().map(|(i, &n)| (n, format!("kf_p{}_{i}", l.0))).collect();
        let saved = self.bind_closure(&binds, &closure)?;
        let valid = format!("(kf_p{}_0 < {})", l.0, self.nest_bounds(nest)[0].1);
        body(self, &valid)?;
        self.restore(saved);
        self.close()
    }

    /// Where ring loop `l`'s gathered row tables move: the rows of the cursor's step
    /// into the table of stage `kf_ws<l>`, before the barrier its copies follow.
    fn fetch_tables(&mut self, l: LoopId, nest: &[LoopId]) -> R {
        if !self.tables_move(l) {
            return Ok(());
        }
        let loads = self.wg.as_ref().unwrap().rings[&l].clone();
        self.at_cursor(l, nest, gathered_roots, |e, valid| {
            e.open(format!("if {valid}"))?;
            e.write_gather_tables(&loads, &format!("kf_ws{}", l.0))?;
            e.close()
        })
    }

    /// The copies of the cursor's step into stage `kf_ws<l>`, their group, and the
    /// cursor's and the stage's move.
    fn fetch_copies(&mut self, l: LoopId, nest: &[LoopId]) -> R {
        let loads = self.wg.as_ref().unwrap().rings[&l].clone();
        let stages = self.wg.as_ref().unwrap().stages;
        let b = self.nest_bounds(nest);
        let (cursor, stage) = (format!("kf_p{}_{}", l.0, nest.len() - 1), format!("kf_ws{}", l.0));
        self.at_cursor(l, nest, scalar_roots, |e, valid| {
            e.open(format!("if {valid}"))?;
            for x in &loads {
                e.ring_copy(*x, l, &cursor, &stage)?;
            }
            e.close()
        })?;
        self.line("kf_cp_async_commit();")?;
        // the cursor's next step: the innermost index moves; one at its end starts again
        // and moves the one around it
        let step = |i: usize, b: &(String, String, String)| format!("kf_p{0}_{i} = ({1}) - kf_p{0}_{i} > ({2}) ? kf_p{0}_{i} + ({2}) : ({1});", l.0, b.1, b.2);
        for i in (1..nest.len()).rev() {
            self.line(step(i, &b[i]))?;
            self.open(format!("if (kf_p{}_{i} >= {})", l.0, b[i].1))?;
            self.line(format!("kf_p{}_{i} = {};", l.0, b[i].0))?;
        }
        self.line(step(0, &b[0]))?;
        for _ in 1..nest.len() {
            self.close()?;
        }
        self.line(format!("if (++kf_ws{0} == {stages}) kf_ws{0} = 0;", l.0))
    }

    /// The ops in ring loop `l`'s nest that compute its loads' `roots`
    /// ([`nest_closure`]), in program order.
    pub(super) fn ring_closure(&self, l: LoopId, nest: &[LoopId], roots: fn(&Kernel, ValueId) -> Vec<ValueId>) -> Vec<kfuse_ir::OpId> {
        let k = self.k;
        let loops = enclosing_loops(k);
        let mut all = std::collections::BTreeSet::new();
        for &v in &self.wg.as_ref().unwrap().rings[&l] {
            for r in roots(k, v) {
                all.extend(nest_closure(k, &loops, r, nest).unwrap_or_default());
            }
        }
        let mut ops: Vec<kfuse_ir::OpId> = all.into_iter().collect();
        ops.sort_by_key(|&o| k.position(o));
        ops
    }

    /// Writes `closure` again with each loop's index of `binds` bound to its C
    /// expression (in a block the caller opened, whose names shadow the iteration's
    /// own); returns the values it replaced, for [`Emitter::restore`].
    pub(super) fn bind_closure(&mut self, binds: &[(LoopId, String)], closure: &[kfuse_ir::OpId]) -> Result<Vec<(ValueId, Option<Val>)>, crate::CodegenError> {
        let mut saved = Vec::new();
        let k = self.k;
        for (l, at) in binds {
            // (an index no address reads has no op)
            if let Some(iv) = k.ops().find(|&o| matches!(k.op(o), Op::LoopIndex { id } if id == l)).map(|o| o.value()) {
                saved.push((iv, self.vals.remove(&iv)));
                let val = Val { name: format!("({at})"), dtype: kfuse_ir::DType::I64, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None };
                self.vals.insert(iv, val);
            }
        }
        for &op in closure {
            saved.push((op.value(), self.vals.remove(&op.value())));
            self.op_unlocated(op)?;
        }
        Ok(saved)
    }

    /// Puts back the values [`Emitter::bind_closure`] replaced.
    pub(super) fn restore(&mut self, saved: Vec<(ValueId, Option<Val>)>) {
        for (v, x) in saved.into_iter().rev() {
            match x {
                Some(x) => self.vals.insert(v, x),
                None => self.vals.remove(&v),
            };
        }
    }

    /// At a ring load inside its loop: the first one of the loop waits for this step's
    /// copies and fetches the step `stages - 1` ahead; each records its value's valid
    /// range.
    pub(super) fn ring_arrive(&mut self, v: ValueId, l: LoopId) -> R {
        let loads = self.wg.as_ref().unwrap().rings[&l].clone();
        if loads[0] == v && self.ws.is_some() {
            // the stage's copies have landed: fence them against WGMMA's async proxy
            self.line(format!("kf_mbar_wait(KF_FULL(kf_st{0}), (kf_rit / {1}) & 1);", l.0, self.wg.as_ref().unwrap().stages))?;
            if self.ws.as_ref().is_some_and(|ws| ws.tma.is_empty() || ws.gathered) {
                // (TMA's writes are the async proxy's already)
                self.line("kf_proxy_fence();")?;
            }
            // (the wait orders the copies, not the consumers' own writes to a tile staged
            // from registers: after those `wg_dirty` stands, and the dot's barrier follows)
            if !self.wg_staged {
                self.wg_dirty = false;
            }
        } else if loads[0] == v {
            // one barrier a step: after it every thread's copies of this step have
            // landed and every thread is past the step before, whose instructions read
            // the stage the next copies fill (a group a step: at most `stages - 2`
            // younger ones pending)
            let stages = self.wg.as_ref().unwrap().stages;
            self.line(format!("kf_cp_async_wait<{}>();", stages - 2))?;
            // (against WGMMA's async proxy; `ldmatrix` reads are generic)
            if self.wg.as_ref().unwrap().async_proxy {
                self.line("kf_proxy_fence();")?;
            }
            // the copies (and, `shadow_tables`, the row tables of the step after theirs)
            // wait for the step's first WGMMA instructions to be issued
            // (`take_pending_fetch`): they are written while the tensor cores run
            let nest = self.nest_of(l);
            let shadow = self.shadow_tables();
            if !shadow {
                self.fetch_tables(l, &nest)?;
            }
            self.line(self.barrier)?;
            let mut w = super::Writer::beside(String::new(), &self.w);
            std::mem::swap(&mut self.w, &mut w);
            let copies = self.fetch_copies(l, &nest).and_then(|_| if shadow { self.fetch_tables(l, &nest) } else { Ok(()) });
            std::mem::swap(&mut self.w, &mut w);
            copies?;
            self.pending_fetch = Some(w.finish());
            self.wg_synced = true;
            self.wg_dirty = false;
            self.wg_staged = false;
        }
        let (_, _, his) = self.ring_addr(v, l, &super::loops::index_var(l))?;
        let layout = self.layout(v)?;
        let map = crate::layout::RegMap::of(&layout);
        let shape = concrete_shape(self.k, self.k.ty(v));
        // (a tile the tensor holds whole wherever the load runs: its extents, known here)
        let his: Vec<String> = if super::load_whole(self.k, self.spec, &self.grid, v) {
            shape.iter().map(u32::to_string).collect()
        } else {
            his.into_iter()
                .map(|h| {
                    let n = self.fresh("kf_rb");
                    self.line(format!("const long long {n} = {h};")).map(|_| n)
                })
                .collect::<Result<_, _>>()?
        };
        let name = format!("v{}", v.index());
        self.vals.insert(v, Val { name, dtype: self.k.ty(v).dtype, map, axis_map: vec![Some(0), Some(1)], shape, lo: vec!["0".into(), "0".into()], hi: his, lazy: None });
        Ok(())
    }

    /// The next step's copies a ring load deferred ([`Emitter::ring_arrive`]), written
    /// here (after a dot's WGMMA instructions are issued, or at the loop's end).
    pub(super) fn take_pending_fetch(&mut self) -> R {
        match self.pending_fetch.take() {
            Some(text) => self.w.raw(&text).map_err(|_| crate::CodegenError::Unsupported("formatting failed".into())),
            None => Ok(()),
        }
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
                AccessDim::Tile(e) if super::whole_axis(k, self.spec, *e, ops[d], p.dims()[d]) => his.push(format!("{}LL", extent_value(k, *e))),
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

    /// Whether a gathered ring load of loop `l` has index tiles computed in its nest
    /// (its row tables, one a stage, are written again for each step; otherwise one is
    /// written once, before the nest).
    fn tables_move(&self, l: LoopId) -> bool {
        let loops = enclosing_loops(self.k);
        let nest = self.nest_of(l);
        self.wg.as_ref().unwrap().rings[&l]
            .iter()
            .flat_map(|&v| gather_roots(self.k, v).unwrap_or_default())
            .any(|(_, x)| nest_closure(self.k, &loops, x, &nest).is_some_and(|c| !c.is_empty()))
    }

    /// Declares the row tables of loop `l`'s gathered ring loads, `tables` of each
    /// (`kf_gt{load}[table][row]`: each row's element offset in the tensor, from the
    /// rank-1 index tiles the load is broadcast from, or [`NO_ROW`] for a row outside
    /// it); returns whether there are any.
    pub(super) fn ring_gather_tables(&mut self, loads: &[ValueId], tables: u32) -> Result<bool, crate::CodegenError> {
        let mut any = false;
        for &v in loads {
            if gather_roots(self.k, v).is_some_and(|g| !g.is_empty()) {
                let rows = self.wg.as_ref().unwrap().eager[&v].rows;
                let (ty, _, bytes) = self.row_table(v);
                self.line(format!("__shared__ {ty} kf_gt{}[{tables}][{rows}];", v.index()))?;
                self.ring_table_bytes += tables * rows * bytes;
                any = true;
            }
        }
        Ok(any)
    }

    /// Each thread's rows of the gathered ring loads' table `table`: a row's offset, the
    /// sum of its coordinates times the strides, where every coordinate is inside its
    /// dimension.
    pub(super) fn write_gather_tables(&mut self, loads: &[ValueId], table: &str) -> R {
        for &v in loads {
            let gather = gather_roots(self.k, v).unwrap_or_default();
            let Some(&(_, x0)) = gather.first() else { continue };
            let Op::Load { tensor, .. } = self.k.op(v.op()) else { unreachable!() };
            let tdims = self.k.tensor_dims(*tensor);
            let xv = self.val(x0).clone();
            let unsupported = |what: &str| crate::CodegenError::Unsupported(format!("a gathered ring load's index tiles {what}"));
            let map = xv.map.clone().ok_or_else(|| unsupported("in a uniform layout"))?;
            let axis = xv.axis_map.first().copied().flatten().ok_or_else(|| unsupported("without their axis"))?;
            if gather.iter().any(|&(_, x)| self.val(x).map != xv.map || self.val(x).axis_map != xv.axis_map) {
                return Err(unsupported("in different layouts"));
            }
            self.unroll("k", map.regs)?;
            // (with 32-bit offsets each in-bounds coordinate is below 2^31 and the row's
            // offset too: the sum of the truncated products is exact where it is kept)
            let (ty, no_row, bytes) = self.row_table(v);
            let cast = if bytes == 4 { "(unsigned)" } else { "" };
            self.line(format!("{ty} kf_o = 0;"))?;
            self.line("bool kf_in = true;")?;
            for &(d, x) in &gather {
                let (n, st) = (self.shape_var(tdims[d]), self.stride(*tensor, d));
                self.line(format!("{{ const long long x = {}; kf_in = kf_in && (unsigned long long)x < (unsigned long long){n}; kf_o += {cast}x * {cast}{st}; }}", self.reg(x, "k")))?;
            }
            self.line(format!("kf_gt{}[{table}][{}] = kf_in ? kf_o : {no_row};", v.index(), super::coord(&map, axis, "k")))?;
            self.close()?;
        }
        Ok(())
    }

    /// The copies of a gathered tile: each 16-byte chunk of a row from the row's offset
    /// (its table `table`), zeros for a row outside the tensor.
    fn gathered_copy(&mut self, v: ValueId, t: &SmemTile, tid: &str, threads: u32, stage: &str, table: &str) -> R {
        let (cols, rows, e) = (t.cols, t.rows, t.esize);
        let ce = 16 / e;
        let per_row = cols / ce;
        // a thread copies `cpt` adjacent 16-byte pieces of a row (one table read and
        // test for them), its `per_row / cpt` threads a row side by side
        let cpt = if per_row.is_multiple_of(GATHER_PIECES) { GATHER_PIECES } else { 1 };
        let tr = per_row / cpt;
        let rs = threads / tr.max(1);
        if threads.is_multiple_of(tr) && rs.is_multiple_of(8) && rows.is_multiple_of(rs) {
            // each thread copies the same pieces of rows `rs` apart (whole swizzle
            // periods): their bytes and swizzled places are computed once, and each row
            // reads its offset and adds a constant to the places; a piece past the
            // tensor's last column copies nothing, from the row's start
            self.line(format!("const int kf_r0 = {tid} / {tr}, kf_c = ({tid} % {tr}) * {};", cpt * ce))?;
            for j in 0..cpt {
                let c = format!("(kf_c + {})", j * ce);
                self.line(format!("const unsigned kf_nb{j} = (unsigned)(kf_vc - {c} < 0 ? 0 : kf_vc - {c} > {ce} ? {ce} : kf_vc - {c}) * {e}u;"))?;
                self.line(format!("const int kf_pc{j} = kf_nb{j} != 0u ? {} : 0;", j * 16))?;
                self.line(format!("const unsigned kf_d{j} = {};", self.ops_saddr(&format!("{} + {stage} * {} + {}", t.off, t.bytes(), t.at("kf_r0", &c)))))?;
            }
            // (a thread whose first piece is past the last column reads from the rows' start)
            self.line("const char* kf_gb = (const char*)(kf_nb0 != 0u ? kf_src + kf_c : kf_src);")?;
            self.unroll("it", rows / rs)?;
            let (ty, no_row, bytes) = self.row_table(v);
            self.line(format!("const {ty} kf_go = kf_gt{}[{table}][kf_r0 + it * {rs}];", v.index()))?;
            self.line(format!("const bool kf_ok = kf_go != {no_row};"))?;
            // (a 32-bit offset's bytes may pass 2^32: widened before the multiply)
            let go = if bytes == 4 { "(unsigned long long)kf_go" } else { "kf_go" };
            self.line(format!("const char* kf_g = kf_ok ? kf_gb + {go} * {e} : (const char*)kf_src;"))?;
            for j in 0..cpt {
                self.line(format!("kf_cp_async16(kf_d{j} + it * {}u, kf_g + kf_pc{j}, kf_ok ? kf_nb{j} : 0u);", rs * t.span))?;
            }
            return self.close();
        }
        self.line("#pragma unroll")?;
        self.open(format!("for (int q = {tid}; q < {}; q += {threads})", rows * per_row))?;
        self.line(format!("const int r = q / {per_row}, c = (q % {per_row}) * {ce};"))?;
        let (ty, no_row, _) = self.row_table(v);
        self.line(format!("const {ty} kf_go = kf_gt{}[{table}][r];", v.index()))?;
        self.line(format!("const int kf_n = kf_go != {no_row} ? (kf_vc - c < 0 ? 0 : kf_vc - c > {ce} ? {ce} : kf_vc - c) : 0;"))?;
        let at = t.at("r", "c");
        let dst = self.ops_saddr(&format!("{} + {stage} * {} + {at}", t.off, t.bytes()));
        self.line(format!("kf_cp_async16({dst}, kf_n > 0 ? kf_src + kf_go + c : kf_src, (unsigned)(kf_n * {e}));"))?;
        self.close()
    }

    /// The copies of load `v`'s tile at loop index `idx` into ring stage `stage`.
    pub(super) fn ring_copy(&mut self, v: ValueId, l: LoopId, idx: &str, stage: &str) -> R {
        let t = self.wg.as_ref().unwrap().eager[&v].clone();
        let (base, _, his) = self.ring_addr(v, l, idx)?;
        let Op::Load { tensor, .. } = self.k.op(v.op()) else { unreachable!() };
        let (row_dim, _) = ring_dims(self.k, self.spec, v).ok_or_else(|| crate::CodegenError::Unsupported("a ring load of a tensor with no unit-stride dimension".into()))?;
        let stride = self.stride(*tensor, row_dim);
        let (cols, rows, e) = (t.cols, t.rows, t.esize);
        // elements a 16-byte copy
        let ce = 16 / e;
        let chunks = rows * cols / ce;
        // the producer warpgroup's 128 threads (`warp_specialize`), or the block's
        let (tid, threads) = if self.producer {
            let (consumers, producers) = self.ws.as_ref().map_or((super::warp_specialize::CONSUMERS, super::warp_specialize::PRODUCER_THREADS), |ws| (ws.consumers, ws.producers));
            (format!("(kf_tid - {consumers})"), producers)
        } else {
            ("kf_tid".to_string(), self.k.schedule.num_threads)
        };
        let per_row = cols / ce;
        let gathered = gather_roots(self.k, v).is_some_and(|g| !g.is_empty());
        self.open("")?;
        // (the copies start at the tile's offsets: one before the tensor's start, which
        // a `cp.async` copy cannot mask, is a launch error, not a wrong answer)
        let Op::Load { dims, .. } = self.k.op(v.op()) else { unreachable!() };
        let ops = self.k.operands(v.op());
        for (d, &o) in dims.iter().zip(&ops) {
            if matches!(d, AccessDim::Tile(_)) && !non_negative(self.k, o) {
                let at = if matches!(self.k.op(o.op()), Op::LoopIndex { id } if *id == l) { idx.to_string() } else { self.val(o).name.clone() };
                self.line(format!("if ({at} < 0) __trap();  // a ring's tile before its tensor's start"))?;
            }
        }
        self.line(format!("const {}* kf_src = {base};", super::stype(self.k.ty(v).dtype)))?;
        if gathered {
            self.line(format!("const int kf_vc = (int)({});", his[1]))?;
            // (a producer warpgroup writes each step's table into its stage's, or each
            // step of the loops around the innermost into one of two: `table_slot`)
            let table = match (&self.table_slot, self.producer) {
                (Some(slot), true) => slot.clone(),
                (None, true) => stage.to_string(),
                _ if self.tables_move(l) => stage.to_string(),
                _ => "0".to_string(),
            };
            return self.gathered_copy(v, &t, &tid, threads, stage, &table).and_then(|_| self.close());
        }
        // the valid extents lie in [0, tile]: 32-bit from here on (`his` per value axis)
        self.line(format!("const int kf_vr = (int)({}), kf_vc = (int)({});", his[t.row_axis], his[t.col_axis]))?;
        // each thread copies the same columns of rows `rs` apart: its source pointer,
        // bytes and (where `rs` rows are whole swizzle periods) its swizzled place are
        // computed once, and each copy adds a constant
        let rs = threads / per_row.max(1);
        let step = rs.is_multiple_of(8).then_some(rs * t.span);
        match step {
            Some(step) if threads.is_multiple_of(per_row) && chunks.is_multiple_of(threads) => {
                let iters = chunks / threads;
                self.line(format!("const int kf_r0 = {tid} / {per_row}, kf_c = ({tid} % {per_row}) * {ce};"))?;
                self.line(format!("const char* kf_g = (const char*)(kf_src + (long long)kf_r0 * {stride} + kf_c);"))?;
                self.line(format!("const long long kf_gs = (long long){rs} * {stride} * {e};"))?;
                self.line(format!("const unsigned kf_d = {};", self.ops_saddr(&format!("{} + {stage} * {} + {}", t.off, t.bytes(), t.at("kf_r0", "kf_c")))))?;
                // a whole tile (every one but a loop's last): 16 bytes a copy, no checks
                self.open(format!("if (kf_vr >= {rows} && kf_vc >= {cols})"))?;
                self.unroll("it", iters)?;
                self.line(format!("kf_cp_async16(kf_d + it * {step}u, kf_g + it * kf_gs, 16u);"))?;
                self.close()?;
                self.close()?;
                self.open("else")?;
                self.line(format!("const unsigned kf_nb = (unsigned)(kf_vc - kf_c < 0 ? 0 : kf_vc - kf_c > {ce} ? {ce} : kf_vc - kf_c) * {e}u;"))?;
                self.unroll("it", iters)?;
                self.line(format!("const unsigned kf_n = kf_r0 + it * {rs} < kf_vr ? kf_nb : 0u;"))?;
                self.line(format!("kf_cp_async16(kf_d + it * {step}u, kf_n > 0 ? (const void*)(kf_g + it * kf_gs) : (const void*)kf_src, kf_n);"))?;
                self.close()?;
                self.close()?;
            }
            _ => {
                self.line("#pragma unroll")?;
                self.open(format!("for (int q = {tid}; q < {chunks}; q += {threads})"))?;
                self.line(format!("const int r = q / {per_row}, c = (q % {per_row}) * {ce};"))?;
                self.line(format!("const int kf_n = r < kf_vr ? (kf_vc - c < 0 ? 0 : kf_vc - c > {ce} ? {ce} : kf_vc - c) : 0;"))?;
                let at = t.at("r", "c");
                let dst = self.ops_saddr(&format!("{} + {stage} * {} + {at}", t.off, t.bytes()));
                self.line(format!("kf_cp_async16({dst}, kf_n > 0 ? kf_src + (long long)r * {stride} + c : kf_src, (unsigned)(kf_n * {e}));"))?;
                self.close()?;
            }
        }
        self.close()
    }
}

/// The `cp.async` helpers of kernels with a ring (`cp_async_helpers`).
pub(super) const RING_PRELUDE: &str = cp_async_helpers!();

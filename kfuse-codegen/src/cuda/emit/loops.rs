//! Writes a general `for` loop: a C `for` over the loop's index, its carried values in
//! registers declared before it, the body op by op.
//!
//! - `For { id, carried }`: each carried value gets storage in the layout of its init
//!   (`c<L>_<i>`: a register array, or one variable for a scalar), filled from the init;
//!   then `for (long long kf_i<L> = lo; kf_i<L> < hi; …)`. The increment stops at `hi`
//!   instead of stepping past it, so that `i + step` never overflows; a step that is not
//!   a positive constant is checked at run time (`__trap()`: a launch error, not a hang).
//! - `LoopIndex` is the loop variable; `LoopCarried` and `LoopResult` are views of the
//!   carried storage.
//! - `Yield` writes each next value into the storage (through temporaries where one next
//!   value is another carried value of the same loop) and closes the loop.
//! - A `dot` operand the plan writes to its tile from registers each step (one no copy
//!   engine reads; `Emitter::ahead_loads`) is loaded an iteration ahead: the first
//!   iteration's registers before the loop, the next iteration's at the top of the body
//!   (a second copy, in flight while this one computes), moved into place at `Yield`;
//!   the body's load op then reads the registers loaded for it.
//!
//! Valid ranges: a carried tile's range is its init's as long as every next value has
//! the same range expressions (the usual case: full tiles, or reductions of them). Where
//! a next value's range differs, the range must follow the iterations at run time (the
//! interpreter's rule: a carried value keeps the range it was yielded with); the writer
//! then records the carried value in [`Emitter::retry`] and the kernel is written again
//! with `long long` range variables for it (`c<L>_<i>_lo<a>`, `…_hi<a>`), set from the
//! init and at each `Yield`. Writing is deterministic, so this settles in a few rounds.
//!
//! `assign_layouts` has already converted every next value to its carried value's
//! layout; a mismatch here is an internal error, reported as such.

use kfuse_ir::{Literal, LoopId, Op, OpId, ValueId};

use super::{ctype, Emitter, Val, R};
use crate::CodegenError;

/// The carried tiles whose next value is computed from a `dot` of the loop's body (an
/// accumulator, `acc + dot(a, b)`): their valid range follows the operands' and is
/// written with range variables from the first pass (the writer would find it
/// differing at the `Yield` and write the kernel again). Not a dot whose operands are
/// loads of tiles their tensors hold whole (`whole(load)`, through casts): its range is
/// the tile's extents, the same every iteration (where it is not after all, the `Yield`
/// finds it and the kernel is written again).
pub(super) fn dot_carried(k: &kfuse_ir::Kernel, whole: impl Fn(ValueId) -> bool) -> std::collections::BTreeSet<(LoopId, u32)> {
    // an operand that is a whole load, cast or converted
    let whole_operand = |mut v: ValueId| loop {
        match k.op(v.op()) {
            Op::Cast { .. } | Op::Convert => v = k.operands(v.op())[0],
            Op::Load { .. } => return whole(v),
            _ => return false,
        }
    };
    let from_dot = |id: LoopId, v: ValueId| {
        let mut todo = vec![v];
        let mut seen = std::collections::BTreeSet::new();
        while let Some(x) = todo.pop() {
            if !seen.insert(x) || k.loop_of(x.op()) != Some(id) {
                continue;
            }
            match k.op(x.op()) {
                Op::Dot { .. } if !k.operands(x.op())[..2].iter().all(|&o| whole_operand(o)) => return true,
                Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Convert | Op::Broadcast | Op::ExpandDims { .. } => todo.extend(k.operands(x.op())),
                _ => {}
            }
        }
        false
    };
    k.ops()
        .filter_map(|o| match k.op(o) {
            Op::Yield { id } => Some((*id, o)),
            _ => None,
        })
        .flat_map(|(id, y)| k.operands(y).into_iter().enumerate().filter(move |&(_, v)| from_dot(id, v)).map(move |(i, _)| (id, i as u32)))
        .collect()
}

/// Most registers a thread the dot results of a loop and two copies of its loads
/// issued ahead may take (`Emitter::ahead_loads`).
const AHEAD_REGS: u32 = 128;

/// Most iterations of a loop nest the writer unrolls (`Emitter::unrolled_trips`): a
/// 7 × 7 filter's taps.
const UNROLLED_ITERATIONS: u64 = 64;

/// The name of loop `id`'s index variable.
pub(super) fn index_var(id: LoopId) -> String {
    format!("kf_i{}", id.0)
}

impl Emitter<'_> {
    /// `For`: the carried storage, then the loop header.
    pub(super) fn open_loop(&mut self, op: OpId, id: LoopId, carried: u32) -> R {
        let ops = self.k.operands(op);
        let (lo, hi, step) = (self.val(ops[0]).name.clone(), self.val(ops[1]).name.clone(), self.val(ops[2]).name.clone());
        let mut vals = Vec::new();
        for i in 0..carried as usize {
            let init = self.val(ops[3 + i]).clone();
            let name = format!("c{}_{i}", id.0);
            let ct = ctype(init.dtype);
            let val = match &init.map {
                None => {
                    self.line(format!("{ct} {name} = {};", init.name))?;
                    Val { name, lazy: None, ..init }
                }
                Some(map) => {
                    self.line(format!("{ct} {name}[{}];", map.regs))?;
                    self.unroll("k", map.regs)?;
                    self.line(format!("{name}[k] = {};", self.reg(ops[3 + i], "k")))?;
                    self.close()?;
                    let (mut lo_v, mut hi_v) = (init.lo.clone(), init.hi.clone());
                    if self.dynamic_ranges.contains(&(id, i as u32)) {
                        for a in 0..init.lo.len() {
                            let (l, h) = (format!("{name}_lo{a}"), format!("{name}_hi{a}"));
                            self.line(format!("long long {l} = {}, {h} = {};", init.lo[a], init.hi[a]))?;
                            lo_v[a] = l;
                            hi_v[a] = h;
                        }
                    }
                    Val { name, lo: lo_v, hi: hi_v, lazy: None, ..init }
                }
            };
            vals.push(val);
        }
        self.loops.insert(id, vals);
        if !self.positive_constant(ops[2]) {
            self.line(format!("if ({step} <= 0) __trap();  // a loop's step must be positive"))?;
        }
        let iv = index_var(id);
        // loads issued an iteration ahead: the first iteration's before the loop
        let heads = self.ahead_loads(id);
        let mut arrays = Vec::new();
        for (i, &v) in heads.iter().enumerate() {
            let regs = crate::layout::RegMap::of(&self.layout(v)?).map_or(1, |m| m.regs);
            let ct = ctype(self.k.ty(v).dtype);
            let (cur, nxt) = (format!("kf_la{}_{i}", id.0), format!("kf_lb{}_{i}", id.0));
            self.line(format!("{ct} {cur}[{regs}], {nxt}[{regs}];"))?;
            arrays.push((v, cur, nxt));
        }
        if !arrays.is_empty() {
            self.open(format!("if ({lo} < {hi})"))?;
            for (v, cur, _) in &arrays {
                self.load_ahead(id, *v, cur, &lo)?;
            }
            self.close()?;
        }
        self.loop_depth += 1;
        if let Some(trips) = self.unrolled_trips(id) {
            // a few iterations known here (a filter's taps): unrolled, each index a constant
            self.line(format!("#pragma unroll  // {trips} iterations"))?;
            let at = self.k.locs.get(&op).map_or(String::new(), |l| format!(" at line {}", l.line));
            let fixed = match self.k.op(ops[1].op()) {
                Op::ShapeDim { sym } => format!(" ({} = {} at this launch)", self.k.shape_name(*sym), self.spec.exact(*sym).unwrap_or(0)),
                _ => String::new(),
            };
            self.loop_notes.push(format!("loop{at}: unrolled, {trips} iterations{fixed}"));
            self.open(format!("for (long long {iv} = {lo}; {iv} < {hi}; {iv} += {step})"))?;
        } else {
            self.open(format!("for (long long {iv} = {lo}; {iv} < {hi}; {iv} = ({hi}) - {iv} > ({step}) ? {iv} + ({step}) : ({hi}))"))?;
        }
        if !arrays.is_empty() {
            // the next iteration's, in flight while this one runs; this one's are bound
            self.open(format!("if (({hi}) - {iv} > ({step}))"))?;
            for (v, _, nxt) in &arrays {
                self.load_ahead(id, *v, nxt, &format!("({iv} + ({step}))"))?;
            }
            self.close()?;
            for (v, cur, _) in &arrays {
                self.bind.insert(*v, cur.clone());
            }
            // (the plan says so: the load of `<tensor>` at line N)
            let names: Vec<String> = arrays
                .iter()
                .map(|(v, _, _)| {
                    let t = match self.k.op(v.op()) {
                        Op::Load { tensor, .. } => self.k.param(*tensor).name.clone(),
                        _ => v.to_string(),
                    };
                    match self.k.locs.get(&v.op()) {
                        Some(l) => format!("the load of `{t}` at line {}", l.line),
                        None => format!("the load of `{t}`"),
                    }
                })
                .collect();
            self.dot_notes.push(format!("{}: issued an iteration ahead (two register copies), its tile written from them each step", names.join(", ")));
            self.ahead.insert(id, arrays);
            self.ahead_used = true;
        }
        Ok(())
    }

    /// The loads of loop `id` issued one iteration ahead: a `dot` operand the plan
    /// stages where it is defined and no ring copies (an operand the copy engines cannot
    /// read, loaded to registers and written to its tile each step), in the loop's own
    /// body, at offsets that are the loop's index or values from before the loop — so
    /// that the next iteration's global loads are in flight while this one computes.
    /// Not in a kernel's later register-room attempts (`Spec::register_attempt`), which
    /// fall back to loading each step.
    fn ahead_loads(&self, id: LoopId) -> Vec<ValueId> {
        let k = self.k;
        if self.base_attempt() > 0 {
            return Vec::new();
        }
        let Some(info) = k.loop_info(id) else { return Vec::new() };
        let pos = |o: OpId| k.order.iter().position(|&x| x == o);
        let start = pos(info.for_op);
        // the operands a plan stages with no ring; without a plan, those of the FMA
        // rule on runs of 4 (`dot.rs`), which it writes to shared memory at the dot
        let staged: Vec<ValueId> = match self.wg.as_ref() {
            Some(p) => p.eager.iter().filter(|(_, t)| t.ring.is_none()).map(|(v, _)| *v).collect(),
            None => k
                .ops()
                .filter(|&d| matches!(k.op(d), Op::Dot { .. }) && self.fma_runs(d).is_some())
                .flat_map(|d| k.operands(d).into_iter().take(2))
                .filter(|&v| k.users(v).iter().all(|&u| matches!(k.op(u), Op::Dot { .. }) && self.fma_runs(u).is_some()))
                .collect(),
        };
        let mut heads: Vec<ValueId> = staged
            .into_iter()
            .filter(|v| k.loop_of(v.op()) == Some(id))
            .filter(|v| matches!(k.op(v.op()), Op::Load { dims, .. } if !dims.iter().any(kfuse_ir::AccessDim::is_gather)))
            .filter(|v| {
                k.operands(v.op()).iter().all(|o| matches!(k.op(o.op()), Op::LoopIndex { id: l } if *l == id) || pos(o.op()) < start)
            })
            .collect();
        heads.sort();
        heads.dedup();
        // (registers: the loop's dot results and two copies of each such load, a thread,
        // within AHEAD_REGS; beyond it the copies spilled: 44–1448 bytes on sm_90a with
        // a 128x256 accumulator, 24–432 on sm_80)
        let threads = k.schedule.num_threads.max(1);
        let elems = |v: ValueId| crate::analysis::concrete_shape(k, k.ty(v)).iter().product::<u32>() / threads;
        let dots: u32 = k.ops().filter(|&o| k.loop_of(o) == Some(id) && matches!(k.op(o), Op::Dot { .. })).map(|o| elems(o.value())).sum();
        let staged: u32 = heads.iter().map(|&v| elems(v)).sum();
        if dots + 2 * staged > AHEAD_REGS {
            return Vec::new();
        }
        heads
    }

    /// Whether load value `v`'s registers were loaded by the iteration before (an open
    /// loop's [`Self::ahead_loads`]): the load is not issued again.
    pub(super) fn loaded_ahead(&self, v: ValueId) -> bool {
        self.ahead.values().flatten().any(|(x, _, _)| *x == v)
    }

    /// Writes load `v` of loop `id` into the registers of array `arr` as the iteration
    /// whose index is `index` would (a scope of its own; nothing staged).
    fn load_ahead(&mut self, id: LoopId, v: ValueId, arr: &str, index: &str) -> R {
        let k = self.k;
        let iv = k.ops().find(|&o| matches!(k.op(o), Op::LoopIndex { id: l } if *l == id)).map(|o| o.value());
        let saved = (iv.and_then(|x| self.vals.get(&x).cloned()), self.vals.get(&v).cloned());
        if let Some(x) = iv {
            self.vals.insert(x, Val { name: index.to_string(), dtype: kfuse_ir::DType::I64, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None });
        }
        self.bind.insert(v, arr.to_string());
        self.prefetching = true;
        self.open("")?;
        let r = self.op(v.op());
        self.close()?;
        self.prefetching = false;
        self.bind.remove(&v);
        for (x, s) in iv.into_iter().map(|x| (x, saved.0.clone())).chain([(v, saved.1)]) {
            match s {
                Some(val) => self.vals.insert(x, val),
                None => self.vals.remove(&x),
            };
        }
        r
    }

    /// Whether `v` is a positive compile-time constant (a tile extent or a literal).
    /// The trip count of loop `id` where the writer unrolls it: the loop and every loop
    /// in its body have constant trip counts ([`Emitter::constant_trips`]) whose product
    /// is at most [`UNROLLED_ITERATIONS`], and the body has no `dot` (whose loops the
    /// pipelining passes shape).
    fn unrolled_trips(&self, id: LoopId) -> Option<u64> {
        let info = self.k.loop_info(id)?;
        let bounds = |f: OpId| {
            let o = self.k.operands(f);
            self.constant_trips(o[0], o[1], o[2])
        };
        let trips = bounds(info.for_op)?;
        let mut total = trips;
        for &o in &self.k.order[info.for_pos + 1..info.yield_pos] {
            match self.k.op(o) {
                Op::For { .. } => total = total.saturating_mul(bounds(o)?),
                Op::Dot { .. } => return None,
                _ => {}
            }
        }
        (total <= UNROLLED_ITERATIONS).then_some(trips)
    }

    /// The trip count of a loop whose bounds and step are compile-time values (a
    /// literal, a tile extent, a shape symbol the kernel is compiled for:
    /// `Spec::shape_exact`), where it is 1 to [`crate::target::SMALL_TRIP`].
    fn constant_trips(&self, lo: ValueId, hi: ValueId, step: ValueId) -> Option<u64> {
        let value = |v: ValueId| match self.k.op(v.op()) {
            Op::ShapeDim { sym } => self.spec.exact(*sym).map(|x| x as i64),
            _ => crate::analysis::int_value(self.k, v),
        };
        let (l, h, s) = (value(lo)?, value(hi)?, value(step)?);
        let trips = if s > 0 && h > l { ((h - l) as u64).div_ceil(s as u64) } else { 0 };
        (1..=crate::target::SMALL_TRIP).contains(&trips).then_some(trips)
    }

    fn positive_constant(&self, v: ValueId) -> bool {
        match self.k.op(v.op()) {
            Op::TileExtent { .. } => true,
            Op::Const { value: Literal::Int(i) } => *i > 0,
            _ => false,
        }
    }

    /// `LoopIndex`, `LoopCarried`, `LoopResult`: names for what `open_loop` declared.
    pub(super) fn loop_value(&mut self, v: ValueId) -> R {
        let val = match *self.k.op(v.op()) {
            Op::LoopIndex { id } => Val { name: index_var(id), dtype: kfuse_ir::DType::I64, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None },
            Op::LoopCarried { id, index } | Op::LoopResult { id, index } => self.carried(id, index)?,
            _ => unreachable!("loop_value of a non-loop op"),
        };
        self.vals.insert(v, val);
        Ok(())
    }

    fn carried(&self, id: LoopId, index: u32) -> Result<Val, CodegenError> {
        self.loops
            .get(&id)
            .and_then(|c| c.get(index as usize))
            .cloned()
            .ok_or_else(|| CodegenError::Unsupported(format!("carried value {index} of loop {id} before its `for`")))
    }

    /// `Yield`: the next values into the carried storage, then the loop's end.
    pub(super) fn close_loop(&mut self, op: OpId, id: LoopId) -> R {
        // the next iteration's loads become this one's
        for (v, cur, nxt) in self.ahead.remove(&id).unwrap_or_default() {
            let regs = crate::layout::RegMap::of(&self.layout(v)?).map_or(1, |m| m.regs);
            self.unroll("k", regs)?;
            self.line(format!("{cur}[k] = {nxt}[k];"))?;
            self.close()?;
            self.bind.remove(&v);
        }
        let next = self.k.operands(op);
        // next values that are carried values of this loop are read before any is written
        let mut copies = Vec::new();
        for (i, &n) in next.iter().enumerate() {
            let dst = self.carried(id, i as u32)?;
            let src = self.val(n).clone();
            if src.name == dst.name {
                continue; // carried through unchanged
            }
            if src.map != dst.map {
                return Err(CodegenError::Unsupported(format!(
                    "internal: the next value of carried value {i} of loop {id} is in another layout than the carried value"
                )));
            }
            let reads_carried = matches!(self.k.op(n.op()), Op::LoopCarried { id: l, .. } if *l == id);
            let from = if reads_carried {
                let t = self.fresh("kf_next");
                self.copy_regs(&t, &src, n, true)?;
                Some(t)
            } else {
                None
            };
            copies.push((i, n, dst, src, from));
        }
        for (i, n, dst, src, from) in copies {
            match &from {
                Some(t) => self.copy_named(&dst, t)?,
                None => self.copy_regs(&dst.name, &src, n, false)?,
            }
            if dst.map.is_some() {
                self.next_ranges(id, i as u32, &dst, &src)?;
            }
        }
        self.loop_depth -= 1;
        self.close()
    }

    /// `dst = src` register by register (`declare`: a new array or variable).
    fn copy_regs(&mut self, dst: &str, src: &Val, v: ValueId, declare: bool) -> R {
        let ct = ctype(src.dtype);
        match &src.map {
            None if declare => self.line(format!("const {ct} {dst} = {};", src.name)),
            None => self.line(format!("{dst} = {};", src.name)),
            Some(map) => {
                if declare {
                    self.line(format!("{ct} {dst}[{}];", map.regs))?;
                }
                self.unroll("k", map.regs)?;
                self.line(format!("{dst}[k] = {};", self.reg(v, "k")))?;
                self.close()
            }
        }
    }

    /// Carried storage `dst` from the temporary `t` of the same shape.
    fn copy_named(&mut self, dst: &Val, t: &str) -> R {
        match &dst.map {
            None => self.line(format!("{} = {t};", dst.name)),
            Some(map) => {
                self.unroll("k", map.regs)?;
                self.line(format!("{}[k] = {t}[k];", dst.name))?;
                self.close()
            }
        }
    }

    /// The valid range of carried tile `index` after a `Yield` of `src`: the range
    /// variables are set, or, where the range is kept as the init's expressions and
    /// `src` has others, the kernel is marked to be written again with variables.
    fn next_ranges(&mut self, id: LoopId, index: u32, dst: &Val, src: &Val) -> R {
        if self.dynamic_ranges.contains(&(id, index)) {
            for a in 0..dst.lo.len() {
                self.line(format!("{} = {}; {} = {};", dst.lo[a], src.lo[a], dst.hi[a], src.hi[a]))?;
            }
        } else if dst.lo != src.lo || dst.hi != src.hi {
            self.retry.insert((id, index));
        }
        Ok(())
    }
}

//! A loop's last WGMMA dot issued one iteration late, so that it runs under the math of
//! the next iteration (sm_90a, warp-specialized rings): flash attention's `P·V` under
//! the next tile's softmax, the intra-warpgroup overlap of FlashAttention-3 (arXiv
//! 2407.08608, §3.2).
//!
//! It applies ([`late_dot`]) to a ring loop of two or more WGMMA dots whose last dot
//! completes in the next iteration already ([`super::warp_specialize::WsPlan::deferred`]),
//! takes A from registers and B from this loop's ring, and accumulates into one carried
//! value. Where that dot stands, its operands are made ready but it is not issued: A's
//! packed words go to a carried array (`kf_dw<L>`), B's descriptor at this iteration's
//! stage to `kf_dd<L>`, and its accumulator (started at its addend, `acc · alpha`) is
//! yielded as the carried value. Then:
//! - the next iteration issues it right after its own first dot (where the ring is
//!   split, `warp_specialize::RingSplit`, after waiting for its stage's second group),
//!   onto the carried registers, as a group of its own; the first dot's wait leaves that
//!   group in flight (`wgmma.wait_group 1`), so that it runs while the iteration
//!   computes on the first dot's value;
//! - the iteration waits for it, and releases the ring stage it read, just before the
//!   first op that reads the carried value (or the dot itself, whichever comes first);
//! - after the loop, the last iteration's dot is issued and waited for, unless a later
//!   sibling loop continues the chain ([`chain_loops`]) and issues it in its first
//!   iteration.
//!
//! Where the consumer warpgroups take turns at the tensor cores (`warp_specialize`), a
//! turn is an iteration's first dot and the late dot of the iteration before
//! ([`Emitter::late_turn_before`], [`Emitter::late_turn_after`]).
//!
//! The consumers hold the late dot's words through the math, so they rise to 240
//! registers (the producer keeps 24). It is the kernel's first register-room attempt
//! (the first two where the first takes the shared addresses once,
//! `warp_specialize::takes_addresses_once`): where the assembler spills it, the next
//! attempt writes the loops without late dots (`ws_plan`'s `overlap`). A dot whose accumulator holds more than [`MAX_ACC_REGS`]
//! registers a thread is not issued late. H100, `kfuse::ops::attention` bf16 (NOTES.md
//! a20): D128 S4096 527–533 → 544–555 TFLOP/s, S16384 586–599 → 612–628; D64 unchanged.

use kfuse_ir::{Kernel, LoopId, Op, OpId};

use super::dot_wgmma::{ASrc, WgDot, WgPlan};
use super::{Emitter, R};

/// A loop's dot issued in the next iteration (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LateDot {
    /// The body's first WGMMA dot, after whose instructions the late dot's are issued.
    pub first: OpId,
    /// The late dot (the body's last).
    pub dot: OpId,
    /// The carried value it accumulates into.
    pub carried: u32,
    /// The op before which the iteration waits for it.
    pub wait_at: OpId,
    /// 32-bit words of its packed A operand a thread holds.
    pub words: u32,
    /// The sibling loop before whose last late dot this loop's first iteration issues
    /// (see [`chain_loops`]).
    pub chain: Option<LoopId>,
    /// A later sibling loop issues this loop's last late dot: none after the loop.
    pub chained: bool,
}

/// Most accumulator registers a thread of a late dot: H100, flash attention at D256
/// (a 64 × 256 accumulator a warpgroup, 128 registers a thread), its four rows in one
/// call, ran 13–24% slower with the late `P·V` (368–419 TFLOP/s against 470–545);
/// D128 (64) and D64 (32) gain or hold.
const MAX_ACC_REGS: u32 = 64;

/// Loop `l`'s last dot `last` as a late dot, where the rule applies (see the module
/// docs); `first` is the body's first WGMMA dot, and `last`'s wait is already deferred.
pub(super) fn late_dot(k: &Kernel, p: &WgPlan, l: LoopId, first: OpId, last: OpId) -> Option<LateDot> {
    let d = p.dots.get(&last)?;
    if first == last || !matches!(d.a, ASrc::Regs) || d.b_tile().ring != Some(l) || d.mma.is_some() || d.m * d.n / (128 * d.groups) > MAX_ACC_REGS {
        return None;
    }
    let info = k.loop_info(l)?;
    let mut v = last.value();
    if let [u] = k.users(v).as_slice() {
        if matches!(k.op(*u), Op::Binary(kfuse_ir::BinaryOp::Add)) {
            v = u.value();
        }
    }
    let yielded: Vec<usize> = k.operands(info.yield_op).iter().enumerate().filter(|(_, &o)| o == v).map(|(i, _)| i).collect();
    let [i] = yielded[..] else { return None };
    let c = info.carried_values.get(i).copied().flatten()?;
    let pos = |op: OpId| k.order.iter().position(|&o| o == op);
    let wait_at = k.users(c).into_iter().chain([last]).min_by_key(|&u| pos(u))?;
    let words = d.m * d.kk / (128 * d.groups) / 2;
    Some(LateDot { first, dot: last, carried: i as u32, wait_at, words, chain: None, chained: false })
}

/// Sibling loops with late dots of one shape, the later one's carried value starting at
/// the earlier one's result (flash attention's masked and unmasked key ranges): the
/// earlier loop's last late dot is issued by the later loop's first iteration instead of
/// after the earlier loop, so that it too runs under the next tile's math. It applies
/// where the earlier loop's result is read by the later loop's `for` alone.
pub(super) fn chain_loops(k: &Kernel, p: &WgPlan, late: &mut std::collections::BTreeMap<LoopId, LateDot>) {
    let loops: Vec<LoopId> = late.keys().copied().collect();
    for l in loops {
        let (ld, info) = (&late[&l], k.loop_info(l).unwrap());
        let init = k.operands(info.for_op)[3 + ld.carried as usize];
        let Op::LoopResult { id: l0, index } = *k.op(init.op()) else { continue };
        let Some(ld0) = late.get(&l0) else { continue };
        let shape = |d: &WgDot| (d.m, d.n, d.kk, d.groups, d.a_mn, d.b_mn, d.dtype, d.b_tile().rows, d.b_tile().cols, d.b_tile().span);
        if index == ld0.carried && k.users(init) == [info.for_op] && shape(&p.dots[&ld0.dot]) == shape(&p.dots[&ld.dot]) {
            late.get_mut(&l).unwrap().chain = Some(l0);
            late.get_mut(&l0).unwrap().chained = true;
        }
    }
}

impl Emitter<'_> {
    /// The loop with a late dot that `is` picks, and that dot.
    fn late_where(&self, is: impl Fn(&LateDot) -> bool) -> Option<(LoopId, LateDot)> {
        self.ws.as_ref()?.late.iter().find(|(_, d)| is(d)).map(|(l, d)| (*l, d.clone()))
    }

    /// The loop whose late dot `op` is.
    pub(super) fn late_dot_of(&self, op: OpId) -> Option<(LoopId, LateDot)> {
        self.late_where(|d| d.dot == op)
    }

    /// The loop whose first dot `op` is, where that loop has a late dot.
    pub(super) fn late_first_of(&self, op: OpId) -> Option<(LoopId, LateDot)> {
        self.late_where(|d| d.first == op)
    }

    /// Before loop `l` opens (after its ring's counters): the late dot's carried
    /// operands (set by each iteration before the next reads them), or, chained, the
    /// earlier loop's pending one with its stage.
    pub(super) fn late_decls(&mut self, l: LoopId) -> R {
        let Some(ld) = self.ws.as_ref().and_then(|ws| ws.late.get(&l)).cloned() else { return Ok(()) };
        self.line(format!("unsigned kf_dw{}[{}];", l.0, ld.words))?;
        self.unroll("k", ld.words)?;
        match ld.chain {
            Some(l0) => self.line(format!("kf_dw{}[k] = kf_dw{}[k];", l.0, l0.0))?,
            None => self.line(format!("kf_dw{}[k] = 0u;", l.0))?,
        }
        self.close()?;
        match ld.chain {
            Some(l0) => {
                self.line(format!("unsigned long long kf_dd{} = kf_dd{};", l.0, l0.0))?;
                self.line(format!("kf_rel{} = kf_rel{};", l.0, l0.0))
            }
            None => self.line(format!("unsigned long long kf_dd{} = 0;", l.0)),
        }
    }

    /// Where the late dot stands (after its accumulator took its addend): its packed
    /// words `packed` and B's descriptor at this stage into the carried operands.
    pub(super) fn defer_issue(&mut self, l: LoopId, d: &WgDot, packed: &str) -> R {
        let words = self.ws.as_ref().unwrap().late[&l].words;
        self.unroll("k", words)?;
        self.line(format!("kf_dw{}[k] = {packed}[k];", l.0))?;
        self.close()?;
        let (base, _) = self.b_desc(d);
        self.line(format!("kf_dd{} = {base};", l.0))
    }

    /// The late dot of loop `l`'s iteration before (none in the first: `kf_rel<L>` is
    /// -1), issued onto the carried value and committed as its own group; where there
    /// is none, an empty group. (Each path commits: with the commit after the branch,
    /// ptxas fenced the registers there and serialized every instruction, C7520.)
    fn issue_late(&mut self, l: LoopId, ld: &LateDot) -> R {
        let d = self.wg_rule(ld.dot).unwrap();
        let (fname, text) = super::dot_wgmma::instr_fn(&d, true)?;
        self.helpers.insert(fname.clone(), text);
        let acc = self.loops[&l][ld.carried as usize].name.clone();
        self.open(format!("if (kf_rel{} >= 0)", l.0))?;
        self.late_second_wait(l)?;
        self.line("kf_wg_fence();")?;
        self.issue_from(&d, &fname, &acc, &format!("kf_dw{}", l.0), &format!("kf_dd{}", l.0))?;
        self.line("kf_wg_commit();")?;
        self.close()?;
        // (an empty group where there is none: the wait after the first dot leaves one)
        self.open("else")?;
        self.line("kf_wg_commit();")?;
        self.close()
    }

    /// After the first dot of a loop with a late dot issued and committed: the late dot
    /// of the iteration before.
    pub(super) fn late_after_first(&mut self, op: OpId) -> R {
        match self.late_first_of(op) {
            Some((l, ld)) => self.issue_late(l, &ld),
            None => Ok(()),
        }
    }

    /// Before op `op`: where the late dot's group is waited for, the wait and the stage's
    /// release. (The assembler orders the accumulator's reads after the wait; operand
    /// fences there, `asm volatile("" : "+f"(acc[k]))`, measured 1–2% slower at D128.)
    pub(super) fn late_wait(&mut self, op: OpId) -> R {
        let Some((l, _)) = self.late_where(|d| d.wait_at == op) else { return Ok(()) };
        self.late_done(l)
    }

    /// Before the late dot of the iteration before issues, where loop `l`'s ring is split
    /// (`warp_specialize::RingSplit`): the wait for its stage's second group, filled
    /// for the iteration before (the ring counter has moved on once since).
    fn late_second_wait(&mut self, l: LoopId) -> R {
        if !self.ws.as_ref().is_some_and(|ws| ws.split.contains_key(&l)) {
            return Ok(());
        }
        let stages = self.wg.as_ref().unwrap().stages;
        self.line(format!("kf_mbar_wait(KF_FULL({stages} + kf_rel{0}), ((kf_rit - 1) / {stages}) & 1);", l.0))
    }

    fn late_done(&mut self, l: LoopId) -> R {
        self.line("kf_wg_wait();")?;
        self.line(format!("if (kf_rel{0} >= 0) kf_mbar_arrive(KF_EMPTY({1}));", l.0, self.rel_slot(l, &format!("kf_rel{}", l.0))))
    }

    /// After loop `l` closes: its last iteration's late dot, issued and waited for, all
    /// under one branch (no instruction in flight on one path only where the paths
    /// meet: ptxas otherwise adds a fence there and serializes the instructions).
    /// Returns whether the loop has one.
    pub(super) fn late_flush(&mut self, l: LoopId) -> Result<bool, crate::CodegenError> {
        let Some(ld) = self.ws.as_ref().and_then(|ws| ws.late.get(&l)).cloned() else { return Ok(false) };
        if ld.chained {
            // (the next loop issues it)
            return Ok(true);
        }
        let d = self.wg_rule(ld.dot).unwrap();
        let (fname, _) = super::dot_wgmma::instr_fn(&d, true)?;
        let acc = self.loops[&l][ld.carried as usize].name.clone();
        self.open(format!("if (kf_rel{} >= 0)", l.0))?;
        self.late_second_wait(l)?;
        self.line("kf_wg_fence();")?;
        self.issue_from(&d, &fname, &acc, &format!("kf_dw{}", l.0), &format!("kf_dd{}", l.0))?;
        self.line("kf_wg_commit();")?;
        self.late_done(l)?;
        self.close()?;
        Ok(true)
    }

    /// A turn at the tensor cores in loop `l` with a late dot, before its first dot:
    /// warpgroup 1 hands the loop's first turn to warpgroup 0 as it enters the loop, then
    /// each waits for its turn.
    ///
    /// Per loop, each warpgroup waits as often as the other arrives: warpgroup 0 waits
    /// before each iteration's turn and arrives after it; warpgroup 1 arrives once as it
    /// enters and after each turn but the loop's last, and waits before each. Between
    /// two arrivals on one barrier, its warpgroup waits for the other's arrival that
    /// follows the first one's consumption, across loops too (a barrier completes on
    /// arrival counts alone).
    pub(super) fn late_turn_before(&mut self, l: LoopId) -> R {
        let iv = super::loops::index_var(l);
        let lo = self.val(self.k.operands(self.k.loop_info(l).unwrap().for_op)[0]).name.clone();
        self.line(format!("if (kf_wg == 1 && {iv} == {lo}) kf_bar_arrive(2);"))?;
        self.line("kf_bar_sync(2 + kf_wg);")
    }

    /// After the first dot and the late dot of the iteration before: the turn passes to
    /// the other warpgroup (but warpgroup 1's in the loop's last iteration).
    pub(super) fn late_turn_after(&mut self, l: LoopId) -> R {
        let iv = super::loops::index_var(l);
        let ops = self.k.operands(self.k.loop_info(l).unwrap().for_op);
        let (hi, step) = (self.val(ops[1]).name.clone(), self.val(ops[2]).name.clone());
        self.line(format!("if (kf_wg == 0 || ({hi}) - {iv} > ({step})) kf_bar_arrive(3 - kf_wg);"))
    }
}

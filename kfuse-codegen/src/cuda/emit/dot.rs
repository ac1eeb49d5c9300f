//! Writes one `dot` where it stands with FMAs (`Schedule::dots_one_by_one` says how a
//! kernel's dots are lowered; `dot_wgmma.rs` writes those the tensor cores take): the
//! plain rule, exact f32 FMAs through shared memory, on every target and for operands in
//! any layout.
//!
//! Both operands are written to shared memory in their own dtype (each element by the
//! thread that owns it, replicas skipped), rows padded by one 32-bit word; after a
//! barrier every thread computes its registers of the result `[M, N]`, walking the `k`
//! that are valid in both operands (`a`'s axis-1 range met with `b`'s axis-0 range, the
//! interpreter's rule: lanes outside it may hold anything). The result is valid on `a`'s
//! rows × `b`'s columns. Like every shared-memory user here, it opens with a barrier so
//! that the previous user's readers are done.
//!
//! Three rules, the fastest first:
//! 0. On sm_90a, a dot the block's warpgroups hold in the `m64nN` accumulator layout:
//!    `wgmma` (`dot_wgmma.rs`).
//! 1. f16/bf16 operands whose result `assign_layouts` put in the `m16n8k16` accumulator
//!    layout (`one_dot_mma_layout`): `mma.sync` on the tensor cores, which every target
//!    from sm_80 has. An operand the plan stages where it is defined (`dot_wgmma::plan`)
//!    lies in a swizzled tile as WGMMA's (each K-major or MN-major as its registers
//!    run), which a ring's `cp.async` copies may fill (`operand_ring`); each
//!    warp reads its fragments with `ldmatrix.x4` (B two instruction tiles at a time,
//!    `.trans` for an MN-major operand, `.x2` for an odd last one), each B fragment followed by
//!    its instructions, so that few B registers are live at once. Any other operand is
//!    staged here as above but `b` transposed (`[N, K]`, rows padded by one word, so both
//!    fragments are 32-bit reads), every `k` outside the valid range as 0 (the
//!    instruction multiplies whole `k16` steps, and a masked lane may hold a NaN; a tile
//!    of the plan is 0 outside its own valid range). Each warp computes its instruction
//!    tiles; its registers `4 (i J + j) + 2 r + c` are the instruction's `d0..d3` of
//!    tile `(i, j)` (`layout::mma_tiles_accumulator`).
//! 2. Otherwise exact f32 FMAs, summed in ascending `k` (the interpreter sums in f64):
//!    results agree to f32 rounding. Where the operands are f32 and `assign_layouts`
//!    gave the result runs of 4 rows and 4 columns a thread
//!    (`assign_layouts::fma_runs_layout`), `a` is written transposed (`[K][M + 4]`),
//!    `b` as `[K][N + 4]`, and per `k` a thread reads each run as one 16-byte vector
//!    (8x8 registers: four reads for 64 FMAs); a loop's loads of such operands are
//!    issued an iteration ahead (`loops.rs`, `ahead_loads`).
//!
//! Both products are exact (f16/bf16 products fit f32); the sums round in f32. Under
//! rule 1 an operand whose value feeds only such dots in one form is staged where it is
//! defined instead (a loop-invariant Q once; K and V by a ring's copies, or as loaded),
//! zero outside its own valid range; the dot then reads it there. Rule 2 stages at
//! every call, not pipelined with the math. Each rule adds a line to the plan
//! (`Emitted::dot_notes`).

use kfuse_ir::{DType, Layout, OpId, ValueId};

use super::dot_wgmma::SmemTile;
use super::{coord, coord_raw, from_reg, owner, stype, to_reg, Emitter, Val, MAX_BLOCK_SMEM, R};
use crate::layout::RegMap;
use crate::CodegenError;

impl Emitter<'_> {
    pub(super) fn dot(&mut self, op: OpId, a: ValueId, b: ValueId) -> R {
        let planned = self.wg_rule(op);
        if let Some(d) = planned.clone().filter(|d| d.mma.is_none()) {
            return self.dot_wgmma(op, a, b, d);
        }
        let label = super::dot_wgmma::dot_label(self.k, op);
        if let Some(warps) = self.mma_rule(op) {
            // operands the plan wrote where they were defined (or a ring copied) are read there
            let eager = |t: &SmemTile| t.eager.then(|| t.clone());
            let staged = planned.as_ref().map_or([None, None], |d| [d.a_tile().and_then(eager), eager(d.b_tile())]);
            let major = |mn: bool| if mn { "MN-major" } else { "K-major" };
            let (a_mn, b_mn) = planned.as_ref().map_or((false, false), |d| (d.a_mn, d.b_mn));
            let (na, nb) = (self.mma_operand_note(staged[0].as_ref(), major(a_mn)), self.mma_operand_note(staged[1].as_ref(), major(b_mn)));
            self.dot_notes.push(format!("{label}: mma.sync m16n8k16 over {}x{} warps; A from {na}; B from {nb}", warps[0], warps[1]));
            return self.dot_mma(op, a, b, warps, staged);
        }
        if let Some(map) = self.fma_runs(op) {
            self.dot_notes.push(format!("{label}: f32 FMAs on runs of 4 a thread, both operands written to shared memory at the dot (A transposed), read as 16-byte vectors"));
            return self.dot_fma_runs(op, a, b, map);
        }
        self.dot_notes.push(format!("{label}: f32 FMAs, both operands written to shared memory at the dot"));
        let (av, bv) = (self.val(a).clone(), self.val(b).clone());
        let (amap, bmap) = match (&av.map, &bv.map) {
            (Some(x), Some(y)) => (x.clone(), y.clone()),
            _ => return Err(CodegenError::Unsupported("`dot` of a scalar".into())),
        };
        if av.shape.len() != 2 || bv.shape.len() != 2 {
            return Err(CodegenError::Unsupported("`dot` of tiles that are not rank 2".into()));
        }
        let (m, kk, n) = (av.shape[0], av.shape[1], bv.shape[1]);
        // operand rows in 32-bit words plus one (bank spread)
        let (ad, bd) = (av.dtype, bv.dtype);
        let (aesz, besz) = (ad.size_bytes() as u32, bd.size_bytes() as u32);
        let arow = kk + 4 / aesz;
        let brow = n + 4 / besz;
        let a_bytes = (m * arow * aesz).div_ceil(16) * 16;
        let bytes = a_bytes + kk * brow * besz;
        let (name, map) = self.dot_result(op, &av, &bv, bytes)?;
        self.open("")?;
        self.line(self.barrier)?;
        let (at, bt) = (stype(ad), stype(bd));
        self.line(format!("{at}* kf_da = reinterpret_cast<{at}*>(kf_smem);"))?;
        self.line(format!("{bt}* kf_db = reinterpret_cast<{bt}*>(kf_smem + {a_bytes});"))?;
        self.stage_operand(a, &av, &amap, "kf_da", arow)?;
        self.stage_operand(b, &bv, &bmap, "kf_db", brow)?;
        self.line(self.barrier)?;
        let (lo, hi) = k_walk(&av, &bv);
        self.unroll("k", map.regs)?;
        let init = self.accumulate_onto(op);
        self.line(format!("{name}[k] = {init};"))?;
        self.close()?;
        self.open(format!("for (int kk = {lo}; kk < {hi}; ++kk)"))?;
        self.unroll("k", map.regs)?;
        let (r, c) = (coord(&map, 0, "k"), coord(&map, 1, "k"));
        let x = to_reg(ad, &format!("kf_da[({r}) * {arow} + kk]"));
        let y = to_reg(bd, &format!("kf_db[kk * {brow} + ({c})]"));
        self.line(format!("{name}[k] = fmaf({x}, {y}, {name}[k]);"))?;
        self.close()?;
        self.close()?;
        self.close()
    }

    /// Reserves `bytes` of shared memory for a dot's operands written at the dot (refused
    /// past what a block of any target holds; past 48 KiB the kernel's scratch is dynamic
    /// shared memory) and declares its f32 result, valid on `a`'s rows × `b`'s
    /// columns: the result's name and register map.
    fn dot_result(&mut self, op: OpId, av: &Val, bv: &Val, bytes: u32) -> Result<(String, RegMap), CodegenError> {
        let (m, kk, n) = (av.shape[0], av.shape[1], bv.shape[1]);
        if bytes > MAX_BLOCK_SMEM {
            return Err(CodegenError::Unsupported(format!(
                "`dot` of [{m}, {kk}] · [{kk}, {n}] tiles lowered on its own needs {bytes} bytes of shared memory (a block holds at most {MAX_BLOCK_SMEM} on any target); use smaller tiles"
            )));
        }
        self.scratch(bytes);
        let v = op.value();
        let layout = self.layout(v)?;
        let val = self.new_tile(v, DType::F32, &layout, vec![av.lo[0].clone(), bv.lo[1].clone()], vec![av.hi[0].clone(), bv.hi[1].clone()], None)?;
        let out = (val.name.clone(), val.map.clone().ok_or_else(|| CodegenError::Unsupported("`dot` with a scalar result".into()))?);
        self.vals.insert(v, val);
        Ok(out)
    }

    /// The result's register map when the FMA rule reads its operands as 16-byte vectors:
    /// f32 operands, and a result whose threads hold runs of 4 consecutive rows and 4
    /// consecutive columns (`layout::fma_accumulator`), without replicas or a cluster.
    pub(super) fn fma_runs(&self, op: OpId) -> Option<RegMap> {
        let ops = self.k.operands(op);
        if ops.iter().take(2).any(|&o| self.k.ty(o).dtype != DType::F32) {
            return None;
        }
        let map = RegMap::of(self.k.schedule.layouts.get(&op.value())?)?;
        let runs = map.dropped.is_empty() && map.axes.len() == 2 && map.axes.iter().all(|m| m.spt == 4 && m.elem_step == 1 && m.ctas == 1 && !m.replicated());
        runs.then_some(map)
    }

    /// The FMA rule on runs of 4 (`fma_runs`): `a` is written transposed (`[K][M + 4]`)
    /// and `b` as it is (`[K][N + 4]`), rows 16-byte aligned; per `k` a thread reads each
    /// of its runs of `a`'s rows and `b`'s columns as one 16-byte vector and issues an
    /// FMA per register. Sums in ascending `k`, as the scalar rule.
    fn dot_fma_runs(&mut self, op: OpId, a: ValueId, b: ValueId, map: RegMap) -> R {
        let (av, bv) = (self.val(a).clone(), self.val(b).clone());
        let (Some(amap), Some(bmap)) = (av.map.clone(), bv.map.clone()) else {
            return Err(CodegenError::Unsupported("`dot` of a scalar".into()));
        };
        let (m, kk, n) = (av.shape[0], av.shape[1], bv.shape[1]);
        let (arow, brow) = (m + 4, n + 4);
        let a_bytes = kk * arow * 4;
        let bytes = a_bytes + kk * brow * 4;
        let (name, _) = self.dot_result(op, &av, &bv, bytes)?;
        self.open("")?;
        self.line(self.barrier)?;
        self.line("float* kf_da = reinterpret_cast<float*>(kf_smem);")?;
        self.line(format!("float* kf_db = reinterpret_cast<float*>(kf_smem + {a_bytes});"))?;
        self.stage_operand_at(a, &av, &amap, "kf_da", [arow, 1].map(|x| x.to_string()), true)?;
        self.stage_operand_at(b, &bv, &bmap, "kf_db", [brow, 1].map(|x| x.to_string()), false)?;
        self.line(self.barrier)?;
        self.unroll("k", map.regs)?;
        let init = self.accumulate_onto(op);
        self.line(format!("{name}[k] = {init};"))?;
        self.close()?;
        let (lo, hi) = k_walk(&av, &bv);
        // (a K tile of at most 32: the whole walk unrolled where its bounds fold to constants)
        if kk <= 32 {
            self.line("#pragma unroll")?;
        }
        self.open(format!("for (int kk = {lo}; kk < {hi}; ++kk)"))?;
        for (i, (buf, src, row)) in [("kf_fa", "kf_da", arow), ("kf_fb", "kf_db", brow)].into_iter().enumerate() {
            let reps = map.axes[i].reps;
            self.line(format!("float {buf}[{}];", reps * 4))?;
            self.unroll("r", reps)?;
            let at = coord(&map, i, &format!("r * {}", map.axes[i].rep_stride));
            self.line(format!("const kf_v16 q = *reinterpret_cast<const kf_v16*>({src} + kk * {row} + ({at}));"))?;
            for e in 0..4 {
                self.line(format!("{buf}[r * 4 + {e}] = __uint_as_float(q.w[{e}]);"))?;
            }
            self.close()?;
        }
        self.unroll("k", map.regs)?;
        let digit = |i: usize| {
            let m = &map.axes[i];
            format!("((k / {}) % {}) * 4 + (k / {}) % 4", m.rep_stride, m.reps, m.e_stride)
        };
        self.line(format!("{name}[k] = fmaf(kf_fa[{}], kf_fb[{}], {name}[k]);", digit(0), digit(1)))?;
        self.close()?;
        self.close()?;
        self.close()
    }

    /// The warps `[wm, wn]` of the `mma.sync` rule, when the dot's result has that
    /// layout (see the module docs).
    fn mma_rule(&self, op: OpId) -> Option<[u32; 2]> {
        let Some(Layout::Blocked(have)) = self.k.schedule.layouts.get(&op.value()) else { return None };
        let want = crate::passes::assign_layouts::one_dot_mma_layout(self.k, op)?;
        // (`m16n8k16` takes 16-bit operands only; the layout also serves WGMMA's others)
        let sixteen = self.k.ty(self.k.operands(op)[0]).dtype.size_bytes() == 2;
        (*have == want && sixteen).then(|| [want.warps_per_block[0], want.warps_per_block[1]])
    }

    /// Where an operand of the `mma.sync` rule comes from, for the plan: a tile the plan
    /// staged (`major` its contiguous axis), or padded rows written at the dot.
    fn mma_operand_note(&self, t: Option<&SmemTile>, major: &str) -> String {
        match t {
            None => "shared memory (padded rows, written at the dot)".into(),
            Some(t) => format!("shared memory ({major}, {}-byte swizzle, {}; ldmatrix)", t.span, self.staged_when(t)),
        }
    }

    /// Rule 1: `mma.sync.m16n8k16` over operands in shared memory: the plan's tiles
    /// (`staged`, read by `ldmatrix`) or, for an operand with none, padded rows of the
    /// scratch written here (read as 32-bit words).
    fn dot_mma(&mut self, op: OpId, a: ValueId, b: ValueId, [wm, wn]: [u32; 2], staged: [Option<SmemTile>; 2]) -> R {
        let (av, bv) = (self.val(a).clone(), self.val(b).clone());
        let (amap, bmap) = (av.map.clone().unwrap(), bv.map.clone().unwrap());
        let d = av.dtype;
        let (m, kk, n) = (av.shape[0], av.shape[1], bv.shape[1]);
        let row = kk + 2; // one 32-bit word of padding
        let here = [staged[0].is_none(), staged[1].is_none()];
        let a_bytes = if here[0] { (m * row * 2).div_ceil(16) * 16 } else { 0 };
        let bytes = a_bytes + if here[1] { n * row * 2 } else { 0 };
        let (name, rmap) = self.dot_result(op, &av, &bv, bytes)?;
        let regs = rmap.regs;
        self.open("")?;
        // the operands without a tile: a as [M, K], b as [N, K], k outside the valid
        // range as 0 (a staged operand is 0 outside its own valid range: `stage_tile`,
        // a ring's zero-filled copies)
        let da = staged[0].as_ref().map_or_else(|| "kf_smem".to_string(), |t| t.base());
        let db = staged[1].as_ref().map_or_else(|| format!("(kf_smem + {a_bytes})"), |t| t.base());
        if here[0] || here[1] {
            let (klo, khi) = (self.fresh("kf_klo"), self.fresh("kf_khi"));
            self.line(format!("const int {klo} = (int)kf_maxi({}, {}), {khi} = (int)kf_mini({}, {});", av.lo[1], bv.lo[0], av.hi[1], bv.hi[0]))?;
            self.line(self.barrier)?;
            for (x, xv, xmap, dst, k_axis) in [(a, &av, &amap, &da, 1usize), (b, &bv, &bmap, &db, 0usize)] {
                if !here[k_axis ^ 1] {
                    continue;
                }
                let c: Vec<String> = xv.axis_map.iter().map(|am| am.map_or("0".to_string(), |i| coord_raw(xmap, i, "k"))).collect();
                let (kc, other) = (&c[k_axis], &c[1 - k_axis]);
                let own = owner(xmap, "k");
                self.unroll("k", xmap.regs)?;
                let value = format!("({kc}) >= {klo} && ({kc}) < {khi} ? {} : {}", from_reg(d, &self.reg(x, "k")), from_reg(d, "0.0f"));
                let store = format!("reinterpret_cast<kf_u16*>({dst})[({other}) * {row} + ({kc})] = {value};");
                self.line(if own == "true" { store } else { format!("if ({own}) {store}") })?;
                self.close()?;
            }
            self.line(self.barrier)?;
            self.wg_dirty = false;
            self.wg_staged = false;
        } else if self.wg_dirty {
            // every thread's writes to the staged tiles are done before they are read
            self.line(self.barrier)?;
            self.wg_dirty = false;
            self.wg_staged = false;
        }
        // a ring's next copies go out before the math
        self.take_pending_fetch()?;
        self.unroll("k", regs)?;
        let init = self.accumulate_onto(op);
        self.line(format!("{name}[k] = {init};"))?;
        self.close()?;
        let ty = if d == DType::F16 { "f16" } else { "bf16" };
        let mma = format!("kf_mma_{ty}");
        self.helpers.insert(mma.clone(), mma_fn(&mma, ty));
        let (ti, tj) = (m / 16 / wm, n / 8 / wn);
        self.line(format!("const int kf_wa = kf_warp / {wn}, kf_wb = kf_warp % {wn};"))?;
        self.line("#pragma unroll")?;
        self.open(format!("for (int kk = 0; kk < {kk}; kk += 16)"))?;
        self.line(format!("unsigned fa[{ti}][4];"))?;
        self.a_fragments(staged[0].as_ref(), &da, ti, wm, row)?;
        let issue = |j: &str, f: &str| format!("{mma}(&{name}[4 * (i * {tj} + {j})], fa[i], {f});");
        self.b_fragments_mma(staged[1].as_ref(), &db, [ti, tj], wn, row, &issue)?;
        self.close()?;
        // the staged tiles' readers: a later copy into them waits for a barrier
        self.wg_synced = false;
        self.close()
    }

    /// Each of the warp's `ti` A fragments of the `k16` step at `kk` (`fa[i]`): rows
    /// `16 (kf_wa + wm i)`, from the tile `t` (`ldmatrix.x4`: matrix `q` is rows `+8 (q &
    /// 1)`, k `+8 (q >> 1)`; `.trans` where the tile's rows run along k) or from padded
    /// rows of `row` elements at `base`.
    fn a_fragments(&mut self, t: Option<&SmemTile>, base: &str, ti: u32, wm: u32, row: u32) -> R {
        self.unroll("i", ti)?;
        match t {
            Some(t) => {
                let (m0, k0) = (format!("16 * (kf_wa + {wm} * i)"), "kk + (kf_lane >> 4) * 8");
                // (MN-major: lane `l` gives the k row `l & 7` of its matrix)
                let (x4, text, at) = if t.row_axis == t.k_axis {
                    ("kf_ldsm_x4_t", LDSM_X4_T, t.at(&format!("{k0} + (kf_lane & 7)"), &format!("{m0} + ((kf_lane >> 3) & 1) * 8")))
                } else {
                    ("kf_ldsm_x4", LDSM_X4, t.at(&format!("{m0} + (kf_lane & 7) + ((kf_lane >> 3) & 1) * 8"), k0))
                };
                self.helpers.insert(x4.into(), text.into());
                self.line(format!("{x4}(fa[i], kf_saddr({base}) + {at});"))?;
            }
            None => {
                self.line(format!("const int r0 = 16 * (kf_wa + {wm} * i) + kf_lane / 4, c0 = kk + 2 * (kf_lane % 4);"))?;
                self.line(format!("const unsigned* pa = reinterpret_cast<const unsigned*>({base});"))?;
                self.line(format!("fa[i][0] = pa[(r0 * {row} + c0) / 2]; fa[i][1] = pa[((r0 + 8) * {row} + c0) / 2];"))?;
                self.line(format!("fa[i][2] = pa[(r0 * {row} + c0 + 8) / 2]; fa[i][3] = pa[((r0 + 8) * {row} + c0 + 8) / 2];"))?;
            }
        }
        self.close()
    }

    /// The warp's `tj` B fragments of the `k16` step at `kk`, each followed by its
    /// instructions over the `ti` A fragments (`mma(tile, registers)`: one instruction
    /// of A fragment `i`), so that few B registers are live at once. Fragment `j` is
    /// columns `8 (kf_wb + wn j)`: from the tile `t`, two instruction tiles an
    /// `ldmatrix.x4` (matrix `q` is tile `+(q >> 1)`, k `+8 (q & 1)`; `.trans` where the
    /// tile's rows run along k), an odd last one by `.x2`; or from padded `[N, K]` rows at
    /// `base`.
    fn b_fragments_mma(&mut self, t: Option<&SmemTile>, base: &str, [ti, tj]: [u32; 2], wn: u32, row: u32, mma: &dyn Fn(&str, &str) -> String) -> R {
        let issue = |e: &mut Self, j: &str, f: &str| -> R {
            e.unroll("i", ti)?;
            e.line(mma(j, f))?;
            e.close()
        };
        let Some(t) = t else {
            self.unroll("j", tj)?;
            self.line(format!("const int n0 = 8 * (kf_wb + {wn} * j) + kf_lane / 4, c0 = kk + 2 * (kf_lane % 4);"))?;
            self.line(format!("const unsigned* pb = reinterpret_cast<const unsigned*>({base});"))?;
            self.line(format!("const unsigned fb[2] = {{pb[(n0 * {row} + c0) / 2], pb[(n0 * {row} + c0 + 8) / 2]}};"))?;
            issue(self, "j", "fb")?;
            return self.close();
        };
        // (the tile's rows along k: MN-major, each 8x8 matrix transposed on its way)
        let trans = t.row_axis == t.k_axis;
        let (x4, x2) = if trans { ("kf_ldsm_x4_t", "kf_ldsm_x2_t") } else { ("kf_ldsm_x4", "kf_ldsm_x2") };
        let place = |tile: &str| {
            let (nn, k) = (format!("8 * (kf_wb + {wn} * ({tile}))"), "kk + ((kf_lane >> 3) & 1) * 8");
            if trans { t.at(&format!("{k} + (kf_lane & 7)"), &nn) } else { t.at(&format!("{nn} + (kf_lane & 7)"), k) }
        };
        if tj >= 2 {
            self.helpers.insert(x4.into(), if trans { LDSM_X4_T } else { LDSM_X4 }.into());
            self.unroll("jp", tj / 2)?;
            self.line("unsigned fb[4];")?;
            self.line(format!("{x4}(fb, kf_saddr({base}) + {});", place("2 * jp + (kf_lane >> 4)")))?;
            issue(self, "2 * jp", "fb")?;
            issue(self, "2 * jp + 1", "fb + 2")?;
            self.close()?;
        }
        if tj % 2 == 1 {
            self.helpers.insert(x2.into(), if trans { LDSM_X2_T } else { LDSM_X2 }.into());
            self.open("")?;
            self.line("unsigned fb[2];")?;
            self.line(format!("{x2}(fb, kf_saddr({base}) + {});", place(&(tj - 1).to_string())))?;
            issue(self, &(tj - 1).to_string(), "fb")?;
            self.close()?;
        }
        Ok(())
    }

    /// Writes the registers `val` (value `v`) owns into the row-major `[rows, row]`
    /// shared array `dst`, in its dtype.
    fn stage_operand(&mut self, v: ValueId, val: &Val, map: &RegMap, dst: &str, row: u32) -> R {
        self.stage_operand_at(v, val, map, dst, [row.to_string(), "1".into()], false)
    }

    /// Writes operand `v`'s registers to `dst`: element `(i, j)` at `i * strides[0] + j
    /// * strides[1]`, or at `j * strides[0] + i * strides[1]` when `transposed`.
    fn stage_operand_at(&mut self, v: ValueId, val: &Val, map: &RegMap, dst: &str, strides: [String; 2], transposed: bool) -> R {
        let mut c: Vec<String> = val.axis_map.iter().map(|am| am.map_or("0".to_string(), |i| coord_raw(map, i, "k"))).collect();
        if transposed {
            c.swap(0, 1);
        }
        let own = owner(map, "k");
        self.unroll("k", map.regs)?;
        let at = |x: &str, s: &str| if s == "1" { format!("({x})") } else { format!("({x}) * {s}") };
        let store = format!("{dst}[{} + {}] = {};", at(&c[0], &strides[0]), at(&c[1], &strides[1]), from_reg(val.dtype, &self.reg(v, "k")));
        self.line(if own == "true" { store } else { format!("if ({own}) {store}") })?;
        self.close()
    }
}

/// `ldmatrix` (PTX ISA): four or two 8x8 matrices of 16-bit elements, each lane giving
/// one matrix row's 16-byte address; `.trans` transposes each matrix.
const LDSM_X4: &str = "static __device__ __forceinline__ void kf_ldsm_x4(unsigned* r, unsigned addr) {\n  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\" : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(addr) : \"memory\");\n}\n";
const LDSM_X4_T: &str = "static __device__ __forceinline__ void kf_ldsm_x4_t(unsigned* r, unsigned addr) {\n  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\" : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(addr) : \"memory\");\n}\n";
const LDSM_X2: &str = "static __device__ __forceinline__ void kf_ldsm_x2(unsigned* r, unsigned addr) {\n  asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\" : \"=r\"(r[0]), \"=r\"(r[1]) : \"r\"(addr) : \"memory\");\n}\n";
const LDSM_X2_T: &str = "static __device__ __forceinline__ void kf_ldsm_x2_t(unsigned* r, unsigned addr) {\n  asm volatile(\"ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\" : \"=r\"(r[0]), \"=r\"(r[1]) : \"r\"(addr) : \"memory\");\n}\n";

/// `name(d, a, b)`: `d += a · b` for one `mma.sync.m16n8k16` tile of `ty` operands, f32
/// accumulators.
fn mma_fn(name: &str, ty: &str) -> String {
    format!(
        "static __device__ __forceinline__ void {name}(float* d, const unsigned* a, const unsigned* b) {{\n  asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};\"\n    : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])\n    : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n}}\n"
    )
}

/// The `k` an FMA rule walks: `a`'s axis-1 valid range met with `b`'s axis-0 range,
/// folded to literals where both ends are (the usual case inside a matrix loop).
fn k_walk(av: &Val, bv: &Val) -> (String, String) {
    let bound = |f: &str, x: &str, y: &str, pick: fn(i64, i64) -> i64| match (x.parse::<i64>(), y.parse::<i64>()) {
        (Ok(x), Ok(y)) => pick(x, y).to_string(),
        _ => format!("(int){f}({x}, {y})"),
    };
    (bound("kf_maxi", &av.lo[1], &bv.lo[0], i64::max), bound("kf_mini", &av.hi[1], &bv.hi[0], i64::min))
}

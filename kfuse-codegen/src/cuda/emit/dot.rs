//! Writes one `dot` where it stands (a kernel whose dots are not a pipelined matrix loop:
//! `Schedule::dots_one_by_one`): the plain rule, exact f32 FMAs through shared memory,
//! on every target and for operands in any layout.
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
//!    from sm_80 has. The operands are staged as above but `b` transposed (`[N, K]`, so
//!    both fragments are 32-bit reads), and every `k` outside the valid range is staged
//!    as 0 in both (the instruction multiplies whole `k16` steps, and a masked lane may
//!    hold a NaN). Each warp computes its instruction tiles; its registers `4 (i J + j) +
//!    2 r + c` are the instruction's `d0..d3` of tile `(i, j)` (`layout::mma_tiles_accumulator`).
//! 2. Otherwise exact f32 FMAs, summed in ascending `k` (the interpreter sums in f64):
//!    results agree to f32 rounding.
//!
//! Both products are exact (f16/bf16 products fit f32); the sums round in f32. Under
//! rule 1 an operand whose value feeds only such dots in one form is staged where it is
//! defined instead (`dot_wgmma::plan`, the tiles `padded`: a loop-invariant Q once, K and
//! V as loaded), zero outside its own valid range; the dot then reads it there. Rule 2
//! stages at every call, not pipelined with the math. Each rule adds a line to the plan
//! (`Emitted::dot_notes`).

use kfuse_ir::{DType, Layout, OpId, ValueId};

use super::{coord, coord_raw, from_reg, owner, stype, to_reg, Emitter, Val, MAX_STATIC_SMEM, R};
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
            // operands the plan wrote where they were defined are read there
            let eager = |t: &super::dot_wgmma::SmemTile| t.eager.then(|| t.base());
            let (ea, eb) = planned.as_ref().map_or((None, None), |d| (d.a_tile().and_then(eager), eager(d.b_tile())));
            let at = |e: &Option<String>| if e.is_some() { "written where it is defined" } else { "written at the dot" };
            self.dot_notes.push(format!("{label}: mma.sync m16n8k16 over {}x{} warps; A in shared memory {}; B in shared memory {}", warps[0], warps[1], at(&ea), at(&eb)));
            return self.dot_mma(op, a, b, warps, [ea, eb]);
        }
        self.dot_notes.push(format!("{label}: f32 FMAs, both operands written to shared memory at the dot"));
        let v = op.value();
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
        if bytes > MAX_STATIC_SMEM {
            return Err(CodegenError::Unsupported(format!(
                "`dot` of [{m}, {kk}] · [{kk}, {n}] tiles lowered on its own needs {bytes} bytes of shared memory (static limit {MAX_STATIC_SMEM}); use smaller tiles"
            )));
        }
        self.scratch(bytes);
        let layout = self.layout(v)?;
        let val = self.new_tile(v, kfuse_ir::DType::F32, &layout, vec![av.lo[0].clone(), bv.lo[1].clone()], vec![av.hi[0].clone(), bv.hi[1].clone()], None)?;
        let (name, map) = (val.name.clone(), val.map.clone().unwrap());
        self.vals.insert(v, val);
        self.open("")?;
        self.line(self.barrier)?;
        let (at, bt) = (stype(ad), stype(bd));
        self.line(format!("{at}* kf_da = reinterpret_cast<{at}*>(kf_smem);"))?;
        self.line(format!("{bt}* kf_db = reinterpret_cast<{bt}*>(kf_smem + {a_bytes});"))?;
        self.stage_operand(a, &av, &amap, "kf_da", arow)?;
        self.stage_operand(b, &bv, &bmap, "kf_db", brow)?;
        self.line(self.barrier)?;
        let lo = format!("(int)kf_maxi({}, {})", av.lo[1], bv.lo[0]);
        let hi = format!("(int)kf_mini({}, {})", av.hi[1], bv.hi[0]);
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

    /// The warps `[wm, wn]` of the `mma.sync` rule, when the dot's result has that
    /// layout (see the module docs).
    fn mma_rule(&self, op: OpId) -> Option<[u32; 2]> {
        let Some(Layout::Blocked(have)) = self.k.schedule.layouts.get(&op.value()) else { return None };
        let want = crate::passes::assign_layouts::one_dot_mma_layout(self.k, op)?;
        // (`m16n8k16` takes 16-bit operands only; the layout also serves WGMMA's others)
        let sixteen = self.k.ty(self.k.operands(op)[0]).dtype.size_bytes() == 2;
        (*have == want && sixteen).then(|| [want.warps_per_block[0], want.warps_per_block[1]])
    }

    /// Rule 1: `mma.sync.m16n8k16` over operands staged in shared memory.
    fn dot_mma(&mut self, op: OpId, a: ValueId, b: ValueId, [wm, wn]: [u32; 2], staged: [Option<String>; 2]) -> R {
        let v = op.value();
        let (av, bv) = (self.val(a).clone(), self.val(b).clone());
        let (amap, bmap) = (av.map.clone().unwrap(), bv.map.clone().unwrap());
        let d = av.dtype;
        let (m, kk, n) = (av.shape[0], av.shape[1], bv.shape[1]);
        let row = kk + 2; // one 32-bit word of padding
        let a_bytes = (m * row * 2).div_ceil(16) * 16;
        let bytes = a_bytes + n * row * 2;
        if bytes > MAX_STATIC_SMEM {
            return Err(CodegenError::Unsupported(format!(
                "`dot` of [{m}, {kk}] · [{kk}, {n}] tiles lowered on its own needs {bytes} bytes of shared memory (static limit {MAX_STATIC_SMEM}); use smaller tiles"
            )));
        }
        self.scratch(bytes);
        let layout = self.layout(v)?;
        let val = self.new_tile(v, DType::F32, &layout, vec![av.lo[0].clone(), bv.lo[1].clone()], vec![av.hi[0].clone(), bv.hi[1].clone()], None)?;
        let name = val.name.clone();
        let regs = val.map.as_ref().unwrap().regs;
        self.vals.insert(v, val);
        self.open("")?;
        let (klo, khi) = (self.fresh("kf_klo"), self.fresh("kf_khi"));
        self.line(format!("const int {klo} = (int)kf_maxi({}, {}), {khi} = (int)kf_mini({}, {});", av.lo[1], bv.lo[0], av.hi[1], bv.hi[0]))?;
        self.line(self.barrier)?;
        let da = staged[0].clone().unwrap_or_else(|| "kf_smem".into());
        let db = staged[1].clone().unwrap_or_else(|| format!("(kf_smem + {a_bytes})"));
        self.line(format!("kf_u16* kf_da = reinterpret_cast<kf_u16*>({da});"))?;
        self.line(format!("kf_u16* kf_db = reinterpret_cast<kf_u16*>({db});"))?;
        // a as [M, K], b as [N, K]; k outside [klo, khi) as 0 (a staged operand: outside
        // its own valid range, `dot_wgmma::stage_tile`)
        for (x, xv, xmap, dst, k_axis) in [(a, &av, &amap, "kf_da", 1usize), (b, &bv, &bmap, "kf_db", 0usize)] {
            if staged[k_axis ^ 1].is_some() {
                continue;
            }
            let c: Vec<String> = xv.axis_map.iter().map(|am| am.map_or("0".to_string(), |i| coord_raw(xmap, i, "k"))).collect();
            let (kc, other) = (&c[k_axis], &c[1 - k_axis]);
            let own = owner(xmap, "k");
            self.unroll("k", xmap.regs)?;
            let value = format!("({kc}) >= {klo} && ({kc}) < {khi} ? {} : {}", from_reg(d, &self.reg(x, "k")), from_reg(d, "0.0f"));
            let store = format!("{dst}[({other}) * {row} + ({kc})] = {value};");
            self.line(if own == "true" { store } else { format!("if ({own}) {store}") })?;
            self.close()?;
        }
        self.line(self.barrier)?;
        self.unroll("k", regs)?;
        let init = self.accumulate_onto(op);
        self.line(format!("{name}[k] = {init};"))?;
        self.close()?;
        let ty = if d == DType::F16 { "f16" } else { "bf16" };
        let (ti, tj) = (m / 16 / wm, n / 8 / wn);
        self.line(format!("const int kf_wa = kf_warp / {wn}, kf_wb = kf_warp % {wn};"))?;
        self.line("#pragma unroll")?;
        self.open(format!("for (int kk = 0; kk < {kk}; kk += 16)"))?;
        self.unroll("i", ti)?;
        self.line(format!("const int r0 = 16 * (kf_wa + {wm} * i) + kf_lane / 4, c0 = kk + 2 * (kf_lane % 4);"))?;
        self.line("const unsigned* pa = reinterpret_cast<const unsigned*>(kf_da);")?;
        self.line(format!(
            "const unsigned fa[4] = {{pa[(r0 * {row} + c0) / 2], pa[((r0 + 8) * {row} + c0) / 2], pa[(r0 * {row} + c0 + 8) / 2], pa[((r0 + 8) * {row} + c0 + 8) / 2]}};"
        ))?;
        self.unroll("j", tj)?;
        self.line(format!("const int n0 = 8 * (kf_wb + {wn} * j) + kf_lane / 4;"))?;
        self.line("const unsigned* pb = reinterpret_cast<const unsigned*>(kf_db);")?;
        self.line(format!("const unsigned fb[2] = {{pb[(n0 * {row} + c0) / 2], pb[(n0 * {row} + c0 + 8) / 2]}};"))?;
        self.line(format!("float* acc = &{name}[4 * (i * {tj} + j)];"))?;
        self.line(format!(
            "asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{%0, %1, %2, %3}}, {{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};\" : \"+f\"(acc[0]), \"+f\"(acc[1]), \"+f\"(acc[2]), \"+f\"(acc[3]) : \"r\"(fa[0]), \"r\"(fa[1]), \"r\"(fa[2]), \"r\"(fa[3]), \"r\"(fb[0]), \"r\"(fb[1]));"
        ))?;
        self.close()?;
        self.close()?;
        self.close()?;
        // the staged tiles' readers: a later copy into them waits for a barrier
        self.wg_synced = false;
        self.close()
    }

    /// Writes the registers `val` (value `v`) owns into the row-major `[rows, row]`
    /// shared array `dst`, in its dtype.
    fn stage_operand(&mut self, v: ValueId, val: &Val, map: &RegMap, dst: &str, row: u32) -> R {
        let c: Vec<String> = val.axis_map.iter().map(|am| am.map_or("0".to_string(), |i| coord_raw(map, i, "k"))).collect();
        let own = owner(map, "k");
        self.unroll("k", map.regs)?;
        let store = format!("{dst}[({}) * {row} + ({})] = {};", c[0], c[1], from_reg(val.dtype, &self.reg(v, "k")));
        self.line(if own == "true" { store } else { format!("if ({own}) {store}") })?;
        self.close()
    }
}

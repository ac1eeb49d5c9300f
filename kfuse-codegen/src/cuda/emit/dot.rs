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
//! The products are exact in f32 FMAs and summed in ascending `k` (the interpreter sums
//! in f64): results agree to f32 rounding. A matrix-instruction rule for such dots
//! (mma.sync from registers, WGMMA with A from registers) is a faster rule to come in
//! front of this one.

use kfuse_ir::{OpId, ValueId};

use super::{coord, coord_raw, from_reg, owner, stype, to_reg, Emitter, Val, MAX_STATIC_SMEM, R};
use crate::layout::RegMap;
use crate::CodegenError;

impl Emitter<'_> {
    pub(super) fn dot(&mut self, op: OpId, a: ValueId, b: ValueId) -> R {
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
        self.smem = self.smem.max(bytes);
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
        self.line(format!("{name}[k] = 0.0f;"))?;
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

//! The FMA path: prints a kernel whose schedule holds an [`MmaPlan`] of path
//! [`MmaPath::FmaSimt`](crate::mma_plan::MmaPath::FmaSimt) — exact f32 fused multiply-adds on
//! the CUDA cores, on every target (no matrix instruction, no TF32, no fast math).
//!
//! Shape of the generated kernel (the plan and the accumulator layout decide every
//! number):
//! - one output tile per block on the ordinary program-id grid; all threads compute,
//!   each holding its `tm × tn` thread tile of the `[BM, BN]` accumulator
//!   ([`crate::layout::fma_accumulator`]) in f32 registers;
//! - shared memory: two stages, each the A slab stored transposed, `[BK][BM + 4]`
//!   (M contiguous), and the B slab `[BK][BN + 4]` (N contiguous), as f32 whatever the
//!   operands' dtype. The 4 floats of padding a row keep every row 16-byte aligned and
//!   spread the transposing stores of a K-major operand over the banks;
//! - copies: for each operand, thread `t` loads elements `t + q · threads` of the slab
//!   (`q` below `ceil(slab / threads)`), numbered along the tile axis over the tensor's
//!   unit-stride dimension first (consecutive lanes read consecutive addresses; the
//!   last tile axis when no dimension has a unit stride), with plain loads at any
//!   strides: elements outside the tensor (either tile axis, and the indexed
//!   dimensions) read as 0, 16-bit ones are converted to f32 on the way. The loads of
//!   iteration `it + 1` are issued into registers before the block computes on the
//!   stage of iteration `it`, and stored to the other stage after it; one
//!   `__syncthreads()` an iteration (the stage written in iteration `it` was last read
//!   in `it - 1`, before that iteration's barrier);
//! - compute: per `k` of the slab, a thread reads its runs of 4 rows of A and of 4
//!   columns of B as 16-byte vectors (the lanes of a warp read one address or
//!   consecutive ones: no bank conflicts) and issues `tm × tn` `fmaf`s. Each
//!   accumulator sums its products in `k` order, one rounding per FMA;
//! - after the loop the rest of the kernel (the epilogue: casts, bias, activations,
//!   `alpha · acc + beta · c`, stores — any tile ops) runs through the ordinary writer
//!   on the accumulator registers; its shared memory (layout conversions, reductions)
//!   reuses the stages'.

use super::mma_common::{
    accumulator_map, accumulator_val, bind_iteration, block_prologue, finish_block_kernel, dot_loop, epilogue, index_corner, non_negative_in_loop,
    operand_slice, tile_dims, BlockKernel, Trip,
};
use super::*;
use kfuse_ir::{LoopInfo, ParamId};

use crate::target::GridAxisEval;
use crate::mma_plan::MmaPlan;

/// Floats of padding at the end of every shared-memory row (module docs).
pub const SMEM_PAD: u32 = 4;

/// 16- and 8-byte vectors of floats for the shared-memory reads.
const FMA_PRELUDE: &str = r#"struct __align__(16) kf_f4 { float x, y, z, w; };
struct __align__(8) kf_f2 { float x, y; };
"#;

/// One operand as the writer needs it.
struct Operand {
    load: OpId,
    tensor: ParamId,
    dtype: DType,
    /// The tensor dimensions of the load's tile axes 0 and 1, and the axes' extents.
    td: [usize; 2],
    ext: [u32; 2],
    /// The load's tile axis along K (0 or 1).
    k_axis: usize,
    /// The tile axis the copying threads walk first (over the unit-stride dimension).
    fast: usize,
    /// Shared-memory row length in floats (`M` or `N` extent plus the padding), and
    /// where stage 0 begins and how long a stage is, in floats.
    ld: u32,
    base: u32,
    stage: u32,
}

impl Operand {
    fn elems(&self) -> u32 {
        self.ext[0] * self.ext[1]
    }
    /// Elements each thread copies a slab.
    fn per_thread(&self, threads: u32) -> u32 {
        self.elems().div_ceil(threads)
    }
    /// C expressions of the tile coordinates `(fast, slow)` of this thread's copy `q`
    /// (`q` an unrolled loop variable).
    fn copy_coords(&self, threads: u32) -> (String, String) {
        let e = self.ext[self.fast];
        if e >= threads {
            (format!("(kf_tid + ((q * {threads}) % {e}))"), format!("((q * {threads}) / {e})"))
        } else {
            (format!("(kf_tid % {e})"), format!("(kf_tid / {e} + q * {})", threads / e))
        }
    }
}

/// The names of the operands' prefetch registers (A, B).
const PREFETCH: [&str; 2] = ["kf_ga", "kf_gb"];

/// `(long long)(c) * st`, or `(long long)(c)` for a unit stride.
fn scaled(c: &str, st: &str) -> String {
    if st == "1" {
        format!("(long long)({c})")
    } else {
        format!("(long long)({c}) * {st}")
    }
}

/// The dot's operand `i` (0: A, whose M extent is `BM` and whose K axis, as the dot
/// sees it, is 1; 1: B, `BN` and 0) and its two shared-memory stages from float `base`
/// on.
fn slab(k: &Kernel, spec: &Spec, plan: &MmaPlan, i: usize, base: u32) -> Result<Operand, CodegenError> {
    let unsupported = |m: String| CodegenError::Unsupported(m);
    let [bm, bn, bk] = plan.tile;
    let (o, mn, k_axis_of_dot) = if i == 0 { (&plan.a, bm, 1) } else { (&plan.b, bn, 0) };
    let v = k.operands(plan.dot)[i];
    let Op::Load { tensor, dims } = k.op(o.load) else { return Err(unsupported("a dot operand that is not a load".into())) };
    let td = tile_dims(k, o.load);
    if td.len() != 2 {
        return Err(unsupported("a dot operand that is not a 2-D tile load".into()));
    }
    let ext_of = |d: usize| match dims[d] {
        AccessDim::Tile(e) => extent_value(k, e),
        AccessDim::Index => 1,
        AccessDim::Gather(_) => unreachable!("the matrix path takes no gathered load"),
    };
    let ext = [ext_of(td[0]), ext_of(td[1])];
    // the load's tile axis along K: the dot's axis, through a transpose
    let k_axis = if v.op() == o.load { k_axis_of_dot } else { 1 - k_axis_of_dot };
    if (ext[k_axis], ext[1 - k_axis]) != (bk, mn) {
        return Err(unsupported(format!("a dot operand tile of {}x{}, expected K {bk} and M/N {mn}", ext[0], ext[1])));
    }
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten();
    let unit = ts.and_then(|ts| td.iter().rposition(|&d| ts.stride_div.get(d) == Some(&0)));
    let ld = mn + SMEM_PAD;
    Ok(Operand {
        load: o.load,
        tensor: *tensor,
        dtype: k.param(*tensor).dtype,
        td: [td[0], td[1]],
        ext,
        k_axis,
        fast: unit.unwrap_or(1),
        ld,
        base,
        stage: bk * ld,
    })
}

/// The FMA kernel as its parts read it: the plan and its loop, the accumulator (its loop
/// result and register map, `tm × tn` registers a thread), the block's threads and the
/// operands' slabs (A, B) in `pipe_bytes` of shared memory.
struct FmaKernel<'a> {
    plan: &'a MmaPlan,
    info: LoopInfo,
    res: ValueId,
    map: RegMap,
    tm: u32,
    tn: u32,
    threads: u32,
    operands: Vec<Operand>,
    pipe_bytes: u32,
}

impl<'a> FmaKernel<'a> {
    /// Checks the accumulator's layout against the plan and lays out the slabs.
    fn new(k: &Kernel, spec: &Spec, plan: &'a MmaPlan) -> Result<Self, CodegenError> {
        let unsupported = |m: String| CodegenError::Unsupported(m);
        let [bm, bn, _] = plan.tile;
        let threads = k.schedule.num_threads;
        let info = dot_loop(k, plan)?;
        // the accumulator: the layout the plan's warps give it
        let (res, map) = accumulator_map(k, &info)?;
        let (mr, mc) = (&map.axes[0], &map.axes[1]);
        if map.axes.len() != 2 || (mr.shape, mc.shape) != (bm, bn) || mr.lane_step != mr.spt || mc.lane_step != mc.spt {
            return Err(unsupported(format!("the FMA path's {bm}x{bn} accumulator in a layout it does not hold")));
        }
        let (tm, tn) = (mr.reps * mr.spt, mc.reps * mc.spt);
        if tm * tn != map.regs || [tm, tn, 1] != plan.instr || 32 * plan.warps[0] * plan.warps[1] != threads {
            return Err(unsupported(format!("thread tiles of {tm}x{tn} in {} registers for a plan of {:?} over {:?} warps", map.regs, plan.instr, plan.warps)));
        }
        // the operands' shared-memory slabs
        let a = slab(k, spec, plan, 0, 0)?;
        let b = slab(k, spec, plan, 1, 2 * a.stage)?;
        let pipe_bytes = (2 * a.stage + 2 * b.stage) * 4;
        Ok(FmaKernel { plan, info, res, map, tm, tn, threads, operands: vec![a, b], pipe_bytes })
    }

    /// The thread's setup before the loop: the stages' pointer, its first row and column
    /// of the accumulator (its thread tile repeats every sweep of the block), the
    /// prefetch registers, and each operand's element offsets within a slab,
    /// loop-invariant: `kf_t` at copy 0, `kf_d` from one copy to the next (where the
    /// copies step along the slow axis).
    fn thread_setup(&self, e: &mut Emitter) -> R {
        let threads = self.threads;
        e.line("float* const kf_sf = reinterpret_cast<float*>(kf_smem);")?;
        e.line(format!("const int kf_tr = {};", coord(&self.map, 0, "0")))?;
        e.line(format!("const int kf_tc = {};", coord(&self.map, 1, "0")))?;
        for (op, name) in self.operands.iter().zip(PREFETCH) {
            e.line(format!("float {name}[{}];", op.per_thread(threads)))?;
        }
        for (oi, op) in self.operands.iter().enumerate() {
            let st = |axis: usize| e.stride(op.tensor, op.td[axis]);
            let (sf, ss) = (st(op.fast), st(1 - op.fast));
            let e_f = op.ext[op.fast];
            let (f0, s0) = if e_f >= threads { ("kf_tid".to_string(), "0".to_string()) } else { (format!("kf_tid % {e_f}"), format!("kf_tid / {e_f}")) };
            e.line(format!("const long long kf_t{oi} = {} + {};", scaled(&f0, &sf), scaled(&s0, &ss)))?;
            if e_f < threads {
                e.line(format!("const long long kf_d{oi} = {};", scaled(&(threads / e_f).to_string(), &ss)))?;
            }
        }
        Ok(())
    }

    /// The two-stage loop: the first slab loaded and stored before it; each iteration
    /// loads the next slab into registers, computes on the current stage and stores the
    /// next slab into the other stage.
    fn main_loop(&self, e: &mut Emitter, trip: &Trip) -> R {
        let [bm, bn, bk] = self.plan.tile;
        let (oa, ob) = (&self.operands[0], &self.operands[1]);
        e.line(format!(
            "// f32 FMAs: {bm}x{bn}x{bk} tiles, {}x{} a thread, two stages of {} bytes (A [{bk}][{}], B [{bk}][{}] floats)",
            self.tm,
            self.tn,
            self.pipe_bytes / 2,
            oa.ld,
            ob.ld
        ))?;
        e.open("if (kf_n > 0)")?;
        self.issue(e, trip, "0")?;
        self.store(e, "0")?;
        e.close()?;
        e.line("__syncthreads();")?;
        e.open("for (long long kf_it = 0; kf_it < kf_n; ++kf_it)")?;
        e.line("const int kf_buf = (int)(kf_it & 1);")?;
        e.line("const bool kf_more = kf_it + 1 < kf_n;")?;
        e.open("if (kf_more)")?;
        self.issue(e, trip, "kf_it + 1")?;
        e.close()?;
        self.compute(e, "kf_buf")?;
        e.open("if (kf_more)")?;
        self.store(e, "kf_buf ^ 1")?;
        e.close()?;
        e.line("__syncthreads();")?;
        e.close() // k loop
    }

    /// The loads of loop iteration `it` into the prefetch registers.
    fn issue(&self, e: &mut Emitter, trip: &Trip, it: &str) -> R {
        bind_iteration(e, &self.info, trip, it)?;
        for (oi, op) in self.operands.iter().enumerate() {
            self.issue_operand(e, oi, op)?;
        }
        Ok(())
    }

    /// The loads of operand `oi`'s slab, this thread's elements: each behind its bounds
    /// test (outside the tensor: 0), converted to f32.
    fn issue_operand(&self, e: &mut Emitter, oi: usize, op: &Operand) -> R {
        let (k, threads) = (e.k, self.threads);
        let tdims = k.tensor_dims(op.tensor).to_vec();
        let offs: Vec<ValueId> = k.operands(op.load);
        let vname = |v: ValueId, e: &Emitter| e.val(v).name.clone();
        // the block's corner along its indexed dimensions, and their bounds
        let (mut corner, ok) = index_corner(e, op.load);
        let (f, sl) = op.copy_coords(threads);
        e.open("")?;
        // the block's corner, and along each tile axis the 32-bit range of thread
        // coordinates inside the tensor (`lo <= c < r`): per copy, one 32-bit compare an
        // axis and a loop-invariant offset `c * stride`
        let mut bound = Vec::new();
        for axis in 0..2 {
            let d = op.td[axis];
            let (o, st, n) = (vname(offs[d], e), e.stride(op.tensor, d), e.shape_var(tdims[d]));
            corner = if st == "1" { format!("{corner} + {o}") } else { format!("{corner} + {o} * {st}") };
            e.line(format!("const int kf_r{axis} = (int)kf_mini(kf_maxi({n} - {o}, -1LL), 1LL << 30);"))?;
            let lo = !non_negative_in_loop(k, offs[d]);
            if lo {
                e.line(format!("const int kf_l{axis} = (int)kf_mini(kf_maxi(-{o}, -1LL), 1LL << 30);"))?;
            }
            bound.push((lo, st));
        }
        e.line(format!("const {}* const g = {corner};", stype(op.dtype)))?;
        e.line(format!("const bool okc = {};", if ok.is_empty() { "true".to_string() } else { ok.join(" && ") }))?;
        e.unroll("q", op.per_thread(threads))?;
        e.line(format!("const int kf_f = {f};"))?;
        e.line(format!("const int kf_s = {sl};"))?;
        let mut cond = vec!["okc".to_string()];
        if op.elems() < threads {
            cond.push(format!("kf_tid < {}", op.elems()));
        }
        for (axis, (lo, _)) in bound.iter().enumerate() {
            let c = if axis == op.fast { "kf_f" } else { "kf_s" };
            cond.push(format!("{c} < kf_r{axis}"));
            if *lo {
                cond.push(format!("{c} >= kf_l{axis}"));
            }
        }
        // the element's offset from the corner: this thread's, plus copy q's step
        let e_f = op.ext[op.fast];
        let at = if e_f < threads {
            format!("kf_t{oi} + q * kf_d{oi}")
        } else {
            let (sf, ss) = (&bound[op.fast].1, &bound[1 - op.fast].1);
            format!("kf_t{oi} + {} + {}", scaled(&format!("(q * {threads}) % {e_f}"), sf), scaled(&format!("(q * {threads}) / {e_f}"), ss))
        };
        e.line(format!("const bool in = {};", cond.join(" && ")))?;
        e.line(format!("{}[q] = in ? {} : 0.0f;", PREFETCH[oi], to_reg(op.dtype, &format!("g[{at}]"))))?;
        e.close()?;
        e.close()
    }

    /// The prefetch registers into stage `buf`.
    fn store(&self, e: &mut Emitter, buf: &str) -> R {
        for (op, name) in self.operands.iter().zip(PREFETCH) {
            let (f, sl) = op.copy_coords(self.threads);
            let (i0, i1) = if op.fast == 0 { ("kf_f", "kf_s") } else { ("kf_s", "kf_f") };
            let (kc, mnc) = if op.k_axis == 0 { (i0, i1) } else { (i1, i0) };
            e.open("")?;
            e.line(format!("float* const s = kf_sf + {} + ({buf}) * {};", op.base, op.stage))?;
            e.unroll("q", op.per_thread(self.threads))?;
            e.line(format!("const int kf_f = {f};"))?;
            e.line(format!("const int kf_s = {sl};"))?;
            let put = format!("s[{kc} * {} + {mnc}] = {name}[q];", op.ld);
            if op.elems() < self.threads {
                e.line(format!("if (kf_tid < {}) {put}", op.elems()))?;
            } else {
                e.line(put)?;
            }
            e.close()?;
            e.close()?;
        }
        Ok(())
    }

    /// Per `k` of the slab in stage `buf`: this thread's rows of A and columns of B,
    /// then its FMAs.
    fn compute(&self, e: &mut Emitter, buf: &str) -> R {
        let (oa, ob) = (&self.operands[0], &self.operands[1]);
        let (mr, mc) = (&self.map.axes[0], &self.map.axes[1]);
        let (tm, tn) = (self.tm, self.tn);
        let reg = format!(
            "(i / {}) * {} + (i % {}) * {} + (j / {}) * {} + (j % {}) * {}",
            mr.spt, mr.rep_stride, mr.spt, mr.e_stride, mc.spt, mc.rep_stride, mc.spt, mc.e_stride
        );
        e.open("")?;
        e.line(format!("const float* const kf_xa = kf_sf + {} + ({buf}) * {} + kf_tr;", oa.base, oa.stage))?;
        e.line(format!("const float* const kf_xb = kf_sf + {} + ({buf}) * {} + kf_tc;", ob.base, ob.stage))?;
        e.unroll("kk", self.plan.tile[2])?;
        e.line(format!("float kf_a[{tm}];"))?;
        e.line(format!("float kf_b[{tn}];"))?;
        fragment(e, "kf_a", mr, &format!("kf_xa + kk * {}", oa.ld))?;
        fragment(e, "kf_b", mc, &format!("kf_xb + kk * {}", ob.ld))?;
        e.unroll("i", tm)?;
        e.unroll("j", tn)?;
        e.line(format!("kf_acc[{reg}] = fmaf(kf_a[i], kf_b[j], kf_acc[{reg}]);"))?;
        e.close()?;
        e.close()?;
        e.close()?; // kk
        e.close()
    }
}

/// A thread's fragment `name` of one operand at one `k`: its runs of `m.spt` rows (A)
/// or columns (B) from `src`, read as 16- or 8-byte vectors.
fn fragment(e: &mut Emitter, name: &str, m: &crate::layout::AxisMap, src: &str) -> R {
    e.unroll("r", m.reps)?;
    let at = format!("{src} + r * {}", m.chunk);
    match m.spt {
        4 => {
            e.line(format!("const kf_f4 t = *reinterpret_cast<const kf_f4*>({at});"))?;
            e.line(format!("{name}[r * 4] = t.x; {name}[r * 4 + 1] = t.y; {name}[r * 4 + 2] = t.z; {name}[r * 4 + 3] = t.w;"))?;
        }
        2 => {
            e.line(format!("const kf_f2 t = *reinterpret_cast<const kf_f2*>({at});"))?;
            e.line(format!("{name}[r * 2] = t.x; {name}[r * 2 + 1] = t.y;"))?;
        }
        _ => e.line(format!("{name}[r] = *({at});"))?,
    }
    e.close()
}

pub(super) fn emit_kernel(
    k: &Kernel,
    spec: &Spec,
    target: &Target,
    grid: &[GridAxisEval],
    plan: &MmaPlan,
    params: Vec<KernelParam>,
    decls: Vec<String>,
) -> Result<Emitted, CodegenError> {
    let f = FmaKernel::new(k, spec, plan)?;
    let (mut e, ranges, (start, step)) = block_prologue(k, spec, grid, plan, f.info.for_pos, f.map.regs)?;
    f.thread_setup(&mut e)?;
    let slice = operand_slice(k, plan, &f.info)?;
    f.main_loop(&mut e, &Trip { start, step, slice })?;
    // the epilogue: everything after the loop, on the accumulator registers
    epilogue(&mut e, &f.info, f.res, accumulator_val(plan, f.map.clone(), ranges))?;
    let ring = format!("two stages of {}", f.pipe_bytes / 2);
    let b = BlockKernel { threads: f.threads, preludes: &[FMA_PRELUDE], align: 16, ring_bytes: f.pipe_bytes, ring };
    finish_block_kernel(e, target, &b, &decls, params)
}

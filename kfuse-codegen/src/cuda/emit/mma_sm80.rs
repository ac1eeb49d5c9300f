//! The sm_80/sm_89 matrix path: prints a kernel whose schedule holds an [`MmaPlan`] of
//! path [`MmaPath::MmaSyncCpAsync`](crate::mma_plan::MmaPath::MmaSyncCpAsync).
//!
//! Shape of the generated kernel (the plan decides every number):
//! - one output tile per block on the ordinary program-id grid; every warp computes
//!   (no warp specialization): the `warps[0] × warps[1]` warps share the `[BM, BN]`
//!   accumulator, each holding the `m16n8` instruction tiles of
//!   [`crate::layout::mma_tiles_accumulator`] in f32 registers;
//! - a ring of `stages` shared-memory stages, each an A tile and a B tile. Every thread
//!   copies 16-byte chunks of both operands into a stage with `cp.async.cg` (zero fill
//!   through the `src-size` operand where a chunk hangs over the tensor's edge, all of
//!   it past the edge), one commit group per stage (empty groups past the last
//!   iteration keep the count uniform). The prologue fills `stages - 1` stages; each
//!   iteration waits until at most `stages - 2` groups are pending (its own stage has
//!   landed), meets the block at `__syncthreads()` (everybody's chunks visible, and
//!   everybody done with the stage the next copy overwrites), issues the copies of
//!   iteration `it + stages - 1`, then computes on its stage: per `k16` step each warp
//!   reads its A fragments (`ldmatrix.x4`, one per 16 rows) and B fragments (one
//!   `ldmatrix.x4` per two 8-column instruction tiles), `.trans` for an MN-major
//!   operand, and issues `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`;
//! - after the loop the rest of the kernel (the epilogue: casts, bias, activations,
//!   stores — any tile ops) runs through the ordinary writer on the accumulator
//!   registers; its shared memory (layout conversions, reductions) reuses the ring's.
//!
//! Shared memory of one operand in one stage: `rows × row_bytes`, a row along the
//! tensor's non-unit-stride tile dimension (K-major: `BM` or `BN` rows of `BK`
//! elements; MN-major: `BK` rows of `BM` or `BN` elements). With `C = row_bytes / 16`
//! chunks a row, chunk `j` of row `r` is stored at chunk `j ^ ((r / pd) % cm)`,
//! `cm = min(C, 8)`, `pd = 8 / cm`: the 8 rows of one `ldmatrix` matrix (8 consecutive
//! rows, one logical chunk) land in 8 different 16-byte bank groups, and so do the
//! chunks of 8 consecutive threads' copies (consecutive chunks of whole rows).

use super::mma_common::{
    accumulator_map, accumulator_val, bind_iteration, block_prologue, finish_block_kernel, dot_loop, epilogue, index_corner, non_negative_in_loop,
    operand_slice, tile_dims, BlockKernel, Trip,
};
use super::*;
use kfuse_ir::{LoopInfo, ParamId};

use crate::target::GridAxisEval;
use crate::mma_plan::{Major, MmaPlan};

/// The helpers of the mma.sync path (PTX ISA: `cp.async`, `ldmatrix`, `mma.sync`; the
/// last two `dot.rs`'s).
fn mma_sync_prelude(dtype: DType) -> String {
    let smem_u32 = "static __device__ __forceinline__ unsigned kf_smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }\n";
    let ty = if dtype == DType::F16 { "f16" } else { "bf16" };
    format!("{smem_u32}{}{}{}{}", cp_async_helpers!(), super::dot::LDSM_X4, super::dot::LDSM_X4_T, super::dot::mma_fn("kf_mma", ty))
}

/// One operand as the writer needs it.
struct Operand {
    load: OpId,
    tensor: ParamId,
    /// Tensor dimensions of the stored rows and of the 16-byte chunks (unit stride).
    outer: usize,
    unit: usize,
    rows: u32,
    row_bytes: u32,
    major: Major,
}

impl Operand {
    fn chunks(&self) -> u32 {
        self.row_bytes / 16
    }
    fn bytes(&self) -> u32 {
        self.rows * self.row_bytes
    }
    /// `(pd, cm)` of the swizzle (module docs).
    fn swizzle(&self) -> (u32, u32) {
        let cm = self.chunks().min(8);
        (8 / cm, cm)
    }
    /// The byte offset (a C expression) of logical chunk `j` of stored row `r`.
    fn at(&self, r: &str, j: &str) -> String {
        let (pd, cm) = self.swizzle();
        if cm == 1 {
            return format!("({r}) * {} + (({j}) << 4)", self.row_bytes);
        }
        let phase = if pd == 1 { format!("(({r}) % {cm})") } else { format!("((({r}) / {pd}) % {cm})") };
        format!("({r}) * {} + ((({j}) ^ {phase}) << 4)", self.row_bytes)
    }
}

/// The operand `o` of M/N extent `mn` as its stage stores it: rows along the tensor's
/// non-unit-stride tile dimension, 16-byte chunks along the unit-stride one.
fn stage_tile(k: &Kernel, spec: &Spec, o: &crate::mma_plan::MmaOperand, mn: u32, bk: u32, esz: u32) -> Result<Operand, CodegenError> {
    let unsupported = |m: String| CodegenError::Unsupported(m);
    let Op::Load { tensor, dims } = k.op(o.load) else { return Err(unsupported("a dot operand that is not a load".into())) };
    let order = crate::passes::select_mma_path::tma_order(k, spec, o.load).ok_or_else(|| unsupported("a dot operand without a unit-stride dimension".into()))?;
    let unit = order[0] as usize;
    let td = tile_dims(k, o.load);
    if td.len() != 2 || !td.contains(&unit) {
        return Err(unsupported("a dot operand whose unit-stride dimension is not one of its tile axes".into()));
    }
    let outer = if td[0] == unit { td[1] } else { td[0] };
    let ext = |d: usize| match dims[d] {
        AccessDim::Tile(e) => extent_value(k, e),
        AccessDim::Index => 1,
        AccessDim::Gather(_) => unreachable!("the matrix path takes no gathered load"),
    };
    let (rows, row_elems) = (ext(outer), ext(unit));
    let want = match o.major {
        Major::K => (mn, bk),
        Major::MN => (bk, mn),
    };
    if (rows, row_elems) != want {
        return Err(unsupported(format!("a dot operand stored as {rows} rows of {row_elems} elements, expected {want:?}")));
    }
    Ok(Operand { load: o.load, tensor: *tensor, outer, unit, rows, row_bytes: row_elems * esz, major: o.major })
}

/// The mma.sync kernel as its parts read it: the plan and its loop, the block's
/// threads, the operands' dtype, the instruction tiles a warp holds (`mi_n` of 16 rows,
/// `ni_n` of 8 columns) and the K steps of a stage (`ks`), and the operands' tiles in a
/// stage of `stage_bytes`.
struct SyncKernel<'a> {
    plan: &'a MmaPlan,
    info: LoopInfo,
    threads: u32,
    dtype: DType,
    mi_n: u32,
    ni_n: u32,
    ks: u32,
    operands: Vec<Operand>,
    stage_bytes: u32,
}

impl<'a> SyncKernel<'a> {
    /// Checks the tile against the warps and stages and lays out the operands' tiles.
    fn new(k: &Kernel, spec: &Spec, plan: &'a MmaPlan) -> Result<Self, CodegenError> {
        let unsupported = |m: String| CodegenError::Unsupported(m);
        let [bm, bn, bk] = plan.tile;
        let [wm, wn] = plan.warps;
        let stages = plan.stages;
        let threads = 32 * wm * wn;
        if threads != k.schedule.num_threads {
            return Err(unsupported(format!("{wm}x{wn} warps but {} threads in the schedule", k.schedule.num_threads)));
        }
        let dtype = k.ty(k.operands(plan.dot)[0]).dtype;
        let esz = dtype.size_bytes() as u32;
        let (mi_n, ni_n, ks) = (bm / (16 * wm), bn / (8 * wn), bk / 16);
        if mi_n == 0 || ni_n % 2 != 0 || bk % 16 != 0 || bm % (16 * wm) != 0 || bn % (16 * wn) != 0 || stages < 2 {
            return Err(unsupported(format!("a {bm}x{bn}x{bk} tile over {wm}x{wn} warps in {stages} stages on the mma.sync path")));
        }
        let info = dot_loop(k, plan)?;
        // the operands' shared-memory tiles
        let operands = vec![stage_tile(k, spec, &plan.a, bm, bk, esz)?, stage_tile(k, spec, &plan.b, bn, bk, esz)?];
        let stage_bytes = operands[0].bytes() + operands[1].bytes();
        Ok(SyncKernel { plan, info, threads, dtype, mi_n, ni_n, ks, operands, stage_bytes })
    }

    /// Accumulator registers a thread: four an instruction tile.
    fn regs(&self) -> u32 {
        self.mi_n * self.ni_n * 4
    }

    /// The thread's setup before the loop: the ring's shared address, the warp's place in
    /// the warp grid (the accumulator layout's warp digits), the `ldmatrix` addresses
    /// (returned: A's and B's fragment address, C expressions) and each operand's first
    /// copied chunk.
    fn thread_setup(&self, e: &mut Emitter) -> Result<[String; 2], CodegenError> {
        let [wm, wn] = self.plan.warps;
        e.line("const unsigned kf_pipe = kf_smem_u32(kf_smem);")?;
        e.line(format!("const int kf_wm = (kf_warp / {wn}) % {wm};"))?;
        e.line(format!("const int kf_wn = kf_warp % {wn};"))?;
        e.line("const int kf_q = kf_lane >> 3;")?;
        e.line("const int kf_r8 = kf_lane & 7;")?;
        let addr = [self.fragment_address(e, 0)?, self.fragment_address(e, 1)?];
        // the copies: thread `t` moves chunk `t % C` of rows `t / C + i * (threads / C)`
        for (oi, op) in self.operands.iter().enumerate() {
            let c = op.chunks();
            if !self.threads.is_multiple_of(c) {
                return Err(CodegenError::Unsupported(format!("rows of {c} 16-byte chunks copied by {} threads", self.threads)));
            }
            e.line(format!("const int kf_r{oi} = kf_tid / {c};"))?;
            e.line(format!("const int kf_j{oi} = kf_tid % {c};"))?;
        }
        Ok(addr)
    }

    /// The `ldmatrix` address of operand `i`'s fragments. The 8-lane group q addresses
    /// matrix q; a fragment's stored row is `R_thr + R_c` and its logical chunk
    /// `J_thr | J_c` (disjoint bits), with the constant parts `R_c` (a multiple of 8) and
    /// `J_c` known once unrolled. The swizzle phase of a row then depends on `kf_r8`
    /// alone, so a thread keeps two numbers per operand: its row's byte offset and
    /// `J_thr ^ phase`; a fragment's address is `row + R_c * row_bytes + ((t ^ J_c) << 4)`.
    /// A (per 16 rows mi): matrix q covers rows +8 (q & 1) and k +8 (q >> 1);
    /// B (per two 8-column instruction tiles nj): tile 2 nj + (q >> 1) and k +8 (q & 1).
    fn fragment_address(&self, e: &mut Emitter, i: usize) -> Result<String, CodegenError> {
        let [wm, wn] = self.plan.warps;
        let op = &self.operands[i];
        let (r_thr, r_c, j_thr, j_c): (String, String, String, String) = match (i == 0, op.major) {
            (true, Major::K) => ("kf_wm * 16 + (kf_q & 1) * 8 + kf_r8".into(), format!("mi * {}", 16 * wm), "(kf_q >> 1)".into(), "kk * 2".into()),
            (true, Major::MN) => ("(kf_q >> 1) * 8 + kf_r8".into(), "kk * 16".into(), "(kf_wm * 2 + (kf_q & 1))".into(), format!("mi * {}", 2 * wm)),
            (false, Major::K) => (format!("(kf_wn + {wn} * (kf_q >> 1)) * 8 + kf_r8"), format!("nj * {}", 16 * wn), "(kf_q & 1)".into(), "kk * 2".into()),
            (false, Major::MN) => ("(kf_q & 1) * 8 + kf_r8".into(), "kk * 16".into(), format!("(kf_wn + {wn} * (kf_q >> 1))"), format!("nj * {}", 2 * wn)),
        };
        let x = if i == 0 { "a" } else { "b" };
        let (pd, cm) = op.swizzle();
        let phase = if cm == 1 { String::new() } else { format!(" ^ ((kf_r8 / {pd}) % {cm})") };
        e.line(format!("const unsigned kf_row_{x} = ({r_thr}) * {};", op.row_bytes))?;
        e.line(format!("const int kf_t_{x} = {j_thr}{phase};"))?;
        Ok(format!("kf_row_{x} + ({r_c}) * {} + ((kf_t_{x} ^ ({j_c})) << 4)", op.row_bytes))
    }

    /// The ring: the prologue fills `stages - 1` stages; each iteration waits for its
    /// stage, issues the copies of the stage `stages - 1` ahead, and computes.
    fn main_loop(&self, e: &mut Emitter, trip: &Trip, addr: &[String; 2]) -> R {
        let (stages, stage_bytes) = (self.plan.stages, self.stage_bytes);
        let (a_bytes, b_bytes) = (self.operands[0].bytes(), self.operands[1].bytes());
        e.line(format!("// pipeline: {stages} stages of {stage_bytes} bytes (A {a_bytes}, B {b_bytes})"))?;
        e.unroll("s", stages - 1)?;
        e.open("if (s < kf_n)")?;
        self.issue(e, trip, "s", &format!("kf_pipe + s * {stage_bytes}"))?;
        e.close()?;
        e.line("kf_cp_async_commit();")?;
        e.close()?;
        e.line("int kf_rs = 0;")?;
        e.line(format!("int kf_ws = {};", stages - 1))?;
        e.open("for (long long kf_it = 0; kf_it < kf_n; ++kf_it)")?;
        e.line(format!("kf_cp_async_wait<{}>();", stages - 2))?;
        e.line("__syncthreads();")?;
        e.open("")?;
        e.line(format!("const long long kf_nx = kf_it + {};", stages - 1))?;
        e.open("if (kf_nx < kf_n)")?;
        self.issue(e, trip, "kf_nx", &format!("(kf_pipe + kf_ws * {stage_bytes})"))?;
        e.close()?;
        e.line("kf_cp_async_commit();")?;
        e.close()?;
        e.line(format!("const unsigned kf_sa = kf_pipe + kf_rs * {stage_bytes};"))?;
        e.line(format!("const unsigned kf_sb = kf_sa + {a_bytes};"))?;
        self.compute(e, addr)?;
        e.line(format!("if (++kf_rs == {stages}) kf_rs = 0;"))?;
        e.line(format!("if (++kf_ws == {stages}) kf_ws = 0;"))?;
        e.close()?; // k loop
        e.line("kf_cp_async_wait<0>();")
    }

    /// The stage at `kf_sa` / `kf_sb`: per `k16` step each warp's A and B fragments
    /// (`ldmatrix`, `.trans` for an MN-major operand), then its `mma.sync`s.
    fn compute(&self, e: &mut Emitter, addr: &[String; 2]) -> R {
        let (mi_n, ni_n) = (self.mi_n, self.ni_n);
        let ld = |op: &Operand| if op.major == Major::K { "kf_ldsm_x4" } else { "kf_ldsm_x4_t" };
        let (lda, ldb) = (ld(&self.operands[0]), ld(&self.operands[1]));
        e.unroll("kk", self.ks)?;
        e.line(format!("unsigned kf_fa[{mi_n}][4];"))?;
        e.line(format!("unsigned kf_fb[{ni_n}][2];"))?;
        e.unroll("mi", mi_n)?;
        e.line(format!("{lda}(kf_fa[mi], kf_sa + {});", addr[0]))?;
        e.close()?;
        e.unroll("nj", ni_n / 2)?;
        e.line("unsigned t[4];")?;
        e.line(format!("{ldb}(t, kf_sb + {});", addr[1]))?;
        e.line("kf_fb[2 * nj][0] = t[0]; kf_fb[2 * nj][1] = t[1];")?;
        e.line("kf_fb[2 * nj + 1][0] = t[2]; kf_fb[2 * nj + 1][1] = t[3];")?;
        e.close()?;
        e.unroll("mi", mi_n)?;
        e.unroll("ni", ni_n)?;
        e.line(format!("kf_mma(&kf_acc[(mi * {ni_n} + ni) * 4], kf_fa[mi], kf_fb[ni]);"))?;
        e.close()?;
        e.close()?;
        e.close() // kk
    }

    /// The copies of loop iteration `it` into the stage at shared address `dst`.
    fn issue(&self, e: &mut Emitter, trip: &Trip, it: &str, dst: &str) -> R {
        bind_iteration(e, &self.info, trip, it)?;
        let mut base = 0;
        for (oi, op) in self.operands.iter().enumerate() {
            self.issue_operand(e, oi, op, &format!("{dst} + {base}"))?;
            base += op.bytes();
        }
        Ok(())
    }

    /// The `cp.async` copies of operand `oi`'s tile into its place `dst` in a stage: this
    /// thread's chunks, column `kf_j`, rows `kf_r + i * sweep`, each zero-filled where
    /// it hangs over the tensor's edge.
    fn issue_operand(&self, e: &mut Emitter, oi: usize, op: &Operand, dst: &str) -> R {
        let k = e.k;
        let esz = self.dtype.size_bytes() as u32;
        let p = k.param(op.tensor);
        let tdims = k.tensor_dims(op.tensor).to_vec();
        let offs: Vec<ValueId> = k.operands(op.load);
        // the block's corner, and the conditions on its indexed dimensions
        let (corner, ok) = index_corner(e, op.load);
        let name = |v: ValueId| e.val(v).name.clone();
        let (oo, ou) = (name(offs[op.outer]), name(offs[op.unit]));
        let (no, nu) = (e.shape_var(tdims[op.outer]), e.shape_var(tdims[op.unit]));
        let so = e.stride(op.tensor, op.outer);
        let per = 16 / esz;
        let sweep = self.threads / op.chunks();
        let (r0, j0) = (format!("kf_r{oi}"), format!("kf_j{oi}"));
        let st = |x: &str| if so == "1" { x.to_string() } else { format!("({x}) * {so}") };
        e.open("")?;
        e.line(format!("const {}* g = {corner} + {} + {ou} + {j0} * {per};", stype(self.dtype), st(&format!("{oo} + {r0}"))))?;
        e.line(format!("const long long ro = {no} - ({oo} + {r0});"))?;
        e.line(format!("const long long ru = ({nu} - ({ou} + {j0} * {per})) * {esz};"))?;
        let mut okc = ok;
        okc.push("ru > 0".into());
        if !non_negative_in_loop(k, offs[op.unit]) {
            okc.push(format!("{ou} + {j0} * {per} >= 0"));
        }
        e.line(format!("const bool okc = {};", okc.join(" && ")))?;
        e.unroll("i", op.rows.div_ceil(sweep))?;
        if !op.rows.is_multiple_of(sweep) {
            e.line(format!("if ({r0} + i * {sweep} >= {}) break;", op.rows))?;
        }
        let mut cond = vec!["okc".to_string(), format!("i * {sweep} < ro")];
        if !non_negative_in_loop(k, offs[op.outer]) {
            cond.push(format!("{oo} + {r0} + i * {sweep} >= 0"));
        }
        e.line(format!("const bool in = {};", cond.join(" && ")))?;
        e.line(format!(
            "kf_cp_async16({dst} + {}, in ? g + {} : p_{}, in ? (ru < 16 ? (unsigned)ru : 16u) : 0u);",
            op.at(&format!("{r0} + i * {sweep}"), &j0),
            st(&format!("(long long)(i * {sweep})")),
            p.name
        ))?;
        e.close()?;
        e.close()
    }
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
    let m = SyncKernel::new(k, spec, plan)?;
    let regs = m.regs();
    let (mut e, ranges, (start, step)) = block_prologue(k, spec, grid, plan, m.info.for_pos, regs)?;
    let addr = m.thread_setup(&mut e)?;
    let slice = operand_slice(k, plan, &m.info)?;
    m.main_loop(&mut e, &Trip { start, step, slice }, &addr)?;
    // the epilogue: everything after the loop, on the accumulator registers
    let (res, map) = accumulator_map(k, &m.info)?;
    if map.regs != regs {
        return Err(CodegenError::Unsupported(format!("accumulator layout of {} registers, the instructions give {regs}", map.regs)));
    }
    epilogue(&mut e, &m.info, res, accumulator_val(plan, map, ranges))?;
    let (stages, stage_bytes) = (plan.stages, m.stage_bytes);
    let ring = format!("{stages} pipeline stages of {stage_bytes}");
    let prelude = mma_sync_prelude(m.dtype);
    let preludes = [prelude.as_str()];
    let b = BlockKernel { threads: m.threads, preludes: &preludes, align: 128, ring_bytes: stages * stage_bytes, ring };
    finish_block_kernel(e, target, &b, &decls, params)
}

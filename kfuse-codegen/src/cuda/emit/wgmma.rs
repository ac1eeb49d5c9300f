//! The sm_90a matrix path: prints a kernel whose schedule holds an [`MmaPlan`] of
//! path [`MmaPath::WgmmaTma`].
//!
//! Shape of the generated kernel (the plan decides every number):
//! - one producer warpgroup (threads 0..128, registers lowered with `setmaxnreg`: 24
//!   beside consumers of 256-wide tiles, which take 240; 40 beside 232 when such a
//!   kernel also multicasts, 56 beside 224 when it splits its loop; else 56, since the
//!   split loop's index arithmetic spilled at 40) whose
//!   first thread issues the TMA loads of both operands into a ring of `stages`
//!   shared-memory stages, each completing on its `full` mbarrier;
//! - `consumers` warpgroups (registers raised) that wait on `full`, issue `wgmma`
//!   (`m64nBNk16` for 16-bit operands, `k32` for 8-bit ones, `k8 … .tf32` for the f32
//!   operands of a `dot_tf32`: 32 bytes of K every time;
//!   operands from 128-byte-swizzled shared memory through matrix
//!   descriptors) into f32 accumulators, and free a stage on its `empty` mbarrier once
//!   the instructions reading it have completed (one group kept in flight);
//! - a persistent grid: each block walks the output tiles `blockIdx.x, +gridDim.x, …`,
//!   grouped `group_m` tile rows at a time so that concurrent tiles share operands in
//!   L2; producer and consumers walk the same sequence, so the ring's phases agree;
//! - after the loop, the consumers run the rest of the kernel (the epilogue: casts,
//!   bias, activations, stores — any tile ops) through the ordinary writer, on the
//!   accumulator registers in the instruction's layout
//!   ([`crate::layout::mma_accumulator`]), with a named barrier over the consumers
//!   wherever the writer needs one; a `[BM, BN]` store leaves through swizzled shared
//!   memory and a TMA bulk store when the plan says so (`MmaPlan::store`): the whole
//!   tile at once, or box by box through two box-sized buffers
//!   (`MmaPlan::store_buffers`, for 128x320 tiles, whose whole tile would cost a stage);
//! - a tile wider than one instruction (`BN = 320`): each K step issues an `m64n256`
//!   and an `m64n64` wgmma ([`MmaPlan::wgmma_widths`]) into one accumulator array (the
//!   one-instruction layout continued), the second's B descriptor advanced to its
//!   columns; a K-major B tile of 320 rows comes in two 160-row TMA boxes;
//! - several dots in the loop ([`MmaPlan::more`]): a stage holds each distinct operand
//!   tile once (the producer loads a shared A tile once for all of them, tensor maps
//!   `kf_tm0…` in [`MmaPlan::stage_operands`] order, the output's map after them);
//!   each consumer keeps one accumulator array per dot (`kf_acc`, `kf_acc1`, …) and
//!   issues every dot's `wgmma` per K step into one commit group; the epilogue sees
//!   each loop result on its own registers;
//! - on request (`MmaPlan::pingpong`), ping-pong consumers: each warpgroup holds whole
//!   128-row tiles (two `m64` instructions a K step, rows 64..128 in the second half of
//!   its accumulator), the two take alternate tiles of the block's walk, each skips the
//!   other's stages in the ring and starts a loop only after the other has waited on
//!   its last stage (named barriers 3 and 4), and each has its own output tile in shared
//!   memory, barrier (1 + warpgroup) and bulk-store thread;
//! - on request, thread-block clusters: `split_k` blocks share one tile's loop and sum
//!   their partial accumulators in the first block through distributed shared memory,
//!   or `multicast` blocks on neighbouring tiles of one tile row share A by TMA
//!   multicast (of one tile column, B, under `multicast_b`; each stage is then
//!   released in every block of the cluster);
//! - for the runtime's split of a last wave (`MmaPlan::walk`): a walk over the whole
//!   waves' tiles only, or over the last tiles, one cluster of the split each (its
//!   partial and output tile then reuse the stage ring).
//!
//! The writer plans the kernel first ([`WgmmaKernel::new`]: tensor maps, stage layout,
//! shared memory), then prints it in parts: the ring's barriers, the tile walk and the
//! producer (`wgmma/producer.rs`), the consumers' main loop, split reduction and
//! epilogue (`wgmma/consumer.rs`), and the epilogue's TMA store (`tma_store.rs`, shared with
//! the general lowering).
//!
//! Shared memory of one operand in one stage, by majorness (swizzle 128 B): K-major —
//! `rows × 128` bytes (64 16-bit, 128 8-bit or 32 f32 elements), 8-row atoms 1024 bytes apart
//! (descriptor SBO 1024, each instruction's K step +32 bytes); MN-major (16-bit only) — boxes of
//! `BK × 64` elements (`BK` rows of 128 bytes), one per 64 rows/columns, 8-row atoms
//! 1024 bytes apart (SBO) and boxes `BK * 128` bytes apart (LBO), each `k16` step +2048
//! bytes. TMA writes exactly these boxes (box inner extent = 128 bytes).

use super::mma_common::{accumulator_map_of, accumulator_name, accumulator_val_named, dot_loop, scalar_slice, zeroed_accumulators, AccRanges};
use super::*;
use kfuse_ir::LoopInfo;

use crate::target::GridAxisEval;
use crate::mma_plan::{Major, MmaDot, MmaOperand, MmaPlan};
use crate::target::Walk;

/// One operand as the writer needs it.
struct Operand {
    /// The tensor map parameter name.
    map: String,
    /// Offsets (C expressions, `long long`) per tensor dimension.
    offs: Vec<String>,
    /// Tensor dimensions innermost first (TMA's order).
    order: Vec<u32>,
    /// Box per tensor dimension (outermost first) and the number of boxes along the
    /// innermost dimension.
    boxes: Vec<u32>,
    nq: u32,
    /// The `nq` boxes follow each other along the outer dimension (slices of rows for
    /// multicast), not along the innermost one.
    outer_slices: bool,
    box_bytes: u32,
    bytes: u32,
    major: Major,
    /// An A tile `[BM, BK]` (else a B tile `[BK, BN]`).
    is_a: bool,
}

impl Operand {
    /// Its tile in WGMMA descriptor terms, in bytes: the step from one 64-row half of an
    /// A tile to the next (0 for B), the step from one instruction's 32 bytes of K to
    /// the next, and the leading-dimension byte offset.
    fn desc_steps(&self) -> (u32, u32, u32) {
        match (self.is_a, self.major) {
            (true, Major::K) => (64 * 128, 32, 16),
            (true, Major::MN) => (self.box_bytes, 2048, self.box_bytes),
            (false, Major::K) => (0, 32, 16),
            (false, Major::MN) => (0, 2048, self.box_bytes),
        }
    }
}

/// The TMA boxes of an operand load: per tensor dimension the tile extent (1 for an
/// indexed dimension), the innermost (`order[0]`) capped at one swizzle span; how many
/// boxes cover the tile, and whether they follow each other along the next dimension
/// (`order[1]`) rather than the innermost: a tile of one span whose next extent is over
/// TMA's 256 (a K-major `[320, 64]` B tile) comes in slices of that dimension, the
/// fewest whose rows are a multiple of 8 (two of 160).
fn boxes_of(k: &Kernel, o: &MmaOperand, order: &[u32]) -> Result<(Vec<u32>, u32, u32, bool), CodegenError> {
    let Op::Load { tensor, dims } = k.op(o.load) else { return Err(CodegenError::Unsupported("operand is not a load".into())) };
    let esz = k.param(*tensor).dtype.size_bytes() as u32;
    let span = o.swizzle / esz;
    let mut b: Vec<u32> = dims
        .iter()
        .map(|d| match d {
            AccessDim::Index => 1,
            AccessDim::Gather(_) => unreachable!("the matrix path takes no gathered load"),
            AccessDim::Tile(e) => extent_value(k, *e),
        })
        .collect();
    let inner_dim = order[0] as usize;
    let inner = b[inner_dim];
    let mut nq = inner.div_ceil(span).max(1);
    b[inner_dim] = inner.min(span);
    let mut outer_slices = false;
    if let (1, Some(&next)) = (nq, order.get(1)) {
        let ext = b[next as usize];
        if let Some(n) = (2..=ext / 8).find(|&n| ext.is_multiple_of(n) && (ext / n).is_multiple_of(8) && ext / n <= 256).filter(|_| ext > 256) {
            b[next as usize] = ext / n;
            nq = n;
            outer_slices = true;
        }
    }
    if b.iter().any(|&x| x > 256) {
        return Err(CodegenError::Unsupported(format!("a TMA box of {b:?} (at most 256 per dimension)")));
    }
    let box_bytes = b.iter().product::<u32>() * esz;
    Ok((b, nq, box_bytes, outer_slices))
}

/// The name of operand `i`'s descriptor at stage 0 and k-step 0 in the consumers (an A
/// operand: this warpgroup's rows, or under ping-pong the tile's first 64).
fn desc_base(i: usize) -> String {
    format!("kf_dbase{i}")
}

/// The name of the WGMMA helper dot `d` calls: `kf_wgmma` for the majorness of the
/// plan's first dot `first`, `kf_wgmma_MK`-style (A's then B's: `K` or `M`) for another.
fn wgmma_name(first: &MmaDot, d: &MmaDot) -> String {
    if (d.a.major, d.b.major) == (first.a.major, first.b.major) {
        return "kf_wgmma".into();
    }
    let m = |x: Major| if x == Major::K { "K" } else { "M" };
    format!("kf_wgmma_{}{}", m(d.a.major), m(d.b.major))
}

/// A `kf_wgmma`-style helper `name`: one `m64nNkK` instruction (K = 32 bytes of the dtype) with
/// f32 accumulators per width of `widths` ([`MmaPlan::wgmma_widths`]), the next one's
/// accumulators after the last one's and its B descriptor advanced by `b_offsets[i]`
/// bytes (the start address field counts 16-byte units); the transpose immediates exist
/// only for 16-bit operands. f32 operands are read as TF32 (`k8 … .tf32`): the plan
/// takes them only from a `dot_tf32`.
fn wgmma_fn(name: &str, dtype: DType, widths: &[u32], b_offsets: &[u32], trans_a: bool, trans_b: bool) -> Result<String, CodegenError> {
    if widths.len() == 1 {
        return wgmma_instr_fn(name, dtype, widths[0], trans_a, trans_b);
    }
    let mut text = String::new();
    let mut body = String::new();
    let mut at = 0;
    for (i, (&n, &off)) in widths.iter().zip(b_offsets).enumerate() {
        let piece = format!("{name}_{i}");
        text.push_str(&wgmma_instr_fn(&piece, dtype, n, trans_a, trans_b)?);
        let db = if off == 0 { "db".to_string() } else { format!("db + {}ull", off >> 4) };
        body.push_str(&format!("  {piece}(d + {at}, da, {db});\n"));
        at += n / 2;
    }
    text.push_str(&format!("static __device__ __forceinline__ void {name}(float* d, unsigned long long da, unsigned long long db) {{\n{body}}}\n"));
    Ok(text)
}

/// One `m64nNkK` instruction as a helper (see [`wgmma_fn`]).
fn wgmma_instr_fn(name: &str, dtype: DType, n: u32, trans_a: bool, trans_b: bool) -> Result<String, CodegenError> {
    let regs = n / 2;
    let ty = match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F8E4M3 => "e4m3",
        DType::F8E5M2 => "e5m2",
        DType::F32 => "tf32",
        d => return Err(CodegenError::Unsupported(format!("WGMMA of {d} operands"))),
    };
    let kk = 32 / dtype.size_bytes();
    let trans = if dtype.size_bytes() == 2 { format!(", {}, {}", trans_a as u32, trans_b as u32) } else { String::new() };
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    Ok(format!(
        "static __device__ __forceinline__ void {name}(float* d, unsigned long long da, unsigned long long db) {{\n  asm volatile(\"wgmma.mma_async.sync.aligned.m64n{n}k{kk}.f32.{ty}.{ty} {{{}}}, %{}, %{}, 1, 1, 1{trans};\"\n    : {}\n    : \"l\"(da), \"l\"(db));\n}}\n",
        list.join(", "),
        regs,
        regs + 1,
        outs.join(", ")
    ))
}


mod consumer;
mod producer;

/// The output tile's TMA store ([`MmaPlan::store`]): the store op, the box's inner extent
/// in elements (one swizzle span) and the bytes of one `[BM, inner]` box.
#[derive(Clone, Copy)]
struct OutputMap {
    store: OpId,
    inner: u32,
    box_bytes: u32,
}

/// The WGMMA kernel as its parts read it, fixed before any text is written: the plan's
/// cluster shape, the operands' tensor maps and where each lies in a stage, and the
/// shared-memory plan of the epilogue.
struct WgmmaKernel<'a> {
    k: &'a Kernel,
    grid: &'a [GridAxisEval],
    plan: &'a MmaPlan,
    info: LoopInfo,
    /// Every dot of the plan, the first one first ([`MmaPlan::all_dots`]).
    dots: Vec<MmaDot>,
    dtype: DType,
    /// Blocks sharing one tile's loop (`split_k`), blocks sharing an operand by
    /// multicast, the cluster size (the larger of the two).
    split: u32,
    mcast: u32,
    cluster: u32,
    /// Ping-pong consumers ([`MmaPlan::pingpong`]).
    pp: bool,
    /// The stage operand a multicast cluster shares (0: A, 1: B under `multicast_b`) and
    /// the grid axis along which its blocks hold neighbouring tiles (1 when they share
    /// A, a tile row; 0 when they share B, a tile column).
    shared: usize,
    mcast_axis: usize,
    /// The distinct operand tiles of a stage, their offsets in it and its size.
    operands: Vec<Operand>,
    at: Vec<u32>,
    stage_bytes: u32,
    /// The output tile's (or under a split, the partial's) offset from `kf_pipe`, whether
    /// it lies over the ring, the bytes of one output tile, the dynamic shared memory.
    c_off: u32,
    aliased: bool,
    c_bytes: u32,
    dynamic_smem: u32,
    c_map: Option<OutputMap>,
    /// The output's tensor map (`kf_tm2` for a single dot).
    c_map_name: String,
    grouped: bool,
    /// Words of a grouped launch's problem record.
    rec: usize,
    decls: Vec<String>,
    /// The C name of the loop index.
    index_name: String,
    /// The persistent walk over the output tiles.
    tile_walk: String,
}

/// The stage pointer of operand `i` (`kf_sa`, `kf_sb` for a single dot's A and B).
fn stage_ptr(i: usize) -> String {
    match i {
        0 => "kf_sa".to_string(),
        1 => "kf_sb".to_string(),
        i => format!("kf_s{i}"),
    }
}

/// One tensor map per distinct operand tile of a stage (A and B of a single dot), its
/// declaration and launch parameter added.
fn operand_maps(k: &Kernel, spec: &Spec, plan: &MmaPlan, dots: &[MmaDot], params: &mut Vec<KernelParam>, decls: &mut Vec<String>) -> Result<Vec<Operand>, CodegenError> {
    let mut operands = Vec::new();
    for (i, o) in plan.stage_operands().iter().enumerate() {
        let is_a = dots.iter().any(|d| d.a.load == o.load);
        let Op::Load { tensor, .. } = k.op(o.load) else { unreachable!() };
        let order = crate::passes::select_mma_path::tma_order(k, spec, o.load)
            .ok_or_else(|| CodegenError::Unsupported("a dot operand without a unit-stride dimension".into()))?;
        let (boxes, nq, box_bytes, outer_slices) = boxes_of(k, o, &order)?;
        let map = format!("kf_tm{i}");
        decls.push(format!("const __grid_constant__ CUtensorMap {map}"));
        params.push(KernelParam::TensorMap { tensor: *tensor, box_dims: boxes.clone(), swizzle: o.swizzle, order: order.clone() });
        let offs = k.operands(o.load).iter().map(|v| format!("v{}", v.index())).collect();
        operands.push(Operand { map, offs, order, boxes, nq, outer_slices, box_bytes, bytes: box_bytes * nq, major: o.major, is_a });
    }
    Ok(operands)
}

impl Operand {
    /// Multicast over `mcast` blocks: each block of the cluster loads a slice of this
    /// (shared) tile for all of them — whole boxes when the tile comes in several, else a
    /// slice of its rows.
    fn slice_for_multicast(&mut self, mcast: u32) -> R {
        let name = if self.is_a { "A" } else { "B" };
        if self.boxes.len() != 2 {
            return Err(CodegenError::Unsupported("multicast of a rank-3 operand".into()));
        }
        if !self.nq.is_multiple_of(mcast) {
            if self.nq != 1 {
                return Err(CodegenError::Unsupported(format!("multicast over {mcast} blocks of {} boxes of {name}", self.nq)));
            }
            let outer = self.order[1] as usize;
            if !self.boxes[outer].is_multiple_of(8 * mcast) {
                return Err(CodegenError::Unsupported(format!("multicast of a {}-row {name} tile over {mcast} blocks", self.boxes[outer])));
            }
            self.boxes[outer] /= mcast;
            self.box_bytes /= mcast;
            self.nq = mcast;
            self.outer_slices = true;
        }
        Ok(())
    }
}

/// The output's tensor map named `name` when the plan stores the tile by TMA, its
/// declaration and launch parameter added.
fn output_map(k: &Kernel, plan: &MmaPlan, name: &str, params: &mut Vec<KernelParam>, decls: &mut Vec<String>) -> Option<OutputMap> {
    let st = plan.store.as_ref()?;
    let Op::Store { tensor, .. } = k.op(st.load) else { unreachable!() };
    let esz = k.param(*tensor).dtype.size_bytes() as u32;
    let inner = st.swizzle / esz;
    let bm = plan.tile[0];
    decls.push(format!("const __grid_constant__ CUtensorMap {name}"));
    params.push(KernelParam::TensorMap { tensor: *tensor, box_dims: vec![bm, inner], swizzle: st.swizzle, order: vec![1, 0] });
    Some(OutputMap { store: st.load, inner, box_bytes: bm * inner * esz })
}

/// The plan's dot loop, once what the plan asks of the cluster and the grid is checked.
fn checked_loop(k: &Kernel, grid: &[GridAxisEval], plan: &MmaPlan) -> Result<LoopInfo, CodegenError> {
    if grid.is_empty() || grid.len() > 3 {
        return Err(CodegenError::Unsupported("a dot kernel must index its output by program ids (1 to 3 grid axes)".into()));
    }
    let info = dot_loop(k, plan)?;
    let (split, mcast) = (plan.split_k.max(1), plan.multicast.max(1));
    let cluster = split.max(mcast);
    if plan.pingpong && (cluster > 1 || k.schedule.grouped || !plan.more.is_empty() || plan.consumers != 2 || plan.tile[0] != 128) {
        return Err(CodegenError::Unsupported("ping-pong consumers with a cluster, a grouped launch, several dots, or other than two warpgroups on 128-row tiles".into()));
    }
    if split > 1 && mcast > 1 {
        return Err(CodegenError::Unsupported("a dot loop split across a cluster and multicast at once".into()));
    }
    Ok(info)
}

impl<'a> WgmmaKernel<'a> {
    /// Plans the kernel: the operands' tensor maps (added to `params` and `decls`), a
    /// multicast's slices, the stage layout and the epilogue's shared memory.
    fn new(k: &'a Kernel, spec: &Spec, grid: &'a [GridAxisEval], plan: &'a MmaPlan, params: &mut Vec<KernelParam>, mut decls: Vec<String>) -> Result<Self, CodegenError> {
        let [bm, bn, bk] = plan.tile;
        let dtype = k.ty(k.operands(plan.dot)[0]).dtype;
        let esz = dtype.size_bytes() as u32;
        let info = checked_loop(k, grid, plan)?;
        let (split, mcast) = (plan.split_k.max(1), plan.multicast.max(1));
        let cluster = split.max(mcast);
        let pp = plan.pingpong;
        let dots = plan.all_dots();
        let mut operands = operand_maps(k, spec, plan, &dots, params, &mut decls)?;
        let shared = usize::from(plan.multicast_b);
        let mcast_axis = usize::from(!plan.multicast_b);
        if mcast > 1 && (bn > 256 || operands.iter().any(|o| o.outer_slices)) {
            return Err(CodegenError::Unsupported(format!("multicast of a {bm}x{bn} tile (tiles wider than 256 columns take no cluster)")));
        }
        if split > 1 && bn > 256 {
            return Err(CodegenError::Unsupported(format!("a {bm}x{bn} tile split across a cluster (tiles wider than 256 columns take no cluster)")));
        }
        if mcast > 1 {
            operands[shared].slice_for_multicast(mcast)?;
            let boxes = operands[shared].boxes.clone();
            // the operands' maps lead the signature's tensor maps, in stage order
            if let Some(KernelParam::TensorMap { box_dims, .. }) = params.iter_mut().filter(|p| matches!(p, KernelParam::TensorMap { .. })).nth(shared) {
                *box_dims = boxes;
            }
        }
        if operands.iter().any(|o| o.bytes != if o.is_a { bm * bk * esz } else { bk * bn * esz }) {
            return Err(CodegenError::Unsupported("TMA boxes that do not cover the dot's tiles".into()));
        }
        // each operand's offset in a stage, in stage order
        let mut at = Vec::new();
        let mut stage_bytes = 0;
        for o in &operands {
            at.push(stage_bytes);
            stage_bytes += o.bytes;
        }
        // the epilogue's output tile (TMA store) and, under a cluster split, the partial
        // accumulator (the same bytes: only the first block stores): after the stages and
        // the barriers (full, empty per stage; two for the split's hand-off), 1024-aligned
        let stages = plan.stages;
        let ring_end = (stages * stage_bytes + 16 * stages + 16).div_ceil(1024) * 1024;
        // (a kernel of one tile a block puts them over the ring, free once the loop is done:
        // `pipeline_stages::epilogue_reuses_ring`)
        let aliased = crate::passes::pipeline_stages::epilogue_reuses_ring(k);
        let c_off = if aliased { 0 } else { ring_end };
        let part_bytes = crate::passes::pipeline_stages::partial_bytes(k);
        // the output tiles' shared memory as `pipeline_stages` sized it (the whole tile, one
        // per warpgroup under ping-pong, or `store_buffers` of its boxes)
        let store_bytes = crate::passes::pipeline_stages::store_bytes(k);
        let c_bytes = store_bytes / if pp { plan.consumers } else { 1 };
        // the output's tensor map follows the operands' (`kf_tm2` for a single dot)
        let c_map_name = format!("kf_tm{}", operands.len());
        let c_map = output_map(k, plan, &c_map_name, params, &mut decls);
        // (ping-pong: one output tile per warpgroup, the second `c_bytes` after the first;
        // over the ring, `pipeline_stages` gave it one at least its size)
        let dynamic_smem = 1024 + ring_end.max(c_off + store_bytes.max(part_bytes));
        // a grouped launch (`Schedule::grouped`): the parameters, tensor maps included, come
        // from the record of the problem each tile belongs to
        let grouped = k.schedule.grouped;
        if grouped && cluster > 1 {
            return Err(CodegenError::Unsupported("a grouped launch of a dot loop split or multicast across a cluster".into()));
        }
        let rec = 4 + decls.len();
        let index_name = info.index.map(|v| format!("v{}", v.index())).unwrap_or_else(|| "kf_kv".into());
        let tile_walk = producer::tile_walk(plan.walk, cluster, split)?;
        Ok(WgmmaKernel {
            k,
            grid,
            plan,
            info,
            dots,
            dtype,
            split,
            mcast,
            cluster,
            pp,
            shared,
            mcast_axis,
            operands,
            at,
            stage_bytes,
            c_off,
            aliased,
            c_bytes,
            dynamic_smem,
            c_map,
            c_map_name,
            grouped,
            rec,
            decls,
            index_name,
            tile_walk,
        })
    }

    /// The position of a load among the stage's operands.
    fn op_index(&self, load: OpId) -> usize {
        self.plan.stage_operands().iter().position(|o| o.load == load).unwrap_or(0)
    }

    /// Accumulator registers a consumer thread: one m64 instruction's (BN / 2), or under
    /// ping-pong two, rows 0..64 then 64..128 of the tile.
    fn regs(&self) -> u32 {
        let half = self.plan.tile[1] / 2;
        if self.pp {
            2 * half
        } else {
            half
        }
    }

    /// The epilogue's barrier: the consumers of the tile — both warpgroups (named barrier
    /// 1), or under ping-pong the tile's own warpgroup (1 + kf_wg: 1 or 2).
    fn epilogue_barrier(&self) -> &'static str {
        if self.pp {
            "asm volatile(\"bar.sync %0, 128;\" :: \"r\"(1 + kf_wg) : \"memory\");"
        } else {
            "asm volatile(\"bar.sync 1, %0;\" :: \"n\"(KF_CONSUMERS * 128) : \"memory\");"
        }
    }

    /// One helper per majorness of the dots' operands (the first dot's is `kf_wgmma`).
    fn wgmma_helpers(&self) -> Result<String, CodegenError> {
        let dots = &self.dots;
        let mut text = String::new();
        let mut helpers: Vec<String> = Vec::new();
        for d in dots {
            let name = wgmma_name(&dots[0], d);
            if helpers.contains(&name) {
                continue;
            }
            // where each instruction's columns of B start in a stage
            let ob = &self.operands[self.op_index(d.b.load)];
            let widths = self.plan.wgmma_widths();
            let mut offsets = Vec::new();
            let mut col = 0;
            for w in &widths {
                offsets.push(match ob.major {
                    Major::MN => col / 64 * ob.box_bytes,
                    Major::K => col * 128,
                });
                col += w;
            }
            text.push_str(&wgmma_fn(&name, self.dtype, &widths, &offsets, d.a.major == Major::MN, d.b.major == Major::MN)?);
            helpers.push(name);
        }
        Ok(text)
    }

    /// The kernel's source around `body`: preludes, helpers, signature, thread ids and
    /// the epilogue's static shared memory.
    fn source(&self, target: &Target, static_smem: u32, body: &str) -> Result<String, CodegenError> {
        let (k, cluster, consumers) = (self.k, self.cluster, self.plan.consumers);
        let wgmma_text = self.wgmma_helpers()?;
        let mut w = Writer::new(String::new());
        let mut head = || -> std::fmt::Result {
            w.line(format!("// Generated by kfuse from kernel `{}` for {}. Do not edit.", k.name, target.arch()))?;
            w.raw(&crate::cuda::prelude::base_prelude(k))?;
            w.raw(crate::cuda::prelude::WGMMA_PRELUDE)?;
            if cluster > 1 {
                w.raw(crate::cuda::prelude::CLUSTER_PRELUDE)?;
            }
            w.line(format!("#define KF_CONSUMERS {consumers}"))?;
            w.raw(&wgmma_text)?;
            w.line("")?;
            let cattr = if cluster > 1 { format!("__cluster_dims__({cluster}, 1, 1) ") } else { String::new() };
            let sig = if self.grouped { "const long long* __restrict__ kf_grp, const long long kf_ngrp".to_string() } else { self.decls.join(", ") };
            w.open(format!("extern \"C\" __global__ void {cattr}__launch_bounds__({}, 1) {}({sig})", 128 * (consumers + 1), entry_name(k)))?;
            w.line("const int kf_tid = threadIdx.x;")?;
            w.line("const int kf_lane = kf_tid & 31;")?;
            w.line("(void)kf_lane;")?;
            if static_smem > 0 {
                w.line(format!("__shared__ __align__(16) unsigned char kf_smem[{}];", static_smem.div_ceil(16) * 16))?;
            }
            w.raw(body)?;
            w.close()
        };
        head().map_err(fmt_err)?;
        Ok(w.finish())
    }
}

pub(super) fn emit_kernel(
    k: &Kernel,
    spec: &Spec,
    target: &Target,
    grid: &[GridAxisEval],
    plan: &MmaPlan,
    mut params: Vec<KernelParam>,
    decls: Vec<String>,
) -> Result<Emitted, CodegenError> {
    let g = WgmmaKernel::new(k, spec, grid, plan, &mut params, decls)?;
    let mut e = Emitter::new(k, spec, g.epilogue_barrier(), grid);
    e.w.indent();
    g.barriers(&mut e)?;
    g.producer(&mut e)?;
    g.consumers(&mut e)?;
    if g.cluster > 1 {
        // no block leaves while another may still read or write its shared memory
        e.line("kf_cluster_sync();")?;
    }
    let static_smem = e.smem;
    let body = e.w.finish();
    let dynamic_smem = g.dynamic_smem;
    if static_smem + dynamic_smem > target.smem_per_block {
        return Err(CodegenError::Unsupported(format!(
            "{} bytes of shared memory ({dynamic_smem} for {} pipeline stages, {static_smem} for the epilogue); the target allows {}",
            static_smem + dynamic_smem,
            plan.stages,
            target.smem_per_block
        )));
    }
    let source = g.source(target, static_smem, &body)?;
    let threads = 128 * (plan.consumers + 1);
    Ok(Emitted { source, params, static_smem, dynamic_smem, block_threads: threads, persistent: Some(target.num_sms / g.cluster), dot_notes: Vec::new(), loop_notes: Vec::new(), min_blocks: None, late_dots: false, ahead_loads: false })
}

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
//! Shared memory of one operand in one stage, by majorness (swizzle 128 B): K-major —
//! `rows × 128` bytes (64 16-bit, 128 8-bit or 32 f32 elements), 8-row atoms 1024 bytes apart
//! (descriptor SBO 1024, each instruction's K step +32 bytes); MN-major (16-bit only) — boxes of
//! `BK × 64` elements (`BK` rows of 128 bytes), one per 64 rows/columns, 8-row atoms
//! 1024 bytes apart (SBO) and boxes `BK * 128` bytes apart (LBO), each `k16` step +2048
//! bytes. TMA writes exactly these boxes (box inner extent = 128 bytes).

use super::mma_common::{accumulator_map_of, accumulator_name, accumulator_val_named, dot_loop, scalar_slice, zeroed_accumulators};
use super::*;
use kfuse_ir::{Major, MmaDot, MmaOperand, MmaPlan, TileWalk};

use crate::target::GridAxisEval;

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

pub(super) fn emit_kernel(
    k: &Kernel,
    spec: &Spec,
    target: &Target,
    grid: &[GridAxisEval],
    plan: &MmaPlan,
    mut params: Vec<KernelParam>,
    mut decls: Vec<String>,
) -> Result<Emitted, CodegenError> {
    let [bm, bn, bk] = plan.tile;
    let stages = plan.stages;
    let consumers = plan.consumers;
    let dops = k.operands(plan.dot);
    let dtype = k.ty(dops[0]).dtype;
    let esz = dtype.size_bytes() as u32;
    if grid.is_empty() || grid.len() > 3 {
        return Err(CodegenError::Unsupported("a dot kernel must index its output by program ids (1 to 3 grid axes)".into()));
    }
    let info = dot_loop(k, plan)?;

    let split = plan.split_k.max(1);
    let mcast = plan.multicast.max(1);
    let cluster = split.max(mcast);
    // ping-pong consumers (`MmaPlan::pingpong`): each warpgroup a whole tile
    let pp = plan.pingpong;
    if pp && (cluster > 1 || k.schedule.grouped || !plan.more.is_empty() || consumers != 2 || bm != 128) {
        return Err(CodegenError::Unsupported("ping-pong consumers with a cluster, a grouped launch, several dots, or other than two warpgroups on 128-row tiles".into()));
    }
    if split > 1 && mcast > 1 {
        return Err(CodegenError::Unsupported("a dot loop split across a cluster and multicast at once".into()));
    }
    // tensor maps: one per distinct operand tile of a stage (A and B of a single dot)
    let dots = plan.all_dots();
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
    // multicast: each block of the cluster loads a slice of the shared operand's tile
    // (A, or B under `multicast_b`: operand 0 or 1 of the single dot) for all of them
    // (whole boxes when the tile comes in several, else a slice of its rows)
    let shared = usize::from(plan.multicast_b);
    // the grid axis along which a multicast cluster's blocks hold neighbouring tiles:
    // 1 (a tile row) when they share A, 0 (a tile column) when they share B
    let mcast_axis = usize::from(!plan.multicast_b);
    if mcast > 1 && (bn > 256 || operands.iter().any(|o| o.outer_slices)) {
        return Err(CodegenError::Unsupported(format!("multicast of a {bm}x{bn} tile (tiles wider than 256 columns take no cluster)")));
    }
    if split > 1 && bn > 256 {
        return Err(CodegenError::Unsupported(format!("a {bm}x{bn} tile split across a cluster (tiles wider than 256 columns take no cluster)")));
    }
    if mcast > 1 {
        let a = &mut operands[shared];
        let name = if a.is_a { "A" } else { "B" };
        if a.boxes.len() != 2 {
            return Err(CodegenError::Unsupported("multicast of a rank-3 operand".into()));
        }
        if a.nq % mcast != 0 {
            if a.nq != 1 {
                return Err(CodegenError::Unsupported(format!("multicast over {mcast} blocks of {} boxes of {name}", a.nq)));
            }
            let outer = a.order[1] as usize;
            if a.boxes[outer] % (8 * mcast) != 0 {
                return Err(CodegenError::Unsupported(format!("multicast of a {}-row {name} tile over {mcast} blocks", a.boxes[outer])));
            }
            a.boxes[outer] /= mcast;
            a.box_bytes /= mcast;
            a.nq = mcast;
            a.outer_slices = true;
        }
        let boxes = a.boxes.clone();
        // the operands' maps lead the signature's tensor maps, in stage order
        if let Some(KernelParam::TensorMap { box_dims, .. }) = params.iter_mut().filter(|p| matches!(p, KernelParam::TensorMap { .. })).nth(shared) {
            *box_dims = boxes;
        }
    }
    let a_bytes = bm * bk * esz;
    let b_bytes = bk * bn * esz;
    if operands.iter().any(|o| o.bytes != if o.is_a { a_bytes } else { b_bytes }) {
        return Err(CodegenError::Unsupported("TMA boxes that do not cover the dot's tiles".into()));
    }
    // each operand's offset in a stage, in stage order
    let mut at = Vec::new();
    let mut stage_bytes = 0;
    for o in &operands {
        at.push(stage_bytes);
        stage_bytes += o.bytes;
    }
    // the stage pointer of operand `i` (`kf_sa`, `kf_sb` for a single dot's A and B)
    let sname = |i: usize| match i {
        0 => "kf_sa".to_string(),
        1 => "kf_sb".to_string(),
        i => format!("kf_s{i}"),
    };
    let op_index = |load: OpId| plan.stage_operands().iter().position(|o| o.load == load).unwrap_or(0);
    // the epilogue's output tile (TMA store) and, under a cluster split, the partial
    // accumulator (the same bytes: only the first block stores): after the stages and
    // the barriers (full, empty per stage; two for the split's hand-off), 1024-aligned
    let ring_end = (stages * stage_bytes + 16 * stages + 16).div_ceil(1024) * 1024;
    // (a kernel of one tile a block puts them over the ring, free once the loop is done:
    // `pipeline_stages::epilogue_reuses_ring`)
    let aliased = crate::passes::pipeline_stages::epilogue_reuses_ring(k);
    let c_off = if aliased { 0 } else { ring_end };
    let part_bytes = crate::passes::pipeline_stages::partial_bytes(k);
    // the output tiles' shared memory as `pipeline_stages` sized it (the whole tile, one
    // per warpgroup under ping-pong, or `store_buffers` of its boxes)
    let store_bytes = crate::passes::pipeline_stages::store_bytes(k);
    let c_tiles = if pp { consumers } else { 1 };
    let c_bytes = store_bytes / c_tiles;
    let mut c_map = None;
    // the output's tensor map follows the operands' (`kf_tm2` for a single dot)
    let c_map_name = format!("kf_tm{}", operands.len());
    if let Some(st) = &plan.store {
        let Op::Store { tensor, .. } = k.op(st.load) else { unreachable!() };
        let esz = k.param(*tensor).dtype.size_bytes() as u32;
        let inner = st.swizzle / esz;
        decls.push(format!("const __grid_constant__ CUtensorMap {c_map_name}"));
        params.push(KernelParam::TensorMap { tensor: *tensor, box_dims: vec![bm, inner], swizzle: st.swizzle, order: vec![1, 0] });
        c_map = Some((st.load, inner, bm * inner * esz));
    }
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
    // the epilogue's barrier: the consumers of the tile — both warpgroups (named barrier
    // 1), or under ping-pong the tile's own warpgroup (1 + kf_wg: 1 or 2)
    let barrier = if pp {
        "asm volatile(\"bar.sync %0, 128;\" :: \"r\"(1 + kf_wg) : \"memory\");"
    } else {
        "asm volatile(\"bar.sync 1, %0;\" :: \"n\"(KF_CONSUMERS * 128) : \"memory\");"
    };
    let mut e = Emitter::new(k, spec, barrier, grid);
    e.w.indent();
    let pipe = |e: &mut Emitter| -> R {
        e.line("extern __shared__ __align__(1024) unsigned char kf_dsmem[];")?;
        e.line("unsigned char* kf_pipe = (unsigned char*)((((unsigned long long)kf_dsmem) + 1023ull) & ~1023ull);")?;
        e.line(format!("unsigned long long* kf_full = (unsigned long long*)(kf_pipe + {});", stages * stage_bytes))?;
        e.line(format!("unsigned long long* kf_empty = kf_full + {stages};"))?;
        e.line(format!("unsigned long long* kf_red = kf_full + {};", 2 * stages))?;
        e.line("(void)kf_red;")?;
        e.open("if (kf_tid == 0)")?;
        e.unroll("s", stages)?;
        e.line("kf_mbar_init(&kf_full[s], 1);")?;
        // a stage is released by every warp that read it: all consumers' (ping-pong: the
        // one warpgroup whose tile it holds), in every block that multicast into it
        let readers = if pp { 4 } else { consumers * 4 };
        e.line(format!("kf_mbar_init(&kf_empty[s], {});", readers * mcast))?;
        e.close()?;
        if split > 1 {
            // kf_red[0]: partials ready (the first block: every warp of the others);
            // kf_red[1]: partial read (the others: every warp of the first block)
            e.line(format!("kf_mbar_init(&kf_red[0], {});", (split - 1) * consumers * 4))?;
            e.line(format!("kf_mbar_init(&kf_red[1], {});", consumers * 4))?;
        }
        e.line("asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");")?;
        e.close()?;
        // the cluster's blocks reach each other's barriers: all initialized first
        e.line(if cluster > 1 { "kf_cluster_sync();" } else { "__syncthreads();" })?;
        if grouped {
            // a grouped launch: every problem's tiles, one walk (see `pids`)
            e.line(format!("const long long* kf_last = kf_grp + (kf_ngrp - 1) * {rec};"))?;
            e.line("const long long kf_tiles = kf_last[3] + kf_last[0] * kf_last[1] * kf_last[2];")?;
            return Ok(());
        }
        // program count per grid axis, and the walk over them
        let mut total = Vec::new();
        for (i, a) in grid.iter().enumerate() {
            let n = e.shape_var(a.dim);
            e.line(format!("const long long kf_g{i} = ({n} + {}LL) / {}LL;", a.step - 1, a.step))?;
            total.push(format!("kf_g{i}"));
        }
        if mcast > 1 {
            // a program walks groups of `mcast` neighbouring tiles along that axis
            let a = mcast_axis;
            e.line(format!("const long long kf_g{a}m = (kf_g{a} + {}LL) / {mcast}LL;", mcast - 1))?;
            total[a] = format!("kf_g{a}m");
        }
        e.line(format!("const long long kf_tiles = {};", total.join(" * ")))?;
        if cluster > 1 {
            e.line(format!("const unsigned kf_crank = blockIdx.x % {cluster};"))?;
        }
        Ok(())
    };
    pipe(&mut e)?;
    // program ids of tile `kf_t`: axes 0 and 1 grouped `group_m` along axis 0
    // (`maps`: the tensor maps the caller reads — a grouped launch binds only those)
    let pids = |e: &mut Emitter, maps: &dyn Fn(&str) -> bool| -> R {
        let r = grid.len();
        let t0 = if grouped {
            // the tile's problem: the last whose first tile is at or before it; its
            // record binds the parameters' names for this tile
            e.line("long long kf_gi = 0;")?;
            e.line(format!("while (kf_gi + 1 < kf_ngrp && kf_t >= kf_grp[(kf_gi + 1) * {rec} + 3]) ++kf_gi;"))?;
            e.line(format!("const long long* kf_rec = kf_grp + kf_gi * {rec};"))?;
            e.line("const long long kf_g0 = kf_rec[0], kf_g1 = kf_rec[1];")?;
            e.line("(void)kf_g0; (void)kf_g1;")?;
            super::bind_group_params(&mut e.w, &decls, maps).map_err(fmt_err)?;
            "(kf_t - kf_rec[3])"
        } else {
            "kf_t"
        };
        e.line("long long kf_pid0 = 0, kf_pid1 = 0, kf_pid2 = 0;")?;
        if r == 1 {
            e.line(format!("kf_pid0 = {t0};"))?;
        } else {
            e.open("")?;
            e.line(format!("long long t = {t0};"))?;
            // the program counts walked: a multicast cluster is one program of the
            // walk, which spans its axis's groups of `mcast` tiles
            let (g0, g1) = match (mcast > 1, mcast_axis) {
                (false, _) => ("kf_g0", "kf_g1"),
                (true, 1) => ("kf_g0", "kf_g1m"),
                (true, _) => ("kf_g0m", "kf_g1"),
            };
            if r == 3 {
                e.line(format!("kf_pid2 = t / ({g0} * {g1});"))?;
                e.line(format!("t -= kf_pid2 * {g0} * {g1};"))?;
            }
            e.line(format!("const long long per = {}LL * {g1};", plan.group_m))?;
            e.line(format!("const long long first = (t / per) * {}LL;", plan.group_m))?;
            e.line(format!("const long long gm = kf_mini({g0} - first, {}LL);", plan.group_m))?;
            e.line("kf_pid0 = first + (t % per) % gm;")?;
            e.line("kf_pid1 = (t % per) / gm;")?;
            if mcast > 1 {
                e.line(format!("kf_pid{mcast_axis} = kf_pid{mcast_axis} * {mcast} + kf_crank;"))?;
            }
            e.close()?;
        }
        e.pid = Some(vec!["kf_pid0".into(), "kf_pid1".into(), "kf_pid2".into()]);
        Ok(())
    };
    let for_ops = k.operands(plan.for_op);
    let (lo, hi, step) = (for_ops[0], for_ops[1], for_ops[2]);
    let index_name = info.index.map(|v| format!("v{}", v.index())).unwrap_or_else(|| "kf_kv".into());
    // the loop header: all iterations, or this block's contiguous share of them
    let loop_head = |e: &mut Emitter| -> Result<String, CodegenError> {
        let (l, h, s) = (e.val(lo).name.clone(), e.val(hi).name.clone(), e.val(step).name.clone());
        if split == 1 {
            return Ok(format!("for (long long {index_name} = {l}; {index_name} < {h}; {index_name} += {s})"));
        }
        e.line(format!("const long long kf_nit = {h} > {l} ? ({h} - {l} + {s} - 1) / {s} : 0LL;"))?;
        e.line(format!("const long long kf_it0 = kf_nit * kf_crank / {split}, kf_it1 = kf_nit * (kf_crank + 1) / {split};"))?;
        Ok(format!("for (long long {index_name} = {l} + kf_it0 * {s}; {index_name} < {l} + kf_it1 * {s}; {index_name} += {s})"))
    };
    // the persistent walk: every tile, or under a split last wave (`MmaPlan::walk`) the
    // whole waves' tiles (one block each) or the last tiles (one cluster each)
    let tile_walk = match (plan.walk, cluster) {
        (TileWalk::All, 1) => "for (long long kf_t = blockIdx.x; kf_t < kf_tiles; kf_t += gridDim.x)".to_string(),
        (TileWalk::All, c) => format!("for (long long kf_t = blockIdx.x / {c}; kf_t < kf_tiles; kf_t += gridDim.x / {c})"),
        (TileWalk::WholeWaves, 1) => {
            "for (long long kf_t = blockIdx.x; kf_t < kf_tiles / gridDim.x * gridDim.x; kf_t += gridDim.x)".to_string()
        }
        // (one tile a cluster: the epilogue's shared memory reuses the ring)
        (TileWalk::LastTiles, c) if c > 1 && split > 1 => format!(
            "for (long long kf_t = kf_maxi(0LL, kf_tiles - (long long)(gridDim.x / {c})) + blockIdx.x / {c}; kf_t < kf_tiles; kf_t = kf_tiles)"
        ),
        (w, c) => return Err(CodegenError::Unsupported(format!("the tile walk {w:?} in clusters of {c}"))),
    };

    // ---- producer
    e.open("if (kf_tid < 128)")?;
    // registers: the consumers of a 256-wide tile hold 128 accumulators each and take
    // 240 (232 spilled a bias epilogue), leaving the producer 24; narrower tiles leave
    // the producer 56 (its split-loop index arithmetic spilled at 24 and at 40). Several
    // dots count their accumulators together (two 128-wide ones as one 256-wide).
    let acc_cols = if pp { 2 * bn } else { bn } * dots.len() as u32;
    let (prod_regs, cons_regs) = match (consumers, acc_cols > 128) {
        (1, _) => (40, 256),
        // a multicasting producer needs a few more (it spilled at 24); a split kernel
        // spilled 16 bytes at 40 / 232 (SPLITK=4 at 128x256) and builds at 56 / 224
        (_, true) if split > 1 => (56, 224),
        (_, true) if cluster > 1 => (40, 232),
        (_, true) => (24, 240),
        (_, false) => (56, 216),
    };
    e.line(format!("asm volatile(\"setmaxnreg.dec.sync.aligned.u32 {prod_regs};\" ::: \"memory\");"))?;
    e.open("if (kf_tid == 0)")?;
    e.line("int kf_stage = 0;")?;
    e.line("unsigned kf_phase = 0;")?;
    e.open(tile_walk.clone())?;
    // the producer reads the operands' maps, the consumers only the output's
    pids(&mut e, &|m: &str| m != c_map_name)?;
    let mut roots = vec![lo, hi, step];
    for o in plan.stage_operands() {
        roots.extend(k.operands(o.load));
    }
    let slice = scalar_slice(k, &roots, 0)?;
    for &o in slice.iter().filter(|o| k.position(**o) < info.for_pos) {
        e.op(o)?;
    }
    e.line(format!("if (!({} > 0)) __trap();", e.val(step).name))?;
    let head = loop_head(&mut e)?;
    e.open(head)?;
    for &o in slice.iter().filter(|o| k.position(**o) > info.for_pos) {
        e.op(o)?;
    }
    e.line("kf_mbar_wait(&kf_empty[kf_stage], kf_phase ^ 1u);")?;
    e.line(format!("kf_mbar_expect_tx(&kf_full[kf_stage], {stage_bytes}u);"))?;
    e.line(format!("unsigned char* kf_sa = kf_pipe + kf_stage * {stage_bytes};"))?;
    for (i, &off) in at.iter().enumerate().skip(1) {
        e.line(format!("unsigned char* {} = kf_sa + {off};", sname(i)))?;
    }
    for (i, op) in operands.iter().enumerate() {
        let dst = sname(i);
        let dst = dst.as_str();
        let r = op.boxes.len();
        if !(2..=3).contains(&r) {
            return Err(CodegenError::Unsupported(format!("a rank-{r} dot operand tensor (TMA here takes rank 2 and 3)")));
        }
        let multicast = mcast > 1 && i == shared;
        for q in 0..op.nq {
            // coordinates innermost first
            let mut c: Vec<String> = op.order.iter().map(|&d| format!("(int){}", op.offs[d as usize])).collect();
            if q > 0 {
                let slot = if op.outer_slices { 1 } else { 0 };
                let d = op.order[slot] as usize;
                c[slot] = format!("(int)({} + {})", op.offs[d], q * op.boxes[d]);
            }
            if multicast {
                // box q is this block's when q % cluster == its rank; it lands in every block
                e.line(format!(
                    "if (kf_crank == {}) kf_tma_2d_mc({dst} + {}, &{}, {}, &kf_full[kf_stage], (unsigned short){});",
                    q % mcast,
                    q * op.box_bytes,
                    op.map,
                    c.join(", "),
                    (1u32 << mcast) - 1
                ))?;
            } else {
                e.line(format!("kf_tma_{r}d({dst} + {}, &{}, {}, &kf_full[kf_stage]);", q * op.box_bytes, op.map, c.join(", ")))?;
            }
        }
    }
    e.line(format!("if (++kf_stage == {stages}) {{ kf_stage = 0; kf_phase ^= 1u; }}"))?;
    e.close()?; // k loop
    e.close()?; // tiles
    e.close()?; // thread 0
    e.close()?; // producer
    // ---- consumers
    e.open("else")?;
    e.line(format!("asm volatile(\"setmaxnreg.inc.sync.aligned.u32 {cons_regs};\" ::: \"memory\");"))?;
    if pp {
        // each warpgroup holds its own tiles: warps 0..3 of the layout, in each
        e.line("const int kf_wg = ((kf_tid >> 5) - 4) >> 2;")?;
        e.line("const int kf_warp = ((kf_tid >> 5) - 4) & 3;")?;
    } else {
        e.line("const int kf_warp = (kf_tid >> 5) - 4;")?;
        e.line("const int kf_wg = kf_warp >> 2;")?;
    }
    e.line("(void)kf_warp; (void)kf_wg;")?;
    e.line("int kf_stage = 0;")?;
    e.line("unsigned kf_phase = 0;")?;
    e.line("unsigned kf_rphase = 0;")?;
    e.line("(void)kf_rphase;")?;
    // the operands' shared-memory descriptors at stage 0 and k-step 0, made once: a
    // k-step's descriptor adds its offset in 16-byte units to the start-address field,
    // in the low word (`kf_desc_at`; no carry leaves it, shared memory being under 2^18
    // bytes). Made in the loop from the stage's pointer, each cost ~10 instructions a
    // wgmma, a third of the consumers' instructions at M8192 N4096 K14336 (NOTES g27)
    let mut based: Vec<usize> = Vec::new();
    for i in dots.iter().flat_map(|d| [op_index(d.a.load), op_index(d.b.load)]) {
        if based.contains(&i) {
            continue;
        }
        based.push(i);
        let (half_step, _, lbo) = operands[i].desc_steps();
        let wg = if half_step > 0 && !pp { format!(" + kf_wg * {half_step}") } else { String::new() };
        e.line(format!("const unsigned long long {} = kf_desc128(kf_pipe + {}{wg}, {lbo}, 1024);", desc_base(i), at[i]))?;
    }
    // ping-pong: warpgroup w takes the block's tiles w, w + 2, …
    let consumer_walk = if pp { format!("for (long long kf_t = blockIdx.x + kf_wg * gridDim.x; kf_t < kf_tiles; kf_t += {consumers} * gridDim.x)") } else { tile_walk.clone() };
    e.open(consumer_walk)?;
    pids(&mut e, &|m: &str| m == c_map_name)?;
    // everything before the loop (but the zeros that only feed the inits), the zeroed
    // accumulators
    // accumulator registers a consumer thread: one m64 instruction's (BN / 2), or under
    // ping-pong two, rows 0..64 then 64..128 of the tile
    let half = bn / 2;
    let regs = if pp { 2 * half } else { half };
    let ranges = zeroed_accumulators(&mut e, plan, info.for_pos, regs)?;
    e.line("int kf_prev = -1;")?;
    // a stage is free once every block that multicasts into it may overwrite it: the
    // consumers release it in every block of the cluster (an arrive with the default
    // CTA-scope release: the stage's readers are this warpgroup's finished wgmmas; a
    // cluster-scope release on every stage halved the speed, 4096³ 334 vs 703 TFLOP/s)
    let release = if mcast > 1 {
        format!("if (kf_prev >= 0 && kf_lane == 0) {{ for (unsigned r = 0; r < {mcast}u; ++r) kf_mbar_arrive_remote(&kf_empty[kf_prev], r); }}")
    } else {
        "if (kf_prev >= 0 && kf_lane == 0) kf_mbar_arrive(&kf_empty[kf_prev]);".to_string()
    };
    let release = release.as_str();
    e.line(format!("if (!({} > 0)) __trap();", e.val(step).name))?;
    if pp {
        // the producer loads every tile of the block in walk order, so the other
        // warpgroup's tile (the one before this, when this is not the block's first)
        // takes the ring's next `iterations` stages: step over them. And wait for the
        // turn: a warpgroup starts a loop only once the other has waited on the last
        // stage of its tile (named barrier 3 + kf_wg, arrived at after the loop), so
        // that this loop's first full barrier is at most one phase from its parity
        let (l, h, s) = (e.val(lo).name.clone(), e.val(hi).name.clone(), e.val(step).name.clone());
        e.open("if (kf_t >= (long long)blockIdx.x + gridDim.x)")?;
        e.line("asm volatile(\"bar.sync %0, 256;\" :: \"r\"(3 + kf_wg) : \"memory\");")?;
        e.line(format!("const int kf_skip = kf_stage + (int)({h} > {l} ? ({h} - {l} + {s} - 1) / {s} : 0LL);"))?;
        e.line(format!("kf_phase ^= (unsigned)((kf_skip / {stages}) & 1);"))?;
        e.line(format!("kf_stage = kf_skip % {stages};"))?;
        e.close()?;
    }
    let head = loop_head(&mut e)?;
    e.open(head)?;
    e.line("kf_mbar_wait(&kf_full[kf_stage], kf_phase);")?;
    e.line(format!("const unsigned kf_so = (unsigned)kf_stage * {}u;", stage_bytes / 16))?;
    e.line("kf_wgmma_fence();")?;
    e.unroll("kk", bk / plan.instr[2])?;
    // per dot: A, this warpgroup's 64 rows (a descriptor per distinct A tile); B, all
    // columns; the instruction variant of its operands' majorness
    let mut described = Vec::new();
    for (j, d) in dots.iter().enumerate() {
        let (ia, ib) = (op_index(d.a.load), op_index(d.b.load));
        let ((a_off, a_k, _), (_, b_k, _)) = (operands[ia].desc_steps(), operands[ib].desc_steps());
        let suffix = |i: usize| if i <= 1 { String::new() } else { i.to_string() };
        let (da, db) = (format!("da{}", suffix(ia)), format!("db{}", suffix(ib)));
        let (base_a, base_b) = (desc_base(ia), desc_base(ib));
        let (a_k, b_k) = (a_k / 16, b_k / 16);
        if pp {
            // the whole tile: rows 0..64 into the first half of the accumulator, rows
            // 64..128 into the second
            e.line(format!("const unsigned long long {da} = kf_desc_at({base_a}, kf_so + kk * {a_k});"))?;
            e.line(format!("const unsigned long long {da}_hi = kf_desc_at({base_a}, kf_so + {} + kk * {a_k});", a_off / 16))?;
            e.line(format!("const unsigned long long {db} = kf_desc_at({base_b}, kf_so + kk * {b_k});"))?;
            let (f, acc) = (wgmma_name(&dots[0], d), accumulator_name(j));
            e.line(format!("{f}({acc}, {da}, {db});"))?;
            e.line(format!("{f}({acc} + {half}, {da}_hi, {db});"))?;
            continue;
        }
        if !described.contains(&ia) {
            e.line(format!("const unsigned long long {da} = kf_desc_at({base_a}, kf_so + kk * {a_k});"))?;
            described.push(ia);
        }
        e.line(format!("const unsigned long long {db} = kf_desc_at({base_b}, kf_so + kk * {b_k});"))?;
        e.line(format!("{}({}, {da}, {db});", wgmma_name(&dots[0], d), accumulator_name(j)))?;
    }
    e.close()?;
    e.line("kf_wgmma_commit();")?;
    e.line("kf_wgmma_wait<1>();")?;
    e.line(release)?;
    e.line("kf_prev = kf_stage;")?;
    e.line(format!("if (++kf_stage == {stages}) {{ kf_stage = 0; kf_phase ^= 1u; }}"))?;
    e.close()?; // k loop
    if pp {
        // the other warpgroup's turn (its next tile, if the block has one)
        e.line("if (kf_t + gridDim.x < kf_tiles) asm volatile(\"bar.arrive %0, 256;\" :: \"r\"(3 + (kf_wg ^ 1)) : \"memory\");")?;
    }
    e.line("kf_wgmma_wait<0>();")?;
    // the epilogue reads the accumulators through an add of +0 (which the compilers
    // cannot fold: it turns -0 into +0, a value the accumulators, zeroed to +0, never
    // hold): read directly by some instructions (f16 conversions at 64- and 128-wide
    // tiles), ptxas serializes every wgmma of the loop (C7514: f16 at M127 ran 1.2x
    // slower with 8 stages, 3.5x with 4); `tests/common::assemble` refuses that warning.
    // Only epilogues that make f16 values need it: bf16, fp8 and f32 ones did not draw
    // the warning, and the add costs 128 instructions a thread (~0.4% at 4096³)
    let makes_f16 = k.order[info.yield_pos + 1..].iter().any(|&o| k.op(o).has_result() && k.ty(o.value()).dtype == DType::F16);
    for j in (0..dots.len()).filter(|_| makes_f16) {
        let acc = accumulator_name(j);
        e.unroll("i", regs)?;
        e.line(format!("{acc}[i] = {acc}[i] + 0.0f;"))?;
        e.close()?;
    }
    e.line(release)?;
    if split > 1 {
        // the partial sums meet in the first block of the cluster, which alone goes on
        let threads = consumers * 128;
        e.line(format!("float* kf_part = reinterpret_cast<float*>(kf_pipe + {c_off});"))?;
        e.open("if (kf_crank != 0)")?;
        // (at cluster scope: the first block's reads of the previous partial, released
        // by its remote arrive, come before this block overwrites it)
        e.line("kf_mbar_wait_cluster(&kf_red[1], kf_rphase ^ 1u);")?;
        if aliased {
            // the partial goes over the ring: both warpgroups' last wgmmas read it first
            e.line("asm volatile(\"bar.sync 1, %0;\" :: \"n\"(KF_CONSUMERS * 128) : \"memory\");")?;
        }
        e.unroll("i", regs)?;
        e.line(format!("kf_part[i * {threads} + (kf_tid - 128)] = kf_acc[i];"))?;
        e.close()?;
        e.line("__syncwarp();")?;
        e.line("if (kf_lane == 0) kf_mbar_arrive_cluster(&kf_red[0], 0);")?;
        e.line("kf_rphase ^= 1u;")?;
        e.line("continue;")?;
        e.close()?;
        e.line("kf_mbar_wait_cluster(&kf_red[0], kf_rphase);")?;
        e.unroll("r", split - 1)?;
        e.unroll("i", regs)?;
        e.line(format!("kf_acc[i] += kf_ld_cluster_f32(kf_part + i * {threads} + (kf_tid - 128), r + 1);"))?;
        e.close()?;
        e.close()?;
        e.line("__syncwarp();")?;
        e.open("if (kf_lane == 0)")?;
        e.unroll("r", split - 1)?;
        e.line("kf_mbar_arrive_cluster(&kf_red[1], r + 1);")?;
        e.close()?;
        e.close()?;
        e.line("kf_rphase ^= 1u;")?;
    }
    // the output tile's shared memory and the thread that issues its bulk store: the
    // first consumer thread, or under ping-pong each warpgroup's first and its own tile
    let c_base = if pp { format!("{c_off} + kf_wg * {c_bytes}") } else { c_off.to_string() };
    let lead = if pp { "(kf_tid & 127) == 0" } else { "kf_tid == 128" };
    // the epilogue: everything after the loop, on the accumulator registers
    for ((j, d), r) in dots.iter().enumerate().zip(ranges) {
        let (res, map) = accumulator_map_of(k, &info, d.carried)?;
        if map.regs != regs {
            return Err(CodegenError::Unsupported(format!("accumulator layout of {} registers, instruction gives {regs}", map.regs)));
        }
        e.vals.insert(res, accumulator_val_named(plan, &accumulator_name(j), map, r));
    }
    for &o in &k.order[info.yield_pos + 1..] {
        if matches!(k.op(o), Op::LoopResult { .. }) {
            continue;
        }
        match c_map {
            Some((st, inner, box_bytes)) if st == o => e.tma_store(o, &c_base, inner, box_bytes, plan.store_buffers, &c_map_name, lead)?,
            _ => e.op(o)?,
        }
    }
    if pp && e.smem > 0 {
        // (static shared memory is one buffer for both warpgroups' epilogues)
        return Err(CodegenError::Unsupported(format!(
            "ping-pong consumers with an epilogue that needs {} bytes of static shared memory (leave PINGPONG out of the tile overrides)",
            e.smem
        )));
    }
    if e.smem > 0 {
        // the epilogue's shared memory is reused by the next tile
        let b = e.barrier;
        e.line(b)?;
    }
    e.close()?; // tiles
    if c_map.is_some() {
        // shared memory must outlive the last bulk store's reads
        e.line(format!("if ({lead}) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");"))?;
    }
    e.close()?; // consumers
    if cluster > 1 {
        // no block leaves while another may still read or write its shared memory
        e.line("kf_cluster_sync();")?;
    }
    let static_smem = e.smem;
    let body = e.w.finish();
    if static_smem + dynamic_smem > target.smem_per_block {
        return Err(CodegenError::Unsupported(format!(
            "{} bytes of shared memory ({dynamic_smem} for {stages} pipeline stages, {static_smem} for the epilogue); the target allows {}",
            static_smem + dynamic_smem,
            target.smem_per_block
        )));
    }
    let threads = 128 * (consumers + 1);
    // one helper per majorness of the dots' operands (the first dot's is `kf_wgmma`)
    let mut wgmma_text = String::new();
    let mut helpers: Vec<String> = Vec::new();
    for d in &dots {
        let name = wgmma_name(&dots[0], d);
        if !helpers.contains(&name) {
            // where each instruction's columns of B start in a stage
            let ob = &operands[op_index(d.b.load)];
            let widths = plan.wgmma_widths();
            let mut offsets = Vec::new();
            let mut col = 0;
            for w in &widths {
                offsets.push(match ob.major {
                    Major::MN => col / 64 * ob.box_bytes,
                    Major::K => col * 128,
                });
                col += w;
            }
            wgmma_text.push_str(&wgmma_fn(&name, dtype, &widths, &offsets, d.a.major == Major::MN, d.b.major == Major::MN)?);
            helpers.push(name);
        }
    }
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
        let sig = if grouped { "const long long* __restrict__ kf_grp, const long long kf_ngrp".to_string() } else { decls.join(", ") };
        w.open(format!("extern \"C\" __global__ void {cattr}__launch_bounds__({threads}, 1) {}({sig})", entry_name(k)))?;
        w.line("const int kf_tid = threadIdx.x;")?;
        w.line("const int kf_lane = kf_tid & 31;")?;
        w.line("(void)kf_lane;")?;
        if static_smem > 0 {
            w.line(format!("__shared__ __align__(16) unsigned char kf_smem[{}];", static_smem.div_ceil(16) * 16))?;
        }
        w.raw(&body)?;
        w.close()
    };
    head().map_err(fmt_err)?;
    Ok(Emitted { source: w.finish(), params, static_smem, dynamic_smem, block_threads: threads, persistent: Some(target.num_sms / cluster) })
}

impl Emitter<'_> {
    /// The epilogue store of a `[BM, BN]` tile through shared memory and a TMA bulk
    /// store, when the value's valid lanes are exactly the in-bounds part of the tile
    /// (what the copy engine writes), else the ordinary store. What the IR shows at
    /// compile time (a range from loads at the same block offsets, `Emitter::bounds`
    /// and `same_scalar`; offsets that cannot be negative) is not checked again; with
    /// nothing left to check, the ordinary store is not written.
    ///
    /// Shared memory holds the tile as `BN / inner` boxes of `[BM, inner]` elements,
    /// 128-byte rows swizzled like TMA's 128-byte mode (16-byte chunk `j` of row `r` at
    /// chunk `j ^ (r % 8)`), so that a warp's writes (8 rows x 4 lanes) hit 8 different
    /// chunks, at `kf_pipe + c_base`. One thread (`lead`: the first consumer, or each
    /// ping-pong warpgroup's first) waits until the previous tile's bulk store has read
    /// the buffer, the consumers write, fence the writes for the async proxy, meet at
    /// the barrier, and the same thread issues the store.
    ///
    /// With `buffers > 0` ([`MmaPlan::store_buffers`]) the tile leaves box by box
    /// through that many box-sized buffers: before writing box `q` into buffer
    /// `q % buffers`, the thread waits until at most `buffers - 1` bulk stores are still
    /// reading (all of them before the first box: the previous tile's), and each box's
    /// registers are those whose column falls in it (known per register at compile time:
    /// the column axis's thread part stays within one repetition, which a box holds
    /// whole).
    #[allow(clippy::too_many_arguments)]
    fn tma_store(&mut self, op: OpId, c_base: &str, inner: u32, box_bytes: u32, buffers: u32, map_name: &str, lead: &str) -> R {
        let k = self.k;
        let Op::Store { tensor, dims } = k.op(op) else { unreachable!() };
        let ops = k.operands(op);
        let r = dims.len();
        let v = ops[r];
        let val = self.val(v).clone();
        let d = k.param(*tensor).dtype;
        let map = val.map.clone().ok_or_else(|| CodegenError::Unsupported("a scalar epilogue store".into()))?;
        let plain = map.axes.len() == 2 && val.axis_map == [Some(0), Some(1)] && map.axes[1].elem_step == 1 && map.axes[1].spt % 2 == 0;
        if !plain {
            return self.op(op);
        }
        let tdims = k.tensor_dims(*tensor).to_vec();
        let offs: Vec<String> = ops[..r].iter().map(|o| self.val(*o).name.clone()).collect();
        // what is not known here is checked at run time; where everything is (the
        // accumulator's range is that of the loads along the same block offsets, the
        // usual case), the ordinary store is not written at all
        let mut conds = Vec::new();
        for t in 0..2 {
            let n = self.shape_var(tdims[t]);
            let ext = val.shape[t];
            if val.lo[t] != "0" {
                conds.push(format!("{} == 0", val.lo[t]));
            }
            let covers = self.bounds.get(&val.hi[t]).is_some_and(|&(sym, off, e)| sym == tdims[t] && e == ext && same_scalar(k, off, ops[t]));
            if !covers {
                conds.push(format!("{} == kf_maxi(0LL, kf_mini({n} - {}, {ext}LL))", val.hi[t], offs[t]));
            }
            if !non_negative(k, ops[t]) {
                conds.push(format!("{} >= 0", offs[t]));
            }
        }
        let fallback = !conds.is_empty();
        // `if (ok) {`, or a plain block where the store is known to fit
        let guard = if fallback {
            let ok = self.fresh("kf_tma_ok");
            self.line(format!("const bool {ok} = {};", conds.join(" && ")))?;
            format!("if ({ok})")
        } else {
            String::new()
        };
        let boxes = val.shape[1] / inner;
        if buffers > 0 && buffers < boxes {
            let c = &map.axes[1];
            if c.replicated() || c.ctas > 1 || !inner.is_multiple_of(c.chunk) {
                return Err(CodegenError::Unsupported(format!("an output tile in {inner}-column boxes from a register layout whose columns repeat every {}", c.chunk)));
            }
            self.open(&guard)?;
            self.line(format!("unsigned char* kf_cs = kf_dsmem + ((unsigned)(kf_pipe - kf_dsmem) + {c_base});"))?;
            let b = self.barrier;
            let e1 = map.axes[1].e_stride;
            for q in 0..boxes {
                let wait = if q == 0 { 0 } else { buffers - 1 };
                if q == 0 || q >= buffers {
                    self.line(format!("if ({lead}) asm volatile(\"cp.async.bulk.wait_group.read {wait};\" ::: \"memory\");"))?;
                }
                self.line(b)?;
                self.unroll("p", map.regs / 2)?;
                self.line(format!("const int k0 = (p / {e1}) * {} + (p % {e1});", 2 * e1))?;
                // the box of register k0's column: its repetition's
                let rep = if c.reps > 1 { format!("((k0 / {}) % {}) * {}", c.rep_stride, c.reps, c.chunk) } else { "0".to_string() };
                self.open(format!("if (({rep}) / {inner} == {q})"))?;
                self.pair_to_box(&map, &val.name, d, inner, box_bytes, Some((q % buffers) * box_bytes))?;
                self.close()?;
                self.close()?;
                self.line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");")?;
                self.line(b)?;
                self.open(format!("if ({lead})"))?;
                self.bulk_store_box(map_name, &offs, q * inner, (q % buffers) * box_bytes)?;
                self.line("asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");")?;
                self.close()?;
            }
            self.close()?;
            if fallback {
                self.open("else")?;
                self.op(op)?;
                self.close()?;
            }
            return Ok(());
        }
        self.open(&guard)?;
        self.line(format!("if ({lead}) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");"))?;
        let b = self.barrier;
        self.line(b)?;
        // addressed from the shared array itself (`kf_pipe` went through an integer to
        // be aligned): a pointer the compiler traces to `kf_dsmem` stays in the shared
        // address space, so these writes are 32-bit-addressed `STS`, not generic 64-bit
        // `ST` with an extra add each (~1% of a 4096³ bf16 product)
        self.line(format!("unsigned char* kf_cs = kf_dsmem + ((unsigned)(kf_pipe - kf_dsmem) + {c_base});"))?;
        let pairs = map.regs / 2;
        let e1 = map.axes[1].e_stride;
        self.unroll("p", pairs)?;
        // register k0 and the next along the columns (element digit 0 and 1)
        self.line(format!("const int k0 = (p / {e1}) * {} + (p % {e1});", 2 * e1))?;
        self.pair_to_box(&map, &val.name, d, inner, box_bytes, None)?;
        self.close()?;
        self.line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");")?;
        self.line(b)?;
        self.open(format!("if ({lead})"))?;
        for q in 0..val.shape[1] / inner {
            self.bulk_store_box(map_name, &offs, q * inner, q * box_bytes)?;
        }
        self.line("asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");")?;
        self.close()?;
        self.close()?;
        if fallback {
            self.open("else")?;
            self.op(op)?;
            self.close()?;
        }
        Ok(())
    }

    /// Writes register `k0` of `name` and the next along the columns (a 16-bit pair)
    /// into the output tile's swizzled shared memory at `kf_cs`: in the box its column
    /// falls in (`box_at`: none — the box `col / inner`, boxes `box_bytes` apart — or
    /// this byte offset, for a tile stored box by box).
    fn pair_to_box(&mut self, map: &RegMap, name: &str, d: DType, inner: u32, box_bytes: u32, box_at: Option<u32>) -> R {
        let esz = d.size_bytes() as u32;
        let e1 = map.axes[1].e_stride;
        self.line(format!("const int row = {};", coord(map, 0, "k0")))?;
        self.line(format!("const int col = {};", coord(map, 1, "k0")))?;
        let base = match box_at {
            Some(at) => at.to_string(),
            None => {
                self.line(format!("const int q = col / {inner};"))?;
                format!("q * {box_bytes}")
            }
        };
        self.line(format!("const int cb = (col % {inner}) * {esz};"))?;
        self.line(format!("const unsigned off = {base} + row * 128 + ((((cb >> 4) ^ (row & 7)) << 4) | (cb & 15));"))?;
        let lo = from_reg(d, &format!("{name}[k0]"));
        let hi = from_reg(d, &format!("{name}[k0 + {e1}]"));
        self.line(format!("*reinterpret_cast<unsigned*>(kf_cs + off) = kf_pack16({lo}, {hi});"))
    }

    /// The bulk store of one `[BM, inner]` box of the output tile, `col` columns into it,
    /// from `kf_cs + at`.
    fn bulk_store_box(&mut self, map_name: &str, offs: &[String], col: u32, at: u32) -> R {
        self.line(format!(
            "asm volatile(\"cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {{%1, %2}}], [%3];\" :: \"l\"(&{map_name}), \"r\"((int)({} + {col})), \"r\"((int){}), \"r\"(kf_smem_addr(kf_cs + {at})) : \"memory\");",
            offs[1], offs[0]
        ))
    }
}

//! `assign_layouts`: decides how every tile value is spread over the block's threads,
//! and inserts `Convert` ops where a value must change its distribution.
//!
//! Every blocked layout built here puts its warps first on axes that no reduction
//! reduces (so that row reductions stay inside a warp where the tile allows), and cuts
//! the axes over the schedule's `split` extent across the cluster's blocks.
//!
//! A carried tile of a general loop that starts as a broadcast scalar (`zeros`) takes
//! the layout its next values are computed in: a dry run on a copy of the kernel finds
//! it (elementwise ops there prefer a partner that is not such a carried value), and the
//! real run gives the init that layout, so the loop converts nothing per iteration.
//!
//! Rules, in program order:
//! - a `Dot` (each is lowered where it stands): the accumulator layout of `m16n8k16`
//!   tiles over the block's warps where a matrix instruction takes it
//!   ([`one_dot_mma_layout`]; WGMMA's accumulator is the same), runs of 4 rows and 4
//!   columns a thread for exact f32 products ([`fma_runs_layout`]), else a blocked
//!   default; carried values keep their init's layout;
//! - the next value of a carried value, at its loop's `Yield`, takes the
//!   carried value's layout (a `Convert` where they differ);
//! - a `Load` is an anchor: a blocked layout whose fastest axis is the tile axis over
//!   the tensor's unit-stride dimension, with 16 bytes per thread along it (one
//!   element when the pointer or a row stride rules out any vector access, so that
//!   the warp's scalar accesses are consecutive);
//! - elementwise ops (`Unary`, `Binary`, `Select`, `Cast`) take the layout of their
//!   first operand that is not a broadcast of a scalar — a full tile before a row or
//!   column broadcast to its shape (a bias row), a fixed layout before a flexible
//!   carried value, a matrix accumulator before any other; other operands in another
//!   layout get a `Convert`;
//! - `Reduce` along axis a of a blocked layout P gives `Slice(P, a)` (a scalar when
//!   nothing is left); a rank-1 slice reduces to a scalar;
//! - `Broadcast` of a scalar takes the layout of the operand it meets in its first
//!   elementwise user (or a default); of `Slice(P, a)` back to P's shape, P; of any other
//!   layout, the source is converted to the slice of the target first;
//! - `Permute` permutes the layout (no data moves);
//! - a `Store` whose value's fastest axis is not the tile axis over the output's
//!   unit-stride dimension gets a `Convert` to the store's anchor layout, so that
//!   writes are coalesced (this is where a transpose goes through shared memory); so
//!   does a value held in vectors bound for an output that takes only scalar stores; a
//!   reduction result of at most 128 elements, or one split across a cluster, is
//!   written from where it is (its owners write it).
//!
//! Then converts fed by a load through single-use elementwise ops are folded into the
//! load (it takes the converted layout), and every remaining rank-2 `Convert` gets its
//! shared-memory layout ([`SmemLayout`]): when one
//! side holds vectors along the row (the last axis) and the other walks down columns,
//! the chunks are XOR-swizzled by row so that both sides are free of bank conflicts and
//! the row side moves whole vectors; otherwise rows are padded by one 32-bit word.

use std::collections::HashMap;

use kfuse_ir::{AccessDim, Blocked, DType, Extent, Kernel, Layout, Op, OpId, SmemLayout, Type, ValueId};

use crate::analysis::concrete_shape;
use crate::layout::{blocked, permute};


use crate::target::Spec;
use crate::CodegenError;

/// Extents that some reduction reduces.
fn reduced_extents(k: &Kernel) -> Vec<Extent> {
    k.order
        .iter()
        .filter_map(|&op| match k.op(op) {
            Op::Reduce { axis, .. } => Some(k.ty(k.operands(op)[0]).shape[*axis as usize]),
            _ => None,
        })
        .collect()
}

/// A blocked layout for a tile with these extents (see the module docs).
fn make_blocked(k: &Kernel, extents: &[Extent], order: Vec<u32>, vec: u32) -> Blocked {
    let shape: Vec<u32> = extents.iter().map(|e| crate::analysis::extent_value(k, *e)).collect();
    let reduced = reduced_extents(k);
    let mut warp_order: Vec<u32> = order.iter().copied().filter(|&a| !reduced.contains(&extents[a as usize])).collect();
    warp_order.extend(order.iter().copied().filter(|&a| reduced.contains(&extents[a as usize])));
    let ctas: Vec<u32> = extents
        .iter()
        .map(|e| if k.schedule.split_blocks > 1 && k.schedule.split == Some(*e) { k.schedule.split_blocks } else { 1 })
        .collect();
    blocked(&shape, &order, vec, k.schedule.num_threads, &warp_order, &ctas)
}

/// The anchor layout of a block access: fastest axis over the unit-stride dimension.
pub fn access_layout(k: &Kernel, spec: &Spec, op: OpId) -> Option<Blocked> {
    let (tensor, dims) = match k.op(op) {
        Op::Load { tensor, dims } | Op::Store { tensor, dims } => (*tensor, dims),
        _ => return None,
    };
    let extents = AccessDim::tile_shape(dims);
    if extents.is_empty() {
        return None;
    }
    let r = extents.len() as u32;
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten();
    // tile axis of each tensor dim (a gathered axis is never the contiguous one)
    let axis_of: Vec<Option<u32>> = AccessDim::tile_axes(dims).into_iter().map(|a| a.map(|a| a as u32)).collect();
    let unit = ts
        .as_ref()
        .and_then(|ts| ts.stride_div.iter().position(|&s| s == 0))
        .filter(|&d| matches!(dims[d], AccessDim::Tile(_)))
        .and_then(|d| axis_of[d]);
    let fast = unit.unwrap_or(r - 1);
    let mut order = vec![fast];
    order.extend((0..r).rev().filter(|&a| a != fast));
    let dt = k.param(tensor).dtype;
    let esz = dt.size_bytes() as u32;
    // 16 bytes a thread along the fastest axis, unless the data cannot be read in
    // vectors at all (pointer or a row stride not aligned): then one element a thread,
    // so that a warp's scalar accesses are consecutive (coalesced)
    let mut vec = (16 / esz).max(1);
    if let Some(ts) = &ts {
        let mut align = ts.ptr_align / esz.max(1);
        for (d, &sd) in ts.stride_div.iter().enumerate() {
            if sd != 0 && axis_of.get(d).is_some_and(|a| a.is_some()) {
                align = align.min(sd);
            }
        }
        if align <= 1 {
            vec = 1;
        }
    }
    Some(make_blocked(k, &extents, order, vec))
}

/// A gathered rank-2 load along its contiguous columns: one row a thread (or a few),
/// each thread holding whole vectors of its row, instead of the access anchor's rows of
/// 16 bytes a thread. Its index tiles meet it (`gather_rule`) and so hold one register a
/// thread (a row's coordinate), where the anchor's layout gave each thread several rows:
/// the gathered addresses, bounds and row tables are computed once a row a thread, and
/// fewer registers live across loops (three `i64` tiles of a convolution's gathered
/// pixels: 24 registers a thread under the anchor's layout, 6 under this one; a WGMMA
/// ring, `operand_ring`, never holds the tile itself in registers). H100: the implicit
/// GEMM from 134–166 registers to 102–124, two blocks a multiprocessor, C256 3x3 145.6
/// → 207.5 TFLOP/s; depthwise 3x3 C256 738 → 950 GB/s (NOTES.md c13, c14). A tile no
/// dot reads takes [`line_rows`] first where it applies.
fn gather_rows(k: &Kernel, op: OpId, anchor: &Blocked) -> Option<Blocked> {
    let Op::Load { dims, .. } = k.op(op) else { return None };
    if gather_indices(k, op).is_empty() || k.ty(op.value()).rank() != 2 || anchor.order[0] != 1 {
        return None;
    }
    let extents = AccessDim::tile_shape(dims);
    let shape: Vec<u32> = extents.iter().map(|e| crate::analysis::extent_value(k, *e)).collect();
    let (rows, cols, threads) = (shape[0], shape[1], k.schedule.num_threads.max(1));
    let per_thread = (rows * cols) / threads;
    if crate::analysis::gathered_in_registers(k, op) {
        if let Some(b) = line_rows(&shape, anchor, threads) {
            return Some(b);
        }
    }
    (per_thread >= 8 && per_thread.is_power_of_two() && cols % per_thread == 0 && (rows * cols) % threads == 0).then(|| make_blocked(k, &extents, vec![1, 0], per_thread))
}

/// A gathered tile computed on in registers (no dot reads it) with one row a thread,
/// eight lanes along each 128-byte line of the row and the rest of the row's vectors in
/// the thread's registers, where the tile's rows number exactly four a warp (so that no
/// thread holds two rows: each row costs its own address arithmetic and bounds): a warp's
/// vector load then reads four whole lines, where the layout of `gather_rows`'s other
/// rule (a row's elements consecutive in one thread) reads half of eight lines an
/// instruction. H200, depthwise 3 × 3 bf16 C256 56 at 32 × 128: the kernel's L1 sectors
/// 64.5 M → 36.2 M, the same instructions (NOTES.md c27; `choose_tiles`'s
/// `gathered_register_tiles` gives such loads their tiles).
fn line_rows(shape: &[u32], anchor: &Blocked, threads: u32) -> Option<Blocked> {
    let (rows, cols, vec) = (shape[0], shape[1], anchor.size_per_thread[1]);
    let lanes_c = (cols / vec.max(1)).min(8);
    let warps = threads / 32;
    (vec > 1 && lanes_c > 1 && cols % (vec * lanes_c) == 0 && cols / (vec * lanes_c) > 1 && rows == (32 / lanes_c) * warps).then(|| Blocked {
        shape: shape.to_vec(),
        size_per_thread: vec![1, vec],
        threads_per_warp: vec![32 / lanes_c, lanes_c],
        warps_per_block: vec![warps, 1],
        order: vec![1, 0],
        block_split: vec![1, 1],
        steps: vec![],
    })
}

fn default_layout(k: &Kernel, ty: &Type) -> Blocked {
    let r = ty.rank() as u32;
    let order: Vec<u32> = (0..r).rev().collect();
    let vec = (16 / ty.dtype.size_bytes().max(1) as u32).clamp(1, 4);
    make_blocked(k, &ty.shape, order, vec)
}

fn layout_of(k: &Kernel, v: ValueId) -> Layout {
    if k.ty(v).is_scalar() {
        Layout::Uniform
    } else {
        k.schedule.layouts.get(&v).cloned().unwrap_or(Layout::Uniform)
    }
}

fn is_scalar_broadcast(k: &Kernel, v: ValueId) -> bool {
    matches!(k.op(v.op()), Op::Broadcast) && k.ty(k.operands(v.op())[0]).is_scalar()
}

/// A tile broadcast along an axis it has extent 1 on (a bias row `[1, BN]` added to a
/// `[BM, BN]` tile): it follows the full tile it meets, as that tile's slice.
fn is_tile_broadcast(k: &Kernel, v: ValueId) -> bool {
    matches!(k.op(v.op()), Op::Broadcast) && !k.ty(k.operands(v.op())[0]).is_scalar()
}

/// A flexible carried value (or loop result) in a matrix instruction's accumulator
/// layout, of a loop around the dot loop (an implicit GEMM's taps), where such a nest's
/// epilogue stores leave from registers (`from_registers`: before sm_90; on sm_90a the
/// nest is warp-specialized and its stores leave by TMA): a row broadcast it meets keeps
/// its own layout and the sum takes it, so that the stores leave in that layout's wider
/// vectors rather than the accumulator's pairs (NOTES c18: 4–8% on the 3 × 3 layers). A
/// dot loop's own accumulator keeps its layout, and so does a nest's where its stores
/// may leave by TMA: the conversion's scratch would take the shared memory of two of a
/// warp-specialized ring's stages.
fn is_flexible_accumulator(k: &Kernel, v: ValueId, from_registers: bool) -> bool {
    let (Op::LoopCarried { id, .. } | Op::LoopResult { id, .. }) = *k.op(v.op()) else { return false };
    let nest = k.loop_info(id).is_some_and(|i| k.order[i.for_pos + 1..i.yield_pos].iter().any(|&o| matches!(k.op(o), Op::For { .. })));
    from_registers && nest && is_flexible(k, v) && strength(&layout_of(k, v)) == 2
}

/// Inserts `Convert(v)` before `user` with layout `to`, and makes `user` use it.
fn convert(k: &mut Kernel, user: OpId, v: ValueId, to: Layout) -> ValueId {
    let ty = k.ty(v).clone();
    let c = k.insert_before(user, Op::Convert, Some(ty), &[v]).value();
    k.replace_operand(user, v, c);
    k.schedule.layouts.insert(c, to);
    c
}

/// Runs the pass on a kernel whose tiles are chosen: a layout for every value of rank ≥
/// 1, `Convert`s where they must change (module docs).
pub fn run(k: &mut Kernel, spec: &Spec, target: &crate::target::Target) -> Result<(), CodegenError> {
    // (a nest's stores leave from registers before sm_90: `is_flexible_accumulator`)
    let regs = target.sm < 90;
    // a carried tile that starts as a broadcast scalar (`zeros`) is free to live where
    // its next values are computed: a dry run on a copy finds that layout, so that the
    // loop does not convert its carried value at every iteration
    let mut hints = HashMap::new();
    if k.order.iter().any(|&op| is_flexible(k, op.value()) || matches!(k.op(op), Op::Iota { .. })) {
        // (twice: in the first run a loop's result and a mask or an index tile computed
        // from `iota`s alone meet later values in the layouts that run left them, which
        // may be default ones — a bias row unsqueezed against a loop's result, a store's
        // mask against the tile it masks; the second run sees their own)
        for _ in 0..2 {
            let mut dry = k.clone();
            let mut at = None;
            hints = assign(&mut dry, spec, &hints, &mut at, regs).map_err(|e| e.at(&dry, at))?;
        }
    }
    let mut at = None;
    assign(k, spec, &hints, &mut at, regs).map_err(|e| e.at(k, at))?;
    fold_converts_into_loads(k);
    for op in k.order.clone() {
        if let Op::Convert = k.op(op) {
            let src = k.operands(op)[0];
            let m = smem_layout(k.ty(src).rank(), &layout_of(k, src), &layout_of(k, op.value()), k.ty(src).dtype);
            k.schedule.smem.insert(op.value(), m);
        }
    }
    Ok(())
}

/// The scalar broadcast a carried tile of a general loop starts from, through the inits
/// of enclosing loops (`None`: not such a value). The matrix loop's accumulators are not:
/// they live where the matrix instruction leaves them.
fn flexible_root(k: &Kernel, v: ValueId) -> Option<ValueId> {
    match k.op(v.op()) {
        Op::Broadcast if k.ty(k.operands(v.op())[0]).is_scalar() && !k.ty(v).is_scalar() => Some(v),
        // elementwise over broadcast scalars only (`zeros([BM]) + f32::NEG_INFINITY`)
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. }
            if !k.ty(v).is_scalar() && k.operands(v.op()).iter().all(|&o| k.ty(o).is_scalar() || is_scalar_broadcast(k, o)) =>
        {
            Some(v)
        }
        Op::LoopCarried { id, index } | Op::LoopResult { id, index } => {
            let info = k.loop_info(*id)?;
            flexible_root(k, k.operands(info.for_op)[3 + *index as usize])
        }
        _ => None,
    }
}

/// The layout of a `dot` lowered where it stands on the matrix instruction (`m16n8k16`,
/// which every target from sm_80 has): f16 or bf16 operands of one dtype, `M`, `N`, `K`
/// multiples of 16, 8 and 16, and at least one instruction tile per warp. The block's
/// warps split the rows first (`warps = [wm, wn]`, `wm ≤ M / 16`). `None`: the FMA rule.
/// Where the general lowering takes the kernel's matrix loop on sm_90
/// (`Schedule::general_matrix_loop`), also fp8 operands and the f32 ones of a
/// `dot_tf32`: the same accumulator layout is WGMMA's (`m16n8k16` itself takes neither).
pub fn one_dot_mma_layout(k: &Kernel, dot: OpId) -> Option<Blocked> {
    let ops = k.operands(dot);
    let (a, b) = (k.ty(ops[0]), k.ty(ops[1]));
    let sixteen = matches!(a.dtype, DType::F16 | DType::BF16) && matches!(k.op(dot), Op::Dot { precision: kfuse_ir::DotPrecision::Exact });
    // (8-bit and TF32 operands only where the general lowering takes the matrix loop
    // onto WGMMA, whose operands its rings copy)
    let wide = k.schedule.general_matrix_loop && crate::passes::select_mma_path::wgmma_operands(k, dot);
    if a.dtype != b.dtype || !(sixteen || wide) {
        return None;
    }
    let (sa, sb) = (concrete_shape(k, a), concrete_shape(k, b));
    let (m, kk, n) = (sa[0], sa[1], sb[1]);
    let warps = k.schedule.num_threads / 32;
    if m % 16 != 0 || n % 8 != 0 || kk % 16 != 0 || warps == 0 || (m / 16) * (n / 8) < warps {
        return None;
    }
    let wm = (m / 16).min(warps);
    let wn = warps / wm;
    if wm * wn != warps || (m / 16) % wm != 0 || (n / 8) % wn != 0 {
        return None;
    }
    Some(crate::layout::mma_tiles_accumulator(m, n, [wm, wn]))
}

/// The layout of an exact f32 `dot` lowered where it stands on the FMA rule, where its
/// result takes runs of 4 rows and 4 columns a thread (`layout::fma_accumulator` over
/// `fma_warps`, every thread its own registers): per `k` the writer reads each run as a
/// 16-byte vector (`cuda/emit/dot.rs`). `None` for smaller results (replicas) and other
/// dtypes: a blocked result like any tile's.
pub fn fma_runs_layout(k: &Kernel, dot: OpId) -> Option<Blocked> {
    let ops = k.operands(dot);
    let (a, b) = (k.ty(ops[0]), k.ty(ops[1]));
    if a.dtype != DType::F32 || b.dtype != DType::F32 || !matches!(k.op(dot), Op::Dot { precision: kfuse_ir::DotPrecision::Exact }) {
        return None;
    }
    let (sa, sb) = (concrete_shape(k, a), concrete_shape(k, b));
    let (m, n) = (sa[0], sb[1]);
    let threads = k.schedule.num_threads;
    if m % 4 != 0 || n % 4 != 0 || threads < 32 {
        return None;
    }
    let l = crate::layout::fma_accumulator(m, n, crate::passes::select_mma_path::fma::fma_warps(m, n, threads));
    let map = crate::layout::RegMap::of(&Layout::Blocked(l.clone()))?;
    map.axes.iter().all(|x| x.spt == 4 && !x.replicated()).then_some(l)
}

/// The values an unsqueezed tile `v` meets: through the broadcasts and elementwise ops it
/// feeds (a few levels), their other operands of the broadcast shape.
fn met_values(k: &Kernel, v: ValueId) -> Vec<ValueId> {
    let mut frontier = vec![v];
    let mut met = Vec::new();
    for _ in 0..MET_DEPTH {
        let mut next = Vec::new();
        for x in frontier {
            for u in k.users(x) {
                // a `store_where` mask meets the value it masks, a gathered access's
                // index tile the tile it addresses
                if k.store_mask(u) == Some(x) || gather_indices(k, u).contains(&x) {
                    let t = if matches!(k.op(u), Op::Load { .. }) { u.value() } else { k.stored_value(u) };
                    if k.ty(t).rank() == 2 {
                        met.push(t);
                    }
                    continue;
                }
                if !matches!(k.op(u), Op::Broadcast | Op::Convert | Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. }) {
                    continue;
                }
                for o in k.operands(u) {
                    if o != x && k.ty(o).rank() == 2 {
                        met.push(o);
                    }
                }
                next.push(u.value());
            }
        }
        frontier = next;
    }
    met
}

/// The index tiles of a gathered load or store ([`Kernel::gathered_offsets`]).
fn gather_indices(k: &Kernel, op: OpId) -> Vec<ValueId> {
    k.gathered_offsets(op).into_iter().map(|(_, x)| x).collect()
}

/// Gives a gathered access's index tiles the layout `want` (the loaded or stored tile's):
/// each register of the tile reads its coordinates from the same register of them.
fn gather_rule(k: &mut Kernel, op: OpId, want: &Layout) {
    for x in gather_indices(k, op) {
        if layout_of(k, x) != *want {
            convert(k, op, x, want.clone());
        }
    }
}

/// The first blocked layout of a rank-2 value that unsqueezed `v` meets, if one has its
/// layout already.
fn met_layout(k: &Kernel, v: ValueId, regs: bool) -> Option<Blocked> {
    // the shape `v` is broadcast to
    let mut shape = concrete_shape(k, k.ty(v));
    if let (Op::ExpandDims { axis }, Some(e)) = (k.op(v.op()), met_extent(k, v)) {
        shape[*axis as usize] = crate::analysis::extent_value(k, e);
    }
    let met = met_values(k, v).into_iter().filter_map(|o| match k.schedule.layouts.get(&o) {
        Some(Layout::Blocked(b)) if b.shape == shape && !is_flexible_accumulator(k, o, regs) => Some(b.clone()),
        _ => None,
    });
    // the strongest, the first of equals
    met.fold(None, |best: Option<Blocked>, b| match best {
        Some(x) if strength(&Layout::Blocked(x.clone())) >= strength(&Layout::Blocked(b.clone())) => Some(x),
        _ => Some(b),
    })
}

/// How strongly a layout holds its place when operands disagree: a matrix
/// instruction's accumulator (a blocked layout with steps) above any other.
fn strength(l: &Layout) -> u32 {
    match l {
        Layout::Blocked(b) if !b.steps.is_empty() => 2,
        Layout::Blocked(_) | Layout::Slice { .. } => 1,
        Layout::Uniform => 0,
    }
}

/// The extent unsqueezed `v`'s new axis is broadcast to: that of the first broadcast
/// that widens it, through the elementwise ops `v` feeds first (`iota(BM).unsqueeze(1)
/// + i * BM`).
fn met_extent(k: &Kernel, v: ValueId) -> Option<Extent> {
    let axis = match k.op(v.op()) {
        Op::ExpandDims { axis } => *axis as usize,
        _ => return None,
    };
    let mut frontier = vec![v];
    for _ in 0..MET_DEPTH {
        let mut next = Vec::new();
        for x in frontier {
            for u in k.users(x) {
                match k.op(u) {
                    Op::Broadcast if k.ty(u.value()).rank() == 2 && k.ty(x).shape[axis] != k.ty(u.value()).shape[axis] => {
                        return Some(k.ty(u.value()).shape[axis]);
                    }
                    Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Convert if k.ty(u.value()).rank() == 2 => next.push(u.value()),
                    _ => {}
                }
            }
        }
        frontier = next;
    }
    None
}

/// How many ops down an unsqueezed tile is followed to find what it meets.
const MET_DEPTH: usize = 8;

/// The `iota` a rank-1 tile is computed from through elementwise ops whose other operands
/// are broadcast scalars (`(iota(BM) + i * BM).to_f32()`): it may take any layout.
fn iota_root(k: &Kernel, v: ValueId) -> Option<ValueId> {
    match k.op(v.op()) {
        Op::Iota { .. } => Some(v),
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } => {
            let mut tiles = k.operands(v.op()).into_iter().filter(|&o| !is_scalar_broadcast(k, o) && !k.ty(o).is_scalar());
            match (tiles.next(), tiles.next()) {
                (Some(t), None) => iota_root(k, t),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A carried tile (or loop result) whose layout follows from a scalar broadcast.
fn is_flexible(k: &Kernel, v: ValueId) -> bool {
    matches!(k.op(v.op()), Op::LoopCarried { .. } | Op::LoopResult { .. }) && flexible_root(k, v).is_some()
}

/// Assigns every layout; a scalar broadcast in `hints` takes the layout given there.
/// Returns the layouts the next values of flexible carried tiles had before their
/// conversion at the `Yield`, by their root broadcast (the hints of a second run).
/// `at` is the op being assigned when an error returns (`None` outside the per-op walk).
fn assign(k: &mut Kernel, spec: &Spec, hints: &HashMap<ValueId, Layout>, at: &mut Option<OpId>, regs: bool) -> Result<HashMap<ValueId, Layout>, CodegenError> {
    let mut wanted: HashMap<ValueId, Layout> = HashMap::new();
    let order = k.order.clone();
    for op in order {
        *at = Some(op);
        let node = k.node(op).clone();
        let ops = k.operands(op);
        let result: Option<Layout> = match &node.op {
            Op::Load { .. } => access_layout(k, spec, op).map(|a| Layout::Blocked(gather_rows(k, op, &a).unwrap_or(a))),
            Op::Store { .. } => {
                store_rule(k, spec, op);
                None
            }
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Convert => Some(elementwise_rule(k, op, hints, regs)),
            Op::Reduce { axis, .. } => {
                let src = layout_of(k, ops[0]);
                let rank = k.ty(op.value()).rank();
                match src {
                    Layout::Blocked(p) if rank > 0 => Some(Layout::Slice { parent: p, axis: *axis }),
                    Layout::Blocked(p) if p.shape.len() == 1 => Some(Layout::Uniform),
                    Layout::Slice { parent, .. } if parent.shape.len() == 2 => Some(Layout::Uniform),
                    Layout::Blocked(p) if k.ty(ops[0]).rank() == 2 && rank == 0 => {
                        let _ = p;
                        return Err(CodegenError::Unsupported("reduce to a scalar from rank 2 in one step".into()));
                    }
                    other => return Err(CodegenError::Unsupported(format!("reduce of a value in layout {}", kfuse_ir::print::layout_str(&other)))),
                }
            }
            // the same registers with an extent-1 axis added (see the writer)
            Op::ExpandDims { axis } => Some(expand_rule(k, op, *axis, hints, regs)),
            // a dot lowered where it stands: the accumulator layout of `m16n8k16` tiles
            // over the block's warps where the matrix instruction takes it, runs of 4
            // for the FMA rule, else a blocked result like any tile's
            Op::Dot { .. } => Some(Layout::Blocked(
                one_dot_mma_layout(k, op).or_else(|| fma_runs_layout(k, op)).unwrap_or_else(|| default_layout(k, node.ty.as_ref().unwrap())),
            )),
            // carried values keep their init's layout
            Op::LoopCarried { id, index } | Op::LoopResult { id, index } => {
                let info = k.loop_info(*id).ok_or_else(|| CodegenError::Unsupported("a loop without its yield".into()))?;
                let init = k.operands(info.for_op)[3 + *index as usize];
                Some(layout_of(k, init))
            }
            // each next value of a carried tile takes the carried value's layout
            Op::Yield { id } => {
                let info = k.loop_info(*id).ok_or_else(|| CodegenError::Unsupported("a yield without its loop".into()))?;
                for (i, &next) in ops.iter().enumerate() {
                    let carried = info.carried_values[i].unwrap_or(k.operands(info.for_op)[3 + i]);
                    if let (Some(root), false) = (flexible_root(k, carried), is_flexible(k, next)) {
                        wanted.entry(root).or_insert_with(|| layout_of(k, next));
                    }
                    let want = layout_of(k, carried);
                    if !k.ty(next).is_scalar() && layout_of(k, next) != want {
                        convert(k, op, next, want);
                    }
                }
                None
            }
            Op::Iota { .. } => Some(hints.get(&op.value()).cloned().unwrap_or_else(|| Layout::Blocked(default_layout(k, node.ty.as_ref().unwrap())))),
            Op::Permute { perm } => match layout_of(k, ops[0]) {
                Layout::Blocked(b) => Some(Layout::Blocked(permute(&b, perm))),
                other => Some(other),
            },
            Op::Broadcast => broadcast_rule(k, op, hints)?,
            _ => None,
        };
        if let (Some(l), Some(t)) = (result, &node.ty) {
            if !t.is_scalar() {
                if matches!(node.op, Op::Load { .. }) {
                    gather_rule(k, op, &l);
                }
                k.schedule.layouts.insert(op.value(), l);
            }
        }
    }
    *at = None;
    // what each unsqueezed rank-1 tile met, now that every layout is known: the parent
    // of its slice, and the layout of the `iota` it is computed from
    for op in k.order.clone() {
        let Op::ExpandDims { axis } = *k.op(op) else { continue };
        if k.ty(op.value()).rank() != 2 || k.ty(k.operands(op)[0]).rank() != 1 {
            continue;
        }
        if let Some(parent) = met_layout(k, op.value(), regs) {
            let mut src = k.operands(op)[0];
            if matches!(k.op(src.op()), Op::Convert) {
                src = k.operands(src.op())[0];
            }
            if let Some(iota) = iota_root(k, src) {
                wanted.insert(iota, Layout::Slice { parent: parent.clone(), axis });
            }
            wanted.insert(op.value(), Layout::Blocked(parent));
        }
    }
    Ok(wanted)
}

/// A `Store` whose value's fastest axis is not the tile axis over the output's
/// unit-stride dimension, or that holds vectors an output takes only as scalars, gets a
/// `Convert` to the store's anchor layout (see the module docs).
fn store_rule(k: &mut Kernel, spec: &Spec, op: OpId) {
    let v = k.stored_value(op);
    if let (Some(want), false) = (access_layout(k, spec, op), k.ty(v).is_scalar()) {
        let have = layout_of(k, v);
        let fast = want.order[0] as usize;
        let need = match &have {
            Layout::Blocked(b) => {
                (b.order[0] as usize != fast && want.shape[fast] > 1)
                    // an output only scalar stores can write: regroup a
                    // vector layout so that the warp's stores are consecutive
                    || (b.steps.is_empty()
                        && b.order[0] as usize == fast
                        && want.size_per_thread[fast] == 1
                        && b.size_per_thread[fast] > 1
                        && want.shape[fast] >= 32)
            }
            // a reduction result: worth a trip through shared memory for
            // coalesced writes only when it is large and lives in one block
            Layout::Slice { parent, .. } => {
                parent.block_split.iter().all(|&c| c == 1) && want.shape.iter().product::<u32>() > 128
            }
            Layout::Uniform => false,
        };
        if need {
            convert(k, op, v, Layout::Blocked(want));
        }
    }
    // a `store_where` mask and a scatter's index tiles: in the (final) value's registers
    let want = layout_of(k, k.stored_value(op));
    if let Some(m) = k.store_mask(op) {
        if layout_of(k, m) != want {
            convert(k, op, m, want.clone());
        }
    }
    gather_rule(k, op, &want);
}

/// An elementwise op takes the layout of the operand it follows (see the module docs);
/// the other operands in another layout get a `Convert`.
fn elementwise_rule(k: &mut Kernel, op: OpId, hints: &HashMap<ValueId, Layout>, regs: bool) -> Layout {
    let ops = k.operands(op);
    let shape = concrete_shape(k, k.ty(op.value()));
    if shape.is_empty() {
        Layout::Uniform
    } else {
        // the operand to follow: not a broadcast scalar, not a flexible carried
        // value, and of the strongest layout (a matrix accumulator first)
        let strongest = |pred: &dyn Fn(ValueId) -> bool| {
            ops.iter().copied().filter(|&o| pred(o)).fold(None, |best: Option<ValueId>, o| match best {
                Some(b) if strength(&layout_of(k, b)) >= strength(&layout_of(k, o)) => Some(b),
                _ => Some(o),
            })
        };
        let pick = strongest(&|o| !is_scalar_broadcast(k, o) && !is_flexible(k, o) && !is_tile_broadcast(k, o))
            .or_else(|| strongest(&|o| !is_scalar_broadcast(k, o) && !is_tile_broadcast(k, o) && !is_flexible_accumulator(k, o, regs)))
            .or_else(|| strongest(&|o| !is_scalar_broadcast(k, o) && !is_flexible(k, o)))
            .or_else(|| strongest(&|o| !is_scalar_broadcast(k, o)))
            .unwrap_or(ops[0]);
        let l = hints.get(&op.value()).cloned().unwrap_or_else(|| layout_of(k, pick));
        for &o in &ops {
            if layout_of(k, o) != l && !k.ty(o).is_scalar() {
                convert(k, op, o, l.clone());
            }
        }
        l
    }
}

/// `ExpandDims` of a rank-1 tile into a row or a column of a rank-2 tile: the slice of
/// the layout it meets (see the module docs); otherwise its operand's layout.
fn expand_rule(k: &mut Kernel, op: OpId, axis: u32, hints: &HashMap<ValueId, Layout>, regs: bool) -> Layout {
    let ops = k.operands(op);
    let axis = &axis;
    match layout_of(k, ops[0]) {
    // a rank-1 tile made a column `[E, 1]` or a row `[1, E]` of a rank-2 tile
    // lives as the slice of the layout it meets there, so that the writer adds
    // the axis without moving data
    Layout::Blocked(b) if b.shape.len() == 1 && k.ty(op.value()).rank() == 2 => {
        let hint = match hints.get(&op.value()) {
            Some(Layout::Blocked(p)) => Some(p.clone()),
            _ => None,
        };
        let parent = hint.or_else(|| met_layout(k, op.value(), regs)).unwrap_or_else(|| {
            let mut ty = k.ty(op.value()).clone();
            ty.shape[*axis as usize] = met_extent(k, op.value()).unwrap_or(ty.shape[*axis as usize]);
            default_layout(k, &ty)
        });
        let want = Layout::Slice { parent, axis: *axis };
        if layout_of(k, ops[0]) != want {
            convert(k, op, ops[0], want.clone());
        }
        want
    }
    // the slice of another tile's layout (a row statistic of `s` unsqueezed
    // against `acc`): the slice of the layout it meets instead (a conversion
    // the writer makes free where both hold the same rows in the same
    // registers)
    Layout::Slice { parent, axis: a } if a == *axis && k.ty(op.value()).rank() == 2 => {
        let mut target = concrete_shape(k, k.ty(op.value()));
        if let Some(e) = met_extent(k, op.value()) {
            target[*axis as usize] = crate::analysis::extent_value(k, e);
        }
        if parent.shape == target {
            Layout::Slice { parent, axis: a }
        } else {
            let mut ty = k.ty(op.value()).clone();
            if let Some(e) = met_extent(k, op.value()) {
                ty.shape[*axis as usize] = e;
            }
            let p = met_layout(k, op.value(), regs).unwrap_or_else(|| default_layout(k, &ty));
            let want = Layout::Slice { parent: p, axis: *axis };
            convert(k, op, ops[0], want.clone());
            want
        }
    }
    l => l,
    }
}

/// `Broadcast`: a scalar takes the layout of what it meets (a hint, a partner of the
/// same shape, the first user's other operand); a slice back to its parent's shape, the
/// parent; a rank-1 tile to rank 2, the slice of the target it is converted to.
fn broadcast_rule(k: &mut Kernel, op: OpId, hints: &HashMap<ValueId, Layout>) -> Result<Option<Layout>, CodegenError> {
    let ops = k.operands(op);
    let shape = concrete_shape(k, k.ty(op.value()));
    let node = k.node(op).clone();
    let src = ops[0];
    let rty = node.ty.clone().unwrap();
    // The layout the first elementwise user's other operand has, if any.
    let from_user = k.users(op.value()).into_iter().find_map(|u| {
        k.operands(u)
            .into_iter()
            .filter(|&o| o != op.value() && !k.ty(o).is_scalar() && k.schedule.layouts.contains_key(&o))
            .map(|o| layout_of(k, o))
            .find(|l| matches!(l, Layout::Blocked(b) if b.shape == shape))
    });
    // a scalar broadcast takes any layout a partner of the same shape has
    let partner = k.users(op.value()).into_iter().find_map(|u| {
        k.operands(u)
            .into_iter()
            .filter(|&o| o != op.value() && k.ty(o).shape == rty.shape && k.schedule.layouts.contains_key(&o))
            .map(|o| layout_of(k, o))
            .next()
    });
    Ok(match layout_of(k, src) {
        Layout::Uniform if hints.contains_key(&op.value()) => hints.get(&op.value()).cloned(),
        // a broadcast scalar feeding a hinted elementwise op takes its hint
        Layout::Uniform if k.users(op.value()).first().is_some_and(|u| hints.contains_key(&u.value())) => {
            hints.get(&k.users(op.value())[0].value()).cloned()
        }
        Layout::Uniform => Some(partner.or(from_user).unwrap_or_else(|| Layout::Blocked(default_layout(k, &rty)))),
        Layout::Slice { parent, axis } if parent.shape == shape => {
            let _ = axis;
            Some(Layout::Blocked(parent))
        }
        _ => {
            let target = match from_user {
                Some(Layout::Blocked(b)) => b,
                _ => default_layout(k, &rty),
            };
            let src_rank = k.ty(src).rank();
            if shape.len() != 2 || src_rank != 1 {
                return Err(CodegenError::Unsupported(format!("broadcast from rank {src_rank} to rank {} ({} = broadcast {src}, {src} in layout {})", shape.len(), op.value(), kfuse_ir::print::layout_str(&layout_of(k, src)))));
            }
            let want = Layout::Slice { parent: target.clone(), axis: 0 };
            if layout_of(k, src) != want {
                convert(k, op, src, want);
            }
            Some(Layout::Blocked(target))
        }
    })
}

/// A `Convert` fed by a load through a chain of single-use elementwise ops — one
/// operand, or two with a broadcast scalar (`c.load().to_f32() * beta`) — is folded
/// away: the load and the
/// chain take the converted layout directly, so the data arrives where it is needed
/// without a trip through shared memory.
fn fold_converts_into_loads(k: &mut Kernel) {
    for op in k.order.clone() {
        if !matches!(k.op(op), Op::Convert) {
            continue;
        }
        let target = layout_of(k, op.value());
        let src = k.operands(op)[0];
        let mut chain = vec![src];
        let mut v = src;
        let foldable = loop {
            if k.users(v).len() != 1 {
                break false;
            }
            match k.op(v.op()) {
                Op::Load { .. } => break true,
                Op::Cast { .. } | Op::Unary(_) => {
                    v = k.operands(v.op())[0];
                    chain.push(v);
                }
                // `c.load() * beta`: a binary op with a broadcast scalar partner
                Op::Binary(_) => {
                    let ops = k.operands(v.op());
                    let (s, t) = if is_scalar_broadcast(k, ops[0]) { (ops[0], ops[1]) } else { (ops[1], ops[0]) };
                    if !is_scalar_broadcast(k, s) || k.users(s).len() != 1 {
                        break false;
                    }
                    chain.push(s);
                    v = t;
                    chain.push(v);
                }
                _ => break false,
            }
        };
        if !foldable {
            continue;
        }
        for c in &chain {
            k.schedule.layouts.insert(*c, target.clone());
        }
        for u in k.users(op.value()) {
            k.replace_operand(u, op.value(), src);
        }
        k.schedule.layouts.remove(&op.value());
        k.remove(op);
    }
}

/// The shared-memory layout of a conversion between two layouts (see the module docs).
fn smem_layout(rank: usize, from: &Layout, to: &Layout, dtype: DType) -> SmemLayout {
    let esz = dtype.size_bytes() as u32;
    if rank != 2 {
        return SmemLayout::Padded { pad: 0 };
    }
    let padded = SmemLayout::Padded { pad: (4 / esz).max(1) };
    let (Layout::Blocked(a), Layout::Blocked(b)) = (from, to) else { return padded };
    let row_vec = |l: &Blocked| if l.order[0] == 1 { l.size_per_thread[1] } else { 1 };
    let col_run = |l: &Blocked| if l.order[0] == 0 { l.size_per_thread[0] } else { 1 };
    let (va, vb) = (row_vec(a), row_vec(b));
    let (vec, other) = if va > 1 && vb <= 1 { (va, b) } else if vb > 1 && va <= 1 { (vb, a) } else { return padded };
    let c = a.shape[1];
    if vec * esz > 16 || c / vec < 2 {
        return padded;
    }
    SmemLayout::Swizzled { vec, phase_div: col_run(other).max(1) }
}

//! `choose_tiles`: gives every tile symbol and every full extent a concrete size, and
//! picks the block's thread count.
//!
//! Heuristic (memory-bound tile programs): each block access covers about 4096
//! elements (8 KiB of 2-byte types, 16 KiB of 4-byte ones): with 512 threads (rank-1
//! tiles) that is 8 elements, one or two 16-byte vectors, per thread and tensor, with
//! 256 (2-D tiles) 16 — enough bytes in flight, few enough registers that math-heavy
//! bodies (erf, tanh) do not spill. For each load/store,
//! the extents that are not tile symbols (literals, padded full extents) are fixed; the
//! budget left is shared evenly (geometric mean, rounded down to a power of two) among
//! the tile symbols of that access, and each is capped at the tensor extent it tiles
//! (rounded up to a power of two), so small tensors get small tiles. A symbol used by
//! several accesses takes the smallest choice. `Spec::tiles` overrides by name.
//!
//! Threads: one per 8 elements of the largest tile ([`ELEMS_PER_THREAD`]), between 32
//! and 512, for rank-1 tiles without a full extent and for purely elementwise kernels of
//! any rank; one per 16, up to 256, for other tiles of higher rank
//! ([`TILE2D_ELEMS_PER_THREAD`]: transposes, reductions, loops); one per 32 elements, up to 1024, for rows
//! ([`ROW_ELEMS_PER_THREAD`]: 128 threads at 1024- and 4096-element rows, 512 at 16384).
//!
//! Long rows: when a full-extent tile would need more than 32 elements per thread,
//! its widest full extent is cut across a thread-block cluster of up to 8 blocks
//! (sm_90; `schedule.split_blocks`, `schedule.split`): each block holds one piece of every
//! such axis, reductions along it meet in distributed shared memory, and the row is
//! still read once and written once. Those blocks have the fewest threads, from
//! [`CLUSTER_MIN_THREADS`] to [`CLUSTER_THREADS`], that leave a thread at most 64
//! elements in a cluster of 8 (at most 32 in a row with masks): 256 at 131072-element
//! rows, 512 at 262144 — 1024 where 512 would leave a thread more. Past 64 elements per
//! thread the kernel is refused. Where no cluster takes such a row (sm_80 and sm_89; a
//! row reduced inside a loop), `chunk_rows` has rewritten it into loops over chunks
//! before this pass ([`row_too_long`] is its test): each chunk is a row of one block and
//! takes the row heuristic's threads (`Schedule::row_chunks`).
//!
//! Register room: an elementwise body with transcendental math (exp, log, erf, tanh,
//! sigmoid, …) on whole tiles asks for one block per multiprocessor (`min_blocks = 1`), which lets the assembler
//! use the registers the math needs instead of spilling to reach an occupancy target;
//! a body that only moves and combines data leaves the choice to the assembler, which
//! keeps registers low and occupancy — the bytes in flight — high. A body with a
//! reduction (softmax: `exp` and two row reductions) is bound by occupancy (its blocks
//! wait on loads and barriers) and leaves the choice to the assembler too: 64 registers
//! instead of 72 at 256 threads, a fourth block per multiprocessor, no spills. So does
//! any block of 1024 threads (64 registers at most either way).
//!
//! Matrix tiles (a `dot` loop the matrix paths pipeline): see `choose_dot_tiles` for the
//! bucket's heuristic and [`exact_shape_tiles`] for what a launch's exact shape changes
//! (`Spec::shape_tiles`); dots that are not a matrix loop take the memory-bound
//! heuristic's tiles. The spec holds a power-of-two bucket of each size (and the exact
//! value of a short loop's bound, `Spec::shape_exact`).

use std::collections::BTreeMap;

use kfuse_ir::{AccessDim, Extent, Kernel, Op, OpId, ShapeSym, TileSym, UnaryOp};

use crate::analysis::concrete_shape;
use crate::target::{Spec, Target};
use crate::CodegenError;

/// Largest number of elements of one value a thread may hold.
pub const MAX_ELEMS_PER_THREAD: u32 = 64;

/// The most elements of one tile a thread may hold in a kernel of warpgroup `dot`s: a
/// `wgmma m64n256` accumulator's 128 (consumer warpgroups get 232 registers).
pub const WARPGROUP_ELEMS_PER_THREAD: u32 = 128;

/// Elements per thread the thread count aims at, for rank-1 tiles without a full extent
/// (elementwise kernels: 512-thread blocks of 4096-element tiles, one 16-byte vector of
/// each 16-bit tensor a thread). H100, bf16 add and copy at 16, 64 and 512 MiB a tensor,
/// L2 evicted (2026-11-26): add 3007 / 3152 / 3086 GB/s against 2886 / 3116 / 3065 with
/// 16 a thread in 256-thread blocks (whose second vector a thread waits for behind the
/// first where masks branch); copy alike.
pub const ELEMS_PER_THREAD: u32 = 8;

/// Most threads a block of rank-1 tiles without a full extent gets.
pub const MAX_TILE_THREADS: u32 = 512;

/// Elements per thread, and most threads, for tiles of rank 2 and more without a full
/// extent: 256-thread blocks of 4096-element tiles. The 16384² bf16 transpose (a layout
/// conversion through shared memory) ran at 92.1% of the copy bandwidth so and at
/// 89.5-89.7% with 512-thread blocks (H100, 2026-11-26).
pub const TILE2D_ELEMS_PER_THREAD: u32 = 16;
/// Most threads a block of such tiles gets (see [`TILE2D_ELEMS_PER_THREAD`]).
pub const MAX_TILE2D_THREADS: u32 = 256;

/// Elements per thread for kernels with a full extent (rows): four 16-byte loads in
/// flight per thread for 16-bit data. H100, bf16, L2 evicted (NOTES.md, r9/r10): 128
/// threads at 1024- and 4096-element rows, 512 at 16384: softmax, RMSNorm, LayerNorm at
/// 97-103% of the copy bandwidth, against 84-99% with 16 a thread (which once won, while
/// every register's coordinate carried a 64-bit mask and 32 a thread cost RMSNorm 102
/// registers).
pub const ROW_ELEMS_PER_THREAD: u32 = 32;

/// Most threads of each block of a row split across a cluster (unless a row needs
/// more): 512 (32 or 64 elements a thread, two blocks per multiprocessor) beat 1024 (16
/// a thread, one) on 7 of the 8 cluster-split benchmark rows (NOTES.md, r10).
pub const CLUSTER_THREADS: u32 = 512;

/// Fewest threads of each block of a row split across a cluster. With rematerialized
/// raw words and pushed partials, 64 elements a thread beat 32 at 131072-element bf16
/// rows (256 threads against 512, H100: RMSNorm 92.5 vs 89.8% of copy bandwidth,
/// LayerNorm 81.9 vs 77.2%, softmax and sum unchanged; NOTES.md, r12).
pub const CLUSTER_MIN_THREADS: u32 = 256;

/// Above this many elements per thread, a full-extent axis is cut across a cluster (of
/// as many blocks as bring it down to this many, at most [`MAX_CLUSTER`]).
pub const CLUSTER_ABOVE: u32 = 32;

/// Largest (portable) cluster.
pub const MAX_CLUSTER: u32 = 8;

/// Largest cluster an unmasked row may take (sm_90's non-portable size, which the
/// runtime allows per function): a row that would leave each thread more than
/// [`MAX_ELEMS_PER_THREAD`] at [`CLUSTER_MIN_THREADS`] threads in a cluster of
/// [`MAX_CLUSTER`] (262144 bf16 elements) is cut across 16 blocks of 256 threads — the
/// shape of the 131072-element rows, two blocks a multiprocessor — instead of 8 blocks
/// of 512 threads, one a multiprocessor.
pub const MAX_CLUSTER_NONPORTABLE: u32 = 16;

/// Runs the pass: every tile symbol, full extent and the thread count get values, from
/// `spec` (its overrides first) and `target` (module docs).
pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    // a pipelined matrix loop gets matrix tiles; dots lowered one by one (another loop
    // shape) are tiles like any other, of the memory-bound heuristic's size
    if matrix_tiles(k, target) {
        let dot = crate::passes::select_mma_path::dots(k)[0];
        return choose_dot_tiles(k, spec, target, dot);
    }
    assign_extents(k, spec, target)?;
    let Largest { elems: max_elems, op: max_op, widest_full } = largest_tile(k)?;
    let mut threads = row_threads(k, spec, max_elems, max_op, widest_full.is_some())?;
    // dots on the warpgroup rule: one warpgroup per 64 rows, never a cluster
    let warpgroups = spec.threads.is_none().then(|| warpgroup_threads(k, target)).flatten().filter(|&t| max_elems / t <= WARPGROUP_ELEMS_PER_THREAD);
    // a row split across a cluster: the fewest threads (CLUSTER_MIN_THREADS to
    // CLUSTER_THREADS) that leave a thread at most what it may hold in the largest
    // cluster — for a row with masks (a length that is not its padded power of two) at
    // most CLUSTER_ABOVE: masked 262144-element rows at 64 a thread spilled 400-1300
    // bytes; a row that needs more keeps its 1024 threads
    let masked = k.schedule.full.keys().any(|s| !k.schedule.full_exact.contains(s));
    let most = if masked { CLUSTER_ABOVE } else { MAX_ELEMS_PER_THREAD };
    // the largest cluster this row may take: 16 for an unmasked row too long for 8 of
    // CLUSTER_MIN_THREADS threads (MAX_CLUSTER_NONPORTABLE)
    let max_cluster = if !masked && max_elems / (CLUSTER_MIN_THREADS * MAX_CLUSTER) > most { MAX_CLUSTER_NONPORTABLE } else { MAX_CLUSTER };
    if let Some(t) = warpgroups {
        threads = t;
    } else if spec.threads.is_none() && widest_full.is_some() && max_elems / threads > CLUSTER_ABOVE && target.sm >= 90 && max_elems / (CLUSTER_THREADS * max_cluster) <= most {
        threads = (max_elems / (max_cluster * most)).next_power_of_two().clamp(CLUSTER_MIN_THREADS, CLUSTER_THREADS);
    }
    let mut per_thread = max_elems / threads;
    // Rows too long for one block: cut the full extent across a thread-block cluster.
    if per_thread > CLUSTER_ABOVE && warpgroups.is_none() {
        if let Some((_, e)) = widest_full {
            if target.sm < 90 {
                return Err(CodegenError::Unsupported(format!(
                    "a tile of {max_elems} elements needs a thread-block cluster (sm_90) on this target ({})",
                    target.arch()
                ))
                .at(k, max_op));
            }
            if k.schedule.grouped {
                return Err(CodegenError::Unsupported(format!(
                    "a tile of {max_elems} elements needs a thread-block cluster, which a grouped launch does not take yet"
                ))
                .at(k, max_op));
            }
            let mut c = (per_thread / CLUSTER_ABOVE).next_power_of_two().min(MAX_CLUSTER);
            if per_thread / c > most && max_cluster > MAX_CLUSTER {
                c = (per_thread / most).next_power_of_two().min(max_cluster);
            }
            k.schedule.split_blocks = c;
            k.schedule.split = Some(e);
            per_thread /= c;
        }
    }
    let limit = if warpgroups.is_some() { WARPGROUP_ELEMS_PER_THREAD } else { MAX_ELEMS_PER_THREAD };
    if per_thread > limit {
        return Err(CodegenError::Unsupported(format!(
            "a tile of {max_elems} elements needs {per_thread} elements per thread with {threads} threads \
             and {} blocks per cluster (limit {limit})",
            k.schedule.split_blocks.max(1)
        ))
        .at(k, max_op));
    }
    k.schedule.num_threads = threads;
    // math on whole tiles (not on a reduced row statistic) asks for register room
    let math = k.order.iter().any(|&op| {
        matches!(k.op(op), Op::Unary(u) if !matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not))
            && tile_elems(k, k.ty(op.value())) >= threads as u64
    });
    let reduces = k.order.iter().any(|&op| matches!(k.op(op), Op::Reduce { .. }));
    k.schedule.min_blocks = match spec.min_blocks {
        Some(b) => b,
        // (a block of 1024 threads gets at most 64 registers either way, and ptxas
        // spilled a 262144-element cluster softmax under `(1024, 1)`, not under `(1024)`)
        None => u32::from(math && !reduces && threads < 1024),
    };
    Ok(())
}

/// Whether the kernel's tiles are a matrix loop's (`choose_dot_tiles`): a loop that
/// accumulates `dot(load, load)` (`select_mma_path::matrix_loop`) whose dots the target
/// takes together.
fn matrix_tiles(k: &Kernel, target: &Target) -> bool {
    let dots = crate::passes::select_mma_path::dots(k);
    !dots.is_empty()
        && crate::passes::select_mma_path::matrix_loop(k, &dots).is_ok()
        && crate::passes::select_mma_path::several_dots_elsewhere(k, &dots, target).is_none()
}

/// The row that [`run`] would cut across a thread-block cluster: the widest full extent
/// of a kernel whose largest tile leaves each thread of one block more than
/// [`CLUSTER_ABOVE`] elements, with that tile's elements (`None` when every tile fits a
/// block, and for a pipelined matrix loop). Decided on a copy: `k` is left as it is.
pub fn row_too_long(k: &Kernel, spec: &Spec, target: &Target) -> Result<Option<(ShapeSym, u32)>, CodegenError> {
    if matrix_tiles(k, target) {
        return Ok(None);
    }
    let mut k = k.clone();
    assign_extents(&mut k, spec, target)?;
    let l = largest_tile(&k)?;
    let threads = row_threads(&k, spec, l.elems, l.op, l.widest_full.is_some())?;
    Ok(match l.widest_full {
        Some((_, Extent::Full(s))) if l.elems / threads > CLUSTER_ABOVE => Some((s, l.elems)),
        _ => None,
    })
}

/// Gives every full extent its padded size (`schedule.full`, `full_exact`) and every tile
/// symbol its size (`schedule.tiles`): the budget rule of the module docs.
fn assign_extents(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    // Full extents.
    for op in k.order.clone() {
        let mut extents = access_extents(k, op);
        if let Some(t) = &k.node(op).ty {
            extents.extend(t.shape.iter().copied());
        }
        for e in extents {
            if let Extent::Full(s) = e {
                let v = spec.shape_pow2.get(s.0 as usize).copied().unwrap_or(1).max(1).next_power_of_two();
                k.schedule.full.insert(s, v);
                if spec.shape_div.get(s.0 as usize).is_some_and(|&d| d >= v) {
                    k.schedule.full_exact.insert(s);
                }
            }
        }
    }
    // Tile symbols.
    let mut choice: BTreeMap<TileSym, u32> = BTreeMap::new();
    let mut caps: BTreeMap<TileSym, u32> = BTreeMap::new();
    for op in k.order.clone() {
        let (tensor, dims) = match k.op(op) {
            Op::Load { tensor, dims } | Op::Store { tensor, dims } => (*tensor, dims.clone()),
            _ => continue,
        };
        let p = k.param(tensor);
        let budget: u64 = 4096;
        let tdims = p.dims().to_vec();
        let mut fixed = 1u64;
        let mut syms: Vec<(TileSym, u32)> = Vec::new();
        for (d, ad) in dims.iter().enumerate() {
            let AccessDim::Tile(e) = ad else { continue };
            match e {
                Extent::Const(c) => fixed *= *c as u64,
                Extent::Full(s) => fixed *= k.schedule.full[s] as u64,
                Extent::Tile(t) => {
                    let cap = spec.shape_pow2.get(tdims[d].0 as usize).copied().unwrap_or(1 << 20).max(1).next_power_of_two();
                    syms.push((*t, cap));
                }
            }
        }
        if syms.is_empty() {
            continue;
        }
        let per = ((budget / fixed.max(1)).max(1) as f64).powf(1.0 / syms.len() as f64);
        let per = 1u32 << (per.log2().floor().max(0.0) as u32);
        for (t, cap) in syms {
            let c = caps.entry(t).or_insert(cap);
            *c = (*c).min(cap);
            let v = per.min(cap).max(1);
            let e = choice.entry(t).or_insert(v);
            *e = (*e).min(v);
        }
    }
    gathered_register_tiles(k, &caps, &mut choice);
    let plain = choice.clone();
    // widest first (128 rows over two warpgroups, 128 along N and K), narrower while a
    // tile would pass the elements a thread may hold, else the memory-bound choice
    let (rows, others) = warpgroup_dot_syms(k);
    let mut tries: Vec<(u32, u32)> = if target.sm >= 90 && !(rows.is_empty() && others.is_empty()) { vec![(WARPGROUP_DOT_TILE, WARPGROUP_DOT_TILE), (WARPGROUP_DOT_TILE, WARPGROUP_DOT_TILE / 2), (WARPGROUP_DOT_TILE / 2, WARPGROUP_DOT_TILE / 2)] } else { vec![] };
    // N and K no wider than half the floor (their tensors' extents): twice the rows
    // first, so that a step's instructions keep [`WARPGROUP_DOT_TILE`]² results
    let narrow = !others.is_empty() && others.iter().all(|t| caps.get(t).is_some_and(|&c| c <= WARPGROUP_DOT_TILE / 2));
    if narrow && !tries.is_empty() {
        tries.insert(0, (2 * WARPGROUP_DOT_TILE, WARPGROUP_DOT_TILE));
    }
    // dots chained in a loop (flash attention): a block of WIDE_ROWS first, the kernel's
    // first register-room attempt where its results fit (the ones after it: the tiles
    // below, `Schedule::row_attempts`)
    let wide = !narrow && !tries.is_empty() && spec.threads.is_none() && chained_dots(k);
    if wide {
        tries.insert(0, (WIDE_ROWS, WARPGROUP_DOT_TILE));
    }
    for &(rows_floor, others_floor) in tries.iter().chain(std::iter::once(&(0, 0))) {
        let mut c = plain.clone();
        if rows_floor > 0 {
            let cap = |t: &TileSym| caps.get(t).copied().unwrap_or(rows_floor);
            for t in &rows {
                let e = c.entry(*t).or_insert(1);
                *e = (*e).max(rows_floor.min(cap(t)));
            }
            for t in &others {
                let e = c.entry(*t).or_insert(1);
                *e = (*e).max(others_floor.min(cap(t)));
            }
        }
        set_tiles_of(k, spec, &c)?;
        if rows_floor == 0 || spec.threads.is_some() {
            break;
        }
        let results = if rows_floor == WIDE_ROWS { WIDE_DOT_RESULTS_PER_THREAD } else { WARPGROUP_DOT_RESULTS_PER_THREAD };
        let threads = warpgroup_threads(k, target);
        let fits = match (threads, largest_tile(k)) {
            (Some(threads), Ok(l)) => l.elems / threads <= WARPGROUP_ELEMS_PER_THREAD && dot_results(k) / threads as u64 <= results,
            _ => false,
        };
        if rows_floor == WIDE_ROWS {
            // (only where it gave three warpgroups: an override of the rows keeps its own)
            if fits && threads == Some(3 * 128) {
                k.schedule.row_attempts = 1;
                if spec.register_attempt == 0 {
                    break;
                }
            }
            continue;
        }
        if fits {
            break;
        }
    }
    Ok(())
}

/// Rows and columns of the tile of a gathered rank-2 load that no `dot` reads (each row
/// its own address, the tile computed on in registers: the depthwise convolution's input
/// pixels): [`GATHERED_ROWS`] × [`GATHERED_COLS`] where the tensors allow, so that
/// `assign_layouts` can give each thread one row's [`TILE2D_ELEMS_PER_THREAD`] elements
/// with eight lanes along each 128-byte line (`gather_rows`). H200, depthwise 3 × 3
/// bf16, GB/s at C256 56 / C512 28 / C1024 14 (NOTES.md c27): 64 × 64 and four lanes a
/// row's 128 bytes 1528–1531 / 1399–1407 / 1221–1230; 16 × 128, eight lanes a line,
/// 1688–1689 / 1546–1551 / 1340–1341 (8 × 128: 1699, 4 × 128: 1706, 32 × 128 over 256
/// threads: 1592–1597 at C256).
fn gathered_register_tiles(k: &Kernel, caps: &BTreeMap<TileSym, u32>, choice: &mut BTreeMap<TileSym, u32>) {
    for op in k.order.clone() {
        let Op::Load { dims, .. } = k.op(op) else { continue };
        if !crate::analysis::gathered_in_registers(k, op) {
            continue;
        }
        let syms: Vec<TileSym> = AccessDim::tile_shape(dims)
            .iter()
            .filter_map(|e| match e {
                Extent::Tile(t) => Some(*t),
                _ => None,
            })
            .collect();
        let [rows, cols] = syms[..] else { continue };
        if rows == cols {
            continue;
        }
        let cap = |t: TileSym| caps.get(&t).copied().unwrap_or(u32::MAX);
        choice.insert(cols, GATHERED_COLS.min(cap(cols)));
        choice.insert(rows, GATHERED_ROWS.min(cap(rows)));
    }
}

/// See [`gathered_register_tiles`]: one row a thread and eight lanes a row make 128
/// columns of [`TILE2D_ELEMS_PER_THREAD`] a thread.
const GATHERED_COLS: u32 = 8 * TILE2D_ELEMS_PER_THREAD;

/// See [`gathered_register_tiles`]: 16 rows of 128 columns, 128 threads.
const GATHERED_ROWS: u32 = 16;

/// The most elements of `dot` results a thread of a kernel on the warpgroup rule may
/// hold together (the f32 values of every `dot`, which a loop body keeps live at once:
/// flash attention's scores and output accumulator). At D = 256, attention's 128 × 64
/// scores and 128 × 256 accumulator (32 + 128 a thread) compile for sm_90a without spills
/// in 232-register consumers; 128 × 128 scores (64 + 128) do not fit shared memory beside
/// the rings. Below this, the widest tiles of [`WARPGROUP_DOT_TILE`] are taken first.
pub const WARPGROUP_DOT_RESULTS_PER_THREAD: u64 = 160;

/// The elements of the `dot` results of one loop body (or of the code outside loops),
/// summed, at the most of any.
fn dot_results(k: &Kernel) -> u64 {
    let mut by_loop: BTreeMap<Option<kfuse_ir::LoopId>, u64> = BTreeMap::new();
    for op in k.ops().filter(|&op| matches!(k.op(op), Op::Dot { .. })) {
        *by_loop.entry(k.loop_of(op)).or_default() += tile_elems(k, k.ty(op.value()));
    }
    by_loop.into_values().max().unwrap_or(0)
}

/// Gives every tile symbol its override or `choice`'s size (64 for one no access sizes).
fn set_tiles_of(k: &mut Kernel, spec: &Spec, choice: &BTreeMap<TileSym, u32>) -> Result<(), CodegenError> {
    for (i, name) in k.tile_syms.clone().iter().enumerate() {
        let t = TileSym(i as u32);
        let v = match spec.tile(name) {
            Some(v) => {
                if !v.is_power_of_two() {
                    return Err(CodegenError::Unsupported(format!("tile override {name} = {v} is not a power of two")));
                }
                v
            }
            None => choice.get(&t).copied().unwrap_or(64),
        };
        k.schedule.tiles.insert(t, v);
    }
    Ok(())
}

/// The size a tile symbol along a dimension of a `dot` lowered one by one on sm_90a with
/// 16-bit operands at least takes (capped at the tensor extent it tiles): 128 rows (two
/// warpgroups of `wgmma m64nNk16`), and 128 along N and K (64 where the rows are
/// fewer), so that the dot runs on the warpgroup rule of `cuda/emit/dot_wgmma.rs` with
/// A and B tiles whose swizzle is the widest. H100, flash attention B4 H16 S4096 D128
/// bf16 (2026-11-26): 181.0 TFLOP/s at BM = BN = 128, 163.5 at BM = 128 BN = 64, 140.7
/// at 64 and 64. Where every N and K tile symbol is capped at half that by its tensor,
/// 256 rows are tried first (each warpgroup 128): H100, `kfuse::ops::conv2d` C64 → K64
/// 3x3 N64 56×56 bf16, 171.6 TFLOP/s at BM = 256 BN = 64 against 125.2 at 128 × 64
/// (NOTES.md c15).
pub const WARPGROUP_DOT_TILE: u32 = 128;

/// Rows of the block tried first where a loop chains `dot`s on the warpgroup rule
/// (`chained_dots`: flash attention's `P·V` reads the softmax of its `Q·Kᵀ`): three
/// warpgroups of 64 (`cuda/emit/warp_specialize.rs`, `WIDE_CONSUMERS`), so that two
/// run their dots while one computes, where the loop's results leave each of 384
/// threads at most [`WIDE_DOT_RESULTS_PER_THREAD`] (D64's 192 × 128 scores and 192 × 64
/// output: 64 + 32). It is the kernel's first register-room attempt; the tiles of two
/// warpgroups are the next (`Schedule::row_attempts`). FlashAttention-3 takes 192 rows
/// at D64 too. H200, `kfuse::ops::attention` D64: +18% / +8% / +25% / +18% at S4096 /
/// causal / S16384 / causal (NOTES.md a29).
pub const WIDE_ROWS: u32 = 192;

/// The most `dot` results a thread of three consumer warpgroups (160 registers) holds
/// (see [`WARPGROUP_DOT_RESULTS_PER_THREAD`]): D64's 96 compile without spills, D128's
/// 128 do not fit beside the operands.
pub const WIDE_DOT_RESULTS_PER_THREAD: u64 = 96;

/// Whether a loop chains `dot`s: one's operand is computed in the loop from another's
/// result (flash attention's `P·V` after `Q·Kᵀ`; not a GEMM's or SwiGLU's dots, which
/// read loads).
fn chained_dots(k: &Kernel) -> bool {
    k.ops().filter(|&op| matches!(k.op(op), Op::Dot { .. })).any(|dot| {
        let Some(l) = k.loop_of(dot) else { return false };
        let mut todo: Vec<OpId> = k.operands(dot).iter().map(|v| v.op()).collect();
        let mut seen = std::collections::BTreeSet::new();
        while let Some(op) = todo.pop() {
            if k.loop_of(op) != Some(l) || !seen.insert(op) {
                continue;
            }
            if matches!(k.op(op), Op::Dot { .. }) {
                return true;
            }
            todo.extend(k.operands(op).iter().map(|v| v.op()));
        }
        false
    })
}

/// The tile symbols along the M extents, and along the N and K extents, of the kernel's
/// `dot`s with f16/bf16 operands (the warpgroup rule's candidates).
fn warpgroup_dot_syms(k: &Kernel) -> (Vec<TileSym>, Vec<TileSym>) {
    let (mut rows, mut others) = (Vec::new(), Vec::new());
    for op in k.ops() {
        if !matches!(k.op(op), Op::Dot { precision: kfuse_ir::DotPrecision::Exact }) {
            continue;
        }
        let ops = k.operands(op);
        let (a, b) = (k.ty(ops[0]), k.ty(ops[1]));
        if a.dtype != b.dtype || !matches!(a.dtype, kfuse_ir::DType::F16 | kfuse_ir::DType::BF16) || a.shape.len() != 2 || b.shape.len() != 2 {
            continue;
        }
        for (i, e) in [a.shape[0], a.shape[1], b.shape[1]].into_iter().enumerate() {
            match e {
                Extent::Tile(t) if i == 0 => rows.push(t),
                Extent::Tile(t) => others.push(t),
                _ => {}
            }
        }
    }
    (rows, others)
}

/// The block's threads for `dot`s on the warpgroup rule (sm_90a, 16-bit operands, every
/// such dot's M a multiple of 64 and N at most 256): one warpgroup per 64 rows of the
/// largest M, at most two — three at [`WIDE_ROWS`].
fn warpgroup_threads(k: &Kernel, target: &Target) -> Option<u32> {
    let (rows, others) = warpgroup_dot_syms(k);
    if target.sm < 90 || rows.is_empty() && others.is_empty() {
        return None;
    }
    let mut rows = 0;
    for op in k.ops() {
        if !matches!(k.op(op), Op::Dot { precision: kfuse_ir::DotPrecision::Exact }) {
            continue;
        }
        let ops = k.operands(op);
        let (a, b) = (concrete_shape(k, k.ty(ops[0])), concrete_shape(k, k.ty(ops[1])));
        if a.len() != 2 || b.len() != 2 || a[0] % 64 != 0 || b[1] > 256 || a[1] % 16 != 0 || b[1] % 8 != 0 {
            return None;
        }
        rows = rows.max(a[0]);
    }
    (rows > 0).then(|| 128 * if rows == WIDE_ROWS { 3 } else { (rows / 64).min(2) })
}

/// The largest tile of a kernel whose extents have their sizes: its elements, the first
/// op with it (which errors about its size name), and the widest full extent of any value.
struct Largest {
    elems: u32,
    op: Option<OpId>,
    widest_full: Option<(u32, Extent)>,
}

fn largest_tile(k: &Kernel) -> Result<Largest, CodegenError> {
    let mut l = Largest { elems: 1, op: None, widest_full: None };
    for op in k.order.clone() {
        if let Some(t) = &k.node(op).ty {
            let n = tile_elems(k, t);
            // (a product of sizes past u32 would wrap: such a tile is refused, never
            // scheduled as the small one its wrapped count names)
            let n = u32::try_from(n).map_err(|_| {
                CodegenError::Unsupported(format!("a tile of {n} elements: more than a block can hold or a loop over chunks can walk")).at(k, Some(op))
            })?;
            if n > l.elems {
                l.elems = n;
                l.op = Some(op);
            }
            for e in &t.shape {
                if let Extent::Full(s) = e {
                    let v = k.schedule.full[s];
                    if l.widest_full.is_none_or(|(w, _)| v > w) {
                        l.widest_full = Some((v, *e));
                    }
                }
            }
        }
    }
    Ok(l)
}

/// The elements of a tile of type `t` at its compiled sizes (saturating at `u64::MAX`).
fn tile_elems(k: &Kernel, t: &kfuse_ir::Type) -> u64 {
    concrete_shape(k, t).iter().fold(1u64, |a, &e| a.saturating_mul(e as u64))
}

/// The block's threads before a cluster split: the override, else one per
/// [`ROW_ELEMS_PER_THREAD`] elements of the largest tile for rows (a full extent, or a
/// row walked in chunks: each chunk is a row of one block), one per
/// [`ELEMS_PER_THREAD`] for rank-1 tiles and for purely elementwise kernels of any rank,
/// one per [`TILE2D_ELEMS_PER_THREAD`] for the others.
fn row_threads(k: &Kernel, spec: &Spec, max_elems: u32, max_op: Option<OpId>, has_full: bool) -> Result<u32, CodegenError> {
    let has_full = has_full || k.schedule.row_chunks.is_some();
    // the rank of the largest tile: rank-1 tiles (elementwise) take more, thinner
    // threads; so do tiles of higher rank in a kernel that only moves and combines them
    // elementwise, no transpose, reduction, dot or loop (a 2-D copy: 92-95% of the copy
    // bandwidth so at f623a62, 79.5-85% with 16 a thread, H100 2026-11-26)
    let elementwise = !k.order.iter().any(|&op| matches!(k.op(op), Op::Permute { .. } | Op::Reduce { .. } | Op::Dot { .. } | Op::For { .. }));
    let flat = max_op.is_none_or(|op| k.ty(op.value()).shape.len() <= 1) || elementwise;
    let (per, cap) = match (has_full, flat) {
        (true, _) => (ROW_ELEMS_PER_THREAD, 1024),
        (false, true) => (ELEMS_PER_THREAD, MAX_TILE_THREADS),
        (false, false) => (TILE2D_ELEMS_PER_THREAD, MAX_TILE2D_THREADS),
    };
    match spec.threads {
        Some(t) if t.is_power_of_two() && (32..=1024).contains(&t) => Ok(t),
        Some(t) => Err(CodegenError::Unsupported(format!("threads override {t}: a power of two from 32 to 1024"))),
        None => Ok((max_elems / per).next_power_of_two().clamp(32, cap)),
    }
}

/// The problem extent a tiling assumes along a gathered axis of a `dot` operand (its
/// rows are addressed by index tiles, so no tensor dimension gives their number).
const GATHERED_EXTENT: u64 = 1 << 20;

fn access_extents(k: &Kernel, op: kfuse_ir::OpId) -> Vec<Extent> {
    match k.op(op) {
        Op::Load { dims, .. } | Op::Store { dims, .. } => AccessDim::tile_shape(dims),
        Op::TileExtent { extent } => vec![*extent],
        _ => vec![],
    }
}

/// The problem extents `(M, N, K)` a `dot`'s operands tile (their tensors' shape
/// symbols, rounded up to powers of two as the spec gives them).
pub fn dot_problem(k: &Kernel, spec: &Spec, dot: kfuse_ir::OpId) -> (u64, u64, u64) {
    dot_problem_of(k, dot, &|s| spec.shape_pow2.get(s).copied().unwrap_or(1) as u64)
}

/// [`dot_problem`] with each shape symbol's size from `size` (by symbol index).
fn dot_problem_of(k: &Kernel, dot: kfuse_ir::OpId, size: &dyn Fn(usize) -> u64) -> (u64, u64, u64) {
    let ops = k.operands(dot);
    let dim_size = |v: kfuse_ir::ValueId, axis: usize| -> u64 {
        // follow a permute to the load, and the tile axis to its tensor dimension
        let (load, axis) = match k.op(v.op()) {
            Op::Permute { perm } => (k.operands(v.op())[0].op(), perm[axis] as usize),
            _ => (v.op(), axis),
        };
        if let Op::Load { tensor, dims } = k.op(load) {
            let tdims = k.param(*tensor).dims().to_vec();
            for (d, a) in AccessDim::tile_axes(dims).into_iter().enumerate() {
                if a == Some(axis) {
                    // a gathered axis: as many rows as its index tiles address, unknown
                    // here; taken as large
                    return if dims[d].is_gather() { GATHERED_EXTENT } else { size(tdims[d].0 as usize) };
                }
            }
        }
        1
    };
    (dim_size(ops[0], 0), dim_size(ops[1], 1), dim_size(ops[0], 1))
}

/// Tiles of a kernel with a `dot` (matrix-bound): the dot's `[BM, BK] x [BK, BN]`.
///
/// Heuristic (sm_90, f16/bf16 WGMMA): `BK` spans 128 bytes (one swizzle span; two for
/// 64x64 tiles), `BM` is 128 (two consumer warpgroups of 64 rows). `BN` is the widest
/// of 256, 128, 64 that still gives every multiprocessor a tile (`ceil(M/BM) * ceil(N/BN) >= SMs`), or 64:
/// wide tiles reuse each A byte more, but a small problem (M = 127) needs narrow ones
/// to keep the machine busy, and 64 rows when even 128x64 leaves multiprocessors idle
/// (M127 N4096 K4096 on the H100: 64x64 with 8 stages 226 TFLOP/s; 128x64 214; 128
/// wide 160; 128 wide with the loop split over a cluster of 2 or 4, 162 / 107, NOTES).
/// The 128x256x64 kernel ran 755-807 TFLOP/s at 4096³ and 8192³ on the H100
/// (BENCHMARKS.md, NOTES.md).
/// `Spec::tiles` overrides any of them by name. sm_80/sm_89: [`mma_sync_tiles`]. A
/// `dot` of exact FMAs (f32 operands, or 16-bit ones of a loop the general lowering does
/// not take; `select_mma_path::fma::expected`): [`fma_tiles`] and [`fma_bk`], any target.
fn choose_dot_tiles(k: &mut Kernel, spec: &Spec, target: &Target, dot: kfuse_ir::OpId) -> Result<(), CodegenError> {
    let ops = k.operands(dot);
    let (at, bt) = (k.ty(ops[0]).clone(), k.ty(ops[1]).clone());
    let esz = at.dtype.size_bytes().max(1) as u32;
    let extent_len = |e: Extent| -> Option<u32> {
        match e {
            Extent::Full(s) => Some(spec.shape_pow2.get(s.0 as usize).copied().unwrap_or(1).max(1)),
            _ => None,
        }
    };
    let (m, n, _) = dot_problem(k, spec, dot);
    let mut bm = 128u32;
    let bk = 128 / esz;
    let mut bn = 64u32;
    // (no wider than N's bucket: columns past N are instructions for nothing)
    for cand in [256u32, 128] {
        if m.div_ceil(bm as u64) * n.div_ceil(cand as u64) >= target.num_sms as u64 && cand as u64 <= n.next_power_of_two() {
            bn = cand;
            break;
        }
    }
    // still fewer tiles than multiprocessors at 128x64: 64-row tiles (one consumer
    // warpgroup) double them (M127 N4096 K4096 on the H100: 226 TFLOP/s against 214)
    if bn == 64 && m.div_ceil(128) * n.div_ceil(64) < target.num_sms as u64 && m > 64 {
        bm = 64;
    }
    // 64x64 tiles (skinny problems): K tiles of two swizzle spans, so that a ring
    // stage holds 32 KiB (M127 N4096 K4096 bf16 on an H200: 263-264 -> 288-294 TFLOP/s,
    // NOTES g30)
    let bk = if bm == 64 && bn == 64 { 2 * bk } else { bk };
    // sm_80/sm_89 (mma.sync): their own heuristic
    let wgmma = target.sm == 90;
    let (bm, bk, bn) = if wgmma { (bm, bk, bn) } else { mma_sync_tiles(m, n, esz, target) };
    // an epilogue that loads a whole [BM, BN] tile (`beta * c`) holds it beside the
    // accumulators: 128 wide at most (256 spilled 0.5-1 KB)
    let epilogue_tile = loads_output_tile(k, dot);
    let bn = if epilogue_tile && wgmma { bn.min(128) } else { bn };
    // a `b` TMA cannot read is written to its tile from the consumers' registers each
    // step: 128 columns at most (a 64x256 tile, 64 elements a thread beside 128
    // accumulators, spilled 772 bytes with a bias + GELU epilogue; 128 wide: none)
    let bn = if wgmma && crate::passes::select_mma_path::staged_operand(k, spec, ops[1]) { bn.min(128) } else { bn };
    // several dots in the loop (`select_mma_path::MAX_DOTS`): their accumulators share
    // the registers of one 256-wide tile (two dots: 128 wide each)
    let ndots = crate::passes::select_mma_path::dots(k).len() as u32;
    let bn = if ndots > 1 && wgmma { bn.min((256 / ndots / 64).max(1) * 64) } else { bn };
    let want = [(at.shape[0], bm), (at.shape[1], bk), (bt.shape[1], bn)];
    for (e, v) in want {
        match e {
            Extent::Tile(t) => {
                let v = spec.tile(k.tile_name(t)).unwrap_or(v);
                k.schedule.tiles.insert(t, v);
            }
            Extent::Const(_) => {}
            Extent::Full(s) => {
                let v = extent_len(e).unwrap_or(1).next_power_of_two();
                k.schedule.full.insert(s, v);
            }
        }
    }
    // exact FMAs (f32 operands, or 16-bit ones of a loop the general lowering does not
    // take, judged with the tiles above in place): their own tiles, the overrides
    // still winning
    let fma = crate::passes::select_mma_path::fma::expected(k, spec, target, dot);
    if fma {
        let over = |e: Extent| if let Extent::Tile(t) = e { spec.tile(k.tile_name(t)) } else { None };
        let (fbm, fbn) = fma_tiles(m, n, target);
        let fbm = over(at.shape[0]).unwrap_or(if let Extent::Tile(_) = at.shape[0] { fbm } else { crate::analysis::extent_value(k, at.shape[0]) });
        for (e, v) in [(at.shape[0], fbm), (at.shape[1], fma_bk(fbm)), (bt.shape[1], fbn)] {
            if let Extent::Tile(t) = e {
                let v = spec.tile(k.tile_name(t)).unwrap_or(v);
                k.schedule.tiles.insert(t, v);
            }
        }
    }
    // every other tile symbol and full extent of the kernel
    for op in k.order.clone() {
        let mut extents = access_extents(k, op);
        if let Some(t) = &k.node(op).ty {
            extents.extend(t.shape.iter().copied());
        }
        for e in extents {
            match e {
                Extent::Tile(t) if !k.schedule.tiles.contains_key(&t) => {
                    let v = spec.tile(k.tile_name(t)).ok_or_else(|| {
                        CodegenError::Unsupported(format!(
                            "tile symbol `{}` is not an extent of the kernel's `dot`; give it a literal extent or reuse BM/BN/BK",
                            k.tile_name(t)
                        ))
                    })?;
                    k.schedule.tiles.insert(t, v);
                }
                Extent::Full(s) if !k.schedule.full.contains_key(&s) => {
                    let v = extent_len(e).unwrap_or(1).next_power_of_two();
                    k.schedule.full.insert(s, v);
                }
                _ => {}
            }
        }
    }
    // the general lowering gives each warpgroup 64 rows of the tile, two at most; a
    // loop of exact FMAs takes the FMA rule's threads (`fma::fma_threads`)
    let general = crate::passes::select_mma_path::general_takes(k, spec, target);
    let mma_sync = general && target.sm != 90 && !fma;
    let heavy = mma_sync && heavy_epilogue_of(k, dot);
    k.schedule.num_threads = if mma_sync {
        // `mma.sync`: one warp per 64x64 of the tile, 4 to 8 (`mma_sync_default_warps`),
        // which `assign_layouts` stacks along the rows
        let shape = [concrete_shape(k, &at).first().copied().unwrap_or(128), concrete_shape(k, &bt).get(1).copied().unwrap_or(128)];
        spec.threads.unwrap_or(32 * crate::passes::select_mma_path::mma_sync_default_warps(shape[0], shape[1], heavy))
    } else if fma {
        let shape = [concrete_shape(k, &at).first().copied().unwrap_or(128), concrete_shape(k, &bt).get(1).copied().unwrap_or(128)];
        spec.threads.unwrap_or(crate::passes::select_mma_path::fma::fma_threads(shape[0], shape[1]))
    } else if general {
        let rows = concrete_shape(k, &at).first().copied().unwrap_or(128);
        128 * (rows / 64).clamp(1, 2)
    } else {
        256
    };
    // (`mma.sync`: two blocks a multiprocessor where the registers allow
    // (`mma_sync_min_blocks`), for which the writer sizes the rings)
    k.schedule.min_blocks = match spec.min_blocks {
        None if mma_sync => crate::passes::select_mma_path::mma_sync_min_blocks(k.schedule.num_threads, heavy),
        _ => 1,
    };
    k.schedule.split_blocks = 1;
    Ok(())
}

/// Tile sizes that follow from a problem's exact shape (`dims`, one per shape symbol)
/// rather than the power-of-two bucket a [`Spec`] holds: the runtime records them as
/// [`Spec::shape_tiles`] before it compiles (explicit overrides win; the cache keys on
/// them, so codegen stays a function of the spec). Empty where the bucket's choice
/// stands.
///
/// Three rules, the first that applies: half the rows for a dot lowered where it
/// stands where that walks the programs in fewer waves (`half_row_tiles`); twice the
/// rows for such a dot's short reduction (`short_reduction_rows`); and `256 × 128`
/// output tiles in place of the bucket's `128 × 256` where they
/// cover the product in fewer waves (`wave_cost`) of the persistent walk on the
/// target's multiprocessors — on sm_90 (`wgmma`), one `dot` of 16-bit rank-2 operands
/// on the general lowering, its epilogue without transcendental math
/// (`select_mma_path::heavy_epilogue`). At M4095 N4097 K4096 the wide tiles are
/// 32 × 17 = 544 (the last of 5 waves of 132 holds 16), the tall ones 16 × 33 = 528 (4
/// whole waves): bf16 448 → 481 TFLOP/s, f16 440 → 476 on an H200 (`ops::gemm`, NOTES
/// g29). Shapes whose tile counts fill the same waves either way (every power-of-two
/// shape) keep the bucket's tiles.
pub fn exact_shape_tiles(k: &Kernel, spec: &Spec, dims: &[u64], target: &Target) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    // (the runtime calls this on a launch's slow path: the arithmetic first, which ends
    // it for every shape where the tall tiles would not pay)
    if target.sm != 90 {
        return out;
    }
    let dots = crate::passes::select_mma_path::dots(k);
    let [dot] = dots[..] else { return out };
    if let Some(half) = half_row_tiles(k, spec, dims, target, dot) {
        return half;
    }
    if let Some(double) = short_reduction_rows(k, spec, dims, target, dot) {
        return double;
    }
    let (m, n, _) = dot_problem_of(k, dot, &|s| dims.get(s).copied().unwrap_or(1));
    if wave_cost(m, n, 256, 128, target.num_sms) >= wave_cost(m, n, 128, 256, target.num_sms) {
        return out;
    }
    // (the waves counted are one matrix's: operands indexed along a batch dimension
    // multiply the tiles, which this count does not see)
    let rank2 = |v: kfuse_ir::ValueId| {
        let o = match k.op(v.op()) {
            Op::Permute { .. } => k.operands(v.op())[0].op(),
            _ => v.op(),
        };
        matches!(k.op(o), Op::Load { dims, .. } if dims.len() == 2)
    };
    let ops = k.operands(dot);
    let (at, bt) = (k.ty(ops[0]), k.ty(ops[1]));
    let (Extent::Tile(bm), Extent::Tile(bn)) = (at.shape[0], bt.shape[1]) else { return out };
    let overridden = spec.tiles.contains_key(k.tile_name(bm)) || spec.tiles.contains_key(k.tile_name(bn));
    // (an epilogue of transcendental math beside the 256-row tile's row masks spilled:
    // bias + GELU into rows TMA cannot store, 8 bytes)
    if !ops.iter().take(2).all(|&v| rank2(v)) || at.dtype.size_bytes() != 2 || overridden || heavy_epilogue_of(k, dot) {
        return out;
    }
    // only in place of the bucket's 128 × 256 on the general lowering (an epilogue that
    // loads an output tile, a staged `b` or exact FMAs choose other tiles), decided as
    // the pipeline decides it: after hoisting
    let mut k2 = k.clone();
    let spec = Spec { shape_tiles: BTreeMap::new(), ..spec.clone() };
    let bucket = crate::passes::hoist_invariants::run(&mut k2).is_ok()
        && crate::passes::select_mma_path::general_takes(&k2, &spec, target)
        && run(&mut k2, &spec, target).is_ok()
        && k2.schedule.tiles.get(&bm) == Some(&128)
        && k2.schedule.tiles.get(&bn) == Some(&256);
    if bucket {
        out.insert(k.tile_name(bm).to_string(), 256);
        out.insert(k.tile_name(bn).to_string(), 128);
    }
    out
}

/// Half as many rows a tile as the bucket's 128 or 256 for a `dot` of 16-bit operands
/// lowered where it stands (not the general lowering's matrix loop, whose case
/// follows), where they walk the launch's programs in fewer waves of tile area on the target's
/// multiprocessors (one block each, a warp-specialized kernel's walk): the programs
/// counted on the grid each tiling derives, at the launch's exact shape. An implicit
/// GEMM's tiles on sm_90a, N64 bf16 on an H200 (NOTES.md c21): C256 → K256 3 × 3 at 14 ×
/// 14, 98 × 2 = 196 programs of 128 × 128 (two waves, the second half empty) against
/// 392 of 64 × 128 (three whole waves), 243.0 → 295.9 TFLOP/s; C512 7 × 7 (100 against
/// 196 programs: one wave against two, the same area) keeps 128 rows (255.3; 249.1 at
/// 64). `None`: the bucket's tiles stand (an override of the row tile, another target,
/// equal or more waves).
fn half_row_tiles(k: &Kernel, spec: &Spec, dims: &[u64], target: &Target, dot: OpId) -> Option<BTreeMap<String, u32>> {
    let a = k.ty(k.operands(dot)[0]);
    // (16-bit operands: WGMMA, whose warp-specialized kernels walk the programs one block
    // a multiprocessor; exact FMAs' kernels run a block a program, two a multiprocessor)
    let Extent::Tile(bm) = a.shape[0] else { return None };
    if a.dtype.size_bytes() != 2 {
        return None;
    }
    let name = k.tile_name(bm).to_string();
    if spec.tiles.contains_key(&name) {
        return None;
    }
    let (_, rows, programs) = walk_programs(k, spec, target, dims, bm, BTreeMap::new())?;
    if rows < 128 {
        return None;
    }
    let (_, half, half_programs) = walk_programs(k, spec, target, dims, bm, BTreeMap::from([(name.clone(), (rows / 2) as u32)]))?;
    let sms = u64::from(target.num_sms.max(1));
    let cost = |rows: u64, programs: u64| programs.div_ceil(sms) * rows;
    (half == rows / 2 && cost(half, half_programs) < cost(rows, programs)).then(|| BTreeMap::from([(name, half as u32)]))
}

/// The most steps (trips of the loops around a `dot`, multiplied) of a reduction that
/// `short_reduction_rows` calls short (256-row tiles for a dot lowered where it stands).
pub const SHORT_REDUCTION_STEPS: u64 = 4;

/// Twice the bucket's 128 rows a tile for a `dot` of 16-bit operands lowered where it
/// stands whose reduction is short ([`SHORT_REDUCTION_STEPS`] at the launch's exact
/// shape), where the 256-row tiles walk the programs in no more waves of tile area: each
/// step then issues twice the WGMMA instructions a consumer warpgroup waits for, and a
/// program's ring fill and epilogue come half as often per output row. H200, N64 bf16
/// C256 → K512 1 × 1 stride 2 56 × 56 (an implicit GEMM of 4 steps of 64 channels; equal
/// waves), one call: 271.1 TFLOP/s at 256 × 128 against 236.2 at 128 × 128 (NOTES.md
/// c26); the 3 × 3 layers' 9 or more steps keep 128 rows (C128 stride 2 at 256 × 128:
/// 284.0 against 314.8). `None`: the bucket's tiles stand.
fn short_reduction_rows(k: &Kernel, spec: &Spec, dims: &[u64], target: &Target, dot: OpId) -> Option<BTreeMap<String, u32>> {
    let a = k.ty(k.operands(dot)[0]);
    let Extent::Tile(bm) = a.shape[0] else { return None };
    let name = k.tile_name(bm).to_string();
    // (before scheduling, a step of a tile symbol reads as 1: the count is at least the
    // scheduled one's, and a long reduction ends it here, on a launch's slow path)
    if a.dtype.size_bytes() != 2 || spec.tiles.contains_key(&name) || reduction_steps(k, dot, dims)? > SHORT_REDUCTION_STEPS {
        return None;
    }
    let (k2, rows, programs) = walk_programs(k, spec, target, dims, bm, BTreeMap::new())?;
    if rows != 128 || reduction_steps(&k2, dot, dims)? > SHORT_REDUCTION_STEPS {
        return None;
    }
    let (_, double, double_programs) = walk_programs(k, spec, target, dims, bm, BTreeMap::from([(name.clone(), 256)]))?;
    let sms = u64::from(target.num_sms.max(1));
    let cost = |rows: u64, programs: u64| programs.div_ceil(sms) * rows;
    (double == 256 && cost(double, double_programs) <= cost(rows, programs)).then(|| BTreeMap::from([(name, 256)]))
}

/// `k` scheduled with `shape_tiles` for a dot lowered where it stands (`None` for the
/// general lowering's matrix loop), with its row tile `bm` and the programs of its grid
/// at the exact shape `dims`.
fn walk_programs(k: &Kernel, spec: &Spec, target: &Target, dims: &[u64], bm: TileSym, shape_tiles: BTreeMap<String, u32>) -> Option<(Kernel, u64, u64)> {
    let s = Spec { shape_tiles, ..spec.clone() };
    let k2 = crate::schedule(k, &s, target).ok()?;
    if k2.schedule.general_matrix_loop {
        return None;
    }
    let grid = kfuse_ir::grid::derive(&k2).ok()?;
    let programs = grid.eval(|d| dims.get(d.0 as usize).copied().unwrap_or(1), |e| u64::from(crate::analysis::extent_value(&k2, e))).iter().product();
    let rows = u64::from(*k2.schedule.tiles.get(&bm)?);
    Some((k2, rows, programs))
}

/// The steps of the reduction around `dot` at the shape `dims`: the product of the trip
/// counts of the loops around it, each from its bounds and step (integer literals, tile
/// extents or shape symbols); `None` where one is something else or there is no loop.
fn reduction_steps(k: &Kernel, dot: OpId, dims: &[u64]) -> Option<u64> {
    let value = |v: kfuse_ir::ValueId| -> Option<i64> {
        match k.op(v.op()) {
            Op::ShapeDim { sym } | Op::TileExtent { extent: Extent::Full(sym) } => dims.get(sym.0 as usize).and_then(|&d| i64::try_from(d).ok()),
            _ => crate::analysis::int_value(k, v),
        }
    };
    // (a dot in no loop, or one the scheduled kernel no longer holds: not counted)
    let loops = k.loops_around(dot);
    if loops.is_empty() {
        return None;
    }
    loops.into_iter().try_fold(1u64, |steps, l| {
        let ops = k.operands(k.loop_info(l)?.for_op);
        let (lo, hi, step) = (value(ops[0])?, value(ops[1])?, value(ops[2])?);
        (step > 0).then(|| steps * ((hi - lo).max(0) as u64).div_ceil(step as u64))
    })
}

/// What `bm × bn` output tiles cost an `m × n` product on `sms` multiprocessors walking
/// them one a multiprocessor at a time: waves of tiles times a tile's area.
fn wave_cost(m: u64, n: u64, bm: u64, bn: u64, sms: u32) -> u64 {
    (m.div_ceil(bm) * n.div_ceil(bn)).div_ceil(sms.max(1) as u64) * bm * bn
}

/// Whether the ops after `dot`'s loop are a [`crate::passes::select_mma_path::heavy_epilogue`].
fn heavy_epilogue_of(k: &Kernel, dot: kfuse_ir::OpId) -> bool {
    k.loop_of(dot).and_then(|l| k.order.iter().position(|&o| matches!(k.op(o), Op::Yield { id } if *id == l))).is_some_and(|y| crate::passes::select_mma_path::heavy_epilogue(k, y))
}

/// Whether the epilogue of the kernel's `dot` loads a whole `[BM, BN]` tile (`beta * c`).
fn loads_output_tile(k: &Kernel, dot: kfuse_ir::OpId) -> bool {
    let ops = k.operands(dot);
    let (at, bt) = (k.ty(ops[0]), k.ty(ops[1]));
    k.ops().any(|o| matches!(k.op(o), Op::Load { .. }) && k.loop_of(o).is_none() && k.ty(o.value()).shape == [at.shape[0], bt.shape[1]])
}

/// Tiles `(BM, BN)` of a `dot` loop of exact FMAs (f32 operands, or 16-bit ones no
/// matrix path can read), any target; `BK` is [`fma_bk`].
///
/// Heuristic: 128x128 (256 threads with 8x8 thread tiles: per `k` a thread reads four
/// 16-byte vectors from shared memory for 64 FMAs — one conflict-free access per warp
/// and FMA instruction, the ratio at which a multiprocessor's 128 bytes a clock of
/// shared memory keep its 128 FP32 lanes busy; the classic SGEMM shape) when that still
/// gives every multiprocessor a tile, then 128x64 (4x8 thread tiles), else 64x64 (4x4:
/// half the FMAs per shared-memory read, but four times the tiles for small problems).
/// Where `N` is at most 64 no tile is wider than 64, and 256x64 (the same 8x8 thread
/// tiles) comes first: a 128-wide tile computed half of its FMAs for nothing (H200, the
/// f32 C64 K64 3 × 3 layer of `benches/conv2d.rs`, whose Winograd products have N = 64:
/// 25.8 → 36.3 TFLOP/s of the direct FLOPs; NOTES c35). `Spec::tiles` overrides any of
/// them by name.
///
/// # Examples
///
/// ```
/// use kfuse_codegen::{passes::choose_tiles::fma_tiles, Target};
/// let t = Target::sm90a();
/// assert_eq!(fma_tiles(4096, 4096, &t), (128, 128));
/// assert_eq!(fma_tiles(65536, 64, &t), (256, 64)); // Winograd's products at N = K = 64
/// assert_eq!(fma_tiles(32768, 64, &t), (128, 64)); // too few 256-row tiles
/// assert_eq!(fma_tiles(128, 64, &t), (64, 64));
/// ```
pub fn fma_tiles(m: u64, n: u64, target: &Target) -> (u32, u32) {
    let sms = target.num_sms as u64;
    let tiles: &[(u32, u32)] = if n <= 64 { &[(256, 64), (128, 64)] } else { &[(128, 128), (128, 64)] };
    for &(bm, bn) in tiles {
        if m.div_ceil(bm as u64) * n.div_ceil(bn as u64) >= sms {
            return (bm, bn);
        }
    }
    (64, 64)
}

/// `BK` of the FMA path: `1024 / BM` (8 for BM = 128, 16 for 64; 8 to 32), so that
/// each of 256 threads copies 4 elements of the A tile a slab and a slab of a
/// 128x128 tile is 8 KiB of f32 (two stages with their row padding: 16.5 KiB, leaving
/// room for two or more blocks a multiprocessor on every target).
pub fn fma_bk(bm: u32) -> u32 {
    (1024 / bm.max(1)).clamp(8, 32)
}

/// Tiles `(BM, BK, BN)` of a `dot` loop on `mma.sync` (sm_80, sm_89: the general
/// lowering's rule).
///
/// Heuristic: `BK` spans 64 bytes (32 elements of f16/bf16: two `k16` steps a stage,
/// 4 chunks a row, small stages so that 3-4 of them and two blocks fit a
/// multiprocessor); `BM × BN` is the largest of 128x128, 128x64, 64x64 that still gives
/// every multiprocessor a tile (`ceil(M/BM) * ceil(N/BN) >= SMs`), else 64x64. 128x128x32
/// with 8 warps (warp tiles 64x32) and 3-4 stages is the usual multistage `cp.async`
/// configuration for f16/bf16 on the A100; the narrower tiles keep a small problem
/// (M = 127) spread over the machine. `Spec::tiles` overrides any of them by name.
pub fn mma_sync_tiles(m: u64, n: u64, esz: u32, target: &Target) -> (u32, u32, u32) {
    let bk = 64 / esz.max(1);
    let sms = target.num_sms as u64;
    for (bm, bn) in [(128u32, 128u32), (128, 64)] {
        if m.div_ceil(bm as u64) * n.div_ceil(bn as u64) >= sms {
            return (bm, bk, bn);
        }
    }
    (64, bk, 64)
}

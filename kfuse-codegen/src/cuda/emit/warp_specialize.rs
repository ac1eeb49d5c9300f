//! Warp specialization of the operand rings (sm_90a): one producer warpgroup copies
//! every ring's tiles, the block's other warpgroups (the consumers, which hold the tile
//! values) compute, and no block-wide barrier couples them inside the loops.
//!
//! It applies ([`ws_plan`]) when the kernel has rings, the outermost loop of each ring's
//! nest (`operand_ring::ring_nest`: the loop, and the loops around it whose steps the
//! ring walks as one sequence, a convolution's taps) in no other loop, its block is one,
//! two or three warpgroups, and the producer can compute everything it needs again
//! itself: the nest's bounds and steps and each ring load's address operands, the
//! nest's indices or scalars computed outside every loop ([`WsPlan::slice`]; a loop
//! that computes its offsets itself, `k0 = t * BK`, keeps a `cp.async` ring: warp
//! specialized, ptxas serialized its WGMMA pipeline); a gathered load's index tiles
//! (its rows'), elementwise math on iotas and such scalars outside the loops
//! ([`WsPlan::tile_slice`]) or arithmetic in the nest on them and its indices.
//!
//! The block grows by the producer warpgroup (threads 256–383; 128–255 behind one
//! consumer warpgroup, 384–511 behind three, `WsPlan::consumers`; 256–511 for two
//! producer warpgroups, `WsPlan::producers`). Before the roles part,
//! thread 0 initializes one `full` and one `empty` mbarrier per ring stage. Then:
//! - The producer drops to 40 registers (`setmaxnreg`) and walks each ring's nest in
//!   order, one ring iteration counter across the rings (sibling loops share the ring's
//!   memory): it waits until the stage is empty and copies the tiles into it. Where every
//!   ring load's tile is exactly whole swizzle atoms of at most 256 rows of a tensor of
//!   at most 5 dimensions ([`TmaLoad`]), one thread copies them with the tensor-memory
//!   accelerator: one box a swizzle atom (`[rows, span]` bytes, the tile's
//!   swizzle), through a tensor map per load (a kernel parameter), announcing the stage's
//!   bytes on its `full` barrier (`mbarrier.arrive.expect_tx`), the boxes completing it;
//!   outside the tensor a box reads zeros. Otherwise its 128 threads copy 16-byte pieces
//!   with `cp.async` and each thread's copies arrive on the `full` barrier when they land
//!   (`cp.async.mbarrier.arrive.noinc`). It then exits.
//! - Gathered rows (an implicit GEMM's im2col rows) are the producer threads' copies,
//!   and the ring's other loads TMA's where each can take it (the `full` barrier then
//!   counts the producer threads' arrivals and the boxes' one). Beside two consumer
//!   warpgroups the producer is two warpgroups ([`GATHER_PRODUCERS`]: 64 registers, the
//!   consumers 192), else one (96 and 200, [`PRODUCER_REGS_GATHER`]); the block grows by
//!   its threads. Its threads compute the rows' index tiles once
//!   a program, each as consumer threads `t`, `t + P`, … would (`P` the producer's
//!   threads; the tiles are in the consumers' layouts), and write each step's row tables from them
//!   ([`Emitter::producer_tables`]), one barrier of the producer's threads before the
//!   copies read them; rows only the outer loops of the nest move are written once for
//!   the innermost loop's steps. H200, `kfuse::ops::conv2d` N64 bf16 (NOTES.md c20–c25;
//!   C64 / C128 / C256 / C512 3 × 3, 1 × 1 stride 2, 3 × 3 stride 2): 215.3 / 337.3 /
//!   324.1 / 337.3 / 236.8 / 315.2 TFLOP/s with two producer warpgroups (one call,
//!   2026-11-29); two blocks a multiprocessor filling their rings themselves read 179.2
//!   / 254.9 / 223.4 / 201.3 / 162.7 / 254.9 (d4ed372, a call of 2026-11-28).
//! - The consumers rise to 232 registers and run the kernel; their block barrier is the
//!   named barrier 1 over their threads. At a ring loop's first ring load they wait for
//!   the stage's `full` phase (after `cp.async` copies, a fence of the generic proxy
//!   against the async proxy that WGMMA reads through); at the end of the body, every
//!   dot of the iteration having completed, each consumer thread arrives on the stage's
//!   `empty` barrier.
//! - Where every program does the same work ([`walks_programs`]: no ring loop's bounds
//!   depend on a program id), one block a multiprocessor walks the programs
//!   (`Emitted::persistent`), both roles alike ([`Emitter::open_walk`]), the ring
//!   counter running on: the producer copies the next program's first tiles while the
//!   consumers finish this one. The walk goes in groups of [`WALK_GROUP`] along grid
//!   axis 0, axis 1 within a group (any further axes, a batch, outermost), where the
//!   rings hold tiles that programs share along each of the first two axes (a GEMM's A
//!   and B, [`grouped_walk`]), else axis 0 fastest (flash attention's programs of one
//!   head, which share its K and V).
//! - Where the producer copies by TMA and every ring loop's first dot alone reads some of
//!   its loads (flash attention's K, not V), those loads have a `full` and an `empty`
//!   mbarrier a stage of their own ([`RingSplit`]): the consumers release them as soon as
//!   that dot completes and wait for the others' copies only before the first dot that
//!   reads them, so the producer copies a later K while `P·V` still reads V. H200,
//!   `kfuse::ops::attention` at D256 (two ring stages), S4096: 526 → 622 TFLOP/s.
//! - A loop whose one WGMMA dot accumulates onto the carried value it yields keeps one
//!   group of its instructions in flight: each iteration waits only for the one before
//!   (`wgmma.wait_group 1`) and releases that one's stage; the last is waited for after
//!   the loop.
//!
//! Loops with two or more WGMMA dots and math on tiles besides them ([`tile_math_in`]:
//! flash attention's softmax; not a GEMM's or SwiGLU's accumulating dots), in a block
//! of two consumer warpgroups, take turns at the tensor cores
//! ([`Emitter::turn_before`], [`Emitter::turn_after`]): a warpgroup's turn is its last
//! dot of one iteration and its first of the next, and the two consumer warpgroups
//! alternate turns through the named barriers 2 and 3, so that one's softmax runs while
//! the other's dots do.
//! - Where such a loop's last dot takes A from registers and B from its ring, it is
//!   issued in the next iteration, after the first (`dot_overlap`: flash attention's
//!   `P·V` under the next softmax), and a turn is those two dots.

use std::collections::{BTreeMap, BTreeSet};

use kfuse_ir::{Kernel, LoopId, Op, OpId, ValueId};

use super::dot_wgmma::WgPlan;
use super::operand_ring::{enclosing_loops, gathered_roots, inside, nest_closure, ring_nest, scalar_roots};
use super::{Emitter, Val, R};
use crate::cuda::writer::Writer;

/// Threads of the consumer warpgroups (the block without its producer): two
/// warpgroups, or one ([`WsPlan::consumers`]), or three ([`WIDE_CONSUMERS`]).
pub(super) const CONSUMERS: u32 = 256;
/// Three consumer warpgroups (`choose_tiles`' block of 192 rows, `WIDE_ROWS`): the
/// consumers rise to 160 registers and the producer keeps 32 (128 · 32 + 384 · 160 =
/// 65536), too few to hold a late dot's operands through the math (`dot_overlap`:
/// flash attention at D64, 192 × 128 tiles, spilled 80 bytes at 160), so their loops
/// issue each dot where it stands, wait for it there and take no turns: three
/// warpgroups overlap one's softmax with the others' dots by themselves. H200,
/// `kfuse::ops::attention` D64 (S4096 / causal / S16384 / causal): 451.7 / 355.7 /
/// 508.0 / 455.3 TFLOP/s against 382.8 / 330.6 / 405.6 / 387.3 with two warpgroups
/// (128 × 128, late `P·V`, turns); the late form of three, with one reduction partial
/// and 16 bytes of spills, ran 443.8 / 345.0 / 498.4 / 446.5 (NOTES.md a29).
pub(super) const WIDE_CONSUMERS: u32 = 384;
pub(super) const PRODUCER_REGS_WIDE: u32 = 32;
pub(super) const CONSUMER_REGS_WIDE: u32 = 160;
/// Threads of the producer warpgroup (the block's last).
pub(super) const PRODUCER_THREADS: u32 = 128;
/// The named barrier of the producer's threads (after its row tables: 0 is the block's,
/// 1 the consumers', 2 and 3 their turns').
const PRODUCER_BARRIER: u32 = 4;
/// Registers a producer thread keeps, and a consumer thread rises to (`setmaxnreg`;
/// 128 · 40 + 256 · 232 ≤ 65536).
pub(super) const PRODUCER_REGS: u32 = 40;
pub(super) const CONSUMER_REGS: u32 = 232;
/// The same where the producer gathers rows: it computes their index tiles again, as
/// the consumers' threads would, and writes their row tables (a convolution's im2col
/// rows): 128 · 96 + 256 · 200 ≤ 65536. At 40 the implicit GEMM's producer spilled 76
/// bytes, at 64 12 (with its index tiles computed at every step; NOTES.md c20).
pub(super) const PRODUCER_REGS_GATHER: u32 = 96;
pub(super) const CONSUMER_REGS_GATHER: u32 = 200;
/// Threads of a producer that gathers rows beside two consumer warpgroups: two
/// warpgroups, each thread standing for the one consumer thread whose rows it writes
/// into the tables, at 64 registers, the consumers at 192 (256 · 64 + 256 · 192 =
/// 65536; at 56 the producer spilled 16 bytes). The producer's instruction stream set
/// the pace with one warpgroup (NOTES.md c22); with two, H200, one call, twice each
/// (C64 / C128 / C256 / C512 3 × 3, 1 × 1 stride 2, 3 × 3 stride 2, TFLOP/s):
/// 214.3–215.3 / 334.8–337.3 / 323.1–324.1 / 335.1–337.3 / 235.8–236.8 / 313.9–315.2
/// against 205.5–205.7 / 329.6–330.8 / 323.8–324.3 / 328.2–328.9 / 218.6–219.1 /
/// 309.3–310.4 (NOTES.md c25).
pub(super) const GATHER_PRODUCERS: u32 = 256;
pub(super) const PRODUCER_REGS_GATHER_TWO: u32 = 64;
pub(super) const CONSUMER_REGS_GATHER_TWO: u32 = 192;
/// The same where a loop issues its last dot late (`dot_overlap`: the consumers hold one
/// more dot's operands through the math): 128 · 24 + 256 · 240 ≤ 65536.
pub(super) const PRODUCER_REGS_LATE: u32 = 24;
pub(super) const CONSUMER_REGS_LATE: u32 = 240;
/// Ring stages where shared memory holds them (else 2), when no deeper ring fits beside
/// the stores' area and the scratch's reserve.
pub(super) const STAGES: u32 = 3;
/// The deepest ring a producer warpgroup fills (`operand_ring::MAX_STAGES`).
pub(super) const MAX_STAGES: u32 = super::operand_ring::MAX_STAGES;

/// What the producer computes: the values its loops' bounds and its copies' addresses
/// read (see the module docs).
#[derive(Clone, Debug)]
pub(super) struct WsPlan {
    pub slice: BTreeSet<ValueId>,
    /// The tiles (outside every loop) the producer computes again for its row tables:
    /// the gathered rows' index tiles, in the consumers' layouts ([`Emitter::producer_tables`]).
    pub tile_slice: BTreeSet<ValueId>,
    /// The loops each ring loop's copies walk, outermost first (`operand_ring::ring_nest`):
    /// the producer walks them as nested loops.
    pub nests: BTreeMap<LoopId, Vec<LoopId>>,
    /// The ring loops whose nest the consumers' ring spans too ([`passes_through`]): the
    /// stage counter starts, and a deferred last dot is waited for, outside the nest's
    /// outermost loop (a convolution's accumulator stays in flight across the taps).
    pub spans: BTreeSet<LoopId>,
    /// Some ring load gathers its rows: the producer's threads copy them, from row
    /// tables they write (a counter of its tables, `kf_tt`, runs across the programs
    /// a block walks, before which it is declared).
    pub gathered: bool,
    /// Loops whose dots take turns: the first and the last WGMMA dot of the body.
    pub turns: BTreeMap<LoopId, (OpId, OpId)>,
    /// Per such loop whose last dot only feeds the next iteration (see [`deferrable`]):
    /// that dot does not wait for its instructions; the next iteration's first dot's
    /// wait (or the one after the loop) does, and the ring stage it read is released
    /// there.
    pub deferred: BTreeMap<LoopId, OpId>,
    /// Per deferred loop whose last dot is issued in the next iteration
    /// (`dot_overlap`): that dot.
    pub late: BTreeMap<LoopId, super::dot_overlap::LateDot>,
    /// The ring loads the tensor-memory accelerator copies, each with its tensor map
    /// (`kf_rtm<i>`, a kernel parameter): every ring load, or none (then `cp.async`).
    pub tma: BTreeMap<ValueId, TmaLoad>,
    /// The block walks the programs (see [`Emitter::open_walk`]): at most one block a
    /// multiprocessor is launched, and the producer copies the next program's first
    /// tiles while the consumers finish this one's.
    pub persistent: bool,
    /// A persistent walk over two axes goes in groups along axis 0 ([`grouped_walk`]).
    pub grouped: bool,
    /// Programs of axis 0 a group takes ([`WALK_GROUP`], or `Spec::tiles["GROUPM"]`).
    pub group: u32,
    /// Threads of the consumer warpgroups: 256, or 128 (one warpgroup, which takes no
    /// turns), or 384 ([`WIDE_CONSUMERS`]); the producer's ([`WsPlan::producers`]) follow.
    pub consumers: u32,
    /// Threads of the producer: one warpgroup, or two ([`GATHER_PRODUCERS`]) where it
    /// gathers rows beside two consumer warpgroups.
    pub producers: u32,
    /// Registers a producer thread keeps and a consumer thread rises to (`setmaxnreg`).
    pub regs: (u32, u32),
    /// Ring loops whose loads take two groups of mbarriers ([`ring_splits`]); empty, or
    /// every ring loop.
    pub split: BTreeMap<LoopId, RingSplit>,
}

impl WsPlan {
    /// The `full` (and the `empty`) mbarriers of a ring of `stages` stages: one a stage,
    /// two where the rings are split ([`RingSplit`]).
    pub(super) fn barriers(&self, stages: u32) -> u32 {
        if self.split.is_empty() { stages } else { 2 * stages }
    }
}

/// A ring loop whose loads are copied and released in two groups, each with its own
/// `full` and `empty` mbarrier a stage (the second group's after the first's, stage `s`
/// of group `g` at `g · stages + s`): the loads the body's first dot alone reads, whose
/// stage is released as soon as that dot completes, and the others, read by later
/// dots, released where the whole stage was (flash attention's K and V: the producer
/// copies the next K tiles while `P·V` still reads V). FlashAttention-3 keeps K and V
/// in pipelines of their own likewise (arXiv 2407.08608, §3.1). The wait for the second
/// group stands before its first dot issues: for a late dot (`dot_overlap`), in the next
/// iteration. H200, `kfuse::ops::attention` bf16 S4096 (NOTES.md a27): D256 526 → 622
/// TFLOP/s; D128 (three stages) 564 → 530 with the wait where the late dot's operands
/// are taken, 561 with it at the issue.
#[derive(Clone, Debug)]
pub(super) struct RingSplit {
    /// The first group: the loads the body's first dot reads (no other dot reads them).
    pub first: Vec<ValueId>,
    /// The body's first dot.
    pub first_dot: OpId,
    /// The first dot that reads a load of the second group: the consumers wait for the
    /// group's copies before it.
    pub second_at: OpId,
}

/// The ring loops of a kernel whose rings the producer fills by TMA, each split in two
/// groups (see [`RingSplit`]) where every ring loop splits: its body has two or more
/// WGMMA dots, the loads its first dot reads are read by no other dot, and some load is
/// not read by it. Otherwise none (the mbarriers are the kernel's, shared by sibling
/// loops). A GEMM's loop (one dot) and SwiGLU's (A read by both dots) have none.
fn ring_splits(k: &Kernel, p: &WgPlan, loops: &BTreeMap<ValueId, LoopId>) -> BTreeMap<LoopId, RingSplit> {
    let reads = |d: OpId, v: ValueId| {
        let (dot, t) = (&p.dots[&d], &p.eager[&v]);
        dot.b_tile().off == t.off || dot.a_tile().is_some_and(|a| a.off == t.off)
    };
    let mut out = BTreeMap::new();
    for (l, loads) in &p.rings {
        let dots: Vec<OpId> = k.ops().filter(|op| p.dots.contains_key(op) && loops.get(&op.value()) == Some(l)).collect();
        let Some((&first_dot, rest)) = dots.split_first() else { return BTreeMap::new() };
        let (first, second): (Vec<ValueId>, Vec<ValueId>) = loads.iter().partition(|&&v| reads(first_dot, v));
        let alone = first.iter().all(|&v| rest.iter().all(|&d| !reads(d, v)));
        let Some(&second_at) = rest.iter().find(|&&d| second.iter().any(|&v| reads(d, v))) else { return BTreeMap::new() };
        if first.is_empty() || !alone {
            return BTreeMap::new();
        }
        out.insert(*l, RingSplit { first, first_dot, second_at });
    }
    out
}

/// Programs of axis 0 a persistent walk over two axes takes together, walking axis 1
/// within the group (the matrix path's `group_m`; `GROUPM=n` asks for n): the tiles in flight share their rows
/// of one operand and their columns of the other in L2. H100, the general lowering's
/// bf16 GEMM at 8192³: 683 TFLOP/s at 128x256x64 and 631 at 128x128x128, against 658
/// and 498 walking axis 0 first (NOTES.md l3).
pub(super) const WALK_GROUP: u32 = 8;

/// Whether a warp-specialized kernel walks its programs: it has a grid, the target's
/// multiprocessors are known, and every program does the same work — no ring loop's
/// bounds depend on a program id. Programs of unequal length (a causal attention's
/// loops stop at the diagonal) keep one block each: the hardware hands a free
/// multiprocessor the next block, where a fixed walk would leave the longest programs'
/// blocks running alone at the end (H100, causal flash attention: 426.9 against 437.5
/// TFLOP/s at S4096, 211 against 242 at S1024). A tile staged once outside the loops
/// (flash attention's Q) is staged again each program, after the consumers' barrier
/// that opens it, when every instruction of the program before has completed.
pub(super) fn walks_programs(k: &Kernel, p: &WgPlan, grid: &[crate::target::GridAxisEval], sms: u32) -> bool {
    let even = p.rings.keys().all(|l| k.loop_info(*l).is_some_and(|i| k.operands(i.for_op).iter().take(3).all(|&b| !on_pid(k, b, None))));
    even && !grid.is_empty() && sms > 0
}

/// Whether scalar `v` depends on `program_id(axis)` (any axis for `None`).
fn on_pid(k: &Kernel, v: ValueId, axis: Option<u32>) -> bool {
    crate::passes::persist_programs::closure(k, &[v.op()])
        .into_iter()
        .any(|o| matches!(k.op(o), Op::ProgramId { axis: a } if axis.is_none_or(|x| u32::from(*a) == x)))
}

/// Whether a walk over two or more grid axes goes in groups along axis 0 (the axes
/// past the first two outermost, a batch): some ring tile is the same for every program
/// of an axis-1 index (its address does not depend on `program_id(1)`) and some for
/// every program of an axis-0 index — a GEMM's A and B. Where the tiles all follow axis
/// 1 (flash attention's K and V, per head), the programs of one axis-1 index share them
/// and walk together (axis 0 fastest).
pub(super) fn grouped_walk(k: &Kernel, p: &WgPlan) -> bool {
    let loads: Vec<ValueId> = p.rings.values().flatten().copied().collect();
    let free_of = |axis: u32| loads.iter().any(|&v| k.operands(v.op()).iter().all(|&o| !on_pid(k, o, Some(axis))));
    free_of(0) && free_of(1)
}

/// How the producer copies one ring load with TMA: `atoms` boxes of `rows` rows of `span`
/// bytes (the tile's swizzle atoms, one after another in shared memory), box `a` at the
/// column offset of `a * span` bytes.
#[derive(Clone, Debug)]
pub(super) struct TmaLoad {
    /// The tensor map's index (`kf_rtm<map>`).
    pub map: usize,
    /// The tensor map parameter.
    pub param: crate::target::KernelParam,
    /// Boxes a stage (the tile's swizzle atoms).
    pub atoms: u32,
}

/// The TMA copies of a warp-specialized kernel's ring loads `loads` (all of them, or
/// those that do not gather their rows): every one of them when each can take one,
/// else none. A load can when its tile is exactly its shared-memory tile
/// (rows ≤ 256, whole swizzle atoms) and its tensor has at most 5 dimensions: the
/// copies `ring_load` admits already read 16-byte aligned data with a unit-stride
/// dimension along the tile's columns and the other strides whole 16-byte units, which
/// is what a tensor map needs (its dimensions listed innermost first,
/// `select_mma_path::tma_order`). A box reads zeros outside the tensor, as the
/// `cp.async` copies fill them.
fn tma_loads(k: &Kernel, spec: &crate::target::Spec, p: &WgPlan, loads: &[ValueId]) -> BTreeMap<ValueId, TmaLoad> {
    let mut out = BTreeMap::new();
    for v in loads {
        let t = &p.eager[v];
        let Op::Load { tensor, dims } = k.op(v.op()) else { return BTreeMap::new() };
        let shape = crate::analysis::concrete_shape(k, k.ty(*v));
        let half = t.span_elems();
        if dims.len() > 5 || t.rows > 256 || !t.rows.is_multiple_of(8) || shape.get(t.row_axis) != Some(&t.rows) || shape.get(t.col_axis) != Some(&t.cols) || !t.cols.is_multiple_of(half) {
            return BTreeMap::new();
        }
        let Some((row_dim, unit)) = super::operand_ring::ring_dims(k, spec, *v) else { return BTreeMap::new() };
        let box_dims = (0..dims.len()).map(|d| if d == unit { half } else if d == row_dim { t.rows } else { 1 }).collect();
        let Some(order) = crate::passes::select_mma_path::tma_order(k, spec, v.op()) else { return BTreeMap::new() };
        let param = crate::target::KernelParam::TensorMap { tensor: *tensor, box_dims, swizzle: t.span, order };
        out.insert(*v, TmaLoad { map: out.len(), param, atoms: t.cols / half });
    }
    out
}

/// Whether loop `l`'s last dot `last` may complete while the next iteration starts:
/// its value (or the add it accumulates into) is only yielded, and every use of the
/// carried value that receives it comes after the body's first dot `first` (whose wait
/// then covers it).
fn deferrable(k: &Kernel, l: LoopId, first: OpId, last: OpId) -> bool {
    let info = k.loop_info(l).unwrap();
    let mut v = last.value();
    if let [u] = k.users(v).as_slice() {
        if matches!(k.op(*u), Op::Binary(kfuse_ir::BinaryOp::Add)) {
            v = u.value();
        }
    }
    if k.users(v).as_slice() != [info.yield_op] {
        return false;
    }
    let pos = |op: OpId| k.order.iter().position(|&o| o == op);
    let Some(first_pos) = pos(first) else { return false };
    k.operands(info.yield_op).iter().enumerate().filter(|(_, &o)| o == v).all(|(i, _)| match info.carried_values.get(i).copied().flatten() {
        Some(c) => k.users(c).iter().all(|&u| pos(u).is_some_and(|p| p > first_pos)),
        None => true,
    })
}

/// Whether the kernel's rings run warp-specialized (see the module docs).
/// `overlap`: loops may issue their last dot late (`dot_overlap`; the kernel's first
/// register-room attempts, the next one without: [`Emitter::base_attempt`]).
pub(super) fn ws_plan(k: &Kernel, spec: &crate::target::Spec, p: &WgPlan, threads: u32, overlap: bool) -> Option<WsPlan> {
    if p.rings.is_empty() || !(threads == CONSUMERS || threads == CONSUMERS / 2 || threads == WIDE_CONSUMERS) {
        return None;
    }
    let loops = enclosing_loops(k);
    let mut need = Vec::new();
    // (the gathered rows' index tiles from outside the nests)
    let mut tile_need = Vec::new();
    let mut nests = BTreeMap::new();
    let mut spans = BTreeSet::new();
    for (l, loads) in &p.rings {
        let nest = ring_nest(k, &loops, *l, loads);
        if loops.contains_key(&k.loop_info(nest[0])?.for_op.value()) {
            return None;
        }
        for n in &nest {
            need.extend(k.operands(k.loop_info(*n)?.for_op).iter().take(3).copied());
        }
        for v in loads {
            // (scalar offsets from outside the nest or its indices: a loop that computes
            // its offsets, `k0 = t * BK`, keeps its `cp.async` ring — warp-specialized,
            // ptxas serialized its WGMMA pipeline, C7514)
            for r in scalar_roots(k, *v) {
                if matches!(k.op(r.op()), Op::LoopIndex { id } if nest.contains(id)) {
                    continue;
                }
                if inside(k, &loops, r, nest[0]) {
                    return None;
                }
                need.push(r);
            }
            for r in gathered_roots(k, *v) {
                tile_need.extend(from_outside(k, &loops, r, &nest)?);
            }
        }
        if nest.len() > 1 && passes_through(k, &nest) {
            spans.insert(*l);
        }
        nests.insert(*l, nest);
    }
    let mut tile_slice = BTreeSet::new();
    while let Some(v) = tile_need.pop() {
        if k.ty(v).is_scalar() {
            need.push(v);
            continue;
        }
        if !tile_slice.insert(v) {
            continue;
        }
        // (elementwise math on iotas and scalars: no value the producer's threads would
        // have to exchange)
        let pure = matches!(k.op(v.op()), Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Broadcast | Op::ExpandDims { .. } | Op::Const { .. } | Op::Iota { .. });
        if loops.contains_key(&v) || !pure {
            return None;
        }
        tile_need.extend(k.operands(v.op()));
    }
    let mut slice = BTreeSet::new();
    while let Some(v) = need.pop() {
        if !slice.insert(v) {
            continue;
        }
        if loops.contains_key(&v) || !k.ty(v).is_scalar() {
            return None;
        }
        need.extend(k.operands(v.op()));
    }
    let mut turns = BTreeMap::new();
    let mut deferred = BTreeMap::new();
    let mut late = BTreeMap::new();
    // a tile the consumers write from registers in the loop itself (an operand no copy
    // reads) is written again next iteration: the dots reading it complete first, so
    // their waits are not deferred
    let rewritten = |l: &LoopId| p.eager.iter().any(|(v, t)| t.ring.is_none() && loops.get(v) == Some(l));
    // (three warpgroups: every dot where it stands, see WIDE_CONSUMERS)
    for l in p.rings.keys().filter(|_| threads != WIDE_CONSUMERS) {
        let dots: Vec<OpId> = k.ops().filter(|op| p.dots.contains_key(op) && loops.get(&op.value()) == Some(l)).collect();
        if dots.len() >= 2 {
            let (first, last) = (dots[0], dots[dots.len() - 1]);
            // (turns alternate two warpgroups, so that one's math on tiles runs while the
            // other's dots do: a body of dots and their accumulating adds has none)
            if threads == CONSUMERS && tile_math_in(k, *l) {
                turns.insert(*l, (first, last));
            }
            if deferrable(k, *l, first, last) && !rewritten(l) {
                deferred.insert(*l, last);
                if let Some(d) = super::dot_overlap::late_dot(k, p, *l, first, last).filter(|_| overlap) {
                    late.insert(*l, d);
                }
            }
        } else if let [d] = dots[..] {
            if deferrable(k, *l, d, d) && !rewritten(l) {
                deferred.insert(*l, d);
            }
        }
    }
    super::dot_overlap::chain_loops(k, p, &mut late);
    // (TMA copies boxes: gathered rows are copied by the producer's threads)
    let gathered = p.rings.values().flatten().any(|&v| !gathered_roots(k, v).is_empty());
    // (rows gathered beside two consumer warpgroups: two producer warpgroups, where no
    // WGMMA instruction holds more than 64 accumulators a thread — the 512-thread block's
    // launch bound leaves ptxas 128 registers for one instruction's operands)
    let narrow = p.dots.values().all(|d| d.n <= 128);
    let producers = if gathered && late.is_empty() && threads == CONSUMERS && narrow { GATHER_PRODUCERS } else { PRODUCER_THREADS };
    let regs = if threads == WIDE_CONSUMERS {
        (PRODUCER_REGS_WIDE, CONSUMER_REGS_WIDE)
    } else if producers == GATHER_PRODUCERS {
        (PRODUCER_REGS_GATHER_TWO, CONSUMER_REGS_GATHER_TWO)
    } else if gathered && late.is_empty() {
        (PRODUCER_REGS_GATHER, CONSUMER_REGS_GATHER)
    } else if late.is_empty() {
        (PRODUCER_REGS, CONSUMER_REGS)
    } else {
        (PRODUCER_REGS_LATE, CONSUMER_REGS_LATE)
    };
    // (gathered rows are copied by the producer's threads, the other tiles by TMA where
    // they can be)
    let boxes: Vec<ValueId> = p.rings.values().flatten().copied().filter(|&v| gathered_roots(k, v).is_empty()).collect();
    let tma = tma_loads(k, spec, p, &boxes);
    // (the split's groups complete on TMA's byte counts, one arrival a phase)
    let split = if tma.is_empty() || gathered { BTreeMap::new() } else { ring_splits(k, p, &loops) };
    Some(WsPlan { slice, tile_slice, nests, spans, gathered, turns, deferred, late, tma, persistent: false, grouped: false, group: spec.tiles.get("GROUPM").map_or(WALK_GROUP, |&g| g.clamp(1, 64)), consumers: threads, producers, regs, split })
}

/// The values from outside `nest` that a ring load's address root `r` is computed from:
/// `r` itself, or the operands of the arithmetic in the nest that computes it
/// (`nest_closure`), none for one of the nest's indices; `None` where something else
/// computes it.
fn from_outside(k: &Kernel, loops: &BTreeMap<ValueId, LoopId>, r: ValueId, nest: &[LoopId]) -> Option<Vec<ValueId>> {
    if matches!(k.op(r.op()), Op::LoopIndex { id } if nest.contains(id)) {
        return Some(vec![]);
    }
    let closure = nest_closure(k, loops, r, nest)?;
    if closure.is_empty() {
        return Some(vec![r]);
    }
    let index = |v: &ValueId| matches!(k.op(v.op()), Op::LoopIndex { id } if nest.contains(id));
    Some(closure.iter().flat_map(|&o| k.operands(o)).filter(|v| !index(v) && !closure.contains(&v.op())).collect())
}

/// Whether every value a loop of `nest` carries only passes through the loops around
/// it: each loop's results are yielded by the loop around it and nothing else, whose
/// carried values are read only as the inner loop's initial values. A dot left in
/// flight at the inner loop's end is then read by nothing before the inner loop's next
/// iteration waits for it.
fn passes_through(k: &Kernel, nest: &[LoopId]) -> bool {
    nest.windows(2).all(|w| {
        let (Some(outer), Some(inner)) = (k.loop_info(w[0]), k.loop_info(w[1])) else { return false };
        let results = inner.results.iter().flatten().all(|&r| k.users(r).iter().all(|&u| u == outer.yield_op));
        let carried = outer.carried_values.iter().flatten().all(|&c| k.users(c).iter().all(|&u| u == inner.for_op));
        results && carried
    })
}

/// Whether loop `l`'s body computes on tiles other than by its dots and the adds that
/// accumulate them: math (`exp`, casts, selects …) or reductions, flash attention's
/// softmax.
fn tile_math_in(k: &Kernel, l: LoopId) -> bool {
    k.ops().filter(|&o| k.loop_of(o) == Some(l)).any(|o| {
        let tile = k.node(o).ty.as_ref().is_some_and(|t| !t.is_scalar());
        let accumulating = matches!(k.op(o), Op::Binary(kfuse_ir::BinaryOp::Add)) && k.operands(o).iter().any(|v| matches!(k.op(v.op()), Op::Dot { .. }));
        tile && !accumulating && !matches!(k.op(o), Op::Dot { .. } | Op::Load { .. } | Op::LoopCarried { .. } | Op::Permute { .. })
    })
}

/// The plan's line for a warp-specialized kernel.
pub(super) fn note(ws: &WsPlan) -> String {
    let turns = if ws.turns.is_empty() { String::new() } else { format!("; the consumers take turns at the tensor cores in {} loop(s)", ws.turns.len()) };
    let copies = match (ws.tma.is_empty(), ws.gathered) {
        (true, _) => "cp.async",
        (false, true) => "gathered rows by cp.async, the other tiles by TMA",
        (false, false) => "TMA",
    };
    let walk = match (ws.persistent, ws.grouped) {
        (false, _) => String::new(),
        (true, true) => format!("; each block walks programs (in groups of {} along grid axis 0, axis 1 within a group)", ws.group),
        (true, false) => "; each block walks programs (grid axis 0 fastest)".to_string(),
    };
    let late = if ws.late.is_empty() { String::new() } else { format!("; in {} loop(s) the last dot is issued in the next iteration, after its first, and runs under the math between", ws.late.len()) };
    let n = ws.consumers / 128;
    let wgs = if n == 1 { "1 consumer warpgroup".to_string() } else { format!("{n} consumer warpgroups") };
    let split = if ws.split.is_empty() {
        String::new()
    } else {
        format!("; in {} loop(s) the tiles the first dot alone reads have mbarriers of their own and are released once it completes", ws.split.len())
    };
    let producer = if ws.producers == PRODUCER_THREADS { "a producer warpgroup" } else { "two producer warpgroups" };
    format!("rings filled by {producer} ({copies}, mbarriers; {} registers), {wgs} ({} registers){turns}{late}{split}{walk}", ws.regs.0, ws.regs.1)
}

/// The mbarrier and named-barrier helpers of a warp-specialized kernel (the mbarrier
/// ones take a barrier's shared-memory address, `MBARRIER_HELPERS`); the named barriers
/// take the `consumers` threads.
pub(super) fn ws_prelude(consumers: u32) -> String {
    let mbar = crate::cuda::MBARRIER_HELPERS;
    format!(
        r#"{mbar}static __device__ __forceinline__ void kf_cp_async_arrive(unsigned a) {{ asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(a) : "memory"); }}
static __device__ __forceinline__ void kf_bar_sync(int id) {{ asm volatile("bar.sync %0, {consumers};" :: "r"(id) : "memory"); }}
static __device__ __forceinline__ void kf_bar_arrive(int id) {{ asm volatile("bar.arrive %0, {consumers};" :: "r"(id) : "memory"); }}
"#
    )
}

/// Whether a warp-specialized kernel's first register-room attempt takes the shared
/// addresses it uses in its loops once — the mbarriers' (`KF_FULL`, `KF_EMPTY`) and the
/// operand tiles' (`kf_ops_sa`, [`SmemTile::addr`](super::dot_wgmma::SmemTile::addr))
/// — its next attempts at each use. ptxas computes a shared variable's address from the
/// block's rank in its cluster (`S2UR SR_CgaCtaId`) wherever it is used, once an
/// iteration at a loop's head before its first wait; taken once (an `asm volatile`
/// copy it cannot recompute) the address is a register. H200, `kfuse::ops::attention`,
/// one call, this form measured as a prototype with every such kernel on it: D128 S4096 / S16384 592.0 / 642.2 → 606.1 / 657.9 TFLOP/s, D256 621.6 /
/// 666.8 → 628.9 / 676.1, GQA 601.6 → 617.1; the GEMM and `conv2d` equal (NOTES.md a32).
/// The registers they take cost `attention_varlen` D128 its late `P·V` (a spill: the
/// next attempt) and every block of three consumer warpgroups (160 registers, flash
/// attention's 192-row tiles at D64) a spill, so those take them at each use.
pub(super) fn takes_addresses_once(k: &Kernel) -> bool {
    k.schedule.num_threads != WIDE_CONSUMERS
}

/// Register-room attempt `attempt` of a kernel counted as the kernel without the shared
/// addresses taken once: where it takes them `once`, its attempt 0 does and each later
/// one is the attempt before it without ([`takes_addresses_once`]).
pub(super) fn attempt_without_once(attempt: u32, once: bool) -> u32 {
    attempt - u32::from(once && attempt > 0)
}

/// The kernel's start where the roles part (see the module docs): the mbarriers (`bars`
/// of each kind, [`WsPlan::barriers`]), then the producer's program `producer` and its
/// exit. `KF_FULL(i)` and `KF_EMPTY(i)` give slot `i`'s address: with `once`, from the
/// arrays' addresses taken once (`kf_full_sa`, `kf_empty_sa`, plus the slot's 8 bytes),
/// else taken at that use.
pub(super) fn split_roles(w: &mut Writer<String>, producer: &str, bars: u32, ws: &WsPlan, regs: (u32, u32), once: bool) -> std::fmt::Result {
    let consumers = ws.consumers;
    // one thread issues every copy where TMA makes them all
    let tma = !ws.tma.is_empty() && !ws.gathered;
    w.line(format!("__shared__ __align__(8) unsigned long long kf_full[{bars}], kf_empty[{bars}];"))?;
    if !once {
        // (taken at each use: `takes_addresses_once`)
        w.line("#define KF_FULL(i) kf_saddr(&kf_full[i])")?;
        w.line("#define KF_EMPTY(i) kf_saddr(&kf_empty[i])")?;
    } else {
        w.line("const unsigned kf_full_sa = kf_saddr_once(kf_full), kf_empty_sa = kf_saddr_once(kf_empty);")?;
        w.line("#define KF_FULL(i) (kf_full_sa + 8u * (i))")?;
        w.line("#define KF_EMPTY(i) (kf_empty_sa + 8u * (i))")?;
    }
    w.open("if (kf_tid == 0)")?;
    // TMA: one arrival (with the stage's bytes) a phase; cp.async: each producer thread's;
    // gathered rows by cp.async beside TMA boxes: both
    let fill = match (ws.tma.is_empty(), ws.gathered) {
        (false, false) => 1,
        (true, _) => ws.producers,
        (false, true) => ws.producers + 1,
    };
    w.line(format!("for (int s = 0; s < {bars}; ++s) {{ kf_mbar_init(KF_FULL(s), {fill}); kf_mbar_init(KF_EMPTY(s), {consumers}); }}"))?;
    w.close()?;
    w.line("__syncthreads();")?;
    w.open(format!("if (kf_tid >= {consumers})"))?;
    w.line(format!("asm volatile(\"setmaxnreg.dec.sync.aligned.u32 {};\");", regs.0))?;
    if tma {
        // one thread issues every copy
        w.open(format!("if (kf_tid == {consumers})"))?;
    }
    w.line("unsigned kf_rit = 0;")?;
    w.raw(producer)?;
    if tma {
        w.close()?;
    }
    w.line("return;")?;
    w.close()?;
    w.line(format!("asm volatile(\"setmaxnreg.inc.sync.aligned.u32 {};\");", regs.1))?;
    w.line("unsigned kf_rit = 0;")
}

/// The tensor-map type (the driver's 128-byte opaque `CUtensorMap`, declared here so that
/// no header is needed) and TMA tile loads of 2 to 5 dimensions (a ring tile's two and
/// the tensor's indexed ones) completing on an mbarrier,
/// for a producer that copies with TMA.
pub(super) const TMA_PRELUDE: &str = r#"struct __align__(64) CUtensorMap { unsigned long long opaque[16]; };
static __device__ __forceinline__ void kf_tma_load_2d(void* d, const CUtensorMap* m, int c0, int c1, unsigned long long* b) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" :: "r"(kf_saddr(d)), "l"(m), "r"(c0), "r"(c1), "r"(kf_saddr(b)) : "memory");
}
static __device__ __forceinline__ void kf_tma_load_3d(void* d, const CUtensorMap* m, int c0, int c1, int c2, unsigned long long* b) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" :: "r"(kf_saddr(d)), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(kf_saddr(b)) : "memory");
}
static __device__ __forceinline__ void kf_tma_load_4d(void* d, const CUtensorMap* m, int c0, int c1, int c2, int c3, unsigned long long* b) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" :: "r"(kf_saddr(d)), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(kf_saddr(b)) : "memory");
}
static __device__ __forceinline__ void kf_tma_load_5d(void* d, const CUtensorMap* m, int c0, int c1, int c2, int c3, int c4, unsigned long long* b) {
  asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];" :: "r"(kf_saddr(d)), "l"(m), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(kf_saddr(b)) : "memory");
}
"#;

/// The consumers' block barrier.
pub(super) const CONSUMER_BARRIER: &str = "kf_bar_sync(1);";

impl Emitter<'_> {
    /// The producer's program (see the module docs): the sliced scalars, then each ring
    /// loop's copies, walking its nest.
    pub(super) fn producer_program(&mut self) -> R {
        let ws = self.ws.clone().expect("a warp-specialized plan");
        let rings = self.wg.as_ref().unwrap().rings.clone();
        let k = self.k;
        for op in k.ops() {
            if ws.slice.contains(&op.value()) {
                self.op(op)?;
                continue;
            }
            let Op::For { id, .. } = k.op(op) else { continue };
            let Some((&l, nest)) = ws.nests.iter().find(|(_, n)| n[0] == *id) else { continue };
            let loads = &rings[&l];
            let stages = self.wg.as_ref().unwrap().stages;
            let gathered = self.ring_gather_tables(loads, stages)?;
            // (each consumer half's index tiles from outside the loops, once a program)
            let halves = if gathered { self.producer_index_tiles(l, nest)? } else { vec![] };
            // the nest's loops, the innermost's index `kf_p`, the others' `kf_p<level>`
            let idx = |i: usize| if i + 1 == nest.len() { "kf_p".to_string() } else { format!("kf_p{i}") };
            let binds: Vec<(LoopId, String)> = nest.iter().enumerate().map(|(i, &n)| (n, idx(i))).collect();
            // rows that only the outer loops move are written once for the innermost
            // loop's steps, into one of two tables (`producer_tables`)
            let inner = *nest.last().unwrap();
            let reads_inner = |o: &kfuse_ir::OpId| k.operands(*o).iter().any(|v| matches!(k.op(v.op()), Op::LoopIndex { id } if *id == inner));
            let outer_rows = gathered && nest.len() > 1 && !self.ring_closure(l, nest, gathered_roots).iter().any(reads_inner);
            for (i, (lo, hi, step)) in self.nest_bounds(nest).into_iter().enumerate() {
                if outer_rows && i + 1 == nest.len() {
                    self.table_slot = Some("kf_t".into());
                    self.line("const int kf_t = kf_tt++ & 1;")?;
                    self.producer_tables(l, nest, &binds, &halves)?;
                }
                let p = idx(i);
                // one thread issuing a step's TMA copies gains nothing from an unrolled
                // loop, which NVRTC makes of it (seven steps, 35 copies, for the 4096³
                // bf16 GEMM: 1024 SASS instructions against 616 rolled)
                if !(ws.tma.is_empty() || ws.gathered) {
                    self.line("#pragma unroll 1")?;
                }
                self.open(format!("for (long long {p} = {lo}; {p} < {hi}; {p} += {step})"))?;
            }
            self.line(format!("const int kf_s = kf_rit % {stages};"))?;
            if ws.tma.is_empty() || ws.gathered {
                self.line(format!("kf_mbar_wait(KF_EMPTY(kf_s), ((kf_rit / {stages}) & 1) ^ 1);"))?;
                if gathered && !outer_rows {
                    self.producer_tables(l, nest, &binds, &halves)?;
                }
                let (boxes, rows): (Vec<ValueId>, Vec<ValueId>) = loads.iter().partition(|v| ws.tma.contains_key(v));
                self.at_producer_step(l, nest, &binds, |e| {
                    if !boxes.is_empty() {
                        // the boxes by one thread, its arrival announcing their bytes
                        e.open(format!("if (kf_tid == {})", ws.consumers))?;
                        let bytes: u32 = boxes.iter().map(|v| &e.wg.as_ref().unwrap().eager[v]).map(|t| t.rows * t.cols * t.esize).sum();
                        e.line(format!("kf_mbar_expect_tx(KF_FULL(kf_s), {bytes}u);"))?;
                        boxes.iter().try_for_each(|v| e.ring_tma(*v, l, &ws.tma[v], "kf_s"))?;
                        e.close()?;
                    }
                    rows.iter().try_for_each(|v| e.ring_copy(*v, l, "kf_p", "kf_s"))
                })?;
                self.line("kf_cp_async_arrive(KF_FULL(kf_s));")?;
            } else {
                // one group, or two (the first dot's tiles first: `RingSplit`)
                let groups: Vec<(String, Vec<ValueId>)> = match ws.split.get(&l) {
                    Some(sp) => vec![("kf_s".into(), sp.first.clone()), (format!("{stages} + kf_s"), loads.iter().filter(|v| !sp.first.contains(v)).copied().collect())],
                    None => vec![("kf_s".into(), loads.clone())],
                };
                for (slot, group) in groups {
                    self.line(format!("kf_mbar_wait(KF_EMPTY({slot}), ((kf_rit / {stages}) & 1) ^ 1);"))?;
                    let bytes: u32 = group.iter().map(|v| &self.wg.as_ref().unwrap().eager[v]).map(|t| t.rows * t.cols * t.esize).sum();
                    self.line(format!("kf_mbar_expect_tx(KF_FULL({slot}), {bytes}u);"))?;
                    self.at_producer_step(l, nest, &binds, |e| group.iter().try_for_each(|v| e.ring_tma(*v, l, &ws.tma[v], &slot)))?;
                }
            }
            self.line("++kf_rit;")?;
            self.table_slot = None;
            for _ in nest {
                self.close()?;
            }
        }
        Ok(())
    }

    /// The producer's copies of one step (`body`), the scalar addresses computed in ring
    /// loop `l`'s nest written again first, the nest's indices bound to `binds` (in a
    /// block of their own; none where there are none).
    fn at_producer_step(&mut self, l: LoopId, nest: &[LoopId], binds: &[(LoopId, String)], body: impl FnOnce(&mut Self) -> R) -> R {
        let closure = self.ring_closure(l, nest, scalar_roots);
        if closure.is_empty() && nest.len() == 1 {
            return body(self);
        }
        self.open("")?;
        let saved = self.bind_closure(binds, &closure)?;
        body(self)?;
        self.restore(saved);
        self.close()
    }

    /// The index tiles from outside the loops that ring loop `l`'s row tables read
    /// ([`WsPlan::tile_slice`]), computed by each producer thread as consumer threads
    /// `t`, `t + 128`, … would (the block's thread, warp and lane names shadowed: the
    /// tiles are in the consumers' layouts), each into registers of its own
    /// (`kf_h<half>_<value>`); per half, those values under their new names.
    fn producer_index_tiles(&mut self, l: LoopId, nest: &[LoopId]) -> Result<Vec<Vec<(ValueId, Val)>>, crate::CodegenError> {
        let ws = self.ws.clone().unwrap();
        let k = self.k;
        let closure = self.ring_closure(l, nest, gathered_roots);
        let roots: BTreeSet<ValueId> = self.wg.as_ref().unwrap().rings[&l].iter().flat_map(|&v| gathered_roots(k, v)).collect();
        let read = |v: &ValueId| roots.contains(v) || closure.iter().any(|&o| k.operands(o).contains(v));
        let frontier: Vec<ValueId> = ws.tile_slice.iter().copied().filter(read).collect();
        let mut ops: Vec<kfuse_ir::OpId> = ws.tile_slice.iter().map(|v| v.op()).collect();
        ops.sort_by_key(|&o| k.position(o));
        let mut halves = Vec::new();
        for h in 0..ws.consumers / ws.producers {
            let mut names = Vec::new();
            for &f in &frontier {
                // (registers a thread, or none for a tile every thread holds whole)
                let regs = crate::layout::RegMap::of(&self.layout(f)?).map(|m| m.regs);
                let name = format!("kf_h{h}_v{}", f.index());
                let dims = regs.map_or(String::new(), |r| format!("[{r}]"));
                self.line(format!("{} {name}{dims};", super::ctype(k.ty(f).dtype)))?;
                names.push((f, name, regs));
            }
            self.open_as_consumer(h, &ws)?;
            let saved = self.bind_closure(&[], &ops)?;
            let mut vals = Vec::new();
            for (f, name, regs) in names {
                match regs {
                    Some(r) => {
                        self.unroll("k", r)?;
                        self.line(format!("{name}[k] = {};", self.reg(f, "k")))?;
                        self.close()?;
                    }
                    None => self.line(format!("{name} = {};", self.reg(f, "0")))?,
                }
                let mut val = self.val(f).clone();
                (val.name, val.lazy) = (name, None);
                vals.push((f, val));
            }
            self.restore(saved);
            self.close()?;
            self.close()?;
            halves.push(vals);
        }
        Ok(halves)
    }

    /// Opens two blocks in which the producer's thread is consumer thread `t + 128 ·
    /// half` (`t` its place in the producer warpgroup): `kf_tid`, `kf_warp` and `kf_lane`
    /// shadowed.
    fn open_as_consumer(&mut self, half: u32, ws: &WsPlan) -> R {
        self.open("")?;
        self.line(format!("const int kf_vt = kf_tid - {} + {};", ws.consumers, half * ws.producers))?;
        self.open("")?;
        self.line("const int kf_tid = kf_vt, kf_warp = kf_vt >> 5, kf_lane = kf_vt & 31;")?;
        self.line("(void)kf_tid; (void)kf_warp; (void)kf_lane;")
    }

    /// The producer's row tables of ring loop `l`'s gathered loads for the step at
    /// `binds` (into the tables of stage `kf_s`), then a barrier of the producer's
    /// threads before the copies read them: for each consumer half, the nest's
    /// arithmetic on that half's index tiles (`halves`, [`Emitter::producer_index_tiles`]).
    /// A stage's table is written again `stages` steps later, after that many of these
    /// barriers: every thread has read it by then.
    fn producer_tables(&mut self, l: LoopId, nest: &[LoopId], binds: &[(LoopId, String)], halves: &[Vec<(ValueId, Val)>]) -> R {
        let ws = self.ws.clone().unwrap();
        let loads = self.wg.as_ref().unwrap().rings[&l].clone();
        let closure = self.ring_closure(l, nest, gathered_roots);
        for (h, vals) in halves.iter().enumerate() {
            self.open_as_consumer(h as u32, &ws)?;
            let mut saved: Vec<(ValueId, Option<Val>)> = vals.iter().map(|(v, val)| (*v, self.vals.insert(*v, val.clone()))).collect();
            saved.extend(self.bind_closure(binds, &closure)?);
            let table = self.table_slot.clone().unwrap_or_else(|| "kf_s".into());
            self.write_gather_tables(&loads, &table)?;
            self.restore(saved);
            self.close()?;
            self.close()?;
        }
        self.line(format!("asm volatile(\"bar.sync {PRODUCER_BARRIER}, {};\" ::: \"memory\");", ws.producers))
    }

    /// Before WGMMA dot `op` issues: a warpgroup whose turn it opens waits for it.
    ///
    /// Warpgroup 0 waits on barrier 2 before each iteration's last dot; warpgroup 1 on
    /// barrier 3 before the loop's first dot and before each iteration's last dot but
    /// the loop's last; each arrives on the other's barrier after each iteration's first
    /// dot. Every arrival is thus consumed before its warpgroup arrives again, across
    /// loops too (an arrival that found its barrier's earlier one not yet consumed would
    /// complete that barrier by itself).
    pub(super) fn turn_before(&mut self, op: OpId) -> R {
        let Some((l, (first, last))) = self.turn_of(op) else { return Ok(()) };
        if self.ws.as_ref().unwrap().late.contains_key(&l) {
            return if op == first { self.late_turn_before(l) } else { Ok(()) };
        }
        let iv = super::loops::index_var(l);
        let ops = self.k.operands(self.k.loop_info(l).unwrap().for_op);
        let (lo, hi, step) = (self.val(ops[0]).name.clone(), self.val(ops[1]).name.clone(), self.val(ops[2]).name.clone());
        if op == first {
            // the loop's first turn: warpgroup 0 goes first
            self.line(format!("if ({iv} == {lo} && kf_wg == 1) kf_bar_sync(3);"))?;
        }
        if op == last {
            self.line(format!("if (kf_wg == 0 || ({hi}) - {iv} > ({step})) kf_bar_sync(2 + kf_wg);"))?;
        }
        Ok(())
    }

    /// After WGMMA dot `op` issued (before its wait): the turn passes to the other
    /// warpgroup after an iteration's first dot (see [`Self::turn_before`]).
    pub(super) fn turn_after(&mut self, op: OpId) -> R {
        match self.turn_of(op) {
            Some((l, (first, _))) if first == op && self.ws.as_ref().unwrap().late.contains_key(&l) => self.late_turn_after(l),
            Some((_, (first, _))) if first == op => self.line("kf_bar_arrive(3 - kf_wg);"),
            _ => Ok(()),
        }
    }

    /// After WGMMA dot `op` issued and its turn passed: its wait, unless deferred (see
    /// [`WsPlan::deferred`]); after a loop's first dot, the release of the stage whose
    /// last dot's wait was deferred to it.
    pub(super) fn ws_dot_wait(&mut self, op: OpId) -> R {
        let ws = self.ws.clone().unwrap();
        if self.late_first_of(op).is_some() {
            // the late dot of the iteration before stays in flight (`dot_overlap`)
            self.line("kf_wg_wait1();")?;
            return self.release_first_group(op);
        }
        if let Some((l, _)) = ws.deferred.iter().find(|(l, &d)| d == op && !ws.turns.contains_key(l)) {
            // the loop's one dot, chained onto its own accumulator: the instructions of
            // the iteration before have completed once at most this group is pending
            self.line("kf_wg_wait1();")?;
            return self.line(format!("if (kf_rel{0} >= 0) kf_mbar_arrive(KF_EMPTY({1}));", l.0, self.rel_slot(*l, &format!("kf_rel{}", l.0))));
        }
        if ws.deferred.values().any(|&d| d == op) {
            return Ok(());
        }
        self.line("kf_wg_wait();")?;
        if let Some((l, _)) = ws.turns.iter().find(|(l, (f, _))| *f == op && ws.deferred.contains_key(l)) {
            self.line(format!("if (kf_rel{0} >= 0) kf_mbar_arrive(KF_EMPTY({1}));", l.0, self.rel_slot(*l, &format!("kf_rel{}", l.0))))?;
        }
        self.release_first_group(op)
    }

    /// After the wait of a split loop's first dot (see [`RingSplit`]): the stage of the
    /// tiles it alone reads is free.
    fn release_first_group(&mut self, op: OpId) -> R {
        match self.ws.as_ref().and_then(|ws| ws.split.iter().find(|(_, sp)| sp.first_dot == op)).map(|(l, _)| *l) {
            Some(l) => self.line(format!("kf_mbar_arrive(KF_EMPTY(kf_st{}));", l.0)),
            None => Ok(()),
        }
    }

    /// Before dot `op` where it is the first to read a split loop's second group (see
    /// [`RingSplit`]): the wait for that group's copies of this iteration.
    pub(super) fn second_group_wait(&mut self, op: OpId) -> R {
        if self.late_dot_of(op).is_some() {
            // (issued in the next iteration, which waits: `dot_overlap`)
            return Ok(());
        }
        let Some(l) = self.ws.as_ref().and_then(|ws| ws.split.iter().find(|(_, sp)| sp.second_at == op)).map(|(l, _)| *l) else { return Ok(()) };
        let stages = self.wg.as_ref().unwrap().stages;
        self.line(format!("kf_mbar_wait(KF_FULL({stages} + kf_st{0}), (kf_rit / {stages}) & 1);", l.0))
    }

    /// The `empty` mbarrier index of loop `l`'s stage `stage` for the release at the end
    /// of an iteration's dots: the second group's where the loop is split.
    pub(super) fn rel_slot(&self, l: LoopId, stage: &str) -> String {
        match self.ws.as_ref().is_some_and(|ws| ws.split.contains_key(&l)) {
            true => format!("{} + {stage}", self.wg.as_ref().unwrap().stages),
            false => stage.to_string(),
        }
    }

    /// At the end of ring loop `l`'s body: its stage is released now, or (a deferred
    /// last dot) after the next wait.
    pub(super) fn ws_release(&mut self, l: LoopId) -> R {
        if self.ws.as_ref().unwrap().deferred.contains_key(&l) {
            self.line(format!("kf_rel{0} = kf_st{0};", l.0))
        } else {
            // every dot of the iteration has completed: the stage is free
            self.line(format!("kf_mbar_arrive(KF_EMPTY({}));", self.rel_slot(l, &format!("kf_st{}", l.0))))
        }
    }

    /// After loop `id` closes: a deferred last dot's wait and release, of the ring loop
    /// whose nest it closes (a ring loop in a longer nest leaves its last dot in flight
    /// into the next iteration of the loops around it: its accumulator only passes
    /// through them).
    pub(super) fn ws_after_loop(&mut self, id: LoopId) -> R {
        let Some(ws) = self.ws.as_ref() else { return Ok(()) };
        let l = match ws.spans.iter().find(|l| ws.nests[l][0] == id) {
            Some(&l) => l,
            None if ws.spans.contains(&id) => return Ok(()),
            None => id,
        };
        if self.late_flush(l)? {
            return Ok(());
        }
        if self.ws.as_ref().is_some_and(|ws| ws.deferred.contains_key(&l)) {
            self.line("kf_wg_wait();")?;
            self.line(format!("if (kf_rel{0} >= 0) kf_mbar_arrive(KF_EMPTY({1}));", l.0, self.rel_slot(l, &format!("kf_rel{}", l.0))))?;
        }
        Ok(())
    }

    /// The producer's TMA copies of ring load `v` (loop `l`, index `kf_p`) into stage
    /// `kf_s`, completing on the `full` mbarrier at `slot`: one box a swizzle atom,
    /// coordinates innermost first.
    fn ring_tma(&mut self, v: ValueId, l: LoopId, t: &TmaLoad, slot: &str) -> R {
        let tile = self.wg.as_ref().unwrap().eager[&v].clone();
        let k = self.k;
        let ops = k.operands(v.op());
        let name = |o: ValueId| if matches!(k.op(o.op()), Op::LoopIndex { id } if *id == l) { "kf_p".to_string() } else { self.val(o).name.clone() };
        let offs: Vec<String> = ops.iter().map(|&o| name(o)).collect();
        let r = offs.len();
        let crate::target::KernelParam::TensorMap { order, .. } = &t.param else { unreachable!() };
        let unit = order[0] as usize;
        for a in 0..t.atoms {
            let mut coords = vec![format!("(int)({}) + {}", offs[unit], a * tile.span_elems())];
            coords.extend(order[1..].iter().map(|&d| format!("(int)({})", offs[d as usize])));
            let dst = format!("kf_ops + {} + kf_s * {} + {}", tile.off, tile.bytes(), a * tile.rows * tile.span);
            self.line(format!("kf_tma_load_{r}d({dst}, &kf_rtm{}, {}, &kf_full[{slot}]);", t.map, coords.join(", ")))?;
        }
        Ok(())
    }

    /// Opens a persistent block's walk over the programs (both roles walk alike, the
    /// ring's iteration counter running on across programs): `kf_pid` from `blockIdx.x`
    /// in steps of the grid, the program ids decoded from it — over two axes in groups
    /// of [`WALK_GROUP`] along axis 0, else axis 0 fastest — and taken for the kernel's
    /// `program_id`s. The consumers meet at their barrier first: the
    /// shared scratch of the program before is free.
    pub(super) fn open_walk(&mut self, grid: &[crate::target::GridAxisEval]) -> R {
        // (`it`: the decoding's integer type and its literals' suffix; a producer
        // decoding three axes in 32 bits spilled 32 bytes in its 40 registers,
        // `gemm_batched_scaled` f16 → f32 at 128 × 256: it keeps 64 bits)
        let narrow = (!self.producer || grid.len() <= 2) && self.narrow_walk(grid);
        let (it, sfx) = if narrow { ("unsigned", "u") } else { ("long long", "LL") };
        // (the program within its problem: the walk's own index, or in a grouped launch
        // its place after the problem's first program)
        let p = if self.k.schedule.grouped {
            self.open_grouped_walk(grid.len())?;
            "kf_wl"
        } else {
            let counts: Vec<String> = grid
                .iter()
                .map(|g| match g.step {
                    1 => self.shape_var(g.dim),
                    t => format!("(({} + {}LL) / {t}LL)", self.shape_var(g.dim), t - 1),
                })
                .collect();
            for (a, c) in counts.iter().enumerate() {
                let cast = if narrow { "(unsigned)" } else { "" };
                self.line(format!("const {it} kf_wn{a} = {cast}{c};"))?;
            }
            let wide = if narrow { "(long long)" } else { "" };
            let total: Vec<String> = (0..counts.len()).map(|a| format!("{wide}kf_wn{a}")).collect();
            self.line(format!("const long long kf_wprogs = {};", total.join(" * ")))?;
            self.open("for (long long kf_pid = blockIdx.x; kf_pid < kf_wprogs; kf_pid += gridDim.x)")?;
            if !self.producer {
                self.line(CONSUMER_BARRIER)?;
            }
            if narrow {
                self.line("const unsigned kf_wi = (unsigned)kf_pid;")?;
                "kf_wi"
            } else {
                "kf_pid"
            }
        };
        let axes = grid.len();
        let mut pids = Vec::new();
        if axes >= 2 && self.ws.as_ref().is_some_and(|ws| ws.grouped) {
            // groups along axis 0, axis 1 walked within a group; the further axes (a
            // batch) outermost, axis 2 fastest among them
            let g = self.ws.as_ref().unwrap().group;
            // (the program's place in its plane of axes 0 and 1)
            let q = if axes > 2 {
                self.line(format!("const {it} kf_wplane = kf_wn0 * kf_wn1;"))?;
                self.line(format!("const {it} kf_wq = {p} % kf_wplane;"))?;
                "kf_wq"
            } else {
                p
            };
            self.line(format!("const {it} kf_wgs = {g}{sfx} * kf_wn1;"))?;
            self.line(format!("const {it} kf_wg0 = ({q} / kf_wgs) * {g}{sfx};"))?;
            self.line(format!("const {it} kf_wgm = kf_wn0 - kf_wg0 < {g}{sfx} ? kf_wn0 - kf_wg0 : {g}{sfx};"))?;
            self.line(format!("const {it} kf_wp0 = kf_wg0 + ({q} % kf_wgs) % kf_wgm;"))?;
            self.line(format!("const {it} kf_wp1 = ({q} % kf_wgs) / kf_wgm;"))?;
            pids.extend(["kf_wp0".to_string(), "kf_wp1".to_string()]);
            self.decode_axes(2..axes, &format!("({p} / kf_wplane)"), it, &mut pids)?;
        } else {
            self.decode_axes(0..axes, p, it, &mut pids)?;
        }
        self.pid = Some(pids);
        Ok(())
    }

    /// The walk of a grouped launch (`Schedule::grouped`) over every problem's programs
    /// (the table's records: per-axis program counts, the programs before the problem,
    /// one word per parameter): each program finds its problem, binds the parameters'
    /// names to its words — of the tensor maps only those this role reads, the
    /// producer's ring copies or the consumers' stores — and its place `kf_wl` within
    /// the problem's programs, which number `kf_wn<axis>` along each axis.
    fn open_grouped_walk(&mut self, axes: usize) -> R {
        let mut decls = self.decls.clone();
        decls.extend(super::map_decls(self.ws.as_ref(), &self.out_tma_maps).into_iter().map(|(d, _)| d));
        let rec = 4 + decls.len();
        self.line(format!("const long long* kf_wlast = kf_grp + (kf_ngrp - 1) * {rec};"))?;
        self.line("const long long kf_wprogs = kf_wlast[3] + kf_wlast[0] * kf_wlast[1] * kf_wlast[2];")?;
        self.open("for (long long kf_pid = blockIdx.x; kf_pid < kf_wprogs; kf_pid += gridDim.x)")?;
        if !self.producer {
            self.line(CONSUMER_BARRIER)?;
        }
        self.line("long long kf_g = 0;")?;
        self.line(format!("while (kf_g + 1 < kf_ngrp && kf_pid >= kf_grp[(kf_g + 1) * {rec} + 3]) ++kf_g;"))?;
        self.line(format!("const long long* kf_rec = kf_grp + kf_g * {rec};"))?;
        let producer = self.producer;
        super::bind_group_params(&mut self.w, &decls, &|name| name.starts_with("kf_rtm") == producer).map_err(super::fmt_err)?;
        for a in 0..axes {
            self.line(format!("const long long kf_wn{a} = kf_rec[{a}];"))?;
        }
        self.line("const long long kf_wl = kf_pid - kf_rec[3];")
    }

    /// Whether a persistent walk's programs number below 2^31 at every launch this
    /// kernel is compiled for (each grid axis's extent is at most its `Spec::shape_pow2`;
    /// a grouped launch's counts are the table's, not bounded here): its decoding then
    /// divides in 32 bits. A 64-bit division is a long instruction sequence of its
    /// own; the GEMM's walk has five in each role (NVRTC 13 on the build machine:
    /// 4096³ bf16 about 10% less time, cubin 27 → 23 KB).
    fn narrow_walk(&self, grid: &[crate::target::GridAxisEval]) -> bool {
        let bound = |g: &crate::target::GridAxisEval| self.spec.shape_pow2.get(g.dim.0 as usize).filter(|&&p| p > 0 && p < 1 << 31).map(|&p| (p as u64).div_ceil(g.step.max(1)));
        !self.k.schedule.grouped && grid.iter().try_fold(1u64, |n, g| bound(g).map(|b| n.saturating_mul(b))).is_some_and(|n| n < 1 << 31)
    }

    /// The walk's program ids of `axes` from `base`, the first of them fastest
    /// (`kf_wp<a>` each, of C type `it`, pushed onto `pids`).
    fn decode_axes(&mut self, axes: std::ops::Range<usize>, base: &str, it: &str, pids: &mut Vec<String>) -> R {
        for a in axes.clone() {
            let div: Vec<String> = (axes.start..a).map(|b| format!("kf_wn{b}")).collect();
            let q = if div.is_empty() { base.to_string() } else { format!("({base} / ({}))", div.join(" * ")) };
            self.line(format!("const {it} kf_wp{a} = {q} % kf_wn{a};"))?;
            pids.push(format!("kf_wp{a}"));
        }
        Ok(())
    }

    /// The register-room attempt of the kernel without the shared addresses taken
    /// once: a warp-specialized kernel that takes them once has one attempt more, first
    /// ([`takes_addresses_once`]).
    pub(super) fn base_attempt(&self) -> u32 {
        attempt_without_once(self.spec.register_attempt, self.ws.is_some() && takes_addresses_once(self.k))
    }

    fn turn_of(&self, op: OpId) -> Option<(LoopId, (OpId, OpId))> {
        let ws = self.ws.as_ref()?;
        ws.turns.iter().find(|(_, (f, l))| *f == op || *l == op).map(|(l, t)| (*l, *t))
    }

}

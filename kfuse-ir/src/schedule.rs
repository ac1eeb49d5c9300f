//! Scheduling decisions recorded in the IR.
//!
//! The passes in `kfuse-codegen` fill a [`Schedule`]; the printer shows it and the code
//! writer only reads it. Nothing here knows CUDA: a layout says which thread holds which
//! element of a tile, not how that is spelled.
//!
//! Invariants (checked by the verifier once a schedule is present, i.e. when
//! `num_threads > 0`):
//! - every tile symbol used by the kernel has a value in `tiles`, a power of two (a
//!   `dot`'s `N` tile on the WGMMA path may be a multiple of 64: [`MmaPlan::wgmma_widths`]);
//! - every shape symbol used as a full extent has a padded value in `full`, a power of two;
//! - every value of rank ≥ 1 has a layout whose shape is the value's concrete shape, and
//!   whose thread count is `num_threads`.

use std::collections::{BTreeMap, BTreeSet};

use crate::kernel::{OpId, ShapeSym, TileSym, ValueId};

/// How the elements of a tile are spread over the threads of a block (and, for a
/// tile split across a thread-block cluster, over the blocks of the cluster).
///
/// Axis `a` is cut into `ctas_per_cluster[a]` contiguous pieces of
/// `piece = shape[a] / ctas_per_cluster[a]` elements, piece `c` held by the cluster's
/// block `c`. Within a piece, an element coordinate is
/// `rep * (spt[a]*tpw[a]*wpc[a]) + (warp_a * tpw[a] + lane_a) * spt[a] + e`, with
/// `e < spt[a]` held in consecutive registers of one thread. `order` lists the axes
/// fastest-first: lanes and warps are numbered along `order[0]` first. When one
/// sweep of the block covers more than the tile along an axis, the extra threads hold
/// copies (replicas) of the same elements.
///
/// `steps`, when not empty, replaces the coordinate formula within a piece by
/// `rep * chunk + warp_a * steps[a].warp + lane_a * steps[a].lane + e * steps[a].elem`
/// (with `chunk = spt*tpw*wpc` as before): the layouts that matrix instructions
/// leave their results in interleave a thread's registers between its lanes' rows
/// (see [`AxisSteps`]). Empty means the plain formula above.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Blocked {
    /// The tile's concrete extent along each axis.
    pub shape: Vec<u32>,
    /// Consecutive elements a thread holds along each axis (`spt`).
    pub size_per_thread: Vec<u32>,
    /// Lanes of a warp along each axis (`tpw`; their product is 32).
    pub threads_per_warp: Vec<u32>,
    /// Warps of a block along each axis (`wpc`).
    pub warps_per_block: Vec<u32>,
    /// The axes, fastest first.
    pub order: Vec<u32>,
    /// Blocks of the cluster along each axis (all 1 without a cluster split).
    pub ctas_per_cluster: Vec<u32>,
    /// Coordinate steps per axis (empty: `elem = 1, lane = spt, warp = spt * tpw`).
    pub steps: Vec<AxisSteps>,
}

/// The coordinate step of a thread's element digit, lane component and warp component
/// along one axis of a [`Blocked`] layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AxisSteps {
    /// The step between a thread's consecutive registers.
    pub elem: u32,
    /// The step between consecutive lanes.
    pub lane: u32,
    /// The step between consecutive warps.
    pub warp: u32,
}

/// The distribution of one value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// A scalar: every thread holds the same value.
    Uniform,
    /// A tile spread over the block's threads as [`Blocked`] says.
    Blocked(Blocked),
    /// The parent layout with axis `axis` removed: what a reduction along `axis` of a
    /// `parent`-distributed tile leaves, and what broadcasting back into it needs.
    Slice {
        /// The layout of the tile before the axis was removed.
        parent: Blocked,
        /// The removed axis of `parent`.
        axis: u32,
    },
}

/// How a layout conversion lays its tile out in shared memory (rank-2 tiles are stored
/// row-major over the value's axes, `C` elements a row).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SmemLayout {
    /// Rows padded by `pad` elements; every access is one element.
    Padded {
        /// Elements of padding after each row.
        pad: u32,
    },
    /// No padding; the `vec`-element chunk `j` of row `r` is stored at chunk
    /// `j ^ ((r / phase_div) % (C / vec))`. The side whose fastest axis is the row moves
    /// whole chunks (one vector access each); the other side, which walks down columns
    /// `phase_div` rows at a time, finds the lanes of one access in distinct banks.
    Swizzled {
        /// Elements a chunk.
        vec: u32,
        /// Rows that share one swizzle phase.
        phase_div: u32,
    },
}

/// Everything the scheduling passes decided for one kernel specialization.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    /// Threads per block; 0 means "not scheduled yet".
    pub num_threads: u32,
    /// Blocks per thread-block cluster along grid axis x (1: no clusters). When > 1,
    /// `program_id(0)` is the cluster index and tile axes over `split` are cut across
    /// the cluster's blocks.
    pub cluster: u32,
    /// The extent whose tile axes are split across the cluster.
    pub split: Option<crate::kernel::Extent>,
    /// 0: one block per program. n > 0: a persistent grid of at most n blocks, each
    /// walking the programs `blockIdx.x, + gridDim.x, …` and issuing the next program's
    /// tile loads before it works on the current one (only for a kernel whose programs
    /// index one grid axis; `persist_programs`).
    pub persistent: u32,
    /// 0: none. n > 0: a row kernel split across a cluster asks L2, before its own loads,
    /// for the slices of the rows `n` programs (clusters) ahead — those a cluster that
    /// starts a little later will load — so that DRAM keeps streaming while this
    /// cluster's blocks reduce, exchange and write (`prefetch_ahead`).
    pub l2_prefetch: u32,
    /// Tile values that are cheap to recompute (16- and 8-bit float loads kept as their
    /// raw words, and elementwise math over them) are recomputed at each use instead of
    /// held in registers (`rematerialize`): fewer registers a thread, more blocks a
    /// multiprocessor.
    pub remat: bool,
    /// The `program_id` axis whose programs run along the launch grid's x; axis 0 takes
    /// its place (y or z) and the others keep theirs. 0, the plain grid, but where the
    /// specialization lets another axis have more programs than CUDA's 65535 along y or
    /// z and axis 0 cannot (`order_grid`; x takes up to 2^31 - 1).
    pub grid_x: u8,
    /// A grouped launch (`Spec::grouped`): the programs of several problems in one
    /// launch; each block finds its problem and program in a table the runtime passes,
    /// whose entries bind the parameters' names (pointers, strides, shapes, scalars).
    pub grouped: bool,
    /// Blocks per multiprocessor the register allocator must leave room for
    /// (`__launch_bounds__`'s second argument); 0 leaves the choice to the assembler.
    pub min_blocks: u32,
    /// Vector loads and stores address from a pointer per thread (its place in the
    /// tile, computed once) plus each register group's constant offset, instead of a
    /// full address per group. The same accesses; the assembler holds one pointer
    /// where it would otherwise rebuild 64-bit addresses under a register cap.
    pub thread_pointers: bool,
    /// Which of the kernel's register-room attempts this schedule is (0-based) and how
    /// many there are (1: no fallback). A later attempt asks for less: the runtime
    /// compiles it when the assembler spills the one before (`rematerialize`).
    pub register_attempt: (u32, u32),
    /// The chosen value of each tile symbol.
    pub tiles: BTreeMap<TileSym, u32>,
    /// The compiled extent of each shape symbol used as a full tile extent.
    pub full: BTreeMap<ShapeSym, u32>,
    /// The shape symbols of `full` whose run-time value is known to equal the compiled
    /// extent: a tile axis spanning such a symbol from offset 0 is in bounds everywhere,
    /// so its loads, stores and reductions carry no masks.
    pub full_exact: BTreeSet<ShapeSym>,
    /// The layout of each value of rank ≥ 1.
    pub layouts: BTreeMap<ValueId, Layout>,
    /// Elements per vector access for each load and store (1 = scalar accesses).
    pub vector: BTreeMap<OpId, u32>,
    /// The shared-memory layout of each `Convert`.
    pub smem: BTreeMap<ValueId, SmemLayout>,
    /// Bytes of shared memory the kernel needs (layout conversions, reductions).
    pub smem_bytes: u32,
    /// The matrix-multiply plan of a `dot` accumulated in a loop, when the kernel has
    /// one (`select_mma_path`, `pipeline_stages`).
    pub mma: Option<MmaPlan>,
    /// Why the kernel's `dot`s are not a pipelined matrix loop (`mma`), when they are
    /// not: each is then lowered where it stands, as one op among the others.
    pub dots_one_by_one: Option<String>,
    /// Why the pipelined `dot` loop of `mma` takes its path (`select_mma_path`): the
    /// target, the operands' dtype and precision, and, for the FMA fallback of 16-bit
    /// operands, what the matrix path's copies cannot read. Reported by plans
    /// (`kfuse_codegen::Plan`); the IR printer does not show it.
    pub mma_why: Option<String>,
    /// A row too long for one block, on a target without a cluster to take it, walked in
    /// chunks by loops the pass wrote into the kernel (`chunk_rows`).
    pub row_chunks: Option<RowChunks>,
}

/// How `chunk_rows` walks a row too long for one block: loops over chunks of `chunk`
/// elements of the full extent of `sym` (padded to `row` elements), `passes` of them
/// one after another (a later pass needs a statistic of the row an earlier one made).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowChunks {
    /// The shape symbol whose full extent is the row.
    pub sym: ShapeSym,
    /// The row's padded length (a power of two), in elements.
    pub row: u32,
    /// Elements a chunk (one loop iteration).
    pub chunk: u32,
    /// Loops over the row, one after another.
    pub passes: u32,
}

/// Which matrix instructions and data movement a pipelined `dot` loop uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaPath {
    /// sm_90a: TMA loads into swizzled shared memory completing on mbarriers, WGMMA
    /// issued by consumer warpgroups, one producer warp (warp specialization).
    WgmmaTma,
    /// sm_80 and sm_89 (Ampere, Ada): every thread copies 16-byte chunks of both
    /// operands from global into XOR-swizzled shared memory with `cp.async` (zero fill
    /// past the tensor's edges) into a ring of `stages` stages, one commit group per
    /// stage; the warps of the block (`MmaPlan::warps`, all of them compute) read their
    /// fragments with `ldmatrix` (`.trans` for an operand whose contiguous dimension is
    /// not `K`) and issue `mma.sync.aligned.m16n8k16` into f32 accumulators. One output
    /// tile per block, on the ordinary program-id grid.
    ///
    /// Shared memory of one operand in one stage: `rows × row_bytes`, a row along the
    /// tensor's non-unit-stride tile dimension, `row_bytes` = the unit-stride tile
    /// extent in bytes; the 16-byte chunk `j` of row `r` lives at chunk
    /// `j ^ ((r / (8 / min(C, 8))) % min(C, 8))` (`C` chunks a row), so that the 8 rows
    /// of one `ldmatrix` matrix, and the chunks a warp's `cp.async`s write, fall in
    /// distinct banks. `MmaOperand::swizzle` records `min(row_bytes, 128)`.
    MmaSyncCpAsync,
    /// Every sm_80+ target, no matrix unit: plain f32 fused multiply-adds (`fmaf`, one
    /// FFMA each, round-to-nearest, no TF32) on the CUDA cores into exact f32
    /// accumulators. Taken by f32 operands, and as the fallback of the two paths above
    /// for f16/bf16 operands they cannot read (strides or data not 16-byte aligned, a
    /// `cp.async` block offset off a 16-byte boundary); 16-bit elements become f32 as
    /// they are loaded. One output tile per block, on the ordinary program-id grid.
    ///
    /// Data movement: every thread loads its share of both operand tiles from global
    /// memory into registers with plain masked loads (any strides, any majorness;
    /// elements outside the tensor read as 0), the warp's lanes consecutive along the
    /// tensor's unit-stride dimension, and stores them as f32 into shared memory laid
    /// out `[BK][BM + 4]` (A transposed: M contiguous) and `[BK][BN + 4]` (N contiguous);
    /// the 4 floats of padding a row keep the transposing stores of a K-major operand
    /// apart in the banks and every row 16-byte aligned (`MmaOperand::swizzle` is 0).
    /// Two stages (`stages = 2`): the loads of iteration `it + 1` are in flight in
    /// registers while the block computes on stage `it % 2`, then go to the other
    /// stage; one barrier an iteration.
    ///
    /// Compute: thread tiles of `instr[0] × instr[1]` accumulators (`instr = [tm, tn,
    /// 1]`), in the accumulator layout `fma_accumulator` of `kfuse-codegen`: runs of 4
    /// consecutive rows and 4 consecutive columns repeated every sweep of the block,
    /// lanes 8 along the columns (4 along the rows), warps arranged `warps[0] ×
    /// warps[1]`. Per `k` a thread reads its rows of A and its columns of B as 16-byte
    /// vectors (lanes of one vector read the same address or consecutive ones: no bank
    /// conflicts) and issues `tm × tn` FMAs.
    FmaSimt,
}

/// Which dimension of an operand tile is contiguous in shared memory (on
/// [`MmaPath::FmaSimt`]: in the tensor it is loaded from; that path's shared memory
/// holds every operand with `M` or `N` contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Major {
    /// The reduction dimension (`K`) is contiguous.
    K,
    /// The row (`M`, for A) or column (`N`, for B) dimension is contiguous.
    MN,
}

/// One operand of the pipelined `dot`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmaOperand {
    /// The `Load` inside the loop that feeds the `dot`.
    pub load: OpId,
    /// Which of its dimensions is contiguous.
    pub major: Major,
    /// Shared-memory swizzle span in bytes (also the TMA box's inner extent in bytes).
    pub swizzle: u32,
}

/// A further `dot` of the loop a [`MmaPlan`] pipelines, beside its first one: the same
/// tile shape, operand dtype and precision, its own accumulator (a carried value of
/// the loop) and its own B tile; its A tile is either the first dot's (the same `Load`:
/// loaded once a stage and read by both) or one of its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmaDot {
    /// The `Dot` op.
    pub dot: OpId,
    /// Its accumulator's index among the loop's carried values.
    pub carried: u32,
    /// Its `[M, K]` operand.
    pub a: MmaOperand,
    /// Its `[K, N]` operand.
    pub b: MmaOperand,
}

/// Which of a persistent matrix kernel's tiles (in its walk's order) a launch takes. On
/// request (`KFUSE_TAIL_SPLIT=1`) the runtime splits a walk whose last wave would leave
/// most multiprocessors idle into two launches of the same kernel: one over the whole
/// waves, then one with the loop split across clusters over the tiles left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TileWalk {
    /// Every tile.
    #[default]
    All,
    /// The tiles of whole waves only: the first `(tiles / programs) * programs`, where
    /// `programs` is the launch's (one block each).
    WholeWaves,
    /// The last `programs` tiles (one cluster each), where `programs` is the launch's
    /// cluster count: with [`MmaPlan::split_k`] > 1.
    LastTiles,
}

/// The decisions for a kernel whose loop accumulates `dot(load, load)` (or several such
/// dots, each into its own accumulator: [`MmaPlan::more`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmaPlan {
    /// The instructions and data movement.
    pub path: MmaPath,
    /// The loop's `For` op.
    pub for_op: OpId,
    /// The loop's (first) `Dot`.
    pub dot: OpId,
    /// That dot's loop-carried accumulator index.
    pub carried: u32,
    /// The first dot's `[M, K]` operand.
    pub a: MmaOperand,
    /// The first dot's `[K, N]` operand.
    pub b: MmaOperand,
    /// The loop's other dots, in program order (empty for a loop of one dot; only
    /// [`MmaPath::WgmmaTma`] takes more). A stage holds every distinct operand tile
    /// once: A, B, then for each of these its A when it has its own, and its B.
    pub more: Vec<MmaDot>,
    /// Block tile `[BM, BN, BK]`.
    pub tile: [u32; 3],
    /// Instruction shape `[m, n, k]` (on [`MmaPath::FmaSimt`]: the thread tile
    /// `[tm, tn, 1]`, `tm × tn` FMAs per `k`).
    pub instr: [u32; 3],
    /// Consumer warpgroups (each owns `BM / consumers` rows of the tile); 0 on paths
    /// without warp specialization.
    pub consumers: u32,
    /// Warps sharing the accumulator tile, along M and along N (`[4 * consumers, 1]`
    /// for WGMMA; `[4, 1]` under [`MmaPlan::pingpong`], one warpgroup a tile). With `wm × wn` warps, warp `(a, b)` holds the `m16n8` instruction
    /// tiles at rows `16 (a + wm i)` and columns `8 (b + wn j)`: warps interleave at
    /// instruction-tile granularity ([`AxisSteps`] in the layout). On
    /// [`MmaPath::FmaSimt`] the warps hold thread tiles in a plain blocked layout.
    pub warps: [u32; 2],
    /// Shared-memory pipeline depth (`pipeline_stages`).
    pub stages: u32,
    /// Persistent grid: programs visit tiles in groups of `group_m` tile rows, so that
    /// the tiles in flight share their A rows and B columns in L2.
    pub group_m: u32,
    /// The epilogue's `[BM, BN]` store that goes through shared memory (swizzled like
    /// the operands) and a TMA bulk store, when its output can take one: the consumers
    /// move on to the next tile while the copy engine writes this one.
    pub store: Option<MmaOperand>,
    /// The loop's iterations are cut into this many contiguous ranges, one per block
    /// of a thread-block cluster; the partial accumulators meet in the first block
    /// through distributed shared memory, which alone runs the epilogue (1: no split).
    pub split_k: u32,
    /// Blocks of a thread-block cluster that work on neighbouring tiles and share one
    /// operand tile: each loads a slice and multicasts it to all (1: none). The shared
    /// operand is A (tiles of one tile row) unless [`MmaPlan::multicast_b`].
    pub multicast: u32,
    /// The multicast operand is B: the cluster's blocks hold neighbouring tiles of one
    /// tile column (along M) and share its B tile.
    pub multicast_b: bool,
    /// Which tiles of the persistent walk this kernel takes ([`TileWalk`]; `All` but in
    /// the two launches of the runtime's split of a last, mostly idle wave).
    pub walk: TileWalk,
    /// Ping-pong consumers ([`MmaPath::WgmmaTma`]): each consumer warpgroup owns whole
    /// tiles (all `BM` rows, two `m64` instructions a K step) and the warpgroups take
    /// alternate tiles of the block's walk, so that one's epilogue runs while the other's
    /// loop keeps the tensor cores busy (`warps` is then `[4, 1]`: one warpgroup's
    /// warps hold the accumulator). False: the consumers share each tile, 64 rows each.
    pub pingpong: bool,
    /// The [`MmaPlan::store`] tile leaves in its TMA boxes (`[BM, 64]` of 16-bit
    /// elements) through this many box-sized shared-memory buffers, each reused once the
    /// bulk store issued from it has read it (`pipeline_stages` picks it when the whole
    /// tile would leave the ring fewer stages: 128x320 tiles); 0: the whole tile at once.
    pub store_buffers: u32,
}

impl Schedule {
    /// True once the passes have run (`num_threads > 0`).
    pub fn is_scheduled(&self) -> bool {
        self.num_threads > 0
    }
}

impl MmaPlan {
    /// The widths of the `m64nN` instructions that cover the tile's `BN` columns on
    /// [`MmaPath::WgmmaTma`], left to right: `BN` itself up to 256, else 256-wide ones
    /// and the rest (320: 256 and 64). Their accumulators follow each other in a
    /// consumer's registers, which is the one-instruction layout continued.
    pub fn wgmma_widths(&self) -> Vec<u32> {
        let mut left = self.tile[1];
        let mut v = Vec::new();
        while left > 0 {
            let w = left.min(256);
            v.push(w);
            left -= w;
        }
        v
    }

    /// The instructions a K step issues, as the IR printer and plans name them: the
    /// `m64nNkK` WGMMAs covering `BN` ([`MmaPlan::wgmma_widths`], joined by ` + `), the
    /// `m16n8k16` of mma.sync, or the `f32 fma` of the FMA path.
    pub fn instructions(&self) -> String {
        match self.path {
            MmaPath::WgmmaTma => self.wgmma_widths().iter().map(|n| format!("m{}n{n}k{}", self.instr[0], self.instr[2])).collect::<Vec<_>>().join(" + "),
            MmaPath::MmaSyncCpAsync => format!("m{}n{}k{}", self.instr[0], self.instr[1], self.instr[2]),
            MmaPath::FmaSimt => "f32 fma".to_string(),
        }
    }

    /// Every dot of the plan, the first one first: `(dot, carried, a, b)`.
    pub fn all_dots(&self) -> Vec<MmaDot> {
        let mut v = vec![MmaDot { dot: self.dot, carried: self.carried, a: self.a.clone(), b: self.b.clone() }];
        v.extend(self.more.iter().cloned());
        v
    }

    /// The distinct operand loads of one pipeline stage in the order a stage holds
    /// them (see [`MmaPlan::more`]), each with its majorness and swizzle.
    pub fn stage_operands(&self) -> Vec<MmaOperand> {
        let mut v: Vec<MmaOperand> = Vec::new();
        for d in self.all_dots() {
            for o in [d.a, d.b] {
                if !v.iter().any(|x| x.load == o.load) {
                    v.push(o);
                }
            }
        }
        v
    }
}

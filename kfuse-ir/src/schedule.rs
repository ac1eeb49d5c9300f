//! Scheduling decisions recorded in the IR.
//!
//! The passes in `kfuse-codegen` fill a [`Schedule`]; the printer shows it and the code
//! writer only reads it. Nothing here knows CUDA: a layout says which thread holds which
//! element of a tile, not how that is spelled.
//!
//! Invariants (checked by the verifier once a schedule is present, i.e. when
//! `num_threads > 0`):
//! - every tile symbol used by the kernel has a value in `tiles`, a power of two (a
//!   `dot`'s `N` tile may be a multiple of 64: several instructions a K step);
//! - every shape symbol used as a full extent has a padded value in `full`, a power of two;
//! - every value of rank ≥ 1 has a layout whose shape is the value's concrete shape, and
//!   whose thread count is `num_threads`.

use std::collections::{BTreeMap, BTreeSet};

use crate::kernel::{OpId, ShapeSym, TileSym, ValueId};

/// How the elements of a tile are spread over the threads of a block (and, for a
/// tile split over several blocks that share it, over those blocks).
///
/// Axis `a` is cut into `block_split[a]` contiguous pieces of
/// `piece = shape[a] / block_split[a]` elements, piece `c` held by the program's
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
    /// Blocks the tile is split over along each axis (all 1: one block holds it).
    pub block_split: Vec<u32>,
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
    /// Blocks that run one program together, along grid axis x (1: one block a
    /// program). When > 1, `program_id(0)` is the index of the group and tile axes over
    /// `split` are cut across its blocks, which exchange partial results (how, and on
    /// which targets, is the code generator's business).
    pub split_blocks: u32,
    /// The extent whose tile axes are split across a program's blocks.
    pub split: Option<crate::kernel::Extent>,
    /// 0: one block per program. n > 0: a persistent grid of at most n blocks, each
    /// walking the programs `blockIdx.x, + gridDim.x, …` and issuing the next program's
    /// tile loads before it works on the current one (only for a kernel whose programs
    /// index one grid axis; `persist_programs`).
    pub persistent: u32,
    /// 0: none. n > 0: a row kernel split across several blocks asks L2, before its own
    /// loads, for the slices of the rows `n` programs ahead — those a program that
    /// starts a little later will load — so that DRAM keeps streaming while this
    /// program's blocks reduce, exchange and write (`prefetch_ahead`).
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
    /// Program axis 0 is launched from its last program (`order_grid`): the kernel's
    /// loops end later for a later program along it and none starts later alone (flash
    /// attention's causal rows), so the longest programs start first and the shortest
    /// fill the last wave.
    pub longest_first: bool,
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
    /// compiles it when the assembler spills the one before (`rematerialize`,
    /// `ring_occupancy`).
    pub register_attempt: (u32, u32),
    /// Register-room attempts that take a wider block of rows than the kernel's own
    /// schedule (0 or 1: `choose_tiles` gives attempt 0 a block of 192 rows where a loop
    /// chains its dots and their results fit); the passes after it count the attempts
    /// from the kernel's own schedule, and `register_attempt` counts them all.
    pub row_attempts: u32,
    /// Most stages of the writer's operand rings filled by the block's own threads; 0: as many as shared
    /// memory holds for `min_blocks` blocks; 1: no rings (`ring_occupancy`).
    pub ring_stages: u32,
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
    /// How the kernel's `dot`s are lowered and why, when it has any: each where it
    /// stands, as one op among the others.
    pub dots_one_by_one: Option<String>,
    /// The kernel's `dot`s are a matrix loop that the general lowering takes on the
    /// tensor cores (the matrix tiles, operand rings, the instructions' accumulator
    /// layouts); `dots_one_by_one` says so in words.
    pub general_matrix_loop: bool,
    /// A row too long for one block, on a target without block groups to take it, walked in
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

impl Schedule {
    /// True once the passes have run (`num_threads > 0`).
    pub fn is_scheduled(&self) -> bool {
        self.num_threads > 0
    }
}

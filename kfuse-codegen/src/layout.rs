//! Layout arithmetic: building blocked layouts and mapping each thread's registers to
//! tile coordinates.
//!
//! A value of rank r in layout [`Blocked`] `P` is held by each thread in `regs()`
//! registers. Register index `k` is mixed-radix over *digits*: first the repetition
//! digits of each axis, slowest axis (last in `order`) first, then the in-thread element
//! digits in the same order, so that the elements of one vector (consecutive along the
//! fastest axis) are consecutive registers. A [`Layout::Slice`] of `P` along axis `a`
//! has the digits of `P` without those of `a`.
//!
//! Everything here is plain integer arithmetic on powers of two; the writer turns it
//! into C expressions whose register indices are compile-time constants after
//! unrolling.

use kfuse_ir::{AxisSteps, Blocked, Layout};

/// Builds a blocked layout for a tile: `vec` consecutive elements per thread along
/// `order[0]`, the 32 lanes spread along `order` (fastest first), the warps along
/// `warp_order`, each axis cut into `ctas[a]` pieces across a cluster. Threads left over
/// once a piece is covered hold replicas (lanes along the fastest axis, warps along the
/// last axis of `warp_order`).
pub fn blocked(shape: &[u32], order: &[u32], vec: u32, num_threads: u32, warp_order: &[u32], ctas: &[u32]) -> Blocked {
    let r = shape.len();
    let piece: Vec<u32> = (0..r).map(|a| (shape[a] / ctas.get(a).copied().unwrap_or(1)).max(1)).collect();
    let mut spt = vec![1u32; r];
    let mut tpw = vec![1u32; r];
    let mut wpb = vec![1u32; r];
    let f = order[0] as usize;
    spt[f] = vec.min(piece[f]).max(1);
    // lanes
    let mut lanes = 32u32;
    for &a in order {
        let a = a as usize;
        let room = (piece[a] / spt[a]).max(1);
        let t = lanes.min(room);
        tpw[a] = t;
        lanes /= t;
    }
    tpw[f] *= lanes; // replicas along the fastest axis
    // warps
    let mut warps = (num_threads / 32).max(1);
    for &a in warp_order {
        let a = a as usize;
        let room = (piece[a] / (spt[a] * tpw[a])).max(1);
        let w = warps.min(room);
        wpb[a] = w;
        warps /= w;
    }
    let slow = *warp_order.last().unwrap() as usize;
    wpb[slow] *= warps; // replicas
    Blocked {
        shape: shape.to_vec(),
        size_per_thread: spt,
        threads_per_warp: tpw,
        warps_per_block: wpb,
        order: order.to_vec(),
        block_split: (0..r).map(|a| ctas.get(a).copied().unwrap_or(1)).collect(),
        steps: vec![],
    }
}

/// The layout a warpgroup matrix instruction (`wgmma … m64nNk16`, f32 accumulators)
/// leaves a `[rows, cols]` accumulator tile in, for `warps` consecutive warps (whole
/// warpgroups) stacked along the rows, each warp owning 16 rows.
///
/// Thread `lane` of warp `w` holds, for every 8-column group `j`, the elements at rows
/// `16 w + lane / 4 + 8 r` and columns `8 j + 2 (lane % 4) + c` (`r, c` in 0..2), in
/// registers `4 j + 2 r + c`. As a [`Blocked`] layout: columns are the fastest axis
/// with 2 elements a thread (step 1), 4 lanes (step 2) and `cols / 8` repetitions;
/// rows have 2 elements a thread 8 apart, 8 lanes (step 1) and the warps (step 16).
pub fn mma_accumulator(rows: u32, cols: u32, warps: u32) -> Blocked {
    debug_assert_eq!(rows, 16 * warps);
    mma_tiles_accumulator(rows, cols, [warps, 1])
}

/// The layout of a `[rows, cols]` f32 accumulator tile built from `m16n8` instruction
/// tiles (`mma.sync.aligned.m16n8k16` on sm_80+, and each 8-column slice of a
/// `wgmma` tile) held by `warps[0] × warps[1]` warps, interleaved at instruction-tile
/// granularity: warp `(a, b)` (warp index `a * warps[1] + b`) holds the instruction
/// tiles `(i, j)` at rows `16 (a + warps[0] i)` and columns `8 (b + warps[1] j)`.
///
/// Within one instruction tile, thread `lane` holds rows `lane / 4 (+ 8)` and columns
/// `2 (lane % 4) (+ 1)`; its registers `4 (i * J + j) + 2 r + c` (`J` tiles along the
/// columns) are exactly the instruction's `d0..d3` of tile `(i, j)`. As a [`Blocked`]
/// layout: rows — 2 elements a thread (step 8), 8 lanes (step 1), the row warps (step
/// 16), repetitions every `16 warps[0]` rows; columns (the fastest axis) — 2 elements
/// (step 1), 4 lanes (step 2), the column warps (step 8), repetitions every
/// `8 warps[1]` columns. With `warps = [w, 1]` this is [`mma_accumulator`].
pub fn mma_tiles_accumulator(rows: u32, cols: u32, warps: [u32; 2]) -> Blocked {
    debug_assert!(rows.is_multiple_of(16 * warps[0]) && cols.is_multiple_of(8 * warps[1]));
    Blocked {
        shape: vec![rows, cols],
        size_per_thread: vec![2, 2],
        threads_per_warp: vec![8, 4],
        warps_per_block: vec![warps[0], warps[1]],
        order: vec![1, 0],
        block_split: vec![1, 1],
        steps: vec![AxisSteps { elem: 8, lane: 1, warp: 16 }, AxisSteps { elem: 1, lane: 2, warp: 8 }],
    }
}

/// The accumulator layout of the writer's exact FMA rule for a
/// `[rows, cols]` tile held by `warps[0] × warps[1]` warps: a plain blocked layout
/// (no [`AxisSteps`]) with runs of 4 consecutive rows and 4 consecutive columns a
/// thread (`min(4, extent)`), up to 8 lanes along the columns and the rest of the warp
/// along the rows, the warps as given, columns fastest. A thread's registers repeat
/// every sweep of the block (`4 · lanes · warps` along an axis): 128x128 over 4x2
/// warps is a 16x16 grid of threads with 8x8 registers each, rows `4 t_r + {0..3}`
/// and `64 + 4 t_r + {0..3}`, likewise the columns.
///
/// Why runs of 4: per `k` a thread reads each of its runs of A and of B as one 16-byte
/// vector from shared memory; the 8 lanes along the columns read 8 consecutive vectors
/// of a B row (128 bytes) and the 4 lanes along the rows 4 of an A row, the other lanes
/// the same addresses — one conflict-free access each. Where a sweep covers more than
/// the tile (tiny tiles), the extra threads hold replicas, as in [`blocked`].
pub fn fma_accumulator(rows: u32, cols: u32, warps: [u32; 2]) -> Blocked {
    let spt = [rows.clamp(1, 4), cols.clamp(1, 4)];
    let tc = (cols / spt[1]).clamp(1, 8);
    Blocked {
        shape: vec![rows, cols],
        size_per_thread: spt.to_vec(),
        threads_per_warp: vec![32 / tc, tc],
        warps_per_block: warps.to_vec(),
        order: vec![1, 0],
        block_split: vec![1, 1],
        steps: vec![],
    }
}

/// Reorders a blocked layout's axes: result axis `i` is axis `perm[i]`.
pub fn permute(b: &Blocked, perm: &[u32]) -> Blocked {
    let pick = |v: &Vec<u32>| perm.iter().map(|&p| v[p as usize]).collect::<Vec<u32>>();
    let mut inv = vec![0u32; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p as usize] = i as u32;
    }
    Blocked {
        shape: pick(&b.shape),
        size_per_thread: pick(&b.size_per_thread),
        threads_per_warp: pick(&b.threads_per_warp),
        warps_per_block: pick(&b.warps_per_block),
        order: b.order.iter().map(|&o| inv[o as usize]).collect(),
        block_split: pick(&b.block_split),
        steps: perm.iter().filter_map(|&p| b.steps.get(p as usize).copied()).collect(),
    }
}

/// How one axis of a value maps to threads and registers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisMap {
    /// The axis of the parent blocked layout this value axis is.
    pub parent_axis: usize,
    /// The axis's extent in the parent layout.
    pub shape: u32,
    /// Blocks of the cluster this axis is cut across.
    pub ctas: u32,
    /// Elements of the axis each of those blocks holds (`shape / ctas`).
    pub piece: u32,
    /// Consecutive elements a thread holds along the axis.
    pub spt: u32,
    /// Sweeps of the block needed to cover the piece (`ceil(piece / chunk)`).
    pub reps: u32,
    /// Register-index stride of this axis's element digit.
    pub e_stride: u32,
    /// Register-index stride of this axis's repetition digit.
    pub rep_stride: u32,
    /// Elements one sweep of the block covers (`spt * tpw * wpb`).
    pub chunk: u32,
    /// Lane/warp decomposition: lane component = `(lane / lane_div) % tpw`.
    pub lane_div: u32,
    /// Lanes along the axis.
    pub tpw: u32,
    /// Warp component = `(warp / warp_div) % wpb`.
    pub warp_div: u32,
    /// Warps along the axis.
    pub wpb: u32,
    /// Coordinate step of the element digit (`1` for a plain blocked layout).
    pub elem_step: u32,
    /// Coordinate step of the lane component (`spt` for a plain blocked layout).
    pub lane_step: u32,
    /// Coordinate step of the warp component (`spt * tpw` for a plain blocked layout).
    pub warp_step: u32,
}

impl AxisMap {
    /// True when one sweep covers more than the axis's piece: some threads hold
    /// replicas.
    pub fn replicated(&self) -> bool {
        self.chunk > self.piece
    }

    /// The coordinate along this axis, within the block's piece and before replicas
    /// are wrapped, of register `k` of lane `lane` in warp `warp`: the repetition,
    /// thread and element parts the writer prints (`emit.rs`'s `local_raw`), as a
    /// number.
    pub fn local_at(&self, warp: u32, lane: u32, k: u32) -> u32 {
        let rep = if self.reps > 1 { ((k / self.rep_stride) % self.reps) * self.chunk } else { 0 };
        let w = (warp / self.warp_div) % self.wpb;
        let l = (lane / self.lane_div) % self.tpw;
        let elem = if self.spt > 1 { ((k / self.e_stride) % self.spt) * self.elem_step } else { 0 };
        rep + w * self.warp_step + l * self.lane_step + elem
    }
}

/// The register map of a value: one [`AxisMap`] per value axis, plus the parent axes
/// that a slice removed (their thread components mark replicas).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegMap {
    /// One map per axis of the value.
    pub axes: Vec<AxisMap>,
    /// Registers (elements) each thread holds.
    pub regs: u32,
    /// Parent axes absent from the value (a slice's reduced axis) with their thread
    /// decomposition: threads whose component there is non-zero hold replicas.
    pub dropped: Vec<AxisMap>,
    /// The parent layout.
    pub parent: Blocked,
}

fn axis_maps(p: &Blocked) -> Vec<AxisMap> {
    let r = p.shape.len();
    let mut maps: Vec<AxisMap> = (0..r)
        .map(|a| {
            let chunk = p.size_per_thread[a] * p.threads_per_warp[a] * p.warps_per_block[a];
            let ctas = p.block_split.get(a).copied().unwrap_or(1).max(1);
            let piece = (p.shape[a] / ctas).max(1);
            AxisMap {
                parent_axis: a,
                shape: p.shape[a],
                ctas,
                piece,
                spt: p.size_per_thread[a],
                reps: piece.div_ceil(chunk).max(1),
                e_stride: 0,
                rep_stride: 0,
                chunk,
                lane_div: 1,
                tpw: p.threads_per_warp[a],
                warp_div: 1,
                wpb: p.warps_per_block[a],
                elem_step: p.steps.get(a).map_or(1, |s| s.elem),
                lane_step: p.steps.get(a).map_or(p.size_per_thread[a], |s| s.lane),
                warp_step: p.steps.get(a).map_or(p.size_per_thread[a] * p.threads_per_warp[a], |s| s.warp),
            }
        })
        .collect();
    let (mut ld, mut wd) = (1u32, 1u32);
    for &a in &p.order {
        let m = &mut maps[a as usize];
        m.lane_div = ld;
        m.warp_div = wd;
        ld *= m.tpw;
        wd *= m.wpb;
    }
    maps
}

/// Assigns register strides to the given axes (digits: reps slowest-first, then
/// elements slowest-first, both following `order` reversed).
fn assign_strides(maps: &mut [AxisMap], order: &[u32]) -> u32 {
    let pos = |maps: &[AxisMap], pa: usize| maps.iter().position(|m| m.parent_axis == pa);
    let mut stride = 1u32;
    for &a in order {
        if let Some(i) = pos(maps, a as usize) {
            maps[i].e_stride = stride;
            stride *= maps[i].spt;
        }
    }
    for &a in order {
        if let Some(i) = pos(maps, a as usize) {
            maps[i].rep_stride = stride;
            stride *= maps[i].reps;
        }
    }
    stride
}

impl RegMap {
    /// Whether two register maps put every element in the same register of the same
    /// thread and mark the same threads as replicas (the layouts may differ in the
    /// parent they slice: `Slice(P, 1)` and `Slice(Q, 1)` of tiles whose rows P and Q
    /// spread alike): a conversion between them moves nothing.
    pub fn same_registers(&self, b: &RegMap) -> bool {
        let threads = |m: &AxisMap| (m.lane_div, m.tpw, m.warp_div, m.wpb, m.ctas);
        self.regs == b.regs
            && self.axes == b.axes
            && self.dropped.len() == b.dropped.len()
            && self.dropped.iter().zip(&b.dropped).all(|(x, y)| threads(x) == threads(y))
    }

    /// The register map of a layout (`None` for [`Layout::Uniform`]).
    pub fn of(l: &Layout) -> Option<RegMap> {
        match l {
            Layout::Uniform => None,
            Layout::Blocked(p) => {
                let mut axes = axis_maps(p);
                let regs = assign_strides(&mut axes, &p.order);
                Some(RegMap { axes, regs, dropped: vec![], parent: p.clone() })
            }
            Layout::Slice { parent, axis } => {
                let mut axes = axis_maps(parent);
                let dropped = vec![axes.remove(*axis as usize)];
                let regs = assign_strides(&mut axes, &parent.order);
                Some(RegMap { axes, regs, dropped, parent: parent.clone() })
            }
        }
    }

    /// The vector-friendly fastest value axis (the parent's `order[0]`), if present.
    pub fn fastest_axis(&self) -> Option<usize> {
        let f = self.parent.order[0] as usize;
        self.axes.iter().position(|m| m.parent_axis == f)
    }
}

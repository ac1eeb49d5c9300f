//! The plan of a `dot` loop a target pipelines as a whole (`select_mma_path`,
//! `pipeline_stages`): its instructions (WGMMA, mma.sync, FMA), data movement (TMA,
//! cp.async), stages, clusters and tile walk. Codegen's own facts, kept in the IR's
//! [`Schedule`] as a [`TargetPlan`] (the IR knows no target instruction) and read back
//! through [`MmaSchedule`].

use std::any::Any;

use kfuse_ir::{DotPrecision, Kernel, Op, OpId, PlanBox, Schedule, TargetPlan};

use crate::target::Walk;

/// Which matrix instructions and data movement a pipelined `dot` loop uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaPath {
    /// sm_90a: TMA loads into swizzled shared memory completing on mbarriers, WGMMA
    /// issued by consumer warpgroups, one producer warp (warp specialization).
    WgmmaTma,
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
    /// instruction-tile granularity ([`kfuse_ir::AxisSteps`] in the layout). On
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
    /// Which tiles of the persistent walk this kernel takes ([`Walk`], the spec's; `All` but in
    /// the two launches of the runtime's split of a last, mostly idle wave).
    pub walk: Walk,
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

impl TargetPlan for MmaPlan {
    fn describe(&self, k: &Kernel) -> Vec<String> {
        let m = self;
        let mut out = Vec::new();
        let maj = |o: &MmaOperand| match o.major {
            Major::K => "K-major",
            Major::MN => "MN-major",
        };
        // a `dot_tf32`: how the target reads its operands
        let tf32 = matches!(k.op(m.dot), Op::Dot { precision: DotPrecision::Tf32 });
        let wg_tf32 = if tf32 { " tf32" } else { "" };
        let fma_tf32 = if tf32 { " (dot_tf32 computed exactly: no TF32 path here)" } else { "" };
        match m.path {
            MmaPath::WgmmaTma => {
                out.push(format!(
                    "mma {:?}: dot {} in loop {}, tile {}x{}x{}, instr {}{wg_tf32}, {} consumer warpgroups{}, {} stages, A {} {} swizzle {}B, B {} {} swizzle {}B, persistent raster group_m={}",
                    m.path, m.dot.value(), m.for_op.value(), m.tile[0], m.tile[1], m.tile[2], m.instructions(),
                    m.consumers, if m.pingpong { " (ping-pong: a tile each, alternate tiles)" } else { "" }, m.stages, m.a.load.value(), maj(&m.a), m.a.swizzle, m.b.load.value(), maj(&m.b), m.b.swizzle, m.group_m
                ));
            }
            MmaPath::FmaSimt => {
                out.push(format!(
                    "mma {:?}: dot {} in loop {}, tile {}x{}x{}, f32 fma{fma_tf32}, thread tile {}x{}, warps {}x{}, {} stages (register prefetch), A {} {}, B {} {}",
                    m.path, m.dot.value(), m.for_op.value(), m.tile[0], m.tile[1], m.tile[2], m.instr[0], m.instr[1],
                    m.warps[0], m.warps[1], m.stages, m.a.load.value(), maj(&m.a), m.b.load.value(), maj(&m.b)
                ));
            }
        }
        for d in &m.more {
            let a = if d.a.load == m.a.load { "shared".to_string() } else { format!("{} {} swizzle {}B", d.a.load.value(), maj(&d.a), d.a.swizzle) };
            out.push(format!(
                "mma also: dot {} into carried {}, A {a}, B {} {} swizzle {}B",
                d.dot.value(),
                d.carried,
                d.b.load.value(),
                maj(&d.b),
                d.b.swizzle
            ));
        }
        if m.multicast > 1 {
            let (line, operand) = if m.multicast_b { ("column", "B") } else { ("row", "A") };
            out.push(format!("mma multicast: clusters of {} blocks on one tile {line} share its {operand} tile (TMA multicast)", m.multicast));
        }
        if m.split_k > 1 {
            out.push(format!("mma split-K: {} blocks of a cluster share each tile's loop, partials summed in distributed shared memory", m.split_k));
        }
        match m.walk {
            Walk::All => {}
            Walk::WholeWaves => {
                out.push("mma walk: the tiles of whole waves only (the first launch of a split last wave)".to_string());
            }
            Walk::LastTiles { .. } => {
                out.push("mma walk: the last tiles, one a cluster (the second launch of a split last wave)".to_string());
            }
        }
        if let Some(st) = &m.store {
            out.push(format!("mma epilogue: store {} through shared memory (swizzle {}B) and a TMA store", st.load.index(), st.swizzle));
            if m.store_buffers > 0 {
                out.push(format!("mma epilogue: the output tile in its boxes through {} box-sized buffers", m.store_buffers));
            }
        }
        out
    }

    fn takes_wide_n(&self) -> bool {
        self.path == MmaPath::WgmmaTma
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn clone_plan(&self) -> Box<dyn TargetPlan> {
        Box::new(self.clone())
    }

    fn same(&self, other: &dyn TargetPlan) -> bool {
        other.as_any().downcast_ref::<MmaPlan>() == Some(self)
    }
}

/// The [`MmaPlan`] of a [`Schedule`], where codegen recorded one.
pub trait MmaSchedule {
    /// The kernel's matrix-loop plan.
    fn mma(&self) -> Option<&MmaPlan>;
    /// The kernel's matrix-loop plan, to change.
    fn mma_mut(&mut self) -> Option<&mut MmaPlan>;
    /// Records (or, with `None`, drops) the kernel's matrix-loop plan.
    fn set_mma(&mut self, plan: Option<MmaPlan>);
}

impl MmaSchedule for Schedule {
    fn mma(&self) -> Option<&MmaPlan> {
        self.target.as_ref().and_then(|p| p.0.as_any().downcast_ref())
    }

    fn mma_mut(&mut self) -> Option<&mut MmaPlan> {
        self.target.as_mut().and_then(|p| p.0.as_any_mut().downcast_mut())
    }

    fn set_mma(&mut self, plan: Option<MmaPlan>) {
        self.target = plan.map(|p| PlanBox(Box::new(p)));
    }
}

//! The plan of a `dot` loop the FMA path runs as a whole kernel (`select_mma_path`):
//! its thread tiles, warps and stages. Codegen's own facts, kept in the IR's
//! [`Schedule`] as a [`TargetPlan`] (the IR knows no target instruction) and read back
//! through [`MmaSchedule`].

use std::any::Any;

use kfuse_ir::{DotPrecision, Kernel, Op, OpId, PlanBox, Schedule, TargetPlan};

/// Which matrix instructions and data movement a pipelined `dot` loop uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaPath {
    /// Every sm_80+ target, no matrix unit: plain f32 fused multiply-adds (`fmaf`, one
    /// FFMA each, round-to-nearest, no TF32) on the CUDA cores into exact f32
    /// accumulators. Taken by f32 operands, and by f16/bf16 operands of more than five
    /// dimensions (which the general lowering does not take); 16-bit elements become
    /// f32 as they are loaded. One output tile per block, on the ordinary program-id grid.
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
    /// The loop's other dots, in program order (empty: the FMA path takes a loop of one
    /// dot). A stage holds every distinct operand tile once: A, B, then for each of
    /// these its A when it has its own, and its B.
    pub more: Vec<MmaDot>,
    /// Block tile `[BM, BN, BK]`.
    pub tile: [u32; 3],
    /// The thread tile `[tm, tn, 1]`: `tm × tn` FMAs per `k`.
    pub instr: [u32; 3],
    /// Warps sharing the accumulator tile, along M and along N: they hold thread tiles
    /// in a plain blocked layout.
    pub warps: [u32; 2],
    /// Shared-memory stages (two: one computed on while the next waits in registers).
    pub stages: u32,
}

impl MmaPlan {
    /// The instructions a K step issues, as the IR printer and plans name them: the
    /// `f32 fma` of the FMA path.
    pub fn instructions(&self) -> String {
        match self.path {
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
        let fma_tf32 = if tf32 { " (dot_tf32 computed exactly: no TF32 path here)" } else { "" };
        match m.path {
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
        out
    }

    fn takes_wide_n(&self) -> bool {
        false
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

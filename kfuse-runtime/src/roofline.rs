//! Roofline estimates: the bytes a kernel must move and the FLOPs it must do for given
//! shapes, against a device's peak bandwidth and compute — the time no kernel can beat
//! there, and what fraction of it a measured time reaches.
//!
//! Owns: [`Roofline`] (counted by [`Roofline::count`] from a kernel's IR, the shape
//! values and whether its plan puts the dots on the tensor cores), [`Peak`] and [`Compute`], and the peak
//! figures of the devices kfuse's targets stand for ([`peak`]).
//!
//! What is counted (compulsory work, independent of the tiles a schedule picks):
//! - **bytes**: every tensor argument once — an input read, an output written, and an
//!   output the kernel also loads read as well (twice its size). Scalars count nothing;
//!   re-reads from L2 or DRAM that a tiling causes are not compulsory and not counted.
//! - **FLOPs**: `2·m·n·k` for each `dot` of an `[m, k]` by a `[k, n]` tile (its
//!   accumulating add included), plus one a float element for every other arithmetic op
//!   on tiles: unary ops (`exp`, `sqrt`, `neg`, … each 1, whatever it costs), binary
//!   `add`, `sub`, `mul`, `div`, `max`, `min`, and reductions (one an element of their
//!   input). Casts, comparisons, selects, loads, stores, broadcasts and scalar (index)
//!   arithmetic count nothing. Each op counts once per execution over the iteration
//!   space: the kernel's programs and loop trips evaluated with every tile extent 1
//!   (so a masked tail adds nothing), a whole-extent tile (`x.row(i)`) its shape value.
//!   A loop whose bounds depend on a program id is evaluated program by program (a
//!   causal mask's triangle); one whose bounds depend on anything else (a scalar
//!   argument, an outer loop's index) leaves the FLOPs uncounted (`None`).
//!
//! Peaks: the datasheet figures of the device a target stands for — sm_90a with 132
//! multiprocessors an H100 SXM, sm_80 with 108 an A100 SXM 80GB — with the compute peak
//! of the units the plan uses ([`Compute`]): the tensor cores' dense figure for the
//! operand type where the writer puts the dots on them (`wgmma`, `mma.sync`), the CUDA
//! cores' f32 figure for exact f32 FMAs and kernels without dots. Other targets have no
//! figures here (`peak` is `None`); the counts stand alone.

use std::collections::HashMap;
use std::fmt;

use kfuse_codegen::Target;
use kfuse_ir::{BinaryOp, DType, DotPrecision, Extent, Kernel, LoopId, Op, OpId, Type, UnaryOp, ValueId};

use crate::error::{Error, Result};

/// NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: GPU memory bandwidth
/// 3.35 TB/s (HBM3).
pub const H100_SXM_BYTES_PER_S: f64 = 3.35e12;
/// Same datasheet: FP32 67 teraFLOPS (CUDA cores).
pub const H100_SXM_F32_FLOPS: f64 = 67e12;
/// Same datasheet: TF32 Tensor Core 989 teraFLOPS with sparsity; dense is half.
pub const H100_SXM_TF32_TC_FLOPS: f64 = 989e12 / 2.0;
/// Same datasheet: BF16 and FP16 Tensor Core 1,979 teraFLOPS with sparsity; dense is half.
pub const H100_SXM_16BIT_TC_FLOPS: f64 = 1979e12 / 2.0;
/// Same datasheet: FP8 Tensor Core 3,958 teraFLOPS with sparsity; dense is half.
pub const H100_SXM_FP8_TC_FLOPS: f64 = 3958e12 / 2.0;
/// NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column: GPU memory bandwidth
/// 2,039 GB/s (HBM2e).
pub const A100_SXM_BYTES_PER_S: f64 = 2039e9;
/// Same datasheet: FP32 19.5 teraFLOPS (CUDA cores).
pub const A100_SXM_F32_FLOPS: f64 = 19.5e12;
/// Same datasheet: TF32 Tensor Core 156 teraFLOPS (dense; 312 with sparsity).
pub const A100_SXM_TF32_TC_FLOPS: f64 = 156e12;
/// Same datasheet: BF16 and FP16 Tensor Core 312 teraFLOPS (dense; 624 with sparsity).
pub const A100_SXM_16BIT_TC_FLOPS: f64 = 312e12;

/// The units a kernel's arithmetic runs on, for its compute peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compute {
    /// f32 on the CUDA cores: no `dot`, or dots computed with FMAs.
    CudaCoresF32,
    /// Tensor cores reading f16 or bf16 operands.
    TensorCores16Bit,
    /// Tensor cores reading f32 operands as TF32 (`dot_tf32` on WGMMA).
    TensorCoresTf32,
    /// Tensor cores reading 8-bit float operands (f8e4m3, f8e5m2).
    TensorCoresFp8,
}

impl Compute {
    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Compute::CudaCoresF32 => "FP32, CUDA cores",
            Compute::TensorCores16Bit => "dense BF16/FP16 tensor cores",
            Compute::TensorCoresTf32 => "dense TF32 tensor cores",
            Compute::TensorCoresFp8 => "dense FP8 tensor cores",
        }
    }

    /// The units of `kernel` (its IR, scheduled or not) whose plan puts its dots on the
    /// tensor cores or not (`kfuse_codegen::Plan::tensor_cores`). See the module docs.
    pub fn of(kernel: &Kernel, tensor_cores: bool) -> Compute {
        let dot = kernel.ops().find_map(|o| match kernel.op(o) {
            Op::Dot { precision } => Some((kernel.ty(kernel.operands(o)[0]).dtype, *precision)),
            _ => None,
        });
        match dot {
            // (8-bit operands on `wgmma`, f32 ones of a `dot_tf32` read as TF32 there,
            // 16-bit ones on `wgmma` or `mma.sync`)
            Some((d, _)) if tensor_cores && d.is_fp8() => Compute::TensorCoresFp8,
            Some((DType::F32, DotPrecision::Tf32)) if tensor_cores => Compute::TensorCoresTf32,
            Some((DType::F16 | DType::BF16, _)) if tensor_cores => Compute::TensorCores16Bit,
            _ => Compute::CudaCoresF32,
        }
    }
}

/// A device's peak bandwidth and compute ([`peak`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peak {
    /// The device the figures are of, and where they come from.
    pub device: &'static str,
    /// DRAM bandwidth, bytes a second.
    pub bytes_per_s: f64,
    /// FLOPs a second of [`Peak::compute`].
    pub flops_per_s: f64,
    /// The units the FLOP peak is of (tensor cores of a dtype, or FP32 FMAs).
    pub compute: Compute,
}

/// The peak of the device `target` stands for, on `compute`'s units: sm_90a with 132
/// multiprocessors an H100 SXM, sm_80 with 108 an A100 SXM 80GB (the datasheet figures
/// of the constants above); `None` for any other target, and for FP8 on the A100 (it has
/// none).
///
/// ```
/// use kfuse_codegen::Target;
/// use kfuse_runtime::roofline::{peak, Compute};
///
/// let p = peak(&Target::sm90a(), Compute::TensorCores16Bit).unwrap();
/// assert_eq!((p.bytes_per_s, p.flops_per_s), (3.35e12, 989.5e12));
/// assert!(peak(&Target::sm89(), Compute::CudaCoresF32).is_none());
/// ```
pub fn peak(target: &Target, compute: Compute) -> Option<Peak> {
    let (device, bytes_per_s, flops) = match (target.sm, target.num_sms) {
        (90, 132) => (
            "H100 SXM (NVIDIA H100 datasheet)",
            H100_SXM_BYTES_PER_S,
            [H100_SXM_F32_FLOPS, H100_SXM_16BIT_TC_FLOPS, H100_SXM_TF32_TC_FLOPS, H100_SXM_FP8_TC_FLOPS],
        ),
        (80, 108) => (
            "A100 SXM 80GB (NVIDIA A100 datasheet)",
            A100_SXM_BYTES_PER_S,
            [A100_SXM_F32_FLOPS, A100_SXM_16BIT_TC_FLOPS, A100_SXM_TF32_TC_FLOPS, f64::NAN],
        ),
        _ => return None,
    };
    let flops_per_s = match compute {
        Compute::CudaCoresF32 => flops[0],
        Compute::TensorCores16Bit => flops[1],
        Compute::TensorCoresTf32 => flops[2],
        Compute::TensorCoresFp8 => flops[3],
    };
    (!flops_per_s.is_nan()).then_some(Peak { device, bytes_per_s, flops_per_s, compute })
}

/// Which of its two roofs bounds a kernel at the peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Moving the bytes takes longer than the FLOPs at the peak.
    Memory,
    /// The FLOPs take longer than moving the bytes at the peak.
    Compute,
}

/// The compulsory work of a kernel on given shapes and the time it takes at a device's
/// peak (see the module docs for what is counted).
///
/// ```
/// use kfuse_runtime::roofline::{Compute, Peak, Roofline};
///
/// // 1 GB moved and 2 TFLOP done on a device of 1 TB/s and 1000 TFLOP/s
/// let peak = Peak { device: "example", bytes_per_s: 1e12, flops_per_s: 1000e12, compute: Compute::TensorCores16Bit };
/// let r = Roofline { bytes: 1_000_000_000, flops: Some(2_000_000_000_000), peak: Some(peak) };
/// assert_eq!(r.time_at_peak_s(), Some(2e-3)); // compute-bound: 2 ms
/// assert_eq!(r.fraction_of_peak(4.0), Some(0.5)); // measured 4 ms: half of the roof
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Roofline {
    /// Bytes every execution must move to and from DRAM.
    pub bytes: u64,
    /// FLOPs every execution must do; `None` when a loop's trip count could not be
    /// evaluated (module docs).
    pub flops: Option<u64>,
    /// The device's peak, when kfuse has figures for the target.
    pub peak: Option<Peak>,
}

impl Roofline {
    /// Counts the compulsory work of `kernel` (its IR before scheduling, dtypes bound)
    /// with shape values `shapes` (indexed by shape symbol), whose dots run on the tensor
    /// cores or not, against the peak of `target` (module docs). Errors: a loop step
    /// that is not positive, or shapes that do not fit the kernel.
    pub fn count(kernel: &Kernel, shapes: &[u64], tensor_cores: bool, target: &Target) -> Result<Roofline> {
        if shapes.len() != kernel.shape_syms.len() {
            return Err(Error::InvalidArgument(format!(
                "`{}` has {} shape symbols but {} values were given",
                kernel.name,
                kernel.shape_syms.len(),
                shapes.len()
            )));
        }
        let c = Counter { k: kernel, shapes };
        Ok(Roofline { bytes: c.bytes(), flops: c.flops()?, peak: peak(target, Compute::of(kernel, tensor_cores)) })
    }

    /// Seconds moving [`Roofline::bytes`] takes at the peak bandwidth.
    pub fn memory_time_s(&self) -> Option<f64> {
        Some(self.bytes as f64 / self.peak?.bytes_per_s)
    }

    /// Seconds doing [`Roofline::flops`] takes at the peak compute.
    pub fn compute_time_s(&self) -> Option<f64> {
        Some(self.flops? as f64 / self.peak?.flops_per_s)
    }

    /// The least time an execution can take on the device: the longer of its memory and
    /// compute times (the memory time alone when the FLOPs are uncounted).
    pub fn time_at_peak_s(&self) -> Option<f64> {
        let m = self.memory_time_s()?;
        Some(self.compute_time_s().map_or(m, |c| c.max(m)))
    }

    /// Which roof [`Roofline::time_at_peak_s`] is.
    pub fn bound(&self) -> Option<Bound> {
        let (m, c) = (self.memory_time_s()?, self.compute_time_s()?);
        Some(if c > m { Bound::Compute } else { Bound::Memory })
    }

    /// How close a measured time (milliseconds a call) comes to the roof: the time at
    /// peak over the measured time (1.0 at the peak; `None` without a peak or for a
    /// time that is not positive).
    pub fn fraction_of_peak(&self, measured_ms: f64) -> Option<f64> {
        (measured_ms > 0.0).then(|| self.time_at_peak_s().map(|t| t * 1e3 / measured_ms)).flatten()
    }
}

impl fmt::Display for Roofline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.peak {
            Some(p) => writeln!(f, "roofline at the peak of the {}", p.device)?,
            None => writeln!(f, "roofline (no peak figures for this target)")?,
        }
        writeln!(f, "  bytes moved: {} (each tensor once: inputs read, outputs written)", self.bytes)?;
        match self.flops {
            Some(n) => writeln!(f, "  FLOPs: {n} (2·m·n·k a dot, one an element of each other arithmetic op)")?,
            None => writeln!(f, "  FLOPs: not counted (a loop bound depends on a scalar argument or an outer loop)")?,
        }
        let Some(p) = &self.peak else { return Ok(()) };
        writeln!(f, "  peak: {:.0} GB/s, {:.1} TFLOP/s ({})", p.bytes_per_s / 1e9, p.flops_per_s / 1e12, p.compute.name())?;
        let us = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.3} us", s * 1e6));
        let bound = match self.bound() {
            Some(Bound::Memory) => "memory-bound",
            Some(Bound::Compute) => "compute-bound",
            None => "memory alone",
        };
        writeln!(
            f,
            "  time at peak: {} ({bound}; memory {}, compute {})",
            us(self.time_at_peak_s()),
            us(self.memory_time_s()),
            us(self.compute_time_s())
        )
    }
}

/// The counts of one kernel on one set of shape values (module docs).
struct Counter<'a> {
    k: &'a Kernel,
    shapes: &'a [u64],
}

/// Why a scalar could not be evaluated.
enum Unknown {
    /// It depends on a program id (evaluate program by program).
    Program,
    /// It depends on something else.
    Other,
}

/// Programs whose loops are evaluated one by one, at most.
const MAX_PROGRAMS: u64 = 1 << 20;

impl Counter<'_> {
    fn bytes(&self) -> u64 {
        let k = self.k;
        let loaded = |p: usize| k.ops().any(|o| matches!(k.op(o), Op::Load { tensor, .. } if tensor.0 as usize == p));
        k.params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_tensor())
            .map(|(i, p)| {
                let size = p.dims().iter().map(|s| self.shapes[s.0 as usize]).product::<u64>() * p.dtype.size_bytes() as u64;
                if p.is_output() && loaded(i) {
                    2 * size
                } else {
                    size
                }
            })
            .sum()
    }

    /// A tile extent with every tile symbol 1.
    fn extent(&self, e: Extent) -> u64 {
        match e {
            Extent::Const(c) => c as u64,
            Extent::Tile(_) => 1,
            Extent::Full(s) => self.shapes[s.0 as usize],
        }
    }

    fn elements(&self, t: &Type) -> u64 {
        t.shape.iter().map(|&e| self.extent(e)).product()
    }

    /// FLOPs of one execution of `o` (module docs).
    fn op_flops(&self, o: OpId) -> u64 {
        let k = self.k;
        let Some(ty) = &k.node(o).ty else { return 0 };
        if ty.is_scalar() {
            return 0;
        }
        let ops = k.operands(o);
        let float = ty.dtype.is_float();
        match k.op(o) {
            Op::Dot { .. } => {
                let (a, b) = (k.ty(ops[0]), k.ty(ops[1]));
                2 * self.extent(a.shape[0]) * self.extent(a.shape[1]) * self.extent(b.shape[1])
            }
            Op::Unary(u) if float && *u != UnaryOp::Not => self.elements(ty),
            // (an add into which a dot's product goes is counted with the dot)
            Op::Binary(BinaryOp::Add) if ops.iter().any(|v| matches!(k.op(v.op()), Op::Dot { .. })) => 0,
            Op::Binary(BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min) if float => self.elements(ty),
            Op::Reduce { .. } if k.ty(ops[0]).dtype.is_float() => self.elements(k.ty(ops[0])),
            _ => 0,
        }
    }

    /// The value of an integer scalar, with the program ids `pid` (`None`: unknown).
    fn scalar(&self, v: ValueId, pid: Option<&[u64]>) -> std::result::Result<i64, Unknown> {
        let k = self.k;
        let o = v.op();
        let arg = |i: usize| self.scalar(k.operands(o)[i], pid);
        Ok(match k.op(o) {
            Op::Const { value: kfuse_ir::Literal::Int(i) } => *i,
            Op::ShapeDim { sym } => self.shapes[sym.0 as usize] as i64,
            Op::TileExtent { extent } => self.extent(*extent) as i64,
            Op::ProgramId { axis } => match pid {
                Some(p) => p.get(*axis as usize).copied().unwrap_or(0) as i64,
                None => return Err(Unknown::Program),
            },
            Op::Cast { .. } => arg(0)?,
            Op::Binary(b) => {
                let (x, y) = (arg(0)?, arg(1)?);
                match b {
                    BinaryOp::Add => x.saturating_add(y),
                    BinaryOp::Sub => x.saturating_sub(y),
                    BinaryOp::Mul => x.saturating_mul(y),
                    BinaryOp::Div if y != 0 => x / y,
                    BinaryOp::Rem if y != 0 => x % y,
                    BinaryOp::Max => x.max(y),
                    BinaryOp::Min => x.min(y),
                    _ => return Err(Unknown::Other),
                }
            }
            _ => return Err(Unknown::Other),
        })
    }

    /// The `lo`, `hi` and `step` operands of each loop's `For`.
    fn bounds(&self) -> HashMap<LoopId, Vec<ValueId>> {
        let k = self.k;
        k.ops()
            .filter_map(|o| match k.op(o) {
                Op::For { id, .. } => Some((*id, k.operands(o)[..3].to_vec())),
                _ => None,
            })
            .collect()
    }

    /// Trips of a loop of bounds `b` ([`Counter::bounds`]) with the program ids `pid`.
    fn trips(&self, b: &[ValueId], pid: Option<&[u64]>) -> std::result::Result<u64, Unknown> {
        let (lo, hi, step) = (self.scalar(b[0], pid)?, self.scalar(b[1], pid)?, self.scalar(b[2], pid)?);
        if step <= 0 {
            return Err(Unknown::Other);
        }
        Ok(if hi > lo { ((hi - lo) as u64).div_ceil(step as u64) } else { 0 })
    }

    /// Executions of an op inside the loops of bounds `loops` over every program, or
    /// `None` when a trip count cannot be evaluated.
    fn executions(&self, loops: &[&[ValueId]], programs: &[u64]) -> Option<u64> {
        let total: u64 = programs.iter().product();
        let product = |pid: Option<&[u64]>| loops.iter().try_fold(1u64, |n, b| Ok(n.saturating_mul(self.trips(b, pid)?)));
        match product(None) {
            Ok(n) => Some(n.saturating_mul(total)),
            Err(Unknown::Other) => None,
            Err(Unknown::Program) if total > MAX_PROGRAMS => None,
            Err(Unknown::Program) => {
                let mut sum = 0u64;
                let mut pid = vec![0u64; programs.len()];
                for _ in 0..total {
                    sum = sum.saturating_add(product(Some(&pid)).ok()?);
                    // the next program id, axis 0 fastest
                    for (a, p) in pid.iter_mut().enumerate() {
                        *p += 1;
                        if *p < programs[a] {
                            break;
                        }
                        *p = 0;
                    }
                }
                Some(sum)
            }
        }
    }

    fn flops(&self) -> Result<Option<u64>> {
        let grid = kfuse_ir::grid::derive(self.k)?;
        let programs = grid.eval(|s| self.shapes[s.0 as usize], |e| self.extent(e));
        let bounds = self.bounds();
        // executions by the loops around an op (a few distinct nests a kernel)
        let mut by_nest: HashMap<Vec<LoopId>, Option<u64>> = HashMap::new();
        let mut total = 0u64;
        for o in self.k.ops() {
            let f = self.op_flops(o);
            if f == 0 {
                continue;
            }
            let nest = self.k.loops_around(o);
            let n = *by_nest.entry(nest).or_insert_with_key(|nest| {
                let b: Option<Vec<&[ValueId]>> = nest.iter().map(|l| bounds.get(l).map(Vec::as_slice)).collect();
                self.executions(&b?, &programs)
            });
            let Some(n) = n else { return Ok(None) };
            total = total.saturating_add(f.saturating_mul(n));
        }
        Ok(Some(total))
    }
}

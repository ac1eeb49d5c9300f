//! The contract between codegen and runtime: the target, the specialization facts, and
//! the emitted kernel.

use std::collections::BTreeMap;

use kfuse_ir::{ParamId, ShapeSym};
use serde::{Deserialize, Serialize};

/// The GPU a kernel is compiled for.
///
/// A GPU device gives its own (the runtime's `Device::target`); the constructors
/// here name one GPU of each architecture, for compiling without one.
///
/// # Examples
///
/// ```
/// use kfuse_codegen::Target;
///
/// let t = Target::sm90a();
/// assert_eq!((t.sm, t.arch()), (90, "sm_90a".to_string()));
/// assert_eq!(Target::sm80().arch(), "sm_80");
/// // another part of the same architecture: fewer multiprocessors
/// let smaller = Target { num_sms: 114, ..Target::sm90a() };
/// assert_eq!(smaller.arch(), "sm_90a");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Compute capability as `major * 10 + minor` (80, 89, 90).
    pub sm: u32,
    /// Number of streaming multiprocessors.
    pub num_sms: u32,
    /// Shared memory a block may use, in bytes (opt-in maximum).
    pub smem_per_block: u32,
}

impl Target {
    /// Ampere: sm_80, 108 multiprocessors (an A100), 163 KiB of shared memory a block.
    pub fn sm80() -> Target {
        Target { sm: 80, num_sms: 108, smem_per_block: 163 * 1024 }
    }
    /// Ada: sm_89, 128 multiprocessors, 99 KiB of shared memory a block.
    pub fn sm89() -> Target {
        Target { sm: 89, num_sms: 128, smem_per_block: 99 * 1024 }
    }
    /// Hopper: sm_90a, 132 multiprocessors (an H100 SXM), 227 KiB of shared memory a
    /// block.
    pub fn sm90a() -> Target {
        Target { sm: 90, num_sms: 132, smem_per_block: 227 * 1024 }
    }
    /// The NVRTC `--gpu-architecture` value: `sm_90a` on Hopper (so that WGMMA/TMA
    /// may be used), `sm_XY` otherwise.
    pub fn arch(&self) -> String {
        if self.sm == 90 {
            "sm_90a".to_string()
        } else {
            format!("sm_{}", self.sm)
        }
    }
}

/// Facts about one tensor argument that change the generated code.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct TensorSpec {
    /// The largest power of two (≤ 16) dividing the data pointer's byte address.
    pub ptr_align: u32,
    /// Per dimension: the largest power of two (≤ 16) dividing the stride in elements;
    /// 0 marks a unit stride (stride == 1) on that dimension.
    pub stride_div: Vec<u32>,
}

/// Specialization facts, computed by the runtime from the actual arguments. Part of the
/// module cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Spec {
    /// Per parameter (in signature order): the tensor facts; `None` for scalars.
    pub tensors: Vec<Option<TensorSpec>>,
    /// Per shape symbol: its value rounded up to a power of two, at most 2^31, which
    /// stands for any larger value (used where the symbol is a full tile extent, to cap
    /// tile sizes for small tensors, and to bound the programs along a grid axis).
    pub shape_pow2: Vec<u32>,
    /// Per shape symbol: the largest power of two dividing its value, capped at its
    /// `shape_pow2` (so `shape_div == shape_pow2` says the value is exactly that power of
    /// two; never for a value above 2^31, whose `shape_pow2` is capped). Empty or
    /// missing entries: unknown (1). A full tile extent whose value is exact needs no
    /// bounds masks (`Schedule::full_exact`). [`shape_facts`] gives both of a value.
    pub shape_div: Vec<u32>,
    /// Per shape symbol: its exact value where the kernel is compiled for it, else 0
    /// (any value). Only symbols that bound a loop, at values up to
    /// [`SMALL_TRIP`] (a filter's taps, a short inner loop): the writer prints the
    /// value, and a loop whose trip count that makes a small constant is unrolled
    /// ([`exact_shapes`] fills it from a launch's shape values).
    pub shape_exact: Vec<u32>,
    /// Per parameter (in signature order): whether every element of the tensor lies
    /// less than 2^31 elements from its first (`Σ (extent − 1) · stride < 2^31`, no
    /// stride negative), so that the offset of coordinates checked to be inside it fits
    /// 32-bit arithmetic (gathered rows are addressed so). Missing or `false`: 64-bit.
    pub offsets32: Vec<bool>,
    /// Tile-size overrides by tile-symbol name (`BN` → 1024); powers of two. The
    /// user's (`KFUSE_TILES`, `Config::tile`) and an autotuner's; nothing else writes here.
    pub tiles: BTreeMap<String, u32>,
    /// Tile sizes a launch's exact shape calls for, by tile-symbol name, where they
    /// differ from what the power-of-two facts above give
    /// (`choose_tiles::exact_shape_tiles` makes them from the exact shape; the cache keys
    /// on them, so codegen stays a function of the spec). [`Spec::tiles`] wins over them.
    pub shape_tiles: BTreeMap<String, u32>,
    /// Threads-per-block override (a power of two, 32..=1024).
    pub threads: Option<u32>,
    /// Override of `__launch_bounds__`'s minimum blocks per multiprocessor (0: none).
    pub min_blocks: Option<u32>,
    /// A grouped launch: one launch runs the programs of several problems (each its
    /// own tensors, shapes and scalars), listed in a table the kernel reads; the other
    /// facts here hold for every problem (`kfuse_runtime::launch_grouped`).
    pub grouped: bool,
    /// Which register-room attempt to compile (`Schedule::register_attempt`; 0 the
    /// first). [`crate::compile_with_fallbacks`] steps through them.
    pub register_attempt: u32,
}

impl Spec {
    /// The size asked for tile symbol `name`: its override ([`Spec::tiles`]), else what
    /// the exact shape calls for ([`Spec::shape_tiles`]); `None` leaves it to the passes.
    pub fn tile(&self, name: &str) -> Option<u32> {
        self.tiles.get(name).or_else(|| self.shape_tiles.get(name)).copied()
    }

    /// The exact value of shape symbol `sym` where the kernel is compiled for it
    /// ([`Spec::shape_exact`]).
    pub fn exact(&self, sym: ShapeSym) -> Option<u64> {
        self.shape_exact.get(sym.0 as usize).copied().filter(|&v| v > 0).map(u64::from)
    }

    /// Whether tensor parameter `p`'s in-bounds offsets fit 32 bits ([`Spec::offsets32`]).
    pub fn offsets32(&self, p: ParamId) -> bool {
        self.offsets32.get(p.0 as usize).copied().unwrap_or(false)
    }

    /// Whether the launch's facts ([`Spec::shape_div`]) say that `t` divides the extent
    /// of shape symbol `sym`.
    pub fn divides(&self, sym: ShapeSym, t: u64) -> bool {
        self.shape_div.get(sym.0 as usize).is_some_and(|&d| t > 0 && d as u64 >= t && (d as u64).is_multiple_of(t))
    }
}

/// The largest shape value a kernel is compiled for exactly ([`Spec::shape_exact`]): a
/// loop of at most this many iterations is unrolled.
pub const SMALL_TRIP: u64 = 16;

/// [`Spec::shape_exact`] for a launch of `k` with shape values `vals` (one a shape
/// symbol): the value of each symbol that is the upper bound of a loop (`for r in 0..R`)
/// and at most [`SMALL_TRIP`], 0 for the others. One kernel a value of such a symbol;
/// each of those runs its loop with a constant trip count.
///
/// # Examples
///
/// ```
/// use kfuse_ir::{Builder, DType, Literal};
/// let mut b = Builder::new("taps");
/// let (r, n) = (b.shape_sym("R"), b.shape_sym("N"));
/// let _x = b.tensor_param("x", DType::F32, &[r, n], false);
/// let (lo, hi, step) = (b.constant(Literal::Int(0), DType::I64), b.shape_dim(r), b.constant(Literal::Int(1), DType::I64));
/// let (id, _, _) = b.begin_for(lo, hi, step, &[]).unwrap();
/// b.end_for(id, &[]).unwrap();
/// assert_eq!(kfuse_codegen::target::exact_shapes(b.kernel(), &[3, 5]), vec![3, 0]);
/// assert_eq!(kfuse_codegen::target::exact_shapes(b.kernel(), &[300, 5]), vec![0, 0]);
/// ```
pub fn exact_shapes(k: &kfuse_ir::Kernel, vals: &[u64]) -> Vec<u32> {
    let mut bounds = vec![false; vals.len()];
    for o in k.ops() {
        if let kfuse_ir::Op::For { .. } = k.op(o) {
            if let kfuse_ir::Op::ShapeDim { sym } = k.op(k.operands(o)[1].op()) {
                if let Some(b) = bounds.get_mut(sym.0 as usize) {
                    *b = true;
                }
            }
        }
    }
    vals.iter().zip(&bounds).map(|(&v, &b)| if b && (1..=SMALL_TRIP).contains(&v) { v as u32 } else { 0 }).collect()
}

/// [`Spec::shape_pow2`] and [`Spec::shape_div`] of a shape value `v`: `v` rounded up to
/// a power of two (at least 1, at most 2^31), and the largest power of two dividing `v`
/// (0 counts as 1), at most that. A value above 2^31 gets at most 2^30 for the second,
/// so that it is never taken for exactly 2^31.
///
/// # Examples
///
/// ```
/// assert_eq!(kfuse_codegen::target::shape_facts(3000), (4096, 8));
/// assert_eq!(kfuse_codegen::target::shape_facts(4096), (4096, 4096)); // exact
/// ```
pub fn shape_facts(v: u64) -> (u32, u32) {
    let v = v.max(1);
    let pow2 = v.next_power_of_two().min(1 << 31);
    let cap = if v > 1 << 31 { 1 << 30 } else { pow2 };
    (pow2 as u32, (1u64 << v.trailing_zeros()).min(cap) as u32)
}

/// The word a kernel divides by `d` with ([`KernelParam::DivMagic`]): for `1 ≤ d < 2^31`,
/// the shift `l = ⌈log2 d⌉` in the high half and the multiplier `m = ⌊2^32 · (2^l − d) / d⌋
/// + 1` (mod 2^32) in the low, so that `n / d = (umulhi(n, m) + n) >> l` for every `0 ≤ n <
/// 2^31` (the round-up method of Granlund and Montgomery, "Division by invariant integers
/// using multiplication", 1994); −1 for any other `d`, where the kernel divides the slow
/// way.
///
/// # Examples
///
/// ```
/// use kfuse_codegen::target::div_magic;
/// let w = div_magic(56);
/// let (m, l) = (w as u64 & 0xffff_ffff, (w >> 32) as u32);
/// for n in [0u64, 55, 56, 3135, (1 << 31) - 1] {
///     assert_eq!((((n * m) >> 32) + n) >> l, n / 56);
/// }
/// assert_eq!(div_magic(0), -1);
/// assert_eq!(div_magic(1 << 31), -1);
/// ```
pub fn div_magic(d: i64) -> i64 {
    if !(1..1i64 << 31).contains(&d) {
        return -1;
    }
    let l = 64 - (d as u64 - 1).leading_zeros() as i64;
    let m = ((1u128 << 32) * ((1u128 << l) - d as u128) / d as u128 + 1) as u64 & 0xffff_ffff;
    (l << 32) | m as i64
}

/// One CUDA kernel parameter, in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KernelParam {
    /// Device pointer to a tensor's first element (byte offset applied).
    Ptr(#[serde(with = "ParamIdDef")] ParamId),
    /// A tensor's stride along a dimension, in elements (`long long`).
    Stride {
        /// The tensor parameter.
        #[serde(with = "ParamIdDef")]
        tensor: ParamId,
        /// Its dimension.
        dim: u32,
    },
    /// The runtime value of a shape symbol (`long long`).
    Shape(#[serde(with = "ShapeSymDef")] ShapeSym),
    /// A scalar parameter (`float` for f32, `long long` for i64).
    Scalar(#[serde(with = "ParamIdDef")] ParamId),
    /// The multiply and shift that divide by the value of an i64 [`KernelParam::Scalar`]
    /// or a [`KernelParam::Shape`] (`long long`, [`div_magic`] of the value): tiles of
    /// coordinates divided by a launch's value take a multiply-high and a shift instead
    /// of a division.
    DivMagic(Box<KernelParam>),
    /// A TMA tensor map of a tensor parameter (`const __grid_constant__ CUtensorMap`,
    /// 128 bytes, passed by value), built by the runtime with `cuTensorMapEncodeTiled`:
    /// the tensor's whole extent and strides, copied in boxes of `box_dims` elements
    /// (one entry per tensor dimension, outermost first, like the tensor's own dims),
    /// shared memory swizzled in `swizzle` bytes (0, 32, 64 or 128); out-of-bounds
    /// elements read as zero. The codegen emits one only when the [`TensorSpec`] says the
    /// innermost (`order[0]`) stride is 1, the other strides are multiples of 16 bytes and the data
    /// pointer is 16-byte aligned; the runtime re-checks and refuses otherwise.
    ///
    /// `order` lists the tensor's dimensions innermost first (the driver's order): its
    /// first entry is the unit-stride dimension, whose box extent spans at most the
    /// swizzle; a transposed view has order `[0, 1]`, a row-major matrix `[1, 0]`.
    TensorMap {
        /// The tensor parameter.
        #[serde(with = "ParamIdDef")]
        tensor: ParamId,
        /// Box extent per tensor dimension, outermost first.
        box_dims: Vec<u32>,
        /// Swizzle span in bytes: 0, 32, 64 or 128.
        swizzle: u32,
        /// The tensor's dimensions, innermost first.
        order: Vec<u32>,
    },
}

/// The serialized form of a [`ParamId`] (a kfuse-ir type): its index.
#[derive(Serialize, Deserialize)]
#[serde(remote = "ParamId")]
struct ParamIdDef(u32);

/// The serialized form of a [`ShapeSym`]: its index.
#[derive(Serialize, Deserialize)]
#[serde(remote = "ShapeSym")]
struct ShapeSymDef(u32);

/// Programs along one grid axis: `ceil(shape(dim) / step)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GridAxisEval {
    /// The shape symbol the axis covers.
    #[serde(with = "ShapeSymDef")]
    pub dim: ShapeSym,
    /// Elements of it a program covers (1: one program per index).
    pub step: u64,
}

/// A compiled-to-source kernel and how to launch it. Serializable, so that the runtime
/// can keep it on disk and launch it in a later process without generating it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmittedKernel {
    /// The `extern "C" __global__` entry point.
    pub entry: String,
    /// The CUDA C++ source: self-contained, no headers needed.
    pub source: String,
    /// `--gpu-architecture` for NVRTC.
    pub arch: String,
    /// Further NVRTC options.
    pub options: Vec<String>,
    /// Threads a block.
    pub block_threads: u32,
    /// Dynamic shared memory in bytes.
    pub smem_bytes: u32,
    /// The entry point's parameters, in order.
    pub params: Vec<KernelParam>,
    /// A grouped launch (`Spec::grouped`): the kernel takes `(const long long* kf_grp,
    /// long long kf_ngrp)` instead of `params`; `kf_grp` holds one record of
    /// [`group_record_words`] 64-bit words per problem: its grid (3 words), the number of
    /// programs before it, then one word per entry of `params` (pointers, strides and
    /// shapes as integers, an f32 scalar in the low 32 bits).
    pub grouped: bool,
    /// One entry per grid axis in use (x, y, z); empty means a single program.
    pub grid: Vec<GridAxisEval>,
    /// Blocks per thread-block cluster along x (1: no clusters); the launch grid's x
    /// is the program count times this.
    pub cluster_x: u32,
    /// A persistent kernel: at most this many programs (clusters, when `cluster_x > 1`)
    /// are launched along x — times the blocks one multiprocessor holds at once, for a
    /// kernel without clusters ([`EmittedKernel::grid_dims_resident`]) — and each walks
    /// the program ids itself (`grid` still gives the total).
    pub persistent: Option<u32>,
    /// The scheduled IR, printed (for snapshots and debugging).
    pub ir: String,
    /// The chosen tile sizes by name, for reports.
    pub tiles: BTreeMap<String, u32>,
    /// Which register-room attempt this is (0-based) and how many the kernel has
    /// (`Schedule::register_attempt`): when the assembler spills this one and a later
    /// one exists, [`crate::compile_with_fallbacks`] compiles that instead.
    pub register_attempt: (u32, u32),
    /// What the passes decided, for reports ([`crate::Plan`]; registers unknown until a
    /// kernel is assembled). A hand-written kernel may leave it `Plan::default()`.
    pub plan: crate::Plan,
}

impl EmittedKernel {
    /// Programs along each grid axis for concrete shapes (x, y, z; 1 for an axis not in
    /// use), before a persistent kernel folds them into its walk: what a grouped
    /// launch's records hold.
    pub fn programs(&self, shapes: &[u64]) -> [u64; 3] {
        let mut g = [1u64; 3];
        for (i, a) in self.grid.iter().enumerate() {
            g[i] = shapes[a.dim.0 as usize].div_ceil(a.step.max(1));
        }
        g
    }

    /// The launch grid for concrete shape-symbol values (indexed by `ShapeSym`).
    pub fn grid_dims(&self, shapes: &[u64]) -> [u64; 3] {
        self.grid_dims_resident(shapes, 0)
    }

    /// [`EmittedKernel::grid_dims`] given what the device holds of this kernel at once
    /// (the driver's occupancy; 0: unknown): blocks per multiprocessor without clusters
    /// (it multiplies the persistent program count), clusters per device with them (it
    /// caps the count). Either way every launched block is resident, and none of a
    /// persistent grid waits for a second wave.
    pub fn grid_dims_resident(&self, shapes: &[u64], resident: u32) -> [u64; 3] {
        let mut g = self.programs(shapes);
        if let Some(p) = self.persistent {
            let total: u64 = g.iter().product();
            let cap = match (self.cluster_x > 1, resident) {
                (_, 0) => p as u64,
                (false, r) => p as u64 * r as u64,
                (true, r) => (p as u64).min(r as u64),
            };
            g = [total.min(cap), 1, 1];
        }
        g[0] *= self.cluster_x.max(1) as u64;
        g
    }
}

/// Words of one problem's record in a grouped launch's table (see
/// [`EmittedKernel::grouped`]): grid (3), programs before it (1), one per parameter.
pub fn group_record_words(params: &[KernelParam]) -> usize {
    4 + params.len()
}

#[cfg(test)]
mod tests {
    use super::{div_magic, shape_facts};

    /// `n / d` as a kernel computes it from [`div_magic`]'s word (32-bit registers).
    fn divide(n: u32, w: i64) -> u32 {
        let (m, l) = (w as u32, (w >> 32) as u32);
        let hi = ((n as u64 * m as u64) >> 32) as u32;
        (hi + n) >> l
    }

    #[test]
    fn div_magic_divides_every_numerator_below_2_pow_31() {
        // divisors of every magnitude, powers of two and their neighbours among them;
        // numerators near 0, near multiples of the divisor, near 2^31, and pseudo-random
        let mut divisors: Vec<i64> = (1..=300).collect();
        for b in 1..31 {
            divisors.extend([(1 << b) - 1, 1 << b, (1 << b) + 1]);
        }
        divisors.extend([3136, 12544, 1_000_003, (1 << 31) - 1]);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for &d in &divisors {
            let w = div_magic(d);
            assert!(w >= 0, "{d}");
            let mut ns: Vec<u32> = vec![0, 1, (1 << 31) - 1, (1 << 31) - 2];
            for q in [1u64, 2, 7, 1000] {
                let m = q * d as u64;
                ns.extend([m.saturating_sub(1), m, m + 1].iter().filter(|&&v| v < 1 << 31).map(|&v| v as u32));
            }
            for _ in 0..200 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ns.push((x >> 33) as u32);
            }
            for n in ns {
                assert_eq!(divide(n, w), n / d as u32, "{n} / {d}");
            }
        }
        for d in [0, -1, -56, 1 << 31, i64::MAX] {
            assert_eq!(div_magic(d), -1, "{d}");
        }
    }

    #[test]
    fn shape_facts_round_up_and_divide() {
        assert_eq!(shape_facts(0), (1, 1));
        assert_eq!(shape_facts(12), (16, 4));
        assert_eq!(shape_facts(4096), (4096, 4096));
        assert_eq!(shape_facts(1 << 31), (1 << 31, 1 << 31), "2^31 exactly");
        // past 2^31 the power of two is capped and never claimed exact
        assert_eq!(shape_facts((1 << 31) + 7), (1 << 31, 1));
        assert_eq!(shape_facts(1 << 32), (1 << 31, 1 << 30));
        assert_eq!(shape_facts(3 << 31), (1 << 31, 1 << 30));
    }
}

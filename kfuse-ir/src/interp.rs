//! The CPU interpreter: runs any kernel the IR can express, on tensors in host memory.
//!
//! It is the reference semantics of the language: the tests of every op compare against
//! it, and the CUDA writer of `kfuse-codegen` implements the same rules. Everything
//! below is normative.
//!
//! # Arguments
//!
//! [`run`] takes one [`Arg`] per entry of [`Kernel::params`], in order: an input tensor
//! parameter takes [`Arg::In`], an output tensor parameter (`&mut Tensor`) takes
//! [`Arg::Out`], a scalar parameter takes [`Arg::Scalar`]. A tensor is a strided view of
//! little-endian elements of its dtype: element `(i0, i1, …)` lives at element index
//! `offset + Σ i_d * strides[d]` of `data` (strides and offset count elements, not
//! bytes; strides may be negative or zero). The dtype and rank must match the
//! parameter's, and the whole view must lie inside `data`.
//!
//! # Symbols and extents
//!
//! - A shape symbol's value is the size of every tensor dimension the parameters name
//!   with it; dimensions sharing a symbol must agree.
//! - Tile extents: `Extent::Const(c)` is `c`; `Extent::Tile(t)` is, in this order,
//!   [`Options::tiles`]`[name of t]` when given, `k.schedule.tiles[t]` when the scheduler
//!   recorded it, else [`Options::default_tile`] (a zero tile size is an error; an entry
//!   of [`Options::tiles`] naming no tile symbol of the kernel is ignored, as the GPU
//!   path ignores such `KFUSE_TILES` entries); `Extent::Full(s)` is the runtime value of
//!   `s`, exactly (the GPU pads it to a power of two and masks the rest, which gives the
//!   same results).
//!
//! # Grid and order of execution
//!
//! The grid comes from [`crate::grid::derive`], evaluated with the values above. Every
//! combination of program ids runs once (axis 0 varies fastest); a grid axis of size 0
//! runs nothing; a kernel without `program_id` runs one program. Within a program the
//! ops run in [`Kernel::order`]. Programs run one after another, but a kernel whose
//! result depends on that order (two programs storing to one element, or one program
//! loading what another stores) has no defined result on the GPU.
//!
//! # Values and masking
//!
//! A value is a tile: a concrete shape, row-major `f64` data holding values exactly
//! representable in its dtype, and for each axis a *valid range* `[lo, hi)`. The valid
//! lanes are the rectangle of those ranges; a tile with one empty range has no valid
//! lane. A rank-0 value (a scalar) is always valid. What an invalid lane holds is never
//! observable: no op lets it reach memory or a valid lane.
//!
//! - `Load`: for a tile axis taken from tensor dimension `d` (size `n`) at offset `o`
//!   with extent `E`, the valid range is `[max(0, -o), min(E, n - o))` clamped to
//!   `[0, E]`, i.e. the lanes `i` with `0 <= o + i < n`. An `AccessDim::Index` dimension
//!   whose offset is outside `[0, n)` makes every range empty. Invalid lanes are not read
//!   and hold `0.0`. A rank-0 load (every dimension indexed) out of range reads nothing
//!   and gives the valid scalar `0` — the masked-load default.
//! - A gathered access ([`AccessDim::Gather`]): its gathered axis is valid where its
//!   index tiles are; a lane whose gathered coordinate falls outside its dimension loads
//!   as a valid `0` and is not stored.
//! - `Store`: writes the lanes that are valid in the value *and* inside the tensor
//!   (same rule as `Load`); an out-of-range `Index` dimension writes nothing.
//! - `Unary`, `Binary`, `Select`, `Cast`: lane by lane; the valid range of each axis is
//!   the intersection of the operands' ranges.
//! - `Broadcast` (numpy, right-aligned): new leading axes are valid on `[0, E)`; an
//!   extent-1 axis widened to `E` is valid on `[0, E)` if lane 0 was valid on it, else on
//!   nothing; an axis of equal extent keeps its range.
//! - `Reduce` over an axis: only the valid lanes of that axis take part; the result's
//!   ranges are the other axes' ranges (with `keep_dim` the kept axis is valid on
//!   `[0, 1)`). Floats: `sum` accumulates in `f64`, then rounds to the dtype; `max`/`min`
//!   fold IEEE maxNum/minNum from `-inf`/`+inf` (a NaN lane is ignored, as with CUDA's
//!   `fmaxf`; so a row of only NaNs gives `-inf`/`+inf`); `mean` is the `f64` sum divided
//!   by the number of valid lanes, rounded. With no valid lane: `sum` 0, `max` `-inf`,
//!   `min` `+inf`, `mean` NaN. On `i64`: exact (wrapping) integer sum, `mean` divides
//!   truncating toward zero, and with no valid lane `max` is `i64::MIN`, `min`
//!   `i64::MAX`, `mean` 0.
//! - `Permute` permutes the ranges with the axes; `Convert` is the identity.
//! - `Iota { extent }`: the `i64` tile `[0, 1, …, E - 1]` (`E` the extent's value, see
//!   above), valid on `[0, E)`.
//! - `ExpandDims { axis }`: the operand's data unchanged (a row-major tile keeps its
//!   order when an extent-1 axis is inserted); the new axis is valid on `[0, 1)` and the
//!   other axes keep their ranges (a scalar operand gives a `[1]` tile valid on `[0, 1)`).
//! - `Dot` of `a: [M, K]` and `b: [K, N]`: lane `(m, n)` is `Σ_k a[m, k] · b[k, n]` over
//!   the `k` valid in *both* operands (`a`'s axis-1 range met with `b`'s axis-0 range),
//!   each product and the sum in `f64` (ascending `k`), rounded to `f32` once at the
//!   end; no valid `k` gives 0. The result is valid on `a`'s axis-0 range × `b`'s axis-1
//!   range. With `DotPrecision::Tf32` each operand element is first read as TF32 (the
//!   low 13 bits of its f32 mantissa cleared, [`crate::DotPrecision::operand`]), as the
//!   tensor cores read f32 data; the products of those are exact in `f64`.
//!
//! # Loops
//!
//! `For { id, carried }` reads `lo`, `hi`, `step` (its first three operands); a `step`
//! of 0 or less is an error. If `lo < hi`, the body runs with `LoopIndex = lo` and each
//! `LoopCarried` equal to its init; at the `Yield` the index becomes `i + step`
//! (computed without overflow) and, while it is below `hi`, the body runs again with
//! each `LoopCarried` equal to the value yielded for it; otherwise each `LoopResult` is
//! the value yielded for it and execution goes on after the `Yield`. If `lo >= hi` the
//! body does not run and each `LoopResult` is its init. Carried values keep their valid
//! ranges (and their data) unchanged as they pass from one iteration to the next, like
//! any value; loops nest, and an inner loop runs in full at each iteration of the outer
//! one.
//!
//! # Arithmetic
//!
//! Every result is rounded to its dtype with [`DType::round`].
//! - Floats (`f32`, `f16`, `bf16`, `f8e4m3`, `f8e5m2`) compute in `f32`: operands converted to `f32`, the
//!   op done in `f32`, the result rounded to the dtype (so a `bf16` add is
//!   `round_bf16(a as f32 + b as f32)`). `exp`, `ln`, `sqrt`, `tanh`, `sin`, `cos` are
//!   Rust's `f32` functions; `rsqrt(x) = 1 / sqrt(x)`, `sigmoid(x) = 1 / (1 + exp(-x))`, both in `f32`;
//!   `erf` is `libm::erff`. `max`/`min` are maxNum/minNum (a NaN operand is ignored
//!   unless both are NaN).
//! - `i64`: exact two's-complement arithmetic (wrapping on overflow); `div` truncates
//!   toward zero, `rem` has the sign of the dividend (Rust's `%`); division or remainder
//!   by zero on a valid lane is an error.
//! - Comparisons give `bool` (1 or 0); `select(c, a, b)` is `a` where `c`, else `b`.
//! - `Cast`: float → float rounds to nearest even; float → `i64` truncates toward zero,
//!   saturating, NaN → 0 (like PTX `cvt.rzi`); `i64`/`bool` → float converts; anything →
//!   `bool` is `x != 0`.
//! - `ScalarParam` is the [`Arg::Scalar`] value rounded to the parameter's dtype;
//!   `ShapeDim` the symbol's value; `TileExtent` the extent's value (see above);
//!   `ProgramId` this program's index; `Const` the literal, rounded to its dtype.

use std::collections::BTreeMap;

use crate::dtype::DType;
use crate::error::{IrError, Result};
use crate::kernel::*;

/// An input tensor argument: little-endian elements of `dtype`, a strided view.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// The element type (the parameter's).
    pub dtype: DType,
    /// The size of each dimension.
    pub shape: &'a [usize],
    /// Element strides, one per dimension.
    pub strides: &'a [isize],
    /// Element index of element `(0, 0, …)` in `data`.
    pub offset: usize,
    /// The storage: little-endian elements of `dtype`.
    pub data: &'a [u8],
}

/// An output tensor argument; the same view as [`TensorRef`], writable.
#[derive(Debug)]
pub struct TensorMut<'a> {
    /// The element type (the parameter's).
    pub dtype: DType,
    /// The size of each dimension.
    pub shape: &'a [usize],
    /// Element strides, one per dimension.
    pub strides: &'a [isize],
    /// Element index of element `(0, 0, …)` in `data`.
    pub offset: usize,
    /// The storage the kernel writes: little-endian elements of `dtype`.
    pub data: &'a mut [u8],
}

/// One argument of [`run`], per entry of [`Kernel::params`], in the same order.
#[derive(Debug)]
pub enum Arg<'a> {
    /// An input tensor parameter.
    In(TensorRef<'a>),
    /// An output tensor parameter (`&mut Tensor`).
    Out(TensorMut<'a>),
    /// A scalar parameter, rounded to the parameter's dtype.
    Scalar(f64),
}

/// Interpreter settings. `Options::default()` is `default_tile` 16 and no `tiles`.
#[derive(Clone, Debug)]
pub struct Options {
    /// The value of a tile symbol neither [`Options::tiles`] nor the schedule sets.
    pub default_tile: u32,
    /// Tile sizes by tile-symbol name (`"BM" → 64`), winning over the schedule's and
    /// [`Options::default_tile`]: run a kernel with the tiles a GPU plan chose (the
    /// runtime's `gpu_plan_tiles`) or any others. Names that are no tile symbol of the
    /// kernel are ignored; sizes need not be powers of two here (the GPU's must be).
    pub tiles: BTreeMap<String, u32>,
}

impl Default for Options {
    fn default() -> Options {
        Options { default_tile: 16, tiles: BTreeMap::new() }
    }
}

impl Options {
    /// The default options with `tiles` by name (see [`Options::tiles`]).
    pub fn with_tiles(tiles: BTreeMap<String, u32>) -> Options {
        Options { tiles, ..Options::default() }
    }
}

/// Row-major (C-contiguous) element strides of a shape: a convenience for building
/// [`TensorRef`]s and [`TensorMut`]s of dense buffers.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc = acc.wrapping_mul(shape[i] as isize);
    }
    s
}

fn err(msg: impl Into<String>) -> IrError {
    IrError::Interp(msg.into())
}

/// A tensor argument's view, without its data.
struct View {
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: isize,
    dtype: DType,
}

/// A gathered dimension of an access: its position among the dimensions, its stride and
/// its size.
#[derive(Clone, Copy, Debug)]
struct Gathered {
    dim: usize,
    stride: isize,
    size: usize,
}

/// A runtime value; see the module docs.
#[derive(Clone, Debug, Default)]
struct Val {
    data: Vec<f64>,
    valid: Vec<(usize, usize)>,
}

/// What one op does, with everything that does not depend on the program id resolved.
enum Kind<'k> {
    /// A value computed once, before the first program (constants, parameters, shapes).
    Fixed,
    Pid(usize),
    /// `xstrides`: the tensor's stride per tile axis (0 on a gathered one); `gather`:
    /// per gathered dimension its position, stride and size.
    Load { param: usize, dims: &'k [AccessDim], xstrides: Vec<isize>, gather: Vec<Gathered> },
    Store { param: usize, dims: &'k [AccessDim], xstrides: Vec<isize>, gather: Vec<Gathered>, shape: Vec<usize>, strides: Vec<isize> },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast { from: DType },
    Reduce { op: ReduceOp, axis: usize, keep_dim: bool },
    /// Operand strides per result axis (0 on new and widened axes), and per result axis
    /// the operand axis it comes from and whether it is widened.
    Broadcast { src_strides: Vec<isize>, src_axis: Vec<Option<(usize, bool)>> },
    /// Operand strides in result axis order.
    Permute { src_strides: Vec<isize>, perm: Vec<usize> },
    ExpandDims { axis: usize },
    Convert,
    /// Opens a loop; positions (in `order`, which index `vals`) of its index, carried
    /// and result values, of its `Yield`, and the loop's slot in the loop state.
    For { id: LoopId, slot: usize, yield_pos: usize, index: Option<usize>, carried: Vec<Option<usize>>, results: Vec<Option<usize>> },
    /// Closes the loop whose `For` is at `for_pos`.
    Yield { for_pos: usize },
    /// `LoopIndex`, `LoopCarried`, `LoopResult`: written by their `For` and `Yield`.
    LoopValue,
    Dot { precision: DotPrecision },
}

struct Step<'k> {
    kind: Kind<'k>,
    args: Vec<usize>,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    len: usize,
}

/// Runs `k` on `args` (one per parameter); see the module docs for the semantics.
///
/// Errors: the kernel is verified first ([`IrError::Verify`] for a broken graph); grid
/// derivation errors ([`IrError::Grid`]) pass through; everything else is
/// [`IrError::Interp`]: argument count, kind, dtype or rank unlike the parameter's, a view
/// reaching outside its buffer, one shape symbol with two sizes, a tile size of 0, an
/// `i64` division by zero, a loop whose step is 0 or less.
///
/// # Examples
///
/// `out[r] = sum(x[r, :])`, one program per row, on a 2 × 3 `f32` matrix:
///
/// ```
/// use kfuse_ir::interp::{contiguous_strides, run, Arg, Options, TensorMut, TensorRef};
/// use kfuse_ir::{AccessDim, Builder, DType, Extent, ReduceOp};
///
/// let mut b = Builder::new("row_sums");
/// let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
/// let x = b.tensor_param("x", DType::F32, &[m, n], false);
/// let out = b.tensor_param("out", DType::F32, &[m], true);
/// let row = b.program_id(0)?;
/// let zero = b.constant(kfuse_ir::Literal::Int(0), DType::I64);
/// let xs = b.load(x, &[row, zero], &[AccessDim::Index, AccessDim::Tile(Extent::Full(n))])?;
/// let s = b.reduce(ReduceOp::Sum, xs, -1, false)?;
/// b.store(out, &[row], &[AccessDim::Index], s)?;
/// let k = b.finish()?;
///
/// let data: Vec<u8> = [1f32, 2., 3., 4., 5., 6.].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let mut sums = vec![0u8; 2 * 4];
/// let (xs, os) = ([2, 3], [2]);
/// let (xst, ost) = (contiguous_strides(&xs), contiguous_strides(&os));
/// run(&k, &mut [
///     Arg::In(TensorRef { dtype: DType::F32, shape: &xs, strides: &xst, offset: 0, data: &data }),
///     Arg::Out(TensorMut { dtype: DType::F32, shape: &os, strides: &ost, offset: 0, data: &mut sums }),
/// ], &Options::default())?;
/// assert_eq!((DType::F32.read(&sums, 0), DType::F32.read(&sums, 1)), (6.0, 15.0));
/// # Ok::<(), kfuse_ir::IrError>(())
/// ```
pub fn run(k: &Kernel, args: &mut [Arg<'_>], opts: &Options) -> Result<()> {
    crate::verify::verify(k, "interp")?;
    let (views, syms) = bind_args(k, args)?;
    let sym_val = |s: ShapeSym| -> Result<usize> {
        syms.get(s.0 as usize).copied().flatten().ok_or_else(|| {
            let name = k.shape_syms.get(s.0 as usize).map(String::as_str).unwrap_or("?");
            err(format!("shape symbol `{name}` is used but no tensor argument gives it a value"))
        })
    };
    // each tile symbol's size: the options' by name, else the schedule's, else the default
    let tiles: Vec<u32> = (0..k.tile_syms.len())
        .map(|i| {
            let t = TileSym(i as u32);
            opts.tiles.get(k.tile_name(t)).or_else(|| k.schedule.tiles.get(&t)).copied().unwrap_or(opts.default_tile)
        })
        .collect();
    let extent = |e: Extent| -> Result<usize> {
        match e {
            Extent::Const(c) => Ok(c as usize),
            Extent::Tile(t) => {
                let v = tiles.get(t.0 as usize).copied().ok_or_else(|| err(format!("tile symbol #{} is not declared by the kernel", t.0)))?;
                if v == 0 {
                    return Err(err(format!("tile symbol `{}` has size 0", k.tile_name(t))));
                }
                Ok(v as usize)
            }
            Extent::Full(s) => sym_val(s),
        }
    };

    // The grid.
    let g = crate::grid::derive(k)?;
    for a in &g.axes {
        sym_val(a.dim)?;
        if let Some(e) = a.step {
            extent(e)?;
        }
    }
    let grid = g.eval(|s| sym_val(s).unwrap_or(0) as u64, |e| extent(e).unwrap_or(1) as u64);

    // The plan: one step per op, in program order.
    let pos: std::collections::HashMap<OpId, usize> = k.order.iter().enumerate().map(|(i, o)| (*o, i)).collect();
    let mut loop_slots = 0usize;
    let mut steps: Vec<Step> = Vec::with_capacity(k.order.len());
    let mut vals: Vec<Val> = vec![Val::default(); k.order.len()];
    for (p, &op) in k.order.iter().enumerate() {
        let node = k.node(op);
        let operands: Vec<usize> = k.operands(op).iter().map(|v| pos[&v.op()]).collect();
        let (dtype, shape) = match &node.ty {
            Some(t) => (t.dtype, t.shape.iter().map(|e| extent(*e)).collect::<Result<Vec<_>>>()?),
            None => (DType::Bool, Vec::new()),
        };
        let strides = contiguous_strides(&shape);
        let len = shape.iter().product();
        let tile_strides = |param: usize, dims: &[AccessDim]| -> (Vec<isize>, Vec<Gathered>) {
            let v = views[param].as_ref().expect("tensor parameter has a view");
            let mut xs = Vec::new();
            let mut gather = Vec::new();
            for (d, (ad, &st)) in dims.iter().zip(&v.strides).enumerate() {
                match ad {
                    AccessDim::Index => {}
                    AccessDim::Tile(_) => xs.push(st),
                    AccessDim::Gather(_) => {
                        if gather.is_empty() {
                            xs.push(0);
                        }
                        gather.push(Gathered { dim: d, stride: st, size: v.shape[d] });
                    }
                }
            }
            (xs, gather)
        };
        let fixed = |v: f64| Val { data: vec![v], valid: Vec::new() };
        let kind = match &node.op {
            Op::ProgramId { axis } => Kind::Pid(*axis as usize),
            Op::ScalarParam { param } => {
                let Arg::Scalar(v) = args[param.0 as usize] else { unreachable!("checked by bind_args") };
                vals[p] = fixed(dtype.round(v));
                Kind::Fixed
            }
            Op::ShapeDim { sym } => {
                vals[p] = fixed(sym_val(*sym)? as f64);
                Kind::Fixed
            }
            Op::TileExtent { extent: e } => {
                vals[p] = fixed(extent(*e)? as f64);
                Kind::Fixed
            }
            Op::Const { value } => {
                vals[p] = fixed(dtype.round(value.as_f64()));
                Kind::Fixed
            }
            Op::Load { tensor, dims } => {
                let param = tensor.0 as usize;
                let (xstrides, gather) = tile_strides(param, dims);
                Kind::Load { param, dims, xstrides, gather }
            }
            Op::Store { tensor, dims } => {
                let param = tensor.0 as usize;
                let vshape = steps[operands[dims.len()]].shape.clone();
                let vstrides = contiguous_strides(&vshape);
                let (xstrides, gather) = tile_strides(param, dims);
                Kind::Store { param, dims, xstrides, gather, shape: vshape, strides: vstrides }
            }
            Op::Unary(u) => Kind::Unary(*u),
            Op::Binary(b) => Kind::Binary(*b),
            Op::Select => Kind::Select,
            Op::Cast { .. } => Kind::Cast { from: steps[operands[0]].dtype },
            Op::Reduce { op, axis, keep_dim } => Kind::Reduce { op: *op, axis: *axis as usize, keep_dim: *keep_dim },
            Op::Broadcast => {
                let src = &steps[operands[0]];
                let off = shape.len() - src.shape.len();
                let mut src_strides = vec![0isize; shape.len()];
                let mut src_axis = vec![None; shape.len()];
                for (j, &e) in src.shape.iter().enumerate() {
                    let i = off + j;
                    if e == shape[i] {
                        src_strides[i] = src.strides[j];
                        src_axis[i] = Some((j, false));
                    } else if e == 1 {
                        src_axis[i] = Some((j, true));
                    } else {
                        return Err(err(format!("broadcast of extent {e} to {} on axis {i}", shape[i])));
                    }
                }
                Kind::Broadcast { src_strides, src_axis }
            }
            Op::Permute { perm } => {
                let src = &steps[operands[0]];
                let perm: Vec<usize> = perm.iter().map(|&a| a as usize).collect();
                Kind::Permute { src_strides: perm.iter().map(|&a| src.strides[a]).collect(), perm }
            }
            Op::Iota { .. } => {
                vals[p] = Val { data: (0..len).map(|i| i as f64).collect(), valid: vec![(0, len)] };
                Kind::Fixed
            }
            Op::ExpandDims { axis } => Kind::ExpandDims { axis: *axis as usize },
            Op::Convert => Kind::Convert,
            Op::For { id, .. } => {
                let info = k.loop_info(*id).expect("verified: every loop has a for and a yield");
                let at = |v: Option<ValueId>| v.map(|v| pos[&v.op()]);
                loop_slots += 1;
                Kind::For {
                    id: *id,
                    slot: loop_slots - 1,
                    yield_pos: info.yield_pos,
                    index: at(info.index),
                    carried: info.carried_values.iter().map(|v| at(*v)).collect(),
                    results: info.results.iter().map(|v| at(*v)).collect(),
                }
            }
            Op::Yield { id } => Kind::Yield { for_pos: k.loop_body(*id).expect("verified").0 },
            Op::LoopIndex { .. } | Op::LoopCarried { .. } | Op::LoopResult { .. } => Kind::LoopValue,
            Op::Dot { precision } => Kind::Dot { precision: *precision },
        };
        steps.push(Step { kind, args: operands, dtype, shape, strides, len });
    }

    // Run every program.
    if grid.contains(&0) {
        return Ok(());
    }
    let mut pid = vec![0u64; grid.len()];
    let mut loops = vec![LoopState::default(); loop_slots];
    loop {
        run_program(&steps, &mut vals, &mut loops, args, &views, &pid)?;
        let mut a = 0;
        loop {
            if a == pid.len() {
                return Ok(());
            }
            pid[a] += 1;
            if pid[a] < grid[a] {
                break;
            }
            pid[a] = 0;
            a += 1;
        }
    }
}

/// Checks the arguments against the parameters; returns the tensor views (by parameter)
/// and the value of each shape symbol.
#[allow(clippy::type_complexity)]
fn bind_args(k: &Kernel, args: &[Arg<'_>]) -> Result<(Vec<Option<View>>, Vec<Option<usize>>)> {
    if args.len() != k.params.len() {
        return Err(err(format!("kernel `{}` has {} parameters but {} arguments were given", k.name, k.params.len(), args.len())));
    }
    let mut views = Vec::with_capacity(args.len());
    let mut syms: Vec<Option<(usize, String)>> = vec![None; k.shape_syms.len()];
    for (p, a) in k.params.iter().zip(args) {
        let kind_name = |a: &Arg| match a {
            Arg::In(_) => "an input tensor (Arg::In)",
            Arg::Out(_) => "an output tensor (Arg::Out)",
            Arg::Scalar(_) => "a scalar (Arg::Scalar)",
        };
        let (dtype, shape, strides, offset, data_len) = match (&p.kind, a) {
            (ParamKind::Scalar, Arg::Scalar(_)) => {
                views.push(None);
                continue;
            }
            (ParamKind::Tensor { output: false, .. }, Arg::In(t)) => (t.dtype, t.shape, t.strides, t.offset, t.data.len()),
            (ParamKind::Tensor { output: true, .. }, Arg::Out(t)) => (t.dtype, t.shape, t.strides, t.offset, t.data.len()),
            (kind, a) => {
                let want = match kind {
                    ParamKind::Scalar => "a scalar (Arg::Scalar)",
                    ParamKind::Tensor { output: false, .. } => "an input tensor (Arg::In)",
                    ParamKind::Tensor { output: true, .. } => "an output tensor (Arg::Out)",
                };
                return Err(err(format!("parameter `{}` takes {want}, but the argument is {}", p.name, kind_name(a))));
            }
        };
        if dtype != p.dtype {
            return Err(err(format!("parameter `{}` has dtype {}, but the argument has dtype {dtype}", p.name, p.dtype)));
        }
        let dims = p.dims();
        if shape.len() != dims.len() {
            return Err(err(format!("parameter `{}` has rank {}, but the argument has shape {shape:?}", p.name, dims.len())));
        }
        if strides.len() != shape.len() {
            return Err(err(format!("argument `{}` has shape {shape:?} but {} strides", p.name, strides.len())));
        }
        // The whole view must lie inside the buffer.
        if shape.iter().all(|&d| d > 0) {
            let (mut lo, mut hi) = (offset as i128, offset as i128);
            for (&d, &s) in shape.iter().zip(strides) {
                let span = (d as i128 - 1) * s as i128;
                if span < 0 {
                    lo += span;
                } else {
                    hi += span;
                }
            }
            let size = dtype.size_bytes() as i128;
            if lo < 0 || (hi + 1) * size > data_len as i128 {
                return Err(err(format!(
                    "argument `{}` (shape {shape:?}, strides {strides:?}, offset {offset}) reaches elements {lo}..={hi} \
                     of a buffer of {} {dtype} elements",
                    p.name,
                    data_len as i128 / size
                )));
            }
        }
        for (d, (&s, &n)) in dims.iter().zip(shape).enumerate() {
            let slot = syms
                .get_mut(s.0 as usize)
                .ok_or_else(|| err(format!("parameter `{}` names an unknown shape symbol #{}", p.name, s.0)))?;
            match slot {
                None => *slot = Some((n, format!("{}.shape[{d}]", p.name))),
                Some((m, other)) if *m != n => {
                    return Err(err(format!(
                        "shape symbol `{}` is {m} in {other} but {n} in {}.shape[{d}]",
                        k.shape_name(s),
                        p.name
                    )))
                }
                Some(_) => {}
            }
        }
        views.push(Some(View { shape: shape.to_vec(), strides: strides.to_vec(), offset: offset as isize, dtype }));
    }
    Ok((views, syms.into_iter().map(|s| s.map(|(n, _)| n)).collect()))
}

/// The valid range of a tile axis of extent `e` at offset `o` in a dimension of size `n`.
fn axis_range(o: i64, e: usize, n: usize) -> (usize, usize) {
    let (o, e, n) = (o as i128, e as i128, n as i128);
    let lo = (-o).clamp(0, e);
    let hi = (n - o).clamp(0, e);
    if hi > lo {
        (lo as usize, hi as usize)
    } else {
        (0, 0)
    }
}

fn meet(a: (usize, usize), b: (usize, usize)) -> (usize, usize) {
    let (lo, hi) = (a.0.max(b.0), a.1.min(b.1));
    if hi > lo {
        (lo, hi)
    } else {
        (0, 0)
    }
}

/// The scalar offsets of an access into `offs` (0 for a gathered dimension, whose
/// coordinates come per lane).
fn gather_offsets(offs: &mut Vec<i64>, args: &[usize], vals: &[Val], dims: &[AccessDim]) {
    offs.clear();
    offs.extend(args.iter().zip(dims).map(|(&o, d)| if d.is_gather() { 0 } else { vals[o].data[0] as i64 }));
}

/// The index tiles of a gathered access, their valid ranges met into `ranges`.
fn gather_ranges<'v>(gather: &[Gathered], args: &[usize], vals: &'v [Val], ranges: &mut [(usize, usize)]) -> Vec<&'v [f64]> {
    gather
        .iter()
        .map(|g| {
            let v = &vals[args[g.dim]];
            for (r, vr) in ranges.iter_mut().zip(&v.valid) {
                *r = meet(*r, *vr);
            }
            &v.data[..]
        })
        .collect()
}

/// Calls `f(t, x)` for every lane `t` (row-major index) of the rectangle `ranges` of a
/// gathered access: `x` is the lane's element in the tensor, `None` where a gathered
/// coordinate falls outside its dimension.
fn for_each_lane(
    ranges: &[(usize, usize)],
    strides: &[isize],
    xstrides: &[isize],
    base: isize,
    gather: &[Gathered],
    idx: &[&[f64]],
    mut f: impl FnMut(usize, Option<isize>),
) {
    let ts = strides.last().copied().unwrap_or(0);
    let xs = xstrides.last().copied().unwrap_or(0);
    for_each_row(ranges, [strides, xstrides], |[tb, xb], n| {
        let (mut t, mut x) = (tb, base.wrapping_add(xb));
        for _ in 0..n {
            let mut at = Some(x);
            for (g, v) in gather.iter().zip(idx) {
                let c = v[t as usize] as i64;
                at = match at {
                    Some(a) if c >= 0 && (c as u64) < g.size as u64 => Some(a.wrapping_add((c as isize).wrapping_mul(g.stride))),
                    _ => None,
                };
            }
            f(t as usize, at);
            t += ts;
            x += xs;
        }
    });
}

fn is_empty(r: &[(usize, usize)]) -> bool {
    r.iter().any(|&(lo, hi)| hi <= lo)
}

/// Calls `f(bases, n)` for every run of the rectangle `ranges` along its last axis:
/// `bases[k]` is the linear index of the run's first lane under `strides[k]`, `n` its
/// length. A rank-0 rectangle is one run of one lane at 0; an empty one has no runs.
fn for_each_row<const N: usize>(ranges: &[(usize, usize)], strides: [&[isize]; N], mut f: impl FnMut([isize; N], usize)) {
    if is_empty(ranges) {
        return;
    }
    let r = ranges.len();
    if r == 0 {
        f([0; N], 1);
        return;
    }
    let outer = r - 1;
    let (ilo, ihi) = ranges[outer];
    let mut idx: Vec<usize> = ranges[..outer].iter().map(|r| r.0).collect();
    loop {
        let mut bases = [0isize; N];
        for (b, s) in bases.iter_mut().zip(strides) {
            let mut v = (ilo as isize).wrapping_mul(s[outer]);
            for a in 0..outer {
                v = v.wrapping_add((idx[a] as isize).wrapping_mul(s[a]));
            }
            *b = v;
        }
        f(bases, ihi - ilo);
        let mut a = outer;
        loop {
            if a == 0 {
                return;
            }
            a -= 1;
            idx[a] += 1;
            if idx[a] < ranges[a].1 {
                break;
            }
            idx[a] = ranges[a].0;
        }
    }
}

fn full_ranges(shape: &[usize], out: &mut Vec<(usize, usize)>) {
    out.clear();
    out.extend(shape.iter().map(|&e| if e > 0 { (0, e) } else { (0, 0) }));
}

/// Where an access lands: fills `ranges` with the in-bounds range of each tile axis and
/// returns the element index of the tile's lane 0 (wrapping arithmetic: only meaningful
/// when some lane is in bounds) and whether every indexed dimension is in range.
fn access(view: &View, dims: &[AccessDim], offs: &[i64], tile_shape: &[usize], ranges: &mut Vec<(usize, usize)>) -> (isize, bool) {
    ranges.clear();
    let mut base = view.offset;
    let mut inside = true;
    let mut axis = 0;
    let mut gathered = false;
    for (d, ad) in dims.iter().enumerate() {
        let o = offs[d];
        let n = view.shape[d];
        base = base.wrapping_add((o as isize).wrapping_mul(view.strides[d]));
        match ad {
            AccessDim::Index => inside &= o >= 0 && (o as u64) < n as u64,
            AccessDim::Tile(_) => {
                ranges.push(axis_range(o, tile_shape[axis], n));
                axis += 1;
            }
            // the offset is 0 here (each element's coordinate is added per lane)
            AccessDim::Gather(_) if !gathered => {
                gathered = true;
                ranges.push((0, tile_shape[axis]));
                axis += 1;
            }
            AccessDim::Gather(_) => {}
        }
    }
    (base, inside)
}

/// Where a running loop is: the current index, the bound and the step.
#[derive(Clone, Copy, Debug, Default)]
struct LoopState {
    i: i64,
    hi: i64,
    step: i64,
}

fn scalar_val(v: i64) -> Val {
    Val { data: vec![v as f64], valid: Vec::new() }
}

/// Stores `new` into the positions `to` (skipping the absent ones).
fn assign(vals: &mut [Val], to: &[Option<usize>], new: Vec<Val>) {
    for (t, v) in to.iter().zip(new) {
        if let Some(t) = t {
            vals[*t] = v;
        }
    }
}

fn run_program(
    steps: &[Step],
    vals: &mut [Val],
    loops: &mut [LoopState],
    args: &mut [Arg<'_>],
    views: &[Option<View>],
    pid: &[u64],
) -> Result<()> {
    let mut offs: Vec<i64> = Vec::new();
    let mut pc = 0;
    while pc < steps.len() {
        let (p, step) = (pc, &steps[pc]);
        pc += 1;
        // Control flow first: these write values at other positions than their own.
        match &step.kind {
            Kind::For { id, slot, yield_pos, index, carried, results } => {
                let bound = |i: usize| vals[step.args[i]].data[0] as i64;
                let (lo, hi, st) = (bound(0), bound(1), bound(2));
                if st <= 0 {
                    return Err(err(format!("loop {id} has step {st}: the step of a loop must be positive")));
                }
                let inits: Vec<Val> = step.args[3..].iter().map(|&a| vals[a].clone()).collect();
                if lo < hi {
                    loops[*slot] = LoopState { i: lo, hi, step: st };
                    if let Some(ix) = index {
                        vals[*ix] = scalar_val(lo);
                    }
                    assign(vals, carried, inits);
                } else {
                    assign(vals, results, inits);
                    pc = yield_pos + 1;
                }
                continue;
            }
            Kind::Yield { for_pos } => {
                let Kind::For { slot, index, carried, results, .. } = &steps[*for_pos].kind else {
                    unreachable!("a yield's for_pos names a for")
                };
                let next: Vec<Val> = step.args.iter().map(|&a| vals[a].clone()).collect();
                let l = &mut loops[*slot];
                let ni = l.i as i128 + l.step as i128;
                if ni < l.hi as i128 {
                    l.i = ni as i64;
                    if let Some(ix) = index {
                        vals[*ix] = scalar_val(ni as i64);
                    }
                    assign(vals, carried, next);
                    pc = for_pos + 1;
                } else {
                    assign(vals, results, next);
                }
                continue;
            }
            Kind::LoopValue => continue,
            _ => {}
        }
        let (before, rest) = vals.split_at_mut(p);
        let out = &mut rest[0];
        let a = |i: usize| &before[step.args[i]];
        match &step.kind {
            Kind::Fixed => {}
            Kind::Pid(axis) => {
                out.data.clear();
                out.data.push(pid[*axis] as f64);
                out.valid.clear();
            }
            Kind::Load { param, dims, xstrides, gather } => {
                let view = views[*param].as_ref().unwrap();
                let data: &[u8] = match &args[*param] {
                    Arg::In(t) => t.data,
                    Arg::Out(t) => &*t.data,
                    Arg::Scalar(_) => unreachable!("checked by bind_args"),
                };
                gather_offsets(&mut offs, &step.args, before, dims);
                let (base, inside) = access(view, dims, &offs, &step.shape, &mut out.valid);
                if !gather.is_empty() {
                    let idx = gather_ranges(gather, &step.args, before, &mut out.valid);
                    out.data.clear();
                    out.data.resize(step.len, 0.0);
                    if inside {
                        let dt = view.dtype;
                        let buf = &mut out.data;
                        for_each_lane(&out.valid, &step.strides, xstrides, base, gather, &idx, |t, x| {
                            if let Some(x) = x {
                                buf[t] = dt.read(data, x as usize);
                            }
                        });
                    } else {
                        out.valid.iter_mut().for_each(|r| *r = (0, 0));
                    }
                    continue;
                }
                out.data.clear();
                out.data.resize(step.len, 0.0);
                if !inside {
                    for r in out.valid.iter_mut() {
                        *r = (0, 0);
                    }
                    continue;
                }
                let dt = view.dtype;
                let ts = step.strides.last().copied().unwrap_or(0);
                let xs = xstrides.last().copied().unwrap_or(0);
                let buf = &mut out.data;
                for_each_row(&out.valid, [&step.strides, xstrides], |[tb, xb], n| {
                    let (mut t, mut x) = (tb, base.wrapping_add(xb));
                    for _ in 0..n {
                        buf[t as usize] = dt.read(data, x as usize);
                        t += ts;
                        x += xs;
                    }
                });
            }
            Kind::Store { param, dims, xstrides, gather, shape, strides } => {
                let view = views[*param].as_ref().unwrap();
                let r = dims.len();
                gather_offsets(&mut offs, &step.args[..r], before, dims);
                let value = &before[step.args[r]];
                // `store_where`: its mask, of the value's shape and storage order
                let mask = step.args.get(r + 1).map(|&m| &before[m].data);
                let mut ranges = Vec::with_capacity(shape.len());
                let (base, inside) = access(view, dims, &offs, shape, &mut ranges);
                if !inside {
                    continue;
                }
                for (r, v) in ranges.iter_mut().zip(&value.valid) {
                    *r = meet(*r, *v);
                }
                let Arg::Out(t) = &mut args[*param] else { unreachable!("checked by bind_args") };
                let data: &mut [u8] = &mut *t.data;
                let dt = view.dtype;
                if !gather.is_empty() {
                    let idx = gather_ranges(gather, &step.args, before, &mut ranges);
                    let src = &value.data;
                    for_each_lane(&ranges, strides, xstrides, base, gather, &idx, |t, x| {
                        if let (Some(x), true) = (x, mask.is_none_or(|m| m[t] != 0.0)) {
                            dt.write(data, x as usize, src[t]);
                        }
                    });
                    continue;
                }
                let ts = strides.last().copied().unwrap_or(0);
                let xs = xstrides.last().copied().unwrap_or(0);
                let src = &value.data;
                for_each_row(&ranges, [strides, xstrides], |[tb, xb], n| {
                    let (mut t, mut x) = (tb, base.wrapping_add(xb));
                    for _ in 0..n {
                        if mask.is_none_or(|m| m[t as usize] != 0.0) {
                            dt.write(data, x as usize, src[t as usize]);
                        }
                        t += ts;
                        x += xs;
                    }
                });
            }
            Kind::Unary(u) => {
                let x = a(0);
                unary(*u, step.dtype, &x.data, &mut out.data)?;
                out.valid.clone_from(&x.valid);
            }
            Kind::Binary(b) => {
                let (x, y) = (a(0), a(1));
                out.valid.clear();
                out.valid.extend(x.valid.iter().zip(&y.valid).map(|(p, q)| meet(*p, *q)));
                binary(*b, step.dtype, &x.data, &y.data, &mut out.data, &out.valid, &step.shape)?;
            }
            Kind::Select => {
                let (c, x, y) = (a(0), a(1), a(2));
                out.valid.clear();
                out.valid.extend(c.valid.iter().zip(&x.valid).zip(&y.valid).map(|((p, q), r)| meet(meet(*p, *q), *r)));
                out.data.clear();
                out.data.extend(c.data.iter().zip(&x.data).zip(&y.data).map(|((&c, &x), &y)| if c != 0.0 { x } else { y }));
            }
            Kind::Cast { from } => {
                let x = a(0);
                let (from, to) = (*from, step.dtype);
                out.data.clear();
                out.data.extend(x.data.iter().map(|&v| cast(from, to, v)));
                out.valid.clone_from(&x.valid);
            }
            Kind::Reduce { op, axis, keep_dim } => {
                let x = a(0);
                reduce(*op, *axis, *keep_dim, step, &steps[step.args[0]], x, out);
            }
            Kind::Broadcast { src_strides, src_axis } => {
                let x = a(0);
                out.valid.clear();
                out.valid.extend(src_axis.iter().zip(&step.shape).map(|(s, &e)| match s {
                    _ if e == 0 => (0, 0),
                    None => (0, e),
                    Some((j, false)) => x.valid[*j],
                    Some((j, true)) => {
                        let (lo, hi) = x.valid[*j];
                        if lo == 0 && hi > 0 {
                            (0, e)
                        } else {
                            (0, 0)
                        }
                    }
                }));
                gather(&step.shape, &step.strides, src_strides, &x.data, step.len, &mut out.data);
            }
            Kind::Permute { src_strides, perm } => {
                let x = a(0);
                out.valid.clear();
                out.valid.extend(perm.iter().map(|&j| x.valid[j]));
                gather(&step.shape, &step.strides, src_strides, &x.data, step.len, &mut out.data);
            }
            Kind::ExpandDims { axis } => {
                let x = a(0);
                out.data.clone_from(&x.data);
                out.valid.clone_from(&x.valid);
                out.valid.insert(*axis, (0, 1));
            }
            Kind::Convert => {
                let x = a(0);
                out.data.clone_from(&x.data);
                out.valid.clone_from(&x.valid);
            }
            Kind::Dot { precision } => {
                let (x, y) = (a(0), a(1));
                let p = *precision;
                let kk = steps[step.args[0]].shape[1];
                let n = steps[step.args[1]].shape[1];
                out.valid.clear();
                out.valid.extend([x.valid[0], y.valid[1]]);
                let (klo, khi) = meet(x.valid[1], y.valid[0]);
                out.data.clear();
                out.data.resize(step.len, 0.0);
                for_each_row(&out.valid, [&step.strides], |[base], len| {
                    let row = base as usize / n.max(1);
                    for j in 0..len {
                        let col = base as usize % n.max(1) + j;
                        let s: f64 = (klo..khi).map(|q| p.operand(x.data[row * kk + q]) * p.operand(y.data[q * n + col])).sum();
                        out.data[base as usize + j] = s as f32 as f64;
                    }
                });
            }
            Kind::For { .. } | Kind::Yield { .. } | Kind::LoopValue => unreachable!("handled above"),
        }
    }
    Ok(())
}

/// `out[i] = src[Σ idx_a * src_strides[a]]` over the whole result shape.
fn gather(shape: &[usize], strides: &[isize], src_strides: &[isize], src: &[f64], len: usize, out: &mut Vec<f64>) {
    out.clear();
    out.resize(len, 0.0);
    let mut ranges = Vec::with_capacity(shape.len());
    full_ranges(shape, &mut ranges);
    let ts = strides.last().copied().unwrap_or(0);
    let ss = src_strides.last().copied().unwrap_or(0);
    for_each_row(&ranges, [strides, src_strides], |[tb, sb], n| {
        let (mut t, mut s) = (tb, sb);
        for _ in 0..n {
            out[t as usize] = src[s as usize];
            t += ts;
            s += ss;
        }
    });
}

fn unary(u: UnaryOp, dt: DType, x: &[f64], out: &mut Vec<f64>) -> Result<()> {
    out.clear();
    if dt == DType::I64 {
        let f: fn(i64) -> i64 = match u {
            UnaryOp::Neg => i64::wrapping_neg,
            UnaryOp::Abs => i64::wrapping_abs,
            _ => return Err(err(format!("{u:?} on i64"))),
        };
        out.extend(x.iter().map(|&v| f(v as i64) as f64));
        return Ok(());
    }
    if dt == DType::Bool {
        if u != UnaryOp::Not {
            return Err(err(format!("{u:?} on bool")));
        }
        out.extend(x.iter().map(|&v| (v == 0.0) as u8 as f64));
        return Ok(());
    }
    let f: fn(f32) -> f32 = match u {
        UnaryOp::Neg => |v| -v,
        UnaryOp::Abs => f32::abs,
        UnaryOp::Exp => f32::exp,
        UnaryOp::Log => f32::ln,
        UnaryOp::Sqrt => f32::sqrt,
        UnaryOp::Rsqrt => |v| 1.0 / v.sqrt(),
        UnaryOp::Sigmoid => |v| 1.0 / (1.0 + (-v).exp()),
        UnaryOp::Tanh => f32::tanh,
        UnaryOp::Erf => libm::erff,
        UnaryOp::Sin => f32::sin,
        UnaryOp::Cos => f32::cos,
        UnaryOp::Not => return Err(err(format!("not on {dt}"))),
    };
    out.extend(x.iter().map(|&v| dt.round(f(v as f32) as f64)));
    Ok(())
}

/// Whether the lane at flat index `i` of a tile of `shape` lies in `valid`.
fn lane_valid(mut i: usize, shape: &[usize], valid: &[(usize, usize)]) -> bool {
    for a in (0..shape.len()).rev() {
        let e = shape[a].max(1);
        let c = i % e;
        i /= e;
        let (lo, hi) = valid[a];
        if c < lo || c >= hi {
            return false;
        }
    }
    true
}

/// `dt` is the result dtype. Comparisons compare the operands exactly, as `f64`; the
/// other ops have operands of the result dtype.
fn binary(
    b: BinaryOp,
    dt: DType,
    x: &[f64],
    y: &[f64],
    out: &mut Vec<f64>,
    valid: &[(usize, usize)],
    shape: &[usize],
) -> Result<()> {
    out.clear();
    let pairs = x.iter().zip(y).map(|(&p, &q)| (p, q));
    let cmp: Option<fn(&f64, &f64) -> bool> = match b {
        BinaryOp::Lt => Some(f64::lt),
        BinaryOp::Le => Some(f64::le),
        BinaryOp::Gt => Some(f64::gt),
        BinaryOp::Ge => Some(f64::ge),
        BinaryOp::Eq => Some(f64::eq),
        BinaryOp::Ne => Some(f64::ne),
        _ => None,
    };
    if let Some(c) = cmp {
        out.extend(pairs.map(|(p, q)| c(&p, &q) as u8 as f64));
        return Ok(());
    }
    match dt {
        DType::I64 => {
            let f: fn(i64, i64) -> i64 = match b {
                BinaryOp::Add => i64::wrapping_add,
                BinaryOp::Sub => i64::wrapping_sub,
                BinaryOp::Mul => i64::wrapping_mul,
                BinaryOp::Div => i64::wrapping_div,
                BinaryOp::Rem => i64::wrapping_rem,
                BinaryOp::Max => std::cmp::max,
                BinaryOp::Min => std::cmp::min,
                BinaryOp::And => |p, q| (p != 0 && q != 0) as i64,
                BinaryOp::Or => |p, q| (p != 0 || q != 0) as i64,
                _ => unreachable!("comparisons handled above"),
            };
            let checks_zero = matches!(b, BinaryOp::Div | BinaryOp::Rem);
            for (i, (p, q)) in pairs.enumerate() {
                let (p, q) = (p as i64, q as i64);
                if checks_zero && q == 0 {
                    if lane_valid(i, shape, valid) {
                        let what = if b == BinaryOp::Div { "division" } else { "remainder" };
                        return Err(err(format!("i64 {what} by zero")));
                    }
                    out.push(0.0);
                    continue;
                }
                out.push(f(p, q) as f64);
            }
        }
        DType::Bool => {
            let f: fn(bool, bool) -> bool = match b {
                BinaryOp::And => |p, q| p & q,
                BinaryOp::Or => |p, q| p | q,
                _ => return Err(err(format!("{b:?} on bool"))),
            };
            out.extend(pairs.map(|(p, q)| f(p != 0.0, q != 0.0) as u8 as f64));
        }
        _ => {
            let f: fn(f32, f32) -> f32 = match b {
                BinaryOp::Add => |p, q| p + q,
                BinaryOp::Sub => |p, q| p - q,
                BinaryOp::Mul => |p, q| p * q,
                BinaryOp::Div => |p, q| p / q,
                BinaryOp::Rem => |p, q| p % q,
                BinaryOp::Max => f32::max,
                BinaryOp::Min => f32::min,
                _ => return Err(err(format!("{b:?} on {dt}"))),
            };
            out.extend(pairs.map(|(p, q)| dt.round(f(p as f32, q as f32) as f64)));
        }
    }
    Ok(())
}

fn cast(from: DType, to: DType, v: f64) -> f64 {
    match to {
        DType::I64 if from.is_float() => v as i64 as f64,
        DType::Bool => (v != 0.0) as u8 as f64,
        _ => to.round(v),
    }
}

fn reduce(op: ReduceOp, axis: usize, keep_dim: bool, step: &Step, src: &Step, x: &Val, out: &mut Val) {
    let int = step.dtype == DType::I64;
    let empty = match (op, int) {
        (ReduceOp::Sum, _) | (ReduceOp::Mean, true) => 0.0,
        (ReduceOp::Max, false) => f64::NEG_INFINITY,
        (ReduceOp::Min, false) => f64::INFINITY,
        (ReduceOp::Mean, false) => f64::NAN,
        (ReduceOp::Max, true) => i64::MIN as f64,
        (ReduceOp::Min, true) => i64::MAX as f64,
    };
    out.data.clear();
    out.data.resize(step.len, empty);
    // The rectangle walked: the other axes, then the reduced axis innermost.
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(src.shape.len());
    let mut xstr: Vec<isize> = Vec::with_capacity(src.shape.len());
    let mut ostr: Vec<isize> = Vec::with_capacity(src.shape.len());
    out.valid.clear();
    let mut oaxis = 0;
    for a in 0..src.shape.len() {
        if a == axis {
            if keep_dim {
                out.valid.push((0, 1));
                oaxis += 1;
            }
            continue;
        }
        ranges.push(x.valid[a]);
        out.valid.push(x.valid[a]);
        xstr.push(src.strides[a]);
        ostr.push(step.strides[oaxis]);
        oaxis += 1;
    }
    ranges.push(x.valid[axis]);
    xstr.push(src.strides[axis]);
    ostr.push(0);
    let s = src.strides[axis];
    let dt = step.dtype;
    let data = &mut out.data;
    for_each_row(&ranges, [&xstr, &ostr], |[xb, ob], n| {
        let lanes = (0..n).map(|j| x.data[(xb + j as isize * s) as usize]);
        let v = if int {
            let it = lanes.map(|v| v as i64);
            match op {
                ReduceOp::Sum => it.fold(0i64, i64::wrapping_add) as f64,
                ReduceOp::Mean => (it.fold(0i64, i64::wrapping_add) / n as i64) as f64,
                ReduceOp::Max => it.max().unwrap_or(i64::MIN) as f64,
                ReduceOp::Min => it.min().unwrap_or(i64::MAX) as f64,
            }
        } else {
            match op {
                ReduceOp::Sum => dt.round(lanes.fold(0.0, |a, b| a + b)),
                ReduceOp::Mean => dt.round(lanes.fold(0.0, |a, b| a + b) / n as f64),
                ReduceOp::Max => dt.round(lanes.fold(f64::NEG_INFINITY, f64::max)),
                ReduceOp::Min => dt.round(lanes.fold(f64::INFINITY, f64::min)),
            }
        };
        data[ob as usize] = v;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ranges() {
        assert_eq!(axis_range(0, 16, 7), (0, 7));
        assert_eq!(axis_range(-3, 16, 7), (3, 10));
        assert_eq!(axis_range(-20, 16, 7), (0, 0));
        assert_eq!(axis_range(7, 16, 7), (0, 0));
        assert_eq!(axis_range(5, 4, 100), (0, 4));
        assert_eq!(axis_range(98, 4, 100), (0, 2));
        assert_eq!(axis_range(i64::MIN, 4, 100), (0, 0));
        assert_eq!(axis_range(i64::MAX, 4, 100), (0, 0));
    }

    #[test]
    fn rows_of_a_rectangle() {
        let mut seen = Vec::new();
        let strides = contiguous_strides(&[3, 4]);
        for_each_row(&[(1, 3), (1, 3)], [&strides], |[b], n| seen.push((b, n)));
        assert_eq!(seen, vec![(5, 2), (9, 2)]);
        seen.clear();
        for_each_row(&[(1, 3), (2, 2)], [&strides], |[b], n| seen.push((b, n)));
        assert!(seen.is_empty());
        for_each_row(&[], [&[]], |[b], n| seen.push((b, n)));
        assert_eq!(seen, vec![(0, 1)]);
    }

    #[test]
    fn lane_validity() {
        // shape [2, 3], valid rows [1, 2), cols [0, 2)
        let v = [(1, 2), (0, 2)];
        let got: Vec<bool> = (0..6).map(|i| lane_valid(i, &[2, 3], &v)).collect();
        assert_eq!(got, vec![false, false, false, true, true, false]);
    }

    #[test]
    fn casts() {
        assert_eq!(cast(DType::F32, DType::I64, -2.7), -2.0);
        assert_eq!(cast(DType::F32, DType::I64, f64::NAN), 0.0);
        assert_eq!(cast(DType::F32, DType::I64, 1e30), i64::MAX as f64);
        assert_eq!(cast(DType::F32, DType::Bool, -0.5), 1.0);
        assert_eq!(cast(DType::F32, DType::Bool, 0.0), 0.0);
        assert_eq!(cast(DType::Bool, DType::F16, 1.0), 1.0);
        assert_eq!(cast(DType::F32, DType::BF16, 1.00390625), 1.0); // 1 + 2^-8: ties to even
        assert_eq!(cast(DType::I64, DType::F32, 16777217.0), 16777216.0);
    }
}

//! The kernel graph: ops as nodes of a `petgraph::StableDiGraph`, data flow as edges.
//!
//! A [`Kernel`] describes one *program instance* working on tiles; the launch grid is
//! derived from how `program_id` indexes the stores (see [`crate::grid`]).
//!
//! Representation:
//! - every node is one [`Node`]: an [`Op`] and the [`Type`] of its result (`None` for
//!   ops without a result: `Store`, `For`, `Yield`);
//! - an edge `a → b` with weight `k` says "the result of `a` is operand `k` of `b`";
//! - [`Kernel::order`] lists every node once in program order (a topological order);
//!   the printer and the code writer walk it, which keeps their output deterministic;
//! - per-op facts that passes decide live in side tables ([`Kernel::names`],
//!   [`Kernel::schedule`]), never inside the nodes; so does where each op comes from
//!   in the user's source ([`Kernel::locs`], for error messages).
//!
//! Ids: [`OpId`] names a node, [`ValueId`] names the result of a node. Both wrap the
//! same petgraph index; an op has at most one result.
//!
//! **Loops** are structured, like program text: a loop is the ops of `order` from its
//! [`Op::For`] to the [`Op::Yield`] with the same [`LoopId`] (the *body* lies strictly
//! between them; loops nest). By convention the body opens with the loop's
//! [`Op::LoopIndex`] and [`Op::LoopCarried`] ops, and the loop's [`Op::LoopResult`]s
//! follow its `Yield`. There are no edges from a `For` to its body or from a `Yield`
//! to the results: the ops are tied together by their `LoopId`. A value defined in a
//! body is used only inside it; after the loop, the `LoopResult`s carry what it
//! computed. [`Kernel::loop_of`], [`Kernel::loop_body`], [`Kernel::loop_info`] and
//! [`Kernel::loop_nest`] find the parts; `crate::verify` lists the rules.

use std::collections::BTreeMap;
use std::fmt;

use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::dtype::DType;
use crate::schedule::Schedule;

/// Names a node (an op) of a kernel graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub NodeIndex);

/// Names the result of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub NodeIndex);

impl ValueId {
    /// The op that produces this value.
    pub fn op(self) -> OpId {
        OpId(self.0)
    }
    /// Dense index, for printing (`%3`).
    pub fn index(self) -> usize {
        self.0.index()
    }
}

impl OpId {
    /// The value this op produces (meaningful only for ops with a result).
    pub fn value(self) -> ValueId {
        ValueId(self.0)
    }
    /// Dense index of the node (the same number as its value's `%n`).
    pub fn index(self) -> usize {
        self.0.index()
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0.index())
    }
}

/// Names a loop: its [`Op::For`], [`Op::Yield`], and the index, carried and result ops
/// that belong to it. Each id is used by exactly one `For`/`Yield` pair of a kernel;
/// [`Kernel::fresh_loop_id`] gives an unused one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoopId(pub u32);

impl fmt::Display for LoopId {
    /// `L0`, `L1`, … (the printer's spelling).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}

/// A kernel parameter's position in [`Kernel::params`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParamId(pub u32);

/// A symbolic tensor extent (`M`, `N`, …), known only at launch. Index into
/// [`Kernel::shape_syms`]. Two tensor dims with the same symbol must be equal at launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShapeSym(pub u32);

/// A tile-size symbol (`BM`, `BN`, …) that the scheduler chooses. Index into
/// [`Kernel::tile_syms`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TileSym(pub u32);

/// The extent of one axis of a tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Extent {
    /// A literal extent written in the kernel.
    Const(u32),
    /// A tile symbol; its value is chosen by the scheduler (`choose_tiles`).
    Tile(TileSym),
    /// The whole runtime extent of a shape symbol (`x.row(i)` spans all of `N`). The
    /// compiled tile is that extent rounded up to a power of two; masking covers the rest.
    Full(ShapeSym),
}

/// The type of a value: an element type and a tile shape. Rank 0 is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    /// The element type.
    pub dtype: DType,
    /// One extent per tile axis; empty for a scalar.
    pub shape: Vec<Extent>,
}

impl Type {
    /// A rank-0 value of `dtype`.
    pub fn scalar(dtype: DType) -> Type {
        Type { dtype, shape: Vec::new() }
    }
    /// A tile of `dtype` with one extent per axis.
    pub fn tile(dtype: DType, shape: Vec<Extent>) -> Type {
        Type { dtype, shape }
    }
    /// The number of tile axes (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// True for rank 0.
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
}

/// What a kernel parameter is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A tensor in device memory with one shape symbol per dimension; `output` tensors
    /// are written (`&mut Tensor` in the kernel signature), the others only read.
    Tensor {
        /// The shape symbol of each dimension, outermost first.
        dims: Vec<ShapeSym>,
        /// True for a `&mut Tensor` parameter.
        output: bool,
    },
    /// A scalar passed by value.
    Scalar,
}

/// One kernel parameter, in signature order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// The parameter's name in the signature.
    pub name: String,
    /// The element type of a tensor, or the type of a scalar.
    pub dtype: DType,
    /// Tensor or scalar.
    pub kind: ParamKind,
}

impl Param {
    /// True for a tensor parameter (input or output).
    pub fn is_tensor(&self) -> bool {
        matches!(self.kind, ParamKind::Tensor { .. })
    }
    /// True for an output tensor (`&mut Tensor`).
    pub fn is_output(&self) -> bool {
        matches!(self.kind, ParamKind::Tensor { output: true, .. })
    }
    /// The shape symbols of a tensor parameter (empty for a scalar).
    pub fn dims(&self) -> &[ShapeSym] {
        match &self.kind {
            ParamKind::Tensor { dims, .. } => dims,
            ParamKind::Scalar => &[],
        }
    }
}

/// How a block access (`Load`/`Store`) covers one dimension of its tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessDim {
    /// A single index along this dimension: the axis does not appear in the tile
    /// (`x.row(i)` indexes dim 0 this way).
    Index,
    /// A run of `Extent` elements starting at the offset; the axis appears in the tile.
    Tile(Extent),
    /// A gather along this dimension: its operand is an `I64` tile of the access's whole
    /// tile shape, giving each element's coordinate along the dimension. The gathered
    /// dimensions of an access share one tile axis of extent `Extent` (the index tiles'
    /// extent), placed where the first of them stands. A load reads an element whose
    /// gathered coordinates fall outside the tensor as a valid `0` (a convolution's
    /// padding); a store skips it.
    Gather(Extent),
}

impl AccessDim {
    /// The tile shape of an access covering a tensor's dimensions as `dims`: a `Tile`
    /// dimension's extent, and the gathered axis where the first `Gather` stands.
    pub fn tile_shape(dims: &[AccessDim]) -> Vec<Extent> {
        let mut shape = Vec::new();
        let mut gathered = false;
        for d in dims {
            match d {
                AccessDim::Index => {}
                AccessDim::Tile(e) => shape.push(*e),
                AccessDim::Gather(e) if !gathered => {
                    gathered = true;
                    shape.push(*e);
                }
                AccessDim::Gather(_) => {}
            }
        }
        shape
    }

    /// The tile axis of each tensor dimension of an access (`None` for an `Index`
    /// dimension; every `Gather` dimension names the one gathered axis).
    pub fn tile_axes(dims: &[AccessDim]) -> Vec<Option<usize>> {
        let mut next = 0;
        let mut gathered = None;
        dims.iter()
            .map(|d| match d {
                AccessDim::Index => None,
                AccessDim::Tile(_) => {
                    next += 1;
                    Some(next - 1)
                }
                AccessDim::Gather(_) => Some(*gathered.get_or_insert_with(|| {
                    next += 1;
                    next - 1
                })),
            })
            .collect()
    }

    /// True for a gathered dimension.
    pub fn is_gather(&self) -> bool {
        matches!(self, AccessDim::Gather(_))
    }
}

/// A scalar literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Literal {
    /// A floating-point literal (`1.0`), held as `f64`.
    Float(f64),
    /// An integer literal (`2`).
    Int(i64),
    /// `true` or `false`.
    Bool(bool),
}

impl Literal {
    /// The literal's value as `f64` (`true` is 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(v) => v,
            Literal::Int(v) => v as f64,
            Literal::Bool(b) => b as u8 as f64,
        }
    }
}

/// Elementwise functions of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// The natural logarithm.
    Log,
    /// The square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// The hyperbolic tangent.
    Tanh,
    /// The error function.
    Erf,
    /// Sine (radians).
    Sin,
    /// Cosine (radians).
    Cos,
    /// Logical not (for `Bool`).
    Not,
}

/// Elementwise functions of two operands of the same type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// Float division; on `I64`, division truncating toward zero.
    Div,
    /// Remainder (`I64` only).
    Rem,
    /// The larger operand (maxNum: a NaN operand is ignored).
    Max,
    /// The smaller operand (minNum).
    Min,
    /// `a < b`. The comparisons give `Bool`.
    Lt,
    /// `a <= b`.
    Le,
    /// `a > b`.
    Gt,
    /// `a >= b`.
    Ge,
    /// `a == b`.
    Eq,
    /// `a != b`.
    Ne,
    /// Logical and of `Bool` operands.
    And,
    /// Logical or of `Bool` operands.
    Or,
}

impl BinaryOp {
    /// True for `Lt`, `Le`, `Gt`, `Ge`, `Eq` and `Ne`, whose result is `Bool`.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne)
    }
}

/// Reductions along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    /// The sum of the valid lanes.
    Sum,
    /// The largest valid lane.
    Max,
    /// The smallest valid lane.
    Min,
    /// The sum divided by the number of *valid* (in-bounds) elements.
    Mean,
}

/// A tile op. Operand counts and types are checked by the verifier (`crate::verify`).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `program_id(axis)`: this program instance's index along a grid axis. `I64` scalar.
    ProgramId {
        /// The grid axis: 0, 1 or 2.
        axis: u8,
    },
    /// The value of a scalar parameter.
    ScalarParam {
        /// The scalar parameter read.
        param: ParamId,
    },
    /// The runtime value of a shape symbol. `I64` scalar.
    ShapeDim {
        /// The symbol read.
        sym: ShapeSym,
    },
    /// The compiled value of a tile extent (a tile symbol in index arithmetic). `I64` scalar.
    TileExtent {
        /// The extent read.
        extent: Extent,
    },
    /// A scalar literal of the result type.
    Const {
        /// The literal, rounded to the result's dtype.
        value: Literal,
    },
    /// Reads a block of a tensor parameter. Operands: one `I64` offset per tensor
    /// dimension: a scalar, or for a [`AccessDim::Gather`] dimension an `I64` tile of
    /// the result's shape. Elements outside the tensor are not loaded: they are *invalid* lanes of
    /// the tile (see `crate` docs on masking).
    Load {
        /// The tensor parameter read.
        tensor: ParamId,
        /// How the block covers each tensor dimension, outermost first.
        dims: Vec<AccessDim>,
    },
    /// Writes a tile into a block of an output tensor. Operands: one offset per tensor
    /// dimension (as for `Load`), then the value. Only in-bounds, valid lanes are written.
    Store {
        /// The output tensor parameter written.
        tensor: ParamId,
        /// How the block covers each tensor dimension, outermost first.
        dims: Vec<AccessDim>,
    },
    /// Operand: one value.
    Unary(UnaryOp),
    /// Operands: two values of the same shape and dtype.
    Binary(BinaryOp),
    /// Operands: a `Bool` condition, then the value if true, the value if false; all of
    /// one shape.
    Select,
    /// Converts the operand to another element type.
    Cast {
        /// The result's element type.
        to: DType,
    },
    /// Reduces one axis of the operand; invalid lanes do not take part. With `keep_dim`
    /// the axis stays in the result with extent 1.
    Reduce {
        /// Sum, max, min or mean.
        op: ReduceOp,
        /// The operand axis reduced.
        axis: u32,
        /// Whether the reduced axis stays, with extent 1.
        keep_dim: bool,
    },
    /// Broadcasts the operand to `Type::shape` of the result: numpy rules, axes aligned
    /// to the right; each operand axis equals the result's or is the literal extent 1,
    /// and leading result axes may be absent from the operand.
    Broadcast,
    /// Reorders the axes of the operand: result axis `i` is operand axis `perm[i]`.
    Permute {
        /// A permutation of `0..rank`.
        perm: Vec<u32>,
    },
    /// No operands: the `I64` tile `[extent]` holding `0, 1, …, extent - 1` (every lane
    /// valid).
    Iota {
        /// The tile's one extent.
        extent: Extent,
    },
    /// Operand: one value. The result is the operand with a new axis of literal extent 1
    /// inserted at position `axis` (`0..=rank`); the data is unchanged.
    ExpandDims {
        /// Where the new axis goes.
        axis: u32,
    },
    /// The identity on values: marks where the value changes its distribution over
    /// threads (inserted by the layout pass; the writer moves it through shared memory).
    Convert,
    /// Opens loop `id`: `for (i = lo; i < hi; i += step)`. Operands: `lo`, `hi`, `step`
    /// (`I64` scalars), then the `carried` initial values (any types). No result. The
    /// body follows in program order up to the [`Op::Yield`] of the same id. A `step`
    /// of 0 or less is an error when the loop runs (never a hang).
    For {
        /// The loop this `For` opens.
        id: LoopId,
        /// How many values the loop carries.
        carried: u32,
    },
    /// No operands: the induction variable `i` of loop `id`, an `I64` scalar. Lives in
    /// the loop's body (by convention right after the `For`).
    LoopIndex {
        /// The loop.
        id: LoopId,
    },
    /// No operands: carried value `index` of loop `id` at the start of the current
    /// iteration (the init on the first one, then what the `Yield` gave). Its type is
    /// the type of init `index`. Lives in the loop's body (by convention right after the
    /// `For`).
    LoopCarried {
        /// The loop.
        id: LoopId,
        /// Which carried value (0-based).
        index: u32,
    },
    /// Closes the body of loop `id`. Operands: the next value of each carried value
    /// (types equal to the inits'). No result.
    Yield {
        /// The loop this `Yield` closes.
        id: LoopId,
    },
    /// No operands: carried value `index` of loop `id` after the loop (the init when
    /// the loop runs zero times); the type of init `index`. Placed after the `Yield`,
    /// outside the body, in the loop that holds the `For` (if any).
    LoopResult {
        /// The loop.
        id: LoopId,
        /// Which carried value (0-based).
        index: u32,
    },
    /// Matrix product of tiles. Operands: `a: [M, K]` and `b: [K, N]` of one float dtype
    /// (`F16`, `BF16`, `F32`, `F8E4M3` or `F8E5M2`), `a`'s axis 1 and `b`'s axis 0 the
    /// same extent. Result: `F32 [M, N]`, `M` from `a`'s axis 0 and `N` from `b`'s
    /// axis 1. `precision` says how exactly the products must be formed (see
    /// [`DotPrecision`]; `Tf32` only with `F32` operands).
    Dot {
        /// Exact products, or TF32 permitted.
        precision: DotPrecision,
    },
}

/// How exactly a [`Op::Dot`] must multiply its operands. The sum is f32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DotPrecision {
    /// The operands as they are: every product exact (the default; what `dot` writes).
    #[default]
    Exact,
    /// f32 operands may be read as TF32 (8-bit exponent, 10-bit mantissa: the low 13
    /// mantissa bits dropped) before they are multiplied — what the tensor cores'
    /// `tf32` instructions do (`dot_tf32`). A permission, not a promise: a target
    /// without a TF32 path computes the exact product. The interpreter drops the bits.
    Tf32,
}

impl DotPrecision {
    /// `value` as a TF32 operand under this precision: with [`DotPrecision::Tf32`] an
    /// f32 value with the low 13 bits of its mantissa cleared (toward zero; infinities
    /// and NaN keep their class), else `value` itself.
    pub fn operand(self, value: f64) -> f64 {
        match self {
            DotPrecision::Exact => value,
            DotPrecision::Tf32 => {
                let x = value as f32;
                if !x.is_finite() {
                    return x as f64;
                }
                f32::from_bits(x.to_bits() & !0x1fff) as f64
            }
        }
    }
}

impl Op {
    /// The short name used by the printer.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::ProgramId { .. } => "program_id",
            Op::ScalarParam { .. } => "param",
            Op::ShapeDim { .. } => "shape",
            Op::TileExtent { .. } => "tile_extent",
            Op::Const { .. } => "const",
            Op::Load { .. } => "load",
            Op::Store { .. } => "store",
            Op::Unary(_) => "unary",
            Op::Binary(_) => "binary",
            Op::Select => "select",
            Op::Cast { .. } => "cast",
            Op::Reduce { .. } => "reduce",
            Op::Broadcast => "broadcast",
            Op::Permute { .. } => "permute",
            Op::Iota { .. } => "iota",
            Op::ExpandDims { .. } => "expand_dims",
            Op::Convert => "convert",
            Op::For { .. } => "for",
            Op::LoopIndex { .. } => "loop_index",
            Op::LoopCarried { .. } => "loop_carried",
            Op::Yield { .. } => "yield",
            Op::LoopResult { .. } => "loop_result",
            Op::Dot { precision: DotPrecision::Exact } => "dot",
            Op::Dot { precision: DotPrecision::Tf32 } => "dot_tf32",
        }
    }

    /// True for ops with a result (all but `Store`, `For` and `Yield`).
    pub fn has_result(&self) -> bool {
        !matches!(self, Op::Store { .. } | Op::For { .. } | Op::Yield { .. })
    }

    /// The loop this op belongs to by its id: `For`, `LoopIndex`, `LoopCarried`,
    /// `Yield` and `LoopResult` name one; other ops `None` (see [`Kernel::loop_of`] for
    /// the loop *enclosing* an op).
    pub fn loop_id(&self) -> Option<LoopId> {
        match self {
            Op::For { id, .. }
            | Op::LoopIndex { id }
            | Op::LoopCarried { id, .. }
            | Op::Yield { id }
            | Op::LoopResult { id, .. } => Some(*id),
            _ => None,
        }
    }
}

/// The parts of one loop, as [`Kernel::loop_info`] finds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopInfo {
    /// The loop.
    pub id: LoopId,
    /// The `For` op.
    pub for_op: OpId,
    /// The `For`'s position in [`Kernel::order`].
    pub for_pos: usize,
    /// The `Yield` op.
    pub yield_op: OpId,
    /// The `Yield`'s position; the body is `order[for_pos + 1..yield_pos]`.
    pub yield_pos: usize,
    /// Number of carried values (the `For`'s `carried`).
    pub carried: u32,
    /// The `LoopIndex` value, if the loop has one.
    pub index: Option<ValueId>,
    /// Per carried value, its `LoopCarried` value (`None` where there is none).
    pub carried_values: Vec<Option<ValueId>>,
    /// Per carried value, its `LoopResult` value (`None` where there is none).
    pub results: Vec<Option<ValueId>>,
}

/// Where an op comes from in the user's source: the line and column (both from 1) of
/// the expression a front end lowered to it (the `#[kfuse]` macro records them with
/// [`crate::Builder::at`]). Error messages name it; the printer does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Loc {
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1.
    pub column: u32,
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// A node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// What the node computes.
    pub op: Op,
    /// The result type; `None` exactly when the op has no result (see [`Op::has_result`]).
    pub ty: Option<Type>,
}

/// One kernel: parameters, symbols, the op graph and the side tables passes fill in.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The kernel's name (a Rust identifier; the CUDA entry point is derived from it).
    pub name: String,
    /// The parameters, in signature order (indexed by [`ParamId`]).
    pub params: Vec<Param>,
    /// Names of shape symbols, indexed by [`ShapeSym`].
    pub shape_syms: Vec<String>,
    /// Names of tile symbols, indexed by [`TileSym`].
    pub tile_syms: Vec<String>,
    /// The ops; an edge's weight is the operand position it feeds.
    pub graph: StableDiGraph<Node, u8>,
    /// Every node exactly once, in program order (a topological order of `graph`).
    pub order: Vec<OpId>,
    /// Source names of values bound with `let` (for the printer and generated code).
    pub names: BTreeMap<ValueId, String>,
    /// Source locations of ops, where the front end knew them (see [`Loc`]); an op
    /// inserted by a pass before another takes that op's location.
    pub locs: BTreeMap<OpId, Loc>,
    /// Decisions of the scheduling passes; empty until they run.
    pub schedule: Schedule,
}

impl Kernel {
    /// An empty kernel.
    pub fn new(name: impl Into<String>) -> Kernel {
        Kernel {
            name: name.into(),
            params: Vec::new(),
            shape_syms: Vec::new(),
            tile_syms: Vec::new(),
            graph: StableDiGraph::new(),
            order: Vec::new(),
            names: BTreeMap::new(),
            locs: BTreeMap::new(),
            schedule: Schedule::default(),
        }
    }

    /// The node of an op: the op and its result type.
    pub fn node(&self, op: OpId) -> &Node {
        &self.graph[op.0]
    }

    /// The op of a node.
    pub fn op(&self, op: OpId) -> &Op {
        &self.graph[op.0].op
    }

    /// The type of a value. Panics if `v` names an op without a result, which the
    /// verifier rules out for every operand edge.
    pub fn ty(&self, v: ValueId) -> &Type {
        self.graph[v.0].ty.as_ref().expect("value of an op without a result")
    }

    /// The operands of an op, in operand order.
    pub fn operands(&self, op: OpId) -> Vec<ValueId> {
        let mut e: Vec<(u8, ValueId)> = self
            .graph
            .edges_directed(op.0, Direction::Incoming)
            .map(|e| (*e.weight(), ValueId(e.source())))
            .collect();
        e.sort_by_key(|(k, _)| *k);
        e.into_iter().map(|(_, v)| v).collect()
    }

    /// The ops that use a value, in program order.
    pub fn users(&self, v: ValueId) -> Vec<OpId> {
        let mut u: Vec<OpId> = self
            .graph
            .edges_directed(v.0, Direction::Outgoing)
            .map(|e| OpId(e.target()))
            .collect();
        u.sort_by_key(|o| self.position(*o));
        u.dedup();
        u
    }

    /// Position of an op in [`Kernel::order`].
    pub fn position(&self, op: OpId) -> usize {
        self.order.iter().position(|o| *o == op).unwrap_or(usize::MAX)
    }

    /// Adds a node with its operands, appending it to the program order.
    pub fn push(&mut self, op: Op, ty: Option<Type>, operands: &[ValueId]) -> OpId {
        let n = self.graph.add_node(Node { op, ty });
        for (k, v) in operands.iter().enumerate() {
            self.graph.add_edge(v.0, n, k as u8);
        }
        self.order.push(OpId(n));
        OpId(n)
    }

    /// Adds a node and places it in program order right before `before`, with
    /// `before`'s source location.
    pub fn insert_before(&mut self, before: OpId, op: Op, ty: Option<Type>, operands: &[ValueId]) -> OpId {
        let id = self.push(op, ty, operands);
        if let Some(&l) = self.locs.get(&before) {
            self.locs.insert(id, l);
        }
        self.order.pop();
        let pos = self.position(before);
        self.order.insert(pos, id);
        id
    }

    /// The value a store writes (its operand after the offsets).
    pub fn stored_value(&self, store: OpId) -> ValueId {
        let Op::Store { dims, .. } = self.op(store) else { panic!("{store:?} is not a store") };
        self.operands(store)[dims.len()]
    }

    /// The mask of a `store_where` (its operand after the value), if it has one.
    pub fn store_mask(&self, store: OpId) -> Option<ValueId> {
        let Op::Store { dims, .. } = self.op(store) else { return None };
        self.operands(store).get(dims.len() + 1).copied()
    }

    /// The gathered dimensions of a load or store and their index tiles (its offsets on
    /// [`AccessDim::Gather`] dimensions); empty for any other op.
    pub fn gathered_offsets(&self, op: OpId) -> Vec<(usize, ValueId)> {
        let (Op::Load { dims, .. } | Op::Store { dims, .. }) = self.op(op) else { return Vec::new() };
        let ops = self.operands(op);
        dims.iter().enumerate().filter(|(_, d)| d.is_gather()).map(|(d, _)| (d, ops[d])).collect()
    }

    /// Makes every use of `old` by `user` a use of `new` instead.
    pub fn replace_operand(&mut self, user: OpId, old: ValueId, new: ValueId) {
        let edges: Vec<_> = self
            .graph
            .edges_directed(user.0, Direction::Incoming)
            .filter(|e| e.source() == old.0)
            .map(|e| (e.id(), *e.weight()))
            .collect();
        for (e, k) in edges {
            self.graph.remove_edge(e);
            self.graph.add_edge(new.0, user.0, k);
        }
    }

    /// Removes an op that has no users.
    pub fn remove(&mut self, op: OpId) {
        self.graph.remove_node(op.0);
        self.order.retain(|o| *o != op);
        self.names.remove(&op.value());
        self.locs.remove(&op);
    }

    /// A short description of an op for messages: its mnemonic, with the operation of
    /// a unary, binary or reduce op (`exp`, `add`, `reduce_sum`) and the tensor of a
    /// load or store (`load x`).
    pub fn op_label(&self, op: OpId) -> String {
        match self.op(op) {
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Reduce { op: r, .. } => format!("reduce_{}", format!("{r:?}").to_lowercase()),
            Op::Load { tensor, .. } => format!("load {}", self.param(*tensor).name),
            Op::Store { tensor, .. } => format!("store {}", self.param(*tensor).name),
            o => o.mnemonic().to_string(),
        }
    }

    /// The ops in program order.
    pub fn ops(&self) -> impl Iterator<Item = OpId> + '_ {
        self.order.iter().copied()
    }

    /// Number of program-id axes the kernel uses (0 when it never calls `program_id`).
    pub fn grid_rank(&self) -> usize {
        self.ops()
            .filter_map(|o| match self.op(o) {
                Op::ProgramId { axis } => Some(*axis as usize + 1),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// For every position of [`Kernel::order`], the innermost loop whose body holds the
    /// op there (`None` at top level). A `For` is outside its own body (it gets the loop
    /// around it); a `Yield` is inside. Assumes `For`/`Yield` are properly nested (the
    /// verifier's rule); an unmatched `Yield` just closes nothing.
    pub fn loop_nest(&self) -> Vec<Option<LoopId>> {
        let mut stack: Vec<LoopId> = Vec::new();
        let mut out = Vec::with_capacity(self.order.len());
        for &op in &self.order {
            match self.op(op) {
                Op::For { id, .. } => {
                    out.push(stack.last().copied());
                    stack.push(*id);
                }
                Op::Yield { id } => {
                    out.push(stack.last().copied());
                    if stack.last() == Some(id) {
                        stack.pop();
                    }
                }
                _ => out.push(stack.last().copied()),
            }
        }
        out
    }

    /// The innermost loop whose body holds `op` (`None` at top level or for an op not in
    /// `order`); see [`Kernel::loop_nest`]. One walk of `order`: for many queries, call
    /// `loop_nest` once.
    pub fn loop_of(&self, op: OpId) -> Option<LoopId> {
        let pos = self.position(op);
        if pos == usize::MAX {
            return None;
        }
        self.loop_nest()[pos]
    }

    /// The loops enclosing `op`, outermost first (empty at top level).
    pub fn loops_around(&self, op: OpId) -> Vec<LoopId> {
        let mut stack: Vec<LoopId> = Vec::new();
        for &o in &self.order {
            if o == op {
                return stack;
            }
            match self.op(o) {
                Op::For { id, .. } => stack.push(*id),
                Op::Yield { id } if stack.last() == Some(id) => {
                    stack.pop();
                }
                _ => {}
            }
        }
        Vec::new()
    }

    /// Positions in [`Kernel::order`] of the `For` and the `Yield` of loop `id`: its
    /// body is `order[for_pos + 1..yield_pos]`. `None` when either is missing.
    pub fn loop_body(&self, id: LoopId) -> Option<(usize, usize)> {
        let f = self.order.iter().position(|&o| matches!(self.op(o), Op::For { id: i, .. } if *i == id))?;
        let y = self.order.iter().position(|&o| matches!(self.op(o), Op::Yield { id: i } if *i == id))?;
        Some((f, y))
    }

    /// Everything about loop `id`: its `For` and `Yield` (ops and positions), and its
    /// index, carried and result values. `None` when its `For` or `Yield` is missing.
    pub fn loop_info(&self, id: LoopId) -> Option<LoopInfo> {
        let (for_pos, yield_pos) = self.loop_body(id)?;
        let (for_op, yield_op) = (self.order[for_pos], self.order[yield_pos]);
        let Op::For { carried, .. } = *self.op(for_op) else { unreachable!() };
        let mut info = LoopInfo {
            id,
            for_op,
            for_pos,
            yield_op,
            yield_pos,
            carried,
            index: None,
            carried_values: vec![None; carried as usize],
            results: vec![None; carried as usize],
        };
        for &o in &self.order {
            match *self.op(o) {
                Op::LoopIndex { id: i } if i == id => info.index = Some(o.value()),
                Op::LoopCarried { id: i, index } if i == id && index < carried => info.carried_values[index as usize] = Some(o.value()),
                Op::LoopResult { id: i, index } if i == id && index < carried => info.results[index as usize] = Some(o.value()),
                _ => {}
            }
        }
        Some(info)
    }

    /// The loops of the kernel in program order of their `For`s.
    pub fn loops(&self) -> Vec<LoopId> {
        self.ops().filter_map(|o| if let Op::For { id, .. } = self.op(o) { Some(*id) } else { None }).collect()
    }

    /// A loop id no op of the kernel uses yet (one more than the largest in use).
    pub fn fresh_loop_id(&self) -> LoopId {
        let next = self.graph.node_weights().filter_map(|n| n.op.loop_id()).map(|l| l.0 + 1).max().unwrap_or(0);
        LoopId(next)
    }

    /// The display name of a shape symbol.
    pub fn shape_name(&self, s: ShapeSym) -> &str {
        &self.shape_syms[s.0 as usize]
    }

    /// The display name of a tile symbol.
    pub fn tile_name(&self, t: TileSym) -> &str {
        &self.tile_syms[t.0 as usize]
    }

    /// The tensor-dimension symbols of a tensor parameter.
    pub fn tensor_dims(&self, p: ParamId) -> &[ShapeSym] {
        self.params[p.0 as usize].dims()
    }

    /// A parameter by id.
    pub fn param(&self, p: ParamId) -> &Param {
        &self.params[p.0 as usize]
    }

    /// Formats an extent with symbol names (`BN`, `N`, `64`).
    pub fn extent_name(&self, e: Extent) -> String {
        match e {
            Extent::Const(c) => c.to_string(),
            Extent::Tile(t) => self.tile_name(t).to_string(),
            Extent::Full(s) => format!("{}!", self.shape_name(s)),
        }
    }
}

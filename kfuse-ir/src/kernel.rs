//! The kernel graph: ops as nodes of a `petgraph::StableDiGraph`, data flow as edges.
//!
//! A [`Kernel`] describes one *program instance* working on tiles; the launch grid is
//! derived from how `program_id` indexes the stores (see [`crate::grid`]).
//!
//! Representation:
//! - every node is one [`Node`]: an [`Op`] and the [`Type`] of its result (`None` for
//!   ops without a result, i.e. `Store`);
//! - an edge `a → b` with weight `k` says "the result of `a` is operand `k` of `b`";
//! - [`Kernel::order`] lists every node once in program order (a topological order);
//!   the printer and the code writer walk it, which keeps their output deterministic;
//! - per-op facts that passes decide live in side tables ([`Kernel::names`],
//!   [`Kernel::schedule`]), never inside the nodes.
//!
//! Ids: [`OpId`] names a node, [`ValueId`] names the result of a node. Both wrap the
//! same petgraph index; an op has at most one result.

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
    pub fn index(self) -> usize {
        self.0.index()
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0.index())
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
    pub dtype: DType,
    pub shape: Vec<Extent>,
}

impl Type {
    pub fn scalar(dtype: DType) -> Type {
        Type { dtype, shape: Vec::new() }
    }
    pub fn tile(dtype: DType, shape: Vec<Extent>) -> Type {
        Type { dtype, shape }
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
}

/// What a kernel parameter is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A tensor in device memory with one shape symbol per dimension; `output` tensors
    /// are written (`&mut Tensor` in the kernel signature), the others only read.
    Tensor { dims: Vec<ShapeSym>, output: bool },
    /// A scalar passed by value.
    Scalar,
}

/// One kernel parameter, in signature order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub dtype: DType,
    pub kind: ParamKind,
}

impl Param {
    pub fn is_tensor(&self) -> bool {
        matches!(self.kind, ParamKind::Tensor { .. })
    }
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
}

/// A scalar literal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Literal {
    Float(f64),
    Int(i64),
    Bool(bool),
}

impl Literal {
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
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sigmoid,
    Tanh,
    Erf,
    /// Sine and cosine (radians).
    Sin,
    Cos,
    /// Logical not (for `Bool`).
    Not,
}

/// Elementwise functions of two operands of the same type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// Float division; on `I64`, division truncating toward zero.
    Div,
    /// Remainder (`I64` only).
    Rem,
    Max,
    Min,
    /// Comparisons give `Bool`.
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge | BinaryOp::Eq | BinaryOp::Ne)
    }
}

/// Reductions along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    /// The sum divided by the number of *valid* (in-bounds) elements.
    Mean,
}

/// A tile op. Operand counts and types are checked by the verifier (`crate::verify`).
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `program_id(axis)`: this program instance's index along a grid axis. `I64` scalar.
    ProgramId { axis: u8 },
    /// The value of a scalar parameter.
    ScalarParam { param: ParamId },
    /// The runtime value of a shape symbol. `I64` scalar.
    ShapeDim { sym: ShapeSym },
    /// The compiled value of a tile extent (a tile symbol in index arithmetic). `I64` scalar.
    TileExtent { extent: Extent },
    /// A scalar literal of the result type.
    Const { value: Literal },
    /// Reads a block of a tensor parameter. Operands: one `I64` scalar offset per tensor
    /// dimension. Elements outside the tensor are not loaded: they are *invalid* lanes of
    /// the tile (see `crate` docs on masking).
    Load { tensor: ParamId, dims: Vec<AccessDim> },
    /// Writes a tile into a block of an output tensor. Operands: one offset per tensor
    /// dimension, then the value. Only in-bounds, valid lanes are written.
    Store { tensor: ParamId, dims: Vec<AccessDim> },
    /// Operand: one value.
    Unary(UnaryOp),
    /// Operands: two values of the same shape and dtype.
    Binary(BinaryOp),
    /// Operands: a `Bool` condition, then the value if true, the value if false; all of
    /// one shape.
    Select,
    /// Converts the operand to another element type.
    Cast { to: DType },
    /// Reduces one axis of the operand; invalid lanes do not take part. With `keep_dim`
    /// the axis stays in the result with extent 1.
    Reduce { op: ReduceOp, axis: u32, keep_dim: bool },
    /// Broadcasts the operand to `Type::shape` of the result: numpy rules, axes aligned
    /// to the right; each operand axis equals the result's or is the literal extent 1,
    /// and leading result axes may be absent from the operand.
    Broadcast,
    /// Reorders the axes of the operand: result axis `i` is operand axis `perm[i]`.
    Permute { perm: Vec<u32> },
    /// No operands: the `I64` tile `[extent]` holding `0, 1, …, extent - 1` (every lane
    /// valid).
    Iota { extent: Extent },
    /// Operand: one value. The result is the operand with a new axis of literal extent 1
    /// inserted at position `axis` (`0..=rank`); the data is unchanged.
    ExpandDims { axis: u32 },
    /// The identity on values: marks where the value changes its distribution over
    /// threads (inserted by the layout pass; the writer moves it through shared memory).
    Convert,
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
        }
    }

    /// True for ops with a result.
    pub fn has_result(&self) -> bool {
        !matches!(self, Op::Store { .. })
    }
}

/// A node of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    /// The result type; `None` exactly when the op has no result.
    pub ty: Option<Type>,
}

/// One kernel: parameters, symbols, the op graph and the side tables passes fill in.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// The kernel's name (a Rust identifier; the CUDA entry point is derived from it).
    pub name: String,
    pub params: Vec<Param>,
    /// Names of shape symbols, indexed by [`ShapeSym`].
    pub shape_syms: Vec<String>,
    /// Names of tile symbols, indexed by [`TileSym`].
    pub tile_syms: Vec<String>,
    pub graph: StableDiGraph<Node, u8>,
    /// Every node exactly once, in program order (a topological order of `graph`).
    pub order: Vec<OpId>,
    /// Source names of values bound with `let` (for the printer and generated code).
    pub names: BTreeMap<ValueId, String>,
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
            schedule: Schedule::default(),
        }
    }

    pub fn node(&self, op: OpId) -> &Node {
        &self.graph[op.0]
    }

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

    /// Adds a node and places it in program order right before `before`.
    pub fn insert_before(&mut self, before: OpId, op: Op, ty: Option<Type>, operands: &[ValueId]) -> OpId {
        let id = self.push(op, ty, operands);
        self.order.pop();
        let pos = self.position(before);
        self.order.insert(pos, id);
        id
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

//! Building a kernel op by op, with the language's typing rules.
//!
//! The `#[kfuse]` macro drives a [`Builder`] twice: at compile time, to type-check the
//! kernel for every dtype its generic parameters can take (errors land on the user's
//! code), and at run time, to build the IR for the dtypes of the actual arguments.
//! Hand-written kernels use the same calls.
//!
//! Typing rules enforced here:
//! - binary ops need equal dtypes; a *literal* operand ([`Builder::literal`]) takes the
//!   dtype of the other side;
//! - shapes broadcast numpy-style (axes aligned right; an axis matches when equal, when
//!   it is the literal extent 1, or when absent); the builder inserts explicit
//!   `Broadcast` ops, so every op after the builder sees operands of one shape;
//! - offsets of loads and stores are `i64` scalars, one per tensor dimension;
//! - only output tensors (`&mut Tensor`) are stored to, with a value whose shape and
//!   dtype match the block;
//! - `exp`, `log`, `sin`, `cos` and the other transcendental unary ops take floats;
//! - `iota(E)` is an `i64` tile `[E]`; `expand_dims(x, a)` inserts an axis of extent 1
//!   at `a` (`0..=rank`, negative counts from the end of the result);
//! - `zeros(dtype, shape)` is a constant 0 broadcast to `shape`; `dot(a, b)` takes
//!   `[M, K]` and `[K, N]` tiles of one float dtype (the same `K` extent) and gives
//!   `f32 [M, N]`;
//! - loops: [`Builder::begin_for`] opens one (`lo`, `hi`, `step` are `i64` scalars; the
//!   inits fix the carried values' types: a weak literal init keeps its default dtype,
//!   `f32` or `i64`), and [`Builder::end_for`] closes the innermost open loop with the
//!   next value of each carried value: a weak literal adapts to its dtype and a value
//!   broadcasts to its shape (as a stored value does), and then the type must be the
//!   init's. [`Builder::conform`] applies the same rule at an assignment, so that a
//!   front end can report a mismatch where it is written. Values made inside a loop are
//!   used only inside it (the verifier checks this in [`Builder::finish`]).

use std::collections::{BTreeSet, HashMap};

use crate::dtype::DType;
use crate::error::{IrError, Result};
use crate::kernel::*;

/// Builds a [`Kernel`]; see the module docs for the typing rules.
///
/// # Examples
///
/// `out = x + y` in blocks of `BN` elements, one program per block — what
/// `out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load() + …)` lowers to:
///
/// ```
/// use kfuse_ir::{AccessDim, BinaryOp, Builder, DType, Extent};
///
/// let mut b = Builder::new("add");
/// let n = b.shape_sym("N");
/// let bn = Extent::Tile(b.tile_sym("BN"));
/// let x = b.tensor_param("x", DType::F32, &[n], false);
/// let y = b.tensor_param("y", DType::F32, &[n], false);
/// let out = b.tensor_param("out", DType::F32, &[n], true);
/// let i = b.program_id(0)?;
/// let bn_value = b.tile_extent(bn);
/// let off = b.binary(BinaryOp::Mul, i, bn_value)?; // i * BN
/// let xs = b.load(x, &[off], &[AccessDim::Tile(bn)])?;
/// let ys = b.load(y, &[off], &[AccessDim::Tile(bn)])?;
/// let sum = b.binary(BinaryOp::Add, xs, ys)?;
/// b.store(out, &[off], &[AccessDim::Tile(bn)], sum)?;
/// let k = b.finish()?; // verified
/// assert_eq!(k.params.len(), 3);
/// assert!(kfuse_ir::print::print(&k).contains("store out"));
/// # Ok::<(), kfuse_ir::IrError>(())
/// ```
pub struct Builder {
    k: Kernel,
    shapes: HashMap<String, ShapeSym>,
    tiles: HashMap<String, TileSym>,
    /// Literal constants whose dtype adapts to the other operand.
    weak: BTreeSet<ValueId>,
    /// The loops begun and not yet ended, innermost last.
    open: Vec<OpenLoop>,
    next_loop: u32,
    /// The source location given the ops created from now on ([`Builder::at`]).
    loc: Option<Loc>,
}

/// A loop between `begin_for` and `end_for`.
struct OpenLoop {
    id: LoopId,
    /// The types of its carried values.
    types: Vec<Type>,
}

fn shape_str(k: &Kernel, s: &[Extent]) -> String {
    let parts: Vec<String> = s.iter().map(|e| k.extent_name(*e)).collect();
    format!("[{}]", parts.join(", "))
}

/// `f32[BM, BN]`, or `f32` for a scalar.
fn type_str(k: &Kernel, t: &Type) -> String {
    if t.is_scalar() {
        t.dtype.to_string()
    } else {
        format!("{}{}", t.dtype, shape_str(k, &t.shape))
    }
}

impl Builder {
    /// An empty kernel named `name` (a Rust identifier).
    pub fn new(name: impl Into<String>) -> Builder {
        Builder {
            k: Kernel::new(name),
            shapes: HashMap::new(),
            tiles: HashMap::new(),
            weak: BTreeSet::new(),
            open: Vec::new(),
            next_loop: 0,
            loc: None,
        }
    }

    /// Sets the source location (line and column, from 1) of the ops created from now
    /// on, conversions the builder inserts included; the `#[kfuse]` macro calls it
    /// before each builder call with the user's line. Codegen's errors name it.
    pub fn at(&mut self, line: u32, column: u32) {
        self.loc = Some(Loc { line, column });
    }

    /// [`Kernel::push`], recording the current location.
    fn push(&mut self, op: Op, ty: Option<Type>, operands: &[ValueId]) -> OpId {
        let id = self.k.push(op, ty, operands);
        if let Some(l) = self.loc {
            self.k.locs.insert(id, l);
        }
        id
    }

    /// The kernel built so far (for names and types while building).
    pub fn kernel(&self) -> &Kernel {
        &self.k
    }

    /// The shape symbol with this name, created on first use.
    pub fn shape_sym(&mut self, name: &str) -> ShapeSym {
        if let Some(s) = self.shapes.get(name) {
            return *s;
        }
        let s = ShapeSym(self.k.shape_syms.len() as u32);
        self.k.shape_syms.push(name.to_string());
        self.shapes.insert(name.to_string(), s);
        s
    }

    /// Looks up a shape symbol without creating it.
    pub fn find_shape_sym(&self, name: &str) -> Option<ShapeSym> {
        self.shapes.get(name).copied()
    }

    /// The tile symbol with this name, created on first use.
    pub fn tile_sym(&mut self, name: &str) -> TileSym {
        if let Some(s) = self.tiles.get(name) {
            return *s;
        }
        let s = TileSym(self.k.tile_syms.len() as u32);
        self.k.tile_syms.push(name.to_string());
        self.tiles.insert(name.to_string(), s);
        s
    }

    /// Declares a tensor parameter with one shape symbol per dimension.
    pub fn tensor_param(&mut self, name: &str, dtype: DType, dims: &[ShapeSym], output: bool) -> ParamId {
        let id = ParamId(self.k.params.len() as u32);
        self.k.params.push(Param { name: name.to_string(), dtype, kind: ParamKind::Tensor { dims: dims.to_vec(), output } });
        id
    }

    /// Declares a scalar parameter and returns it with the value that reads it.
    pub fn scalar_param(&mut self, name: &str, dtype: DType) -> (ParamId, ValueId) {
        let id = ParamId(self.k.params.len() as u32);
        self.k.params.push(Param { name: name.to_string(), dtype, kind: ParamKind::Scalar });
        let v = self.push(Op::ScalarParam { param: id }, Some(Type::scalar(dtype)), &[]).value();
        self.k.names.insert(v, name.to_string());
        (id, v)
    }

    /// `program_id(axis)`.
    pub fn program_id(&mut self, axis: u8) -> Result<ValueId> {
        if axis > 2 {
            return Err(IrError::GridAxis(axis));
        }
        Ok(self.push(Op::ProgramId { axis }, Some(Type::scalar(DType::I64)), &[]).value())
    }

    /// The runtime value of a shape symbol, as an `i64` scalar.
    pub fn shape_dim(&mut self, sym: ShapeSym) -> ValueId {
        self.push(Op::ShapeDim { sym }, Some(Type::scalar(DType::I64)), &[]).value()
    }

    /// The value of a tile extent, as an `i64` scalar.
    pub fn tile_extent(&mut self, extent: Extent) -> ValueId {
        self.push(Op::TileExtent { extent }, Some(Type::scalar(DType::I64)), &[]).value()
    }

    /// A constant of a definite dtype.
    pub fn constant(&mut self, value: Literal, dtype: DType) -> ValueId {
        let value = match (value, dtype) {
            (Literal::Int(i), d) if d.is_float() => Literal::Float(i as f64),
            (v, _) => v,
        };
        self.push(Op::Const { value }, Some(Type::scalar(dtype)), &[]).value()
    }

    /// A literal written in the kernel: `f32` for floats, `i64` for integers, but its
    /// dtype adapts to the other operand of the op that uses it.
    pub fn literal(&mut self, value: Literal) -> ValueId {
        let dtype = match value {
            Literal::Float(_) => DType::F32,
            Literal::Int(_) => DType::I64,
            Literal::Bool(_) => DType::Bool,
        };
        let v = self.constant(value, dtype);
        self.weak.insert(v);
        v
    }

    /// Records a source name for a value (from a `let` binding).
    pub fn name(&mut self, v: ValueId, name: &str) {
        self.k.names.entry(v).or_insert_with(|| name.to_string());
    }

    /// The type of a value.
    pub fn ty(&self, v: ValueId) -> &Type {
        self.k.ty(v)
    }

    /// Reads a block of a tensor: `offsets` (one `i64` scalar per tensor dimension, or an
    /// index tile, below) and `dims` say where and how much. The tile's shape is the
    /// `Tile` extents of `dims` and the gathered axis ([`AccessDim::tile_shape`]).
    ///
    /// An `Index` dimension whose offset is an `i64` tile of rank 1 (`[E]`) is gathered
    /// ([`AccessDim::Gather`]): element `e` of the gathered axis reads the tensor at
    /// coordinate `offset[e]` along it; the gathered dimensions share that axis (all
    /// their index tiles have extent `E`), placed where the first of them stands.
    pub fn load(&mut self, tensor: ParamId, offsets: &[ValueId], dims: &[AccessDim]) -> Result<ValueId> {
        let (ty, offsets, dims) = self.access_type(tensor, offsets, dims, "load")?;
        Ok(self.push(Op::Load { tensor, dims }, Some(ty), &offsets).value())
    }

    /// Writes `value` into a block of an output tensor.
    pub fn store(&mut self, tensor: ParamId, offsets: &[ValueId], dims: &[AccessDim], value: ValueId) -> Result<OpId> {
        let (ops, dims) = self.store_operands(tensor, offsets, dims, value)?;
        Ok(self.push(Op::Store { tensor, dims }, None, &ops))
    }

    /// Writes the elements of `value` where `mask` (a `bool` tile broadcast to the
    /// block's shape) is true into a block of an output tensor; the others keep what
    /// they hold. The store's operands are the offsets, the value, then the mask.
    pub fn store_where(&mut self, tensor: ParamId, offsets: &[ValueId], dims: &[AccessDim], mask: ValueId, value: ValueId) -> Result<OpId> {
        let (mut ops, dims) = self.store_operands(tensor, offsets, dims, value)?;
        let shape = self.k.ty(*ops.last().expect("a stored value")).shape.clone();
        let mt = self.k.ty(mask).clone();
        if mt.dtype != DType::Bool {
            return Err(IrError::DTypeMismatch { op: "store_where".into(), left: "a bool mask".into(), right: mt.dtype.to_string() });
        }
        ops.push(if mt.shape != shape { self.broadcast_to(mask, &shape, "store_where")? } else { mask });
        Ok(self.push(Op::Store { tensor, dims }, None, &ops))
    }

    /// A store's offsets and its value (coerced and broadcast to the block), and its
    /// dimensions with the gathered ones resolved.
    fn store_operands(&mut self, tensor: ParamId, offsets: &[ValueId], dims: &[AccessDim], value: ValueId) -> Result<(Vec<ValueId>, Vec<AccessDim>)> {
        let (ty, offsets, dims) = self.access_type(tensor, offsets, dims, "store")?;
        let p = self.k.params[tensor.0 as usize].clone();
        if !p.is_output() {
            return Err(IrError::StoreToInput { tensor: p.name });
        }
        let value = self.coerce_weak(value, ty.dtype);
        let vt = self.k.ty(value).clone();
        if vt.dtype != ty.dtype {
            return Err(IrError::DTypeMismatch { op: "store".into(), left: format!("{} `{}`", ty.dtype, p.name), right: vt.dtype.to_string() });
        }
        let value = if vt.shape != ty.shape { self.broadcast_to(value, &ty.shape, "store")? } else { value };
        let mut ops = offsets;
        ops.push(value);
        Ok((ops, dims))
    }

    /// The type of a block access, its offsets and its dimensions: an `Index` dimension
    /// whose offset is an `i64` tile of rank 1 becomes a `Gather`, its index tile
    /// broadcast to the tile's shape.
    fn access_type(&mut self, tensor: ParamId, offsets: &[ValueId], dims: &[AccessDim], op: &str) -> Result<(Type, Vec<ValueId>, Vec<AccessDim>)> {
        let p = self.k.params.get(tensor.0 as usize).ok_or_else(|| IrError::Expected {
            op: op.into(),
            expected: "a tensor parameter".into(),
            found: format!("parameter #{}", tensor.0),
        })?;
        let (name, dtype) = (p.name.clone(), p.dtype);
        let rank = match &p.kind {
            ParamKind::Tensor { dims, .. } => dims.len(),
            ParamKind::Scalar => {
                return Err(IrError::Expected { op: op.into(), expected: "a tensor".into(), found: format!("scalar `{name}`") })
            }
        };
        if offsets.len() != rank || dims.len() != rank {
            return Err(IrError::OffsetCount { tensor: name, rank, given: if offsets.len() != rank { offsets.len() } else { dims.len() } });
        }
        let mut dims = dims.to_vec();
        let mut gather: Option<Extent> = None;
        for (d, &o) in offsets.iter().enumerate() {
            let t = self.k.ty(o);
            if t.is_scalar() && t.dtype == DType::I64 {
                continue;
            }
            let found = format!("{} {}", t.dtype, shape_str(&self.k, &t.shape));
            let gathered = t.dtype == DType::I64 && t.rank() == 1 && matches!(dims[d], AccessDim::Index | AccessDim::Gather(_));
            if !gathered {
                let expected = "i64 scalar offsets, or an i64 tile of rank 1 (a gather) where the extent is `_`";
                return Err(IrError::Expected { op: op.into(), expected: expected.into(), found });
            }
            let e = t.shape[0];
            if gather.is_some_and(|g| g != e) {
                let left = shape_str(&self.k, &[gather.unwrap()]);
                return Err(IrError::ShapeMismatch { op: format!("{op} (the index tiles of a gather)"), left, right: shape_str(&self.k, &[e]) });
            }
            gather = Some(e);
            dims[d] = AccessDim::Gather(e);
        }
        let shape = AccessDim::tile_shape(&dims);
        let axes = AccessDim::tile_axes(&dims);
        let mut offsets = offsets.to_vec();
        for (d, o) in offsets.iter_mut().enumerate() {
            if let (AccessDim::Gather(_), Some(a)) = (dims[d], axes[d]) {
                let mut v = *o;
                for _ in a + 1..shape.len() {
                    v = self.expand_dims(v, -1)?;
                }
                *o = self.broadcast_to(v, &shape, op)?;
            }
        }
        Ok((Type::tile(dtype, shape), offsets, dims))
    }

    /// Replaces a weak literal with a constant of `dtype`; other values pass through.
    fn coerce_weak(&mut self, v: ValueId, dtype: DType) -> ValueId {
        if self.weak.contains(&v) && self.k.ty(v).dtype != dtype {
            if let Op::Const { value } = *self.k.op(v.op()) {
                // Only where the literal means the same thing in `dtype`: an integer
                // literal becomes a float or an `i64`, a float literal another float, a
                // bool literal a bool. Otherwise the op reports the dtype mismatch.
                let fits = match value {
                    Literal::Int(_) => dtype.is_float() || dtype == DType::I64,
                    Literal::Float(_) => dtype.is_float(),
                    Literal::Bool(_) => dtype == DType::Bool,
                };
                if !fits {
                    return v;
                }
                let c = self.constant(value, dtype);
                self.weak.insert(c);
                return c;
            }
        }
        v
    }

    /// The common shape of two shapes under broadcasting.
    fn broadcast_shape(&self, a: &[Extent], b: &[Extent], op: &str) -> Result<Vec<Extent>> {
        let n = a.len().max(b.len());
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let ea = if i + a.len() >= n { Some(a[i + a.len() - n]) } else { None };
            let eb = if i + b.len() >= n { Some(b[i + b.len() - n]) } else { None };
            out.push(match (ea, eb) {
                (Some(x), Some(y)) if x == y => x,
                (Some(Extent::Const(1)), Some(y)) => y,
                (Some(x), Some(Extent::Const(1))) => x,
                (Some(x), None) => x,
                (None, Some(y)) => y,
                _ => {
                    return Err(IrError::ShapeMismatch { op: op.into(), left: shape_str(&self.k, a), right: shape_str(&self.k, b) })
                }
            });
        }
        Ok(out)
    }

    /// Broadcasts `v` to `shape` (numpy rules); a no-op when the shape already matches.
    pub fn broadcast_to(&mut self, v: ValueId, shape: &[Extent], op: &str) -> Result<ValueId> {
        let t = self.k.ty(v).clone();
        if t.shape == shape {
            return Ok(v);
        }
        let common = self.broadcast_shape(&t.shape, shape, op)?;
        if common != shape {
            return Err(IrError::ShapeMismatch { op: op.into(), left: shape_str(&self.k, &t.shape), right: shape_str(&self.k, shape) });
        }
        Ok(self.push(Op::Broadcast, Some(Type::tile(t.dtype, shape.to_vec())), &[v]).value())
    }

    /// An elementwise unary op.
    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        let t = self.k.ty(x).clone();
        let ok = match op {
            UnaryOp::Not => t.dtype == DType::Bool,
            UnaryOp::Neg | UnaryOp::Abs => t.dtype != DType::Bool,
            _ => t.dtype.is_float(),
        };
        if !ok {
            let expected = match op {
                UnaryOp::Not => "bool",
                UnaryOp::Neg | UnaryOp::Abs => "a number",
                _ => "a float (f32, f16, bf16, f8e4m3, f8e5m2)",
            };
            return Err(IrError::Expected { op: format!("{op:?}").to_lowercase(), expected: expected.into(), found: t.dtype.to_string() });
        }
        Ok(self.push(Op::Unary(op), Some(t), &[x]).value())
    }

    /// An elementwise binary op with broadcasting and literal coercion.
    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId> {
        let name = format!("{op:?}").to_lowercase();
        let (a, b) = self.unify(a, b, &name)?;
        let t = self.k.ty(a).clone();
        let ok = match op {
            BinaryOp::And | BinaryOp::Or => t.dtype == DType::Bool,
            BinaryOp::Rem => t.dtype == DType::I64,
            BinaryOp::Eq | BinaryOp::Ne => true,
            _ => t.dtype != DType::Bool,
        };
        if !ok {
            let expected = match op {
                BinaryOp::And | BinaryOp::Or => "bool operands",
                BinaryOp::Rem => "i64 operands",
                _ => "numeric operands",
            };
            return Err(IrError::Expected { op: name, expected: expected.into(), found: t.dtype.to_string() });
        }
        let rt = if op.is_comparison() { Type::tile(DType::Bool, t.shape) } else { t };
        Ok(self.push(Op::Binary(op), Some(rt), &[a, b]).value())
    }

    /// Brings two operands to one dtype (via literal coercion) and one shape.
    fn unify(&mut self, a: ValueId, b: ValueId, op: &str) -> Result<(ValueId, ValueId)> {
        let (da, db) = (self.k.ty(a).dtype, self.k.ty(b).dtype);
        let (a, b) = if self.weak.contains(&a) && !self.weak.contains(&b) {
            (self.coerce_weak(a, db), b)
        } else if self.weak.contains(&b) && !self.weak.contains(&a) {
            (a, self.coerce_weak(b, da))
        } else {
            (a, b)
        };
        let (ta, tb) = (self.k.ty(a).clone(), self.k.ty(b).clone());
        if ta.dtype != tb.dtype {
            return Err(IrError::DTypeMismatch { op: op.into(), left: ta.dtype.to_string(), right: tb.dtype.to_string() });
        }
        let shape = self.broadcast_shape(&ta.shape, &tb.shape, op)?;
        let a = self.broadcast_to(a, &shape, op)?;
        let b = self.broadcast_to(b, &shape, op)?;
        Ok((a, b))
    }

    /// `select(cond, if_true, if_false)`, elementwise, with broadcasting.
    pub fn select(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        if self.k.ty(cond).dtype != DType::Bool {
            return Err(IrError::Expected { op: "select".into(), expected: "a bool condition".into(), found: self.k.ty(cond).dtype.to_string() });
        }
        let (a, b) = self.unify(a, b, "select")?;
        let shape = self.broadcast_shape(&self.k.ty(cond).shape.clone(), &self.k.ty(a).shape.clone(), "select")?;
        let cond = self.broadcast_to(cond, &shape, "select")?;
        let a = self.broadcast_to(a, &shape, "select")?;
        let b = self.broadcast_to(b, &shape, "select")?;
        let t = self.k.ty(a).clone();
        Ok(self.push(Op::Select, Some(t), &[cond, a, b]).value())
    }

    /// Converts to another dtype; a no-op when the dtype already matches.
    pub fn cast(&mut self, x: ValueId, to: DType) -> Result<ValueId> {
        let t = self.k.ty(x).clone();
        if t.dtype == to {
            return Ok(x);
        }
        Ok(self.push(Op::Cast { to }, Some(Type::tile(to, t.shape)), &[x]).value())
    }

    /// Reduces along `axis` (negative counts from the end). With `keep_dim` the axis
    /// stays, with extent 1, so the result broadcasts back against the operand.
    pub fn reduce(&mut self, op: ReduceOp, x: ValueId, axis: i64, keep_dim: bool) -> Result<ValueId> {
        let t = self.k.ty(x).clone();
        let rank = t.rank();
        let ax = if axis < 0 { axis + rank as i64 } else { axis };
        if rank == 0 || ax < 0 || ax >= rank as i64 {
            return Err(IrError::BadAxis { axis, rank });
        }
        if !t.dtype.is_float() && t.dtype != DType::I64 {
            return Err(IrError::Expected { op: "reduce".into(), expected: "a numeric tile".into(), found: t.dtype.to_string() });
        }
        let mut shape = t.shape.clone();
        if keep_dim {
            shape[ax as usize] = Extent::Const(1);
        } else {
            shape.remove(ax as usize);
        }
        Ok(self.push(Op::Reduce { op, axis: ax as u32, keep_dim }, Some(Type::tile(t.dtype, shape)), &[x]).value())
    }

    /// `iota(E)`: the `i64` tile `[E]` holding `0, 1, …, E - 1`.
    pub fn iota(&mut self, extent: Extent) -> Result<ValueId> {
        let known = match extent {
            Extent::Const(c) => c > 0,
            Extent::Tile(t) => (t.0 as usize) < self.k.tile_syms.len(),
            Extent::Full(s) => (s.0 as usize) < self.k.shape_syms.len(),
        };
        if !known {
            return Err(IrError::Expected {
                op: "iota".into(),
                expected: "a positive extent or a known symbol".into(),
                found: format!("{extent:?}"),
            });
        }
        Ok(self.push(Op::Iota { extent }, Some(Type::tile(DType::I64, vec![extent])), &[]).value())
    }

    /// Inserts an axis of extent 1 at `axis` of the result: `0..=rank` of the operand,
    /// negative counts from the end (`-1` appends), as numpy's `expand_dims`. The result
    /// broadcasts against tiles that have a full axis there (`[BM]` → `[BM, 1]`, which
    /// meets `[BM, BN]`).
    pub fn expand_dims(&mut self, x: ValueId, axis: i64) -> Result<ValueId> {
        let t = self.k.ty(x).clone();
        let rank = t.rank();
        let ax = if axis < 0 { axis + rank as i64 + 1 } else { axis };
        if ax < 0 || ax > rank as i64 {
            return Err(IrError::Expected {
                op: "expand_dims".into(),
                expected: format!("an axis in -{}..={rank} for a tile of rank {rank}", rank + 1),
                found: axis.to_string(),
            });
        }
        let mut shape = t.shape.clone();
        shape.insert(ax as usize, Extent::Const(1));
        Ok(self.push(Op::ExpandDims { axis: ax as u32 }, Some(Type::tile(t.dtype, shape)), &[x]).value())
    }

    /// Reorders axes: result axis `i` is operand axis `perm[i]`.
    pub fn permute(&mut self, x: ValueId, perm: &[u32]) -> Result<ValueId> {
        let t = self.k.ty(x).clone();
        let mut seen = vec![false; t.rank()];
        for &p in perm {
            if (p as usize) >= t.rank() || std::mem::replace(&mut seen[p as usize], true) {
                return Err(IrError::Expected { op: "permute".into(), expected: format!("a permutation of 0..{}", t.rank()), found: format!("{perm:?}") });
            }
        }
        if perm.len() != t.rank() {
            return Err(IrError::Expected { op: "permute".into(), expected: format!("a permutation of 0..{}", t.rank()), found: format!("{perm:?}") });
        }
        let shape = perm.iter().map(|&p| t.shape[p as usize]).collect();
        Ok(self.push(Op::Permute { perm: perm.to_vec() }, Some(Type::tile(t.dtype, shape)), &[x]).value())
    }

    /// `dtype` zeros of `shape`: a constant 0 (`false` for `bool`) broadcast to the
    /// shape (just the constant for an empty shape). Not a weak literal: its dtype stays.
    pub fn zeros(&mut self, dtype: DType, shape: &[Extent]) -> Result<ValueId> {
        for &e in shape {
            let known = match e {
                Extent::Const(c) => c > 0,
                Extent::Tile(t) => (t.0 as usize) < self.k.tile_syms.len(),
                Extent::Full(s) => (s.0 as usize) < self.k.shape_syms.len(),
            };
            if !known {
                return Err(IrError::Expected { op: "zeros".into(), expected: "positive extents or known symbols".into(), found: format!("{e:?}") });
            }
        }
        let value = match dtype {
            DType::Bool => Literal::Bool(false),
            DType::I64 => Literal::Int(0),
            _ => Literal::Float(0.0),
        };
        let c = self.constant(value, dtype);
        self.broadcast_to(c, shape, "zeros")
    }

    /// The matrix product of `a: [M, K]` and `b: [K, N]` (one float dtype, the same `K`
    /// extent), as `f32 [M, N]`, every product exact.
    pub fn dot(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.dot_with(a, b, DotPrecision::Exact)
    }

    /// [`Builder::dot`] of f32 tiles whose operands may be read as TF32
    /// ([`DotPrecision::Tf32`]): the tensor cores' fast f32 product, where the target
    /// has one.
    pub fn dot_tf32(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.dot_with(a, b, DotPrecision::Tf32)
    }

    /// The matrix product at a chosen [`DotPrecision`] (`Tf32` takes f32 tiles only).
    pub fn dot_with(&mut self, a: ValueId, b: ValueId, precision: DotPrecision) -> Result<ValueId> {
        let name = Op::Dot { precision }.mnemonic();
        let (ta, tb) = (self.k.ty(a).clone(), self.k.ty(b).clone());
        for t in [&ta, &tb] {
            if t.rank() != 2 {
                let found = type_str(&self.k, t);
                return Err(IrError::Expected { op: name.into(), expected: "rank-2 tiles ([M, K] and [K, N])".into(), found });
            }
            if !t.dtype.is_float() {
                return Err(IrError::Expected { op: name.into(), expected: "float tiles (f32, f16, bf16, f8e4m3, f8e5m2)".into(), found: t.dtype.to_string() });
            }
        }
        if ta.dtype != tb.dtype {
            return Err(IrError::DTypeMismatch { op: name.into(), left: ta.dtype.to_string(), right: tb.dtype.to_string() });
        }
        if ta.shape[1] != tb.shape[0] {
            return Err(IrError::ShapeMismatch {
                op: name.into(),
                left: shape_str(&self.k, &ta.shape),
                right: shape_str(&self.k, &tb.shape),
            });
        }
        if precision == DotPrecision::Tf32 && ta.dtype != DType::F32 {
            return Err(IrError::Expected { op: name.into(), expected: "f32 tiles (TF32 is a reading of f32 operands)".into(), found: ta.dtype.to_string() });
        }
        let ty = Type::tile(DType::F32, vec![ta.shape[0], tb.shape[1]]);
        Ok(self.push(Op::Dot { precision }, Some(ty), &[a, b]).value())
    }

    /// Opens a loop `for (i = lo; i < hi; i += step)` carrying `inits` from one
    /// iteration to the next. Returns the loop's id, its index (an `i64` scalar) and
    /// the carried values as the body sees them at the start of an iteration. The ops
    /// built until [`Builder::end_for`] form the body.
    pub fn begin_for(&mut self, lo: ValueId, hi: ValueId, step: ValueId, inits: &[ValueId]) -> Result<(LoopId, ValueId, Vec<ValueId>)> {
        let mut bounds = [lo, hi, step];
        for (b, what) in bounds.iter_mut().zip(["start", "end", "step"]) {
            *b = self.coerce_weak(*b, DType::I64);
            let t = self.k.ty(*b);
            if !(t.is_scalar() && t.dtype == DType::I64) {
                let found = type_str(&self.k, t);
                return Err(IrError::Expected { op: "for".into(), expected: format!("an i64 scalar {what}"), found });
            }
        }
        if inits.len() > u32::MAX as usize || inits.len() + 3 > u8::MAX as usize + 1 {
            return Err(IrError::Expected { op: "for".into(), expected: "at most 253 carried values".into(), found: inits.len().to_string() });
        }
        let id = LoopId(self.next_loop);
        self.next_loop += 1;
        let types: Vec<Type> = inits.iter().map(|&v| self.k.ty(v).clone()).collect();
        let mut operands = bounds.to_vec();
        operands.extend_from_slice(inits);
        self.push(Op::For { id, carried: inits.len() as u32 }, None, &operands);
        let index = self.push(Op::LoopIndex { id }, Some(Type::scalar(DType::I64)), &[]).value();
        let carried = types
            .iter()
            .enumerate()
            .map(|(i, t)| self.push(Op::LoopCarried { id, index: i as u32 }, Some(t.clone()), &[]).value())
            .collect();
        self.open.push(OpenLoop { id, types });
        Ok((id, index, carried))
    }

    /// Brings `value` to the type of `like` under the rule of a loop's carried values
    /// (see the module docs): a weak literal takes `like`'s dtype, a value broadcasts
    /// to `like`'s shape, and then the dtype must be `like`'s. `what` names the target
    /// in the error (`acc`). A front end calls it where a carried variable is assigned.
    pub fn conform(&mut self, value: ValueId, like: ValueId, what: &str) -> Result<ValueId> {
        let want = self.k.ty(like).clone();
        self.conform_to(value, &want, what)
    }

    fn conform_to(&mut self, value: ValueId, want: &Type, what: &str) -> Result<ValueId> {
        let value = self.coerce_weak(value, want.dtype);
        let t = self.k.ty(value).clone();
        let mismatch = || IrError::Expected {
            op: format!("{what} = .."),
            expected: format!("a value of the type of `{what}` at the start of the loop, {}", type_str(&self.k, want)),
            found: type_str(&self.k, &t),
        };
        if t.dtype != want.dtype {
            return Err(mismatch());
        }
        if t.shape == want.shape {
            return Ok(value);
        }
        let err = mismatch();
        self.broadcast_to(value, &want.shape, what).map_err(|_| err)
    }

    /// Closes loop `id`, which must be the innermost open one, with the next value of
    /// each carried value (see [`Builder::conform`] for how they are brought to the
    /// carried types). Returns the loop's results: the carried values after the loop.
    pub fn end_for(&mut self, id: LoopId, next: &[ValueId]) -> Result<Vec<ValueId>> {
        let Some(top) = self.open.last() else {
            return Err(IrError::Expected { op: "end_for".into(), expected: format!("open loop {id}"), found: "no open loop".into() });
        };
        if top.id != id {
            return Err(IrError::Expected { op: "end_for".into(), expected: format!("the innermost open loop, {}", top.id), found: id.to_string() });
        }
        if next.len() != top.types.len() {
            return Err(IrError::Expected {
                op: "end_for".into(),
                expected: format!("{} next values (one per carried value)", top.types.len()),
                found: next.len().to_string(),
            });
        }
        let types = top.types.clone();
        let mut vals = Vec::with_capacity(next.len());
        for (i, (&v, t)) in next.iter().zip(&types).enumerate() {
            vals.push(self.conform_to(v, t, &format!("carried value {i} of loop {id}"))?);
        }
        self.open.pop();
        self.push(Op::Yield { id }, None, &vals);
        Ok(types
            .iter()
            .enumerate()
            .map(|(i, t)| self.push(Op::LoopResult { id, index: i as u32 }, Some(t.clone()), &[]).value())
            .collect())
    }

    /// Finishes the kernel and runs the verifier. Literals left without users (their
    /// dtype was adapted into a new constant) are dropped. A loop left open is an error.
    pub fn finish(mut self) -> Result<Kernel> {
        if let Some(l) = self.open.last() {
            return Err(IrError::Expected { op: "finish".into(), expected: "every loop ended (end_for)".into(), found: format!("loop {} open", l.id) });
        }
        for v in std::mem::take(&mut self.weak) {
            if self.k.users(v).is_empty() {
                self.k.remove(v.op());
            }
        }
        crate::verify::verify(&self.k, "build")?;
        Ok(self.k)
    }
}

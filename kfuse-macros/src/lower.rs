//! [`ast`](crate::ast) → [`Plan`]: the kernel as a straight list of IR-builder calls.
//!
//! This module is an addition to the parse → validate → expand pipeline, and the reason
//! the other two cannot disagree: name resolution and the language's surface rules
//! (known functions and methods, arities, what an access is) are decided here, once,
//! and the result is a list of [`Step`]s, each one call of `kfuse_ir::Builder`
//! with its operands named by the slots of earlier steps. [`crate::validate`] *executes*
//! the plan on a real builder for every dtype assignment of the generics; and
//! [`crate::expand`] *prints* the same plan as Rust code for the generated `build`. The
//! plan does not depend on the dtypes (a generic stays [`DTy::Generic`]), so the code
//! that runs is the code that was checked.
//!
//! Scoping: a name is looked up as a local (`let`, or a `for` loop's variable), then a
//! scalar parameter, then a tensor parameter (only as the receiver of `.block`, `.row`,
//! `.load`, `.store`), then a shape symbol of the signature (its runtime extent, `i64`),
//! then, when it is ALL-CAPS, a tile symbol (its compiled extent, `i64`). `let mut`
//! variables are rebound SSA-style by `=` and `+=` (and `-=`, `*=`, `/=`, `%=`).
//!
//! Loops: a loop body is a scope (its `let`s end with it, as in Rust). A `let mut`
//! variable declared outside a loop and assigned anywhere in its body (nested loops
//! included) is a *carried value* of that loop: the loop begins with the variable's
//! value as the init, the body reads the carried value, the end of the body yields the
//! variable's last value, and after the loop the variable is the loop's result. Each
//! assignment to a carried variable is checked against the variable's type where the
//! loop begins ([`StepKind::Conform`], so that a mismatch is reported at the
//! assignment). Outside loops, and for variables declared in the same loop body, an
//! assignment just rebinds the name.

use std::collections::HashMap;

use kfuse_ir::{BinaryOp, DType, Literal, ReduceOp, UnaryOp};
use proc_macro2::Ident;

use crate::ast::*;

/// Index of a step; its result, when it has one.
pub type Slot = usize;

/// An [`kfuse_ir::Extent`] whose symbols are slots of [`StepKind::TileSym`] /
/// [`StepKind::ShapeSym`] steps.
#[derive(Clone, Copy, Debug)]
pub enum ExtentRef {
    Const(u32),
    Tile(Slot),
    Full(Slot),
}

/// An [`kfuse_ir::AccessDim`] with slot-valued extents.
#[derive(Clone, Copy, Debug)]
pub enum DimRef {
    Index,
    Tile(ExtentRef),
}

/// One builder call. The comment on each variant names it.
#[derive(Clone, Debug)]
pub enum StepKind {
    /// `shape_sym(name)` → `ShapeSym`
    ShapeSym(String),
    /// `tile_sym(name)` → `TileSym`
    TileSym(String),
    /// `tensor_param(name, dtype, dims, output)` → `ParamId`
    TensorParam { name: String, dtype: DTy, dims: Vec<Slot>, output: bool },
    /// `scalar_param(name, dtype).1` → value
    ScalarParam { name: String, dtype: DType },
    /// `program_id(axis)?` → value
    ProgramId(u8),
    /// `shape_dim(sym)` → value
    ShapeDim(Slot),
    /// `tile_extent(extent)` → value
    TileExtent(ExtentRef),
    /// `literal(value)` → a weak value
    Literal(Literal),
    /// `constant(value, dtype)` → value
    Constant(Literal, DType),
    /// `load(tensor, offsets, dims)?` → value
    Load { tensor: Slot, offsets: Vec<Slot>, dims: Vec<DimRef> },
    /// `store(tensor, offsets, dims, value)?`; the spans locate its errors.
    /// `mask`: `store_where(mask, value)`'s (the elements written).
    Store { tensor: Slot, offsets: Vec<Slot>, dims: Vec<DimRef>, value: Slot, mask: Option<Slot>, tensor_sp: Sp, value_sp: Sp },
    /// `unary(op, x)?`
    Unary(UnaryOp, Slot),
    /// `binary(op, a, b)?`
    Binary(BinaryOp, Slot, Slot),
    /// `select(cond, a, b)?`
    Select(Slot, Slot, Slot),
    /// `cast(x, dtype)?`
    Cast(Slot, DTy),
    /// `reduce(op, x, axis, keep_dim)?`
    Reduce { op: ReduceOp, x: Slot, axis: i64, keep_dim: bool },
    /// `permute(x, perm)?`
    Permute(Slot, Vec<u32>),
    /// `iota(extent)?`
    Iota(ExtentRef),
    /// `expand_dims(x, axis)?`
    ExpandDims(Slot, i64),
    /// `name(x, name)`: a `let` binding's source name.
    Name(Slot, String),
    /// `zeros(dtype, extents)?`
    Zeros { dtype: DTy, extents: Vec<ExtentRef> },
    /// `dot(a, b)?`, or `dot_tf32(a, b)?` when the flag is set.
    Dot(Slot, Slot, bool),
    /// `begin_for(lo, hi, step, inits)?` → `(LoopId, index, carried)`, which the next
    /// steps take apart.
    BeginFor { lo: Slot, hi: Slot, step: Slot, inits: Vec<Slot> },
    /// The index of the loop begun at the slot (`.1` of its result).
    LoopIndex(Slot),
    /// Carried value `i` of the loop begun at the slot (`.2[i]`).
    LoopCarried(Slot, usize),
    /// `conform(value, like, name)?`: an assignment to a carried variable, whose type
    /// is `like`'s (the loop's carried value).
    Conform { value: Slot, like: Slot, name: String },
    /// `end_for(begin.0, next)?` → the loop's results.
    EndFor { begin: Slot, next: Vec<Slot> },
    /// Result `i` of the loop ended at the slot.
    LoopResult(Slot, usize),
}

#[derive(Debug)]
pub struct Step {
    pub kind: StepKind,
    /// The user's code this call comes from; builder errors are reported here.
    pub sp: Sp,
}

/// The kernel as builder calls, in program order.
#[derive(Debug)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// Lowers a parsed kernel; the first error stops (later errors would mostly be
/// consequences of it).
pub fn lower(k: &Kernel) -> syn::Result<Plan> {
    let mut l = Lower {
        k,
        steps: Vec::new(),
        locals: HashMap::new(),
        vars: Vec::new(),
        loops: Vec::new(),
        scalars: HashMap::new(),
        tensors: HashMap::new(),
        shapes: HashMap::new(),
        tiles: HashMap::new(),
    };
    for p in &k.params {
        l.param(p);
    }
    for s in &k.body {
        l.stmt(s)?;
    }
    Ok(Plan { steps: l.steps })
}

/// Functions a kernel can call, for the "unknown function" message.
const FUNCTIONS: &str =
    "program_id, iota, zeros::<D>, dot, dot_tf32, exp, ln, log, sqrt, rsqrt, sigmoid, tanh, erf, sin, cos, abs, max, min, select";
/// Methods of a value, for the "unknown method" message.
const METHODS: &str = "exp, ln, log, sqrt, rsqrt, sigmoid, tanh, erf, sin, cos, abs, max, min, sum, mean, \
     sum_axis, mean_axis, max_axis, min_axis, sum_keepdim, mean_keepdim, max_keepdim, min_keepdim, \
     cast::<D>, to_f32, to_f16, to_bf16, t, permute, unsqueeze";

const UNARY: &[(&str, UnaryOp)] = &[
    ("exp", UnaryOp::Exp),
    ("ln", UnaryOp::Log),
    ("log", UnaryOp::Log),
    ("sqrt", UnaryOp::Sqrt),
    ("rsqrt", UnaryOp::Rsqrt),
    ("sigmoid", UnaryOp::Sigmoid),
    ("tanh", UnaryOp::Tanh),
    ("erf", UnaryOp::Erf),
    ("sin", UnaryOp::Sin),
    ("cos", UnaryOp::Cos),
    ("abs", UnaryOp::Abs),
];

const REDUCE: &[(&str, ReduceOp)] =
    &[("sum", ReduceOp::Sum), ("mean", ReduceOp::Mean), ("max", ReduceOp::Max), ("min", ReduceOp::Min)];

fn lookup<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// Tile symbols are ALL-CAPS: an uppercase letter, then uppercase letters, digits, `_`.
pub fn is_tile_symbol(name: &str) -> bool {
    let mut c = name.chars();
    c.next().is_some_and(|f| f.is_ascii_uppercase()) && c.all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_')
}

fn plural(n: usize, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// "`exp` takes 1 argument, found 2".
fn arity_error(name: &str, want: &str, found: usize, sp: Sp) -> syn::Error {
    sp.error(format!("`{name}` takes {want}, found {found}"))
}

fn check_arity(name: &str, want: usize, args: &[Expr], sp: Sp) -> syn::Result<()> {
    if args.len() == want {
        Ok(())
    } else {
        Err(arity_error(name, &plural(want, "argument"), args.len(), sp))
    }
}

/// An integer literal, possibly negated (axes of reductions, `program_id`, `permute`).
fn int_literal(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Lit(Lit { value: Literal::Int(v), suffix: None | Some(DType::I64) }) => Some(*v),
        ExprKind::Unary(UnaryOp::Neg, inner) => int_literal(inner).and_then(i64::checked_neg),
        _ => None,
    }
}

/// A name bound by `let` (or a loop variable): which variable it is. The variable's
/// current value is `Lower::vars[var]` (assignments change it; shadowing does not).
#[derive(Clone)]
struct Local {
    var: usize,
    mutable: bool,
    /// How many loops were open where it was declared.
    depth: usize,
}

/// A loop being lowered.
struct OpenLoop {
    /// The carried variables: the variable, its name, and the loop's carried value.
    carried: Vec<(usize, String, Slot)>,
}

struct TensorInfo {
    slot: Slot,
    /// The shape symbols of its dimensions.
    dims: Vec<Slot>,
}

/// What an expression lowers to.
enum Val {
    Value(Slot),
    /// `x.block(..)` / `x.row(..)` / `x` itself: awaits `.load()` or `.store(v)`.
    Access(Access),
    /// `.store(..)`: no value.
    Unit,
}

struct Access {
    tensor: Slot,
    offsets: Vec<Slot>,
    dims: Vec<DimRef>,
    tensor_sp: Sp,
}

struct Lower<'k> {
    k: &'k Kernel,
    steps: Vec<Step>,
    locals: HashMap<String, Local>,
    /// The current value of each variable, by [`Local::var`].
    vars: Vec<Slot>,
    /// The loops around the statement being lowered, innermost last.
    loops: Vec<OpenLoop>,
    scalars: HashMap<String, Slot>,
    tensors: HashMap<String, TensorInfo>,
    shapes: HashMap<String, Slot>,
    tiles: HashMap<String, Slot>,
}

impl Lower<'_> {
    fn push(&mut self, kind: StepKind, sp: Sp) -> Slot {
        self.steps.push(Step { kind, sp });
        self.steps.len() - 1
    }

    fn shape_sym(&mut self, id: &Ident) -> Slot {
        let name = id.to_string();
        if let Some(&s) = self.shapes.get(&name) {
            return s;
        }
        let s = self.push(StepKind::ShapeSym(name.clone()), Sp::single(id.span()));
        self.shapes.insert(name, s);
        s
    }

    fn tile_sym(&mut self, id: &Ident) -> Slot {
        let name = id.to_string();
        if let Some(&s) = self.tiles.get(&name) {
            return s;
        }
        let s = self.push(StepKind::TileSym(name.clone()), Sp::single(id.span()));
        self.tiles.insert(name, s);
        s
    }

    fn param(&mut self, p: &Param) {
        let name = p.name.to_string();
        match &p.kind {
            ParamKind::Tensor { dtype, dims, output } => {
                let dims: Vec<Slot> = dims.iter().map(|d| self.shape_sym(d)).collect();
                let slot = self.push(StepKind::TensorParam { name: name.clone(), dtype: *dtype, dims: dims.clone(), output: *output }, p.sp);
                self.tensors.insert(name, TensorInfo { slot, dims });
            }
            ParamKind::Scalar(dtype) => {
                let slot = self.push(StepKind::ScalarParam { name: name.clone(), dtype: *dtype }, p.sp);
                self.scalars.insert(name, slot);
            }
            ParamKind::Invalid => {}
        }
    }

    fn stmt(&mut self, s: &Stmt) -> syn::Result<()> {
        match s {
            Stmt::Let { names, values } => {
                let slots = values.iter().map(|v| self.value(v, "bound with `let`")).collect::<syn::Result<Vec<_>>>()?;
                for (b, slot) in names.iter().zip(slots) {
                    if let Some(id) = &b.name {
                        self.push(StepKind::Name(slot, id.to_string()), Sp::single(id.span()));
                        self.bind(id.to_string(), slot, b.mutable);
                    }
                }
                Ok(())
            }
            Stmt::Assign { target, op, value, sp } => {
                let name = target.to_string();
                let local = match self.locals.get(&name) {
                    Some(l) if l.mutable => l.clone(),
                    Some(_) => {
                        return Err(Sp::single(target.span())
                            .error(format!("cannot assign twice to immutable variable `{name}`; declare it with `let mut {name}`")))
                    }
                    None if self.scalars.contains_key(&name) || self.tensors.contains_key(&name) => {
                        return Err(Sp::single(target.span()).error(format!(
                            "cannot assign to the parameter `{name}`: only `let mut` variables can be assigned \
                             (tensors are written with `.store(..)`)"
                        )))
                    }
                    None => return Err(Sp::single(target.span()).error(format!("cannot find `{name}` in this kernel"))),
                };
                let v = self.value(value, "assigned")?;
                let mut new = match op {
                    None => v,
                    Some(op) => self.push(StepKind::Binary(*op, self.vars[local.var], v), *sp),
                };
                // A variable from outside the innermost loop is one of its carried values:
                // the new value must have the carried type.
                if local.depth < self.loops.len() {
                    let inner = self.loops.last().expect("inside a loop");
                    let like = inner.carried.iter().find(|(var, _, _)| *var == local.var).map(|c| c.2).ok_or_else(|| {
                        sp.error(format!("kfuse-macros: `{name}` is assigned in a loop but not carried by it (a bug of #[kfuse])"))
                    })?;
                    new = self.push(StepKind::Conform { value: new, like, name: name.clone() }, *sp);
                }
                self.push(StepKind::Name(new, name.clone()), Sp::single(target.span()));
                self.vars[local.var] = new;
                Ok(())
            }
            Stmt::For(f) => self.for_loop(f),
            Stmt::Expr(e) => match self.expr(e)? {
                Val::Unit => Ok(()),
                Val::Value(_) => Err(e.sp.error(
                    "this value is unused: a #[kfuse] kernel writes its results with `.store(..)`; bind values with `let`",
                )),
                Val::Access(_) => Err(e.sp.error(access_alone())),
            },
        }
    }

    /// Binds `name` to a new variable holding `slot`.
    fn bind(&mut self, name: String, slot: Slot, mutable: bool) {
        self.vars.push(slot);
        self.locals.insert(name, Local { var: self.vars.len() - 1, mutable, depth: self.loops.len() });
    }

    /// `for var in (lo..hi).step_by(step) { body }`; see the module docs.
    fn for_loop(&mut self, f: &For) -> syn::Result<()> {
        let For { var, lo, hi, step, body, range, sp } = f;
        let (var, step, range, sp) = (var.as_ref(), step.as_ref(), *range, *sp);
        let lo_v = self.value(lo, "a loop bound")?;
        let hi_v = self.value(hi, "a loop bound")?;
        let step_v = match step {
            Some(s) => self.value(s, "a loop step")?,
            None => self.push(StepKind::Literal(Literal::Int(1)), range),
        };
        // The variables this loop carries: `let mut`s from outside that the body assigns.
        let mut names: HashMap<String, Option<usize>> =
            self.locals.iter().map(|(n, l)| (n.clone(), l.mutable.then_some(l.var))).collect();
        if let Some(v) = var {
            names.insert(v.to_string(), None);
        }
        let mut assigned = std::collections::BTreeSet::new();
        assigned_vars(body, &mut names, &mut assigned);
        let carried_vars: Vec<(usize, String)> = assigned
            .into_iter()
            .map(|var| {
                let name = self.locals.iter().find(|(_, l)| l.var == var).map(|(n, _)| n.clone()).unwrap_or_default();
                (var, name)
            })
            .collect();
        let inits = carried_vars.iter().map(|(v, _)| self.vars[*v]).collect();
        let begin = self.push(StepKind::BeginFor { lo: lo_v, hi: hi_v, step: step_v, inits }, range);
        let index = self.push(StepKind::LoopIndex(begin), sp);
        let mut carried = Vec::with_capacity(carried_vars.len());
        for (i, (var, name)) in carried_vars.iter().enumerate() {
            let c = self.push(StepKind::LoopCarried(begin, i), sp);
            self.push(StepKind::Name(c, name.clone()), sp);
            self.vars[*var] = c;
            carried.push((*var, name.clone(), c));
        }
        // The body: its own scope.
        let outer = self.locals.clone();
        self.loops.push(OpenLoop { carried });
        if let Some(v) = var {
            self.push(StepKind::Name(index, v.to_string()), Sp::single(v.span()));
            self.bind(v.to_string(), index, false);
        }
        let lowered = body.iter().try_for_each(|s| self.stmt(s));
        let open = self.loops.pop().expect("pushed above");
        self.locals = outer;
        lowered?;
        let next = open.carried.iter().map(|(var, _, _)| self.vars[*var]).collect();
        let end = self.push(StepKind::EndFor { begin, next }, sp);
        for (i, (var, name, _)) in open.carried.iter().enumerate() {
            let r = self.push(StepKind::LoopResult(end, i), sp);
            self.push(StepKind::Name(r, name.clone()), sp);
            self.vars[*var] = r;
        }
        Ok(())
    }

    /// Lowers an expression that must produce a value; `what` says where it is used.
    fn value(&mut self, e: &Expr, what: &str) -> syn::Result<Slot> {
        match self.expr(e)? {
            Val::Value(v) => Ok(v),
            Val::Unit => Err(e.sp.error(format!("`.store(..)` has no value; it cannot be {what}"))),
            Val::Access(_) => Err(e.sp.error(access_alone())),
        }
    }

    fn expr(&mut self, e: &Expr) -> syn::Result<Val> {
        let sp = e.sp;
        let v = match &e.kind {
            ExprKind::Lit(l) => self.literal(*l, sp),
            ExprKind::Var(id) => self.var(id)?,
            ExprKind::Unary(op, x) => {
                // `-1.0` is one literal, so that it stays weak (adapts to its operand).
                if let (UnaryOp::Neg, ExprKind::Lit(l)) = (op, &x.kind) {
                    let value = match l.value {
                        Literal::Float(f) => Some(Literal::Float(-f)),
                        Literal::Int(i) => i.checked_neg().map(Literal::Int),
                        Literal::Bool(_) => None,
                    };
                    if let Some(value) = value {
                        return Ok(Val::Value(self.literal(Lit { value, suffix: l.suffix }, sp)));
                    }
                }
                let x = self.value(x, "an operand")?;
                self.push(StepKind::Unary(*op, x), sp)
            }
            ExprKind::Binary(op, a, b) => {
                let a = self.value(a, "an operand")?;
                let b = self.value(b, "an operand")?;
                self.push(StepKind::Binary(*op, a, b), sp)
            }
            ExprKind::Call { func, turbofish, args } => self.call(func, turbofish, args, sp)?,
            ExprKind::Method { receiver, method, turbofish, args, call } => {
                return self.method(receiver, method, turbofish, args, *call, sp)
            }
            ExprKind::Array(_) => {
                return Err(sp.error("an array is only used for the offsets and extents of `.block(..)` and for `.permute(..)`"))
            }
            ExprKind::Infer => return Err(sp.error(INFER_ONLY_EXTENT)),
        };
        Ok(Val::Value(v))
    }

    fn literal(&mut self, l: Lit, sp: Sp) -> Slot {
        match l.suffix {
            None => self.push(StepKind::Literal(l.value), sp),
            Some(d) => self.push(StepKind::Constant(l.value, d), sp),
        }
    }

    fn var(&mut self, id: &Ident) -> syn::Result<Slot> {
        let name = id.to_string();
        let sp = Sp::single(id.span());
        if let Some(l) = self.locals.get(&name) {
            return Ok(self.vars[l.var]);
        }
        if let Some(&s) = self.scalars.get(&name) {
            return Ok(s);
        }
        if self.tensors.contains_key(&name) {
            return Err(sp.error(format!(
                "`{name}` is a tensor, not a value: read it with `{name}.load()`, `{name}.block([..], [..]).load()` or `{name}.row(i).load()`"
            )));
        }
        if let Some(&s) = self.shapes.get(&name) {
            return Ok(self.push(StepKind::ShapeDim(s), sp));
        }
        if self.k.generics.iter().any(|g| *g == name) {
            return Err(sp.error(format!("`{name}` is a dtype, not a value")));
        }
        if is_tile_symbol(&name) {
            let t = self.tile_sym(id);
            return Ok(self.push(StepKind::TileExtent(ExtentRef::Tile(t)), sp));
        }
        Err(sp.error(format!("cannot find `{name}` in this kernel")))
    }

    fn call(&mut self, func: &Ident, turbofish: &[syn::Type], args: &[Expr], sp: Sp) -> syn::Result<Slot> {
        let name = func.to_string();
        if name != "zeros" {
            if let Some(t) = turbofish.first() {
                return Err(Sp::of(t).error(format!("`{name}` takes no type arguments")));
            }
        }
        match name.as_str() {
            "zeros" => {
                let [ty] = turbofish else {
                    return Err(Sp::single(func.span())
                        .error("`zeros` takes its dtype as a type argument: `zeros::<f32>([BM, BN])` (`f32`, `f16`, `bf16`, `f8e4m3`, `f8e5m2`, or a generic)"));
                };
                let dtype = crate::parse::dtype(ty, &self.k.generics)?;
                check_arity(&name, 1, args, sp)?;
                let ExprKind::Array(items) = &args[0].kind else {
                    return Err(args[0].sp.error("the shape of `zeros` is an array of extents, like `[BM, BN]`"));
                };
                let extents = items.iter().map(|e| self.extent(e, ZEROS_EXTENT)).collect::<syn::Result<Vec<_>>>()?;
                Ok(self.push(StepKind::Zeros { dtype, extents }, sp))
            }
            "dot" | "dot_tf32" => {
                check_arity(&name, 2, args, sp)?;
                let a = self.value(&args[0], "an argument")?;
                let b = self.value(&args[1], "an argument")?;
                Ok(self.push(StepKind::Dot(a, b, name == "dot_tf32"), sp))
            }
            "program_id" => {
                check_arity(&name, 1, args, sp)?;
                let axis = int_literal(&args[0])
                    .and_then(|a| u8::try_from(a).ok())
                    .ok_or_else(|| args[0].sp.error("the axis of `program_id` must be an integer literal: 0, 1 or 2"))?;
                Ok(self.push(StepKind::ProgramId(axis), sp))
            }
            "max" | "min" => {
                check_arity(&name, 2, args, sp)?;
                let op = if name == "max" { BinaryOp::Max } else { BinaryOp::Min };
                let a = self.value(&args[0], "an argument")?;
                let b = self.value(&args[1], "an argument")?;
                Ok(self.push(StepKind::Binary(op, a, b), sp))
            }
            "iota" => {
                check_arity(&name, 1, args, sp)?;
                let e = self.extent(&args[0], IOTA_EXTENT)?;
                Ok(self.push(StepKind::Iota(e), sp))
            }
            "select" => {
                check_arity(&name, 3, args, sp)?;
                let c = self.value(&args[0], "an argument")?;
                let a = self.value(&args[1], "an argument")?;
                let b = self.value(&args[2], "an argument")?;
                Ok(self.push(StepKind::Select(c, a, b), sp))
            }
            _ => match lookup(UNARY, &name) {
                Some(op) => {
                    check_arity(&name, 1, args, sp)?;
                    let x = self.value(&args[0], "an argument")?;
                    Ok(self.push(StepKind::Unary(op, x), sp))
                }
                None => Err(Sp::single(func.span())
                    .error(format!("cannot find function `{name}` in this kernel; a #[kfuse] kernel can call: {FUNCTIONS}"))),
            },
        }
    }

    fn method(&mut self, receiver: &Expr, method: &Ident, turbofish: &[syn::Type], args: &[Expr], call: Sp, sp: Sp) -> syn::Result<Val> {
        let name = method.to_string();
        if name != "cast" {
            if let Some(t) = turbofish.first() {
                return Err(Sp::of(t).error(format!("`{name}` takes no type arguments")));
            }
        }
        // A tensor parameter (not shadowed by a local) as the receiver.
        if let ExprKind::Var(id) = &receiver.kind {
            let tname = id.to_string();
            if !self.locals.contains_key(&tname) && self.tensors.contains_key(&tname) {
                let access = self.tensor_access(&tname, receiver.sp, &name, args, call)?;
                return match access {
                    Some(a) => Ok(Val::Access(a)),
                    // `x.load()` / `x.store(v)`: the whole tensor.
                    None => {
                        let a = self.whole(&tname, receiver.sp);
                        self.access_method(a, &name, args, call, sp)
                    }
                };
            }
        }
        match self.expr(receiver)? {
            Val::Access(a) => self.access_method(a, &name, args, call, sp),
            Val::Unit => Err(receiver.sp.error("`.store(..)` has no value")),
            Val::Value(x) => self.value_method(x, method, turbofish, args, call).map(Val::Value),
        }
    }

    /// `t.block(..)` / `t.row(..)` → `Some(access)`; `t.load()` / `t.store(..)` → `None`.
    fn tensor_access(&mut self, t: &str, tsp: Sp, method: &str, args: &[Expr], call: Sp) -> syn::Result<Option<Access>> {
        let (slot, dims) = {
            let info = &self.tensors[t];
            (info.slot, info.dims.clone())
        };
        let rank = dims.len();
        match method {
            "block" => {
                if args.len() != 2 {
                    return Err(arity_error(method, "2 arguments (offsets and extents: `block([o0, ..], [E0, ..])`)", args.len(), call));
                }
                let offs = block_list(t, rank, &args[0], "offset")?;
                let exts = block_list(t, rank, &args[1], "extent")?;
                let offsets = offs.iter().map(|o| self.value(o, "an offset")).collect::<syn::Result<Vec<_>>>()?;
                let dims = exts
                    .iter()
                    .map(|e| match e.kind {
                        ExprKind::Infer => Ok(DimRef::Index),
                        _ => self.extent(e, BLOCK_EXTENT).map(DimRef::Tile),
                    })
                    .collect::<syn::Result<Vec<_>>>()?;
                Ok(Some(Access { tensor: slot, offsets, dims, tensor_sp: tsp }))
            }
            "row" => {
                check_arity(method, 1, args, call)?;
                let mut offsets = vec![self.value(&args[0], "an offset")?];
                let mut adims = vec![DimRef::Index];
                for &d in &dims[1..] {
                    offsets.push(self.push(StepKind::Constant(Literal::Int(0), DType::I64), call));
                    adims.push(DimRef::Tile(ExtentRef::Full(d)));
                }
                Ok(Some(Access { tensor: slot, offsets, dims: adims, tensor_sp: tsp }))
            }
            "load" | "store" | "store_where" => Ok(None),
            _ => Err(Sp::single(call.start).error(format!(
                "no method `{method}` on tensor `{t}`; a tensor has: block([offsets], [extents]), row(i), load(), store(value), store_where(mask, value)"
            ))),
        }
    }

    /// The whole tensor: every dimension `Full`, at offset 0.
    fn whole(&mut self, t: &str, tsp: Sp) -> Access {
        let (slot, dims) = {
            let info = &self.tensors[t];
            (info.slot, info.dims.clone())
        };
        let offsets = dims.iter().map(|_| self.push(StepKind::Constant(Literal::Int(0), DType::I64), tsp)).collect();
        Access { tensor: slot, offsets, dims: dims.iter().map(|&d| DimRef::Tile(ExtentRef::Full(d))).collect(), tensor_sp: tsp }
    }

    /// A tile extent: of a block (where `_` is handled by the caller), of `iota` or of
    /// `zeros`; `what` is the rule, for errors.
    fn extent(&mut self, e: &Expr, what: &str) -> syn::Result<ExtentRef> {
        match &e.kind {
            ExprKind::Lit(Lit { value: Literal::Int(n), suffix: None }) => match u32::try_from(*n) {
                Ok(n) if n > 0 => Ok(ExtentRef::Const(n)),
                _ => Err(e.sp.error(what)),
            },
            ExprKind::Var(id) => {
                let name = id.to_string();
                if self.locals.contains_key(&name) || self.scalars.contains_key(&name) {
                    Err(e.sp.error(format!("`{name}` is a runtime value; {what}")))
                } else if let Some(&s) = self.shapes.get(&name) {
                    Ok(ExtentRef::Full(s))
                } else if is_tile_symbol(&name) {
                    Ok(ExtentRef::Tile(self.tile_sym(id)))
                } else {
                    Err(e.sp.error(format!("cannot find `{name}` in this kernel; {what}")))
                }
            }
            _ => Err(e.sp.error(what)),
        }
    }

    fn access_method(&mut self, a: Access, method: &str, args: &[Expr], call: Sp, sp: Sp) -> syn::Result<Val> {
        match method {
            "load" => {
                check_arity(method, 0, args, call)?;
                Ok(Val::Value(self.push(StepKind::Load { tensor: a.tensor, offsets: a.offsets, dims: a.dims }, sp)))
            }
            "store" | "store_where" => {
                // `store_where(mask, value)`: only where `mask` holds
                let masked = method == "store_where";
                check_arity(method, 1 + masked as usize, args, call)?;
                let mask = if masked { Some(self.value(&args[0], "a mask")?) } else { None };
                let varg = &args[masked as usize];
                let value = self.value(varg, "stored")?;
                let kind = StepKind::Store { tensor: a.tensor, offsets: a.offsets, dims: a.dims, value, mask, tensor_sp: a.tensor_sp, value_sp: varg.sp };
                self.push(kind, sp);
                Ok(Val::Unit)
            }
            _ => Err(Sp::single(call.start).error(format!(
                "no method `{method}` on a block access; an access is followed by `.load()`, `.store(value)` or `.store_where(mask, value)`"
            ))),
        }
    }

    fn value_method(&mut self, x: Slot, method: &Ident, turbofish: &[syn::Type], args: &[Expr], call: Sp) -> syn::Result<Slot> {
        let name = method.to_string();
        let n = name.as_str();
        let arity0 = || check_arity(n, 0, args, call);
        if let Some(op) = lookup(UNARY, n) {
            arity0()?;
            return Ok(self.push(StepKind::Unary(op, x), call));
        }
        let reduce = |l: &mut Self, op: ReduceOp, axis: i64, keep_dim: bool| l.push(StepKind::Reduce { op, x, axis, keep_dim }, call);
        let axis_arg = || {
            check_arity(n, 1, args, call)?;
            int_literal(&args[0]).ok_or_else(|| args[0].sp.error(format!("the axis of `{n}` must be an integer literal (negative counts from the end)")))
        };
        match n {
            "max" | "min" => match args.len() {
                0 => Ok(reduce(self, lookup(REDUCE, n).unwrap(), -1, false)),
                1 => {
                    let y = self.value(&args[0], "an argument")?;
                    let op = if n == "max" { BinaryOp::Max } else { BinaryOp::Min };
                    Ok(self.push(StepKind::Binary(op, x, y), call))
                }
                k => Err(arity_error(n, "0 arguments (a reduction) or 1 (elementwise)", k, call)),
            },
            "sum" | "mean" => {
                arity0()?;
                Ok(reduce(self, lookup(REDUCE, n).unwrap(), -1, false))
            }
            "cast" => {
                arity0()?;
                let [ty] = turbofish else {
                    return Err(call.error("`cast` takes one dtype: `.cast::<T>()`, `.cast::<f32>()`"));
                };
                let d = crate::parse::dtype(ty, &self.k.generics)?;
                Ok(self.push(StepKind::Cast(x, d), call))
            }
            "to_f32" | "to_f16" | "to_bf16" => {
                arity0()?;
                let d = DType::from_name(&n[3..]).unwrap();
                Ok(self.push(StepKind::Cast(x, DTy::Concrete(d)), call))
            }
            "t" => {
                arity0()?;
                Ok(self.push(StepKind::Permute(x, vec![1, 0]), call))
            }
            "unsqueeze" => {
                let axis = axis_arg()?;
                Ok(self.push(StepKind::ExpandDims(x, axis), call))
            }
            "permute" => {
                check_arity(n, 1, args, call)?;
                let msg = "`permute` takes an array of axes, like `[1, 0]`";
                let ExprKind::Array(items) = &args[0].kind else { return Err(args[0].sp.error(msg)) };
                let perm = items
                    .iter()
                    .map(|i| int_literal(i).and_then(|v| u32::try_from(v).ok()).ok_or_else(|| i.sp.error(msg)))
                    .collect::<syn::Result<Vec<_>>>()?;
                Ok(self.push(StepKind::Permute(x, perm), call))
            }
            _ => {
                let (base, keep_dim) = if let Some(b) = n.strip_suffix("_axis") {
                    (b, false)
                } else if let Some(b) = n.strip_suffix("_keepdim") {
                    (b, true)
                } else {
                    ("", false)
                };
                match lookup(REDUCE, base) {
                    Some(op) => {
                        let axis = axis_arg()?;
                        Ok(reduce(self, op, axis, keep_dim))
                    }
                    None => Err(Sp::single(method.span())
                        .error(format!("no method `{n}` on a value in a #[kfuse] kernel; the methods are: {METHODS}"))),
                }
            }
        }
    }
}

/// The offsets or extents of `block`: an array with one item per tensor dimension.
fn block_list<'e>(t: &str, rank: usize, e: &'e Expr, what: &str) -> syn::Result<&'e [Expr]> {
    match &e.kind {
        ExprKind::Array(items) if items.len() == rank => Ok(items),
        ExprKind::Array(items) => Err(e.sp.error(format!(
            "`{t}` has {} but the block gives {}",
            plural(rank, "dimension"),
            plural(items.len(), what)
        ))),
        _ => Err(e.sp.error(format!("the {what}s of `block` are an array, one per dimension of `{t}`: `[a, b]`"))),
    }
}

const BLOCK_EXTENT: &str = "a block extent is a tile symbol (`BM`), a positive integer literal, a shape symbol of the signature, \
     or `_` (the dimension is indexed by its offset and does not appear in the tile)";
const IOTA_EXTENT: &str = "the extent of `iota` is a tile symbol (`BM`), a positive integer literal or a shape symbol of the signature";
const ZEROS_EXTENT: &str =
    "an extent of `zeros` is a tile symbol (`BM`), a positive integer literal or a shape symbol of the signature";

/// Adds to `out` the variables that `stmts` assign and that `names` (the scope, by
/// name: `Some(var)` for a `let mut` from outside, `None` for anything else) resolves
/// to; `let`s and loop variables in `stmts` shadow as they do when lowering.
fn assigned_vars(stmts: &[Stmt], names: &mut HashMap<String, Option<usize>>, out: &mut std::collections::BTreeSet<usize>) {
    for s in stmts {
        match s {
            Stmt::Let { names: bindings, .. } => {
                for b in bindings.iter().filter_map(|b| b.name.as_ref()) {
                    names.insert(b.to_string(), None);
                }
            }
            Stmt::Assign { target, .. } => {
                if let Some(Some(var)) = names.get(&target.to_string()) {
                    out.insert(*var);
                }
            }
            Stmt::For(f) => {
                let (var, body) = (&f.var, &f.body);
                let mut inner = names.clone();
                if let Some(v) = var {
                    inner.insert(v.to_string(), None);
                }
                assigned_vars(body, &mut inner, out);
            }
            Stmt::Expr(_) => {}
        }
    }
}

const INFER_ONLY_EXTENT: &str =
    "`_` is only a block extent: `x.block([t, 0], [_, N])` indexes the first dimension at `t` and drops it from the tile";

fn access_alone() -> &'static str {
    "a block access does nothing by itself: follow it with `.load()` or `.store(value)`"
}

//! Type-checks a kernel by building it: the [`Plan`] runs on a real
//! `kfuse_ir::Builder`, at compile time, once for every assignment of the dtype
//! generics to `f32`, `f16`, `bf16`. The typing rules of the language are the builder's
//! (see `kfuse_ir::builder`); this module only turns the first [`IrError`] into a
//! `syn::Error` at the span of the step whose builder call failed, then runs the
//! verifier (`Builder::finish`) and the grid analysis (`kfuse_ir::grid::derive`).
//!
//! When the error depends on the generics (another assignment builds, or fails
//! differently), the message ends with the assignment: "… (with T = f16)".

use kfuse_ir::{AccessDim, Builder, DType, Extent, IrError, Kernel, LoopId, ParamId, ShapeSym, TileSym, ValueId};

use crate::ast::{DTy, Kernel as Ast, Sp};
use crate::lower::{DimRef, ExtentRef, Plan, StepKind};

/// The result of a step while executing a plan.
#[derive(Clone, Debug)]
enum Res {
    None,
    Shape(ShapeSym),
    Tile(TileSym),
    Param(ParamId),
    Value(ValueId),
    /// `begin_for`: the loop, its index and its carried values.
    Loop(LoopId, ValueId, Vec<ValueId>),
    /// `end_for`: the loop's results.
    Results(Vec<ValueId>),
}

/// Where a check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Step(usize),
    /// The kernel as a whole (the grid): reported at the function's name.
    Kernel,
}

#[derive(Clone, Debug, PartialEq)]
struct Failure {
    at: At,
    err: IrError,
}

/// Generic counts up to this get every assignment checked (3^6 = 729 builds of a small
/// graph: milliseconds); above it, a covering subset (see [`assignments`]).
const MAX_FULL_PRODUCT: usize = 6;
const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The dtype assignments to check, in a fixed order (`f32` first).
fn assignments(n: usize) -> Vec<Vec<DType>> {
    if n <= MAX_FULL_PRODUCT {
        let mut out = vec![Vec::new()];
        for _ in 0..n {
            out = out.into_iter().flat_map(|a| FLOATS.iter().map(move |d| [a.clone(), vec![*d]].concat())).collect();
        }
        out
    } else {
        // All generics equal, then each generic on its own against f32 elsewhere.
        let mut out: Vec<Vec<DType>> = FLOATS.iter().map(|d| vec![*d; n]).collect();
        for i in 0..n {
            for d in &FLOATS[1..] {
                let mut a = vec![DType::F32; n];
                a[i] = *d;
                out.push(a);
            }
        }
        out
    }
}

/// Checks the kernel for every dtype assignment; the first failure becomes the error.
pub fn validate(k: &Ast, plan: &Plan) -> syn::Result<()> {
    let name = k.name.to_string();
    let all = assignments(k.generics.len());
    let outcomes: Vec<Result<(), Failure>> = all.iter().map(|a| check(plan, &name, a)).collect();
    let Some((i, f)) = outcomes.iter().enumerate().find_map(|(i, o)| o.as_ref().err().map(|f| (i, f))) else {
        return Ok(());
    };
    let depends = outcomes.iter().any(|o| o.as_ref().err() != Some(f));
    let mut msg = f.err.to_string();
    if depends {
        let with: Vec<String> = k.generics.iter().zip(&all[i]).map(|(g, d)| format!("{g} = {d}")).collect();
        msg = format!("{msg} (with {})", with.join(", "));
    }
    let sp = match f.at {
        At::Kernel => Sp::single(k.name.span()),
        At::Step(s) => error_span(plan, s, &f.err),
    };
    Err(sp.error(msg))
}

/// The span for an error of step `s`: a store's errors point at its tensor or its value.
fn error_span(plan: &Plan, s: usize, err: &IrError) -> Sp {
    let step = &plan.steps[s];
    match (&step.kind, err) {
        (StepKind::Store { tensor_sp, .. }, IrError::StoreToInput { .. }) => *tensor_sp,
        (StepKind::Store { value_sp, .. }, IrError::DTypeMismatch { .. } | IrError::ShapeMismatch { .. }) => *value_sp,
        _ => step.sp,
    }
}

/// Builds, verifies and derives the grid for one assignment.
fn check(plan: &Plan, name: &str, dtypes: &[DType]) -> Result<(), Failure> {
    let mut b = Builder::new(name);
    run(plan, dtypes, &mut b, false)?;
    let kernel: Kernel = match b.finish() {
        Ok(k) => k,
        Err(err) => {
            // The builder let through something the verifier rejects: find the step
            // after which the graph stops verifying, to point at the user's code.
            let mut b = Builder::new(name);
            return Err(run(plan, dtypes, &mut b, true).err().unwrap_or(Failure { at: At::Kernel, err }));
        }
    };
    kfuse_ir::grid::derive(&kernel).map_err(|err| Failure { at: At::Kernel, err })?;
    Ok(())
}

/// Executes the plan's builder calls; with `verify_each`, runs the verifier after
/// every step outside loops (a loop verifies once it is closed: its last step, the
/// `EndFor`, takes the blame for what breaks inside it) and fails at the first step
/// that breaks it.
fn run(plan: &Plan, dtypes: &[DType], b: &mut Builder, verify_each: bool) -> Result<(), Failure> {
    let mut res: Vec<Res> = Vec::with_capacity(plan.steps.len());
    let mut open = 0usize;
    for (i, step) in plan.steps.iter().enumerate() {
        let r = exec(b, &step.kind, &res, dtypes).map_err(|err| Failure { at: At::Step(i), err })?;
        match step.kind {
            StepKind::BeginFor { .. } => open += 1,
            StepKind::EndFor { .. } => open -= 1,
            _ => {}
        }
        if verify_each && open == 0 {
            kfuse_ir::verify::verify(b.kernel(), "build").map_err(|err| Failure { at: At::Step(i), err })?;
        }
        res.push(r);
    }
    Ok(())
}

fn dtype(d: DTy, dtypes: &[DType]) -> DType {
    match d {
        DTy::Generic(i) => dtypes[i],
        DTy::Concrete(d) => d,
    }
}

/// One builder call. Slots always name results of the right kind (the plan is built
/// that way), so a mismatch is a bug of this crate and panics.
fn exec(b: &mut Builder, kind: &StepKind, res: &[Res], dtypes: &[DType]) -> Result<Res, IrError> {
    let v = |s: usize| match &res[s] {
        Res::Value(v) => *v,
        other => panic!("kfuse-macros: slot {s} is {other:?}, not a value"),
    };
    let vs = |s: &[usize]| s.iter().map(|&s| v(s)).collect::<Vec<_>>();
    let shape = |s: usize| match &res[s] {
        Res::Shape(x) => *x,
        other => panic!("kfuse-macros: slot {s} is {other:?}, not a shape symbol"),
    };
    let tile = |s: usize| match &res[s] {
        Res::Tile(x) => *x,
        other => panic!("kfuse-macros: slot {s} is {other:?}, not a tile symbol"),
    };
    let param = |s: usize| match &res[s] {
        Res::Param(x) => *x,
        other => panic!("kfuse-macros: slot {s} is {other:?}, not a parameter"),
    };
    let lp = |s: usize| match &res[s] {
        Res::Loop(id, index, carried) => (*id, *index, carried.clone()),
        other => panic!("kfuse-macros: slot {s} is {other:?}, not a loop"),
    };
    let results = |s: usize| match &res[s] {
        Res::Results(r) => r.clone(),
        other => panic!("kfuse-macros: slot {s} is {other:?}, not loop results"),
    };
    let extent = |e: ExtentRef| match e {
        ExtentRef::Const(c) => Extent::Const(c),
        ExtentRef::Tile(s) => Extent::Tile(tile(s)),
        ExtentRef::Full(s) => Extent::Full(shape(s)),
    };
    let dims = |d: &[DimRef]| {
        d.iter()
            .map(|d| match d {
                DimRef::Index => AccessDim::Index,
                DimRef::Tile(e) => AccessDim::Tile(extent(*e)),
            })
            .collect::<Vec<_>>()
    };
    Ok(match kind {
        StepKind::ShapeSym(n) => Res::Shape(b.shape_sym(n)),
        StepKind::TileSym(n) => Res::Tile(b.tile_sym(n)),
        StepKind::TensorParam { name, dtype: d, dims: ds, output } => {
            let ds: Vec<ShapeSym> = ds.iter().map(|&s| shape(s)).collect();
            Res::Param(b.tensor_param(name, dtype(*d, dtypes), &ds, *output))
        }
        StepKind::ScalarParam { name, dtype } => Res::Value(b.scalar_param(name, *dtype).1),
        StepKind::ProgramId(a) => Res::Value(b.program_id(*a)?),
        StepKind::ShapeDim(s) => Res::Value(b.shape_dim(shape(*s))),
        StepKind::TileExtent(e) => Res::Value(b.tile_extent(extent(*e))),
        StepKind::Literal(l) => Res::Value(b.literal(*l)),
        StepKind::Constant(l, d) => Res::Value(b.constant(*l, *d)),
        StepKind::Load { tensor, offsets, dims: d } => Res::Value(b.load(param(*tensor), &vs(offsets), &dims(d))?),
        StepKind::Store { tensor, offsets, dims: d, value, mask, .. } => {
            match mask {
                Some(m) => b.store_where(param(*tensor), &vs(offsets), &dims(d), v(*m), v(*value))?,
                None => b.store(param(*tensor), &vs(offsets), &dims(d), v(*value))?,
            };
            Res::None
        }
        StepKind::Unary(op, x) => Res::Value(b.unary(*op, v(*x))?),
        StepKind::Binary(op, x, y) => Res::Value(b.binary(*op, v(*x), v(*y))?),
        StepKind::Select(c, x, y) => Res::Value(b.select(v(*c), v(*x), v(*y))?),
        StepKind::Cast(x, d) => Res::Value(b.cast(v(*x), dtype(*d, dtypes))?),
        StepKind::Reduce { op, x, axis, keep_dim } => Res::Value(b.reduce(*op, v(*x), *axis, *keep_dim)?),
        StepKind::Permute(x, perm) => Res::Value(b.permute(v(*x), perm)?),
        StepKind::Iota(e) => Res::Value(b.iota(extent(*e))?),
        StepKind::ExpandDims(x, axis) => Res::Value(b.expand_dims(v(*x), *axis)?),
        StepKind::Name(x, n) => {
            b.name(v(*x), n);
            Res::None
        }
        StepKind::Zeros { dtype: d, extents } => {
            let e: Vec<Extent> = extents.iter().map(|e| extent(*e)).collect();
            Res::Value(b.zeros(dtype(*d, dtypes), &e)?)
        }
        StepKind::Dot(x, y, false) => Res::Value(b.dot(v(*x), v(*y))?),
        StepKind::Dot(x, y, true) => Res::Value(b.dot_tf32(v(*x), v(*y))?),
        StepKind::BeginFor { lo, hi, step, inits } => {
            let (id, index, carried) = b.begin_for(v(*lo), v(*hi), v(*step), &vs(inits))?;
            Res::Loop(id, index, carried)
        }
        StepKind::LoopIndex(s) => Res::Value(lp(*s).1),
        StepKind::LoopCarried(s, i) => Res::Value(lp(*s).2[*i]),
        StepKind::Conform { value, like, name } => Res::Value(b.conform(v(*value), v(*like), name)?),
        StepKind::EndFor { begin, next } => Res::Results(b.end_for(lp(*begin).0, &vs(next))?),
        StepKind::LoopResult(s, i) => Res::Value(results(*s)[*i]),
    })
}

/// Builds the kernel from its plan for concrete dtypes — what the generated `build`
/// does, for this crate's tests.
#[cfg(test)]
pub fn build(plan: &Plan, name: &str, dtypes: &[DType]) -> Result<Kernel, IrError> {
    let mut b = Builder::new(name);
    run(plan, dtypes, &mut b, false).map_err(|f| f.err)?;
    b.finish()
}

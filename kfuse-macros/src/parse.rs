//! `syn` → [`ast`](crate::ast): the shape of the kernel's syntax.
//!
//! This step only checks what can be seen without resolving names: the form of the
//! signature (dtype generics bounded by `Float`, tensor and scalar parameters, no return
//! type) and which statements and expressions the language has. It reports every error
//! it finds (one per parameter or statement) rather than stopping at the first.

use kfuse_ir::{BinaryOp, DType, Literal, UnaryOp};
use proc_macro2::TokenStream;

use crate::ast::*;

/// Where to find the facade crate: `#[kfuse]` → `::kfuse`, `#[kfuse(crate = "p")]` → `p`.
/// On an error the path parsed so far (or the default) comes back with it, so that the
/// items can still be emitted against the right crate.
pub fn attr(args: TokenStream) -> (syn::Path, Option<syn::Error>) {
    let mut krate: syn::Path = syn::parse_quote!(::kfuse);
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("crate") {
            let s: syn::LitStr = meta.value()?.parse()?;
            krate = s.parse()?;
            Ok(())
        } else {
            Err(meta.error("unknown #[kfuse] option; the only option is `crate = \"path::to::kfuse\"`"))
        }
    });
    let err = syn::parse::Parser::parse2(parser, args).err();
    (krate, err)
}

/// Reads the kernel; errors go to `errors`, and the returned kernel holds whatever did
/// parse (failed parameters are [`ParamKind::Invalid`], failed statements are dropped).
pub fn kernel(f: &syn::ItemFn, errors: &mut Vec<syn::Error>) -> Kernel {
    let sig = &f.sig;
    let mut err = |e: syn::Error| errors.push(e);
    if let Some(t) = &sig.constness {
        err(syn::Error::new(t.span, "a #[kfuse] kernel cannot be `const`"));
    }
    if let Some(t) = &sig.asyncness {
        err(syn::Error::new(t.span, "a #[kfuse] kernel cannot be `async`"));
    }
    if let Some(t) = &sig.unsafety {
        err(syn::Error::new(t.span, "a #[kfuse] kernel cannot be `unsafe`"));
    }
    if let Some(abi) = &sig.abi {
        err(Sp::of(abi).error("a #[kfuse] kernel cannot have an `extern` ABI"));
    }
    if let Some(v) = &sig.variadic {
        err(Sp::of(v).error("a #[kfuse] kernel cannot be variadic"));
    }
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        err(Sp::of(ty).error(
            "a #[kfuse] kernel returns nothing: it writes its results with `.store(..)` into `&mut Tensor` parameters",
        ));
    }

    let mut generics = Vec::new();
    for g in &sig.generics.params {
        match g {
            syn::GenericParam::Type(tp) => {
                if let Err(e) = check_float_bound(tp) {
                    err(e);
                }
                generics.push(tp.ident.clone());
            }
            syn::GenericParam::Lifetime(l) => {
                err(Sp::of(l).error("a #[kfuse] kernel has no lifetime parameters; its generics are dtypes (`T: Float`)"))
            }
            syn::GenericParam::Const(c) => err(Sp::of(c).error(
                "a #[kfuse] kernel has no const generics; its generics are dtypes (`T: Float`), and tile sizes are symbols (`BM`)",
            )),
        }
    }
    if let Some(w) = &sig.generics.where_clause {
        err(Sp::of(w).error("a #[kfuse] kernel has no `where` clause: write the bound as `<T: Float>`"));
    }

    let mut params = Vec::new();
    for input in &sig.inputs {
        match input {
            syn::FnArg::Receiver(r) => err(Sp::of(r).error("a #[kfuse] kernel is a free function: it cannot take `self`")),
            syn::FnArg::Typed(pt) => {
                let name = match &*pt.pat {
                    syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() && pi.mutability.is_none() => {
                        Some(pi.ident.clone())
                    }
                    p => {
                        err(Sp::of(p).error("a #[kfuse] kernel parameter is a plain name (`x: Tensor<T, (N,)>`)"));
                        None
                    }
                };
                let kind = param_type(&pt.ty, &generics).unwrap_or_else(|e| {
                    err(e);
                    ParamKind::Invalid
                });
                if let Some(name) = name {
                    params.push(Param { name, kind, sp: Sp::of(pt) });
                }
            }
        }
    }

    let mut body = Vec::new();
    for s in &f.block.stmts {
        match stmt(s) {
            Ok(s) => body.push(s),
            Err(e) => err(e),
        }
    }

    Kernel { attrs: f.attrs.clone(), vis: f.vis.clone(), name: sig.ident.clone(), generics, params, body }
}

fn check_float_bound(tp: &syn::TypeParam) -> syn::Result<()> {
    const MSG: &str = "a #[kfuse] generic is a dtype: its bound must be exactly `Float` (`T: Float`)";
    if let Some(d) = &tp.default {
        return Err(Sp::of(d).error("a #[kfuse] dtype generic cannot have a default"));
    }
    let mut bounds = tp.bounds.iter();
    match (bounds.next(), bounds.next()) {
        (None, _) => Err(Sp::of(&tp.ident).error(format!("{MSG}; add `{}: Float`", tp.ident))),
        (Some(syn::TypeParamBound::Trait(t)), None)
            if t.path.is_ident("Float")
                && t.lifetimes.is_none()
                && matches!(t.modifier, syn::TraitBoundModifier::None)
                && t.paren_token.is_none() =>
        {
            Ok(())
        }
        _ => Err(Sp::of(&tp.bounds).error(MSG)),
    }
}

const PARAM_TYPES: &str =
    "a #[kfuse] kernel takes `Tensor<D, (S1, ..)>` (input), `&mut Tensor<D, (S1, ..)>` (output), `f32` or `i64`";

fn param_type(ty: &syn::Type, generics: &[proc_macro2::Ident]) -> syn::Result<ParamKind> {
    match ty {
        syn::Type::Reference(r) => {
            let tensor = tensor_type(&r.elem, generics)?;
            let Some((dtype, dims)) = tensor else {
                return Err(Sp::of(ty).error(format!("unsupported parameter type: {PARAM_TYPES}")));
            };
            if r.mutability.is_none() {
                return Err(Sp::of(ty).error(
                    "an input tensor is written `Tensor<D, (..)>` (without `&`); outputs are `&mut Tensor<D, (..)>`",
                ));
            }
            if let Some(l) = &r.lifetime {
                return Err(Sp::of(l).error("a #[kfuse] kernel parameter takes no lifetime"));
            }
            Ok(ParamKind::Tensor { dtype, dims, output: true })
        }
        syn::Type::Path(p) if p.qself.is_none() && p.path.is_ident("f32") => Ok(ParamKind::Scalar(DType::F32)),
        syn::Type::Path(p) if p.qself.is_none() && p.path.is_ident("i64") => Ok(ParamKind::Scalar(DType::I64)),
        _ => match tensor_type(ty, generics)? {
            Some((dtype, dims)) => Ok(ParamKind::Tensor { dtype, dims, output: false }),
            None => Err(Sp::of(ty).error(format!("unsupported parameter type: {PARAM_TYPES}"))),
        },
    }
}

/// `Tensor<D, (S1, ..)>`: `Ok(None)` when `ty` is not a `Tensor` at all.
fn tensor_type(ty: &syn::Type, generics: &[proc_macro2::Ident]) -> syn::Result<Option<(DTy, Vec<proc_macro2::Ident>)>> {
    let syn::Type::Path(p) = ty else { return Ok(None) };
    let Some(last) = p.path.segments.last() else { return Ok(None) };
    if p.qself.is_some() || last.ident != "Tensor" {
        return Ok(None);
    }
    const FORM: &str = "a tensor type is `Tensor<D, (S1, S2, ..)>`: a dtype and a tuple of shape symbols, like `Tensor<T, (M, N)>` or `Tensor<f32, (N,)>`";
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return Err(Sp::of(ty).error(FORM));
    };
    let tys: Vec<&syn::Type> = args
        .args
        .iter()
        .map(|a| match a {
            syn::GenericArgument::Type(t) => Ok(t),
            other => Err(Sp::of(other).error(FORM)),
        })
        .collect::<syn::Result<_>>()?;
    let [d, shape] = tys[..] else { return Err(Sp::of(args).error(FORM)) };
    let dtype = dtype(d, generics)?;
    let dims = match shape {
        syn::Type::Tuple(t) if !t.elems.is_empty() => t
            .elems
            .iter()
            .map(|e| match e {
                syn::Type::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => Ok(p.path.segments[0].ident.clone()),
                other => Err(Sp::of(other).error("a tensor dimension is a shape symbol: a plain name like `N`")),
            })
            .collect::<syn::Result<Vec<_>>>()?,
        syn::Type::Tuple(t) => return Err(Sp::of(t).error("a tensor has at least one dimension, like `(N,)`")),
        syn::Type::Paren(p) => {
            return Err(Sp::of(p).error(format!("write `({},)` for a one-dimensional shape (a tuple)", p.elem.to_token_stream_string())))
        }
        other => return Err(Sp::of(other).error(FORM)),
    };
    Ok(Some((dtype, dims)))
}

trait TokenString {
    fn to_token_stream_string(&self) -> String;
}

impl<T: quote::ToTokens> TokenString for T {
    fn to_token_stream_string(&self) -> String {
        self.to_token_stream().to_string()
    }
}

/// A dtype as written: a generic of the kernel, or `f32`, `f16`, `bf16`, `f8e4m3`,
/// `f8e5m2`, `i64`.
pub fn dtype(ty: &syn::Type, generics: &[proc_macro2::Ident]) -> syn::Result<DTy> {
    let msg = || {
        let g: Vec<String> = generics.iter().map(|g| format!("`{g}`")).collect();
        let g = if g.is_empty() { String::new() } else { format!("a generic of the kernel ({}) or ", g.join(", ")) };
        Sp::of(ty).error(format!("expected a dtype: {g}`f32`, `f16`, `bf16`, `f8e4m3`, `f8e5m2` or `i64`"))
    };
    let syn::Type::Path(p) = ty else { return Err(msg()) };
    let Some(id) = p.path.get_ident().filter(|_| p.qself.is_none()) else { return Err(msg()) };
    if let Some(i) = generics.iter().position(|g| g == id) {
        return Ok(DTy::Generic(i));
    }
    match DType::from_name(&id.to_string()) {
        Some(d) if d.is_float() || d == DType::I64 => Ok(DTy::Concrete(d)),
        _ => Err(msg()),
    }
}

/// The type arguments of a turbofish (`zeros::<f32>`, `.cast::<T>()`): dtypes only.
fn type_args<P>(args: &syn::punctuated::Punctuated<syn::GenericArgument, P>) -> syn::Result<Vec<syn::Type>> {
    args.iter()
        .map(|a| match a {
            syn::GenericArgument::Type(ty) => Ok(ty.clone()),
            other => Err(Sp::of(other).error("expected a dtype")),
        })
        .collect()
}

fn unsupported(what: &str, sp: Sp) -> syn::Error {
    sp.error(format!("{what} not supported in a #[kfuse] kernel (yet)"))
}

fn stmt(s: &syn::Stmt) -> syn::Result<Stmt> {
    match s {
        syn::Stmt::Local(l) => let_stmt(l),
        syn::Stmt::Item(item) => {
            let sp = match item {
                syn::Item::Fn(f) => Sp::of(&f.sig.fn_token).to(Sp::of(&f.sig.ident)),
                other => Sp::of(other),
            };
            Err(unsupported("items inside a kernel are", sp))
        }
        syn::Stmt::Macro(m) => Err(unsupported("macros are", Sp::of(&m.mac.path).to(Sp::single(m.mac.bang_token.span)))),
        syn::Stmt::Expr(e, _) => match e {
            syn::Expr::ForLoop(f) => for_loop(f),
            syn::Expr::Assign(a) => {
                let target = assign_target(&a.left)?;
                Ok(Stmt::Assign { target, op: None, value: expr(&a.right)?, sp: Sp::of(a) })
            }
            syn::Expr::Binary(b) if is_compound(&b.op) => {
                let op = match b.op {
                    syn::BinOp::AddAssign(_) => BinaryOp::Add,
                    syn::BinOp::SubAssign(_) => BinaryOp::Sub,
                    syn::BinOp::MulAssign(_) => BinaryOp::Mul,
                    syn::BinOp::DivAssign(_) => BinaryOp::Div,
                    syn::BinOp::RemAssign(_) => BinaryOp::Rem,
                    _ => return Err(Sp::of(&b.op).error(format!("operator `{}` is not supported in a #[kfuse] kernel", b.op.to_token_stream_string()))),
                };
                let target = assign_target(&b.left)?;
                Ok(Stmt::Assign { target, op: Some(op), value: expr(&b.right)?, sp: Sp::of(b) })
            }
            e => Ok(Stmt::Expr(expr(e)?)),
        },
    }
}

/// `e` without the parentheses (and invisible groups) around it.
fn strip(mut e: &syn::Expr) -> &syn::Expr {
    loop {
        match e {
            syn::Expr::Paren(p) => e = &p.expr,
            syn::Expr::Group(g) => e = &g.expr,
            _ => return e,
        }
    }
}

const FOR_HOW: &str = "`for k in lo..hi { .. }` or `for k in (lo..hi).step_by(s) { .. }`";
const FOR_FORMS: &str =
    "a #[kfuse] `for` loops over a range of indices: `for k in lo..hi { .. }` or `for k in (lo..hi).step_by(s) { .. }`";

/// `for v in lo..hi { .. }` and `for v in (lo..hi).step_by(s) { .. }`. Errors of the
/// body are all reported (combined into one `syn::Error`).
fn for_loop(f: &syn::ExprForLoop) -> syn::Result<Stmt> {
    let sp = Sp::single(f.for_token.span);
    if let Some(a) = f.attrs.first() {
        return Err(Sp::of(a).error("attributes on loops are not supported in a #[kfuse] kernel"));
    }
    if let Some(l) = &f.label {
        return Err(Sp::of(&l.name).error("loop labels are not supported in a #[kfuse] kernel: there is no `break` or `continue`"));
    }
    let var = match &*f.pat {
        syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() && pi.mutability.is_none() => Some(pi.ident.clone()),
        syn::Pat::Ident(pi) if pi.mutability.is_some() => {
            return Err(Sp::of(&*f.pat).error("the loop variable cannot be `mut`: it is the index of the current iteration"))
        }
        syn::Pat::Wild(_) => None,
        other => return Err(Sp::of(other).error("the variable of a #[kfuse] `for` is a plain name (or `_`)")),
    };
    let range = Sp::of(&*f.expr);
    let (r, step) = match strip(&f.expr) {
        syn::Expr::MethodCall(m) if m.method == "step_by" => {
            if m.turbofish.is_some() || m.args.len() != 1 {
                return Err(Sp::of(&m.method).to(Sp::single(m.paren_token.span.close())).error("`step_by` takes one argument, the step"));
            }
            match strip(&m.receiver) {
                syn::Expr::Range(r) => (r, Some(expr(&m.args[0])?)),
                _ => return Err(Sp::of(&m.receiver).error(FOR_FORMS)),
            }
        }
        syn::Expr::MethodCall(m) => {
            return Err(Sp::of(&m.method).error(format!("`.{}()` is not supported on a loop range: write {FOR_HOW}", m.method)))
        }
        syn::Expr::Range(r) => (r, None),
        _ => return Err(range.error(FOR_FORMS)),
    };
    if let syn::RangeLimits::Closed(t) = r.limits {
        return Err(Sp::of(&t).error("inclusive ranges are not supported in a #[kfuse] `for`: write `lo..hi + 1`"));
    }
    let (Some(lo), Some(hi)) = (&r.start, &r.end) else {
        return Err(Sp::of(r).error("a #[kfuse] loop range needs both ends: `lo..hi`"));
    };
    if let syn::Expr::MethodCall(m) = strip(hi) {
        if m.method == "step_by" {
            return Err(Sp::of(r).error("`lo..hi.step_by(s)` steps `hi`, not the range: write `(lo..hi).step_by(s)`"));
        }
    }
    let (lo, hi) = (expr(lo)?, expr(hi)?);
    let mut body = Vec::new();
    let mut error: Option<syn::Error> = None;
    for s in &f.body.stmts {
        match stmt(s) {
            Ok(s) => body.push(s),
            Err(e) => match &mut error {
                Some(all) => all.combine(e),
                None => error = Some(e),
            },
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(Stmt::For(Box::new(For { var, lo, hi, step, body, range, sp }))),
    }
}

fn is_compound(op: &syn::BinOp) -> bool {
    use syn::BinOp::*;
    matches!(
        op,
        AddAssign(_) | SubAssign(_) | MulAssign(_) | DivAssign(_) | RemAssign(_) | BitXorAssign(_) | BitAndAssign(_)
            | BitOrAssign(_) | ShlAssign(_) | ShrAssign(_)
    )
}

fn assign_target(e: &syn::Expr) -> syn::Result<proc_macro2::Ident> {
    match e {
        syn::Expr::Path(p) if p.qself.is_none() && p.path.get_ident().is_some() => Ok(p.path.segments[0].ident.clone()),
        other => Err(Sp::of(other).error("only a `let mut` variable can be assigned to")),
    }
}

fn binding(p: &syn::Pat) -> syn::Result<Binding> {
    match p {
        syn::Pat::Ident(pi) if pi.by_ref.is_none() && pi.subpat.is_none() => {
            Ok(Binding { name: Some(pi.ident.clone()), mutable: pi.mutability.is_some() })
        }
        syn::Pat::Wild(_) => Ok(Binding { name: None, mutable: false }),
        syn::Pat::Type(t) => Err(Sp::of(&t.ty).error("type annotations are not supported in a #[kfuse] kernel: types are inferred")),
        other => Err(unsupported("this pattern is", Sp::of(other))),
    }
}

fn let_stmt(l: &syn::Local) -> syn::Result<Stmt> {
    if let Some(a) = l.attrs.first() {
        return Err(Sp::of(a).error("attributes on statements are not supported in a #[kfuse] kernel"));
    }
    let Some(init) = &l.init else {
        return Err(Sp::of(l).error("a `let` in a #[kfuse] kernel needs a value: `let x = ..;`"));
    };
    if let Some((else_token, _)) = &init.diverge {
        return Err(unsupported("`let .. else` is", Sp::single(else_token.span)));
    }
    match &l.pat {
        syn::Pat::Tuple(pt) => {
            let names = pt.elems.iter().map(binding).collect::<syn::Result<Vec<_>>>()?;
            match &*init.expr {
                syn::Expr::Tuple(t) if t.elems.len() == names.len() => {
                    let values = t.elems.iter().map(expr).collect::<syn::Result<Vec<_>>>()?;
                    Ok(Stmt::Let { names, values })
                }
                other => Err(Sp::of(other).error(format!(
                    "a tuple `let` needs a tuple of {} values on the right: `let (a, b) = (x, y);`",
                    names.len()
                ))),
            }
        }
        p => Ok(Stmt::Let { names: vec![binding(p)?], values: vec![expr(&init.expr)?] }),
    }
}

fn literal(l: &syn::Lit) -> syn::Result<Lit> {
    let sp = Sp::of(l);
    match l {
        syn::Lit::Float(f) => {
            let v: f64 = f.base10_parse()?;
            if !v.is_finite() {
                return Err(sp.error("this literal is out of range"));
            }
            let suffix = match f.suffix() {
                "" => None,
                "f32" => Some(DType::F32),
                s => return Err(sp.error(format!("unsupported literal suffix `{s}`: write `1.0` (adapts to its operand) or `1.0f32`"))),
            };
            Ok(Lit { value: Literal::Float(v), suffix })
        }
        syn::Lit::Int(i) => match i.suffix() {
            "" | "i64" => {
                let v: i64 = i.base10_parse()?;
                Ok(Lit { value: Literal::Int(v), suffix: (i.suffix() == "i64").then_some(DType::I64) })
            }
            "f32" => Ok(Lit { value: Literal::Float(i.base10_parse::<f64>()?), suffix: Some(DType::F32) }),
            s => Err(sp.error(format!("unsupported literal suffix `{s}`: write `2` (adapts to its operand), `2i64` or `2f32`"))),
        },
        syn::Lit::Bool(b) => Ok(Lit { value: Literal::Bool(b.value), suffix: None }),
        _ => Err(sp.error("a #[kfuse] kernel has only number and `bool` literals")),
    }
}

/// `f32::INFINITY`, `f32::NEG_INFINITY` and `f32::NAN` are weak literals (the same value
/// in every float dtype, so they take their partner's, as `1.0` does); `f32::MAX`,
/// `f32::MIN`, `f32::MIN_POSITIVE` and `f32::EPSILON` are `f32` values (`1.0f32`).
fn float_constant(p: &syn::ExprPath) -> Option<Lit> {
    let segs: Vec<String> = p.path.segments.iter().map(|s| s.ident.to_string()).collect();
    if p.qself.is_some() || p.path.leading_colon.is_some() || segs.len() != 2 || segs[0] != "f32" {
        return None;
    }
    let (value, strong) = match segs[1].as_str() {
        "INFINITY" => (f64::INFINITY, false),
        "NEG_INFINITY" => (f64::NEG_INFINITY, false),
        "NAN" => (f64::NAN, false),
        "MAX" => (f32::MAX as f64, true),
        "MIN" => (f32::MIN as f64, true),
        "MIN_POSITIVE" => (f32::MIN_POSITIVE as f64, true),
        "EPSILON" => (f32::EPSILON as f64, true),
        _ => return None,
    };
    Some(Lit { value: Literal::Float(value), suffix: strong.then_some(DType::F32) })
}

/// An expression of the language; anything else is an error at its leading keyword.
pub fn expr(e: &syn::Expr) -> syn::Result<Expr> {
    use syn::Expr as E;
    let sp = Sp::of(e);
    let kind = match e {
        E::Lit(l) => ExprKind::Lit(literal(&l.lit)?),
        E::Path(p) => match p.path.get_ident() {
            Some(id) if p.qself.is_none() => ExprKind::Var(id.clone()),
            _ => match float_constant(p) {
                Some(l) => ExprKind::Lit(l),
                None => {
                    return Err(sp.error(
                        "paths are not supported in a #[kfuse] kernel: use a plain name, or one of the constants \
                         `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::NAN`, `f32::MAX`, `f32::MIN`, `f32::MIN_POSITIVE`, `f32::EPSILON`",
                    ))
                }
            },
        },
        E::Paren(p) => return Ok(Expr { kind: expr(&p.expr)?.kind, sp }),
        E::Group(g) => return Ok(Expr { kind: expr(&g.expr)?.kind, sp }),
        E::Unary(u) => {
            let op = match u.op {
                syn::UnOp::Neg(_) => UnaryOp::Neg,
                syn::UnOp::Not(_) => UnaryOp::Not,
                _ => return Err(Sp::of(&u.op).error("the dereference operator `*` is not supported in a #[kfuse] kernel")),
            };
            ExprKind::Unary(op, Box::new(expr(&u.expr)?))
        }
        E::Binary(b) => {
            use syn::BinOp as B;
            let op = match b.op {
                B::Add(_) => BinaryOp::Add,
                B::Sub(_) => BinaryOp::Sub,
                B::Mul(_) => BinaryOp::Mul,
                B::Div(_) => BinaryOp::Div,
                B::Rem(_) => BinaryOp::Rem,
                B::And(_) => BinaryOp::And,
                B::Or(_) => BinaryOp::Or,
                B::Lt(_) => BinaryOp::Lt,
                B::Le(_) => BinaryOp::Le,
                B::Gt(_) => BinaryOp::Gt,
                B::Ge(_) => BinaryOp::Ge,
                B::Eq(_) => BinaryOp::Eq,
                B::Ne(_) => BinaryOp::Ne,
                ref op if is_compound(op) => {
                    return Err(Sp::of(op).error("compound assignment is a statement: `x += y;` on a `let mut` variable"))
                }
                ref op => {
                    return Err(Sp::of(op).error(format!("operator `{}` is not supported in a #[kfuse] kernel", op.to_token_stream_string())))
                }
            };
            ExprKind::Binary(op, Box::new(expr(&b.left)?), Box::new(expr(&b.right)?))
        }
        E::Call(c) => {
            const CALLS: &str = "only the kernel functions (`exp`, `max`, `program_id`, ..) can be called, by their plain name";
            let (func, turbofish) = match &*c.func {
                E::Path(p) if p.qself.is_none() && p.path.leading_colon.is_none() && p.path.segments.len() == 1 => {
                    let seg = &p.path.segments[0];
                    let turbofish = match &seg.arguments {
                        syn::PathArguments::None => Vec::new(),
                        syn::PathArguments::AngleBracketed(a) => type_args(&a.args)?,
                        syn::PathArguments::Parenthesized(a) => return Err(Sp::of(a).error(CALLS)),
                    };
                    (seg.ident.clone(), turbofish)
                }
                other => return Err(Sp::of(other).error(CALLS)),
            };
            ExprKind::Call { func, turbofish, args: c.args.iter().map(expr).collect::<syn::Result<_>>()? }
        }
        E::MethodCall(m) => {
            let turbofish = match &m.turbofish {
                None => Vec::new(),
                Some(t) => type_args(&t.args)?,
            };
            ExprKind::Method {
                receiver: Box::new(expr(&m.receiver)?),
                method: m.method.clone(),
                turbofish,
                args: m.args.iter().map(expr).collect::<syn::Result<_>>()?,
                call: Sp::of(&m.method).to(Sp::single(m.paren_token.span.close())),
            }
        }
        E::Array(a) => ExprKind::Array(a.elems.iter().map(expr).collect::<syn::Result<_>>()?),
        E::Infer(_) => ExprKind::Infer,
        E::Tuple(_) => return Err(sp.error("a tuple is only used on the right of a tuple `let`: `let (a, b) = (x, y);`")),
        E::Cast(c) => {
            return Err(Sp::of(&c.as_token).to(Sp::of(&c.ty)).error(
                "`as` casts are not supported in a #[kfuse] kernel: use `.cast::<D>()` or `.to_f32()`",
            ))
        }
        E::If(i) => {
            return Err(Sp::single(i.if_token.span).error(
                "`if` is not supported in a #[kfuse] kernel (yet); for a per-element choice use `select(cond, a, b)`",
            ))
        }
        E::While(w) => {
            return Err(Sp::single(w.while_token.span)
                .error(format!("`while` is not supported in a #[kfuse] kernel: loop over a range of indices with {FOR_HOW}")))
        }
        E::ForLoop(f) => {
            return Err(Sp::single(f.for_token.span)
                .error("a `for` loop is a statement in a #[kfuse] kernel: it has no value and cannot be part of an expression"))
        }
        E::Loop(l) => {
            return Err(Sp::single(l.loop_token.span)
                .error(format!("`loop` is not supported in a #[kfuse] kernel: loop over a range of indices with {FOR_HOW}")))
        }
        E::Match(m) => return Err(unsupported("`match` is", Sp::single(m.match_token.span))),
        E::Return(r) => return Err(unsupported("`return` is", Sp::single(r.return_token.span))),
        E::Break(b) => {
            return Err(Sp::single(b.break_token.span)
                .error("`break` is not supported in a #[kfuse] kernel: a `for` loop always runs its whole range"))
        }
        E::Continue(c) => {
            return Err(Sp::single(c.continue_token.span)
                .error("`continue` is not supported in a #[kfuse] kernel: a `for` loop always runs its whole body"))
        }
        E::Closure(c) => return Err(unsupported("closures are", Sp::single(c.or1_token.span).to(Sp::single(c.or2_token.span)))),
        E::Macro(m) => return Err(unsupported("macros are", Sp::of(&m.mac.path).to(Sp::single(m.mac.bang_token.span)))),
        E::Block(b) => return Err(unsupported("blocks are", Sp::single(b.block.brace_token.span.open()))),
        E::Unsafe(u) => return Err(unsupported("`unsafe` blocks are", Sp::single(u.unsafe_token.span))),
        E::Index(_) => {
            return Err(sp.error("indexing is not supported in a #[kfuse] kernel: read tensors with `.block(..)` or `.row(..)`"))
        }
        E::Field(_) => return Err(unsupported("field access is", sp)),
        E::Reference(r) => return Err(unsupported("references are", Sp::single(r.and_token.span))),
        _ => return Err(unsupported("this expression is", sp)),
    };
    Ok(Expr { kind, sp })
}

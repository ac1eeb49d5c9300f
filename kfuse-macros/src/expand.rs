//! Code generation: the module `<kernel>` (its [`KernelDef`](kfuse_ir::KernelDef) and
//! `build`) and the wrapper function that launches it.
//!
//! For `pub fn add<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>)`:
//!
//! ```text
//! #[allow(non_snake_case, non_upper_case_globals, unused, clippy::approx_constant)]
//! pub mod add {
//!     pub static DEF: ::kfuse::ir::KernelDef = ::kfuse::ir::KernelDef {
//!         name: "add", generics: &["T"],
//!         params: &[::kfuse::ir::ParamSig::Tensor { name: "a", dtype: ::kfuse::ir::DTypeSig::Generic(0), dims: &["N"], output: false }, ..],
//!         build,
//!     };
//!     pub fn build(dtypes: &[::kfuse::ir::DType]) -> ::core::result::Result<::kfuse::ir::Kernel, ::kfuse::ir::IrError> {
//!         // dtype count and float checks, then one builder call per plan step:
//!         let mut b = ::kfuse::ir::Builder::new("add");
//!         let v0 = b.shape_sym("N");
//!         let v1 = b.tensor_param("a", dtypes[0], &[v0], false);
//!         ..
//!         b.finish()
//!     }
//! }
//! pub fn add(a: &::kfuse::runtime::Tensor, b: &::kfuse::runtime::Tensor, out: &mut ::kfuse::runtime::Tensor)
//!     -> ::kfuse::runtime::Result<::kfuse::runtime::Launched>
//! {
//!     ::kfuse::runtime::launch(&add::DEF, &mut [::kfuse::runtime::Arg::In(a), ::kfuse::runtime::Arg::In(b), ::kfuse::runtime::Arg::Out(out)])
//! }
//! ```
//!
//! Each builder call is emitted with `quote_spanned!` at the user's code it comes from;
//! locals of the generated code use `Span::mixed_site()` so they never meet user names.
//! Without a plan (the kernel had errors), `build` returns an error and the rest is
//! emitted as usual, so that uses of the kernel still resolve (in IDEs too).

use kfuse_ir::{DType, Literal};
use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};

use crate::ast::{DTy, Kernel, ParamKind};
use crate::lower::{DimRef, ExtentRef, Plan, StepKind};

/// Everything the macro emits for a kernel (errors excluded).
pub fn kernel(k: &Kernel, krate: &syn::Path, plan: Option<&Plan>) -> TokenStream {
    let ir = quote!(#krate::ir);
    let rt = quote!(#krate::runtime);
    let vis = &k.vis;
    let name = &k.name;
    let name_str = name.to_string();
    let generics: Vec<String> = k.generics.iter().map(|g| g.to_string()).collect();

    let params = k.params.iter().filter_map(|p| {
        let pname = p.name.to_string();
        match &p.kind {
            ParamKind::Tensor { dtype, dims, output } => {
                let dtype = match dtype {
                    DTy::Generic(i) => quote!(#ir::DTypeSig::Generic(#i)),
                    DTy::Concrete(d) => {
                        let d = dtype_tokens(&ir, *d);
                        quote!(#ir::DTypeSig::Concrete(#d))
                    }
                };
                let dims = dims.iter().map(|d| d.to_string());
                Some(quote!(#ir::ParamSig::Tensor { name: #pname, dtype: #dtype, dims: &[#(#dims),*], output: #output }))
            }
            ParamKind::Scalar(d) => {
                let d = dtype_tokens(&ir, *d);
                Some(quote!(#ir::ParamSig::Scalar { name: #pname, dtype: #d }))
            }
            ParamKind::Invalid => None,
        }
    });

    let dtypes = Ident::new("dtypes", Span::mixed_site());
    let body = match plan {
        Some(plan) => build_body(k, &ir, &dtypes, plan),
        None => {
            let msg = format!("the #[kfuse] kernel `{name_str}` did not compile");
            quote!(::core::result::Result::Err(#ir::IrError::Verify {
                pass: ::std::string::String::from("#[kfuse]"),
                msg: ::std::string::String::from(#msg),
            }))
        }
    };

    // The wrapper: tensors by reference, scalars by value, in signature order.
    let mut wparams = Vec::new();
    let mut args = Vec::new();
    for p in &k.params {
        let n = &p.name;
        match &p.kind {
            ParamKind::Tensor { output: false, .. } => {
                wparams.push(quote!(#n: &#rt::Tensor));
                args.push(quote!(#rt::Arg::In(#n)));
            }
            ParamKind::Tensor { output: true, .. } => {
                wparams.push(quote!(#n: &mut #rt::Tensor));
                args.push(quote!(#rt::Arg::Out(#n)));
            }
            ParamKind::Scalar(d) => {
                let (ty, variant) = if *d == DType::I64 { (quote!(i64), quote!(I64)) } else { (quote!(f32), quote!(F32)) };
                wparams.push(quote!(#n: #ty));
                args.push(quote!(#rt::Arg::Scalar(#rt::Scalar::#variant(#n))));
            }
            // Accept anything, so that calls keep their arity while the error is fixed.
            ParamKind::Invalid => wparams.push(quote!(#[allow(unused_variables)] #n: impl ::core::marker::Sized)),
        }
    }
    let attrs = &k.attrs;
    let cfgs = k.attrs.iter().filter(|a| a.path().is_ident("cfg"));
    let mod_doc = format!(" The IR definition of the `#[kfuse]` kernel `{name_str}`: [`DEF`] and [`build`].");
    let build_doc = format!(" Builds the IR of `{name_str}` for concrete dtypes (one per generic: {generics:?}).");
    // A launcher the user left undocumented gets a line of its own, so that a crate
    // under `#![deny(missing_docs)]` takes its kernels; the user's docs are kept as
    // they are.
    let launcher_doc = (!k.attrs.iter().any(|a| a.path().is_ident("doc"))).then(|| {
        let d = format!(" Launches the `#[kfuse]` kernel `{name_str}` (its signature and IR: `{name_str}::DEF`).");
        quote!(#[doc = #d])
    });

    quote! {
        #(#cfgs)*
        #[doc = #mod_doc]
        // The kernel's literals reach `build` with the attribute's span: lints about them
        // (`approx_constant`) would point at `#[kfuse]`, not at the literal.
        #[allow(non_snake_case, non_upper_case_globals, unused, clippy::approx_constant)]
        #vis mod #name {
            #[allow(unused_imports)]
            use super::*;

            /// The kernel's signature and IR builder, for the runtime.
            pub static DEF: #ir::KernelDef = #ir::KernelDef {
                name: #name_str,
                generics: &[#(#generics),*],
                params: &[#(#params),*],
                build,
            };

            #[doc = #build_doc]
            pub fn build(#dtypes: &[#ir::DType]) -> ::core::result::Result<#ir::Kernel, #ir::IrError> {
                #body
            }
        }

        #(#attrs)*
        #launcher_doc
        #vis fn #name(#(#wparams),*) -> #rt::Result<#rt::Launched> {
            #rt::launch(&#name::DEF, &mut [#(#args),*])
        }
    }
}

/// Whether a step adds ops to the kernel (and so takes a source location).
fn makes_ops(k: &StepKind) -> bool {
    !matches!(
        k,
        StepKind::ShapeSym(_)
            | StepKind::TileSym(_)
            | StepKind::TensorParam { .. }
            | StepKind::Name(..)
            | StepKind::LoopIndex(_)
            | StepKind::LoopCarried(..)
            | StepKind::LoopResult(..)
    )
}

fn dtype_tokens(ir: &TokenStream, d: DType) -> TokenStream {
    let v = format_ident!("{}", format!("{d:?}"));
    quote!(#ir::DType::#v)
}

fn f64_tokens(v: f64) -> TokenStream {
    if v.is_nan() {
        quote!(f64::NAN)
    } else if v.is_infinite() {
        if v > 0.0 { quote!(f64::INFINITY) } else { quote!(f64::NEG_INFINITY) }
    } else if v.is_sign_negative() {
        let l = proc_macro2::Literal::f64_suffixed(-v);
        quote!(-#l)
    } else {
        let l = proc_macro2::Literal::f64_suffixed(v);
        quote!(#l)
    }
}

fn i64_tokens(v: i64) -> TokenStream {
    if v == i64::MIN {
        quote!(i64::MIN)
    } else if v < 0 {
        let l = proc_macro2::Literal::i64_suffixed(-v);
        quote!(-#l)
    } else {
        let l = proc_macro2::Literal::i64_suffixed(v);
        quote!(#l)
    }
}

fn literal_tokens(ir: &TokenStream, l: Literal) -> TokenStream {
    match l {
        Literal::Float(f) => {
            let f = f64_tokens(f);
            quote!(#ir::Literal::Float(#f))
        }
        Literal::Int(i) => {
            let i = i64_tokens(i);
            quote!(#ir::Literal::Int(#i))
        }
        Literal::Bool(b) => quote!(#ir::Literal::Bool(#b)),
    }
}

/// The body of `build`: checks of `dtypes`, then the plan's builder calls.
fn build_body(k: &Kernel, ir: &TokenStream, dtypes: &Ident, plan: &Plan) -> TokenStream {
    let name = k.name.to_string();
    let n = k.generics.len();
    let b = Ident::new("b", Span::mixed_site());
    let slot = |s: usize| Ident::new(&format!("v{s}"), Span::mixed_site());
    let string = |s: &str| quote!(::std::string::String::from(#s));

    let op = string(&name);
    let expected = {
        let g: Vec<String> = k.generics.iter().map(|g| g.to_string()).collect();
        string(&format!("{n} dtype{} ({})", if n == 1 { "" } else { "s" }, g.join(", ")))
    };
    let mut out = quote! {
        if #dtypes.len() != #n {
            return ::core::result::Result::Err(#ir::IrError::Expected {
                op: #op,
                expected: #expected,
                found: ::std::string::ToString::to_string(&#dtypes.len()),
            });
        }
    };
    for (i, g) in k.generics.iter().enumerate() {
        let expected = string(&format!("a float dtype (f32, f16, bf16, f8e4m3, f8e5m2) for `{g}`"));
        let op = string(&name);
        out.extend(quote! {
            if !#dtypes[#i].is_float() {
                return ::core::result::Result::Err(#ir::IrError::Expected {
                    op: #op,
                    expected: #expected,
                    found: ::std::string::ToString::to_string(&#dtypes[#i]),
                });
            }
        });
    }
    out.extend(quote!(let mut #b = #ir::Builder::new(#name);));

    let dty = |d: DTy| match d {
        DTy::Generic(i) => quote!(#dtypes[#i]),
        DTy::Concrete(d) => dtype_tokens(ir, d),
    };
    let extent = |e: ExtentRef| match e {
        ExtentRef::Const(c) => quote!(#ir::Extent::Const(#c)),
        ExtentRef::Tile(s) => {
            let s = slot(s);
            quote!(#ir::Extent::Tile(#s))
        }
        ExtentRef::Full(s) => {
            let s = slot(s);
            quote!(#ir::Extent::Full(#s))
        }
    };
    let dims = |d: &[DimRef]| {
        let d = d.iter().map(|d| match d {
            DimRef::Index => quote!(#ir::AccessDim::Index),
            DimRef::Tile(e) => {
                let e = extent(*e);
                quote!(#ir::AccessDim::Tile(#e))
            }
        });
        quote!(&[#(#d),*])
    };
    let slots = |s: &[usize]| {
        let s = s.iter().map(|&s| slot(s));
        quote!(&[#(#s),*])
    };
    let variant = |v: &dyn std::fmt::Debug| format_ident!("{}", format!("{v:?}"));

    for (i, step) in plan.steps.iter().enumerate() {
        let v = slot(i);
        let sp = step.sp.start;
        // The ops of this call get the user's line and column: `line!()` spanned at the
        // user's code expands to where that code is in the source file, not to the
        // macro's line (a span's line is not readable in a proc macro on stable).
        if makes_ops(&step.kind) {
            out.extend(quote_spanned!(sp=> #b.at(::core::line!(), ::core::column!());));
        }
        let call = match &step.kind {
            StepKind::ShapeSym(n) => quote_spanned!(sp=> let #v = #b.shape_sym(#n);),
            StepKind::TileSym(n) => quote_spanned!(sp=> let #v = #b.tile_sym(#n);),
            StepKind::TensorParam { name, dtype, dims, output } => {
                let (d, ds) = (dty(*dtype), slots(dims));
                quote_spanned!(sp=> let #v = #b.tensor_param(#name, #d, #ds, #output);)
            }
            StepKind::ScalarParam { name, dtype } => {
                let d = dtype_tokens(ir, *dtype);
                quote_spanned!(sp=> let (_, #v) = #b.scalar_param(#name, #d);)
            }
            StepKind::ProgramId(a) => quote_spanned!(sp=> let #v = #b.program_id(#a)?;),
            StepKind::ShapeDim(s) => {
                let s = slot(*s);
                quote_spanned!(sp=> let #v = #b.shape_dim(#s);)
            }
            StepKind::TileExtent(e) => {
                let e = extent(*e);
                quote_spanned!(sp=> let #v = #b.tile_extent(#e);)
            }
            StepKind::Literal(l) => {
                let l = literal_tokens(ir, *l);
                quote_spanned!(sp=> let #v = #b.literal(#l);)
            }
            StepKind::Constant(l, d) => {
                let (l, d) = (literal_tokens(ir, *l), dtype_tokens(ir, *d));
                quote_spanned!(sp=> let #v = #b.constant(#l, #d);)
            }
            StepKind::Load { tensor, offsets, dims: d } => {
                let (t, o, d) = (slot(*tensor), slots(offsets), dims(d));
                quote_spanned!(sp=> let #v = #b.load(#t, #o, #d)?;)
            }
            StepKind::Store { tensor, offsets, dims: d, value, mask, .. } => {
                let (t, o, d, x) = (slot(*tensor), slots(offsets), dims(d), slot(*value));
                match mask {
                    Some(m) => {
                        let m = slot(*m);
                        quote_spanned!(sp=> #b.store_where(#t, #o, #d, #m, #x)?;)
                    }
                    None => quote_spanned!(sp=> #b.store(#t, #o, #d, #x)?;),
                }
            }
            StepKind::Unary(op, x) => {
                let (op, x) = (variant(op), slot(*x));
                quote_spanned!(sp=> let #v = #b.unary(#ir::UnaryOp::#op, #x)?;)
            }
            StepKind::Binary(op, x, y) => {
                let (op, x, y) = (variant(op), slot(*x), slot(*y));
                quote_spanned!(sp=> let #v = #b.binary(#ir::BinaryOp::#op, #x, #y)?;)
            }
            StepKind::Select(c, x, y) => {
                let (c, x, y) = (slot(*c), slot(*x), slot(*y));
                quote_spanned!(sp=> let #v = #b.select(#c, #x, #y)?;)
            }
            StepKind::Cast(x, d) => {
                let (x, d) = (slot(*x), dty(*d));
                quote_spanned!(sp=> let #v = #b.cast(#x, #d)?;)
            }
            StepKind::Reduce { op, x, axis, keep_dim } => {
                let (op, x, axis) = (variant(op), slot(*x), i64_tokens(*axis));
                quote_spanned!(sp=> let #v = #b.reduce(#ir::ReduceOp::#op, #x, #axis, #keep_dim)?;)
            }
            StepKind::Permute(x, perm) => {
                let x = slot(*x);
                quote_spanned!(sp=> let #v = #b.permute(#x, &[#(#perm),*])?;)
            }
            StepKind::Iota(e) => {
                let e = extent(*e);
                quote_spanned!(sp=> let #v = #b.iota(#e)?;)
            }
            StepKind::ExpandDims(x, axis) => {
                let (x, axis) = (slot(*x), i64_tokens(*axis));
                quote_spanned!(sp=> let #v = #b.expand_dims(#x, #axis)?;)
            }
            StepKind::Name(x, n) => {
                let x = slot(*x);
                quote_spanned!(sp=> #b.name(#x, #n);)
            }
            StepKind::Zeros { dtype, extents } => {
                let d = dty(*dtype);
                let e = extents.iter().map(|e| extent(*e));
                quote_spanned!(sp=> let #v = #b.zeros(#d, &[#(#e),*])?;)
            }
            StepKind::Dot(x, y, tf32) => {
                let (x, y) = (slot(*x), slot(*y));
                if *tf32 {
                    quote_spanned!(sp=> let #v = #b.dot_tf32(#x, #y)?;)
                } else {
                    quote_spanned!(sp=> let #v = #b.dot(#x, #y)?;)
                }
            }
            StepKind::BeginFor { lo, hi, step, inits } => {
                let (lo, hi, st, inits) = (slot(*lo), slot(*hi), slot(*step), slots(inits));
                quote_spanned!(sp=> let #v = #b.begin_for(#lo, #hi, #st, #inits)?;)
            }
            StepKind::LoopIndex(s) => {
                let s = slot(*s);
                quote_spanned!(sp=> let #v = #s.1;)
            }
            StepKind::LoopCarried(s, i) => {
                let s = slot(*s);
                quote_spanned!(sp=> let #v = #s.2[#i];)
            }
            StepKind::Conform { value, like, name } => {
                let (x, like) = (slot(*value), slot(*like));
                quote_spanned!(sp=> let #v = #b.conform(#x, #like, #name)?;)
            }
            StepKind::EndFor { begin, next } => {
                let (s, next) = (slot(*begin), slots(next));
                quote_spanned!(sp=> let #v = #b.end_for(#s.0, #next)?;)
            }
            StepKind::LoopResult(s, i) => {
                let s = slot(*s);
                quote_spanned!(sp=> let #v = #s[#i];)
            }
        };
        out.extend(call);
    }
    out.extend(quote!(#b.finish()));
    out
}

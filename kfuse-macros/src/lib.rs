//! `#[kfuse]`: turns a kernel written as a Rust function into a `KernelDef` (its
//! signature and a function that builds its IR) and a wrapper that launches it.
//!
//! Pipeline, one module each: [`parse`] (`syn` → [`ast`], the syntax the language
//! has) → [`lower`] (names resolved; the kernel as a [`lower::Plan`] of IR-builder
//! calls) → [`validate`] (the plan runs on the real `kfuse_ir::Builder` for every dtype
//! assignment of the generics, so the typing rules are the builder's) → [`expand`] (the
//! same plan printed as the generated `build`). On errors the `compile_error!`s are
//! emitted together with the items (with a `build` that returns an error), so that code
//! using the kernel still resolves.
//!
//! The generated code names the facade crate `::kfuse` (which re-exports `ir` and
//! `runtime`), or the path given as `#[kfuse(crate = "path")]`.

use proc_macro::TokenStream;

mod ast;
mod expand;
mod lower;
mod parse;
mod validate;

#[cfg(test)]
mod tests;

/// Compiles a kernel. See the crate docs of `kfuse` for the language.
///
/// ```ignore
/// #[kfuse]
/// pub fn add<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
///     let i = program_id(0);
///     let x = a.block([i * BN], [BN]).load();
///     let y = b.block([i * BN], [BN]).load();
///     out.block([i * BN], [BN]).store(x + y);
/// }
/// ```
#[proc_macro_attribute]
pub fn kfuse(attr: TokenStream, item: TokenStream) -> TokenStream {
    kfuse2(attr.into(), item.into()).into()
}

/// [`kfuse`] on `proc_macro2` tokens (testable outside the compiler).
fn kfuse2(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let mut errors = Vec::new();
    let krate = parse::attr(attr).unwrap_or_else(|e| {
        errors.push(e);
        syn::parse_quote!(::kfuse)
    });
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(e) => {
            let e = syn::Error::new(e.span(), "#[kfuse] applies to a function: `fn name<T: Float>(..) { .. }`").to_compile_error();
            return quote::quote!(#e #item);
        }
    };
    let kernel = parse::kernel(&func, &mut errors);
    let plan = if errors.is_empty() {
        match lower::lower(&kernel).and_then(|plan| validate::validate(&kernel, &plan).map(|()| plan)) {
            Ok(plan) => Some(plan),
            Err(e) => {
                errors.push(e);
                None
            }
        }
    } else {
        None
    };
    let errors = errors.iter().map(syn::Error::to_compile_error);
    let items = expand::kernel(&kernel, &krate, plan.as_ref());
    quote::quote!(#(#errors)* #items)
}

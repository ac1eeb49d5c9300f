#![deny(missing_docs)]
//! `#[kfuse]`: turns a kernel written as a Rust function into a `KernelDef` (its
//! signature and a function that builds its IR) and a wrapper that launches it.
//!
//! Pipeline, one private module each: `parse` (`syn` → `ast`, the syntax the language
//! has) → `lower` (names resolved; the kernel as a `lower::Plan` of IR-builder
//! calls) → `validate` (the plan runs on the real `kfuse_ir::Builder` for every dtype
//! assignment of the generics, so the typing rules are the builder's) → `expand` (the
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

/// Compiles a kernel: `#[kfuse]` or `#[kfuse(crate = "path::to::kfuse")]`.
///
/// # Examples
///
/// RMSNorm, one row a program, launched on the CPU interpreter (a tensor made on
/// `Device::gpu(0)?` runs it on the GPU):
///
/// ```
/// # extern crate self as kfuse;
/// # pub use kfuse_ir as ir;
/// # pub use kfuse_runtime as runtime;
/// # pub mod prelude { pub use kfuse_macros::kfuse; pub use kfuse_runtime::{DType, Device, Tensor}; }
/// use kfuse::prelude::*;
///
/// /// `out = x / rms(x) * w`, row by row.
/// #[kfuse]
/// pub fn rmsnorm<T: Float>(x: Tensor<T, (M, N)>, w: Tensor<T, (N,)>, out: &mut Tensor<T, (M, N)>, eps: f32) {
///     let row = program_id(0);
///     let xr = x.row(row).load().to_f32();
///     let r = rsqrt((xr * xr).mean() + eps);
///     out.row(row).store((xr * r * w.load().to_f32()).cast::<T>());
/// }
///
/// # fn main() -> kfuse::runtime::Result<()> {
/// let dev = Device::cpu();
/// let x = Tensor::from_f32(&[3., 4., 1., 1.], &[2, 2], DType::F32, &dev)?;
/// let w = Tensor::from_f32(&[1., 2.], &[2], DType::F32, &dev)?;
/// let mut out = Tensor::empty(&[2, 2], DType::F32, &dev)?;
/// // the launcher: tensors by reference (`&mut` for outputs), scalars by value
/// let ran = rmsnorm(&x, &w, &mut out, 0.0)?;
/// println!("{} ran on {}", ran.kernel, ran.backend);
/// let y = out.to_vec_f32()?; // row 1: [1, 1] / 1 · [1, 2]
/// assert_eq!(&y[2..], [1., 2.]);
/// // the generated module: the signature the runtime checks, and the IR builder
/// assert_eq!(rmsnorm::DEF.params.len(), 4);
/// let ir = rmsnorm::build(&[DType::BF16]).expect("builds for bf16");
/// assert_eq!(ir.name, "rmsnorm");
/// # Ok(()) }
/// ```
///
/// **Signature.** Generics are dtypes, each bounded by exactly `Float` (one of f32,
/// f16, bf16, bound at launch). Parameters are `x: Tensor<D, (S1, ..)>` (input),
/// `x: &mut Tensor<D, (S1, ..)>` (output), `s: f32` or `s: i64`, where `D` is a generic
/// or `f32`/`f16`/`bf16`/`i64` and `S1, ..` are shape symbols (`(N,)` for rank 1). No
/// return type.
///
/// **Statements.** `let x = e;`, `let mut x = e;`, `let (a, b) = (e1, e2);`, `x = e;`
/// and `x += e;` (`-=`, `*=`, `/=`, `%=`) on a `let mut`, `access.store(v);`, and loops
/// `for k in lo..hi { .. }` / `for k in (lo..hi).step_by(s) { .. }` (`lo`, `hi`, `s`:
/// `i64` index expressions; a step of 0 or less is an error at run time). A `let mut`
/// from outside a loop that the body assigns is carried from one iteration to the next
/// and holds the last iteration's value after the loop (the init if it runs zero
/// times); inside the loop each assignment to it must keep its type (a literal adapts, a
/// scalar broadcasts). A loop body is a scope. No `while`, `loop`, `break`, `continue`.
///
/// **Expressions.** Literals (`1.0`, `2` adapt to their operand's dtype; `1.0f32`,
/// `2i64` do not; `true`); names: locals, scalar parameters, shape symbols (their
/// runtime extent, `i64`) and ALL-CAPS tile symbols (`BM`: a tile size the scheduler
/// picks, `i64`); `+ - * / %`, `< <= > >= == !=`, `&& || ! -`; tensor accesses
/// `t.block([offsets], [extents])`, `t.row(i)` and the whole `t`, each followed by
/// `.load()` or `.store(v)` (an extent is a tile symbol, an integer literal, a shape
/// symbol, or `_`: that dimension is indexed by its offset and is not part of the tile,
/// so `q.block([t, 0, 1, 0], [_, H, _, DH])` is an `[H, DH]` tile); methods
/// `exp ln log sqrt rsqrt sigmoid tanh erf sin cos abs`, `max(y) min(y)`,
/// reductions `sum() mean() max() min()` (last axis), `sum_axis(k)` and
/// `sum_keepdim(k)` (likewise `mean`, `max`, `min`), `cast::<D>() to_f32() to_f16()
/// to_bf16()`, `t()`, `permute([..])`, `unsqueeze(k)` (a new axis of extent 1 at `k`);
/// functions `program_id(k)` (k = 0, 1, 2), `iota(E)` (the `i64` tile `[0, 1, .., E-1]`,
/// `E` a tile symbol, integer literal or shape symbol), `zeros::<D>([E0, ..])` (a tile
/// of zeros of dtype `D`), `dot(a, b)` (the `f32 [M, N]` product of `[M, K]` and
/// `[K, N]` tiles of one float dtype), `dot_tf32(a, b)` (the same of f32 tiles, whose
/// operands the tensor cores may read as TF32: the fast f32 product), `exp(x)` and the other unary ones, `max(a, b)`,
/// `min(a, b)`, `select(c, a, b)`.
/// Typing (dtypes, broadcasting, what may be stored where) is `kfuse_ir::Builder`'s,
/// checked at compile time for every dtype of the generics.
///
/// **Output.** For `vis fn name<..>(params)` the macro emits, with `kfuse` standing for
/// the crate path:
/// - `vis fn name(..) -> kfuse::runtime::Result<kfuse::runtime::Launched>`, the
///   launcher: one argument per parameter in signature order, `&kfuse::runtime::Tensor`
///   for an input tensor, `&mut kfuse::runtime::Tensor` for an output, `f32` or `i64` for
///   a scalar (no generics: the dtypes come from the tensors at launch). It calls
///   `kfuse::runtime::launch(&name::DEF, ..)`, which runs the kernel on the GPU the
///   tensors live on, or in the CPU interpreter for CPU tensors, and says which in
///   `Launched::backend`. The function's attributes and docs go to the launcher (an
///   undocumented one gets a line of its own).
/// - `vis mod name`, holding `pub static DEF: kfuse::ir::KernelDef` (the name, the dtype
///   generics and the parameters the runtime checks arguments against, and `build`) and
///   `pub fn build(&[kfuse::ir::DType]) -> Result<kfuse::ir::Kernel, kfuse::ir::IrError>`
///   (the IR for one dtype per generic). `&name::DEF` is what the runtime's `emit`,
///   `gpu_plan_tiles`, `launch_interpreter` and `launch_grouped` take.
#[proc_macro_attribute]
pub fn kfuse(attr: TokenStream, item: TokenStream) -> TokenStream {
    kfuse2(attr.into(), item.into()).into()
}

/// [`kfuse`] on `proc_macro2` tokens (testable outside the compiler).
fn kfuse2(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let (krate, attr_error) = parse::attr(attr);
    let mut errors: Vec<syn::Error> = attr_error.into_iter().collect();
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

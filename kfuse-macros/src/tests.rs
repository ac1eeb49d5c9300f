//! Unit tests of the pipeline on `proc_macro2` tokens. The integration tests
//! (`tests/expand.rs`, `tests/ui.rs`) drive the real macro.

use kfuse_ir::DType;
use quote::quote;

use crate::{lower, parse, validate};

/// Parses, lowers and validates; the first error's message, or the plan.
fn check(item: proc_macro2::TokenStream) -> Result<lower::Plan, String> {
    let f: syn::ItemFn = syn::parse2(item).unwrap();
    let mut errors = Vec::new();
    let k = parse::kernel(&f, &mut errors);
    if let Some(e) = errors.first() {
        return Err(e.to_string());
    }
    let plan = lower::lower(&k).map_err(|e| e.to_string())?;
    validate::validate(&k, &plan).map_err(|e| e.to_string())?;
    Ok(plan)
}

#[test]
fn tile_symbols_are_all_caps() {
    assert!(lower::is_tile_symbol("BM"));
    assert!(lower::is_tile_symbol("B2_K"));
    assert!(!lower::is_tile_symbol("Bm"));
    assert!(!lower::is_tile_symbol("_B"));
    assert!(!lower::is_tile_symbol("2B"));
}

#[test]
fn the_plan_builds_what_validation_checked() {
    let plan = check(quote! {
        fn scale<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, s: f32) {
            let i = program_id(0);
            let v = x.block([i * BN], [BN]).load().to_f32();
            out.block([i * BN], [BN]).store((v * s).cast::<T>());
        }
    })
    .unwrap();
    let k = validate::build(&plan, "scale", &[DType::F16]).unwrap();
    let text = kfuse_ir::print::print(&k);
    assert!(text.starts_with("kernel scale(x: f16[N], out: &mut f16[N], s: f32)"), "{text}");
    assert!(text.contains("cast"), "{text}");
}

#[test]
fn generic_dependent_errors_name_the_assignment() {
    let e = check(quote! {
        fn k<T: Float>(x: Tensor<T, (N,)>, y: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
            out.load(); 
        }
    });
    assert!(e.is_err());
    let e = check(quote! {
        fn k<T: Float>(x: Tensor<T, (N,)>, y: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            let s = x.block([i * B], [B]).load() + y.block([i * B], [B]).load();
            out.block([i * B], [B]).store(s);
        }
    })
    .unwrap_err();
    assert_eq!(e, "dtype mismatch in `add`: f16 vs f32 (with T = f16)");
    // The same error for every assignment: no suffix.
    let e = check(quote! {
        fn k<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
            let (i, j) = (program_id(0), program_id(1));
            let a = x.block([i * BM, j * BN], [BM, BN]).load();
            out.block([i * BM, j * BN], [BM, BN]).store(a + a.t());
        }
    })
    .unwrap_err();
    assert_eq!(e, "shape mismatch in `add`: [BM, BN] vs [BN, BM]");
}

#[test]
fn expansion_parses_as_rust() {
    let out = crate::kfuse2(
        quote!(crate = "crate::k"),
        quote! {
            /// Adds.
            pub fn add<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, eps: f32, n: i64) {
                let i = program_id(0);
                let mut x = a.block([i * BN], [BN]).load();
                x += -1.5;
                x = x * 2.0;
                out.block([i * BN], [BN]).store(x + b.block([i * BN], [BN]).load());
            }
        },
    );
    let file: syn::File = syn::parse2(out.clone()).unwrap();
    assert_eq!(file.items.len(), 2, "{out}");
    let text = out.to_string();
    assert!(!text.contains("compile_error"), "{text}");
    assert!(text.contains("Arg :: Scalar (crate :: k :: runtime :: Scalar :: I64 (n))"), "{text}");
}

#[test]
fn errors_still_emit_the_items() {
    let out = crate::kfuse2(
        quote!(),
        quote! {
            pub fn add<T: Float>(a: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
                let i = program_id(0);
                out.block([i * BN], [BN]).store(nope);
            }
        },
    );
    let text = out.to_string();
    assert!(text.contains("compile_error"), "{text}");
    assert!(text.contains("cannot find `nope` in this kernel"), "{text}");
    let file: syn::File = syn::parse2(out).unwrap();
    assert_eq!(file.items.len(), 3);
}

#[test]
#[ignore = "prints the expansion of `add`; run with --ignored --nocapture"]
fn print_expansion() {
    let out = crate::kfuse2(
        quote!(),
        quote! {
            /// Adds two vectors.
            pub fn add<T: Float>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, eps: f32) {
                let i = program_id(0);
                let x = a.block([i * BN], [BN]).load();
                let y = b.block([i * BN], [BN]).load();
                out.block([i * BN], [BN]).store(x + y * -2.0);
            }
        },
    );
    println!("{out}");
}

#[test]
fn index_extents_iota_unsqueeze_sin_cos() {
    let plan = check(quote! {
        fn k<T: Float>(x: &mut Tensor<T, (S, H, R, D)>, pos: Tensor<i64, (S,)>) {
            let t = program_id(0);
            let p = pos.row(t).load();
            let a = (iota(D) + p).to_f32();
            let c = a.cos() + sin(a) + cos(a).sin();
            let v = x.block([t, 0, 1, 0], [_, H, _, D]).load().to_f32();
            let m = (v * v).mean_axis(1).unsqueeze(1);
            x.block([t, 0, 1, 0], [_, H, _, D]).store((v * c / m).cast::<T>());
        }
    })
    .unwrap();
    let k = validate::build(&plan, "k", &[DType::F16]).unwrap();
    let text = kfuse_ir::print::print(&k);
    assert!(text.starts_with("kernel k(x: &mut f16[S, H, R, D], pos: i64[S])"), "{text}");
    for want in ["load pos[%", "iota D! : i64[D!]", "cos %", "sin %", "expand_dims %", ", axis=1 : f32[H!, 1]", "+H!, %", " : f32[H!, D!]"] {
        assert!(text.contains(want), "missing `{want}` in\n{text}");
    }
    // `unsqueeze` takes negative axes; iota takes literal and tile extents.
    check(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N, M)>) {
            let i = program_id(0);
            let v = x.block([i * BN], [BN]).load().unsqueeze(-1) + iota(4).to_f32().unsqueeze(0) * iota(BN).to_f32().unsqueeze(1);
            out.block([i * BN, 0], [BN, 4]).store(v);
        }
    })
    .unwrap();
}

#[test]
fn errors_of_the_new_forms() {
    let err = |item| check(item).err().unwrap();
    let e = err(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([_], [BN]).store(x.block([i * BN], [BN]).load());
        }
    });
    assert!(e.starts_with("`_` is only a block extent"), "{e}");
    let e = err(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>, n: i64) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load() + iota(n).to_f32());
        }
    });
    assert!(e.starts_with("`n` is a runtime value; the extent of `iota` is"), "{e}");
    let e = err(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load() + iota(_).to_f32());
        }
    });
    assert!(e.starts_with("the extent of `iota` is"), "{e}");
    let e = err(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load().unsqueeze(2).sum_axis(1).sum_axis(1));
        }
    });
    assert_eq!(e, "`expand_dims` expects an axis in -2..=1 for a tile of rank 1, found 2");
    let e = err(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>, a: i64) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load().unsqueeze(a));
        }
    });
    assert!(e.starts_with("the axis of `unsqueeze` must be an integer literal"), "{e}");
    let e = err(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load() + iota(BN).sin());
        }
    });
    assert_eq!(e, "`sin` expects a float (f32, f16, bf16), found i64");
    // An i64 tensor is a tensor of i64 values: no implicit float arithmetic.
    let e = err(quote! {
        fn k(p: Tensor<i64, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(p.block([i * BN], [BN]).load() * 0.5);
        }
    });
    assert_eq!(e, "dtype mismatch in `mul`: i64 vs f32");
}

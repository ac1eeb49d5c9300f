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
    assert_eq!(e, "`sin` expects a float (f32, f16, bf16, f8e4m3, f8e5m2), found i64");
    // An i64 tensor is a tensor of i64 values: no implicit float arithmetic.
    let e = err(quote! {
        fn k(p: Tensor<i64, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(p.block([i * BN], [BN]).load() * 0.5);
        }
    });
    assert_eq!(e, "dtype mismatch in `mul`: i64 vs f32");
}

/// The printed IR of a kernel for `dtypes`.
fn ir(item: proc_macro2::TokenStream, dtypes: &[DType]) -> String {
    let plan = check(item).unwrap();
    let k = validate::build(&plan, "k", dtypes).unwrap();
    kfuse_ir::print::print(&k)
}

#[test]
fn gemm_carries_its_accumulator() {
    let text = ir(
        quote! {
            fn gemm<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, c: &mut Tensor<T, (M, N)>) {
                let (i, j) = (program_id(0), program_id(1));
                let mut acc = zeros::<f32>([BM, BN]);
                for k in (0..K).step_by(BK) {
                    acc += dot(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
                }
                c.block([i * BM, j * BN], [BM, BN]).store(acc.cast::<T>());
            }
        },
        &[DType::BF16],
    );
    for want in [
        "for L0 in %",
        "= loop_index L0 : i64  // k",
        "= loop_carried L0.0 : f32[BM, BN]  // acc",
        "= dot %",
        "yield L0 [%",
        "= loop_result L0.0 : f32[BM, BN]  // acc",
        "cast %",
    ] {
        assert!(text.contains(want), "missing `{want}` in\n{text}");
    }
    assert_eq!(text.matches("loop_carried").count(), 1, "{text}");
}

#[test]
fn what_a_loop_carries() {
    // Only variables from outside that the body assigns; a `let` in the body shadows;
    // a body's `let`s end with it; nested loops carry through both.
    let text = ir(
        quote! {
            fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
                let i = program_id(0);
                let mut s = x.block([i * BN], [BN]).load();
                let mut t = s;
                let mut untouched = s;
                let u = untouched;
                for r in 0..4 {
                    let mut t = s;
                    t += 1.0;
                    for q in (r..8).step_by(2) {
                        s = s * 0.5 + t;
                    }
                    let t = 3;
                }
                t = t + u;
                out.block([i * BN], [BN]).store(s + t);
            }
        },
        &[],
    );
    // s is carried by both loops; t (outer) is not carried (the body's `t` shadows it)
    assert_eq!(text.matches("loop_carried").count(), 2, "{text}");
    assert!(text.contains("loop_carried L0.0 : f32[BN]  // s"), "{text}");
    assert!(text.contains("loop_carried L1.0 : f32[BN]  // s"), "{text}");
    // the inner loop starts at the outer index and steps by 2
    assert!(text.contains("for L1 in %"), "{text}");
    assert!(text.contains("loop_result L0.0 : f32[BN]  // s"), "{text}");
}

#[test]
fn loops_without_carried_values_and_plain_ranges() {
    let text = ir(
        quote! {
            fn k(x: Tensor<f32, (M, N)>, out: &mut Tensor<f32, (M, N)>) {
                let i = program_id(0);
                for j in (0..N).step_by(BN) {
                    out.block([i * BM, j], [BM, BN]).store(x.block([i * BM, j], [BM, BN]).load() * 2.0);
                }
                for _ in 1..(N / 2 + 1) {
                }
            }
        },
        &[],
    );
    assert!(text.contains("init []"), "{text}");
    assert_eq!(text.matches("yield").count(), 2, "{text}");
}

#[test]
fn loop_errors() {
    let err = |item| check(item).err().unwrap();
    // a different dtype assigned to a carried variable (only for T = f16, bf16)
    let e = err(quote! {
        fn k<T: Float>(x: Tensor<T, (N,)>, out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            let mut acc = zeros::<f32>([BN]);
            for k in 0..4 {
                acc = x.block([i * BN], [BN]).load();
            }
            out.block([i * BN], [BN]).store(acc);
        }
    });
    assert_eq!(
        e,
        "`acc = ..` expects a value of the type of `acc` at the start of the loop, f32[BN], found f16[BN] (with T = f16)"
    );
    // another shape
    let e = err(quote! {
        fn k(x: Tensor<f32, (M, N)>, out: &mut Tensor<f32, (M,)>) {
            let i = program_id(0);
            let mut acc = zeros::<f32>([BM]);
            for k in (0..N).step_by(BN) {
                acc += x.block([i * BM, k], [BM, BN]).load();
            }
            out.block([i * BM], [BM]).store(acc);
        }
    });
    assert!(e.starts_with("shape mismatch in `add`: [BM] vs [BM, BN]"), "{e}");
    let e = err(quote! {
        fn k(x: Tensor<f32, (M, N)>, out: &mut Tensor<f32, (M,)>) {
            let i = program_id(0);
            let mut acc = 0.0;
            for k in (0..N).step_by(BN) {
                acc = x.block([i * BM, k], [BM, BN]).load().sum();
            }
            out.block([i * BM], [BM]).store(acc);
        }
    });
    assert_eq!(e, "`acc = ..` expects a value of the type of `acc` at the start of the loop, f32, found f32[BM]");
    // bounds are i64
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            for k in 0.0..4.0 {
            }
            out.block([i * BN], [BN]).store(1.0);
        }
    });
    assert_eq!(e, "`for` expects an i64 scalar start, found f32");
    // the body's values stay in the body
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            for k in 0..4 {
                let v = 1.0;
            }
            out.block([i * BN], [BN]).store(v);
        }
    });
    assert_eq!(e, "cannot find `v` in this kernel");
    // immutable variables, parameters, the loop variable
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            let s = 0.0;
            for k in 0..4 {
                s += 1.0;
            }
            out.block([i * BN], [BN]).store(s);
        }
    });
    assert!(e.starts_with("cannot assign twice to immutable variable `s`"), "{e}");
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            for k in 0..4 {
                k += 1;
            }
        }
    });
    assert!(e.starts_with("cannot assign twice to immutable variable `k`"), "{e}");
    let e = err(quote! {
        fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>) {
            for k in 0..4 {
                out = x;
            }
        }
    });
    assert!(e.starts_with("cannot assign to the parameter `out`"), "{e}");
    // forms
    for (item, want) in [
        (quote! { fn k() { while true { } } }, "`while` is not supported in a #[kfuse] kernel"),
        (quote! { fn k() { for k in 0..4 { break; } } }, "`break` is not supported in a #[kfuse] kernel"),
        (quote! { fn k() { for k in 0..4 { continue; } } }, "`continue` is not supported"),
        (quote! { fn k() { loop { } } }, "`loop` is not supported"),
        (quote! { fn k(n: i64) { for k in n { } } }, "a #[kfuse] `for` loops over a range of indices"),
        (quote! { fn k() { for k in 0..=4 { } } }, "inclusive ranges are not supported"),
        (quote! { fn k() { for k in 0.. { } } }, "a #[kfuse] loop range needs both ends"),
        (quote! { fn k() { for k in 0..8.step_by(2) { } } }, "`lo..hi.step_by(s)` steps `hi`"),
        (quote! { fn k() { for k in (0..8).rev() { } } }, "`.rev()` is not supported on a loop range"),
        (quote! { fn k() { for mut k in 0..8 { } } }, "the loop variable cannot be `mut`"),
        (quote! { fn k() { for (a, b) in 0..8 { } } }, "the variable of a #[kfuse] `for` is a plain name"),
        (quote! { fn k() { 'outer: for k in 0..8 { } } }, "loop labels are not supported"),
        (quote! { fn k() { let x = for k in 0..8 { }; } }, "a `for` loop is a statement"),
    ] {
        let e = err(item);
        assert!(e.starts_with(want), "{e}");
    }
}

#[test]
fn zeros_and_dot_errors() {
    let err = |item| check(item).err().unwrap();
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(zeros([BN]));
        }
    });
    assert!(e.starts_with("`zeros` takes its dtype as a type argument"), "{e}");
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(zeros::<u8>([BN]));
        }
    });
    assert!(e.starts_with("expected a dtype"), "{e}");
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(zeros::<f32>(BN));
        }
    });
    assert!(e.starts_with("the shape of `zeros` is an array of extents"), "{e}");
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(zeros::<f32>([i]));
        }
    });
    assert!(e.starts_with("`i` is a runtime value; an extent of `zeros` is"), "{e}");
    let e = err(quote! {
        fn k(out: &mut Tensor<f32, (N,)>) {
            let i = program_id(0);
            out.block([i * BN], [BN]).store(exp::<f32>(1.0));
        }
    });
    assert_eq!(e, "`exp` takes no type arguments");
    let e = err(quote! {
        fn k<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<f32, (K, N)>, c: &mut Tensor<f32, (M, N)>) {
            let (i, j) = (program_id(0), program_id(1));
            c.block([i * BM, j * BN], [BM, BN]).store(dot(a.block([i * BM, 0], [BM, BK]).load(), b.block([0, j * BN], [BK, BN]).load()));
        }
    });
    assert_eq!(e, "dtype mismatch in `dot`: f16 vs f32 (with T = f16)");
    let e = err(quote! {
        fn k(a: Tensor<f32, (M, K)>, b: Tensor<f32, (K, N)>, c: &mut Tensor<f32, (M, N)>) {
            let (i, j) = (program_id(0), program_id(1));
            c.block([i * BM, j * BN], [BM, BN]).store(dot(a.block([i * BM, 0], [BM, BK]).load(), b.block([0, j * BN], [BN, BN]).load()));
        }
    });
    assert_eq!(e, "shape mismatch in `dot`: [BM, BK] vs [BN, BN]");
    let e = err(quote! {
        fn k(a: Tensor<f32, (M, K)>, c: &mut Tensor<f32, (M, N)>) {
            let (i, j) = (program_id(0), program_id(1));
            c.block([i * BM, j * BN], [BM, BN]).store(dot(a.block([i * BM, 0], [BM, BK]).load()));
        }
    });
    assert_eq!(e, "`dot` takes 2 arguments, found 1");
    // `dot_tf32` reads f32 operands only, checked for every dtype of the generics
    let e = err(quote! {
        fn k<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, c: &mut Tensor<f32, (M, N)>) {
            let (i, j) = (program_id(0), program_id(1));
            c.block([i * BM, j * BN], [BM, BN]).store(dot_tf32(a.block([i * BM, 0], [BM, BK]).load(), b.block([0, j * BN], [BK, BN]).load()));
        }
    });
    assert!(e.contains("`dot_tf32` expects f32 tiles") && e.contains("found f16"), "{e}");
    let e = err(quote! {
        fn k(a: Tensor<f32, (M, K)>, c: &mut Tensor<f32, (M, N)>) {
            let (i, j) = (program_id(0), program_id(1));
            c.block([i * BM, j * BN], [BM, BN]).store(dot_tf32(a.block([i * BM, 0], [BM, BK]).load()));
        }
    });
    assert_eq!(e, "`dot_tf32` takes 2 arguments, found 1");
}

#[test]
fn dot_tf32_records_its_precision() {
    let text = ir(
        quote! {
            fn gemm(a: Tensor<f32, (M, K)>, b: Tensor<f32, (K, N)>, c: &mut Tensor<f32, (M, N)>) {
                let (i, j) = (program_id(0), program_id(1));
                let mut acc = zeros::<f32>([BM, BN]);
                for k in (0..K).step_by(BK) {
                    acc += dot_tf32(a.block([i * BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
                }
                c.block([i * BM, j * BN], [BM, BN]).store(acc);
            }
        },
        &[],
    );
    assert!(text.contains("= dot_tf32 %") && !text.contains("= dot %"), "{text}");
}

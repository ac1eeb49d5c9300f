//! Loops that are not a `dot` over K: row kernels that walk a row in chunks (a running
//! sum of squares, then a second loop that scales; a single-pass online softmax), a
//! reduction carried across column blocks, nested loops, and a loop whose bound is an
//! `i64` loaded from a tensor (variable lengths).
//!
//! Each kernel runs on the best device there is (the interpreter in CI, the GPU on the
//! GPU host) into NaN-poisoned outputs, against float64 references, with odd shapes and
//! fixed seeds; and each compiles for sm_80 and sm_90a (NVRTC and `ptxas -v`, no spills)
//! on a machine without a GPU.

mod common;

#[path = "kernels/loops.rs"]
mod kernels_loops;
use kernels_loops::*;

use kfuse::codegen::Target;
use kfuse::prelude::*;
use kfuse::DType;

fn dev() -> Device {
    Device::best()
}

fn check(name: &str, got: &[f64], want: &[f64], tol: f64) {
    let e = common::rel_err(got, want);
    assert!(e <= tol, "{name} on {}: relative error {e:.3e} > {tol:.1e}", dev().describe());
}

const SHAPES: [(usize, usize); 5] = [(1, 1), (3, 17), (5, 1000), (2, 4097), (7, 300)];

#[test]
fn rms_in_two_loops_over_chunks() {
    for dt in common::DTYPES {
        for (s, &(m, n)) in SHAPES.iter().enumerate() {
            let (x, xv) = common::random_tensor(&[m, n], dt, 100 + s as u64, 0.0, &dev());
            let mut out = common::poisoned(&[m, n], dt, &dev());
            rms_chunked(&x, &mut out, 1e-5).unwrap();
            let want: Vec<f64> = xv
                .chunks(n)
                .flat_map(|r| {
                    let rs = 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / n as f64 + 1e-5).sqrt();
                    r.iter().map(move |v| v * rs)
                })
                .collect();
            check(&format!("rms_chunked {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, common::tolerance(dt));
        }
    }
}

#[test]
fn online_softmax_over_chunks() {
    for dt in common::DTYPES {
        for (s, &(m, n)) in SHAPES.iter().enumerate() {
            let (x, xv) = common::random_tensor(&[m, n], dt, 200 + s as u64, 0.0, &dev());
            let mut out = common::poisoned(&[m, n], dt, &dev());
            online_softmax(&x, &mut out).unwrap();
            let want: Vec<f64> = xv
                .chunks(n)
                .flat_map(|r| {
                    let mx = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = r.iter().map(|v| (v - mx).exp()).sum();
                    r.iter().map(move |v| (v - mx).exp() / z)
                })
                .collect();
            check(&format!("online_softmax {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, common::tolerance(dt));
        }
    }
}

#[test]
fn a_tile_carried_across_column_blocks() {
    for dt in common::DTYPES {
        for (s, &(m, n)) in SHAPES.iter().enumerate() {
            let (x, xv) = common::random_tensor(&[m, n], dt, 300 + s as u64, 0.0, &dev());
            let want: Vec<f64> = xv.chunks(n).map(|r| r.iter().map(|v| v * v).sum()).collect();
            let mut out = common::poisoned(&[m], DType::F32, &dev());
            row_sumsq_blocks(&x, &mut out).unwrap();
            check(&format!("row_sumsq_blocks {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, 1e-5);
            let mut out = common::poisoned(&[m], DType::F32, &dev());
            row_sumsq_whole_blocks(&x, &mut out).unwrap();
            check(&format!("row_sumsq_whole_blocks {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, 1e-5);
        }
    }
}

/// A loop that steps by its tile's extent from 0 to `N / BN · BN` reads whole tiles: its
/// load has no remaining-extent bound along the columns (`analysis::whole_steps`); the
/// loop over the columns left, and a loop up to `N` itself, keep theirs.
#[test]
fn whole_column_blocks_drop_their_bounds() {
    for (def, whole) in [(&row_sumsq_whole_blocks::DEF, true), (&row_sumsq_blocks::DEF, false)] {
        let k = (def.build)(&[DType::BF16]).unwrap();
        let mut spec = common::snapshot_spec(def);
        spec.shape_pow2 = vec![4096, 4096];
        for target in [Target::sm80(), Target::sm90a()] {
            let src = kfuse::codegen::compile(&k, &spec, &target).unwrap().source;
            assert_eq!(!src.contains("n_N - kf_i0"), whole, "{} {}: the first loop's bound\n{src}", def.name, target.arch());
            if whole {
                assert!(src.contains("n_N - kf_i1"), "{} {}: the loop over the columns left lost its bound\n{src}", def.name, target.arch());
            }
        }
    }
}

#[test]
fn nested_loops_over_batch_and_k() {
    for dt in common::DTYPES {
        for (s, &(b, m, k)) in [(1, 1, 1), (3, 7, 33), (2, 130, 257)].iter().enumerate() {
            let (x, xv) = common::random_tensor(&[b, m, k], dt, 400 + s as u64, 0.5, &dev());
            let mut out = common::poisoned(&[m], DType::F32, &dev());
            batch_k_sums(&x, &mut out).unwrap();
            let want: Vec<f64> = (0..m).map(|i| (0..b).map(|bb| xv[(bb * m + i) * k..(bb * m + i + 1) * k].iter().sum::<f64>()).sum()).collect();
            check(&format!("batch_k_sums {dt} {b}x{m}x{k}"), &out.to_vec_f64().unwrap(), &want, 1e-5);
        }
    }
}

#[test]
fn a_loop_bound_loaded_from_a_tensor() {
    for dt in common::DTYPES {
        let (m, n) = (6, 1000);
        let (x, xv) = common::random_tensor(&[m, n], dt, 500, 0.5, &dev());
        let lens: Vec<f64> = vec![0.0, 1.0, 17.0, 999.0, 1000.0, 513.0];
        let len = Tensor::from_f64(&lens, &[m], DType::I64, &dev()).unwrap();
        let mut out = common::poisoned(&[m], DType::F32, &dev());
        prefix_sums(&x, &len, &mut out).unwrap();
        let want: Vec<f64> = (0..m).map(|r| xv[r * n..r * n + lens[r] as usize].iter().sum()).collect();
        check(&format!("prefix_sums {dt}"), &out.to_vec_f64().unwrap(), &want, 1e-5);
    }
}

/// A loop with one `dot` of two tile loads that is not the matrix path's form runs
/// right (on sm_90a: warp-specialized rings without turns), odd shapes.
#[test]
fn a_scaled_product_in_a_loop() {
    for dt in common::DTYPES {
        for (s, &(m, k, n)) in [(1, 1, 1), (130, 200, 129), (257, 33, 70)].iter().enumerate() {
            let (a, av) = common::random_tensor(&[m, k], dt, 600 + s as u64, 0.5, &dev());
            let (b, bv) = common::random_tensor(&[k, n], dt, 700 + s as u64, 0.5, &dev());
            let mut out = common::poisoned(&[m, n], DType::F32, &dev());
            scaled_products(&a, &b, &mut out, 0.75).unwrap();
            let want: Vec<f64> = (0..m * n).map(|x| 0.75 * (0..k).map(|kk| av[(x / n) * k + kk] * bv[kk * n + x % n]).sum::<f64>()).collect();
            check(&format!("scaled_products {dt} {m}x{k}x{n}"), &out.to_vec_f64().unwrap(), &want, 1e-4);
        }
    }
}

/// A product whose loop offsets are computed in its body (`t * BK`), odd shapes; on
/// sm_90a (the GPU build) its operands come through rings that compute the next offset
/// ahead (checked on the CUDA below).
#[test]
fn a_product_walked_by_tile_count() {
    for dt in [DType::BF16, DType::F16] {
        for (s, &(m, k, n)) in [(1, 1, 1), (130, 200, 129), (257, 333, 70)].iter().enumerate() {
            let (a, av) = common::random_tensor(&[m, k], dt, 800 + s as u64, 0.5, &dev());
            let (b, bv) = common::random_tensor(&[k, n], dt, 900 + s as u64, 0.5, &dev());
            let mut out = common::poisoned(&[m, n], DType::F32, &dev());
            products_by_tile_count(&a, &b, &mut out).unwrap();
            let want: Vec<f64> = (0..m * n).map(|x| (0..k).map(|kk| av[(x / n) * k + kk] * bv[kk * n + x % n]).sum::<f64>()).collect();
            check(&format!("products_by_tile_count {dt} {m}x{k}x{n}"), &out.to_vec_f64().unwrap(), &want, 1e-4);
        }
    }
    let k = (products_by_tile_count::DEF.build)(&[DType::BF16]).unwrap();
    let mut spec = common::snapshot_spec(&products_by_tile_count::DEF);
    spec.shape_pow2 = vec![4096, 4096, 4096];
    let e = kfuse::codegen::compile(&k, &spec, &Target::sm90a()).unwrap();
    // the ring's stage step at the end of the body (its helpers are in every WGMMA
    // kernel's prelude; the step is only where a ring is)
    assert!(e.source.contains("if (++kf_st0 == "), "no ring:\n{}", e.source);
}

/// On sm_90a the plan of that loop says a producer warpgroup fills its rings, and that
/// no turns are taken (one dot a loop).
#[test]
fn a_scaled_product_in_a_loop_is_warp_specialized_on_sm90a() {
    let k = (scaled_products::DEF.build)(&[DType::BF16]).unwrap();
    let mut spec = common::snapshot_spec(&scaled_products::DEF);
    spec.shape_pow2 = vec![4096, 4096, 4096];
    let e = kfuse::codegen::compile(&k, &spec, &Target::sm90a()).unwrap();
    let plan = e.plan.to_string();
    assert!(plan.contains("rings filled by a producer warpgroup") && !plan.contains("take turns"), "{plan}");
}

/// Every kernel above compiles for sm_80 and sm_90a: NVRTC, then `ptxas -v` with no
/// spills, as the runtime builds them.
#[test]
fn every_loop_kernel_compiles_for_sm80_and_sm90a() {
    let failures = common::compile_for_both_targets(&[
        (&rms_chunked::DEF, true),
        (&online_softmax::DEF, true),
        (&row_sumsq_blocks::DEF, true),
        (&row_sumsq_whole_blocks::DEF, true),
        (&batch_k_sums::DEF, true),
        (&prefix_sums::DEF, true),
        (&scaled_products::DEF, true),
        (&products_by_tile_count::DEF, true),
    ]);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The scheduled IR (each value's layout, the converts the passes inserted) and the CUDA
/// of the loop kernels, bf16 on sm_90a: a snapshot changes only when the compiler's
/// output does.
#[test]
fn loop_kernel_snapshots() {
    let defs: [&kfuse::ir::KernelDef; 3] = [&rms_chunked::DEF, &online_softmax::DEF, &batch_k_sums::DEF];
    for def in defs {
        let k = (def.build)(&[DType::BF16]).unwrap();
        let e = kfuse::codegen::compile(&k, &common::snapshot_spec(def), &Target::sm90a()).unwrap();
        insta::assert_snapshot!(format!("{}_bf16_sm90a_ir", def.name), e.ir);
        insta::assert_snapshot!(format!("{}_bf16_sm90a", def.name), e.source);
    }
}

/// A row reduced inside a loop is not cut across a cluster, whose reduction slots and
/// barriers serve one use, not one an iteration: a row too long for one block is walked
/// in chunks instead, on sm_90a too (`chunk_rows`: a loop over chunks inside the loop); a
/// row a block holds stays whole.
#[test]
fn a_long_row_reduced_inside_a_loop_is_walked_in_chunks() {
    let k = (long_row_sums::DEF.build)(&[DType::BF16]).unwrap();
    let mut spec = common::snapshot_spec(&long_row_sums::DEF);
    spec.shape_pow2 = vec![4, 1024, 131072]; // R, M, N
    for t in [Target::sm90a(), Target::sm80()] {
        let e = kfuse::codegen::compile(&k, &spec, &t).unwrap();
        assert_eq!(e.cluster_x, 1);
        assert!(e.ir.contains("row N of 131072 elements walked in chunks of 16384, 1 pass"), "{}", e.ir);
    }
    spec.shape_pow2 = vec![4, 1024, 4096];
    let e = kfuse::codegen::compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(!e.ir.contains("walked in chunks"), "{}", e.ir);
}

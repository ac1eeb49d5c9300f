//! Masks and per-row values as attention kernels write them: `iota(E).unsqueeze(k)`
//! compared across a tile (a causal mask), a per-row value `.unsqueeze(1)` broadcast
//! against its tile, and `f32::NEG_INFINITY` for the masked lanes; and stores masked by
//! `store_where` (an `iota` triangle, lengths loaded from an `i64` tensor).
//!
//! Each kernel runs on the best device there is (the interpreter in CI, the GPU on the
//! GPU host) into NaN-poisoned outputs against float64, with odd shapes and fixed seeds;
//! and each compiles for sm_80 and sm_90a (NVRTC and `ptxas -v`, no spills) without a
//! GPU.

mod common;

#[path = "kernels/masks.rs"]
mod kernels_masks;
use kernels_masks::*;

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

#[test]
fn causal_softmax_of_rows() {
    for dt in common::DTYPES {
        for (s, &(m, n)) in [(1, 1), (7, 5), (33, 100), (130, 257)].iter().enumerate() {
            let (x, xv) = common::random_tensor(&[m, n], dt, 600 + s as u64, 0.0, &dev());
            let mut out = common::poisoned(&[m, n], dt, &dev());
            causal_softmax(&x, &mut out).unwrap();
            let mut want = vec![0.0; m * n];
            for r in 0..m {
                let row = &xv[r * n..(r + 1) * n];
                let live = (r + 1).min(n);
                let mx = row[..live].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = row[..live].iter().map(|v| (v - mx).exp()).sum();
                for c in 0..live {
                    want[r * n + c] = (row[c] - mx).exp() / z;
                }
            }
            check(&format!("causal_softmax {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, common::tolerance(dt));
        }
    }
}

#[test]
fn row_and_column_positions() {
    for dt in common::DTYPES {
        for (s, &(m, n)) in [(1, 1), (7, 5), (33, 100), (130, 257)].iter().enumerate() {
            let (x, xv) = common::random_tensor(&[m, n], dt, 700 + s as u64, 0.5, &dev());
            let mut out = common::poisoned(&[m, n], dt, &dev());
            position_scale(&x, &mut out).unwrap();
            let want: Vec<f64> = (0..m * n).map(|e| xv[e] * ((e / n) + 1) as f64 + (e % n) as f64).collect();
            check(&format!("position_scale {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, common::tolerance(dt));
        }
    }
}

/// `store_where` writes only where its mask holds: a triangle of a tile (masks from
/// `iota`), and rows cut at lengths loaded from an `i64` tensor; the other elements keep
/// the random values `out` held before.
#[test]
fn masked_stores_keep_the_rest() {
    for dt in common::DTYPES {
        for (s, &(m, n)) in [(1, 1), (7, 5), (33, 100), (130, 257)].iter().enumerate() {
            let (x, xv) = common::random_tensor(&[m, n], dt, 800 + s as u64, 0.0, &dev());
            let (mut out, before) = common::random_tensor(&[m, n], dt, 850 + s as u64, 0.0, &dev());
            lower_triangle(&x, &mut out).unwrap();
            let want: Vec<f64> = (0..m * n).map(|e| if e % n <= e / n { 2.0 * xv[e] } else { before[e] }).collect();
            check(&format!("lower_triangle {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, common::tolerance(dt));
            let lens: Vec<f64> = (0..m).map(|r| ((r * 37 + s * 11) % (n + 2)) as f64).collect();
            let len = Tensor::from_f64(&lens, &[m], DType::I64, &dev()).unwrap();
            let (mut out, before) = common::random_tensor(&[m, n], dt, 870 + s as u64, 0.0, &dev());
            prefix_rows(&x, &len, &mut out).unwrap();
            let want: Vec<f64> = (0..m * n).map(|e| if ((e % n) as f64) < lens[e / n] { dt.round(xv[e] + 1.0) } else { before[e] }).collect();
            check(&format!("prefix_rows {dt} {m}x{n}"), &out.to_vec_f64().unwrap(), &want, common::tolerance(dt));
        }
    }
}

/// Both kernels compile for sm_80 and sm_90a: NVRTC, then `ptxas -v`; the causal
/// softmax (the shape of attention's masking) with no spills. (`position_scale` in f16 on
/// sm_80 gets 4 bytes of spill stores at 40 registers from ptxas with no register cap:
/// printed, not failed, as it is no hot kernel.)
#[test]
fn mask_kernels_compile_for_sm80_and_sm90a() {
    let failures = common::compile_for_both_targets(&[(&causal_softmax::DEF, true), (&position_scale::DEF, false), (&lower_triangle::DEF, true), (&prefix_rows::DEF, true)]);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The scheduled IR of both kernels, bf16 on sm_90a: the iotas are made in the slice of
/// the tile layout they meet (no conversion through shared memory).
#[test]
fn mask_kernel_snapshots() {
    let defs: [&kfuse::ir::KernelDef; 4] = [&causal_softmax::DEF, &position_scale::DEF, &lower_triangle::DEF, &prefix_rows::DEF];
    for def in defs {
        let k = (def.build)(&[DType::BF16]).unwrap();
        let e = kfuse::codegen::compile(&k, &common::snapshot_spec(def), &Target::sm90a()).unwrap();
        // (a `store_where` mask computed from `iota`s alone still meets the value's
        // layout through a conversion)
        if def.name != "lower_triangle" && def.name != "prefix_rows" {
            assert!(!e.ir.contains("= convert"), "{}: a conversion is left:\n{}", def.name, e.ir);
        }
        insta::assert_snapshot!(format!("{}_bf16_sm90a_ir", def.name), e.ir);
    }
}


//! Kernels a user writes, beyond `kfuse::ops`: reductions along either axis, full-row
//! tiles, keep-dim broadcasting, mixed output dtypes. They run on the best device
//! there is (the interpreter in CI, the GPU on the GPU host) against float64.

mod common;

#[path = "kernels/user_kernels.rs"]
mod kernels_user_kernels;
use kernels_user_kernels::*;

use kfuse::prelude::*;
use kfuse::DType;

fn dev() -> Device {
    Device::best()
}

fn rows(v: &[f64], n: usize) -> Vec<&[f64]> {
    v.chunks(n).collect()
}

fn check(name: &str, dt: DType, shape: (usize, usize), got: &[f64], want: Vec<f64>, tol: f64) {
    let want: Vec<f64> = want.into_iter().collect();
    let e = common::rel_err(got, &want);
    assert!(e <= tol, "{name} {dt} {shape:?}: relative error {e:.3e} > {tol:.1e}");
}

#[test]
fn softmax_of_rows() {
    for dt in common::DTYPES {
        for &(m, n) in &[(1, 1), (7, 3), (3, 1000), (2, 4097), (2, 100_003), (1, 262_144)] {
            let (x, xv) = common::random_tensor(&[m, n], dt, (m * n) as u64, 0.0, &dev());
            let mut out = common::poisoned(&[m, n], dt, &dev());
            softmax_rows(&x, &mut out).unwrap();
            let mut want = Vec::new();
            for r in rows(&xv, n) {
                let mx = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = r.iter().map(|v| (v - mx).exp()).sum();
                want.extend(r.iter().map(|v| (v - mx).exp() / s));
            }
            // f16 softmax of very long rows lands in f16's subnormal range (1/n < 6.1e-5),
            // where fewer mantissa bits remain: bf16's bound there
            let tol = if dt == DType::F16 && n > 16_384 { common::tolerance(DType::BF16) } else { common::tolerance(dt) };
            check("softmax_rows", dt, (m, n), &out.to_vec_f64().unwrap(), want, tol);
        }
    }
}

#[test]
fn centering_rows_with_keepdim() {
    for dt in common::DTYPES {
        for &(m, n) in &[(5, 3), (37, 1000), (1, 2049), (3, 131_072)] {
            let (x, xv) = common::random_tensor(&[m, n], dt, 11 + m as u64, 0.0, &dev());
            let mut out = common::poisoned(&[m, n], dt, &dev());
            center_rows(&x, &mut out).unwrap();
            let mut want = Vec::new();
            for r in rows(&xv, n) {
                let mean = r.iter().sum::<f64>() / n as f64;
                want.extend(r.iter().map(|v| v - mean));
            }
            check("center_rows", dt, (m, n), &out.to_vec_f64().unwrap(), want, 4.0 * common::tolerance(dt));
        }
    }
}

#[test]
fn column_sums() {
    for dt in common::DTYPES {
        for &(m, n) in &[(1, 7), (37, 1000), (300, 33)] {
            let (x, xv) = common::random_tensor(&[m, n], dt, 23 + n as u64, 0.0, &dev());
            let mut out = common::poisoned(&[n], DType::F32, &dev());
            col_sums(&x, &mut out).unwrap();
            let want: Vec<f64> = (0..n).map(|j| (0..m).map(|i| xv[i * n + j]).sum()).collect();
            check("col_sums", dt, (m, n), &out.to_vec_f64().unwrap(), want, 1e-5);
        }
    }
}

#[test]
fn row_ranges() {
    for dt in common::DTYPES {
        for &(m, n) in &[(1, 1), (9, 5), (130, 517)] {
            let (x, xv) = common::random_tensor(&[m, n], dt, 31 + m as u64, 0.0, &dev());
            let mut out = common::poisoned(&[m], dt, &dev());
            row_range(&x, &mut out).unwrap();
            let want: Vec<f64> = rows(&xv, n)
                .iter()
                .map(|r| {
                    let mx = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let mn = r.iter().cloned().fold(f64::INFINITY, f64::min);
                    dt.round(mx - mn)
                })
                .collect();
            check("row_range", dt, (m, n), &out.to_vec_f64().unwrap(), want, 0.0);
        }
    }
}

/// Rows too long for one block are cut across a thread-block cluster on sm_90a; the
/// kernel compiles and assembles without spills. sm_80, without clusters, walks the row
/// in chunks (`chunk_rows`): three passes of 16384-element chunks, no spills either.
#[test]
fn long_rows_use_a_cluster_or_chunks() {
    use kfuse::codegen::{compile, Spec, Target, TensorSpec};
    let k = softmax_rows::build(&[DType::BF16]).unwrap();
    let t = || Some(TensorSpec { ptr_align: 16, stride_div: vec![16, 0] });
    let spec = Spec { tensors: vec![t(), t()], shape_pow2: vec![256, 262_144], shape_div: vec![], tiles: Default::default(), threads: None, min_blocks: None, grouped: false, register_attempt: 0, ..Spec::default() };
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(e.source.contains("__cluster_dims__(8, 1, 1)"), "{}", e.ir);
    assert!(e.source.contains("mapa.shared::cluster"));
    assert_eq!(e.cluster_x, 8);
    assert!(e.ir.contains("split over 8 blocks along x"), "{}", e.ir);
    let (regs, spill) = common::assemble(&e.source, &e.arch, &e.options, "softmax_rows_cluster").unwrap();
    assert!(regs > 0 && spill == 0, "{regs} registers, {spill} bytes of spills");
    let e80 = compile(&k, &spec, &Target::sm80()).unwrap();
    assert_eq!(e80.cluster_x, 1);
    assert!(e80.ir.contains("row N of 262144 elements walked in chunks of 16384, 3 passes"), "{}", e80.ir);
    let (regs, spill) = common::assemble(&e80.source, &e80.arch, &e80.options, "softmax_rows_chunks").unwrap();
    assert!(regs > 0 && spill == 0, "sm_80: {regs} registers, {spill} bytes of spills");
    // a row padded to 2^19 (N = 262147) still compiles: 1024-thread blocks of 64
    // elements each (it spills — a cluster of 16 would halve that; NOTES.md)
    let spec = Spec { shape_pow2: vec![2, 524_288], ..spec };
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    assert_eq!((e.cluster_x, e.block_threads), (8, 1024));
}

/// The tests above with rows too long for one block, on the sm_80 path
/// (`KFUSE_TARGET=sm_80`, on any GPU): rows walked in chunks (`chunk_rows`) where sm_90a
/// takes a cluster. Each in a child process of its own, where the variable is set.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn long_rows_on_the_sm80_path_on_the_gpu() {
    common::gpu();
    for name in ["softmax_of_rows", "centering_rows_with_keepdim", "weighted_rms_rows"] {
        common::isolation::run_alone(name, &[("KFUSE_TARGET", Some(std::ffi::OsStr::new("sm_80")))]);
    }
}

#[test]
fn weighted_rms_rows() {
    for dt in common::DTYPES {
        for &(m, n) in &[(1, 1), (7, 1000), (65, 3), (2, 131_072)] {
            let (x, xv) = common::random_tensor(&[m, n], dt, 41 + n as u64, 0.0, &dev());
            let (w, wv) = common::random_tensor(&[n], dt, 43, 0.0, &dev());
            let mut out = common::poisoned(&[m, n], dt, &dev());
            weighted_rms(&x, &w, &mut out).unwrap();
            let mut want = Vec::new();
            for r in rows(&xv, n) {
                let ms = r.iter().map(|v| v * v).sum::<f64>() / n as f64;
                let s = 1.0 / (ms + 1e-6).sqrt();
                want.extend(r.iter().zip(&wv).map(|(v, w)| v * s * w));
            }
            check("weighted_rms", dt, (m, n), &out.to_vec_f64().unwrap(), want, common::tolerance(dt));
        }
    }
}

/// The weight vector is loaded straight into the layout its broadcast needs: no
/// conversion through shared memory, at any row length.
#[test]
fn weight_broadcast_needs_no_conversion() {
    use kfuse::codegen::{compile, Spec, Target, TensorSpec};
    let k = weighted_rms::build(&[DType::BF16]).unwrap();
    let t = |r: usize| Some(TensorSpec { ptr_align: 16, stride_div: if r == 2 { vec![16, 0] } else { vec![0] } });
    for n in [1024u32, 262_144] {
        let spec = Spec { tensors: vec![t(2), t(1), t(2)], shape_pow2: vec![4096, n], shape_div: vec![], tiles: Default::default(), threads: None, min_blocks: None, grouped: false, register_attempt: 0, ..Spec::default() };
        let e = compile(&k, &spec, &Target::sm90a()).unwrap();
        assert!(!e.ir.contains("= convert"), "{}", e.ir);
        assert!(!e.source.contains("kf_cv"), "no shared-memory conversion");
    }
}


//! Every op on the GPU against a float64 reference: random inputs, odd shapes, outputs
//! poisoned with NaN first. GPU-only: ignored (counted as skipped) unless built with
//! `--cfg kfuse_gpu` (`scripts/gpu-build.sh`), then failed where no GPU is found.

mod common;

use kfuse::{Backend, DType, Device};

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn every_op_on_the_gpu() {
    let dev = common::gpu();
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for (i, case) in common::ops().iter().enumerate() {
        if !case.numeric() {
            continue; // numerics in tests/rows.rs
        }
        for dt in common::DTYPES {
            let mut worst: f64 = 0.0;
            for (j, shape) in common::shapes(case, true).iter().enumerate() {
                match common::check_op(case, dt, shape, &dev, (1000 + i * 100 + j) as u64) {
                    Ok(e) => worst = worst.max(e),
                    Err(e) => failures.push(e),
                }
            }
            rows.push(format!("{:10} {:5} max rel err {worst:.2e}", case.name, dt.to_string()));
        }
    }
    println!("{}", rows.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn gpu_launch_reports_the_gpu_backend() {
    let dev = common::gpu();
    let (a, _) = common::random_tensor(&[1000], DType::BF16, 1, 0.0, &dev);
    let (b, _) = common::random_tensor(&[1000], DType::BF16, 2, 0.0, &dev);
    let mut out = common::poisoned(&[1000], DType::BF16, &dev);
    let l = kfuse::ops::kernels::add(&a, &b, &mut out).unwrap();
    assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn gpu_and_cpu_tensors_do_not_mix() {
    let dev = common::gpu();
    let (a, _) = common::random_tensor(&[10], DType::F32, 1, 0.0, &dev);
    let (b, _) = common::random_tensor(&[10], DType::F32, 2, 0.0, &Device::cpu());
    let err = kfuse::ops::add(&a, &b).unwrap_err();
    assert!(matches!(err, kfuse::Error::DeviceMismatch { .. }), "{err}");
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn misaligned_views_are_still_right() {
    // a view starting one element in: not 16-byte aligned, so no vector accesses
    let dev = common::gpu();
    let (x, xv) = common::random_tensor(&[1001], DType::BF16, 5, 0.0, &dev);
    let v = x.narrow(0, 1, 1000).unwrap();
    let y = kfuse::ops::copy(&v).unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), xv[1..].to_vec());
}

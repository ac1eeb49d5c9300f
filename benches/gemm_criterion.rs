//! GEMM under criterion (issue 4): `kfuse::ops::gemm` beside cuBLAS (`cublasGemmEx`) and
//! cuBLASLt (`cublasLtMatmul`, heuristic algorithm) on the shapes of the issue's bars —
//! bf16 4096³, 8192³, M8192 N14336 K4096, M8192 N4096 K14336, M16384 N4096 K4096, 2048³,
//! M127 N4096 K4096, M4095 N4097 K4096, and f16 4096³ — one criterion group per shape
//! (`gemm_bf16_M4096_N4096_K4096`, …), with the functions `kfuse`, `cublas` and
//! `cublaslt`. `benches/gemm.rs` prints the same comparison as the table of
//! `BENCHMARKS.md`; this one gives criterion's statistics and its baselines
//! (`--save-baseline` / `--baseline`) for comparing builds.
//!
//! ```sh
//! cargo bench --bench gemm_criterion                      # all of it (a few minutes on an H100)
//! cargo bench --bench gemm_criterion -- M127              # criterion's filter: a regex over group/function
//! .gpu/bin/gemm_criterion --bench [FILTER]                # the binary scripts/gpu-build.sh collects
//! ```
//!
//! The throughput is 2·M·N·K "elements" per call: criterion's `Gelem/s` are GFLOP/s
//! (÷ 1000: TFLOP/s).
//!
//! Timing: `Bencher::iter_custom` — `iters` calls issued back to back on the device's
//! stream between two CUDA events (the stream drained before the first), so a sample is
//! the GPU's time for the whole burst, host launch gaps included where the host is the
//! slower side. Several input sets are rotated when one is small next to L2 (as in
//! `benches/gemm.rs`). Before a function is measured its first call compiles the kernel
//! (and fills the module cache) and its output is checked: against float64 on sampled
//! elements, and kfuse's whole output against cuBLAS's; a kfuse GEMM that is refused,
//! panics or is wrong stops the run with a message (it has no time to report). Sample
//! size 10, 0.5 s warm-up, 2 s measurement per function; `--sample-size`,
//! `--warm-up-time` and `--measurement-time` override them. Without a GPU the benchmark
//! says so and exits.

mod common;

use common::gemm::{first_line, kfuse_gemm, panic_message, rel_err, sampled_err, tolerance, Case, Inputs, CASES};
use criterion::{Criterion, Throughput};
use kfuse::runtime::vendor::{Blas, Library, Math};
use kfuse::{DType, Device, Tensor};
use std::time::Duration;

/// A case's inputs, made when the first of its functions is measured (a filter that
/// leaves the shape out costs nothing), and cuBLAS's output of the first set.
struct Prepared {
    inputs: Inputs,
    reference: Option<Tensor>,
}

fn prepare(c: &Case, dev: &Device, blas: Option<&Blas>) -> Prepared {
    let inputs = Inputs::new(c, dev).unwrap_or_else(|e| panic!("{}: allocating the inputs failed: {}", c.id(), first_line(e)));
    let reference = blas.map(|blas| {
        let mut r = Tensor::empty(&[c.m, c.n], c.dtype, dev).expect("allocating the reference");
        blas.gemm_into(&inputs.a[0], &inputs.b[0], &mut r, Library::Cublas, c.math)
            .unwrap_or_else(|e| panic!("{}: cuBLAS failed: {}", c.id(), first_line(e)));
        r
    });
    Prepared { inputs, reference }
}

/// Panics unless `out` (of the first input set) is within the dtype's tolerance of
/// float64 on sampled elements and, with `whole`, of cuBLAS's output (where there is
/// one) as a whole.
fn check(c: &Case, who: &str, p: &Prepared, out: &Tensor, whole: bool) {
    let tol = tolerance(c.dtype, c.math);
    let e = sampled_err(c, &p.inputs, out).unwrap_or_else(|e| panic!("{}: reading {who}'s output failed: {}", c.id(), first_line(e)));
    assert!(e <= tol, "{}: WRONG RESULT: {who} is {e:.2e} off float64 on sampled elements (tolerance {tol:.0e})", c.id());
    if let Some(r) = p.reference.as_ref().filter(|_| whole) {
        let e = rel_err(out, r).unwrap_or_else(|e| panic!("{}: reading {who}'s output failed: {}", c.id(), first_line(e)));
        assert!(e <= tol, "{}: WRONG RESULT: {who} differs from cuBLAS by {e:.2e} (tolerance {tol:.0e})", c.id());
    }
}

/// The GPU time of `iters` calls of `f` (given the input set to use), issued back to
/// back between two CUDA events.
fn gpu_time(dev: &Device, iters: u64, sets: usize, mut f: impl FnMut(usize) -> kfuse::Result<()>) -> Duration {
    let mut s = 0;
    let ms = dev
        .time_ms(0, 1, || {
            for _ in 0..iters {
                f(s % sets)?;
                s += 1;
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("timing on the GPU failed: {}", first_line(e)));
    Duration::from_secs_f64(ms[0] as f64 / 1e3)
}

fn main() {
    let Some(dev) = common::gpu() else { return; };
    let blas = match Blas::new(&dev) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("cuBLAS unavailable ({}): only kfuse is measured, checked against float64", first_line(e));
            None
        }
    };
    eprintln!("device: {}", dev.describe());
    let mut crit = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();

    // the issue's bars: bf16 and f16 (f32 and TF32 are in benches/gemm.rs's table)
    // (f16 at 4096³ only: the table bench has the other f16 shapes)
    for c in CASES.iter().filter(|c| c.math == Math::Fp32 && (c.dtype == DType::BF16 || (c.dtype == DType::F16 && c.m == 4096 && c.n == 4096))) {
        let mut prepared: Option<Prepared> = None;
        let mut group = crit.benchmark_group(format!("gemm_{}", c.id()));
        group.throughput(Throughput::Elements(2 * (c.m * c.n * c.k) as u64));

        let mut kfuse_checked = false;
        group.bench_function("kfuse", |bch| {
            let p = prepared.get_or_insert_with(|| prepare(c, &dev, blas.as_ref()));
            if !kfuse_checked {
                // the first call compiles (or is refused, or panics); then checked
                let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kfuse_gemm(&p.inputs.a[0], &p.inputs.b[0], c.math)));
                match first {
                    Err(e) => panic!("{}: kfuse panicked: {}", c.id(), first_line(panic_message(&*e))),
                    Ok(None) => unreachable!("kfuse has a GEMM for every case measured here"),
                    Ok(Some(Err(e))) => panic!("{}: kfuse refused the GEMM: {}", c.id(), first_line(e)),
                    Ok(Some(Ok(out))) => check(c, "kfuse", p, &out, true),
                }
                kfuse_checked = true;
            }
            let Inputs { a, b, .. } = &p.inputs;
            bch.iter_custom(|iters| gpu_time(&dev, iters, a.len(), |s| kfuse_gemm(&a[s], &b[s], c.math).expect("a kfuse GEMM").map(drop)));
        });

        if let Some(blas) = &blas {
            for (name, lib) in [("cublas", Library::Cublas), ("cublaslt", Library::CublasLt)] {
                let mut checked = false;
                group.bench_function(name, |bch| {
                    let p = prepared.get_or_insert_with(|| prepare(c, &dev, Some(blas)));
                    if !checked {
                        let Inputs { a, b, outs, .. } = &mut p.inputs;
                        blas.gemm_into(&a[0], &b[0], &mut outs[0], lib, c.math)
                            .unwrap_or_else(|e| panic!("{}: {lib:?} failed: {}", c.id(), first_line(e)));
                        // cuBLAS is the reference itself: checked against float64 only
                        check(c, name, p, &p.inputs.outs[0], lib == Library::CublasLt);
                        checked = true;
                    }
                    let sets = p.inputs.sets();
                    let Inputs { a, b, outs, .. } = &mut p.inputs;
                    bch.iter_custom(|iters| gpu_time(&dev, iters, sets, |s| blas.gemm_into(&a[s], &b[s], &mut outs[s], lib, c.math)));
                });
            }
        }
        group.finish();
    }
    crit.final_summary();
}

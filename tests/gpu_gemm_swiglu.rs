//! The SwiGLU projection pair `silu(x · wg) ⊙ (x · wu)` on the GPU (sm_90a: one WGMMA
//! kernel, two accumulators in one loop sharing the `x` tile) against a float64
//! reference: `kfuse::ops::swiglu_gemm` on bf16 and f16, odd and 4096-class shapes,
//! weights row-major and as transposes of `[N, K]` tensors, and the raw kernel
//! launched into a NaN-poisoned output; and a user kernel of three products with two A
//! tiles (`common::gemm::three_products`). Bounds on ‖out − ref‖/‖ref‖: 1e-2 for bf16,
//! 5e-3 for f16 (f32 accumulation, one rounding; the activation in f32). Large shapes
//! are checked on a sample of rows. Compiled for sm_80 (`KFUSE_TARGET=sm_80`) the op
//! runs two GEMMs and the elementwise `swiglu` instead, to the same bounds. GPU-only:
//! ignored (counted as skipped) unless built with `--cfg kfuse_gpu`
//! (`scripts/gpu-build.sh`), then failed where no GPU is found.

mod common;

use common::gemm::{operand, reference_rows, rows_of, sample_rows, three_products, within, Outcomes};

use kfuse::{Backend, DType, Device};

fn tol(dt: DType) -> f64 {
    if dt == DType::F16 {
        5e-3
    } else {
        1e-2
    }
}

/// Rows `rows` of `silu(x·wg) ⊙ (x·wu)` in float64.
fn reference(xv: &[f64], gv: &[f64], uv: &[f64], k: usize, n: usize, rows: &[usize]) -> Vec<f64> {
    let g = reference_rows(xv, gv, k, n, rows);
    let u = reference_rows(xv, uv, k, n, rows);
    g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect()
}

fn check(m: usize, n: usize, k: usize, dt: DType, wt: bool, dev: &Device, seed: u64) -> Result<f64, String> {
    let what = format!("swiglu_gemm {m}x{n}x{k} {dt} weights_transposed={wt}");
    // x in ±3/8 (an exact power-of-two scaling): with ±3 a product of two K = 1000
    // sums reaches 2e5, past f16's largest finite value, and rounds to inf correctly
    let (_, xv) = operand(m, k, dt, seed, false, dev);
    let xv: Vec<f64> = xv.iter().map(|v| v / 8.0).collect();
    let x = kfuse::Tensor::from_f64(&xv, &[m, k], dt, dev).map_err(|e| e.to_string())?;
    let (wg, gv) = operand(k, n, dt, seed + 1, wt, dev);
    let (wu, uv) = operand(k, n, dt, seed + 2, wt, dev);
    let got = kfuse::ops::swiglu_gemm(&x, &wg, &wu).map_err(|e| format!("{what}: {e}"))?;
    let rows = sample_rows(m);
    let got = rows_of(&got.to_vec_f64().map_err(|e| e.to_string())?, n, &rows);
    within(&what, common::rel_err(&got, &reference(&xv, &gv, &uv, k, n, &rows)), tol(dt))
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn swiglu_gemm_on_the_gpu_against_float64() {
    let dev = common::gpu();
    let mut out = Outcomes::default();
    let shapes = [(1, 1, 1), (17, 33, 65), (300, 200, 1000), (127, 4096, 4096), (4096, 4096, 4096), (4095, 4097, 4096)];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        for dt in [DType::BF16, DType::F16] {
            for wt in [false, true] {
                if m * n * k > 1 << 30 && (dt != DType::BF16 || wt) {
                    continue;
                }
                out.add(format!("{m}x{n}x{k} {dt} wt={wt}"), check(m, n, k, dt, wt, &dev, 700 + 10 * s as u64));
            }
        }
    }
    out.finish();
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn swiglu_kernel_writes_every_element_of_a_poisoned_output() {
    let dev = common::gpu();
    // rows 16-byte aligned: what the kernel reads without the op's copies
    for &(m, n, k) in &[(257, 320, 192), (64, 136, 4096), (1000, 512, 520)] {
        let (x, xv) = operand(m, k, DType::BF16, 11, false, &dev);
        let (wg, gv) = operand(k, n, DType::BF16, 12, false, &dev);
        let (wu, uv) = operand(k, n, DType::BF16, 13, true, &dev);
        let mut out = common::poisoned(&[m, n], DType::BF16, &dev);
        match kfuse::ops::kernels::swiglu_gemm(&x, &wg, &wu, &mut out) {
            Ok(l) => assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend),
            // compiled for sm_80/sm_89 (KFUSE_TARGET): the kernel is refused, clearly
            Err(e) if dev.target().is_none_or(|t| t.sm != 90) => {
                assert!(e.to_string().contains("sm_90a WGMMA"), "{e}");
                continue;
            }
            Err(e) => panic!("{m}x{n}x{k}: {e}"),
        }
        let rows: Vec<usize> = (0..m).collect();
        let e = common::rel_err(&out.to_vec_f64().unwrap(), &reference(&xv, &gv, &uv, k, n, &rows));
        assert!(e <= tol(DType::BF16), "{m}x{n}x{k}: relative error {e:.3e}");
    }
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn three_products_with_two_a_tiles() {
    let dev = common::gpu();
    if dev.target().is_none_or(|t| t.sm != 90) {
        eprintln!("several dots in one loop run on sm_90a only: skipped");
        return;
    }
    for &(m, n, k) in &[(256, 192, 320), (130, 520, 1000)] {
        let dt = DType::BF16;
        let (a1, a1v) = operand(m, k, dt, 21, false, &dev);
        let (b1, b1v) = operand(k, n, dt, 22, false, &dev);
        let (a2, a2v) = operand(m, k, dt, 23, false, &dev);
        let (b2, b2v) = operand(k, n, dt, 24, true, &dev);
        let (b3, b3v) = operand(k, n, dt, 25, false, &dev);
        let mut out = common::poisoned(&[m, n], dt, &dev);
        let l = three_products(&a1, &b1, &a2, &b2, &b3, &mut out).unwrap();
        assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
        let rows: Vec<usize> = (0..m).collect();
        let (p, q, r) = (reference_rows(&a1v, &b1v, k, n, &rows), reference_rows(&a2v, &b2v, k, n, &rows), reference_rows(&a2v, &b3v, k, n, &rows));
        let want: Vec<f64> = (0..m * n).map(|x| p[x] + q[x] * r[x]).collect();
        let e = common::rel_err(&out.to_vec_f64().unwrap(), &want);
        assert!(e <= 1e-2, "{m}x{n}x{k}: relative error {e:.3e}");
    }
}

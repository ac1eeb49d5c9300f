//! 8-bit float products on the GPU (sm_90a: `wgmma … k32 … e4m3/e5m2`) against a
//! float64 reference of the fp8-rounded inputs: `kfuse::ops::gemm_ex` with per-tensor
//! scales, every output dtype, B row-major (copied K-major by the op) and as the
//! transpose of an `[N, K]` tensor (read as it lies), odd shapes; and a raw kernel
//! launch into a NaN-poisoned output. Large shapes are checked on a sample of rows.
//! GPU-only: ignored (counted as skipped) unless built with `--cfg kfuse_gpu`
//! (`scripts/gpu-build.sh`), then failed where no GPU is found.

mod common;

use common::gemm::{operand, reference_rows_ex, rows_of, sample_rows, within, Outcomes};

use kfuse::ops::{gemm_ex, GemmOptions};
use kfuse::{Backend, DType};

/// ‖out − ref‖/‖ref‖ bound: the accumulation error (well under 1e-3) plus one rounding
/// to the output dtype.
fn tol(od: DType) -> f64 {
    match od {
        DType::F32 => 2e-3,
        DType::F8E4M3 => 4e-2,
        DType::F8E5M2 => 8e-2,
        _ => 1e-2,
    }
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn fp8_gemm_ex_on_the_gpu_against_float64() {
    let dev = common::gpu();
    let (sa, sb) = (0.75f32, 2.5f32);
    let mut out = Outcomes::default();
    let shapes = [(1, 1, 1), (17, 33, 65), (300, 200, 1000), (1, 4096, 4096), (127, 4096, 4096), (4095, 4097, 4095)];
    for (s, &(m, n, k)) in shapes.iter().enumerate() {
        let big = m * n * k > 1 << 30;
        for (dt, od) in [(DType::F8E4M3, DType::BF16), (DType::F8E5M2, DType::BF16), (DType::F8E4M3, DType::F32), (DType::F8E4M3, DType::F8E4M3), (DType::F8E4M3, DType::F16)] {
            for tb in [true, false] {
                if big && (dt != DType::F8E4M3 || od != DType::BF16) {
                    continue;
                }
                let what = format!("{m}x{n}x{k} {dt}->{od} b_transposed={tb}");
                let case = || -> Result<f64, String> {
                    let (a, av) = operand(m, k, dt, 100 + s as u64, false, &dev);
                    let (b, bv) = operand(k, n, dt, 200 + s as u64, tb, &dev);
                    // an 8-bit output keeps the sums in range (|x| ≤ 448 for e4m3): scale
                    // them to about unit size (sums of K products of size ~3 grow as √K)
                    let sa = if od.is_fp8() { 1.0 / (3.0 * (k as f32).sqrt()) } else { sa };
                    let opts = GemmOptions { out_dtype: Some(od), scale_a: sa, scale_b: sb, ..Default::default() };
                    let res = gemm_ex(&a, &b, &opts).map_err(|e| format!("{what}: {e}"))?;
                    let rows = sample_rows(m);
                    let got = rows_of(&res.to_vec_f64().map_err(|e| e.to_string())?, n, &rows);
                    let want = reference_rows_ex(&av, &bv, None, k, n, &rows, (sa * sb) as f64, 0.0);
                    within(&what, common::rel_err(&got, &want), tol(od))
                };
                out.add(&what, case());
            }
        }
    }
    out.finish();
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn fp8_kernel_writes_every_element_of_a_poisoned_output() {
    let dev = common::gpu();
    for &(m, n, k) in &[(257, 320, 192), (64, 136, 4096)] {
        let (a, av) = operand(m, k, DType::F8E4M3, 7, false, &dev);
        let (b, bv) = operand(k, n, DType::F8E4M3, 8, true, &dev);
        let mut out = common::poisoned(&[m, n], DType::BF16, &dev);
        let l = kfuse::ops::kernels::gemm_scaled(&a, &b, &mut out, 0.5).unwrap();
        assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
        let rows: Vec<usize> = (0..m).collect();
        let e = common::rel_err(&out.to_vec_f64().unwrap(), &reference_rows_ex(&av, &bv, None, k, n, &rows, 0.5, 0.0));
        assert!(e <= 1e-2, "{m}x{n}x{k}: relative error {e:.3e}");
    }
}

//! cuBLASLt fp8 GEMMs through `kfuse_runtime::vendor` (`Blas::gemm_fp8_into`,
//! `Blas::gemm_fp8`, and `gemm_into` / `gemm` with fp8 operands) on the GPU, against a
//! float64 reference computed from the fp8-rounded inputs: random data quantized to
//! e4m3 / e5m2 on the host (never zeros), odd-ish shapes, outputs poisoned with NaN
//! first, per-tensor scales ≠ 1, both fast-accumulation settings, strided views, and the
//! refusals (layouts other than "TN", misalignment, e5m2 × e5m2, cuBLAS). GPU-only:
//! ignored (counted as skipped) unless built with `--cfg kfuse_gpu`
//! (`scripts/gpu-build.sh`), then failed where no GPU is found.

mod common;

use common::gpu;
use kfuse_runtime::vendor::{Blas, Library, Math};
use kfuse_runtime::{DType, Device, Error, Tensor};

const E4: DType = DType::F8E4M3;
const E5: DType = DType::F8E5M2;

/// A GPU that runs fp8 (compute capability 8.9+) and its handles; on an older GPU,
/// checks that fp8 is refused with the reason and gives `None`.
fn fp8_gpu() -> Option<(Device, Blas)> {
    let d = gpu();
    let blas = Blas::new(&d).unwrap();
    if d.compute_capability().unwrap() < (8, 9) {
        let a = Tensor::zeros(&[16, 16], E4, &d).unwrap();
        let w = Tensor::zeros(&[16, 16], E4, &d).unwrap();
        match blas.gemm_fp8(&a, &w.t(), DType::BF16, 1.0, 1.0, false) {
            Err(Error::Vendor(m)) => eprintln!("{}: fp8 refused as expected ({m}); skipping", d.describe()),
            r => panic!("fp8 on {}: expected a refusal, got {r:?}", d.describe()),
        }
        return None;
    }
    Some((d, blas))
}

/// Deterministic pseudo-random values in [-amp, amp) (never all zeros).
fn values(n: usize, seed: u64, amp: f64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0) * amp
        })
        .collect()
}

/// A `[rows, cols]` tensor of `dt` on `d` from random values (rounded to `dt` on the
/// host), with its elements as `dt` holds them (read back from the device).
fn random(rows: usize, cols: usize, dt: DType, seed: u64, d: &Device) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_f64(&values(rows * cols, seed, 3.0), &[rows, cols], dt, d).unwrap();
    let v = t.to_vec_f64().unwrap();
    assert!(v.iter().all(|x| x.is_finite()) && v.iter().any(|&x| x != 0.0));
    (t, v)
}

/// `scale · A · wᵀ` in float64: `a` is `[m, k]`, `w` is `[n, k]` (B = wᵀ), row-major.
fn reference(a: &[f64], w: &[f64], m: usize, n: usize, k: usize, scale: f64) -> Vec<f64> {
    let mut out = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let (ar, wr) = (&a[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
            out[i * n + j] = scale * ar.iter().zip(wr).map(|(x, y)| x * y).sum::<f64>();
        }
    }
    out
}

fn rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

/// The bound on ‖out − ref‖/‖ref‖ (the output's rounding dominates; fast accumulation
/// adds little at these K).
fn tol(out: DType) -> f64 {
    match out {
        DType::F32 => 5e-3,
        _ => 1e-2,
    }
}

/// Checks `got` (finite everywhere) against `want`; returns the relative error.
fn check(what: &str, got: &[f64], want: &[f64], out: DType) -> f64 {
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        panic!("{what}: element {i} is {} (not written?)", got[i]);
    }
    let e = rel_err(got, want);
    eprintln!("{what}: relative error {e:.2e}");
    assert!(e < tol(out), "{what}: relative error {e:.3e} ≥ {:.0e}", tol(out));
    e
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn fp8_gemm_matches_a_float64_reference() {
    let Some((d, blas)) = fp8_gpu() else { return };
    // (M, N, K, A dtype, B dtype, C dtype)
    let cases = [
        (129, 144, 160, E4, E4, DType::BF16),
        (256, 512, 1024, E4, E4, DType::BF16),
        (129, 144, 160, E4, E4, DType::F16),
        (129, 144, 160, E4, E4, DType::F32),
        (64, 136, 256, E4, E5, DType::BF16),
        (65, 128, 512, E5, E4, DType::BF16),
        (1, 64, 64, E4, E4, DType::BF16),
    ];
    for (i, &(m, n, k, adt, bdt, out)) in cases.iter().enumerate() {
        let (a, av) = random(m, k, adt, 100 + i as u64, &d);
        let (w, wv) = random(n, k, bdt, 200 + i as u64, &d);
        let b = w.t(); // B[K, N], K-major
        for (sa, sb) in [(1.0f32, 1.0f32), (0.37, -2.5)] {
            let want = reference(&av, &wv, m, n, k, sa as f64 * sb as f64);
            for fast in [false, true] {
                let what = format!("{m}x{n}x{k} {adt} × {bdt} -> {out} scales ({sa}, {sb}) fast_accum={fast}");
                let mut c = Tensor::empty(&[m, n], out, &d).unwrap();
                c.fill(f64::NAN).unwrap();
                blas.gemm_fp8_into(&a, &b, &mut c, sa, sb, fast).unwrap_or_else(|e| panic!("{what}: {e}"));
                check(&what, &c.to_vec_f64().unwrap(), &want, out);
            }
        }
    }
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn fp8_gemm_entry_points_and_views() {
    let Some((d, blas)) = fp8_gpu() else { return };
    let (m, n, k) = (129, 144, 160);
    let (a, av) = random(m, k, E4, 1, &d);
    let (w, wv) = random(n, k, E4, 2, &d);
    let want = reference(&av, &wv, m, n, k, 1.0);

    // `gemm_fp8` allocates the output of the dtype asked for
    let c = blas.gemm_fp8(&a, &w.t(), DType::F32, 0.5, 4.0, false).unwrap();
    assert_eq!((c.shape(), c.dtype()), (&[m, n][..], DType::F32));
    check("gemm_fp8 f32", &c.to_vec_f64().unwrap(), &reference(&av, &wv, m, n, k, 2.0), DType::F32);

    // `gemm` / `gemm_into` with fp8 operands: cuBLASLt, unit scales, a bf16 output
    let c = blas.gemm(&a, &w.t(), Library::CublasLt, Math::Fp32).unwrap();
    assert_eq!((c.shape(), c.dtype()), (&[m, n][..], DType::BF16));
    check("gemm fp8 (cuBLASLt)", &c.to_vec_f64().unwrap(), &want, DType::BF16);
    let mut c = Tensor::full(&[m, n], f64::NAN, DType::F16, &d).unwrap();
    blas.gemm_into(&a, &w.t(), &mut c, Library::CublasLt, Math::Fp32).unwrap();
    check("gemm_into fp8 -> f16 (cuBLASLt)", &c.to_vec_f64().unwrap(), &want, DType::F16);
    // cublasGemmEx has no fp8
    match blas.gemm(&a, &w.t(), Library::Cublas, Math::Fp32) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("cuBLASLt"), "{msg}"),
        r => panic!("fp8 through cuBLAS: {r:?}"),
    }

    // strided views: A is columns 16.. of an [M, K + 16] tensor, B the transpose of rows
    // 8.. of an [N + 8, K] tensor, C columns 0..N of an [M, N + 8] tensor whose other
    // columns must stay untouched
    let (wide_a, wide_av) = random(m, k + 16, E4, 3, &d);
    let a2 = wide_a.narrow(1, 16, k).unwrap();
    let a2v: Vec<f64> = (0..m).flat_map(|i| wide_av[i * (k + 16) + 16..(i + 1) * (k + 16)].to_vec()).collect();
    let (tall_w, tall_wv) = random(n + 8, k, E4, 4, &d);
    let w2 = tall_w.narrow(0, 8, n).unwrap();
    let w2v = tall_wv[8 * k..].to_vec();
    let parent = Tensor::full(&[m, n + 8], f64::NAN, DType::BF16, &d).unwrap();
    let mut c = parent.narrow(1, 0, n).unwrap();
    for fast in [false, true] {
        blas.gemm_fp8_into(&a2, &w2.t(), &mut c, -0.25, 3.0, fast).unwrap();
        check(&format!("views fast_accum={fast}"), &c.to_vec_f64().unwrap(), &reference(&a2v, &w2v, m, n, k, -0.75), DType::BF16);
    }
    let rest = parent.narrow(1, n, 8).unwrap().to_vec_f64().unwrap();
    assert!(rest.iter().all(|x| x.is_nan()), "the GEMM wrote outside C");

    // K = 0: an empty sum
    let e = Tensor::zeros(&[m, 0], E4, &d).unwrap();
    let ew = Tensor::zeros(&[n, 0], E4, &d).unwrap();
    let mut c = Tensor::full(&[m, n], f64::NAN, DType::BF16, &d).unwrap();
    blas.gemm_fp8_into(&e, &ew.t(), &mut c, 1.0, 1.0, false).unwrap();
    assert!(c.to_vec_f64().unwrap().iter().all(|&x| x == 0.0));
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn fp8_gemm_refuses_what_cublaslt_cannot_run() {
    let Some((d, blas)) = fp8_gpu() else { return };
    let (m, n, k) = (129, 144, 160);
    let (a, _) = random(m, k, E4, 5, &d);
    let (w, _) = random(n, k, E4, 6, &d);
    let mut c = Tensor::full(&[m, n], f64::NAN, DType::BF16, &d).unwrap();
    let invalid = |r: kfuse_runtime::Result<()>, what: &str, needle: &str| match r {
        Err(Error::InvalidArgument(msg)) => {
            eprintln!("{what}: {msg}");
            assert!(msg.contains(needle), "{what}: {msg}");
        }
        r => panic!("{what}: expected InvalidArgument, got {r:?}"),
    };
    for fast in [false, true] {
        // B not K-major: a packed [K, N] (N contiguous)
        let b_kn = w.t().contiguous().unwrap();
        assert_eq!(b_kn.strides(), [n as isize, 1]);
        invalid(blas.gemm_fp8_into(&a, &b_kn, &mut c, 1.0, 1.0, fast), "B [K, N] row-major", "K-major");
        // A not row-major: a transposed view of a [K, M] tensor
        let a_t = a.t().contiguous().unwrap().t();
        invalid(blas.gemm_fp8_into(&a_t, &w.t(), &mut c, 1.0, 1.0, fast), "A transposed", "A[M, K] must be row-major");
    }
    // K not a multiple of 16
    let (a40, _) = random(m, 40, E4, 7, &d);
    let (w40, _) = random(n, 40, E4, 8, &d);
    invalid(blas.gemm_fp8_into(&a40, &w40.t(), &mut c, 1.0, 1.0, false), "K = 40", "multiple of 16");
    // e5m2 × e5m2
    let (a5, _) = random(m, k, E5, 9, &d);
    let (w5, _) = random(n, k, E5, 10, &d);
    invalid(blas.gemm_fp8_into(&a5, &w5.t(), &mut c, 1.0, 1.0, false), "e5m2 × e5m2", "f8e5m2 × f8e5m2");
    // an fp8 output
    let mut c8 = Tensor::zeros(&[m, n], E4, &d).unwrap();
    invalid(blas.gemm_fp8_into(&a, &w.t(), &mut c8, 1.0, 1.0, false), "fp8 output", "bf16, f16 or f32");
    // mixed fp8 and bf16 operands
    let (ab, _) = random(m, k, DType::BF16, 11, &d);
    assert!(matches!(blas.gemm_fp8_into(&ab, &w.t(), &mut c, 1.0, 1.0, false), Err(Error::DTypeMismatch(_))));
    // nothing ran: C is still poisoned
    assert!(c.to_vec_f64().unwrap().iter().all(|x| x.is_nan()));
}

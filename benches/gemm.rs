//! GEMM against cuBLAS and cuBLASLt in the same process: row-major `C[M, N] = A[M, K] ·
//! B[K, N]`, bf16 on 4096³, 8192³, M8192 N14336 K4096, M8192 N4096 K14336, M16384 N4096
//! K4096, 2048³, M127 N4096 K4096 and M4095 N4097 K4096 (unaligned); f16 at the same
//! shapes (`KFUSE_BENCH_FILTER=f16_` runs only those); f32
//! 8192³ in full fp32 and with TF32 tensor cores (cuBLAS `CUBLAS_COMPUTE_32F_FAST_TF32`
//! against kfuse's `gemm_ex` with `GemmOptions::tf32`, B given K-major to both); and fp8 e4m3
//! (bf16 out, per-tensor scales) at 4096³ and 8192³ against cuBLASLt's fp8 GEMM with its
//! default and with its fast accumulation, in a table of their own; and the SwiGLU
//! projection pair `silu(x·Wg) ⊙ (x·Wu)` (bf16, `kfuse::ops::swiglu_gemm`, one kernel)
//! against cuBLAS doing the two GEMMs, or one GEMM of the concatenated `[Wg | Wu]`,
//! followed by kfuse's elementwise SwiGLU, at 4096³, M8192 N14336 K4096 and M127 N14336
//! K4096 (`KFUSE_BENCH_FILTER=swiglu` runs only these); and a user GEMM with a fused
//! bias + GELU epilogue against cuBLAS followed by a bias + GELU kernel, at 4096³ and
//! 8192³ (`KFUSE_BENCH_FILTER=fused` runs only these).
//!
//! Prints a table — TFLOP/s (2·M·N·K per call) of cuBLAS (`cublasGemmEx`), cuBLASLt
//! (`cublasLtMatmul`, heuristic algorithm, 32 MiB workspace) and `kfuse::ops::gemm`, and
//! kfuse's ratio to the faster vendor call, and the device memory one kfuse call took
//! from kfuse's pool at its peak (its output and any temporaries, such as padded
//! operands; cuBLAS's workspace is not in that pool) — writes it as `gemm.md` and
//! `gemm.csv`, and the ratios as a chart, `gemm.svg`, into `$KFUSE_BENCH_OUT` when set,
//! and ends with one `gemm summary:` line (what `scripts/gpu-run.sh` puts in its final
//! table). On a terminal a progress bar shows the row being timed.
//!
//! Timing: CUDA events around each call, 10 warm-ups of every competitor before any
//! timed call, 150 timed calls (`KFUSE_BENCH_ITERS=N`: N), median; the competitors of a
//! row take turns in rounds of 10 calls, the first of a round rotating
//! (`common::interleaved`), so that the GPU's clock drift over the run falls on each
//! alike. Inputs are
//! random (uniform in [-1, 1), never zeros); when one set of A, B and C is smaller than
//! 3× the 50 MB L2, several sets are rotated so that no call finds its inputs in L2 from
//! the call before. `kfuse::ops::gemm` allocates its output on each call (stream-ordered,
//! so no synchronization), like a user's call would.
//!
//! Numerics, per shape: cuBLAS's output against a float64 CPU reference on 64 sampled
//! elements (checks the vendor path itself), and kfuse's whole output against cuBLAS's
//! by ‖kfuse − cuBLAS‖ / ‖cuBLAS‖. A kfuse call that is refused, panics or gives a
//! relative error above the dtype's tolerance gets a row saying so instead of a time.

mod common;

use common::gemm::{first_line, kfuse_gemm, panic_message, rel_err, sampled_err, tolerance, Case, Inputs, CASES};
use common::epilogue::{bias_gelu, gemm_bias_gelu};
use common::random;
use kfuse::ops::{gemm_ex, GemmOptions};
use kfuse::prelude::*;
use kfuse::runtime::vendor::{Blas, Library, Math};
use kfuse::{DType, Device, Tensor};

/// The SwiGLU activation of two `[M, N]` halves, any strides (`h[:, :N]` and `h[:, N:]`
/// of a concatenated projection): what follows a vendor GEMM of `[Wg | Wu]`.
#[kfuse]
pub fn swiglu_2d<T: Float>(g: Tensor<T, (M, N)>, u: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let gv = g.block([i * BM, j * BN], [BM, BN]).load().to_f32();
    let uv = u.block([i * BM, j * BN], [BM, BN]).load().to_f32();
    out.block([i * BM, j * BN], [BM, BN]).store((gv * sigmoid(gv) * uv).cast::<T>());
}

/// The SwiGLU projection pair `silu(x · Wg) ⊙ (x · Wu)`, bf16, `x: [M, K]`, the weights
/// the two halves of one row-major `[K, 2N]` tensor `[Wg | Wu]` (read as they lie by
/// every variant): kfuse's `swiglu_gemm` (one kernel, two accumulators sharing the x
/// tile) against cuBLAS doing the two GEMMs and kfuse's elementwise `swiglu`, and
/// against cuBLAS doing one GEMM of the concatenated weights (`[M, 2N]`) and
/// [`swiglu_2d`] on its halves. Returns a markdown row: the times, TFLOP/s (4·M·N·K per
/// call), the speed-up over the faster baseline, and kfuse's relative difference from the first.
fn swiglu_row(blas: &Blas, dev: &Device, m: usize, n: usize, k: usize, warm: usize, iters: usize) -> kfuse::Result<String> {
    let dt = DType::BF16;
    let (x, _) = random(&[m, k], dt, 21, dev);
    let (wcat, _) = random(&[k, 2 * n], dt, 22, dev);
    let (wg, wu) = (wcat.narrow(1, 0, n)?, wcat.narrow(1, n, n)?);
    let mut g = Tensor::empty(&[m, n], dt, dev)?;
    let mut u = Tensor::empty(&[m, n], dt, dev)?;
    let mut h = Tensor::empty(&[m, 2 * n], dt, dev)?;
    let mut out = Tensor::empty(&[m, n], dt, dev)?;
    // numerics: kfuse against the two-GEMM baseline
    let fused = kfuse::ops::swiglu_gemm(&x, &wg, &wu)?;
    blas.gemm_into(&x, &wg, &mut g, Library::Cublas, Math::Fp32)?;
    blas.gemm_into(&x, &wu, &mut u, Library::Cublas, Math::Fp32)?;
    let two = kfuse::ops::swiglu(&g, &u)?;
    let e = rel_err(&fused, &two)?;
    if e.is_nan() || e > 1e-2 {
        return Ok(format!("| M{m} N{n} K{k} | bf16 | WRONG RESULT: {e:.2e} from cuBLAS ×2 + swiglu | | | | |
"));
    }
    let mut f_k = || kfuse::ops::swiglu_gemm(&x, &wg, &wu).map(drop);
    let mut f_two = || {
        blas.gemm_into(&x, &wg, &mut g, Library::Cublas, Math::Fp32)?;
        blas.gemm_into(&x, &wu, &mut u, Library::Cublas, Math::Fp32)?;
        kfuse::ops::swiglu(&g, &u).map(drop)
    };
    let mut f_cat = || {
        blas.gemm_into(&x, &wcat, &mut h, Library::Cublas, Math::Fp32)?;
        swiglu_2d(&h.narrow(1, 0, n)?, &h.narrow(1, n, n)?, &mut out).map(drop)
    };
    let mut t = common::interleaved(dev, warm, iters, &mut [&mut f_k, &mut f_two, &mut f_cat]).into_iter();
    let (t_k, t_two, t_cat) = (t.next().unwrap()?, t.next().unwrap()?, t.next().unwrap()?);
    let tf = |ms: f64| 4.0 * (m * n * k) as f64 / ms / 1e9;
    Ok(format!(
        "| M{m} N{n} K{k} | bf16 | {:.1} µs ({:.0} TFLOP/s) | {:.1} µs ({:.0}) | {:.1} µs ({:.0}) | {:.2}× | {e:.1e} |\n",
        t_k * 1e3,
        tf(t_k),
        t_two * 1e3,
        tf(t_two),
        t_cat * 1e3,
        tf(t_cat),
        t_two.min(t_cat) / t_k
    ))
}

/// Fused GEMM + bias + GELU (kfuse, one kernel) against cuBLAS GEMM then a separate
/// bias + GELU kernel, bf16, same inputs; returns a markdown row and the check.
fn fused_epilogue(blas: &Blas, dev: &Device, m: usize, n: usize, k: usize, warm: usize, iters: usize) -> kfuse::Result<String> {
    let (a, _) = random(&[m, k], DType::BF16, 7, dev);
    let (b, _) = random(&[k, n], DType::BF16, 8, dev);
    let (bias, _) = random(&[n], DType::BF16, 9, dev);
    let mut fused = Tensor::empty(&[m, n], DType::BF16, dev)?;
    let mut tmp = Tensor::empty(&[m, n], DType::BF16, dev)?;
    let mut two = Tensor::empty(&[m, n], DType::BF16, dev)?;
    gemm_bias_gelu(&a, &b, &bias, &mut fused)?;
    blas.gemm_into(&a, &b, &mut tmp, Library::Cublas, Math::Fp32)?;
    bias_gelu(&tmp, &bias, &mut two)?;
    let e = rel_err(&fused, &two)?;
    let tmp = std::cell::RefCell::new(tmp);
    let mut t_fused = || gemm_bias_gelu(&a, &b, &bias, &mut fused).map(drop);
    let mut t_two = || {
        blas.gemm_into(&a, &b, &mut tmp.borrow_mut(), Library::Cublas, Math::Fp32)?;
        bias_gelu(&tmp.borrow(), &bias, &mut two).map(drop)
    };
    let mut t_gemm = || blas.gemm_into(&a, &b, &mut tmp.borrow_mut(), Library::Cublas, Math::Fp32);
    let mut t = common::interleaved(dev, warm, iters, &mut [&mut t_fused, &mut t_two, &mut t_gemm]).into_iter();
    let (tf, tv, tg) = (t.next().unwrap()?, t.next().unwrap()?, t.next().unwrap()?);
    let fl = 2.0 * m as f64 * n as f64 * k as f64;
    Ok(format!(
        "| M{m} N{n} K{k} | bf16 | {:.1} µs ({:.0} TFLOP/s) | {:.1} µs = cuBLAS {:.1} + bias+GELU {:.1} | {:.2}× | {e:.1e} |\n",
        tf * 1e3,
        fl / tf / 1e9,
        tv * 1e3,
        tg * 1e3,
        (tv - tg) * 1e3,
        tv / tf
    ))
}

/// fp8 e4m3 products with bf16 output and per-tensor scales, B given K-major (the
/// transpose of a packed `[N, K]`, the only layout cuBLASLt's fp8 GEMM takes): kfuse's
/// `gemm_ex` against cuBLASLt with its default accumulation and with fast accumulation.
/// Returns a markdown row: TFLOP/s of each, kfuse ÷ the faster cuBLASLt, and the
/// relative differences from cuBLASLt (default) and from float64 on sampled elements.
fn fp8_row(blas: &Blas, dev: &Device, n3: usize, warm: usize, iters: usize) -> kfuse::Result<String> {
    let (m, n, k) = (n3, n3, n3);
    let (sa, sb) = (0.5f32, 0.25f32);
    let dt = DType::F8E4M3;
    let sets = (150_000_000 / (m * k + n * k + 2 * m * n)).clamp(1, 8);
    let mut a = Vec::new();
    let mut b = Vec::new();
    let mut host = None;
    for s in 0..sets {
        let (x, xv) = random(&[m, k], dt, 300 + 2 * s as u64, dev);
        let (w, wv) = random(&[n, k], dt, 301 + 2 * s as u64, dev);
        if s == 0 {
            host = Some((xv, wv));
        }
        a.push(x);
        b.push(w.t());
    }
    let (av, wv) = host.expect("one set");
    let opts = GemmOptions { out_dtype: Some(DType::BF16), scale_a: sa, scale_b: sb, ..Default::default() };
    let outs: Vec<Tensor> = (0..sets).map(|_| Tensor::empty(&[m, n], DType::BF16, dev)).collect::<kfuse::Result<_>>()?;
    // numerics: cuBLASLt (default accumulation) against float64, kfuse against both
    let mut reference = Tensor::empty(&[m, n], DType::BF16, dev)?;
    blas.gemm_fp8_into(&a[0], &b[0], &mut reference, sa, sb, false)?;
    let kf = gemm_ex(&a[0], &b[0], &opts)?;
    let rb = reference.to_bytes()?;
    let kb = kf.to_bytes()?;
    let (mut num_v, mut num_k, mut den) = (0f64, 0f64, 0f64);
    for s in 0..64usize {
        let (i, j) = ((s * 7919) % m, (s * 104729 + 13) % n);
        let want: f64 = (sa * sb) as f64 * (0..k).map(|p| av[i * k + p] as f64 * wv[j * k + p] as f64).sum::<f64>();
        let (v, q) = (DType::BF16.read(&rb, i * n + j), DType::BF16.read(&kb, i * n + j));
        num_v += (v - want) * (v - want);
        num_k += (q - want) * (q - want);
        den += want * want;
    }
    let (ev, ek) = ((num_v / den).sqrt(), (num_k / den).sqrt());
    let e = rel_err(&kf, &reference)?;
    if !(e <= 1e-2 && ek <= 1e-2) {
        return Ok(format!("| {n3}³ | e4m3 → bf16 | | | WRONG RESULT: {e:.2e} from cuBLASLt, {ek:.2e} from float64 | | |\n"));
    }
    let outs = std::cell::RefCell::new(outs);
    let mut f_def = common::rotating(sets, |s| blas.gemm_fp8_into(&a[s], &b[s], &mut outs.borrow_mut()[s], sa, sb, false));
    let mut f_fast = common::rotating(sets, |s| blas.gemm_fp8_into(&a[s], &b[s], &mut outs.borrow_mut()[s], sa, sb, true));
    let mut f_k = common::rotating(sets, |s| gemm_ex(&a[s], &b[s], &opts).map(drop));
    let mut t = common::interleaved(dev, warm, iters, &mut [&mut f_def, &mut f_fast, &mut f_k]).into_iter();
    let (t_def, t_fast, t_k) = (t.next().unwrap()?, t.next().unwrap()?, t.next().unwrap()?);
    let tf = |ms: f64| 2.0 * (m * n * k) as f64 / ms / 1e9;
    Ok(format!(
        "| {n3}³ | e4m3 → bf16 | {:.0} | {:.0} | {:.0} | {:.2}× | {e:.1e} / {ek:.1e} (cuBLASLt {ev:.1e}) |\n",
        tf(t_def),
        tf(t_fast),
        tf(t_k),
        tf(t_k) / tf(t_def).max(tf(t_fast))
    ))
}

struct Row {
    case: Case,
    cublas: Result<f64, String>,
    cublaslt: Result<f64, String>,
    /// kfuse's time, `None` when there is no kfuse GEMM for the case.
    kfuse: Option<Result<f64, String>>,
    /// kfuse vs cuBLAS, relative.
    err: Option<f64>,
    /// cuBLAS vs float64 on sampled elements, relative.
    vendor_err: Option<f64>,
    /// Device memory one kfuse call took from the pool at its peak (its output and any
    /// temporaries, such as padded operands), with the inputs already allocated.
    kfuse_mem: Option<usize>,
}

fn run_case(c: &Case, blas: &Blas, dev: &Device, warm: usize, iters: usize) -> kfuse::Result<Row> {
    let mut inputs = Inputs::new(c, dev)?;
    let sets = inputs.sets();
    let mut row = Row { case: *c, cublas: Err(String::new()), cublaslt: Err(String::new()), kfuse: None, err: None, vendor_err: None, kfuse_mem: None };

    // vendor: checked once (cuBLAS vs f64, cuBLASLt vs cuBLAS), then timed
    let mut reference = Tensor::empty(&[c.m, c.n], c.dtype, dev)?;
    let vendor_ok = blas.gemm_into(&inputs.a[0], &inputs.b[0], &mut reference, Library::Cublas, c.math).and_then(|_| sampled_err(c, &inputs, &reference));
    match vendor_ok {
        Err(e) => {
            row.cublas = Err(format!("cuBLAS failed: {}", first_line(e)));
            row.cublaslt = Err(String::new());
            return Ok(row);
        }
        Ok(e) => {
            row.vendor_err = Some(e);
            if e.is_nan() || e > tolerance(c.dtype, c.math) {
                row.cublas = Err(format!("cuBLAS is {e:.2e} off float64 (a layout bug in the vendor path?)"));
                return Ok(row);
            }
        }
    }
    let Inputs { a, b, outs, .. } = &mut inputs;
    // cuBLASLt: one call checked against cuBLAS before it is timed
    let lt_ok = blas.gemm_into(&a[0], &b[0], &mut outs[0], Library::CublasLt, c.math).map_err(|e| format!("CublasLt failed: {}", first_line(e))).and_then(|_| match rel_err(&outs[0], &reference) {
        Ok(e) if e > tolerance(c.dtype, c.math) => Err(format!("cuBLASLt differs from cuBLAS by {e:.2e}")),
        _ => Ok(()),
    });
    // host cost of a kfuse call: wall time of a burst of calls (GPU work queued, not
    // waited on) — when it exceeds the kernel's time the GPU waits for the host
    if std::env::var("KFUSE_BENCH_HOST").is_ok() {
        if let Some(Ok(_)) = kfuse_gemm(&a[0], &b[0], c.math) {
            dev.synchronize()?;
            let t0 = std::time::Instant::now();
            for s in 0..iters {
                let _ = kfuse_gemm(&a[s % sets], &b[s % sets], c.math);
            }
            let host = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
            dev.synchronize()?;
            let total = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
            eprintln!("{} {}: kfuse host {host:.1} µs/call, host+GPU {total:.1} µs/call", c.dtype_label(), c.label());
        }
    }
    // kfuse: the first call compiles (or is refused, or panics) and is checked; the
    // memory it took is read while its output is alive
    let span = common::report::MemorySpan::open(dev);
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kfuse_gemm(&a[0], &b[0], c.math)));
    if let Ok(Some(Ok(_))) = &first {
        dev.synchronize()?;
        row.kfuse_mem = Some(span.peak(dev));
    }
    let kfuse_ok: Option<Result<(), String>> = match first {
        Ok(None) => None,
        Err(p) => Some(Err(format!("kfuse panicked: {}", first_line(panic_message(&*p))))),
        Ok(Some(Err(e))) => Some(Err(format!("refused: {}", first_line(e)))),
        Ok(Some(Ok(out))) => Some(match rel_err(&out, &reference) {
            Err(e) => Err(format!("reading the output failed: {}", first_line(e))),
            Ok(e) => {
                row.err = Some(e);
                if e.is_nan() || e > tolerance(c.dtype, c.math) {
                    Err(format!("WRONG RESULT: relative error {e:.2e} against cuBLAS"))
                } else {
                    Ok(())
                }
            }
        }),
    };
    // then the three timed in interleaved rounds (common::interleaved), each rotating
    // through the input sets
    let outs = std::cell::RefCell::new(outs);
    let mut t_cublas = common::rotating(sets, |s| blas.gemm_into(&a[s], &b[s], &mut outs.borrow_mut()[s], Library::Cublas, c.math));
    let mut t_lt = common::rotating(sets, |s| blas.gemm_into(&a[s], &b[s], &mut outs.borrow_mut()[s], Library::CublasLt, c.math));
    let mut t_kfuse = common::rotating(sets, |s| kfuse_gemm(&a[s], &b[s], c.math).expect("checked above").map(drop));
    let mut fns: Vec<&mut dyn FnMut() -> kfuse::Result<()>> = vec![&mut t_cublas];
    if lt_ok.is_ok() {
        fns.push(&mut t_lt);
    }
    if matches!(kfuse_ok, Some(Ok(()))) {
        fns.push(&mut t_kfuse);
    }
    let mut times = common::interleaved(dev, warm, iters, &mut fns).into_iter();
    let mut next = |what: &str| times.next().expect("one time per competitor").map_err(|e| format!("{what} failed: {}", first_line(e)));
    row.cublas = next("Cublas");
    row.cublaslt = lt_ok.and_then(|_| next("CublasLt"));
    row.kfuse = kfuse_ok.map(|r| r.and_then(|_| next("timing")));
    Ok(row)
}

/// Puts one row's ratio into the chart's data: a group per shape (in table order), a
/// series per dtype.
fn chart_point(labels: &mut Vec<String>, series: &mut Vec<common::report::Series>, shape: String, dtype: String, ratio: Option<f64>) {
    let g = labels.iter().position(|l| *l == shape).unwrap_or_else(|| {
        labels.push(shape);
        series.iter_mut().for_each(|s| s.values.push(None));
        labels.len() - 1
    });
    let k = series.iter().position(|s| s.name == dtype).unwrap_or_else(|| {
        series.push(common::report::Series { name: dtype, values: vec![None; labels.len()] });
        series.len() - 1
    });
    series[k].values[g] = ratio;
}

fn fmt_t(c: &Case, r: &Result<f64, String>) -> String {
    match r {
        Ok(ms) => format!("{:.0}", c.tflops(*ms)),
        Err(_) => "—".into(),
    }
}

fn main() -> kfuse::Result<()> {
    let Some(dev) = common::gpu() else { return Ok(()); };
    let blas = Blas::new(&dev)?;
    // `KFUSE_BENCH_ITERS=N`: N timed calls a competitor (default 150: fifteen rounds of
    // 10; with five rounds the ratio at M8192 N14336 / K14336 moved 0.88–1.00 from one
    // process to the next under the power limit, with fifteen 0.97–1.01: BENCHMARKS.md,
    // Method)
    let iters = match std::env::var("KFUSE_BENCH_ITERS") {
        Ok(v) => v.trim().parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| kfuse::Error::InvalidArgument(format!("KFUSE_BENCH_ITERS: `{v}` is not a positive number")))?,
        Err(_) => 150,
    };
    let warm = 10;
    let mut rows = Vec::new();
    // KFUSE_BENCH_FILTER=TEXT: only the shapes whose label contains TEXT, or whose id
    // starts with it (`f16_`: the f16 rows; `fused`, `swiglu`, `fp8`: only that table)
    // (experiments)
    let filter = std::env::var("KFUSE_BENCH_FILTER").ok();
    let cases: Vec<&Case> = CASES.iter().filter(|c| filter.as_ref().is_none_or(|f| c.label().contains(f.as_str()) || c.id().starts_with(f.as_str()))).collect();
    // the main table's shapes, then the fused, SwiGLU and fp8 rows (2 + 3 + 2)
    let bar = common::report::progress(cases.len() + 7, "gemm");
    for c in cases {
        bar.set_message(format!("{} {}", c.dtype_label(), c.label()));
        let row = run_case(c, &blas, &dev, warm, iters)?;
        bar.inc(1);
        bar.suspend(|| eprintln!(
            "{} {}: cuBLAS {} cuBLASLt {} kfuse {}",
            c.dtype_label(),
            c.label(),
            fmt_t(c, &row.cublas),
            fmt_t(c, &row.cublaslt),
            row.kfuse.as_ref().map(|k| fmt_t(c, k)).unwrap_or_else(|| "—".into())
        ));
        rows.push(row);
    }

    let mut fused_md = String::from(
        "| shape | dtype | kfuse fused GEMM+bias+GELU | cuBLAS GEMM, then bias+GELU kernel | speed-up | rel. err |\n|---|---|---|---|---|---|\n",
    );
    for (m, n, k) in [(4096, 4096, 4096), (8192, 8192, 8192)] {
        bar.inc(1);
        if filter.as_ref().is_some_and(|f| !"fused".contains(f.as_str()) && !format!("M{m} N{n} K{k}").contains(f.as_str())) {
            continue;
        }
        match fused_epilogue(&blas, &dev, m, n, k, warm, iters) {
            Ok(r) => fused_md.push_str(&r),
            Err(e) => fused_md.push_str(&format!("| M{m} N{n} K{k} | bf16 | failed: {} | | | |\n", first_line(e))),
        }
    }

    let mut swiglu_md = String::from(
        "| shape | dtype | kfuse swiglu_gemm (one kernel) | cuBLAS GEMM ×2, then swiglu | cuBLAS GEMM of [Wg \\| Wu], then swiglu | speed-up over the faster baseline | rel. err vs cuBLAS ×2 |\n|---|---|---|---|---|---|---|\n",
    );
    for (m, n, k) in [(4096, 4096, 4096), (8192, 14336, 4096), (127, 14336, 4096)] {
        bar.inc(1);
        if filter.as_ref().is_some_and(|f| !"swiglu".contains(f.as_str()) && !format!("M{m} N{n} K{k}").contains(f.as_str())) {
            continue;
        }
        match swiglu_row(&blas, &dev, m, n, k, warm, iters) {
            Ok(r) => swiglu_md.push_str(&r),
            Err(e) => swiglu_md.push_str(&format!("| M{m} N{n} K{k} | bf16 | failed: {} | | | | |\n", first_line(e))),
        }
    }

    let mut fp8_md = String::from(
        "| shape | dtype | cuBLASLt fp8 TFLOP/s (default accumulation) | cuBLASLt fp8 TFLOP/s (fast accumulation) | kfuse TFLOP/s | kfuse ÷ best cuBLASLt | kfuse rel. err vs cuBLASLt / vs f64 (sampled) |\n|---|---|---|---|---|---|---|\n",
    );
    for n3 in [4096, 8192] {
        bar.inc(1);
        if filter.as_ref().is_some_and(|f| !"fp8".contains(f.as_str()) && !format!("{n3}³").contains(f.as_str())) {
            continue;
        }
        match fp8_row(&blas, &dev, n3, warm, iters) {
            Ok(r) => fp8_md.push_str(&r),
            Err(e) => fp8_md.push_str(&format!("| {n3}³ | e4m3 → bf16 | failed: {} | | | | |\n", first_line(e))),
        }
    }

    bar.finish_and_clear();
    let device = dev.describe();
    let mut md = String::from(
        "| shape | dtype | cuBLAS TFLOP/s | cuBLASLt TFLOP/s | kfuse TFLOP/s | kfuse ÷ best vendor | kfuse vs cuBLAS (rel. err) | cuBLAS vs f64 (sampled) | kfuse device memory a call (MiB; output MiB) | note |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut csv = String::from("shape,dtype,M,N,K,cublas_tflops,cublaslt_tflops,kfuse_tflops,ratio,kfuse_rel_err,cublas_rel_err_f64,kfuse_peak_bytes,note\n");
    // the chart: kfuse ÷ best vendor per shape, a bar per dtype
    let mut chart_labels: Vec<String> = Vec::new();
    let mut chart_series: Vec<common::report::Series> = Vec::new();
    let mut ratios = Vec::new();
    for r in &rows {
        let c = &r.case;
        let vendor_best = [&r.cublas, &r.cublaslt].iter().filter_map(|x| x.as_ref().ok()).map(|ms| c.tflops(*ms)).fold(f64::NAN, f64::max);
        let kf = r.kfuse.as_ref().and_then(|k| k.as_ref().ok()).map(|ms| c.tflops(*ms));
        let ratio = kf.map(|k| k / vendor_best).filter(|x| x.is_finite());
        chart_point(&mut chart_labels, &mut chart_series, c.label(), c.dtype_label(), ratio);
        let out_bytes = kfuse::runtime::pool::size_class(c.m * c.n * c.dtype.size_bytes()).unwrap_or(0);
        let mem = r.kfuse_mem.map(|b| format!("{}; {}", common::report::mib(b), common::report::mib(out_bytes)));
        if let (Some(x), DType::BF16) = (ratio, c.dtype) {
            ratios.push(x);
        }
        let notes: Vec<String> = [r.cublas.as_ref().err(), r.cublaslt.as_ref().err(), r.kfuse.as_ref().and_then(|k| k.as_ref().err())]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect();
        let note = notes.join("; ");
        let kcol = match &r.kfuse {
            None => "—".to_string(),
            Some(k) => fmt_t(c, k),
        };
        let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map(f).unwrap_or_else(|| "—".into());
        md.push_str(&format!(
            "| {} | {} | {} | {} | {kcol} | {} | {} | {} | {} | {} |\n",
            c.label(),
            c.dtype_label(),
            fmt_t(c, &r.cublas),
            fmt_t(c, &r.cublaslt),
            opt(ratio, &|x| format!("{x:.2}×")),
            opt(r.err, &|x| format!("{x:.1e}")),
            opt(r.vendor_err, &|x| format!("{x:.1e}")),
            mem.unwrap_or_else(|| "—".into()),
            note
        ));
        let num = |x: &Result<f64, String>| x.as_ref().map(|ms| format!("{:.1}", c.tflops(*ms))).unwrap_or_default();
        csv.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},\"{}\"\n",
            c.label(),
            c.dtype_label(),
            c.m,
            c.n,
            c.k,
            num(&r.cublas),
            num(&r.cublaslt),
            r.kfuse.as_ref().map(num).unwrap_or_default(),
            ratio.map(|x| format!("{x:.3}")).unwrap_or_default(),
            r.err.map(|x| format!("{x:.2e}")).unwrap_or_default(),
            r.vendor_err.map(|x| format!("{x:.2e}")).unwrap_or_default(),
            r.kfuse_mem.map(|b| b.to_string()).unwrap_or_default(),
            note.replace('"', "'")
        ));
    }
    let geo = if ratios.is_empty() { None } else { Some((ratios.iter().map(|x| x.ln()).sum::<f64>() / ratios.len() as f64).exp()) };
    let summary = match rows.first() {
        Some(first) => format!(
            "gemm summary: {} {} cuBLAS {} / cuBLASLt {} / kfuse {} TFLOP/s; kfuse ÷ best vendor, geometric mean over {} bf16 shape(s): {}",
            first.case.dtype_label(),
            first.case.label(),
            fmt_t(&first.case, &first.cublas),
            fmt_t(&first.case, &first.cublaslt),
            first.kfuse.as_ref().map(|k| fmt_t(&first.case, k)).unwrap_or_else(|| "—".into()),
            ratios.len(),
            geo.map(|g| format!("{g:.2}×")).unwrap_or_else(|| "—".into())
        ),
        None => "gemm summary: no shape of the main table matched the filter".to_string(),
    };
    println!("device: {device}\n{md}\n{fp8_md}\n{fused_md}\n{swiglu_md}\n{summary}");
    if let Ok(out) = std::env::var("KFUSE_BENCH_OUT") {
        let out = std::path::PathBuf::from(out);
        std::fs::write(out.join("gemm.md"), format!("device: {device}\n\n{md}\n{fp8_md}\n{fused_md}\n{swiglu_md}\n{summary}\n")).ok();
        std::fs::write(out.join("gemm.csv"), csv).ok();
        let panel = common::report::Panel {
            title: format!("GEMM, kfuse against the faster of cuBLAS and cuBLASLt ({})", dev.name()),
            y_label: "kfuse TFLOP/s ÷ best vendor's".into(),
            labels: chart_labels,
            series: chart_series,
            reference: Some((1.0, "vendor".into())),
        };
        if let Err(e) = common::report::bar_charts(&out.join("gemm.svg"), &[panel], 1) {
            eprintln!("{e}");
        }
    }
    Ok(())
}

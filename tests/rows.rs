//! Row ops and reductions against float64 references, on the best device there is (the
//! CPU interpreter in CI, the GPU on the GPU host): last-axis and whole-tensor sum, mean,
//! max and min; softmax and log-softmax; RMSNorm (plain, weight, weight + bias, fused
//! residual add) and LayerNorm with their statistics.
//!
//! Every check draws fresh random inputs (the run's seed is printed with any failure;
//! `KFUSE_SEED=<seed>` replays it) and runs each op twice: through the public API
//! (`kfuse::ops::…`) and through its kernel launcher into outputs poisoned with NaN.
//! Shapes are odd on purpose (N = 1, 3, 1000, 4097; M = 1, 7 and one M > 64), plus the
//! powers of two 1024 and 4096 (compiled without masks); rows with
//! large magnitudes (±1e4) and with `-inf` (whole rows and single elements) are checked
//! too: where the reference is NaN or infinite, the result must be the same special
//! value; elsewhere ‖out − ref‖ / ‖ref‖ must be under the dtype's tolerance
//! (`common::tolerance`; f32 statistics 1e-5 for every dtype; max and min exact).

mod common;

use common::row_ops::{reference, Op, Out, EPS, OPS};

use kfuse::ops::kernels as k;
use kfuse::ops::{self, Dim};
use kfuse::{DType, Device, Error, Tensor};

/// The best device; in the GPU build or with `KFUSE_REQUIRE_GPU=1` (the GPU host's
/// script) a GPU or a failure (`common::gpu_required`).
fn dev() -> Device {
    let d = Device::best();
    if !d.is_gpu() && common::gpu_required() {
        panic!("a GPU is required here (--cfg kfuse_gpu or KFUSE_REQUIRE_GPU=1) but none was found (is the CUDA driver installed?)");
    }
    d
}

/// The seed of this run: `KFUSE_SEED` (to replay a failure) or the clock.
fn run_seed() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        std::env::var("KFUSE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
        })
    })
}

/// A seed for one check, fresh every run, the same for the same check and `KFUSE_SEED`.
fn seed(check: &str) -> u64 {
    check.bytes().fold(run_seed() ^ 0xCBF2_9CE4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01B3))
}

/// What the rows hold.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fill {
    /// Uniform in ±3.
    Plain,
    /// Uniform in ±1e4.
    Large,
    /// Row 0 all `-inf` (when M > 1), and every third element `-inf` in the other rows.
    NegInf,
}

/// Uniform values in ±`range` (splitmix64: cheap enough for 2^24 elements in a debug
/// build, where `rand` takes seconds).
fn uniform(n: usize, seed: u64, range: f64) -> Vec<f64> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * range
        })
        .collect()
}

/// Random `m × n` values of `fill`, rounded to `dt`. With `offset`, the values are
/// shifted up by half their range, so that a sum of them does not cancel: a relative
/// error then measures the accumulation, not the conditioning of the sum.
fn values(m: usize, n: usize, dt: DType, fill: Fill, seed: u64, offset: bool) -> Vec<f64> {
    let range = if fill == Fill::Large { 1e4 } else { 3.0 };
    let shift = if offset { range / 2.0 } else { 0.0 };
    let mut v: Vec<f64> = uniform(m * n, seed, range).into_iter().map(|x| x + shift).collect();
    match fill {
        Fill::Plain | Fill::Large => {}
        Fill::NegInf => {
            for i in 0..m {
                for j in 0..n {
                    if (m > 1 && i == 0) || j % 3 == 1 {
                        v[i * n + j] = f64::NEG_INFINITY;
                    }
                }
            }
        }
    }
    v.into_iter().map(|x| dt.round(x)).collect()
}

fn tensor(v: &[f64], shape: &[usize], dt: DType) -> Tensor {
    Tensor::from_f64(v, shape, dt, &dev()).expect("upload")
}

fn got(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().expect("download")
}

/// Compares `out` with `want`: special values (NaN, ±inf) of the reference must be
/// matched exactly; the finite rest by ‖out − want‖ / ‖scale‖, where `scale[i]` is the
/// size of the terms that made `want[i]` (at least `|want[i]|`; `None` means `|want|`).
/// Measuring against the terms, not the result alone, follows the conditioning: where a
/// bias cancels most of `x·r·w`, the f32 rounding of the terms stays what it was while
/// the result shrinks. Returns that error.
fn compare(out: &[f64], want: &[f64], scale: Option<&[f64]>, tol: f64) -> Result<f64, String> {
    if out.len() != want.len() || scale.is_some_and(|s| s.len() != want.len()) {
        return Err(format!("{} values, expected {}", out.len(), want.len()));
    }
    let (mut a, mut b, mut t) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (&o, &w)) in out.iter().zip(want).enumerate() {
        let same_special = (w.is_nan() && o.is_nan()) || (w.is_infinite() && o == w);
        if !w.is_finite() {
            if !same_special {
                return Err(format!("element {i}: {o}, expected {w}"));
            }
        } else if !o.is_finite() {
            return Err(format!("element {i}: {o}, expected {w}"));
        } else {
            a.push(o);
            b.push(w);
            t.push(scale.map_or(w.abs(), |s| s[i].max(w.abs())));
        }
    }
    let e = common::err_against(&a, &b, &t);
    if e <= tol {
        Ok(e)
    } else {
        let worst = a.iter().zip(&b).enumerate().max_by(|x, y| (x.1 .0 - x.1 .1).abs().total_cmp(&(y.1 .0 - y.1 .1).abs())).unwrap();
        Err(format!("relative error {e:.3e} > {tol:.1e} (worst at finite element {}: {} vs {})", worst.0, worst.1 .0, worst.1 .1))
    }
}

// ---------------------------------------------------------------------------------------
// Row ops: the table, float64 references, and the two ways to run them.

struct Inputs {
    m: usize,
    n: usize,
    dt: DType,
    x: Vec<f64>,
    r: Vec<f64>,
    w: Vec<f64>,
    b: Vec<f64>,
}

fn inputs(op: Op, m: usize, n: usize, dt: DType, fill: Fill, s: u64) -> Inputs {
    let x = values(m, n, dt, fill, s, matches!(op, Op::Sum | Op::Mean));
    let r = if op.needs_r() { values(m, n, dt, Fill::Plain, s + 1, false) } else { vec![] };
    let w = if op.needs_w() { values(1, n, dt, Fill::Plain, s + 2, false) } else { vec![] };
    let b = if op.needs_b() { values(1, n, dt, Fill::Plain, s + 3, false) } else { vec![] };
    Inputs { m, n, dt, x, r, w, b }
}

/// Runs `op` through the public API on `x` of `shape` (any rank ≥ 1 whose rows are the
/// inputs' rows).
fn run_api(op: Op, i: &Inputs, shape: &[usize]) -> kfuse::Result<Vec<Tensor>> {
    let x = tensor(&i.x, shape, i.dt);
    let r = (!i.r.is_empty()).then(|| tensor(&i.r, shape, i.dt));
    let w = (!i.w.is_empty()).then(|| tensor(&i.w, &[i.n], i.dt));
    let b = (!i.b.is_empty()).then(|| tensor(&i.b, &[i.n], i.dt));
    Ok(match op {
        Op::Sum => vec![ops::sum(&x, Dim::Last)?],
        Op::Mean => vec![ops::mean(&x, Dim::Last)?],
        Op::Max => vec![ops::max(&x, Dim::Last)?],
        Op::Min => vec![ops::min(&x, Dim::Last)?],
        Op::Softmax => vec![ops::softmax(&x)?],
        Op::LogSoftmax => vec![ops::log_softmax(&x)?],
        Op::Rms | Op::RmsW | Op::RmsWB => {
            let (y, rstd) = ops::rms_norm(&x, w.as_ref(), b.as_ref(), EPS)?;
            vec![y, rstd]
        }
        Op::AddRms | Op::AddRmsW => {
            let (s, y, rstd) = ops::add_rms_norm(&x, r.as_ref().unwrap(), w.as_ref(), EPS)?;
            vec![s, y, rstd]
        }
        Op::LayerNorm => {
            let (y, mean, rstd) = ops::layer_norm(&x, w.as_ref().unwrap(), b.as_ref().unwrap(), EPS)?;
            vec![y, mean, rstd]
        }
    })
}

/// Runs `op`'s kernel launcher on `[M, N]` inputs into NaN-poisoned outputs.
fn run_kernel(op: Op, i: &Inputs) -> kfuse::Result<Vec<Tensor>> {
    let (m, n, dt) = (i.m, i.n, i.dt);
    let d = dev();
    let x = tensor(&i.x, &[m, n], dt);
    let r = (!i.r.is_empty()).then(|| tensor(&i.r, &[m, n], dt));
    let w = (!i.w.is_empty()).then(|| tensor(&i.w, &[n], dt));
    let b = (!i.b.is_empty()).then(|| tensor(&i.b, &[n], dt));
    let mut outs: Vec<Tensor> = op
        .outputs()
        .iter()
        .enumerate()
        .map(|(o, kind)| {
            let shape = if op.row_shaped(o) { vec![m] } else { vec![m, n] };
            common::poisoned(&shape, if *kind == Out::Stat { DType::F32 } else { dt }, &d)
        })
        .collect();
    match (op, &mut outs[..]) {
        (Op::Sum, [o]) => k::row_sum(&x, o)?,
        (Op::Mean, [o]) => k::row_mean(&x, o)?,
        (Op::Max, [o]) => k::row_max(&x, o)?,
        (Op::Min, [o]) => k::row_min(&x, o)?,
        (Op::Softmax, [o]) => k::softmax(&x, o)?,
        (Op::LogSoftmax, [o]) => k::log_softmax(&x, o)?,
        (Op::Rms, [y, rs]) => k::rms_norm(&x, y, rs, EPS)?,
        (Op::RmsW, [y, rs]) => k::rms_norm_w(&x, w.as_ref().unwrap(), y, rs, EPS)?,
        (Op::RmsWB, [y, rs]) => k::rms_norm_wb(&x, w.as_ref().unwrap(), b.as_ref().unwrap(), y, rs, EPS)?,
        (Op::AddRms, [s, y, rs]) => k::add_rms_norm(&x, r.as_ref().unwrap(), s, y, rs, EPS)?,
        (Op::AddRmsW, [s, y, rs]) => k::add_rms_norm_w(&x, r.as_ref().unwrap(), w.as_ref().unwrap(), s, y, rs, EPS)?,
        (Op::LayerNorm, [y, mu, rs]) => k::layer_norm(&x, w.as_ref().unwrap(), b.as_ref().unwrap(), y, mu, rs, EPS)?,
        _ => unreachable!("outputs() and the launchers agree"),
    };
    Ok(outs)
}

/// One check: fresh inputs, both paths, every output against the reference.
fn check(op: Op, dt: DType, m: usize, n: usize, fill: Fill, api_shape: Option<&[usize]>) -> Result<f64, String> {
    let ctx = format!("{op:?} {dt} [{m}, {n}] {fill:?} {api_shape:?} (KFUSE_SEED={})", run_seed());
    let s = seed(&ctx);
    let i = inputs(op, m, n, dt, fill, s);
    let (want, scale) = reference(op, i.dt, i.m, i.n, &i.x, &i.r, &i.w, &i.b);
    let mut worst: f64 = 0.0;
    let shape = api_shape.map(|s| s.to_vec()).unwrap_or_else(|| vec![m, n]);
    for (path, outs) in [("api", run_api(op, &i, &shape)), ("kernel", run_kernel(op, &i))] {
        let outs = outs.map_err(|e| format!("{ctx} ({path}): {e}"))?;
        for (o, ((t, w), sc)) in outs.iter().zip(&want).zip(&scale).enumerate() {
            let tol = match op.outputs()[o] {
                _ if op.exact() => 0.0,
                Out::T => common::tolerance(dt),
                Out::Stat => 1e-5,
            };
            if path == "api" {
                let lead = &shape[..shape.len() - 1];
                let expect: Vec<usize> = if op.row_shaped(o) { lead.to_vec() } else { shape.clone() };
                if t.shape() != &expect[..] {
                    return Err(format!("{ctx} ({path}): output {o} has shape {:?}, expected {expect:?}", t.shape()));
                }
                let expect_dt = if op.outputs()[o] == Out::Stat { DType::F32 } else { dt };
                if t.dtype() != expect_dt {
                    return Err(format!("{ctx} ({path}): output {o} is {}, expected {expect_dt}", t.dtype()));
                }
            }
            let e = compare(&got(t), w, Some(sc), tol).map_err(|e| format!("{ctx} ({path}) output {o}: {e}"))?;
            worst = worst.max(e);
        }
    }
    Ok(worst)
}

// N = 1024 and 4096 are powers of two: the compiler drops the row masks there
// (`Schedule::full_exact`), so both kinds of code are checked.
const SHAPES: [(usize, usize); 11] = [(1, 1), (1, 3), (1, 1000), (1, 4097), (7, 1), (7, 3), (7, 1000), (7, 4097), (130, 257), (7, 1024), (5, 4096)];

fn run_table(ops: &[Op]) {
    let mut failures = Vec::new();
    let mut report = Vec::new();
    let mut checks = 0;
    for &op in ops {
        for dt in common::DTYPES {
            let mut worst: f64 = 0.0;
            let mut cases: Vec<(usize, usize, Fill)> = SHAPES.iter().map(|&(m, n)| (m, n, Fill::Plain)).collect();
            for fill in [Fill::Large, Fill::NegInf] {
                // several rows, so that no statistic's norm hinges on one cancelling row
                cases.extend([(7, 3, fill), (7, 1000, fill), (3, 4097, fill)]);
            }
            for (m, n, fill) in cases {
                checks += 1;
                match check(op, dt, m, n, fill, None) {
                    Ok(e) => worst = worst.max(e),
                    Err(e) => failures.push(e),
                }
            }
            report.push(format!("{:10} {:5} max rel err {worst:.2e}", format!("{op:?}"), dt.to_string()));
        }
    }
    println!("{} checks on {}\n{}", checks, dev().describe(), report.join("\n"));
    assert!(failures.is_empty(), "{} of {checks} checks failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn last_axis_reductions() {
    run_table(&[Op::Sum, Op::Mean, Op::Max, Op::Min]);
}

#[test]
fn softmax_and_log_softmax() {
    run_table(&[Op::Softmax, Op::LogSoftmax]);
}

#[test]
fn rms_norms() {
    run_table(&[Op::Rms, Op::RmsW, Op::RmsWB]);
}

#[test]
fn fused_add_rms_norms() {
    run_table(&[Op::AddRms, Op::AddRmsW]);
}

#[test]
fn layer_norm() {
    run_table(&[Op::LayerNorm]);
}

/// Long rows, where the scheduler splits a row over more threads, blocks or a cluster:
/// on the GPU only (the interpreter has no such plan, and takes long on these sizes).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn long_rows_on_the_gpu() {
    check_on_the_gpu("long rows", &common::DTYPES, &[(5, 16384), (3, 131072), (2, 262144), (2, 262147)]);
}

/// Cluster rows with more rows than the L2 prefetch distance (`prefetch_ahead`: 16
/// programs ahead in clusters of 8, 8 in clusters of 16), so that the first rows' blocks
/// do ask L2 for a later row — exactly at the tensor's last row, and with a masked
/// length whose last block's slice is cut at the row's end. The prefetch is a hint:
/// results must not change (compute-sanitizer's memcheck runs this test on the GPU host).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn long_rows_prefetched_ahead_on_the_gpu() {
    check_on_the_gpu("the prefetching cluster rows", &common::DTYPES, &[(17, 131072), (9, 262144), (17, 131000)]);
}

/// One row per op in bf16 of 131072 elements (a cluster of 8 blocks) and of 262144
/// (16 blocks, sm_90's non-portable size): the cluster kernels on a test small enough
/// for compute-sanitizer's racecheck (`.gpu/gpu-run.sh` runs it there in place of the
/// long-rows test).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn rows_in_clusters_of_8_and_16_on_the_gpu() {
    check_on_the_gpu("cluster rows", &[DType::BF16], &[(1, 131072), (1, 262144)]);
}

/// Long rows on the sm_80 path (`KFUSE_TARGET=sm_80`, on any GPU): without clusters the
/// compiler walks each row in chunks (`chunk_rows`), reading it once a pass. In a child
/// process of its own, where the variable is set.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn long_rows_in_chunks_on_the_sm80_path_on_the_gpu() {
    let name = "long_rows_in_chunks_on_the_sm80_path_on_the_gpu";
    if !common::isolation::alone(name, &[("KFUSE_TARGET", Some(std::ffi::OsStr::new("sm_80")))]) {
        return;
    }
    check_on_the_gpu("long rows in chunks", &common::DTYPES, &[(3, 131072), (2, 262144), (2, 262147), (17, 131000)]);
}

/// Every op in each of `dtypes` on each `(M, N)` against float64, on the GPU only (the
/// interpreter has no cluster plans and takes long on these sizes; the tests calling
/// this are ignored without `--cfg kfuse_gpu`); `what` names the rows in the message of
/// a machine without one.
fn check_on_the_gpu(what: &str, dtypes: &[DType], shapes: &[(usize, usize)]) {
    assert!(dev().is_gpu(), "{what} are checked on the GPU only, and there is none");
    let mut failures = Vec::new();
    for op in OPS {
        for &dt in dtypes {
            for &(m, n) in shapes {
                if let Err(e) = check(op, dt, m, n, Fill::Plain, None) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The norms over rows split across a cluster try for three blocks a multiprocessor (80
/// registers) before one (`rematerialize`: register-room attempts, the next loaded when
/// the driver's assembler spills): at the benchmark's long rows, 16-bit data, the kernel
/// loaded has no local memory (spills) and is one of the three-block attempts. Results
/// are checked against float64 by the long-rows tests.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn long_row_norms_take_three_blocks_without_spills() {
    let d = common::gpu();
    let mut failures = Vec::new();
    for dt in [DType::BF16, DType::F16] {
        for n in [131072usize, 262144] {
            let m = 2;
            let x = tensor(&values(m, n, dt, Fill::Plain, seed("three blocks x"), false), &[m, n], dt);
            let w = tensor(&values(1, n, dt, Fill::Plain, seed("three blocks w"), true), &[n], dt);
            let b = tensor(&values(1, n, dt, Fill::Plain, seed("three blocks b"), false), &[n], dt);
            let mut y = Tensor::empty(&[m, n], dt, &d).unwrap();
            let mut mean = Tensor::empty(&[m], DType::F32, &d).unwrap();
            let mut rstd = Tensor::empty(&[m], DType::F32, &d).unwrap();
            let runs = [
                ("rms_norm_w", k::rms_norm_w(&x, &w, &mut y, &mut rstd, EPS)),
                ("layer_norm", k::layer_norm(&x, &w, &b, &mut y, &mut mean, &mut rstd, EPS)),
            ];
            for (name, r) in runs {
                let what = format!("{name} {dt} {m}x{n}");
                match r.map(|l| l.build) {
                    Ok(Some(b)) => {
                        eprintln!("{what}: {} registers, {} bytes local, attempt {} of {}", b.registers, b.local_bytes, b.register_attempt.0 + 1, b.register_attempt.1);
                        if b.local_bytes > 0 {
                            failures.push(format!("{what}: {} bytes of local memory (spills)", b.local_bytes));
                        }
                        if b.register_attempt.1 != 3 || b.register_attempt.0 >= 2 || b.registers > 80 {
                            failures.push(format!("{what}: attempt {:?} with {} registers, not a three-block one", b.register_attempt, b.registers));
                        }
                    }
                    Ok(None) => failures.push(format!("{what}: no build information from a GPU launch")),
                    Err(e) => failures.push(format!("{what}: {e}")),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Ranks other than 2: rank 1 is one row, rank 3 flattens its leading dimensions, and the
/// per-row results keep the leading shape.
#[test]
fn any_rank_is_rows() {
    let mut failures = Vec::new();
    for op in OPS {
        for (m, n, shape) in [(1, 37, vec![37]), (6, 33, vec![2, 3, 33]), (4, 5, vec![2, 1, 2, 5])] {
            if let Err(e) = check(op, DType::BF16, m, n, Fill::Plain, Some(&shape)) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// All-`-inf` rows follow PyTorch: softmax and log-softmax give NaN rows; a row with
/// some `-inf` gives 0 (softmax) and `-inf` (log-softmax) there.
#[test]
fn negative_infinity_rows_follow_pytorch() {
    for dt in common::DTYPES {
        let v = [f64::NEG_INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY, 0.5, f64::NEG_INFINITY, 1.5];
        let x = tensor(&v, &[2, 3], dt);
        let s = got(&ops::softmax(&x).unwrap());
        let l = got(&ops::log_softmax(&x).unwrap());
        assert!(s[..3].iter().chain(&l[..3]).all(|a| a.is_nan()), "{dt}: {s:?} {l:?}");
        assert_eq!(s[4], 0.0, "{dt}: {s:?}");
        assert_eq!(l[4], f64::NEG_INFINITY, "{dt}: {l:?}");
        let e = (1.0f64).exp();
        let want = [1.0 / (1.0 + e), e / (1.0 + e)];
        assert!((s[3] - want[0]).abs() < 4e-3 && (s[5] - want[1]).abs() < 4e-3, "{dt}: {s:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Whole-tensor reductions.

#[derive(Clone, Copy, Debug)]
enum All {
    Sum,
    Mean,
    Max,
    Min,
}

fn all_op(op: All, x: &Tensor) -> kfuse::Result<Tensor> {
    match op {
        All::Sum => ops::sum(x, Dim::All),
        All::Mean => ops::mean(x, Dim::All),
        All::Max => ops::max(x, Dim::All),
        All::Min => ops::min(x, Dim::All),
    }
}

/// The size of the terms behind `all_ref` (see `compare`): Σ|v| for a sum, its mean for a
/// mean, `None` (the result itself) for max and min.
fn all_scale(op: All, v: &[f64]) -> Option<f64> {
    let abs_sum: f64 = v.iter().map(|a| a.abs()).sum();
    match op {
        All::Sum => Some(abs_sum),
        All::Mean => Some(abs_sum / v.len().max(1) as f64),
        All::Max | All::Min => None,
    }
}

fn all_ref(op: All, v: &[f64], dt: DType) -> f64 {
    match op {
        All::Sum => dt.round(v.iter().sum()),
        All::Mean => dt.round(v.iter().sum::<f64>() / v.len() as f64),
        All::Max => v.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        All::Min => v.iter().cloned().fold(f64::INFINITY, f64::min),
    }
}

fn check_all(op: All, dt: DType, shape: &[usize], fill: Fill) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    let ctx = format!("{op:?} all {dt} {shape:?} {fill:?} (KFUSE_SEED={})", run_seed());
    let s = seed(&ctx);
    let v = values(1, n, dt, fill, s, matches!(op, All::Sum | All::Mean));
    let x = tensor(&v, shape, dt);
    let out = all_op(op, &x).map_err(|e| format!("{ctx}: {e}"))?;
    if !out.shape().is_empty() || out.dtype() != dt {
        return Err(format!("{ctx}: result is {} {:?}, expected {dt} []", out.dtype(), out.shape()));
    }
    let tol = if matches!(op, All::Max | All::Min) { 0.0 } else { common::tolerance(dt) };
    compare(&got(&out), &[all_ref(op, &v, dt)], all_scale(op, &v).as_ref().map(std::slice::from_ref), tol).map_err(|e| format!("{ctx}: {e}"))?;
    Ok(out)
}

/// Sizes around the chunk (one stage, two stages), odd ranks, large values and `-inf`.
#[test]
fn whole_tensor_reductions() {
    let c = k::CHUNK;
    let mut failures = Vec::new();
    for op in [All::Sum, All::Mean, All::Max, All::Min] {
        for dt in common::DTYPES {
            let shapes: Vec<Vec<usize>> =
                vec![vec![], vec![1], vec![7], vec![1000], vec![c], vec![c + 1], vec![3, c + 5], vec![2, 3, 4097], vec![2 * c * 5 + 3]];
            for shape in &shapes {
                if let Err(e) = check_all(op, dt, shape, Fill::Plain) {
                    failures.push(e);
                }
            }
            for fill in [Fill::Large, Fill::NegInf] {
                if let Err(e) = check_all(op, dt, &[3 * c + 7], fill) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Three stages (more partials than one chunk): `2^24 + 4097` elements.
#[test]
fn whole_tensor_sum_in_three_stages() {
    let n: usize = (1 << 24) + 4097;
    assert!(n.div_ceil(k::CHUNK) > k::CHUNK);
    check_all(All::Sum, DType::BF16, &[n], Fill::Plain).unwrap();
    check_all(All::Max, DType::F32, &[n], Fill::Plain).unwrap();
}

/// The same bits on every run (no atomics, a fixed order of summation), over 2^22 elements.
#[test]
fn whole_tensor_reductions_are_deterministic() {
    for (op, dt) in [(All::Sum, DType::F32), (All::Mean, DType::BF16), (All::Max, DType::F16), (All::Min, DType::F32), (All::Mean, DType::F16)] {
        let n = 1 << 22;
        let v = values(1, n, dt, Fill::Plain, seed(&format!("deterministic {op:?} {dt}")), true);
        let x = tensor(&v, &[n], dt);
        let a = all_op(op, &x).unwrap().to_bytes().unwrap();
        let b = all_op(op, &x).unwrap().to_bytes().unwrap();
        assert_eq!(a, b, "{op:?} {dt}: two runs differ (KFUSE_SEED={})", run_seed());
        let want = all_ref(op, &v, dt);
        let tol = if matches!(op, All::Max | All::Min) { 0.0 } else { common::tolerance(dt) };
        compare(&got(&all_op(op, &x).unwrap()), &[want], all_scale(op, &v).as_ref().map(std::slice::from_ref), tol).unwrap_or_else(|e| panic!("{op:?} {dt} 2^22 (KFUSE_SEED={}): {e}", run_seed()));
    }
}

/// The chunk kernels on their own: one f32 partial per chunk, into a poisoned vector.
#[test]
fn chunk_kernels_write_every_partial() {
    let c = k::CHUNK;
    for dt in common::DTYPES {
        let n = 3 * c + 5;
        let v = values(1, n, dt, Fill::Plain, seed(&format!("chunks {dt}")), true);
        let x = tensor(&v, &[n], dt);
        let chunks: Vec<&[f64]> = v.chunks(c).collect();
        let sums: Vec<f64> = chunks.iter().map(|ch| ch.iter().sum::<f64>() / 2.0).collect();
        let maxs: Vec<f64> = chunks.iter().map(|ch| ch.iter().cloned().fold(f64::NEG_INFINITY, f64::max)).collect();
        let mins: Vec<f64> = chunks.iter().map(|ch| ch.iter().cloned().fold(f64::INFINITY, f64::min)).collect();
        let mut p = common::poisoned(&[4], DType::F32, &dev());
        k::sum_chunks(&x, &mut p, 2.0).unwrap();
        let abs_sums: Vec<f64> = chunks.iter().map(|ch| ch.iter().map(|a| a.abs()).sum::<f64>() / 2.0).collect();
        compare(&got(&p), &sums, Some(&abs_sums), 1e-5).unwrap_or_else(|e| panic!("sum_chunks {dt}: {e}"));
        let mut p = common::poisoned(&[4], DType::F32, &dev());
        k::max_chunks(&x, &mut p).unwrap();
        assert_eq!(got(&p), maxs, "max_chunks {dt}");
        let mut p = common::poisoned(&[4], DType::F32, &dev());
        k::min_chunks(&x, &mut p).unwrap();
        assert_eq!(got(&p), mins, "min_chunks {dt}");
    }
}

// ---------------------------------------------------------------------------------------
// Empty tensors and bad arguments.

fn t(shape: &[usize], dt: DType) -> Tensor {
    common::random_tensor(shape, dt, seed(&format!("{shape:?}")), 0.0, &dev()).0
}

#[test]
fn empty_inputs() {
    let d = DType::BF16;
    // M = 0: empty results, no launch
    let x = t(&[0, 8], d);
    assert_eq!(ops::sum(&x, Dim::Last).unwrap().shape(), &[0]);
    assert_eq!(ops::max(&x, Dim::Last).unwrap().shape(), &[0]);
    assert_eq!(ops::softmax(&x).unwrap().shape(), &[0, 8]);
    assert_eq!(ops::log_softmax(&t(&[2, 0, 5], d)).unwrap().shape(), &[2, 0, 5]);
    let (y, rstd) = ops::rms_norm(&x, Some(&t(&[8], d)), None, EPS).unwrap();
    assert_eq!((y.shape(), rstd.shape(), rstd.dtype()), (&[0usize, 8][..], &[0usize][..], DType::F32));
    let (s, y, rstd) = ops::add_rms_norm(&x, &t(&[0, 8], d), None, EPS).unwrap();
    assert_eq!((s.shape(), y.shape(), rstd.shape()), (&[0usize, 8][..], &[0usize, 8][..], &[0usize][..]));
    let (y, mean, rstd) = ops::layer_norm(&x, &t(&[8], d), &t(&[8], d), EPS).unwrap();
    assert_eq!((y.shape(), mean.shape(), rstd.shape()), (&[0usize, 8][..], &[0usize][..], &[0usize][..]));
    assert_eq!(ops::softmax(&t(&[0, 0], d)).unwrap().shape(), &[0, 0]);
    // N = 0: sums are 0, means NaN, max/min undefined
    let x = t(&[3, 0], d);
    assert_eq!(got(&ops::sum(&x, Dim::Last).unwrap()), vec![0.0; 3]);
    assert!(got(&ops::mean(&x, Dim::Last).unwrap()).iter().all(|v| v.is_nan()));
    for e in [ops::max(&x, Dim::Last).unwrap_err(), ops::min(&x, Dim::Last).unwrap_err()] {
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("no elements"), "{e}");
    }
    // whole-tensor reductions of nothing
    let x = t(&[4, 0], d);
    let s = ops::sum(&x, Dim::All).unwrap();
    assert_eq!((s.shape(), got(&s)), (&[][..], vec![0.0]));
    assert!(got(&ops::mean(&x, Dim::All).unwrap())[0].is_nan());
    let e = ops::max(&x, Dim::All).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("empty"), "{e}");
    // rows of no elements have no softmax or norm
    let x = t(&[3, 0], d);
    for e in [
        ops::softmax(&x).unwrap_err(),
        ops::log_softmax(&x).unwrap_err(),
        ops::rms_norm(&x, None, None, EPS).unwrap_err(),
        ops::add_rms_norm(&x, &x, None, EPS).unwrap_err(),
        ops::layer_norm(&x, &t(&[0], d), &t(&[0], d), EPS).unwrap_err(),
    ] {
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("last dimension of `x` is 0"), "{e}");
    }
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (f, h) = (DType::F32, DType::F16);
    let x = t(&[4, 6], f);
    // scalars have no rows
    let e = ops::softmax(&t(&[], f)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("rank 0"), "{e}");
    assert!(ops::sum(&t(&[], f), Dim::All).unwrap().shape().is_empty());
    // strided inputs are taken (tests/strided_ops.rs checks their values); their shapes
    // still have to fit: a transposed [6, 4] residual is [4, 6]
    let xt = t(&[6, 4], f).t();
    assert_eq!(ops::softmax(&xt).unwrap().shape(), &[4, 6]);
    assert!(ops::add_rms_norm(&x, &xt, None, EPS).is_ok());
    let e = ops::add_rms_norm(&x, &t(&[4, 6], f).t(), None, EPS).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("`r`"), "{e}");
    // weights: shape [N], the input's dtype
    let e = ops::rms_norm(&x, Some(&t(&[5], f)), None, EPS).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("[5]") && e.to_string().contains("[6]"), "{e}");
    let e = ops::rms_norm(&x, Some(&t(&[6], h)), None, EPS).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)) && e.to_string().contains("f16"), "{e}");
    let e = ops::layer_norm(&x, &t(&[6], f), &t(&[1, 6], f), EPS).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("`b`"), "{e}");
    let e = ops::layer_norm(&x, &t(&[6], h), &t(&[6], f), EPS).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)) && e.to_string().contains("`w`"), "{e}");
    // a bias needs a weight
    let e = ops::rms_norm(&x, None, Some(&t(&[6], f)), EPS).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("weight"), "{e}");
    // the residual matches x
    let e = ops::add_rms_norm(&x, &t(&[4, 5], f), None, EPS).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("`r`"), "{e}");
    let e = ops::add_rms_norm(&x, &t(&[4, 6], h), None, EPS).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)), "{e}");
    // eps
    for eps in [-1.0, f32::NAN, f32::INFINITY] {
        let e = ops::rms_norm(&x, None, None, eps).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("eps"), "{e}");
        let e = ops::layer_norm(&x, &t(&[6], f), &t(&[6], f), eps).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("eps"), "{e}");
    }
    // kernel level: the statistics are f32, the shapes agree
    let mut y = t(&[4, 6], f);
    let mut bad = t(&[4], h);
    let e = k::rms_norm(&x, &mut y, &mut bad, EPS).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)), "{e}");
    let mut short = t(&[3], f);
    let e = k::rms_norm(&x, &mut y, &mut short, EPS).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)), "{e}");
}

/// A weight on the CPU for rows on the GPU is a device mismatch (the CPU-only argument
/// checks are `bad_arguments_are_clear_errors`).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn rows_and_a_weight_on_two_devices_are_a_mismatch() {
    let f = DType::F32;
    let d = common::gpu();
    let x = common::random_tensor(&[4, 6], f, 2, 0.0, &d).0;
    let w_cpu = common::random_tensor(&[6], f, 1, 0.0, &Device::cpu()).0;
    let e = ops::rms_norm(&x, Some(&w_cpu), None, EPS).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch(_)), "{e}");
}

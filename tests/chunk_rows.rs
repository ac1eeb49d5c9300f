//! Rows too long for one block, walked in chunks (`kfuse_codegen::passes::chunk_rows`,
//! issue 20 item 8), proved without a GPU:
//!
//! - on the interpreter, every row kernel (the ops' and the user kernels the sm_80 path
//!   refused) rewritten with a small chunk (256: rows of 1000 take four chunks, the last
//!   partial; rows of 77 one partial chunk; rows of 256 one whole) gives the same outputs
//!   as the kernel itself, element by element (bit for bit where no sum is involved), and
//!   both agree with a float64 reference;
//! - the rewrite is what the sm_80 path compiles at 131072 and 262144 columns: NVRTC and
//!   `ptxas -v` without spills (`tests/gpu_coverage.rs` compiles the user kernels too).
//!
//! Inputs are random (fixed seed, printed), never 0; `BM` is 2, so a program of 3 rows
//! also holds an invalid one.

mod common;

#[path = "kernels/loops.rs"]
mod kernels_loops;
#[path = "kernels/masks.rs"]
mod kernels_masks;
#[path = "kernels/user_kernels.rs"]
mod kernels_user_kernels;

use std::collections::BTreeMap;

use kfuse::codegen::passes::chunk_rows::chunk_kernel;
use kfuse::codegen::{Spec, Target};
use kfuse::ir::interp::{self, Arg, TensorMut, TensorRef};
use kfuse::ir::{Kernel, KernelDef, ParamKind, ShapeSym};
use kfuse::ops::kernels as k;
use kfuse::DType;
use rand::{Rng, SeedableRng};

const SEED: u64 = 0x0c4a_2026;
const CHUNK: u32 = 256;
/// The `eps` scalar of the norms (the user kernel `weighted_rms` has its own 1e-6).
const EPS: f64 = 1e-5;
/// What an output holds before the kernel runs: an element no store reaches keeps it.
const POISON: f64 = 1232.0;

/// A row kernel, the passes over its row the rewrite takes, and whether its outputs
/// involve no sum (then the chunked kernel's must be bit for bit the same).
struct Case {
    def: &'static KernelDef,
    passes: u32,
    exact: bool,
}

fn cases() -> Vec<Case> {
    let c = |def, passes, exact| Case { def, passes, exact };
    vec![
        c(&k::softmax::DEF, 3, false),
        c(&k::log_softmax::DEF, 3, false),
        c(&k::rms_norm::DEF, 2, false),
        c(&k::rms_norm_w::DEF, 2, false),
        c(&k::rms_norm_wb::DEF, 2, false),
        c(&k::add_rms_norm::DEF, 2, false),
        c(&k::add_rms_norm_w::DEF, 2, false),
        c(&k::layer_norm::DEF, 3, false),
        c(&k::row_sum::DEF, 1, false),
        c(&k::row_mean::DEF, 1, false),
        c(&k::row_max::DEF, 1, true),
        c(&k::row_min::DEF, 1, true),
        c(&kernels_user_kernels::softmax_rows::DEF, 3, false),
        c(&kernels_user_kernels::center_rows::DEF, 2, false),
        c(&kernels_user_kernels::weighted_rms::DEF, 2, false),
        c(&kernels_user_kernels::row_range::DEF, 1, true),
        c(&kernels_masks::causal_softmax::DEF, 3, false),
        c(&kernels_loops::long_row_sums::DEF, 1, false),
    ]
}

fn sym(k: &Kernel, name: &str) -> ShapeSym {
    ShapeSym(k.shape_syms.iter().position(|s| s == name).unwrap_or_else(|| panic!("{}: no shape symbol {name}", k.name)) as u32)
}

/// Tensors of a run: each parameter's shape and values (inputs random, outputs poisoned).
struct Run {
    shapes: Vec<Vec<usize>>,
    values: Vec<Vec<f64>>,
}

fn inputs(k: &Kernel, sizes: &BTreeMap<&str, usize>, rng: &mut rand::rngs::StdRng) -> Run {
    let mut run = Run { shapes: Vec::new(), values: Vec::new() };
    for p in &k.params {
        let shape: Vec<usize> = p.dims().iter().map(|&s| sizes[k.shape_name(s)]).collect();
        let n: usize = shape.iter().product();
        let v = match p.kind {
            ParamKind::Tensor { output: true, .. } => vec![POISON; n],
            ParamKind::Tensor { output: false, .. } => (0..n)
                .map(|_| {
                    // never 0: a magnitude in [0.1, 2), either sign
                    let m: f64 = rng.random_range(0.1..2.0);
                    p.dtype.round(if rng.random_bool(0.5) { m } else { -m })
                })
                .collect(),
            ParamKind::Scalar => vec![EPS],
        };
        run.shapes.push(shape);
        run.values.push(v);
    }
    run
}

/// Runs `k` on the interpreter; the outputs' values, by parameter (inputs: empty).
fn interpret(k: &Kernel, run: &Run, tiles: &BTreeMap<String, u32>) -> Vec<Vec<f64>> {
    let mut bufs: Vec<Vec<u8>> = k
        .params
        .iter()
        .zip(&run.values)
        .map(|(p, v)| {
            let mut b = vec![0u8; v.len() * p.dtype.size_bytes()];
            if p.is_tensor() {
                for (i, &x) in v.iter().enumerate() {
                    p.dtype.write(&mut b, i, x);
                }
            }
            b
        })
        .collect();
    let strides: Vec<Vec<isize>> = run.shapes.iter().map(|s| interp::contiguous_strides(s)).collect();
    let mut args: Vec<Arg> = Vec::new();
    for (((p, b), shape), st) in k.params.iter().zip(bufs.iter_mut()).zip(&run.shapes).zip(&strides) {
        args.push(match p.kind {
            ParamKind::Scalar => Arg::Scalar(EPS),
            ParamKind::Tensor { output: false, .. } => Arg::In(TensorRef { dtype: p.dtype, shape, strides: st, offset: 0, data: b }),
            ParamKind::Tensor { output: true, .. } => Arg::Out(TensorMut { dtype: p.dtype, shape, strides: st, offset: 0, data: b }),
        });
    }
    interp::run(k, &mut args, &interp::Options::with_tiles(tiles.clone())).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    drop(args);
    k.params
        .iter()
        .zip(&bufs)
        .map(|(p, b)| if p.is_output() { (0..b.len() / p.dtype.size_bytes()).map(|i| p.dtype.read(b, i)).collect() } else { Vec::new() })
        .collect()
}

/// Float64 references of the kernels' outputs, by parameter name.
fn reference(name: &str, run: &Run, k: &Kernel, sizes: &BTreeMap<&str, usize>) -> BTreeMap<&'static str, Vec<f64>> {
    let arg = |n: &str| &run.values[k.params.iter().position(|p| p.name == n).unwrap()];
    let (m, n) = (sizes["M"], sizes["N"]);
    let dt = k.params[0].dtype;
    let rows = |v: &[f64]| v.chunks(n).map(|r| r.to_vec()).collect::<Vec<_>>();
    let mean = |r: &[f64]| r.iter().sum::<f64>() / r.len() as f64;
    let max = |r: &[f64]| r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let min = |r: &[f64]| r.iter().cloned().fold(f64::INFINITY, f64::min);
    let softmax = |r: &[f64]| {
        let mx = max(r);
        let s: f64 = r.iter().map(|v| (v - mx).exp()).sum();
        r.iter().map(|v| (v - mx).exp() / s).collect::<Vec<_>>()
    };
    let rstd = |r: &[f64], eps: f64| 1.0 / (r.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt();
    let one = || vec![1.0; n];
    let zero = || vec![0.0; n];
    let mut out = BTreeMap::new();
    let x = rows(arg("x"));
    match name {
        "softmax" | "softmax_rows" => {
            out.insert("out", x.iter().flat_map(|r| softmax(r)).collect());
        }
        "causal_softmax" => {
            // column c of row i takes part when c <= i
            let v: Vec<f64> = x
                .iter()
                .enumerate()
                .flat_map(|(i, r)| {
                    let s = softmax(&r[..=i.min(n - 1)]);
                    (0..n).map(move |c| if c <= i { s[c] } else { 0.0 })
                })
                .collect();
            out.insert("out", v);
        }
        "log_softmax" => {
            out.insert(
                "out",
                x.iter()
                    .flat_map(|r| {
                        let mx = max(r);
                        let l = r.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
                        r.iter().map(move |v| v - mx - l)
                    })
                    .collect(),
            );
        }
        "rms_norm" | "rms_norm_w" | "rms_norm_wb" | "add_rms_norm" | "add_rms_norm_w" | "weighted_rms" => {
            let eps = if name == "weighted_rms" { 1e-6 } else { EPS };
            let w = if name.ends_with("_w") || name.ends_with("_wb") || name == "weighted_rms" { arg("w").clone() } else { one() };
            let b = if name.ends_with("_wb") { arg("b").clone() } else { zero() };
            let s: Vec<Vec<f64>> = if name.starts_with("add_") {
                let r = rows(arg("r"));
                x.iter().zip(&r).map(|(a, b)| a.iter().zip(b).map(|(p, q)| dt.round(p + q)).collect()).collect()
            } else {
                x.clone()
            };
            let rs: Vec<f64> = s.iter().map(|r| rstd(r, eps)).collect();
            let y: Vec<f64> = s.iter().zip(&rs).flat_map(|(r, q)| r.iter().zip(&w).zip(&b).map(move |((v, w), b)| v * q * w + b)).collect();
            out.insert(if name == "weighted_rms" { "out" } else { "y" }, y);
            if name != "weighted_rms" {
                out.insert("rstd", rs);
            }
            if name.starts_with("add_") {
                out.insert("s", s.concat());
            }
        }
        "layer_norm" => {
            let (w, b) = (arg("w"), arg("b"));
            let mu: Vec<f64> = x.iter().map(|r| mean(r)).collect();
            let rs: Vec<f64> = x.iter().zip(&mu).map(|(r, m)| 1.0 / (r.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n as f64 + EPS).sqrt()).collect();
            let y = x.iter().zip(mu.iter().zip(&rs)).flat_map(|(r, (m, q))| r.iter().zip(w).zip(b).map(move |((v, w), b)| (v - m) * q * w + b)).collect();
            out.insert("y", y);
            out.insert("mean", mu);
            out.insert("rstd", rs);
        }
        "row_sum" => {
            out.insert("out", x.iter().map(|r| r.iter().sum()).collect());
        }
        "row_mean" => {
            out.insert("out", x.iter().map(|r| mean(r)).collect());
        }
        "row_max" => {
            out.insert("out", x.iter().map(|r| max(r)).collect());
        }
        "row_min" => {
            out.insert("out", x.iter().map(|r| min(r)).collect());
        }
        "row_range" => {
            out.insert("out", x.iter().map(|r| dt.round(max(r) - min(r))).collect());
        }
        "center_rows" => {
            out.insert("out", x.iter().flat_map(|r| {
                let mu = mean(r);
                r.iter().map(move |v| v - mu)
            }).collect());
        }
        "long_row_sums" => {
            // x: [R, M, N]; out[i] = Σ_r Σ_n x[r, i, n]
            let per: Vec<f64> = x.iter().map(|r| r.iter().sum()).collect();
            out.insert("out", (0..m).map(|i| (0..sizes["R"]).map(|r| per[r * m + i]).sum()).collect());
        }
        other => panic!("no reference for {other}"),
    }
    out
}

/// Largest `|a - b|` over the largest `|b|` (0 when both are 0).
fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |s, v| s.max(v.abs()));
    let d = a.iter().zip(b).fold(0.0f64, |s, (x, y)| if x.is_nan() || y.is_nan() { f64::INFINITY } else { s.max((x - y).abs()) });
    if scale == 0.0 {
        d
    } else {
        d / scale
    }
}

fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F32 => 2e-6,
        DType::F16 => 1e-3,
        _ => 8e-3,
    }
}

/// The chunked kernel and the kernel itself agree on the interpreter, and with float64.
#[test]
fn chunked_rows_match_the_whole_rows_on_the_interpreter() {
    println!("seed {SEED:#x}, chunks of {CHUNK}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    let tiles: BTreeMap<String, u32> = [("BM".to_string(), 2)].into();
    let mut failures = Vec::new();
    let mut checks = 0;
    for case in cases() {
        for dt in common::DTYPES {
            let kern = (case.def.build)(&[dt]).unwrap();
            let (chunked, passes) = chunk_kernel(&kern, sym(&kern, "N"), CHUNK).unwrap_or_else(|e| panic!("{} {dt}: {e}", case.def.name));
            assert_eq!(passes, case.passes, "{} {dt}: passes\n{}", case.def.name, kfuse::ir::print::print(&chunked));
            let printed = kfuse::ir::print::print(&chunked);
            assert!(!printed.contains("N!"), "{} {dt}: a tile still spans the row\n{printed}", case.def.name);
            if case.def.name == "softmax" && dt == DType::F32 {
                println!("{printed}");
            }
            for (m, n) in [(3usize, 1000usize), (5, 256), (3, 77), (1, 1)] {
                let sizes: BTreeMap<&str, usize> = [("M", m), ("N", n), ("R", 3)].into();
                let run = inputs(&kern, &sizes, &mut rng);
                let whole = interpret(&kern, &run, &tiles);
                let parts = interpret(&chunked, &run, &tiles);
                let want = reference(case.def.name, &run, &kern, &sizes);
                for (i, p) in kern.params.iter().enumerate().filter(|(_, p)| p.is_output()) {
                    checks += 1;
                    let what = format!("{} {dt} {m}x{n} `{}`", case.def.name, p.name);
                    let (a, b) = (&parts[i], &whole[i]);
                    // the same elements written
                    if a.iter().zip(b).any(|(x, y)| (*x == POISON) != (*y == POISON)) || b.contains(&POISON) {
                        failures.push(format!("{what}: elements written differ (or some not written)"));
                        continue;
                    }
                    let tol = tolerance(p.dtype);
                    if case.exact {
                        if a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits()) {
                            failures.push(format!("{what}: not bit for bit the whole row's"));
                        }
                    } else if max_rel(a, b) > tol {
                        failures.push(format!("{what}: chunked vs whole rows {:.2e} > {tol:.0e}", max_rel(a, b)));
                    }
                    let r = &want[p.name.as_str()];
                    // 16-bit outputs carry their own rounding; the f32 ones a float sum's
                    let tol = if p.dtype == DType::F32 { 2e-5 } else { tol };
                    let e = max_rel(a, r);
                    if e > tol {
                        failures.push(format!("{what}: chunked vs float64 {e:.2e} > {tol:.0e}"));
                    }
                }
            }
        }
    }
    println!("{checks} outputs compared");
    assert!(failures.is_empty(), "{} of {checks} failed:\n{}", failures.len(), failures.join("\n"));
}

/// On sm_80 the row kernels at 131072 columns (a length with masks) and 262144 (an
/// exact power of two) are walked in chunks, and compile and assemble without spills.
#[test]
fn long_rows_compile_for_sm80_in_chunks_without_spills() {
    let mut failures = Vec::new();
    for case in cases() {
        for dt in [DType::BF16, DType::F32] {
            let kern = (case.def.build)(&[dt]).unwrap();
            for (cols, exact) in [(131072u32, false), (262144, true)] {
                let mut spec: Spec = common::snapshot_spec(case.def);
                let n = spec.shape_pow2.len();
                spec.shape_pow2 = (0..n).map(|i| if i + 1 == n { cols } else { 4 }).collect();
                spec.shape_div = if exact { spec.shape_pow2.clone() } else { Vec::new() };
                let what = format!("{}_{dt}_{cols}", case.def.name);
                match common::compile_assembled(&kern, &spec, &Target::sm80(), &what) {
                    Ok((e, regs, spill)) => {
                        let line = format!("walked in chunks of 16384, {} pass", case.passes);
                        println!("{what}: {} threads, {regs} registers, {spill} bytes of spills", e.block_threads);
                        if !e.ir.contains(&line) || e.cluster_x != 1 || e.plan.row_chunks.map(|c| c.2) != Some(case.passes) {
                            failures.push(format!("{what}: not walked in chunks ({line}):\n{}", e.ir));
                        }
                        if spill > 0 {
                            failures.push(format!("{what}: {spill} bytes of spills ({regs} registers)"));
                        }
                    }
                    Err(e) => failures.push(format!("{what}: {}", e.0)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Compiling a chunked kernel again gives the same source: the rewrite frees the row's
/// ops in op order (the graph reuses freed slots, so a hash map's order had made the
/// value names of two compiles of one kernel differ).
#[test]
fn chunked_kernels_compile_to_the_same_source_every_time() {
    // (the case that showed it: rows of 2^24 read through a transposed view)
    for def in [&k::add_rms_norm::DEF, &k::add_rms_norm_w::DEF, &k::layer_norm::DEF, &k::softmax::DEF] {
        for dt in [DType::F16, DType::F32] {
            let kern = (def.build)(&[dt]).unwrap();
            for (cols, rows, transposed) in [(131072u32, 4u32, false), (1 << 24, 4096, true)] {
                let mut spec: Spec = common::snapshot_spec(def);
                let n = spec.shape_pow2.len();
                spec.shape_pow2 = (0..n).map(|i| if i + 1 == n { cols } else { rows }).collect();
                if transposed {
                    spec.tensors[0] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
                }
                // the source, or the refusal (each compile must give the same either way)
                let outcome = || kfuse::codegen::compile(&kern, &spec, &Target::sm80()).map(|e| e.source).unwrap_or_else(|e| format!("refused: {e}"));
                let first = outcome();
                assert!(transposed || !first.starts_with("refused"), "{} {dt} {cols}: {first}", def.name);
                for _ in 0..8 {
                    assert!(outcome() == first, "{} {dt} {cols}: the outcome differs between compiles", def.name);
                }
            }
        }
    }
}

//! Strided inputs to every op (issue 23, item 5): transposed views (`x.t()` of an `[N, M]`
//! tensor), views narrowed along each axis, every other element of a wider tensor, and
//! views of rank 3 and 4 whose dimensions do not merge; strided operands mixed with
//! contiguous ones. Each result is checked against a float64 reference computed on the
//! logical values (read element by element through the strides on the host), with the
//! measures of `tests/rows.rs` and `tests/common` (`tolerance`, `rel_err`, `err_against`),
//! and for its shape, dtype and contiguity. bf16, f16 and f32; fixed seeds; on the best
//! device (the CPU interpreter in CI, the GPU on the GPU host).
//!
//! Also, without a GPU: the strided specializations of the kernels behind these ops
//! compile with NVRTC and assemble with ptxas for sm_80 and sm_90a, and the GPU's tile
//! plans for strided launches give the right values on the interpreter.

// `!(e <= tol)` on purpose: a NaN error fails
#![allow(clippy::neg_cmp_op_on_partial_ord)]

mod common;

use common::row_ops::{reference, Op, Out, EPS, OPS};

use kfuse::codegen::Target;
use kfuse::ops::kernels as k;
use kfuse::ops::{self, Dim, Freqs, Positions, RopeLayout, RopeOptions};
use kfuse::runtime::{gpu_plan_tiles, launch_interpreter, spec_for, Arg, Scalar};
use kfuse::{DType, Device, Error, Tensor};

fn dev() -> Device {
    let d = Device::best();
    if !d.is_gpu() && common::gpu_required() {
        panic!("a GPU is required here (--cfg kfuse_gpu or KFUSE_REQUIRE_GPU=1) but none was found");
    }
    d
}

/// Logical `[M, N]` shapes: one element, odd sizes, more rows than a block, a tall one.
const SHAPES: [(usize, usize); 4] = [(1, 1), (7, 33), (130, 257), (33, 7)];

/// How a view lies over its storage.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// `x.t()` of an `[N, M]` tensor: strides `[1, M]`.
    Transposed,
    /// Rows `2..2 + M` of an `[M + 3, N]` tensor (contiguous, with an offset).
    NarrowRows,
    /// Columns `3..3 + N` of an `[M, N + 5]` tensor: strides `[N + 5, 1]`.
    NarrowCols,
    /// A transposed view narrowed along both axes: strides `[1, M + 2]`, an offset.
    TransposedNarrowed,
    /// Every other element of an `[M, N, 2]` tensor: strides `[2N, 2]`.
    EveryOther,
    /// `[B, S, N]` permuted from `[S, B, N]`: `B` and `S` do not merge.
    Permuted3,
    /// `[B, S, N]` columns of a `[B, S, N + 3]` tensor: `B` and `S` merge.
    ColSlice3,
    /// `[2, 3, 4, N]` permuted from `[4, 2, N, 3]`: nothing merges, innermost stride 3.
    Permuted4,
}

const LAYOUTS_2D: [Layout; 5] = [Layout::Transposed, Layout::NarrowRows, Layout::NarrowCols, Layout::TransposedNarrowed, Layout::EveryOther];

/// The logical shapes of the rank-3 and rank-4 layouts (last dimension odd).
fn high_rank() -> Vec<(Layout, Vec<usize>)> {
    vec![(Layout::Permuted3, vec![3, 5, 33]), (Layout::ColSlice3, vec![3, 5, 33]), (Layout::Permuted4, vec![2, 3, 4, 7]), (Layout::Permuted4, vec![2, 3, 4, 130])]
}

/// A tensor and its logical values.
type Vals = (Tensor, Vec<f64>);

/// A view of logical shape `shape` laid out as `layout` over fresh random storage (values
/// in ±3, at least `floor` from zero, rounded to `dt`), and its logical values.
fn strided(layout: Layout, shape: &[usize], dt: DType, seed: u64, floor: f64) -> (Tensor, Vec<f64>) {
    let base = |s: &[usize]| common::random_tensor(s, dt, seed, floor, &dev()).0;
    let v = match (layout, shape) {
        (Layout::Transposed, &[m, n]) => base(&[n, m]).t(),
        (Layout::NarrowRows, &[m, n]) => base(&[m + 3, n]).narrow(0, 2, m).unwrap(),
        (Layout::NarrowCols, &[m, n]) => base(&[m, n + 5]).narrow(1, 3, n).unwrap(),
        (Layout::TransposedNarrowed, &[m, n]) => base(&[n + 4, m + 2]).t().narrow(0, 1, m).unwrap().narrow(1, 2, n).unwrap(),
        (Layout::EveryOther, &[m, n]) => base(&[m, n, 2]).narrow(2, 1, 1).unwrap().view(&[m, n]).unwrap(),
        (Layout::Permuted3, &[b, s, n]) => base(&[s, b, n]).permute(&[1, 0, 2]).unwrap(),
        (Layout::ColSlice3, &[b, s, n]) => base(&[b, s, n + 3]).narrow(2, 1, n).unwrap(),
        (Layout::Permuted4, &[2, 3, 4, n]) => base(&[4, 2, n, 3]).permute(&[1, 3, 0, 2]).unwrap(),
        _ => panic!("no {layout:?} view of shape {shape:?}"),
    };
    assert_eq!(v.shape(), shape, "{layout:?}");
    // the logical values, read on the host through the view's strides
    let vals = v.to_vec_f64().unwrap();
    (v, vals)
}

fn contiguous(shape: &[usize], dt: DType, seed: u64, floor: f64) -> (Tensor, Vec<f64>) {
    common::random_tensor(shape, dt, seed, floor, &dev())
}

/// A fixed seed per check.
fn seed(what: &str) -> u64 {
    what.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01B3))
}

/// `t` is a new contiguous tensor of `shape` and `dt`.
fn check_out(t: &Tensor, shape: &[usize], dt: DType) -> Result<(), String> {
    if t.shape() != shape || t.dtype() != dt || !t.is_contiguous() {
        return Err(format!("output is {} {:?} strides {:?}, expected a contiguous {dt} {shape:?}", t.dtype(), t.shape(), t.strides()));
    }
    Ok(())
}

fn finish(what: &str, checks: usize, failures: Vec<String>) {
    println!("{what}: {checks} checks on {}", dev().describe());
    assert!(failures.is_empty(), "{what}: {} of {checks} checks failed:\n{}", failures.len(), failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Elementwise ops.

/// The elementwise ops of `common::ops()` (name, kind with the API call and reference).
fn elementwise() -> Vec<common::OpCase> {
    common::ops().into_iter().filter(|c| matches!(c.kind, common::Kind::Binary(..) | common::Kind::Unary(..))).collect()
}

/// One elementwise check: `a` (and `b`) with their logical values.
fn check_elementwise(case: &common::OpCase, dt: DType, a: &Vals, b: &Vals, ctx: &str) -> Result<f64, String> {
    let shape = a.0.shape().to_vec();
    let (out, want): (Tensor, Vec<f64>) = match case.kind {
        common::Kind::Binary(f, r) => (f(&a.0, &b.0).map_err(|e| format!("{ctx}: {e}"))?, a.1.iter().zip(&b.1).map(|(x, y)| dt.round(r(*x, *y))).collect()),
        common::Kind::Unary(f, r) => (f(&a.0).map_err(|e| format!("{ctx}: {e}"))?, a.1.iter().map(|x| dt.round(r(*x))).collect()),
        _ => unreachable!(),
    };
    check_out(&out, &shape, dt).map_err(|e| format!("{ctx}: {e}"))?;
    let e = common::rel_err(&out.to_vec_f64().unwrap(), &want);
    if e <= common::tolerance(dt) {
        Ok(e)
    } else {
        Err(format!("{ctx}: relative error {e:.3e} > {:.1e}", common::tolerance(dt)))
    }
}

/// Every elementwise op on strided views: one strided operand and one contiguous (either
/// way round), two strided differently, and views of rank 3 and 4.
#[test]
fn elementwise_ops_read_strided_views() {
    let (mut failures, mut checks) = (Vec::new(), 0);
    let mut cases: Vec<(Layout, Vec<usize>)> = SHAPES.iter().flat_map(|&(m, n)| LAYOUTS_2D.map(|l| (l, vec![m, n]))).collect();
    cases.extend(high_rank());
    for case in elementwise() {
        let binary = matches!(case.kind, common::Kind::Binary(..));
        let floor = if case.name == "div" { 0.25 } else { 0.0 };
        for dt in common::DTYPES {
            let mut worst: f64 = 0.0;
            for (layout, shape) in &cases {
                let ctx = format!("{} {dt} {layout:?} {shape:?}", case.name);
                let s = seed(&ctx);
                let sa = strided(*layout, shape, dt, s, 0.0);
                let sb = strided(*layout, shape, dt, s + 1, floor);
                let ca = contiguous(shape, dt, s + 2, 0.0);
                let cb = contiguous(shape, dt, s + 3, floor);
                // two layouts at once: the other operand transposed (2-D) or permuted
                let other = match layout {
                    Layout::Permuted3 => Some(strided(Layout::ColSlice3, shape, dt, s + 4, floor)),
                    Layout::ColSlice3 => Some(strided(Layout::Permuted3, shape, dt, s + 4, floor)),
                    Layout::Permuted4 => None,
                    _ => Some(strided(Layout::Transposed, shape, dt, s + 4, floor)),
                };
                let mut runs: Vec<(&str, &Vals, &Vals)> = vec![("strided", &sa, &cb)];
                if binary {
                    runs.push(("contiguous, strided", &ca, &sb));
                    runs.push(("both strided", &sa, &sb));
                    if let Some(o) = &other {
                        runs.push(("mixed layouts", &sa, o));
                    }
                }
                for (what, a, b) in runs {
                    checks += 1;
                    match check_elementwise(&case, dt, a, b, &format!("{ctx} ({what})")) {
                        Ok(e) => worst = worst.max(e),
                        Err(e) => failures.push(e),
                    }
                }
            }
            println!("{:10} {:5} max rel err {worst:.2e}", case.name, dt.to_string());
        }
    }
    finish("elementwise", checks, failures);
}

/// `copy` and `contiguous` of views of any rank: exact, contiguous, and `contiguous` of a
/// contiguous view is the view itself.
#[test]
fn copies_of_strided_views_of_any_rank() {
    let (mut failures, mut checks) = (Vec::new(), 0);
    for dt in common::DTYPES {
        let mut cases: Vec<(Layout, Vec<usize>)> = SHAPES.iter().flat_map(|&(m, n)| LAYOUTS_2D.map(|l| (l, vec![m, n]))).collect();
        cases.extend(high_rank());
        for (layout, shape) in cases {
            let ctx = format!("copy {dt} {layout:?} {shape:?}");
            let (x, xv) = strided(layout, &shape, dt, seed(&ctx), 0.0);
            for (name, f) in [("copy", ops::copy as fn(&Tensor) -> kfuse::Result<Tensor>), ("contiguous", ops::contiguous)] {
                checks += 1;
                let r = f(&x).map_err(|e| e.to_string()).and_then(|c| {
                    check_out(&c, &shape, dt)?;
                    if c.to_vec_f64().unwrap() != xv {
                        return Err("values differ".into());
                    }
                    if name == "contiguous" && x.is_contiguous() != c.same_storage(&x) {
                        return Err("a contiguous view must come back as itself, a strided one as a copy".into());
                    }
                    Ok(())
                });
                if let Err(e) = r {
                    failures.push(format!("{ctx} ({name}): {e}"));
                }
            }
        }
        // rank 5, dimensions of size 1 among them
        checks += 1;
        let (b, _) = contiguous(&[2, 1, 3, 4, 5], dt, 9, 0.0);
        let x = b.permute(&[3, 1, 4, 0, 2]).unwrap();
        let c = ops::copy(&x).unwrap();
        if check_out(&c, &[4, 1, 5, 2, 3], dt).is_err() || c.to_vec_f64().unwrap() != x.to_vec_f64().unwrap() {
            failures.push(format!("copy {dt} rank 5: wrong result"));
        }
    }
    finish("copies", checks, failures);
}

// ---------------------------------------------------------------------------------------
// Row ops and reductions: the references of tests/rows.rs, on logical values.


/// Runs `op` through the public API.
fn run_api(op: Op, x: &Tensor, r: Option<&Tensor>, w: Option<&Tensor>, b: Option<&Tensor>) -> kfuse::Result<Vec<Tensor>> {
    Ok(match op {
        Op::Sum => vec![ops::sum(x, Dim::Last)?],
        Op::Mean => vec![ops::mean(x, Dim::Last)?],
        Op::Max => vec![ops::max(x, Dim::Last)?],
        Op::Min => vec![ops::min(x, Dim::Last)?],
        Op::Softmax => vec![ops::softmax(x)?],
        Op::LogSoftmax => vec![ops::log_softmax(x)?],
        Op::Rms | Op::RmsW | Op::RmsWB => {
            let (y, q) = ops::rms_norm(x, w, b, EPS)?;
            vec![y, q]
        }
        Op::AddRms | Op::AddRmsW => {
            let (s, y, q) = ops::add_rms_norm(x, r.unwrap(), w, EPS)?;
            vec![s, y, q]
        }
        Op::LayerNorm => {
            let (y, mu, q) = ops::layer_norm(x, w.unwrap(), b.unwrap(), EPS)?;
            vec![y, mu, q]
        }
    })
}

/// A weight or bias `[n]` read with stride 2 (every other element of an `[n, 2]` tensor).
fn strided_vector(n: usize, dt: DType, seed: u64) -> (Tensor, Vec<f64>) {
    let v = contiguous(&[n, 2], dt, seed, 0.0).0.narrow(1, 1, 1).unwrap().view(&[n]).unwrap();
    assert!(n == 1 || v.strides() == [2]);
    let vals = v.to_vec_f64().unwrap();
    (v, vals)
}

/// One row-op check on `x` (strided as `layout`, logical shape `shape`); `r`, when the op
/// takes one, is strided as `r_layout` (or contiguous); weights and biases are read with
/// stride 2.
fn check_rows(op: Op, dt: DType, layout: Layout, shape: &[usize], r_layout: Option<Layout>) -> Result<f64, String> {
    let ctx = format!("{op:?} {dt} x {layout:?} {shape:?} r {r_layout:?}");
    let s = seed(&ctx);
    let n = *shape.last().unwrap();
    let m: usize = shape[..shape.len() - 1].iter().product();
    let (x, xv) = strided(layout, shape, dt, s, 0.0);
    let r = op.needs_r().then(|| match r_layout {
        Some(l) => strided(l, shape, dt, s + 1, 0.0),
        None => contiguous(shape, dt, s + 1, 0.0),
    });
    let w = op.needs_w().then(|| strided_vector(n, dt, s + 2));
    let b = op.needs_b().then(|| strided_vector(n, dt, s + 3));
    let vals = |t: &Option<(Tensor, Vec<f64>)>| t.as_ref().map(|t| t.1.clone()).unwrap_or_default();
    let (want, scale) = reference(op, dt, m, n, &xv, &vals(&r), &vals(&w), &vals(&b));
    let outs = run_api(op, &x, r.as_ref().map(|t| &t.0), w.as_ref().map(|t| &t.0), b.as_ref().map(|t| &t.0)).map_err(|e| format!("{ctx}: {e}"))?;
    let mut worst: f64 = 0.0;
    for (o, ((t, wv), sc)) in outs.iter().zip(&want).zip(&scale).enumerate() {
        let expect: Vec<usize> = if op.row_shaped(o) { shape[..shape.len() - 1].to_vec() } else { shape.to_vec() };
        let expect_dt = if op.outputs()[o] == Out::Stat { DType::F32 } else { dt };
        check_out(t, &expect, expect_dt).map_err(|e| format!("{ctx} output {o}: {e}"))?;
        let tol = match op.outputs()[o] {
            _ if op.exact() => 0.0,
            Out::T => common::tolerance(dt),
            Out::Stat => 1e-5,
        };
        let got = t.to_vec_f64().unwrap();
        let e = common::err_against(&got, wv, sc);
        if !(e <= tol) {
            return Err(format!("{ctx} output {o}: error {e:.3e} > {tol:.1e}"));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

fn run_rows(ops: &[Op]) {
    let (mut failures, mut checks) = (Vec::new(), 0);
    let mut cases: Vec<(Layout, Vec<usize>)> = SHAPES.iter().flat_map(|&(m, n)| LAYOUTS_2D.map(|l| (l, vec![m, n]))).collect();
    cases.extend(high_rank());
    for &op in ops {
        for dt in common::DTYPES {
            let mut worst: f64 = 0.0;
            for (layout, shape) in &cases {
                // the residual: contiguous, laid out as `x`, and transposed (2-D) or permuted
                let r_layouts: Vec<Option<Layout>> = if !op.needs_r() {
                    vec![None]
                } else if shape.len() == 2 {
                    vec![None, Some(*layout), Some(Layout::Transposed)]
                } else {
                    vec![None, Some(*layout)]
                };
                for rl in r_layouts {
                    checks += 1;
                    match check_rows(op, dt, *layout, shape, rl) {
                        Ok(e) => worst = worst.max(e),
                        Err(e) => failures.push(e),
                    }
                }
                // a strided `x` with a contiguous residual, the other way round
                if op.needs_r() {
                    checks += 1;
                    let (x, xv) = contiguous(shape, dt, 5, 0.0);
                    let (r, rv) = strided(*layout, shape, dt, 6, 0.0);
                    let n = *shape.last().unwrap();
                    let m = xv.len() / n;
                    let (want, scale) = reference(Op::AddRms, dt, m, n, &xv, &rv, &[], &[]);
                    let r = ops::add_rms_norm(&x, &r, None, EPS).map_err(|e| e.to_string()).and_then(|(s, y, _)| {
                        for (o, t) in [(0, s), (1, y)] {
                            check_out(&t, shape, dt)?;
                            let e = common::err_against(&t.to_vec_f64().unwrap(), &want[o], &scale[o]);
                            if !(e <= common::tolerance(dt)) {
                                return Err(format!("output {o}: error {e:.3e}"));
                            }
                        }
                        Ok(())
                    });
                    if let Err(e) = r {
                        failures.push(format!("AddRms {dt} x contiguous, r {layout:?} {shape:?}: {e}"));
                    }
                }
            }
            println!("{:10} {:5} max err {worst:.2e}", format!("{op:?}"), dt.to_string());
        }
    }
    finish("rows", checks, failures);
}

#[test]
fn last_axis_reductions_of_strided_views() {
    run_rows(&OPS[..4]);
}

#[test]
fn softmax_and_log_softmax_of_strided_views() {
    run_rows(&OPS[4..6]);
}

#[test]
fn rms_norms_of_strided_views() {
    run_rows(&OPS[6..9]);
}

#[test]
fn fused_add_rms_norms_of_strided_views() {
    run_rows(&OPS[9..11]);
}

#[test]
fn layer_norm_of_strided_views() {
    run_rows(&OPS[11..]);
}

/// Whole-tensor reductions of strided views: a transposed or permuted tensor is reduced
/// in memory order, every other element as one strided run, a narrowed one through a
/// copy; sizes of one and two chunk stages.
#[test]
fn whole_tensor_reductions_of_strided_views() {
    let (mut failures, mut checks) = (Vec::new(), 0);
    let mut cases: Vec<(Layout, Vec<usize>)> = SHAPES.iter().flat_map(|&(m, n)| LAYOUTS_2D.map(|l| (l, vec![m, n]))).collect();
    cases.extend(high_rank());
    cases.push((Layout::Transposed, vec![97, 211])); // 20467 elements: two stages
    for dt in common::DTYPES {
        for (layout, shape) in &cases {
            for (name, f) in [("sum", ops::sum as fn(&Tensor, Dim) -> kfuse::Result<Tensor>), ("mean", ops::mean), ("max", ops::max), ("min", ops::min)] {
                checks += 1;
                let ctx = format!("{name} all {dt} {layout:?} {shape:?}");
                let (x, v) = strided(*layout, shape, dt, seed(&ctx), 0.0);
                let abs_sum: f64 = v.iter().map(|a| a.abs()).sum();
                let (want, scale) = match name {
                    "sum" => (dt.round(v.iter().sum()), abs_sum),
                    "mean" => (dt.round(v.iter().sum::<f64>() / v.len() as f64), abs_sum / v.len() as f64),
                    "max" => (v.iter().cloned().fold(f64::NEG_INFINITY, f64::max), 0.0),
                    _ => (v.iter().cloned().fold(f64::INFINITY, f64::min), 0.0),
                };
                let tol = if matches!(name, "max" | "min") { 0.0 } else { common::tolerance(dt) };
                let r = f(&x, Dim::All).map_err(|e| e.to_string()).and_then(|out| {
                    check_out(&out, &[], dt)?;
                    let got = out.to_vec_f64().unwrap();
                    let e = common::err_against(&got, &[want], &[scale.max(want.abs())]);
                    if e <= tol {
                        Ok(())
                    } else {
                        Err(format!("{} vs {want}: error {e:.3e} > {tol:.1e}", got[0]))
                    }
                });
                if let Err(e) = r {
                    failures.push(format!("{ctx}: {e}"));
                }
            }
        }
    }
    finish("whole-tensor reductions", checks, failures);
}

// ---------------------------------------------------------------------------------------
// RoPE on strided q and k, in place.

const BASE: f32 = 10000.0;

/// The rotated logical values of a `[tokens, h, d]` head layout (float64, rounded once).
fn rope_ref(x: &[f64], pos: &[f64], h: usize, d: usize, layout: RopeLayout, table: Option<(&[f64], &[f64])>, dt: DType) -> Vec<f64> {
    let mut out = x.to_vec();
    for (t, &p) in pos.iter().enumerate() {
        for hh in 0..h {
            let r = (t * h + hh) * d;
            for j in 0..d / 2 {
                let (c, s) = match table {
                    None => {
                        let th = p * (BASE as f64).powf(-2.0 * j as f64 / d as f64);
                        (th.cos(), th.sin())
                    }
                    Some((ct, st)) => (ct[p as usize * (d / 2) + j], st[p as usize * (d / 2) + j]),
                };
                let (i1, i2) = match layout {
                    RopeLayout::HalfSplit => (r + j, r + j + d / 2),
                    RopeLayout::Interleaved => (r + 2 * j, r + 2 * j + 1),
                };
                let (x1, x2) = (x[i1], x[i2]);
                out[i1] = dt.round(x1 * c - x2 * s);
                out[i2] = dt.round(x2 * c + x1 * s);
            }
        }
    }
    out
}

/// `q` a head slice of a fused `[B, S, HQ + HK + 2, D]` projection (`B`, `S` merge: one
/// launch, written through its strides), `k` a `[S, B, HK, D]` tensor permuted to
/// `[B, S, HK, D]` (one launch per batch), positions as offsets or a transposed `[B, S]`
/// view, angles computed or from transposed tables; rank-3 `q`, `k` with padded heads.
/// Elements outside the views stay as they were.
#[test]
fn rope_rotates_strided_q_and_k_in_place() {
    let (mut failures, mut checks) = (Vec::new(), 0);
    let (b, s, hq, hk, d) = (2usize, 5usize, 3usize, 2usize, 8usize);
    let p_rows = 16;
    for dt in common::DTYPES {
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            for (use_pos, use_table) in [(false, false), (true, false), (false, true), (true, true)] {
                for rank3 in [false, true] {
                    checks += 1;
                    let ctx = format!("rope {dt} {layout:?} positions {use_pos} table {use_table} rank3 {rank3}");
                    let sd = seed(&ctx);
                    let t = b * s;
                    // q and k, and what they lie in
                    let (fused, mut q, mut kk) = if rank3 {
                        let f = contiguous(&[t, hq, d + 4], dt, sd, 0.0).0;
                        let q = f.narrow(2, 2, d).unwrap();
                        let kk = contiguous(&[hk, t, d], dt, sd + 1, 0.0).0.permute(&[1, 0, 2]).unwrap();
                        (f, q, kk)
                    } else {
                        let f = contiguous(&[b, s, hq + hk + 2, d], dt, sd, 0.0).0;
                        let q = f.narrow(2, 1, hq).unwrap();
                        let kk = contiguous(&[s, b, hk, d], dt, sd + 1, 0.0).0.permute(&[1, 0, 2, 3]).unwrap();
                        (f, q, kk)
                    };
                    let (fused_before, qv, kv) = (fused.to_vec_f64().unwrap(), q.to_vec_f64().unwrap(), kk.to_vec_f64().unwrap());
                    // positions: token i of sequence j at (3i + 2j) % P, or offset 4
                    let pos: Vec<f64> = if use_pos { (0..t).map(|i| ((3 * (i % s) + 2 * (i / s)) % p_rows) as f64).collect() } else { (0..t).map(|i| (4 + i % s) as f64).collect() };
                    let seq_pos: Vec<f64> = if rank3 && !use_pos { (0..t).map(|i| (4 + i) as f64).collect() } else { pos.clone() };
                    let pos_t = if rank3 {
                        // [T] read with stride 2
                        let wide: Vec<f64> = pos.iter().flat_map(|&p| [p, -1.0]).collect();
                        Tensor::from_f64(&wide, &[t, 2], DType::I64, &dev()).unwrap().narrow(1, 0, 1).unwrap().view(&[t]).unwrap()
                    } else {
                        // [B, S] as the transpose of an [S, B] tensor
                        let tr: Vec<f64> = (0..s).flat_map(|j| (0..b).map(move |i| (i, j))).map(|(i, j)| pos[i * s + j]).collect();
                        Tensor::from_f64(&tr, &[s, b], DType::I64, &dev()).unwrap().t()
                    };
                    // tables [P, D/2] as transposed views of [D/2, P]
                    let (mut ct, mut st) = (Vec::new(), Vec::new());
                    for p in 0..p_rows {
                        for j in 0..d / 2 {
                            let th = p as f64 * (BASE as f64).powf(-2.0 * j as f64 / d as f64);
                            ct.push(DType::F32.round(th.cos()));
                            st.push(DType::F32.round(th.sin()));
                        }
                    }
                    let table_t = |v: &[f64]| {
                        let tr: Vec<f64> = (0..d / 2).flat_map(|j| (0..p_rows).map(move |p| (p, j))).map(|(p, j)| v[p * (d / 2) + j]).collect();
                        Tensor::from_f64(&tr, &[d / 2, p_rows], DType::F32, &dev()).unwrap().t()
                    };
                    let (cos, sin) = (table_t(&ct), table_t(&st));
                    let opts = RopeOptions {
                        layout,
                        positions: if use_pos { Positions::Tensor(&pos_t) } else { Positions::Offset(4) },
                        freqs: if use_table { Freqs::Table { cos: &cos, sin: &sin } } else { Freqs::Computed { base: BASE } },
                    };
                    let table = use_table.then_some((ct.as_slice(), st.as_slice()));
                    let r = ops::rope(&mut q, &mut kk, &opts).map_err(|e| e.to_string()).and_then(|()| {
                        for (name, x, v, h) in [("q", &q, &qv, hq), ("k", &kk, &kv, hk)] {
                            let want = rope_ref(v, &seq_pos, h, d, layout, table, dt);
                            let e = common::rel_err(&x.to_vec_f64().unwrap(), &want);
                            if !(e <= common::tolerance(dt)) {
                                return Err(format!("`{name}`: relative error {e:.3e}"));
                            }
                        }
                        // the rest of the fused tensor is untouched
                        let after = fused.to_vec_f64().unwrap();
                        let inside: std::collections::HashSet<usize> = {
                            // mark q's elements: write NaN through a copy of the view
                            let probe = Tensor::from_f64(&fused_before, fused.shape(), dt, &dev()).unwrap();
                            let mut pv = if rank3 { probe.narrow(2, 2, d).unwrap() } else { probe.narrow(2, 1, hq).unwrap() };
                            pv.fill(f64::NAN).unwrap();
                            probe.to_vec_f64().unwrap().iter().enumerate().filter(|(_, v)| v.is_nan()).map(|(i, _)| i).collect()
                        };
                        match (0..after.len()).find(|i| !inside.contains(i) && after[*i] != fused_before[*i]) {
                            Some(i) => Err(format!("element {i} of the fused tensor, outside `q`, changed")),
                            None => Ok(()),
                        }
                    });
                    if let Err(e) = r {
                        failures.push(format!("{ctx}: {e}"));
                    }
                }
            }
        }
    }
    finish("rope", checks, failures);
}

// ---------------------------------------------------------------------------------------
// Bad input is still an error.

#[test]
fn bad_strided_input_is_still_a_clear_error() {
    let f = DType::F32;
    let xt = contiguous(&[6, 4], f, 1, 0.0).0.t(); // [4, 6], strides [1, 4]
    let e = ops::add(&xt, &contiguous(&[6, 4], f, 2, 0.0).0).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("[4, 6]"), "{e}");
    let e = ops::mul(&xt, &contiguous(&[6, 4], DType::F16, 2, 0.0).0.t()).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)), "{e}");
    let it = Tensor::zeros(&[6, 4], DType::I64, &dev()).unwrap().t();
    for e in [ops::silu(&it).unwrap_err(), ops::softmax(&it).unwrap_err(), ops::sum(&it, Dim::All).unwrap_err(), ops::copy(&it).unwrap_err()] {
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("i64"), "{e}");
    }
    let (w5, _) = strided_vector(5, f, 3);
    let e = ops::rms_norm(&xt, Some(&w5), None, EPS).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("`w`"), "{e}");
    let (wh, _) = strided_vector(6, DType::BF16, 3);
    let e = ops::layer_norm(&xt, &wh, &wh, EPS).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)) && e.to_string().contains("`w`"), "{e}");
    let e = ops::add_rms_norm(&xt, &xt.t(), None, EPS).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)) && e.to_string().contains("`r`"), "{e}");
    let e = ops::softmax(&contiguous(&[0, 5], f, 4, 0.0).0.t()).unwrap_err(); // [5, 0]: rows of nothing
    assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("last dimension"), "{e}");
    // empty strided views: empty results, no launch
    let empty = contiguous(&[4, 6], f, 5, 0.0).0.t().narrow(1, 0, 0).unwrap(); // [6, 0]
    assert_eq!(ops::add(&empty, &empty).unwrap().shape(), &[6, 0]);
    assert_eq!(ops::sum(&empty, Dim::Last).unwrap().to_vec_f64().unwrap(), vec![0.0; 6]);
}

// ---------------------------------------------------------------------------------------
// The strided specializations on the GPU's compiler and tile plans, without a GPU.

/// Runs `f` with the kernel def and the arguments of each strided launch the ops make:
/// transposed `x` (innermost stride `M`), stride-2 vectors and weights, a strided `q`.
fn strided_launches(dt: DType, f: &mut dyn FnMut(&'static kfuse::ir::KernelDef, &mut [Arg<'_>])) {
    let c = Device::cpu();
    let (m, n) = (130, 257);
    let x = Tensor::from_f64(&common::random(m * n, 1, 3.0, 0.5), &[n, m], dt, &c).unwrap().t();
    let y = Tensor::from_f64(&common::random(m * n, 2, 3.0, 0.5), &[m, n], dt, &c).unwrap();
    let w = Tensor::from_f64(&common::random(2 * n, 3, 3.0, 0.5), &[n, 2], dt, &c).unwrap().narrow(1, 0, 1).unwrap().view(&[n]).unwrap();
    let v = Tensor::from_f64(&common::random(2 * m * n, 4, 3.0, 0.5), &[m * n, 2], dt, &c).unwrap().narrow(1, 0, 1).unwrap().view(&[m * n]).unwrap();
    let e = |s: &[usize], d: DType| Tensor::empty(s, d, &c).unwrap();
    let (x3, y3) = (x.unsqueeze(0).unwrap(), y.unsqueeze(0).unwrap());
    for def in [&k::add3d::DEF, &k::sub3d::DEF, &k::mul3d::DEF, &k::div3d::DEF, &k::swiglu3d::DEF] {
        f(def, &mut [Arg::In(&x3), Arg::In(&y3), Arg::Out(&mut e(&[1, m, n], dt))]);
    }
    for def in [&k::silu3d::DEF, &k::gelu3d::DEF, &k::gelu_tanh3d::DEF, &k::copy3d::DEF] {
        f(def, &mut [Arg::In(&x3), Arg::Out(&mut e(&[1, m, n], dt))]);
    }
    f(&k::scale3d::DEF, &mut [Arg::In(&x3), Arg::Out(&mut e(&[1, m, n], dt)), Arg::Scalar(Scalar::F32(2.0))]);
    f(&k::add::DEF, &mut [Arg::In(&v), Arg::In(&v), Arg::Out(&mut e(&[m * n], dt))]);
    f(&k::silu::DEF, &mut [Arg::In(&v), Arg::Out(&mut e(&[m * n], dt))]);
    f(&k::sum_chunks::DEF, &mut [Arg::In(&v), Arg::Out(&mut e(&[(m * n).div_ceil(k::CHUNK)], DType::F32)), Arg::Scalar(Scalar::F32(1.0))]);
    f(&k::max_chunks::DEF, &mut [Arg::In(&v), Arg::Out(&mut e(&[(m * n).div_ceil(k::CHUNK)], DType::F32))]);
    // the row kernels read unit-stride rows as they lie (a column slice: odd row stride,
    // odd offset); other rows are copied first
    let x = Tensor::from_f64(&common::random(m * (n + 5), 5, 3.0, 0.5), &[m, n + 5], dt, &c).unwrap().narrow(1, 3, n).unwrap();
    let y = Tensor::from_f64(&common::random(m * (n + 2), 6, 3.0, 0.5), &[m, n + 2], dt, &c).unwrap().narrow(1, 0, n).unwrap();
    for def in [&k::row_sum::DEF, &k::row_mean::DEF, &k::row_max::DEF, &k::row_min::DEF] {
        f(def, &mut [Arg::In(&x), Arg::Out(&mut e(&[m], dt))]);
    }
    for def in [&k::softmax::DEF, &k::log_softmax::DEF] {
        f(def, &mut [Arg::In(&x), Arg::Out(&mut e(&[m, n], dt))]);
    }
    let eps = Scalar::F32(EPS);
    f(&k::rms_norm::DEF, &mut [Arg::In(&x), Arg::Out(&mut e(&[m, n], dt)), Arg::Out(&mut e(&[m], DType::F32)), Arg::Scalar(eps)]);
    f(&k::rms_norm_wb::DEF, &mut [Arg::In(&x), Arg::In(&w), Arg::In(&w), Arg::Out(&mut e(&[m, n], dt)), Arg::Out(&mut e(&[m], DType::F32)), Arg::Scalar(eps)]);
    f(&k::add_rms_norm_w::DEF, &mut [Arg::In(&x), Arg::In(&y), Arg::In(&w), Arg::Out(&mut e(&[m, n], dt)), Arg::Out(&mut e(&[m, n], dt)), Arg::Out(&mut e(&[m], DType::F32)), Arg::Scalar(eps)]);
    f(
        &k::layer_norm::DEF,
        &mut [Arg::In(&x), Arg::In(&w), Arg::In(&w), Arg::Out(&mut e(&[m, n], dt)), Arg::Out(&mut e(&[m], DType::F32)), Arg::Out(&mut e(&[m], DType::F32)), Arg::Scalar(eps)],
    );
    // long rows (a cluster of blocks a row on sm_90a): a column slice with an odd row
    // stride, a weight of stride 2
    let long_c = Tensor::zeros(&[8, 16390], dt, &c).unwrap().narrow(1, 3, 16384).unwrap();
    let w_long = Tensor::zeros(&[16384, 2], dt, &c).unwrap().narrow(1, 1, 1).unwrap().view(&[16384]).unwrap();
    for x in [&long_c] {
        f(&k::softmax::DEF, &mut [Arg::In(x), Arg::Out(&mut e(&[8, 16384], dt))]);
        f(&k::rms_norm_w::DEF, &mut [Arg::In(x), Arg::In(&w_long), Arg::Out(&mut e(&[8, 16384], dt)), Arg::Out(&mut e(&[8], DType::F32)), Arg::Scalar(eps)]);
    }
    // a large transposed operand of the elementwise kernels
    let big_t = Tensor::zeros(&[1, 4096, 4096], dt, &c).unwrap().permute(&[0, 2, 1]).unwrap();
    let big = Tensor::zeros(&[1, 4096, 4096], dt, &c).unwrap();
    f(&k::add3d::DEF, &mut [Arg::In(&big_t), Arg::In(&big), Arg::Out(&mut e(&[1, 4096, 4096], dt))]);
    f(&k::gelu3d::DEF, &mut [Arg::In(&big_t), Arg::Out(&mut e(&[1, 4096, 4096], dt))]);
    // rope: q a slice of a fused [T, 5, 66] tensor (odd strides, an odd offset), k a
    // permuted [HK, T, 64] one
    let fused = Tensor::zeros(&[12, 5, 66], dt, &c).unwrap();
    let mut q = fused.narrow(1, 1, 3).unwrap().narrow(2, 1, 64).unwrap().view(&[12, 3, 2, 32]).unwrap();
    let mut kk = Tensor::zeros(&[2, 12, 64], dt, &c).unwrap().permute(&[1, 0, 2]).unwrap().view(&[12, 2, 2, 32]).unwrap();
    f(&k::rope_offset::DEF, &mut [Arg::Out(&mut q), Arg::Out(&mut kk), Arg::Scalar(Scalar::I64(12)), Arg::Scalar(Scalar::I64(0)), Arg::Scalar(Scalar::F32(BASE))]);
}

/// Every strided specialization compiles with NVRTC and assembles with ptxas for sm_80
/// and sm_90a, as the runtime builds it (the contiguous ones are `compile_check`'s and
/// the snapshots').
#[test]
fn strided_specializations_compile_for_the_gpu() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for dt in common::DTYPES {
        strided_launches(dt, &mut |def, args| {
            let dtypes = kfuse::runtime::check_args(def, args).unwrap_or_else(|e| panic!("{} {dt}: {e}", def.name));
            let kern = (def.build)(&dtypes).unwrap();
            let spec = spec_for(&kern, args).unwrap();
            for target in [Target::sm80(), Target::sm90a()] {
                let shapes: Vec<String> = args.iter().filter_map(|a| a.tensor()).map(|t| format!("{:?}/{:?}", t.shape(), t.strides())).collect();
                let name = format!("strided_{}_{dt}_{}", def.name, shapes.join("_").replace(['[', ']', ' ', ','], "").replace('/', "s"));
                checked += 1;
                match common::compile_assembled(&kern, &spec, &target, &name) {
                    Ok((_, regs, spill)) => {
                        assert!(regs > 0, "{name} {}: no registers read from ptxas", target.arch());
                        if spill > 0 {
                            println!("{name} {}: {spill} bytes of spills ({regs} registers)", target.arch());
                        }
                    }
                    Err(e) => failures.push(format!("{name} {}: {}", target.arch(), e.0)),
                }
            }
        });
    }
    println!("{checked} strided kernels compiled");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The GPU's tile plans (sm_90a) for the strided launches of `add` (a transposed operand)
/// and `softmax` (a column slice), run on the interpreter, give the reference values.
#[test]
fn gpu_tile_plans_for_strided_launches_on_the_interpreter() {
    let c = Device::cpu();
    for dt in common::DTYPES {
        let (m, n) = (130, 257);
        let (xb, xv0) = common::random_tensor(&[n, m], dt, 11, 0.0, &c);
        let x = xb.t();
        let xv = x.to_vec_f64().unwrap();
        assert_eq!(xv.len(), xv0.len());
        let (y, yv) = common::random_tensor(&[m, n], dt, 12, 0.0, &c);
        let (x3, y3) = (x.unsqueeze(0).unwrap(), y.unsqueeze(0).unwrap());
        let mut out = common::poisoned(&[1, m, n], dt, &c);
        let tiles = gpu_plan_tiles(&k::add3d::DEF, &[Arg::In(&x3), Arg::In(&y3), Arg::Out(&mut out.clone())], &Target::sm90a()).unwrap();
        launch_interpreter(&k::add3d::DEF, &mut [Arg::In(&x3), Arg::In(&y3), Arg::Out(&mut out)], &tiles).unwrap();
        let want: Vec<f64> = xv.iter().zip(&yv).map(|(a, b)| dt.round(a + b)).collect();
        let e = common::rel_err(&out.to_vec_f64().unwrap(), &want);
        assert!(e <= common::tolerance(dt), "add3d {dt} with tiles {tiles:?}: {e:.3e}");

        let x = common::random_tensor(&[m, n + 5], dt, 13, 0.0, &c).0.narrow(1, 3, n).unwrap();
        let xv = x.to_vec_f64().unwrap();
        let mut sm = common::poisoned(&[m, n], dt, &c);
        let tiles = gpu_plan_tiles(&k::softmax::DEF, &[Arg::In(&x), Arg::Out(&mut sm.clone())], &Target::sm90a()).unwrap();
        launch_interpreter(&k::softmax::DEF, &mut [Arg::In(&x), Arg::Out(&mut sm)], &tiles).unwrap();
        let (want, scale) = reference(Op::Softmax, dt, m, n, &xv, &[], &[], &[]);
        let e = common::err_against(&sm.to_vec_f64().unwrap(), &want[0], &scale[0]);
        assert!(e <= common::tolerance(dt), "softmax {dt} with tiles {tiles:?}: {e:.3e}");
    }
}

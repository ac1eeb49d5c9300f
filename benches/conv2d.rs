//! `kfuse::ops::conv2d` on the GPU, the rows of the convolution issue's table: N64, NHWC,
//! bf16 ResNet layers (padding R / 2), the first of them with bias + ReLU fused, and
//! depthwise 3 × 3 layers. cuDNN's figures come from `scripts/bench_torch_conv.py DIR` run
//! first in the same device call: with `KFUSE_BENCH_OUT=DIR` this reads
//! `DIR/torch_conv.json` and prints them beside kfuse, with the ratio and the bar.
//!
//! TFLOP/s = 2·N·K·P·Q·C·R·S / time; depthwise GB/s = input and output bytes / time (as
//! the anchor script counts them). Timing: CUDA events around each call (the op's host
//! work and output allocation included), warm-ups for about 300 ms, timed calls for about
//! 100 ms, median. Before
//! timing, 64 sampled outputs of each case are checked against a float64 CPU reference;
//! a wrong result or a refusal prints a row saying so. `KFUSE_BENCH_OUT` receives
//! `conv2d.md`. An argument keeps only the rows whose name contains it (`dw`, `3x3`).

mod common;

use common::{median, random_bf16};
use kfuse::ops::{Activation, Conv2dOptions};
use kfuse::{DType, Device, Tensor};

/// One layer: `(name, C, K, H = W, R = S, stride, groups, bias + ReLU)`.
#[derive(Clone, Copy)]
struct Layer {
    name: &'static str,
    c: usize,
    k: usize,
    h: usize,
    r: usize,
    stride: usize,
    groups: usize,
    relu: bool,
}

const N: usize = 64;

impl Layer {
    const fn dense(name: &'static str, c: usize, k: usize, h: usize, r: usize, stride: usize) -> Layer {
        Layer { name, c, k, h, r, stride, groups: 1, relu: false }
    }

    fn p(&self) -> usize {
        (self.h + 2 * (self.r / 2) - self.r) / self.stride + 1
    }

    fn depthwise(&self) -> bool {
        self.groups > 1
    }

    /// TFLOP/s, or GB/s for a depthwise layer, from milliseconds.
    fn rate(&self, ms: f64) -> f64 {
        if self.depthwise() {
            (2 * N * self.h * self.h * self.c * 2) as f64 / ms / 1e6
        } else {
            2.0 * (N * self.k * self.p() * self.p() * self.c / self.groups * self.r * self.r) as f64 / ms / 1e9
        }
    }

    /// The bar: a ratio to cuDNN, or GB/s for depthwise layers.
    fn bar(&self) -> String {
        if self.depthwise() {
            "≥ 2700 GB/s".into()
        } else {
            "≥ 1.00×".into()
        }
    }
}

/// The largest error of 64 sampled outputs against float64, relative to the size of
/// their terms.
fn check(l: &Layer, x: &[f32], w: &[f32], b: &[f32], y: &[f64]) -> f64 {
    let (h, p, cg, kg) = (l.h, l.p(), l.c / l.groups, l.k / l.groups);
    let pad = l.r / 2;
    let mut worst: f64 = 0.0;
    for t in 0..64usize {
        let o = (t * 7_919_113 + 12_345) % y.len();
        let (k, pix) = (o % l.k, o / l.k);
        let (n, py, qx) = (pix / (p * p), (pix / p) % p, pix % p);
        let g = k / kg;
        let (mut acc, mut mag) = (if l.relu { b[k] as f64 } else { 0.0 }, if l.relu { b[k].abs() as f64 } else { 0.0 });
        for i in 0..l.r {
            for j in 0..l.r {
                let (hy, wx) = ((py * l.stride + i) as i64 - pad as i64, (qx * l.stride + j) as i64 - pad as i64);
                if hy < 0 || wx < 0 || hy >= h as i64 || wx >= h as i64 {
                    continue;
                }
                for ch in 0..cg {
                    let xe = x[((n * h + hy as usize) * h + wx as usize) * l.c + g * cg + ch] as f64;
                    let we = w[((k * l.r + i) * l.r + j) * cg + ch] as f64;
                    acc += xe * we;
                    mag += (xe * we).abs();
                }
            }
        }
        let want = if l.relu { acc.max(0.0) } else { acc };
        worst = worst.max((y[o] - want).abs() / mag.max(1e-30));
    }
    worst
}

/// cuDNN's figure for each row name, from `DIR/torch_conv.json`.
fn torch_rows() -> Option<serde_json::Value> {
    let dir = common::report::out_dir()?;
    let text = std::fs::read_to_string(dir.join("torch_conv.json")).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok().map(|v| v["rows"].clone())
}

fn row(l: &Layer, dev: &Device, torch: Option<&serde_json::Value>) -> String {
    let name = if l.relu { format!("{} bias relu", l.name) } else { l.name.to_string() };
    let cudnn = torch.and_then(|t| t[&name]["cudnn"].as_f64());
    let (x, xv) = random_bf16(N * l.h * l.h * l.c, 11, dev);
    let (w, wv) = random_bf16(l.k * l.r * l.r * l.c / l.groups, 12, dev);
    let (b, bv) = random_bf16(l.k, 13, dev);
    let x = x.reshape(&[N, l.h, l.h, l.c]).expect("reshape");
    let w = w.reshape(&[l.k, l.r, l.r, l.c / l.groups]).expect("reshape");
    let opts = Conv2dOptions {
        stride: (l.stride, l.stride),
        padding: (l.r / 2, l.r / 2),
        groups: l.groups,
        bias: l.relu.then_some(&b),
        activation: if l.relu { Activation::Relu } else { Activation::None },
        ..Default::default()
    };
    let run = || kfuse::ops::conv2d(&x, &w, &opts);
    let got = (|| -> Result<(f64, f64), String> {
        let y: Tensor = run().map_err(|e| format!("refused: {e}"))?;
        let err = check(l, &xv, &wv, &bv, &y.to_vec_f64().map_err(|e| e.to_string())?);
        if !(err < 1e-2) {
            return Err(format!("WRONG: error {err:.2e}"));
        }
        // warm-ups for about 300 ms and timed calls for about 100 ms (a few calls of a
        // 50 µs layer leave the clocks where an idle GPU has them)
        let once = median(dev.time_ms(1, 3, || run().map(|_| ())).map_err(|e| e.to_string())?);
        let (warm, iters) = (((300.0 / once) as usize).clamp(3, 20_000), ((100.0 / once) as usize).clamp(10, 5_000));
        let ms = median(dev.time_ms(warm, iters, || run().map(|_| ())).map_err(|e| e.to_string())?);
        Ok((l.rate(ms), err))
    })();
    let show = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    match got {
        Ok((rate, err)) => {
            let vs = match (cudnn, l.depthwise()) {
                (_, true) => format!("({})", if rate >= 2700.0 { "met" } else { "not met" }),
                (Some(c), false) => format!("{:.2}× ({})", rate / c, if rate >= c { "met" } else { "not met" }),
                (None, false) => "—".into(),
            };
            format!("| {name} | {rate:.1} | {} | {vs} | {} | err {err:.1e} |", show(cudnn), l.bar())
        }
        Err(e) => format!("| {name} | — | {} | — | {} | {e} |", show(cudnn), l.bar()),
    }
}

/// Median milliseconds of `run` (warm-ups for about 300 ms, timed calls for about 100 ms).
fn time(dev: &Device, mut run: impl FnMut() -> kfuse::Result<()>) -> Result<f64, String> {
    let once = median(dev.time_ms(1, 3, &mut run).map_err(|e| e.to_string())?);
    let (warm, iters) = (((300.0 / once) as usize).clamp(3, 20_000), ((100.0 / once) as usize).clamp(10, 5_000));
    Ok(median(dev.time_ms(warm, iters, run).map_err(|e| e.to_string())?))
}

/// An f32 3 × 3 stride-1 layer three ways: what `kfuse::ops::conv2d` picks, Winograd F(2 ×
/// 2, 3 × 3) (`kernels::conv2d_winograd_*` and the batched product, as the op launches
/// them) and the implicit GEMM (`kernels::conv2d`), each checked on 64 sampled outputs
/// first; TFLOP/s of the direct convolution's 2·N·K·P·Q·C·9 FLOPs; cuDNN's f32 (TF32
/// off) from `torch_conv.json` under `NAME f32`.
fn f32_row(l: &Layer, dev: &Device, torch: Option<&serde_json::Value>) -> String {
    use kfuse::ops::kernels;
    let name = format!("{} f32", l.name);
    let cudnn = torch.and_then(|t| t[&name]["cudnn"].as_f64());
    let (x, xv) = common::random(&[N, l.h, l.h, l.c], DType::F32, 21, dev);
    let (w, wv) = common::random(&[l.k, 3, 3, l.c], DType::F32, 22, dev);
    let (b, bv) = common::random(&[l.k], DType::F32, 23, dev);
    let opts = Conv2dOptions { padding: (1, 1), bias: Some(&b), ..Default::default() };
    let p = l.p();
    let (tp, tt) = (p.div_ceil(2), N * p.div_ceil(2) * p.div_ceil(2));
    let geom = [p as i64, (p * p) as i64, 3, 1, 1, 1, 1, 1, 1];
    let alloc = |shape: &[usize]| Tensor::empty(shape, DType::F32, dev);
    let mut ways = Vec::new();
    let mut err: f64 = 0.0;
    for way in ["op", "winograd", "implicit"] {
        let got = (|| -> Result<f64, String> {
            let y = std::cell::RefCell::new(alloc(&[N, p, p, l.k]).map_err(|e| e.to_string())?);
            let run = || -> kfuse::Result<()> {
                let mut y = y.borrow_mut();
                match way {
                    "op" => *y = kfuse::ops::conv2d(&x, &w, &opts)?,
                    "winograd" => {
                        let (mut u, mut v, mut m) = (alloc(&[16, l.c, l.k])?, alloc(&[16, tt, l.c])?, alloc(&[16, tt, l.k])?);
                        kernels::conv2d_winograd_filter(&w, &mut u)?;
                        kernels::conv2d_winograd_input(&x, &mut v, tp as i64, (tp * tp) as i64, 1, 1)?;
                        kernels::gemm_batched_scaled(&v, &u, &mut m, 1.0)?;
                        kernels::conv2d_winograd_output(&m, &b, &mut y, tp as i64, (tp * tp) as i64, f32::NEG_INFINITY)?;
                    }
                    _ => {
                        let (xg, wg) = (x.view(&[N, l.h, l.h, 1, l.c])?, w.view(&[1, l.k, 3, 3, l.c])?);
                        let (bg, mut yg) = (b.view(&[1, l.k])?, y.view(&[N * p * p, 1, l.k])?);
                        let [oq, pq, _, sh, sw, ph, pw, dh, dw] = geom;
                        kernels::conv2d(&xg, &wg, &bg, &mut yg, oq, pq, sh, sw, ph, pw, dh, dw, f32::NEG_INFINITY)?;
                    }
                }
                Ok(())
            };
            run().map_err(|e| format!("refused: {e}"))?;
            let e = check_linear(l, &xv, &wv, &bv, &y.borrow().to_vec_f64().map_err(|e| e.to_string())?);
            if !(e < 1e-4) {
                return Err(format!("WRONG ({way}): error {e:.2e}"));
            }
            err = err.max(e);
            Ok(l.rate(time(dev, run)?))
        })();
        ways.push(got);
    }
    let show = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.1}"));
    let cell = |r: &Result<f64, String>| r.as_ref().map_or_else(|e| e.clone(), |v| format!("{v:.1}"));
    let picks = if ways[0].is_ok() { if winograd_picked(l) { "Winograd" } else { "implicit GEMM" } } else { "—" };
    let vs = match (&ways[0], cudnn) {
        (Ok(r), Some(c)) => format!("{:.2}×", r / c),
        _ => "—".into(),
    };
    format!("| {name} | {} | {} | {} ({picks}) | {} | {vs} | err {err:.1e} |", cell(&ways[1]), cell(&ways[2]), cell(&ways[0]), show(cudnn))
}

/// Whether `kfuse::ops::conv2d` takes Winograd for this f32 layer (its rule: every f32
/// 3 × 3 stride-1 layer without dilation or groups).
fn winograd_picked(l: &Layer) -> bool {
    l.r == 3 && l.stride == 1 && l.groups == 1
}

/// [`check`] for an f32 3 × 3 stride-1 layer with padding 1 and its bias added, no ReLU.
fn check_linear(l: &Layer, x: &[f32], w: &[f32], b: &[f32], y: &[f64]) -> f64 {
    let mut worst: f64 = 0.0;
    let (h, p) = (l.h, l.p());
    for t in 0..64usize {
        let o = (t * 7_919_113 + 12_345) % y.len();
        let (k, pix) = (o % l.k, o / l.k);
        let (n, py, qx) = (pix / (p * p), (pix / p) % p, pix % p);
        let (mut acc, mut mag) = (b[k] as f64, b[k].abs() as f64);
        for i in 0..3 {
            for j in 0..3 {
                let (hy, wx) = ((py + i) as i64 - 1, (qx + j) as i64 - 1);
                if hy < 0 || wx < 0 || hy >= h as i64 || wx >= h as i64 {
                    continue;
                }
                for ch in 0..l.c {
                    let (xe, we) = (x[((n * h + hy as usize) * h + wx as usize) * l.c + ch] as f64, w[((k * 3 + i) * 3 + j) * l.c + ch] as f64);
                    acc += xe * we;
                    mag += (xe * we).abs();
                }
            }
        }
        worst = worst.max((y[o] - acc).abs() / mag.max(1e-30));
    }
    worst
}

fn main() {
    let Some(dev) = common::gpu() else { return };
    println!("kfuse::ops::conv2d, N{N} NHWC bf16, {}", dev.describe());
    let torch = torch_rows();
    let mut layers = vec![
        Layer::dense("C64 K64 3x3 56", 64, 64, 56, 3, 1),
        Layer { relu: true, ..Layer::dense("C64 K64 3x3 56", 64, 64, 56, 3, 1) },
        Layer::dense("C256 K64 1x1 56", 256, 64, 56, 1, 1),
        Layer::dense("C128 K128 3x3 28", 128, 128, 28, 3, 1),
        Layer::dense("C256 K256 3x3 14", 256, 256, 14, 3, 1),
        Layer::dense("C512 K512 3x3 7", 512, 512, 7, 3, 1),
        Layer::dense("C256 K512 1x1 s2 56", 256, 512, 56, 1, 2),
        Layer::dense("C128 K128 3x3 s2 56", 128, 128, 56, 3, 2),
    ];
    for (name, c, h) in [("dw C256 56", 256, 56), ("dw C512 28", 512, 28), ("dw C1024 14", 1024, 14)] {
        layers.push(Layer { name, c, k: c, h, r: 3, stride: 1, groups: c, relu: false });
    }
    let mut md = String::from("| layer | kfuse TFLOP/s (GB/s) | cuDNN | kfuse / cuDNN | bar | check |\n|---|---|---|---|---|---|\n");
    // an argument keeps the rows whose name contains it (`conv2d_bench dw`)
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-')).unwrap_or_default();
    for l in layers.iter().filter(|l| l.name.contains(&filter)) {
        let r = row(l, &dev, torch.as_ref());
        println!("{r}");
        md.push_str(&r);
        md.push('\n');
    }
    // f32 3 × 3 layers: Winograd beside the implicit GEMM (`conv2d_bench f32`)
    let f32_layers: Vec<&Layer> = layers.iter().filter(|l| l.r == 3 && l.stride == 1 && l.groups == 1 && !l.relu).collect();
    if filter.is_empty() || filter == "f32" {
        println!("\nf32 (no TF32), TFLOP/s of the direct convolution's FLOPs:");
        let head = "| layer | Winograd F(2×2, 3×3) | implicit GEMM | kfuse::ops::conv2d (its pick) | cuDNN f32 | op / cuDNN | check |\n|---|---|---|---|---|---|---|\n";
        print!("{head}");
        md.push('\n');
        md.push_str(head);
        for l in f32_layers {
            let r = f32_row(l, &dev, torch.as_ref());
            println!("{r}");
            md.push_str(&r);
            md.push('\n');
        }
    }
    if let Some(dir) = common::report::out_dir() {
        let _ = std::fs::write(dir.join("conv2d.md"), md);
    }
}

//! The flash attention proof kernel (`tests/kernels/flash_attention.rs`, written in
//! `#[kfuse]`) on the GPU: bf16, Q/K/V/O `[B, S, H, D]`, B·S = 16k tokens and H·D = 2048:
//! D128 (H16) at S = 1024, 2048, 4096 and 8192, non-causal and causal, and B4 H32 S4096
//! D64. PyTorch's cuDNN SDPA is timed beside it by `../shared/bench/anchors_attn.py` in
//! the same device call.
//!
//! TFLOP/s = 4·B·H·Sq·Skv·D / time, halved when causal (FlashAttention's count). Timing:
//! CUDA events around each launch, 3 warm-ups, 10 timed launches, median. Before timing,
//! each case's output is checked on two (batch, head) pairs and 8 query rows against a
//! float64 CPU reference; a wrong result or a refusal prints a row saying so. Each row
//! also gives the device memory the kernel's launches took above its tensors.
//! `KFUSE_BENCH_OUT` receives `attention.md` and `attention.svg` (TFLOP/s against the
//! sequence length, D128).

#[path = "../tests/kernels/flash_attention.rs"]
mod kernel;
mod common;

use common::{median, random_bf16};
use kernel::flash_attention;
use kfuse::{DType, Device, Tensor};

/// The largest |error| of sampled output rows against float64, relative to the rows' size.
fn check(q: &[f64], k: &[f64], v: &[f64], o: &[f64], (b, s, h, d): (usize, usize, usize, usize), causal: bool) -> f64 {
    let scale = 1.0 / (d as f64).sqrt();
    let mut worst: f64 = 0.0;
    for (bb, hh) in [(0, 0), (b - 1, h - 1)] {
        for r in [0, 1, 17, s / 2, s / 2 + 1, s - 65, s - 2, s - 1] {
            let at = |t: &[f64], row: usize, x: usize| t[((bb * s + row) * h + hh) * d + x];
            let sc: Vec<f64> = (0..s)
                .map(|c| if causal && c > r { f64::NEG_INFINITY } else { (0..d).map(|x| at(q, r, x) * at(k, c, x)).sum::<f64>() * scale })
                .collect();
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for x in 0..d {
                let want: f64 = (0..s).map(|c| (sc[c] - mx).exp() / z * at(v, c, x)).sum();
                num += (at(o, r, x) - want).powi(2);
                den += want * want;
            }
            worst = worst.max((num / den.max(1e-30)).sqrt());
        }
    }
    worst
}

fn main() {
    let dev = Device::best();
    if !dev.is_gpu() {
        eprintln!("attention bench: no GPU; nothing to time");
        return;
    }
    println!("attention (kfuse #[kfuse] proof kernel), {}", dev.describe());
    let mut md = String::from("| case | kfuse ms | kfuse TFLOP/s | check | device memory above its tensors (MiB) |\n|---|---|---|---|---|\n");
    let lengths = [1024usize, 2048, 4096, 8192];
    let cases: Vec<(usize, usize, bool)> = lengths.iter().flat_map(|&s| [(s, 128, false), (s, 128, true)]).chain([(4096, 64, false)]).collect();
    // the chart: D128 TFLOP/s by sequence length, non-causal and causal
    let mut series = [false, true].map(|c| common::report::Series { name: if c { "causal" } else { "non-causal" }.into(), values: vec![None; lengths.len()] });
    let bar = common::report::progress(cases.len(), "attention");
    for (s, d, causal) in cases {
        let (b, h) = (16384 / s, 2048 / d);
        bar.set_message(format!("S{s} D{d} causal={}", causal as u8));
        let n = b * s * h * d;
        let input = |seed: u64| {
            let (t, v) = random_bf16(n, seed, &dev);
            (t.reshape(&[b, s, h, d]).expect("reshape"), v.into_iter().map(f64::from).collect::<Vec<f64>>())
        };
        let ((q, qv), (k, kv), (v, vv)) = (input(1), input(2), input(3));
        let mut o = Tensor::empty(&[b, s, h, d], DType::BF16, &dev).expect("alloc");
        o.fill(f64::NAN).expect("poison");
        let mut lse = Tensor::empty(&[b, h, s], DType::F32, &dev).expect("alloc");
        let scale = 1.0 / (d as f32).sqrt();
        let case = format!("B{b} H{h} S{s} D{d} causal={}", causal as u8);
        let first = flash_attention(&q, &k, &v, &mut o, &mut lse, scale, causal as i64).and_then(|_| o.to_vec_f64());
        let row = match first {
            Err(e) => format!("| {case} | refused | — | {e} | |"),
            Ok(out) => {
                let err = check(&qv, &kv, &vv, &out, (b, s, h, d), causal);
                if !(err < 2e-2) {
                    format!("| {case} | — | — | WRONG: relative error {err:.2e} | |")
                } else {
                    let span = common::report::MemorySpan::open(&dev);
                    let times = dev.time_ms(3, 10, || flash_attention(&q, &k, &v, &mut o, &mut lse, scale, causal as i64).map(|_| ())).expect("timing");
                    let extra = common::report::mib(span.peak(&dev));
                    let ms = median(times);
                    let flops = 4.0 * (b * h * s * s * d) as f64 / if causal { 2.0 } else { 1.0 };
                    let tflops = flops / ms / 1e9;
                    if d == 128 {
                        series[causal as usize].values[lengths.iter().position(|&l| l == s).expect("a chart length")] = Some(tflops);
                    }
                    format!("| {case} | {ms:.3} | {tflops:.1} | rel err {err:.1e} | {extra} |")
                }
            }
        };
        bar.inc(1);
        bar.suspend(|| println!("{row}"));
        md.push_str(&row);
        md.push('\n');
    }
    bar.finish_and_clear();
    if let Some(dir) = common::report::out_dir() {
        let _ = std::fs::write(dir.join("attention.md"), md);
        let panel = common::report::Panel {
            title: format!("Flash attention, kfuse proof kernel, bf16 D128, 16k tokens ({})", dev.name()),
            y_label: "TFLOP/s".into(),
            labels: lengths.iter().map(|s| format!("S = {s}")).collect(),
            series: series.into_iter().collect(),
            reference: None,
        };
        if let Err(e) = common::report::bar_charts(&dir.join("attention.svg"), &[panel], 1) {
            eprintln!("{e}");
        }
    }
}

//! `kfuse::ops::attention` on the GPU, the rows of the attention issue's table: bf16,
//! `[B, S, H, D]`, B·S = 16k tokens and H·D = 2048 at D 128, 64 and 256, S 4096 and 16384,
//! non-causal and causal, and grouped-query attention (Hq 32, Hkv 8, D128, S4096); then
//! `attention_varlen` on the D128 S4096 data packed as four sequences; then the flash
//! attention proof kernel (`tests/kernels/flash_attention.rs`) at D128, S1024–8192.
//! PyTorch's cuDNN SDPA, FlashAttention-2 backend and FlexAttention come from
//! `scripts/bench_torch_attention.py DIR` run first in the same device call: with
//! `KFUSE_BENCH_OUT=DIR` this reads `DIR/torch_attention.json` and prints them beside
//! kfuse, with the ratio to cuDNN and the bar.
//!
//! TFLOP/s = 4·B·Hq·Sq·Skv·D / time, halved when causal (FlashAttention's count). Timing:
//! CUDA events around each call (the op's host work and output allocation included), 3
//! warm-ups, 10 timed calls, median. Before timing, each case's output is checked on two
//! (batch, head) pairs and 8 query rows against a float64 CPU reference; a wrong result
//! or a refusal prints a row saying so. `KFUSE_BENCH_OUT` receives `attention.md` and
//! `attention.svg` (the proof kernel's TFLOP/s against the sequence length, D128).
//! `KFUSE_BENCH_FILTER=TEXT` runs only the op's rows whose name contains TEXT (`D64 S4096`
//! runs that row and its causal one), and no varlen or proof kernel rows.

#[path = "../tests/kernels/flash_attention.rs"]
mod kernel;
mod common;

use common::{median, random_bf16};
use kernel::flash_attention;
use kfuse::ops::{AttentionOptions, AttentionLayout};
use kfuse::{DType, Device, Tensor};

/// One row: `(B, S, Hq, Hkv, D, causal)`.
#[derive(Clone, Copy)]
struct Case {
    b: usize,
    s: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
}

impl Case {
    fn mha(s: usize, d: usize, causal: bool) -> Case {
        Case { b: (16384 / s).max(1), s, hq: 2048 / d, hkv: 2048 / d, d, causal }
    }

    /// The name `scripts/bench_torch_attention.py` gives the row.
    fn name(&self) -> String {
        let gqa = if self.hq != self.hkv { format!("GQA Hq{} Hkv{} ", self.hq, self.hkv) } else { String::new() };
        format!("{gqa}D{} S{}{}", self.d, self.s, if self.causal { " causal" } else { "" })
    }

    fn flops(&self) -> f64 {
        4.0 * (self.b * self.hq * self.s * self.s * self.d) as f64 / if self.causal { 2.0 } else { 1.0 }
    }

    /// The bar as a ratio to cuDNN, and a floor in TFLOP/s where it has one.
    fn bar(&self) -> (f64, f64) {
        match (self.d, self.hq == self.hkv, self.s, self.causal) {
            (128, true, 16384, false) => (1.05, 648.0),
            (128, true, _, _) => (1.05, 0.0),
            _ => (1.0, 0.0),
        }
    }
}

/// The largest relative error of sampled output rows against float64 (`[B, S, H, D]`).
fn check(q: &[f64], k: &[f64], v: &[f64], o: &[f64], c: Case) -> f64 {
    let (s, d, scale) = (c.s, c.d, 1.0 / (c.d as f64).sqrt());
    let mut worst: f64 = 0.0;
    for (bb, hh) in [(0, 0), (c.b - 1, c.hq - 1)] {
        let g = hh / (c.hq / c.hkv);
        for r in [0, 1, 17, s / 2, s / 2 + 1, s - 65, s - 2, s - 1] {
            let qa = |x: usize| q[((bb * s + r) * c.hq + hh) * d + x];
            let kv = |t: &[f64], row: usize, x: usize| t[((bb * s + row) * c.hkv + g) * d + x];
            let sc: Vec<f64> =
                (0..s).map(|col| if c.causal && col > r { f64::NEG_INFINITY } else { (0..d).map(|x| qa(x) * kv(k, col, x)).sum::<f64>() * scale }).collect();
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
            let (mut num, mut den) = (0.0f64, 0.0f64);
            for x in 0..d {
                let want: f64 = (0..s).map(|col| (sc[col] - mx).exp() / z * kv(v, col, x)).sum();
                num += (o[((bb * s + r) * c.hq + hh) * d + x] - want).powi(2);
                den += want * want;
            }
            worst = worst.max((num / den.max(1e-30)).sqrt());
        }
    }
    worst
}

/// Random bf16 `[B, S, H, D]` inputs of `c` on `dev` and their values.
fn inputs(c: Case, dev: &Device) -> [(Tensor, Vec<f64>); 3] {
    let make = |h: usize, seed: u64| {
        let (t, v) = random_bf16(c.b * c.s * h * c.d, seed, dev);
        (t.reshape(&[c.b, c.s, h, c.d]).expect("reshape"), v.into_iter().map(f64::from).collect::<Vec<f64>>())
    };
    [make(c.hq, 1), make(c.hkv, 2), make(c.hkv, 3)]
}

/// Checks then times `run` (which returns its output) on case `c`: `Ok(TFLOP/s, error)` or
/// the row's complaint.
fn measure(c: Case, dev: &Device, vals: [&[f64]; 3], mut run: impl FnMut() -> kfuse::Result<Tensor>) -> Result<(f64, f64), String> {
    let out = run().map_err(|e| format!("refused: {e}"))?.to_vec_f64().map_err(|e| e.to_string())?;
    let err = check(vals[0], vals[1], vals[2], &out, c);
    if !(err < 2e-2) {
        return Err(format!("WRONG: relative error {err:.2e}"));
    }
    let ms = median(dev.time_ms(3, 10, || run().map(|_| ())).map_err(|e| e.to_string())?);
    Ok((c.flops() / ms / 1e9, err))
}

/// PyTorch's figures for each row name, from `DIR/torch_attention.json`.
fn torch_rows() -> Option<serde_json::Value> {
    let dir = common::report::out_dir()?;
    let text = std::fs::read_to_string(dir.join("torch_attention.json")).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok().map(|v| v["rows"].clone())
}

/// The op's table: one row a case (those whose name contains `filter`, where given),
/// PyTorch's figures beside kfuse's where there are any.
fn op_table(dev: &Device, filter: Option<&str>) -> String {
    let torch = torch_rows();
    let fig = |row: &str, key: &str| torch.as_ref().and_then(|t| t[row][key].as_f64());
    let mut cases: Vec<Case> = [128, 64, 256].iter().flat_map(|&d| [4096, 16384].into_iter().flat_map(move |s| [false, true].map(|c| Case::mha(s, d, c)))).collect();
    cases.extend([false, true].map(|causal| Case { b: 4, s: 4096, hq: 32, hkv: 8, d: 128, causal }));
    cases.retain(|c| filter.is_none_or(|f| c.name().contains(f)));
    let mut md = String::from("| case | kfuse TFLOP/s | cuDNN | FA2 | FlexAttention | kfuse / cuDNN | bar | check |\n|---|---|---|---|---|---|---|---|\n");
    let bar = common::report::progress(cases.len(), "ops::attention");
    for c in cases {
        let name = c.name();
        bar.set_message(name.clone());
        let [(q, qv), (k, kv), (v, vv)] = inputs(c, dev);
        // the op allocates its output (the tests check it into poisoned outputs)
        let opts = AttentionOptions { causal: c.causal, layout: AttentionLayout::Bshd, ..Default::default() };
        let got = measure(c, dev, [&qv, &kv, &vv], || kfuse::ops::attention(&q, &k, &v, &opts).map(|(o, _)| o));
        let show = |x: Option<f64>| x.map_or("—".to_string(), |x| format!("{x:.1}"));
        let (cudnn, fa2, flex) = (fig(&name, "cudnn"), fig(&name, "fa2"), fig(&name, "flex"));
        let (ratio, floor) = c.bar();
        let bar_text = if floor > 0.0 { format!("≥ {ratio:.2}× and ≥ {floor:.0}") } else { format!("≥ {ratio:.2}×") };
        let row = match got {
            Ok((tf, err)) => {
                let vs = cudnn.map_or("—".into(), |x| {
                    let r = tf / x;
                    format!("{r:.2}× ({})", if r >= ratio && tf >= floor { "met" } else { "not met" })
                });
                format!("| {name} | {tf:.1} | {} | {} | {} | {vs} | {bar_text} | rel err {err:.1e} |", show(cudnn), show(fa2), show(flex))
            }
            Err(e) => format!("| {name} | — | {} | {} | {} | — | {bar_text} | {e} |", show(cudnn), show(fa2), show(flex)),
        };
        bar.inc(1);
        bar.suspend(|| println!("{row}"));
        md.push_str(&row);
        md.push('\n');
    }
    bar.finish_and_clear();
    md
}

/// `attention_varlen` on four packed sequences of 4096 tokens (the D128 S4096 rows'
/// data, as `[16384, 16, 128]` with `cu_seqlens` 0, 4096, …): what the loaded bounds and
/// masked stores cost beside the dense op's rows above.
fn varlen_rows(dev: &Device) -> String {
    let mut md = String::new();
    for causal in [false, true] {
        let c = Case::mha(4096, 128, causal);
        let [(q, qv), (k, kv), (v, vv)] = inputs(c, dev);
        let packed = |t: &Tensor| t.reshape(&[c.b * c.s, c.hq, c.d]).expect("reshape");
        let (q, k, v) = (packed(&q), packed(&k), packed(&v));
        let cu_vals: Vec<f64> = (0..=c.b).map(|i| (i * c.s) as f64).collect();
        let cu = Tensor::from_f64(&cu_vals, &[c.b + 1], DType::I64, dev).expect("cu_seqlens");
        let opts = AttentionOptions { causal, ..Default::default() };
        let got = measure(c, dev, [&qv, &kv, &vv], || kfuse::ops::attention_varlen(&q, &k, &v, &cu, &cu, c.s, c.s, &opts).map(|(o, _)| o));
        let name = format!("varlen 4 × 4096 D128{}", if causal { " causal" } else { "" });
        let row = match got {
            Ok((tf, err)) => format!("| {name} | {tf:.1} | rel err {err:.1e} |"),
            Err(e) => format!("| {name} | — | {e} |"),
        };
        println!("{row}");
        md.push_str(&row);
        md.push('\n');
    }
    md
}

/// The proof kernel's table (D128 by sequence length, and the chart's values).
fn proof_table(dev: &Device, lengths: &[usize]) -> (String, [common::report::Series; 2]) {
    let mut series = [false, true].map(|c| common::report::Series { name: if c { "causal" } else { "non-causal" }.into(), values: vec![None; lengths.len()] });
    let mut md = String::from("| case | proof kernel TFLOP/s | check |\n|---|---|---|\n");
    for (n, &s) in lengths.iter().enumerate() {
        for causal in [false, true] {
            let c = Case::mha(s, 128, causal);
            let [(q, qv), (k, kv), (v, vv)] = inputs(c, dev);
            let mut o = Tensor::empty(&[c.b, s, c.hq, c.d], DType::BF16, dev).expect("alloc");
            o.fill(f64::NAN).expect("poison");
            let mut lse = Tensor::empty(&[c.b, c.hq, s], DType::F32, dev).expect("alloc");
            let scale = 1.0 / (c.d as f32).sqrt();
            let got = measure(c, dev, [&qv, &kv, &vv], || flash_attention(&q, &k, &v, &mut o, &mut lse, scale, causal as i64).map(|_| o.clone()));
            let row = match got {
                Ok((tf, err)) => {
                    series[causal as usize].values[n] = Some(tf);
                    format!("| B{} H{} S{s} D128{} | {tf:.1} | rel err {err:.1e} |", c.b, c.hq, if causal { " causal" } else { "" })
                }
                Err(e) => format!("| B{} H{} S{s} D128{} | — | {e} |", c.b, c.hq, if causal { " causal" } else { "" }),
            };
            println!("{row}");
            md.push_str(&row);
            md.push('\n');
        }
    }
    (md, series)
}

fn main() {
    let Some(dev) = common::gpu() else { return };
    println!("kfuse::ops::attention, {}", dev.describe());
    let filter = std::env::var("KFUSE_BENCH_FILTER").ok();
    let ops = op_table(&dev, filter.as_deref());
    if filter.is_some() {
        return;
    }
    println!("kfuse::ops::attention_varlen, {}", dev.describe());
    let varlen = format!("| case | kfuse TFLOP/s | check |\n|---|---|---|\n{}", varlen_rows(&dev));
    println!("flash attention proof kernel (tests/kernels/flash_attention.rs), {}", dev.describe());
    let lengths = [1024usize, 2048, 4096, 8192];
    let (proof, series) = proof_table(&dev, &lengths);
    if let Some(dir) = common::report::out_dir() {
        let _ = std::fs::write(dir.join("attention.md"), format!("{ops}\n{varlen}\n{proof}"));
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

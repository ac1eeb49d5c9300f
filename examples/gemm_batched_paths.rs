//! Batched products (`kfuse::ops::gemm_batched_ex`, one `b` per batch entry): bf16,
//! f16, and f32 read as TF32 (`b` K-major, the transpose of a `[B, N, K]` tensor, as
//! TF32 wants it). For each: the worst of 256
//! sampled elements against float64, then the times of all of them
//! (same inputs, CUDA events, `benches/common`'s interleaved rounds, median) in TFLOP/s
//! (2·B·M·N·K a call).
//!
//!     cargo run --release --example gemm_batched_paths [B M N K]   (default 8 2048 2048 2048)
#[path = "../benches/common/mod.rs"]
mod common;

use kfuse::ops::GemmOptions;
use kfuse::DType;

fn main() -> kfuse::Result<()> {
    let Some(dev) = common::gpu() else { return Ok(()) };
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let [nb, m, n, k] = match args[..] {
        [nb, m, n, k] => [nb, m, n, k],
        _ => [8, 2048, 2048, 2048],
    };
    let mut fns: Vec<Box<dyn FnMut() -> kfuse::Result<()>>> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (dt, tf32) in [(DType::BF16, false), (DType::F16, false), (DType::F32, true)] {
        let (a, av) = common::random(&[nb, m, k], dt, 1, &dev);
        // TF32 reads `b` K-major only: the transpose of an [B, N, K] tensor
        let (b, bv, bt) = if tf32 {
            let (bt, v) = common::random(&[nb, n, k], dt, 2, &dev);
            (bt.permute(&[0, 2, 1])?, v, true)
        } else {
            let (b, v) = common::random(&[nb, k, n], dt, 2, &dev);
            (b, v, false)
        };
        {
            let name = format!("{dt}{}", if tf32 { " (tf32)" } else { "" });
            let opts = GemmOptions { tf32, ..Default::default() };
            let c = match kfuse::ops::gemm_batched_ex(&a, &b, &opts) {
                Ok(c) => c,
                Err(e) => {
                    println!("--- {name}: {e}");
                    continue;
                }
            };
            let got = c.to_vec_f64()?;
            let mut worst: f64 = 0.0;
            for s in 0..256 {
                let (z, i, j) = (s % nb, (s * 7919 + 13) % m, (s * 104729 + 7) % n);
                let bat = |kk: usize| if bt { bv[(z * n + j) * k + kk] } else { bv[(z * k + kk) * n + j] };
                let want: f64 = (0..k).map(|kk| f64::from(av[(z * m + i) * k + kk]) * f64::from(bat(kk))).sum();
                let g = got[(z * m + i) * n + j];
                worst = if g.is_finite() { worst.max((g - want).abs() / want.abs().max(1.0)) } else { f64::INFINITY };
            }
            println!("{name}: worst sampled error {worst:.2e}");
            let (a, b) = (a.clone(), b.clone());
            names.push(name);
            fns.push(Box::new(move || kfuse::ops::gemm_batched_ex(&a, &b, &GemmOptions { tf32, ..Default::default() }).map(|_| ())));
        }
    }
    let mut refs: Vec<&mut dyn FnMut() -> kfuse::Result<()>> = fns.iter_mut().map(|f| &mut **f as &mut dyn FnMut() -> kfuse::Result<()>).collect();
    let times = common::interleaved(&dev, 10, 60, &mut refs);
    let tflops = |ms: f64| 2.0 * (nb * m * n * k) as f64 / (ms * 1e-3) / 1e12;
    println!("\n| B{nb} M{m} N{n} K{k} | ms | TFLOP/s |\n|---|---|---|");
    for (i, t) in times.iter().enumerate() {
        match t {
            Ok(ms) => println!("| {} | {ms:.3} | {:.0} |", names[i], tflops(*ms)),
            Err(e) => println!("| {} | error {e} | |", names[i]),
        }
    }
    Ok(())
}

//! `kfuse::ops::kernels::gemm` (bf16, `acc += dot(load, load)`) through the general
//! lowering (the default: the loop lowered op by op as every other loop is) and through
//! sm_90a's WGMMA template (`KFUSE_TILES`'s `GENERAL=0`), at several tilings, with A
//! row-major and as the transposed view of a `[K, M]` tensor (A MN-major): for each, the
//! plan's lines on how the loop runs, the worst of 256 sampled elements against float64
//! (output poisoned with NaN first), then the times of all of them (same inputs, CUDA
//! events, `benches/common`'s interleaved rounds, median) in TFLOP/s (2·M·N·K a call).
//! `VARIANT=<name>` runs one of them only (for a profiler).
//!
//!     cargo run --release --example general_gemm [M N K]   (default 4096 4096 4096)
#[path = "../benches/common/mod.rs"]
mod common;

use kfuse::{Config, DType, Tensor};

fn main() -> kfuse::Result<()> {
    let Some(dev) = common::gpu() else { return Ok(()) };
    let (m, n, k) = common::mnk_args();
    let (a, av) = common::random(&[m, k], DType::BF16, 1, &dev);
    let (b, bv) = common::random(&[k, n], DType::BF16, 2, &dev);
    // the same A as the transposed view of a [K, M] tensor
    let mut avt = vec![0.0f32; m * k];
    for (i, row) in av.chunks(k).enumerate() {
        for (kk, &x) in row.iter().enumerate() {
            avt[kk * m + i] = x;
        }
    }
    let bytes: Vec<u8> = avt.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
    let a_t = Tensor::from_bytes(&bytes, &[k, m], DType::BF16, &dev)?.t();
    let variants: Vec<(&str, bool, Vec<(&str, u32)>)> = vec![
        ("general (default tiles)", false, vec![]),
        ("template (default tiles)", false, vec![("GENERAL", 0)]),
        ("general 128x128x64", false, vec![("BM", 128), ("BN", 128), ("BK", 64)]),
        ("template 128x128x64", false, vec![("GENERAL", 0), ("BM", 128), ("BN", 128), ("BK", 64)]),
        ("general, A transposed", true, vec![]),
        ("template, A transposed", true, vec![("GENERAL", 0)]),
    ];
    let only = std::env::var("VARIANT").ok();
    let variants: Vec<_> = variants.into_iter().filter(|v| only.as_deref().is_none_or(|o| v.0 == o)).collect();
    let mut fns: Vec<Box<dyn FnMut() -> kfuse::Result<()>>> = Vec::new();
    let mut names: Vec<&str> = Vec::new();
    for (name, transposed, tiles) in &variants {
        let a = if *transposed { &a_t } else { &a };
        Config::new().tiles(tiles.iter().cloned()).apply()?;
        // poison, run once, check sampled elements against float64
        let nan = vec![0xFFu8; m * n * 2];
        let mut c = Tensor::from_bytes(&nan, &[m, n], DType::BF16, &dev)?;
        match kfuse::ops::kernels::gemm(a, &b, &mut c) {
            Ok(l) => {
                if let Some(p) = &l.plan {
                    println!("--- {name}\n{p}");
                }
            }
            Err(e) => {
                println!("--- {name}: {e}");
                continue;
            }
        }
        let got = c.to_vec_f64()?;
        let mut worst: f64 = 0.0;
        for s in 0..256 {
            let (i, j) = ((s * 7919 + 13) % m, (s * 104729 + 7) % n);
            let want: f64 = (0..k).map(|kk| f64::from(av[i * k + kk]) * f64::from(bv[kk * n + j])).sum();
            let g = got[i * n + j];
            worst = if g.is_finite() { worst.max((g - want).abs() / want.abs().max(1.0)) } else { f64::INFINITY };
        }
        println!("{name}: worst sampled error {worst:.2e}");
        let (a, b) = (a.clone(), b.clone());
        let mut c2 = Tensor::empty(&[m, n], DType::BF16, &dev)?;
        let tiles = tiles.clone();
        names.push(name);
        fns.push(Box::new(move || {
            Config::new().tiles(tiles.iter().cloned()).apply()?;
            kfuse::ops::kernels::gemm(&a, &b, &mut c2).map(|_| ())
        }));
    }
    let mut refs: Vec<&mut dyn FnMut() -> kfuse::Result<()>> = fns.iter_mut().map(|f| &mut **f as &mut dyn FnMut() -> kfuse::Result<()>).collect();
    let times = common::interleaved(&dev, 10, 100, &mut refs);
    let tflops = |ms: f64| 2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12;
    println!("\n| M{m} N{n} K{k} bf16 | ms | TFLOP/s |\n|---|---|---|");
    let ok = names;
    for (i, t) in times.iter().enumerate() {
        match t {
            Ok(ms) => println!("| {} | {ms:.3} | {:.0} |", ok.get(i).unwrap_or(&"?"), tflops(*ms)),
            Err(e) => println!("| {} | error {e} | |", ok.get(i).unwrap_or(&"?")),
        }
    }
    Ok(())
}

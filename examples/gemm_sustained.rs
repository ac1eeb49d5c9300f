//! A development aid for the GEMM notes: how kfuse's and cuBLAS's bf16 GEMMs hold their
//! speed under sustained back-to-back calls (where the GPU runs at its power limit), phase
//! by phase, with the host clock at each phase's start printed so that a clock/power log
//! taken beside it (`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv
//! -lms 20`) can be lined up.
//!
//!     cargo run --release --example gemm_sustained [M N K [CALLS]]   (default 8192 14336 4096 300)
//!
//! Phases (`KFUSE_PHASES`, default `cublas,kfuse-new-output,kfuse,cublas`): cuBLAS alone;
//! `kfuse::ops::gemm` alone (a new output each call, as the benchmark calls it); kfuse's
//! kernel into one preallocated output, `kfuse:TILES` with the tile overrides `TILES` (as
//! `KFUSE_TILES` spells them, `+` for `,`; made in code, `kfuse::Config::tiles`) for that
//! phase; then (without `KFUSE_PHASES`) cuBLAS and `kfuse::ops::gemm` alternating in
//! blocks of 10 calls. Each call is timed by CUDA events around it;
//! a phase prints its median, the medians of its first and last fifth, and its spread.
//! `KFUSE_PROBE=1` prints what the clock-probe source hook (a prototype kept in git
//! history; NOTES g24) measured.

#[path = "../benches/common/mod.rs"]
mod common;

use kfuse::runtime::vendor::{Library, Math};
use std::time::Instant;

fn report(name: &str, t: &[f32], flops: f64, start: Instant, at: f64) {
    let fifth = (t.len() / 5).max(1);
    let tf = |ms: f64| flops / (ms * 1e-3) / 1e12;
    let median = |v: &[f32]| common::median(v.to_vec());
    let (lo, hi) = t.iter().fold((f32::MAX, 0f32), |(a, b), &x| (a.min(x), b.max(x)));
    println!(
        "{name:<34} from {at:7.3} s to {:7.3} s: median {:.3} ms ({:.0} TFLOP/s); first fifth {:.0}, last fifth {:.0}; range {:.0}–{:.0}",
        start.elapsed().as_secs_f64(),
        median(t),
        tf(median(t)),
        tf(median(&t[..fifth])),
        tf(median(&t[t.len() - fifth..])),
        tf(hi as f64),
        tf(lo as f64)
    );
}

fn main() -> kfuse::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("M N K [CALLS]")).collect();
    let (m, n, k) = if args.len() >= 3 { (args[0], args[1], args[2]) } else { (8192, 14336, 4096) };
    let calls = args.get(3).copied().unwrap_or(300);
    let Some(common::gemm::Study { dev, blas, a, b, mut c_blas, mut c_kf }) = common::gemm::Study::bf16(m, n, k)? else { return Ok(()) };
    let flops = 2.0 * (m * n * k) as f64;
    let start = Instant::now();
    // compile and load first (not timed)
    kfuse::ops::kernels::gemm(&a, &b, &mut c_kf)?;
    kfuse::ops::gemm(&a, &b)?;
    blas.gemm_into(&a, &b, &mut c_blas, Library::Cublas, Math::Fp32)?;
    dev.synchronize()?;
    // the phases: `KFUSE_PHASES=cublas,kfuse,kfuse:MCASTB=2,…` (a kfuse phase's tiles, `+` for `,`,
    // are the tile overrides for that phase), or the default four
    let default = "cublas,kfuse-new-output,kfuse,cublas".to_string();
    let asked = std::env::var("KFUSE_PHASES").ok();
    let phases = asked.clone().unwrap_or(default);
    // made in code, not by changing `KFUSE_TILES`: the CUDA libraries' threads may read
    // the process's environment while this thread would write it
    let set_tiles = |tiles: &str| -> kfuse::Result<()> {
        let mut list = Vec::new();
        for entry in tiles.split('+').map(str::trim).filter(|e| !e.is_empty()) {
            let parsed = entry.split_once('=').and_then(|(k, v)| Some((k.trim().to_string(), v.trim().parse::<u32>().ok()?)));
            list.push(parsed.ok_or_else(|| kfuse::Error::InvalidArgument(format!("KFUSE_PHASES: `{entry}` is not NAME=SIZE")))?);
        }
        kfuse::Config::new().tiles(list).apply()
    };
    // each tile setting compiled before the timed phases (no idle gap between them)
    for name in phases.split(',') {
        if let Some((_, tiles)) = name.split_once(':') {
            set_tiles(tiles)?;
            kfuse::ops::kernels::gemm(&a, &b, &mut c_kf)?;
        }
    }
    dev.synchronize()?;
    for name in phases.split(',') {
        let (what, tiles) = name.split_once(':').unwrap_or((name, ""));
        set_tiles(tiles)?;
        // every call timed by events around it, 10 untimed calls first
        let at = start.elapsed().as_secs_f64();
        let t = match what {
            "kfuse-new-output" => dev.time_ms(10, calls, || kfuse::ops::gemm(&a, &b).map(drop))?,
            "kfuse" => dev.time_ms(10, calls, || kfuse::ops::kernels::gemm(&a, &b, &mut c_kf).map(drop))?,
            "cublas" => dev.time_ms(10, calls, || blas.gemm_into(&a, &b, &mut c_blas, Library::Cublas, Math::Fp32))?,
            other => return Err(kfuse::Error::InvalidArgument(format!("KFUSE_PHASES: unknown phase `{other}` (cublas, kfuse, kfuse-new-output)"))),
        };
        report(name, &t, flops, start, at);
    }
    kfuse::runtime::settings::clear_config();
    // `KFUSE_PROBE=1`: the totals the clock-probe source hook (NOTES g24) leaves at the
    // start of kfuse's output (block 0's cycles, nanoseconds and calls over the process)
    if std::env::var("KFUSE_PROBE").is_ok() {
        let bytes = c_kf.to_bytes()?;
        let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap());
        let (cycles, ns, n) = (word(0), word(1), word(2).max(1));
        println!(
            "probe: {n} calls, block 0 ran {} cycles and {:.1} µs a call: {:.3} GHz",
            cycles / n,
            ns as f64 / n as f64 / 1e3,
            cycles as f64 / ns.max(1) as f64
        );
    }
    if asked.is_some() {
        return Ok(());
    }
    // alternating blocks of 10, as the benchmark's rounds
    let (mut tb, mut tk) = (Vec::new(), Vec::new());
    let at = start.elapsed().as_secs_f64();
    for _ in 0..calls / 10 {
        tb.extend(dev.time_ms(2, 10, || blas.gemm_into(&a, &b, &mut c_blas, Library::Cublas, Math::Fp32))?);
        tk.extend(dev.time_ms(2, 10, || kfuse::ops::gemm(&a, &b).map(drop))?);
    }
    report("alternating: cuBLAS", &tb, flops, start, at);
    report("alternating: kfuse::ops::gemm", &tk, flops, start, at);
    Ok(())
}

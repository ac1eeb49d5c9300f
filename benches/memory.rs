//! Memory-bound kernels against the device's own copy bandwidth, measured in the same
//! run: elementwise add and copy over 2^28 bf16 elements, transpose of 16384×16384 bf16.
//!
//! Prints a table (GB/s counting bytes read once and written once, the fraction of a
//! device-to-device `cuMemcpyDtoD` measured in the same process, and the device memory
//! each kernel's launches took above its tensors), writes it as
//! `bench.md` and `bench.json` into `$KFUSE_BENCH_OUT` when set, then runs the same
//! kernels under criterion (skipped with `--table-only`; `--mid-only` prints only the
//! mid-size rows below).
//!
//! Timing: CUDA events around each launch, 10 warm-ups, 50 timed launches, median.
//! Inputs are random bf16 (never zeros), far larger than the 50 MB L2. Each kernel's
//! output is checked once before it is timed.
//!
//! A second table, "mid sizes", times copy and add on tensors of 16, 64 and 512 MiB
//! (each input and the output that size) and a device copy of the same bytes, the L2
//! evicted before every launch outside the timed interval (`common::L2Flush`), and
//! writes it as `memory_mid.json` into `$KFUSE_BENCH_OUT`: the rows that
//! `scripts/bench_torch_memory.py` joins with PyTorch's `copy_` and `add` of the same
//! sizes, timed the same way in the same device call.

use std::time::Duration;

use criterion::Criterion;
mod common;

use common::{dtod, median, random_bf16};
use kfuse::ops::kernels;
use kfuse::{DType, Tensor};

const N: usize = 1 << 28;
const T: usize = 16384;



struct Row {
    name: &'static str,
    shape: String,
    ms: f64,
    bytes: f64,
    /// Device memory the timed launches took from the pool above the tensors they were
    /// given (`None` where not measured).
    extra_mem: Option<usize>,
}

/// Times `f` (`w` warm-ups, `it` launches, median) and reads the device memory its
/// launches took above what was allocated before them.
fn timed(dev: &kfuse::Device, w: usize, it: usize, f: impl FnMut() -> kfuse::Result<()>) -> kfuse::Result<(f64, usize)> {
    let span = common::report::MemorySpan::open(dev);
    let ms = median(dev.time_ms(w, it, f)?);
    Ok((ms, span.peak(dev)))
}


/// Copy, add and the device copy at 16, 64 and 512 MiB a tensor, the L2 evicted before
/// each launch; checked once each before timing.
fn mid_sizes(dev: &kfuse::Device, w: usize, it: usize) -> kfuse::Result<Vec<Row>> {
    let mut l2 = common::L2Flush::new(dev)?;
    let mut rows = Vec::new();
    for mib in [16usize, 64, 512] {
        let n = mib << 19; // bf16 elements in `mib` MiB
        let (a, av) = random_bf16(n, 11, dev);
        let (b, bv) = random_bf16(n, 12, dev);
        let mut c = Tensor::empty(&[n], DType::BF16, dev)?;
        kernels::add(&a, &b, &mut c)?;
        let cv = c.to_vec_f32()?;
        for i in (0..n).step_by(997).chain([n - 1]) {
            assert_eq!(cv[i], half::bf16::from_f32(av[i] + bv[i]).to_f32(), "add wrong at {i} of {n}");
        }
        kernels::copy(&a, &mut c)?;
        assert_eq!(c.to_vec_f32()?, av, "copy wrong at {mib} MiB");
        let bytes = (n * 2) as f64;
        let t = median(dev.time_ms_with(w, it, || l2.flush(), || dtod(dev, &a, &mut c))?);
        rows.push(Row { name: "device copy (cuMemcpyDtoD)", shape: mib.to_string(), ms: t, bytes: 2.0 * bytes, extra_mem: None });
        let t = median(dev.time_ms_with(w, it, || l2.flush(), || kernels::copy(&a, &mut c).map(|_| ()))?);
        rows.push(Row { name: "kfuse copy", shape: mib.to_string(), ms: t, bytes: 2.0 * bytes, extra_mem: None });
        let t = median(dev.time_ms_with(w, it, || l2.flush(), || kernels::add(&a, &b, &mut c).map(|_| ()))?);
        rows.push(Row { name: "kfuse add", shape: mib.to_string(), ms: t, bytes: 3.0 * bytes, extra_mem: None });
    }
    Ok(rows)
}

fn main() -> kfuse::Result<()> {
    let table_only = std::env::args().any(|a| a == "--table-only");
    let Some(dev) = common::gpu() else { return Ok(()); };
    if std::env::args().any(|a| a == "--mid-only") {
        // the mid-size table alone (e.g. under `KFUSE_TILES` / `KFUSE_THREADS` settings)
        for r in mid_sizes(&dev, 10, 50)? {
            println!("{} {} MiB: {:.4} ms, {:.0} GB/s", r.name, r.shape, r.ms, r.bytes / r.ms / 1e6);
        }
        return Ok(());
    }
    let a = random_bf16(N, 1, &dev).0;
    let b = random_bf16(N, 2, &dev).0;
    let mut c = Tensor::empty(&[N], DType::BF16, &dev)?;
    let x = random_bf16(T * T, 3, &dev).0.reshape(&[T, T])?;
    let mut y = Tensor::empty(&[T, T], DType::BF16, &dev)?;

    // correctness, once each
    kernels::add(&a, &b, &mut c)?;
    let (av, bv, cv) = (a.to_vec_f32()?, b.to_vec_f32()?, c.to_vec_f32()?);
    for i in (0..N).step_by(4099) {
        let want = half::bf16::from_f32(av[i] + bv[i]).to_f32();
        assert_eq!(cv[i], want, "add wrong at {i}");
    }
    kernels::copy(&a, &mut c)?;
    assert_eq!(c.to_vec_f32()?, av, "copy wrong");
    kernels::transpose(&x, &mut y)?;
    let (xv, yv) = (x.to_vec_f32()?, y.to_vec_f32()?);
    for i in (0..T).step_by(97) {
        for j in (0..T).step_by(89) {
            assert_eq!(yv[j * T + i], xv[i * T + j], "transpose wrong at {i},{j}");
        }
    }

    let (w, it) = (10, 50);
    let nb = (N * 2) as f64;
    let mut rows = Vec::new();
    let bar = common::report::progress(5, "memory");
    let (t, _) = timed(&dev, w, it, || dtod(&dev, &a, &mut c))?;
    rows.push(Row { name: "device copy (cuMemcpyDtoD)", shape: "2^28 bf16".into(), ms: t, bytes: 2.0 * nb, extra_mem: None });
    bar.inc(1);
    let (t, m) = timed(&dev, w, it, || kernels::copy(&a, &mut c).map(|_| ()))?;
    rows.push(Row { name: "kfuse copy", shape: "2^28 bf16".into(), ms: t, bytes: 2.0 * nb, extra_mem: Some(m) });
    bar.inc(1);
    let (t, m) = timed(&dev, w, it, || kernels::add(&a, &b, &mut c).map(|_| ()))?;
    rows.push(Row { name: "kfuse add", shape: "2^28 bf16".into(), ms: t, bytes: 3.0 * nb, extra_mem: Some(m) });
    bar.inc(1);
    let (t, m) = timed(&dev, w, it, || kernels::transpose(&x, &mut y).map(|_| ()))?;
    rows.push(Row { name: "kfuse transpose", shape: format!("{T}x{T} bf16"), ms: t, bytes: 2.0 * (T * T * 2) as f64, extra_mem: Some(m) });
    bar.inc(1);
    bar.set_message("mid sizes");
    let mid = mid_sizes(&dev, w, it)?;
    bar.finish_and_clear();

    let ceiling = rows[0].bytes / rows[0].ms / 1e6;
    let mut md = String::from("| kernel | shape | time (ms) | GB/s | of copy bandwidth | device memory above its tensors (MiB) |\n|---|---|---|---|---|---|\n");
    let mut json = Vec::new();
    for r in &rows {
        let gbs = r.bytes / r.ms / 1e6;
        let extra = r.extra_mem.map(common::report::mib).unwrap_or_default();
        md.push_str(&format!("| {} | {} | {:.3} | {:.0} | {:.1}% | {extra} |\n", r.name, r.shape, r.ms, gbs, 100.0 * gbs / ceiling));
        json.push(format!(
            "{{\"kernel\": \"{}\", \"shape\": \"{}\", \"ms\": {:.4}, \"gbps\": {:.1}, \"fraction_of_copy\": {:.4}}}",
            r.name, r.shape, r.ms, gbs, gbs / ceiling
        ));
    }
    let device = dev.describe();
    println!("device: {device}\n{md}");
    let mut mid_md = String::from("| kernel | MiB a tensor | time (ms) | GB/s |\n|---|---|---|---|\n");
    for r in &mid {
        mid_md.push_str(&format!("| {} | {} | {:.4} | {:.0} |\n", r.name, r.shape, r.ms, r.bytes / r.ms / 1e6));
    }
    println!("mid sizes (L2 evicted before each launch):\n{mid_md}");
    if let Ok(out) = std::env::var("KFUSE_BENCH_OUT") {
        let out = std::path::PathBuf::from(out);
        let rows: Vec<String> = mid
            .iter()
            .map(|r| format!("{{\"kernel\": \"{}\", \"mib\": {}, \"ms\": {:.5}, \"bytes\": {}}}", r.name, r.shape, r.ms, r.bytes))
            .collect();
        std::fs::write(out.join("memory_mid.json"), format!("{{\"device\": \"{device}\", \"rows\": [\n  {}\n]}}\n", rows.join(",\n  "))).ok();
        std::fs::write(out.join("bench.md"), format!("device: {device}\n\n{md}")).ok();
        std::fs::write(out.join("bench.json"), format!("{{\"device\": \"{device}\", \"rows\": [\n  {}\n]}}\n", json.join(",\n  "))).ok();
    }
    if table_only {
        return Ok(());
    }

    let mut crit = Criterion::default().configure_from_args().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    let mut timed = |name: &str, f: &mut dyn FnMut() -> kfuse::Result<()>| {
        crit.bench_function(name, |bch| {
            bch.iter_custom(|iters| {
                let ms = dev.time_ms(0, 1, || {
                    for _ in 0..iters {
                        f()?;
                    }
                    Ok(())
                });
                Duration::from_secs_f64(ms.expect("timing")[0] as f64 / 1e3)
            })
        });
    };
    timed("device_copy_2^28_bf16", &mut || dtod(&dev, &a, &mut c));
    timed("copy_2^28_bf16", &mut || kernels::copy(&a, &mut c).map(|_| ()));
    timed("add_2^28_bf16", &mut || kernels::add(&a, &b, &mut c).map(|_| ()));
    timed("transpose_16384^2_bf16", &mut || kernels::transpose(&x, &mut y).map(|_| ()));
    crit.final_summary();
    Ok(())
}

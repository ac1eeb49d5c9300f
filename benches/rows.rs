//! Row kernels against the device's own copy bandwidth, measured in the same run: softmax,
//! RMSNorm (with weight), LayerNorm (weight and bias) and the last-axis sum, bf16, on
//! M×N = 32768×1024, 8192×4096, 4096×16384, 1024×131072, 256×262144 (2^25 to 2^27
//! elements), plus kfuse's copy of the same tensor as a reference row.
//!
//! Prints a table (GB/s counting each input read once and each output written once, the
//! f32 statistics included; the fraction of a device-to-device `cuMemcpyDtoD` of 2^28
//! bf16 measured in the same process; the device memory each op's launches took above
//! its tensors, and per shape the pool's bytes for the tensors against the pool's peak
//! while they were allocated), writes it as `rows.md` and `rows.json` into
//! `$KFUSE_BENCH_OUT` when set, with a chart, `rows.svg` (GB/s per op and shape, beside
//! PyTorch's when `scripts/bench_torch.py` wrote `torch_rows.json` there first), then
//! runs the same kernels under criterion (skipped with `--table-only`).
//! `scripts/compare_rows.py` joins the two tables. On a terminal a progress bar shows
//! the op being timed.
//!
//! Timing: CUDA events around each launch, 10 warm-ups, 50 timed launches, median; the
//! L2 cache is evicted before every launch, outside the timed interval, by reading a
//! 256 MiB buffer (`common::L2Flush`; `scripts/bench_torch.py` does the same on the
//! PyTorch side), so every launch reads its input from DRAM and its interval holds GPU
//! time, not the host's launch latency. `KFUSE_BENCH_DIAG=1` also prints other timings
//! of each launch (see `diagnose`); `KFUSE_BENCH_SHAPES=1024x131072,…` measures only
//! those shapes. The criterion runs time launches back to back with
//! no eviction (warm throughput); the table, not criterion, is what the bar reads.
//! Inputs are random bf16 (never all zeros). Each kernel's output is checked once, on
//! sampled rows against a float64 CPU reference, before it is timed; a shape the compiler
//! refuses, or a wrong result, gets a row saying so instead of a time.

use std::time::Duration;

use criterion::Criterion;
mod common;

use common::{dtod, median, random_bf16, L2Flush};
use kfuse::ops::kernels;
use kfuse::{DType, Device, Tensor};

const SHAPES: [(usize, usize); 5] = [(32768, 1024), (8192, 4096), (4096, 16384), (1024, 131072), (256, 262144)];
const COPY_N: usize = 1 << 28;
const EPS: f32 = 1e-5;




#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Softmax,
    RmsNorm,
    LayerNorm,
    Sum,
    /// kfuse's 2-D copy of the same tensor: what moving these bytes costs at this size
    /// (a reference row, no bar).
    Copy,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Softmax => "softmax",
            Op::RmsNorm => "rms_norm",
            Op::LayerNorm => "layer_norm",
            Op::Sum => "sum",
            Op::Copy => "copy",
        }
    }
    fn label(self) -> &'static str {
        match self {
            Op::Softmax => "softmax",
            Op::RmsNorm => "RMSNorm (weight)",
            Op::LayerNorm => "LayerNorm (weight, bias)",
            Op::Sum => "sum (last axis)",
            Op::Copy => "copy (reference)",
        }
    }
    /// Minimum bytes moved: inputs read once, outputs (statistics included) written once.
    fn bytes(self, m: usize, n: usize) -> f64 {
        let (x, v, row16, row32) = ((m * n * 2) as f64, (n * 2) as f64, (m * 2) as f64, (m * 4) as f64);
        match self {
            Op::Softmax | Op::Copy => 2.0 * x,
            Op::RmsNorm => 2.0 * x + v + row32,
            Op::LayerNorm => 2.0 * x + 2.0 * v + 2.0 * row32,
            Op::Sum => x + row16,
        }
    }
}

const OPS: [Op; 5] = [Op::Softmax, Op::RmsNorm, Op::LayerNorm, Op::Sum, Op::Copy];

/// The tensors of one shape: inputs, outputs, and the host copies the check needs.
struct Bufs {
    m: usize,
    n: usize,
    x: Tensor,
    xv: Vec<f32>,
    w: Tensor,
    wv: Vec<f32>,
    b: Tensor,
    bv: Vec<f32>,
    y: Tensor,
    s: Tensor,
    mean: Tensor,
    rstd: Tensor,
}

fn launch(op: Op, t: &mut Bufs) -> kfuse::Result<kfuse::Launched> {
    match op {
        Op::Softmax => kernels::softmax(&t.x, &mut t.y),
        Op::RmsNorm => kernels::rms_norm_w(&t.x, &t.w, &mut t.y, &mut t.rstd, EPS),
        Op::LayerNorm => kernels::layer_norm(&t.x, &t.w, &t.b, &mut t.y, &mut t.mean, &mut t.rstd, EPS),
        Op::Sum => kernels::row_sum(&t.x, &mut t.s),
        Op::Copy => kernels::copy2d(&t.x, &mut t.y),
    }
}

/// Checks 64 rows spread over the tensor against float64: returns the worst per-row
/// relative error, or what is wrong.
fn check(op: Op, t: &Bufs) -> Result<f64, String> {
    let (m, n) = (t.m, t.n);
    let y = if op == Op::Sum { t.s.to_vec_f32() } else { t.y.to_vec_f32() }.map_err(|e| e.to_string())?;
    let rstd = t.rstd.to_vec_f32().map_err(|e| e.to_string())?;
    let mut worst: f64 = 0.0;
    for k in 0..64 {
        let i = (k * (m - 1)) / 63;
        let x: Vec<f64> = t.xv[i * n..(i + 1) * n].iter().map(|&v| v as f64).collect();
        let nf = n as f64;
        let (want, got): (Vec<f64>, Vec<f64>) = match op {
            Op::Sum => (vec![x.iter().sum()], vec![y[i] as f64]),
            Op::Copy => (x.clone(), y[i * n..(i + 1) * n].iter().map(|&v| v as f64).collect()),
            Op::Softmax => {
                let mx = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = x.iter().map(|v| (v - mx).exp()).sum();
                (x.iter().map(|v| (v - mx).exp() / z).collect(), y[i * n..(i + 1) * n].iter().map(|&v| v as f64).collect())
            }
            Op::RmsNorm => {
                let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / nf + EPS as f64).sqrt();
                if ((rstd[i] as f64) - r).abs() > 1e-5 * r {
                    return Err(format!("row {i}: rstd {} vs {r}", rstd[i]));
                }
                (x.iter().zip(&t.wv).map(|(v, w)| v * r * *w as f64).collect(), y[i * n..(i + 1) * n].iter().map(|&v| v as f64).collect())
            }
            Op::LayerNorm => {
                let mu = x.iter().sum::<f64>() / nf;
                let r = 1.0 / (x.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / nf + EPS as f64).sqrt();
                if ((rstd[i] as f64) - r).abs() > 1e-5 * r {
                    return Err(format!("row {i}: rstd {} vs {r}", rstd[i]));
                }
                let want = x.iter().enumerate().map(|(j, v)| (v - mu) * r * t.wv[j] as f64 + t.bv[j] as f64).collect();
                (want, y[i * n..(i + 1) * n].iter().map(|&v| v as f64).collect())
            }
        };
        let num: f64 = want.iter().zip(&got).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f64 = want.iter().map(|a| a * a).sum();
        let e = if den == 0.0 { num.sqrt() } else { (num / den).sqrt() };
        if !(e <= 8e-3) {
            return Err(format!("row {i}: relative error {e:.2e}"));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

struct Row {
    op: Op,
    m: usize,
    n: usize,
    /// Time in ms, or why there is none.
    result: Result<f64, String>,
    err: Option<f64>,
    tiles: String,
    /// Device memory the op's timed launches took from the pool above its tensors (none
    /// of these ops allocates temporaries: 0 unless one does).
    extra_mem: Option<usize>,
}

/// The chart of the table: a panel per op (the copy reference row left out), a group of
/// bars per shape, kfuse's GB/s beside PyTorch's where `torch_rows.json`
/// (`scripts/bench_torch.py`, run before this benchmark into the same `$KFUSE_BENCH_OUT`)
/// is there, and this run's device copy as the ceiling.
fn chart(rows: &[Row], copy_gbps: f64, out: &std::path::Path, device: &str) -> Vec<common::report::Panel> {
    let torch: Option<serde_json::Value> = std::fs::read_to_string(out.join("torch_rows.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
    let torch_gbps = |op: Op, m: usize, n: usize| -> Option<f64> {
        let rows = torch.as_ref()?.get("rows")?.as_array()?;
        let r = rows.iter().find(|r| r["op"] == op.name() && r["M"] == m && r["N"] == n && r["status"] == "ok")?;
        r["gbps"].as_f64()
    };
    let shapes: Vec<(usize, usize)> = rows.iter().filter(|r| r.op == OPS[0]).map(|r| (r.m, r.n)).collect();
    OPS.iter()
        .filter(|&&op| op != Op::Copy)
        .map(|&op| {
            let of = |r: &&Row| r.op == op;
            let kfuse: Vec<Option<f64>> = rows.iter().filter(of).map(|r| r.result.as_ref().ok().map(|ms| r.op.bytes(r.m, r.n) / ms / 1e6)).collect();
            let mut series = vec![common::report::Series { name: "kfuse".into(), values: kfuse }];
            if torch.is_some() {
                series.push(common::report::Series { name: "PyTorch".into(), values: shapes.iter().map(|&(m, n)| torch_gbps(op, m, n)).collect() });
            }
            common::report::Panel {
                title: format!("{}, bf16 ({device})", op.label()),
                y_label: "GB/s".into(),
                labels: shapes.iter().map(|(m, n)| format!("{m}×{n}")).collect(),
                series,
                reference: Some((copy_gbps, "device copy".into())),
            }
        })
        .collect()
}

fn main() -> kfuse::Result<()> {
    let table_only = std::env::args().any(|a| a == "--table-only");
    let diag = std::env::var_os("KFUSE_BENCH_DIAG").is_some();
    let Some(dev) = common::gpu() else { return Ok(()); };
    let (w, it) = (10, 50);

    // the ceiling: a device-to-device copy of 2^28 bf16, in this process
    let (ca, _) = random_bf16(COPY_N, 1, &dev);
    let mut cb = Tensor::empty(&[COPY_N], DType::BF16, &dev)?;
    let mut l2 = L2Flush::new(&dev)?;
    let copy_ms = median(dev.time_ms_with(w, it, || l2.flush(), || dtod(&dev, &ca, &mut cb))?);
    let copy_gbps = 2.0 * (COPY_N * 2) as f64 / copy_ms / 1e6;
    drop((ca, cb));

    let mut rows = Vec::new();
    let mut bufs = Vec::new();
    // per shape: the pool bytes of its tensors and the pool's peak above what it held
    // before they were allocated
    let mut memory = Vec::new();
    // `KFUSE_BENCH_SHAPES=1024x131072,256x262144`: only those shapes (experiments)
    let only: Option<Vec<String>> = std::env::var("KFUSE_BENCH_SHAPES").ok().map(|v| v.split(',').map(str::to_string).collect());
    let shapes: Vec<(usize, (usize, usize))> = SHAPES.iter().copied().enumerate().filter(|(_, (m, n))| only.as_ref().is_none_or(|o| o.contains(&format!("{m}x{n}")))).collect();
    let bar = common::report::progress(shapes.len() * OPS.len(), "rows");
    for (si, (m, n)) in shapes {
        let span = common::report::MemorySpan::open(&dev);
        let (x, xv) = random_bf16(m * n, 10 + si as u64, &dev);
        let (w_, wv) = random_bf16(n, 20 + si as u64, &dev);
        let (b_, bv) = random_bf16(n, 30 + si as u64, &dev);
        let mut t = Bufs {
            m,
            n,
            x: x.reshape(&[m, n])?,
            xv,
            w: w_,
            wv,
            b: b_,
            bv,
            y: Tensor::empty(&[m, n], DType::BF16, &dev)?,
            s: Tensor::empty(&[m], DType::BF16, &dev)?,
            mean: Tensor::empty(&[m], DType::F32, &dev)?,
            rstd: Tensor::empty(&[m], DType::F32, &dev)?,
        };
        memory.push((m, n, common::report::pool_bytes(&[&t.x, &t.w, &t.b, &t.y, &t.s, &t.mean, &t.rstd]), span.peak(&dev)));
        for op in OPS {
            bar.set_message(format!("{} {m}x{n}", op.name()));
            let mut row = Row { op, m, n, result: Err(String::new()), err: None, tiles: String::new(), extra_mem: None };
            // first launch: compiles (or is refused), then the output is checked once
            // (a panic in the compiler is reported like a refusal, with its message)
            let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| launch(op, &mut t).and_then(|l| dev.synchronize().map(|_| l))))
                .unwrap_or_else(|p| {
                    let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                    Err(kfuse::Error::InvalidArgument(format!("the compiler panicked: {}", msg.unwrap_or_default())))
                });
            // what the driver's assembler made of it (registers; the register-room
            // attempt loaded when the kernel has several)
            let built = match first.as_ref().ok().and_then(|l| l.build) {
                Some(b) if b.register_attempt.1 > 1 => format!(", {} registers (attempt {} of {})", b.registers, b.register_attempt.0 + 1, b.register_attempt.1),
                Some(b) => format!(", {} registers", b.registers),
                None => String::new(),
            };
            row.result = match first {
                Err(e) => Err(format!("refused by the compiler: {}", e.to_string().lines().next().unwrap_or(""))),
                Ok(_) => match check(op, &t) {
                    Err(e) => Err(format!("WRONG RESULT: {e}")),
                    Ok(e) => {
                        row.err = Some(e);
                        if diag {
                            diagnose(op, &mut t, &dev);
                        }
                        let span = common::report::MemorySpan::open(&dev);
                        let timed = dev.time_ms_with(w, it, || l2.flush(), || launch(op, &mut t).map(|_| ())).map(median).map_err(|e| format!("timing failed: {e}"));
                        row.extra_mem = Some(span.peak(&dev));
                        timed
                    }
                },
            };
            row.tiles = schedule(op, &mut t, &dev) + &built;
            rows.push(row);
            bar.inc(1);
        }
        bufs.push(t);
    }
    bar.finish_and_clear();

    let device = dev.describe();
    let mut md = format!(
        "| op | M×N | time (ms) | GB/s | of copy bandwidth | device memory above its tensors (MiB) | schedule |\n|---|---|---|---|---|---|---|\n| device copy (cuMemcpyDtoD) | 2^28 bf16 | {copy_ms:.3} | {copy_gbps:.0} | 100.0% | | |\n"
    );
    let mut json = Vec::new();
    for r in &rows {
        let shape = format!("{}x{}", r.m, r.n);
        match &r.result {
            Ok(ms) => {
                let gbps = r.op.bytes(r.m, r.n) / ms / 1e6;
                let extra = r.extra_mem.map(common::report::mib).unwrap_or_default();
                md.push_str(&format!("| {} | {shape} | {ms:.3} | {gbps:.0} | {:.1}% | {extra} | {} |\n", r.op.label(), 100.0 * gbps / copy_gbps, r.tiles));
                json.push(format!(
                    "{{\"op\": \"{}\", \"M\": {}, \"N\": {}, \"status\": \"ok\", \"ms\": {ms:.5}, \"gbps\": {gbps:.1}, \"fraction_of_copy\": {:.4}, \"max_rel_err\": {:.2e}, \"extra_mem_bytes\": {}, \"schedule\": \"{}\"}}",
                    r.op.name(),
                    r.m,
                    r.n,
                    gbps / copy_gbps,
                    r.err.unwrap_or(0.0),
                    r.extra_mem.unwrap_or(0),
                    r.tiles.replace('"', "'")
                ));
            }
            Err(why) => {
                md.push_str(&format!("| {} | {shape} | — | — | — | | {} |\n", r.op.label(), why.replace('|', "/")));
                json.push(format!(
                    "{{\"op\": \"{}\", \"M\": {}, \"N\": {}, \"status\": \"{}\", \"note\": {}}}",
                    r.op.name(),
                    r.m,
                    r.n,
                    if why.starts_with("WRONG") { "wrong" } else { "refused" },
                    serde_json::Value::String(why.clone())
                ));
            }
        }
    }
    // device memory: each shape's tensors as the pool rounds them, and the pool's peak
    // above what it held before they were allocated
    md.push_str("\n| M×N | tensors of the shape (MiB, pool blocks) | pool peak while allocating them (MiB) |\n|---|---|---|\n");
    for (m, n, tensors, peak) in &memory {
        md.push_str(&format!("| {m}x{n} | {} | {} |\n", common::report::mib(*tensors), common::report::mib(*peak)));
    }
    println!("device: {device}\n{md}");
    if let Some(out) = common::report::out_dir() {
        std::fs::write(out.join("rows.md"), format!("device: {device}\n\n{md}")).ok();
        if let Err(e) = common::report::bar_charts(&out.join("rows.svg"), &chart(&rows, copy_gbps, &out, &dev.name()), 2) {
            eprintln!("{e}");
        }
        std::fs::write(
            out.join("rows.json"),
            format!(
                "{{\"device\": {}, \"copy_ms\": {copy_ms:.5}, \"copy_gbps\": {copy_gbps:.1}, \"rows\": [\n  {}\n]}}\n",
                serde_json::Value::String(device.clone()),
                json.join(",\n  ")
            ),
        )
        .ok();
    }
    if table_only {
        return Ok(());
    }

    let mut crit = Criterion::default().configure_from_args().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    for (si, t) in bufs.iter_mut().enumerate() {
        for op in OPS {
            if rows[si * OPS.len() + OPS.iter().position(|o| *o == op).unwrap()].result.is_err() {
                continue;
            }
            let name = format!("{}_{}x{}_bf16", op.name(), t.m, t.n);
            crit.bench_function(&name, |bch| {
                bch.iter_custom(|iters| {
                    let ms = dev.time_ms(0, 1, || {
                        for _ in 0..iters {
                            launch(op, t)?;
                        }
                        Ok(())
                    });
                    Duration::from_secs_f64(ms.expect("timing")[0] as f64 / 1e3)
                })
            });
        }
    }
    crit.final_summary();
    Ok(())
}

/// With `KFUSE_BENCH_DIAG` set: other ways to time the same launch, for the notes — per
/// launch with a warm L2 and the stream idle between launches (host launch latency
/// included), 20 launches back to back between two events (per launch), and the host's
/// own time to issue one launch.
fn diagnose(op: Op, t: &mut Bufs, dev: &Device) {
    let warm = dev.time_ms(10, 50, || launch(op, t).map(|_| ())).map(median).unwrap_or(f64::NAN);
    let batch = dev
        .time_ms(1, 10, || {
            for _ in 0..20 {
                launch(op, t)?;
            }
            Ok(())
        })
        .map(|v| median(v) / 20.0)
        .unwrap_or(f64::NAN);
    dev.synchronize().ok();
    let t0 = std::time::Instant::now();
    for _ in 0..200 {
        launch(op, t).ok();
    }
    let host_us = t0.elapsed().as_secs_f64() * 1e6 / 200.0;
    dev.synchronize().ok();
    println!("diag {:10} {}x{}: warm per-launch {:.4} ms, back-to-back {:.4} ms, host issue {:.1} us", op.name(), t.m, t.n, warm, batch, host_us);
}

/// What the scheduler chose for `op` on these tensors (threads, tiles), for the table.
fn schedule(op: Op, t: &mut Bufs, dev: &Device) -> String {
    let def = launch_def(op);
    let Ok(k) = (def.build)(&[DType::BF16]) else { return String::new() };
    let Some(target) = dev.target() else { return String::new() };
    let args = launch_args(op, t);
    match kfuse::runtime::spec_for(&k, &args).and_then(|spec| kfuse::runtime::emit_for(def, &[DType::BF16], &spec, &target)) {
        Ok(e) => {
            let tiles: Vec<String> = e.tiles.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{} threads {}", e.block_threads, tiles.join(" "))
        }
        Err(_) => String::new(),
    }
}

fn launch_def(op: Op) -> &'static kfuse::ir::KernelDef {
    match op {
        Op::Softmax => &kernels::softmax::DEF,
        Op::RmsNorm => &kernels::rms_norm_w::DEF,
        Op::LayerNorm => &kernels::layer_norm::DEF,
        Op::Sum => &kernels::row_sum::DEF,
        Op::Copy => &kernels::copy2d::DEF,
    }
}

fn launch_args(op: Op, t: &mut Bufs) -> Vec<kfuse::runtime::Arg<'_>> {
    use kfuse::runtime::{Arg, Scalar};
    match op {
        Op::Softmax => vec![Arg::In(&t.x), Arg::Out(&mut t.y)],
        Op::RmsNorm => vec![Arg::In(&t.x), Arg::In(&t.w), Arg::Out(&mut t.y), Arg::Out(&mut t.rstd), Arg::Scalar(Scalar::F32(EPS))],
        Op::LayerNorm => vec![
            Arg::In(&t.x),
            Arg::In(&t.w),
            Arg::In(&t.b),
            Arg::Out(&mut t.y),
            Arg::Out(&mut t.mean),
            Arg::Out(&mut t.rstd),
            Arg::Scalar(Scalar::F32(EPS)),
        ],
        Op::Sum => vec![Arg::In(&t.x), Arg::Out(&mut t.s)],
        Op::Copy => vec![Arg::In(&t.x), Arg::Out(&mut t.y)],
    }
}

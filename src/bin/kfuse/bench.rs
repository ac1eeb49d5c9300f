//! `kfuse bench`: times a standard kernel on GPU 0 with CUDA events, beside cuBLAS and
//! cuBLASLt for `gemm`, and compares each time with the roofline (`kfuse::runtime::roofline`).

use kfuse::ir::{KernelDef, ParamSig};
use kfuse::runtime::vendor::{Blas, Library, Math};
use kfuse::runtime::{launch, Arg, ArgDesc, Roofline, Scalar, TensorDesc};
use kfuse::{DType, Device, Error, Result, Tensor};

/// `kfuse bench` (see its `--help`).
pub(crate) fn run(b: &super::Bench) -> Result<()> {
    let (def, descs) = b.kernel.resolve()?;
    let device = Device::gpu(0).map_err(|e| match e {
        Error::NoGpu { reason } => Error::NoGpu {
            reason: format!("`kfuse bench` times kernels on GPU 0: {reason}; `kfuse explain` shows the plan and the roofline estimate without one"),
        },
        e => e,
    })?;
    let target = device.target().ok_or_else(|| Error::NoGpu { reason: format!("{} is no GPU", device.describe()) })?;
    let roof = kfuse::runtime::roofline(def, &descs, &target)?;
    let mut tensors = descs
        .iter()
        .enumerate()
        .map(|(i, d)| match d {
            ArgDesc::Tensor(t) => random(t, i as u64, &device).map(Some),
            ArgDesc::Scalar(_) => Ok(None),
        })
        .collect::<Result<Vec<_>>>()?;
    let (warmup, iters) = (b.warmup, b.iters as usize);
    let args: Vec<String> = descs.iter().map(ArgDesc::to_string).collect();
    println!("{}({}) on {}: median of {iters} calls after {warmup} warm-up calls", def.name, args.join(", "), device.describe());
    let kfuse_ms = median(device.time_ms(warmup, iters, || launch(def, &mut arguments(def, &mut tensors)).map(drop))?);
    println!("{}", row("kfuse", kfuse_ms, &roof));
    if def.name != "gemm" {
        println!("  (no vendor baseline for `{}`: kfuse compares with cuBLAS for gemm only)", def.name);
        return Ok(());
    }
    let blas = match Blas::new(&device) {
        Ok(blas) => blas,
        Err(e) => {
            println!("  cuBLAS: not run: {e}");
            return Ok(());
        }
    };
    let [Some(a), Some(bm), Some(c)] = &mut tensors[..] else {
        return Err(Error::InvalidArgument("gemm takes three tensors".into()));
    };
    let mut best: Option<(&str, f64)> = None;
    for (name, lib) in [("cuBLAS", Library::Cublas), ("cuBLASLt", Library::CublasLt)] {
        match device.time_ms(warmup, iters, || blas.gemm_into(a, bm, c, lib, Math::Fp32)) {
            Ok(t) => {
                let ms = median(t);
                println!("{}", row(name, ms, &roof));
                if best.is_none_or(|(_, b)| ms < b) {
                    best = Some((name, ms));
                }
            }
            Err(e) => println!("  {name}: not run: {e}"),
        }
    }
    if let Some((name, ms)) = best {
        println!("  kfuse / {name}: {:.2}x the speed", ms / kfuse_ms);
    }
    Ok(())
}

/// `def`'s arguments: the tensors in `tensors` (outputs by `&mut`), scalars 1.0 (f32)
/// or 0 (i64).
fn arguments<'a>(def: &KernelDef, tensors: &'a mut [Option<Tensor>]) -> Vec<Arg<'a>> {
    def.params
        .iter()
        .zip(tensors.iter_mut())
        .map(|(p, t)| match (p, t) {
            (ParamSig::Tensor { output: true, .. }, Some(t)) => Arg::Out(t),
            (ParamSig::Tensor { .. }, Some(t)) => Arg::In(t),
            (ParamSig::Scalar { dtype: DType::I64, .. }, _) => Arg::Scalar(Scalar::I64(0)),
            _ => Arg::Scalar(Scalar::F32(1.0)),
        })
        .collect()
}

/// A tensor of `t`'s dtype and shape on `device`, uniform in [-1, 1) (zeros for an
/// integer dtype), from a xorshift generator seeded with `seed`.
fn random(t: &TensorDesc, seed: u64, device: &Device) -> Result<Tensor> {
    let n: usize = t.shape.iter().product();
    if !t.dtype.is_float() {
        return Tensor::zeros(&t.shape, t.dtype, device);
    }
    let mut s = (seed + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let vals: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Tensor::from_f32(&vals, &t.shape, t.dtype, device)
}

fn median(mut t: Vec<f32>) -> f64 {
    t.sort_by(f32::total_cmp);
    t[t.len() / 2] as f64
}

/// One line of the table: time, TFLOP/s and GB/s of the roofline's counts, and the
/// fraction of the roof.
fn row(name: &str, ms: f64, roof: &Roofline) -> String {
    let s = ms / 1e3;
    let tflops = roof.flops.map_or("-".to_string(), |f| format!("{:.1}", f as f64 / s / 1e12));
    let gbs = roof.bytes as f64 / s / 1e9;
    let of_roof = match (roof.fraction_of_peak(ms), roof.time_at_peak_s(), roof.peak) {
        (Some(f), Some(t), Some(p)) => format!("  {:.0}% of the roof ({:.3} ms at the peak of the {})", 100.0 * f, t * 1e3, p.device),
        _ => String::new(),
    };
    format!("  {name:<9} {ms:>9.4} ms  {tflops:>8} TFLOP/s  {gbs:>8.1} GB/s{of_roof}")
}

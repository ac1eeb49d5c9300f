//! Pieces the benchmarks share: the GPU they run on, random inputs, the median, and the
//! device-to-device copy that gives the bandwidth ceiling measured in the same run;
//! `gemm`: what the two GEMM benchmarks share; `epilogue`: the fused-epilogue user kernels (the
//! tests' `tests/common/epilogue_kernels.rs`, included by path).
#![allow(dead_code)]

use kfuse::{DType, Device, Tensor};

#[path = "../../tests/common/epilogue_kernels.rs"]
pub mod epilogue;
pub mod gemm;
pub mod report;

/// A GEMM shape from the command line's first three numbers (`M N K`), else 4096³.
pub fn mnk_args() -> (usize, usize, usize) {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    match args[..] {
        [m, n, k] => (m, n, k),
        _ => (4096, 4096, 4096),
    }
}

/// The GPU to measure on, or `None` after saying there is nothing to measure (every
/// benchmark needs a CUDA device; without one it exits cleanly).
pub fn gpu() -> Option<Device> {
    let dev = Device::best();
    if dev.is_gpu() {
        Some(dev)
    } else {
        println!("no GPU: nothing to measure (this benchmark needs a CUDA device)");
        None
    }
}

/// `n` random bf16 values, uniform in [-2, 2) (random data, never a zero fill)
/// on `dev`, and the same values on the host.
pub fn random_bf16(n: usize, seed: u64, dev: &Device) -> (Tensor, Vec<f32>) {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut bytes = Vec::with_capacity(n * 2);
    let mut vals = Vec::with_capacity(n);
    for _ in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let v = half::bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0);
        bytes.extend_from_slice(&v.to_le_bytes());
        vals.push(v.to_f32());
    }
    (Tensor::from_bytes(&bytes, &[n], DType::BF16, dev).expect("upload"), vals)
}

/// The median of per-launch times.
pub fn median(mut v: Vec<f32>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2] as f64
}

/// A call that takes input set `s` to one that rotates through `sets` sets, one per call
/// (so that no call finds its inputs in L2 from the call before).
pub fn rotating(sets: usize, mut f: impl FnMut(usize) -> kfuse::Result<()>) -> impl FnMut() -> kfuse::Result<()> {
    let mut i = 0;
    move || {
        i += 1;
        f(i % sets)
    }
}

/// Timed calls a competitor makes in each round of [`interleaved`].
pub const CALLS_PER_ROUND: usize = 10;

/// Times competitors side by side: `warm` untimed calls of each, then `iters /`
/// [`CALLS_PER_ROUND`] rounds in which each competitor in turn makes that many timed calls (CUDA events around
/// each, a few untimed calls first so that each round starts from its own warm state),
/// round `r` starting with competitor `r % n`.
/// The GPU's clock and temperature drift over a run (under its power limit a long run
/// slows by several percent, and calls right after an idle moment run at a raised
/// clock); interleaving puts that drift on every competitor alike, where timing them one
/// after another puts it on the last, and the rotation keeps one competitor from always
/// going first. Returns each competitor's median per-call time in ms, or its first error
/// (a failed competitor is not called again).
pub fn interleaved(dev: &Device, warm: usize, iters: usize, fns: &mut [&mut dyn FnMut() -> kfuse::Result<()>]) -> Vec<kfuse::Result<f64>> {
    let per = CALLS_PER_ROUND;
    let rounds = iters.div_ceil(per).max(1);
    let n = fns.len();
    let mut samples: Vec<kfuse::Result<Vec<f32>>> = fns.iter().map(|_| Ok(Vec::new())).collect();
    // the warm-up calls of every competitor before any timed call
    for (f, s) in fns.iter_mut().zip(samples.iter_mut()) {
        if let Err(e) = dev.time_ms(warm, 0, &mut **f) {
            *s = Err(e);
        }
    }
    for round in 0..rounds {
        for i in (0..n).map(|j| (j + round) % n) {
            let Ok(acc) = &mut samples[i] else { continue };
            match dev.time_ms(2, per, &mut *fns[i]) {
                Ok(t) => acc.extend(t),
                Err(e) => samples[i] = Err(e),
            }
        }
    }
    samples.into_iter().map(|s| s.map(median)).collect()
}

/// `cuMemcpyDtoDAsync` of `src` into `dst` on the device's stream: the copy-bandwidth
/// reference.
pub fn dtod(dev: &Device, src: &Tensor, dst: &mut Tensor) -> kfuse::Result<()> {
    let stream = dev.cuda_stream().expect("gpu");
    let bytes = src.numel() * src.dtype().size_bytes();
    unsafe { cudarc::driver::result::memcpy_dtod_async(dst.address(), src.address(), bytes, stream.cu_stream()) }
        .map_err(|e| kfuse::Error::Driver(format!("{e:?}")))
}

/// A packed tensor of `shape` and `dtype` with random values uniform in [-1, 1) (never a
/// zero fill) on `dev`, and the same values (as rounded to the dtype) on the host.
pub fn random(shape: &[usize], dtype: DType, seed: u64, dev: &Device) -> (Tensor, Vec<f32>) {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut bytes = vec![0u8; n * dtype.size_bytes()];
    let mut vals = Vec::with_capacity(n);
    for i in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let v = ((s >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0;
        dtype.write(&mut bytes, i, v);
        vals.push(dtype.read(&bytes, i) as f32);
    }
    (Tensor::from_bytes(&bytes, shape, dtype, dev).expect("upload"), vals)
}

/// Evicts the L2 cache (50 MB on an H100) before a timed launch by *reading* 256 MiB
/// (kfuse's own last-axis sum over a [32768, 4096] bf16 tensor): afterwards the L2 holds
/// clean lines of an unrelated buffer, so the timed kernel reads its inputs from DRAM
/// and pays for nothing but its own traffic. (A memset flush, as in
/// `triton.testing.do_bench`, leaves up to 50 MB of dirty lines that the next kernel
/// writes back: ~9 µs on the H100, a fifth of a 45 µs row kernel.) The flush also keeps
/// the stream busy while the host issues the timed launch.
pub struct L2Flush {
    buf: Tensor,
    out: Tensor,
}

impl L2Flush {
    pub fn new(dev: &Device) -> kfuse::Result<Self> {
        let (buf, _) = random_bf16(32768 * 4096, 99, dev);
        Ok(L2Flush { buf: buf.reshape(&[32768, 4096])?, out: Tensor::empty(&[32768], DType::BF16, dev)? })
    }

    /// Issues the read on the device's stream (asynchronous).
    pub fn flush(&mut self) -> kfuse::Result<()> {
        kfuse::ops::kernels::row_sum(&self.buf, &mut self.out)?;
        Ok(())
    }
}

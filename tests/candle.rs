//! `kfuse::candle` (feature `candle`): candle tensors to kfuse and back, and kfuse calls
//! as candle custom ops, against float64 references on random data (fixed seeds).
//!
//! On candle's CPU everything runs here (the kernels in the interpreter). The CUDA tests
//! (feature `candle-cuda`, GPU build `--cfg kfuse_gpu`; ignored, counted as skipped,
//! elsewhere) check that nothing is copied: the kfuse view's address is candle's, the
//! kfuse device's pool allocates nothing for the inputs, and a kfuse result's memory is
//! the candle tensor's.

mod common;

use candle_core as cc;
use common::{poisoned, random};
use kfuse::candle::{from_candle, to_candle, KernelOp};
use kfuse::prelude::*;

/// `out = x * s + y`, computed in f32.
#[kfuse]
pub fn scaled_sum<T: Float>(x: Tensor<T, (N,)>, y: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, s: f32) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32() * s + y.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store(v.cast::<T>());
}

/// A candle tensor of random f32 values (seeded), shape `dims`, and its values.
fn candle_random(dims: &[usize], seed: u64, dev: &cc::Device) -> (cc::Tensor, Vec<f64>) {
    let v: Vec<f64> = random(dims.iter().product(), seed, 3.0, 0.0).into_iter().map(|x| x as f32 as f64).collect();
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    (cc::Tensor::from_vec(f, dims, dev).unwrap(), v)
}

/// The elements of a candle tensor in row-major order, as f64 (through f32, which holds
/// every value of the tests' dtypes exactly; candle 0.11's own fp8 → f64 cast overflows
/// the stack).
fn values(t: &cc::Tensor) -> Vec<f64> {
    let v = t.to_dtype(cc::DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v.into_iter().map(f64::from).collect()
}

/// `x`'s values (row-major, `[m, n]`) transposed to `[n, m]`.
fn transposed(v: &[f64], m: usize, n: usize) -> Vec<f64> {
    (0..n * m).map(|k| v[(k % m) * n + k / m]).collect()
}

/// The custom op's body: `scaled_sum(x, y, 0.75)` into a fresh (poisoned) tensor.
fn body(xs: &[Tensor]) -> kfuse::Result<Tensor> {
    let (x, y) = (xs[0].contiguous()?, xs[1].contiguous()?);
    let n = x.numel();
    let out = poisoned(x.shape(), x.dtype(), &x.device());
    {
        let mut flat = out.reshape(&[n])?;
        scaled_sum(&x.reshape(&[n])?, &y.reshape(&[n])?, &mut flat, 0.75)?;
    }
    Ok(out)
}

#[test]
fn cpu_tensors_cross_with_their_layouts_and_come_back_equal() {
    let dev = cc::Device::Cpu;
    let (c, v) = candle_random(&[7, 13], 11, &dev);
    // a transposed view, then a narrowed one: kfuse gets candle's elements in order
    let ct = c.t().unwrap();
    let k = from_candle(&ct).unwrap();
    assert_eq!(k.shape(), &[13, 7]);
    assert_eq!(k.to_vec_f64().unwrap(), transposed(&v, 7, 13));
    let cn = c.narrow(1, 3, 5).unwrap();
    let kn = from_candle(&cn).unwrap();
    let want: Vec<f64> = (0..7).flat_map(|i| v[i * 13 + 3..i * 13 + 8].to_vec()).collect();
    assert_eq!(kn.to_vec_f64().unwrap(), want);
    // a broadcast (stride 0) and an empty tensor
    let cb = c.narrow(0, 2, 1).unwrap().broadcast_as((3, 7, 13)).unwrap();
    let kb = from_candle(&cb).unwrap();
    assert_eq!((kb.shape(), kb.to_vec_f64().unwrap()), (&[3, 7, 13][..], v[26..39].repeat(21)));
    let ke = from_candle(&c.narrow(1, 0, 0).unwrap()).unwrap();
    assert_eq!((ke.shape(), ke.numel()), (&[7, 0][..], 0));
    assert_eq!(to_candle(ke, &dev).unwrap().dims(), &[7, 0]);
    // back: the same values, shape and dtype
    let back = to_candle(k, &dev).unwrap();
    assert_eq!((back.dims(), back.dtype()), (&[13, 7][..], cc::DType::F32));
    assert_eq!(values(&back), values(&ct));
}

#[test]
fn every_shared_dtype_round_trips_exactly_and_others_are_refused_by_name() {
    let dev = cc::Device::Cpu;
    let (c, _) = candle_random(&[3, 5, 2], 5, &dev);
    for dt in [cc::DType::F32, cc::DType::F16, cc::DType::BF16, cc::DType::F8E4M3, cc::DType::I64] {
        let c = c.to_dtype(dt).unwrap();
        let k = from_candle(&c).unwrap();
        assert_eq!(kfuse::candle::candle_dtype(k.dtype()).unwrap(), dt);
        assert_eq!(k.to_vec_f64().unwrap(), values(&c), "{dt:?}: kfuse reads candle's bits as candle does");
        let back = to_candle(k, &dev).unwrap();
        assert_eq!((back.dtype(), values(&back)), (dt, values(&c)), "{dt:?}");
    }
    let u = c.to_dtype(cc::DType::U32).unwrap();
    let e = from_candle(&u).unwrap_err().to_string();
    assert!(e.contains("U32") && e.contains("no kfuse dtype"), "{e}");
    let b = Tensor::from_f32(&[1.0, 0.0], &[2], DType::Bool, &Device::cpu()).unwrap();
    let e = to_candle(b, &dev).unwrap_err().to_string();
    assert!(e.contains("bool"), "{e}");
}

#[test]
fn a_kfuse_kernel_runs_as_a_candle_custom_op_of_each_arity() {
    let dev = cc::Device::Cpu;
    let (x, xv) = candle_random(&[9, 33], 21, &dev);
    let (y, yv) = candle_random(&[33, 9], 22, &dev);
    let y = y.t().unwrap(); // strided: the op reads candle's layout
    let yt = transposed(&yv, 33, 9);
    let want: Vec<f64> = xv.iter().zip(&yt).map(|(a, b)| a * 0.75 + b).collect();

    let two = KernelOp::new("scaled_sum", body);
    let got = x.apply_op2_no_bwd(&y, &two).unwrap();
    assert_eq!(got.dims(), &[9, 33]);
    let err = common::rel_err(&values(&got), &want);
    assert!(err < 1e-6, "CustomOp2: relative error {err:.3e}");

    // one input (x, x) and three (the third ignored): the same closure shape
    let one = KernelOp::new("scaled_sum_self", |xs: &[Tensor]| body(&[xs[0].clone(), xs[0].clone()]));
    let got = x.apply_op1_no_bwd(&one).unwrap();
    let want1: Vec<f64> = xv.iter().map(|a| a * 1.75).collect();
    assert!(common::rel_err(&values(&got), &want1) < 1e-6);
    let three = KernelOp::new("scaled_sum_of_two", |xs: &[Tensor]| body(&xs[..2]));
    let got = x.apply_op3_no_bwd(&y, &x, &three).unwrap();
    assert!(common::rel_err(&values(&got), &want) < 1e-6);

    // an error inside the closure reaches candle with kfuse's text
    let bad = KernelOp::new("bad", |xs: &[Tensor]| {
        let mut out = Tensor::empty(&[5], xs[0].dtype(), &xs[0].device())?;
        scaled_sum(&xs[0], &xs[1], &mut out, 1.0).map(|_| out)
    });
    let e = x.apply_op2_no_bwd(&y, &bad).unwrap_err().to_string();
    assert!(e.contains("kfuse:") && e.contains("scaled_sum"), "{e}");
}

/// The address of a candle CUDA f32 tensor's memory.
#[cfg(feature = "candle-cuda")]
fn address(t: &cc::Tensor) -> u64 {
    use cudarc::driver::DevicePtr;
    let (s, _) = t.storage_and_layout();
    let cc::Storage::Cuda(s) = &*s else { panic!("not a CUDA tensor") };
    let sl = s.as_cuda_slice::<f32>().unwrap();
    let (ptr, _record) = sl.device_ptr(sl.stream());
    ptr
}

/// Candle's CUDA device 0, in the GPU build with `candle-cuda`.
#[cfg(feature = "candle-cuda")]
fn candle_gpu() -> cc::Device {
    cc::Device::new_cuda(0).expect("this test needs a GPU and candle's CUDA device 0")
}

#[cfg(feature = "candle-cuda")]
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn cuda_tensors_cross_without_a_copy() {
    let dev = candle_gpu();
    let cc::Device::Cuda(cd) = &dev else { unreachable!() };
    let kdev = kfuse::candle::device(&dev).unwrap();
    assert_eq!(kdev.cuda_stream().unwrap().cu_stream(), cd.cuda_stream().cu_stream(), "kfuse works on candle's stream");
    let before = kdev.memory_stats();

    let (c, v) = candle_random(&[37, 41], 31, &dev);
    let base = address(&c);
    // a view where candle's memory lies, with candle's strides and offset
    let k = from_candle(&c).unwrap();
    assert_eq!(k.device_ptr(), Some(base));
    assert_eq!(k.to_vec_f64().unwrap(), v);
    let kn = from_candle(&c.narrow(1, 4, 9).unwrap()).unwrap();
    assert_eq!((kn.device_ptr(), kn.strides()), (Some(base + 16), &[41, 1][..]));
    assert_eq!(kdev.memory_stats().allocations, before.allocations, "a view allocates nothing");
    // the whole view goes back as the same candle tensor
    let back = to_candle(k, &dev).unwrap();
    assert!(back.is_contiguous() && values(&back) == v);
    assert_eq!(address(&back), base);

    // a kfuse result becomes candle's memory
    let (y, yv) = candle_random(&[37, 41], 32, &dev);
    let out = body(&[from_candle(&c).unwrap(), from_candle(&y).unwrap()]).unwrap();
    let at = out.device_ptr().unwrap();
    let held = kdev.memory_stats().allocated_bytes;
    let r = to_candle(out, &dev).unwrap();
    assert_eq!(address(&r), at, "the result's memory is candle's tensor's");
    assert!(kdev.memory_stats().allocated_bytes < held, "the block left kfuse's pool");
    let want: Vec<f64> = v.iter().zip(&yv).map(|(a, b)| a * 0.75 + b).collect();
    assert!(common::rel_err(&values(&r), &want) < 1e-6);

    // an empty result goes as candle's own empty tensor
    let e = to_candle(Tensor::empty(&[0, 5], DType::F32, &kdev).unwrap(), &dev).unwrap();
    assert_eq!(e.dims(), &[0, 5]);
    // a tensor of kfuse's own default stream is another device
    let other = Tensor::from_f32(&[1.0], &[1], DType::F32, &Device::gpu(0).unwrap()).unwrap();
    assert!(matches!(to_candle(other, &dev), Err(kfuse::Error::DeviceMismatch(_))));
}

#[cfg(feature = "candle-cuda")]
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn a_kfuse_kernel_runs_as_a_candle_custom_op_on_candles_stream() {
    let dev = candle_gpu();
    let kdev = kfuse::candle::device(&dev).unwrap();
    for dt in [cc::DType::F32, cc::DType::BF16] {
        let (x, xv) = candle_random(&[129, 257], 41, &dev);
        let (y, yv) = candle_random(&[257, 129], 42, &dev);
        let (x, y) = (x.to_dtype(dt).unwrap(), y.to_dtype(dt).unwrap().t().unwrap());
        let round = |v: f64| if dt == cc::DType::BF16 { DType::BF16.round(v) } else { v };
        let yt = transposed(&yv, 257, 129);
        let want: Vec<f64> = xv.iter().zip(&yt).map(|(a, b)| round(round(*a) * 0.75 + round(*b))).collect();
        let before = kdev.memory_stats().allocations;
        let got = x.apply_op2_no_bwd(&y, &KernelOp::new("scaled_sum", body)).unwrap();
        let err = common::rel_err(&values(&got), &want);
        let tol = if dt == cc::DType::BF16 { 8e-3 } else { 1e-6 };
        assert!(err < tol, "{dt:?}: relative error {err:.3e}");
        // the packed copy of the transposed input and the output: two blocks, no more
        assert!(kdev.memory_stats().allocations - before <= 2);
    }
    // a closure that keeps a view of candle's memory makes the op fail
    let kept = std::sync::Mutex::new(Vec::new());
    let keep = KernelOp::new("keeps", |xs: &[Tensor]| {
        kept.lock().unwrap().push(xs[0].clone());
        xs[0].deep_clone()
    });
    let (x, _) = candle_random(&[8], 43, &dev);
    let e = x.apply_op1_no_bwd(&keep).unwrap_err().to_string();
    assert!(e.contains("kept a view"), "{e}");
}

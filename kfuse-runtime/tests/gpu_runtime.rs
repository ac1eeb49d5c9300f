//! GPU tests of the runtime: device facts, tensors on the device, a hand-written kernel
//! through `launch_emitted` (independent of codegen), event timing, and the whole path
//! through `launch`. Without a GPU they pass vacuously, unless `KFUSE_REQUIRE_GPU=1` (set
//! by the GPU-host script), in which case a missing GPU fails them.

mod common;

use std::collections::BTreeMap;

use common::*;
use kfuse_codegen::{EmittedKernel, GridAxisEval, KernelParam};
use kfuse_ir::{ParamId, ShapeSym};
use kfuse_runtime::{launch, launch_emitted, spec_for, Arg, Backend, CacheOutcome, DType, Device, Error, Tensor};

fn gpu() -> Option<Device> {
    match Device::gpu(0) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("KFUSE_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("KFUSE_REQUIRE_GPU=1 but: {e}");
            }
            eprintln!("no GPU, skipping: {e}");
            None
        }
    }
}

#[test]
fn device_facts() {
    let Some(d) = gpu() else { return };
    assert!(d.is_gpu());
    assert_eq!(d, Device::gpu(0).unwrap());
    assert_ne!(d, Device::cpu());
    if std::env::var_os("KFUSE_DEVICE").is_none() {
        assert_eq!(Device::best(), d);
    }
    let t = d.target().unwrap();
    eprintln!("{} -> {t:?}", d.describe());
    assert!(t.sm >= 70 && t.num_sms > 0 && t.smem_per_block >= 48 * 1024, "{t:?}");
    assert!(!d.name().is_empty());
    d.synchronize().unwrap();
}

#[test]
fn tensors_round_trip_through_the_gpu() {
    let Some(d) = gpu() else { return };
    let v = values(1000, 9);
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let h = Tensor::from_f32(&v, &[10, 100], dt, &Device::cpu()).unwrap();
        let g = Tensor::from_f32(&v, &[10, 100], dt, &d).unwrap();
        assert_eq!(g.device(), d);
        assert!(g.device_ptr().unwrap().is_multiple_of(256));
        assert_eq!(g.to_vec_f64().unwrap(), h.to_vec_f64().unwrap(), "{dt}");
        // Views on the device read like views on the host.
        assert_eq!(g.t().to_vec_f64().unwrap(), h.t().to_vec_f64().unwrap());
        let (gn, hn) = (g.narrow(1, 13, 50).unwrap(), h.narrow(1, 13, 50).unwrap());
        assert_eq!(gn.to_vec_f64().unwrap(), hn.to_vec_f64().unwrap());
        assert_eq!(gn.device_ptr().unwrap(), g.device_ptr().unwrap() + 13 * dt.size_bytes() as u64);
        // Copies.
        let back = g.to_device(&Device::cpu()).unwrap();
        assert_eq!(back.to_vec_f64().unwrap(), h.to_vec_f64().unwrap());
        let up = h.t().to_device(&d).unwrap();
        assert!(up.is_contiguous());
        assert_eq!(up.to_vec_f64().unwrap(), h.t().to_vec_f64().unwrap());
        assert_eq!(g.t().contiguous().unwrap().to_vec_f64().unwrap(), h.t().to_vec_f64().unwrap());
    }
}

#[test]
fn fill_on_the_gpu() {
    let Some(d) = gpu() else { return };
    for dt in [DType::F32, DType::F16, DType::BF16, DType::I64, DType::Bool] {
        let mut t = Tensor::zeros(&[7, 9], dt, &d).unwrap();
        assert!(t.to_vec_f64().unwrap().iter().all(|&x| x == 0.0), "{dt}");
        let mut col = t.narrow(1, 2, 3).unwrap();
        col.fill(1.0).unwrap();
        let v = t.to_vec_f64().unwrap();
        for r in 0..7 {
            for c in 0..9 {
                assert_eq!(v[r * 9 + c], if (2..5).contains(&c) { 1.0 } else { 0.0 }, "{dt} {r},{c}");
            }
        }
        t.fill(if dt.is_float() { f64::NAN } else { 3.0 }).unwrap();
        let v = t.to_vec_f64().unwrap();
        assert!(v.iter().all(|x| if dt.is_float() { x.is_nan() } else { *x == dt.round(3.0) }), "{dt}");
    }
}

#[test]
fn zero_size_tensors_on_the_gpu() {
    let Some(d) = gpu() else { return };
    let mut t = Tensor::empty(&[0, 4], DType::F32, &d).unwrap();
    assert_eq!(t.numel(), 0);
    t.fill(1.0).unwrap();
    assert!(t.to_vec_f32().unwrap().is_empty());
    let u = Tensor::from_f32(&[], &[0], DType::BF16, &d).unwrap();
    assert!(u.to_device(&Device::cpu()).unwrap().to_vec_f32().unwrap().is_empty());
    let a = Tensor::from_f32(&[], &[0], DType::F32, &d).unwrap();
    let b = Tensor::from_f32(&[], &[0], DType::F32, &d).unwrap();
    let mut o = Tensor::empty(&[0], DType::F32, &d).unwrap();
    let r = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut o)]).unwrap();
    assert!(r.skipped_empty);
    assert!(matches!(r.backend, Backend::Gpu { .. }));
}

/// A hand-written CUDA `add` with the parameter list `launch_emitted` is told about.
fn hand_add() -> EmittedKernel {
    let source = r#"
extern "C" __global__ void __launch_bounds__(128) kf_add(const float* __restrict__ a, long long sa,
        const float* __restrict__ b, long long sb, float* __restrict__ out, long long so, long long n) {
    long long i = (long long)blockIdx.x * 128 + threadIdx.x;
    if (i < n) out[i * so] = a[i * sa] + b[i * sb];
}
"#;
    let p = |i| ParamId(i);
    EmittedKernel {
        entry: "kf_add".into(),
        source: source.into(),
        arch: Device::gpu(0).unwrap().target().unwrap().arch(),
        options: vec![],
        block_threads: 128,
        smem_bytes: 0,
        params: vec![
            KernelParam::Ptr(p(0)),
            KernelParam::Stride { tensor: p(0), dim: 0 },
            KernelParam::Ptr(p(1)),
            KernelParam::Stride { tensor: p(1), dim: 0 },
            KernelParam::Ptr(p(2)),
            KernelParam::Stride { tensor: p(2), dim: 0 },
            KernelParam::Shape(ShapeSym(0)),
        ],
        grid: vec![GridAxisEval { dim: ShapeSym(0), step: 128 }],
        cluster_x: 1,
        persistent: None,
        ir: String::new(),
        tiles: BTreeMap::new(),
    }
}

#[test]
fn hand_written_kernel_launches_and_is_cached() {
    let Some(d) = gpu() else { return };
    let k = (ADD.build)(&[DType::F32]).unwrap();
    let e = hand_add();
    for n in [1usize, 127, 128, 1000, 100_003] {
        let (av, bv) = (values(n + 3, 1), values(n, 2));
        let big_a = Tensor::from_f32(&av, &[n + 3], DType::F32, &d).unwrap();
        let a = big_a.narrow(0, 3, n).unwrap(); // offset 3: 4-byte aligned only
        let b = Tensor::from_f32(&bv, &[n], DType::F32, &d).unwrap();
        let mut out = Tensor::full(&[n], f64::NAN, DType::F32, &d).unwrap();
        let spec = spec_for(&k, &[Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
        assert_eq!(spec.tensors[0].as_ref().unwrap().ptr_align, 4);
        assert_eq!(spec.tensors[1].as_ref().unwrap().ptr_align, 16);
        let r = launch_emitted(&e, &k, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
        assert!(matches!(r.backend, Backend::Gpu { .. }));
        assert!(!r.skipped_empty);
        if n != 1 {
            assert_eq!(r.cache, Some(CacheOutcome::Memory), "loaded once per device");
        }
        d.synchronize().unwrap();
        let got = out.to_vec_f32().unwrap();
        for i in 0..n {
            assert_eq!(got[i], av[i + 3] + bv[i], "n={n} i={i}");
        }
    }
}

#[test]
fn time_ms_times_gpu_work() {
    let Some(d) = gpu() else { return };
    let k = (ADD.build)(&[DType::F32]).unwrap();
    let e = hand_add();
    let n = 1 << 24;
    let a = Tensor::full(&[n], 1.0, DType::F32, &d).unwrap();
    let b = Tensor::full(&[n], 2.0, DType::F32, &d).unwrap();
    let mut out = Tensor::empty(&[n], DType::F32, &d).unwrap();
    let times = d
        .time_ms(3, 10, || {
            launch_emitted(&e, &k, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)])?;
            Ok(())
        })
        .unwrap();
    assert_eq!(times.len(), 10);
    let mut s = times.clone();
    s.sort_by(f32::total_cmp);
    let med = s[5];
    let gbs = (3 * 4 * n) as f64 / (med as f64 * 1e-3) / 1e9;
    eprintln!("add 2^24 f32: median {med:.4} ms, {gbs:.0} GB/s");
    assert!(med > 0.0 && gbs > 50.0, "{times:?}");
    assert!(out.to_vec_f32().unwrap().iter().all(|&x| x == 3.0));
}

#[test]
fn device_mismatch_and_aliasing_on_the_gpu() {
    let Some(d) = gpu() else { return };
    let a = Tensor::zeros(&[8], DType::F32, &d).unwrap();
    let b = Tensor::zeros(&[8], DType::F32, &Device::cpu()).unwrap();
    let mut out = Tensor::zeros(&[8], DType::F32, &d).unwrap();
    let e = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch(_)), "{e}");
    assert!(e.to_string().contains("`b` is on cpu but `a` is on cuda:0"), "{e}");
    let mut alias = a.clone();
    let e = launch(&ADD, &mut [Arg::In(&a), Arg::In(&a), Arg::Out(&mut alias)]).unwrap_err();
    assert!(matches!(e, Error::Aliasing(_)), "{e}");
}

/// The whole path: IR → codegen → NVRTC → launch. Fails until `kfuse_codegen::compile`
/// exists.
#[test]
fn launch_def_on_the_gpu_matches_the_interpreter() {
    let Some(d) = gpu() else { return };
    for dt in [DType::F32, DType::BF16] {
        for n in [1usize, 1000, 65_537] {
            let (av, bv) = (values(n, 11), values(n, 12));
            let (ha, hb) = (Tensor::from_f32(&av, &[n], dt, &Device::cpu()).unwrap(), Tensor::from_f32(&bv, &[n], dt, &Device::cpu()).unwrap());
            let mut hout = Tensor::empty(&[n], dt, &Device::cpu()).unwrap();
            launch(&ADD, &mut [Arg::In(&ha), Arg::In(&hb), Arg::Out(&mut hout)]).unwrap();
            let (ga, gb) = (ha.to_device(&d).unwrap(), hb.to_device(&d).unwrap());
            let mut gout = Tensor::full(&[n], f64::NAN, dt, &d).unwrap();
            let r = launch(&ADD, &mut [Arg::In(&ga), Arg::In(&gb), Arg::Out(&mut gout)]).unwrap();
            assert!(matches!(r.backend, Backend::Gpu { .. }));
            assert_eq!(gout.to_vec_f64().unwrap(), hout.to_vec_f64().unwrap(), "{dt} n={n}");
            gout.fill(f64::NAN).unwrap();
            let r = launch(&ADD, &mut [Arg::In(&ga), Arg::In(&gb), Arg::Out(&mut gout)]).unwrap();
            assert_eq!(r.cache, Some(CacheOutcome::Memory), "the second launch finds the loaded kernel");
            assert_eq!(gout.to_vec_f64().unwrap(), hout.to_vec_f64().unwrap(), "{dt} n={n} (cached)");
        }
    }
}

/// Host-side cost of a cached launch (checks, IR and kernel lookup, parameter packing).
#[test]
fn launch_overhead() {
    let Some(d) = gpu() else { return };
    let a = Tensor::full(&[4096], 1.0, DType::BF16, &d).unwrap();
    let b = Tensor::full(&[4096], 2.0, DType::BF16, &d).unwrap();
    let mut out = Tensor::empty(&[4096], DType::BF16, &d).unwrap();
    launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
    d.synchronize().unwrap();
    let n = 2000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
    }
    let host_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    d.synchronize().unwrap();
    eprintln!("launch overhead (host, cached kernel): {host_us:.2} us per launch");
    assert!(out.to_vec_f32().unwrap().iter().all(|&x| x == 3.0));
    assert!(host_us < 1000.0);
}

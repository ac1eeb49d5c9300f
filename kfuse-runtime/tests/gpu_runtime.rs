//! GPU tests of the runtime: device facts, tensors on the device, a hand-written kernel
//! through `launch_emitted` (independent of codegen), event timing, and the whole path
//! through `launch`. GPU-only (but for the sm_90a compile check): ignored (counted as
//! skipped) unless built with `--cfg kfuse_gpu` (`scripts/gpu-build.sh`), then failed
//! where no GPU is found.

mod common;

use std::collections::BTreeMap;

use common::*;
use kfuse_codegen::{EmittedKernel, GridAxisEval, KernelParam};
use kfuse_ir::{ParamId, ShapeSym};
use kfuse_runtime::{launch, launch_emitted, spec_for, Arg, Backend, CacheOutcome, DType, Device, Error, Tensor};

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn device_facts() {
    let d = gpu();
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn tensors_round_trip_through_the_gpu() {
    let d = gpu();
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn fill_on_the_gpu() {
    let d = gpu();
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn zero_size_tensors_on_the_gpu() {
    let d = gpu();
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
        grouped: false,
        register_attempt: (0, 1),
        plan: Default::default(),
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn hand_written_kernel_launches_and_is_cached() {
    let d = gpu();
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn time_ms_times_gpu_work() {
    let d = gpu();
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn device_mismatch_and_aliasing_on_the_gpu() {
    let d = gpu();
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn launch_def_on_the_gpu_matches_the_interpreter() {
    let d = gpu();
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
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn launch_overhead() {
    let d = gpu();
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

/// The IR side of the hand-written TMA kernel below (it only describes the arguments):
/// `tma_box(x: Tensor<bf16, (R, C)>, out: &mut Tensor<bf16, (BR, BC)>, row0: i64, col0: i64)`.
fn tma_box_ir() -> kfuse_ir::Kernel {
    let mut b = kfuse_ir::Builder::new("tma_box");
    let (r, c, br, bc) = (b.shape_sym("R"), b.shape_sym("C"), b.shape_sym("BR"), b.shape_sym("BC"));
    b.tensor_param("x", DType::BF16, &[r, c], false);
    b.tensor_param("out", DType::BF16, &[br, bc], true);
    b.scalar_param("row0", DType::I64);
    b.scalar_param("col0", DType::I64);
    b.finish().unwrap()
}

/// CUDA for one block that loads the `br × bc` box at (`row0`, `col0`) of a bf16 matrix
/// through its TMA tensor map (`cp.async.bulk.tensor`, completion on an mbarrier) into
/// shared memory, then writes it out row-major, undoing the 128-byte swizzle when
/// `swizzle` is 128 (the 16-byte chunk index within each 128-byte row is XORed with
/// row % 8; the tile is 1024-byte aligned so that the pattern starts at its first row).
fn tma_box_source(br: u32, bc: u32, swizzle: u32) -> String {
    format!(
        r#"
#define BR {br}
#define BC {bc}
#define SWIZZLE {swizzle}
// The 128 bytes of a CUtensorMap (cuda.h is not needed for an opaque, by-value parameter).
struct __align__(64) KfTensorMap {{ unsigned long long opaque[16]; }};

extern "C" __global__ void __launch_bounds__(128) kf_tma_box(const __grid_constant__ KfTensorMap map,
        unsigned short* __restrict__ out, long long so, long long row0, long long col0) {{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long bar;
    unsigned raw = (unsigned)__cvta_generic_to_shared(smem_raw);
    unsigned pad = (1024u - (raw & 1023u)) & 1023u;
    const unsigned short* tile = (const unsigned short*)(smem_raw + pad);
    unsigned tile_s = raw + pad;
    unsigned bar_s = (unsigned)__cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {{
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_s) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }}
    __syncthreads();
    if (threadIdx.x == 0) {{
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar_s), "r"(BR * BC * 2) : "memory");
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {{%2, %3}}], [%4];"
            :: "r"(tile_s), "l"((unsigned long long)&map), "r"((int)col0), "r"((int)row0), "r"(bar_s) : "memory");
    }}
    unsigned done = 0;
    while (!done) {{
        asm volatile(
            "{{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}}"
            : "=r"(done) : "r"(bar_s), "r"(0u) : "memory");
    }}
    for (int i = threadIdx.x; i < BR * BC; i += 128) {{
        int r = i / BC, c = i % BC;
        int s = i;
        if (SWIZZLE == 128) s = r * BC + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
        out[r * so + c] = tile[s];
    }}
}}
"#
    )
}

fn tma_box_kernel(arch: String, br: u32, bc: u32, swizzle: u32) -> EmittedKernel {
    let p = |i| ParamId(i);
    EmittedKernel {
        entry: "kf_tma_box".into(),
        source: tma_box_source(br, bc, swizzle),
        arch,
        options: vec![],
        block_threads: 128,
        smem_bytes: br * bc * 2 + 1024,
        grouped: false,
        register_attempt: (0, 1),
        plan: Default::default(),
        params: vec![
            KernelParam::TensorMap { tensor: p(0), box_dims: vec![br, bc], swizzle, order: vec![1, 0] },
            KernelParam::Ptr(p(1)),
            KernelParam::Stride { tensor: p(1), dim: 0 },
            KernelParam::Scalar(p(2)),
            KernelParam::Scalar(p(3)),
        ],
        grid: vec![],
        cluster_x: 1,
        persistent: None,
        ir: String::new(),
        tiles: BTreeMap::new(),
    }
}

/// The TMA test kernel compiles with NVRTC for sm_90a and assembles with ptxas, on any
/// machine with NVRTC (no GPU needed); without NVRTC it passes vacuously unless
/// `KFUSE_REQUIRE_NVRTC=1`.
#[test]
fn tma_kernel_compiles_for_sm90a() {
    use kfuse_runtime::nvrtc;
    if !nvrtc::nvrtc_available() {
        assert!(!std::env::var("KFUSE_REQUIRE_NVRTC").is_ok_and(|v| v == "1"), "KFUSE_REQUIRE_NVRTC=1 but libnvrtc is missing");
        eprintln!("libnvrtc not found; skipping");
        return;
    }
    for (br, bc, sw) in [(32, 40, 0), (16, 64, 128)] {
        let ptx = nvrtc::compile_ptx(&tma_box_source(br, bc, sw), "sm_90a", &[]).unwrap();
        assert!(ptx.contains("cp.async.bulk.tensor.2d"), "{ptx}");
        assert!(ptx.contains(".param .align 64 .b8 kf_tma_box_param_0[128]"), "{ptx}");
        let Some(ptxas) = std::env::var_os("KFUSE_PTXAS").filter(|p| std::path::Path::new(p).is_file()) else { continue };
        let dir = std::env::temp_dir().join(format!("kfuse-tma-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(format!("tma_{sw}.ptx"));
        std::fs::write(&f, &ptx).unwrap();
        let o = std::process::Command::new(&ptxas).args(["-arch=sm_90a", "-v", "-o"]).arg(dir.join("tma.cubin")).arg(&f).output().unwrap();
        assert!(o.status.success(), "ptxas failed:\n{}", String::from_utf8_lossy(&o.stderr));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// One box through the TMA path: a tensor map built by the runtime (`cuTensorMapEncodeTiled`
/// from `KernelParam::TensorMap`), passed by value to a hand-written kernel, checked
/// against the host data — boxes inside the tensor, hanging past its edges and starting
/// before them (zeros there), on a narrowed view (offset and row stride of the parent),
/// unswizzled and with the 128-byte swizzle.
///
/// Every box starts at a column whose byte offset is a multiple of 16 (a multiple of 8
/// bf16 elements): a copy whose innermost coordinate is not stops the kernel with an
/// illegal instruction (measured on the H100, 2026-11-26, also with a standalone CUDA
/// program: rows start anywhere, columns 1, 4, -4, 100, 196 and 199 of a bf16 map fail,
/// 0, 8, -8, 64, 120 and 192 pass; see the `kfuse_runtime::tma` docs). The
/// coordinates are the kernel's own, which the runtime does not see: kfuse's kernels
/// start boxes at multiples of their tiles. This test once used columns 199 and 100 and
/// was ignored for it.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn tma_tensor_map_loads_boxes() {
    let d = gpu();
    if d.compute_capability().unwrap().0 < 9 {
        eprintln!("{}: TMA needs sm_90; skipping", d.describe());
        return;
    }
    let k = tma_box_ir();
    let arch = d.target().unwrap().arch();
    // (rows, cols, parent cols, column offset of the view, box, swizzle, box origins)
    type Case = (usize, usize, usize, usize, [u32; 2], u32, &'static [(i64, i64)]);
    let cases: [Case; 2] = [
        (100, 200, 216, 8, [32, 40], 0, &[(0, 0), (10, 16), (80, 176), (-5, -8), (99, 192)]),
        (70, 136, 136, 0, [16, 64], 128, &[(0, 0), (8, 64), (64, 128), (3, 96), (-3, -16)]),
    ];
    for (rows, cols, pcols, coff, bx, sw, origins) in cases {
        let e = tma_box_kernel(arch.clone(), bx[0], bx[1], sw);
        let v = values(rows * pcols, 40 + sw as u64);
        let parent = Tensor::from_f32(&v, &[rows, pcols], DType::BF16, &d).unwrap();
        let x = parent.narrow(1, coff, cols).unwrap();
        let host = x.to_vec_f32().unwrap();
        let (br, bc) = (bx[0] as usize, bx[1] as usize);
        for &(r0, c0) in origins {
            let mut out = Tensor::full(&[br, bc], f64::NAN, DType::BF16, &d).unwrap();
            let args = &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(r0.into()), Arg::Scalar(c0.into())];
            let r = launch_emitted(&e, &k, args).unwrap();
            assert!(!r.skipped_empty);
            d.synchronize().unwrap();
            let got = out.to_vec_f32().unwrap();
            for i in 0..br {
                for j in 0..bc {
                    let (gr, gc) = (r0 + i as i64, c0 + j as i64);
                    let inside = (0..rows as i64).contains(&gr) && (0..cols as i64).contains(&gc);
                    let want = if inside { host[gr as usize * cols + gc as usize] } else { 0.0 };
                    assert_eq!(got[i * bc + j].to_bits(), want.to_bits(), "swizzle {sw}, box at ({r0}, {c0}), element ({i}, {j})");
                }
            }
        }
    }
    // The runtime refuses what TMA cannot address, before launching: a view 2 bytes off
    // 16-byte alignment, a box wider than the swizzle span, and one of more than 256 rows.
    let e = tma_box_kernel(arch.clone(), 16, 64, 0);
    let parent = Tensor::from_f32(&values(64 * 80, 3), &[64, 80], DType::BF16, &d).unwrap();
    let x = parent.narrow(1, 1, 72).unwrap();
    let mut out = Tensor::empty(&[16, 64], DType::BF16, &d).unwrap();
    let err = launch_emitted(&e, &k, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(0i64.into()), Arg::Scalar(0i64.into())]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("not 16-byte aligned"), "{err}");
    let e = tma_box_kernel(arch.clone(), 16, 128, 128);
    let x = parent.narrow(1, 0, 72).unwrap();
    let mut out = Tensor::empty(&[16, 128], DType::BF16, &d).unwrap();
    let err = launch_emitted(&e, &k, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(0i64.into()), Arg::Scalar(0i64.into())]).unwrap_err();
    assert!(err.to_string().contains("swizzle span"), "{err}");
    let e = tma_box_kernel(arch, 300, 64, 0);
    let mut out = Tensor::empty(&[300, 64], DType::BF16, &d).unwrap();
    let err = launch_emitted(&e, &k, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(0i64.into()), Arg::Scalar(0i64.into())]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("box extent 300") && err.to_string().contains("1 to 256"), "{err}");
}

/// A hand-written persistent `add`: each block walks the programs `blockIdx.x,
/// blockIdx.x + gridDim.x, …` of `ceil(n / 128)`, and writes -1 instead of the sum when the
/// grid it was launched with is not `expect` blocks.
fn hand_add_persistent(cap: u32, expect: u32) -> EmittedKernel {
    let source = format!(
        r#"
extern "C" __global__ void __launch_bounds__(128) kf_add_persistent(const float* __restrict__ a, long long sa,
        const float* __restrict__ b, long long sb, float* __restrict__ out, long long so, long long n) {{
    long long programs = (n + 127) / 128;
    for (long long p = blockIdx.x; p < programs; p += gridDim.x) {{
        long long i = p * 128 + threadIdx.x;
        if (i < n) out[i * so] = gridDim.x == {expect}u ? a[i * sa] + b[i * sb] : -1.0f;
    }}
}}
"#
    );
    EmittedKernel { entry: "kf_add_persistent".into(), source, persistent: Some(cap), ..hand_add() }
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn persistent_kernels_launch_on_the_capped_grid() {
    let d = gpu();
    let k = (ADD.build)(&[DType::F32]).unwrap();
    // the blocks of this 128-thread kernel (no shared memory, few registers) a
    // multiprocessor holds: the runtime sizes the persistent grid as the cap times that
    let ctx = d.cuda_context().unwrap();
    let attr = |a| ctx.attribute(a).unwrap() as u32;
    use kfuse_runtime::cudarc::driver::sys::CUdevice_attribute::*;
    let per_sm = (attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) / 128).min(attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR));
    // (n, cap): 8 programs, fewer than the cap's blocks; 8 programs under a cap of 100;
    // 782 programs, more than the cap's blocks
    for (n, cap) in [(1000usize, 3u32), (1000, 100), (100_003, 7)] {
        let shapes = [n as u64];
        let programs = (n as u64).div_ceil(128);
        let blocks = programs.min(cap as u64 * per_sm as u64) as u32;
        let e = hand_add_persistent(cap, blocks);
        assert_eq!(e.grid_dims(&shapes), [programs.min(cap as u64), 1, 1]);
        assert_eq!(e.grid_dims_resident(&shapes, per_sm), [blocks as u64, 1, 1]);
        let (av, bv) = (values(n, 5), values(n, 6));
        let a = Tensor::from_f32(&av, &[n], DType::F32, &d).unwrap();
        let b = Tensor::from_f32(&bv, &[n], DType::F32, &d).unwrap();
        let mut out = Tensor::full(&[n], f64::NAN, DType::F32, &d).unwrap();
        let r = launch_emitted(&e, &k, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
        assert!(!r.skipped_empty);
        let got = out.to_vec_f32().unwrap();
        for i in 0..n {
            assert_eq!(got[i], av[i] + bv[i], "n={n} cap={cap} i={i}");
        }
    }
    // an empty tensor: no programs, no launch
    let e = hand_add_persistent(3, 0);
    let (a, b) = (Tensor::zeros(&[0], DType::F32, &d).unwrap(), Tensor::zeros(&[0], DType::F32, &d).unwrap());
    let mut out = Tensor::empty(&[0], DType::F32, &d).unwrap();
    assert_eq!(e.grid_dims(&[0]), [0, 1, 1]);
    assert!(launch_emitted(&e, &k, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap().skipped_empty);
}

/// cuBLAS and cuBLASLt through `kfuse_runtime::vendor` against a float64 CPU reference:
/// each dtype, fp32 and TF32, packed operands, a narrowed `A` and a transposed `B` view.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn vendor_gemm_matches_a_cpu_reference() {
    use kfuse_runtime::vendor::{Blas, Library, Math};
    let d = gpu();
    let blas = Blas::new(&d).unwrap();
    let (m, n, k) = (67usize, 45usize, 129usize);
    let av = values(m * (k + 8), 21);
    let bv = values(n * k, 22);
    let cases = [(DType::BF16, Math::Fp32, 1e-2), (DType::F16, Math::Fp32, 2e-3), (DType::F32, Math::Fp32, 1e-5), (DType::F32, Math::Tf32, 5e-3)];
    for (dt, math, tol) in cases {
        // A: columns 8.. of an [m, k + 8] tensor (row stride k + 8); B: the transpose of an [n, k] tensor
        let a = Tensor::from_f32(&av, &[m, k + 8], dt, &d).unwrap().narrow(1, 8, k).unwrap();
        let bt = Tensor::from_f32(&bv, &[n, k], dt, &d).unwrap();
        let b_views = [bt.t(), bt.t().contiguous().unwrap()];
        let (ah, bh) = (a.to_vec_f64().unwrap(), b_views[1].to_vec_f64().unwrap());
        let mut want = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|p| ah[i * k + p] * bh[p * n + j]).sum();
            }
        }
        for b in &b_views {
            for lib in [Library::Cublas, Library::CublasLt] {
                let c = blas.gemm(&a, b, lib, math).unwrap();
                assert_eq!(c.shape(), [m, n]);
                assert_eq!(c.dtype(), dt);
                let got = c.to_vec_f64().unwrap();
                let num: f64 = got.iter().zip(&want).map(|(g, w)| (g - w) * (g - w)).sum();
                let den: f64 = want.iter().map(|w| w * w).sum();
                let rel = (num / den).sqrt();
                eprintln!("{dt} {math:?} {lib:?} B strides {:?}: relative error {rel:.2e}", b.strides());
                assert!(rel < tol, "{dt} {math:?} {lib:?}: relative error {rel:.2e}");
            }
        }
    }
    // mismatched shapes are refused before cuBLAS sees them
    let x = Tensor::zeros(&[4, 8], DType::BF16, &d).unwrap();
    assert!(matches!(blas.gemm(&x, &x, Library::Cublas, Math::Fp32), Err(Error::ShapeMismatch(_))));
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn another_librarys_stream_and_memory_cross_without_a_copy() {
    use cudarc::driver::{CudaContext, CudaSlice, DevicePtr};

    let own = gpu();
    // another library's context handle and a stream of its own (non-blocking: nothing
    // orders it with kfuse's default stream but issuing to it)
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let d = Device::from_cuda_stream(stream.clone()).unwrap();
    assert_ne!(d, own, "another stream: another device");
    assert_eq!(d, Device::from_cuda_stream(stream.clone()).unwrap(), "one record per stream");
    assert_eq!(d.cuda_stream().unwrap().cu_stream(), stream.cu_stream());
    assert!(d.to_string().starts_with("cuda:0 (stream 0x"), "{d}");

    // the other library's memory as a kfuse tensor: same address, its values, and
    // kfuse's writes land in it
    let v = values(1000, 17);
    let slice = stream.clone_htod(&v).unwrap();
    let ptr = slice.device_ptr(&stream).0;
    let before = d.memory_stats();
    // SAFETY: the slice is 4000 bytes of this context, kept by the tensor, used on `stream`
    let t = unsafe { Tensor::from_device_memory(ptr, 4000, &[10, 100], &[100, 1], 0, DType::F32, &d, Box::new(slice)) }.unwrap();
    assert_eq!((t.device_ptr(), t.to_vec_f32().unwrap()), (Some(ptr), v.clone()));
    let mut col = t.narrow(1, 7, 3).unwrap();
    assert_eq!(col.device_ptr(), Some(ptr + 28));
    col.fill(f64::NAN).unwrap();
    let owner = t.external_owner().unwrap().downcast_ref::<CudaSlice<f32>>().unwrap();
    let seen = stream.clone_dtoh(owner).unwrap();
    for (i, (&a, &b)) in seen.iter().zip(&v).enumerate() {
        assert!(if (7..10).contains(&(i % 100)) { a.is_nan() } else { a == b }, "element {i}");
    }
    assert_eq!(d.memory_stats().allocations, before.allocations, "a view of another library's memory allocates nothing");
    assert!(t.clone().into_cuda_slice::<f32>().unwrap_err().to_string().contains("another library"));
    // a view past the memory given is refused
    // SAFETY: refused before use
    let e = unsafe { Tensor::from_device_memory(ptr, 4000, &[10, 101], &[101, 1], 0, DType::F32, &d, Box::new(())) };
    assert!(matches!(e, Err(Error::InvalidArgument(m)) if m.contains("reaches past")));
    drop((col, t));

    // a kfuse tensor's memory handed to the other library: same address, out of the pool
    let o = Tensor::from_f32(&v, &[1000], DType::F32, &d).unwrap();
    let at = o.device_ptr().unwrap();
    let held = d.memory_stats().allocated_bytes;
    let view = o.narrow(0, 1, 5).unwrap();
    assert!(o.clone().into_cuda_slice::<f32>().unwrap_err().to_string().contains("share"));
    drop(view);
    let s: CudaSlice<f32> = o.into_cuda_slice().unwrap();
    assert_eq!((s.len(), s.device_ptr(&stream).0), (1000, at));
    assert_eq!(d.memory_stats().allocated_bytes, held - 4096, "the block (4096 bytes) left the pool");
    assert_eq!(stream.clone_dtoh(&s).unwrap(), v);
    // a tensor of kfuse's own device is not this one's
    let other = Tensor::from_f32(&v, &[1000], DType::F32, &own).unwrap();
    assert_ne!(other.device(), d);
}

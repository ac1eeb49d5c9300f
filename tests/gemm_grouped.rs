//! Grouped products (`kfuse::ops::gemm_grouped`, `kfuse::runtime::launch_grouped`):
//! several independent problems of different sizes in one launch. Against a float64
//! reference on random data (never zeros) with odd sizes, on the interpreter here and on
//! the GPU in the GPU build (`--cfg kfuse_gpu`; elsewhere those tests are ignored,
//! counted as skipped; outputs of the direct launches NaN-poisoned first); the
//! grouped kernel's structure and registers from NVRTC + ptxas without a GPU; and the
//! errors of lists that do not make a grouped launch.

mod common;

use common::gemm::{operand, reference_rows_ex, sample_rows, within};

use kfuse::codegen::{compile, Target};
use kfuse::ops::{gemm_grouped, gemm_grouped_ex, GemmOptions};
use kfuse::prelude::*;
use kfuse::runtime::{launch_grouped, Arg, Scalar};
use kfuse::DType;

/// (M, N, K) of the problems of one grouped launch: odd sizes, one of each extreme.
const SMALL: [(usize, usize, usize); 5] = [(1, 1, 1), (17, 33, 65), (64, 48, 0), (5, 130, 7), (40, 9, 300)];

/// Checks `gemm_grouped_ex` on `shapes` (`ta`/`tb`: operands as transposed views).
fn check(shapes: &[(usize, usize, usize)], dt: DType, od: DType, alpha: f32, ta: bool, tb: bool, dev: &Device, seed: u64) -> Result<f64, String> {
    let mut a = Vec::new();
    let mut b = Vec::new();
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        a.push(operand(m, k, dt, seed + 2 * i as u64, ta, dev));
        b.push(operand(k, n, dt, seed + 2 * i as u64 + 1, tb, dev));
    }
    let ar: Vec<&Tensor> = a.iter().map(|x| &x.0).collect();
    let br: Vec<&Tensor> = b.iter().map(|x| &x.0).collect();
    let what = format!("grouped {shapes:?} {dt}->{od} alpha={alpha} ta={ta} tb={tb}");
    let outs = gemm_grouped_ex(&ar, &br, &GemmOptions { alpha, out_dtype: Some(od), ..Default::default() }).map_err(|e| format!("{what}: {e}"))?;
    let mut worst: f64 = 0.0;
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        if outs[i].shape() != [m, n] || outs[i].dtype() != od {
            return Err(format!("{what}: problem #{i} came back {:?} {}", outs[i].shape(), outs[i].dtype()));
        }
        let rows = sample_rows(m);
        let got = outs[i].to_vec_f64().map_err(|e| e.to_string())?;
        let got: Vec<f64> = rows.iter().flat_map(|&r| got[r * n..(r + 1) * n].to_vec()).collect();
        let want = reference_rows_ex(&a[i].1, &b[i].1, None, k, n, &rows, alpha as f64, 0.0);
        if k == 0 {
            if got.iter().any(|&x| x != 0.0) {
                return Err(format!("{what}: problem #{i} has K = 0 but is not all zeros"));
            }
            continue;
        }
        worst = worst.max(within(&format!("{what} #{i} {m}x{n}x{k}"), common::rel_err(&got, &want), tol(dt, od))?);
    }
    Ok(worst)
}

fn tol(dt: DType, od: DType) -> f64 {
    if dt == DType::F32 && od == DType::F32 {
        1e-5
    } else {
        1e-2
    }
}

#[test]
fn grouped_products_on_the_interpreter() {
    let cpu = Device::cpu();
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            check(&SMALL, dt, dt, 1.0, ta, tb, &cpu, 11).unwrap();
        }
        check(&SMALL, dt, DType::F32, -0.75, false, false, &cpu, 23).unwrap();
    }
    // one problem is a grouped launch too
    check(&[(3, 5, 7)], DType::BF16, DType::BF16, 2.0, false, false, &cpu, 31).unwrap();
}

#[test]
fn lists_that_are_not_a_grouped_launch_are_refused() {
    let cpu = Device::cpu();
    let a = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DType::F32, &cpu).unwrap();
    let b = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], DType::F32, &cpu).unwrap();
    let b16 = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], DType::BF16, &cpu).unwrap();
    let err = |r: kfuse::Result<Vec<Tensor>>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(gemm_grouped(&[], &[])).contains("no problems"));
    assert!(err(gemm_grouped(&[&a, &a], &[&b])).contains("one of each per problem"));
    assert!(err(gemm_grouped(&[&a, &a], &[&b, &a])).contains("problem #1"), "{}", err(gemm_grouped(&[&a, &a], &[&b, &a])));
    let e = err(gemm_grouped(&[&a, &b16.t()], &[&b, &b16]));
    assert!(e.contains("one dtype"), "{e}");
    let e = err(gemm_grouped_ex(&[&a], &[&b], &GemmOptions { tf32: true, ..Default::default() }));
    assert!(e.contains("not taken by grouped products"), "{e}");
    // the runtime's own checks: every problem a valid argument list, one instantiation
    let mut o1 = Tensor::empty(&[2, 2], DType::F32, &cpu).unwrap();
    let mut o2 = Tensor::empty(&[2, 2], DType::BF16, &cpu).unwrap();
    let mut groups = vec![
        vec![Arg::In(&a), Arg::In(&b), Arg::Out(&mut o1), Arg::Scalar(Scalar::F32(1.0))],
        vec![Arg::In(&a), Arg::In(&b), Arg::Out(&mut o2), Arg::Scalar(Scalar::F32(1.0))],
    ];
    let e = launch_grouped(&kfuse::ops::kernels::gemm_scaled::DEF, &mut groups).unwrap_err().to_string();
    assert!(e.contains("problem #1") && e.contains("one instantiation"), "{e}");
    let mut none: Vec<Vec<Arg>> = Vec::new();
    assert!(launch_grouped(&kfuse::ops::kernels::gemm_scaled::DEF, &mut none).is_err());
}

/// The grouped kernel: its problems come from the table; on sm_90a the general
/// lowering's warp-specialized kernel walks every problem's programs, each program
/// binding its problem's parameters and tensor maps (global memory) by name, on sm_80
/// mma.sync with each block's problem found once; no spills.
#[test]
fn grouped_kernel_structure() {
    let def = &kfuse::ops::kernels::gemm_scaled::DEF;
    let kernel = (def.build)(&[DType::BF16, DType::BF16]).unwrap();
    for target in [Target::sm90a(), Target::sm80()] {
        let mut spec = common::gemm::spec_mnk(def, 4096, 4096, 4096);
        spec.grouped = true;
        let e = compile(&kernel, &spec, &target).unwrap();
        assert!(e.grouped && e.ir.contains("grouped:"), "{}", e.ir);
        assert!(e.source.contains("const long long* __restrict__ kf_grp, const long long kf_ngrp"), "{}", e.source);
        assert!(!e.source.contains("__grid_constant__"), "{}", e.source);
        if target.sm == 90 {
            assert!(e.source.contains("wgmma") && e.source.contains("cp.async.bulk.tensor"), "{}", e.source);
            assert!(e.plan.to_string().contains("a matrix loop on the tensor cores") && e.plan.to_string().contains("each block walks programs"), "{}", e.plan);
            // per program: its problem, then the maps of that problem; no problem
            // found once a block (the walk crosses problems)
            assert!(e.source.contains("kf_pid >= kf_grp[(kf_g + 1) *") && e.source.contains("const CUtensorMap& kf_rtm0 = *reinterpret_cast<const CUtensorMap*>(kf_rec["), "{}", e.source);
            assert!(!e.source.contains("kf_local"), "{}", e.source);
            assert!(e.persistent.is_some());
            // each role binds and fences only the maps it reads: the producer A's and
            // B's, the consumers the output's (its TMA store)
            assert_eq!(e.source.matches("fence.proxy.tensormap::generic.acquire").count(), 3, "{}", e.source);
            // the records hold per-axis program counts, not the persistent grid
            assert_eq!(e.programs(&[4096, 4096, 4096]), [4096 / 128, 4096 / 256, 1]);
            assert_eq!(e.grid_dims(&[4096, 4096, 4096])[1], 1);
        } else {
            // the general lowering: the problem's pointers, strides and shapes bound by
            // name, so its cp.async rings read them as a single launch's
            assert!(e.source.contains("kf_pid0") && e.source.contains("mma.sync") && e.source.contains("kf_cp_async16("), "{}", e.source);
            assert!(e.plan.to_string().contains("a matrix loop on the tensor cores") && e.plan.to_string().contains("copied by cp.async into a"), "{}", e.plan);
            assert_eq!(e.persistent, None);
        }
        if kfuse::runtime::nvrtc::nvrtc_available() {
            let (regs, spills) = common::assemble(&e.source, &e.arch, &e.options, &format!("grouped_gemm_{}", target.arch())).unwrap();
            assert_eq!(spills, 0, "{} registers, {spills} bytes of spills", regs);
        }
    }
    // 16-bit operands TMA cannot read (an `a` K-major in some problems and M-major in
    // others: no unit-stride dimension in the facts they share): staged from registers
    // onto `wgmma`, in a single launch and a grouped one
    let mut mixed = common::gemm::spec_mnk(def, 4096, 4096, 4096);
    mixed.tensors[0].as_mut().unwrap().stride_div = vec![1, 1];
    let e = compile(&kernel, &mixed, &Target::sm90a()).unwrap();
    assert!(e.source.contains("wgmma") && e.plan.to_string().contains("A from shared memory (K-major, 128-byte swizzle, written where it is defined"), "{}", e.plan);
    mixed.grouped = true;
    let e = compile(&kernel, &mixed, &Target::sm90a()).unwrap();
    assert!(e.source.contains("wgmma") && e.plan.to_string().contains("A from shared memory (K-major, 128-byte swizzle, written where it is defined"), "{}", e.plan);
    // f32 operands: the exact FMA rule reads the table the same way
    let kernel = (def.build)(&[DType::F32, DType::F32]).unwrap();
    let mut spec = common::gemm::spec_mnk(def, 1000, 1000, 1000);
    spec.grouped = true;
    let e = compile(&kernel, &spec, &Target::sm90a()).unwrap();
    assert!(e.source.contains("kf_grp") && e.source.contains("fmaf(") && e.plan.to_string().contains(": f32 FMAs"), "{}", e.source);
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn grouped_products_on_the_gpu() {
    let dev = common::gpu();
    let mut shapes = SMALL.to_vec();
    shapes.extend([(1, 4096, 4096), (300, 200, 1000), (127, 4096, 4096), (4095, 4097, 4095), (2048, 1024, 512)]);
    let mut failures = Vec::new();
    for dt in [DType::F16, DType::BF16, DType::F32] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            if let Err(e) = check(&shapes, dt, dt, 1.0, ta, tb, &dev, 101) {
                failures.push(e);
            }
        }
        if let Err(e) = check(&SMALL, dt, DType::F32, 0.5, false, false, &dev, 202) {
            failures.push(e);
        }
    }
    // an MoE layer's experts: every size a multiple of the tiles (no masks, the TMA
    // store epilogue), launched twice (fresh outputs and tensor maps each time)
    let moe: Vec<(usize, usize, usize)> = [128, 256, 384, 512, 768, 1024, 1536, 2048].iter().map(|&m| (m, 1024, 512)).collect();
    for seed in [500, 600] {
        if let Err(e) = check(&moe, DType::BF16, DType::BF16, 1.0, false, false, &dev, seed) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// A direct grouped launch into NaN-poisoned outputs (small: the sanitizers run it).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn direct_grouped_launch_into_poisoned_outputs() {
    let dev = common::gpu();
    let mut failures = Vec::new();
    let dims = [(33, 65, 17), (256, 128, 512), (1, 1000, 64)];
    let ops: Vec<_> = dims.iter().enumerate().map(|(i, &(m, n, k))| (operand(m, k, DType::BF16, 300 + i as u64, false, &dev), operand(k, n, DType::BF16, 400 + i as u64, false, &dev))).collect();
    let mut outs: Vec<Tensor> = dims.iter().map(|&(m, n, _)| common::poisoned(&[m, n], DType::BF16, &dev)).collect();
    {
        let mut groups: Vec<Vec<Arg>> =
            ops.iter().zip(outs.iter_mut()).map(|((a, b), o)| vec![Arg::In(&a.0), Arg::In(&b.0), Arg::Out(o), Arg::Scalar(Scalar::F32(1.5))]).collect();
        launch_grouped(&kfuse::ops::kernels::gemm_scaled::DEF, &mut groups).unwrap();
    }
    for (i, &(m, n, k)) in dims.iter().enumerate() {
        let got = outs[i].to_vec_f64().unwrap();
        let want = reference_rows_ex(&ops[i].0 .1, &ops[i].1 .1, None, k, n, &(0..m).collect::<Vec<_>>(), 1.5, 0.0);
        if let Err(e) = within(&format!("direct grouped launch #{i} {m}x{n}x{k}"), common::rel_err(&got, &want), 1e-2) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

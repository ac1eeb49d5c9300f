//! User GEMMs whose operands the tensor-memory accelerator cannot read as they lie —
//! rows a multiple of 2 bytes apart but not of 16 (bf16 `b: [4096, 4097]`: 8194-byte
//! rows), unaligned data, odd pitches of transposed views — on a machine without a GPU.
//! A GPU launch copies such read-only operands of the matrix loop to rows padded to
//! 128-byte lines (`kfuse_runtime::operand_copy`) and runs the loop on the tensor cores
//! (WGMMA + TMA on sm_90a, mma.sync + cp.async on sm_80) instead of f32 FMAs, and says so
//! in its plan. Here: the plans and specs `emit`, `explain`, `launch_spec` and
//! `gpu_plan_tiles` report for such arguments, the generated kernels assembled by
//! `ptxas` without spills, what is not copied (outputs, f32 operands of `dot`, aligned
//! shapes), and the interpreter running the GPU's plan to the right answers. The GPU
//! side (the copies made, the numerics at M4095 N4097 K4096, the speed against
//! `kfuse::ops::gemm`) is in `tests/gpu_gemm.rs` and `examples/user_gemm_unaligned.rs`.

mod common;

#[path = "kernels/user_gemms.rs"]
mod kernels_user_gemms;

use common::gemm::gemm_bias_gelu;
use kernels_user_gemms::{gemm_b_mut, gemm_bias_relu};

use kfuse::codegen::{Spec, Target, TensorSpec};
use kfuse::prelude::*;
use kfuse::runtime::{emit, gpu_plan_tiles, launch_interpreter, launch_spec, spec_for, Arg, ArgDesc};
use kfuse::{Backend, DType};

const M: usize = 4095;
const N: usize = 4097;
const K: usize = 4096;

fn t(dt: DType, shape: &[usize]) -> ArgDesc {
    ArgDesc::tensor(dt, shape)
}

/// The arguments of a `(a, b, bias, out)` user GEMM of `m x n x k`, row-major.
fn bias_args(dt: DType, m: usize, n: usize, k: usize) -> [ArgDesc; 4] {
    [t(dt, &[m, k]), t(dt, &[k, n]), t(dt, &[n]), t(dt, &[m, n])]
}

/// How `e`'s loop runs, by the lines of its plan: `WGMMA + TMA` where its dots are on
/// `wgmma` and a producer warpgroup fills its rings by TMA, `mma.sync + cp.async` where
/// they are on `mma.sync` and `cp.async` rings, `FMA (CUDA cores)` where they are exact
/// f32 FMAs.
fn path(e: &kfuse::codegen::EmittedKernel) -> Option<&'static str> {
    let any = |s: &str| e.plan.dots.iter().any(|d| d.contains(s));
    if e.plan.tensor_cores() && any("(TMA, mbarriers;") && any(": wgmma m") {
        Some("WGMMA + TMA")
    } else if e.plan.tensor_cores() && any(": mma.sync m16n8k16") && any("copied by cp.async into a") {
        Some("mma.sync + cp.async")
    } else if !e.plan.tensor_cores() && any(": f32 FMAs") {
        Some("FMA (CUDA cores)")
    } else {
        None
    }
}

#[test]
fn unaligned_b_is_copied_and_the_loop_reaches_the_tensor_cores() {
    let note = "operand `b` copied to a padded pitch of 4160 elements: row pitch 8194 bytes is not a multiple of 16";
    let mut failures = Vec::new();
    for def in [&gemm_bias_relu::DEF, &gemm_bias_gelu::DEF] {
        for (target, want, instr) in [(Target::sm90a(), "WGMMA + TMA", "wgmma.mma_async"), (Target::sm80(), "mma.sync + cp.async", "mma.sync.aligned.m16n8k16")] {
            let e = emit(def, &bias_args(DType::BF16, M, N, K), &target).unwrap();
            let what = format!("{} {}", def.name, target.arch());
            assert_eq!(path(&e), Some(want), "{what}:\n{}", e.plan);
            assert_eq!(e.plan.operand_copies, [note], "{what}");
            assert!(e.plan.to_string().contains(note), "{}", e.plan);
            // the output's rows are 8194 bytes apart too: plain (masked) stores, no TMA store
            assert!(!e.plan.to_string().contains("TMA bulk stores"), "{what}: {}", e.plan);
            let ptx = kfuse::runtime::nvrtc::compile_ptx(&e.source, &e.arch, &e.options).unwrap();
            assert!(ptx.contains(instr), "{what}: no `{instr}` in the PTX");
            match common::assemble(&e.source, &e.arch, &e.options, &format!("padded_{what}")) {
                Ok((regs, spill)) => {
                    println!("{what} M{M} N{N} K{K}: {regs} registers, {spill} bytes of spills");
                    if spill > 0 {
                        failures.push(format!("{what}: {spill} bytes of spills"));
                    }
                }
                Err(err) => failures.push(err),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn explain_names_the_copy() {
    let e = kfuse::explain(&gemm_bias_relu::DEF, &bias_args(DType::BF16, M, N, K), &Target::sm90a()).unwrap();
    let text = e.to_string();
    // (256 x 128 tiles at this exact shape: 4 whole waves of 132 against 5 of 128 x 256)
    for line in ["operand `b` copied to a padded pitch of 4160 elements", ": wgmma m64n128k16", "BM=256 BN=128", "no spills"] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
    assert_eq!(e.ptxas.spill_store_bytes, 0, "{text}");
}

#[test]
fn every_operand_and_layout_that_needs_it_is_copied() {
    let target = Target::sm90a();
    // both operands of odd pitch; `b` as the transpose of an [N, K] tensor (K-major)
    // with columns 4098 bytes apart; `a` one element into its allocation
    let a = ArgDesc::strided(DType::F16, &[300, 2049], &[2049, 1]).at_byte_offset(2);
    let b = ArgDesc::strided(DType::F16, &[2049, 520], &[1, 2049]);
    let args = [a, b, t(DType::F16, &[520]), t(DType::F16, &[300, 520])];
    let e = emit(&gemm_bias_relu::DEF, &args, &target).unwrap();
    assert_eq!(path(&e), Some("WGMMA + TMA"), "{}", e.plan);
    assert_eq!(
        e.plan.operand_copies,
        [
            "operand `a` copied to a padded pitch of 2112 elements: row pitch 4098 bytes is not a multiple of 16",
            "operand `b` copied to a padded pitch of 2112 elements: column pitch 4098 bytes is not a multiple of 16",
        ]
    );
    // the copy keeps `b` K-major, as it was
    let dot = e.plan.dots.iter().find(|d| d.contains(": wgmma m")).unwrap();
    assert!(dot.contains("A from shared memory (K-major") && dot.contains("B from shared memory (K-major") && !dot.contains("MN-major"), "{dot}");
    // aligned rows, data one element off: copied for the alignment alone
    let a = ArgDesc::strided(DType::BF16, &[256, 512], &[520, 1]).at_byte_offset(2);
    let e = emit(&gemm_bias_relu::DEF, &[a, t(DType::BF16, &[512, 256]), t(DType::BF16, &[256]), t(DType::BF16, &[256, 256])], &target).unwrap();
    assert_eq!(e.plan.operand_copies, ["operand `a` copied to a padded pitch of 512 elements: its data starts 2 bytes past a 16-byte boundary"]);
    assert_eq!(path(&e), Some("WGMMA + TMA"));
}

#[test]
fn what_is_not_copied() {
    let target = Target::sm90a();
    // aligned operands: nothing to copy, the kernel the spec of the arguments gives
    let e = emit(&gemm_bias_relu::DEF, &bias_args(DType::BF16, 4096, 4096, 4096), &target).unwrap();
    assert!(e.plan.operand_copies.is_empty() && path(&e) == Some("WGMMA + TMA"));
    // an operand the kernel may write (`&mut`): not copied; the loop stays on the
    // tensor cores, `b` written to its tile from registers each step (TMA reads `a`)
    let staged = |e: &kfuse::codegen::EmittedKernel| e.plan.tensor_cores() && e.plan.dots.iter().any(|d| d.contains(": wgmma m") && d.contains("B from shared memory (MN-major, 128-byte swizzle, written where it is defined"));
    let e = emit(&gemm_b_mut::DEF, &[t(DType::BF16, &[M, K]), t(DType::BF16, &[K, N]), t(DType::BF16, &[M, N])], &target).unwrap();
    assert!(e.plan.operand_copies.is_empty() && staged(&e), "{}", e.plan);
    // f32 operands of `dot`: exact FMAs whatever their pitch, so no copy
    let e = emit(&gemm_bias_relu::DEF, &bias_args(DType::F32, 300, 301, 200), &target).unwrap();
    assert!(e.plan.operand_copies.is_empty() && path(&e) == Some("FMA (CUDA cores)"), "{}", e.plan);
    // no unit-stride dimension (every other element of a row): no 2-D copy makes it
    let b = ArgDesc::strided(DType::BF16, &[512, 256], &[1024, 2]);
    let e = emit(&gemm_bias_relu::DEF, &[t(DType::BF16, &[256, 512]), b, t(DType::BF16, &[256]), t(DType::BF16, &[256, 256])], &target).unwrap();
    assert!(e.plan.operand_copies.is_empty() && staged(&e), "{}", e.plan);
}

/// The launch's spec has the copy's facts (`launch_spec`), the arguments' own are in
/// `spec_for`; `gpu_plan_tiles` gives the tiles of the kernel the launch compiles, and
/// the interpreter run with them (the program the GPU runs, on the tensors as they lie)
/// gives the right answer.
#[test]
fn interpreter_runs_the_gpu_plan_of_an_unaligned_product() {
    let dev = Device::cpu();
    let (m, n, k) = (100, 150, 70);
    let (a, av) = common::random_tensor(&[m, k], DType::BF16, 11, 0.05, &dev);
    let (b, bv) = common::random_tensor(&[k, n], DType::BF16, 12, 0.05, &dev);
    let (bias, biasv) = common::random_tensor(&[n], DType::BF16, 13, 0.05, &dev);
    let mut out = common::poisoned(&[m, n], DType::BF16, &dev);
    let mut args = [Arg::In(&a), Arg::In(&b), Arg::In(&bias), Arg::Out(&mut out)];
    let def = &gemm_bias_relu::DEF;
    for target in [Target::sm90a(), Target::sm80()] {
        let spec: Spec = launch_spec(def, &args, &target).unwrap();
        // `a`: 140-byte rows, copied to 128 elements; `b`: 300-byte rows, to 192
        assert_eq!(spec.tensors[0], Some(TensorSpec { ptr_align: 16, stride_div: vec![16, 0] }));
        assert_eq!(spec.tensors[1], Some(TensorSpec { ptr_align: 16, stride_div: vec![16, 0] }));
        let own = spec_for(&(def.build)(&[DType::BF16]).unwrap(), &args).unwrap();
        assert_eq!(own.tensors[1].as_ref().map(|t| t.stride_div.clone()), Some(vec![2, 0]));
    }
    let target = Target::sm90a();
    let tiles = gpu_plan_tiles(def, &args, &target).unwrap();
    // (64x64 output tiles at this size, whose K tiles span two 128-byte swizzle spans)
    assert_eq!((tiles["BK"], tiles["BM"], tiles["BN"]), (128, 64, 64), "WGMMA tiles: {tiles:?}");
    let l = launch_interpreter(def, &mut args, &tiles).unwrap();
    assert_eq!(l.backend, Backend::Interpreter);
    assert!(l.plan.is_none(), "the interpreter copies nothing and has no GPU plan");
    let want: Vec<f64> = (0..m * n)
        .map(|x| {
            let (i, j) = (x / n, x % n);
            ((0..k).map(|q| av[i * k + q] * bv[q * n + j]).sum::<f64>() + biasv[j]).max(0.0)
        })
        .collect();
    let e = common::rel_err(&out.to_vec_f64().unwrap(), &want);
    assert!(e < 1e-2, "relative error {e:.2e} with the sm_90a plan {tiles:?}");
    // and `launch` itself on CPU tensors (the interpreter's own tiles)
    let mut out2 = common::poisoned(&[m, n], DType::BF16, &dev);
    gemm_bias_relu(&a, &b, &bias, &mut out2).unwrap();
    assert!(common::rel_err(&out2.to_vec_f64().unwrap(), &want) < 1e-2);
}

/// An operand TMA cannot read and the runtime does not copy (a `b` the kernel may write,
/// its rows an odd number of elements apart) stays on the tensor cores, written to its
/// tile from registers each step: right against float64 on the GPU, odd shapes, outputs
/// poisoned.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn an_operand_no_copy_engine_reads_on_the_gpu() {
    let dev = common::gpu();
    let mut failures = Vec::new();
    for (s, dt) in [DType::BF16, DType::F16].into_iter().enumerate() {
        for (m, n, k) in [(300, 4097, 520), (129, 201, 1000), (1000, 777, 64)] {
            let seed = 7000 + 10 * s as u64 + m as u64;
            let (a, av) = common::random_tensor(&[m, k], dt, seed, 0.05, &dev);
            let (mut b, bv) = common::random_tensor(&[k, n], dt, seed + 1, 0.05, &dev);
            let mut c = common::poisoned(&[m, n], dt, &dev);
            if let Err(e) = gemm_b_mut(&a, &mut b, &mut c) {
                failures.push(format!("{dt} {m}x{n}x{k}: {e}"));
                continue;
            }
            let want: Vec<f64> = (0..m * n).map(|x| (0..k).map(|q| av[(x / n) * k + q] * bv[q * n + x % n]).sum()).collect();
            let err = common::rel_err(&c.to_vec_f64().unwrap(), &want);
            if !(err < 1e-2) {
                failures.push(format!("{dt} {m}x{n}x{k}: relative error {err:.2e} (seed {seed})"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

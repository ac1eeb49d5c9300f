//! `kfuse::explain` without a GPU: the plan of the kernel a launch would load, the
//! `ptxas -v` facts of its PTX (checked against a separate run of ptxas on it), and the
//! roofline's arithmetic, exactly, for a GEMM, an elementwise add, a row reduction and a
//! loop whose trip count depends on the program. Needs NVRTC and ptxas, as the compile
//! checks do (`scripts/test.sh` installs them).

use kfuse::codegen::Target;
use kfuse::ops::kernels as k;
use kfuse::prelude::*;
use kfuse::runtime::roofline::{self, Bound, Compute};
use kfuse::runtime::{ptxas, ArgDesc};

fn t(dtype: DType, shape: &[usize]) -> ArgDesc {
    ArgDesc::tensor(dtype, shape)
}

/// The facts `explain` reports are those of its own PTX assembled again by ptxas.
fn ptxas_agrees(e: &kfuse::Explain) {
    let again = ptxas::assemble(&e.ptx, &e.arch).unwrap();
    assert_eq!(e.ptxas, again.info, "{}", again.log);
    assert_eq!((e.plan.registers, e.plan.local_bytes), (Some(e.ptxas.registers), Some(e.ptxas.stack_frame_bytes)));
    assert!((1..=255).contains(&e.ptxas.registers), "{e}");
}

#[test]
fn gemm_bf16_4096_on_sm90a() {
    let n = 4096usize;
    let e = kfuse::explain(&k::gemm::DEF, &[t(DType::BF16, &[n, n]), t(DType::BF16, &[n, n]), t(DType::BF16, &[n, n])], &Target::sm90a()).unwrap();
    ptxas_agrees(&e);
    // the general lowering: WGMMA on rings a producer warpgroup fills
    assert!(e.plan.tensor_cores(), "{e}");
    assert!(e.plan.dots.iter().any(|d| d.contains("wgmma m64n256k16 over 2 warpgroup(s)")), "{e}");
    assert_eq!(e.plan.block_threads, 128 * 3);
    assert_eq!(e.dynamic_smem_bytes, e.plan.dynamic_smem_bytes);
    assert!(e.ir.contains(kfuse::codegen::passes::select_mma_path::GENERAL_TAKES) && e.cuda.contains("wgmma") && e.ptx.contains(".target sm_90a"));
    // 3 tensors of 4096² bf16, 2·M·N·K FLOPs (the accumulating add is the dot's)
    let r = &e.roofline;
    assert_eq!(r.bytes, 3 * 4096 * 4096 * 2);
    assert_eq!(r.flops, Some(2 * 4096u64.pow(3)));
    let p = r.peak.expect("H100 figures for sm_90a");
    assert_eq!((p.compute, p.bytes_per_s, p.flops_per_s), (Compute::TensorCores16Bit, 3.35e12, 989.5e12));
    assert_eq!(r.bound(), Some(Bound::Compute));
    let want = 2.0 * 4096f64.powi(3) / 989.5e12;
    assert_eq!(r.time_at_peak_s(), Some(want));
    assert_eq!(r.fraction_of_peak(want * 2e3), Some(0.5));
    let text = e.to_string();
    for line in [": wgmma m64n256k16 over 2 warpgroup(s)", "registers:", "shared memory:", "bytes moved: 100663296", "time at peak:"] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
}

#[test]
fn gemm_on_the_other_paths() {
    let n = 1024usize;
    let args = |d| [t(d, &[n, n]), t(d, &[n, n]), t(d, &[n, n])];
    // sm_80: the general lowering's mma.sync against the A100's tensor cores
    let e = kfuse::explain(&k::gemm::DEF, &args(DType::F16), &Target::sm80()).unwrap();
    ptxas_agrees(&e);
    assert!(e.plan.tensor_cores() && e.plan.to_string().contains(": mma.sync m16n8k16 over"), "{e}");
    let p = e.roofline.peak.unwrap();
    assert_eq!((p.bytes_per_s, p.flops_per_s), (roofline::A100_SXM_BYTES_PER_S, roofline::A100_SXM_16BIT_TC_FLOPS));
    // f32 operands: exact FMAs on the CUDA cores, and why
    let e = kfuse::explain(&k::gemm::DEF, &args(DType::F32), &Target::sm90a()).unwrap();
    assert!(!e.plan.tensor_cores() && e.plan.dots_one_by_one.as_deref().is_some_and(|w| w.contains("exact f32")), "{e}");
    assert!(e.plan.dots.iter().any(|d| d.contains("f32 FMAs on runs of 4 a thread")), "{e}");
    assert_eq!(e.roofline.peak.unwrap().flops_per_s, roofline::H100_SXM_F32_FLOPS);
    assert_eq!(e.roofline.bytes, 3 * (n * n * 4) as u64);
    // sm_89: counted, but no peak figures
    let e = kfuse::explain(&k::gemm::DEF, &args(DType::BF16), &Target::sm89()).unwrap();
    assert_eq!((e.roofline.flops, e.roofline.peak, e.roofline.time_at_peak_s()), (Some(2 * (n as u64).pow(3)), None, None));
}

#[test]
fn elementwise_add_is_memory_bound() {
    let n = 1usize << 20;
    let e = kfuse::explain(&k::add::DEF, &[t(DType::BF16, &[n]), t(DType::BF16, &[n]), t(DType::BF16, &[n])], &Target::sm90a()).unwrap();
    ptxas_agrees(&e);
    assert_eq!((e.plan.dots_one_by_one.as_deref(), e.plan.tensor_cores()), (None, false));
    assert!(e.to_string().contains("dots: none"), "{e}");
    // a, b read and out written; one add an element
    let r = &e.roofline;
    assert_eq!((r.bytes, r.flops), (3 * n as u64 * 2, Some(n as u64)));
    let p = r.peak.unwrap();
    assert_eq!((p.compute, p.flops_per_s), (Compute::CudaCoresF32, 67e12));
    assert_eq!(r.bound(), Some(Bound::Memory));
    assert_eq!(r.time_at_peak_s(), Some(3.0 * n as f64 * 2.0 / 3.35e12));
}

#[test]
fn row_sum_counts_each_element_once() {
    let (m, n) = (4096usize, 1000usize);
    let r = kfuse::runtime::roofline(&k::row_sum::DEF, &[t(DType::F32, &[m, n]), t(DType::F32, &[m])], &Target::sm90a()).unwrap();
    assert_eq!((r.bytes, r.flops), (((m * n + m) * 4) as u64, Some((m * n) as u64)));
}

/// Row `i` sums the first `(i + 1)·BM` columns: a loop bound that depends on the
/// program, evaluated program by program.
#[kfuse]
pub fn triangle_sums<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<f32, (M,)>) {
    let i = program_id(0);
    let mut acc = zeros::<f32>([BM]);
    for j in (0..(i + 1) * BM).step_by(BN) {
        acc = acc + x.block([i * BM, j], [BM, BN]).load().to_f32().sum_axis(1);
    }
    out.block([i * BM], [BM]).store(acc);
}

#[test]
fn a_loop_bound_of_the_program_id() {
    let m = 300u64;
    let r = kfuse::runtime::roofline(&triangle_sums::DEF, &[t(DType::F32, &[m as usize, m as usize]), t(DType::F32, &[m as usize])], &Target::sm90a()).unwrap();
    // program i: i + 1 trips of a one-element reduction and an add
    assert_eq!(r.flops, Some(2 * (1..=m).sum::<u64>()));
    assert_eq!(r.bytes, (m * m + m) * 4);
}

#[test]
fn errors_are_those_of_a_launch() {
    let e = kfuse::explain(&k::add::DEF, &[t(DType::BF16, &[8]), t(DType::BF16, &[8])], &Target::sm90a()).unwrap_err();
    assert!(e.to_string().contains("takes 3 argument(s)"), "{e}");
    let e = kfuse::explain(&k::add::DEF, &[t(DType::BF16, &[8]), t(DType::BF16, &[9]), t(DType::BF16, &[8])], &Target::sm90a()).unwrap_err();
    assert!(matches!(e, kfuse::Error::ShapeMismatch(_)), "{e}");
}

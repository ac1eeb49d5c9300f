//! A matrix loop whose operand tensors have six dimensions (four of them a batch the
//! kernel indexes): more than the general lowering's rings and TMA take (five), so each
//! `dot` is lowered where it stands, on the FMA tiles, and the plan says why. Checked on
//! the interpreter and, where NVRTC is found, compiled and assembled for sm_90a and
//! sm_80 without spills; on the GPU (GPU build) against float64 into a poisoned output.

mod common;

use kfuse::codegen::Target;
use kfuse::prelude::*;
use kfuse::runtime::{emit, ArgDesc};
use kfuse::{Backend, DType};

/// `out[z] = a[0, 0, 0, z] · b[0, 0, 0, z]` for six-dimensional `a` and `b`.
#[kfuse]
pub fn gemm_six_dim<T: Float>(a: Tensor<T, (P, Q, R, NB, M, K)>, b: Tensor<T, (P, Q, R, NB, K, N)>, out: &mut Tensor<f32, (NB, M, N)>) {
    let (i, j, z) = (program_id(0), program_id(1), program_id(2));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        let at = a.block([0, 0, 0, z, i * BM, k], [_, _, _, _, BM, BK]).load();
        acc += dot(at, b.block([0, 0, 0, z, k, j * BN], [_, _, _, _, BK, BN]).load());
    }
    out.block([z, i * BM, j * BN], [_, BM, BN]).store(acc);
}

/// `(nb, m, n, k)`: partial tiles along every axis, K over several tiles.
const SHAPE: (usize, usize, usize, usize) = (3, 37, 70, 90);

/// The float64 product of each batch of `a: [nb, m, k]` and `b: [nb, k, n]` (row-major).
fn reference(av: &[f64], bv: &[f64]) -> Vec<f64> {
    let (nb, m, n, k) = SHAPE;
    let mut c = vec![0.0; nb * m * n];
    for z in 0..nb {
        for i in 0..m {
            for j in 0..n {
                c[(z * m + i) * n + j] = (0..k).map(|q| av[(z * m + i) * k + q] * bv[(z * k + q) * n + j]).sum();
            }
        }
    }
    c
}

/// Runs the kernel on `dev` for bf16 operands of [`SHAPE`] into a poisoned output: the
/// launch and the relative error against float64.
fn run(dev: &Device) -> (kfuse::Launched, f64) {
    let (nb, m, n, k) = SHAPE;
    let (a, av) = common::random_tensor(&[1, 1, 1, nb, m, k], DType::BF16, 61, 0.05, dev);
    let (b, bv) = common::random_tensor(&[1, 1, 1, nb, k, n], DType::BF16, 62, 0.05, dev);
    let mut out = common::poisoned(&[nb, m, n], DType::F32, dev);
    let l = gemm_six_dim(&a, &b, &mut out).unwrap();
    (l, common::rel_err(&out.to_vec_f64().unwrap(), &reference(&av, &bv)))
}

#[test]
fn six_dimensional_operands_on_the_interpreter() {
    let (l, e) = run(&Device::cpu());
    assert_eq!(l.backend, Backend::Interpreter);
    assert!(e <= 1e-2, "relative error {e:.3e}");
}

#[test]
fn six_dimensional_operands_are_lowered_where_they_stand() {
    let (nb, m, n, k) = SHAPE;
    let args = [ArgDesc::tensor(DType::BF16, &[1, 1, 1, nb, m, k]), ArgDesc::tensor(DType::BF16, &[1, 1, 1, nb, k, n]), ArgDesc::tensor(DType::F32, &[nb, m, n])];
    for target in [Target::sm90a(), Target::sm80()] {
        let e = emit(&gemm_six_dim::DEF, &args, &target).unwrap();
        let plan = e.plan.to_string();
        assert!(plan.contains("does not take this loop (operand tensors of more than five dimensions)"), "{}: {plan}", target.arch());
        if kfuse::runtime::nvrtc::nvrtc_available() {
            let (regs, spills) = common::assemble(&e.source, &e.arch, &e.options, &format!("six_dim_{}", target.arch())).unwrap();
            println!("gemm_six_dim bf16 {}: {regs} registers, {spills} bytes of spills\n{plan}", target.arch());
            assert_eq!(spills, 0, "{}: {regs} registers, {spills} bytes of spills", target.arch());
        }
    }
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn six_dimensional_operands_on_the_gpu() {
    let (l, e) = run(&common::gpu());
    assert!(matches!(l.backend, Backend::Gpu { .. }), "{:?}", l.backend);
    assert!(e <= 1e-2, "relative error {e:.3e}");
}

//! `kfuse::ops::conv2d` against a float64 reference: odd shapes (H, W of 1, 7 and 13;
//! channel and filter counts not multiples of 8), stride 2, dilation 2, padding 0 to 2,
//! groups 2, depthwise and 1 × 1 layers (each of the three kernels), bias and each
//! activation, every dtype; the kernels' launchers into NaN-poisoned outputs; bad input.
//!
//! Each case runs on the best device there is (the interpreter in CI, the GPU on the GPU
//! host), with fixed seeds. The error is measured against the size of the terms that
//! make each output (`Σ |x·w| + |bias|`), so outputs whose terms cancel are not held to a
//! bound their own size cannot carry.

mod common;

use kfuse::ops::{kernels, Activation, Conv2dOptions};
use kfuse::prelude::*;
use kfuse::DType;

fn dev() -> Device {
    Device::best()
}

/// One layer: `[N, H, W, C]`, `K`, `(R, S)`, stride, padding, dilation, groups, bias,
/// activation.
#[derive(Clone, Copy, Debug)]
struct Layer {
    x: [usize; 4],
    k: usize,
    f: (usize, usize),
    stride: (usize, usize),
    pad: (usize, usize),
    dil: (usize, usize),
    groups: usize,
    bias: bool,
    act: Activation,
}

fn act_ref(a: Activation, v: f64) -> f64 {
    match a {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::Gelu => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
        Activation::Silu => v / (1.0 + (-v).exp()),
    }
}

/// The float64 convolution and, per output, the size of its terms.
fn reference(l: &Layer, xv: &[f64], wv: &[f64], bv: Option<&[f64]>) -> (Vec<f64>, Vec<f64>) {
    let [n, h, w, c] = l.x;
    let (r, s) = l.f;
    let p = (h + 2 * l.pad.0 - l.dil.0 * (r - 1) - 1) / l.stride.0 + 1;
    let q = (w + 2 * l.pad.1 - l.dil.1 * (s - 1) - 1) / l.stride.1 + 1;
    let (cg, kg) = (c / l.groups, l.k / l.groups);
    let mut out = vec![0.0; n * p * q * l.k];
    let mut scale = vec![0.0; out.len()];
    for b in 0..n {
        for y in 0..p {
            for z in 0..q {
                for k in 0..l.k {
                    let g = k / kg;
                    let (mut acc, mut mag) = (0.0, 0.0);
                    if let Some(bv) = bv {
                        acc = bv[k];
                        mag = bv[k].abs();
                    }
                    for i in 0..r {
                        for j in 0..s {
                            let hy = (y * l.stride.0 + i * l.dil.0) as i64 - l.pad.0 as i64;
                            let wz = (z * l.stride.1 + j * l.dil.1) as i64 - l.pad.1 as i64;
                            if hy < 0 || wz < 0 || hy >= h as i64 || wz >= w as i64 {
                                continue;
                            }
                            for ch in 0..cg {
                                let xe = xv[((b * h + hy as usize) * w + wz as usize) * c + g * cg + ch];
                                let we = wv[((k * r + i) * s + j) * cg + ch];
                                acc += xe * we;
                                mag += (xe * we).abs();
                            }
                        }
                    }
                    let o = ((b * p + y) * q + z) * l.k + k;
                    out[o] = act_ref(l.act, acc);
                    scale[o] = mag;
                }
            }
        }
    }
    (out, scale)
}

/// The error bound of a dtype, against the terms' size.
fn tol(dt: DType) -> f64 {
    match dt {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 8e-3,
    }
}

fn run(l: &Layer, dt: DType, seed: u64) {
    let [_, _, _, c] = l.x;
    let (x, xv) = common::random_tensor(&l.x, dt, seed, 0.0, &dev());
    let (w, wv) = common::random_tensor(&[l.k, l.f.0, l.f.1, c / l.groups], dt, seed + 1, 0.0, &dev());
    let (b, bv) = common::random_tensor(&[l.k], dt, seed + 2, 0.0, &dev());
    let opts = Conv2dOptions { stride: l.stride, padding: l.pad, dilation: l.dil, groups: l.groups, bias: l.bias.then_some(&b), activation: l.act };
    let y = kfuse::ops::conv2d(&x, &w, &opts).unwrap_or_else(|e| panic!("{l:?} {dt}: {e}"));
    let (want, scale) = reference(l, &xv, &wv, l.bias.then_some(&bv[..]));
    let got = y.to_vec_f64().unwrap();
    let e = common::err_against(&got, &want, &scale);
    assert!(e <= tol(dt), "conv2d {l:?} {dt} on {} (seed {seed}): error {e:.3e} > {:.1e}", dev().describe(), tol(dt));
}

/// [`run`] on each layer in each of `dtypes`, the seeds `seed`, `seed + 10`, … a layer.
fn run_layers(layers: &[Layer], dtypes: &[DType], seed: u64) {
    for (i, l) in layers.iter().enumerate() {
        for &dt in dtypes {
            run(l, dt, seed + 10 * i as u64);
        }
    }
}

const fn layer(x: [usize; 4], k: usize, f: (usize, usize), stride: usize, pad: usize, dil: usize, groups: usize, bias: bool, act: Activation) -> Layer {
    Layer { x, k, f, stride: (stride, stride), pad: (pad, pad), dil: (dil, dil), groups, bias, act }
}

/// Implicit GEMM layers (`kernels::conv2d`).
#[test]
fn implicit_gemm_layers() {
    let layers = [
        layer([2, 7, 13, 6], 10, (3, 3), 1, 1, 1, 1, true, Activation::Relu),
        layer([1, 13, 7, 5], 7, (3, 3), 2, 0, 1, 1, false, Activation::Gelu),
        layer([2, 13, 13, 4], 6, (3, 3), 1, 2, 2, 2, true, Activation::Silu),
        layer([1, 1, 1, 3], 5, (3, 3), 1, 1, 1, 1, true, Activation::None),
        layer([1, 7, 7, 9], 11, (1, 1), 2, 0, 1, 1, true, Activation::None),
        layer([1, 7, 13, 6], 4, (2, 3), 2, 2, 1, 2, false, Activation::Relu),
    ];
    run_layers(&layers, &common::DTYPES, 4000);
}

/// f32 3 × 3 stride-1 layers, which take Winograd F(2 × 2, 3 × 3) (`kernels::conv2d_winograd_*`):
/// odd and even output sizes (a last tile half outside the image), padding 0, 1 and 2,
/// one pixel, channels and filters not multiples of 8, bias and each activation; every
/// output against float64, its error against the size of the terms summed.
#[test]
fn winograd_layers() {
    let layers = [
        layer([2, 7, 13, 6], 10, (3, 3), 1, 1, 1, 1, true, Activation::Relu),
        layer([1, 9, 8, 5], 7, (3, 3), 1, 0, 1, 1, false, Activation::None),
        layer([3, 6, 5, 3], 9, (3, 3), 1, 2, 1, 1, true, Activation::Gelu),
        layer([1, 1, 1, 4], 3, (3, 3), 1, 1, 1, 1, true, Activation::Silu),
        layer([2, 17, 11, 37], 33, (3, 3), 1, 1, 1, 1, true, Activation::None),
    ];
    run_layers(&layers, &[DType::F32], 4200);
}

/// Implicit GEMM layers whose channels are whole 16-byte pieces (64, 128), so that on
/// sm_90a the rows are gathered straight from the input by the producer warpgroups into
/// a ring of several stages, over several programs a block: every output against
/// float64. GPU only (the interpreter takes minutes at these sizes).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn implicit_gemm_layers_of_aligned_channels() {
    let layers = [
        layer([2, 15, 15, 64], 128, (3, 3), 1, 1, 1, 1, true, Activation::Relu),
        layer([3, 16, 17, 64], 64, (3, 3), 2, 1, 1, 1, false, Activation::None),
        layer([3, 9, 11, 128], 64, (1, 1), 2, 0, 1, 1, true, Activation::None),
        // (one step of 64 channels over 33792 × 128 outputs, 264 programs of 128 rows
        // or 132 of 256: 256-row tiles on sm_90a, `short_reductions_take_256_rows`)
        layer([33, 64, 64, 64], 128, (1, 1), 2, 0, 1, 1, true, Activation::Relu),
    ];
    run_layers(&layers, &[DType::BF16, DType::F16], 4500);
}

/// Depthwise layers (`kernels::conv2d_depthwise`).
#[test]
fn depthwise_layers() {
    let layers = [
        // row stride 2, column stride 1, a 2 × 5 filter, uneven padding and dilation
        Layer { x: [2, 11, 17, 16], k: 16, f: (2, 5), stride: (2, 1), pad: (1, 3), dil: (2, 1), groups: 16, bias: true, act: Activation::None },
        layer([2, 7, 7, 9], 9, (3, 3), 1, 1, 1, 9, true, Activation::Relu),
        layer([1, 13, 13, 5], 5, (5, 5), 2, 2, 1, 5, false, Activation::None),
        layer([1, 13, 7, 3], 3, (3, 3), 1, 2, 2, 3, true, Activation::Silu),
        layer([1, 1, 1, 20], 20, (3, 3), 1, 1, 1, 20, true, Activation::Gelu),
        // channels in 16-byte vectors: rows of the padding read as zero vectors
        layer([2, 9, 11, 24], 24, (3, 3), 1, 1, 1, 24, true, Activation::None),
        layer([1, 13, 10, 40], 40, (3, 3), 2, 2, 2, 40, false, Activation::Relu),
    ];
    run_layers(&layers, &common::DTYPES, 5000);
}

/// 1 × 1 stride-1 layers (`kernels::conv2d_pointwise`, a GEMM on the tensors as they lie).
#[test]
fn pointwise_layers() {
    let layers = [
        layer([2, 7, 13, 5], 7, (1, 1), 1, 0, 1, 1, true, Activation::Relu),
        layer([1, 1, 1, 3], 9, (1, 1), 1, 0, 1, 1, false, Activation::Gelu),
        layer([1, 13, 13, 40], 24, (1, 1), 1, 0, 1, 1, true, Activation::Silu),
    ];
    run_layers(&layers, &common::DTYPES, 6000);
}

/// The three kernels' launchers write every element of a NaN-poisoned output.
#[test]
fn kernels_fill_poisoned_outputs() {
    let dt = DType::BF16;
    let (x, xv) = common::random_tensor(&[2, 7, 13, 6], dt, 7000, 0.0, &dev());
    let (w, wv) = common::random_tensor(&[6, 3, 3, 3], dt, 7001, 0.0, &dev());
    let (b, bv) = common::random_tensor(&[6], dt, 7002, 0.0, &dev());
    // implicit GEMM, groups 2, padding 1
    let l = layer([2, 7, 13, 6], 6, (3, 3), 1, 1, 1, 2, true, Activation::Relu);
    let mut y = common::poisoned(&[2 * 7 * 13, 2, 3], dt, &dev());
    kernels::conv2d(&x.view(&[2, 7, 13, 2, 3]).unwrap(), &w.view(&[2, 3, 3, 3, 3]).unwrap(), &b.view(&[2, 3]).unwrap(), &mut y, 13, 91, 1, 1, 1, 1, 1, 1, 0.0).unwrap();
    let (want, scale) = reference(&l, &xv, &wv, Some(&bv));
    assert!(common::err_against(&y.to_vec_f64().unwrap(), &want, &scale) <= tol(dt));
    // depthwise, padding 1
    let (wd, wdv) = common::random_tensor(&[6, 3, 3, 1], dt, 7003, 0.0, &dev());
    let l = layer([2, 7, 13, 6], 6, (3, 3), 1, 1, 1, 6, true, Activation::None);
    let mut y = common::poisoned(&[2 * 7 * 13, 6], dt, &dev());
    kernels::conv2d_depthwise(&x, &wd.view(&[6, 9]).unwrap().t().contiguous().unwrap().view(&[3, 3, 6]).unwrap(), &b, &mut y, 13, 91, 1, 1, 1, 1, 1, 1, f32::NEG_INFINITY).unwrap();
    let (want, scale) = reference(&l, &xv, &wdv, Some(&bv));
    assert!(common::err_against(&y.to_vec_f64().unwrap(), &want, &scale) <= tol(dt));
    // pointwise
    let (wp, wpv) = common::random_tensor(&[6, 1, 1, 6], dt, 7004, 0.0, &dev());
    let l = layer([2, 7, 13, 6], 6, (1, 1), 1, 0, 1, 1, true, Activation::Relu);
    let mut y = common::poisoned(&[2 * 7 * 13, 6], dt, &dev());
    kernels::conv2d_pointwise(&x.view(&[182, 6]).unwrap(), &wp.view(&[6, 6]).unwrap().t(), &b, &mut y, 0.0).unwrap();
    let (want, scale) = reference(&l, &xv, &wpv, Some(&bv));
    assert!(common::err_against(&y.to_vec_f64().unwrap(), &want, &scale) <= tol(dt));
    // Winograd F(2 × 2, 3 × 3), f32, padding 1: 4 × 7 tiles an image; the transforms and
    // the product into poisoned scratch, the output poisoned
    let f = DType::F32;
    let (x, xv) = common::random_tensor(&[2, 7, 13, 6], f, 7005, 0.0, &dev());
    let (w, wv) = common::random_tensor(&[5, 3, 3, 6], f, 7006, 0.0, &dev());
    let (b, bv) = common::random_tensor(&[5], f, 7007, 0.0, &dev());
    let l = layer([2, 7, 13, 6], 5, (3, 3), 1, 1, 1, 1, true, Activation::Relu);
    let (mut u, mut v, mut m) = (common::poisoned(&[16, 6, 5], f, &dev()), common::poisoned(&[16, 56, 6], f, &dev()), common::poisoned(&[16, 56, 5], f, &dev()));
    let mut y = common::poisoned(&[2, 7, 13, 5], f, &dev());
    kernels::conv2d_winograd_filter(&w, &mut u).unwrap();
    kernels::conv2d_winograd_input(&x, &mut v, 7, 28, 1, 1).unwrap();
    kernels::gemm_batched_scaled(&v, &u, &mut m, 1.0).unwrap();
    kernels::conv2d_winograd_output(&m, &b, &mut y, 7, 28, 0.0).unwrap();
    let (want, scale) = reference(&l, &xv, &wv, Some(&bv));
    assert!(common::err_against(&y.to_vec_f64().unwrap(), &want, &scale) <= tol(f));
}

/// Bad input is an error that names the fix; nothing is launched.
#[test]
fn bad_input_is_an_error() {
    let d = Device::cpu();
    let x = Tensor::zeros(&[1, 8, 8, 6], DType::BF16, &d).unwrap();
    let w = Tensor::zeros(&[4, 3, 3, 6], DType::BF16, &d).unwrap();
    let err = |x: &Tensor, w: &Tensor, o: &Conv2dOptions| kfuse::ops::conv2d(x, w, o).unwrap_err().to_string();
    let e = err(&x, &w, &Conv2dOptions { groups: 4, ..Default::default() });
    assert!(e.contains("divisible by groups"), "{e}");
    let e = err(&x, &Tensor::zeros(&[4, 3, 3, 5], DType::BF16, &d).unwrap(), &Default::default());
    assert!(e.contains("must have 6"), "{e}");
    let e = err(&x, &Tensor::zeros(&[4, 9, 3, 6], DType::BF16, &d).unwrap(), &Default::default());
    assert!(e.contains("filter spans 9") && e.contains("pad more"), "{e}");
    let e = err(&x, &Tensor::zeros(&[4, 3, 3, 6], DType::F16, &d).unwrap(), &Default::default());
    assert!(e.contains("must match"), "{e}");
    let nchw = Tensor::zeros(&[1, 6, 8, 8], DType::BF16, &d).unwrap().permute(&[0, 2, 3, 1]).unwrap();
    let e = err(&nchw, &w, &Default::default());
    assert!(e.contains("NHWC") && e.contains("ops::contiguous("), "{e}");
    let e = err(&x, &w, &Conv2dOptions { stride: (0, 1), ..Default::default() });
    assert!(e.contains("at least 1"), "{e}");
    let b = Tensor::zeros(&[5], DType::BF16, &d).unwrap();
    let e = err(&x, &w, &Conv2dOptions { bias: Some(&b), ..Default::default() });
    assert!(e.contains("`bias` must be [K]"), "{e}");
    let e = err(&Tensor::zeros(&[8, 8, 6], DType::BF16, &d).unwrap(), &w, &Default::default());
    assert!(e.contains("NHWC"), "{e}");
}

/// The kernels compile for sm_80 and sm_90a: NVRTC, then `ptxas -v`, no spills.
#[test]
fn conv_kernels_compile_for_sm80_and_sm90a() {
    let failures = common::compile_for_both_targets(&[
        (&kernels::conv2d::DEF, true),
        (&kernels::conv2d_depthwise::DEF, true),
        (&kernels::conv2d_pointwise::DEF, true),
        (&kernels::conv2d_winograd_filter::DEF, true),
        (&kernels::conv2d_winograd_input::DEF, true),
        (&kernels::conv2d_winograd_output::DEF, true),
    ]);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A convolution kernel in bf16 and the snapshots' specialization: large shapes, a 3 × 3
/// filter (its tap loops unrolled).
fn snapshot_kernel(def: &kfuse::ir::KernelDef) -> (kfuse::ir::Kernel, kfuse::codegen::Spec) {
    let k = (def.build)(&[DType::BF16]).unwrap();
    let mut spec = common::snapshot_spec(def);
    let vals: Vec<u64> = k.shape_syms.iter().map(|s| if s == "R" || s == "S" { 3 } else { 4096 }).collect();
    spec.shape_exact = kfuse::codegen::target::exact_shapes(&k, &vals);
    (k, spec)
}

/// The CUDA of the implicit GEMM and the depthwise kernel, bf16, for sm_90a and sm_80 at
/// the snapshot spec with a 3 × 3 filter (the gathered rows, the rings and their row
/// tables on sm_90a; the depthwise taps unrolled): a snapshot changes only when the
/// compiler's output does.
#[test]
fn conv_kernel_snapshots() {
    use kfuse::codegen::Target;
    for def in [&kernels::conv2d::DEF, &kernels::conv2d_depthwise::DEF] {
        let (k, spec) = snapshot_kernel(def);
        for target in [Target::sm90a(), Target::sm80()] {
            let e = kfuse::codegen::compile(&k, &spec, &target).unwrap();
            if def.name == "conv2d_depthwise" {
                let plan = e.plan.to_string();
                assert!(e.source.contains("#pragma unroll  // 3 iterations"), "the taps are not unrolled:\n{}", e.source);
                assert!(plan.contains(": unrolled, 3 iterations (R = 3 at this launch)") && plan.contains(": unrolled, 3 iterations (S = 3 at this launch)"), "{plan}");
            }
            insta::assert_snapshot!(format!("{}_bf16_{}", def.name, target.arch()), e.source);
        }
    }
}

/// Where the input's offsets fit 32 bits (`Spec::offsets32`, which the runtime sets for a
/// tensor whose elements all lie within 2^31 of its first), the gathered rows are addressed
/// in 32-bit arithmetic: the depthwise kernel's vector loads sum their coordinates times
/// the strides in 32 bits, and the implicit GEMM's row tables (its ring's, on both
/// targets) hold 32-bit offsets (the
/// 64-bit forms are the snapshots'); both compile without spills on sm_80 and sm_90a, and
/// divide the pixel index by the launch's multiply-shift words (`dm_pq`, `dm_oq`).
#[test]
fn gathered_rows_address_in_32_bits_where_offsets_fit() {
    use kfuse::codegen::Target;
    for def in [&kernels::conv2d::DEF, &kernels::conv2d_depthwise::DEF] {
        let (k, mut spec) = snapshot_kernel(def);
        spec.offsets32 = vec![true; k.params.len()];
        for target in [Target::sm90a(), Target::sm80()] {
            let what = format!("{} on {}", def.name, target.arch());
            let (e, regs, spill) = common::compile_assembled(&k, &spec, &target, &what).unwrap_or_else(|e| panic!("{what}: {}", e.0));
            assert_eq!(spill, 0, "{what}: {spill} bytes of spills ({regs} registers)");
            assert!(e.source.contains("kf_divm(") && e.source.contains("dm_pq") && e.source.contains("dm_oq") && !e.source.contains("kf_divi("), "{what}: not divided by the launch's words:\n{}", e.source);
            let form = if def.name == "conv2d" { "__shared__ unsigned kf_gt" } else { "+ (unsigned long long)((unsigned)" };
            assert!(e.source.contains(form), "{what}: no `{form}`:\n{}", e.source);
            assert!(!e.source.contains("__shared__ long long kf_gt"), "{what}: 64-bit row tables");
        }
    }
}

/// The implicit GEMM's plan on sm_90a at two ResNet layers (N64, bf16): warp-specialized,
/// its two producer warpgroups gathering the input's rows with `cp.async` (from row tables it
/// writes) and copying the filters by TMA, four or more ring stages, no spills, and at
/// K = 64 output channels (N no wider than half the warpgroup rule's 128) 256-row tiles,
/// so that a step keeps 256 × 64 results.
#[test]
fn implicit_gemm_plans_at_resnet_layers() {
    use kfuse::codegen::Target;
    let k = (kernels::conv2d::DEF.build)(&[DType::BF16]).unwrap();
    // N, H, W, G, CG, KG, R, S, NPQ (power-of-two buckets)
    for (c, kk, hw, tiles, stages) in [(64u32, 64u32, 64u32, "BM=256 BN=64", 4), (256, 256, 16, "BM=128 BN=128", 5)] {
        let mut spec = common::snapshot_spec(&kernels::conv2d::DEF);
        spec.shape_pow2 = vec![64, hw, hw, 1, c, kk, 4, 4, 64 * hw * hw];
        let what = format!("conv2d C{c} K{kk}");
        let (e, regs, spill) = common::compile_assembled(&k, &spec, &Target::sm90a(), &what).unwrap_or_else(|e| panic!("{what}: {}", e.0));
        let plan = e.plan.to_string();
        assert_eq!(spill, 0, "{what}: {spill} bytes of spills ({regs} registers)");
        assert!(plan.contains(&format!("tiles: {tiles}")), "{what}: not {tiles}:\n{plan}");
        assert!(plan.contains("rings filled by two producer warpgroups (gathered rows by cp.async, the other tiles by TMA"), "{what}: not warp-specialized:\n{plan}");
        assert!(plan.contains(&format!("copied by the producer warpgroups into a {stages}-stage ring")), "{what}: not {stages} stages:\n{plan}");
    }
}

/// At a launch's exact shape the implicit GEMM takes 64-row tiles where they walk the
/// programs in fewer waves (`choose_tiles::exact_shape_tiles`): C256 3 × 3 at 14 × 14
/// (N64: 196 programs of 128 rows on 132 multiprocessors, 392 of 64), not C512 at 7 × 7
/// (100 against 196: one wave of 128 rows, two of 64) nor C128 at 28 × 28.
#[test]
fn implicit_gemm_rows_follow_the_waves() {
    use kfuse::codegen::passes::choose_tiles::exact_shape_tiles;
    use kfuse::codegen::Target;
    let k = (kernels::conv2d::DEF.build)(&[DType::BF16]).unwrap();
    for (c, hw, want) in [(256u64, 14u64, Some(64)), (512, 7, None), (128, 28, None)] {
        // N, H, W, G, CG, KG, R, S, NPQ
        let dims = [64, hw, hw, 1, c, c, 3, 3, 64 * hw * hw];
        let mut spec = common::snapshot_spec(&kernels::conv2d::DEF);
        spec.shape_pow2 = dims.iter().map(|&d| d.next_power_of_two() as u32).collect();
        spec.shape_exact = kfuse::codegen::target::exact_shapes(&k, &dims);
        let tiles = exact_shape_tiles(&k, &spec, &dims, &Target::sm90a());
        assert_eq!(tiles.get("BM").copied(), want, "C{c} {hw}x{hw}: {tiles:?}");
        assert!(exact_shape_tiles(&k, &spec, &dims, &Target::sm80()).is_empty());
    }
}

/// An implicit GEMM whose reduction is at most four steps takes 256-row tiles where they
/// walk the programs in no more waves (`choose_tiles::short_reduction_rows`): the 1 × 1
/// stride-2 layer C256 → K512 at 56 × 56 (4 steps of 64 channels), not the 3 × 3 stride-2
/// layer (9 steps) nor a 1 × 1 layer too small to fill the waves twice over. Two
/// producer warpgroups still fill the 256 × 128 tiles' rings (no WGMMA instruction
/// wider than 128), without spills.
#[test]
fn short_reductions_take_256_rows() {
    use kfuse::codegen::passes::choose_tiles::exact_shape_tiles;
    use kfuse::codegen::Target;
    let k = (kernels::conv2d::DEF.build)(&[DType::BF16]).unwrap();
    // N, H, W, G, CG, KG, R, S, NPQ
    for (dims, want) in [([64u64, 56, 56, 1, 256, 512, 1, 1, 64 * 28 * 28], Some(256)), ([64, 56, 56, 1, 128, 128, 3, 3, 64 * 28 * 28], None), ([1, 7, 7, 1, 64, 64, 1, 1, 16], None)] {
        let mut spec = common::snapshot_spec(&kernels::conv2d::DEF);
        spec.shape_pow2 = dims.iter().map(|&d| d.next_power_of_two() as u32).collect();
        spec.shape_exact = kfuse::codegen::target::exact_shapes(&k, &dims);
        let tiles = exact_shape_tiles(&k, &spec, &dims, &Target::sm90a());
        assert_eq!(tiles.get("BM").copied(), want, "{dims:?}: {tiles:?}");
        if want.is_some() {
            spec.shape_tiles = tiles.clone();
            let (e, regs, spill) = common::compile_assembled(&k, &spec, &Target::sm90a(), "conv2d 1x1 s2").unwrap_or_else(|e| panic!("{}", e.0));
            let plan = e.plan.to_string();
            assert_eq!(spill, 0, "{spill} bytes of spills ({regs} registers)");
            assert!(plan.contains("tiles: BM=256 BN=128") && plan.contains("rings filled by two producer warpgroups"), "{plan}");
        }
    }
}

/// The depthwise kernel's gathered input (`choose_tiles`' `gathered_register_tiles`,
/// `assign_layouts`' `line_rows`): 16 × 128 tiles over 128 threads, one pixel a thread,
/// eight lanes along each 128-byte line of it and the rest of its 16 channels in the
/// thread's registers (bf16: two 16-byte vectors 64 channels apart; f32: four, 32
/// apart); with 64 channels the tile keeps them all and each thread its 16 adjacent
/// channels. Both compile without spills.
#[test]
fn depthwise_rows_read_whole_lines() {
    use kfuse::codegen::Target;
    let def = &kernels::conv2d_depthwise::DEF;
    // N, H, W, C, R, S, NPQ (power-of-two buckets)
    for (dt, c, tiles, lanes) in [(DType::BF16, 256u32, "BC=128 BM=16", "(kf_lane / 1) % 8) * 8"), (DType::F32, 256, "BC=128 BM=16", "(kf_lane / 1) % 8) * 4"), (DType::BF16, 64, "BC=64 BM=16", "(kf_lane / 1) % 4) * 16")] {
        let k = (def.build)(&[dt]).unwrap();
        let mut spec = common::snapshot_spec(def);
        spec.shape_pow2 = vec![64, 64, 64, c, 4, 4, 262144];
        let what = format!("depthwise {dt} C{c}");
        let (e, regs, spill) = common::compile_assembled(&k, &spec, &Target::sm90a(), &what).unwrap_or_else(|e| panic!("{what}: {}", e.0));
        let plan = e.plan.to_string();
        assert_eq!(spill, 0, "{what}: {spill} bytes of spills ({regs} registers)");
        assert!(plan.contains(&format!("tiles: {tiles}")), "{what}: not {tiles}:\n{plan}");
        assert!(e.source.contains(lanes), "{what}: the gathered load's columns are not `{lanes}`:\n{}", e.source);
    }
}

/// A wide pointwise layer on sm_90a (`conv2d_pointwise`, 128 × 256 tiles): the bias row
/// is loaded in the slice of the accumulator's layout (no conversion through shared
/// memory, which beside a three-stage ring and the TMA stores' area used to pass a
/// block's shared memory), so the general lowering keeps three ring stages and stores
/// by TMA.
#[test]
fn a_wide_pointwise_layer_meets_its_bias_in_the_accumulator_layout() {
    use kfuse::codegen::Target;
    let def = &kernels::conv2d_pointwise::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let spec = common::gemm::spec_mnk(def, 4096, 4096, 4096);
    let (e, regs, spill) = common::compile_assembled(&k, &spec, &Target::sm90a(), "conv2d_pointwise 4096").unwrap_or_else(|e| panic!("{}", e.0));
    let plan = e.plan.to_string();
    assert_eq!(spill, 0, "{spill} bytes of spills ({regs} registers)");
    assert!(plan.contains("a matrix loop on the tensor cores") && !plan.contains("refused"), "{plan}");
    assert!(plan.contains("tiles: BK=64 BM=128 BN=256") && plan.contains("3-stage ring") && plan.contains("by TMA bulk stores"), "{plan}");
}

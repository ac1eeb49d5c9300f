//! `launch` on CPU tensors: argument checking and the interpreter path. No GPU needed.

mod common;

use common::*;
use kfuse_runtime::{check_args, emit_for, launch, spec_for, Arg, Backend, DType, Device, Error, Scalar, Tensor};

fn cpu() -> Device {
    Device::cpu()
}

fn t(v: &[f32], dt: DType) -> Tensor {
    Tensor::from_f32(v, &[v.len()], dt, &cpu()).unwrap()
}

#[test]
fn best_device_here_is_the_cpu_without_panicking() {
    let d = Device::best();
    if kfuse_runtime::gpu_count() == 0 {
        assert!(d.is_cpu());
    }
}

#[test]
fn add_runs_in_the_interpreter_for_each_dtype() {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for n in [1usize, 16, 37, 100] {
            let av = values(n, 1);
            let bv = values(n, 2);
            let (a, b) = (t(&av, dt), t(&bv, dt));
            let mut out = Tensor::full(&[n], f64::NAN, dt, &cpu()).unwrap();
            let r = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
            assert_eq!(r.backend, Backend::Interpreter);
            assert_eq!(r.kernel, "add");
            assert!(!r.skipped_empty);
            let got = out.to_vec_f64().unwrap();
            let (ar, br) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
            for i in 0..n {
                let want = dt.round((ar[i] as f32 + br[i] as f32) as f64);
                assert_eq!(got[i], want, "{dt} n={n} i={i}");
            }
        }
    }
}

#[test]
fn views_with_offsets_and_strides_are_honored() {
    // Inputs are narrowed views (offset ≠ 0); the output is a narrowed view of a larger
    // buffer whose other elements must stay untouched.
    let big_a = t(&values(20, 3), DType::F32);
    let big_b = t(&values(20, 4), DType::F32);
    let a = big_a.narrow(0, 3, 10).unwrap();
    let b = big_b.narrow(0, 7, 10).unwrap();
    let mut buf = Tensor::full(&[16], -7.0, DType::F32, &cpu()).unwrap();
    let mut out = buf.narrow(0, 2, 10).unwrap();
    launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
    let (av, bv) = (a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
    let all = buf.to_vec_f32().unwrap();
    for i in 0..16 {
        if (2..12).contains(&i) {
            assert_eq!(all[i], av[i - 2] + bv[i - 2]);
        } else {
            assert_eq!(all[i], -7.0, "element {i} outside the view was written");
        }
    }
    buf.fill(0.0).unwrap();

    // A transposed (strided) input through a 2-D copy.
    let m = Tensor::from_f32(&values(6 * 19, 5), &[6, 19], DType::BF16, &cpu()).unwrap();
    let mt = m.t();
    let mut o = Tensor::full(&[19, 6], f64::NAN, DType::BF16, &cpu()).unwrap();
    launch(&COPY2D, &mut [Arg::In(&mt), Arg::Out(&mut o)]).unwrap();
    assert_eq!(o.to_vec_f64().unwrap(), mt.to_vec_f64().unwrap());
}

#[test]
fn scalars_and_concrete_dtypes() {
    let x = t(&[1.0, -2.0, 0.5], DType::BF16);
    let mut out = Tensor::empty(&[3], DType::F32, &cpu()).unwrap();
    launch(&SCALE, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(Scalar::F32(3.0))]).unwrap();
    assert_eq!(out.to_vec_f32().unwrap(), vec![3.0, -6.0, 1.5]);

    // i64 given for an f32 scalar.
    let e = launch(&SCALE, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(Scalar::I64(3))]).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)), "{e}");
    assert!(e.to_string().contains("alpha"), "{e}");

    // The output is declared f32: a bf16 output is rejected.
    let mut out16 = Tensor::empty(&[3], DType::BF16, &cpu()).unwrap();
    let e = launch(&SCALE, &mut [Arg::In(&x), Arg::Out(&mut out16), Arg::Scalar(3.0f32.into())]).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)), "{e}");
    assert!(e.to_string().contains("`out` is bf16 but `scale` declares it f32"), "{e}");
}

#[test]
fn dtype_mismatch_names_both_parameters() {
    let a = t(&[1.0, 2.0], DType::BF16);
    let b = t(&[1.0, 2.0], DType::F32);
    let mut out = Tensor::empty(&[2], DType::BF16, &cpu()).unwrap();
    let e = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch(_)), "{e}");
    assert!(e.to_string().contains("`b` is f32 but `a` makes T = bf16"), "{e}");
    // check_args alone gives the same answer, and the bound dtypes when it passes.
    assert!(check_args(&ADD, &[Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).is_err());
    let b16 = t(&[1.0, 2.0], DType::BF16);
    assert_eq!(check_args(&ADD, &[Arg::In(&a), Arg::In(&b16), Arg::Out(&mut out)]).unwrap(), vec![DType::BF16]);
}

#[test]
fn shape_mismatch_names_params_dims_and_sizes() {
    let a = t(&[1.0; 4], DType::F32);
    let b = t(&[1.0; 5], DType::F32);
    let mut out = Tensor::empty(&[4], DType::F32, &cpu()).unwrap();
    let e = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)), "{e}");
    let s = e.to_string();
    assert!(s.contains("`b` dimension 0 (N) is 5") && s.contains("`a` dimension 0 (N) is 4"), "{s}");

    // Wrong rank.
    let m = Tensor::zeros(&[2, 2], DType::F32, &cpu()).unwrap();
    let e = launch(&ADD, &mut [Arg::In(&m), Arg::In(&a), Arg::Out(&mut out)]).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch(_)), "{e}");
    assert!(e.to_string().contains("`a` of `add` has 1 dimension(s) (N)"), "{e}");
}

#[test]
fn wrong_argument_kinds_and_counts() {
    let a = t(&[1.0; 4], DType::F32);
    let b = t(&[1.0; 4], DType::F32);
    let mut out = Tensor::empty(&[4], DType::F32, &cpu()).unwrap();
    // Output passed as an input.
    let e = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::In(&out)]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("`out`") && e.to_string().contains("Arg::Out"), "{e}");
    // Scalar where a tensor goes.
    let e = launch(&ADD, &mut [Arg::Scalar(Scalar::F32(1.0)), Arg::In(&b), Arg::Out(&mut out)]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // Too few.
    let e = launch(&ADD, &mut [Arg::In(&a), Arg::Out(&mut out)]).unwrap_err();
    assert!(e.to_string().contains("takes 3 argument(s) (a, b, out), but 2 were given"), "{e}");
}

#[test]
fn outputs_may_not_alias_other_arguments() {
    let a = t(&[1.0; 8], DType::F32);
    let b = t(&[1.0; 8], DType::F32);
    // Same storage as `a` (a clone is a view).
    let mut out = a.clone();
    let e = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap_err();
    assert!(matches!(e, Error::Aliasing(_)), "{e}");
    assert!(e.to_string().contains("`out`") && e.to_string().contains("`a`"), "{e}");
    // A disjoint view of the same buffer still shares storage.
    let big = t(&[0.0; 16], DType::F32);
    let x = big.narrow(0, 0, 8).unwrap();
    let mut y = big.narrow(0, 8, 8).unwrap();
    let e = launch(&ADD, &mut [Arg::In(&x), Arg::In(&b), Arg::Out(&mut y)]).unwrap_err();
    assert!(matches!(e, Error::Aliasing(_)), "{e}");
    // Inputs may share storage with each other.
    let mut o = Tensor::empty(&[8], DType::F32, &cpu()).unwrap();
    launch(&ADD, &mut [Arg::In(&a), Arg::In(&a), Arg::Out(&mut o)]).unwrap();
    assert_eq!(o.to_vec_f32().unwrap(), vec![2.0; 8]);
}

#[test]
fn empty_launches_are_skipped() {
    let a = t(&[], DType::F32);
    let b = t(&[], DType::F32);
    let mut out = Tensor::empty(&[0], DType::F32, &cpu()).unwrap();
    let r = launch(&ADD, &mut [Arg::In(&a), Arg::In(&b), Arg::Out(&mut out)]).unwrap();
    assert!(r.skipped_empty);
    assert_eq!(r.backend, Backend::Interpreter);
    // Empty 2-D grid along one axis.
    let x = Tensor::zeros(&[5, 0], DType::F16, &cpu()).unwrap();
    let mut o = Tensor::zeros(&[5, 0], DType::F16, &cpu()).unwrap();
    assert!(launch(&COPY2D, &mut [Arg::In(&x), Arg::Out(&mut o)]).unwrap().skipped_empty);
    // Checks still run before skipping.
    let c = t(&[1.0], DType::F32);
    assert!(launch(&ADD, &mut [Arg::In(&a), Arg::In(&c), Arg::Out(&mut out)]).is_err());
}

#[test]
fn spec_reflects_the_actual_arguments() {
    let m = Tensor::zeros(&[6, 37], DType::F32, &cpu()).unwrap();
    let mt = m.t();
    let mut o = Tensor::zeros(&[37, 6], DType::F32, &cpu()).unwrap();
    let k = (COPY2D.build)(&[DType::F32]).unwrap();
    let spec = spec_for(&k, &[Arg::In(&mt), Arg::Out(&mut o)]).unwrap();
    assert_eq!(spec.shape_pow2, vec![64, 8]);
    let x = spec.tensors[0].as_ref().unwrap();
    assert_eq!(x.stride_div, vec![0, 1], "strides [1, 37]");
    let y = spec.tensors[1].as_ref().unwrap();
    assert_eq!(y.stride_div, vec![2, 0], "strides [6, 1]");
    // An offset of one f32 element leaves at most 4-byte alignment.
    let v = Tensor::zeros(&[9], DType::F32, &cpu()).unwrap().narrow(0, 1, 8).unwrap();
    let mut w = Tensor::zeros(&[8], DType::F32, &cpu()).unwrap();
    let k = (SCALE.build)(&[DType::F32]).unwrap();
    let spec = spec_for(&k, &[Arg::In(&v), Arg::Out(&mut w), Arg::Scalar(Scalar::F32(1.0))]).unwrap();
    assert!(spec.tensors[0].as_ref().unwrap().ptr_align <= 4);
    assert!(spec.tensors[2].is_none());
}

#[test]
fn emit_for_checks_the_dtype_count() {
    let e = emit_for(&ADD, &[], &Default::default(), &kfuse_codegen::Target::sm90a()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// `emit` on described arguments compiles what a launch on such tensors would: the spec
/// a launch builds from real tensors (`launch_spec`), given to `emit_for`, gives the same
/// IR and CUDA — contiguous, transposed and offset views alike.
#[test]
fn emit_on_descriptions_matches_a_launch_on_tensors() {
    use kfuse_codegen::Target;
    use kfuse_runtime::{emit, launch_spec, ArgDesc};
    let m = Tensor::zeros(&[64, 96], DType::BF16, &cpu()).unwrap();
    // CPU storage is 16-byte aligned as a GPU allocation is (the facts cap at 16 bytes)
    assert_eq!(m.address() % 16, 0, "the allocator gave an unaligned buffer");
    let views = [
        (m.clone(), ArgDesc::tensor(DType::BF16, &[64, 96])),
        (m.t(), ArgDesc::strided(DType::BF16, &[96, 64], &[1, 96])),
        (m.narrow(1, 1, 95).unwrap(), ArgDesc::strided(DType::BF16, &[64, 95], &[96, 1]).at_byte_offset(2)),
    ];
    for target in [Target::sm80(), Target::sm90a()] {
        let mut sources = Vec::new();
        for (x, desc) in &views {
            let mut o = Tensor::zeros(x.shape(), DType::BF16, &cpu()).unwrap();
            let spec = launch_spec(&COPY2D, &[Arg::In(x), Arg::Out(&mut o)], &target).unwrap();
            let want = emit_for(&COPY2D, &[DType::BF16], &spec, &target).unwrap();
            let got = emit(&COPY2D, &[desc.clone(), ArgDesc::tensor(DType::BF16, x.shape())], &target).unwrap();
            assert_eq!((&got.ir, &got.source, &got.tiles), (&want.ir, &want.source, &want.tiles), "{desc:?} on {}", target.arch());
            // deterministic
            let again = emit(&COPY2D, &[desc.clone(), ArgDesc::tensor(DType::BF16, x.shape())], &target).unwrap();
            assert_eq!(again.source, got.source);
            sources.push(got.source);
        }
        // the layout and alignment of each view show in what is compiled
        assert!(sources[0] != sources[1] && sources[0] != sources[2] && sources[1] != sources[2]);
    }
}

#[test]
fn emit_checks_its_descriptions() {
    use kfuse_codegen::Target;
    use kfuse_runtime::{emit, ArgDesc};
    let sm90 = Target::sm90a();
    let v = |dt, n| ArgDesc::tensor(dt, &[n]);
    // generics bound from the tensors; concrete dtypes and scalars checked
    let e = emit(&ADD, &[v(DType::F16, 8), v(DType::BF16, 8), v(DType::F16, 8)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch(m) if m.contains("`b` is bf16") && m.contains("T = f16")), "{e}");
    let e = emit(&SCALE, &[v(DType::F16, 8), v(DType::F16, 8), ArgDesc::Scalar(DType::F32)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch(m) if m.contains("`out`")), "{e}");
    let e = emit(&SCALE, &[v(DType::F16, 8), v(DType::F32, 8), ArgDesc::Scalar(DType::I64)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::DTypeMismatch(m) if m.contains("`alpha`")), "{e}");
    assert!(emit(&SCALE, &[v(DType::F16, 8), v(DType::F32, 8), ArgDesc::Scalar(DType::F32)], &sm90).is_ok());
    // shape symbols agree
    let e = emit(&ADD, &[v(DType::F32, 8), v(DType::F32, 9), v(DType::F32, 8)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch(m) if m.contains("(N) is 9")), "{e}");
    // count, kinds, ranks, strides
    let e = emit(&ADD, &[v(DType::F32, 8), v(DType::F32, 8)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("takes 3 argument(s)")), "{e}");
    let e = emit(&SCALE, &[v(DType::F32, 8), v(DType::F32, 8), v(DType::F32, 1)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("ArgDesc::Scalar(DType::F32)")), "{e}");
    let e = emit(&ADD, &[v(DType::F32, 8), ArgDesc::tensor(DType::F32, &[2, 4]), v(DType::F32, 8)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::ShapeMismatch(_)), "{e}");
    let e = emit(&ADD, &[v(DType::F32, 8), ArgDesc::strided(DType::F32, &[8], &[1, 1]), v(DType::F32, 8)], &sm90).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("2 strides")), "{e}");
    // an output may not have a zero stride
    let e = emit(&ADD, &[v(DType::F32, 8), v(DType::F32, 8), ArgDesc::strided(DType::F32, &[8], &[0])], &sm90).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("stride 0")), "{e}");
    // a target below sm_80
    let old = Target { sm: 70, num_sms: 80, smem_per_block: 96 * 1024 };
    assert!(matches!(emit(&ADD, &[v(DType::F32, 8), v(DType::F32, 8), v(DType::F32, 8)], &old), Err(Error::Codegen(_))));
}

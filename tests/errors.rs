//! Bad input gets a clear `Err`, never a panic or a wrong answer. These run on the
//! best device there is (the CPU interpreter in CI, the GPU on the GPU host).

mod common;

use kfuse::{DType, Device, Error, Tensor};

fn dev() -> Device {
    Device::best()
}

fn t(shape: &[usize], dt: DType) -> Tensor {
    common::random_tensor(shape, dt, 3, 0.0, &dev()).0
}

#[test]
fn mismatched_shapes() {
    let err = kfuse::ops::add(&t(&[2, 3], DType::F32), &t(&[3, 2], DType::F32)).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch(_)), "{err}");
    assert!(err.to_string().contains("[2, 3]") && err.to_string().contains("[3, 2]"), "{err}");
}

#[test]
fn mismatched_dtypes() {
    let err = kfuse::ops::mul(&t(&[5], DType::F32), &t(&[5], DType::BF16)).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch(_)), "{err}");
    assert!(err.to_string().contains("f32") && err.to_string().contains("bf16"), "{err}");
}

#[test]
fn mismatched_dtypes_at_the_kernel_level() {
    let (a, b) = (t(&[5], DType::F32), t(&[5], DType::F16));
    let mut out = t(&[5], DType::F32);
    let err = kfuse::ops::kernels::add(&a, &b, &mut out).unwrap_err();
    assert!(matches!(err, Error::DTypeMismatch(_)), "{err}");
}

#[test]
fn mismatched_extents_at_the_kernel_level() {
    let (x, mut out) = (t(&[4, 5], DType::F32), t(&[4, 5], DType::F32));
    // transpose's output must be (N, M)
    let err = kfuse::ops::kernels::transpose(&x, &mut out).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch(_)), "{err}");
}

#[test]
fn empty_tensors_are_a_no_op() {
    for shape in [vec![0], vec![0, 7], vec![7, 0]] {
        let a = t(&shape, DType::BF16);
        let s = kfuse::ops::add(&a, &a).unwrap();
        assert_eq!(s.shape(), &shape[..]);
        assert_eq!(s.numel(), 0);
        assert_eq!(kfuse::ops::silu(&a).unwrap().numel(), 0);
        assert_eq!(kfuse::ops::copy(&a).unwrap().numel(), 0);
    }
    let e = kfuse::ops::transpose(&t(&[0, 7], DType::F32)).unwrap();
    assert_eq!(e.shape(), &[7, 0]);
}

#[test]
fn strided_inputs_are_read_by_elementwise_ops() {
    let a = t(&[4, 6], DType::F32).t();
    let b = t(&[6, 4], DType::F32);
    // a transposed `a` plus a contiguous `b`: read as they lie, into a contiguous result
    let s = kfuse::ops::add(&a, &b).unwrap();
    assert_eq!(s.shape(), &[6, 4]);
    assert!(s.is_contiguous());
    let (av, bv, sv) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap(), s.to_vec_f64().unwrap());
    for i in 0..24 {
        assert_eq!(sv[i], (av[i] + bv[i]) as f32 as f64);
    }
    // ... the same as on a contiguous copy
    let c = kfuse::ops::contiguous(&a).unwrap();
    assert!(c.is_contiguous());
    assert_eq!(kfuse::ops::add(&c, &b).unwrap().to_vec_f64().unwrap(), sv);
    // shapes still have to match: the transposed view is [6, 4], not [4, 6]
    let err = kfuse::ops::add(&a, &t(&[4, 6], DType::F32)).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch(_)), "{err}");
}

#[test]
fn strided_inputs_are_read_by_copy_and_transpose() {
    let x = t(&[9, 13], DType::BF16);
    let view = x.t(); // 13 x 9, strided
    let y = kfuse::ops::transpose(&view).unwrap();
    assert_eq!(y.shape(), &[9, 13]);
    assert_eq!(y.to_vec_f64().unwrap(), x.to_vec_f64().unwrap());
    // a [1, 8] view with strides [1, 2]: row 0 of the transpose of an 8 x 2 matrix
    let m = t(&[8, 2], DType::F32);
    let row = m.t().narrow(0, 0, 1).unwrap();
    assert!(!row.is_contiguous());
    let c = kfuse::ops::copy(&row).unwrap();
    let mv = m.to_vec_f64().unwrap();
    assert_eq!(c.to_vec_f64().unwrap(), (0..8).map(|i| mv[i * 2]).collect::<Vec<_>>());
}

#[test]
fn transpose_needs_a_matrix() {
    let err = kfuse::ops::transpose(&t(&[2, 3, 4], DType::F32)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[test]
fn an_output_may_not_alias_an_input() {
    let a = t(&[16], DType::F32);
    let mut same = a.clone();
    let err = kfuse::ops::kernels::add(&a, &a, &mut same).unwrap_err();
    assert!(matches!(err, Error::Aliasing(_)), "{err}");
}

#[test]
fn nvrtc_missing_says_where_it_looked_and_how_to_install() {
    let nowhere = std::path::PathBuf::from("/nonexistent/kfuse-test");
    let searched = kfuse::runtime::nvrtc::find_nvrtc_in(&[nowhere]).unwrap_err();
    let msg = Error::NvrtcMissing { searched }.to_string();
    assert!(msg.contains("/nonexistent/kfuse-test"), "{msg}");
    assert!(msg.contains("pip install") && msg.contains("nvidia-cuda-nvrtc"), "{msg}");
}

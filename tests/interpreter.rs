//! Every op on the CPU interpreter against a float64 reference (runs in CI, no GPU).

mod common;

use kfuse::{Backend, Device};

#[test]
fn every_op_on_the_interpreter() {
    let dev = Device::cpu();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (i, case) in common::ops().iter().enumerate() {
        if !case.numeric() {
            continue; // numerics in tests/rows.rs
        }
        for dt in common::DTYPES {
            for (j, shape) in common::shapes(case, false).iter().enumerate() {
                match common::check_op(case, dt, shape, &dev, (i * 100 + j) as u64) {
                    Ok(_) => checked += 1,
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 100);
}

#[test]
fn the_launch_says_which_backend_ran() {
    let dev = Device::cpu();
    let (a, _) = common::random_tensor(&[33], kfuse::DType::F32, 1, 0.0, &dev);
    let (b, _) = common::random_tensor(&[33], kfuse::DType::F32, 2, 0.0, &dev);
    let mut out = common::poisoned(&[33], kfuse::DType::F32, &dev);
    let l = kfuse::ops::kernels::add(&a, &b, &mut out).unwrap();
    assert_eq!(l.backend, Backend::Interpreter);
}

#[test]
fn a_million_elements() {
    let ops = common::ops();
    let add = ops.iter().find(|c| c.name == "add").unwrap();
    common::check_op(add, kfuse::DType::BF16, &[1000003], &Device::cpu(), 7).unwrap();
}

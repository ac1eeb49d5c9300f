//! Writes a kernel, runs it on the best device there is (the GPU, else the CPU
//! interpreter), says which ran, and checks the result against plain Rust.

use kfuse::prelude::*;

/// `out = a * x + y`, computed in f32.
#[kfuse]
pub fn axpy<T: Float>(x: Tensor<T, (N,)>, y: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, a: f32) {
    let i = program_id(0);
    let v = x.block([i * BN], [BN]).load().to_f32() * a + y.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store(v.cast::<T>());
}

fn main() -> kfuse::Result<()> {
    let dev = Device::best();
    let n = 1_000_003;
    let xs: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
    let ys: Vec<f32> = (0..n).map(|i| ((i * 104729) % 1000) as f32 / 500.0 - 1.0).collect();
    let x = Tensor::from_f32(&xs, &[n], DType::BF16, &dev)?;
    let y = Tensor::from_f32(&ys, &[n], DType::BF16, &dev)?;
    let mut out = Tensor::empty(&[n], DType::BF16, &dev)?;
    let launched = axpy(&x, &y, &mut out, 0.5)?;
    println!("ran `axpy` over {n} bf16 elements on: {}", launched.backend);

    let got = out.to_vec_f32()?;
    let (xr, yr) = (x.to_vec_f32()?, y.to_vec_f32()?);
    let worst = (0..n).map(|i| (got[i] - (0.5 * xr[i] + yr[i])).abs()).fold(0.0f32, f32::max);
    println!("max |out - reference| = {worst:.3e}");
    assert!(worst < 2e-2, "wrong result");

    let t = kfuse::ops::transpose(&Tensor::from_f32(&xs[..6], &[2, 3], DType::F32, &dev)?)?;
    println!("kfuse::ops::transpose of a 2x3 matrix: shape {:?}, values {:?}", t.shape(), t.to_vec_f32()?);
    println!("ok");
    Ok(())
}

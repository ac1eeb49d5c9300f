use kfuse::prelude::*;
use kfuse::runtime::{emit, ArgDesc};

/// `out = a * x + y`, computed in f32.
#[kfuse]
pub fn axpy<T: Float>(x: Tensor<T, (N,)>, y: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>, a: f32) {
    let i = program_id(0); // program i: elements i * BN .. (i + 1) * BN
    let v = x.block([i * BN], [BN]).load().to_f32() * a + y.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store(v.cast::<T>()); // lanes past N are masked: any N works
}

fn main() -> kfuse::Result<()> {
    let dev = Device::best(); // GPU 0, else the CPU interpreter
    let n = 100_000;
    let xs: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let x = Tensor::from_f32(&xs, &[n], DType::BF16, &dev)?;
    let y = Tensor::full(&[n], 1.0, DType::BF16, &dev)?;
    let mut out = Tensor::empty(&[n], DType::BF16, &dev)?;

    // the launcher #[kfuse] generated: tensors by reference, outputs `&mut`, scalars by value
    let ran = axpy(&x, &y, &mut out, 0.5)?;
    println!("`{}` ran on {}", ran.kernel, ran.backend);
    assert_eq!(out.to_vec_f32()?[5], 0.5 * 5.0 + 1.0);

    // `axpy::DEF`, the kernel's definition: what a launch on such tensors compiles
    let target = dev.target().unwrap_or(kfuse::codegen::Target::sm90a());
    let v = ArgDesc::tensor(DType::BF16, &[n]);
    let k = emit(&axpy::DEF, &[v.clone(), v.clone(), v, ArgDesc::Scalar(DType::F32)], &target)?;
    let programs = n.div_ceil(k.tiles["BN"] as usize); // the grid: ceil(N / BN) programs
    assert_eq!(k.grid_dims(&[n as u64]), [programs as u64, 1, 1]); // x, y, z; [N] the shapes
    println!("{programs} programs of {} threads for {}", k.block_threads, target.arch());

    // GPU time (CUDA events; wall clock on the CPU): 2 warm-up calls, then 10 timed ones
    let mut ms = dev.time_ms(2, 10, || axpy(&x, &y, &mut out, 0.5).map(drop))?;
    ms.sort_by(f32::total_cmp);
    println!("median {:.3} ms a call", ms[ms.len() / 2]);

    // the standard kernels, written the same way, take strided views as they lie
    let m = Tensor::from_f32(&xs[..6], &[2, 3], DType::F32, &dev)?; // [[0, 1, 2], [3, 4, 5]]
    let s = kfuse::ops::add(&m.t(), &kfuse::ops::transpose(&m)?)?; // [3, 2]
    assert_eq!(s.to_vec_f32()?, [0., 6., 2., 8., 4., 10.]);
    Ok(())
}

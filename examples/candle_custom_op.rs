//! A `#[kfuse]` kernel as a candle custom op inside a small candle model: a gated MLP
//! `y = (silu(x·Wg) ⊙ (x·Wu))·Wd` whose gate, `silu(g) ⊙ u`, is a kfuse kernel run by
//! [`kfuse::candle::KernelOp`], checked against the same model in candle's own ops.
//!
//! ```text
//! cargo run --example candle_custom_op --features candle        # candle's CPU
//! cargo run --example candle_custom_op --features candle-cuda   # GPU 0 when there is one
//! ```
//!
//! On candle's CPU the kernel runs in kfuse's interpreter, its inputs and output copied
//! between the two libraries' storages. On a candle CUDA device (feature `candle-cuda`)
//! it runs on the GPU on candle's own stream: the inputs are views of candle's memory and
//! the output, allocated by kfuse, becomes candle's; nothing is copied.

use candle_core as cc;
use kfuse::candle::KernelOp;
use kfuse::prelude::*;

/// `out = silu(g) * u`, computed in f32.
#[kfuse]
pub fn silu_gate<T: Float>(g: Tensor<T, (N,)>, u: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>) {
    let i = program_id(0);
    let gv = g.block([i * BN], [BN]).load().to_f32();
    let uv = u.block([i * BN], [BN]).load().to_f32();
    out.block([i * BN], [BN]).store((gv * sigmoid(gv) * uv).cast::<T>());
}

/// The custom op's body: the gate of two tensors of one shape, as one flat launch.
fn gate(xs: &[Tensor]) -> kfuse::Result<Tensor> {
    let (g, u) = (xs[0].contiguous()?, xs[1].contiguous()?);
    let n = g.numel();
    let out = Tensor::empty(g.shape(), g.dtype(), &g.device())?;
    {
        let mut flat = out.reshape(&[n])?; // a view: the kernel writes `out`'s memory
        silu_gate(&g.reshape(&[n])?, &u.reshape(&[n])?, &mut flat)?;
    }
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // a candle CUDA device with `candle-cuda` and a GPU, else candle's CPU
    let dev = cc::Device::cuda_if_available(0)?;
    let (batch, hidden, inner) = (37, 96, 160);
    let x = cc::Tensor::randn(0f32, 1.0, (batch, hidden), &dev)?;
    let wg = (cc::Tensor::randn(0f32, 1.0, (hidden, inner), &dev)? * 0.1)?;
    let wu = (cc::Tensor::randn(0f32, 1.0, (hidden, inner), &dev)? * 0.1)?;
    let wd = (cc::Tensor::randn(0f32, 1.0, (inner, hidden), &dev)? * 0.1)?;

    let op = KernelOp::new("silu_gate", gate);
    let (g, u) = (x.matmul(&wg)?, x.matmul(&wu)?);
    let y = g.apply_op2_no_bwd(&u, &op)?.matmul(&wd)?;
    let want = (g.silu()? * u)?.matmul(&wd)?;

    let worst = (y - &want)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    let scale = want.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    println!("gated MLP [{batch}, {hidden}] -> [{batch}, {hidden}] on candle's {dev:?}, gate by kfuse on {}", kfuse::candle::device(&dev)?);
    println!("max |kfuse gate - candle gate| after the down projection: {worst:.3e} (outputs up to {scale:.3})");
    assert!(worst <= 1e-5 * scale.max(1.0), "the kfuse gate differs from candle's");
    println!("ok");
    Ok(())
}

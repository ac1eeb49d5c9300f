//! The text printer.

use kfuse_ir::print::print;
use kfuse_ir::*;

use crate::common::*;

#[test]
fn add_kernel() {
    let want = "\
kernel add(a: bf16[N], b: bf16[N], out: &mut bf16[N])
  %0 = program_id 0 : i64
  %1 = tile_extent BN : i64
  %2 = mul %0, %1 : i64
  %3 = load a[%2 +BN] : bf16[BN]
  %4 = load b[%2 +BN] : bf16[BN]
  %5 = add %3, %4 : bf16[BN]
  store out[%2 +BN], %5
";
    assert_eq!(print(&add_1d(DType::BF16)), want);
}

#[test]
fn row_kernel_with_names_scalars_and_literals() {
    let mut b = Builder::new("scale_rows");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let (_, eps) = b.scalar_param("eps", DType::F32);
    let po = b.tensor_param("out", DType::F16, &[m, n], true);
    let i = b.program_id(0).unwrap();
    b.name(i, "row");
    let zero = b.literal(Literal::Int(0));
    let row = [AccessDim::Index, AccessDim::Tile(Extent::Full(n))];
    let x = b.load(px, &[i, zero], &row).unwrap();
    b.name(x, "xr");
    let ms = b.reduce(ReduceOp::Mean, x, -1, false).unwrap();
    let r = b.binary(BinaryOp::Add, ms, eps).unwrap();
    let r = b.unary(UnaryOp::Rsqrt, r).unwrap();
    let half = b.literal(Literal::Float(0.5));
    let r = b.binary(BinaryOp::Mul, r, half).unwrap();
    let y = b.binary(BinaryOp::Mul, x, r).unwrap();
    let y = b.cast(y, DType::F16).unwrap();
    b.store(po, &[i, zero], &row, y).unwrap();
    let k = b.finish().unwrap();
    let want = "\
kernel scale_rows(x: f32[M, N], eps: f32, out: &mut f16[M, N])
  %0 = param eps : f32  // eps
  %1 = program_id 0 : i64  // row
  %2 = const 0 : i64
  %3 = load x[%1, %2 +N!] : f32[N!]  // xr
  %4 = reduce_mean %3, axis=0 : f32
  %5 = add %4, %0 : f32
  %6 = rsqrt %5 : f32
  %7 = const 0.5 : f32
  %8 = mul %6, %7 : f32
  %9 = broadcast %8 : f32[N!]
  %10 = mul %3, %9 : f32[N!]
  %11 = cast %10 to f16 : f16[N!]
  store out[%1, %2 +N!], %11
";
    assert_eq!(print(&k), want);
}

#[test]
fn schedule_section() {
    let mut k = add_1d(DType::F32);
    k.schedule.num_threads = 32;
    k.schedule.smem_bytes = 0;
    set_tile(&mut k, "BN", 128);
    let load = k.ops().find(|o| matches!(k.op(*o), Op::Load { .. })).unwrap();
    let b = Blocked {
        shape: vec![128],
        size_per_thread: vec![4],
        threads_per_warp: vec![32],
        warps_per_block: vec![1],
        order: vec![0],
        block_split: vec![1],
        steps: vec![],
    };
    k.schedule.layouts.insert(load.value(), Layout::Blocked(b.clone()));
    k.schedule.layouts.insert(ValueId(petgraph::graph::NodeIndex::new(5)), Layout::Slice { parent: b, axis: 0 });
    k.schedule.vector.insert(load, 4);
    let text = print(&k);
    let tail = "\
schedule: threads=32 min_blocks=0 smem=0B
  tile BN = 128
  %3 blocked(shape=[128] spt=[4] tpw=[32] wpb=[1] order=[0])
  %3 load vector=4
  %5 slice(axis=0 of shape=[128] spt=[4] tpw=[32] wpb=[1] order=[0])
";
    assert!(text.ends_with(tail), "{text}");
    assert!(text.starts_with("kernel add(a: f32[N], b: f32[N], out: &mut f32[N])\n"), "{text}");
}

#[test]
fn iota_expand_dims_sin_cos() {
    let mut b = Builder::new("angles");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = b.program_id(0).unwrap();
    let j = b.iota(Extent::Full(n)).unwrap();
    let jf = b.cast(j, DType::F32).unwrap();
    let s = b.unary(UnaryOp::Sin, jf).unwrap();
    let c = b.unary(UnaryOp::Cos, jf).unwrap();
    let r = b.binary(BinaryOp::Add, s, c).unwrap();
    let r = b.expand_dims(r, 0).unwrap();
    let zero = b.literal(Literal::Int(0));
    b.store(po, &[i, zero], &[AccessDim::Index, AccessDim::Tile(Extent::Full(n))], r).unwrap_err();
    b.store(po, &[i, zero], &[AccessDim::Tile(Extent::Const(1)), AccessDim::Tile(Extent::Full(n))], r).unwrap();
    let k = b.finish().unwrap();
    let want = "\
kernel angles(out: &mut f32[M, N])
  %0 = program_id 0 : i64
  %1 = iota N! : i64[N!]
  %2 = cast %1 to f32 : f32[N!]
  %3 = sin %2 : f32[N!]
  %4 = cos %2 : f32[N!]
  %5 = add %3, %4 : f32[N!]
  %6 = expand_dims %5, axis=0 : f32[1, N!]
  %7 = const 0 : i64
  store out[%0 +1, %7 +N!], %6
";
    assert_eq!(print(&k), want);
}

//! Launch-grid derivation.

use kfuse_ir::grid::{derive, Grid, GridAxis};
use kfuse_ir::*;

use crate::common::*;

#[test]
fn one_dimensional() {
    let k = add_1d(DType::F32);
    let g = derive(&k).unwrap();
    assert_eq!(g, Grid { axes: vec![GridAxis { dim: ShapeSym(0), step: Some(Extent::Tile(TileSym(0))) }] });
    assert_eq!(g.eval(|_| 1000, |_| 16), vec![63]);
    assert_eq!(g.eval(|_| 1024, |_| 16), vec![64]);
    assert_eq!(g.eval(|_| 0, |_| 16), vec![0]);
}

#[test]
fn transposed_store() {
    // out[N, M].block([j*BN, i*BM]): axis 0 (i) covers M by BM, axis 1 (j) covers N by BN.
    let k = transpose(DType::F32);
    let g = derive(&k).unwrap();
    let (m, n) = (ShapeSym(0), ShapeSym(1));
    let (bm, bn) = (Extent::Tile(TileSym(0)), Extent::Tile(TileSym(1)));
    assert_eq!(g.axes, vec![GridAxis { dim: m, step: Some(bm) }, GridAxis { dim: n, step: Some(bn) }]);
    let shape = |s: ShapeSym| if s == m { 37 } else { 53 };
    let ext = |e: Extent| if e == bm { 16 } else { 64 };
    assert_eq!(g.eval(shape, ext), vec![3, 1]);
}

#[test]
fn row_kernel() {
    let k = softmax_row(DType::F32);
    let g = derive(&k).unwrap();
    assert_eq!(g.axes, vec![GridAxis { dim: ShapeSym(0), step: None }]);
    assert_eq!(g.eval(|_| 37, |_| 16), vec![37]);
}

#[test]
fn constant_step() {
    // out.block([pid * 4], [4]).
    let mut b = Builder::new("k");
    let n = b.shape_sym("N");
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let pid = b.program_id(0).unwrap();
    let four = b.literal(Literal::Int(4));
    let off = b.binary(BinaryOp::Mul, four, pid).unwrap();
    let one = b.literal(Literal::Float(1.0));
    b.store(po, &[off], &[AccessDim::Tile(Extent::Const(4))], one).unwrap();
    let k = b.finish().unwrap();
    let g = derive(&k).unwrap();
    assert_eq!(g.axes, vec![GridAxis { dim: n, step: Some(Extent::Const(4)) }]);
    assert_eq!(g.eval(|_| 10, |e| if let Extent::Const(c) = e { c as u64 } else { 0 }), vec![3]);
}

#[test]
fn program_id_not_used_in_any_store() {
    // pid offsets the load only; the store is at 0.
    let mut b = Builder::new("k");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let off = block_offset(&mut b, 0, bn);
    let zero = b.literal(Literal::Int(0));
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &d).unwrap();
    b.store(po, &[zero], &d, x).unwrap();
    let k = b.finish().unwrap();
    match derive(&k) {
        Err(IrError::Grid(m)) => assert!(m.contains("program_id(0) does not index any store"), "{m}"),
        other => panic!("expected a grid error, got {other:?}"),
    }
}

#[test]
fn step_must_match_the_access_extent() {
    // out.block([pid * BM], [BN]): BM is not the access's extent, so the axis is unknown.
    let mut b = Builder::new("k");
    let n = b.shape_sym("N");
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let off = block_offset(&mut b, 0, bm);
    let one = b.literal(Literal::Float(1.0));
    b.store(po, &[off], &[AccessDim::Tile(Extent::Tile(bn))], one).unwrap();
    let k = b.finish().unwrap();
    assert!(matches!(derive(&k), Err(IrError::Grid(_))));
}

#[test]
fn no_program_id_no_axes() {
    let mut b = Builder::new("k");
    let n = b.shape_sym("N");
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let zero = b.literal(Literal::Int(0));
    let one = b.literal(Literal::Float(1.0));
    b.store(po, &[zero], &[AccessDim::Index], one).unwrap();
    let k = b.finish().unwrap();
    assert_eq!(derive(&k).unwrap(), Grid::default());
    assert_eq!(Grid::default().eval(|_| 5, |_| 5), Vec::<u64>::new());
}

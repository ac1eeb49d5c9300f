//! The builder's typing rules.

use kfuse_ir::*;

use crate::common::*;

/// A builder with `x: f32[M, N]`, `v: f32[N]`, `h: bf16[N]`, `out: &mut f32[M, N]`, and
/// loads of `x` as `[BM, BN]`, `v` and `h` as `[BN]`.
struct Fx {
    b: Builder,
    x: ParamId,
    out: ParamId,
    off2: [ValueId; 2],
    dims2: [AccessDim; 2],
    xt: ValueId,
    vt: ValueId,
    ht: ValueId,
    bm: TileSym,
    bn: TileSym,
}

fn fx() -> Fx {
    let mut b = Builder::new("k");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let x = b.tensor_param("x", DType::F32, &[m, n], false);
    let v = b.tensor_param("v", DType::F32, &[n], false);
    let h = b.tensor_param("h", DType::BF16, &[n], false);
    let out = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let j = block_offset(&mut b, 1, bn);
    let dims2 = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let xt = b.load(x, &[i, j], &dims2).unwrap();
    let vt = b.load(v, &[j], &[AccessDim::Tile(Extent::Tile(bn))]).unwrap();
    let ht = b.load(h, &[j], &[AccessDim::Tile(Extent::Tile(bn))]).unwrap();
    Fx { b, x, out, off2: [i, j], dims2, xt, vt, ht, bm, bn }
}

#[test]
fn symbols_are_interned() {
    let mut b = Builder::new("k");
    let m = b.shape_sym("M");
    assert_eq!(b.shape_sym("M"), m);
    assert_ne!(b.shape_sym("N"), m);
    assert_eq!(b.find_shape_sym("N"), Some(ShapeSym(1)));
    assert_eq!(b.find_shape_sym("K"), None);
    let t = b.tile_sym("BM");
    assert_eq!(b.tile_sym("BM"), t);
    assert_eq!(b.kernel().tile_syms, vec!["BM".to_string()]);
}

#[test]
fn load_type_comes_from_tile_dims() {
    let f = fx();
    assert_eq!(f.b.ty(f.xt), &Type::tile(DType::F32, vec![Extent::Tile(f.bm), Extent::Tile(f.bn)]));
    assert_eq!(f.b.ty(f.ht), &Type::tile(DType::BF16, vec![Extent::Tile(f.bn)]));
    // A row: the indexed dim disappears.
    let mut f = fx();
    let n = f.b.find_shape_sym("N").unwrap();
    let r = f.b.load(f.x, &f.off2, &[AccessDim::Index, AccessDim::Tile(Extent::Full(n))]).unwrap();
    assert_eq!(f.b.ty(r), &Type::tile(DType::F32, vec![Extent::Full(n)]));
}

#[test]
fn binary_broadcasts_and_inserts_broadcast_ops() {
    let mut f = fx();
    let s = f.b.binary(BinaryOp::Add, f.xt, f.vt).unwrap();
    assert_eq!(f.b.ty(s).shape, vec![Extent::Tile(f.bm), Extent::Tile(f.bn)]);
    let k = f.b.kernel();
    let ops = k.operands(s.op());
    assert_eq!(ops[0], f.xt);
    assert!(matches!(k.op(ops[1].op()), Op::Broadcast), "the [BN] operand is broadcast explicitly");
    assert_eq!(k.operands(ops[1].op()), vec![f.vt]);
    // keep_dim reductions broadcast back.
    let r = f.b.reduce(ReduceOp::Max, f.xt, 1, true).unwrap();
    assert_eq!(f.b.ty(r).shape, vec![Extent::Tile(f.bm), Extent::Const(1)]);
    let d = f.b.binary(BinaryOp::Sub, f.xt, r).unwrap();
    assert_eq!(f.b.ty(d).shape, vec![Extent::Tile(f.bm), Extent::Tile(f.bn)]);
    f.b.finish().unwrap();
}

#[test]
fn comparisons_give_bool_and_select_broadcasts() {
    let mut f = fx();
    let c = f.b.binary(BinaryOp::Lt, f.vt, f.xt).unwrap();
    assert_eq!(f.b.ty(c), &Type::tile(DType::Bool, vec![Extent::Tile(f.bm), Extent::Tile(f.bn)]));
    let zero = f.b.literal(Literal::Float(0.0));
    let s = f.b.select(c, f.vt, zero).unwrap();
    assert_eq!(f.b.ty(s), &Type::tile(DType::F32, vec![Extent::Tile(f.bm), Extent::Tile(f.bn)]));
    let e = f.b.select(f.vt, f.vt, f.vt).unwrap_err();
    assert!(matches!(e, IrError::Expected { ref expected, .. } if expected.contains("bool")), "{e:?}");
}

#[test]
fn dtype_mismatch() {
    let mut f = fx();
    let e = f.b.binary(BinaryOp::Add, f.vt, f.ht).unwrap_err();
    assert_eq!(e, IrError::DTypeMismatch { op: "add".into(), left: "f32".into(), right: "bf16".into() });
    // Store of a bf16 value into an f32 tensor.
    let hb = f.b.broadcast_to(f.ht, &[Extent::Tile(f.bm), Extent::Tile(f.bn)], "test").unwrap();
    let e = f.b.store(f.out, &f.off2, &f.dims2, hb).unwrap_err();
    assert!(matches!(e, IrError::DTypeMismatch { ref op, .. } if op == "store"), "{e:?}");
}

#[test]
fn literals_adapt_to_the_other_operand() {
    let mut f = fx();
    let two = f.b.literal(Literal::Int(2));
    let y = f.b.binary(BinaryOp::Mul, f.ht, two).unwrap();
    assert_eq!(f.b.ty(y).dtype, DType::BF16);
    let k = f.b.kernel();
    let c = k.operands(k.operands(y.op())[1].op())[0];
    assert_eq!(k.op(c.op()), &Op::Const { value: Literal::Float(2.0) });
    assert_eq!(k.ty(c), &Type::scalar(DType::BF16));
    // An i64 index plus an integer literal stays i64.
    let pid = f.b.program_id(0).unwrap();
    let one = f.b.literal(Literal::Int(1));
    let p1 = f.b.binary(BinaryOp::Add, pid, one).unwrap();
    assert_eq!(f.b.ty(p1), &Type::scalar(DType::I64));
    f.b.finish().unwrap();
}

#[test]
fn literals_that_do_not_fit_are_dtype_mismatches() {
    // Regression: these used to build a `const` the verifier rejects at `finish`.
    let mut b = Builder::new("k");
    let p = b.program_id(0).unwrap();
    let half = b.literal(Literal::Float(1.5));
    let e = b.binary(BinaryOp::Add, p, half).unwrap_err();
    assert_eq!(e, IrError::DTypeMismatch { op: "add".into(), left: "i64".into(), right: "f32".into() });
    let (_, x) = b.scalar_param("x", DType::F32);
    let t = b.literal(Literal::Bool(true));
    let e = b.binary(BinaryOp::Mul, x, t).unwrap_err();
    assert_eq!(e, IrError::DTypeMismatch { op: "mul".into(), left: "f32".into(), right: "bool".into() });
    b.finish().unwrap();
}

#[test]
fn shape_mismatch() {
    let mut f = fx();
    let bm_tile = f.b.load(f.x, &f.off2, &[AccessDim::Tile(Extent::Tile(f.bm)), AccessDim::Index]).unwrap();
    let e = f.b.binary(BinaryOp::Add, bm_tile, f.vt).unwrap_err();
    assert_eq!(e, IrError::ShapeMismatch { op: "add".into(), left: "[BM]".into(), right: "[BN]".into() });
    // Store of a [BN] value broadcasts; a [BM] value does not fit [BM, BN].
    let e = f.b.store(f.out, &f.off2, &f.dims2, bm_tile).unwrap_err();
    assert!(matches!(e, IrError::ShapeMismatch { ref op, .. } if op == "store"), "{e:?}");
    f.b.store(f.out, &f.off2, &f.dims2, f.vt).unwrap();
}

#[test]
fn store_to_input() {
    let mut f = fx();
    let e = f.b.store(f.x, &f.off2, &f.dims2, f.xt).unwrap_err();
    assert_eq!(e, IrError::StoreToInput { tensor: "x".into() });
    assert!(e.to_string().contains("only `&mut Tensor` parameters"));
}

#[test]
fn offset_count() {
    let mut f = fx();
    let e = f.b.load(f.x, &f.off2[..1], &f.dims2).unwrap_err();
    assert_eq!(e, IrError::OffsetCount { tensor: "x".into(), rank: 2, given: 1 });
    let e = f.b.load(f.x, &f.off2, &f.dims2[..1]).unwrap_err();
    assert_eq!(e, IrError::OffsetCount { tensor: "x".into(), rank: 2, given: 1 });
    // Offsets must be i64 scalars.
    let e = f.b.load(f.x, &[f.off2[0], f.vt], &f.dims2).unwrap_err();
    assert!(matches!(e, IrError::Expected { ref expected, .. } if expected.contains("i64 scalar")), "{e:?}");
    // A scalar parameter is not a tensor.
    let (p, _) = f.b.scalar_param("s", DType::F32);
    let e = f.b.load(p, &[], &[]).unwrap_err();
    assert!(matches!(e, IrError::Expected { .. }), "{e:?}");
}

#[test]
fn bad_axis() {
    let mut f = fx();
    assert_eq!(f.b.reduce(ReduceOp::Sum, f.vt, 1, false).unwrap_err(), IrError::BadAxis { axis: 1, rank: 1 });
    assert_eq!(f.b.reduce(ReduceOp::Sum, f.xt, -3, false).unwrap_err(), IrError::BadAxis { axis: -3, rank: 2 });
    let s = f.b.reduce(ReduceOp::Sum, f.vt, -1, false).unwrap();
    assert!(f.b.ty(s).is_scalar());
    assert_eq!(f.b.reduce(ReduceOp::Sum, s, 0, false).unwrap_err(), IrError::BadAxis { axis: 0, rank: 0 });
    let r = f.b.reduce(ReduceOp::Mean, f.xt, -2, false).unwrap();
    assert_eq!(f.b.kernel().op(r.op()), &Op::Reduce { op: ReduceOp::Mean, axis: 0, keep_dim: false });
    assert_eq!(f.b.program_id(3).unwrap_err(), IrError::GridAxis(3));
}

#[test]
fn op_dtype_rules() {
    let mut f = fx();
    let pid = f.b.program_id(0).unwrap();
    assert!(matches!(f.b.unary(UnaryOp::Exp, pid), Err(IrError::Expected { .. })));
    assert!(matches!(f.b.unary(UnaryOp::Not, f.vt), Err(IrError::Expected { .. })));
    assert!(matches!(f.b.binary(BinaryOp::Rem, f.vt, f.vt), Err(IrError::Expected { .. })));
    assert!(matches!(f.b.binary(BinaryOp::And, f.vt, f.vt), Err(IrError::Expected { .. })));
    let c = f.b.binary(BinaryOp::Lt, f.vt, f.vt).unwrap();
    assert!(matches!(f.b.binary(BinaryOp::Add, c, c), Err(IrError::Expected { .. })));
    let c8 = f.b.cast(c, DType::F32).unwrap();
    assert!(matches!(f.b.reduce(ReduceOp::Sum, c, 0, false), Err(IrError::Expected { .. })));
    f.b.reduce(ReduceOp::Sum, c8, 0, false).unwrap();
    // A no-op cast adds nothing.
    assert_eq!(f.b.cast(f.vt, DType::F32).unwrap(), f.vt);
}

#[test]
fn permute_rules() {
    let mut f = fx();
    let t = f.b.permute(f.xt, &[1, 0]).unwrap();
    assert_eq!(f.b.ty(t).shape, vec![Extent::Tile(f.bn), Extent::Tile(f.bm)]);
    for bad in [&[0, 0][..], &[0][..], &[0, 2][..], &[0, 1, 2][..]] {
        assert!(matches!(f.b.permute(f.xt, bad), Err(IrError::Expected { .. })), "{bad:?}");
    }
}

#[test]
fn finish_verifies() {
    let f = fx();
    let k = f.b.finish().unwrap();
    assert_eq!(k.params.len(), 4);
    assert_eq!(k.shape_syms, vec!["M".to_string(), "N".to_string()]);
    assert_eq!(k.grid_rank(), 2);
}

#[test]
fn iota_is_an_i64_tile() {
    let mut f = fx();
    let n = f.b.find_shape_sym("N").unwrap();
    for e in [Extent::Const(5), Extent::Tile(f.bn), Extent::Full(n)] {
        let v = f.b.iota(e).unwrap();
        assert_eq!(f.b.ty(v), &Type::tile(DType::I64, vec![e]));
        assert_eq!(f.b.kernel().op(v.op()), &Op::Iota { extent: e });
    }
    // Zero or unknown extents are refused.
    assert!(matches!(f.b.iota(Extent::Const(0)), Err(IrError::Expected { ref op, .. }) if op == "iota"));
    assert!(matches!(f.b.iota(Extent::Tile(TileSym(9))), Err(IrError::Expected { .. })));
    assert!(matches!(f.b.iota(Extent::Full(ShapeSym(9))), Err(IrError::Expected { .. })));
    // An i64 tile mixes with index scalars; a float use needs a cast.
    let pid = f.b.program_id(0).unwrap();
    let j = f.b.iota(Extent::Tile(f.bn)).unwrap();
    let s = f.b.binary(BinaryOp::Add, j, pid).unwrap();
    assert_eq!(f.b.ty(s), &Type::tile(DType::I64, vec![Extent::Tile(f.bn)]));
    assert!(matches!(f.b.binary(BinaryOp::Add, j, f.vt), Err(IrError::DTypeMismatch { .. })));
    let jf = f.b.cast(j, DType::F32).unwrap();
    f.b.binary(BinaryOp::Add, jf, f.vt).unwrap();
    f.b.finish().unwrap();
}

#[test]
fn expand_dims_inserts_a_unit_axis() {
    let mut f = fx();
    let (bm, bn) = (Extent::Tile(f.bm), Extent::Tile(f.bn));
    let one = Extent::Const(1);
    let ms = f.b.reduce(ReduceOp::Mean, f.xt, 1, false).unwrap(); // [BM]
    let col = f.b.expand_dims(ms, 1).unwrap();
    assert_eq!(f.b.ty(col).shape, vec![bm, one]);
    assert_eq!(f.b.kernel().op(col.op()), &Op::ExpandDims { axis: 1 });
    // [BM, 1] broadcasts against [BM, BN] (which [BM] alone does not).
    assert!(matches!(f.b.binary(BinaryOp::Div, f.xt, ms), Err(IrError::ShapeMismatch { .. })));
    let y = f.b.binary(BinaryOp::Div, f.xt, col).unwrap();
    assert_eq!(f.b.ty(y).shape, vec![bm, bn]);
    // Negative axes count from the end of the result; -1 appends.
    let a = f.b.expand_dims(ms, -1).unwrap();
    assert_eq!(f.b.kernel().op(a.op()), &Op::ExpandDims { axis: 1 });
    let r = f.b.expand_dims(f.vt, 0).unwrap();
    assert_eq!(f.b.ty(r).shape, vec![one, bn]);
    let r = f.b.expand_dims(f.xt, -2).unwrap();
    assert_eq!(f.b.ty(r).shape, vec![bm, one, bn]);
    let r = f.b.expand_dims(f.xt, -3).unwrap();
    assert_eq!(f.b.ty(r).shape, vec![one, bm, bn]);
    // A scalar becomes [1]; the dtype is kept.
    let s = f.b.reduce(ReduceOp::Sum, f.ht, 0, false).unwrap();
    let s1 = f.b.expand_dims(s, 0).unwrap();
    assert_eq!(f.b.ty(s1), &Type::tile(DType::BF16, vec![one]));
    // Out of range.
    let e = f.b.expand_dims(ms, 2).unwrap_err();
    assert_eq!(e.to_string(), "`expand_dims` expects an axis in -2..=1 for a tile of rank 1, found 2");
    assert!(matches!(f.b.expand_dims(ms, -3), Err(IrError::Expected { ref found, .. }) if found == "-3"));
    let e = f.b.expand_dims(s, 1).unwrap_err();
    assert_eq!(e.to_string(), "`expand_dims` expects an axis in -1..=0 for a tile of rank 0, found 1");
    f.b.finish().unwrap();
}

#[test]
fn sin_and_cos_take_floats() {
    let mut f = fx();
    for op in [UnaryOp::Sin, UnaryOp::Cos] {
        let y = f.b.unary(op, f.ht).unwrap();
        assert_eq!(f.b.ty(y), f.b.ty(f.ht));
        let pid = f.b.program_id(0).unwrap();
        let e = f.b.unary(op, pid).unwrap_err();
        assert!(matches!(e, IrError::Expected { ref expected, .. } if expected.contains("float")), "{e:?}");
    }
    f.b.finish().unwrap();
}

/// An indexed dimension on an `i64` tensor: a rank-0 load is an `i64` scalar, usable as
/// an offset.
#[test]
fn i64_scalar_loads_are_offsets() {
    let mut b = Builder::new("gather");
    let (t, p, d) = (b.shape_sym("T"), b.shape_sym("P"), b.shape_sym("D"));
    let pos = b.tensor_param("pos", DType::I64, &[t], false);
    let tab = b.tensor_param("tab", DType::F32, &[p, d], false);
    let out = b.tensor_param("out", DType::F32, &[t, d], true);
    let i = b.program_id(0).unwrap();
    let pv = b.load(pos, &[i], &[AccessDim::Index]).unwrap();
    assert_eq!(b.ty(pv), &Type::scalar(DType::I64));
    let zero = b.literal(Literal::Int(0));
    let row = [AccessDim::Index, AccessDim::Tile(Extent::Full(d))];
    let r = b.load(tab, &[pv, zero], &row).unwrap();
    b.store(out, &[i, zero], &row, r).unwrap();
    b.finish().unwrap();
}

//! Loops with carried values, `zeros` and `dot`: builder, verifier, printer, grid and
//! interpreter.

use kfuse_ir::grid::{derive, GridAxis};
use kfuse_ir::print::print;
use kfuse_ir::verify::verify;
use kfuse_ir::*;

use crate::common::*;

fn verify_msg(k: &Kernel) -> String {
    match verify(k, "test") {
        Err(IrError::Verify { msg, .. }) => msg,
        other => panic!("expected a verification failure, got {other:?}"),
    }
}

fn find(k: &Kernel, f: impl Fn(&Op) -> bool) -> OpId {
    k.ops().find(|o| f(k.op(*o))).expect("op present")
}

/// Moves the op at position `from` to position `to` of `order`.
fn move_op(k: &mut Kernel, from: usize, to: usize) {
    let op = k.order.remove(from);
    k.order.insert(to, op);
}

// ---------------------------------------------------------------------------------
// Builder

#[test]
fn dot_types() {
    let mut b = Builder::new("d");
    let (bm, bn, bk) = (b.tile_sym("BM"), b.tile_sym("BN"), b.tile_sym("BK"));
    let (tm, tn, tk) = (Extent::Tile(bm), Extent::Tile(bn), Extent::Tile(bk));
    let x = b.zeros(DType::BF16, &[tm, tk]).unwrap();
    let y = b.zeros(DType::BF16, &[tk, tn]).unwrap();
    let d = b.dot(x, y).unwrap();
    assert_eq!(b.ty(d), &Type::tile(DType::F32, vec![tm, tn]));
    // inner extents must be the same extent
    let e = b.dot(x, x).unwrap_err();
    assert_eq!(e.to_string(), "shape mismatch in `dot`: [BM, BK] vs [BM, BK]");
    // one float dtype
    let y32 = b.zeros(DType::F32, &[tk, tn]).unwrap();
    assert_eq!(b.dot(x, y32).unwrap_err().to_string(), "dtype mismatch in `dot`: bf16 vs f32");
    // rank 2, floats
    let v = b.zeros(DType::BF16, &[tk]).unwrap();
    assert_eq!(b.dot(v, y).unwrap_err().to_string(), "`dot` expects rank-2 tiles ([M, K] and [K, N]), found bf16[BK]");
    let xi = b.zeros(DType::I64, &[tm, tk]).unwrap();
    let yi = b.zeros(DType::I64, &[tk, tn]).unwrap();
    assert_eq!(b.dot(xi, yi).unwrap_err().to_string(), "`dot` expects float tiles (f32, f16, bf16, f8e4m3, f8e5m2), found i64");
}

#[test]
fn zeros_is_a_broadcast_constant() {
    let mut b = Builder::new("z");
    let n = b.shape_sym("N");
    let bm = b.tile_sym("BM");
    let z = b.zeros(DType::F16, &[Extent::Tile(bm), Extent::Full(n)]).unwrap();
    assert_eq!(b.ty(z), &Type::tile(DType::F16, vec![Extent::Tile(bm), Extent::Full(n)]));
    assert!(matches!(b.kernel().op(z.op()), Op::Broadcast));
    let s = b.zeros(DType::F32, &[]).unwrap();
    assert!(matches!(b.kernel().op(s.op()), Op::Const { value: Literal::Float(0.0) }));
    assert!(b.zeros(DType::F32, &[Extent::Const(0)]).is_err());
    assert!(b.zeros(DType::F32, &[Extent::Tile(TileSym(9))]).is_err());
}

#[test]
fn loop_typing_rules() {
    let mut b = Builder::new("l");
    let bn = b.tile_sym("BN");
    let lo = b.literal(Literal::Int(0));
    let hi = b.literal(Literal::Int(10));
    let one = b.literal(Literal::Int(1));
    let f = b.literal(Literal::Float(1.0));
    // bounds are i64 scalars
    let e = b.begin_for(lo, f, one, &[]).unwrap_err();
    assert_eq!(e.to_string(), "`for` expects an i64 scalar end, found f32");
    let acc = b.zeros(DType::F32, &[Extent::Tile(bn)]).unwrap();
    let (l, i, c) = b.begin_for(lo, hi, one, &[acc, f]).unwrap();
    assert_eq!(b.ty(i), &Type::scalar(DType::I64));
    assert_eq!(b.ty(c[0]), b.ty(acc));
    // a weak literal init keeps its default dtype
    assert_eq!(b.ty(c[1]), &Type::scalar(DType::F32));
    // conform: literals adapt, scalars broadcast, other dtypes do not
    let two = b.literal(Literal::Int(2));
    let v = b.conform(two, c[0], "acc").unwrap();
    assert_eq!(b.ty(v), b.ty(acc));
    let h = b.zeros(DType::F16, &[Extent::Tile(bn)]).unwrap();
    assert_eq!(
        b.conform(h, c[0], "acc").unwrap_err().to_string(),
        "`acc = ..` expects a value of the type of `acc` at the start of the loop, f32[BN], found f16[BN]"
    );
    let wide = b.zeros(DType::F32, &[Extent::Const(2), Extent::Tile(bn)]).unwrap();
    assert!(b.conform(wide, c[0], "acc").is_err());
    // end_for: the innermost loop, one value per carried value
    assert!(b.end_for(l, &[c[0]]).is_err());
    assert!(b.end_for(LoopId(7), &[c[0], c[1]]).is_err());
    let r = b.end_for(l, &[c[0], two]).unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(b.ty(r[1]), &Type::scalar(DType::F32));
    assert!(b.end_for(l, &[]).is_err(), "already closed");
}

#[test]
fn an_open_loop_does_not_finish() {
    let mut b = Builder::new("open");
    let lo = b.literal(Literal::Int(0));
    b.begin_for(lo, lo, lo, &[]).unwrap();
    assert!(b.finish().unwrap_err().to_string().contains("loop L0 open"));
}

#[test]
fn values_of_a_body_stay_in_it() {
    let mut b = Builder::new("scope");
    let n = b.shape_sym("N");
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let lo = b.literal(Literal::Int(0));
    let one = b.literal(Literal::Int(1));
    let (l, i, _) = b.begin_for(lo, one, one, &[]).unwrap();
    let x = b.cast(i, DType::F32).unwrap();
    b.end_for(l, &[]).unwrap();
    b.store(po, &[lo], &[AccessDim::Tile(Extent::Const(1))], x).unwrap();
    let e = b.finish().unwrap_err().to_string();
    assert!(e.contains("is defined in the body of loop L0 but used outside it"), "{e}");
}

// ---------------------------------------------------------------------------------
// Kernel helpers

#[test]
fn loop_helpers() {
    let k = gemm(DType::F32);
    let l = LoopId(0);
    assert_eq!(k.loops(), vec![l]);
    let info = k.loop_info(l).unwrap();
    assert_eq!(k.loop_body(l), Some((info.for_pos, info.yield_pos)));
    assert_eq!(info.carried, 1);
    assert!(matches!(k.op(info.for_op), Op::For { .. }));
    assert!(matches!(k.op(info.yield_op), Op::Yield { .. }));
    assert!(matches!(k.op(info.index.unwrap().op()), Op::LoopIndex { .. }));
    assert!(matches!(k.op(info.carried_values[0].unwrap().op()), Op::LoopCarried { index: 0, .. }));
    assert!(matches!(k.op(info.results[0].unwrap().op()), Op::LoopResult { index: 0, .. }));
    let dot = find(&k, |o| matches!(o, Op::Dot { .. }));
    let store = find(&k, |o| matches!(o, Op::Store { .. }));
    assert_eq!(k.loop_of(dot), Some(l));
    assert_eq!(k.loop_of(info.yield_op), Some(l));
    assert_eq!(k.loop_of(info.for_op), None);
    assert_eq!(k.loop_of(store), None);
    assert_eq!(k.loops_around(dot), vec![l]);
    let nest = k.loop_nest();
    assert_eq!(nest.len(), k.order.len());
    assert_eq!(nest.iter().filter(|n| n.is_some()).count(), info.yield_pos - info.for_pos);
    assert_eq!(k.fresh_loop_id(), LoopId(1));
    assert_eq!(Op::Dot { precision: Default::default() }.loop_id(), None);
    assert!(!Op::For { id: l, carried: 0 }.has_result() && !Op::Yield { id: l }.has_result());
}

// ---------------------------------------------------------------------------------
// Verifier

#[test]
fn gemm_verifies() {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        verify(&gemm(dt), "test").unwrap();
    }
}

#[test]
fn for_and_yield_nest() {
    // a yield before its for
    let mut k = gemm(DType::F32);
    let info = k.loop_info(LoopId(0)).unwrap();
    move_op(&mut k, info.yield_pos, info.for_pos);
    let m = verify_msg(&k);
    assert!(m.contains("not defined before its use") || m.contains("not open"), "{m}");
    // a for without a yield
    let mut k = gemm(DType::F32);
    let y = k.loop_info(LoopId(0)).unwrap().yield_op;
    k.graph.remove_node(y.0);
    k.order.retain(|o| *o != y);
    assert!(verify_msg(&k).contains("has no `yield`"), "{}", verify_msg(&k));
    // two loops that cross: for L0, for L1, yield L0, yield L1
    let mut b = Builder::new("cross");
    let z = b.literal(Literal::Int(0));
    let (l0, _, _) = b.begin_for(z, z, z, &[]).unwrap();
    let (l1, _, _) = b.begin_for(z, z, z, &[]).unwrap();
    b.end_for(l1, &[]).unwrap();
    b.end_for(l0, &[]).unwrap();
    let mut k = b.finish().unwrap();
    let (y0, y1) = (k.loop_body(l0).unwrap().1, k.loop_body(l1).unwrap().1);
    k.order.swap(y0, y1);
    assert!(verify_msg(&k).contains("while loop L1 is open"), "{}", verify_msg(&k));
}

#[test]
fn a_loop_id_is_used_once() {
    let mut b = Builder::new("twice");
    let z = b.literal(Literal::Int(0));
    let (l0, _, _) = b.begin_for(z, z, z, &[]).unwrap();
    b.end_for(l0, &[]).unwrap();
    let (l1, _, _) = b.begin_for(z, z, z, &[]).unwrap();
    b.end_for(l1, &[]).unwrap();
    let mut k = b.finish().unwrap();
    let info = k.loop_info(l1).unwrap();
    k.graph[info.for_op.0].op = Op::For { id: l0, carried: 0 };
    k.graph[info.yield_op.0].op = Op::Yield { id: l0 };
    assert!(verify_msg(&k).contains("loop L0 has two `for` ops"), "{}", verify_msg(&k));
}

#[test]
fn loop_values_lie_where_they_belong() {
    // the index outside the body
    let mut k = gemm(DType::F32);
    let info = k.loop_info(LoopId(0)).unwrap();
    let ix = k.position(info.index.unwrap().op());
    move_op(&mut k, ix, info.for_pos);
    assert!(verify_msg(&k).contains("lies outside the body of loop L0"), "{}", verify_msg(&k));
    // the carried value outside the body
    let mut k = gemm(DType::F32);
    let c = k.position(info.carried_values[0].unwrap().op());
    move_op(&mut k, c, info.for_pos);
    assert!(verify_msg(&k).contains("lies outside the body of loop L0"), "{}", verify_msg(&k));
    // the result inside the body
    let mut k = gemm(DType::F32);
    let r = k.position(info.results[0].unwrap().op());
    move_op(&mut k, r, info.yield_pos);
    assert!(verify_msg(&k).contains("must follow the `yield` of loop L0"), "{}", verify_msg(&k));
}

#[test]
fn loop_value_types_and_counts() {
    // a carried value with another type than its init
    let mut b = Builder::new("pass");
    let z = b.literal(Literal::Int(0));
    let (l, _, c) = b.begin_for(z, z, z, &[z]).unwrap();
    b.end_for(l, &[c[0]]).unwrap();
    let mut k = b.finish().unwrap();
    k.graph[c[0].0].ty = Some(Type::scalar(DType::F32));
    let m = verify_msg(&k);
    assert!(m.contains("but init 0 of loop L0 has"), "{m}");
    let c = gemm(DType::F32).loop_info(LoopId(0)).unwrap().carried_values[0].unwrap();
    // an index past the carried count
    let mut k = gemm(DType::F32);
    k.graph[c.0].op = Op::LoopCarried { id: LoopId(0), index: 1 };
    assert!(verify_msg(&k).contains("takes carried value 1 of loop L0, which has 1"), "{}", verify_msg(&k));
    // a yield with a value of another type
    let mut k = gemm(DType::F32);
    let y = k.loop_info(LoopId(0)).unwrap().yield_op;
    let old = k.operands(y)[0];
    let bad = k.insert_before(y, Op::Const { value: Literal::Float(0.0) }, Some(Type::scalar(DType::F32)), &[]);
    k.replace_operand(y, old, bad.value());
    assert!(verify_msg(&k).contains("the `yield` of loop L0 gives"), "{}", verify_msg(&k));
    // a loop op naming a loop that does not exist
    let mut k = gemm(DType::F32);
    let r = k.loop_info(LoopId(0)).unwrap().results[0].unwrap();
    k.graph[r.0].op = Op::LoopResult { id: LoopId(5), index: 0 };
    assert!(verify_msg(&k).contains("names loop L5, which has no `for`"), "{}", verify_msg(&k));
    // bounds must be i64 scalars
    let mut k = gemm(DType::F32);
    let f = k.loop_info(LoopId(0)).unwrap().for_op;
    let lo = k.operands(f)[0];
    let bad = k.insert_before(f, Op::Const { value: Literal::Float(0.0) }, Some(Type::scalar(DType::F32)), &[]);
    k.replace_operand(f, lo, bad.value());
    assert!(verify_msg(&k).contains("lo, hi and step must be i64 scalars"), "{}", verify_msg(&k));
}

#[test]
fn dot_rules() {
    let mut k = gemm(DType::F32);
    let d = find(&k, |o| matches!(o, Op::Dot { .. }));
    k.graph[d.0].ty = Some(Type::tile(DType::F16, k.ty(d.value()).shape.clone()));
    assert!(verify_msg(&k).contains("dot gives f32 [M, N]"), "{}", verify_msg(&k));
    let mut k = gemm(DType::F32);
    let ops = k.operands(d);
    k.replace_operand(d, ops[1], ops[0]);
    assert!(verify_msg(&k).contains("dot: inner extents differ"), "{}", verify_msg(&k));
}

// ---------------------------------------------------------------------------------
// Printer and grid

#[test]
fn printed_gemm() {
    let want = "\
kernel gemm(a: bf16[M, K], b: bf16[K, N], c: &mut bf16[M, N])
  %0 = program_id 0 : i64
  %1 = tile_extent BM : i64
  %2 = mul %0, %1 : i64
  %3 = program_id 1 : i64
  %4 = tile_extent BN : i64
  %5 = mul %3, %4 : i64
  %6 = const 0.0 : f32
  %7 = broadcast %6 : f32[BM, BN]  // acc
  %8 = const 0 : i64
  %9 = shape K : i64
  %10 = tile_extent BK : i64
  for L0 in %8..%9 step %10, init [%7] {
    %12 = loop_index L0 : i64  // k
    %13 = loop_carried L0.0 : f32[BM, BN]  // acc
    %14 = load a[%2 +BM, %12 +BK] : bf16[BM, BK]
    %15 = load b[%12 +BK, %5 +BN] : bf16[BK, BN]
    %16 = dot %14, %15 : f32[BM, BN]
    %17 = add %13, %16 : f32[BM, BN]  // acc
    yield L0 [%17]
  }
  %19 = loop_result L0.0 : f32[BM, BN]  // acc
  %20 = cast %19 to bf16 : bf16[BM, BN]
  store c[%2 +BM, %5 +BN], %20
";
    assert_eq!(print(&gemm(DType::BF16)), want);
}

#[test]
fn nested_loops_print_indented() {
    let mut b = Builder::new("nest");
    let z = b.literal(Literal::Int(0));
    let one = b.literal(Literal::Int(1));
    let (l0, _, c0) = b.begin_for(z, one, one, &[z]).unwrap();
    let (l1, j, c1) = b.begin_for(z, one, one, &[c0[0]]).unwrap();
    let s = b.binary(BinaryOp::Add, c1[0], j).unwrap();
    let r1 = b.end_for(l1, &[s]).unwrap();
    let r0 = b.end_for(l0, &[r1[0]]).unwrap();
    b.name(r0[0], "total");
    let text = print(&b.finish().unwrap());
    let want = "\
kernel nest()
  %0 = const 0 : i64
  %1 = const 1 : i64
  for L0 in %0..%1 step %1, init [%0] {
    %3 = loop_index L0 : i64
    %4 = loop_carried L0.0 : i64
    for L1 in %0..%1 step %1, init [%4] {
      %6 = loop_index L1 : i64
      %7 = loop_carried L1.0 : i64
      %8 = add %7, %6 : i64
      yield L1 [%8]
    }
    %10 = loop_result L1.0 : i64
    yield L0 [%10]
  }
  %12 = loop_result L0.0 : i64  // total
";
    assert_eq!(text, want);
}

#[test]
fn grid_of_a_store_inside_a_loop() {
    // A store inside a loop determines the axes its offsets determine: here axis 1
    // (`program_id(1) * BN`, made inside the body) but not axis 0 (`i * BM + r`).
    let mut b = Builder::new("rows_in_loop");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let z = b.literal(Literal::Int(0));
    let one = b.literal(Literal::Int(1));
    let hi = b.tile_extent(Extent::Tile(bm));
    let (l, r, _) = b.begin_for(z, hi, one, &[]).unwrap();
    let j = block_offset(&mut b, 1, bn);
    let row = b.binary(BinaryOp::Add, i, r).unwrap();
    let v = b.cast(r, DType::F32).unwrap();
    b.store(po, &[row, j], &[AccessDim::Index, AccessDim::Tile(Extent::Tile(bn))], v).unwrap();
    b.end_for(l, &[]).unwrap();
    let k = b.finish().unwrap();
    let e = derive(&k).unwrap_err().to_string();
    assert!(e.contains("program_id(0) does not index any store"), "{e}");

    // A whole block stored in a loop over the columns: axis 0 covers M by BM.
    let mut b = Builder::new("block_in_loop");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let (bm, bn) = (b.tile_sym("BM"), b.tile_sym("BN"));
    let px = b.tensor_param("x", DType::F32, &[m, n], false);
    let po = b.tensor_param("out", DType::F32, &[m, n], true);
    let i = block_offset(&mut b, 0, bm);
    let z = b.literal(Literal::Int(0));
    let one = b.literal(Literal::Int(1));
    let nn = b.shape_dim(n);
    let step = b.tile_extent(Extent::Tile(bn));
    let (l, j, _) = b.begin_for(z, nn, step, &[]).unwrap();
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i, j], &dims).unwrap();
    let y = b.binary(BinaryOp::Add, x, one).unwrap();
    b.store(po, &[i, j], &dims, y).unwrap();
    b.end_for(l, &[]).unwrap();
    let k = b.finish().unwrap();
    assert_eq!(derive(&k).unwrap().axes, vec![GridAxis { dim: m, step: Some(Extent::Tile(bm)) }]);
    // and it runs: one program per row block walks the columns
    let (rows, cols) = (37, 53);
    let xin = Host::random(DType::F32, &[rows, cols], -2.0, 2.0, 5);
    let mut out = Host::filled(DType::F32, &[rows, cols], f64::NAN);
    run_with(&k, &mut [xin.arg(), out.arg_mut()], 16).unwrap();
    let want: Vec<f64> = xin.to_vec().iter().map(|v| (*v as f32 + 1.0) as f64).collect();
    assert_exact(&out.to_vec(), &want, "block_in_loop");
}

// ---------------------------------------------------------------------------------
// Interpreter

fn run_gemm(dt: DType, m: usize, kk: usize, n: usize, tiles: (u32, u32, u32), seed: u64) {
    let mut k = gemm(dt);
    set_tile(&mut k, "BM", tiles.0);
    set_tile(&mut k, "BN", tiles.1);
    set_tile(&mut k, "BK", tiles.2);
    let a = Host::random(dt, &[m, kk], -2.0, 2.0, seed);
    let b = Host::random(dt, &[kk, n], -2.0, 2.0, seed + 1);
    let mut c = Host::filled(dt, &[m, n], f64::NAN);
    run_with(&k, &mut [a.arg(), b.arg(), c.arg_mut()], 16).unwrap();
    let want = gemm_ref(dt, &a.to_vec(), &b.to_vec(), m, kk, n, tiles.2 as usize);
    assert_exact(&c.to_vec(), &want, &format!("gemm {dt} {m}x{kk}x{n} tiles {tiles:?}"));
}

#[test]
fn gemm_is_exact_against_its_rule() {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        for (s, &(m, kk, n)) in [(1, 1, 1), (17, 33, 65), (7, 130, 5), (16, 16, 16)].iter().enumerate() {
            run_gemm(dt, m, kk, n, (16, 16, 16), s as u64);
            run_gemm(dt, m, kk, n, (4, 8, 32), 10 + s as u64);
        }
    }
}

#[test]
fn gemm_with_k_smaller_than_the_tile_and_strided_inputs() {
    // K = 3 with BK = 16: one iteration over 3 valid lanes of K.
    run_gemm(DType::F32, 5, 3, 9, (16, 16, 16), 40);
    // a transposed view for `a`
    let k = gemm(DType::F32);
    let (m, kk, n) = (9, 21, 11);
    let at = Host::random(DType::F32, &[kk, m], -1.0, 1.0, 41);
    let a = Host { shape: vec![m, kk], strides: vec![1, m as isize], ..at.clone() };
    let b = Host::random(DType::F32, &[kk, n], -1.0, 1.0, 42);
    let mut c = Host::filled(DType::F32, &[m, n], f64::NAN);
    run_with(&k, &mut [a.arg(), b.arg(), c.arg_mut()], 16).unwrap();
    assert_exact(&c.to_vec(), &gemm_ref(DType::F32, &a.to_vec(), &b.to_vec(), m, kk, n, 16), "strided gemm");
}

#[test]
fn a_loop_that_runs_zero_times_gives_its_inits() {
    // for _ in 5..5 { x = x + 1 }: the result is the init
    let mut b = Builder::new("zero_trip");
    let n = b.shape_sym("N");
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let five = b.literal(Literal::Int(5));
    let one = b.literal(Literal::Int(1));
    let init = b.constant(Literal::Float(3.5), DType::F32);
    let (l, _, c) = b.begin_for(five, five, one, &[init]).unwrap();
    let x = b.binary(BinaryOp::Add, c[0], one).unwrap();
    let r = b.end_for(l, &[x]).unwrap();
    let z = b.literal(Literal::Int(0));
    b.store(po, &[z], &[AccessDim::Tile(Extent::Const(1))], r[0]).unwrap();
    let k = b.finish().unwrap();
    let mut out = Host::filled(DType::F32, &[1], f64::NAN);
    run_with(&k, &mut [out.arg_mut()], 16).unwrap();
    assert_eq!(out.to_vec(), vec![3.5]);
}

/// `out[0] = Σ_{i in (lo..hi).step_by(step)} Σ_{j in 0..i} (i + 10 j)`, as f32 via an i64
/// accumulator carried through both loops.
fn nested_sum(step: i64) -> Kernel {
    let mut b = Builder::new("nested_sum");
    let n = b.shape_sym("N");
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let lo = b.literal(Literal::Int(1));
    let hi = b.literal(Literal::Int(9));
    let st = b.constant(Literal::Int(step), DType::I64);
    let zero = b.constant(Literal::Int(0), DType::I64);
    let one = b.literal(Literal::Int(1));
    let (l0, i, c0) = b.begin_for(lo, hi, st, &[zero]).unwrap();
    let (l1, j, c1) = b.begin_for(zero, i, one, &[c0[0]]).unwrap();
    let ten = b.literal(Literal::Int(10));
    let t = b.binary(BinaryOp::Mul, j, ten).unwrap();
    let t = b.binary(BinaryOp::Add, i, t).unwrap();
    let s = b.binary(BinaryOp::Add, c1[0], t).unwrap();
    let r1 = b.end_for(l1, &[s]).unwrap();
    let r0 = b.end_for(l0, &[r1[0]]).unwrap();
    let f = b.cast(r0[0], DType::F32).unwrap();
    let z = b.literal(Literal::Int(0));
    b.store(po, &[z], &[AccessDim::Tile(Extent::Const(1))], f).unwrap();
    b.finish().unwrap()
}

#[test]
fn nested_loops_carry_through_both() {
    for step in [1i64, 3] {
        let k = nested_sum(step);
        let mut out = Host::filled(DType::F32, &[1], f64::NAN);
        run_with(&k, &mut [out.arg_mut()], 16).unwrap();
        let want: i64 = (1..9).step_by(step as usize).map(|i| (0..i).map(|j| i + 10 * j).sum::<i64>()).sum();
        assert_eq!(out.to_vec(), vec![want as f64], "step {step}");
    }
}

#[test]
fn a_step_that_is_not_positive_is_an_error() {
    for step in [0i64, -2] {
        let k = nested_sum(step);
        let mut out = Host::filled(DType::F32, &[1], f64::NAN);
        let e = run_with(&k, &mut [out.arg_mut()], 16).unwrap_err();
        assert_eq!(e, IrError::Interp(format!("loop L0 has step {step}: the step of a loop must be positive")));
    }
}

#[test]
fn carried_values_keep_their_valid_ranges() {
    // acc = x.block(i*BN) (valid on the in-bounds lanes); for _ in 0..3 { acc = acc * 2 };
    // store acc: only the valid lanes are written, through the loop.
    let mut b = Builder::new("doubling");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let i = block_offset(&mut b, 0, bn);
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[i], &d).unwrap();
    let z = b.literal(Literal::Int(0));
    let three = b.literal(Literal::Int(3));
    let one = b.literal(Literal::Int(1));
    let (l, _, c) = b.begin_for(z, three, one, &[x]).unwrap();
    let two = b.literal(Literal::Float(2.0));
    let y = b.binary(BinaryOp::Mul, c[0], two).unwrap();
    let r = b.end_for(l, &[y]).unwrap();
    b.store(po, &[i], &d, r[0]).unwrap();
    let k = b.finish().unwrap();
    // N = 21 with BN = 16: the second program's tile is valid on 5 lanes only
    let xin = Host::random(DType::F32, &[21], -1.0, 1.0, 3);
    let mut out = Host::filled(DType::F32, &[21], f64::NAN);
    run_with(&k, &mut [xin.arg(), out.arg_mut()], 16).unwrap();
    let want: Vec<f64> = xin.to_vec().iter().map(|v| v * 8.0).collect();
    assert_exact(&out.to_vec(), &want, "doubling");
}

#[test]
fn dot_sums_only_lanes_valid_in_both() {
    // a: [BM, BK] at K offset 0 of a K = 5 tensor; b: [BK, BN] at K offset -2 of b's K = 5
    // rows: a's valid k are 0..5, b's 2..7 (b rows -2, -1 are out of bounds): k in 2..5.
    let mut b = Builder::new("shifted");
    let (m, kk, n) = (b.shape_sym("M"), b.shape_sym("K"), b.shape_sym("N"));
    let pa = b.tensor_param("a", DType::F32, &[m, kk], false);
    let pb = b.tensor_param("b", DType::F32, &[kk, n], false);
    let pc = b.tensor_param("c", DType::F32, &[m, n], true);
    let e = |c| AccessDim::Tile(Extent::Const(c));
    let z = b.literal(Literal::Int(0));
    let minus2 = b.literal(Literal::Int(-2));
    let x = b.load(pa, &[z, z], &[e(4), e(8)]).unwrap();
    let y = b.load(pb, &[minus2, z], &[e(8), e(4)]).unwrap();
    let d = b.dot(x, y).unwrap();
    b.store(pc, &[z, z], &[e(4), e(4)], d).unwrap();
    let k = b.finish().unwrap();
    let (mm, k5, nn) = (3, 5, 2);
    let a = Host::random(DType::F32, &[mm, k5], -1.0, 1.0, 7);
    let bb = Host::random(DType::F32, &[k5, nn], -1.0, 1.0, 8);
    let mut c = Host::filled(DType::F32, &[mm, nn], f64::NAN);
    run_with(&k, &mut [a.arg(), bb.arg(), c.arg_mut()], 16).unwrap();
    // lane (r, q) pairs a[r, kk] with b row kk - 2, for kk in 2..5
    let (av, bv) = (a.to_vec(), bb.to_vec());
    let want: Vec<f64> = (0..mm)
        .flat_map(|r| (0..nn).map(move |q| (r, q)))
        .map(|(r, q)| ((2..5).map(|t| av[r * k5 + t] * bv[(t - 2) * nn + q]).sum::<f64>() as f32) as f64)
        .collect();
    assert_exact(&c.to_vec(), &want, "shifted dot");
}

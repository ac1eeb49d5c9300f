//! The verifier catches broken graphs.

use kfuse_ir::verify::verify;
use kfuse_ir::*;

use crate::common::*;

/// The message of a verification failure after pass "test".
fn fails(k: &Kernel) -> String {
    match verify(k, "test") {
        Err(IrError::Verify { pass, msg }) => {
            assert_eq!(pass, "test");
            msg
        }
        other => panic!("expected a verification failure, got {other:?}"),
    }
}

fn find(k: &Kernel, f: impl Fn(&Op) -> bool) -> OpId {
    k.ops().find(|o| f(k.op(*o))).expect("op present")
}

#[test]
fn built_kernels_verify() {
    for k in [add_1d(DType::BF16), transpose(DType::F32), softmax_row(DType::F16), softmax_block(), row_stats(true)] {
        verify(&k, "test").unwrap_or_else(|e| panic!("{}: {e}", k.name));
    }
}

#[test]
fn order_not_topological() {
    let mut k = add_1d(DType::F32);
    let add = find(&k, |o| matches!(o, Op::Binary(BinaryOp::Add)));
    let p = k.position(add);
    k.order.swap(p, p - 1); // the add now comes before the second load
    let m = fails(&k);
    assert!(m.contains("is not defined before its use"), "{m}");
}

#[test]
fn node_missing_from_or_repeated_in_order() {
    let mut k = add_1d(DType::F32);
    k.order.pop();
    assert!(fails(&k).contains("order lists"), "{}", fails(&k));
    let mut k = add_1d(DType::F32);
    let first = k.order[0];
    k.order.push(first);
    assert!(fails(&k).contains("appears twice"));
}

#[test]
fn wrong_operand_type() {
    // The add's second operand replaced by a bf16 value.
    let mut k = add_1d(DType::F32);
    let add = find(&k, |o| matches!(o, Op::Binary(BinaryOp::Add)));
    let old = k.operands(add)[1];
    let c = k.insert_before(add, Op::Const { value: Literal::Float(1.0) }, Some(Type::scalar(DType::BF16)), &[]);
    k.replace_operand(add, old, c.value());
    let m = fails(&k);
    assert!(m.contains("binary: operands differ"), "{m}");

    // A load whose offset is a float.
    let mut k = add_1d(DType::F32);
    let load = find(&k, |o| matches!(o, Op::Load { .. }));
    let old = k.operands(load)[0];
    let c = k.insert_before(load, Op::Const { value: Literal::Float(1.0) }, Some(Type::scalar(DType::F32)), &[]);
    k.replace_operand(load, old, c.value());
    assert!(fails(&k).contains("offsets must be i64 scalars"));
}

#[test]
fn wrong_result_type() {
    let mut k = add_1d(DType::F32);
    let add = find(&k, |o| matches!(o, Op::Binary(BinaryOp::Add)));
    k.graph[add.0].ty = Some(Type::scalar(DType::F32));
    assert!(fails(&k).contains("result type"));
    // A store with a result.
    let mut k = add_1d(DType::F32);
    let st = find(&k, |o| matches!(o, Op::Store { .. }));
    k.graph[st.0].ty = Some(Type::scalar(DType::F32));
    assert!(fails(&k).contains("result type present exactly when"));
}

#[test]
fn operand_edges_must_be_numbered_densely() {
    let mut k = add_1d(DType::F32);
    let add = find(&k, |o| matches!(o, Op::Binary(BinaryOp::Add)));
    let ops = k.operands(add);
    k.graph.add_edge(ops[0].0, add.0, 5);
    let m = fails(&k);
    assert!(m.contains("operand edges are numbered [0, 1, 5]"), "{m}");
}

#[test]
fn store_to_an_input_and_unknown_symbols() {
    let mut k = add_1d(DType::F32);
    if let ParamKind::Tensor { output, .. } = &mut k.params[2].kind {
        *output = false;
    }
    assert!(fails(&k).contains("stores to an input tensor"));

    let mut k = add_1d(DType::F32);
    k.tile_syms.clear();
    assert!(fails(&k).contains("unknown symbol"));
}

#[test]
fn broadcast_and_permute_rules() {
    let mut k = softmax_block();
    // The broadcast of the [BM, 1] max: claim it gives [BN, BN] (BM cannot widen).
    let bc = find(&k, |o| matches!(o, Op::Broadcast));
    let bn = Extent::Tile(TileSym(1));
    k.graph[bc.0].ty = Some(Type::tile(DType::F32, vec![bn, bn]));
    let m = fails(&k);
    assert!(m.contains("broadcast: operand axis 0 neither equals the result's nor is 1"), "{m}");
    // Dropping an axis is no broadcast either.
    let mut k = softmax_block();
    let bc = find(&k, |o| matches!(o, Op::Broadcast));
    k.graph[bc.0].ty = Some(Type::tile(DType::F32, vec![bn]));
    assert!(fails(&k).contains("does not drop axes"));

    let mut k = transpose(DType::F32);
    let p = find(&k, |o| matches!(o, Op::Permute { .. }));
    k.graph[p.0].op = Op::Permute { perm: vec![0, 0] };
    assert!(fails(&k).contains("not a permutation"));
}

#[test]
fn schedule_invariants_once_scheduled() {
    let mut k = add_1d(DType::F32);
    k.schedule.num_threads = 128;
    let m = fails(&k);
    assert!(m.contains("tile symbol BN has no power-of-two value"), "{m}");
    set_tile(&mut k, "BN", 96);
    assert!(fails(&k).contains("tile symbol BN"));
    set_tile(&mut k, "BN", 128);
    verify(&k, "test").unwrap(); // layouts not assigned yet
    // Once layouts are assigned, every tile value needs one, and not a uniform one.
    let load = find(&k, |o| matches!(o, Op::Load { .. }));
    k.schedule.layouts.insert(load.value(), Layout::Uniform);
    let m = fails(&k);
    assert!(m.contains("of rank 1 has a uniform layout"), "{m}");
    let blocked = Blocked {
        shape: vec![128],
        size_per_thread: vec![1],
        threads_per_warp: vec![32],
        warps_per_block: vec![4],
        order: vec![0],
        block_split: vec![1],
        steps: vec![],
    };
    k.schedule.layouts.insert(load.value(), Layout::Blocked(blocked));
    let m = fails(&k);
    assert!(m.contains("has no layout"), "{m}");
}

#[test]
fn iota_and_expand_dims_rules() {
    let mut b = Builder::new("k");
    let n = b.shape_sym("N");
    let out = b.tensor_param("out", DType::I64, &[n], true);
    let j = b.iota(Extent::Full(n)).unwrap();
    let e = b.expand_dims(j, 1).unwrap();
    let s = b.reduce(ReduceOp::Sum, e, 1, false).unwrap();
    let zero = b.literal(Literal::Int(0));
    b.store(out, &[zero], &[AccessDim::Tile(Extent::Full(n))], s).unwrap();
    let k = b.finish().unwrap();
    verify(&k, "test").unwrap();

    let mut bad = k.clone();
    bad.graph[j.op().0].ty = Some(Type::tile(DType::F32, vec![Extent::Full(n)]));
    assert!(fails(&bad).contains("iota is the i64 tile [extent]"), "{}", fails(&bad));
    let mut bad = k.clone();
    bad.graph[j.op().0].op = Op::Iota { extent: Extent::Const(0) };
    assert!(fails(&bad).contains("zero extent"));

    let mut bad = k.clone();
    bad.graph[e.op().0].op = Op::ExpandDims { axis: 2 };
    assert!(fails(&bad).contains("axis 2 out of range 0..=1"), "{}", fails(&bad));
    let mut bad = k.clone();
    bad.graph[e.op().0].op = Op::ExpandDims { axis: 0 };
    let m = fails(&bad);
    assert!(m.contains("expand_dims inserts one axis of extent 1"), "{m}");
}

//! Gathered accesses (`AccessDim::Gather`): an `i64` tile of rank 1 as the offset of an
//! indexed dimension. The builder's typing and errors, the verifier, the printer, the
//! grid of a scatter and the interpreter's semantics (a coordinate outside the tensor
//! loads a valid 0 and is not stored).

use kfuse_ir::*;

use crate::common::*;

/// `out[t, :] = x[ids[t], :]` over one program of `BT` rows (`x: [V, D]`, `ids: [T]`).
fn lookup(dt: DType) -> Kernel {
    let mut b = Builder::new("lookup");
    let (v, d, t) = (b.shape_sym("V"), b.shape_sym("D"), b.shape_sym("T"));
    let bt = b.tile_sym("BT");
    let x = b.tensor_param("x", dt, &[v, d], false);
    let ids = b.tensor_param("ids", DType::I64, &[t], false);
    let out = b.tensor_param("out", dt, &[t, d], true);
    let off = block_offset(&mut b, 0, bt);
    let zero = b.literal(Literal::Int(0));
    let rows = b.load(ids, &[off], &[AccessDim::Tile(Extent::Tile(bt))]).unwrap();
    let g = b.load(x, &[rows, zero], &[AccessDim::Index, AccessDim::Tile(Extent::Full(d))]).unwrap();
    b.store(out, &[off, zero], &[AccessDim::Tile(Extent::Tile(bt)), AccessDim::Tile(Extent::Full(d))], g).unwrap();
    b.finish().unwrap()
}

#[test]
fn an_index_tile_offset_gathers() {
    let k = lookup(DType::F32);
    let load = k.ops().filter(|&o| matches!(k.op(o), Op::Load { .. })).nth(1).unwrap();
    let Op::Load { dims, .. } = k.op(load) else { unreachable!() };
    assert!(dims[0].is_gather() && !dims[1].is_gather());
    // the gathered axis first, where the gathered dimension stands: [BT, D]
    assert_eq!(k.ty(load.value()).shape, vec![Extent::Tile(TileSym(0)), Extent::Full(ShapeSym(1))]);
    // its index operand is the index tile broadcast to the block
    assert_eq!(k.ty(k.operands(load)[0]).shape, k.ty(load.value()).shape);
    verify::verify(&k, "test").unwrap();
    assert!(print::print(&k).contains("load x[gather"), "{}", print::print(&k));
}

#[test]
fn gathered_rows_and_out_of_range_ids() {
    let k = lookup(DType::F32);
    let (v, d, t) = (5, 3, 7);
    let xv: Vec<f64> = (0..v * d).map(|i| i as f64 + 0.5).collect();
    let x = Host::from_f64(DType::F32, &[v, d], &xv);
    let idv = [4.0, -1.0, 0.0, 5.0, 2.0, 2.0, 1.0];
    let ids = Host::from_f64(DType::I64, &[t], &idv);
    let mut out = Host::filled(DType::F32, &[t, d], f64::NAN);
    run_with(&k, &mut [x.arg(), ids.arg(), out.arg_mut()], 4).unwrap();
    let got = out.to_vec();
    for r in 0..t {
        for c in 0..d {
            let id = idv[r] as i64;
            let want = if (0..v as i64).contains(&id) { xv[id as usize * d + c] } else { 0.0 };
            assert_eq!(got[r * d + c], want, "row {r} col {c}");
        }
    }
}

#[test]
fn scatters_skip_coordinates_outside_and_follow_the_loads_for_the_grid() {
    // out[dest[t], :] = x[t, :]
    let mut b = Builder::new("scatter");
    let (t, d, r) = (b.shape_sym("T"), b.shape_sym("D"), b.shape_sym("R"));
    let bt = b.tile_sym("BT");
    let x = b.tensor_param("x", DType::F32, &[t, d], false);
    let dest = b.tensor_param("dest", DType::I64, &[t], false);
    let out = b.tensor_param("out", DType::F32, &[r, d], true);
    let off = block_offset(&mut b, 0, bt);
    let zero = b.literal(Literal::Int(0));
    let rows = b.load(dest, &[off], &[AccessDim::Tile(Extent::Tile(bt))]).unwrap();
    let full = AccessDim::Tile(Extent::Full(d));
    let v = b.load(x, &[off, zero], &[AccessDim::Tile(Extent::Tile(bt)), full]).unwrap();
    b.store(out, &[rows, zero], &[AccessDim::Index, full], v).unwrap();
    let k = b.finish().unwrap();
    // no store is offset by the program id: the grid follows the loads
    assert_eq!(grid::derive(&k).unwrap().axes[0].dim, t);
    let xv: Vec<f64> = (0..5 * 2).map(|i| i as f64 + 1.0).collect();
    let x = Host::from_f64(DType::F32, &[5, 2], &xv);
    let dest = Host::from_f64(DType::I64, &[5], &[2.0, 9.0, 0.0, -3.0, 3.0]);
    let mut out = Host::filled(DType::F32, &[4, 2], 7.0);
    run_with(&k, &mut [x.arg(), dest.arg(), out.arg_mut()], 2).unwrap();
    assert_eq!(out.to_vec(), vec![5.0, 6.0, 7.0, 7.0, 1.0, 2.0, 9.0, 10.0]);
}

#[test]
fn gather_errors() {
    let mut b = Builder::new("bad");
    let (v, d) = (b.shape_sym("V"), b.shape_sym("D"));
    let (bt, bu) = (b.tile_sym("BT"), b.tile_sym("BU"));
    let x = b.tensor_param("x", DType::F32, &[v, d], false);
    let rows = b.iota(Extent::Tile(bt)).unwrap();
    let cols = b.iota(Extent::Tile(bu)).unwrap();
    let zero = b.literal(Literal::Int(0));
    // a tile offset where the extent is not `_`
    let e = b.load(x, &[rows, zero], &[AccessDim::Tile(Extent::Tile(bt)), AccessDim::Index]).unwrap_err();
    assert!(e.to_string().contains("where the extent is `_`"), "{e}");
    // index tiles of two extents
    let e = b.load(x, &[rows, cols], &[AccessDim::Index, AccessDim::Index]).unwrap_err();
    assert!(e.to_string().contains("index tiles of a gather"), "{e}");
    // a float index tile
    let f = b.cast(rows, DType::F32).unwrap();
    let e = b.load(x, &[f, zero], &[AccessDim::Index, AccessDim::Index]).unwrap_err();
    assert!(e.to_string().contains("i64 scalar offsets"), "{e}");
}

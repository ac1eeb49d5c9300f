use kfuse_codegen::{compile, Spec, Target, TensorSpec};
use kfuse_ir::{AccessDim, Builder, DType, Extent, Kernel};

pub fn add_kernel(dt: DType) -> Kernel {
    let mut b = Builder::new("add");
    let n = b.shape_sym("N");
    let pa = b.tensor_param("a", dt, &[n], false);
    let pb = b.tensor_param("b", dt, &[n], false);
    let po = b.tensor_param("out", dt, &[n], true);
    let bn = b.tile_sym("BN");
    let i = b.program_id(0).unwrap();
    let t = b.tile_extent(Extent::Tile(bn));
    let off = b.binary(kfuse_ir::BinaryOp::Mul, i, t).unwrap();
    let d = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(pa, &[off], &d).unwrap();
    let y = b.load(pb, &[off], &d).unwrap();
    let s = b.binary(kfuse_ir::BinaryOp::Add, x, y).unwrap();
    b.store(po, &[off], &d, s).unwrap();
    b.finish().unwrap()
}

pub fn transpose_kernel(dt: DType) -> Kernel {
    let mut b = Builder::new("transpose");
    let m = b.shape_sym("M");
    let n = b.shape_sym("N");
    let px = b.tensor_param("x", dt, &[m, n], false);
    let po = b.tensor_param("out", dt, &[n, m], true);
    let bm = b.tile_sym("BM");
    let bn = b.tile_sym("BN");
    let i = b.program_id(0).unwrap();
    let j = b.program_id(1).unwrap();
    let tm = b.tile_extent(Extent::Tile(bm));
    let tn = b.tile_extent(Extent::Tile(bn));
    let oi = b.binary(kfuse_ir::BinaryOp::Mul, i, tm).unwrap();
    let oj = b.binary(kfuse_ir::BinaryOp::Mul, j, tn).unwrap();
    let x = b.load(px, &[oi, oj], &[AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))]).unwrap();
    let t = b.permute(x, &[1, 0]).unwrap();
    b.store(po, &[oj, oi], &[AccessDim::Tile(Extent::Tile(bn)), AccessDim::Tile(Extent::Tile(bm))], t).unwrap();
    b.finish().unwrap()
}

pub fn rownorm_kernel(dt: DType) -> Kernel {
    // out[row] = x[row] * rsqrt(mean(x^2) + eps) * w
    let mut b = Builder::new("rmsnorm");
    let m = b.shape_sym("M");
    let n = b.shape_sym("N");
    let px = b.tensor_param("x", dt, &[m, n], false);
    let pw = b.tensor_param("w", dt, &[n], false);
    let po = b.tensor_param("out", dt, &[m, n], true);
    let (_, eps) = b.scalar_param("eps", DType::F32);
    let row = b.program_id(0).unwrap();
    let zero = b.constant(kfuse_ir::Literal::Int(0), DType::I64);
    let d = [AccessDim::Index, AccessDim::Tile(Extent::Full(n))];
    let x = b.load(px, &[row, zero], &d).unwrap();
    let xf = b.cast(x, DType::F32).unwrap();
    let sq = b.binary(kfuse_ir::BinaryOp::Mul, xf, xf).unwrap();
    let ms = b.reduce(kfuse_ir::ReduceOp::Mean, sq, -1, false).unwrap();
    let ms = b.binary(kfuse_ir::BinaryOp::Add, ms, eps).unwrap();
    let r = b.unary(kfuse_ir::UnaryOp::Rsqrt, ms).unwrap();
    let w = b.load(pw, &[zero], &[AccessDim::Tile(Extent::Full(n))]).unwrap();
    let wf = b.cast(w, DType::F32).unwrap();
    let y = b.binary(kfuse_ir::BinaryOp::Mul, xf, r).unwrap();
    let y = b.binary(kfuse_ir::BinaryOp::Mul, y, wf).unwrap();
    let y = b.cast(y, dt).unwrap();
    b.store(po, &[row, zero], &d, y).unwrap();
    b.finish().unwrap()
}

fn spec(ranks: &[Option<usize>], shapes: &[u32]) -> Spec {
    Spec {
        tensors: ranks.iter().map(|r| r.map(|r| TensorSpec { ptr_align: 16, stride_div: (0..r).map(|d| if d + 1 == r { 0 } else { 16 }).collect() })).collect(),
        shape_pow2: shapes.iter().map(|s| s.next_power_of_two()).collect(),
        shape_div: vec![],
        tiles: Default::default(),
        threads: None,
        min_blocks: None,
        grouped: false,
        register_attempt: 0,
        ..Spec::default()
    }
}

#[test]
fn emit_all() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("emit");
    std::fs::create_dir_all(&dir).unwrap();
    let cases: Vec<(Kernel, Spec)> = vec![
        (add_kernel(DType::BF16), spec(&[Some(1), Some(1), Some(1)], &[1 << 28])),
        (add_kernel(DType::F32), spec(&[Some(1), Some(1), Some(1)], &[1000003])),
        (transpose_kernel(DType::BF16), spec(&[Some(2), Some(2)], &[16384, 16384])),
        (rownorm_kernel(DType::BF16), spec(&[Some(2), Some(1), Some(2), None], &[8192, 4096])),
    ];
    for (i, (k, s)) in cases.iter().enumerate() {
        let e = compile(k, s, &Target::sm90a()).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        std::fs::write(dir.join(format!("{i}_{}.cu", k.name)), &e.source).unwrap();
        std::fs::write(dir.join(format!("{i}_{}.ir", k.name)), &e.ir).unwrap();
    }
}

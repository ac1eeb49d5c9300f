//! The sm_90a matrix path on a GEMM built with the IR builder: structure of the emitted
//! source and the plan recorded in the IR (the GPU checks live in the workspace tests).

use kfuse_codegen::{compile, Spec, Target, TensorSpec};
use kfuse_ir::{AccessDim, BinaryOp, Builder, DType, Extent, Kernel};

/// `c = a @ b` (optionally `a^T`/`b^T` stored transposed), with an epilogue that adds
/// `bias[n]` when asked.
pub fn gemm_kernel(dt: DType, ta: bool, tb: bool, bias: bool) -> Kernel {
    let mut b = Builder::new("gemm");
    let (m, n, kk) = (b.shape_sym("M"), b.shape_sym("N"), b.shape_sym("K"));
    let ad = if ta { [kk, m] } else { [m, kk] };
    let pa = b.tensor_param("a", dt, &ad, false);
    let bd = if tb { [n, kk] } else { [kk, n] };
    let pb = b.tensor_param("b", dt, &bd, false);
    let pbias = bias.then(|| b.tensor_param("bias", dt, &[n], false));
    let pc = b.tensor_param("c", dt, &[m, n], true);
    let (bm, bn, bk) = (b.tile_sym("BM"), b.tile_sym("BN"), b.tile_sym("BK"));
    let i = b.program_id(0).unwrap();
    let j = b.program_id(1).unwrap();
    let tm = b.tile_extent(Extent::Tile(bm));
    let tn = b.tile_extent(Extent::Tile(bn));
    let tk = b.tile_extent(Extent::Tile(bk));
    let oi = b.binary(BinaryOp::Mul, i, tm).unwrap();
    let oj = b.binary(BinaryOp::Mul, j, tn).unwrap();
    let acc = b.zeros(DType::F32, &[Extent::Tile(bm), Extent::Tile(bn)]).unwrap();
    let zero = b.literal(kfuse_ir::Literal::Int(0));
    let kdim = b.shape_dim(kk);
    let (id, kv, carried) = b.begin_for(zero, kdim, tk, &[acc]).unwrap();
    let t = |e| AccessDim::Tile(Extent::Tile(e));
    let x = if ta {
        let l = b.load(pa, &[kv, oi], &[t(bk), t(bm)]).unwrap();
        b.permute(l, &[1, 0]).unwrap()
    } else {
        b.load(pa, &[oi, kv], &[t(bm), t(bk)]).unwrap()
    };
    let y = if tb {
        let l = b.load(pb, &[oj, kv], &[t(bn), t(bk)]).unwrap();
        b.permute(l, &[1, 0]).unwrap()
    } else {
        b.load(pb, &[kv, oj], &[t(bk), t(bn)]).unwrap()
    };
    let d = b.dot(x, y).unwrap();
    let s = b.binary(BinaryOp::Add, carried[0], d).unwrap();
    let res = b.end_for(id, &[s]).unwrap();
    let mut out = res[0];
    if let Some(pbias) = pbias {
        let bv = b.load(pbias, &[oj], &[t(bn)]).unwrap();
        let bf = b.cast(bv, DType::F32).unwrap();
        let bb = b.broadcast_to(bf, &[Extent::Tile(bm), Extent::Tile(bn)], "+").unwrap();
        out = b.binary(BinaryOp::Add, out, bb).unwrap();
    }
    let o = b.cast(out, dt).unwrap();
    b.store(pc, &[oi, oj], &[t(bm), t(bn)], o).unwrap();
    b.finish().unwrap()
}

pub fn spec(k: &Kernel, mnk: [u32; 3]) -> Spec {
    let tensors = k
        .params
        .iter()
        .map(|p| p.is_tensor().then(|| TensorSpec { ptr_align: 16, stride_div: (0..p.dims().len()).map(|i| if i + 1 == p.dims().len() { 0 } else { 16 }).collect() }))
        .collect();
    Spec { tensors, shape_pow2: mnk.iter().map(|v| v.next_power_of_two()).collect(), tiles: Default::default(), threads: None, min_blocks: None }
}

#[test]
fn gemm_takes_the_wgmma_path_on_sm90() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let k = gemm_kernel(DType::BF16, ta, tb, true);
        let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap();
        assert!(e.source.contains("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"), "{}", e.source);
        assert!(e.source.contains("cp.async.bulk.tensor"));
        assert!(e.ir.contains("mma WgmmaTma"), "{}", e.ir);
        assert_eq!(e.block_threads, 384);
        assert_eq!(e.persistent, Some(132));
        if ta && tb {
            println!("{}\n{}", e.ir, e.source);
        }
    }
}

#[test]
fn small_m_gets_narrow_tiles_and_deep_pipelines() {
    let k = gemm_kernel(DType::F16, false, false, false);
    let e = compile(&k, &spec(&k, [127, 4096, 4096]), &Target::sm90a()).unwrap();
    assert_eq!((e.tiles["BM"], e.tiles["BN"]), (64, 64), "{:?}", e.tiles);
    assert!(e.source.contains("m64n64k16.f32.f16.f16"));
    assert!(e.ir.contains("8 stages") && e.ir.contains("1 consumer warpgroups"), "{}", e.ir);
    assert_eq!(e.block_threads, 256);
}

#[test]
fn the_loop_splits_across_a_cluster_on_request() {
    let k = gemm_kernel(DType::F16, false, false, false);
    let mut s = spec(&k, [127, 4096, 4096]);
    s.tiles.insert("BM".into(), 128);
    s.tiles.insert("BN".into(), 128);
    s.tiles.insert("SPLITK".into(), 4);
    let e = compile(&k, &s, &Target::sm90a()).unwrap();
    assert!(e.ir.contains("split-K: 4 blocks"), "{}", e.ir);
    assert!(e.source.contains("__cluster_dims__(4, 1, 1)") && e.source.contains("kf_mbar_arrive_cluster"));
    assert_eq!((e.cluster_x, e.persistent), (4, Some(33)));
    // 32 tiles: 32 clusters of 4 blocks
    assert_eq!(e.grid_dims(&[127, 4096, 4096]), [128, 1, 1]);
}

#[test]
fn pre_ampere_is_refused_clearly() {
    // sm_80/sm_89 take the mma.sync path (gemm_sm80.rs); older targets none
    let k = gemm_kernel(DType::BF16, false, false, false);
    let turing = Target { sm: 75, num_sms: 72, smem_per_block: 64 * 1024 };
    let err = compile(&k, &spec(&k, [256, 256, 256]), &turing).unwrap_err().to_string();
    assert!(err.contains("sm_75") && err.contains("sm_80 and newer"), "{err}");
}

#[test]
fn transposed_views_are_read_mn_major_through_the_tensor_map_order() {
    let k = gemm_kernel(DType::BF16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    // a is a transposed view: unit stride on its first dimension
    s.tensors[0] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
    let e = compile(&k, &s, &Target::sm90a()).unwrap();
    assert!(e.ir.contains("A %") && e.ir.contains("MN-major"), "{}", e.ir);
    let maps: Vec<_> = e.params.iter().filter_map(|p| match p {
        kfuse_codegen::KernelParam::TensorMap { box_dims, order, .. } => Some((box_dims.clone(), order.clone())),
        _ => None,
    }).collect();
    assert_eq!(maps[0], (vec![64, 64], vec![0, 1]));
    assert_eq!(maps[1], (vec![64, 64], vec![1, 0]));
}

#[test]
fn unaligned_rows_are_refused_with_the_reason() {
    let k = gemm_kernel(DType::BF16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![1, 0] });
    let err = compile(&k, &s, &Target::sm90a()).unwrap_err().to_string();
    assert!(err.contains("16 bytes"), "{err}");
}

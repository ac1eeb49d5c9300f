//! `tuning_candidates`: what the autotuner may time, without a GPU.

mod common;

use common::gemm_kernel;
use kfuse_codegen::{compile, tuning_candidates, Spec, Target};
use kfuse_ir::{BinaryOp, Builder, DType, Extent, Kernel};

fn spec(k: &Kernel, mnk: [u32; 3]) -> Spec {
    common::spec(k, mnk)
}

#[test]
fn sm90_candidates_start_with_the_heuristic_and_all_compile() {
    let k = gemm_kernel(DType::BF16, false, false, false);
    let s = spec(&k, [512, 768, 1024]);
    let t = Target::sm90a();
    let c = tuning_candidates(&k, &s, &t);
    let heur = compile(&k, &s, &t).unwrap();
    assert_eq!((c[0]["BM"], c[0]["BN"]), (heur.tiles["BM"], heur.tiles["BN"]), "{c:?}");
    assert!(!c[0].contains_key("STAGES"));
    assert!(c.len() >= 5 && c.len() <= 8, "{c:?}");
    for (i, x) in c.iter().enumerate() {
        assert!(!c[..i].contains(x), "duplicate {x:?}");
        let e = compile(&k, &kfuse_codegen::Spec { tiles: x.clone(), ..s.clone() }, &t).unwrap();
        assert_eq!((e.tiles["BM"], e.tiles["BN"]), (x["BM"], x["BN"]));
    }
    assert!(c.iter().any(|x| x["BM"] == 64 && x["BN"] == 256));
    assert!(c.iter().any(|x| x.get("STAGES") == Some(&4)));
    // the same spec gives the same list
    assert_eq!(c, tuning_candidates(&k, &s, &t));
}

#[test]
fn explicit_overrides_win_over_the_tuner() {
    let k = gemm_kernel(DType::F16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tiles.insert("BN".into(), 128);
    let c = tuning_candidates(&k, &s, &Target::sm90a());
    assert!(!c.is_empty());
    assert!(c.iter().all(|x| x["BN"] == 128), "{c:?}");
    // BM 128/64 x STAGES default/4, duplicates dropped
    assert!(c.len() <= 4, "{c:?}");
}

#[test]
fn sm80_candidates_are_mma_sync_shapes() {
    let k = gemm_kernel(DType::F16, false, false, false);
    for t in [Target::sm80(), Target::sm89()] {
        let s = common::spec(&k, [4096, 4096, 4096]);
        let c = tuning_candidates(&k, &s, &t);
        assert_eq!((c[0]["BM"], c[0]["BN"]), (128, 128), "{c:?}");
        assert_eq!(c.len(), 4, "{c:?}");
        for x in &c {
            assert!(compile(&k, &kfuse_codegen::Spec { tiles: x.clone(), ..s.clone() }, &t).unwrap().source.contains("mma.sync"));
        }
    }
}

#[test]
fn candidates_keep_an_explicit_k_tile_and_compile() {
    // a K tile asked for (BK=256: stages of 128 KiB at 128x256, fewer of them) is in
    // every candidate, and every candidate compiles (one the pipeline refuses would
    // have been dropped)
    let k = gemm_kernel(DType::F16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tiles.insert("BK".into(), 256);
    let t = Target::sm90a();
    let c = tuning_candidates(&k, &s, &t);
    assert!(!c.is_empty() && c.iter().all(|x| x["BK"] == 256), "{c:?}");
    for x in &c {
        compile(&k, &kfuse_codegen::Spec { tiles: x.clone(), ..s.clone() }, &t).unwrap();
    }
    // a K tile no instruction takes (8 f16 elements, 16 bytes): the heuristic's own
    // tiles are refused, so there is nothing to tune
    s.tiles.insert("BK".into(), 8);
    assert!(compile(&k, &s, &t).is_err() && tuning_candidates(&k, &s, &t).is_empty());
}

#[test]
fn kernels_without_a_dot_have_no_candidates() {
    let mut b = Builder::new("add");
    let n = b.shape_sym("N");
    let px = b.tensor_param("x", DType::F32, &[n], false);
    let py = b.tensor_param("y", DType::F32, &[n], true);
    let bn = b.tile_sym("BN");
    let i = b.program_id(0).unwrap();
    let tn = b.tile_extent(Extent::Tile(bn));
    let o = b.binary(BinaryOp::Mul, i, tn).unwrap();
    let t = kfuse_ir::AccessDim::Tile(Extent::Tile(bn));
    let x = b.load(px, &[o], &[t]).unwrap();
    let y = b.binary(BinaryOp::Add, x, x).unwrap();
    b.store(py, &[o], &[t], y).unwrap();
    let k = b.finish().unwrap();
    let s = kfuse_codegen::Spec {
        tensors: vec![Some(Default::default()), Some(Default::default())],
        shape_pow2: vec![1024],
        ..Default::default()
    };
    compile(&k, &s, &Target::sm90a()).unwrap();
    assert!(tuning_candidates(&k, &s, &Target::sm90a()).is_empty());
    assert!(tuning_candidates(&k, &s, &Target::sm80()).is_empty());
}

//! The sm_90a matrix path on a GEMM built with the IR builder: structure of the emitted
//! source and the plan recorded in the IR (the GPU checks live in the workspace tests).

mod common;

use common::gemm_kernel;
use kfuse_codegen::{compile, Spec, Target, TensorSpec};
use kfuse_ir::{DType, Kernel};

use kfuse_codegen::passes::select_mma_path::GENERAL_TAKES;

fn spec(k: &Kernel, mnk: [u32; 3]) -> Spec {
    common::spec(k, mnk)
}

#[test]
fn gemm_takes_the_wgmma_path_on_sm90() {
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let k = gemm_kernel(DType::BF16, ta, tb, true);
        let e = compile(&k, &spec(&k, [4096, 4096, 4096]), &Target::sm90a()).unwrap();
        assert!(e.source.contains("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"), "{}", e.source);
        assert!(e.source.contains("cp.async.bulk.tensor"));
        assert!(e.ir.contains(GENERAL_TAKES), "{}", e.ir);
        assert_eq!(e.block_threads, 384);
        assert_eq!(e.persistent, Some(132));
    }
}

#[test]
fn small_m_gets_narrow_tiles_and_deep_rings() {
    let k = gemm_kernel(DType::F16, false, false, false);
    let e = compile(&k, &spec(&k, [127, 4096, 4096]), &Target::sm90a()).unwrap();
    // (K tiles of two 128-byte swizzle spans: ring stages of 32 KiB)
    assert_eq!((e.tiles["BM"], e.tiles["BN"], e.tiles["BK"]), (64, 64, 128), "{:?}", e.tiles);
    assert!(e.source.contains("m64n64k16.f32.f16.f16"));
    assert!(e.plan.to_string().contains("into a 6-stage ring"), "{}", e.plan);
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
    assert!(e.plan.to_string().contains("A from shared memory (MN-major"), "{}", e.plan);
    let maps: Vec<_> = e.params.iter().filter_map(|p| match p {
        kfuse_codegen::KernelParam::TensorMap { tensor, box_dims, order, .. } if tensor.0 < 2 => Some((tensor.0, order.clone())),
        _ => None,
    }).collect();
    assert_eq!(maps, vec![(0, vec![0, 1]), (1, vec![1, 0])], "{maps:?}");
}

#[test]
fn unaligned_rows_are_written_to_their_tile_from_registers() {
    // TMA cannot read `b` (rows 2 bytes apart mod 16): the consumers load it and write
    // its tile each step, still `wgmma` (gemm_fma.rs has the FMA path)
    let k = gemm_kernel(DType::BF16, false, false, false);
    let mut s = spec(&k, [4096, 4096, 4096]);
    s.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![1, 0] });
    let e = compile(&k, &s, &Target::sm90a()).unwrap();
    let plan = e.plan.to_string();
    assert!(e.source.contains("wgmma.mma_async") && plan.contains("B from shared memory (MN-major, 128-byte swizzle, written where it is defined"), "{plan}");
}

#[test]
fn matrix_operands_say_when_readable_operands_reach_the_tensor_cores() {
    use kfuse_codegen::passes::select_mma_path::{matrix_operands, tensor_obstacle};
    let k = gemm_kernel(DType::BF16, false, false, true);
    let m = matrix_operands(&k).expect("a matrix loop");
    assert_eq!(m.params.iter().map(|p| k.param(*p).name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert!(m.tensor_core_dtype() && m.dots == 1);
    let mut s = spec(&k, [4096, 4097, 4096]);
    // as the arguments lie: `b`'s rows 8194 bytes apart, which TMA cannot read
    s.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![1, 0] });
    assert_eq!(tensor_obstacle("b", 2, s.tensors[1].as_ref().unwrap()).as_deref(), Some("the stride of `b` along dimension 0 is not a multiple of 16 bytes"));
    for t in [Target::sm90a(), Target::sm80()] {
        assert!(!m.tensor_cores(&s, &t), "{}", t.arch());
    }
    // on a copy padded to 4160 elements: WGMMA on sm_90a, mma.sync on sm_80, as compiled
    s.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![16, 0] });
    for (t, instr) in [(Target::sm90a(), "wgmma.mma_async"), (Target::sm80(), "mma.sync.aligned.m16n8k16")] {
        assert!(m.tensor_cores(&s, &t), "{}", t.arch());
        let e = compile(&k, &s, &t).unwrap();
        assert!(e.ir.contains(instr) || e.source.contains(instr), "{}", t.arch());
    }
    // f32 operands of `dot`: exact FMAs whatever the layout
    let f = matrix_operands(&gemm_kernel(DType::F32, false, false, false)).unwrap();
    assert!(!f.tensor_core_dtype() && !f.tensor_cores(&s, &Target::sm90a()));
    // TF32 reads on sm_90a only, of operands with K contiguous (`b` is the transpose of
    // an [N, K] tensor here: K is its dimension 1)
    let t = matrix_operands(&common::gemm_kernel_tf32(DType::F32, false, true)).unwrap();
    let mut st = s.clone();
    st.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![16, 0] });
    assert!(t.tensor_cores(&st, &Target::sm90a()) && !t.tensor_cores(&st, &Target::sm80()));
    // with N contiguous instead: not on the tensor cores (the compile refuses it)
    st.tensors[1] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
    assert!(!t.tensor_cores(&st, &Target::sm90a()));
    let refused = compile(&common::gemm_kernel_tf32(DType::F32, false, true), &st, &Target::sm90a()).map(|_| ()).unwrap_err().to_string();
    assert!(refused.contains("unit stride along M/N"), "{refused}");
}

#[test]
fn the_general_lowering_takes_every_operand_layout_and_the_ring_and_walk_overrides() {
    // A and B K-major or MN-major (`.t()` of a stored tensor, or a transposed view): each
    // in its own TMA ring, `wgmma` transposing an MN-major operand (`imm-trans-a/b`)
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for a_first in [false, true] {
            let k = gemm_kernel(DType::BF16, ta, tb, false);
            let mut s = common::spec(&k, [4096, 4096, 4096]);
            if a_first {
                s.tensors[0] = Some(TensorSpec { ptr_align: 16, stride_div: vec![0, 8] });
            }
            let e = compile(&k, &s, &Target::sm90a()).unwrap();
            let plan = e.plan.to_string();
            let a_mn = ta != a_first;
            let what = format!("ta={ta} tb={tb} a_first={a_first}");
            assert!(e.ir.contains(GENERAL_TAKES), "{what}: {}", e.ir);
            let a = if a_mn { "A from shared memory (MN-major" } else { "A from shared memory (K-major" };
            assert!(plan.contains(a) && plan.matches("copied by the producer warpgroup into a").count() == 2, "{what}: {plan}");
            // the instruction's imm-trans-a
            let instr = e.source.lines().find(|l| l.contains("wgmma.mma_async")).unwrap();
            let imm = instr.split("1, 1, 1, ").nth(1).unwrap_or("");
            assert!(imm.starts_with(if a_mn { "1," } else { "0," }), "{what}: {instr}");
        }
    }
    // STAGES sizes the producer's ring (by default as deep as shared memory holds: five
    // stages of 128x128x64 tiles beside the output tile, three of 128x256x64); GROUPM
    // the persistent walk's groups (by default 8)
    let k = gemm_kernel(DType::BF16, false, false, false);
    for (stages, group, bn) in [(2, 3, 256), (4, 1, 128)] {
        let mut s = common::spec(&k, [4096, 4096, 4096]);
        s.tiles.extend([("BM".to_string(), 128), ("BN".to_string(), bn), ("BK".to_string(), 64)]);
        s.tiles.insert("STAGES".into(), stages);
        s.tiles.insert("GROUPM".into(), group);
        let e = compile(&k, &s, &Target::sm90a()).unwrap();
        let plan = e.plan.to_string();
        assert!(e.ir.contains(GENERAL_TAKES), "{}", e.ir);
        assert!(plan.contains(&format!("into a {stages}-stage ring")) && plan.contains(&format!("in groups of {group} along grid axis 0")), "{plan}");
    }
}

//! What the compiler emits for matrix products, on a machine without a GPU: the sm_90a
//! kernel of `kfuse::ops::gemm` and of a user GEMM with a fused bias + GELU epilogue
//! (structure checks that do not pin the whole text, a snapshot of the scheduled IR),
//! NVRTC + `ptxas -v` with no spills for each shape class the tile heuristic
//! distinguishes, and the clear refusal of targets older than sm_80 (sm_80 and sm_89:
//! tests/gemm_sm80_codegen.rs).

mod common;

use common::gemm::{gemm_bias_gelu, spec_mnk};

use kfuse::codegen::{compile, Target};
use kfuse::prelude::*;
use kfuse::DType;

#[test]
fn sm90a_gemm_takes_the_general_lowering() {
    // a plain f16/bf16 product on sm_90a: the general lowering, on the template's tiles,
    // with what the template has (TMA rings a producer warpgroup fills, WGMMA, a
    // persistent grouped walk, the output through shared memory and TMA stores)
    let def = &kfuse::ops::kernels::gemm::DEF;
    for dt in [DType::BF16, DType::F16] {
        let k = (def.build)(&[dt]).unwrap();
        let e = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap();
        assert!(e.ir.contains(kfuse::codegen::passes::select_mma_path::GENERAL_TAKES), "{}", e.ir);
        let plan = e.plan.to_string();
        assert!(plan.contains("tiles: BK=64 BM=128 BN=256") && plan.contains("wgmma m64n256k16 over 2 warpgroup(s)") && plan.contains("(TMA, mbarriers;"), "{plan}");
        assert!(plan.contains("leaves through shared memory by TMA bulk stores") && plan.contains("in groups of 8"), "{plan}");
        assert_eq!(e.persistent, Some(Target::sm90a().num_sms));
        let (_, spill) = common::assemble(&e.source, &e.arch, &e.options, &format!("gemm_general_{dt}")).unwrap();
        assert_eq!(spill, 0);
    }
}

#[test]
fn sm90a_gemm_issues_wgmma_from_tma_rings() {
    // the general lowering's kernel: TMA loads, `wgmma`, a TMA store of the output,
    // producer and consumers rebalancing registers; its scheduled IR pinned
    let def = &kfuse::ops::kernels::gemm::DEF;
    for dt in [DType::BF16, DType::F16] {
        let k = (def.build)(&[dt]).unwrap();
        let e = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap();
        assert!(e.source.contains("wgmma.mma_async"), "sm_90a gemm issues wgmma");
        assert!(e.source.contains("cp.async.bulk.tensor.2d.shared::cluster.global"), "operands arrive by TMA");
        assert!(e.source.contains("cp.async.bulk.tensor.2d.global.shared::cta"), "the epilogue leaves by a TMA store");
        assert!(e.source.contains("setmaxnreg"), "producer and consumers rebalance registers");
        assert_eq!(e.persistent, Some(Target::sm90a().num_sms));
        if dt == DType::BF16 {
            insta::assert_snapshot!("gemm_bf16_sm90a_ir", e.ir);
        }
    }
}

#[test]
fn pre_ampere_gemm_is_refused_clearly() {
    // sm_80 and sm_89 take the mma.sync path (tests/gemm_sm80_codegen.rs); older
    // targets have none, not even the f32 FMA path (tests/gemm_fma_codegen.rs)
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let turing = Target { sm: 75, num_sms: 72, smem_per_block: 64 * 1024 };
    let err = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &turing).unwrap_err().to_string();
    assert!(err.contains("sm_75") && err.contains("sm_80 and newer"), "{err}");
    let k = (def.build)(&[DType::F32]).unwrap();
    let err = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &turing).unwrap_err().to_string();
    assert!(err.contains("sm_75") && err.contains("sm_80 and newer"), "{err}");
}

#[test]
fn a_k_major_b_reaches_the_producer_rings_by_tma() {
    // `b` the transpose of an [N, K] tensor (K of unit stride, dimension 0): the general
    // lowering's ring takes it K-major, its tensor map lists dimension 0 innermost, and a
    // box is one 128-byte span of K by the tile's N rows — for 16-bit and 8-bit operands
    use kfuse::codegen::KernelParam;
    for (def, dts, span) in [(&kfuse::ops::kernels::gemm::DEF, vec![DType::BF16], 64), (&kfuse::ops::kernels::gemm_scaled::DEF, vec![DType::F8E4M3, DType::BF16], 128)] {
        let k = (def.build)(&dts).unwrap();
        let mut spec = spec_mnk(def, 4096, 4096, 4096);
        spec.tensors[1] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
        let e = compile(&k, &spec, &Target::sm90a()).unwrap();
        let plan = e.plan.to_string();
        assert!(plan.contains("a matrix loop on the tensor cores"), "{plan}");
        assert!(plan.contains("B from shared memory (K-major, 128-byte swizzle, copied by the producer warpgroup"), "{plan}");
        let bn = e.tiles["BN"];
        let maps: Vec<_> = e.params.iter().filter_map(|p| match p { KernelParam::TensorMap { tensor, box_dims, order, .. } if tensor.0 == 1 => Some((box_dims.clone(), order.clone())), _ => None }).collect();
        assert_eq!(maps, vec![(vec![span, bn], vec![0, 1])], "{:?}", dts);
    }
}

#[test]
fn batched_operands_take_the_general_lowering() {
    // rank-3 operands in the producer's TMA rings (a box of one batch entry), the
    // persistent walk in groups within each batch entry's plane of tiles (the batch
    // outermost), the output tile out by a 3-D TMA bulk store
    use kfuse::codegen::KernelParam;
    let def = &kfuse::ops::kernels::gemm_batched_scaled::DEF;
    let k = (def.build)(&[DType::BF16, DType::BF16]).unwrap();
    let mut spec = common::snapshot_spec(def);
    spec.shape_pow2 = vec![8, 4096, 4096, 4096];
    let (e, _, spill) = common::compile_assembled(&k, &spec, &Target::sm90a(), "gemm_batched_general").unwrap();
    let plan = e.plan.to_string();
    assert!(plan.contains("a matrix loop on the tensor cores") && plan.contains("rings filled by a producer warpgroup (TMA"), "{plan}");
    assert!(plan.contains("each block walks programs (in groups of 8 along grid axis 0, axis 1 within a group)"), "{plan}");
    assert!(plan.contains("the tile stored to `out` leaves through shared memory by TMA bulk stores"), "{plan}");
    // (the walk decodes in 32 bits: the shape facts bound the programs below 2^31)
    assert!(e.source.contains("const unsigned kf_wp2 = (kf_wi / kf_wplane) % kf_wn2;"), "{}", e.source);
    assert!(e.source.contains("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group"), "{}", e.source);
    let (bm, bn) = (e.tiles["BM"], e.tiles["BN"]);
    let maps: Vec<_> = e.params.iter().filter_map(|p| match p { KernelParam::TensorMap { tensor, box_dims, order, .. } => Some((tensor.0, box_dims.clone(), order.clone())), _ => None }).collect();
    assert!(maps.contains(&(0, vec![1, bm, 64], vec![2, 1, 0])), "{maps:?}");
    assert!(maps.contains(&(2, vec![1, bm, 64], vec![2, 1, 0])) && bn % 64 == 0, "{maps:?}");
    assert_eq!(spill, 0);
}

#[test]
fn fp8_gemm_kernels_assemble_without_spills() {
    // `gemm_scaled` on 8-bit operands (`out = scale · a·b`, the per-tensor scales folded
    // into one f32), B read K-major (a transposed view of an [N, K] tensor)
    let def = &kfuse::ops::kernels::gemm_scaled::DEF;
    let mut failures = Vec::new();
    for (dt, out, m) in [(DType::F8E4M3, DType::BF16, 8192), (DType::F8E5M2, DType::F16, 127), (DType::F8E4M3, DType::F8E4M3, 4096), (DType::F8E4M3, DType::F32, 1024)] {
        let k = (def.build)(&[dt, out]).unwrap();
        let mut spec = spec_mnk(def, m, 8192, 8192);
        spec.tensors[1] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
        let e = compile(&k, &spec, &Target::sm90a()).unwrap();
        let ty = if dt == DType::F8E4M3 { "e4m3" } else { "e5m2" };
        assert!(e.source.contains(&format!("k32.f32.{ty}.{ty}")), "{}", e.source);
        // the general lowering's: both operands K-major in the producer's TMA rings
        let plan = e.plan.to_string();
        assert!(plan.contains("a matrix loop on the tensor cores") && plan.contains(&format!("warpgroup(s) ({dt} operands)")), "{plan}");
        assert!(e.source.contains("cp.async.bulk.tensor.2d.shared::cluster.global"), "{dt}: operands arrive by TMA");
        match common::assemble(&e.source, &e.arch, &e.options, &format!("gemm_fp8_{dt}_{out}_{m}")) {
            Ok((regs, spill)) if spill > 0 => failures.push(format!("{dt}->{out} M{m}: {spill} bytes of spills ({regs} registers)")),
            Ok(_) => {}
            Err(err) => failures.push(format!("{dt}->{out} M{m}: {err}")),
        }
    }
    // a 1x1x1 product with an 8-bit output (its store goes through a layout conversion)
    let k = (def.build)(&[DType::F8E4M3, DType::F8E4M3]).unwrap();
    let mut spec = spec_mnk(def, 1, 1, 1);
    // as the runtime sees the 1x1 views gemm_ex passes: a and b padded copies, out packed
    spec.tensors[0] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![128, 0] });
    spec.tensors[1] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![0, 128] });
    spec.tensors[2] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![0, 0] });
    compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn gemm_kernels_compile_without_spills() {
    // (`common::assemble` also refuses a wgmma pipeline ptxas serialized)
    let mut failures = Vec::new();
    let mut checked = 0;
    // shape classes: wide tiles (BN 256), M = 127 (64x64, 8 stages), and in between
    // (BN 128)
    for (m, n, kk) in [(4096, 4096, 4096), (127, 4096, 4096), (1024, 2048, 1024)] {
        for (name, def) in [("gemm", &kfuse::ops::kernels::gemm::DEF), ("gemm_bias_gelu", &gemm_bias_gelu::DEF)] {
            for dt in [DType::BF16, DType::F16] {
                let k = (def.build)(&[dt]).unwrap();
                // without and with the launch's divisibility facts, which a launch has
                // (whole tiles: no register store beside the TMA store)
                let mut facts = spec_mnk(def, m, n, kk);
                facts.shape_div = [m, kk, n].iter().map(|&v| kfuse::codegen::target::shape_facts(v as u64).1).collect();
                for (what, spec) in [("", spec_mnk(def, m, n, kk)), (" (shape facts)", facts)] {
                    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
                    match common::assemble(&e.source, &e.arch, &e.options, &format!("{name}_{dt}_{m}_{n}")) {
                        Ok((regs, spill)) => {
                            if spill > 0 {
                                failures.push(format!("{name} {dt} M{m} N{n} K{kk}{what} (tiles {:?}): {spill} bytes of spills ({regs} registers)", e.tiles));
                            }
                        }
                        Err(err) => failures.push(format!("{name} {dt} M{m} N{n}{what}: {err}")),
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, 24);
}

#[test]
fn exact_shapes_take_the_tiles_that_fill_whole_waves() {
    // `choose_tiles::exact_shape_tiles`, which a launch records in `Spec::shape_tiles`:
    // at M4095 N4097 the bucket's 128x256 tiles are 32 x 17 = 544 (5 waves of 132, the
    // last holding 16), 256x128 ones 16 x 33 = 528 (4 whole waves)
    use kfuse::codegen::passes::choose_tiles::exact_shape_tiles;
    use std::collections::BTreeMap;
    let sm90 = Target::sm90a();
    let tall: BTreeMap<String, u32> = [("BM".to_string(), 256), ("BN".to_string(), 128)].into();
    for (name, def) in [("gemm", &kfuse::ops::kernels::gemm::DEF), ("gemm_scaled", &kfuse::ops::kernels::gemm_scaled::DEF)] {
        for dt in [DType::BF16, DType::F16] {
            let k = (def.build)(&if name == "gemm" { vec![dt] } else { vec![dt, dt] }).unwrap();
            let at = |m: u32, n: u32, kk: u32, t: &Target| exact_shape_tiles(&k, &spec_mnk(def, m, n, kk), &[m as u64, kk as u64, n as u64], t);
            assert_eq!(at(4095, 4097, 4096, &sm90), tall, "{name} {dt}");
            // shapes whose tiles fill the same waves either way keep the bucket's
            for (m, n, kk) in [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 14336, 4096), (16384, 4096, 4096), (2048, 2048, 2048), (127, 4096, 4096), (1000, 5100, 200)] {
                assert!(at(m, n, kk, &sm90).is_empty(), "{name} {dt} M{m} N{n} K{kk}: {:?}", at(m, n, kk, &sm90));
            }
            // mma.sync targets have their own tiles; an explicit BN wins
            assert!(at(4095, 4097, 4096, &Target::sm80()).is_empty());
            let mut spec = spec_mnk(def, 4095, 4097, 4096);
            spec.tiles.insert("BN".into(), 64);
            assert!(exact_shape_tiles(&k, &spec, &[4095, 4096, 4097], &sm90).is_empty());
            // the kernel it makes: two m64n128 instructions a consumer warpgroup, no spills
            let mut spec = spec_mnk(def, 4095, 4097, 4096);
            spec.shape_tiles = tall.clone();
            let e = compile(&k, &spec, &sm90).unwrap();
            let plan = e.plan.to_string();
            assert!(plan.contains("tiles: BK=64 BM=256 BN=128") && plan.contains("wgmma m64n128k16 over 2 warpgroup(s)"), "{plan}");
            let (_, spill) = common::assemble(&e.source, &e.arch, &e.options, &format!("{name}_{dt}_tall")).unwrap();
            assert_eq!(spill, 0, "{name} {dt}");
        }
    }
    // an epilogue of transcendental math (bias + GELU) keeps the bucket's tiles
    let k = (gemm_bias_gelu::DEF.build)(&[DType::BF16]).unwrap();
    assert!(exact_shape_tiles(&k, &spec_mnk(&gemm_bias_gelu::DEF, 4095, 4097, 4096), &[4095, 4096, 4097], &sm90).is_empty());
    // f32 operands (exact FMAs) keep theirs
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::F32]).unwrap();
    assert!(exact_shape_tiles(&k, &spec_mnk(def, 4095, 4097, 4096), &[4095, 4096, 4097], &sm90).is_empty());
    // what a launch at that shape compiles (the runtime's spec, no GPU)
    use kfuse::runtime::ArgDesc;
    let t = |s: &[usize]| ArgDesc::tensor(DType::BF16, s);
    let e = kfuse::runtime::emit(def, &[t(&[4095, 4096]), t(&[4096, 4097]), t(&[4095, 4097])], &sm90).unwrap();
    assert!(e.plan.to_string().contains("tiles: BK=64 BM=256 BN=128"), "{}", e.plan);
    let e = kfuse::runtime::emit(def, &[t(&[4096, 4096]), t(&[4096, 4096]), t(&[4096, 4096])], &sm90).unwrap();
    assert!(e.plan.to_string().contains("tiles: BK=64 BM=128 BN=256"), "{}", e.plan);
}

#[test]
fn epilogue_bias_loads_are_branch_free_for_whole_tiles() {
    // the fused epilogue's bias: 32 vector loads a thread (64 columns of a 256-wide
    // tile); where the tile lies wholly inside `bias` they run without a branch per
    // vector (`WHOLE_TILE_MIN_GROUPS`), so the assembler issues them together — behind
    // per-vector branches they had cost one L2 round trip each (NOTES g12)
    let def = &gemm_bias_gelu::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let e = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap();
    let src = &e.source;
    let test = src.find("_r8 >= 256) {").unwrap_or_else(|| panic!("no whole-tile test on the bias load:\n{src}"));
    let fast = &src[test..test + 600];
    assert!(fast.contains("for (int g = 0; g < 32; ++g)") && fast.contains("const kf_v4 q = *reinterpret_cast<const kf_v4*>(kf_p"), "{fast}");
    let loop_body = &fast[fast.find("for (int g").unwrap()..fast.find("}").unwrap()];
    assert!(!loop_body.contains("if ("), "a branch inside the whole-tile loop: {loop_body}");
    // the masked loop stays for tiles at the edge
    assert!(src[test..].contains("else {") && src.contains("kf_bf16_f32(kf_p7[(c0 + j)])"), "{src}");
}

#[test]
fn raster_group_on_request() {
    // `GROUPM=n`: the persistent walk's groups span n tile rows (default 8)
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let e = compile(&k, &spec_mnk(def, 8192, 14336, 4096), &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains("in groups of 8 along grid axis 0"), "{}", e.plan);
    let mut spec = spec_mnk(def, 8192, 14336, 4096);
    spec.tiles.insert("GROUPM".into(), 32);
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains("in groups of 32 along grid axis 0"), "{}", e.plan);
}

#[test]
fn general_lowering_at_asked_tiles() {
    // the matrix loop lowered op by op at tiles asked for; on sm_90a its operands come
    // through TMA rings a producer warpgroup fills, and its one dot keeps a group of
    // instructions in flight
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let mut spec = spec_mnk(def, 4096, 4096, 4096);
    spec.tiles.extend([("BM".to_string(), 128), ("BN".to_string(), 256), ("BK".to_string(), 64)]);
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(e.ir.contains(kfuse::codegen::passes::select_mma_path::GENERAL_TAKES), "{}", e.ir);
    assert!(e.plan.to_string().contains("rings filled by a producer warpgroup (TMA"), "{}", e.plan);
    assert_eq!(e.source.matches("kf_tma_load_2d(").count() - 1, 1 + 4, "{}", e.source);
    assert!(e.source.contains("kf_mbar_expect_tx(KF_FULL(kf_s), 49152u);") && e.source.contains("kf_wg_wait1();"), "{}", e.source);
    // one block a multiprocessor walks the tiles, in groups of 8 tile rows (both roles),
    // decoding its program ids in 32 bits
    assert_eq!(e.persistent, Some(Target::sm90a().num_sms));
    assert_eq!(e.source.matches("const unsigned kf_wgs = 8u * kf_wn1;").count(), 2, "{}", e.source);
    // the output tile leaves through shared memory by TMA bulk stores (four 64-column
    // boxes), the register store kept for a tile whose valid range is not the tensor's
    // (the spec says nothing of M's and N's divisibility)
    assert!(e.plan.to_string().contains("the tile stored to `c` leaves through shared memory by TMA bulk stores, written there by `stmatrix`"), "{}", e.plan);
    // written there four 8 x 8 matrices at a time: 16 `stmatrix.x4` for a thread's 128
    // accumulators, from four addresses a thread and constants
    assert_eq!(e.source.matches("asm volatile(\"stmatrix.sync.aligned.m8n8.x4.shared.b16").count(), 16, "{}", e.source);
    assert!(e.source.contains("unsigned kf_sa0, kf_sa1, kf_sa2, kf_sa3;") && e.source.contains("\"r\"(kf_sa3 + 49152)"), "{}", e.source);
    assert_eq!(e.source.matches("shared::cta.bulk_group [%0, {%1, %2}], [%3];\" :: \"l\"(&kf_stm0)").count(), 4, "{}", e.source);
    assert!(e.source.contains("if (kf_tma_ok"), "{}", e.source);
    let (_, spill) = common::assemble(&e.source, &e.arch, &e.options, "gemm_general_128x256").unwrap();
    assert_eq!(spill, 0);
    // an output whose rows TMA cannot write (8194-byte rows): stores from registers
    let mut odd = spec.clone();
    odd.tensors[2].as_mut().unwrap().stride_div[0] = 1;
    let e = compile(&k, &odd, &Target::sm90a()).unwrap();
    assert!(!e.source.contains("kf_stm0") && !e.plan.to_string().contains("TMA bulk stores"), "{}", e.source);
    // sm_80: the same loop on mma.sync, its operands staged in shared memory
    let spec = spec_mnk(def, 4096, 4096, 4096);
    let e = compile(&k, &spec, &Target::sm80()).unwrap();
    assert!(e.ir.contains("  dots: ") && e.source.contains("mma.sync"), "{}", e.ir);
    common::assemble(&e.source, &e.arch, &e.options, "gemm_general_sm80").unwrap();
    // 8-bit and TF32 operands, B K-major: `wgmma` (`k32`, `k8`); B MN-major: the
    // refusal, which says how to make the copy
    let scaled = &kfuse::ops::kernels::gemm_scaled::DEF;
    let tf32 = &kfuse::ops::kernels::gemm_tf32_scaled::DEF;
    for (def, dts, instr) in [(scaled, &[DType::F8E4M3, DType::BF16][..], "k32.f32.e4m3.e4m3"), (tf32, &[DType::F32][..], "k8.f32.tf32.tf32")] {
        let k = (def.build)(dts).unwrap();
        let spec = spec_mnk(def, 4096, 4096, 4096);
        let mut k_major = spec.clone();
        k_major.tensors[1] = Some(kfuse::codegen::TensorSpec { ptr_align: 16, stride_div: vec![0, 16] });
        let e = compile(&k, &k_major, &Target::sm90a()).unwrap();
        assert!(e.ir.contains(kfuse::codegen::passes::select_mma_path::GENERAL_TAKES) && e.source.contains(instr), "{}: {}", def.name, e.plan);
        let err = compile(&k, &spec, &Target::sm90a()).unwrap_err().to_string();
        assert!(err.contains("only with K contiguous"), "{}: {err}", def.name);
    }
}

#[test]
fn a_tile_staged_from_registers_is_fenced_before_wgmma_reads_it() {
    // `a` with no unit-stride dimension: the consumers write its tile each step, rows of
    // it that the other warpgroup's `wgmma` reads; the producer's mbarrier wait for `b`'s
    // copies orders those copies, not the writes, so a consumer barrier comes between
    // the writes and the instructions (NOTES l19)
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let mut spec = spec_mnk(def, 4096, 4096, 4096);
    spec.tensors[0].as_mut().unwrap().stride_div = vec![1, 1];
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains("A from shared memory (K-major, 128-byte swizzle, written where it is defined"), "{}", e.plan);
    let src = &e.source;
    let write = src.find("kf_proxy_fence();").unwrap_or_else(|| panic!("{src}"));
    let wgmma = write + src[write..].find("kf_wg_fence();").unwrap_or_else(|| panic!("{src}"));
    assert!(src[write..wgmma].contains("kf_mbar_wait(KF_FULL(") && src[write..wgmma].contains("kf_bar_sync(1);"), "{}", &src[write..wgmma]);
}

/// A product whose rows come from the row tile of `a` after the output's: at the last
/// row tile they lie past `a`'s end, so the accumulator is valid on less than the
/// output tile's part of `out`.
#[kfuse]
fn shifted_rows<T: Float>(a: Tensor<T, (M, K)>, b: Tensor<T, (K, N)>, out: &mut Tensor<T, (M, N)>) {
    let (i, j) = (program_id(0), program_id(1));
    let mut acc = zeros::<f32>([BM, BN]);
    for k in (0..K).step_by(BK) {
        acc += dot(a.block([i * BM + BM, k], [BM, BK]).load(), b.block([k, j * BN], [BK, BN]).load());
    }
    out.block([i * BM, j * BN], [BM, BN]).store(acc.cast::<T>());
}

#[test]
fn whole_tiles_leave_by_tma_without_a_run_time_check() {
    // where the launch's facts say the tiles divide M and N (`Spec::shape_div`), every
    // program's output tile lies inside `c` and the loop's operand tiles inside `a` and
    // `b`: the accumulator's valid range is the tile, known when the kernel is written,
    // so the TMA store needs no run-time check and the register store beside it (half
    // of NVRTC's time on this kernel) is not written
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let facts = |m: u32, n: u32, kk: u32| {
        let mut s = spec_mnk(def, m, n, kk);
        s.shape_div = [m, kk, n].iter().map(|&v| kfuse::codegen::target::shape_facts(v as u64).1).collect();
        s
    };
    let e = compile(&k, &facts(4096, 4096, 4096), &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains("TMA bulk stores"), "{}", e.plan);
    // (`p_c` appears in the parameter list only: no register store writes through it)
    assert!(!e.source.contains("kf_tma_ok") && e.source.matches("p_c").count() == 1, "{}", e.source);
    assert!(!e.source.contains("_hi0"), "the accumulator's range kept at run time:\n{}", e.source);
    let stores = e.source.matches("shared::cta.bulk_group [%0, {%1, %2}], [%3];\" :: \"l\"(&kf_stm0)").count();
    assert_eq!(stores, 4, "{}", e.source);
    let (_, spill) = common::assemble(&e.source, &e.arch, &e.options, "gemm_whole_tiles").unwrap();
    assert_eq!(spill, 0);
    // M = 4000 (not a multiple of the 128-row tile): the check and the register store
    // stay
    let e = compile(&k, &facts(4000, 4096, 4096), &Target::sm90a()).unwrap();
    assert!(e.source.contains("if (kf_tma_ok") && e.source.contains("else {"), "{}", e.source);
    // rows loaded from another tile than the one stored, the tiles dividing the shape:
    // the accumulator's range is not the tile's, and the check and register store stay
    let def = &shifted_rows::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let mut spec = spec_mnk(def, 4096, 4096, 4096);
    spec.shape_div = vec![4096; 3];
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    assert!(e.plan.to_string().contains("TMA bulk stores"), "{}", e.plan);
    assert!(e.source.contains("if (kf_tma_ok") && e.source.contains("else {"), "{}", e.source);
}

#[test]
fn the_walk_divides_in_32_bits_where_the_programs_are_bounded() {
    // the persistent walk's program ids come from divisions by the grid's counts: 32-bit
    // ones where the shape facts bound the programs below 2^31, 64-bit ones where a
    // shape may be larger than any bound (`Spec::shape_pow2` capped at 2^31)
    let def = &kfuse::ops::kernels::gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let e = compile(&k, &spec_mnk(def, 4096, 4096, 4096), &Target::sm90a()).unwrap();
    assert!(e.source.contains("const unsigned kf_wi = (unsigned)kf_pid;") && !e.source.contains("kf_pid /"), "{}", e.source);
    let mut big = spec_mnk(def, 4096, 4096, 4096);
    big.shape_pow2[0] = 1 << 31;
    let e = compile(&k, &big, &Target::sm90a()).unwrap();
    assert_eq!(e.persistent, Some(Target::sm90a().num_sms));
    assert!(e.source.contains("const long long kf_wg0 = (kf_pid / kf_wgs) * 8LL;") && !e.source.contains("kf_wi"), "{}", e.source);
}

//! Snapshots of the generated CUDA: every op × {sm_80, sm_90a} × dtype, plus the
//! scheduled IR for sm_90a. A snapshot changes only when the compiler's output changes;
//! review it with `cargo insta review`.

mod common;

use kfuse::codegen::{compile, Target};

#[test]
fn cuda_snapshots() {
    for case in common::ops() {
        let spec = common::snapshot_spec(case.def);
        for dt in common::DTYPES {
            let k = (case.def.build)(&case.generics(dt)).unwrap();
            for (arch, target) in [("sm80", Target::sm80()), ("sm90a", Target::sm90a())] {
                let e = compile(&k, &spec, &target).unwrap_or_else(|e| panic!("{} {dt} {arch}: {e}", case.name));
                insta::assert_snapshot!(format!("{}_{}_{}", case.name, dt, arch), e.source);
                if arch == "sm90a" {
                    insta::assert_snapshot!(format!("{}_{}_ir", case.name, dt), e.ir);
                }
            }
        }
    }
}

/// FileCheck-style structure checks that do not pin the whole text.
#[test]
fn structure() {
    let ops = common::ops();
    let find = |n: &str| ops.iter().find(|c| c.name == n).unwrap();
    let bf16 = kfuse::DType::BF16;
    // elementwise bf16: 16-byte vector loads and stores, no shared memory
    let add = find("add");
    let e = compile(&(add.def.build)(&[bf16]).unwrap(), &common::snapshot_spec(add.def), &Target::sm90a()).unwrap();
    assert!(e.source.contains("reinterpret_cast<const kf_v16*>"), "add loads 16-byte vectors");
    assert!(e.source.contains("*reinterpret_cast<kf_v16*>"), "add stores 16-byte vectors");
    assert!(!e.source.contains("__shared__"), "add needs no shared memory");
    assert!(e.ir.contains("load vector=8"));
    // transpose: a layout conversion through shared memory, vector accesses both sides
    let tr = find("transpose");
    let e = compile(&(tr.def.build)(&[bf16]).unwrap(), &common::snapshot_spec(tr.def), &Target::sm90a()).unwrap();
    assert!(e.ir.contains("= convert"), "transpose converts its layout:\n{}", e.ir);
    assert!(e.source.contains("__shared__"));
    assert!(e.source.contains("__syncthreads()"));
    assert!(e.source.contains("reinterpret_cast<const kf_v16*>") && e.source.contains("*reinterpret_cast<kf_v16*>"));
    // sm_90a compiles for the `a` target; sm_80 for its own
    assert_eq!(e.arch, "sm_90a");
    let e80 = compile(&(tr.def.build)(&[bf16]).unwrap(), &common::snapshot_spec(tr.def), &Target::sm80()).unwrap();
    assert_eq!(e80.arch, "sm_80");
}

/// Unaligned or strided tensors must not get vector accesses.
#[test]
fn no_vectors_without_alignment() {
    let ops = common::ops();
    let add = ops.iter().find(|c| c.name == "add").unwrap();
    let mut spec = common::snapshot_spec(add.def);
    spec.tensors[1].as_mut().unwrap().ptr_align = 2;
    let e = compile(&(add.def.build)(&[kfuse::DType::BF16]).unwrap(), &spec, &Target::sm90a()).unwrap();
    let vectors: Vec<&str> = e.ir.lines().filter(|l| l.contains("vector=")).collect();
    assert_eq!(vectors.len(), 3, "{vectors:?}");
    assert!(vectors.iter().filter(|l| l.ends_with("vector=1")).count() == 1, "{vectors:?}");
    assert!(vectors.iter().filter(|l| l.ends_with("vector=8")).count() == 2, "{vectors:?}");
}

/// Old targets get a clear error.
#[test]
fn old_target_refused() {
    let ops = common::ops();
    let add = ops.iter().find(|c| c.name == "add").unwrap();
    let t = Target { sm: 70, num_sms: 80, smem_per_block: 96 * 1024 };
    let err = compile(&(add.def.build)(&[kfuse::DType::F32]).unwrap(), &common::snapshot_spec(add.def), &t).unwrap_err();
    assert!(err.to_string().contains("sm_80 and newer"), "{err}");
}

/// The row kernels as the benchmark compiles them: rows whose length is a power of two
/// (the spec says the extent is exact: no masks), and — with 1024-thread blocks asked
/// for (`KFUSE_THREADS=1024`) — 16384-element rows walked by a persistent grid that
/// loads the next row ahead. Snapshots of the IR and CUDA for softmax bf16 at
/// 4096x16384 with 1024 threads, plus structure checks.
#[test]
fn row_kernels_at_exact_shapes() {
    use kfuse::ops::kernels as k;
    let bf16 = kfuse::DType::BF16;
    let exact = |def: &kfuse::ir::KernelDef, m: u32, n: u32| {
        let mut spec = common::snapshot_spec(def);
        spec.shape_pow2 = vec![m, n];
        spec.shape_div = vec![m, n];
        spec
    };
    let mut spec = exact(&k::softmax::DEF, 4096, 16384);
    spec.threads = Some(1024);
    let e = compile(&(k::softmax::DEF.build)(&[bf16]).unwrap(), &spec, &Target::sm90a()).unwrap();
    insta::assert_snapshot!("softmax_bf16_4096x16384_exact_ir", e.ir);
    insta::assert_snapshot!("softmax_bf16_4096x16384_exact_sm90a", e.source);
    assert!(e.ir.contains("full N -> 16384 (exact: no masks)"), "{}", e.ir);
    assert!(e.ir.contains("persistent: at most 132 blocks"), "{}", e.ir);
    assert_eq!(e.persistent, Some(132));
    assert!(e.source.contains("kf_nxt0") && e.source.contains("kf_pid += kf_step"));
    // no per-element masks left in the reductions
    assert!(!e.source.contains("< kf_hi"), "{}", e.source);
    // by default: 512 threads of 32 elements, one program per block, no masks either
    let e = compile(&(k::softmax::DEF.build)(&[bf16]).unwrap(), &exact(&k::softmax::DEF, 4096, 16384), &Target::sm90a()).unwrap();
    assert!(e.ir.contains("(exact: no masks)") && !e.ir.contains("persistent"), "{}", e.ir);
    assert_eq!((e.persistent, e.block_threads), (None, 512));
    // 4096-element rows: 128 threads
    let e = compile(&(k::rms_norm_w::DEF.build)(&[bf16]).unwrap(), &exact(&k::rms_norm_w::DEF, 8192, 4096), &Target::sm90a()).unwrap();
    assert!(e.ir.contains("(exact: no masks)") && !e.ir.contains("persistent"), "{}", e.ir);
    assert_eq!((e.persistent, e.block_threads), (None, 128));
    // a row length that is not a power of two keeps its masks and its one-program blocks
    let mut spec = exact(&k::softmax::DEF, 4096, 16384);
    spec.shape_div = vec![4096, 2];
    let e = compile(&(k::softmax::DEF.build)(&[bf16]).unwrap(), &spec, &Target::sm90a()).unwrap();
    assert!(!e.ir.contains("exact") && e.source.contains("< kf_hi"), "{}", e.ir);
}

/// A row split across a cluster: the loads stay raw words in registers, the values
/// computed from them are recomputed where they are used (`rematerialized`), each
/// reduction pushes every warp's partial into every block (`st.async` on mbarriers,
/// no block or cluster barrier per reduction).
#[test]
fn cluster_rows_rematerialize_and_push() {
    use kfuse::ops::kernels as k;
    let bf16 = kfuse::DType::BF16;
    let def = &k::layer_norm::DEF;
    let e = compile(&(def.build)(&[bf16]).unwrap(), &spec_n(def, 1024, 131072), &Target::sm90a()).unwrap();
    insta::assert_snapshot!("layer_norm_bf16_1024x131072_exact_ir", e.ir);
    insta::assert_snapshot!("layer_norm_bf16_1024x131072_exact_sm90a", e.source);
    assert!(e.ir.contains("split over 8 blocks") && e.ir.contains("rematerialized"), "{}", e.ir);
    // 256 threads, 64 elements a thread (`CLUSTER_MIN_THREADS`); the row's slice as raw
    // 16-byte words, no f32 array of it
    assert_eq!((e.cluster_x, e.block_threads), (8, 256), "{}", e.ir);
    assert!(e.source.contains("kf_v16 v5w[8];") && !e.source.contains("float v5[64]"), "{}", e.source);
    // two reductions, each by pushed partials; no cluster barrier with release semantics
    assert_eq!(e.source.matches("kf_cl_push_f32(&").count(), 2, "{}", e.source);
    assert!(!e.source.contains("kf_cluster_sync();"), "{}", e.source);
    // register room: three attempts — three blocks a multiprocessor with thread
    // pointers, three without, then one block (the runtime takes the next while the
    // assembler spills)
    assert_eq!(e.register_attempt, (0, 3), "{}", e.ir);
    assert!(e.source.contains("__launch_bounds__(256, 3)") && e.source.contains("const auto kf_t"), "{}", e.source);
    let mut later = spec_n(def, 1024, 131072);
    later.register_attempt = 1;
    let e1 = compile(&(def.build)(&[bf16]).unwrap(), &later, &Target::sm90a()).unwrap();
    assert!(e1.source.contains("__launch_bounds__(256, 3)") && !e1.source.contains("const auto kf_t"), "{}", e1.source);
    later.register_attempt = 2;
    let e2 = compile(&(def.build)(&[bf16]).unwrap(), &later, &Target::sm90a()).unwrap();
    assert!(e2.source.contains("__launch_bounds__(256, 1)") && !e2.source.contains("const auto kf_t"), "{}", e2.source);
    later.register_attempt = 3;
    let err = compile(&(def.build)(&[bf16]).unwrap(), &later, &Target::sm90a()).unwrap_err().to_string();
    assert!(err.contains("attempt 4") && err.contains("has 3"), "{err}");
    // 262144-element rows: the same blocks in clusters of 16 (sm_90's non-portable
    // size, `MAX_CLUSTER_NONPORTABLE`), 256 threads of 64 elements
    let e = compile(&(k::softmax::DEF.build)(&[bf16]).unwrap(), &spec_n(&k::softmax::DEF, 256, 262144), &Target::sm90a()).unwrap();
    assert_eq!((e.cluster_x, e.block_threads), (16, 256), "{}", e.ir);
    assert!(e.source.contains("kf_v16 v4w[8];") && e.source.contains("__cluster_dims__(16, 1, 1)"), "{}", e.source);
    // a masked row of that length keeps the portable 8 blocks
    let mut masked = spec_n(&k::softmax::DEF, 256, 262144);
    masked.shape_div = vec![256, 1];
    let e = compile(&(k::softmax::DEF.build)(&[bf16]).unwrap(), &masked, &Target::sm90a()).unwrap();
    assert_eq!(e.cluster_x, 8, "{}", e.ir);
    // f32 rows gain nothing from raw words: values stay in registers
    let e = compile(&(def.build)(&[kfuse::DType::F32]).unwrap(), &spec_n(def, 1024, 131072), &Target::sm90a()).unwrap();
    assert!(!e.ir.contains("rematerialized") && e.source.contains("kf_cl_push_f32"), "{}", e.ir);
}

/// Cluster rows that write their row back ask L2, before their own loads, for their
/// slice of the row `SMs / cluster` programs ahead (`prefetch_ahead`): one bulk prefetch
/// a block, guarded by the tensor's rows, cut at the row's end for a masked length; a
/// reduction-only kernel (the row sum) and rows in one block do not.
#[test]
fn cluster_rows_prefetch_the_rows_ahead() {
    use kfuse::ops::kernels as k;
    let bf16 = kfuse::DType::BF16;
    let t = Target::sm90a();
    for (def, n, ahead) in [(&k::layer_norm::DEF, 131072, 16), (&k::rms_norm_w::DEF, 262144, 8), (&k::softmax::DEF, 262144, 8)] {
        let e = compile(&(def.build)(&[bf16]).unwrap(), &spec_n(def, 256, n), &t).unwrap();
        assert!(e.ir.contains(&format!("rows {ahead} programs ahead")), "{}", e.ir);
        assert_eq!(e.source.matches("cp.async.bulk.prefetch.L2.global").count(), 1, "{}", e.source);
        assert!(e.source.contains(&format!("+ {ahead}LL);")) && e.source.contains("< n_M &&"), "{}", e.source);
        // before the block's own loads
        assert!(e.source.find("cp.async.bulk.prefetch").unwrap() < e.source.find("kf_v16 v").unwrap(), "{}", e.source);
    }
    // a masked length: the slice is cut at the row's end
    let mut masked = spec_n(&k::rms_norm_w::DEF, 256, 131072);
    masked.shape_div = vec![256, 8];
    let e = compile(&(k::rms_norm_w::DEF.build)(&[bf16]).unwrap(), &masked, &t).unwrap();
    assert!(e.ir.contains("L2 prefetch") && e.source.contains("kf_mini(16384LL, kf_maxi(0LL, n_N - "), "{}", e.source);
    // the row sum writes one value a row: no prefetch; nor rows in one block
    let e = compile(&(k::row_sum::DEF.build)(&[bf16]).unwrap(), &spec_n(&k::row_sum::DEF, 256, 262144), &t).unwrap();
    assert!(e.cluster_x > 1 && !e.ir.contains("L2 prefetch") && !e.source.contains("prefetch"), "{}", e.ir);
    let e = compile(&(k::layer_norm::DEF.build)(&[bf16]).unwrap(), &spec_n(&k::layer_norm::DEF, 8192, 4096), &t).unwrap();
    assert!(e.cluster_x == 1 && !e.source.contains("prefetch"), "{}", e.ir);
}

fn spec_n(def: &kfuse::ir::KernelDef, m: u32, n: u32) -> kfuse::codegen::Spec {
    let mut spec = common::snapshot_spec(def);
    spec.shape_pow2 = vec![m, n];
    spec.shape_div = vec![m, n];
    spec
}

#[test]
fn stores_round_what_only_they_read() {
    // a 16-bit value that only a store reads is kept in f32 (the store's conversion
    // rounds the same way); one that is also computed with is rounded where it is made
    let body = |def: &kfuse::ir::KernelDef| {
        let e = compile(&(def.build)(&[kfuse::DType::BF16]).unwrap(), &common::snapshot_spec(def), &Target::sm90a()).unwrap();
        e.source[e.source.find("__global__").unwrap()..].to_string()
    };
    // RMSNorm's output: stored only
    let rms = body(&kfuse::ops::kernels::rms_norm_w::DEF);
    assert!(!rms.contains("kf_rbf16("), "{rms}");
    // the residual sum `s = x + r` is stored and also normalized: rounded once, then
    // both uses read the rounded value
    let add = body(&kfuse::ops::kernels::add_rms_norm::DEF);
    assert_eq!(add.matches("kf_rbf16(").count(), 1, "{add}");
    // the GEMM epilogue's cast of the accumulators
    let gemm = &kfuse::ops::kernels::gemm::DEF;
    let e = compile(&(gemm.build)(&[kfuse::DType::BF16]).unwrap(), &common::gemm::spec_mnk(gemm, 4096, 4096, 4096), &Target::sm90a()).unwrap();
    assert!(!e.source.contains("= kf_rbf16(kf_acc"), "{}", e.source);
}

/// A tile of `program_id · BN` along a dimension the specialization knows `BN` divides
/// lies inside the tensor for every program: no per-vector masks. Without that fact the
/// masks stay (a length with a tail), as they do for an offset that is not the grid's.
#[test]
fn tiles_that_divide_their_dimension_need_no_masks() {
    let bf16 = kfuse::DType::BF16;
    let def = &kfuse::ops::kernels::add::DEF;
    let k = (def.build)(&[bf16]).unwrap();
    let source = |n: u32, div: u32| {
        let mut spec = common::snapshot_spec(def);
        spec.shape_pow2 = vec![n.next_power_of_two()];
        spec.shape_div = vec![div];
        spec.tiles.insert("BN".into(), 4096);
        compile(&k, &spec, &Target::sm90a()).unwrap().source
    };
    let exact = source(1 << 23, 1 << 23);
    assert!(!exact.contains("= n_N - ") && !exact.contains("< kf_r"), "{exact}");
    // 2^23 + 8 elements: 8 divides, 4096 does not — the last program masks its tail
    let tail = source((1 << 23) + 8, 8);
    assert!(tail.contains("= n_N - ") && tail.contains("(c0 + 7) < kf_r"), "{tail}");
}

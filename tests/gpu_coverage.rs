//! Every `#[kfuse]` kernel the tests run on the interpreter compiles for the GPU: the
//! standard kernels (`kfuse::ops`, `common::ops`) and the user kernels of `tests/kernels/`
//! (loops, masks, row and column kernels, user GEMMs, flash attention, gathers) and
//! `kfuse::ops::attention`'s and `kfuse::ops::conv2d`'s kernels, each in f32, f16
//! and bf16, for sm_80 and sm_90a, at the snapshot shapes and, for the row kernels, at
//! rows of 131072 elements (a cluster's on sm_90a, walked in chunks on sm_80 and inside
//! a loop: `chunk_rows`). Compiled as the runtime does (codegen, NVRTC, `ptxas -v`),
//! without a GPU.
//!
//! The kernels still refused are listed in `REFUSED` with the reason the compiler gives;
//! the test fails when a kernel is refused that the list does not name, or when a listed
//! one compiles (so the list shrinks as the compiler grows), or when a second compile of
//! a kernel gives another source (codegen is deterministic). (The IR-level kernels of
//! `kfuse-ir/tests` are built with the builder, not `#[kfuse]`; they are not here.)

mod common;

#[path = "kernels/flash_attention.rs"]
mod kernels_attention;
#[path = "kernels/gathers.rs"]
mod kernels_gathers;
#[path = "kernels/loops.rs"]
mod kernels_loops;
#[path = "kernels/masks.rs"]
mod kernels_masks;
#[path = "kernels/user_gemms.rs"]
mod kernels_user_gemms;
#[path = "kernels/user_kernels.rs"]
mod kernels_user_kernels;

use kfuse::codegen::{Spec, Target};
use kfuse::ir::KernelDef;
use kfuse::DType;

/// Kernels refused today: (kernel, target, shapes, what the refusal says). None: the
/// attention kernels at the snapshot spec's D = 4096, once refused for a one-by-one
/// dot's operands past 48 KiB of static shared memory, take dynamic shared memory.
const REFUSED: &[(&str, &str, &str, &str)] = &[];

/// The user kernels and the shapes (`Spec::shape_pow2`, by shape symbol) each is
/// compiled at besides the snapshot spec, named.
fn user_kernels() -> Vec<(&'static KernelDef, Vec<(&'static str, Vec<u32>)>)> {
    let long = |n: usize| vec![("long rows", { let mut v = vec![4u32; n - 1]; v.push(131072); v })];
    vec![
        (&kernels_loops::rms_chunked::DEF, vec![]),
        (&kernels_loops::online_softmax::DEF, vec![]),
        (&kernels_loops::row_sumsq_blocks::DEF, vec![]),
        (&kernels_loops::row_sumsq_whole_blocks::DEF, vec![]),
        (&kernels_loops::batch_k_sums::DEF, vec![]),
        (&kernels_loops::prefix_sums::DEF, vec![]),
        (&kernels_loops::long_row_sums::DEF, long(3)),
        (&kernels_masks::causal_softmax::DEF, vec![]),
        (&kernels_masks::position_scale::DEF, vec![]),
        (&kernels_user_kernels::softmax_rows::DEF, long(2)),
        (&kernels_user_kernels::center_rows::DEF, long(2)),
        (&kernels_user_kernels::col_sums::DEF, vec![]),
        (&kernels_user_kernels::row_range::DEF, long(2)),
        (&kernels_user_kernels::weighted_rms::DEF, long(2)),
        (&kernels_user_gemms::gemm_bias_relu::DEF, vec![]),
        (&kernels_user_gemms::swiglu_proj::DEF, vec![]),
        (&kernels_user_gemms::row_sumsq::DEF, vec![]),
        (&kernels_attention::flash_attention::DEF, vec![("B4 S4096 H16 D128", vec![4, 4096, 16, 128, 4096])]),
        // `kfuse::ops::attention`'s kernel (not in `common::ops()`, whose ops take one or
        // two same-shape tensors)
        (&kfuse::ops::kernels::attention::DEF, vec![("B4 S4096 H16 D128", vec![4, 4096, 16, 128, 4096, 16])]),
        (&kfuse::ops::kernels::attention_varlen::DEF, vec![("T16384 H16 D128 B8", vec![16384, 16, 128, 16384, 16, 16, 8, 4096])]),
        (&kernels_masks::lower_triangle::DEF, vec![]),
        (&kernels_masks::prefix_rows::DEF, vec![]),
        (&kernels_gathers::embedding::DEF, vec![]),
        (&kernels_gathers::scatter_rows::DEF, vec![]),
        (&kernels_gathers::box3x3::DEF, vec![]),
        (&kernels_gathers::divide_rows::DEF, vec![]),
        // `kfuse::ops::conv2d`'s kernels, at a ResNet layer besides the snapshot spec
        (&kfuse::ops::kernels::conv2d::DEF, vec![("N64 56x56 C64 K64 3x3", vec![64, 64, 64, 1, 64, 64, 4, 4, 262144])]),
        (&kfuse::ops::kernels::conv2d_depthwise::DEF, vec![("N64 56x56 C256 3x3", vec![64, 64, 64, 256, 4, 4, 262144])]),
        (&kfuse::ops::kernels::conv2d_pointwise::DEF, vec![]),
        (&kfuse::ops::kernels::conv2d_winograd_filter::DEF, vec![]),
        (&kfuse::ops::kernels::conv2d_winograd_input::DEF, vec![("N64 56x56 C64", vec![64, 64, 64, 64, 16, 65536])]),
        (&kfuse::ops::kernels::conv2d_winograd_output::DEF, vec![("N64 56x56 K64", vec![16, 65536, 64, 64, 64, 64])]),
    ]
}

#[test]
fn every_interpreted_kernel_compiles_for_the_gpu_or_is_listed() {
    let mut refused: Vec<(String, String, String, String)> = Vec::new();
    let mut compiled = 0;
    let mut nondeterministic: Vec<String> = Vec::new();
    let mut try_one = |name: &str, def: &KernelDef, generics: Vec<DType>, shapes: &str, spec: &Spec| {
        let Ok(k) = (def.build)(&generics) else { return };
        for target in [Target::sm80(), Target::sm90a()] {
            let what = format!("{name}_{}_{}", generics.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("_"), shapes.replace(' ', "_"));
            match common::compile_assembled(&k, spec, &target, &what) {
                Ok((e, _, _)) => {
                    compiled += 1;
                    // codegen is deterministic: the same kernel and spec give the same
                    // source again (the attempt the assembler took included)
                    let again = kfuse::codegen::compile(&k, &Spec { register_attempt: e.register_attempt.0, ..spec.clone() }, &target).map(|a| a.source);
                    if again.as_ref() != Ok(&e.source) {
                        nondeterministic.push(what.clone());
                    }
                }
                Err(e) => refused.push((name.to_string(), target.arch(), shapes.to_string(), e.0)),
            }
        }
    };
    for case in common::ops() {
        for dt in common::DTYPES {
            try_one(case.name, case.def, case.generics(dt), "snapshot", &common::snapshot_spec(case.def));
        }
    }
    for (def, shapes) in user_kernels() {
        for &dt in common::dtypes_of(def) {
            let generics = vec![dt; def.generics.len()];
            try_one(def.name, def, generics.clone(), "snapshot", &common::snapshot_spec(def));
            for (label, dims) in &shapes {
                let mut spec = common::snapshot_spec(def);
                spec.shape_pow2 = dims.clone();
                try_one(def.name, def, generics.clone(), label, &spec);
            }
        }
    }
    let mut unexpected = Vec::new();
    for (name, arch, shapes, why) in &refused {
        let listed = REFUSED.iter().any(|(n, a, s, w)| n == name && a == arch && s == shapes && why.contains(w));
        eprintln!("refused: {name} {arch} {shapes}: {why}");
        if !listed {
            unexpected.push(format!("{name} {arch} {shapes}: {why}"));
        }
    }
    let stale: Vec<_> = REFUSED.iter().filter(|(n, a, s, _)| !refused.iter().any(|(name, arch, shapes, _)| name == n && arch == a && shapes == s)).collect();
    eprintln!("{compiled} kernels compiled, {} refused", refused.len());
    assert!(nondeterministic.is_empty(), "compiled twice to different sources: {nondeterministic:?}");
    assert!(unexpected.is_empty(), "refused and not listed in REFUSED:\n{}", unexpected.join("\n"));
    assert!(stale.is_empty(), "listed in REFUSED but compiled: {stale:?}");
}

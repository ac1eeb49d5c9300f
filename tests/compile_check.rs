//! Every generated kernel compiles with NVRTC and assembles with `ptxas -v`, with no
//! register spills — on a machine with no GPU. NVRTC and ptxas are required: when they
//! are missing this test fails and says how to get them (`scripts/test.sh` installs
//! them), so the check never silently drops out.

mod common;

use kfuse::codegen::Target;

#[test]
fn every_kernel_compiles_without_spills() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in common::ops() {
        let spec = common::snapshot_spec(case.def);
        for dt in common::DTYPES {
            let k = (case.def.build)(&case.generics(dt)).unwrap();
            for target in [Target::sm80(), Target::sm90a()] {
                let name = format!("{}_{dt}", case.name);
                // as the runtime builds it: the register-room attempts in turn
                match common::compile_assembled(&k, &spec, &target, &name) {
                    Ok((_, regs, spill)) => {
                        assert!(regs > 0, "{name} {}: no registers read from ptxas", target.arch());
                        if spill > 0 {
                            failures.push(format!("{name} {}: {spill} bytes of spills ({regs} registers)", target.arch()));
                        }
                    }
                    Err(e) => failures.push(format!("{name} {}: {}", target.arch(), e.0)),
                }
                checked += 1;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, common::ops().len() * 3 * 2);
}

#[test]
fn ptxas_log_parsing() {
    let log = "ptxas info    : Used 98 registers, used 0 barriers\n    8 bytes stack frame, 12 bytes spill stores, 4 bytes spill loads";
    assert_eq!(common::ptxas_resources(log), (98, 16));
}

/// The row kernels at the benchmark's row lengths (1024 … 262144, powers of two: no
/// masks), every dtype, sm_90a, and masked lengths up to 4096: they compile and assemble
/// without spills. (Masked longer rows are known to spill at 64 registers — softmax at
/// 16384 16 bytes, the norms at 262144 160-530 bytes: NOTES.md.)
#[test]
fn row_kernels_at_benchmark_lengths_do_not_spill() {
    use kfuse::ops::kernels as k;
    let defs: [&kfuse::ir::KernelDef; 5] = [&k::softmax::DEF, &k::log_softmax::DEF, &k::rms_norm_w::DEF, &k::layer_norm::DEF, &k::row_sum::DEF];
    let mut failures = Vec::new();
    for def in defs {
        for dt in common::DTYPES {
            let kern = (def.build)(&[dt]).unwrap();
            for (m, n) in [(32768u32, 1024u32), (8192, 4096), (4096, 16384), (1024, 131072), (256, 262144)] {
                for exact in [true, false] {
                    if !exact && n > 4096 {
                        continue;
                    }
                    let mut spec = common::snapshot_spec(def);
                    spec.shape_pow2 = vec![m, n];
                    spec.shape_div = if exact { vec![m, n] } else { vec![m, 1] };
                    let name = format!("{}_{dt}_{m}x{n}_{exact}", def.name);
                    // as the runtime builds it: the register-room attempts in turn
                    match common::compile_assembled(&kern, &spec, &Target::sm90a(), &name) {
                        Ok((_, _, 0)) => {}
                        Ok((e, regs, spill)) => failures.push(format!("{name} (attempt {:?}): {spill} bytes of spills ({regs} registers)", e.register_attempt)),
                        Err(err) => failures.push(format!("{name}: {}", err.0)),
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

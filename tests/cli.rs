//! The `kfuse` command (cargo feature `cli`): `cargo test --features cli --test cli`.
//! Runs the built binary; no GPU needed.
#![cfg(feature = "cli")]

use std::process::{Command, Output};

fn kfuse(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kfuse")).args(args).output().expect("running kfuse")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn emit_cuda_of_add() {
    let o = kfuse(&["emit", "add", "--dtype", "bf16", "--shape", "1000", "--shape", "1000", "--shape", "1000", "--target", "sm_90a", "--cuda"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let cuda = text(&o.stdout);
    assert!(cuda.contains("__global__") && cuda.contains("for sm_90a"), "{cuda}");
}

#[test]
fn emit_ir_of_gemm() {
    let o = kfuse(&["emit", "gemm", "--dtype", "bf16", "--shape", "256,128", "--shape", "128,64", "--shape", "256,64", "--target", "sm_80", "--ir"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).starts_with("kernel gemm("), "{}", text(&o.stdout));
}

#[test]
fn cache_path_is_the_settings_dir() {
    let dir = std::env::temp_dir().join("kfuse-cli-test-cache");
    let o = Command::new(env!("CARGO_BIN_EXE_kfuse")).args(["cache", "path"]).env("KFUSE_CACHE_DIR", &dir).output().unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), dir.display().to_string());
}

#[test]
fn doctor_reports_each_piece_and_exits_0() {
    let o = kfuse(&["doctor"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    for what in ["GPU", "NVRTC", "ptxas", "cache"] {
        assert!(s.lines().any(|l| l.trim_start().starts_with(what)), "no {what} line:\n{s}");
    }
}

#[test]
fn unknown_kernel_is_a_clear_error() {
    let o = kfuse(&["emit", "no_such_kernel", "--dtype", "bf16", "--shape", "8"]);
    assert_eq!(o.status.code(), Some(1));
    let e = text(&o.stderr);
    assert!(e.contains("no kernel `no_such_kernel`") && e.contains("gemm"), "{e}");
}

/// Every `#[kfuse]` kernel of `kfuse::ops::kernels` (each `pub fn` of `ops/src/kernels.rs`)
/// is one `kfuse emit` and `kfuse explain` know, by the list an unknown name prints.
#[test]
fn every_standard_kernel_is_known() {
    let o = kfuse(&["emit", "no_such_kernel", "--dtype", "bf16", "--shape", "8"]);
    let e = text(&o.stderr);
    let known: Vec<&str> = e.split("known: ").nth(1).unwrap_or_else(|| panic!("no list of known kernels: {e}")).trim().split(", ").collect();
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/ops/src/kernels.rs")).unwrap();
    let defined: Vec<&str> = src.lines().filter_map(|l| l.strip_prefix("pub fn ")).map(|l| l.split(['<', '(']).next().unwrap().trim()).collect();
    assert!(defined.len() > 50, "{defined:?}");
    let missing: Vec<&&str> = defined.iter().filter(|d| !known.contains(d)).collect();
    assert!(missing.is_empty(), "kernels the CLI does not know: {missing:?}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for (args, code) in [
        (&["emit", "add", "--dtype", "bf17", "--shape", "8"][..], 2),
        (&["emit", "add", "--dtype", "bf16", "--shape", "8,x"][..], 2),
        (&["emit", "add", "--dtype", "bf16", "--shape", "8", "--target", "sm_75"][..], 2),
        (&["emit", "add", "--dtype", "bf16", "--shape", "8,8"][..], 1),
        (&["emit", "add", "--dtype", "bf16", "--shape", "8", "--shape", "9", "--shape", "8"][..], 1),
        (&["cache", "warm", "/nonexistent/kfuse-warm-list"][..], 1),
    ] {
        let o = kfuse(args);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {e}");
        assert!(e.starts_with("error:") && !e.contains("panicked"), "{args:?}: {e}");
    }
}

#[test]
fn emit_ptx_or_the_nvrtc_fix() {
    let o = kfuse(&["emit", "copy", "--dtype", "f32", "--shape", "4096", "--shape", "4096", "--target", "sm_90a", "--ptx"]);
    if o.status.success() {
        assert!(text(&o.stdout).contains(".target sm_90a"), "{}", text(&o.stdout));
    } else {
        // no NVRTC here (scripts/cuda-env.sh not sourced): the error names the fix
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(e.contains("nvidia-cuda-nvrtc==13.0.*"), "{e}");
    }
}

/// `kfuse explain <kernel> --shape ...` with the op-level shape (the kernel's sizes in
/// one --shape) runs without a GPU: the plan, registers, shared memory and the roofline
/// estimate, their numbers sane.
#[test]
fn explain_gemm_prints_the_plan_and_the_roofline() {
    let o = kfuse(&["explain", "gemm", "--shape", "4096,4096,4096", "--dtype", "bf16", "--target", "sm_90a"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    // the number after `key` on the first line that has it
    let number = |key: &str| -> f64 {
        let l = s.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no `{key}` line:\n{s}"));
        let rest = &l[l.find(key).unwrap() + key.len()..];
        rest.split_whitespace().next().and_then(|w| w.trim_end_matches(',').parse().ok()).unwrap_or_else(|| panic!("no number after `{key}` in {l:?}"))
    };
    assert!(s.contains(": wgmma m64n256k16 over 2 warpgroup(s)"), "{s}");
    let registers = number("registers:");
    assert!((1.0..=255.0).contains(&registers) && registers.fract() == 0.0, "{s}");
    let smem = number("shared memory:");
    assert!(smem > 0.0 && smem <= 227.0 * 1024.0, "{s}");
    assert_eq!(number("bytes moved:"), (3 * 4096 * 4096 * 2) as f64, "{s}");
    assert_eq!(number("FLOPs:"), 2.0 * 4096f64.powi(3), "{s}");
    // at the H100's 989.5 TFLOP/s: 138.9 µs
    let us = number("time at peak:");
    assert!((us - 2.0 * 4096f64.powi(3) / 989.5e12 * 1e6).abs() < 1e-3, "{s}");
    // --ir, --cuda and --ptx add their sections
    let o = kfuse(&["explain", "add", "--shape", "N=1000", "--dtype", "f32", "--ir", "--cuda", "--ptx"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    for section in ["--- IR after scheduling ---\nkernel add(", "--- CUDA ---", "--- PTX ---"] {
        assert!(s.contains(section), "no {section:?} in\n{s}");
    }
}

#[test]
fn explain_refuses_shapes_that_do_not_fit() {
    for (args, says) in [
        (&["explain", "gemm", "--shape", "4096,4096", "--dtype", "bf16"][..], "takes one --shape of its sizes M,N,K"),
        (&["explain", "gemm", "--shape", "M=8,N=8,Q=8", "--dtype", "bf16"][..], "has no size `Q`"),
        (&["explain", "gemm", "--shape", "8,8", "--shape", "8,8", "--dtype", "bf16"][..], "one --shape per tensor parameter (3 of them)"),
        (&["explain", "no_such_op", "--shape", "8", "--dtype", "bf16"][..], "no kernel `no_such_op`"),
    ] {
        let o = kfuse(args);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(e.starts_with("error:") && e.contains(says) && !e.contains("panicked"), "{args:?}: {e}");
    }
}

/// Without a GPU, `kfuse bench` says so and exits 1; with one, it prints kfuse's line
/// and the vendor's.
#[test]
fn bench_needs_a_gpu() {
    let o = kfuse(&["bench", "gemm", "--shape", "256,256,256", "--dtype", "bf16", "--warmup", "1", "--iters", "3"]);
    if o.status.success() {
        let s = text(&o.stdout);
        assert!(s.contains("kfuse") && s.contains("TFLOP/s") && s.contains("cuBLAS"), "{s}");
    } else {
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(e.starts_with("error: no usable GPU: `kfuse bench` times kernels on GPU 0"), "{e}");
    }
}

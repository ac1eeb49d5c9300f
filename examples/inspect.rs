//! Shows what the compiler decides for the row kernels at the benchmark shapes — the
//! schedule line, and registers and spills from `ptxas -v` — without a GPU.
//!
//!     source scripts/cuda-env.sh && cargo run --release --example inspect [KERNEL_SUBSTRING]
//!
//! With a path ending in `.cu` (a source an earlier run wrote, perhaps edited by hand) it
//! prints that file's registers and spills instead. `inspect gemm M N K` does the same for
//! `kfuse::ops::kernels::gemm` on bf16 `[M, K] · [K, N]` (row-major operands): the plan
//! line of its IR, registers and spills, and the source in the same folder.
//!
//! `MB=N` in the environment overrides `__launch_bounds__`'s minimum blocks (`Spec::min_blocks`);
//! `KFUSE_TILES` applies as on a GPU launch (e.g. `KFUSE_TILES=MCASTB=2 … inspect gemm …`).

use kfuse::codegen::{compile_with_fallbacks, Spec, Target, TensorSpec};
use kfuse::ir::{KernelDef, ParamSig};
use kfuse::ops::kernels as k;
use kfuse::DType;

fn spec(def: &KernelDef, m: u32, n: u32) -> Spec {
    let tensors = def
        .params
        .iter()
        .map(|p| match p {
            ParamSig::Tensor { dims, .. } => Some(TensorSpec {
                ptr_align: 16,
                stride_div: (0..dims.len()).map(|i| if i + 1 == dims.len() { 0 } else { 16 }).collect(),
            }),
            ParamSig::Scalar { .. } => None,
        })
        .collect();
    let mb = std::env::var("MB").ok().and_then(|v| v.parse().ok());
    let tiles = kfuse::runtime::launch::tile_overrides().expect("KFUSE_TILES");
    Spec { tensors, shape_pow2: vec![m, n], shape_div: vec![m, n], tiles, threads: None, min_blocks: mb, grouped: false, register_attempt: 0, ..Spec::default() }
}

/// Writes the source, PTX and cubin of `e` as `f` with the extensions `.cu`, `.ptx` and
/// `.cubin`, and returns the log of `ptxas -v`.
fn assemble(e: &kfuse::codegen::EmittedKernel, f: &std::path::Path, ptxas: &str) -> String {
    let ptx = kfuse::runtime::nvrtc::compile_ptx(&e.source, &e.arch, &e.options).unwrap();
    std::fs::write(f.with_extension("ptx"), ptx).unwrap();
    std::fs::write(f.with_extension("cu"), &e.source).unwrap();
    let out = std::process::Command::new(ptxas).args(["-arch=sm_90a", "-v"]).arg(f.with_extension("ptx")).arg("-o").arg(f.with_extension("cubin")).output().unwrap();
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let ptxas = std::env::var("KFUSE_PTXAS").expect("source scripts/cuda-env.sh first (KFUSE_PTXAS)");
    if filter.ends_with(".cu") {
        // a (hand-edited) source written by an earlier run: registers and spills only
        let src = std::fs::read_to_string(&filter).expect("read the source");
        let ptx = kfuse::runtime::nvrtc::compile_ptx(&src, "sm_90a", &[]).unwrap();
        let f = std::path::Path::new(&filter).with_extension("ptx");
        std::fs::write(&f, ptx).unwrap();
        let out = std::process::Command::new(&ptxas).args(["-arch=sm_90a", "-v"]).arg(&f).arg("-o").arg(f.with_extension("cubin")).output().unwrap();
        print!("{}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    if filter == "gemm" {
        let dims: Vec<u32> = std::env::args().skip(2).map(|a| a.parse().expect("inspect gemm M N K")).collect();
        let [m, n, kk] = dims[..] else { panic!("inspect gemm M N K") };
        let def = &k::gemm::DEF;
        let kern = (def.build)(&[DType::BF16]).unwrap();
        // shape symbols in the kernel's order (M, K, N), operands 16-byte aligned with
        // row strides that are multiples of 16 elements
        let mut s = spec(def, m, kk);
        s.shape_pow2 = vec![m.next_power_of_two(), kk.next_power_of_two(), n.next_power_of_two()];
        s.shape_div = vec![];
        let e = kfuse::codegen::compile(&kern, &s, &Target::sm90a()).unwrap();
        let dir = std::env::temp_dir().join("kfuse-inspect");
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(format!("gemm_{m}x{n}x{kk}.cu"));
        let log = assemble(&e, &f, &ptxas);
        println!("gemm {m}x{n}x{kk}:\n{}{log}source: {}", e.plan, f.display());
        return;
    }
    let defs: [&KernelDef; 4] = [&k::softmax::DEF, &k::rms_norm_w::DEF, &k::layer_norm::DEF, &k::row_sum::DEF];
    let dir = std::env::temp_dir().join("kfuse-inspect");
    std::fs::create_dir_all(&dir).unwrap();
    for def in defs.iter().filter(|d| d.name.contains(&filter)) {
        for (m, n) in [(32768u32, 1024u32), (8192, 4096), (4096, 16384), (1024, 131072), (256, 262144)] {
            let kern = (def.build)(&[DType::BF16]).unwrap();
            let f = dir.join(format!("{}_{m}x{n}.cu", def.name));
            let assemble = |e: &kfuse::codegen::EmittedKernel| assemble(e, &f, &ptxas);
            // as the runtime builds it: the register-room attempts in turn while ptxas spills
            let e = compile_with_fallbacks(&kern, &spec(def, m, n), &Target::sm90a(), |e| -> Result<bool, kfuse::codegen::CodegenError> {
                Ok(assemble(e).lines().any(|l| l.contains("spill stores") && !l.contains(" 0 bytes spill stores")))
            });
            let e = match e {
                Ok(e) => e,
                Err(err) => {
                    println!("{:12} {m}x{n}: {err}", def.name);
                    continue;
                }
            };
            let log = assemble(&e);
            let regs = log.lines().find(|l| l.contains("Used")).map(|l| l.trim().to_string()).unwrap_or_default();
            let spill = log.lines().find(|l| l.contains("spill")).map(|l| l.trim().to_string()).unwrap_or_default();
            let sched = e.ir.lines().find(|l| l.starts_with("schedule")).unwrap_or("");
            let (a, n_att) = e.register_attempt;
            println!("{:12} {m}x{n}: {sched} cluster={} attempt {}/{} | {regs} | {spill}", def.name, e.cluster_x, a + 1, n_att.max(1));
        }
    }
}

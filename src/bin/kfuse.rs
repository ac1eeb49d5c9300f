//! The `kfuse` command (cargo feature `cli`): what the compiler emits for a standard
//! kernel and the plan it takes, how fast it runs beside the vendor library, the module
//! cache, and what this machine has for kfuse. A thin layer over the library:
//! `kfuse::runtime::emit`, `kfuse::explain`, `kfuse::runtime::roofline`,
//! `kfuse::runtime::vendor`, `kfuse::runtime::ModuleCache`, `kfuse::ops::warm`,
//! `kfuse::runtime::nvrtc`.

#[path = "kfuse/bench.rs"]
mod bench;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use kfuse::codegen::Target;
use kfuse::ir::{DTypeSig, KernelDef, ParamSig};
use kfuse::ops::kernels;
use kfuse::runtime::{nvrtc, ArgDesc, ModuleCache};
use kfuse::{DType, Device, Error, Result};

#[derive(Parser)]
#[command(name = "kfuse", version, about = "kfuse's compiler, plans, benchmarks, module cache and setup, from the command line")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the IR, CUDA or PTX of a standard kernel for argument shapes and a target
    #[command(after_help = format!("{SHAPES_HELP}\n\n\
                            Examples:\n  kfuse emit gemm --dtype bf16 --shape 4096,4096,4096 --ptx\n  \
                            kfuse emit gemm --dtype bf16 --shape 4096,4096 --shape 4096,4096 --shape 4096,4096 --ir"))]
    Emit(Compile),
    /// Print the plan, ptxas facts and roofline estimate of a standard kernel (no GPU needed)
    #[command(after_help = format!("{SHAPES_HELP}\n\n\
                            Needs NVRTC and ptxas, no GPU. The roofline counts each tensor once and 2*M*N*K FLOPs a \
                            dot (the library's kfuse::runtime::roofline says what else), against the datasheet peaks \
                            of the H100 SXM (sm_90a) or the A100 SXM (sm_80).\n\n\
                            Example: kfuse explain gemm --shape 4096,4096,4096 --dtype bf16 --target sm_90a"))]
    Explain(Compile),
    /// Time a standard kernel on the GPU beside the vendor library
    Bench(Bench),
    /// Show, clear or warm the module cache
    #[command(subcommand)]
    Cache(Cache),
    /// Check the CUDA driver, GPU, NVRTC, ptxas and cache directory
    Doctor,
}

/// How `--shape` is read, for every command's `--help`.
const SHAPES_HELP: &str = "Shapes: either one --shape listing the kernel's sizes — the output's dimensions first, \
                           then the others (gemm: M,N,K; a row op: rows,cols; an elementwise op: the tensor's \
                           shape), or named (M=4096,N=4096,K=4096) — or one --shape per tensor parameter, outputs \
                           included, in signature order. Scalars take their type from the signature.";

/// The kernel, dtypes and shapes every command that compiles takes.
#[derive(Args)]
struct KernelArgs {
    /// Kernel of kfuse::ops::kernels (add, copy, transpose, softmax, rms_norm_w, gemm, ...)
    kernel: String,
    /// Element type of the dtype generics, in order (one for all when given once)
    #[arg(long, value_name = "DTYPE", required = true, value_parser = parse_dtype)]
    dtype: Vec<DType>,
    /// The kernel's sizes (4096,4096,4096 or M=4096,N=4096,K=4096), or one tensor's
    #[arg(long, value_name = "DIMS", value_parser = parse_shape)]
    shape: Vec<Shape>,
}

/// What `emit` and `explain` take: a kernel for a target, and the listings to print.
#[derive(Args)]
struct Compile {
    #[command(flatten)]
    kernel: KernelArgs,
    /// GPU architecture to compile for
    #[arg(long, value_enum, default_value_t = Arch::Sm90a)]
    target: Arch,
    #[command(flatten)]
    what: What,
}

#[derive(Args)]
#[command(after_help = format!("{SHAPES_HELP}\n\n\
                        Times the kernel on GPU 0 with CUDA events (median), inputs uniform in [-1, 1), and \
                        prints TFLOP/s, GB/s and the fraction of the roofline; for gemm also cuBLAS and \
                        cuBLASLt on the same tensors, and the ratio.\n\n\
                        Example: kfuse bench gemm --shape 4096,4096,4096 --dtype bf16"))]
struct Bench {
    #[command(flatten)]
    kernel: KernelArgs,
    /// Untimed calls before the timed ones
    #[arg(long, value_name = "N", default_value_t = 10)]
    warmup: usize,
    /// Timed calls
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    iters: u32,
}

/// The listings to print (each under a title when there are several, or after
/// `explain`'s report).
#[derive(Args)]
struct What {
    /// Print the IR after scheduling
    #[arg(long)]
    ir: bool,
    /// Print the CUDA C++ (emit's default)
    #[arg(long)]
    cuda: bool,
    /// Print the PTX (needs NVRTC)
    #[arg(long)]
    ptx: bool,
}

impl What {
    /// The listings asked for, each with its title, in the order IR, CUDA, PTX (`ptx`
    /// is called only when the PTX is asked for).
    fn listings(&self, ir: &str, cuda: &str, ptx: impl FnOnce() -> Result<String>) -> Result<Vec<(&'static str, String)>> {
        let mut v = Vec::new();
        if self.ir {
            v.push(("IR after scheduling", ir.to_string()));
        }
        if self.cuda {
            v.push(("CUDA", cuda.to_string()));
        }
        if self.ptx {
            v.push(("PTX", ptx()?));
        }
        Ok(v)
    }
}

/// `listings` after `text`, each under a `--- title ---` line.
fn with_sections(mut text: String, listings: &[(&str, String)]) -> String {
    for (title, body) in listings {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text += &format!("--- {title} ---\n{body}");
    }
    text
}

#[derive(Clone, Copy, ValueEnum)]
enum Arch {
    #[value(name = "sm_80")]
    Sm80,
    #[value(name = "sm_89")]
    Sm89,
    #[value(name = "sm_90a")]
    Sm90a,
}

impl Arch {
    fn target(self) -> Target {
        match self {
            Arch::Sm80 => Target::sm80(),
            Arch::Sm89 => Target::sm89(),
            Arch::Sm90a => Target::sm90a(),
        }
    }
}

#[derive(Subcommand)]
enum Cache {
    /// Print the cache directory
    Path,
    /// Print the cache directory's entries and size
    Stats,
    /// Delete the cache's entries
    Clear,
    /// Compile the kernels of a warm list's op calls into the cache (needs a GPU)
    #[command(after_help = "A line of FILE: OP DTYPE SHAPE..., e.g. `gemm bf16 4096x4096 4096x4096`; `#` starts a comment.")]
    Warm {
        /// The warm list
        file: PathBuf,
    },
}

fn parse_dtype(s: &str) -> std::result::Result<DType, String> {
    DType::from_name(s).ok_or_else(|| format!("expected one of f32, f16, bf16, f8e4m3, f8e5m2, i64, bool, got `{s}`"))
}

/// One `--shape`: sizes in order (`4096,4096`), or sizes by name (`M=4096,N=1024`).
#[derive(Clone, Debug)]
enum Shape {
    Sizes(Vec<usize>),
    Named(Vec<(String, usize)>),
}

fn parse_shape(s: &str) -> std::result::Result<Shape, String> {
    let size = |d: &str| d.trim().parse::<usize>().map_err(|_| format!("expected sizes separated by commas (4096,4096 or M=4096,N=4096), got `{s}`"));
    if s.contains('=') {
        s.split(',')
            .map(|p| match p.split_once('=') {
                Some((n, v)) if !n.trim().is_empty() => Ok((n.trim().to_string(), size(v)?)),
                _ => Err(format!("expected NAME=SIZE pairs separated by commas (M=4096,N=4096), got `{s}`")),
            })
            .collect::<std::result::Result<_, _>>()
            .map(Shape::Named)
    } else {
        s.split([',', 'x']).map(size).collect::<std::result::Result<_, _>>().map(Shape::Sizes)
    }
}

/// The kernels of `kfuse::ops::kernels`, by their names.
macro_rules! defs {
    ($($k:ident),* $(,)?) => { &[$(&kernels::$k::DEF),*] };
}

const KERNELS: &[&KernelDef] = defs![
    add, sub, mul, div, scale, silu, gelu, gelu_tanh, swiglu, add3d, sub3d, mul3d, div3d, swiglu3d, scale3d, silu3d, gelu3d,
    gelu_tanh3d, copy, copy2d, copy3d, transpose, row_sum, row_mean, row_max, row_min, softmax, log_softmax, rms_norm, rms_norm_w,
    rms_norm_wb, add_rms_norm, add_rms_norm_w, layer_norm, sum_chunks, max_chunks, min_chunks, rope_offset, rope_pos,
    rope_table_offset, rope_table_pos, gemm, gemm_scaled, gemm_axpby, gemm_batched_scaled, gemm_batched_axpby, gemm_tf32_scaled,
    gemm_tf32_axpby, gemm_batched_tf32_scaled, gemm_batched_tf32_axpby, swiglu_gemm, attention, attention_varlen, conv2d,
    conv2d_depthwise, conv2d_pointwise, conv2d_winograd_filter, conv2d_winograd_input, conv2d_winograd_output,
];

/// `x: [M, N]`, `out: &mut [M, N]`, `eps: f32`: a signature for messages.
fn signature(def: &KernelDef) -> String {
    let params: Vec<String> = def
        .params
        .iter()
        .map(|p| match p {
            ParamSig::Tensor { name, dims, output, .. } => format!("{name}: {}[{}]", if *output { "&mut " } else { "" }, dims.join(", ")),
            ParamSig::Scalar { name, dtype } => format!("{name}: {}", dtype.name()),
        })
        .collect();
    format!("{}({})", def.name, params.join(", "))
}

/// The sizes of `def` one `--shape` lists, in order: the shape symbols of its first
/// output, then the others in order of first appearance in the signature (literal
/// dimensions are no sizes). gemm `(a: [M, K], b: [K, N], c: &mut [M, N])`: M, N, K.
fn op_sizes(def: &KernelDef) -> Vec<&'static str> {
    let dims = |output: bool| {
        def.params.iter().filter_map(move |p| match p {
            ParamSig::Tensor { dims, output: o, .. } if !output || *o => Some(*dims),
            _ => None,
        })
    };
    let mut syms: Vec<&'static str> = Vec::new();
    for d in dims(true).take(1).chain(dims(false)).flatten() {
        if d.parse::<usize>().is_err() && !syms.contains(d) {
            syms.push(d);
        }
    }
    syms
}

/// Each tensor parameter's shape from the `--shape`s (see [`SHAPES_HELP`]).
fn tensor_shapes(def: &KernelDef, shapes: &[Shape]) -> Result<Vec<Vec<usize>>> {
    let bad = |why: String| Error::InvalidArgument(format!("{why}; the signature is {}", signature(def)));
    let dims: Vec<&[&str]> = def.params.iter().filter_map(|p| if let ParamSig::Tensor { dims, .. } = p { Some(*dims) } else { None }).collect();
    let syms = op_sizes(def);
    let forms = || {
        let (sizes, named): (Vec<&str>, Vec<String>) = syms.iter().map(|s| ("4096", format!("{s}=4096"))).unzip();
        format!(
            "`{}` takes one --shape of its sizes {} (--shape {} or --shape {}) or one --shape per tensor parameter ({} of them)",
            def.name,
            syms.join(","),
            sizes.join(","),
            named.join(","),
            dims.len()
        )
    };
    let sizes: Vec<usize> = match shapes {
        [Shape::Sizes(v)] if dims.len() != 1 => {
            if v.len() != syms.len() {
                return Err(bad(format!("{}; got one --shape of {} size(s)", forms(), v.len())));
            }
            v.clone()
        }
        [Shape::Named(named)] => {
            if let Some((n, _)) = named.iter().find(|(n, _)| !syms.contains(&n.as_str())) {
                return Err(bad(format!("`{}` has no size `{n}`; its sizes are {}", def.name, syms.join(", "))));
            }
            syms.iter()
                .map(|s| match named.iter().filter(|(n, _)| n == s).map(|(_, v)| *v).collect::<Vec<_>>()[..] {
                    [v] => Ok(v),
                    [] => Err(bad(format!("`--shape` names no size {s}; `{}` takes {}", def.name, syms.join(", ")))),
                    _ => Err(bad(format!("`--shape` names {s} more than once"))),
                })
                .collect::<Result<_>>()?
        }
        _ if shapes.len() == dims.len() => {
            return shapes
                .iter()
                .map(|s| match s {
                    Shape::Sizes(v) => Ok(v.clone()),
                    Shape::Named(_) => Err(bad(format!("{}; a named --shape gives all sizes at once", forms()))),
                })
                .collect();
        }
        _ => return Err(bad(format!("{}; got {} --shape", forms(), shapes.len()))),
    };
    let value = |d: &str| d.parse::<usize>().unwrap_or_else(|_| sizes[syms.iter().position(|s| *s == d).expect("every symbol is a size")]);
    Ok(dims.iter().map(|ds| ds.iter().map(|d| value(d)).collect()).collect())
}

/// The `ArgDesc`s of `def` for `--dtype`s and `--shape`s: tensors in signature order,
/// scalars of the signature's type.
fn arg_descs(def: &KernelDef, dtypes: &[DType], shapes: &[Shape]) -> Result<Vec<ArgDesc>> {
    let bad = |why: String| Error::InvalidArgument(format!("{why}; the signature is {}", signature(def)));
    let shapes = tensor_shapes(def, shapes)?;
    let generics = def.generics.len().max(1);
    if dtypes.len() != 1 && dtypes.len() != generics {
        return Err(bad(format!("`{}` takes 1 or {generics} --dtype ({}), {} given", def.name, def.generics.join(", "), dtypes.len())));
    }
    let mut shapes = shapes.iter();
    Ok(def
        .params
        .iter()
        .map(|p| match p {
            ParamSig::Tensor { dtype, .. } => {
                let dt = match dtype {
                    DTypeSig::Generic(i) => dtypes[(*i).min(dtypes.len() - 1)],
                    DTypeSig::Concrete(d) => *d,
                };
                ArgDesc::tensor(dt, shapes.next().expect("one a tensor parameter"))
            }
            ParamSig::Scalar { dtype, .. } => ArgDesc::Scalar(*dtype),
        })
        .collect())
}

impl KernelArgs {
    /// The kernel of `kfuse::ops::kernels` named, and its arguments described.
    fn resolve(&self) -> Result<(&'static KernelDef, Vec<ArgDesc>)> {
        let def = KERNELS.iter().find(|d| d.name == self.kernel).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "no kernel `{}` in kfuse::ops::kernels; known: {}",
                self.kernel,
                KERNELS.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
            ))
        })?;
        Ok((def, arg_descs(def, &self.dtype, &self.shape)?))
    }
}

/// Writes `text` to stdout, a newline after it if it has none.
fn print_text(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let written = out.write_all(text.as_bytes()).and_then(|()| if text.ends_with('\n') { Ok(()) } else { out.write_all(b"\n") });
    match written {
        // `kfuse emit ... | head`: the reader has what it wanted
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn emit(e: &Compile) -> Result<()> {
    let (def, args) = e.kernel.resolve()?;
    let emitted = kfuse::runtime::emit(def, &args, &e.target.target())?;
    let what = if e.what.ir || e.what.ptx { &e.what } else { &What { ir: false, cuda: true, ptx: false } };
    let mut listings = what.listings(&emitted.ir, &emitted.source, || nvrtc::compile_ptx(&emitted.source, &emitted.arch, &emitted.options))?;
    // one listing as it is (for a pipe), several under their titles
    match listings.len() {
        1 => print_text(&listings.remove(0).1),
        _ => print_text(&with_sections(String::new(), &listings)),
    }
}

fn explain(e: &Compile) -> Result<()> {
    let (def, args) = e.kernel.resolve()?;
    let x = kfuse::explain(def, &args, &e.target.target())?;
    let listings = e.what.listings(&x.ir, &x.cuda, || Ok(x.ptx.clone()))?;
    print_text(&with_sections(x.to_string(), &listings))
}

fn cache_dir() -> Result<PathBuf> {
    ModuleCache::default_dir()
        .ok_or_else(|| Error::InvalidArgument("the disk cache is off (KFUSE_CACHE_DIR is set but empty)".into()))
}

fn cache(c: &Cache) -> Result<()> {
    match c {
        Cache::Path => println!("{}", cache_dir()?.display()),
        Cache::Stats => {
            let dir = cache_dir()?;
            let u = ModuleCache::global().disk_usage()?;
            println!("{}: {}, {}", dir.display(), entries(u.entries), human_bytes(u.bytes));
        }
        Cache::Clear => {
            let dir = cache_dir()?;
            let n = ModuleCache::global().clear()?;
            println!("removed {} from {}", entries(n as u64), dir.display());
        }
        Cache::Warm { file } => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| Error::InvalidArgument(format!("reading the warm list {}: {e}", file.display())))?;
            let calls = kfuse::ops::parse_warm_list(&text)?;
            let device = Device::gpu(0).map_err(|e| match e {
                Error::NoGpu { reason } => Error::NoGpu { reason: format!("`kfuse cache warm` compiles by running each call on GPU 0: {reason}") },
                e => e,
            })?;
            kfuse::ops::warm(&device, &calls)?;
            let u = ModuleCache::global().disk_usage()?;
            let dir = ModuleCache::default_dir().map_or("(no disk cache)".to_string(), |d| d.display().to_string());
            println!("warmed {} call(s) on {}; {dir}: {}, {}", calls.len(), device.describe(), entries(u.entries), human_bytes(u.bytes));
        }
    }
    Ok(())
}

fn entries(n: u64) -> String {
    format!("{n} {}", if n == 1 { "entry" } else { "entries" })
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// One line of `kfuse doctor`: what was found, or what is missing and the fix.
fn report(what: &str, found: std::result::Result<String, (String, String)>) {
    match found {
        Ok(s) => println!("{what:>8}  ok       {s}"),
        Err((missing, fix)) => {
            println!("{what:>8}  missing  {missing}");
            for line in fix.lines() {
                println!("{:>8}           {line}", "");
            }
        }
    }
}

/// The CUDA driver's version (`13.0`), read once a GPU opened (the library is loaded).
fn driver_version() -> Option<String> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: one valid out-pointer; called only after the driver initialized.
    let r = std::panic::catch_unwind(move || unsafe {
        let r = kfuse::runtime::cudarc::driver::sys::cuDriverGetVersion(&mut v);
        (r, v)
    });
    match r {
        Ok((kfuse::runtime::cudarc::driver::sys::CUresult::CUDA_SUCCESS, v)) => Some(format!("{}.{}", v / 1000, (v % 1000) / 10)),
        _ => None,
    }
}

fn doctor() {
    report(
        "GPU",
        match Device::gpu(0) {
            Ok(d) => {
                let driver = driver_version().map_or(String::new(), |v| format!(", CUDA driver {v}"));
                Ok(format!("{} of {} device(s){driver}", d.describe(), kfuse::runtime::gpu_count()))
            }
            Err(Error::NoGpu { reason }) => Err((
                reason,
                "on a machine with an NVIDIA GPU: install the NVIDIA driver (libcuda.so.1 on the loader's path)\n\
                 and check `nvidia-smi`; without one, `kfuse emit` still works"
                    .to_string(),
            )),
            Err(e) => Err((e.to_string(), "check `nvidia-smi`".to_string())),
        },
    );
    let nvrtc_fix = || {
        let hint: Vec<&str> = kfuse::runtime::error::NVRTC_INSTALL_HINT.lines().map(str::trim).collect();
        format!("in a kfuse checkout: source scripts/cuda-env.sh\nelsewhere, {}", hint.join("\n  "))
    };
    report(
        "NVRTC",
        match nvrtc::nvrtc_version() {
            Ok((a, b)) => {
                let files = nvrtc::library_files();
                let at = files.first().map_or("found by the dynamic loader".to_string(), |f| f.display().to_string());
                Ok(format!("{a}.{b} ({at})"))
            }
            Err(Error::NvrtcMissing { searched }) => Err((format!("libnvrtc not found ({} places searched)", searched.len()), nvrtc_fix())),
            Err(e) => Err((e.to_string(), nvrtc_fix())),
        },
    );
    report("ptxas", kfuse::runtime::ptxas::find_ptxas().map(|p| p.display().to_string()).ok_or_else(|| {
        (
            "ptxas not found (KFUSE_PTXAS, ./.cuda, CUDA_HOME, PATH); `kfuse explain` and the compile-check tests need it".to_string(),
            "in a kfuse checkout: source scripts/cuda-env.sh (sets KFUSE_PTXAS)\n\
             elsewhere, install it with\n  \
             python3 -m pip install --target .cuda \"nvidia-cuda-nvcc==13.0.*\"\n  \
             export KFUSE_PTXAS=$PWD/.cuda/nvidia/cu13/bin/ptxas"
                .to_string(),
        )
    }));
    report(
        "cache",
        match ModuleCache::default_dir() {
            Some(dir) => Ok(match ModuleCache::global().disk_usage() {
                Ok(u) => format!("{} ({}, {})", dir.display(), entries(u.entries), human_bytes(u.bytes)),
                Err(e) => format!("{} (unreadable: {e})", dir.display()),
            }),
            None => Err((
                "no disk cache: KFUSE_CACHE_DIR is set but empty, so every process compiles its kernels again".to_string(),
                "unset KFUSE_CACHE_DIR, or set it to a directory".to_string(),
            )),
        },
    );
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Emit(e) => emit(e),
        Command::Explain(e) => explain(e),
        Command::Bench(b) => bench::run(b),
        Command::Cache(c) => cache(c),
        Command::Doctor => {
            doctor();
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

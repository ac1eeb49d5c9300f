#![deny(missing_docs)]
//! kfuse-codegen: the scheduling passes and the CUDA C++ writer.
//!
//! [`compile`] runs the pipeline on a verified kernel for one specialization
//! ([`Spec`]: facts about the actual arguments) and one [`Target`], and returns an
//! [`EmittedKernel`]: CUDA source plus everything the runtime needs to launch it.
//! Codegen knows tile ops, never op names.
//!
//! The pipeline (one pass per file under `passes/`, the verifier after each in debug
//! and test builds):
//! `verify → hoist_invariants → chunk_rows → choose_tiles → select_mma_path →
//! persist_programs → rematerialize → assign_layouts → vectorize → verify →
//! prefetch_ahead → order_grid → emit`. Every loop — the matrix loops of every target
//! among them — is written op by op, its carried values in registers
//! (`cuda/emit/loops.rs`), each `dot` lowered where it stands (`cuda/emit/dot.rs`).
//! Graph-level fusion and inlining of `#[kfuse]` calls are later stages of this list.
//!
//! Every [`EmittedKernel`] carries its [`Plan`] (`plan.rs`): the decisions above in a
//! reader's terms, for reports (`kfuse::explain`, a launch's `Launched::plan`).
//!
//! [`tuning_candidates`] (`tuning.rs`) lists tile overrides around the heuristic for a
//! runtime autotuner to time (`KFUSE_AUTOTUNE=1`); codegen itself never measures.

pub mod analysis;
pub mod cuda;
pub mod layout;
pub mod passes;
pub mod plan;
pub mod target;
pub mod tuning;

pub use plan::Plan;
pub use target::{group_record_words, EmittedKernel, GridAxisEval, KernelParam, Spec, Target, TensorSpec};
pub use tuning::tuning_candidates;

use kfuse_ir::{verify::verify, Extent, Kernel, OpId};

/// An error of the passes or the writer.
///
/// # Examples
///
/// ```
/// use kfuse_codegen::{compile, CodegenError, Spec, Target};
/// use kfuse_ir::{AccessDim, Builder, DType};
///
/// let mut b = Builder::new("zero");
/// let n = b.shape_sym("N");
/// let out = b.tensor_param("out", DType::F32, &[n], true);
/// let i = b.program_id(0)?;
/// let z = b.constant(kfuse_ir::Literal::Float(0.0), DType::F32);
/// b.store(out, &[i], &[AccessDim::Index], z)?;
/// let k = b.finish()?;
///
/// let turing = Target { sm: 75, ..Target::sm80() };
/// let e = compile(&k, &Spec::default(), &turing).unwrap_err();
/// assert!(matches!(e, CodegenError::At { ref kernel, .. } if kernel == "zero"));
/// assert!(matches!(e.unlocated(), CodegenError::Target(arch, _) if arch == "sm_75"));
/// # Ok::<(), kfuse_codegen::CodegenError>(())
/// ```
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum CodegenError {
    /// The kernel's IR is invalid, or its grid cannot be derived.
    #[error(transparent)]
    Ir(#[from] kfuse_ir::IrError),
    /// The kernel is valid IR that codegen cannot (yet) compile for this
    /// specialization and target; the message says what.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The target cannot run the kernel: the architecture (`sm_80`) and why.
    #[error("target {0}: {1}")]
    Target(String, String),
    /// An error located in the user's kernel: its name and, where one op is at fault,
    /// the op ([`Kernel::op_label`]) and its source line. Reads
    /// ``kernel `rows`, `load x` at line 42: unsupported: …``.
    #[error("kernel `{kernel}`{}: {error}", where_(op, line))]
    At {
        /// The kernel's name.
        kernel: String,
        /// The op at fault, as [`Kernel::op_label`] names it.
        op: Option<String>,
        /// The op's line in the user's source, where the front end recorded it.
        line: Option<u32>,
        /// The error itself.
        error: Box<CodegenError>,
    },
}

fn where_(op: &Option<String>, line: &Option<u32>) -> String {
    match (op, line) {
        (Some(o), Some(l)) => format!(", `{o}` at line {l}"),
        (Some(o), None) => format!(", `{o}`"),
        (None, Some(l)) => format!(", line {l}"),
        (None, None) => String::new(),
    }
}

impl CodegenError {
    /// Locates an error in `k`, at `op` where one op is at fault. An error already
    /// located keeps its place (the innermost is the most precise) and only gains the
    /// op it lacked.
    pub fn at(self, k: &Kernel, op: Option<OpId>) -> CodegenError {
        let label = op.map(|o| k.op_label(o));
        let line = op.and_then(|o| k.locs.get(&o)).map(|l| l.line);
        match self {
            CodegenError::At { kernel, op: None, line: None, error } if label.is_some() => {
                CodegenError::At { kernel, op: label, line, error }
            }
            e @ CodegenError::At { .. } => e,
            e => CodegenError::At { kernel: k.name.clone(), op: label, line, error: Box::new(e) },
        }
    }

    /// The error without its location ([`CodegenError::At`] unwrapped).
    pub fn unlocated(&self) -> &CodegenError {
        match self {
            CodegenError::At { error, .. } => error.unlocated(),
            e => e,
        }
    }
}

fn check(k: &Kernel, pass: &str) -> Result<(), CodegenError> {
    if cfg!(debug_assertions) {
        verify(k, pass)?;
    }
    Ok(())
}

/// Runs the scheduling passes on a copy of `kernel` and returns the scheduled kernel.
/// Its errors name the kernel ([`CodegenError::At`]).
///
/// # Examples
///
/// The tiles and threads chosen for a row maximum over rows of 3000 elements (a full
/// extent: the tile spans the row, padded to 4096):
///
/// ```
/// use kfuse_codegen::{schedule, Spec, Target};
/// use kfuse_ir::{AccessDim, Builder, DType, Extent, ReduceOp};
///
/// let mut b = Builder::new("row_max");
/// let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
/// let x = b.tensor_param("x", DType::BF16, &[m, n], false);
/// let out = b.tensor_param("out", DType::BF16, &[m], true);
/// let row = b.program_id(0)?;
/// let col = b.constant(kfuse_ir::Literal::Int(0), DType::I64);
/// let xs = b.load(x, &[row, col], &[AccessDim::Index, AccessDim::Tile(Extent::Full(n))])?;
/// let top = b.reduce(ReduceOp::Max, xs, -1, false)?;
/// b.store(out, &[row], &[AccessDim::Index], top)?;
/// let k = b.finish()?;
///
/// let spec = Spec { shape_pow2: vec![1024, 4096], ..Spec::default() };
/// let s = schedule(&k, &spec, &Target::sm80())?;
/// assert!(s.schedule.is_scheduled());
/// assert_eq!(s.schedule.full[&n], 4096);
/// println!("{}", kfuse_ir::print::print(&s)); // the decisions, as snapshots pin them
/// # Ok::<(), kfuse_codegen::CodegenError>(())
/// ```
pub fn schedule(kernel: &Kernel, spec: &Spec, target: &Target) -> Result<Kernel, CodegenError> {
    schedule_passes(kernel, spec, target).map_err(|e| e.at(kernel, None))
}

fn schedule_passes(kernel: &Kernel, spec: &Spec, target: &Target) -> Result<Kernel, CodegenError> {
    if target.sm < 80 {
        return Err(CodegenError::Target(
            format!("sm_{}", target.sm),
            "kfuse generates code for sm_80 and newer (Ampere, Ada, Hopper)".into(),
        ));
    }
    if target.sm < 89 && analysis::uses_fp8(kernel) {
        return Err(CodegenError::Target(
            format!("sm_{}", target.sm),
            format!("kernel `{}` uses 8-bit floats (f8e4m3/f8e5m2), which need sm_89 or newer", kernel.name),
        ));
    }
    verify(kernel, "input")?;
    let mut k = kernel.clone();
    k.schedule.grouped = spec.grouped;
    passes::hoist_invariants::run(&mut k)?;
    check(&k, "hoist_invariants")?;
    passes::chunk_rows::run(&mut k, spec, target)?;
    check(&k, "chunk_rows")?;
    passes::choose_tiles::run(&mut k, spec, target)?;
    check(&k, "choose_tiles")?;
    let spec = &own_attempt(spec, &k);
    passes::select_mma_path::run(&mut k, spec, target)?;
    check(&k, "select_mma_path")?;
    passes::persist_programs::run(&mut k, target)?;
    passes::rematerialize::run(&mut k, spec)?;
    passes::ring_occupancy::run(&mut k, spec, target)?;
    let attempts = k.schedule.register_attempt.1.max(1);
    if spec.register_attempt >= attempts {
        return Err(CodegenError::Unsupported(format!(
            "register-room attempt {} of kernel `{}`, which has {attempts}",
            spec.register_attempt + 1,
            k.name
        )));
    }
    passes::assign_layouts::run(&mut k, spec, target)?;
    check(&k, "assign_layouts")?;
    passes::vectorize::run(&mut k, spec)?;
    verify(&k, "vectorize")?;
    passes::prefetch_ahead::run(&mut k, spec, target)?;
    passes::order_grid::run(&mut k, spec)?;
    Ok(k)
}

/// Compiles a kernel for one specialization and target. Its errors name the kernel
/// and, where one op is at fault, the op and its source line ([`CodegenError::At`]).
///
/// No GPU and no NVRTC are needed: the result is CUDA source and what a launch of it
/// needs (the runtime compiles the source with NVRTC).
///
/// # Examples
///
/// `out = a + b` in blocks of `BN`, for contiguous, 16-byte aligned tensors of 2^20
/// elements:
///
/// ```
/// use kfuse_codegen::{compile, Spec, Target, TensorSpec};
/// use kfuse_ir::{AccessDim, BinaryOp, Builder, DType, Extent};
///
/// let mut b = Builder::new("add");
/// let n = b.shape_sym("N");
/// let bn = Extent::Tile(b.tile_sym("BN"));
/// let pa = b.tensor_param("a", DType::BF16, &[n], false);
/// let pb = b.tensor_param("b", DType::BF16, &[n], false);
/// let out = b.tensor_param("out", DType::BF16, &[n], true);
/// let i = b.program_id(0)?;
/// let step = b.tile_extent(bn);
/// let off = b.binary(BinaryOp::Mul, i, step)?;
/// let va = b.load(pa, &[off], &[AccessDim::Tile(bn)])?;
/// let vb = b.load(pb, &[off], &[AccessDim::Tile(bn)])?;
/// let sum = b.binary(BinaryOp::Add, va, vb)?;
/// b.store(out, &[off], &[AccessDim::Tile(bn)], sum)?;
/// let k = b.finish()?;
///
/// // one TensorSpec per tensor parameter: aligned pointer, unit stride
/// let t = Some(TensorSpec { ptr_align: 16, stride_div: vec![0] });
/// let spec = Spec { tensors: vec![t.clone(), t.clone(), t], shape_pow2: vec![1 << 20], ..Spec::default() };
/// let e = compile(&k, &spec, &Target::sm90a())?;
/// assert!(e.source.contains(&e.entry));
/// assert_eq!(e.arch, "sm_90a");
/// // one program per BN elements, along x
/// let bn = e.tiles["BN"] as u64;
/// assert_eq!(e.grid_dims(&[1 << 20]), [(1 << 20) / bn, 1, 1]);
/// # Ok::<(), kfuse_codegen::CodegenError>(())
/// ```
pub fn compile(kernel: &Kernel, spec: &Spec, target: &Target) -> Result<EmittedKernel, CodegenError> {
    compile_scheduled(kernel, spec, target).map_err(|e| e.at(kernel, None))
}

/// `spec` with its register-room attempt counted from the kernel's own schedule: the
/// passes after `choose_tiles` see attempt 0 for the first attempt of the kernel's own
/// tiles, after the wider block of rows (`Schedule::row_attempts`) where there is one.
fn own_attempt(spec: &Spec, k: &Kernel) -> Spec {
    let rows = k.schedule.row_attempts;
    let a = spec.register_attempt;
    Spec { register_attempt: if a < rows { a } else { a - rows }, ..spec.clone() }
}

fn compile_scheduled(kernel: &Kernel, spec: &Spec, target: &Target) -> Result<EmittedKernel, CodegenError> {
    let mut k = schedule(kernel, spec, target)?;
    let (abs, spec) = (spec.register_attempt, &own_attempt(spec, &k));
    let grid = kfuse_ir::grid::derive(&k)?;
    let mut axes = Vec::new();
    for a in &grid.axes {
        let step = match a.step {
            None => 1,
            Some(Extent::Full(s)) => {
                return Err(CodegenError::Unsupported(format!("a grid axis stepping by the full extent of {}", k.shape_name(s))))
            }
            Some(e) => analysis::extent_value(&k, e) as u64,
        };
        axes.push(GridAxisEval { dim: a.dim, step });
    }
    let out = cuda::emit::emit(&k, spec, target, &axes)?;
    // the launch grid lists the axes in launch order (x, y, z): `order_grid` may have
    // put another program axis along x (a kernel without program ids has no axis)
    if !axes.is_empty() {
        axes.swap(0, k.schedule.grid_x as usize);
    }
    // the writer sizes the shared memory it declares (statically, in the source, plus
    // the dynamic pipeline buffers of the matrix path); recorded for the printer
    k.schedule.smem_bytes = out.static_smem + out.dynamic_smem;
    // a kernel whose launch bounds the writer chose itself (warp-specialized) has them
    // in its schedule, and no register-room attempts (each would give the same source)
    // but one without the dots issued late or the loads issued ahead where it had them,
    // and before those one taking the shared addresses at each use where this one takes
    // them once
    if let Some(b) = out.min_blocks {
        k.schedule.min_blocks = b;
        k.schedule.register_attempt.1 = k.schedule.register_attempt.0 + if out.late_dots || out.ahead_loads { 2 } else { 1 } + u32::from(out.addresses_once);
    }
    // counted with the wider block of rows' attempt before the kernel's own
    if k.schedule.row_attempts > 0 {
        let (_, n) = k.schedule.register_attempt;
        k.schedule.register_attempt = (abs, n.max(1) + k.schedule.row_attempts);
    }
    let tiles = k.schedule.tiles.iter().map(|(t, v)| (k.tile_name(*t).to_string(), *v)).collect();
    let cluster_x = k.schedule.split_blocks.max(1);
    let plan = Plan::of_scheduled(&k, &target.arch(), &out, cluster_x);
    Ok(EmittedKernel {
        entry: cuda::emit::entry_name(&k),
        source: out.source,
        arch: target.arch(),
        options: vec!["--std=c++17".into()],
        block_threads: out.block_threads,
        smem_bytes: out.dynamic_smem,
        params: out.params,
        grid: axes,
        cluster_x,
        persistent: out.persistent,
        grouped: spec.grouped,
        ir: kfuse_ir::print::print(&k),
        tiles,
        register_attempt: k.schedule.register_attempt,
        plan,
    })
}

/// [`compile`], then the kernel's later register-room attempts while the assembler
/// spills: `spills` assembles an emitted kernel (the runtime loads it and reads its
/// local memory; the compile checks run `ptxas -v`) and says whether it spilled. The
/// result is the first attempt that does not spill, or the last one. A kernel without
/// attempts (`register_attempt.1 ≤ 1`) is compiled once and `spills` is not called.
///
/// # Examples
///
/// ```
/// use kfuse_codegen::{compile_with_fallbacks, CodegenError, Spec, Target};
/// use kfuse_ir::{AccessDim, Builder, DType};
///
/// let mut b = Builder::new("copy");
/// let n = b.shape_sym("N");
/// let x = b.tensor_param("x", DType::F32, &[n], false);
/// let out = b.tensor_param("out", DType::F32, &[n], true);
/// let at = b.program_id(0)?;
/// let v = b.load(x, &[at], &[AccessDim::Index])?;
/// b.store(out, &[at], &[AccessDim::Index], v)?;
/// let k = b.finish()?;
///
/// let mut assembled = 0;
/// let e = compile_with_fallbacks(&k, &Spec::default(), &Target::sm80(), |_| {
///     assembled += 1; // here: load the module, or run `ptxas -v`, and read its spills
///     Ok::<bool, CodegenError>(false)
/// })?;
/// assert_eq!(e.register_attempt.0, 0);
/// assert!(assembled <= 1); // a kernel without register-room attempts is not assembled
/// # Ok::<(), CodegenError>(())
/// ```
pub fn compile_with_fallbacks<E: From<CodegenError>>(
    kernel: &Kernel,
    spec: &Spec,
    target: &Target,
    mut spills: impl FnMut(&EmittedKernel) -> Result<bool, E>,
) -> Result<EmittedKernel, E> {
    let mut spec = spec.clone();
    loop {
        let e = compile(kernel, &spec, target)?;
        let (a, n) = e.register_attempt;
        if a + 1 >= n || !spills(&e)? {
            return Ok(e);
        }
        spec.register_attempt = a + 1;
    }
}

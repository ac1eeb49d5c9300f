//! Seeing what a launch would run, without a GPU: [`explain()`] compiles a kernel for
//! described arguments and a target as a launch would, and reports its [`Plan`], the IR
//! after scheduling, the CUDA, the PTX, what `ptxas -v` says of it and a [`Roofline`]
//! estimate. [`roofline()`] gives the estimate alone (no compile), for comparing a
//! measured time with it.
//!
//! Owns: [`Explain`] and its report (`Display`), [`explain()`], [`roofline()`].
//!
//! The kernel reported is the one a GPU launch loads: the specialization of [`crate::emit`]
//! (the same checks and facts), then its register-room attempts in turn while the
//! assembler spills (`ptxas -v` reporting a stack frame here, the driver's local memory
//! on a GPU; both are the same ptxas at CUDA 13.0). Tiles `KFUSE_AUTOTUNE=1` would
//! measure on a GPU are not included. Needs NVRTC ([`crate::nvrtc`]) and ptxas
//! ([`crate::ptxas`]); their absence is an error saying how to get them.

use std::fmt;

use kfuse_codegen::{Plan, Target};
use kfuse_ir::KernelDef;

use crate::error::Result;
use crate::launch::{desc_shapes, planned_descs, ArgDesc};
use crate::ptxas::{Assembly, PtxasInfo};
use crate::roofline::Roofline;

/// What a GPU launch of a kernel on described arguments would compile and run, and
/// what it costs at the device's peak ([`explain()`]). `Display` writes a report of the
/// plan, the `ptxas -v` facts and the roofline; the IR, CUDA and PTX are in their fields.
#[derive(Clone, Debug, PartialEq)]
pub struct Explain {
    /// The kernel's name.
    pub kernel: String,
    /// The arguments it was explained for.
    pub args: Vec<ArgDesc>,
    /// The architecture compiled for (`sm_90a`).
    pub arch: String,
    /// The plan, with the registers and local memory `ptxas -v` reported.
    pub plan: Plan,
    /// The IR after scheduling, printed.
    pub ir: String,
    /// The CUDA C++ source.
    pub cuda: String,
    /// The PTX NVRTC made of it.
    pub ptx: String,
    /// What `ptxas -v` reported of the kernel.
    pub ptxas: PtxasInfo,
    /// Dynamic shared memory a launch asks for, in bytes (beside `ptxas`' static).
    pub dynamic_smem_bytes: u32,
    /// Compulsory bytes and FLOPs and the time they take at the peak.
    pub roofline: Roofline,
}

/// What a GPU launch of `def` on arguments described by `args` compiles for `target`,
/// assembled and estimated (see the module docs): no GPU needed, NVRTC and ptxas are.
/// `args` are those of [`crate::emit`], one per parameter; so are the checks and their
/// errors. A missing ptxas is [`Error::Ptxas`](crate::Error::Ptxas), a missing NVRTC
/// [`Error::NvrtcMissing`](crate::Error::NvrtcMissing).
///
/// ```
/// use kfuse_codegen::Target;
/// use kfuse_runtime::{explain, ArgDesc, DType, Result};
///
/// /// `def`: a kernel such as `kfuse::ops::kernels::gemm::DEF` (`a: [M, K]`, `b: [K, N]`,
/// /// `c: &mut [M, N]`)
/// fn registers_of_gemm(def: &kfuse_ir::KernelDef) -> Result<u32> {
///     let t = |r, c| ArgDesc::tensor(DType::BF16, &[r, c]);
///     let e = explain(def, &[t(4096, 4096), t(4096, 4096), t(4096, 4096)], &Target::sm90a())?;
///     println!("{e}"); // plan, ptxas facts, roofline
///     assert_eq!(e.roofline.bytes, 3 * 4096 * 4096 * 2);
///     Ok(e.ptxas.registers)
/// }
/// ```
pub fn explain(def: &KernelDef, args: &[ArgDesc], target: &Target) -> Result<Explain> {
    let planned = planned_descs(def, args, target)?;
    let (kernel, spec) = (&planned.built.0, &planned.spec);
    // each attempt compiled and assembled once: the last one assembled is kept
    let mut last = None;
    let emitted = kfuse_codegen::compile_with_fallbacks(kernel, spec, target, |e| -> Result<bool> {
        Ok(assembled(&mut last, e)?.info.stack_frame_bytes > 0)
    })?;
    assembled(&mut last, &emitted)?;
    let (_, ptx, assembly) = last.expect("assembled above");
    let shapes = desc_shapes(kernel, args)?;
    let roofline = Roofline::count(kernel, &shapes, emitted.plan.tensor_cores(), target)?;
    let info = assembly.info;
    Ok(Explain {
        kernel: def.name.to_string(),
        args: args.to_vec(),
        arch: emitted.arch.clone(),
        plan: Plan { operand_copies: planned.notes(), ..emitted.plan.assembled(info.registers, info.stack_frame_bytes) },
        ir: emitted.ir,
        cuda: emitted.source,
        ptx,
        ptxas: info,
        dynamic_smem_bytes: emitted.smem_bytes,
        roofline,
    })
}

/// The PTX and `ptxas -v` report of `e`, from `last` when that holds its source, else
/// compiled and assembled into `last`.
fn assembled<'a>(last: &'a mut Option<(String, String, Assembly)>, e: &kfuse_codegen::EmittedKernel) -> Result<&'a Assembly> {
    if last.as_ref().is_none_or(|l| l.0 != e.source) {
        let ptx = crate::nvrtc::compile_ptx(&e.source, &e.arch, &e.options)?;
        let a = crate::ptxas::assemble(&ptx, &e.arch)?;
        *last = Some((e.source.clone(), ptx, a));
    }
    Ok(&last.as_ref().expect("set above").2)
}

/// The [`Roofline`] of a GPU launch of `def` on arguments described by `args` for
/// `target`: compulsory bytes and FLOPs and the time at the device's peak, with the
/// compute peak of the matrix path the scheduler picks (scheduled, not compiled: no
/// NVRTC needed). Compare a measured time with [`Roofline::fraction_of_peak`];
/// `ArgDesc::from(&arg)` describes a launch's arguments.
///
/// ```no_run
/// # fn main() -> kfuse_runtime::Result<()> {
/// use kfuse_runtime::{roofline, ArgDesc, Device};
/// # let (def, mut args): (&kfuse_ir::KernelDef, Vec<kfuse_runtime::Arg<'_>>) = unimplemented!();
/// let device = Device::gpu(0)?;
/// let descs: Vec<ArgDesc> = args.iter().map(ArgDesc::from).collect();
/// let roof = roofline(def, &descs, &device.target().expect("a GPU"))?;
/// let times = device.time_ms(3, 20, || kfuse_runtime::launch(def, &mut args).map(drop))?;
/// if let Some(f) = roof.fraction_of_peak(times[times.len() / 2] as f64) {
///     println!("{:.0}% of the roof", 100.0 * f);
/// }
/// # Ok(())
/// # }
/// ```
pub fn roofline(def: &KernelDef, args: &[ArgDesc], target: &Target) -> Result<Roofline> {
    let planned = planned_descs(def, args, target)?;
    let kernel = &planned.built.0;
    let emitted = kfuse_codegen::compile(kernel, &planned.spec, target)?;
    let shapes = desc_shapes(kernel, args)?;
    Roofline::count(kernel, &shapes, emitted.plan.tensor_cores(), target)
}

impl fmt::Display for Explain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self.args.iter().map(ArgDesc::to_string).collect();
        writeln!(f, "{}({}) for {}", self.kernel, args.join(", "), self.arch)?;
        write!(f, "{}", self.plan)?;
        let p = &self.ptxas;
        writeln!(f, "ptxas -v: {}", if p.function.is_empty() { "(unnamed entry)" } else { &p.function })?;
        writeln!(f, "  registers: {} a thread", p.registers)?;
        writeln!(f, "  shared memory: {} bytes static, {} bytes dynamic", p.static_smem_bytes, self.dynamic_smem_bytes)?;
        writeln!(
            f,
            "  spills: {} bytes stored, {} bytes loaded; stack frame {} bytes",
            p.spill_store_bytes, p.spill_load_bytes, p.stack_frame_bytes
        )?;
        for w in &p.warnings {
            writeln!(f, "  {w}")?;
        }
        write!(f, "{}", self.roofline)
    }
}

//! Launching a kernel: argument checking, dtype binding, specialization, dispatch to
//! the GPU or the interpreter.
//!
//! Owns: [`Arg`], [`Scalar`], [`launch`] and its result [`Launched`],
//! [`launch_interpreter`] (the interpreter with tiles given), the specialization facts
//! of actual arguments ([`spec_for`], [`launch_spec`]) and the tiles a GPU plan takes
//! from them ([`gpu_plan_tiles`]), what a launch on described arguments ([`ArgDesc`])
//! would compile ([`emit`]: the same checks and specialization, no GPU), and the
//! argument order of the CUDA kernel call.
//!
//! [`launch`] does, in order:
//! 1. check the arguments against the signature ([`check_args`]): count and kind of each
//!    argument, ranks, dtype generics bound from the first tensor that uses each and
//!    checked against the rest, shape symbols consistent across tensors, one device,
//!    no output sharing storage with another argument, no output with a zero stride;
//! 2. build the IR for the bound dtypes (`KernelDef::build`; once per def and dtypes
//!    per process, then cached with its grid);
//! 3. skip the launch when the grid or an output is empty ([`Launched::skipped_empty`]);
//! 4. on CPU tensors, run the IR interpreter ([`Backend::Interpreter`]) with the tile
//!    sizes of `KFUSE_TILES` (16 for the others); [`launch_interpreter`] runs it with
//!    tiles given instead, e.g. those a GPU would use ([`gpu_plan_tiles`]);
//! 5. on GPU tensors, first copy any read-only operand of the kernel's matrix loop that
//!    TMA cannot read as it lies (rows not a multiple of 16 bytes apart, unaligned data)
//!    to rows padded to 128-byte lines, when that brings the loop onto the tensor cores,
//!    and run the rest of this step on the copies ([`crate::operand_copy`]; the plan lists
//!    them); then take the kernel this device launched last for arguments of the
//!    same signature under the same settings (`LaunchSig`: dtypes, alignment, sizes and
//!    stride classes, which the spec is a function of), else compute the [`Spec`] (with
//!    the tile choices codegen makes from the exact shape, `choose_tiles::exact_shape_tiles`,
//!    under any explicit `KFUSE_TILES`; with `KFUSE_AUTOTUNE=1`, a `dot` kernel's tiles
//!    come from its tuned bucket, tuned here on first sight: [`crate::autotune`]), look the kernel up in the device's cache, or
//!    else generate code, compile it through the module cache and load it; then launch it on
//!    the device's stream with the grid ([`EmittedKernel::grid_dims`]: persistent
//!    kernels and clusters included), block and shared memory the codegen chose and the
//!    parameters in [`EmittedKernel::params`] order (a TMA tensor map is passed by
//!    value: encoded by [`crate::tma`], or copied from the loaded kernel's recent maps
//!    when the tensor's address, shape and strides are those of one of them).
//!
//! The `KFUSE_*` settings steps 4 and 5 consult come from [`crate::settings`] (read once
//! a process). A repeated GPU launch of a small elementwise kernel costs the H100's host
//! 3.6-4.0 µs, 2.7-3.3 of them in the driver's `cuLaunchKernel` (NOTES g27); keep
//! per-launch work free of environment reads, eager formatting and allocations it can
//! avoid (the parameters go to the driver from the stack).
//!
//! Invariants: nothing reaches the GPU or the interpreter before every check of step 1
//! has passed; a launch never blocks on the GPU unless `KFUSE_SYNC=1` is set (then it
//! synchronizes after the kernel and reports its errors as that kernel's).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use kfuse_codegen::passes::select_mma_path::{matrix_operands, MatrixOperands};
use kfuse_codegen::{EmittedKernel, KernelParam, Spec, Target, TensorSpec};
use kfuse_ir::{DType, DTypeSig, Kernel, KernelDef, ParamSig};

use crate::cache::{CacheOutcome, LoadedKernel, ModuleKey};
use crate::operand_copy::OperandCopy;
use crate::device::Device;
use crate::error::{driver, Error, Result};
use crate::tensor::Tensor;

/// A scalar argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// For an `f32` parameter.
    F32(f32),
    /// For an `i64` parameter.
    I64(i64),
}

impl Scalar {
    /// `F32` or `I64`.
    pub fn dtype(self) -> DType {
        match self {
            Scalar::F32(_) => DType::F32,
            Scalar::I64(_) => DType::I64,
        }
    }

    /// The value as `f64` (what the interpreter takes).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::F32(v) => v as f64,
            Scalar::I64(v) => v as f64,
        }
    }
}

impl From<f32> for Scalar {
    fn from(v: f32) -> Scalar {
        Scalar::F32(v)
    }
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Scalar {
        Scalar::I64(v)
    }
}

/// One argument of a launch, per kernel parameter, in signature order: `In` for an
/// input tensor (`x: Tensor<…>`), `Out` for an output (`y: &mut Tensor<…>`), `Scalar`
/// for a by-value parameter.
#[derive(Debug)]
pub enum Arg<'a> {
    /// An input tensor: read only.
    In(&'a Tensor),
    /// An output tensor: written (and may be read too).
    Out(&'a mut Tensor),
    /// A scalar, passed by value.
    Scalar(Scalar),
}

impl Arg<'_> {
    /// The tensor of a tensor argument.
    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            Arg::In(t) => Some(t),
            Arg::Out(t) => Some(t),
            Arg::Scalar(_) => None,
        }
    }

}

/// A description of one argument of a kernel, for [`emit`]: a tensor's dtype, shape,
/// strides and the offset of its element 0 from an allocation, or a scalar's dtype — the
/// facts the checks and the specialization of a launch read of an [`Arg`], without the
/// memory.
///
/// # Examples
///
/// The arguments of a transpose of the first 100 columns of a `[4096, 4096]` bf16 matrix
/// (`x.narrow(1, 0, 100)`) into a packed `[100, 4096]` output:
///
/// ```
/// use kfuse_runtime::{ArgDesc, DType};
///
/// let x = ArgDesc::strided(DType::BF16, &[4096, 100], &[4096, 1]);
/// let args = [x.clone(), ArgDesc::tensor(DType::BF16, &[100, 4096])];
/// // the same slice from column 8 on: 16 bytes into the allocation
/// let from_col_8 = x.at_byte_offset(16);
/// assert!(matches!(from_col_8, ArgDesc::Tensor(ref t) if t.byte_offset == 16));
/// assert!(matches!(&args[1], ArgDesc::Tensor(t) if t.strides == [4096, 1]));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgDesc {
    /// A tensor, for an input or an output parameter alike.
    Tensor(TensorDesc),
    /// A scalar of this dtype (`f32` or `i64`).
    Scalar(DType),
}

/// A tensor argument described ([`ArgDesc::tensor`], [`ArgDesc::strided`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    /// The element type.
    pub dtype: DType,
    /// The size of each dimension.
    pub shape: Vec<usize>,
    /// In elements, one per dimension.
    pub strides: Vec<isize>,
    /// The byte offset of element 0 from the start of its allocation, which is taken to
    /// be aligned to 256 bytes, as kfuse's memory pool and `cuMemAlloc` align theirs (0:
    /// a whole allocation; a view at element `k` of a bf16 tensor is at `2 * k`).
    pub byte_offset: u64,
}

/// The address [`TensorDesc`]s are taken to be allocated at: aligned to 256 bytes (the
/// specialization reads its alignment only, up to 16 bytes).
const DESC_BASE: u64 = 1 << 32;

impl ArgDesc {
    /// A contiguous (row-major) tensor of `shape`, at the start of its allocation.
    pub fn tensor(dtype: DType, shape: &[usize]) -> ArgDesc {
        ArgDesc::strided(dtype, shape, &crate::tensor::contiguous_strides(shape))
    }

    /// A tensor of `shape` with these element strides (a transposed or sliced view),
    /// at the start of its allocation.
    pub fn strided(dtype: DType, shape: &[usize], strides: &[isize]) -> ArgDesc {
        ArgDesc::Tensor(TensorDesc { dtype, shape: shape.to_vec(), strides: strides.to_vec(), byte_offset: 0 })
    }

    /// The same tensor with its element 0 `bytes` past the start of its allocation
    /// ([`TensorDesc::byte_offset`]); a scalar is returned as it is.
    pub fn at_byte_offset(self, bytes: u64) -> ArgDesc {
        match self {
            ArgDesc::Tensor(t) => ArgDesc::Tensor(TensorDesc { byte_offset: bytes, ..t }),
            s => s,
        }
    }
}

impl fmt::Display for ArgDesc {
    /// `bf16[4096, 4096]` (with `strides [1, 4096]` when not contiguous, `at byte 6` off
    /// the start of its allocation), or the dtype of a scalar.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgDesc::Tensor(t) => {
                write!(f, "{}{:?}", t.dtype, t.shape)?;
                if crate::tensor::contiguous_strides(&t.shape) != t.strides {
                    write!(f, " strides {:?}", t.strides)?;
                }
                if t.byte_offset != 0 {
                    write!(f, " at byte {}", t.byte_offset)?;
                }
                Ok(())
            }
            ArgDesc::Scalar(d) => write!(f, "{d}"),
        }
    }
}

impl From<&Tensor> for ArgDesc {
    /// The description of a tensor as it is: dtype, shape, strides and the alignment of
    /// its element 0 (its address modulo 256 as [`TensorDesc::byte_offset`]), so that
    /// [`emit`] and [`crate::explain()`] specialize as a launch on it does.
    fn from(t: &Tensor) -> ArgDesc {
        ArgDesc::Tensor(TensorDesc { dtype: t.dtype(), shape: t.shape().to_vec(), strides: t.strides().to_vec(), byte_offset: t.address() % 256 })
    }
}

impl From<&Arg<'_>> for ArgDesc {
    /// The description of a launch argument: its tensor's ([`ArgDesc::from`] a
    /// [`Tensor`]) or its scalar's dtype.
    fn from(a: &Arg<'_>) -> ArgDesc {
        match a {
            Arg::In(t) => ArgDesc::from(*t),
            Arg::Out(t) => ArgDesc::from(&**t),
            Arg::Scalar(s) => ArgDesc::Scalar(s.dtype()),
        }
    }
}

/// What the checks and the specialization read of a tensor argument: a [`Tensor`] or a
/// [`TensorDesc`].
pub(crate) trait TensorFacts {
    fn dtype(&self) -> DType;
    fn shape(&self) -> &[usize];
    fn strides(&self) -> &[isize];
    /// The address of element 0 (its alignment is what counts).
    fn address(&self) -> u64;
}

impl TensorFacts for Tensor {
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
    fn strides(&self) -> &[isize] {
        Tensor::strides(self)
    }
    fn address(&self) -> u64 {
        Tensor::address(self)
    }
}

impl TensorFacts for TensorDesc {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn strides(&self) -> &[isize] {
        &self.strides
    }
    fn address(&self) -> u64 {
        DESC_BASE + self.byte_offset
    }
}

/// An argument as the signature checks ([`check_signature`]) and the specialization
/// ([`gpu_spec`]) see it: a launch's [`Arg`] or an [`ArgDesc`] of [`emit`].
pub(crate) trait ArgFacts {
    type T: TensorFacts;
    /// The tensor of a tensor argument.
    fn tensor(&self) -> Option<&Self::T>;
    /// The dtype of a scalar argument.
    fn scalar(&self) -> Option<DType>;
    /// Whether it can be passed for a parameter of kind `kind`.
    fn fits(&self, kind: &PKind<'_>) -> bool;
    /// What to pass for a parameter of kind `kind`, for error messages.
    fn expected(kind: &PKind<'_>) -> &'static str;
    fn describe(&self) -> String;
}

impl ArgFacts for Arg<'_> {
    type T = Tensor;
    fn tensor(&self) -> Option<&Tensor> {
        Arg::tensor(self)
    }
    fn scalar(&self) -> Option<DType> {
        match self {
            Arg::Scalar(s) => Some(s.dtype()),
            _ => None,
        }
    }
    fn fits(&self, kind: &PKind<'_>) -> bool {
        matches!(
            (kind, self),
            (PKind::Tensor { output: true, .. }, Arg::Out(_)) | (PKind::Tensor { output: false, .. }, Arg::In(_)) | (PKind::Scalar(_), Arg::Scalar(_))
        )
    }
    fn expected(kind: &PKind<'_>) -> &'static str {
        match kind {
            PKind::Tensor { output: true, .. } => "an output tensor: pass `Arg::Out(&mut t)`",
            PKind::Tensor { output: false, .. } => "an input tensor: pass `Arg::In(&t)`",
            PKind::Scalar(DType::I64) => "an i64 scalar: pass `Arg::Scalar(Scalar::I64(v))`",
            PKind::Scalar(_) => "a scalar: pass `Arg::Scalar(Scalar::F32(v))`",
        }
    }
    fn describe(&self) -> String {
        match self {
            Arg::In(t) => format!("an input tensor (`Arg::In`, {} {:?})", t.dtype(), t.shape()),
            Arg::Out(t) => format!("an output tensor (`Arg::Out`, {} {:?})", t.dtype(), t.shape()),
            Arg::Scalar(s) => format!("a scalar (`Arg::Scalar({s:?})`)"),
        }
    }
}

impl ArgFacts for ArgDesc {
    type T = TensorDesc;
    fn tensor(&self) -> Option<&TensorDesc> {
        match self {
            ArgDesc::Tensor(t) => Some(t),
            ArgDesc::Scalar(_) => None,
        }
    }
    fn scalar(&self) -> Option<DType> {
        match self {
            ArgDesc::Scalar(d) => Some(*d),
            ArgDesc::Tensor(_) => None,
        }
    }
    fn fits(&self, kind: &PKind<'_>) -> bool {
        matches!((kind, self), (PKind::Tensor { .. }, ArgDesc::Tensor(_)) | (PKind::Scalar(_), ArgDesc::Scalar(_)))
    }
    fn expected(kind: &PKind<'_>) -> &'static str {
        match kind {
            PKind::Tensor { .. } => "a tensor: pass `ArgDesc::tensor(dtype, &shape)`",
            PKind::Scalar(DType::I64) => "an i64 scalar: pass `ArgDesc::Scalar(DType::I64)`",
            PKind::Scalar(_) => "a scalar: pass `ArgDesc::Scalar(DType::F32)`",
        }
    }
    fn describe(&self) -> String {
        match self {
            ArgDesc::Tensor(t) => format!("a tensor (`ArgDesc::Tensor`, {} {:?})", t.dtype, t.shape),
            ArgDesc::Scalar(d) => format!("a scalar (`ArgDesc::Scalar({d:?})`)"),
        }
    }
}

/// Where a launch ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// On a GPU; `device` describes it (`cuda:0 (NVIDIA H100 …)`).
    Gpu {
        /// [`Device::describe`]'s text.
        device: String,
    },
    /// In the IR interpreter on the CPU.
    Interpreter,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Gpu { device } => write!(f, "GPU {device}"),
            Backend::Interpreter => f.write_str("CPU interpreter"),
        }
    }
}

/// What a launch did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launched {
    /// Where it ran: a GPU or the interpreter.
    pub backend: Backend,
    /// The kernel's name.
    pub kernel: String,
    /// True when nothing ran because the grid or an output was empty.
    pub skipped_empty: bool,
    /// For a GPU launch: where its compiled kernel came from ([`CacheOutcome::Memory`]
    /// when the device had it loaded already). `None` otherwise.
    pub cache: Option<CacheOutcome>,
    /// For a GPU launch: what the driver's assembler made of the kernel. `None`
    /// otherwise.
    pub build: Option<BuildInfo>,
    /// For a GPU launch: the plan of the kernel that ran — matrix path and why, tiles,
    /// stages, warps and warpgroups, cluster, persistence, shared memory, and the
    /// registers and local memory (spills) the driver's assembler gave it. Built once
    /// when the kernel is loaded and shared by its launches (a launch clones the `Arc`),
    /// except that a launch which copied matrix operands to padded rows first
    /// ([`crate::operand_copy`]) gets its own copy of it with those copies listed
    /// (`Plan::operand_copies`). `None` otherwise. [`crate::explain()`] gives the same
    /// without a GPU.
    ///
    /// ```no_run
    /// # fn main() -> kfuse_runtime::Result<()> {
    /// # let (def, mut args): (&kfuse_ir::KernelDef, Vec<kfuse_runtime::Arg<'_>>) = unimplemented!();
    /// let launched = kfuse_runtime::launch(def, &mut args)?;
    /// if let Some(plan) = &launched.plan {
    ///     println!("{plan}cache: {:?}", launched.cache);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub plan: Option<Arc<kfuse_codegen::Plan>>,
}

/// What the driver's assembler made of a loaded kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildInfo {
    /// The register-room attempt that was loaded (0-based) and how many the kernel has
    /// (`EmittedKernel::register_attempt`; later attempts are loaded when earlier ones
    /// spill).
    pub register_attempt: (u32, u32),
    /// Registers a thread.
    pub registers: u32,
    /// Local memory a thread, in bytes: spills (the kernels kfuse writes have no other
    /// local memory).
    pub local_bytes: u32,
}

/// Records in `launched` what the loaded kernel `k` that ran is: its [`BuildInfo`] and
/// its plan.
fn record_kernel(launched: &mut Launched, k: &LoadedKernel) {
    launched.build = Some(BuildInfo { register_attempt: k.emitted.register_attempt, registers: k.registers, local_bytes: k.local_bytes });
    launched.plan = Some(k.plan.clone());
}

/// A parameter as the checker sees it, from a [`KernelDef`] or a [`Kernel`].
struct PDesc<'s> {
    name: &'s str,
    kind: PKind<'s>,
}

pub(crate) enum PKind<'s> {
    Tensor { dtype: DTypeSig, dims: std::borrow::Cow<'s, [&'s str]>, output: bool },
    Scalar(DType),
}

fn def_params(def: &KernelDef) -> Vec<PDesc<'static>> {
    def.params
        .iter()
        .map(|p| match *p {
            ParamSig::Tensor { name, dtype, dims, output } => PDesc { name, kind: PKind::Tensor { dtype, dims: dims.into(), output } },
            ParamSig::Scalar { name, dtype } => PDesc { name, kind: PKind::Scalar(dtype) },
        })
        .collect()
}

fn kernel_params(k: &Kernel) -> Vec<PDesc<'_>> {
    k.params
        .iter()
        .map(|p| match &p.kind {
            kfuse_ir::ParamKind::Tensor { dims, output } => PDesc {
                name: &p.name,
                kind: PKind::Tensor {
                    dtype: DTypeSig::Concrete(p.dtype),
                    dims: dims.iter().map(|s| k.shape_name(*s)).collect::<Vec<_>>().into(),
                    output: *output,
                },
            },
            kfuse_ir::ParamKind::Scalar => PDesc { name: &p.name, kind: PKind::Scalar(p.dtype) },
        })
        .collect()
}

/// What the checks established.
struct Checked {
    dtypes: Vec<DType>,
    /// The device of the tensor arguments (`None` without tensor arguments).
    device: Option<Device>,
}

/// The checks of arguments against a signature that need no memory (those of [`check`]
/// but the device and storage ones): count, kinds, ranks, dtypes, shape symbols, and
/// outputs without a zero stride; returns the dtypes bound to the generics.
fn check_signature<A: ArgFacts>(kernel: &str, generics: &[&str], params: &[PDesc<'_>], args: &[A]) -> Result<Vec<DType>> {
    // Count.
    if args.len() != params.len() {
        let names: Vec<&str> = params.iter().map(|p| p.name).collect();
        return Err(Error::InvalidArgument(format!(
            "`{kernel}` takes {} argument(s) ({}), but {} were given",
            params.len(),
            names.join(", "),
            args.len()
        )));
    }
    // Kinds and ranks.
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        if !a.fits(&p.kind) {
            return Err(Error::InvalidArgument(format!(
                "argument {i} of `{kernel}` (`{}`) must be {}, but it is {}",
                p.name,
                A::expected(&p.kind),
                a.describe()
            )));
        }
        match (&p.kind, a.scalar()) {
            (PKind::Scalar(d), Some(s)) => {
                if !matches!(d, DType::F32 | DType::I64) {
                    return Err(Error::InvalidArgument(format!(
                        "scalar parameter `{}` of `{kernel}` is {d}; only f32 and i64 scalars can be passed",
                        p.name
                    )));
                }
                if s != *d {
                    return Err(Error::DTypeMismatch(format!(
                        "scalar `{}` of `{kernel}` is {d}, but {} was given",
                        p.name,
                        a.describe()
                    )));
                }
            }
            (PKind::Tensor { dims, .. }, _) => {
                let t = a.tensor().expect("tensor argument");
                if t.shape().len() != dims.len() {
                    return Err(Error::ShapeMismatch(format!(
                        "`{}` of `{kernel}` has {} dimension(s) ({}), but the tensor given has shape {:?}",
                        p.name,
                        dims.len(),
                        dims.join(", "),
                        t.shape()
                    )));
                }
            }
            _ => {}
        }
    }
    // Dtypes.
    let mut bound: Vec<Option<(DType, &str)>> = vec![None; generics.len()];
    for (p, a) in params.iter().zip(args) {
        let (PKind::Tensor { dtype, .. }, Some(t)) = (&p.kind, a.tensor()) else { continue };
        match *dtype {
            DTypeSig::Concrete(d) => {
                if t.dtype() != d {
                    return Err(Error::DTypeMismatch(format!("`{}` is {} but `{kernel}` declares it {d}", p.name, t.dtype())));
                }
            }
            DTypeSig::Generic(g) => {
                let gname = generics.get(g).ok_or_else(|| {
                    Error::InvalidArgument(format!("`{}` of `{kernel}` uses dtype generic #{g}, which the kernel does not declare", p.name))
                })?;
                match bound[g] {
                    None => bound[g] = Some((t.dtype(), p.name)),
                    Some((d, by)) if d != t.dtype() => {
                        return Err(Error::DTypeMismatch(format!("`{}` is {} but `{by}` makes {gname} = {d}", p.name, t.dtype())));
                    }
                    _ => {}
                }
            }
        }
    }
    let dtypes = bound
        .iter()
        .zip(generics)
        .map(|(b, g)| {
            b.map(|(d, _)| d).ok_or_else(|| {
                Error::InvalidArgument(format!("cannot infer the dtype generic `{g}` of `{kernel}`: no tensor argument uses it"))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // Shape symbols (a handful: a linear search beats hashing).
    let mut shapes: Vec<(&str, (usize, &str, usize))> = Vec::new();
    for (p, a) in params.iter().zip(args) {
        let (PKind::Tensor { dims, .. }, Some(t)) = (&p.kind, a.tensor()) else { continue };
        for (d, (&sym, &size)) in dims.iter().zip(t.shape()).enumerate() {
            if let Ok(lit) = sym.parse::<usize>() {
                if lit != size {
                    return Err(Error::ShapeMismatch(format!(
                        "`{}` dimension {d} must be {lit}, but the tensor given has shape {:?}",
                        p.name,
                        t.shape()
                    )));
                }
                continue;
            }
            match shapes.iter().find(|e| e.0 == sym).map(|e| e.1) {
                None => shapes.push((sym, (size, p.name, d))),
                Some((v, by, bd)) if v != size => {
                    return Err(Error::ShapeMismatch(format!(
                        "`{}` dimension {d} ({sym}) is {size} but `{by}` dimension {bd} ({sym}) is {v} (shapes {:?} and the earlier tensor's)",
                        p.name,
                        t.shape()
                    )));
                }
                _ => {}
            }
        }
    }
    // Outputs: no broadcast (zero-stride) dims.
    for (p, a) in params.iter().zip(args) {
        let (PKind::Tensor { output: true, .. }, Some(t)) = (&p.kind, a.tensor()) else { continue };
        if let Some(d) = (0..t.shape().len()).find(|&d| t.strides()[d] == 0 && t.shape()[d] > 1) {
            return Err(Error::InvalidArgument(format!(
                "output `{}` of `{kernel}` has stride 0 on dimension {d} (size {}): several elements would be written to one address",
                p.name,
                t.shape()[d]
            )));
        }
    }
    Ok(dtypes)
}

/// Step 1 of [`launch`] (module docs): [`check_signature`], then one device and no
/// output sharing storage with another argument.
fn check(kernel: &str, generics: &[&str], params: &[PDesc<'_>], args: &[Arg<'_>]) -> Result<Checked> {
    let dtypes = check_signature(kernel, generics, params, args)?;
    // One device.
    let mut device: Option<(Device, &str)> = None;
    for (p, a) in params.iter().zip(args) {
        let Some(t) = a.tensor() else { continue };
        let d = t.device();
        match &device {
            None => device = Some((d, p.name)),
            Some((d0, by)) if *d0 != d => {
                return Err(Error::DeviceMismatch(format!(
                    "`{}` is on {d} but `{by}` is on {d0}; move them to one device with `.to_device(&device)`",
                    p.name
                )));
            }
            _ => {}
        }
    }
    // Outputs: no storage shared with another argument.
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        let Arg::Out(t) = a else { continue };
        for (j, (q, b)) in params.iter().zip(args).enumerate() {
            if i == j {
                continue;
            }
            if let Some(u) = b.tensor() {
                if t.same_storage(u) {
                    return Err(Error::Aliasing(format!(
                        "output `{}` of `{kernel}` shares storage with {} `{}`; an output must have storage of its own \
                         (allocate it with `Tensor::empty`, or copy the other with `.deep_clone()`)",
                        p.name,
                        if matches!(b, Arg::Out(_)) { "output" } else { "argument" },
                        q.name
                    )));
                }
            }
        }
    }
    Ok(Checked { dtypes, device: device.map(|(d, _)| d) })
}

/// Checks `args` against `def`'s signature (step 1 of [`launch`]) and returns the dtypes
/// bound to its generics, in order.
///
/// # Examples
///
/// ```
/// use kfuse_runtime::{check_args, Arg, DType, Result, Tensor};
///
/// /// The dtype `T` binds to in a `#[kfuse] fn k<T: Float>(x: Tensor<T, (N,)>,
/// /// y: &mut Tensor<T, (N,)>)` called on `x` and `y` (`def`: `k::DEF`).
/// fn bound_dtype(def: &kfuse_ir::KernelDef, x: &Tensor, y: &mut Tensor) -> Result<DType> {
///     Ok(check_args(def, &[Arg::In(x), Arg::Out(y)])?[0])
/// }
/// ```
pub fn check_args(def: &KernelDef, args: &[Arg<'_>]) -> Result<Vec<DType>> {
    Ok(check(def.name, def.generics, &def_params(def), args)?.dtypes)
}

/// The value of each shape symbol of `kernel` (indexed by `ShapeSym`) from the tensor
/// arguments.
pub fn shape_values(kernel: &Kernel, args: &[Arg<'_>]) -> Result<Vec<u64>> {
    shapes_of(kernel, args)
}

/// [`shape_values`] of [`Arg`]s or [`ArgDesc`]s.
fn shapes_of<A: ArgFacts>(kernel: &Kernel, args: &[A]) -> Result<Vec<u64>> {
    if args.len() != kernel.params.len() {
        return Err(Error::InvalidArgument(format!(
            "the IR of `{}` has {} parameters but {} arguments were given",
            kernel.name,
            kernel.params.len(),
            args.len()
        )));
    }
    let mut vals: Vec<Option<u64>> = vec![None; kernel.shape_syms.len()];
    for (p, a) in kernel.params.iter().zip(args) {
        let Some(t) = a.tensor() else { continue };
        if p.dims().len() != t.shape().len() {
            return Err(Error::ShapeMismatch(format!("`{}` has rank {} in the IR but the tensor has shape {:?}", p.name, p.dims().len(), t.shape())));
        }
        for (&s, &size) in p.dims().iter().zip(t.shape()) {
            let slot = &mut vals[s.0 as usize];
            match *slot {
                None => *slot = Some(size as u64),
                Some(v) if v != size as u64 => {
                    return Err(Error::ShapeMismatch(format!(
                        "shape symbol {} is {v} in one tensor and {size} in `{}`",
                        kernel.shape_name(s),
                        p.name
                    )));
                }
                _ => {}
            }
        }
    }
    vals.iter()
        .enumerate()
        .map(|(i, v)| {
            v.ok_or_else(|| {
                Error::InvalidArgument(format!("shape symbol {} of `{}` is not the size of any tensor argument", kernel.shape_syms[i], kernel.name))
            })
        })
        .collect()
}

/// The largest power of two ≤ 16 dividing `x` (16 for 0).
pub(crate) fn pow2_div(x: u64) -> u32 {
    if x == 0 {
        16
    } else {
        (1u64 << x.trailing_zeros().min(4)) as u32
    }
}

/// The [`TensorSpec`] of a tensor argument: the alignment of element 0's address and the
/// divisibility of each stride (0 for a unit stride).
pub(crate) fn tensor_spec<T: TensorFacts>(t: &T) -> TensorSpec {
    TensorSpec {
        ptr_align: pow2_div(t.address()),
        stride_div: t.strides().iter().map(|&s| if s == 1 { 0 } else { pow2_div(s.unsigned_abs() as u64) }).collect(),
    }
}

/// Whether every element of `t` lies less than 2^31 elements from its first, with no
/// negative stride ([`Spec::offsets32`]).
pub(crate) fn offsets_fit_32<T: TensorFacts>(t: &T) -> bool {
    let mut span: u128 = 0;
    for (&n, &st) in t.shape().iter().zip(t.strides()) {
        if n == 0 {
            return true;
        }
        if st < 0 {
            return false;
        }
        span += (n as u128 - 1) * st as u128;
    }
    span < 1 << 31
}

/// The specialization facts of actual arguments: per tensor parameter the alignment of
/// element 0's address and the divisibility of each stride (0 for a unit stride), per
/// shape symbol its value rounded up to a power of two (at least 1, at most 2^31) and
/// the power of two dividing it (`kfuse_codegen::target::shape_facts`).
pub fn spec_for(kernel: &Kernel, args: &[Arg<'_>]) -> Result<Spec> {
    spec_with_shapes(kernel, args, &shape_values(kernel, args)?)
}

/// [`spec_for`] with the shape values already known ([`shape_values`]).
fn spec_with_shapes<A: ArgFacts>(kernel: &Kernel, args: &[A], vals: &[u64]) -> Result<Spec> {
    let tensors = kernel
        .params
        .iter()
        .zip(args)
        .map(|(p, a)| match a.tensor() {
            Some(t) if p.is_tensor() => Some(tensor_spec(t)),
            _ => None,
        })
        .collect();
    let offsets32 = kernel.params.iter().zip(args).map(|(p, a)| p.is_tensor() && a.tensor().is_some_and(offsets_fit_32)).collect();
    let (shape_pow2, shape_div) = vals.iter().map(|&v| kfuse_codegen::target::shape_facts(v)).unzip();
    let settings = crate::settings::current();
    Ok(Spec {
        tensors,
        offsets32,
        shape_pow2,
        shape_div,
        shape_exact: kfuse_codegen::target::exact_shapes(kernel, vals),
        tiles: settings.tiles()?.clone(),
        threads: settings.threads()?,
        min_blocks: settings.min_blocks()?,
        grouped: false,
        register_attempt: 0,
        ..Spec::default()
    })
}

/// The [`Spec`] a GPU launch of `kernel` on `args` compiles for `target` (before
/// autotuning): [`spec_for`]'s facts with `KFUSE_TILES`, plus the tile choices codegen
/// makes from the exact shape (`choose_tiles::exact_shape_tiles`, as `Spec::shape_tiles`,
/// so that the cache keys on them; `KFUSE_TILES` entries win). `copies`: the arguments a
/// launch copies to padded rows first ([`crate::operand_copy`]), whose facts are the
/// copies'.
fn gpu_spec<A: ArgFacts>(kernel: &Kernel, args: &[A], shapes: &[u64], target: &Target, copies: &[OperandCopy]) -> Result<Spec> {
    let mut spec = spec_with_shapes(kernel, args, shapes)?;
    for c in copies {
        spec.tensors[c.param] = Some(c.layout.spec());
        // (the copy's extent is not the argument's)
        spec.offsets32[c.param] = false;
    }
    spec.shape_tiles = kfuse_codegen::passes::choose_tiles::exact_shape_tiles(kernel, &spec, shapes, target);
    Ok(spec)
}

/// The tile sizes a GPU launch of `def` on `args` would use on `target`, by tile-symbol
/// name (`{"BM": 128, "BN": 256, "BK": 64}`): the scheduler's choices (codegen's
/// `schedule`) for the [`Spec`] the launch builds from these arguments — their shapes,
/// strides and alignment, with `KFUSE_TILES` applied — without compiling anything or
/// needing a GPU; the arguments may live on the CPU or a GPU. Pass the result to
/// [`launch_interpreter`] to run the program the GPU runs, tile for tile, on the
/// interpreter.
///
/// Every tile symbol of the kernel is in the map. Not included: what `KFUSE_AUTOTUNE=1`
/// may pick instead on a GPU (tuned tiles are measured there), and the pipeline options
/// (`STAGES`, `GROUPM`), which are no tile symbols. Errors: those of [`launch`]'s
/// checks, an unparsable `KFUSE_TILES`, and codegen's refusals (a target below sm_80, an
/// override that is not a power of two) as [`Error::Codegen`]. A matrix operand a GPU
/// launch would copy to padded rows ([`crate::operand_copy`]) counts as that copy.
///
/// [`launch_interpreter`]'s example runs a kernel with these tiles.
pub fn gpu_plan_tiles(def: &KernelDef, args: &[Arg<'_>], target: &Target) -> Result<std::collections::BTreeMap<String, u32>> {
    check(def.name, def.generics, &def_params(def), args)?;
    let Planned { built, spec, .. } = planned(def, args, target)?;
    let k = kfuse_codegen::schedule(&built.0, &spec, target)?;
    Ok(k.schedule.tiles.iter().map(|(t, v)| (k.tile_name(*t).to_string(), *v)).collect())
}

/// The [`Spec`] a GPU launch of `def` on `args` compiles for `target` (step 5 of
/// [`launch`], before autotuning): alignment, strides and shapes of the arguments, the
/// tile and thread settings in force, and the tiles codegen chooses from the exact
/// shape. The arguments may live on the CPU or a GPU; errors are those of [`launch`]'s
/// checks. With [`emit_for`], what [`emit`] gives for [`ArgDesc`]s of these tensors. A
/// matrix operand the launch would copy to padded rows ([`crate::operand_copy`]) has
/// the copy's facts here (16-byte aligned, rows of whole 128-byte lines), as in the
/// kernel the launch compiles; [`spec_for`] gives the arguments' own.
pub fn launch_spec(def: &KernelDef, args: &[Arg<'_>], target: &Target) -> Result<Spec> {
    check(def.name, def.generics, &def_params(def), args)?;
    Ok(planned(def, args, target)?.spec)
}

/// A kernel's IR for one set of dtypes, with what launches read of it: its grid and the
/// operands of its matrix loop (`kfuse_codegen`'s `matrix_operands`, `None` without
/// one). Built once per process ([`built_ir`]).
pub(crate) type BuiltIr = Arc<(Kernel, kfuse_ir::grid::Grid, Option<MatrixOperands>)>;

/// What a GPU launch on given arguments compiles: the IR ([`built_ir`]), the [`Spec`]
/// ([`gpu_spec`]) and the operands it copies to padded rows first.
pub(crate) struct Planned {
    pub(crate) built: BuiltIr,
    pub(crate) spec: Spec,
    pub(crate) copies: Vec<OperandCopy>,
}

impl Planned {
    /// The copies' lines for a plan (`Plan::operand_copies`).
    pub(crate) fn notes(&self) -> Vec<String> {
        self.copies.iter().map(|c| c.note.clone()).collect()
    }
}

/// The IR of `def` for the dtypes of `args`, the [`Spec`] of a GPU launch on them for
/// `target` ([`gpu_spec`]) and the operands it copies ([`crate::operand_copy::wanted`]),
/// for arguments that passed [`check_signature`].
fn planned<A: ArgFacts>(def: &KernelDef, args: &[A], target: &Target) -> Result<Planned> {
    let dtypes = check_signature(def.name, def.generics, &def_params(def), args)?;
    let built = built_ir(def, &dtypes)?;
    let shapes = shapes_of(&built.0, args)?;
    let copies = match &built.2 {
        Some(m) => crate::operand_copy::wanted(m, &built.0, args, || Ok(target.clone()))?,
        None => Vec::new(),
    };
    let spec = gpu_spec(&built.0, args, &shapes, target, &copies)?;
    Ok(Planned { built, spec, copies })
}

/// What a GPU launch of `def` on tensors described by `args` compiles for `target`: the
/// IR after scheduling ([`EmittedKernel::ir`]) and the CUDA ([`EmittedKernel::source`]),
/// with the launch facts beside them (block size, shared memory, tiles, parameters).
/// No GPU and no NVRTC are needed, and the result is deterministic: it depends on
/// `def`, `args`, `target` and the tile and thread settings in force only
/// (`KFUSE_TILES`, `KFUSE_THREADS`, `KFUSE_MIN_BLOCKS` or the same made with
/// [`Config`](crate::settings::Config); unset, none), so that a test can pin it with a
/// snapshot.
///
/// `args` follow the signature, one per parameter: [`ArgDesc::tensor`] for a tensor
/// (input or output), contiguous and at the start of an allocation aligned to 256 bytes
/// as kfuse's allocations are, [`ArgDesc::strided`] and [`ArgDesc::at_byte_offset`] for
/// views, [`ArgDesc::Scalar`] for a scalar. The specialization is exactly that of a
/// launch on such tensors (the same code: [`launch_spec`] is its counterpart for
/// tensors), and so are the checks: count and kind of each argument, ranks, dtype
/// generics bound from the tensors, shape symbols consistent, no output with a zero
/// stride — each failure an `Err` ([`Error::InvalidArgument`], [`Error::DTypeMismatch`],
/// [`Error::ShapeMismatch`]), as is a kernel the target cannot run ([`Error::Codegen`]).
/// Not included: tiles `KFUSE_AUTOTUNE=1` would measure on a GPU, and the later
/// register-room attempt a GPU launch takes when the driver reports that the first
/// one spills (`EmittedKernel::register_attempt`). A matrix operand the launch would
/// copy to padded rows first ([`crate::operand_copy`]: a tensor TMA cannot read as it
/// lies, such as a bf16 `[K, 4097]` matrix) is compiled for as that copy, and the plan
/// says so (`EmittedKernel::plan`'s `operand_copies`).
///
/// ```
/// use kfuse_codegen::{EmittedKernel, Target};
/// use kfuse_runtime::{emit, ArgDesc, DType, Result};
///
/// /// `def`: the `add::DEF` of `#[kfuse] fn add<T: Float>(a: Tensor<T, (N,)>,
/// /// b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>)`
/// fn add_bf16_sm90a(def: &kfuse_ir::KernelDef) -> Result<EmittedKernel> {
///     let t = ArgDesc::tensor(DType::BF16, &[1 << 20]);
///     emit(def, &[t.clone(), t.clone(), t], &Target::sm90a())
/// }
/// ```
pub fn emit(def: &KernelDef, args: &[ArgDesc], target: &Target) -> Result<EmittedKernel> {
    let planned = planned_descs(def, args, target)?;
    let mut e = kfuse_codegen::compile(&planned.built.0, &planned.spec, target)?;
    e.plan.operand_copies = planned.notes();
    Ok(e)
}

/// [`shape_values`] of [`ArgDesc`]s.
pub(crate) fn desc_shapes(kernel: &Kernel, args: &[ArgDesc]) -> Result<Vec<u64>> {
    shapes_of(kernel, args)
}

/// [`planned`] for [`ArgDesc`]s, whose strides are checked against their shapes first:
/// what [`emit`] and [`crate::explain()`] compile.
pub(crate) fn planned_descs(def: &KernelDef, args: &[ArgDesc], target: &Target) -> Result<Planned> {
    for (p, a) in def.params.iter().zip(args) {
        if let ArgDesc::Tensor(t) = a {
            if t.strides.len() != t.shape.len() {
                return Err(Error::InvalidArgument(format!(
                    "`{}` of `{}`: {} strides ({:?}) for {} dimensions (shape {:?})",
                    p.name(),
                    def.name,
                    t.strides.len(),
                    t.strides,
                    t.shape.len(),
                    t.shape
                )));
            }
        }
    }
    planned(def, args, target)
}

/// Tile-size overrides from `KFUSE_TILES` (`BM=128,BN=64`) and
/// [`Config::tile`](crate::settings::Config::tile): every kernel with a tile symbol of
/// that name uses that size instead of the scheduler's choice. Part of the
/// specialization, so each setting compiles (and caches) its own module. Read through
/// [`crate::settings`] (once a process, again after `settings::reload()`).
pub fn tile_overrides() -> Result<std::collections::BTreeMap<String, u32>> {
    Ok(crate::settings::current().tiles()?.clone())
}

/// Builds the IR of `def` for `dtypes` and generates code for `spec` and `target`
/// (what a GPU launch compiles; snapshot tests call it without a GPU).
///
/// # Examples
///
/// ```
/// use kfuse_codegen::{Spec, Target};
/// use kfuse_runtime::{emit_for, DType, Result};
///
/// /// The CUDA of `def` on bf16 for a spec built by hand (one `TensorSpec` a tensor
/// /// parameter, one `shape_pow2` a shape symbol); `emit` builds it from arguments.
/// fn cuda(def: &kfuse_ir::KernelDef, spec: &Spec) -> Result<String> {
///     Ok(emit_for(def, &[DType::BF16], spec, &Target::sm80())?.source)
/// }
/// ```
pub fn emit_for(def: &KernelDef, dtypes: &[DType], spec: &Spec, target: &Target) -> Result<EmittedKernel> {
    if dtypes.len() != def.generics.len() {
        return Err(Error::InvalidArgument(format!(
            "`{}` has {} dtype generic(s) ({}) but {} dtype(s) were given",
            def.name,
            def.generics.len(),
            def.generics.join(", "),
            dtypes.len()
        )));
    }
    let t = std::time::Instant::now();
    let k = (def.build)(dtypes)?;
    let emitted = kfuse_codegen::compile(&k, spec, target);
    tracing::debug!(target: "kfuse::codegen", kernel = %def.name, target = %target.arch(), ok = emitted.is_ok(), elapsed_ms = crate::build_times::ms(t.elapsed()), "codegen");
    Ok(emitted?)
}

fn backend_of(device: &Option<Device>) -> Backend {
    match device {
        Some(d) if d.is_gpu() => Backend::Gpu { device: d.describe() },
        _ => Backend::Interpreter,
    }
}

fn any_output_empty(args: &[Arg<'_>]) -> bool {
    args.iter().any(|a| matches!(a, Arg::Out(t) if t.numel() == 0))
}

/// Launches `def` on `args` (see the module docs for the steps). Tensors on the CPU run
/// in the interpreter, tensors on a GPU run there; the call returns once the kernel is
/// queued (GPU) or done (CPU). The interpreter takes the tile sizes `KFUSE_TILES` names
/// (from the same [`crate::settings`] snapshot as GPU launches) and 16 for the others
/// (`kfuse_ir::interp::Options`); [`launch_interpreter`] takes any tiles.
///
/// `#[kfuse] fn name` generates a function `name(..)` that calls this with `&name::DEF`
/// and one [`Arg`] per parameter; a `KernelDef` written by hand launches the same way.
///
/// # Examples
///
/// `out[i] = x[i] * s`, one element a program, on CPU tensors (the interpreter):
///
/// ```
/// use kfuse_ir::{AccessDim, BinaryOp, Builder, DTypeSig, Kernel, KernelDef, ParamSig};
/// use kfuse_runtime::{launch, Arg, Backend, DType, Device, Scalar, Tensor};
///
/// fn build(dtypes: &[DType]) -> kfuse_ir::error::Result<Kernel> {
///     let mut b = Builder::new("scale");
///     let n = b.shape_sym("N");
///     let x = b.tensor_param("x", dtypes[0], &[n], false);
///     let out = b.tensor_param("out", dtypes[0], &[n], true);
///     let (_, s) = b.scalar_param("s", DType::F32);
///     let i = b.program_id(0)?;
///     let v = b.load(x, &[i], &[AccessDim::Index])?;
///     let v = b.cast(v, DType::F32)?;
///     let v = b.binary(BinaryOp::Mul, v, s)?;
///     let v = b.cast(v, dtypes[0])?;
///     b.store(out, &[i], &[AccessDim::Index], v)?;
///     b.finish()
/// }
///
/// // what `#[kfuse]` records for `fn scale<T: Float>(x: Tensor<T, (N,)>,
/// // out: &mut Tensor<T, (N,)>, s: f32)`
/// static SCALE: KernelDef = KernelDef {
///     name: "scale",
///     generics: &["T"],
///     params: &[
///         ParamSig::Tensor { name: "x", dtype: DTypeSig::Generic(0), dims: &["N"], output: false },
///         ParamSig::Tensor { name: "out", dtype: DTypeSig::Generic(0), dims: &["N"], output: true },
///         ParamSig::Scalar { name: "s", dtype: DType::F32 },
///     ],
///     build,
/// };
///
/// let cpu = Device::cpu();
/// let x = Tensor::from_f32(&[1.0, 2.0, 3.0], &[3], DType::BF16, &cpu)?;
/// let mut out = Tensor::empty(&[3], DType::BF16, &cpu)?;
/// let ran = launch(&SCALE, &mut [Arg::In(&x), Arg::Out(&mut out), Arg::Scalar(Scalar::F32(2.0))])?;
/// assert_eq!(ran.backend, Backend::Interpreter);
/// assert_eq!(out.to_vec_f32()?, [2.0, 4.0, 6.0]);
/// # Ok::<(), kfuse_runtime::Error>(())
/// ```
pub fn launch(def: &KernelDef, args: &mut [Arg<'_>]) -> Result<Launched> {
    launch_with(def, args, None)
}

/// Runs `def` on `args` in the CPU interpreter with the tile sizes `tiles` (by tile-symbol
/// name, e.g. from [`gpu_plan_tiles`], so that the interpreter runs the program a GPU
/// would: the same blocks, loop chunks and `iota`s); a tile symbol `tiles` does not name
/// is 16, names that are no tile symbol of the kernel are ignored, and `KFUSE_TILES` is
/// not consulted (the result depends on `tiles` only). Checks and empty-launch skipping
/// are [`launch`]'s. The tensors must live on the CPU ([`Error::InvalidArgument`]
/// otherwise: copy them with `.to_device(&Device::cpu())`); a tile of size 0 is an
/// interpreter error ([`Error::Ir`]).
///
/// # Examples
///
/// ```
/// use kfuse_codegen::Target;
/// use kfuse_runtime::{gpu_plan_tiles, launch_interpreter, Arg, Launched, Result, Tensor};
///
/// /// Runs `def` (a `#[kfuse] fn k(x: Tensor<..>, y: &mut Tensor<..>)`'s `k::DEF`) on CPU
/// /// tensors with the tiles an H100 launch would use.
/// fn as_on_h100(def: &kfuse_ir::KernelDef, x: &Tensor, y: &mut Tensor) -> Result<Launched> {
///     let mut args = [Arg::In(x), Arg::Out(y)];
///     let tiles = gpu_plan_tiles(def, &args, &Target::sm90a())?;
///     launch_interpreter(def, &mut args, &tiles)
/// }
/// ```
pub fn launch_interpreter(def: &KernelDef, args: &mut [Arg<'_>], tiles: &std::collections::BTreeMap<String, u32>) -> Result<Launched> {
    launch_with(def, args, Some(tiles))
}

/// [`launch`], or with `interp_tiles` [`launch_interpreter`].
fn launch_with(def: &KernelDef, args: &mut [Arg<'_>], interp_tiles: Option<&std::collections::BTreeMap<String, u32>>) -> Result<Launched> {
    let checked = check(def.name, def.generics, &def_params(def), args)?;
    if interp_tiles.is_some() && checked.device.as_ref().is_some_and(|d| d.is_gpu()) {
        return Err(Error::InvalidArgument(format!(
            "launch_interpreter runs `{}` on the CPU: its tensor arguments must live there (copy them with `.to_device(&Device::cpu())`)",
            def.name
        )));
    }
    let built = built_ir(def, &checked.dtypes)?;
    let (kernel, grid) = (&built.0, &built.1);
    let shapes = shape_values(kernel, args)?;
    let mut launched = Launched { backend: backend_of(&checked.device), kernel: def.name.to_string(), skipped_empty: false, cache: None, build: None, plan: None };
    // Tile extents do not change whether an axis is empty: evaluate them as 1.
    if grid.eval(|s| shapes[s.0 as usize], |_| 1).contains(&0) || any_output_empty(args) {
        launched.skipped_empty = true;
        return Ok(launched);
    }
    let Some(device) = checked.device.as_ref().filter(|d| d.is_gpu()) else {
        let traced = tracing::enabled!(target: "kfuse::launch", tracing::Level::TRACE).then(std::time::Instant::now);
        match interp_tiles {
            Some(tiles) => run_interpreter(kernel, args, tiles)?,
            None => run_interpreter(kernel, args, crate::settings::current().tiles()?)?,
        }
        if let Some(t) = traced {
            tracing::trace!(target: "kfuse::launch", kernel = %def.name, elapsed_ms = crate::build_times::ms(t.elapsed()), "interpreter run");
        }
        return Ok(launched);
    };
    // matrix operands TMA cannot read as they lie: the kernel runs on padded copies
    // (`operand_copy`; none in the usual case, found without allocating)
    let copies = match &built.2 {
        Some(m) => crate::operand_copy::wanted(m, kernel, args, || device.gpu_ref().expect("a GPU").target())?,
        None => Vec::new(),
    };
    if copies.is_empty() {
        gpu_launch(def, device, checked.dtypes, kernel, args, &shapes, &mut launched)?;
        return Ok(launched);
    }
    let made = copies.iter().map(|c| crate::operand_copy::make(args[c.param].tensor().expect("a tensor argument"), &c.layout)).collect::<Result<Vec<_>>>()?;
    for c in &copies {
        tracing::debug!(target: "kfuse::launch", kernel = %def.name, copy = %c.note, "operand copy");
    }
    let swapped = with_copies(args, &copies, &made);
    gpu_launch(def, device, checked.dtypes, kernel, &swapped, &shapes, &mut launched)?;
    if let Some(p) = launched.plan.take() {
        let mut plan = (*p).clone();
        plan.operand_copies = copies.into_iter().map(|c| c.note).collect();
        launched.plan = Some(Arc::new(plan));
    }
    Ok(launched)
}

/// `args` with the input at each copy's parameter replaced by that copy (`made`, in the
/// order of `copies`).
fn with_copies<'a>(args: &'a mut [Arg<'_>], copies: &[OperandCopy], made: &'a [Tensor]) -> Vec<Arg<'a>> {
    args.iter_mut()
        .enumerate()
        .map(|(i, a)| match a {
            Arg::In(t) => Arg::In(copies.iter().position(|c| c.param == i).map_or(&**t, |j| &made[j])),
            Arg::Out(t) => Arg::Out(t),
            Arg::Scalar(s) => Arg::Scalar(*s),
        })
        .collect()
}

/// Step 5 of [`launch`] (module docs) on `device`: the kernel for `args` found, built or
/// tuned, loaded and issued; what happened goes into `launched`.
fn gpu_launch(def: &KernelDef, device: &Device, dtypes: Vec<DType>, kernel: &Kernel, args: &[Arg<'_>], shapes: &[u64], launched: &mut Launched) -> Result<()> {
    let gpu = device.gpu_ref().expect("a GPU");
    // arguments of a signature this device launched before, under the same
    // settings: the kernel it launched (`LaunchSig`), without the spec and key
    let settings = crate::settings::current();
    let sig = if settings.autotune { None } else { LaunchSig::of(def, &dtypes, args) };
    if let Some(loaded) = sig.as_ref().and_then(|s| gpu.functions.remembered(s.words(), &settings)) {
        launched.skipped_empty = !issue(device, &loaded, kernel, args, shapes)?;
        launched.cache = Some(CacheOutcome::Memory);
        record_kernel(launched, &loaded);
        return Ok(());
    }
    let target = gpu.target()?;
    // with the tile sizes that follow from the exact shape, not its power-of-two
    // bucket (the operands were copied already where they needed it)
    let mut spec = gpu_spec(kernel, args, shapes, &target, &[])?;
    // only `dot` kernels have anything to tune: no work for the others
    if crate::autotune::enabled() && kernel.ops().any(|o| matches!(kernel.op(o), kfuse_ir::Op::Dot { .. })) {
        if let Some(tiles) = autotune(def, &dtypes, kernel, &spec, &target, device, args, shapes)? {
            spec.tiles = tiles;
        }
    }
    let key = ModuleKey { build: def.build as usize, kernel: def.name.to_string(), dtypes, spec, target };
    let (loaded, outcome) = load(device, kernel, &key)?;
    launched.skipped_empty = !issue(device, &loaded, kernel, args, shapes)?;
    launched.cache = Some(outcome);
    record_kernel(launched, &loaded);
    if let Some(s) = sig {
        gpu.functions.remember(s.words(), settings, loaded);
    }
    Ok(())
}

/// What the kernel a GPU launch runs depends on, besides the settings and the device:
/// the def, the dtypes bound to its generics, and per argument its kind — for a tensor
/// its dtype, its address's alignment (the power of two ≤ 16 dividing it), and per
/// dimension its size and its stride's class (unit, or the power of two ≤ 16 dividing
/// it). Exactly the facts [`spec_with_shapes`] and `exact_shape_tiles` read, so equal
/// signatures under one [`crate::settings::Settings`] give one [`ModuleKey`]: a launch
/// whose signature the device has seen takes the loaded kernel from
/// `FunctionCache::remembered` and skips building the spec and its key (most of a
/// launch's own host time). Built on the stack; `None` (the full path) for an argument
/// list too long for it.
struct LaunchSig {
    words: [u64; LaunchSig::CAP],
    len: usize,
}

impl LaunchSig {
    const CAP: usize = 48;

    fn of(def: &KernelDef, dtypes: &[DType], args: &[Arg<'_>]) -> Option<LaunchSig> {
        let mut s = LaunchSig { words: [0; LaunchSig::CAP], len: 0 };
        s.push(def.build as usize as u64)?;
        s.push(dtypes.iter().fold(dtypes.len() as u64, |w, &d| (w << 4) | d as u64))?;
        for a in args {
            match (a, a.tensor()) {
                (Arg::Scalar(v), _) => s.push(1 << 62 | v.dtype() as u64)?,
                (_, Some(t)) => {
                    let kind = if matches!(a, Arg::Out(_)) { 3u64 << 62 } else { 2u64 << 62 };
                    s.push(kind | (t.dtype() as u64) << 16 | (t.rank() as u64) << 8 | pow2_div(t.address()) as u64)?;
                    for (&n, &st) in t.shape().iter().zip(t.strides()) {
                        s.push(n as u64)?;
                        s.push(if st == 1 { 0 } else { pow2_div(st.unsigned_abs() as u64) as u64 })?;
                    }
                }
                (_, None) => return None,
            }
        }
        Some(s)
    }

    fn push(&mut self, w: u64) -> Option<()> {
        *self.words.get_mut(self.len)? = w;
        self.len += 1;
        Some(())
    }

    fn words(&self) -> &[u64] {
        &self.words[..self.len]
    }
}

/// Launches `def` once over several problems (`groups`, each a full argument list of
/// its own tensors and scalars, shapes free to differ): a grouped launch. On a GPU the
/// kernel is compiled once for facts every problem shares (`Spec::grouped`: the meet
/// of their specializations) and one launch runs all of their programs, each block
/// reading its problem's pointers, strides, shapes and scalars from a table copied to
/// the device with the launch; on the CPU the interpreter runs the problems in turn.
/// Every problem must pass the checks of [`launch`] and instantiate the kernel with the
/// same dtypes. Problems with nothing to compute are left out; `skipped_empty` says
/// that none had anything.
///
/// # Examples
///
/// ```
/// use kfuse_runtime::{launch_grouped, Arg, Result, Tensor};
///
/// /// `y_i = k(x_i)` for two problems of their own sizes in one launch (`def`: the
/// /// `k::DEF` of a `#[kfuse] fn k<T: Float>(x: Tensor<T, (M, N)>, y: &mut Tensor<T, (M, N)>)`).
/// fn both(def: &kfuse_ir::KernelDef, x: [&Tensor; 2], y: [&mut Tensor; 2]) -> Result<()> {
///     let [y0, y1] = y;
///     launch_grouped(def, &mut [vec![Arg::In(x[0]), Arg::Out(y0)], vec![Arg::In(x[1]), Arg::Out(y1)]])?;
///     Ok(())
/// }
/// ```
pub fn launch_grouped(def: &KernelDef, groups: &mut [Vec<Arg<'_>>]) -> Result<Launched> {
    if groups.is_empty() {
        return Err(Error::InvalidArgument(format!("a grouped launch of `{}` needs at least one problem", def.name)));
    }
    let mut dtypes: Option<Vec<DType>> = None;
    let mut device: Option<Option<Device>> = None;
    for (g, args) in groups.iter().enumerate() {
        let checked = check(def.name, def.generics, &def_params(def), args)
            .map_err(|e| Error::InvalidArgument(format!("problem #{g} of a grouped launch: {e}")))?;
        if dtypes.as_ref().is_some_and(|d| *d != checked.dtypes) {
            return Err(Error::InvalidArgument(format!(
                "problem #{g} of a grouped launch of `{}` has dtypes {:?}, problem #0 {:?}: one launch runs one instantiation",
                def.name,
                checked.dtypes,
                dtypes.unwrap()
            )));
        }
        if device.as_ref().is_some_and(|d| *d != checked.device) {
            return Err(Error::InvalidArgument(format!("problem #{g} of a grouped launch of `{}` lives on another device than problem #0", def.name)));
        }
        dtypes = Some(checked.dtypes);
        device = Some(checked.device);
    }
    let dtypes = dtypes.unwrap();
    let device = device.unwrap();
    let built = built_ir(def, &dtypes)?;
    let (kernel, grid) = (&built.0, &built.1);
    let mut launched = Launched { backend: backend_of(&device), kernel: def.name.to_string(), skipped_empty: false, cache: None, build: None, plan: None };
    // the problems with work to do, and their shapes
    let mut live = Vec::new();
    for (g, args) in groups.iter().enumerate() {
        let shapes = shape_values(kernel, args)?;
        if !(grid.eval(|s| shapes[s.0 as usize], |_| 1).contains(&0) || any_output_empty(args)) {
            live.push((g, shapes));
        }
    }
    if live.is_empty() {
        launched.skipped_empty = true;
        return Ok(launched);
    }
    let Some(device) = device.filter(|d| d.is_gpu()) else {
        let settings = crate::settings::current();
        for (g, _) in &live {
            run_interpreter(kernel, &groups[*g], settings.tiles()?)?;
        }
        return Ok(launched);
    };
    let gpu = device.gpu_ref().expect("a GPU");
    // facts every problem shares
    let mut spec: Option<Spec> = None;
    for (g, _) in &live {
        let s = spec_for(kernel, &groups[*g])?;
        spec = Some(match spec {
            None => s,
            Some(m) => meet(m, &s),
        });
    }
    let mut spec = spec.unwrap();
    spec.grouped = true;
    let target = gpu.target()?;
    let key = ModuleKey { build: def.build as usize, kernel: def.name.to_string(), dtypes, spec, target };
    let (loaded, outcome) = load(&device, kernel, &key)?;
    launched.cache = Some(outcome);
    record_kernel(&mut launched, &loaded);
    let e = &loaded.emitted;
    if !e.grouped || e.cluster_x > 1 {
        return Err(Error::InvalidArgument(format!("`{}` did not compile as a grouped kernel", def.name)));
    }
    // the tensor maps of every problem (the matrix path on sm_90a), in global memory:
    // each record holds the addresses of its problem's maps
    let mut maps = Vec::new();
    for (g, _) in &live {
        for p in &e.params {
            if let KernelParam::TensorMap { tensor: id, ref box_dims, swizzle, ref order } = *p {
                let t = groups[*g].get(id.0 as usize).and_then(|a| a.tensor()).ok_or_else(|| {
                    Error::InvalidArgument(format!("`{}` takes parameter #{} as a tensor, but it is not one", def.name, id.0))
                })?;
                maps.push(encode_map(def.name, t, id, box_dims, swizzle, order).map_err(|err| Error::InvalidArgument(format!("problem #{g}: {err}")))?);
            }
        }
    }
    let maps = if maps.is_empty() {
        None
    } else {
        Some(gpu.stream.clone_htod(&maps).map_err(driver(format_args!("copying the tensor maps of a grouped `{}` to {}", def.name, device.description())))?)
    };
    let maps_at = maps.as_ref().map_or(0, |m| {
        let (ptr, _rec) = m.device_ptr(&gpu.stream);
        ptr
    });
    // the table: per problem its grid, the programs before it, its parameter words
    let rec = kfuse_codegen::group_record_words(&e.params);
    let mut words: Vec<i64> = Vec::with_capacity(rec * live.len());
    let mut total: u64 = 0;
    let mut map_index = 0u64;
    for (g, shapes) in &live {
        let args = &groups[*g];
        // per-axis program counts (not `grid_dims`: a persistent kernel's grid folds
        // them into its walk, and the records' raster needs them)
        let dims = e.programs(shapes);
        words.extend(dims.iter().map(|&d| d as i64));
        words.push(total as i64);
        total += dims.iter().product::<u64>();
        for p in &e.params {
            words.push(match p {
                KernelParam::TensorMap { .. } => {
                    map_index += 1;
                    (maps_at + (map_index - 1) * std::mem::size_of::<crate::tma::TensorMap>() as u64) as i64
                }
                p => param_word(def.name, kernel, p, args, shapes)?,
            });
        }
    }
    if total >= 1 << 31 {
        return Err(Error::InvalidArgument(format!("a grouped launch of `{}` needs {total} blocks; CUDA allows fewer than 2^31", def.name)));
    }
    // a persistent kernel (the matrix path on sm_90a) walks every problem's tiles with
    // as many blocks as the device holds at once
    let blocks = match e.persistent {
        Some(p) => {
            let r = *loaded.resident.get_or_init(|| resident(&loaded, &gpu.stream));
            total.min(p as u64 * r.max(1) as u64)
        }
        None => total,
    };
    let table = gpu
        .stream
        .clone_htod(&words)
        .map_err(driver(format_args!("copying the problem table of a grouped `{}` to {}", def.name, device.description())))?;
    let ngroups = live.len() as i64;
    let mut b = gpu.stream.launch_builder(&loaded.func);
    b.arg(&table);
    b.arg(&ngroups);
    let cfg = LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (e.block_threads, 1, 1), shared_mem_bytes: e.smem_bytes };
    // SAFETY: the kernel takes (table, count) (`EmittedKernel::grouped`); each record
    // holds the words `emitted.params` asks for, from live allocations of this device
    // (tensor maps: addresses in `maps`, 128-byte entries of a 256-byte aligned
    // allocation), and the kernel masks its accesses to each problem's shapes. The
    // table and the maps are freed after the kernel, in stream order (cudarc frees
    // device memory on the stream).
    unsafe { b.launch(cfg) }.map_err(driver(format_args!(
        "launching grouped `{}` ({} problems, {total} blocks, {} threads) on {}",
        def.name,
        live.len(),
        e.block_threads,
        device.description()
    )))?;
    drop(table);
    drop(maps);
    if sync_each_launch() {
        gpu.sync().map_err(|err| Error::Driver(format!("kernel `{}` failed: {err}", def.name)))?;
    }
    Ok(launched)
}

/// The TMA map of tensor parameter `id` (`KernelParam::TensorMap`).
fn encode_map(name: &str, t: &Tensor, id: kfuse_ir::ParamId, box_dims: &[u32], swizzle: u32, order: &[u32]) -> Result<crate::tma::TensorMap> {
    // view the tensor in memory order (outermost first), as the map wants it
    let perm: Vec<usize> = order.iter().rev().map(|&d| d as usize).collect();
    let view = t.permute(&perm).map_err(|err| Error::InvalidArgument(format!("`{name}`, parameter #{}: dimension order {order:?}: {err}", id.0)))?;
    let boxes: Vec<u32> = perm.iter().map(|&d| box_dims.get(d).copied().unwrap_or(0)).collect();
    crate::tma::encode_tiled(&view, &boxes, swizzle).map_err(|err| match err {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("`{name}`, parameter #{}: {m}", id.0)),
        other => other,
    })
}

/// The facts two specializations share: the smaller alignment and divisibility, the
/// larger padded extent (a unit stride stays one only where both have it).
fn meet(a: Spec, b: &Spec) -> Spec {
    let tensors = a
        .tensors
        .iter()
        .zip(&b.tensors)
        .map(|(x, y)| match (x, y) {
            (Some(x), Some(y)) => Some(TensorSpec {
                ptr_align: x.ptr_align.min(y.ptr_align),
                stride_div: x
                    .stride_div
                    .iter()
                    .zip(&y.stride_div)
                    .map(|(&p, &q)| if p == 0 && q == 0 { 0 } else { p.max(1).min(q.max(1)) })
                    .collect(),
            }),
            _ => None,
        })
        .collect();
    let shape_pow2: Vec<u32> = a.shape_pow2.iter().zip(&b.shape_pow2).map(|(&p, &q)| p.max(q)).collect();
    // exact (div == pow2) only where both are exactly the same power of two
    let shape_div = a
        .shape_div
        .iter()
        .zip(&b.shape_div)
        .zip(&shape_pow2)
        .map(|((&p, &q), &m)| p.min(q).min(if p == q { m } else { m / 2 }).max(1))
        .collect();
    // an exact value only where both have the same one
    let shape_exact = a.shape_exact.iter().zip(&b.shape_exact).map(|(&p, &q)| if p == q { p } else { 0 }).collect();
    let offsets32 = a.offsets32.iter().zip(&b.offsets32).map(|(&p, &q)| p && q).collect();
    Spec { tensors, shape_pow2, shape_div, shape_exact, offsets32, ..a }
}

/// One parameter's word in a grouped launch's table (see `EmittedKernel::grouped`).
fn param_word(name: &str, kernel: &Kernel, p: &KernelParam, args: &[Arg<'_>], shapes: &[u64]) -> Result<i64> {
    let tensor = |id: kfuse_ir::ParamId| -> Result<&Tensor> {
        args.get(id.0 as usize)
            .and_then(|a| a.tensor())
            .ok_or_else(|| Error::InvalidArgument(format!("`{name}` takes parameter #{} as a tensor, but it is not one", id.0)))
    };
    Ok(match *p {
        KernelParam::Ptr(id) => tensor(id)?.device_ptr().ok_or_else(|| Error::InvalidArgument("a CPU tensor in a GPU launch".into()))? as i64,
        KernelParam::Stride { tensor: id, dim } => {
            let t = tensor(id)?;
            *t.strides().get(dim as usize).ok_or_else(|| Error::InvalidArgument(format!("`{name}` takes the stride of dimension {dim} of a tensor of rank {}", t.rank())))? as i64
        }
        KernelParam::Shape(s) => *shapes.get(s.0 as usize).ok_or_else(|| Error::InvalidArgument(format!("`{name}` takes shape symbol #{}, which the kernel does not have", s.0)))? as i64,
        KernelParam::Scalar(id) => {
            let pd = kernel.params.get(id.0 as usize).map(|p| p.dtype);
            match (pd, args.get(id.0 as usize)) {
                (Some(DType::F32), Some(Arg::Scalar(s))) => (s.as_f64() as f32).to_bits() as i64,
                (Some(DType::I64), Some(Arg::Scalar(Scalar::I64(v)))) => *v,
                _ => return Err(Error::InvalidArgument(format!("`{name}` takes parameter #{} as an f32 or i64 scalar", id.0))),
            }
        }
        KernelParam::DivMagic(ref of) => match **of {
            KernelParam::Scalar(_) | KernelParam::Shape(_) => kfuse_codegen::target::div_magic(param_word(name, kernel, of, args, shapes)?),
            _ => return Err(Error::InvalidArgument(format!("`{name}` divides by a parameter that is not an i64 scalar or a shape"))),
        },
        KernelParam::TensorMap { .. } => return Err(Error::InvalidArgument(format!("`{name}`: a grouped launch cannot pass tensor maps"))),
    })
}

/// The loaded kernel of a module key on a GPU: from the device's cache, else the kernel
/// an earlier process generated for it ([`crate::launch_index`]), else generated; then
/// compiled through the module cache and loaded.
fn load(device: &Device, kernel: &Kernel, key: &ModuleKey) -> Result<(Arc<LoadedKernel>, CacheOutcome)> {
    let gpu = device.gpu_ref().expect("a GPU");
    if let Some(k) = gpu.functions.get(key) {
        return Ok((k, CacheOutcome::Memory));
    }
    let _span = tracing::debug_span!(target: "kfuse::runtime", "build", kernel = %key.kernel, target = %key.target.arch()).entered();
    let started = std::time::Instant::now();
    // (the process's first lookup reads the compiler's fingerprint too)
    let ((index, found), d) = crate::build_times::measured(crate::build_times::Step::Index, || {
        let index = crate::launch_index::LaunchIndex::current();
        let found = index.key(kernel, &key.dtypes, &key.spec, &key.target).map(|ikey| {
            let hit = index.get(&ikey).filter(|e| e.arch == key.target.arch());
            (ikey, hit)
        });
        (index, found)
    });
    tracing::debug!(target: "kfuse::runtime", kernel = %key.kernel, hit = found.as_ref().is_some_and(|f| f.1.is_some()), elapsed_ms = crate::build_times::ms(d), "launch index read");
    let (ikey, hit) = found.unzip();
    if let Some(emitted) = hit.flatten() {
        // the kernel the fallbacks chose when the entry was written; one that spills
        // now while a later attempt exists (another NVRTC since), or fails to load,
        // goes the way of a miss
        let (a, n) = emitted.register_attempt;
        match gpu.functions.get_or_load(&emitted, |m, e| device.load_module(m, &e.arch, &e.entry, e.smem_bytes, e.plan.min_blocks, e.cluster_x)) {
            Ok((k, o)) if k.local_bytes == 0 || a + 1 >= n => {
                tracing::debug!(target: "kfuse::runtime", kernel = %key.kernel, outcome = ?o, elapsed_ms = crate::build_times::ms(started.elapsed()), "kernel ready");
                gpu.functions.insert(key.clone(), k.clone());
                return Ok((k, o));
            }
            Ok(_) => tracing::debug!(target: "kfuse::runtime", kernel = %key.kernel, attempt = a, "launch index entry spills: generating again"),
            Err(e) => tracing::debug!(target: "kfuse::runtime", kernel = %key.kernel, error = %e, "launch index entry failed to load: generating again"),
        }
    }
    let (emitted, k, o) = generated(device, kernel, key)?;
    if let Some(ikey) = ikey {
        index.put(&ikey, &emitted);
    }
    tracing::debug!(target: "kfuse::runtime", kernel = %key.kernel, outcome = ?o, elapsed_ms = crate::build_times::ms(started.elapsed()), "kernel ready");
    gpu.functions.insert(key.clone(), k.clone());
    Ok((k, o))
}

/// The kernel of a module key generated by codegen, compiled through the module cache
/// and loaded: of its register-room attempts (`EmittedKernel::register_attempt`), the
/// first whose function the driver's assembler built without local memory (spills).
/// Returns it as codegen emitted it, and as loaded (a source hook's edit included).
fn generated(device: &Device, kernel: &Kernel, key: &ModuleKey) -> Result<(EmittedKernel, Arc<LoadedKernel>, CacheOutcome)> {
    let gpu = device.gpu_ref().expect("a GPU");
    // (the build times count the attempts' compiles and loads as their own steps, not as
    // codegen)
    let started = std::time::Instant::now();
    let mut attempts = std::time::Duration::ZERO;
    let emitted = kfuse_codegen::compile_with_fallbacks(kernel, &key.spec, &key.target, |e| -> Result<bool> {
        let t = std::time::Instant::now();
        let r = gpu.functions.get_or_load(e, |m, e| device.load_module(m, &e.arch, &e.entry, e.smem_bytes, e.plan.min_blocks, e.cluster_x));
        attempts += t.elapsed();
        Ok(r?.0.local_bytes > 0)
    });
    let codegen = started.elapsed().saturating_sub(attempts);
    crate::build_times::add(crate::build_times::Step::Codegen, codegen);
    tracing::debug!(target: "kfuse::codegen", kernel = %key.kernel, ok = emitted.is_ok(), elapsed_ms = crate::build_times::ms(codegen), "codegen");
    let emitted = emitted?;
    let (k, o) = gpu.functions.get_or_load(&emitted, |m, e| device.load_module(m, &e.arch, &e.entry, e.smem_bytes, e.plan.min_blocks, e.cluster_x))?;
    Ok((emitted, k, o))
}

/// `KFUSE_AUTOTUNE=1` (see [`crate::autotune`]): the tiles to launch a GPU kernel with,
/// `None` to keep the heuristic's (no `dot`, a single candidate, or no candidate ran).
/// A known bucket gives its winner (explicit `KFUSE_TILES` entries on top) and times
/// nothing. An unknown one times each candidate with the real arguments — 2 warm-up
/// launches, then the median of 5 timed with CUDA events — skipping those that fail to
/// compile, load or launch, and stores the fastest. The timing launches write the
/// outputs, which the launch that follows overwrites; no output shares storage with an
/// input (`check`), so the inputs are the same for every run.
#[allow(clippy::too_many_arguments)]
fn autotune(
    def: &KernelDef,
    dtypes: &[DType],
    kernel: &Kernel,
    spec: &Spec,
    target: &Target,
    device: &Device,
    args: &[Arg<'_>],
    shapes: &[u64],
) -> Result<Option<std::collections::BTreeMap<String, u32>>> {
    use crate::autotune::{bucket_key, count_timing, merge_tiles, Store, Winner};
    let store = Store::current();
    // the printed IR (part of the bucket key) once per kernel and dtypes, not per launch
    type IrText = Mutex<HashMap<(usize, &'static str, Vec<DType>), Arc<String>>>;
    static IR: OnceLock<IrText> = OnceLock::new();
    let ir = IR
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((def.build as usize, def.name, dtypes.to_vec()))
        .or_insert_with(|| Arc::new(kfuse_ir::print::print(kernel)))
        .clone();
    let bucket = bucket_key(def.name, &ir, spec, &device.name(), target);
    if let Some(w) = store.get(&bucket) {
        return Ok(Some(merge_tiles(&w, &spec.tiles)));
    }
    let candidates = kfuse_codegen::tuning_candidates(kernel, spec, target);
    if candidates.len() < 2 {
        return Ok(None);
    }
    let mut best: Option<(f64, std::collections::BTreeMap<String, u32>)> = None;
    let progress = crate::autotune::Progress::new(def.name, candidates.len());
    for (i, tiles) in candidates.into_iter().enumerate() {
        progress.at(i, &tiles);
        let key = ModuleKey { build: def.build as usize, kernel: def.name.to_string(), dtypes: dtypes.to_vec(), spec: Spec { tiles: tiles.clone(), ..spec.clone() }, target: target.clone() };
        let Ok((loaded, _)) = load(device, kernel, &key) else { continue };
        count_timing();
        let Ok(mut times) = device.time_ms(2, 5, || issue(device, &loaded, kernel, args, shapes).map(|_| ())) else {
            // a failed launch may leave an error on the stream: clear it before the next
            let _ = device.synchronize();
            continue;
        };
        times.sort_by(f32::total_cmp);
        let median = times[times.len() / 2] as f64;
        if best.as_ref().is_none_or(|(b, _)| median < *b) {
            best = Some((median, tiles));
        }
    }
    let Some((ms, tiles)) = best else { return Ok(None) };
    let w = Winner { kernel: def.name.to_string(), device: device.name(), arch: target.arch(), tiles: tiles.clone(), ms };
    store.put(&bucket, &w);
    Ok(Some(tiles))
}

/// The IR of `def` for `dtypes` and its grid, built once per process: building is
/// deterministic, and a launch should not pay for it (nor for the verifier) every time.
fn built_ir(def: &KernelDef, dtypes: &[DType]) -> Result<BuiltIr> {
    // by the def's build function, then its name and dtypes (looked up without
    // allocating: this runs on every launch)
    type ByBuild = HashMap<usize, Vec<(&'static str, Vec<DType>, BuiltIr)>>;
    static CACHE: OnceLock<Mutex<ByBuild>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let find = |m: &ByBuild| {
        m.get(&(def.build as usize)).and_then(|v| v.iter().find(|e| e.0 == def.name && e.1 == dtypes)).map(|e| e.2.clone())
    };
    if let Some(k) = find(&cache.lock().unwrap_or_else(|e| e.into_inner())) {
        return Ok(k);
    }
    let (built, d) = crate::build_times::measured(crate::build_times::Step::Ir, || -> Result<_> {
        let kernel = (def.build)(dtypes)?;
        let grid = kfuse_ir::grid::derive(&kernel)?;
        let operands = matrix_operands(&kernel);
        Ok((kernel, grid, operands))
    });
    tracing::debug!(target: "kfuse::runtime", kernel = %def.name, ?dtypes, elapsed_ms = crate::build_times::ms(d), "IR build");
    let built = Arc::new(built?);
    let mut m = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = find(&m) {
        return Ok(k);
    }
    m.entry(def.build as usize).or_default().push((def.name, dtypes.to_vec(), built.clone()));
    Ok(built)
}

/// Launches an already emitted kernel (hand-written or from [`emit_for`]) on GPU
/// tensors: `kernel` is the IR it was emitted from (its parameters describe the
/// arguments; dtypes are concrete). Checks, empty-launch skipping and the launch itself
/// are those of [`launch`]; the codegen step is skipped.
pub fn launch_emitted(emitted: &EmittedKernel, kernel: &Kernel, args: &mut [Arg<'_>]) -> Result<Launched> {
    let args: &[Arg<'_>] = args;
    let checked = check(&kernel.name, &[], &kernel_params(kernel), args)?;
    let shapes = shape_values(kernel, args)?;
    let Some(device) = checked.device.filter(|d| d.is_gpu()) else {
        return Err(Error::InvalidArgument(format!("launch_emitted runs `{}` on a GPU: its tensor arguments must live on one", kernel.name)));
    };
    let mut launched = Launched { backend: backend_of(&Some(device.clone())), kernel: kernel.name.clone(), skipped_empty: false, cache: None, build: None, plan: None };
    if emitted.grid_dims(&shapes).contains(&0) || any_output_empty(args) {
        launched.skipped_empty = true;
        return Ok(launched);
    }
    let gpu = device.gpu_ref().expect("a GPU");
    let (loaded, outcome) = gpu.functions.get_or_load(emitted, |m, e| device.load_module(m, &e.arch, &e.entry, e.smem_bytes, e.plan.min_blocks, e.cluster_x))?;
    launched.skipped_empty = !issue(&device, &loaded, kernel, args, &shapes)?;
    launched.cache = Some(outcome);
    record_kernel(&mut launched, &loaded);
    Ok(launched)
}

/// Whether `KFUSE_SYNC=1`: synchronize after every launch.
fn sync_each_launch() -> bool {
    crate::settings::current().sync
}

/// One kernel parameter value.
///
/// cudarc's launch builder records a pointer to each argument (`&T` with `T:
/// DeviceRepr`) and `cuLaunchKernel` copies each parameter from its pointer, with the size
/// the kernel image gives it. So every value, the 128-byte tensor map included, is built
/// into this list first and only then pushed: the list is neither moved nor grown while
/// the builder holds pointers into it, and it lives until the launch call returns.
/// [`TensorMap`](crate::tma::TensorMap) implements `DeviceRepr` for exactly this (the
/// kernel declares `const __grid_constant__ CUtensorMap`, passed by value).
enum PVal {
    U64(u64),
    I64(i64),
    F32(f32),
    Map(crate::tma::TensorMap),
}

/// Launches a loaded kernel on checked arguments, on the grid [`EmittedKernel::grid_dims`]
/// gives (persistent kernels and clusters included). Returns false, launching nothing,
/// when that grid is empty (the callers' own empty checks make this a safety net).
fn issue(device: &Device, k: &LoadedKernel, kernel: &Kernel, args: &[Arg<'_>], shapes: &[u64]) -> Result<bool> {
    let e = &k.emitted;
    let gpu = device.gpu_ref().expect("a GPU");
    let name = &e.entry;
    if e.grid.len() > 3 {
        return Err(Error::InvalidArgument(format!("`{name}` has a {}-dimensional grid; CUDA allows 3", e.grid.len())));
    }
    if e.grid.iter().any(|a| a.dim.0 as usize >= shapes.len()) {
        return Err(Error::InvalidArgument(format!("the grid of `{name}` refers to a shape symbol the kernel does not have")));
    }
    let g = match e.persistent {
        Some(_) => e.grid_dims_resident(shapes, *k.resident.get_or_init(|| resident(k, &gpu.stream))),
        None => e.grid_dims(shapes),
    };
    if g.contains(&0) {
        return Ok(false);
    }
    if g[0] >= 1 << 31 || g[1] > 65535 || g[2] > 65535 {
        return Err(Error::InvalidArgument(format!(
            "`{name}` needs a grid of {g:?} blocks; CUDA allows x < 2^31 and y, z ≤ 65535 (the tensors are too large for this kernel's tiling)"
        )));
    }
    if e.block_threads == 0 || e.block_threads > 1024 {
        return Err(Error::InvalidArgument(format!("`{name}` asks for {} threads per block; CUDA allows 1 to 1024", e.block_threads)));
    }
    PARAMS.with_borrow_mut(|vals| {
        vals.clear();
        param_values(k, kernel, args, shapes, vals)?;
        launch_raw(device, k, g, vals)
    })?;
    if sync_each_launch() {
        gpu.sync().map_err(|err| Error::Driver(format!("kernel `{name}` failed: {err}")))?;
    }
    Ok(true)
}

thread_local! {
    /// The parameter values of the launch under way on this thread (reused: a launch
    /// allocates nothing for them).
    static PARAMS: std::cell::RefCell<Vec<PVal>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The values of `k`'s parameters, in [`EmittedKernel::params`] order, into `vals`.
fn param_values(k: &LoadedKernel, kernel: &Kernel, args: &[Arg<'_>], shapes: &[u64], vals: &mut Vec<PVal>) -> Result<()> {
    let e = &k.emitted;
    let name = &e.entry;
    let tensor = |p: kfuse_ir::ParamId| -> Result<&Tensor> {
        args.get(p.0 as usize)
            .and_then(|a| a.tensor())
            .ok_or_else(|| Error::InvalidArgument(format!("`{name}` takes parameter #{} as a tensor, but it is not one", p.0)))
    };
    for (slot, p) in e.params.iter().enumerate() {
        vals.push(match *p {
            KernelParam::TensorMap { tensor: id, ref box_dims, swizzle, ref order } => {
                let t = tensor(id)?;
                PVal::Map(k.maps.get_or_encode(slot, t, || encode_map(name, t, id, box_dims, swizzle, order))?)
            }
            KernelParam::Ptr(id) => PVal::U64(tensor(id)?.device_ptr().ok_or_else(|| Error::InvalidArgument("a CPU tensor in a GPU launch".into()))?),
            KernelParam::Stride { tensor: id, dim } => {
                let t = tensor(id)?;
                let s = t.strides().get(dim as usize).ok_or_else(|| {
                    Error::InvalidArgument(format!("`{name}` takes the stride of dimension {dim} of a tensor of rank {}", t.rank()))
                })?;
                PVal::I64(*s as i64)
            }
            KernelParam::Shape(s) => PVal::I64(
                *shapes
                    .get(s.0 as usize)
                    .ok_or_else(|| Error::InvalidArgument(format!("`{name}` takes shape symbol #{}, which the kernel does not have", s.0)))?
                    as i64,
            ),
            KernelParam::Scalar(id) => {
                let pd = kernel.params.get(id.0 as usize).map(|p| p.dtype);
                match (pd, args.get(id.0 as usize)) {
                    (Some(DType::F32), Some(Arg::Scalar(s))) => PVal::F32(s.as_f64() as f32),
                    (Some(DType::I64), Some(Arg::Scalar(Scalar::I64(v)))) => PVal::I64(*v),
                    _ => return Err(Error::InvalidArgument(format!("`{name}` takes parameter #{} as an f32 or i64 scalar", id.0))),
                }
            }
            // (the word a grouped launch's table holds for it)
            KernelParam::DivMagic(_) => PVal::I64(param_word(name, kernel, p, args, shapes)?),
        });
    }
    Ok(())
}

/// `cuLaunchKernel` of `k` on the device's stream over grid `g` with the parameter
/// values `vals` (pointers to them on the stack; no allocation).
fn launch_raw(device: &Device, k: &LoadedKernel, g: [u64; 3], vals: &mut [PVal]) -> Result<()> {
    let e = &k.emitted;
    let gpu = device.gpu_ref().expect("a GPU");
    const INLINE: usize = 32;
    let mut inline = [std::ptr::null_mut::<std::ffi::c_void>(); INLINE];
    let mut spilled = Vec::new();
    let ptrs: &mut [*mut std::ffi::c_void] = if vals.len() <= INLINE { &mut inline[..vals.len()] } else { spilled.resize(vals.len(), std::ptr::null_mut()); &mut spilled };
    for (p, v) in ptrs.iter_mut().zip(vals.iter_mut()) {
        *p = match v {
            PVal::U64(x) => x as *mut u64 as *mut _,
            PVal::I64(x) => x as *mut i64 as *mut _,
            PVal::F32(x) => x as *mut f32 as *mut _,
            PVal::Map(x) => x as *mut crate::tma::TensorMap as *mut _,
        };
    }
    gpu.bind()?;
    // (an event only at `trace` for `kfuse::launch`; off, one relaxed load of the level)
    let traced = tracing::enabled!(target: "kfuse::launch", tracing::Level::TRACE).then(std::time::Instant::now);
    // SAFETY: the parameters follow `emitted.params`, which the codegen wrote the
    // kernel's signature from, each pointer to a value of its parameter's size that
    // lives until the call returns (`cuLaunchKernel` copies them); pointers are live
    // allocations of this device, and the kernel masks its accesses to the shapes
    // passed.
    let r = unsafe {
        cudarc::driver::result::launch_kernel(
            k.func.cu_function(),
            (g[0] as u32, g[1] as u32, g[2] as u32),
            (e.block_threads, 1, 1),
            e.smem_bytes,
            gpu.stream.cu_stream(),
            ptrs,
        )
    }
    .map_err(driver(format_args!(
        "launching `{}` (grid {g:?}, {} threads, {} bytes of shared memory) on {}",
        e.entry,
        e.block_threads,
        e.smem_bytes,
        device.description()
    )));
    if let Some(t) = traced {
        let host_us = t.elapsed().as_secs_f64() * 1e6;
        tracing::trace!(target: "kfuse::launch", kernel = %e.entry, grid = ?g, threads = e.block_threads, smem_bytes = e.smem_bytes, host_us, ok = r.is_ok(), "launch");
    }
    r
}

/// What of a loaded kernel the device holds at once (see `LoadedKernel::resident`): the
/// driver's occupancy calculator, 0 when it cannot say.
fn resident(k: &LoadedKernel, stream: &cudarc::driver::CudaStream) -> u32 {
    let e = &k.emitted;
    if e.cluster_x > 1 {
        let cfg = LaunchConfig { grid_dim: (e.cluster_x, 1, 1), block_dim: (e.block_threads, 1, 1), shared_mem_bytes: e.smem_bytes };
        k.func.occupancy_max_active_clusters(cfg, stream).unwrap_or(0)
    } else {
        k.func.occupancy_max_active_blocks_per_multiprocessor(e.block_threads, e.smem_bytes as usize, None).unwrap_or(0)
    }
}

/// A lock on host storage held during an interpreter run.
enum Guard<'a> {
    R(RwLockReadGuard<'a, Vec<u8>>),
    W(RwLockWriteGuard<'a, Vec<u8>>),
}

enum Slice<'a> {
    R(&'a [u8]),
    W(&'a mut [u8]),
}

/// Runs the interpreter on checked CPU arguments with the tile sizes `tiles` (by name;
/// 16 for the others). Each distinct storage is locked once (write for outputs, read for
/// inputs), in address order so that concurrent launches cannot deadlock.
fn run_interpreter(kernel: &Kernel, args: &[Arg<'_>], tiles: &std::collections::BTreeMap<String, u32>) -> Result<()> {
    use kfuse_ir::interp;
    let internal = |m: &str| Error::InvalidArgument(format!("internal: {m}"));
    let mut locks: Vec<(usize, &RwLock<Vec<u8>>, bool)> = Vec::new();
    for a in args {
        let Some(t) = a.tensor() else { continue };
        let (id, l) = t.host_lock().ok_or_else(|| internal("a GPU tensor in an interpreter run"))?;
        let w = matches!(a, Arg::Out(_));
        match locks.iter_mut().find(|e| e.0 == id) {
            Some(e) => e.2 |= w,
            None => locks.push((id, l, w)),
        }
    }
    locks.sort_by_key(|e| e.0);
    let mut guards: Vec<(usize, Guard<'_>)> = locks
        .iter()
        .map(|&(id, l, w)| {
            (id, if w { Guard::W(l.write().unwrap_or_else(|e| e.into_inner())) } else { Guard::R(l.read().unwrap_or_else(|e| e.into_inner())) })
        })
        .collect();
    let mut slices: HashMap<usize, Slice<'_>> = guards
        .iter_mut()
        .map(|(id, g)| {
            (
                *id,
                match g {
                    Guard::R(r) => Slice::R(&r[..]),
                    Guard::W(w) => Slice::W(&mut w[..]),
                },
            )
        })
        .collect();
    let mut iargs = Vec::with_capacity(args.len());
    for a in args {
        iargs.push(match a {
            Arg::In(t) => {
                let id = t.host_lock().map(|x| x.0).unwrap_or(0);
                let data: &[u8] = match slices.get(&id) {
                    Some(Slice::R(d)) => d,
                    _ => return Err(internal("an input shares storage with an output")),
                };
                interp::Arg::In(interp::TensorRef { dtype: t.dtype(), shape: t.shape(), strides: t.strides(), offset: t.offset(), data })
            }
            Arg::Out(t) => {
                let id = t.host_lock().map(|x| x.0).unwrap_or(0);
                let data = match slices.remove(&id) {
                    Some(Slice::W(d)) => d,
                    _ => return Err(internal("two outputs share storage")),
                };
                interp::Arg::Out(interp::TensorMut { dtype: t.dtype(), shape: t.shape(), strides: t.strides(), offset: t.offset(), data })
            }
            Arg::Scalar(s) => interp::Arg::Scalar(s.as_f64()),
        });
    }
    // (a tile map of a few entries: cloning it is nothing next to interpreting)
    interp::run(kernel, &mut iargs, &interp::Options::with_tiles(tiles.clone()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_divisibility() {
        assert_eq!(pow2_div(0), 16);
        assert_eq!(pow2_div(1), 1);
        assert_eq!(pow2_div(6), 2);
        assert_eq!(pow2_div(8), 8);
        assert_eq!(pow2_div(4096), 16);
        assert_eq!(pow2_div(0x7f00_0000_0104), 4);
    }

    #[test]
    fn offsets_fit_32_bits_below_2_pow_31() {
        let fits = |shape: &[usize], strides: &[isize]| offsets_fit_32(&TensorDesc { dtype: DType::BF16, shape: shape.to_vec(), strides: strides.to_vec(), byte_offset: 0 });
        // the last element's offset: (extent − 1) · stride summed
        assert!(fits(&[64, 56, 56, 256], &[56 * 56 * 256, 56 * 256, 256, 1]));
        assert!(fits(&[1 << 31], &[1]), "offsets up to 2^31 − 1");
        assert!(!fits(&[(1 << 31) + 1], &[1]), "an offset of 2^31");
        assert!(fits(&[2, 1 << 30], &[1 << 30, 1]), "2^30 + 2^30 − 1");
        assert!(!fits(&[3, 1 << 30], &[1 << 30, 1]), "2^31 + 2^30 − 1");
        assert!(!fits(&[2, 8], &[1 << 31, 1]), "a stride alone reaches 2^31");
        assert!(fits(&[1, 8], &[1 << 40, 1]), "an extent of 1 never steps its stride");
        assert!(fits(&[0, 8], &[1 << 40, 1]), "no elements");
        assert!(!fits(&[4, 8], &[-8, 1]), "a negative stride");
        assert!(fits(&[], &[]), "a scalar tensor");
    }

    #[test]
    fn backend_display() {
        assert_eq!(Backend::Interpreter.to_string(), "CPU interpreter");
        assert_eq!(Backend::Gpu { device: "cuda:0 (X)".into() }.to_string(), "GPU cuda:0 (X)");
    }
}


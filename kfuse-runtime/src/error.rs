//! The runtime's error type.
//!
//! Owns: [`Error`], every way a runtime call can fail, and the wording users see.
//!
//! Invariants:
//! - every message says what was wrong *and* what to do about it where there is
//!   something to do (`.contiguous()`, how to install NVRTC, …);
//! - no runtime call panics on a missing CUDA library or device: those are [`Error::NoGpu`]
//!   and [`Error::NvrtcMissing`];
//! - [`Error::Nvrtc`] carries the compiler log *and* the generated source, which its
//!   `Display` prints with line numbers so that the log's `(LINE)` references can be
//!   followed.
//!
//! `Display` and `std::error::Error` are written by hand rather than derived: the
//! `Nvrtc` variant has a field named `source` (the CUDA source), which `thiserror`
//! would take for the error's cause.

use std::fmt;

/// A runtime error. See the module docs.
#[derive(Debug)]
pub enum Error {
    /// Tensor shapes do not fit together (argument checking, `reshape`, `from_*`).
    ShapeMismatch(String),
    /// Element types do not fit together.
    DTypeMismatch(String),
    /// An operation needs a packed row-major tensor and got a strided view.
    NonContiguous {
        /// The operation and argument that needs the packed tensor.
        what: String,
        /// The view's shape.
        shape: Vec<usize>,
        /// The view's strides, in elements.
        strides: Vec<isize>,
    },
    /// Tensors of one call live on different devices.
    DeviceMismatch(String),
    /// An output tensor shares storage with another argument of the same call.
    Aliasing(String),
    /// Anything else the caller got wrong (argument counts and kinds, bounds, limits).
    InvalidArgument(String),
    /// A GPU was asked for and there is none usable (no driver library, no device, bad
    /// ordinal).
    NoGpu {
        /// What was missing or failed.
        reason: String,
    },
    /// libnvrtc could not be loaded; `searched` lists the places and names tried.
    NvrtcMissing {
        /// The paths and library names tried, in order.
        searched: Vec<String>,
    },
    /// NVRTC rejected a source: its log and the source it was given.
    Nvrtc {
        /// NVRTC's compile log.
        log: String,
        /// The CUDA source it compiled.
        source: String,
    },
    /// A CUDA driver call failed (allocation, copy, module load, launch, …).
    Driver(String),
    /// Code generation failed.
    Codegen(kfuse_codegen::CodegenError),
    /// Building, verifying or interpreting the IR failed.
    Ir(kfuse_ir::IrError),
    /// A file-system error (the disk cache).
    Io(std::io::Error),
    /// ptxas, the CUDA assembler [`crate::explain()`] runs (`ptxas -v`), is missing or
    /// failed ([`crate::ptxas`]); the message says which, and how to get it.
    Ptxas(String),
    /// A vendor library used for baselines (cuBLAS, cuBLASLt; the `vendor` module, cargo
    /// feature `vendor-baselines`) is missing or failed.
    Vendor(String),
}

/// The runtime's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// How to get libnvrtc (used by [`Error::NvrtcMissing`]'s message).
pub const NVRTC_INSTALL_HINT: &str = "install it with\n    \
     python3 -m pip install --target .cuda \"nvidia-cuda-nvrtc==13.0.*\"\n    \
     export LD_LIBRARY_PATH=$PWD/.cuda/nvidia/cu13/lib:$LD_LIBRARY_PATH\n\
     (kfuse also looks in ./.cuda and its parent directories, and in $KFUSE_CUDA_PIP), \
     or install the CUDA toolkit 13.0 and set CUDA_HOME";

/// Prefixes every line of `source` with its 1-based number (as NVRTC logs cite them).
pub fn numbered(source: &str) -> String {
    let n = source.lines().count().max(1);
    let w = n.to_string().len();
    let mut out = String::with_capacity(source.len() + n * (w + 3));
    for (i, line) in source.lines().enumerate() {
        out.push_str(&format!("{:>w$} | {}\n", i + 1, line, w = w));
    }
    out
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::ShapeMismatch(m) => write!(f, "shape mismatch: {m}"),
            Error::DTypeMismatch(m) => write!(f, "dtype mismatch: {m}"),
            Error::NonContiguous { what, shape, strides } => write!(
                f,
                "{what} needs a contiguous (packed row-major) tensor, but it has shape {shape:?} and strides {strides:?}; \
                 call `.contiguous()` on it first to get a packed copy"
            ),
            Error::DeviceMismatch(m) => write!(f, "tensors are on different devices: {m}"),
            Error::Aliasing(m) => write!(f, "aliasing: {m}"),
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::NoGpu { reason } => write!(f, "no usable GPU: {reason}"),
            Error::NvrtcMissing { searched } => {
                writeln!(f, "NVRTC (libnvrtc, the CUDA runtime compiler) could not be loaded. Searched:")?;
                for s in searched {
                    writeln!(f, "  - {s}")?;
                }
                write!(f, "To fix it, {NVRTC_INSTALL_HINT}")
            }
            Error::Nvrtc { log, source } => {
                writeln!(f, "NVRTC failed to compile the generated kernel:")?;
                writeln!(f, "{}", log.trim_end())?;
                writeln!(f, "--- generated source ---")?;
                write!(f, "{}", numbered(source))
            }
            Error::Driver(m) => write!(f, "CUDA driver error: {m}"),
            Error::Codegen(e) => write!(f, "code generation failed: {e}"),
            Error::Ir(e) => write!(f, "{e}"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Ptxas(m) => write!(f, "ptxas: {m}"),
            Error::Vendor(m) => write!(f, "vendor library: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Codegen(e) => Some(e),
            Error::Ir(e) => Some(e),
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<kfuse_codegen::CodegenError> for Error {
    fn from(e: kfuse_codegen::CodegenError) -> Error {
        Error::Codegen(e)
    }
}

impl From<kfuse_ir::IrError> for Error {
    fn from(e: kfuse_ir::IrError) -> Error {
        Error::Ir(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Error {
        Error::Driver(driver_error_text(e))
    }
}

/// `CUDA_ERROR_X: description` for a driver error (the name and the driver's string).
pub(crate) fn driver_error_text(e: cudarc::driver::DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name}: {}", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// Wraps a driver error with what was being done.
pub(crate) fn driver(what: impl fmt::Display) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| Error::Driver(format!("{what}: {}", driver_error_text(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_lines() {
        assert_eq!(numbered("a\nb"), "1 | a\n2 | b\n");
        let src: String = (0..12).map(|i| format!("l{i}\n")).collect();
        let n = numbered(&src);
        assert!(n.starts_with(" 1 | l0\n"));
        assert!(n.contains("12 | l11\n"));
    }

    #[test]
    fn nvrtc_error_shows_log_and_numbered_source() {
        let e = Error::Nvrtc { log: "kernel.cu(2): error: identifier \"x\" is undefined".into(), source: "int a;\nint b = x;\n".into() };
        let s = e.to_string();
        assert!(s.contains("identifier \"x\" is undefined"), "{s}");
        assert!(s.contains("2 | int b = x;"), "{s}");
    }

    #[test]
    fn nvrtc_missing_lists_places_and_install_hint() {
        let e = Error::NvrtcMissing { searched: vec!["/nowhere/libnvrtc.so.13".into(), "LD_LIBRARY_PATH (unset)".into()] };
        let s = e.to_string();
        assert!(s.contains("/nowhere/libnvrtc.so.13"));
        assert!(s.contains("LD_LIBRARY_PATH (unset)"));
        assert!(s.contains("python3 -m pip install --target .cuda \"nvidia-cuda-nvrtc==13.0.*\""));
        assert!(s.contains("export LD_LIBRARY_PATH=$PWD/.cuda/nvidia/cu13/lib:$LD_LIBRARY_PATH"));
        assert!(s.contains("CUDA toolkit"));
    }

    #[test]
    fn non_contiguous_says_how_to_fix() {
        let e = Error::NonContiguous { what: "reshape".into(), shape: vec![3, 2], strides: vec![1, 3] };
        assert!(e.to_string().contains(".contiguous()"));
    }
}

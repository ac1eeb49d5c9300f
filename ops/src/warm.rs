//! Warming the module cache ahead of time: a list of op calls (op, dtype, input shapes)
//! run once each on a device, so that every kernel they need is compiled into the disk
//! cache and later processes find it there.
//!
//! Owns: [`WarmCall`] (one line of a list: `gemm bf16 4096x4096 4096x4096`), its parser,
//! and [`warm`].
//!
//! A call runs the op on inputs of the given shapes whose contents are left as the
//! allocator gives them (the results are dropped), so it costs one launch of each kernel
//! besides the compile. The kernels it compiles are those of a later call with
//! contiguous inputs of the same shapes and dtype on the same kind of device: each
//! kernel is specialized on its shapes, so a list names the shapes a program will use.

use kfuse_runtime::{DType, Device, Error, Result, Tensor};

use crate::{Dim, GemmOptions};

/// One op call to compile ahead of time (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmCall {
    /// The op's name in [`WARM_OPS`].
    pub op: String,
    /// The dtype of every input.
    pub dtype: DType,
    /// The shapes of the op's tensor inputs, in its argument order (a norm's weight and
    /// bias follow from `x`: `[N]`).
    pub shapes: Vec<Vec<usize>>,
}

/// The ops [`warm`] knows, with how many input shapes each takes.
pub const WARM_OPS: &[(&str, usize)] = &[
    ("add", 2),
    ("sub", 2),
    ("mul", 2),
    ("div", 2),
    ("swiglu", 2),
    ("scale", 1),
    ("silu", 1),
    ("gelu", 1),
    ("gelu_tanh", 1),
    ("copy", 1),
    ("transpose", 1),
    ("sum", 1),
    ("mean", 1),
    ("max", 1),
    ("min", 1),
    ("sum_all", 1),
    ("softmax", 1),
    ("log_softmax", 1),
    ("rms_norm", 1),
    ("add_rms_norm", 2),
    ("layer_norm", 1),
    ("gemm", 2),
    ("gemm_batched", 2),
    ("swiglu_gemm", 3),
];

impl std::str::FromStr for WarmCall {
    type Err = Error;

    /// `OP DTYPE SHAPE...`, whitespace-separated, each shape its sizes joined by `x`
    /// (`4096x4096`; a rank-1 shape is one number): `softmax bf16 8192x4096`,
    /// `gemm f16 127x4096 4096x4096`.
    fn from_str(line: &str) -> Result<WarmCall> {
        let bad = |why: String| Error::InvalidArgument(format!("warm list line {line:?}: {why}"));
        let mut words = line.split_whitespace();
        let op = words.next().ok_or_else(|| bad("empty".into()))?;
        let &(_, arity) = WARM_OPS.iter().find(|(n, _)| *n == op).ok_or_else(|| {
            bad(format!("unknown op `{op}` (known: {})", WARM_OPS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")))
        })?;
        let dt = words.next().ok_or_else(|| bad("no dtype".into()))?;
        let dtype = DType::from_name(dt).ok_or_else(|| bad(format!("unknown dtype `{dt}`")))?;
        let shapes = words
            .map(|w| w.split('x').map(|d| d.parse::<usize>().map_err(|e| bad(format!("shape `{w}`: {e}")))).collect::<Result<Vec<_>>>())
            .collect::<Result<Vec<_>>>()?;
        if shapes.len() != arity {
            return Err(bad(format!("`{op}` takes {arity} input shape(s), {} given", shapes.len())));
        }
        Ok(WarmCall { op: op.to_string(), dtype, shapes })
    }
}

/// Parses a warm list: one [`WarmCall`] a line; empty lines and `#` comments are
/// skipped.
///
/// # Examples
///
/// ```
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// let calls = kfuse::ops::parse_warm_list("# serving shapes\ngemm bf16 4096x4096 4096x4096\nsoftmax bf16 8192x4096\n")?;
/// assert_eq!(calls.len(), 2);
/// assert_eq!((calls[0].op.as_str(), calls[0].dtype, &calls[1].shapes[0]), ("gemm", DType::BF16, &vec![8192, 4096]));
/// assert!(kfuse::ops::parse_warm_list("gemm bf16 4096x4096").is_err()); // gemm takes two shapes
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn parse_warm_list(text: &str) -> Result<Vec<WarmCall>> {
    text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()).map(str::parse).collect()
}

/// Runs each call once on `device` (module docs) and waits for the device; every kernel
/// the calls need is then in the module cache (on disk, unless the disk level is off).
/// The first failing call's error is returned, naming it.
///
/// # Examples
///
/// ```no_run
/// # mod kfuse { pub mod ops { pub use kfuse_ops::*; } pub use kfuse_runtime::{DType, Device, Error, Tensor}; }
/// use kfuse::{DType, Device, Tensor};
///
/// // at deploy time, on the GPU the service will run on
/// let calls = kfuse::ops::parse_warm_list(&std::fs::read_to_string("warm.txt")?)?;
/// kfuse::ops::warm(&Device::gpu(0)?, &calls)?;
/// # Ok::<(), kfuse::Error>(())
/// ```
pub fn warm(device: &Device, calls: &[WarmCall]) -> Result<()> {
    for c in calls {
        run(device, c).map_err(|e| Error::InvalidArgument(format!("warming `{} {} {:?}`: {e}", c.op, c.dtype.name(), c.shapes)))?;
    }
    device.synchronize()
}

fn run(device: &Device, c: &WarmCall) -> Result<()> {
    let t: Vec<Tensor> = c.shapes.iter().map(|s| Tensor::empty(s, c.dtype, device)).collect::<Result<_>>()?;
    // the last dimension of the first input: a norm's weight and bias
    let row = || -> Result<Tensor> {
        let n = *c.shapes[0].last().ok_or_else(|| Error::InvalidArgument("a norm needs `x` of rank ≥ 1".into()))?;
        Tensor::empty(&[n], c.dtype, device)
    };
    match c.op.as_str() {
        "add" => crate::add(&t[0], &t[1]).map(drop),
        "sub" => crate::sub(&t[0], &t[1]).map(drop),
        "mul" => crate::mul(&t[0], &t[1]).map(drop),
        "div" => crate::div(&t[0], &t[1]).map(drop),
        "swiglu" => crate::swiglu(&t[0], &t[1]).map(drop),
        "scale" => crate::scale(&t[0], 0.5).map(drop),
        "silu" => crate::silu(&t[0]).map(drop),
        "gelu" => crate::gelu(&t[0]).map(drop),
        "gelu_tanh" => crate::gelu_tanh(&t[0]).map(drop),
        "copy" => crate::copy(&t[0]).map(drop),
        "transpose" => crate::transpose(&t[0]).map(drop),
        "sum" => crate::sum(&t[0], Dim::Last).map(drop),
        "mean" => crate::mean(&t[0], Dim::Last).map(drop),
        "max" => crate::max(&t[0], Dim::Last).map(drop),
        "min" => crate::min(&t[0], Dim::Last).map(drop),
        "sum_all" => crate::sum(&t[0], Dim::All).map(drop),
        "softmax" => crate::softmax(&t[0]).map(drop),
        "log_softmax" => crate::log_softmax(&t[0]).map(drop),
        "rms_norm" => crate::rms_norm(&t[0], Some(&row()?), None, 1e-5).map(drop),
        "add_rms_norm" => crate::add_rms_norm(&t[0], &t[1], Some(&row()?), 1e-5).map(drop),
        "layer_norm" => crate::layer_norm(&t[0], &row()?, &row()?, 1e-5).map(drop),
        "gemm" => crate::gemm(&t[0], &t[1]).map(drop),
        "gemm_batched" => crate::gemm_batched_ex(&t[0], &t[1], &GemmOptions::default()).map(drop),
        "swiglu_gemm" => crate::swiglu_gemm(&t[0], &t[1], &t[2]).map(drop),
        other => Err(Error::InvalidArgument(format!("unknown op `{other}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_bad_lines_say_why() {
        let calls = parse_warm_list("# a model's kernels\ngemm bf16 127x4096 4096x4096\n\nsoftmax f32 8192x1000  # rows\nrms_norm f16 7\n").unwrap();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[0], WarmCall { op: "gemm".into(), dtype: DType::BF16, shapes: vec![vec![127, 4096], vec![4096, 4096]] });
        assert_eq!(calls[1].shapes, vec![vec![8192, 1000]]);
        assert_eq!(calls[2].shapes, vec![vec![7]]);
        for (line, says) in [
            ("gemn bf16 1x1 1x1", "unknown op `gemn`"),
            ("gemm bf17 1x1 1x1", "unknown dtype `bf17`"),
            ("gemm bf16 1x1", "takes 2 input shape(s), 1 given"),
            ("softmax bf16 4x-1", "shape `4x-1`"),
            ("softmax", "no dtype"),
        ] {
            let e = line.parse::<WarmCall>().unwrap_err().to_string();
            assert!(e.contains(says) && e.contains(line), "{line}: {e}");
        }
    }

    #[test]
    fn every_op_runs_on_the_cpu() {
        let cpu = Device::cpu();
        let list: Vec<WarmCall> = WARM_OPS
            .iter()
            .map(|&(op, arity)| {
                let shape = if op == "gemm_batched" { "2x3x5" } else { "3x5" };
                let second = match op {
                    "gemm" | "swiglu_gemm" => "5x4",
                    "gemm_batched" => "2x5x4",
                    _ => shape,
                };
                let shapes: Vec<&str> = (0..arity).map(|i| if i == 0 { shape } else { second }).collect();
                format!("{op} f32 {}", shapes.join(" ")).parse().unwrap()
            })
            .collect();
        warm(&cpu, &list).unwrap();
        let bad = "add f32 3x5 3x4".parse::<WarmCall>().unwrap();
        let e = warm(&cpu, &[bad]).unwrap_err().to_string();
        assert!(e.contains("warming `add f32 [[3, 5], [3, 4]]`"), "{e}");
    }
}

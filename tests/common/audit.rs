//! The audit helpers of the bad-input tests (`api_edges.rs`, `user_launch_edges.rs`):
//! every case runs under `catch_unwind` and asserts one outcome — an `Err` of a given
//! kind whose message names the problem ([`err`]), or `Ok` with checked values
//! ([`close_values`]) — and a test fails listing every case that panicked or was wrong.

use std::panic::{catch_unwind, AssertUnwindSafe};

use kfuse::{DType, Device, Error, Tensor};

/// A case's outcome: `Err` says what was wrong.
pub type R = Result<(), String>;

/// The cases of one test: each runs under `catch_unwind`; `finish` fails the test with
/// every case that panicked or was wrong.
pub struct Audit {
    group: &'static str,
    run: usize,
    bad: Vec<String>,
}

impl Audit {
    pub fn new(group: &'static str) -> Audit {
        Audit { group, run: 0, bad: Vec::new() }
    }

    pub fn case(&mut self, name: &str, f: impl FnOnce() -> R) {
        self.run += 1;
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(Ok(())) => {}
            Ok(Err(m)) => self.bad.push(format!("{name}: {m}")),
            Err(p) => {
                let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
                self.bad.push(format!("{name}: PANICKED: {msg}"));
            }
        }
    }

    pub fn finish(self) {
        eprintln!("{}: {} cases, {} failed", self.group, self.run, self.bad.len());
        assert!(self.bad.is_empty(), "{}: {} of {} cases failed:\n  {}", self.group, self.bad.len(), self.run, self.bad.join("\n  "));
    }
}

/// The kind of error a case expects.
#[derive(Clone, Copy, Debug)]
pub enum E {
    Shape,
    DType,
    NonContig,
    Alias,
    Invalid,
    /// An IR error (the kernel cannot be built for the bound dtypes).
    Ir,
    /// Any variant (the words carry the check).
    Any,
}

/// `r` is an error of kind `kind` whose message contains every one of `words`.
pub fn err<T>(r: kfuse::Result<T>, kind: E, words: &[&str]) -> R {
    let e = match r {
        Ok(_) => return Err(format!("expected a {kind:?} error mentioning {words:?}, got Ok({})", std::any::type_name::<T>())),
        Err(e) => e,
    };
    let ok = match kind {
        E::Shape => matches!(e, Error::ShapeMismatch(_)),
        E::DType => matches!(e, Error::DTypeMismatch(_)),
        E::NonContig => matches!(e, Error::NonContiguous { .. }),
        E::Alias => matches!(e, Error::Aliasing(_)),
        E::Invalid => matches!(e, Error::InvalidArgument(_)),
        E::Ir => matches!(e, Error::Ir(_)),
        E::Any => true,
    };
    let msg = e.to_string();
    if !ok {
        return Err(format!("expected a {kind:?} error, got {e:?} ({msg})"));
    }
    for w in words {
        if !msg.contains(w) {
            return Err(format!("the message `{msg}` does not mention `{w}`"));
        }
    }
    Ok(())
}

/// The value of an `Ok`, or what the error said.
pub fn ok<T>(r: kfuse::Result<T>) -> Result<T, String> {
    r.map_err(|e| format!("unexpected error: {e}"))
}

/// `got`'s values are within `tol` (relative to the largest finite reference magnitude,
/// at least 1) of `want`; NaN matches NaN, ±inf itself.
pub fn close_values(got: &Tensor, want: &[f64], tol: f64) -> R {
    let g = ok(got.to_vec_f64())?;
    if g.len() != want.len() {
        return Err(format!("{} values, expected {}", g.len(), want.len()));
    }
    let scale = want.iter().filter(|v| v.is_finite()).fold(1.0f64, |a, v| a.max(v.abs()));
    for (i, (&x, &y)) in g.iter().zip(want).enumerate() {
        let same = if y.is_nan() {
            x.is_nan()
        } else if y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= tol * scale
        };
        if !same {
            return Err(format!("element {i}: got {x}, expected {y} (tol {tol})"));
        }
    }
    Ok(())
}

/// The CPU device (the interpreter): the audits run there only.
pub fn cpu() -> Device {
    Device::cpu()
}

/// A random tensor on the CPU and its values.
pub fn rt(shape: &[usize], dt: DType, seed: u64) -> (Tensor, Vec<f64>) {
    super::random_tensor(shape, dt, seed, 0.0, &cpu())
}

/// A random tensor on the CPU.
pub fn t(shape: &[usize], dt: DType) -> Tensor {
    rt(shape, dt, 7).0
}

/// Zeros on the CPU.
pub fn zeros(shape: &[usize], dt: DType) -> Tensor {
    Tensor::zeros(shape, dt, &cpu()).unwrap()
}

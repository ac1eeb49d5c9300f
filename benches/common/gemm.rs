//! What the GEMM benchmarks share (`benches/gemm.rs`, the table against cuBLAS and
//! cuBLASLt, and `benches/gemm_criterion.rs`, the same products under criterion): the
//! problems, their inputs, kfuse's call and the numerical checks; and the setup of the
//! bf16 GEMM studies in `examples/` ([`Study`]).

use super::random;
use kfuse::runtime::vendor::{Blas, Math};
use kfuse::{DType, Device, Tensor};

/// One product `C[M, N] = A[M, K] · B[K, N]`, row-major, of `dtype` operands and output;
/// `math` is what the vendor libraries are asked for (TF32 tensor cores or not).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub dtype: DType,
    pub math: Math,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

pub const fn bf16(m: usize, n: usize, k: usize) -> Case {
    Case { dtype: DType::BF16, math: Math::Fp32, m, n, k }
}

const fn f16(m: usize, n: usize, k: usize) -> Case {
    Case { dtype: DType::F16, math: Math::Fp32, m, n, k }
}

/// The problems of issue 4's bars (bf16 and f16), then f32 in full precision and with
/// TF32 tensor cores (kfuse: `gemm_ex` with `GemmOptions::tf32`; B K-major for both, see
/// [`Inputs::new`]).
pub const CASES: [Case; 18] = [
    bf16(4096, 4096, 4096),
    bf16(8192, 8192, 8192),
    bf16(8192, 14336, 4096),
    bf16(8192, 4096, 14336),
    bf16(16384, 4096, 4096),
    bf16(2048, 2048, 2048),
    bf16(127, 4096, 4096),
    bf16(4095, 4097, 4096),
    // f16 "like bf16": the same shapes
    f16(4096, 4096, 4096),
    f16(8192, 8192, 8192),
    f16(8192, 14336, 4096),
    f16(8192, 4096, 14336),
    f16(16384, 4096, 4096),
    f16(2048, 2048, 2048),
    f16(127, 4096, 4096),
    f16(4095, 4097, 4096),
    Case { dtype: DType::F32, math: Math::Fp32, m: 8192, n: 8192, k: 8192 },
    Case { dtype: DType::F32, math: Math::Tf32, m: 8192, n: 8192, k: 8192 },
    // fp8 e4m3 has a table of its own in benches/gemm.rs (cuBLASLt only, K-major B)
];

impl Case {
    /// `4096³` or `M127 N4096 K4096`.
    pub fn label(&self) -> String {
        if self.m == self.n && self.n == self.k {
            format!("{}³", self.m)
        } else {
            format!("M{} N{} K{}", self.m, self.n, self.k)
        }
    }
    /// An ASCII name for file names and command-line filters: `bf16_M4096_N4096_K4096`.
    pub fn id(&self) -> String {
        let dt = match self.math {
            Math::Tf32 => "tf32".to_string(),
            Math::Fp32 => self.dtype.to_string(),
        };
        format!("{dt}_M{}_N{}_K{}", self.m, self.n, self.k)
    }
    pub fn dtype_label(&self) -> String {
        match self.math {
            Math::Tf32 => "f32 (tf32)".to_string(),
            Math::Fp32 => self.dtype.to_string(),
        }
    }
    /// 2·M·N·K: the floating-point operations of one product.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
    /// B is given K-major (the transpose of a row-major `[N, K]` tensor): the TF32 case,
    /// whose tensor-core path reads only that layout (kfuse would otherwise copy B on
    /// every call; cuBLAS takes it as `CUBLAS_OP_T`).
    pub fn b_k_major(&self) -> bool {
        self.math == Math::Tf32
    }
    /// One set of A, B and C.
    pub fn bytes(&self) -> usize {
        (self.m * self.k + self.k * self.n + self.m * self.n) * self.dtype.size_bytes()
    }
    /// How many input sets to rotate through: several when one is small next to the
    /// 50 MB L2, so that no call finds its inputs in L2 from the call before.
    pub fn sets(&self) -> usize {
        (150_000_000 / self.bytes().max(1)).clamp(1, 8)
    }
    /// TFLOP/s of one call taking `ms` milliseconds.
    pub fn tflops(&self, ms: f64) -> f64 {
        self.flops() / ms / 1e9
    }
}

/// Relative-error bound of kfuse against cuBLAS (or float64) per dtype: both round the
/// same f32 accumulation to the output dtype, in different orders.
pub fn tolerance(dt: DType, math: Math) -> f64 {
    match (dt, math) {
        (DType::BF16, _) => 1e-2,
        (DType::F16, _) => 2e-3,
        (_, Math::Tf32) => 5e-3,
        _ => 1e-4,
    }
}

/// The case's input sets (random, uniform in [-1, 1), never zeros) and one output
/// tensor per set; the host values of the first set, for float64 checks (`bv` row-major
/// `[K, N]` whatever B's layout: [`Case::b_k_major`]).
pub struct Inputs {
    pub a: Vec<Tensor>,
    pub b: Vec<Tensor>,
    pub outs: Vec<Tensor>,
    pub av: Vec<f32>,
    pub bv: Vec<f32>,
}

impl Inputs {
    pub fn new(c: &Case, dev: &Device) -> kfuse::Result<Inputs> {
        let mut x = Inputs { a: Vec::new(), b: Vec::new(), outs: Vec::new(), av: Vec::new(), bv: Vec::new() };
        for s in 0..c.sets() {
            let (a, av) = random(&[c.m, c.k], c.dtype, 100 + 2 * s as u64, dev);
            let (b, bv) = if c.b_k_major() {
                let (w, wv) = random(&[c.n, c.k], c.dtype, 101 + 2 * s as u64, dev);
                let bv = if s == 0 { (0..c.k * c.n).map(|x| wv[(x % c.n) * c.k + x / c.n]).collect() } else { Vec::new() };
                (w.t(), bv)
            } else {
                random(&[c.k, c.n], c.dtype, 101 + 2 * s as u64, dev)
            };
            if s == 0 {
                (x.av, x.bv) = (av, bv);
            }
            x.a.push(a);
            x.b.push(b);
            x.outs.push(Tensor::empty(&[c.m, c.n], c.dtype, dev)?);
        }
        Ok(x)
    }
    pub fn sets(&self) -> usize {
        self.a.len()
    }
}

/// kfuse's GEMM under test: `kfuse::ops::gemm`, or for the vendor's TF32 request
/// `gemm_ex` with `GemmOptions::tf32` (TF32 WGMMA on sm_90a). Both allocate their output
/// on each call (stream-ordered, no synchronization), like a user's call would. `None`
/// where kfuse has no such GEMM (none today).
pub fn kfuse_gemm(a: &Tensor, b: &Tensor, math: Math) -> Option<kfuse::Result<Tensor>> {
    match math {
        Math::Tf32 => Some(kfuse::ops::gemm_ex(a, b, &kfuse::ops::GemmOptions { tf32: true, ..Default::default() })),
        Math::Fp32 => Some(kfuse::ops::gemm(a, b)),
    }
}

/// The first line of an error or panic message, without `|` (it goes into tables).
pub fn first_line(e: impl ToString) -> String {
    e.to_string().lines().next().unwrap_or("").replace('|', "/")
}

/// The message of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// ‖x − y‖ / ‖y‖ over two tensors of one shape.
pub fn rel_err(x: &Tensor, y: &Tensor) -> kfuse::Result<f64> {
    let (xb, yb) = (x.to_bytes()?, y.to_bytes()?);
    let (dx, dy) = (x.dtype(), y.dtype());
    let (mut num, mut den) = (0f64, 0f64);
    for i in 0..x.numel() {
        let (a, b) = (dx.read(&xb, i), dy.read(&yb, i));
        num += (a - b) * (a - b);
        den += b * b;
    }
    Ok(if den == 0.0 { num.sqrt() } else { (num / den).sqrt() })
}

/// An output of the case's first input set against float64 on 64 sampled elements,
/// relative.
pub fn sampled_err(c: &Case, inputs: &Inputs, out: &Tensor) -> kfuse::Result<f64> {
    let (av, bv) = (&inputs.av, &inputs.bv);
    let ob = out.to_bytes()?;
    let (mut num, mut den) = (0f64, 0f64);
    for s in 0..64usize {
        let i = (s * 7919) % c.m;
        let j = (s * 104729 + 13) % c.n;
        let want: f64 = (0..c.k).map(|p| av[i * c.k + p] as f64 * bv[p * c.n + j] as f64).sum();
        let got = out.dtype().read(&ob, i * c.n + j);
        num += (got - want) * (got - want);
        den += want * want;
    }
    Ok((num / den.max(f64::MIN_POSITIVE)).sqrt())
}

/// The setup of a bf16 GEMM study (`examples/gemm_sustained.rs`, `examples/launch_host.rs`):
/// the GPU, cuBLAS on it, random `a: [M, K]` and `b: [K, N]`, and an output each for
/// cuBLAS and kfuse.
pub struct Study {
    pub dev: Device,
    pub blas: Blas,
    pub a: Tensor,
    pub b: Tensor,
    pub c_blas: Tensor,
    pub c_kf: Tensor,
}

impl Study {
    /// `None` after saying so when there is no GPU.
    pub fn bf16(m: usize, n: usize, k: usize) -> kfuse::Result<Option<Study>> {
        let Some(dev) = super::gpu() else { return Ok(None) };
        let blas = Blas::new(&dev)?;
        let (a, _) = random(&[m, k], DType::BF16, 1, &dev);
        let (b, _) = random(&[k, n], DType::BF16, 2, &dev);
        let c_blas = Tensor::empty(&[m, n], DType::BF16, &dev)?;
        let c_kf = Tensor::empty(&[m, n], DType::BF16, &dev)?;
        Ok(Some(Study { dev, blas, a, b, c_blas, c_kf }))
    }
}

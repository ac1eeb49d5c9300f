//! What the runtime's tests share: the GPU or a skip, and hand-written kernels built
//! with `kfuse_ir::Builder` the way `#[kfuse]` would.
#![allow(dead_code)]

use kfuse_ir::{AccessDim, BinaryOp, Builder, DType, DTypeSig, Extent, Kernel, KernelDef, ParamSig};
use kfuse_runtime::Device;

/// GPU 0, for the tests that need one. Such a test is marked
/// `#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: …")]`: ignored (counted as skipped,
/// never as passed) in an ordinary build, run in the GPU build (`scripts/gpu-build.sh`
/// builds with `--cfg kfuse_gpu`). Wherever it runs it needs the GPU: without one it
/// fails.
pub fn gpu() -> Device {
    Device::gpu(0).unwrap_or_else(|e| panic!("this test needs a GPU: {e}"))
}


/// `add<T>(a: Tensor<T, (N,)>, b: Tensor<T, (N,)>, out: &mut Tensor<T, (N,)>)`, one
/// `BN`-tile per program.
pub fn build_add(dt: &[DType]) -> kfuse_ir::error::Result<Kernel> {
    let t = dt[0];
    let mut b = Builder::new("add");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let pa = b.tensor_param("a", t, &[n], false);
    let pb = b.tensor_param("b", t, &[n], false);
    let po = b.tensor_param("out", t, &[n], true);
    let pid = b.program_id(0)?;
    let e = b.tile_extent(Extent::Tile(bn));
    let off = b.binary(BinaryOp::Mul, pid, e)?;
    let dims = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(pa, &[off], &dims)?;
    let y = b.load(pb, &[off], &dims)?;
    let s = b.binary(BinaryOp::Add, x, y)?;
    b.store(po, &[off], &dims, s)?;
    b.finish()
}

pub static ADD: KernelDef = KernelDef {
    name: "add",
    generics: &["T"],
    params: &[
        ParamSig::Tensor { name: "a", dtype: DTypeSig::Generic(0), dims: &["N"], output: false },
        ParamSig::Tensor { name: "b", dtype: DTypeSig::Generic(0), dims: &["N"], output: false },
        ParamSig::Tensor { name: "out", dtype: DTypeSig::Generic(0), dims: &["N"], output: true },
    ],
    build: build_add,
};

/// `scale<T>(x: Tensor<T, (N,)>, out: &mut Tensor<f32, (N,)>, alpha: f32)`:
/// `out = f32(x) * alpha`.
pub fn build_scale(dt: &[DType]) -> kfuse_ir::error::Result<Kernel> {
    let t = dt[0];
    let mut b = Builder::new("scale");
    let n = b.shape_sym("N");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", t, &[n], false);
    let po = b.tensor_param("out", DType::F32, &[n], true);
    let (_, alpha) = b.scalar_param("alpha", DType::F32);
    let pid = b.program_id(0)?;
    let e = b.tile_extent(Extent::Tile(bn));
    let off = b.binary(BinaryOp::Mul, pid, e)?;
    let dims = [AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[off], &dims)?;
    let xf = b.cast(x, DType::F32)?;
    let y = b.binary(BinaryOp::Mul, xf, alpha)?;
    b.store(po, &[off], &dims, y)?;
    b.finish()
}

pub static SCALE: KernelDef = KernelDef {
    name: "scale",
    generics: &["T"],
    params: &[
        ParamSig::Tensor { name: "x", dtype: DTypeSig::Generic(0), dims: &["N"], output: false },
        ParamSig::Tensor { name: "out", dtype: DTypeSig::Concrete(DType::F32), dims: &["N"], output: true },
        ParamSig::Scalar { name: "alpha", dtype: DType::F32 },
    ],
    build: build_scale,
};

/// `copy2d<T>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>)` in `BM × BN` tiles on
/// a 2-D grid.
pub fn build_copy2d(dt: &[DType]) -> kfuse_ir::error::Result<Kernel> {
    let t = dt[0];
    let mut b = Builder::new("copy2d");
    let m = b.shape_sym("M");
    let n = b.shape_sym("N");
    let bm = b.tile_sym("BM");
    let bn = b.tile_sym("BN");
    let px = b.tensor_param("x", t, &[m, n], false);
    let po = b.tensor_param("out", t, &[m, n], true);
    let p0 = b.program_id(0)?;
    let p1 = b.program_id(1)?;
    let em = b.tile_extent(Extent::Tile(bm));
    let en = b.tile_extent(Extent::Tile(bn));
    let o0 = b.binary(BinaryOp::Mul, p0, em)?;
    let o1 = b.binary(BinaryOp::Mul, p1, en)?;
    let dims = [AccessDim::Tile(Extent::Tile(bm)), AccessDim::Tile(Extent::Tile(bn))];
    let x = b.load(px, &[o0, o1], &dims)?;
    b.store(po, &[o0, o1], &dims, x)?;
    b.finish()
}

pub static COPY2D: KernelDef = KernelDef {
    name: "copy2d",
    generics: &["T"],
    params: &[
        ParamSig::Tensor { name: "x", dtype: DTypeSig::Generic(0), dims: &["M", "N"], output: false },
        ParamSig::Tensor { name: "out", dtype: DTypeSig::Generic(0), dims: &["M", "N"], output: true },
    ],
    build: build_copy2d,
};

/// Deterministic pseudo-random values in [-1, 1) (never all zeros).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

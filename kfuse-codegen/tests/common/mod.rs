//! Builders shared by the matrix-path tests: a GEMM kernel built with the IR builder
//! (optionally transposed operands, a bias or `erf` epilogue, a K loop starting
//! elsewhere), a spec for aligned row-major tensors of given sizes, and what the
//! accumulator-layout tests read of a schedule.
#![allow(dead_code)]

use kfuse_codegen::layout::RegMap;
use kfuse_codegen::{Spec, TensorSpec};
use kfuse_ir::{AccessDim, BinaryOp, Builder, DType, DotPrecision, Extent, Kernel, Layout};

/// What the GEMM kernels do between the K loop and the cast to the output dtype.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Epilogue {
    Plain,
    /// `+ bias[n]`.
    Bias,
    /// `erf(·)` (the kernel is named `gemm_erf`).
    Erf,
}

/// `c = a @ b` (optionally `a^T`/`b^T` stored transposed), with an epilogue that adds
/// `bias[n]` when asked.
pub fn gemm_kernel(dt: DType, ta: bool, tb: bool, bias: bool) -> Kernel {
    gemm_kernel_from(dt, ta, tb, bias, 0)
}

/// [`gemm_kernel`] with the K loop starting at `k0`.
pub fn gemm_kernel_from(dt: DType, ta: bool, tb: bool, bias: bool, k0: i64) -> Kernel {
    gemm_kernel_full(dt, dt, ta, tb, if bias { Epilogue::Bias } else { Epilogue::Plain }, k0)
}

/// [`gemm_kernel`] with its own output (and bias) dtype.
pub fn gemm_kernel_out(dt: DType, out: DType, ta: bool, tb: bool, bias: bool) -> Kernel {
    gemm_kernel_full(dt, out, ta, tb, if bias { Epilogue::Bias } else { Epilogue::Plain }, 0)
}

/// `gemm_erf`: the bf16 [`gemm_kernel`] with `erf` in the epilogue.
pub fn gemm_erf_kernel() -> Kernel {
    gemm_kernel_full(DType::BF16, DType::BF16, false, false, Epilogue::Erf, 0)
}

/// The f32 [`gemm_kernel`] whose `dot` may read its operands as TF32 (`dot_tf32`),
/// with its own output dtype.
pub fn gemm_kernel_tf32(out: DType, ta: bool, tb: bool) -> Kernel {
    gemm_kernel_prec(DType::F32, out, ta, tb, Epilogue::Plain, 0, DotPrecision::Tf32)
}

fn gemm_kernel_full(dt: DType, out_dt: DType, ta: bool, tb: bool, epilogue: Epilogue, k0: i64) -> Kernel {
    gemm_kernel_prec(dt, out_dt, ta, tb, epilogue, k0, DotPrecision::Exact)
}

fn gemm_kernel_prec(dt: DType, out_dt: DType, ta: bool, tb: bool, epilogue: Epilogue, k0: i64, precision: DotPrecision) -> Kernel {
    let mut b = Builder::new(if epilogue == Epilogue::Erf { "gemm_erf" } else { "gemm" });
    let (m, n, kk) = (b.shape_sym("M"), b.shape_sym("N"), b.shape_sym("K"));
    let ad = if ta { [kk, m] } else { [m, kk] };
    let pa = b.tensor_param("a", dt, &ad, false);
    let bd = if tb { [n, kk] } else { [kk, n] };
    let pb = b.tensor_param("b", dt, &bd, false);
    let pbias = (epilogue == Epilogue::Bias).then(|| b.tensor_param("bias", out_dt, &[n], false));
    let pc = b.tensor_param("c", out_dt, &[m, n], true);
    let (bm, bn, bk) = (b.tile_sym("BM"), b.tile_sym("BN"), b.tile_sym("BK"));
    let i = b.program_id(0).unwrap();
    let j = b.program_id(1).unwrap();
    let tm = b.tile_extent(Extent::Tile(bm));
    let tn = b.tile_extent(Extent::Tile(bn));
    let tk = b.tile_extent(Extent::Tile(bk));
    let oi = b.binary(BinaryOp::Mul, i, tm).unwrap();
    let oj = b.binary(BinaryOp::Mul, j, tn).unwrap();
    let acc = b.zeros(DType::F32, &[Extent::Tile(bm), Extent::Tile(bn)]).unwrap();
    let zero = b.literal(kfuse_ir::Literal::Int(k0));
    let kdim = b.shape_dim(kk);
    let (id, kv, carried) = b.begin_for(zero, kdim, tk, &[acc]).unwrap();
    let t = |e| AccessDim::Tile(Extent::Tile(e));
    let x = if ta {
        let l = b.load(pa, &[kv, oi], &[t(bk), t(bm)]).unwrap();
        b.permute(l, &[1, 0]).unwrap()
    } else {
        b.load(pa, &[oi, kv], &[t(bm), t(bk)]).unwrap()
    };
    let y = if tb {
        let l = b.load(pb, &[oj, kv], &[t(bn), t(bk)]).unwrap();
        b.permute(l, &[1, 0]).unwrap()
    } else {
        b.load(pb, &[kv, oj], &[t(bk), t(bn)]).unwrap()
    };
    let d = b.dot_with(x, y, precision).unwrap();
    let s = b.binary(BinaryOp::Add, carried[0], d).unwrap();
    let res = b.end_for(id, &[s]).unwrap();
    let mut out = res[0];
    if let Some(pbias) = pbias {
        let bv = b.load(pbias, &[oj], &[t(bn)]).unwrap();
        let bf = b.cast(bv, DType::F32).unwrap();
        let bb = b.broadcast_to(bf, &[Extent::Tile(bm), Extent::Tile(bn)], "+").unwrap();
        out = b.binary(BinaryOp::Add, out, bb).unwrap();
    }
    if epilogue == Epilogue::Erf {
        out = b.unary(kfuse_ir::UnaryOp::Erf, out).unwrap();
    }
    let o = b.cast(out, out_dt).unwrap();
    b.store(pc, &[oi, oj], &[t(bm), t(bn)], o).unwrap();
    b.finish().unwrap()
}

pub fn spec(k: &Kernel, mnk: [u32; 3]) -> Spec {
    let tensors = k
        .params
        .iter()
        .map(|p| p.is_tensor().then(|| TensorSpec { ptr_align: 16, stride_div: (0..p.dims().len()).map(|i| if i + 1 == p.dims().len() { 0 } else { 16 }).collect() }))
        .collect();
    Spec { tensors, shape_pow2: mnk.iter().map(|v| v.next_power_of_two()).collect(), shape_div: vec![], tiles: Default::default(), threads: None, min_blocks: None, grouped: false, register_attempt: 0, ..Spec::default() }
}

/// The layout the schedule gives the K loop's result (the accumulator).
pub fn accumulator_layout(k: &Kernel) -> Option<&Layout> {
    let res = k.order.iter().find(|&&o| matches!(k.op(o), kfuse_ir::Op::LoopResult { .. }))?.value();
    k.schedule.layouts.get(&res)
}

/// The coordinate of register `reg` of thread (`warp`, `lane`) along map axis `a`.
pub fn coord(map: &RegMap, a: usize, reg: u32, warp: u32, lane: u32) -> u32 {
    let m = &map.axes[a];
    let rep = (reg / m.rep_stride) % m.reps;
    let e = (reg / m.e_stride) % m.spt;
    rep * m.chunk + ((warp / m.warp_div) % m.wpb) * m.warp_step + ((lane / m.lane_div) % m.tpw) * m.lane_step + e * m.elem_step
}

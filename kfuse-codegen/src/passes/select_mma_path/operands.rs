//! The tensor operands of a kernel's pipelined matrix loop, and whether the target's
//! tensor-core path would take the loop for given tensor facts: what the runtime asks
//! before a launch to decide whether copying an operand to padded rows brings the loop
//! onto the tensor cores (`kfuse_runtime`'s operand copies).
//!
//! [`matrix_operands`] recognizes the loop as [`super::run`] does (after the one pass
//! that runs before it and changes what it sees, `hoist_invariants`) and keeps a copy
//! of that kernel; [`MatrixOperands::tensor_cores`] then answers, for the tensor facts
//! of a [`Spec`], the questions `run` asks of them in the same order — several dots
//! where only WGMMA takes several, f32 operands, dtypes the path takes, operands TMA
//! (`tma_obstacle`) or `cp.async` (`cp_async_obstacle`, with every tile taken as 16:
//! the mma.sync path takes tiles of multiples of 16 only) cannot read — without
//! choosing tiles or planning anything. Tile refusals and majorness refusals are left
//! to the compile, which reports them as it would without a copy.

use kfuse_ir::{DType, DotPrecision, Kernel, Op, OpId, ParamId};

use super::{check_alike, cp_async_obstacle, dots, matrix_loop, several_dots_elsewhere, tma_obstacle};
use crate::target::{Spec, Target};

/// The tensor operands of a kernel's pipelined matrix loop ([`matrix_operands`]).
#[derive(Clone, Debug)]
pub struct MatrixOperands {
    /// The tensor parameters the loop's dots read their operand tiles from, each once,
    /// in the order of the dots (A before B).
    pub params: Vec<ParamId>,
    /// The operands' dtype.
    pub dtype: DType,
    /// The dots are `dot_tf32` (f32 operands the tensor cores may read as TF32).
    pub tf32: bool,
    /// The dots the loop accumulates.
    pub dots: usize,
    /// The kernel as `select_mma_path` sees it (invariants hoisted), every tile 16, and
    /// the operand loads in it.
    kernel: Kernel,
    loads: Vec<OpId>,
    /// Each dot's A and B loads, and whether the dot reads each transposed.
    pairs: Vec<((OpId, bool), (OpId, bool))>,
}

/// The tensor operands of `kernel`'s pipelined matrix loop (`acc += dot(load, load)`,
/// [`super`]'s pattern), or `None` when it has no such loop (no dot, dots that are not
/// a matrix loop, dots of a loop the matrix paths refuse). Depends on the kernel only:
/// compute it once per kernel.
///
/// ```
/// use kfuse_codegen::passes::select_mma_path::matrix_operands;
/// use kfuse_codegen::{Target, TensorSpec, Spec};
/// # fn check(gemm: &kfuse_ir::Kernel) {
/// // `gemm`: a(M, K) · b(K, N) → c(M, N), bf16
/// let m = matrix_operands(gemm).unwrap();
/// assert_eq!(m.params.len(), 2);
/// let aligned = TensorSpec { ptr_align: 16, stride_div: vec![16, 0] };
/// let odd_rows = TensorSpec { ptr_align: 16, stride_div: vec![1, 0] };
/// let spec = |b: &TensorSpec| Spec { tensors: vec![Some(aligned.clone()), Some(b.clone()), None], ..Spec::default() };
/// assert!(m.tensor_cores(&spec(&aligned), &Target::sm90a()));
/// assert!(!m.tensor_cores(&spec(&odd_rows), &Target::sm90a()));
/// # }
/// ```
pub fn matrix_operands(kernel: &Kernel) -> Option<MatrixOperands> {
    let mut k = kernel.clone();
    super::super::hoist_invariants::run(&mut k).ok()?;
    let ds = dots(&k);
    let &dot = ds.first()?;
    let (_, found) = matrix_loop(&k, &ds).ok()?;
    check_alike(&k, &found).ok()?;
    let loads: Vec<OpId> = found.iter().flat_map(|f| [f.a.0, f.b.0]).collect();
    let mut params = Vec::new();
    for &l in &loads {
        let Op::Load { tensor, .. } = k.op(l) else { return None };
        if !params.contains(tensor) {
            params.push(*tensor);
        }
    }
    let dtype = k.ty(k.operands(dot)[0]).dtype;
    let tf32 = matches!(k.op(dot), Op::Dot { precision: DotPrecision::Tf32 });
    for t in 0..k.tile_syms.len() {
        k.schedule.tiles.insert(kfuse_ir::TileSym(t as u32), 16);
    }
    let pairs = found.iter().map(|f| (f.a, f.b)).collect();
    Some(MatrixOperands { params, dtype, tf32, dots: found.len(), kernel: k, loads, pairs })
}

impl MatrixOperands {
    /// Whether the operands' dtype goes to the tensor cores on some target: f16, bf16,
    /// 8-bit floats, or f32 read as TF32 (`dot_tf32`); a plain `dot` of f32 takes exact
    /// FMAs on every target.
    pub fn tensor_core_dtype(&self) -> bool {
        matches!(self.dtype, DType::F16 | DType::BF16) || self.dtype.is_fp8() || (self.dtype == DType::F32 && self.tf32)
    }

    /// Whether the loop runs on `target`'s tensor cores (WGMMA on sm_90a, mma.sync on
    /// sm_80/sm_89) with its operands copied by TMA or `cp.async` when its tensors have
    /// the facts of `spec` (`Spec::tensors`, indexed by parameter; the rest of the spec
    /// is not read): the decisions of `select_mma_path::run` that depend on the dtype,
    /// the target and the tensors. (On sm_80/sm_89 a 16-bit operand the copies cannot
    /// read still reaches `mma.sync`, written to its tile from registers each step:
    /// false here, so that the runtime's padded copy gives it a ring.)
    pub fn tensor_cores(&self, spec: &Spec, target: &Target) -> bool {
        let k = &self.kernel;
        if target.sm < 80 || several_dots_elsewhere(k, &dots(k), target).is_some() {
            return false;
        }
        let wgmma = target.sm == 90;
        let takes = match self.dtype {
            DType::F16 | DType::BF16 => true,
            DType::F32 => self.tf32 && wgmma,
            d => d.is_fp8() && wgmma,
        };
        if !takes || self.loads.iter().any(|&l| tma_obstacle(k, spec, l).is_some()) {
            return false;
        }
        // TF32 and 8-bit operands: K contiguous (`operand_majors`)
        let k_major = |(l, transposed): (OpId, bool), k_axis: usize| super::contiguous_tile_axis(k, spec, l).is_some_and(|c| (if transposed { 1 - c } else { c }) == k_axis);
        if self.dtype.size_bytes() != 2 && !self.pairs.iter().all(|&(a, b)| k_major(a, 1) && k_major(b, 0)) {
            return false;
        }
        let esz = self.dtype.size_bytes() as u32;
        wgmma || self.loads.iter().all(|&l| cp_async_obstacle(k, spec, l, esz).is_none())
    }
}

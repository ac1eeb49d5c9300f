//! `select_mma_path`: recognizes a loop that accumulates `dot` of two tile loads and
//! records how the target will run it (`Schedule::dots_one_by_one`,
//! `Schedule::general_matrix_loop`).
//!
//! The pattern, whatever the kernel is called:
//! ```text
//! acc = zeros([BM, BN])                      // the loop's carried init
//! for k in lo..hi step s {
//!     a = load A[.., ..]  (or its permute)   // [BM, BK]
//!     b = load B[.., ..]  (or its permute)   // [BK, BN]
//!     acc = acc + dot(a, b)                  // yielded back
//! }
//! ... acc (the loop result) feeds any epilogue ...
//! ```
//! The loop body may also hold scalar index arithmetic. The rows of `a` and the
//! columns of `b` must be addressed by offsets computed before the loop (so the
//! result's valid ranges do not move while it accumulates).
//!
//! Several dots in the loop (up to [`MAX_DOTS`]), each matching the pattern with an
//! accumulator of its own and the loop carrying nothing else, are one matrix loop:
//! `g += dot(a, bg); u += dot(a, bu)` (the SwiGLU pair) shares its A tile, and dots with
//! their own A tiles are fine too. On sm_80/sm_89 and with f32 operands (paths that take
//! one dot) several dots are lowered one by one (`several_dots_elsewhere`, point 3
//! below).
//!
//! Paths, by target:
//! 0. The general lowering, on sm_90 for a loop of up to [`MAX_DOTS`] `dot`s WGMMA takes
//!    ([`wgmma_operands`]: exact products of f16, bf16 or fp8 tiles, `dot_tf32` of f32
//!    ones; 8-bit and TF32 operands K-major), on sm_80/sm_89 for a loop of one `dot` of
//!    f16 or bf16 tiles (`mma.sync`, its operands in `cp.async` rings read by `ldmatrix`;
//!    [`general_dots`]), from tensors of up to 5 dimensions (the others indexed: a
//!    batch) ([`general_takes`]; `STAGES` and `GROUPM` size its rings and walk): no plan;
//!    `Schedule::dots_one_by_one` says [`GENERAL_TAKES`], `choose_tiles` gives the loop
//!    the matrix tiles (on sm_80/sm_89 `mma_sync_default_warps` and
//!    `mma_sync_min_blocks`), and the general writer lowers it op by op (a producer
//!    warpgroup's TMA rings, `wgmma`, TMA bulk stores on sm_90; `cp.async` rings,
//!    `ldmatrix`, `mma.sync` elsewhere). An operand TMA or `cp.async` cannot copy is
//!    written to its tile from registers each step. A K tile asked for that is not a
//!    multiple of 32 bytes (every instruction's K step) is refused.
//! 1. Exact FMAs on every sm_80+ target (`fma.rs` has the facts `choose_tiles` reads):
//!    f32 operands of a plain `dot` always (no matrix instruction takes f32 without
//!    TF32 rounding) and those of a `dot_tf32` on sm_80/sm_89 or whose tensors TMA
//!    cannot read (the exact product, which TF32 permits but does not require): no
//!    plan; `Schedule::dots_one_by_one` says why, `choose_tiles` gives the loop the FMA
//!    tiles and threads, and the writer's FMA rule computes each dot where it stands
//!    (runs of 4 rows and 4 columns a thread read as 16-byte vectors, the operands'
//!    loads an iteration ahead). f16/bf16 operands of a loop path 0 does not take
//!    (operand tensors of more than five dimensions) that the copies cannot read are
//!    lowered where they stand too, their operands staged from registers.
//! 2. 8-bit and TF32 operands WGMMA cannot read (M or N contiguous, or a tensor TMA
//!    cannot read): refused, the message naming the copy that fixes it
//!    (`kfuse::ops::gemm` and `gemm_ex` make one; [`matrix_operands`] and
//!    [`tensor_obstacle`] are what the runtime asks before copying a user kernel's
//!    read-only operands to padded rows, `kfuse_runtime::operand_copy`).
//! 3. Dots in a kernel of another shape (outside a loop, a dot whose result is used other
//!    than as `acc + dot`, a computed operand, more than [`MAX_DOTS`] in a loop, a loop
//!    that computes tiles beside them — flash attention's `dot(p, v)`): no plan; each
//!    dot is lowered where it stands by the general writer (`cuda/emit/dot.rs`), and
//!    `Schedule::dots_one_by_one` records why, which the IR printer shows.
//! 4. Otherwise (other dtypes, tiles a matrix path cannot take): a clear error naming
//!    what is missing.
//!
//! A grouped launch (`Schedule::grouped`: several problems in one launch) takes the
//! same paths; on sm_90 its tensor maps are per problem, in global memory (the general
//! lowering's walk binds each program's problem's).
//!
//! Invariant on success: a kernel with dots has `Schedule::dots_one_by_one` set (how
//! and why its dots are lowered where they stand), and `general_matrix_loop` where the
//! general lowering takes its matrix loop onto the tensor cores.

use kfuse_ir::{AccessDim, BinaryOp, DType, DotPrecision, Kernel, Literal, LoopInfo, Op, OpId, ValueId};

use crate::target::{Spec, Target, TensorSpec};
use crate::CodegenError;

/// Which dimension of a `dot` operand, as the dot sees it, has the unit stride in the
/// tensor it is loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Major {
    /// The reduction dimension (`K`) is contiguous.
    K,
    /// The row (`M`, for A) or column (`N`, for B) dimension is contiguous.
    MN,
}

pub mod fma;
pub mod operands;

pub use operands::{matrix_operands, MatrixOperands};

fn unsupported(m: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported(m.into())
}

/// The `Dot` ops of a kernel, in program order.
pub fn dots(k: &Kernel) -> Vec<OpId> {
    k.ops().filter(|&o| matches!(k.op(o), Op::Dot { .. })).collect()
}

/// An operand of the dot: the load behind it, and whether a permute swaps its axes.
fn operand_load(k: &Kernel, v: ValueId) -> Result<(OpId, bool), CodegenError> {
    let load = if matches!(k.op(v.op()), Op::Permute { .. }) { k.operands(v.op())[0].op() } else { v.op() };
    if matches!(k.op(load), Op::Load { dims, .. } if dims.iter().any(AccessDim::is_gather)) {
        return Err(unsupported("a gathered `dot` operand (a block offset that is an index tile) is staged at the dot, not by the matrix path"));
    }
    match k.op(v.op()) {
        Op::Load { .. } => Ok((v.op(), false)),
        Op::Permute { perm } if perm == &[1, 0] => {
            let src = k.operands(v.op())[0];
            match k.op(src.op()) {
                Op::Load { .. } => Ok((src.op(), true)),
                _ => Err(unsupported("an operand of `dot` must be a tile load (or its transpose `.t()`) for the matrix path")),
            }
        }
        _ => Err(unsupported("an operand of `dot` must be a tile load (or its transpose `.t()`) for the matrix path")),
    }
}

/// Whether dot operand `v` is a tile load that TMA cannot read (`tma_obstacle`): on
/// sm_90 the general lowering's consumers load it to registers and write its tile each
/// step, so its tile's elements a thread come on top of the accumulators.
pub(crate) fn staged_operand(k: &Kernel, spec: &Spec, v: ValueId) -> bool {
    operand_load(k, v).is_ok_and(|(l, _)| tma_obstacle(k, spec, l).is_some())
}

/// True when `v` is a literal zero, or a broadcast of one.
fn is_zeros(k: &Kernel, v: ValueId) -> bool {
    match k.op(v.op()) {
        Op::Const { value } => matches!(value, Literal::Float(f) if *f == 0.0) || matches!(value, Literal::Int(0)),
        Op::Broadcast => is_zeros(k, k.operands(v.op())[0]),
        _ => false,
    }
}

/// Which tile axis of the loaded tile lies along the tensor's unit-stride dimension.
fn contiguous_tile_axis(k: &Kernel, spec: &Spec, load: OpId) -> Option<usize> {
    let Op::Load { tensor, dims } = k.op(load) else { return None };
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten()?;
    let unit = ts.stride_div.iter().position(|&s| s == 0)?;
    let mut t = 0usize;
    for (d, ad) in dims.iter().enumerate() {
        if let AccessDim::Tile(_) = ad {
            if d == unit {
                return Some(t);
            }
            t += 1;
        }
    }
    None
}

/// The tensor dimensions of a load's tensor in the order TMA sees them, innermost
/// first: the unit-stride dimension (the last one if several), then the others from
/// last to first. `None` without a unit-stride dimension.
pub fn tma_order(k: &Kernel, spec: &Spec, load: OpId) -> Option<Vec<u32>> {
    let (Op::Load { tensor, dims } | Op::Store { tensor, dims }) = k.op(load) else { return None };
    let ts = spec.tensors.get(tensor.0 as usize).cloned().flatten()?;
    let r = dims.len();
    let unit = (0..r).rev().find(|&d| ts.stride_div.get(d) == Some(&0))?;
    let mut order = vec![unit as u32];
    order.extend((0..r).rev().filter(|&d| d != unit).map(|d| d as u32));
    Some(order)
}

/// Why TMA cannot read (or write) this access's tensor, if it cannot.
pub(crate) fn tma_obstacle(k: &Kernel, spec: &Spec, load: OpId) -> Option<String> {
    let (Op::Load { tensor, .. } | Op::Store { tensor, .. }) = k.op(load) else { return Some("not an access".into()) };
    let p = k.param(*tensor);
    let Some(ts) = spec.tensors.get(tensor.0 as usize).cloned().flatten() else {
        return Some(format!("nothing is known of `{}`'s strides", p.name));
    };
    tensor_obstacle(&p.name, p.dtype.size_bytes() as u32, &ts)
}

/// Why TMA — and `cp.async`, which copies the same 16-byte pieces — cannot read a
/// tensor named `name` of `esz`-byte elements with the facts `ts`, if it cannot: it
/// needs a unit-stride dimension (the last one if several, [`tma_order`]), every other
/// stride a multiple of 16 bytes and its data 16-byte aligned. The first rule broken,
/// in the order TMA sees the dimensions (the unit-stride one, then the others from the
/// last to the first). The runtime asks this of a launch's operands to decide which it
/// copies to padded rows (`kfuse_runtime`'s operand copies); the matrix paths ask it
/// of the spec they compile for.
///
/// ```
/// use kfuse_codegen::passes::select_mma_path::tensor_obstacle;
/// use kfuse_codegen::TensorSpec;
///
/// // bf16 `[4096, 4097]`, row-major: rows 8194 bytes apart
/// let b = TensorSpec { ptr_align: 16, stride_div: vec![1, 0] };
/// let why = tensor_obstacle("b", 2, &b).unwrap();
/// assert_eq!(why, "the stride of `b` along dimension 0 is not a multiple of 16 bytes");
/// // rows padded to 4160 elements (8320 bytes)
/// assert_eq!(tensor_obstacle("b", 2, &TensorSpec { ptr_align: 16, stride_div: vec![16, 0] }), None);
/// ```
pub fn tensor_obstacle(name: &str, esz: u32, ts: &TensorSpec) -> Option<String> {
    let r = ts.stride_div.len();
    let Some(unit) = (0..r).rev().find(|&d| ts.stride_div[d] == 0) else {
        return Some(format!("`{name}` has no unit-stride dimension"));
    };
    for d in (0..r).rev().filter(|&d| d != unit) {
        // 0 marks a unit stride here too (a second unit-stride dimension): 1 element
        let sd = ts.stride_div[d].max(1);
        if sd * esz < 16 {
            return Some(format!("the stride of `{name}` along dimension {d} is not a multiple of 16 bytes"));
        }
    }
    if ts.ptr_align < 16 {
        return Some(format!("`{name}`'s data is not 16-byte aligned"));
    }
    None
}

/// One `dot` of the loop as [`accumulation`] found it: the dot, its accumulator's carried
/// index, the `acc + dot` op, and each operand's load and whether a `.t()` swaps its axes.
pub(crate) struct Accumulated {
    dot: OpId,
    carried: u32,
    add: OpId,
    a: (OpId, bool),
    b: (OpId, bool),
}

/// Checks that `dot` (in loop `info`) accumulates into a carried value of its loop
/// that starts as zeros and is yielded as `acc + dot(..)`, of two tile loads whose rows
/// (A) and columns (B) are addressed by offsets computed before the loop.
fn accumulation(k: &Kernel, dot: OpId, info: &LoopInfo) -> Result<Accumulated, CodegenError> {
    // dot → add(carried, dot) → yield
    let users = k.users(dot.value());
    let [add] = users.as_slice() else { return Err(unsupported("the result of `dot` must only be added to the loop's accumulator")) };
    let add = *add;
    if !matches!(k.op(add), Op::Binary(BinaryOp::Add)) {
        return Err(unsupported("the result of `dot` must be added to the loop's accumulator (`acc += dot(..)`)"));
    }
    let add_ops = k.operands(add);
    let other = if add_ops[0] == dot.value() { add_ops[1] } else { add_ops[0] };
    let Op::LoopCarried { id, index } = *k.op(other.op()) else {
        return Err(unsupported("`dot` must be added to a value the loop carries (`acc += dot(..)`)"));
    };
    if id != info.id {
        return Err(unsupported("`dot` must accumulate into a value carried by its own loop"));
    }
    let yops = k.operands(info.yield_op);
    if yops.get(index as usize) != Some(&add.value()) || k.users(add.value()).len() != 1 {
        return Err(unsupported("the accumulated `acc + dot(..)` must be what the loop yields, and nothing else may use it"));
    }
    let for_ops = k.operands(info.for_op);
    let init = for_ops[3 + index as usize];
    if !is_zeros(k, init) {
        return Err(unsupported("the accumulator of a dot loop must start as `zeros`"));
    }
    // operands
    let dops = k.operands(dot);
    let (a_load, a_t) = operand_load(k, dops[0])?;
    let (b_load, b_t) = operand_load(k, dops[1])?;
    for (load, t, what) in [(a_load, a_t, "rows of the first"), (b_load, b_t, "columns of the second")] {
        let Op::Load { dims, .. } = k.op(load) else { unreachable!() };
        let tiles: Vec<usize> = dims.iter().enumerate().filter(|(_, d)| matches!(d, AccessDim::Tile(_))).map(|(i, _)| i).collect();
        if tiles.len() != 2 {
            return Err(unsupported("a `dot` operand must be a 2-D tile load"));
        }
        // tile axis 0 of the operand is M (A) / K (B); the fixed axis is A's 0 and B's 1
        let fixed_axis = if what.starts_with("rows") { 0 } else { 1 };
        let tensor_dim = tiles[if t { 1 - fixed_axis } else { fixed_axis }];
        let off = k.operands(load)[tensor_dim];
        if k.position(off.op()) > info.for_pos {
            return Err(unsupported(format!(
                "the {what} operand of `dot` are addressed by an offset computed inside the loop; compute it before the loop"
            )));
        }
        // the k axis walks with the loop: its offset is the loop's index (the matrix
        // path's producer addresses each stage from the index alone)
        let k_dim = tiles[if t { fixed_axis } else { 1 - fixed_axis }];
        let k_off = k.operands(load)[k_dim];
        if !matches!(k.op(k_off.op()), Op::LoopIndex { id } if *id == info.id) {
            return Err(unsupported("the k offset of a `dot` operand is computed in the loop, not the loop's index itself".to_string()));
        }
    }
    Ok(Accumulated { dot, carried: index, add, a: (a_load, a_t), b: (b_load, b_t) })
}

/// Most dots one loop may accumulate at once on the WGMMA path: their accumulators
/// share the registers of one 256-column tile (`choose_tiles` narrows `BN` to fit).
pub const MAX_DOTS: usize = 4;

/// The loop every `dot` of the kernel accumulates in, with each dot's accumulation, when
/// the kernel has the shape the pipelined matrix paths take (see the module docs);
/// otherwise why not.
/// Why the matrix paths cannot accumulate this loop's several dots at once on `target`,
/// when they cannot for a reason of the target or the dtype: only the sm_90a WGMMA path
/// takes several, and not with f32 operands (exact FMAs, one at a time). Such dots are
/// lowered one by one instead (`choose_tiles` gives them tiles for that).
pub(crate) fn several_dots_elsewhere(k: &Kernel, dots: &[OpId], target: &Target) -> Option<String> {
    if dots.len() < 2 {
        return None;
    }
    let dot = dots[0];
    let dtype = k.ty(k.operands(dot)[0]).dtype;
    let tf32 = matches!(k.op(dot), Op::Dot { precision: DotPrecision::Tf32 });
    let why = if target.sm != 90 {
        "the mma.sync path takes one"
    } else if dtype == DType::F32 && !tf32 {
        "f32 operands take exact FMAs, one dot at a time"
    } else {
        return None;
    };
    Some(format!("{} `dot`s in one loop: only the sm_90a WGMMA path accumulates several at once ({why})", dots.len()))
}

pub(crate) fn matrix_loop(k: &Kernel, dots: &[OpId]) -> Result<(LoopInfo, Vec<Accumulated>), String> {
    let dot = dots[0];
    let nest = k.loop_nest();
    let pos = |o: OpId| k.position(o);
    let Some(lid) = nest[pos(dot)] else {
        return Err("a `dot` outside a loop".into());
    };
    let info = k.loop_info(lid).ok_or("a loop without its yield")?;
    if dots.iter().any(|&d| nest[pos(d)] != Some(lid)) {
        return Err("`dot`s in more than one loop (a matrix loop is a kernel's one dot loop)".into());
    }
    if let Some(st) = k.ops().find(|&o| k.store_mask(o).is_some()) {
        return Err(format!("a masked store (`{}`): a matrix loop's epilogue writes whole tiles", k.op_label(st)));
    }
    if dots.len() > MAX_DOTS {
        return Err(format!("{} `dot`s in one loop: a matrix loop accumulates at most {MAX_DOTS} at once", dots.len()));
    }
    let found = dots
        .iter()
        .map(|&d| accumulation(k, d, &info))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| match e {
            CodegenError::Unsupported(m) => m,
            e => e.to_string(),
        })?;
    if info.carried as usize != found.len() {
        return Err("a dot loop that carries more than its accumulators".into());
    }
    // the body holds only scalars, the loads, their permutes, the dots and the adds
    for &o in &k.order[info.for_pos + 1..info.yield_pos] {
        let ok = match k.op(o) {
            Op::LoopIndex { .. } | Op::Dot { .. } => true,
            Op::LoopCarried { index: i, .. } => found.iter().any(|f| f.carried == *i),
            Op::Load { .. } => found.iter().any(|f| o == f.a.0 || o == f.b.0),
            Op::Permute { .. } => found.iter().any(|f| k.operands(f.dot).iter().any(|v| v.op() == o)),
            Op::Binary(_) => found.iter().any(|f| f.add == o) || k.node(o).ty.as_ref().is_some_and(|t| t.is_scalar()),
            _ => k.node(o).ty.as_ref().is_some_and(|t| t.is_scalar()),
        };
        if !ok {
            return Err(format!(
                "the loop around `dot` also computes `{}` ({}); a matrix loop holds only tile loads, index arithmetic and its dots",
                k.op(o).mnemonic(),
                o.value()
            ));
        }
    }
    Ok((info, found))
}

/// The other dots of the loop against the first: the same dtype, precision and tile
/// shape; and a load is an A operand or a B operand, not both.
fn check_alike(k: &Kernel, found: &[Accumulated]) -> Result<(), CodegenError> {
    let dot = found[0].dot;
    let dops = k.operands(dot);
    let dtype = k.ty(dops[0]).dtype;
    for f in &found[1..] {
        let fo = k.operands(f.dot);
        if k.op(f.dot) != k.op(dot) || k.ty(fo[0]).dtype != dtype {
            return Err(unsupported(format!(
                "the `dot`s of one loop must share their operand dtype and precision (`{}` of {} and `{}` of {})",
                k.op(dot).mnemonic(),
                dtype,
                k.op(f.dot).mnemonic(),
                k.ty(fo[0]).dtype
            )));
        }
        if k.ty(fo[0]).shape != k.ty(dops[0]).shape || k.ty(fo[1]).shape != k.ty(dops[1]).shape {
            return Err(unsupported("the `dot`s of one loop must multiply tiles of one shape ([BM, BK] · [BK, BN])"));
        }
    }
    if found.iter().any(|f| found.iter().any(|g| f.a.0 == g.b.0)) {
        return Err(unsupported("a tile load feeds one `dot` as its first operand and another as its second"));
    }
    Ok(())
}

/// How the dots of a loop [`general_takes`] are lowered (the scheduled IR and the plan
/// show it).
pub const GENERAL_TAKES: &str = "a matrix loop on the tensor cores: matrix tiles and operand rings (up to four `dot`s of f16, bf16, fp8 or TF32-read f32 operands on sm_90, one of f16 or bf16 on sm_80 and sm_89)";

/// Whether the general lowering takes a matrix loop (module docs, point 0): the dots it
/// puts on the tensor cores ([`general_dots`]: on sm_90 up to [`MAX_DOTS`] that WGMMA
/// takes, 8-bit and TF32 operands K-major; on sm_80/sm_89 one of f16 or bf16) of tiles
/// loaded from tensors of up to five dimensions (a 16-bit operand TMA or `cp.async`
/// cannot copy is written to its tile from registers each step; on sm_90 `b` is then
/// at most 128 columns wide, `choose_tiles`). Grouped launches too: on sm_90 the
/// persistent walk binds each program's tensor maps from its problem's record.
pub fn general_takes(k: &Kernel, spec: &Spec, target: &Target) -> bool {
    target.sm >= 80 && general_loop(k, spec, target)
}

/// Whether the general lowering can put a matrix loop's dots on the tensor cores as its
/// matrix loop ([`general_takes`] on an sm_80+ target): the dots, the loop's shape, the
/// operands' ranks and majorness.
fn general_loop(k: &Kernel, spec: &Spec, target: &Target) -> bool {
    // (several dots: SwiGLU's pair 409.3 against 416.8 µs at 4096³, equal at M8192
    // N14336 and M127 N14336 on the H100, one call, 2026-11-27; three products NOTES l9)
    let ds = dots(k);
    if !general_dots(k, target, &ds) {
        return false;
    }
    let Ok((_, found)) = matrix_loop(k, &ds) else { return false };
    // (WGMMA transposes only 16-bit operands: 8-bit and TF32 ones K-major, else the
    // refusal says how to make such a copy: `operand_majors`)
    let sixteen = k.ty(k.operands(ds[0])[0]).dtype.size_bytes() == 2;
    let k_major = |(l, t): (OpId, bool), k_axis| sixteen || operand_major(k, spec, l, t, k_axis) == Some(Major::K);
    // (16-bit operands that TMA or `cp.async` cannot copy are loaded to registers and
    // written to their tiles each step: still the tensor cores. On sm_90 a producer
    // warpgroup's consumers writing such a `b` tile beside a 128x256 accumulator
    // spilled 772 bytes (bias + GELU), so `choose_tiles` keeps such a `b` 128 wide;
    // the runtime's padded copies keep these operands rare.)
    let copies = |l: OpId| sixteen || tma_obstacle(k, spec, l).is_none();
    found.iter().all(|f| {
        [f.a.0, f.b.0].iter().all(|&l| matches!(k.op(l), Op::Load { dims, .. } if dims.len() <= 5) && copies(l)) && k_major(f.a, 1) && k_major(f.b, 0)
    })
}

/// Why a K tile the spec asks for keeps a matrix loop's dots off the tensor cores, if
/// it does: every instruction (`mma.sync` k16, WGMMA k16/k32/k8) takes 32 bytes of K,
/// so the loop's K tile must be a multiple of that (else its dots would be exact FMAs).
fn k_tile_refusal(k: &Kernel, spec: &Spec, dots: &[OpId]) -> Option<String> {
    dots.iter().find_map(|&d| {
        let a = k.ty(k.operands(d)[0]);
        let kfuse_ir::Extent::Tile(t) = *a.shape.get(1)? else { return None };
        let name = k.tile_name(t);
        let v = *spec.tiles.get(name)?;
        let esz = a.dtype.size_bytes() as u32;
        (!(v * esz).is_multiple_of(32)).then(|| {
            format!("{name} = {v}: the tensor cores take K in steps of 32 bytes ({} {} elements); ask for a multiple of that", 32 / esz.max(1), a.dtype)
        })
    })
}

/// Whether the general lowering puts the dots of a matrix loop on the tensor cores:
/// up to [`MAX_DOTS`] that WGMMA takes on sm_90 ([`general_wgmma`]), elsewhere one of
/// f16 or bf16 operands (`mma.sync`, which takes one dot a loop: `several_dots_elsewhere`).
pub fn general_dots(k: &Kernel, target: &Target, dots: &[OpId]) -> bool {
    let sync16 = |&d: &OpId| matches!(k.op(d), Op::Dot { precision: DotPrecision::Exact }) && matches!(k.ty(k.operands(d)[0]).dtype, DType::F16 | DType::BF16);
    if target.sm == 90 { dots.len() <= MAX_DOTS && general_wgmma(k, target, dots) } else { target.sm >= 80 && dots.len() == 1 && dots.iter().all(sync16) }
}

/// Whether the general lowering puts `dots` on WGMMA: sm_90, f16/bf16/fp8 operands of
/// exact products or the f32 operands of `dot_tf32`s (read as TF32); false for no dots.
pub fn general_wgmma(k: &Kernel, target: &Target, dots: &[OpId]) -> bool {
    target.sm == 90 && !dots.is_empty() && dots.iter().all(|&d| wgmma_operands(k, d))
}

/// Whether WGMMA takes dot `d`'s operands: f16, bf16, f8e4m3 or f8e5m2 of an exact
/// product, or f32 of a `dot_tf32`.
pub fn wgmma_operands(k: &Kernel, d: OpId) -> bool {
    matches!(
        (k.op(d), k.ty(k.operands(d)[0]).dtype),
        (Op::Dot { precision: DotPrecision::Exact }, DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2) | (Op::Dot { precision: DotPrecision::Tf32 }, DType::F32)
    )
}

/// Runs the pass: records how the kernel's dots are lowered and why (module docs).
pub fn run(k: &mut Kernel, spec: &Spec, target: &Target) -> Result<(), CodegenError> {
    k.schedule.dots_one_by_one = None;
    k.schedule.general_matrix_loop = false;
    let dots = dots(k);
    let Some(&dot) = dots.first() else { return Ok(()) };
    // a loop of another shape: its dots are lowered where they stand (the writer's `dot`)
    let (_, found) = match matrix_loop(k, &dots) {
        Ok(m) => m,
        Err(why) => {
            k.schedule.dots_one_by_one = Some(format!("each where it stands, not a matrix loop: {why}"));
            return Ok(());
        }
    };
    // several dots that only the WGMMA path accumulates at once: one by one elsewhere
    if let Some(why) = several_dots_elsewhere(k, &dots, target) {
        k.schedule.dots_one_by_one = Some(why);
        return Ok(());
    }
    if general_takes(k, spec, target) {
        if let Some(why) = k_tile_refusal(k, spec, &dots) {
            return Err(unsupported(why));
        }
        k.schedule.dots_one_by_one = Some(GENERAL_TAKES.into());
        k.schedule.general_matrix_loop = true;
        return Ok(());
    }
    let dtype = k.ty(k.operands(dot)[0]).dtype;
    let tf32 = matches!(k.op(dot), Op::Dot { precision: DotPrecision::Tf32 });
    // f32 operands: exact FMAs on every target, unless the dot allows TF32 and the
    // target has a TF32 path (WGMMA, sm_90); elsewhere `dot_tf32` is computed exactly.
    // The dots are lowered where they stand (the writer's FMA rule).
    let wgmma = target.sm == 90;
    if dtype == DType::F32 && (!tf32 || !wgmma) {
        k.schedule.dots_one_by_one = Some(if tf32 {
            format!("`dot_tf32` of f32 on sm_{}: kfuse has no TF32 mma.sync path, and exact f32 products are within what TF32 allows", target.sm)
        } else {
            "f32 operands of `dot`: exact f32 products, which no matrix instruction gives (they read f32 as TF32)".to_string()
        });
        return Ok(());
    }
    check_alike(k, &found)?;
    // WGMMA on sm_90, mma.sync on every other sm_80+ target (`schedule` refuses older
    // ones). Both read operands in 16-byte pieces (TMA boxes, cp.async chunks), so an
    // operand one path cannot read the other cannot either: no fallback between them.
    let mma_sync_only = !wgmma;
    let what = if mma_sync_only { "mma.sync" } else { "WGMMA" };
    let takes = if mma_sync_only { matches!(dtype, DType::F16 | DType::BF16) } else { matches!(dtype, DType::F16 | DType::BF16) || dtype.is_fp8() || tf32 };
    if !takes {
        let list = if mma_sync_only { "f16 and bf16" } else { "f16, bf16, f8e4m3 and f8e5m2" };
        return Err(unsupported(format!("`dot` of {dtype} tiles: the {what} path takes {list}")));
    }
    let copy = if mma_sync_only { "cp.async" } else { "tensor-memory-accelerator" };
    let loads: Vec<OpId> = found.iter().flat_map(|f| [f.a.0, f.b.0]).collect();
    let esz = dtype.size_bytes() as u32;
    let obstacle = loads.iter().find_map(|&l| tma_obstacle(k, spec, l).or_else(|| if mma_sync_only { cp_async_obstacle(k, spec, l, esz) } else { None }));
    if let Some(why) = obstacle {
        // f32 operands of `dot_tf32` (exact products are within what it allows) and
        // 16-bit ones: lowered where they stand, the operands staged at each dot
        if matches!(dtype, DType::F16 | DType::BF16) || tf32 {
            k.schedule.dots_one_by_one = Some(format!("the {copy} path cannot read an operand: {why}"));
            return Ok(());
        }
        return Err(unsupported(format!("the {copy} path cannot read this `dot` operand: {why}")));
    }
    // 16-bit operands of a loop the general lowering does not take (operand tensors of
    // more than five dimensions): lowered where they stand, on the FMA tiles
    if matches!(dtype, DType::F16 | DType::BF16) {
        k.schedule.dots_one_by_one = Some(format!("the {what} lowering does not take this loop (operand tensors of more than five dimensions)"));
        return Ok(());
    }
    // (8-bit and TF32 operands with M or N contiguous: the refusal says how to copy them)
    operand_majors(k, spec, &found, dtype, tf32)?;
    Err(unsupported(format!("a `dot` loop the WGMMA lowering does not take (operand tensors of more than five dimensions, or more than {MAX_DOTS} `dot`s)")))
}

/// A dot operand's majorness: `load` (transposed or not), `k_axis` the operand's axis
/// along the dot's k; `None` where the tensor has no unit-stride tile axis.
fn operand_major(k: &Kernel, spec: &Spec, load: OpId, transposed: bool, k_axis: usize) -> Option<Major> {
    let c = contiguous_tile_axis(k, spec, load)?;
    let c = if transposed { 1 - c } else { c };
    Some(if c == k_axis { Major::K } else { Major::MN })
}

/// Each dot's operands' majorness: which axis of the operand (as the dot sees it) is
/// contiguous. WGMMA transposes only 16-bit operands in shared memory: 8-bit and TF32
/// ones must lie with K contiguous (A row-major, B as the transpose of an `[N, K]`
/// row-major tensor), else the refusal says how to make such a copy.
fn operand_majors(k: &Kernel, spec: &Spec, found: &[Accumulated], dtype: DType, tf32: bool) -> Result<Vec<(Major, Major)>, CodegenError> {
    let major = |load: OpId, transposed: bool, k_axis: usize| -> Result<Major, CodegenError> {
        operand_major(k, spec, load, transposed, k_axis).ok_or_else(|| unsupported("a `dot` operand with no unit-stride dimension"))
    };
    let majors = found.iter().map(|f| Ok((major(f.a.0, f.a.1, 1)?, major(f.b.0, f.b.1, 0)?))).collect::<Result<Vec<_>, CodegenError>>()?;
    if dtype.size_bytes() == 2 {
        return Ok(majors);
    }
    let (name, fix) = if tf32 {
        ("`dot_tf32` of f32".to_string(), "`kfuse::ops::gemm_ex` with `tf32: true` makes such a copy")
    } else {
        (format!("{dtype} `dot`"), "`kfuse::ops::gemm` makes such a copy")
    };
    let read = if tf32 { "TF32".to_string() } else { dtype.to_string() };
    for (f, &(am, bm)) in found.iter().zip(&majors) {
        for (maj, l, what) in [(am, f.a.0, "first"), (bm, f.b.0, "second")] {
            if maj != Major::K {
                let Op::Load { tensor, .. } = k.op(l) else { unreachable!() };
                return Err(unsupported(format!(
                    "the {what} operand of a {name} (`{}`) has its unit stride along M/N; WGMMA reads {read} operands only with K contiguous (pass B as the transpose `.t()` of an [N, K] tensor; {fix})",
                    k.param(*tensor).name
                )));
            }
        }
    }
    Ok(majors)
}

/// `__launch_bounds__`'s minimum blocks for the mma.sync kernel: two blocks per
/// multiprocessor (one block's barriers and `cp.async` waits are hidden by the other's
/// math) — free at 128 threads (the 255-register cap holds either way), a cap of 128
/// registers at 256 threads, which a 64x32 warp tile's main loop fits (124-128) but a
/// [`heavy_epilogue`] does not (bias + GELU spilled 232 bytes): that one takes the
/// registers it needs (about 175) and the multiprocessor alone. Larger blocks take it
/// alone too.
pub fn mma_sync_min_blocks(threads: u32, heavy_epilogue: bool) -> u32 {
    match threads {
        0..=128 => 2,
        129..=256 if !heavy_epilogue => 2,
        _ => 1,
    }
}

/// True when the ops after the dot loop (the epilogue) hold a second tile's worth of
/// registers beside the accumulator: transcendental math (`exp`, `erf`, `tanh`, …) on
/// whole tiles — the ordinary writer computes such an epilogue op by op over the tile,
/// and its intermediates need about as many registers again — or a load of a 2-D tile
/// (`beta * c`), which arrives in the accumulator's layout, one register an element.
pub fn heavy_epilogue(k: &Kernel, yield_pos: usize) -> bool {
    k.order[yield_pos + 1..].iter().any(|&o| match k.op(o) {
        Op::Unary(u) => !matches!(u, kfuse_ir::UnaryOp::Neg | kfuse_ir::UnaryOp::Abs | kfuse_ir::UnaryOp::Not) && !k.ty(o.value()).is_scalar(),
        Op::Load { .. } => k.ty(o.value()).rank() >= 2,
        _ => false,
    })
}

/// Warps of an mma.sync block by default: one per 4096 accumulator elements (a 64x64
/// warp tile, 128 f32 registers a thread), 4 to 8 — 128x128 gets 2x2 warps; with a
/// [`heavy_epilogue`] one per 2048 (64x32, 64 registers): 128 accumulators and a
/// second tile did not fit 255 registers (bias + GELU spilled 32 bytes, `beta * c`
/// 400-1200).
///
/// Why 64x64 and not 64x32 warp tiles: per `k16` step a warp reads `WM/16 + WN/16`
/// `ldmatrix.x4` (512 bytes each) for `WM/16 * WN/8` `mma.m16n8k16`. On the A100 a
/// multiprocessor retires an `m16n8k16` every 2 cycles and reads 128 bytes of shared
/// memory a cycle: 64x32 tiles need 96 B/cycle for fragments plus 32 B/cycle for the
/// `cp.async` writes of a 128x128x32 tile — all of the bandwidth; 64x64 tiles need
/// 64 + 32. Two blocks of 4 warps (up to 255 registers each) share a multiprocessor.
pub fn mma_sync_default_warps(bm: u32, bn: u32, heavy_epilogue: bool) -> u32 {
    let per = if heavy_epilogue { 2048 } else { 4096 };
    (bm * bn / per).clamp(4, 8)
}

/// Why `cp.async` cannot copy this operand's block in 16-byte chunks, if it cannot:
/// the block's offset along the tensor's unit-stride dimension must be a multiple of
/// 16 bytes (beyond the tensor conditions of [`tma_obstacle`]).
fn cp_async_obstacle(k: &Kernel, spec: &Spec, load: OpId, esz: u32) -> Option<String> {
    let Op::Load { tensor, .. } = k.op(load) else { return Some("not a load".into()) };
    let Some(order) = tma_order(k, spec, load) else { return Some("a `dot` operand with no unit-stride dimension".into()) };
    let off = k.operands(load)[order[0] as usize];
    let per = 16 / esz.max(1);
    (crate::analysis::divisibility(k, off) < per as u64).then(|| {
        format!(
            "the offset of the `{}` block along its unit-stride dimension is not known to be a multiple of {per} elements (16 bytes), which the cp.async path copies at once",
            k.param(*tensor).name
        )
    })
}


//! Prints a scheduled kernel as CUDA C++.
//!
//! The writer decides nothing: tile sizes, layouts, conversions and vector widths come
//! from the schedule. Every tile value becomes a per-thread register array indexed by
//! compile-time constants inside `#pragma unroll` loops (see [`crate::layout`] for the
//! register map); scalars become plain variables. Each tile value also carries its
//! valid range per axis (`lo`, `hi`: C expressions), which loads derive from the
//! tensor bounds and reductions and stores respect.
//!
//! A masked load is a loop over the thread's vectors, each behind its own in-bounds
//! test; one of many vectors (`WHOLE_TILE_MIN_GROUPS`) is preceded by a branch-free copy
//! of that loop for a tile the tensor holds whole (`whole_tile_test`), since the
//! per-vector branches keep the loads one memory round trip apart. Both copies load the
//! same registers from the same addresses; the test only picks which code runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kfuse_ir::{AccessDim, BinaryOp, DType, Extent, Kernel, Layout, Literal, LoopId, Op, OpId, ParamKind, ReduceOp, SmemLayout, UnaryOp, ValueId};

use crate::analysis::{concrete_shape, extent_value, is_zero, non_negative};
use crate::cuda::prelude::CLUSTER_PRELUDE;
use crate::cuda::writer::Writer;
use crate::layout::{AxisMap, RegMap};
use crate::target::{KernelParam, Spec, Target};
use crate::CodegenError;

/// `cp.async` of 16 bytes with a source size (the rest zero-filled) and its groups (PTX
/// ISA), as one literal: the operand rings' prelude.
macro_rules! cp_async_helpers {
    () => {
        r#"static __device__ __forceinline__ void kf_cp_async16(unsigned dst, const void* src, unsigned bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void kf_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void kf_cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
"#
    };
}

mod access;
mod dot;
mod dot_overlap;
mod dot_wgmma;
mod loops;
mod operand_ring;
mod tma_store;
mod warp_specialize;

/// Static shared memory above this needs the dynamic opt-in: a kernel with an operand
/// area (`dot_wgmma`'s plan) always takes dynamic shared memory, any other whose scratch
/// (conversions, reductions, operands staged at their dot) passes this (`shared_layout`).
const MAX_STATIC_SMEM: u32 = 48 * 1024;

/// The most shared memory a block of any target holds (sm_90's 227 KiB): a `dot` whose
/// operands written at the dot need more is refused where it stands; the kernel's
/// total is checked against its target's at the end.
const MAX_BLOCK_SMEM: u32 = 227 * 1024;

/// What the writer knows of an emitted value.
#[derive(Clone)]
struct Val {
    name: String,
    dtype: DType,
    /// Register map (`None` for scalars).
    map: Option<RegMap>,
    /// Value axis → map axis (`None`: an extent-1 axis kept by a reduction).
    axis_map: Vec<Option<usize>>,
    shape: Vec<u32>,
    lo: Vec<String>,
    hi: Vec<String>,
    /// A value recomputed at each use (`Schedule::remat`): the expression of register
    /// `@k@`, which [`Emitter::reg`] instantiates; no array is declared for it.
    lazy: Option<String>,
}

/// The placeholder of a register index in a [`Val::lazy`] expression.
const LAZY_K: &str = "@k@";

/// Fewest vector loads a thread makes of one masked tile for the load to get a
/// branch-free copy for tiles that lie wholly inside the tensor (`whole_tile_test`).
/// The masked loop's per-vector branches keep its loads one round trip apart, which
/// costs where a thread makes many (a GEMM epilogue's bias: 32 in each of 8 warps, ~3.7
/// µs a tile on the H100, NOTES.md g12); with few, the branches cost little and bound
/// the registers in flight (row kernels at their register caps spill without them). A
/// tile staged for a dot where it is defined outside loops takes the copy from two
/// loads a thread: flash attention's Q (8), H200, S4096 D128 565 → 597 TFLOP/s
/// (NOTES.md a28).
const WHOLE_TILE_MIN_GROUPS: u32 = 16;

/// Instantiates a lazy expression (or `name[@k@]`) at register index `k`. Templates
/// parenthesize the placeholder wherever it is an operand.
fn at(template: &str, k: &str) -> String {
    template.replace(LAZY_K, k)
}

/// Longest lazy expression kept lazy; a longer one is computed into registers once
/// (values used by several lazy values would otherwise grow without bound).
const MAX_LAZY_LEN: usize = 1500;

fn ctype(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2 => "float",
        DType::I64 => "long long",
        DType::Bool => "bool",
    }
}

fn stype(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F16 | DType::BF16 => "kf_u16",
        DType::I64 => "long long",
        DType::Bool | DType::F8E4M3 | DType::F8E5M2 => "unsigned char",
    }
}

fn to_reg(d: DType, e: &str) -> String {
    match d {
        DType::BF16 => format!("kf_bf16_f32({e})"),
        DType::F16 => format!("kf_f16_f32({e})"),
        DType::F8E4M3 => format!("kf_e4m3_f32({e})"),
        DType::F8E5M2 => format!("kf_e5m2_f32({e})"),
        DType::Bool => format!("({e} != 0)"),
        _ => e.to_string(),
    }
}

fn from_reg(d: DType, e: &str) -> String {
    match d {
        DType::BF16 => format!("kf_f32_bf16({e})"),
        DType::F16 => format!("kf_f32_f16({e})"),
        DType::F8E4M3 => format!("kf_f32_e4m3({e})"),
        DType::F8E5M2 => format!("kf_f32_e5m2({e})"),
        DType::Bool => format!("(unsigned char)({e})"),
        _ => e.to_string(),
    }
}

/// Whether a value of dtype `d` is held in f32 registers rounded to `d` ([`round`]).
fn rounds(d: DType) -> bool {
    matches!(d, DType::BF16 | DType::F16 | DType::F8E4M3 | DType::F8E5M2)
}

fn round(d: DType, e: String) -> String {
    match d {
        DType::BF16 => format!("kf_rbf16({e})"),
        DType::F16 => format!("kf_rf16({e})"),
        DType::F8E4M3 => format!("kf_e4m3_f32(kf_f32_e4m3({e}))"),
        DType::F8E5M2 => format!("kf_e5m2_f32(kf_f32_e5m2({e}))"),
        _ => e,
    }
}

fn float_lit(v: f64) -> String {
    let f = v as f32;
    if f.is_nan() {
        "KF_NAN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "KF_INF".into() } else { "(-KF_INF)".into() }
    } else {
        let s = format!("{f:?}");
        let s = if s.contains('.') || s.contains('e') { s } else { format!("{s}.0") };
        format!("{s}f")
    }
}

/// The vector type moving `bytes` bytes at once.
fn vec_type(bytes: u32) -> Result<&'static str, CodegenError> {
    match bytes {
        16 => Ok("kf_v16"),
        8 => Ok("kf_v8"),
        4 => Ok("kf_v4"),
        b => Err(CodegenError::Unsupported(format!("a vector of {b} bytes"))),
    }
}

/// The thread component of a register-map axis: the thread index along the axis for a
/// plain blocked layout (the caller scales it by `spt`), else in coordinate units.
fn thr(m: &crate::layout::AxisMap) -> String {
    thr_in(m, "kf_lane")
}

/// [`thr`] for the lane whose index is the C expression `lane` (the thread's own:
/// `kf_lane`).
fn thr_in(m: &crate::layout::AxisMap, lane: &str) -> String {
    if m.lane_step == m.spt && m.warp_step == m.spt * m.tpw {
        // the plain blocked layout: one thread index, scaled by the caller
        let warp = if m.wpb > 1 { format!("((kf_warp / {}) % {})", m.warp_div, m.wpb) } else { "0".into() };
        let lane = if m.tpw > 1 { format!("(({lane} / {}) % {})", m.lane_div, m.tpw) } else { "0".into() };
        let t = match (m.wpb > 1, m.tpw > 1) {
            (false, false) => return "0".into(),
            (false, true) => lane,
            (true, false) => warp,
            (true, true) => format!("({warp} * {} + {lane})", m.tpw),
        };
        return t;
    }
    let mut parts = Vec::new();
    if m.wpb > 1 {
        let w = format!("((kf_warp / {}) % {})", m.warp_div, m.wpb);
        parts.push(if m.warp_step > 1 { format!("{w} * {}", m.warp_step) } else { w });
    }
    if m.tpw > 1 {
        let l = format!("(({lane} / {}) % {})", m.lane_div, m.tpw);
        parts.push(if m.lane_step > 1 { format!("{l} * {}", m.lane_step) } else { l });
    }
    match parts.len() {
        0 => "0".into(),
        1 => parts.pop().unwrap(),
        _ => format!("({})", parts.join(" + ")),
    }
}

/// The terms of an axis coordinate: the register's replica (`k`-dependent), the
/// thread's place, the register's element within the thread (`k`-dependent).
fn rep_term(m: &AxisMap, k: &str) -> Option<String> {
    (m.reps > 1).then(|| format!("((({k}) / {}) % {}) * {}", m.rep_stride, m.reps, m.chunk))
}

fn thread_term(m: &AxisMap) -> Option<String> {
    thread_term_in(m, "kf_lane")
}

fn thread_term_in(m: &AxisMap, lane: &str) -> Option<String> {
    let t = thr_in(m, lane);
    let plain = m.lane_step == m.spt && m.warp_step == m.spt * m.tpw;
    (t != "0").then(|| if plain && m.spt > 1 { format!("{t} * {}", m.spt) } else { t })
}

fn elem_term(m: &AxisMap, k: &str) -> Option<String> {
    (m.spt > 1).then(|| {
        let e = format!("(({k}) / {}) % {}", m.e_stride, m.spt);
        if m.elem_step > 1 {
            format!("({e}) * {}", m.elem_step)
        } else {
            e
        }
    })
}

/// The sum of the present terms, parenthesized ("0" when none).
fn sum_terms(terms: [Option<String>; 3]) -> String {
    let parts: Vec<String> = terms.into_iter().flatten().collect();
    if parts.is_empty() {
        "0".into()
    } else {
        format!("({})", parts.join(" + "))
    }
}

/// The coordinate along map axis `i` of register `k` within this block's piece of the
/// axis, before wrapping replicas.
fn local_raw(map: &RegMap, i: usize, k: &str) -> String {
    let m = &map.axes[i];
    sum_terms([rep_term(m, k), thread_term(m), elem_term(m, k)])
}

/// [`local_raw`] as lane `lane` (a C expression) of this warp holds register `k`.
fn local_raw_in(map: &RegMap, i: usize, k: &str, lane: &str) -> String {
    let m = &map.axes[i];
    sum_terms([rep_term(m, k), thread_term_in(m, lane), elem_term(m, k)])
}

/// Whether a tile axis of extent `e` at offset `off` is in bounds everywhere: a full
/// extent whose run-time value is known to equal it (`Schedule::full_exact`), from 0.
fn exact_from_zero(k: &Kernel, e: Extent, off: ValueId) -> bool {
    matches!(e, Extent::Full(s) if k.schedule.full_exact.contains(&s)) && is_zero(k, off)
}

/// Whether a tile axis of extent `e` at offset `off` along the tensor dimension of shape
/// symbol `dim` lies inside it wherever the access runs: the whole dimension from 0
/// ([`exact_from_zero`]), or a loop's steps over whole tiles
/// ([`crate::analysis::whole_steps`]). Its valid range is then the extent.
fn whole_axis(k: &Kernel, spec: &Spec, e: Extent, off: ValueId, dim: kfuse_ir::ShapeSym) -> bool {
    exact_from_zero(k, e, off) || crate::analysis::whole_steps(k, spec, extent_value(k, e), off, dim)
}

/// Whether a tile axis of extent `e` (a literal or tile size `t`) at offset `off` along
/// a tensor dimension of size `dim` is in bounds for every program: the offset is
/// `program_id(a) · t`, grid axis `a` launches `ceil(dim / t)` programs, and the
/// specialization says `t` divides `dim` (`Spec::shape_div`) — so every program's tile
/// ends at or before `dim`. (Then the access needs no masks.)
fn whole_programs(k: &Kernel, spec: &Spec, grid: &[crate::target::GridAxisEval], e: Extent, off: ValueId, dim: kfuse_ir::ShapeSym) -> bool {
    if matches!(e, Extent::Full(_)) {
        return false;
    }
    let t = extent_value(k, e) as u64;
    let Op::Binary(BinaryOp::Mul) = k.op(off.op()) else { return false };
    let ops = k.operands(off.op());
    let axis = match (k.op(ops[0].op()), k.op(ops[1].op())) {
        (Op::ProgramId { axis }, _) if crate::analysis::int_value(k, ops[1]) == Some(t as i64) => *axis,
        (_, Op::ProgramId { axis }) if crate::analysis::int_value(k, ops[0]) == Some(t as i64) => *axis,
        _ => return false,
    };
    spec.divides(dim, t) && grid.get(axis as usize).is_some_and(|g| g.dim == dim && g.step == t)
}

/// Whether a tile axis lies inside its tensor dimension wherever the access runs, by
/// any of the rules above: [`whole_axis`] or [`whole_programs`].
fn whole_in_grid(k: &Kernel, spec: &Spec, grid: &[crate::target::GridAxisEval], e: Extent, off: ValueId, dim: kfuse_ir::ShapeSym) -> bool {
    whole_axis(k, spec, e, off, dim) || whole_programs(k, spec, grid, e, off, dim)
}

/// Whether access dimension `ad` at offset `off` into a tensor dimension of size `dim`
/// lies inside it wherever the access runs: a tile axis [`whole_in_grid`], or an index
/// [`crate::analysis::index_in_grid`] (not a gathered axis, whose rows may fall outside).
fn dim_in_grid(k: &Kernel, spec: &Spec, grid: &[crate::target::GridAxisEval], ad: &AccessDim, off: ValueId, dim: kfuse_ir::ShapeSym) -> bool {
    match ad {
        AccessDim::Tile(e) => whole_in_grid(k, spec, grid, *e, off, dim),
        AccessDim::Index => crate::analysis::index_in_grid(k, grid, off, dim),
        AccessDim::Gather(_) => false,
    }
}

/// Whether load `v` reads a tile its tensor holds whole wherever it runs: each
/// dimension [`dim_in_grid`]. Its valid range is then the tile's extents, known when
/// the kernel is written.
fn load_whole(k: &Kernel, spec: &Spec, grid: &[crate::target::GridAxisEval], v: ValueId) -> bool {
    let Op::Load { tensor, dims } = k.op(v.op()) else { return false };
    let (ops, tdims) = (k.operands(v.op()), k.tensor_dims(*tensor));
    dims.iter().enumerate().all(|(d, ad)| dim_in_grid(k, spec, grid, ad, ops[d], tdims[d]))
}

/// The offset of this block's piece along map axis `i` (cluster splits).
fn cta_base(map: &RegMap, i: usize) -> Option<String> {
    let m = &map.axes[i];
    (m.ctas > 1).then(|| format!("kf_crank * {}", m.piece))
}

/// The coordinate along map axis `i` of register `k` before wrapping replicas.
fn coord_raw(map: &RegMap, i: usize, k: &str) -> String {
    let l = local_raw(map, i, k);
    match cta_base(map, i) {
        Some(b) => format!("({b} + {l})"),
        None => l,
    }
}

/// The coordinate along map axis `i` of register `k` (replicas wrapped into the tile).
fn coord(map: &RegMap, i: usize, k: &str) -> String {
    let m = &map.axes[i];
    let l = local_raw(map, i, k);
    let l = match (m.replicated(), m.piece.is_power_of_two()) {
        (true, true) => format!("({l} & {})", m.piece - 1),
        (true, false) => format!("({l} % {})", m.piece),
        (false, _) => l,
    };
    match cta_base(map, i) {
        Some(b) => format!("({b} + {l})"),
        None => l,
    }
}

/// The part of axis `i`'s coordinate that depends on the thread and block only (the
/// block's piece and the thread's place in it): `coord(k) = thread_coord + reg_coord(k)`
/// on an axis without replicas.
fn thread_coord(map: &RegMap, i: usize) -> String {
    match (cta_base(map, i), thread_term(&map.axes[i])) {
        (None, None) => "0".into(),
        (Some(b), None) => b,
        (None, Some(t)) => t,
        (Some(b), Some(t)) => format!("({b} + {t})"),
    }
}

/// The part of axis `i`'s coordinate of register `k` that depends on `k` only (a
/// compile-time constant in an unrolled loop); see [`thread_coord`].
fn reg_coord(map: &RegMap, i: usize, k: &str) -> String {
    let m = &map.axes[i];
    sum_terms([rep_term(m, k), None, elem_term(m, k)])
}

/// True (as C) when this thread is the owner of register `k`, i.e. not a replica.
fn owner(map: &RegMap, k: &str) -> String {
    let mut c = Vec::new();
    for (i, m) in map.axes.iter().enumerate() {
        if m.replicated() {
            c.push(format!("{} < {}", local_raw(map, i, k), m.piece));
        }
    }
    for d in &map.dropped {
        let t = thr(d);
        if t != "0" {
            c.push(format!("{t} == 0"));
        }
        if d.ctas > 1 {
            c.push("kf_crank == 0".to_string());
        }
    }
    if c.is_empty() {
        "true".into()
    } else {
        c.join(" && ")
    }
}

/// The shared-memory slot of register `k` of a reduction result: its coordinates
/// linearized over the result tile (0 for a scalar result).
fn slot_of(rmap: Option<&RegMap>) -> String {
    let Some(rm) = rmap else { return "0".into() };
    let mut lin = String::from("0");
    for i in 0..rm.axes.len() {
        lin = format!("({lin}) * {} + {}", rm.axes[i].shape, coord(rm, i, "k"));
    }
    lin
}

/// Register index in `to` of the element register `k` of `from` holds, dropping the
/// digits of axes `to` does not have.
fn project(from: &RegMap, to: &RegMap, k: &str) -> String {
    let mut parts = Vec::new();
    for t in &to.axes {
        let Some(f) = from.axes.iter().find(|f| f.parent_axis == t.parent_axis) else { continue };
        if f.reps > 1 {
            parts.push(format!("((({k}) / {}) % {}) * {}", f.rep_stride, f.reps, t.rep_stride));
        }
        if f.spt > 1 {
            parts.push(format!("((({k}) / {}) % {}) * {}", f.e_stride, f.spt, t.e_stride));
        }
    }
    if parts.is_empty() {
        "0".into()
    } else {
        parts.join(" + ")
    }
}

/// One reduction's state between its steps (`Emitter::reduce`): the result array, its
/// register count, the reduced axis's map, the result's map, the dtype, the identity and
/// the combining expression.
#[derive(Clone, Copy)]
struct Partial<'a> {
    v: ValueId,
    name: &'a str,
    nregs: u32,
    am: &'a AxisMap,
    rmap: &'a Option<RegMap>,
    d: DType,
    int: bool,
    ident: &'static str,
    comb: &'a dyn Fn(&str, &str) -> String,
}

struct Emitter<'a> {
    k: &'a Kernel,
    spec: &'a Spec,
    w: Writer<String>,
    vals: HashMap<ValueId, Val>,
    smem: u32,
    tmp: usize,
    /// The barrier over the threads that hold tile values (`__syncthreads()`, or a
    /// named barrier over the consumer warpgroups of a warp-specialized kernel).
    barrier: &'static str,
    /// Program ids when the kernel walks them itself (persistent kernels).
    pid: Option<Vec<String>>,
    /// Tile loads whose registers live in arrays declared outside the current scope (a
    /// persistent kernel's current and next program): the value is a reference to that
    /// array; loads in `bound_only` are not issued again (the prefetch did it).
    bind: HashMap<ValueId, String>,
    /// Loads kept as raw vectors (`kf_v16` …), the array per load: prefetched ones of a
    /// persistent kernel until their program runs (so that nothing waits for them
    /// early; the load scopes fill it, the body — `bound_only` — unpacks it into the
    /// value's registers), and rematerialized ones (`Schedule::remat`), which stay raw
    /// and are read through their `Val::lazy` expression.
    raw: HashMap<ValueId, String>,
    bound_only: bool,
    /// Bytes of the cluster reductions' own `__shared__` slots.
    cluster_smem: u32,
    /// Cluster reductions written so far (the kernel then ends with a cluster barrier).
    cluster_reductions: u32,
    /// Cluster reductions by pushed partials (`kf_clbar[i]` is the i-th one's mbarrier).
    cluster_pushes: u32,
    /// The raw vector arrays of rematerialized loads: name, vectors, 32-bit words each.
    remat_arrays: Vec<(String, u32, u32)>,
    /// The carried storage of each loop written so far (see `loops.rs`).
    loops: HashMap<LoopId, Vec<Val>>,
    /// Loads of a loop issued one iteration ahead (`loops.rs`, `ahead_loads`), by loop:
    /// each value with its two register arrays (this iteration's, the next one's).
    ahead: HashMap<LoopId, Vec<(ValueId, String, String)>>,
    /// Writing a load ahead: its value is not staged to shared memory there.
    prefetching: bool,
    /// Some loop issues loads ahead (a later register-room attempt does not).
    ahead_used: bool,
    /// The kernel takes its mbarriers' and operand area's shared-memory addresses once
    /// (`kf_saddr_once`, [`dot_wgmma::SmemTile::addr`]): a warp-specialized kernel's
    /// first register-room attempt ([`Emitter::base_attempt`]).
    addresses_once: bool,
    /// Loops open where the writer is (their bodies nest).
    loop_depth: u32,
    /// Carried tiles whose valid range is kept in variables that follow the iterations.
    dynamic_ranges: BTreeSet<(LoopId, u32)>,
    /// Carried tiles found to need that: the kernel is written again with them added.
    retry: BTreeSet<(LoopId, u32)>,
    /// The launch grid, by program axis (`whole_programs`).
    grid: Vec<crate::target::GridAxisEval>,
    /// The dots on the WGMMA rule and their staged operands (`dot_wgmma`; sm_90a).
    wg: Option<dot_wgmma::WgPlan>,
    /// No WGMMA instruction has been issued since the last barrier (an operand-area
    /// region may be written without another one).
    wg_synced: bool,
    /// Some thread may have written an operand tile since the last barrier (a WGMMA
    /// dot then opens with one).
    wg_dirty: bool,
    /// A tile staged from registers has been written since the last barrier the writer
    /// emitted: a ring's mbarrier wait (warp-specialized) orders the copies, not these
    /// writes, so it leaves `wg_dirty` set.
    wg_staged: bool,
    /// Device functions the body calls, by name (written before the kernel).
    helpers: BTreeMap<String, String>,
    /// How each dot written so far runs (`Emitted::dot_notes`).
    dot_notes: Vec<String>,
    /// The loops written unrolled so far (`Emitted::loop_notes`).
    loop_notes: Vec<String>,
    /// Adds whose value a WGMMA dot accumulated in its own registers, with that dot's
    /// value (`dot_wgmma`'s `addend`).
    fused_adds: HashMap<OpId, ValueId>,
    /// The rings run warp-specialized (`warp_specialize`): this writes the consumers'
    /// code, or with `producer` the producer's.
    ws: Option<warp_specialize::WsPlan>,
    producer: bool,
    /// The producer's row table its gathered copies read (a C expression; `None`: the
    /// stage's, `kf_s`).
    table_slot: Option<String>,
    /// The producer's program, written after the consumers' body.
    producer_text: Option<String>,
    /// Bytes of the rings' row tables (`__shared__` arrays the body declares).
    ring_table_bytes: u32,
    /// A ring's next copies, written after the next dot's WGMMA instructions are issued
    /// (`operand_ring`).
    pending_fetch: Option<String>,
    /// Each `cp.async` ring's nest, outermost loop first (`operand_ring::ring_nest`).
    ring_nests: BTreeMap<LoopId, Vec<LoopId>>,
    /// Ring nests open where the writer is.
    open_rings: u32,
    /// Some scratch (`kf_smem`) is used inside a ring nest: the scratch may not share
    /// the operand area's bytes.
    scratch_in_ring: bool,
    /// The stores that leave by TMA (`tma_store::general_stores`) not written yet, the
    /// tensor maps of all of them, and where their shared memory starts (bytes from
    /// `kf_ops`: after the operand area, or a dead operand tile's, `out_tma_reuses`).
    out_tma: BTreeMap<OpId, tma_store::StoreTma>,
    out_tma_maps: Vec<tma_store::StoreTma>,
    out_tma_at: u32,
    out_tma_bytes: u32,
    /// The staged operand whose tile the stores that leave by TMA go through, where they
    /// do (`tma_store::dead_staged_tile`).
    out_tma_reuses: Option<ValueId>,
    /// The kernel's own parameter declarations (`emit`'s, before the tensor maps
    /// [`map_decls`] adds): a grouped launch's walk binds each to its problem's word.
    decls: Vec<String>,
}

type R = Result<(), CodegenError>;

impl<'a> Emitter<'a> {
    fn new(k: &'a Kernel, spec: &'a Spec, barrier: &'static str, grid: &[crate::target::GridAxisEval]) -> Self {
        Emitter {
            k,
            spec,
            grid: grid.to_vec(),
            w: Writer::new(String::new()),
            vals: HashMap::new(),
            smem: 0,
            tmp: 0,
            barrier,
            pid: None,
            bind: HashMap::new(),
            raw: HashMap::new(),
            bound_only: false,
            cluster_smem: 0,
            cluster_reductions: 0,
            cluster_pushes: 0,
            remat_arrays: Vec::new(),
            loops: HashMap::new(),
            loop_depth: 0,
            ahead: HashMap::new(),
            prefetching: false,
            ahead_used: false,
            addresses_once: false,
            dynamic_ranges: BTreeSet::new(),
            retry: BTreeSet::new(),
            wg: None,
            wg_synced: false,
            helpers: BTreeMap::new(),
            wg_dirty: false,
            wg_staged: false,
            fused_adds: HashMap::new(),
            dot_notes: Vec::new(),
            loop_notes: Vec::new(),
            ws: None,
            producer: false,
            table_slot: None,
            producer_text: None,
            ring_table_bytes: 0,
            ring_nests: BTreeMap::new(),
            open_rings: 0,
            pending_fetch: None,
            scratch_in_ring: false,
            out_tma: BTreeMap::new(),
            out_tma_maps: Vec::new(),
            decls: Vec::new(),
            out_tma_at: 0,
            out_tma_bytes: 0,
            out_tma_reuses: None,
        }
    }
}

fn fmt_err(_: std::fmt::Error) -> CodegenError {
    CodegenError::Unsupported("formatting failed".into())
}

impl<'a> Emitter<'a> {
    fn fresh(&mut self, p: &str) -> String {
        self.tmp += 1;
        format!("{p}{}", self.tmp)
    }

    fn line(&mut self, s: impl AsRef<str>) -> R {
        self.w.line(s).map_err(fmt_err)
    }
    fn open(&mut self, s: impl AsRef<str>) -> R {
        self.w.open(s).map_err(fmt_err)
    }
    fn close(&mut self) -> R {
        self.w.close().map_err(fmt_err)
    }
    fn unroll(&mut self, var: &str, n: u32) -> R {
        self.line("#pragma unroll")?;
        self.open(format!("for (int {var} = 0; {var} < {n}; ++{var})"))
    }

    /// Takes `bytes` of the scratch (`kf_smem`) where the writer is.
    fn scratch(&mut self, bytes: u32) {
        if bytes > 0 && self.open_rings > 0 {
            self.scratch_in_ring = true;
        }
        self.smem = self.smem.max(bytes);
    }

    fn val(&self, v: ValueId) -> &Val {
        &self.vals[&v]
    }

    fn stride(&self, tensor: kfuse_ir::ParamId, d: usize) -> String {
        let ts = self.spec.tensors.get(tensor.0 as usize).cloned().flatten();
        if ts.map(|t| t.stride_div.get(d) == Some(&0)).unwrap_or(false) {
            "1".into()
        } else {
            format!("st_{}_{d}", self.k.param(tensor).name)
        }
    }

    /// The address of element `off` (one offset expression per dimension) of `tensor`:
    /// its pointer plus each offset times its dimension's stride.
    fn element_ptr(&self, tensor: kfuse_ir::ParamId, off: &[String]) -> String {
        let mut e = format!("p_{}", self.k.param(tensor).name);
        for (dd, o) in off.iter().enumerate() {
            let st = self.stride(tensor, dd);
            e = if st == "1" { format!("{e} + {o}") } else { format!("{e} + {o} * {st}") };
        }
        e
    }

    /// The value of shape symbol `s`: its kernel parameter, or the literal where the
    /// kernel is compiled for one value of it (`Spec::shape_exact`).
    fn shape_var(&self, s: kfuse_ir::ShapeSym) -> String {
        if let Some(v) = self.spec.exact(s) {
            return format!("{v}LL");
        }
        format!("n_{}", self.k.shape_name(s))
    }

    /// The value of register `k` of `v` as seen through `want` (a map of the same
    /// layout, or a layout `v` broadcasts into).
    fn reg(&self, v: ValueId, k: &str) -> String {
        let x = self.val(v);
        match (&x.map, &x.lazy) {
            (None, _) => x.name.clone(),
            (Some(_), Some(t)) => at(t, k),
            (Some(_), None) => format!("{}[{k}]", x.name),
        }
    }

    /// The expression of `v`'s register `@k@` ([`LAZY_K`]): its lazy expression, or an
    /// element of its array.
    fn template(&self, v: ValueId) -> String {
        self.reg(v, LAZY_K)
    }

    /// Whether tile `v` is an index tile written as an expression at each use instead
    /// of into registers ([`Val::lazy`]): an integer or boolean tile computed from
    /// `iota`s and scalars by broadcasts and elementwise arithmetic other than division,
    /// each of whose users is such an op or one that reads it element by element
    /// (`select`, casts, comparisons). Flash attention's mask column `iota(BN) + j` held
    /// BN / 4 64-bit values a thread across the softmax: 64 registers at BN = 128.
    fn lazy_index(&self, v: ValueId) -> bool {
        let k = self.k;
        let ty = k.ty(v);
        if ty.is_scalar() || !matches!(ty.dtype, DType::I64 | DType::Bool) {
            return false;
        }
        let sources = match k.op(v.op()) {
            Op::Iota { .. } => true,
            Op::Binary(b) if !matches!(b, BinaryOp::Div | BinaryOp::Rem) => true,
            Op::Unary(_) | Op::Select | Op::Cast { .. } | Op::Broadcast | Op::Permute { .. } | Op::ExpandDims { .. } => true,
            _ => false,
        } && k.operands(v.op()).iter().all(|&o| k.ty(o).is_scalar() || self.vals.get(&o).is_some_and(|x| x.lazy.is_some()));
        sources && k.users(v).iter().all(|&u| matches!(k.op(u), Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } | Op::Broadcast | Op::Permute { .. } | Op::ExpandDims { .. }))
    }

    /// A tile computed at each use (`Schedule::remat`): no array declared.
    fn lazy_tile(&mut self, v: ValueId, dtype: DType, layout: &Layout, lo: Vec<String>, hi: Vec<String>, expr: String) -> Result<Val, CodegenError> {
        let map = RegMap::of(layout).ok_or_else(|| CodegenError::Unsupported("tile with a uniform layout".into()))?;
        let shape = concrete_shape(self.k, self.k.ty(v));
        let axis_map = (0..shape.len()).map(Some).collect();
        Ok(Val { name: format!("v{}", v.index()), dtype, map: Some(map), axis_map, shape, lo, hi, lazy: Some(expr) })
    }

    fn new_tile(&mut self, v: ValueId, dtype: DType, layout: &Layout, lo: Vec<String>, hi: Vec<String>, axis_map: Option<Vec<Option<usize>>>) -> Result<Val, CodegenError> {
        let map = RegMap::of(layout).ok_or_else(|| CodegenError::Unsupported("tile with a uniform layout".into()))?;
        let shape = concrete_shape(self.k, self.k.ty(v));
        let axis_map = axis_map.unwrap_or_else(|| (0..shape.len()).map(Some).collect());
        let name = format!("v{}", v.index());
        let note = self.k.names.get(&v).map(|n| format!("  // {n}")).unwrap_or_default();
        match self.bind.get(&v) {
            Some(arr) => self.line(format!("{} (&{name})[{}] = {arr};{note}", ctype(dtype), map.regs))?,
            None => self.line(format!("{} {name}[{}];{note}", ctype(dtype), map.regs))?,
        }
        Ok(Val { name, dtype, map: Some(map), axis_map, shape, lo, hi, lazy: None })
    }

    fn layout(&self, v: ValueId) -> Result<Layout, CodegenError> {
        self.k.schedule.layouts.get(&v).cloned().ok_or_else(|| CodegenError::Unsupported(format!("{v} has no layout")))
    }

    /// Writes one op; its errors name the op and its source line.
    fn op(&mut self, op: OpId) -> R {
        self.op_staged(op).map_err(|e| e.at(self.k, Some(op)))
    }

    /// One op, with what the WGMMA plan adds around it: a loop's ring prologue before it
    /// opens and its stage flip before it closes, a ring load in place of the load, a
    /// staged operand's copy after its op.
    fn op_staged(&mut self, op: OpId) -> R {
        if let Some(st) = self.out_tma.remove(&op) {
            return self.store_by_tma(op, &st);
        }
        self.late_wait(op)?;
        let ring = |e: &Self, l: &LoopId| e.wg.as_ref().is_some_and(|p| p.rings.contains_key(l));
        match self.k.op(op) {
            Op::For { id, .. } => {
                // a loop's iterations meet here: the state of the writer's barriers
                // does not carry across
                if let Some(l) = self.ring_opened_by(*id) {
                    self.open_rings += 1;
                    // (warp-specialized: the ring's waits are on the producer's
                    // mbarriers, which order no consumer's own writes: an operand a
                    // consumer wrote before the loop, read by another's instructions in
                    // it (Q, its rows spread over both warpgroups), is fenced here)
                    if self.ws.is_none() || self.wg_dirty {
                        self.line(self.barrier)?;
                        self.wg_staged = false;
                    }
                    self.ring_prologue(l)?;
                }
                self.late_decls(*id)?;
                // a later iteration enters the body in the state its end leaves
                self.wg_synced = false;
                self.wg_dirty = true;
            }
            Op::Yield { id } => {
                self.take_pending_fetch()?;
                if self.ring_opened_by(*id).is_some() {
                    self.open_rings -= 1;
                }
                if ring(self, id) {
                    if self.ws.is_some() {
                        let stages = self.wg.as_ref().unwrap().stages;
                        self.ws_release(*id)?;
                        self.line(format!("kf_st{} = ++kf_rit % {stages};", id.0))?;
                    } else {
                        let stages = self.wg.as_ref().unwrap().stages;
                        self.line(format!("if (++kf_st{0} == {stages}) kf_st{0} = 0;", id.0))?;
                    }
                }
                self.wg_synced = false;
            }
            _ => {}
        }
        let v = op.value();
        if let Some(l) = self.wg.as_ref().and_then(|p| p.eager.get(&v)).and_then(|t| t.ring) {
            return self.ring_arrive(v, l);
        }
        if let Some(r) = self.fused_add(op) {
            return r;
        }
        if let Some(r) = self.absorbed_cast(op) {
            return r;
        }
        self.op_unlocated(op)?;
        if let Op::Yield { id } = self.k.op(op) {
            self.ws_after_loop(*id)?;
        }
        if self.prefetching {
            return Ok(());
        }
        self.stage_eager(v)
    }

    fn op_unlocated(&mut self, op: OpId) -> R {
        let k = self.k;
        let node = k.node(op);
        let ops = k.operands(op);
        let v = op.value();
        let vname = format!("v{}", v.index());
        let scalar = |e: &mut Self, d: DType, expr: String| -> R {
            let note = k.names.get(&v).map(|n| format!("  // {n}")).unwrap_or_default();
            e.line(format!("const {} {vname} = {expr};{note}", ctype(d)))?;
            e.vals.insert(v, Val { name: vname.clone(), dtype: d, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None });
            Ok(())
        };
        match &node.op {
            Op::ProgramId { axis } if self.pid.is_some() => {
                let e = self.pid.as_ref().unwrap()[*axis as usize].clone();
                scalar(self, DType::I64, e)
            }
            Op::ProgramId { axis } if k.schedule.grouped => scalar(self, DType::I64, format!("kf_pid{axis}")),
            Op::ProgramId { axis } => {
                let c = k.schedule.split_blocks;
                let dim = crate::passes::order_grid::block_dim(k, *axis);
                let d = ["x", "y", "z"][dim];
                let e = if *axis == 0 && c > 1 {
                    format!("(long long)(blockIdx.x / {c})")
                } else if *axis == 0 && k.schedule.longest_first {
                    format!("(long long)(gridDim.{d} - 1 - blockIdx.{d})")
                } else {
                    format!("(long long)blockIdx.{d}")
                };
                scalar(self, DType::I64, e)
            }
            Op::ScalarParam { param } => {
                let p = k.param(*param);
                let e = round(p.dtype, format!("a_{}", p.name));
                scalar(self, p.dtype, e)
            }
            Op::ShapeDim { sym } => scalar(self, DType::I64, self.shape_var(*sym)),
            Op::TileExtent { extent } => {
                let e = match extent {
                    Extent::Full(s) => self.shape_var(*s),
                    e => format!("{}LL", extent_value(k, *e)),
                };
                scalar(self, DType::I64, e)
            }
            Op::Const { value } => {
                let d = node.ty.as_ref().unwrap().dtype;
                let e = match (value, d) {
                    (Literal::Bool(b), _) => b.to_string(),
                    (Literal::Int(i), DType::I64) => format!("{i}LL"),
                    (l, d) if d.is_float() => float_lit(d.round(l.as_f64())),
                    (l, _) => format!("{}", l.as_f64()),
                };
                scalar(self, d, e)
            }
            Op::Load { tensor, dims } => self.access(op, *tensor, dims, &ops, None),
            Op::Store { tensor, dims } => {
                let r = dims.len();
                self.access(op, *tensor, dims, &ops[..r], Some(ops[r]))
            }
            Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast { .. } => self.elementwise(op, &ops),
            Op::Broadcast => self.broadcast(op, ops[0]),
            Op::Permute { perm } => {
                let src = self.val(ops[0]).clone();
                let layout = self.layout(v)?;
                let map = RegMap::of(&layout);
                let pick = |xs: &Vec<String>| perm.iter().map(|&p| xs[p as usize].clone()).collect::<Vec<_>>();
                let val = Val {
                    name: src.name.clone(),
                    dtype: src.dtype,
                    map,
                    axis_map: perm.iter().map(|&p| src.axis_map[p as usize]).collect(),
                    shape: perm.iter().map(|&p| src.shape[p as usize]).collect(),
                    lo: pick(&src.lo),
                    hi: pick(&src.hi),
                    lazy: src.lazy.clone(),
                };
                // Permuting a blocked layout keeps every register where it is; the map
                // axes follow the value axes.
                let val = Val { axis_map: (0..val.shape.len()).map(Some).collect(), ..val };
                self.vals.insert(v, val);
                Ok(())
            }
            Op::Reduce { op: r, axis, keep_dim } => self.reduce(op, ops[0], *r, *axis as usize, *keep_dim),
            Op::ExpandDims { axis } => {
                // no data moves: the same registers, with an extent-1 axis that no
                // register spans
                let mut val = self.val(ops[0]).clone();
                if !matches!(self.k.schedule.layouts.get(&ops[0]), Some(Layout::Slice { .. })) {
                    return Err(CodegenError::Unsupported("unsqueeze of a value that is not a reduction result".into()));
                }
                let a = *axis as usize;
                val.axis_map.insert(a, None);
                val.shape.insert(a, 1);
                val.lo.insert(a, "0".into());
                val.hi.insert(a, "1".into());
                self.vals.insert(v, val);
                Ok(())
            }
            Op::Iota { extent } => {
                // register k holds its own coordinate; lanes past a full extent's
                // runtime size are invalid
                let hi = match extent {
                    Extent::Full(s) => self.shape_var(*s),
                    e => extent_value(k, *e).to_string(),
                };
                let layout = self.layout(v)?;
                if self.lazy_index(v) {
                    let map = RegMap::of(&layout).ok_or_else(|| CodegenError::Unsupported("tile with a uniform layout".into()))?;
                    let e = format!("((long long)({}))", coord(&map, 0, LAZY_K));
                    let val = self.lazy_tile(v, DType::I64, &layout, vec!["0".into()], vec![hi], e)?;
                    self.vals.insert(v, val);
                    return Ok(());
                }
                let val = self.new_tile(v, DType::I64, &layout, vec!["0".into()], vec![hi], None)?;
                let (map, name) = (val.map.clone().unwrap(), val.name.clone());
                self.vals.insert(v, val);
                self.unroll("k", map.regs)?;
                self.line(format!("{name}[k] = (long long){};", coord(&map, 0, "k")))?;
                self.close()
            }
            Op::Convert => self.convert(op, ops[0]),
            Op::For { id, carried } => self.open_loop(op, *id, *carried),
            Op::LoopIndex { .. } | Op::LoopCarried { .. } | Op::LoopResult { .. } => self.loop_value(v),
            Op::Yield { id } => self.close_loop(op, *id),
            Op::Dot { .. } => self.dot(op, ops[0], ops[1]),
        }
    }

    /// The body of a persistent kernel (`Schedule::persistent`): each block walks the
    /// programs `blockIdx.x, + gridDim.x, …`. A prologue loads the first program's
    /// prefetched tiles (`persist_programs::prefetch_loads`) into `kf_cur*`; each turn
    /// loads the next program's into `kf_nxt*` (when there is one), then runs the whole
    /// body on the current program with those loads bound to `kf_cur*`, then moves the
    /// next registers into the current ones. Every scope recomputes the scalars it needs
    /// (cheap index arithmetic), so nothing but the tile registers crosses a scope.
    fn persistent_body(&mut self, grid: &[crate::target::GridAxisEval]) -> R {
        let k = self.k;
        let heads = crate::passes::persist_programs::prefetch_loads(k);
        let pre = crate::passes::persist_programs::closure(k, &heads);
        let g = grid.first().ok_or_else(|| CodegenError::Unsupported("a persistent kernel without a grid axis".into()))?;
        self.line(format!("const long long kf_nprog = ({} + {}LL) / {}LL;", self.shape_var(g.dim), g.step - 1, g.step))?;
        if k.schedule.split_blocks > 1 {
            return Err(CodegenError::Unsupported("a persistent kernel split across a thread-block cluster".into()));
        }
        let first = "(long long)blockIdx.x".to_string();
        self.line("const long long kf_step = (long long)gridDim.x;")?;
        // per load: value, index, element type of the array, its length, raw?
        let mut arrays = Vec::new();
        for (i, h) in heads.iter().enumerate() {
            let Op::Load { tensor, .. } = k.op(*h) else { unreachable!("prefetch_loads returns loads") };
            let d = k.param(*tensor).dtype;
            let regs = RegMap::of(&self.layout(h.value())?).map(|m| m.regs).unwrap_or(1);
            let w = k.schedule.vector.get(h).copied().unwrap_or(1).max(1);
            // whole words of a float type stay raw; anything else is converted on arrival
            let raw = d.is_float() && w > 1 && (w * d.size_bytes() as u32).is_multiple_of(4) && regs.is_multiple_of(w);
            arrays.push(match raw {
                true => (h.value(), i, vec_type(w * d.size_bytes() as u32)?, regs / w, true),
                false => (h.value(), i, ctype(d), regs, false),
            });
        }
        let declare = |e: &mut Self, prefix: &str| -> R {
            for (v, i, ct, n, raw) in &arrays {
                e.line(format!("{ct} kf_{prefix}{i}[{n}];"))?;
                let map = if *raw { &mut e.raw } else { &mut e.bind };
                map.insert(*v, format!("kf_{prefix}{i}"));
            }
            Ok(())
        };
        declare(self, "cur")?;
        self.line("// the first program's loads")?;
        self.open("")?;
        self.pid = Some(vec![first.clone()]);
        for &op in &pre {
            self.op(op)?;
        }
        self.close()?;
        self.open(format!("for (long long kf_pid = {first}; kf_pid < kf_nprog; kf_pid += kf_step)"))?;
        declare(self, "nxt")?;
        self.line("// the next program's loads, in flight while this one runs")?;
        self.open("if (kf_pid + kf_step < kf_nprog)")?;
        self.pid = Some(vec!["(kf_pid + kf_step)".into()]);
        for &op in &pre {
            self.op(op)?;
        }
        self.close()?;
        self.open("")?;
        for (v, i, _, _, raw) in &arrays {
            let map = if *raw { &mut self.raw } else { &mut self.bind };
            map.insert(*v, format!("kf_cur{i}"));
        }
        self.pid = Some(vec!["kf_pid".into()]);
        self.bound_only = true;
        for op in k.ops() {
            self.op(op)?;
        }
        self.bound_only = false;
        self.close()?;
        for (_, i, _, n, _) in &arrays {
            self.unroll("k", *n)?;
            self.line(format!("kf_cur{i}[k] = kf_nxt{i}[k];"))?;
            self.close()?;
        }
        self.close()?;
        self.pid = None;
        self.bind.clear();
        self.raw.clear();
        Ok(())
    }

    /// `Schedule::l2_prefetch`: before anything else, thread 0 of each block asks L2
    /// for the block's slice of every load `prefetch_ahead::slices` names, as the
    /// program `l2_prefetch` clusters ahead would load it — one
    /// `cp.async.bulk.prefetch.L2` each (a hint: nothing waits for it, no registers
    /// hold it). The loads' index arithmetic is emitted again in a scope with the
    /// program id moved ahead; a row past the tensor's end, or the part of a slice past
    /// a row's end, is not asked for.
    fn l2_prefetch_ahead(&mut self) -> R {
        let k = self.k;
        let slices = crate::passes::prefetch_ahead::slices(k, self.spec);
        let heads: Vec<OpId> = slices.iter().map(|s| s.0).collect();
        let pre = crate::passes::persist_programs::closure(k, &heads);
        let c = k.schedule.split_blocks;
        self.line(format!("// the slices of the rows {} programs ahead, asked of L2 (`prefetch_ahead`)", k.schedule.l2_prefetch))?;
        self.open("if (kf_tid == 0)")?;
        self.pid = Some(vec![format!("((long long)(blockIdx.x / {c}) + {}LL)", k.schedule.l2_prefetch)]);
        for &op in &pre {
            match slices.iter().find(|s| s.0 == op) {
                Some(&(_, axis)) => self.l2_prefetch_slice(op, axis)?,
                None => self.op(op)?,
            }
        }
        self.pid = None;
        self.close()
    }

    /// One bulk L2 prefetch of this block's slice of load `op` (its tile axis `axis` is
    /// the one split across the cluster; every other tile axis has one element).
    fn l2_prefetch_slice(&mut self, op: OpId, axis: usize) -> R {
        let k = self.k;
        let Op::Load { tensor, dims } = k.op(op) else { unreachable!("prefetch_ahead::slices returns loads") };
        let p = k.param(*tensor);
        let esz = p.dtype.size_bytes() as u64;
        let tdims = p.dims().to_vec();
        let offs = k.operands(op);
        let off: Vec<String> = offs.iter().map(|o| self.val(*o).name.clone()).collect();
        let map = RegMap::of(&self.layout(op.value())?).ok_or_else(|| CodegenError::Unsupported("a prefetched tile with a uniform layout".into()))?;
        let piece = map.axes[axis].piece as u64;
        let base = self.element_ptr(*tensor, &off);
        let mut ok = Vec::new();
        let mut len = format!("{piece}LL");
        let mut t = 0;
        for (dd, ad) in dims.iter().enumerate() {
            let n = self.shape_var(tdims[dd]);
            let o = &off[dd];
            // (not `whole_programs`: the program id here is one ahead of this block's,
            // possibly past the grid)
            let exact = matches!(ad, AccessDim::Tile(e) if exact_from_zero(k, *e, offs[dd]));
            if matches!(ad, AccessDim::Tile(_)) && t == axis {
                if !exact {
                    // the part of the slice inside the row
                    len = format!("kf_mini({piece}LL, kf_maxi(0LL, {n} - {o} - (long long)kf_crank * {piece}LL))");
                }
            } else if !exact {
                ok.push(if non_negative(k, offs[dd]) { format!("{o} < {n}") } else { format!("{o} >= 0 && {o} < {n}") });
            }
            if matches!(ad, AccessDim::Tile(_)) {
                t += 1;
            }
        }
        let bytes = self.fresh("kf_pfb");
        self.line(format!("const long long {bytes} = ({len} * {esz}LL) & ~15LL;"))?;
        ok.push(format!("{bytes} > 0"));
        self.line(format!(
            "if ({}) asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: \"l\"({base} + (long long)kf_crank * {piece}LL), \"r\"((unsigned){bytes}) : \"memory\");",
            ok.join(" && ")
        ))
    }

    fn elementwise(&mut self, op: OpId, ops: &[ValueId]) -> R {
        let k = self.k;
        let v = op.value();
        let ty = k.ty(v).clone();
        let d = ty.dtype;
        let in_d = k.ty(ops[0]).dtype;
        // a float tile divided by a broadcast (one value per row, say): multiply by the
        // reciprocal, which the compiler then computes once per source value instead of
        // one IEEE division per element (softmax's `e / sum`); within 2 ulp of the
        // quotient for divisors of normal magnitude
        let recip = matches!(k.op(op), Op::Binary(BinaryOp::Div))
            && in_d.is_float()
            && !ty.is_scalar()
            && matches!(k.op(ops[1].op()), Op::Broadcast);
        // a narrow float result that only stores read keeps its f32 value: each store
        // converts to the tensor's dtype with the same rounding, and rounding twice to a
        // format gives what rounding once does (a GEMM's `acc.cast::<T>()` then cost 256
        // conversions a thread of the epilogue, ~2% at 4096³)
        let stored_only = !ty.is_scalar() && rounds(d) && {
            let users = k.users(v);
            !users.is_empty()
                && users.iter().all(|&u| match k.op(u) {
                    Op::Store { tensor, dims } => k.param(*tensor).dtype == d && k.operands(u).get(dims.len()) == Some(&v),
                    _ => false,
                })
        };
        let round = |d: DType, e: String| if stored_only { e } else { round(d, e) };
        // (tiles only: a scalar divides once a thread, and the branch cost the sm_80
        // attention kernel, at 255 registers, 12 bytes of spills)
        let plain_div = ty.is_scalar() || (ops.len() == 2 && crate::analysis::int_value(k, ops[1]).is_some());
        // a divisor a launch fixes divides by its multiply-shift word
        let magic = magic_divisor(k, op).map(|p| magic_name(k, &p));
        if in_d == DType::I64 && !plain_div && matches!(k.op(op), Op::Binary(BinaryOp::Div | BinaryOp::Rem)) {
            match magic {
                Some(_) => self.helpers.insert("kf_divm".into(), super::prelude::INT_DIV_MAGIC.into()),
                None => self.helpers.insert("kf_divi".into(), super::prelude::INT_DIV.into()),
            };
        }
        let fmt = |args: &[String]| -> String {
            let a = &args[0];
            match k.op(op) {
                Op::Unary(u) => {
                    let e = match (u, in_d) {
                        (UnaryOp::Neg, _) => format!("(-{a})"),
                        (UnaryOp::Abs, DType::I64) => format!("({a} < 0 ? -{a} : {a})"),
                        (UnaryOp::Abs, _) => format!("fabsf({a})"),
                        // the hardware's ex2 of a scaled argument (prelude::EXP_PRELUDE)
                        (UnaryOp::Exp, _) => format!("kf_exp({a})"),
                        (UnaryOp::Log, _) => format!("logf({a})"),
                        (UnaryOp::Sqrt, _) => format!("sqrtf({a})"),
                        (UnaryOp::Rsqrt, _) => format!("rsqrtf({a})"),
                        (UnaryOp::Sigmoid, _) => format!("kf_sigmoid({a})"),
                        (UnaryOp::Tanh, _) => format!("tanhf({a})"),
                        (UnaryOp::Erf, _) => format!("erff({a})"),
                        (UnaryOp::Sin, _) => format!("sinf({a})"),
                        (UnaryOp::Cos, _) => format!("cosf({a})"),
                        (UnaryOp::Not, _) => format!("(!{a})"),
                    };
                    round(d, e)
                }
                Op::Binary(b) => {
                    let bb = &args[1];
                    let int = in_d == DType::I64;
                    let e = match b {
                        BinaryOp::Add => format!("({a} + {bb})"),
                        BinaryOp::Sub => format!("({a} - {bb})"),
                        BinaryOp::Mul => format!("({a} * {bb})"),
                        BinaryOp::Div if recip => format!("({a} * (1.0f / {bb}))"),
                        // 64-bit integer division of a tile by a run-time value is a
                        // long subroutine an element: operands that fit 31 bits (pixel
                        // and row coordinates) divide in 32 bits (a constant divisor is
                        // the compiler's multiply and shift already)
                        BinaryOp::Div if int && !plain_div => match &magic {
                            Some(m) => format!("kf_divm({a}, {bb}, {m})"),
                            None => format!("kf_divi({a}, {bb})"),
                        },
                        BinaryOp::Rem if int && !plain_div => match &magic {
                            Some(m) => format!("kf_remm({a}, {bb}, {m})"),
                            None => format!("kf_remi({a}, {bb})"),
                        },
                        BinaryOp::Div => format!("({a} / {bb})"),
                        BinaryOp::Rem => format!("({a} % {bb})"),
                        BinaryOp::Max if int => format!("kf_maxi({a}, {bb})"),
                        BinaryOp::Min if int => format!("kf_mini({a}, {bb})"),
                        BinaryOp::Max => format!("fmaxf({a}, {bb})"),
                        BinaryOp::Min => format!("fminf({a}, {bb})"),
                        BinaryOp::Lt => format!("({a} < {bb})"),
                        BinaryOp::Le => format!("({a} <= {bb})"),
                        BinaryOp::Gt => format!("({a} > {bb})"),
                        BinaryOp::Ge => format!("({a} >= {bb})"),
                        BinaryOp::Eq => format!("({a} == {bb})"),
                        BinaryOp::Ne => format!("({a} != {bb})"),
                        BinaryOp::And => format!("({a} && {bb})"),
                        BinaryOp::Or => format!("({a} || {bb})"),
                    };
                    if b.is_comparison() { e } else { round(d, e) }
                }
                Op::Select => format!("({a} ? {} : {})", args[1], args[2]),
                Op::Cast { to } => match (in_d, *to) {
                    (DType::Bool, t) if t.is_float() => format!("({a} ? 1.0f : 0.0f)"),
                    (DType::Bool, _) => format!("(long long)({a})"),
                    (_, DType::Bool) => format!("({a} != 0)"),
                    (DType::I64, t) => round(t, format!("(float)({a})")),
                    (_, DType::I64) => format!("(long long)({a})"),
                    (_, t) => round(t, a.clone()),
                },
                _ => unreachable!(),
            }
        };
        if ty.is_scalar() {
            let args: Vec<String> = ops.iter().map(|o| self.val(*o).name.clone()).collect();
            let e = fmt(&args);
            let name = format!("v{}", v.index());
            self.line(format!("const {} {name} = {e};", ctype(d)))?;
            self.vals.insert(v, Val { name, dtype: d, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None });
            return Ok(());
        }
        // valid range: intersection of the operands'
        let rank = ty.rank();
        let (mut lo, mut hi) = (Vec::new(), Vec::new());
        for a in 0..rank {
            let los: Vec<String> = ops.iter().map(|o| self.val(*o).lo[a].clone()).collect();
            let his: Vec<String> = ops.iter().map(|o| self.val(*o).hi[a].clone()).collect();
            lo.push(self.combine_bound(&los, "kf_maxi")?);
            hi.push(self.combine_bound(&his, "kf_mini")?);
        }
        let layout = self.layout(v)?;
        if k.schedule.remat || self.lazy_index(v) {
            let args: Vec<String> = ops.iter().map(|o| self.template(*o)).collect();
            let e = fmt(&args);
            if e.len() <= MAX_LAZY_LEN {
                let val = self.lazy_tile(v, d, &layout, lo, hi, e)?;
                self.vals.insert(v, val);
                return Ok(());
            }
        }
        let val = self.new_tile(v, d, &layout, lo, hi, None)?;
        let regs = val.map.as_ref().unwrap().regs;
        let name = val.name.clone();
        self.vals.insert(v, val);
        self.unroll("k", regs)?;
        let args: Vec<String> = ops.iter().map(|o| self.reg(*o, "k")).collect();
        // an f32 `exp(a - b)` (softmax's `exp(s - m)`): ex2 of `a·log2 e − b·log2 e`, one
        // fused multiply-add an element instead of a subtraction and a multiplication
        // (`b·log2 e` is computed once per distinct `b`, a row's maximum say)
        // `exp(x · c - b)` with a scalar `c` (scores times the softmax scale) folds `c`
        // into the same multiply-add: `x · (c·log2 e) − b·log2 e`
        let e = match (k.op(op), k.op(ops[0].op())) {
            (Op::Unary(UnaryOp::Exp), Op::Binary(BinaryOp::Sub)) if d == DType::F32 && in_d == DType::F32 => {
                let ab = k.operands(ops[0].op());
                match self.scaled_by_scalar(ab[0]) {
                    Some((x, c)) => {
                        self.helpers.insert("kf_exp_scaled".into(), super::prelude::EXP_SCALED.into());
                        format!("kf_exp_scaled({}, {c}, {})", self.reg(x, "k"), self.reg(ab[1], "k"))
                    }
                    None => format!("kf_exp_diff({}, {})", self.reg(ab[0], "k"), self.reg(ab[1], "k")),
                }
            }
            _ => fmt(&args),
        };
        self.line(format!("{name}[k] = {e};"))?;
        self.close()
    }

    /// `(x, c)` where `v` is the f32 tile `x · c` (either order) of a tile `x` and a
    /// broadcast f32 scalar `c` (its name), of `v`'s layout, and only one op uses `v`
    /// (folded there, the product's own registers go unread and the assembler drops them).
    fn scaled_by_scalar(&self, v: ValueId) -> Option<(ValueId, String)> {
        let k = self.k;
        if !matches!(k.op(v.op()), Op::Binary(BinaryOp::Mul)) || k.ty(v).dtype != DType::F32 || k.users(v).len() != 1 {
            return None;
        }
        let ops = k.operands(v.op());
        let scalar = |o: ValueId| match k.op(o.op()) {
            Op::Broadcast if k.ty(k.operands(o.op())[0]).is_scalar() && k.ty(k.operands(o.op())[0]).dtype == DType::F32 => Some(self.val(k.operands(o.op())[0]).name.clone()),
            _ => None,
        };
        let tile = |o: ValueId| !k.ty(o).is_scalar() && k.ty(o).dtype == DType::F32 && self.layout(o).ok() == self.layout(v).ok();
        match (scalar(ops[1]), scalar(ops[0])) {
            (Some(c), _) if tile(ops[0]) => Some((ops[0], c)),
            (_, Some(c)) if tile(ops[1]) => Some((ops[1], c)),
            _ => None,
        }
    }

    /// Combines `var` across the first `width` lanes of each aligned group (a power of
    /// two up to 32) with xor shuffles: every lane of a group ends with the same bits
    /// (each step combines the same two values in both lanes).
    fn butterfly(&mut self, var: &str, width: u32, comb: &dyn Fn(&str, &str) -> String) -> R {
        let mut m = 1;
        while m < width {
            self.line(format!("{var} = {};", comb(var, &format!("__shfl_xor_sync(0xffffffffu, {var}, {m})"))))?;
            m *= 2;
        }
        Ok(())
    }

    /// After a reduction of a rematerialized kernel: tells the compiler the raw words of
    /// the loads may have changed (an empty `asm volatile` that reads and writes them),
    /// so that it recomputes the values after the reduction from them instead of keeping
    /// what it computed before (common-subexpression elimination across the reduction's
    /// barriers would hold every such value in registers again). Costs no instruction.
    fn remat_fence(&mut self) -> R {
        if !self.k.schedule.remat {
            return Ok(());
        }
        for (arr, n, words) in self.remat_arrays.clone() {
            let ops: Vec<String> = (0..words).map(|i| format!("\"+r\"({arr}[g].w[{i}])")).collect();
            self.unroll("g", n)?;
            self.line(format!("asm volatile(\"\" : {});", ops.join(", ")))?;
            self.close()?;
        }
        Ok(())
    }

    /// Combines bound expressions, dropping duplicates.
    fn combine_bound(&mut self, xs: &[String], f: &str) -> Result<String, CodegenError> {
        let mut u: Vec<String> = Vec::new();
        for x in xs {
            if !u.contains(x) {
                u.push(x.clone());
            }
        }
        if u.len() == 1 {
            return Ok(u.pop().unwrap());
        }
        let mut e = u[0].clone();
        for x in &u[1..] {
            e = format!("{f}({e}, {x})");
        }
        let n = self.fresh("kf_b");
        self.line(format!("const long long {n} = {e};"))?;
        Ok(n)
    }

    fn broadcast(&mut self, op: OpId, src: ValueId) -> R {
        let k = self.k;
        let v = op.value();
        let ty = k.ty(v).clone();
        let shape = concrete_shape(k, &ty);
        let s = self.val(src).clone();
        let off = shape.len() - s.shape.len();
        let (mut lo, mut hi) = (Vec::new(), Vec::new());
        for (a, &e) in shape.iter().enumerate() {
            if a < off {
                lo.push("0".to_string());
                hi.push(e.to_string());
            } else if s.shape[a - off] == e {
                lo.push(s.lo[a - off].clone());
                hi.push(s.hi[a - off].clone());
            } else {
                // an extent-1 axis widened: valid everywhere iff its one lane was valid
                let (sl, sh) = (&s.lo[a - off], &s.hi[a - off]);
                lo.push("0".to_string());
                hi.push(if sl == "0" && sh == "1" { e.to_string() } else { format!("(({sl}) <= 0 && ({sh}) > 0 ? {e}LL : 0LL)") });
            }
        }
        let layout = self.layout(v)?;
        if k.schedule.remat || self.lazy_index(v) {
            let map = RegMap::of(&layout).ok_or_else(|| CodegenError::Unsupported("tile with a uniform layout".into()))?;
            let e = match &s.map {
                None => s.name.clone(),
                Some(sm) => at(&self.template(src), &project(&map, sm, LAZY_K)),
            };
            if e.len() <= MAX_LAZY_LEN {
                let val = self.lazy_tile(v, ty.dtype, &layout, lo, hi, e)?;
                self.vals.insert(v, val);
                return Ok(());
            }
        }
        let val = self.new_tile(v, ty.dtype, &layout, lo, hi, None)?;
        let map = val.map.clone().unwrap();
        let name = val.name.clone();
        self.vals.insert(v, val);
        self.unroll("k", map.regs)?;
        let e = match &s.map {
            None => s.name.clone(),
            Some(sm) => self.reg(src, &project(&map, sm, "k")),
        };
        self.line(format!("{name}[k] = {e};"))?;
        self.close()
    }

    fn reduce(&mut self, op: OpId, src: ValueId, r: ReduceOp, axis: usize, keep_dim: bool) -> R {
        let k = self.k;
        let v = op.value();
        let s = self.val(src).clone();
        let d = s.dtype;
        let smap = s.map.clone().unwrap();
        let mi = s.axis_map[axis].ok_or_else(|| CodegenError::Unsupported("reduce along a kept extent-1 axis".into()))?;
        let am = smap.axes[mi].clone();
        let int = d == DType::I64;
        let ident = match (r, int) {
            (ReduceOp::Sum | ReduceOp::Mean, false) => "0.0f",
            (ReduceOp::Sum | ReduceOp::Mean, true) => "0LL",
            (ReduceOp::Max, false) => "(-KF_INF)",
            (ReduceOp::Min, false) => "KF_INF",
            (ReduceOp::Max, true) => "(-9223372036854775807LL - 1)",
            (ReduceOp::Min, true) => "9223372036854775807LL",
        };
        let comb = |a: &str, b: &str| match (r, int) {
            (ReduceOp::Sum | ReduceOp::Mean, _) => format!("{a} + {b}"),
            (ReduceOp::Max, false) => format!("fmaxf({a}, {b})"),
            (ReduceOp::Min, false) => format!("fminf({a}, {b})"),
            (ReduceOp::Max, true) => format!("kf_maxi({a}, {b})"),
            (ReduceOp::Min, true) => format!("kf_mini({a}, {b})"),
        };
        let rlayout = if k.ty(v).is_scalar() { Layout::Uniform } else { self.layout(v)? };
        let rmap = RegMap::of(&rlayout);
        let name = format!("v{}", v.index());
        let nregs = rmap.as_ref().map(|m| m.regs).unwrap_or(1);
        // result ranges: the other axes'
        let (mut lo, mut hi) = (Vec::new(), Vec::new());
        let mut axis_map = Vec::new();
        for a in 0..s.shape.len() {
            if a == axis {
                if keep_dim {
                    lo.push("0".into());
                    hi.push("1".into());
                    axis_map.push(None);
                }
                continue;
            }
            lo.push(s.lo[a].clone());
            hi.push(s.hi[a].clone());
            axis_map.push(s.axis_map[a].map(|m| if m > mi { m - 1 } else { m }));
        }
        let note = k.names.get(&v).map(|n| format!("  // {n}")).unwrap_or_default();
        self.line(format!("{} {name}[{nregs}];{note}", ctype(d)))?;
        self.unroll("k", nregs)?;
        self.line(format!("{name}[k] = {ident};"))?;
        self.close()?;
        // 1. within the thread
        let (slo, shi) = (s.lo[axis].clone(), s.hi[axis].clone());
        // the bounds lie in [0, extent]: compared in 32 bits (64-bit compares of every
        // register's coordinate cost a 4096-element softmax 32 registers)
        let full = shi == s.shape[axis].to_string();
        let blo = if slo == "0" { String::new() } else { self.fresh("kf_lo") };
        let bhi = if full { String::new() } else { self.fresh("kf_hi") };
        if slo != "0" {
            self.line(format!("const int {blo} = (int)({slo});"))?;
        }
        if !full {
            self.line(format!("const int {bhi} = (int)({shi});"))?;
        }
        let c = coord_raw(&smap, mi, "k");
        let dst = match &rmap {
            Some(rm) => project(&smap, rm, "k"),
            None => "0".into(),
        };
        let mut lo_check = if slo == "0" { String::new() } else { format!("{c} >= {blo} && ") };
        if am.replicated() {
            // a replica's element belongs to another thread (or block): skip it
            lo_check = format!("{} < {} && {lo_check}", local_raw(&smap, mi, "k"), am.piece);
        }
        // a bound equal to the axis's extent masks nothing
        let hi_check = if full { String::new() } else { format!("{c} < {bhi}") };
        let check = format!("{lo_check}{hi_check}");
        let check = check.trim_end_matches(" && ");
        // in a loop, a thread's registers of one result register fold into 4 partials
        // (consecutive quarters of its registers), combined at the end: chains a
        // quarter as long (flash attention's row max and sum: 32 dependent
        // instructions each, a latency no other warp of the lockstep block hides);
        // 2 behind three consumer warpgroups, whose 160 registers hold fewer and whose
        // warps hide more (flash attention D64: 0.5-2.6% faster than 4, NOTES.md a29)
        let wide = self.ws.as_ref().is_some_and(|w| w.consumers == warp_specialize::WIDE_CONSUMERS);
        let parts: u32 = if wide { 2 } else { 4 };
        let tree = self.loop_depth > 0 && smap.regs.is_multiple_of(parts) && smap.regs >= 2 * parts * nregs;
        let tgt = if tree { format!("{}_t[(k) / {}]", name, smap.regs / parts) } else { name.clone() };
        if tree {
            self.line(format!("{} {name}_t[{parts}][{nregs}];", ctype(d)))?;
            self.unroll("k", parts * nregs)?;
            self.line(format!("{name}_t[k / {nregs}][k % {nregs}] = {ident};"))?;
            self.close()?;
        }
        let update = format!("{tgt}[{dst}] = {};", comb(&format!("{tgt}[{dst}]"), &self.reg(src, "k")));
        // in a loop, a tile valid along the whole axis (every tile but the last) takes
        // an unmasked copy: one branch on the block-uniform bounds instead of a compare
        // per register. Outside loops the compares stay (the second copy cost row
        // kernels held to few registers their spill-free schedule: softmax over 1024
        // columns spilled at 48)
        let mut whole = Vec::new();
        if slo != "0" {
            whole.push(format!("{blo} <= 0"));
        }
        if !full {
            whole.push(format!("{bhi} >= {}", s.shape[axis]));
        }
        let split = !check.is_empty() && !am.replicated() && self.loop_depth > 0;
        if split {
            self.open(format!("if ({})", whole.join(" && ")))?;
            self.unroll("k", smap.regs)?;
            self.line(&update)?;
            self.close()?;
            self.close()?;
            self.open("else")?;
        }
        self.unroll("k", smap.regs)?;
        self.line(if check.is_empty() { update } else { format!("if ({check}) {update}") })?;
        self.close()?;
        if split {
            self.close()?;
        }
        if tree {
            self.unroll("k", nregs)?;
            let t = |i: u32| format!("{name}_t[{i}][k]");
            let mut terms: Vec<String> = (0..parts).map(t).collect();
            while terms.len() > 1 {
                terms = terms.chunks(2).map(|c| if c.len() == 2 { comb(&c[0], &c[1]) } else { c[0].clone() }).collect();
            }
            self.line(format!("{name}[k] = {};", terms[0]))?;
            self.close()?;
        }
        // 2. across lanes
        if am.tpw > 1 {
            let mut m = 1;
            while m < am.tpw {
                self.unroll("k", nregs)?;
                let sh = format!("__shfl_xor_sync(0xffffffffu, {name}[k], {})", m * am.lane_div);
                self.line(format!("{name}[k] = {};", comb(&format!("{name}[k]"), &sh)))?;
                self.close()?;
                m *= 2;
            }
        }
        // 3+4. across the warps of the cluster at once: each warp pushes its partial
        // into every block's shared memory (`st.async`, counted by the receiving block's
        // mbarrier), every warp then combines all of them in one fixed order. No
        // block-wide or cluster-wide barrier on the way (a cluster barrier with release
        // semantics is a GPU-wide memory fence: `MEMBAR.ALL.GPU` in the SASS).
        if am.ctas > 1 && self.loop_depth > 0 {
            // (its slots and mbarriers serve one reduction, not one an iteration)
            return Err(CodegenError::Unsupported(
                "a reduction across the blocks of a thread-block cluster inside a loop: give the loop's tiles a smaller extent".into(),
            ));
        }
        let nwarps = k.schedule.num_threads / 32;
        let push = am.ctas > 1
            && !int
            && nregs == 1
            && am.tpw == 32
            && am.lane_div == 1
            && am.wpb == nwarps
            && am.warp_div == 1
            && am.ctas <= 32
            && rmap.as_ref().is_none_or(|rm| rm.regs == 1 && owner(&RegMap { dropped: vec![], ..rm.clone() }, "0") == "true");
        let part = Partial { v, name: &name, nregs, am: &am, rmap: &rmap, d, int, ident, comb: &comb };
        if push {
            self.reduce_pushed_across_cluster(&part)?;
        }
        // 3. across warps, through shared memory
        if am.wpb > 1 && !push {
            self.reduce_across_warps(&part)?;
        }
        // 4. across the blocks of a cluster, through distributed shared memory
        if am.ctas > 1 && !push {
            self.reduce_across_cluster(&part)?;
        }
        self.remat_fence()?;
        // mean and rounding
        self.unroll("k", nregs)?;
        let fin = if r == ReduceOp::Mean {
            let cnt = if slo == "0" { format!("({shi})") } else { format!("(({shi}) - ({slo}))") };
            format!("{name}[k] / (float){cnt}")
        } else {
            format!("{name}[k]")
        };
        self.line(format!("{name}[k] = {};", round(d, fin)))?;
        self.close()?;
        if rmap.is_none() {
            let sname = self.fresh("v");
            let sname = format!("{sname}_{}", v.index());
            self.line(format!("const {} {sname} = {name}[0];", ctype(d)))?;
            self.vals.insert(v, Val { name: sname, dtype: d, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None });
        } else {
            let shape = concrete_shape(k, k.ty(v));
            self.vals.insert(v, Val { name, dtype: d, map: rmap, axis_map, shape, lo, hi, lazy: None });
        }
        Ok(())
    }

    /// Reduction step 3+4 (see `reduce`): every warp pushes its partial into every
    /// block of the cluster (`st.async` on the receiver's mbarrier), then combines all.
    fn reduce_pushed_across_cluster(&mut self, p: &Partial) -> R {
        let Partial { v, name, am, ident, comb, .. } = *p;
        let n = am.ctas * am.wpb;
        let r = self.cluster_pushes;
        self.cluster_pushes += 1;
        let cl = format!("kf_cl{}", v.index());
        self.cluster_smem += n * 4;
        self.open("")?;
        self.line(format!("__shared__ float {cl}[{n}];"))?;
        if r == 0 {
            // the mbarriers' initialization (the kernel's start) is visible in every block
            self.line("asm volatile(\"barrier.cluster.wait.aligned;\" ::: \"memory\");")?;
        }
        self.line(format!("if (kf_tid == 0) kf_cl_expect(&kf_clbar[{r}], {});", n * 4))?;
        self.line(format!("if (kf_lane < {}) kf_cl_push_f32(&{cl}[kf_crank * {} + kf_warp], {name}[0], &kf_clbar[{r}], kf_lane);", am.ctas, am.wpb))?;
        self.line(format!("kf_cl_wait(&kf_clbar[{r}]);"))?;
        self.line(format!("float kf_acc = {ident};"))?;
        self.unroll("i", n.div_ceil(32))?;
        if n.is_multiple_of(32) {
            self.line(format!("kf_acc = {};", comb("kf_acc", &format!("{cl}[i * 32 + kf_lane]"))))?;
        } else {
            self.line(format!("if (i * 32 + kf_lane < {n}) kf_acc = {};", comb("kf_acc", &format!("{cl}[i * 32 + kf_lane]"))))?;
        }
        self.close()?;
        self.butterfly("kf_acc", 32, &comb)?;
        self.line(format!("{name}[0] = kf_acc;"))?;
        self.close()?;
        Ok(())
    }

    /// `{ct} kf_acc` = the combination of `n` partials, partial `i` read by `read(i)`
    /// (partial 0 by `first`): over a butterfly of `width` lanes (lane `i` reads partial
    /// `i`, the others start from `ident`), or, without one, by one thread's loop (`var`
    /// declares its index).
    #[allow(clippy::too_many_arguments)]
    fn fold_partials(&mut self, ct: &str, n: u32, butterfly: Option<u32>, var: &str, first: &str, read: &dyn Fn(&str) -> String, ident: &str, comb: &dyn Fn(&str, &str) -> String) -> R {
        match butterfly {
            Some(width) => {
                self.line(format!("{ct} kf_acc = kf_lane < {n} ? {} : {ident};", read("kf_lane")))?;
                self.butterfly("kf_acc", width, comb)
            }
            None => {
                let i = var.rsplit(' ').next().unwrap_or(var);
                self.line(format!("{ct} kf_acc = {first};"))?;
                self.line("#pragma unroll")?;
                self.open(format!("for ({var} = 1; {i} < {n}; ++{i})"))?;
                self.line(format!("kf_acc = {};", comb("kf_acc", &read(i))))?;
                self.close()
            }
        }
    }

    /// Reduction step 3: the warps' partials through shared memory.
    fn reduce_across_warps(&mut self, p: &Partial) -> R {
        let Partial { name, nregs, am, rmap, d, int, ident, comb, .. } = *p;
        let rshape: Vec<u32> = match &rmap {
            Some(rm) => rm.axes.iter().map(|a| a.shape).collect(),
            None => vec![],
        };
        let slots: u32 = rshape.iter().product::<u32>().max(1);
        let bytes = slots * am.wpb * if int { 8 } else { 4 };
        self.scratch(bytes);
        let ct = ctype(d);
        let sl = slot_of(rmap.as_ref());
        self.open("")?;
        self.line(self.barrier)?;
        self.line(format!("{ct}* kf_red = reinterpret_cast<{ct}*>(kf_smem);"))?;
        let lane_c = if am.tpw > 1 { format!("((kf_lane / {}) % {}) == 0", am.lane_div, am.tpw) } else { "true".into() };
        let warp_c = format!("((kf_warp / {}) % {})", am.warp_div, am.wpb);
        self.open(format!("if ({lane_c})"))?;
        self.unroll("k", nregs)?;
        self.line(format!("kf_red[{warp_c} * {slots} + {sl}] = {name}[k];"))?;
        self.close()?;
        self.close()?;
        self.line(self.barrier)?;
        self.unroll("k", nregs)?;
        // (a butterfly: lane w of every warp takes warp w's partial, one shared-memory
        // read a thread instead of `wpb`; only for one partial per warp: with several
        // slots, lanes would need different ones and the butterfly would mix them)
        let butterfly = (am.wpb >= 8 && slots == 1).then_some(32);
        self.fold_partials(ct, am.wpb, butterfly, "int w", &format!("kf_red[{sl}]"), &|i| format!("kf_red[{i} * {slots} + {sl}]"), ident, &comb)?;
        self.line(format!("{name}[k] = kf_acc;"))?;
        self.close()?;
        self.close()?;
        Ok(())
    }

    /// Reduction step 4: the blocks' partials through distributed shared memory.
    fn reduce_across_cluster(&mut self, p: &Partial) -> R {
        let Partial { v, name, nregs, am, rmap, int, ident, comb, .. } = *p;
        if int {
            return Err(CodegenError::Unsupported("a cluster-split reduction of an i64 value".into()));
        }
        let rm_shape: Vec<u32> = match &rmap {
            Some(rm) => rm.axes.iter().map(|a| a.shape).collect(),
            None => vec![],
        };
        let slots: u32 = rm_shape.iter().product::<u32>().max(1);
        let sl = slot_of(rmap.as_ref());
        // every block writes its own partial: ownership here is about replicas
        // along the kept axes only, not along the reduced one
        let own = match &rmap {
            Some(rm) => owner(&RegMap { dropped: vec![], ..rm.clone() }, "k"),
            None => "true".into(),
        };
        let first = {
            let mut c = Vec::new();
            if am.tpw > 1 {
                c.push(format!("((kf_lane / {}) % {}) == 0", am.lane_div, am.tpw));
            }
            if am.wpb > 1 {
                c.push(format!("((kf_warp / {}) % {}) == 0", am.warp_div, am.wpb));
            }
            if own != "true" {
                c.push(own.clone());
            }
            if c.is_empty() { "true".to_string() } else { c.join(" && ") }
        };
        // Each cluster reduction has its own slots, so that no block waits for the
        // others to finish reading before it goes on (one cluster barrier per
        // reduction; the kernel's last statement is a cluster barrier, so that no
        // block's shared memory goes away while another may still read it).
        let cl = format!("kf_cl{}", v.index());
        self.cluster_smem += slots * 4;
        self.cluster_reductions += 1;
        self.open("")?;
        self.line(format!("__shared__ float {cl}[{slots}];"))?;
        self.open(format!("if ({first})"))?;
        self.unroll("k", nregs)?;
        self.line(format!("{cl}[{sl}] = {name}[k];"))?;
        self.close()?;
        self.close()?;
        self.line("kf_cluster_sync();")?;
        self.unroll("k", nregs)?;
        // (a butterfly: lane c reads block c's partial, the first `ctas` lanes combine
        // them — the same bits in each: every step combines the same two values — and
        // lane 0 hands the total to the warp)
        let butterfly = (am.ctas.is_power_of_two() && am.ctas <= 32).then_some(am.ctas);
        let read = |i: &str| format!("kf_ld_cluster_f32({cl} + {sl}, {i})");
        self.fold_partials("float", am.ctas, butterfly, "unsigned c", &read("0"), &read, ident, &comb)?;
        if butterfly.is_some() {
            self.line("kf_acc = __shfl_sync(0xffffffffu, kf_acc, 0);")?;
        }
        self.line(format!("{name}[k] = kf_acc;"))?;
        self.close()?;
        self.close()?;
        Ok(())
    }

    fn convert(&mut self, op: OpId, src: ValueId) -> R {
        let v = op.value();
        let s = self.val(src).clone();
        let d = s.dtype;
        let smap = s.map.clone().unwrap();
        let layout = self.layout(v)?;
        // the same elements in the same registers of the same threads (the rows of two
        // tiles whose layouts split rows alike): nothing moves
        if let Some(dmap) = RegMap::of(&layout).filter(|m| smap.same_registers(m)) {
            self.vals.insert(v, Val { map: Some(dmap), ..s });
            return Ok(());
        }
        let val = self.new_tile(v, d, &layout, s.lo.clone(), s.hi.clone(), None)?;
        let dmap = val.map.clone().unwrap();
        let name = val.name.clone();
        let shape = s.shape.clone();
        self.vals.insert(v, val);
        if smap.axes.iter().chain(dmap.axes.iter()).chain(smap.dropped.iter()).any(|a| a.ctas > 1) {
            return Err(CodegenError::Unsupported("a layout conversion of a tile split across a cluster".into()));
        }
        let esz = d.size_bytes() as u32;
        let sl = self.k.schedule.smem.get(&v).copied().unwrap_or(SmemLayout::Padded { pad: 0 });
        let cols = *shape.last().unwrap();
        let row = match sl {
            SmemLayout::Padded { pad } => cols + pad,
            SmemLayout::Swizzled { .. } => cols,
        };
        let rows: u32 = shape[..shape.len() - 1].iter().product::<u32>().max(1);
        self.scratch(rows * row * esz);
        // the smem index of (coordinates along the value axes)
        let index = |c: &[String]| -> String {
            if c.len() == 1 {
                return c[0].clone();
            }
            let (r, col) = (&c[0], &c[1]);
            match sl {
                SmemLayout::Padded { .. } => format!("({r}) * {row} + ({col})"),
                SmemLayout::Swizzled { vec, phase_div } => format!(
                    "({r}) * {row} + (((({col}) / {vec}) ^ ((({r}) / {phase_div}) % {})) * {vec}) + (({col}) % {vec})",
                    cols / vec
                ),
            }
        };
        let coords = |map: &RegMap, axis_map: &[Option<usize>], k: &str, wrap: bool| -> Vec<String> {
            axis_map
                .iter()
                .map(|am| match am {
                    None => "0".to_string(),
                    Some(i) => if wrap { coord(map, *i, k) } else { coord_raw(map, *i, k) },
                })
                .collect()
        };
        // the vector width each side moves: whole swizzle chunks along the row, when they
        // are whole 32-bit words (8-bit elements in pairs go one at a time)
        let side_vec = |map: &RegMap, axis_map: &[Option<usize>]| -> u32 {
            match sl {
                SmemLayout::Swizzled { vec, .. } => {
                    let last = axis_map.last().copied().flatten();
                    if last.is_some() && map.fastest_axis() == last && map.axes[last.unwrap()].spt >= vec && vec * esz >= 4 { vec } else { 1 }
                }
                _ => 1,
            }
        };
        let all: Vec<Option<usize>> = (0..shape.len()).map(Some).collect();
        let (wv, rv) = (side_vec(&smap, &s.axis_map), side_vec(&dmap, &all));
        let st = stype(d);
        self.open("")?;
        self.line(self.barrier)?;
        self.line(format!("{st}* kf_cv = reinterpret_cast<{st}*>(kf_smem);"))?;
        // write
        self.unroll("g", smap.regs / wv)?;
        self.line(format!("const int k = g * {wv};"))?;
        let own = owner(&smap, "k");
        let widx = index(&coords(&smap, &s.axis_map, "k", false));
        if own != "true" {
            self.open(format!("if ({own})"))?;
        }
        if wv > 1 {
            let vt = vec_type(wv * esz)?;
            self.line(format!("{vt} q;"))?;
            let t = self.template(src);
            self.pack("q", d, &t, "k", wv)?;
            self.line(format!("*reinterpret_cast<{vt}*>(kf_cv + {widx}) = q;"))?;
        } else {
            self.line(format!("kf_cv[{widx}] = {};", from_reg(d, &self.reg(src, "k"))))?;
        }
        if own != "true" {
            self.close()?;
        }
        self.close()?;
        self.line(self.barrier)?;
        // read
        self.unroll("g", dmap.regs / rv)?;
        self.line(format!("const int k = g * {rv};"))?;
        let ridx = index(&coords(&dmap, &all, "k", true));
        if rv > 1 {
            let vt = vec_type(rv * esz)?;
            self.line(format!("const {vt} q = *reinterpret_cast<const {vt}*>(kf_cv + {ridx});"))?;
            self.unpack("q", d, &name, "k", rv)?;
        } else {
            self.line(format!("{name}[k] = {};", to_reg(d, &format!("kf_cv[{ridx}]"))))?;
        }
        self.close()?;
        self.close()
    }

    /// Packs registers `k + 0 .. k + w` of a value (its [`Emitter::template`]) into the
    /// words of vector `q`.
    fn pack(&mut self, q: &str, d: DType, t: &str, k: &str, w: u32) -> R {
        let words = (w * d.size_bytes() as u32 / 4).max(1);
        let r = |j: u32| at(t, &format!("{k} + {j}"));
        for wi in 0..words {
            let e = match d.size_bytes() {
                // an 8-byte integer: its low word, then its high word
                8 => format!("(unsigned int)((unsigned long long)({}) >> {})", r(wi / 2), 32 * (wi % 2)),
                4 => format!("__float_as_uint({})", r(wi)),
                2 => format!("kf_pack16({}, {})", from_reg(d, &r(2 * wi)), from_reg(d, &r(2 * wi + 1))),
                1 if w >= 4 => {
                    let b: Vec<String> = (0..4).map(|j| from_reg(d, &r(4 * wi + j))).collect();
                    format!("kf_pack8({}, {}, {}, {})", b[0], b[1], b[2], b[3])
                }
                n => return Err(CodegenError::Unsupported(format!("vectors of {n}-byte elements"))),
            };
            self.line(format!("{q}.w[{wi}] = {e};"))?;
        }
        Ok(())
    }

    /// Unpacks vector `q` into registers `arr[k + 0 .. k + w]`.
    fn unpack(&mut self, q: &str, d: DType, arr: &str, k: &str, w: u32) -> R {
        for j in 0..w {
            let e = match d.size_bytes() {
                8 => format!("(long long)(((unsigned long long){q}.w[{}] << 32) | {q}.w[{}])", 2 * j + 1, 2 * j),
                4 => format!("__uint_as_float({q}.w[{j}])"),
                2 => to_reg(d, &format!("kf_{}16({q}.w[{}])", if j % 2 == 0 { "lo" } else { "hi" }, j / 2)),
                1 if w >= 4 => to_reg(d, &format!("kf_byte({q}.w[{}], {})", j / 4, j % 4)),
                n => return Err(CodegenError::Unsupported(format!("vectors of {n}-byte elements"))),
            };
            self.line(format!("{arr}[{k} + {j}] = {e};"))?;
        }
        Ok(())
    }
}

/// The CUDA entry-point name of a kernel.
pub fn entry_name(k: &Kernel) -> String {
    format!("kf_{}", k.name)
}

/// `__launch_bounds__`'s arguments: the block's threads, and the schedule's minimum
/// blocks a multiprocessor where it sets one.
fn launch_bounds(k: &Kernel, threads: u32) -> String {
    if k.schedule.min_blocks > 0 {
        format!("{threads}, {}", k.schedule.min_blocks)
    } else {
        threads.to_string()
    }
}

/// A kernel's source up to its body: the banner, the base prelude and `preludes`, then
/// the entry point (`attrs` before its launch bounds `bounds`) opened with the thread's
/// index, lane and warp.
#[allow(clippy::too_many_arguments)]
fn open_kernel(w: &mut Writer<String>, k: &Kernel, target: &Target, preludes: &[&str], attrs: &str, bounds: &str, decls: &[String], walked: bool) -> std::fmt::Result {
    w.line(format!("// Generated by kfuse from kernel `{}` for {}. Do not edit.", k.name, target.arch()))?;
    w.raw(&crate::cuda::prelude::base_prelude(k))?;
    for p in preludes {
        w.raw(p)?;
    }
    w.line("")?;
    if k.schedule.grouped {
        w.open(format!(
            "extern \"C\" __global__ void {attrs}__launch_bounds__({bounds}) {}(const long long* __restrict__ kf_grp, const long long kf_ngrp)",
            entry_name(k)
        ))?;
        if !walked {
            group_prologue(w, decls)?;
        }
    } else {
        w.open(format!("extern \"C\" __global__ void {attrs}__launch_bounds__({bounds}) {}({})", entry_name(k), decls.join(", ")))?;
    }
    w.line("const int kf_tid = threadIdx.x;")?;
    w.line("const int kf_lane = kf_tid & 31;")?;
    w.line("const int kf_warp = kf_tid >> 5;")?;
    w.line("(void)kf_lane; (void)kf_warp;")
}

/// The start of a grouped kernel (`Schedule::grouped`): the block finds its problem in
/// the table (`EmittedKernel::grouped`: records of grid x/y/z, programs before it, then
/// one word per parameter), its program ids within that problem's grid (`kf_pid0..2`),
/// and binds each parameter's name (`decls`, in `KernelParam` order) to the problem's
/// word, so that the body reads them as it would the kernel's own parameters.
fn group_prologue(w: &mut Writer<String>, decls: &[String]) -> std::fmt::Result {
    let rec = 4 + decls.len();
    w.line("long long kf_g = 0;")?;
    w.line(format!("while (kf_g + 1 < kf_ngrp && (long long)blockIdx.x >= kf_grp[(kf_g + 1) * {rec} + 3]) ++kf_g;"))?;
    w.line(format!("const long long* kf_rec = kf_grp + kf_g * {rec};"))?;
    w.line("const long long kf_local = (long long)blockIdx.x - kf_rec[3];")?;
    w.line("const long long kf_pid0 = kf_local % kf_rec[0];")?;
    w.line("const long long kf_pid1 = (kf_local / kf_rec[0]) % kf_rec[1];")?;
    w.line("const long long kf_pid2 = kf_local / (kf_rec[0] * kf_rec[1]);")?;
    w.line("(void)kf_pid1; (void)kf_pid2;")?;
    bind_group_params(w, decls, &|_| true)
}

/// Binds each parameter's name (`decls`, in `KernelParam` order) to its word of the
/// problem's record `kf_rec`: pointers, `long long` and `float` values, and the tensor
/// maps `uses_map` names (the word is the address of the problem's map in global memory,
/// fenced for the tensor-map proxy; a map the calling code never reads is neither
/// bound nor fenced — the fence is an instruction every tile would execute).
pub(super) fn bind_group_params(w: &mut Writer<String>, decls: &[String], uses_map: &dyn Fn(&str) -> bool) -> std::fmt::Result {
    for (i, d) in decls.iter().enumerate() {
        let word = format!("kf_rec[{}]", 4 + i);
        // `<type> <name>`
        let (ty, name) = d.rsplit_once(' ').expect("a parameter declaration");
        let ty = ty.replace(" __restrict__", "");
        if ty.contains("CUtensorMap") && !uses_map(name) {
            continue;
        }
        let line = if ty.contains("CUtensorMap") {
            // written by a copy from the host, read by the tensor-map proxy: acquire
            // those writes for that proxy before the map's first use
            w.line(format!("const CUtensorMap& {name} = *reinterpret_cast<const CUtensorMap*>({word});"))?;
            format!("asm volatile(\"fence.proxy.tensormap::generic.acquire.sys [%0], 128;\" :: \"l\"(&{name}) : \"memory\");")
        } else if ty.contains('*') {
            format!("{ty} {name} = reinterpret_cast<{ty}>({word});")
        } else if ty.ends_with("float") {
            format!("{ty} {name} = __int_as_float((int){word});")
        } else {
            format!("{ty} {name} = {word};")
        };
        w.line(line)?;
    }
    Ok(())
}

/// The tensor maps a warp-specialized body adds to the kernel's parameters, after its
/// own: the producer's (TMA copies of the rings, `kf_rtm<map>`), then those of the
/// stores that leave by TMA (`kf_stm<map>`).
fn map_decls(ws: Option<&warp_specialize::WsPlan>, stores: &[tma_store::StoreTma]) -> Vec<(String, KernelParam)> {
    let mut tma: Vec<&warp_specialize::TmaLoad> = ws.map(|ws| ws.tma.values().collect()).unwrap_or_default();
    tma.sort_by_key(|t| t.map);
    let rings = tma.iter().map(|t| (format!("const __grid_constant__ CUtensorMap kf_rtm{}", t.map), t.param.clone()));
    rings.chain(stores.iter().map(|st| (format!("const __grid_constant__ CUtensorMap kf_stm{}", st.map), st.param.clone()))).collect()
}

/// What the writer produced for one kernel: the CUDA source and the parameter list.
pub struct Emitted {
    /// The whole CUDA C++ source, prelude included.
    pub source: String,
    /// The entry point's parameters, in order.
    pub params: Vec<KernelParam>,
    /// Shared memory declared statically in the source.
    pub static_smem: u32,
    /// Dynamic shared memory to pass at launch.
    pub dynamic_smem: u32,
    /// How each `dot` lowered where it stands runs, one line each in op order, after the
    /// line of a warp-specialized kernel's rings (the plan shows them; empty for the
    /// matrix paths).
    pub dot_notes: Vec<String>,
    /// The loops written unrolled (a trip count the launch fixes), one line each.
    pub loop_notes: Vec<String>,
    /// Threads a block.
    pub block_threads: u32,
    /// Most programs to launch (persistent kernels walk the rest themselves).
    pub persistent: Option<u32>,
    /// The launch bounds' blocks a multiprocessor where the writer chose them itself
    /// (a warp-specialized kernel: one), else `None`: the schedule's `min_blocks`.
    pub min_blocks: Option<u32>,
    /// Some loop issues its last dot late (`dot_overlap`): the kernel has a further
    /// register-room attempt, without.
    pub late_dots: bool,
    /// Some loop issues its staged loads an iteration ahead (`loops.rs`): the kernel's
    /// next register-room attempt loads them each step instead.
    pub ahead_loads: bool,
    /// The shared-memory addresses are taken once (`Emitter::addresses_once`): the
    /// kernel's next register-room attempt takes them at each use.
    pub addresses_once: bool,
}

/// How deep [`body`] makes a kernel's rings: `cp.async` rings at most `stages`, a
/// producer warpgroup's at most `ws_stages`; with `tma_out`, a warp-specialized kernel's
/// stores leave by TMA where they can (`tma_store::general_stores`).
#[derive(Clone, Copy)]
struct Depth {
    /// `cp.async` rings at all (else every operand staged where it is defined)
    rings: bool,
    stages: u32,
    ws_stages: u32,
    tma_out: bool,
}

/// Writes the body of a kernel without a matrix loop, the carried tiles in `dynamic`
/// with valid ranges that follow the iterations.
fn body<'a>(k: &'a Kernel, spec: &'a Spec, target: &Target, grid: &[crate::target::GridAxisEval], dynamic: BTreeSet<(LoopId, u32)>, depth: Depth, decls: &[String]) -> Result<Emitter<'a>, CodegenError> {
    let Depth { rings, stages, ws_stages, tma_out } = depth;
    let mut e = Emitter::new(k, spec, "__syncthreads();", grid);
    e.dynamic_ranges = dynamic;
    e.decls = decls.to_vec();
    if k.schedule.split_blocks <= 1 && k.schedule.persistent == 0 {
        let wgmma = target.sm >= 90;
        // the rings' second stages go first, then the rule, where the operand area
        // would not fit the block's shared memory
        let fits = |p: &dot_wgmma::WgPlan| 1024 + p.bytes <= target.smem_per_block;
        let p = Some(dot_wgmma::plan(k, spec, rings, wgmma, 2)).filter(fits).unwrap_or_else(|| dot_wgmma::plan(k, spec, false, wgmma, 2));
        e.wg = Some(p).filter(|p| !p.dots.is_empty() && fits(p));
        if target.sm >= 90 {
            // (a warp-specialized kernel's first attempt takes the shared addresses once,
            // its next ones are the attempts of the kernel without: `base_attempt`'s
            // rule, written out here because `e.ws` is not set yet)
            let once = warp_specialize::takes_addresses_once(k);
            let base = warp_specialize::attempt_without_once(spec.register_attempt, once);
            e.ws = e.wg.as_ref().and_then(|p| warp_specialize::ws_plan(k, spec, p, k.schedule.num_threads, base == 0));
            e.addresses_once = once && e.ws.is_some() && spec.register_attempt == 0;
        }
        // a producer warpgroup runs as many stages ahead as shared memory holds beside
        // the stores' area (`ws_stages` at most), else 3 where they fit, else 2
        // (`ws_stages` 2: two); where the epilogue's scratch, known once the body is
        // written, does not fit beside them, `emit` writes the body again with 3
        // (SwiGLU's pair at 128x128: 4 stages, M4096 N4096 K4096 0.96x -> 0.98x and
        // 1.01x of the faster cuBLAS baseline on an H200, NOTES l9b)
        if e.ws.is_some() && ws_stages > 2 {
            let store = if tma_out { tma_store::general_stores(k, spec, u32::MAX).1 } else { 0 };
            let rings = e.wg.as_ref().unwrap().rings.clone();
            // (and the row tables of gathered ring loads, static: a row's offset a stage)
            let tables = |p: &dot_wgmma::WgPlan| p.rings.values().flatten().filter(|&&v| !operand_ring::gathered_roots(k, v).is_empty()).map(|v| p.eager[v].rows * 8 * p.stages).sum::<u32>();
            let room = |p: &dot_wgmma::WgPlan| 1024 + p.bytes.div_ceil(1024) * 1024 + store + tables(p) <= target.smem_per_block;
            let deepest = (warp_specialize::STAGES + 1..=ws_stages).rev().map(|s| dot_wgmma::plan(k, spec, true, wgmma, s)).find(|p| room(p) && p.rings == rings);
            let deeper = deepest.unwrap_or_else(|| dot_wgmma::plan(k, spec, true, wgmma, warp_specialize::STAGES));
            if fits(&deeper) && deeper.rings == rings {
                e.wg = Some(deeper);
            }
        }
        // `cp.async` rings run `stages - 1` steps ahead where shared memory holds them
        if e.ws.is_none() && e.wg.as_ref().is_some_and(|p| !p.rings.is_empty()) {
            let rings = e.wg.as_ref().unwrap().rings.clone();
            let deeper = (3..=stages).rev().map(|s| dot_wgmma::plan(k, spec, true, wgmma, s)).find(|p| fits(p) && p.rings == rings);
            if deeper.is_some() {
                e.wg = deeper;
            }
        }
        // (the rings are final here: whether the block walks the programs)
        if let Some(ws) = e.ws.as_mut() {
            ws.persistent = warp_specialize::walks_programs(k, e.wg.as_ref().unwrap(), grid, target.num_sms);
            ws.grouped = grid.len() >= 2 && warp_specialize::grouped_walk(k, e.wg.as_ref().unwrap());
        }
        if tma_out && target.sm >= 90 && e.ws.is_some() {
            // after the operand area, on a swizzle pattern's repeat; where none fits
            // there, through a staged operand's tile whose readers are done
            // (`tma_store::reuses_dead_tiles`)
            let plan = e.wg.as_ref().unwrap();
            let at = plan.bytes.div_ceil(1024) * 1024;
            let (mut stores, mut bytes) = tma_store::general_stores(k, spec, target.smem_per_block.saturating_sub(1024 + at));
            let (mut at, mut reuses) = (at, None);
            if stores.is_empty() && tma_store::reuses_dead_tiles(e.ws.as_ref().unwrap()) {
                let (all, need) = tma_store::general_stores(k, spec, u32::MAX);
                if let Some((off, v)) = tma_store::dead_staged_tile(k, plan, &all, need) {
                    (stores, bytes, at, reuses) = (all, need, off, Some(v));
                }
            }
            e.out_tma_maps = stores.values().cloned().collect();
            (e.out_tma, e.out_tma_at, e.out_tma_bytes, e.out_tma_reuses) = (stores, at, bytes, reuses);
        }
        e.find_ring_nests();
        if let Some(ws) = &e.ws {
            let once = if e.addresses_once { "; the mbarriers' and operand tiles' shared-memory addresses taken once (a later attempt takes them at each use)" } else { "" };
            e.dot_notes.push(format!("{}{once}", warp_specialize::note(ws)));
            e.barrier = warp_specialize::CONSUMER_BARRIER;
            let mut pe = Emitter::new(k, spec, warp_specialize::CONSUMER_BARRIER, grid);
            (pe.wg, pe.ws, pe.producer, pe.addresses_once) = (e.wg.clone(), e.ws.clone(), true, e.addresses_once);
            // (a grouped walk binds the parameters, tensor maps included: their words)
            (pe.decls, pe.out_tma_maps) = (e.decls.clone(), e.out_tma_maps.clone());
            pe.w.indent();
            pe.w.indent();
            if ws.gathered {
                pe.line("unsigned kf_tt = 0;")?;
            }
            if ws.persistent {
                pe.open_walk(grid)?;
            }
            pe.producer_program()?;
            if ws.persistent {
                pe.close()?;
            }
            // (the producer's row tables, static shared memory)
            e.ring_table_bytes += pe.ring_table_bytes;
            e.producer_text = Some(pe.w.finish());
        }
    }
    e.w.indent();
    if k.schedule.persistent > 0 {
        e.persistent_body(grid)?;
    } else if e.ws.as_ref().is_some_and(|ws| ws.persistent) {
        e.open_walk(grid)?;
        for op in k.ops() {
            e.op(op)?;
        }
        e.close()?;
        e.drain_tma_stores()?;
    } else {
        if k.schedule.l2_prefetch > 0 {
            e.l2_prefetch_ahead()?;
        }
        for op in k.ops() {
            e.op(op)?;
        }
        e.drain_tma_stores()?;
    }
    Ok(e)
}

/// The launch's value an `i64` tile's `/` or `%` (`op`) divides by, where it is one: a
/// scalar parameter or a shape, broadcast to the tile. Such a division takes the value's
/// multiply-shift word ([`KernelParam::DivMagic`]), which the runtime computes once a
/// launch.
fn magic_divisor(k: &Kernel, op: OpId) -> Option<KernelParam> {
    if !matches!(k.op(op), Op::Binary(BinaryOp::Div | BinaryOp::Rem)) || k.ty(op.value()).is_scalar() {
        return None;
    }
    let ops = k.operands(op);
    if ops.len() != 2 || k.ty(ops[0]).dtype != DType::I64 {
        return None;
    }
    let mut d = ops[1];
    while matches!(k.op(d.op()), Op::Broadcast) {
        d = k.operands(d.op())[0];
    }
    match *k.op(d.op()) {
        Op::ScalarParam { param } if k.param(param).dtype == DType::I64 => Some(KernelParam::Scalar(param)),
        Op::ShapeDim { sym } => Some(KernelParam::Shape(sym)),
        _ => None,
    }
}

/// The name of the kernel parameter holding the multiply-shift word of `p` (a scalar
/// parameter or a shape; [`magic_divisor`]).
fn magic_name(k: &Kernel, p: &KernelParam) -> String {
    match p {
        KernelParam::Scalar(id) => format!("dm_{}", k.param(*id).name),
        KernelParam::Shape(s) => format!("dm_n_{}", k.shape_name(*s)),
        _ => unreachable!("a divisor is a scalar or a shape"),
    }
}

/// Where the scratch starts in the operand area (`kf_smem - kf_ops`) and the dynamic
/// shared memory of a written body: WGMMA dots' operand area, then the scratch, from a
/// 1024-byte boundary (the swizzle patterns' repeat); the scratch starts at the operand
/// area itself where [`shares_operand_area`] (a ring's bytes are dead outside its nest:
/// its last copies have landed and its last instructions completed before the nest
/// ends). `(None, 0)` without an operand area (the scratch is static then).
fn shared_layout(e: &Emitter<'_>) -> (Option<u32>, u32) {
    match e.wg.as_ref().map(|p| p.bytes) {
        // (a scratch beyond the static limit is dynamic: `kf_smem` is then the extern array)
        None if e.smem > MAX_STATIC_SMEM => (None, e.smem.div_ceil(16) * 16),
        None => (None, 0),
        Some(o) => {
            // (the stores' area after the operand area: `body`)
            let o = if e.out_tma_bytes > 0 { o.max(e.out_tma_at + e.out_tma_bytes) } else { o };
            let at = if shares_operand_area(e) { 0 } else { o };
            (Some(at), 1024 + o.max(at + e.smem.div_ceil(16) * 16))
        }
    }
}

/// Whether the body's scratch may share the operand area's bytes: the rings are
/// `cp.async` ones (a producer warpgroup's run ahead of the consumers), every tile of the
/// area is a ring's, and no scratch is used inside a ring nest.
fn shares_operand_area(e: &Emitter<'_>) -> bool {
    let rings_only = e.wg.as_ref().is_some_and(|p| !p.rings.is_empty() && p.eager.values().all(|t| t.ring.is_some()) && p.dots.values().all(|d| d.b_tile().eager && d.a_tile().is_none_or(|t| t.eager)));
    e.ws.is_none() && rings_only && !e.scratch_in_ring
}

/// Writes the CUDA source of a scheduled kernel ([`crate::schedule`]'s result) for
/// `target`; `grid` is the kernel's grid in program-axis order (axis 0 first).
pub fn emit(k: &Kernel, spec: &Spec, target: &Target, grid: &[crate::target::GridAxisEval]) -> Result<Emitted, CodegenError> {
    let mut params = Vec::new();
    let mut decls = Vec::new();
    for (i, p) in k.params.iter().enumerate() {
        let id = kfuse_ir::ParamId(i as u32);
        match &p.kind {
            ParamKind::Tensor { dims, output } => {
                let q = if *output { "" } else { "const " };
                decls.push(format!("{q}{}* __restrict__ p_{}", stype(p.dtype), p.name));
                params.push(KernelParam::Ptr(id));
                let ts = spec.tensors.get(i).cloned().flatten();
                for dd in 0..dims.len() {
                    let unit = ts.as_ref().map(|t| t.stride_div.get(dd) == Some(&0)).unwrap_or(false);
                    if !unit {
                        decls.push(format!("const long long st_{}_{dd}", p.name));
                        params.push(KernelParam::Stride { tensor: id, dim: dd as u32 });
                    }
                }
            }
            ParamKind::Scalar => {
                let t = if p.dtype == DType::I64 { "long long" } else { "float" };
                decls.push(format!("const {t} a_{}", p.name));
                params.push(KernelParam::Scalar(id));
            }
        }
    }
    for (i, s) in k.shape_syms.iter().enumerate() {
        decls.push(format!("const long long n_{s}"));
        params.push(KernelParam::Shape(kfuse_ir::ShapeSym(i as u32)));
    }
    // the multiply-shift words of the launch's values tiles are divided by
    let mut magic = Vec::new();
    for op in k.ops() {
        if let Some(p) = magic_divisor(k, op).filter(|p| !magic.contains(p)) {
            decls.push(format!("const long long {}", magic_name(k, &p)));
            params.push(KernelParam::DivMagic(Box::new(p.clone())));
            magic.push(p);
        }
    }
    // The body first (its shared-memory needs are known only afterwards): `cp.async`
    // rings as deep as the whole block's shared memory then holds (`ring_stages` 1: no
    // rings, every operand staged where it is defined), or as `STAGES` asks where one
    // block holds that many (`ring_occupancy`'s blocks a multiprocessor do not bound it)
    let asked = spec.tiles.get("STAGES").map(|&s| s.clamp(2, operand_ring::MAX_STAGES));
    let stages = match (k.schedule.ring_stages, asked) {
        (0, Some(s)) => s,
        (0, None) => operand_ring::STAGES,
        (s, _) => s.clamp(2, operand_ring::STAGES),
    };
    let mut depth = Depth { rings: k.schedule.ring_stages != 1, stages, ws_stages: asked.unwrap_or(warp_specialize::MAX_STAGES), tma_out: true };
    let seed = loops::dot_carried(k, |v| load_whole(k, spec, grid, v));
    let mut e = loop {
        let mut e = body(k, spec, target, grid, seed.clone(), depth, &decls)?;
        while !e.retry.is_empty() {
            // carried tiles whose valid range changes across iterations (see `loops.rs`)
            let dynamic = e.dynamic_ranges.union(&e.retry).copied().collect();
            e = body(k, spec, target, grid, dynamic, depth, &decls)?;
        }
        let ring_stages = e.wg.as_ref().filter(|p| e.ws.is_none() && !p.rings.is_empty()).map_or(2, |p| p.stages);
        let total = shared_layout(&e).1 + e.ring_table_bytes;
        if e.ws.is_some() && total > target.smem_per_block {
            // the ring, the stores' area and the scratch do not all fit: three stages,
            // then stores from registers, then two stages
            if depth.ws_stages > warp_specialize::STAGES {
                depth.ws_stages = warp_specialize::STAGES;
                continue;
            }
            if !e.out_tma_maps.is_empty() {
                depth.tma_out = false;
                continue;
            }
            if depth.ws_stages > 2 {
                depth.ws_stages = 2;
                continue;
            }
        }
        // (`ring_occupancy`'s blocks share the multiprocessor's shared memory, each
        // with 1 KiB the system keeps)
        let blocks = if asked.is_some() { 1 } else { k.schedule.min_blocks.max(1) };
        let rings = e.ws.is_none() && e.wg.as_ref().is_some_and(|p| !p.rings.is_empty());
        if rings && ring_stages <= 2 && total > target.smem_per_block {
            // two stages and the scratch do not fit the block: no rings
            depth.rings = false;
            continue;
        }
        if ring_stages <= 2 || blocks * (total + 1024) <= target.smem_per_block + 1024 {
            break e;
        }
        depth.stages = ring_stages - 1;
    };
    if e.cluster_reductions > 0 {
        // the partials in this block's shared memory stay until every block has read them
        e.line("kf_cluster_sync();")?;
    }
    let pushes = e.cluster_pushes;
    if pushes > 0 {
        // no block leaves while a push it sent may still be on its way
        e.line("asm volatile(\"barrier.cluster.arrive.relaxed.aligned;\\n\\tbarrier.cluster.wait.aligned;\" ::: \"memory\");")?;
    }
    let smem = e.smem;
    let ops_bytes = e.wg.as_ref().map(|p| p.bytes);
    let (scratch_at, dynamic_smem) = shared_layout(&e);
    // (the rings' row tables are declared statically, beside the dynamic bytes)
    if dynamic_smem + e.ring_table_bytes > target.smem_per_block {
        return Err(CodegenError::Unsupported(format!("{} bytes of shared memory (the target allows {})", dynamic_smem + e.ring_table_bytes, target.smem_per_block)));
    }
    let helpers = dot_wgmma::helper_texts(&e.helpers);
    let e_notes = std::mem::take(&mut e.dot_notes);
    let loop_notes = std::mem::take(&mut e.loop_notes);
    let static_smem = if ops_bytes.is_some() { e.cluster_smem + e.ring_table_bytes } else if dynamic_smem > 0 { e.cluster_smem } else { smem + e.cluster_smem };
    let once = e.addresses_once;
    let body = e.w.finish();
    let producer = e.producer_text.take();
    let tma = e.ws.as_ref().is_some_and(|ws| !ws.tma.is_empty());
    for (d, p) in map_decls(e.ws.as_ref(), &e.out_tma_maps) {
        decls.push(d);
        params.push(p);
    }
    let threads = k.schedule.num_threads + if producer.is_some() { e.ws.as_ref().map_or(warp_specialize::PRODUCER_THREADS, |ws| ws.producers) } else { 0 };
    let cluster = k.schedule.split_blocks;
    let cluster_attr = if cluster > 1 { format!("__cluster_dims__({cluster}, 1, 1) ") } else { String::new() };
    // (a warp-specialized kernel's consumer threads: its named barriers and mbarriers)
    let consumers = e.ws.as_ref().map_or(warp_specialize::CONSUMERS, |ws| ws.consumers);
    let ws_prelude = warp_specialize::ws_prelude(consumers);
    let mut preludes: Vec<&str> = if cluster > 1 { vec![CLUSTER_PRELUDE] } else { vec![] };
    if ops_bytes.is_some() {
        preludes.extend([dot_wgmma::WG_DOT_PRELUDE, operand_ring::RING_PRELUDE]);
    }
    // the device functions the body called (`wgmma` instructions, `kf_exp_scaled`)
    if !helpers.is_empty() {
        preludes.push(helpers.as_str());
    }
    if producer.is_some() {
        preludes.push(ws_prelude.as_str());
    }
    if tma || !e.out_tma_maps.is_empty() {
        preludes.push(warp_specialize::TMA_PRELUDE);
    }
    let producer_bounds = producer.is_some();
    let bounds = if producer_bounds { format!("{threads}, 1") } else { launch_bounds(k, threads) };
    let mut w = Writer::new(String::new());
    let mut head = || -> std::fmt::Result {
        // (a grouped kernel that walks its programs binds each program's problem there)
        let walked = e.ws.as_ref().is_some_and(|ws| ws.persistent);
        open_kernel(&mut w, k, target, &preludes, &cluster_attr, &bounds, &decls, walked)?;
        if cluster > 1 {
            w.line(format!("const int kf_crank = (int)(blockIdx.x % {cluster});"))?;
        }
        if let Some(o) = ops_bytes {
            w.line("extern __shared__ __align__(1024) unsigned char kf_dsmem[];")?;
            w.line("unsigned char* kf_ops = kf_dsmem + ((1024u - (kf_saddr(kf_dsmem) & 1023u)) & 1023u);")?;
            w.line(format!("unsigned char* kf_smem = kf_ops + {};", scratch_at.unwrap_or(o)))?;
            w.line("(void)kf_smem;")?;
            if once {
                // (the operand area's shared-memory address, taken once: `SmemTile::addr`)
                w.line("const unsigned kf_ops_sa = kf_saddr_once(kf_ops);")?;
                w.line(format!("const unsigned kf_smem_sa = kf_ops_sa + {};", scratch_at.unwrap_or(o)))?;
                w.line("(void)kf_smem_sa;")?;
            }
            if let Some(p) = &producer {
                let ws = e.ws.as_ref().unwrap();
                warp_specialize::split_roles(&mut w, p, ws.barriers(e.wg.as_ref().map_or(2, |p| p.stages)), ws, ws.regs, once)?;
            }
        } else if dynamic_smem > 0 {
            w.line("extern __shared__ __align__(16) unsigned char kf_smem[];")?;
        } else if smem > 0 {
            w.line(format!("__shared__ __align__(16) unsigned char kf_smem[{}];", smem.div_ceil(16) * 16))?;
        }
        if pushes > 0 {
            // one mbarrier per pushed cluster reduction, initialized before any block
            // pushes (the first reduction waits on this arrival)
            w.line(format!("__shared__ __align__(8) unsigned long long kf_clbar[{pushes}];"))?;
            w.open("if (kf_tid == 0)")?;
            w.line(format!("for (int i = 0; i < {pushes}; ++i) kf_cl_init(&kf_clbar[i]);"))?;
            w.line("asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");")?;
            w.close()?;
            w.line("asm volatile(\"barrier.cluster.arrive.relaxed.aligned;\" ::: \"memory\");")?;
        }
        w.raw(&body)?;
        w.close()
    };
    head().map_err(fmt_err)?;
    let persistent = match &e.ws {
        Some(ws) if ws.persistent => Some(target.num_sms),
        _ => (k.schedule.persistent > 0).then_some(k.schedule.persistent),
    };
    let min_blocks = producer_bounds.then_some(1);
    let late_dots = e.ws.as_ref().is_some_and(|ws| !ws.late.is_empty());
    Ok(Emitted { source: w.finish(), params, static_smem, dynamic_smem, block_threads: threads, persistent, dot_notes: e_notes, loop_notes, min_blocks, late_dots, ahead_loads: e.ahead_used, addresses_once: e.addresses_once })
}

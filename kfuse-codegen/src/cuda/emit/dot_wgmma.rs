//! Writes a `dot` lowered where it stands (`Schedule::dots_one_by_one`) as warpgroup
//! matrix instructions on sm_90a: `wgmma.mma_async … m64nNkK`, f32 accumulators, each
//! instruction 32 bytes of k (`k16` for f16/bf16, `k32` for fp8, `k8` for f32 read as
//! TF32).
//!
//! The rule applies where `assign_layouts` put the result in the accumulator layout of
//! whole warpgroups stacked along the rows (`one_dot_mma_layout` with `warps = [4 g, 1]`:
//! the WGMMA `m64nN` accumulator, LAYOUTS.md §4.2), the operands are f16 or bf16 — or
//! fp8, or the f32 operands of a `dot_tf32`, where the general lowering takes the matrix
//! loop (`Schedule::general_matrix_loop`) — and `N ≤ 256`. Warpgroup `g` computes the
//! 64-row blocks `g, g + G, …` of the result. 8-bit and TF32 operands are K-major in
//! shared memory and reach it only by a ring's copies (WGMMA neither transposes them nor
//! takes them from registers; a tile to be written from registers is refused).
//!
//! Operands:
//! - **A from registers** where A is itself in the accumulator layout of the same warps
//!   (flash attention's `p.cast()`): each k16 step packs the thread's own registers in
//!   pairs (`cvt.rn.bf16x2.f32`), no data moves (LAYOUTS.md §4.4). Lanes outside the
//!   valid k range are packed as 0.
//! - **Otherwise from shared memory** ([`SmemTile`]): each operand K-major when its
//!   registers run along k (`kt.t()`), MN-major when they run along m or n (`v`, a
//!   transposed A; 16-bit only, `imm-trans-a/b`), each in
//!   the widest swizzle (128, 64 or 32 bytes) its contiguous extent takes, 1024-byte
//!   aligned, described by a matrix descriptor (LAYOUTS.md §5).
//!
//! Staging: an operand whose value (through transposes) feeds nothing but such operand
//! slots in one form is written to its own region of the operand area (`kf_ops`) right
//! where it is defined ([`WgPlan::eager`]), so that its registers die there and a
//! loop-invariant operand (flash attention's Q) is written once, before the loop. Any
//! other operand is written at the dot into the shared scratch (`kf_smem`). Either way
//! each thread writes its own registers (16-byte vectors where the layout holds 8
//! consecutive elements along the contiguous axis), lanes outside the value's valid
//! range along k as 0, then `fence.proxy.async` (generic stores, read by the async
//! proxy); a barrier before the instructions orders every thread's writes. A region is
//! written again only after a barrier that follows its last readers.
//!
//! Masking: each operand is zero outside its own valid k range, so a product lane is
//! either valid in both operands or 0 — except where one operand's lane is valid and
//! holds inf or NaN while the other's is masked (the interpreter ignores that lane; here
//! it gives NaN). The result is valid on A's rows × B's columns.
//!
//! The dot is synchronous: the instructions are committed and waited for before the
//! next op (`wgmma.wait_group 0`); loads inside a loop overlap them through the operand
//! rings (`operand_ring.rs`). Under warp specialization (`warp_specialize.rs`) a loop's
//! last dot whose value only feeds the next iteration is waited for by the next
//! iteration's first dot (or issued there: `dot_overlap`), and the two warpgroups take
//! turns, so that one's math overlaps the other's instructions.
//!
//! The plan ([`plan`]) also places the operands of dots on the `mma.sync` rule
//! (`dot.rs`, rule 1), so that those too are staged where their values are defined, in
//! the same swizzled tiles (each as its registers run: [`operand_tiles`]), which
//! `ldmatrix` reads and a ring's `cp.async` copies fill.

use std::collections::{BTreeMap, HashMap};

use kfuse_ir::{DType, Kernel, Layout, Op, OpId, ValueId};

use super::{coord, owner, Emitter, Val, R};
use crate::analysis::concrete_shape;
use crate::CodegenError;

/// Where a WGMMA operand lives in shared memory: a `[rows, cols]` tile, `cols` the
/// contiguous extent, cut into atoms of `span / 2` columns (`span` the swizzle width in
/// bytes), each atom `rows` rows of `span` bytes, atoms one after another; within each
/// 1024-byte stretch the 16-byte granules of a row are permuted by the swizzle
/// (`kf_swz`). `row_axis`, `col_axis` and `k_axis` are axes of the staged value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SmemTile {
    /// Byte offset in its area (a multiple of 1024).
    pub off: u32,
    /// Extent along the strided dimension (a multiple of 8).
    pub rows: u32,
    /// Extent along the contiguous dimension.
    pub cols: u32,
    /// Swizzle width in bytes: 128, 64 or 32.
    pub span: u32,
    /// The staged value's axis along the rows.
    pub row_axis: usize,
    /// The staged value's axis along the columns.
    pub col_axis: usize,
    /// The staged value's axis along the dot's k.
    pub k_axis: usize,
    /// In the operand area (`kf_ops`, written where the value is defined), else the
    /// scratch (`kf_smem`, written at the dot).
    pub eager: bool,
    /// A ring of this loop (`operand_ring`): the region holds `WgPlan::stages` tiles,
    /// the current one at stage `kf_st<loop>`.
    pub ring: Option<kfuse_ir::LoopId>,
    /// Bytes of an element: 2 (f16, bf16), 1 (fp8) or 4 (f32 read as TF32).
    pub esize: u32,
}

impl SmemTile {
    /// Bytes of one tile (one stage), a multiple of 1024.
    pub fn bytes(&self) -> u32 {
        (self.rows * self.cols * self.esize).div_ceil(1024) * 1024
    }
    /// The byte offset of element `(r, c)` (C expressions) in the tile.
    pub(super) fn at(&self, r: &str, c: &str) -> String {
        let e = self.esize;
        let per = self.span_elems();
        format!("kf_swz((({c}) / {per}) * {} + ({r}) * {} + (({c}) % {per}) * {e}, {})", self.rows * self.span, self.span, self.span / 16 - 1)
    }
    /// Elements of one row of a swizzle atom (`span` bytes).
    pub fn span_elems(&self) -> u32 {
        self.span / self.esize
    }
    /// The start of the tile (a C pointer expression): in a ring, the current stage's.
    pub(super) fn base(&self) -> String {
        match self.ring {
            Some(l) => format!("(kf_ops + {} + kf_st{} * {})", self.off, l.0, self.bytes()),
            None => format!("({} + {})", if self.eager { "kf_ops" } else { "kf_smem" }, self.off),
        }
    }
    /// The start's shared-memory address (a C expression, [`SmemTile::base`]'s): the
    /// operand area's address taken once (`kf_ops_sa`, `kf_smem_sa`) plus offsets, or
    /// (`taken_once` false: the kernel's later register-room attempts) the pointer's address at this
    /// use. ptxas computes a shared variable's address from the block's rank in its
    /// cluster (`S2UR SR_CgaCtaId`) wherever it is used, once an iteration inside a
    /// loop; the address taken once is a plain register.
    pub(super) fn addr(&self, taken_once: bool) -> String {
        if !taken_once {
            return format!("kf_saddr({})", self.base());
        }
        match self.ring {
            Some(l) => format!("(kf_ops_sa + {} + kf_st{} * {})", self.off, l.0, self.bytes()),
            None => format!("({} + {})", if self.eager { "kf_ops_sa" } else { "kf_smem_sa" }, self.off),
        }
    }
    /// The descriptor's swizzle mode (bits 62–63).
    fn mode(&self) -> u32 {
        match self.span {
            128 => 1,
            64 => 2,
            _ => 3,
        }
    }
}

/// Where A comes from.
#[derive(Clone, Debug)]
pub(super) enum ASrc {
    /// The thread's own registers (A in the result's accumulator layout).
    Regs,
    /// Shared memory, K-major or MN-major ([`WgDot::a_mn`]).
    Smem(SmemTile),
}

/// One dot on the WGMMA rule.
#[derive(Clone, Debug)]
pub(super) struct WgDot {
    pub a: ASrc,
    /// A is MN-major in shared memory (`imm-trans-a = 1`; `ldmatrix.trans`).
    pub a_mn: bool,
    b: SmemTile,
    /// B is MN-major (`imm-trans-b = 1`).
    pub b_mn: bool,
    pub m: u32,
    pub n: u32,
    pub kk: u32,
    /// Warpgroups of the block.
    pub groups: u32,
    pub dtype: DType,
    /// The `mma.sync` rule over these warps instead of WGMMA (its tiles as WGMMA's).
    pub mma: Option<[u32; 2]>,
}

impl WgDot {
    /// A's tile, when A is in shared memory.
    pub(super) fn a_tile(&self) -> Option<&SmemTile> {
        match &self.a {
            ASrc::Smem(t) => Some(t),
            ASrc::Regs => None,
        }
    }
    /// B's tile.
    pub(super) fn b_tile(&self) -> &SmemTile {
        &self.b
    }
}

/// The WGMMA dots of a kernel and the values staged where they are defined.
#[derive(Clone, Debug, Default)]
pub(super) struct WgPlan {
    pub dots: HashMap<OpId, WgDot>,
    /// Values written to the operand area where they are defined, with their tile.
    pub eager: HashMap<ValueId, SmemTile>,
    /// Per loop, its ring loads in op order (`operand_ring`).
    pub rings: BTreeMap<kfuse_ir::LoopId, Vec<ValueId>>,
    /// Casts to 16 bits whose one user is a dot's register A: not written, the pairs
    /// are packed (and rounded) from the cast's f32 operand.
    pub absorbed: std::collections::HashSet<OpId>,
    /// Bytes of the operand area (a multiple of 1024).
    pub bytes: u32,
    /// Tiles a ring's region holds (2; more where a producer warpgroup fills them).
    pub stages: u32,
    /// Some dot reads its operands through the async proxy (WGMMA): generic writes to
    /// the operand area are fenced against it (`fence.proxy.async`, sm_90 only); the
    /// `mma.sync` rule's `ldmatrix` reads are generic.
    pub async_proxy: bool,
}

/// The widest swizzle (bytes) whose span divides a contiguous extent of `cols` elements
/// of `esize` bytes.
fn span_of(cols: u32, esize: u32) -> Option<u32> {
    [128, 64, 32].into_iter().find(|s| (cols * esize).is_multiple_of(*s))
}

/// The dot's WGMMA form, if the rule applies (see the module docs); tiles at offset 0 in
/// the scratch.
fn wg_dot(k: &Kernel, op: OpId) -> Option<WgDot> {
    let Some(Layout::Blocked(have)) = k.schedule.layouts.get(&op.value()) else { return None };
    let want = crate::passes::assign_layouts::one_dot_mma_layout(k, op)?;
    let [wm, wn] = [want.warps_per_block[0], want.warps_per_block[1]];
    if *have != want || wn != 1 || wm % 4 != 0 {
        return None;
    }
    let ops = k.operands(op);
    let (sa, sb) = (concrete_shape(k, k.ty(ops[0])), concrete_shape(k, k.ty(ops[1])));
    let (m, kk, n) = (sa[0], sa[1], sb[1]);
    let dtype = k.ty(ops[0]).dtype;
    // (one instruction reads 32 bytes of k; only 16-bit operands come from registers or
    // lie MN-major)
    let esize = dtype.size_bytes() as u32;
    if n > 256 || m % (16 * wm) != 0 || !(kk * esize).is_multiple_of(32) {
        return None;
    }
    let (a_tile, a_mn, b, b_mn) = operand_tiles(k, &ops, [m, kk, n], esize)?;
    let regs_a = crate::layout::mma_tiles_accumulator(m, kk, [wm, 1]);
    let (a, a_mn) = match k.schedule.layouts.get(&ops[0]) {
        Some(Layout::Blocked(l)) if *l == regs_a && esize == 2 => (ASrc::Regs, false),
        _ => (ASrc::Smem(a_tile), a_mn),
    };
    Some(WgDot { a, a_mn, b, b_mn, m, n, kk, groups: wm / 4, dtype, mma: None })
}

/// The shared-memory tiles of a dot's operands `[m, kk] · [kk, n]` of `esize`-byte
/// elements, `ops` its operands (see the module docs): each MN-major where its
/// registers run along m (A) or n (B) (16-bit operands only), else K-major; and
/// whether each is MN-major. Each in the widest swizzle its contiguous extent takes.
fn operand_tiles(k: &Kernel, ops: &[ValueId], [m, kk, n]: [u32; 3], esize: u32) -> Option<(SmemTile, bool, SmemTile, bool)> {
    let tile = |rows, cols, [row_axis, col_axis, k_axis]: [usize; 3]| span_of(cols, esize).map(|span| SmemTile { off: 0, rows, cols, span, row_axis, col_axis, k_axis, eager: false, ring: None, esize });
    // (the operand's registers run along `axis` first: its MN axis)
    let along = |v: ValueId, axis: u32| matches!(k.schedule.layouts.get(&v), Some(Layout::Blocked(l)) if l.order[0] == axis);
    let (at, a_mn) = match tile(kk, m, [1, 0, 1]).filter(|_| along(ops[0], 0) && m % 8 == 0 && esize == 2) {
        Some(t) => (t, true),
        None => (tile(m, kk, [0, 1, 1])?, false),
    };
    let (bt, b_mn) = match tile(kk, n, [0, 1, 0]).filter(|_| along(ops[1], 1) && n % 8 == 0 && esize == 2) {
        Some(t) => (t, true),
        None => (tile(n, kk, [1, 0, 0])?, false),
    };
    Some((at, a_mn, bt, b_mn))
}

/// The dot's `mma.sync` form (`dot.rs`'s rule 1): its operands in the tiles WGMMA's
/// would take (`ldmatrix` reads them, `.trans` for an MN-major one), so that a ring's
/// copies fill them.
fn mma_dot(k: &Kernel, op: OpId) -> Option<WgDot> {
    let Some(Layout::Blocked(have)) = k.schedule.layouts.get(&op.value()) else { return None };
    let want = crate::passes::assign_layouts::one_dot_mma_layout(k, op)?;
    if *have != want {
        return None;
    }
    let ops = k.operands(op);
    let (sa, sb) = (concrete_shape(k, k.ty(ops[0])), concrete_shape(k, k.ty(ops[1])));
    let (m, kk, n) = (sa[0], sa[1], sb[1]);
    let dtype = k.ty(ops[0]).dtype;
    if dtype.size_bytes() != 2 {
        return None;
    }
    let (a, a_mn, b, b_mn) = operand_tiles(k, &ops, [m, kk, n], 2)?;
    Some(WgDot { a: ASrc::Smem(a), a_mn, b, b_mn, m, n, kk, groups: 0, dtype, mma: Some([want.warps_per_block[0], want.warps_per_block[1]]) })
}

/// The value an operand is a transpose chain of, and per operand axis the axis of that
/// value.
fn root(k: &Kernel, x: ValueId) -> (ValueId, [usize; 2]) {
    let (mut v, mut map) = (x, [0usize, 1]);
    while let Op::Permute { perm } = k.op(v.op()) {
        map = [perm[map[0]] as usize, perm[map[1]] as usize];
        v = k.operands(v.op())[0];
    }
    (v, map)
}

/// The tile of operand slot `t` (axes of the operand) in the axes of its root.
fn in_root(t: &SmemTile, map: [usize; 2]) -> SmemTile {
    SmemTile { row_axis: map[t.row_axis], col_axis: map[t.col_axis], k_axis: map[t.k_axis], ..t.clone() }
}

/// Whether every use of `v` (through transposes) is a shared-memory operand slot of a
/// WGMMA dot, each asking for the tile `want` (in `v`'s axes).
fn only_slots(k: &Kernel, dots: &HashMap<OpId, WgDot>, v: ValueId, want: &SmemTile) -> bool {
    k.users(v).iter().all(|&u| match k.op(u) {
        Op::Permute { .. } => only_slots(k, dots, u.value(), want),
        Op::Dot { .. } => {
            let Some(d) = dots.get(&u) else { return false };
            k.operands(u).iter().enumerate().all(|(slot, &o)| {
                let (r, map) = root(k, o);
                if r != root(k, v).0 {
                    return true;
                }
                let t = match (slot, &d.a) {
                    (0, ASrc::Smem(t)) => t,
                    (0, ASrc::Regs) => return false,
                    _ => &d.b,
                };
                in_root(t, map) == *want
            })
        }
        _ => false,
    })
}

/// The kernel's WGMMA dots, their operand tiles placed (see the module docs): first
/// which roots are staged where they are defined, then which of those loads a ring
/// takes, then the offsets (a ring's region holds `stages` tiles).
/// Without `rings`, no load takes a ring (each is staged where it is defined).
/// `wgmma`: the target has WGMMA; elsewhere only the `mma.sync` rule's dots are planned.
pub(super) fn plan(k: &Kernel, spec: &crate::target::Spec, rings: bool, wgmma: bool, stages: u32) -> WgPlan {
    let mut p = WgPlan { stages, ..WgPlan::default() };
    for op in k.ops() {
        if matches!(k.op(op), Op::Dot { .. }) {
            if let Some(d) = wg_dot(k, op).filter(|_| wgmma).or_else(|| mma_dot(k, op)) {
                p.dots.insert(op, d);
            }
        }
    }
    let mut order: Vec<OpId> = p.dots.keys().copied().collect();
    order.sort_by_key(|o| k.order.iter().position(|x| x == o));
    let mut roots: Vec<ValueId> = Vec::new();
    for &op in &order {
        for slot in 0..2 {
            let d = &p.dots[&op];
            let t = match (slot, &d.a) {
                (0, ASrc::Smem(t)) => t,
                (0, ASrc::Regs) => continue,
                _ => &d.b,
            };
            let (r, map) = root(k, k.operands(op)[slot]);
            let want = in_root(t, map);
            let defined = !matches!(k.op(r.op()), Op::LoopCarried { .. } | Op::LoopResult { .. } | Op::For { .. });
            if !p.eager.contains_key(&r) && defined && k.schedule.layouts.contains_key(&r) && only_slots(k, &p.dots, r, &want) {
                p.eager.insert(r, SmemTile { eager: true, ..want });
                roots.push(r);
            }
        }
    }
    for &op in &order {
        let a = k.operands(op)[0];
        if !matches!(p.dots[&op].a, ASrc::Regs) || k.users(a).len() != 1 {
            continue;
        }
        if let Op::Cast { .. } = k.op(a.op()) {
            let x = k.operands(a.op())[0];
            if k.ty(x).dtype == DType::F32 && k.schedule.layouts.get(&x) == k.schedule.layouts.get(&a) {
                p.absorbed.insert(a.op());
            }
        }
    }
    let loops = super::operand_ring::enclosing_loops(k);
    let ringable: Vec<ValueId> = roots.iter().copied().filter(|_| rings).collect();
    p.async_proxy = p.dots.values().any(|d| d.mma.is_none());
    for &r in &ringable {
        if let Some(l) = super::operand_ring::ring_load(k, spec, &loops, r, &p.eager[&r]) {
            p.eager.get_mut(&r).unwrap().ring = Some(l);
            p.rings.entry(l).or_default().push(r);
        }
    }
    // tiles staged once first; then the rings, which loops that do not nest share: one
    // loop's ring is dead before the next loop's prologue (a barrier) fills its own
    for &r in &roots {
        let t = p.eager.get_mut(&r).unwrap();
        if t.ring.is_none() {
            t.off = p.bytes;
            p.bytes += t.bytes();
        }
    }
    let ring_loops: Vec<kfuse_ir::LoopId> = p.rings.keys().copied().collect();
    let nested = ring_loops.iter().any(|&a| ring_loops.iter().any(|&b| a != b && k.loop_info(b).is_some_and(|i| super::operand_ring::inside(k, &loops, i.for_op.value(), a))));
    let base = p.bytes;
    for l in ring_loops {
        let mut off = if nested { p.bytes } else { base };
        for r in p.rings[&l].clone() {
            let t = p.eager.get_mut(&r).unwrap();
            t.off = off;
            off += stages * t.bytes();
        }
        p.bytes = p.bytes.max(off);
    }
    for &op in &order {
        let mut d = p.dots[&op].clone();
        let mut scratch = 0;
        for slot in 0..2 {
            let t = match (slot, &mut d.a) {
                (0, ASrc::Smem(t)) => t,
                (0, ASrc::Regs) => continue,
                _ => &mut d.b,
            };
            let (r, _) = root(k, k.operands(op)[slot]);
            match p.eager.get(&r) {
                Some(e) => *t = SmemTile { off: e.off, eager: true, ring: e.ring, ..t.clone() },
                None => {
                    t.off = scratch;
                    scratch += t.bytes();
                }
            }
        }
        p.dots.insert(op, d);
    }
    p
}

/// The C name of a WGMMA helper and its text: `m64n{n}k{32 bytes}`, A from a descriptor
/// (`ss`) or four registers (`rs`, 16-bit only), B's transpose immediate (16-bit only:
/// 8-bit and TF32 operands have none). f32 operands are read as TF32.
pub(super) fn instr_fn(d: &WgDot, rs: bool) -> Result<(String, String), CodegenError> {
    let ty = match d.dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F8E4M3 => "e4m3",
        DType::F8E5M2 => "e5m2",
        DType::F32 => "tf32",
        t => return Err(CodegenError::Unsupported(format!("WGMMA of {t} operands"))),
    };
    let wide = d.dtype.size_bytes() == 2;
    if !wide && (rs || d.a_mn || d.b_mn) {
        return Err(CodegenError::Unsupported(format!("WGMMA of {} operands from registers or MN-major", d.dtype)));
    }
    let kk = 32 / d.dtype.size_bytes();
    let n = d.n;
    let name = format!("kf_wg_{}_{ty}_n{n}_t{}{}", if rs { "rs" } else { "ss" }, d.b_mn as u32, if d.a_mn { "_ta" } else { "" });
    let regs = n / 2;
    let list: Vec<String> = (0..regs).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..regs).map(|i| format!("\"+f\"(d[{i}])")).collect();
    let (params, a, ins, imm) = if rs {
        let a = format!("{{%{}, %{}, %{}, %{}}}", regs, regs + 1, regs + 2, regs + 3);
        ("unsigned a0, unsigned a1, unsigned a2, unsigned a3", a, "\"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"l\"(db)".to_string(), format!(", {}", d.b_mn as u32))
    } else {
        ("unsigned long long da", format!("%{regs}"), "\"l\"(da), \"l\"(db)".to_string(), if wide { format!(", {}, {}", d.a_mn as u32, d.b_mn as u32) } else { String::new() })
    };
    let b = if rs { regs + 4 } else { regs + 1 };
    let text = format!(
        "static __device__ __forceinline__ void {name}(float* d, {params}, unsigned long long db) {{\n  asm volatile(\"wgmma.mma_async.sync.aligned.m64n{n}k{kk}.f32.{ty}.{ty} {{{}}}, {a}, %{b}, 1, 1, 1{imm};\"\n    : {}\n    : {ins});\n}}\n",
        list.join(", "),
        outs.join(", ")
    );
    Ok((name, text))
}

/// Helpers every kernel with a WGMMA dot carries: the shared address, the swizzled byte
/// offset, a descriptor, the pair packing, the fences.
pub(super) const WG_DOT_PRELUDE: &str = r#"static __device__ __forceinline__ unsigned kf_saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ unsigned kf_saddr_once(const void* p) { unsigned a; asm volatile("mov.u32 %0, %1;" : "=r"(a) : "r"(kf_saddr(p))); return a; }
static __device__ __forceinline__ unsigned kf_swz(unsigned o, unsigned mask) { return o ^ (((o >> 7) & mask) << 4); }
static __device__ __forceinline__ unsigned long long kf_wdesc(unsigned a, unsigned lbo, unsigned sbo, unsigned mode) {
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16)
       | ((unsigned long long)(sbo >> 4) << 32) | ((unsigned long long)mode << 62);
}
static __device__ __forceinline__ unsigned kf_pk_bf16(float lo, float hi) { unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
static __device__ __forceinline__ unsigned kf_pk_f16(float lo, float hi) { unsigned r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }
static __device__ __forceinline__ void kf_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void kf_wg_commit_wait() { asm volatile("wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;" ::: "memory"); }
static __device__ __forceinline__ void kf_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void kf_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
static __device__ __forceinline__ void kf_wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
static __device__ __forceinline__ void kf_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
"#;

impl Emitter<'_> {
    /// Writes value `v` to its operand-area tile when the plan stages it where it is
    /// defined (called after each op).
    pub(super) fn stage_eager(&mut self, v: ValueId) -> R {
        let Some(t) = self.wg.as_ref().and_then(|p| p.eager.get(&v)).filter(|t| t.ring.is_none()).cloned() else { return Ok(()) };
        self.stage_tile(v, &t)
    }

    /// A cast the plan absorbs into its dot's packing: its value reads its operand's
    /// registers.
    pub(super) fn absorbed_cast(&mut self, op: OpId) -> Option<R> {
        if !self.wg.as_ref()?.absorbed.contains(&op) {
            return None;
        }
        let x = self.k.operands(op)[0];
        let dtype = self.k.ty(op.value()).dtype;
        let val = Val { dtype, ..self.val(x).clone() };
        self.vals.insert(op.value(), val);
        Some(Ok(()))
    }

    /// The dot's WGMMA form, if the plan has one.
    pub(super) fn wg_rule(&self, op: OpId) -> Option<WgDot> {
        self.wg.as_ref()?.dots.get(&op).cloned()
    }

    /// Writes the registers of `x` into tile `t` (see the module docs), `dtype`'s 16-bit
    /// pattern, lanes outside `x`'s valid range along `t.k_axis` as 0.
    fn stage_tile(&mut self, x: ValueId, t: &SmemTile) -> R {
        let val = self.val(x).clone();
        if t.esize != 2 {
            return Err(CodegenError::Unsupported(format!("a {} operand of a warpgroup `dot` written from registers (8-bit and TF32 operands reach shared memory only by a ring's copies)", val.dtype)));
        }
        let map = val.map.clone().ok_or_else(|| CodegenError::Unsupported("a `dot` operand that is a scalar".into()))?;
        let (Some(rm), Some(cm)) = (val.axis_map[t.row_axis], val.axis_map[t.col_axis]) else {
            return Err(CodegenError::Unsupported("a `dot` operand with a kept extent-1 axis".into()));
        };
        let f = &map.axes[cm];
        let w = if f.e_stride == 1 && f.elem_step == 1 && f.spt > 1 { f.spt.min(8) } else { 1 };
        let w = if f.piece % w == 0 { w } else { 1 };
        let (klo, khi) = (val.lo[t.k_axis].clone(), val.hi[t.k_axis].clone());
        let pk = if val.dtype == DType::F16 { "kf_pk_f16" } else { "kf_pk_bf16" };
        // a region's last readers (earlier instructions, any warpgroup) are done before
        // it is written again; the scratch's other users are too
        if !self.wg_synced || !t.eager {
            self.line(self.barrier)?;
            self.wg_synced = true;
        }
        self.open("")?;
        // the bounds lie in [0, extent]: compared in 32 bits, and only where they mask
        let (blo, bhi) = (self.fresh("kf_slo"), self.fresh("kf_shi"));
        let kext = val.shape[t.k_axis].to_string();
        if klo != "0" {
            self.line(format!("const int {blo} = (int)({klo});"))?;
        }
        if khi != kext {
            self.line(format!("const int {bhi} = (int)({khi});"))?;
        }
        self.line("#pragma unroll")?;
        self.open(format!("for (int k = 0; k < {}; k += {w})", map.regs))?;
        self.line(format!("const int r = {}, c = {};", coord(&map, rm, "k"), coord(&map, cm, "k")))?;
        let own = owner(&map, "k");
        if own != "true" {
            self.open(format!("if ({own})"))?;
        }
        let elem = |e: &Self, i: u32| -> String {
            let kc = if t.k_axis == t.col_axis { format!("c + {i}") } else { "r".to_string() };
            let mut inside = Vec::new();
            if klo != "0" {
                inside.push(format!("{kc} >= {blo}"));
            }
            if khi != kext {
                inside.push(format!("{kc} < {bhi}"));
            }
            let r = e.reg(x, &format!("k + {i}"));
            if inside.is_empty() { r } else { format!("({} ? {r} : 0.0f)", inside.join(" && ")) }
        };
        let at = t.at("r", "c");
        let dst = t.base();
        if w == 1 {
            let v = super::from_reg(val.dtype, &elem(self, 0));
            self.line(format!("*reinterpret_cast<kf_u16*>({dst} + {at}) = {v};"))?;
        } else {
            let words: Vec<String> = (0..w / 2).map(|i| format!("{pk}({}, {})", elem(self, 2 * i), elem(self, 2 * i + 1))).collect();
            let store = match w {
                2 => format!("*reinterpret_cast<unsigned*>({dst} + {at}) = {};", words[0]),
                4 => format!("*reinterpret_cast<uint2*>({dst} + {at}) = make_uint2({});", words.join(", ")),
                _ => format!("*reinterpret_cast<uint4*>({dst} + {at}) = make_uint4({});", words.join(", ")),
            };
            self.line(store)?;
        }
        if own != "true" {
            self.close()?;
        }
        self.close()?;
        if self.wg.as_ref().is_some_and(|p| p.async_proxy) {
            self.line("kf_proxy_fence();")?;
        }
        self.wg_dirty = true;
        self.wg_staged = true;
        self.close()
    }

    /// Rule: the dot on WGMMA (see the module docs).
    pub(super) fn dot_wgmma(&mut self, op: OpId, a: ValueId, b: ValueId, d: WgDot) -> R {
        let v = op.value();
        let (av, bv) = (self.val(a).clone(), self.val(b).clone());
        let layout = self.layout(v)?;
        let val = self.new_tile(v, DType::F32, &layout, vec![av.lo[0].clone(), bv.lo[1].clone()], vec![av.hi[0].clone(), bv.hi[1].clone()], None)?;
        let name = val.name.clone();
        let regs = val.map.as_ref().unwrap().regs;
        self.vals.insert(v, val);
        let rs = matches!(d.a, ASrc::Regs);
        let note = self.wg_note(op, &d);
        self.dot_notes.push(note);
        let (fname, text) = instr_fn(&d, rs)?;
        self.helpers.insert(fname.clone(), text);
        self.open("")?;
        // operands not staged where they were defined go to the scratch now
        let mut scratch = 0;
        for (x, t) in [(a, match &d.a { ASrc::Smem(t) => Some(t), ASrc::Regs => None }), (b, Some(&d.b))] {
            if let Some(t) = t.filter(|t| !t.eager) {
                scratch = scratch.max(t.off + t.bytes());
                self.stage_tile(x, t)?;
            }
        }
        self.scratch(scratch);
        // every thread's copies are done before the instructions read them (none since
        // the last barrier: a ring's, which its waits end with)
        if self.wg_dirty {
            self.line(self.barrier)?;
            self.wg_dirty = false;
            self.wg_staged = false;
        }
        // A from registers: packed before the fence, so no instruction writes a
        // register of the chain between its instructions (ptxas waits there)
        let packed = match &d.a {
            ASrc::Regs => self.mask_k(a, &av, &bv, d.dtype)?,
            ASrc::Smem(_) => String::new(),
        };
        // the instructions add to the accumulator: start it at the one addend (`acc *
        // alpha + dot(p, v)`), or at 0
        self.unroll("k", regs)?;
        let init = self.accumulate_onto(op);
        self.line(format!("{name}[k] = {init};"))?;
        self.close()?;
        if let Some((l, _)) = self.late_dot_of(op) {
            // issued in the next iteration (`dot_overlap`)
            self.defer_issue(l, &d, &packed)?;
            self.wg_synced = false;
            return self.close();
        }
        // (a split ring's second group: its copies have landed)
        self.second_group_wait(op)?;
        self.line("kf_wg_fence();")?;
        self.line("const int kf_wg = kf_warp / 4;")?;
        self.turn_before(op)?;
        self.issue(&d, &fname, &name, &packed)?;
        if self.ws.is_some() {
            self.line("kf_wg_commit();")?;
            self.late_after_first(op)?;
            self.turn_after(op)?;
            self.ws_dot_wait(op)?;
        } else if self.pending_fetch.is_some() {
            // (a ring's next copies while the instructions run)
            self.line("kf_wg_commit();")?;
            self.take_pending_fetch()?;
            self.line("kf_wg_wait();")?;
        } else {
            self.line("kf_wg_commit_wait();")?;
        }
        self.wg_synced = false;
        self.close()
    }

    /// How a staged operand tile gets its data, for the plan: a ring's copies, written
    /// where its value is defined, or at the dot.
    pub(super) fn staged_when(&self, t: &SmemTile) -> String {
        let stages = self.wg.as_ref().map_or(2, |p| p.stages);
        match (t.ring, t.eager) {
            (Some(_), _) if self.ws.is_some() => {
                let two = self.ws.as_ref().is_some_and(|ws| ws.producers != super::warp_specialize::PRODUCER_THREADS);
                format!("copied by the producer warpgroup{} into a {stages}-stage ring", if two { "s" } else { "" })
            }
            (Some(l), _) => {
                let nest = self.nest_of(l);
                let across = if nest.len() > 1 { format!(", across loops {} as one", nest.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")) } else { String::new() };
                format!("copied by cp.async into a {stages}-stage ring {} step(s) ahead{across}", stages - 1)
            }
            (None, true) => "written where it is defined".to_string(),
            (None, false) => "written at the dot".to_string(),
        }
    }

    /// The plan's line for a WGMMA dot: the instruction and where each operand comes
    /// from.
    fn wg_note(&self, op: OpId, d: &WgDot) -> String {
        let smem = |t: &SmemTile, major: &str| format!("shared memory ({major}, {}-byte swizzle, {})", t.span, self.staged_when(t));
        let a = match &d.a {
            ASrc::Regs => "registers (the accumulator layout)".to_string(),
            ASrc::Smem(t) => smem(t, if d.a_mn { "MN-major" } else { "K-major" }),
        };
        let b = smem(&d.b, if d.b_mn { "MN-major" } else { "K-major" });
        let onto = if self.addend(op).is_some() { ", accumulating onto its addend" } else { "" };
        // (k16 says 16-bit operands; the others are named)
        let ty = match d.dtype {
            DType::F32 => " (f32 operands read as TF32)".to_string(),
            t if t.size_bytes() == 1 => format!(" ({t} operands)"),
            _ => String::new(),
        };
        format!("{}: wgmma m64n{}k{} over {} warpgroup(s){ty}{onto}; A from {a}; B from {b}", dot_label(self.k, op), d.n, 32 / d.dtype.size_bytes(), d.groups)
    }

    /// A's registers for the register-A instructions, packed in pairs into a new array
    /// of 32-bit words (its name returned). Lanes outside the valid k range (the
    /// intersection of `a`'s columns and `b`'s rows) are 0, zeroed under one branch on
    /// the block-uniform bounds that only a partial tile takes: a whole tile packs its
    /// registers as they are (a compare and a select per register before, 128 of flash
    /// attention's instructions a tile). A lane outside the range may hold inf or NaN
    /// while the other operand's row there is 0.
    fn mask_k(&mut self, a: ValueId, av: &Val, bv: &Val, dtype: DType) -> Result<String, CodegenError> {
        let amap = av.map.clone().ok_or_else(|| CodegenError::Unsupported("a `dot` operand that is a scalar".into()))?;
        let name = self.fresh("kf_pa");
        self.line(format!("float {name}[{}];", amap.regs))?;
        self.unroll("k", amap.regs)?;
        self.line(format!("{name}[k] = {};", self.reg(a, "k")))?;
        self.close()?;
        let kext = av.shape[1];
        let mut whole = Vec::new();
        let mut outside = Vec::new();
        let c = coord(&amap, av.axis_map[1].unwrap_or(1), "k");
        let (klo, khi) = (self.fresh("kf_klo"), self.fresh("kf_khi"));
        let los: Vec<&String> = [&av.lo[1], &bv.lo[0]].into_iter().filter(|l| l.as_str() != "0").collect();
        let his: Vec<&String> = [&av.hi[1], &bv.hi[0]].into_iter().filter(|h| h.as_str() != kext.to_string()).collect();
        if !los.is_empty() || !his.is_empty() {
            self.open("")?;
        if !los.is_empty() {
            let lo = los.iter().fold("0LL".to_string(), |acc, l| format!("kf_maxi({acc}, {l})"));
            self.line(format!("const int {klo} = (int)({lo});"))?;
            whole.push(format!("{klo} <= 0"));
            outside.push(format!("({c}) < {klo}"));
        }
        if !his.is_empty() {
            let hi = his.iter().fold(format!("{kext}LL"), |acc, h| format!("kf_mini({acc}, {h})"));
            self.line(format!("const int {khi} = (int)({hi});"))?;
            whole.push(format!("{khi} >= {kext}"));
            outside.push(format!("({c}) >= {khi}"));
        }
            self.open(format!("if (!({}))", whole.join(" && ")))?;
            self.unroll("k", amap.regs)?;
            self.line(format!("if ({}) {name}[k] = 0.0f;", outside.join(" || ")))?;
            self.close()?;
            self.close()?;
            self.close()?;
        }
        let pk = if dtype == DType::F16 { "kf_pk_f16" } else { "kf_pk_bf16" };
        let words = self.fresh("kf_pw");
        self.line(format!("unsigned {words}[{}];", amap.regs / 2))?;
        self.unroll("k", amap.regs / 2)?;
        self.line(format!("{words}[k] = {pk}({name}[2 * k], {name}[2 * k + 1]);"))?;
        self.close()?;
        Ok(words)
    }

    /// The instructions of every rep and k step; A from the packed words `pa` (see
    /// `mask_k`), or from its shared-memory tile.
    fn issue(&mut self, d: &WgDot, fname: &str, name: &str, pa: &str) -> R {
        // each descriptor is built once, at the tile's first k step; a step adds its
        // byte offset (a multiple of 16, the address field's unit) to the address field
        let bd = self.fresh("kf_bd");
        let (b_base, _) = self.b_desc(d);
        self.line(format!("const unsigned long long {bd} = {b_base};"))?;
        self.issue_from(d, fname, name, pa, &bd)
    }

    /// The instructions as [`Self::issue`] writes them, B's descriptor at k step 0 in
    /// the variable `bd`.
    pub(super) fn issue_from(&mut self, d: &WgDot, fname: &str, name: &str, pa: &str, bd: &str) -> R {
        let (_, b_off) = self.b_desc(d);
        let b_desc = format!("{bd} + (unsigned long long)(({b_off}) >> 4)");
        let ad = self.fresh("kf_ad");
        // (MN-major: 64 rows of m are `64 / span_elems` swizzle atoms, each `rows`
        // k rows of `span` bytes; LBO atom to atom, SBO 8 k rows, a step 16 k rows)
        let a_rows = |t: &SmemTile, x: u32| x * (64 / t.span_elems()) * t.rows * t.span;
        if let ASrc::Smem(t) = &d.a {
            let (base, lbo) = match d.a_mn {
                true => (format!("{} + kf_wg * {}", t.addr(self.addresses_once), a_rows(t, 1)), t.rows * t.span),
                false => (format!("{} + 64 * kf_wg * {}", t.addr(self.addresses_once), t.span), 16),
            };
            self.line(format!("const unsigned long long {ad} = kf_wdesc({base}, {lbo}, {}, {});", 8 * t.span, t.mode()))?;
        }
        let reps = d.m / (64 * d.groups);
        self.unroll("i", reps)?;
        self.unroll("s", d.kk * d.dtype.size_bytes() as u32 / 32)?;
        let acc = format!("&{name}[i * {}]", d.n / 2);
        match &d.a {
            ASrc::Regs => {
                // A's registers of k step s: 8 s .. 8 s + 7 of the rep's n/2 (LAYOUTS §4.4),
                // words 4 s .. 4 s + 3
                let words: Vec<String> = (0..4).map(|q| format!("{pa}[i * {} + 4 * s + {q}]", d.kk / 4)).collect();
                self.line(format!("{fname}({acc}, {}, {b_desc});", words.join(", ")))?;
            }
            ASrc::Smem(t) => {
                let a_off = if d.a_mn {
                    format!("s * {} + i * {}", 16 * t.span, a_rows(t, d.groups))
                } else {
                    format!("((s * 32) / {}) * {} + 64 * {} * i * {} + (s * 32) % {}", t.span, t.rows * t.span, d.groups, t.span, t.span)
                };
                self.line(format!("{fname}({acc}, {ad} + (unsigned long long)(({a_off}) >> 4), {b_desc});"))?;
            }
        }
        self.close()?;
        self.close()
    }

    /// The add the dot's result feeds alone, and its other operand, when that operand
    /// is an f32 tile of the result's layout written before the dot: the instructions
    /// accumulate onto it, and the add is the dot's own registers ([`Self::fused_add`]).
    fn addend(&self, op: OpId) -> Option<(OpId, ValueId)> {
        let k = self.k;
        let v = op.value();
        let users = k.users(v);
        let [u] = users.as_slice() else { return None };
        if !matches!(k.op(*u), Op::Binary(kfuse_ir::BinaryOp::Add)) {
            return None;
        }
        let o = k.operands(*u);
        let x = if o[0] == v { o[1] } else { o[0] };
        let pos = |id: OpId| k.order.iter().position(|&y| y == id);
        let same = k.schedule.layouts.get(&x) == k.schedule.layouts.get(&v) && k.ty(x).dtype == DType::F32 && k.ty(x).shape == k.ty(v).shape;
        (x != v && same && self.vals.contains_key(&x) && pos(x.op()) < pos(op)).then_some((*u, x))
    }

    /// The start of a dot's accumulator, register `k`: its one addend's (whose add then
    /// is the dot's registers), or 0. Every rule accumulates onto it (`d = a·b + d`).
    pub(super) fn accumulate_onto(&mut self, op: OpId) -> String {
        match self.addend(op) {
            Some((u, x)) => {
                self.fused_adds.insert(u, op.value());
                self.reg(x, "k")
            }
            None => "0.0f".into(),
        }
    }

    /// An add that a dot accumulated (`addend`): its value is the dot's registers, valid
    /// where both operands are.
    pub(super) fn fused_add(&mut self, u: OpId) -> Option<R> {
        let d = *self.fused_adds.get(&u)?;
        let o = self.k.operands(u);
        let x = if o[0] == d { o[1] } else { o[0] };
        let (dv, xv) = (self.val(d).clone(), self.val(x).clone());
        let meet = |f: &str, a: &String, b: &String| if a == b { a.clone() } else { format!("{f}({a}, {b})") };
        let lo = dv.lo.iter().zip(&xv.lo).map(|(a, b)| meet("kf_maxi", a, b)).collect();
        let hi = dv.hi.iter().zip(&xv.hi).map(|(a, b)| meet("kf_mini", a, b)).collect();
        self.vals.insert(u.value(), Val { lo, hi, ..dv });
        Some(Ok(()))
    }

    /// B's descriptor at k step 0 and the byte offset of step `s` (C expressions).
    pub(super) fn b_desc(&self, d: &WgDot) -> (String, String) {
        let t = &d.b;
        if d.b_mn {
            // 16 k rows a step; LBO: atom to atom along n; SBO: 8 k rows
            (format!("kf_wdesc({}, {}, {}, {})", t.addr(self.addresses_once), t.rows * t.span, 8 * t.span, t.mode()), format!("s * {}", 16 * t.span))
        } else {
            (format!("kf_wdesc({}, 16, {}, {})", t.addr(self.addresses_once), 8 * t.span, t.mode()), format!("((s * 32) / {}) * {} + (s * 32) % {}", t.span, t.rows * t.span, t.span))
        }
    }
}

/// A dot as the plan names it: `dot` and its source line, or its value's name.
pub(super) fn dot_label(k: &Kernel, op: OpId) -> String {
    match k.locs.get(&op) {
        Some(l) => format!("`dot` at line {}", l.line),
        None => format!("`dot` {}", op.value()),
    }
}

/// The helpers' texts in name order (deterministic output).
pub(super) fn helper_texts(h: &BTreeMap<String, String>) -> String {
    h.values().cloned().collect()
}

//! A store of a register tile through shared memory and TMA bulk stores (sm_90a): the
//! whole tile is written into swizzled shared memory (accumulator fragments by
//! `stmatrix`) and sent out one 128-byte-wide box a bulk store, where
//! [`general_stores`] finds a store that can. A tile whose valid range is its extents
//! (known when the kernel is written) and that the tensor holds whole wherever the
//! store runs goes by TMA alone; any other checks at run time that its valid range is
//! the tensor's part of the tile, and is stored as the op is where it is not. The
//! tile's shared memory follows the operand area, or, where that has no room, is an
//! operand tile whose readers are done ([`dead_staged_tile`]).

use super::*;
use crate::passes::select_mma_path::{tma_obstacle, tma_order};

/// Where an epilogue tile leaves by TMA: its shared memory (`c_base` bytes from `base`,
/// the dynamic shared memory's aligned start, whose shared-space address `saddr` — the
/// name of the prelude's function — gives), its boxes (`inner` columns, `box_bytes`
/// each; the whole tile goes through shared memory at once), the output's tensor map
/// and the thread that issues the bulk stores.
pub(super) struct TmaOut<'s> {
    pub base: &'s str,
    pub saddr: &'s str,
    pub c_base: &'s str,
    pub inner: u32,
    pub box_bytes: u32,
    pub map_name: &'s str,
    pub lead: &'s str,
}

/// A store the general lowering sends out by TMA ([`general_stores`]): its tensor map
/// (`kf_stm<map>`, the parameter) and its boxes (`inner` columns, `box_bytes` each); the
/// whole tile goes through shared memory at once.
#[derive(Clone, Debug)]
pub(super) struct StoreTma {
    pub map: usize,
    pub param: KernelParam,
    pub inner: u32,
    pub box_bytes: u32,
}

/// The stores of a warp-specialized kernel that leave by TMA, and the bytes of shared
/// memory they go through: one area, which store after store reuses (each waits until
/// the bulk stores before it have read it). A store can when it stands outside every
/// loop, is unmasked and writes a rank-2 f16/bf16 tile of at most 256 rows whose
/// columns are whole 128-byte boxes, to a tensor of at most 5 dimensions (the others
/// indexed: a batch) that the spec's facts let TMA write with the tile's columns along
/// its unit-stride last dimension, and where the whole tile fits in the `room` bytes of
/// shared memory left.
pub(super) fn general_stores(k: &Kernel, spec: &Spec, room: u32) -> (BTreeMap<OpId, StoreTma>, u32) {
    let mut out = BTreeMap::new();
    let mut area = 0;
    for op in k.ops() {
        match k.op(op) {
            Op::Store { tensor, dims } if k.loop_of(op).is_none() && k.store_mask(op).is_none() && (2..=5).contains(&dims.len()) => {
                let dtype = k.param(*tensor).dtype;
                let tiles: Vec<usize> = (0..dims.len()).filter(|&d| matches!(dims[d], AccessDim::Tile(_))).collect();
                let ext: Vec<u32> = tiles.iter().map(|&d| if let AccessDim::Tile(e) = dims[d] { extent_value(k, e) } else { 0 }).collect();
                let esz = dtype.size_bytes() as u32;
                let (&[rows, cols], &[row_dim, col_dim]) = (ext.as_slice(), tiles.as_slice()) else { continue };
                let last = dims.len() - 1;
                let inner = 128 / esz;
                let Some(order) = tma_order(k, spec, op) else { continue };
                let fits = matches!(dtype, DType::F16 | DType::BF16)
                    && (8..=256).contains(&rows)
                    && rows.is_multiple_of(8)
                    && cols.is_multiple_of(inner)
                    && col_dim == last
                    && order[0] as usize == last
                    && tma_obstacle(k, spec, op).is_none();
                if !fits {
                    continue;
                }
                let whole = rows * cols * esz;
                if whole > room {
                    continue;
                }
                area = area.max(whole);
                let box_dims = (0..dims.len()).map(|d| if d == col_dim { inner } else if d == row_dim { rows } else { 1 }).collect();
                let param = KernelParam::TensorMap { tensor: *tensor, box_dims, swizzle: 128, order };
                out.insert(op, StoreTma { map: out.len(), param, inner, box_bytes: rows * inner * esz });
            }
            _ => {}
        }
    }
    (out, area)
}

/// Where the stores `stores` (whose shared memory takes `bytes`) may go through a tile
/// of the operand area instead of an area of their own, where none fits after it: a
/// tile written where it is defined (not a ring's: flash attention's Q), on a swizzle
/// pattern's repeat, of at least `bytes`, all of whose readers come before the first of
/// the stores, so that its bytes are dead there (the consumers wait for their `wgmma`
/// and meet before writing them: [`Emitter::store_by_tma`], `store_whole_tile`). Its
/// offset in the operand area and its value; the lowest offset where several could.
pub(super) fn dead_staged_tile(k: &Kernel, plan: &super::dot_wgmma::WgPlan, stores: &BTreeMap<OpId, StoreTma>, bytes: u32) -> Option<(u32, ValueId)> {
    let first = stores.keys().map(|&op| k.position(op)).min()?;
    plan.eager
        .iter()
        .filter(|(v, t)| t.ring.is_none() && t.off.is_multiple_of(1024) && t.bytes() >= bytes && k.users(**v).iter().all(|&u| k.position(u) < first))
        .map(|(v, t)| (t.off, *v))
        .min()
}

/// Whether a warp-specialized kernel's stores may go through a dead operand tile
/// ([`dead_staged_tile`]) where no area of their own fits: not in a walk over programs
/// (the next program writes the tile again), and not where a loop issues a dot late
/// (`dot_overlap`). The latter is measured, not derived (H200, NOTES a34):
/// `kfuse::ops::attention` at D256 (no late dot) ran 1–4% faster through Q's tile; at
/// D128 (late `P·V`, three loops) its loops compiled to the same 852 instructions in
/// another order and ran 2.7% slower at S16384 (within that build, the TMA store was 2%
/// faster at S4096 than the registers' stores forced at run time: the store gains, the
/// loop's schedule lost), while the proof kernel of `tests/kernels/flash_attention.rs`
/// (late `P·V`, two loops) ran 4–10% faster.
pub(super) fn reuses_dead_tiles(ws: &super::warp_specialize::WsPlan) -> bool {
    ws.late.is_empty() && !ws.persistent
}

/// The thread that issues a general-lowering kernel's bulk stores: the first consumer.
const GENERAL_LEAD: &str = "kf_tid == 0";

/// Whether a stored register tile lies as [`Emitter::tma_store`] writes it into shared
/// memory: rank 2, its axes in order, pairs of neighbouring columns in each thread.
fn pairs_along_rows(val: &Val) -> bool {
    val.map.as_ref().is_some_and(|map| map.axes.len() == 2 && val.axis_map == [Some(0), Some(1)] && map.axes[1].elem_step == 1 && map.axes[1].spt % 2 == 0)
}

/// The first register of pair `p` (a C expression) of a tile whose column element
/// digit has register stride `e1`: pairs are registers `k0` and `k0 + e1`.
fn pair_reg(e1: u32, p: &str) -> String {
    if e1 == 1 { format!("2 * ({p})") } else { format!("(({p}) / {e1}) * {} + ({p}) % {e1}", 2 * e1) }
}

/// [`pair_reg`] as a number.
fn pair_first(e1: u32, p: u32) -> u32 {
    (p / e1) * 2 * e1 + p % e1
}

/// The byte offset of element `(row, col)` in the output tile's shared memory: boxes of
/// `inner` columns `box_bytes` apart, 128-byte rows, 16-byte chunk `j` of row `r` at
/// chunk `j ^ (r % 8)` (what [`Emitter::pair_to_box`] and
/// [`Emitter::matrices_to_boxes`] print).
fn swizzled(row: u32, col: u32, inner: u32, box_bytes: u32, esz: u32) -> u32 {
    let cb = (col % inner) * esz;
    (col / inner) * box_bytes + row * 128 + ((((cb >> 4) ^ (row & 7)) << 4) | (cb & 15))
}

/// Whether a stored tile's registers are 8 × 8 matrix fragments as `stmatrix` takes
/// them: rank 2, no replicas, one block's, a multiple of four pairs a thread, and in
/// every warp each pair `p` (registers `k0`, `k0 + e1`, [`pair_reg`]) lies at row
/// `r_p + lane / 4` and columns `c_p + 2 (lane % 4)` and the next, `r_p` and `c_p` the
/// warp's, `c_p` a multiple of 8. A coordinate is the sum of a register, a lane and a
/// warp part ([`AxisMap::local_at`]), so each part is checked alone: the lanes' (32),
/// the pairs' (`regs / 2`) and the columns' alignment in every warp.
fn matrix_fragments(map: &RegMap) -> bool {
    let (rows, cols) = match map.axes.as_slice() {
        [r, c] => (r, c),
        _ => return false,
    };
    let plain = |m: &AxisMap| !m.replicated() && m.ctas == 1;
    if !(plain(rows) && plain(cols) && map.dropped.is_empty() && map.regs.is_multiple_of(8)) {
        return false;
    }
    let e1 = cols.e_stride;
    let lanes = (0..32).all(|l| rows.local_at(0, l, 0) == rows.local_at(0, 0, 0) + l / 4 && cols.local_at(0, l, 0) == cols.local_at(0, 0, 0) + 2 * (l % 4));
    let pairs = (0..map.regs / 2).map(|p| pair_first(e1, p)).all(|k0| rows.local_at(0, 0, k0 + e1) == rows.local_at(0, 0, k0) && cols.local_at(0, 0, k0 + e1) == cols.local_at(0, 0, k0) + 1);
    let aligned = (0..rows.wpb * cols.wpb).all(|w| (0..map.regs / 2).all(|p| cols.local_at(w, 0, pair_first(e1, p)).is_multiple_of(8)));
    lanes && pairs && aligned
}

/// The byte offsets, in the output tile's swizzled shared memory, of the rows a lane
/// addresses for `stmatrix` quad `m` ([`Emitter::matrices_to_boxes`]), as classes:
/// each class's first quad and every quad of it with its offset's difference from that
/// quad's, the same in every lane of every warp (checked for each, from a table of the
/// offsets), so that a thread computes one address a class. Quads join the first class
/// they fit.
fn address_classes(map: &RegMap, inner: u32, box_bytes: u32, esz: u32) -> Vec<(u32, Vec<(u32, i64)>)> {
    let (rows, cols) = (&map.axes[0], &map.axes[1]);
    let e1 = cols.e_stride;
    let threads = 32 * rows.wpb * cols.wpb;
    // quad m's offset in thread t (warp t / 32, lane t % 32): row `lane % 8` of matrix
    // `lane / 8`, held by lane `4 (lane % 8)`
    let off: Vec<Vec<i64>> = (0..map.regs / 8)
        .map(|m| {
            (0..threads)
                .map(|t| {
                    let (w, l) = (t / 32, t % 32);
                    let (k0, rl) = (pair_first(e1, 4 * m + l / 8), 4 * (l % 8));
                    swizzled(rows.local_at(w, rl, k0), cols.local_at(w, rl, k0), inner, box_bytes, esz) as i64
                })
                .collect()
        })
        .collect();
    let mut classes: Vec<(u32, Vec<(u32, i64)>)> = Vec::new();
    for (m, o) in off.iter().enumerate() {
        let m = m as u32;
        let fit = classes.iter().position(|(f, _)| {
            let first = &off[*f as usize];
            o.iter().zip(first).all(|(a, b)| a - b == o[0] - first[0])
        });
        match fit {
            Some(c) => {
                let d = o[0] - off[classes[c].0 as usize][0];
                classes[c].1.push((m, d));
            }
            None => classes.push((m, vec![(m, 0)])),
        }
    }
    classes
}

/// How a tile was written into the TMA store's shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Written {
    /// A pair of 16-bit elements at a time.
    Pairs,
    /// Four 8 × 8 matrices at a time, by `stmatrix` ([`matrix_fragments`]).
    Matrices,
}

/// The registers of the tile being stored: their map and array name, the output's
/// dtype, the block offsets (C expressions) and the tile's columns.
struct TileRegs<'s> {
    map: &'s RegMap,
    name: &'s str,
    dtype: DType,
    /// The bulk store's coordinates innermost first (the tensor map's order), the
    /// first one the tile's columns' offset, to which a box adds its column.
    coords: &'s [String],
    cols: u32,
}

impl Emitter<'_> {
    /// A store [`general_stores`] chose, in a warp-specialized kernel of the general
    /// lowering: through the area after the operand area or a dead operand tile
    /// ([`dead_staged_tile`], after a `wgmma` wait), issued by the first consumer
    /// thread (see [`Self::tma_store`]; the consumers' last act waits until the bulk
    /// stores have read it, `Self::drain_tma_stores`).
    pub(super) fn store_by_tma(&mut self, op: OpId, st: &StoreTma) -> R {
        let (at, map) = (self.out_tma_at.to_string(), format!("kf_stm{}", st.map));
        let out = TmaOut { base: "kf_ops", saddr: "kf_saddr", c_base: &at, inner: st.inner, box_bytes: st.box_bytes, map_name: &map, lead: GENERAL_LEAD };
        if self.out_tma_reuses.is_some() {
            // (the operand tile's last readers: this warpgroup's `wgmma` have read it;
            // the barrier before the writes waits for the other consumers')
            self.line("kf_wg_wait();")?;
        }
        // (the plan says so where it does: `tma_store` writes other layouts as they are)
        if let Some(written) = self.tma_store(op, &out)? {
            let Op::Store { tensor, .. } = self.k.op(op) else { unreachable!() };
            let how = if written == Written::Matrices { ", written there by `stmatrix`" } else { "" };
            let area = match self.out_tma_reuses {
                Some(v) => format!("the operand tile of `{}` (its readers done)", self.k.names.get(&v).cloned().unwrap_or_else(|| v.to_string())),
                None => "shared memory".to_string(),
            };
            self.dot_notes.push(format!("the tile stored to `{}` leaves through {area} by TMA bulk stores{how}", self.k.param(*tensor).name));
        }
        Ok(())
    }

    /// After the consumers' last store by TMA: shared memory outlives the bulk stores'
    /// reads of it.
    pub(super) fn drain_tma_stores(&mut self) -> R {
        if self.out_tma_maps.is_empty() {
            return Ok(());
        }
        self.line(format!("if ({GENERAL_LEAD}) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");"))
    }

    /// The epilogue store of a `[BM, BN]` tile through shared memory and a TMA bulk
    /// store, when the value's valid lanes are exactly the in-bounds part of the tile
    /// (what the copy engine writes, checked at run time), else the ordinary store.
    /// Offsets that cannot be negative are not checked.
    ///
    /// Shared memory holds the tile as `BN / inner` boxes of `[BM, inner]` elements,
    /// 128-byte rows swizzled like TMA's 128-byte mode (16-byte chunk `j` of row `r` at
    /// chunk `j ^ (r % 8)`), so that a warp's writes (8 rows x 4 lanes) hit 8 different
    /// chunks, at `base + c_base`. One thread (`lead`: the first consumer, or each
    /// ping-pong warpgroup's first) waits until the previous tile's bulk store has read
    /// the buffer, the consumers write, fence the writes for the async proxy, meet at
    /// the barrier, and the same thread issues the store.
    ///
    /// A tile whose registers are 8 × 8 matrix fragments ([`matrix_fragments`]: the
    /// accumulators of `wgmma` and `mma.sync`) is written four matrices at a time by
    /// `stmatrix`, each of its 8-element rows one 16-byte chunk; any other, a pair of
    /// 16-bit elements at a time.
    ///
    /// Says how the tile went into shared memory for TMA (none: a layout this does not
    /// write, stored as the op is).
    pub(super) fn tma_store(&mut self, op: OpId, out: &TmaOut) -> Result<Option<Written>, CodegenError> {
        let k = self.k;
        let Op::Store { tensor, dims } = k.op(op) else { unreachable!() };
        let ops = k.operands(op);
        let r = dims.len();
        let v = ops[r];
        let val = self.val(v).clone();
        let map = val.map.clone().ok_or_else(|| CodegenError::Unsupported("a scalar epilogue store".into()))?;
        if !pairs_along_rows(&val) {
            return self.op(op).map(|()| None);
        }
        let tdims = k.tensor_dims(*tensor).to_vec();
        let offs: Vec<String> = ops[..r].iter().map(|o| self.val(*o).name.clone()).collect();
        // the tile's two dimensions (value axes 0 and 1) and the tensor map's order
        let tiles: Vec<usize> = (0..r).filter(|&d| matches!(dims[d], AccessDim::Tile(_))).collect();
        let Some(order) = tma_order(k, self.spec, op).filter(|_| tiles.len() == 2) else { return self.op(op).map(|()| None) };
        let coords: Vec<String> = order.iter().map(|&d| offs[d as usize].clone()).collect();
        let tile = TileRegs { map: &map, name: &val.name, dtype: k.param(*tensor).dtype, coords: &coords, cols: val.shape[1] };
        // a tile valid everywhere (its range the extents, known here) that the tensor
        // holds whole wherever the store runs needs no check
        let whole = (0..r).all(|d| super::dim_in_grid(k, self.spec, &self.grid, &dims[d], ops[d], tdims[d]))
            && (0..2).all(|t| val.lo[t] == "0" && val.hi[t] == val.shape[t].to_string());
        if whole {
            return self.store_whole_tile(out, &tile).map(Some);
        }
        // otherwise the tile's valid range and offsets are checked at run time, and where
        // they fail the ordinary store writes the tile
        let mut conds = Vec::new();
        for (t, &d) in tiles.iter().enumerate() {
            let n = self.shape_var(tdims[d]);
            let ext = val.shape[t];
            if val.lo[t] != "0" {
                conds.push(format!("{} == 0", val.lo[t]));
            }
            conds.push(format!("{} == kf_maxi(0LL, kf_mini({n} - {}, {ext}LL))", val.hi[t], offs[d]));
            if !non_negative(k, ops[d]) {
                conds.push(format!("{} >= 0", offs[d]));
            }
        }
        // an indexed dimension (a batch): its index within the tensor
        for d in (0..r).filter(|d| !tiles.contains(d)) {
            let n = self.shape_var(tdims[d]);
            let lo = if non_negative(k, ops[d]) { String::new() } else { format!("{} >= 0 && ", offs[d]) };
            conds.push(format!("{lo}{} < {n}", offs[d]));
        }
        // (each tile dimension adds its range check: `conds` is never empty)
        let ok = self.fresh("kf_tma_ok");
        self.line(format!("const bool {ok} = {};", conds.join(" && ")))?;
        self.open(format!("if ({ok})"))?;
        let written = self.store_whole_tile(out, &tile)?;
        self.close()?;
        self.open("else")?;
        self.op(op)?;
        self.close()?;
        Ok(Some(written))
    }

    /// The whole tile through shared memory at once: the thread waits for the previous
    /// tile's bulk stores to have read the buffer, every consumer writes its registers,
    /// then the thread stores every box.
    fn store_whole_tile(&mut self, out: &TmaOut, t: &TileRegs) -> Result<Written, CodegenError> {
        let (lead, inner, box_bytes) = (out.lead, out.inner, out.box_bytes);
        self.line(format!("if ({lead}) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");"))?;
        let b = self.barrier;
        self.line(b)?;
        // addressed from the shared array itself (`base` went through an integer to
        // be aligned): a pointer the compiler traces to `kf_dsmem` stays in the shared
        // address space, so these writes are 32-bit-addressed `STS`, not generic 64-bit
        // `ST` with an extra add each (~1% of a 4096³ bf16 product)
        self.line(format!("unsigned char* kf_cs = kf_dsmem + ((unsigned)({} - kf_dsmem) + {});", out.base, out.c_base))?;
        let written = if matrix_fragments(t.map) { Written::Matrices } else { Written::Pairs };
        if written == Written::Matrices {
            self.matrices_to_boxes(t, inner, box_bytes)?;
        } else {
            let e1 = t.map.axes[1].e_stride;
            self.unroll("p", t.map.regs / 2)?;
            // register k0 and the next along the columns (element digit 0 and 1)
            self.line(format!("const int k0 = {};", pair_reg(e1, "p")))?;
            self.pair_to_box(t.map, t.name, t.dtype, inner, box_bytes)?;
            self.close()?;
        }
        self.line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");")?;
        self.line(b)?;
        self.open(format!("if ({lead})"))?;
        for q in 0..t.cols / inner {
            self.bulk_store_box(out, t.coords, q * inner, q * box_bytes)?;
        }
        self.line("asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");")?;
        self.close()?;
        Ok(written)
    }

    /// Writes register `k0` of `name` and the next along the columns (a 16-bit pair)
    /// into the output tile's swizzled shared memory at `kf_cs`, in the box its column
    /// falls in (boxes `box_bytes` apart).
    fn pair_to_box(&mut self, map: &RegMap, name: &str, d: DType, inner: u32, box_bytes: u32) -> R {
        let esz = d.size_bytes() as u32;
        let e1 = map.axes[1].e_stride;
        self.line(format!("const int row = {};", coord(map, 0, "k0")))?;
        self.line(format!("const int col = {};", coord(map, 1, "k0")))?;
        self.line(format!("const int q = col / {inner};"))?;
        self.line(format!("const int cb = (col % {inner}) * {esz};"))?;
        self.line(format!("const unsigned off = q * {box_bytes} + row * 128 + ((((cb >> 4) ^ (row & 7)) << 4) | (cb & 15));"))?;
        let lo = from_reg(d, &format!("{name}[k0]"));
        let hi = from_reg(d, &format!("{name}[k0 + {e1}]"));
        self.line(format!("*reinterpret_cast<unsigned*>(kf_cs + off) = kf_pack16({lo}, {hi});"))
    }

    /// Writes a tile of 8 × 8 matrix fragments ([`matrix_fragments`]) into the output
    /// tile's swizzled shared memory at `kf_cs` by `stmatrix.x4`, pairs `4m .. 4m + 3`
    /// at a time (pair `p`: register `k0` and the next along the columns, packed to 16
    /// bits). Lanes `8j .. 8j + 7` give the addresses of pair `4m + j`'s eight rows:
    /// lane `l` the row that lane `4 (l % 8)` holds (the fragment's column 0), each row
    /// an aligned 16-byte chunk of its box. The addresses are a few per thread
    /// ([`address_classes`]) plus constants, so that none need be kept a quad.
    fn matrices_to_boxes(&mut self, t: &TileRegs, inner: u32, box_bytes: u32) -> R {
        let (map, esz) = (t.map, t.dtype.size_bytes() as u32);
        let e1 = map.axes[1].e_stride;
        let pk = if t.dtype == DType::F16 { "kf_pk_f16" } else { "kf_pk_bf16" };
        let classes = address_classes(map, inner, box_bytes, esz);
        self.line("const int kf_rl = (kf_lane % 8) * 4;")?;
        let names: Vec<String> = (0..classes.len()).map(|c| format!("kf_sa{c}")).collect();
        self.line(format!("unsigned {};", names.join(", ")))?;
        for (c, (first, _)) in classes.iter().enumerate() {
            self.open("")?;
            self.line(format!("const int k0 = {};", pair_reg(e1, &format!("{} + kf_lane / 8", 4 * first))))?;
            self.line(format!("const int row = {};", local_raw_in(map, 0, "k0", "kf_rl")))?;
            self.line(format!("const int col = {};", local_raw_in(map, 1, "k0", "kf_rl")))?;
            self.line(format!("const int cb = (col % {inner}) * {esz};"))?;
            self.line(format!("{} = kf_saddr(kf_cs) + (col / {inner}) * {box_bytes} + row * 128 + (((cb >> 4) ^ (row & 7)) << 4);", names[c]))?;
            self.close()?;
        }
        let mut quads: Vec<(u32, usize, i64)> = classes.iter().enumerate().flat_map(|(c, (_, ms))| ms.iter().map(move |&(m, d)| (m, c, d))).collect();
        quads.sort();
        for (m, c, d) in quads {
            let at = match d {
                0 => names[c].clone(),
                d if d > 0 => format!("{} + {d}", names[c]),
                d => format!("{} - {}", names[c], -d),
            };
            let words: Vec<String> = (0..4)
                .map(|j| {
                    let k = pair_first(e1, 4 * m + j);
                    format!("\"r\"({pk}({n}[{k}], {n}[{}]))", k + e1, n = t.name)
                })
                .collect();
            self.line(format!("asm volatile(\"stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {{%1, %2, %3, %4}};\" :: \"r\"({at}), {} : \"memory\");", words.join(", ")))?;
        }
        Ok(())
    }

    /// The bulk store of one `[BM, inner]` box of the output tile, `col` columns into it,
    /// from `kf_cs + at`; `coords` innermost first, the columns' offset first.
    fn bulk_store_box(&mut self, out: &TmaOut, coords: &[String], col: u32, at: u32) -> R {
        let r = coords.len();
        let slots: Vec<String> = (1..=r).map(|i| format!("%{i}")).collect();
        let mut ins = vec![format!("\"l\"(&{})", out.map_name), format!("\"r\"((int)({} + {col}))", coords[0])];
        ins.extend(coords[1..].iter().map(|c| format!("\"r\"((int){c})")));
        ins.push(format!("\"r\"({}(kf_cs + {at}))", out.saddr));
        self.line(format!(
            "asm volatile(\"cp.async.bulk.tensor.{r}d.global.shared::cta.bulk_group [%0, {{{}}}], [%{}];\" :: {} : \"memory\");",
            slots.join(", "),
            r + 1,
            ins.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{blocked, mma_accumulator, mma_tiles_accumulator};
    use kfuse_ir::Layout;

    /// The byte offset the pair path writes element pair `(k0, k0 + e1)` of thread
    /// `(w, l)` to ([`Emitter::pair_to_box`]), from the map's coordinates.
    fn pair_offset(map: &RegMap, w: u32, l: u32, k0: u32, inner: u32, box_bytes: u32) -> u32 {
        swizzled(map.axes[0].local_at(w, l, k0), map.axes[1].local_at(w, l, k0), inner, box_bytes, 2)
    }

    /// `stmatrix.x4` as the PTX ISA defines it, on the addresses
    /// [`Emitter::matrices_to_boxes`] gives (each class's first quad's offset plus the
    /// quad's difference): matrix `j` of quad `m` takes its row `r` from lane `8j + r`,
    /// and that row's 4-byte word `c` is register `j` of lane `4r + c`, i.e. pair
    /// `4m + j` of that lane. Every pair must land where the pair path puts it.
    fn stores_like_pairs(map: &RegMap, inner: u32, box_bytes: u32) {
        let e1 = map.axes[1].e_stride;
        let warps = map.axes[0].wpb * map.axes[1].wpb;
        let classes = address_classes(map, inner, box_bytes, 2);
        let first_off = |m: u32, w: u32, l: u32| {
            let (k0, rl) = (pair_first(e1, 4 * m + l / 8), 4 * (l % 8));
            swizzled(map.axes[0].local_at(w, rl, k0), map.axes[1].local_at(w, rl, k0), inner, box_bytes, 2)
        };
        let mut seen = std::collections::BTreeSet::new();
        for (first, quads) in &classes {
            for &(m, d) in quads {
                for w in 0..warps {
                    for j in 0..4 {
                        for r in 0..8 {
                            // the row address lane 8j + r gives
                            let addr = (first_off(*first, w, 8 * j + r) as i64 + d) as u32;
                            for c in 0..4 {
                                let k0 = pair_first(e1, 4 * m + j);
                                assert_eq!(addr + 4 * c, pair_offset(map, w, 4 * r + c, k0, inner, box_bytes), "quad {m} matrix {j} row {r} word {c} of warp {w}");
                                assert!(seen.insert((w, 4 * r + c, k0)));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len() as u32, warps * 32 * map.regs / 2, "every pair written once");
    }

    #[test]
    fn matrix_fragments_store_what_the_pairs_store() {
        // wgmma accumulators of 64 rows a warpgroup: 128 x 256 (GEMM), 256 x 128 over
        // four warpgroups, 64 x 64; mma.sync tiles over 2 x 2 warps
        for p in [mma_accumulator(128, 256, 8), mma_accumulator(256, 128, 16), mma_accumulator(64, 64, 4), mma_tiles_accumulator(64, 128, [2, 2])] {
            let map = RegMap::of(&Layout::Blocked(p.clone())).unwrap();
            assert!(matrix_fragments(&map), "{p:?}");
            stores_like_pairs(&map, 64, p.shape[0] * 128);
        }
        // the GEMM's 128 x 256 tile: four addresses a thread, the rest constants
        let map = RegMap::of(&Layout::Blocked(mma_accumulator(128, 256, 8))).unwrap();
        assert_eq!(address_classes(&map, 64, 128 * 128, 2).len(), 4);
    }

    #[test]
    fn other_layouts_are_written_in_pairs() {
        // a blocked layout of 8 columns a thread is not an 8 x 8 fragment
        let map = RegMap::of(&Layout::Blocked(blocked(&[128, 256], &[1, 0], 8, 256, &[1, 0], &[1, 1]))).unwrap();
        assert!(!matrix_fragments(&map));
        // nor a tile of fewer than four pairs a thread
        let map = RegMap::of(&Layout::Blocked(mma_accumulator(16, 8, 1))).unwrap();
        assert!(!matrix_fragments(&map));
    }
}

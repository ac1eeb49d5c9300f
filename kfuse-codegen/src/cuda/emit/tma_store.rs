//! A store of a register tile through shared memory and TMA bulk stores (sm_90a): the
//! tile is written into swizzled shared memory and sent out whole or box by box, where
//! [`general_stores`] finds a store that can. A tile whose valid range is its extents
//! (known when the kernel is written) and that the tensor holds whole wherever the
//! store runs goes by TMA alone; any other checks at run time that its valid range is
//! the tensor's part of the tile, and is stored as the op is where it is not.

use super::*;
use crate::passes::select_mma_path::{tma_obstacle, tma_order};

/// Where an epilogue tile leaves by TMA: its shared memory (`c_base` bytes from `base`,
/// the dynamic shared memory's aligned start, whose shared-space address `saddr` — the
/// name of the prelude's function — gives), its boxes (`inner` columns, `box_bytes`
/// each), how many box-sized buffers it goes through (0: the whole tile at once), the
/// output's tensor map and the thread that issues the bulk stores.
pub(super) struct TmaOut<'s> {
    pub base: &'s str,
    pub saddr: &'s str,
    pub c_base: &'s str,
    pub inner: u32,
    pub box_bytes: u32,
    pub buffers: u32,
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

/// The thread that issues a general-lowering kernel's bulk stores: the first consumer.
const GENERAL_LEAD: &str = "kf_tid == 0";

/// Whether a stored register tile lies as [`Emitter::tma_store`] writes it into shared
/// memory: rank 2, its axes in order, pairs of neighbouring columns in each thread.
fn pairs_along_rows(val: &Val) -> bool {
    val.map.as_ref().is_some_and(|map| map.axes.len() == 2 && val.axis_map == [Some(0), Some(1)] && map.axes[1].elem_step == 1 && map.axes[1].spt % 2 == 0)
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
    /// lowering: through the area after the operand area, issued by the first consumer
    /// thread (see [`Self::tma_store`]; the consumers' last act waits until the bulk
    /// stores have read it, `Self::drain_tma_stores`).
    pub(super) fn store_by_tma(&mut self, op: OpId, st: &StoreTma) -> R {
        let (at, map) = (self.out_tma_at.to_string(), format!("kf_stm{}", st.map));
        let out = TmaOut { base: "kf_ops", saddr: "kf_saddr", c_base: &at, inner: st.inner, box_bytes: st.box_bytes, buffers: 0, map_name: &map, lead: GENERAL_LEAD };
        // (the plan says so where it does: `tma_store` writes other layouts as they are)
        if self.tma_store(op, &out)? {
            let Op::Store { tensor, .. } = self.k.op(op) else { unreachable!() };
            self.dot_notes.push(format!("the tile stored to `{}` leaves through shared memory by TMA bulk stores", self.k.param(*tensor).name));
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
    /// With `buffers > 0` the tile leaves box by box
    /// through that many box-sized buffers: before writing box `q` into buffer
    /// `q % buffers`, the thread waits until at most `buffers - 1` bulk stores are still
    /// reading (all of them before the first box: the previous tile's), and each box's
    /// registers are those whose column falls in it (known per register at compile time:
    /// the column axis's thread part stays within one repetition, which a box holds
    /// whole).
    ///
    /// Says whether the tile went by TMA (false: a layout this does not write, stored as
    /// the op is).
    pub(super) fn tma_store(&mut self, op: OpId, out: &TmaOut) -> Result<bool, CodegenError> {
        let k = self.k;
        let Op::Store { tensor, dims } = k.op(op) else { unreachable!() };
        let ops = k.operands(op);
        let r = dims.len();
        let v = ops[r];
        let val = self.val(v).clone();
        let map = val.map.clone().ok_or_else(|| CodegenError::Unsupported("a scalar epilogue store".into()))?;
        if !pairs_along_rows(&val) {
            return self.op(op).map(|()| false);
        }
        let tdims = k.tensor_dims(*tensor).to_vec();
        let offs: Vec<String> = ops[..r].iter().map(|o| self.val(*o).name.clone()).collect();
        // the tile's two dimensions (value axes 0 and 1) and the tensor map's order
        let tiles: Vec<usize> = (0..r).filter(|&d| matches!(dims[d], AccessDim::Tile(_))).collect();
        let Some(order) = tma_order(k, self.spec, op).filter(|_| tiles.len() == 2) else { return self.op(op).map(|()| false) };
        let coords: Vec<String> = order.iter().map(|&d| offs[d as usize].clone()).collect();
        let tile = TileRegs { map: &map, name: &val.name, dtype: k.param(*tensor).dtype, coords: &coords, cols: val.shape[1] };
        // a tile valid everywhere (its range the extents, known here) that the tensor
        // holds whole wherever the store runs needs no check
        let whole = (0..r).all(|d| super::dim_in_grid(k, self.spec, &self.grid, &dims[d], ops[d], tdims[d]))
            && (0..2).all(|t| val.lo[t] == "0" && val.hi[t] == val.shape[t].to_string());
        if whole {
            return self.store_tile(out, &tile).map(|()| true);
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
        self.store_tile(out, &tile)?;
        self.close()?;
        self.open("else")?;
        self.op(op)?;
        self.close()?;
        Ok(true)
    }

    /// The tile by TMA: whole, or box by box where `out.buffers` is fewer than its
    /// boxes.
    fn store_tile(&mut self, out: &TmaOut, t: &TileRegs) -> R {
        if out.buffers > 0 && out.buffers < t.cols / out.inner {
            let c = &t.map.axes[1];
            if c.replicated() || c.ctas > 1 || !out.inner.is_multiple_of(c.chunk) {
                return Err(CodegenError::Unsupported(format!("an output tile in {}-column boxes from a register layout whose columns repeat every {}", out.inner, c.chunk)));
            }
            self.store_box_by_box(out, t)
        } else {
            self.store_whole_tile(out, t)
        }
    }

    /// The whole tile through shared memory at once: the thread waits for the previous
    /// tile's bulk stores to have read the buffer, every consumer writes its registers,
    /// then the thread stores every box.
    fn store_whole_tile(&mut self, out: &TmaOut, t: &TileRegs) -> R {
        let (lead, inner, box_bytes) = (out.lead, out.inner, out.box_bytes);
        self.line(format!("if ({lead}) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");"))?;
        let b = self.barrier;
        self.line(b)?;
        // addressed from the shared array itself (`base` went through an integer to
        // be aligned): a pointer the compiler traces to `kf_dsmem` stays in the shared
        // address space, so these writes are 32-bit-addressed `STS`, not generic 64-bit
        // `ST` with an extra add each (~1% of a 4096³ bf16 product)
        self.line(format!("unsigned char* kf_cs = kf_dsmem + ((unsigned)({} - kf_dsmem) + {});", out.base, out.c_base))?;
        let pairs = t.map.regs / 2;
        let e1 = t.map.axes[1].e_stride;
        self.unroll("p", pairs)?;
        // register k0 and the next along the columns (element digit 0 and 1)
        self.line(format!("const int k0 = (p / {e1}) * {} + (p % {e1});", 2 * e1))?;
        self.pair_to_box(t.map, t.name, t.dtype, inner, box_bytes, None)?;
        self.close()?;
        self.line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");")?;
        self.line(b)?;
        self.open(format!("if ({lead})"))?;
        for q in 0..t.cols / inner {
            self.bulk_store_box(out, t.coords, q * inner, q * box_bytes)?;
        }
        self.line("asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");")?;
        self.close()
    }

    /// The tile box by box through `out.buffers` box-sized buffers (see
    /// [`Self::tma_store`]).
    fn store_box_by_box(&mut self, out: &TmaOut, t: &TileRegs) -> R {
        let (lead, inner, box_bytes, buffers) = (out.lead, out.inner, out.box_bytes, out.buffers);
        let c = &t.map.axes[1];
        self.line(format!("unsigned char* kf_cs = kf_dsmem + ((unsigned)({} - kf_dsmem) + {});", out.base, out.c_base))?;
        let b = self.barrier;
        let e1 = c.e_stride;
        for q in 0..t.cols / inner {
            let wait = if q == 0 { 0 } else { buffers - 1 };
            if q == 0 || q >= buffers {
                self.line(format!("if ({lead}) asm volatile(\"cp.async.bulk.wait_group.read {wait};\" ::: \"memory\");"))?;
            }
            self.line(b)?;
            self.unroll("p", t.map.regs / 2)?;
            self.line(format!("const int k0 = (p / {e1}) * {} + (p % {e1});", 2 * e1))?;
            // the box of register k0's column: its repetition's
            let rep = if c.reps > 1 { format!("((k0 / {}) % {}) * {}", c.rep_stride, c.reps, c.chunk) } else { "0".to_string() };
            self.open(format!("if (({rep}) / {inner} == {q})"))?;
            self.pair_to_box(t.map, t.name, t.dtype, inner, box_bytes, Some((q % buffers) * box_bytes))?;
            self.close()?;
            self.close()?;
            self.line("asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");")?;
            self.line(b)?;
            self.open(format!("if ({lead})"))?;
            self.bulk_store_box(out, t.coords, q * inner, (q % buffers) * box_bytes)?;
            self.line("asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");")?;
            self.close()?;
        }
        Ok(())
    }

    /// Writes register `k0` of `name` and the next along the columns (a 16-bit pair)
    /// into the output tile's swizzled shared memory at `kf_cs`: in the box its column
    /// falls in (`box_at`: none — the box `col / inner`, boxes `box_bytes` apart — or
    /// this byte offset, for a tile stored box by box).
    fn pair_to_box(&mut self, map: &RegMap, name: &str, d: DType, inner: u32, box_bytes: u32, box_at: Option<u32>) -> R {
        let esz = d.size_bytes() as u32;
        let e1 = map.axes[1].e_stride;
        self.line(format!("const int row = {};", coord(map, 0, "k0")))?;
        self.line(format!("const int col = {};", coord(map, 1, "k0")))?;
        let base = match box_at {
            Some(at) => at.to_string(),
            None => {
                self.line(format!("const int q = col / {inner};"))?;
                format!("q * {box_bytes}")
            }
        };
        self.line(format!("const int cb = (col % {inner}) * {esz};"))?;
        self.line(format!("const unsigned off = {base} + row * 128 + ((((cb >> 4) ^ (row & 7)) << 4) | (cb & 15));"))?;
        let lo = from_reg(d, &format!("{name}[k0]"));
        let hi = from_reg(d, &format!("{name}[k0 + {e1}]"));
        self.line(format!("*reinterpret_cast<unsigned*>(kf_cs + off) = kf_pack16({lo}, {hi});"))
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

//! Block loads and stores (`Op::Load`, `Op::Store` of tiles and scalars): the tile's
//! base pointer and bounds, the value's registers (or a rematerialized load's raw
//! vectors), then per group of a thread's registers a vector access where the whole
//! vector is inside and an element-by-element one, each behind its bounds test; a load
//! of a tile the tensor holds whole gets a branch-free copy first, and a persistent
//! kernel's prefetch fills raw arrays that its program unpacks later.

use super::*;

/// A tile axis of a block access: tensor dimension (`GATHERED` for the gathered axis),
/// remaining extent (`None`: in bounds everywhere), lower bound (`None`: the offset is
/// not negative), extent.
type TileDim = (usize, Option<String>, Option<String>, u32);

/// The tensor dimension a [`TileDim`] names for a gathered axis: its elements are
/// addressed by their index tiles' registers, not by a stride times their coordinate.
const GATHERED: usize = usize::MAX;

/// The coordinates `cvars` of a group's first element with element `j` of its vector
/// along the fastest tile axis `ft`.
fn elem_coords(cvars: &[String], ft: usize, j: u32) -> Vec<String> {
    let mut cj = cvars.to_vec();
    cj[ft] = format!("({} + {j})", cvars[ft]);
    cj
}

/// Whether an access drops its masks: every tile axis is in bounds everywhere
/// ([`exact_from_zero`] or [`whole_programs`]), and the kernel has no full extents. Row
/// kernels keep their row masks: there the mask costs a branch a row, and without it
/// ptxas gave LayerNorm's 16384-element rows 94 registers instead of 64 (one 512-thread
/// block a multiprocessor instead of two: 98% → 64% of the copy bandwidth on the H100)
/// and spilled f32 softmax rows.
fn whole_tiles(k: &Kernel, spec: &Spec, grid: &[crate::target::GridAxisEval], dims: &[AccessDim], offs: &[ValueId], tdims: &[kfuse_ir::ShapeSym]) -> bool {
    k.schedule.full.is_empty()
        && dims.iter().enumerate().all(|(dd, ad)| match ad {
            AccessDim::Index | AccessDim::Gather(_) => true,
            AccessDim::Tile(e) => exact_from_zero(k, *e, offs[dd]) || whole_programs(k, spec, grid, *e, offs[dd], tdims[dd]),
        })
}


/// One block access of tiles as its loops address it: the tensor and its dtype, the
/// vector width and the vectors (`groups`) a thread moves, the tile's base pointer, the
/// index dimensions' condition (`kf_okN`) and the tile axes ([`TileDim`]), the value
/// (loaded or stored) and its register map, and the thread's own pointer into the tile
/// (`thread_pointers`), if it has one.
struct BlockAccess {
    tensor: kfuse_ir::ParamId,
    d: DType,
    w: u32,
    groups: u32,
    base: String,
    okv: String,
    tile_dims: Vec<TileDim>,
    val: Val,
    map: RegMap,
    store: Option<ValueId>,
    /// A `store_where`'s mask, in the value's registers.
    mask: Option<ValueId>,
    tptr: Option<String>,
    /// A gathered access's dimensions: the tensor dimension and its index tile (in the
    /// value's registers).
    gather: Vec<(usize, ValueId)>,
}

impl BlockAccess {
    /// The element offset a gathered access adds to register `key`'s address: each
    /// gathered dimension's coordinate (from its index tile) times its stride. Every use
    /// stands behind [`BlockAccess::gather_ok`]'s test, so where the tensor's offsets fit
    /// 32 bits ([`Spec::offsets32`]) the sum is taken in 32-bit arithmetic.
    fn gather_term(&self, e: &Emitter, key: &str) -> String {
        if self.gather.is_empty() {
            return String::new();
        }
        if e.spec.offsets32(self.tensor) {
            let terms: Vec<String> = self.gather.iter().map(|&(d, x)| format!("(unsigned){} * (unsigned){}", e.reg(x, key), e.stride(self.tensor, d))).collect();
            return format!(" + (unsigned long long)({})", terms.join(" + "));
        }
        self.gather.iter().map(|&(d, x)| format!(" + (long long){} * {}", e.reg(x, key), e.stride(self.tensor, d))).collect()
    }

    /// The condition that register `key`'s gathered coordinates lie inside the tensor
    /// (empty for an access that gathers nothing).
    fn gather_ok(&self, e: &Emitter, key: &str) -> String {
        let tdims = e.k.tensor_dims(self.tensor);
        self.gather
            .iter()
            .map(|&(d, x)| format!(" && (unsigned long long){} < (unsigned long long){}", e.reg(x, key), e.shape_var(tdims[d])))
            .collect()
    }

    /// The vector type of one group.
    fn vector(&self) -> Result<&'static str, CodegenError> {
        vec_type(self.w * self.d.size_bytes() as u32)
    }

    /// The element offset from the base pointer of coordinates `cv`.
    fn addr(&self, e: &Emitter, cv: &[String]) -> String {
        e.tile_offset(self.tensor, &self.tile_dims, cv)
    }

    /// The address of the group of register `k0` (coordinates `cv`): from the thread's
    /// pointer where it has one, else from the tile's.
    fn vaddr(&self, e: &Emitter, cv: &[String]) -> String {
        match &self.tptr {
            Some(t) => {
                let rc: Vec<String> = self.val.axis_map.iter().map(|a| a.map_or_else(|| "0".to_string(), |i| reg_coord(&self.map, i, "k0"))).collect();
                format!("{t} + {}", e.tile_offset(self.tensor, &self.tile_dims, &rc))
            }
            None => format!("{} + {}", self.base, e.tile_offset(self.tensor, &self.tile_dims, cv)),
        }
    }

    /// The in-bounds condition of coordinates `cv` (and `extra`, unless empty): the
    /// index dimensions', each masked tile axis's, and for a store the value's valid
    /// range.
    fn inb(&self, cv: &[String], extra: &str) -> String {
        let val = &self.val;
        let mut c = vec![self.okv.clone()];
        for (t, (_, rem, lo, e)) in self.tile_dims.iter().enumerate() {
            if let Some(rem) = rem {
                c.push(format!("{} < {rem}", cv[t]));
            }
            if let Some(l) = lo {
                c.push(format!("{} >= {l}", cv[t]));
            }
            if self.store.is_some() && val.hi[t] != e.to_string() {
                c.push(format!("{} < {}", cv[t], val.hi[t]));
                if val.lo[t] != "0" {
                    c.push(format!("{} >= {}", cv[t], val.lo[t]));
                }
            }
        }
        if !extra.is_empty() {
            c.push(extra.to_string());
        }
        c.join(" && ")
    }

    /// Whether a store writes only the registers this thread owns (replicas skip), as a
    /// condition on register `k` (empty: every thread writes its own).
    fn owner_test(&self, k: &str) -> String {
        let own = if self.store.is_some() { owner(&self.map, k) } else { "true".into() };
        if own == "true" {
            String::new()
        } else {
            own
        }
    }
}

impl Emitter<'_> {
    /// Loads (`store == None`) or stores a block.
    pub(super) fn access(&mut self, op: OpId, tensor: kfuse_ir::ParamId, dims: &[AccessDim], offs: &[ValueId], store: Option<ValueId>) -> R {
        let k = self.k;
        let p = k.param(tensor);
        let d = p.dtype;
        let tdims = p.dims().to_vec();
        let width = *k.schedule.vector.get(&op).unwrap_or(&1);
        // (a gathered dimension's coordinates come per register, from its index tile)
        let gather = k.gathered_offsets(op);
        let off: Vec<String> = offs.iter().zip(dims).map(|(o, d)| if d.is_gather() { "0".to_string() } else { self.val(*o).name.clone() }).collect();
        // base pointer and bounds
        let base = self.fresh("kf_p");
        let base_e = self.element_ptr(tensor, &off);
        let cst = if store.is_some() { "" } else { "const " };
        self.line(format!("{cst}{}* {base} = {base_e};", stype(d)))?;
        let (okv, okv_true, tile_dims) = self.access_bounds(dims, offs, &tdims, &off)?;
        let value_ty = store.map(|s| k.ty(s).clone()).unwrap_or_else(|| k.ty(op.value()).clone());
        let mask = store.and_then(|_| k.store_mask(op));
        if value_ty.is_scalar() {
            let okv = match mask {
                Some(m) => format!("{okv} && {}", self.val(m).name),
                None => okv,
            };
            return self.scalar_access(op, d, &okv, &base, store);
        }
        // the register map of the value
        let (val, map) = match store {
            None => {
                let (mut val, map) = self.loaded_tile(op, d, width, &tile_dims, &okv, okv_true)?;
                self.gathered_range(&mut val, &tile_dims, &gather);
                (val, map)
            }
            Some(sv) => {
                let val = self.val(sv).clone();
                let map = val.map.clone().unwrap();
                (val, map)
            }
        };
        if store.is_none() && (self.bound_only || self.loaded_ahead(op.value())) && self.bind.contains_key(&op.value()) {
            // the registers were loaded one program ahead
            self.vals.insert(op.value(), val);
            return Ok(());
        }
        let w = width.max(1);
        let groups = map.regs / w;
        let raw = if store.is_none() { self.raw.get(&op.value()).cloned() } else { None };
        if mask.is_some() && w > 1 {
            return Err(CodegenError::Unsupported("a masked store (`store_where`) in vectors".into()));
        }
        let gathers = !gather.is_empty();
        let mut a = BlockAccess { tensor, d, w, groups, base, okv, tile_dims, val, map, store, mask, tptr: None, gather };
        if let (Some(arr), true) = (&raw, self.bound_only) {
            return self.unpack_ahead(op, a, arr);
        }
        // a load whose tile the tensor holds whole (every register's coordinate inside
        // the bounds) takes a branch-free copy of the loop: unconditional loads that the
        // assembler can issue together, where the masked loop's per-group branches keep
        // them one round trip apart (where a thread makes many); so does a tile staged for
        // a dot where it is defined outside loops (its registers die at the shared-memory
        // write: flash attention's Q, 8 loads a thread, before the first `Q·Kᵀ`)
        let staged = k.loop_of(op).is_none() && self.wg.as_ref().is_some_and(|p| p.eager.get(&op.value()).is_some_and(|t| t.ring.is_none()));
        let many = groups >= WHOLE_TILE_MIN_GROUPS || staged && groups > 1;
        let full = if store.is_none() && many && !gathers { self.whole_tile_test(&a.okv, &a.tile_dims, &a.val, &a.map) } else { None };
        a.tptr = if gathers { None } else { self.thread_pointer(&a)? };
        if let Some(test) = &full {
            self.whole_tile_copy(&a, test, raw.as_deref())?;
        }
        self.unroll("g", groups)?;
        self.line(format!("const int k0 = g * {w};"))?;
        // coordinates of the group's first register, per tile axis
        let cvars = self.group_coords(&a.val, &a.map, a.tile_dims.len())?;
        let fast_t = a.map.fastest_axis().and_then(|f| a.val.axis_map.iter().position(|m| *m == Some(f)));
        match raw {
            Some(arr) => self.prefetch_raw(&a, &arr, &cvars, fast_t)?,
            None if w > 1 && store.is_none() && gathers => self.vector_load(&a, &cvars, fast_t)?,
            None => {
                if w > 1 {
                    self.vector_access(&a, &cvars, fast_t)?;
                }
                self.element_access(&a, &cvars, fast_t)?;
                if w > 1 {
                    self.close()?;
                }
            }
        }
        self.close()?;
        if full.is_some() {
            self.close()?;
        }
        if store.is_none() {
            self.vals.insert(op.value(), a.val);
        }
        Ok(())
    }

    /// A scalar load (by every thread) or store (by thread 0) behind the index
    /// dimensions' condition `okv`.
    fn scalar_access(&mut self, op: OpId, d: DType, okv: &str, base: &str, store: Option<ValueId>) -> R {
        match store {
            None => {
                let name = format!("v{}", op.index());
                self.line(format!("const {} {name} = {okv} ? {} : {};", ctype(d), to_reg(d, &format!("{base}[0]")), if d == DType::Bool { "false" } else { "0" }))?;
                self.vals.insert(op.value(), Val { name, dtype: d, map: None, axis_map: vec![], shape: vec![], lo: vec![], hi: vec![], lazy: None });
                Ok(())
            }
            Some(sv) => {
                let e = from_reg(d, &self.val(sv).name.clone());
                self.line(format!("if (kf_tid == 0 && {okv}) {base}[0] = {e};"))
            }
        }
    }

    /// The valid ranges of a loaded tile, per tile axis: from the offset's lower bound
    /// and the remaining extent, empty where the index dimensions' condition fails.
    fn load_ranges(&mut self, tile_dims: &[TileDim], okv: &str, okv_true: bool) -> Result<(Vec<String>, Vec<String>), CodegenError> {
        let mut lo = Vec::new();
        let mut hi = Vec::new();
        for (_, rem, l, e) in tile_dims {
            lo.push(match l {
                None => "0".to_string(),
                Some(l) => {
                    let n = self.fresh("kf_b");
                    self.line(format!("const long long {n} = kf_mini(kf_maxi({l}, 0LL), {e}LL);"))?;
                    n
                }
            });
            match rem {
                // the literal extent: readers of the bound drop the mask
                None if okv_true => hi.push(e.to_string()),
                None => {
                    let n = self.fresh("kf_b");
                    self.line(format!("const long long {n} = {okv} ? {e}LL : 0LL;"))?;
                    hi.push(n);
                }
                Some(rem) => {
                    let n = self.fresh("kf_b");
                    self.line(format!("const long long {n} = {okv} ? kf_maxi(0LL, kf_mini({rem}, {e}LL)) : 0LL;"))?;
                    hi.push(n);
                }
            }
        }
        Ok((lo, hi))
    }

    /// A gathered load's valid range along its gathered axis: where its index tiles are
    /// valid (a coordinate outside the tensor reads a valid 0).
    fn gathered_range(&self, val: &mut Val, tile_dims: &[TileDim], gather: &[(usize, ValueId)]) {
        let Some(g) = tile_dims.iter().position(|t| t.0 == GATHERED) else { return };
        for &(_, x) in gather {
            let xv = self.val(x);
            if xv.lo.get(g).is_some_and(|l| l != "0") {
                val.lo[g] = format!("kf_maxi((long long)({}), (long long)({}))", val.lo[g], xv.lo[g]);
            }
            if xv.hi.get(g).is_some_and(|h| *h != tile_dims[g].3.to_string()) {
                val.hi[g] = format!("kf_mini((long long)({}), (long long)({}))", val.hi[g], xv.hi[g]);
            }
        }
    }

    /// The value a block load defines, with its register map: its valid ranges, then its
    /// registers — or, rematerialized (`Schedule::remat`), a 16- or 8-bit float tile
    /// stays in the raw vectors it is loaded as (half or a quarter of the registers of
    /// f32s), each use converting its element.
    fn loaded_tile(&mut self, op: OpId, d: DType, width: u32, tile_dims: &[TileDim], okv: &str, okv_true: bool) -> Result<(Val, RegMap), CodegenError> {
        let k = self.k;
        let layout = self.layout(op.value())?;
        let (lo, hi) = self.load_ranges(tile_dims, okv, okv_true)?;
        let lmap = RegMap::of(&layout);
        let w = width.max(1);
        let esz = d.size_bytes() as u32;
        // (a gathered load is addressed per register: never read as raw vectors)
        let gathered = matches!(k.op(op), Op::Load { dims, .. } if dims.iter().any(AccessDim::is_gather));
        let remat_raw = k.schedule.remat
            && !self.bound_only
            && !gathered
            && d.is_float()
            && esz < 4
            && w > 1
            && (w * esz).is_multiple_of(4)
            && lmap.as_ref().is_some_and(|m| m.regs % w == 0 && m.fastest_axis().is_some());
        let val = if remat_raw {
            let regs = lmap.as_ref().unwrap().regs;
            let vt = vec_type(w * esz)?;
            let arr = format!("v{}w", op.value().index());
            let note = k.names.get(&op.value()).map(|n| format!("  // {n}")).unwrap_or_default();
            self.line(format!("{vt} {arr}[{}];{note}", regs / w))?;
            let g = format!("{arr}[({LAZY_K}) / {w}]");
            let j = format!("(({LAZY_K}) % {w})");
            let word = if esz == 2 {
                format!("((({LAZY_K}) & 1) ? kf_hi16({g}.w[{j} / 2]) : kf_lo16({g}.w[{j} / 2]))")
            } else {
                format!("kf_byte({g}.w[{j} / 4], {j} % 4)")
            };
            let val = self.lazy_tile(op.value(), d, &layout, lo, hi, to_reg(d, &word))?;
            self.remat_arrays.push((arr.clone(), regs / w, w * esz / 4));
            self.raw.insert(op.value(), arr);
            val
        } else {
            self.new_tile(op.value(), d, &layout, lo, hi, None)?
        };
        let map = val.map.clone().unwrap();
        Ok((val, map))
    }

    /// A load issued one program ahead as raw words (array `arr`): unpacked into the
    /// value's registers now.
    fn unpack_ahead(&mut self, op: OpId, a: BlockAccess, arr: &str) -> R {
        let (d, w) = (a.d, a.w);
        let vt = a.vector()?;
        self.unroll("g", a.groups)?;
        self.line(format!("const int k0 = g * {w};"))?;
        self.line(format!("const {vt} q = {arr}[g];"))?;
        self.unpack("q", d, &a.val.name, "k0", w)?;
        self.close()?;
        self.vals.insert(op.value(), a.val);
        Ok(())
    }

    /// `thread_pointers`: vector accesses address from the thread's own pointer (its
    /// place in the tile, computed once) plus each group's constant offset — one 64-bit
    /// pointer held across the loop, where a full address per group let the assembler
    /// rebuild 64-bit products per store under a register cap (RMSNorm at 80 registers
    /// spilled one); axes with replicas wrap their coordinates and keep the full address.
    fn thread_pointer(&mut self, a: &BlockAccess) -> Result<Option<String>, CodegenError> {
        if !(a.w > 1 && self.k.schedule.thread_pointers && a.val.axis_map.iter().flatten().all(|&i| !a.map.axes[i].replicated())) {
            return Ok(None);
        }
        let tc: Vec<String> = a.val.axis_map.iter().map(|x| x.map_or_else(|| "0".to_string(), |i| thread_coord(&a.map, i))).collect();
        let n = self.fresh("kf_t");
        let off = self.tile_offset(a.tensor, &a.tile_dims, &tc);
        self.line(format!("const auto {n} = {} + {off};", a.base))?;
        Ok(Some(n))
    }

    /// The branch-free copy of a load for a tile the tensor holds whole (`test`), into
    /// the value's registers or, prefetched, the raw array `raw`; opens the `else` of
    /// the masked loop.
    fn whole_tile_copy(&mut self, a: &BlockAccess, test: &str, raw: Option<&str>) -> R {
        let (d, w) = (a.d, a.w);
        let vt = if w > 1 { Some(a.vector()?) } else { None };
        self.open(format!("if ({test})"))?;
        self.unroll("g", a.groups)?;
        self.line(format!("const int k0 = g * {w};"))?;
        let cvars = self.group_coords(&a.val, &a.map, a.tile_dims.len())?;
        let a0 = self.tile_offset(a.tensor, &a.tile_dims, &cvars);
        let va = a.vaddr(self, &cvars);
        match (raw, vt) {
            (Some(arr), Some(vt)) => self.line(format!("{arr}[g] = *reinterpret_cast<const {vt}*>({va});"))?,
            (_, Some(vt)) => {
                self.line(format!("const {vt} q = *reinterpret_cast<const {vt}*>({va});"))?;
                self.unpack("q", d, &a.val.name, "k0", w)?;
            }
            (_, None) => self.line(format!("{}[k0] = {};", a.val.name, to_reg(d, &format!("{}[{a0}]", a.base))))?,
        }
        self.close()?;
        self.close()?;
        self.open("else")
    }

    /// A prefetch of group `g` (coordinates `cvars`): the raw words into the program's
    /// array `arr`, nothing converted (so nothing waits for the load until the program's
    /// turn); element by element where the vector is not wholly inside, masked lanes
    /// zero (the value a masked load reads).
    fn prefetch_raw(&mut self, a: &BlockAccess, arr: &str, cvars: &[String], fast_t: Option<usize>) -> R {
        let ft = fast_t.ok_or_else(|| CodegenError::Unsupported("vector access without a fastest axis".into()))?;
        let vt = a.vector()?;
        self.open(format!("if ({} && {})", a.inb(&elem_coords(cvars, ft, a.w - 1), ""), a.inb(cvars, "")))?;
        self.line(format!("{arr}[g] = *reinterpret_cast<const {vt}*>({});", a.vaddr(self, cvars)))?;
        self.close()?;
        self.open("else")?;
        self.line(format!("{vt} q = {{}};"))?;
        self.raw_elements(a, cvars, ft)?;
        self.line(format!("{arr}[g] = q;"))?;
        self.close()
    }

    /// The elements of group `g` (coordinates `cvars`, fastest tile axis `ft`) into the
    /// raw words of the vector `q`, which starts at zero, each behind its own bounds test
    /// (a masked element leaves its zero bits).
    fn raw_elements(&mut self, a: &BlockAccess, cvars: &[String], ft: usize) -> R {
        let (d, base) = (a.d, &a.base);
        let esz = d.size_bytes() as u32;
        for j in 0..a.w {
            let (cj, key) = (elem_coords(cvars, ft, j), format!("k0 + {j}"));
            let c = format!("{}{}", a.inb(&cj, ""), a.gather_ok(self, &key));
            let e = format!("{base}[{}{}]", a.addr(self, &cj), a.gather_term(self, &key));
            self.line(match (esz, d) {
                (8, _) => format!("if ({c}) {{ const unsigned long long x = (unsigned long long){e}; q.w[{}] = (unsigned int)x; q.w[{}] = (unsigned int)(x >> 32); }}", 2 * j, 2 * j + 1),
                (4, DType::F32) => format!("if ({c}) q.w[{j}] = __float_as_uint({e});"),
                (4, _) => format!("if ({c}) q.w[{j}] = (unsigned int){e};"),
                (b, _) => format!("if ({c}) q.w[{}] |= (unsigned int){e} << {};", j * b / 4, 8 * ((j * b) % 4)),
            })?;
        }
        Ok(())
    }

    /// The vector load of group `g` (coordinates `cvars`) of a gathered access into a
    /// vector of raw words that starts at zero: one load where the whole vector is inside,
    /// else element by element behind each one's bounds test (a masked element reads
    /// zero); then the words are converted once. Converting after the branch, not in each
    /// arm, leaves the assembler one conversion an element instead of a conversion and a
    /// predicated zero: a gathered row outside the tensor (a convolution's padding) is a
    /// vector of zero words. The depthwise 3 × 3 convolution's SASS: 1288 → 1184
    /// instructions a thread; H200, C256 56 bf16: the kernel 172.6 → 161.3 µs (NOTES.md
    /// c27). (Loads that gather nothing keep the conversions in the branch: the raw
    /// vector live across it cost flash attention's f16 D64 kernel its 192-row register
    /// room.)
    fn vector_load(&mut self, a: &BlockAccess, cvars: &[String], fast_t: Option<usize>) -> R {
        let ft = fast_t.ok_or_else(|| CodegenError::Unsupported("vector access without a fastest axis".into()))?;
        let vt = a.vector()?;
        let cond = format!("{} && {}{}", a.inb(&elem_coords(cvars, ft, a.w - 1), ""), a.inb(cvars, ""), a.gather_ok(self, "k0"));
        self.line(format!("{vt} q = {{}};"))?;
        self.open(format!("if ({cond})"))?;
        self.line(format!("q = *reinterpret_cast<const {vt}*>({}{});", a.vaddr(self, cvars), a.gather_term(self, "k0")))?;
        self.close()?;
        self.open("else")?;
        self.raw_elements(a, cvars, ft)?;
        self.close()?;
        self.unpack("q", a.d, &a.val.name, "k0", a.w)
    }

    /// The vector access of group `g` (coordinates `cvars`) when the whole vector is
    /// inside (its last element in bounds too); opens the `else` of the element-by-element
    /// access.
    fn vector_access(&mut self, a: &BlockAccess, cvars: &[String], fast_t: Option<usize>) -> R {
        let ft = fast_t.ok_or_else(|| CodegenError::Unsupported("vector access without a fastest axis".into()))?;
        let (d, w) = (a.d, a.w);
        let cond = format!("{} && {}{}", a.inb(&elem_coords(cvars, ft, w - 1), &a.owner_test("k0")), a.inb(cvars, ""), a.gather_ok(self, "k0"));
        let vt = a.vector()?;
        let a0 = format!("{}{}", a.vaddr(self, cvars), a.gather_term(self, "k0"));
        self.open(format!("if ({cond})"))?;
        match a.store {
            None => {
                self.line(format!("const {vt} q = *reinterpret_cast<const {vt}*>({a0});"))?;
                self.unpack("q", d, &a.val.name, "k0", w)?;
            }
            Some(sv) => {
                self.line(format!("{vt} q;"))?;
                let t = self.template(sv);
                self.pack("q", d, &t, "k0", w)?;
                self.line(format!("*reinterpret_cast<{vt}*>({a0}) = q;"))?;
            }
        }
        self.close()?;
        self.open("else")
    }

    /// The access of group `g` (coordinates `cvars`) element by element, each behind its
    /// own bounds test (a masked load reads zero).
    fn element_access(&mut self, a: &BlockAccess, cvars: &[String], fast_t: Option<usize>) -> R {
        let (d, w, base) = (a.d, a.w, &a.base);
        self.line("#pragma unroll")?;
        self.open(format!("for (int j = 0; j < {w}; ++j)"))?;
        let mut cj = cvars.to_vec();
        if let Some(ft) = fast_t {
            if w > 1 {
                cj[ft] = format!("({} + j)", cvars[ft]);
            }
        }
        let key = if w > 1 { "k0 + j" } else { "k0" };
        let own_j = a.owner_test(key);
        let mut cond = format!("{}{}", a.inb(&cj, &own_j), a.gather_ok(self, key));
        if let Some(m) = a.mask {
            cond = format!("{cond} && {}", self.reg(m, "k0 + j"));
        }
        let aj = format!("{}{}", a.addr(self, &cj), a.gather_term(self, key));
        match a.store {
            None => {
                let zero = if d == DType::Bool { "false" } else { "0" };
                self.line(format!("{}[k0 + j] = ({cond}) ? {} : {zero};", a.val.name, to_reg(d, &format!("{base}[{aj}]"))))?;
            }
            Some(sv) => {
                self.line(format!("if ({cond}) {base}[{aj}] = {};", from_reg(d, &self.reg(sv, "k0 + j"))))?;
            }
        }
        self.close()
    }

    /// The bounds of a block access, written before it: the scalar condition of its
    /// index dimensions (`kf_okN`, and whether it is plain `true`), and per tile axis
    /// the tensor dimension, the remaining extent (`None`: in bounds everywhere), the
    /// lower bound (`None`: the offset is not negative) and the extent.
    fn access_bounds(&mut self, dims: &[AccessDim], offs: &[ValueId], tdims: &[kfuse_ir::ShapeSym], off: &[String]) -> Result<(String, bool, Vec<TileDim>), CodegenError> {
        let k = self.k;
        let nonneg: Vec<bool> = offs.iter().map(|o| non_negative(k, *o)).collect();
        let whole = whole_tiles(k, self.spec, &self.grid, dims, offs, tdims);
        let mut ok = Vec::new();
        let mut tile_dims = Vec::new();
        for (dd, ad) in dims.iter().enumerate() {
            let n = self.shape_var(tdims[dd]);
            match ad {
                AccessDim::Index => {
                    if nonneg[dd] {
                        ok.push(format!("{} < {n}", off[dd]));
                    } else {
                        ok.push(format!("{} >= 0 && {} < {n}", off[dd], off[dd]));
                    }
                }
                AccessDim::Tile(e) => {
                    let exact = whole || whole_axis(k, self.spec, *e, offs[dd], tdims[dd]);
                    let rem = if exact {
                        None
                    } else {
                        let rem = self.fresh("kf_r");
                        self.line(format!("const long long {rem} = {n} - {};", off[dd]))?;
                        Some(rem)
                    };
                    let lo = if nonneg[dd] { None } else { Some(format!("(-{})", off[dd])) };
                    tile_dims.push((dd, rem, lo, extent_value(k, *e)));
                }
                // the gathered axis, once: each register's coordinates are tested apart
                AccessDim::Gather(e) => {
                    if !tile_dims.iter().any(|t| t.0 == GATHERED) {
                        tile_dims.push((GATHERED, None, None, extent_value(k, *e)));
                    }
                }
            }
        }
        let okv = self.fresh("kf_ok");
        let okv_true = ok.is_empty();
        self.line(format!("const bool {okv} = {};", if ok.is_empty() { "true".to_string() } else { ok.join(" && ") }))?;
        Ok((okv, okv_true, tile_dims))
    }

    /// Declares `c0, c1, …`: the coordinates of register `k0` along each of the access's
    /// `n` tile axes; returns their names.
    fn group_coords(&mut self, val: &Val, map: &RegMap, n: usize) -> Result<Vec<String>, CodegenError> {
        let mut cvars = Vec::new();
        for t in 0..n {
            let c = match val.axis_map[t] {
                None => "0".to_string(),
                Some(i) => coord(map, i, "k0"),
            };
            self.line(format!("const int c{t} = {c};"))?;
            cvars.push(format!("c{t}"));
        }
        Ok(cvars)
    }

    /// The element offset from the tile's base pointer of the coordinates `cv` (one per
    /// tile axis of the access).
    fn tile_offset(&self, tensor: kfuse_ir::ParamId, tile_dims: &[TileDim], cv: &[String]) -> String {
        let mut a = String::new();
        for (t, (dd, _, _, _)) in tile_dims.iter().enumerate() {
            if cv[t] == "0" || *dd == GATHERED {
                continue;
            }
            let st = self.stride(tensor, *dd);
            let term = if st == "1" { cv[t].clone() } else { format!("(long long){} * {st}", cv[t]) };
            a = if a.is_empty() { term } else { format!("{a} + {term}") };
        }
        if a.is_empty() {
            "0".into()
        } else {
            a
        }
    }

    /// The C test that every register of a loaded tile lies inside the tensor (so the
    /// load needs no mask), or `None` when the masks are compile-time true already.
    /// Per masked tile axis: the remaining extent covers the largest coordinate any
    /// thread holds, and the offset is not negative.
    fn whole_tile_test(&self, okv: &str, tile_dims: &[TileDim], val: &Val, map: &RegMap) -> Option<String> {
        let mut c = Vec::new();
        for (t, (_, rem, lo, _)) in tile_dims.iter().enumerate() {
            if let Some(rem) = rem {
                let cover = match val.axis_map[t] {
                    None => 1,
                    Some(i) => {
                        let m = &map.axes[i];
                        let local = if m.replicated() {
                            m.piece
                        } else {
                            (m.reps - 1) * m.chunk + (m.wpb - 1) * m.warp_step + (m.tpw - 1) * m.lane_step + (m.spt - 1) * m.elem_step + 1
                        };
                        (m.ctas - 1) * m.piece + local
                    }
                };
                c.push(format!("{rem} >= {cover}"));
            }
            if let Some(l) = lo {
                c.push(format!("{l} <= 0"));
            }
        }
        if c.is_empty() {
            return None;
        }
        c.insert(0, okv.to_string());
        Some(c.join(" && "))
    }
}

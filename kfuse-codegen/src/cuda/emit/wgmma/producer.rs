//! The WGMMA kernel's pipeline and producer: the stage ring's mbarriers, the walk over
//! the output tiles that producer and consumers share (with each tile's program ids and
//! the loop's share of a split), and the producer warpgroup whose first thread issues
//! the operands' TMA loads.

use super::*;

/// The persistent walk over the output tiles: every tile, or under a split last wave
/// (`MmaPlan::walk`) the whole waves' tiles (one block each) or the last tiles (one
/// cluster each).
pub(super) fn tile_walk(walk: Walk, cluster: u32, split: u32) -> Result<String, CodegenError> {
    Ok(match (walk, cluster) {
        (Walk::All, 1) => "for (long long kf_t = blockIdx.x; kf_t < kf_tiles; kf_t += gridDim.x)".to_string(),
        (Walk::All, c) => format!("for (long long kf_t = blockIdx.x / {c}; kf_t < kf_tiles; kf_t += gridDim.x / {c})"),
        (Walk::WholeWaves, 1) => {
            "for (long long kf_t = blockIdx.x; kf_t < kf_tiles / gridDim.x * gridDim.x; kf_t += gridDim.x)".to_string()
        }
        // (one tile a cluster: the epilogue's shared memory reuses the ring)
        (Walk::LastTiles { .. }, c) if c > 1 && split > 1 => format!(
            "for (long long kf_t = kf_maxi(0LL, kf_tiles - (long long)(gridDim.x / {c})) + blockIdx.x / {c}; kf_t < kf_tiles; kf_t = kf_tiles)"
        ),
        (w, c) => return Err(CodegenError::Unsupported(format!("the tile walk {w:?} in clusters of {c}"))),
    })
}

impl WgmmaKernel<'_> {
    /// The stage ring in dynamic shared memory and its mbarriers (full, empty per stage;
    /// two for a split's hand-off), initialized by thread 0 before the block (or the
    /// cluster) goes on, then the tile count of the walk.
    pub(super) fn barriers(&self, e: &mut Emitter) -> R {
        let (stages, stage_bytes, consumers) = (self.plan.stages, self.stage_bytes, self.plan.consumers);
        e.line("extern __shared__ __align__(1024) unsigned char kf_dsmem[];")?;
        e.line("unsigned char* kf_pipe = (unsigned char*)((((unsigned long long)kf_dsmem) + 1023ull) & ~1023ull);")?;
        e.line(format!("unsigned long long* kf_full = (unsigned long long*)(kf_pipe + {});", stages * stage_bytes))?;
        e.line(format!("unsigned long long* kf_empty = kf_full + {stages};"))?;
        e.line(format!("unsigned long long* kf_red = kf_full + {};", 2 * stages))?;
        e.line("(void)kf_red;")?;
        e.open("if (kf_tid == 0)")?;
        e.unroll("s", stages)?;
        e.line("kf_mbar_init(&kf_full[s], 1);")?;
        // a stage is released by every warp that read it: all consumers' (ping-pong: the
        // one warpgroup whose tile it holds), in every block that multicast into it
        let readers = if self.pp { 4 } else { consumers * 4 };
        e.line(format!("kf_mbar_init(&kf_empty[s], {});", readers * self.mcast))?;
        e.close()?;
        if self.split > 1 {
            // kf_red[0]: partials ready (the first block: every warp of the others);
            // kf_red[1]: partial read (the others: every warp of the first block)
            e.line(format!("kf_mbar_init(&kf_red[0], {});", (self.split - 1) * consumers * 4))?;
            e.line(format!("kf_mbar_init(&kf_red[1], {});", consumers * 4))?;
        }
        e.line("asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");")?;
        e.close()?;
        // the cluster's blocks reach each other's barriers: all initialized first
        e.line(if self.cluster > 1 { "kf_cluster_sync();" } else { "__syncthreads();" })?;
        self.tile_count(e)
    }

    /// `kf_tiles`, the tiles of the walk: every problem's in a grouped launch (see
    /// [`Self::tile_pids`]), else the product of the program counts per grid axis (a
    /// multicast cluster counting once along its axis); and a cluster's block rank.
    fn tile_count(&self, e: &mut Emitter) -> R {
        let (mcast, cluster) = (self.mcast, self.cluster);
        if self.grouped {
            e.line(format!("const long long* kf_last = kf_grp + (kf_ngrp - 1) * {};", self.rec))?;
            e.line("const long long kf_tiles = kf_last[3] + kf_last[0] * kf_last[1] * kf_last[2];")?;
            return Ok(());
        }
        let mut total = Vec::new();
        for (i, a) in self.grid.iter().enumerate() {
            let n = e.shape_var(a.dim);
            e.line(format!("const long long kf_g{i} = ({n} + {}LL) / {}LL;", a.step - 1, a.step))?;
            total.push(format!("kf_g{i}"));
        }
        if mcast > 1 {
            // a program walks groups of `mcast` neighbouring tiles along that axis
            let a = self.mcast_axis;
            e.line(format!("const long long kf_g{a}m = (kf_g{a} + {}LL) / {mcast}LL;", mcast - 1))?;
            total[a] = format!("kf_g{a}m");
        }
        e.line(format!("const long long kf_tiles = {};", total.join(" * ")))?;
        if cluster > 1 {
            e.line(format!("const unsigned kf_crank = blockIdx.x % {cluster};"))?;
        }
        Ok(())
    }

    /// Program ids of tile `kf_t`: axes 0 and 1 grouped `group_m` along axis 0 (`maps`:
    /// the tensor maps the caller reads — a grouped launch binds only those).
    pub(super) fn tile_pids(&self, e: &mut Emitter, maps: &dyn Fn(&str) -> bool) -> R {
        let (r, mcast, mcast_axis, group_m) = (self.grid.len(), self.mcast, self.mcast_axis, self.plan.group_m);
        let t0 = if self.grouped {
            // the tile's problem: the last whose first tile is at or before it; its
            // record binds the parameters' names for this tile
            let rec = self.rec;
            e.line("long long kf_gi = 0;")?;
            e.line(format!("while (kf_gi + 1 < kf_ngrp && kf_t >= kf_grp[(kf_gi + 1) * {rec} + 3]) ++kf_gi;"))?;
            e.line(format!("const long long* kf_rec = kf_grp + kf_gi * {rec};"))?;
            e.line("const long long kf_g0 = kf_rec[0], kf_g1 = kf_rec[1];")?;
            e.line("(void)kf_g0; (void)kf_g1;")?;
            bind_group_params(&mut e.w, &self.decls, maps).map_err(fmt_err)?;
            "(kf_t - kf_rec[3])"
        } else {
            "kf_t"
        };
        e.line("long long kf_pid0 = 0, kf_pid1 = 0, kf_pid2 = 0;")?;
        if r == 1 {
            e.line(format!("kf_pid0 = {t0};"))?;
        } else {
            e.open("")?;
            e.line(format!("long long t = {t0};"))?;
            // the program counts walked: a multicast cluster is one program of the
            // walk, which spans its axis's groups of `mcast` tiles
            let (g0, g1) = match (mcast > 1, mcast_axis) {
                (false, _) => ("kf_g0", "kf_g1"),
                (true, 1) => ("kf_g0", "kf_g1m"),
                (true, _) => ("kf_g0m", "kf_g1"),
            };
            if r == 3 {
                e.line(format!("kf_pid2 = t / ({g0} * {g1});"))?;
                e.line(format!("t -= kf_pid2 * {g0} * {g1};"))?;
            }
            e.line(format!("const long long per = {group_m}LL * {g1};"))?;
            e.line(format!("const long long first = (t / per) * {group_m}LL;"))?;
            e.line(format!("const long long gm = kf_mini({g0} - first, {group_m}LL);"))?;
            e.line("kf_pid0 = first + (t % per) % gm;")?;
            e.line("kf_pid1 = (t % per) / gm;")?;
            if mcast > 1 {
                e.line(format!("kf_pid{mcast_axis} = kf_pid{mcast_axis} * {mcast} + kf_crank;"))?;
            }
            e.close()?;
        }
        e.pid = Some(vec!["kf_pid0".into(), "kf_pid1".into(), "kf_pid2".into()]);
        Ok(())
    }

    /// The dot loop's start, end and step values.
    pub(super) fn bounds(&self) -> (ValueId, ValueId, ValueId) {
        let for_ops = self.k.operands(self.plan.for_op);
        (for_ops[0], for_ops[1], for_ops[2])
    }

    /// The loop header: all iterations, or this block's contiguous share of them.
    pub(super) fn loop_head(&self, e: &mut Emitter) -> Result<String, CodegenError> {
        let (lo, hi, step) = self.bounds();
        let (l, h, s) = (e.val(lo).name.clone(), e.val(hi).name.clone(), e.val(step).name.clone());
        let (split, index_name) = (self.split, &self.index_name);
        if split == 1 {
            return Ok(format!("for (long long {index_name} = {l}; {index_name} < {h}; {index_name} += {s})"));
        }
        e.line(format!("const long long kf_nit = {h} > {l} ? ({h} - {l} + {s} - 1) / {s} : 0LL;"))?;
        e.line(format!("const long long kf_it0 = kf_nit * kf_crank / {split}, kf_it1 = kf_nit * (kf_crank + 1) / {split};"))?;
        Ok(format!("for (long long {index_name} = {l} + kf_it0 * {s}; {index_name} < {l} + kf_it1 * {s}; {index_name} += {s})"))
    }

    /// Registers of a producer and a consumer thread (`setmaxnreg`): the consumers of a
    /// 256-wide tile hold 128 accumulators each and take 240 (232 spilled a bias
    /// epilogue), leaving the producer 24; narrower tiles leave the producer 56 (its
    /// split-loop index arithmetic spilled at 24 and at 40). Several dots count their
    /// accumulators together (two 128-wide ones as one 256-wide).
    pub(super) fn register_split(&self) -> (u32, u32) {
        let bn = self.plan.tile[1];
        let acc_cols = if self.pp { 2 * bn } else { bn } * self.dots.len() as u32;
        match (self.plan.consumers, acc_cols > 128) {
            (1, _) => (40, 256),
            // a multicasting producer needs a few more (it spilled at 24); a split kernel
            // spilled 16 bytes at 40 / 232 (SPLITK=4 at 128x256) and builds at 56 / 224
            (_, true) if self.split > 1 => (56, 224),
            (_, true) if self.cluster > 1 => (40, 232),
            (_, true) => (24, 240),
            (_, false) => (56, 216),
        }
    }

    /// The producer warpgroup: its first thread walks the tiles and, per iteration of
    /// each tile's loop, waits for a free stage and loads every operand tile into it.
    pub(super) fn producer(&self, e: &mut Emitter) -> R {
        let k = self.k;
        let (lo, hi, step) = self.bounds();
        e.open("if (kf_tid < 128)")?;
        let (prod_regs, _) = self.register_split();
        e.line(format!("asm volatile(\"setmaxnreg.dec.sync.aligned.u32 {prod_regs};\" ::: \"memory\");"))?;
        e.open("if (kf_tid == 0)")?;
        e.line("int kf_stage = 0;")?;
        e.line("unsigned kf_phase = 0;")?;
        e.open(self.tile_walk.clone())?;
        // the producer reads the operands' maps, the consumers only the output's
        self.tile_pids(e, &|m: &str| m != self.c_map_name)?;
        let mut roots = vec![lo, hi, step];
        for o in self.plan.stage_operands() {
            roots.extend(k.operands(o.load));
        }
        let slice = scalar_slice(k, &roots, 0)?;
        for &o in slice.iter().filter(|o| k.position(**o) < self.info.for_pos) {
            e.op(o)?;
        }
        e.line(format!("if (!({} > 0)) __trap();", e.val(step).name))?;
        let head = self.loop_head(e)?;
        e.open(head)?;
        for &o in slice.iter().filter(|o| k.position(**o) > self.info.for_pos) {
            e.op(o)?;
        }
        let stage_bytes = self.stage_bytes;
        e.line("kf_mbar_wait(&kf_empty[kf_stage], kf_phase ^ 1u);")?;
        e.line(format!("kf_mbar_expect_tx(&kf_full[kf_stage], {stage_bytes}u);"))?;
        e.line(format!("unsigned char* kf_sa = kf_pipe + kf_stage * {stage_bytes};"))?;
        for (i, &off) in self.at.iter().enumerate().skip(1) {
            e.line(format!("unsigned char* {} = kf_sa + {off};", stage_ptr(i)))?;
        }
        for (i, op) in self.operands.iter().enumerate() {
            self.load_operand(e, i, op)?;
        }
        e.line(format!("if (++kf_stage == {}) {{ kf_stage = 0; kf_phase ^= 1u; }}", self.plan.stages))?;
        e.close()?; // k loop
        e.close()?; // tiles
        e.close()?; // thread 0
        e.close() // producer
    }

    /// The TMA loads of stage operand `i` into its place in the stage, box by box; a
    /// multicast operand's box `q` is loaded by the block of rank `q % mcast` into every
    /// block of the cluster.
    fn load_operand(&self, e: &mut Emitter, i: usize, op: &Operand) -> R {
        let dst = stage_ptr(i);
        let r = op.boxes.len();
        if !(2..=3).contains(&r) {
            return Err(CodegenError::Unsupported(format!("a rank-{r} dot operand tensor (TMA here takes rank 2 and 3)")));
        }
        let mcast = self.mcast;
        let multicast = mcast > 1 && i == self.shared;
        for q in 0..op.nq {
            // coordinates innermost first
            let mut c: Vec<String> = op.order.iter().map(|&d| format!("(int){}", op.offs[d as usize])).collect();
            if q > 0 {
                let slot = if op.outer_slices { 1 } else { 0 };
                let d = op.order[slot] as usize;
                c[slot] = format!("(int)({} + {})", op.offs[d], q * op.boxes[d]);
            }
            if multicast {
                // box q is this block's when q % cluster == its rank; it lands in every block
                e.line(format!(
                    "if (kf_crank == {}) kf_tma_2d_mc({dst} + {}, &{}, {}, &kf_full[kf_stage], (unsigned short){});",
                    q % mcast,
                    q * op.box_bytes,
                    op.map,
                    c.join(", "),
                    (1u32 << mcast) - 1
                ))?;
            } else {
                e.line(format!("kf_tma_{r}d({dst} + {}, &{}, {}, &kf_full[kf_stage]);", q * op.box_bytes, op.map, c.join(", ")))?;
            }
        }
        Ok(())
    }
}

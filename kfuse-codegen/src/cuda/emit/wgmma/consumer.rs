//! The WGMMA kernel's consumer warpgroups: per tile, the main loop that waits on a
//! stage, issues every dot's `wgmma`s from its shared-memory descriptors and releases
//! the stage; a split loop's reduction of partial accumulators across the cluster; and
//! the epilogue on the accumulator registers.

use crate::cuda::emit::tma_store::TmaOut;
use super::*;

impl WgmmaKernel<'_> {
    /// The consumer warpgroups (registers raised), each walking the tiles of the block.
    pub(super) fn consumers(&self, e: &mut Emitter) -> R {
        e.open("else")?;
        let (_, cons_regs) = self.register_split();
        e.line(format!("asm volatile(\"setmaxnreg.inc.sync.aligned.u32 {cons_regs};\" ::: \"memory\");"))?;
        self.consumer_state(e)?;
        // ping-pong: warpgroup w takes the block's tiles w, w + 2, …
        let consumer_walk = if self.pp {
            format!("for (long long kf_t = blockIdx.x + kf_wg * gridDim.x; kf_t < kf_tiles; kf_t += {} * gridDim.x)", self.plan.consumers)
        } else {
            self.tile_walk.clone()
        };
        e.open(consumer_walk)?;
        self.tile_pids(e, &|m: &str| m == self.c_map_name)?;
        // everything before the loop (but the zeros that only feed the inits), the zeroed
        // accumulators
        let regs = self.regs();
        let ranges = zeroed_accumulators(e, self.plan, self.info.for_pos, regs)?;
        e.line("int kf_prev = -1;")?;
        let release = self.release();
        let (_, _, step) = self.bounds();
        e.line(format!("if (!({} > 0)) __trap();", e.val(step).name))?;
        if self.pp {
            self.pingpong_turn(e)?;
        }
        self.main_loop(e, &release)?;
        if self.pp {
            // the other warpgroup's turn (its next tile, if the block has one)
            e.line("if (kf_t + gridDim.x < kf_tiles) asm volatile(\"bar.arrive %0, 256;\" :: \"r\"(3 + (kf_wg ^ 1)) : \"memory\");")?;
        }
        e.line("kf_wgmma_wait<0>();")?;
        self.unfold_accumulators(e)?;
        e.line(release)?;
        if self.split > 1 {
            self.reduce_split(e)?;
        }
        self.epilogue(e, ranges)?;
        e.close() // consumers
    }

    /// The consumer's warp ids and ring state, and the operands' shared-memory
    /// descriptors at stage 0 and k-step 0, made once: a k-step's descriptor adds its
    /// offset in 16-byte units to the start-address field, in the low word
    /// (`kf_desc_at`; no carry leaves it, shared memory being under 2^18 bytes). Made in
    /// the loop from the stage's pointer, each cost ~10 instructions a wgmma, a third of
    /// the consumers' instructions at M8192 N4096 K14336 (NOTES g27).
    fn consumer_state(&self, e: &mut Emitter) -> R {
        if self.pp {
            // each warpgroup holds its own tiles: warps 0..3 of the layout, in each
            e.line("const int kf_wg = ((kf_tid >> 5) - 4) >> 2;")?;
            e.line("const int kf_warp = ((kf_tid >> 5) - 4) & 3;")?;
        } else {
            e.line("const int kf_warp = (kf_tid >> 5) - 4;")?;
            e.line("const int kf_wg = kf_warp >> 2;")?;
        }
        e.line("(void)kf_warp; (void)kf_wg;")?;
        e.line("int kf_stage = 0;")?;
        e.line("unsigned kf_phase = 0;")?;
        e.line("unsigned kf_rphase = 0;")?;
        e.line("(void)kf_rphase;")?;
        let mut based: Vec<usize> = Vec::new();
        for i in self.dots.iter().flat_map(|d| [self.op_index(d.a.load), self.op_index(d.b.load)]) {
            if based.contains(&i) {
                continue;
            }
            based.push(i);
            let (half_step, _, lbo) = self.operands[i].desc_steps();
            let wg = if half_step > 0 && !self.pp { format!(" + kf_wg * {half_step}") } else { String::new() };
            e.line(format!("const unsigned long long {} = kf_desc128(kf_pipe + {}{wg}, {lbo}, 1024);", desc_base(i), self.at[i]))?;
        }
        Ok(())
    }

    /// The release of the stage read last: a stage is free once every block that
    /// multicasts into it may overwrite it, so the consumers release it in every block of
    /// the cluster (an arrive with the default CTA-scope release: the stage's readers are
    /// this warpgroup's finished wgmmas; a cluster-scope release on every stage halved
    /// the speed, 4096³ 334 vs 703 TFLOP/s).
    fn release(&self) -> String {
        if self.mcast > 1 {
            format!("if (kf_prev >= 0 && kf_lane == 0) {{ for (unsigned r = 0; r < {}u; ++r) kf_mbar_arrive_remote(&kf_empty[kf_prev], r); }}", self.mcast)
        } else {
            "if (kf_prev >= 0 && kf_lane == 0) kf_mbar_arrive(&kf_empty[kf_prev]);".to_string()
        }
    }

    /// Ping-pong: the producer loads every tile of the block in walk order, so the other
    /// warpgroup's tile (the one before this, when this is not the block's first) takes
    /// the ring's next `iterations` stages: step over them. And wait for the turn: a
    /// warpgroup starts a loop only once the other has waited on the last stage of its
    /// tile (named barrier 3 + kf_wg, arrived at after the loop), so that this loop's
    /// first full barrier is at most one phase from its parity.
    fn pingpong_turn(&self, e: &mut Emitter) -> R {
        let stages = self.plan.stages;
        let (lo, hi, step) = self.bounds();
        let (l, h, s) = (e.val(lo).name.clone(), e.val(hi).name.clone(), e.val(step).name.clone());
        e.open("if (kf_t >= (long long)blockIdx.x + gridDim.x)")?;
        e.line("asm volatile(\"bar.sync %0, 256;\" :: \"r\"(3 + kf_wg) : \"memory\");")?;
        e.line(format!("const int kf_skip = kf_stage + (int)({h} > {l} ? ({h} - {l} + {s} - 1) / {s} : 0LL);"))?;
        e.line(format!("kf_phase ^= (unsigned)((kf_skip / {stages}) & 1);"))?;
        e.line(format!("kf_stage = kf_skip % {stages};"))?;
        e.close()
    }

    /// One tile's loop: wait for the stage, issue each K step's wgmmas, commit, keep one
    /// group in flight and release the stage read before.
    fn main_loop(&self, e: &mut Emitter, release: &str) -> R {
        let head = self.loop_head(e)?;
        e.open(head)?;
        e.line("kf_mbar_wait(&kf_full[kf_stage], kf_phase);")?;
        e.line(format!("const unsigned kf_so = (unsigned)kf_stage * {}u;", self.stage_bytes / 16))?;
        e.line("kf_wgmma_fence();")?;
        e.unroll("kk", self.plan.tile[2] / self.plan.instr[2])?;
        self.k_step(e)?;
        e.close()?;
        e.line("kf_wgmma_commit();")?;
        e.line("kf_wgmma_wait<1>();")?;
        e.line(release)?;
        e.line("kf_prev = kf_stage;")?;
        e.line(format!("if (++kf_stage == {}) {{ kf_stage = 0; kf_phase ^= 1u; }}", self.plan.stages))?;
        e.close() // k loop
    }

    /// One instruction K step `kk` of every dot: per dot, A, this warpgroup's 64 rows (a
    /// descriptor per distinct A tile); B, all columns; the instruction variant of its
    /// operands' majorness. Under ping-pong the whole tile: rows 0..64 into the first
    /// half of the accumulator, rows 64..128 into the second.
    fn k_step(&self, e: &mut Emitter) -> R {
        let half = self.plan.tile[1] / 2;
        let mut described = Vec::new();
        for (j, d) in self.dots.iter().enumerate() {
            let (ia, ib) = (self.op_index(d.a.load), self.op_index(d.b.load));
            let ((a_off, a_k, _), (_, b_k, _)) = (self.operands[ia].desc_steps(), self.operands[ib].desc_steps());
            let suffix = |i: usize| if i <= 1 { String::new() } else { i.to_string() };
            let (da, db) = (format!("da{}", suffix(ia)), format!("db{}", suffix(ib)));
            let (base_a, base_b) = (desc_base(ia), desc_base(ib));
            let (a_k, b_k) = (a_k / 16, b_k / 16);
            let (f, acc) = (wgmma_name(&self.dots[0], d), accumulator_name(j));
            if self.pp {
                e.line(format!("const unsigned long long {da} = kf_desc_at({base_a}, kf_so + kk * {a_k});"))?;
                e.line(format!("const unsigned long long {da}_hi = kf_desc_at({base_a}, kf_so + {} + kk * {a_k});", a_off / 16))?;
                e.line(format!("const unsigned long long {db} = kf_desc_at({base_b}, kf_so + kk * {b_k});"))?;
                e.line(format!("{f}({acc}, {da}, {db});"))?;
                e.line(format!("{f}({acc} + {half}, {da}_hi, {db});"))?;
                continue;
            }
            if !described.contains(&ia) {
                e.line(format!("const unsigned long long {da} = kf_desc_at({base_a}, kf_so + kk * {a_k});"))?;
                described.push(ia);
            }
            e.line(format!("const unsigned long long {db} = kf_desc_at({base_b}, kf_so + kk * {b_k});"))?;
            e.line(format!("{f}({acc}, {da}, {db});"))?;
        }
        Ok(())
    }

    /// The epilogue reads the accumulators through an add of +0 (which the compilers
    /// cannot fold: it turns -0 into +0, a value the accumulators, zeroed to +0, never
    /// hold): read directly by some instructions (f16 conversions at 64- and 128-wide
    /// tiles), ptxas serializes every wgmma of the loop (C7514: f16 at M127 ran 1.2x
    /// slower with 8 stages, 3.5x with 4); `tests/common::assemble` refuses that warning.
    /// Only epilogues that make f16 values need it: bf16, fp8 and f32 ones did not draw
    /// the warning, and the add costs 128 instructions a thread (~0.4% at 4096³).
    fn unfold_accumulators(&self, e: &mut Emitter) -> R {
        let k = self.k;
        let makes_f16 = k.order[self.info.yield_pos + 1..].iter().any(|&o| k.op(o).has_result() && k.ty(o.value()).dtype == DType::F16);
        for j in (0..self.dots.len()).filter(|_| makes_f16) {
            let acc = accumulator_name(j);
            e.unroll("i", self.regs())?;
            e.line(format!("{acc}[i] = {acc}[i] + 0.0f;"))?;
            e.close()?;
        }
        Ok(())
    }

    /// A split loop's partial sums meet in the first block of the cluster, which alone
    /// goes on: the others write theirs into their shared memory and go to their next
    /// tile; the first adds them up from distributed shared memory.
    fn reduce_split(&self, e: &mut Emitter) -> R {
        let (split, regs) = (self.split, self.regs());
        let threads = self.plan.consumers * 128;
        e.line(format!("float* kf_part = reinterpret_cast<float*>(kf_pipe + {});", self.c_off))?;
        e.open("if (kf_crank != 0)")?;
        // (at cluster scope: the first block's reads of the previous partial, released
        // by its remote arrive, come before this block overwrites it)
        e.line("kf_mbar_wait_cluster(&kf_red[1], kf_rphase ^ 1u);")?;
        if self.aliased {
            // the partial goes over the ring: both warpgroups' last wgmmas read it first
            e.line("asm volatile(\"bar.sync 1, %0;\" :: \"n\"(KF_CONSUMERS * 128) : \"memory\");")?;
        }
        e.unroll("i", regs)?;
        e.line(format!("kf_part[i * {threads} + (kf_tid - 128)] = kf_acc[i];"))?;
        e.close()?;
        e.line("__syncwarp();")?;
        e.line("if (kf_lane == 0) kf_mbar_arrive_cluster(&kf_red[0], 0);")?;
        e.line("kf_rphase ^= 1u;")?;
        e.line("continue;")?;
        e.close()?;
        e.line("kf_mbar_wait_cluster(&kf_red[0], kf_rphase);")?;
        e.unroll("r", split - 1)?;
        e.unroll("i", regs)?;
        e.line(format!("kf_acc[i] += kf_ld_cluster_f32(kf_part + i * {threads} + (kf_tid - 128), r + 1);"))?;
        e.close()?;
        e.close()?;
        e.line("__syncwarp();")?;
        e.open("if (kf_lane == 0)")?;
        e.unroll("r", split - 1)?;
        e.line("kf_mbar_arrive_cluster(&kf_red[1], r + 1);")?;
        e.close()?;
        e.close()?;
        e.line("kf_rphase ^= 1u;")
    }

    /// Everything after the loop, on the accumulator registers (`ranges`: their valid
    /// ranges, per dot), the output tile leaving through shared memory and TMA where the
    /// plan says so; then the end of the tile walk.
    fn epilogue(&self, e: &mut Emitter, ranges: Vec<AccRanges>) -> R {
        let (k, pp, regs) = (self.k, self.pp, self.regs());
        // the output tile's shared memory and the thread that issues its bulk store: the
        // first consumer thread, or under ping-pong each warpgroup's first and its own tile
        let c_base = if pp { format!("{} + kf_wg * {}", self.c_off, self.c_bytes) } else { self.c_off.to_string() };
        let lead = if pp { "(kf_tid & 127) == 0" } else { "kf_tid == 128" };
        for ((j, d), r) in self.dots.iter().enumerate().zip(ranges) {
            let (res, map) = accumulator_map_of(k, &self.info, d.carried)?;
            if map.regs != regs {
                return Err(CodegenError::Unsupported(format!("accumulator layout of {} registers, instruction gives {regs}", map.regs)));
            }
            e.vals.insert(res, accumulator_val_named(self.plan, &accumulator_name(j), map, r));
        }
        let out = self.c_map.map(|c| {
            let out = TmaOut { base: "kf_pipe", saddr: "kf_smem_addr", c_base: &c_base, inner: c.inner, box_bytes: c.box_bytes, buffers: self.plan.store_buffers, map_name: &self.c_map_name, lead };
            (c.store, out)
        });
        for &o in &k.order[self.info.yield_pos + 1..] {
            if matches!(k.op(o), Op::LoopResult { .. }) {
                continue;
            }
            match &out {
                Some((st, out)) if *st == o => {
                    e.tma_store(o, out)?;
                }
                _ => e.op(o)?,
            }
        }
        if pp && e.smem > 0 {
            // (static shared memory is one buffer for both warpgroups' epilogues)
            return Err(CodegenError::Unsupported(format!(
                "ping-pong consumers with an epilogue that needs {} bytes of static shared memory (leave PINGPONG out of the tile overrides)",
                e.smem
            )));
        }
        if e.smem > 0 {
            // the epilogue's shared memory is reused by the next tile
            let b = e.barrier;
            e.line(b)?;
        }
        e.close()?; // tiles
        if self.c_map.is_some() {
            // shared memory must outlive the last bulk store's reads
            e.line(format!("if ({lead}) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");"))?;
        }
        Ok(())
    }
}

//! The plan of a compiled kernel: what the scheduling passes decided for one
//! specialization and target, as a reader asks about it — the matrix path and why,
//! tiles, pipeline stages, warps and warpgroups, cluster, persistence, shared memory —
//! plus, once an assembler has built the kernel, its registers and local memory.
//!
//! Owns: [`Plan`], built by [`crate::compile`] from the scheduled kernel
//! ([`Plan::of_scheduled`]) and carried by every [`EmittedKernel`]
//! (`EmittedKernel::plan`). The facts are the schedule's (`kfuse_ir::Schedule`, which the
//! IR printer also shows) and the writer's: how each `dot` runs, the block size and the
//! shared memory it declared. Registers and local memory are not codegen's to know: the runtime fills them
//! in from the driver when it loads a kernel, and `kfuse::explain` from `ptxas -v`.
//!
//! [`EmittedKernel`]: crate::EmittedKernel

use std::collections::BTreeMap;
use std::fmt;

use kfuse_ir::Kernel;

use crate::cuda::emit::Emitted;

/// What the passes decided for one compiled kernel (see the module docs). `Display`
/// writes it as a few indented lines, one topic each.
///
/// ```
/// use kfuse_codegen::Plan;
///
/// // a hand-written kernel's emitted plan says little; `compile` fills it in
/// let plan = Plan { kernel: "add".into(), arch: "sm_90a".into(), block_threads: 256, ..Plan::default() };
/// let text = plan.to_string();
/// assert!(text.starts_with("plan of add for sm_90a"));
/// assert!(text.contains("block: 256 threads (8 warps)"));
/// assert!(text.contains("registers: not assembled"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    /// The kernel's name (`gemm`).
    pub kernel: String,
    /// The architecture it was compiled for (`sm_90a`).
    pub arch: String,
    /// How the kernel's `dot`s are lowered (each where it stands: as a matrix loop on
    /// the tensor cores, or not and why), when it has dots.
    pub dots_one_by_one: Option<String>,
    /// How each of those dots runs, in op order (the writer's rule: `wgmma`, `mma.sync`
    /// or FMAs, and where the operands come from), after a line saying how the operand
    /// rings are filled where a producer warpgroup fills them; a store that leaves
    /// through shared memory by TMA bulk stores has its line among them, in op order.
    pub dots: Vec<String>,
    /// Threads a block (on the WGMMA path the consumer warpgroups and the producer).
    pub block_threads: u32,
    /// Blocks a multiprocessor the register allocator leaves room for
    /// (`__launch_bounds__`); 0: the assembler's choice.
    pub min_blocks: u32,
    /// The chosen size of each tile symbol, by name.
    pub tiles: BTreeMap<String, u32>,
    /// The loops written unrolled, one line each (`loop at line 12: unrolled, 3
    /// iterations (R = 3 at this launch)`).
    pub loops: Vec<String>,
    /// Blocks a thread-block cluster (1: no clusters).
    pub cluster: u32,
    /// A persistent kernel: at most this many programs (clusters) a launch, each block
    /// walking the programs (times the blocks a multiprocessor holds, without clusters).
    pub persistent: Option<u32>,
    /// Program axis 0 launched from its last program (`Schedule::longest_first`).
    #[serde(default)]
    pub longest_first: bool,
    /// A row too long for one block walked in chunks by loops (`chunk_rows`): the row's
    /// padded length, the chunk and the number of passes over the row.
    pub row_chunks: Option<(u32, u32, u32)>,
    /// Shared memory the source declares, in bytes.
    pub static_smem_bytes: u32,
    /// The dynamic shared memory a launch asks for, in bytes (the matrix path's
    /// pipeline buffers).
    pub dynamic_smem_bytes: u32,
    /// Which register-room attempt this is (0-based) and how many the kernel has (a later
    /// one is compiled when the assembler spills this one).
    pub register_attempt: (u32, u32),
    /// Registers a thread, once an assembler built the kernel (the driver's at load,
    /// `ptxas -v` in `kfuse::explain`); `None` from codegen.
    pub registers: Option<u32>,
    /// Local memory a thread in bytes (spills: kfuse's kernels have no other), with
    /// [`Plan::registers`].
    pub local_bytes: Option<u32>,
    /// Tensor arguments the launch copied before running the kernel, and why: a
    /// read-only operand of the matrix loop whose rows TMA (or `cp.async`) cannot read
    /// as they lie, copied to rows padded to whole 128-byte lines (`operand `b` copied to
    /// a padded pitch of 4160 elements: row pitch 8194 bytes is not a multiple of 16`).
    /// Filled in by the runtime (a launch's `Launched::plan`, `kfuse::explain`,
    /// `kfuse::runtime::emit`); empty from codegen, which compiles for the tensors it is
    /// given.
    pub operand_copies: Vec<String>,
}

impl Plan {
    /// Whether the kernel's `dot`s run on the tensor cores: its matrix loop on a matrix
    /// path, or each dot lowered where it stands on `wgmma` or `mma.sync` (false for a
    /// kernel without dots).
    pub fn tensor_cores(&self) -> bool {
        let dots: Vec<&String> = self.dots.iter().filter(|d| d.starts_with('`')).collect();
        !dots.is_empty() && dots.iter().all(|d| d.contains(": wgmma m") || d.contains(": mma.sync"))
    }

    /// The plan of a scheduled kernel `k` (after `crate::schedule`) compiled for `arch`,
    /// with what the writer made of it (`written`: threads a block, shared memory
    /// declared in the source and asked for at launch, persistence) and its cluster.
    pub fn of_scheduled(k: &Kernel, arch: &str, written: &Emitted, cluster: u32) -> Plan {
        let s = &k.schedule;
        Plan {
            kernel: k.name.clone(),
            arch: arch.to_string(),
            dots_one_by_one: s.dots_one_by_one.clone(),
            dots: written.dot_notes.clone(),
            loops: written.loop_notes.clone(),
            block_threads: written.block_threads,
            min_blocks: s.min_blocks,
            tiles: s.tiles.iter().map(|(t, v)| (k.tile_name(*t).to_string(), *v)).collect(),
            cluster: cluster.max(1),
            persistent: written.persistent,
            longest_first: s.longest_first,
            row_chunks: s.row_chunks.map(|c| (c.row, c.chunk, c.passes)),
            static_smem_bytes: written.static_smem,
            dynamic_smem_bytes: written.dynamic_smem,
            register_attempt: s.register_attempt,
            registers: None,
            local_bytes: None,
            operand_copies: Vec::new(),
        }
    }

    /// The same plan with what an assembler reported: registers and local memory a
    /// thread.
    pub fn assembled(&self, registers: u32, local_bytes: u32) -> Plan {
        Plan { registers: Some(registers), local_bytes: Some(local_bytes), ..self.clone() }
    }

    /// Shared memory a block in bytes, static and dynamic together.
    pub fn smem_bytes(&self) -> u32 {
        self.static_smem_bytes + self.dynamic_smem_bytes
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plan of {} for {}", self.kernel, self.arch)?;
        for c in &self.operand_copies {
            writeln!(f, "  {c}")?;
        }
        match &self.dots_one_by_one {
            Some(why) => {
                writeln!(f, "  dots: {why}")?;
                for d in &self.dots {
                    writeln!(f, "    {d}")?;
                }
            }
            None => writeln!(f, "  dots: none")?,
        }
        let bounds = if self.min_blocks > 0 { format!(", __launch_bounds__ minimum {} block(s) a multiprocessor", self.min_blocks) } else { String::new() };
        writeln!(f, "  block: {} threads ({} warps){bounds}", self.block_threads, self.block_threads / 32)?;
        let cluster = if self.cluster > 1 { format!("clusters of {} blocks", self.cluster) } else { "no clusters".to_string() };
        if let Some(p) = self.persistent {
            let walkers = if self.cluster > 1 { format!("at most {p} clusters") } else { format!("{p} x (blocks a multiprocessor holds) blocks") };
            writeln!(f, "  grid: persistent, {walkers} walking the programs; {cluster}")?;
        } else {
            let order = if self.longest_first { ", axis 0 from its last program (later programs run longer loops)" } else { "" };
            writeln!(f, "  grid: one block a program{order}; {cluster}")?;
        }
        if let Some((row, chunk, passes)) = self.row_chunks {
            let s = if passes > 1 { "es" } else { "" };
            writeln!(f, "  row: {row} elements walked in chunks of {chunk}, {passes} pass{s} over it")?;
        }
        let tiles: Vec<String> = self.tiles.iter().map(|(n, v)| format!("{n}={v}")).collect();
        writeln!(f, "  tiles: {}", if tiles.is_empty() { "none".to_string() } else { tiles.join(" ") })?;
        for l in &self.loops {
            writeln!(f, "  {l}")?;
        }
        writeln!(
            f,
            "  shared memory: {} bytes a block ({} static + {} dynamic)",
            self.smem_bytes(),
            self.static_smem_bytes,
            self.dynamic_smem_bytes
        )?;
        match (self.registers, self.local_bytes) {
            (Some(r), Some(0)) => writeln!(f, "  registers: {r} a thread, no spills")?,
            (Some(r), Some(l)) => writeln!(f, "  registers: {r} a thread, {l} bytes of local memory a thread (spills)")?,
            _ => writeln!(f, "  registers: not assembled")?,
        }
        let (a, n) = self.register_attempt;
        if n > 1 {
            writeln!(f, "  register room: attempt {} of {n} (the next is taken when the assembler spills this one)", a + 1)?;
        }
        Ok(())
    }
}

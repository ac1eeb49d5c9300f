//! Decides whether a kernel recomputes its cheap tile values at each use instead of
//! holding them in registers (`Schedule::remat`).
//!
//! A row split across a thread-block cluster holds its slice in registers from the load
//! to the store, across every reduction and cluster barrier in between. How many rows a
//! multiprocessor has in flight is then set by registers: on the H100 the cluster row
//! kernels at 1024x131072 bf16 ran at 37-82% of the copy bandwidth, in step with their
//! blocks per multiprocessor (LayerNorm: 92 registers, one 512-thread block, 37%; sum:
//! 40 registers, three blocks, 82%). Held as f32, a 16-bit element costs a register;
//! held as the loaded words it costs half of one, and a value like LayerNorm's `x - mean`
//! (live across the variance's reduction) costs nothing when recomputed from `x` where
//! it is used.
//!
//! The rule: kernels without a matrix loop whose tiles are split across a cluster
//! (`Schedule::split_blocks > 1`) and that load a 16- or 8-bit float tile. The writer then
//! keeps each such load as its raw vectors and emits elementwise operations and
//! broadcasts as expressions evaluated at each use (`cuda::emit`, `Val::lazy`);
//! reductions, layout conversions and stores evaluate them. Kernels whose rows fit a
//! block are left as they are: they already reach 97-104% of the copy bandwidth with
//! values in registers.
//!
//! Register room (`Schedule::min_blocks`, blocks under 1024 threads; `Spec::min_blocks`
//! overrides), from the registers a thread holds its loaded data in (16- and 8-bit
//! floats as raw words): up to [`FEW_DATA_REGS`] (and no math the hardware lacks an
//! instruction for: log-softmax's `logf` spilled), three blocks a multiprocessor (40
//! registers: softmax at 1024x131072 bf16 went from two blocks to three, 59% → 76% of
//! the copy bandwidth on the H100, and to 97% once the cluster reductions pushed their
//! partials instead of meeting at cluster barriers); from [`MANY_DATA_REGS`], one (the assembler takes
//! what it needs: RMSNorm at 256x262144 spilled at the 64 registers it chose by itself,
//! not at 114); in between the assembler's own choice (`min_blocks` 0), which kept
//! RMSNorm and LayerNorm at 1024x131072 to 60-62 registers and two blocks where a
//! hint of one block let LayerNorm take 80 registers and one block.
//!
//! Kernels that would ask for one block (`MANY_DATA_REGS`) try for more first, in
//! register-room attempts (`Schedule::register_attempt`; the runtime takes the next
//! when the assembler spills one, `compile_with_fallbacks`): (1) as many blocks as fit
//! at [`AIM_REGS`] registers a thread — three of 256 threads — with thread pointers
//! (`Schedule::thread_pointers`), (2) the same blocks with a full address per access,
//! (3) one block as before. H100, bf16, three blocks against one (two by registers),
//! full table of the eighth session: RMSNorm 92.3 → 97.7% of the copy bandwidth at
//! 1024x131072 and 85.4 → 92.8% at 256x262144, LayerNorm 82.6 → 89.9% and 67.4 → 82.8%. Which emission fits 80 registers without spilling
//! differs by kernel (RMSNorm spilled 8 bytes without thread pointers, LayerNorm 4 with
//! them), and the driver's assembler may differ from the one these were measured with:
//! hence attempts checked by assembling, not a rule.
//!
//! Invariant: `remat` changes where values are computed, never what is computed: the
//! same operations in the same order per element, so results are bit-identical.

use kfuse_ir::{Kernel, Op, UnaryOp};

use crate::analysis::concrete_shape;
use crate::target::Spec;
use crate::CodegenError;

/// Data registers up to which three 512-thread blocks share a multiprocessor.
pub const FEW_DATA_REGS: u32 = 16;
/// Data registers from which a block asks for all the registers it needs — after
/// trying for [`AIM_REGS`] registers a thread.
pub const MANY_DATA_REGS: u32 = 64;
/// Registers a thread the first register-room attempts cap a kernel at: three blocks of
/// 256 threads a multiprocessor (65536 registers, allocated 8 a thread at a time).
pub const AIM_REGS: u32 = 80;
/// Registers of a multiprocessor.
const REGISTER_FILE: u32 = 65536;

/// Runs the pass: sets `Schedule::remat` and the kernel's register-room attempts
/// (module docs).
pub fn run(k: &mut Kernel, spec: &Spec) -> Result<(), CodegenError> {
    let s = &k.schedule;
    // (f32 tiles gain nothing: they are held one element a register either way)
    let narrow = k.order.iter().any(|&op| {
        matches!(k.op(op), Op::Load { .. }) && {
            let t = k.ty(op.value());
            !t.is_scalar() && t.dtype.is_float() && t.dtype.size_bytes() < 4
        }
    });
    let remat = s.split_blocks > 1 && s.persistent == 0 && narrow;
    k.schedule.remat = remat;
    if !remat || spec.min_blocks.is_some() || k.schedule.num_threads >= 1024 {
        return Ok(());
    }
    let threads = k.schedule.num_threads.max(1);
    let words = data_registers(k, threads);
    // math the hardware has no instruction for (`logf`, `erff`, `tanhf`, …: range
    // reduction and polynomials) needs registers of its own while the data is live
    let libm = k.order.iter().any(|&op| matches!(k.op(op), Op::Unary(u) if !matches!(u, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not | UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Rsqrt)));
    let rule = match words {
        w if w <= FEW_DATA_REGS && !libm => 3,
        w if w >= MANY_DATA_REGS => 1,
        _ => 0,
    };
    let aim = REGISTER_FILE / (threads * AIM_REGS);
    if rule == 1 && aim >= 2 {
        let a = spec.register_attempt;
        k.schedule.register_attempt = (a, 3);
        k.schedule.min_blocks = if a < 2 { aim } else { rule };
        k.schedule.thread_pointers = a == 0;
    } else {
        k.schedule.min_blocks = rule;
    }
    Ok(())
}

/// 32-bit registers a thread holds the kernel's tile loads in: 16- and 8-bit floats as
/// raw words (two or four a register), anything else one element a register; a tile
/// along the cluster's split extent is shared by the cluster's blocks.
fn data_registers(k: &Kernel, threads: u32) -> u32 {
    let split = k.schedule.split;
    let mut words = 0;
    for &op in &k.order {
        if !matches!(k.op(op), Op::Load { .. }) {
            continue;
        }
        let ty = k.ty(op.value());
        if ty.is_scalar() {
            continue;
        }
        let elems: u32 = concrete_shape(k, ty).iter().product();
        let blocks = if split.is_some_and(|e| ty.shape.contains(&e)) { k.schedule.split_blocks } else { 1 };
        let per_thread = elems.div_ceil(threads * blocks);
        let esz = ty.dtype.size_bytes() as u32;
        words += if ty.dtype.is_float() && esz < 4 { (per_thread * esz).div_ceil(4) } else { per_thread };
    }
    words
}

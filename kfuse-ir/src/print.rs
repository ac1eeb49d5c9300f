//! The text printer: one line per op in program order, then the schedule if any.
//!
//! The output is deterministic (program order, ordered side tables) so that IR snapshots
//! change only when the kernel or a decision changes. Example:
//!
//! ```text
//! kernel add(a: bf16[N], b: bf16[N], out: &mut bf16[N])
//!   %0 = program_id 0 : i64
//!   %1 = tile_extent BN : i64
//!   %2 = binary mul %0, %1 : i64
//!   %3 = load a[%2 +BN] : bf16[BN]
//! ```
//!
//! A loop prints as a header line, its body indented two more spaces, and a closing
//! brace; its results follow:
//!
//! ```text
//!   for L0 in %11..%12 step %13, init [%9] {
//!     %15 = loop_index L0 : i64  // k
//!     %16 = loop_carried L0.0 : f32[BM, BN]  // acc
//!     ...
//!     yield L0 [%29]
//!   }
//!   %31 = loop_result L0.0 : f32[BM, BN]  // acc
//! ```

use std::fmt::Write;

use crate::kernel::*;
use crate::schedule::{Blocked, Layout};

fn shape(k: &Kernel, s: &[Extent]) -> String {
    s.iter().map(|e| k.extent_name(*e)).collect::<Vec<_>>().join(", ")
}

fn ty_str(k: &Kernel, t: &Type) -> String {
    if t.is_scalar() {
        t.dtype.to_string()
    } else {
        format!("{}[{}]", t.dtype, shape(k, &t.shape))
    }
}

fn access(k: &Kernel, dims: &[AccessDim], offs: &[ValueId]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .zip(offs)
        .map(|(d, o)| match d {
            AccessDim::Index => format!("{o}"),
            AccessDim::Tile(e) => format!("{o} +{}", k.extent_name(*e)),
            AccessDim::Gather(e) => format!("gather {o} [{}]", k.extent_name(*e)),
        })
        .collect();
    parts.join(", ")
}

fn blocked(b: &Blocked) -> String {
    let ctas = if b.block_split.iter().any(|&c| c > 1) { format!(" blocks={:?}", b.block_split) } else { String::new() };
    let steps = if b.steps.is_empty() {
        String::new()
    } else {
        let st: Vec<String> = b.steps.iter().map(|s| format!("e{}/l{}/w{}", s.elem, s.lane, s.warp)).collect();
        format!(" steps=[{}]", st.join(", "))
    };
    format!(
        "shape={:?} spt={:?} tpw={:?} wpb={:?} order={:?}{ctas}{steps}",
        b.shape, b.size_per_thread, b.threads_per_warp, b.warps_per_block, b.order
    )
}

/// Formats a layout for the printer and for messages.
pub fn layout_str(l: &Layout) -> String {
    match l {
        Layout::Uniform => "uniform".into(),
        Layout::Blocked(b) => format!("blocked({})", blocked(b)),
        Layout::Slice { parent, axis } => format!("slice(axis={axis} of {})", blocked(parent)),
    }
}

/// Prints a kernel (and its schedule, once scheduled).
///
/// # Examples
///
/// ```
/// use kfuse_ir::{AccessDim, Builder, DType};
///
/// let mut b = Builder::new("first");
/// let n = b.shape_sym("N");
/// let x = b.tensor_param("x", DType::F32, &[n], false);
/// let out = b.tensor_param("out", DType::F32, &[n], true);
/// let i = b.constant(kfuse_ir::Literal::Int(0), DType::I64);
/// let v = b.load(x, &[i], &[AccessDim::Index])?;
/// b.store(out, &[i], &[AccessDim::Index], v)?;
/// let text = kfuse_ir::print::print(&b.finish()?);
/// assert!(text.contains("load x"));
/// # Ok::<(), kfuse_ir::IrError>(())
/// ```
pub fn print(k: &Kernel) -> String {
    let mut out = String::new();
    let params: Vec<String> = k
        .params
        .iter()
        .map(|p| match &p.kind {
            ParamKind::Tensor { dims, output } => {
                let d: Vec<&str> = dims.iter().map(|s| k.shape_name(*s)).collect();
                format!("{}: {}{}[{}]", p.name, if *output { "&mut " } else { "" }, p.dtype, d.join(", "))
            }
            ParamKind::Scalar => format!("{}: {}", p.name, p.dtype),
        })
        .collect();
    let _ = writeln!(out, "kernel {}({})", k.name, params.join(", "));
    let mut depth = 1usize;
    for op in k.ops() {
        let ops = k.operands(op);
        let args: Vec<String> = ops.iter().map(|v| v.to_string()).collect();
        let node = k.node(op);
        let body = match &node.op {
            Op::ProgramId { axis } => format!("program_id {axis}"),
            Op::ScalarParam { param } => format!("param {}", k.param(*param).name),
            Op::ShapeDim { sym } => format!("shape {}", k.shape_name(*sym)),
            Op::TileExtent { extent } => format!("tile_extent {}", k.extent_name(*extent)),
            Op::Const { value } => match value {
                Literal::Float(v) => format!("const {v:?}"),
                Literal::Int(v) => format!("const {v}"),
                Literal::Bool(v) => format!("const {v}"),
            },
            Op::Load { tensor, dims } => format!("load {}[{}]", k.param(*tensor).name, access(k, dims, &ops)),
            Op::Store { tensor, dims } => {
                let r = dims.len();
                let mask = ops.get(r + 1).map(|m| format!(" where {m}")).unwrap_or_default();
                format!("store {}[{}], {}{mask}", k.param(*tensor).name, access(k, dims, &ops[..r]), ops[r])
            }
            Op::Unary(u) => format!("{} {}", format!("{u:?}").to_lowercase(), args.join(", ")),
            Op::Binary(b) => format!("{} {}", format!("{b:?}").to_lowercase(), args.join(", ")),
            Op::Reduce { op: r, axis, keep_dim } => {
                format!("reduce_{} {}, axis={axis}{}", format!("{r:?}").to_lowercase(), args.join(", "), if *keep_dim { ", keep_dim" } else { "" })
            }
            Op::Cast { to } => format!("cast {} to {to}", args.join(", ")),
            Op::Permute { perm } => format!("permute {}, {perm:?}", args.join(", ")),
            Op::Iota { extent } => format!("iota {}", k.extent_name(*extent)),
            Op::ExpandDims { axis } => format!("expand_dims {}, axis={axis}", args.join(", ")),
            Op::For { id, .. } => {
                let inits = args.get(3..).unwrap_or_default().join(", ");
                let (lo, hi, step) = (&args[0], &args[1], &args[2]);
                format!("for {id} in {lo}..{hi} step {step}, init [{inits}] {{")
            }
            Op::LoopIndex { id } => format!("loop_index {id}"),
            Op::LoopCarried { id, index } => format!("loop_carried {id}.{index}"),
            Op::LoopResult { id, index } => format!("loop_result {id}.{index}"),
            Op::Yield { id } => format!("yield {id} [{}]", args.join(", ")),
            other => format!("{} {}", other.mnemonic(), args.join(", ")),
        };
        let name = k.names.get(&op.value()).map(|n| format!("  // {n}")).unwrap_or_default();
        let pad = "  ".repeat(depth);
        match &node.ty {
            Some(t) => {
                let _ = writeln!(out, "{pad}{} = {body} : {}{name}", op.value(), ty_str(k, t));
            }
            None => {
                let _ = writeln!(out, "{pad}{body}");
            }
        }
        match node.op {
            Op::For { .. } => depth += 1,
            Op::Yield { .. } => {
                depth = depth.saturating_sub(1).max(1);
                let _ = writeln!(out, "{}}}", "  ".repeat(depth));
            }
            _ => {}
        }
    }
    let s = &k.schedule;
    if s.is_scheduled() {
        let _ = writeln!(out, "schedule: threads={} min_blocks={} smem={}B", s.num_threads, s.min_blocks, s.smem_bytes);
        if s.grouped {
            let _ = writeln!(out, "  grouped: one launch runs the programs of several problems, each block reading its problem's parameters from a table");
        }
        if s.persistent > 0 {
            let _ = writeln!(out, "  persistent: at most {} blocks walk the programs, each loading the next program's tiles ahead", s.persistent);
        }
        if s.split_blocks > 1 {
            let split = s.split.map(|e| k.extent_name(e)).unwrap_or_default();
            let _ = writeln!(out, "  split over {} blocks along x, splitting {split}", s.split_blocks);
        }
        if let Some(c) = &s.row_chunks {
            let passes = if c.passes == 1 { "1 pass".to_string() } else { format!("{} passes", c.passes) };
            let _ = writeln!(out, "  row {} of {} elements walked in chunks of {}, {passes}", k.shape_name(c.sym), c.row, c.chunk);
        }
        if s.grid_x > 0 {
            let yz = ["x", "y", "z"][s.grid_x as usize];
            let _ = writeln!(out, "  grid: program_id({}) along x, program_id(0) along {yz} (more than 65535 programs along y or z otherwise)", s.grid_x);
        }
        if s.l2_prefetch > 0 {
            let _ = writeln!(out, "  L2 prefetch: each block asks L2 for its slice of the rows {} programs ahead before its own loads", s.l2_prefetch);
        }
        if s.remat {
            let _ = writeln!(out, "  rematerialized: 16/8-bit loads kept as raw words, elementwise values recomputed at each use");
        }
        if s.thread_pointers {
            let _ = writeln!(out, "  thread pointers: vector accesses address from each thread's own pointer");
        }
        if s.register_attempt.1 > 1 {
            let (a, n) = s.register_attempt;
            let _ = writeln!(out, "  register room: attempt {} of {n} (the next is taken when the assembler spills this one)", a + 1);
        }
        if let Some(why) = &s.dots_one_by_one {
            let _ = writeln!(out, "  dots: {why}");
        }
        for (t, v) in &s.tiles {
            let _ = writeln!(out, "  tile {} = {v}", k.tile_name(*t));
        }
        for (sym, v) in &s.full {
            let exact = if s.full_exact.contains(sym) { " (exact: no masks)" } else { "" };
            let _ = writeln!(out, "  full {} -> {v}{exact}", k.shape_name(*sym));
        }
        for op in k.ops() {
            if let Some(l) = s.layouts.get(&op.value()) {
                let _ = writeln!(out, "  {} {}", op.value(), layout_str(l));
            }
            if let Some(m) = s.smem.get(&op.value()) {
                let _ = writeln!(out, "  {} smem {m:?}", op.value());
            }
            if let Some(v) = s.vector.get(&op) {
                let _ = writeln!(out, "  {} {} vector={v}", op.value(), k.op(op).mnemonic());
            }
        }
    }
    out
}

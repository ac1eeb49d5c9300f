//! `hoist_invariants`: moves scalar index arithmetic that does not change between
//! iterations out of loop bodies, to just before the loop.
//!
//! An op is hoisted when it computes a scalar without touching memory (program ids,
//! tile extents, shape values, literals, parameters, elementwise arithmetic) and none of
//! its operands is defined inside the loop. Repeated to a fixed point, innermost loops
//! first, so a chain (`i * BM` with `BM` itself in the body) leaves whole. The meaning
//! is unchanged; later passes (the matrix path) can then see that an operand's row
//! offset is fixed for the whole loop.

use kfuse_ir::{Kernel, Op};

use crate::CodegenError;

fn hoistable(op: &Op) -> bool {
    matches!(
        op,
        Op::ProgramId { .. }
            | Op::ScalarParam { .. }
            | Op::ShapeDim { .. }
            | Op::TileExtent { .. }
            | Op::Const { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
    )
}

/// Runs the pass: moves loop-invariant scalar index arithmetic before its loop (module
/// docs).
pub fn run(k: &mut Kernel) -> Result<(), CodegenError> {
    loop {
        let nest = k.loop_nest();
        let mut moved = false;
        for (pos, &op) in k.order.clone().iter().enumerate() {
            let Some(lid) = nest[pos] else { continue };
            let node = k.node(op);
            if !hoistable(&node.op) || !node.ty.as_ref().is_some_and(|t| t.is_scalar()) {
                continue;
            }
            let Some((for_pos, _)) = k.loop_body(lid) else { continue };
            let inside = |p: usize| p > for_pos && p < pos;
            if k.operands(op).iter().any(|v| inside(k.position(v.op()))) {
                continue;
            }
            let for_op = k.order[for_pos];
            k.order.remove(pos);
            let at = k.position(for_op);
            k.order.insert(at, op);
            moved = true;
            break;
        }
        if !moved {
            return Ok(());
        }
    }
}

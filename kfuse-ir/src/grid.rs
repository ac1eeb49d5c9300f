//! The launch grid, derived from how `program_id` indexes the stores.
//!
//! A kernel describes one program instance; the number of instances along grid axis `a`
//! follows from a store whose offset on some tensor dimension is `program_id(a) * E`
//! (with `E` that access's tile extent on that dimension: the grid covers the
//! dimension with `ceil(dim / E)` programs) or plain `program_id(a)` on an indexed
//! dimension (one program per index). The first store, in program order, that
//! determines an axis wins. In a kernel that scatters (a store addressed by index
//! tiles), an axis no store determines follows the loads the same way, the first load
//! first. An axis used but determined by no such access is an error that says how to
//! write the store.
//!
//! A store inside a loop body counts like any other: what matters is how its offset is
//! computed (`program_id(a) * E`, wherever the product is made, is the same term). An
//! offset that is a loop index or a carried value is no `program_id` term and
//! determines nothing.

use crate::error::{IrError, Result};
use crate::kernel::*;

/// How many programs run along one grid axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GridAxis {
    /// The tensor extent the axis covers.
    pub dim: ShapeSym,
    /// Programs = `ceil(dim / step)`; `None` means one program per index (`step` 1).
    pub step: Option<Extent>,
}

/// The grid of a kernel: one entry per `program_id` axis in use (at most 3).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Grid {
    /// Axis `a` is `program_id(a)`'s.
    pub axes: Vec<GridAxis>,
}

impl Grid {
    /// Evaluates the grid for concrete shape values and tile sizes.
    pub fn eval(&self, shape: impl Fn(ShapeSym) -> u64, extent: impl Fn(Extent) -> u64) -> Vec<u64> {
        self.axes
            .iter()
            .map(|a| {
                let d = shape(a.dim);
                match a.step {
                    None => d,
                    Some(e) => d.div_ceil(extent(e).max(1)),
                }
            })
            .collect()
    }
}

/// If `v` is `program_id(a) * E` (either order) or `program_id(a)`, returns `(a, E)`.
fn pid_term(k: &Kernel, v: ValueId) -> Option<(u8, Option<Extent>)> {
    match k.op(v.op()) {
        Op::ProgramId { axis } => Some((*axis, None)),
        Op::Binary(BinaryOp::Mul) => {
            let ops = k.operands(v.op());
            let (x, y) = (ops[0], ops[1]);
            let ext = |w: ValueId| match k.op(w.op()) {
                Op::TileExtent { extent } => Some(*extent),
                Op::Const { value: Literal::Int(c) } if *c > 0 => Some(Extent::Const(*c as u32)),
                _ => None,
            };
            match (k.op(x.op()), k.op(y.op())) {
                (Op::ProgramId { axis }, _) => ext(y).map(|e| (*axis, Some(e))),
                (_, Op::ProgramId { axis }) => ext(x).map(|e| (*axis, Some(e))),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Derives the grid (see the module docs).
///
/// # Examples
///
/// A store at `program_id(0) * BN` gives axis 0 `ceil(N / BN)` programs:
///
/// ```
/// use kfuse_ir::{AccessDim, BinaryOp, Builder, DType, Extent};
///
/// let mut b = Builder::new("fill");
/// let n = b.shape_sym("N");
/// let bn = Extent::Tile(b.tile_sym("BN"));
/// let out = b.tensor_param("out", DType::F32, &[n], true);
/// let i = b.program_id(0)?;
/// let step = b.tile_extent(bn);
/// let off = b.binary(BinaryOp::Mul, i, step)?;
/// let one = b.constant(kfuse_ir::Literal::Float(1.0), DType::F32);
/// b.store(out, &[off], &[AccessDim::Tile(bn)], one)?;
/// let grid = kfuse_ir::grid::derive(&b.finish()?)?;
/// assert_eq!(grid.axes[0].dim, n);
/// assert_eq!(grid.axes[0].step, Some(bn));
/// // N = 1000, BN = 256: 4 programs
/// assert_eq!(grid.eval(|_| 1000, |_| 256), vec![4]);
/// # Ok::<(), kfuse_ir::IrError>(())
/// ```
pub fn derive(k: &Kernel) -> Result<Grid> {
    let rank = k.grid_rank();
    let mut axes: Vec<Option<GridAxis>> = vec![None; rank];
    let stores = k.ops().filter(|&op| matches!(k.op(op), Op::Store { .. }));
    // (the loads count only in a kernel that scatters: elsewhere a program id that
    // indexes no store would have every program write the same elements)
    let scatters = k.ops().any(|op| matches!(k.op(op), Op::Store { dims, .. } if dims.iter().any(AccessDim::is_gather)));
    let loads = k.ops().filter(|&op| scatters && matches!(k.op(op), Op::Load { .. }));
    for op in stores.chain(loads) {
        let (Op::Store { tensor, dims } | Op::Load { tensor, dims }) = k.op(op) else { continue };
        let offs = k.operands(op);
        let tdims = k.tensor_dims(*tensor);
        for (d, dim) in dims.iter().enumerate() {
            let Some((a, step)) = pid_term(k, offs[d]) else { continue };
            let step = match (dim, step) {
                (AccessDim::Index, None) => None,
                (AccessDim::Tile(e), Some(s)) if *e == s => Some(s),
                (AccessDim::Index, Some(Extent::Const(1))) => None,
                _ => continue,
            };
            let slot = &mut axes[a as usize];
            if slot.is_none() {
                *slot = Some(GridAxis { dim: tdims[d], step });
            }
        }
    }
    axes.into_iter()
        .enumerate()
        .map(|(a, g)| {
            g.ok_or_else(|| {
                IrError::Grid(format!(
                    "program_id({a}) does not index any store as `program_id({a}) * B` on a dimension accessed with tile extent B, \
                     or as a plain index (`x.row(program_id({a}))`); the number of programs along axis {a} is unknown"
                ))
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(|axes| Grid { axes })
}

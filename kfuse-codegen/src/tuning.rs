//! Autotuning candidates: the tile settings a tuner may time for a `dot` kernel.
//!
//! [`tuning_candidates`] lists a few [`Spec::tiles`] values around the `choose_tiles`
//! heuristic (`choose_dot_tiles`) for one kernel, specialization and target. The runtime
//! (`KFUSE_AUTOTUNE=1`) times them on the device and keeps the fastest; codegen only
//! proposes, it never measures.
//!
//! Candidates:
//! - sm_90 (WGMMA): `BM` ∈ {128, 64} × `BN` ∈ {256, 128, 64} with the default ring
//!   depth, and the heuristic's own tiles with `STAGES=4` (the default fills shared
//!   memory, up to 8);
//! - sm_80/sm_89 (mma.sync): `BM × BN` ∈ {128x128, 128x64, 64x128, 64x64}, default
//!   stages;
//! - the FMA path (f32 operands, any target): the target's list above; `BK` follows
//!   `BM` (`choose_tiles::fma_bk`) and the stages are always two.
//!
//! Invariants:
//! - The heuristic's own choice comes first (as explicit `BM`/`BN` entries); a kernel
//!   without a `dot`, or one the heuristic cannot schedule, has no candidates.
//! - Every candidate is a complete `Spec::tiles` value: the entries of `spec.tiles`
//!   (explicit overrides, e.g. `KFUSE_TILES`) are kept in each and win over the tuner's.
//! - Every candidate passes the real pipeline ([`crate::compile`]); one it refuses is
//!   dropped, and so is one that emits the same source as an earlier candidate.
//! - `BK` is never varied (it is fixed by the swizzle span / the cp.async chunking).

use std::collections::BTreeMap;

use kfuse_ir::{Extent, Kernel};

use crate::passes::select_mma_path::dots;
use crate::target::{Spec, Target};

/// A few tile overrides to time for `kernel` on `target` (see the module docs): empty
/// without a `dot`; otherwise the heuristic's choice first, then the alternatives the
/// pipeline accepts, without duplicates.
///
/// # Examples
///
/// A kernel without a `dot` has nothing to tune:
///
/// ```
/// use kfuse_codegen::{tuning_candidates, Spec, Target};
/// use kfuse_ir::{AccessDim, Builder, DType, UnaryOp};
///
/// let mut b = Builder::new("negate");
/// let n = b.shape_sym("N");
/// let x = b.tensor_param("x", DType::F32, &[n], false);
/// let out = b.tensor_param("out", DType::F32, &[n], true);
/// let i = b.program_id(0)?;
/// let v = b.load(x, &[i], &[AccessDim::Index])?;
/// let neg = b.unary(UnaryOp::Neg, v)?;
/// b.store(out, &[i], &[AccessDim::Index], neg)?;
/// let k = b.finish()?;
/// assert!(tuning_candidates(&k, &Spec::default(), &Target::sm90a()).is_empty());
/// # Ok::<(), kfuse_ir::IrError>(())
/// ```
pub fn tuning_candidates(kernel: &Kernel, spec: &Spec, target: &Target) -> Vec<BTreeMap<String, u32>> {
    let Some(&dot) = dots(kernel).first() else { return Vec::new() };
    let Ok(scheduled) = crate::schedule(kernel, spec, target) else { return Vec::new() };
    let ops = kernel.operands(dot);
    let name = |e: Extent| match e {
        Extent::Tile(t) => Some((t, kernel.tile_name(t).to_string())),
        _ => None,
    };
    let m = kernel.ty(ops[0]).shape.first().copied().and_then(name);
    let n = kernel.ty(ops[1]).shape.get(1).copied().and_then(name);
    let chosen = |t: Option<&(kfuse_ir::TileSym, String)>| t.and_then(|(t, s)| scheduled.schedule.tiles.get(t).map(|&v| (s.clone(), v)));
    let (hm, hn) = (chosen(m.as_ref()), chosen(n.as_ref()));

    // (BM, BN, STAGES) settings, heuristic first; `None` keeps the heuristic's value
    let mut settings: Vec<(Option<u32>, Option<u32>, Option<u32>)> = vec![(None, None, None)];
    let shapes: &[(u32, u32)] = if target.sm >= 90 {
        &[(128, 256), (128, 128), (128, 64), (64, 256), (64, 128), (64, 64)]
    } else {
        &[(128, 128), (128, 64), (64, 128), (64, 64)]
    };
    settings.extend(shapes.iter().map(|&(bm, bn)| (Some(bm), Some(bn), None)));
    if target.sm >= 90 && scheduled.schedule.general_matrix_loop {
        settings.push((None, None, Some(4)));
    }

    let mut out: Vec<BTreeMap<String, u32>> = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    for (bm, bn, st) in settings {
        let mut tiles = BTreeMap::new();
        for (h, v) in [(&hm, bm), (&hn, bn)] {
            if let Some((name, hv)) = h {
                tiles.insert(name.clone(), v.unwrap_or(*hv));
            }
        }
        if let Some(s) = st {
            tiles.insert("STAGES".to_string(), s);
        }
        // explicit overrides win
        tiles.extend(spec.tiles.iter().map(|(k, v)| (k.clone(), *v)));
        if out.contains(&tiles) {
            continue;
        }
        let s = Spec { tiles: tiles.clone(), ..spec.clone() };
        let Ok(e) = crate::compile(kernel, &s, target) else { continue };
        if sources.contains(&e.source) {
            continue;
        }
        sources.push(e.source);
        out.push(tiles);
    }
    out
}

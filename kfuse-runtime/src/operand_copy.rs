//! Padded copies of matrix operands: a GPU launch of a kernel whose pipelined matrix
//! loop (`acc += dot(load, load)`) reads a tensor the tensor-memory accelerator cannot
//! read as it lies — rows whose pitch is not a multiple of 16 bytes (a bf16 `[K, 4097]`
//! matrix: 8194 bytes), data that is not 16-byte aligned — copies that tensor first,
//! into rows padded to whole 128-byte lines, and runs the kernel on the copy, so that
//! the loop reaches the tensor cores (WGMMA + TMA on sm_90a, mma.sync + cp.async on
//! sm_80/sm_89; both read 16-byte pieces) instead of falling back to f32 FMAs.
//!
//! Owns: which arguments a launch copies (`wanted`), the padded layout
//! ([`PaddedLayout`]) and the copy itself (`make`).
//!
//! Which tensors: those that the dots of the loop read their operand tiles from
//! (`kfuse_codegen`'s [`MatrixOperands`], recognized once per kernel), that TMA cannot
//! read (`tensor_obstacle`, the rule the matrix paths apply), and that are inputs —
//! parameters the kernel never writes (`Tensor`, not `&mut Tensor`): reading a copy of
//! an output would miss the kernel's own writes. A copy is made only when it brings the
//! loop onto the tensor cores: every operand is then readable (one that is not, an
//! output for instance, leaves all of them as they are) and the target's path takes the
//! loop with the copies' facts (`MatrixOperands::tensor_cores`: not for f32 operands of
//! a plain `dot`, which take exact FMAs anyway, nor where only the WGMMA path takes the
//! loop's several dots). The copy keeps the tensor's logical shape and its unit-stride
//! dimension (a transposed view stays K- or MN-major as it was; of several, which
//! dimensions of extent 1 allow, one with which the loop reaches the tensor cores, so
//! that a `[1, 1]` TF32 operand is copied K-major); the kernel reads the copy through
//! its strides like any argument.
//!
//! The layout: the unit-stride dimension (the last one if several) innermost, its
//! extent padded to whole 128-byte lines (4097 bf16 → 4160: 8320-byte rows), the other
//! dimensions outside it in their order. 128 bytes rather than the 16 TMA needs, as
//! `kfuse::ops::gemm`'s own copies (`tma_readable`) do: each row of a TMA box then
//! starts on a line and costs no extra sector.
//!
//! The copy, on the device's stream before the kernel: a matrix by the runtime's own
//! tile-copy kernel (`COPY`, built with the IR builder, compiled and cached like any
//! kernel); a batch by `cuMemcpy2DAsync` blocks of rows — one block when the rows lie at
//! one pitch (dimensions that merge), else one a matrix of the batch (should the driver refuse a pitch,
//! `cuMemcpy2DUnaligned` between a drained stream and a synchronized context, slower
//! but in the stream's order; a `kfuse::launch` debug event says so). The storage comes from the
//! device's memory pool ([`Tensor::empty`]) and lives for the launch only: it is made
//! again at each launch (so it never holds stale data) and returns to the pool when the
//! launch has been queued, which the stream's order makes safe. The launch records each
//! copy in its plan (`Plan::operand_copies`, shown by `Launched::plan`,
//! `kfuse::explain` and `emit`) and in a `kfuse::launch` debug event.
//!
//! What is not copied: tensors with no unit-stride dimension (a gather of single
//! elements the driver's 2-D copy cannot make; the loop writes them to their tiles from
//! registers), batches whose rows need more than [`MAX_BLOCKS`] copies, and the
//! operands of grouped launches (`launch_grouped`, whose operands
//! `kfuse::ops::gemm_grouped` aligns itself).

use kfuse_codegen::passes::select_mma_path::{tensor_obstacle, MatrixOperands};
use kfuse_codegen::{Spec, Target, TensorSpec};
use kfuse_ir::Kernel;

use crate::error::{driver, Error, Result};
use crate::launch::{pow2_div, tensor_spec, ArgFacts, TensorFacts};
use crate::tensor::Tensor;

/// Most 2-D copies one padded copy is made of: one per matrix of a batch whose
/// dimensions do not merge (beyond it, no copy: each is a driver call).
pub const MAX_BLOCKS: usize = 4096;

/// The largest row pitch, in bytes, a 2-D copy takes (`cuMemcpy2D`'s limit,
/// `CU_DEVICE_ATTRIBUTE_MAX_PITCH` on current GPUs).
const MAX_PITCH: usize = i32::MAX as usize;

/// Where a padded copy of a tensor puts its elements (module docs), and how its rows are
/// copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddedLayout {
    /// Storage axis `i` holds dimension `order[i]` of the tensor; the last is its
    /// unit-stride dimension.
    order: Vec<usize>,
    /// The storage's shape: the tensor's dimensions in `order`, the last padded.
    storage: Vec<usize>,
    /// The copy's 2-D blocks: rows of `width` elements, `height` of them `src_pitch`
    /// elements apart in the tensor, at the tensor offsets and storage offsets of
    /// `blocks` (elements).
    width: usize,
    height: usize,
    src_pitch: usize,
    blocks: Vec<(usize, usize)>,
}

impl PaddedLayout {
    /// The padded layout of a tensor of `shape` and `strides` (elements) with `esz`-byte
    /// elements, or `None` when it has no unit-stride dimension, a negative stride, rows
    /// that overlap or lie too far apart for a 2-D copy, or more than [`MAX_BLOCKS`]
    /// blocks of rows.
    pub fn of(shape: &[usize], strides: &[isize], esz: usize) -> Option<PaddedLayout> {
        let unit = (0..strides.len()).rev().find(|&d| strides[d] == 1)?;
        Self::with_unit(shape, strides, esz, unit)
    }

    /// [`PaddedLayout::of`] with dimension `unit` (one of unit stride) innermost: where
    /// several have unit stride (dimensions of extent 1), the one the kernel reads along.
    pub fn with_unit(shape: &[usize], strides: &[isize], esz: usize, unit: usize) -> Option<PaddedLayout> {
        let r = shape.len();
        if strides.len() != r || strides.iter().any(|&s| s < 0) || strides.get(unit) != Some(&1) {
            return None;
        }
        let mut order: Vec<usize> = (0..r).filter(|&d| d != unit).collect();
        order.push(unit);
        let line = 128 / esz.clamp(1, 128);
        let mut storage: Vec<usize> = order.iter().map(|&d| shape[d]).collect();
        storage[r - 1] = shape[unit].div_ceil(line) * line;
        // the storage's strides, by storage axis
        let mut dst_stride = vec![1usize; r];
        for i in (0..r - 1).rev() {
            dst_stride[i] = dst_stride[i + 1] * storage[i + 1];
        }
        // the outer axes that matter (extent > 1), outermost first; the innermost of
        // them is the row axis, and those before it merge into it while their rows
        // continue at the same pitch in the tensor
        let mut outer: Vec<usize> = (0..r - 1).filter(|&i| storage[i] > 1).collect();
        let width = shape[unit];
        let (mut height, mut src_pitch) = (1usize, width);
        if let Some(row) = outer.pop() {
            let d = order[row];
            (height, src_pitch) = (shape[d], strides[d] as usize);
            while let Some(&o) = outer.last() {
                if strides[order[o]] as usize != src_pitch.checked_mul(height)? {
                    break;
                }
                height *= storage[o];
                outer.pop();
            }
        }
        if (height > 1 && src_pitch < width) || src_pitch.checked_mul(esz)? > MAX_PITCH {
            return None;
        }
        // one block per index of the axes left
        let count: usize = outer.iter().map(|&i| storage[i]).product();
        if count > MAX_BLOCKS {
            return None;
        }
        let mut blocks = Vec::with_capacity(count);
        for mut n in 0..count {
            let (mut src, mut dst) = (0usize, 0usize);
            for &i in outer.iter().rev() {
                let x = n % storage[i];
                n /= storage[i];
                src += x * strides[order[i]] as usize;
                dst += x * dst_stride[i];
            }
            blocks.push((src, dst));
        }
        Some(PaddedLayout { order, storage, width, height, src_pitch, blocks })
    }

    /// The padded extent of the unit-stride dimension: the copy's row pitch in elements.
    pub fn pitch(&self) -> usize {
        *self.storage.last().expect("a tensor of rank 1 or more")
    }

    /// The storage's shape (the tensor's dimensions in storage order, the last padded).
    pub fn storage_shape(&self) -> &[usize] {
        &self.storage
    }

    /// The copy's strides, by dimension of the tensor.
    pub fn strides(&self) -> Vec<isize> {
        let r = self.order.len();
        let mut st = vec![0isize; r];
        let mut acc = 1usize;
        for i in (0..r).rev() {
            st[self.order[i]] = acc as isize;
            acc *= self.storage[i];
        }
        st
    }

    /// The specialization facts of the copy: 16-byte aligned data (a pool block is
    /// aligned to 256 bytes), its strides' divisibility.
    pub fn spec(&self) -> TensorSpec {
        let stride_div = self.strides().iter().map(|&s| if s == 1 { 0 } else { pow2_div(s as u64) }).collect();
        TensorSpec { ptr_align: 16, stride_div }
    }

    /// The permutation that views the storage in the tensor's dimension order.
    fn view_perm(&self) -> Vec<usize> {
        let mut inv = vec![0usize; self.order.len()];
        for (i, &d) in self.order.iter().enumerate() {
            inv[d] = i;
        }
        inv
    }
}

/// One tensor argument a launch copies: which, to what layout, and the line its plan
/// shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperandCopy {
    /// The parameter's index in the signature.
    pub param: usize,
    /// The copy's layout.
    pub layout: PaddedLayout,
    /// `operand `b` copied to a padded pitch of 4160 elements: row pitch 8194 bytes is
    /// not a multiple of 16`.
    pub note: String,
}

/// Whether TMA reads a tensor of `esz`-byte elements as it lies (the rule of
/// `tensor_obstacle`, without building its facts: this runs on every launch of a
/// matrix kernel).
fn readable<T: TensorFacts>(t: &T, esz: usize) -> bool {
    let st = t.strides();
    let Some(unit) = (0..st.len()).rev().find(|&d| st[d] == 1) else { return false };
    t.address() & 15 == 0 && (0..st.len()).all(|d| d == unit || (st[d].unsigned_abs() * esz) & 15 == 0)
}

/// Why TMA cannot read the tensor as it lies, in its own numbers.
fn why<T: TensorFacts>(t: &T, esz: usize, unit: usize) -> String {
    let st = t.strides();
    let r = st.len();
    for d in (0..r).rev().filter(|&d| d != unit) {
        let bytes = st[d].unsigned_abs() * esz;
        if bytes & 15 != 0 {
            return match (r, unit) {
                (2, 1) => format!("row pitch {bytes} bytes is not a multiple of 16"),
                (2, _) => format!("column pitch {bytes} bytes is not a multiple of 16"),
                _ => format!("the stride of dimension {d}, {bytes} bytes, is not a multiple of 16"),
            };
        }
    }
    format!("its data starts {} bytes past a 16-byte boundary", t.address() & 15)
}

/// The operands of `m` (a kernel's matrix loop) among `args` that a GPU launch on
/// `target` copies (module docs), with their layouts; empty when none is — the usual
/// case, found without allocating and without asking for the target.
pub(crate) fn wanted<A: ArgFacts>(m: &MatrixOperands, kernel: &Kernel, args: &[A], target: impl FnOnce() -> Result<Target>) -> Result<Vec<OperandCopy>> {
    let mut copies = Vec::new();
    if !m.tensor_core_dtype() {
        return Ok(copies);
    }
    for &p in &m.params {
        let i = p.0 as usize;
        let Some(t) = args.get(i).and_then(|a| a.tensor()) else { return Ok(Vec::new()) };
        let esz = t.dtype().size_bytes();
        if readable(t, esz) {
            continue;
        }
        let param = kernel.param(p);
        if tensor_obstacle(&param.name, esz as u32, &tensor_spec(t)).is_none() {
            continue;
        }
        let Some(layout) = PaddedLayout::of(t.shape(), t.strides(), esz).filter(|_| !param.is_output()) else {
            // an operand that stays unreadable: the loop writes it to its tile from
            // registers each step, copies or not
            return Ok(Vec::new());
        };
        let unit = *layout.order.last().expect("rank 1 or more");
        let note = format!("operand `{}` copied to a padded pitch of {} elements: {}", param.name, layout.pitch(), why(t, esz, unit));
        copies.push(OperandCopy { param: i, layout, note });
    }
    if copies.is_empty() {
        return Ok(copies);
    }
    // the loop on the copies' facts: on the tensor cores, or no copies. A tensor with
    // several unit-stride dimensions (extents of 1: a [1, 1] operand) may be copied with
    // any of them innermost; the choices are tried until one reaches the tensor cores
    // (TF32 and 8-bit operands must lie with K contiguous, A's and B's K the other way)
    let spec = Spec { tensors: kernel.params.iter().zip(args).map(|(p, a)| a.tensor().filter(|_| p.is_tensor()).map(tensor_spec)).collect(), ..Spec::default() };
    let choices: Vec<Vec<PaddedLayout>> = copies
        .iter()
        .map(|c| {
            let t = args[c.param].tensor().expect("a copied tensor");
            let units = (0..t.strides().len()).rev().filter(|&d| t.strides()[d] == 1);
            units.filter_map(|d| PaddedLayout::with_unit(t.shape(), t.strides(), t.dtype().size_bytes(), d)).collect()
        })
        .collect();
    let combos: usize = choices.iter().map(|c| c.len().max(1)).product();
    let target = target()?;
    for n in 0..combos.min(16) {
        let (mut spec, mut rest, mut pick) = (spec.clone(), n, copies.clone());
        for (c, ch) in pick.iter_mut().zip(&choices) {
            if !ch.is_empty() {
                c.layout = ch[rest % ch.len()].clone();
                rest /= ch.len();
            }
            spec.tensors[c.param] = Some(c.layout.spec());
        }
        if m.tensor_cores(&spec, &target) {
            return Ok(pick);
        }
    }
    Ok(Vec::new())
}

/// The tile of the runtime's matrix copy, rows × columns: 32 elements a thread at the
/// scheduler's 512 threads, so that many of a thread's loads are in flight (a row pitch
/// that is not a multiple of 4 bytes leaves each access one 2-byte element). H100, bf16
/// [4096, 4097] into rows of 4160, `ops::kernels::copy2d` at given tiles and threads:
/// 32 elements a thread 32.6–35.9 µs (16 × 512 and 32 × 256 at 256 threads, 64 × 64 at
/// 128, 8 × 1024 at 256), 64 a thread 38.9–42.4, the scheduler's 64 × 64 at 512 threads
/// (8 a thread) 50.4 (NOTES.md, "Padded operand copies").
const COPY_TILE: [u32; 2] = [32, 512];

/// `out = x` for a matrix, one program per `COPY_TILE` tile, any strides: the kernel the
/// runtime copies a matrix operand with, written with the IR builder (the runtime
/// cannot use `kfuse::ops`, which sits above it).
fn copy_kernel(dtypes: &[kfuse_ir::DType]) -> kfuse_ir::error::Result<Kernel> {
    use kfuse_ir::{AccessDim, BinaryOp, Extent};
    let mut b = kfuse_ir::Builder::new("operand_copy");
    let (m, n) = (b.shape_sym("M"), b.shape_sym("N"));
    let x = b.tensor_param("x", dtypes[0], &[m, n], false);
    let out = b.tensor_param("out", dtypes[0], &[m, n], true);
    // its own tile (`COPY_TILE`), not the scheduler's symbols (which `KFUSE_TILES` would
    // set for it too)
    let (bm, bn) = (Extent::Const(COPY_TILE[0]), Extent::Const(COPY_TILE[1]));
    let (i, j) = (b.program_id(0)?, b.program_id(1)?);
    let (em, en) = (b.tile_extent(bm), b.tile_extent(bn));
    let at = [b.binary(BinaryOp::Mul, i, em)?, b.binary(BinaryOp::Mul, j, en)?];
    let dims = [AccessDim::Tile(bm), AccessDim::Tile(bn)];
    let v = b.load(x, &at, &dims)?;
    b.store(out, &at, &dims, v)?;
    b.finish()
}

/// The runtime's matrix copy ([`copy_kernel`]).
static COPY: kfuse_ir::KernelDef = kfuse_ir::KernelDef {
    name: "operand_copy",
    generics: &["T"],
    params: &[
        kfuse_ir::ParamSig::Tensor { name: "x", dtype: kfuse_ir::DTypeSig::Generic(0), dims: &["M", "N"], output: false },
        kfuse_ir::ParamSig::Tensor { name: "out", dtype: kfuse_ir::DTypeSig::Generic(0), dims: &["M", "N"], output: true },
    ],
    build: copy_kernel,
};

/// A copy of `t` in `layout` (from [`PaddedLayout::of`] of `t`'s shape and strides),
/// viewed at `t`'s shape: on a GPU `cuMemcpy2DAsync` on the device's stream into a block
/// of its memory pool, on the CPU the same rows copied in host memory.
pub(crate) fn make(t: &Tensor, layout: &PaddedLayout) -> Result<Tensor> {
    let device = t.device();
    let esz = t.dtype().size_bytes();
    let storage = Tensor::empty(&layout.storage, t.dtype(), &device)?;
    let r = layout.order.len();
    let view = storage.narrow(r - 1, 0, layout.width)?.permute(&layout.view_perm())?;
    if t.numel() == 0 {
        return Ok(view);
    }
    let (width, pitch, dst_pitch) = (layout.width * esz, layout.src_pitch * esz, layout.pitch() * esz);
    match device.gpu_ref() {
        // a matrix: the runtime's own tile copy (`COPY`), at the copy bandwidth where the
        // driver's 2-D copy of an odd pitch ran at about half of it (H100: 46.5 µs for
        // a bf16 [4096, 4097])
        Some(_) if r == 2 && layout.blocks.len() == 1 => {
            let mut view = view;
            crate::launch::launch(&COPY, &mut [crate::launch::Arg::In(t), crate::launch::Arg::Out(&mut view)])?;
            return Ok(view);
        }
        Some(g) => {
            g.bind()?;
            let (src, dst) = (t.device_ptr().expect("a GPU tensor"), view.device_ptr().expect("a GPU tensor"));
            for &(s, d) in &layout.blocks {
                // every field written: the memory types are enums without a zero value,
                // so a zeroed descriptor is not a valid Rust value (the release build
                // aborted on `mem::zeroed` here)
                let p = cudarc::driver::sys::CUDA_MEMCPY2D {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcMemoryType: cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    srcHost: std::ptr::null(),
                    srcDevice: src + (s * esz) as u64,
                    srcArray: std::ptr::null_mut(),
                    srcPitch: pitch,
                    dstXInBytes: 0,
                    dstY: 0,
                    dstMemoryType: cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    dstHost: std::ptr::null_mut(),
                    dstDevice: dst + (d * esz) as u64,
                    dstArray: std::ptr::null_mut(),
                    dstPitch: dst_pitch,
                    WidthInBytes: width,
                    Height: layout.height,
                };
                // SAFETY: both ranges lie in live allocations (the source tensor's
                // storage, the pool block just taken), checked by `PaddedLayout::of`'s
                // walk of `t`'s shape and strides; the copy is ordered on the stream
                // before the kernel that reads it and before any later use of the block.
                if let Err(e) = unsafe { cudarc::driver::sys::cuMemcpy2DAsync_v2(&p, g.stream.cu_stream()) }.result() {
                    // the driver documents that a device-to-device 2-D copy "may fail for
                    // pitches not computed by cuMemAllocPitch"; its unaligned variant
                    // takes any pitch but runs outside the stream: the stream is drained
                    // before it and the context after it, so the order stays the stream's
                    tracing::debug!(target: "kfuse::launch", error = %crate::error::driver_error_text(e), "cuMemcpy2DAsync refused an operand copy; cuMemcpy2DUnaligned instead");
                    let what = format_args!("copying an operand to padded rows on {}", device.description());
                    g.sync()?;
                    // SAFETY: as above
                    unsafe { cudarc::driver::sys::cuMemcpy2DUnaligned_v2(&p) }.result().map_err(driver(&what))?;
                    g.ctx.synchronize().map_err(driver(&what))?;
                }
            }
        }
        None => {
            let src = t.host_bytes().ok_or_else(|| Error::InvalidArgument("a host tensor without host storage".into()))?;
            let mut view = view;
            let start = view.offset() * esz;
            let src_start = t.offset() * esz;
            let mut dst = view.host_bytes_mut().ok_or_else(|| Error::InvalidArgument("a host tensor without host storage".into()))?;
            for &(s, d) in &layout.blocks {
                for row in 0..layout.height {
                    let (from, to) = (src_start + s * esz + row * pitch, start + d * esz + row * dst_pitch);
                    dst[to..to + width].copy_from_slice(&src[from..from + width]);
                }
            }
            drop(dst);
            return Ok(view);
        }
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    /// The runtime's matrix copy at the shape of a bf16 `[4096, 4097]` operand going to
    /// rows of 4160: its own 32 × 512 tile at 512 threads (32 elements a thread), whatever
    /// `KFUSE_TILES` says of `BM` and `BN`.
    #[test]
    fn the_matrix_copy_takes_its_own_tile() {
        use crate::launch::ArgDesc;
        let args = [ArgDesc::strided(DType::BF16, &[4096, 4097], &[4097, 1]), ArgDesc::strided(DType::BF16, &[4096, 4097], &[4160, 1])];
        let e = crate::launch::emit(&COPY, &args, &Target::sm90a()).unwrap();
        assert!(e.ir.contains("threads=512"), "{}", e.ir);
        assert!(!e.ir.contains("tile BM"), "{}", e.ir);
        assert_eq!(e.grid.iter().map(|g| g.step).collect::<Vec<_>>(), [32, 512]);
    }

    /// The padded copy of `t` (through `make` on the host) holds `t`'s elements, in rows
    /// of the padded pitch.
    fn check_copy(t: &Tensor) -> Tensor {
        let l = PaddedLayout::of(t.shape(), t.strides(), t.dtype().size_bytes()).expect("a layout");
        let c = make(t, &l).unwrap();
        assert_eq!(c.shape(), t.shape());
        assert_eq!(c.strides(), l.strides().as_slice());
        assert_eq!(c.to_vec_f64().unwrap(), t.to_vec_f64().unwrap(), "shape {:?} strides {:?}", t.shape(), t.strides());
        c
    }

    fn iota(shape: &[usize], dt: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|i| (i % 251) as f32).collect();
        Tensor::from_f32(&v, shape, dt, &Device::cpu()).unwrap()
    }

    #[test]
    fn rows_are_padded_to_whole_lines() {
        // bf16 [5, 4097] → rows of 4160 elements, one block of 5 rows
        let l = PaddedLayout::of(&[5, 4097], &[4097, 1], 2).unwrap();
        assert_eq!((l.pitch(), l.strides(), l.blocks.len(), l.height), (4160, vec![4160, 1], 1, 5));
        assert_eq!(l.spec(), TensorSpec { ptr_align: 16, stride_div: vec![16, 0] });
        // a transposed view keeps its unit stride: [N, K] seen as [K, N], K-major
        let l = PaddedLayout::of(&[300, 7], &[1, 300], 2).unwrap();
        assert_eq!((l.pitch(), l.strides()), (320, vec![1, 320]));
        // f32 and 8-bit lines
        assert_eq!(PaddedLayout::of(&[3, 33], &[33, 1], 4).unwrap().pitch(), 64);
        assert_eq!(PaddedLayout::of(&[3, 33], &[33, 1], 1).unwrap().pitch(), 128);
        // no unit stride: no layout
        assert_eq!(PaddedLayout::of(&[4, 4], &[8, 2], 2), None);
        check_copy(&iota(&[5, 300], DType::BF16));
        check_copy(&iota(&[7, 300], DType::BF16).t());
        check_copy(&iota(&[9, 12], DType::F16).narrow(1, 1, 10).unwrap());
    }

    #[test]
    fn batches_merge_or_take_a_block_a_matrix() {
        // a packed batch: one block of 3 · 5 rows
        let x = iota(&[3, 5, 150], DType::BF16);
        let l = PaddedLayout::of(x.shape(), x.strides(), 2).unwrap();
        assert_eq!((l.blocks.len(), l.height), (1, 15));
        check_copy(&x);
        // column slices of a packed batch: the rows continue at one pitch from one
        // matrix to the next, one block still
        let y = iota(&[3, 5, 160], DType::BF16).narrow(2, 3, 150).unwrap();
        let l = PaddedLayout::of(y.shape(), y.strides(), 2).unwrap();
        assert_eq!((l.blocks.len(), l.height, l.src_pitch), (1, 15, 160));
        check_copy(&y);
        // a permuted batch: one block a matrix
        let z = iota(&[5, 3, 150], DType::BF16).permute(&[1, 0, 2]).unwrap();
        let l = PaddedLayout::of(z.shape(), z.strides(), 2).unwrap();
        assert_eq!((l.blocks.len(), l.height), (3, 5));
        check_copy(&z);
        // size-1 dimensions change nothing
        check_copy(&iota(&[1, 5, 1, 150], DType::F16));
    }
}

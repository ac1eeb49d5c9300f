//! TMA tensor maps: the `CUtensorMap` a kernel's [`KernelParam::TensorMap`] parameter
//! receives, built with the driver's `cuTensorMapEncodeTiled`.
//!
//! Owns: the checks of a tensor against what the tensor-memory accelerator can address
//! ([`TiledMapDesc::new`], no GPU needed), the driver call ([`encode_tiled`]), the
//! by-value kernel argument ([`TensorMap`]), and a loaded kernel's recent maps
//! (`MapCache`).
//!
//! The map describes the tensor's whole extent: `globalDim` is the tensor's shape and
//! `globalStrides` its strides in bytes (dimensions 1.. of the innermost-first order),
//! both innermost first, i.e. the reverse of [`Tensor::shape`]; boxes of `box_dims`
//! (given outermost first like the shape, stored reversed); element strides 1; no
//! interleave; L2 promotion 256 bytes; out-of-bounds elements read as zero
//! (`CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE`).
//!
//! What no check here can see, as the kernel names each box: the innermost coordinate of
//! a copy (the column a box starts at) times the element size must be a multiple of 16
//! bytes, or the copy stops the kernel with an illegal instruction (measured on the H100:
//! a bf16 box at column 4 or 100 does, at 8 or 120 not; rows start anywhere, before the
//! tensor too). kfuse's kernels start boxes at multiples of their tiles; a hand-written
//! kernel given a map (`launch_emitted`) must keep to it.
//!
//! Invariants:
//! - Every requirement of `cuTensorMapEncodeTiled` that depends on the tensor or the box
//!   is checked here first and refused with [`Error::InvalidArgument`] saying which one
//!   failed; a refusal by the driver itself is also `InvalidArgument`, with its
//!   `CUresult`. Nothing here panics (the driver call runs under `catch_unwind`, for a
//!   driver too old to have the symbol).
//! - A map is a function of the tensor's dtype, address, shape and strides and of the
//!   box, swizzle and dimension order: a `MapCache` entry, keyed by a kernel
//!   parameter (which fixes the dtype, box, swizzle and order) and the tensor's
//!   address, shape and strides, is the map an encode would make now.
//! - A [`TensorMap`] is 128 bytes aligned to 128: the CUDA 13 headers declare
//!   `CUtensorMap` `alignas(128)` (CUDA 12: 64), and the driver wants the encode target
//!   64-byte aligned; 128 satisfies both.
//!
//! [`KernelParam::TensorMap`]: kfuse_codegen::KernelParam::TensorMap

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::{
    self, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use cudarc::driver::DeviceRepr;
use kfuse_ir::DType;

use crate::error::{driver_error_text, Error, Result};
use crate::tensor::Tensor;

/// Most dimensions a tiled tensor map may have.
pub const MAX_RANK: usize = 5;
/// Largest box extent along one dimension, in elements.
pub const MAX_BOX: u32 = 256;

/// An encoded `CUtensorMap`: 128 opaque bytes, passed to a kernel by value (its
/// parameter is `const __grid_constant__ CUtensorMap`). See the module docs for the
/// alignment.
#[repr(C, align(128))]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TensorMap {
    /// The bytes `cuTensorMapEncodeTiled` wrote.
    pub opaque: [u64; 16],
}

const _: () = assert!(std::mem::size_of::<TensorMap>() == 128);
const _: () = assert!(std::mem::size_of::<sys::CUtensorMap>() == 128);
const _: () = assert!(std::mem::align_of::<TensorMap>() >= std::mem::align_of::<sys::CUtensorMap>());

// SAFETY: `TensorMap` is plain old data with the size and (at least) the alignment of
// the C `CUtensorMap`. cudarc's launch builder passes `&T` arguments to `cuLaunchKernel`
// as a pointer to the value; the driver copies `sizeof(param)` = 128 bytes from it, as
// laid out in the kernel image, so the Rust value only needs to be readable for 128
// bytes until the launch call returns.
unsafe impl DeviceRepr for TensorMap {}

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorMap({:016x?})", &self.opaque[..])
    }
}

/// The `cuTensorMapEncodeTiled` arguments for one tensor and box, checked (see
/// [`TiledMapDesc::new`]). Dimension arrays are innermost first, as the driver takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiledMapDesc {
    /// The element type, in the driver's terms ([`data_type`]).
    pub data_type: CUtensorMapDataType,
    /// Address of element 0.
    pub address: u64,
    /// Extent per dimension, innermost first.
    pub global_dim: Vec<u64>,
    /// Byte stride of dimensions 1.. (innermost first): `rank - 1` entries.
    pub global_strides: Vec<u64>,
    /// Box extent per dimension, innermost first.
    pub box_dim: Vec<u32>,
    /// How shared memory is swizzled (none, 32, 64 or 128 bytes).
    pub swizzle: CUtensorMapSwizzle,
}

/// The tensor-map data type of a dtype.
pub fn data_type(dtype: DType) -> CUtensorMapDataType {
    use CUtensorMapDataType::*;
    match dtype {
        DType::F32 => CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        DType::F16 => CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::I64 => CU_TENSOR_MAP_DATA_TYPE_INT64,
        // one byte per element (fp8 formats, when the IR has them, map here too)
        DType::Bool | DType::F8E4M3 | DType::F8E5M2 => CU_TENSOR_MAP_DATA_TYPE_UINT8,
    }
}

/// The swizzle mode for a swizzle span in bytes (0: none).
pub fn swizzle_mode(bytes: u32) -> Option<CUtensorMapSwizzle> {
    use CUtensorMapSwizzle::*;
    match bytes {
        0 => Some(CU_TENSOR_MAP_SWIZZLE_NONE),
        32 => Some(CU_TENSOR_MAP_SWIZZLE_32B),
        64 => Some(CU_TENSOR_MAP_SWIZZLE_64B),
        128 => Some(CU_TENSOR_MAP_SWIZZLE_128B),
        _ => None,
    }
}

impl TiledMapDesc {
    /// Checks a tensor (dtype, shape and strides in elements, outermost first, address of
    /// element 0) and a box (`box_dims`, outermost first; `swizzle` in bytes) against
    /// the tensor-memory accelerator's rules, and returns the encode arguments. Refused,
    /// with [`Error::InvalidArgument`] naming the rule: a rank of 0 or above 5, an
    /// innermost stride other than 1, a negative stride or one that is not a multiple of
    /// 16 bytes (or ≥ 2^40 bytes), an extent of 0 or above 2^31, an address not 16-byte
    /// aligned, a box of another rank, a box extent of 0 or above 256, an inner box row
    /// that is not a multiple of 16 bytes, a swizzle other than 0/32/64/128 bytes, and an
    /// inner box row longer than the swizzle span.
    pub fn new(dtype: DType, shape: &[usize], strides: &[isize], address: u64, box_dims: &[u32], swizzle: u32) -> Result<TiledMapDesc> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("TMA tensor map of a {dtype} tensor of shape {shape:?}: {m}")));
        let rank = shape.len();
        let es = dtype.size_bytes() as u64;
        if rank == 0 || rank > MAX_RANK {
            return bad(format!("rank {rank}; a tiled tensor map has 1 to {MAX_RANK} dimensions"));
        }
        if strides.len() != rank {
            return bad(format!("{} strides given for {rank} dimensions", strides.len()));
        }
        if strides[rank - 1] != 1 {
            return bad(format!(
                "the innermost stride is {} elements; TMA needs it to be 1 (call `.contiguous()` first)",
                strides[rank - 1]
            ));
        }
        // the driver encodes extents up to 2^32, but a copy names its box by signed
        // 32-bit coordinates: elements from 2^31 on cannot be addressed
        if let Some(d) = (0..rank).find(|&d| shape[d] == 0 || shape[d] as u64 > 1 << 31) {
            return bad(format!("dimension {d} has extent {}; TMA needs 1 to 2^31 (its coordinates are signed 32-bit)", shape[d]));
        }
        let mut global_strides = Vec::with_capacity(rank - 1);
        for d in (0..rank - 1).rev() {
            let s = strides[d];
            if s < 0 {
                return bad(format!("dimension {d} has a negative stride ({s})"));
            }
            let bytes = s as u64 * es;
            if !bytes.is_multiple_of(16) || bytes >= 1 << 40 {
                return bad(format!(
                    "dimension {d} has a stride of {s} elements = {bytes} bytes; TMA needs a multiple of 16 bytes below 2^40"
                ));
            }
            global_strides.push(bytes);
        }
        if !address.is_multiple_of(16) {
            return bad(format!("the address of element 0 ({address:#x}) is not 16-byte aligned"));
        }
        if box_dims.len() != rank {
            return bad(format!("a box of {} dimensions ({box_dims:?}) for a tensor of {rank}", box_dims.len()));
        }
        if let Some(d) = (0..rank).find(|&d| box_dims[d] == 0 || box_dims[d] > MAX_BOX) {
            return bad(format!("box extent {} on dimension {d} (box {box_dims:?}); TMA needs 1 to {MAX_BOX}", box_dims[d]));
        }
        let inner = box_dims[rank - 1] as u64 * es;
        if !inner.is_multiple_of(16) {
            return bad(format!("the box's inner row is {inner} bytes (box {box_dims:?}); TMA needs a multiple of 16"));
        }
        let Some(mode) = swizzle_mode(swizzle) else {
            return bad(format!("swizzle of {swizzle} bytes; TMA swizzles 0, 32, 64 or 128 bytes"));
        };
        if swizzle != 0 && inner > swizzle as u64 {
            return bad(format!(
                "the box's inner row is {inner} bytes (box {box_dims:?}), more than the {swizzle}-byte swizzle span"
            ));
        }
        Ok(TiledMapDesc {
            data_type: data_type(dtype),
            address,
            global_dim: shape.iter().rev().map(|&d| d as u64).collect(),
            global_strides,
            box_dim: box_dims.iter().rev().copied().collect(),
            swizzle: mode,
        })
    }

    /// Encodes the map with `cuTensorMapEncodeTiled`. The caller must have bound the
    /// context of the GPU the address belongs to.
    pub(crate) fn encode(&self) -> Result<TensorMap> {
        let mut map = TensorMap { opaque: [0; 16] };
        let elem_strides = vec![1u32; self.global_dim.len()];
        // SAFETY: the arrays hold `rank` (dims, box, element strides) and `rank - 1`
        // (strides) entries as the call reads; `map` is 128 bytes, 128-byte aligned. The
        // driver only records the address; nothing is read through it here.
        let r = catch_unwind(AssertUnwindSafe(|| unsafe {
            sys::cuTensorMapEncodeTiled(
                (&mut map as *mut TensorMap).cast::<sys::CUtensorMap>(),
                self.data_type,
                self.global_dim.len() as u32,
                self.address as *mut std::ffi::c_void,
                self.global_dim.as_ptr(),
                self.global_strides.as_ptr(),
                self.box_dim.as_ptr(),
                elem_strides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                self.swizzle,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }));
        match r {
            Ok(sys::CUresult::CUDA_SUCCESS) => Ok(map),
            Ok(code) => Err(Error::InvalidArgument(format!(
                "cuTensorMapEncodeTiled refused the tensor map ({}) for {self:?}",
                driver_error_text(cudarc::driver::DriverError(code))
            ))),
            Err(p) => Err(Error::InvalidArgument(format!(
                "cuTensorMapEncodeTiled is not usable (a driver older than CUDA 12?): {}",
                crate::device::panic_text(&p)
            ))),
        }
    }
}

/// The tensor map of a GPU tensor for boxes of `box_dims` (outermost first) and a
/// `swizzle` in bytes. See the module docs for what is checked; a CPU tensor is refused.
pub fn encode_tiled(t: &Tensor, box_dims: &[u32], swizzle: u32) -> Result<TensorMap> {
    let device = t.device();
    let Some(gpu) = device.gpu_ref() else {
        return Err(Error::InvalidArgument(format!(
            "a TMA tensor map describes GPU memory, but this {} tensor of shape {:?} is on the CPU",
            t.dtype(),
            t.shape()
        )));
    };
    let desc = TiledMapDesc::new(t.dtype(), t.shape(), t.strides(), t.address(), box_dims, swizzle)?;
    gpu.bind()?;
    desc.encode()
}

/// The tensor maps a loaded kernel's launches encoded last, so that a launch on
/// tensors seen recently (the same weights, an output the stream-ordered allocator
/// handed out again) copies its map instead of encoding it: three encodes and their
/// views cost ~2 µs of a small GEMM's ~12 µs host time a call on the H100's host
/// (NOTES g26). Holds [`MapCache::CAPACITY`] maps, the oldest replaced first.
#[derive(Default)]
pub(crate) struct MapCache {
    entries: std::sync::Mutex<(Vec<MapEntry>, usize)>,
}

struct MapEntry {
    param: usize,
    address: u64,
    shape: Vec<usize>,
    strides: Vec<isize>,
    map: TensorMap,
}

impl MapCache {
    pub(crate) const CAPACITY: usize = 16;

    /// The map of kernel parameter `param` for `t`: a cached one, or else `encode()`'s
    /// (kept when it succeeds; refusals are not kept).
    pub(crate) fn get_or_encode(&self, param: usize, t: &Tensor, encode: impl FnOnce() -> Result<TensorMap>) -> Result<TensorMap> {
        let address = t.address();
        let hit = |e: &&MapEntry| e.param == param && e.address == address && e.shape == t.shape() && e.strides == t.strides();
        if let Some(e) = self.entries.lock().unwrap_or_else(|e| e.into_inner()).0.iter().find(hit) {
            return Ok(e.map);
        }
        let map = encode()?;
        let entry = MapEntry { param, address, shape: t.shape().to_vec(), strides: t.strides().to_vec(), map };
        let mut g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (entries, next) = &mut *g;
        if entries.len() < Self::CAPACITY {
            entries.push(entry);
        } else {
            entries[*next] = entry;
            *next = (*next + 1) % Self::CAPACITY;
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    fn err(r: Result<TiledMapDesc>) -> String {
        match r {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn a_packed_matrix_reverses_into_driver_order() {
        let d = TiledMapDesc::new(DType::BF16, &[100, 200], &[200, 1], 0x7f00_0000_0000, &[32, 64], 128).unwrap();
        assert_eq!(d.global_dim, vec![200, 100]);
        assert_eq!(d.global_strides, vec![400]);
        assert_eq!(d.box_dim, vec![64, 32]);
        assert_eq!(d.swizzle, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B);
        assert_eq!(d.data_type, CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
        // rank 3, f32, a strided (narrowed) view: strides from the view, not the shape
        let d = TiledMapDesc::new(DType::F32, &[2, 3, 8], &[96, 32, 1], 0x1000, &[1, 3, 4], 0).unwrap();
        assert_eq!(d.global_dim, vec![8, 3, 2]);
        assert_eq!(d.global_strides, vec![128, 384]);
        assert_eq!(d.box_dim, vec![4, 3, 1]);
        assert_eq!(d.swizzle, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE);
        // rank 1: no strides at all
        let d = TiledMapDesc::new(DType::F16, &[1000], &[1], 0x10, &[256], 0).unwrap();
        assert!(d.global_strides.is_empty());
    }

    #[test]
    fn dtypes_and_swizzles_map_to_the_driver_enums() {
        assert_eq!(data_type(DType::F16), CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16);
        assert_eq!(data_type(DType::F32), CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
        assert_eq!(data_type(DType::Bool), CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8);
        assert_eq!(swizzle_mode(32), Some(CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B));
        assert_eq!(swizzle_mode(64), Some(CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B));
        assert_eq!(swizzle_mode(16), None);
    }

    #[test]
    fn the_map_cache_keys_on_parameter_address_shape_and_strides() {
        let cpu = Device::cpu();
        let a = Tensor::empty(&[64, 32], DType::F16, &cpu).unwrap();
        let b = Tensor::empty(&[64, 32], DType::F16, &cpu).unwrap();
        let cache = MapCache::default();
        let encodes = std::cell::Cell::new(0u64);
        let map = |t: &Tensor, param: usize| {
            cache
                .get_or_encode(param, t, || {
                    encodes.set(encodes.get() + 1);
                    // a stand-in for the driver's encode: the inputs it sees, in its bytes
                    let mut m = TensorMap { opaque: [0; 16] };
                    m.opaque[0] = t.address();
                    m.opaque[1] = t.shape()[0] as u64;
                    m.opaque[2] = t.strides()[0] as u64;
                    m.opaque[3] = param as u64;
                    Ok(m)
                })
                .unwrap()
        };
        let first = map(&a, 0);
        assert_eq!((map(&a, 0), encodes.get()), (first, 1), "the same tensor again: copied");
        assert_eq!(map(&a.clone(), 0), first, "a clone is the same tensor");
        assert_eq!(encodes.get(), 1);
        // another parameter, another address, another shape or strides: encoded
        assert_eq!(map(&a, 1).opaque[3], 1);
        assert_eq!(map(&b, 0).opaque[0], b.address());
        assert_eq!(map(&a.narrow(0, 0, 32).unwrap(), 0).opaque[1], 32);
        assert_eq!(map(&a.t(), 0).opaque[2], 1);
        assert_eq!(encodes.get(), 5);
        // a refusal is returned and not kept
        let r = cache.get_or_encode(7, &a, || Err(Error::InvalidArgument("refused".into())));
        assert!(matches!(r, Err(Error::InvalidArgument(m)) if m == "refused"));
        map(&a, 7);
        assert_eq!(encodes.get(), 6, "the refusal was not kept: the next call encodes");
        // past the capacity the oldest goes first: `first`'s entry is replaced
        for p in 0..MapCache::CAPACITY {
            map(&b, 100 + p);
        }
        let before = encodes.get();
        map(&a, 0);
        assert_eq!(encodes.get(), before + 1);
    }

    #[test]
    fn refusals_name_the_rule() {
        let bf = DType::BF16;
        let ok = |shape: &[usize], strides: &[isize], addr: u64, bx: &[u32], sw: u32| TiledMapDesc::new(bf, shape, strides, addr, bx, sw);
        assert!(err(ok(&[100, 200], &[1, 100], 0, &[16, 16], 0)).contains("innermost stride is 100"));
        assert!(err(ok(&[100, 200], &[204, 1], 0, &[16, 16], 0)).contains("408 bytes; TMA needs a multiple of 16"));
        assert!(err(ok(&[100, 200], &[-200, 1], 0, &[16, 16], 0)).contains("negative stride"));
        assert!(err(ok(&[100, 200], &[200, 1], 0x1002, &[16, 16], 0)).contains("not 16-byte aligned"));
        assert!(err(ok(&[100, 200], &[200, 1], 0, &[0, 16], 0)).contains("box extent 0 on dimension 0"));
        assert!(err(ok(&[100, 200], &[200, 1], 0, &[16, 512], 0)).contains("box extent 512 on dimension 1"));
        assert!(err(ok(&[100, 200], &[200, 1], 0, &[16], 0)).contains("a box of 1 dimensions"));
        assert!(err(ok(&[100, 200], &[200, 1], 0, &[16, 12], 0)).contains("inner row is 24 bytes"));
        assert!(err(ok(&[100, 200], &[200, 1], 0, &[16, 128], 128)).contains("more than the 128-byte swizzle span"));
        assert!(err(ok(&[100, 200], &[200, 1], 0, &[16, 32], 32)).contains("more than the 32-byte swizzle span"));
        assert!(err(ok(&[100, 200], &[200, 1], 0, &[16, 16], 48)).contains("swizzle of 48 bytes"));
        assert!(err(ok(&[0, 200], &[200, 1], 0, &[16, 16], 0)).contains("dimension 0 has extent 0"));
        // coordinates are signed 32-bit: 2^31 rows are the most a map reaches
        let big = (1usize << 31) + 1;
        assert!(err(ok(&[big, 8], &[8, 1], 0, &[16, 8], 0)).contains("dimension 0 has extent 2147483649; TMA needs 1 to 2^31"));
        assert!(err(ok(&[8, big], &[big.next_multiple_of(8) as isize, 1], 0, &[8, 16], 0)).contains("dimension 1 has extent 2147483649"));
        ok(&[1 << 31, 8], &[8, 1], 0, &[16, 8], 0).unwrap();
        assert!(err(ok(&[], &[], 0, &[], 0)).contains("rank 0"));
        assert!(err(ok(&[1; 6], &[1; 6], 0, &[1; 6], 0)).contains("rank 6"));
        // within the limits: 64 bf16 = 128 bytes under a 128-byte swizzle
        ok(&[100, 200], &[200, 1], 0, &[256, 64], 128).unwrap();
        ok(&[100, 200], &[200, 1], 0, &[8, 16], 32).unwrap();
    }

    #[test]
    fn a_cpu_tensor_is_refused() {
        let t = Tensor::zeros(&[16, 16], DType::BF16, &Device::cpu()).unwrap();
        match encode_tiled(&t, &[8, 8], 0) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("is on the CPU"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

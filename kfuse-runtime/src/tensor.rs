//! Tensors: a strided view (dtype, shape, strides, offset) of shared storage in host or
//! device memory.
//!
//! Owns: allocation, host ↔ device copies, element conversion through `half`, views
//! (`t`, `narrow`, `reshape`, `view`), and the raw addresses the launcher needs.
//!
//! Invariants:
//! - `strides` and `offset` count elements, not bytes; element `(i0, i1, …)` is element
//!   `offset + Σ i_d · strides[d]` of the storage. Views made here have non-negative
//!   strides and always lie inside their storage.
//! - A shape with a zero anywhere is empty, whatever its other sizes multiply to;
//!   otherwise a shape whose element or byte count does not fit `usize`, or a host
//!   allocation the allocator refuses, is an `InvalidArgument`, never an abort.
//! - Storage is shared (`Arc`) between a tensor and its views; [`Tensor::same_storage`]
//!   says whether two tensors share it. Cloning a tensor makes another view, not a copy.
//! - Host storage is little-endian bytes behind an `RwLock`: writes through `&mut Tensor`
//!   (`fill`, kernel outputs) take the write lock, reads take the read lock.
//! - Device storage is one block of the GPU's memory pool ([`crate::pool`]: the request
//!   rounded up to its size class) plus that GPU's [`Device`]; dropping the storage
//!   returns the block to the pool, which hands it to a later tensor of the same class
//!   without a driver call. A zero-byte tensor takes no block and has address 0. All
//!   device work is ordered on the GPU's one stream (see `device.rs`), which is what makes
//!   the reuse safe, and every read back to the host synchronizes that stream.
//! - Device memory another library owns becomes a tensor without a copy through
//!   [`Tensor::from_device_memory`] (its owner kept alive by the storage), and a packed
//!   tensor that holds its pool block alone leaves the pool as a cudarc slice through
//!   [`Tensor::into_cuda_slice`]; `kfuse_runtime::candle` builds on both.
//! - Element values written from `f32`/`f64` are rounded to the dtype with
//!   [`DType::write`] (round to nearest even).

use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cudarc::driver::{CudaSlice, DevicePtr};
use kfuse_ir::DType;

use crate::device::Device;
use crate::error::{driver, Error, Result};

/// A device allocation: a block of its GPU's memory pool, returned to the pool on drop;
/// or memory another library owns ([`Tensor::from_device_memory`]), kept alive by its
/// owner.
pub(crate) struct DeviceBuffer {
    /// `None` for a zero-byte buffer (the driver refuses zero-byte allocations) and for
    /// memory the pool did not make.
    block: Option<CudaSlice<u8>>,
    /// What keeps memory the pool did not make alive (dropped after the buffer's last use
    /// is issued: the owner's own free must be ordered on the device's stream).
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// The address of byte 0 (0 when empty).
    pub(crate) ptr: u64,
    /// The bytes asked for (the block may be larger: [`crate::pool::size_class`]).
    pub(crate) bytes: usize,
    /// Keeps the GPU record, and so the pool the block returns to, alive.
    pub(crate) device: Device,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let (Some(block), Some(g)) = (self.block.take(), self.device.gpu_ref()) {
            g.memory.free(block);
        }
    }
}

/// The memory behind one or more tensors.
pub(crate) enum Storage {
    Host(RwLock<Vec<u8>>),
    Device(DeviceBuffer),
}

impl Storage {
    fn len_bytes(&self) -> usize {
        match self {
            Storage::Host(v) => read(v).len(),
            Storage::Device(b) => b.bytes,
        }
    }
}

fn read(l: &RwLock<Vec<u8>>) -> RwLockReadGuard<'_, Vec<u8>> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write(l: &RwLock<Vec<u8>>) -> RwLockWriteGuard<'_, Vec<u8>> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// A strided view of elements of one dtype in host or device memory. See the module
/// docs for the layout rules.
///
/// # Examples
///
/// ```
/// use kfuse_runtime::{DType, Device, Tensor};
///
/// let cpu = Device::cpu(); // or Device::gpu(0)?: the same calls
/// let m = Tensor::from_f32(&[1., 2., 3., 4., 5., 6.], &[2, 3], DType::F32, &cpu)?;
/// let mt = m.t(); // [3, 2], sharing storage
/// assert_eq!((mt.shape(), mt.strides()), (&[3, 2][..], &[1, 3][..]));
/// assert!(!mt.is_contiguous() && mt.same_storage(&m));
/// assert_eq!(mt.to_vec_f32()?, [1., 4., 2., 5., 3., 6.]);
/// let col = m.narrow(1, 1, 1)?; // the middle column, [2, 1]
/// assert_eq!(col.to_vec_f32()?, [2., 5.]);
/// let packed = mt.contiguous()?; // a copy, row-major
/// assert!(packed.is_contiguous() && !packed.same_storage(&m));
/// # Ok::<(), kfuse_runtime::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
    storage: Arc<Storage>,
}

/// Row-major packed strides of a shape, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        // saturating: only an empty shape can get here with sizes whose product does not
        // fit, and its strides must still be non-negative
        acc = acc.saturating_mul(isize::try_from(shape[i].max(1)).unwrap_or(isize::MAX));
    }
    s
}

fn checked_numel(shape: &[usize]) -> Result<usize> {
    // a zero anywhere makes it empty, whatever the other sizes multiply to
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} has more elements than fit in memory")))
}

/// The bytes of a packed tensor of `shape` and `dtype`, when that fits in `usize`.
fn checked_bytes(shape: &[usize], dtype: DType) -> Result<usize> {
    checked_numel(shape)?
        .checked_mul(dtype.size_bytes())
        .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} of {dtype} is too large")))
}

/// Calls `f(logical_index, element_index)` for every element of a view, in row-major
/// logical order.
pub(crate) fn for_each_elem(shape: &[usize], strides: &[isize], offset: usize, mut f: impl FnMut(usize, usize)) {
    let n: usize = shape.iter().product();
    if n == 0 {
        return;
    }
    let rank = shape.len();
    let mut idx = vec![0usize; rank];
    let mut pos = offset as isize;
    for i in 0..n {
        f(i, pos as usize);
        // Odometer increment, innermost dimension fastest.
        for d in (0..rank).rev() {
            idx[d] += 1;
            pos += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            pos -= strides[d] * shape[d] as isize;
            idx[d] = 0;
        }
    }
}

/// The strides of `new` (a shape of as many elements, none of them zero) over the
/// elements of the view `(old, strides)` in row-major order, when such strides exist
/// (PyTorch's `computeStride`): `old` is cut into chunks of dimensions that merge (each
/// steps over whole runs of the next), and every chunk must be covered by whole
/// dimensions of `new`.
fn view_strides(old: &[usize], strides: &[isize], new: &[usize]) -> Option<Vec<isize>> {
    let mut out = vec![0isize; new.len()];
    if old.is_empty() {
        // a scalar: `new` is all ones, whose strides are never stepped over
        return Some(contiguous_strides(new));
    }
    let mut view_d = new.len() as isize - 1;
    let mut base = *strides.last()?;
    let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
    for d in (0..old.len()).rev() {
        tensor_numel *= old[d];
        // the chunk ends at `d` unless dimension `d - 1` steps over whole runs of `d..`
        if d == 0 || (old[d - 1] != 1 && strides[d - 1] != (tensor_numel as isize).saturating_mul(base)) {
            while view_d >= 0 && (view_numel < tensor_numel || new[view_d as usize] == 1) {
                out[view_d as usize] = (view_numel as isize).saturating_mul(base);
                view_numel *= new[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if d > 0 {
                base = strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// The range of element indices `[lo, hi)` a view touches (`None` when empty).
fn span(shape: &[usize], strides: &[isize], offset: usize) -> Option<(usize, usize)> {
    if shape.contains(&0) {
        return None;
    }
    let (mut lo, mut hi) = (offset as isize, offset as isize);
    for (&d, &s) in shape.iter().zip(strides) {
        let ext = (d as isize - 1) * s;
        if ext < 0 {
            lo += ext;
        } else {
            hi += ext;
        }
    }
    Some((lo.max(0) as usize, hi as usize + 1))
}

impl Tensor {
    fn alloc(bytes: usize, device: &Device) -> Result<Storage> {
        match device.gpu_ref() {
            None => {
                // fallible: a size no allocation can hold is an error, not an abort
                let mut v = Vec::new();
                v.try_reserve_exact(bytes)
                    .map_err(|e| Error::InvalidArgument(format!("cannot allocate {bytes} bytes of host memory for a tensor: {e}")))?;
                v.resize(bytes, 0);
                Ok(Storage::Host(RwLock::new(v)))
            }
            Some(g) => {
                if bytes == 0 {
                    return Ok(Storage::Device(DeviceBuffer { block: None, owner: None, ptr: 0, bytes: 0, device: device.clone() }));
                }
                let block = g.memory.alloc(&g.stream, bytes).map_err(driver(format_args!("allocating {bytes} bytes on {}", device.description())))?;
                let ptr = {
                    let (ptr, _rec) = block.device_ptr(&g.stream);
                    ptr
                };
                Ok(Storage::Device(DeviceBuffer { ptr, block: Some(block), owner: None, bytes, device: device.clone() }))
            }
        }
    }

    fn packed(storage: Storage, shape: &[usize], dtype: DType) -> Tensor {
        Tensor { dtype, shape: shape.to_vec(), strides: contiguous_strides(shape), offset: 0, storage: Arc::new(storage) }
    }

    /// A packed tensor with unspecified contents (zeros on the CPU; uninitialized device
    /// memory on a GPU, which may hold what an earlier tensor of the pool left there).
    ///
    /// # Examples
    ///
    /// An output for a kernel to write:
    ///
    /// ```
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let out = Tensor::empty(&[128, 64], DType::BF16, &Device::cpu())?;
    /// assert_eq!((out.numel(), out.storage_bytes()), (8192, 16384));
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn empty(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let bytes = checked_bytes(shape, dtype)?;
        Ok(Tensor::packed(Tensor::alloc(bytes, device)?, shape, dtype))
    }

    /// A packed tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// A packed tensor with every element `v` (rounded to `dtype`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let ones = Tensor::full(&[2, 2], 1.0, DType::F16, &Device::cpu())?;
    /// assert_eq!(ones.to_vec_f64()?, [1.0; 4]);
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn full(shape: &[usize], v: f64, dtype: DType, device: &Device) -> Result<Tensor> {
        let mut t = Tensor::empty(shape, dtype, device)?;
        t.fill(v)?;
        Ok(t)
    }

    /// A packed tensor from little-endian element bytes in row-major order.
    ///
    /// # Examples
    ///
    /// ```
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let bytes: Vec<u8> = [7i64, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
    /// let pos = Tensor::from_bytes(&bytes, &[2], DType::I64, &Device::cpu())?; // positions for rope
    /// assert_eq!(pos.to_bytes()?, bytes);
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn from_bytes(bytes: &[u8], shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        let n = checked_numel(shape)?;
        let want = checked_bytes(shape, dtype)?;
        if bytes.len() != want {
            return Err(Error::ShapeMismatch(format!(
                "from_bytes: {} bytes given for shape {shape:?} of {dtype} ({n} elements of {} bytes = {want} bytes)",
                bytes.len(),
                dtype.size_bytes()
            )));
        }
        match device.gpu_ref() {
            None => Ok(Tensor::packed(Storage::Host(RwLock::new(bytes.to_vec())), shape, dtype)),
            Some(g) => {
                let t = Tensor::empty(shape, dtype, device)?;
                if !bytes.is_empty() {
                    g.bind()?;
                    // SAFETY: the destination holds exactly `bytes.len()` bytes; a copy from
                    // pageable memory has read the source by the time it returns.
                    unsafe { cudarc::driver::result::memcpy_htod_async(t.device_base(), bytes, g.stream.cu_stream()) }
                        .map_err(driver(format_args!("copying {} bytes to {}", bytes.len(), device.description())))?;
                }
                Ok(t)
            }
        }
    }

    fn encode(values: impl ExactSizeIterator<Item = f64>, dtype: DType) -> Vec<u8> {
        let mut bytes = vec![0u8; values.len() * dtype.size_bytes()];
        for (i, v) in values.enumerate() {
            dtype.write(&mut bytes, i, v);
        }
        bytes
    }

    fn check_len(what: &str, len: usize, shape: &[usize]) -> Result<()> {
        let n = checked_numel(shape)?;
        if len != n {
            return Err(Error::ShapeMismatch(format!("{what}: {len} values given for shape {shape:?} ({n} elements)")));
        }
        Ok(())
    }

    /// A packed tensor from row-major `f32` values, each rounded to `dtype`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let t = Tensor::from_f32(&[1.0, 0.1], &[2], DType::BF16, &Device::cpu())?;
    /// assert_eq!(t.to_vec_f32()?, [1.0, 0.10009765625]); // 0.1 rounded to bf16
    /// assert!(Tensor::from_f32(&[1.0], &[2], DType::BF16, &Device::cpu()).is_err());
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn from_f32(data: &[f32], shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::check_len("from_f32", data.len(), shape)?;
        Tensor::from_bytes(&Tensor::encode(data.iter().map(|&v| v as f64), dtype), shape, dtype, device)
    }

    /// A packed tensor from row-major `f64` values, each rounded to `dtype`.
    pub fn from_f64(data: &[f64], shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
        Tensor::check_len("from_f64", data.len(), shape)?;
        Tensor::from_bytes(&Tensor::encode(data.iter().copied(), dtype), shape, dtype, device)
    }

    /// The elements in row-major logical order, as little-endian bytes of the dtype
    /// (a packed copy of the view). Synchronizes a GPU.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let es = self.dtype.size_bytes();
        let n = self.numel();
        let mut out = vec![0u8; n * es];
        let Some((lo, hi)) = span(&self.shape, &self.strides, self.offset) else { return Ok(out) };
        let gather = |src: &[u8], base: usize, out: &mut [u8]| {
            for_each_elem(&self.shape, &self.strides, self.offset, |i, e| {
                let s = (e - base) * es;
                out[i * es..(i + 1) * es].copy_from_slice(&src[s..s + es]);
            })
        };
        match &*self.storage {
            Storage::Host(v) => gather(&read(v), 0, &mut out),
            Storage::Device(b) => {
                let host = self.download(b, lo, hi)?;
                gather(&host, lo, &mut out);
            }
        }
        Ok(out)
    }

    /// Copies elements `[lo, hi)` of device storage to the host.
    fn download(&self, b: &DeviceBuffer, lo: usize, hi: usize) -> Result<Vec<u8>> {
        let es = self.dtype.size_bytes();
        let g = b.device.gpu_ref().expect("device storage on a GPU");
        let mut host = vec![0u8; (hi - lo) * es];
        g.bind()?;
        // SAFETY: `[lo, hi)` lies inside the allocation (views stay inside storage).
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut host[..], b.ptr + (lo * es) as u64, g.stream.cu_stream()) }
            .map_err(driver(format_args!("copying {} bytes from {}", host.len(), b.device.description())))?;
        g.sync()?;
        Ok(host)
    }

    /// The elements as `f64`, in row-major logical order (honoring strides and offset).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        let bytes = self.to_bytes()?;
        Ok((0..self.numel()).map(|i| self.dtype.read(&bytes, i)).collect())
    }

    /// The elements as `f32`, in row-major logical order.
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        Ok(self.to_vec_f64()?.into_iter().map(|v| v as f32).collect())
    }

    /// Sets every element of this view to `v` (rounded to the dtype); other elements of
    /// the storage are untouched. `f64::NAN` poisons an output before a test.
    ///
    /// # Examples
    ///
    /// ```
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let mut m = Tensor::zeros(&[2, 3], DType::F32, &Device::cpu())?;
    /// m.narrow(1, 2, 1)?.fill(9.0)?; // the last column, through a view
    /// assert_eq!(m.to_vec_f32()?, [0., 0., 9., 0., 0., 9.]);
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn fill(&mut self, v: f64) -> Result<()> {
        let es = self.dtype.size_bytes();
        let mut one = vec![0u8; es];
        self.dtype.write(&mut one, 0, v);
        let Some((lo, hi)) = span(&self.shape, &self.strides, self.offset) else { return Ok(()) };
        match &*self.storage {
            Storage::Host(l) => {
                let mut data = write(l);
                for_each_elem(&self.shape, &self.strides, self.offset, |_, e| data[e * es..(e + 1) * es].copy_from_slice(&one));
                Ok(())
            }
            Storage::Device(b) => {
                let g = b.device.gpu_ref().expect("device storage on a GPU");
                let n = self.numel();
                let ptr = b.ptr + (lo * es) as u64;
                let stream = g.stream.cu_stream();
                use cudarc::driver::sys;
                if self.is_contiguous() && es != 8 {
                    g.bind()?;
                    // SAFETY: a contiguous view covers exactly `[lo, lo + n)`, inside the
                    // allocation, and `ptr` is aligned to the element size.
                    let r = unsafe {
                        match es {
                            4 => sys::cuMemsetD32Async(ptr, u32::from_le_bytes([one[0], one[1], one[2], one[3]]), n, stream),
                            2 => sys::cuMemsetD16Async(ptr, u16::from_le_bytes([one[0], one[1]]), n, stream),
                            _ => sys::cuMemsetD8Async(ptr, one[0], n, stream),
                        }
                    };
                    return r.result().map_err(driver(format_args!("filling a tensor on {}", b.device.description())));
                }
                // Strided view or 8-byte elements: read-modify-write the span through the
                // host (work on the stream is ordered, so nothing changes in between).
                let mut host = self.download(b, lo, hi)?;
                for_each_elem(&self.shape, &self.strides, self.offset, |_, e| {
                    host[(e - lo) * es..(e - lo + 1) * es].copy_from_slice(&one)
                });
                g.bind()?;
                // SAFETY: `[lo, hi)` lies inside the allocation.
                unsafe { cudarc::driver::result::memcpy_htod_async(ptr, &host[..], stream) }
                    .map_err(driver(format_args!("filling a tensor on {}", b.device.description())))?;
                g.sync()
            }
        }
    }

    /// This tensor's data on `device`, packed. On the device it already lives on, this is
    /// a cheap view sharing storage (like `clone`); elsewhere it is a copy (through the
    /// host between two GPUs).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let host = Tensor::from_f32(&[1.0, 2.0], &[2], DType::F32, &Device::cpu())?;
    /// let on_gpu = host.to_device(&Device::gpu(0)?)?; // upload
    /// let back = on_gpu.to_device(&Device::cpu())?; // download
    /// assert_eq!(back.to_vec_f32()?, [1.0, 2.0]);
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if &self.device() == device {
            return Ok(self.clone());
        }
        Tensor::from_bytes(&self.to_bytes()?, &self.shape, self.dtype, device)
    }

    /// A packed row-major tensor with this tensor's elements: a view sharing storage when
    /// the tensor is already contiguous, else a copy on the same device (on a GPU the
    /// copy goes through the host).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        Tensor::from_bytes(&self.to_bytes()?, &self.shape, self.dtype, &self.device())
    }

    /// A copy in separate storage on the same device, packed.
    ///
    /// ```
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let a = Tensor::zeros(&[4], DType::F32, &Device::cpu())?;
    /// let (view, copy) = (a.clone(), a.deep_clone()?);
    /// assert!(view.same_storage(&a) && !copy.same_storage(&a));
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn deep_clone(&self) -> Result<Tensor> {
        Tensor::from_bytes(&self.to_bytes()?, &self.shape, self.dtype, &self.device())
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The size of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// Element index of element `(0, 0, …)` in the storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements (1 for rank 0).
    pub fn numel(&self) -> usize {
        // an empty view's other sizes may multiply past usize (a permuted `[0, usize::MAX, 2]`)
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape.iter().product()
    }

    /// True when the view is packed row-major: strides equal [`contiguous_strides`] on
    /// every dimension of size > 1 (dimensions of size 1 may have any stride); empty
    /// tensors are contiguous. The offset may be non-zero.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expect = 1isize;
        for d in (0..self.rank()).rev() {
            if self.shape[d] != 1 {
                if self.strides[d] != expect {
                    return false;
                }
                expect *= self.shape[d] as isize;
            }
        }
        true
    }

    /// The device the storage lives on.
    pub fn device(&self) -> Device {
        match &*self.storage {
            Storage::Host(_) => Device::cpu(),
            Storage::Device(b) => b.device.clone(),
        }
    }

    /// The view with its last two dimensions swapped (shares storage). Tensors of rank
    /// below 2 come back unchanged.
    pub fn t(&self) -> Tensor {
        let mut v = self.clone();
        let r = self.rank();
        if r >= 2 {
            v.shape.swap(r - 2, r - 1);
            v.strides.swap(r - 2, r - 1);
        }
        v
    }

    /// The view with a new dimension of size 1 inserted at `dim` (shares storage); its
    /// stride is that of a packed layout, so a contiguous tensor stays contiguous.
    /// `dim` runs from 0 to the rank (inclusive: a new last dimension); a larger one is
    /// an `InvalidArgument`.
    ///
    /// ```
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let v = Tensor::zeros(&[4], DType::F32, &Device::cpu())?;
    /// assert_eq!(v.unsqueeze(0)?.shape(), [1, 4]);
    /// assert_eq!(v.unsqueeze(1)?.shape(), [4, 1]);
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn unsqueeze(&self, dim: usize) -> Result<Tensor> {
        if dim > self.rank() {
            return Err(Error::InvalidArgument(format!(
                "unsqueeze: dimension {dim} of a tensor of rank {} (a new dimension goes at 0 to {})",
                self.rank(),
                self.rank()
            )));
        }
        // a size-1 dimension is never stepped over, so its stride only has to keep a
        // packed layout packed (and not overflow where the sizes are huge)
        let stride = if dim < self.rank() { self.strides[dim].saturating_mul(isize::try_from(self.shape[dim]).unwrap_or(isize::MAX)) } else { 1 };
        let mut v = self.clone();
        v.shape.insert(dim, 1);
        v.strides.insert(dim, stride);
        Ok(v)
    }

    /// The view with its dimensions reordered: dimension `i` of the result is dimension
    /// `perm[i]` of this tensor (shares storage).
    ///
    /// ```
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3, 4], DType::F32, &Device::cpu())?;
    /// let p = x.permute(&[2, 0, 1])?;
    /// assert_eq!((p.shape(), p.strides()), (&[4, 2, 3][..], &[1, 12, 4][..]));
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank() || perm.iter().any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true)) {
            return Err(Error::InvalidArgument(format!("permute: {perm:?} is not a permutation of the {} dimensions", self.rank())));
        }
        let mut v = self.clone();
        v.shape = perm.iter().map(|&p| self.shape[p]).collect();
        v.strides = perm.iter().map(|&p| self.strides[p]).collect();
        Ok(v)
    }

    /// The view with dimension `dim` restricted to `start..start + len` (shares storage).
    ///
    /// ```
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let x = Tensor::from_f32(&[0., 1., 2., 3., 4., 5.], &[6], DType::F32, &Device::cpu())?;
    /// let mid = x.narrow(0, 2, 3)?;
    /// assert_eq!((mid.offset(), mid.to_vec_f32()?), (2, vec![2., 3., 4.]));
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Tensor> {
        if dim >= self.rank() {
            return Err(Error::InvalidArgument(format!("narrow: dimension {dim} of a tensor of rank {}", self.rank())));
        }
        let size = self.shape[dim];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::InvalidArgument(format!(
                "narrow: {start}..{} is out of range for dimension {dim} of size {size}",
                start.saturating_add(len)
            )));
        }
        let mut v = self.clone();
        v.shape[dim] = len;
        // an empty view reads nothing; its offset stays (the start of a huge empty
        // dimension need not be a valid element index)
        if v.numel() > 0 {
            v.offset = (self.offset as isize + start as isize * self.strides[dim]) as usize;
        }
        Ok(v)
    }

    /// The same elements under another shape (shares storage). Needs a contiguous tensor
    /// ([`Error::NonContiguous`] otherwise: call [`Tensor::contiguous`] first) and the same
    /// number of elements.
    ///
    /// ```
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 6], DType::F32, &Device::cpu())?;
    /// assert_eq!(x.reshape(&[3, 4])?.shape(), [3, 4]);
    /// assert!(x.t().reshape(&[12]).is_err()); // strided: `.contiguous()` first
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel(shape)?;
        if n != self.numel() {
            return Err(Error::ShapeMismatch(format!(
                "reshape: shape {:?} ({} elements) cannot become {shape:?} ({n} elements)",
                self.shape,
                self.numel()
            )));
        }
        if !self.is_contiguous() {
            return Err(Error::NonContiguous { what: "reshape".into(), shape: self.shape.clone(), strides: self.strides.clone() });
        }
        let mut v = self.clone();
        v.shape = shape.to_vec();
        v.strides = contiguous_strides(shape);
        Ok(v)
    }

    /// The same elements under another shape, sharing storage, whenever the strides allow
    /// it (PyTorch's `view`): dimensions may be split at will, and merged where each
    /// merged dimension steps over whole runs of the next (`strides[d] == strides[d + 1] ·
    /// shape[d + 1]`, size-1 dimensions aside), so a contiguous tensor takes any shape of
    /// its size and a column slice `[M, N']` of `[B, M, N]` becomes `[B · M, N']`. Unlike
    /// [`Tensor::reshape`] the result may be strided. Errors: another number of elements
    /// (`ShapeMismatch`), strides that cannot be merged as asked (`NonContiguous`).
    ///
    /// ```
    /// # use kfuse_runtime::{DType, Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3, 8], DType::F32, &Device::cpu())?;
    /// let cols = x.narrow(2, 0, 4)?; // [2, 3, 4], rows of 8 apart
    /// let flat = cols.view(&[6, 4])?; // no copy
    /// assert_eq!((flat.strides(), flat.same_storage(&x)), (&[8, 1][..], true));
    /// assert!(cols.view(&[24]).is_err()); // the columns do not merge
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    pub fn view(&self, shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel(shape)?;
        if n != self.numel() {
            return Err(Error::ShapeMismatch(format!(
                "view: shape {:?} ({} elements) cannot become {shape:?} ({n} elements)",
                self.shape,
                self.numel()
            )));
        }
        let mut v = self.clone();
        v.shape = shape.to_vec();
        if n == 0 || self.is_contiguous() {
            v.strides = contiguous_strides(shape);
            return Ok(v);
        }
        v.strides = view_strides(&self.shape, &self.strides, shape).ok_or_else(|| Error::NonContiguous {
            what: format!("view as {shape:?}"),
            shape: self.shape.clone(),
            strides: self.strides.clone(),
        })?;
        Ok(v)
    }

    /// A GPU tensor over `bytes` bytes of device memory at `ptr` that another library
    /// owns, without a copy: a view with `shape`, `strides` and `offset` (in elements, as
    /// [`Tensor::strides`] and [`Tensor::offset`]) of it, on `device`. `owner` is kept
    /// alive by the storage and dropped after the last of its tensors; it is what keeps
    /// the memory allocated (a cudarc slice, another library's tensor), and
    /// [`Tensor::external_owner`] gives it back. Writes through the tensor (a kernel's
    /// output) change the owner's memory.
    ///
    /// Fails with `InvalidArgument` on the CPU device, for a null `ptr` under a non-empty
    /// view, for negative strides or ranks that differ, and when the view reaches past
    /// `bytes`.
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + bytes` must be device memory of `device`'s context, allocated while
    /// `owner` lives; and any other use of that memory must be ordered with this
    /// runtime's on `device`'s stream (its work issued to that stream, or synchronized
    /// with it), including its free: [`Device::from_cuda_stream`] makes a device that
    /// issues its work to another library's stream.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use cudarc::driver::DevicePtr;
    /// use kfuse_runtime::{DType, Device, Tensor};
    ///
    /// let dev = Device::gpu(0)?;
    /// let stream = dev.cuda_stream().unwrap().clone();
    /// let slice = stream.alloc_zeros::<f32>(6).unwrap(); // memory cudarc owns
    /// let ptr = slice.device_ptr(&stream).0;
    /// // SAFETY: the slice is of this device's context and stream and lives in the tensor
    /// let t = unsafe { Tensor::from_device_memory(ptr, 24, &[2, 3], &[3, 1], 0, DType::F32, &dev, Box::new(slice)) }?;
    /// assert_eq!((t.device_ptr(), t.to_vec_f32()?), (Some(ptr), vec![0.0; 6]));
    /// # Ok::<(), kfuse_runtime::Error>(())
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn from_device_memory(
        ptr: u64,
        bytes: usize,
        shape: &[usize],
        strides: &[isize],
        offset: usize,
        dtype: DType,
        device: &Device,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Tensor> {
        if !device.is_gpu() {
            return Err(Error::InvalidArgument("device memory needs a GPU device, not the CPU".into()));
        }
        if shape.len() != strides.len() {
            return Err(Error::InvalidArgument(format!("shape {shape:?} and strides {strides:?} differ in rank")));
        }
        if strides.iter().any(|&s| s < 0) {
            return Err(Error::InvalidArgument(format!("strides {strides:?}: a negative stride is not supported; make the view with non-negative strides")));
        }
        checked_bytes(shape, dtype)?;
        if let Some((_, hi)) = span(shape, strides, offset) {
            let end = hi.checked_mul(dtype.size_bytes()).filter(|&e| e <= bytes);
            if end.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "a view of shape {shape:?}, strides {strides:?}, offset {offset} of {dtype} reaches past the {bytes} bytes of memory given"
                )));
            }
            if ptr == 0 {
                return Err(Error::InvalidArgument("device memory at address 0 (a null pointer) under a non-empty view".into()));
            }
        }
        let buffer = DeviceBuffer { block: None, owner: Some(owner), ptr, bytes, device: device.clone() };
        Ok(Tensor { dtype, shape: shape.to_vec(), strides: strides.to_vec(), offset, storage: Arc::new(Storage::Device(buffer)) })
    }

    /// The owner given to [`Tensor::from_device_memory`] for this tensor's storage;
    /// `None` for memory of this runtime's own.
    pub fn external_owner(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        match &*self.storage {
            Storage::Device(b) => b.owner.as_deref(),
            Storage::Host(_) => None,
        }
    }

    /// This tensor's device memory as a cudarc slice of [`Tensor::numel`] elements of
    /// `T` on its device's stream, without a copy: for handing a result to another
    /// library (which then frees it, stream-ordered, when it drops the slice). The
    /// memory leaves the pool ([`Device::memory_stats`] no longer counts it).
    ///
    /// Only a packed GPU tensor that starts its storage and is its storage's one view can
    /// go (else `InvalidArgument`, saying which; `.contiguous()` and `.deep_clone()`
    /// make one), with memory of this runtime's own (not
    /// [`Tensor::from_device_memory`]'s) and elements of `T`'s size.
    pub fn into_cuda_slice<T>(self) -> Result<CudaSlice<T>> {
        let head = format!("a tensor of shape {:?} ({}) cannot leave as device memory", self.shape, self.dtype);
        let what = |why: &str| Error::InvalidArgument(format!("{head}: {why}"));
        if std::mem::size_of::<T>() != self.dtype.size_bytes() {
            return Err(what(&format!("its elements are {} bytes, the slice's {}", self.dtype.size_bytes(), std::mem::size_of::<T>())));
        }
        if self.offset != 0 || !self.is_contiguous() {
            return Err(what("it is not packed from the start of its storage (`.deep_clone()` makes one that is)"));
        }
        let numel = self.numel();
        let Storage::Device(buffer) = &*self.storage else { return Err(what("it lives on the CPU")) };
        if buffer.owner.is_some() {
            return Err(what("its memory belongs to another library (`Tensor::from_device_memory`)"));
        }
        if buffer.block.is_none() {
            return Err(what("it is empty: it has no device memory"));
        }
        let device = buffer.device.clone();
        let Ok(mut storage) = Arc::try_unwrap(self.storage) else {
            return Err(what("other views share its storage (`.deep_clone()` makes one that does not)"));
        };
        let (Storage::Device(buffer), Some(g)) = (&mut storage, device.gpu_ref()) else { unreachable!("checked above: device storage") };
        let block = buffer.block.take().expect("checked above: a pool block");
        g.memory.hand_over(block.len());
        let ptr = block.leak();
        // SAFETY: `ptr` is the pool's allocation of at least `numel` elements of `T`'s size
        // (its class), now owned by nobody else: the block was leaked and uncounted.
        Ok(unsafe { g.stream.upgrade_device_ptr::<T>(ptr, numel) })
    }

    /// How many tensors (this one among them) are views of this tensor's storage.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    pub(crate) fn storage_views(&self) -> usize {
        Arc::strong_count(&self.storage)
    }

    /// True when both tensors are views of one storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Size of the whole storage in bytes (not just this view).
    pub fn storage_bytes(&self) -> usize {
        self.storage.len_bytes()
    }

    /// Byte offset of element 0 in the storage.
    pub fn byte_offset(&self) -> usize {
        self.offset * self.dtype.size_bytes()
    }

    /// The device address (`CUdeviceptr`) of element 0 for a GPU tensor; `None` on the CPU.
    pub fn device_ptr(&self) -> Option<u64> {
        match &*self.storage {
            Storage::Host(_) => None,
            Storage::Device(b) => Some(b.ptr + self.byte_offset() as u64),
        }
    }

    /// The address of element 0 in its address space (host or device); what alignment
    /// facts are computed from.
    pub fn address(&self) -> u64 {
        match &*self.storage {
            Storage::Host(l) => read(l).as_ptr() as u64 + self.byte_offset() as u64,
            Storage::Device(b) => b.ptr + self.byte_offset() as u64,
        }
    }

    fn device_base(&self) -> u64 {
        match &*self.storage {
            Storage::Host(_) => 0,
            Storage::Device(b) => b.ptr,
        }
    }

    /// Read access to the whole host storage (`None` for a GPU tensor); index it with
    /// [`Tensor::offset`] and [`Tensor::strides`].
    pub fn host_bytes(&self) -> Option<RwLockReadGuard<'_, Vec<u8>>> {
        match &*self.storage {
            Storage::Host(l) => Some(read(l)),
            Storage::Device(_) => None,
        }
    }

    /// Write access to the whole host storage (`None` for a GPU tensor).
    pub fn host_bytes_mut(&mut self) -> Option<RwLockWriteGuard<'_, Vec<u8>>> {
        match &*self.storage {
            Storage::Host(l) => Some(write(l)),
            Storage::Device(_) => None,
        }
    }

    /// The host lock and a stable identity of the storage (for ordered locking).
    pub(crate) fn host_lock(&self) -> Option<(usize, &RwLock<Vec<u8>>)> {
        match &*self.storage {
            Storage::Host(l) => Some((Arc::as_ptr(&self.storage) as *const u8 as usize, l)),
            Storage::Device(_) => None,
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}, {:?}, strides {:?}", self.dtype, self.shape, self.strides)?;
        if self.offset != 0 {
            write!(f, ", offset {}", self.offset)?;
        }
        write!(f, ", {})", self.device())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu() -> Device {
        Device::cpu()
    }

    #[test]
    fn round_trips_per_dtype() {
        let vals = [1.0f32, -2.5, 0.1, 3.0e4, 1.0e-3, 7.0];
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let t = Tensor::from_f32(&vals, &[2, 3], dt, &cpu()).unwrap();
            assert_eq!(t.dtype(), dt);
            assert_eq!(t.shape(), &[2, 3]);
            assert_eq!(t.strides(), &[3, 1]);
            assert_eq!(t.storage_bytes(), 6 * dt.size_bytes());
            let back = t.to_vec_f64().unwrap();
            for (a, b) in vals.iter().zip(&back) {
                assert_eq!(dt.round(*a as f64), *b, "{dt}");
            }
        }
        // bf16 keeps 8 bits of mantissa: 0.1 rounds visibly.
        let t = Tensor::from_f32(&[0.1], &[1], DType::BF16, &cpu()).unwrap();
        assert_eq!(t.to_vec_f32().unwrap()[0], half::bf16::from_f32(0.1).to_f32());
        let t = Tensor::from_f64(&[1.0, 2.0], &[2], DType::I64, &cpu()).unwrap();
        assert_eq!(t.to_bytes().unwrap(), [1i64.to_le_bytes(), 2i64.to_le_bytes()].concat());
    }

    #[test]
    fn from_bytes_and_length_errors() {
        let b: Vec<u8> = [1.5f32, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::from_bytes(&b, &[2], DType::F32, &cpu()).unwrap();
        assert_eq!(t.to_vec_f32().unwrap(), vec![1.5, 2.5]);
        assert!(matches!(Tensor::from_bytes(&b, &[3], DType::F32, &cpu()), Err(Error::ShapeMismatch(_))));
        assert!(matches!(Tensor::from_f32(&[1.0], &[2, 2], DType::F32, &cpu()), Err(Error::ShapeMismatch(_))));
    }

    #[test]
    fn views_share_storage() {
        let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let a = Tensor::from_f32(&data, &[2, 3], DType::F32, &cpu()).unwrap();
        let at = a.t();
        assert_eq!(at.shape(), &[3, 2]);
        assert_eq!(at.strides(), &[1, 3]);
        assert!(!at.is_contiguous());
        assert!(at.same_storage(&a));
        assert_eq!(at.to_vec_f32().unwrap(), vec![0., 3., 1., 4., 2., 5.]);

        let n = a.narrow(1, 1, 2).unwrap();
        assert_eq!(n.shape(), &[2, 2]);
        assert_eq!(n.offset(), 1);
        assert_eq!(n.to_vec_f32().unwrap(), vec![1., 2., 4., 5.]);
        let row = a.narrow(0, 1, 1).unwrap();
        assert!(row.is_contiguous());
        assert_eq!(row.reshape(&[3]).unwrap().to_vec_f32().unwrap(), vec![3., 4., 5.]);
        assert!(matches!(a.narrow(1, 2, 2), Err(Error::InvalidArgument(_))));
        assert!(matches!(a.narrow(2, 0, 1), Err(Error::InvalidArgument(_))));

        let r = a.reshape(&[3, 2]).unwrap();
        assert!(r.same_storage(&a));
        assert_eq!(r.to_vec_f32().unwrap(), data);
        assert!(matches!(a.reshape(&[4]), Err(Error::ShapeMismatch(_))));
        match at.reshape(&[6]) {
            Err(e @ Error::NonContiguous { .. }) => assert!(e.to_string().contains(".contiguous()")),
            other => panic!("expected NonContiguous, got {other:?}"),
        }
        let c = at.contiguous().unwrap();
        assert!(c.is_contiguous() && !c.same_storage(&a));
        assert_eq!(c.reshape(&[6]).unwrap().to_vec_f32().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
        let u = a.unsqueeze(0).unwrap();
        assert_eq!((u.shape(), u.strides()), (&[1, 2, 3][..], &[6, 3, 1][..]));
        assert!(u.is_contiguous() && u.same_storage(&a));
        assert_eq!(a.unsqueeze(2).unwrap().shape(), &[2, 3, 1]);
        assert!(matches!(a.unsqueeze(3), Err(Error::InvalidArgument(_))));
        assert_eq!(at.unsqueeze(1).unwrap().to_vec_f32().unwrap(), at.to_vec_f32().unwrap());
        let p = a.permute(&[1, 0]).unwrap();
        assert_eq!((p.shape(), p.strides()), (at.shape(), at.strides()));
        assert!(a.permute(&[0, 0]).is_err() && a.permute(&[0]).is_err());
        // Rank < 2: t() is the identity.
        let v = Tensor::from_f32(&[1., 2.], &[2], DType::F32, &cpu()).unwrap();
        assert_eq!(v.t().shape(), &[2]);
    }

    #[test]
    fn view_merges_and_splits_what_the_strides_allow() {
        let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let a = Tensor::from_f32(&data, &[2, 3, 4], DType::F32, &cpu()).unwrap();
        // a column slice: the two leading dimensions merge, the last keeps its stride
        let n = a.narrow(2, 1, 2).unwrap();
        let m = n.view(&[6, 2]).unwrap();
        assert_eq!((m.shape(), m.strides()), (&[6, 2][..], &[4, 1][..]));
        assert!(m.same_storage(&a) && m.offset() == 1);
        assert_eq!(m.to_vec_f32().unwrap(), n.to_vec_f32().unwrap());
        // splitting a strided dimension, and size-1 dimensions anywhere
        let t = a.view(&[6, 4]).unwrap().t(); // [4, 6], strides [1, 4]
        let s = t.view(&[2, 2, 1, 6]).unwrap();
        assert_eq!((s.strides()[0], s.strides()[1], s.strides()[3]), (2, 1, 4));
        assert_eq!(s.to_vec_f32().unwrap(), t.to_vec_f32().unwrap());
        assert_eq!(t.view(&[4, 3, 2]).unwrap().to_vec_f32().unwrap(), t.to_vec_f32().unwrap());
        // merges across a transposed pair are refused, by name
        assert!(matches!(t.view(&[24]), Err(Error::NonContiguous { .. })));
        assert!(matches!(n.view(&[12]), Err(Error::NonContiguous { .. })));
        assert!(matches!(a.view(&[5, 5]), Err(Error::ShapeMismatch(_))));
        // contiguous and empty tensors take any shape of their size
        assert_eq!(a.view(&[4, 6]).unwrap().strides(), &[6, 1]);
        assert_eq!(a.narrow(0, 0, 0).unwrap().view(&[0, 7]).unwrap().shape(), &[0, 7]);
        let one = Tensor::from_f32(&[5.0], &[], DType::F32, &cpu()).unwrap();
        assert_eq!(one.view(&[1, 1]).unwrap().to_vec_f32().unwrap(), vec![5.0]);
    }

    #[test]
    fn fill_writes_only_the_view() {
        let mut a = Tensor::zeros(&[3, 4], DType::BF16, &cpu()).unwrap();
        let mut col = a.narrow(1, 1, 2).unwrap();
        col.fill(f64::NAN).unwrap();
        let v = a.to_vec_f64().unwrap();
        for r in 0..3 {
            for c in 0..4 {
                assert_eq!(v[r * 4 + c].is_nan(), (1..3).contains(&c), "{r},{c}");
            }
        }
        a.fill(2.0).unwrap();
        assert!(a.to_vec_f64().unwrap().iter().all(|&x| x == 2.0));
        let f = Tensor::full(&[2], 0.1, DType::F16, &cpu()).unwrap();
        assert_eq!(f.to_vec_f64().unwrap(), vec![DType::F16.round(0.1); 2]);
    }

    #[test]
    fn zero_size_tensors() {
        for shape in [&[0usize][..], &[3, 0], &[0, 5, 2]] {
            let mut t = Tensor::empty(shape, DType::F32, &cpu()).unwrap();
            assert_eq!(t.numel(), 0);
            assert!(t.is_contiguous());
            assert!(t.to_vec_f64().unwrap().is_empty());
            t.fill(1.0).unwrap();
            let t2 = Tensor::from_f32(&[], shape, DType::BF16, &cpu()).unwrap();
            assert_eq!(t2.to_bytes().unwrap().len(), 0);
            assert_eq!(t.t().numel(), 0);
        }
        let a = Tensor::zeros(&[2, 3], DType::F32, &cpu()).unwrap();
        let e = a.narrow(1, 3, 0).unwrap();
        assert_eq!(e.shape(), &[2, 0]);
        assert!(e.to_vec_f32().unwrap().is_empty());
        assert_eq!(e.reshape(&[0]).unwrap().numel(), 0);
        // Rank 0 has one element.
        let s = Tensor::from_f32(&[4.0], &[], DType::F32, &cpu()).unwrap();
        assert_eq!(s.numel(), 1);
        assert_eq!(s.to_vec_f32().unwrap(), vec![4.0]);
    }

    #[test]
    fn to_same_device_shares_and_cpu_has_no_device_ptr() {
        let a = Tensor::zeros(&[4], DType::F32, &cpu()).unwrap();
        let b = a.to_device(&cpu()).unwrap();
        assert!(a.same_storage(&b));
        assert_eq!(a.device_ptr(), None);
        assert_eq!(a.device(), Device::cpu());
        let d = a.deep_clone().unwrap();
        assert!(!d.same_storage(&a));
        assert!(format!("{a:?}").contains("f32"));
    }
}

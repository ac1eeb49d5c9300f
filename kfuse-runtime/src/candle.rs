//! candle interop (feature `candle`; CUDA tensors with `candle-cuda`): candle tensors
//! become kfuse tensors and back, and a kfuse kernel runs as a candle custom op.
//!
//! Owns: the dtype and device correspondence, the two conversions ([`from_candle`],
//! [`to_candle`]) and [`KernelOp`], a candle `CustomOp1/2/3` over a closure of kfuse
//! tensors.
//!
//! Invariants:
//! - On a GPU nothing is copied. A candle CUDA tensor becomes a view of candle's memory
//!   ([`Tensor::from_device_memory`], the candle tensor kept alive by the view) on the
//!   kfuse device of candle's own stream ([`Device::from_cuda_stream`]): the work of both
//!   libraries is ordered on that one stream. A kfuse result goes to candle as its device
//!   memory ([`Tensor::into_cuda_slice`]); a view of a whole candle tensor goes back as
//!   that candle tensor.
//! - On the CPU the storages differ (candle's typed vectors, kfuse's bytes): both ways
//!   copy, and the functions say so.
//! - The dtypes both sides have: f32, f16, bf16, fp8 e4m3 and i64. Others are an error
//!   that names them, never a reinterpretation.
//! - Errors cross as the other side's error type with the original text.

use candle_core as cc;
use cc::backend::BackendStorage;

use crate::{DType, Device, Error, Result, Tensor};

/// The kfuse dtype of a candle dtype: f32, f16, bf16, fp8 e4m3 and i64 (else
/// `InvalidArgument`).
pub fn dtype(d: cc::DType) -> Result<DType> {
    Ok(match d {
        cc::DType::F32 => DType::F32,
        cc::DType::F16 => DType::F16,
        cc::DType::BF16 => DType::BF16,
        cc::DType::F8E4M3 => DType::F8E4M3,
        cc::DType::I64 => DType::I64,
        other => return Err(Error::InvalidArgument(format!("candle's {other:?} has no kfuse dtype (kfuse takes f32, f16, bf16, f8e4m3 and i64 from candle)"))),
    })
}

/// The candle dtype of a kfuse dtype: f32, f16, bf16, fp8 e4m3 and i64 (else
/// `InvalidArgument`).
pub fn candle_dtype(d: DType) -> Result<cc::DType> {
    Ok(match d {
        DType::F32 => cc::DType::F32,
        DType::F16 => cc::DType::F16,
        DType::BF16 => cc::DType::BF16,
        DType::F8E4M3 => cc::DType::F8E4M3,
        DType::I64 => cc::DType::I64,
        other => return Err(refused(other)),
    })
}

fn refused(d: DType) -> Error {
    Error::InvalidArgument(format!("kfuse's {d} goes to candle only as f32, f16, bf16, f8e4m3 or i64"))
}

/// The kfuse device of a candle device: the CPU for candle's CPU; for a candle CUDA
/// device the GPU of its context on its stream ([`Device::from_cuda_stream`]), so that
/// kfuse's launches and candle's work are ordered as issued. Metal, and CUDA without
/// the `candle-cuda` feature, are an error.
pub fn device(dev: &cc::Device) -> Result<Device> {
    match dev {
        cc::Device::Cpu => Ok(Device::cpu()),
        cc::Device::Cuda(d) => cuda::device(d),
        cc::Device::Metal(_) => Err(Error::InvalidArgument("candle's Metal devices have no kfuse device".into())),
    }
}

/// A kfuse tensor with the elements of a candle tensor, same shape. A CUDA tensor is
/// viewed where it lies (same memory, same strides and offset; candle's tensor is kept
/// alive by the view; writes through it change candle's memory), on [`device`]'s GPU;
/// a CPU tensor is copied into a packed host tensor.
///
/// # Examples
///
/// ```
/// use candle_core as cc;
/// use kfuse_runtime::candle::{from_candle, to_candle};
///
/// let c = cc::Tensor::new(&[[1f32, 2., 3.], [4., 5., 6.]], &cc::Device::Cpu)?.t()?;
/// let k = from_candle(&c)?; // a copy on the CPU; a view on a GPU
/// assert_eq!((k.shape(), k.to_vec_f32()?), (&[3, 2][..], vec![1., 4., 2., 5., 3., 6.]));
/// let back = to_candle(k, &cc::Device::Cpu)?;
/// assert_eq!(back.to_vec2::<f32>()?, c.to_vec2::<f32>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn from_candle(t: &cc::Tensor) -> Result<Tensor> {
    let kd = dtype(t.dtype())?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        cc::Storage::Cpu(s) => cpu_tensor(s, layout, kd),
        cc::Storage::Cuda(s) => cuda::view(s, layout, kd, Box::new(t.clone())),
        cc::Storage::Metal(_) => Err(Error::InvalidArgument("candle's Metal tensors have no kfuse counterpart".into())),
    }
}

/// A candle tensor with the elements of a kfuse tensor, on `dev`, same shape. On a GPU
/// nothing is copied: a view of a whole candle tensor ([`from_candle`]'s, unchanged)
/// goes back as that candle tensor; other tensors must be packed from the start of
/// storage they hold alone, of this runtime's memory on `dev`'s stream ([`device`]),
/// and that memory becomes candle's ([`Tensor::into_cuda_slice`]); anything else is an
/// error saying why (`.deep_clone()` makes a tensor that goes). From the CPU to candle's
/// CPU the elements are copied. A tensor on another device than `dev` is an error.
pub fn to_candle(t: Tensor, dev: &cc::Device) -> Result<cc::Tensor> {
    let cd = candle_dtype(t.dtype())?;
    match dev {
        cc::Device::Cpu => {
            if t.device().is_gpu() {
                return Err(Error::DeviceMismatch(format!("a tensor on {} goes to candle's CPU only as a copy: `.to_device(&Device::cpu())` first", t.device())));
            }
            let shape = t.shape().to_vec();
            cc::Tensor::from_raw_buffer(&t.to_bytes()?, cd, &shape, dev).map_err(from_candle_err)
        }
        cc::Device::Cuda(d) => cuda::to_candle(t, d),
        cc::Device::Metal(_) => Err(Error::InvalidArgument("candle's Metal devices have no kfuse device".into())),
    }
}

/// Gathers the elements of a candle CPU storage under `layout` into a packed kfuse host
/// tensor of dtype `kd`.
fn cpu_tensor(s: &cc::CpuStorage, layout: &cc::Layout, kd: DType) -> Result<Tensor> {
    fn gather<T: Copy, const N: usize>(v: &[T], layout: &cc::Layout, bytes: impl Fn(T) -> [u8; N]) -> Result<Vec<u8>> {
        let (dims, strides) = (layout.dims(), layout.stride());
        let last = layout.start_offset() + dims.iter().zip(strides).map(|(&d, &s)| d.saturating_sub(1) * s).sum::<usize>();
        let n: usize = dims.iter().product();
        if n > 0 && last >= v.len() {
            return Err(Error::InvalidArgument(format!("candle layout {layout:?} reaches past its storage of {} elements", v.len())));
        }
        let strides: Vec<isize> = strides.iter().map(|&s| s as isize).collect();
        let mut out = Vec::with_capacity(n * N);
        crate::tensor::for_each_elem(dims, &strides, layout.start_offset(), |_, e| out.extend_from_slice(&bytes(v[e])));
        Ok(out)
    }
    let bytes = match s {
        cc::CpuStorage::F32(v) => gather(v, layout, f32::to_le_bytes)?,
        cc::CpuStorage::F16(v) => gather(v, layout, half::f16::to_le_bytes)?,
        cc::CpuStorage::BF16(v) => gather(v, layout, half::bf16::to_le_bytes)?,
        cc::CpuStorage::I64(v) => gather(v, layout, i64::to_le_bytes)?,
        cc::CpuStorage::F8E4M3(v) => gather(v, layout, |x| [x.to_bits()])?,
        other => return Err(Error::InvalidArgument(format!("candle's {:?} has no kfuse dtype", other.dtype()))),
    };
    Tensor::from_bytes(&bytes, layout.dims(), kd, &Device::cpu())
}

/// A candle CPU storage with the elements of a kfuse host tensor (packed, copied).
fn cpu_storage(t: &Tensor) -> Result<cc::CpuStorage> {
    fn split<T, const N: usize>(b: &[u8], from: impl Fn([u8; N]) -> T) -> Vec<T> {
        b.chunks_exact(N).map(|c| from(c.try_into().expect("chunks of N bytes"))).collect()
    }
    let b = t.to_bytes()?;
    Ok(match t.dtype() {
        DType::F32 => cc::CpuStorage::F32(split(&b, f32::from_le_bytes)),
        DType::F16 => cc::CpuStorage::F16(split(&b, half::f16::from_le_bytes)),
        DType::BF16 => cc::CpuStorage::BF16(split(&b, half::bf16::from_le_bytes)),
        DType::I64 => cc::CpuStorage::I64(split(&b, i64::from_le_bytes)),
        DType::F8E4M3 => cc::CpuStorage::F8E4M3(split(&b, |[x]: [u8; 1]| float8::F8E4M3::from_bits(x))),
        other => return Err(refused(other)),
    })
}

fn from_candle_err(e: cc::Error) -> Error {
    Error::InvalidArgument(format!("candle: {e}"))
}

fn to_candle_err(e: Error) -> cc::Error {
    cc::Error::Msg(format!("kfuse: {e}"))
}

/// A candle custom op (`CustomOp1`, `CustomOp2`, `CustomOp3`, forward only) that runs a
/// closure of kfuse tensors: it gets the op's inputs as kfuse tensors on the device of
/// candle's tensors ([`from_candle`]'s views on a GPU, with candle's strides; copies on
/// the CPU) and returns the output, which becomes the op's candle tensor
/// ([`to_candle`]'s rules: on a GPU, a tensor the closure allocated on the inputs'
/// device, packed, goes without a copy).
///
/// The inputs view candle's memory for the length of the call only: a closure that
/// keeps one (a clone) past its return makes the op fail, since candle may free that
/// memory afterwards.
///
/// # Examples
///
/// ```
/// use candle_core as cc;
/// use kfuse_runtime::candle::KernelOp;
/// use kfuse_runtime::Tensor;
///
/// // any kfuse call works inside: a `#[kfuse]` kernel's launcher, an op of `kfuse::ops`
/// let double = KernelOp::new("double", |x: &[Tensor]| {
///     let v: Vec<f32> = x[0].to_vec_f32()?.iter().map(|v| 2.0 * v).collect();
///     Tensor::from_f32(&v, x[0].shape(), x[0].dtype(), &x[0].device())
/// });
/// let a = cc::Tensor::new(&[1f32, 2., 3.], &cc::Device::Cpu)?;
/// assert_eq!(a.apply_op1_no_bwd(&double)?.to_vec1::<f32>()?, [2., 4., 6.]);
/// # Ok::<(), cc::Error>(())
/// ```
pub struct KernelOp<F> {
    name: &'static str,
    f: F,
}

impl<F> KernelOp<F>
where
    F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync,
{
    /// The op `name` (candle's name for it in errors) running `f`.
    pub fn new(name: &'static str, f: F) -> KernelOp<F> {
        KernelOp { name, f }
    }

    fn cpu(&self, inputs: &[(&cc::CpuStorage, &cc::Layout)]) -> cc::Result<(cc::CpuStorage, cc::Shape)> {
        let run = || -> Result<(cc::CpuStorage, cc::Shape)> {
            let xs = inputs.iter().map(|(s, l)| cpu_tensor(s, l, dtype(s.dtype())?)).collect::<Result<Vec<_>>>()?;
            let y = (self.f)(&xs)?;
            if y.device().is_gpu() {
                return Err(Error::DeviceMismatch(format!("op `{}` got CPU tensors and returned one on {}", self.name, y.device())));
            }
            Ok((cpu_storage(&y)?, cc::Shape::from_dims(y.shape())))
        };
        run().map_err(to_candle_err)
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda(&self, inputs: &[(&cc::CudaStorage, &cc::Layout)]) -> cc::Result<(cc::CudaStorage, cc::Shape)> {
        cuda::forward(self.name, &self.f, inputs).map_err(to_candle_err)
    }
}

/// The three arities of candle's custom ops, each the same closure over a slice.
macro_rules! custom_op {
    ($trait:ident, $($s:ident $l:ident),+) => {
        impl<F> cc::$trait for KernelOp<F>
        where
            F: Fn(&[Tensor]) -> Result<Tensor> + Send + Sync,
        {
            fn name(&self) -> &'static str {
                self.name
            }

            fn cpu_fwd(&self, $($s: &cc::CpuStorage, $l: &cc::Layout),+) -> cc::Result<(cc::CpuStorage, cc::Shape)> {
                self.cpu(&[$(($s, $l)),+])
            }

            #[cfg(feature = "candle-cuda")]
            fn cuda_fwd(&self, $($s: &cc::CudaStorage, $l: &cc::Layout),+) -> cc::Result<(cc::CudaStorage, cc::Shape)> {
                self.cuda(&[$(($s, $l)),+])
            }
        }
    };
}

custom_op!(CustomOp1, s1 l1);
custom_op!(CustomOp2, s1 l1, s2 l2);
custom_op!(CustomOp3, s1 l1, s2 l2, s3 l3);

#[cfg(feature = "candle-cuda")]
mod cuda {
    use cudarc::driver::{CudaSlice, DevicePtr};

    use super::*;

    pub(super) fn device(d: &cc::CudaDevice) -> Result<Device> {
        Device::from_cuda_stream(d.cuda_stream())
    }

    /// The address and byte length of a candle CUDA storage's memory.
    fn memory(s: &cc::CudaStorage) -> Result<(u64, usize)> {
        fn of<T>(v: &CudaSlice<T>) -> (u64, usize) {
            let (ptr, _record) = v.device_ptr(v.stream());
            (ptr, v.num_bytes())
        }
        use cc::cuda_backend::CudaStorageSlice as S;
        Ok(match &s.slice {
            S::F32(v) => of(v),
            S::F16(v) => of(v),
            S::BF16(v) => of(v),
            S::I64(v) => of(v),
            S::F8E4M3(v) => of(v),
            _ => return Err(Error::InvalidArgument(format!("candle's {:?} has no kfuse dtype", s.dtype()))),
        })
    }

    /// A view of candle's memory under `layout`, kept alive by `owner`.
    pub(super) fn view(s: &cc::CudaStorage, layout: &cc::Layout, kd: DType, owner: Box<dyn std::any::Any + Send + Sync>) -> Result<Tensor> {
        let dev = device(&s.device)?;
        let (ptr, bytes) = memory(s)?;
        let strides: Vec<isize> = layout.stride().iter().map(|&st| st as isize).collect();
        // SAFETY: the memory is candle's allocation of `bytes` bytes in the context of
        // `dev`, kept allocated by `owner`; kfuse's work on it goes to candle's stream,
        // where candle also frees it.
        unsafe { Tensor::from_device_memory(ptr, bytes, layout.dims(), &strides, layout.start_offset(), kd, &dev, owner) }
    }

    pub(super) fn to_candle(t: Tensor, d: &cc::CudaDevice) -> Result<cc::Tensor> {
        let dev = device(d)?;
        if t.device() != dev {
            return Err(Error::DeviceMismatch(format!(
                "a tensor on {} goes to candle's device on {dev} only as a copy: make it on `kfuse_runtime::candle::device(&candle_device)`, or `.to_device` it there",
                t.device()
            )));
        }
        if let Some(c) = t.external_owner().and_then(|o| o.downcast_ref::<cc::Tensor>()) {
            let l = c.layout();
            let same = l.dims() == t.shape() && l.start_offset() == t.offset() && l.stride().iter().zip(t.strides()).all(|(&a, &b)| a as isize == b);
            if same {
                return Ok(c.clone());
            }
            return Err(Error::InvalidArgument(format!(
                "a view (shape {:?}, strides {:?}) of a candle tensor of layout {l:?} goes back to candle only whole, or as a copy (`.deep_clone()`)",
                t.shape(),
                t.strides()
            )));
        }
        let shape = cc::Shape::from_dims(t.shape());
        if t.numel() == 0 {
            // no memory to hand over: candle's own empty tensor
            let kind = candle_dtype(t.dtype())?;
            return cc::Tensor::zeros(shape, kind, &cc::Device::Cuda(d.clone())).map_err(from_candle_err);
        }
        let storage = storage(t, d)?;
        Ok(cc::Tensor::from_storage(cc::Storage::Cuda(storage), shape, cc::op::BackpropOp::none(), false))
    }

    /// The memory of a packed kfuse GPU tensor as a candle CUDA storage, no copy.
    fn storage(t: Tensor, d: &cc::CudaDevice) -> Result<cc::CudaStorage> {
        Ok(match t.dtype() {
            DType::F32 => cc::CudaStorage::wrap_cuda_slice(t.into_cuda_slice::<f32>()?, d.clone()),
            DType::F16 => cc::CudaStorage::wrap_cuda_slice(t.into_cuda_slice::<half::f16>()?, d.clone()),
            DType::BF16 => cc::CudaStorage::wrap_cuda_slice(t.into_cuda_slice::<half::bf16>()?, d.clone()),
            DType::I64 => cc::CudaStorage::wrap_cuda_slice(t.into_cuda_slice::<i64>()?, d.clone()),
            DType::F8E4M3 => cc::CudaStorage::wrap_cuda_slice(t.into_cuda_slice::<float8::F8E4M3>()?, d.clone()),
            other => return Err(refused(other)),
        })
    }

    /// [`KernelOp`]'s forward pass on candle CUDA storages.
    pub(super) fn forward<F>(name: &str, f: &F, inputs: &[(&cc::CudaStorage, &cc::Layout)]) -> Result<(cc::CudaStorage, cc::Shape)>
    where
        F: Fn(&[Tensor]) -> Result<Tensor>,
    {
        let Some((first, _)) = inputs.first() else { return Err(Error::InvalidArgument(format!("op `{name}` has no input"))) };
        // the storages are borrowed for this call: the views own nothing
        let xs = inputs.iter().map(|(s, l)| view(s, l, dtype(s.dtype())?, Box::new(()))).collect::<Result<Vec<_>>>()?;
        let y = f(&xs)?;
        if let Some(i) = xs.iter().position(|x| x.storage_views() > 1) {
            return Err(Error::InvalidArgument(format!(
                "op `{name}` kept a view of its input #{i} past the call (candle may free that memory): copy it with `.deep_clone()` instead"
            )));
        }
        drop(xs);
        let shape = cc::Shape::from_dims(y.shape());
        Ok((storage(y, &first.device)?, shape))
    }
}

#[cfg(not(feature = "candle-cuda"))]
mod cuda {
    use super::*;

    fn off() -> Error {
        Error::InvalidArgument("candle CUDA tensors need kfuse's `candle-cuda` feature (this build has `candle` only)".into())
    }

    pub(super) fn device(_: &cc::CudaDevice) -> Result<Device> {
        Err(off())
    }

    pub(super) fn view(_: &cc::CudaStorage, _: &cc::Layout, _: DType, _: Box<dyn std::any::Any + Send + Sync>) -> Result<Tensor> {
        Err(off())
    }

    pub(super) fn to_candle(_: Tensor, _: &cc::CudaDevice) -> Result<cc::Tensor> {
        Err(off())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_correspond_or_are_refused_by_name() {
        for d in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::I64] {
            assert_eq!(dtype(candle_dtype(d).unwrap()).unwrap(), d);
        }
        assert!(candle_dtype(DType::Bool).unwrap_err().to_string().contains("bool"));
        assert!(candle_dtype(DType::F8E5M2).unwrap_err().to_string().contains("f8e5m2"));
        assert!(dtype(cc::DType::U32).unwrap_err().to_string().contains("U32"));
    }
}

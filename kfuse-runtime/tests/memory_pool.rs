//! GPU tests of the device memory pool (`kfuse_runtime::pool`): a freed tensor's block is
//! handed to the next tensor of its size class without a driver call and holds that
//! tensor's data, the statistics count what the test allocates (in class sizes), and
//! `empty_cache` and an allocation the GPU cannot hold give the cached blocks back.
//!
//! A binary of its own, its tests one at a time (`SERIAL`): the statistics are the
//! process's, so no other test may allocate on the GPU meanwhile. GPU-only: ignored
//! (counted as skipped) unless built with `--cfg kfuse_gpu` (`scripts/gpu-build.sh`),
//! then failed where no GPU is found.

mod common;

use std::sync::{Mutex, MutexGuard};

use common::{gpu, values};
use kfuse_runtime::pool::size_class;
use kfuse_runtime::{DType, Device, Error, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `vals` rounded to `dt`, as the GPU tensor should read back.
fn rounded(vals: &[f32], dt: DType) -> Vec<f32> {
    vals.iter().map(|&v| dt.round(v as f64) as f32).collect()
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn freed_blocks_are_reused_counted_and_given_back() {
    let _serial = serial();
    let d = gpu();
    d.empty_cache().unwrap();
    let s0 = d.memory_stats();
    assert_eq!(s0.reserved_bytes, s0.allocated_bytes, "empty_cache leaves no cached block: {s0:?}");
    d.reset_peak_memory_stats();
    assert_eq!(d.memory_stats().peak_allocated_bytes, s0.allocated_bytes);

    // a small tensor (4000 bytes: the 4096-byte class) and a large one (6,000,000 bytes:
    // the 6 MiB class), both new to the pool
    let (small, large) = (1000usize, 3000 * 1000usize);
    let want = size_class(small * 4).unwrap() + size_class(large * 2).unwrap();
    assert_eq!(want, 4096 + (6 << 20));
    let (va, vb) = (values(small, 11), values(large, 12));
    let mut a = Tensor::from_f32(&va, &[small], DType::F32, &d).unwrap();
    let b = Tensor::from_f32(&vb, &[3000, 1000], DType::BF16, &d).unwrap();
    let s1 = d.memory_stats();
    assert_eq!(s1.allocated_bytes, s0.allocated_bytes + want, "{s1:?}");
    assert_eq!(s1.reserved_bytes, s0.reserved_bytes + want, "{s1:?}");
    assert_eq!(s1.peak_allocated_bytes, s0.allocated_bytes + want, "the peak is what the test allocated, in class sizes: {s1:?}");
    assert_eq!((s1.allocations - s0.allocations, s1.driver_allocations - s0.driver_allocations, s1.pool_hits), (2, 2, s0.pool_hits));
    assert_eq!(a.to_vec_f32().unwrap(), va);
    assert_eq!(b.to_vec_f32().unwrap(), rounded(&vb, DType::BF16));
    let (at_a, at_b) = (a.device_ptr().unwrap(), b.device_ptr().unwrap());

    // dropped while work that writes them is still queued: the blocks are cached at once
    a.fill(7.5).unwrap();
    drop(a);
    drop(b);
    let s2 = d.memory_stats();
    assert_eq!((s2.allocated_bytes, s2.reserved_bytes), (s0.allocated_bytes, s0.reserved_bytes + want), "{s2:?}");
    assert_eq!(s2.peak_allocated_bytes, s1.peak_allocated_bytes);

    // the same classes (other shapes and dtypes of the same rounded size) come from the
    // cache, without a driver call, and read back their own data, not the fill queued
    // before them or the old contents
    let (vc, ve) = (values(small * 2, 13), values(2999 * 1000, 14));
    let c = Tensor::from_f32(&vc, &[small * 2], DType::F16, &d).unwrap();
    let e = Tensor::from_f32(&ve, &[2999, 1000], DType::BF16, &d).unwrap();
    let s3 = d.memory_stats();
    assert_eq!((s3.pool_hits - s2.pool_hits, s3.driver_allocations, s3.allocations - s2.allocations), (2, s2.driver_allocations, 2), "{s3:?}");
    assert_eq!((c.device_ptr().unwrap(), e.device_ptr().unwrap()), (at_a, at_b), "each block went to the next tensor of its class");
    assert_eq!(s3.reserved_bytes, s2.reserved_bytes);
    assert_eq!(s3.peak_allocated_bytes, s0.allocated_bytes + want);
    assert_eq!(c.to_vec_f32().unwrap(), rounded(&vc, DType::F16));
    assert_eq!(e.to_vec_f32().unwrap(), rounded(&ve, DType::BF16));

    // another class misses
    let f = Tensor::from_f32(&values(small * 3, 15), &[small * 3], DType::F32, &d).unwrap();
    let s4 = d.memory_stats();
    assert_eq!((s4.driver_allocations - s3.driver_allocations, s4.pool_hits), (1, s3.pool_hits));
    assert_eq!(s4.peak_allocated_bytes, s0.allocated_bytes + want + size_class(small * 12).unwrap());

    // zero-byte tensors take no block and are not counted
    let z = Tensor::empty(&[0, 5], DType::F32, &d).unwrap();
    assert_eq!(z.device_ptr(), Some(0));
    assert_eq!(d.memory_stats(), s4);

    // empty_cache gives the cached blocks back and keeps the live ones
    drop((c, e));
    assert!(d.memory_stats().reserved_bytes > d.memory_stats().allocated_bytes);
    d.empty_cache().unwrap();
    let s5 = d.memory_stats();
    assert_eq!((s5.allocated_bytes, s5.reserved_bytes), (s4.allocated_bytes - want, s4.allocated_bytes - want), "{s5:?}");
    assert_eq!(f.to_vec_f32().unwrap(), values(small * 3, 15), "a live tensor survives empty_cache");
    drop(f);
    d.empty_cache().unwrap();
    assert_eq!(d.memory_stats().reserved_bytes, s0.allocated_bytes);

    // the peak restarts from what is allocated now
    d.reset_peak_memory_stats();
    assert_eq!(d.memory_stats().peak_allocated_bytes, s0.allocated_bytes);
    assert_eq!(Device::cpu().memory_stats(), Default::default());
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn an_allocation_the_gpu_cannot_hold_frees_the_cache_then_fails_clearly() {
    let _serial = serial();
    let d = gpu();
    let held = Tensor::from_f32(&values(4096, 21), &[4096], DType::F32, &d).unwrap();
    drop(Tensor::from_f32(&values(100_000, 22), &[100_000], DType::F32, &d).unwrap());
    let before = d.memory_stats();
    assert!(before.reserved_bytes > before.allocated_bytes, "a block is cached: {before:?}");

    let total = {
        d.cuda_context().unwrap().bind_to_thread().unwrap();
        kfuse_runtime::cudarc::driver::result::mem_get_info().unwrap().1
    };
    // about twice the GPU's memory, in f32 elements
    let n = total / 2;
    let err = Tensor::empty(&[n], DType::F32, &d).expect_err("an allocation of twice the GPU's memory fails");
    let msg = err.to_string();
    assert!(matches!(err, Error::Driver(_)) && msg.contains(&format!("allocating {} bytes on cuda:0", n * 4)) && msg.contains("OUT_OF_MEMORY"), "{msg}");
    let after = d.memory_stats();
    assert_eq!((after.allocated_bytes, after.reserved_bytes), (before.allocated_bytes, before.allocated_bytes), "the retry freed the cache first: {after:?}");
    assert_eq!((after.allocations, after.driver_allocations), (before.allocations, before.driver_allocations));

    // the device is usable afterwards, and the live tensor kept its data
    let again = Tensor::from_f32(&values(100_000, 23), &[100_000], DType::F32, &d).unwrap();
    assert_eq!(again.to_vec_f32().unwrap(), values(100_000, 23));
    assert_eq!(held.to_vec_f32().unwrap(), values(4096, 21));
    d.synchronize().unwrap();
}

//! Device memory: a stream-ordered caching pool per GPU, and its statistics.
//!
//! Owns: the size classes requests are rounded to ([`size_class`]), the free blocks of
//! each class, [`MemoryStats`], and giving cached blocks back to the driver (out of
//! memory, [`Device::empty_cache`](crate::Device::empty_cache)).
//!
//! Invariants:
//! - A block is one driver allocation of exactly its class's size, made with
//!   `cuMemAllocAsync` on the GPU's one stream (through cudarc, which falls back to
//!   `cuMemAlloc` where the driver has no stream-ordered allocator). A tensor's storage
//!   owns one block; when the storage is dropped the block goes to its class's free list,
//!   not to the driver, and the next request of that class takes it without a driver
//!   call.
//! - Reuse is safe because all device work of the runtime is ordered on the GPU's one
//!   stream (`device.rs`): work issued with a block's old tensor is on the stream before
//!   any work issued with its new one, so it runs first; a read back to the host
//!   synchronizes the stream. This is the ordering `cuMemFreeAsync` itself relies on. Work
//!   a program issues on another stream (through [`Device::cuda_stream`]'s context) must be
//!   ordered after the runtime's stream by the program, as it must for any stream-ordered
//!   free.
//! - A block can leave the pool for good ([`crate::Tensor::into_cuda_slice`]): it is then
//!   counted neither as allocated nor as reserved, and its new owner frees it.
//! - Statistics, in class sizes: `allocated_bytes` is held by live storage,
//!   `reserved_bytes` is `allocated_bytes` plus the cached blocks, and
//!   `allocations == pool_hits + driver_allocations`. Zero-byte tensors take no block
//!   and are not counted.
//! - A driver allocation that fails for lack of memory frees every cached block,
//!   synchronizes the stream (so the driver's own pool releases them) and is tried once
//!   more; a second failure is the error.
//! - Blocks are cudarc `CudaSlice`s, each holding the stream and so the CUDA context: no
//!   block outlives its context, whatever the order in which a `Gpu` and its tensors go.
//!   The pool lives in the `Gpu` record, and every device buffer holds its [`Device`], so
//!   the pool outlives every buffer that returns a block to it.
//! - The lock is held only to move a block between a free list and its owner and to count;
//!   driver calls happen outside it.
//!
//! [`Device`]: crate::Device
//! [`Device::cuda_stream`]: crate::Device::cuda_stream

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaSlice, CudaStream, DriverError};

/// Requests of up to this many bytes are rounded to a multiple of [`SMALL_QUANTUM`]; larger
/// ones to a multiple of [`LARGE_QUANTUM`].
pub const SMALL_LIMIT: usize = 1 << 20;
/// The rounding of requests up to [`SMALL_LIMIT`]: 512 bytes.
pub const SMALL_QUANTUM: usize = 512;
/// The rounding of requests above [`SMALL_LIMIT`]: 2 MiB.
pub const LARGE_QUANTUM: usize = 2 << 20;

/// The size of the block a request of `bytes` gets: `bytes` rounded up to a multiple of
/// 512 up to 1 MiB, to a multiple of 2 MiB above (so a block holds less than 512 bytes
/// more than asked up to 1 MiB, and less than 2 MiB more above). 0 stays 0 (no block).
/// `None` when the rounded size does not fit `usize`.
///
/// ```
/// use kfuse_runtime::pool::size_class;
/// assert_eq!(size_class(4), Some(512));
/// assert_eq!(size_class(1 << 20), Some(1 << 20));
/// assert_eq!(size_class((1 << 20) + 1), Some(2 << 20));
/// assert_eq!(size_class(5 << 20), Some(6 << 20));
/// ```
pub fn size_class(bytes: usize) -> Option<usize> {
    let quantum = if bytes <= SMALL_LIMIT { SMALL_QUANTUM } else { LARGE_QUANTUM };
    bytes.checked_next_multiple_of(quantum)
}

/// What a GPU's memory pool holds and has done ([`Device::memory_stats`]). Bytes are
/// block sizes ([`size_class`] of the requests); counts are since the device was opened.
/// The CPU device reports all zeros (host tensors are ordinary heap memory, not pooled).
///
/// ```no_run
/// # fn main() -> kfuse_runtime::Result<()> {
/// use kfuse_runtime::{DType, Device, Tensor};
/// let dev = Device::gpu(0)?;
/// dev.reset_peak_memory_stats();
/// let t = Tensor::empty(&[1024, 1024], DType::BF16, &dev)?;
/// let s = dev.memory_stats();
/// assert!(s.allocated_bytes >= t.storage_bytes() && s.peak_allocated_bytes >= s.allocated_bytes);
/// drop(t); // the block is cached: reserved_bytes stays
/// dev.empty_cache()?; // now the driver has it back
/// # Ok(())
/// # }
/// ```
///
/// [`Device::memory_stats`]: crate::Device::memory_stats
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes of the blocks held by live tensor storage.
    pub allocated_bytes: usize,
    /// Bytes held from the driver: `allocated_bytes` plus the cached free blocks.
    pub reserved_bytes: usize,
    /// The most `allocated_bytes` has been since the device was opened or since
    /// [`Device::reset_peak_memory_stats`](crate::Device::reset_peak_memory_stats).
    pub peak_allocated_bytes: usize,
    /// Blocks handed to tensors (zero-byte tensors take none): `pool_hits +
    /// driver_allocations`.
    pub allocations: u64,
    /// Allocations served from the cache, without a driver call.
    pub pool_hits: u64,
    /// Allocations the driver made (`cuMemAllocAsync`).
    pub driver_allocations: u64,
}

/// The free lists and the statistics, independent of CUDA (`B` is a block: a
/// `CudaSlice<u8>` on a GPU, anything in the tests).
pub(crate) struct FreeLists<B> {
    /// Cached blocks by class size.
    free: BTreeMap<usize, Vec<B>>,
    stats: MemoryStats,
}

impl<B> Default for FreeLists<B> {
    fn default() -> Self {
        FreeLists { free: BTreeMap::new(), stats: MemoryStats::default() }
    }
}

impl<B> FreeLists<B> {
    /// A cached block of class `size`, now counted as allocated; `None` when there is none.
    pub(crate) fn take(&mut self, size: usize) -> Option<B> {
        let block = self.free.get_mut(&size)?.pop()?;
        self.stats.pool_hits += 1;
        self.count_allocated(size);
        Some(block)
    }

    /// Counts a block of class `size` that the driver just made as allocated.
    pub(crate) fn add_fresh(&mut self, size: usize) {
        self.stats.driver_allocations += 1;
        self.stats.reserved_bytes += size;
        self.count_allocated(size);
    }

    fn count_allocated(&mut self, size: usize) {
        let s = &mut self.stats;
        s.allocations += 1;
        s.allocated_bytes += size;
        s.peak_allocated_bytes = s.peak_allocated_bytes.max(s.allocated_bytes);
    }

    /// Caches a block of class `size` whose storage is gone.
    pub(crate) fn put(&mut self, size: usize, block: B) {
        debug_assert!(size <= self.stats.allocated_bytes, "a block of {size} bytes returned with {} allocated", self.stats.allocated_bytes);
        self.stats.allocated_bytes = self.stats.allocated_bytes.saturating_sub(size);
        self.free.entry(size).or_default().push(block);
    }

    /// Uncounts an allocated block of class `size` that left the pool for another owner.
    pub(crate) fn hand_over(&mut self, size: usize) {
        let s = &mut self.stats;
        s.allocated_bytes = s.allocated_bytes.saturating_sub(size);
        s.reserved_bytes = s.reserved_bytes.saturating_sub(size);
    }

    /// Every cached block, taken out of the pool (for the driver to free).
    pub(crate) fn drain(&mut self) -> Vec<B> {
        self.stats.reserved_bytes = self.stats.allocated_bytes;
        std::mem::take(&mut self.free).into_values().flatten().collect()
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        self.stats
    }

    /// Starts the peak over from what is allocated now.
    pub(crate) fn reset_peak(&mut self) {
        self.stats.peak_allocated_bytes = self.stats.allocated_bytes;
    }
}

/// One GPU's pool (a field of its `Gpu` record). See the module docs.
#[derive(Default)]
pub(crate) struct DevicePool {
    lists: Mutex<FreeLists<CudaSlice<u8>>>,
}

impl DevicePool {
    fn lock(&self) -> MutexGuard<'_, FreeLists<CudaSlice<u8>>> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of [`size_class`]`(bytes)` bytes (`bytes > 0`) for work on `stream`: a
    /// cached one, else a new one from the driver (after giving the cache back to the
    /// driver, once, when it is out of memory). Its memory is uninitialized.
    pub(crate) fn alloc(&self, stream: &Arc<CudaStream>, bytes: usize) -> Result<CudaSlice<u8>, DriverError> {
        // a size that cannot be rounded cannot be allocated either
        let size = size_class(bytes).ok_or(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY))?;
        let cached = self.lock().take(size);
        if let Some(block) = cached {
            return Ok(block);
        }
        // SAFETY: the memory is uninitialized, which `Tensor::empty` documents; every other
        // constructor writes it before it is read.
        let block = match unsafe { stream.alloc::<u8>(size) } {
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                self.release_cached(stream)?;
                // SAFETY: as above
                unsafe { stream.alloc::<u8>(size) }?
            }
            r => r?,
        };
        self.lock().add_fresh(size);
        Ok(block)
    }

    /// Stops counting a block [`DevicePool::alloc`] made, which leaves the pool
    /// ([`crate::Tensor::into_cuda_slice`]): another owner frees it.
    pub(crate) fn hand_over(&self, size: usize) {
        self.lock().hand_over(size);
    }

    /// Caches a block [`DevicePool::alloc`] made, whose storage is gone.
    pub(crate) fn free(&self, block: CudaSlice<u8>) {
        let size = block.len();
        self.lock().put(size, block);
    }

    /// Frees every cached block (stream-ordered) and synchronizes `stream`, so that the
    /// driver's own pool releases the memory.
    pub(crate) fn release_cached(&self, stream: &Arc<CudaStream>) -> Result<(), DriverError> {
        let blocks = self.lock().drain();
        stream.context().bind_to_thread()?;
        // each drop is a `cuMemFreeAsync` on the stream
        drop(blocks);
        stream.synchronize()
    }

    pub(crate) fn stats(&self) -> MemoryStats {
        self.lock().stats()
    }

    pub(crate) fn reset_peak(&self) {
        self.lock().reset_peak();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_to_512_bytes_up_to_1_mib_and_to_2_mib_above() {
        assert_eq!(size_class(0), Some(0));
        assert_eq!(size_class(1), Some(512));
        assert_eq!(size_class(512), Some(512));
        assert_eq!(size_class(513), Some(1024));
        assert_eq!(size_class(4096 * 2), Some(8192));
        assert_eq!(size_class(SMALL_LIMIT - 1), Some(SMALL_LIMIT));
        assert_eq!(size_class(SMALL_LIMIT), Some(SMALL_LIMIT));
        assert_eq!(size_class(SMALL_LIMIT + 1), Some(LARGE_QUANTUM));
        assert_eq!(size_class(LARGE_QUANTUM), Some(LARGE_QUANTUM));
        assert_eq!(size_class(LARGE_QUANTUM + 1), Some(2 * LARGE_QUANTUM));
        assert_eq!(size_class(3 << 30), Some(3 << 30));
        assert_eq!(size_class(usize::MAX), None);
        let last = usize::MAX - LARGE_QUANTUM + 1; // the largest multiple of 2 MiB
        assert_eq!(size_class(last - 1), Some(last));
        assert_eq!(size_class(last + 1), None);
        // every class holds its request, with less than a quantum more
        for bytes in (1..(8 << 20)).step_by(4093) {
            let c = size_class(bytes).unwrap();
            let q = if bytes <= SMALL_LIMIT { SMALL_QUANTUM } else { LARGE_QUANTUM };
            assert!(c >= bytes && c - bytes < q && c.is_multiple_of(q), "{bytes} -> {c}");
        }
    }

    /// A fake block: its address, as the driver would hand it out.
    #[derive(Debug, PartialEq)]
    struct Block(u64);

    #[test]
    fn free_lists_reuse_blocks_of_the_same_class_and_count() {
        let mut p = FreeLists::<Block>::default();
        assert_eq!(p.take(512), None);
        p.add_fresh(512);
        p.add_fresh(2 << 20);
        let s = p.stats();
        assert_eq!((s.allocated_bytes, s.reserved_bytes, s.peak_allocated_bytes), (512 + (2 << 20), 512 + (2 << 20), 512 + (2 << 20)));
        assert_eq!((s.allocations, s.pool_hits, s.driver_allocations), (2, 0, 2));

        p.put(512, Block(0x1000));
        p.put(2 << 20, Block(0x2000));
        let s = p.stats();
        assert_eq!((s.allocated_bytes, s.reserved_bytes, s.peak_allocated_bytes), (0, 512 + (2 << 20), 512 + (2 << 20)));

        // another class misses; the same class gets the cached block back
        assert_eq!(p.take(1024), None);
        assert_eq!(p.take(512), Some(Block(0x1000)));
        assert_eq!(p.take(512), None);
        let s = p.stats();
        assert_eq!((s.allocated_bytes, s.reserved_bytes), (512, 512 + (2 << 20)));
        assert_eq!((s.allocations, s.pool_hits, s.driver_allocations), (3, 1, 2));
        assert_eq!(s.allocations, s.pool_hits + s.driver_allocations);

        // last in, first out within a class
        p.add_fresh(512);
        p.put(512, Block(0x1000));
        p.put(512, Block(0x3000));
        assert_eq!(p.take(512), Some(Block(0x3000)));
        p.put(512, Block(0x3000));

        // the peak stays until reset, then starts from what is allocated
        assert_eq!(p.stats().peak_allocated_bytes, 512 + (2 << 20));
        p.reset_peak();
        assert_eq!(p.stats().peak_allocated_bytes, 0);
        assert_eq!(p.take(2 << 20), Some(Block(0x2000)));
        assert_eq!(p.stats().peak_allocated_bytes, 2 << 20);

        // draining gives back every cached block and leaves reserved = allocated
        let mut freed: Vec<u64> = p.drain().into_iter().map(|b| b.0).collect();
        freed.sort();
        assert_eq!(freed, [0x1000, 0x3000]);
        let s = p.stats();
        assert_eq!((s.allocated_bytes, s.reserved_bytes), (2 << 20, 2 << 20));
        assert_eq!(p.take(512), None);
        p.put(2 << 20, Block(0x2000));
        assert_eq!(p.drain(), [Block(0x2000)]);
        let s = p.stats();
        assert_eq!((s.allocated_bytes, s.reserved_bytes, s.allocations, s.pool_hits, s.driver_allocations), (0, 0, 6, 3, 3));
        p.add_fresh(512);
        p.hand_over(512);
        let s = p.stats();
        assert_eq!((s.allocated_bytes, s.reserved_bytes, s.allocations, s.driver_allocations), (0, 0, 7, 4), "a handed-over block leaves both counts");
    }
}

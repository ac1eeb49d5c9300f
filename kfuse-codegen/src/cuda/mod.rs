//! The CUDA C++ writer. `emit` walks the scheduled kernel in program order and prints
//! what the passes decided; `prelude` holds the fixed helper functions every kernel
//! carries (so a source compiles with NVRTC alone, no headers); `writer` is the
//! indenting text sink.

/// The mbarrier helpers (init, expect-tx arrive, arrive, parity wait) on a barrier's
/// shared-memory address: the kernel takes its mbarrier arrays' addresses once
/// (`kf_saddr_once`) and each use adds the slot's offset, so that no loop computes a
/// shared variable's address again (module `emit::warp_specialize`).
pub(crate) const MBARRIER_HELPERS: &str = concat!(
    "static __device__ __forceinline__ void kf_mbar_init(unsigned a, unsigned count) {\n",
    "  asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: \"r\"(a), \"r\"(count) : \"memory\");\n",
    "}\n",
    "static __device__ __forceinline__ void kf_mbar_expect_tx(unsigned a, unsigned bytes) {\n",
    "  asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" :: \"r\"(a), \"r\"(bytes) : \"memory\");\n",
    "}\n",
    "static __device__ __forceinline__ void kf_mbar_arrive(unsigned a) {\n",
    "  asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" :: \"r\"(a) : \"memory\");\n",
    "}\n",
    "static __device__ __forceinline__ void kf_mbar_wait(unsigned a, unsigned phase) {\n",
    "  asm volatile(\"{\\n\\t.reg .pred p;\\n\\tKF_WAIT_%=:\\n\\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\\n\\t@!p bra KF_WAIT_%=;\\n\\t}\" :: \"r\"(a), \"r\"(phase) : \"memory\");\n",
    "}\n",
);

pub mod emit;
pub mod prelude;
pub mod writer;

//! The CUDA C++ writer. `emit` walks the scheduled kernel in program order and prints
//! what the passes decided; `prelude` holds the fixed helper functions every kernel
//! carries (so a source compiles with NVRTC alone, no headers); `writer` is the
//! indenting text sink.

/// The mbarrier helpers (init, expect-tx arrive, arrive, parity wait) as one string
/// literal, with `$addr` the kernel's generic → shared address function: the sm_90a
/// matrix path's prelude (`kf_smem_addr`) and the warp-specialized rings'
/// (`kf_saddr`) carry the same text.
macro_rules! mbarrier_helpers {
    ($addr:literal) => {
        concat!(
            "static __device__ __forceinline__ void kf_mbar_init(unsigned long long* b, unsigned count) {\n",
            "  asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\" :: \"r\"(", $addr, "(b)), \"r\"(count) : \"memory\");\n",
            "}\n",
            "static __device__ __forceinline__ void kf_mbar_expect_tx(unsigned long long* b, unsigned bytes) {\n",
            "  asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\" :: \"r\"(", $addr, "(b)), \"r\"(bytes) : \"memory\");\n",
            "}\n",
            "static __device__ __forceinline__ void kf_mbar_arrive(unsigned long long* b) {\n",
            "  asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" :: \"r\"(", $addr, "(b)) : \"memory\");\n",
            "}\n",
            "static __device__ __forceinline__ void kf_mbar_wait(unsigned long long* b, unsigned phase) {\n",
            "  asm volatile(\"{\\n\\t.reg .pred p;\\n\\tKF_WAIT_%=:\\n\\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\\n\\t@!p bra KF_WAIT_%=;\\n\\t}\" :: \"r\"(", $addr, "(b)), \"r\"(phase) : \"memory\");\n",
            "}\n",
        )
    };
}

pub mod emit;
pub mod prelude;
pub mod writer;

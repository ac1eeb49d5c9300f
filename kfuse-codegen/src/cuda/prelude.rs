//! Helper functions every generated kernel carries. Self-contained: no CUDA headers.
//! 16-bit floats travel as their bit patterns (`unsigned short`) and are computed in
//! `float`; conversions use PTX `cvt` with round-to-nearest-even.

pub const PRELUDE: &str = r#"typedef unsigned short kf_u16;
struct __align__(16) kf_v16 { unsigned int w[4]; };
struct __align__(8) kf_v8 { unsigned int w[2]; };
struct __align__(4) kf_v4 { unsigned int w[1]; };
static __device__ __forceinline__ float kf_bf16_f32(kf_u16 h) { return __uint_as_float(((unsigned int)h) << 16); }
static __device__ __forceinline__ kf_u16 kf_f32_bf16(float f) { kf_u16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
static __device__ __forceinline__ float kf_f16_f32(kf_u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
static __device__ __forceinline__ kf_u16 kf_f32_f16(float f) { kf_u16 r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
static __device__ __forceinline__ float kf_rbf16(float f) { return kf_bf16_f32(kf_f32_bf16(f)); }
static __device__ __forceinline__ float kf_rf16(float f) { return kf_f16_f32(kf_f32_f16(f)); }
static __device__ __forceinline__ kf_u16 kf_lo16(unsigned int w) { return (kf_u16)(w & 0xffffu); }
static __device__ __forceinline__ kf_u16 kf_hi16(unsigned int w) { return (kf_u16)(w >> 16); }
static __device__ __forceinline__ unsigned int kf_pack16(kf_u16 lo, kf_u16 hi) { return ((unsigned int)hi << 16) | (unsigned int)lo; }
static __device__ __forceinline__ float kf_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ long long kf_maxi(long long a, long long b) { return a > b ? a : b; }
static __device__ __forceinline__ long long kf_mini(long long a, long long b) { return a < b ? a : b; }
#define KF_INF __int_as_float(0x7f800000)
#define KF_NAN __int_as_float(0x7fc00000)
"#;

/// Helpers of kernels whose blocks form a thread-block cluster (sm_90): a barrier over
/// the cluster (release/acquire, so shared-memory writes before it are visible to
/// every block after it) and a load from another block's shared memory.
pub const CLUSTER_PRELUDE: &str = r#"static __device__ __forceinline__ void kf_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
static __device__ __forceinline__ float kf_ld_cluster_f32(const float* p, unsigned rank) {
  unsigned a, r; float v;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
  return v;
}
"#;

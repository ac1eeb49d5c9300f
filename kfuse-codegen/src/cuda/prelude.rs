//! Helper functions every generated kernel carries. Self-contained: no CUDA headers.
//! 16-bit floats travel as their bit patterns (`unsigned short`) and are computed in
//! `float`; conversions use PTX `cvt` with round-to-nearest-even.

/// The helpers' CUDA source, written at the top of every generated kernel.
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
static __device__ __forceinline__ unsigned char kf_byte(unsigned int w, int i) { return (unsigned char)(w >> (8 * i)); }
static __device__ __forceinline__ unsigned int kf_pack8(unsigned char a, unsigned char b, unsigned char c, unsigned char d) { return (unsigned int)a | ((unsigned int)b << 8) | ((unsigned int)c << 16) | ((unsigned int)d << 24); }
static __device__ __forceinline__ float kf_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static __device__ __forceinline__ long long kf_maxi(long long a, long long b) { return a > b ? a : b; }
static __device__ __forceinline__ long long kf_mini(long long a, long long b) { return a < b ? a : b; }
#define KF_INF __int_as_float(0x7f800000)
#define KF_NAN __int_as_float(0x7fc00000)
"#;

/// The helpers every kernel carries ([`PRELUDE`]) and, when the kernel touches an fp8
/// tensor or value, [`FP8_PRELUDE`].
pub fn base_prelude(k: &kfuse_ir::Kernel) -> String {
    let mut s = PRELUDE.to_string();
    if crate::analysis::uses_fp8(k) {
        s.push_str(FP8_PRELUDE);
    }
    if k.ops().any(|op| matches!(k.op(op), kfuse_ir::Op::Unary(kfuse_ir::UnaryOp::Exp))) {
        s.push_str(EXP_PRELUDE);
    }
    s
}

/// `exp(x)` as the hardware's `ex2.approx.ftz` of `x · log2 e` (relative error under
/// |x|·6e-8 + 2 ulp; results below 2^-126, x < −87.3, are flushed to 0), carried only by
/// kernels with an `exp`. Against `expf` (range reduction, more registers): softmax over
/// 16384-element rows 64 -> 56 registers; `exp2f` also spilled a 262144-element cluster
/// softmax. Without `.ftz` each `exp` is four instructions, not one (a compare and two
/// predicated multiplies keep subnormal results): 200 of flash attention's 2068 a tile.
/// `kf_exp_diff(a, b)` is `exp(a − b)` for an f32 tile's `exp(a - b)`: `a·log2 e − b·log2 e`
/// in one fused multiply-add (the error of the exponent grows with |a|, not |a − b|: a
/// relative error of the result under |a|·1e-7 more). `kf_exp_scaled(x, c, b)`
/// ([`EXP_SCALED`], only in kernels that use it) is `exp(x·c − b)` for a scalar `c`,
/// `c·log2 e` folded into the same multiply-add (the softmax scale on raw scores: one
/// instruction an element fewer).
pub const EXP_PRELUDE: &str = r#"static __device__ __forceinline__ float kf_exp(float x) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f)); return r; }
static __device__ __forceinline__ float kf_exp_diff(float a, float b) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(fmaf(a, 1.4426950408889634f, -(b * 1.4426950408889634f)))); return r; }
"#;

/// `kf_divi(a, b)` and `kf_remi(a, b)`, an `i64` tile's `/` and `%` by a run-time value,
/// written before a kernel that uses them: in 32 bits where both operands fit 31 bits
/// (pixel and row coordinates), else the 64-bit subroutine.
pub const INT_DIV: &str = r#"static __device__ __forceinline__ long long kf_divi(long long a, long long b) { return (((unsigned long long)a | (unsigned long long)b) >> 31) == 0 ? (long long)((unsigned)a / (unsigned)b) : a / b; }
static __device__ __forceinline__ long long kf_remi(long long a, long long b) { return (((unsigned long long)a | (unsigned long long)b) >> 31) == 0 ? (long long)((unsigned)a % (unsigned)b) : a % b; }
"#;

/// `kf_divm(a, b, dm)` and `kf_remm(a, b, dm)`, an `i64` tile's `/` and `%` by a launch's
/// value `b` (a scalar parameter or a shape) with its multiply-shift word `dm`
/// (`target::div_magic`, a kernel parameter): a multiply-high, an add and a shift where
/// `0 ≤ a < 2^31` and `dm` is one (`1 ≤ b < 2^31`), else the 64-bit subroutine. Written
/// before a kernel that uses them.
pub const INT_DIV_MAGIC: &str = r#"static __device__ __forceinline__ long long kf_divm(long long a, long long b, long long dm) { return ((unsigned long long)a >> 31) == 0 && dm >= 0 ? (long long)((__umulhi((unsigned)a, (unsigned)dm) + (unsigned)a) >> (unsigned)(dm >> 32)) : a / b; }
static __device__ __forceinline__ long long kf_remm(long long a, long long b, long long dm) { return ((unsigned long long)a >> 31) == 0 && dm >= 0 ? (long long)((unsigned)a - ((__umulhi((unsigned)a, (unsigned)dm) + (unsigned)a) >> (unsigned)(dm >> 32)) * (unsigned)b) : a % b; }
"#;

/// `kf_exp_scaled(x, c, b)`, written before a kernel that uses it (see [`EXP_PRELUDE`]).
pub const EXP_SCALED: &str = r#"static __device__ __forceinline__ float kf_exp_scaled(float x, float c, float b) { float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(fmaf(x, c * 1.4426950408889634f, -(b * 1.4426950408889634f)))); return r; }
"#;

/// Conversions of the 8-bit floats (sm_89 and newer, PTX `cvt … e4m3x2 / e5m2x2`),
/// carried only by kernels that touch an fp8 tensor or value: to f32 through an exact
/// f16 (both formats fit in f16), from f32 to nearest even with `satfinite` (beyond the
/// largest finite value: that value; NaN stays NaN).
pub const FP8_PRELUDE: &str = r#"static __device__ __forceinline__ float kf_e4m3_f32(unsigned char b) { unsigned int r; asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"((kf_u16)b)); return kf_f16_f32(kf_lo16(r)); }
static __device__ __forceinline__ float kf_e5m2_f32(unsigned char b) { unsigned int r; asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"((kf_u16)b)); return kf_f16_f32(kf_lo16(r)); }
static __device__ __forceinline__ unsigned char kf_f32_e4m3(float f) { kf_u16 r; asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f)); return (unsigned char)(r & 0xffu); }
static __device__ __forceinline__ unsigned char kf_f32_e5m2(float f) { kf_u16 r; asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f)); return (unsigned char)(r & 0xffu); }
"#;

/// Helpers of kernels whose blocks form a thread-block cluster (sm_90): a barrier over
/// the cluster (release/acquire, so shared-memory writes before it are visible to
/// every block after it), a load from another block's shared memory, and a value pushed
/// into another block's shared memory (`st.async`) whose arrival that block's mbarrier
/// counts (phase 0 only: each mbarrier serves one reduction). The wait for pushed values
/// is at CTA scope, as a wait for TMA data is (multicast from other blocks included): what
/// it waits for is bytes landing in this block's own shared memory, counted by its own
/// mbarrier's transaction count; nothing another block wrote to global memory is read
/// after it. At cluster scope ptxas follows each wait with an invalidation of the whole
/// L1 (`CCTL.IVALL`), 11–15% of the cluster norms' stall samples on the H100.
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
static __device__ __forceinline__ unsigned kf_cl_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
static __device__ __forceinline__ void kf_cl_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(kf_cl_addr(bar)) : "memory");
}
static __device__ __forceinline__ void kf_cl_expect(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(kf_cl_addr(bar)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void kf_cl_push_f32(float* slot, float v, unsigned long long* bar, unsigned rank) {
  unsigned a, b;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(kf_cl_addr(slot)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(b) : "r"(kf_cl_addr(bar)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" :: "r"(a), "r"(__float_as_uint(v)), "r"(b) : "memory");
}
static __device__ __forceinline__ void kf_cl_wait(unsigned long long* bar) {
  asm volatile("{\n\t.reg .pred p;\n\tKF_CLW_%=:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n\t@!p bra KF_CLW_%=;\n\t}" :: "r"(kf_cl_addr(bar)) : "memory");
}
"#;


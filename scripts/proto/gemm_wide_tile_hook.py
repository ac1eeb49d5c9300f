#!/usr/bin/env python3
"""128x320 tiles for the WGMMA GEMM (NOTES g25): the generated persistent 128x256 kernel
(row-major A, row-major B, 16-bit C, plain epilogue) rewritten with 320-column tiles, the
shape cuBLAS runs at M8192 N14336 K4096 (`nvjet_sm90_tst_320x128_64x3_1x2…`: 320 along the
output's N when its column-major view is read back as ours).

    KFUSE_SOURCE_HOOK="python3 scripts/proto/gemm_wide_tile_hook.py W" .gpu/bin/gemm_sustained …

What changes against the generated kernel (same parameters, tensor maps and launch):
- a stage holds A's 128x64 box and five of B's 64x64 boxes (56 KiB); three stages;
- each consumer warpgroup keeps 64x320 accumulators (160 a thread) and issues per k16 an
  m64n256 wgmma over B's first four boxes and an m64n64 over the fifth;
- the output leaves in five 64-column chunks through two 16 KiB buffers (a buffer is
  reused once the TMA store issued from it two chunks earlier has read it), since a whole
  128x320 tile (80 KiB) does not fit beside the ring;
- tiles hanging over M or N rely on TMA: loads fill zeros, stores drop what lies outside.
Option `P` adds the clock probe of `gemm_clock_probe_hook.py` (block 0's cycles and
nanoseconds, read back by `KFUSE_PROBE=1 examples/gemm_sustained`).

Kernels of any other shape are left alone."""
import re, sys
path, entry = sys.argv[2], sys.argv[3]
opts = set(sys.argv[1].split(","))
s = open(path).read()
if entry != "kf_gemm":
    sys.exit(0)

def leave(why):
    sys.stderr.write(f"wide-tile hook: {entry} left alone ({why})\n")
    sys.exit(0)

need = [
    "wgmma.mma_async.sync.aligned.m64n256k16.f32.",
    "kf_tma_2d(kf_sa + 0, &kf_tm0, (int)v8, (int)v11, &kf_full[kf_stage]);",
    "kf_tma_2d(kf_sb + 24576, &kf_tm1, (int)(v14 + 192), (int)v8, &kf_full[kf_stage]);",
    "kf_mbar_expect_tx(&kf_full[kf_stage], 49152u);",
    "const long long kf_g1 = (n_N + 255LL) / 256LL;",
    "float kf_acc[128];",
    "v24[k] = kf_acc[k];",
    "const __grid_constant__ CUtensorMap kf_tm0, const __grid_constant__ CUtensorMap kf_tm1, const __grid_constant__ CUtensorMap kf_tm2) {",
    "kf_u16* __restrict__ p_c",
]
for n in need:
    if n not in s:
        leave(f"no `{n[:50]}`")
if "kf_cluster" in s or "SPLITK" in s or s.count("for (long long kf_t = blockIdx.x") != 2:
    leave("not the plain persistent kernel")
m = re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.(bf16|f16)\.\1", s)
if not m:
    leave("operand type")
ty = m.group(1)
cvt = "bf16x2" if ty == "bf16" else "f16x2"

sig_end = s.index("const __grid_constant__ CUtensorMap kf_tm2) {") + len("const __grid_constant__ CUtensorMap kf_tm2) {")
kernel_start = s.rindex('extern "C" __global__', 0, sig_end)
head = s[:kernel_start]
sig = s[kernel_start:sig_end]

regs64 = ", ".join(f"%{i}" for i in range(32))
outs64 = ", ".join(f'"+f"(d[{i}])' for i in range(32))
helpers = f'''static __device__ __forceinline__ void kf_wgmma64(float* d, unsigned long long da, unsigned long long db) {{
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.{ty}.{ty} {{{regs64}}}, %32, %33, 1, 1, 1, 0, 1;"
    : {outs64}
    : "l"(da), "l"(db));
}}
static __device__ __forceinline__ unsigned kf_pack2(float lo, float hi) {{ unsigned r; asm("cvt.rn.{cvt}.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }}
static __device__ __forceinline__ unsigned long long kf_gtimer() {{ unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }}
__device__ unsigned long long kf_probe_acc[3];
// tile t of the walk: groups of 8 tile rows, as the generated kernel's
static __device__ __forceinline__ void kf_tile_at(long long t, long long g0, long long g1, int& row, int& col) {{
  const long long per = 8LL * g1;
  const long long first = (t / per) * 8LL;
  const long long gm = kf_mini(g0 - first, 8LL);
  row = (int)((first + (t % per) % gm) * 128);
  col = (int)(((t % per) / gm) * 320);
}}
'''
probe_start = "  const long long kf_c0 = clock64();\n  const unsigned long long kf_t0 = kf_gtimer();\n" if "P" in opts else ""
probe_end = '''    if (kf_tid == 128 && blockIdx.x == 0) {
      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
      const long long kf_c1 = clock64();
      const unsigned long long kf_t1 = kf_gtimer();
      kf_probe_acc[0] += (unsigned long long)(kf_c1 - kf_c0);
      kf_probe_acc[1] += kf_t1 - kf_t0;
      kf_probe_acc[2] += 1;
      for (int i = 0; i < 3; ++i) {
        const unsigned long long v = kf_probe_acc[i];
        for (int j = 0; j < 4; ++j) p_c[4 * i + j] = (kf_u16)(v >> (16 * j));
      }
    }
''' if "P" in opts else ""

body = f'''
  const int kf_tid = threadIdx.x;
  const int kf_lane = kf_tid & 31;
{probe_start}  extern __shared__ __align__(1024) unsigned char kf_dsmem[];
  unsigned char* kf_pipe = (unsigned char*)((((unsigned long long)kf_dsmem) + 1023ull) & ~1023ull);
  // three stages of A (16 KiB) and five B boxes (40 KiB); barriers; two 16 KiB output chunks
  unsigned long long* kf_full = (unsigned long long*)(kf_pipe + 172032);
  unsigned long long* kf_empty = kf_full + 3;
  unsigned char* kf_out = kf_pipe + 173056;
  if (kf_tid == 0) {{
    #pragma unroll
    for (int s = 0; s < 3; ++s) {{
      kf_mbar_init(&kf_full[s], 1);
      kf_mbar_init(&kf_empty[s], 8);
    }}
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }}
  __syncthreads();
  const long long kf_g0 = (n_M + 127LL) / 128LL;
  const long long kf_g1 = (n_N + 319LL) / 320LL;
  const long long kf_tiles = kf_g0 * kf_g1;
  if (kf_tid < 128) {{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;" ::: "memory");
    if (kf_tid == 0) {{
      int kf_stage = 0;
      unsigned kf_phase = 0;
      for (long long kf_t = blockIdx.x; kf_t < kf_tiles; kf_t += gridDim.x) {{
        int row, col;
        kf_tile_at(kf_t, kf_g0, kf_g1, row, col);
        for (long long k = 0; k < n_K; k += 64) {{
          kf_mbar_wait(&kf_empty[kf_stage], kf_phase ^ 1u);
          kf_mbar_expect_tx(&kf_full[kf_stage], 57344u);
          unsigned char* kf_sa = kf_pipe + kf_stage * 57344;
          unsigned char* kf_sb = kf_sa + 16384;
          kf_tma_2d(kf_sa, &kf_tm0, (int)k, row, &kf_full[kf_stage]);
          #pragma unroll
          for (int j = 0; j < 5; ++j) kf_tma_2d(kf_sb + j * 8192, &kf_tm1, col + 64 * j, (int)k, &kf_full[kf_stage]);
          if (++kf_stage == 3) {{ kf_stage = 0; kf_phase ^= 1u; }}
        }}
      }}
    }}
  }}
  else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;" ::: "memory");
    const int kf_warp = (kf_tid >> 5) - 4;
    const int kf_wg = kf_warp >> 2;
    int kf_stage = 0;
    unsigned kf_phase = 0;
    int kf_chunk = 0;
    const unsigned kf_r7 = (kf_lane >> 2) & 7;
    const unsigned kf_rb = kf_smem_addr(kf_out) + (kf_warp * 16 + kf_r7) * 128 + (kf_lane & 3) * 4;
    for (long long kf_t = blockIdx.x; kf_t < kf_tiles; kf_t += gridDim.x) {{
      int row, col;
      kf_tile_at(kf_t, kf_g0, kf_g1, row, col);
      float kf_acc[160];
      #pragma unroll
      for (int i = 0; i < 160; ++i) kf_acc[i] = 0.0f;
      int kf_prev = -1;
      for (long long k = 0; k < n_K; k += 64) {{
        kf_mbar_wait(&kf_full[kf_stage], kf_phase);
        const unsigned char* kf_sa = kf_pipe + kf_stage * 57344;
        const unsigned char* kf_sb = kf_sa + 16384;
        kf_wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < 4; ++kk) {{
          const unsigned long long da = kf_desc128(kf_sa + kf_wg * 8192 + kk * 32, 16, 1024);
          kf_wgmma(kf_acc, da, kf_desc128(kf_sb + kk * 2048, 8192, 1024));
          kf_wgmma64(kf_acc + 128, da, kf_desc128(kf_sb + 32768 + kk * 2048, 8192, 1024));
        }}
        kf_wgmma_commit();
        kf_wgmma_wait<1>();
        if (kf_prev >= 0 && kf_lane == 0) kf_mbar_arrive(&kf_empty[kf_prev]);
        kf_prev = kf_stage;
        if (++kf_stage == 3) {{ kf_stage = 0; kf_phase ^= 1u; }}
      }}
      kf_wgmma_wait<0>();
      if (kf_prev >= 0 && kf_lane == 0) kf_mbar_arrive(&kf_empty[kf_prev]);
      // five 64-column chunks, alternating between the two buffers
      #pragma unroll
      for (int c = 0; c < 5; ++c) {{
        const unsigned buf = (unsigned)(kf_chunk & 1) * 16384;
        if (kf_tid == 128) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        asm volatile("bar.sync 1, %0;" :: "n"(KF_CONSUMERS * 128) : "memory");
        #pragma unroll
        for (int j = 0; j < 8; ++j) {{
          const unsigned x = kf_rb + buf + ((j ^ kf_r7) << 4);
          #pragma unroll
          for (int h = 0; h < 2; ++h) {{
            const int r = c * 32 + j * 4 + h * 2;
            asm volatile("st.shared.u32 [%0], %1;" :: "r"(x + h * 1024), "r"(kf_pack2(kf_acc[r], kf_acc[r + 1])) : "memory");
          }}
        }}
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync 1, %0;" :: "n"(KF_CONSUMERS * 128) : "memory");
        if (kf_tid == 128) {{
          asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {{%1, %2}}], [%3];" :: "l"(&kf_tm2), "r"(col + 64 * c), "r"(row), "r"(kf_smem_addr(kf_out + buf)) : "memory");
          asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        }}
        ++kf_chunk;
      }}
    }}
    if (kf_tid == 128) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
{probe_end}  }}
}}
'''
s = head.replace("#define KF_CONSUMERS", helpers + "#define KF_CONSUMERS", 1) + sig + body
open(path, "w").write(s)

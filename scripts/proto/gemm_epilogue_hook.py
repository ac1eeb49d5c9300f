#!/usr/bin/env python3
"""Patches of the generated bf16 `kf_gemm` kernel (128x256 tiles), for timing a change on the
GPU before the compiler makes it (NOTES g16). Use as a source hook:

    KFUSE_SOURCE_HOOK="python3 scripts/proto/gemm_epilogue_hook.py P4,R" KFUSE_BENCH_FILTER=bf16_M4096_N4096 .gpu/bin/gemm --table-only

Arguments: a comma-separated list of patches, then (from the hook) FILE ENTRY. Other
kernels are left alone; a patch that does not find its text fails (so does the hook).
P1: the output TMA store with an L2 evict_first policy.  P2: operand loads with evict_last.
P4: 4 pipeline stages, the output tile stored in two 32 KiB halves through one buffer.
P5: one packed cvt.rn.bf16x2.f32 per pair.  P8: the output tile written by stmatrix.x4.
R: back to the epilogue before a42f04b (the cast rounded, the tile through the generic
pointer), for A/B runs (measured on a42f04b; on later sources the `+ 0` read stays out). P3, P6 and P7 were built into the compiler in the ninth session
and no longer find their text."""
import re, sys
path, entry = sys.argv[2], sys.argv[3]
opts = set(sys.argv[1].split(","))
s = open(path).read()
if entry != "kf_gemm" or "kf_tma_ok" not in s:
    sys.exit(0)
def must(old, new, count=1):
    global s
    n = s.count(old)
    if n != count:
        sys.stderr.write(f"hook: expected {count} of {old[:60]!r}, found {n}\n"); sys.exit(1)
    s = s.replace(old, new)
def resub(pattern, repl, at_least=1, exactly=None):
    global s
    s, n = re.subn(pattern, repl, s)
    if n < at_least or (exactly is not None and n != exactly):
        sys.stderr.write(f"hook: {pattern[:60]!r} matched {n} times\n"); sys.exit(1)
helpers = ('static __device__ __forceinline__ unsigned long long kf_pol_first() { unsigned long long p; asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p)); return p; }\n'
           'static __device__ __forceinline__ unsigned long long kf_pol_last() { unsigned long long p; asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p)); return p; }\n')
s = s.replace('#define KF_NAN __int_as_float(0x7fc00000)\n', '#define KF_NAN __int_as_float(0x7fc00000)\n' + helpers, 1)
if "P1" in opts:
    resub(r'cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.bulk_group \[%0, \{%1, %2\}\], \[%3\];" :: (.*?) : "memory"\);',
          r'cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint [%0, {%1, %2}], [%3], %4;" :: \1, "l"(kf_pol_first()) : "memory");', at_least=4)
if "P2" in opts:
    must('asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"\n    :: "r"(kf_smem_addr(dst)), "l"(m), "r"(c0), "r"(c1), "r"(kf_smem_addr(bar)) : "memory");',
         'asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;"\n    :: "r"(kf_smem_addr(dst)), "l"(m), "r"(c0), "r"(c1), "r"(kf_smem_addr(bar)), "l"(kf_pol_last()) : "memory");')
if "P3" in opts:
    resub(r'(v\d+)\[k\] = kf_rbf16\(kf_acc\[k\]\);', r'\1[k] = kf_acc[k];', exactly=1)
if "P5" in opts:
    s = s.replace('#define KF_NAN __int_as_float(0x7fc00000)\n', '#define KF_NAN __int_as_float(0x7fc00000)\nstatic __device__ __forceinline__ unsigned kf_bf16x2(float lo, float hi) { unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r; }\n', 1)
    resub(r'kf_pack16\(kf_f32_bf16\((v\d+\[k0(?: \+ 0)?\])\), kf_f32_bf16\((v\d+\[k0 \+ 1\])\)\)', r'kf_bf16x2(\1, \2)', at_least=2)
if "P6" in opts:
    resub(r'kf_acc\[i\] = kf_acc\[i\] \+ 0\.0f;', 'kf_acc[i] = kf_acc[i];', exactly=1)
if "P7" in opts:
    must('unsigned char* kf_pipe = (unsigned char*)((((unsigned long long)kf_dsmem) + 1023ull) & ~1023ull);',
         'unsigned char* kf_pipe = kf_dsmem + ((1024u - (kf_smem_addr(kf_dsmem) & 1023u)) & 1023u);')
if "R" in opts:
    # back to the previous commit's epilogue: the cast rounded, the output tile through the generic pointer
    resub(r'(v\d+)\[k\] = kf_acc\[k\];', r'\1[k] = kf_rbf16(kf_acc[k]);', exactly=1)
    resub(r'kf_cs = kf_dsmem \+ \(\(unsigned\)\(kf_pipe - kf_dsmem\) \+ ([^;]*)\);', r'kf_cs = kf_pipe + \1;', exactly=1)
if "P8" in opts:
    # the output tile's shared-memory writes as stmatrix.x4 (four 8x8 b16 matrices a warp)
    m = re.search(r'        #pragma unroll\n        for \(int p = 0; p < 64; \+\+p\) \{\n.*?\n        \}\n', s, re.S)
    assert m, "the 64-pair store loop"
    blk = m.group(0)
    v = re.search(r'kf_pack16\(kf_f32_bf16\((v\d+)\[k0\]\)', blk).group(1)
    assert "(kf_warp / 1) % 8) * 16" in blk and "q * 16384" in blk, blk
    new = f"""        #pragma unroll
        for (int j = 0; j < 32; j += 2) {{
          const int mi = kf_lane >> 3;
          const int row = (kf_warp % 8) * 16 + (mi & 1) * 8 + (kf_lane & 7);
          const int col = (j + (mi >> 1)) * 8;
          const unsigned off = (col / 64) * 16384 + row * 128 + ((((col % 64) * 2 >> 4) ^ (row & 7)) << 4);
          const unsigned r0 = kf_pack16(kf_f32_bf16({v}[4 * j + 0]), kf_f32_bf16({v}[4 * j + 1]));
          const unsigned r1 = kf_pack16(kf_f32_bf16({v}[4 * j + 2]), kf_f32_bf16({v}[4 * j + 3]));
          const unsigned r2 = kf_pack16(kf_f32_bf16({v}[4 * j + 4]), kf_f32_bf16({v}[4 * j + 5]));
          const unsigned r3 = kf_pack16(kf_f32_bf16({v}[4 * j + 6]), kf_f32_bf16({v}[4 * j + 7]));
          asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {{%1, %2, %3, %4}};" :: "r"(kf_smem_addr(kf_cs + off)), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
        }}
"""
    s = s.replace(blk, new)
if "P4" in opts:
    m = re.search(r'kf_pipe \+ (\d+)\);\n  unsigned long long\* kf_empty = kf_full \+ 3;', s)
    assert m and m.group(1) == "147456", "3 stages of 48 KiB expected"
    must('kf_pipe + 147456);', 'kf_pipe + 196608);')
    must('kf_empty = kf_full + 3;', 'kf_empty = kf_full + 4;')
    must('kf_red = kf_full + 6;', 'kf_red = kf_full + 8;')
    must('for (int s = 0; s < 3; ++s)', 'for (int s = 0; s < 4; ++s)')
    must('if (++kf_stage == 3)', 'if (++kf_stage == 4)', 2)
    i = s.index('        if (kf_tid == 128) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");')
    j = s.index('      else {\n        kf_u16* kf_p4')
    blk = s[i:j]
    v = re.search(r'kf_pack16\(kf_f32_bf16\((v\d+)\[k0\]\)', blk).group(1)
    cols = re.search(r'"r"\(\(int\)\((v\d+) \+ 0\)\), "r"\(\(int\)(v\d+)\)', blk)
    vc, vr = cols.group(1), cols.group(2)
    new = f'''        unsigned char* kf_cs = kf_pipe + 197632;
        #pragma unroll
        for (int h = 0; h < 2; ++h) {{
          if (kf_tid == 128) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
          asm volatile("bar.sync 1, %0;" :: "n"(KF_CONSUMERS * 128) : "memory");
          #pragma unroll
          for (int pp = 0; pp < 32; ++pp) {{
            const int k0 = (h * 32 + pp) * 2;
            const int row = (kf_warp % 8) * 16 + (kf_lane / 4) % 8 + ((k0 / 2) % 2) * 8;
            const int col = ((k0 / 4) % 32) * 8 + (kf_lane % 4) * 2;
            const int q = (col / 64) % 2;
            const int cb = (col % 64) * 2;
            const unsigned off = q * 16384 + row * 128 + ((((cb >> 4) ^ (row & 7)) << 4) | (cb & 15));
            *reinterpret_cast<unsigned*>(kf_cs + off) = kf_pack16(kf_f32_bf16({v}[k0]), kf_f32_bf16({v}[k0 + 1]));
          }}
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          asm volatile("bar.sync 1, %0;" :: "n"(KF_CONSUMERS * 128) : "memory");
          if (kf_tid == 128) {{
            asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {{%1, %2}}], [%3];" :: "l"(&kf_tm2), "r"((int)({vc} + h * 128)), "r"((int){vr}), "r"(kf_smem_addr(kf_cs)) : "memory");
            asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {{%1, %2}}], [%3];" :: "l"(&kf_tm2), "r"((int)({vc} + h * 128 + 64)), "r"((int){vr}), "r"(kf_smem_addr(kf_cs + 16384)) : "memory");
            asm volatile("cp.async.bulk.commit_group;" ::: "memory");
          }}
        }}
      }}
'''
    s = s[:i] + new + s[j:]
    s = "// kfuse-hook: smem_bytes=231424\n" + s
open(path, "w").write(s)

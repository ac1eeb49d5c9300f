#!/usr/bin/env python3
"""A clock probe in the generated persistent `kf_gemm` kernel (NOTES g23). Thread 128 (the
consumer thread that issues the output stores) of block 0 reads `clock64()` and
`%globaltimer` when the block starts and before it exits, adds the differences and a call
count to a module-global accumulator, waits for its own output stores to complete, and
writes the three 64-bit totals over the first 12 elements of the output (block 0's first
tile). `KFUSE_PROBE=1 examples/gemm_sustained.rs` prints them after its phases: the
cycles block 0 ran a call and the clock its multiprocessor ran at (cycles / ns), to
set beside ncu's fixed-clock count. (`printf` would have done without the output, but a
call in the kernel makes ptxas serialize every wgmma: C7510.)

    KFUSE_SOURCE_HOOK="python3 scripts/proto/gemm_clock_probe_hook.py X" KFUSE_PROBE=1 KFUSE_PHASES=kfuse .gpu/bin/gemm_sustained M N K CALLS

Kernels without the 16-bit TMA-store epilogue are left alone. `H<ns>` after `X` (`X,H1000`)
also gives the CTA-scope barrier waits a suspend-time hint of that many nanoseconds."""
import re, sys
path, entry = sys.argv[2], sys.argv[3]
opts = sys.argv[1].split(",")
s = open(path).read()
if entry != "kf_gemm" or "setmaxnreg" not in s or "kf_u16* __restrict__ p_c" not in s:
    sys.exit(0)
helpers = ('static __device__ __forceinline__ unsigned long long kf_gtimer() { unsigned long long t; '
           'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n'
           '__device__ unsigned long long kf_probe_acc[3];\n')
s = s.replace("#define KF_CONSUMERS", helpers + "#define KF_CONSUMERS", 1)
start = "  const int kf_tid = threadIdx.x;\n"
assert s.count(start) == 1
s = s.replace(start, start + "  const long long kf_c0 = clock64();\n  const unsigned long long kf_t0 = kf_gtimer();\n", 1)
ends = list(re.finditer(r'    if \((?:kf_tid == 128|\(kf_tid & 127\) == 0)\) asm volatile\("cp\.async\.bulk\.wait_group\.read 0;" ::: "memory"\);\n  \}\n', s))
assert ends, "the consumers' last store wait"
at = ends[-1].end() - len("  }\n")
probe = ('    if (kf_tid == 128 && blockIdx.x == 0) {\n'
         '      asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");\n'
         '      const long long kf_c1 = clock64();\n'
         '      const unsigned long long kf_t1 = kf_gtimer();\n'
         '      kf_probe_acc[0] += (unsigned long long)(kf_c1 - kf_c0);\n'
         '      kf_probe_acc[1] += kf_t1 - kf_t0;\n'
         '      kf_probe_acc[2] += 1;\n'
         '      for (int i = 0; i < 3; ++i) {\n'
         '        const unsigned long long v = kf_probe_acc[i];\n'
         '        for (int j = 0; j < 4; ++j) p_c[4 * i + j] = (kf_u16)(v >> (16 * j));\n'
         '      }\n'
         '    }\n')
s = s[:at] + probe + s[at:]
# H<ns>: the CTA-scope barrier waits with a suspend-time hint (the waiting thread may sleep
# until the phase completes or the hint runs out, instead of polling)
for o in opts:
    if o.startswith("H"):
        old = 'mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\\n\\t@!p bra KF_WAIT_%=;\\n\\t}" :: "r"(kf_smem_addr(b)), "r"(phase) : "memory");'
        assert s.count(old) == 1, "the barrier wait"
        s = s.replace(old, old.replace("%1;", "%1, %2;").replace('"r"(phase)', f'"r"(phase), "n"({int(o[1:])})'))
open(path, "w").write(s)

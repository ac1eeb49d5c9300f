#!/usr/bin/env python3
"""A patch of the generated WGMMA GEMM kernel (`kf_gemm`, its producer warp), for timing a
change on the GPU before the compiler makes it. Use as a source hook:

    KFUSE_SOURCE_HOOK="python3 scripts/proto/gemm_l2_prefetch_hook.py D" \
        KFUSE_PHASES=kfuse .gpu/bin/gemm_sustained 8192 14336 4096 1000

After the producer issues a stage's TMA loads for k-step `k`, it asks L2 for the same
boxes at `k + D * BK` (`cp.async.bulk.prefetch.tensor.2d.L2.global`, no shared memory, no
barrier), so that the copy of that stage into shared memory, issued when a slot frees up
D - stages k-steps later, finds its operands in L2 instead of DRAM. `D` = 0 (or `OFF`)
leaves the kernel alone (the baseline under the same hook). `TD` (e.g. `T4`): instead, after
each k-step's WGMMA the 256 consumer threads each ask L2 for one 128-byte line of the A
tile and one of the B tile (row-major A and B) at `k + D * BK` (`prefetch.global.L2`). Kernels other than the
plain WGMMA GEMM are left alone (said on stderr)."""
import re, sys

path, entry = sys.argv[2], sys.argv[3]
arg = sys.argv[1]
d = 0 if arg == "OFF" else int(arg.lstrip("T"))
s = open(path).read()
if d == 0 or "wgmma" not in s or "kf_tma_2d(kf_sa" not in s:
    sys.exit(0)
if arg.startswith("T"):
    # per-thread variant: after each k-step's wgmma, the 256 consumer threads each ask L2
    # for one 128-byte line of A's tile and one of B's (MN-major) at k-step + D
    anchor = "        kf_wgmma_wait<1>();\n"
    if s.count(anchor) != 1:
        sys.stderr.write(f"hook: {entry}: consumer loop not found\n"); sys.exit(1)
    m = re.search(r"const long long (v\d+) = \(v0 \* v\d+\);\n.*\n\s*const long long (v\d+) = \(v1 \* v\d+\);", s)
    loop = re.findall(r"for \(long long (v\d+) = (v\d+); \1 < (v\d+); \1 \+= (v\d+)\)", s)[-1]
    row, col = m.group(1), m.group(2)
    kv, hi, step = loop[0], loop[2], loop[3]
    pf = (
        "        {\n"
        f"          const long long kp = {kv} + {d}LL * {step};\n"
        "          const int t = kf_tid - 128;\n"
        f"          if (kp < {hi}) {{\n"
        f"            if (t < 128 && {row} + t < n_M) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(p_a + ({row} + t) * st_a_0 + kp));\n"
        f"            if (kp + t / 4 < {hi} && {col} + (t % 4) * 64 < n_N) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(p_b + (kp + t / 4) * st_b_0 + {col} + (t % 4) * 64));\n"
        "          }\n"
        "        }\n"
    )
    s = s.replace(anchor, anchor + pf)
    open(path, "w").write(s)
    sys.stderr.write(f"hook: {entry}: per-thread L2 prefetch {d} k-steps ahead\n")
    sys.exit(0)
# the producer's k loop and its stage's TMA loads
m = re.search(r"for \(long long (v\d+) = (v\d+); \1 < (v\d+); \1 \+= (v\d+)\) \{\n(\s*)kf_mbar_wait\(&kf_empty\[kf_stage\]", s)
if not m:
    sys.stderr.write(f"hook: {entry}: no producer loop found, left alone\n")
    sys.exit(0)
kv, hi, step, ind = m.group(1), m.group(3), m.group(4), m.group(5)
body_start = m.end()
end = s.index("if (++kf_stage ==", body_start)
loads = re.findall(r"kf_tma_2d\(kf_s[ab] \+ \d+, &(kf_tm\d), (.*?), &kf_full\[kf_stage\]\);", s[body_start:end])
if not loads:
    sys.stderr.write(f"hook: {entry}: no TMA loads in the producer loop, left alone\n")
    sys.exit(0)
ahead = f"({kv} + {d}LL * {step})"
pf = [f"{ind}if ({ahead} < {hi}) {{\n"]
for tm, coords in loads:
    c = coords.replace(f"(int){kv}", f"(int){ahead}")
    if c == coords:
        sys.stderr.write(f"hook: {entry}: a load without the k coordinate (int){kv}: {coords}\n")
        sys.exit(1)
    cs = [x.strip() for x in c.split(",")]
    regs = ", ".join(f"%{i + 1}" for i in range(len(cs)))
    ins = ", ".join(f'"r"({x})' for x in cs)
    pf.append(f'{ind}  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {{{regs}}}];" :: "l"(&{tm}), {ins} : "memory");\n')
pf.append(f"{ind}}}\n")
s = s[:end] + "".join(pf).lstrip() + ind + s[end:]
open(path, "w").write(s)
sys.stderr.write(f"hook: {entry}: {len(loads)} boxes prefetched to L2 {d} k-steps ahead\n")

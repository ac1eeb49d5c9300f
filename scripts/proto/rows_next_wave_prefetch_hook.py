#!/usr/bin/env python3
"""A patch of the generated cluster row kernels (a row split across a cluster, a block's
slice of the row contiguous: softmax, RMSNorm, LayerNorm, sum), for timing a change on the
GPU before the compiler makes it. Use as a source hook:

    KFUSE_SOURCE_HOOK="python3 scripts/proto/rows_next_wave_prefetch_hook.py G16,G8" \
        KFUSE_BENCH_SHAPES=1024x131072,256x262144 .gpu/bin/rows_bench --table-only

Right after a block has issued the loads of its slice of row `i`, one thread asks the copy
engine to bring the same slice of row `i + G` into L2 (`cp.async.bulk.prefetch.L2`, no
registers, no completion to wait for): the row that a cluster of the *next wave* will
read. The idea: while this wave's blocks reduce and exchange (no loads in flight), DRAM
keeps streaming the next wave's input, whose loads then hit L2. `G` should be the number
of clusters resident at once (ncu: 21 clusters of 16 at 256x262144, 45 of 8 at
1024x131072, on the H100). The argument: `G16` / `G8` (comma-separated), the distance for
kernels in clusters of 16 / 8; `OFF` leaves the kernels alone (the baseline under the same
hook); `POS=start` issues the prefetch before the block's own loads instead of after;
`POL=last` gives the prefetched lines the L2 evict_last policy. A kernel with no cluster, or with another load pattern, is left alone (said on
stderr)."""
import re, sys

path, entry = sys.argv[2], sys.argv[3]
opts = dict(o.split("=") if "=" in o else (o, "") for o in sys.argv[1].split(","))
s = open(path).read()
m = re.search(r"__cluster_dims__\((\d+), 1, 1\)", s)
if not m or "OFF" in opts:
    sys.exit(0)
c = m.group(1)
g = opts.get(f"G{c}")
if not g:
    sys.stderr.write(f"hook: {entry} (clusters of {c}) left alone: no G{c}=N given\n")
    sys.exit(0)
row = re.search(r"const kf_u16\* (kf_p\d+) = p_x \+ (v\d+) \* st_x_0 \+ (v\d+);\n", s)
load = re.search(r"kf_v16 (v\d+)w\[8\];\n", s[row.end():]) if row else None
slice_ = re.search(r"kf_crank \* (\d+) \+", s[row.end() + load.end():]) if load else None
if not slice_:
    sys.stderr.write(f"hook: {entry} left alone (not the contiguous-slice plan)\n")
    sys.exit(0)
var, per = load.group(1), int(slice_.group(1))
if opts.get("POS") == "start":
    # before the block's own loads
    end = row.end() + load.start() - 2  # the line's indentation
else:
    # after them: the end of the load loop (the first `vNw[g] = q;` block)
    tail = f"      {var}w[g] = q;\n    }}\n  }}\n"
    end = s.find(tail, row.end() + load.end())
    if end < 0:
        sys.stderr.write(f"hook: {entry}: the end of {var}'s load loop not found\n")
        sys.exit(1)
    end += len(tail)
pf = (
    "  if (kf_tid == 0 && " + row.group(2) + f" + {g}LL < n_M) {{\n"
    f"    const kf_u16* kf_pf = {row.group(1)} + {g}LL * st_x_0 + (long long)kf_crank * {per};\n"
    + (
        "    unsigned long long kf_pol;\n"
        '    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(kf_pol));\n'
        f'    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" :: "l"(kf_pf), "r"({per * 2}u), "l"(kf_pol) : "memory");\n'
        if opts.get("POL") == "last"
        else f'    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(kf_pf), "r"({per * 2}u) : "memory");\n'
    )
    + "  }\n"
)
s = s[:end] + pf + s[end:]
open(path, "w").write(s)
sys.stderr.write(f"hook: {entry} (clusters of {c}) prefetches row + {g}, {per * 2} bytes a block\n")

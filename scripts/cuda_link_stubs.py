"""Link stubs of the CUDA libraries cudarc links when a crate of the build asks it to
(candle's `cuda` feature: libcuda, NVRTC, cuRAND, cuBLAS, cuBLASLt), for building on a
machine without them.

A stub is a shared library with the real library's soname that defines every function
cudarc's bindings declare for it, each empty: the linker records the soname, and where
the program runs the dynamic loader finds the real library under it (the driver's
libcuda.so.1, the toolkit's or PyTorch's libcublas.so.13 ...). A stub is never run.

Usage: python3 scripts/cuda_link_stubs.py CUDARC_SOURCE_DIR OUT_DIR
"""

import pathlib
import re
import subprocess
import sys

# library -> (cudarc's bindings, the real library's soname)
LIBRARIES = {
    "cuda": ("src/driver/sys/mod.rs", "libcuda.so.1"),
    "nvrtc": ("src/nvrtc/sys/mod.rs", "libnvrtc.so.13"),
    "curand": ("src/curand/sys/mod.rs", "libcurand.so.10"),
    "cublas": ("src/cublas/sys/mod.rs", "libcublas.so.13"),
    "cublasLt": ("src/cublaslt/sys/mod.rs", "libcublasLt.so.13"),
}

# a function declared inside an `extern "C" {` block of the bindings
DECLARED = re.compile(r"^\s+(?:pub\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.M)


def functions(bindings: str) -> list[str]:
    names = set()
    for block in bindings.split('extern "C" {')[1:]:
        body = block.split("\n        }", 1)[0]
        names.update(DECLARED.findall(body))
    return sorted(names)


def main() -> None:
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for lib, (rel, soname) in LIBRARIES.items():
        names = functions((src / rel).read_text())
        if not names:
            sys.exit(f"cuda_link_stubs: no functions found in {src / rel}")
        c = out / f"lib{lib}_stub.c"
        c.write_text("".join(f"void {n}(void) {{}}\n" for n in names))
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-o", str(out / f"lib{lib}.so"), f"-Wl,-soname,{soname}", str(c)],
            check=True,
        )
        c.unlink()
        print(f"lib{lib}.so ({soname}): {len(names)} functions", file=sys.stderr)


if __name__ == "__main__":
    main()

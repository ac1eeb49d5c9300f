"""The CUDA-event timer of the PyTorch baseline scripts (`bench_torch_attention.py`,
`bench_torch_conv.py`, `bench_torch_gelu.py`), timed as the Rust benchmarks time kfuse:
CUDA events around each call, warm-ups first, the median of the timed calls."""
import torch


def median_ms(fn, warmup, iters):
    """The median of `iters` timed calls of `fn` (milliseconds), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def median_ms_for(fn, warm_ms=300.0, timed_ms=100.0):
    """`median_ms` with the call counts that warm up for about `warm_ms` and time for
    about `timed_ms` (a few calls of a short kernel leave the clocks where an idle GPU
    has them)."""
    once = median_ms(fn, 1, 3)
    return median_ms(fn, min(20000, max(3, int(warm_ms / once))), min(5000, max(10, int(timed_ms / once))))

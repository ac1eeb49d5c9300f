#!/usr/bin/env python3
"""Timers around each step of a GPU launch (NOTES g26): a temporary patch of the Rust sources.

Run from the repository root on the build machine:

    python3 scripts/proto/host_profile_patch.py
    cargo build --release --example launch_host      # carry target/release/examples/launch_host
    git checkout kfuse-runtime/src/launch.rs ops/src/matmul.rs examples/launch_host.rs

The patch adds `kfuse_runtime::launch::hostprof` (per-step nanosecond totals in atomics),
laps around the steps of `launch`, `issue` and `ops::gemm`'s product, and, at the end of
`examples/launch_host.rs`, profiled bursts of an f32 GEMM, an elementwise `add` and the
bf16 `ops::gemm`, each printing µs a call per step. The laps cost ~25 ns each; the
figures in NOTES g26 were taken with them in place, beside the unpatched binary's.
Each replacement asserts that its anchor text is still there: a failure means the
sources moved on and the anchors need updating.
"""
DUMP = '    let (a32, _) = common::random(&[m, k], DType::F32, 1, &dev);\n    let (b32, _) = common::random(&[k, n], DType::F32, 2, &dev);\n    let (x, _) = common::random(&[m, n], DType::BF16, 3, &dev);\n    kfuse::ops::gemm(&a32, &b32)?;\n    kfuse::ops::add(&x, &x)?;\n    let mut f1 = || kfuse::ops::gemm(&a32, &b32).map(drop);\n    let mut f2 = || kfuse::ops::add(&x, &x).map(drop);\n    let fs: Vec<(&str, &mut dyn FnMut() -> kfuse::Result<()>)> = vec![("f32 gemm", &mut f1), ("add", &mut f2)];\n    for (what, f) in fs {\n        for round in 0..2 {\n            dev.synchronize()?;\n            kfuse::runtime::launch::hostprof::reset();\n            let t = Instant::now();\n            for _ in 0..BURST { f()?; }\n            let us = t.elapsed().as_secs_f64() * 1e6 / BURST as f64;\n            println!("profile {what} round {round}: {us:.2} µs a call");\n            kfuse::runtime::launch::hostprof::dump(BURST as u64);\n        }\n    }\n    for round in 0..3 {\n        dev.synchronize()?;\n        kfuse::runtime::launch::hostprof::reset();\n        let t = Instant::now();\n        for _ in 0..BURST { kfuse::ops::gemm(&a, &b).map(drop)?; }\n        let us = t.elapsed().as_secs_f64() * 1e6 / BURST as f64;\n        println!("profile round {round}: ops::gemm {us:.2} µs a call");\n        kfuse::runtime::launch::hostprof::dump(BURST as u64);\n    }\n'
p='kfuse-runtime/src/launch.rs'
s=open(p).read()
s=s.replace('''/// A scalar argument, passed by value.''','''pub mod hostprof {
    use std::sync::atomic::{AtomicU64, Ordering};
    pub static T: [AtomicU64; 20] = [const { AtomicU64::new(0) }; 20];
    pub const NAMES: [&str; 20] = ["check", "built_ir+shapes+grid", "backend_of", "spec_for", "target+exact", "autotune?", "key", "load", "split?", "issue:validate+grid", "issue:maps", "issue:launch", "", "ops:check_2d", "ops:empty", "ops:contig+tma_readable", "ops:run(total)", "launched-build", "bind", ""];
    pub fn lap(i: usize, t: &mut std::time::Instant) { let n = std::time::Instant::now(); T[i].fetch_add((n - *t).as_nanos() as u64, Ordering::Relaxed); *t = n; }
    pub fn reset() { for t in &T { t.store(0, Ordering::Relaxed); } }
    pub fn dump(calls: u64) { for (i, t) in T.iter().enumerate() { let v = t.load(Ordering::Relaxed); if v > 0 { println!("    {:<28} {:7.3} µs", NAMES[i], v as f64 / 1e3 / calls as f64); } } }
}

/// A scalar argument, passed by value.''',1)
def rep(a,b):
    global s
    assert a in s, a
    s=s.replace(a,b,1)
rep('''    let args: &[Arg<'_>] = args;
    let checked = check(def.name''','''    let args: &[Arg<'_>] = args;
    let mut tp = std::time::Instant::now();
    let checked = check(def.name''')
rep('''    let built = built_ir(def, &checked.dtypes)?;
    let (kernel, grid) = (&built.0, &built.1);
    let shapes''','''    hostprof::lap(0, &mut tp);
    let built = built_ir(def, &checked.dtypes)?;
    let (kernel, grid) = (&built.0, &built.1);
    let shapes''')
rep('''    let mut launched = Launched { backend: backend_of(&checked.device)''','''    hostprof::lap(1, &mut tp);
    let mut launched = Launched { backend: backend_of(&checked.device)''')
rep('''            let gpu = device.gpu_ref().expect("a GPU");
            let mut spec = spec_with_shapes''','''            hostprof::lap(2, &mut tp);
            let gpu = device.gpu_ref().expect("a GPU");
            let mut spec = spec_with_shapes''')
rep('''            let target = gpu.target()?;''','''            hostprof::lap(3, &mut tp);
            let target = gpu.target()?;''')
rep('''            // only `dot` kernels''','''            hostprof::lap(4, &mut tp);
            // only `dot` kernels''')
rep('''            let key = ModuleKey''','''            hostprof::lap(5, &mut tp);
            let key = ModuleKey''')
rep('''            let (loaded, outcome) = load(device, kernel, &key)?;''','''            hostprof::lap(6, &mut tp);
            let (loaded, outcome) = load(device, kernel, &key)?;
            hostprof::lap(7, &mut tp);''')
rep('''            launched.skipped_empty = !issue(device, &loaded, kernel, args, &shapes, None)?;''','''            hostprof::lap(8, &mut tp);
            launched.skipped_empty = !issue(device, &loaded, kernel, args, &shapes, None)?;
            let mut tp = std::time::Instant::now();''')
rep('''            launched.build = build_info(&loaded);
        }''','''            launched.build = build_info(&loaded);
            hostprof::lap(17, &mut tp);
        }''')
i=s.index('fn issue(device: &Device')
body=s[i:]
body=body.replace('''    let e = &k.emitted;''','''    let mut tp = std::time::Instant::now();
    let e = &k.emitted;''',1)
body=body.replace('''    let mut vals = Vec::with_capacity(e.params.len());''','''    hostprof::lap(9, &mut tp);
    let mut vals = Vec::with_capacity(e.params.len());''',1)
body=body.replace('''    let mut b = gpu.stream.launch_builder(&k.func);''','''    hostprof::lap(10, &mut tp);
    gpu.bind()?;
    hostprof::lap(18, &mut tp);
    let mut b = gpu.stream.launch_builder(&k.func);''',1)
body=body.replace('''    if sync_each_launch() {''','''    hostprof::lap(11, &mut tp);
    if sync_each_launch() {''',1)
s=s[:i]+body
open(p,'w').write(s)
p='ops/src/matmul.rs'
s=open(p).read()
rep('''    let (m, k, n, od) = check_2d(what, a, b, opts)?;
    let mut out = Tensor::empty(&[m, n], od, &a.device())?;''','''    let mut tp = std::time::Instant::now();
    let (m, k, n, od) = check_2d(what, a, b, opts)?;
    kfuse_runtime::launch::hostprof::lap(13, &mut tp);
    let mut out = Tensor::empty(&[m, n], od, &a.device())?;
    kfuse_runtime::launch::hostprof::lap(14, &mut tp);''')
rep('''    let tc = tensor_core_f32(a, tf32);
    let (a, b) = (k_contiguous(a, 1, tc)?, k_contiguous(b, 0, tc)?);
    let (a, b) = (crate::tma_readable(&a, tc)?, crate::tma_readable(&b, tc)?);
    through_aligned_rows(out, |o| run(&a, &b, o))''','''    let mut tp = std::time::Instant::now();
    let tc = tensor_core_f32(a, tf32);
    let (a, b) = (k_contiguous(a, 1, tc)?, k_contiguous(b, 0, tc)?);
    let (a, b) = (crate::tma_readable(&a, tc)?, crate::tma_readable(&b, tc)?);
    kfuse_runtime::launch::hostprof::lap(15, &mut tp);
    let r = through_aligned_rows(out, |o| run(&a, &b, o));
    kfuse_runtime::launch::hostprof::lap(16, &mut tp);
    r''')
open(p,'w').write(s)

p='examples/launch_host.rs'
s=open(p).read()
rep('''    Ok(())
}''', DUMP + '''    Ok(())
}''')
open(p,'w').write(s)

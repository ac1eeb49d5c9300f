//! The first call of a GEMM and of a row kernel in a fresh process, and where its time
//! goes (`kfuse::runtime::build_times`: IR, launch index, codegen, disk cache, NVRTC,
//! module load): with an empty cache directory (cold), with the disk cache the cold process filled
//! (warm disk), and with a cache that `kfuse::ops::warm` filled ahead of time from a
//! list of calls. The cold phase runs twice: first with NVRTC's libraries (~115 MB)
//! evicted from the OS's page cache, as in the first process after a machine starts,
//! then with another empty cache and the libraries cached. NVRTC (13.0) keeps what it
//! compiles in NVIDIA's compute cache (`~/.nv/ComputeCache`), where a later process
//! compiling the same source finds it: each cold phase points that cache
//! (`CUDA_CACHE_PATH`) at an empty folder of its own, and a third phase, kfuse's cache
//! empty but NVIDIA's the first cold phase's, shows what that cache saves. Each phase is
//! its own process, started by this one; the device context is made before the clock
//! starts.
//!
//!     cargo run --release --example cold_start [M N K]   (default 4096 4096 4096)
//!
//! A first call's time is from the op's call to the end of a device synchronize after
//! it: the build steps, the launch and the kernel itself.

use std::process::Command;
use std::time::{Duration, Instant};

use kfuse::runtime::build_times;
use kfuse::{DType, Device, Tensor};

const CHILD: &str = "KFUSE_COLD_START_CHILD";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One op's first and second call in this process, with the first call's build steps.
fn first_call(dev: &Device, what: &str, f: impl Fn() -> kfuse::Result<()>) -> kfuse::Result<()> {
    let before = build_times();
    let t = Instant::now();
    f()?;
    dev.synchronize()?;
    let first = t.elapsed();
    let steps = build_times().since(&before);
    let t = Instant::now();
    f()?;
    dev.synchronize()?;
    let second = t.elapsed();
    println!("  {what:<28} first call {:8.2} ms, second {:6.3} ms | {steps}", ms(first), ms(second));
    Ok(())
}

fn child(phase: &str, m: usize, n: usize, k: usize) -> kfuse::Result<()> {
    let t = Instant::now();
    let dev = Device::gpu(0)?;
    let a = Tensor::empty(&[m, k], DType::BF16, &dev)?;
    let b = Tensor::empty(&[k, n], DType::BF16, &dev)?;
    let x = Tensor::empty(&[m, n], DType::BF16, &dev)?;
    dev.synchronize()?;
    let list = format!("gemm bf16 {m}x{k} {k}x{n}\nsoftmax bf16 {m}x{n}\n");
    if phase == "warm-list" {
        let t = Instant::now();
        kfuse::ops::warm(&dev, &kfuse::ops::parse_warm_list(&list)?)?;
        println!("{phase}: kfuse::ops::warm of [{}] took {:.1} ms", list.trim().replace('\n', "; "), ms(t.elapsed()));
        return Ok(());
    }
    println!("{phase} on {}: device context and inputs {:.1} ms (before the clock)", dev.describe(), ms(t.elapsed()));
    first_call(&dev, &format!("gemm {m}x{n}x{k} bf16"), || kfuse::ops::gemm(&a, &b).map(drop))?;
    first_call(&dev, &format!("softmax {m}x{n} bf16"), || kfuse::ops::softmax(&x).map(drop))?;
    Ok(())
}

/// Asks the OS to drop `files`' cached pages; says which files it asked for.
fn evict(files: &[std::path::PathBuf]) -> String {
    let mut done = Vec::new();
    for f in files {
        #[cfg(target_os = "linux")]
        if let Ok(file) = std::fs::File::open(f) {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor; the call only advises the kernel.
            if unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } == 0 {
                done.push(f.display().to_string());
            }
        }
    }
    if done.is_empty() {
        "nothing (no libnvrtc found, or not Linux)".into()
    } else {
        done.join(", ")
    }
}

fn main() -> kfuse::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("M N K")).collect();
    let (m, n, k) = if args.len() >= 3 { (args[0], args[1], args[2]) } else { (4096, 4096, 4096) };
    if let Ok(phase) = std::env::var(CHILD) {
        return child(&phase, m, n, k);
    }
    if kfuse::runtime::gpu_count() == 0 {
        println!("cold_start: no GPU, nothing to time");
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let root = std::env::temp_dir().join(format!("kfuse-cold-start-{}", std::process::id()));
    let (filled, listed) = (root.join("filled"), root.join("listed"));
    let _ = std::fs::remove_dir_all(&root);
    let (other, third) = (root.join("other"), root.join("third"));
    // NVIDIA's compute cache: empty for each cold phase; the first one's kept for the third
    // (and an empty one for `kfuse::ops::warm`'s compiles)
    let (nv_first, nv_other, nv_list) = (root.join("nv-first"), root.join("nv-other"), root.join("nv-list"));
    // the first cold process starts with NVRTC's libraries out of the OS's page cache (as
    // after a machine starts; `posix_fadvise(DONTNEED)` of their files, which no process
    // here has mapped); the second finds them cached
    let evicted = evict(&kfuse::runtime::nvrtc::library_files());
    println!("evicted from the page cache: {evicted}");
    for (phase, dir, nv) in [
        ("cold (empty caches, NVRTC's libraries not in the page cache)", &filled, &nv_first),
        ("cold again (other empty caches, the libraries cached)", &other, &nv_other),
        ("kfuse's cache empty, NVIDIA's compute cache the first cold phase's", &third, &nv_first),
        ("warm disk", &filled, &nv_first),
        ("warm disk again", &filled, &nv_first),
        ("warm-list", &listed, &nv_list),
        ("after kfuse::ops::warm", &listed, &nv_first),
    ] {
        let out = Command::new(&exe).args([m, n, k].map(|v| v.to_string())).env(CHILD, phase).env("KFUSE_CACHE_DIR", dir).env("CUDA_CACHE_PATH", nv).output()?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            eprint!("{}", String::from_utf8_lossy(&out.stderr));
            return Err(kfuse::Error::InvalidArgument(format!("the `{phase}` process failed ({})", out.status)));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

//! `KFUSE_AUTOTUNE=1`: CPU launches never tune, an aliased output is refused before any
//! tuning, and on a GPU `kfuse::ops::gemm` tunes its bucket once (several candidates
//! timed, the winner in `autotune.json`), then reuses it, with a right result. The
//! environment is process-wide: each test holds `ENV` while it sets variables and puts
//! them back before returning. The GPU test is ignored (counted as skipped) unless built
//! with `--cfg kfuse_gpu` (`scripts/gpu-build.sh`), then failed where no GPU is found.

mod common;

use std::sync::Mutex;

use kfuse::prelude::*;
use kfuse::runtime::autotune;
use kfuse::Error;

static ENV: Mutex<()> = Mutex::new(());

/// Environment variables changed for the life of the value, restored after.
struct EnvGuard(Vec<(&'static str, Option<std::ffi::OsString>)>);

impl EnvGuard {
    /// Sets `vars` and removes `KFUSE_TILES` (an explicit override would narrow the
    /// candidates).
    fn set(vars: &[(&'static str, &std::ffi::OsStr)]) -> EnvGuard {
        let mut old: Vec<_> = vars.iter().map(|(k, _)| (*k, std::env::var_os(k))).collect();
        old.push(("KFUSE_TILES", std::env::var_os("KFUSE_TILES")));
        std::env::remove_var("KFUSE_TILES");
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
        // launches read the settings once: re-read them
        kfuse::runtime::settings::reload();
        EnvGuard(old)
    }
}

impl Drop for EnvGuard {
    fn drop(&mut self) {
        for (k, v) in self.0.iter().rev() {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
        kfuse::runtime::settings::reload();
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kfuse-autotune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn reference(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for q in 0..k {
            let x = a[i * k + q];
            for j in 0..n {
                out[i * n + j] += x * b[q * n + j];
            }
        }
    }
    out
}

#[test]
fn cpu_launches_never_tune() {
    let _lock = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("cpu");
    let _env = EnvGuard::set(&[("KFUSE_AUTOTUNE", "1".as_ref()), ("KFUSE_CACHE_DIR", dir.as_os_str())]);
    let cpu = Device::cpu();
    let (a, av) = common::random_tensor(&[24, 40], DType::F32, 1, 0.05, &cpu);
    let (b, bv) = common::random_tensor(&[40, 16], DType::F32, 2, 0.05, &cpu);
    let before = autotune::timings();
    let c = kfuse::ops::gemm(&a, &b).unwrap();
    assert!(common::rel_err(&c.to_vec_f64().unwrap(), &reference(&av, &bv, 24, 40, 16)) < 1e-5);
    assert_eq!(autotune::timings(), before, "an interpreter launch timed candidates");
    assert!(!dir.join(autotune::FILE).exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_aliased_output_is_refused_before_tuning() {
    let _lock = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("alias");
    let _env = EnvGuard::set(&[("KFUSE_AUTOTUNE", "1".as_ref()), ("KFUSE_CACHE_DIR", dir.as_os_str())]);
    let dev = Device::best();
    let (a, _) = common::random_tensor(&[64, 64], DType::F32, 3, 0.05, &dev);
    let mut same = a.clone();
    let before = autotune::timings();
    let err = kfuse::ops::kernels::gemm(&a, &a, &mut same).unwrap_err();
    assert!(matches!(err, Error::Aliasing(_)), "{err}");
    assert_eq!(autotune::timings(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn gemm_tunes_once_per_bucket_on_a_gpu() {
    let dev = common::gpu();
    let _lock = ENV.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir("gpu");
    let _env = EnvGuard::set(&[("KFUSE_AUTOTUNE", "1".as_ref()), ("KFUSE_CACHE_DIR", dir.as_os_str())]);
    let (m, n, k) = (512, 768, 1024);
    let (a, av) = common::random_tensor(&[m, k], DType::BF16, 11, 0.05, &dev);
    let (b, bv) = common::random_tensor(&[k, n], DType::BF16, 12, 0.05, &dev);
    let want = reference(&av, &bv, m, k, n);
    let t0 = autotune::timings();
    let c1 = kfuse::ops::gemm(&a, &b).unwrap();
    let e1 = common::rel_err(&c1.to_vec_f64().unwrap(), &want);
    let t1 = autotune::timings();
    let c2 = kfuse::ops::gemm(&a, &b).unwrap();
    let e2 = common::rel_err(&c2.to_vec_f64().unwrap(), &want);
    let t2 = autotune::timings();
    eprintln!("timed {} candidates, then {}; errors {e1:.2e} {e2:.2e}", t1 - t0, t2 - t1);
    assert!(t1 - t0 > 1, "the first call should time several candidates, timed {}", t1 - t0);
    assert_eq!(t2, t1, "a known bucket was tuned again");
    assert!(e1 < 1e-2 && e2 < 1e-2, "relative errors {e1:.3e} {e2:.3e}");
    let file = dir.join(autotune::FILE);
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let buckets = autotune::parse(&text);
    assert_eq!(buckets.len(), 1, "{text}");
    let w = buckets.values().next().unwrap();
    assert!(w.kernel.contains("gemm") && w.tiles.contains_key("BM") && w.tiles.contains_key("BN"), "{w:?}");
    eprintln!("{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

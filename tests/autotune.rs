//! Autotuning on (`Config::autotune`, what `KFUSE_AUTOTUNE=1` sets): CPU launches never
//! tune, an aliased output is refused before any tuning, and on a GPU `kfuse::ops::gemm`
//! tunes its bucket once (several candidates timed, the winner in `autotune.json`), then
//! reuses it, with a right result. The settings are process-wide: each test holds the
//! binary's `SettingsLock` while they are applied (`common::isolation`). The GPU test is
//! ignored (counted as skipped) unless built with `--cfg kfuse_gpu`
//! (`scripts/gpu-build.sh`), then failed where no GPU is found.

mod common;

use std::path::Path;

use common::isolation::{Applied, SettingsLock};
use kfuse::prelude::*;
use kfuse::runtime::autotune;
use kfuse::runtime::settings::Config;
use kfuse::Error;

/// Autotuning on, its winners in `dir`, and no tile override (an explicit override,
/// from `KFUSE_TILES` say, would narrow the candidates), until the guard drops.
fn tuning_into<'a>(lock: &'a SettingsLock, dir: &Path) -> Applied<'a> {
    lock.apply(Config::new().autotune(true).cache_dir(dir).tiles::<&str>([]))
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
    let lock = SettingsLock::take();
    let dir = temp_dir("cpu");
    let _tuning = tuning_into(&lock, &dir);
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
    let lock = SettingsLock::take();
    let dir = temp_dir("alias");
    let _tuning = tuning_into(&lock, &dir);
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
    let lock = SettingsLock::take();
    let dir = temp_dir("gpu");
    let _tuning = tuning_into(&lock, &dir);
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

//! The launch index (`kfuse::runtime::launch_index`) on real kernels: the emitted
//! `kfuse::ops::gemm` (bf16 on sm_90a and sm_80, f32) and softmax come back from an
//! entry equal in every field; a damaged entry is a miss and is deleted; another
//! compiler fingerprint, spec or target misses. Needs neither NVRTC nor a GPU, but the
//! GPU test: two fresh processes on one cache directory launch a GEMM, and the second
//! generates no CUDA (ignored, counted as skipped, unless built with `--cfg kfuse_gpu`
//! by `scripts/gpu-build.sh`).

mod common;

use std::ffi::OsStr;
use std::path::PathBuf;

use common::gemm::spec_mnk;

use kfuse::codegen::{compile, EmittedKernel, Spec, Target};
use kfuse::ir::{Kernel, KernelDef};
use kfuse::runtime::launch_index::LaunchIndex;
use kfuse::DType;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kfuse-launch-index-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn emitted(def: &KernelDef, dt: DType, spec: &Spec, target: &Target) -> (Kernel, EmittedKernel) {
    let k = (def.build)(&[dt]).unwrap();
    let e = compile(&k, spec, target).unwrap();
    (k, e)
}

#[test]
fn emitted_kernels_come_back_equal() {
    let dir = temp_dir("round-trip");
    let index = LaunchIndex::new(Some(dir.clone()));
    let gemm = &kfuse::ops::kernels::gemm::DEF;
    let softmax = &kfuse::ops::kernels::softmax::DEF;
    let cases = [
        (gemm, DType::BF16, spec_mnk(gemm, 4096, 4096, 4096), Target::sm90a()),
        (gemm, DType::BF16, spec_mnk(gemm, 4096, 4096, 4096), Target::sm80()),
        (gemm, DType::F32, spec_mnk(gemm, 4096, 4096, 4096), Target::sm90a()),
        (softmax, DType::BF16, common::snapshot_spec(softmax), Target::sm90a()),
    ];
    let mut keys = Vec::new();
    for (def, dt, spec, target) in &cases {
        let (k, e) = emitted(def, *dt, spec, target);
        let key = index.key(&k, &[*dt], spec, target).expect("a directory and a fingerprint");
        assert!(index.get(&key).is_none(), "{}: nothing stored yet", def.name);
        assert!(index.put(&key, &e), "{} for {}", def.name, target.arch());
        // every field: entry, source, arch, options, threads, shared memory, parameters
        // (tensor maps included), grid, cluster, persistence, IR, tiles, attempt, plan
        assert_eq!(index.get(&key).as_ref(), Some(&e), "{} for {}", def.name, target.arch());
        keys.push(key);
    }
    keys.dedup();
    assert_eq!(keys.len(), cases.len(), "one key a kernel, spec and target");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An index in a fresh directory `name` holding the sm_90a bf16 4096³ GEMM: the index,
/// the IR, the spec, the emitted kernel and its key.
fn stored_gemm(name: &str) -> (LaunchIndex, Kernel, Spec, EmittedKernel, String) {
    let index = LaunchIndex::new(Some(temp_dir(name)));
    let def = &kfuse::ops::kernels::gemm::DEF;
    let spec = spec_mnk(def, 4096, 4096, 4096);
    let (k, e) = emitted(def, DType::BF16, &spec, &Target::sm90a());
    let key = index.key(&k, &[DType::BF16], &spec, &Target::sm90a()).unwrap();
    assert!(index.put(&key, &e));
    (index, k, spec, e, key)
}

#[test]
fn a_damaged_entry_is_a_miss_and_is_deleted() {
    let (index, _, _, _, key) = stored_gemm("damaged");
    let path = index.entry_path(&key).unwrap();
    let good = std::fs::read(&path).unwrap();
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 0x20;
    for bad in [&good[..good.len() - 1], &good[..40], &flipped[..]] {
        std::fs::write(&path, bad).unwrap();
        assert!(index.get(&key).is_none());
        assert!(!path.exists(), "the damaged entry is deleted");
    }
    let _ = std::fs::remove_dir_all(index.dir().unwrap());
}

#[test]
fn another_fingerprint_spec_or_target_misses() {
    let (index, k, spec, e, key) = stored_gemm("misses");
    let def = &kfuse::ops::kernels::gemm::DEF;
    // another build of the compiler
    let rebuilt = index.clone().with_fingerprint("another build");
    let other = rebuilt.key(&k, &[DType::BF16], &spec, &Target::sm90a()).unwrap();
    assert_ne!(other, key);
    assert!(rebuilt.get(&other).is_none());
    // tile overrides (`KFUSE_TILES`, a tuned winner), another shape, dtype or GPU
    let tiled = Spec { tiles: [("BN".to_string(), 128)].into(), ..spec.clone() };
    let smaller = spec_mnk(def, 512, 4096, 4096);
    let k16 = (def.build)(&[DType::F16]).unwrap();
    let misses = [
        index.key(&k, &[DType::BF16], &tiled, &Target::sm90a()),
        index.key(&k, &[DType::BF16], &smaller, &Target::sm90a()),
        index.key(&k16, &[DType::F16], &spec, &Target::sm90a()),
        index.key(&k, &[DType::BF16], &spec, &Target { num_sms: 114, ..Target::sm90a() }),
    ];
    for m in misses {
        let m = m.unwrap();
        assert_ne!(m, key);
        assert!(index.get(&m).is_none());
    }
    assert_eq!(index.get(&key).as_ref(), Some(&e), "the entry is still there");
    let _ = std::fs::remove_dir_all(index.dir().unwrap());
}

/// The child of `a_second_process_launches_without_codegen`: one GEMM in a fresh
/// process, checked against float64; prints its build steps.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn index_child_gemm() {
    if !common::isolation::is_alone("index_child_gemm") {
        return;
    }
    let dev = common::gpu();
    let (m, n, k) = (256, 512, 384);
    let (a, av) = common::gemm::operand(m, k, DType::BF16, 11, false, &dev);
    let (b, bv) = common::gemm::operand(k, n, DType::BF16, 12, false, &dev);
    let before = kfuse::runtime::build_times();
    let c = kfuse::ops::gemm(&a, &b).unwrap();
    let steps = kfuse::runtime::build_times().since(&before);
    let rows: Vec<usize> = (0..m).collect();
    let err = common::rel_err(&c.to_vec_f64().unwrap(), &common::gemm::reference_rows(&av, &bv, k, n, &rows));
    assert!(err < 1e-2, "relative error {err}");
    println!("codegen={} index={}", steps.counts[1], steps.counts[6]);
}

#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn a_second_process_launches_without_codegen() {
    let dir = temp_dir("processes");
    let vars = [("KFUSE_CACHE_DIR", Some(dir.as_os_str())), ("KFUSE_AUTOTUNE", None::<&OsStr>), ("KFUSE_TILES", None)];
    // (codegen runs, index lookups) of a child
    let counts = |out: &str| -> (u64, u64) {
        // (the child's line may follow libtest's `test index_child_gemm ... ` on one line)
        let line = out.lines().find_map(|l| l.split_once("codegen=").map(|(_, r)| r.trim())).unwrap_or_else(|| panic!("no counts in:\n{out}"));
        let (c, i) = line.split_once(" index=").unwrap();
        (c.parse().unwrap(), i.parse().unwrap())
    };
    let (codegen, lookups) = counts(&common::isolation::run_alone("index_child_gemm", &vars));
    assert!(codegen >= 1 && lookups >= 1, "the first process generates the kernel: {codegen} {lookups}");
    let (codegen, lookups) = counts(&common::isolation::run_alone("index_child_gemm", &vars));
    assert!(codegen == 0 && lookups >= 1, "the second finds it in the launch index: {codegen} {lookups}");
    let _ = std::fs::remove_dir_all(&dir);
}

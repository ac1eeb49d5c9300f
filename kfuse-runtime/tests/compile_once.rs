//! Concurrent first compiles of one kernel run NVRTC once (issue 23): eight threads of a
//! process share the in-flight compile of their `ModuleCache`, and two processes on one
//! cache directory share its lock file — 2 × 8 threads, one compile in all.
//!
//! Needs NVRTC, not a GPU. Without libnvrtc these tests fail (`scripts/test.sh` installs
//! it), unless `KFUSE_REQUIRE_NVRTC=0` asks to skip them. Each source is made fresh (a
//! random constant), so no earlier disk entry answers for it. The tests that compile in
//! this process hold `SERIAL`, so that the process's NVRTC count moves for them alone.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Barrier, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kfuse_runtime::cache::CacheStats;
use kfuse_runtime::nvrtc::{compiles, ensure_nvrtc};
use kfuse_runtime::{CacheOutcome, Error, ModuleCache};
use sha2::{Digest, Sha256};

const ARCH: &str = "sm_80";
const THREADS: usize = 8;
const PROCESSES: usize = 2;

/// Set in a child: the cache directory, the source's constant, the folder the children
/// meet in before they compile.
const WORKER_DIR: &str = "KFUSE_COMPILE_ONCE_DIR";
const WORKER_SEED: &str = "KFUSE_COMPILE_ONCE_SEED";
const WORKER_SYNC: &str = "KFUSE_COMPILE_ONCE_SYNC";

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// NVRTC is there, or the test fails; `KFUSE_REQUIRE_NVRTC=0` skips it instead.
fn require_nvrtc() -> bool {
    match ensure_nvrtc() {
        Ok(()) => true,
        Err(e) if std::env::var("KFUSE_REQUIRE_NVRTC").is_ok_and(|v| v == "0") => {
            eprintln!("KFUSE_REQUIRE_NVRTC=0 and no libnvrtc; skipping: {e}");
            false
        }
        Err(e) => panic!("these tests need libnvrtc (scripts/test.sh installs it; KFUSE_REQUIRE_NVRTC=0 skips them): {e}"),
    }
}

fn random() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    h.write_u32(std::process::id());
    h.finish()
}

/// A kernel no cache has seen: `seed` is in its arithmetic. Unrolled enough that NVRTC
/// takes a moment, so that first calls overlap.
fn source(seed: u64) -> String {
    format!(
        r#"
extern "C" __global__ void kf_once(float* __restrict__ y, const float* __restrict__ x, long long n) {{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    #pragma unroll
    for (int k = 0; k < 256; ++k) {{
        v = __sinf(v) * {seed}.0f + __expf(-v * (float)k) - (float)({seed}ull % (k + 7));
    }}
    y[i] = v;
}}
"#
    )
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kfuse-test-once-{tag}-{}-{:x}", std::process::id(), random()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).map(|rd| rd.map(|e| e.unwrap().file_name().into_string().unwrap()).collect()).unwrap_or_default();
    v.sort();
    v
}

fn sha(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `THREADS` threads call `cache.compile(src)` at once.
fn race(cache: &ModuleCache, src: &str) -> Vec<kfuse_runtime::Result<(std::sync::Arc<kfuse_runtime::Module>, CacheOutcome)>> {
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    cache.compile(src, ARCH, &[])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn count(outcomes: &[CacheOutcome], o: CacheOutcome) -> usize {
    outcomes.iter().filter(|&&x| x == o).count()
}

#[test]
fn eight_threads_compile_once() {
    if !require_nvrtc() {
        return;
    }
    let _g = serial();
    let dir = temp_dir("threads");
    // without a disk level the in-flight entry alone does it; with one, too
    for disk in [None, Some(dir.clone())] {
        let src = source(random());
        let before = compiles();
        let cache = ModuleCache::new(disk.clone());
        let r: Vec<_> = race(&cache, &src).into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(compiles() - before, 1, "NVRTC compiles of {THREADS} concurrent first calls (disk {disk:?})");
        let outcomes: Vec<_> = r.iter().map(|(_, o)| *o).collect();
        assert_eq!((count(&outcomes, CacheOutcome::Compiled), count(&outcomes, CacheOutcome::Memory)), (1, THREADS - 1), "{outcomes:?}");
        assert!(r.iter().all(|(p, _)| *p == r[0].0 && p.ptx.contains(".entry kf_once") && !p.cubin.is_empty()), "every thread gets the one module");
        assert_eq!(cache.stats(), CacheStats { compiles: 1, memory_hits: THREADS as u64 - 1, disk_hits: 0, lock_waits: 0 });

        if disk.is_some() {
            // the entry is on disk, the lock file gone; a fresh cache's threads read it once
            let key_file = cache.entry_path(&src, ARCH, &[]).unwrap().unwrap();
            assert_eq!(files(&dir), vec![key_file.file_name().unwrap().to_str().unwrap().to_string()]);
            let usage = cache.disk_usage().unwrap();
            assert_eq!((usage.entries, usage.bytes), (1, std::fs::metadata(&key_file).unwrap().len()));
            let fresh = ModuleCache::new(disk.clone());
            let r2: Vec<_> = race(&fresh, &src).into_iter().map(|r| r.unwrap()).collect();
            let outcomes: Vec<_> = r2.iter().map(|(_, o)| *o).collect();
            assert_eq!((count(&outcomes, CacheOutcome::Disk), count(&outcomes, CacheOutcome::Memory)), (1, THREADS - 1), "{outcomes:?}");
            assert!(r2.iter().all(|(p, _)| *p == r[0].0));
            assert_eq!(fresh.stats().compiles, 0);
            assert_eq!(compiles() - before, 1);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_compile_reaches_every_waiter_and_is_not_kept() {
    if !require_nvrtc() {
        return;
    }
    let _g = serial();
    let dir = temp_dir("error");
    let bad = format!("extern \"C\" __global__ void k(float* y) {{ y[0] = undefined_{}; }}\n", random());
    let before = compiles();
    let cache = ModuleCache::new(Some(dir.clone()));
    let r = race(&cache, &bad);
    for x in &r {
        match x {
            Err(e @ Error::Nvrtc { .. }) => assert!(e.to_string().contains("undefined_"), "{e}"),
            other => panic!("expected Error::Nvrtc, got {other:?}"),
        }
    }
    assert_eq!(compiles() - before, 1, "the waiters share the failed compile");
    // not kept: the next call compiles again
    assert!(matches!(cache.compile(&bad, ARCH, &[]), Err(Error::Nvrtc { .. })));
    assert_eq!(compiles() - before, 2);
    assert_eq!(cache.stats().compiles, 2);
    assert_eq!(files(&dir), Vec::<String>::new(), "no entry and no lock file left");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_lock_to_be_had_still_compiles() {
    if !require_nvrtc() {
        return;
    }
    let _g = serial();
    // a cache directory that cannot be created: under a regular file
    let base = temp_dir("unwritable");
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("file");
    std::fs::write(&file, b"x").unwrap();
    let src = source(random());
    let cache = ModuleCache::new(Some(file.join("cache")));
    assert_eq!(cache.compile(&src, ARCH, &[]).unwrap().1, CacheOutcome::Compiled);
    assert_eq!(ModuleCache::new(Some(file.join("cache"))).compile(&src, ARCH, &[]).unwrap().1, CacheOutcome::Compiled);

    // a lock another holder keeps past the wait: the compile runs anyway, once the wait
    // is over
    let dir = base.join("cache");
    let cache = ModuleCache::new(Some(dir.clone())).with_lock_wait(Duration::from_millis(300));
    let lock_path = cache.entry_path(&src, ARCH, &[]).unwrap().unwrap().with_extension("lock");
    std::fs::create_dir_all(&dir).unwrap();
    let holder = std::fs::File::create(&lock_path).unwrap();
    holder.lock().unwrap();
    let t = Instant::now();
    assert_eq!(cache.compile(&src, ARCH, &[]).unwrap().1, CacheOutcome::Compiled);
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(60), "{waited:?}");
    assert_eq!(cache.stats().lock_waits, 1);

    // while the lock is held, an entry another process writes is taken as it appears
    let src2 = source(random());
    let before = compiles();
    let waiter = ModuleCache::new(Some(dir.clone()));
    let lock2 = waiter.entry_path(&src2, ARCH, &[]).unwrap().unwrap().with_extension("lock");
    let holder2 = std::fs::File::create(&lock2).unwrap();
    holder2.lock().unwrap();
    std::thread::scope(|s| {
        let w = s.spawn(|| waiter.compile(&src2, ARCH, &[]).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        // an impatient writer: finds the lock held, does not wait, compiles and writes
        let writer = ModuleCache::new(Some(dir.clone())).with_lock_wait(Duration::ZERO);
        let (p, o) = writer.compile(&src2, ARCH, &[]).unwrap();
        assert_eq!(o, CacheOutcome::Compiled);
        assert_eq!(w.join().unwrap(), (p, CacheOutcome::Disk));
    });
    assert_eq!(compiles() - before, 1);
    drop((holder, holder2));
    let _ = std::fs::remove_dir_all(&base);
}

/// What a worker process printed: its NVRTC compiles, its cache's count of them and of
/// waits for the other's lock, and its PTX's hash.
#[derive(Debug)]
struct Report {
    compiles: u64,
    cache_compiles: u64,
    lock_waits: u64,
    ptx: String,
}

#[test]
fn two_processes_of_eight_threads_compile_once() {
    if !require_nvrtc() {
        return;
    }
    let dir = temp_dir("procs");
    let sync = temp_dir("procs-sync");
    std::fs::create_dir_all(&sync).unwrap();
    let seed = random();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args(["worker_process", "--exact", "--nocapture", "--test-threads=1"])
                .env(WORKER_DIR, &dir)
                .env(WORKER_SEED, seed.to_string())
                .env(WORKER_SYNC, &sync)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let reports: Vec<Report> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "worker failed ({}):\n{stdout}\n{stderr}", out.status);
            let line = stdout.lines().find_map(|l| l.split_once("compile-once-worker: ")).unwrap_or_else(|| panic!("no report from the worker:\n{stdout}\n{stderr}")).1;
            let field = |k: &str| line.split(' ').find_map(|f| f.strip_prefix(k)).unwrap_or_else(|| panic!("{k} missing in {line}")).to_string();
            let number = |k: &str| field(k).parse::<u64>().unwrap_or_else(|e| panic!("{k} in {line}: {e}"));
            Report { compiles: number("compiles="), cache_compiles: number("cache_compiles="), lock_waits: number("lock_waits="), ptx: field("ptx=") }
        })
        .collect();
    eprintln!("workers: {reports:?}");
    if reports.iter().all(|r| r.lock_waits == 0) {
        // still one compile (the later worker read the entry), but the lock went unused
        eprintln!("note: the workers did not overlap this run; the lock file was not contended");
    }
    let total: u64 = reports.iter().map(|r| r.compiles).sum();
    assert_eq!(total, 1, "NVRTC compiles over {PROCESSES} processes of {THREADS} threads: {reports:?}");
    assert_eq!(reports.iter().map(|r| r.cache_compiles).sum::<u64>(), 1, "{reports:?}");
    assert!(reports.iter().all(|r| r.ptx == reports[0].ptx), "{reports:?}");
    // one entry, no lock or temporary file left
    let left = files(&dir);
    assert!(left.len() == 1 && left[0].ends_with(".module"), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&sync);
}

/// The child of `two_processes_of_eight_threads_compile_once`; does nothing in a normal
/// run. Meets the other workers (a file each in the sync folder), then compiles the
/// shared source from `THREADS` threads and prints what the process's NVRTC did.
#[test]
fn worker_process() {
    let (Some(dir), Some(seed), Some(sync)) = (std::env::var_os(WORKER_DIR), std::env::var(WORKER_SEED).ok(), std::env::var_os(WORKER_SYNC)) else {
        return;
    };
    assert!(require_nvrtc());
    let src = source(seed.parse().unwrap());
    let cache = ModuleCache::new(Some(PathBuf::from(dir)));
    // everything but the compile done before the meeting: NVRTC loaded, the key known
    cache.entry_path(&src, ARCH, &[]).unwrap();
    let sync = PathBuf::from(sync);
    std::fs::write(sync.join(format!("ready.{}", std::process::id())), b"").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while files(&sync).len() < PROCESSES {
        assert!(Instant::now() < deadline, "the other worker never came");
        std::thread::sleep(Duration::from_millis(1));
    }
    let r: Vec<_> = race(&cache, &src).into_iter().map(|r| r.unwrap()).collect();
    assert!(r.iter().all(|(p, _)| *p == r[0].0));
    let s = cache.stats();
    println!(
        "compile-once-worker: compiles={} cache_compiles={} memory_hits={} disk_hits={} lock_waits={} ptx={}",
        compiles(),
        s.compiles,
        s.memory_hits,
        s.disk_hits,
        s.lock_waits,
        sha(&r[0].0.ptx)
    );
}

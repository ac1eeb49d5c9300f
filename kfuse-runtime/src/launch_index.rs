//! The launch index: the emitted kernels of earlier processes, on disk beside the module
//! cache, so that a process whose cache already holds a kernel launches it without
//! generating CUDA again.
//!
//! Owns: [`LaunchIndex`] (key → [`EmittedKernel`], on disk only) and the compiler
//! [`fingerprint`]. A GPU launch that has not loaded its kernel yet looks here first
//! (`launch::load`): on a hit it loads the entry's kernel through the module cache (its
//! source, arch and options give the module's disk key) and skips codegen; on a miss it
//! generates the kernel as before — the register-room attempts included — and stores
//! the kernel it chose.
//!
//! Invariants:
//! - The key is the hex SHA-256 of the entry format, the [`fingerprint`], the kernel's IR
//!   as built (before the passes: its `Debug` text, every field of the [`Kernel`]
//!   included), the dtypes, the [`Spec`] and the [`Target`], each length-prefixed: all
//!   that codegen reads. The spec holds the settings that reach codegen (`KFUSE_TILES`,
//!   `KFUSE_THREADS`, `KFUSE_MIN_BLOCKS`, tuned tiles, a grouped launch), the target
//!   `KFUSE_TARGET`'s architecture and the device's multiprocessors and shared memory.
//! - The fingerprint names the compiler that generated the entry: the crate version,
//!   the path, size, modification time and inode of the file the running code was
//!   loaded from (the executable, or the shared library kfuse is linked into), and on
//!   Linux that object's GNU build ID (a hash of its contents, where the linker writes
//!   one), read once a process. A rebuilt program has another, so its entries are not
//!   reused (they stay on disk until [`crate::ModuleCache::clear`]). Where the file
//!   cannot be found there is no fingerprint and no index.
//! - A file `<key>.launch` in the cache directory is a header — `kfuse-launch 1`,
//!   `sha256 <hex of body>`, `json <bytes>`, an empty line — and the body: the emitted
//!   kernel as JSON, every field of it but the CUDA source, then the source as it is. A
//!   file whose header or hash does not check out, or whose body does not parse, is
//!   deleted and counts as a miss, never as an error.
//! - Only a kernel that survives its own round trip is stored (serialized, parsed back,
//!   equal): a kernel with a part the entry would not carry stays out.
//! - Files are written to a temporary name in the same directory and renamed into place,
//!   as module files are; no disk level, no index. The index is best effort: an entry
//!   that cannot be read, written or loaded costs codegen, never an error.
//! - An entry records the attempt the fallbacks chose when it was written (with the
//!   NVRTC then installed); [`crate::ModuleCache::clear`] deletes the entries with the
//!   modules, so that the next process chooses again.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kfuse_codegen::{EmittedKernel, Spec, Target};
use kfuse_ir::{DType, Kernel};

use crate::cache::{read_verified, sha256_hex, sha256_of_parts, write_atomically};

const MAGIC: &str = "kfuse-launch 1";

/// The extension of an index file.
pub(crate) const EXTENSION: &str = "launch";

/// Emitted kernels on disk by what they were generated from (see the module docs).
///
/// # Examples
///
/// Needs neither NVRTC nor a GPU:
///
/// ```
/// use kfuse_codegen::{EmittedKernel, Spec, Target};
/// use kfuse_runtime::launch_index::LaunchIndex;
///
/// fn keep(kernel: &kfuse_ir::Kernel, spec: &Spec, emitted: &EmittedKernel) -> Option<EmittedKernel> {
///     let dir = std::env::temp_dir().join(format!("kfuse-index-doc-{}", std::process::id()));
///     let index = LaunchIndex::new(Some(dir));
///     let key = index.key(kernel, &[kfuse_runtime::DType::BF16], spec, &Target::sm90a())?;
///     index.put(&key, emitted);
///     index.get(&key) // equal to `emitted`
/// }
/// ```
#[derive(Clone, Debug)]
pub struct LaunchIndex {
    dir: Option<PathBuf>,
    fingerprint: Option<String>,
}

impl LaunchIndex {
    /// An index with its files in `dir` (`None`: no disk level, so no index), under this
    /// process's [`fingerprint`].
    pub fn new(dir: Option<PathBuf>) -> LaunchIndex {
        LaunchIndex { dir, fingerprint: fingerprint().map(str::to_string) }
    }

    /// The index of the module cache in force ([`crate::ModuleCache::default_dir`]).
    pub fn current() -> LaunchIndex {
        LaunchIndex::new(crate::ModuleCache::default_dir())
    }

    /// The same index under another compiler fingerprint (a tool that reads the entries
    /// of another build, a test).
    pub fn with_fingerprint(mut self, fingerprint: impl Into<String>) -> LaunchIndex {
        self.fingerprint = Some(fingerprint.into());
        self
    }

    /// The directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The key of the kernel codegen makes of `kernel` (the IR as built, before the
    /// passes) bound to `dtypes`, for `spec` and `target`; `None` without a directory or
    /// a fingerprint.
    pub fn key(&self, kernel: &Kernel, dtypes: &[DType], spec: &Spec, target: &Target) -> Option<String> {
        self.dir.as_ref()?;
        let fingerprint = self.fingerprint.as_deref()?;
        let described = [format!("{kernel:?}"), format!("{dtypes:?}"), format!("{spec:?}"), format!("{target:?}")];
        let mut parts = vec![MAGIC.as_bytes(), fingerprint.as_bytes()];
        parts.extend(described.iter().map(|d| d.as_bytes()));
        Some(sha256_of_parts(&parts))
    }

    /// The file of `key`; `None` without a directory.
    pub fn entry_path(&self, key: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{key}.{EXTENSION}")))
    }

    /// The emitted kernel stored under `key`, if a verified entry holds it; a damaged
    /// entry is deleted.
    pub fn get(&self, key: &str) -> Option<EmittedKernel> {
        read_verified(&self.entry_path(key)?, parse_entry)
    }

    /// Stores `emitted` under `key`, replacing what was there; whether it was stored (not
    /// without a directory, for a kernel that does not survive a round trip, or where the
    /// file cannot be written).
    pub fn put(&self, key: &str, emitted: &EmittedKernel) -> bool {
        let Some(path) = self.entry_path(key) else { return false };
        let Some(bytes) = format_entry(emitted) else { return false };
        if parse_entry(bytes.clone()).as_ref() != Some(emitted) {
            return false;
        }
        write_atomically(&path, &bytes).is_ok()
    }
}

/// The bytes of an index file holding `emitted`: its source as it is, after the JSON of
/// the rest (a source in JSON takes escaping, and most of a first read's parsing).
fn format_entry(emitted: &EmittedKernel) -> Option<Vec<u8>> {
    let json = serde_json::to_string(&EmittedKernel { source: String::new(), ..emitted.clone() }).ok()?;
    let body = json + &emitted.source;
    Some(format!("{MAGIC}\nsha256 {}\njson {}\n\n{body}", sha256_hex(body.as_bytes()), body.len() - emitted.source.len()).into_bytes())
}

/// The emitted kernel of a verified index file, or `None`.
fn parse_entry(bytes: Vec<u8>) -> Option<EmittedKernel> {
    let text = std::str::from_utf8(&bytes).ok()?;
    let rest = text.strip_prefix(MAGIC)?.strip_prefix("\nsha256 ")?;
    let (sha, rest) = rest.split_once("\njson ")?;
    let (json_len, body) = rest.split_once("\n\n")?;
    if sha256_hex(body.as_bytes()) != sha {
        return None;
    }
    let (json, source) = body.split_at_checked(json_len.parse().ok()?)?;
    let e: EmittedKernel = serde_json::from_str(json).ok()?;
    e.source.is_empty().then(|| EmittedKernel { source: source.to_string(), ..e })
}

/// The compiler's fingerprint in this process (module docs), `None` where the file the
/// running code came from cannot be found.
pub fn fingerprint() -> Option<&'static str> {
    static F: OnceLock<Option<String>> = OnceLock::new();
    F.get_or_init(|| {
        let (path, meta) = code_file()?;
        let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos();
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0u64;
        #[cfg(target_os = "linux")]
        let id = build_id().unwrap_or_else(|| "none".into());
        #[cfg(not(target_os = "linux"))]
        let id = "none";
        Some(format!("kfuse-runtime {}; {}; {} bytes; modified {modified}; inode {inode}; build id {id}", env!("CARGO_PKG_VERSION"), path.display(), meta.len()))
    })
    .as_deref()
}

/// The GNU build ID of the loaded object that holds this function, in hex: a hash of
/// the object's contents that the linker writes into a note (where it writes one), read
/// from memory, so that it is the code running even where the file has been replaced or
/// its timestamps normalized.
#[cfg(target_os = "linux")]
fn build_id() -> Option<String> {
    struct Search {
        addr: usize,
        id: Option<Vec<u8>>,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the loader passes a valid `info` for the duration of the call, with
        // `dlpi_phnum` program headers at `dlpi_phdr`; `data` is the `Search` below.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let base = info.dlpi_addr as usize;
        let loaded: Vec<std::ops::Range<usize>> =
            phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD).map(|p| base + p.p_vaddr as usize..base + p.p_vaddr as usize + p.p_memsz as usize).collect();
        if !loaded.iter().any(|r| r.contains(&search.addr)) {
            return 0;
        }
        for p in phdrs.iter().filter(|p| p.p_type == libc::PT_NOTE) {
            let at = base + p.p_vaddr as usize;
            let len = p.p_memsz as usize;
            // only notes the loader mapped
            if !loaded.iter().any(|r| r.start <= at && at + len <= r.end) {
                continue;
            }
            // SAFETY: inside a loaded segment of this object, which stays mapped (it
            // holds the running code)
            let notes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
            search.id = gnu_build_id(notes, if p.p_align == 8 { 8 } else { 4 });
            if search.id.is_some() {
                break;
            }
        }
        1
    }
    let mut search = Search { addr: build_id as *const () as usize, id: None };
    // SAFETY: `each` only reads what the loader passes and writes `search`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut search as *mut Search as *mut libc::c_void) };
    search.id.filter(|id| !id.is_empty()).map(|id| crate::cache::hex(&id))
}

/// The descriptor of the GNU build-ID note among ELF notes (each a name size, a
/// descriptor size and a type, 4 bytes each, then the name and the descriptor, each
/// ending padded to a multiple of `align` bytes from the note's start).
#[cfg(any(target_os = "linux", test))]
fn gnu_build_id(mut notes: &[u8], align: usize) -> Option<Vec<u8>> {
    const NT_GNU_BUILD_ID: u32 = 3;
    let word = |b: &[u8], i: usize| Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize);
    while notes.len() >= 12 {
        let (name_len, desc_len, kind) = (word(notes, 0)?, word(notes, 4)?, word(notes, 8)?);
        let desc_at = name_len.checked_add(12)?.checked_next_multiple_of(align)?;
        let next = desc_at.checked_add(desc_len)?.checked_next_multiple_of(align)?;
        let name = notes.get(12..12 + name_len)?;
        let desc = notes.get(desc_at..desc_at + desc_len)?;
        if kind == NT_GNU_BUILD_ID as usize && name == b"GNU\0" {
            return Some(desc.to_vec());
        }
        notes = notes.get(next..)?;
    }
    None
}

/// The file the running code was loaded from, and its metadata: the shared library that
/// holds this function where it is one, else the executable (on Linux the one running,
/// through `/proc/self/exe`, even if a rebuild has replaced the file at its path since).
fn code_file() -> Option<(PathBuf, std::fs::Metadata)> {
    let exe = std::env::current_exe().ok()?;
    #[cfg(target_os = "linux")]
    let exe_meta = std::fs::metadata("/proc/self/exe").ok()?;
    #[cfg(not(target_os = "linux"))]
    let exe_meta = std::fs::metadata(&exe).ok()?;
    #[cfg(unix)]
    if let Some(lib) = shared_object() {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(&lib) {
            if (m.dev(), m.ino()) != (exe_meta.dev(), exe_meta.ino()) {
                return Some((lib, m));
            }
        }
    }
    Some((exe, exe_meta))
}

/// The absolute path of the object (`dladdr`) that holds this function's code; the
/// caller tells the executable from a shared library.
#[cfg(unix)]
fn shared_object() -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: `Dl_info` is plain data (pointers and an address), for which zeroes are
    // valid; `dladdr` only reads the address and fills `info`; the name it returns points
    // into the loader's tables, valid while the object stays loaded (it holds this
    // code), and is copied at once.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let found = unsafe { libc::dladdr(shared_object as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.is_absolute().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kfuse_codegen::{GridAxisEval, KernelParam, Plan};
    use kfuse_ir::{ParamId, ShapeSym};

    fn emitted() -> EmittedKernel {
        EmittedKernel {
            entry: "kf_k".into(),
            source: "extern \"C\" __global__ void kf_k() {}\n// \u{3bb}\n".into(),
            arch: "sm_90a".into(),
            options: vec!["-DX=1".into()],
            block_threads: 384,
            grouped: false,
            smem_bytes: 1 << 17,
            params: vec![
                KernelParam::TensorMap { tensor: ParamId(0), box_dims: vec![64, 128], swizzle: 128, order: vec![1, 0] },
                KernelParam::Ptr(ParamId(1)),
                KernelParam::Stride { tensor: ParamId(1), dim: 0 },
                KernelParam::Shape(ShapeSym(2)),
                KernelParam::Scalar(ParamId(3)),
            ],
            grid: vec![GridAxisEval { dim: ShapeSym(0), step: 128 }],
            cluster_x: 2,
            persistent: Some(132),
            ir: "kernel k()".into(),
            tiles: [("BM".to_string(), 128)].into(),
            register_attempt: (1, 2),
            plan: Plan { kernel: "k".into(), arch: "sm_90a".into(), dots: vec!["`d`: wgmma".into()], row_chunks: Some((8, 4, 2)), ..Plan::default() },
        }
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kfuse-index-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn entries_round_trip_and_damage_is_a_miss() {
        let dir = temp("unit");
        let index = LaunchIndex::new(Some(dir.clone())).with_fingerprint("f");
        let e = emitted();
        assert!(index.get("k").is_none());
        assert!(index.put("k", &e));
        assert_eq!(index.get("k").as_ref(), Some(&e));
        let path = index.entry_path("k").unwrap();
        let good = std::fs::read(&path).unwrap();
        // truncated, a byte changed, another format, a body that verifies but does not
        // parse or is shorter than its JSON: each a miss, and the file is gone
        let mut flipped = good.clone();
        let n = flipped.len();
        flipped[n - 5] ^= 1;
        let verified = |json_len: usize, body: &str| format!("{MAGIC}\nsha256 {}\njson {json_len}\n\n{body}", sha256_hex(body.as_bytes())).into_bytes();
        let unparsable = verified(8, "{\"x\": 1}");
        let past_the_body = verified(99, "{\"x\": 1}");
        let other = String::from_utf8(good.clone()).unwrap().replace(MAGIC, "kfuse-launch 0").into_bytes();
        for bad in [&good[..good.len() / 2], &flipped[..], &other[..], &unparsable[..], &past_the_body[..], b""] {
            std::fs::write(&path, bad).unwrap();
            assert!(index.get("k").is_none());
            assert!(!path.exists(), "a damaged entry is deleted");
        }
        // written atomically: no temporary file is left
        assert!(index.put("k", &e));
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_directory_no_index() {
        let index = LaunchIndex::new(None).with_fingerprint("f");
        let k = Kernel::new("k");
        assert_eq!(index.key(&k, &[], &Spec::default(), &Target::sm90a()), None);
        assert!(!index.put("k", &emitted()));
        assert!(index.get("k").is_none());
    }

    #[test]
    fn the_key_covers_fingerprint_kernel_dtypes_spec_and_target() {
        let index = LaunchIndex::new(Some(temp("key"))).with_fingerprint("f");
        let (k, spec, t) = (Kernel::new("k"), Spec::default(), Target::sm90a());
        let key = index.key(&k, &[DType::BF16], &spec, &t).unwrap();
        assert_eq!(key.len(), 64);
        assert_eq!(Some(&key), index.key(&k, &[DType::BF16], &spec, &t).as_ref());
        let tiled = Spec { tiles: [("BN".to_string(), 128)].into(), ..spec.clone() };
        let others = [
            index.clone().with_fingerprint("g").key(&k, &[DType::BF16], &spec, &t),
            index.key(&Kernel::new("k2"), &[DType::BF16], &spec, &t),
            index.key(&k, &[DType::F16], &spec, &t),
            index.key(&k, &[DType::BF16], &tiled, &t),
            index.key(&k, &[DType::BF16], &Spec { threads: Some(128), ..spec.clone() }, &t),
            index.key(&k, &[DType::BF16], &Spec { grouped: true, ..spec.clone() }, &t),
            index.key(&k, &[DType::BF16], &spec, &Target::sm80()),
            index.key(&k, &[DType::BF16], &spec, &Target { num_sms: 114, ..Target::sm90a() }),
        ];
        for o in others {
            assert_ne!(o.as_ref(), Some(&key));
        }
    }

    #[test]
    fn this_process_has_a_fingerprint() {
        let f = fingerprint().expect("the test binary is a file");
        assert!(f.starts_with("kfuse-runtime ") && f.contains("bytes") && f.contains("build id"), "{f}");
        assert_eq!(LaunchIndex::new(Some(temp("fp"))).fingerprint.as_deref(), Some(f));
        // the build ID read from memory is the one in the file (where the linker wrote one)
        #[cfg(target_os = "linux")]
        if let Some(id) = build_id() {
            let bytes: Vec<u8> = (0..id.len()).step_by(2).map(|i| u8::from_str_radix(&id[i..i + 2], 16).unwrap()).collect();
            let exe = std::fs::read("/proc/self/exe").unwrap();
            assert!(bytes.len() >= 8 && exe.windows(bytes.len()).any(|w| w == bytes), "{id}");
        }
    }

    #[test]
    fn build_id_notes_parse() {
        // a note of another type first (8-byte padding), then the build ID
        let mut notes = Vec::new();
        let note = |notes: &mut Vec<u8>, kind: u32, name: &[u8], desc: &[u8], align: usize| {
            for w in [name.len() as u32, desc.len() as u32, kind] {
                notes.extend_from_slice(&w.to_ne_bytes());
            }
            for part in [name, desc] {
                notes.extend_from_slice(part);
                notes.resize(notes.len().next_multiple_of(align), 0);
            }
        };
        note(&mut notes, 5, b"GNU\0", &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 8);
        note(&mut notes, 3, b"GNU\0", &[0xab; 20], 8);
        assert_eq!(gnu_build_id(&notes, 8), Some(vec![0xab; 20]));
        // another owner's note of type 3, truncated notes, none
        let mut other = Vec::new();
        note(&mut other, 3, b"XYZ\0", &[1; 4], 4);
        assert_eq!(gnu_build_id(&other, 4), None);
        assert_eq!(gnu_build_id(&notes[..notes.len() - 8], 8), None, "the descriptor cut short");
        assert_eq!(gnu_build_id(&[], 4), None);
    }
}

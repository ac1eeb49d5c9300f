//! Tensors of more than 2^31 elements (issue 23, item 6).
//!
//! Without a GPU: what the compiler writes for such sizes. Every kernel of `kfuse::ops`
//! (the op table of `tests/common`, the matrix products and RoPE), specialized for a
//! shape of more than 2^31 elements, keeps program ids, shapes, strides and element
//! offsets in 64-bit integers: no 32-bit variable is set from a 64-bit value except
//! through the explicit casts listed in [`bounded_cast`] (tile bounds, clamped
//! remainders, TMA coordinates, which the runtime keeps below 2^31). A program axis
//! that may need more than 65535 programs is launched along x (`order_grid`), and
//! kernels at ordinary shapes keep their grid and source.
//!
//! On the GPU (ignored without one; run in the GPU build, `--cfg kfuse_gpu`): `add` of
//! 2^31 + 7 bf16 elements, `softmax` over rows of 4096 + 7 elements, 2^31 + 26 552 in
//! all, `copy` of a strided vector and `transpose` of a `[2, 2^30 + 5]` matrix, each
//! through the public API and through its kernel into an output poisoned with NaN first,
//! checked against float64 (every element, or sampled rows plus every row's sum). Random
//! data from a seed, printed (`KFUSE_TEST_SEED` sets it); the host fills and checks the
//! 4 GiB buffers on all its cores.

// `!(e <= tol)` on purpose: a NaN error fails
#![allow(clippy::neg_cmp_op_on_partial_ord)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use kfuse::codegen::{compile, EmittedKernel, Spec, Target, TensorSpec};
use kfuse::ir::{KernelDef, ParamSig};
use kfuse::ops::kernels as k;
use kfuse::DType;

/// 2^31 + 7: a size past every 32-bit signed index.
const BIG: u64 = (1 << 31) + 7;

// ---------------------------------------------------------------------------------------
// Without a GPU: the generated source.

/// The specialization a launch builds (`kfuse::runtime::spec_for`) for packed,
/// 16-byte-aligned tensors whose shape symbols have the values `vals`.
fn spec_at(def: &KernelDef, vals: &BTreeMap<&str, u64>) -> Spec {
    let pow2_div = |x: u64| if x == 0 { 16 } else { 1u32 << x.trailing_zeros().min(4) };
    let tensors = def
        .params
        .iter()
        .map(|p| match p {
            ParamSig::Tensor { dims, .. } => {
                let mut stride_div = vec![0; dims.len()];
                let mut stride = 1u64;
                for d in (0..dims.len()).rev() {
                    if d + 1 < dims.len() {
                        stride_div[d] = pow2_div(stride);
                    }
                    stride *= vals[dims[d]];
                }
                Some(TensorSpec { ptr_align: 16, stride_div })
            }
            ParamSig::Scalar { .. } => None,
        })
        .collect();
    let kernel = (def.build)(&vec![DType::F32; def.generics.len()]).unwrap();
    let (shape_pow2, shape_div) = kernel.shape_syms.iter().map(|s| kfuse::codegen::target::shape_facts(vals[s.as_str()])).unzip();
    Spec { tensors, shape_pow2, shape_div, tiles: Default::default(), threads: None, min_blocks: None, grouped: false, register_attempt: 0, ..Spec::default() }
}

/// A kernel at a large shape: name, kernel, dtypes of its generics, shape symbol values.
struct Large {
    name: String,
    def: &'static KernelDef,
    dtypes: Vec<DType>,
    vals: BTreeMap<&'static str, u64>,
}

impl Large {
    fn compile(&self, target: &Target) -> (EmittedKernel, Vec<u64>) {
        let kernel = (self.def.build)(&self.dtypes).unwrap();
        let e = compile(&kernel, &spec_at(self.def, &self.vals), target).unwrap_or_else(|e| panic!("{}: {e}", self.name));
        let shapes = kernel.shape_syms.iter().map(|s| self.vals[s.as_str()]).collect();
        (e, shapes)
    }
}

fn vals(v: &[(&'static str, u64)]) -> BTreeMap<&'static str, u64> {
    v.iter().copied().collect()
}

/// Every kernel behind `kfuse::ops` at a shape of more than 2^31 elements: the op table
/// of `tests/common` (each kernel must have a shape here), the matrix products (bf16 on
/// the matrix path, f32 on the FMA path) and RoPE.
fn large_kernels() -> Vec<Large> {
    let mut out = Vec::new();
    for case in common::ops() {
        let syms: BTreeSet<&str> = case.def.params.iter().flat_map(|p| if let ParamSig::Tensor { dims, .. } = p { dims.to_vec() } else { vec![] }).collect();
        let v = match syms.iter().copied().collect::<Vec<_>>()[..] {
            ["N"] => vals(&[("N", BIG)]),
            ["N", "P"] => vals(&[("N", BIG), ("P", BIG.div_ceil(k::CHUNK as u64))]),
            // rows of 4096 + 7: the softmax of the GPU test
            ["M", "N"] => vals(&[("M", 523_400), ("N", 4103)]),
            ["M", "N", "NB"] => vals(&[("NB", 3), ("M", 70_001), ("N", 10_243)]),
            ref s => panic!("{}: give the kernel a large shape here (symbols {s:?})", case.name),
        };
        out.push(Large { name: case.name.to_string(), def: case.def, dtypes: case.generics(DType::BF16), vals: v });
    }
    let gemm = vals(&[("M", 70_001), ("K", 4096), ("N", 40_960)]);
    out.push(Large { name: "gemm bf16".into(), def: &k::gemm::DEF, dtypes: vec![DType::BF16], vals: gemm.clone() });
    out.push(Large { name: "gemm f32".into(), def: &k::gemm::DEF, dtypes: vec![DType::F32], vals: gemm.clone() });
    let mut batched = gemm;
    batched.insert("NB", 3);
    out.push(Large { name: "gemm_batched_axpby bf16".into(), def: &k::gemm_batched_axpby::DEF, dtypes: vec![DType::BF16, DType::BF16], vals: batched });
    let rope = vals(&[("NT", (1 << 24) + 3), ("HQ", 32), ("HK", 8), ("R", 2), ("DH", 64), ("P", 1 << 20)]);
    out.push(Large { name: "rope_offset".into(), def: &k::rope_offset::DEF, dtypes: vec![DType::BF16], vals: rope.clone() });
    out.push(Large { name: "rope_table_pos".into(), def: &k::rope_table_pos::DEF, dtypes: vec![DType::BF16, DType::F32], vals: rope });
    out
}

/// The end of the balanced group that opens at `s[open]` (`(`), exclusive.
fn group_end(s: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in s[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// The operand of the cast that ends at `s[at]`: a parenthesized group, or a name with
/// its call arguments or member (`kf_mini(…)`, `blockIdx.x`).
fn cast_operand(s: &str, at: usize) -> &str {
    let rest = &s[at..];
    if rest.starts_with('(') {
        return &s[at..group_end(s, at)];
    }
    let n = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.')).unwrap_or(rest.len());
    if rest[n..].starts_with('(') {
        &s[at..group_end(s, at + n)]
    } else {
        &s[at..at + n]
    }
}

fn mentions(expr: &str, names: &BTreeSet<String>) -> Option<String> {
    expr.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .find(|w| names.contains(*w) || *w == "blockIdx")
        .map(str::to_string)
}

/// Whether an explicit 32-bit cast of a 64-bit value in `line` is one of the bounded
/// ones: a tile bound (`kf_b…`, between 0 and a tile extent), a remainder clamped to
/// 2^30, the parity of an iteration, a cluster rank, a TMA coordinate (below 2^31:
/// the runtime refuses a tensor map of a longer dimension), or a persistent walk's
/// program count or index, which the compiler narrows only where the spec bounds the
/// programs below 2^31 (`tests/gemm_codegen.rs`,
/// `the_walk_divides_in_32_bits_where_the_programs_are_bounded`).
fn bounded_cast(line: &str, operand: &str) -> bool {
    if line.trim_start().starts_with("const unsigned kf_w") {
        return true;
    }
    let is_bound = operand.strip_prefix("(kf_b").and_then(|r| r.strip_suffix(')')).is_some_and(|d| d.chars().all(|c| c.is_ascii_digit()));
    let clamped = operand.starts_with("kf_mini(kf_maxi(") && operand.ends_with(", -1LL), 1LL << 30)");
    let tma = line.contains("kf_tma_") || line.contains("cp.async.bulk.tensor");
    let (ru, pid) = (operand == "ru" && line.contains("ru < 16 ? (unsigned)ru"), operand.starts_with("(blockIdx.x % "));
    // a ring load's valid extent (`operand_ring`): 0, or a tile extent, or a clamp to
    // [0, tile extent]
    let extent = operand.strip_suffix(" : 0LL))").and_then(|o| o.split_once(") ? ")).is_some_and(|(_, v)| {
        v.starts_with("kf_maxi(0LL, kf_mini(") && v.ends_with("LL))") || v.strip_suffix("LL").is_some_and(|d| d.chars().all(|c| c.is_ascii_digit()))
    });
    is_bound || clamped || tma || ru || pid || extent || operand == "(kf_it & 1)"
}

/// The places where `source` narrows a 64-bit value (or a block index) to 32 bits: a
/// 32-bit variable initialized from an expression that names one outside an explicit
/// cast, or an explicit cast that [`bounded_cast`] does not know.
fn narrowings(source: &str) -> Vec<String> {
    let mut wide: BTreeSet<String> = BTreeSet::new();
    for (i, _) in source.match_indices("long long ") {
        let rest = &source[i + 10..];
        let n = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        wide.insert(rest[..n].to_string());
    }
    // further declarators of one `long long a = …, b = …;` statement
    for l in source.lines().filter(|l| l.trim_start().starts_with("long long ") || l.trim_start().starts_with("const long long ")) {
        for part in l.split(", ").skip(1) {
            if let Some((name, _)) = part.split_once(" = ") {
                if name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    wide.insert(name.to_string());
                }
            }
        }
    }
    let mut found = Vec::new();
    // from the entry point on: the prelude's helpers (conversions, shared-memory
    // addresses, matrix descriptors' bit fields) are fixed text, not index arithmetic
    for line in source.lines().skip_while(|l| !l.contains("__global__")) {
        // explicit casts
        for cast in ["(int)", "(unsigned)"] {
            for (i, _) in line.match_indices(cast) {
                let operand = cast_operand(line, i + cast.len());
                if mentions(operand, &wide).is_some() && !bounded_cast(line, operand) {
                    found.push(format!("an unbounded cast {cast}{operand}: {}", line.trim()));
                }
            }
        }
        // 32-bit declarations (`for (int i = …;` included), every declarator; not a
        // persistent walk's decoding (`kf_w…`), which the compiler narrows only where the
        // spec bounds the programs below 2^31 (see `bounded_cast`)
        let t = line.trim_start().trim_start_matches("for (").trim_start_matches("#pragma unroll");
        if t.starts_with("const unsigned kf_w") {
            continue;
        }
        let Some(decl) = ["const int ", "int ", "const unsigned ", "unsigned "].iter().find_map(|p| t.strip_prefix(p)) else { continue };
        if decl.starts_with("long ") || decl.starts_with("char") {
            continue;
        }
        let decl = decl.split(';').next().unwrap_or("");
        let mut depth = 0;
        let mut start = 0;
        let mut parts = Vec::new();
        for (i, c) in decl.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&decl[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        parts.push(&decl[start..]);
        for p in parts {
            let Some((_, init)) = p.split_once(" = ") else { continue };
            // what is left outside the explicit casts (checked above) and the shared-memory
            // addresses (32-bit by definition: `kf_saddr`, `kf_saddr_once` of a shared
            // array, such as the `unsigned long long` mbarriers)
            let mut bare = init.to_string();
            let narrow = |b: &str| ["(int)", "(unsigned)", "kf_saddr_once", "kf_saddr"].iter().filter_map(|p| b.find(p).map(|i| (i, p.len()))).min();
            while let Some((i, len)) = narrow(&bare) {
                let end = i + len + cast_operand(&bare, i + len).len();
                bare.replace_range(i..end, "0");
            }
            if let Some(w) = mentions(&bare, &wide) {
                found.push(format!("a 32-bit variable set from `{w}`: {}", line.trim()));
            }
        }
    }
    found
}

#[test]
fn the_checker_finds_narrowings() {
    let src = "__global__ void f(const long long n_N) {\nconst long long v0 = (long long)blockIdx.x;\nconst int c0 = v0 * 64;\nconst int k0 = g * 8;\nconst int h = (int)(v0);\nconst int b = (int)(kf_b4);\nlong long kf_b4 = 3;";
    let found = narrowings(src);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].contains("set from `v0`") && found[1].contains("unbounded cast (int)(v0)"), "{found:#?}");
    assert!(narrowings("__global__ void f() {\nint x = blockIdx.y * 4096;")[0].contains("from `blockIdx`"));
    assert!(narrowings("__global__ void f(const long long n_N) {\nconst int r = n_N - 5, q = 2;")[0].contains("from `n_N`"));
    assert!(narrowings("__global__ void f(const long long n_N) {\nconst int r = (int)kf_mini(kf_maxi(n_N - v3, -1LL), 1LL << 30);").is_empty());
    assert!(narrowings("__global__ void f() {\n__shared__ unsigned long long kf_full[4];\nconst unsigned a = kf_saddr_once(kf_full), b = kf_saddr(kf_full);").is_empty());
    assert!(narrowings("__global__ void f() {\n__shared__ unsigned long long kf_full[4];\nconst unsigned a = kf_full[0];")[0].contains("from `kf_full`"));
}

/// Every kernel of `kfuse::ops` at more than 2^31 elements, for sm_80 and sm_90a: shapes
/// and strides are 64-bit parameters, program ids 64-bit values, and nothing 64-bit is
/// narrowed to 32 bits but the bounded casts.
#[test]
fn offsets_are_64_bit_at_large_shapes() {
    let mut failures = Vec::new();
    for case in large_kernels() {
        for (arch, target) in [("sm_80", Target::sm80()), ("sm_90a", Target::sm90a())] {
            let (e, shapes) = case.compile(&target);
            let what = format!("{} on {arch} at {shapes:?}", case.name);
            let entry = e.source.lines().find(|l| l.contains("__global__")).unwrap();
            for p in entry.split(['(', ',']).map(str::trim).filter(|p| p.contains(" n_") || p.contains(" st_")) {
                if !p.starts_with("const long long ") {
                    failures.push(format!("{what}: parameter `{p}` is not 64-bit"));
                }
            }
            for l in e.source.lines().filter(|l| l.contains("blockIdx") && l.contains("// ")) {
                // a program id (the writer names it after the kernel's variable)
                if !l.trim_start().starts_with("const long long v") {
                    failures.push(format!("{what}: program id `{}` is not 64-bit", l.trim()));
                }
            }
            failures.extend(narrowings(&e.source).into_iter().map(|n| format!("{what}: {n}")));
            let g = e.grid_dims(&shapes);
            if !(g[0] < 1 << 31 && g[1] <= 65535 && g[2] <= 65535) {
                failures.push(format!("{what}: grid {g:?} past CUDA's limits"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The launch grid of a kernel at concrete shapes; one not persistent has a block for
/// every program (the axes in launch order, one of them maybe moved to x).
fn check_grid(e: &EmittedKernel, shapes: &[u64], what: &str) -> [u64; 3] {
    let g = e.grid_dims(shapes);
    if e.persistent.is_none() {
        let programs: u64 = e.programs(shapes).iter().product();
        assert_eq!(g.iter().product::<u64>(), programs, "{what}: grid {g:?}");
    }
    g
}

/// A program axis that may need more than 65535 programs goes along x: `copy2d` of a
/// strided vector as one row `[1, N]` (what `ops::copy` launches), a transpose and a
/// batch of a short, wide matrix, a `[NB, M, N]` batch of more than 65535 small
/// matrices, and matrix products of a wide `N` (sm_80's matrix path, the FMA path).
#[test]
fn long_axes_go_along_x() {
    let cases = [
        ("copy2d", &k::copy2d::DEF, DType::BF16, vals(&[("M", 1), ("N", BIG)]), 1),
        ("transpose", &k::transpose::DEF, DType::BF16, vals(&[("M", 2), ("N", (1 << 30) + 5)]), 1),
        ("add3d", &k::add3d::DEF, DType::BF16, vals(&[("NB", 1), ("M", 2), ("N", (1 << 30) + 5)]), 1),
        ("copy3d", &k::copy3d::DEF, DType::BF16, vals(&[("NB", 70_001), ("M", 3), ("N", 4)]), 2),
        ("gemm", &k::gemm::DEF, DType::F32, vals(&[("M", 100), ("K", 64), ("N", 1 << 24)]), 1),
    ];
    for (name, def, dt, v, axis) in cases {
        let case = Large { name: name.into(), def, dtypes: vec![dt], vals: v };
        for (arch, target) in [("sm_80", Target::sm80()), ("sm_90a", Target::sm90a())] {
            let what = format!("{name} {dt} on {arch}");
            let (e, shapes) = case.compile(&target);
            let g = check_grid(&e, &shapes, &what);
            assert!(g[0] < 1 << 31 && g[1] <= 65535 && g[2] <= 65535, "{what}: grid {g:?}");
            assert!(e.ir.contains(&format!("grid: program_id({axis}) along x")), "{what}:\n{}", e.ir);
            let letter = ["x", "y", "z"][axis];
            assert!(e.source.contains(&format!("(long long)blockIdx.{letter};  // i")), "{what}: program_id(0) along {letter}");
        }
    }
    // sm_80's matrix loop (the general lowering's mma.sync): the same, N tiles along x
    let case = Large { name: "gemm".into(), def: &k::gemm::DEF, dtypes: vec![DType::BF16], vals: vals(&[("M", 256), ("K", 64), ("N", 1 << 24)]) };
    let (e, shapes) = case.compile(&Target::sm80());
    assert!(e.plan.to_string().contains(": mma.sync m16n8k16 over") && e.ir.contains("grid: program_id(1) along x"), "{}", e.ir);
    assert_eq!(check_grid(&e, &shapes, "gemm bf16 sm_80"), [(1 << 24) / 128, 2, 1]);
    // two long axes cannot both go along x: the order stays, and the launch refuses the
    // grid (a transpose of more than 2^32 tiles: 2^46 elements)
    let case = Large { name: "transpose".into(), def: &k::transpose::DEF, dtypes: vec![DType::BF16], vals: vals(&[("M", 1 << 23), ("N", 1 << 23)]) };
    let (e, shapes) = case.compile(&Target::sm90a());
    assert!(!e.ir.contains("grid:"), "{}", e.ir);
    assert!(e.grid_dims(&shapes)[1] > 65535);
}

/// At ordinary shapes nothing moves: program axis 0 along x, as the snapshots pin.
#[test]
fn ordinary_shapes_keep_their_grid() {
    let cases = [
        ("copy2d", &k::copy2d::DEF, vals(&[("M", 1), ("N", 1 << 20)])),
        ("transpose", &k::transpose::DEF, vals(&[("M", 4096), ("N", 4096)])),
        ("add3d", &k::add3d::DEF, vals(&[("NB", 32_768), ("M", 3), ("N", 4)])),
        ("gemm", &k::gemm::DEF, vals(&[("M", 8192), ("K", 8192), ("N", 8192)])),
    ];
    for (name, def, v) in cases {
        let case = Large { name: name.into(), def, dtypes: vec![DType::BF16], vals: v };
        for (arch, target) in [("sm_80", Target::sm80()), ("sm_90a", Target::sm90a())] {
            let (e, shapes) = case.compile(&target);
            assert!(!e.ir.contains("grid:"), "{name} on {arch}:\n{}", e.ir);
            check_grid(&e, &shapes, name);
            if e.persistent.is_none() {
                assert!(e.source.contains("(long long)blockIdx.x;  // i"), "{name} on {arch}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// On the GPU.

/// One large test at a time: each holds up to 16 GiB on the GPU and twice that on the
/// host.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn seed() -> u64 {
    let s = std::env::var("KFUSE_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x2331_0006);
    println!("seed {s} (KFUSE_TEST_SEED={s} repeats this run)");
    s
}

/// A 64-bit hash of (seed, i): splitmix64.
fn hash(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform value in `[lo, hi)` from (seed, i).
fn uniform(seed: u64, i: u64, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * ((hash(seed, i) >> 11) as f64 / (1u64 << 53) as f64)
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(8, |n| n.get())
}

/// `f(range)` over `0..n` in one piece per core, the results in order.
fn par<T: Send>(n: usize, f: impl Fn(std::ops::Range<usize>) -> T + Sync) -> Vec<T> {
    let per = n.div_ceil(threads()).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n).step_by(per).map(|lo| { let f = &f; s.spawn(move || f(lo..(lo + per).min(n))) }).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The little-endian bf16 bytes of `f(i)` for `i` in `0..n`, filled on every core.
fn bf16_bytes(n: usize, f: impl Fn(usize) -> f64 + Sync) -> Vec<u8> {
    let mut bytes = vec![0u8; 2 * n];
    let per = n.div_ceil(threads()).max(1);
    std::thread::scope(|s| {
        for (c, chunk) in bytes.chunks_mut(2 * per).enumerate() {
            let f = &f;
            s.spawn(move || {
                for (j, b) in chunk.chunks_exact_mut(2).enumerate() {
                    b.copy_from_slice(&half::bf16::from_f64(f(c * per + j)).to_le_bytes());
                }
            });
        }
    });
    bytes
}

fn bf16_at(bytes: &[u8], i: usize) -> f64 {
    half::bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f64()
}

/// The failures of `check(i)` over `0..n` (at most 10 reported), and how many there are.
fn check_all(n: usize, check: impl Fn(usize) -> Option<String> + Sync) -> (usize, Vec<String>) {
    let parts = par(n, |r| {
        let mut bad = (0usize, Vec::new());
        for i in r {
            if let Some(m) = check(i) {
                bad.0 += 1;
                if bad.1.len() < 10 {
                    bad.1.push(m);
                }
            }
        }
        bad
    });
    let count = parts.iter().map(|p| p.0).sum();
    (count, parts.into_iter().flat_map(|p| p.1).take(10).collect())
}

/// Frees a NaN-poisoned tensor of `elements` bf16 elements, so that the output the API
/// allocates next most likely reuses poisoned memory (the runtime's caching pool hands
/// the next tensor of a size class the block last freed; nothing depends on it: the
/// kernel launches write into `common::poisoned` outputs).
fn poison_the_pool(elements: usize, dev: &kfuse::Device) {
    drop(common::poisoned(&[elements], DType::BF16, dev));
}

/// Positions to report on: both ends, around 2^31, and the last element.
fn landmarks(n: usize) -> Vec<usize> {
    let mut v = vec![0, 1, (1 << 31) - 1, 1 << 31, (1 << 31) + 1, n - 2, n - 1];
    v.retain(|&i| i < n);
    v
}

fn gpu_test() -> (kfuse::Device, std::sync::MutexGuard<'static, ()>, u64) {
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    (common::gpu(), guard, seed())
}

/// `ops::add` of 2^31 + 7 bf16 elements, and `kernels::add` into a poisoned output:
/// every element against the float64 sum (within a bf16 rounding: 2^-8 relative).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn add_of_2_31_plus_7_elements() {
    let (dev, _one, seed) = gpu_test();
    let n = BIG as usize;
    let t = std::time::Instant::now();
    // magnitudes in [1/16, 4), either sign: values no kernel could get right by accident
    let value = |s: u64, i: usize| {
        let m = uniform(s, i as u64, 0.0625, 4.0);
        if hash(s ^ 1, i as u64) & 1 == 0 { m } else { -m }
    };
    let (ab, bb) = (bf16_bytes(n, |i| value(seed, i)), bf16_bytes(n, |i| value(seed + 1, i)));
    let a = kfuse::Tensor::from_bytes(&ab, &[n], DType::BF16, &dev).unwrap();
    let b = kfuse::Tensor::from_bytes(&bb, &[n], DType::BF16, &dev).unwrap();
    println!("inputs of {n} elements on the GPU in {:.1?}", t.elapsed());
    let check = |out: &kfuse::Tensor, what: &str| {
        let t = std::time::Instant::now();
        assert_eq!(out.shape(), &[n]);
        let ob = out.to_bytes().unwrap();
        let (count, bad) = check_all(n, |i| {
            let (x, y, got) = (bf16_at(&ab, i), bf16_at(&bb, i), bf16_at(&ob, i));
            let r = x + y;
            (!((got - r).abs() <= r.abs() * (1.0 / 256.0))).then(|| format!("[{i}] {x} + {y} = {r}, got {got}"))
        });
        for i in landmarks(n) {
            println!("{what} [{i}]: {} + {} = {}", bf16_at(&ab, i), bf16_at(&bb, i), bf16_at(&ob, i));
        }
        println!("{what}: {n} elements checked in {:.1?}", t.elapsed());
        assert!(count == 0, "{what}: {count} of {n} elements wrong, the first:\n{}", bad.join("\n"));
    };
    poison_the_pool(n, &dev);
    let t = std::time::Instant::now();
    let api = kfuse::ops::add(&a, &b).unwrap();
    dev.synchronize().unwrap();
    println!("ops::add ran in {:.1?} (compile included)", t.elapsed());
    check(&api, "ops::add");
    drop(api);
    let mut out = common::poisoned(&[n], DType::BF16, &dev);
    let l = k::add(&a, &b, &mut out).unwrap();
    assert!(matches!(l.backend, kfuse::Backend::Gpu { .. }), "{:?}", l.backend);
    check(&out, "kernels::add");
}

/// Softmax of `x[M, N]` rows in float64.
fn softmax_row(x: &[f64]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// `ops::softmax` over `[523 400, 4103]` bf16 (rows of 4096 + 7; 2^31 + 26 552 elements,
/// the last rows wholly past 2^31), and `kernels::softmax` into a poisoned output: sampled
/// rows (the first, the row across 2^31, every row after it, 64 random ones) against
/// float64 by `tests/common`'s measure, and every row finite, in [0, 1], summing to 1.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn softmax_of_rows_past_2_31_elements() {
    let (dev, _one, seed) = gpu_test();
    let (m, nn) = (523_400usize, 4103usize);
    let n = m * nn;
    assert!(n as u64 >= BIG);
    let t = std::time::Instant::now();
    let xb = bf16_bytes(n, |i| uniform(seed, i as u64, -6.0, 6.0));
    let x = kfuse::Tensor::from_bytes(&xb, &[m, nn], DType::BF16, &dev).unwrap();
    println!("input [{m}, {nn}] ({n} elements) on the GPU in {:.1?}", t.elapsed());
    let across = (1usize << 31) / nn;
    let mut rows: Vec<usize> = vec![0, 1, across - 1];
    rows.extend(across..m);
    rows.extend((0..64).map(|j| (hash(seed ^ 7, j) % m as u64) as usize));
    let tol = common::tolerance(DType::BF16);
    let check = |out: &kfuse::Tensor, what: &str| {
        let t = std::time::Instant::now();
        assert_eq!(out.shape(), &[m, nn]);
        let ob = out.to_bytes().unwrap();
        let mut worst: f64 = 0.0;
        for &r in &rows {
            let xs: Vec<f64> = (0..nn).map(|j| bf16_at(&xb, r * nn + j)).collect();
            let got: Vec<f64> = (0..nn).map(|j| bf16_at(&ob, r * nn + j)).collect();
            let reference: Vec<f64> = softmax_row(&xs).into_iter().map(|v| DType::BF16.round(v)).collect();
            let e = common::rel_err(&got, &reference);
            assert!(e <= tol, "{what}: row {r} (elements {}..{}): relative error {e:.3e} > {tol:.1e}", r * nn, (r + 1) * nn);
            worst = worst.max(e);
        }
        let (count, bad) = check_all(m, |r| {
            let row = (0..nn).map(|j| bf16_at(&ob, r * nn + j));
            let ok = row.clone().all(|v| (0.0..=1.0).contains(&v));
            let s: f64 = row.sum();
            (!(ok && (s - 1.0).abs() <= 0.02)).then(|| format!("row {r}: sum {s}, every element in [0, 1]: {ok}"))
        });
        println!("{what}: {} sampled rows within {worst:.2e}, {m} rows' sums checked in {:.1?}", rows.len(), t.elapsed());
        assert!(count == 0, "{what}: {count} of {m} rows wrong, the first:\n{}", bad.join("\n"));
    };
    poison_the_pool(n, &dev);
    let t = std::time::Instant::now();
    let api = kfuse::ops::softmax(&x).unwrap();
    dev.synchronize().unwrap();
    println!("ops::softmax ran in {:.1?} (compile included)", t.elapsed());
    check(&api, "ops::softmax");
    drop(api);
    let mut out = common::poisoned(&[m, nn], DType::BF16, &dev);
    k::softmax(&x, &mut out).unwrap();
    check(&out, "kernels::softmax");
}

/// `ops::copy` of every other element of a `[2^31 + 7, 2]` tensor (a strided vector:
/// `copy2d` of one row of 2^31 + 7 elements, its tiles along the grid's x), and
/// `kernels::copy2d` into a poisoned output: every element exactly.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn copy_of_a_strided_vector_past_2_31_elements() {
    let (dev, _one, seed) = gpu_test();
    let n = BIG as usize;
    let sb = bf16_bytes(2 * n, |i| uniform(seed, i as u64, -4.0, 4.0));
    let storage = kfuse::Tensor::from_bytes(&sb, &[n, 2], DType::BF16, &dev).unwrap();
    let x = storage.narrow(1, 1, 1).unwrap().view(&[n]).unwrap();
    assert_eq!(x.strides(), &[2]);
    let check = |out: &kfuse::Tensor, what: &str| {
        assert_eq!(out.numel(), n);
        let ob = out.to_bytes().unwrap();
        let (count, bad) = check_all(n, |i| {
            let (want, got) = (bf16_at(&sb, 2 * i + 1), bf16_at(&ob, i));
            (got.to_bits() != want.to_bits()).then(|| format!("[{i}] want {want}, got {got}"))
        });
        for i in landmarks(n) {
            println!("{what} [{i}]: {}", bf16_at(&ob, i));
        }
        assert!(count == 0, "{what}: {count} of {n} elements wrong, the first:\n{}", bad.join("\n"));
    };
    poison_the_pool(n, &dev);
    let api = kfuse::ops::copy(&x).unwrap();
    assert!(api.is_contiguous());
    check(&api, "ops::copy");
    drop(api);
    let mut out = common::poisoned(&[1, n], DType::BF16, &dev);
    k::copy2d(&x.unsqueeze(0).unwrap(), &mut out).unwrap();
    check(&out, "kernels::copy2d");
}

/// `ops::transpose` of a `[2, 2^30 + 5]` bf16 matrix (2^31 + 10 elements; the column
/// tiles along the grid's x), and `kernels::transpose` into a poisoned output: every
/// element exactly.
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: built with --cfg kfuse_gpu by scripts/gpu-build.sh")]
fn transpose_of_a_wide_matrix_past_2_31_elements() {
    let (dev, _one, seed) = gpu_test();
    let (rows, cols) = (2usize, (1usize << 30) + 5);
    let n = rows * cols;
    let xb = bf16_bytes(n, |i| uniform(seed, i as u64, -4.0, 4.0));
    let x = kfuse::Tensor::from_bytes(&xb, &[rows, cols], DType::BF16, &dev).unwrap();
    let check = |out: &kfuse::Tensor, what: &str| {
        assert_eq!(out.shape(), &[cols, rows]);
        let ob = out.to_bytes().unwrap();
        // out[j, i] = x[i, j]: element `o` of the output is x[o % 2, o / 2]
        let (count, bad) = check_all(n, |o| {
            let (want, got) = (bf16_at(&xb, (o % rows) * cols + o / rows), bf16_at(&ob, o));
            (got.to_bits() != want.to_bits()).then(|| format!("out[{}, {}] want {want}, got {got}", o / rows, o % rows))
        });
        for i in landmarks(n) {
            println!("{what} [{i}]: {}", bf16_at(&ob, i));
        }
        assert!(count == 0, "{what}: {count} of {n} elements wrong, the first:\n{}", bad.join("\n"));
    };
    poison_the_pool(n, &dev);
    let api = kfuse::ops::transpose(&x).unwrap();
    check(&api, "ops::transpose");
    drop(api);
    let mut out = common::poisoned(&[cols, rows], DType::BF16, &dev);
    k::transpose(&x, &mut out).unwrap();
    check(&out, "kernels::transpose");
}

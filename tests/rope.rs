//! RoPE (`kfuse::ops::rope`): numerics against a float64 reference on `Device::best()`
//! (the interpreter here, the GPU on the GPU host) for every head layout × position
//! source × angle source × dtype on odd sizes; the argument checks; and the generated
//! CUDA of every RoPE kernel × {sm_80, sm_90a} × dtype × head layout: insta snapshots,
//! and NVRTC + `ptxas -v` with no spills (`common::assemble`).
//!
//! The RoPE kernels take two outputs and position/table tensors, which the op table of
//! `common` (one result per op) does not describe; they are checked here instead.

mod common;

use std::collections::BTreeMap;

use kfuse::codegen::{compile, Spec, Target, TensorSpec};
use kfuse::ir::{Kernel, KernelDef, ParamSig};
use kfuse::ops::kernels as k;
use kfuse::ops::{rope, Freqs, Positions, RopeLayout, RopeOptions};
use kfuse::{DType, Device, Error, Tensor};

const BASE: f32 = 10000.0;
/// Rows of the cos/sin tables.
const P: usize = 64;
const OFFSET: i64 = 5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum PosKind {
    Offset,
    Tensor,
}

/// One run: `q: [lead.., hq, d]`, `k: [lead.., hk, d]`.
#[derive(Clone, Debug)]
struct Case {
    layout: RopeLayout,
    pos: PosKind,
    table: Option<DType>,
    dtype: DType,
    lead: Vec<usize>,
    hq: usize,
    hk: usize,
    d: usize,
}

impl Case {
    fn tokens(&self) -> usize {
        self.lead.iter().product()
    }
    fn seq(&self) -> usize {
        *self.lead.last().unwrap()
    }
}

/// `(cos θ, sin θ)` of pair `j` at position `p`, in f64.
fn angle(p: f64, j: usize, d: usize) -> (f64, f64) {
    let th = p * (BASE as f64).powf(-2.0 * j as f64 / d as f64);
    (th.cos(), th.sin())
}

/// The cos and sin tables `[P, d/2]` (values rounded to `dt`).
fn tables(d: usize, dt: DType, dev: &Device) -> (Tensor, Tensor, Vec<f64>, Vec<f64>) {
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for p in 0..P {
        for j in 0..d / 2 {
            let (cv, sv) = angle(p as f64, j, d);
            c.push(dt.round(cv));
            s.push(dt.round(sv));
        }
    }
    let ct = Tensor::from_f64(&c, &[P, d / 2], dt, dev).unwrap();
    let st = Tensor::from_f64(&s, &[P, d / 2], dt, dev).unwrap();
    (ct, st, c, s)
}

/// Element indices `(i1, i2)` of pair `j` of row (token × head) `r`.
fn pair(layout: RopeLayout, r: usize, j: usize, d: usize) -> (usize, usize) {
    match layout {
        RopeLayout::HalfSplit => (r * d + j, r * d + j + d / 2),
        RopeLayout::Interleaved => (r * d + 2 * j, r * d + 2 * j + 1),
    }
}

/// The float64 reference of one tensor (`h` heads), rounded to `dt` once.
fn reference(x: &[f64], case: &Case, h: usize, pos: &[f64], table: Option<(&[f64], &[f64])>) -> Vec<f64> {
    let d = case.d;
    let mut out = x.to_vec();
    for (t, &p) in pos.iter().enumerate() {
        for hh in 0..h {
            let r = t * h + hh;
            for j in 0..d / 2 {
                let (c, s) = match table {
                    None => angle(p, j, d),
                    Some((ct, st)) => {
                        if !(0.0..P as f64).contains(&p) {
                            continue; // outside the table: left as it was
                        }
                        let i = p as usize * (d / 2) + j;
                        (ct[i], st[i])
                    }
                };
                let (i1, i2) = pair(case.layout, r, j, d);
                let (x1, x2) = (x[i1], x[i2]);
                out[i1] = case.dtype.round(x1 * c - x2 * s);
                out[i2] = case.dtype.round(x2 * c + x1 * s);
            }
        }
    }
    out
}

/// One rounding to the dtype. Computed angles carry an f32 error of about
/// `pos · 2^-23` radians besides (the inverse frequencies are f32); with the positions
/// below 64 used here that stays under 1e-6 (seen: 5e-7 on the interpreter and an H200).
fn tol(case: &Case) -> f64 {
    common::tolerance(case.dtype)
}

/// Runs one case on `dev`; returns the larger relative error of `q` and `k`.
fn run(case: &Case, dev: &Device, seed: u64) -> Result<f64, String> {
    let ctx = |e: Error| format!("{case:?}: {e}");
    let t = case.tokens();
    let qshape: Vec<usize> = case.lead.iter().copied().chain([case.hq, case.d]).collect();
    let kshape: Vec<usize> = case.lead.iter().copied().chain([case.hk, case.d]).collect();
    let (mut q, qv) = common::random_tensor(&qshape, case.dtype, seed, 0.0, dev);
    let (mut kk, kv) = common::random_tensor(&kshape, case.dtype, seed + 1, 0.0, dev);
    let positions: Vec<f64> = match case.pos {
        PosKind::Offset => (0..t).map(|i| (OFFSET + (i % case.seq()) as i64) as f64).collect(),
        // Random positions, a repeat, and in range of the tables.
        PosKind::Tensor => common::random(t, seed + 2, 1.0, 0.0).iter().map(|r| ((r.abs() * 1e6) as u64 % P as u64) as f64).collect(),
    };
    let pos_t = Tensor::from_f64(&positions, &[t], DType::I64, dev).unwrap();
    let tabs = case.table.map(|dt| tables(case.d, dt, dev));
    let opts = RopeOptions {
        layout: case.layout,
        positions: match case.pos {
            PosKind::Offset => Positions::Offset(OFFSET),
            PosKind::Tensor => Positions::Tensor(&pos_t),
        },
        freqs: match &tabs {
            None => Freqs::Computed { base: BASE },
            Some((c, s, _, _)) => Freqs::Table { cos: c, sin: s },
        },
    };
    rope(&mut q, &mut kk, &opts).map_err(ctx)?;
    let table = tabs.as_ref().map(|(_, _, c, s)| (c.as_slice(), s.as_slice()));
    let mut worst: f64 = 0.0;
    for (name, x, v, h) in [("q", &q, &qv, case.hq), ("k", &kk, &kv, case.hk)] {
        let got = x.to_vec_f64().map_err(ctx)?;
        let want = reference(v, case, h, &positions, table);
        let e = common::rel_err(&got, &want);
        if !(e <= tol(case)) {
            return Err(format!("{case:?} `{name}`: relative error {e:.3e} > {:.1e}", tol(case)));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// Every dtype and odd size for one layout × positions × angles combination.
fn sweep(layout: RopeLayout, pos: PosKind, table: bool) {
    let dev = Device::best();
    let mut failures = Vec::new();
    let mut worst = BTreeMap::new();
    let mut seed = 100;
    for dtype in common::DTYPES {
        for lead in [vec![1], vec![7], vec![3, 11]] {
            for d in [2, 6, 64, 128] {
                let table = table.then_some(DType::F32);
                let case = Case { layout, pos, table, dtype, lead: lead.clone(), hq: 3, hk: 1, d };
                seed += 10;
                match run(&case, &dev, seed) {
                    Ok(e) => {
                        let w = worst.entry(dtype.to_string()).or_insert(0.0f64);
                        *w = w.max(e);
                    }
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    println!("rope {layout:?} {pos:?} table={table} on {}: worst {worst:?}", dev.describe());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn half_split_offset_computed() {
    sweep(RopeLayout::HalfSplit, PosKind::Offset, false);
}
#[test]
fn half_split_offset_table() {
    sweep(RopeLayout::HalfSplit, PosKind::Offset, true);
}
#[test]
fn half_split_positions_computed() {
    sweep(RopeLayout::HalfSplit, PosKind::Tensor, false);
}
#[test]
fn half_split_positions_table() {
    sweep(RopeLayout::HalfSplit, PosKind::Tensor, true);
}
#[test]
fn interleaved_offset_computed() {
    sweep(RopeLayout::Interleaved, PosKind::Offset, false);
}
#[test]
fn interleaved_offset_table() {
    sweep(RopeLayout::Interleaved, PosKind::Offset, true);
}
#[test]
fn interleaved_positions_computed() {
    sweep(RopeLayout::Interleaved, PosKind::Tensor, false);
}
#[test]
fn interleaved_positions_table() {
    sweep(RopeLayout::Interleaved, PosKind::Tensor, true);
}

/// More key heads than query heads, no key heads, and tables in another dtype than q.
#[test]
fn head_counts_and_table_dtypes() {
    let dev = Device::best();
    let base = Case { layout: RopeLayout::HalfSplit, pos: PosKind::Offset, table: None, dtype: DType::BF16, lead: vec![2, 5], hq: 1, hk: 4, d: 6 };
    let cases = [
        base.clone(),
        Case { hq: 2, hk: 0, ..base.clone() },
        Case { hq: 0, hk: 2, layout: RopeLayout::Interleaved, ..base.clone() },
        Case { table: Some(DType::BF16), dtype: DType::F32, pos: PosKind::Tensor, ..base.clone() },
        Case { table: Some(DType::F16), dtype: DType::BF16, layout: RopeLayout::Interleaved, d: 64, ..base.clone() },
    ];
    for (i, c) in cases.iter().enumerate() {
        run(c, &dev, 500 + 10 * i as u64).unwrap();
    }
}

/// `[B, S]` positions for `[B, S, H, D]` inputs; positions outside the tables leave their
/// token unchanged.
#[test]
fn batched_positions_and_tokens_outside_the_table() {
    let dev = Device::best();
    let (b, s, h, d) = (2, 3, 2, 8);
    let (mut q, qv) = common::random_tensor(&[b, s, h, d], DType::F32, 600, 0.0, &dev);
    let (mut kk, kv) = common::random_tensor(&[b, s, 1, d], DType::F32, 601, 0.0, &dev);
    let positions = [3.0, -1.0, 2.0, P as f64, 63.0, 1.0e9];
    let pos = Tensor::from_f64(&positions, &[b, s], DType::I64, &dev).unwrap();
    let (c, sn, cv, sv) = tables(d, DType::F32, &dev);
    let opts = RopeOptions { layout: RopeLayout::HalfSplit, positions: Positions::Tensor(&pos), freqs: Freqs::Table { cos: &c, sin: &sn } };
    rope(&mut q, &mut kk, &opts).unwrap();
    let case = Case { layout: RopeLayout::HalfSplit, pos: PosKind::Tensor, table: Some(DType::F32), dtype: DType::F32, lead: vec![b, s], hq: h, hk: 1, d };
    let got = q.to_vec_f64().unwrap();
    assert!(common::rel_err(&got, &reference(&qv, &case, h, &positions, Some((&cv, &sv)))) < 1e-6);
    let got = kk.to_vec_f64().unwrap();
    assert!(common::rel_err(&got, &reference(&kv, &case, 1, &positions, Some((&cv, &sv)))) < 1e-6);
    // tokens 1, 3 and 5 (positions -1, P, 10^9) are untouched, the others are not
    for tok in 0..b * s {
        let same = got[tok * d..(tok + 1) * d] == kv[tok * d..(tok + 1) * d];
        assert_eq!(same, [1, 3, 5].contains(&tok), "token {tok}");
    }
}

/// Rotating by `p` and then by `-p` gives the input back (computed angles, f32): a check
/// of the signs that does not depend on the reference.
#[test]
fn rotation_inverts() {
    let dev = Device::best();
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        let (mut q, qv) = common::random_tensor(&[9, 2, 10], DType::F32, 700, 0.0, &dev);
        let (mut kk, kv) = common::random_tensor(&[9, 1, 10], DType::F32, 701, 0.0, &dev);
        let fwd = RopeOptions { layout, positions: Positions::Offset(3), freqs: Freqs::Computed { base: 500.0 } };
        rope(&mut q, &mut kk, &fwd).unwrap();
        let moved = q.to_vec_f64().unwrap();
        assert!(common::rel_err(&moved, &qv) > 0.1, "{layout:?}: the rotation must change q");
        let neg: Vec<f64> = (0..9).map(|t| -(3.0 + t as f64)).collect();
        let neg = Tensor::from_f64(&neg, &[9], DType::I64, &dev).unwrap();
        let back = RopeOptions { layout, positions: Positions::Tensor(&neg), freqs: Freqs::Computed { base: 500.0 } };
        rope(&mut q, &mut kk, &back).unwrap();
        assert!(common::rel_err(&q.to_vec_f64().unwrap(), &qv) < 1e-5, "{layout:?}");
        assert!(common::rel_err(&kk.to_vec_f64().unwrap(), &kv) < 1e-5, "{layout:?}");
    }
}

#[test]
fn argument_errors() {
    let dev = Device::best();
    let t = |shape: &[usize], dt: DType| Tensor::zeros(shape, dt, &dev).unwrap();
    let f32s = DType::F32;
    let def = RopeOptions::default();
    let msg = |q: &mut Tensor, k: &mut Tensor, o: &RopeOptions| -> String {
        match rope(q, k, o) {
            Ok(()) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    };
    let has = |m: String, want: &str| assert!(m.contains(want), "`{m}` should mention `{want}`");
    // shapes
    has(msg(&mut t(&[4, 8], f32s), &mut t(&[4, 8], f32s), &def), "must be [B, S, H, D] or [T, H, D]");
    has(msg(&mut t(&[4, 2, 8], f32s), &mut t(&[1, 4, 2, 8], f32s), &def), "same rank");
    has(msg(&mut t(&[4, 2, 8], f32s), &mut t(&[5, 2, 8], f32s), &def), "same tokens");
    has(msg(&mut t(&[2, 3, 2, 8], f32s), &mut t(&[3, 2, 2, 8], f32s), &def), "same tokens");
    has(msg(&mut t(&[4, 2, 8], f32s), &mut t(&[4, 2, 6], f32s), &def), "same head dimension");
    has(msg(&mut t(&[4, 2, 7], f32s), &mut t(&[4, 2, 7], f32s), &def), "must be even");
    // dtypes, strides, aliasing
    assert!(matches!(rope(&mut t(&[4, 2, 8], f32s), &mut t(&[4, 2, 8], DType::BF16), &def), Err(Error::DTypeMismatch(_))));
    assert!(matches!(rope(&mut t(&[4, 2, 8], DType::I64), &mut t(&[4, 2, 8], DType::I64), &def), Err(Error::DTypeMismatch(_))));
    // a strided q is rotated where it lies (tests/strided_ops.rs checks the values)
    let big = t(&[8, 2, 4], f32s);
    let mut strided = big.permute(&[2, 1, 0]).unwrap(); // [4, 2, 8], not contiguous
    assert!(rope(&mut strided, &mut t(&[4, 2, 8], f32s), &def).is_ok());
    let both = t(&[2, 4, 2, 8], f32s);
    let (mut a, mut b) = (both.narrow(0, 0, 1).unwrap(), both.narrow(0, 1, 1).unwrap());
    assert!(matches!(rope(&mut a, &mut b, &def), Err(Error::Aliasing(_))));
    // positions
    let (mut q, mut k) = (t(&[2, 3, 2, 8], f32s), t(&[2, 3, 1, 8], f32s));
    let pf = t(&[6], f32s);
    let o = RopeOptions { positions: Positions::Tensor(&pf), ..def };
    has(msg(&mut q, &mut k, &o), "positions must be i64");
    let p5 = t(&[5], DType::I64);
    let o = RopeOptions { positions: Positions::Tensor(&p5), ..def };
    has(msg(&mut q, &mut k, &o), "positions must have shape [6] or [2, 3]");
    // angles
    let o = RopeOptions { freqs: Freqs::Computed { base: 0.0 }, ..def };
    has(msg(&mut q, &mut k, &o), "base must be positive");
    let o = RopeOptions { freqs: Freqs::Computed { base: f32::NAN }, ..def };
    has(msg(&mut q, &mut k, &o), "base must be positive");
    let (c8, s8, c4) = (t(&[10, 4], f32s), t(&[10, 4], f32s), t(&[10, 8], f32s));
    let o = RopeOptions { freqs: Freqs::Table { cos: &c4, sin: &c4 }, ..def };
    has(msg(&mut q, &mut k, &o), "must both be [P, 4]");
    let o = RopeOptions { freqs: Freqs::Table { cos: &c8, sin: &t(&[11, 4], f32s) }, ..def };
    has(msg(&mut q, &mut k, &o), "must both be [P, 4]");
    let o = RopeOptions { freqs: Freqs::Table { cos: &c8, sin: &t(&[10, 4], DType::F16) }, ..def };
    assert!(matches!(rope(&mut q, &mut k, &o), Err(Error::DTypeMismatch(_))));
    let o = RopeOptions { positions: Positions::Offset(8), freqs: Freqs::Table { cos: &c8, sin: &s8 }, ..def };
    has(msg(&mut q, &mut k, &o), "positions 8..11 run outside the 10 rows");
    let o = RopeOptions { positions: Positions::Offset(-1), freqs: Freqs::Table { cos: &c8, sin: &s8 }, ..def };
    has(msg(&mut q, &mut k, &o), "outside");
    // the failed calls wrote nothing; the last offset that fits is accepted
    let (mut q, mut k) = (Tensor::full(&[2, 3, 2, 8], 1.0, f32s, &dev).unwrap(), t(&[2, 3, 1, 8], f32s));
    let o = RopeOptions { positions: Positions::Offset(8), freqs: Freqs::Table { cos: &c8, sin: &s8 }, ..def };
    assert!(rope(&mut q, &mut k, &o).is_err());
    assert!(q.to_vec_f64().unwrap().iter().all(|&v| v == 1.0));
    let o = RopeOptions { positions: Positions::Offset(7), freqs: Freqs::Table { cos: &c8, sin: &s8 }, ..def };
    rope(&mut q, &mut k, &o).unwrap();
    // empty: no tokens
    rope(&mut t(&[0, 2, 8], f32s), &mut t(&[0, 1, 8], f32s), &def).unwrap();
}

// -----------------------------------------------------------------------------------
// Generated code.

fn defs() -> [(&'static str, &'static KernelDef); 4] {
    [
        ("rope_offset", &k::rope_offset::DEF),
        ("rope_pos", &k::rope_pos::DEF),
        ("rope_table_offset", &k::rope_table_offset::DEF),
        ("rope_table_pos", &k::rope_table_pos::DEF),
    ]
}

/// A Llama-like specialization: 4096 tokens, 32 query and 8 key heads of 128, 4096
/// table rows, 16-byte aligned; the head strides of `layout` (`[.., 2, 64]` with unit
/// stride on the last dim for half-split, on the pair dim for interleaved).
fn rope_spec(kernel: &Kernel, def: &KernelDef, layout: RopeLayout) -> Spec {
    let size = |s: &str| match s {
        "NT" | "P" => 4096,
        "HQ" => 32,
        "HK" => 8,
        "R" => 2,
        "DH" => 64,
        other => panic!("unexpected shape symbol {other}"),
    };
    let tensors = def
        .params
        .iter()
        .map(|p| match p {
            ParamSig::Tensor { name, .. } => Some(TensorSpec {
                ptr_align: 16,
                stride_div: match (*name, layout) {
                    ("q" | "k", RopeLayout::HalfSplit) => vec![16, 16, 16, 0],
                    ("q" | "k", RopeLayout::Interleaved) => vec![16, 16, 0, 2],
                    ("pos", _) => vec![0],
                    _ => vec![16, 0],
                },
            }),
            ParamSig::Scalar { .. } => None,
        })
        .collect();
    Spec { tensors, shape_pow2: kernel.shape_syms.iter().map(|s| size(s)).collect(), shape_div: vec![], tiles: Default::default(), threads: None, min_blocks: None, grouped: false, register_attempt: 0, ..Spec::default() }
}

/// The dtype lists to build each kernel for: `[T]`, or `[T, C]` with f32 tables and
/// (when `all_tables`) tables of `T` too.
fn dtype_sets(def: &KernelDef, all_tables: bool) -> Vec<Vec<DType>> {
    let mut out = Vec::new();
    for dt in common::DTYPES {
        if def.generics.len() == 1 {
            out.push(vec![dt]);
        } else {
            out.push(vec![dt, DType::F32]);
            if all_tables && dt != DType::F32 {
                out.push(vec![dt, dt]);
            }
        }
    }
    out
}

fn layout_name(l: RopeLayout) -> &'static str {
    match l {
        RopeLayout::HalfSplit => "half",
        RopeLayout::Interleaved => "interleaved",
    }
}

#[test]
fn cuda_snapshots() {
    for (name, def) in defs() {
        for dts in dtype_sets(def, false) {
            let kernel = (def.build)(&dts).unwrap();
            let dt = dts[0];
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                let spec = rope_spec(&kernel, def, layout);
                for (arch, target) in [("sm80", Target::sm80()), ("sm90a", Target::sm90a())] {
                    // interleaved: one dtype and arch (the strides are what changes)
                    if layout == RopeLayout::Interleaved && (dt != DType::BF16 || arch != "sm90a") {
                        continue;
                    }
                    let e = compile(&kernel, &spec, &target).unwrap_or_else(|e| panic!("{name} {dt} {arch}: {e}"));
                    let l = layout_name(layout);
                    insta::assert_snapshot!(format!("{name}_{l}_{dt}_{arch}"), e.source);
                    if arch == "sm90a" && dt == DType::BF16 {
                        insta::assert_snapshot!(format!("{name}_{l}_{dt}_ir"), e.ir);
                    }
                }
            }
        }
    }
}

/// What the writer must do for RoPE, without pinning the text.
#[test]
fn structure() {
    let bf16 = DType::BF16;
    let kernel = (k::rope_offset::DEF.build)(&[bf16]).unwrap();
    let half = compile(&kernel, &rope_spec(&kernel, &k::rope_offset::DEF, RopeLayout::HalfSplit), &Target::sm90a()).unwrap();
    assert!(half.source.contains("sinf(") && half.source.contains("cosf("), "computed angles use sinf/cosf");
    assert!(half.ir.contains("= iota DH!"), "{}", half.ir);
    // half-split heads: both halves are unit-stride rows, loaded and stored as vectors
    assert!(half.source.contains("reinterpret_cast<const kf_v16*>"), "half-split loads 16-byte vectors");
    assert!(half.source.contains("*reinterpret_cast<kf_v16*>"), "half-split stores 16-byte vectors");
    assert_eq!(half.grid.len(), 1, "one program per token");
    // interleaved heads: the halves are stride-2 columns: no vector accesses of q or k
    let inter = compile(&kernel, &rope_spec(&kernel, &k::rope_offset::DEF, RopeLayout::Interleaved), &Target::sm90a()).unwrap();
    let vectors: Vec<&str> = inter.ir.lines().filter(|l| l.contains("vector=")).collect();
    assert!(!vectors.is_empty() && vectors.iter().all(|l| l.ends_with("vector=1")), "{vectors:?}");
    // the tables are read by row: vectors there too
    let kernel = (k::rope_table_pos::DEF.build)(&[bf16, DType::F32]).unwrap();
    let e = compile(&kernel, &rope_spec(&kernel, &k::rope_table_pos::DEF, RopeLayout::HalfSplit), &Target::sm80()).unwrap();
    assert!(!e.source.contains("sinf("), "tables need no trigonometry");
    assert!(e.source.contains("const long long* "), "the positions are read as i64");
}

#[test]
fn every_rope_kernel_compiles_without_spills() {
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    let mut checked = 0;
    for (name, def) in defs() {
        for dts in dtype_sets(def, true) {
            let kernel = (def.build)(&dts).unwrap();
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                let spec = rope_spec(&kernel, def, layout);
                for target in [Target::sm80(), Target::sm90a()] {
                    let e = compile(&kernel, &spec, &target).unwrap();
                    let tag = format!("{name}_{}_{}", layout_name(layout), dts.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("_"));
                    match common::assemble(&e.source, &e.arch, &e.options, &tag) {
                        Ok((regs, 0)) => {
                            assert!(regs > 0);
                            rows.push(format!("{tag} {}: {regs} registers", e.arch));
                        }
                        Ok((regs, spill)) => failures.push(format!("{tag} {}: {spill} bytes of spills ({regs} registers)", e.arch)),
                        Err(err) => failures.push(format!("{tag} {}: {err}", e.arch)),
                    }
                    checked += 1;
                }
            }
        }
    }
    println!("{}", rows.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // 2 computed kernels × 3 dtypes + 2 table kernels × 5 dtype pairs, × 2 layouts × 2 archs
    assert_eq!(checked, (2 * 3 + 2 * 5) * 2 * 2);
}

//! The interpreter with the GPU plan's tiles (or any tiles given), so that a test can
//! compare the interpreter and the GPU on the same program (issue 20, item 10):
//! `kfuse::runtime::launch_interpreter` runs a kernel with tiles by name,
//! `kfuse::runtime::gpu_plan_tiles` gives the tiles a GPU launch would use for a target,
//! and `KFUSE_TILES` reaches interpreter launches as it does GPU ones. Runs in CI (no
//! GPU): the plans are made for `Target::sm90a()` without one.

mod common;

use std::collections::BTreeMap;

use kfuse::codegen::Target;
use kfuse::prelude::*;
use kfuse::runtime::{gpu_plan_tiles, launch_interpreter, launch_spec, spec_for, Arg};
use kfuse::{Backend, DType, Error};

/// `out[i] = 1000 * (i / BN) + i % BN`: the block and the lane of each element, so the
/// output shows the tile size that ran.
#[kfuse]
pub fn block_marks(out: &mut Tensor<f32, (N,)>) {
    let i = program_id(0);
    out.block([i * BN], [BN]).store((iota(BN) + i * 1000).to_f32());
}

/// Per row, the sum of its elements and the number of `BN`-wide chunks the loop over it
/// took: the count shows the chunk width that ran.
#[kfuse]
pub fn row_chunks(x: Tensor<f32, (M, N)>, sums: &mut Tensor<f32, (M,)>, chunks: &mut Tensor<f32, (M,)>) {
    let r = program_id(0);
    let mut s = 0.0f32;
    let mut c = 0.0f32;
    for j in (0..N).step_by(BN) {
        s = s + x.block([r, j], [_, BN]).load().sum();
        c = c + 1.0;
    }
    sums.block([r], [_]).store(s);
    chunks.block([r], [_]).store(c);
}

fn cpu() -> Device {
    Device::cpu()
}

fn tiles(entries: &[(&str, u32)]) -> BTreeMap<String, u32> {
    entries.iter().map(|&(n, v)| (n.to_string(), v)).collect()
}

/// `n` values in `[-1, 1)` from a fixed seed.
fn random(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// A CPU tensor of random values and the values it holds (rounded to `dt`).
fn random_tensor(shape: &[usize], dt: DType, seed: u64) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_f64(&random(shape.iter().product(), seed), shape, dt, &cpu()).unwrap();
    let v = t.to_vec_f64().unwrap();
    (t, v)
}

fn nan_tensor(shape: &[usize], dt: DType) -> Tensor {
    Tensor::full(shape, f64::NAN, dt, &cpu()).unwrap()
}

fn marks(n: usize, tile: usize) -> Vec<f64> {
    (0..n).map(|i| (1000 * (i / tile) + i % tile) as f64).collect()
}

/// Largest `|got - want| / (|want| + floor)`.
fn max_err(got: &[f64], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(g, w)| if g.is_nan() { f64::INFINITY } else { (g - w).abs() / (w.abs() + floor) }).fold(0.0, f64::max)
}

/// The scheduled IR `kfuse::codegen::compile` prints for the spec a GPU launch on `args`
/// builds for `target` (`launch_spec`): `spec_for`'s facts — those of the padded copies
/// for matrix operands TMA cannot read as they lie, which the launch makes — plus the
/// tiles codegen takes from the exact shape.
fn compiled_ir(def: &kfuse::ir::KernelDef, dtypes: &[DType], args: &[Arg<'_>], target: &Target) -> String {
    let k = (def.build)(dtypes).unwrap();
    let spec = launch_spec(def, args, target).unwrap();
    let own = spec_for(&k, args).unwrap();
    assert_eq!((&spec.shape_pow2, &spec.shape_div), (&own.shape_pow2, &own.shape_div));
    let e = kfuse::codegen::compile(&k, &spec, target).unwrap();
    let printed = printed_tiles(&e.ir);
    assert_eq!(printed, e.tiles, "the printed tiles are the emitted kernel's");
    assert_eq!(printed.len(), k.tile_syms.len(), "every tile symbol is printed:\n{}", e.ir);
    e.ir
}

/// The tile lines (`  tile BM = 128`) of a printed IR.
fn printed_tiles(ir: &str) -> BTreeMap<String, u32> {
    ir.lines()
        .filter_map(|l| l.trim().strip_prefix("tile "))
        .filter_map(|l| l.split_once(" = "))
        .map(|(n, v)| (n.to_string(), v.trim().parse().unwrap()))
        .collect()
}

/// (a) The interpreter runs with the tiles given, not its default 16: the blocks of
/// `block_marks` and the chunks of `row_chunks`' loop follow them.
#[test]
fn the_interpreter_runs_with_the_tiles_given() {
    let n = 200;
    // no tiles: the default, 16 (and `KFUSE_TILES` is not consulted)
    let mut out = nan_tensor(&[n], DType::F32);
    let l = launch_interpreter(&block_marks::DEF, &mut [Arg::Out(&mut out)], &BTreeMap::new()).unwrap();
    assert_eq!(l.backend, Backend::Interpreter);
    assert_eq!(out.to_vec_f64().unwrap(), marks(n, 16));
    // BN = 64, and any positive size on the interpreter
    for tile in [64, 5] {
        let mut out = nan_tensor(&[n], DType::F32);
        launch_interpreter(&block_marks::DEF, &mut [Arg::Out(&mut out)], &tiles(&[("BN", tile)])).unwrap();
        assert_eq!(out.to_vec_f64().unwrap(), marks(n, tile as usize), "BN = {tile}");
    }
    // names that are no tile symbol of the kernel are ignored, as on the GPU
    let mut out = nan_tensor(&[n], DType::F32);
    launch_interpreter(&block_marks::DEF, &mut [Arg::Out(&mut out)], &tiles(&[("BM", 0), ("SPLITK", 4), ("BN", 32)])).unwrap();
    assert_eq!(out.to_vec_f64().unwrap(), marks(n, 32));

    // a row walked in chunks of BN: 13 chunks of 16, 4 of 64, one of 256; same sums
    let (m, n) = (3, 200);
    let (x, xv) = random_tensor(&[m, n], DType::F32, 1);
    let want: Vec<f64> = xv.chunks(n).map(|r| r.iter().sum()).collect();
    for (tile, count) in [(None, 13.0), (Some(64), 4.0), (Some(256), 1.0)] {
        let t = tile.map_or_else(BTreeMap::new, |v| tiles(&[("BN", v)]));
        let (mut sums, mut chunks) = (nan_tensor(&[m], DType::F32), nan_tensor(&[m], DType::F32));
        launch_interpreter(&row_chunks::DEF, &mut [Arg::In(&x), Arg::Out(&mut sums), Arg::Out(&mut chunks)], &t).unwrap();
        assert_eq!(chunks.to_vec_f64().unwrap(), vec![count; m], "BN = {tile:?}");
        let e = max_err(&sums.to_vec_f64().unwrap(), &want, 1.0);
        assert!(e < 1e-5, "row sums with BN = {tile:?}: error {e:.2e}");
    }

    // errors are results: a tile of 0, arguments the checks refuse
    let mut out = nan_tensor(&[n], DType::F32);
    let e = launch_interpreter(&block_marks::DEF, &mut [Arg::Out(&mut out)], &tiles(&[("BN", 0)])).unwrap_err();
    assert!(matches!(e, Error::Ir(_)) && e.to_string().contains("tile symbol `BN` has size 0"), "{e}");
    let e = launch_interpreter(&row_chunks::DEF, &mut [Arg::Out(&mut out)], &BTreeMap::new()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}

/// (b) `gpu_plan_tiles` for sm_90a gives the tiles `kfuse::codegen::compile` prints in
/// the scheduled IR for the launch's spec — of row kernels and of a GEMM — and the
/// interpreter run with them gives the float64 answer.
#[test]
fn gpu_plan_tiles_are_the_compiled_ones_and_the_interpreter_runs_them() {
    let target = Target::sm90a();

    // a row-chunked loop
    let (m, n) = (5, 3000);
    let (x, xv) = random_tensor(&[m, n], DType::F32, 2);
    let (mut sums, mut chunks) = (nan_tensor(&[m], DType::F32), nan_tensor(&[m], DType::F32));
    let mut args = [Arg::In(&x), Arg::Out(&mut sums), Arg::Out(&mut chunks)];
    let plan = gpu_plan_tiles(&row_chunks::DEF, &args, &target).unwrap();
    assert_eq!(plan, printed_tiles(&compiled_ir(&row_chunks::DEF, &[], &args, &target)));
    let bn = plan["BN"];
    assert_ne!(bn, 16, "the plan's chunk is not the interpreter's default");
    launch_interpreter(&row_chunks::DEF, &mut args, &plan).unwrap();
    assert_eq!(chunks.to_vec_f64().unwrap(), vec![n.div_ceil(bn as usize) as f64; m], "chunks of BN = {bn}");
    let want: Vec<f64> = xv.chunks(n).map(|r| r.iter().sum()).collect();
    let e = max_err(&sums.to_vec_f64().unwrap(), &want, 1.0);
    assert!(e < 1e-5, "row sums with the sm_90a plan {plan:?}: error {e:.2e}");

    // a row kernel of the standard library (softmax: BM rows a block)
    let (m, n) = (37, 300);
    let (x, xv) = random_tensor(&[m, n], DType::F32, 3);
    let mut out = nan_tensor(&[m, n], DType::F32);
    let mut args = [Arg::In(&x), Arg::Out(&mut out)];
    let plan = gpu_plan_tiles(&kfuse::ops::kernels::softmax::DEF, &args, &target).unwrap();
    assert_eq!(plan, printed_tiles(&compiled_ir(&kfuse::ops::kernels::softmax::DEF, &[DType::F32], &args, &target)));
    launch_interpreter(&kfuse::ops::kernels::softmax::DEF, &mut args, &plan).unwrap();
    let want: Vec<f64> = xv
        .chunks(n)
        .flat_map(|r| {
            let mx = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = r.iter().map(|v| (v - mx).exp()).sum();
            r.iter().map(move |v| (v - mx).exp() / s).collect::<Vec<_>>()
        })
        .collect();
    let e = max_err(&out.to_vec_f64().unwrap(), &want, 1e-3);
    assert!(e < 1e-5, "softmax with the sm_90a plan {plan:?}: error {e:.2e}");

    // bf16 GEMMs: rows of 16-byte multiples take the sm_90a matrix path (WGMMA, TMA)
    // as they lie; odd ones too, on the padded copies a GPU launch makes of its operands
    // (the interpreter reads them as they lie); tiles far from 16, partial ones everywhere
    let gemm = &kfuse::ops::kernels::gemm::DEF;
    // (on sm_90a the general lowering takes a plain bf16 product, on the matrix tiles)
    for (m, n, k) in [(200, 272, 136), (100, 150, 50)] {
        let (a, av) = random_tensor(&[m, k], DType::BF16, 4);
        let (b, bv) = random_tensor(&[k, n], DType::BF16, 5);
        let mut c = nan_tensor(&[m, n], DType::BF16);
        let mut args = [Arg::In(&a), Arg::In(&b), Arg::Out(&mut c)];
        let plan = gpu_plan_tiles(gemm, &args, &target).unwrap();
        let ir = compiled_ir(gemm, &[DType::BF16], &args, &target);
        assert_eq!(plan, printed_tiles(&ir), "{m}x{n}x{k}");
        assert!(ir.contains(kfuse::codegen::passes::select_mma_path::GENERAL_TAKES), "{m}x{n}x{k}: the general lowering\n{ir}");
        assert!(["BM", "BN", "BK"].iter().all(|t| plan[*t] >= 16) && plan.values().any(|&v| v > 16), "{plan:?}");
        let l = launch_interpreter(gemm, &mut args, &plan).unwrap();
        assert_eq!(l.backend, Backend::Interpreter);
        let want: Vec<f64> = (0..m * n).map(|x| (0..k).map(|q| av[(x / n) * k + q] * bv[q * n + x % n]).sum()).collect();
        // f64 products and sum, rounded to f32, then to bf16
        let e = max_err(&c.to_vec_f64().unwrap(), &want, 1e-2);
        assert!(e < 1.0 / 128.0, "gemm {m}x{n}x{k} with the sm_90a plan {plan:?}: error {e:.2e}");
    }
}

/// `gpu_plan_tiles` uses the launch's own spec, as the launch would compile it: a bf16
/// GEMM of M8192 x N14336 gets the general lowering's 128x256 tiles on sm_90a (the
/// matrix path's template would take the exact-shape 128x320: `tests/gemm_codegen.rs`).
/// Nothing runs; the output is allocated, never written.
#[test]
fn gpu_plan_tiles_are_the_launch_tiles() {
    let target = Target::sm90a();
    let (m, n, k) = (8192, 14336, 64);
    let a = Tensor::empty(&[m, k], DType::BF16, &cpu()).unwrap();
    let b = Tensor::empty(&[k, n], DType::BF16, &cpu()).unwrap();
    let mut c = Tensor::empty(&[m, n], DType::BF16, &cpu()).unwrap();
    let args = [Arg::In(&a), Arg::In(&b), Arg::Out(&mut c)];
    let gemm = &kfuse::ops::kernels::gemm::DEF;
    let plan = gpu_plan_tiles(gemm, &args, &target).unwrap();
    assert_eq!(plan, printed_tiles(&compiled_ir(gemm, &[DType::BF16], &args, &target)));
    assert_eq!((plan["BM"], plan["BN"]), (128, 256), "{plan:?}");
    // errors are results: a target below sm_80, arguments the checks refuse
    let old = Target { sm: 75, ..Target::sm80() };
    assert!(matches!(gpu_plan_tiles(gemm, &args, &old), Err(Error::Codegen(_))));
    assert!(matches!(gpu_plan_tiles(gemm, &args[..2], &target), Err(Error::InvalidArgument(_))));
}

/// (c) `KFUSE_TILES` reaches interpreter launches (`launch`, what a `#[kfuse]` function
/// calls) and `gpu_plan_tiles`. The settings are read once a process, and tests must not
/// change the environment of a process whose other tests read it: each setting runs in a
/// child process of this test binary, with its own environment (`common::isolation`).
#[test]
fn kfuse_tiles_reaches_interpreter_launches() {
    for (tiles, expect) in [("BN=64", "ok 64"), ("BN=128,BM=2", "ok 128"), ("BN=96", "refused")] {
        let stdout = common::isolation::run_alone("kfuse_tiles_child", &[("KFUSE_TILES", Some(tiles.as_ref()))]);
        // (the test harness may print the test's name on the same line)
        let line = stdout.lines().find_map(|l| l.split_once("kfuse-tiles-child: ")).map(|(_, r)| r.trim());
        assert_eq!(line, Some(expect), "KFUSE_TILES={tiles}:\n{stdout}");
    }
}

/// The child of `kfuse_tiles_reaches_interpreter_launches`; does nothing in a normal run.
/// Launches `block_marks` on the CPU and prints the tile size it ran with (`ok BN`), or
/// `refused` when `KFUSE_TILES` does not parse and the launch says so.
#[test]
fn kfuse_tiles_child() {
    if !common::isolation::is_alone("kfuse_tiles_child") {
        return;
    }
    let n = 300;
    let mut out = nan_tensor(&[n], DType::F32);
    match block_marks(&mut out) {
        Ok(l) => {
            assert_eq!(l.backend, Backend::Interpreter);
            let got = out.to_vec_f64().unwrap();
            let tile = (1..=n).find(|&t| got == marks(n, t)).unwrap_or_else(|| panic!("no tile size gives {got:?}"));
            // the GPU plan sees the same setting
            let x = Tensor::zeros(&[2, 1000], DType::F32, &cpu()).unwrap();
            let (mut s, mut c) = (nan_tensor(&[2], DType::F32), nan_tensor(&[2], DType::F32));
            let plan = gpu_plan_tiles(&row_chunks::DEF, &[Arg::In(&x), Arg::Out(&mut s), Arg::Out(&mut c)], &Target::sm90a()).unwrap();
            assert_eq!(plan["BN"] as usize, tile, "{plan:?}");
            println!("kfuse-tiles-child: ok {tile}");
        }
        Err(e) => {
            assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("KFUSE_TILES"), "{e}");
            println!("kfuse-tiles-child: refused");
        }
    }
}

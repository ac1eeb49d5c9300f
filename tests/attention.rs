//! Flash attention forward written in `#[kfuse]`, as a user would: a loop over KV tiles,
//! `s = dot(q, k.t()) * scale`, a running row maximum `m` and sum `l`, `p = exp(s − m)`,
//! `acc = acc · exp(m_old − m_new) + dot(p, v)`, a causal mask from `iota` comparisons
//! (aligned to the bottom right, as FlashAttention does), `o = acc / l` and the
//! log-sum-exp stored beside it. Q, K, V and O are `[B, S, H, D]`.
//!
//! It runs on the best device there is (the interpreter in CI, the GPU on the GPU host)
//! into NaN-poisoned outputs against a float64 reference, with odd shapes (Sq ≠ Skv, D 64
//! and 128) and fixed seeds; and it compiles for sm_80 and sm_90a without a GPU.

mod common;

use kfuse::codegen::Target;
use kfuse::prelude::*;
use kfuse::DType;

#[path = "kernels/flash_attention.rs"]
mod kernel;
use kernel::flash_attention;

fn dev() -> Device {
    Device::best()
}

/// Float64 attention: (O `[B, SQ, H, D]`, LSE `[B, H, SQ]`).
fn reference(q: &[f64], k: &[f64], v: &[f64], dims: (usize, usize, usize, usize, usize), scale: f64, causal: bool) -> (Vec<f64>, Vec<f64>) {
    let (b, sq, sk, h, d) = dims;
    let mut o = vec![0.0; b * sq * h * d];
    let mut lse = vec![0.0; b * h * sq];
    for bb in 0..b {
        for hh in 0..h {
            for r in 0..sq {
                let qi = |x: usize| q[((bb * sq + r) * h + hh) * d + x];
                let live = |c: usize| !causal || c + sq <= r + sk;
                let s: Vec<f64> = (0..sk)
                    .map(|c| if live(c) { (0..d).map(|x| qi(x) * k[((bb * sk + c) * h + hh) * d + x]).sum::<f64>() * scale } else { f64::NEG_INFINITY })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                for x in 0..d {
                    o[((bb * sq + r) * h + hh) * d + x] = (0..sk).map(|c| (s[c] - mx).exp() / z * v[((bb * sk + c) * h + hh) * d + x]).sum();
                }
                lse[(bb * h + hh) * sq + r] = mx + z.ln();
            }
        }
    }
    (o, lse)
}

fn run_case(dt: DType, dims: (usize, usize, usize, usize, usize), causal: bool, seed: u64) -> Result<(), String> {
    let (b, sq, sk, h, d) = dims;
    let (q, qv) = common::random_tensor(&[b, sq, h, d], dt, seed, 0.0, &dev());
    let (k, kv) = common::random_tensor(&[b, sk, h, d], dt, seed + 1, 0.0, &dev());
    let (v, vv) = common::random_tensor(&[b, sk, h, d], dt, seed + 2, 0.0, &dev());
    let mut o = common::poisoned(&[b, sq, h, d], dt, &dev());
    let mut lse = common::poisoned(&[b, h, sq], DType::F32, &dev());
    let scale = 1.0 / (d as f64).sqrt();
    flash_attention(&q, &k, &v, &mut o, &mut lse, scale as f32, causal as i64).map_err(|e| e.to_string())?;
    let (want_o, want_lse) = reference(&qv, &kv, &vv, dims, scale, causal);
    let what = format!("{dt} B{b} Sq{sq} Skv{sk} H{h} D{d} causal={causal} seed {seed} on {}", dev().describe());
    let eo = common::rel_err(&o.to_vec_f64().unwrap(), &want_o);
    let el = common::rel_err(&lse.to_vec_f64().unwrap(), &want_lse);
    // P is rounded to the input dtype before P·V, as FlashAttention does
    let tol = common::tolerance(dt).max(2e-5);
    if eo > tol || el > 1e-4 {
        return Err(format!("{what}: O relative error {eo:.3e} (bound {tol:.0e}), LSE {el:.3e} (bound 1e-4)"));
    }
    Ok(())
}

#[test]
fn attention_against_float64() {
    let mut failures = Vec::new();
    // the last case runs both loops of most blocks many iterations (a warp-specialized
    // kernel's warpgroups hand turns across the two loops)
    let cases = [(1, 1, 1, 1, 64), (2, 17, 17, 3, 64), (1, 100, 130, 2, 64), (2, 33, 200, 1, 128), (1, 130, 130, 2, 128), (1, 1000, 1030, 2, 128)];
    for (n, &dims) in cases.iter().enumerate() {
        for causal in [false, true] {
            for dt in [DType::BF16, DType::F16] {
                if let Err(e) = run_case(dt, dims, causal, 900 + 10 * n as u64) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The kernel compiles for sm_80 and sm_90a (NVRTC, `ptxas -v`) without spills, bf16 and
/// f16, at B4 S4096 H16 D128, its dots on the tensor cores as the plan says (`wgmma` on
/// sm_90a, its rings filled by a producer warpgroup; `mma.sync` on sm_80).
#[test]
fn attention_compiles_for_sm80_and_sm90a() {
    let mut spec = common::snapshot_spec(&flash_attention::DEF);
    spec.shape_pow2 = vec![4, 4096, 16, 128, 4096]; // B, SQ, H, D, SK
    let mut failures = Vec::new();
    for dt in [DType::BF16, DType::F16] {
        let k = (flash_attention::DEF.build)(&[dt]).unwrap();
        for target in [Target::sm80(), Target::sm90a()] {
            let name = format!("flash_attention_{dt}");
            match common::compile_assembled(&k, &spec, &target, &name) {
                Ok((_, regs, spill)) if spill > 0 => failures.push(format!("{name} {}: {spill} bytes of spills ({regs} registers)", target.arch())),
                Ok((e, _, _)) if target.sm >= 90 && !e.plan.to_string().contains("rings filled by a producer warpgroup") => {
                    failures.push(format!("{name} {}: the rings are not warp-specialized:\n{}", target.arch(), e.plan))
                }
                // its loops' bounds follow the program id (the diagonal): one block a
                // program, which the hardware balances, not a fixed walk
                Ok((e, _, _)) if e.persistent.is_some() => failures.push(format!("{name} {}: a persistent walk over programs of unequal length", target.arch())),
                Ok((e, _, _)) if !e.plan.to_string().contains(if target.sm >= 90 { "wgmma m64n128k16" } else { "mma.sync m16n8k16" }) => {
                    failures.push(format!("{name} {}: the plan names no dot on the tensor cores:\n{}", target.arch(), e.plan))
                }
                Ok((e, regs, spill)) => eprintln!("{name} {}: {regs} registers, {spill} bytes of spills\n{}", target.arch(), e.ir.lines().filter(|l| l.contains("tile ") || l.contains("dots")).collect::<Vec<_>>().join("\n")),
                Err(e) => failures.push(format!("{name} {}: {}", target.arch(), e.0)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// What the compiler emits for the proof kernel at B4 S4096 H16 D128 bf16, pinned: the
/// scheduled IR and the CUDA for sm_90a (warp-specialized rings, turn-taking, the
/// deferred P·V wait) and for sm_80 (`mma.sync`, staged operands). A change of either is
/// reviewed with the snapshot (`cargo insta review`); the GPU tests and the benchmark
/// say whether it is still right and fast.
#[test]
fn attention_snapshots() {
    let mut spec = common::snapshot_spec(&flash_attention::DEF);
    spec.shape_pow2 = vec![4, 4096, 16, 128, 4096]; // B, SQ, H, D, SK
    let k = (flash_attention::DEF.build)(&[DType::BF16]).unwrap();
    for (target, name) in [(Target::sm90a(), "sm90a"), (Target::sm80(), "sm80")] {
        let e = kfuse::codegen::compile(&k, &spec, &target).unwrap();
        insta::assert_snapshot!(format!("flash_attention_bf16_{name}_ir"), e.ir);
        insta::assert_snapshot!(format!("flash_attention_bf16_{name}"), e.source);
    }
}

/// At D = 256 the 128-row, 128-key tiles of the warpgroup rule would hold more `dot`
/// results a thread than it allows (`choose_tiles` tries 128 × 64, which fits): the
/// kernel compiles for sm_90a without spills, its dots on `wgmma`.
#[test]
fn attention_at_d256_compiles_for_sm90a() {
    let mut spec = common::snapshot_spec(&flash_attention::DEF);
    spec.shape_pow2 = vec![4, 4096, 16, 256, 4096]; // B, SQ, H, D, SK
    let k = (flash_attention::DEF.build)(&[DType::BF16]).unwrap();
    match common::compile_assembled(&k, &spec, &Target::sm90a(), "flash_attention_d256") {
        Ok((e, regs, spill)) => {
            assert_eq!(spill, 0, "{spill} bytes of spills ({regs} registers)");
            assert!(e.plan.to_string().contains("wgmma m64n64k16"), "D = 256 is not on wgmma with 64-key tiles:\n{}", e.plan);
        }
        Err(e) => panic!("D = 256 refused on sm_90a: {}", e.0),
    }
}

//! `kfuse::ops::attention` against a float64 reference: causal and not (aligned to the
//! bottom right when Sq ≠ Skv), sliding windows, grouped- and multi-query heads, both
//! layouts, D of 64, 80, 96, 128 and 256, rows that see no key (zero output, log-sum-exp
//! −∞). On the best device there is (the interpreter in CI, the GPU on the GPU host),
//! through the API and through the kernel's launcher into NaN-poisoned outputs; fixed
//! seeds. `attention_varlen` on packed sequences of different lengths. Bad input is an
//! error, not a launch.

mod common;

use kfuse::ops::{AttentionLayout, AttentionOptions};
use kfuse::prelude::*;
use kfuse::DType;

/// `(B, Sq, Skv, Hq, Hkv, D)`.
type Dims = (usize, usize, usize, usize, usize, usize);

/// Float64 attention on `[B, S, H, D]` values: (O `[B, Sq, Hq, D]`, LSE `[B, Hq, Sq]`).
fn reference(q: &[f64], k: &[f64], v: &[f64], dims: Dims, scale: f64, opts: &AttentionOptions) -> (Vec<f64>, Vec<f64>) {
    let (b, sq, sk, hq, hk, d) = dims;
    let (left, right) = opts.window.map_or((i64::MAX / 2, i64::MAX / 2), |(l, r)| (l as i64, r as i64));
    let right = if opts.causal { 0 } else { right };
    let mut o = vec![0.0; b * sq * hq * d];
    let mut lse = vec![f64::NEG_INFINITY; b * hq * sq];
    for bb in 0..b {
        for h in 0..hq {
            let g = h / (hq / hk);
            for r in 0..sq {
                let diag = (r + sk) as i64 - sq as i64;
                let live: Vec<usize> = (0..sk).filter(|&c| (c as i64) >= diag - left && (c as i64) <= diag + right).collect();
                if live.is_empty() {
                    continue;
                }
                let s: Vec<f64> = live.iter().map(|&c| (0..d).map(|x| q[((bb * sq + r) * hq + h) * d + x] * k[((bb * sk + c) * hk + g) * d + x]).sum::<f64>() * scale).collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                for x in 0..d {
                    o[((bb * sq + r) * hq + h) * d + x] = live.iter().zip(&s).map(|(&c, sc)| (sc - mx).exp() / z * v[((bb * sk + c) * hk + g) * d + x]).sum();
                }
                lse[(bb * hq + h) * sq + r] = mx + z.ln();
            }
        }
    }
    (o, lse)
}

/// `[B, S, H, D]` values as the layout holds them.
fn in_layout(x: &[f64], [b, s, h, d]: [usize; 4], layout: AttentionLayout) -> (Vec<f64>, [usize; 4]) {
    match layout {
        AttentionLayout::Bshd => (x.to_vec(), [b, s, h, d]),
        AttentionLayout::Bhsd => {
            let mut y = vec![0.0; x.len()];
            for (i, &val) in x.iter().enumerate() {
                let (bb, ss, hh, dd) = (i / (s * h * d), i / (h * d) % s, i / d % h, i % d);
                y[((bb * h + hh) * s + ss) * d + dd] = val;
            }
            (y, [b, h, s, d])
        }
    }
}

/// The log-sum-exp error: −∞ exactly where the reference has it, relative error elsewhere.
fn lse_err(out: &[f64], want: &[f64]) -> f64 {
    if out.iter().zip(want).any(|(o, w)| (*w == f64::NEG_INFINITY) != (*o == f64::NEG_INFINITY)) {
        return f64::INFINITY;
    }
    let keep = |x: &[f64]| x.iter().zip(want).filter(|(_, w)| w.is_finite()).map(|(o, _)| *o).collect::<Vec<_>>();
    common::rel_err(&keep(out), &keep(want))
}

fn run_case(dt: DType, dims: Dims, opts: AttentionOptions, seed: u64) -> Result<(), String> {
    let dev = Device::best();
    let (b, sq, sk, hq, hk, d) = dims;
    let what = format!("{dt} B{b} Sq{sq} Skv{sk} Hq{hq} Hkv{hk} D{d} {opts:?} seed {seed} on {}", dev.describe());
    let make = |shape: [usize; 4], seed: u64| {
        let vals: Vec<f64> = common::random(shape.iter().product(), seed, 3.0, 0.0).into_iter().map(|x| dt.round(x)).collect();
        let (laid, lshape) = in_layout(&vals, shape, opts.layout);
        (Tensor::from_f64(&laid, &lshape, dt, &dev).expect("tensor"), vals)
    };
    let (q, qv) = make([b, sq, hq, d], seed);
    let (k, kv) = make([b, sk, hk, d], seed + 1);
    let (v, vv) = make([b, sk, hk, d], seed + 2);
    let scale = opts.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let (want_o, want_lse) = reference(&qv, &kv, &vv, dims, scale, &opts);
    let want_o = in_layout(&want_o, [b, sq, hq, d], opts.layout).0;
    let (o, lse) = kfuse::ops::attention(&q, &k, &v, &opts).map_err(|e| format!("{what}: {e}"))?;
    // P is rounded to the input dtype before P·V, as FlashAttention does
    let tol = common::tolerance(dt).max(2e-5);
    let check = |o: &Tensor, lse: &Tensor, via: &str| {
        let eo = common::rel_err(&o.to_vec_f64().unwrap(), &want_o);
        let el = lse_err(&lse.to_vec_f64().unwrap(), &want_lse);
        if eo > tol || el > 1e-4 {
            return Err(format!("{what} ({via}): O relative error {eo:.3e} (bound {tol:.0e}), LSE {el:.3e} (bound 1e-4)"));
        }
        Ok(())
    };
    check(&o, &lse, "ops::attention")?;
    if opts.layout == AttentionLayout::Bshd && opts.window.is_none() && sk > 0 {
        // the launcher itself, into poisoned outputs
        let mut o = common::poisoned(&[b, sq, hq, d], dt, &dev);
        let mut lse = common::poisoned(&[b, hq, sq], DType::F32, &dev);
        let (far, right) = ((sq + sk) as i64, if opts.causal { 0 } else { (sq + sk) as i64 });
        kfuse::ops::kernels::attention(&q, &k, &v, &mut o, &mut lse, scale as f32, (hq / hk) as i64, far, right).map_err(|e| format!("{what}: {e}"))?;
        check(&o, &lse, "kernels::attention, poisoned outputs")?;
    }
    Ok(())
}

fn opts(causal: bool, window: Option<(usize, usize)>, layout: AttentionLayout) -> AttentionOptions {
    AttentionOptions { causal, window, layout, scale: None }
}

#[test]
fn attention_against_float64() {
    use AttentionLayout::{Bhsd, Bshd};
    let cases: &[(Dims, AttentionOptions)] = &[
        ((1, 1, 1, 1, 1, 64), opts(false, None, Bshd)),
        ((2, 17, 17, 4, 2, 64), opts(true, None, Bhsd)),
        ((1, 100, 37, 2, 1, 80), opts(true, None, Bshd)), // rows before the first key see none
        ((1, 130, 200, 3, 3, 128), opts(false, Some((20, 5)), Bshd)),
        ((2, 33, 70, 4, 1, 96), opts(true, Some((10, 0)), Bhsd)),
        ((1, 150, 140, 2, 2, 256), opts(false, None, Bshd)),
        ((1, 1, 300, 2, 1, 128), opts(true, None, Bshd)),
        ((1, 300, 300, 2, 1, 128), opts(false, Some((64, 64)), Bhsd)),
        ((1, 260, 260, 2, 2, 64), opts(false, Some((0, 0)), Bshd)), // each row sees its own key
    ];
    let mut failures = Vec::new();
    for (n, &(dims, o)) in cases.iter().enumerate() {
        for dt in [DType::BF16, DType::F16] {
            if let Err(e) = run_case(dt, dims, o, 1300 + 10 * n as u64) {
                failures.push(e);
            }
        }
    }
    let scaled = AttentionOptions { scale: Some(0.3), ..opts(true, None, Bshd) };
    if let Err(e) = run_case(DType::BF16, (1, 40, 50, 2, 1, 64), scaled, 1399) {
        failures.push(e);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Sequence lengths of 1000 and 4097 against each other, causal and not (the GPU build
/// only: the interpreter would take minutes).
#[test]
#[cfg_attr(not(kfuse_gpu), ignore = "needs a GPU: long sequences")]
fn attention_long_sequences_against_float64() {
    use AttentionLayout::Bshd;
    let mut failures = Vec::new();
    for (n, dims) in [(1, 1000, 4097, 2, 1, 128), (1, 4097, 1000, 2, 2, 64), (1, 4097, 4097, 1, 1, 80), (1, 1000, 1500, 2, 2, 200)].into_iter().enumerate() {
        for causal in [false, true] {
            if let Err(e) = run_case(DType::BF16, dims, opts(causal, None, Bshd), 1500 + 10 * n as u64) {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn attention_empty_and_keyless() {
    let dev = Device::best();
    let t = |shape: &[usize]| Tensor::from_f64(&common::random(shape.iter().product(), 7, 3.0, 0.0), shape, DType::BF16, &dev).unwrap();
    let (o, lse) = kfuse::ops::attention(&t(&[2, 0, 4, 64]), &t(&[2, 5, 4, 64]), &t(&[2, 5, 4, 64]), &AttentionOptions::default()).unwrap();
    assert_eq!((o.shape(), lse.shape()), (&[2, 0, 4, 64][..], &[2, 4, 0][..]));
    let (o, lse) = kfuse::ops::attention(&t(&[2, 3, 4, 64]), &t(&[2, 0, 4, 64]), &t(&[2, 0, 4, 64]), &AttentionOptions::default()).unwrap();
    assert!(o.to_vec_f64().unwrap().iter().all(|&x| x == 0.0));
    assert!(lse.to_vec_f64().unwrap().iter().all(|&x| x == f64::NEG_INFINITY));
}

#[test]
fn attention_bad_input_is_an_error() {
    let dev = Device::cpu();
    let t = |shape: &[usize], dt: DType| Tensor::from_f64(&common::random(shape.iter().product(), 3, 3.0, 0.0), shape, dt, &dev).unwrap();
    let bf = |shape: &[usize]| t(shape, DType::BF16);
    let d = AttentionOptions::default();
    let cases: Vec<(&str, kfuse::Result<(Tensor, Tensor)>, &str)> = vec![
        ("heads that do not divide", kfuse::ops::attention(&bf(&[1, 4, 6, 64]), &bf(&[1, 4, 4, 64]), &bf(&[1, 4, 4, 64]), &d), "multiple of the key/value heads"),
        ("D above 256", kfuse::ops::attention(&bf(&[1, 4, 1, 320]), &bf(&[1, 4, 1, 320]), &bf(&[1, 4, 1, 320]), &d), "1 to 256"),
        ("mixed dtypes", kfuse::ops::attention(&bf(&[1, 4, 1, 64]), &t(&[1, 4, 1, 64], DType::F16), &bf(&[1, 4, 1, 64]), &d), "`k` is f16"),
        ("f32", kfuse::ops::attention(&t(&[1, 4, 1, 64], DType::F32), &t(&[1, 4, 1, 64], DType::F32), &t(&[1, 4, 1, 64], DType::F32), &d), "bf16 or f16"),
        ("rank 3", kfuse::ops::attention(&bf(&[4, 1, 64]), &bf(&[4, 1, 64]), &bf(&[4, 1, 64]), &d), "rank 4"),
        ("k and v differ", kfuse::ops::attention(&bf(&[1, 4, 1, 64]), &bf(&[1, 4, 1, 64]), &bf(&[1, 5, 1, 64]), &d), "one shape"),
        ("head dims differ", kfuse::ops::attention(&bf(&[1, 4, 1, 64]), &bf(&[1, 4, 1, 32]), &bf(&[1, 4, 1, 32]), &d), "head dimension"),
        ("batches differ", kfuse::ops::attention(&bf(&[2, 4, 1, 64]), &bf(&[1, 4, 1, 64]), &bf(&[1, 4, 1, 64]), &d), "batch"),
        (
            "scale not finite",
            kfuse::ops::attention(&bf(&[1, 4, 1, 64]), &bf(&[1, 4, 1, 64]), &bf(&[1, 4, 1, 64]), &AttentionOptions { scale: Some(f32::NAN), ..d }),
            "finite",
        ),
        (
            "negative scale",
            kfuse::ops::attention(&bf(&[1, 4, 1, 64]), &bf(&[1, 4, 1, 64]), &bf(&[1, 4, 1, 64]), &AttentionOptions { scale: Some(-0.5), ..d }),
            "positive",
        ),
    ];
    for (what, got, says) in cases {
        match got {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => assert!(e.to_string().contains(says), "{what}: the error does not say `{says}`: {e}"),
        }
    }
}

/// `kernels::attention` compiles for sm_80 and sm_90a (NVRTC, `ptxas -v`) without spills,
/// bf16 and f16, at B4 S4096 H16 and D 64, 128 and 256, and `kernels::attention_varlen` at
/// D 128; on sm_90a their dots run `wgmma` on rings a producer warpgroup fills (at D 256
/// on 128 × 64 tiles; at D 128 each loop's P·V issued in the next iteration; K and V
/// released by mbarriers of their own), on sm_80 `mma.sync`. The small shapes' kernel
/// (B1 S1 D64, no `wgmma`) compiles too.
#[test]
fn attention_op_compiles_for_sm80_and_sm90a() {
    use kfuse::codegen::Target;
    use kfuse::ops::kernels::{attention, attention_varlen};
    let mut failures = Vec::new();
    // (D = 16: the small shapes' kernels, without `wgmma`, as the float64 tests run)
    for (def, d) in [(&attention::DEF, 64), (&attention::DEF, 128), (&attention::DEF, 256), (&attention_varlen::DEF, 128), (&attention::DEF, 16)] {
        let mut spec = common::snapshot_spec(def);
        spec.shape_pow2 = if def.name == "attention" && d == 16 {
            vec![1, 1, 1, 64, 1, 1]
        } else if def.name == "attention" {
            vec![4, 4096, 16, d, 4096, 16] // B, SQ, HQ, D, SK, HK
        } else {
            vec![16384, 16, d, 16384, 16, 8, 4, 4096] // TQ, HQ, D, TK, HK, B1, B, MQ
        };
        for dt in [DType::BF16, DType::F16] {
            let k = (def.build)(&[dt]).unwrap();
            for target in [Target::sm80(), Target::sm90a()] {
                let name = format!("{}_{dt}_d{d}", def.name);
                let tensor_cores = if target.sm >= 90 { "wgmma" } else { "mma.sync m16n8k16" };
                match common::compile_assembled(&k, &spec, &target, &name) {
                    // (the small shapes: that they compile; their spills are not the hot kernel's)
                    Ok((e, regs, spill)) if d == 16 => eprintln!("{name} {}: {regs} registers, {spill} bytes of spills\n{}", target.arch(), e.plan),
                    Ok((_, regs, spill)) if spill > 0 => failures.push(format!("{name} {}: {spill} bytes of spills ({regs} registers)", target.arch())),
                    Ok((e, _, _)) if target.sm >= 90 && !e.plan.to_string().contains("rings filled by a producer warpgroup") => {
                        failures.push(format!("{name} {}: the rings are not warp-specialized:\n{}", target.arch(), e.plan))
                    }
                    Ok((e, _, _)) if !e.plan.to_string().contains(tensor_cores) => {
                        failures.push(format!("{name} {}: the plan names no dot on the tensor cores:\n{}", target.arch(), e.plan))
                    }
                    // (K released once Q·Kᵀ completes, V once P·V does: two groups of mbarriers)
                    Ok((e, _, _)) if target.sm >= 90 && !e.plan.to_string().contains("the tiles the first dot alone reads have mbarriers of their own") => {
                        failures.push(format!("{name} {}: K and V share their mbarriers:\n{}", target.arch(), e.plan))
                    }
                    // (D128: P·V issued in the next iteration, under its softmax, without spills)
                    Ok((e, _, _)) if target.sm >= 90 && d == 128 && !e.plan.to_string().contains("the last dot is issued in the next iteration") => {
                        failures.push(format!("{name} {}: P·V is not issued late:\n{}", target.arch(), e.plan))
                    }
                    // (D64: 192 rows over three consumer warpgroups, the first register-room attempt, without spills)
                    Ok((e, _, _)) if target.sm >= 90 && d == 64 && !(e.plan.to_string().contains("3 consumer warpgroups") && e.tiles.get("BM") == Some(&192)) => {
                        failures.push(format!("{name} {}: not 192 rows over three consumer warpgroups:\n{}", target.arch(), e.plan))
                    }
                    // (D256, no late dot: the output leaves by TMA through Q's tile, dead after
                    // the loops; D128's late P·V keeps the registers' stores: measured faster)
                    Ok((e, _, _)) if target.sm >= 90 && def.name == "attention" && (d == 256) != e.plan.to_string().contains("leaves through the operand tile of `qt`") => {
                        failures.push(format!("{name} {}: the output's store through Q's tile {} expected:\n{}", target.arch(), if d == 256 { "was" } else { "was not" }, e.plan))
                    }
                    // (a later row block sees more keys when causal: the longest blocks start first)
                    Ok((e, _, _)) if def.name == "attention" && d != 16 && !e.plan.to_string().contains("axis 0 from its last program") => {
                        failures.push(format!("{name} {}: row blocks launched in order:\n{}", target.arch(), e.plan))
                    }
                    Ok((e, regs, _)) => eprintln!("{name} {}: {regs} registers\n{}", target.arch(), e.plan),
                    Err(e) => failures.push(format!("{name} {}: {}", target.arch(), e.0)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `attention_varlen` on packed sequences of different lengths (an empty one, one
/// without keys, one with more queries than keys), against the float64 reference of each
/// sequence alone; its kernel's launcher into poisoned outputs gives the same values.
#[test]
fn attention_varlen_against_float64() {
    let dev = Device::best();
    let (hq, hk, d) = (4, 2, 64);
    // sequences (Sq, Skv): (5, 7), (0, 23), (100, 0), (35, 170), (60, 20)
    let (cu_q, cu_k) = ([0usize, 5, 5, 105, 140, 200], [0usize, 7, 30, 30, 200, 220]);
    let (nb, tq, tk, mq) = (cu_q.len() - 1, cu_q[5], cu_k[5], 100);
    let mut failures = Vec::new();
    for (n, opts) in [opts(false, None, AttentionLayout::Bshd), opts(true, None, AttentionLayout::Bshd), opts(false, Some((16, 3)), AttentionLayout::Bshd)].into_iter().enumerate() {
        let dt = if n == 1 { DType::F16 } else { DType::BF16 };
        let seed = 1700 + 10 * n as u64;
        let vals = |len: usize, s: u64| common::random(len, s, 3.0, 0.0).into_iter().map(|x| dt.round(x)).collect::<Vec<f64>>();
        let (qv, kv, vv) = (vals(tq * hq * d, seed), vals(tk * hk * d, seed + 1), vals(tk * hk * d, seed + 2));
        let t = |x: &[f64], shape: &[usize]| Tensor::from_f64(x, shape, dt, &dev).unwrap();
        let cu = |c: &[usize]| Tensor::from_f64(&c.iter().map(|&x| x as f64).collect::<Vec<_>>(), &[c.len()], DType::I64, &dev).unwrap();
        let (q, k, v) = (t(&qv, &[tq, hq, d]), t(&kv, &[tk, hk, d]), t(&vv, &[tk, hk, d]));
        let (o, lse) = match kfuse::ops::attention_varlen(&q, &k, &v, &cu(&cu_q), &cu(&cu_k), mq, 170, &opts) {
            Ok((o, lse)) => (o.to_vec_f64().unwrap(), lse.to_vec_f64().unwrap()),
            Err(e) => {
                failures.push(format!("{opts:?}: {e}"));
                continue;
            }
        };
        // the launcher into poisoned outputs: every row of `o` is some sequence's and
        // written; the same values as the op's
        let (mut po, mut pl) = (common::poisoned(&[tq, hq, d], dt, &dev), common::poisoned(&[nb, hq, mq], DType::F32, &dev));
        let (left, right) = opts.window.map_or(((tq + tk) as i64, (tq + tk) as i64), |(l, r)| (l as i64, r as i64));
        let right = if opts.causal { 0 } else { right };
        let scale = 1.0 / (d as f32).sqrt();
        kfuse::ops::kernels::attention_varlen(&q, &k, &v, &cu(&cu_q), &cu(&cu_k), &mut po, &mut pl, scale, (hq / hk) as i64, left, right).unwrap();
        if po.to_vec_f64().unwrap() != o {
            failures.push(format!("{dt} {opts:?}: the launcher's output into a poisoned tensor differs from the op's"));
        }
        let pl = pl.to_vec_f64().unwrap();
        // rows no sequence holds (past cu_seqlens_q's end) keep what they held: a
        // program writes only its own sequence's rows
        let extra = 40;
        let qx = t(&vals((tq + extra) * hq * d, seed + 3), &[tq + extra, hq, d]);
        let mut ox = common::poisoned(&[tq + extra, hq, d], dt, &dev);
        kfuse::ops::kernels::attention_varlen(&qx, &k, &v, &cu(&cu_q), &cu(&cu_k), &mut ox, &mut pl_scratch(nb, hq, mq, &dev), scale, (hq / hk) as i64, left, right).unwrap();
        if ox.to_vec_f64().unwrap()[tq * hq * d..].iter().any(|x| !x.is_nan()) {
            failures.push(format!("{dt} {opts:?}: rows past the last sequence were written"));
        }
        for b in 0..nb {
            let (q0, sq, k0, sk) = (cu_q[b], cu_q[b + 1] - cu_q[b], cu_k[b], cu_k[b + 1] - cu_k[b]);
            let scale = 1.0 / (d as f64).sqrt();
            let (want_o, want_lse) = reference(&qv[q0 * hq * d..(q0 + sq) * hq * d], &kv[k0 * hk * d..(k0 + sk) * hk * d], &vv[k0 * hk * d..(k0 + sk) * hk * d], (1, sq, sk, hq, hk, d), scale, &opts);
            let row = |x: &[f64], h: usize| x[(b * hq + h) * mq..(b * hq + h) * mq + sq].to_vec();
            let got_lse: Vec<f64> = (0..hq).flat_map(|h| row(&lse, h)).collect();
            if (0..hq).any(|h| row(&pl, h) != row(&lse, h)) {
                failures.push(format!("{dt} {opts:?} sequence {b}: the launcher's log-sum-exp differs from the op's"));
            }
            let past: Vec<f64> = (0..hq).flat_map(|h| lse[(b * hq + h) * mq + sq..(b * hq + h + 1) * mq].to_vec()).collect();
            if past.iter().any(|&x| x != f64::NEG_INFINITY) {
                failures.push(format!("{dt} {opts:?} sequence {b}: the log-sum-exp past the sequence is not -inf"));
            }
            let eo = common::rel_err(&o[q0 * hq * d..(q0 + sq) * hq * d], &want_o);
            let el = lse_err(&got_lse, &want_lse);
            if eo > common::tolerance(dt).max(2e-5) || el > 1e-4 {
                failures.push(format!("{dt} {opts:?} sequence {b} (Sq {sq}, Skv {sk}) on {}: O relative error {eo:.3e}, LSE {el:.3e}", dev.describe()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A poisoned `[B, Hq, MQ]` log-sum-exp.
fn pl_scratch(b: usize, hq: usize, mq: usize, dev: &Device) -> Tensor {
    common::poisoned(&[b, hq, mq], DType::F32, dev)
}

#[test]
fn attention_varlen_bad_input_is_an_error() {
    let dev = Device::cpu();
    let t = |shape: &[usize]| Tensor::from_f64(&common::random(shape.iter().product(), 5, 3.0, 0.0), shape, DType::BF16, &dev).unwrap();
    let cu = |c: &[f64]| Tensor::from_f64(c, &[c.len()], DType::I64, &dev).unwrap();
    let (q, k) = (t(&[10, 2, 64]), t(&[12, 1, 64]));
    let d = AttentionOptions::default();
    let call = |cq: &Tensor, ck: &Tensor, mq: usize, o: &AttentionOptions| kfuse::ops::attention_varlen(&q, &k, &k, cq, ck, mq, 12, o);
    let good_k = cu(&[0.0, 5.0, 12.0]);
    let cases = [
        ("decreasing", call(&cu(&[0.0, 6.0, 4.0, 10.0]), &cu(&[0.0, 5.0, 6.0, 12.0]), 10, &d), "never decrease"),
        ("not from 0", call(&cu(&[1.0, 10.0]), &cu(&[0.0, 12.0]), 10, &d), "start at 0"),
        ("not to the end", call(&cu(&[0.0, 4.0, 9.0]), &good_k, 10, &d), "packed length 10"),
        ("batches differ", call(&cu(&[0.0, 10.0]), &good_k, 10, &d), "one batch"),
        ("longer than max", call(&cu(&[0.0, 4.0, 10.0]), &good_k, 5, &d), "longer than its maximum"),
        ("f32 lengths", call(&Tensor::from_f64(&[0.0, 4.0, 10.0], &[3], DType::F32, &dev).unwrap(), &good_k, 10, &d), "i64"),
        ("Bhsd", call(&cu(&[0.0, 4.0, 10.0]), &good_k, 10, &AttentionOptions { layout: AttentionLayout::Bhsd, ..d }), "Bshd"),
    ];
    for (what, got, says) in cases {
        match got {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => assert!(e.to_string().contains(says), "{what}: the error does not say `{says}`: {e}"),
        }
    }
}

/// What the compiler emits for `kernels::attention` at B4 S4096 H16 D128 bf16, pinned:
/// the scheduled IR and the CUDA for sm_90a and sm_80 (`cargo insta review` on a
/// change; the GPU tests and the benchmark say whether it is still right and fast).
#[test]
fn attention_op_snapshots() {
    use kfuse::codegen::Target;
    use kfuse::ops::kernels::attention;
    let mut spec = common::snapshot_spec(&attention::DEF);
    spec.shape_pow2 = vec![4, 4096, 16, 128, 4096, 16]; // B, SQ, HQ, D, SK, HK
    let k = (attention::DEF.build)(&[DType::BF16]).unwrap();
    for (target, name) in [(Target::sm90a(), "sm90a"), (Target::sm80(), "sm80")] {
        let e = kfuse::codegen::compile(&k, &spec, &target).unwrap();
        insta::assert_snapshot!(format!("ops_attention_bf16_{name}_ir"), e.ir);
        insta::assert_snapshot!(format!("ops_attention_bf16_{name}"), e.source);
    }
}

//! Gathers and scatters: block offsets that are `i64` tiles (`x.block([rows, c], [_, BC])`),
//! one coordinate per element of the gathered axis. An embedding lookup (ids outside the
//! table read zeros), a scatter of rows (rows outside the output dropped, the rest kept),
//! and a 3 × 3 box sum over an NHWC image gathering three dimensions at once (taps outside
//! the image read zeros: a convolution's padding).
//!
//! Each kernel runs on the best device there is (the interpreter in CI, the GPU on the
//! GPU host) into poisoned outputs against float64, odd shapes, fixed seeds; and each
//! compiles for sm_80 and sm_90a (NVRTC and `ptxas -v`, no spills) without a GPU.

mod common;

#[path = "kernels/gathers.rs"]
mod kernels_gathers;
use kernels_gathers::*;

use kfuse::prelude::*;
use kfuse::DType;

fn dev() -> Device {
    Device::best()
}

fn check(name: &str, got: &[f64], want: &[f64], tol: f64) {
    let e = common::rel_err(got, want);
    assert!(e <= tol, "{name} on {}: relative error {e:.3e} > {tol:.1e}", dev().describe());
}

#[test]
fn embedding_rows() {
    for dt in common::DTYPES {
        for (s, &(v, d, n)) in [(1, 1, 1), (7, 5, 13), (100, 130, 257), (33, 64, 70)].iter().enumerate() {
            let (table, tv) = common::random_tensor(&[v, d], dt, 900 + s as u64, 0.0, &dev());
            // every third id outside the table (below or past it)
            let ids: Vec<i64> = (0..n).map(|t| match t % 3 { 0 => -1 - t as i64, 1 => v as i64 + t as i64, _ => ((t * 7919 + s) % v) as i64 }).collect();
            let idt = Tensor::from_f64(&ids.iter().map(|&x| x as f64).collect::<Vec<_>>(), &[n], DType::I64, &dev()).unwrap();
            let mut out = common::poisoned(&[n, d], dt, &dev());
            embedding(&table, &idt, &mut out).unwrap();
            let want: Vec<f64> = (0..n * d)
                .map(|e| {
                    let r = ids[e / d];
                    if (0..v as i64).contains(&r) { tv[r as usize * d + e % d] } else { 0.0 }
                })
                .collect();
            check(&format!("embedding {dt} {v}x{d} ids {n}"), &out.to_vec_f64().unwrap(), &want, 0.0);
        }
    }
}

#[test]
fn scattered_rows_keep_the_rest() {
    for dt in common::DTYPES {
        for (s, &(n, d, r)) in [(1, 1, 3), (7, 5, 9), (100, 130, 257)].iter().enumerate() {
            let (x, xv) = common::random_tensor(&[n, d], dt, 950 + s as u64, 0.0, &dev());
            // a permutation of rows into `out`, one row in four sent outside it
            let dest: Vec<i64> = (0..n).map(|t| if t % 4 == 3 { r as i64 + t as i64 } else { ((t * 5 + 1) % r) as i64 }).collect();
            let mut seen = std::collections::HashSet::new();
            let dest: Vec<i64> = dest.into_iter().map(|x| if x < r as i64 && !seen.insert(x) { -1 } else { x }).collect();
            let dt_ = Tensor::from_f64(&dest.iter().map(|&x| x as f64).collect::<Vec<_>>(), &[n], DType::I64, &dev()).unwrap();
            let (mut out, before) = common::random_tensor(&[r, d], dt, 970 + s as u64, 0.0, &dev());
            scatter_rows(&x, &dt_, &mut out).unwrap();
            let mut want = before.clone();
            for (t, &row) in dest.iter().enumerate() {
                if (0..r as i64).contains(&row) {
                    for c in 0..d {
                        want[row as usize * d + c] = dt.round(2.0 * xv[t * d + c]);
                    }
                }
            }
            check(&format!("scatter_rows {dt} {n}x{d} into {r}"), &out.to_vec_f64().unwrap(), &want, 0.0);
        }
    }
}

#[test]
fn box_sums_with_zero_padding() {
    for dt in common::DTYPES {
        for (s, &(n, h, w, c)) in [(1, 1, 1, 1), (2, 7, 13, 5), (3, 13, 7, 70)].iter().enumerate() {
            let (x, xv) = common::random_tensor(&[n, h, w, c], dt, 990 + s as u64, 0.0, &dev());
            let mut out = common::poisoned(&[n * h * w, c], dt, &dev());
            box3x3(&x, &mut out).unwrap();
            let mut want = vec![0.0; n * h * w * c];
            for (m, row) in want.chunks_mut(c).enumerate() {
                let (b, p, q) = (m / (h * w), (m % (h * w)) / w, m % w);
                for (ch, o) in row.iter_mut().enumerate() {
                    for t in 0..9 {
                        let (y, z) = (p as i64 + t / 3 - 1, q as i64 + t % 3 - 1);
                        if (0..h as i64).contains(&y) && (0..w as i64).contains(&z) {
                            *o += xv[((b * h + y as usize) * w + z as usize) * c + ch];
                        }
                    }
                }
            }
            check(&format!("box3x3 {dt} {n}x{h}x{w}x{c}"), &out.to_vec_f64().unwrap(), &want, common::tolerance(dt));
        }
    }
}

/// Tiles of coordinates divided by a scalar and by a shape: a multiply-high and a shift
/// (the launch's multiply-shift word) where the numerator and the divisor fit 31 bits, the
/// 64-bit division elsewhere — numerators from −50 and across 2^31, divisors from 1 to past
/// 2^32 and negative — against Rust's `/` and `%` (which truncate, as C does).
#[test]
fn coordinates_divided_by_launch_values() {
    let dev = dev();
    let n = 1001;
    let big = (1i64 << 31) - 400;
    for d in [1i64, 3, 56, 3136, 65_537, (1 << 31) - 1, 1 << 31, (1 << 33) + 3, -7] {
        for off in [0i64, -50, big] {
            // the shape divisor: `x`'s extent (positive, and small enough to allocate)
            let ds = d.clamp(1, 70_001) as usize;
            let x = Tensor::full(&[ds], 1.5, DType::F32, &dev).unwrap();
            // (poisoned with a value no quotient or remainder here takes)
            let mut outs: Vec<Tensor> = (0..4).map(|_| Tensor::full(&[n], -987_654_321.0, DType::I64, &dev).unwrap()).collect();
            let [q, r, qs, rs] = &mut outs[..] else { unreachable!() };
            divide_rows(d, off, &x, q, r, qs, rs).unwrap();
            let ms: Vec<i64> = (0..n as i64).map(|t| off + t).collect();
            let got = |t: &Tensor| t.to_vec_f64().unwrap().iter().map(|&v| v as i64).collect::<Vec<_>>();
            let ds = ds as i64;
            assert_eq!(got(q), ms.iter().map(|m| m / d).collect::<Vec<_>>(), "m / {d} from {off} on {}", dev.describe());
            assert_eq!(got(r), ms.iter().map(|m| m % d).collect::<Vec<_>>(), "m % {d} from {off} on {}", dev.describe());
            assert_eq!(got(qs), ms.iter().map(|m| m / ds).collect::<Vec<_>>(), "m / D = {ds} from {off} on {}", dev.describe());
            assert_eq!(got(rs), ms.iter().map(|m| m % ds).collect::<Vec<_>>(), "m % D = {ds} from {off} on {}", dev.describe());
        }
    }
}

/// The kernels compile for sm_80 and sm_90a: NVRTC, then `ptxas -v`, no spills.
#[test]
fn gather_kernels_compile_for_sm80_and_sm90a() {
    let failures = common::compile_for_both_targets(&[(&embedding::DEF, true), (&scatter_rows::DEF, true), (&box3x3::DEF, false), (&divide_rows::DEF, true)]);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The kernels at the shapes the tests launch, specialized as a launch specializes them
/// (`kfuse::runtime::emit`: alignment, strides, exact shapes), compile for sm_80 and
/// sm_90a: an index tile loaded in vectors and met by the gathered tile through shared
/// memory (the embedding's ids) takes this path.
#[test]
fn gather_kernels_compile_at_the_tested_shapes() {
    use kfuse::codegen::Target;
    use kfuse::runtime::{emit, ArgDesc};
    for dt in common::DTYPES {
        let t = |s: &[usize]| ArgDesc::tensor(dt, s);
        let ids = |n: usize| ArgDesc::tensor(DType::I64, &[n]);
        let mut cases: Vec<(&kfuse::ir::KernelDef, Vec<ArgDesc>)> = Vec::new();
        for (v, d, n) in [(1, 1, 1), (7, 5, 13), (100, 130, 257), (33, 64, 70)] {
            cases.push((&embedding::DEF, vec![t(&[v, d]), ids(n), t(&[n, d])]));
        }
        for (n, d, r) in [(1, 1, 3), (7, 5, 9), (100, 130, 257)] {
            cases.push((&scatter_rows::DEF, vec![t(&[n, d]), ids(n), t(&[r, d])]));
        }
        for [n, h, w, c] in [[1, 1, 1, 1], [2, 7, 13, 5], [3, 13, 7, 70]] {
            cases.push((&box3x3::DEF, vec![t(&[n, h, w, c]), t(&[n * h * w, c])]));
        }
        for (def, args) in cases {
            for target in [Target::sm80(), Target::sm90a()] {
                let name = format!("{} {dt} {}", def.name, target.arch());
                let e = emit(def, &args, &target).unwrap_or_else(|e| panic!("{name}: {e}"));
                common::assemble(&e.source, &e.arch, &e.options, &name).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

//! Grouped GEMM (`kfuse::ops::gemm_grouped`: one launch over several problems) beside
//! the same problems run one by one: kfuse's own `gemm` per problem, and cuBLAS
//! (`cublasGemmEx`, called through cudarc in this process) per problem. bf16, f32
//! accumulation, row-major. Cases: an MoE layer's experts (8 problems, M from 128 to
//! 2048 tokens, N 4096, K 4096) and a mixed list (M, N and K all differ).
//!
//! Timing: CUDA events around the whole list (one grouped launch, or the loop of
//! launches), 10 warm-ups, 50 timed, median, warm L2. TFLOP/s counts 2·M·N·K over all
//! problems. Each kfuse result is checked against cuBLAS's on every problem first.
//!
//! ```sh
//! cargo bench --bench gemm_grouped     # on the GPU host: .gpu/bin/gemm_grouped
//! ```

mod common;

use common::{median, random};
use kfuse::ops::{gemm, gemm_grouped};
use kfuse::runtime::vendor::{Blas, Library, Math};
use kfuse::{DType, Tensor};

fn main() -> kfuse::Result<()> {
    let Some(dev) = common::gpu() else { return Ok(()); };
    let blas = Blas::new(&dev)?;
    let moe: Vec<(usize, usize, usize)> = [128, 256, 384, 512, 768, 1024, 1536, 2048].iter().map(|&m| (m, 4096, 4096)).collect();
    let mixed = vec![(4096, 4096, 1024), (1000, 3000, 2000), (2048, 512, 8192), (127, 4097, 4095), (3000, 1000, 3000)];
    println!("| problems | kfuse grouped (one launch) | kfuse gemm per problem | cuBLAS per problem | grouped / cuBLAS | max rel. err vs cuBLAS |");
    println!("|---|---|---|---|---|---|");
    for (label, shapes) in [("MoE: 8 experts, M 128-2048, N 4096, K 4096", &moe), ("mixed: 5 problems, M, N, K all differ", &mixed)] {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            a.push(random(&[m, k], DType::BF16, 10 + 2 * i as u64, &dev).0);
            b.push(random(&[k, n], DType::BF16, 11 + 2 * i as u64, &dev).0);
        }
        let ar: Vec<&Tensor> = a.iter().collect();
        let br: Vec<&Tensor> = b.iter().collect();
        let flops: f64 = shapes.iter().map(|&(m, n, k)| 2.0 * (m * n * k) as f64).sum();
        // correctness first: every problem against cuBLAS
        let got = gemm_grouped(&ar, &br)?;
        let mut worst: f64 = 0.0;
        for i in 0..shapes.len() {
            let want = blas.gemm(&a[i], &b[i], Library::Cublas, Math::Fp32)?.to_vec_f64()?;
            let g = got[i].to_vec_f64()?;
            let num: f64 = g.iter().zip(&want).map(|(x, y)| (x - y) * (x - y)).sum();
            let den: f64 = want.iter().map(|y| y * y).sum();
            let e = (num / den.max(1e-300)).sqrt();
            if e > 1e-2 {
                eprintln!("{label}: problem #{i} {:?}: rel. err {e:.2e} against cuBLAS", shapes[i]);
            }
            worst = worst.max(e);
        }
        let (w, it) = (10, 50);
        let t_grouped = median(dev.time_ms(w, it, || gemm_grouped(&ar, &br).map(|_| ()))?);
        let t_loop = median(dev.time_ms(w, it, || {
            for i in 0..a.len() {
                gemm(&a[i], &b[i])?;
            }
            Ok(())
        })?);
        let t_blas = median(dev.time_ms(w, it, || {
            for i in 0..a.len() {
                blas.gemm(&a[i], &b[i], Library::Cublas, Math::Fp32)?;
            }
            Ok(())
        })?);
        let tf = |ms: f64| flops / ms / 1e9;
        println!(
            "| {label} | {:.3} ms ({:.0} TFLOP/s) | {:.3} ms ({:.0}) | {:.3} ms ({:.0}) | {:.2}× | {worst:.1e} |",
            t_grouped,
            tf(t_grouped),
            t_loop,
            tf(t_loop),
            t_blas,
            tf(t_blas),
            t_blas / t_grouped
        );
    }
    Ok(())
}

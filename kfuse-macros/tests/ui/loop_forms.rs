use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

#[kfuse(crate = "crate::fake")]
pub fn k(x: Tensor<f32, (N,)>, out: &mut Tensor<f32, (N,)>, n: i64) {
    let i = program_id(0);
    for k in n {
    }
    for k in 0..=n {
    }
    for k in 0..N.step_by(BN) {
    }
    for k in (0..N).rev() {
    }
    for k in 0..N {
        break;
    }
    'rows: for k in 0..N {
    }
    loop {
    }
    out.block([i * BN], [BN]).store(x.block([i * BN], [BN]).load());
}
fn main() {}

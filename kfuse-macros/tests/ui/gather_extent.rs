use kfuse_macros::kfuse;
include!("../support/fake_kfuse.rs");

// an index tile as an offset gathers: its extent must be `_`
#[kfuse(crate = "crate::fake")]
pub fn k<T: Float>(x: Tensor<T, (V, D)>, ids: Tensor<i64, (S,)>, out: &mut Tensor<T, (S, D)>) {
    let i = program_id(0);
    let rows = ids.block([i * BS], [BS]).load();
    out.block([i * BS, 0], [BS, D]).store(x.block([rows, 0], [BS, D]).load());
}
fn main() {}

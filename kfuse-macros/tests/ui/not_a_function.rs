use kfuse_macros::kfuse;

#[kfuse]
pub struct NotAKernel;

fn main() {
    let _ = NotAKernel;
}

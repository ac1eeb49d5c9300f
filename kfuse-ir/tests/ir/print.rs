use kfuse_ir::*;
use crate::common::*;
#[test]
fn show() { println!("{}", print::print(&add_1d(DType::BF16))); println!("{}", print::print(&softmax_row(DType::BF16))); }

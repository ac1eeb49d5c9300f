mod common;
use kfuse::{DType};
use kfuse::codegen::{compile, Target};
#[test]
fn dump() {
    let def = &kfuse::ops::kernels::swiglu_gemm::DEF;
    let k = (def.build)(&[DType::BF16]).unwrap();
    let mut spec = common::gemm::spec_mnk(def, 4096, 4096, 4096);
    spec.tiles.insert("GENERAL".into(), 1);
    let e = compile(&k, &spec, &Target::sm90a()).unwrap();
    println!("{}", e.plan);
    let (r, spill) = common::assemble(&e.source, &e.arch, &e.options, "sw").unwrap();
    println!("regs {r} spill {spill}");
}

//! A kernel the compiler refuses is named in the refusal, with the op at fault and its
//! line in the user's source, as the macro's own errors are (issue 20, item 9). Runs
//! codegen only: no GPU, no NVRTC.

use kfuse::codegen::{CodegenError, Spec, Target, TensorSpec};
use kfuse::ir::{KernelDef, ParamSig};
use kfuse::prelude::*;

/// The line of the `#[kfuse]` attribute below; the loop is 3 lines further down, the
/// load 4. Column sums of a matrix in one program, a whole row carried by the loop: too
/// long for one block on sm_80, and not a row a loop over chunks can walk.
const ROW_KERNEL_LINE: u32 = line!() + 1;
#[kfuse]
pub fn refused_long_rows<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (N,)>) {
    let mut acc = zeros::<f32>([N]);
    for r in 0..M {
        acc = acc + x.row(r).load().to_f32();
    }
    out.block([0], [N]).store(acc.cast::<T>());
}
const LOOP_LINE: u32 = ROW_KERNEL_LINE + 3;
const LOAD_LINE: u32 = ROW_KERNEL_LINE + 4;

/// Contiguous, 16-byte-aligned tensors whose shape symbols are `sizes`, in order.
fn spec(def: &KernelDef, sizes: &[u32]) -> Spec {
    let tensors = def
        .params
        .iter()
        .map(|p| match p {
            ParamSig::Tensor { dims, .. } => {
                Some(TensorSpec { ptr_align: 16, stride_div: (0..dims.len()).map(|i| if i + 1 == dims.len() { 0 } else { 16 }).collect() })
            }
            ParamSig::Scalar { .. } => None,
        })
        .collect();
    Spec { tensors, shape_pow2: sizes.to_vec(), shape_div: vec![], tiles: Default::default(), threads: None, min_blocks: None, grouped: false, register_attempt: 0, ..Spec::default() }
}

#[test]
fn the_macro_records_each_ops_source_line() {
    let k = (refused_long_rows::DEF.build)(&[DType::F32]).unwrap();
    let loads: Vec<_> = k.ops().filter(|&o| matches!(k.op(o), kfuse::ir::Op::Load { .. })).collect();
    assert_eq!(loads.len(), 1);
    let loc = k.locs[&loads[0]];
    assert_eq!(loc.line, LOAD_LINE, "{loc}");
    // the column of the load's expression (`x.row(r).load()` starts at `x`, column 21)
    assert_eq!(loc.column, 21, "{loc}");
    // every op of the body has a line in the kernel's body
    let body = ROW_KERNEL_LINE + 2..=ROW_KERNEL_LINE + 6;
    for o in k.ops() {
        if matches!(k.op(o), kfuse::ir::Op::ScalarParam { .. }) {
            continue;
        }
        let l = k.locs.get(&o).unwrap_or_else(|| panic!("{} has no location", k.op_label(o)));
        assert!(body.contains(&l.line), "{} at {l}, outside lines {body:?}", k.op_label(o));
    }
    let store = k.ops().find(|&o| matches!(k.op(o), kfuse::ir::Op::Store { .. })).unwrap();
    assert_eq!(k.locs[&store].line, ROW_KERNEL_LINE + 6);
    let for_op = k.ops().find(|&o| matches!(k.op(o), kfuse::ir::Op::For { .. })).unwrap();
    assert_eq!(k.locs[&for_op].line, LOOP_LINE);
}

#[test]
fn a_refusal_names_the_kernel_the_op_and_its_line() {
    let k = (refused_long_rows::DEF.build)(&[DType::F32]).unwrap();
    let err = kfuse::codegen::compile(&k, &spec(&refused_long_rows::DEF, &[4, 131072]), &Target::sm80()).unwrap_err();
    let text = err.to_string();
    assert_eq!(
        text,
        format!(
            "kernel `refused_long_rows`, `for` at line {LOOP_LINE}: unsupported: a tile of 131072 elements needs a \
             thread-block cluster (sm_90) on this target (sm_80), and its row cannot be walked in chunks: a loop carries \
             a value that spans the row"
        )
    );
    match &err {
        CodegenError::At { kernel, op, line, error } => {
            assert_eq!(kernel, "refused_long_rows");
            assert_eq!(op.as_deref(), Some("for"));
            assert_eq!(*line, Some(LOOP_LINE));
            assert!(matches!(**error, CodegenError::Unsupported(_)), "{error:?}");
        }
        e => panic!("not located: {e:?}"),
    }
    assert!(matches!(err.unlocated(), CodegenError::Unsupported(_)));
    // as the runtime reports it
    let runtime = kfuse::Error::from(err).to_string();
    assert!(runtime.starts_with(&format!("code generation failed: kernel `refused_long_rows`, `for` at line {LOOP_LINE}: ")), "{runtime}");
    // the same kernel compiles where a cluster is there to take the row
    kfuse::codegen::compile(&k, &spec(&refused_long_rows::DEF, &[4, 131072]), &Target::sm90a()).unwrap();
}

#[test]
fn a_refusal_of_the_whole_kernel_names_the_kernel() {
    let k = (refused_long_rows::DEF.build)(&[DType::F16]).unwrap();
    let old = Target { sm: 75, ..Target::sm80() };
    let err = kfuse::codegen::compile(&k, &spec(&refused_long_rows::DEF, &[4, 1024]), &old).unwrap_err();
    assert_eq!(
        err.to_string(),
        "kernel `refused_long_rows`: target sm_75: kfuse generates code for sm_80 and newer (Ampere, Ada, Hopper)"
    );
    let err = kfuse::codegen::schedule(&k, &spec(&refused_long_rows::DEF, &[4, 1024]), &old).unwrap_err();
    assert!(matches!(err, CodegenError::At { op: None, line: None, .. }), "{err:?}");
}

/// A tile whose size overflows 32 bits (a whole 2^24 × 2^24 block) is refused with its
/// size and the op, on every target; its element count once wrapped (a panic in a debug
/// build, a small wrong count in a release one).
const HUGE_LINE: u32 = line!() + 1;
#[kfuse]
pub fn huge_tile<T: Float>(x: Tensor<T, (M, N)>, out: &mut Tensor<T, (M, N)>) {
    out.block([0, 0], [M, N]).store(x.block([0, 0], [M, N]).load());
}

#[test]
fn a_tile_past_32_bits_of_elements_is_refused_with_its_size() {
    let kernel = (huge_tile::DEF.build)(&[kfuse::DType::F32]).expect("builds");
    for target in [Target::sm80(), Target::sm90a()] {
        let err = kfuse::codegen::compile(&kernel, &spec(&huge_tile::DEF, &[1 << 24, 1 << 24]), &target).map(|_| ()).expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("a tile of 281474976710656 elements"), "{}: {text}", target.arch());
        assert!(text.contains(&format!("line {}", HUGE_LINE + 2)), "{}: {text}", target.arch());
        assert!(matches!(err, CodegenError::At { .. }), "{}: {err:?}", target.arch());
    }
}

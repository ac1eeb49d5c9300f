// A stand-in for the `kfuse` facade, for tests that must not depend on the runtime:
// `ir` is the real IR crate; `runtime` has the runtime's API (`Tensor`, `Arg`, `Scalar`,
// `launch`, `Result`, `Launched`) but "launches" by checking the arguments against the
// `KernelDef`, binding the dtype generics from the tensors and building the IR.
// Used as `#[kfuse(crate = "crate::fake")]`; included by `tests/*.rs` and `tests/ui/*.rs`.

#[allow(dead_code, unused)]
pub mod fake {
    pub use kfuse_ir as ir;

    pub mod runtime {
        use super::ir::{DType, DTypeSig, KernelDef, ParamSig};

        pub struct Tensor {
            pub dtype: DType,
        }

        pub enum Scalar {
            F32(f32),
            I64(i64),
        }

        pub enum Arg<'a> {
            In(&'a Tensor),
            Out(&'a mut Tensor),
            Scalar(Scalar),
        }

        pub type Result<T> = std::result::Result<T, String>;

        /// What the fake launch did: the IR it built.
        #[derive(Debug)]
        pub struct Launched {
            pub ir: String,
        }

        pub fn launch(def: &KernelDef, args: &mut [Arg<'_>]) -> Result<Launched> {
            if args.len() != def.params.len() {
                return Err(format!("`{}` takes {} arguments, got {}", def.name, def.params.len(), args.len()));
            }
            let mut dtypes: Vec<Option<DType>> = vec![None; def.generics.len()];
            for (p, a) in def.params.iter().zip(args.iter()) {
                let t: &Tensor = match (p, a) {
                    (ParamSig::Tensor { output: false, .. }, Arg::In(t)) => t,
                    (ParamSig::Tensor { output: true, .. }, Arg::Out(t)) => t,
                    (ParamSig::Scalar { dtype: DType::F32, .. }, Arg::Scalar(Scalar::F32(_))) => continue,
                    (ParamSig::Scalar { dtype: DType::I64, .. }, Arg::Scalar(Scalar::I64(_))) => continue,
                    _ => return Err(format!("argument `{}` has the wrong kind", p.name())),
                };
                let ParamSig::Tensor { dtype, .. } = p else { unreachable!() };
                match *dtype {
                    DTypeSig::Concrete(d) if d == t.dtype => {}
                    DTypeSig::Generic(i) if dtypes[i].is_none() || dtypes[i] == Some(t.dtype) => dtypes[i] = Some(t.dtype),
                    _ => return Err(format!("argument `{}` has dtype {}", p.name(), t.dtype)),
                }
            }
            let dtypes: Vec<DType> = dtypes.into_iter().map(|d| d.unwrap_or(DType::F32)).collect();
            let k = (def.build)(&dtypes).map_err(|e| e.to_string())?;
            kfuse_ir::grid::derive(&k).map_err(|e| e.to_string())?;
            Ok(Launched { ir: kfuse_ir::print::print(&k) })
        }
    }
}

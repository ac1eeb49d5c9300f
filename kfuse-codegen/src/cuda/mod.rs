//! The CUDA C++ writer. `emit` walks the scheduled kernel in program order and prints
//! what the passes decided; `prelude` holds the fixed helper functions every kernel
//! carries (so a source compiles with NVRTC alone, no headers); `writer` is the
//! indenting text sink.

pub mod emit;
pub mod prelude;
pub mod writer;

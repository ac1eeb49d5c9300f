//! Tests of kfuse-ir: builder typing rules, verifier, printer, grid derivation and the
//! CPU interpreter. One test binary (links once).

mod builder;
mod common;
mod gather;
mod grid;
mod interp;
mod loops;
mod print;
mod verify;

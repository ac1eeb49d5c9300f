//! The scheduling passes, one per file, in pipeline order (see [`crate::compile`]).

pub mod assign_layouts;
pub mod choose_tiles;
pub mod vectorize;

//! The scheduling passes, one per file, in pipeline order (see [`crate::compile`]).

pub mod assign_layouts;
pub mod choose_tiles;
pub mod chunk_rows;
pub mod hoist_invariants;
pub mod order_grid;
pub mod persist_programs;
pub mod prefetch_ahead;
pub mod rematerialize;
pub mod ring_occupancy;
pub mod select_mma_path;
pub mod vectorize;

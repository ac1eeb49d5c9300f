//! CPU interpreter (to be written).

//! spillway-store's integration tests, one binary.

mod memory;
mod path_matching;

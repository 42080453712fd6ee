//! `spillway simulate`: replay recorded or synthetic traffic through rules
//! files at virtual time, and report what they would do.

pub mod report;
pub mod summary;
pub mod synth;
pub mod trace;

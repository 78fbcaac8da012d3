//! The pure core: budgetscope's own span model, the budget read from a span, the budget
//! analysis with its rollup histograms, and alert rules with their evaluation.
//!
//! Architecture invariant: pure. Values in, values out: no clock, file, database, network,
//! async runtime or logging, so nothing here can fail on IO or block an executor
//! (`tests/layers.rs` walks the whole folder). Odd data becomes a flag or a warning,
//! never a panic.

pub mod advice;
pub mod alerts;
pub mod analyze;
pub mod attr_json;
pub mod budget;
pub mod model;
pub mod whatif;

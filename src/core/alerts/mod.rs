//! Alerts on budget-burning hops: rules (`rules.rs`), their evaluation (`eval.rs`) and the
//! notifications a state change sends (`notify.rs`).
//!
//! Architecture invariant: pure, like `analyze`: rules, rollups and the last instances in;
//! instances, history and notification bodies out. No clock, database or network
//! (`tests/layers.rs` checks the imports); `pipeline/alerter/` does the IO.

pub mod backtest;
pub mod eval;
pub mod notify;
pub mod rules;
pub mod silence;

//! Commands other than `serve`: `analyze` (the analysis of an OTLP/JSON file without a
//! server) and `demo` (a server and a live shop of instrumented services).
//!
//! Architecture invariant: clients of the library like any other; they reach a server only
//! through `server::start` or its OTLP endpoints.

pub mod analyze;
pub mod demo;

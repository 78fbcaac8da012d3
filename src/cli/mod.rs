//! Commands other than `serve`: `analyze` (the analysis of an OTLP/JSON file without a
//! server), `advise` (the advisor's findings from a database or a server) and `demo` (a
//! server and a live shop of instrumented services).
//!
//! Architecture invariant: clients of the library like any other; they reach a server only
//! through `server::start`, its OTLP endpoints or its HTTP API.

pub mod advise;
pub mod analyze;
pub mod demo;

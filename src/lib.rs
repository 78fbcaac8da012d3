//! budgetscope: an OTLP trace endpoint that shows where each request's deadline budget went.
//!
//! The layers, in the order data flows through them; each imports only the layers declared
//! before it (`tests/layers.rs` checks it). ARCHITECTURE.md has the map.

/// The wall clock, read in one place.
pub mod clock;

/// Pure: the span model, budgets, the analysis, alert rules and their evaluation.
pub mod core;

/// OTLP in and out: decoding, normalize, the deadline metrics, the download, generated traces.
pub mod otlp;

/// SQLite and Postgres: every SQL statement.
pub mod store;

/// Receiver, ingest, held spans, the analyzer and its lag, memory, lease, alert runner.
pub mod pipeline;

/// The UI, the JSON and Jaeger APIs, `/metrics`.
pub mod web;

/// The process: config, listeners, TLS, the OTLP endpoints, and `start`, which wires it all.
pub mod server;

/// The commands beside `serve`: `analyze` and `demo`.
pub mod cli;

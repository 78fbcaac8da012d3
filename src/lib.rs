//! budgetscope: an OTLP trace endpoint that shows where each request's deadline budget went.
//!
//! Data flows one way: `receive` (OTLP decode) → `normalize` (our own `model::Span`) →
//! `ingest` (queue, group commit) → `store` (SQLite or Postgres) → `web` (JSON API).
//! ARCHITECTURE.md has the code map and each module's invariant.
pub mod alerter;
pub mod alerts;
pub mod analyze;
pub mod auth;
pub mod budget;
pub mod codec;
pub mod config;
pub mod demo;
pub mod export;
pub mod generate;
pub mod indexer;
pub mod ingest;
pub mod lease;
pub mod listen;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod normalize;
pub mod offline;
pub mod receive;
pub mod recent;
pub mod server;
pub mod status;
pub mod store;
pub mod tls;
pub mod web;

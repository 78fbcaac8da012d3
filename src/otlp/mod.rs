//! OTLP in and out: the only layer that reads OpenTelemetry's protocol types. Request
//! bodies are decoded (`decode.rs`: one path per format, for traces and metrics), spans
//! normalised into
//! `core::model::Span`, the deadline metrics read into per-hop deltas, stored spans turned
//! back into an OTLP download, and traces generated for the demo, tests and benchmarks.
//!
//! Architecture invariant: no database, no network, no shared state; one bad span costs
//! only itself (a rejection with its reason), never its neighbours.

pub mod deadline_metrics;
pub mod decode;
pub mod download;
pub mod generate;
pub mod json;
pub mod json_spans;
pub mod normalize;
pub mod protobuf;
pub mod protobuf_metrics;

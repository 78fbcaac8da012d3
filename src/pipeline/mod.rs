//! The running pipeline between a decoded request and the store, and the background work
//! on what is stored: the receiver (admission, then commit), the ingest writers, spans held
//! for the analyzer, the background analyzer, how far it lags, the memory budget, the lease
//! on one-server work, retention, the alert runner and the counters `/metrics` shows.
//!
//! Architecture invariant: talks to the database only through `store` traits and to
//! clients not at all: it neither listens nor renders; what it acknowledges was committed.

pub mod alerter;
pub mod analyzer;
pub mod health;
pub mod held;
pub mod ingest;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod reanalysis;
pub mod receiver;
pub mod retention;
pub mod status;

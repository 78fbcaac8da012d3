//! Storage, by role: `SpanWriter` (ingest), `TraceReader` (spans, search, services),
//! `AnalysisQueue` (traces waiting for analysis, summaries), `RollupStore` (hop rollups and
//! deadline metrics), `LeaseStore` and `AlertStore`; `Store` is all of them with retention.
//! Each role is a small trait with query structs (`query.rs`), implemented once for
//! `SqlStore<B>` over a `Backend` (`backend.rs`): SQLite (`sqlite.rs`) or Postgres
//! (`postgres.rs`). Adding a read means the trait's method, its one SQL, and a case in
//! `tests/store_conformance.rs`.
//!
//! Architecture invariant: every SQL statement lives in this module, written once where the
//! two databases can run it alike; no other module writes SQL. Both backends pass the same
//! conformance suite. Inserts are idempotent on (trace id, span id): the first copy stored
//! wins, so exporter retries never duplicate a span.
//!
//! The tables:
//! - `spans`: one row per span keyed by (trace id, span id), with the columns queries need
//!   (service, name, kind, times as signed 64-bit unix nanoseconds, status, budget) and
//!   three JSON text columns (`attributes`, `resource`, `details`; `core::attr_json`).
//!   `operations` (service, name, kind, last seen) lists services without scanning spans.
//! - `trace_blocks`: once analysed, a trace's rows move into one zstd-compressed block
//!   (`blocks.rs`); every read of a trace's spans takes its block and its rows together,
//!   the first copy of a span id winning. The per-trace reads of a trace with a block
//!   (outline, span list, counts) are worked out in Rust over block and rows, of one
//!   without (large traces stay rows) by the database, both held to the same answers by
//!   the conformance suite; attribute filters always run in Rust. Blocks, summaries'
//!   hop samples and summaries' packed detail are compressed with a zstd dictionary of
//!   their kind trained on the store's first ones (`zstd_dictionaries`, `dictionary.rs`).
//! - `trace_summaries`: one row per analysed trace: in columns what searches filter and
//!   order on, packed the rest (`packed_detail`: names, flag counts, services, operations,
//!   origins, which searches find through the terms) and its hop samples (`packed_hops`:
//!   compressed JSON); summaries from before keep those as text (`hops`, …);
//!   `trace_terms`: an inverted index over services, operations, flags, origins and
//!   outcome (except "ok", which a search finds by reading the summaries in time order),
//!   keyed (term id, start, trace id) on Postgres and (term id, start second, summary id)
//!   on SQLite (`search::TermLayout`), each term's text kept once in `search_terms`. A
//!   search drives from its most selective term newest first (on SQLite sorting each
//!   second's rows), looks each other term it asks for up by its key, and stops at its
//!   limit; pagination is keyset on (start, trace id).
//! - `hop_rollups`, `hop_rollups_hourly`: per (hop, minute or hour) counts and three
//!   log-bucket histograms, merged by adding; a re-analysed trace's old contribution is
//!   subtracted and the new one added in the summary's transaction (`summaries.rs`).
//! - `hop_metrics`: the deadline metrics per (hop, minute), added to by every write
//!   (`rollup.rs`), so deltas from any number of exporters and servers sum.
//! - Traces waiting for analysis: SQLite appends (commit time, trace) to `trace_marks` with
//!   the spans; Postgres upserts one row per trace in `dirty_traces`. The analyzer deletes
//!   exactly the marks it read, so a span arriving meanwhile brings the trace back.
//! - `leases`, and the alert tables (`alerts.rs`).
//!
//! A SQLite file is one process's (`sqlite::lock_path`); Postgres takes several servers.

mod alerts;
mod backend;
mod blocks;
mod compaction;
mod dictionary;
mod edges;
mod error;
mod leases;
pub mod partitions;
pub mod postgres;
pub mod query;
mod queue;
mod reported;
mod rollup;
mod rows;
mod search;
mod seen;
mod spans;
pub mod sqlite;
mod summaries;
mod trace_scan;
mod upkeep;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::core::alerts::eval::Instance;
use crate::core::alerts::notify::Notification;
use crate::core::alerts::silence::Silence;
use crate::core::analyze::AnalysisVersion;
use crate::core::analyze::edges::{EdgeKey, EdgeRollup};
use crate::core::analyze::hops::{HopRollupRow, HopSample, ReportedRow, Rollup, RollupKey};
use crate::core::analyze::summary::TraceSummary;
use crate::core::model::{Span, SpanId, SpanKind, TraceId};
pub use alerts::AlertWrite;
pub use backend::{Backend, SqlStore};
pub use compaction::Compacted;
pub use error::{Fault, StoreError};
pub use partitions::{PartitionPlan, PartitionsKept};
use query::{
    Backlog, Cursor, DueQuery, HistoryQuery, MetricsQuery, NotificationQuery, RollupQuery,
    SpanListCounts, SpanListQuery, SpanPosition, StaleQuery, TraceOutline, TraceQuery, TraceSize,
    TracesWithin,
};
pub use query::{DiskUsage, TraceSet};
pub use rows::{EncodedBatch, OperationRow, SpanRow, batch_operations, encode_rows};

/// A (service, span name, kind) seen in stored spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub name: String,
    pub kind: SpanKind,
}

/// The ingest writer's role: committing spans.
#[async_trait]
pub trait SpanWriter: Send + Sync {
    /// Stores a batch in one transaction: all of it or none. Spans already stored are kept
    /// as they are; the batch's traces are marked for analysis.
    async fn write_batch(&self, batch: &EncodedBatch) -> Result<(), StoreError>;

    /// Encodes and stores spans in one transaction.
    async fn write_spans(&self, spans: &[Span]) -> Result<(), StoreError> {
        self.write_batch(&EncodedBatch::encode(spans)).await
    }
}

/// Reading spans and searching traces: the pages, the API and the analyzer's reads.
#[async_trait]
pub trait TraceReader: Send + Sync {
    /// All spans of a trace, ordered by start time; empty when unknown.
    async fn trace(&self, trace_id: TraceId) -> Result<Vec<Span>, StoreError>;

    /// All spans of several traces, in no particular order.
    async fn traces(&self, trace_ids: &[TraceId]) -> Result<Vec<Span>, StoreError>;

    /// Spans of whole traces among `trace_ids`, read in trace-id order while the text of
    /// their rows stays within `max_bytes` (the first trace read may take up to
    /// `max_trace_bytes`); a trace past `max_trace_bytes` on its own is listed as too large
    /// instead: the analyzer's pass, bounded by its share of the memory budget.
    async fn traces_within(
        &self,
        trace_ids: &[TraceId],
        max_bytes: u64,
        max_trace_bytes: u64,
    ) -> Result<TracesWithin, StoreError>;

    /// A trace described without reading its spans (`TraceOutline`); None when it has none.
    async fn trace_outline(&self, trace_id: TraceId) -> Result<Option<TraceOutline>, StoreError>;

    /// The size of `trace_ids` together, counted without holding their rows: what a read of
    /// them reserves in the memory budget first.
    async fn trace_size(&self, trace_ids: &[TraceId]) -> Result<TraceSize, StoreError>;

    /// At most `limit` spans of a trace in span-id order, after `after`: a trace read piece
    /// by piece (the streamed OTLP download), each piece a range of the primary key.
    async fn trace_page(
        &self,
        trace_id: TraceId,
        after: Option<SpanId>,
        limit: u32,
    ) -> Result<Vec<Span>, StoreError>;

    /// A page of one trace's spans in start order (`SpanListQuery`); backwards, still in
    /// start order. Holds `limit` spans whatever the trace's size.
    async fn trace_span_list(
        &self,
        trace_id: TraceId,
        query: &SpanListQuery<'_>,
    ) -> Result<Vec<Span>, StoreError>;

    /// The counts a page of `trace_span_list` shows: the trace's spans, those matching
    /// `find`, and those of them before `before`.
    async fn trace_span_counts(
        &self,
        trace_id: TraceId,
        find: Option<&str>,
        before: Option<SpanPosition>,
    ) -> Result<SpanListCounts, StoreError>;

    /// How many spans are stored of each of `trace_ids` (traces with none are left out): the
    /// analyzer's check that the spans it holds in memory are all of a trace's.
    async fn span_counts(&self, trace_ids: &[TraceId])
    -> Result<HashMap<TraceId, u64>, StoreError>;

    /// How many spans are stored.
    async fn span_count(&self) -> Result<u64, StoreError>;

    /// Service names, sorted.
    async fn services(&self) -> Result<Vec<String>, StoreError>;

    /// Operations of one service, sorted by name then kind.
    async fn operations(&self, service: &str) -> Result<Vec<Operation>, StoreError>;

    /// Summaries matching the query, newest first.
    async fn search_traces(&self, query: &TraceQuery) -> Result<Vec<TraceSummary>, StoreError>;

    /// The stored hop samples of the analysed traces among `trace_ids`: what the hop page
    /// and the alerter read of many traces instead of analysing each again.
    async fn hop_samples(
        &self,
        trace_ids: &[TraceId],
    ) -> Result<HashMap<TraceId, Vec<HopSample>>, StoreError>;
}

/// Traces waiting for analysis, and the summaries analysis writes.
#[async_trait]
pub trait AnalysisQueue: Send + Sync {
    /// What waits for analysis; traces still receiving spans count as active when they
    /// have waited since before `quiet_before`.
    async fn analysis_backlog(&self, quiet_before: u64) -> Result<Backlog, StoreError>;

    /// The traces due for analysis (`DueQuery`), longest waiting first, each with the
    /// commit time of every mark it holds before `quiet_before` (pass them back to
    /// `write_summaries`): a trace marked by several commits may appear more than once.
    /// On Postgres the traces returned are claimed for `CLAIM`: other servers sharing the
    /// database pass them over until they are written, a span arrives, or the claim ends
    /// (a SQLite database has one server).
    async fn due_traces(&self, query: &DueQuery) -> Result<Vec<(TraceId, i64)>, StoreError>;

    /// Clears the `analysed` marks that are still there and writes the summaries of the
    /// traces still waiting (and of traces given without marks), each replacing the trace's
    /// earlier contribution to the hop rollups. A trace whose marks are all gone (another
    /// server wrote it) is not written; one with a mark left (a span arrived since) is, and
    /// comes back for another analysis, its wait counted from its last commit. One
    /// transaction.
    /// Returns the per-minute rollup changes it made.
    async fn write_summaries(
        &self,
        traces: &[(TraceSummary, Vec<HopSample>)],
        analysed: &[(TraceId, i64)],
    ) -> Result<Vec<(RollupKey, Rollup)>, StoreError>;

    /// The positions (start, trace id) of summaries analysed otherwise than
    /// `query.version`, newest first.
    async fn stale_summaries(&self, query: &StaleQuery) -> Result<Vec<Cursor>, StoreError>;

    /// How many summaries were analysed otherwise than `version`.
    async fn stale_summary_count(&self, version: AnalysisVersion) -> Result<u64, StoreError>;

    /// Writes the summaries of re-analysed traces, each only where the stored summary still
    /// exists and was analysed otherwise than `version` (a trace analysed since, or deleted,
    /// is left as it is), replacing its earlier contribution to the hop rollups. One
    /// transaction; returns the per-minute rollup changes it made.
    async fn rewrite_summaries(
        &self,
        traces: &[(TraceSummary, Vec<HopSample>)],
        version: AnalysisVersion,
    ) -> Result<Vec<(RollupKey, Rollup)>, StoreError>;
}

/// Per-hop statistics: the rollups analysis writes and the deadline metrics exporters send.
#[async_trait]
pub trait RollupStore: Send + Sync {
    /// Hop rollups of `query`'s range (minute-aligned) and hops.
    async fn hop_rollups(&self, query: &RollupQuery<'_>) -> Result<Vec<HopRollupRow>, StoreError>;

    /// Each call edge summed over `query`'s range (minute-aligned; each row's minute is
    /// `since`); `query.service` keeps the edges it calls or is called on (`operation` is
    /// not read).
    async fn edge_rollups(
        &self,
        query: &RollupQuery<'_>,
    ) -> Result<Vec<(EdgeKey, EdgeRollup)>, StoreError>;

    /// Adds the hops' deadline metrics (deltas, distinct keys) to their minutes, in one
    /// transaction.
    async fn add_reported(&self, rows: &[ReportedRow]) -> Result<(), StoreError>;

    /// Each hop's deadline metrics over `query`'s range, summed or per minute.
    async fn reported(&self, query: &MetricsQuery<'_>) -> Result<Vec<ReportedRow>, StoreError>;
}

/// The lease on the work one server does at a time (`pipeline::lease`).
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Takes or renews the lease `name` for `holder` until `until` (unix nanoseconds) when
    /// it is free, expired at `now`, or `holder`'s already; returns whether `holder` holds it.
    async fn hold_lease(
        &self,
        name: &str,
        holder: &str,
        now: u64,
        until: u64,
    ) -> Result<bool, StoreError>;

    /// Gives up the lease `name` if `holder` holds it, so another server can take it at once.
    async fn release_lease(&self, name: &str, holder: &str) -> Result<(), StoreError>;
}

/// Alert state: what the alert runner and the alert pages read and write.
#[async_trait]
pub trait AlertStore: Send + Sync {
    /// Every alert instance that is not inactive, by rule and hop.
    async fn alert_instances(&self) -> Result<Vec<Instance>, StoreError>;

    /// Writes what an evaluation pass decided (instances, history, notifications to send)
    /// in one transaction, so a notification is queued exactly when its change is stored.
    async fn save_alerts(&self, write: &AlertWrite) -> Result<(), StoreError>;

    /// Evaluations of instances while pending or firing, newest first.
    async fn alert_history(&self, query: &HistoryQuery) -> Result<Vec<Instance>, StoreError>;

    /// Notifications whose next attempt is due at `now`, oldest first.
    async fn due_notifications(
        &self,
        now_unix_nano: u64,
        limit: u32,
    ) -> Result<Vec<Notification>, StoreError>;

    /// The delivery log (every notification, pending or not), newest first.
    async fn notifications(
        &self,
        query: &NotificationQuery<'_>,
    ) -> Result<Vec<Notification>, StoreError>;

    /// Stores the outcome of a delivery attempt (attempts, next attempt, delivery, error).
    async fn record_attempt(&self, notification: &Notification) -> Result<(), StoreError>;

    /// Deletes alert history, finished notifications and silences that ended before the
    /// cutoff.
    async fn delete_alerts_before(&self, cutoff_unix_nano: u64) -> Result<u64, StoreError>;

    /// (name, definition JSON) of the alert rules created in the UI or the API.
    async fn alert_rule_specs(&self) -> Result<Vec<(String, String)>, StoreError>;

    /// Creates or replaces a stored alert rule.
    async fn put_alert_rule(
        &self,
        name: &str,
        definition: &str,
        now_unix_nano: u64,
    ) -> Result<(), StoreError>;

    /// Deletes a stored alert rule; false when there was none of that name.
    async fn delete_alert_rule(&self, name: &str) -> Result<bool, StoreError>;

    /// Every silence, newest first.
    async fn silences(&self) -> Result<Vec<Silence>, StoreError>;

    /// Inserts a silence (id 0) or updates one; returns its id.
    async fn put_silence(&self, silence: &Silence) -> Result<i64, StoreError>;
}

/// The whole database: every role, and what spans them all.
#[async_trait]
pub trait Store:
    SpanWriter + TraceReader + AnalysisQueue + RollupStore + LeaseStore + AlertStore + 'static
{
    /// "sqlite" or "postgres".
    fn backend(&self) -> &'static str;

    /// Succeeds when the database answers a trivial query.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Retention: deletes at most `limit` spans that started before the cutoff, with the
    /// summaries, index terms and rollups of that time and operations last seen before it.
    /// Returns how many spans were deleted.
    async fn delete_before(&self, cutoff_unix_nano: u64, limit: u32) -> Result<u64, StoreError>;

    /// Retention by value, and the disk cap: deletes the spans, summary and index terms of
    /// at most `limit` (≤ 500) analysed traces of `set` that started before the cutoff,
    /// oldest first. Rollups keep counting them; a trace not analysed yet is never deleted
    /// here. Returns how many traces were deleted.
    async fn delete_traces_before(
        &self,
        cutoff_unix_nano: u64,
        set: TraceSet,
        limit: u32,
    ) -> Result<u64, StoreError>;

    /// Moves the span rows of analysed `traces` into each trace's compressed block
    /// (`blocks.rs`), a trace whose text would pass `max_trace_bytes` left as rows. Rows
    /// stored meanwhile stay rows; every read sees the same spans before and after.
    async fn compact(
        &self,
        traces: &[TraceId],
        max_trace_bytes: u64,
    ) -> Result<Compacted, StoreError>;

    /// Compacts up to `limit` of the traces the analyzer wrote whole (`write_summaries`)
    /// and that still wait for it, oldest first, as `compact` does, and takes them off
    /// the wait; returns what it did and how many it took (0 when none waits). The wait is
    /// stored: a restart loses none of it.
    async fn compact_due(
        &self,
        limit: u32,
        max_trace_bytes: u64,
    ) -> Result<(Compacted, usize), StoreError>;

    /// How many analysed traces wait for `compact_due` (a count of the whole wait).
    async fn compaction_waiting(&self) -> Result<u64, StoreError>;

    /// What the store takes on disk.
    async fn disk_usage(&self) -> Result<DiskUsage, StoreError>;

    /// Retention on Postgres: drops the time partitions `plan`'s retentions are past and
    /// creates those ahead of `now_unix_nano` (`partitions.rs`); nothing on SQLite, whose rows retention
    /// deletes one by one.
    async fn keep_partitions(
        &self,
        plan: PartitionPlan,
        now_unix_nano: u64,
    ) -> Result<PartitionsKept, StoreError>;
}

/// How long a trace one server's analyzer took is passed over by the others
/// (`due_traces`): far longer than a pass takes, and all a server's death delays its
/// traces by.
pub const CLAIM: std::time::Duration = std::time::Duration::from_secs(30);

/// Opens the store a database URL names and brings its schema up to date.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(
            SqlStore::open(postgres::PostgresBackend::connect(url).await?).await?,
        ))
    } else {
        Ok(Arc::new(
            SqlStore::open(sqlite::SqliteBackend::connect(url).await?).await?,
        ))
    }
}

//! Span storage: one trait, a SQLite and a Postgres implementation.
//!
//! Architecture invariant: every SQL statement lives in this module (`sqlite.rs`,
//! `postgres.rs`, and the parts written once for both); no other module writes SQL. Both
//! implementations pass the same conformance suite (`tests/store_conformance.rs`). Inserts
//! are idempotent on (trace id, span id): the first copy stored wins, so exporter retries
//! never duplicate a span.
//!
//! The tables:
//! - `spans`: one row per span keyed by (trace id, span id), with the columns queries need
//!   (service, name, kind, times as signed 64-bit unix nanoseconds, status, budget) and
//!   three JSON text columns (`attributes`, `resource`, `details`; `core::attr_json`).
//!   `operations` (service, name, kind, last seen) lists services without scanning spans.
//! - `trace_summaries`: one row per analysed trace, with its hop samples (`hops`, JSON);
//!   `trace_terms`: an inverted index (term, start, trace) over services, operations,
//!   flags and outcome. A search drives from its most selective term newest first and
//!   stops at its limit; pagination is keyset on (start, trace id).
//! - `hop_rollups`, `hop_rollups_hourly`: per (hop, minute or hour) counts and three
//!   log-bucket histograms, merged by adding; a re-analysed trace's old contribution is
//!   subtracted and the new one added in the summary's transaction (`summaries.rs`).
//! - `hop_metrics`: the deadline metrics per (hop, minute), added to by every write
//!   (`reported.rs`), so deltas from any number of exporters and servers sum.
//! - Traces waiting for analysis: SQLite appends (commit time, trace) to `trace_marks` with
//!   the spans; Postgres upserts one row per trace in `dirty_traces`. The analyzer deletes
//!   exactly the marks it read, so a span arriving meanwhile brings the trace back.
//! - `leases`, and the alert tables (`alerts.rs`).

pub mod alerts;
mod leases;
pub mod postgres;
pub mod query;
pub mod reported;
pub mod rollup;
pub mod sqlite;
mod summaries;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::core::analyze::AnalysisVersion;
use crate::core::analyze::hops::HopSample;
use crate::core::analyze::hops::Rollup;
use crate::core::analyze::hops::{HopRollupRow, ReportedRow, RollupKey};
use crate::core::analyze::summary::TraceSummary;
use crate::core::attr_json;
use crate::core::model::{Budget, Span, SpanId, SpanKind, Status, StatusCode, TraceId};
pub use alerts::AlertStore;
use query::{Cursor, StaleQuery, TraceQuery};

/// What can go wrong in a store. Messages are for logs; the web and receiver layers map
/// these to their own responses and never show database text to clients.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or refused the work; retrying later may succeed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Stored data that cannot be read back (a bug or a hand-edited database).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        StoreError::Unavailable(error.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(error: sqlx::migrate::MigrateError) -> Self {
        StoreError::Unavailable(format!("migration failed: {error}"))
    }
}

/// A (service, span name, kind) seen in stored spans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub name: String,
    pub kind: SpanKind,
}

/// Spans, summaries and hop rollups; alert state through its supertrait `AlertStore`.
#[async_trait]
pub trait Store: AlertStore + Send + Sync + 'static {
    /// "sqlite" or "postgres".
    fn backend(&self) -> &'static str;

    /// Succeeds when the database answers a trivial query.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Stores a batch in one transaction: all of it or none. Spans already stored are kept
    /// as they are.
    async fn write_batch(&self, batch: &EncodedBatch) -> Result<(), StoreError>;

    /// Encodes and stores spans in one transaction.
    async fn write_spans(&self, spans: &[Span]) -> Result<(), StoreError> {
        self.write_batch(&EncodedBatch::encode(spans)).await
    }

    /// All spans of a trace, ordered by start time; empty when unknown.
    async fn trace(&self, trace_id: TraceId) -> Result<Vec<Span>, StoreError>;

    /// All spans of several traces, in no particular order.
    async fn traces(&self, trace_ids: &[TraceId]) -> Result<Vec<Span>, StoreError>;

    /// Spans of whole traces among `trace_ids`, read in trace-id order until the text of
    /// their rows passes `max_bytes` (always at least one trace), and the bytes read: the
    /// background analyzer's pass, bounded by its share of the memory budget.
    async fn traces_within(
        &self,
        trace_ids: &[TraceId],
        max_bytes: u64,
    ) -> Result<(Vec<Span>, u64), StoreError>;

    /// How many spans are stored of each of `trace_ids` (traces with none are left out): the
    /// analyzer's check that the spans it holds in memory are all of a trace's.
    async fn span_counts(&self, trace_ids: &[TraceId])
    -> Result<HashMap<TraceId, u64>, StoreError>;

    /// Service names, sorted.
    async fn services(&self) -> Result<Vec<String>, StoreError>;

    /// Operations of one service, sorted by name then kind.
    async fn operations(&self, service: &str) -> Result<Vec<Operation>, StoreError>;

    /// Deletes at most `limit` spans that started before the cutoff, and operations last
    /// seen before it. Returns how many spans were deleted.
    async fn delete_before(&self, cutoff_unix_nano: u64, limit: u32) -> Result<u64, StoreError>;

    /// How many spans are stored.
    async fn span_count(&self) -> Result<u64, StoreError>;

    /// Traces waiting for analysis, and when the one waiting longest last had spans
    /// committed (unix nanoseconds; `None` when none waits).
    async fn analysis_backlog(&self) -> Result<(u64, Option<u64>), StoreError>;

    /// Up to `limit` traces whose last spans were committed before `received_before`,
    /// oldest first, each with the commit time of every mark it holds (pass them back to
    /// `write_summaries`): a trace marked by several commits may appear more than once.
    /// On Postgres the traces returned are claimed for `CLAIM`: other servers sharing the
    /// database pass them over until they are written, a span arrives, or the claim ends
    /// (a SQLite database has one server).
    async fn quiet_traces(
        &self,
        received_before: u64,
        limit: u32,
    ) -> Result<Vec<(TraceId, i64)>, StoreError>;

    /// Clears the `analysed` marks that are still there and writes the summaries of the
    /// traces whose marks it cleared (and of traces given without marks), each replacing
    /// the trace's earlier contribution to the hop rollups. A trace whose mark is gone
    /// (another server wrote it) or changed (a span arrived since) is not written; a changed
    /// mark brings it back for another analysis. One transaction.
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

    /// Hop rollups for `[since, until)` (minute-aligned), optionally of one service or
    /// operation. With `hourly`, whole hours inside the range come as one row per hour
    /// (`minute_unix_nano` is then the hour's start) and only the edges as minute rows.
    async fn hop_rollups(
        &self,
        since_unix_nano: u64,
        until_unix_nano: u64,
        service: Option<&str>,
        operation: Option<&str>,
        hourly: bool,
    ) -> Result<Vec<HopRollupRow>, StoreError>;

    /// Adds the hops' deadline metrics (deltas, distinct keys) to their minutes, in one
    /// transaction.
    async fn add_reported(&self, rows: &[ReportedRow]) -> Result<(), StoreError>;

    /// Each hop's deadline metrics summed over `[since, until)` (minute-aligned; each
    /// row's minute is `since`), or each minute's when `by_minute`, optionally of one
    /// service or operation.
    async fn reported(
        &self,
        since_unix_nano: u64,
        until_unix_nano: u64,
        service: Option<&str>,
        operation: Option<&str>,
        by_minute: bool,
    ) -> Result<Vec<ReportedRow>, StoreError>;

    /// Summaries matching the query, newest first.
    async fn search_traces(&self, query: &TraceQuery) -> Result<Vec<TraceSummary>, StoreError>;

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

/// How long a trace one server's analyzer took is passed over by the others
/// (`quiet_traces`): far longer than a pass takes, and all a server's death delays its
/// traces by.
pub const CLAIM: std::time::Duration = std::time::Duration::from_secs(30);

/// Opens the store a database URL names and brings its schema up to date.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(postgres::PostgresStore::connect(url).await?))
    } else {
        Ok(Arc::new(sqlite::SqliteStore::connect(url).await?))
    }
}

/// A span encoded into column values, shared by both backends' inserts.
pub struct SpanRow {
    pub(crate) trace_id: [u8; TraceId::LEN],
    pub(crate) span_id: [u8; SpanId::LEN],
    pub(crate) parent_span_id: Option<[u8; SpanId::LEN]>,
    pub(crate) service: String,
    pub(crate) name: String,
    pub(crate) kind: i16,
    pub(crate) start_unix_nano: i64,
    pub(crate) end_unix_nano: i64,
    pub(crate) status_code: i16,
    pub(crate) status_message: String,
    pub(crate) budget_ms: Option<f64>,
    pub(crate) budget_source: Option<String>,
    pub(crate) attributes: String,
    /// Shared by the rows of spans with the same resource (`encode_rows`).
    pub(crate) resource: Arc<str>,
    /// Shared by consecutive rows whose details are the same (`encode_rows`).
    pub(crate) details: Arc<str>,
}

/// A (service, name, kind) and the latest start seen for it in a batch.
pub(crate) type OperationRow = (String, String, i16, i64);

/// Spans encoded for insertion, with the operations they touch. Encoding is CPU work done
/// by the request that brought the spans, so the writer only runs the insert.
pub struct EncodedBatch {
    pub(crate) rows: Vec<SpanRow>,
    pub(crate) operations: Vec<OperationRow>,
    /// The distinct trace ids of the rows, sorted: marked dirty for the analyzer.
    pub(crate) traces: Vec<[u8; TraceId::LEN]>,
}

impl EncodedBatch {
    /// `from_spans` on a copy of the spans (tests, the demo and offline paths).
    pub fn encode(spans: &[Span]) -> EncodedBatch {
        EncodedBatch::from_spans(spans.to_vec())
    }

    /// `encode`, taking the spans apart instead of copying their text (the ingest path).
    pub fn from_spans(spans: Vec<Span>) -> EncodedBatch {
        let mut traces: Vec<_> = spans.iter().map(|s| s.trace_id.0).collect();
        traces.sort_unstable();
        traces.dedup();
        EncodedBatch {
            operations: batch_operations(&spans),
            rows: encode_rows(spans),
            traces,
        }
    }

    pub fn empty() -> EncodedBatch {
        EncodedBatch {
            rows: Vec::new(),
            operations: Vec::new(),
            traces: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// One batch of all the rows; operations deduplicated (a Postgres upsert may not touch
    /// a row twice) and sorted (concurrent upserts lock rows in one order).
    pub fn merge(batches: Vec<EncodedBatch>) -> EncodedBatch {
        let mut merged = EncodedBatch::empty();
        for batch in batches {
            merged.rows.extend(batch.rows);
            merged.operations.extend(batch.operations);
            merged.traces.extend(batch.traces);
        }
        merged.traces.sort();
        merged.traces.dedup();
        merged.operations.sort();
        merged.operations.dedup_by(|later, earlier| {
            let same = (&later.0, &later.1, later.2) == (&earlier.0, &earlier.1, earlier.2);
            if same {
                earlier.3 = earlier.3.max(later.3);
            }
            same
        });
        merged
    }
}

/// Encodes spans for insertion, moving their text into the rows. The spans of one OTLP
/// `ResourceSpans` share one resource, so its JSON is written once per run of spans sharing
/// it; so are the details of consecutive spans of one scope that have no events, links or
/// warnings (most spans).
pub fn encode_rows(spans: Vec<Span>) -> Vec<SpanRow> {
    let mut rows = Vec::with_capacity(spans.len());
    let mut last_resource: Option<(Arc<crate::core::model::Attributes>, Arc<str>)> = None;
    let mut last_plain_details: Option<(crate::core::model::Scope, Arc<str>)> = None;
    for span in spans {
        let resource = match &last_resource {
            Some((shared, json))
                if Arc::ptr_eq(shared, &span.resource) || **shared == *span.resource =>
            {
                json.clone()
            }
            _ => {
                let json: Arc<str> = attr_json::attributes_to_string(&span.resource).into();
                last_resource = Some((span.resource.clone(), json.clone()));
                json
            }
        };
        let plain = span.events.is_empty() && span.links.is_empty() && span.warnings.is_empty();
        let details: Arc<str> = match &last_plain_details {
            Some((scope, json)) if plain && *scope == span.scope => json.clone(),
            _ => {
                let json: Arc<str> = attr_json::details_to_string(
                    &span.scope,
                    &span.events,
                    &span.links,
                    &span.warnings,
                )
                .into();
                if plain {
                    last_plain_details = Some((span.scope.clone(), json.clone()));
                }
                json
            }
        };
        let (budget_ms, budget_source) = match span.budget {
            Some(budget) => (Some(budget.ms), Some(budget.source)),
            None => (None, None),
        };
        rows.push(SpanRow {
            trace_id: span.trace_id.0,
            span_id: span.span_id.0,
            parent_span_id: span.parent_span_id.map(|p| p.0),
            kind: span.kind.as_i32() as i16,
            // normalize rejects timestamps above i64::MAX.
            start_unix_nano: i64::try_from(span.start_unix_nano).unwrap_or(i64::MAX),
            end_unix_nano: i64::try_from(span.end_unix_nano).unwrap_or(i64::MAX),
            status_code: span.status.code.as_i32() as i16,
            budget_ms,
            budget_source,
            attributes: attr_json::attributes_to_string(&span.attributes),
            resource,
            details,
            service: span.service,
            name: span.name,
            status_message: span.status.message,
        });
    }
    rows
}

/// The distinct (service, name, kind, latest start) of a batch, for the operations table.
pub fn batch_operations(spans: &[Span]) -> Vec<OperationRow> {
    let mut seen: std::collections::HashMap<(&str, &str, i16), i64> = Default::default();
    for span in spans {
        let start = i64::try_from(span.start_unix_nano).unwrap_or(i64::MAX);
        let entry = seen
            .entry((&span.service, &span.name, span.kind.as_i32() as i16))
            .or_insert(start);
        *entry = (*entry).max(start);
    }
    let mut operations: Vec<_> = seen
        .into_iter()
        .map(|((service, name, kind), last)| (service.to_string(), name.to_string(), kind, last))
        .collect();
    operations.sort();
    operations
}

/// Rows of (trace id, start): positions in the summaries' newest-first order.
pub(crate) fn decode_positions(rows: Vec<(Vec<u8>, i64)>) -> Result<Vec<Cursor>, StoreError> {
    Ok(decode_marks(rows)?
        .into_iter()
        .map(|(trace_id, start)| Cursor {
            start_unix_nano: start.max(0) as u64,
            trace_id,
        })
        .collect())
}

/// Rows of (trace id, number): marks, or counts (`decode_counts`).
pub(crate) fn decode_marks(rows: Vec<(Vec<u8>, i64)>) -> Result<Vec<(TraceId, i64)>, StoreError> {
    rows.into_iter()
        .map(|(id, mark)| {
            TraceId::from_bytes(&id)
                .map(|id| (id, mark))
                .map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))
        })
        .collect()
}

const HOUR: u64 = 3_600_000_000_000;

/// Splits `[since, until)` into the rollup tables and ranges to read: whole hours from
/// `hop_rollups_hourly`, the edges from `hop_rollups`.
pub(crate) fn rollup_ranges(since: u64, until: u64, hourly: bool) -> Vec<(&'static str, u64, u64)> {
    let first_hour = since.div_ceil(HOUR) * HOUR;
    let last_hour = until - until % HOUR;
    if !hourly || first_hour >= last_hour {
        return vec![("hop_rollups", since, until)];
    }
    let mut ranges = vec![("hop_rollups_hourly", first_hour, last_hour)];
    if since < first_hour {
        ranges.push(("hop_rollups", since, first_hour));
    }
    if last_hour < until {
        ranges.push(("hop_rollups", last_hour, until));
    }
    ranges
}

/// One stored span row as read back, before decoding.
#[derive(sqlx::FromRow)]
pub(crate) struct StoredRow {
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Option<Vec<u8>>,
    pub service: String,
    pub name: String,
    pub kind: i16,
    pub start_unix_nano: i64,
    pub end_unix_nano: i64,
    pub status_code: i16,
    pub status_message: String,
    pub budget_ms: Option<f64>,
    pub budget_source: Option<String>,
    pub attributes: String,
    pub resource: String,
    pub details: String,
}

/// The column list both backends select, in `StoredRow` order.
pub(crate) const SPAN_COLUMNS: &str = "trace_id, span_id, parent_span_id, service, name, kind, \
     start_unix_nano, end_unix_nano, status_code, status_message, budget_ms, budget_source, \
     attributes, resource, details";

impl StoredRow {
    /// The row's size as read: its ids and text.
    fn text_bytes(&self) -> u64 {
        (self.trace_id.len()
            + self.span_id.len()
            + 8
            + self.service.len()
            + self.name.len()
            + self.status_message.len()
            + self.budget_source.as_ref().map_or(0, String::len)
            + self.attributes.len()
            + self.resource.len()
            + self.details.len()) as u64
    }

    pub fn decode(self) -> Result<Span, StoreError> {
        let corrupt =
            |what: &str, e: &dyn std::fmt::Display| StoreError::Corrupt(format!("{what}: {e}"));
        let json = |text: &str, what: &str| -> Result<Value, StoreError> {
            serde_json::from_str(text).map_err(|e| corrupt(what, &e))
        };
        let (scope, events, links, warnings) =
            attr_json::details_from_json(&json(&self.details, "details")?);
        Ok(Span {
            trace_id: TraceId::from_bytes(&self.trace_id).map_err(|e| corrupt("trace id", &e))?,
            span_id: SpanId::from_bytes(&self.span_id).map_err(|e| corrupt("span id", &e))?,
            parent_span_id: match self.parent_span_id {
                Some(bytes) => {
                    Some(SpanId::from_bytes(&bytes).map_err(|e| corrupt("parent span id", &e))?)
                }
                None => None,
            },
            service: self.service,
            name: self.name,
            kind: SpanKind::from_i32(self.kind.into()),
            start_unix_nano: self.start_unix_nano.max(0) as u64,
            end_unix_nano: self.end_unix_nano.max(0) as u64,
            status: Status {
                code: StatusCode::from_i32(self.status_code.into()),
                message: self.status_message,
            },
            attributes: attr_json::attributes_from_json(&json(&self.attributes, "attributes")?),
            resource: Arc::new(attr_json::attributes_from_json(&json(
                &self.resource,
                "resource",
            )?)),
            scope,
            events,
            links,
            budget: match (self.budget_ms, self.budget_source) {
                (Some(ms), Some(source)) => Some(Budget { ms, source }),
                _ => None,
            },
            warnings,
        })
    }
}

/// `Store::traces_within`'s rule, for rows in trace-id order: whole traces, until the rows'
/// text passes the limit.
pub(crate) struct Within {
    spans: Vec<Span>,
    bytes: u64,
    max_bytes: u64,
}

impl Within {
    pub fn new(max_bytes: u64) -> Within {
        Within {
            spans: Vec::new(),
            bytes: 0,
            max_bytes,
        }
    }

    /// Takes the next row; false, without taking it, when the limit is spent and the row
    /// starts another trace (stop reading).
    pub fn push(&mut self, row: StoredRow) -> Result<bool, StoreError> {
        if self.bytes >= self.max_bytes
            && self
                .spans
                .last()
                .is_some_and(|last| last.trace_id.0[..] != row.trace_id[..])
        {
            return Ok(false);
        }
        self.bytes += row.text_bytes();
        self.spans.push(row.decode()?);
        Ok(true)
    }

    pub fn finish(self) -> (Vec<Span>, u64) {
        (self.spans, self.bytes)
    }
}

pub(crate) fn decode_rows(rows: Vec<StoredRow>) -> Result<Vec<Span>, StoreError> {
    rows.into_iter().map(StoredRow::decode).collect()
}

pub(crate) fn decode_counts(
    rows: Vec<(Vec<u8>, i64)>,
) -> Result<HashMap<TraceId, u64>, StoreError> {
    Ok(decode_marks(rows)?
        .into_iter()
        .map(|(id, count)| (id, count.max(0) as u64))
        .collect())
}

pub(crate) fn decode_operations(rows: Vec<(String, i16)>) -> Vec<Operation> {
    rows.into_iter()
        .map(|(name, kind)| Operation {
            name,
            kind: SpanKind::from_i32(kind.into()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{HOUR, encode_rows, rollup_ranges};
    use crate::core::attr_json::details_to_string;
    use crate::core::model::{Event, Scope};

    #[test]
    fn rows_share_details_only_where_they_are_the_same() {
        let mut spans = crate::core::analyze::fixture::parse(
            "edge server \"a\" 0 10\n  edge client \"b\" 1 8\n  edge client \"c\" 2 7\n  edge client \"d\" 3 6\n  edge client \"e\" 4 5",
        );
        spans[1].events.push(Event {
            time_unix_nano: 5,
            name: "retry".into(),
            attributes: Vec::new(),
        });
        spans[2].warnings.push("a warning".into());
        spans[4].scope = Scope {
            name: "other".into(),
            version: "2".into(),
        };
        let expected: Vec<String> = spans
            .iter()
            .map(|s| details_to_string(&s.scope, &s.events, &s.links, &s.warnings))
            .collect();
        let details: Vec<String> = encode_rows(spans)
            .iter()
            .map(|row| row.details.to_string())
            .collect();
        assert_eq!(details, expected);
        assert_eq!(details[0], details[3], "plain spans of one scope share");
        assert_ne!(details[3], details[4]);
    }

    #[test]
    fn whole_hours_come_from_the_hourly_table_and_edges_from_minutes() {
        let minute = 60_000_000_000;
        let since = 10 * HOUR + 25 * minute;
        let until = 14 * HOUR + 5 * minute;
        assert_eq!(
            rollup_ranges(since, until, true),
            [
                ("hop_rollups_hourly", 11 * HOUR, 14 * HOUR),
                ("hop_rollups", since, 11 * HOUR),
                ("hop_rollups", 14 * HOUR, until),
            ]
        );
        assert_eq!(
            rollup_ranges(since, until, false),
            [("hop_rollups", since, until)]
        );
        assert_eq!(
            rollup_ranges(since, 10 * HOUR + 50 * minute, true),
            [("hop_rollups", since, 10 * HOUR + 50 * minute)]
        );
        assert_eq!(
            rollup_ranges(10 * HOUR, 12 * HOUR, true),
            [("hop_rollups_hourly", 10 * HOUR, 12 * HOUR)]
        );
    }
}

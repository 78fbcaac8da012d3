//! Trace search and summary rows, shared by both stores: the query struct the API fills,
//! and the column encoding of `TraceSummary`.

use std::collections::BTreeMap;

use crate::core::analyze::summary::TraceSummary;
use crate::core::analyze::{AnalysisVersion, Flag, Outcome};
use crate::core::model::{Span, SpanId, TraceId};
use sqlx::{Database, Encode, QueryBuilder, Type};

use super::StoreError;
use super::blocks::{Reader, put_optional_text, put_text};
use super::dictionary::Dictionaries;
use super::rollup::{ROLLUP_COLUMNS, pack_hops};
use crate::core::analyze::hops::HopSample;

/// A comparison on a span attribute: traces with at least one span where it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct AttrFilter {
    pub key: String,
    pub op: AttrOp,
    pub value: AttrOperand,
}

impl AttrFilter {
    /// `key OP value`, the value numeric when it reads as a finite number, else text; `None`
    /// when the key is empty or holds a `"` (keys are matched inside stored JSON).
    pub fn new(key: &str, op: AttrOp, value: &str) -> Option<AttrFilter> {
        let key = key.trim();
        if key.is_empty() || key.contains('"') {
            return None;
        }
        let value = value.trim();
        Some(AttrFilter {
            key: key.to_string(),
            op,
            value: match value.parse::<f64>() {
                Ok(n) if n.is_finite() => AttrOperand::Number(n),
                _ => AttrOperand::Text(value.to_string()),
            },
        })
    }
}

impl AttrFilter {
    /// Whether a span's attributes (`core::attr_json`'s object text) meet the filter: a
    /// number compares with a numeric attribute only; text compares with the attribute's
    /// text (a string as it is, anything else as its JSON).
    pub fn matches(&self, attributes: &str) -> bool {
        // Most spans do not hold the key at all: no need to parse them.
        if !attributes.contains(self.key.as_str()) {
            return false;
        }
        let Some(value) = crate::core::attr_json::value_of(attributes, &self.key) else {
            return false;
        };
        let order = match (&self.value, &value) {
            (AttrOperand::Number(n), serde_json::Value::Number(v)) => {
                v.as_f64().and_then(|v| v.partial_cmp(n))
            }
            (AttrOperand::Number(_), _) => None,
            (AttrOperand::Text(t), serde_json::Value::String(v)) => Some(v.as_str().cmp(t)),
            (AttrOperand::Text(t), other) => Some(other.to_string().as_str().cmp(t)),
        };
        order.is_some_and(|order| self.op.holds(order))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttrOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl AttrOp {
    /// Whether the attribute, ordered against the operand as `order`, meets the operator.
    pub fn holds(self, order: std::cmp::Ordering) -> bool {
        use std::cmp::Ordering::*;
        match self {
            AttrOp::Eq => order == Equal,
            AttrOp::Ne => order != Equal,
            AttrOp::Lt => order == Less,
            AttrOp::Le => order != Greater,
            AttrOp::Gt => order == Greater,
            AttrOp::Ge => order != Less,
        }
    }
}

/// Numbers compare numerically, anything else as text.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrOperand {
    Number(f64),
    Text(String),
}

/// Where a page of results ends: the last trace's start and id (results are newest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub start_unix_nano: u64,
    pub trace_id: TraceId,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!("{}-{}", self.start_unix_nano, self.trace_id.to_hex())
    }

    pub fn decode(text: &str) -> Option<Cursor> {
        let (start, id) = text.split_once('-')?;
        Some(Cursor {
            start_unix_nano: start.parse().ok()?,
            trace_id: TraceId::from_hex(id).ok()?,
        })
    }
}

/// Trace search. Every field narrows; `None` and empty do not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceQuery {
    /// Traces with a span of this service.
    pub service: Option<String>,
    /// Traces with a hop or root of this name (of `service`, when given).
    pub operation: Option<String>,
    pub flag: Option<Flag>,
    pub outcome: Option<Outcome>,
    /// Exceeded traces whose budget ran out at this hop: (service, operation).
    pub origin: Option<(String, String)>,
    pub min_duration_ms: Option<f64>,
    pub max_duration_ms: Option<f64>,
    pub min_budget_ms: Option<f64>,
    pub max_budget_ms: Option<f64>,
    /// Traces that started at or after this time.
    pub since_unix_nano: Option<u64>,
    /// Traces that started before this time.
    pub until_unix_nano: Option<u64>,
    pub attrs: Vec<AttrFilter>,
    pub limit: u32,
    pub cursor: Option<Cursor>,
}

impl TraceQuery {
    /// Whether a summary its terms found has the service and operation it asks for as one
    /// hop or root: its terms say only that the trace has both (`terms`).
    pub(crate) fn pair_matches(&self, summary: &TraceSummary) -> bool {
        match (&self.service, &self.operation) {
            (Some(service), Some(operation)) => summary
                .operations
                .iter()
                .any(|(s, n)| s == service && n == operation),
            _ => true,
        }
    }

    /// Whether some of what it asks is checked on the found summaries and their spans, so
    /// that a page of the database's answers may keep fewer than it holds.
    pub(crate) fn checked_after(&self) -> bool {
        !self.attrs.is_empty() || (self.service.is_some() && self.operation.is_some())
    }
}

/// The traces due for analysis: quiet ones, whose last spans were committed before
/// `quiet_before`, and ones still receiving spans that have waited since before
/// `waiting_before` (`--max-trace-wait`), at most `limit` traces, longest waiting first.
/// `waiting_before <= quiet_before`: of an active trace, the commits before `quiet_before`
/// are taken (SQLite's marks), the later ones bring it back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DueQuery {
    pub quiet_before: u64,
    pub waiting_before: u64,
    pub limit: u32,
}

impl DueQuery {
    /// Quiet traces only.
    pub fn quiet(quiet_before: u64, limit: u32) -> DueQuery {
        DueQuery {
            quiet_before,
            waiting_before: 0,
            limit,
        }
    }
}

/// How much of the store some traces take: their spans and the bytes of their rows as
/// `TraceReader::traces_within` counts them (ids and text), what a read of them holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceSize {
    pub spans: u64,
    pub bytes: u64,
}

/// What `TraceReader::traces_within` read: whole traces in id order within its limits.
#[derive(Debug, Default)]
pub struct TracesWithin {
    pub spans: Vec<Span>,
    /// The text of the rows in `spans` (`TraceSize::bytes`).
    pub bytes: u64,
    /// Traces whose rows alone pass the per-trace limit: not read (none of their spans
    /// are in `spans`).
    pub too_large: Vec<TraceId>,
    /// When reading stopped at the limit: the last trace read or found too large; the
    /// traces after it wait for another read.
    pub stopped_after: Option<TraceId>,
}

/// A trace described by the database without reading its spans: the summary of a trace
/// too large to analyse.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceOutline {
    pub trace_id: TraceId,
    pub span_count: u64,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// The service, name and budget of the first span without a parent (else the first span).
    pub root_service: String,
    pub root_name: String,
    pub root_budget_ms: Option<f64>,
    /// Its services, and the (service, name) of its server and consumer spans, sorted, at
    /// most `OUTLINE_NAMES` of each.
    pub services: Vec<String>,
    pub operations: Vec<(String, String)>,
}

/// The most services and operations an outline lists: a bound on what a trace with a
/// new name per span makes the analyzer hold.
pub const OUTLINE_NAMES: u32 = 1_000;

/// A span's place in a trace's start order (then span id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpanPosition {
    pub start_unix_nano: u64,
    pub span_id: SpanId,
}

/// Spans of one trace in start order, a page at a time (the page of a trace too large to
/// read whole): those matching `find` (service, name or attribute text, any case, or a
/// span id), from `from` on, or, `backwards`, the `limit` before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanListQuery<'a> {
    pub find: Option<&'a str>,
    pub from: Option<SpanPosition>,
    pub backwards: bool,
    pub limit: u32,
}

/// Counts over one trace for a page of its spans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpanListCounts {
    pub spans: u64,
    /// Spans matching `find` (all without one).
    pub matched: u64,
    /// Matching spans before the position given.
    pub before: u64,
    pub first_start_unix_nano: Option<u64>,
}

/// What waits for analysis, for `/api/status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Traces with spans not analysed yet.
    pub traces: u64,
    /// When the trace whose last commit is the oldest had it (unix nanoseconds).
    pub oldest_commit_unix_nano: Option<u64>,
    /// Traces still receiving spans that have waited since before the quiet cutoff given.
    pub active: u64,
}

/// What the store takes on disk, for `/api/status`, `/metrics` and `--max-disk`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskUsage {
    /// Bytes the store's files take: SQLite's database file and its WAL; on Postgres, this
    /// schema's tables with their indexes and TOAST.
    pub bytes: u64,
    /// SQLite's pages that hold data (its free pages are reused before the file grows, and
    /// the WAL is copied in and started over): what `--max-disk` caps. Null on Postgres,
    /// which does not say how much of its space deletes freed.
    pub in_use_bytes: Option<u64>,
}

/// Which traces `Store::delete_traces_before` deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceSet {
    /// Analysed traces with no flag and an outcome of `ok` or `no_budget`.
    Healthy,
    /// Every analysed trace.
    Analysed,
}

/// Hop rollups of `[since, until)` (minute-aligned), optionally of one service or operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollupQuery<'a> {
    pub since_unix_nano: u64,
    pub until_unix_nano: u64,
    pub service: Option<&'a str>,
    pub operation: Option<&'a str>,
    /// Whole hours inside the range come as one row per hour (`minute_unix_nano` is then
    /// the hour's start) and only the edges as minute rows.
    pub hourly: bool,
}

/// The hops' deadline metrics of `[since, until)` (minute-aligned), optionally of one
/// service or operation: each hop's sum over the range (each row's minute is `since`), or
/// each minute's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsQuery<'a> {
    pub since_unix_nano: u64,
    pub until_unix_nano: u64,
    pub service: Option<&'a str>,
    pub operation: Option<&'a str>,
    pub per_minute: bool,
}

/// Which alert history to read, newest first.
#[derive(Debug, Clone, Default)]
pub struct HistoryQuery {
    pub rule: Option<String>,
    pub service: Option<String>,
    pub operation: Option<String>,
    pub since_unix_nano: u64,
    pub limit: u32,
}

/// The delivery log, newest first: every rule's, or one's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NotificationQuery<'a> {
    pub rule: Option<&'a str>,
    pub limit: u32,
}

/// Summaries analysed with other rules or another τ than `version`, newest first: the
/// re-analysis of stored traces after an upgrade. Pages continue `after` a position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StaleQuery {
    pub version: AnalysisVersion,
    pub after: Option<Cursor>,
    pub limit: u32,
}

/// A summary as columns: what searches filter and order on, and the rest packed
/// (`pack_detail`).
pub(crate) struct SummaryRow {
    pub trace_id: Vec<u8>,
    pub start_unix_nano: i64,
    pub duration_ms: f64,
    pub budget_ms: Option<f64>,
    pub outcome: &'static str,
    pub burner_self_ms: Option<f64>,
    pub flags: String,
    pub span_count: i64,
    pub answer_ms: Option<f64>,
    /// The trace's names, flag counts and lists (`pack_detail`).
    pub packed_detail: Vec<u8>,
    /// The trace's hop samples (`rollup::pack_hops`).
    pub packed_hops: Vec<u8>,
    pub rules_version: i64,
    pub tolerance_ms: f64,
}

/// The conflict clause of the summary upsert.
const SUMMARY_UPSERT: &str = " ON CONFLICT (trace_id) DO UPDATE SET \
     root_service = excluded.root_service, root_name = excluded.root_name, \
     start_unix_nano = excluded.start_unix_nano, duration_ms = excluded.duration_ms, \
     budget_ms = excluded.budget_ms, outcome = excluded.outcome, \
     burner_service = excluded.burner_service, burner_name = excluded.burner_name, \
     burner_self_ms = excluded.burner_self_ms, flag_counts = excluded.flag_counts, \
     span_count = excluded.span_count, services = excluded.services, \
     operations = excluded.operations, answer_ms = excluded.answer_ms, \
     origins = excluded.origins, rules_version = excluded.rules_version, \
     tolerance_ms = excluded.tolerance_ms, packed_detail = excluded.packed_detail, \
     flags = excluded.flags, hops = excluded.hops, packed_hops = excluded.packed_hops";

/// The upsert of summary rows, one statement for all of `rows` (both backends; the caller
/// keeps each statement within its backend's parameter limit).
pub(crate) fn summary_upsert<DB: Database>(rows: &[SummaryRow]) -> QueryBuilder<DB>
where
    Vec<u8>: for<'t> Encode<'t, DB> + Type<DB>,
    String: for<'t> Encode<'t, DB> + Type<DB>,
    Option<String>: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
    Option<f64>: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut upsert: QueryBuilder<DB> = QueryBuilder::new(format!(
        "INSERT INTO trace_summaries ({SUMMARY_COLUMNS}, flags, packed_hops) "
    ));
    // The names and lists a summary kept as text before they were packed are left empty.
    upsert.push_values(rows, |mut b, row| {
        b.push_bind(row.trace_id.clone())
            .push("'', ''")
            .push_bind(row.start_unix_nano)
            .push_bind(row.duration_ms)
            .push_bind(row.budget_ms)
            .push_bind(row.outcome.to_string())
            .push("NULL, NULL")
            .push_bind(row.burner_self_ms)
            .push("''")
            .push_bind(row.span_count)
            .push("'', ''")
            .push_bind(row.answer_ms)
            .push("''")
            .push_bind(row.rules_version)
            .push_bind(row.tolerance_ms)
            .push_bind(row.packed_detail.clone())
            .push_bind(row.flags.clone())
            .push_bind(row.packed_hops.clone());
    });
    upsert.push(SUMMARY_UPSERT);
    upsert
}

/// A summary as the columns `summary_upsert` writes.
pub(crate) fn encode_summary(
    summary: &TraceSummary,
    hops: &[HopSample],
    hop_dictionaries: &Dictionaries,
    summary_dictionaries: &Dictionaries,
) -> Result<SummaryRow, StoreError> {
    let flags: String = summary
        .flag_counts
        .keys()
        .map(|f| format!(",{}", f.as_str()))
        .collect::<String>()
        + ",";
    Ok(SummaryRow {
        trace_id: summary.trace_id.0.to_vec(),
        start_unix_nano: i64::try_from(summary.start_unix_nano).unwrap_or(i64::MAX),
        duration_ms: summary.duration_ms,
        budget_ms: summary.budget_ms,
        outcome: summary.outcome.as_str(),
        burner_self_ms: summary.burner.as_ref().map(|b| b.2),
        flags,
        span_count: summary.span_count as i64,
        answer_ms: summary.answer_ms,
        packed_detail: summary_dictionaries.compress(&pack_detail(summary))?,
        packed_hops: pack_hops(hops, hop_dictionaries)?,
        rules_version: i64::from(summary.version.rules),
        tolerance_ms: summary.version.tolerance_ms,
    })
}

/// The version of `pack_detail`'s layout, its first byte.
const DETAIL_FORMAT: u8 = 1;

/// A summary's names, flag counts and lists, which no search reads in SQL (they are found
/// through its terms), as one frame to compress: the root's service and name, the burner's
/// (if any), the flag counts as JSON, then the services, operations and origins as the
/// text columns held them.
fn pack_detail(summary: &TraceSummary) -> Vec<u8> {
    let flag_counts: BTreeMap<&str, usize> = summary
        .flag_counts
        .iter()
        .map(|(flag, n)| (flag.as_str(), *n))
        .collect();
    let services = summary
        .services
        .iter()
        .fold(String::from("\n"), |acc, s| acc + s + "\n");
    let mut frame = vec![DETAIL_FORMAT];
    put_text(&mut frame, &summary.root_service);
    put_text(&mut frame, &summary.root_name);
    put_optional_text(&mut frame, summary.burner.as_ref().map(|b| b.0.as_str()));
    put_optional_text(&mut frame, summary.burner.as_ref().map(|b| b.1.as_str()));
    put_text(
        &mut frame,
        &serde_json::to_string(&flag_counts).unwrap_or_else(|_| "{}".into()),
    );
    put_text(&mut frame, &services);
    put_text(&mut frame, &encode_operations(&summary.operations));
    put_text(&mut frame, &encode_operations(&summary.origins));
    frame
}

/// What a healthy trace's summary holds: no flag (`flags` is then ","), and an outcome
/// that is no problem (`TraceSet::Healthy`).
pub(crate) const HEALTHY: &str = "flags = ',' AND outcome IN ('ok', 'no_budget')";

/// Whether a trace is healthy, as `HEALTHY` says of its stored summary.
pub(crate) fn is_healthy(summary: &TraceSummary) -> bool {
    summary.flag_counts.is_empty() && matches!(summary.outcome, Outcome::Ok | Outcome::NoBudget)
}

/// (service, name) pairs as "\nSERVICE\tNAME\n…".
fn encode_operations(operations: &[(String, String)]) -> String {
    operations
        .iter()
        .fold(String::from("\n"), |acc, (service, name)| {
            acc + service + "\t" + name + "\n"
        })
}

fn decode_operations(text: &str) -> Vec<(String, String)> {
    text.split('\n')
        .filter_map(|line| line.split_once('\t'))
        .map(|(s, n)| (s.to_string(), n.to_string()))
        .collect()
}

/// The column list both backends select, in `StoredSummary` order.
pub(crate) const SUMMARY_COLUMNS: &str = "trace_id, root_service, root_name, start_unix_nano, duration_ms, \
     budget_ms, outcome, burner_service, burner_name, burner_self_ms, flag_counts, span_count, services, operations, \
     answer_ms, origins, rules_version, tolerance_ms, packed_detail";

#[derive(sqlx::FromRow)]
pub(crate) struct StoredSummary {
    pub trace_id: Vec<u8>,
    pub root_service: String,
    pub root_name: String,
    pub start_unix_nano: i64,
    pub duration_ms: f64,
    pub budget_ms: Option<f64>,
    pub outcome: String,
    pub burner_service: Option<String>,
    pub burner_name: Option<String>,
    pub burner_self_ms: Option<f64>,
    pub flag_counts: String,
    pub span_count: i64,
    pub services: String,
    pub operations: String,
    pub answer_ms: Option<f64>,
    pub origins: String,
    pub rules_version: i64,
    pub tolerance_ms: f64,
    /// `pack_detail`'s frame, compressed; None in a summary written before, which keeps
    /// those values in its text columns.
    pub packed_detail: Option<Vec<u8>>,
}

impl StoredSummary {
    /// The summary; its packed detail read with `dictionaries` (loaded for it first:
    /// `Dictionaries::load_for`).
    pub fn decode(mut self, dictionaries: &Dictionaries) -> Result<TraceSummary, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt(format!("trace summary {what}"));
        if let Some(packed) = self.packed_detail.take() {
            let frame = dictionaries.decompress(&packed)?;
            let mut r = Reader::new(&frame);
            let mut unpack = || -> Result<(), StoreError> {
                if r.byte()? != DETAIL_FORMAT {
                    return Err(corrupt("detail of an unknown format"));
                }
                self.root_service = r.text()?.to_string();
                self.root_name = r.text()?.to_string();
                self.burner_service = r.optional_text()?.map(str::to_string);
                self.burner_name = r.optional_text()?.map(str::to_string);
                self.flag_counts = r.text()?.to_string();
                self.services = r.text()?.to_string();
                self.operations = r.text()?.to_string();
                self.origins = r.text()?.to_string();
                Ok(())
            };
            unpack().map_err(|_| corrupt("detail"))?;
        }
        let counts: BTreeMap<String, usize> =
            serde_json::from_str(&self.flag_counts).map_err(|_| corrupt("flag counts"))?;
        Ok(TraceSummary {
            trace_id: TraceId::from_bytes(&self.trace_id).map_err(|_| corrupt("trace id"))?,
            root_service: self.root_service,
            root_name: self.root_name,
            start_unix_nano: self.start_unix_nano.max(0) as u64,
            duration_ms: self.duration_ms,
            budget_ms: self.budget_ms,
            outcome: Outcome::from_name(&self.outcome).ok_or_else(|| corrupt("outcome"))?,
            burner: match (self.burner_service, self.burner_name, self.burner_self_ms) {
                (Some(service), Some(name), Some(own)) => Some((service, name, own)),
                _ => None,
            },
            // A flag this version does not know is skipped, not fatal.
            flag_counts: counts
                .into_iter()
                .filter_map(|(name, n)| Some((Flag::from_name(&name)?, n)))
                .collect(),
            span_count: self.span_count.max(0) as usize,
            services: self
                .services
                .split('\n')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            operations: decode_operations(&self.operations),
            answer_ms: self.answer_ms,
            origins: decode_operations(&self.origins),
            version: AnalysisVersion {
                rules: u32::try_from(self.rules_version).unwrap_or(0),
                tolerance_ms: self.tolerance_ms,
            },
        })
    }
}

/// Rollup rows of one table in `[since, until)`, optionally of one service or operation.
pub(crate) fn rollup_query<DB: Database>(
    table: &str,
    since: u64,
    until: u64,
    service: Option<&str>,
    operation: Option<&str>,
) -> QueryBuilder<DB>
where
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut q: QueryBuilder<DB> =
        QueryBuilder::new(format!("SELECT {ROLLUP_COLUMNS} FROM {table} WHERE "));
    push_hop_minutes(&mut q, since, until, service, operation);
    q
}

/// The conditions of a per-(hop, minute) table's read: minutes in `[since, until)`, and
/// optionally one service or operation.
pub(crate) fn push_hop_minutes<DB: Database>(
    q: &mut QueryBuilder<DB>,
    since: u64,
    until: u64,
    service: Option<&str>,
    operation: Option<&str>,
) where
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    q.push("minute_unix_nano >= ")
        .push_bind(i64::try_from(since).unwrap_or(i64::MAX))
        .push(" AND minute_unix_nano < ")
        .push_bind(i64::try_from(until).unwrap_or(i64::MAX));
    if let Some(service) = service {
        q.push(" AND service = ").push_bind(service.to_string());
    }
    if let Some(operation) = operation {
        q.push(" AND operation = ").push_bind(operation.to_string());
    }
}

/// `SUMMARY_COLUMNS` qualified with the summaries' alias `ts`, for joins.
pub(crate) fn summary_columns_ts() -> String {
    SUMMARY_COLUMNS
        .split(", ")
        .map(|c| format!("ts.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

//! Span rows: spans encoded into the columns both backends insert (`SpanRow`,
//! `EncodedBatch`), and stored rows decoded back into spans (`StoredRow`), with the small
//! decoders of ids, counts and positions the roles share.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::query::Cursor;
use super::{Operation, StoreError};
use crate::core::attr_json;
use crate::core::model::{Budget, Span, SpanId, SpanKind, Status, StatusCode, TraceId};

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
pub type OperationRow = (String, String, i16, i64);

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
    pub(crate) fn text_bytes(&self) -> u64 {
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

pub(crate) fn decode_trace_id(bytes: &[u8]) -> Result<TraceId, StoreError> {
    TraceId::from_bytes(bytes).map_err(|e| StoreError::Corrupt(format!("trace id: {e}")))
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

#[cfg(test)]
mod tests {
    use super::encode_rows;
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
}

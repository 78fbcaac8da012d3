//! JSON API handlers.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::Uri;
use axum::http::header;
use axum::response::{IntoResponse as _, Response};
use serde::Serialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::read::whole_traces;
use crate::core::analyze::{Analysis, AnalyzeOptions, analyze};
use crate::core::attr_json;
use crate::core::model::{Span, TraceId};
use crate::otlp::download::to_request;

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when the database answers and takes writes: a fault the writers met (a full disk,
/// a corrupt or read-only database) answers 503 with what is wrong and what to do, until a
/// write succeeds again (`pipeline::health`).
pub async fn readyz(State(state): State<AppState>) -> Result<Response, ApiError> {
    if let Some(faulted) = state.ingest.as_ref().and_then(|i| i.health().fault()) {
        let body = json!({
            "status": "unavailable",
            "store": state.store.backend(),
            "reason": faulted.fault.what(),
            "what_to_do": faulted.fault.what_to_do(),
            "since_unix_ms": faulted.since_unix_nano / 1_000_000,
        });
        return Ok((axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response());
    }
    state.store.ping().await?;
    Ok(Json(json!({"status": "ready", "store": state.store.backend()})).into_response())
}

/// Prometheus exposition (OpenMetrics text): `metrics.rs` says what is in it.
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let alerts = state.store.alert_instances().await?;
    let queued = state.ingest.as_ref().map_or(0, |i| i.queued_spans());
    // The status monitor's last measurement, taken every few seconds.
    let disk = state.status.current().await.ok().map(|status| status.disk);
    let text = state.metrics.render(crate::pipeline::metrics::Gauges {
        alerts: &alerts,
        queued_spans: queued,
        disk,
    });
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(
        "not_found",
        format!(
            "no such endpoint: {}; see docs/api.md for the API",
            uri.path()
        ),
    )
}

/// Parses a trace id from 32 hex digits, or 16 (a 64-bit id, zero-padded as Jaeger does).
pub fn parse_trace_id(text: &str) -> Result<TraceId, ApiError> {
    let padded;
    let text = if text.len() == 16 {
        padded = format!("{:0>32}", text);
        padded.as_str()
    } else {
        text
    };
    TraceId::from_hex(text).map_err(|e| {
        ApiError::bad_request(
            "invalid_trace_id",
            format!(
                "trace id {:?} {e}; give the 32 hex digits of the trace id",
                truncate(text, 64)
            ),
        )
    })
}

fn truncate(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The 404 of a trace with no spans stored.
fn trace_not_found(id: TraceId) -> ApiError {
    ApiError::not_found(
        "trace_not_found",
        format!(
            "no spans stored for trace {id}; it may not have been exported yet, or it is \
             older than the retention period"
        ),
    )
}

/// What to ask for instead of a trace too large to read whole.
pub fn too_large_instead(id: TraceId) -> String {
    format!(
        "Download it with GET /api/traces/{id}/otlp, which streams it in pieces, or raise \
         --memory-limit."
    )
}

pub async fn trace(
    State(state): State<AppState>,
    Path(trace_id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_trace_id(&trace_id)?;
    let read = whole_traces(&state, &[id])
        .await
        .map_err(|e| e.api(&format!("trace {id}"), &too_large_instead(id)))?;
    if read.spans.is_empty() {
        return Err(trace_not_found(id));
    }
    let options = state.analyze.clone();
    // Large traces take real CPU: keep it off the async workers. The read's memory stays
    // reserved until the body is built.
    let body = tokio::task::spawn_blocking(move || trace_json(id, &read.spans, &options))
        .await
        .map_err(|_| ApiError::internal("the analysis of this trace was interrupted; retry"))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// Spans per piece of the streamed OTLP download: a piece's spans and text are all it holds
/// at a time, whatever the trace's size.
const DOWNLOAD_PIECE: u32 = 2_000;

/// `GET /api/traces/{id}/otlp`: the stored spans as an OTLP/JSON `ExportTraceServiceRequest`,
/// as a download (`budgetscope analyze` and other OTLP tools read it), streamed in pieces
/// of `DOWNLOAD_PIECE` spans in span-id order (ranges of the primary key; an order by start
/// would sort the whole trace for every piece), each piece's spans grouped by resource.
pub async fn trace_otlp(
    State(state): State<AppState>,
    Path(trace_id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_trace_id(&trace_id)?;
    let first = state.store.trace_page(id, None, DOWNLOAD_PIECE).await?;
    if first.is_empty() {
        return Err(trace_not_found(id));
    }
    enum Next {
        Piece(Vec<Span>, bool),
        Close,
        Done,
    }
    let store = state.store.clone();
    let pieces = futures_util::stream::unfold(Next::Piece(first, true), move |next| {
        let store = store.clone();
        async move {
            let (spans, first) = match next {
                Next::Done => return None,
                Next::Close => return Some((Ok(bytes::Bytes::from_static(b"]}")), Next::Done)),
                Next::Piece(spans, first) => (spans, first),
            };
            let mut text = String::from(if first { "{\"resourceSpans\":[" } else { "" });
            for (i, resource) in to_request(&spans).resource_spans.iter().enumerate() {
                if !first || i > 0 {
                    text.push(',');
                }
                text.push_str(&serde_json::to_string(resource).unwrap_or_default());
            }
            let next = match spans.last() {
                Some(last) if spans.len() == DOWNLOAD_PIECE as usize => {
                    match store
                        .trace_page(id, Some(last.span_id), DOWNLOAD_PIECE)
                        .await
                    {
                        Ok(more) if more.is_empty() => Next::Close,
                        Ok(more) => Next::Piece(more, false),
                        Err(error) => {
                            tracing::warn!(%error, trace = %id, "the OTLP download stopped");
                            let cut = std::io::Error::other("the database stopped answering");
                            return Some((Err(cut), Next::Done));
                        }
                    }
                }
                _ => Next::Close,
            };
            Some((Ok(bytes::Bytes::from(text)), next))
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/json".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"trace-{id}.otlp.json\""),
            ),
        ],
        axum::body::Body::from_stream(pieces),
    )
        .into_response())
}

/// A trace with its analysis as JSON text, as `GET /api/traces/{id}` and
/// `budgetscope analyze --json` give it.
pub fn trace_json(id: TraceId, spans: &[Span], options: &AnalyzeOptions) -> String {
    let analysis = analyze(spans, options);
    let trace = TraceJson {
        trace_id: id.to_hex(),
        spans: SpansJson(spans),
        analysis: AnalysisJson::new(spans, &analysis),
    };
    serde_json::to_string(&trace).unwrap_or_default()
}

#[derive(Serialize)]
struct TraceJson<'a> {
    trace_id: String,
    spans: SpansJson<'a>,
    analysis: AnalysisJson<'a>,
}

/// Spans written one by one as they are serialised: each span's JSON tree lives only while
/// it is written, so a read holds the spans and the text, not a tree of every span
/// (`cargo bench --bench memory`).
struct SpansJson<'a>(&'a [Span]);

impl Serialize for SpansJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(span_json))
    }
}

/// The API form of an analysis (docs/api.md, "Budget analysis").
#[derive(Serialize)]
pub struct AnalysisJson<'a> {
    outcome: &'static str,
    budget_ms: Option<f64>,
    duration_ms: f64,
    tolerance_ms: f64,
    burner: Option<BurnerJson<'a>>,
    origins: Vec<OriginJson<'a>>,
    flag_counts: BTreeMap<&'static str, usize>,
    calls_reaching: &'a BTreeMap<String, usize>,
    /// Span ids on the critical path, in waterfall order (the edge hop first).
    critical_path: Vec<String>,
    /// The hop with the most critical-path time of its own, with that time.
    critical_hop: Option<CriticalHopJson<'a>>,
    rows: Vec<RowJson<'a>>,
}

#[derive(Serialize)]
struct CriticalHopJson<'a> {
    span_id: String,
    service: &'a str,
    name: &'a str,
    critical_ms: f64,
}

#[derive(Serialize)]
struct BurnerJson<'a> {
    span_id: String,
    service: &'a str,
    name: &'a str,
    self_ms: Option<f64>,
}

/// A hop where an exceeded request ran out.
#[derive(Serialize)]
struct OriginJson<'a> {
    span_id: String,
    service: &'a str,
    name: &'a str,
    reason: &'a str,
}

#[derive(Serialize)]
struct RowJson<'a> {
    span_id: String,
    parent_span_id: Option<String>,
    depth: usize,
    service: &'a str,
    name: &'a str,
    kind: &'static str,
    role: &'static str,
    start_offset_ms: f64,
    duration_ms: f64,
    budget_ms: Option<f64>,
    budget_source: Option<&'a str>,
    available_ms: Option<f64>,
    deadline_offset_ms: Option<f64>,
    self_ms: Option<f64>,
    burn: Option<f64>,
    exceed: Option<&'static str>,
    attempt: Option<u32>,
    wasted_ms: Option<f64>,
    skew_shift_ms: f64,
    critical_ms: Option<f64>,
    flags: Vec<FlagJson<'a>>,
    warnings: &'a [String],
}

#[derive(Serialize)]
struct FlagJson<'a> {
    flag: &'static str,
    message: &'a str,
}

impl<'a> AnalysisJson<'a> {
    pub fn new(spans: &'a [Span], analysis: &'a Analysis) -> Self {
        let burner = analysis.burner.map(|r| {
            let row = &analysis.rows[r];
            let span = &spans[row.span];
            BurnerJson {
                span_id: span.span_id.to_hex(),
                service: &span.service,
                name: &span.name,
                self_ms: row.self_ms,
            }
        });
        let rows = analysis
            .rows
            .iter()
            .map(|row| {
                let span = &spans[row.span];
                RowJson {
                    span_id: span.span_id.to_hex(),
                    parent_span_id: span.parent_span_id.map(|p| p.to_hex()),
                    depth: row.depth,
                    service: &span.service,
                    name: &span.name,
                    kind: span.kind.as_str(),
                    role: row.role.as_str(),
                    start_offset_ms: row.start_offset_ms,
                    duration_ms: row.duration_ms,
                    budget_ms: row.budget_ms,
                    budget_source: span.budget.as_ref().map(|b| b.source.as_str()),
                    available_ms: row.available_ms,
                    deadline_offset_ms: row.deadline_offset_ms,
                    self_ms: row.self_ms,
                    burn: row.burn,
                    exceed: row.exceed.map(|e| e.as_str()),
                    attempt: row.attempt,
                    wasted_ms: row.wasted_ms,
                    skew_shift_ms: row.skew_shift_ms,
                    critical_ms: row.critical_ms,
                    flags: row
                        .flags
                        .iter()
                        .map(|f| FlagJson {
                            flag: f.flag.as_str(),
                            message: &f.message,
                        })
                        .collect(),
                    warnings: &row.warnings,
                }
            })
            .collect();
        AnalysisJson {
            outcome: analysis.outcome.as_str(),
            budget_ms: analysis.budget_ms,
            duration_ms: analysis.duration_ms,
            tolerance_ms: analysis.tolerance_ms,
            burner,
            origins: analysis
                .origins
                .iter()
                .map(|&r| {
                    let row = &analysis.rows[r];
                    let span = &spans[row.span];
                    OriginJson {
                        span_id: span.span_id.to_hex(),
                        service: &span.service,
                        name: &span.name,
                        reason: crate::core::analyze::origin_reason(row),
                    }
                })
                .collect(),
            flag_counts: analysis
                .flag_counts
                .iter()
                .map(|(flag, n)| (flag.as_str(), *n))
                .collect(),
            calls_reaching: &analysis.calls_reaching,
            critical_path: analysis
                .critical_path
                .iter()
                .map(|&r| spans[analysis.rows[r].span].span_id.to_hex())
                .collect(),
            critical_hop: analysis.critical_hop.map(|r| {
                let span = &spans[analysis.rows[r].span];
                CriticalHopJson {
                    span_id: span.span_id.to_hex(),
                    service: &span.service,
                    name: &span.name,
                    critical_ms: analysis.critical_ms_of(r),
                }
            }),
            rows,
        }
    }
}

/// The API form of a span (docs/api.md).
pub fn span_json(span: &Span) -> Value {
    json!({
        "span_id": span.span_id.to_hex(),
        "parent_span_id": span.parent_span_id.map(|p| p.to_hex()),
        "service": span.service,
        "name": span.name,
        "kind": span.kind.as_str(),
        "start_unix_nano": span.start_unix_nano,
        "end_unix_nano": span.end_unix_nano,
        "status": {"code": span.status.code.as_str(), "message": span.status.message},
        "attributes": attr_json::attributes_to_json(&span.attributes),
        "resource": attr_json::attributes_to_json(&span.resource),
        "scope": {"name": span.scope.name, "version": span.scope.version},
        "events": attr_json::events_to_json(&span.events),
        "links": attr_json::links_to_json(&span.links),
        "budget_ms": span.budget.as_ref().map(|b| b.ms),
        "budget_source": span.budget.as_ref().map(|b| b.source.as_str()),
        "warnings": span.warnings,
    })
}

/// `GET /api/status`: how far analysis is behind ingest (`crate::pipeline::status::Status`).
pub async fn status(
    State(state): State<AppState>,
) -> Result<Json<crate::pipeline::status::Status>, ApiError> {
    Ok(Json(state.status.current().await?))
}

pub async fn services(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"services": state.store.services().await?})))
}

pub async fn operations(
    State(state): State<AppState>,
    Path(service): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let operations = state.store.operations(&service).await?;
    let operations: Vec<Value> = operations
        .iter()
        .map(|o| json!({"name": o.name, "kind": o.kind.as_str()}))
        .collect();
    Ok(Json(json!({"service": service, "operations": operations})))
}

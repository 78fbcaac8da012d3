//! JSON API handlers.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::Uri;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::codec;
use crate::model::{Span, TraceId};

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    state.store.ping().await?;
    Ok(Json(
        json!({"status": "ready", "store": state.store.backend()}),
    ))
}

pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(
        "not_found",
        format!(
            "no such endpoint: {}; see README.md for the API",
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

pub async fn trace(
    State(state): State<AppState>,
    Path(trace_id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_trace_id(&trace_id)?;
    let spans = state.store.trace(id).await?;
    if spans.is_empty() {
        return Err(ApiError::not_found(
            "trace_not_found",
            format!(
                "no spans stored for trace {id}; it may not have been exported yet, or it is \
                 older than the retention period"
            ),
        ));
    }
    Ok(Json(json!({
        "trace_id": id.to_hex(),
        "spans": spans.iter().map(span_json).collect::<Vec<_>>(),
    })))
}

/// The API form of a span (README.md, "API").
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
        "attributes": codec::attributes_to_json(&span.attributes),
        "resource": codec::attributes_to_json(&span.resource),
        "scope": {"name": span.scope.name, "version": span.scope.version},
        "events": codec::events_to_json(&span.events),
        "links": codec::links_to_json(&span.links),
        "budget_ms": span.budget.as_ref().map(|b| b.ms),
        "budget_source": span.budget.as_ref().map(|b| b.source.as_str()),
        "warnings": span.warnings,
    })
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

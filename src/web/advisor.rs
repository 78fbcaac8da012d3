//! `GET /api/advisor?since=&until=&service=`: the advisor's findings over a window (default
//! the last hour) from the edge rollups (`core::advice`), each with up to three example
//! traces found by the flag that shows it.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Query, State};
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, check_params};
use super::map::{Rows, rows};
use crate::core::advice::{Finding, HopId, edge_findings};
use crate::core::analyze::Flag;
use crate::core::analyze::edges::EdgeRollup;
use crate::core::analyze::histogram::Histogram;
use crate::store::StoreError;
use crate::store::query::TraceQuery;

/// The flag whose traces show a finding's kind; none for `clamped`, which no flag marks.
fn flag_of(kind: &str) -> Option<Flag> {
    match kind {
        "dropped" => Some(Flag::Dropped),
        "fixed_timeout" => Some(Flag::Inflated),
        "retry_budget" => Some(Flag::Retry),
        _ => None,
    }
}

fn hop_json((service, operation): &HopId) -> Value {
    json!({
        "service": service,
        "operation": (!operation.is_empty()).then_some(operation),
    })
}

pub async fn advisor(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    check_params(&params, &["since", "until", "service"])?;
    let (since, until) = super::hops::time_range(&params, crate::clock::now_unix_nano())?;
    let service = params
        .get("service")
        .map(String::as_str)
        .filter(|s| !s.is_empty());
    let findings: Vec<Value> = load(&state, since, until, service)
        .await?
        .iter()
        .map(|(finding, examples)| finding_json(finding, examples))
        .collect();
    Ok(Json(json!({
        "since_unix_nano": since,
        "until_unix_nano": until,
        "findings": findings,
    })))
}

/// The findings of `[since, until)` (minute-aligned), optionally of one service's edges,
/// each with its example traces: what the API and the page show.
pub async fn load(
    state: &AppState,
    since: u64,
    until: u64,
    service: Option<&str>,
) -> Result<Vec<(Finding, Vec<String>)>, StoreError> {
    let mut out = Vec::new();
    let rows = rows(state.store.as_ref(), since, until, service).await?;
    for finding in of_rows(&rows, state.analyze.tolerance_ms) {
        let examples = examples(state, &finding, since, until).await?;
        out.push((finding, examples));
    }
    Ok(out)
}

/// The findings of the rows the service map also reads, without example traces.
pub fn of_rows(rows: &Rows, tolerance_ms: f64) -> Vec<Finding> {
    let mut edges: BTreeMap<(HopId, HopId), EdgeRollup> = BTreeMap::new();
    for ((caller_service, caller_operation, callee_service, callee_operation, _), rollup) in
        &rows.edges
    {
        edges
            .entry((
                (caller_service.clone(), caller_operation.clone()),
                (callee_service.clone(), callee_operation.clone()),
            ))
            .or_default()
            .merge(rollup);
    }
    let mut received: BTreeMap<HopId, Histogram> = BTreeMap::new();
    for row in &rows.hops {
        received
            .entry((row.service.clone(), row.operation.clone()))
            .or_default()
            .merge(&row.rollup.budget);
    }
    edge_findings(&edges, &received, tolerance_ms)
}

/// Up to three traces of the window with the finding's flag at its callee (or, for a peer
/// that is no instrumented hop, its caller).
async fn examples(
    state: &AppState,
    finding: &Finding,
    since: u64,
    until: u64,
) -> Result<Vec<String>, StoreError> {
    let Some(flag) = flag_of(finding.kind) else {
        return Ok(Vec::new());
    };
    let at = if finding.callee.1.is_empty() {
        &finding.caller
    } else {
        &finding.callee
    };
    let found = state
        .store
        .search_traces(&TraceQuery {
            service: Some(at.0.clone()),
            flag: Some(flag),
            since_unix_nano: Some(since),
            until_unix_nano: Some(until),
            limit: 3,
            ..TraceQuery::default()
        })
        .await?;
    Ok(found.iter().map(|s| s.trace_id.to_hex()).collect())
}

fn finding_json(finding: &Finding, examples: &[String]) -> Value {
    json!({
        "kind": finding.kind,
        "caller": hop_json(&finding.caller),
        "callee": hop_json(&finding.callee),
        "value_ms": finding.value_ms,
        "requests": finding.calls,
        "calls": finding.of_calls,
        "message": finding.message,
        "recommendation": finding.recommendation,
        "example_traces": examples,
    })
}

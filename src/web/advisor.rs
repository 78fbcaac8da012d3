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
use crate::core::advice::{
    Finding, HopId, Subject, example_flag, example_outcome, findings, merge_edges,
};
use crate::core::analyze::hops::Rollup;
use crate::store::StoreError;
use crate::store::query::TraceQuery;

/// A hop as the API names it: `{"service", "operation"}`, no operation for a peer.
pub(crate) fn hop_json((service, operation): &HopId) -> Value {
    json!({
        "service": service,
        "operation": (!operation.is_empty()).then_some(operation),
    })
}

pub async fn advisor(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(answer(&state, &params).await?))
}

/// What `GET /api/advisor` answers for these parameters (`budgetscope advise --db` too).
pub async fn answer(
    state: &AppState,
    params: &BTreeMap<String, String>,
) -> Result<Value, ApiError> {
    check_params(params, &["since", "until", "service"])?;
    let (since, until) = super::hops::time_range(params, crate::clock::now_unix_nano())?;
    let service = params
        .get("service")
        .map(String::as_str)
        .filter(|s| !s.is_empty());
    let findings: Vec<Value> = load(state, since, until, of_service(service))
        .await?
        .iter()
        .map(|(finding, examples)| finding_json(finding, examples))
        .collect();
    Ok(json!({
        "since_unix_nano": since,
        "until_unix_nano": until,
        "findings": findings,
    }))
}

/// The findings of `[since, until)` (minute-aligned) that `keep` keeps, each with its
/// example traces: what the API and the pages show.
pub async fn load(
    state: &AppState,
    since: u64,
    until: u64,
    keep: impl Fn(&Finding) -> bool,
) -> Result<Vec<(Finding, Vec<String>)>, StoreError> {
    let mut out = Vec::new();
    // Every edge, whatever is kept: a hop's findings read the edges below it.
    let rows = rows(state.store.as_ref(), since, until, None).await?;
    for finding in of_rows(&rows, state.analyze.tolerance_ms) {
        if !keep(&finding) {
            continue;
        }
        let examples = examples(state, &finding, since, until).await?;
        out.push((finding, examples));
    }
    Ok(out)
}

/// Keeps the findings of one service (a hop's, or an edge's caller), or all.
pub fn of_service(service: Option<&str>) -> impl Fn(&Finding) -> bool + '_ {
    move |finding| service.is_none_or(|s| finding.subject.service() == s)
}

/// The findings of the rows the service map also reads, without example traces.
pub fn of_rows(rows: &Rows, tolerance_ms: f64) -> Vec<Finding> {
    let mut hops: BTreeMap<HopId, Rollup> = BTreeMap::new();
    for row in &rows.hops {
        hops.entry((row.service.clone(), row.operation.clone()))
            .or_default()
            .merge(&row.rollup);
    }
    findings(&hops, &merge_edges(&rows.edges), tolerance_ms)
}

/// Up to three traces of the window that show the finding: with its flag or outcome at the
/// hop it names (an edge's callee, or its caller for a peer that is no instrumented hop).
async fn examples(
    state: &AppState,
    finding: &Finding,
    since: u64,
    until: u64,
) -> Result<Vec<String>, StoreError> {
    let (flag, outcome) = (example_flag(finding.kind), example_outcome(finding.kind));
    if flag.is_none() && outcome.is_none() {
        return Ok(Vec::new());
    }
    let at = match &finding.subject {
        Subject::Hop(hop) => hop,
        Subject::Edge { caller, callee } if callee.1.is_empty() => caller,
        Subject::Edge { callee, .. } => callee,
    };
    let found = state
        .store
        .search_traces(&TraceQuery {
            service: Some(at.0.clone()),
            operation: (!at.1.is_empty()).then(|| at.1.clone()),
            flag,
            outcome,
            since_unix_nano: Some(since),
            until_unix_nano: Some(until),
            limit: 3,
            ..TraceQuery::default()
        })
        .await?;
    Ok(found.iter().map(|s| s.trace_id.to_hex()).collect())
}

fn finding_json(finding: &Finding, examples: &[String]) -> Value {
    let mut out = json!({
        "kind": finding.kind,
        "value_ms": finding.value_ms,
        "value": finding.value,
        "requests": finding.requests,
        "out_of": finding.out_of,
        "message": finding.message,
        "recommendation": finding.recommendation,
        "example_traces": examples,
    });
    match &finding.subject {
        Subject::Edge { caller, callee } => {
            out["caller"] = hop_json(caller);
            out["callee"] = hop_json(callee);
        }
        Subject::Hop(hop) => out["hop"] = hop_json(hop),
    }
    if !finding.layers.is_empty() {
        out["layers"] = finding.layers.iter().map(hop_json).collect();
    }
    out
}

//! The alerts JSON API: `/api/alerts` (instances), `/api/alerts/rules`,
//! `/api/alerts/history` and `/api/alerts/notifications` (the delivery log).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Query, State};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::search::parse_time;
use crate::alerts::rules::Rule;
use crate::store::alerts::HistoryQuery;

/// The most rows one history or delivery-log request returns.
const MAX_LIMIT: u32 = 10_000;

fn now() -> u64 {
    super::pages::now_unix_nano()
}

fn check_params(params: &BTreeMap<String, String>, known: &[&str]) -> Result<(), ApiError> {
    match params.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(ApiError::bad_request(
            "invalid_parameter",
            format!("parameter {unknown}: unknown; use {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

fn limit(params: &BTreeMap<String, String>, default: u32) -> Result<u32, ApiError> {
    match params.get("limit").filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(text) => text
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_parameter",
                    format!("parameter limit: expected a number from 1 to {MAX_LIMIT}"),
                )
            }),
    }
}

fn non_empty(params: &BTreeMap<String, String>, name: &str) -> Option<String> {
    params.get(name).filter(|v| !v.is_empty()).cloned()
}

/// A rule as the API shows it, in the rules file's field names.
pub fn rule_json(rule: &Rule) -> Value {
    let duration = |d: std::time::Duration| humantime::format_duration(d).to_string();
    json!({
        "name": rule.name,
        "source": rule.source,
        "service": rule.service.as_str(),
        "operation": rule.operation.as_str(),
        "signal": rule.signal.as_str(),
        "objective": rule.objective,
        "op": rule.op.as_str(),
        "threshold": rule.threshold,
        "warning": rule.warning,
        "resolve_threshold": rule.resolve_threshold,
        "window": duration(rule.window),
        "short_window": rule.short_window.map(duration),
        "for": duration(rule.for_),
        "keep_firing_for": duration(rule.keep_firing_for),
        "min_requests": rule.min_requests,
        "labels": rule.labels,
        "annotations": rule.annotations,
        "receivers": rule.receivers,
        "paused": rule.paused,
    })
}

pub async fn instances(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let instances = state.store.alert_instances().await?;
    Ok(Json(json!({ "instances": instances })))
}

pub async fn rules(State(state): State<AppState>) -> Json<Value> {
    let set = state.rules.current();
    Json(json!({
        "rules_file": state.rules.file().map(|p| p.display().to_string()),
        "rules": set.rules.iter().map(rule_json).collect::<Vec<_>>(),
        "receivers": set.receivers.iter().map(|r| json!({
            "name": r.name, "kind": r.kind.as_str(), "url": r.url,
        })).collect::<Vec<_>>(),
    }))
}

pub async fn history(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    check_params(&params, &["rule", "service", "operation", "since", "limit"])?;
    let now = now();
    let since = match non_empty(&params, "since") {
        Some(text) => parse_time(&text, now).map_err(|m| {
            ApiError::bad_request("invalid_parameter", format!("parameter since: {m}"))
        })?,
        None => now.saturating_sub(24 * 3_600 * 1_000_000_000),
    };
    let query = HistoryQuery {
        rule: non_empty(&params, "rule"),
        service: non_empty(&params, "service"),
        operation: non_empty(&params, "operation"),
        since_unix_nano: since,
        limit: limit(&params, 1_000)?,
    };
    let history = state.store.alert_history(&query).await?;
    Ok(Json(
        json!({ "since_unix_nano": since, "history": history }),
    ))
}

pub async fn notifications(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    check_params(&params, &["rule", "limit"])?;
    let rule = non_empty(&params, "rule");
    let found = state
        .store
        .notifications(rule.as_deref(), limit(&params, 100)?)
        .await?;
    let notifications: Vec<Value> = found
        .iter()
        .map(|n| {
            let mut value = serde_json::to_value(n).unwrap_or(Value::Null);
            value["outcome"] = json!(n.outcome());
            value
        })
        .collect();
    Ok(Json(json!({ "notifications": notifications })))
}

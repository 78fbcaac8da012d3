//! What if: `POST /api/advisor/whatif` and the page `/advisor/whatif` replay the window's
//! recorded traces through one proposed change (`core::whatif`). Both read the change from
//! the same flat parameters: `change` (`min_useful_budget`, `reserve`, `timeout`,
//! `retries_off`), `service` and `operation` (the hop, or the edge's caller),
//! `callee_service` and `callee_operation` (an edge's callee; no operation for a peer),
//! `value_ms`, and `since`/`until`.

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use serde_json::{Value, json};

use super::AppState;
use super::advisor::hop_json;
use super::error::{ApiError, check_params};
use super::read::{ReadError, whole_traces};
use crate::core::advice::HopId;
use crate::core::analyze::analyze;
use crate::core::analyze::hops::by_trace;
use crate::core::model::TraceId;
use crate::core::whatif::{Change, Effect, replay};
use crate::pipeline::memory::ReadRefused;
use crate::store::query::TraceQuery;

/// The most recent traces through the hop that one what-if replays: enough for the
/// shares to be told, bounded so an answer takes seconds, not minutes.
pub const REPLAY_TRACES: u32 = 1000;
/// Traces read and analysed at a time, within the memory budget.
const CHUNK: usize = 100;

/// The parameters a what-if reads.
pub const PARAMS: [&str; 8] = [
    "change",
    "service",
    "operation",
    "callee_service",
    "callee_operation",
    "value_ms",
    "since",
    "until",
];

/// A change's replay over a window.
pub struct WhatIf {
    pub change: Change,
    pub since: u64,
    pub until: u64,
    pub effect: Effect,
    /// Traces replayed, and whether there were more in the window than `REPLAY_TRACES`.
    pub replayed: usize,
    pub limited: bool,
    /// Traces too large to read whole, not replayed.
    pub skipped: usize,
    /// Up to three traces that would have failed fast, and three that would newly fail.
    pub failed_fast: Vec<String>,
    pub newly_failed: Vec<String>,
}

/// The change the parameters describe, or what is wrong with them.
pub fn change_of(params: &BTreeMap<String, String>) -> Result<Change, String> {
    let get = |key: &str| params.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let hop = || -> Result<HopId, String> {
        match (get("service"), get("operation")) {
            (Some(s), Some(o)) => Ok((s.to_string(), o.to_string())),
            _ => Err("give the hop (or the edge's caller) as service and operation".into()),
        }
    };
    let callee = || -> Result<HopId, String> {
        let service = get("callee_service")
            .ok_or("give the edge's callee as callee_service (and callee_operation)")?;
        Ok((
            service.to_string(),
            get("callee_operation").unwrap_or_default().to_string(),
        ))
    };
    let value = || -> Result<f64, String> {
        let text = get("value_ms").ok_or("give value_ms, in milliseconds")?;
        text.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("value_ms {text:?}: expected milliseconds ≥ 0, e.g. 250"))
    };
    match get("change") {
        Some("min_useful_budget") => Ok(Change::MinUsefulBudget {
            hop: hop()?,
            ms: value()?,
        }),
        Some("reserve") => Ok(Change::Reserve {
            hop: hop()?,
            ms: value()?,
        }),
        Some("timeout") => Ok(Change::Timeout {
            caller: hop()?,
            callee: callee()?,
            ms: value()?,
        }),
        Some("retries_off") => Ok(Change::RetriesOff {
            caller: hop()?,
            callee: callee()?,
        }),
        other => Err(format!(
            "change {:?}: use min_useful_budget, reserve, timeout or retries_off",
            other.unwrap_or("")
        )),
    }
}

/// Replays the most recent traces of `[since, until)` through the change's hop.
pub async fn what_if(
    state: &AppState,
    change: Change,
    since: u64,
    until: u64,
) -> Result<WhatIf, ReadError> {
    let at = change.at();
    let found = state
        .store
        .search_traces(&TraceQuery {
            service: Some(at.0.clone()),
            operation: Some(at.1.clone()),
            since_unix_nano: Some(since),
            until_unix_nano: Some(until),
            limit: REPLAY_TRACES + 1,
            ..TraceQuery::default()
        })
        .await?;
    let limited = found.len() > REPLAY_TRACES as usize;
    let ids: Vec<TraceId> = found
        .iter()
        .take(REPLAY_TRACES as usize)
        .map(|s| s.trace_id)
        .collect();
    let mut out = WhatIf {
        change,
        since,
        until,
        effect: Effect::default(),
        replayed: 0,
        limited,
        skipped: 0,
        failed_fast: Vec::new(),
        newly_failed: Vec::new(),
    };
    for chunk in ids.chunks(CHUNK) {
        let traces = match whole_traces(state, chunk).await {
            Ok(traces) => vec![traces],
            // Some trace of the chunk is too large for one read: read them one by one,
            // leaving out those that are.
            Err(ReadError::Refused(_, ReadRefused::TooLarge { .. })) => {
                let mut one_by_one = Vec::new();
                for id in chunk {
                    match whole_traces(state, std::slice::from_ref(id)).await {
                        Ok(trace) => one_by_one.push(trace),
                        Err(ReadError::Refused(_, ReadRefused::TooLarge { .. })) => {
                            out.skipped += 1
                        }
                        Err(other) => return Err(other),
                    }
                }
                one_by_one
            }
            Err(other) => return Err(other),
        };
        for whole in traces {
            let mut by_id: Vec<(TraceId, Vec<crate::core::model::Span>)> =
                by_trace(whole.spans).into_iter().collect();
            by_id.sort_by_key(|(id, _)| *id);
            for (id, spans) in by_id {
                let analysis = analyze(&spans, &state.analyze);
                let effect = replay(&out.change, &spans, &analysis);
                out.replayed += 1;
                out.effect.add(&effect);
                if effect.failed_fast > 0 && out.failed_fast.len() < 3 {
                    out.failed_fast.push(id.to_hex());
                }
                if effect.newly_failed > 0 && out.newly_failed.len() < 3 {
                    out.newly_failed.push(id.to_hex());
                }
            }
        }
    }
    Ok(out)
}

/// `POST /api/advisor/whatif`: the body is a JSON object of the parameters (`hop` or
/// `caller`, and `callee`, may be given as `{"service", "operation"}` objects, as
/// findings name them).
pub async fn whatif(State(state): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let bad = |message: String| ApiError::bad_request("invalid_whatif", message);
    let object: serde_json::Map<String, Value> = serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "the body is not a JSON object ({e}); send e.g. {{\"change\": \"min_useful_budget\", \
             \"hop\": {{\"service\": \"pricing\", \"operation\": \"GET /price\"}}, \"value_ms\": 250}}"
        ))
    })?;
    let mut params = BTreeMap::new();
    for (key, value) in object {
        match (key.as_str(), value) {
            ("hop" | "caller" | "callee", Value::Object(end)) => {
                let prefix = if key == "callee" { "callee_" } else { "" };
                for field in ["service", "operation"] {
                    if let Some(text) = end.get(field).and_then(Value::as_str) {
                        params.insert(format!("{prefix}{field}"), text.to_string());
                    }
                }
            }
            (_, Value::String(text)) => {
                params.insert(key, text);
            }
            (_, Value::Number(n)) => {
                params.insert(key, n.to_string());
            }
            (_, other) => {
                return Err(bad(format!(
                    "{key}: {other} is neither a string, a number nor a hop"
                )));
            }
        }
    }
    check_params(&params, &PARAMS)?;
    let change = change_of(&params).map_err(bad)?;
    let (since, until) = super::hops::time_range(&params, crate::clock::now_unix_nano())?;
    let done = what_if(&state, change, since, until)
        .await
        .map_err(|e| e.api("the traces to replay", "Choose a shorter range."))?;
    Ok(Json(answer(&done)))
}

/// The JSON answer for a replay.
pub fn answer(done: &WhatIf) -> Value {
    let (kind, ends, value_ms) = match &done.change {
        Change::MinUsefulBudget { hop, ms } => (
            "min_useful_budget",
            json!({"hop": hop_json(hop)}),
            Some(*ms),
        ),
        Change::Reserve { hop, ms } => ("reserve", json!({"hop": hop_json(hop)}), Some(*ms)),
        Change::Timeout { caller, callee, ms } => (
            "timeout",
            json!({"caller": hop_json(caller), "callee": hop_json(callee)}),
            Some(*ms),
        ),
        Change::RetriesOff { caller, callee } => (
            "retries_off",
            json!({"caller": hop_json(caller), "callee": hop_json(callee)}),
            None,
        ),
    };
    let e = &done.effect;
    json!({
        "change": kind,
        "at": ends,
        "value_ms": value_ms,
        "since_unix_nano": done.since,
        "until_unix_nano": done.until,
        "replayed_traces": done.replayed,
        "limited": done.limited,
        "skipped_too_large": done.skipped,
        "requests": e.seen,
        "changed": e.touched,
        "failed_fast": e.failed_fast,
        "saved_ms": e.saved_ms,
        "newly_failed": e.newly_failed,
        "example_traces": {"failed_fast": done.failed_fast, "newly_failed": done.newly_failed},
        "assumptions": crate::core::whatif::ASSUMPTIONS,
    })
}

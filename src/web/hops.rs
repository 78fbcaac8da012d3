//! `GET /api/hops` (per hop identity, over a time range) and
//! `GET /api/hops/{service}/{operation}/series` (per time bucket, for charts), both from the
//! per-minute rollups the background analyzer maintains.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, check_params};
use super::search::parse_time;
use crate::core::analyze::hops::{COUNTED, Rollup};
use crate::store::query::RollupQuery;

/// Most points a series may have.
const MAX_POINTS: u64 = 10_000;
const MINUTE: u64 = 60_000_000_000;

/// `since` and `until` (default: the last hour), validated.
pub(super) fn time_range(
    params: &BTreeMap<String, String>,
    now: u64,
) -> Result<(u64, u64), ApiError> {
    let bad = |name: &str, message: String| {
        ApiError::bad_request("invalid_parameter", format!("parameter {name}: {message}"))
    };
    let since = match params.get("since").filter(|v| !v.is_empty()) {
        Some(text) => parse_time(text, now).map_err(|m| bad("since", m))?,
        None => now.saturating_sub(3_600 * 1_000_000_000),
    };
    let until = match params.get("until").filter(|v| !v.is_empty()) {
        Some(text) => parse_time(text, now).map_err(|m| bad("until", m))?,
        None => now,
    };
    if until <= since {
        return Err(bad("until", "must be later than since".into()));
    }
    // Rollups are per minute: widen to whole minutes so the last partial minute counts.
    Ok((since - since % MINUTE, until.div_ceil(MINUTE) * MINUTE))
}

fn quantiles(rollup: &Rollup) -> Value {
    json!({
        "budget_ms": {
            "p50": rollup.budget.quantile(0.5),
            "p95": rollup.budget.quantile(0.95),
            "p99": rollup.budget.quantile(0.99),
        },
        "burn": {"p50": rollup.burn.quantile(0.5), "p95": rollup.burn.quantile(0.95)},
        "self_ms": {"p50": rollup.self_ms.quantile(0.5), "p95": rollup.self_ms.quantile(0.95)},
    })
}

/// Counts and quantiles of a rollup as one JSON object, plus `extra` fields.
fn rollup_json(rollup: &Rollup, extra: Value) -> Value {
    let mut object = extra.as_object().cloned().unwrap_or_default();
    object.insert("requests".into(), json!(rollup.requests));
    for (name, count) in COUNTED.iter().zip(rollup.counts) {
        object.insert((*name).into(), json!(count));
    }
    object.insert("wasted_ms".into(), json!(rollup.wasted_ms));
    if let Value::Object(q) = quantiles(rollup) {
        object.extend(q);
    }
    // Its part in its requests' critical paths (docs/budget-semantics.md).
    let c = &rollup.critical;
    object.insert(
        "critical".into(),
        json!({
            "ms": c.ms,
            "mean_ms": (rollup.requests > 0).then(|| c.ms / rollup.requests as f64),
            "exceeded": c.exceeded,
            "exceeded_on_path": c.exceeded_on_path,
            "exceeded_dominant": c.exceeded_dominant,
            "share": c.share(),
        }),
    );
    // The hop's own deadline metrics (every request), beside the traces' numbers.
    let r = &rollup.reported;
    object.insert(
        "metrics".into(),
        json!({
            "local_exceeds": r.local_exceeds,
            "inherited_exceeds": r.inherited_exceeds,
            "requests": r.received_count,
            "budget_received_mean_ms": r.received_mean_ms(),
            "budget_remaining_mean_ms": r.remaining_mean_ms(),
        }),
    );
    Value::Object(object)
}

pub async fn hops(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    check_params(&params, &["since", "until", "service"])?;
    let (since, until) = time_range(&params, crate::clock::now_unix_nano())?;
    let service = params
        .get("service")
        .map(String::as_str)
        .filter(|s| !s.is_empty());
    let rows = state
        .store
        .hop_rollups(&RollupQuery {
            since_unix_nano: since,
            until_unix_nano: until,
            service,
            hourly: true,
            ..Default::default()
        })
        .await?;
    let reported =
        crate::web::pages::with_reported(state.store.as_ref(), since, until, service, None, false)
            .await?;
    let mut merged: BTreeMap<(String, String), Rollup> = BTreeMap::new();
    for row in rows.into_iter().chain(reported) {
        merged
            .entry((row.service, row.operation))
            .or_default()
            .merge(&row.rollup);
    }
    let hops: Vec<Value> = merged
        .iter()
        .map(|((service, operation), rollup)| {
            rollup_json(rollup, json!({"service": service, "operation": operation}))
        })
        .collect();
    Ok(Json(
        json!({"since_unix_nano": since, "until_unix_nano": until, "hops": hops}),
    ))
}

pub async fn series(
    State(state): State<AppState>,
    Path((service, operation)): Path<(String, String)>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    check_params(&params, &["since", "until", "step"])?;
    let (since, until) = time_range(&params, crate::clock::now_unix_nano())?;
    let step = match params.get("step").filter(|s| !s.is_empty()) {
        Some(text) => humantime::parse_duration(text)
            .ok()
            .map(|d| d.as_nanos() as u64)
            .filter(|n| *n >= MINUTE && n % MINUTE == 0)
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_parameter",
                    format!("parameter step: {text:?} must be whole minutes, e.g. 1m, 5m or 1h"),
                )
            })?,
        None => auto_step(until - since),
    };
    if (until - since) / step > MAX_POINTS {
        return Err(ApiError::bad_request(
            "invalid_parameter",
            format!(
                "parameter step: more than {MAX_POINTS} points; choose a larger step or a shorter range"
            ),
        ));
    }
    // Hour rows only when every bucket is whole hours.
    let hourly = step % (60 * MINUTE) == 0;
    let rows = state
        .store
        .hop_rollups(&RollupQuery {
            since_unix_nano: since,
            until_unix_nano: until,
            service: Some(&service),
            operation: Some(&operation),
            hourly,
        })
        .await?;
    let reported = crate::web::pages::with_reported(
        state.store.as_ref(),
        since,
        until,
        Some(&service),
        Some(&operation),
        true,
    )
    .await?;
    let first = since - since % step;
    let mut buckets: BTreeMap<u64, Rollup> = (0..)
        .map(|i| first + i * step)
        .take_while(|start| *start < until)
        .map(|start| (start, Rollup::default()))
        .collect();
    for row in rows.into_iter().chain(reported) {
        let start = row.minute_unix_nano - row.minute_unix_nano % step;
        buckets.entry(start).or_default().merge(&row.rollup);
    }
    let points: Vec<Value> = buckets
        .iter()
        .map(|(start, rollup)| rollup_json(rollup, json!({"start_unix_nano": start})))
        .collect();
    Ok(Json(json!({
        "service": service,
        "operation": operation,
        "step_ms": step / 1_000_000,
        "points": points,
    })))
}

/// The smallest of 1m, 5m, 15m, 1h, 6h, 1d that gives at most 120 points.
fn auto_step(range: u64) -> u64 {
    [1, 5, 15, 60, 360, 1440]
        .into_iter()
        .map(|minutes| Duration::from_secs(minutes * 60).as_nanos() as u64)
        .find(|step| range / step <= 120)
        .unwrap_or(1440 * MINUTE)
}

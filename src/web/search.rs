//! `GET /api/traces`: trace search over the summaries the background analyzer writes.
//! Parameters are validated into a `TraceQuery`; each invalid one is named in a 400.

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Query, State};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::core::analyze::summary::TraceSummary;
use crate::core::analyze::{Flag, Outcome};
use crate::store::query::{AttrFilter, AttrOp, Cursor, TraceQuery};

pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 1000;

pub async fn search(
    State(state): State<AppState>,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<Json<Value>, ApiError> {
    let now = crate::clock::now_unix_nano();
    let mut query = parse_query(&params, now)?;
    let limit = query.limit;
    query.limit = limit + 1;
    let mut traces = state.store.search_traces(&query).await?;
    let next_cursor = if traces.len() > limit as usize {
        traces.truncate(limit as usize);
        traces.last().map(|t| {
            Cursor {
                start_unix_nano: t.start_unix_nano,
                trace_id: t.trace_id,
            }
            .encode()
        })
    } else {
        None
    };
    Ok(Json(json!({
        "traces": traces.iter().map(summary_json).collect::<Vec<_>>(),
        "next_cursor": next_cursor,
    })))
}

pub fn summary_json(summary: &TraceSummary) -> Value {
    let flag_counts: serde_json::Map<String, Value> = summary
        .flag_counts
        .iter()
        .map(|(f, n)| (f.as_str().to_string(), json!(n)))
        .collect();
    json!({
        "trace_id": summary.trace_id.to_hex(),
        "root_service": summary.root_service,
        "root_name": summary.root_name,
        "start_unix_nano": summary.start_unix_nano,
        "duration_ms": summary.duration_ms,
        "answer_ms": summary.answer_ms,
        "budget_ms": summary.budget_ms,
        "outcome": summary.outcome.as_str(),
        "origins": summary.origins.iter().map(|(service, name)| json!({"service": service, "name": name})).collect::<Vec<_>>(),
        "burner": summary.burner.as_ref().map(|(service, name, own)| json!({"service": service, "name": name, "self_ms": own})),
        "flag_counts": flag_counts,
        "span_count": summary.span_count,
        "services": summary.services,
    })
}

fn bad(parameter: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(
        "invalid_parameter",
        format!("parameter {parameter}: {message}"),
    )
}

/// Validates search parameters. `now` anchors relative times such as `-1h`.
pub fn parse_query(params: &[(String, String)], now: u64) -> Result<TraceQuery, ApiError> {
    let mut query = TraceQuery {
        limit: DEFAULT_LIMIT,
        ..TraceQuery::default()
    };
    let (mut origin_service, mut origin_operation) = (None, None);
    for (key, value) in params {
        let value = value.trim();
        if value.is_empty() {
            continue; // An empty form field filters nothing.
        }
        let number = |name: &str| -> Result<Option<f64>, ApiError> {
            value
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .map(Some)
                .ok_or_else(|| {
                    bad(
                        name,
                        format!("{value:?} is not a number of milliseconds ≥ 0"),
                    )
                })
        };
        match key.as_str() {
            "service" => query.service = Some(value.to_string()),
            "operation" => query.operation = Some(value.to_string()),
            "origin_service" => origin_service = Some(value.to_string()),
            "origin_operation" => origin_operation = Some(value.to_string()),
            "flag" => {
                query.flag = Some(Flag::from_name(value).ok_or_else(|| {
                    let names: Vec<&str> = Flag::ALL.iter().map(|f| f.as_str()).collect();
                    bad(
                        "flag",
                        format!("{value:?} is not a flag; use one of {}", names.join(", ")),
                    )
                })?)
            }
            "outcome" => {
                query.outcome = Some(Outcome::from_name(value).ok_or_else(|| {
                    bad(
                        "outcome",
                        format!(
                            "{value:?} is not an outcome; use ok, exceeded, no_budget or too_large"
                        ),
                    )
                })?)
            }
            "min_duration_ms" => query.min_duration_ms = number(key)?,
            "max_duration_ms" => query.max_duration_ms = number(key)?,
            "min_budget_ms" => query.min_budget_ms = number(key)?,
            "max_budget_ms" => query.max_budget_ms = number(key)?,
            "since" => {
                query.since_unix_nano = Some(parse_time(value, now).map_err(|m| bad("since", m))?)
            }
            "until" => {
                query.until_unix_nano = Some(parse_time(value, now).map_err(|m| bad("until", m))?)
            }
            "attr" => query
                .attrs
                .push(parse_attr(value).map_err(|m| bad("attr", m))?),
            "limit" => {
                query.limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad(
                            "limit",
                            format!("{value:?} is not a whole number from 1 to {MAX_LIMIT}"),
                        )
                    })?
            }
            "cursor" => {
                query.cursor = Some(Cursor::decode(value).ok_or_else(|| {
                    bad(
                        "cursor",
                        "not a cursor from a previous answer's next_cursor; start again without it",
                    )
                })?)
            }
            other => {
                return Err(bad(
                    other,
                    "unknown; use service, operation, origin_service, origin_operation, flag, outcome, \
                     min_duration_ms, max_duration_ms, min_budget_ms, max_budget_ms, since, until, attr, \
                     limit or cursor",
                ));
            }
        }
    }
    query.origin = match (origin_service, origin_operation) {
        (Some(service), Some(operation)) => Some((service, operation)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(bad(
                "origin_service",
                "needs origin_operation too: the hop where the budget ran out is a service and an operation",
            ));
        }
        (None, Some(_)) => {
            return Err(bad(
                "origin_operation",
                "needs origin_service too: the hop where the budget ran out is a service and an operation",
            ));
        }
    };
    Ok(query)
}

/// `now`, `-15m` (relative to now), RFC 3339 (`2026-11-30T12:00:00Z`), or unix milliseconds.
pub fn parse_time(text: &str, now: u64) -> Result<u64, String> {
    if text == "now" {
        return Ok(now);
    }
    if let Some(ago) = text.strip_prefix('-') {
        let ago = humantime::parse_duration(ago)
            .map_err(|_| format!("{text:?}: expected e.g. -15m, -1h or -7d"))?;
        return Ok(now.saturating_sub(ago.as_nanos().min(u128::from(u64::MAX)) as u64));
    }
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms.saturating_mul(1_000_000));
    }
    humantime::parse_rfc3339_weak(text)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d: Duration| d.as_nanos().min(u128::from(u64::MAX)) as u64)
        .ok_or_else(|| {
            format!(
                "{text:?}: expected now, -15m, RFC 3339 (2026-11-30T12:00:00Z) or unix milliseconds"
            )
        })
}

/// `KEY<OP>VALUE` with OP one of `= != < <= > >=`; numeric when VALUE is a number.
pub fn parse_attr(text: &str) -> Result<AttrFilter, String> {
    let at = text.find(['<', '>', '!', '=']).ok_or_else(|| {
        format!("{text:?}: expected KEY<OP>VALUE, e.g. http.response.status_code>=500")
    })?;
    let (key, rest) = text.split_at(at);
    let (op, value) = [
        ("<=", AttrOp::Le),
        (">=", AttrOp::Ge),
        ("!=", AttrOp::Ne),
        ("<", AttrOp::Lt),
        (">", AttrOp::Gt),
        ("=", AttrOp::Eq),
    ]
    .into_iter()
    .find_map(|(token, op)| rest.strip_prefix(token).map(|value| (op, value)))
    .ok_or_else(|| format!("{text:?}: the operator must be one of = != < <= > >="))?;
    AttrFilter::new(key, op, value)
        .ok_or_else(|| format!("{text:?}: the attribute key must be non-empty and contain no '\"'"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::query::AttrOperand;

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_parameter_parses() {
        let now = 10_000_000_000_000;
        let query = parse_query(
            &params(&[
                ("service", "edge"),
                ("operation", "GET /"),
                ("flag", "inflated"),
                ("outcome", "exceeded"),
                ("min_duration_ms", "5"),
                ("max_budget_ms", "800"),
                ("since", "-1h"),
                ("until", "now"),
                ("attr", "http.response.status_code>=500"),
                ("attr", "http.route!=/health"),
                ("limit", "5"),
                ("min_budget_ms", ""),
            ]),
            now,
        )
        .unwrap();
        assert_eq!(query.service.as_deref(), Some("edge"));
        assert_eq!(query.flag, Some(Flag::Inflated));
        assert_eq!(query.outcome, Some(Outcome::Exceeded));
        assert_eq!(query.since_unix_nano, Some(now - 3_600_000_000_000));
        assert_eq!(query.until_unix_nano, Some(now));
        assert_eq!(
            query.attrs[0],
            AttrFilter {
                key: "http.response.status_code".into(),
                op: AttrOp::Ge,
                value: AttrOperand::Number(500.0)
            }
        );
        assert_eq!(
            query.attrs[1],
            AttrFilter {
                key: "http.route".into(),
                op: AttrOp::Ne,
                value: AttrOperand::Text("/health".into())
            }
        );
        assert_eq!(query.limit, 5);
        assert_eq!(query.min_budget_ms, None, "empty fields filter nothing");
    }

    #[test]
    fn times_accept_rfc3339_and_unix_milliseconds() {
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z", 0),
            Ok(1_700_000_000_000_000_000)
        );
        assert_eq!(
            parse_time("1700000000000", 0),
            Ok(1_700_000_000_000_000_000)
        );
        assert!(
            parse_time("yesterday", 0)
                .unwrap_err()
                .contains("expected now, -15m")
        );
    }

    #[test]
    fn invalid_parameters_are_named() {
        for (pairs, expected) in [
            (
                vec![("flag", "slow")],
                "parameter flag: \"slow\" is not a flag; use one of inflated, dropped",
            ),
            (vec![("outcome", "bad")], "parameter outcome"),
            (vec![("limit", "0")], "parameter limit"),
            (vec![("min_duration_ms", "-3")], "parameter min_duration_ms"),
            (vec![("attr", "novalue")], "parameter attr"),
            (vec![("attr", "a\"b=1")], "contain no '\"'"),
            (vec![("cursor", "xyz")], "parameter cursor"),
            (vec![("colour", "red")], "parameter colour: unknown"),
        ] {
            let error = parse_query(&params(&pairs), 0)
                .unwrap_err()
                .message()
                .to_string();
            assert!(error.contains(expected), "{pairs:?}: {error}");
        }
    }
}

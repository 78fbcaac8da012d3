//! A Jaeger-compatible query API under `/jaeger/api/…`: the HTTP JSON API that Jaeger's
//! query service gives its own UI and that Grafana's Jaeger data source reads (data source
//! URL `http://HOST:8080/jaeger`). Services, operations, trace search and trace by id, in
//! Jaeger's shapes (times in microseconds, tags as key/type/value, parents as `CHILD_OF`
//! references, resources as processes).
//!
//! Architecture invariant: the budget is never lost in translation: every span carries
//! budgetscope's numbers as `budgetscope.*` tags and its flags as Jaeger warnings, and the
//! root span links back to the budget waterfall (`budgetscope.waterfall`). Errors keep
//! Jaeger's envelope (`{"data": null, "errors": [{"code", "msg"}]}`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

use super::AppState;
use super::api::{parse_trace_id, too_large_instead};
use super::error::ApiError;
use super::read::whole_traces;
use super::search::MAX_LIMIT;
use crate::core::analyze::{Analysis, AnalyzeOptions, Row, analyze, hops};
use crate::core::model::{
    AttrValue, Attributes, Span, SpanKind, StatusCode as SpanStatus, TraceId,
};
use crate::store::query::{AttrFilter, AttrOp, TraceQuery};

/// Traces a search answers by default, as Jaeger's UI asks.
const DEFAULT_LIMIT: u32 = 20;

/// An error in Jaeger's envelope, with the HTTP status it names.
pub struct JaegerError {
    status: StatusCode,
    message: String,
}

impl JaegerError {
    fn bad(message: impl Into<String>) -> JaegerError {
        JaegerError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl From<ApiError> for JaegerError {
    fn from(error: ApiError) -> JaegerError {
        JaegerError {
            status: error.status(),
            message: error.message().to_string(),
        }
    }
}

impl IntoResponse for JaegerError {
    fn into_response(self) -> Response {
        let body = json!({
            "data": null, "total": 0, "limit": 0, "offset": 0,
            "errors": [{"code": self.status.as_u16(), "msg": self.message}],
        });
        (self.status, Json(body)).into_response()
    }
}

fn envelope(data: Value, total: usize) -> Json<Value> {
    Json(json!({"data": data, "total": total, "limit": 0, "offset": 0, "errors": null}))
}

/// `GET /jaeger/api/services`: service names, sorted.
pub async fn services(State(state): State<AppState>) -> Result<Json<Value>, JaegerError> {
    let services = state.store.services().await.map_err(ApiError::from)?;
    let total = services.len();
    Ok(envelope(json!(services), total))
}

/// `GET /jaeger/api/services/{service}/operations`: the service's span names.
pub async fn service_operations(
    State(state): State<AppState>,
    Path(service): Path<String>,
) -> Result<Json<Value>, JaegerError> {
    let mut names: Vec<String> = state
        .store
        .operations(&service)
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .map(|o| o.name)
        .collect();
    names.dedup();
    let total = names.len();
    Ok(envelope(json!(names), total))
}

/// `GET /jaeger/api/operations?service=S&spanKind=K`: names with their kinds.
pub async fn operations(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Json<Value>, JaegerError> {
    let service = params
        .get("service")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| JaegerError::bad("parameter 'service' is required"))?;
    let kind = params.get("spanKind").map(String::as_str).unwrap_or("");
    let operations: Vec<Value> = state
        .store
        .operations(service)
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .filter(|o| kind.is_empty() || o.kind.as_str() == kind)
        .map(|o| json!({"name": o.name, "spanKind": o.kind.as_str()}))
        .collect();
    let total = operations.len();
    Ok(envelope(Value::Array(operations), total))
}

/// `GET /jaeger/api/traces/{id}`: one trace, `data` holding it alone.
pub async fn trace(
    State(state): State<AppState>,
    Path(trace_id): Path<String>,
) -> Result<Response, JaegerError> {
    let id = parse_trace_id(&trace_id)?;
    let read = whole_traces(&state, &[id])
        .await
        .map_err(|e| e.api(&format!("trace {id}"), &too_large_instead(id)))?;
    let spans = read.spans;
    if spans.is_empty() {
        return Err(JaegerError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "trace not found: no spans stored for {id}; it may not have been exported yet, \
                 or it is older than the retention period"
            ),
        });
    }
    translate(vec![(id, spans)], &state).await
}

/// `GET /jaeger/api/traces?service=…`: the newest matching traces, whole. Parameters as
/// Jaeger's: `service` (required), `operation`, `tags` (a JSON object of attribute values),
/// `minDuration`/`maxDuration` (Go durations: `1.2s`, `300ms`), `start`/`end` (unix
/// microseconds) or `lookback` (`1h`), `limit`.
pub async fn search(
    State(state): State<AppState>,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<Response, JaegerError> {
    let now = crate::clock::now_unix_nano();
    let query = parse_search(&params, now)?;
    let summaries = state
        .store
        .search_traces(&query)
        .await
        .map_err(ApiError::from)?;
    // One read for all the traces, answered in the search's order (newest first).
    let ids: Vec<TraceId> = summaries.iter().map(|s| s.trace_id).collect();
    // The read's memory stays reserved until the answer is built.
    let mut read = match ids.is_empty() {
        true => None,
        false => {
            let what = format!("together, the {} traces found", ids.len());
            let instead = "Ask for fewer (limit), or open a trace on its own.";
            let read = whole_traces(&state, &ids).await;
            Some(read.map_err(|e| e.api(&what, instead))?)
        }
    };
    let mut by_trace = read
        .as_mut()
        .map(|read| hops::by_trace(std::mem::take(&mut read.spans)))
        .unwrap_or_default();
    let traces = ids
        .iter()
        .filter_map(|id| {
            let mut spans = by_trace.remove(id)?;
            spans.sort_by_key(|s| s.start_unix_nano);
            Some((*id, spans))
        })
        .collect();
    let answer = translate(traces, &state).await;
    drop(read);
    answer
}

/// Jaeger's search parameters as a `TraceQuery`; each invalid one named in a 400.
pub fn parse_search(params: &[(String, String)], now: u64) -> Result<TraceQuery, JaegerError> {
    let mut query = TraceQuery {
        limit: DEFAULT_LIMIT,
        ..TraceQuery::default()
    };
    let mut lookback = None;
    for (key, value) in params {
        let value = value.trim();
        if value.is_empty() {
            continue;
        }
        let micros = || {
            value
                .parse::<u64>()
                .map(|us| us.saturating_mul(1_000))
                .map_err(|_| {
                    JaegerError::bad(format!(
                        "parameter '{key}': {value:?} is not a time in unix microseconds"
                    ))
                })
        };
        let duration = || {
            parse_go_duration(value).map(|ns| ns / 1e6).ok_or_else(|| {
                JaegerError::bad(format!(
                    "parameter '{key}': {value:?} is not a duration such as 1.2s, 300ms or 500us"
                ))
            })
        };
        match key.as_str() {
            "service" => query.service = Some(value.to_string()),
            "operation" => query.operation = Some(value.to_string()),
            "tags" | "tag" => query.attrs.extend(parse_tags(key, value)?),
            "minDuration" => query.min_duration_ms = Some(duration()?),
            "maxDuration" => query.max_duration_ms = Some(duration()?),
            "start" => query.since_unix_nano = Some(micros()?),
            "end" => query.until_unix_nano = Some(micros()?),
            "lookback" => lookback = Some(value.to_string()),
            "limit" => {
                query.limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        JaegerError::bad(format!(
                            "parameter 'limit': {value:?} is not a whole number from 1 to {MAX_LIMIT}"
                        ))
                    })?;
            }
            // Jaeger's UI sends these; they change nothing here.
            "spanKind" | "prettyPrint" => {}
            other => {
                return Err(JaegerError::bad(format!(
                    "parameter '{other}' is unknown; use service, operation, tags, minDuration, \
                     maxDuration, start, end, lookback or limit"
                )));
            }
        }
    }
    if query.service.is_none() {
        return Err(JaegerError::bad("parameter 'service' is required"));
    }
    // `lookback` counts only without `start` (Jaeger's UI sends "custom" beside it).
    if query.since_unix_nano.is_none()
        && let Some(lookback) = lookback.filter(|l| l != "custom")
    {
        let ago = humantime::parse_duration(&lookback).map_err(|_| {
            JaegerError::bad(format!(
                "parameter 'lookback': {lookback:?} is not a duration such as 1h or 2d"
            ))
        })?;
        query.since_unix_nano = Some(now.saturating_sub(ago.as_nanos() as u64));
    }
    Ok(query)
}

/// `{"http.status_code":"500","error":"true"}` (what Grafana sends), or Jaeger's older
/// `key:value` form of one `tag` parameter.
fn parse_tags(key: &str, value: &str) -> Result<Vec<AttrFilter>, JaegerError> {
    let pairs: Vec<(String, String)> = if value.starts_with('{') {
        let object: serde_json::Map<String, Value> = serde_json::from_str(value).map_err(|_| {
            JaegerError::bad(format!(
                "parameter '{key}': not a JSON object of tag values, e.g. {{\"error\":\"true\"}}"
            ))
        })?;
        object
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, v)
            })
            .collect()
    } else {
        let (k, v) = value.split_once(':').ok_or_else(|| {
            JaegerError::bad(format!(
                "parameter '{key}': expected KEY:VALUE or a JSON object of tag values"
            ))
        })?;
        vec![(k.to_string(), v.to_string())]
    };
    pairs
        .into_iter()
        .map(|(k, v)| {
            AttrFilter::new(&k, AttrOp::Eq, &v).ok_or_else(|| {
                JaegerError::bad(format!(
                    "parameter '{key}': a tag key must be non-empty and contain no '\"'"
                ))
            })
        })
        .collect()
}

/// A Go duration (`1h2m`, `1.5s`, `300ms`, `10us`, `10µs`, `5ns`) in nanoseconds.
pub fn parse_go_duration(text: &str) -> Option<f64> {
    const UNITS: [(&str, f64); 8] = [
        ("ns", 1.0),
        ("us", 1e3),
        ("µs", 1e3),
        ("μs", 1e3),
        ("ms", 1e6),
        ("s", 1e9),
        ("m", 60e9),
        ("h", 3600e9),
    ];
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        // Longest unit first: "ms" before "m", "ns"/"us" before "s".
        let (unit, scale) = UNITS
            .iter()
            .filter(|(unit, _)| rest.starts_with(unit))
            .max_by_key(|(unit, _)| unit.len())?;
        rest = &rest[unit.len()..];
        total += number * scale;
    }
    total.is_finite().then_some(total)
}

/// Analyses and translates traces off the async workers (large traces take real CPU).
async fn translate(
    traces: Vec<(TraceId, Vec<Span>)>,
    state: &AppState,
) -> Result<Response, JaegerError> {
    let options = state.analyze.clone();
    let external_url = state.external_url.clone();
    let body = tokio::task::spawn_blocking(move || {
        let mut out = br#"{"data":["#.to_vec();
        for (i, (id, spans)) in traces.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_trace_json(&mut out, *id, spans, &options, &external_url);
        }
        let tail = format!(
            r#"],"total":{},"limit":0,"offset":0,"errors":null}}"#,
            traces.len()
        );
        out.extend_from_slice(tail.as_bytes());
        out
    })
    .await
    .map_err(|_| {
        JaegerError::from(ApiError::internal(
            "the analysis of these traces was interrupted; retry",
        ))
    })?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// One trace in Jaeger's shape, with budgetscope's analysis on its spans, written span by
/// span: each span's JSON tree lives only while it is written, so a read holds the spans and
/// the text, not a tree of every span (`cargo bench --bench memory`).
pub fn write_trace_json(
    out: &mut Vec<u8>,
    id: TraceId,
    spans: &[Span],
    options: &AnalyzeOptions,
    external_url: &str,
) {
    let analysis = analyze(spans, options);
    let rows = rows_by_span(spans, &analysis);
    // One process per service and resource, numbered in order of first appearance.
    let mut processes: Vec<(String, Value)> = Vec::new();
    let mut process_ids = Vec::with_capacity(spans.len());
    for span in spans {
        let process = json!({"serviceName": span.service, "tags": tags(&span.resource)});
        let index = match processes.iter().position(|(_, p)| *p == process) {
            Some(index) => index,
            None => {
                processes.push((format!("p{}", processes.len() + 1), process));
                processes.len() - 1
            }
        };
        process_ids.push(processes[index].0.clone());
    }
    let root = analysis.rows.first().map(|row| row.span);
    let waterfall = format!("{external_url}/traces/{id}");
    // Writing to a Vec cannot fail; the values are JSON trees already.
    out.extend_from_slice(br#"{"traceID":""#);
    out.extend_from_slice(id.to_hex().as_bytes());
    out.extend_from_slice(br#"","spans":["#);
    for (i, span) in spans.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let link = (Some(i) == root).then_some(waterfall.as_str());
        let _ = serde_json::to_writer(&mut *out, &span_json(span, &process_ids[i], rows[i], link));
    }
    out.extend_from_slice(br#"],"processes":"#);
    let processes: serde_json::Map<String, Value> = processes.into_iter().collect();
    let _ = serde_json::to_writer(&mut *out, &processes);
    out.extend_from_slice(br#","warnings":null}"#);
}

fn rows_by_span<'a>(spans: &[Span], analysis: &'a Analysis) -> Vec<Option<&'a Row>> {
    let mut rows = vec![None; spans.len()];
    for row in &analysis.rows {
        if let Some(slot) = rows.get_mut(row.span) {
            *slot = Some(row);
        }
    }
    rows
}

fn span_json(span: &Span, process_id: &str, row: Option<&Row>, waterfall: Option<&str>) -> Value {
    let trace_id = span.trace_id.to_hex();
    let mut references: Vec<Value> = span
        .parent_span_id
        .iter()
        .map(
            |parent| json!({"refType": "CHILD_OF", "traceID": trace_id, "spanID": parent.to_hex()}),
        )
        .collect();
    references.extend(span.links.iter().map(|link| {
        json!({"refType": "FOLLOWS_FROM", "traceID": link.trace_id.to_hex(), "spanID": link.span_id.to_hex()})
    }));
    let mut tags = tags(&span.attributes);
    let mut tag = |key: &str, value: Value| tags.push(typed(key, value));
    if span.kind != SpanKind::Unspecified {
        tag("span.kind", json!(span.kind.as_str()));
    }
    match span.status.code {
        SpanStatus::Error => {
            tag("error", json!(true));
            tag("otel.status_code", json!("ERROR"));
        }
        SpanStatus::Ok => tag("otel.status_code", json!("OK")),
        SpanStatus::Unset => {}
    }
    if !span.status.message.is_empty() {
        tag("otel.status_description", json!(span.status.message));
    }
    if !span.scope.name.is_empty() {
        tag("otel.scope.name", json!(span.scope.name));
    }
    if !span.scope.version.is_empty() {
        tag("otel.scope.version", json!(span.scope.version));
    }
    let mut warnings: Vec<String> = Vec::new();
    if let Some(row) = row {
        if let Some(budget) = row.budget_ms {
            tag("budgetscope.budget_ms", json!(budget));
        }
        if let Some(available) = row.available_ms {
            tag("budgetscope.available_ms", json!(available));
        }
        if let Some(own) = row.self_ms {
            tag("budgetscope.self_ms", json!(own));
        }
        if let Some(burn) = row.burn {
            tag("budgetscope.burn", json!(burn));
        }
        if let Some(exceed) = row.exceed {
            tag("budgetscope.exceeded", json!(exceed.as_str()));
        }
        if !row.flags.is_empty() {
            let flags: Vec<&str> = row.flags.iter().map(|f| f.flag.as_str()).collect();
            tag("budgetscope.flags", json!(flags.join(",")));
        }
        warnings.extend(
            row.flags
                .iter()
                .map(|f| format!("{}: {}", f.flag.as_str(), f.message)),
        );
        warnings.extend(row.warnings.iter().cloned());
    } else {
        warnings.extend(span.warnings.iter().cloned());
    }
    if let Some(url) = waterfall {
        tag("budgetscope.waterfall", json!(url));
    }
    let logs: Vec<Value> = span
        .events
        .iter()
        .map(|event| {
            let mut fields = vec![typed("event", json!(event.name))];
            fields.extend(self::tags(&event.attributes));
            json!({"timestamp": event.time_unix_nano / 1_000, "fields": fields})
        })
        .collect();
    json!({
        "traceID": trace_id,
        "spanID": span.span_id.to_hex(),
        "operationName": span.name,
        "references": references,
        "startTime": span.start_unix_nano / 1_000,
        "duration": span.duration_nanos() / 1_000,
        "tags": tags,
        "logs": logs,
        "processID": process_id,
        "warnings": if warnings.is_empty() { Value::Null } else { json!(warnings) },
        "flags": 1,
    })
}

/// Attributes as Jaeger tags: strings, bools, int64s and float64s as they are, bytes as
/// base64 `binary`, arrays and maps as their JSON text.
fn tags(attributes: &Attributes) -> Vec<Value> {
    attributes
        .iter()
        .map(|(key, value)| match value {
            AttrValue::String(s) => typed(key, json!(s)),
            AttrValue::Bool(b) => typed(key, json!(b)),
            AttrValue::Int(n) => typed(key, json!(n)),
            AttrValue::Double(x) => typed(key, json!(x)),
            AttrValue::Bytes(bytes) => json!({
                "key": key, "type": "binary",
                "value": base64::engine::general_purpose::STANDARD.encode(bytes),
            }),
            AttrValue::Empty => typed(key, json!("")),
            AttrValue::Array(_) | AttrValue::Map(_) => typed(
                key,
                json!(crate::core::attr_json::value_to_json(value).to_string()),
            ),
        })
        .collect()
}

/// A tag whose Jaeger type follows its JSON value.
fn typed(key: &str, value: Value) -> Value {
    let kind = match &value {
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int64",
        Value::Number(_) => "float64",
        _ => "string",
    };
    json!({"key": key, "type": kind, "value": value})
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
    fn go_durations_parse_as_jaeger_writes_them() {
        assert_eq!(parse_go_duration("1.5s"), Some(1.5e9));
        assert_eq!(parse_go_duration("300ms"), Some(300e6));
        assert_eq!(parse_go_duration("10us"), Some(10e3));
        assert_eq!(parse_go_duration("10µs"), Some(10e3));
        assert_eq!(parse_go_duration("1h2m"), Some(3720e9));
        assert_eq!(parse_go_duration("5ns"), Some(5.0));
        for bad in ["", "10", "ms", "1.2.3s", "10 parsecs", "1d"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn search_parameters_become_a_trace_query() {
        let now = 10_000_000_000_000;
        let query = parse_search(
            &params(&[
                ("service", "checkout"),
                ("operation", "GET /cart"),
                ("tags", r#"{"http.status_code":"500","error":true}"#),
                ("minDuration", "1.5ms"),
                ("maxDuration", "2s"),
                ("start", "1000"),
                ("end", "2000"),
                ("lookback", "custom"),
                ("limit", "50"),
            ]),
            now,
        )
        .ok()
        .unwrap();
        assert_eq!(query.service.as_deref(), Some("checkout"));
        assert_eq!(query.operation.as_deref(), Some("GET /cart"));
        assert_eq!(query.min_duration_ms, Some(1.5));
        assert_eq!(query.max_duration_ms, Some(2000.0));
        assert_eq!(query.since_unix_nano, Some(1_000_000));
        assert_eq!(query.until_unix_nano, Some(2_000_000));
        assert_eq!(query.limit, 50);
        assert_eq!(query.attrs.len(), 2);
        assert_eq!(query.attrs[0].value, AttrOperand::Number(500.0));
        assert_eq!(query.attrs[1].value, AttrOperand::Text("true".into()));
        let lookback = parse_search(&params(&[("service", "s"), ("lookback", "1h")]), now)
            .ok()
            .unwrap();
        assert_eq!(lookback.since_unix_nano, Some(now - 3_600_000_000_000));
        assert_eq!(
            parse_search(&params(&[("service", "s"), ("tag", "a:b")]), now)
                .ok()
                .unwrap()
                .attrs[0]
                .key,
            "a"
        );
    }

    #[test]
    fn bad_search_parameters_are_named() {
        let now = 10_000_000_000_000;
        for (pairs, named) in [
            (&[("operation", "x")][..], "'service' is required"),
            (
                &[("service", "s"), ("minDuration", "fast")],
                "'minDuration'",
            ),
            (&[("service", "s"), ("start", "yesterday")], "'start'"),
            (&[("service", "s"), ("limit", "0")], "'limit'"),
            (&[("service", "s"), ("tags", "{oops")], "'tags'"),
            (&[("service", "s"), ("tags", r#"{"":"x"}"#)], "'tags'"),
            (&[("service", "s"), ("lookback", "ages")], "'lookback'"),
            (&[("service", "s"), ("color", "red")], "'color' is unknown"),
        ] {
            let error = parse_search(&params(pairs), now).err().unwrap();
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
            assert!(error.message.contains(named), "{}", error.message);
        }
    }
}

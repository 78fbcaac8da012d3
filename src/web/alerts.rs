//! The alerts JSON API: `/api/alerts` (instances), `/api/alerts/rules` (with create,
//! replace, delete, backtest and test notification), `/api/alerts/history`,
//! `/api/alerts/notifications` (the delivery log) and `/api/alerts/silences`.

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, check_params};
use super::search::parse_time;
use crate::core::alerts::backtest::Backtest;
use crate::core::alerts::rules::{Rule, RuleError, RuleSource, RuleSpec, validate_rule};
use crate::core::alerts::silence::{Silence, parse_matchers};
use crate::pipeline::alerter::{self, refresh_stored_rules};
use crate::store::query::HistoryQuery;
use crate::store::query::NotificationQuery;

/// The most rows one history or delivery-log request returns.
const MAX_LIMIT: u32 = 10_000;

fn now() -> u64 {
    crate::clock::now_unix_nano()
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
        "repeat_interval": rule.repeat_interval.map(duration),
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
    let broken: Vec<Value> = state
        .rules
        .broken()
        .iter()
        .map(|(name, errors)| json!({"name": name, "problems": problems_message(errors)}))
        .collect();
    Json(json!({
        "not_in_force": broken,
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
        .notifications(&NotificationQuery {
            rule: rule.as_deref(),
            limit: limit(&params, 100)?,
        })
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

/// Every problem of a rule as one message: `field window: …; field op: …`.
pub fn problems_message(errors: &[RuleError]) -> String {
    errors
        .iter()
        .map(|e| {
            if e.field.is_empty() {
                e.problem.clone()
            } else {
                format!("field {}: {}", e.field, e.problem)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            "invalid_body",
            format!("the body is not a valid {what}: {e}"),
        )
    })
}

fn invalid_rule(errors: &[RuleError]) -> ApiError {
    ApiError::bad_request("invalid_rule", problems_message(errors))
}

/// A rule of the rules file cannot be changed here.
fn file_rule(name: &str) -> ApiError {
    ApiError::conflict(
        "rule_in_file",
        format!("rule {name:?} is defined in the rules file; edit the file and send SIGHUP"),
    )
}

/// Stores a validated rule and brings the rules in force up to date.
async fn store_rule(state: &AppState, rule: &Rule, spec: &RuleSpec) -> Result<(), ApiError> {
    let definition = serde_json::to_string(spec)
        .map_err(|e| ApiError::internal(format!("the rule could not be encoded: {e}")))?;
    state
        .store
        .put_alert_rule(&rule.name, &definition, now())
        .await?;
    refresh_stored_rules(state.store.as_ref(), &state.rules).await?;
    Ok(())
}

/// Where a named rule is defined: `Some(true)` in the file, `Some(false)` stored.
pub async fn rule_origin(state: &AppState, name: &str) -> Result<Option<bool>, ApiError> {
    if let Some(rule) = state.rules.current().rules.iter().find(|r| r.name == name) {
        return Ok(Some(rule.source == RuleSource::File));
    }
    let stored = state.store.alert_rule_specs().await?;
    Ok(stored.iter().any(|(n, _)| n == name).then_some(false))
}

/// Creates (`existing` None) or replaces a stored rule from its spec.
pub async fn save_rule(
    state: &AppState,
    spec: &RuleSpec,
    existing: Option<&str>,
) -> Result<Rule, Result<Vec<RuleError>, ApiError>> {
    let rule = state.rules.validate_stored(spec).map_err(Ok)?;
    match existing {
        Some(name) if name != rule.name => {
            return Err(Ok(vec![RuleError {
                place: format!("rule {name:?}"),
                field: "name".into(),
                problem: "a rule cannot be renamed; create a new one and delete this one".into(),
            }]));
        }
        None if rule_origin(state, &rule.name).await.map_err(Err)?.is_some() => {
            return Err(Ok(vec![RuleError {
                place: format!("rule {:?}", rule.name),
                field: "name".into(),
                problem: "another rule has this name".into(),
            }]));
        }
        _ => {}
    }
    store_rule(state, &rule, spec).await.map_err(Err)?;
    Ok(rule)
}

fn save_error(error: Result<Vec<RuleError>, ApiError>) -> ApiError {
    match error {
        Ok(errors) => invalid_rule(&errors),
        Err(error) => error,
    }
}

pub async fn create_rule(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let spec: RuleSpec = parse_body(&body, "rule")?;
    let rule = save_rule(&state, &spec, None).await.map_err(save_error)?;
    Ok((StatusCode::CREATED, Json(rule_json(&rule))))
}

pub async fn replace_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let mut spec: RuleSpec = parse_body(&body, "rule")?;
    spec.name.get_or_insert_with(|| name.clone());
    match rule_origin(&state, &name).await? {
        None => return Err(no_rule(&name)),
        Some(true) => return Err(file_rule(&name)),
        Some(false) => {}
    }
    let rule = save_rule(&state, &spec, Some(&name))
        .await
        .map_err(save_error)?;
    Ok(Json(rule_json(&rule)))
}

fn no_rule(name: &str) -> ApiError {
    ApiError::not_found(
        "rule_not_found",
        format!("no rule is named {name:?}; GET /api/alerts/rules lists them"),
    )
}

pub async fn delete_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if rule_origin(&state, &name).await? == Some(true) {
        return Err(file_rule(&name));
    }
    if !state.store.delete_alert_rule(&name).await? {
        return Err(no_rule(&name));
    }
    refresh_stored_rules(state.store.as_ref(), &state.rules).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A backtest's answer.
pub fn backtest_json(result: &Backtest, selected: usize) -> Value {
    json!({
        "hops_selected": selected,
        "hops_tried": result.hops,
        "evaluations": result.evaluations,
        "episodes": result.episodes,
    })
}

/// Backtests a rule as written, before it is saved: its problems, or the backtest and how
/// many hops it selects. Receivers do not change what fires, and a name is not needed.
pub async fn backtest_spec(
    state: &AppState,
    spec: &RuleSpec,
) -> Result<(Backtest, usize), Result<Vec<RuleError>, ApiError>> {
    let mut probe = spec.clone();
    probe.receivers.clear();
    probe.name.get_or_insert_with(|| "backtest".into());
    let rule =
        validate_rule(&probe, "the rule", RuleSource::Database, &BTreeSet::new()).map_err(Ok)?;
    alerter::backtest(
        state.store.as_ref(),
        &rule,
        now(),
        state.analyze.tolerance_ms,
    )
    .await
    .map_err(|e| Err(e.into()))
}

pub async fn backtest(State(state): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let spec: RuleSpec = parse_body(&body, "rule")?;
    let (result, selected) = backtest_spec(&state, &spec).await.map_err(save_error)?;
    Ok(Json(backtest_json(&result, selected)))
}

pub async fn test_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let set = state.rules.current();
    let rule = set
        .rules
        .iter()
        .find(|r| r.name == name)
        .ok_or_else(|| no_rule(&name))?;
    if rule.receivers.is_empty() {
        return Err(ApiError::bad_request(
            "no_receivers",
            format!("rule {name:?} names no receivers; add some to test them"),
        ));
    }
    let deliveries = alerter::send_test(rule, &set.receivers, &state.external_url, now()).await;
    Ok(Json(json!({ "deliveries": deliveries })))
}

pub fn silence_json(silence: &Silence, now: u64) -> Value {
    let mut value = serde_json::to_value(silence).unwrap_or(Value::Null);
    value["status"] = json!(silence.status(now));
    value
}

pub async fn silences(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let now = now();
    let all = state.store.silences().await?;
    Ok(Json(json!({
        "silences": all.iter().map(|s| silence_json(s, now)).collect::<Vec<_>>(),
    })))
}

/// A silence as sent to the API or a form, before validation.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SilenceSpec {
    /// `["service=inventory", …]` or one string `service=inventory, severity!=warning`.
    pub matchers: MatcherList,
    /// RFC 3339, unix ms, `now` or `-15m`; default now.
    #[serde(default)]
    pub starts_at: Option<String>,
    /// The end, as `starts_at`; or `duration`.
    #[serde(default)]
    pub ends_at: Option<String>,
    /// e.g. `2h`; default 2h when `ends_at` is not given.
    #[serde(default)]
    pub duration: Option<String>,
    #[serde(default)]
    pub comment: String,
    #[serde(default)]
    pub created_by: String,
}

#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub enum MatcherList {
    List(Vec<String>),
    Text(String),
}

impl Default for MatcherList {
    fn default() -> Self {
        MatcherList::Text(String::new())
    }
}

/// Validates a silence; errors name the field.
pub fn validate_silence(spec: &SilenceSpec, now: u64) -> Result<Silence, String> {
    let text = match &spec.matchers {
        MatcherList::List(list) => list.join(","),
        MatcherList::Text(text) => text.clone(),
    };
    let matchers = parse_matchers(&text).map_err(|e| format!("field matchers: {e}"))?;
    let time = |field: &str, text: &Option<String>| -> Result<Option<u64>, String> {
        match text.as_deref().map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(None),
            Some(t) => parse_time(t, now)
                .map(Some)
                .map_err(|e| format!("field {field}: {e}")),
        }
    };
    let starts = time("starts_at", &spec.starts_at)?.unwrap_or(now);
    let ends = match (time("ends_at", &spec.ends_at)?, spec.duration.as_deref()) {
        (Some(end), _) => end,
        (None, duration) => {
            let duration = humantime::parse_duration(duration.unwrap_or("2h").trim())
                .map_err(|_| "field duration: expected a duration such as 2h or 30m".to_string())?;
            starts.saturating_add(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
        }
    };
    if ends <= starts {
        return Err("field ends_at: must be later than starts_at".into());
    }
    if spec.comment.trim().is_empty() {
        return Err("field comment: say why, so that others know whether it may end".into());
    }
    Ok(Silence {
        id: 0,
        matchers,
        starts_unix_nano: starts,
        ends_unix_nano: ends,
        comment: spec.comment.trim().to_string(),
        created_by: spec.created_by.trim().to_string(),
        created_unix_nano: now,
    })
}

pub async fn create_silence(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let spec: SilenceSpec = parse_body(&body, "silence")?;
    let now = now();
    let mut silence =
        validate_silence(&spec, now).map_err(|m| ApiError::bad_request("invalid_silence", m))?;
    silence.id = state.store.put_silence(&silence).await?;
    Ok((StatusCode::CREATED, Json(silence_json(&silence, now))))
}

/// Ends a silence now (it stays listed as expired).
pub async fn expire_silence_now(state: &AppState, id: i64) -> Result<Silence, ApiError> {
    let now = now();
    let mut silence = state
        .store
        .silences()
        .await?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| {
            ApiError::not_found(
                "silence_not_found",
                format!("no silence has id {id}; GET /api/alerts/silences lists them"),
            )
        })?;
    if silence.ends_unix_nano > now {
        silence.ends_unix_nano = now.max(silence.starts_unix_nano + 1);
        state.store.put_silence(&silence).await?;
    }
    Ok(silence)
}

pub async fn expire_silence(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    let silence = expire_silence_now(&state, id).await?;
    Ok(Json(silence_json(&silence, now())))
}

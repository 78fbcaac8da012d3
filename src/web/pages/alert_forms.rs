//! The alert forms: create, edit (with a backtest before saving), delete, pause and test a
//! stored rule; create and expire silences. Every form posts to the page it came from and
//! answers with a redirect (so back and reload are safe), or with the form again, its
//! problems next to their fields.

use std::collections::BTreeMap;

use askama::Template;
use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Redirect, Response};

use super::{PageError, enc, fmt_duration, fmt_time, hop_href, html};
use crate::clock::now_unix_nano;
use crate::core::alerts::notify::fmt_value;
use crate::core::alerts::rules::{RuleError, RuleSpec, Signal};
use crate::pipeline::alerter;
use crate::web::AppState;
use crate::web::alerts::{
    backtest_spec, expire_silence_now, rule_origin, save_rule, validate_silence,
};

/// One input of the rule form.
pub struct Field {
    pub name: &'static str,
    pub label: &'static str,
    pub hint: &'static str,
    pub value: String,
    /// Choices for a select; empty for a text input.
    pub options: Vec<(String, bool)>,
    pub error: String,
}

pub struct EpisodeRow {
    pub hop: String,
    pub hop_href: String,
    pub fired: String,
    pub resolved: String,
    pub lasted: String,
    pub severity: &'static str,
    pub worst: String,
}

pub struct BacktestView {
    pub summary: String,
    pub episodes: Vec<EpisodeRow>,
}

#[derive(Template)]
#[template(path = "alert_form.html")]
pub struct RuleFormPage {
    pub nav: &'static str,
    pub title: String,
    pub action: String,
    pub cancel: String,
    pub fields: Vec<Field>,
    pub receivers: Vec<(String, bool)>,
    pub paused: bool,
    pub problems: Vec<String>,
    pub backtest: Option<BacktestView>,
}

const SIGNAL_HINT: &str = "what is watched on each selected hop";

/// The form's fields, in order, filled from a spec.
fn fields(spec: &RuleSpec) -> Vec<Field> {
    let number = |n: Option<f64>| n.map(|v| fmt_value(Some(v))).unwrap_or_default();
    let text = |t: &Option<String>| t.clone().unwrap_or_default();
    let labels = spec
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let choose = |all: Vec<String>, current: &Option<String>| -> Vec<(String, bool)> {
        all.into_iter()
            .map(|o| {
                let selected = current.as_deref() == Some(o.as_str());
                (o, selected)
            })
            .collect()
    };
    let plain = |name, label, hint, value| Field {
        name,
        label,
        hint,
        value,
        options: Vec::new(),
        error: String::new(),
    };
    vec![
        plain(
            "name",
            "Name",
            "unique; cannot be changed later",
            text(&spec.name),
        ),
        plain(
            "service",
            "Service",
            "glob, e.g. inventory or pay*; empty: every service",
            text(&spec.service),
        ),
        plain(
            "operation",
            "Operation",
            "glob, e.g. GET /items/*; empty: every operation",
            text(&spec.operation),
        ),
        Field {
            options: choose(
                Signal::ALL.iter().map(|s| s.as_str().to_string()).collect(),
                &spec.signal,
            ),
            ..plain("signal", "Signal", SIGNAL_HINT, text(&spec.signal))
        },
        Field {
            options: choose([">", ">=", "<", "<="].map(String::from).to_vec(), &spec.op),
            ..plain("op", "Comparison", "", text(&spec.op))
        },
        plain(
            "threshold",
            "Threshold (critical)",
            "e.g. 0.05 for 5 %",
            number(spec.threshold),
        ),
        plain(
            "warning",
            "Warning threshold",
            "optional, looser than the critical one",
            number(spec.warning),
        ),
        plain(
            "resolve_threshold",
            "Resolve threshold",
            "optional: once firing, clears only past it",
            number(spec.resolve_threshold),
        ),
        plain(
            "window",
            "Window",
            "e.g. 5m (1m to 24h)",
            text(&spec.window),
        ),
        plain(
            "for",
            "For",
            "how long it must hold before firing, e.g. 2m",
            text(&spec.for_),
        ),
        plain(
            "keep_firing_for",
            "Keep firing for",
            "optional, e.g. 5m",
            text(&spec.keep_firing_for),
        ),
        plain(
            "repeat_interval",
            "Repeat every",
            "optional: notify again while firing, e.g. 4h",
            text(&spec.repeat_interval),
        ),
        plain(
            "min_requests",
            "Minimum requests",
            "no alert on a hop with fewer in the window",
            spec.min_requests.map(|n| n.to_string()).unwrap_or_default(),
        ),
        plain(
            "objective",
            "Objective",
            "slo_burn_rate only, e.g. 0.99",
            number(spec.objective),
        ),
        plain(
            "short_window",
            "Short window",
            "slo_burn_rate only, e.g. 5m",
            text(&spec.short_window),
        ),
        plain("labels", "Labels", "e.g. team=stock, tier=1", labels),
        plain(
            "summary",
            "Summary",
            "may use {{service}} {{operation}} {{value}} {{threshold}}",
            spec.annotations.get("summary").cloned().unwrap_or_default(),
        ),
    ]
}

/// Reads the posted form into a spec; values that are not numbers become problems.
fn spec_from_form(form: &[(String, String)]) -> (RuleSpec, Vec<RuleError>, String) {
    let mut spec = RuleSpec::default();
    let mut errors = Vec::new();
    let mut action = String::new();
    let mut bad = |field: &str, problem: String| {
        errors.push(RuleError {
            place: String::new(),
            field: field.into(),
            problem,
        })
    };
    for (key, value) in form {
        let value = value.trim();
        let opt = || (!value.is_empty()).then(|| value.to_string());
        let mut num = |field: &str| -> Option<f64> {
            if value.is_empty() {
                return None;
            }
            value.parse::<f64>().ok().or_else(|| {
                bad(field, format!("{value:?} is not a number"));
                None
            })
        };
        match key.as_str() {
            "name" => spec.name = opt(),
            "service" => spec.service = opt(),
            "operation" => spec.operation = opt(),
            "signal" => spec.signal = opt(),
            "op" => spec.op = opt(),
            "threshold" => spec.threshold = num("threshold"),
            "warning" => spec.warning = num("warning"),
            "resolve_threshold" => spec.resolve_threshold = num("resolve_threshold"),
            "objective" => spec.objective = num("objective"),
            "window" => spec.window = opt(),
            "for" => spec.for_ = opt(),
            "keep_firing_for" => spec.keep_firing_for = opt(),
            "repeat_interval" => spec.repeat_interval = opt(),
            "short_window" => spec.short_window = opt(),
            "min_requests" if !value.is_empty() => match value.parse() {
                Ok(n) => spec.min_requests = Some(n),
                Err(_) => bad("min_requests", format!("{value:?} is not a whole number")),
            },
            "labels" => {
                for pair in value.split(',').filter(|p| !p.trim().is_empty()) {
                    match pair.split_once('=') {
                        Some((k, v)) => {
                            spec.labels
                                .insert(k.trim().to_string(), v.trim().to_string());
                        }
                        None => bad("labels", format!("{:?}: expected name=value", pair.trim())),
                    }
                }
            }
            "summary" if !value.is_empty() => {
                spec.annotations.insert("summary".into(), value.to_string());
            }
            "receivers" if !value.is_empty() => spec.receivers.push(value.to_string()),
            "paused" => spec.paused = value == "on" || value == "true",
            "action" => action = value.to_string(),
            _ => {}
        }
    }
    (spec, errors, action)
}

fn backtest_view(
    result: &crate::core::alerts::backtest::Backtest,
    selected: usize,
) -> BacktestView {
    let fired = result.episodes.len();
    let mut summary = match fired {
        0 => "This rule would not have fired in the last 24 hours".to_string(),
        1 => "This rule would have fired once in the last 24 hours".to_string(),
        n => format!("This rule would have fired {n} times in the last 24 hours"),
    };
    summary.push_str(&format!(
        " (evaluated once a minute, {} evaluations, over {} hop{}",
        result.evaluations,
        result.hops,
        if result.hops == 1 { "" } else { "s" }
    ));
    if selected > result.hops {
        summary.push_str(&format!(
            "; the rule selects {selected} hops, and the {} with the most requests were tried",
            result.hops
        ));
    }
    summary.push_str(").");
    BacktestView {
        summary,
        episodes: result
            .episodes
            .iter()
            .map(|e| EpisodeRow {
                hop: format!("{} {}", e.service, e.operation),
                hop_href: hop_href(&e.service, &e.operation, ""),
                fired: fmt_time(e.fired_at),
                resolved: e.resolved_at.map_or("still firing".into(), fmt_time),
                lasted: e
                    .resolved_at
                    .map(|r| fmt_duration((r - e.fired_at) as f64 / 1e6))
                    .unwrap_or_default(),
                severity: e.severity.as_str(),
                worst: fmt_value(e.worst_value),
            })
            .collect(),
    }
}

fn form_page(
    state: &AppState,
    spec: &RuleSpec,
    editing: Option<&str>,
    errors: &[RuleError],
    backtest: Option<BacktestView>,
) -> RuleFormPage {
    let mut fields = fields(spec);
    let mut problems = Vec::new();
    for error in errors {
        match fields.iter_mut().find(|f| f.name == error.field) {
            Some(field) if !error.field.is_empty() => {
                if !field.error.is_empty() {
                    field.error.push_str("; ");
                }
                field.error.push_str(&error.problem);
            }
            _ if error.field == "annotations" => {
                if let Some(field) = fields.iter_mut().find(|f| f.name == "summary") {
                    field.error.push_str(&error.problem);
                }
            }
            _ => problems.push(if error.field.is_empty() {
                error.problem.clone()
            } else {
                format!("{}: {}", error.field, error.problem)
            }),
        }
    }
    if editing.is_some() {
        // A stored rule keeps its name.
        fields.retain(|f| f.name != "name");
    }
    let set = state.rules.current();
    RuleFormPage {
        nav: "alerts",
        title: match editing {
            Some(name) => format!("Edit {name}"),
            None => "New alert rule".into(),
        },
        action: match editing {
            Some(name) => format!("/alerts/rules/{}/edit", enc(name)),
            None => "/alerts/rules/new".into(),
        },
        cancel: match editing {
            Some(name) => format!("/alerts/rules/{}", enc(name)),
            None => "/alerts".into(),
        },
        fields,
        receivers: set
            .receivers
            .iter()
            .map(|r| (r.name.clone(), spec.receivers.contains(&r.name)))
            .collect(),
        paused: spec.paused,
        problems,
        backtest,
    }
}

/// The stored spec of a rule, for the edit form and pausing.
async fn stored_spec(state: &AppState, name: &str) -> Result<RuleSpec, PageError> {
    match rule_origin(state, name).await? {
        Some(true) => Err(PageError::bad_request(format!(
            "Rule {name:?} is defined in the rules file, which is read-only here: edit the file, then send the server SIGHUP."
        ))),
        None => Err(PageError::not_found(
            "No such alert rule",
            format!("No rule is named {name:?}; the alerts page lists the rules there are."),
        )),
        Some(false) => {
            let stored = state.store.alert_rule_specs().await?;
            let (_, definition) = stored.into_iter().find(|(n, _)| n == name).ok_or_else(|| {
                PageError::not_found(
                    "No such alert rule",
                    format!("Rule {name:?} was just deleted."),
                )
            })?;
            serde_json::from_str(&definition).map_err(|e| {
                PageError::bad_request(format!("The stored definition of {name:?} cannot be read ({e}); delete the rule and create it again."))
            })
        }
    }
}

pub async fn new_rule(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    // `?service=&operation=` prefill from a hop page; defaults for the rest.
    let mut spec = RuleSpec {
        service: params.get("service").cloned(),
        operation: params.get("operation").cloned(),
        signal: Some("local_exceed_ratio".into()),
        op: Some(">".into()),
        threshold: Some(0.05),
        window: Some("5m".into()),
        for_: Some("2m".into()),
        min_requests: Some(20),
        ..RuleSpec::default()
    };
    if let Some(name) = params.get("copy") {
        let set = state.rules.current();
        if let Some(rule) = set.rules.iter().find(|r| &r.name == name) {
            spec = spec_of(rule);
            spec.name = Some(format!("{name}-copy"));
        }
    }
    Ok(html(
        StatusCode::OK,
        &form_page(&state, &spec, None, &[], None),
    ))
}

/// A rule's spec, for copying a rule (of the file or stored) into a new one.
fn spec_of(rule: &crate::core::alerts::rules::Rule) -> RuleSpec {
    let duration = |d: std::time::Duration| Some(humantime::format_duration(d).to_string());
    RuleSpec {
        name: Some(rule.name.clone()),
        service: Some(rule.service.as_str().to_string()),
        operation: Some(rule.operation.as_str().to_string()),
        signal: Some(rule.signal.as_str().to_string()),
        objective: rule.objective,
        short_window: rule.short_window.and_then(duration),
        op: Some(rule.op.as_str().to_string()),
        threshold: Some(rule.threshold),
        warning: rule.warning,
        resolve_threshold: rule.resolve_threshold,
        window: duration(rule.window),
        for_: duration(rule.for_),
        keep_firing_for: (!rule.keep_firing_for.is_zero())
            .then(|| duration(rule.keep_firing_for))
            .flatten(),
        repeat_interval: rule.repeat_interval.and_then(duration),
        min_requests: Some(rule.min_requests),
        labels: rule.labels.clone(),
        annotations: rule.annotations.clone(),
        receivers: rule.receivers.clone(),
        paused: rule.paused,
    }
}

pub async fn edit_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let spec = stored_spec(&state, &name).await?;
    Ok(html(
        StatusCode::OK,
        &form_page(&state, &spec, Some(&name), &[], None),
    ))
}

/// Handles both forms: `action=backtest` shows the backtest under the form, anything else
/// saves and goes to the rule's page.
async fn submit(
    state: &AppState,
    form: &[(String, String)],
    editing: Option<&str>,
) -> Result<Response, PageError> {
    let (mut spec, mut errors, action) = spec_from_form(form);
    if let Some(name) = editing {
        spec.name = Some(name.to_string());
    }
    if errors.is_empty() && action == "backtest" {
        match backtest_spec(state, &spec).await {
            Ok((result, selected)) => {
                let view = backtest_view(&result, selected);
                return Ok(html(
                    StatusCode::OK,
                    &form_page(state, &spec, editing, &[], Some(view)),
                ));
            }
            Err(Ok(found)) => errors = found,
            Err(Err(error)) => return Err(error.into()),
        }
    }
    if errors.is_empty() {
        match save_rule(state, &spec, editing).await {
            Ok(rule) => {
                return Ok(
                    Redirect::to(&format!("/alerts/rules/{}", enc(&rule.name))).into_response()
                );
            }
            Err(Ok(found)) => errors = found,
            Err(Err(error)) => return Err(error.into()),
        }
    }
    Ok(html(
        StatusCode::BAD_REQUEST,
        &form_page(state, &spec, editing, &errors, None),
    ))
}

pub async fn create_rule(
    State(state): State<AppState>,
    Form(form): Form<Vec<(String, String)>>,
) -> Result<Response, PageError> {
    submit(&state, &form, None).await
}

pub async fn update_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Form(form): Form<Vec<(String, String)>>,
) -> Result<Response, PageError> {
    stored_spec(&state, &name).await?;
    submit(&state, &form, Some(&name)).await
}

pub async fn delete_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    stored_spec(&state, &name).await?;
    state.store.delete_alert_rule(&name).await?;
    alerter::refresh_stored_rules(state.store.as_ref(), &state.rules).await?;
    Ok(Redirect::to("/alerts").into_response())
}

pub async fn pause_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let mut spec = stored_spec(&state, &name).await?;
    spec.paused = !spec.paused;
    save_rule(&state, &spec, Some(&name))
        .await
        .map_err(|e| match e {
            Ok(errors) => PageError::bad_request(format!(
                "The rule cannot be saved as it is: {}. Edit it first.",
                crate::web::alerts::problems_message(&errors)
            )),
            Err(error) => error.into(),
        })?;
    Ok(Redirect::to(&format!("/alerts/rules/{}", enc(&name))).into_response())
}

/// Sends a test notification and shows how each receiver answered on the rule's page.
pub async fn test_rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let set = state.rules.current();
    let rule = set.rules.iter().find(|r| r.name == name).ok_or_else(|| {
        PageError::not_found("No such alert rule", format!("No rule is named {name:?}."))
    })?;
    let deliveries =
        alerter::send_test(rule, &set.receivers, &state.external_url, now_unix_nano()).await;
    let outcome = if deliveries.is_empty() {
        "no receivers".to_string()
    } else {
        deliveries
            .iter()
            .map(|d| match &d.error {
                None => format!("{}: delivered", d.receiver),
                Some(e) => format!("{}: {e}", d.receiver),
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    Ok(Redirect::to(&format!(
        "/alerts/rules/{}?test={}",
        enc(&name),
        enc(&outcome)
    ))
    .into_response())
}

pub async fn create_silence(
    State(state): State<AppState>,
    Form(form): Form<Vec<(String, String)>>,
) -> Result<Response, PageError> {
    let value = |key: &str| {
        form.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let spec = crate::web::alerts::SilenceSpec {
        matchers: crate::web::alerts::MatcherList::Text(value("matchers")),
        duration: Some(value("duration")).filter(|d| !d.trim().is_empty()),
        comment: value("comment"),
        created_by: value("created_by"),
        ..Default::default()
    };
    let silence = validate_silence(&spec, now_unix_nano()).map_err(|problem| {
        PageError::bad_request(format!(
            "The silence was not created: {problem}. Go back, correct it and send it again."
        ))
    })?;
    state.store.put_silence(&silence).await?;
    Ok(Redirect::to("/alerts#silences").into_response())
}

pub async fn expire_silence(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Response, PageError> {
    expire_silence_now(&state, id).await?;
    Ok(Redirect::to("/alerts#silences").into_response())
}

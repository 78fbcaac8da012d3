//! `/alerts` (every alert instance, the rules and the latest deliveries) and
//! `/alerts/rules/{name}` (one rule: its definition, instances, history and deliveries).

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{PageError, enc, fmt_time, hop_href, html, now_unix_nano};
use crate::alerts::eval::Instance;
use crate::alerts::notify::{Notification, fmt_value};
use crate::alerts::rules::Rule;
use crate::store::alerts::HistoryQuery;
use crate::web::AppState;

/// History rows shown on a rule page.
const HISTORY_ROWS: u32 = 200;
/// Deliveries shown.
const DELIVERIES: u32 = 50;

pub struct InstanceRow {
    pub rule: String,
    pub rule_href: String,
    pub hop: String,
    pub hop_href: String,
    pub state: &'static str,
    pub severity: &'static str,
    pub value: String,
    pub threshold: String,
    pub requests: i64,
    pub since: String,
}

pub struct RuleRow {
    pub name: String,
    pub href: String,
    pub selects: String,
    pub condition: String,
    pub receivers: String,
    pub paused: bool,
    pub firing: usize,
}

pub struct DeliveryRow {
    pub created: String,
    pub rule: String,
    pub rule_href: String,
    pub hop: String,
    pub receiver: String,
    pub status: String,
    pub outcome: &'static str,
    pub attempts: i64,
    pub error: String,
}

pub struct HistoryRow {
    pub at: String,
    pub hop: String,
    pub hop_href: String,
    pub state: &'static str,
    pub severity: &'static str,
    pub value: String,
    pub threshold: String,
    pub requests: i64,
}

#[derive(Template)]
#[template(path = "alerts.html")]
pub struct AlertsPage {
    pub nav: &'static str,
    pub rules_file: Option<String>,
    pub instances: Vec<InstanceRow>,
    pub rules: Vec<RuleRow>,
    pub deliveries: Vec<DeliveryRow>,
}

#[derive(Template)]
#[template(path = "alert_rule.html")]
pub struct RulePage {
    pub nav: &'static str,
    pub name: String,
    pub definition: Vec<(&'static str, String)>,
    pub instances: Vec<InstanceRow>,
    pub history: Vec<HistoryRow>,
    pub deliveries: Vec<DeliveryRow>,
}

fn rule_href(name: &str) -> String {
    format!("/alerts/rules/{}", enc(name))
}

fn condition(rule: &Rule) -> String {
    let mut text = format!(
        "{} {} {}",
        rule.signal,
        rule.op.as_str(),
        fmt_value(Some(rule.threshold))
    );
    if let Some(w) = rule.warning {
        text.push_str(&format!(" (warning {})", fmt_value(Some(w))));
    }
    text.push_str(&format!(
        " over {}",
        humantime::format_duration(rule.window)
    ));
    if !rule.for_.is_zero() {
        text.push_str(&format!(" for {}", humantime::format_duration(rule.for_)));
    }
    text
}

fn instance_row(instance: &Instance) -> InstanceRow {
    let since = match instance.state {
        crate::alerts::eval::State::Pending => instance.active_since,
        crate::alerts::eval::State::Firing => instance.fired_at.unwrap_or(instance.active_since),
        crate::alerts::eval::State::Resolved => {
            instance.resolved_at.unwrap_or(instance.evaluated_at)
        }
    };
    InstanceRow {
        rule: instance.rule.clone(),
        rule_href: rule_href(&instance.rule),
        hop: format!("{} {}", instance.service, instance.operation),
        hop_href: hop_href(&instance.service, &instance.operation, ""),
        state: instance.state.as_str(),
        severity: instance.severity.as_str(),
        value: fmt_value(instance.value),
        threshold: fmt_value(Some(instance.threshold)),
        requests: instance.requests,
        since: fmt_time(since),
    }
}

fn delivery_row(n: &Notification) -> DeliveryRow {
    DeliveryRow {
        created: fmt_time(n.created_unix_nano),
        rule: n.rule.clone(),
        rule_href: rule_href(&n.rule),
        hop: format!("{} {}", n.service, n.operation),
        receiver: n.receiver.clone(),
        status: n.status.clone(),
        outcome: n.outcome(),
        attempts: n.attempts,
        error: n.last_error.clone(),
    }
}

pub async fn alerts(State(state): State<AppState>) -> Result<Response, PageError> {
    let set = state.rules.current();
    let instances = state.store.alert_instances().await?;
    let mut firing: BTreeMap<&str, usize> = BTreeMap::new();
    for instance in &instances {
        if instance.state == crate::alerts::eval::State::Firing {
            *firing.entry(instance.rule.as_str()).or_default() += 1;
        }
    }
    let rules = set
        .rules
        .iter()
        .map(|rule| RuleRow {
            name: rule.name.clone(),
            href: rule_href(&rule.name),
            selects: format!("{} {}", rule.service.as_str(), rule.operation.as_str()),
            condition: condition(rule),
            receivers: rule.receivers.join(", "),
            paused: rule.paused,
            firing: firing.get(rule.name.as_str()).copied().unwrap_or(0),
        })
        .collect();
    // Firing first, then pending, then resolved; newest first within each.
    let mut ordered: Vec<&Instance> = instances.iter().collect();
    ordered.sort_by_key(|i| {
        let rank = match i.state {
            crate::alerts::eval::State::Firing => 0,
            crate::alerts::eval::State::Pending => 1,
            crate::alerts::eval::State::Resolved => 2,
        };
        (
            rank,
            std::cmp::Reverse(i.fired_at.unwrap_or(i.active_since)),
        )
    });
    let deliveries = state.store.notifications(None, DELIVERIES).await?;
    Ok(html(
        StatusCode::OK,
        &AlertsPage {
            nav: "alerts",
            rules_file: state.rules.file().map(|p| p.display().to_string()),
            instances: ordered.into_iter().map(instance_row).collect(),
            rules,
            deliveries: deliveries.iter().map(delivery_row).collect(),
        },
    ))
}

pub async fn rule(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let set = state.rules.current();
    let Some(rule) = set.rules.iter().find(|r| r.name == name) else {
        return Err(PageError::not_found(
            "No such alert rule",
            format!(
                "No rule named {name:?} is in force. It may have been removed from the rules file; the alerts page lists the rules there are."
            ),
        ));
    };
    let instances: Vec<InstanceRow> = state
        .store
        .alert_instances()
        .await?
        .iter()
        .filter(|i| i.rule == name)
        .map(instance_row)
        .collect();
    let history = state
        .store
        .alert_history(&HistoryQuery {
            rule: Some(name.clone()),
            since_unix_nano: now_unix_nano().saturating_sub(24 * 3_600 * 1_000_000_000),
            limit: HISTORY_ROWS,
            ..HistoryQuery::default()
        })
        .await?;
    let deliveries = state.store.notifications(Some(&name), DELIVERIES).await?;
    let duration = |d: std::time::Duration| humantime::format_duration(d).to_string();
    let mut definition = vec![
        (
            "Selects",
            format!(
                "service {} · operation {}",
                rule.service.as_str(),
                rule.operation.as_str()
            ),
        ),
        ("Fires when", condition(rule)),
        ("Minimum requests", rule.min_requests.to_string()),
        (
            "Receivers",
            if rule.receivers.is_empty() {
                "none (shown here only)".into()
            } else {
                rule.receivers.join(", ")
            },
        ),
        (
            "Defined in",
            match (rule.source, state.rules.file()) {
                (crate::alerts::rules::RuleSource::File, Some(path)) => format!(
                    "{} (read-only here; edit the file and send SIGHUP)",
                    path.display()
                ),
                _ => "the database".into(),
            },
        ),
    ];
    if let Some(r) = rule.resolve_threshold {
        definition.push(("Resolves below", fmt_value(Some(r))));
    }
    if !rule.keep_firing_for.is_zero() {
        definition.push(("Keeps firing for", duration(rule.keep_firing_for)));
    }
    if let Some(short) = rule.short_window {
        definition.push(("Short window", duration(short)));
    }
    if rule.paused {
        definition.push(("Paused", "yes: not evaluated".into()));
    }
    Ok(html(
        StatusCode::OK,
        &RulePage {
            nav: "alerts",
            name: rule.name.clone(),
            definition,
            instances,
            history: history
                .iter()
                .map(|h| HistoryRow {
                    at: fmt_time(h.evaluated_at),
                    hop: format!("{} {}", h.service, h.operation),
                    hop_href: hop_href(&h.service, &h.operation, ""),
                    state: h.state.as_str(),
                    severity: h.severity.as_str(),
                    value: fmt_value(h.value),
                    threshold: fmt_value(Some(h.threshold)),
                    requests: h.requests,
                })
                .collect(),
            deliveries: deliveries.iter().map(delivery_row).collect(),
        },
    ))
}

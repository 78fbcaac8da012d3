//! `/alerts` (every alert instance, the rules and the latest deliveries) and
//! `/alerts/rules/{name}` (one rule: its definition, instances, history and deliveries).

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Path, Query, State as AxumState};
use axum::http::StatusCode;
use axum::response::Response;

use super::{PageError, enc, fmt_time, hop_href, html};
use crate::clock::now_unix_nano;
use crate::core::alerts::eval::{Instance, State};
use crate::core::alerts::notify::{Notification, fmt_value, labels};
use crate::core::alerts::rules::{Rule, RuleSet};
use crate::core::alerts::silence::{Silence, silenced_by};
use crate::store::query::HistoryQuery;
use crate::store::query::NotificationQuery;
use crate::web::AppState;
use crate::web::alerts::problems_message;
use crate::web::charts;

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
    /// "silenced by #3", "inhibited by RULE on HOP", or empty.
    pub silenced: String,
    /// The hop's traces over the episode (with the rule's flag): the traces that show it.
    pub traces_href: String,
}

/// The firing instances, of one hop or of all, for the overview and hop pages.
pub async fn firing(
    state: &AppState,
    hop: Option<(&str, &str)>,
) -> Result<Vec<InstanceRow>, PageError> {
    let instances = state.store.alert_instances().await?;
    let rules = state.rules.current();
    let silences = state.store.silences().await?;
    let quiet = Quiet {
        rules: &rules,
        silences: &silences,
        instances: &instances,
        now: now_unix_nano(),
    };
    Ok(instances
        .iter()
        .filter(|i| i.state == State::Firing)
        .filter(|i| hop.is_none_or(|(s, o)| i.service == s && i.operation == o))
        .map(|i| instance_row(i, &quiet))
        .collect())
}

pub struct SilenceRow {
    pub id: i64,
    pub matchers: String,
    pub status: &'static str,
    pub starts: String,
    pub ends: String,
    pub comment: String,
    pub created_by: String,
    /// Whether it can still be expired.
    pub running: bool,
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
    pub not_in_force: Vec<(String, String)>,
    pub silences: Vec<SilenceRow>,
    pub deliveries: Vec<DeliveryRow>,
}

#[derive(Template)]
#[template(path = "alert_rule.html")]
pub struct RulePage {
    pub nav: &'static str,
    pub name: String,
    pub href: String,
    pub stored: bool,
    pub paused: bool,
    pub has_receivers: bool,
    pub test_outcome: Option<String>,
    pub definition: Vec<(&'static str, String)>,
    /// The history's values over time (SVG), empty without history.
    pub chart: String,
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

/// What a page needs to say why an instance is quiet.
struct Quiet<'a> {
    rules: &'a RuleSet,
    silences: &'a [Silence],
    instances: &'a [Instance],
    now: u64,
}

fn instance_row(instance: &Instance, quiet: &Quiet<'_>) -> InstanceRow {
    let rule = quiet.rules.rules.iter().find(|r| r.name == instance.rule);
    let family = |name: &str| {
        quiet
            .rules
            .rules
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.signal.family())
    };
    let silenced = match (instance.state, rule) {
        (State::Resolved, _) | (_, None) => String::new(),
        (_, Some(rule)) => {
            match silenced_by(quiet.silences, &labels(rule, instance), quiet.now) {
                Some(id) => format!("silenced by #{id}"),
                None => crate::core::alerts::eval::inhibitor(instance, quiet.instances, family)
                    .map_or(String::new(), |by| {
                        format!(
                            "inhibited by {} on {} {}",
                            by.rule, by.service, by.operation
                        )
                    }),
            }
        }
    };
    let since = match instance.state {
        State::Pending => instance.active_since,
        State::Firing => instance.fired_at.unwrap_or(instance.active_since),
        State::Resolved => instance.resolved_at.unwrap_or(instance.evaluated_at),
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
        silenced,
        traces_href: traces_href(rule, instance),
    }
}

/// The search for the traces behind an instance: its hop, the rule's flag, from a window
/// before the episode began until it resolved (or now).
fn traces_href(rule: Option<&Rule>, instance: &Instance) -> String {
    let window = rule.map_or(0, |r| r.window.as_nanos() as u64);
    let ms = |nanos: u64| (nanos / 1_000_000).to_string();
    let since = ms(instance.active_since.saturating_sub(window));
    let until = instance.resolved_at.map(ms).unwrap_or_default();
    let flag = rule
        .and_then(|r| r.signal.flag())
        .map_or("", |f| f.as_str());
    format!(
        "/traces{}",
        super::query_string([
            ("service", instance.service.as_str()),
            ("operation", instance.operation.as_str()),
            ("flag", flag),
            ("since", since.as_str()),
            ("until", until.as_str()),
        ])
    )
}

fn silence_row(silence: &Silence, now: u64) -> SilenceRow {
    SilenceRow {
        id: silence.id,
        matchers: silence
            .matchers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        status: silence.status(now),
        starts: fmt_time(silence.starts_unix_nano),
        ends: fmt_time(silence.ends_unix_nano),
        comment: silence.comment.clone(),
        created_by: silence.created_by.clone(),
        running: silence.status(now) != "expired",
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

pub async fn alerts(AxumState(state): AxumState<AppState>) -> Result<Response, PageError> {
    let set = state.rules.current();
    let instances = state.store.alert_instances().await?;
    let mut firing: BTreeMap<&str, usize> = BTreeMap::new();
    for instance in &instances {
        if instance.state == State::Firing {
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
            State::Firing => 0,
            State::Pending => 1,
            State::Resolved => 2,
        };
        (
            rank,
            std::cmp::Reverse(i.fired_at.unwrap_or(i.active_since)),
        )
    });
    let deliveries = state
        .store
        .notifications(&NotificationQuery {
            rule: None,
            limit: DELIVERIES,
        })
        .await?;
    let silences = state.store.silences().await?;
    let now = now_unix_nano();
    Ok(html(
        StatusCode::OK,
        &AlertsPage {
            nav: "alerts",
            rules_file: state.rules.file().map(|p| p.display().to_string()),
            instances: ordered
                .into_iter()
                .map(|i| {
                    instance_row(
                        i,
                        &Quiet {
                            rules: &set,
                            silences: &silences,
                            instances: &instances,
                            now,
                        },
                    )
                })
                .collect(),
            rules,
            not_in_force: state
                .rules
                .broken()
                .iter()
                .map(|(name, errors)| (name.clone(), problems_message(errors)))
                .collect(),
            silences: silences.iter().map(|s| silence_row(s, now)).collect(),
            deliveries: deliveries.iter().map(delivery_row).collect(),
        },
    ))
}

/// The most hops drawn in a rule's history chart.
const CHART_HOPS: usize = 5;

/// The value of each hop's evaluations over time, for the hops evaluated most often.
fn history_chart(rule: &Rule, history: &[Instance]) -> String {
    if history.is_empty() {
        return String::new();
    }
    let mut by_hop: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for h in history {
        if let Some(value) = h.value {
            by_hop
                .entry(format!("{} {}", h.service, h.operation))
                .or_default()
                .push((h.evaluated_at, value));
        }
    }
    let mut hops: Vec<(String, Vec<(u64, f64)>)> = by_hop.into_iter().collect();
    hops.sort_by_key(|(_, points)| std::cmp::Reverse(points.len()));
    hops.truncate(CHART_HOPS);
    let lines: Vec<charts::Line<'_>> = hops
        .iter_mut()
        .map(|(name, points)| {
            points.sort_by_key(|(t, _)| *t);
            charts::Line {
                name,
                points: points.clone(),
            }
        })
        .collect();
    let first = lines
        .iter()
        .flat_map(|l| l.points.first())
        .map(|p| p.0)
        .min()
        .unwrap_or(0);
    let last = lines
        .iter()
        .flat_map(|l| l.points.last())
        .map(|p| p.0)
        .max()
        .unwrap_or(0);
    let long = last.saturating_sub(first) > 24 * 3_600 * 1_000_000_000;
    charts::lines(
        &format!("{} over time, with its threshold", rule.signal),
        &lines,
        rule.threshold,
        &|t| super::fmt_axis_time(t, long),
    )
}

pub async fn rule(
    AxumState(state): AxumState<AppState>,
    Path(name): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
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
    let silences = state.store.silences().await?;
    let now = now_unix_nano();
    let all = state.store.alert_instances().await?;
    let quiet = Quiet {
        rules: &set,
        silences: &silences,
        instances: &all,
        now,
    };
    let instances: Vec<InstanceRow> = all
        .iter()
        .filter(|i| i.rule == name)
        .map(|i| instance_row(i, &quiet))
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
    let deliveries = state
        .store
        .notifications(&NotificationQuery {
            rule: Some(&name),
            limit: DELIVERIES,
        })
        .await?;
    let chart = history_chart(rule, &history);
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
                (crate::core::alerts::rules::RuleSource::File, Some(path)) => format!(
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
    if let Some(every) = rule.repeat_interval {
        definition.push(("Repeats every", duration(every)));
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
            href: rule_href(&rule.name),
            stored: rule.source == crate::core::alerts::rules::RuleSource::Database,
            paused: rule.paused,
            has_receivers: !rule.receivers.is_empty(),
            test_outcome: params.get("test").cloned(),
            definition,
            chart,
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

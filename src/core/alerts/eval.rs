//! Alert evaluation, pure: a rule, the hop rollups of its window and the instances of the
//! last evaluation in; the new instances, the history to record and the state changes to
//! notify out. No clock (the runner passes "now"), no IO.
//!
//! Each (rule, hop) is its own instance: inactive (no row) → pending (the condition holds,
//! for less than `for`) → firing → resolved (the condition cleared for `keep_firing_for`).
//! A firing instance clears only once its value is on the healthy side of
//! `Rule::clear_threshold` (hysteresis with `resolve_threshold`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use super::rules::{Rule, Signal};
use crate::core::advice::FindingCounts;
use crate::core::analyze::hops::Rollup;

/// (service, operation): a hop identity.
pub type HopKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Firing,
    Resolved,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Firing => "firing",
            State::Resolved => "resolved",
        }
    }

    pub fn parse(text: &str) -> Option<State> {
        [State::Pending, State::Firing, State::Resolved]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    pub fn parse(text: &str) -> Option<Severity> {
        [Severity::Warning, Severity::Critical]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// One (rule, hop) that is not inactive, as of its last evaluation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Instance {
    pub rule: String,
    pub service: String,
    pub operation: String,
    pub state: State,
    pub severity: Severity,
    /// The signal's value over the window (`None`: no data, e.g. a ratio of no requests).
    pub value: Option<f64>,
    /// For `slo_burn_rate` with a short window: the value over it.
    pub short_value: Option<f64>,
    /// The threshold the value was compared with: the critical one, or the warning one
    /// when only that holds.
    pub threshold: f64,
    /// Requests of the hop in the window.
    pub requests: i64,
    /// Unix ns: when the condition started to hold in this episode.
    pub active_since: u64,
    pub fired_at: Option<u64>,
    /// While firing: since when the condition has been clear (for `keep_firing_for`).
    pub cleared_since: Option<u64>,
    pub resolved_at: Option<u64>,
    pub evaluated_at: u64,
    /// Whether this firing episode was notified (the runner's, from silences and
    /// inhibition; kept here).
    pub notified: bool,
    /// When this episode was last notified as firing (for `repeat_interval`).
    pub notified_at: Option<u64>,
    /// The origin hop where most of this hop's already-spent requests ran out, found when
    /// the episode first fired (the runner's, from recent traces; kept here).
    pub spent_by: Option<HopKey>,
}

impl Instance {
    pub fn key(&self) -> HopKey {
        (self.service.clone(), self.operation.clone())
    }
}

/// A state change to notify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Pending → firing (or straight to firing when `for` is 0).
    Fired,
    /// Firing, and the severity went from warning to critical or back.
    SeverityChanged,
    /// Still firing, `repeat_interval` after the last notification (the runner's).
    Repeated,
    Resolved,
}

/// Every hop's rollup over one window, merged from its minutes.
pub type HopRollups = BTreeMap<HopKey, Rollup>;

/// The rollups a rule reads: over its window, and over its short window when it has one.
#[derive(Debug, Clone, Copy)]
pub struct Windows<'a> {
    pub long: &'a HopRollups,
    pub short: Option<&'a HopRollups>,
    /// The advisor's findings over the long window, for the `finding_*` signals (none: they
    /// read 0).
    pub findings: Option<&'a FindingCounts>,
}

/// What one evaluation of one rule decided.
#[derive(Debug, Clone, Default)]
pub struct Evaluation {
    /// Every instance that is not inactive afterwards, new or updated.
    pub instances: Vec<Instance>,
    /// Instances that became inactive (their rows go).
    pub removed: Vec<HopKey>,
    /// Instances evaluated while pending or firing, and those that just resolved, as
    /// evaluated: the history that answers "why did it fire".
    pub history: Vec<Instance>,
    pub changes: Vec<(Change, Instance)>,
}

/// Resolved instances are kept this long for the alerts page, then dropped.
pub const RESOLVED_KEPT: Duration = Duration::from_secs(24 * 3600);

fn ratio(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// A signal's value over a window's rollup; `None` when it has no data.
pub fn signal_value(signal: Signal, rollup: &Rollup, objective: Option<f64>) -> Option<f64> {
    let count = |name: &str| rollup.count(name);
    let requests = rollup.requests;
    match signal {
        Signal::LocalExceedRatio => {
            ratio(count("local_exceed"), requests - count("inherited_exceed"))
        }
        Signal::InheritedExceedRatio => ratio(count("inherited_exceed"), requests),
        Signal::OverspentRatio => ratio(count("overspent"), requests),
        Signal::Requests => Some(requests as f64),
        Signal::LocalExceedCount => Some(count("local_exceed") as f64),
        Signal::InheritedExceedCount => Some(count("inherited_exceed") as f64),
        Signal::InflatedCount => Some(count("inflated") as f64),
        Signal::DroppedCount => Some(count("dropped") as f64),
        Signal::DoomedCount => Some(count("doomed") as f64),
        Signal::RetryRatio => ratio(count("retry"), requests),
        Signal::WastedMs => Some(rollup.wasted_ms),
        Signal::BurnP95 => rollup.burn.quantile(0.95),
        Signal::BurnP99 => rollup.burn.quantile(0.99),
        Signal::SelfMsP95 => rollup.self_ms.quantile(0.95),
        Signal::BudgetReceivedP50 => rollup.budget.quantile(0.5),
        Signal::CriticalShare => rollup.critical.share(),
        Signal::SloBurnRate => {
            let allowed = 1.0 - objective?;
            signal_value(Signal::LocalExceedRatio, rollup, None).map(|r| r / allowed)
        }
        Signal::MetricLocalExceedCount => Some(rollup.reported.local_exceeds as f64),
        Signal::MetricInheritedExceedCount => Some(rollup.reported.inherited_exceeds as f64),
        Signal::MetricLocalExceedRatio => {
            let r = &rollup.reported;
            ratio(r.local_exceeds, r.received_count - r.inherited_exceeds)
        }
        // Findings need more than the hop's rollup: `Reading::of` reads them.
        Signal::FindingDropped
        | Signal::FindingClamped
        | Signal::FindingFixedTimeout
        | Signal::FindingRetryBudget
        | Signal::FindingTimeoutBackstop
        | Signal::FindingInflatingHop
        | Signal::FindingMinUsefulBudget
        | Signal::FindingReserve
        | Signal::FindingRetryLayers
        | Signal::FindingInfeasibleBudget => None,
    }
}

/// The values one evaluation of a rule reads for one hop.
struct Reading {
    value: Option<f64>,
    short_value: Option<f64>,
    requests: i64,
}

impl Reading {
    fn of(rule: &Rule, windows: Windows<'_>, key: &HopKey) -> Reading {
        let empty = Rollup::default();
        let long = windows.long.get(key).unwrap_or(&empty);
        let short_value = match (rule.short_window, windows.short) {
            (Some(_), Some(short)) => short
                .get(key)
                .and_then(|r| signal_value(rule.signal, r, rule.objective)),
            _ => None,
        };
        let value = match rule.signal.finding_kind() {
            Some(kind) => Some(
                windows
                    .findings
                    .and_then(|f| f.get(key))
                    .and_then(|kinds| kinds.get(kind))
                    .copied()
                    .unwrap_or(0) as f64,
            ),
            None => signal_value(rule.signal, long, rule.objective),
        };
        Reading {
            value,
            short_value,
            requests: if rule.signal.reads_metrics() {
                long.reported.received_count
            } else {
                long.requests
            },
        }
    }

    /// Whether the condition holds at `threshold`: enough requests, and the value (and
    /// the short window's, when the rule has one) past it.
    fn holds(&self, rule: &Rule, threshold: f64) -> bool {
        let past = |value: Option<f64>| value.is_some_and(|v| rule.op.holds(v, threshold));
        self.requests >= rule.min_requests
            && past(self.value)
            && (rule.short_window.is_none() || past(self.short_value))
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The hops of `hops` a rule's globs select. A literal service name, or a literal start
/// followed by `*`, is looked up as a key range instead of testing every hop: several times
/// as fast with 10,000 hops and 1,000 rules (`cargo bench --bench alerts`).
fn matching<'a>(rule: &'a Rule, hops: &'a HopRollups) -> Box<dyn Iterator<Item = &'a HopKey> + 'a> {
    let start = rule.service.literal().or(rule.service.prefix());
    let candidates: Box<dyn Iterator<Item = &HopKey>> = match start {
        Some(start) => Box::new(
            hops.range((start.to_string(), String::new())..)
                .map(|(key, _)| key)
                .take_while(move |(s, _)| s.starts_with(start))
                .filter(|(s, _)| rule.service.matches(s)),
        ),
        None => Box::new(hops.keys().filter(|(s, _)| rule.service.matches(s))),
    };
    Box::new(candidates.filter(|(_, operation)| rule.operation.matches(operation)))
}

/// Evaluates `rule` at `now` over every hop with rollups in its window (the rule's globs
/// are applied here), given the rule's instances from the last evaluation.
pub fn evaluate(
    rule: &Rule,
    now: u64,
    windows: Windows<'_>,
    previous: &BTreeMap<HopKey, Instance>,
) -> Evaluation {
    let mut out = Evaluation::default();
    let keys: BTreeSet<HopKey> = matching(rule, windows.long)
        .cloned()
        .chain(previous.keys().cloned())
        .collect();
    for key in keys {
        let prev = previous.get(&key);
        if rule.paused {
            if let Some(prev) = prev {
                stop(prev, now, &mut out);
            }
            continue;
        }
        let reading = Reading::of(rule, windows, &key);
        step(rule, now, &key, prev, &reading, &mut out);
    }
    out
}

/// What becomes of the instances of a rule that is paused or no longer exists: firing ones
/// resolve (and say so), the others go.
pub fn stop(prev: &Instance, now: u64, out: &mut Evaluation) {
    match prev.state {
        State::Firing => {
            let resolved = Instance {
                state: State::Resolved,
                resolved_at: Some(now),
                evaluated_at: now,
                ..prev.clone()
            };
            out.history.push(resolved.clone());
            out.changes.push((Change::Resolved, resolved.clone()));
            out.instances.push(resolved);
        }
        State::Pending => out.removed.push(prev.key()),
        State::Resolved => out.instances.push(prev.clone()),
    }
}

fn step(
    rule: &Rule,
    now: u64,
    key: &HopKey,
    prev: Option<&Instance>,
    reading: &Reading,
    out: &mut Evaluation,
) {
    let critical = reading.holds(rule, rule.threshold);
    let warning = rule.warning.is_some_and(|w| reading.holds(rule, w));
    let active = critical || warning;
    let severity = if critical {
        Severity::Critical
    } else {
        Severity::Warning
    };
    let threshold = if critical || rule.warning.is_none() {
        rule.threshold
    } else {
        rule.warning.unwrap_or(rule.threshold)
    };
    let fresh = |state: State| Instance {
        rule: rule.name.clone(),
        service: key.0.clone(),
        operation: key.1.clone(),
        state,
        severity,
        value: reading.value,
        short_value: reading.short_value,
        threshold,
        requests: reading.requests,
        active_since: now,
        fired_at: None,
        cleared_since: None,
        resolved_at: None,
        evaluated_at: now,
        notified: false,
        notified_at: None,
        spent_by: None,
    };
    let updated = |prev: &Instance| Instance {
        value: reading.value,
        short_value: reading.short_value,
        requests: reading.requests,
        evaluated_at: now,
        ..prev.clone()
    };
    let next = match prev.map(|p| (p.state, p)) {
        None | Some((State::Resolved, _)) if active => {
            let mut next = fresh(State::Pending);
            if rule.for_.is_zero() {
                next.state = State::Firing;
                next.fired_at = Some(now);
                out.changes.push((Change::Fired, next.clone()));
            }
            Some(next)
        }
        None => None,
        Some((State::Resolved, prev)) => {
            // Kept for the alerts page for a while, as it was when it resolved.
            let expired = prev
                .resolved_at
                .is_some_and(|at| now.saturating_sub(at) >= nanos(RESOLVED_KEPT));
            if expired {
                out.removed.push(key.clone());
            } else {
                out.instances.push(prev.clone());
            }
            return;
        }
        Some((State::Pending, prev)) if active => {
            let mut next = Instance {
                severity,
                threshold,
                ..updated(prev)
            };
            if now.saturating_sub(prev.active_since) >= nanos(rule.for_) {
                next.state = State::Firing;
                next.fired_at = Some(now);
                out.changes.push((Change::Fired, next.clone()));
            }
            Some(next)
        }
        Some((State::Pending, _)) => None,
        Some((State::Firing, prev)) => {
            let mut next = updated(prev);
            if reading.holds(rule, rule.clear_threshold()) {
                next.cleared_since = None;
                if active {
                    next.threshold = threshold;
                    if severity != prev.severity {
                        next.severity = severity;
                        out.changes.push((Change::SeverityChanged, next.clone()));
                    }
                }
            } else {
                let since = *next.cleared_since.get_or_insert(now);
                if now.saturating_sub(since) >= nanos(rule.keep_firing_for) {
                    next.state = State::Resolved;
                    next.resolved_at = Some(now);
                    out.changes.push((Change::Resolved, next.clone()));
                }
            }
            Some(next)
        }
    };
    match next {
        Some(instance) => {
            out.history.push(instance.clone());
            out.instances.push(instance);
        }
        None => {
            if prev.is_some() {
                out.removed.push(key.clone());
            }
        }
    }
}

/// The firing instance that inhibits `instance`: one on the hop where its already-spent
/// requests ran out (`spent_by`), of a rule whose signal is of the same family.
/// `family` gives a rule's family by name (`None` for a rule that no longer exists).
pub fn inhibitor<'a>(
    instance: &Instance,
    firing: &'a [Instance],
    family: impl Fn(&str) -> Option<&'static str>,
) -> Option<&'a Instance> {
    let spent_by = instance.spent_by.as_ref()?;
    let mine = family(&instance.rule)?;
    firing.iter().find(|other| {
        other.state == State::Firing
            && (&other.service, &other.operation) == (&spent_by.0, &spent_by.1)
            && family(&other.rule) == Some(mine)
    })
}

/// What a notification shows besides the value: the hop's numbers over the window, from
/// its traces and, when it exports them, its deadline metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evidence {
    pub requests: i64,
    pub budget_received_p50_ms: Option<f64>,
    pub budget_received_p99_ms: Option<f64>,
    pub burn_p99: Option<f64>,
    pub self_ms_p99: Option<f64>,
    pub wasted_ms: f64,
    pub local_exceed: i64,
    pub inherited_exceed: i64,
    pub doomed: i64,
    pub retry: i64,
    pub metrics: Option<MetricsEvidence>,
}

/// The hop's deadline metrics over the window (every request, when traces are sampled).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MetricsEvidence {
    pub requests: i64,
    pub local_exceeds: i64,
    pub inherited_exceeds: i64,
    pub budget_received_mean_ms: Option<f64>,
}

pub fn evidence(rollup: &Rollup) -> Evidence {
    Evidence {
        requests: rollup.requests,
        budget_received_p50_ms: rollup.budget.quantile(0.5),
        budget_received_p99_ms: rollup.budget.quantile(0.99),
        burn_p99: rollup.burn.quantile(0.99),
        self_ms_p99: rollup.self_ms.quantile(0.99),
        wasted_ms: rollup.wasted_ms,
        local_exceed: rollup.count("local_exceed"),
        inherited_exceed: rollup.count("inherited_exceed"),
        doomed: rollup.count("doomed"),
        retry: rollup.count("retry"),
        metrics: (!rollup.reported.is_empty()).then(|| MetricsEvidence {
            requests: rollup.reported.received_count,
            local_exceeds: rollup.reported.local_exceeds,
            inherited_exceeds: rollup.reported.inherited_exceeds,
            budget_received_mean_ms: rollup.reported.received_mean_ms(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::alerts::rules::{NamePattern, parse_file};
    use crate::core::analyze::hops::COUNTED;

    const S: u64 = 1_000_000_000;

    fn rule(extra: &str) -> Rule {
        let text = format!(
            "rules:\n  - {{ name: r, service: inventory, signal: local_exceed_ratio, op: \">\", threshold: 0.05, window: 5m, min_requests: 20{extra} }}\n"
        );
        parse_file(&text).unwrap().rules.remove(0)
    }

    /// One hop with `requests` requests of which `local` exceeded locally.
    fn hop(requests: i64, local: i64) -> HopRollups {
        let mut long = Rollup {
            requests,
            ..Rollup::default()
        };
        long.counts[COUNTED.iter().position(|c| *c == "local_exceed").unwrap()] = local;
        BTreeMap::from([(("inventory".to_string(), "GET /items".to_string()), long)])
    }

    fn long(hops: &HopRollups) -> Windows<'_> {
        Windows {
            long: hops,
            short: None,
            findings: None,
        }
    }

    /// Runs evaluations at 30 s steps; returns each step's state (or "inactive") and changes.
    fn run(rule: &Rule, steps: &[(i64, i64)]) -> Vec<String> {
        let mut previous: BTreeMap<HopKey, Instance> = BTreeMap::new();
        let mut trail = Vec::new();
        for (i, (requests, local)) in steps.iter().enumerate() {
            let now = 1_000 * S + i as u64 * 30 * S;
            let out = evaluate(rule, now, long(&hop(*requests, *local)), &previous);
            for key in &out.removed {
                previous.remove(key);
            }
            for instance in out.instances {
                previous.insert(instance.key(), instance);
            }
            let state = previous
                .values()
                .next()
                .map_or("inactive".to_string(), |i| {
                    format!("{}/{}", i.state.as_str(), i.severity.as_str())
                });
            let changes: Vec<_> = out.changes.iter().map(|(c, _)| format!("{c:?}")).collect();
            trail.push(if changes.is_empty() {
                state
            } else {
                format!("{state} {}", changes.join(","))
            });
        }
        trail
    }

    #[test]
    fn an_instance_fires_after_for_and_resolves_when_it_clears() {
        let trail = run(
            &rule(", for: 1m"),
            &[
                (100, 1),
                (100, 10),
                (100, 10),
                (100, 10),
                (100, 10),
                (100, 1),
            ],
        );
        assert_eq!(
            trail,
            [
                "inactive",
                "pending/critical",
                "pending/critical",
                "firing/critical Fired",
                "firing/critical",
                "resolved/critical Resolved",
            ]
        );
    }

    #[test]
    fn pending_that_clears_goes_back_to_inactive_without_a_notification() {
        let trail = run(&rule(", for: 2m"), &[(100, 10), (100, 0), (100, 10)]);
        assert_eq!(trail, ["pending/critical", "inactive", "pending/critical"]);
    }

    #[test]
    fn too_few_requests_never_fire() {
        let trail = run(&rule(""), &[(19, 19), (20, 19)]);
        assert_eq!(trail, ["inactive", "firing/critical Fired"]);
    }

    #[test]
    fn hysteresis_and_keep_firing_for_delay_the_resolution() {
        let trail = run(
            &rule(", resolve_threshold: 0.02, keep_firing_for: 1m"),
            &[
                (100, 10),
                (100, 3),
                (100, 1),
                (100, 1),
                (100, 3),
                (100, 1),
                (100, 1),
                (100, 1),
            ],
        );
        assert_eq!(
            trail,
            [
                "firing/critical Fired",
                "firing/critical", // 3 % is still past the resolve threshold
                "firing/critical", // clear, for less than keep_firing_for
                "firing/critical",
                "firing/critical", // back past 2 %: the clear period starts over
                "firing/critical",
                "firing/critical",
                "resolved/critical Resolved",
            ]
        );
    }

    #[test]
    fn warning_then_critical_is_a_severity_change() {
        let trail = run(
            &rule(", warning: 0.02"),
            &[(100, 3), (100, 10), (100, 3), (100, 0)],
        );
        assert_eq!(
            trail,
            [
                "firing/warning Fired",
                "firing/critical SeverityChanged",
                "firing/warning SeverityChanged",
                "resolved/warning Resolved",
            ]
        );
    }

    #[test]
    fn metric_signals_read_the_reported_counts_not_the_traces() {
        let mut rollup = Rollup {
            requests: 10,
            ..Rollup::default()
        };
        rollup.counts[1] = 9; // local, in the sampled traces
        rollup.reported.received_count = 1000;
        rollup.reported.inherited_exceeds = 200;
        rollup.reported.local_exceeds = 40;
        let ratio = signal_value(Signal::MetricLocalExceedRatio, &rollup, None).unwrap();
        assert!((ratio - 0.05).abs() < 1e-9, "{ratio}");
        assert_eq!(
            signal_value(Signal::MetricLocalExceedCount, &rollup, None),
            Some(40.0)
        );
        assert_eq!(
            signal_value(Signal::MetricInheritedExceedCount, &rollup, None),
            Some(200.0)
        );
        assert_eq!(
            signal_value(Signal::MetricLocalExceedRatio, &Rollup::default(), None),
            None,
            "no metrics: no data, not 0"
        );
    }

    #[test]
    fn critical_share_is_the_share_of_exceeded_requests_the_hop_made_late() {
        let mut rollup = Rollup {
            requests: 50,
            ..Rollup::default()
        };
        assert_eq!(
            signal_value(Signal::CriticalShare, &rollup, None),
            None,
            "no exceeded request: no data"
        );
        rollup.critical.exceeded = 8;
        rollup.critical.exceeded_on_path = 8;
        rollup.critical.exceeded_dominant = 6;
        assert_eq!(
            signal_value(Signal::CriticalShare, &rollup, None),
            Some(0.75)
        );
        assert_eq!(Signal::parse("critical_share"), Some(Signal::CriticalShare));
    }

    #[test]
    fn min_requests_of_a_metric_signal_counts_the_metrics_requests() {
        let mut rule = rule("");
        rule.signal = Signal::MetricLocalExceedCount;
        rule.threshold = 5.0;
        let mut hops = hop(3, 0); // 3 sampled traces: under min_requests (20)
        let rollup = hops.values_mut().next().unwrap();
        rollup.reported.received_count = 300;
        rollup.reported.local_exceeds = 30;
        let out = evaluate(&rule, 1_000 * S, long(&hops), &BTreeMap::new());
        assert_eq!(out.changes.len(), 1, "fires on the metrics' 300 requests");
        hops.values_mut().next().unwrap().reported.received_count = 10;
        let out = evaluate(&rule, 1_000 * S, long(&hops), &BTreeMap::new());
        assert!(
            out.changes.is_empty(),
            "10 requests in the metrics: too few"
        );
    }

    #[test]
    fn local_exceed_ratio_leaves_out_inherited_exceeds() {
        let mut rollup = Rollup {
            requests: 100,
            ..Rollup::default()
        };
        rollup.counts[0] = 60; // inherited
        rollup.counts[1] = 10; // local
        let value = signal_value(Signal::LocalExceedRatio, &rollup, None).unwrap();
        assert!((value - 0.25).abs() < 1e-9, "{value}");
        let burn = signal_value(Signal::SloBurnRate, &rollup, Some(0.99)).unwrap();
        assert!((burn - 25.0).abs() < 1e-9, "{burn}");
        assert_eq!(
            signal_value(Signal::OverspentRatio, &Rollup::default(), None),
            None
        );
    }

    #[test]
    fn slo_burn_rate_needs_both_windows_past_the_threshold() {
        let rule = parse_file(
            "rules:\n  - { name: slo, signal: slo_burn_rate, objective: 0.99, op: \">\", threshold: 14.4, window: 1h, short_window: 5m }\n",
        )
        .unwrap()
        .rules
        .remove(0);
        let window = |long_local: i64, short_local: i64| {
            let mut long = Rollup {
                requests: 1000,
                ..Rollup::default()
            };
            long.counts[1] = long_local;
            let mut short = Rollup {
                requests: 100,
                ..Rollup::default()
            };
            short.counts[1] = short_local;
            let key = ("a".to_string(), "b".to_string());
            (
                BTreeMap::from([(key.clone(), long)]),
                BTreeMap::from([(key, short)]),
            )
        };
        let none = BTreeMap::new();
        fn windows((long, short): &(HopRollups, HopRollups)) -> Windows<'_> {
            Windows {
                long,
                short: Some(short),
                findings: None,
            }
        }
        // 20 % of the budget of errors over the hour, but the last 5 minutes are clean.
        let clean = window(200, 0);
        assert!(
            evaluate(&rule, 0, windows(&clean), &none)
                .instances
                .is_empty()
        );
        let burning = window(200, 20);
        let out = evaluate(&rule, 0, windows(&burning), &none);
        assert_eq!(out.instances[0].state, State::Firing);
        assert!((out.instances[0].value.unwrap() - 20.0).abs() < 1e-9);
        assert!((out.instances[0].short_value.unwrap() - 20.0).abs() < 1e-9);
    }

    #[test]
    fn pausing_resolves_what_fires_and_drops_what_is_pending() {
        let firing = run(&rule(""), &[(100, 10)]);
        assert_eq!(firing, ["firing/critical Fired"]);
        let mut paused = rule("");
        paused.paused = true;
        let hops = hop(100, 10);
        let prev = evaluate(&rule(""), 0, long(&hops), &BTreeMap::new()).instances;
        let previous = prev.into_iter().map(|i| (i.key(), i)).collect();
        let out = evaluate(&paused, 30 * S, long(&hops), &previous);
        assert_eq!(out.changes.len(), 1);
        assert_eq!(out.changes[0].0, Change::Resolved);
    }

    #[test]
    fn a_hop_is_inhibited_only_by_a_firing_sender_of_the_same_family() {
        let hops = hop(100, 10);
        let mut victim = evaluate(&rule(""), 0, long(&hops), &BTreeMap::new())
            .instances
            .remove(0);
        let mut sender = victim.clone();
        sender.service = "edge".into();
        sender.operation = "GET /".into();
        sender.rule = "edge-rule".into();
        let family = |rule: &str| match rule {
            "r" | "edge-rule" => Some("deadline_exceeded"),
            "burn-rule" => Some("burn_p99"),
            _ => None,
        };
        let firing = [sender.clone()];
        assert!(
            inhibitor(&victim, &firing, family).is_none(),
            "no known sender"
        );
        victim.spent_by = Some(("edge".into(), "GET /".into()));
        assert_eq!(
            inhibitor(&victim, &firing, family).map(|i| i.rule.as_str()),
            Some("edge-rule")
        );
        let mut other_family = sender.clone();
        other_family.rule = "burn-rule".into();
        assert!(inhibitor(&victim, &[other_family], family).is_none());
        let mut resolved = sender;
        resolved.state = State::Resolved;
        assert!(inhibitor(&victim, &[resolved], family).is_none());
    }

    #[test]
    fn globs_select_the_hops() {
        let mut hops = hop(100, 10);
        hops.insert(
            ("billing".to_string(), "Charge".to_string()),
            hops.values().next().unwrap().clone(),
        );
        hops.insert(
            ("inventory2".to_string(), "GET /items".to_string()),
            hops.values().next().unwrap().clone(),
        );
        let out = evaluate(&rule(""), 0, long(&hops), &BTreeMap::new());
        assert_eq!(out.instances.len(), 1);
        assert_eq!(out.instances[0].service, "inventory");
        let mut prefixed = rule("");
        prefixed.service = NamePattern::parse("inv*").unwrap();
        assert_eq!(prefixed.service.prefix(), Some("inv"));
        let out = evaluate(&prefixed, 0, long(&hops), &BTreeMap::new());
        let services: Vec<&str> = out.instances.iter().map(|i| i.service.as_str()).collect();
        assert_eq!(services, ["inventory", "inventory2"]);
        assert_eq!(NamePattern::parse("a*b*").unwrap().prefix(), None);
    }
}

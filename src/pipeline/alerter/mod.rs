//! The alert runner: evaluates the rules every `--alert-interval` over the hop rollups of
//! their windows, stores what changed, and delivers the notifications.
//!
//! Architecture invariant: the decisions are `core::alerts::eval`'s (pure); this module only
//! reads rollups and instances, writes the evaluation's result and sends. A notification is
//! queued in the same transaction as the state change that causes it (an outbox), and
//! delivery reads the queue: a crash between the two loses nothing, and a notification is
//! sent once per change (again only when a delivery's answer was lost).

mod delivery;
mod rulebook;

pub use delivery::{Failure, MAX_ATTEMPTS, TestDelivery, after_attempt, deliver, send_test};
pub use rulebook::{RuleBook, RulesFileError, read_rules_file, refresh_stored_rules};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::now_unix_nano;

use crate::core::advice::{self, FindingCounts};
use crate::core::alerts::eval::{
    self, Change, Evaluation, HopKey, HopRollups, Instance, State, Windows,
};
use crate::core::alerts::notify::{self, Context, ExampleTrace, Notification, SpentCaller};
use crate::core::alerts::rules::{Rule, RuleSet};
use crate::core::alerts::silence::{Silence, silenced_by};
use crate::core::analyze::hops::ReportedRow;
use crate::core::analyze::hops::Rollup;
use crate::pipeline::lease::Lease;
use crate::store::AlertWrite;
use crate::store::query::TraceQuery;
use crate::store::query::{MetricsQuery, RollupQuery};
use crate::store::{Store, StoreError};

const MINUTE: u64 = 60_000_000_000;

#[derive(Debug, Clone)]
pub struct AlerterOptions {
    pub interval: Duration,
    /// How far behind the clock a window ends, so late traces are summarised first.
    pub delay: Duration,
    /// The UI's address as users reach it (links in notifications), without trailing `/`.
    pub external_url: String,
    /// For analysing the traces that show who sent a hop its already-spent requests.
    pub analyze: crate::core::analyze::AnalyzeOptions,
}

pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// The minute-aligned `[since, until)` a window of `length` reads when evaluated at `now`:
/// the minutes that cover the `length` before `now − delay`, so it never reads less than
/// `length` (and at most a minute more).
pub fn window_range(now: u64, delay: Duration, length: Duration) -> (u64, u64) {
    let at = now.saturating_sub(nanos(delay));
    let since = at.saturating_sub(nanos(length));
    (since - since % MINUTE, (at / MINUTE + 1) * MINUTE)
}

/// Windows up to this long are all summed from one read of minute rows; longer ones are
/// read one by one, whole hours from the hourly rollups.
const ONE_READ: Duration = Duration::from_secs(3600);

/// Every hop's rollup over each window length. The windows up to `ONE_READ` share one read
/// of minute rows (the longest of them), summed per window as the rows stream by: reading
/// rows is most of an evaluation (`cargo bench --bench alerts`).
async fn read_windows(
    store: &dyn Store,
    lengths: &BTreeSet<Duration>,
    now: u64,
    delay: Duration,
) -> Result<BTreeMap<Duration, HopRollups>, StoreError> {
    let mut windows: BTreeMap<Duration, HopRollups> = BTreeMap::new();
    let (short, long): (Vec<Duration>, Vec<Duration>) =
        lengths.iter().partition(|l| **l <= ONE_READ);
    if let Some(longest) = short.last() {
        let (since, until) = window_range(now, delay, *longest);
        let starts: Vec<(Duration, u64)> = short
            .iter()
            .map(|l| (*l, window_range(now, delay, *l).0))
            .collect();
        for row in store
            .hop_rollups(&RollupQuery {
                since_unix_nano: since,
                until_unix_nano: until,
                ..Default::default()
            })
            .await?
        {
            let key = (row.service, row.operation);
            for (length, start) in &starts {
                if row.minute_unix_nano >= *start {
                    windows
                        .entry(*length)
                        .or_default()
                        .entry(key.clone())
                        .or_default()
                        .merge(&row.rollup);
                }
            }
        }
    }
    for length in long {
        let (since, until) = window_range(now, delay, length);
        let merged = windows.entry(length).or_default();
        for row in store
            .hop_rollups(&RollupQuery {
                since_unix_nano: since,
                until_unix_nano: until,
                hourly: true,
                ..Default::default()
            })
            .await?
        {
            merged
                .entry((row.service, row.operation))
                .or_default()
                .merge(&row.rollup);
        }
    }
    // The hops' deadline metrics, summed per window (one read each: a row per hop).
    for length in lengths {
        let (since, until) = window_range(now, delay, *length);
        let merged = windows.entry(*length).or_default();
        for row in store
            .reported(&MetricsQuery {
                since_unix_nano: since,
                until_unix_nano: until,
                ..Default::default()
            })
            .await?
        {
            merged
                .entry((row.service, row.operation))
                .or_default()
                .reported
                .merge(&row.reported, 1);
        }
    }
    Ok(windows)
}

/// What one evaluation pass did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    pub rules: usize,
    pub instances: usize,
    pub changes: usize,
    pub notifications: usize,
}

/// Evaluates every rule once at `now` and stores the outcome.
pub async fn evaluate_once(
    store: &dyn Store,
    rules: &RuleSet,
    options: &AlerterOptions,
    now: u64,
) -> Result<PassReport, StoreError> {
    let mut previous: HashMap<String, BTreeMap<HopKey, Instance>> = HashMap::new();
    for instance in store.alert_instances().await? {
        previous
            .entry(instance.rule.clone())
            .or_default()
            .insert(instance.key(), instance);
    }
    let lengths: BTreeSet<Duration> = rules
        .rules
        .iter()
        .filter(|r| !r.paused)
        .flat_map(|r| std::iter::once(r.window).chain(r.short_window))
        .collect();
    let windows = read_windows(store, &lengths, now, options.delay).await?;
    // The advisor's findings over each window a `finding_*` rule reads: its hops' rollups
    // and the window's edges.
    let mut findings: BTreeMap<Duration, FindingCounts> = BTreeMap::new();
    for rule in rules.rules.iter().filter(|r| !r.paused) {
        if rule.signal.finding_kind().is_none() || findings.contains_key(&rule.window) {
            continue;
        }
        let (since, until) = window_range(now, options.delay, rule.window);
        let edges = store
            .edge_rollups(&RollupQuery {
                since_unix_nano: since,
                until_unix_nano: until,
                hourly: true,
                ..Default::default()
            })
            .await?;
        let found = advice::findings(
            windows.get(&rule.window).unwrap_or(&HopRollups::new()),
            &advice::merge_edges(&edges),
            options.analyze.tolerance_ms,
        );
        findings.insert(rule.window, advice::finding_counts(&found));
    }
    let silences = store.silences().await?;
    let empty = HopRollups::new();
    let mut write = AlertWrite::default();
    let mut report = PassReport {
        rules: rules.rules.len(),
        ..PassReport::default()
    };
    let mut evaluated: Vec<(&Rule, Evaluation)> = Vec::new();
    for rule in &rules.rules {
        let windows = Windows {
            long: windows.get(&rule.window).unwrap_or(&empty),
            short: rule.short_window.and_then(|w| windows.get(&w)),
            findings: findings.get(&rule.window),
        };
        let before = previous.remove(&rule.name).unwrap_or_default();
        evaluated.push((rule, eval::evaluate(rule, now, windows, &before)));
    }
    // Every instance firing after this pass, for inhibition.
    let firing: Vec<Instance> = evaluated
        .iter()
        .flat_map(|(_, outcome)| outcome.instances.iter())
        .filter(|i| i.state == State::Firing)
        .cloned()
        .collect();
    let family = |name: &str| {
        rules
            .rules
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.signal.family())
    };
    let mut changes: Vec<(&Rule, Change, Instance, Vec<SpentCaller>)> = Vec::new();
    for (rule, outcome) in &mut evaluated {
        for instance in &mut outcome.instances {
            let fired = outcome
                .changes
                .iter()
                .any(|(c, i)| *c == Change::Fired && i.key() == instance.key());
            let inherited = windows
                .get(&rule.window)
                .and_then(|w| w.get(&instance.key()))
                .is_some_and(|r| r.count("inherited_exceed") > 0);
            // Who sent it spent requests and where their budget ran out: looked up once,
            // when an episode starts, for the exceed signals where inheriting is the story.
            let (callers, origin) =
                if fired && inherited && rule.signal.family() == "deadline_exceeded" {
                    spent_callers(store, rule, instance, options, now).await
                } else {
                    (Vec::new(), None)
                };
            if let Some(origin) = origin {
                instance.spent_by = Some(origin);
            }
            let inhibited = eval::inhibitor(instance, &firing, family).is_some();
            if let Some(change) =
                to_notify(rule, instance, &outcome.changes, &silences, inhibited, now)
            {
                changes.push((rule, change, instance.clone(), callers));
            }
        }
    }
    for (rule, outcome) in evaluated {
        collect(&mut write, outcome, &rule.name);
    }
    // Instances of rules that are gone: what fired resolves, the rest goes. Nobody is
    // notified: the rule that named the receivers no longer exists.
    for (name, instances) in previous {
        let mut outcome = Evaluation::default();
        for instance in instances.values() {
            eval::stop(instance, now, &mut outcome);
        }
        outcome.changes.clear();
        collect(&mut write, outcome, &name);
    }
    for (rule, change, instance, callers) in &changes {
        let context = context(store, rule, instance, options, now, callers.clone()).await;
        let alert = notify::alert(rule, instance, *change, &context);
        for receiver in &rule.receivers {
            write.notifications.push(Notification {
                id: 0,
                created_unix_nano: now,
                receiver: receiver.clone(),
                rule: rule.name.clone(),
                service: instance.service.clone(),
                operation: instance.operation.clone(),
                status: alert["status"].as_str().unwrap_or("firing").to_string(),
                alert: alert.clone(),
                attempts: 0,
                next_attempt_unix_nano: Some(now),
                delivered_unix_nano: None,
                last_error: String::new(),
            });
        }
    }
    report.instances = write.instances.len();
    report.changes = changes.len();
    report.notifications = write.notifications.len();
    store.save_alerts(&write).await?;
    Ok(report)
}

/// Whether an instance, as just evaluated, sends a notification, and as which change; marks
/// a firing instance notified. A firing instance notifies once per episode (and again when
/// its severity changes), not while a silence matches it or it is inhibited: a change made
/// meanwhile is notified when that ends, if the instance still fires then. A resolution is
/// notified when the firing was. With `repeat_interval`, a firing instance notifies again
/// that long after its last notification.
fn to_notify(
    rule: &Rule,
    instance: &mut Instance,
    changes: &[(Change, Instance)],
    silences: &[Silence],
    inhibited: bool,
    now: u64,
) -> Option<Change> {
    let change = changes
        .iter()
        .find(|(_, i)| i.service == instance.service && i.operation == instance.operation)
        .map(|(c, _)| *c);
    match instance.state {
        State::Firing => {
            let silenced = silenced_by(silences, &notify::labels(rule, instance), now).is_some();
            if silenced || inhibited {
                return None;
            }
            let notified = std::mem::replace(&mut instance.notified, true);
            let repeat_due = match (rule.repeat_interval, instance.notified_at) {
                (Some(every), Some(at)) => now.saturating_sub(at) >= nanos(every),
                _ => false,
            };
            let send = match (notified, change) {
                (false, _) => Some(Change::Fired),
                (true, Some(Change::SeverityChanged)) => Some(Change::SeverityChanged),
                (true, _) if repeat_due => Some(Change::Repeated),
                (true, _) => None,
            };
            if send.is_some() {
                instance.notified_at = Some(now);
            }
            send
        }
        State::Resolved => {
            (change == Some(Change::Resolved) && instance.notified).then_some(Change::Resolved)
        }
        State::Pending => None,
    }
}

fn collect(write: &mut AlertWrite, outcome: Evaluation, rule: &str) {
    write.instances.extend(outcome.instances);
    write.history.extend(outcome.history);
    write.removed.extend(
        outcome
            .removed
            .into_iter()
            .map(|(service, operation)| (rule.to_string(), service, operation)),
    );
}

/// The evidence and example traces of a state change: the hop's numbers over the window,
/// and up to 3 traces of the window that show the rule's flag on this hop's traces.
async fn context(
    store: &dyn Store,
    rule: &Rule,
    instance: &Instance,
    options: &AlerterOptions,
    now: u64,
    spent_callers: Vec<SpentCaller>,
) -> Context {
    let (since, until) = window_range(now, options.delay, rule.window);
    let (service, operation) = (Some(&instance.service[..]), Some(&instance.operation[..]));
    let rows = store
        .hop_rollups(&RollupQuery {
            since_unix_nano: since,
            until_unix_nano: until,
            service,
            operation,
            hourly: true,
        })
        .await
        .unwrap_or_default();
    let reported = store
        .reported(&MetricsQuery {
            since_unix_nano: since,
            until_unix_nano: until,
            service,
            operation,
            ..Default::default()
        })
        .await
        .unwrap_or_default();
    let rollup = rows
        .into_iter()
        .chain(reported.into_iter().map(ReportedRow::into_rollup_row))
        .fold(Rollup::default(), |mut sum, row| {
            sum.merge(&row.rollup);
            sum
        });
    let query = TraceQuery {
        service: Some(instance.service.clone()),
        operation: Some(instance.operation.clone()),
        flag: rule.signal.flag(),
        since_unix_nano: Some(since),
        until_unix_nano: Some(until),
        limit: 3,
        ..TraceQuery::default()
    };
    let examples = match store.search_traces(&query).await {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(%error, rule = %rule.name, "could not find example traces for a notification");
            Vec::new()
        }
    };
    let external = options.external_url.trim_end_matches('/');
    Context {
        external_url: external.to_string(),
        evidence: eval::evidence(&rollup),
        example_traces: examples
            .iter()
            .map(|summary| {
                let id = summary.trace_id.to_hex();
                ExampleTrace {
                    url: format!("{external}/traces/{id}"),
                    trace_id: id,
                }
            })
            .collect(),
        spent_callers,
    }
}

/// How many recent traces where the hop arrived already spent are analysed to find who
/// sent them.
const SPENT_TRACES: u32 = 50;

/// The top 3 hops that sent `instance`'s hop already-spent requests in the rule's window,
/// and the origin hop where most of those requests ran out, from up to `SPENT_TRACES`
/// recent such traces; empty when the lookup fails.
async fn spent_callers(
    store: &dyn Store,
    rule: &Rule,
    instance: &Instance,
    options: &AlerterOptions,
    now: u64,
) -> (Vec<SpentCaller>, Option<HopKey>) {
    let (since, until) = window_range(now, options.delay, rule.window);
    let query = TraceQuery {
        service: Some(instance.service.clone()),
        operation: Some(instance.operation.clone()),
        flag: Some(crate::core::analyze::Flag::InheritedExceed),
        since_unix_nano: Some(since),
        until_unix_nano: Some(until),
        limit: SPENT_TRACES,
        ..TraceQuery::default()
    };
    // From the traces' stored hop samples, as the rollups that fired the rule were.
    let found = async {
        let ids: Vec<_> = store
            .search_traces(&query)
            .await?
            .iter()
            .map(|t| t.trace_id)
            .collect();
        if ids.is_empty() {
            return Ok(Default::default());
        }
        store.hop_samples(&ids).await
    }
    .await;
    let samples = match found {
        Ok(samples) => samples,
        Err(error) => {
            tracing::warn!(%error, rule = %rule.name, "could not look up who sent spent requests");
            return (Vec::new(), None);
        }
    };
    let mut spent = crate::core::analyze::hops::Spent::default();
    for (id, samples) in &samples {
        spent.add(*id, samples, &instance.service, &instance.operation);
    }
    let origin = spent.top_origin();
    let mut ranked: Vec<SpentCaller> = spent
        .callers
        .into_iter()
        .map(|((service, operation), (requests, _))| SpentCaller {
            service,
            operation,
            requests,
        })
        .collect();
    ranked.sort_by_key(|c| std::cmp::Reverse(c.requests));
    ranked.truncate(3);
    (ranked, origin)
}

/// The most hops one backtest looks at, so that it answers within a page load.
pub const BACKTEST_HOPS: usize = 500;

/// How far back a backtest looks.
pub const BACKTEST_SPAN: Duration = Duration::from_secs(24 * 3600);

/// When `rule` would have fired over the last `BACKTEST_SPAN` of rollups, evaluated once a
/// minute. Of the hops it selects, the `BACKTEST_HOPS` with the most requests are tried;
/// the second value says how many hops it selected in all.
pub async fn backtest(
    store: &dyn Store,
    rule: &Rule,
    now: u64,
    tolerance_ms: f64,
) -> Result<(crate::core::alerts::backtest::Backtest, usize), StoreError> {
    // Through the end of the current minute, so the backtest sees what just happened.
    let to = (now / MINUTE + 1) * MINUTE;
    let from = to.saturating_sub(nanos(BACKTEST_SPAN));
    let since = from.saturating_sub(nanos(rule.window) + MINUTE);
    let rows = store
        .hop_rollups(&RollupQuery {
            since_unix_nano: since,
            until_unix_nano: to,
            service: rule.service.literal(),
            operation: rule.operation.literal(),
            ..Default::default()
        })
        .await?;
    // The hops' deadline metrics, minute by minute beside the traces' rollups.
    let reported = store
        .reported(&MetricsQuery {
            since_unix_nano: since,
            until_unix_nano: to,
            service: rule.service.literal(),
            operation: rule.operation.literal(),
            per_minute: true,
        })
        .await?;
    let mut minutes: crate::core::alerts::backtest::MinuteRollups = BTreeMap::new();
    for row in rows
        .into_iter()
        .chain(reported.into_iter().map(ReportedRow::into_rollup_row))
    {
        if rule.service.matches(&row.service) && rule.operation.matches(&row.operation) {
            minutes
                .entry((row.service, row.operation))
                .or_default()
                .entry(row.minute_unix_nano)
                .or_default()
                .merge(&row.rollup);
        }
    }
    let selected = minutes.len();
    if selected > BACKTEST_HOPS {
        // Traffic: the traces' requests, or the metrics' where they count more.
        let traffic = |r: &Rollup| r.requests.max(r.reported.received_count);
        let mut by_traffic: Vec<(i64, HopKey)> = minutes
            .iter()
            .map(|(key, m)| (-m.values().map(traffic).sum::<i64>(), key.clone()))
            .collect();
        by_traffic.sort();
        let kept: BTreeSet<HopKey> = by_traffic
            .into_iter()
            .take(BACKTEST_HOPS)
            .map(|(_, key)| key)
            .collect();
        minutes.retain(|key, _| kept.contains(key));
    }
    let result = tokio::task::spawn_blocking({
        let rule = rule.clone();
        move || crate::core::alerts::backtest::backtest(&rule, &minutes, from, to, tolerance_ms)
    })
    .await
    .map_err(|e| StoreError::Unavailable(format!("the backtest stopped: {e}")))?;
    Ok((result, selected))
}

/// Evaluates every `interval` until `stop`, while this server holds `lease`; the stored
/// rules are read on every server (the UI shows them).
pub async fn run(
    store: Arc<dyn Store>,
    rules: Arc<RuleBook>,
    options: AlerterOptions,
    metrics: Arc<crate::pipeline::metrics::Metrics>,
    lease: Arc<Lease>,
    stop: CancellationToken,
) {
    loop {
        if let Err(error) = refresh_stored_rules(store.as_ref(), &rules).await {
            tracing::warn!(%error, "reading the stored alert rules failed; using the last ones read");
        }
        let set = rules.current();
        if !set.rules.is_empty() && lease.held() {
            match evaluate_once(store.as_ref(), &set, &options, now_unix_nano()).await {
                Ok(report) => {
                    metrics.alert_evaluations.inc();
                    if report.changes > 0 {
                        tracing::info!(
                            changes = report.changes,
                            notifications = report.notifications,
                            "alert states changed"
                        )
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "evaluating alert rules failed; will try again")
                }
            }
            delivery::resend_firing(store.as_ref(), &set, &options, now_unix_nano()).await;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(options.interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_firing_episode_notifies_once_then_every_repeat_interval_unless_held_back() {
        let rule = crate::core::alerts::rules::parse_file(
            "rules:\n  - { name: r, signal: requests, op: \">\", threshold: 1, window: 5m, repeat_interval: 1m }\n",
        )
        .unwrap()
        .rules
        .remove(0);
        let hops = HopRollups::from([(
            ("a".to_string(), "b".to_string()),
            Rollup {
                requests: 5,
                ..Rollup::default()
            },
        )]);
        let windows = Windows {
            long: &hops,
            short: None,
            findings: None,
        };
        let outcome = eval::evaluate(&rule, 0, windows, &BTreeMap::new());
        let mut instance = outcome.instances[0].clone();
        let fired = &outcome.changes;
        // Inhibited or silenced: nothing, and not marked notified.
        assert_eq!(to_notify(&rule, &mut instance, fired, &[], true, 0), None);
        assert!(!instance.notified);
        let silence = Silence {
            id: 1,
            matchers: crate::core::alerts::silence::parse_matchers("alertname=r").unwrap(),
            starts_unix_nano: 0,
            ends_unix_nano: 10 * S,
            comment: "c".into(),
            created_by: String::new(),
            created_unix_nano: 0,
        };
        assert_eq!(
            to_notify(&rule, &mut instance, fired, &[silence], false, 0),
            None
        );
        // Then once, and again a minute after the last notification.
        assert_eq!(
            to_notify(&rule, &mut instance, fired, &[], false, 20 * S),
            Some(Change::Fired)
        );
        assert_eq!(instance.notified_at, Some(20 * S));
        assert_eq!(
            to_notify(&rule, &mut instance, &[], &[], false, 60 * S),
            None
        );
        assert_eq!(
            to_notify(&rule, &mut instance, &[], &[], false, 80 * S),
            Some(Change::Repeated)
        );
        assert_eq!(
            to_notify(&rule, &mut instance, &[], &[], false, 100 * S),
            None
        );
    }

    #[test]
    fn a_window_covers_its_length_before_now_minus_the_delay_in_whole_minutes() {
        let now = 100 * MINUTE + 10_000_000_000;
        assert_eq!(
            window_range(now, Duration::from_secs(40), Duration::from_secs(300)),
            (94 * MINUTE, 100 * MINUTE)
        );
        assert_eq!(
            window_range(now, Duration::ZERO, Duration::from_secs(90)),
            (98 * MINUTE, 101 * MINUTE)
        );
        assert_eq!(
            window_range(100 * MINUTE, Duration::ZERO, Duration::from_secs(60)),
            (99 * MINUTE, 101 * MINUTE)
        );
    }
}

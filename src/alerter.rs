//! The alert runner: evaluates the rules every `--alert-interval` over the hop rollups of
//! their windows, stores what changed, and delivers the notifications.
//!
//! Architecture invariant: the decisions are `alerts::eval`'s (pure); this module only
//! reads rollups and instances, writes the evaluation's result and sends. A notification is
//! queued in the same transaction as the state change that causes it (an outbox), and
//! delivery reads the queue: a crash between the two loses nothing, and a notification is
//! sent once per change (again only when a delivery's answer was lost).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::alerts::eval::{self, Evaluation, HopKey, HopRollups, Instance, Windows};
use crate::alerts::notify::{self, Context, ExampleTrace, Notification};
use crate::alerts::rules::{ReceiverConfig, ReceiverKind, Rule, RuleError, RuleSet};
use crate::analyze::hops::Rollup;
use crate::store::alerts::AlertWrite;
use crate::store::query::TraceQuery;
use crate::store::{Store, StoreError};

const MINUTE: u64 = 60_000_000_000;

/// Delivery attempts before a notification is given up (and logged as failed).
pub const MAX_ATTEMPTS: i64 = 10;

/// The longest wait between two attempts; waits double from 1 s up to it.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long one delivery may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct AlerterOptions {
    pub interval: Duration,
    /// How far behind the clock a window ends, so late traces are summarised first.
    pub delay: Duration,
    /// The UI's address as users reach it (links in notifications), without trailing `/`.
    pub external_url: String,
}

/// The rules in force: those of the rules file (`--rules`), re-read on SIGHUP.
#[derive(Default)]
pub struct RuleBook {
    file: Option<PathBuf>,
    current: RwLock<Arc<RuleSet>>,
}

/// A rules file that could not be used, with every problem in it.
#[derive(Debug, thiserror::Error)]
#[error("{}", describe(.path, .errors))]
pub struct RulesFileError {
    pub path: PathBuf,
    pub errors: Vec<RuleError>,
}

fn describe(path: &std::path::Path, errors: &[RuleError]) -> String {
    let mut text = format!(
        "{}: {} problem{}",
        path.display(),
        errors.len(),
        if errors.len() == 1 { "" } else { "s" }
    );
    for error in errors {
        text.push_str(&format!("\n  {error}"));
    }
    text
}

/// Reads and validates a rules file.
pub fn read_rules_file(path: &std::path::Path) -> Result<RuleSet, RulesFileError> {
    let fail = |problem: String| RulesFileError {
        path: path.to_path_buf(),
        errors: vec![RuleError {
            place: String::new(),
            field: String::new(),
            problem,
        }],
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(format!(
            "cannot read the file ({e}); check the path given to --rules"
        ))
    })?;
    crate::alerts::rules::parse_file(&text).map_err(|errors| RulesFileError {
        path: path.to_path_buf(),
        errors,
    })
}

impl RuleBook {
    /// Loads the rules file, if any; a file with problems fails start-up.
    pub fn load(file: Option<PathBuf>) -> Result<RuleBook, RulesFileError> {
        let set = match &file {
            Some(path) => read_rules_file(path)?,
            None => RuleSet::default(),
        };
        Ok(RuleBook {
            file,
            current: RwLock::new(Arc::new(set)),
        })
    }

    pub fn current(&self) -> Arc<RuleSet> {
        self.current
            .read()
            .map(|set| set.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    pub fn file(&self) -> Option<&std::path::Path> {
        self.file.as_deref()
    }

    /// Re-reads the rules file. On any problem the rules in force stay as they are.
    pub fn reload(&self) -> Result<usize, RulesFileError> {
        let Some(path) = &self.file else {
            return Ok(0);
        };
        let set = read_rules_file(path)?;
        let count = set.rules.len();
        match self.current.write() {
            Ok(mut current) => *current = Arc::new(set),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(set),
        }
        Ok(count)
    }
}

fn now_unix_nano() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn nanos(duration: Duration) -> u64 {
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

/// Every hop's rollup over `[since, until)`.
async fn hop_rollups(store: &dyn Store, since: u64, until: u64) -> Result<HopRollups, StoreError> {
    let mut merged: HopRollups = BTreeMap::new();
    for row in store.hop_rollups(since, until, None, None, true).await? {
        merged
            .entry((row.service, row.operation))
            .or_default()
            .merge(&row.rollup);
    }
    Ok(merged)
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
    // One read per distinct window length, shared by the rules that use it.
    let mut windows: BTreeMap<Duration, HopRollups> = BTreeMap::new();
    for rule in rules.rules.iter().filter(|r| !r.paused) {
        for length in std::iter::once(rule.window).chain(rule.short_window) {
            if let std::collections::btree_map::Entry::Vacant(entry) = windows.entry(length) {
                let (since, until) = window_range(now, options.delay, length);
                entry.insert(hop_rollups(store, since, until).await?);
            }
        }
    }
    let empty = HopRollups::new();
    let mut write = AlertWrite::default();
    let mut report = PassReport {
        rules: rules.rules.len(),
        ..PassReport::default()
    };
    let mut changes: Vec<(&Rule, eval::Change, Instance)> = Vec::new();
    for rule in &rules.rules {
        let windows = Windows {
            long: windows.get(&rule.window).unwrap_or(&empty),
            short: rule.short_window.and_then(|w| windows.get(&w)),
        };
        let before = previous.remove(&rule.name).unwrap_or_default();
        let outcome = eval::evaluate(rule, now, windows, &before);
        changes.extend(outcome.changes.iter().map(|(c, i)| (rule, *c, i.clone())));
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
    for (rule, change, instance) in &changes {
        let context = context(store, rule, instance, options, now).await;
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
) -> Context {
    let (since, until) = window_range(now, options.delay, rule.window);
    let rollup = store
        .hop_rollups(
            since,
            until,
            Some(&instance.service),
            Some(&instance.operation),
            true,
        )
        .await
        .unwrap_or_default()
        .into_iter()
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
    }
}

/// Evaluates every `interval` until `stop`.
pub async fn run(
    store: Arc<dyn Store>,
    rules: Arc<RuleBook>,
    options: AlerterOptions,
    stop: CancellationToken,
) {
    loop {
        let set = rules.current();
        if !set.rules.is_empty() {
            match evaluate_once(store.as_ref(), &set, &options, now_unix_nano()).await {
                Ok(report) if report.changes > 0 => {
                    tracing::info!(
                        changes = report.changes,
                        notifications = report.notifications,
                        "alert states changed"
                    )
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "evaluating alert rules failed; will try again")
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(options.interval) => {}
        }
    }
}

/// Delivers queued notifications until `stop`, polling every `poll`.
pub async fn deliver(
    store: Arc<dyn Store>,
    rules: Arc<RuleBook>,
    options: AlerterOptions,
    poll: Duration,
    stop: CancellationToken,
) {
    let client = match reqwest::Client::builder().timeout(SEND_TIMEOUT).build() {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot build the HTTP client for notifications; none will be sent");
            return;
        }
    };
    loop {
        match store.due_notifications(now_unix_nano(), 100).await {
            Ok(due) => {
                for notification in due {
                    if stop.is_cancelled() {
                        return;
                    }
                    let set = rules.current();
                    let receiver = set
                        .receivers
                        .iter()
                        .find(|r| r.name == notification.receiver);
                    let result = match receiver {
                        Some(receiver) => {
                            send(&client, receiver, &options.external_url, &notification).await
                        }
                        None => Err(Failure::permanent(format!(
                            "no receiver is named {:?} any more",
                            notification.receiver
                        ))),
                    };
                    let updated = after_attempt(notification, result, now_unix_nano());
                    if let Err(error) = store.record_attempt(&updated).await {
                        tracing::warn!(%error, "could not record a notification attempt; it will be tried again");
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "reading due notifications failed; will try again")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// Why a delivery failed, and whether trying again can help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub permanent: bool,
}

impl Failure {
    fn permanent(message: String) -> Failure {
        Failure {
            message,
            permanent: true,
        }
    }
}

/// The notification after one attempt: delivered, due again after a backoff, or given up.
pub fn after_attempt(
    mut notification: Notification,
    result: Result<(), Failure>,
    now: u64,
) -> Notification {
    notification.attempts += 1;
    match result {
        Ok(()) => {
            notification.delivered_unix_nano = Some(now);
            notification.next_attempt_unix_nano = None;
        }
        Err(failure) => {
            let give_up = failure.permanent || notification.attempts >= MAX_ATTEMPTS;
            notification.last_error = failure.message;
            notification.next_attempt_unix_nano = (!give_up).then(|| {
                let exponent = u32::try_from(notification.attempts - 1)
                    .unwrap_or(31)
                    .min(20);
                let wait = Duration::from_secs(1u64 << exponent).min(MAX_BACKOFF);
                now + nanos(wait)
            });
            if give_up {
                tracing::warn!(
                    receiver = %notification.receiver, rule = %notification.rule,
                    attempts = notification.attempts, error = %notification.last_error,
                    "gave up delivering a notification"
                );
            }
        }
    }
    notification
}

/// One POST of a notification to a receiver.
async fn send(
    client: &reqwest::Client,
    receiver: &ReceiverConfig,
    external_url: &str,
    notification: &Notification,
) -> Result<(), Failure> {
    let url = match receiver.kind {
        ReceiverKind::Alertmanager => {
            format!("{}/api/v2/alerts", receiver.url.trim_end_matches('/'))
        }
        ReceiverKind::Webhook | ReceiverKind::Slack => receiver.url.clone(),
    };
    let body = notify::payload(
        receiver.kind,
        &receiver.name,
        external_url,
        &notification.alert,
    );
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| Failure {
            message: format!("POST {url}: {e}"),
            permanent: false,
        })?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    // A request the receiver refuses as such will be refused again; anything else may pass.
    let permanent = status.is_client_error()
        && status != reqwest::StatusCode::REQUEST_TIMEOUT
        && status != reqwest::StatusCode::TOO_MANY_REQUESTS;
    Err(Failure {
        message: format!("POST {url}: HTTP {status}"),
        permanent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn failed_attempts_back_off_and_give_up() {
        let fresh = Notification {
            id: 1,
            created_unix_nano: 0,
            receiver: "ops".into(),
            rule: "r".into(),
            service: "s".into(),
            operation: "o".into(),
            status: "firing".into(),
            alert: serde_json::json!({}),
            attempts: 0,
            next_attempt_unix_nano: Some(0),
            delivered_unix_nano: None,
            last_error: String::new(),
        };
        let retry = || Failure {
            message: "HTTP 500".into(),
            permanent: false,
        };
        let once = after_attempt(fresh.clone(), Err(retry()), 0);
        assert_eq!(once.next_attempt_unix_nano, Some(1_000_000_000));
        let twice = after_attempt(once, Err(retry()), 0);
        assert_eq!(twice.next_attempt_unix_nano, Some(2_000_000_000));
        let mut n = twice;
        while n.next_attempt_unix_nano.is_some() {
            n = after_attempt(n, Err(retry()), 0);
        }
        assert_eq!(n.attempts, MAX_ATTEMPTS);
        assert_eq!(n.outcome(), "failed");
        let refused = after_attempt(fresh.clone(), Err(Failure::permanent("HTTP 400".into())), 0);
        assert_eq!((refused.attempts, refused.outcome()), (1, "failed"));
        let sent = after_attempt(fresh, Ok(()), 7);
        assert_eq!(
            (sent.delivered_unix_nano, sent.outcome()),
            (Some(7), "delivered")
        );
    }
}

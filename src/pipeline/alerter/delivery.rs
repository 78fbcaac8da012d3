//! Notification delivery: the queue's due notifications posted to their receivers, with a
//! doubling wait between attempts; and test notifications, sent at once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{AlerterOptions, RuleBook, nanos};
use crate::clock::now_unix_nano;
use crate::core::alerts::eval::{self, Change, Instance, State};
use crate::core::alerts::notify::{self, Context, Notification};
use crate::core::alerts::rules::{ReceiverConfig, ReceiverKind, Rule, RuleSet};
use crate::core::alerts::silence::silenced_by;
use crate::pipeline::lease::Lease;
use crate::store::Store;

/// Delivery attempts before a notification is given up (and logged as failed).
pub const MAX_ATTEMPTS: i64 = 10;

/// The longest wait between two attempts; waits double from 1 s up to it.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long one delivery may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The outcome of a test notification to one receiver.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TestDelivery {
    pub receiver: String,
    pub delivered: bool,
    pub error: Option<String>,
}

/// Sends a made-up firing alert of `rule` to each of its receivers now, outside the queue,
/// and says how each answered.
pub async fn send_test(
    rule: &Rule,
    receivers: &[ReceiverConfig],
    external_url: &str,
    now: u64,
) -> Vec<TestDelivery> {
    let name_of = |pattern: &crate::core::alerts::rules::NamePattern, example: &str| {
        pattern.literal().unwrap_or(example).to_string()
    };
    let instance = Instance {
        rule: rule.name.clone(),
        service: name_of(&rule.service, "example-service"),
        operation: name_of(&rule.operation, "example-operation"),
        state: State::Firing,
        severity: eval::Severity::Critical,
        value: Some(rule.threshold),
        short_value: None,
        threshold: rule.threshold,
        requests: rule.min_requests,
        active_since: now,
        fired_at: Some(now),
        cleared_since: None,
        resolved_at: None,
        evaluated_at: now,
        notified: false,
        notified_at: None,
        spent_by: None,
    };
    let mut test_rule = rule.clone();
    test_rule.labels.insert("test".into(), "true".into());
    test_rule.annotations.insert(
        "summary".into(),
        format!(
            "Test notification from budgetscope for rule {}; nothing is firing.",
            rule.name
        ),
    );
    let context = Context {
        external_url: external_url.trim_end_matches('/').to_string(),
        ..Context::default()
    };
    let alert = notify::alert(&test_rule, &instance, Change::Fired, &context);
    let client = reqwest::Client::builder().timeout(SEND_TIMEOUT).build();
    let mut out = Vec::new();
    for name in &rule.receivers {
        let result = match (&client, receivers.iter().find(|r| &r.name == name)) {
            (Err(e), _) => Err(format!("no HTTP client: {e}")),
            (_, None) => Err(format!("no receiver is named {name:?}")),
            (Ok(client), Some(receiver)) => {
                let notification = Notification {
                    id: 0,
                    created_unix_nano: now,
                    receiver: name.clone(),
                    rule: rule.name.clone(),
                    service: instance.service.clone(),
                    operation: instance.operation.clone(),
                    status: "firing".into(),
                    alert: alert.clone(),
                    attempts: 0,
                    next_attempt_unix_nano: None,
                    delivered_unix_nano: None,
                    last_error: String::new(),
                };
                send(client, receiver, external_url, &notification)
                    .await
                    .map_err(|f| f.message)
            }
        };
        out.push(TestDelivery {
            receiver: name.clone(),
            delivered: result.is_ok(),
            error: result.err(),
        });
    }
    out
}

/// Re-sends every firing, notified and unsilenced instance to the Alertmanager receivers of
/// its rule, as Alertmanager expects of its clients: an alert it stops hearing about
/// resolves itself after its `resolve_timeout`. Best effort; a failure is logged and the
/// next evaluation sends again.
pub async fn resend_firing(store: &dyn Store, rules: &RuleSet, options: &AlerterOptions, now: u64) {
    let managers: Vec<&ReceiverConfig> = rules
        .receivers
        .iter()
        .filter(|r| r.kind == ReceiverKind::Alertmanager)
        .collect();
    if managers.is_empty() {
        return;
    }
    let (instances, silences) = match (store.alert_instances().await, store.silences().await) {
        (Ok(instances), Ok(silences)) => (instances, silences),
        (Err(error), _) | (_, Err(error)) => {
            tracing::warn!(%error, "could not read alert instances to re-send to Alertmanager");
            return;
        }
    };
    let context = Context {
        external_url: options.external_url.trim_end_matches('/').to_string(),
        ..Context::default()
    };
    let Ok(client) = reqwest::Client::builder().timeout(SEND_TIMEOUT).build() else {
        return;
    };
    for manager in managers {
        let alerts: Vec<serde_json::Value> = instances
            .iter()
            .filter(|i| i.state == State::Firing && i.notified)
            .filter_map(|i| {
                let rule = rules.rules.iter().find(|r| r.name == i.rule)?;
                let labels = notify::labels(rule, i);
                (rule.receivers.contains(&manager.name)
                    && silenced_by(&silences, &labels, now).is_none())
                .then(|| notify::alert(rule, i, Change::Fired, &context))
            })
            .collect();
        if alerts.is_empty() {
            continue;
        }
        let url = format!("{}/api/v2/alerts", manager.url.trim_end_matches('/'));
        let body: Vec<serde_json::Value> = alerts
            .iter()
            .flat_map(|a| {
                notify::payload(
                    ReceiverKind::Alertmanager,
                    &manager.name,
                    &context.external_url,
                    a,
                )
                .as_array()
                .cloned()
                .unwrap_or_default()
            })
            .collect();
        let result = client
            .post(&url)
            .header("content-type", "application/json")
            .body(serde_json::Value::from(body).to_string())
            .send()
            .await;
        match result {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => {
                tracing::warn!(%url, status = %response.status(), "Alertmanager refused the firing alerts; will send again")
            }
            Err(error) => {
                tracing::warn!(%url, %error, "could not re-send firing alerts to Alertmanager; will send again")
            }
        }
    }
}

/// Delivers queued notifications until `stop`, polling every `poll` while this server
/// holds `lease`.
pub async fn deliver(
    store: Arc<dyn Store>,
    rules: Arc<RuleBook>,
    options: AlerterOptions,
    poll: Duration,
    lease: Arc<Lease>,
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
        let due = match lease.held() {
            true => store.due_notifications(now_unix_nano(), 100).await,
            false => Ok(Vec::new()),
        };
        match due {
            Ok(due) => {
                for notification in due {
                    if stop.is_cancelled() {
                        return;
                    }
                    if !lease.held() {
                        break;
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

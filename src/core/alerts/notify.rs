//! Notification bodies, pure: what a state change of an instance sends to each kind of
//! receiver. One alert object per change, in the shape of Alertmanager's (labels,
//! annotations, startsAt, endsAt, generatorURL, fingerprint) with budgetscope's evidence
//! under `budgetscope`; the receivers' payloads wrap it.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{Value, json};

use super::eval::{Change, Evidence, Instance, State};
use super::rules::{ReceiverKind, Rule, render_template};

/// A notification to deliver, or one delivered (the delivery log).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notification {
    /// Assigned by the store; 0 before it is stored.
    pub id: i64,
    pub created_unix_nano: u64,
    pub receiver: String,
    pub rule: String,
    pub service: String,
    pub operation: String,
    /// `firing` or `resolved`.
    pub status: String,
    /// The alert object (`alert`).
    pub alert: Value,
    pub attempts: i64,
    /// When to try (again); `None` once delivered or given up.
    pub next_attempt_unix_nano: Option<u64>,
    pub delivered_unix_nano: Option<u64>,
    /// The last failure, for the delivery log; empty when none.
    pub last_error: String,
}

impl Notification {
    pub fn outcome(&self) -> &'static str {
        match (self.delivered_unix_nano, self.next_attempt_unix_nano) {
            (Some(_), _) => "delivered",
            (None, Some(_)) => "pending",
            (None, None) => "failed",
        }
    }
}

/// A trace that shows the problem, with its page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExampleTrace {
    pub trace_id: String,
    pub url: String,
}

/// A hop that sent the alerting hop requests whose budget was already spent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SpentCaller {
    pub service: String,
    pub operation: String,
    /// Of the recent traces looked at, how many such requests it sent.
    pub requests: usize,
}

/// What the runner knows about an instance's hop besides the instance itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    /// The UI's address as users reach it, without a trailing slash.
    pub external_url: String,
    pub evidence: Evidence,
    pub example_traces: Vec<ExampleTrace>,
    /// The top callers sending it spent budgets, most first.
    pub spent_callers: Vec<SpentCaller>,
}

/// RFC 3339 UTC with milliseconds, as Alertmanager writes times.
pub fn rfc3339(unix_nano: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_nanos(unix_nano);
    humantime::format_rfc3339_millis(time).to_string()
}

/// Alertmanager's "no end": the zero time.
const NO_END: &str = "0001-01-01T00:00:00Z";

/// Percent-encodes one path component.
pub fn path_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// The labels of an instance: the rule's, then the ones budgetscope sets.
pub fn labels(rule: &Rule, instance: &Instance) -> BTreeMap<String, String> {
    let mut labels = rule.labels.clone();
    labels.insert("alertname".into(), rule.name.clone());
    labels.insert("service".into(), instance.service.clone());
    labels.insert("operation".into(), instance.operation.clone());
    labels.insert("severity".into(), instance.severity.as_str().into());
    labels
}

/// Prometheus' label-set fingerprint: FNV-1a 64 over names and values, each followed by
/// the byte 0xff, in name order; 16 hex digits.
pub fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (name, value) in labels {
        eat(name.as_bytes());
        eat(&[0xff]);
        eat(value.as_bytes());
        eat(&[0xff]);
    }
    format!("{hash:016x}")
}

/// A number as people read it in a notification: ratios with 4 significant digits.
pub fn fmt_value(value: Option<f64>) -> String {
    match value {
        None => "no data".into(),
        Some(v) if v == v.trunc() && v.abs() < 1e15 => format!("{v:.0}"),
        Some(v) => {
            let text = format!("{v:.4}");
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        }
    }
}

/// The hop page of a hop.
pub fn hop_url(external_url: &str, service: &str, operation: &str) -> String {
    format!(
        "{external_url}/hops/{}/{}",
        path_component(service),
        path_component(operation)
    )
}

/// The alert object of one state change.
pub fn alert(rule: &Rule, instance: &Instance, change: Change, context: &Context) -> Value {
    let labels = labels(rule, instance);
    let value = fmt_value(instance.value);
    let threshold = fmt_value(Some(instance.threshold));
    let fields = [
        ("service", instance.service.as_str()),
        ("operation", instance.operation.as_str()),
        ("value", value.as_str()),
        ("threshold", threshold.as_str()),
    ];
    let mut annotations: BTreeMap<String, String> = rule
        .annotations
        .iter()
        .map(|(k, t)| (k.clone(), render_template(t, &fields)))
        .collect();
    annotations.entry("summary".into()).or_insert_with(|| {
        format!(
            "{} {}: {} is {value} ({} {threshold} over {})",
            instance.service,
            instance.operation,
            rule.signal,
            rule.op.as_str(),
            humantime::format_duration(rule.window)
        )
    });
    let resolved = instance.state == State::Resolved || change == Change::Resolved;
    let starts = instance.fired_at.unwrap_or(instance.active_since);
    let external = context.external_url.as_str();
    json!({
        "status": if resolved { "resolved" } else { "firing" },
        "labels": labels,
        "annotations": annotations,
        "startsAt": rfc3339(starts),
        "endsAt": instance.resolved_at.filter(|_| resolved).map_or(NO_END.to_string(), rfc3339),
        "generatorURL": format!("{external}/alerts/rules/{}", path_component(&rule.name)),
        "fingerprint": fingerprint(&labels),
        "budgetscope": {
            "change": change,
            "signal": rule.signal.as_str(),
            "op": rule.op.as_str(),
            "value": instance.value,
            "short_value": instance.short_value,
            "threshold": instance.threshold,
            "window": humantime::format_duration(rule.window).to_string(),
            "short_window": rule.short_window.map(|w| humantime::format_duration(w).to_string()),
            "requests": instance.requests,
            "evidence": context.evidence,
            "hop_url": hop_url(external, &instance.service, &instance.operation),
            "example_traces": context.example_traces,
            "top_spent_callers": context.spent_callers,
        },
    })
}

/// The body sent to a receiver for one alert object. `receiver` is the receiver's name.
pub fn payload(kind: ReceiverKind, receiver: &str, external_url: &str, alert: &Value) -> Value {
    match kind {
        ReceiverKind::Webhook => {
            let labels = alert["labels"].clone();
            json!({
                "version": "4",
                "groupKey": format!("{{}}:{{alertname={:?}}}", labels["alertname"].as_str().unwrap_or("")),
                "truncatedAlerts": 0,
                "status": alert["status"],
                "receiver": receiver,
                "groupLabels": {"alertname": labels["alertname"]},
                "commonLabels": labels,
                "commonAnnotations": alert["annotations"],
                "externalURL": external_url,
                "alerts": [alert],
            })
        }
        ReceiverKind::Alertmanager => {
            // Alertmanager's API takes the alert without status or fingerprint.
            json!([{
                "labels": alert["labels"],
                "annotations": alert["annotations"],
                "startsAt": alert["startsAt"],
                "endsAt": alert["endsAt"],
                "generatorURL": alert["generatorURL"],
            }])
        }
        ReceiverKind::Slack => json!({ "text": slack_text(alert) }),
    }
}

/// One short message: state, hop, value, and links.
pub fn slack_text(alert: &Value) -> String {
    let labels = &alert["labels"];
    let bs = &alert["budgetscope"];
    let mut text = format!(
        "[{}] {} on {} {}: {} = {} ({} {}, {} requests in {})\n{}",
        alert["status"].as_str().unwrap_or("").to_uppercase(),
        labels["alertname"].as_str().unwrap_or(""),
        labels["service"].as_str().unwrap_or(""),
        labels["operation"].as_str().unwrap_or(""),
        bs["signal"].as_str().unwrap_or(""),
        fmt_value(bs["value"].as_f64()),
        bs["op"].as_str().unwrap_or(""),
        fmt_value(bs["threshold"].as_f64()),
        bs["requests"],
        bs["window"].as_str().unwrap_or(""),
        bs["hop_url"].as_str().unwrap_or(""),
    );
    if let Some(examples) = bs["example_traces"].as_array() {
        for example in examples {
            text.push_str(&format!(
                "\nexample: {}",
                example["url"].as_str().unwrap_or("")
            ));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::alerts::eval::Severity;
    use crate::core::alerts::rules::parse_file;

    fn rule() -> Rule {
        parse_file(
            "rules:\n  - name: inventory-burning\n    service: inventory\n    signal: local_exceed_ratio\n    op: \">\"\n    threshold: 0.05\n    window: 5m\n    labels: { team: stock }\n    annotations: { summary: \"{{service}} {{operation}} burns its own budget: {{value}}\" }\n",
        )
        .unwrap()
        .rules
        .remove(0)
    }

    fn instance(state: State) -> Instance {
        Instance {
            rule: "inventory-burning".into(),
            service: "inventory".into(),
            operation: "GET /items/{id}".into(),
            state,
            severity: Severity::Critical,
            value: Some(0.125),
            short_value: None,
            threshold: 0.05,
            requests: 80,
            active_since: 1_764_000_000_000_000_000,
            fired_at: Some(1_764_000_060_000_000_000),
            cleared_since: None,
            resolved_at: (state == State::Resolved).then_some(1_764_000_600_000_000_000),
            evaluated_at: 1_764_000_600_000_000_000,
            notified: true,
            notified_at: None,
            spent_by: None,
        }
    }

    fn context() -> Context {
        Context {
            external_url: "http://bs:8080".into(),
            evidence: Evidence::default(),
            example_traces: vec![ExampleTrace {
                trace_id: "ab".repeat(16),
                url: format!("http://bs:8080/traces/{}", "ab".repeat(16)),
            }],
            spent_callers: vec![SpentCaller {
                service: "edge".into(),
                operation: "GET /".into(),
                requests: 7,
            }],
        }
    }

    #[test]
    fn a_firing_alert_carries_labels_annotations_and_evidence() {
        let alert = alert(&rule(), &instance(State::Firing), Change::Fired, &context());
        assert_eq!(alert["status"], "firing");
        assert_eq!(alert["labels"]["alertname"], "inventory-burning");
        assert_eq!(alert["labels"]["service"], "inventory");
        assert_eq!(alert["labels"]["operation"], "GET /items/{id}");
        assert_eq!(alert["labels"]["severity"], "critical");
        assert_eq!(alert["labels"]["team"], "stock");
        assert_eq!(
            alert["annotations"]["summary"],
            "inventory GET /items/{id} burns its own budget: 0.125"
        );
        assert_eq!(alert["startsAt"], "2025-11-24T16:01:00.000Z");
        assert_eq!(alert["endsAt"], NO_END);
        assert_eq!(
            alert["budgetscope"]["hop_url"],
            "http://bs:8080/hops/inventory/GET%20%2Fitems%2F%7Bid%7D"
        );
        assert_eq!(
            alert["budgetscope"]["example_traces"][0]["trace_id"],
            "ab".repeat(16)
        );
        assert_eq!(alert["fingerprint"].as_str().unwrap().len(), 16);
        assert_eq!(alert["budgetscope"]["top_spent_callers"][0]["requests"], 7);
    }

    #[test]
    fn a_resolved_alert_ends_when_it_resolved_and_keeps_its_fingerprint() {
        let firing = alert(&rule(), &instance(State::Firing), Change::Fired, &context());
        let resolved = alert(
            &rule(),
            &instance(State::Resolved),
            Change::Resolved,
            &context(),
        );
        assert_eq!(resolved["status"], "resolved");
        assert_eq!(resolved["endsAt"], "2025-11-24T16:10:00.000Z");
        assert_eq!(resolved["fingerprint"], firing["fingerprint"]);
    }

    #[test]
    fn payloads_wrap_the_alert_as_each_receiver_expects() {
        let alert = alert(&rule(), &instance(State::Firing), Change::Fired, &context());
        let webhook = payload(ReceiverKind::Webhook, "ops", "http://bs:8080", &alert);
        assert_eq!(webhook["version"], "4");
        assert_eq!(webhook["receiver"], "ops");
        assert_eq!(webhook["status"], "firing");
        assert_eq!(webhook["alerts"][0], alert);
        assert_eq!(webhook["commonLabels"]["alertname"], "inventory-burning");
        let am = payload(ReceiverKind::Alertmanager, "am", "http://bs:8080", &alert);
        assert_eq!(am[0]["labels"], alert["labels"]);
        assert!(am[0].get("status").is_none());
        let slack = payload(ReceiverKind::Slack, "chat", "http://bs:8080", &alert);
        let text = slack["text"].as_str().unwrap();
        assert!(text.starts_with("[FIRING] inventory-burning on inventory GET /items/{id}: local_exceed_ratio = 0.125 (> 0.05, 80 requests in 5m)"), "{text}");
        assert!(text.contains("example: http://bs:8080/traces/"), "{text}");
    }

    #[test]
    fn the_fingerprint_is_prometheus_fnv1a() {
        // FNV-1a 64 of the empty input is its offset basis.
        assert_eq!(fingerprint(&BTreeMap::new()), "cbf29ce484222325");
        let a = BTreeMap::from([("a".to_string(), "b".to_string())]);
        let b = BTreeMap::from([("a".to_string(), "c".to_string())]);
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }
}

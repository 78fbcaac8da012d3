//! Alerts end to end on both stores: a rules file, real OTLP traffic through the real
//! server, and a local webhook receiver that records what it is sent.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use common::{TestDb, fixture_trace, get_json, get_text, otlp_request, post_otlp, start};
use serde_json::Value;

/// A webhook receiver: records every body; answers 500 to the first `fail_first` posts.
#[derive(Clone, Default)]
struct Hook {
    received: Arc<Mutex<Vec<Value>>>,
    fail_first: Arc<AtomicUsize>,
    posts: Arc<AtomicUsize>,
}

impl Hook {
    async fn start(fail_first: usize) -> (Hook, SocketAddr) {
        let hook = Hook::default();
        hook.fail_first.store(fail_first, Ordering::SeqCst);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(hook.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (hook, addr)
    }

    fn with_status(&self, status: &str) -> Vec<Value> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|body| body["status"] == status)
            .cloned()
            .collect()
    }

    /// Waits up to 30 s for a body with this status.
    async fn wait_for(&self, status: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(body) = self.with_status(status).into_iter().next() {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "no {status} notification within 30 s; received {:?}",
                self.received.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn receive(State(hook): State<Hook>, Json(body): Json<Value>) -> StatusCode {
    hook.posts.fetch_add(1, Ordering::SeqCst);
    let failing = hook
        .fail_first
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    hook.received.lock().unwrap().push(body);
    StatusCode::OK
}

fn rules_file(dir: &std::path::Path, hook: SocketAddr) -> std::path::PathBuf {
    let path = dir.join("rules.yaml");
    std::fs::write(
        &path,
        format!(
            r#"
receivers:
  - name: ops
    webhook: {{ url: "http://{hook}/hook" }}
rules:
  - name: checkout-burning
    service: edge
    operation: "GET /*"
    signal: local_exceed_ratio
    op: ">"
    threshold: 0.5
    window: 1m
    for: 2s
    min_requests: 3
    labels: {{ team: web }}
    annotations: {{ summary: "{{{{service}}}} {{{{operation}}}} burns its own budget: {{{{value}}}}" }}
    receivers: [ops]
  - name: needs-more-traffic
    service: edge
    signal: local_exceed_count
    op: ">="
    threshold: 1
    window: 1m
    min_requests: 1000
    receivers: [ops]
"#
        ),
    )
    .unwrap();
    path
}

/// Serve flags that analyse traces at once and evaluate `rules` every second.
fn fast_alerts(rules: &std::path::Path) -> Vec<&str> {
    vec![
        "--quiet-period",
        "100ms",
        "--rules",
        rules.to_str().unwrap(),
        "--alert-interval",
        "1s",
        "--alert-delay",
        "0s",
    ]
}

/// A checkout that overran its own budget (a local exceed at edge), or one on time.
fn checkout(id: u8, late: bool) -> Vec<budgetscope::model::Span> {
    let duration = if late { 900 } else { 300 };
    fixture_trace(
        id,
        &format!(r#"edge server "GET /checkout" 0 {duration} budget=700"#),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_fires_after_for_notifies_with_evidence_and_resolves() {
    for db in TestDb::all().await {
        let backend = db.backend;
        let (hook, hook_addr) = Hook::start(2).await;
        let dir = tempfile::tempdir().unwrap();
        let rules = rules_file(dir.path(), hook_addr);
        let mut flags = fast_alerts(&rules);
        flags.extend(["--external-url", "http://budgets.example:8080/"]);
        let server = start(&db, &flags).await;
        let started = Instant::now();
        for id in 1..=4 {
            post_otlp(&server, &otlp_request(&checkout(id, true), 500)).await;
        }

        // Fires once `for` (2 s) has passed, and is delivered after two refused attempts.
        let firing = hook.wait_for("firing").await;
        assert!(
            started.elapsed() >= Duration::from_secs(2),
            "{backend}: fired before `for`"
        );
        assert_eq!(firing["version"], "4");
        assert_eq!(firing["receiver"], "ops");
        let alert = &firing["alerts"][0];
        assert_eq!(
            alert["labels"]["alertname"], "checkout-burning",
            "{backend}: {firing}"
        );
        assert_eq!(alert["labels"]["service"], "edge");
        assert_eq!(alert["labels"]["operation"], "GET /checkout");
        assert_eq!(alert["labels"]["team"], "web");
        assert_eq!(alert["status"], "firing");
        assert_eq!(
            alert["annotations"]["summary"],
            "edge GET /checkout burns its own budget: 1"
        );
        let evidence = &alert["budgetscope"];
        assert_eq!(evidence["value"], 1.0);
        assert_eq!(evidence["threshold"], 0.5);
        assert_eq!(evidence["requests"], 4);
        assert_eq!(evidence["evidence"]["local_exceed"], 4);
        assert_eq!(
            evidence["hop_url"],
            "http://budgets.example:8080/hops/edge/GET%20%2Fcheckout"
        );
        let examples = evidence["example_traces"].as_array().unwrap();
        assert!(!examples.is_empty() && examples.len() <= 3, "{evidence}");
        let example = examples[0]["trace_id"].as_str().unwrap();
        assert!(
            (1..=4u8).any(|id| example == hex::encode([id; 16])),
            "{example}"
        );
        assert!(
            examples[0]["url"]
                .as_str()
                .unwrap()
                .starts_with("http://budgets.example:8080/traces/"),
            "{evidence}"
        );

        // Seen in the API, with history that says why, and in the pages.
        let (status, instances) = get_json(&server, "/api/alerts").await;
        assert_eq!(status, 200);
        let instances = instances["instances"].as_array().unwrap();
        assert_eq!(
            instances.len(),
            1,
            "{backend}: only the rule with enough requests: {instances:?}"
        );
        assert_eq!(instances[0]["state"], "firing");
        assert_eq!(instances[0]["rule"], "checkout-burning");
        let (_, history) = get_json(&server, "/api/alerts/history?rule=checkout-burning").await;
        let history = history["history"].as_array().unwrap();
        assert!(
            history
                .iter()
                .any(|h| h["state"] == "pending" && h["value"] == 1.0 && h["requests"] == 4),
            "{backend}: {history:?}"
        );
        let page = get_text(&server, "/alerts").await;
        assert!(
            page.contains("checkout-burning") && page.contains("firing"),
            "{page}"
        );
        let page = get_text(&server, "/alerts/rules/checkout-burning").await;
        assert!(
            page.contains("local_exceed_ratio &#62; 0.5 over 1m for 2s"),
            "{page}"
        );
        let (_, rules) = get_json(&server, "/api/alerts/rules").await;
        assert_eq!(rules["rules"][0]["for"], "2s");
        for (path, says) in [
            ("/api/alerts/history?limit=0", "parameter limit"),
            ("/api/alerts/history?since=yesterday", "parameter since"),
            (
                "/api/alerts/notifications?bogus=1",
                "parameter bogus: unknown",
            ),
        ] {
            let (status, body) = get_json(&server, path).await;
            assert_eq!(status, 400, "{path}: {body}");
            assert!(
                body["error"]["message"].as_str().unwrap().contains(says),
                "{path}: {body}"
            );
        }
        let page = get_text(&server, "/alerts/rules/no-such-rule").await;
        assert!(page.contains("No such alert rule"), "{page}");

        // The delivery log shows the retries.
        let (_, log) = get_json(&server, "/api/alerts/notifications").await;
        let delivered = &log["notifications"][0];
        assert_eq!(delivered["outcome"], "delivered", "{log}");
        assert_eq!(delivered["attempts"], 3, "two 500s, then delivered: {log}");
        assert!(
            delivered["last_error"].as_str().unwrap().contains("500"),
            "{log}"
        );

        // Healthy traffic brings the ratio under the threshold: resolved, once.
        for id in 11..=20 {
            post_otlp(&server, &otlp_request(&checkout(id, false), 500)).await;
        }
        let resolved = hook.wait_for("resolved").await;
        let alert = &resolved["alerts"][0];
        assert_eq!(alert["labels"]["alertname"], "checkout-burning");
        assert_ne!(alert["endsAt"], "0001-01-01T00:00:00Z");
        assert_eq!(alert["fingerprint"], firing["alerts"][0]["fingerprint"]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            hook.with_status("firing").len(),
            1,
            "{backend}: one notification per change"
        );
        assert_eq!(
            hook.with_status("resolved").len(),
            1,
            "{backend}: one notification per change"
        );
        assert_eq!(
            hook.posts.load(Ordering::SeqCst),
            4,
            "{backend}: 2 refused + 2 delivered"
        );
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_notifications_survive_a_restart() {
    // A notification queued while its receiver is down is delivered by the next process.
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on this port yet: every attempt fails and the notification waits.
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let hook_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let rules = rules_file(dir.path(), hook_addr);
    let flags = fast_alerts(&rules);
    let server = start(&db, &flags).await;
    for id in 1..=4 {
        post_otlp(&server, &otlp_request(&checkout(id, true), 500)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, log) = get_json(&server, "/api/alerts/notifications").await;
        if log["notifications"][0]["attempts"].as_i64().unwrap_or(0) >= 1 {
            assert_eq!(log["notifications"][0]["outcome"], "pending", "{log}");
            break;
        }
        assert!(Instant::now() < deadline, "no attempt was made: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.shutdown().await;

    // The receiver comes up on that port, and a new process delivers what was queued.
    let listener = tokio::net::TcpListener::bind(hook_addr).await.unwrap();
    let hook = Hook::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(hook.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let server = start(&db, &flags).await;
    let firing = hook.wait_for("firing").await;
    assert_eq!(
        firing["alerts"][0]["labels"]["alertname"],
        "checkout-burning"
    );
    server.shutdown().await;
}

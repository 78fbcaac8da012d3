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
/// It is an Alertmanager too: what is posted to `/api/v2/alerts` goes to `alertmanager`.
#[derive(Clone, Default)]
struct Hook {
    received: Arc<Mutex<Vec<Value>>>,
    alertmanager: Arc<Mutex<Vec<Value>>>,
    fail_first: Arc<AtomicUsize>,
    posts: Arc<AtomicUsize>,
}

impl Hook {
    async fn start(fail_first: usize) -> (Hook, SocketAddr) {
        let hook = Hook::default();
        hook.fail_first.store(fail_first, Ordering::SeqCst);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .route("/api/v2/alerts", axum::routing::post(alertmanager))
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

async fn alertmanager(State(hook): State<Hook>, Json(body): Json<Value>) -> StatusCode {
    hook.alertmanager.lock().unwrap().push(body);
    StatusCode::OK
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
  - name: am
    alertmanager: {{ url: "http://{hook}" }}
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
    receivers: [ops, am]
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

/// A rules file of `rules` (YAML list items) notifying the webhook receiver `ops` at `hook`.
fn ops_rules(dir: &std::path::Path, hook: SocketAddr, rules: &str) -> std::path::PathBuf {
    let path = dir.join("rules.yaml");
    std::fs::write(
        &path,
        format!(
            "receivers:\n  - name: ops\n    webhook: {{ url: \"http://{hook}/hook\" }}\nrules:\n{rules}"
        ),
    )
    .unwrap();
    path
}

/// Alert evaluations the server has run to the end (`/metrics`).
async fn evaluations(server: &budgetscope::server::RunningServer) -> u64 {
    let text = get_text(server, "/metrics").await;
    text.lines()
        .find_map(|line| line.strip_prefix("budgetscope_alert_evaluations_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no evaluation counter in /metrics:\n{text}")) as u64
}

/// Waits until the alerter has run two more evaluations and no notification waits in the
/// outbox: whatever those evaluations were going to send has been sent, so a count of what
/// a receiver got is final (instead of sleeping for a guess of that time).
async fn settled(server: &budgetscope::server::RunningServer) {
    let start = evaluations(server).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while evaluations(server).await < start + 2 {
        assert!(
            Instant::now() < deadline,
            "two more evaluations within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    poll_json(
        server,
        "/api/alerts/notifications?limit=100",
        "nothing pending in the outbox",
        |log| {
            log["notifications"]
                .as_array()
                .is_some_and(|all| all.iter().all(|n| n["outcome"] != "pending"))
        },
    )
    .await;
}

/// Polls `path` (JSON) every 100 ms, up to 30 s, until `done` holds for its body; returns it.
async fn poll_json(
    server: &budgetscope::server::RunningServer,
    path: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = get_json(server, path).await;
        if done(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "{what} within 30 s: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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
fn checkout(id: u8, late: bool) -> Vec<budgetscope::core::model::Span> {
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
        assert!(
            page.contains("<svg class=\"chart\"") && page.contains("local_exceed_ratio over time"),
            "{backend}: the history chart is missing"
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
        // The instance links to the traces that show it.
        let page = get_text(&server, "/alerts/rules/checkout-burning").await;
        let start = page
            .find("href=\"/traces?service=edge")
            .expect("an examples link")
            + 6;
        let href = page[start..start + page[start..].find('"').unwrap()].replace("&#38;", "&");
        assert!(href.contains("flag=local_exceed"), "{href}");
        let traces = get_text(&server, &href).await;
        assert!(
            (1..=4u8).any(|id| traces.contains(&hex::encode([id; 16]))),
            "{backend}: {href} lists none of the traces"
        );

        // The overview and the hop's page show what fires.
        for path in ["/", "/hops/edge/GET%20%2Fcheckout"] {
            let page = get_text(&server, path).await;
            assert!(
                page.contains("Firing alerts") && page.contains("/alerts/rules/checkout-burning"),
                "{backend}: {path} does not show the firing alert:\n{page}"
            );
        }
        let page = get_text(&server, "/hops/edge/GET%20%2Fcheckout").await;
        assert!(
            page.contains("/alerts/rules/new?service=edge&#38;operation=GET%20%2Fcheckout"),
            "{page}"
        );
        let page = get_text(&server, "/alerts/rules/no-such-rule").await;
        assert!(page.contains("No such alert rule"), "{page}");

        // /metrics, read by a Prometheus text parser: the hop's exceeds and the alert.
        let text = get_text(&server, "/metrics").await;
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .unwrap_or_else(|e| panic!("{backend}: /metrics does not parse ({e}):\n{text}"));
        let value = |name: &str, labels: &[(&str, &str)]| {
            scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
                })
                .map(|s| match s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => v,
                    _ => f64::NAN,
                })
                .unwrap_or_else(|| panic!("{backend}: no {name} {labels:?} in\n{text}"))
        };
        let hop = [("service", "edge"), ("operation", "GET /checkout")];
        assert_eq!(value("budgetscope_hop_requests_total", &hop), 4.0);
        assert_eq!(
            value(
                "budgetscope_hop_deadline_exceeded_total",
                &[hop[0], hop[1], ("origin", "local")]
            ),
            4.0
        );
        assert_eq!(
            value(
                "budgetscope_alert_instances",
                &[("alertname", "checkout-burning"), ("state", "firing")]
            ),
            1.0
        );
        assert_eq!(value("budgetscope_spans_stored_total", &[]), 4.0);
        assert_eq!(value("budgetscope_spans_received_total", &[]), 4.0);
        assert!(
            text.contains("budgetscope_ingest_commit_seconds_count 4"),
            "{backend}: one commit latency per request:\n{text}"
        );

        // The delivery log shows the retries, once the server recorded the answer the hook
        // gave (the hook holds the body a moment before the server hears back).
        let to_ops = |log: &Value| {
            log["notifications"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["receiver"] == "ops")
                .cloned()
        };
        let log = poll_json(
            &server,
            "/api/alerts/notifications?rule=checkout-burning&limit=10",
            "the delivery to ops recorded",
            |log| to_ops(log).is_some_and(|n| n["outcome"] == "delivered"),
        )
        .await;
        let delivered = to_ops(&log).unwrap();
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
        settled(&server).await;
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
        // Alertmanager heard of it at the change and again at every evaluation while it
        // fired, and then that it ended.
        let am = hook.alertmanager.lock().unwrap().clone();
        let firing_posts = am
            .iter()
            .filter(|b| b[0]["endsAt"] == "0001-01-01T00:00:00Z")
            .count();
        assert!(firing_posts >= 2, "{backend}: {am:?}");
        let last = am.last().unwrap();
        assert_eq!(last[0]["labels"]["alertname"], "checkout-burning");
        assert_ne!(
            last[0]["endsAt"], "0001-01-01T00:00:00Z",
            "{backend}: {am:?}"
        );
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_notifications_survive_a_restart() {
    // A notification queued while its receiver is down is delivered by the next process.
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    // The receiver's port is held from the start, so no other process can take it: at
    // first every connection is closed unanswered (the receiver is down, each attempt
    // fails and the notification waits), then the same listener serves the receiver.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_addr: SocketAddr = listener.local_addr().unwrap();
    let (up, mut down) = tokio::sync::oneshot::channel::<()>();
    let refusing = tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut down => return listener,
                accepted = listener.accept() => drop(accepted),
            }
        }
    });
    let rules = rules_file(dir.path(), hook_addr);
    let flags = fast_alerts(&rules);
    let server = start(&db, &flags).await;
    for id in 1..=4 {
        post_otlp(&server, &otlp_request(&checkout(id, true), 500)).await;
    }
    let log = poll_json(&server, "/api/alerts/notifications", "an attempt", |log| {
        log["notifications"][0]["attempts"].as_i64().unwrap_or(0) >= 1
    })
    .await;
    assert_eq!(log["notifications"][0]["outcome"], "pending", "{log}");
    server.shutdown().await;

    // The receiver comes up on that port, and a new process delivers what was queued.
    up.send(()).unwrap();
    let listener = refusing.await.unwrap();
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

async fn send(
    server: &budgetscope::server::RunningServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request =
        reqwest::Client::new().request(method, format!("http://{}{}", server.http_addr, path));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let response = request.send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_are_created_changed_and_deleted_through_the_api_and_backtested() {
    use reqwest::Method;
    for db in TestDb::all().await {
        let backend = db.backend;
        let (hook, hook_addr) = Hook::start(0).await;
        let dir = tempfile::tempdir().unwrap();
        let rules = rules_file(dir.path(), hook_addr);
        let server = start(&db, &fast_alerts(&rules)).await;
        // Two bursts of local exceeds, 2 h and 1 h ago, between healthy traffic.
        for (id, late, ago_min) in [
            (1, true, 120),
            (2, true, 120),
            (3, false, 90),
            (4, true, 60),
            (5, false, 30),
        ] {
            post_otlp(
                &server,
                &otlp_request(&checkout(id, late), ago_min * 60_000),
            )
            .await;
        }
        common::wait_until_searchable(&server, "service=edge&since=-3h", &hex::encode([5u8; 16]))
            .await;

        let rule = serde_json::json!({
            "name": "stored-burn", "service": "edge", "signal": "local_exceed_ratio",
            "op": ">", "threshold": 0.5, "window": "5m", "receivers": ["ops"],
        });
        let (status, backtest) = send(
            &server,
            Method::POST,
            "/api/alerts/rules/backtest",
            Some(rule.clone()),
        )
        .await;
        assert_eq!(status, 200, "{backend}: {backtest}");
        let episodes = backtest["episodes"].as_array().unwrap();
        assert_eq!(episodes.len(), 2, "{backend}: one per burst: {backtest}");
        assert_eq!(backtest["hops_selected"], 1);

        let (status, created) = send(
            &server,
            Method::POST,
            "/api/alerts/rules",
            Some(rule.clone()),
        )
        .await;
        assert_eq!(status, 201, "{backend}: {created}");
        assert_eq!(created["source"], "database");
        let (_, listed) = get_json(&server, "/api/alerts/rules").await;
        let names: Vec<&str> = listed["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["checkout-burning", "needs-more-traffic", "stored-burn"],
            "{backend}"
        );

        // Problems name the field; names are unique across the file and the database.
        let mut bad = rule.clone();
        bad["window"] = "5s".into();
        bad["name"] = "other".into();
        let (status, body) = send(&server, Method::POST, "/api/alerts/rules", Some(bad)).await;
        assert_eq!(status, 400);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("field window: must be at least 1m"),
            "{body}"
        );
        let (status, body) = send(
            &server,
            Method::POST,
            "/api/alerts/rules",
            Some(rule.clone()),
        )
        .await;
        assert_eq!(status, 400);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("another rule has this name"),
            "{body}"
        );
        let mut clash = rule.clone();
        clash["name"] = "checkout-burning".into();
        let (status, body) = send(&server, Method::POST, "/api/alerts/rules", Some(clash)).await;
        assert_eq!(status, 400);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("rules file has this name"),
            "{body}"
        );
        let (status, body) = send(
            &server,
            Method::POST,
            "/api/alerts/rules",
            Some(serde_json::json!({"name": "x", "treshold": 1})),
        )
        .await;
        assert_eq!(status, 400);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("treshold"),
            "{body}"
        );

        // Changed, then deleted; rules of the file are read-only.
        let mut changed = rule.clone();
        changed["threshold"] = 0.9.into();
        let (status, body) = send(
            &server,
            Method::PUT,
            "/api/alerts/rules/stored-burn",
            Some(changed),
        )
        .await;
        assert_eq!(
            (status, &body["threshold"]),
            (200, &Value::from(0.9)),
            "{body}"
        );
        for (method, path, body, expected) in [
            (
                Method::PUT,
                "/api/alerts/rules/checkout-burning",
                Some(rule.clone()),
                409,
            ),
            (
                Method::DELETE,
                "/api/alerts/rules/checkout-burning",
                None,
                409,
            ),
            (Method::DELETE, "/api/alerts/rules/stored-burn", None, 204),
            (Method::DELETE, "/api/alerts/rules/stored-burn", None, 404),
        ] {
            let (status, answer) = send(&server, method.clone(), path, body).await;
            assert_eq!(status, expected, "{backend}: {method} {path}: {answer}");
        }

        // A test notification reaches the receiver at once, marked as a test.
        let (status, body) = send(
            &server,
            Method::POST,
            "/api/alerts/rules/checkout-burning/test",
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["deliveries"][0]["delivered"], true, "{body}");
        let test = hook.wait_for("firing").await;
        assert_eq!(test["alerts"][0]["labels"]["test"], "true");
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silence_holds_notifications_back_until_it_ends() {
    use reqwest::Method;
    let db = TestDb::sqlite();
    let (hook, hook_addr) = Hook::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(dir.path(), hook_addr);
    let server = start(&db, &fast_alerts(&rules)).await;
    let silence = serde_json::json!({
        "matchers": ["service=edge", "alertname=~checkout-*"], "duration": "1h",
        "comment": "deploying edge", "created_by": "test",
    });
    let (status, created) =
        send(&server, Method::POST, "/api/alerts/silences", Some(silence)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["status"], "active");
    let (status, body) = send(
        &server,
        Method::POST,
        "/api/alerts/silences",
        Some(serde_json::json!({"matchers": "service", "comment": "x"})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("field matchers"),
        "{body}"
    );

    for id in 1..=4 {
        post_otlp(&server, &otlp_request(&checkout(id, true), 500)).await;
    }
    // It fires, silenced: shown, not sent.
    poll_json(&server, "/api/alerts", "firing", |body| {
        body["instances"][0]["state"] == "firing"
    })
    .await;
    let page = get_text(&server, "/alerts").await;
    assert!(
        page.contains(&format!("silenced by #{}", created["id"])),
        "{page}"
    );
    settled(&server).await;
    assert!(
        hook.received.lock().unwrap().is_empty(),
        "a silenced alert was sent"
    );

    // Expired: the still-firing instance is notified.
    let (status, expired) = send(
        &server,
        Method::DELETE,
        &format!("/api/alerts/silences/{}", created["id"]),
        None,
    )
    .await;
    assert_eq!(
        (status, expired["status"].as_str()),
        (200, Some("expired")),
        "{expired}"
    );
    let firing = hook.wait_for("firing").await;
    assert_eq!(
        firing["alerts"][0]["labels"]["alertname"],
        "checkout-burning"
    );
    server.shutdown().await;
}

fn form_body(pairs: &[(&str, &str)]) -> String {
    use budgetscope::web::pages::enc;
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_save_rules_and_refuse_other_sites() {
    let db = TestDb::sqlite();
    let (_hook, hook_addr) = Hook::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(dir.path(), hook_addr);
    let server = start(&db, &fast_alerts(&rules)).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = |path: &str| format!("http://{}{}", server.http_addr, path);
    let form = [
        ("name", "from-the-form"),
        ("service", "edge"),
        ("operation", ""),
        ("signal", "overspent_ratio"),
        ("op", ">"),
        ("threshold", "0.2"),
        ("window", "10m"),
        ("for", "1m"),
        ("min_requests", "5"),
        ("labels", "team=web"),
        ("receivers", "ops"),
        ("summary", "{{service}} overspends"),
        ("action", "save"),
    ];
    // From another site: refused, by Sec-Fetch-Site or by Origin.
    for (header, value) in [
        ("sec-fetch-site", "cross-site"),
        ("origin", "http://evil.example"),
    ] {
        let response = client
            .post(url("/alerts/rules/new"))
            .header(header, value)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_body(&form))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{header}");
        let response = client
            .post(url("/api/alerts/silences"))
            .header(header, value)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{header} on the API");
    }
    // A field with a problem comes back with the form, the problem next to it.
    let mut wrong = form;
    wrong[5] = ("threshold", "a lot");
    let response = client
        .post(url("/alerts/rules/new"))
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&wrong))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let page = response.text().await.unwrap();
    assert!(page.contains("&#34;a lot&#34; is not a number"), "{page}");
    assert!(
        page.contains("value=\"from-the-form\""),
        "the form keeps what was typed"
    );
    // Backtest without saving.
    let mut backtest = form;
    backtest[12] = ("action", "backtest");
    let response = client
        .post(url("/alerts/rules/new"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&backtest))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("would not have fired in the last 24 hours")
    );
    assert!(
        !get_text(&server, "/alerts").await.contains("from-the-form"),
        "a backtest saves nothing"
    );
    // Saved: a redirect to its page, which shows it.
    let origin = format!("http://{}", server.http_addr);
    let response = client
        .post(url("/alerts/rules/new"))
        .header("origin", &origin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(&form))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(
        response.headers()["location"],
        "/alerts/rules/from-the-form"
    );
    let page = get_text(&server, "/alerts/rules/from-the-form").await;
    assert!(
        page.contains("overspent_ratio &#62; 0.2 over 10m for 1m"),
        "{page}"
    );
    let edit = get_text(&server, "/alerts/rules/from-the-form/edit").await;
    assert!(edit.contains("value=\"team=web\""), "{edit}");
    // Paused, then deleted.
    let response = client
        .post(url("/alerts/rules/from-the-form/pause"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303);
    let (_, listed) = get_json(&server, "/api/alerts/rules").await;
    assert_eq!(listed["rules"][2]["paused"], true, "{listed}");
    let response = client
        .post(url("/alerts/rules/from-the-form/delete"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303);
    let page = get_text(&server, "/alerts/rules/from-the-form").await;
    assert!(page.contains("No such alert rule"));
    // A hostile rule name is text on every page, and its links are encoded.
    let hostile = "<img src=x onerror=alert(1)>";
    let (status, _) = send(
        &server,
        reqwest::Method::POST,
        "/api/alerts/rules",
        Some(serde_json::json!({
            "name": hostile, "signal": "requests", "op": "<", "threshold": 1, "window": "5m",
            "annotations": {"summary": "<script>alert(2)</script>"},
        })),
    )
    .await;
    assert_eq!(status, 201);
    for path in [
        "/alerts",
        "/alerts/rules/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E",
    ] {
        let page = get_text(&server, path).await;
        assert!(
            page.contains("&#60;img src=x onerror=alert(1)&#62;"),
            "{path}: {page}"
        );
        assert!(
            !page.contains(hostile) && !page.contains("<script>alert"),
            "{path}"
        );
    }
    // A file rule has no edit form.
    let response = client
        .get(url("/alerts/rules/checkout-burning/edit"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_that_only_inherits_a_firing_callers_exceeds_is_inhibited() {
    let db = TestDb::sqlite();
    let (hook, hook_addr) = Hook::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let rules = ops_rules(
        dir.path(),
        hook_addr,
        r#"  - { name: edge-burning, service: edge, signal: local_exceed_ratio, op: ">", threshold: 0.5, window: 5m, receivers: [ops] }
  - { name: arrives-spent, service: billing, signal: inherited_exceed_ratio, op: ">", threshold: 0.5, window: 5m, receivers: [ops] }
"#,
    );
    let server = start(&db, &fast_alerts(&rules)).await;
    // edge runs out of budget in its own work, then calls orders with nothing left, which
    // calls billing: billing's caller is orders, but its budget ran out at edge.
    for id in 1..=3u8 {
        let spans = fixture_trace(
            id,
            r#"
edge server "GET /checkout" 0 900 budget=700
  edge client "orders" 750 140 budget=-50
    orders server "POST /orders" 752 130 budget=-52
      orders client "billing" 760 30 budget=-60
        billing server "Charge" 761 28 budget=-61
"#,
        );
        post_otlp(&server, &otlp_request(&spans, 500)).await;
    }
    let firing = hook.wait_for("firing").await;
    assert_eq!(firing["alerts"][0]["labels"]["alertname"], "edge-burning");
    // billing fires too, but its page and the API say why it sent nothing.
    let billing = |body: &Value| {
        body["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["rule"] == "arrives-spent" && i["state"] == "firing")
            .cloned()
    };
    let body = poll_json(&server, "/api/alerts", "billing firing", |b| {
        billing(b).is_some()
    })
    .await;
    assert_eq!(
        billing(&body).unwrap()["spent_by"],
        serde_json::json!(["edge", "GET /checkout"])
    );
    let page = get_text(&server, "/alerts").await;
    assert!(
        page.contains("inhibited by edge-burning on edge GET /checkout"),
        "{page}"
    );
    settled(&server).await;
    let sent: Vec<Value> = hook.with_status("firing");
    assert_eq!(sent.len(), 1, "only edge pages: {sent:?}");
    server.shutdown().await;
}

/// A rule on the deadline metrics fires from the metrics alone (no trace of the hop), its
/// `min_requests` met by the metrics' requests, and the notification carries the metrics'
/// counts as evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_rule_fires_on_the_metrics_with_their_evidence() {
    let (hook, hook_addr) = Hook::start(0).await;
    let dir = tempfile::tempdir().unwrap();
    let rules = ops_rules(
        dir.path(),
        hook_addr,
        "  - { name: metered-burning, service: metered, signal: metric_local_exceed_count, \
         op: \">\", threshold: 10, window: 1m, min_requests: 50, receivers: [ops] }\n",
    );
    let db = TestDb::sqlite();
    let server = start(&db, &fast_alerts(&rules)).await;
    let now = common::now_nanos();
    let point = |attributes: Value, value: Value| {
        let mut point = serde_json::json!({
            "attributes": attributes,
            "startTimeUnixNano": (now - 60_000_000_000).to_string(),
            "timeUnixNano": now.to_string(),
        });
        point
            .as_object_mut()
            .unwrap()
            .extend(value.as_object().unwrap().clone());
        point
    };
    let hop = serde_json::json!({"key": "hop", "value": {"stringValue": "POST /pay"}});
    let local = serde_json::json!({"key": "origin", "value": {"stringValue": "local"}});
    let request = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "metered"}}]},
        "scopeMetrics": [{"metrics": [
            {"name": "deadline.exceeded", "sum": {"aggregationTemporality": 1, "isMonotonic": true,
                "dataPoints": [point(serde_json::json!([hop, local]), serde_json::json!({"asInt": "30"}))]}},
            {"name": "deadline.budget_received", "unit": "ms", "histogram": {"aggregationTemporality": 1,
                "dataPoints": [point(serde_json::json!([hop]), serde_json::json!({"count": "100", "sum": 80000.0}))]}}
        ]}]
    }]});
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/metrics", server.otlp_http_addr))
        .header("content-type", "application/json")
        .body(request.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let firing = hook.wait_for("firing").await;
    let alert = &firing["alerts"][0];
    assert_eq!(alert["labels"]["alertname"], "metered-burning", "{firing}");
    let budgetscope = &alert["budgetscope"];
    assert_eq!(budgetscope["value"], 30.0, "{firing}");
    assert_eq!(
        budgetscope["requests"], 100,
        "the metrics' requests: {firing}"
    );
    assert_eq!(
        budgetscope["evidence"]["metrics"],
        serde_json::json!({
            "requests": 100, "local_exceeds": 30, "inherited_exceeds": 0,
            "budget_received_mean_ms": 800.0,
        }),
        "{firing}"
    );
    assert_eq!(
        budgetscope["evidence"]["requests"], 0,
        "no traces: {firing}"
    );
    server.shutdown().await;
}

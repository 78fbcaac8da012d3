//! Several servers on one Postgres database, as a team runs them behind a load balancer:
//! three real `budgetscope serve` processes, the spans of every trace split across them,
//! the one doing retention and alerts killed mid-stream.

mod common;

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use budgetscope::core::analyze::hops::samples;
use budgetscope::core::analyze::{AnalyzeOptions, analyze};
use common::{TestDb, fixture_trace, otlp_request};
use prost::Message as _;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_budgetscope");

/// One `budgetscope serve` process, killed when dropped.
struct Server {
    child: Child,
    otlp_http: String,
    http: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn spawn(db: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(BIN)
            .args(["serve", "--db", db])
            .args([
                "--otlp-grpc-addr",
                "127.0.0.1:0",
                "--otlp-http-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
            ])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let up = lines
            .by_ref()
            .map_while(Result::ok)
            .find(|line| {
                log.lock().unwrap().push(line.clone());
                line.contains("budgetscope is up")
            })
            .unwrap_or_else(|| panic!("the server did not start: {:?}", log.lock().unwrap()));
        // "… OTLP HTTP http://ADDR/v1/traces, UI and API http://ADDR/"
        let addr_after = |label: &str| {
            let rest = &up[up.find(label).unwrap() + label.len()..];
            rest[..rest.find('/').unwrap()].to_string()
        };
        let (otlp_http, http) = (
            addr_after("OTLP HTTP http://"),
            addr_after("UI and API http://"),
        );
        // Keep reading, so the pipe never fills and the log is there to show.
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                kept.lock().unwrap().push(line);
            }
        });
        Server {
            child,
            otlp_http,
            http,
            log,
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    async fn get(&self, path: &str) -> Value {
        let text = reqwest::get(format!("http://{}{path}", self.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A webhook receiver that records every body it is sent.
async fn webhook() -> (Arc<Mutex<Vec<Value>>>, std::net::SocketAddr) {
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let kept = kept.clone();
            async move { kept.lock().unwrap().push(body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (received, addr)
}

/// Polls `probe` every 200 ms until `done` says yes, for up to `limit`; then panics with
/// `what` and the last value.
async fn eventually<T: std::fmt::Debug, F: std::future::Future<Output = T>>(
    what: &str,
    limit: Duration,
    mut probe: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let value = probe().await;
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {limit:?}: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Edge runs out of its budget, then calls orders, which calls billing: five spans over
/// three services, a local exceed at edge.
const CHECKOUT: &str = r#"
edge server "GET /checkout" 0 900 budget=700
  edge client "orders" 750 140 budget=-50
    orders server "POST /orders" 752 130 budget=-52
      orders client "billing" 760 30 budget=-60
        billing server "Charge" 761 28 budget=-61
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_on_one_postgres_count_every_trace_once_and_alert_once() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let (received, hook) = webhook().await;
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        format!(
            r#"
receivers:
  - name: ops
    webhook: {{ url: "http://{hook}/hook" }}
rules:
  - {{ name: edge-burning, service: edge, signal: local_exceed_ratio, op: ">", threshold: 0.5, window: 5m, receivers: [ops] }}
"#
        ),
    )
    .unwrap();
    let flags = [
        "--quiet-period",
        "1s",
        "--rules",
        rules.to_str().unwrap(),
        "--alert-interval",
        "1s",
        "--alert-delay",
        "0s",
    ];
    let mut servers: Vec<Server> = (0..3).map(|_| Server::spawn(&db.url, &flags)).collect();
    // The server holding the lease on retention and alerts is the one killed.
    let holder = db.texts("SELECT holder FROM leases").await;
    assert_eq!(holder.len(), 1, "one lease, one holder: {holder:?}");
    let doomed = servers
        .iter()
        .position(|s| holder[0].starts_with(&format!("{} ", s.http)))
        .unwrap_or_else(|| panic!("the holder {holder:?} is one of the servers"));

    let traces: Vec<Vec<budgetscope::core::model::Span>> =
        (1..=60u8).map(|id| fixture_trace(id, CHECKOUT)).collect();
    let client = reqwest::Client::new();
    let mut alive = [true; 3];
    let mut acknowledged = 0usize;
    for (n, trace) in traces.iter().enumerate() {
        if n == 20 {
            servers[doomed].kill();
            alive[doomed] = false;
        }
        // Each span to its own server, as services behind a load balancer would send
        // them; a dead server's share goes to the next live one.
        let request = otlp_request(trace, 2_000);
        for (i, resource_spans) in request.resource_spans.iter().enumerate() {
            for (j, scope) in resource_spans.scope_spans.iter().enumerate() {
                for span in &scope.spans {
                    let mut target = (n + i + j + span.span_id[0] as usize) % 3;
                    while !alive[target] {
                        target = (target + 1) % 3;
                    }
                    let mut one = request.clone();
                    one.resource_spans = vec![resource_spans.clone()];
                    one.resource_spans[0].scope_spans = vec![scope.clone()];
                    one.resource_spans[0].scope_spans[0].spans = vec![span.clone()];
                    let response = client
                        .post(format!("http://{}/v1/traces", servers[target].otlp_http))
                        .header("content-type", "application/x-protobuf")
                        .body(one.encode_to_vec())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 200);
                    acknowledged += 1;
                }
            }
        }
    }
    let spans_sent: usize = traces.iter().map(Vec::len).sum();
    assert_eq!(acknowledged, spans_sent);

    // Every acknowledged span is stored once, and every trace summarised once.
    let count = |sql: &'static str| {
        let db = &db;
        move || async move { db.texts(sql).await[0].parse::<usize>().unwrap() }
    };
    eventually(
        "every trace summarised",
        Duration::from_secs(120),
        count("SELECT count(*)::text FROM trace_summaries"),
        |n| *n == traces.len(),
    )
    .await;
    eventually(
        "no trace waiting",
        Duration::from_secs(60),
        count("SELECT count(*)::text FROM dirty_traces"),
        |n| *n == 0,
    )
    .await;
    assert_eq!(
        count(
            "SELECT ((SELECT count(*) FROM spans) \
             + (SELECT coalesce(sum(span_count), 0) FROM trace_blocks))::text"
        )()
        .await,
        spans_sent
    );
    let span_counts = db
        .texts("SELECT span_count::text FROM trace_summaries")
        .await;
    assert!(
        span_counts.iter().all(|n| n == "5"),
        "every summary is of the whole trace: {span_counts:?}"
    );

    // The hop counts are each trace's, once.
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for trace in &traces {
        for sample in samples(trace, &analyze(trace, &AnalyzeOptions::default())) {
            *expected
                .entry(format!("{} {}", sample.service, sample.operation))
                .or_default() += 1;
        }
    }
    let stored: BTreeMap<String, i64> = db
        .texts(
            "SELECT service || ' ' || operation || '=' || sum(requests)::text \
             FROM hop_rollups GROUP BY service, operation",
        )
        .await
        .into_iter()
        .map(|row| {
            let (hop, n) = row.rsplit_once('=').unwrap();
            (hop.to_string(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(stored, expected, "hop rollups");

    // The survivors answer the same, and one of them took over the alerts: one
    // notification for the one state change, however many servers evaluate.
    let mut answers = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        if alive[i] {
            let body = server.get("/api/traces?service=edge&limit=100").await;
            let mut ids: Vec<String> = body["traces"]
                .as_array()
                .unwrap_or_else(|| panic!("{body}"))
                .iter()
                .map(|t| t["trace_id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            answers.push(ids);
        }
    }
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0].len(), traces.len());
    assert_eq!(answers[0], answers[1], "every server answers the same");
    let firing = || {
        let received = received.clone();
        async move {
            received
                .lock()
                .unwrap()
                .iter()
                .filter(|b| b["status"] == "firing")
                .count()
        }
    };
    let logs = || {
        servers
            .iter()
            .map(|s| s.log.lock().unwrap().join("\n"))
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let fired = eventually(
        "a firing notification",
        Duration::from_secs(60),
        firing,
        |n| *n > 0,
    )
    .await;
    // Through two more alert intervals and a lease term: still the one, checked as it goes.
    let window = Instant::now() + budgetscope::pipeline::lease::TERM + Duration::from_secs(2);
    while Instant::now() < window {
        assert_eq!(
            (fired, firing().await),
            (1, 1),
            "one notification per state change; logs:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut holders = 0;
    for (i, server) in servers.iter().enumerate() {
        if alive[i] && server.get("/api/status").await["holds_lease"] == true {
            holders += 1;
        }
    }
    assert_eq!(holders, 1, "one survivor took over; logs:\n{}", logs());
}

//! The deadline metrics over OTLP: the real OpenTelemetry Rust SDK's metrics exporter (gRPC,
//! HTTP/protobuf, HTTP/JSON; delta and cumulative) → a real server → `/api/hops` and the
//! hop page, on both stores; backtests of the `metric_*` alert signals; and bad input.

mod common;

use common::{TestDb, get_json, get_text, start};
use opentelemetry::KeyValue;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{SdkMeterProvider, Temporality};

#[derive(Debug, Clone, Copy)]
enum Transport {
    Grpc,
    HttpProto,
    HttpJson,
}

const HOP: &str = "POST /pay";

/// Records the deadline metrics of `service`'s `POST /pay` in two exports (and a third on
/// shutdown that adds nothing): 5 local and 4 inherited exceeds, budgets received 800 and
/// 400 ms, 100 ms left once. Runs on a blocking thread (the SDK's flushes block).
fn export_metrics(
    service: &'static str,
    transport: Transport,
    temporality: Temporality,
    endpoint: String,
    runtime: tokio::runtime::Handle,
) {
    let _entered = runtime.enter();
    let exporter = match transport {
        Transport::Grpc => opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_temporality(temporality)
            .build(),
        Transport::HttpProto | Transport::HttpJson => opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_endpoint(format!("{endpoint}/v1/metrics"))
            .with_protocol(if matches!(transport, Transport::HttpJson) {
                Protocol::HttpJson
            } else {
                Protocol::HttpBinary
            })
            .with_temporality(temporality)
            .build(),
    }
    .expect("exporter builds");
    let provider = SdkMeterProvider::builder()
        .with_periodic_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    let meter = provider.meter("budgetscope-tests");
    let exceeded = meter.u64_counter("deadline.exceeded").build();
    let received = meter
        .f64_histogram("deadline.budget_received")
        .with_unit("ms")
        .build();
    let remaining = meter
        .f64_histogram("deadline.budget_remaining")
        .with_unit("ms")
        .build();
    // A metric of another kind, which the server ignores.
    let other = meter.u64_counter("http.server.requests").build();
    let local = [KeyValue::new("hop", HOP), KeyValue::new("origin", "local")];
    let inherited = [
        KeyValue::new("hop", HOP),
        KeyValue::new("origin", "inherited"),
    ];
    exceeded.add(3, &local);
    received.record(800.0, &[KeyValue::new("hop", HOP)]);
    other.add(7, &[]);
    provider.force_flush().expect("first export");
    exceeded.add(2, &local);
    exceeded.add(4, &inherited);
    received.record(400.0, &[KeyValue::new("hop", HOP)]);
    remaining.record(100.0, &[KeyValue::new("hop", HOP)]);
    provider.force_flush().expect("second export");
    provider.shutdown().expect("exporter flushes on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_exporters_deliver_the_deadline_metrics_to_the_hop_page() {
    for db in TestDb::all().await {
        // One service per transport: the database is shared by the loop's servers.
        for (service, transport, temporality) in [
            ("billing-grpc", Transport::Grpc, Temporality::Cumulative),
            ("billing-proto", Transport::HttpProto, Temporality::Delta),
            ("billing-json", Transport::HttpJson, Temporality::Cumulative),
        ] {
            let context = format!("{transport:?} {temporality:?} on {}", db.backend);
            let server = start(&db, &[]).await;
            let endpoint = match transport {
                Transport::Grpc => format!("http://{}", server.otlp_grpc_addr),
                _ => format!("http://{}", server.otlp_http_addr),
            };
            let handle = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                export_metrics(service, transport, temporality, endpoint, handle)
            })
            .await
            .unwrap();

            let (status, hops) = get_json(&server, &format!("/api/hops?service={service}")).await;
            assert_eq!(status, 200, "{context}: {hops}");
            let hop = hops["hops"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| h["operation"] == HOP)
                .unwrap_or_else(|| panic!("{context}: no hop in {hops}"));
            let metrics = &hop["metrics"];
            assert_eq!(metrics["local_exceeds"], 5, "{context}: {hop}");
            assert_eq!(metrics["inherited_exceeds"], 4, "{context}: {hop}");
            assert_eq!(metrics["requests"], 2, "{context}: {hop}");
            assert_eq!(
                metrics["budget_received_mean_ms"], 600.0,
                "{context}: {hop}"
            );
            assert_eq!(
                metrics["budget_remaining_mean_ms"], 100.0,
                "{context}: {hop}"
            );
            assert_eq!(hop["requests"], 0, "{context}: no traces were sent");

            let page = get_text(&server, &format!("/hops/{service}/POST%20%2Fpay")).await;
            assert!(
                page.contains(
                    "metrics (every request, as the service saw it): 5 local exceeds, 4 inherited, \
                     2 requests; traces (sampled, analysed): 0 local exceeds"
                ),
                "{context}: {page}"
            );
            assert!(
                page.contains("Deadline exceeded per interval from the deadline metrics"),
                "{context}: the metrics' chart"
            );
            // The series' buckets hold the metrics of their minutes, adding up to the totals.
            let (status, series) = get_json(
                &server,
                &format!("/api/hops/{service}/POST%20%2Fpay/series?since=-10m&step=1m"),
            )
            .await;
            assert_eq!(status, 200, "{context}: {series}");
            let points = series["points"].as_array().unwrap();
            let sum = |key: &str| -> i64 {
                points
                    .iter()
                    .map(|p| p["metrics"][key].as_i64().unwrap())
                    .sum()
            };
            assert_eq!(
                (
                    sum("local_exceeds"),
                    sum("inherited_exceeds"),
                    sum("requests")
                ),
                (5, 4, 2),
                "{context}: {series}"
            );
            let overview = get_text(&server, "/").await;
            assert!(
                overview.contains("as the service saw it): 5 local exceeds"),
                "{context}"
            );
            let exposition = get_text(&server, "/metrics").await;
            assert!(
                exposition.contains("budgetscope_deadline_metric_points_stored_total"),
                "{context}"
            );
            server.shutdown().await;
        }
    }
}

async fn post(
    server: &budgetscope::server::RunningServer,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, String) {
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/metrics", server.otlp_http_addr))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("POST /v1/metrics");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

fn json_point(hop: Option<&str>, origin: &str, value: u64) -> serde_json::Value {
    let mut attributes =
        vec![serde_json::json!({"key": "origin", "value": {"stringValue": origin}})];
    if let Some(hop) = hop {
        attributes.push(serde_json::json!({"key": "hop", "value": {"stringValue": hop}}));
    }
    serde_json::json!({
        "attributes": attributes,
        "startTimeUnixNano": "1",
        "timeUnixNano": common::now_nanos().to_string(),
        "asInt": value.to_string(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_metrics_are_refused_or_left_out_without_losing_good_points() {
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;

    let (status, body) = post(
        &server,
        "application/x-protobuf",
        b"\xff\xff\xff garbage".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(
        &server,
        "application/json",
        b"{\"resourceMetrics\": 7}".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("not valid OTLP/JSON for metrics"), "{body}");
    let (status, body) = post(&server, "text/plain", b"hello".to_vec()).await;
    assert_eq!(status, 415, "{body}");

    // Other metrics only: accepted, nothing said, nothing stored.
    let other = serde_json::json!({"resourceMetrics": [{"scopeMetrics": [{"metrics": [
        {"name": "process.cpu.time", "gauge": {"dataPoints": [{"asDouble": 1.5, "timeUnixNano": "5"}]}}
    ]}]}]});
    let (status, body) = post(&server, "application/json", other.to_string().into_bytes()).await;
    assert_eq!((status, body.as_str()), (200, "{}"));

    // A point without a hop beside a good one: the good one is stored, the bad one counted.
    let mixed = serde_json::json!({"resourceMetrics": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
        "scopeMetrics": [{"metrics": [{"name": "deadline.exceeded", "sum": {
            "aggregationTemporality": 1, "isMonotonic": true,
            "dataPoints": [json_point(None, "local", 2), json_point(Some("GET /<script>"), "local", 3)]
        }}]}]
    }]});
    let (status, body) = post(&server, "application/json", mixed.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["partialSuccess"]["rejectedDataPoints"], 1, "{body}");
    assert!(
        answer["partialSuccess"]["errorMessage"]
            .as_str()
            .unwrap()
            .contains("need a `hop` attribute"),
        "{body}"
    );
    let (_, hops) = get_json(&server, "/api/hops?service=api").await;
    assert_eq!(hops["hops"][0]["operation"], "GET /<script>", "{hops}");
    assert_eq!(hops["hops"][0]["metrics"]["local_exceeds"], 3, "{hops}");
    // The hop's name is text on the page, never markup.
    let page = get_text(&server, "/").await;
    assert!(
        page.contains("GET /&#60;script&#62;") && !page.contains("GET /<script>"),
        "{page}"
    );
    server.shutdown().await;
}

/// A backtest of a `metric_*` rule reads the stored metrics minute by minute: two bursts of
/// local exceeds reported 2 h and 1 h ago (delta points, no traces at all) are two
/// episodes, and the quiet minutes between them resolve the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_signals_are_backtested_over_the_stored_minutes() {
    const MINUTE: u64 = 60_000_000_000;
    for db in TestDb::all().await {
        let backend = db.backend;
        let server = start(&db, &[]).await;
        let now = common::now_nanos();
        let point = |ago_min: u64, origin: &str, count: u64| {
            let time = now - ago_min * MINUTE;
            serde_json::json!({
                "attributes": [
                    {"key": "hop", "value": {"stringValue": HOP}},
                    {"key": "origin", "value": {"stringValue": origin}},
                ],
                "startTimeUnixNano": (time - MINUTE).to_string(),
                "timeUnixNano": time.to_string(),
                "asInt": count.to_string(),
            })
        };
        let points = vec![
            point(121, "local", 30),
            point(120, "local", 25),
            point(90, "local", 1),
            point(90, "inherited", 40),
            point(60, "local", 50),
        ];
        let request = serde_json::json!({"resourceMetrics": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "metered"}}]},
            "scopeMetrics": [{"metrics": [{"name": "deadline.exceeded", "sum": {
                "aggregationTemporality": 1, "isMonotonic": true, "dataPoints": points
            }}]}]
        }]});
        let (status, body) = post(
            &server,
            "application/json",
            request.to_string().into_bytes(),
        )
        .await;
        assert_eq!((status, body.as_str()), (200, "{}"), "{backend}");

        let rule = serde_json::json!({
            "service": "metered", "signal": "metric_local_exceed_count",
            "op": ">", "threshold": 10, "window": "5m",
        });
        let response = reqwest::Client::new()
            .post(format!(
                "http://{}/api/alerts/rules/backtest",
                server.http_addr
            ))
            .header("content-type", "application/json")
            .body(rule.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{backend}");
        let backtest: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(backtest["hops_selected"], 1, "{backend}: {backtest}");
        let episodes = backtest["episodes"].as_array().unwrap();
        assert_eq!(episodes.len(), 2, "{backend}: one per burst: {backtest}");
        let minute_of = |ago_min: u64| {
            let time = now - ago_min * MINUTE;
            time - time % MINUTE
        };
        for (episode, burst) in episodes.iter().zip([121, 60]) {
            assert_eq!(episode["operation"], HOP, "{backend}: {backtest}");
            // Fires at the end of the burst's first minute, once it is in the window.
            assert_eq!(
                episode["fired_at"],
                minute_of(burst) + MINUTE,
                "{backend}: {backtest}"
            );
        }
        // Both minutes of the first burst are in the window at its worst.
        assert_eq!(episodes[0]["worst_value"], 55.0, "{backend}: {backtest}");
        assert_eq!(
            episodes[0]["resolved_at"],
            minute_of(120) + 6 * MINUTE,
            "{backend}: the window passes the burst: {backtest}"
        );
        server.shutdown().await;
    }
}

/// Text that is not UTF-8 (an exporter that copies bytes into a hop name) loses no point:
/// over OTLP/HTTP protobuf and JSON the bad bytes become U+FFFD, the points beside them are
/// stored, and the answer says what was repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_with_text_that_is_not_utf8_keep_their_points() {
    use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
    use prost::Message as _;
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    // Two points of one counter: hops "GET /good" and "GET /b?d", the '?' made 0xff below.
    let counter = |service: &str| {
        serde_json::json!({"resourceMetrics": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
            "scopeMetrics": [{"metrics": [{"name": "deadline.exceeded", "sum": {
                "aggregationTemporality": 1, "isMonotonic": true,
                "dataPoints": [json_point(Some("GET /good"), "local", 3), json_point(Some("GET /b?d"), "local", 2)]
            }}]}]
        }]})
    };
    let broken = |mut body: Vec<u8>| {
        let at = body.windows(8).position(|w| w == b"GET /b?d").unwrap() + 6;
        body[at] = 0xff;
        body
    };
    let proto: ExportMetricsServiceRequest = serde_json::from_value(counter("utf8-proto")).unwrap();
    let bodies = [
        (
            "utf8-proto",
            "application/x-protobuf",
            broken(proto.encode_to_vec()),
        ),
        (
            "utf8-json",
            "application/json",
            broken(counter("utf8-json").to_string().into_bytes()),
        ),
    ];
    for (service, content_type, body) in bodies {
        let (status, answer) = post(&server, content_type, body).await;
        assert_eq!(status, 200, "{content_type}: {answer}");
        if content_type == "application/json" {
            let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
            assert_eq!(
                answer["partialSuccess"]["rejectedDataPoints"], 0,
                "{answer}"
            );
        }
        // In the protobuf answer, the message is the partial success's only field.
        assert!(
            answer.contains("not valid UTF-8"),
            "{content_type}: {answer}"
        );
        let (_, hops) = get_json(&server, &format!("/api/hops?service={service}")).await;
        let local = |operation: &str| {
            hops["hops"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| h["operation"] == operation)
                .map(|h| h["metrics"]["local_exceeds"].clone())
        };
        assert_eq!(local("GET /good"), Some(3.into()), "{content_type}: {hops}");
        assert_eq!(
            local("GET /b\u{fffd}d"),
            Some(2.into()),
            "{content_type}: {hops}"
        );
    }
    server.shutdown().await;
}

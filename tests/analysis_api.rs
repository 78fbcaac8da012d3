//! The analysis through the API: `GET /api/traces/{id}` carries it, for spans sent by a
//! real exporter and by a fixture, on both stores.

mod common;

use common::{TestDb, get_json, start};
use opentelemetry::trace::{SpanKind, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};

/// The edge service with a 1 s budget calls billing with a fresh 5 s timeout.
fn export_inflated_trace(endpoint: String) -> String {
    let edge = common::otel_provider(&endpoint, "edge");
    let billing = common::otel_provider(&endpoint, "billing");
    let tracer = edge.tracer("test");
    let hop = tracer
        .span_builder("GET /checkout")
        .with_kind(SpanKind::Server)
        .with_attributes([KeyValue::new("deadline.remaining_ms", 1000_i64)])
        .start(&tracer);
    let cx = Context::current_with_span(hop);
    let call = tracer
        .span_builder("POST /charge")
        .with_kind(SpanKind::Client)
        .with_attributes([KeyValue::new("deadline.remaining_ms", 5000_i64)])
        .start_with_context(&tracer, &cx);
    let call_cx = cx.with_span(call);
    let billing_tracer = billing.tracer("test");
    let served = billing_tracer
        .span_builder("POST /charge")
        .with_kind(SpanKind::Server)
        .with_attributes([KeyValue::new("deadline.remaining_ms", 5000_i64)])
        .start_with_context(&billing_tracer, &call_cx);
    drop(served);
    call_cx.span().end();
    let trace_id = cx.span().span_context().trace_id().to_string();
    cx.span().end();
    billing.shutdown().unwrap();
    edge.shutdown().unwrap();
    trace_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_exporters_inflated_call_is_flagged_in_the_api() {
    for db in TestDb::all().await {
        let server = start(&db, &[]).await;
        let endpoint = format!("http://{}", server.otlp_http_addr);
        let trace_id = tokio::task::spawn_blocking(move || export_inflated_trace(endpoint))
            .await
            .unwrap();
        let (status, trace) = get_json(&server, &format!("/api/traces/{trace_id}")).await;
        assert_eq!(status, 200, "{trace}");
        let analysis = &trace["analysis"];
        assert_eq!(analysis["budget_ms"], 1000.0, "{}", db.backend);
        assert_eq!(analysis["tolerance_ms"], 50.0);
        let rows = analysis["rows"].as_array().unwrap();
        let roles: Vec<&str> = rows.iter().map(|r| r["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles,
            ["hop", "call", "hop"],
            "{}: waterfall order",
            db.backend
        );
        assert_eq!(rows[1]["flags"][0]["flag"], "inflated", "{}", db.backend);
        assert!(
            rows[1]["flags"][0]["message"]
                .as_str()
                .unwrap()
                .starts_with("forwarded 5000 ms with"),
            "{}",
            rows[1]["flags"][0]["message"]
        );
        assert_eq!(
            analysis["calls_reaching"],
            serde_json::json!({"billing": 1, "edge": 1})
        );
        assert_eq!(rows[0]["depth"], 0);
        assert_eq!(rows[2]["depth"], 2);
        assert_eq!(rows[2]["budget_source"], "deadline.remaining_ms");
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tolerance_setting_reaches_the_analysis() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--tolerance-ms", "1000"]).await;
    let body = common::fixture_json_a_minute_ago("inflated_checkout.otlp.json");
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", server.otlp_http_addr))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (_, trace) = get_json(&server, "/api/traces/5b8efff798038103d269b633813fc60c").await;
    // With τ = 1 s, forwarding 5000 ms with 780 left is still inflated; 740 ms late is not.
    assert_eq!(trace["analysis"]["tolerance_ms"], 1000.0);
    assert_eq!(
        trace["analysis"]["flag_counts"],
        serde_json::json!({"inflated": 1})
    );
    assert_eq!(trace["analysis"]["outcome"], "ok");
    server.shutdown().await;
}

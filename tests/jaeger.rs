//! The Jaeger-compatible query API (`/jaeger/api/…`) through the real server on both
//! stores, checked against the fields Grafana's Jaeger data source reads: `data[].traceID`,
//! `spans[]` with `spanID`, `traceID`, `operationName`, `startTime`/`duration` in
//! microseconds, `references` (`CHILD_OF` makes the parent), `tags` and `logs` arrays,
//! `processID` naming an entry of `processes` with its `serviceName`.

mod common;

use common::{TestDb, get_json, otlp_request, post_otlp, start, wait_until_searchable};
use serde_json::Value;

const INFLATED: &str = r#"
edge server "POST /orders" 0 1540 budget=800 method=POST http-status=504 attr:customer=<script>alert(1)</script>
  edge client "billing" 20 1500 budget=5000
    billing server "Charge" 25 1490 budget=5000 error=error
"#;

/// Checks one trace the way Grafana reads it; returns its spans by operation name.
fn grafana_reads(trace: &Value) -> std::collections::BTreeMap<String, Value> {
    let trace_id = trace["traceID"].as_str().expect("traceID");
    let processes = trace["processes"].as_object().expect("processes");
    let spans = trace["spans"].as_array().expect("spans");
    let ids: Vec<&str> = spans
        .iter()
        .map(|s| s["spanID"].as_str().unwrap())
        .collect();
    let mut roots = 0;
    let mut by_name = std::collections::BTreeMap::new();
    for span in spans {
        assert_eq!(span["traceID"], trace_id);
        assert_eq!(span["spanID"].as_str().unwrap().len(), 16);
        assert!(
            span["startTime"].as_u64().unwrap() > 1_000_000_000_000_000,
            "µs"
        );
        assert!(span["duration"].is_u64());
        assert!(span["logs"].is_array() && span["tags"].is_array());
        for tag in span["tags"].as_array().unwrap() {
            assert!(tag["key"].is_string() && tag["type"].is_string(), "{tag}");
        }
        let process = &processes[span["processID"].as_str().unwrap()];
        assert!(process["serviceName"].is_string() && process["tags"].is_array());
        let parents: Vec<&Value> = span["references"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["refType"] == "CHILD_OF")
            .collect();
        match parents.as_slice() {
            [] => roots += 1,
            [parent] => assert!(ids.contains(&parent["spanID"].as_str().unwrap())),
            _ => panic!("two parents: {span}"),
        }
        by_name.insert(
            span["operationName"].as_str().unwrap().to_string(),
            span.clone(),
        );
    }
    assert_eq!(roots, 1, "one root span makes the trace name");
    by_name
}

fn tag<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["tags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["key"] == key)
        .map(|t| &t["value"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_can_browse_budgetscope_as_jaeger() {
    for db in TestDb::all().await {
        let server = start(
            &db,
            &[
                "--quiet-period",
                "100ms",
                "--external-url",
                "https://budgets.example.com",
            ],
        )
        .await;
        let spans = common::fixture_trace(9, INFLATED);
        let trace_id = spans[0].trace_id.to_string();
        post_otlp(&server, &otlp_request(&spans, 5_000)).await;
        wait_until_searchable(&server, "service=edge", &trace_id).await;
        let context = db.backend;

        let (status, services) = get_json(&server, "/jaeger/api/services").await;
        assert_eq!(status, 200, "{context}: {services}");
        assert_eq!(services["data"], serde_json::json!(["billing", "edge"]));
        assert_eq!(services["errors"], Value::Null);
        let (_, operations) = get_json(&server, "/jaeger/api/services/edge/operations").await;
        assert_eq!(
            operations["data"],
            serde_json::json!(["POST /orders", "billing"]),
            "{context}"
        );
        let (_, servers) = get_json(
            &server,
            "/jaeger/api/operations?service=edge&spanKind=server",
        )
        .await;
        assert_eq!(
            servers["data"],
            serde_json::json!([{"name": "POST /orders", "spanKind": "server"}])
        );

        // Search as Grafana asks: its time range in microseconds, durations, tags.
        let now_us = common::now_nanos() / 1_000;
        let search = format!(
            "/jaeger/api/traces?service=edge&operation=POST%20%2Forders&minDuration=1.5s\
             &tags=%7B%22http.request.method%22%3A%22POST%22%7D&start={}&end={now_us}\
             &lookback=custom&limit=20",
            now_us - 3_600_000_000
        );
        let (status, found) = get_json(&server, &search).await;
        assert_eq!(status, 200, "{context}: {found}");
        let traces = found["data"].as_array().unwrap();
        assert_eq!(traces.len(), 1, "{context}: {found}");
        assert_eq!(traces[0]["traceID"], trace_id.as_str());
        grafana_reads(&traces[0]);
        for miss in [
            "minDuration=2s",
            "tags=%7B%22http.request.method%22%3A%22GET%22%7D",
        ] {
            let (_, none) =
                get_json(&server, &format!("/jaeger/api/traces?service=edge&{miss}")).await;
            assert_eq!(none["data"], serde_json::json!([]), "{context}: {miss}");
        }

        // One trace by id: the budget travels along as tags and warnings.
        let (status, one) = get_json(&server, &format!("/jaeger/api/traces/{trace_id}")).await;
        assert_eq!(status, 200, "{context}: {one}");
        let by_name = grafana_reads(&one["data"][0]);
        let root = &by_name["POST /orders"];
        assert_eq!(
            tag(root, "budgetscope.waterfall").unwrap(),
            &Value::String(format!("https://budgets.example.com/traces/{trace_id}"))
        );
        assert_eq!(tag(root, "span.kind").unwrap(), "server");
        assert_eq!(tag(root, "budgetscope.budget_ms").unwrap(), 800.0);
        assert_eq!(
            tag(root, "customer").unwrap(),
            "<script>alert(1)</script>",
            "a JSON string: Grafana escapes it"
        );
        let call = &by_name["billing"];
        assert!(
            tag(call, "budgetscope.flags")
                .unwrap()
                .as_str()
                .unwrap()
                .contains("inflated"),
            "{call}"
        );
        assert!(
            call["warnings"][0]
                .as_str()
                .unwrap()
                .starts_with("inflated: "),
            "{call}"
        );
        let charge = &by_name["Charge"];
        assert_eq!(tag(charge, "error").unwrap(), true);
        assert_eq!(tag(charge, "otel.status_code").unwrap(), "ERROR");
        let process = &one["data"][0]["processes"][charge["processID"].as_str().unwrap()];
        assert_eq!(process["serviceName"], "billing");

        // Errors in Jaeger's envelope.
        for (path, status, says) in [
            ("/jaeger/api/traces", 400, "'service' is required"),
            (
                "/jaeger/api/traces?service=edge&minDuration=soon",
                400,
                "'minDuration'",
            ),
            (
                "/jaeger/api/traces?service=edge&tags=%7Bbroken",
                400,
                "'tags'",
            ),
            ("/jaeger/api/traces/not-hex", 400, "32 hex digits"),
            (
                "/jaeger/api/traces/0123456789abcdef0123456789abcdef",
                404,
                "trace not found",
            ),
            ("/jaeger/api/operations", 400, "'service' is required"),
        ] {
            let (got, body) = get_json(&server, path).await;
            assert_eq!(got, status, "{context}: {path}: {body}");
            assert_eq!(body["data"], Value::Null, "{path}");
            assert_eq!(body["errors"][0]["code"], status, "{path}");
            assert!(
                body["errors"][0]["msg"].as_str().unwrap().contains(says),
                "{path}: {body}"
            );
        }
        server.shutdown().await;
    }
}

//! docs/instrument.md's Python and Rust snippets, run as the guide shows them: two services
//! (checkout → inventory) with real OpenTelemetry SDKs export to a real server, which reads
//! the budgets they record (and, from Python, the deadline metrics). The guide must hold
//! each snippet verbatim.

mod common;

#[path = "../docs/snippets/budget_layer.rs"]
#[allow(dead_code)]
mod budget_layer;

use std::process::Command;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Extension;
use axum::http::StatusCode;
use axum::routing::post;
use budget_layer::{BudgetError, BudgetLayer, Deadline, post_with_budget};
use common::{TestDb, get_json, start};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_guide_holds_each_tested_snippet_verbatim() {
    let guide = std::fs::read_to_string(format!("{ROOT}/docs/instrument.md")).unwrap();
    for snippet in ["budget.py", "budget_layer.rs"] {
        let text = std::fs::read_to_string(format!("{ROOT}/docs/snippets/{snippet}")).unwrap();
        assert!(
            guide.contains(text.trim_end()),
            "docs/instrument.md must show docs/snippets/{snippet} as it is"
        );
    }
}

/// The analysed trace of `service` whose edge received `budget_ms`, waiting for analysis.
async fn trace_with_budget(
    server: &budgetscope::server::RunningServer,
    service: &str,
    budget_ms: f64,
) -> Value {
    let started = Instant::now();
    loop {
        let (_, found) = get_json(server, &format!("/api/traces?service={service}")).await;
        let id = found["traces"].as_array().and_then(|traces| {
            traces
                .iter()
                .find(|t| t["budget_ms"] == budget_ms)
                .map(|t| t["trace_id"].as_str().unwrap().to_string())
        });
        if let Some(id) = id {
            return get_json(server, &format!("/api/traces/{id}")).await.1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no analysed trace of {service} with budget {budget_ms}: {found}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The guide's promise for the 800 ms request: checkout received 800, forwarded what was
/// left minus the reserve, inventory received exactly that, and nothing is flagged.
fn check_budgets(trace: &Value, checkout: &str, inventory: &str) {
    let spans = trace["spans"].as_array().unwrap();
    let find = |service: &str, kind: &str| {
        spans
            .iter()
            .find(|s| s["service"] == service && s["kind"] == kind)
            .unwrap_or_else(|| panic!("{service} {kind} span in {trace}"))
    };
    let received = find(checkout, "server");
    assert_eq!(received["budget_ms"], 800.0, "{trace}");
    assert_eq!(received["budget_source"], "deadline.remaining_ms");
    let forwarded = find(checkout, "client")["budget_ms"].as_f64().unwrap();
    assert!(
        forwarded <= 790.0 && forwarded > 500.0,
        "forwarded {forwarded}"
    );
    assert_eq!(find(inventory, "server")["budget_ms"], forwarded, "{trace}");
    assert_eq!(trace["analysis"]["outcome"], "ok", "{trace}");
    assert_eq!(
        trace["analysis"]["flag_counts"],
        serde_json::json!({}),
        "{trace}"
    );
}

/// The 15 ms request: checkout refused at once instead of calling.
fn check_fail_fast(trace: &Value) {
    assert_eq!(trace["spans"].as_array().unwrap().len(), 1, "{trace}");
    assert_eq!(trace["analysis"]["flag_counts"]["refused"], 1, "{trace}");
}

/// Waits for the deadline metrics of `service`'s `hop` to reach `(requests, local exceeds,
/// inherited exceeds)` on `/api/hops`, and checks they stop there.
async fn check_metrics(
    server: &budgetscope::server::RunningServer,
    service: &str,
    hop: &str,
    expected: (i64, i64, i64),
) {
    let started = Instant::now();
    loop {
        let (_, hops) = get_json(server, "/api/hops").await;
        let metrics = hops["hops"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|h| h["service"] == service && h["operation"] == hop)
            .map(|h| h["metrics"].clone())
            .unwrap_or_default();
        let count = |key: &str| metrics[key].as_i64().unwrap_or(0);
        let got = (
            count("requests"),
            count("local_exceeds"),
            count("inherited_exceeds"),
        );
        if got.0 >= expected.0 {
            assert_eq!(got, expected, "{service} {hop}: {metrics}");
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{service} {hop}: metrics {metrics}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_middleware_records_and_forwards_the_budget() {
    let python = std::env::var("BUDGETSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args(["-c", "import opentelemetry.exporter.otlp.proto.http"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        if std::env::var_os("CI").is_some() {
            panic!("CI needs Python's OTLP exporters in {python} (tests/python/requirements.txt)");
        }
        common::say_skipped(&format!(
            "instrument: {python} lacks the OpenTelemetry OTLP exporters; run \
             `pip install -r tests/python/requirements.txt` or set BUDGETSCOPE_TEST_PYTHON"
        ));
        return;
    }
    let db = TestDb::sqlite();
    let server = start(&db, &["--quiet-period", "1s"]).await;
    let base = format!("http://{}", server.otlp_http_addr);
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(format!("{ROOT}/tests/python/instrumented.py"))
            .arg(base)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.trim(), "800 200\n15 504\n-5 504\n100 504");
    // Every request counted in the metrics; the request that arrived spent is checkout's
    // inherited exceed, the slow one inventory's local exceed (checkout passed it on).
    check_metrics(&server, "py-checkout", "POST /checkout", (4, 0, 1)).await;
    check_metrics(&server, "py-inventory", "POST /reserve", (2, 1, 0)).await;
    check_budgets(
        &trace_with_budget(&server, "py-checkout", 800.0).await,
        "py-checkout",
        "py-inventory",
    );
    check_fail_fast(&trace_with_budget(&server, "py-checkout", 15.0).await);
    server.shutdown().await;
}

async fn provider(service: &'static str, endpoint: String) -> SdkTracerProvider {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let _entered = runtime.enter();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .unwrap();
        SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service).build())
            .build()
    })
    .await
    .unwrap()
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_tower_layer_records_and_forwards_the_budget() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--quiet-period", "1s"]).await;
    let endpoint = format!("http://{}", server.otlp_grpc_addr);
    let inventory_provider = provider("rs-inventory", endpoint.clone()).await;
    let checkout_provider = provider("rs-checkout", endpoint).await;

    let inventory = Router::new()
        .route(
            "/reserve",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                "reserved"
            }),
        )
        .layer(BudgetLayer::new(inventory_provider.tracer("instrument")));
    let inventory_url = serve(inventory).await;

    let tracer: SdkTracer = checkout_provider.tracer("instrument");
    let client = reqwest::Client::new();
    let checkout = Router::new()
        .route(
            "/checkout",
            post(move |Extension(deadline): Extension<Deadline>| {
                let (tracer, client) = (tracer.clone(), client.clone());
                let url = format!("{inventory_url}/reserve");
                async move {
                    match post_with_budget(&tracer, &client, &url, deadline).await {
                        Ok(_) => StatusCode::OK,
                        Err(BudgetError::Exhausted(_)) => StatusCode::GATEWAY_TIMEOUT,
                        Err(BudgetError::Http(e)) if e.is_timeout() => StatusCode::GATEWAY_TIMEOUT,
                        Err(BudgetError::Http(_)) => StatusCode::BAD_GATEWAY,
                    }
                }
            }),
        )
        .layer(BudgetLayer::new(checkout_provider.tracer("instrument")));
    let checkout_url = serve(checkout).await;

    let client = reqwest::Client::new();
    for (budget, expected) in [("800", 200), ("15", 504)] {
        let response = client
            .post(format!("{checkout_url}/checkout"))
            .header("x-request-budget-ms", budget)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), expected, "budget {budget}");
    }
    tokio::task::spawn_blocking(move || {
        inventory_provider.shutdown().unwrap();
        checkout_provider.shutdown().unwrap();
    })
    .await
    .unwrap();
    check_budgets(
        &trace_with_budget(&server, "rs-checkout", 800.0).await,
        "rs-checkout",
        "rs-inventory",
    );
    check_fail_fast(&trace_with_budget(&server, "rs-checkout", 15.0).await);
    server.shutdown().await;
}

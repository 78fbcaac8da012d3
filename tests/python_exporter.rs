//! Python's real OTLP exporters (opentelemetry-exporter-otlp-proto-grpc/-http from PyPI)
//! → budgetscope, on both stores.
//!
//! The interpreter is `BUDGETSCOPE_TEST_PYTHON` (set by .ci/run to a venv it installs from
//! tests/python/requirements.txt), else `python3`. When that interpreter lacks the
//! exporters, the test is skipped with a printed reason, unless `CI` is set: then it fails.

mod common;

use std::process::Command;

use common::{TestDb, get_json, start};

fn python() -> Option<String> {
    let python = std::env::var("BUDGETSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = Command::new(&python)
        .args([
            "-c",
            "import opentelemetry.exporter.otlp.proto.grpc, opentelemetry.exporter.otlp.proto.http",
        ])
        .output();
    match probe {
        Ok(output) if output.status.success() => Some(python),
        _ if std::env::var_os("CI").is_some() => {
            panic!(
                "CI needs Python's OTLP exporters in {python}: .ci/run installs them from tests/python/requirements.txt"
            )
        }
        _ => {
            common::say_skipped(&format!(
                "python_exporter: {python} lacks the OpenTelemetry OTLP exporters; run \
                 `pip install -r tests/python/requirements.txt` or set BUDGETSCOPE_TEST_PYTHON"
            ));
            None
        }
    }
}

async fn export(python: &str, transport: &str, endpoint: String) -> String {
    export_with(python, transport, endpoint, None).await
}

/// Runs export.py; with `ca_cert`, over TLS trusting that certificate.
async fn export_with(
    python: &str,
    transport: &str,
    endpoint: String,
    ca_cert: Option<String>,
) -> String {
    let python = python.to_string();
    let transport = transport.to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/python/export.py"
            ))
            .args([transport, endpoint])
            .args(ca_cert)
            // requests lets these take precedence over the exporter's certificate_file.
            .env_remove("REQUESTS_CA_BUNDLE")
            .env_remove("CURL_CA_BUNDLE")
            .output()
            .expect("python runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "export.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpc_and_http_exporters_are_received() {
    let Some(python) = python() else { return };
    for db in TestDb::all().await {
        let server = start(&db, &[]).await;
        for (transport, endpoint) in [
            ("grpc", format!("http://{}", server.otlp_grpc_addr)),
            (
                "http",
                format!("http://{}/v1/traces", server.otlp_http_addr),
            ),
        ] {
            let context = format!("python {transport} on {}", db.backend);
            let trace_id = export(&python, transport, endpoint).await;
            let (status, trace) = get_json(&server, &format!("/api/traces/{trace_id}")).await;
            assert_eq!(status, 200, "{context}: {trace}");
            let spans = trace["spans"].as_array().unwrap();
            assert_eq!(spans.len(), 2, "{context}");
            let hop = spans.iter().find(|s| s["kind"] == "server").unwrap();
            let call = spans.iter().find(|s| s["kind"] == "client").unwrap();
            assert_eq!(hop["service"], "orders-py", "{context}");
            assert_eq!(hop["budget_ms"], 250.0, "{context}");
            assert_eq!(call["budget_ms"], 850.0, "{context}: grpc-timeout 850m");
            assert_eq!(
                call["budget_source"], "rpc.grpc.request.metadata.grpc-timeout",
                "{context}"
            );
            assert_eq!(call["status"]["message"], "DEADLINE_EXCEEDED", "{context}");
            assert_eq!(call["parent_span_id"], hop["span_id"], "{context}");
        }
        server.shutdown().await;
    }
}

/// The Python exporters over TLS (`--tls-cert`): gRPC through grpc-core, which insists on
/// ALPN h2, and HTTP through requests, each trusting only the server's certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_exporters_speak_tls() {
    let Some(python) = python() else { return };
    let db = TestDb::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = common::start_with_tls(&db, dir.path()).await;
    let ca = Some(dir.path().join("cert.pem").to_str().unwrap().to_string());
    let grpc = format!("https://localhost:{}", server.otlp_grpc_addr.port());
    let http = format!(
        "https://localhost:{}/v1/traces",
        server.otlp_http_addr.port()
    );
    let mut stored = 0;
    for (transport, endpoint) in [("grpc", grpc), ("http", http)] {
        let trace_id = export_with(&python, transport, endpoint, ca.clone()).await;
        stored += 2;
        assert_eq!(
            server.store.span_count().await.unwrap(),
            stored,
            "python {transport} over TLS: trace {trace_id} not stored"
        );
    }
    server.shutdown().await;
}

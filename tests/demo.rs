//! `budgetscope demo` against a real server: the traces arrive over OTLP/HTTP, and an
//! unreachable endpoint is explained.

mod common;

use std::process::Command;

use common::{TestDb, get_json, start};

const BIN: &str = env!("CARGO_BIN_EXE_budgetscope");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_sends_traces_the_server_stores() {
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    let endpoint = format!("http://{}/v1/traces", server.otlp_http_addr);
    let ui = format!("http://{}/", server.http_addr);
    let ui_arg = ui.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args([
                "demo",
                "--endpoint",
                &endpoint,
                "--ui",
                &ui_arg,
                "--spans",
                "600",
                "--large-trace",
                "300",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("done: 600 spans sent"), "{stderr}");
    assert!(stderr.contains(&format!("then open {ui}")), "{stderr}");
    let id = stderr
        .split("trace id ")
        .nth(1)
        .and_then(|rest| rest.get(..32))
        .expect("the large trace's id is printed");
    let (status, trace) = get_json(&server, &format!("/api/traces/{id}")).await;
    assert_eq!(status, 200, "{trace}");
    assert!(trace["spans"].as_array().unwrap().len() >= 299);
    let (_, services) = get_json(&server, "/api/services").await;
    assert!(
        services["services"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "edge"),
        "{services}"
    );
    server.shutdown().await;
}

#[test]
fn demo_explains_an_unreachable_server() {
    let output = Command::new(BIN)
        .args([
            "demo",
            "--endpoint",
            "http://127.0.0.1:1/v1/traces",
            "--spans",
            "10",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("is `budgetscope serve` running"),
        "{stderr}"
    );
}

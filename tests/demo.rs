//! `budgetscope demo` on its own (a server and a live shop of instrumented services whose
//! every budget mistake shows up), and with `--endpoint` against a running server.

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// What the live demo's shop produces and the server has not shown yet, read back over the
/// JSON API: each flag (the counted ones in the hop statistics, the others by trace
/// search), each service's deadline metrics, and metric exceeds of both origins.
async fn not_shown(client: &reqwest::Client, ui: &str) -> Vec<String> {
    let mut missing = Vec::new();
    let hops: serde_json::Value = match client.get(format!("{ui}api/hops")).send().await {
        Ok(response) => {
            serde_json::from_str(&response.text().await.unwrap_or_default()).unwrap_or_default()
        }
        Err(_) => serde_json::Value::Null,
    };
    let hops = hops["hops"].as_array().cloned().unwrap_or_default();
    for flag in budgetscope::core::analyze::hops::COUNTED {
        if !hops.iter().any(|hop| hop[flag].as_i64().unwrap_or(0) > 0) {
            missing.push(flag.to_string());
        }
    }
    let metric = |hop: &serde_json::Value, key: &str| hop["metrics"][key].as_i64().unwrap_or(0);
    for service in ["gateway", "orders", "inventory", "billing"] {
        if !hops
            .iter()
            .any(|hop| hop["service"] == service && metric(hop, "requests") > 0)
        {
            missing.push(format!("metrics of {service}"));
        }
    }
    for origin in ["local_exceeds", "inherited_exceeds"] {
        if !hops.iter().any(|hop| metric(hop, origin) > 0) {
            missing.push(format!("metric {origin}"));
        }
    }
    for flag in ["wasted", "unsafe_retry", "missing_parent"] {
        let found: serde_json::Value = match client
            .get(format!("{ui}api/traces?flag={flag}&limit=1"))
            .send()
            .await
        {
            Ok(response) => {
                serde_json::from_str(&response.text().await.unwrap_or_default()).unwrap_or_default()
            }
            Err(_) => serde_json::Value::Null,
        };
        if found["traces"].as_array().is_none_or(|t| t.is_empty()) {
            missing.push(flag.to_string());
        }
    }
    missing
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_demo_shows_every_flag_and_stops_cleanly_on_ctrl_c() {
    // Its temporary database goes into a directory of this test's own, to see it removed.
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args([
            "demo",
            "--otlp-grpc-addr",
            "127.0.0.1:0",
            "--otlp-http-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .env("TMPDIR", tmp.path())
        .env("RUST_LOG", "warn")
        // Left over from a `serve` set-up: the shop's exporters send no token.
        .env("BUDGETSCOPE_OTLP_TOKENS", tmp.path().join("no-such-file"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut output = Vec::new();
    let ui = loop {
        let line = lines_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the demo printed no UI address: {output:?}"));
        output.push(line.clone());
        if let Some(url) = line.strip_prefix("budgetscope demo is up: open ") {
            break url.trim().to_string();
        }
    };
    assert!(
        ui.starts_with("http://127.0.0.1:") && ui.ends_with('/'),
        "{ui}"
    );
    let created: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(!created.is_empty(), "the temporary database is in TMPDIR");

    // Product target: every flag within 20 s (BENCHMARKS.md); the wait here is a bound on
    // a hung demo, not a timing assertion.
    let client = reqwest::Client::new();
    let started = Instant::now();
    let mut missing = not_shown(&client, &ui).await;
    while !missing.is_empty() && started.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        missing = not_shown(&client, &ui).await;
    }
    assert!(
        missing.is_empty(),
        "never shown: {missing:?}; demo said {output:?}"
    );
    eprintln!("every flag and metric shown after {:?}", started.elapsed());

    // The pages a new user opens first answer.
    for page in ["", "traces", "help/budget-semantics"] {
        let response = client.get(format!("{ui}{page}")).send().await.unwrap();
        assert_eq!(response.status(), 200, "/{page}");
    }

    // Ctrl-C: the demo stops its services, its server and removes its database.
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .unwrap();
    output.extend(lines_rx.try_iter());
    let status = status.unwrap_or_else(|| panic!("the demo did not stop on SIGINT: {output:?}"));
    assert!(status.success(), "{status}: {output:?}");
    assert!(
        output.iter().any(|line| line.starts_with("demo stopped.")),
        "{output:?}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "the temporary database is removed: {left:?}"
    );
}

#[test]
fn demo_flags_of_the_two_modes_do_not_mix() {
    for args in [
        vec!["demo", "--spans", "10"],
        vec![
            "demo",
            "--endpoint",
            "http://127.0.0.1:1/v1/traces",
            "--db",
            "sqlite://x.db",
        ],
        vec!["demo", "--rate", "0"],
    ] {
        let output = Command::new(BIN).args(&args).output().unwrap();
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--endpoint") || stderr.contains("--rate"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_port_in_use_is_explained_with_what_to_do() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args([
            "demo",
            "--otlp-grpc-addr",
            &port,
            "--otlp-http-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for hint in ["--otlp-grpc-addr", "demo --endpoint", &port] {
        assert!(stderr.contains(hint), "{hint}: {stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing is left behind: {left:?}");
}

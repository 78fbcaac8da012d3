//! The `budgetscope` binary as a user runs it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_budgetscope");

fn run(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("binary runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn rules_check_accepts_a_good_file_and_names_rule_and_field_of_each_problem() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "receivers:\n  - name: ops\n    webhook: { url: \"http://127.0.0.1:9/hook\" }\nrules:\n  - name: inventory-burning\n    service: inventory\n    signal: local_exceed_ratio\n    op: \">\"\n    threshold: 0.05\n    window: 5m\n    for: 2m\n    receivers: [ops]\n",
    )
    .unwrap();
    let (ok, out, err) = run(&["rules", "check", good.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("1 rule and 1 receiver, no problems"), "{out}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "rules:\n  - name: slow\n    signal: local_exceed_ratio\n    op: \">\"\n    threshold: 0.05\n    window: 5s\n    receivers: [pager]\n",
    )
    .unwrap();
    let (ok, _, err) = run(&["rules", "check", bad.to_str().unwrap()]);
    assert!(!ok, "a file with problems must fail");
    assert!(err.contains("2 problems"), "{err}");
    assert!(
        err.contains("rule \"slow\", field window: must be at least 1m"),
        "{err}"
    );
    assert!(
        err.contains("rule \"slow\", field receivers: no receiver is named \"pager\""),
        "{err}"
    );

    let (ok, _, err) = run(&["rules", "check", "/nonexistent/rules.yaml"]);
    assert!(!ok && err.contains("cannot read the file"), "{err}");

    // serve refuses to start on a file with problems, and says how to list them.
    let (ok, _, err) = run(&[
        "serve",
        "--db",
        "sqlite://:memory:",
        "--rules",
        bad.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("rules check"), "{err}");
}

#[test]
fn serve_help_documents_every_setting_and_its_env_var() {
    let (ok, help, _) = run(&["serve", "--help"]);
    assert!(ok);
    for (flag, env) in [
        ("--otlp-grpc-addr", "BUDGETSCOPE_OTLP_GRPC_ADDR"),
        ("--otlp-http-addr", "BUDGETSCOPE_OTLP_HTTP_ADDR"),
        ("--http-addr", "BUDGETSCOPE_HTTP_ADDR"),
        ("--db", "BUDGETSCOPE_DB"),
        ("--budget-keys", "BUDGETSCOPE_BUDGET_KEYS"),
        ("--metric-received", "BUDGETSCOPE_METRIC_RECEIVED"),
        ("--metric-remaining", "BUDGETSCOPE_METRIC_REMAINING"),
        ("--metric-exceeded", "BUDGETSCOPE_METRIC_EXCEEDED"),
        ("--metric-hop-key", "BUDGETSCOPE_METRIC_HOP_KEY"),
        ("--metric-origin-key", "BUDGETSCOPE_METRIC_ORIGIN_KEY"),
        ("--tolerance-ms", "BUDGETSCOPE_TOLERANCE_MS"),
        ("--max-request-bytes", "BUDGETSCOPE_MAX_REQUEST_BYTES"),
        ("--retention", "BUDGETSCOPE_RETENTION"),
        ("--cors-origins", "BUDGETSCOPE_CORS_ORIGINS"),
        ("--max-queued-spans", "BUDGETSCOPE_MAX_QUEUED_SPANS"),
        ("--memory-limit", "BUDGETSCOPE_MEMORY_LIMIT"),
        ("--rules", "BUDGETSCOPE_RULES"),
        ("--alert-interval", "BUDGETSCOPE_ALERT_INTERVAL"),
        ("--alert-delay", "BUDGETSCOPE_ALERT_DELAY"),
        ("--external-url", "BUDGETSCOPE_EXTERNAL_URL"),
        ("--max-connections", "BUDGETSCOPE_MAX_CONNECTIONS"),
        ("--allowed-hosts", "BUDGETSCOPE_ALLOWED_HOSTS"),
        ("--otlp-tokens", "BUDGETSCOPE_OTLP_TOKENS"),
        ("--ui-tokens", "BUDGETSCOPE_UI_TOKENS"),
    ] {
        assert!(
            help.contains(flag) && help.contains(env),
            "{flag} / {env} missing from:\n{help}"
        );
    }
    for default in [
        "127.0.0.1:4317",
        "127.0.0.1:4318",
        "127.0.0.1:8080",
        "sqlite://budgetscope.db",
        "7d",
        "20MiB",
        "512MiB]",
    ] {
        assert!(help.contains(default), "default {default} missing");
    }
    let (ok, help, _) = run(&["--help"]);
    assert!(ok && help.contains("serve") && help.contains("demo") && help.contains("rules"));
    // The benchmark harness is a program of its own (budgetscope-bench), not a subcommand.
    assert!(!help.contains("bench"), "{help}");
}

#[test]
fn invalid_config_fails_at_start_naming_the_setting() {
    let (ok, _, stderr) = run(&["serve", "--http-addr", "not-an-address"]);
    assert!(!ok);
    assert!(
        stderr.contains("invalid --http-addr (env BUDGETSCOPE_HTTP_ADDR)"),
        "{stderr}"
    );
    let output = Command::new(BIN)
        .args(["serve"])
        .env("BUDGETSCOPE_RETENTION", "forever")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("invalid --retention (env BUDGETSCOPE_RETENTION) \"forever\""),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_database_is_reported_with_what_to_check() {
    let (ok, _, stderr) = run(&[
        "serve",
        "--db",
        "postgres://nobody:secret@127.0.0.1:1/none",
        "--otlp-grpc-addr",
        "127.0.0.1:0",
        "--otlp-http-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains(
            "could not open the database postgres://nobody:***@127.0.0.1:1/none; check --db"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("Postgres refused the connection: nothing listens at that host and port"),
        "says what failed: {stderr}"
    );
    assert!(
        !stderr.contains("secret"),
        "passwords never appear: {stderr}"
    );
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("t.db").display());
    let mut child = Command::new(BIN)
        .args(["serve", "--db", &db])
        .args([
            "--otlp-grpc-addr",
            "127.0.0.1:0",
            "--otlp-http-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it says it is up, reading its stderr line by line.
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let up = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("budgetscope is up"));
    assert!(up, "server announces its addresses");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        rest.iter()
            .any(|l| l.contains("every acknowledged span is committed")),
        "{rest:?}"
    );
    // stderr is a pipe here, not a terminal: the log has no colour codes.
    assert!(
        rest.iter().all(|l| !l.contains('\x1b')),
        "colour codes in a piped log: {rest:?}"
    );
}

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/inflated_checkout.otlp.json"
);

#[test]
fn analyze_prints_the_waterfall_with_flags_and_messages() {
    let (ok, stdout, stderr) = run(&["analyze", FIXTURE]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("trace 5b8efff798038103d269b633813fc60c\nexceeded · budget 800 ms"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  ! inflated: forwarded 5000 ms with 780 ms left"),
        "{stdout}"
    );
    assert!(
        stdout.contains("! overspent: answered 740 ms after its deadline"),
        "{stdout}"
    );
    assert!(stderr.contains("1 trace, 3 spans"), "{stderr}");
}

#[test]
fn analyze_json_has_the_api_shape_and_reads_json_lines() {
    // Two requests, one per line, as the Collector's file exporter writes them.
    let request: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let mut first = request.clone();
    let mut second = request;
    first["resourceSpans"].as_array_mut().unwrap().truncate(1);
    second["resourceSpans"].as_array_mut().unwrap().remove(0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spans.jsonl");
    std::fs::write(&path, format!("{first}\n{second}\n")).unwrap();
    let (ok, stdout, stderr) = run(&["analyze", "--json", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    let trace: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(trace["trace_id"], "5b8efff798038103d269b633813fc60c");
    assert_eq!(trace["spans"].as_array().unwrap().len(), 3);
    let analysis = &trace["analysis"];
    assert_eq!(analysis["outcome"], "exceeded");
    assert_eq!(analysis["budget_ms"], 800.0);
    assert_eq!(analysis["burner"]["service"], "inventory");
    assert_eq!(
        analysis["flag_counts"],
        serde_json::json!({"inflated": 1, "overspent": 1, "local_exceed": 1})
    );
    // Where it ran out: edge, which sent a fresh timeout it did not have.
    assert_eq!(analysis["origins"][0]["service"], "edge");
    assert!(
        analysis["origins"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("which was sent more time than was left"),
        "{analysis}"
    );
    assert_eq!(
        analysis["rows"][1]["flags"][0]["message"],
        "forwarded 5000 ms with 780 ms left"
    );
}

#[test]
fn analyze_reads_a_body_as_the_server_does() {
    // A byte-order mark, an enum by its name (protobuf's JSON mapping) and a broken span
    // beside the good ones: the receivers keep the good spans and say why one was left
    // out; so does `analyze`, through the same decoder.
    let mut request: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    let spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array_mut()
        .unwrap();
    spans[0]["kind"] = serde_json::json!("SPAN_KIND_SERVER");
    let mut broken = spans[0].clone();
    broken["spanId"] = serde_json::json!("10000000000000ff");
    broken["endTimeUnixNano"] = serde_json::json!(-5);
    spans.push(broken);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spans.json");
    std::fs::write(&path, format!("\u{FEFF}{request}")).unwrap();
    let (ok, stdout, stderr) = run(&["analyze", path.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("! inflated: forwarded 5000 ms with 780 ms left"),
        "{stdout}"
    );
    assert!(stderr.contains("rejected 1 of"), "{stderr}");
    assert!(
        stderr.contains("1 trace, 3 spans, 1 invalid spans skipped"),
        "{stderr}"
    );
}

#[test]
fn analyze_explains_unreadable_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, "{\"resourceSpans\": [{\"scopeSpans\": 7}]}\n").unwrap();
    let (ok, _, stderr) = run(&["analyze", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("is not OTLP/JSON trace data"), "{stderr}");
    assert!(stderr.contains("line 1"), "{stderr}");
    // Read span by span as the server reads it (enum names are the mapping's), but no span
    // is valid: nothing to analyse, and why.
    std::fs::write(&path, "{\"resourceSpans\": [{\"scopeSpans\": [{\"spans\": [{\"kind\": \"SPAN_KIND_SERVER\"}]}]}]}\n").unwrap();
    let (ok, _, stderr) = run(&["analyze", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("no valid spans"), "{stderr}");
    assert!(stderr.contains("trace id"), "{stderr}");
    let (ok, _, stderr) = run(&["analyze", "/nonexistent/file.json"]);
    assert!(
        !ok && stderr.contains("could not read /nonexistent/file.json"),
        "{stderr}"
    );
}

#[test]
fn serve_on_a_port_in_use_fails_naming_the_flag_and_leaves_no_database_behind() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("budgetscope.db");
    let (ok, _, stderr) = run(&[
        "serve",
        "--db",
        &format!("sqlite://{}", db.display()),
        "--otlp-grpc-addr",
        "127.0.0.1:0",
        "--otlp-http-addr",
        "127.0.0.1:0",
        "--http-addr",
        &port,
    ]);
    assert!(!ok);
    assert!(
        stderr.contains(&format!("could not listen on {port} (--http-addr)")),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

/// docker-compose.yml and the Dockerfile, checked without a Docker engine: every setting
/// they give budgetscope is one `serve --help` documents, each server reaches the
/// database service the file defines and waits for it, and no two publish the same port.
#[test]
fn docker_compose_runs_servers_on_its_own_postgres_with_documented_settings() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/docker-compose.yml")).unwrap();
    let compose: serde_json::Value = serde_saphyr::from_str(&text).expect("valid YAML");
    let (_, help, _) = run(&["serve", "--help"]);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let services = compose["services"].as_object().expect("services");
    let servers: Vec<_> = services
        .iter()
        .filter(|(_, s)| s["build"].is_string())
        .collect();
    assert!(servers.len() >= 2, "several servers on one database");
    let mut published = std::collections::HashSet::new();
    for (name, server) in &servers {
        let context = server["build"].as_str().unwrap();
        assert!(
            std::path::Path::new(&format!("{root}/{context}/Dockerfile")).exists(),
            "{name}"
        );
        assert_eq!(server["command"], serde_json::json!(["serve"]), "{name}");
        for (key, _) in server["environment"].as_object().unwrap() {
            assert!(
                key == "RUST_LOG" || help.contains(&format!("[env: {key}=")),
                "{name}: {key} is not a documented setting"
            );
        }
        let db = server["environment"]["BUDGETSCOPE_DB"].as_str().unwrap();
        let host = db
            .strip_prefix("postgres://")
            .and_then(|rest| rest.split('@').nth(1))
            .and_then(|rest| rest.split(':').next())
            .unwrap_or_else(|| panic!("{name}: {db}"));
        assert!(services.contains_key(host), "{name}: no service {host}");
        assert_eq!(
            server["depends_on"][host]["condition"], "service_healthy",
            "{name} waits for the database"
        );
        for port in server["ports"].as_array().unwrap() {
            let port = port.as_str().unwrap();
            assert!(port.starts_with("127.0.0.1:"), "{name}: {port} on loopback");
            let host_port = port.split(':').nth(1).unwrap().to_string();
            assert!(
                published.insert(host_port),
                "{name}: {port} published twice"
            );
        }
    }
    assert!(services.values().any(|s| s["healthcheck"].is_object()));
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    for key in dockerfile
        .split_whitespace()
        .filter_map(|word| word.split_once('=').map(|(k, _)| k))
        .filter(|k| k.starts_with("BUDGETSCOPE_"))
    {
        assert!(
            help.contains(&format!("[env: {key}=")),
            "Dockerfile: {key} is not a documented setting"
        );
    }
}

/// Serving beyond loopback without tokens is warned about at start-up; SIGHUP re-reads the
/// tokens files; no token ever appears in the log.
#[test]
fn listeners_beyond_loopback_without_tokens_are_warned_about_and_tokens_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("t.db").display());
    let tokens = dir.path().join("ui-tokens");
    std::fs::write(&tokens, "first-token-value\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--db", &db])
        .args([
            "--otlp-grpc-addr",
            "0.0.0.0:0",
            "--otlp-http-addr",
            "127.0.0.1:0",
            "--http-addr",
            "0.0.0.0:0",
            "--ui-tokens",
            tokens.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let mut log: Vec<String> = Vec::new();
    for line in lines.by_ref().map_while(Result::ok) {
        let up = line.contains("budgetscope is up");
        log.push(line);
        if up {
            break;
        }
    }
    let warnings: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("without authentication"))
        .collect();
    assert_eq!(warnings.len(), 1, "only the OTLP/gRPC listener: {log:?}");
    assert!(warnings[0].contains("--otlp-tokens"), "{log:?}");
    std::fs::write(&tokens, "second-token-value\n").unwrap();
    let signal = |name: &str| {
        Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .unwrap()
    };
    signal("-HUP");
    for line in lines.by_ref().map_while(Result::ok) {
        let reloaded = line.contains("reloaded the --ui-tokens file");
        log.push(line);
        if reloaded {
            break;
        }
    }
    signal("-TERM");
    log.extend(lines.map_while(Result::ok));
    child.wait().unwrap();
    assert!(
        log.iter()
            .any(|l| l.contains("reloaded the --ui-tokens file")),
        "{log:?}"
    );
    assert!(
        log.iter().all(|l| !l.contains("token-value")),
        "a token in the log: {log:?}"
    );
}

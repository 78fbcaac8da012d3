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
fn serve_help_documents_every_setting_and_its_env_var() {
    let (ok, help, _) = run(&["serve", "--help"]);
    assert!(ok);
    for (flag, env) in [
        ("--otlp-grpc-addr", "BUDGETSCOPE_OTLP_GRPC_ADDR"),
        ("--otlp-http-addr", "BUDGETSCOPE_OTLP_HTTP_ADDR"),
        ("--http-addr", "BUDGETSCOPE_HTTP_ADDR"),
        ("--db", "BUDGETSCOPE_DB"),
        ("--budget-keys", "BUDGETSCOPE_BUDGET_KEYS"),
        ("--tolerance-ms", "BUDGETSCOPE_TOLERANCE_MS"),
        ("--max-request-bytes", "BUDGETSCOPE_MAX_REQUEST_BYTES"),
        ("--retention", "BUDGETSCOPE_RETENTION"),
        ("--cors-origins", "BUDGETSCOPE_CORS_ORIGINS"),
        ("--max-queued-spans", "BUDGETSCOPE_MAX_QUEUED_SPANS"),
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
    ] {
        assert!(help.contains(default), "default {default} missing");
    }
    let (ok, help, _) = run(&["--help"]);
    assert!(ok && help.contains("serve") && help.contains("bench"));
    let (ok, help, _) = run(&["bench", "ingest", "--help"]);
    assert!(ok && help.contains("--transport") && help.contains("--concurrency"));
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
}

#[test]
fn bench_ingest_runs_and_checks_stored_equals_sent() {
    for transport in ["grpc", "http-proto", "http-json"] {
        let (ok, stdout, stderr) = run(&[
            "bench",
            "ingest",
            "--spans",
            "600",
            "--batch",
            "50",
            "--concurrency",
            "2",
            "--transport",
            transport,
            "--gzip",
        ]);
        assert!(ok, "{transport}: {stderr}");
        assert!(
            stdout.contains("| spans sent / stored after shutdown | 600 / 600 |"),
            "{transport}: {stdout}"
        );
        assert!(
            stdout.contains("end to end / raw INSERT ceiling"),
            "{stdout}"
        );
        assert!(
            stderr.contains("generating 600 spans"),
            "progress is shown: {stderr}"
        );
    }
}

#[test]
fn bench_overload_is_refused_and_retried_without_loss() {
    let (ok, stdout, stderr) = run(&[
        "bench",
        "ingest",
        "--spans",
        "2000",
        "--batch",
        "100",
        "--concurrency",
        "4",
        "--max-queued-spans",
        "100",
        "--no-ceiling",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("| spans sent / stored after shutdown | 2000 / 2000 |"),
        "{stdout}"
    );
}

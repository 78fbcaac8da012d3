//! The `budgetscope-bench` harness as a user runs it: each benchmark on a small run, the
//! ingest benchmark against the `budgetscope` binary beside it.

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_budgetscope-bench");

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
fn help_lists_every_benchmark() {
    let (ok, help, _) = run(&["--help"]);
    assert!(ok, "{help}");
    for bench in [
        "ingest",
        "analyze",
        "query",
        "ui",
        "receive",
        "sustained",
        "reads",
    ] {
        assert!(help.contains(bench), "{bench} missing from:\n{help}");
    }
    let (ok, help, _) = run(&["ingest", "--help"]);
    assert!(ok && help.contains("--transport") && help.contains("--concurrency"));
    assert!(help.contains("--server"), "{help}");
}

/// Without `--server`, the harness needs the `budgetscope` binary beside it, and says how
/// to get one when it is missing.
#[test]
fn ingest_names_the_missing_server_binary_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("budgetscope-bench");
    std::fs::copy(BIN, &copy).unwrap();
    let output = Command::new(&copy)
        .args(["ingest", "--spans", "10"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("no budgetscope binary at") && stderr.contains("--server"),
        "{stderr}"
    );
}

#[test]
fn bench_ingest_runs_and_checks_stored_equals_sent() {
    for transport in ["grpc", "http-proto", "http-json"] {
        let (ok, stdout, stderr) = run(&[
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
        // A run this small may not last one clock tick per thread: the row, not its values.
        assert!(stdout.contains("| server CPU by thread name"), "{stdout}");
        assert!(stdout.contains("| senders' CPU"), "{stdout}");
        // Linux keeps per-thread scheduler statistics (schedstat) on the machines CI runs on.
        assert!(stdout.contains("| ingest writer: on a CPU"), "{stdout}");
        assert!(
            stderr.contains("generating 600 spans"),
            "progress is shown: {stderr}"
        );
    }
}

/// A sustained run of 8,000 spans in 4 s, with a 1-s quiet period.
const SHORT_SUSTAINED: [&str; 12] = [
    "--rate",
    "2000",
    "--seconds",
    "4",
    "--hops",
    "2-6",
    "--batch",
    "100",
    "--quiet-period",
    "1s",
    "--drain",
    "60",
];

/// A short sustained run: the load goes through, the analyzer drains after it, every
/// acknowledged span is stored, and the lag curve is printed.
#[test]
fn bench_sustained_reports_the_analysis_lag_and_drains() {
    let (ok, stdout, stderr) = run(&[&["sustained"][..], &SHORT_SUSTAINED].concat());
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("| spans sent (acknowledged) / stored after shutdown | 8000 / 8000 |"),
        "{stdout}"
    );
    assert!(stdout.contains("| analysis lag beyond the quiet period, p50 / p99 / max"));
    assert!(
        stdout.contains("| analysis drained after the load in | ")
            && !stdout.contains("not within"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| time | analysis lag | traces waiting |"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| traces stored / summarised | ")
            && stdout.contains("| hop samples in summaries / requests in hop rollups | "),
        "{stdout}"
    );
    let (ok, _, stderr) = run(&["sustained", "--hops", "1-3", "--seconds", "1"]);
    assert!(!ok && stderr.contains("--hops takes MIN-MAX"), "{stderr}");
    let (ok, _, stderr) = run(&["sustained", "--servers", "2", "--seconds", "1"]);
    assert!(!ok && stderr.contains("needs --db postgres"), "{stderr}");
}

/// Two servers on one Postgres: every acknowledged span stored, every trace summarised
/// once and every hop counted once (the harness fails the run otherwise).
#[test]
fn bench_sustained_checks_several_servers_count_each_trace_once() {
    let url = match std::env::var("BUDGETSCOPE_TEST_POSTGRES_URL") {
        Ok(url) => url,
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("CI must set BUDGETSCOPE_TEST_POSTGRES_URL (.ci/run does)")
        }
        Err(_) => {
            eprintln!(
                "SKIPPED bench_sustained_checks_several_servers_count_each_trace_once: set \
                 BUDGETSCOPE_TEST_POSTGRES_URL to run it"
            );
            return;
        }
    };
    let (ok, stdout, stderr) = run(&[
        &["sustained", "--db", &url, "--servers", "2"][..],
        &SHORT_SUSTAINED,
    ]
    .concat());
    assert!(ok, "{stderr}");
    assert!(stdout.contains("postgres, 2 server(s)"), "{stdout}");
    assert!(
        stdout.contains("| spans sent (acknowledged) / stored after shutdown | 8000 / 8000 |")
            && stdout.contains("| spans stored / in summaries | 8000 / 8000 |"),
        "{stdout}"
    );
}

#[test]
fn bench_receive_runs_both_paths() {
    for format in [None, Some("--json")] {
        let mut args = vec![
            "receive", "--spans", "2000", "--batch", "100", "--rounds", "1",
        ];
        args.extend(format);
        let (ok, stdout, stderr) = run(&args);
        assert!(ok, "{format:?}: {stderr}");
        assert!(
            stdout.contains("| receivers' work ÷ baseline | "),
            "{stdout}"
        );
        assert_eq!(
            stdout.contains("| budgetscope's decoder ÷ baseline | "),
            format.is_some(),
            "the JSON decoder alone is timed with --json only: {stdout}"
        );
        assert!(
            stderr.contains("round 1 of 1"),
            "progress is shown: {stderr}"
        );
    }
}

#[test]
fn bench_overload_is_refused_and_retried_without_loss() {
    let (ok, stdout, stderr) = run(&[
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

/// A trace more than one read may take under the smallest memory limit: the whole-trace
/// reads are refused at once, the page lists its first spans, the download streams it
/// all, and the memory is reported.
#[test]
fn bench_reads_reports_refusals_the_streamed_download_and_memory() {
    let (ok, stdout, stderr) = run(&["reads", "--spans", "10000", "--concurrency", "2"]);
    assert!(ok, "{stderr}");
    for (endpoint, status) in [
        ("/api/traces/{id}", 413),
        ("/jaeger/api/traces/{id}", 413),
        ("/traces/{id}", 200),
        ("/api/traces/{id}/otlp", 200),
    ] {
        assert!(
            stdout.contains(&format!("| {endpoint} | {status}, {status} | ")),
            "{endpoint}: {stdout}"
        );
    }
    assert!(stdout.contains("peak anonymous memory"), "{stdout}");
}

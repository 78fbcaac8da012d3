//! What the ingest path promises exporters: a span is either committed before the success
//! answer, or refused with a retryable status; nothing accepted is lost on shutdown.

mod common;

use std::time::Duration;

use budgetscope::store;
use common::{TestDb, get_json, now_nanos, start};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use sqlx::Connection as _;
use tonic_types::StatusExt as _;

fn request(trace: u32, spans: u32) -> ExportTraceServiceRequest {
    let start = now_nanos();
    let spans = (0..spans)
        .map(|i| Span {
            trace_id: (u128::from(trace) + (1 << 100)).to_be_bytes().to_vec(),
            span_id: (u64::from(i) + 1).to_be_bytes().to_vec(),
            name: format!("op{i}"),
            kind: 2,
            start_time_unix_nano: start,
            end_time_unix_nano: start + 1_000,
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn trace_path(trace: u32) -> String {
    format!("/api/traces/{:032x}", u128::from(trace) + (1 << 100))
}

async fn post(
    client: &reqwest::Client,
    addr: std::net::SocketAddr,
    body: Vec<u8>,
) -> reqwest::Response {
    client
        .post(format!("http://{addr}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .expect("request completes")
}

/// Holds SQLite's write lock from another connection, as another process might.
async fn hold_write_lock(db: &TestDb) -> sqlx::SqliteConnection {
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_with_retry_hints_and_loses_nothing_it_accepted() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--max-queued-spans", "1"]).await;
    let addr = server.otlp_http_addr;
    let client = reqwest::Client::new();
    let mut lock = hold_write_lock(&db).await;

    // Two requests race for the one queue slot: the winner waits for the writer (which
    // waits for the lock), the loser is refused at once, so the first answer is a refusal.
    let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    for trace in [1u32, 2] {
        let (client, answers) = (client.clone(), answers.clone());
        tokio::spawn(async move {
            let response = post(&client, addr, request(trace, 1).encode_to_vec()).await;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            let text = String::from_utf8_lossy(&response.bytes().await.unwrap()).into_owned();
            answers.send((trace, status, retry_after, text)).unwrap();
        });
    }
    let (refused_trace, status, retry_after, text) = answered.recv().await.unwrap();
    assert_eq!(status, 503, "{text}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(text.contains("ingest limit"), "{text}");

    let mut grpc = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr))
        .await
        .unwrap();
    let status = grpc.export(request(3, 1)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(
        status.get_details_retry_info().and_then(|r| r.retry_delay),
        Some(Duration::from_secs(1))
    );

    sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();
    let (admitted_trace, status, _, text) = answered.recv().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        get_json(&server, &trace_path(admitted_trace)).await.0,
        200,
        "the admitted span was committed"
    );
    assert_eq!(
        get_json(&server, &trace_path(refused_trace)).await.0,
        404,
        "the refused one was not"
    );
    assert_eq!(get_json(&server, &trace_path(3)).await.0, 404);

    // The exporter's retry now goes through.
    assert_eq!(
        post(&client, addr, request(2, 1).encode_to_vec())
            .await
            .status(),
        200
    );
    assert_eq!(get_json(&server, &trace_path(2)).await.0, 200);
    server.shutdown().await;
}

/// Bodies whose length is declared and never sent hold the memory budget (pool 128 MiB at
/// `--memory-limit 256MiB`): every further request over either transport is refused with a
/// retry hint before it is decoded, and once the held requests go away the retry is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_budget_refuses_with_retry_hints_and_recovers() {
    use tokio::io::AsyncWriteExt as _;
    let db = TestDb::sqlite();
    // A long quiet period keeps the analyzer's pass, which reserves memory of its own and
    // frees the spans held for it, out of the budget while the test fills it.
    let server = start(&db, &["--memory-limit", "256MiB", "--quiet-period", "1h"]).await;
    let addr = server.otlp_http_addr;
    let hold = |bytes: u64| async move {
        let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\n\
             Content-Length: {bytes}\r\n\r\n"
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket
    };
    let client = reqwest::Client::new();
    let body = request(1, 5).encode_to_vec();
    // A held request reserves its declared length once its headers are read, and only if
    // it fits in what is free then (a probe read first takes room too): halving lengths,
    // from half the pool down to 256 bytes, leave less free than the probe needs.
    let mut held = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (retry_after, text) = loop {
        let response = post(&client, addr, body.clone()).await;
        if response.status() == 503 {
            let retry_after = response
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap().to_string());
            break (retry_after, response.text().await.unwrap());
        }
        assert_eq!(response.status(), 200, "before the budget filled up");
        assert!(
            std::time::Instant::now() < deadline,
            "the budget never filled up"
        );
        for shift in (8..=26).rev() {
            held.push(hold(1 << shift).await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert!(text.contains("memory limit (--memory-limit)"), "{text}");
    // A refused body larger than the sockets' buffers is read to its end, so its client
    // gets the refusal rather than a broken pipe.
    let large = client
        .post(format!("http://{addr}/v1/traces"))
        .header("content-type", "application/x-protobuf")
        .body(vec![0u8; 16 << 20])
        .send()
        .await
        .expect("the refusal of a large body is an answer, not a broken connection");
    assert_eq!(large.status(), 503);

    let mut grpc = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr))
        .await
        .unwrap();
    let status = grpc.export(request(2, 5)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("--memory-limit"), "{status:?}");
    assert_eq!(
        status.get_details_retry_info().and_then(|r| r.retry_delay),
        Some(Duration::from_secs(1))
    );
    assert_eq!(get_json(&server, &trace_path(2)).await.0, 404);

    // The held requests end (their clients went away) and give their memory back.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match grpc.export(request(2, 5)).await {
            Ok(_) => break,
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the memory never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get_json(&server, &trace_path(2)).await.0, 200);
    assert_eq!(post(&client, addr, body).await.status(), 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_store_answers_503_and_the_retry_is_stored() {
    for db in TestDb::all().await {
        let server = start(&db, &[]).await;
        let client = reqwest::Client::new();
        let break_table = "ALTER TABLE spans RENAME TO spans_elsewhere";
        let mend_table = "ALTER TABLE spans_elsewhere RENAME TO spans";
        // A real failure of the real database: the table is gone for a moment.
        let run = |sql: &'static str| {
            let url = db.url.clone();
            let backend = db.backend;
            async move {
                if backend == "sqlite" {
                    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
                    sqlx::query(sql).execute(&mut conn).await.unwrap();
                } else {
                    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                    sqlx::query(sql).execute(&mut conn).await.unwrap();
                }
            }
        };
        run(break_table).await;
        let refused = post(
            &client,
            server.otlp_http_addr,
            request(7, 3).encode_to_vec(),
        )
        .await;
        assert_eq!(refused.status(), 503, "{}", db.backend);
        assert_eq!(refused.headers()["retry-after"], "1", "{}", db.backend);
        let text = String::from_utf8_lossy(&refused.bytes().await.unwrap()).into_owned();
        assert!(
            text.contains("database is unavailable"),
            "{}: {text}",
            db.backend
        );
        assert!(
            !text.contains("spans"),
            "{}: no database text leaks: {text}",
            db.backend
        );

        run(mend_table).await;
        let retried = post(
            &client,
            server.otlp_http_addr,
            request(7, 3).encode_to_vec(),
        )
        .await;
        assert_eq!(retried.status(), 200, "{}", db.backend);
        let (_, trace) = get_json(&server, &trace_path(7)).await;
        assert_eq!(
            trace["spans"].as_array().unwrap().len(),
            3,
            "{}",
            db.backend
        );
        server.shutdown().await;
    }
}

/// Regression: with the SQLite file locked by another process, a batch of requests failed
/// after the busy timeout and was then retried job by job, each waiting the timeout again:
/// the last exporter heard after 27 s, long after its 10 s timeout had given up. Now every
/// request hears a retryable refusal within the exporters' usual timeout (a bound against
/// that wait, not a measurement), and the retry is stored once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_locked_elsewhere_refuses_every_export_retryably_within_the_exporter_timeout() {
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    let client = reqwest::Client::new();
    let lock = hold_write_lock(&db).await;
    let senders: Vec<_> = (0..6u32)
        .map(|trace| {
            let client = client.clone();
            let addr = server.otlp_http_addr;
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let response = post(&client, addr, request(70 + trace, 2).encode_to_vec()).await;
                (response.status(), started.elapsed())
            })
        })
        .collect();
    for sender in senders {
        let (status, waited) = sender.await.unwrap();
        assert_eq!(status, 503, "refused while the file is locked");
        assert!(
            waited < Duration::from_secs(10),
            "an exporter waited {waited:?}, past its own timeout"
        );
    }
    drop(lock);
    assert_eq!(
        post(
            &client,
            server.otlp_http_addr,
            request(70, 2).encode_to_vec()
        )
        .await
        .status(),
        200
    );
    assert_eq!(get_json(&server, &trace_path(70)).await.0, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_commits_every_acknowledged_span() {
    for db in TestDb::all().await {
        let server = start(&db, &[]).await;
        let addr = server.otlp_http_addr;
        let client = reqwest::Client::new();
        // Senders keep exporting while the server shuts down under them.
        let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let senders: Vec<_> = (0..4u32)
            .map(|sender| {
                let client = client.clone();
                let answered = answered.clone();
                tokio::spawn(async move {
                    let mut acknowledged = Vec::new();
                    for batch in 0..200u32 {
                        let trace = sender * 1_000 + batch;
                        let sent = client
                            .post(format!("http://{addr}/v1/traces"))
                            .header("content-type", "application/x-protobuf")
                            .body(request(trace, 20).encode_to_vec())
                            .send()
                            .await;
                        match sent {
                            Ok(response) if response.status() == 200 => {
                                acknowledged.push(trace);
                                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            _ => break,
                        }
                    }
                    acknowledged
                })
            })
            .collect();
        // Shut down once every sender is under way (each had an answer).
        eventually("every sender had an export acknowledged", || {
            answered.load(std::sync::atomic::Ordering::Relaxed) >= 4
        })
        .await;
        server.shutdown().await;
        let mut acknowledged = Vec::new();
        for sender in senders {
            acknowledged.extend(sender.await.unwrap());
        }
        assert!(
            !acknowledged.is_empty(),
            "{}: some exports finished before shutdown",
            db.backend
        );

        let reopened = store::open(&db.url).await.unwrap();
        for trace in &acknowledged {
            let id =
                budgetscope::core::model::TraceId((u128::from(*trace) + (1 << 100)).to_be_bytes());
            assert_eq!(
                reopened.trace(id).await.unwrap().len(),
                20,
                "{}: trace {trace}",
                db.backend
            );
        }
        assert!(reopened.span_count().await.unwrap() >= acknowledged.len() as u64 * 20);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_spans_older_than_the_setting() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--retention", "1m"]).await;
    let client = reqwest::Client::new();
    let aged = |trace: u32, age_s: u64| {
        let mut request = request(trace, 2);
        let start = now_nanos() - age_s * 1_000_000_000;
        for span in &mut request.resource_spans[0].scope_spans[0].spans {
            span.start_time_unix_nano = start;
            span.end_time_unix_nano = start + 1_000;
        }
        request.encode_to_vec()
    };
    // Older than the retention: refused span by span, and the answer says why.
    let refused = post(&client, server.otlp_http_addr, aged(59, 3_600)).await;
    assert_eq!(refused.status(), 200);
    let answer = ExportTraceServiceResponse::decode(refused.bytes().await.unwrap()).unwrap();
    let partial = answer.partial_success.expect("partial success");
    assert_eq!(partial.rejected_spans, 2);
    assert!(
        partial
            .error_message
            .contains("started before the retention period (1m)"),
        "{}",
        partial.error_message
    );
    assert_eq!(get_json(&server, &trace_path(59)).await.0, 404);
    // Within it: stored, and deleted by retention once it has aged past it.
    for (trace, age_s) in [(60, 50), (61, 0)] {
        assert_eq!(
            post(&client, server.otlp_http_addr, aged(trace, age_s))
                .await
                .status(),
            200
        );
    }
    assert_eq!(
        get_json(&server, &trace_path(60)).await.0,
        200,
        "accepted first"
    );
    // Retention passes run every retention/10 (6 s here); wait for one, at most 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while get_json(&server, &trace_path(60)).await.0 != 404 {
        assert!(
            std::time::Instant::now() < deadline,
            "retention did not run"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        get_json(&server, &trace_path(61)).await.0,
        200,
        "recent spans stay"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_allows_only_configured_origins() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--cors-origins", "https://app.example"]).await;
    let client = reqwest::Client::new();
    let preflight = |origin: &'static str| {
        client
            .request(
                reqwest::Method::OPTIONS,
                format!("http://{}/v1/traces", server.otlp_http_addr),
            )
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, authorization",
            )
            .send()
    };
    let allowed = preflight("https://app.example").await.unwrap();
    assert_eq!(
        allowed.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    // A browser exporter may send its token (--otlp-tokens).
    let headers = allowed.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(headers.contains("authorization"), "{headers}");
    let denied = preflight("https://evil.example").await.unwrap();
    assert!(
        denied
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );

    // Without the setting, no CORS headers at all.
    let plain = start(&TestDb::sqlite(), &[]).await;
    let response = client
        .request(
            reqwest::Method::OPTIONS,
            format!("http://{}/v1/traces", plain.otlp_http_addr),
        )
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    plain.shutdown().await;
    server.shutdown().await;
}

/// Waits (bounded) until `condition` holds; the bound only turns a hang into a failure.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "never true: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The analyzer yields to ingest on this signal, so it must be true exactly while more than
/// a quarter of the queue waits for the store, and false again once the store has caught up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_reports_a_backlog_only_while_a_quarter_of_the_queue_waits() {
    use budgetscope::pipeline::ingest::{IngestOptions, Ingestor};
    use budgetscope::store::EncodedBatch;

    let db = TestDb::sqlite();
    let store = store::open(&db.url).await.unwrap();
    let ingestor = Ingestor::start(
        store,
        &IngestOptions {
            max_queued_spans: 100,
            // One job per transaction, so queued jobs cannot ride along with the first.
            max_batch_spans: 1,
            writers: 1,
            own_threads: true,
        },
    );
    assert!(!ingestor.backlogged(), "nothing submitted yet");
    let mut lock = hold_write_lock(&db).await;

    let submit = |trace: u8| {
        let ingestor = ingestor.clone();
        tokio::spawn(async move {
            let batch = EncodedBatch::encode(&common::fixture_trace(
                trace,
                r#"edge server "GET /backlog" 0 10 budget=100"#,
            ));
            let admission = ingestor.admit(batch.len()).unwrap();
            ingestor.commit(admission, batch).await
        })
    };
    // The writer takes the first job and waits for the lock; 25 spans wait in all.
    let mut jobs: Vec<_> = (1..=25).map(submit).collect();
    eventually("25 spans queued", || ingestor.queued_spans() == 25).await;
    assert!(
        !ingestor.backlogged(),
        "a quarter of the queue is not a backlog"
    );
    jobs.push(submit(26));
    eventually("the 26th span makes a backlog", || ingestor.backlogged()).await;

    sqlx::query("ROLLBACK").execute(&mut lock).await.unwrap();
    for job in jobs {
        assert_eq!(job.await.unwrap(), Ok(()));
    }
    assert!(!ingestor.backlogged(), "every job committed");
    ingestor.shutdown().await;
}

/// The SQLite writer has a thread of its own, scheduled as the OS schedules every thread:
/// the product asks the OS for nothing special.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_thread_runs_at_the_default_scheduling() {
    use budgetscope::pipeline::ingest::{IngestOptions, Ingestor};

    let db = TestDb::sqlite();
    let ingestor = Ingestor::start(
        store::open(&db.url).await.unwrap(),
        &IngestOptions {
            max_queued_spans: 100,
            max_batch_spans: 100,
            writers: 1,
            own_threads: true,
        },
    );
    // Each thread's stat line: "tid (name) state ...", the policy is field 41 (proc(5)).
    let writers: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("stat")).ok())
        .filter(|stat| stat.contains("(ingest-writer)"))
        .collect();
    // Other tests in this binary may run writers of their own meanwhile: every one counts.
    assert!(!writers.is_empty(), "a writer thread is running");
    for stat in &writers {
        let (_, fields) = stat.rsplit_once(')').unwrap();
        let policy = fields.split_whitespace().nth(41 - 3).unwrap();
        assert_eq!(policy, "0", "SCHED_OTHER: {stat}");
    }
    ingestor.shutdown().await;
}

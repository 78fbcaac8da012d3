//! Test harness: temporary databases on both backends and a real server on free ports.
//!
//! Postgres: the URL comes from `BUDGETSCOPE_TEST_POSTGRES_URL`, else the local default
//! `postgres://postgres@127.0.0.1:5432/test`. Each test gets its own schema, dropped after.
//! When Postgres cannot be reached, the Postgres half of a test is skipped with a printed
//! reason, unless `BUDGETSCOPE_TEST_POSTGRES_URL` or `CI` is set: then it fails.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use budgetscope::core::model::{
    AttrValue, Scope, Span, SpanId, SpanKind, Status, StatusCode, TraceId,
};
use budgetscope::server::config::{ServeArgs, ServeConfig};
use budgetscope::server::{self, RunningServer};
use sqlx::Connection as _;

pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A throwaway database; dropping it removes the file or schema.
pub struct TestDb {
    pub url: String,
    pub backend: &'static str,
    _dir: Option<tempfile::TempDir>,
    postgres_cleanup: Option<(String, String)>,
}

impl TestDb {
    /// The path of a SQLite database's WAL file.
    pub fn wal_path(&self) -> String {
        format!("{}-wal", self.url.trim_start_matches("sqlite://"))
    }

    pub fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("test.db").display());
        TestDb {
            url,
            backend: "sqlite",
            _dir: Some(dir),
            postgres_cleanup: None,
        }
    }

    /// A fresh schema on the test Postgres, or `None` (with a printed reason) when there
    /// is none and none is required.
    pub async fn postgres() -> Option<TestDb> {
        let explicit = std::env::var("BUDGETSCOPE_TEST_POSTGRES_URL")
            .ok()
            .filter(|url| !url.is_empty());
        let required = explicit.is_some() || std::env::var_os("CI").is_some();
        let base = explicit.unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_string());
        let connect =
            tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&base)).await;
        let mut conn = match connect {
            Ok(Ok(conn)) => conn,
            Ok(Err(error)) if !required => return skip(&base, &error.to_string()),
            Err(_) if !required => return skip(&base, "timed out"),
            Ok(Err(error)) => panic!(
                "Postgres at {base} is required here (CI or BUDGETSCOPE_TEST_POSTGRES_URL) but: {error}"
            ),
            Err(_) => panic!("Postgres at {base} is required here but did not answer within 5 s"),
        };
        let schema = format!("bs_test_{}", unique_suffix());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&mut conn)
            .await
            .expect("create test schema");
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options[search_path]={schema}");
        Some(TestDb {
            url,
            backend: "postgres",
            _dir: None,
            postgres_cleanup: Some((base, schema)),
        })
    }

    /// Runs one statement on a connection of its own, beside the store.
    /// The first column of every row `sql` returns, as text.
    pub async fn texts(&self, sql: &str) -> Vec<String> {
        use sqlx::Connection as _;
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        match self.backend {
            "sqlite" => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
            }
            _ => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
            }
        }
    }

    pub async fn execute(&self, sql: &str) {
        use sqlx::Connection as _;
        let sql = sqlx::AssertSqlSafe(sql.to_string());
        match self.backend {
            "sqlite" => {
                let mut conn = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::query(sql).execute(&mut conn).await.unwrap();
            }
            _ => {
                let mut conn = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::query(sql).execute(&mut conn).await.unwrap();
            }
        };
    }

    /// SQLite always, Postgres when available.
    pub async fn all() -> Vec<TestDb> {
        let mut dbs = vec![TestDb::sqlite()];
        dbs.extend(TestDb::postgres().await);
        dbs
    }
}

fn skip(url: &str, why: &str) -> Option<TestDb> {
    say_skipped(&format!(
        "the Postgres half of this test: {url} is unreachable ({why}). \
         Start Postgres or set BUDGETSCOPE_TEST_POSTGRES_URL to run it."
    ));
    None
}

/// Prints past libtest's output capture (which only takes the print macros), so a skip is
/// visible in a plain `cargo test` run.
pub fn say_skipped(what: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED {what}");
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((base, schema)) = self.postgres_cleanup.take() else {
            return;
        };
        // Drop may run inside a runtime: clean up on a thread with its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&base).await.ok()?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE"
                )))
                .execute(&mut conn)
                .await
                .ok()
            })
        })
        .join();
    }
}

pub fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}{:04x}", nanos, rand::random::<u16>())
}

/// A serve config on free loopback ports, with extra flags.
pub fn config(db: &TestDb, extra: &[&str]) -> ServeConfig {
    let mut argv = vec![
        "serve",
        "--otlp-grpc-addr",
        "127.0.0.1:0",
        "--otlp-http-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
        "--db",
        &db.url,
    ];
    argv.extend_from_slice(extra);
    let args = ServeArgs::try_parse_from(argv).expect("test flags parse");
    args.validate().expect("test config is valid")
}

pub async fn start(db: &TestDb, extra: &[&str]) -> RunningServer {
    server::start(&config(db, extra))
        .await
        .expect("server starts")
}

pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// GET a JSON document from the server's UI/API port.
pub async fn get_json(server: &RunningServer, path: &str) -> (u16, serde_json::Value) {
    let response = reqwest::get(format!("http://{}{}", server.http_addr, path))
        .await
        .expect("GET");
    let status = response.status().as_u16();
    let body = response.bytes().await.expect("body");
    let json = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{path} answered non-JSON ({e}): {}",
            String::from_utf8_lossy(&body)
        )
    });
    (status, json)
}

/// Fixture spans as an OTLP export request (one `ResourceSpans` per service), moved so the
/// trace ends `ago_ms` before now (fixtures are dated 2023; retention would delete them).
pub fn otlp_request(
    spans: &[budgetscope::core::model::Span],
    ago_ms: u64,
) -> opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
    use budgetscope::core::model::AttrValue;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

    let end = spans.iter().map(|s| s.end_unix_nano).max().unwrap_or(0);
    let shift = (now_nanos() - ago_ms * 1_000_000).saturating_sub(end);
    let value = |v: &AttrValue| {
        Some(AnyValue {
            value: Some(match v {
                AttrValue::String(s) => Value::StringValue(s.clone()),
                AttrValue::Int(i) => Value::IntValue(*i),
                AttrValue::Double(d) => Value::DoubleValue(*d),
                AttrValue::Bool(b) => Value::BoolValue(*b),
                other => Value::StringValue(format!("{other:?}")),
            }),
        })
    };
    let kv = |k: &str, v: &AttrValue| KeyValue {
        key: k.to_string(),
        value: value(v),
        ..Default::default()
    };
    let mut services: Vec<&str> = spans.iter().map(|s| s.service.as_str()).collect();
    services.sort();
    services.dedup();
    let resource_spans = services
        .into_iter()
        .map(|service| ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", &AttrValue::String(service.to_string()))],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: spans
                    .iter()
                    .filter(|s| s.service == service)
                    .map(|s| Span {
                        trace_id: s.trace_id.0.to_vec(),
                        span_id: s.span_id.0.to_vec(),
                        parent_span_id: s.parent_span_id.map(|p| p.0.to_vec()).unwrap_or_default(),
                        name: s.name.clone(),
                        kind: s.kind.as_i32(),
                        start_time_unix_nano: s.start_unix_nano + shift,
                        end_time_unix_nano: s.end_unix_nano + shift,
                        attributes: s.attributes.iter().map(|(k, v)| kv(k, v)).collect(),
                        status: Some(Status {
                            code: s.status.code.as_i32(),
                            message: s.status.message.clone(),
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest { resource_spans }
}

/// Posts an OTLP request as protobuf to the server's OTLP/HTTP port; panics unless 200.
pub async fn post_otlp(
    server: &RunningServer,
    request: &opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
) {
    use prost::Message as _;
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", server.otlp_http_addr))
        .header("content-type", "application/x-protobuf")
        .body(request.encode_to_vec())
        .send()
        .await
        .expect("export");
    assert_eq!(response.status(), 200);
}

/// A plain-text fixture (`budgetscope::core::analyze::fixture`) with its own trace id.
pub fn fixture_trace(id: u8, text: &str) -> Vec<Span> {
    let mut spans = budgetscope::core::analyze::fixture::parse(text);
    for span in &mut spans {
        span.trace_id = budgetscope::core::model::TraceId([id; 16]);
    }
    spans
}

/// A real OpenTelemetry SDK provider for `service` exporting each span over OTLP/HTTP
/// (protobuf) to `endpoint` (`http://host:port`) as it ends.
pub fn otel_provider(endpoint: &str, service: &str) -> opentelemetry_sdk::trace::SdkTracerProvider {
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .build()
        .expect("exporter builds");
    opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_string())
                .with_attribute(opentelemetry::KeyValue::new(
                    "host.name",
                    format!("{service}-1"),
                ))
                .build(),
        )
        .build()
}

/// GET a page or document from the server's UI/API port, as text.
pub async fn get_text(server: &RunningServer, path: &str) -> String {
    reqwest::get(format!("http://{}{}", server.http_addr, path))
        .await
        .expect("GET")
        .text()
        .await
        .expect("body")
}

/// Waits (up to 30 s) until `GET /api/traces?{query}` lists `trace_id`: the background
/// analyzer has summarised it, so search, overview and hop pages include it.
pub async fn wait_until_searchable(server: &RunningServer, query: &str, trace_id: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !get_text(server, &format!("/api/traces?{query}"))
        .await
        .contains(trace_id)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "trace {trace_id} was never analysed (searched ?{query})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One GET through the router (`web::app(state).oneshot`), no socket: status, headers, body.
pub async fn oneshot(
    state: &budgetscope::web::AppState,
    uri: &str,
) -> (axum::http::StatusCode, axum::http::HeaderMap, String) {
    use tower::ServiceExt as _;
    let response = budgetscope::web::app(state.clone())
        .oneshot(
            axum::http::Request::get(uri)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// The inflated-checkout trace of docs/budget-semantics.md (edge forwards a fresh 5 s timeout
/// with 780 ms left; inventory takes 1.49 s), moved to end about a minute ago.
pub fn checkout_a_minute_ago() -> Vec<Span> {
    let mut spans = budgetscope::core::analyze::fixture::parse(
        r#"
edge server "GET /checkout" 0 1540 budget=800
  edge client "GET /stock" 20 1500 budget=5000
    inventory server "GET /stock" 25 1490 budget=5000
"#,
    );
    a_minute_ago(&mut spans);
    spans
}

/// Moves fixture spans (dated 2023, which retention would delete) to a minute ago.
pub fn a_minute_ago(spans: &mut [Span]) {
    let shift = now_nanos() - 60_000_000_000 - budgetscope::core::analyze::fixture::BASE_UNIX_NANO;
    for span in spans {
        span.start_unix_nano += shift;
        span.end_unix_nano += shift;
    }
}

/// A span with no attributes, events or links, for store tests.
pub fn span(trace: u8, id: u8, parent: Option<u8>, service: &str, name: &str, start: u64) -> Span {
    Span {
        trace_id: TraceId([trace; 16]),
        span_id: SpanId([id; 8]),
        parent_span_id: parent.map(|p| SpanId([p; 8])),
        service: service.into(),
        name: name.into(),
        kind: SpanKind::Server,
        start_unix_nano: start,
        end_unix_nano: start + 1_000_000,
        status: Status {
            code: StatusCode::Unset,
            message: String::new(),
        },
        attributes: vec![],
        resource: std::sync::Arc::new(vec![(
            "service.name".into(),
            AttrValue::String(service.into()),
        )]),
        scope: Scope::default(),
        events: vec![],
        links: vec![],
        budget: None,
        warnings: vec![],
    }
}

/// Batch `batch` of 1,000 one-span traces named "bulk" carrying `padding`; `tag` (a high bit)
/// keeps one test's trace ids apart from another's.
pub fn bulk_spans(batch: u32, tag: u128, padding: &str) -> Vec<Span> {
    (0..1_000u32)
        .map(|i| {
            let mut s = span(0, 0, None, "bulk", padding, 1_000);
            s.trace_id =
                TraceId::from_bytes(&(u128::from(batch) << 32 | u128::from(i) | tag).to_be_bytes())
                    .unwrap();
            s.span_id = SpanId::from_bytes(&(u64::from(i) + 1).to_be_bytes()).unwrap();
            s
        })
        .collect()
}

/// The size of the file at `path`, 0 when there is none (a WAL not yet created).
pub fn file_size(path: &str) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// A self-signed certificate for localhost and 127.0.0.1, written as `cert.pem` and
/// `key.pem` in `dir`; returns the certificate for clients to trust.
pub fn write_certificate(dir: &std::path::Path) -> rustls::pki_types::CertificateDer<'static> {
    let generated =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    std::fs::write(dir.join("cert.pem"), generated.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), generated.signing_key.serialize_pem()).unwrap();
    generated.cert.der().clone()
}

/// A server whose listeners speak TLS with a new self-signed certificate written in `dir`
/// (`cert.pem`, `key.pem`), and that certificate for clients to trust.
pub async fn start_with_tls(
    db: &TestDb,
    dir: &std::path::Path,
) -> (RunningServer, rustls::pki_types::CertificateDer<'static>) {
    let root = write_certificate(dir);
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let flags = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    (start(db, &flags).await, root)
}

/// The OTLP/JSON fixture `tests/fixtures/NAME`, its spans moved from the fixtures' fixed
/// time (2023, which retention refuses) to a minute ago.
pub fn fixture_json_a_minute_ago(name: &str) -> Vec<u8> {
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .expect("fixture");
    let mut body: serde_json::Value = serde_json::from_str(&text).expect("fixture JSON");
    let shift = now_nanos() - 60_000_000_000 - budgetscope::core::analyze::fixture::BASE_UNIX_NANO;
    for resource in body["resourceSpans"].as_array_mut().into_iter().flatten() {
        for scope in resource["scopeSpans"].as_array_mut().into_iter().flatten() {
            for span in scope["spans"].as_array_mut().into_iter().flatten() {
                for key in ["startTimeUnixNano", "endTimeUnixNano"] {
                    let time: u64 = span[key]
                        .as_str()
                        .expect("times as strings")
                        .parse()
                        .unwrap();
                    span[key] = serde_json::json!((time + shift).to_string());
                }
            }
        }
    }
    serde_json::to_vec(&body).unwrap()
}

/// The analyzer's options with no quiet period and the server's defaults otherwise.
pub fn analyzer_options() -> budgetscope::pipeline::analyzer::AnalyzerOptions {
    use budgetscope::pipeline::memory::{DEFAULT_LIMIT, MemoryBudget};
    budgetscope::pipeline::analyzer::AnalyzerOptions {
        quiet_period: Duration::ZERO,
        max_trace_wait: Duration::from_secs(300),
        analyze: Default::default(),
        metrics: Default::default(),
        memory: MemoryBudget::for_limit(DEFAULT_LIMIT),
        held: budgetscope::pipeline::held::HeldTraces::new(&MemoryBudget::for_limit(DEFAULT_LIMIT)),
    }
}

/// Analyses every trace waiting in `store`, as the background analyzer does, with no quiet
/// period and the default options.
pub async fn analyse_waiting(store: &dyn budgetscope::store::Store) {
    use budgetscope::pipeline::analyzer::analysis_pass;
    let options = analyzer_options();
    while analysis_pass(store, &options).await.unwrap().more {}
    // And, as the analyzer does between passes, their rows move into blocks: the tests
    // then read analysed traces the way a running server keeps them.
    while budgetscope::pipeline::analyzer::compact_queued(store, &options)
        .await
        .unwrap()
        .1
        > 0
    {}
}

/// A three-hop chain (fixture text) with no flag that ends in time: a healthy trace.
pub const HEALTHY_CHAIN: &str = r#"
edge server "GET /" 0 100 budget=1000
  edge client "GET /x" 5 90 budget=990
    x server "GET /x" 6 88 budget=989
"#;

/// The same chain running past its budget: exceeded, so never healthy.
pub const EXCEEDED_CHAIN: &str = r#"
edge server "GET /" 0 1400 budget=1000
  edge client "GET /x" 5 1390 budget=990
    x server "GET /x" 6 1388 budget=989
"#;

//! Real OpenTelemetry SDK exporters → a real budgetscope server → the read API, on every
//! transport (gRPC, HTTP/protobuf, HTTP/JSON), with and without gzip, on both stores.

mod common;

use common::{TestDb, get_json, start};
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_otlp::{
    Compression, Protocol, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;

#[derive(Debug, Clone, Copy)]
enum Transport {
    Grpc,
    HttpProto,
    HttpJson,
}

/// Exports one two-span trace (checkout SERVER → its CLIENT call) and returns its id.
/// Runs on a blocking thread: the HTTP exporter uses a blocking client and the SDK's
/// shutdown blocks.
fn export_trace(
    transport: Transport,
    gzip: bool,
    endpoint: String,
    runtime: tokio::runtime::Handle,
) -> String {
    let _entered = runtime.enter();
    let exporter = match transport {
        Transport::Grpc => {
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint);
            if gzip {
                builder.with_compression(Compression::Gzip).build()
            } else {
                builder.build()
            }
        }
        Transport::HttpProto | Transport::HttpJson => {
            let protocol = if matches!(transport, Transport::HttpJson) {
                Protocol::HttpJson
            } else {
                Protocol::HttpBinary
            };
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{endpoint}/v1/traces"))
                .with_protocol(protocol);
            if gzip {
                builder.with_compression(Compression::Gzip).build()
            } else {
                builder.build()
            }
        }
    }
    .expect("exporter builds");
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("checkout")
                .with_attribute(KeyValue::new("deployment.environment", "test"))
                .build(),
        )
        .build();
    let tracer = provider.tracer("budgetscope-tests");
    let server_span = tracer
        .span_builder("POST /checkout <b>")
        .with_kind(SpanKind::Server)
        .with_attributes([
            KeyValue::new("deadline.remaining_ms", 800_i64),
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("retry.ratio", 0.25),
            KeyValue::new("cached", false),
        ])
        .start(&tracer);
    let cx = Context::current_with_span(server_span);
    let trace_id = cx.span().span_context().trace_id().to_string();
    let mut call = tracer
        .span_builder("GET /stock")
        .with_kind(SpanKind::Client)
        .with_attributes([
            KeyValue::new(
                "http.request.header.x-request-budget-ms",
                Value::Array(Array::String(vec![StringValue::from("700")])),
            ),
            KeyValue::new("server.address", "inventory"),
        ])
        .start_with_context(&tracer, &cx);
    call.add_event("retrying", vec![KeyValue::new("attempt", 2_i64)]);
    call.set_status(Status::error("upstream timed out"));
    call.end();
    cx.span().end();
    provider.shutdown().expect("exporter flushes on shutdown");
    trace_id
}

async fn check_transport(transport: Transport, gzip: bool) {
    for db in TestDb::all().await {
        let server = start(&db, &[]).await;
        let endpoint = match transport {
            Transport::Grpc => format!("http://{}", server.otlp_grpc_addr),
            _ => format!("http://{}", server.otlp_http_addr),
        };
        let handle = tokio::runtime::Handle::current();
        let trace_id =
            tokio::task::spawn_blocking(move || export_trace(transport, gzip, endpoint, handle))
                .await
                .unwrap();
        let context = format!("{transport:?} gzip={gzip} on {}", db.backend);

        let (status, trace) = get_json(&server, &format!("/api/traces/{trace_id}")).await;
        assert_eq!(status, 200, "{context}: {trace}");
        assert_eq!(trace["trace_id"], trace_id, "{context}");
        let spans = trace["spans"].as_array().unwrap();
        assert_eq!(spans.len(), 2, "{context}: {trace}");
        let root = spans
            .iter()
            .find(|s| s["kind"] == "server")
            .expect("server span");
        let call = spans
            .iter()
            .find(|s| s["kind"] == "client")
            .expect("client span");

        assert_eq!(root["service"], "checkout", "{context}");
        assert_eq!(
            root["name"], "POST /checkout <b>",
            "{context}: names are stored verbatim"
        );
        assert_eq!(root["parent_span_id"], serde_json::Value::Null, "{context}");
        assert_eq!(root["budget_ms"], 800.0, "{context}");
        assert_eq!(root["budget_source"], "deadline.remaining_ms", "{context}");
        assert_eq!(
            root["attributes"]["http.request.method"], "POST",
            "{context}"
        );
        assert_eq!(root["attributes"]["retry.ratio"], 0.25, "{context}");
        assert_eq!(root["attributes"]["cached"], false, "{context}");
        assert_eq!(
            root["resource"]["deployment.environment"], "test",
            "{context}"
        );
        assert_eq!(root["scope"]["name"], "budgetscope-tests", "{context}");
        let start = root["start_unix_nano"].as_u64().unwrap();
        let end = root["end_unix_nano"].as_u64().unwrap();
        assert!(start > 0 && end >= start, "{context}");

        assert_eq!(call["parent_span_id"], root["span_id"], "{context}");
        assert_eq!(call["budget_ms"], 700.0, "{context}");
        assert_eq!(
            call["budget_source"], "http.request.header.x-request-budget-ms",
            "{context}"
        );
        assert_eq!(call["status"]["code"], "error", "{context}");
        assert_eq!(call["status"]["message"], "upstream timed out", "{context}");
        assert_eq!(call["events"][0]["name"], "retrying", "{context}");
        assert_eq!(call["events"][0]["attributes"]["attempt"], 2, "{context}");

        let (_, services) = get_json(&server, "/api/services").await;
        assert_eq!(
            services["services"],
            serde_json::json!(["checkout"]),
            "{context}"
        );
        let (_, operations) = get_json(&server, "/api/services/checkout/operations").await;
        assert_eq!(
            operations["operations"],
            serde_json::json!([
                {"name": "GET /stock", "kind": "client"},
                {"name": "POST /checkout <b>", "kind": "server"},
            ]),
            "{context}"
        );
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_plain() {
    check_transport(Transport::Grpc, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_gzip() {
    check_transport(Transport::Grpc, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_plain() {
    check_transport(Transport::HttpProto, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protobuf_gzip() {
    check_transport(Transport::HttpProto, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_json_plain() {
    check_transport(Transport::HttpJson, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_json_gzip() {
    check_transport(Transport::HttpJson, true).await;
}

/// The gRPC server lets an exporter have 16 MiB in flight on one connection before it
/// waits for flow-control acknowledgements, as grpc-go's servers do at most; at hyper's
/// default of 1 MiB, exports of 512 spans committed 4 % fewer spans per second
/// (BENCHMARKS.md). Read off the WINDOW_UPDATE with which the server opens the
/// connection's window past HTTP/2's initial 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_connection_window_fits_many_exports() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const FRAME_SETTINGS: u8 = 0x4;
    const FRAME_WINDOW_UPDATE: u8 = 0x8;
    const INITIAL_WINDOW: u32 = 65_535;

    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    let mut stream = tokio::net::TcpStream::connect(server.otlp_grpc_addr)
        .await
        .unwrap();
    // The client preface and an empty SETTINGS frame.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, FRAME_SETTINGS, 0, 0, 0, 0, 0]);
    stream.write_all(&hello).await.unwrap();

    let mut connection_window = None;
    let read_frames = async {
        while connection_window.is_none() {
            let mut header = [0u8; 9];
            stream.read_exact(&mut header).await.unwrap();
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let stream_id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
            let mut payload = vec![0u8; length];
            stream.read_exact(&mut payload).await.unwrap();
            if header[3] == FRAME_WINDOW_UPDATE && stream_id == 0 {
                let increment =
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                connection_window = Some(INITIAL_WINDOW + (increment & 0x7fff_ffff));
            }
        }
    };
    // A server that kept the initial window would send no WINDOW_UPDATE: the wait times
    // out, and the assertion names what was missing.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), read_frames).await;
    assert!(
        connection_window.is_some_and(|w| w >= 16 << 20),
        "connection window {connection_window:?}, want at least 16 MiB"
    );
}

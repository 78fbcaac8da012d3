//! Bad input at the OTLP receivers: every case gets a clear status and message, nothing
//! panics, and the valid spans sent beside invalid ones are stored. Runs on both stores.

mod common;

use std::io::Write as _;

use base64::Engine as _;
use common::{TestDb, get_json, now_nanos, start};
use flate2::Compression;
use flate2::write::GzEncoder;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use serde_json::{Value, json};

/// The limit the test server runs with, so oversize cases stay small.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

fn trace_hex(n: u8) -> String {
    format!(
        "{:032x}",
        u128::from(n) + 0xabc0_0000_0000_0000_0000_0000_0000_0000
    )
}

fn span_json(trace: u8, span: u8, name: &str) -> Value {
    let start = now_nanos();
    json!({
        "traceId": trace_hex(trace),
        "spanId": format!("{:016x}", u64::from(span) + 0x1000),
        "name": name,
        "kind": 2,
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": (start + 5_000_000).to_string(),
    })
}

fn json_request(spans: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "edge"}}]},
        "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}],
    }]}))
    .unwrap()
}

fn proto_span(trace: u8, span: u8, name: &str) -> Span {
    let start = now_nanos();
    Span {
        trace_id: u128::from_str_radix(&trace_hex(trace), 16)
            .unwrap()
            .to_be_bytes()
            .to_vec(),
        span_id: (u64::from(span) + 0x1000).to_be_bytes().to_vec(),
        name: name.into(),
        kind: 2,
        start_time_unix_nano: start,
        end_time_unix_nano: start + 5_000_000,
        ..Default::default()
    }
}

fn proto_request(spans: Vec<Span>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("edge".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// Replaces `marker` (same length) in an encoded body, to forge bytes encoders refuse.
fn forge(mut body: Vec<u8>, marker: &[u8], replacement: &[u8]) -> Vec<u8> {
    assert_eq!(marker.len(), replacement.len());
    let at = body
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("marker in body");
    body[at..at + marker.len()].copy_from_slice(replacement);
    body
}

struct Case {
    name: &'static str,
    content_type: &'static str,
    encoding: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    /// A part of the response's message (JSON `message`/`errorMessage`, or protobuf text).
    message: &'static str,
    /// The trace whose stored span names are checked, and those names.
    stored: Option<(u8, Vec<&'static str>)>,
}

fn cases() -> Vec<Case> {
    let json_ct = "application/json";
    let proto_ct = "application/x-protobuf";
    let mut cases = vec![
        Case {
            name: "enum names instead of integers",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![{
                let mut s = span_json(1, 1, "x");
                s["kind"] = json!("SPAN_KIND_SERVER");
                s
            }]),
            // Protobuf's JSON mapping allows enum names.
            status: 200,
            message: "",
            stored: Some((1, vec!["x"])),
        },
        Case {
            name: "base64 ids",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![{
                let mut s = span_json(2, 1, "x");
                // The mapping's base64 for bytes, of the right length, instead of hex.
                s["traceId"] = json!(
                    base64::engine::general_purpose::STANDARD
                        .encode(hex::decode(trace_hex(2)).unwrap())
                );
                s
            }]),
            status: 200,
            message: "",
            stored: Some((2, vec!["x"])),
        },
        Case {
            name: "null parentSpanId",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![{
                let mut s = span_json(3, 1, "x");
                s["parentSpanId"] = Value::Null;
                s
            }]),
            // Null is the mapping's default value.
            status: 200,
            message: "",
            stored: Some((3, vec!["x"])),
        },
        Case {
            name: "float timestamp",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![{
                let mut s = span_json(4, 1, "x");
                s["startTimeUnixNano"] = json!(1.5e18);
                s
            }]),
            // No mapping allows a fraction: the span is rejected, the request answered.
            status: 200,
            message: "rejected 1 of 1 spans: not valid OTLP/JSON",
            stored: None,
        },
        Case {
            name: "a broken span next to a good one",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![span_json(21, 1, "good"), {
                let mut s = span_json(21, 2, "broken");
                s["endTimeUnixNano"] = json!(-5);
                s
            }]),
            status: 200,
            message: "rejected 1 of 2 spans: not valid OTLP/JSON",
            stored: Some((21, vec!["good"])),
        },
        Case {
            name: "a byte-order mark",
            content_type: json_ct,
            encoding: None,
            body: [
                "\u{FEFF}".as_bytes(),
                &json_request(vec![span_json(22, 1, "x")]),
            ]
            .concat(),
            status: 200,
            message: "",
            stored: Some((22, vec!["x"])),
        },
        Case {
            name: "truncated JSON",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![span_json(5, 1, "x")])[..40].to_vec(),
            status: 400,
            message: "not valid OTLP/JSON",
            stored: None,
        },
        Case {
            name: "truncated protobuf",
            content_type: proto_ct,
            encoding: None,
            body: {
                let body = proto_request(vec![proto_span(6, 1, "x")]).encode_to_vec();
                body[..body.len() - 7].to_vec()
            },
            status: 400,
            message: "not a valid OTLP ExportTraceServiceRequest protobuf",
            stored: None,
        },
        Case {
            name: "wrong content type",
            content_type: "text/plain",
            encoding: None,
            body: b"hello".to_vec(),
            status: 415,
            message: "unsupported Content-Type \"text/plain\"",
            stored: None,
        },
        Case {
            name: "unsupported encoding",
            content_type: json_ct,
            encoding: Some("br"),
            body: json_request(vec![span_json(7, 1, "x")]),
            status: 415,
            message: "unsupported Content-Encoding \"br\"",
            stored: None,
        },
        Case {
            name: "gzip header but not gzip",
            content_type: proto_ct,
            encoding: Some("gzip"),
            body: b"definitely not gzip".to_vec(),
            status: 400,
            message: "does not gunzip",
            stored: None,
        },
        Case {
            name: "oversized body",
            content_type: json_ct,
            encoding: None,
            body: vec![b' '; MAX_REQUEST_BYTES + 1],
            status: 413,
            message: "request body is over 65536 bytes (its Content-Length);",
            stored: None,
        },
        Case {
            name: "gzip bomb",
            content_type: proto_ct,
            encoding: Some("gzip"),
            body: gzip(&vec![0u8; 50 * 1024 * 1024]),
            status: 413,
            message: "after gzip decompression",
            stored: None,
        },
        Case {
            name: "empty protobuf request is a success",
            content_type: proto_ct,
            encoding: None,
            body: Vec::new(),
            status: 200,
            message: "",
            stored: None,
        },
        Case {
            name: "invalid spans beside valid ones (JSON)",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![
                {
                    let mut s = span_json(10, 1, "short span id");
                    s["spanId"] = json!("abcd");
                    s
                },
                {
                    // snake_case keys are unknown fields: the trace id stays empty.
                    let mut s = span_json(10, 2, "snake case");
                    let id = s.as_object_mut().unwrap().remove("traceId").unwrap();
                    s["trace_id"] = id;
                    s
                },
                span_json(10, 3, "good"),
            ]),
            status: 200,
            message: "rejected 2 of 3 spans: span id is 2 bytes long, expected 8",
            stored: Some((10, vec!["good"])),
        },
        Case {
            // Retention (7 days by default) would delete it at its next pass: the answer
            // says so instead of acknowledging a span that is gone a minute later.
            name: "a span older than the retention beside a current one",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![
                {
                    let mut s = span_json(16, 1, "last week");
                    let start = now_nanos() - 8 * 86_400 * 1_000_000_000;
                    s["startTimeUnixNano"] = json!(start.to_string());
                    s["endTimeUnixNano"] = json!((start + 5_000_000).to_string());
                    s
                },
                span_json(16, 2, "now"),
            ]),
            status: 200,
            message: "rejected 1 of 2 spans: started before the retention period (7days)",
            stored: Some((16, vec!["now"])),
        },
        Case {
            name: "absurd timestamps beside a valid span (protobuf)",
            content_type: proto_ct,
            encoding: Some("gzip"),
            body: gzip(
                &proto_request(vec![
                    {
                        let mut s = proto_span(11, 1, "future");
                        s.start_time_unix_nano += 400 * 86_400 * 1_000_000_000;
                        s.end_time_unix_nano = s.start_time_unix_nano + 1;
                        s
                    },
                    {
                        let mut s = proto_span(11, 2, "backwards");
                        s.end_time_unix_nano = s.start_time_unix_nano - 1;
                        s
                    },
                    {
                        let mut s = proto_span(11, 3, "zero start");
                        s.start_time_unix_nano = 0;
                        s
                    },
                    {
                        let mut s = proto_span(11, 4, "beyond 2262");
                        s.end_time_unix_nano = u64::MAX;
                        s
                    },
                    {
                        let mut s = proto_span(11, 6, "zero span id");
                        s.span_id = vec![0; 8];
                        s
                    },
                    proto_span(11, 5, "good"),
                ])
                .encode_to_vec(),
            ),
            status: 200,
            message: "rejected 5 of 6 spans",
            stored: Some((11, vec!["good"])),
        },
        Case {
            name: "HTML and NUL in names are stored as text",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![
                span_json(12, 1, "<script>alert(1)</script>"),
                span_json(12, 2, "\"><img src=x onerror=alert(1)>"),
                span_json(12, 3, "nul\u{0}byte"),
            ]),
            status: 200,
            message: "",
            stored: Some((
                12,
                vec![
                    "<script>alert(1)</script>",
                    "\"><img src=x onerror=alert(1)>",
                    "nul\u{FFFD}byte",
                ],
            )),
        },
        Case {
            // budgetscope's JSON decoder leaves these to opentelemetry-proto's (bytes
            // values, empty and null AnyValues); both spans must still be stored.
            name: "JSON forms the fast decoder declines are still read",
            content_type: json_ct,
            encoding: None,
            body: json_request(vec![
                {
                    let mut s = span_json(15, 1, "bytes and empty values");
                    s["attributes"] = json!([
                        {"key": "b", "value": {"bytesValue": "aGk="}},
                        {"key": "e", "value": {}},
                        {"key": "n", "value": {"intValue": null}},
                    ]);
                    s
                },
                span_json(15, 2, "plain"),
            ]),
            status: 200,
            message: "",
            stored: Some((15, vec!["bytes and empty values", "plain"])),
        },
        Case {
            name: "non-UTF-8 JSON is repaired, not refused",
            content_type: "application/json; charset=utf-8",
            encoding: None,
            body: forge(
                json_request(vec![span_json(13, 1, "caf__")]),
                b"caf__",
                b"caf\xc3\x28",
            ),
            status: 200,
            message: "",
            stored: Some((13, vec!["caf\u{FFFD}("])),
        },
        Case {
            name: "non-UTF-8 protobuf string is repaired, not refused",
            content_type: proto_ct,
            encoding: None,
            body: forge(
                proto_request(vec![proto_span(14, 1, "bad__"), proto_span(14, 2, "good")])
                    .encode_to_vec(),
                b"bad__",
                b"bad\xff\xfe",
            ),
            status: 200,
            message: "",
            stored: Some((14, vec!["bad\u{FFFD}\u{FFFD}", "good"])),
        },
    ];
    // Nested past prost's recursion limit (a key-value list 40 deep): cut, not refused.
    let mut deep = proto_span(25, 1, "deep");
    let mut value = any_value::Value::StringValue("bottom".into());
    for _ in 0..40 {
        value =
            any_value::Value::KvlistValue(opentelemetry_proto::tonic::common::v1::KeyValueList {
                values: vec![KeyValue {
                    key: "k".into(),
                    value: Some(AnyValue { value: Some(value) }),
                    ..Default::default()
                }],
            });
    }
    deep.attributes = vec![KeyValue {
        key: "deep".into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }];
    cases.push(Case {
        name: "an attribute nested 40 deep",
        content_type: proto_ct,
        encoding: None,
        body: proto_request(vec![deep, proto_span(25, 2, "good")]).encode_to_vec(),
        status: 200,
        message: "",
        stored: Some((25, vec!["deep", "good"])),
    });
    for (trace, name, mutate, status, message) in [
        // The mapping's default for a missing list is empty.
        (
            20,
            "arrayValue without values",
            r#"{"arrayValue":{}}"#,
            200,
            "",
        ),
        // A bare NaN is no JSON; the string "NaN" is the mapping's.
        (
            23,
            "NaN double",
            r#"{"doubleValue":NaN}"#,
            400,
            "not valid OTLP/JSON",
        ),
        (
            24,
            "NaN double as the mapping writes it",
            r#"{"doubleValue":"NaN"}"#,
            200,
            "",
        ),
    ] {
        let mut span = span_json(trace, 1, "x");
        span["attributes"] = json!([{"key": "k", "value": "PLACEHOLDER"}]);
        let text =
            serde_json::to_string(&json!({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}))
                .unwrap()
                .replace("\"PLACEHOLDER\"", mutate);
        cases.push(Case {
            name,
            content_type: json_ct,
            encoding: None,
            body: text.into_bytes(),
            status,
            message,
            stored: (status == 200).then(|| (trace, vec!["x"])),
        });
    }
    cases
}

fn response_message(content_type: &str, body: &[u8]) -> String {
    if content_type.starts_with("application/json") {
        let value: Value =
            serde_json::from_slice(body).unwrap_or_else(|e| panic!("JSON reply ({e}): {body:?}"));
        value["message"]
            .as_str()
            .or(value["partialSuccess"]["errorMessage"].as_str())
            .unwrap_or_default()
            .to_string()
    } else {
        // google.rpc.Status and ExportTraceServiceResponse both carry their text as field 2
        // of some message: a lossy view of the bytes is enough to find it.
        String::from_utf8_lossy(body).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_http_input_gets_a_clear_answer_and_good_spans_are_kept() {
    let max = MAX_REQUEST_BYTES.to_string();
    for db in TestDb::all().await {
        let server = start(&db, &["--max-request-bytes", &max]).await;
        let client = reqwest::Client::new();
        for case in cases() {
            let context = format!("{} on {}", case.name, db.backend);
            let mut request = client
                .post(format!("http://{}/v1/traces", server.otlp_http_addr))
                .header("content-type", case.content_type)
                .body(case.body);
            if let Some(encoding) = case.encoding {
                request = request.header("content-encoding", encoding);
            }
            let response = request
                .send()
                .await
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            let status = response.status().as_u16();
            if case.message.contains("(its Content-Length)") {
                // The body was left unread: the client must not reuse the connection.
                assert_eq!(
                    response.headers().get("connection").map(|v| v.as_bytes()),
                    Some(&b"close"[..]),
                    "{context}"
                );
            }
            let reply_type = response
                .headers()
                .get("content-type")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            let body = response.bytes().await.unwrap();
            let message = response_message(&reply_type, &body);
            assert_eq!(status, case.status, "{context}: {message}");
            assert!(
                message.contains(case.message),
                "{context}: {message:?} lacks {:?}",
                case.message
            );
            if status == 200 && case.message.is_empty() {
                assert_eq!(message, "", "{context}: every span was taken");
            }
            if status >= 400 {
                assert!(
                    !message.is_empty(),
                    "{context}: an error must say what is wrong"
                );
            }
            if case.content_type == "application/x-protobuf" {
                assert_eq!(
                    reply_type, "application/x-protobuf",
                    "{context}: reply in the request's format"
                );
            } else {
                assert_eq!(reply_type, "application/json", "{context}");
            }
            if let Some((trace, names)) = case.stored {
                let (code, trace) =
                    get_json(&server, &format!("/api/traces/{}", trace_hex(trace))).await;
                assert_eq!(code, 200, "{context}: {trace}");
                let stored: Vec<&str> = trace["spans"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s["name"].as_str().unwrap())
                    .collect();
                assert_eq!(stored, names, "{context}");
            }
        }
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repaired_text_carries_a_warning() {
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    let body = forge(
        json_request(vec![span_json(30, 1, "caf__")]),
        b"caf__",
        b"caf\xc3\x28",
    );
    let response = reqwest::Client::new()
        .post(format!("http://{}/v1/traces", server.otlp_http_addr))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (_, trace) = get_json(&server, &format!("/api/traces/{}", trace_hex(30))).await;
    let warnings = &trace["spans"][0]["warnings"];
    assert!(
        warnings[0].as_str().unwrap().contains("not valid UTF-8"),
        "{warnings}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_reports_partial_success_and_keeps_the_valid_spans() {
    for db in TestDb::all().await {
        let server = start(&db, &[]).await;
        let mut client = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr))
            .await
            .unwrap();
        let mut bad = proto_span(40, 1, "bad trace id");
        bad.trace_id = vec![1; 5];
        let response = client
            .export(proto_request(vec![bad, proto_span(40, 2, "good")]))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", db.backend))
            .into_inner();
        let partial = response.partial_success.expect("partial success is set");
        assert_eq!(partial.rejected_spans, 1, "{}", db.backend);
        assert!(
            partial
                .error_message
                .starts_with("rejected 1 of 2 spans: trace id is 5 bytes long, expected 16"),
            "{}",
            partial.error_message
        );
        let (_, trace) = get_json(&server, &format!("/api/traces/{}", trace_hex(40))).await;
        assert_eq!(trace["spans"][0]["name"], "good", "{}", db.backend);

        // A fully valid request answers with partial_success unset.
        let ok = client
            .export(proto_request(vec![proto_span(41, 1, "fine")]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ok.partial_success, None, "{}", db.backend);
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refuses_permanent_failures_with_a_code_exporters_do_not_retry() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--max-request-bytes", "64KiB"]).await;
    let mut client = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr))
        .await
        .unwrap();
    // Permanent failures carry INVALID_ARGUMENT, which exporters do not retry (OTLP).
    let big = proto_span(42, 1, &"n".repeat(100 * 1024));
    let status = client
        .export(proto_request(vec![big.clone()]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("--max-request-bytes"),
        "{status:?}"
    );
    // Compressed it is small; decompressed it is over the limit.
    let mut gzip = TraceServiceClient::connect(format!("http://{}", server.otlp_grpc_addr))
        .await
        .unwrap()
        .send_compressed(tonic::codec::CompressionEncoding::Gzip);
    let status = gzip.export(proto_request(vec![big])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // A body that does not decode.
    let channel =
        tonic::transport::Channel::from_shared(format!("http://{}", server.otlp_grpc_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    raw.ready().await.unwrap();
    let status = raw
        .unary::<Vec<u8>, (), _>(
            tonic::Request::new(vec![0xff, 0xff, 0xff]),
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
                .parse()
                .unwrap(),
            RawCodec,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_share_one_json_shape() {
    let db = TestDb::sqlite();
    let server = start(&db, &[]).await;
    for (path, status, code) in [
        ("/api/traces/xyz", 400, "invalid_trace_id"),
        (
            "/api/traces/00000000000000000000000000000000",
            400,
            "invalid_trace_id",
        ),
        (
            "/api/traces/0123456789abcdef0123456789abcdef",
            404,
            "trace_not_found",
        ),
        ("/api/nothing", 404, "not_found"),
    ] {
        let (got, body) = get_json(&server, path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert_eq!(body["error"]["code"], code, "{path}");
        assert_eq!(body["error"]["status"], status, "{path}");
        assert!(
            body["error"]["message"].as_str().unwrap().len() > 20,
            "{path}: says what to do"
        );
    }
    let (status, ready) = get_json(&server, "/readyz").await;
    assert_eq!((status, ready["store"].as_str()), (200, Some("sqlite")));
    let (status, _) = get_json(&server, "/healthz").await;
    assert_eq!(status, 200);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_repairs_non_utf8_instead_of_refusing_the_request() {
    for db in TestDb::all().await {
        let server = start(&db, &[]).await;
        let message = forge(
            proto_request(vec![proto_span(43, 1, "bad__"), proto_span(43, 2, "good")])
                .encode_to_vec(),
            b"bad__",
            b"bad\xff_",
        );
        // A gRPC frame by hand: typed clients cannot send invalid strings.
        let mut frame = vec![0u8];
        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
        frame.extend_from_slice(&message);
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap();
        let response = client
            .post(format!(
                "http://{}/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                server.otlp_grpc_addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(frame)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{}", db.backend);
        let grpc_status = response
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_string());
        let body = response.bytes().await.unwrap();
        // Success carries an (empty) response message frame; errors are trailers-only.
        assert!(
            grpc_status.is_none() && body.len() >= 5,
            "{}: status {grpc_status:?}",
            db.backend
        );
        let (_, trace) = get_json(&server, &format!("/api/traces/{}", trace_hex(43))).await;
        let names: Vec<&str> = trace["spans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["bad\u{FFFD}_", "good"], "{}", db.backend);
        assert!(
            trace["spans"][0]["warnings"][0]
                .as_str()
                .unwrap()
                .contains("not valid UTF-8")
        );
        server.shutdown().await;
    }
}

/// Sends bytes as they are: a gRPC message no OTLP client would produce.
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut as _;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = ();
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<()>, tonic::Status> {
        use bytes::Buf as _;
        buf.advance(buf.remaining());
        Ok(Some(()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_with_very_long_names_still_has_a_page() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--quiet-period", "100ms"]).await;
    let long = "x%/ ".repeat(20_000);
    let mut request = proto_request(vec![proto_span(44, 1, &long)]);
    request.resource_spans[0]
        .resource
        .as_mut()
        .unwrap()
        .attributes[0]
        .value = Some(AnyValue {
        value: Some(any_value::Value::StringValue(long.clone())),
    });
    common::post_otlp(&server, &request).await;
    let (_, trace) = get_json(&server, &format!("/api/traces/{}", trace_hex(44))).await;
    let span = &trace["spans"][0];
    let (service, name) = (
        span["service"].as_str().unwrap().to_string(),
        span["name"].as_str().unwrap().to_string(),
    );
    assert_eq!(
        (service.chars().count(), name.chars().count()),
        (1024, 1024)
    );
    assert!(
        span["warnings"][0].as_str().unwrap().contains("cut"),
        "{span}"
    );
    // The span's details link its hop, and the link opens the hop's page.
    let page = reqwest::get(format!(
        "http://{}/traces/{}?span={}",
        server.http_addr,
        trace_hex(44),
        span["span_id"].as_str().unwrap()
    ))
    .await
    .unwrap()
    .text()
    .await
    .unwrap();
    let href = page
        .split("href=\"")
        .map(|rest| rest.split('"').next().unwrap())
        .find(|href| href.starts_with("/hops/"))
        .expect("the span's details link its hop")
        .replace("&#38;", "&");
    let hop = reqwest::get(format!("http://{}{href}", server.http_addr))
        .await
        .unwrap();
    assert_eq!(hop.status(), 200, "{} bytes of address", href.len());
    server.shutdown().await;
}

//! One decode path per format, shared by the gRPC and HTTP endpoints and `budgetscope
//! analyze`: `decode_traces` and `decode_metrics` take a body's bytes and return the
//! request, whether text in it had to be repaired, and the spans left out one by one.
//!
//! - Protobuf: the generated OTLP types (the fast path for valid bodies), and for a body
//!   they refuse, the mirror types of `protobuf.rs` / `protobuf_metrics.rs`, which repair
//!   text that is not UTF-8 instead of losing the request; their error is the answer.
//! - JSON traces: text that is not UTF-8 is repaired and a byte-order mark skipped; then
//!   `json::parse` (the fast path), and for a body it declines, `json_spans`, which reads
//!   the request span by span so that one odd span costs only itself; its error is the
//!   answer. Their agreement with opentelemetry-proto's serde types is the differential
//!   test's (`json_tests.rs`).
//! - JSON metrics: the same repair, then opentelemetry-proto's serde types.
//!
//! Architecture invariant: what a body decodes to does not depend on who received it; an
//! error is permanent (the same bytes never decode) and says what to check.

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;

use super::json_spans::Rejection;
use super::normalize::{NormalizeOptions, Normalized, normalize};

/// The warning for a request whose text was not valid UTF-8: on its spans, or in the
/// answer to a metrics request.
pub const REPAIRED_TEXT_WARNING: &str =
    "the request body was not valid UTF-8; invalid bytes were replaced by U+FFFD";

/// How a request body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Protobuf,
    Json,
}

/// A decoded export request.
#[derive(Debug, Default)]
pub struct Decoded<R> {
    pub request: R,
    /// Text that was not UTF-8 was replaced by U+FFFD (`REPAIRED_TEXT_WARNING`).
    pub repaired: bool,
    /// Spans left out by the decoder, each with its reason and a description of the span.
    pub rejected: Vec<Rejection>,
}

/// A body that is not an export request at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct DecodeError {
    pub format: Format,
    /// "ExportTraceServiceRequest" or "ExportMetricsServiceRequest".
    pub message_type: &'static str,
    /// What the decoder found.
    pub reason: String,
}

impl DecodeError {
    fn message(&self) -> String {
        match (self.format, self.message_type) {
            (Format::Protobuf, kind) => format!(
                "request body is not a valid OTLP {kind} protobuf ({})",
                self.reason
            ),
            (Format::Json, TRACES) => format!(
                "request body is not valid OTLP/JSON ({}); OTLP/JSON uses lowerCamelCase keys, \
                 hex trace and span ids, and integer enum values",
                self.reason
            ),
            (Format::Json, _) => format!(
                "request body is not valid OTLP/JSON for metrics ({}); OTLP/JSON uses \
                 lowerCamelCase keys and integer enum values",
                self.reason
            ),
        }
    }
}

const TRACES: &str = "ExportTraceServiceRequest";
const METRICS: &str = "ExportMetricsServiceRequest";

/// Decodes a trace export request body.
pub fn decode_traces(
    body: Bytes,
    format: Format,
) -> Result<Decoded<ExportTraceServiceRequest>, DecodeError> {
    let error = |reason: String| DecodeError {
        format,
        message_type: TRACES,
        reason,
    };
    match format {
        Format::Protobuf => match ExportTraceServiceRequest::decode(body.clone()) {
            Ok(request) => Ok(Decoded {
                request,
                ..Decoded::default()
            }),
            Err(_) => {
                let (request, repaired) =
                    super::protobuf::decode_mirror(body).map_err(|e| error(e.to_string()))?;
                Ok(Decoded {
                    request,
                    repaired,
                    rejected: Vec::new(),
                })
            }
        },
        Format::Json => {
            let (text, repaired) = json_text(&body);
            let text = without_bom(&text);
            if let Some(request) = super::json::parse(text) {
                return Ok(Decoded {
                    request,
                    repaired,
                    rejected: Vec::new(),
                });
            }
            let (request, rejected) = super::json_spans::decode(text).map_err(error)?;
            Ok(Decoded {
                request,
                repaired,
                rejected,
            })
        }
    }
}

/// Decodes a metrics export request body (no data point is left out here: what the deadline
/// metrics cannot read is counted by `deadline_metrics::extract`).
pub fn decode_metrics(
    body: Bytes,
    format: Format,
) -> Result<Decoded<ExportMetricsServiceRequest>, DecodeError> {
    let error = |reason: String| DecodeError {
        format,
        message_type: METRICS,
        reason,
    };
    let (request, repaired) = match format {
        Format::Protobuf => match ExportMetricsServiceRequest::decode(body.clone()) {
            Ok(request) => (request, false),
            Err(_) => {
                super::protobuf_metrics::decode_mirror(body).map_err(|e| error(e.to_string()))?
            }
        },
        Format::Json => {
            let (text, repaired) = json_text(&body);
            let request =
                serde_json::from_str(without_bom(&text)).map_err(|e| error(e.to_string()))?;
            (request, repaired)
        }
    };
    Ok(Decoded {
        request,
        repaired,
        rejected: Vec::new(),
    })
}

/// Normalises a decoded trace request: its spans, with the repair warning on each when text
/// was repaired, and the decoder's rejections beside normalize's own.
pub fn normalize_decoded(
    decoded: Decoded<ExportTraceServiceRequest>,
    options: &NormalizeOptions,
    now_unix_nano: u64,
) -> Normalized {
    let mut normalized = normalize(decoded.request, options, now_unix_nano);
    for (reason, which) in decoded.rejected {
        normalized.reject(reason, which);
    }
    if decoded.repaired {
        for span in &mut normalized.spans {
            span.warnings.push(REPAIRED_TEXT_WARNING.to_string());
        }
    }
    normalized
}

/// A JSON body as text, and whether bytes that were not UTF-8 were replaced (U+FFFD).
fn json_text(body: &[u8]) -> (std::borrow::Cow<'_, str>, bool) {
    match std::str::from_utf8(body) {
        Ok(text) => (std::borrow::Cow::Borrowed(text), false),
        Err(_) => (String::from_utf8_lossy(body), true),
    }
}

/// A byte-order mark is no JSON, but some writers put one first.
fn without_bom(text: &str) -> &str {
    text.strip_prefix('\u{FEFF}').unwrap_or(text)
}

/// The decoders' fixture table: each body, as an exporter sends it, and what the receivers
/// make of it (the spans kept, with their warnings, and the answer's `partial_success`), or
/// the error it is refused with. `UPDATE_EXPECT=1 cargo test --lib decode` rewrites the
/// expectation after a deliberate change.
#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    const NOW: u64 = 1_800_000_000_000_000_000;

    fn span(id: u8, name: &str) -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: vec![id; 8],
            name: name.into(),
            kind: 2,
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_000_050_000_000,
            ..Default::default()
        }
    }

    fn protobuf(spans: Vec<Span>) -> Vec<u8> {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue("checkout".into())),
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
        .encode_to_vec()
    }

    /// A JSON body with the given spans (JSON objects written out).
    fn json(spans: &str) -> Vec<u8> {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"checkout"}}}}]}},"scopeSpans":[{{"spans":[{spans}]}}]}}]}}"#
        )
        .into_bytes()
    }

    const GOOD: &str = r#"{"traceId":"01010101010101010101010101010101","spanId":"0202020202020202","name":"GET /cart","kind":2,"startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000050000000"}"#;

    fn render(body: Vec<u8>, format: Format) -> String {
        match decode_traces(body.into(), format) {
            Err(error) => format!("refused: {error}"),
            Ok(decoded) => {
                let options = NormalizeOptions {
                    budget_keys: crate::core::budget::DEFAULT_BUDGET_KEYS
                        .iter()
                        .map(|k| k.to_string())
                        .collect(),
                    retention: None,
                };
                let normalized = normalize_decoded(decoded, &options, NOW);
                let mut out: Vec<String> = normalized
                    .spans
                    .iter()
                    .map(|s| {
                        let warnings = if s.warnings.is_empty() {
                            String::new()
                        } else {
                            format!(" (warnings: {})", s.warnings.join("; "))
                        };
                        format!("kept {} {:?}{warnings}", s.service, s.name)
                    })
                    .collect();
                if normalized.rejected > 0 {
                    out.push(format!(
                        "partial_success: {} rejected: {}",
                        normalized.rejected,
                        normalized.error_message()
                    ));
                }
                out.join(" | ")
            }
        }
    }

    #[test]
    fn each_body_decodes_to_its_spans_and_answer() {
        let mut bad_utf8 = protobuf(vec![span(2, "GET /c__t")]);
        let at = bad_utf8.windows(4).position(|w| w == b"c__t").unwrap();
        bad_utf8[at + 1] = 0xff;
        let mut bad_json_utf8 = json(&GOOD.replace("GET /cart", "GET /c_rt"));
        let at = bad_json_utf8.windows(4).position(|w| w == b"c_rt").unwrap();
        bad_json_utf8[at + 1] = 0xff;
        let truncated = protobuf(vec![span(2, "GET /cart")]);
        let cases: Vec<(&str, Vec<u8>, Format)> = vec![
            (
                "protobuf",
                protobuf(vec![span(2, "GET /cart"), span(3, "GET /pay")]),
                Format::Protobuf,
            ),
            ("protobuf, a name not UTF-8", bad_utf8, Format::Protobuf),
            (
                "protobuf, truncated",
                truncated[..truncated.len() - 3].to_vec(),
                Format::Protobuf,
            ),
            (
                "protobuf, a trace id of 5 bytes",
                protobuf(vec![
                    Span {
                        trace_id: vec![1; 5],
                        ..span(2, "GET /cart")
                    },
                    span(3, "GET /pay"),
                ]),
                Format::Protobuf,
            ),
            ("JSON", json(GOOD), Format::Json),
            (
                "JSON, byte-order mark",
                [b"\xEF\xBB\xBF".as_slice(), &json(GOOD)].concat(),
                Format::Json,
            ),
            ("JSON, a name not UTF-8", bad_json_utf8, Format::Json),
            (
                "JSON, enum names",
                json(&GOOD.replace(r#""kind":2"#, r#""kind":"SPAN_KIND_SERVER""#)),
                Format::Json,
            ),
            (
                "JSON, null parent",
                json(&GOOD.replace(r#""kind":2"#, r#""kind":2,"parentSpanId":null"#)),
                Format::Json,
            ),
            (
                "JSON, a broken span beside a good one",
                json(&format!(
                    "{GOOD},{}",
                    GOOD.replace("0202020202020202", "0303030303030303")
                        .replace(
                            r#""endTimeUnixNano":"1700000000050000000""#,
                            r#""endTimeUnixNano":-5"#
                        )
                )),
                Format::Json,
            ),
            (
                "JSON, snake_case ids",
                json(&GOOD.replace("traceId", "trace_id")),
                Format::Json,
            ),
            ("JSON, truncated", json(GOOD)[..40].to_vec(), Format::Json),
            ("JSON, not a request", b"[1, 2]".to_vec(), Format::Json),
        ];
        let table: String = cases
            .into_iter()
            .map(|(name, body, format)| format!("{name}: {}\n", render(body, format)))
            .collect();
        expect_test::expect![[r#"
            protobuf: kept checkout "GET /cart" | kept checkout "GET /pay"
            protobuf, a name not UTF-8: kept checkout "GET /c�_t" (warnings: the request body was not valid UTF-8; invalid bytes were replaced by U+FFFD)
            protobuf, truncated: refused: request body is not a valid OTLP ExportTraceServiceRequest protobuf (failed to decode Protobuf message: ExportRequest.resource_spans: buffer underflow)
            protobuf, a trace id of 5 bytes: kept checkout "GET /pay" | partial_success: 1 rejected: rejected 1 of 2 spans: trace id is 5 bytes long, expected 16 (first: checkout "GET /cart"). Fix the exporter's data; the other spans were stored.
            JSON: kept checkout "GET /cart"
            JSON, byte-order mark: kept checkout "GET /cart"
            JSON, a name not UTF-8: kept checkout "GET /c�rt" (warnings: the request body was not valid UTF-8; invalid bytes were replaced by U+FFFD)
            JSON, enum names: kept checkout "GET /cart"
            JSON, null parent: kept checkout "GET /cart"
            JSON, a broken span beside a good one: kept checkout "GET /cart" | partial_success: 1 rejected: rejected 1 of 2 spans: not valid OTLP/JSON: i64 value -5 is out of range for u64 (first: span "GET /cart"). Fix the exporter's data; the other spans were stored.
            JSON, snake_case ids: partial_success: 1 rejected: rejected 1 of 1 spans: trace id is 0 bytes long, expected 16 (first: checkout "GET /cart"). Fix the exporter's data; the other spans were stored.
            JSON, truncated: refused: request body is not valid OTLP/JSON (EOF while parsing a string at line 1 column 40); OTLP/JSON uses lowerCamelCase keys, hex trace and span ids, and integer enum values
            JSON, not a request: refused: request body is not valid OTLP/JSON (the request: invalid type: integer `1`, expected a sequence); OTLP/JSON uses lowerCamelCase keys, hex trace and span ids, and integer enum values
        "#]].assert_eq(&table);
    }

    #[test]
    fn metrics_bodies_decode_or_say_why_not() {
        let refused =
            decode_metrics(b"{\"resourceMetrics\": 7}".to_vec().into(), Format::Json).unwrap_err();
        assert_eq!(refused.message_type, "ExportMetricsServiceRequest");
        assert!(
            refused
                .to_string()
                .contains("not valid OTLP/JSON for metrics")
        );
        let refused = decode_metrics(vec![0x0a, 0xff].into(), Format::Protobuf).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("ExportMetricsServiceRequest protobuf")
        );
        let decoded = decode_metrics(
            "\u{FEFF}{\"resourceMetrics\": []}"
                .as_bytes()
                .to_vec()
                .into(),
            Format::Json,
        )
        .unwrap();
        assert!(decoded.request.resource_metrics.is_empty() && !decoded.repaired);
    }
}

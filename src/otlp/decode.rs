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

//! OTLP/HTTP: `POST /v1/traces` and `POST /v1/metrics` with `application/x-protobuf` or
//! `application/json`, uncompressed or gzip; both share the token, size and memory checks.
//!
//! Statuses (OTLP specification): 200 with an `ExportTraceServiceResponse` (carrying
//! `partial_success` when spans were rejected); 400 for a body that does not decode; 413
//! when the body, after decompression, is over `max_request_bytes`; 415 for another content
//! type or encoding; 503 with `Retry-After` when the spans cannot be taken now. Error
//! bodies are a `google.rpc.Status` in the request's format (JSON when unknown).

use std::io::Read as _;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::BytesMut;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use prost::Message as _;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::otlp::decode::{DecodeError, Format, decode_metrics, decode_traces};
use crate::pipeline::ingest::IngestError;
use crate::pipeline::receiver::{
    Accepted, BodyMemory, MetricsAccepted, RETRY_AFTER, Receiver, refusal_message,
};
use crate::web::access::Tokens;

/// gRPC status codes used in `google.rpc.Status` bodies.
const INVALID_ARGUMENT: i32 = 3;
const RESOURCE_EXHAUSTED: i32 = 8;
const UNAVAILABLE: i32 = 14;
const UNAUTHENTICATED: i32 = 16;

fn content_type(format: Format) -> &'static str {
    match format {
        Format::Protobuf => "application/x-protobuf",
        Format::Json => "application/json",
    }
}

/// `google.rpc.Status` without details, as OTLP/HTTP error bodies carry it.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// A refused request: its HTTP status, its `google.rpc.Status` and the format to reply in.
#[derive(Debug)]
pub struct OtlpHttpError {
    status: StatusCode,
    code: i32,
    message: String,
    format: Format,
    retry_after: bool,
    /// The request's body was left unread: the connection is closed after the answer, and
    /// `Connection: close` tells the client not to send its next request on it.
    close: bool,
    /// A 401: the answer says which scheme to authenticate with.
    authenticate: bool,
}

impl OtlpHttpError {
    fn new(status: StatusCode, code: i32, format: Format, message: impl Into<String>) -> Self {
        OtlpHttpError {
            status,
            code,
            message: message.into(),
            format,
            retry_after: false,
            close: false,
            authenticate: false,
        }
    }

    fn closing(mut self) -> Self {
        self.close = true;
        self
    }
}

impl IntoResponse for OtlpHttpError {
    fn into_response(self) -> Response {
        let status = RpcStatus {
            code: self.code,
            message: self.message,
        };
        let body = match self.format {
            Format::Protobuf => status.encode_to_vec(),
            Format::Json => serde_json::to_vec(
                &serde_json::json!({"code": status.code, "message": status.message}),
            )
            .unwrap_or_default(),
        };
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, content_type(self.format))],
            body,
        )
            .into_response();
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.authenticate {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"budgetscope otlp\""),
            );
        }
        if self.retry_after {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(RETRY_AFTER.as_secs()),
            );
        }
        response
    }
}

struct HttpReceiver {
    receiver: Arc<Receiver>,
    max_request_bytes: usize,
    tokens: Arc<Tokens>,
}

/// The OTLP/HTTP router. `cors_origins` lists the browser origins allowed to export
/// (none: no CORS headers, so browsers cannot).
pub fn router(
    receiver: Arc<Receiver>,
    max_request_bytes: usize,
    cors_origins: &[HeaderValue],
    tokens: Arc<Tokens>,
) -> Router {
    let state = Arc::new(HttpReceiver {
        receiver,
        max_request_bytes,
        tokens,
    });
    let router = Router::new()
        .route("/v1/traces", post(export))
        .route("/v1/metrics", post(export_metrics))
        // The handler enforces the limit itself, on the decompressed size too.
        .layer(DefaultBodyLimit::disable())
        .with_state(state);
    if cors_origins.is_empty() {
        return router;
    }
    router.layer(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(cors_origins.iter().cloned()))
            .allow_methods([Method::POST])
            // Authorization: a browser exporter sends its --otlp-tokens token.
            .allow_headers([
                header::CONTENT_TYPE,
                header::CONTENT_ENCODING,
                header::AUTHORIZATION,
            ]),
    )
}

async fn export(
    State(state): State<Arc<HttpReceiver>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match export_inner(&state, &headers, body).await {
        Ok((format, accepted)) => success(format, accepted),
        Err(error) => error.into_response(),
    }
}

async fn export_metrics(
    State(state): State<Arc<HttpReceiver>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match export_metrics_inner(&state, &headers, body).await {
        Ok((format, accepted)) => metrics_success(format, accepted),
        Err(error) => error.into_response(),
    }
}

async fn export_inner(
    state: &HttpReceiver,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Format, Accepted), OtlpHttpError> {
    let received = receive(state, headers, body).await?;
    let format = received.format;
    // Decompressing, decoding, normalising and encoding are CPU work: one task on the
    // blocking pool, off the async workers, on one thread from body to rows.
    let receiver = state.receiver.clone();
    let (prepared, memory) = tokio::task::spawn_blocking(move || {
        let (body, memory) = received.inflate()?;
        let decoded = decode_traces(body, format).map_err(undecodable)?;
        Ok((receiver.prepare(decoded), memory))
    })
    .await
    .map_err(|_| interrupted(format))??;
    let accepted = state
        .receiver
        .commit(prepared.map_err(|e| refused(format, e))?)
        .await
        .map_err(|e| refused(format, e))?;
    drop(memory);
    Ok((format, accepted))
}

async fn export_metrics_inner(
    state: &HttpReceiver,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Format, MetricsAccepted), OtlpHttpError> {
    let received = receive(state, headers, body).await?;
    let format = received.format;
    let (decoded, memory) = tokio::task::spawn_blocking(move || {
        let (body, memory) = received.inflate()?;
        Ok((decode_metrics(body, format).map_err(undecodable)?, memory))
    })
    .await
    .map_err(|_| interrupted(format))??;
    let accepted = state
        .receiver
        .export_metrics(decoded)
        .await
        .map_err(|e| refused(format, e))?;
    drop(memory);
    Ok((format, accepted))
}

fn interrupted(format: Format) -> OtlpHttpError {
    OtlpHttpError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        UNAVAILABLE,
        format,
        "decoding was interrupted; retry",
    )
}

fn too_large(format: Format, limit: usize, what: &str) -> OtlpHttpError {
    OtlpHttpError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        RESOURCE_EXHAUSTED,
        format,
        format!(
            "request body is over {limit} bytes{what}; lower the exporter's batch size \
             (e.g. OTEL_BSP_MAX_EXPORT_BATCH_SIZE) or raise --max-request-bytes"
        ),
    )
}

/// A refusal before or after the writer: the store cannot take the request now.
fn refused(format: Format, error: IngestError) -> OtlpHttpError {
    let mut refusal = OtlpHttpError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        UNAVAILABLE,
        format,
        refusal_message(&error),
    );
    refusal.retry_after = true;
    refusal
}

/// A request's body as sent, with its memory, before decompression.
struct Received {
    format: Format,
    gzip: bool,
    raw: Bytes,
    memory: BodyMemory,
    limit: usize,
}

/// What every OTLP/HTTP export shares before decoding: the content type, the token, the
/// encoding, the size limit (declared and read) and the memory budget, as the body arrives.
async fn receive(
    state: &HttpReceiver,
    headers: &HeaderMap,
    body: Body,
) -> Result<Received, OtlpHttpError> {
    let format = content_format(headers)?;
    if !state
        .tokens
        .authorizes(headers.get(header::AUTHORIZATION), false)
    {
        let mut refusal = OtlpHttpError::new(
            StatusCode::UNAUTHORIZED,
            UNAUTHENTICATED,
            format,
            "this receiver needs a token: send `Authorization: Bearer TOKEN` with a token \
             of its --otlp-tokens file (OTEL_EXPORTER_OTLP_HEADERS=\"Authorization=Bearer TOKEN\")",
        );
        refusal.authenticate = true;
        return Err(refusal.closing());
    }
    let gzip = content_encoding_is_gzip(headers, format)?;
    let limit = state.max_request_bytes;
    // A declared length over the limit is refused before any of the body is read, and a
    // body the memory budget has no room for before more of it is read.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large(format, limit, " (its Content-Length)").closing());
    }
    let mut memory = state.receiver.body_memory();
    let mut body = Limited::new(body, limit);
    if let Err(error) = memory.declared(declared.unwrap_or(0)) {
        discard(&mut body).await;
        return Err(refused(format, error));
    }
    let mut raw = BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(frame) => frame.into_data().unwrap_or_default(),
            Err(error) if error.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(too_large(format, limit, "").closing());
            }
            Err(error) => {
                return Err(OtlpHttpError::new(
                    StatusCode::BAD_REQUEST,
                    INVALID_ARGUMENT,
                    format,
                    format!("could not read the request body: {error}"),
                )
                .closing());
            }
        };
        if let Err(error) = memory.received(data.len()) {
            drop(raw);
            discard(&mut body).await;
            return Err(refused(format, error));
        }
        raw.extend_from_slice(&data);
    }
    Ok(Received {
        format,
        gzip,
        raw: raw.freeze(),
        memory,
        limit,
    })
}

impl Received {
    /// The body decompressed, with its memory grown for decoding it (CPU work: call it on
    /// the blocking pool).
    fn inflate(self) -> Result<(Bytes, BodyMemory), OtlpHttpError> {
        let Received {
            format,
            gzip,
            raw,
            mut memory,
            limit,
        } = self;
        let body: Bytes = if gzip {
            // Decompressed a step at a time, each step's buffer accounted before the next.
            let mut out = Vec::new();
            let mut gunzip = flate2::read::MultiGzDecoder::new(&raw[..]).take(limit as u64 + 1);
            loop {
                let read = (&mut gunzip)
                    .take(GUNZIP_STEP)
                    .read_to_end(&mut out)
                    .map_err(|e| {
                        OtlpHttpError::new(
                            StatusCode::BAD_REQUEST,
                            INVALID_ARGUMENT,
                            format,
                            format!("Content-Encoding is gzip but the body does not gunzip: {e}"),
                        )
                    })?;
                if out.len() > limit {
                    return Err(too_large(format, limit, " after gzip decompression"));
                }
                if read == 0 {
                    break;
                }
                memory
                    .decompressing(out.capacity())
                    .map_err(|e| refused(format, e))?;
                out.reserve(GUNZIP_STEP as usize);
                memory
                    .decompressing(out.capacity())
                    .map_err(|e| refused(format, e))?;
            }
            out.into()
        } else {
            raw
        };
        memory
            .decoding(body.len(), gzip)
            .map_err(|e| refused(format, e))?;
        Ok((body, memory))
    }
}

/// Reads the rest of a refused request's body without keeping it, so that an HTTP/1.1
/// client still writing it reads the refusal instead of a broken pipe (which exporters
/// report as a failure of the connection, not as "retry later").
async fn discard(body: &mut Limited<Body>) {
    while let Some(Ok(_)) = body.frame().await {}
}

/// A gzip body is decompressed this many bytes at a time (its buffer accounted each step).
const GUNZIP_STEP: u64 = 1 << 20;

fn content_format(headers: &HeaderMap) -> Result<Format, OtlpHttpError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "application/x-protobuf" | "application/protobuf" => Ok(Format::Protobuf),
        "application/json" => Ok(Format::Json),
        _ => Err(OtlpHttpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_ARGUMENT,
            Format::Json,
            format!(
                "unsupported Content-Type {value:?}: send application/x-protobuf or application/json"
            ),
        )),
    }
}

fn content_encoding_is_gzip(headers: &HeaderMap, format: Format) -> Result<bool, OtlpHttpError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    let text = value.to_str().unwrap_or("").trim().to_ascii_lowercase();
    match text.as_str() {
        "" | "identity" | "none" => Ok(false),
        "gzip" | "x-gzip" => Ok(true),
        _ => Err(OtlpHttpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            INVALID_ARGUMENT,
            format,
            format!("unsupported Content-Encoding {text:?}: send gzip or no encoding"),
        )),
    }
}

/// A body that does not decode: 400, with what to check (permanent, never retried).
fn undecodable(error: DecodeError) -> OtlpHttpError {
    let hint = match error.format {
        Format::Protobuf => {
            "; check that Content-Type and Content-Encoding match what the exporter sends"
        }
        Format::Json => "",
    };
    OtlpHttpError::new(
        StatusCode::BAD_REQUEST,
        INVALID_ARGUMENT,
        error.format,
        format!("{error}{hint}"),
    )
}

fn success(format: Format, accepted: Accepted) -> Response {
    let partial = (accepted.rejected > 0).then(|| {
        serde_json::json!({
            "rejectedSpans": accepted.rejected,
            "errorMessage": accepted.error_message,
        })
    });
    reply(format, &accepted.into_response(), partial)
}

fn metrics_success(format: Format, accepted: MetricsAccepted) -> Response {
    let partial = accepted.is_partial().then(|| {
        serde_json::json!({
            "rejectedDataPoints": accepted.rejected,
            "errorMessage": accepted.error_message,
        })
    });
    reply(format, &accepted.into_response(), partial)
}

/// A 200 with the export response: protobuf, or JSON carrying `partialSuccess` when given.
fn reply(
    format: Format,
    response: &impl prost::Message,
    partial: Option<serde_json::Value>,
) -> Response {
    let body = match (format, partial) {
        (Format::Protobuf, _) => response.encode_to_vec(),
        (Format::Json, None) => b"{}".to_vec(),
        (Format::Json, Some(partial)) => {
            serde_json::to_vec(&serde_json::json!({ "partialSuccess": partial }))
                .unwrap_or_default()
        }
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, content_type(format))],
        body,
    )
        .into_response()
}

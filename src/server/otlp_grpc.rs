//! OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export` and
//! `opentelemetry.proto.collector.metrics.v1.MetricsService/Export`.
//!
//! Hand-written rather than the generated servers so that requests decode with
//! `otlp::decode` (a span name that is not UTF-8 is repaired and flagged instead of failing
//! the whole request) and both services share one set of limits. It answers
//! exactly as the generated servers would otherwise (same paths, codec, compression and
//! size handling; UNIMPLEMENTED elsewhere).
//!
//! gzip and uncompressed requests are accepted. Status codes follow the OTLP
//! specification: permanent failures never carry a code exporters retry. A request over
//! `max_request_bytes` (before or after gzip) is refused with INVALID_ARGUMENT before it is
//! decoded (tonic's OUT_OF_RANGE and RESOURCE_EXHAUSTED are both retryable), a body that
//! does not decode with INVALID_ARGUMENT, and spans the store (or the memory budget,
//! checked as each body frame arrives and before decoding) cannot take now with
//! UNAVAILABLE and a retry delay.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::codegen::{BoxFuture, EnabledCompressionEncodings, StdError, http};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::otlp::decode::{Decoded, Format, decode_metrics, decode_traces};
use crate::pipeline::ingest::IngestError;
use crate::pipeline::receiver::{BodyMemory, RETRY_AFTER, Receiver, refusal_message};
use crate::web::access::Tokens;

const TRACES_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const METRICS_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// The tonic service, ready to add to a `tonic::transport::Server`.
#[derive(Clone)]
pub struct GrpcReceiver {
    receiver: Arc<Receiver>,
    max_request_bytes: usize,
    tokens: Arc<Tokens>,
}

pub fn service(
    receiver: Arc<Receiver>,
    max_request_bytes: usize,
    tokens: Arc<Tokens>,
) -> GrpcReceiver {
    GrpcReceiver {
        receiver,
        max_request_bytes,
        tokens,
    }
}

impl tonic::server::NamedService for GrpcReceiver {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

/// One of the export services: its messages, how its requests decode, and what it does.
trait Signal: Send + 'static {
    type Request: Send + 'static;
    type Response: prost::Message + Default + Send + 'static;
    fn decode(body: bytes::Bytes) -> Result<Self::Request, Status>;
    fn export(
        receiver: Arc<Receiver>,
        request: Self::Request,
    ) -> BoxFuture<Self::Response, IngestError>;
}

struct Traces;
struct Metrics;

impl Signal for Traces {
    type Request = Decoded<ExportTraceServiceRequest>;
    type Response = ExportTraceServiceResponse;

    fn decode(body: bytes::Bytes) -> Result<Self::Request, Status> {
        // Permanent: the same bytes never decode.
        decode_traces(body, Format::Protobuf).map_err(|e| Status::invalid_argument(e.to_string()))
    }

    fn export(
        receiver: Arc<Receiver>,
        request: Self::Request,
    ) -> BoxFuture<Self::Response, IngestError> {
        Box::pin(async move {
            receiver
                .export(request)
                .await
                .map(crate::pipeline::receiver::Accepted::into_response)
        })
    }
}

impl Signal for Metrics {
    type Request = Decoded<ExportMetricsServiceRequest>;
    type Response = ExportMetricsServiceResponse;

    fn decode(body: bytes::Bytes) -> Result<Self::Request, Status> {
        decode_metrics(body, Format::Protobuf).map_err(|e| Status::invalid_argument(e.to_string()))
    }

    fn export(
        receiver: Arc<Receiver>,
        request: Self::Request,
    ) -> BoxFuture<Self::Response, IngestError> {
        Box::pin(async move {
            receiver
                .export_metrics(request)
                .await
                .map(crate::pipeline::receiver::MetricsAccepted::into_response)
        })
    }
}

/// The export service of one request, holding the request's memory until it is answered.
struct Export<S>(Arc<Receiver>, Memory, std::marker::PhantomData<S>);

/// A request's share of the memory budget, grown by its body (`Reserving`) and its
/// decoder, and held until its spans are committed.
type Memory = Arc<Mutex<BodyMemory>>;

/// The refusal of a request the memory budget has no room for (retryable).
fn memory_refusal() -> Status {
    Status::with_error_details(
        Code::Unavailable,
        refusal_message(&IngestError::MemoryFull),
        ErrorDetails::with_retry_info(Some(RETRY_AFTER)),
    )
}

/// A request body that accounts each frame in the request's memory as it arrives, and
/// ends the request with `memory_refusal` (which tonic answers as it is) when the budget
/// has no room, so the rest is never read.
struct Reserving<B> {
    body: Pin<Box<B>>,
    memory: Memory,
}

impl<B> http_body::Body for Reserving<B>
where
    B: http_body::Body,
    B::Error: Into<StdError>,
{
    type Data = B::Data;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, StdError>>> {
        use bytes::Buf as _;
        let frame = match std::task::ready!(self.body.as_mut().poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            Some(Err(error)) => return Poll::Ready(Some(Err(error.into()))),
            None => return Poll::Ready(None),
        };
        if let Some(data) = frame.data_ref() {
            let received = lock(&self.memory).received(data.remaining());
            if received.is_err() {
                return Poll::Ready(Some(Err(memory_refusal().into())));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

fn lock(memory: &Memory) -> std::sync::MutexGuard<'_, BodyMemory> {
    // The guarded value stays consistent even if a holder panicked.
    memory
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// tonic's prost codec, decoding with the signal's decoder once the request's memory
/// has room for the decoded message.
struct ExportCodec<S> {
    memory: Memory,
    compressed: bool,
    signal: std::marker::PhantomData<S>,
}

struct ExportDecoder<S> {
    memory: Memory,
    compressed: bool,
    signal: std::marker::PhantomData<S>,
}

impl<S: Signal> tonic::codec::Codec for ExportCodec<S> {
    type Encode = S::Response;
    type Decode = S::Request;
    type Encoder = tonic_prost::ProstEncoder<S::Response>;
    type Decoder = ExportDecoder<S>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ExportDecoder {
            memory: self.memory.clone(),
            compressed: self.compressed,
            signal: std::marker::PhantomData,
        }
    }
}

impl<S: Signal> tonic::codec::Decoder for ExportDecoder<S> {
    type Item = S::Request;
    type Error = Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<S::Request>, Status> {
        use bytes::Buf as _;
        lock(&self.memory)
            .decoding(buf.remaining(), self.compressed)
            .map_err(|_| memory_refusal())?;
        // The message's bytes, without a copy (the buffer is tonic's `BytesMut`).
        let body = buf.copy_to_bytes(buf.remaining());
        S::decode(body).map(Some)
    }
}

impl<S: Signal> tonic::server::UnaryService<S::Request> for Export<S> {
    type Response = S::Response;
    type Future = BoxFuture<Response<S::Response>, Status>;

    fn call(&mut self, request: Request<S::Request>) -> Self::Future {
        let receiver = self.0.clone();
        let memory = self.1.clone();
        Box::pin(async move {
            let _memory = memory;
            match S::export(receiver, request.into_inner()).await {
                Ok(response) => Ok(Response::new(response)),
                Err(error) => Err(Status::with_error_details(
                    Code::Unavailable,
                    refusal_message(&error),
                    ErrorDetails::with_retry_info(Some(RETRY_AFTER)),
                )),
            }
        })
    }
}

impl<B> tower::Service<http::Request<B>> for GrpcReceiver
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !self
            .tokens
            .authorizes(request.headers().get(http::header::AUTHORIZATION), false)
        {
            return Box::pin(async {
                Ok(Status::unauthenticated(
                    "this receiver needs a token: send the metadata `authorization: Bearer \
                     TOKEN` with a token of its --otlp-tokens file \
                     (OTEL_EXPORTER_OTLP_HEADERS=\"authorization=Bearer TOKEN\")",
                )
                .into_http())
            });
        }
        match request.uri().path() {
            TRACES_PATH => self.unary::<Traces, B>(request),
            METRICS_PATH => self.unary::<Metrics, B>(request),
            _ => Box::pin(async {
                Ok(Status::unimplemented(
                    "budgetscope serves TraceService/Export and MetricsService/Export only",
                )
                .into_http())
            }),
        }
    }
}

impl GrpcReceiver {
    /// Serves one export request of signal `S`, within the request size limit and the
    /// memory budget.
    fn unary<S: Signal, B>(
        &self,
        request: http::Request<B>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible>
    where
        B: http_body::Body + Send + 'static,
        B::Error: Into<StdError> + Send + 'static,
    {
        let mut gzip = EnabledCompressionEncodings::default();
        gzip.enable(CompressionEncoding::Gzip);
        let memory: Memory = Arc::new(Mutex::new(self.receiver.body_memory()));
        let compressed = request
            .headers()
            .get("grpc-encoding")
            .is_some_and(|encoding| encoding != "identity");
        let mut grpc = tonic::server::Grpc::new(ExportCodec::<S> {
            memory: memory.clone(),
            compressed,
            signal: std::marker::PhantomData,
        })
        .apply_compression_config(gzip, gzip)
        .apply_max_message_size_config(Some(self.max_request_bytes), None);
        let export = Export::<S>(
            self.receiver.clone(),
            memory.clone(),
            std::marker::PhantomData,
        );
        let request = request.map(|body| Reserving {
            body: Box::pin(body),
            memory,
        });
        let limit = self.max_request_bytes;
        Box::pin(async move {
            Ok(permanent_size_refusal(
                grpc.unary(export, request).await,
                limit,
            ))
        })
    }
}

/// tonic refuses a message over the size limit with OUT_OF_RANGE (as sent) or
/// RESOURCE_EXHAUSTED (after gzip), which exporters retry forever; the export service
/// itself answers neither, so both become INVALID_ARGUMENT, saying what to change.
fn permanent_size_refusal(
    response: http::Response<tonic::body::Body>,
    limit: usize,
) -> http::Response<tonic::body::Body> {
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map(Code::from_i32);
    match code {
        Some(Code::OutOfRange | Code::ResourceExhausted) => Status::invalid_argument(format!(
            "the request is over {limit} bytes (after decompression); lower the exporter's \
             batch size (e.g. OTEL_BSP_MAX_EXPORT_BATCH_SIZE) or raise --max-request-bytes"
        ))
        .into_http(),
        _ => response,
    }
}

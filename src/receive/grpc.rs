//! OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
//!
//! Hand-written rather than the generated `TraceServiceServer` so that requests decode
//! with `lenient::decode_request`: a span name that is not UTF-8 is repaired and flagged
//! instead of failing the whole request. It answers exactly as the generated server would
//! otherwise (same path, codec, compression and size handling; UNIMPLEMENTED elsewhere).
//!
//! gzip and uncompressed requests are accepted. Status codes follow the OTLP
//! specification: permanent failures never carry a code exporters retry. A request over
//! `max_request_bytes` (before or after gzip) is refused with INVALID_ARGUMENT before it is
//! decoded (tonic's OUT_OF_RANGE and RESOURCE_EXHAUSTED are both retryable), a body that
//! does not decode with INVALID_ARGUMENT, and spans the store cannot take now with
//! UNAVAILABLE and a retry delay.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::codegen::{BoxFuture, EnabledCompressionEncodings, StdError, http};
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::http::LOSSY_UTF8_WARNING;
use super::lenient::decode_request;
use super::{RETRY_AFTER, Receiver, refusal_message};

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The tonic service, ready to add to a `tonic::transport::Server`.
#[derive(Clone)]
pub struct GrpcReceiver {
    receiver: Arc<Receiver>,
    max_request_bytes: usize,
}

pub fn service(receiver: Arc<Receiver>, max_request_bytes: usize) -> GrpcReceiver {
    GrpcReceiver {
        receiver,
        max_request_bytes,
    }
}

impl tonic::server::NamedService for GrpcReceiver {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

struct Export(Arc<Receiver>);

/// An export request as `lenient::decode_request` returns it.
type Decoded = (ExportTraceServiceRequest, bool);

/// tonic's prost codec, decoding with `lenient::decode_request`.
struct ExportCodec;

struct ExportDecoder;

impl tonic::codec::Codec for ExportCodec {
    type Encode = ExportTraceServiceResponse;
    type Decode = Decoded;
    type Encoder = tonic_prost::ProstEncoder<ExportTraceServiceResponse>;
    type Decoder = ExportDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        ExportDecoder
    }
}

impl tonic::codec::Decoder for ExportDecoder {
    type Item = Decoded;
    type Error = Status;

    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Decoded>, Status> {
        use bytes::Buf as _;
        // The message's bytes, without a copy (the buffer is tonic's `BytesMut`).
        let body = buf.copy_to_bytes(buf.remaining());
        // Permanent: the same bytes never decode.
        decode_request(body).map(Some).map_err(|error| {
            Status::invalid_argument(format!(
                "the request is not a valid ExportTraceServiceRequest: {error}"
            ))
        })
    }
}

impl tonic::server::UnaryService<Decoded> for Export {
    type Response = ExportTraceServiceResponse;
    type Future = BoxFuture<Response<ExportTraceServiceResponse>, Status>;

    fn call(&mut self, request: Request<Decoded>) -> Self::Future {
        let receiver = self.0.clone();
        Box::pin(async move {
            let (request, repaired) = request.into_inner();
            match receiver
                .export(request, repaired.then_some(LOSSY_UTF8_WARNING))
                .await
            {
                Ok(accepted) => Ok(Response::new(accepted.into_response())),
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
        if request.uri().path() != EXPORT_PATH {
            return Box::pin(async {
                Ok(
                    Status::unimplemented("budgetscope serves TraceService/Export only")
                        .into_http(),
                )
            });
        }
        let mut gzip = EnabledCompressionEncodings::default();
        gzip.enable(CompressionEncoding::Gzip);
        let mut grpc = tonic::server::Grpc::new(ExportCodec)
            .apply_compression_config(gzip, gzip)
            .apply_max_message_size_config(Some(self.max_request_bytes), None);
        let export = Export(self.receiver.clone());
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

//! OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
//!
//! Hand-written rather than the generated `TraceServiceServer` so that requests decode
//! with `lenient::decode_request`: a span name that is not UTF-8 is repaired and flagged
//! instead of failing the whole request. It answers exactly as the generated server would
//! otherwise (same path, codec, compression and size handling; UNIMPLEMENTED elsewhere).
//!
//! gzip and uncompressed requests are accepted. A request over `max_request_bytes` is
//! refused by tonic with OUT_OF_RANGE before it is decoded (known quirk: exporters may
//! retry it; see ARCHITECTURE.md).

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
        // INTERNAL for a body that does not decode, as tonic's prost codec answers.
        decode_request(body)
            .map(Some)
            .map_err(|error| Status::internal(error.to_string()))
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
        Box::pin(async move { Ok(grpc.unary(export, request).await) })
    }
}

//! OTLP/gRPC: `opentelemetry.proto.collector.trace.v1.TraceService/Export`.
//!
//! gzip and uncompressed requests are accepted. A request over `max_request_bytes` is
//! refused by tonic with OUT_OF_RANGE before it is decoded (known quirk: exporters may
//! retry it; see ARCHITECTURE.md).

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::{RETRY_AFTER, Receiver, refusal_message};

pub struct GrpcReceiver {
    receiver: Arc<Receiver>,
}

/// The tonic service, ready to add to a `tonic::transport::Server`.
pub fn service(receiver: Arc<Receiver>, max_request_bytes: usize) -> TraceServiceServer<GrpcReceiver> {
    TraceServiceServer::new(GrpcReceiver { receiver })
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max_request_bytes)
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        match self.receiver.export(request.into_inner(), None).await {
            Ok(accepted) => Ok(Response::new(accepted.into_response())),
            Err(error) => Err(Status::with_error_details(
                Code::Unavailable,
                refusal_message(&error),
                ErrorDetails::with_retry_info(Some(RETRY_AFTER)),
            )),
        }
    }
}

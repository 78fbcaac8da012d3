//! OTLP receivers: gRPC (`grpc.rs`) and HTTP (`http.rs`) decode their transport and hand
//! the request to `Receiver::export`, the one ingest function both share.
//!
//! Architecture invariant: a receiver answers success only after `Ingestor::submit`
//! returned, i.e. after the spans were committed. Each failure maps to the status the
//! OTLP specification gives it, so exporters retry exactly the retryable ones.

pub mod grpc;
pub mod http;
pub mod lenient;
pub mod otlp_json;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};

use crate::ingest::{IngestError, Ingestor};
use crate::normalize::{NormalizeOptions, normalize, span_count};
use crate::store::EncodedBatch;

/// Requests of at most this many spans are normalised and encoded on the async worker that
/// received them (well under a millisecond of work); larger ones on the blocking pool, so
/// that no worker is held for long. The hand-off to the pool and back cost small requests
/// more than the work: gRPC 100 spans × 8 senders, 5 pairs, 68.4k → 73.0k spans/s
/// (BENCHMARKS.md).
const INLINE_SPANS: usize = 128;

/// How long exporters are asked to wait before retrying a refused request.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What an accepted request produced: how many of its spans were invalid, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub rejected: u64,
    pub error_message: String,
}

impl Accepted {
    /// The OTLP response: `partial_success` only when some spans were rejected.
    pub fn into_response(self) -> ExportTraceServiceResponse {
        ExportTraceServiceResponse {
            partial_success: (self.rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: i64::try_from(self.rejected).unwrap_or(i64::MAX),
                error_message: self.error_message,
            }),
        }
    }
}

pub struct Receiver {
    ingestor: Arc<Ingestor>,
    /// Shared with the blocking task of each request, not copied per request.
    options: Arc<NormalizeOptions>,
}

impl Receiver {
    pub fn new(ingestor: Arc<Ingestor>, options: NormalizeOptions) -> Arc<Receiver> {
        Arc::new(Receiver {
            ingestor,
            options: Arc::new(options),
        })
    }

    /// Normalises, validates and commits one export request. `warning`, when given, is a
    /// data-quality warning the transport found for the whole request (it goes on every span).
    ///
    /// Admission is checked before any work; normalising and encoding run on the blocking
    /// pool for requests of more than `INLINE_SPANS` spans, so the async workers stay free.
    pub async fn export(
        &self,
        request: ExportTraceServiceRequest,
        warning: Option<&'static str>,
    ) -> Result<Accepted, IngestError> {
        let span_count = span_count(&request);
        if span_count == 0 {
            return Ok(Accepted {
                rejected: 0,
                error_message: String::new(),
            });
        }
        let admission = self.ingestor.admit(span_count)?;
        let options = self.options.clone();
        let work = move || {
            prepare(
                request,
                &options,
                crate::store::now_unix_nano() as u64,
                warning,
            )
        };
        let (batch, accepted) = if span_count <= INLINE_SPANS {
            work()
        } else {
            tokio::task::spawn_blocking(work)
                .await
                .map_err(|_| IngestError::Unavailable)?
        };
        self.ingestor.commit(admission, batch).await?;
        Ok(accepted)
    }
}

/// A request's CPU work before the writer: normalises and validates its spans and encodes
/// the valid ones into rows. `warning` goes on every span (see `Receiver::export`).
pub fn prepare(
    request: ExportTraceServiceRequest,
    options: &NormalizeOptions,
    now_unix_nano: u64,
    warning: Option<&'static str>,
) -> (EncodedBatch, Accepted) {
    let mut normalized = normalize(request, options, now_unix_nano);
    if let Some(warning) = warning {
        for span in &mut normalized.spans {
            span.warnings.push(warning.to_string());
        }
    }
    let accepted = Accepted {
        rejected: normalized.rejected,
        error_message: normalized.error_message(),
    };
    (EncodedBatch::from_spans(normalized.spans), accepted)
}

/// What an exporter is told when its spans could not be taken now (always retryable).
pub fn refusal_message(error: &IngestError) -> &'static str {
    match error {
        IngestError::Overloaded => {
            "budgetscope is at its ingest limit (--max-queued-spans); retry after the delay given"
        }
        IngestError::Unavailable => {
            "budgetscope's database is unavailable; retry after the delay given"
        }
        IngestError::Closed => "budgetscope is shutting down; retry against the restarted server",
    }
}

//! The one ingest path both OTLP endpoints (`server/otlp_grpc.rs`, `server/otlp_http.rs`)
//! share: `Receiver::export` (gRPC), or `Receiver::prepare` in the task that decoded the
//! body, then `Receiver::commit` (HTTP). `prepare` is a request's CPU work before the
//! writer (normalise, validate, encode rows, project the spans held for the analyzer);
//! `budgetscope-bench receive` times it. Metrics requests go to `Receiver::export_metrics`,
//! which keeps the deadline metrics (`otlp::deadline_metrics`) and ignores the rest; their
//! rows are committed directly (a few rows a minute per hop), and only then do cumulative
//! series' last points advance, so a refused request is counted when it is retried.
//!
//! Both endpoints account a request in the memory budget (`BodyMemory`) as its body
//! arrives and refuse it, retryably, when the budget is full.
//!
//! Architecture invariant: a receiver answers success only after `Ingestor::commit`
//! returned, i.e. after the spans were committed. Each failure maps to the status the
//! OTLP specification gives it, so exporters retry exactly the retryable ones.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};

use crate::core::model::TraceId;
use crate::otlp::deadline_metrics::{Cumulative, MetricNames, extract};
use crate::otlp::decode::{Decoded, REPAIRED_TEXT_WARNING, normalize_decoded};
use crate::otlp::normalize::{NormalizeOptions, span_count};
use crate::pipeline::held::{HeldSpan, HeldTraces};
use crate::pipeline::ingest::{Admission, IngestError, Ingestor};
use crate::pipeline::memory::{MemoryBudget, REQUEST_BYTES_PER_BODY_BYTE, Reservation};
use crate::pipeline::metrics::Metrics;
use crate::store::Fault;
use crate::store::{EncodedBatch, Store};

/// Requests of at most this many spans are normalised and encoded on the async worker that
/// received them (well under a millisecond of work); larger ones on the blocking pool, so
/// that no worker is held for long. The hand-off to the pool and back cost small requests
/// more than the work (`benches/ab.sh` with `AB_CONFIG="--transport grpc --batch 100"`).
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

/// What an accepted metrics request produced: how many data points of the deadline
/// metrics were left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsAccepted {
    pub rejected: i64,
    pub error_message: String,
}

impl MetricsAccepted {
    /// Whether the answer says more than success: data points left out, or a warning.
    pub fn is_partial(&self) -> bool {
        self.rejected > 0 || !self.error_message.is_empty()
    }

    /// The OTLP response: `partial_success` only when some data points were left out or
    /// there is a warning (with none left out).
    pub fn into_response(self) -> ExportMetricsServiceResponse {
        ExportMetricsServiceResponse {
            partial_success: self.is_partial().then(|| ExportMetricsPartialSuccess {
                rejected_data_points: self.rejected,
                error_message: self.error_message,
            }),
        }
    }
}

pub struct Receiver {
    ingestor: Arc<Ingestor>,
    options: NormalizeOptions,
    metrics: Arc<Metrics>,
    memory: Arc<MemoryBudget>,
    /// Committed spans are held here for the analyzer.
    held: Arc<HeldTraces>,
    /// Where the deadline metrics are written (spans go through `ingestor`).
    store: Arc<dyn Store>,
    metric_names: MetricNames,
    /// The cumulative series' last points. Held across a request's write, so that each
    /// request's deltas are taken against the points the store already has.
    cumulative: tokio::sync::Mutex<Cumulative>,
}

/// What a `Receiver` is built from.
pub struct ReceiverParts {
    pub ingestor: Arc<Ingestor>,
    pub store: Arc<dyn Store>,
    pub options: NormalizeOptions,
    pub metric_names: MetricNames,
    pub metrics: Arc<Metrics>,
    pub memory: Arc<MemoryBudget>,
    pub held: Arc<HeldTraces>,
}

impl Receiver {
    pub fn new(parts: ReceiverParts) -> Arc<Receiver> {
        Arc::new(Receiver {
            ingestor: parts.ingestor,
            options: parts.options,
            metrics: parts.metrics,
            memory: parts.memory,
            held: parts.held,
            store: parts.store,
            metric_names: parts.metric_names,
            cumulative: tokio::sync::Mutex::new(Cumulative::new(crate::clock::now_unix_nano())),
        })
    }

    /// Stores the deadline metrics of a metrics request (committed before it returns) and
    /// ignores its other metrics. A store that cannot take them is a retryable refusal.
    /// Text that the decoder repaired is mentioned in the answer.
    pub async fn export_metrics(
        &self,
        decoded: Decoded<ExportMetricsServiceRequest>,
    ) -> Result<MetricsAccepted, IngestError> {
        let Decoded {
            request, repaired, ..
        } = decoded;
        let mut cumulative = self.cumulative.lock().await;
        let now = crate::clock::now_unix_nano();
        let extracted = extract(&request, &self.metric_names, &cumulative, now);
        drop(request);
        if !extracted.rows.is_empty() {
            let written = self.store.add_reported(&extracted.rows).await;
            let health = self.ingestor.health();
            if !health.observe(&written)
                && let Err(error) = &written
            {
                tracing::warn!(%error, "could not store deadline metrics; exporters will be asked to retry");
            }
            written.map_err(|error| crate::pipeline::ingest::refusal(&error, health))?;
        }
        self.metrics
            .metric_points_stored
            .inc_by(extracted.stored.max(0) as u64);
        self.metrics
            .metric_points_rejected
            .inc_by(extracted.rejected.max(0) as u64);
        cumulative.advance(extracted.advance, now);
        let mut error_message = extracted.message;
        if repaired {
            if !error_message.is_empty() {
                error_message.push_str("; ");
            }
            error_message.push_str(REPAIRED_TEXT_WARNING);
        }
        Ok(MetricsAccepted {
            rejected: extracted.rejected,
            error_message,
        })
    }

    /// A request's memory, reserved as its body arrives (`BodyMemory`) and held until its
    /// spans are committed.
    pub fn body_memory(&self) -> BodyMemory {
        BodyMemory {
            reservation: self.memory.empty(),
            read: 0,
        }
    }

    /// Normalises, validates and commits one decoded export request.
    ///
    /// Admission is checked before any work; normalising and encoding run on the blocking
    /// pool for requests of more than `INLINE_SPANS` spans, so the async workers stay free.
    pub async fn export(
        self: &Arc<Self>,
        decoded: Decoded<ExportTraceServiceRequest>,
    ) -> Result<Accepted, IngestError> {
        let prepared = if span_count(&decoded.request) <= INLINE_SPANS {
            self.prepare(decoded)
        } else {
            let receiver = self.clone();
            tokio::task::spawn_blocking(move || receiver.prepare(decoded))
                .await
                .map_err(|_| IngestError::Unavailable)?
        };
        self.commit(prepared?).await
    }

    /// The part of `export` before the writer, on the calling thread: admission, then the
    /// request's CPU work (`prepare`). For a receiver that decodes on the blocking pool,
    /// so that decoding and this work run in one task on one thread. Spans the decoder
    /// already left out are counted in `partial_success`.
    pub fn prepare(
        &self,
        decoded: Decoded<ExportTraceServiceRequest>,
    ) -> Result<Prepared, IngestError> {
        let span_count = span_count(&decoded.request);
        if span_count == 0 {
            let normalized = normalize_decoded(decoded, &self.options, 0);
            return Ok(Prepared(None, accepted(&normalized)));
        }
        let admission = self.ingestor.admit(span_count).inspect_err(|_| {
            self.metrics.spans_refused.inc_by(span_count as u64);
        })?;
        self.metrics.spans_received.inc_by(span_count as u64);
        let (batch, held, accepted) = prepare(
            decoded,
            &self.options,
            crate::clock::now_unix_nano(),
            Some(&self.held),
        );
        Ok(Prepared(Some((admission, batch, held)), accepted))
    }

    /// The rest of `export`: waits until the prepared spans are committed.
    pub async fn commit(&self, prepared: Prepared) -> Result<Accepted, IngestError> {
        self.metrics.spans_rejected.inc_by(prepared.1.rejected);
        let Prepared(Some((admission, batch, held)), accepted) = prepared else {
            return Ok(prepared.1);
        };
        let spans = batch.len() as u64;
        let started = std::time::Instant::now();
        match self.ingestor.commit(admission, batch).await {
            Ok(()) => {
                self.metrics.spans_stored.inc_by(spans);
                self.held.add(held);
                self.metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(error) => {
                self.metrics.spans_refused.inc_by(spans);
                return Err(error);
            }
        }
        Ok(accepted)
    }
}

/// A request's share of the memory budget, grown as its body arrives and when the body is
/// decompressed. A transport refuses the request (retryably, `IngestError::MemoryFull`)
/// the moment the budget has no room for it, before reading more.
pub struct BodyMemory {
    reservation: Reservation,
    /// Body bytes received so far, as sent.
    read: u64,
}

impl BodyMemory {
    /// Accounts `bytes` more of the body as received.
    pub fn received(&mut self, bytes: usize) -> Result<(), IngestError> {
        self.read += bytes as u64;
        self.grow_to(self.read)
    }

    /// Accounts a body whose length is declared, before it is read.
    pub fn declared(&mut self, bytes: u64) -> Result<(), IngestError> {
        self.grow_to(bytes)
    }

    /// Accounts a decompression buffer of `capacity` bytes, beside the received bytes.
    pub fn decompressing(&mut self, capacity: usize) -> Result<(), IngestError> {
        self.grow_to(self.read + capacity as u64)
    }

    /// Accounts the message about to be decoded, `bytes` long after decompression (the
    /// received bytes count once more when they were compressed, as both are held).
    pub fn decoding(&mut self, bytes: usize, compressed: bool) -> Result<(), IngestError> {
        let message = bytes as u64 * REQUEST_BYTES_PER_BODY_BYTE;
        self.grow_to(if compressed {
            message + self.read
        } else {
            message
        })
    }

    fn grow_to(&mut self, bytes: u64) -> Result<(), IngestError> {
        if self.reservation.try_grow_to(bytes) {
            Ok(())
        } else {
            Err(IngestError::MemoryFull)
        }
    }
}

/// A request admitted and encoded by `Receiver::prepare`, for `Receiver::commit` (no batch
/// when the request held no valid spans), and what its answer says of rejected spans.
pub struct Prepared(
    Option<(Admission, EncodedBatch, Vec<(TraceId, HeldSpan)>)>,
    Accepted,
);

/// A request's CPU work before the writer: normalises and validates its spans and encodes
/// the valid ones into rows, and projects them for the analyzer's held spans when given.
pub fn prepare(
    decoded: Decoded<ExportTraceServiceRequest>,
    options: &NormalizeOptions,
    now_unix_nano: u64,
    held_traces: Option<&HeldTraces>,
) -> (EncodedBatch, Vec<(TraceId, HeldSpan)>, Accepted) {
    let normalized = normalize_decoded(decoded, options, now_unix_nano);
    let accepted = accepted(&normalized);
    let held = held_traces.map_or_else(Vec::new, |traces| traces.project(&normalized.spans));
    (EncodedBatch::from_spans(normalized.spans), held, accepted)
}

/// What the answer says of a request's rejected spans.
fn accepted(normalized: &crate::otlp::normalize::Normalized) -> Accepted {
    Accepted {
        rejected: normalized.rejected,
        error_message: normalized.error_message(),
    }
}

/// What an exporter is told when its spans could not be taken now (always retryable).
pub fn refusal_message(error: &IngestError) -> &'static str {
    match error {
        IngestError::Overloaded => {
            "budgetscope is at its ingest limit (--max-queued-spans); retry after the delay given"
        }
        IngestError::MemoryFull => {
            "budgetscope is at its memory limit (--memory-limit); retry after the delay given"
        }
        IngestError::Unavailable => {
            "budgetscope's database is unavailable; retry after the delay given"
        }
        IngestError::Fault(fault) => match fault {
            Fault::Corrupt | Fault::NotADatabase => {
                "budgetscope cannot write its database: it is corrupt; its operator must restore \
                 it (GET /readyz says so); retry later"
            }
            Fault::ReadOnly => {
                "budgetscope cannot write its database: it is read-only; its operator must let \
                 the server write it (GET /readyz says so); retry later"
            }
            Fault::DiskFull => {
                "budgetscope cannot write its database: the disk is full; retry after the delay \
                 given"
            }
        },
        IngestError::Closed => "budgetscope is shutting down; retry against the restarted server",
    }
}

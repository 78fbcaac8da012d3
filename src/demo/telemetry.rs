//! The demo services' OpenTelemetry: one tracer provider per service (its own resource and
//! exporter), W3C trace context across the wire, and the budget as the services keep it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

/// The attribute every demo service records its budget in, on server and client spans.
pub const REMAINING: &str = "deadline.remaining_ms";

/// How a service's exporter reaches the server.
pub enum Otlp {
    /// OTLP/HTTP with protobuf, to this base URL (`/v1/traces` is appended).
    Http(String),
    /// OTLP/gRPC, to this URL.
    Grpc(String),
}

/// A tracer provider for `service`. Spans are sent every half second, so the overview fills
/// within seconds. Builds the exporter on a blocking thread inside `runtime`: the HTTP
/// exporter's blocking client must not be created on an async thread, and the gRPC
/// exporter's channel needs the runtime.
pub async fn provider(
    service: &'static str,
    otlp: Otlp,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<SdkTracerProvider> {
    tokio::task::spawn_blocking(move || {
        let _entered = runtime.enter();
        let exporter = match otlp {
            Otlp::Http(base) => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{base}/v1/traces"))
                .with_protocol(Protocol::HttpBinary)
                .build(),
            Otlp::Grpc(url) => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(url)
                .build(),
        }
        .with_context(|| format!("could not set up the {service} service's OTLP exporter"))?;
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(Duration::from_millis(500))
                    .build(),
            )
            .build();
        Ok(SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(Resource::builder().with_service_name(service).build())
            .build())
    })
    .await?
}

/// The `traceparent` (and `tracestate`) headers that carry `cx` to the next service.
pub fn inject(cx: &Context) -> Vec<(String, String)> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.into_iter().collect()
}

/// The caller's trace context from request headers (an empty context when there is none).
pub fn extract(headers: &axum::http::HeaderMap) -> Context {
    let carrier: HashMap<String, String> = headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str().to_string(), value.to_str().ok()?.into())))
        .collect();
    TraceContextPropagator::new().extract(&carrier)
}

/// A deadline as the services keep it: the budget received and when the request arrived.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Instant,
    pub budget_ms: f64,
}

impl Deadline {
    pub fn new(start: Instant, budget_ms: f64) -> Deadline {
        Deadline { start, budget_ms }
    }

    /// Milliseconds left; negative once the deadline has passed.
    pub fn remaining_ms(&self) -> f64 {
        self.budget_ms - self.start.elapsed().as_secs_f64() * 1000.0
    }

    /// Time left as a wait, zero once passed.
    pub fn remaining(&self) -> Duration {
        Duration::from_secs_f64(self.remaining_ms().max(0.0) / 1000.0)
    }
}

/// Starts a span of `kind` under `parent` and returns the context that holds it.
pub fn start_span(
    tracer: &SdkTracer,
    parent: &Context,
    kind: SpanKind,
    name: &'static str,
    attributes: Vec<KeyValue>,
) -> Context {
    let span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_attributes(attributes)
        .start_with_context(tracer, parent);
    parent.with_span(span)
}

/// Ends the span of `cx`, as an error with `message` when there is one.
pub fn end_span(cx: &Context, error: Option<String>) {
    let span = cx.span();
    if let Some(message) = error {
        span.set_status(Status::error(message));
    }
    span.end();
}

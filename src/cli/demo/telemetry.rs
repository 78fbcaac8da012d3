//! The demo services' OpenTelemetry: one tracer and one meter provider per service (its own
//! resource and exporters), W3C trace context across the wire, the budget as the services
//! keep it, and the deadline metrics they export beside their spans.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _};
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};

/// The attribute every demo service records its budget in, on server and client spans.
pub const REMAINING: &str = "deadline.remaining_ms";

/// How a service's exporters reach the server.
pub enum Otlp {
    /// OTLP/HTTP with protobuf, to this base URL (`/v1/traces` and `/v1/metrics` appended).
    Http(String),
    /// OTLP/gRPC, to this URL.
    Grpc(String),
}

/// A service's tracer and meter providers, and the deadline metrics' instruments.
pub struct Telemetry {
    pub tracer_provider: SdkTracerProvider,
    pub meter_provider: SdkMeterProvider,
    pub meters: DeadlineMeters,
}

/// The providers of `service`. Spans are sent every half second and metrics every second,
/// so the overview fills within seconds. Builds the exporters on a blocking thread inside
/// `runtime`: the HTTP exporters' blocking client must not be created on an async thread,
/// and the gRPC exporters' channels need the runtime.
pub async fn telemetry(
    service: &'static str,
    otlp: Otlp,
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<Telemetry> {
    tokio::task::spawn_blocking(move || {
        let _entered = runtime.enter();
        let failed = || format!("could not set up the {service} service's OTLP exporters");
        let (spans, metrics) = match &otlp {
            Otlp::Http(base) => (
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_endpoint(format!("{base}/v1/traces"))
                    .with_protocol(Protocol::HttpBinary)
                    .build(),
                opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_endpoint(format!("{base}/v1/metrics"))
                    .with_protocol(Protocol::HttpBinary)
                    .with_temporality(Temporality::Delta)
                    .build(),
            ),
            Otlp::Grpc(url) => (
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(url)
                    .build(),
                opentelemetry_otlp::MetricExporter::builder()
                    .with_tonic()
                    .with_endpoint(url)
                    .with_temporality(Temporality::Delta)
                    .build(),
            ),
        };
        let resource = Resource::builder().with_service_name(service).build();
        let processor = BatchSpanProcessor::builder(spans.with_context(failed)?)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(Duration::from_millis(500))
                    .build(),
            )
            .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource.clone())
            .build();
        let reader = PeriodicReader::builder(metrics.with_context(failed)?)
            .with_interval(Duration::from_secs(1))
            .build();
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource)
            .build();
        let meters = DeadlineMeters::new(&meter_provider);
        Ok(Telemetry {
            tracer_provider,
            meter_provider,
            meters,
        })
    })
    .await?
}

/// The deadline metrics a hop exports beside its spans (docs/instrument.md, "Deadline metrics"): the
/// budget it received, the budget left when it answered, and its exceeds by origin.
pub struct DeadlineMeters {
    received: Histogram<f64>,
    remaining: Histogram<f64>,
    exceeded: Counter<u64>,
}

impl DeadlineMeters {
    fn new(provider: &SdkMeterProvider) -> DeadlineMeters {
        let meter = provider.meter("demo");
        DeadlineMeters {
            received: meter
                .f64_histogram("deadline.budget_received")
                .with_unit("ms")
                .build(),
            remaining: meter
                .f64_histogram("deadline.budget_remaining")
                .with_unit("ms")
                .build(),
            exceeded: meter.u64_counter("deadline.exceeded").build(),
        }
    }

    /// Records one request `hop` answered, with the deadline it kept (none: nothing to
    /// record). An answer of deadline exceeded counts as `inherited` when the request
    /// arrived with nothing left, as `local` when the deadline passed at this hop; an
    /// answer passed on from a callee that ran out first, or a refusal with budget left,
    /// is not this hop's exceed.
    pub fn answered(&self, hop: &'static str, deadline: Option<Deadline>, exceeded: bool) {
        let Some(deadline) = deadline else {
            return;
        };
        let remaining = deadline.remaining_ms();
        // Histograms take no negative values (SDKs drop them): a spent budget is 0.
        let attributes = [KeyValue::new("hop", hop)];
        self.received
            .record(deadline.budget_ms.max(0.0), &attributes);
        self.remaining.record(remaining.max(0.0), &attributes);
        if !exceeded {
            return;
        }
        let origin = if deadline.budget_ms <= 0.0 {
            "inherited"
        } else if remaining <= 0.0 {
            "local"
        } else {
            return;
        };
        self.exceeded.add(
            1,
            &[KeyValue::new("hop", hop), KeyValue::new("origin", origin)],
        );
    }
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

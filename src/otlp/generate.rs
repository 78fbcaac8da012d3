//! Generated traces with budgets, for `demo`, the tests and the benchmarks: request
//! chains as OTLP export requests (`generate`, `generate_over`) and one large fan-out trace
//! as spans (`large_trace`).
//!
//! Architecture invariant: only the public OTLP and model types (and the store's clock);
//! nothing here reaches into the server, so what it generates goes through the same
//! receivers as any exporter's.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use rand::Rng as _;

use crate::clock::now_unix_nano;

/// Generates traces shaped like real request chains: an edge service calls 2–4 downstream
/// services in a chain, each hop receiving its remaining budget and forwarding less.
/// Traces start within the last minute.
pub fn generate(total_spans: usize, batch: usize) -> Vec<ExportTraceServiceRequest> {
    generate_over(total_spans, batch, Duration::from_secs(60), 0.0)
}

/// Traces start at random times within `spread` before now. A share `trouble` (0–1) of
/// them misbehave: one hop works so long before calling on that it overspends and sends
/// the rest of the chain an already-spent budget, or a call forwards a fresh 5 s timeout.
pub fn generate_over(
    total_spans: usize,
    batch: usize,
    spread: Duration,
    trouble: f64,
) -> Vec<ExportTraceServiceRequest> {
    generate_chains(total_spans, batch, spread, trouble, 3..=5)
}

/// `generate_over` with chains of `hops` services (a chain of n hops has 2n − 1 spans).
pub fn generate_chains(
    total_spans: usize,
    batch: usize,
    spread: Duration,
    trouble: f64,
    hops: std::ops::RangeInclusive<usize>,
) -> Vec<ExportTraceServiceRequest> {
    const SERVICES: [&str; 6] = [
        "edge",
        "checkout",
        "inventory",
        "pricing",
        "billing",
        "shipping",
    ];
    let mut rng = rand::rng();
    let now = now_unix_nano();
    let mut spans: Vec<(usize, Span)> = Vec::with_capacity(total_spans);
    while spans.len() < total_spans {
        let trace_id: [u8; 16] = rng.random();
        let mut start = now - rng.random_range(0..(spread.as_nanos() as u64).max(1));
        let mut budget: f64 = rng.random_range(300.0..2000.0);
        let mut parent: Vec<u8> = Vec::new();
        let hops = rng.random_range(hops.clone()).max(2);
        // Which hop misbehaves, and how (true: slow, false: inflates).
        let trouble_at = rng
            .random_bool(trouble.clamp(0.0, 1.0))
            .then(|| (rng.random_range(0..hops - 1), rng.random_bool(0.7)));
        for hop in 0..hops {
            let service = if hop == 0 {
                0
            } else {
                rng.random_range(1..SERVICES.len())
            };
            let slow = trouble_at == Some((hop, true));
            let spent = if slow {
                budget + rng.random_range(20.0..300.0)
            } else {
                rng.random_range(1.0..20.0)
            };
            let duration = if slow {
                (spent * 1e6) as u64 + rng.random_range(40_000_000..120_000_000u64)
            } else {
                rng.random_range(2_000_000..80_000_000u64)
            };
            let server_id: [u8; 8] = rng.random();
            let mut attributes = vec![
                kv_str(
                    "http.request.method",
                    if rng.random_bool(0.7) { "GET" } else { "POST" },
                ),
                kv_str(
                    "http.route",
                    &format!("/api/v1/{}/{{id}}", SERVICES[service]),
                ),
                kv_int(
                    "http.response.status_code",
                    if rng.random_bool(0.97) { 200 } else { 504 },
                ),
                kv_str(
                    "url.path",
                    &format!("/api/v1/{}/{}", SERVICES[service], rng.random::<u32>()),
                ),
                kv_str("network.peer.address", "10.0.3.17"),
            ];
            attributes.push(kv_double("deadline.remaining_ms", budget));
            spans.push((
                service,
                Span {
                    trace_id: trace_id.to_vec(),
                    span_id: server_id.to_vec(),
                    parent_span_id: parent.clone(),
                    name: format!(
                        "{} /api/v1/{}/{{id}}",
                        if hop == 0 { "GET" } else { "POST" },
                        SERVICES[service]
                    ),
                    kind: 2,
                    start_time_unix_nano: start,
                    end_time_unix_nano: start + duration,
                    attributes,
                    status: Some(Status::default()),
                    ..Default::default()
                },
            ));
            if hop + 1 == hops {
                break;
            }
            budget -= spent;
            let forwarded = if trouble_at == Some((hop, false)) {
                5000.0
            } else {
                budget
            };
            let client_id: [u8; 8] = rng.random();
            let call_start = start + (spent * 1e6) as u64;
            spans.push((
                service,
                Span {
                    trace_id: trace_id.to_vec(),
                    span_id: client_id.to_vec(),
                    parent_span_id: server_id.to_vec(),
                    name: "POST".to_string(),
                    kind: 3,
                    start_time_unix_nano: call_start,
                    end_time_unix_nano: if slow {
                        start + duration - 1_000_000
                    } else {
                        call_start + duration / 2
                    },
                    attributes: vec![
                        kv_str("http.request.method", "POST"),
                        kv_str("server.address", SERVICES[(service + 1) % SERVICES.len()]),
                        kv_str(
                            "http.request.header.x-request-budget-ms",
                            &format!("{forwarded:.0}"),
                        ),
                    ],
                    ..Default::default()
                },
            ));
            parent = client_id.to_vec();
            start = call_start + 500_000;
            budget = forwarded - 0.5;
        }
    }
    spans.truncate(total_spans);
    spans
        .chunks(batch)
        .map(|chunk| {
            let mut by_service: Vec<Vec<Span>> = vec![Vec::new(); SERVICES.len()];
            for (service, span) in chunk {
                by_service[*service].push(span.clone());
            }
            ExportTraceServiceRequest {
                resource_spans: by_service
                    .into_iter()
                    .enumerate()
                    .filter(|(_, spans)| !spans.is_empty())
                    .map(|(service, spans)| ResourceSpans {
                        resource: Some(Resource {
                            attributes: vec![
                                kv_str("service.name", SERVICES[service]),
                                kv_str("service.version", "1.4.2"),
                                kv_str("host.name", &format!("{}-7d9f8c-xk2p", SERVICES[service])),
                                kv_str("telemetry.sdk.language", "rust"),
                            ],
                            ..Default::default()
                        }),
                        scope_spans: vec![ScopeSpans {
                            scope: Some(InstrumentationScope {
                                name: "budgetscope-bench".into(),
                                version: "1".into(),
                                ..Default::default()
                            }),
                            spans,
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                    .collect(),
            }
        })
        .collect()
}

fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn kv_str(key: &str, value: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(value.into()))
}

fn kv_int(key: &str, value: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(value))
}

fn kv_double(key: &str, value: f64) -> KeyValue {
    kv(key, any_value::Value::DoubleValue(value))
}

/// One trace of about `size` spans: a fan-out tree of services where every hop receives a
/// budget and calls 3 downstream services, some of them twice (retries), some late.
pub fn large_trace(size: usize) -> Vec<crate::core::model::Span> {
    use crate::core::model::{
        AttrValue, Budget, Scope, Span as ModelSpan, SpanId, SpanKind, Status, StatusCode, TraceId,
    };
    let mut rng = rand::rng();
    let base = now_unix_nano();
    let resource = Arc::new(vec![(
        "service.name".to_string(),
        AttrValue::String("svc".into()),
    )]);
    let make = |id: u64,
                parent: Option<u64>,
                service: String,
                kind: SpanKind,
                start_ms: f64,
                duration_ms: f64,
                budget: f64| ModelSpan {
        trace_id: TraceId([9; 16]),
        span_id: SpanId((id + 1).to_be_bytes()),
        parent_span_id: parent.map(|p| SpanId((p + 1).to_be_bytes())),
        service,
        name: if kind == SpanKind::Server {
            "POST /work".into()
        } else {
            "POST".into()
        },
        kind,
        start_unix_nano: base + (start_ms * 1e6) as u64,
        end_unix_nano: base + ((start_ms + duration_ms) * 1e6) as u64,
        status: Status {
            code: StatusCode::Unset,
            message: String::new(),
        },
        attributes: vec![
            (
                "http.request.method".into(),
                AttrValue::String("POST".into()),
            ),
            ("deadline.remaining_ms".into(), AttrValue::Double(budget)),
        ],
        resource: resource.clone(),
        scope: Scope::default(),
        events: Vec::new(),
        links: Vec::new(),
        budget: Some(Budget {
            ms: budget,
            source: "deadline.remaining_ms".into(),
        }),
        warnings: Vec::new(),
    };
    let mut spans = vec![make(
        0,
        None,
        "svc0".into(),
        SpanKind::Server,
        0.0,
        1000.0,
        900.0,
    )];
    // (hop index, depth) still to expand, breadth first.
    let mut queue = std::collections::VecDeque::from([(0usize, 0usize)]);
    while let Some((hop, depth)) = queue.pop_front() {
        let (hop_start, hop_budget) = {
            let span = &spans[hop];
            (
                (span.start_unix_nano - base) as f64 / 1e6,
                span.budget.as_ref().map_or(0.0, |b| b.ms),
            )
        };
        let mut at = hop_start + 1.0;
        for call in 0..3 {
            let attempts = if rng.random_bool(0.2) { 2 } else { 1 };
            for _ in 0..attempts {
                if spans.len() + 2 > size {
                    return spans;
                }
                let duration = rng.random_range(1.0..20.0);
                let forwarded = hop_budget - (at - hop_start) - rng.random_range(0.0..3.0);
                let call_id = spans.len() as u64;
                spans.push(make(
                    call_id,
                    Some(
                        spans[hop]
                            .span_id
                            .0
                            .iter()
                            .fold(0u64, |a, b| a << 8 | *b as u64)
                            - 1,
                    ),
                    spans[hop].service.clone(),
                    SpanKind::Client,
                    at,
                    duration,
                    forwarded,
                ));
                let child = spans.len();
                spans.push(make(
                    child as u64,
                    Some(call_id),
                    format!("svc{}", (depth + call + 1) % 12),
                    SpanKind::Server,
                    at + 0.2,
                    duration - 0.4,
                    forwarded - 0.3,
                ));
                queue.push_back((child, depth + 1));
                at += duration + 0.5;
            }
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::budget::DEFAULT_BUDGET_KEYS;
    use crate::otlp::normalize::{NormalizeOptions, normalize};

    #[test]
    fn generated_traces_are_valid_and_carry_budgets() {
        let requests = generate(1_000, 100);
        assert_eq!(requests.len(), 10);
        let options = NormalizeOptions {
            budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
            retention: None,
        };
        let now = now_unix_nano();
        let spans: Vec<_> = requests
            .into_iter()
            .flat_map(|r| normalize(r, &options, now).spans)
            .collect();
        assert_eq!(spans.len(), 1_000, "every generated span is valid");
        assert!(
            spans.iter().all(|s| s.budget.is_some()),
            "every hop and call has a budget"
        );
        assert!(
            spans
                .iter()
                .any(|s| s.service == "edge" && s.parent_span_id.is_none())
        );
    }
}

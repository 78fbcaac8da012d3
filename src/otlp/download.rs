//! Stored spans back to OTLP: the "download as OTLP JSON" of the trace page, readable by
//! `budgetscope analyze`, the OpenTelemetry Collector and other OTLP tools.
//!
//! Architecture invariant: the inverse of `normalize` for everything the model keeps. Spans
//! that shared a resource (`Arc` identity) and scope come out under one `ResourceSpans` /
//! `ScopeSpans`, in their original order.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Status, span};

use crate::core::model::{AttrValue, Attributes, Span};

/// The spans as one OTLP request.
pub fn to_request(spans: &[Span]) -> ExportTraceServiceRequest {
    let mut resource_spans: Vec<(Arc<Attributes>, &str, ResourceSpans)> = Vec::new();
    for s in spans {
        let at = match resource_spans.iter().position(|(resource, service, _)| {
            (Arc::ptr_eq(resource, &s.resource) || **resource == *s.resource)
                && *service == s.service
        }) {
            Some(at) => at,
            None => {
                resource_spans.push((
                    s.resource.clone(),
                    &s.service,
                    ResourceSpans {
                        resource: Some(Resource {
                            attributes: resource_attributes(&s.resource, &s.service),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ));
                resource_spans.len() - 1
            }
        };
        let scopes = &mut resource_spans[at].2.scope_spans;
        let scope_at = match scopes.iter().position(|scope| {
            scope
                .scope
                .as_ref()
                .is_some_and(|scope| scope.name == s.scope.name && scope.version == s.scope.version)
        }) {
            Some(at) => at,
            None => {
                scopes.push(ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: s.scope.name.clone(),
                        version: s.scope.version.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                scopes.len() - 1
            }
        };
        scopes[scope_at].spans.push(to_span(s));
    }
    ExportTraceServiceRequest {
        resource_spans: resource_spans.into_iter().map(|(_, _, rs)| rs).collect(),
    }
}

/// OTLP/JSON text of the spans (hex ids, as the OTLP/JSON encoding requires).
pub fn to_json(spans: &[Span]) -> String {
    serde_json::to_string(&to_request(spans)).unwrap_or_default()
}

fn to_span(s: &Span) -> opentelemetry_proto::tonic::trace::v1::Span {
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: s.trace_id.0.to_vec(),
        span_id: s.span_id.0.to_vec(),
        parent_span_id: s.parent_span_id.map(|p| p.0.to_vec()).unwrap_or_default(),
        name: s.name.clone(),
        kind: s.kind.as_i32(),
        start_time_unix_nano: s.start_unix_nano,
        end_time_unix_nano: s.end_unix_nano,
        attributes: key_values(&s.attributes),
        events: s
            .events
            .iter()
            .map(|e| span::Event {
                time_unix_nano: e.time_unix_nano,
                name: e.name.clone(),
                attributes: key_values(&e.attributes),
                dropped_attributes_count: 0,
            })
            .collect(),
        links: s
            .links
            .iter()
            .map(|l| span::Link {
                trace_id: l.trace_id.0.to_vec(),
                span_id: l.span_id.0.to_vec(),
                attributes: key_values(&l.attributes),
                ..Default::default()
            })
            .collect(),
        status: Some(Status {
            message: s.status.message.clone(),
            code: s.status.code.as_i32(),
        }),
        ..Default::default()
    }
}

/// The resource's attributes with `service.name` set to the span's service (what
/// budgetscope shows), so a span reads back under the same service.
fn resource_attributes(resource: &Attributes, service: &str) -> Vec<KeyValue> {
    let mut attributes = key_values(resource);
    let name = KeyValue {
        key: "service.name".into(),
        value: Some(any_value_of(&AttrValue::String(service.to_string()))),
        ..Default::default()
    };
    match attributes.iter_mut().find(|kv| kv.key == "service.name") {
        Some(existing) => *existing = name,
        None if service != crate::otlp::normalize::UNKNOWN_SERVICE => attributes.insert(0, name),
        None => {}
    }
    attributes
}

fn key_values(attributes: &Attributes) -> Vec<KeyValue> {
    attributes
        .iter()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: Some(any_value_of(value)),
            ..Default::default()
        })
        .collect()
}

fn any_value_of(value: &AttrValue) -> AnyValue {
    use any_value::Value;
    let value = match value {
        AttrValue::Empty => None,
        AttrValue::String(s) => Some(Value::StringValue(s.clone())),
        AttrValue::Bool(b) => Some(Value::BoolValue(*b)),
        AttrValue::Int(i) => Some(Value::IntValue(*i)),
        AttrValue::Double(d) => Some(Value::DoubleValue(*d)),
        AttrValue::Bytes(b) => Some(Value::BytesValue(b.clone())),
        AttrValue::Array(items) => Some(Value::ArrayValue(ArrayValue {
            values: items.iter().map(any_value_of).collect(),
        })),
        AttrValue::Map(entries) => Some(Value::KvlistValue(KeyValueList {
            values: key_values(entries),
        })),
    };
    AnyValue { value }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::normalize::{NormalizeOptions, normalize};

    #[test]
    fn exported_json_normalizes_back_to_the_same_spans() {
        let text = include_str!("../../tests/fixtures/inflated_checkout.otlp.json");
        let request: ExportTraceServiceRequest = serde_json::from_str(text).unwrap();
        let options = NormalizeOptions {
            budget_keys: crate::core::budget::DEFAULT_BUDGET_KEYS
                .iter()
                .map(|k| k.to_string())
                .collect(),
            retention: None,
        };
        let original = normalize(request, &options, u64::MAX / 2).spans;
        assert!(!original.is_empty());
        let exported: ExportTraceServiceRequest =
            serde_json::from_str(&to_json(&original)).unwrap();
        let again = normalize(exported, &options, u64::MAX / 2).spans;
        assert_eq!(again, original);
    }

    #[test]
    fn every_span_reads_back_under_its_own_service() {
        // Generated spans share one resource but name their services themselves.
        let spans = crate::otlp::generate::large_trace(60);
        let options = NormalizeOptions {
            budget_keys: crate::core::budget::DEFAULT_BUDGET_KEYS
                .iter()
                .map(|k| k.to_string())
                .collect(),
            retention: None,
        };
        let again = normalize(to_request(&spans), &options, u64::MAX / 2).spans;
        let services = |spans: &[Span]| -> Vec<(String, String)> {
            let mut v: Vec<_> = spans
                .iter()
                .map(|s| (s.span_id.to_hex(), s.service.clone()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(services(&again), services(&spans));
    }
}

//! A protobuf decoder for OTLP trace requests that survives invalid UTF-8.
//!
//! prost refuses a whole message when one `string` field is not UTF-8, which would lose
//! every valid span sent beside one badly encoded name. These mirror messages have the
//! same field numbers with `bytes` where OTLP has `string`; `into_request` turns them into
//! the generated OTLP types, replacing invalid sequences with U+FFFD and reporting that it
//! did. For valid text the conversion moves the bytes without copying. Receivers call
//! `decode_request`, which tries the generated types first and these only for a body the
//! generated types refuse.
//!
//! Field numbers follow opentelemetry-proto's trace.proto, common.proto and resource.proto
//! (v1). Fields budgetscope does not keep (dropped counts, flags, schema URLs, trace state,
//! entity refs) are not declared: prost skips unknown fields.

use opentelemetry_proto::tonic::collector::trace::v1 as collector;
use opentelemetry_proto::tonic::common::v1 as common;
use opentelemetry_proto::tonic::resource::v1 as resource;
use opentelemetry_proto::tonic::trace::v1 as trace;

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportRequest {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Resource {
    #[prost(message, repeated, tag = "1")]
    attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    scope: Option<Scope>,
    #[prost(message, repeated, tag = "2")]
    spans: Vec<Span>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Scope {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    version: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Span {
    #[prost(bytes = "vec", tag = "1")]
    trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    parent_span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "5")]
    name: Vec<u8>,
    #[prost(int32, tag = "6")]
    kind: i32,
    #[prost(fixed64, tag = "7")]
    start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "11")]
    events: Vec<Event>,
    #[prost(message, repeated, tag = "13")]
    links: Vec<Link>,
    #[prost(message, optional, tag = "15")]
    status: Option<Status>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(fixed64, tag = "1")]
    time_unix_nano: u64,
    #[prost(bytes = "vec", tag = "2")]
    name: Vec<u8>,
    #[prost(message, repeated, tag = "3")]
    attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Link {
    #[prost(bytes = "vec", tag = "1")]
    trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    span_id: Vec<u8>,
    #[prost(message, repeated, tag = "4")]
    attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Status {
    #[prost(bytes = "vec", tag = "2")]
    message: Vec<u8>,
    #[prost(int32, tag = "3")]
    code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct AnyValue {
    #[prost(oneof = "Value", tags = "1, 2, 3, 4, 5, 6, 7")]
    value: Option<Value>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Value {
    #[prost(bytes, tag = "1")]
    String(Vec<u8>),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(double, tag = "4")]
    Double(f64),
    #[prost(message, tag = "5")]
    Array(ArrayValue),
    #[prost(message, tag = "6")]
    Kvlist(KeyValueList),
    #[prost(bytes, tag = "7")]
    Bytes(Vec<u8>),
}

#[derive(Clone, PartialEq, prost::Message)]
struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    values: Vec<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    values: Vec<KeyValue>,
}

/// Collects whether any text had to be repaired.
#[derive(Default)]
struct Text {
    repaired: bool,
}

impl Text {
    fn string(&mut self, bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap_or_else(|error| {
            self.repaired = true;
            String::from_utf8_lossy(error.as_bytes()).into_owned()
        })
    }

    fn attributes(&mut self, attributes: Vec<KeyValue>) -> Vec<common::KeyValue> {
        attributes
            .into_iter()
            .map(|kv| common::KeyValue {
                key: self.string(kv.key),
                value: kv.value.map(|v| self.value(v)),
                ..Default::default()
            })
            .collect()
    }

    fn value(&mut self, value: AnyValue) -> common::AnyValue {
        use common::any_value::Value as V;
        common::AnyValue {
            value: value.value.map(|v| match v {
                Value::String(s) => V::StringValue(self.string(s)),
                Value::Bool(b) => V::BoolValue(b),
                Value::Int(i) => V::IntValue(i),
                Value::Double(d) => V::DoubleValue(d),
                Value::Bytes(b) => V::BytesValue(b),
                Value::Array(a) => V::ArrayValue(common::ArrayValue {
                    values: a.values.into_iter().map(|v| self.value(v)).collect(),
                }),
                Value::Kvlist(kv) => V::KvlistValue(common::KeyValueList {
                    values: self.attributes(kv.values),
                }),
            }),
        }
    }

    fn span(&mut self, span: Span) -> trace::Span {
        trace::Span {
            trace_id: span.trace_id,
            span_id: span.span_id,
            parent_span_id: span.parent_span_id,
            name: self.string(span.name),
            kind: span.kind,
            start_time_unix_nano: span.start_time_unix_nano,
            end_time_unix_nano: span.end_time_unix_nano,
            attributes: self.attributes(span.attributes),
            events: span
                .events
                .into_iter()
                .map(|e| trace::span::Event {
                    time_unix_nano: e.time_unix_nano,
                    name: self.string(e.name),
                    attributes: self.attributes(e.attributes),
                    ..Default::default()
                })
                .collect(),
            links: span
                .links
                .into_iter()
                .map(|l| trace::span::Link {
                    trace_id: l.trace_id,
                    span_id: l.span_id,
                    attributes: self.attributes(l.attributes),
                    ..Default::default()
                })
                .collect(),
            status: span.status.map(|s| trace::Status {
                message: self.string(s.message),
                code: s.code,
            }),
            ..Default::default()
        }
    }
}

/// Decodes an OTLP export request body, and tells whether text had to be repaired. The
/// generated OTLP types decode a valid body faster: one copy per string and no conversion
/// (`bench receive`: see BENCHMARKS.md). Only a body they refuse (text that is not UTF-8, or
/// not OTLP at all) is decoded again with the mirror types here, whose error is reported.
pub fn decode_request(
    body: bytes::Bytes,
) -> Result<(collector::ExportTraceServiceRequest, bool), prost::DecodeError> {
    use prost::Message as _;
    match collector::ExportTraceServiceRequest::decode(body.clone()) {
        Ok(request) => Ok((request, false)),
        Err(_) => ExportRequest::decode(body).map(ExportRequest::into_request),
    }
}

impl ExportRequest {
    /// The OTLP request, and whether any text was not valid UTF-8 and was repaired.
    pub fn into_request(self) -> (collector::ExportTraceServiceRequest, bool) {
        let mut text = Text::default();
        let resource_spans = self
            .resource_spans
            .into_iter()
            .map(|rs| trace::ResourceSpans {
                resource: rs.resource.map(|r| resource::Resource {
                    attributes: text.attributes(r.attributes),
                    ..Default::default()
                }),
                scope_spans: rs
                    .scope_spans
                    .into_iter()
                    .map(|ss| trace::ScopeSpans {
                        scope: ss.scope.map(|s| common::InstrumentationScope {
                            name: text.string(s.name),
                            version: text.string(s.version),
                            ..Default::default()
                        }),
                        spans: ss.spans.into_iter().map(|s| text.span(s)).collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        (
            collector::ExportTraceServiceRequest { resource_spans },
            text.repaired,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::tests::{kv, otlp_span, request};
    use prost::Message as _;

    #[test]
    fn valid_requests_decode_exactly_as_the_generated_types_do() {
        let mut span = otlp_span(1, 2, "GET /x");
        span.parent_span_id = vec![3; 8];
        span.attributes = vec![
            kv("s", common::any_value::Value::StringValue("v".into())),
            kv("i", common::any_value::Value::IntValue(-4)),
            kv("d", common::any_value::Value::DoubleValue(0.5)),
            kv("b", common::any_value::Value::BytesValue(vec![0, 1])),
            kv(
                "m",
                common::any_value::Value::KvlistValue(common::KeyValueList {
                    values: vec![kv("k", common::any_value::Value::BoolValue(true))],
                }),
            ),
        ];
        span.events = vec![trace::span::Event {
            time_unix_nano: 7,
            name: "e".into(),
            ..Default::default()
        }];
        span.links = vec![trace::span::Link {
            trace_id: vec![4; 16],
            span_id: vec![5; 8],
            ..Default::default()
        }];
        span.status = Some(trace::Status {
            message: "m".into(),
            code: 2,
        });
        let original = request(Some("svc"), vec![span]);
        let bytes = original.encode_to_vec();
        let (decoded, repaired) = ExportRequest::decode(bytes.as_slice())
            .unwrap()
            .into_request();
        assert!(!repaired);
        assert_eq!(decoded, original);
    }

    #[test]
    fn decode_request_takes_the_generated_types_then_falls_back() {
        let valid = request(Some("svc"), vec![otlp_span(1, 2, "ab__")]);
        let body = valid.encode_to_vec();
        assert_eq!(
            decode_request(body.clone().into()).unwrap(),
            (valid.clone(), false)
        );

        // Not UTF-8 in a name: repaired by the fallback, and reported.
        let at = body.windows(4).position(|w| w == b"ab__").unwrap();
        let mut forged = body.clone();
        forged[at + 2] = 0xff;
        let (decoded, repaired) = decode_request(forged.into()).unwrap();
        assert!(repaired);
        assert_eq!(
            decoded.resource_spans[0].scope_spans[0].spans[0].name,
            "ab\u{FFFD}_"
        );

        // Not UTF-8 in a field budgetscope does not keep (trace_state): the generated types
        // refuse the body, the fallback skips the field, and nothing needed repair.
        let mut with_state = valid.clone();
        with_state.resource_spans[0].scope_spans[0].spans[0].trace_state = "st__".into();
        let body = with_state.encode_to_vec();
        let at = body.windows(4).position(|w| w == b"st__").unwrap();
        let mut forged = body.clone();
        forged[at + 2] = 0xff;
        let (decoded, repaired) = decode_request(forged.into()).unwrap();
        assert!(!repaired);
        assert_eq!(decoded, valid);

        assert!(decode_request(bytes::Bytes::from_static(&[0x0a, 0xff])).is_err());
    }

    #[test]
    fn invalid_utf8_is_repaired_and_reported() {
        let body = request(Some("svc"), vec![otlp_span(1, 2, "ab__")]).encode_to_vec();
        let at = body.windows(4).position(|w| w == b"ab__").unwrap();
        let mut forged = body.clone();
        forged[at + 2] = 0xff;
        assert!(
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(
                forged.as_slice()
            )
            .is_err(),
            "the generated decoder refuses it"
        );
        let (decoded, repaired) = ExportRequest::decode(forged.as_slice())
            .unwrap()
            .into_request();
        assert!(repaired);
        assert_eq!(
            decoded.resource_spans[0].scope_spans[0].spans[0].name,
            "ab\u{FFFD}_"
        );
    }
}

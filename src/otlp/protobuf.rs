//! A protobuf decoder for OTLP trace requests that survives invalid UTF-8.
//!
//! prost refuses a whole message when one `string` field is not UTF-8, which would lose
//! every valid span sent beside one badly encoded name. These mirror messages have the
//! same field numbers with `bytes` where OTLP has `string`; `into_request` turns them into
//! the generated OTLP types, replacing invalid sequences with U+FFFD and reporting that it
//! did. For valid text the conversion moves the bytes without copying. `decode.rs` tries
//! the generated types first and these only for a body they refuse. `protobuf_metrics.rs`
//! does the same for metrics requests, with the resource, scope, attribute and text types
//! here.
//!
//! Field numbers follow opentelemetry-proto's trace.proto, common.proto and resource.proto
//! (v1). Fields budgetscope does not keep (dropped counts, flags, schema URLs, trace state,
//! entity refs) are not declared: prost skips unknown fields.

use opentelemetry_proto::tonic::collector::trace::v1 as collector;
use opentelemetry_proto::tonic::common::v1 as common;
use opentelemetry_proto::tonic::resource::v1 as resource;
use opentelemetry_proto::tonic::trace::v1 as trace;
use prost::DecodeError;

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
pub(super) struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub(super) attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    scope: Option<Scope>,
    #[prost(message, repeated, tag = "2")]
    spans: Vec<Span>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Scope {
    #[prost(bytes = "vec", tag = "1")]
    pub(super) name: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(super) version: Vec<u8>,
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
pub(super) struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    /// The `AnyValue` as encoded, read by `Text::value`: prost's recursion limit would
    /// refuse a deeply nested value, and with it the whole request.
    #[prost(bytes = "bytes", optional, tag = "2")]
    value: Option<bytes::Bytes>,
}

/// Values nested deeper than this are not decoded; normalising cuts them one level earlier
/// (`normalize::MAX_VALUE_DEPTH`), with a warning on the span.
const MAX_DECODED_DEPTH: usize = crate::otlp::normalize::MAX_VALUE_DEPTH + 1;

/// A length-delimited field's bytes (prost's checks of wire type and length).
fn delimited(
    wire: prost::encoding::WireType,
    buf: &mut bytes::Bytes,
) -> Result<bytes::Bytes, DecodeError> {
    let mut out = bytes::Bytes::new();
    prost::encoding::bytes::merge(
        wire,
        &mut out,
        buf,
        prost::encoding::DecodeContext::default(),
    )?;
    Ok(out)
}

/// Collects whether any text had to be repaired.
#[derive(Default)]
pub(super) struct Text {
    pub(super) repaired: bool,
}

impl Text {
    pub(super) fn string(&mut self, bytes: Vec<u8>) -> String {
        String::from_utf8(bytes).unwrap_or_else(|error| {
            self.repaired = true;
            String::from_utf8_lossy(error.as_bytes()).into_owned()
        })
    }

    pub(super) fn attributes(
        &mut self,
        attributes: Vec<KeyValue>,
    ) -> Result<Vec<common::KeyValue>, DecodeError> {
        attributes
            .into_iter()
            .map(|kv| {
                Ok(common::KeyValue {
                    key: self.string(kv.key),
                    value: kv.value.map(|v| self.value(v, 0)).transpose()?,
                    ..Default::default()
                })
            })
            .collect()
    }

    /// An encoded `AnyValue`. Arrays and key-value lists deeper than `MAX_DECODED_DEPTH`
    /// are left empty; the recursion is bounded by it.
    fn value(
        &mut self,
        mut buf: bytes::Bytes,
        depth: usize,
    ) -> Result<common::AnyValue, DecodeError> {
        use bytes::Buf as _;
        use common::any_value::Value as V;
        use prost::encoding::{DecodeContext, decode_key, skip_field};
        let ctx = DecodeContext::default;
        let mut value = None;
        while buf.has_remaining() {
            let (tag, wire) = decode_key(&mut buf)?;
            value = match tag {
                1 => Some(V::StringValue(
                    self.string(delimited(wire, &mut buf)?.to_vec()),
                )),
                2 => {
                    let mut b = false;
                    prost::encoding::bool::merge(wire, &mut b, &mut buf, ctx())?;
                    Some(V::BoolValue(b))
                }
                3 => {
                    let mut i = 0i64;
                    prost::encoding::int64::merge(wire, &mut i, &mut buf, ctx())?;
                    Some(V::IntValue(i))
                }
                4 => {
                    let mut d = 0f64;
                    prost::encoding::double::merge(wire, &mut d, &mut buf, ctx())?;
                    Some(V::DoubleValue(d))
                }
                5 => {
                    let items = self.list(delimited(wire, &mut buf)?, depth, |text, item| {
                        text.value(item, depth + 1)
                    })?;
                    Some(V::ArrayValue(common::ArrayValue { values: items }))
                }
                6 => {
                    let items = self.list(delimited(wire, &mut buf)?, depth, |text, entry| {
                        text.key_value(entry, depth + 1)
                    })?;
                    Some(V::KvlistValue(common::KeyValueList { values: items }))
                }
                7 => Some(V::BytesValue(delimited(wire, &mut buf)?.to_vec())),
                _ => {
                    skip_field(wire, tag, &mut buf, ctx())?;
                    value
                }
            };
        }
        Ok(common::AnyValue { value })
    }

    /// The items (field 1) of an encoded array or key-value list at `depth`, each read by
    /// `item`; none past `MAX_DECODED_DEPTH`.
    fn list<T>(
        &mut self,
        mut buf: bytes::Bytes,
        depth: usize,
        mut item: impl FnMut(&mut Self, bytes::Bytes) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, DecodeError> {
        use bytes::Buf as _;
        use prost::encoding::{DecodeContext, decode_key, skip_field};
        let mut items = Vec::new();
        while depth < MAX_DECODED_DEPTH && buf.has_remaining() {
            let (tag, wire) = decode_key(&mut buf)?;
            if tag == 1 {
                let bytes = delimited(wire, &mut buf)?;
                items.push(item(self, bytes)?);
            } else {
                skip_field(wire, tag, &mut buf, DecodeContext::default())?;
            }
        }
        Ok(items)
    }

    /// An encoded `KeyValue` inside a key-value list at `depth`.
    fn key_value(
        &mut self,
        mut buf: bytes::Bytes,
        depth: usize,
    ) -> Result<common::KeyValue, DecodeError> {
        use bytes::Buf as _;
        use prost::encoding::{DecodeContext, decode_key, skip_field};
        let mut out = common::KeyValue::default();
        while buf.has_remaining() {
            let (tag, wire) = decode_key(&mut buf)?;
            match tag {
                1 => out.key = self.string(delimited(wire, &mut buf)?.to_vec()),
                2 => out.value = Some(self.value(delimited(wire, &mut buf)?, depth)?),
                _ => skip_field(wire, tag, &mut buf, DecodeContext::default())?,
            }
        }
        Ok(out)
    }

    fn span(&mut self, span: Span) -> Result<trace::Span, DecodeError> {
        let mut events = Vec::with_capacity(span.events.len());
        for e in span.events {
            events.push(trace::span::Event {
                time_unix_nano: e.time_unix_nano,
                name: self.string(e.name),
                attributes: self.attributes(e.attributes)?,
                ..Default::default()
            });
        }
        let mut links = Vec::with_capacity(span.links.len());
        for l in span.links {
            links.push(trace::span::Link {
                trace_id: l.trace_id,
                span_id: l.span_id,
                attributes: self.attributes(l.attributes)?,
                ..Default::default()
            });
        }
        Ok(trace::Span {
            trace_id: span.trace_id,
            span_id: span.span_id,
            parent_span_id: span.parent_span_id,
            name: self.string(span.name),
            kind: span.kind,
            start_time_unix_nano: span.start_time_unix_nano,
            end_time_unix_nano: span.end_time_unix_nano,
            attributes: self.attributes(span.attributes)?,
            events,
            links,
            status: span.status.map(|s| trace::Status {
                message: self.string(s.message),
                code: s.code,
            }),
            ..Default::default()
        })
    }
}

/// Decodes a body the generated OTLP types refused with the mirror types, and tells
/// whether text had to be repaired. The generated types decode a valid body faster (one
/// copy per string and no conversion: `budgetscope-bench receive`), so `decode::decode_traces`
/// tries them first.
pub fn decode_mirror(
    body: bytes::Bytes,
) -> Result<(collector::ExportTraceServiceRequest, bool), DecodeError> {
    use prost::Message as _;
    ExportRequest::decode(body)?.into_request()
}

impl ExportRequest {
    /// The OTLP request, and whether any text was not valid UTF-8 and was repaired; an
    /// error when an attribute value is not a valid `AnyValue`.
    pub fn into_request(self) -> Result<(collector::ExportTraceServiceRequest, bool), DecodeError> {
        let mut text = Text::default();
        let mut resource_spans = Vec::with_capacity(self.resource_spans.len());
        for rs in self.resource_spans {
            let resource = match rs.resource {
                Some(r) => Some(resource::Resource {
                    attributes: text.attributes(r.attributes)?,
                    ..Default::default()
                }),
                None => None,
            };
            let mut scope_spans = Vec::with_capacity(rs.scope_spans.len());
            for ss in rs.scope_spans {
                let scope = ss.scope.map(|s| common::InstrumentationScope {
                    name: text.string(s.name),
                    version: text.string(s.version),
                    ..Default::default()
                });
                let mut spans = Vec::with_capacity(ss.spans.len());
                for span in ss.spans {
                    spans.push(text.span(span)?);
                }
                scope_spans.push(trace::ScopeSpans {
                    scope,
                    spans,
                    ..Default::default()
                });
            }
            resource_spans.push(trace::ResourceSpans {
                resource,
                scope_spans,
                ..Default::default()
            });
        }
        Ok((
            collector::ExportTraceServiceRequest { resource_spans },
            text.repaired,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::normalize::tests::{kv, otlp_span, request};
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
            .into_request()
            .unwrap();
        assert!(!repaired);
        assert_eq!(decoded, original);
    }

    /// The protobuf path of `decode::decode_traces`, as (request, repaired).
    fn decode_request(
        body: bytes::Bytes,
    ) -> Result<(collector::ExportTraceServiceRequest, bool), crate::otlp::decode::DecodeError>
    {
        crate::otlp::decode::decode_traces(body, crate::otlp::decode::Format::Protobuf)
            .map(|d| (d.request, d.repaired))
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
            .into_request()
            .unwrap();
        assert!(repaired);
        assert_eq!(
            decoded.resource_spans[0].scope_spans[0].spans[0].name,
            "ab\u{FFFD}_"
        );
    }

    /// A value `depth` arrays or key-value lists deep, around a string.
    fn nested(depth: usize, kvlist: bool) -> common::any_value::Value {
        use common::any_value::Value as V;
        let mut value = V::StringValue("bottom".into());
        for _ in 0..depth {
            let inner = common::AnyValue { value: Some(value) };
            value = if kvlist {
                V::KvlistValue(common::KeyValueList {
                    values: vec![common::KeyValue {
                        key: "k".into(),
                        value: Some(inner),
                        ..Default::default()
                    }],
                })
            } else {
                V::ArrayValue(common::ArrayValue {
                    values: vec![inner],
                })
            };
        }
        value
    }

    #[test]
    fn values_nested_past_prosts_limit_are_cut_not_the_request_refused() {
        let mut deep = otlp_span(1, 2, "deep");
        deep.attributes = vec![kv("kv", nested(40, true)), kv("a", nested(60, false))];
        let mut plain = otlp_span(1, 3, "plain");
        plain.attributes = vec![kv("s", nested(2, true))];
        let body = request(Some("svc"), vec![deep, plain]).encode_to_vec();
        assert!(
            collector::ExportTraceServiceRequest::decode(body.as_slice()).is_err(),
            "the generated types refuse it"
        );
        let (decoded, repaired) = decode_request(body.into()).unwrap();
        assert!(!repaired);
        let out = crate::otlp::normalize::normalize(
            decoded,
            &crate::otlp::normalize::tests::options(),
            crate::otlp::normalize::tests::NOW,
        );
        assert_eq!(out.spans.len(), 2, "both spans kept");
        let depth_of = |mut value: &crate::core::model::AttrValue| {
            let mut depth = 0;
            loop {
                value = match value {
                    crate::core::model::AttrValue::Map(items) => &items[0].1,
                    crate::core::model::AttrValue::Array(items) => &items[0],
                    other => return (depth, other.clone()),
                };
                depth += 1;
            }
        };
        for (_, value) in &out.spans[0].attributes {
            let (depth, bottom) = depth_of(value);
            assert_eq!(depth, crate::otlp::normalize::MAX_VALUE_DEPTH);
            assert_eq!(
                bottom,
                crate::core::model::AttrValue::String(crate::otlp::normalize::CUT_VALUE.into())
            );
        }
        assert!(out.spans[0].warnings[0].contains("nested deeper than 16 levels"));
        assert!(out.spans[1].warnings.is_empty());
        assert_eq!(depth_of(&out.spans[1].attributes[0].1).0, 2);
    }
}

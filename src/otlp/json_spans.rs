//! OTLP/JSON bodies the fast path (`json::parse`) declines, read span by span, so that one
//! odd field costs its own span and never its neighbours.
//!
//! Each span is decoded alone by opentelemetry-proto's serde types, after the spellings
//! protobuf's JSON mapping allows and those types do not are rewritten: enum names
//! (`"kind": "SPAN_KIND_CLIENT"`, `"code": "STATUS_CODE_ERROR"`), doubles as strings
//! (`"doubleValue": "NaN"`, `"Infinity"`, `"2.5"`), trace and span ids in base64 (the
//! mapping's form for bytes) instead of OTLP/JSON's hex, null for a default value, and an
//! empty array or key-value list without its `values`. A span that still does not decode
//! (a negative or fractional timestamp, a string where a number must be) is rejected with
//! the decoder's reason, for `partial_success`; the others are kept.
//!
//! Architecture invariant: a body opentelemetry-proto's serde types accept is read exactly
//! as they read it, with nothing rejected (the differential test in `json_tests.rs`); the
//! one exception is a number beyond a double's range under a key they skip, which
//! `serde_json::Value` cannot hold, so the body is refused whole.

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, span, status};
use serde_json::Value;

/// A span left out, and which: (reason, a description of the span).
pub type Rejection = (String, String);

/// The request with every span that decodes, and one rejection per span that does not;
/// an error saying why when the body's outer structure is not an export request at all.
pub fn decode(text: &str) -> Result<(ExportTraceServiceRequest, Vec<Rejection>), String> {
    let depth = json_depth(text);
    if depth > MAX_JSON_DEPTH {
        return Err(format!("nested deeper than {MAX_JSON_DEPTH} levels"));
    }
    if depth <= SHALLOW {
        return decode_body(serde_json::from_str(text).map_err(|e| e.to_string())?);
    }
    // Deeper than serde_json's own limit: read without it, on a thread whose stack holds
    // `MAX_JSON_DEPTH` levels of the recursive parser, and cut the deep values there.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(DEEP_STACK)
            .spawn_scoped(scope, || {
                let mut reader = serde_json::Deserializer::from_str(text);
                reader.disable_recursion_limit();
                let body = serde::Deserialize::deserialize(&mut reader).map_err(|e| {
                    let error: serde_json::Error = e;
                    error.to_string()
                })?;
                decode_body(body)
            })
            .map_err(|e| format!("could not start the deep reader: {e}"))?
            .join()
            .map_err(|_| "the deep reader failed".to_string())?
    })
}

/// Bodies nested at most this deep are read with serde_json's own limit (128).
const SHALLOW: usize = 120;

/// Deeper bodies are refused whole: no exporter writes them.
const MAX_JSON_DEPTH: usize = 2_000;

/// The stack for reading a body up to `MAX_JSON_DEPTH` deep (a few hundred bytes a level).
const DEEP_STACK: usize = 64 << 20;

/// How deep arrays and objects nest in a JSON text, without parsing it.
fn json_depth(text: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for byte in text.bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn decode_body(body: Value) -> Result<(ExportTraceServiceRequest, Vec<Rejection>), String> {
    let mut rejected = Vec::new();
    let Value::Object(mut top) = body else {
        // Not an object: whatever the reference makes of it (a struct as an array).
        return Ok((from_value(body, "the request")?, rejected));
    };
    let items = take_array(&mut top, "resourceSpans")?;
    let mut request: ExportTraceServiceRequest = from_value(Value::Object(top), "the request")?;
    for item in items {
        let Value::Object(mut item) = item else {
            request
                .resource_spans
                .push(from_value(item, "resourceSpans")?);
            continue;
        };
        let scopes = take_array(&mut item, "scopeSpans")?;
        let mut out: ResourceSpans = decode_part(item, "resource")?;
        for scope in scopes {
            let Value::Object(mut scope) = scope else {
                out.scope_spans.push(from_value(scope, "scopeSpans")?);
                continue;
            };
            let spans = take_array(&mut scope, "spans")?;
            let mut scope_out: ScopeSpans = decode_part(scope, "scope")?;
            for value in spans {
                match decode_span(&value) {
                    Ok(span) => scope_out.spans.push(span),
                    Err(reason) => rejected.push((reason, describe(&value))),
                }
            }
            out.scope_spans.push(scope_out);
        }
        request.resource_spans.push(out);
    }
    Ok((request, rejected))
}

/// `what`, decoded by the reference; its error names `what`.
fn from_value<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| format!("{what}: {e}"))
}

/// Takes an array member out of an object; absent or null is empty; anything else is no
/// request.
fn take_array(
    object: &mut serde_json::Map<String, Value>,
    key: &str,
) -> Result<Vec<Value>, String> {
    match object.remove(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(format!("{key} is not an array")),
    }
}

/// A `ResourceSpans` or `ScopeSpans` without its list, decoded by the reference after the
/// attribute rewrites of its `resource` or `scope` (`part`).
fn decode_part<T: serde::de::DeserializeOwned + HasPart>(
    object: serde_json::Map<String, Value>,
    part: &str,
) -> Result<T, String> {
    let mut value = Value::Object(object);
    let mut non_finite = Vec::new();
    rewrite_attributes(
        value.get_mut(part).and_then(|p| p.get_mut("attributes")),
        &mut non_finite,
    );
    let mut out: T = from_value(value, part)?;
    if let Some(attributes) = out.attributes_mut() {
        restore_non_finite(attributes, &non_finite);
    }
    Ok(out)
}

trait HasPart {
    /// The attributes of its resource or scope, when it has one.
    fn attributes_mut(&mut self) -> Option<&mut Vec<KeyValue>>;
}

impl HasPart for ResourceSpans {
    fn attributes_mut(&mut self) -> Option<&mut Vec<KeyValue>> {
        self.resource.as_mut().map(|r| &mut r.attributes)
    }
}

impl HasPart for ScopeSpans {
    fn attributes_mut(&mut self) -> Option<&mut Vec<KeyValue>> {
        self.scope.as_mut().map(|s| &mut s.attributes)
    }
}

/// Drops object members that are null: protobuf's JSON mapping reads null as the
/// field's default, the serde types refuse it.
fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(members) => {
            members.retain(|_, v| !v.is_null());
            members.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

fn decode_span(value: &Value) -> Result<Span, String> {
    let mut value = value.clone();
    drop_nulls(&mut value);
    let object = value.as_object_mut().ok_or("a span is not a JSON object")?;
    if let Some(kind) = object.get_mut("kind")
        && let Some(name) = kind.as_str()
    {
        let number = span::SpanKind::from_str_name(name)
            .ok_or_else(|| format!("kind {name:?} is not a span kind"))?;
        *kind = Value::from(number as i32);
    }
    if let Some(code) = object.get_mut("status").and_then(|s| s.get_mut("code"))
        && let Some(name) = code.as_str()
    {
        let number = status::StatusCode::from_str_name(name)
            .ok_or_else(|| format!("status code {name:?} is not a status code"))?;
        *code = Value::from(number as i32);
    }
    for (key, bytes) in [("traceId", 16), ("spanId", 8), ("parentSpanId", 8)] {
        if let Some(id) = object.get_mut(key) {
            base64_id_to_hex(id, bytes);
        }
    }
    for key in ["events", "links"] {
        if let Some(Value::Array(items)) = object.get_mut(key) {
            for item in items {
                if let Some(item) = item.as_object_mut() {
                    for id in ["traceId", "spanId"] {
                        if let Some(value) = item.get_mut(id) {
                            base64_id_to_hex(value, if id == "traceId" { 16 } else { 8 });
                        }
                    }
                }
            }
        }
    }
    // Non-finite doubles decode as 0 and are put back after, where they were.
    let mut non_finite = Vec::new();
    rewrite_attributes(value.get_mut("attributes"), &mut non_finite);
    let mut event_non_finite = Vec::new();
    let mut link_non_finite = Vec::new();
    for (key, found) in [
        ("events", &mut event_non_finite),
        ("links", &mut link_non_finite),
    ] {
        if let Some(Value::Array(items)) = value.get_mut(key) {
            for item in items {
                let mut here = Vec::new();
                rewrite_attributes(item.get_mut("attributes"), &mut here);
                found.push(here);
            }
        }
    }
    let mut span: Span =
        serde_json::from_value(value).map_err(|error| format!("not valid OTLP/JSON: {error}"))?;
    restore_non_finite(&mut span.attributes, &non_finite);
    for (event, found) in span.events.iter_mut().zip(&event_non_finite) {
        restore_non_finite(&mut event.attributes, found);
    }
    for (link, found) in span.links.iter_mut().zip(&link_non_finite) {
        restore_non_finite(&mut link.attributes, found);
    }
    Ok(span)
}

/// An id in base64 (protobuf's JSON form for bytes) of the right length, as hex.
fn base64_id_to_hex(id: &mut Value, bytes: usize) {
    let Some(text) = id.as_str() else { return };
    if text.len() == bytes * 2 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return;
    }
    let engine = base64::engine::general_purpose::STANDARD;
    if let Ok(decoded) = engine.decode(text)
        && decoded.len() == bytes
    {
        *id = Value::from(hex::encode(decoded));
    }
}

/// Where a non-finite double was: the path of indexes from an attribute list through array
/// and key-value-list values, and the value.
type NonFinite = (Vec<usize>, f64);

/// Rewrites `doubleValue` strings in an attribute list: finite numbers become JSON numbers;
/// NaN and the infinities become 0, recorded in `found` to be put back after decoding.
fn rewrite_attributes(list: Option<&mut Value>, found: &mut Vec<NonFinite>) {
    let Some(Value::Array(items)) = list else {
        return;
    };
    for (i, item) in items.iter_mut().enumerate() {
        if let Some(value) = item.get_mut("value") {
            rewrite_any_value(value, &mut vec![i], found);
        }
    }
}

fn rewrite_any_value(value: &mut Value, path: &mut Vec<usize>, found: &mut Vec<NonFinite>) {
    // Bounded by the body's depth, at most `MAX_JSON_DEPTH`.
    let Some(object) = value.as_object_mut() else {
        return;
    };
    // Lists past the depth normalising keeps lose their items, as over protobuf
    // (`protobuf::MAX_DECODED_DEPTH`); normalising then cuts them with a warning.
    if path.len() > crate::otlp::normalize::MAX_VALUE_DEPTH + 1 {
        for key in ["arrayValue", "kvlistValue"] {
            if let Some(Value::Object(list)) = object.get_mut(key) {
                list.insert("values".into(), Value::Array(Vec::new()));
            }
        }
    }
    if let Some(double) = object.get_mut("doubleValue")
        && let Some(text) = double.as_str()
        && let Ok(number) = text.trim().parse::<f64>()
    {
        if number.is_finite() {
            *double = Value::from(number);
        } else {
            *double = Value::from(0.0);
            found.push((path.clone(), number));
        }
    }
    let key = if object.contains_key("arrayValue") {
        "arrayValue"
    } else {
        "kvlistValue"
    };
    // An empty list may leave out its values (the mapping's default).
    if let Some(Value::Object(list)) = object.get_mut(key) {
        list.entry("values")
            .or_insert_with(|| Value::Array(Vec::new()));
    }
    let nested = object
        .get_mut(key)
        .and_then(|v| v.get_mut("values"))
        .and_then(Value::as_array_mut);
    if let Some(items) = nested {
        for (i, item) in items.iter_mut().enumerate() {
            path.push(i);
            // Array items are values; key-value items hold theirs under "value".
            if item.get("key").is_some() {
                if let Some(inner) = item.get_mut("value") {
                    rewrite_any_value(inner, path, found);
                }
            } else {
                rewrite_any_value(item, path, found);
            }
            path.pop();
        }
    }
}

/// Puts the non-finite doubles `rewrite_attributes` replaced back into the decoded list.
fn restore_non_finite(attributes: &mut [KeyValue], found: &[NonFinite]) {
    for (path, number) in found {
        let Some((first, rest)) = path.split_first() else {
            continue;
        };
        let mut at = attributes.get_mut(*first).and_then(|kv| kv.value.as_mut());
        for &i in rest {
            at = match at.and_then(|v| v.value.as_mut()) {
                Some(any_value::Value::ArrayValue(array)) => array.values.get_mut(i),
                Some(any_value::Value::KvlistValue(list)) => {
                    list.values.get_mut(i).and_then(|kv| kv.value.as_mut())
                }
                _ => None,
            };
        }
        if let Some(AnyValue {
            value: Some(any_value::Value::DoubleValue(slot)),
        }) = at
        {
            *slot = *number;
        }
    }
}

/// How a rejected span is named in the message: its name, or its position.
fn describe(span: &Value) -> String {
    match span.get("name").and_then(Value::as_str) {
        Some(name) => format!("span {name:?}"),
        None => "a span without a name".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(spans: &str) -> String {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"edge"}}}}]}},"scopeSpans":[{{"scope":{{"name":"t"}},"spans":[{spans}]}}]}}]}}"#
        )
    }

    const GOOD: &str = r#"{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708","name":"good","kind":2,"startTimeUnixNano":"1","endTimeUnixNano":"2"}"#;

    #[test]
    fn mapping_spellings_are_read_and_a_broken_span_costs_only_itself() {
        let lenient = r#"{"traceId":"AQIDBAUGBwgJCgsMDQ4PEA==","spanId":"AQIDBAUGBwg=","name":"names","kind":"SPAN_KIND_CLIENT","status":{"code":"STATUS_CODE_ERROR"},"startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{"key":"d","value":{"doubleValue":"NaN"}},{"key":"l","value":{"arrayValue":{"values":[{"doubleValue":"-Infinity"},{"doubleValue":"2.5"}]}}}]}"#;
        let broken = r#"{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060709","name":"broken","startTimeUnixNano":-5,"endTimeUnixNano":"2"}"#;
        let text = body(&format!("{GOOD},{lenient},{broken}"));
        assert!(
            crate::otlp::json::parse(&text).is_none()
                && serde_json::from_str::<ExportTraceServiceRequest>(&text).is_err(),
            "the fast path and the reference refuse the body"
        );
        let (request, rejected) = decode(&text).unwrap();
        let spans = &request.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 2);
        let names = &spans[1];
        assert_eq!(names.trace_id, (1..=16).collect::<Vec<u8>>());
        assert_eq!(names.span_id, (1..=8).collect::<Vec<u8>>());
        assert_eq!(names.kind, span::SpanKind::Client as i32);
        assert_eq!(names.status.as_ref().unwrap().code, 2);
        let double = |v: &Option<AnyValue>| match v.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::DoubleValue(d)) => *d,
            other => panic!("{other:?}"),
        };
        assert!(double(&names.attributes[0].value).is_nan());
        let Some(any_value::Value::ArrayValue(list)) = names.attributes[1]
            .value
            .as_ref()
            .and_then(|v| v.value.clone())
        else {
            panic!()
        };
        assert_eq!(double(&Some(list.values[0].clone())), f64::NEG_INFINITY);
        assert_eq!(double(&Some(list.values[1].clone())), 2.5);
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].1, "span \"broken\"");
        assert!(
            rejected[0].0.starts_with("not valid OTLP/JSON"),
            "{rejected:?}"
        );
        let resource = request.resource_spans[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "service.name");
    }

    #[test]
    fn a_body_that_is_no_export_request_is_left_to_the_request_level_error() {
        assert!(decode("not json").is_err());
        assert!(decode(r#"{"resourceSpans":"x"}"#).is_err());
        assert!(decode(r#"{"resourceSpans":[{"scopeSpans":[{"spans":7}]}]}"#).is_err());
        let (request, rejected) = decode("{}").unwrap();
        assert!(request.resource_spans.is_empty() && rejected.is_empty());
    }

    #[test]
    fn a_body_nested_past_serde_jsons_limit_is_read_and_cut() {
        let mut value = r#"{"stringValue":"bottom"}"#.to_string();
        for _ in 0..40 {
            value = format!(r#"{{"kvlistValue":{{"values":[{{"key":"k","value":{value}}}]}}}}"#);
        }
        let deep = format!(
            r#"{{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060709","name":"deep","startTimeUnixNano":"1","endTimeUnixNano":"2","attributes":[{{"key":"d","value":{value}}}]}}"#
        );
        let text = body(&format!("{GOOD},{deep}"));
        assert!(json_depth(&text) > SHALLOW);
        let (request, rejected) = decode(&text).unwrap();
        assert!(rejected.is_empty(), "{rejected:?}");
        let spans = request.resource_spans[0].scope_spans[0].spans.clone();
        assert_eq!(spans.len(), 2);
        let out = crate::otlp::normalize::normalize(
            request,
            &crate::otlp::normalize::tests::options(),
            crate::otlp::normalize::tests::NOW,
        );
        assert_eq!(out.spans.len(), 2);
        assert!(out.spans[1].warnings[0].contains("nested deeper than 16 levels"));
        assert!(decode(&"[".repeat(MAX_JSON_DEPTH + 1)).is_err());
        assert_eq!(
            json_depth(r#"{"a":"[[[\"{"}"#),
            1,
            "brackets in strings do not count"
        );
    }
}

//! JSON forms of span parts, shared by the stores (columns) and the JSON API.
//!
//! Architecture invariant: one mapping from `AttrValue` to JSON and back, so what the API
//! shows is exactly what the stores keep. The mapping is natural JSON (`{"http.method":
//! "GET", "retries": 2}`), which keeps stored attributes queryable, at the price of three
//! documented losses (ARCHITECTURE.md, "Known quirks"): bytes become base64 strings,
//! non-finite doubles become the strings "NaN"/"Infinity"/"-Infinity", and of duplicate
//! keys the last one wins.

use base64::Engine as _;
use serde_json::{Map, Number, Value, json};

use crate::model::{AttrValue, Attributes, Event, Link, Scope, SpanId, TraceId};

pub fn value_to_json(value: &AttrValue) -> Value {
    match value {
        AttrValue::Empty => Value::Null,
        AttrValue::String(s) => Value::String(s.clone()),
        AttrValue::Bool(b) => Value::Bool(*b),
        AttrValue::Int(i) => Value::Number((*i).into()),
        AttrValue::Double(d) => match Number::from_f64(*d) {
            Some(n) => Value::Number(n),
            None => Value::String(
                if d.is_nan() {
                    "NaN"
                } else if *d > 0.0 {
                    "Infinity"
                } else {
                    "-Infinity"
                }
                .into(),
            ),
        },
        AttrValue::Bytes(b) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        AttrValue::Array(items) => Value::Array(items.iter().map(value_to_json).collect()),
        AttrValue::Map(items) => attributes_to_json(items),
    }
}

pub fn value_from_json(value: &Value) -> AttrValue {
    match value {
        Value::Null => AttrValue::Empty,
        Value::Bool(b) => AttrValue::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AttrValue::Int(i),
            None => AttrValue::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => AttrValue::String(s.clone()),
        Value::Array(items) => AttrValue::Array(items.iter().map(value_from_json).collect()),
        Value::Object(map) => AttrValue::Map(attributes_from_map(map)),
    }
}

pub fn attributes_to_json(attributes: &Attributes) -> Value {
    let map: Map<String, Value> = attributes
        .iter()
        .map(|(k, v)| (k.clone(), value_to_json(v)))
        .collect();
    Value::Object(map)
}

fn attributes_from_map(map: &Map<String, Value>) -> Attributes {
    map.iter()
        .map(|(k, v)| (k.clone(), value_from_json(v)))
        .collect()
}

/// Reads an attributes object; anything but an object yields no attributes.
pub fn attributes_from_json(value: &Value) -> Attributes {
    match value {
        Value::Object(map) => attributes_from_map(map),
        _ => Vec::new(),
    }
}

pub fn events_to_json(events: &[Event]) -> Value {
    Value::Array(
        events
            .iter()
            .map(|e| {
                json!({
                    "time_unix_nano": e.time_unix_nano,
                    "name": e.name,
                    "attributes": attributes_to_json(&e.attributes),
                })
            })
            .collect(),
    )
}

pub fn links_to_json(links: &[Link]) -> Value {
    Value::Array(
        links
            .iter()
            .map(|l| {
                json!({
                    "trace_id": l.trace_id.to_hex(),
                    "span_id": l.span_id.to_hex(),
                    "attributes": attributes_to_json(&l.attributes),
                })
            })
            .collect(),
    )
}

/// The parts of a span that no query looks into, as one JSON document.
pub fn details_to_json(
    scope: &Scope,
    events: &[Event],
    links: &[Link],
    warnings: &[String],
) -> Value {
    json!({
        "scope": {"name": scope.name, "version": scope.version},
        "events": events_to_json(events),
        "links": links_to_json(links),
        "warnings": warnings,
    })
}

/// The inverse of `details_to_json`; malformed parts are skipped, never fatal.
pub fn details_from_json(value: &Value) -> (Scope, Vec<Event>, Vec<Link>, Vec<String>) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let scope = Scope {
        name: text(&value["scope"]["name"]),
        version: text(&value["scope"]["version"]),
    };
    let events = value["events"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|e| Event {
                    time_unix_nano: e["time_unix_nano"].as_u64().unwrap_or(0),
                    name: text(&e["name"]),
                    attributes: attributes_from_json(&e["attributes"]),
                })
                .collect()
        })
        .unwrap_or_default();
    let links = value["links"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|l| {
                    Some(Link {
                        trace_id: TraceId::from_hex(l["trace_id"].as_str()?).ok()?,
                        span_id: SpanId::from_hex(l["span_id"].as_str()?).ok()?,
                        attributes: attributes_from_json(&l["attributes"]),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let warnings = value["warnings"]
        .as_array()
        .map(|items| items.iter().map(text).collect())
        .unwrap_or_default();
    (scope, events, links, warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_type_round_trips_except_the_documented_losses() {
        let attributes: Attributes = vec![
            ("s".into(), AttrValue::String("<b>x</b>".into())),
            ("b".into(), AttrValue::Bool(false)),
            ("i".into(), AttrValue::Int(i64::MIN)),
            ("d".into(), AttrValue::Double(2.5)),
            ("d_integral".into(), AttrValue::Double(3.0)),
            ("e".into(), AttrValue::Empty),
            (
                "a".into(),
                AttrValue::Array(vec![AttrValue::Int(1), AttrValue::String("2".into())]),
            ),
            (
                "m".into(),
                AttrValue::Map(vec![("k".into(), AttrValue::Bool(true))]),
            ),
        ];
        let json = attributes_to_json(&attributes);
        let text = serde_json::to_string(&json).unwrap();
        let back = attributes_from_json(&serde_json::from_str(&text).unwrap());
        let mut expected = attributes.clone();
        expected.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(back, expected);
    }

    #[test]
    fn lossy_cases_are_the_documented_ones() {
        assert_eq!(
            value_to_json(&AttrValue::Bytes(vec![0, 255])),
            json!("AP8=")
        );
        assert_eq!(value_to_json(&AttrValue::Double(f64::NAN)), json!("NaN"));
        assert_eq!(
            value_to_json(&AttrValue::Double(f64::NEG_INFINITY)),
            json!("-Infinity")
        );
    }

    #[test]
    fn details_round_trip() {
        let scope = Scope {
            name: "lib".into(),
            version: "1".into(),
        };
        let events = vec![Event {
            time_unix_nano: 5,
            name: "retry".into(),
            attributes: vec![],
        }];
        let links = vec![Link {
            trace_id: TraceId([2; 16]),
            span_id: SpanId([3; 8]),
            attributes: vec![],
        }];
        let warnings = vec!["w".to_string()];
        let json = details_to_json(&scope, &events, &links, &warnings);
        assert_eq!(details_from_json(&json), (scope, events, links, warnings));
        // Malformed documents degrade to empty parts.
        let (scope, events, links, warnings) = details_from_json(&json!({"events": 3}));
        assert_eq!(
            (scope, events.len(), links.len(), warnings.len()),
            (Scope::default(), 0, 0, 0)
        );
    }
}

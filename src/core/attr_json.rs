//! JSON forms of span parts, shared by the stores (columns) and the JSON API.
//!
//! Architecture invariant: one mapping from `AttrValue` to JSON and back, so what the API
//! shows is exactly what the stores keep. The mapping is natural JSON (`{"http.method":
//! "GET", "retries": 2}`), which keeps stored attributes queryable, at the price of three
//! documented losses (ARCHITECTURE.md, "Known quirks"): bytes become base64 strings,
//! non-finite doubles become the strings "NaN"/"Infinity"/"-Infinity", and of duplicate
//! keys the last one wins.

use base64::Engine as _;
use serde::ser::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::core::model::{AttrValue, Attributes, Event, Link, Scope, SpanId, TraceId};

/// Serialises an attribute value as natural JSON. The one definition of the mapping: the
/// stores write it as text, the API builds values from it.
pub struct ValueJson<'a>(pub &'a AttrValue);

impl Serialize for ValueJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            AttrValue::Empty => serializer.serialize_unit(),
            AttrValue::String(s) => serializer.serialize_str(s),
            AttrValue::Bool(b) => serializer.serialize_bool(*b),
            AttrValue::Int(i) => serializer.serialize_i64(*i),
            AttrValue::Double(d) if d.is_finite() => serializer.serialize_f64(*d),
            AttrValue::Double(d) => serializer.serialize_str(if d.is_nan() {
                "NaN"
            } else if *d > 0.0 {
                "Infinity"
            } else {
                "-Infinity"
            }),
            AttrValue::Bytes(b) => {
                serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
            }
            AttrValue::Array(items) => serializer.collect_seq(items.iter().map(ValueJson)),
            AttrValue::Map(items) => {
                serializer.collect_map(items.iter().map(|(k, v)| (k, ValueJson(v))))
            }
        }
    }
}

/// Serialises attributes as one JSON object.
pub struct AttributesJson<'a>(pub &'a Attributes);

impl Serialize for AttributesJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(k, v)| (k, ValueJson(v))))
    }
}

#[derive(serde::Serialize)]
struct EventJson<'a> {
    time_unix_nano: u64,
    name: &'a str,
    attributes: AttributesJson<'a>,
}

#[derive(serde::Serialize)]
struct LinkJson<'a> {
    trace_id: String,
    span_id: String,
    attributes: AttributesJson<'a>,
}

#[derive(serde::Serialize)]
struct ScopeJson<'a> {
    name: &'a str,
    version: &'a str,
}

#[derive(serde::Serialize)]
struct DetailsJson<'a> {
    scope: ScopeJson<'a>,
    events: Vec<EventJson<'a>>,
    links: Vec<LinkJson<'a>>,
    warnings: &'a [String],
}

fn events(events: &[Event]) -> Vec<EventJson<'_>> {
    events
        .iter()
        .map(|e| EventJson {
            time_unix_nano: e.time_unix_nano,
            name: &e.name,
            attributes: AttributesJson(&e.attributes),
        })
        .collect()
}

fn links(links: &[Link]) -> Vec<LinkJson<'_>> {
    links
        .iter()
        .map(|l| LinkJson {
            trace_id: l.trace_id.to_hex(),
            span_id: l.span_id.to_hex(),
            attributes: AttributesJson(&l.attributes),
        })
        .collect()
}

/// Serialising these types cannot fail: keys are strings and floats are finite.
fn to_value(value: impl Serialize) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

pub fn value_to_json(value: &AttrValue) -> Value {
    to_value(ValueJson(value))
}

pub fn attributes_to_json(attributes: &Attributes) -> Value {
    to_value(AttributesJson(attributes))
}

/// The stored text form of `attributes_to_json`.
pub fn attributes_to_string(attributes: &Attributes) -> String {
    serde_json::to_string(&AttributesJson(attributes)).unwrap_or_default()
}

pub fn events_to_json(list: &[Event]) -> Value {
    to_value(events(list))
}

pub fn links_to_json(list: &[Link]) -> Value {
    to_value(links(list))
}

/// The parts of a span that no query looks into, as one JSON text.
pub fn details_to_string(
    scope: &Scope,
    event_list: &[Event],
    link_list: &[Link],
    warnings: &[String],
) -> String {
    serde_json::to_string(&DetailsJson {
        scope: ScopeJson {
            name: &scope.name,
            version: &scope.version,
        },
        events: events(event_list),
        links: links(link_list),
        warnings,
    })
    .unwrap_or_default()
}

/// The value of `key` in an attributes object's text (`attributes_to_string`), without
/// building the others: they are skipped as they are read, numbers unconverted. Of
/// duplicate keys the last wins, as when the whole object is read; `None` when the text is
/// not an object or has no such key.
pub fn value_of(text: &str, key: &str) -> Option<Value> {
    struct Find<'k>(&'k str);
    impl<'de> serde::de::Visitor<'de> for Find<'_> {
        type Value = Option<Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == self.0 {
                    found = Some(map.next_value()?);
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let mut reader = serde_json::Deserializer::from_str(text);
    let found = serde::Deserializer::deserialize_map(&mut reader, Find(key)).ok()?;
    reader.end().ok()?;
    found
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

/// The inverse of `details_to_string`; malformed parts are skipped, never fatal.
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
    use serde_json::json;

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
        let text = attributes_to_string(&attributes);
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            attributes_to_json(&attributes)
        );
        let back = attributes_from_json(&serde_json::from_str(&text).unwrap());
        assert_eq!(back, attributes, "in the order they were sent");
    }

    #[test]
    fn a_double_reads_back_as_the_same_double() {
        // serde_json's default parser may land one unit in the last place away from the
        // text's value (1964.0469401028433 read as 1964.046940102843); `float_roundtrip`
        // reads every double exactly, so a stored attribute is what was sent.
        for x in [
            1964.0469401028433,
            450.67793336328043,
            -238.71506384647142,
            5e-324,
            1.7976931348623157e308,
        ] {
            let attributes: Attributes = vec![("d".into(), AttrValue::Double(x))];
            let back = attributes_from_json(
                &serde_json::from_str(&attributes_to_string(&attributes)).unwrap(),
            );
            assert_eq!(back, attributes, "{x}");
        }
    }

    #[test]
    fn one_value_is_found_as_reading_the_whole_object_finds_it() {
        let text = r#"{"a":{"k":[1,{"x":2}]},"b\"c":1.5,"n":1,"s":"t","n":2.5e3}"#;
        let whole: Map<String, Value> = serde_json::from_str(text).unwrap();
        for key in ["a", "b\"c", "n", "s", "missing", "k", "x"] {
            assert_eq!(value_of(text, key), whole.get(key).cloned(), "{key}");
        }
        assert_eq!(
            value_of(text, "n"),
            Some(json!(2500.0)),
            "the last of duplicates"
        );
        for broken in ["[1]", "3", r#"{"n":1"#, r#"{"n":1} x"#, ""] {
            assert_eq!(value_of(broken, "n"), None, "{broken}");
        }
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
        let text = details_to_string(&scope, &events, &links, &warnings);
        assert_eq!(
            details_from_json(&serde_json::from_str(&text).unwrap()),
            (scope, events, links, warnings)
        );
        // Malformed documents degrade to empty parts.
        let (scope, events, links, warnings) = details_from_json(&json!({"events": 3}));
        assert_eq!(
            (scope, events.len(), links.len(), warnings.len()),
            (Scope::default(), 0, 0, 0)
        );
    }
}

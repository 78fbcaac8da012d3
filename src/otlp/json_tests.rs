//! Tests of `json.rs`: the differential test of the fast path against the reference
//! decoder (and of `json_spans` against it), on generated, random, hand-written and mutated
//! bodies.

use super::*;
use rand::Rng as _;
use rand::SeedableRng as _;
use rand::rngs::StdRng;

/// The invariant: what `parse` returns, the reference returns too.
fn check(text: &str) -> bool {
    match parse(text) {
        Some(fast) => {
            let reference: ExportTraceServiceRequest =
                serde_json::from_str(text).unwrap_or_else(|e| {
                    panic!("the fast path accepted what the reference refuses ({e}): {text}")
                });
            assert_eq!(fast, reference, "the two decoders differ on {text}");
            read_alike_span_by_span(text, &reference);
            true
        }
        None => {
            if let Ok(reference) = serde_json::from_str::<ExportTraceServiceRequest>(text) {
                read_alike_span_by_span(text, &reference);
            }
            false
        }
    }
}

/// A body the reference accepts reads the same span by span, with nothing rejected
/// (`json_spans` only ever sees bodies refused whole, but must not read differently).
/// It may refuse one whole where it cannot hold the text as a `serde_json::Value` (a
/// number out of range under a key the reference skips).
fn read_alike_span_by_span(text: &str, reference: &ExportTraceServiceRequest) {
    match crate::otlp::json_spans::decode(text) {
        Ok((request, rejected)) => {
            assert!(rejected.is_empty(), "{rejected:?} on {text}");
            assert_eq!(&request, reference, "span by span differs on {text}");
        }
        Err(_) => assert!(
            serde_json::from_str::<serde_json::Value>(text).is_err(),
            "span by span refused what the reference reads: {text}"
        ),
    }
}

fn accepted(text: &str) {
    assert!(check(text), "the fast path declined {text}");
}

fn declined(text: &str) {
    assert!(
        !check(text),
        "the fast path should leave {text} to the reference"
    );
    // The receivers' JSON path reads a body the reference accepts as the reference does.
    let ours = crate::otlp::decode::decode_traces(
        text.as_bytes().to_vec().into(),
        crate::otlp::decode::Format::Json,
    );
    if let Ok(theirs) = serde_json::from_str::<ExportTraceServiceRequest>(text) {
        let ours =
            ours.unwrap_or_else(|e| panic!("refused what the reference reads ({e}): {text}"));
        assert_eq!(ours.request, theirs, "{text}");
        assert!(ours.rejected.is_empty(), "{:?} on {text}", ours.rejected);
    }
}

fn random_text(rng: &mut StdRng) -> String {
    const PIECES: [&str; 12] = [
        "a", "Z", "é", "😀", "\"", "\\", "/", "\n", "\u{0}", "\u{1f}", "<script>", " ",
    ];
    (0..rng.random_range(0..6))
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect()
}

fn random_value(rng: &mut StdRng, depth: u32) -> any_value::Value {
    match rng.random_range(0..if depth > 2 { 4 } else { 6 }) {
        0 => any_value::Value::StringValue(random_text(rng)),
        1 => any_value::Value::BoolValue(rng.random()),
        2 => any_value::Value::IntValue(match rng.random_range(0..4) {
            0 => i64::MIN,
            1 => i64::MAX,
            _ => rng.random_range(-1_000_000..1_000_000),
        }),
        3 => any_value::Value::DoubleValue(loop {
            let value = match rng.random_range(0..4) {
                0 => f64::from_bits(rng.random()),
                1 => rng.random_range(-1e6..1e6),
                2 => rng.random_range(0..10_000) as f64,
                _ => rng.random::<f64>() * 1e-300,
            };
            if value.is_finite() {
                break value;
            }
        }),
        4 => any_value::Value::ArrayValue(ArrayValue {
            values: (0..rng.random_range(0..3))
                .map(|_| AnyValue {
                    value: Some(random_value(rng, depth + 1)),
                })
                .collect(),
        }),
        _ => any_value::Value::KvlistValue(KeyValueList {
            values: random_attributes(rng, depth + 1),
        }),
    }
}

fn random_attributes(rng: &mut StdRng, depth: u32) -> Vec<KeyValue> {
    (0..rng.random_range(0..4))
        .map(|_| KeyValue {
            key: random_text(rng),
            value: Some(AnyValue {
                value: Some(random_value(rng, depth)),
            }),
            key_strindex: 0,
        })
        .collect()
}

fn random_id(rng: &mut StdRng, len: usize) -> Vec<u8> {
    (0..rng.random_range(0..=1) * len)
        .map(|_| rng.random())
        .collect()
}

fn random_request(rng: &mut StdRng) -> ExportTraceServiceRequest {
    let spans = |rng: &mut StdRng| -> Vec<Span> {
        (0..rng.random_range(0..4))
            .map(|_| Span {
                trace_id: random_id(rng, 16),
                span_id: random_id(rng, 8),
                trace_state: random_text(rng),
                parent_span_id: random_id(rng, 8),
                flags: rng.random(),
                name: random_text(rng),
                kind: rng.random_range(0..7),
                start_time_unix_nano: rng.random(),
                end_time_unix_nano: rng.random(),
                attributes: random_attributes(rng, 0),
                dropped_attributes_count: rng.random(),
                events: (0..rng.random_range(0..3))
                    .map(|_| span::Event {
                        time_unix_nano: rng.random(),
                        name: random_text(rng),
                        attributes: random_attributes(rng, 0),
                        dropped_attributes_count: rng.random_range(0..3),
                    })
                    .collect(),
                dropped_events_count: rng.random_range(0..3),
                links: (0..rng.random_range(0..3))
                    .map(|_| span::Link {
                        trace_id: random_id(rng, 16),
                        span_id: random_id(rng, 8),
                        trace_state: random_text(rng),
                        attributes: random_attributes(rng, 0),
                        dropped_attributes_count: 0,
                        flags: rng.random_range(0..1024),
                    })
                    .collect(),
                dropped_links_count: 0,
                status: rng.random_bool(0.5).then(|| Status {
                    message: random_text(rng),
                    code: rng.random_range(-1..4),
                }),
            })
            .collect()
    };
    ExportTraceServiceRequest {
        resource_spans: (0..rng.random_range(0..3))
            .map(|_| ResourceSpans {
                resource: rng.random_bool(0.8).then(|| Resource {
                    attributes: random_attributes(rng, 0),
                    dropped_attributes_count: rng.random_range(0..2),
                    entity_refs: Vec::new(),
                }),
                scope_spans: (0..rng.random_range(0..3))
                    .map(|_| ScopeSpans {
                        scope: rng.random_bool(0.8).then(|| InstrumentationScope {
                            name: random_text(rng),
                            version: random_text(rng),
                            attributes: random_attributes(rng, 0),
                            dropped_attributes_count: 0,
                        }),
                        spans: spans(rng),
                        schema_url: random_text(rng),
                    })
                    .collect(),
                schema_url: random_text(rng),
            })
            .collect(),
    }
}

#[test]
fn plain_runs_end_where_the_bytewise_scan_ends() {
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..20_000 {
        let text: String = (0..rng.random_range(0..40))
            .map(|_| match rng.random_range(0..10) {
                0 => char::from(rng.random_range(0..0x20u8)),
                1 => '"',
                2 => '\\',
                3 => ['é', '😀', '\u{7f}', '\u{ff}'][rng.random_range(0..4)],
                _ => char::from(rng.random_range(0x20..0x7fu8)),
            })
            .collect();
        let parser = Parser::new(&text);
        for from in 0..=text.len() {
            let expected = text.as_bytes()[from..]
                .iter()
                .position(|&byte| special(byte))
                .map_or(text.len(), |run| from + run);
            assert_eq!(parser.plain_run(from), expected, "{text:?} from {from}");
        }
    }
}

#[test]
fn the_benchmarks_requests_take_the_fast_path() {
    for request in crate::otlp::generate::generate(3_000, 512) {
        let text = serde_json::to_string(&request).unwrap();
        accepted(&text);
    }
}

#[test]
fn random_requests_decode_as_the_reference_decodes_them() {
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..2_000 {
        let request = random_request(&mut rng);
        let text = serde_json::to_string(&request).unwrap();
        // Equal to the reference's reading, not always to `request`: serde_json's
        // default float parsing may miss the written double by one unit.
        accepted(&text);
        let pretty = serde_json::to_string_pretty(&request).unwrap();
        accepted(&pretty);
    }
}

#[test]
fn forms_exporters_send_take_the_fast_path() {
    let span = |fields: &str| {
        format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{{fields}}}]}}]}}]}}"#)
    };
    for text in [
        "{}".to_string(),
        " \t\r\n{ \"resourceSpans\" : [ ] } \n".to_string(),
        r#"{"resourceSpans":[{}]}"#.to_string(),
        r#"{"resourceSpans":[{"resource":{"entityRefs":[]}}]}"#.to_string(),
        span(r#""traceId":"0AF7651916CD43DD8448EB211C80319C","spanId":"B7AD6B7169203331""#),
        span(r#""startTimeUnixNano":1700000000000000000,"endTimeUnixNano":"1700000000000000001""#),
        span(r#""startTimeUnixNano":"+5""#),
        span(r#""name":"caf\u00e9 \ud83d\ude00 \"q\" \\ \/ \b\f\n\r\t <b>x</b>""#),
        span(r#""na\u006de":"escaped key""#),
        span(r#""kind":-3,"flags":4294967295,"droppedAttributesCount":0"#),
        span(r#""attributes":[{"value":{"intValue":42},"key":"k"}]"#),
        span(r#""attributes":[{"key":"k","value":{"intValue":"-9223372036854775808"}}]"#),
        span(r#""attributes":[{"key":"k","value":{"doubleValue":1}}]"#),
        span(r#""attributes":[{"key":"k","value":{"doubleValue":-0.0}}]"#),
        span(r#""attributes":[{"key":"k","value":{"doubleValue":1.7976931348623157e308}}]"#),
        span(r#""attributes":[{"key":"k","value":{"doubleValue":2.2250738585072011e-308}}]"#),
        span(r#""attributes":[{"key":"k","value":{"doubleValue":0.30000000000000000004}}]"#),
        span(
            r#""attributes":[{"key":"k","value":{"doubleValue":123456789012345678901234567890}}]"#,
        ),
        span(r#""attributes":[{"key":"k","value":{"arrayValue":{"values":[]}}}]"#),
        span(r#""attributes":[{"key":"k","value":{"kvlistValue":{"values":[],"x":1}}}]"#),
        span(r#""attributes":[{"key":"k"}]"#),
        span(r#""attributes":[{"key":"k","value":null}]"#),
        span(r#""status":null"#),
        r#"{"resourceSpans":[{"resource":null,"scopeSpans":[{"scope":null}]}]}"#.to_string(),
        span(r#""trace_id":"ignored","unknown":{"a":[1,2.5e-3,true,false,null,"x",{}]}"#),
        span(r#""status":{"code":2,"message":"deadline exceeded","other":null}"#),
        span(
            r#""events":[{"timeUnixNano":"1","name":"e"}],"links":[{"traceId":"","spanId":"01"}]"#,
        ),
    ] {
        accepted(&text);
    }
}

#[test]
fn unusual_bodies_are_left_to_the_reference() {
    let span = |fields: &str| {
        format!(r#"{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{{fields}}}]}}]}}]}}"#)
    };
    for text in [
        // Not JSON, or not all of it.
        String::new(),
        "{".to_string(),
        "{} x".to_string(),
        "[]".to_string(),
        "[[]]".to_string(),
        r#"{"resourceSpans":[],}"#.to_string(),
        span(r#""name":"a"b""#),
        span("\"name\":\"tab\tinside\""),
        span(r#""name":"\x""#),
        span(r#""name":"\ud800""#),
        span(r#""name":"\udc00x""#),
        span(r#""name":"\u12""#),
        span(r#""kind":01"#),
        span(r#""kind":1."#),
        span(r#""kind":+1"#),
        span(r#""kind":.5"#),
        span(r#""kind":1e"#),
        // JSON the reference reads by rules of its own, or refuses.
        span(r#""name":null"#),
        span(r#""parentSpanId":null"#),
        span(r#""name":"a","name":"b""#),
        span(r#""kind":-0"#),
        span(r#""kind":1.0"#),
        span(r#""kind":"SPAN_KIND_SERVER""#),
        span(r#""kind":2147483648"#),
        span(r#""flags":-1"#),
        span(r#""startTimeUnixNano":1.5"#),
        span(r#""startTimeUnixNano":-1"#),
        span(r#""startTimeUnixNano":"x""#),
        span(r#""traceId":"abc""#),
        span(r#""traceId":"zz""#),
        span(r#""traceId":"AAAAAAAAAAAAAAAAAAAAAA==""#),
        span(r#""attributes":[{"value":{"stringValue":"no key"}}]"#),
        span(r#""attributes":[{"key":"k","value":{}}]"#),
        span(r#""attributes":[{"key":"k","value":{"stringValue":null}}]"#),
        span(r#""attributes":[{"key":"k","value":{"stringValue":"a","intValue":1}}]"#),
        span(r#""attributes":[{"key":"k","value":{"bytesValue":"aGk="}}]"#),
        span(r#""attributes":[{"key":"k","value":{"stringValue":"a","other":1}}]"#),
        span(r#""attributes":[{"key":"k","value":{"intValue":"1.5"}}]"#),
        span(r#""attributes":[{"key":"k","value":{"intValue":9223372036854775808}}]"#),
        span(r#""attributes":[{"key":"k","value":{"doubleValue":"NaN"}}]"#),
        span(r#""attributes":[{"key":"k","value":{"arrayValue":{}}}]"#),
        span(r#""attributes":[{"key":"k","value":{"boolValue":1}}]"#),
        r#"{"resourceSpans":[{"resource":{"entityRefs":[{}]}}]}"#.to_string(),
        format!("{}{}", "[".repeat(100), "]".repeat(100)),
        format!(
            r#"{{"resourceSpans":[{{"x":{}{}}}]}}"#,
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        ),
    ] {
        declined(&text);
    }
}

/// Random edits of valid bodies: whatever the fast path accepts, the reference decodes
/// to the same request.
#[test]
fn mutated_bodies_never_decode_differently() {
    const ALPHABET: &[u8] = b"{}[]:,\"\\ 0123456789-+.eEtrufalsn\tabcdefxyzu";
    let mut rng = StdRng::seed_from_u64(11);
    let seeds: Vec<Vec<u8>> = (0..40)
        .map(|_| serde_json::to_vec(&random_request(&mut rng)).unwrap())
        .filter(|body| body.len() < 4_000)
        .collect();
    let mut accepted_mutants = 0;
    for _ in 0..30_000 {
        let mut body = seeds[rng.random_range(0..seeds.len())].clone();
        for _ in 0..rng.random_range(1..4) {
            if body.is_empty() {
                break;
            }
            let at = rng.random_range(0..body.len());
            match rng.random_range(0..4) {
                0 => {
                    body.remove(at);
                }
                1 => body.insert(at, ALPHABET[rng.random_range(0..ALPHABET.len())]),
                2 => body[at] = ALPHABET[rng.random_range(0..ALPHABET.len())],
                _ => {
                    let end = (at + rng.random_range(1..40)).min(body.len());
                    let piece = body[at..end].to_vec();
                    let to = rng.random_range(0..body.len());
                    body.splice(to..to, piece);
                }
            }
        }
        if let Ok(text) = std::str::from_utf8(&body) {
            accepted_mutants += usize::from(check(text));
        }
    }
    // The edits must leave some bodies valid, or the test checks nothing.
    assert!(
        accepted_mutants > 1_000,
        "only {accepted_mutants} mutants decoded"
    );
}

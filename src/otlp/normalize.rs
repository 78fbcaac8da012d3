//! OTLP → budgetscope's own `Span`.
//!
//! Architecture invariant: the only module that reads OTLP span types. It validates every
//! span on its own: an invalid span is counted and described in `rejections`, and never
//! costs the valid spans of the same request their place. No clock is read here; the
//! caller passes "now" for the future-timestamp check.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1 as otlp;

use crate::core::budget::read_budget;
use crate::core::model::{
    AttrValue, Attributes, Event, Link, Scope, Span, SpanId, SpanKind, Status, StatusCode, TraceId,
};

/// Service and span names are cut to this many characters, so that a hop's page address
/// (both names, percent-encoded) stays within what HTTP servers and browsers accept.
pub const MAX_NAME_CHARS: usize = 1024;

const NAME_CUT_WARNING: &str =
    "a service or span name was longer than 1024 characters and was cut there";

/// Arrays and key-value lists nest at most this deep in an attribute value; a deeper one is
/// replaced by `CUT_VALUE`, with `VALUE_CUT_WARNING` on the span.
pub const MAX_VALUE_DEPTH: usize = 16;

pub const CUT_VALUE: &str = "[nested deeper than 16 levels: cut]";

const VALUE_CUT_WARNING: &str = "an attribute value nested deeper than 16 levels was cut there (shown as [nested deeper than 16 levels: cut])";

/// The service name used when a resource has no `service.name`.
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// How far in the future a span may start before it is rejected as a broken clock.
pub const MAX_FUTURE_NANOS: u64 = 24 * 3600 * 1_000_000_000;

/// How many distinct rejection reasons the error message lists before summarising.
const MAX_LISTED_REASONS: usize = 5;

#[derive(Debug, Clone)]
pub struct NormalizeOptions {
    pub budget_keys: Vec<String>,
    /// Spans that started longer ago than this are rejected: retention would delete them
    /// at its next pass (`--retention`; none for `budgetscope analyze`).
    pub retention: Option<std::time::Duration>,
}

/// The spans of one export request, split into valid spans and rejections.
#[derive(Debug, Default)]
pub struct Normalized {
    pub spans: Vec<Span>,
    pub rejected: u64,
    /// Distinct reasons, each with the first span it applied to, at most `MAX_LISTED_REASONS`.
    reasons: Vec<(String, String)>,
    more_reasons: u64,
}

impl Normalized {
    /// The human-readable message for OTLP `partial_success.error_message`; empty when
    /// nothing was rejected.
    pub fn error_message(&self) -> String {
        if self.rejected == 0 {
            return String::new();
        }
        let total = self.rejected + self.spans.len() as u64;
        let listed: Vec<String> = self
            .reasons
            .iter()
            .map(|(reason, first)| format!("{reason} (first: {first})"))
            .collect();
        let mut message = format!(
            "rejected {} of {} spans: {}",
            self.rejected,
            total,
            listed.join("; ")
        );
        if self.more_reasons > 0 {
            message.push_str(&format!("; and {} other reasons", self.more_reasons));
        }
        message.push_str(". Fix the exporter's data; the other spans were stored.");
        message
    }

    pub fn reject(&mut self, reason: String, which: String) {
        self.rejected += 1;
        if self.reasons.iter().any(|(r, _)| *r == reason) {
            return;
        }
        if self.reasons.len() < MAX_LISTED_REASONS {
            self.reasons.push((reason, which));
        } else {
            self.more_reasons += 1;
        }
    }
}

/// The number of spans in an export request, valid or not.
pub fn span_count(request: &ExportTraceServiceRequest) -> usize {
    request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum()
}

/// Converts one export request, consuming it so strings move rather than copy.
pub fn normalize(
    request: ExportTraceServiceRequest,
    options: &NormalizeOptions,
    now_unix_nano: u64,
) -> Normalized {
    let mut out = Normalized {
        spans: Vec::with_capacity(span_count(&request)),
        ..Normalized::default()
    };
    for resource_spans in request.resource_spans {
        let mut resource_cut = false;
        let resource: Arc<Attributes> = Arc::new(
            resource_spans
                .resource
                .map(|r| convert_attributes(r.attributes, &mut resource_cut))
                .unwrap_or_default(),
        );
        let service = match crate::core::model::attr(&resource, "service.name") {
            Some(AttrValue::String(name)) if !name.is_empty() => name.replace('\0', "\u{FFFD}"),
            _ => UNKNOWN_SERVICE.to_string(),
        };
        let mut no_warnings = Vec::new();
        let service_cut = service.chars().count() > MAX_NAME_CHARS;
        let service = cut_name(service, &mut no_warnings);
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans
                .scope
                .map(|s| Scope {
                    name: s.name.replace('\0', "\u{FFFD}"),
                    version: s.version.replace('\0', "\u{FFFD}"),
                })
                .unwrap_or_default();
            for span in scope_spans.spans {
                // Checked before the span is taken apart, so that a rejection can name it;
                // describing every span cost measurable server time under load (`budgetscope-bench receive`).
                match validate(&span, now_unix_nano, options.retention) {
                    Ok(ids) => {
                        let mut span =
                            convert_span(span, ids, &service, &resource, &scope, options);
                        if service_cut && !span.warnings.iter().any(|w| w == NAME_CUT_WARNING) {
                            span.warnings.push(NAME_CUT_WARNING.to_string());
                        }
                        if resource_cut && !span.warnings.iter().any(|w| w == VALUE_CUT_WARNING) {
                            span.warnings.push(VALUE_CUT_WARNING.to_string());
                        }
                        out.spans.push(span);
                    }
                    Err(reason) => out.reject(reason, describe_span(&service, &span)),
                }
            }
        }
    }
    out
}

fn describe_span(service: &str, span: &otlp::Span) -> String {
    let name: String = span.name.chars().take(60).collect();
    format!("{service} {name:?}")
}

/// A span's ids, once `validate` found them valid.
struct Ids {
    trace_id: TraceId,
    span_id: SpanId,
    parent_span_id: Option<SpanId>,
}

/// Everything that makes a span invalid as a whole: its ids and its timestamps.
fn validate(
    span: &otlp::Span,
    now_unix_nano: u64,
    retention: Option<std::time::Duration>,
) -> Result<Ids, String> {
    let trace_id = TraceId::from_bytes(&span.trace_id).map_err(|e| format!("trace id {e}"))?;
    let span_id = SpanId::from_bytes(&span.span_id).map_err(|e| format!("span id {e}"))?;
    let parent_span_id = match span.parent_span_id.as_slice() {
        [] => None,
        bytes if bytes.iter().all(|b| *b == 0) && bytes.len() == SpanId::LEN => None,
        bytes => Some(SpanId::from_bytes(bytes).map_err(|e| format!("parent span id {e}"))?),
    };
    check_timestamps(
        span.start_time_unix_nano,
        span.end_time_unix_nano,
        now_unix_nano,
    )?;
    if let Some(retention) = retention {
        let oldest = now_unix_nano.saturating_sub(retention.as_nanos() as u64);
        if span.start_time_unix_nano < oldest {
            return Err(format!(
                "started before the retention period ({}), so it would be deleted at once",
                humantime::format_duration(retention)
            ));
        }
    }
    Ok(Ids {
        trace_id,
        span_id,
        parent_span_id,
    })
}

fn convert_span(
    span: otlp::Span,
    ids: Ids,
    service: &str,
    resource: &Arc<Attributes>,
    scope: &Scope,
    options: &NormalizeOptions,
) -> Span {
    let mut cut = false;
    let attributes = convert_attributes(span.attributes, &mut cut);
    let reading = read_budget(&attributes, &options.budget_keys);
    let mut warnings = reading.warnings;
    let status = span
        .status
        .map(|s| Status {
            code: StatusCode::from_i32(s.code),
            message: without_nul(s.message, &mut warnings),
        })
        .unwrap_or(Status {
            code: StatusCode::Unset,
            message: String::new(),
        });
    let mut links = Vec::with_capacity(span.links.len());
    for link in span.links {
        match (
            TraceId::from_bytes(&link.trace_id),
            SpanId::from_bytes(&link.span_id),
        ) {
            (Ok(trace_id), Ok(span_id)) => links.push(Link {
                trace_id,
                span_id,
                attributes: convert_attributes(link.attributes, &mut cut),
            }),
            _ => warnings.push("dropped a link with an invalid trace or span id".to_string()),
        }
    }
    let events = span
        .events
        .into_iter()
        .map(|e| Event {
            time_unix_nano: e.time_unix_nano,
            name: without_nul(e.name, &mut warnings),
            attributes: convert_attributes(e.attributes, &mut cut),
        })
        .collect();
    if cut {
        warnings.push(VALUE_CUT_WARNING.to_string());
    }
    Span {
        trace_id: ids.trace_id,
        span_id: ids.span_id,
        parent_span_id: ids.parent_span_id,
        service: service.to_string(),
        name: cut_name(without_nul(span.name, &mut warnings), &mut warnings),
        kind: SpanKind::from_i32(span.kind),
        start_unix_nano: span.start_time_unix_nano,
        end_unix_nano: span.end_time_unix_nano,
        status,
        attributes,
        resource: resource.clone(),
        scope: scope.clone(),
        events,
        links,
        budget: reading.budget,
        warnings,
    }
}

/// A service or operation name as spans store it (NULs replaced, cut to `MAX_NAME_CHARS`):
/// names from other signals (the deadline metrics) go through it so they match the spans'.
pub fn stored_name(text: &str) -> String {
    let mut ignored = Vec::new();
    cut_name(without_nul(text.to_string(), &mut ignored), &mut ignored)
}

/// The service a resource names (`service.name`), as spans store it.
pub fn resource_service(
    resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>,
) -> String {
    let name = resource
        .into_iter()
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(name) if !name.is_empty() => Some(name.as_str()),
            _ => None,
        });
    name.map_or_else(|| UNKNOWN_SERVICE.to_string(), stored_name)
}

/// Cuts a name to `MAX_NAME_CHARS` characters, noting it once.
fn cut_name(text: String, warnings: &mut Vec<String>) -> String {
    match text.char_indices().nth(MAX_NAME_CHARS) {
        None => text,
        Some((at, _)) => {
            if !warnings.iter().any(|w| w == NAME_CUT_WARNING) {
                warnings.push(NAME_CUT_WARNING.to_string());
            }
            text[..at].to_string()
        }
    }
}

/// Replaces NUL characters, which Postgres text columns cannot hold, noting it once.
fn without_nul(text: String, warnings: &mut Vec<String>) -> String {
    if !text.contains('\0') {
        return text;
    }
    const WARNING: &str = "NUL characters in names or messages were replaced by U+FFFD";
    if !warnings.iter().any(|w| w == WARNING) {
        warnings.push(WARNING.to_string());
    }
    text.replace('\0', "\u{FFFD}")
}

fn check_timestamps(start: u64, end: u64, now: u64) -> Result<(), String> {
    if start == 0 {
        return Err("start time is missing (0)".to_string());
    }
    if end == 0 {
        return Err("end time is missing (0)".to_string());
    }
    // Stores keep nanoseconds in a signed 64-bit column.
    if start > i64::MAX as u64 || end > i64::MAX as u64 {
        return Err("timestamp is after the year 2262".to_string());
    }
    if end < start {
        return Err(format!("ends {} ns before it starts", start - end));
    }
    if start > now.saturating_add(MAX_FUTURE_NANOS) {
        return Err("starts more than 24 h in the future (check the sender's clock)".to_string());
    }
    Ok(())
}

/// Converts OTLP attributes; keys without a value become `AttrValue::Empty`.
/// Converts attributes; `cut` is set when a value nested deeper than `MAX_VALUE_DEPTH` was
/// cut there.
fn convert_attributes(attributes: Vec<KeyValue>, cut: &mut bool) -> Attributes {
    convert_list(attributes, 0, cut)
}

fn convert_list(attributes: Vec<KeyValue>, depth: usize, cut: &mut bool) -> Attributes {
    attributes
        .into_iter()
        .map(|kv| {
            (
                kv.key,
                kv.value
                    .map(|v| convert_value(v, depth, cut))
                    .unwrap_or(AttrValue::Empty),
            )
        })
        .collect()
}

fn convert_value(value: AnyValue, depth: usize, cut: &mut bool) -> AttrValue {
    use any_value::Value;
    let nested = matches!(
        value.value,
        Some(Value::ArrayValue(_) | Value::KvlistValue(_))
    );
    if nested && depth >= MAX_VALUE_DEPTH {
        *cut = true;
        return AttrValue::String(CUT_VALUE.to_string());
    }
    match value.value {
        None => AttrValue::Empty,
        Some(Value::StringValue(s)) => AttrValue::String(s),
        Some(Value::BoolValue(b)) => AttrValue::Bool(b),
        Some(Value::IntValue(i)) => AttrValue::Int(i),
        Some(Value::DoubleValue(d)) => AttrValue::Double(d),
        Some(Value::BytesValue(b)) => AttrValue::Bytes(b),
        Some(Value::ArrayValue(a)) => AttrValue::Array(
            a.values
                .into_iter()
                .map(|v| convert_value(v, depth + 1, cut))
                .collect(),
        ),
        Some(Value::KvlistValue(kv)) => AttrValue::Map(convert_list(kv.values, depth + 1, cut)),
        // Only meaningful for the profiling signal; OTLP says to treat it as absent.
        Some(Value::StringValueStrindex(_)) => AttrValue::Empty,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::budget::DEFAULT_BUDGET_KEYS;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, InstrumentationScope};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    pub const NOW: u64 = 1_780_000_000_000_000_000;

    pub fn options() -> NormalizeOptions {
        NormalizeOptions {
            budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
            retention: None,
        }
    }

    pub fn kv(key: &str, value: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue { value: Some(value) }),
            ..Default::default()
        }
    }

    pub fn otlp_span(trace: u8, span: u8, name: &str) -> otlp::Span {
        otlp::Span {
            trace_id: vec![trace; 16],
            span_id: vec![span; 8],
            name: name.into(),
            kind: 2,
            start_time_unix_nano: NOW,
            end_time_unix_nano: NOW + 1_000_000,
            ..Default::default()
        }
    }

    pub fn request(service: Option<&str>, spans: Vec<otlp::Span>) -> ExportTraceServiceRequest {
        let attributes = service
            .map(|s| vec![kv("service.name", any_value::Value::StringValue(s.into()))])
            .unwrap_or_default();
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes,
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "test-scope".into(),
                        version: "1.0".into(),
                        ..Default::default()
                    }),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn converts_service_scope_attributes_and_budget() {
        let mut span = otlp_span(1, 2, "GET /stock");
        span.parent_span_id = vec![3; 8];
        span.attributes = vec![
            kv("deadline.remaining_ms", any_value::Value::IntValue(840)),
            kv(
                "tags",
                any_value::Value::ArrayValue(ArrayValue {
                    values: vec![AnyValue {
                        value: Some(any_value::Value::BoolValue(true)),
                    }],
                }),
            ),
        ];
        span.status = Some(otlp::Status {
            code: 2,
            message: "boom".into(),
        });
        let out = normalize(request(Some("inventory"), vec![span]), &options(), NOW);
        assert_eq!(out.rejected, 0);
        let span = &out.spans[0];
        assert_eq!(span.service, "inventory");
        assert_eq!(span.scope.name, "test-scope");
        assert_eq!(span.kind, SpanKind::Server);
        assert_eq!(span.parent_span_id, Some(SpanId([3; 8])));
        assert_eq!(span.budget.as_ref().unwrap().ms, 840.0);
        assert_eq!(span.status.code, StatusCode::Error);
        assert_eq!(
            span.attributes[1].1,
            AttrValue::Array(vec![AttrValue::Bool(true)])
        );
    }

    #[test]
    fn missing_service_name_becomes_unknown_service() {
        let out = normalize(request(None, vec![otlp_span(1, 2, "x")]), &options(), NOW);
        assert_eq!(out.spans[0].service, UNKNOWN_SERVICE);
    }

    #[test]
    fn all_zero_parent_means_root() {
        let mut span = otlp_span(1, 2, "x");
        span.parent_span_id = vec![0; 8];
        let out = normalize(request(Some("s"), vec![span]), &options(), NOW);
        assert_eq!(out.spans[0].parent_span_id, None);
    }

    #[test]
    fn invalid_spans_are_rejected_one_by_one_and_valid_ones_kept() {
        let mut short_trace = otlp_span(1, 2, "short-trace");
        short_trace.trace_id = vec![1; 8];
        let zero_span = otlp_span(1, 0, "zero-span");
        let mut backwards = otlp_span(1, 3, "backwards");
        backwards.end_time_unix_nano = backwards.start_time_unix_nano - 5;
        let mut no_start = otlp_span(1, 4, "no-start");
        no_start.start_time_unix_nano = 0;
        let mut future = otlp_span(1, 5, "future");
        future.start_time_unix_nano = NOW + 2 * MAX_FUTURE_NANOS;
        future.end_time_unix_nano = future.start_time_unix_nano + 1;
        let mut year_3000 = otlp_span(1, 6, "year-3000");
        year_3000.end_time_unix_nano = u64::MAX;
        let mut bad_parent = otlp_span(1, 7, "bad-parent");
        bad_parent.parent_span_id = vec![1; 3];
        let good = otlp_span(1, 9, "good");
        let spans = vec![
            short_trace,
            zero_span,
            backwards,
            no_start,
            future,
            year_3000,
            bad_parent,
            good,
        ];
        let out = normalize(request(Some("s"), spans), &options(), NOW);
        assert_eq!(out.spans.len(), 1);
        assert_eq!(out.spans[0].name, "good");
        assert_eq!(out.rejected, 7);
        let message = out.error_message();
        assert!(message.starts_with("rejected 7 of 8 spans: trace id is 8 bytes long, expected 16 (first: s \"short-trace\")"), "{message}");
        assert!(message.contains("span id is all zeros"), "{message}");
        assert!(message.contains("ends 5 ns before it starts"), "{message}");
        assert!(message.contains("and 2 other reasons"), "{message}");
    }

    #[test]
    fn nul_characters_are_replaced_with_a_warning() {
        let mut span = otlp_span(1, 2, "a\0b");
        span.status = Some(otlp::Status {
            code: 2,
            message: "x\0".into(),
        });
        let out = normalize(request(Some("s\0"), vec![span]), &options(), NOW);
        let span = &out.spans[0];
        assert_eq!(
            (
                span.service.as_str(),
                span.name.as_str(),
                span.status.message.as_str()
            ),
            ("s\u{FFFD}", "a\u{FFFD}b", "x\u{FFFD}")
        );
        assert_eq!(
            span.warnings,
            ["NUL characters in names or messages were replaced by U+FFFD"]
        );
    }

    #[test]
    fn very_long_names_are_cut_with_a_warning() {
        let long = "é".repeat(MAX_NAME_CHARS + 10);
        let out = normalize(
            request(Some(&long), vec![otlp_span(1, 2, &long)]),
            &options(),
            NOW,
        );
        let span = &out.spans[0];
        assert_eq!(span.service.chars().count(), MAX_NAME_CHARS);
        assert_eq!(span.name.chars().count(), MAX_NAME_CHARS);
        assert_eq!(span.warnings, [NAME_CUT_WARNING], "noted once");
        let short = normalize(
            request(Some("s"), vec![otlp_span(1, 2, "n")]),
            &options(),
            NOW,
        );
        assert!(short.spans[0].warnings.is_empty());
    }

    #[test]
    fn invalid_links_are_dropped_with_a_warning() {
        let mut span = otlp_span(1, 2, "x");
        span.links = vec![otlp::span::Link {
            trace_id: vec![1; 3],
            span_id: vec![1; 8],
            ..Default::default()
        }];
        let out = normalize(request(Some("s"), vec![span]), &options(), NOW);
        assert!(out.spans[0].links.is_empty());
        assert_eq!(
            out.spans[0].warnings,
            ["dropped a link with an invalid trace or span id"]
        );
    }

    #[test]
    fn a_span_older_than_the_retention_is_rejected_with_the_reason() {
        let mut old = otlp_span(1, 1, "old");
        old.start_time_unix_nano = NOW - 8 * 86_400 * 1_000_000_000;
        old.end_time_unix_nano = old.start_time_unix_nano + 1;
        let week = NormalizeOptions {
            retention: Some(std::time::Duration::from_secs(7 * 86_400)),
            ..options()
        };
        let out = normalize(
            request(Some("svc"), vec![old.clone(), otlp_span(1, 2, "new")]),
            &week,
            NOW,
        );
        assert_eq!(out.spans.len(), 1);
        assert_eq!(out.spans[0].name, "new");
        assert!(
            out.error_message()
                .contains("started before the retention period (7days)"),
            "{}",
            out.error_message()
        );
        // Without a retention (`budgetscope analyze`) it is kept.
        assert_eq!(
            normalize(request(Some("svc"), vec![old]), &options(), NOW)
                .spans
                .len(),
            1
        );
    }
}

//! A plain-text trace format for tests and benchmarks: one span per line, indentation (two
//! spaces) makes the parent.
//!
//! ```text
//! # service kind "name" start_ms duration_ms [options]
//! edge server "GET /checkout" 0 650 budget=700
//!   edge client "GET /stock" 10 600 budget=690 method=POST
//!     inventory server "GET /stock" 12 590 budget=688 http-status=504
//! ```
//!
//! Options: `budget=MS` (`deadline.remaining_ms`), `http-status=N`
//! (`http.response.status_code`), `grpc-status=N` (`rpc.grpc.status_code`), `method=M`
//! (`http.request.method`), `error=error` (status ERROR), `parent=missing` (a parent id not
//! in the trace), `id=N` (span id number; defaults to the line number), `attr:KEY=VALUE`
//! (a string attribute).

use std::sync::Arc;

use crate::core::model::{
    AttrValue, Budget, Scope, Span, SpanId, SpanKind, Status, StatusCode, TraceId,
};

/// 2023-11-14T22:13:20Z in unix nanoseconds: fixture time 0.
pub const BASE_UNIX_NANO: u64 = 1_700_000_000_000_000_000;

/// Parses a fixture. Panics with the line number on malformed input (tests only feed it
/// text they wrote).
pub fn parse(text: &str) -> Vec<Span> {
    let mut spans = Vec::new();
    // (indent, span index) of the open ancestors.
    let mut open: Vec<(usize, usize)> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let content = line.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        while open.last().is_some_and(|(level, _)| *level >= indent) {
            open.pop();
        }
        let parent = open.last().map(|(_, i)| *i);
        let span = parse_line(content, spans.len(), parent.map(|p: usize| &spans[p]))
            .unwrap_or_else(|e| panic!("fixture line {}: {e}: {line}", number + 1));
        open.push((indent, spans.len()));
        spans.push(span);
    }
    spans
}

fn parse_line(line: &str, index: usize, parent: Option<&Span>) -> Result<Span, String> {
    let (head, rest) = line.split_once('"').ok_or("name must be quoted")?;
    let (name, tail) = rest.split_once('"').ok_or("unterminated name")?;
    let mut head = head.split_whitespace();
    let service = head.next().ok_or("missing service")?;
    let kind = match head.next().ok_or("missing kind")? {
        "server" => SpanKind::Server,
        "client" => SpanKind::Client,
        "internal" => SpanKind::Internal,
        "producer" => SpanKind::Producer,
        "consumer" => SpanKind::Consumer,
        other => return Err(format!("unknown kind {other}")),
    };
    let mut tail = tail.split_whitespace();
    let number = |text: Option<&str>, what: &str| -> Result<f64, String> {
        text.ok_or(format!("missing {what}"))?
            .parse::<f64>()
            .map_err(|_| format!("{what} is not a number"))
    };
    let start_ms = number(tail.next(), "start")?;
    let duration_ms = number(tail.next(), "duration")?;
    let to_nanos = |ms: f64| BASE_UNIX_NANO.saturating_add_signed((ms * 1e6).round() as i64);
    let mut span = Span {
        trace_id: TraceId([7; 16]),
        span_id: id(index as u64 + 1),
        parent_span_id: parent.map(|p| p.span_id),
        service: service.to_string(),
        name: name.to_string(),
        kind,
        start_unix_nano: to_nanos(start_ms),
        end_unix_nano: to_nanos(start_ms + duration_ms),
        status: Status {
            code: StatusCode::Unset,
            message: String::new(),
        },
        attributes: Vec::new(),
        resource: Arc::new(vec![(
            "service.name".into(),
            AttrValue::String(service.into()),
        )]),
        scope: Scope::default(),
        events: Vec::new(),
        links: Vec::new(),
        budget: None,
        warnings: Vec::new(),
    };
    for option in tail {
        let (key, value) = option
            .split_once('=')
            .ok_or(format!("option {option} needs KEY=VALUE"))?;
        let int = |v: &str| {
            v.parse::<i64>()
                .map_err(|_| format!("{key} needs an integer"))
        };
        match key {
            "budget" => {
                let ms = value
                    .parse::<f64>()
                    .map_err(|_| "budget needs a number".to_string())?;
                span.attributes
                    .push(("deadline.remaining_ms".into(), AttrValue::Double(ms)));
                span.budget = Some(Budget {
                    ms,
                    source: "deadline.remaining_ms".into(),
                });
            }
            "http-status" => span.attributes.push((
                "http.response.status_code".into(),
                AttrValue::Int(int(value)?),
            )),
            "grpc-status" => span
                .attributes
                .push(("rpc.grpc.status_code".into(), AttrValue::Int(int(value)?))),
            "method" => span.attributes.push((
                "http.request.method".into(),
                AttrValue::String(value.into()),
            )),
            "error" => {
                span.status = Status {
                    code: StatusCode::Error,
                    message: value.into(),
                }
            }
            "parent" if value == "missing" => span.parent_span_id = Some(id(0xdead)),
            "id" => span.span_id = id(int(value)? as u64),
            _ => match key.strip_prefix("attr:") {
                Some(attribute) => span
                    .attributes
                    .push((attribute.into(), AttrValue::String(value.into()))),
                None => return Err(format!("unknown option {key}")),
            },
        }
    }
    Ok(span)
}

fn id(n: u64) -> SpanId {
    SpanId(n.max(1).to_be_bytes())
}

/// Three layers (edge → a → b → leaf), each making three attempts at the next: 27 calls
/// reach the leaf, which fails every time (`grpc-status=14`). With `fresh`, every call
/// sends a fresh 1 s timeout (more than is left); otherwise what is left.
pub fn retry_storm(fresh: bool) -> String {
    let budget = |left: f64| if fresh { 1000.0 } else { left };
    let mut text = format!("edge server \"GET /\" 0 9100 budget={}\n", budget(10000.0));
    for a in 0..3 {
        let start = 1.0 + f64::from(a) * 3000.0;
        let left = 9990.0 - start;
        text += &format!("  edge client \"A\" {start} 2950 budget={}\n", budget(left));
        text += &format!(
            "    a server \"A\" {start} 2950 budget={}\n",
            budget(left - 1.0)
        );
        for b in 0..3 {
            let b_start = start + 1.0 + f64::from(b) * 960.0;
            text += &format!(
                "      a client \"B\" {b_start} 950 budget={}\n",
                budget(950.0)
            );
            text += &format!(
                "        b server \"B\" {b_start} 950 budget={}\n",
                budget(949.0)
            );
            for c in 0..3 {
                let c_start = b_start + 1.0 + f64::from(c) * 310.0;
                text += &format!(
                    "          b client \"C\" {c_start} 300 budget={}\n",
                    budget(300.0)
                );
                text += &format!(
                    "            leaf server \"C\" {c_start} 300 budget={} grpc-status=14\n",
                    budget(299.0)
                );
            }
        }
    }
    text
}

/// Moves every span of `service` by `ms` (a host clock that is off).
pub fn shift_service(spans: &mut [Span], service: &str, ms: f64) {
    for span in spans.iter_mut().filter(|s| s.service == service) {
        let shift = |t: u64| t.saturating_add_signed((ms * 1e6).round() as i64);
        span.start_unix_nano = shift(span.start_unix_nano);
        span.end_unix_nano = shift(span.end_unix_nano);
    }
}

//! `budgetscope analyze FILE|-`: the analysis without a server, on OTLP/JSON as exporters
//! send it (one `ExportTraceServiceRequest`) or as the OpenTelemetry Collector's file
//! exporter writes it (one request per line).
//!
//! Architecture invariant: the same path as ingest (`otlp::decode`, normalize, then
//! analyze), minus the store, so a trace reads the same here as in the API.

use std::collections::HashMap;
use std::io::Read as _;

use anyhow::{Context as _, bail};
use clap::Args;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

use crate::core::analyze::{AnalyzeOptions, analyze, text};
use crate::core::budget::DEFAULT_BUDGET_KEYS;
use crate::core::model::{Span, SpanId, TraceId};
use crate::otlp::decode::{Decoded, Format, decode_traces, normalize_decoded};
use crate::otlp::normalize::NormalizeOptions;

#[derive(Debug, Clone, Args)]
pub struct AnalyzeArgs {
    /// OTLP/JSON file to read, or - for standard input.
    pub input: String,
    /// Print each trace as JSON (one line per trace, the shape of GET /api/traces/{id}).
    #[arg(long)]
    pub json: bool,
    /// Tolerance in milliseconds under which budget differences are never flagged.
    #[arg(long, default_value = "50", allow_negative_numbers = true)]
    pub tolerance_ms: f64,
    /// Span attributes read for the remaining budget, first match wins (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect::<Vec<_>>()
    )]
    pub budget_keys: Vec<String>,
}

pub fn run(args: AnalyzeArgs) -> anyhow::Result<()> {
    if !(args.tolerance_ms.is_finite() && args.tolerance_ms >= 0.0) {
        bail!(
            "invalid --tolerance-ms {}: expected a number of milliseconds ≥ 0",
            args.tolerance_ms
        );
    }
    let input = read_input(&args.input)?;
    let requests = parse_requests(input)
        .with_context(|| format!("{} is not OTLP/JSON trace data", args.input))?;
    let options = NormalizeOptions {
        budget_keys: args.budget_keys.clone(),
        retention: None,
    };
    let now = crate::clock::now_unix_nano();
    let mut traces: Vec<(TraceId, Vec<Span>)> = Vec::new();
    let mut position: HashMap<TraceId, usize> = HashMap::new();
    let mut seen: std::collections::HashSet<(TraceId, SpanId)> = Default::default();
    let (mut rejected, mut duplicates) = (0u64, 0u64);
    for request in requests {
        let normalized = normalize_decoded(request, &options, now);
        if normalized.rejected > 0 {
            rejected += normalized.rejected;
            eprintln!("warning: {}", normalized.error_message());
        }
        for span in normalized.spans {
            // As the stores do: the first copy of a span wins.
            if !seen.insert((span.trace_id, span.span_id)) {
                duplicates += 1;
                continue;
            }
            let slot = *position.entry(span.trace_id).or_insert_with(|| {
                traces.push((span.trace_id, Vec::new()));
                traces.len() - 1
            });
            traces[slot].1.push(span);
        }
    }
    let span_count: usize = traces.iter().map(|(_, spans)| spans.len()).sum();
    if span_count == 0 {
        bail!(
            "no valid spans in {} ({rejected} invalid; the warnings above say why)",
            args.input
        );
    }
    eprintln!(
        "{} trace{}, {span_count} span{}{}{}",
        traces.len(),
        if traces.len() == 1 { "" } else { "s" },
        if span_count == 1 { "" } else { "s" },
        if rejected > 0 {
            format!(", {rejected} invalid spans skipped")
        } else {
            String::new()
        },
        if duplicates > 0 {
            format!(", {duplicates} repeated spans ignored")
        } else {
            String::new()
        },
    );
    let analyze_options = AnalyzeOptions {
        tolerance_ms: args.tolerance_ms,
    };
    let mut out = std::io::stdout().lock();
    for (trace_id, mut spans) in traces {
        spans.sort_by_key(|s| (s.start_unix_nano, s.span_id));
        if args.json {
            writeln_out(
                &mut out,
                &crate::web::api::trace_json(trace_id, &spans, &analyze_options),
            )?;
        } else {
            let analysis = analyze(&spans, &analyze_options);
            writeln_out(
                &mut out,
                &format!("trace {trace_id}\n{}", text::render(&spans, &analysis)),
            )?;
        }
    }
    Ok(())
}

fn writeln_out(out: &mut impl std::io::Write, text: &str) -> anyhow::Result<()> {
    match writeln!(out, "{text}") {
        // `budgetscope analyze … | head` closes the pipe: that is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn read_input(input: &str) -> anyhow::Result<bytes::Bytes> {
    let mut bytes = Vec::new();
    if input == "-" {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("could not read standard input")?;
    } else {
        bytes = std::fs::read(input).with_context(|| format!("could not read {input}"))?;
    }
    Ok(bytes.into())
}

/// One request, or JSON lines of requests.
fn parse_requests(input: bytes::Bytes) -> anyhow::Result<Vec<Decoded<ExportTraceServiceRequest>>> {
    if let Ok(request) = decode_traces(input.clone(), Format::Json) {
        return Ok(vec![request]);
    }
    let mut requests = Vec::new();
    let mut start = 0;
    for (number, line) in input.split(|b| *b == b'\n').enumerate() {
        let range = start..start + line.len();
        start = range.end + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let request = decode_traces(input.slice(range), Format::Json).with_context(|| {
            format!(
                "line {}: expected an ExportTraceServiceRequest ({{\"resourceSpans\": […]}}) with hex ids and integer enums",
                number + 1
            )
        })?;
        requests.push(request);
    }
    if requests.is_empty() {
        bail!("no trace data found");
    }
    Ok(requests)
}

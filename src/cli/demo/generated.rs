//! `budgetscope demo --endpoint URL`: sends generated multi-hop traces with budgets to a
//! running server over real OTLP/HTTP, spread over the past (`--spread`), so history views
//! have content. A fifth of them misbehave (overspend, send on spent budgets, inflate).
//!
//! Architecture invariant: a client like any exporter; it knows nothing of the server's
//! internals and uses the same generator as `budgetscope-bench ingest`.

use std::time::Duration;

use anyhow::{Context as _, bail};
use prost::Message as _;

/// Sends the generated traces to `endpoint` (see `DemoArgs`).
pub async fn run(
    endpoint: &str,
    ui: &str,
    spans: usize,
    spread: &str,
    large_trace: Option<usize>,
) -> anyhow::Result<()> {
    let spread = humantime::parse_duration(spread)
        .with_context(|| format!("invalid --spread {:?}: expected e.g. 15m, 1h or 1d", spread))?;
    if spans == 0 {
        bail!("invalid --spans 0: give how many spans to send, e.g. 5000");
    }
    let mut requests = crate::otlp::generate::generate_over(spans, 250, spread, 0.2);
    if let Some(size) = large_trace.filter(|n| *n > 0) {
        let mut spans = crate::otlp::generate::large_trace(size);
        let id = crate::core::model::TraceId(rand::random());
        for span in &mut spans {
            span.trace_id = id;
        }
        eprintln!("large trace of {size} spans: trace id {id}");
        for chunk in spans.chunks(1000) {
            requests.push(crate::otlp::download::to_request(chunk));
        }
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let total = requests.len();
    for (i, request) in requests.into_iter().enumerate() {
        let spans = crate::otlp::normalize::span_count(&request);
        let response = client
            .post(endpoint)
            .header("content-type", "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .await
            .with_context(|| {
                format!(
                    "could not reach {}; is `budgetscope serve` running, and is --endpoint its OTLP/HTTP address?",
                    endpoint
                )
            })?;
        if !response.status().is_success() {
            bail!(
                "{} answered {}: {}",
                endpoint,
                response.status(),
                response.text().await.unwrap_or_default()
            );
        }
        eprint!("\rsent request {}/{total} ({spans} spans)   ", i + 1);
    }
    eprintln!(
        "\ndone: {} spans sent. Traces are analysed about 10 s after their last span; then open {}",
        spans, ui
    );
    Ok(())
}

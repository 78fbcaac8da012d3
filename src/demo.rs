//! `budgetscope demo`: sends generated multi-hop traces with budgets to a running server
//! over real OTLP/HTTP, so the UI can be tried before any service is instrumented. A fifth
//! of them misbehave (overspend, send on spent budgets, inflate), so every view has content.
//!
//! Architecture invariant: a client like any exporter; it knows nothing of the server's
//! internals and uses the same generator as `budgetscope-bench ingest`.

use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use prost::Message as _;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// OTLP/HTTP traces endpoint of the server.
    #[arg(long, default_value = "http://127.0.0.1:4318/v1/traces")]
    pub endpoint: String,
    /// The server's UI, printed when the traces are sent (its --http-addr).
    #[arg(long, default_value = "http://127.0.0.1:8080/")]
    pub ui: String,
    /// Spans to send in total.
    #[arg(long, default_value = "5000")]
    pub spans: usize,
    /// Spread the traces' start times over this period before now (e.g. 15m, 1h, 1d).
    #[arg(long, default_value = "1h")]
    pub spread: String,
    /// Also send one trace of this many spans (a fan-out tree across services, the analysis
    /// benchmark's shape), to see how the waterfall handles large traces.
    #[arg(long)]
    pub large_trace: Option<usize>,
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let spread = humantime::parse_duration(&args.spread).with_context(|| {
        format!(
            "invalid --spread {:?}: expected e.g. 15m, 1h or 1d",
            args.spread
        )
    })?;
    if args.spans == 0 {
        bail!("invalid --spans 0: give how many spans to send, e.g. 5000");
    }
    let mut requests = crate::generate::generate_over(args.spans, 250, spread, 0.2);
    if let Some(size) = args.large_trace.filter(|n| *n > 0) {
        let mut spans = crate::generate::large_trace(size);
        let id = crate::model::TraceId(rand::random());
        for span in &mut spans {
            span.trace_id = id;
        }
        eprintln!("large trace of {size} spans: trace id {id}");
        for chunk in spans.chunks(1000) {
            requests.push(crate::export::to_request(chunk));
        }
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let total = requests.len();
    for (i, request) in requests.into_iter().enumerate() {
        let spans = crate::normalize::span_count(&request);
        let response = client
            .post(&args.endpoint)
            .header("content-type", "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .await
            .with_context(|| {
                format!(
                    "could not reach {}; is `budgetscope serve` running, and is --endpoint its OTLP/HTTP address?",
                    args.endpoint
                )
            })?;
        if !response.status().is_success() {
            bail!(
                "{} answered {}: {}",
                args.endpoint,
                response.status(),
                response.text().await.unwrap_or_default()
            );
        }
        eprint!("\rsent request {}/{total} ({spans} spans)   ", i + 1);
    }
    eprintln!(
        "\ndone: {} spans sent. Traces are analysed about 10 s after their last span; then open {}",
        args.spans, args.ui
    );
    Ok(())
}

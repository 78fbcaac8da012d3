//! `budgetscope-bench reads`: concurrent reads of one huge flat trace (every span a child of
//! the root) from a real server under `--memory-limit`, with the server's peak anonymous
//! memory (RssAnon, sampled every 10 ms) per endpoint. The trace is exported over
//! OTLP/HTTP first; the analyzer is kept idle (`--quiet-period 1h`) so only the reads
//! count; then the server restarts with a short quiet period and the analyzer's peak is
//! measured until the trace is summarised. Run it against another build with
//! `--server PATH` for a baseline.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use prost::Message as _;

use budgetscope::core::budget::DEFAULT_BUDGET_KEYS;
use budgetscope::core::model::{Span, SpanId, TraceId};
use budgetscope::otlp::download::to_request;
use budgetscope::otlp::generate::generate;
use budgetscope::otlp::normalize::{NormalizeOptions, normalize};

use crate::ingest::{ChildServer, Prepared, Sender};
use crate::{ReadsBench, Transport, server_beside_harness};

/// Spans per export request.
const EXPORT: usize = 5_000;

pub async fn reads(bench: ReadsBench) -> anyhow::Result<()> {
    anyhow::ensure!(bench.spans >= 2, "--spans must be at least 2");
    let exe = match &bench.server {
        Some(path) => path.clone(),
        None => server_beside_harness()?,
    };
    let dir = tempfile::tempdir()?;
    let db = format!("sqlite://{}", dir.path().join("reads.db").display());
    let args = [
        "--memory-limit".to_string(),
        bench.memory_limit.clone(),
        "--quiet-period".into(),
        "1h".into(),
    ];
    let server = ChildServer::start(&exe, &db, &args).await?;
    eprintln!("exporting one flat trace of {} spans…", bench.spans);
    let spans = flat_trace(bench.spans);
    let id = spans[0].trace_id;
    let mut sender = Sender::connect(
        Transport::HttpProto,
        false,
        server.grpc_addr,
        server.http_otlp_addr,
    )
    .await?;
    let refusals = AtomicU64::new(0);
    for chunk in spans.chunks(EXPORT) {
        let request = to_request(chunk);
        let body = request.encode_to_vec().into();
        let prepared = Prepared {
            request,
            body,
            spans: chunk.len(),
        };
        sender.send_until_stored(&prepared, &refusals).await?;
    }
    drop(spans);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = server.anon_rss_bytes()?;
    println!(
        "{} spans, --memory-limit {}, {} reads at once, server {}; anonymous memory before \
         the reads {:.0} MiB",
        bench.spans,
        bench.memory_limit,
        bench.concurrency,
        exe.display(),
        mib(idle)
    );
    println!();
    println!("| endpoint | statuses | bytes per answer | slowest read | peak anonymous memory |");
    println!("|---|---|---|---|---|");
    let client = reqwest::Client::new();
    for path in [
        format!("/api/traces/{id}"),
        format!("/traces/{id}"),
        format!("/jaeger/api/traces/{id}"),
        format!("/api/traces/{id}/otlp"),
    ] {
        let url = format!("http://{}{path}", server.http_addr);
        let started = Instant::now();
        let reads: Vec<_> = (0..bench.concurrency)
            .map(|_| {
                let (client, url) = (client.clone(), url.clone());
                tokio::spawn(async move {
                    let response = client.get(&url).send().await?;
                    let status = response.status().as_u16();
                    let bytes = response.bytes().await?.len();
                    anyhow::Ok((status, bytes))
                })
            })
            .collect();
        let mut peak = server.anon_rss_bytes()?;
        while !reads.iter().all(|r| r.is_finished()) {
            peak = peak.max(server.anon_rss_bytes().unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed();
        let mut answers = Vec::new();
        for read in reads {
            answers.push(read.await.context("a read panicked")??);
        }
        let statuses: Vec<String> = answers.iter().map(|(s, _)| s.to_string()).collect();
        let bytes = answers.iter().map(|(_, b)| *b).max().unwrap_or(0);
        println!(
            "| {} | {} | {:.1} MB | {:.2} s | {:.0} MiB |",
            path.replace(&id.to_string(), "{id}"),
            statuses.join(", "),
            bytes as f64 / 1e6,
            elapsed.as_secs_f64(),
            mib(peak)
        );
        // Let freed memory go back before the next endpoint.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    server.stop().await?;

    // The analyzer on the same trace: the server restarted with a short quiet period,
    // until the trace is summarised.
    let args = [
        "--memory-limit".to_string(),
        bench.memory_limit.clone(),
        "--quiet-period".into(),
        "1s".into(),
    ];
    let server = ChildServer::start(&exe, &db, &args).await?;
    let started = Instant::now();
    let mut peak = server.anon_rss_bytes()?;
    let mut last_poll = Instant::now() - Duration::from_secs(1);
    let outcome = loop {
        peak = peak.max(server.anon_rss_bytes().unwrap_or(0));
        if last_poll.elapsed() >= Duration::from_millis(500) {
            last_poll = Instant::now();
            let url = format!("http://{}/api/traces?limit=1", server.http_addr);
            let found: serde_json::Value =
                serde_json::from_slice(&client.get(&url).send().await?.bytes().await?)?;
            if let Some(outcome) = found["traces"][0]["outcome"].as_str() {
                break outcome.to_string();
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(600),
                "the trace was not summarised within 10 minutes"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!();
    println!(
        "analyzer: the trace summarised as `{outcome}` {:.1} s after start-up, peak anonymous \
         memory {:.0} MiB",
        started.elapsed().as_secs_f64(),
        mib(peak)
    );
    server.stop().await
}

/// One trace of `count` generated spans, all children of the first.
fn flat_trace(count: usize) -> Vec<Span> {
    let options = NormalizeOptions {
        budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
        retention: None,
    };
    let now = budgetscope::clock::now_unix_nano();
    let mut spans: Vec<Span> = generate(count, EXPORT)
        .into_iter()
        .flat_map(|r| normalize(r, &options, now).spans)
        .take(count)
        .collect();
    let trace_id = TraceId(rand::random());
    let root = SpanId(1u64.to_be_bytes());
    for (i, span) in spans.iter_mut().enumerate() {
        span.trace_id = trace_id;
        span.span_id = SpanId((i as u64 + 1).to_be_bytes());
        span.parent_span_id = (i > 0).then_some(root);
    }
    spans
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

//! The benchmarks that call the library in process: a request's CPU before the writer
//! (`receive`), analysis (`analyze`), queries and pages on a filled store (`query`) and the
//! trace page (`ui`).

use std::time::{Duration, Instant};

use anyhow::bail;
use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use rand::Rng as _;

use budgetscope::core::budget::DEFAULT_BUDGET_KEYS;
use budgetscope::otlp::generate::{generate, generate_over, large_trace};
use budgetscope::otlp::normalize::{NormalizeOptions, normalize};
use budgetscope::store;

use crate::{
    AnalyzeBench, BenchDatabases, QueryBench, RawScanner, ReceiveBench, UiBench, median_and_range,
};

/// Times the request side of ingest on one thread: what the receivers do with a request
/// body before handing rows to the writer (`otlp::decode::decode_traces`, as both endpoints
/// call it, then `pipeline::receiver::prepare`, and freeing it all, as the server does),
/// against the least any receiver does: decoding the body with the generated OTLP types
/// (prost, or their serde implementation for JSON).
pub fn receive_bench(bench: &ReceiveBench) {
    use budgetscope::otlp::decode::{Format, decode_traces};
    use budgetscope::pipeline::receiver::prepare;
    let format = if bench.json {
        Format::Json
    } else {
        Format::Protobuf
    };
    let batch = bench.batch.max(1);
    eprintln!("generating {} spans in requests of {batch}…", bench.spans);
    // As the receivers get a body: tonic's buffer or axum's, as `Bytes`.
    let bodies: Vec<Bytes> = generate(bench.spans.max(1), batch)
        .iter()
        .map(|request| {
            if bench.json {
                serde_json::to_vec(request)
                    .expect("requests serialise")
                    .into()
            } else {
                request.encode_to_vec().into()
            }
        })
        .collect();
    let spans = bench.spans.max(1) as f64;
    let options = NormalizeOptions {
        budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
        retention: None,
    };
    let now = budgetscope::clock::now_unix_nano();
    let ns_per_span = |f: &dyn Fn(&Bytes)| {
        let started = Instant::now();
        for body in &bodies {
            f(body);
        }
        started.elapsed().as_secs_f64() * 1e9 / spans
    };
    fn text(body: &Bytes) -> &str {
        std::str::from_utf8(body).expect("JSON bodies are UTF-8")
    }
    let ours = |body: &Bytes| {
        let decoded = decode_traces(body.clone(), format).expect("generated requests decode");
        std::hint::black_box(prepare(decoded, &options, now, None));
    };
    let baseline = |body: &Bytes| {
        let request = if bench.json {
            serde_json::from_str::<ExportTraceServiceRequest>(text(body))
                .expect("generated requests decode")
        } else {
            ExportTraceServiceRequest::decode(body.clone()).expect("generated requests decode")
        };
        std::hint::black_box(request);
    };
    // For JSON, our decoder alone (`otlp::decode::decode_traces`), against the same baseline.
    let decode_alone = |body: &Bytes| {
        std::hint::black_box(
            decode_traces(body.clone(), format).expect("generated requests decode"),
        );
    };
    let (mut ours_ns, mut baseline_ns, mut decode_ns) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..bench.rounds.max(1) {
        eprintln!("round {} of {}…", round + 1, bench.rounds.max(1));
        ours_ns.push(ns_per_span(&ours));
        baseline_ns.push(ns_per_span(&baseline));
        if bench.json {
            decode_ns.push(ns_per_span(&decode_alone));
        }
    }
    let (ours_median, ours_min, ours_max) = median_and_range(ours_ns);
    let (base_median, base_min, base_max) = median_and_range(baseline_ns);
    println!(
        "## receive: {}, {batch} spans/request, {} spans per round, median of {} rounds (min–max)",
        if bench.json { "OTLP/JSON" } else { "protobuf" },
        bench.spans.max(1),
        bench.rounds.max(1)
    );
    println!("| path | ns per span |\n|---|---|");
    println!(
        "| decode + normalise + encode rows + free (the receivers' work) | {ours_median:.0} ({ours_min:.0}–{ours_max:.0}) |"
    );
    println!(
        "| baseline: decode with the generated OTLP types + free | {base_median:.0} ({base_min:.0}–{base_max:.0}) |"
    );
    println!(
        "| receivers' work ÷ baseline | {:.2} |",
        ours_median / base_median
    );
    if bench.json {
        let (decode_median, decode_min, decode_max) = median_and_range(decode_ns);
        println!(
            "| budgetscope's OTLP/JSON decoder (`otlp::decode::decode_traces`) + free | {decode_median:.0} ({decode_min:.0}–{decode_max:.0}) |"
        );
        println!(
            "| budgetscope's decoder ÷ baseline | {:.2} |",
            decode_median / base_median
        );
    }
}

/// Times `analyze` (and the API's JSON of it) on one generated trace per size.
pub fn analyze_bench(bench: &AnalyzeBench) {
    use budgetscope::core::analyze::{AnalyzeOptions, analyze};
    let options = AnalyzeOptions::default();
    println!(
        "## analysis: median of {} runs (min–max)",
        bench.repeats.max(1)
    );
    println!(
        "| spans | analyze | analyze + API JSON | baseline: index ids + sort by start | analyze ÷ baseline | flags |"
    );
    println!("|---|---|---|---|---|---|");
    for &size in &bench.spans {
        eprintln!("generating a trace of {size} spans…");
        let spans = large_trace(size);
        let runs = bench.repeats.max(1);
        let time = |f: &dyn Fn()| {
            median_and_range(
                (0..runs)
                    .map(|_| {
                        let started = Instant::now();
                        f();
                        started.elapsed().as_secs_f64() * 1e3
                    })
                    .collect(),
            )
        };
        let analysis = analyze(&spans, &options);
        let flags: usize = analysis.flag_counts.values().sum();
        let (analyze_ms, analyze_min, analyze_max) = time(&|| {
            std::hint::black_box(analyze(&spans, &options));
        });
        let (json_ms, json_min, json_max) = time(&|| {
            let analysis = analyze(&spans, &options);
            std::hint::black_box(
                serde_json::to_string(&budgetscope::web::api::AnalysisJson::new(&spans, &analysis))
                    .unwrap_or_default(),
            );
        });
        let (base_ms, base_min, base_max) = time(&|| {
            let index: std::collections::HashMap<_, _> = spans
                .iter()
                .enumerate()
                .map(|(i, s)| (s.span_id, i))
                .collect();
            let mut order: Vec<usize> = (0..spans.len()).collect();
            order.sort_by_key(|&i| spans[i].start_unix_nano);
            std::hint::black_box((index, order));
        });
        println!(
            "| {size} | {analyze_ms:.2} ms ({analyze_min:.2}–{analyze_max:.2}) | {json_ms:.2} ms ({json_min:.2}–{json_max:.2}) | {base_ms:.2} ms ({base_min:.2}–{base_max:.2}) | {:.1} | {flags} |",
            analyze_ms / base_ms
        );
    }
}

/// Fills a fresh store, indexes it with the background analyzer's code, then times the
/// API through the real router (no network): server time per request.
pub async fn query_bench(bench: QueryBench) -> anyhow::Result<()> {
    use budgetscope::core::analyze::AnalyzeOptions;
    use tower::ServiceExt as _;

    let databases = BenchDatabases::new(&bench.db).await?;
    let url = databases.fresh("query").await?;
    let store = store::open(&url).await?;
    let options = NormalizeOptions {
        budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
        retention: None,
    };
    let day = Duration::from_secs(86_400);
    if databases.is_postgres() {
        // The time partitions a server's retention pass would have created over the day.
        let plan = store::PartitionPlan {
            healthy: day,
            all: 7 * day,
        };
        let now = budgetscope::clock::now_unix_nano();
        let hour = 3_600_000_000_000;
        for hours_ago in (0..=27).rev().step_by(3) {
            store.keep_partitions(plan, now - hours_ago * hour).await?;
        }
    }

    // 1. Spans, in chunks so memory stays flat.
    let started = Instant::now();
    let mut written = 0usize;
    while written < bench.spans {
        let chunk = (bench.spans - written).min(100_000);
        let now = budgetscope::clock::now_unix_nano();
        let spans: Vec<_> = generate_over(chunk, 512, day, 0.0)
            .into_iter()
            .flat_map(|r| normalize(r, &options, now).spans)
            .collect();
        for batch in spans.chunks(20_000) {
            store.write_spans(batch).await?;
        }
        written += chunk;
        eprintln!(
            "  stored {written}/{} spans ({:.0} spans/s)",
            bench.spans,
            written as f64 / started.elapsed().as_secs_f64()
        );
    }
    // 200 traces of 100 spans, for the trace-fetch target.
    let mut fat_ids = Vec::new();
    for i in 0..200u32 {
        let mut trace = large_trace(100);
        let id = budgetscope::core::model::TraceId(rand::rng().random());
        for span in &mut trace {
            span.trace_id = id;
            span.start_unix_nano -= u64::from(i) * 400_000_000_000;
            span.end_unix_nano -= u64::from(i) * 400_000_000_000;
        }
        store.write_spans(&trace).await?;
        fat_ids.push(id);
    }
    let fill_seconds = started.elapsed().as_secs_f64();

    // The hops baseline, a raw scan of the spans, runs before the analyzer's pass moves
    // analysed traces' rows into compressed blocks (which no SQL can scan).
    let now = budgetscope::clock::now_unix_nano();
    let mut raw_times = Vec::new();
    let scanner = RawScanner::connect(&url).await?;
    for _ in 0..5 {
        let started = Instant::now();
        scanner.scan(now - day.as_nanos() as u64, now + 1).await?;
        raw_times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let raw_p50 = {
        let mut times = raw_times;
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };

    // 2. Summaries and rollups, through the background analyzer's pass, then blocks.
    let started = Instant::now();
    let traces = crate::retention::analyse_all(store.as_ref()).await?;
    let index_seconds = started.elapsed().as_secs_f64();
    scanner.analyse().await?;

    // 3. Queries through the router.
    let app = budgetscope::web::app(budgetscope::web::AppState::new(
        store.clone(),
        AnalyzeOptions::default(),
    ));
    let time = |uri: String| {
        let app = app.clone();
        async move {
            let started = Instant::now();
            let response = app
                .oneshot(axum::http::Request::get(uri.as_str()).body(axum::body::Body::empty())?)
                .await?;
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
            let elapsed = started.elapsed().as_secs_f64() * 1e3;
            if !status.is_success() {
                bail!(
                    "{uri} answered {status}: {}",
                    String::from_utf8_lossy(&body)
                );
            }
            anyhow::Ok(elapsed)
        }
    };
    let percentiles = |mut times: Vec<f64>| {
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        (at(0.5), at(0.95), at(0.99))
    };
    println!(
        "## queries on {} spans ({}), {} runs each",
        bench.spans + 20_000,
        databases.backend(),
        bench.runs
    );
    println!(
        "fill: {:.0} spans/s; background analyzer: {traces} traces in {index_seconds:.1} s ({:.0} traces/s)",
        (bench.spans + 20_000) as f64 / fill_seconds,
        traces as f64 / index_seconds
    );
    println!("| request | p50 ms | p95 ms | p99 ms |\n|---|---|---|---|");
    let mut trace_times = Vec::new();
    for run in 0..bench.runs {
        trace_times.push(time(format!("/api/traces/{}", fat_ids[run % fat_ids.len()])).await?);
    }
    let (p50, p95, p99) = percentiles(trace_times);
    println!(
        "| GET /api/traces/{{id}} (100-span trace, with analysis) | {p50:.2} | {p95:.2} | {p99:.2} |"
    );
    let searches = [
        "",
        "service=inventory",
        "service=billing&operation=POST%20%2Fapi%2Fv1%2Fbilling%2F%7Bid%7D",
        "flag=inflated",
        "flag=inflated&service=inventory",
        "outcome=exceeded",
        "outcome=ok",
        "min_duration_ms=100",
        "since=-1h",
        "min_budget_ms=1500&limit=50",
        "attr=http.response.status_code%3E%3D500",
    ];
    let mut all_search = Vec::new();
    for query in searches {
        let mut times = Vec::new();
        for _ in 0..bench.runs.div_ceil(4).max(5) {
            times.push(time(format!("/api/traces?{query}")).await?);
        }
        all_search.extend(times.iter().copied());
        let (p50, p95, p99) = percentiles(times);
        println!(
            "| GET /api/traces?{} | {p50:.2} | {p95:.2} | {p99:.2} |",
            if query.is_empty() {
                "(no filter)"
            } else {
                query
            }
        );
    }
    let (p50, p95, p99) = percentiles(all_search);
    println!("| **search, all of the above** | {p50:.2} | **{p95:.2}** | {p99:.2} |");
    let mut hop_times = Vec::new();
    for _ in 0..bench.runs.div_ceil(4).max(5) {
        hop_times.push(time("/api/hops?since=-24h".to_string()).await?);
    }
    let (hops_p50, p95, p99) = percentiles(hop_times);
    println!("| GET /api/hops?since=-24h (rollups) | {hops_p50:.2} | {p95:.2} | {p99:.2} |");
    for page in [
        "/?range=1h",
        "/?range=24h",
        "/?range=7d",
        "/traces",
        "/traces?outcome=exceeded&service=inventory",
        "/hops/inventory/POST%20%2Fapi%2Fv1%2Finventory%2F%7Bid%7D?range=24h",
    ] {
        let mut times = Vec::new();
        for _ in 0..bench.runs.div_ceil(4).max(5) {
            times.push(time(page.to_string()).await?);
        }
        let (p50, p95, p99) = percentiles(times);
        println!("| page {page} | {p50:.2} | {p95:.2} | {p99:.2} |");
    }
    let mut page_times = Vec::new();
    for run in 0..bench.runs {
        page_times.push(time(format!("/traces/{}", fat_ids[run % fat_ids.len()])).await?);
    }
    let (p50, p95, p99) = percentiles(page_times);
    println!("| page /traces/{{id}} (100-span trace) | {p50:.2} | {p95:.2} | {p99:.2} |");
    println!(
        "| baseline: raw scan of the same 24 h of spans (GROUP BY service, name) | {raw_p50:.2} | | |"
    );
    println!(
        "| hops (rollups) ÷ raw scan, medians | {:.3} | | |",
        hops_p50 / raw_p50
    );
    databases.cleanup().await;
    Ok(())
}

/// Stores one generated trace per size in a fresh SQLite store, then times the trace page
/// and, as the same-run baseline, the trace API (same fetch and analysis, JSON instead of
/// HTML), both through the real router.
pub async fn ui_bench(bench: UiBench) -> anyhow::Result<()> {
    use budgetscope::core::analyze::AnalyzeOptions;
    use tower::ServiceExt as _;

    let dir = tempfile::tempdir()?;
    let store = store::open(&format!("sqlite://{}", dir.path().join("ui.db").display())).await?;
    let app = budgetscope::web::app(budgetscope::web::AppState::new(
        store.clone(),
        AnalyzeOptions::default(),
    ));
    println!(
        "## trace page server time (SQLite, through the router), {} runs each",
        bench.runs
    );
    println!(
        "| spans | page p50 | page p95 | page size | baseline: GET /api/traces/{{id}} p50 | page ÷ API |"
    );
    println!("|---|---|---|---|---|---|");
    for &size in &bench.spans {
        eprintln!("storing a trace of {size} spans…");
        let spans = large_trace(size);
        let id = spans[0].trace_id.to_hex();
        for chunk in spans.chunks(20_000) {
            store.write_spans(chunk).await?;
        }
        let timed = |uri: String| {
            let app = app.clone();
            async move {
                let started = Instant::now();
                let response = app
                    .oneshot(
                        axum::http::Request::get(uri.as_str()).body(axum::body::Body::empty())?,
                    )
                    .await?;
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
                if !status.is_success() {
                    bail!("{uri} answered {status}");
                }
                anyhow::Ok((started.elapsed().as_secs_f64() * 1e3, body.len()))
            }
        };
        let (mut page, mut api, mut bytes) = (Vec::new(), Vec::new(), 0);
        for run in 0..bench.runs.max(1) {
            eprint!("\r  run {}/{}   ", run + 1, bench.runs);
            let (ms, len) = timed(format!("/traces/{id}")).await?;
            page.push(ms);
            bytes = len;
            api.push(timed(format!("/api/traces/{id}")).await?.0);
        }
        eprintln!();
        page.sort_by(f64::total_cmp);
        api.sort_by(f64::total_cmp);
        let at = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        println!(
            "| {size} | {:.1} ms | {:.1} ms | {:.0} KiB | {:.1} ms | {:.2} |",
            at(&page, 0.5),
            at(&page, 0.95),
            bytes as f64 / 1024.0,
            at(&api, 0.5),
            at(&page, 0.5) / at(&api, 0.5)
        );
    }
    Ok(())
}

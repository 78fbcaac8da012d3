//! The memory budget's per-byte figures (BENCHMARKS.md, "Memory"; `src/pipeline/memory.rs`). Run
//! with `cargo bench --bench memory`; not part of the product binary.
//!
//! A counting allocator records the peak of live Rust heap bytes (SQLite's own allocations
//! are not counted: they are the fixed page caches).
//! 1. An export request from its body to the encoded rows waiting for the writer: the
//!    body, the decoded request, the normalised spans, the rows and the spans' projection
//!    held for the analyzer (`recent`), per body byte, over
//!    protobuf and over JSON, for requests of 100, 512 and 4,096 spans.
//! 2. The analyzer's pass: 200 traces read with `Store::traces_within`, analysed and
//!    summarised, per byte of span rows read.
//! 3. Reads of one flat trace (every span a child of the root) through the router, until
//!    the whole answer is read: the trace page, `GET /api/traces/{id}`, the Jaeger API's
//!    trace, per byte of the trace's rows; and the streamed OTLP download's peak, which
//!    should not grow with the trace.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use budgetscope::core::analyze::hops::samples;
use budgetscope::core::analyze::summary::summarize;
use budgetscope::core::analyze::{AnalyzeOptions, analyze};
use budgetscope::core::budget::DEFAULT_BUDGET_KEYS;
use budgetscope::core::model::{Span, TraceId};
use budgetscope::otlp::decode::{Format, decode_traces};
use budgetscope::otlp::generate::generate;
use budgetscope::otlp::normalize::{NormalizeOptions, normalize};
use budgetscope::pipeline::held::HeldTraces;
use budgetscope::pipeline::memory::MemoryBudget;
use budgetscope::pipeline::receiver::prepare;
use prost::Message as _;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `work` and returns its result with the peak of live bytes above those live before.
fn peak_of<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = work();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

fn options() -> NormalizeOptions {
    NormalizeOptions {
        budget_keys: DEFAULT_BUDGET_KEYS.iter().map(|k| k.to_string()).collect(),
        retention: None,
    }
}

fn requests() {
    println!("| request | body bytes | peak heap ÷ body bytes | rows ÷ body bytes |");
    println!("|---|---|---|---|");
    let options = options();
    // As on the server, the request also holds its spans' projection for the analyzer.
    let recent = HeldTraces::new(&MemoryBudget::with_pool(1 << 30));
    for batch in [100, 512, 4_096] {
        let request = generate(batch, batch).remove(0);
        let protobuf = request.encode_to_vec();
        let json = serde_json::to_vec(&request).expect("the request serialises");
        drop(request);
        for (format, body) in [(Format::Protobuf, protobuf), (Format::Json, json)] {
            let len = body.len();
            let (rows, peak) = peak_of(|| {
                let decoded = decode_traces(body.into(), format).expect("decodes");
                let (rows, held, _) = prepare(decoded, &options, now(), Some(&recent));
                (rows, held)
            });
            let rows_bytes = LIVE.load(Ordering::Relaxed);
            drop(rows);
            let rows_bytes = rows_bytes - LIVE.load(Ordering::Relaxed);
            println!(
                "| {batch} spans, {format:?} | {len} | {:.2} | {:.2} |",
                peak as f64 / len as f64,
                rows_bytes as f64 / len as f64
            );
        }
    }
}

async fn pass() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("memory.db").display());
    let store = budgetscope::store::open(&url).await.expect("opens");
    let options = options();
    let spans: Vec<Span> = generate(20_000, 512)
        .into_iter()
        .flat_map(|r| normalize(r, &options, now()).spans)
        .collect();
    store.write_spans(&spans).await.expect("stores");
    let mut ids: Vec<TraceId> = spans.iter().map(|s| s.trace_id).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.truncate(200);
    drop(spans);
    println!();
    println!("| analyzer pass | row bytes read | peak heap ÷ row bytes |");
    println!("|---|---|---|");
    for traces in [50, 200] {
        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let read = store
            .traces_within(&ids[..traces], u64::MAX, u64::MAX)
            .await
            .expect("reads");
        let (spans, bytes) = (read.spans, read.bytes);
        {
            let mut by_trace: std::collections::HashMap<TraceId, Vec<Span>> = Default::default();
            for span in spans {
                by_trace.entry(span.trace_id).or_default().push(span);
            }
            let summaries: Vec<_> = by_trace
                .into_values()
                .filter_map(|spans| {
                    let analysis = analyze(&spans, &AnalyzeOptions::default());
                    summarize(&spans, &analysis)
                        .map(|summary| (summary, samples(&spans, &analysis)))
                })
                .collect();
            drop(summaries);
        }
        let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
        println!(
            "| {traces} traces | {bytes} | {:.2} |",
            peak as f64 / bytes as f64
        );
    }
}

/// One trace of `count` spans, all children of its root.
fn flat_trace(count: usize) -> Vec<Span> {
    let mut spans: Vec<Span> = generate(count, 512)
        .into_iter()
        .flat_map(|r| normalize(r, &options(), now()).spans)
        .take(count)
        .collect();
    let trace_id = TraceId([7; 16]);
    let root = spans[0].span_id;
    for (i, span) in spans.iter_mut().enumerate() {
        span.trace_id = trace_id;
        span.parent_span_id = (i > 0).then_some(root);
        span.span_id = budgetscope::core::model::SpanId((i as u64 + 1).to_be_bytes());
    }
    spans
}

async fn reads() {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    println!();
    println!("| read of a flat trace | spans | row bytes | peak heap ÷ row bytes | peak heap |");
    println!("|---|---|---|---|---|");
    for count in [5_000, 20_000] {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("reads.db").display());
        let store = budgetscope::store::open(&url).await.expect("opens");
        let spans = flat_trace(count);
        let id = spans[0].trace_id;
        store.write_spans(&spans).await.expect("stores");
        drop(spans);
        let size = store.trace_size(&[id]).await.expect("sizes");
        let mut state = budgetscope::web::AppState::new(store, AnalyzeOptions::default());
        state.memory = MemoryBudget::with_pool(1 << 40);
        let app = budgetscope::web::app(state);
        for path in [
            format!("/traces/{id}"),
            format!("/api/traces/{id}"),
            format!("/jaeger/api/traces/{id}"),
            format!("/api/traces/{id}/otlp"),
        ] {
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            let request = axum::http::Request::get(&path)
                .header("host", "localhost")
                .body(axum::body::Body::empty())
                .expect("a request");
            let response = app.clone().oneshot(request).await.expect("answers");
            assert_eq!(response.status(), 200, "{path}");
            let mut body = response.into_body();
            while let Some(frame) = body.frame().await {
                drop(frame.expect("a body frame"));
            }
            let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
            println!(
                "| {} | {} | {} | {:.2} | {:.1} MiB |",
                path.replace(&id.to_string(), "{id}"),
                size.spans,
                size.bytes,
                peak as f64 / size.bytes as f64,
                peak as f64 / (1 << 20) as f64
            );
        }
    }
}

fn main() {
    requests();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(pass());
    runtime.block_on(reads());
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

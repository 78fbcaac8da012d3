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
        let (spans, bytes) = store
            .traces_within(&ids[..traces], u64::MAX)
            .await
            .expect("reads");
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

fn main() {
    requests();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(pass());
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

//! The advisor at scale: 10,000 call edges (1,000 caller hops calling 10 callees each) with
//! a day of statistics on SQLite, and `GET /api/advisor?since=-24h` answered over them
//! (the target: within 1 s). Run with `cargo bench --bench advisor`; not part of the
//! product binary.
//!
//! Each caller hop makes one request an hour with one call to each callee; every 50th edge
//! drops the budget on all its calls, so a fiftieth of the edges carry a finding (with its
//! example-trace search) and the rest are healthy.

use std::collections::BTreeMap;
use std::time::Instant;

use budgetscope::core::analyze::edges::{EdgeRollup, EdgeSample};
use budgetscope::core::analyze::hops::{COUNTED, HopSample};
use budgetscope::core::analyze::summary::TraceSummary;
use budgetscope::core::analyze::{AnalyzeOptions, Outcome};
use budgetscope::core::model::TraceId;
use budgetscope::web::AppState;

const SERVICES: usize = 10;
const OPERATIONS: usize = 100;
const CALLEES: usize = 10;
const HOURS: u64 = 24;
const HOUR: u64 = 3_600_000_000_000;

fn hop(s: usize, o: usize) -> (String, String) {
    (format!("svc-{s:02}"), format!("GET /op-{o:03}"))
}

/// Caller hop (s, o)'s request in the hour starting at `hour`, with its calls.
fn sample(s: usize, o: usize, hour: u64) -> HopSample {
    let (service, operation) = hop(s, o);
    let calls = (0..CALLEES)
        .map(|c| {
            let (callee_service, callee_operation) =
                hop((s + 1 + c) % SERVICES, (o + c) % OPERATIONS);
            let mut stats = EdgeRollup {
                requests: 1,
                calls: 1,
                ..Default::default()
            };
            let left = 400.0 + ((s * 31 + o * 7 + c) % 300) as f64;
            stats.left.record(left, 1);
            if (s * OPERATIONS * CALLEES + o * CALLEES + c).is_multiple_of(50) {
                stats.counts[2] = 1; // dropped
            }
            stats.forwarded.record(left - 10.0, 1);
            stats.shortfall.record(0.5, 1);
            stats.latency.record(20.0 + c as f64, 1);
            EdgeSample {
                callee_service,
                callee_operation,
                stats,
            }
        })
        .collect();
    HopSample {
        service,
        operation,
        start_unix_nano: hour + 1_000_000,
        budget_ms: Some(500.0 + (o % 50) as f64),
        burn: Some(0.1),
        self_ms: 5.0,
        counts: [0; COUNTED.len()],
        wasted_ms: 0.0,
        flags: Default::default(),
        spent: None,
        critical: Default::default(),
        calls,
        advice: Default::default(),
    }
}

async fn run() {
    let dir = tempfile::tempdir().expect("temp dir");
    // BUDGETSCOPE_BENCH_DB keeps the database for a look afterwards.
    let file = std::env::var("BUDGETSCOPE_BENCH_DB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.path().join("bench.db"));
    let url = format!("sqlite://{}", file.display());
    // A kept database is read again as it is (for profiling the reads).
    let written = file.exists();
    let store = budgetscope::store::open(&url).await.expect("store opens");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    let started = Instant::now();
    let mut id = 0u128;
    for h in (0..HOURS).filter(|_| !written) {
        let hour = now - now % HOUR - h * HOUR;
        for s in 0..SERVICES {
            for o in 0..OPERATIONS {
                id += 1;
                let (service, operation) = hop(s, o);
                let summary = TraceSummary {
                    trace_id: TraceId(id.to_be_bytes()),
                    root_service: service.clone(),
                    root_name: operation.clone(),
                    start_unix_nano: hour,
                    duration_ms: 10.0,
                    budget_ms: Some(500.0),
                    answer_ms: Some(10.0),
                    outcome: Outcome::Ok,
                    origins: Vec::new(),
                    burner: None,
                    flag_counts: BTreeMap::new(),
                    span_count: 1 + CALLEES,
                    services: vec![service.clone()],
                    operations: vec![(service, operation)],
                    version: AnalyzeOptions::default().version(),
                };
                store
                    .write_summaries(&[(summary, vec![sample(s, o, hour)])], &[])
                    .await
                    .expect("statistics stored");
            }
        }
    }
    println!(
        "stored {} edges × {HOURS} hours of statistics in {:.1} s",
        SERVICES * OPERATIONS * CALLEES,
        started.elapsed().as_secs_f64()
    );
    // A day of history lies in the database file, not in a WAL written a minute ago: the
    // store closes, its shutdown empties the WAL (waited for), and it opens again.
    drop(store);
    let wal = format!("{}-wal", file.display());
    for _ in 0..300 {
        if std::fs::metadata(&wal).map_or(true, |m| m.len() == 0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let store = budgetscope::store::open(&url).await.expect("store reopens");
    let state = AppState::new(store, AnalyzeOptions::default());
    let params = BTreeMap::from([("since".to_string(), "-24h".to_string())]);
    let mut times = Vec::new();
    let mut findings = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let answer = budgetscope::web::advisor::answer(&state, &params)
            .await
            .expect("advice");
        times.push(started.elapsed().as_secs_f64() * 1e3);
        findings = answer["findings"].as_array().map_or(0, Vec::len);
    }
    // Where the time goes: reading the rollups, and the findings from them.
    let until = budgetscope::clock::now_unix_nano();
    let since = until - HOURS * HOUR;
    let started = Instant::now();
    let edges = state
        .store
        .edge_rollups(&budgetscope::store::query::RollupQuery {
            since_unix_nano: since,
            until_unix_nano: until,
            hourly: true,
            ..Default::default()
        })
        .await
        .expect("edges")
        .len();
    println!(
        "edge_rollups alone: {edges} rows in {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let started = Instant::now();
    let rows = budgetscope::web::map::rows(state.store.as_ref(), since, until, None)
        .await
        .expect("rows");
    let read_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let found = budgetscope::web::advisor::of_rows(&rows, 50.0).len();
    println!(
        "of which reading {} hop and {} edge rows {read_ms:.0} ms, the {found} findings from them {:.0} ms",
        rows.hops.len(),
        rows.edges.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "GET /api/advisor?since=-24h over {} edges: {findings} findings, median {:.0} ms ({} ms)",
        SERVICES * OPERATIONS * CALLEES,
        sorted[sorted.len() / 2],
        times
            .iter()
            .map(|t| format!("{t:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn main() {
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(run());
}

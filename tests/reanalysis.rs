//! Stored analysis follows the rules: summaries carry the rules version and τ that produced
//! them, and a server with other rules re-analyses stored traces in the background, newest
//! first, replacing summaries, index terms and rollup contributions as a late span does
//! (src/pipeline/reanalysis.rs). A change of `--tolerance-ms` stands in for a change of the
//! rules: both change the version a summary is compared with.

mod common;

use std::time::Duration;

use budgetscope::core::analyze::hops::Rollup;
use budgetscope::core::analyze::{AnalyzeOptions, Flag};
use budgetscope::pipeline::analyzer::{AnalyzerOptions, analysis_pass};
use budgetscope::pipeline::held::HeldTraces;
use budgetscope::pipeline::memory::{DEFAULT_LIMIT, MemoryBudget};
use budgetscope::pipeline::reanalysis::{Reanalysis, reanalysis_pass};
use budgetscope::store::Store;
use budgetscope::store::query::RollupQuery;
use budgetscope::store::query::TraceQuery;
use common::{TestDb, a_minute_ago, fixture_trace};

/// Overspent by 30 ms: flagged under τ = 10 ms, within τ = 50 ms.
const OVERSPENT_BY_30: &str = r#"edge server "GET /late" 0 1030 budget=1000"#;

fn analyzer(tolerance_ms: f64) -> AnalyzerOptions {
    AnalyzerOptions {
        quiet_period: Duration::ZERO,
        max_trace_wait: Duration::from_secs(300),
        analyze: AnalyzeOptions { tolerance_ms },
        metrics: Default::default(),
        memory: MemoryBudget::for_limit(DEFAULT_LIMIT),
        held: HeldTraces::new(&MemoryBudget::for_limit(DEFAULT_LIMIT)),
    }
}

/// Trace `id` of `OVERSPENT_BY_30`, starting `id` ms after a minute ago.
fn late_trace(id: u16) -> Vec<budgetscope::core::model::Span> {
    let mut spans = fixture_trace(0, OVERSPENT_BY_30);
    a_minute_ago(&mut spans);
    for span in &mut spans {
        span.trace_id.0[..2].copy_from_slice(&id.to_be_bytes());
        span.start_unix_nano += u64::from(id) * 1_000_000;
        span.end_unix_nano += u64::from(id) * 1_000_000;
    }
    spans
}

/// Traces 1..=n.
async fn write_traces(store: &dyn Store, n: u16) {
    let spans: Vec<_> = (1..=n).flat_map(late_trace).collect();
    store.write_spans(&spans).await.unwrap();
}

/// The edge hop's rollup over the last ten minutes.
async fn edge_rollup(store: &dyn Store) -> Rollup {
    let now = common::now_nanos();
    let rows = store
        .hop_rollups(&RollupQuery {
            since_unix_nano: now - 600_000_000_000,
            until_unix_nano: now + 60_000_000_000,
            service: Some("edge"),
            operation: Some("GET /late"),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut merged = Rollup::default();
    for row in &rows {
        merged.merge(&row.rollup);
    }
    merged
}

async fn overspent_in_search(store: &dyn Store) -> usize {
    store
        .search_traces(&TraceQuery {
            flag: Some(Flag::Overspent),
            limit: 100,
            ..TraceQuery::default()
        })
        .await
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_analysed_with_other_rules_are_re_analysed_as_a_late_span_would() {
    // More traces than one re-analysis pass takes (500).
    const TRACES: u16 = 700;
    for db in TestDb::all().await {
        let store = budgetscope::store::open(&db.url).await.unwrap();
        write_traces(store.as_ref(), TRACES).await;
        let old = analyzer(10.0);
        while analysis_pass(store.as_ref(), &old).await.unwrap().more {}
        assert_eq!(
            overspent_in_search(store.as_ref()).await,
            100,
            "{}",
            db.backend
        );
        let before = edge_rollup(store.as_ref()).await;
        let traces = i64::from(TRACES);
        assert_eq!(
            (before.requests, before.count("overspent")),
            (traces, traces)
        );

        // A late span brings trace 1 back to the analyzer, which now runs the current
        // rules: its summary is current before the re-analysis reaches it.
        let current = analyzer(50.0);
        let mut late = late_trace(1);
        late[0].span_id = budgetscope::core::model::SpanId([9; 8]);
        late[0].parent_span_id = Some(late_trace(1)[0].span_id);
        late[0].kind = budgetscope::core::model::SpanKind::Internal;
        late[0].budget = None;
        store.write_spans(&late).await.unwrap();
        while analysis_pass(store.as_ref(), &current).await.unwrap().more {}
        let version = current.analyze.version();
        let stale = u64::from(TRACES) - 1;
        assert_eq!(store.stale_summary_count(version).await.unwrap(), stale);

        // A restart part-way: the first server's re-analysis stops after one pass, the
        // second's finds what is still stale and finishes.
        let first = Reanalysis::new(version);
        let pass = reanalysis_pass(store.as_ref(), &current, &first)
            .await
            .unwrap();
        assert!(pass.analysed > 0 && pass.more, "{}: {pass:?}", db.backend);
        let progress = first.progress().unwrap();
        assert_eq!((progress.stale_at_start, progress.done), (stale, 500));
        assert!(!progress.finished);
        // Newest first: the oldest trace still counts as first analysed.
        let oldest = late_trace(2)[0].trace_id;
        let newest = late_trace(TRACES)[0].trace_id;
        let still_stale = store
            .stale_summaries(&budgetscope::store::query::StaleQuery {
                version,
                after: None,
                limit: 1000,
            })
            .await
            .unwrap();
        assert!(still_stale.iter().any(|p| p.trace_id == oldest));
        assert!(!still_stale.iter().any(|p| p.trace_id == newest));
        let second = Reanalysis::new(version);
        while reanalysis_pass(store.as_ref(), &current, &second)
            .await
            .unwrap()
            .more
        {}
        let progress = second.progress().unwrap();
        assert!(progress.finished, "{}: {progress:?}", db.backend);
        assert_eq!(
            (progress.stale_at_start, progress.done),
            (stale - 500, stale - 500)
        );

        assert_eq!(store.stale_summary_count(version).await.unwrap(), 0);
        assert_eq!(
            overspent_in_search(store.as_ref()).await,
            0,
            "{}",
            db.backend
        );
        let after = edge_rollup(store.as_ref()).await;
        assert_eq!(
            (after.requests, after.count("overspent")),
            (traces, 0),
            "{}: every trace counted once, under the current rules",
            db.backend
        );
        // Nothing stale: a new re-analysis has nothing to do and reports nothing.
        let third = Reanalysis::new(version);
        assert!(
            !reanalysis_pass(store.as_ref(), &current, &third)
                .await
                .unwrap()
                .more
        );
        assert!(third.progress().is_none() && third.finished());
    }
}

/// End to end: a server started with other rules brings every stored statistic in line
/// with the trace page without anyone sending a span, and says how far it has got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_new_rules_re_analyses_what_an_older_one_stored() {
    let db = TestDb::sqlite();
    let server = common::start(&db, &["--quiet-period", "0s", "--tolerance-ms", "10"]).await;
    write_traces(server.store.as_ref(), 3).await;
    let id = late_trace(3)[0].trace_id.to_hex();
    common::wait_until_searchable(&server, "flag=overspent", &id).await;
    server.shutdown().await;

    let server = common::start(&db, &["--quiet-period", "0s"]).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, status) = common::get_json(&server, "/api/status").await;
        let progress = &status["reanalysis"];
        if progress["finished"] == true {
            assert_eq!(progress["stale_at_start"], 3, "{status}");
            assert_eq!(progress["done"], 3, "{status}");
            assert_eq!(progress["tolerance_ms"], 50.0, "{status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the re-analysis never finished: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, found) = common::get_json(&server, "/api/traces?flag=overspent").await;
    assert_eq!(found["traces"].as_array().unwrap().len(), 0, "{found}");
    let (_, found) = common::get_json(&server, "/api/traces?service=edge").await;
    assert_eq!(found["traces"].as_array().unwrap().len(), 3, "{found}");
    server.shutdown().await;
}

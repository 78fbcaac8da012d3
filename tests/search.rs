//! Trace summaries and search, end to end on both stores: spans through the real
//! receiver, summaries by the background analyzer, `GET /api/traces` with every filter.

mod common;

use std::time::{Duration, Instant};

use budgetscope::core::model::TraceId;
use common::{TestDb, fixture_trace as trace, get_json, otlp_request, post_otlp, start};
use serde_json::Value;

fn hex(id: u8) -> String {
    TraceId([id; 16]).to_hex()
}

/// Polls a search until it returns `expected` traces (the analyzer runs in the background).
async fn search_until(
    server: &budgetscope::server::RunningServer,
    query: &str,
    expected: usize,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get_json(server, &format!("/api/traces?{query}")).await;
        assert_eq!(status, 200, "{query}: {body}");
        if body["traces"].as_array().unwrap().len() == expected || Instant::now() > deadline {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ids(body: &Value) -> Vec<String> {
    body["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["trace_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_are_searchable_by_every_filter() {
    for db in TestDb::all().await {
        let server = start(&db, &["--quiet-period", "100ms"]).await;
        let ok = trace(
            1,
            r#"
edge server "GET /checkout" 0 300 budget=800 method=GET http-status=200
  edge client "inventory" 10 200 budget=790
    inventory server "GET /stock" 12 190 budget=788
"#,
        );
        let inflated = trace(
            2,
            r#"
edge server "POST /orders" 0 1540 budget=800 method=POST http-status=504
  edge client "billing" 20 1500 budget=5000
    billing server "Charge" 25 1490 budget=5000
"#,
        );
        let no_budget = trace(3, r#"batch server "nightly" 0 50 http-status=500"#);
        // Started about 120 s, 7.5 s and 1.3 s ago: a minute from the `since`/`until`
        // boundary below either way, however slowly the machine runs the test (at 10 s and
        // an 8 s boundary it failed when the search came 0.5 s late).
        post_otlp(&server, &otlp_request(&no_budget, 120_000)).await;
        post_otlp(&server, &otlp_request(&inflated, 6_000)).await;
        post_otlp(&server, &otlp_request(&ok, 1000)).await;

        let all = search_until(&server, "", 3).await;
        assert_eq!(
            ids(&all),
            [hex(1), hex(2), hex(3)],
            "{}: newest first",
            db.backend
        );
        let first = &all["traces"][1];
        assert_eq!(first["root_service"], "edge");
        assert_eq!(first["root_name"], "POST /orders");
        assert_eq!(first["outcome"], "exceeded");
        assert_eq!(first["budget_ms"], 800.0);
        assert_eq!(first["burner"]["service"], "billing");
        assert_eq!(first["flag_counts"]["inflated"], 1);
        assert_eq!(first["span_count"], 3);
        assert_eq!(first["answer_ms"], 1540.0);
        assert_eq!(
            first["origins"],
            serde_json::json!([{"service": "edge", "name": "POST /orders"}]),
            "{}: where it ran out",
            db.backend
        );
        assert_eq!(all["traces"][0]["origins"], serde_json::json!([]));
        assert_eq!(all["traces"][2]["answer_ms"], Value::Null, "no edge hop");
        assert_eq!(first["services"], serde_json::json!(["billing", "edge"]));
        assert_eq!(all["next_cursor"], Value::Null);

        for (query, expected) in [
            ("service=inventory", vec![hex(1)]),
            ("service=edge&operation=POST%20%2Forders", vec![hex(2)]),
            ("operation=Charge", vec![hex(2)]),
            ("service=edge&operation=Charge", vec![]),
            // A flag drives the search; the service and the operation are looked up.
            ("flag=inflated&service=billing", vec![hex(2)]),
            ("flag=inflated&service=inventory", vec![]),
            ("flag=inflated&operation=Charge", vec![hex(2)]),
            ("flag=inflated&operation=GET%20%2Fstock", vec![]),
            ("flag=inflated", vec![hex(2)]),
            (
                "origin_service=edge&origin_operation=POST%20%2Forders",
                vec![hex(2)],
            ),
            ("origin_service=billing&origin_operation=Charge", vec![]),
            (
                "flag=inflated&origin_service=edge&origin_operation=POST%20%2Forders",
                vec![hex(2)],
            ),
            // "ok" has no index term: the summaries are read in time order.
            ("outcome=ok", vec![hex(1)]),
            ("outcome=ok&service=inventory", vec![hex(1)]),
            ("outcome=ok&service=billing", vec![]),
            ("outcome=exceeded", vec![hex(2)]),
            ("outcome=no_budget", vec![hex(3)]),
            ("min_duration_ms=1000", vec![hex(2)]),
            ("max_duration_ms=100", vec![hex(3)]),
            ("min_budget_ms=100&max_budget_ms=900", vec![hex(1), hex(2)]),
            ("attr=http.response.status_code>=500", vec![hex(2), hex(3)]),
            ("attr=http.request.method=POST", vec![hex(2)]),
            ("attr=http.request.method!=POST", vec![hex(1)]),
            (
                "attr=http.response.status_code>=500&attr=http.request.method=POST",
                vec![hex(2)],
            ),
            ("since=-60s", vec![hex(1), hex(2)]),
            ("until=-60s", vec![hex(3)]),
        ] {
            let (status, body) = get_json(&server, &format!("/api/traces?{query}")).await;
            assert_eq!(status, 200, "{query}: {body}");
            assert_eq!(ids(&body), expected, "{} {query}", db.backend);
        }

        // Pages of one, following next_cursor.
        let mut seen = Vec::new();
        let mut query = "limit=1".to_string();
        loop {
            let (_, page) = get_json(&server, &format!("/api/traces?{query}")).await;
            seen.extend(ids(&page));
            match page["next_cursor"].as_str() {
                Some(cursor) => query = format!("limit=1&cursor={cursor}"),
                None => break,
            }
        }
        assert_eq!(seen, [hex(1), hex(2), hex(3)], "{}", db.backend);

        let (status, body) = get_json(&server, "/api/traces?flag=slow").await;
        assert_eq!(status, 400);
        assert_eq!(body["error"]["code"], "invalid_parameter");
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_span_re_analyses_its_trace() {
    for db in TestDb::all().await {
        let server = start(&db, &["--quiet-period", "100ms"]).await;
        let spans = trace(
            9,
            r#"
edge server "GET /" 0 300 budget=800
  edge client "billing" 10 200 budget=5000
"#,
        );
        let request = otlp_request(&spans, 1000);
        // The root and its call first…
        post_otlp(&server, &request).await;
        let before = search_until(&server, "", 1).await;
        assert_eq!(before["traces"][0]["span_count"], 2, "{}", db.backend);
        // …then, later, the callee's span.
        let mut late = trace(
            9,
            r#"
edge server "GET /" 0 300 budget=800
  edge client "billing" 10 200 budget=5000
    billing server "Charge" 12 190 budget=5000
"#,
        );
        let late_span = late.remove(2);
        let mut late_request = otlp_request(
            &spans.iter().cloned().chain([late_span]).collect::<Vec<_>>(),
            1000,
        );
        for resource in &mut late_request.resource_spans {
            for scope in &mut resource.scope_spans {
                scope.spans.retain(|s| s.name == "Charge");
            }
        }
        post_otlp(&server, &late_request).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, after) = get_json(&server, "/api/traces").await;
            if after["traces"][0]["span_count"] == 3 {
                assert_eq!(
                    after["traces"][0]["services"],
                    serde_json::json!(["billing", "edge"])
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: not re-analysed: {after}",
                db.backend
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server.shutdown().await;
    }
}

/// `budgetscope_traces_analysed_from_memory_total` of a running server.
async fn analysed_from_memory(server: &budgetscope::server::RunningServer) -> u64 {
    let text = common::get_text(server, "/metrics").await;
    text.lines()
        .find_map(|line| line.strip_prefix("budgetscope_traces_analysed_from_memory_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no from-memory counter in /metrics:\n{text}")) as u64
}

/// A trace whose spans all went through this process is analysed from memory; one whose
/// first spans were committed before a restart is read from the store, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_held_in_memory_are_used_only_when_they_are_all_of_the_trace() {
    let chain = r#"
edge server "GET /" 0 300 budget=800
  edge client "billing" 10 200 budget=5000
    billing server "Charge" 12 190 budget=5000
"#;
    for db in TestDb::all().await {
        let server = start(&db, &["--quiet-period", "100ms"]).await;
        post_otlp(&server, &otlp_request(&trace(11, chain), 1000)).await;
        let found = search_until(&server, "", 1).await;
        assert_eq!(found["traces"][0]["span_count"], 3, "{}", db.backend);
        assert_eq!(analysed_from_memory(&server).await, 1, "{}", db.backend);
        server.shutdown().await;

        // Two spans committed by an instance that stopped before analysing them…
        let mut spans = trace(12, chain);
        let late = spans.pop().unwrap();
        let first = start(&db, &["--quiet-period", "1h"]).await;
        post_otlp(&first, &otlp_request(&spans, 1000)).await;
        first.shutdown().await;
        // …and the third through the next one, which holds only that.
        let next = start(&db, &["--quiet-period", "100ms"]).await;
        post_otlp(&next, &otlp_request(&[late], 1000)).await;
        // Trace 11's summary is there from the first server.
        let found = search_until(&next, "", 2).await;
        let summary = found["traces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["trace_id"] == hex(12))
            .unwrap_or_else(|| panic!("{}: not analysed: {found}", db.backend));
        assert_eq!(summary["span_count"], 3, "{}: {summary}", db.backend);
        assert_eq!(summary["services"], serde_json::json!(["billing", "edge"]));
        assert_eq!(analysed_from_memory(&next).await, 0, "{}", db.backend);
        next.shutdown().await;
    }
}

/// While ingest is saturated the analyzer rests between passes, but it never stops: every
/// quiet trace is still summarised, across more than one pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_analyzer_yields_to_a_saturated_ingest_but_finishes_its_work() {
    use budgetscope::pipeline::analyzer::analyze_quiet_traces;
    use tokio_util::sync::CancellationToken;

    for db in TestDb::all().await {
        let store = budgetscope::store::open(&db.url).await.unwrap();
        let traces = |ids: std::ops::RangeInclusive<u32>| {
            let mut spans = Vec::new();
            for id in ids {
                let mut trace = trace(0, r#"edge server "GET /busy" 0 10 budget=100"#);
                for span in &mut trace {
                    span.trace_id = TraceId::from_bytes(&u128::from(id).to_be_bytes()).unwrap();
                }
                spans.extend(trace);
            }
            spans
        };
        // 1,050 traces: more than one pass of the analyzer (1,000 traces per pass).
        store.write_spans(&traces(1..=1_050)).await.unwrap();
        let options = common::analyzer_options();
        let always_saturated = || true;
        let stop = CancellationToken::new();
        let turn = Duration::MAX;
        let done = analyze_quiet_traces(store.as_ref(), &options, &always_saturated, &stop, turn)
            .await
            .unwrap();
        assert_eq!(
            done.analysed, 1_050,
            "{}: every trace summarised",
            db.backend
        );
        assert!(!done.more, "{}", db.backend);
        let again = analyze_quiet_traces(store.as_ref(), &options, &always_saturated, &stop, turn)
            .await
            .unwrap();
        assert_eq!(
            again.analysed, 0,
            "{}: nothing left to summarise",
            db.backend
        );
        // A turn ends after its time with quiet traces left, which the next turn takes.
        store.write_spans(&traces(1_051..=3_150)).await.unwrap();
        let idle = || false;
        let first = analyze_quiet_traces(store.as_ref(), &options, &idle, &stop, Duration::ZERO)
            .await
            .unwrap();
        assert!(
            first.more && first.analysed == 1_000,
            "{}: {first:?}",
            db.backend
        );
        let rest = analyze_quiet_traces(store.as_ref(), &options, &idle, &stop, turn)
            .await
            .unwrap();
        assert_eq!((rest.analysed, rest.more), (1_100, false), "{}", db.backend);
    }
}

/// When ingest always had a commit waiting, partly behind the analyzer's writes, the
/// analyzer pauses for one window and asks again: it rests if ingest then proves saturated
/// (a burst), and goes on if not (a steady load the two share).
#[tokio::test]
async fn a_full_writer_makes_the_analyzer_pause_and_rest_only_if_ingest_is_saturated() {
    use std::sync::Mutex;

    use budgetscope::pipeline::analyzer::{WriterLoad, analyze_quiet_traces};
    use budgetscope::pipeline::ingest::Load;
    use tokio_util::sync::CancellationToken;

    /// Answers `Full` first and its load to every later question; counts the questions.
    struct FullThen(Load, Mutex<u32>);
    impl WriterLoad for FullThen {
        fn load(&self) -> Load {
            let mut asked = self.1.lock().unwrap();
            *asked += 1;
            if *asked == 1 { Load::Full } else { self.0 }
        }
    }

    let db = TestDb::sqlite();
    let store = budgetscope::store::open(&db.url).await.unwrap();
    // 1,500 one-span traces from `first`: two passes.
    let traces = |first: u32| -> Vec<_> {
        (first..first + 1_500)
            .flat_map(|id| {
                let mut trace = trace(0, r#"edge server "GET /" 0 10 budget=100"#);
                for span in &mut trace {
                    span.trace_id = TraceId::from_bytes(&u128::from(id).to_be_bytes()).unwrap();
                }
                trace
            })
            .collect()
    };
    store.write_spans(&traces(1)).await.unwrap();
    let options = common::analyzer_options();
    let stop = CancellationToken::new();
    let shared = FullThen(Load::Light, Mutex::new(0));
    let turn = analyze_quiet_traces(store.as_ref(), &options, &shared, &stop, Duration::MAX)
        .await
        .unwrap();
    assert_eq!((turn.analysed, turn.rested), (1_500, false), "{turn:?}");
    assert_eq!(*shared.1.lock().unwrap(), 2, "asked again after the pause");

    store.write_spans(&traces(10_001)).await.unwrap();
    let burst = FullThen(Load::Saturated, Mutex::new(0));
    let turn = analyze_quiet_traces(store.as_ref(), &options, &burst, &stop, Duration::ZERO)
        .await
        .unwrap();
    assert!(turn.rested && turn.analysed == 1_000, "{turn:?}");
}

/// With the memory budget held by ingest, the analyzer still works, in passes as small as
/// its minimum share: traces larger than that are summarised a few at a time, all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_analyzer_works_in_smaller_passes_when_memory_is_short() {
    use budgetscope::core::analyze::AnalyzeOptions;
    use budgetscope::pipeline::analyzer::{AnalyzerOptions, analysis_pass};
    use budgetscope::pipeline::memory::{MIN_PASS, MemoryBudget, PASS_BYTES_PER_ROW_BYTE};

    for db in TestDb::all().await {
        let store = budgetscope::store::open(&db.url).await.unwrap();
        // 20 one-span traces of ~200 KB each: 4 MB of rows, where a pass of MIN_PASS
        // reads about 0.8 MB.
        let mut spans = common::bulk_spans(1, 1 << 120, &"x".repeat(200_000));
        spans.truncate(20);
        store.write_spans(&spans).await.unwrap();
        let memory = MemoryBudget::with_pool(64 << 20);
        let mut ingest = memory.empty();
        assert!(ingest.try_grow_to(64 << 20), "ingest holds the whole pool");
        let options = AnalyzerOptions {
            quiet_period: Duration::ZERO,
            max_trace_wait: Duration::from_secs(300),
            analyze: AnalyzeOptions::default(),
            metrics: Default::default(),
            memory: memory.clone(),
            held: budgetscope::pipeline::held::HeldTraces::new(&memory),
        };
        let mut passes = Vec::new();
        loop {
            let pass = analysis_pass(store.as_ref(), &options).await.unwrap();
            assert_eq!(memory.used(), 64 << 20, "a pass gives its memory back");
            passes.push(pass.analysed);
            if !pass.more {
                break;
            }
            assert!(passes.len() < 40, "{}: no progress: {passes:?}", db.backend);
        }
        assert_eq!(
            passes.iter().sum::<usize>(),
            20,
            "{}: every trace summarised once: {passes:?}",
            db.backend
        );
        assert!(
            passes[0] > 0
                && passes[0] <= (MIN_PASS / PASS_BYTES_PER_ROW_BYTE / 200_000 + 1) as usize,
            "{}: the first pass fits its share: {passes:?}",
            db.backend
        );
    }
}

/// `GET /api/status` says how far analysis is behind: traces wait while they are not
/// quiet, then the analyzer catches up and the numbers say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_says_what_waits_for_analysis_and_when_it_has_caught_up() {
    for db in TestDb::all().await {
        let server = start(&db, &["--quiet-period", "3s"]).await;
        // The first count of stored spans, before any commit could run beside it.
        wait_for_status(&server, |s| s["spans_stored"] == 0).await;
        for id in 1..=3 {
            let spans = trace(
                id,
                r#"
edge server "GET /" 0 300 budget=800
  edge client "billing" 10 200 budget=5000
"#,
            );
            post_otlp(&server, &otlp_request(&spans, 1000)).await;
        }
        let status = |server| async move {
            let (code, status) = get_json(server, "/api/status").await;
            assert_eq!(code, 200);
            status
        };
        let waiting = wait_for_status(&server, |s| s["traces_pending"] == 3).await;
        assert_eq!(waiting["store"], db.backend);
        assert_eq!(waiting["spans_stored"], 6, "{waiting}");
        assert_eq!(waiting["quiet_period_s"], 3.0);
        assert!(waiting["oldest_pending_age_s"].as_f64().unwrap() < 3.0);
        assert_eq!(
            waiting["analysis_lag_s"], 0.0,
            "still within the quiet period"
        );
        assert_eq!(waiting["behind"], false);
        assert_eq!(waiting["ingest_queue_spans"], 0);
        // What the store takes on disk; SQLite also says which pages hold data.
        let disk = &waiting["disk"];
        assert!(disk["bytes"].as_u64().unwrap() > 0, "{disk}");
        assert_eq!(
            disk["in_use_bytes"].is_u64(),
            db.backend == "sqlite",
            "{disk}"
        );
        assert_eq!(disk["max_bytes"], serde_json::Value::Null);
        let metrics = common::get_text(&server, "/metrics").await;
        assert!(metrics.contains("\nbudgetscope_store_bytes "), "{metrics}");
        // The analyzer counts a pass once its summaries are written, so a measurement can
        // see the backlog gone a tick before the rate that cleared it.
        let done = wait_for_status(&server, |s| {
            s["traces_pending"] == 0 && s["analyzed_traces_per_s"].as_f64().unwrap() > 0.0
        })
        .await;
        assert_eq!(done["oldest_pending_age_s"], 0.0, "{done}");
        assert_eq!(status(&server).await["spans_stored"], 6);
        server.shutdown().await;
    }
}

/// The status once `done` holds (it is measured every 2 s), failing after 30 s.
async fn wait_for_status(
    server: &budgetscope::server::RunningServer,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, status) = get_json(server, "/api/status").await;
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "status never got there: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A trace that keeps receiving spans (a stream, a batch job, a client reusing a trace id)
/// is analysed once it has waited `--max-trace-wait`, counted apart from lag in
/// `/api/status` while it lasts, and analysed again when it goes quiet; its hop is counted
/// once however often the trace was analysed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_that_never_goes_quiet_is_analysed_within_the_max_wait_and_again_when_quiet() {
    use budgetscope::core::model::SpanKind;
    for db in TestDb::all().await {
        let backend = db.backend;
        let server = start(&db, &["--quiet-period", "1s", "--max-trace-wait", "2s"]).await;
        let root = common::span(21, 1, None, "stream", "GET /events", 1_000);
        post_otlp(&server, &otlp_request(&[root], 0)).await;
        let mut sent = 1u8;
        let mut found_while_active: Option<u64> = None;
        let mut active_seen = false;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(8) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            sent += 1;
            let mut child = common::span(21, sent, Some(1), "stream", "send", 1_000);
            child.kind = SpanKind::Internal;
            post_otlp(&server, &otlp_request(&[child], 0)).await;
            let (_, found) = get_json(&server, "/api/traces?service=stream").await;
            if let Some(trace) = found["traces"].as_array().unwrap().first() {
                found_while_active.get_or_insert(trace["span_count"].as_u64().unwrap());
            }
            let (_, status) = get_json(&server, "/api/status").await;
            active_seen |= status["active_traces"] == 1;
            assert_eq!(
                status["analysis_lag_s"], 0.0,
                "{backend}: an active trace is not lag: {status}"
            );
        }
        let partial = found_while_active
            .unwrap_or_else(|| panic!("{backend}: never searchable while receiving spans"));
        assert!(
            (2..u64::from(sent)).contains(&partial),
            "{backend}: analysed while active with {partial} of {sent} spans"
        );
        assert!(
            active_seen,
            "{backend}: /api/status never counted it active"
        );

        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, found) = get_json(&server, "/api/traces?service=stream").await;
            if found["traces"][0]["span_count"] == u64::from(sent) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{backend}: not analysed when quiet: {found}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (_, hops) = get_json(&server, "/api/hops?service=stream").await;
        let hop = hops["hops"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["operation"] == "GET /events")
            .unwrap_or_else(|| panic!("{backend}: no hop: {hops}"));
        assert_eq!(hop["requests"], 1, "{backend}: counted once: {hop}");
        // Measured every 2 s: the next measurement finds nothing active.
        loop {
            let (_, status) = get_json(&server, "/api/status").await;
            if status["active_traces"] == 0 && status["traces_pending"] == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{backend}: still waiting: {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server.shutdown().await;
    }
}

/// With `--retention-healthy` shorter than `--retention`, search and the overview say that
/// healthy traces older than that are gone, for a range that reaches back so far only.
#[tokio::test]
async fn pages_say_when_healthy_traces_are_gone_from_the_range() {
    let db = TestDb::sqlite();
    let store = budgetscope::store::open(&db.url).await.unwrap();
    let mut state = budgetscope::web::AppState::new(store, Default::default());
    let said = "Healthy traces (no flag, not exceeded) are kept 1day";
    for (path, shown) in [
        ("/traces?since=-7d", true),
        ("/traces?since=-1h", false),
        ("/traces?service=x", true),
        ("/?range=7d", true),
        ("/?range=1h", false),
    ] {
        let (_, _, page) = common::oneshot(&state, path).await;
        assert!(!page.contains(said), "{path}: kept as long as the rest");
        state.retention_healthy = Some(Duration::from_secs(86_400));
        let (_, _, page) = common::oneshot(&state, path).await;
        assert_eq!(page.contains(said), shown, "{path}");
        state.retention_healthy = None;
    }
}

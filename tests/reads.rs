//! Reads of whole traces within the memory budget (`web::read`, `pipeline::memory`): a trace
//! more than one read may take is refused with what to do instead (413), on the API, the
//! page and the Jaeger API; the OTLP download streams any trace in pieces; while other work
//! holds the memory a read is told to retry (503, `Retry-After`); and every read gives its
//! memory back. On both stores.

mod common;

use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::core::model::{AttrValue, Span, SpanId, SpanKind, TraceId};
use budgetscope::otlp::decode::{Format, decode_traces};
use budgetscope::pipeline::memory::MemoryBudget;
use budgetscope::store;
use budgetscope::web::AppState;
use common::{TestDb, oneshot, span};

const MIB: u64 = 1 << 20;

/// One trace of `count` spans of about 1 kB each, all children of the root.
fn flat_trace(trace: u8, count: u16) -> Vec<Span> {
    let start = common::now_nanos() - 60_000_000_000;
    (0..count)
        .map(|i| {
            let mut s = span(trace, 0, (i > 0).then_some(1), "feed", "GET /items", start);
            s.span_id = SpanId(u64::from(i + 1).to_be_bytes());
            s.kind = if i == 0 {
                SpanKind::Server
            } else {
                SpanKind::Internal
            };
            s.attributes = vec![("item.body".into(), AttrValue::String("x".repeat(1_000)))];
            if i + 1 == 4321 {
                s.attributes.push((
                    "needle".into(),
                    AttrValue::String("Needle <script>alert(1)</script>".into()),
                ));
            }
            s
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_larger_than_one_read_may_take_is_refused_with_what_to_do_and_downloads_in_pieces()
{
    for db in TestDb::all().await {
        let backend = db.backend;
        let store = store::open(&db.url).await.unwrap();
        let large = flat_trace(1, 5_000);
        let small = flat_trace(2, 20);
        store.write_spans(&large).await.unwrap();
        store.write_spans(&small).await.unwrap();
        // Summarised, for the Jaeger API's search.
        common::analyse_waiting(store.as_ref()).await;
        let mut state = AppState::new(store, AnalyzeOptions::default());
        // The smallest limit: one read may take 32 MiB, a tenth of it in rows; the large
        // trace's rows are about 5 MB.
        state.memory = MemoryBudget::for_limit(256 * MIB);
        let (large_id, small_id) = (TraceId([1; 16]), TraceId([2; 16]));

        for path in [
            format!("/api/traces/{large_id}"),
            format!("/jaeger/api/traces/{large_id}"),
        ] {
            let (status, _, body) = oneshot(&state, &path).await;
            assert_eq!(status, 413, "{backend} {path}: {body}");
            for words in [
                "holds 5000 spans",
                "more than one read may use",
                &format!("GET /api/traces/{large_id}/otlp"),
                "--memory-limit",
            ] {
                assert!(body.contains(words), "{backend} {path}: {body}");
            }
        }
        // The page lists it a page at a time instead; the rows of an expanded span need
        // the whole trace.
        let (status, _, page) = oneshot(
            &state,
            &format!("/traces/{large_id}/rows?parent=0000000000000001"),
        )
        .await;
        assert_eq!(status, 413, "{backend}: {page}");
        assert!(
            page.contains("This trace is too large to show whole"),
            "{backend}"
        );
        large_trace_pages(&state, large_id, backend).await;

        // The download streams the whole trace, in pieces of 2,000 spans.
        let (status, headers, body) =
            oneshot(&state, &format!("/api/traces/{large_id}/otlp")).await;
        assert_eq!(status, 200, "{backend}");
        assert!(
            headers["content-disposition"]
                .to_str()
                .unwrap()
                .contains("attachment")
        );
        let request = decode_traces(body.into_bytes().into(), Format::Json)
            .unwrap_or_else(|e| panic!("{backend}: the download is not OTLP/JSON: {e:?}"));
        assert!(request.rejected.is_empty(), "{backend}");
        let mut ids: Vec<Vec<u8>> = request
            .request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| s.span_id.clone())
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 5_000, "{backend}: every span once");

        // A trace within the limit reads whole, and each read gives its memory back.
        for path in [
            format!("/api/traces/{small_id}"),
            format!("/traces/{small_id}"),
            format!("/jaeger/api/traces/{small_id}"),
            "/jaeger/api/traces?service=feed&lookback=1h&limit=1".to_string(),
        ] {
            let (status, _, body) = oneshot(&state, &path).await;
            assert_eq!(status, 200, "{backend} {path}: {body}");
        }
        assert_eq!(state.memory.used(), 0, "{backend}");

        // Jaeger's search reads its traces whole together: over the limit it says so.
        let (status, _, body) = oneshot(
            &state,
            "/jaeger/api/traces?service=feed&lookback=1h&limit=20",
        )
        .await;
        assert_eq!(status, 413, "{backend}: {body}");
        assert!(
            body.contains("the 2 traces found") && body.contains("Ask for fewer (limit)"),
            "{backend}: {body}"
        );

        // While exports hold the memory, a read is told to retry.
        let mut exports = state.memory.empty();
        assert!(exports.try_grow_to(state.memory.pool()));
        let (status, headers, body) = oneshot(&state, &format!("/api/traces/{small_id}")).await;
        assert_eq!(status, 503, "{backend}: {body}");
        assert_eq!(headers["retry-after"], "2", "{backend}");
        assert!(body.contains("Retry in a few seconds"), "{backend}: {body}");
        drop(exports);
        assert_eq!(state.memory.used(), 0, "{backend}");
    }
}

/// The href of the page's link with `rel`, unescaped.
fn link(page: &str, rel: &str) -> Option<String> {
    let at = page.find(&format!("rel=\"{rel}\""))?;
    let href = page[..at].rsplit("href=\"").next()?.split('"').next()?;
    Some(href.replace("&amp;", "&"))
}

/// The page of a trace too large to read whole: 500 spans at a time, previous and next, a
/// find over the whole trace, a selected span's page with its attributes, all escaped.
async fn large_trace_pages(state: &AppState, id: TraceId, backend: &str) {
    let first = oneshot(state, &format!("/traces/{id}")).await;
    assert_eq!(first.0, 200, "{backend}: {}", first.2);
    let page = first.2;
    for words in [
        "This trace holds 5000 spans",
        "--memory-limit",
        &format!("/api/traces/{id}/otlp"),
        "Spans 1–500 of 5000",
    ] {
        assert!(page.contains(words), "{backend}: {words} missing: {page}");
    }
    assert!(
        !page.contains("rel=\"prev\""),
        "{backend}: no previous page"
    );
    let next = link(&page, "next").expect("a next link");
    let (status, _, second) = oneshot(state, &next).await;
    assert_eq!(status, 200, "{backend}");
    assert!(
        second.contains("Spans 501–1000 of 5000"),
        "{backend}: {second}"
    );
    let prev = link(&second, "prev").expect("a previous link");
    let back = oneshot(state, &prev).await.2;
    assert!(back.contains("Spans 1–500 of 5000"), "{backend}: {back}");

    // Find searches every span in the database; the text is escaped.
    let (status, _, found) = oneshot(state, &format!("/traces/{id}?find=NEEDLE")).await;
    assert_eq!(status, 200, "{backend}");
    assert!(
        found.contains("1 of 5000 spans match"),
        "{backend}: {found}"
    );
    assert!(
        found.contains("Spans 1–1 of 1 matching"),
        "{backend}: {found}"
    );
    let span = SpanId(4321u64.to_be_bytes()).to_hex();
    assert!(found.contains(&span), "{backend}");

    // A selected span opens the page that starts with it, with its attributes.
    let (status, _, selected) = oneshot(state, &format!("/traces/{id}?span={span}")).await;
    assert_eq!(status, 200, "{backend}");
    assert!(
        selected.contains("Spans 4321–4820 of 5000"),
        "{backend}: {selected}"
    );
    assert!(selected.contains("aria-current=\"true\""), "{backend}");
    assert!(
        selected.contains("Needle &#60;script&#62;alert(1)") && !selected.contains("<script>alert"),
        "{backend}: escaped: {selected}"
    );
    let (status, _, missing) = oneshot(state, &format!("/traces/{id}?span=00000000000fffff")).await;
    assert_eq!(status, 200, "{backend}");
    assert!(missing.contains("is not in this trace"), "{backend}");
    let (status, _, bad) = oneshot(state, &format!("/traces/{id}?from=nonsense")).await;
    assert_eq!(status, 400, "{backend}: {bad}");
    assert!(bad.contains("not a position in this trace"), "{backend}");
}

/// The analyzer with `pool` bytes of working memory: a pass holds at most 4 MiB at the
/// smallest (`MIN_PASS`), so a trace of more than about 0.8 MB of rows is too large.
async fn analyse_within(store: &dyn store::Store, pool: u64) {
    use budgetscope::pipeline::analyzer::{AnalyzerOptions, analysis_pass};
    let memory = MemoryBudget::with_pool(pool);
    let options = AnalyzerOptions {
        quiet_period: std::time::Duration::ZERO,
        max_trace_wait: std::time::Duration::from_secs(300),
        analyze: Default::default(),
        metrics: Default::default(),
        held: budgetscope::pipeline::held::HeldTraces::new(&memory),
        memory,
    };
    while analysis_pass(store, &options).await.unwrap().more {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trace_too_large_to_analyse_is_listed_too_large_and_its_hops_are_not_counted() {
    for db in TestDb::all().await {
        let backend = db.backend;
        let store = store::open(&db.url).await.unwrap();
        let large = flat_trace(1, 5_000);
        let small = flat_trace(2, 20);
        // While small, the large trace is analysed and counted like any other.
        store.write_spans(&large[..100]).await.unwrap();
        store.write_spans(&small).await.unwrap();
        analyse_within(store.as_ref(), 16 * MIB).await;
        let state = AppState::new(store.clone(), AnalyzeOptions::default());
        let requests = |state: AppState| async move {
            let (status, _, body) = oneshot(&state, "/api/hops?service=feed").await;
            assert_eq!(status, 200, "{body}");
            let hops: serde_json::Value = serde_json::from_str(&body).unwrap();
            hops["hops"][0]["requests"].as_u64().unwrap()
        };
        assert_eq!(requests(state.clone()).await, 2, "{backend}");

        // Grown past what a pass may hold: outlined, and its earlier counts removed.
        store.write_spans(&large[100..]).await.unwrap();
        analyse_within(store.as_ref(), 16 * MIB).await;
        assert_eq!(
            requests(state.clone()).await,
            1,
            "{backend}: only the small trace"
        );
        let (status, _, body) = oneshot(&state, "/api/traces?outcome=too_large").await;
        assert_eq!(status, 200, "{body}");
        let found: serde_json::Value = serde_json::from_str(&body).unwrap();
        let traces = found["traces"].as_array().unwrap();
        assert_eq!(traces.len(), 1, "{backend}: {body}");
        let summary = &traces[0];
        assert_eq!(summary["trace_id"], TraceId([1; 16]).to_hex(), "{backend}");
        assert_eq!(summary["span_count"], 5_000, "{backend}");
        assert_eq!(summary["root_service"], "feed", "{backend}");
        assert_eq!(summary["root_name"], "GET /items", "{backend}");
        assert_eq!(summary["answer_ms"], serde_json::Value::Null, "{backend}");
        assert_eq!(summary["flag_counts"], serde_json::json!({}), "{backend}");
        // Search by its operation still finds it, and the list says why it has no verdict.
        let (status, _, page) =
            oneshot(&state, "/traces?service=feed&operation=GET%20%2Fitems").await;
        assert_eq!(status, 200);
        assert!(page.contains("too large to analyse"), "{backend}");

        // With the default memory it fits a pass again and is analysed whole.
        store
            .write_spans(&flat_trace(1, 5_001)[5_000..])
            .await
            .unwrap();
        analyse_within(store.as_ref(), 384 * MIB).await;
        assert_eq!(requests(state.clone()).await, 2, "{backend}");
        let (_, _, body) = oneshot(&state, "/api/traces?outcome=no_budget").await;
        assert!(body.contains(&TraceId([1; 16]).to_hex()), "{backend}");
    }
}

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
        let (status, _, page) = oneshot(&state, &format!("/traces/{large_id}")).await;
        assert_eq!(status, 413, "{backend}");
        assert!(
            page.contains("This trace is too large to show whole") && page.contains("/otlp"),
            "{backend}: {page}"
        );

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

//! `/compare`: two requests side by side on both stores: `b=typical` picks a request of the
//! same endpoint within budget and redirects to a permalink; the page names the
//! differences; bad and unknown ids say what to do; names stay text.

mod common;

use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::core::model::{Budget, Span, SpanKind};
use budgetscope::store;
use budgetscope::web::AppState;
use common::{TestDb, oneshot, span};

/// Trace `n`: the gateway calls `<b>orders</b>` `attempts` times; each attempt takes
/// `each_ms`.
fn request(n: u8, start: u64, attempts: u8, each_ms: u64) -> Vec<Span> {
    let ms = 1_000_000;
    let budget = |span: &mut Span, ms: f64| {
        span.budget = Some(Budget {
            ms,
            source: "deadline.remaining_ms".into(),
        })
    };
    let total = 20 + u64::from(attempts) * (each_ms + 5);
    let mut root = span(n, 1, None, "gateway", "GET /cart", start);
    root.end_unix_nano = start + total * ms;
    budget(&mut root, 1000.0);
    let mut spans = vec![root];
    for k in 0..attempts {
        let at = start + (10 + u64::from(k) * (each_ms + 5)) * ms;
        let mut call = span(n, 10 + 2 * k, Some(1), "gateway", "GET /orders", at);
        call.kind = SpanKind::Client;
        call.end_unix_nano = at + each_ms * ms;
        budget(&mut call, 990.0 - f64::from(k) * each_ms as f64);
        let mut hop = span(
            n,
            11 + 2 * k,
            Some(10 + 2 * k),
            "<b>orders</b>",
            "GET /orders",
            at + ms,
        );
        hop.end_unix_nano = at + (each_ms - 1) * ms;
        budget(&mut hop, 989.0 - f64::from(k) * each_ms as f64);
        spans.extend([call, hop]);
    }
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_requests_side_by_side_with_their_differences() {
    for db in TestDb::all().await {
        let backend = db.backend;
        let store = store::open(&db.url).await.unwrap();
        let start = common::now_nanos() - 600_000_000_000;
        // Healthy requests of 60, 80 and 100 ms, then a slow one that retried twice.
        for (n, each) in [(1u8, 60u64), (2, 80), (3, 100)] {
            store
                .write_spans(&request(n, start + u64::from(n) * 1_000_000_000, 1, each))
                .await
                .unwrap();
        }
        store
            .write_spans(&request(9, start + 9_000_000_000, 3, 150))
            .await
            .unwrap();
        common::analyse_waiting(store.as_ref()).await;
        let state = AppState::new(store, AnalyzeOptions::default());
        let id = |n: u8| budgetscope::core::model::TraceId([n; 16]).to_hex();

        // The typical request within budget is the median: trace 2.
        let (status, headers, _) =
            oneshot(&state, &format!("/compare?a={}&b=typical", id(9))).await;
        assert_eq!(status, 303, "{backend}");
        assert_eq!(
            headers["location"],
            format!("/compare?a={}&b={}", id(9), id(2)).as_str(),
            "{backend}"
        );
        let (status, _, page) = oneshot(&state, &format!("/compare?a={}&b={}", id(2), id(9))).await;
        assert_eq!(status, 200, "{backend}");
        assert!(
            page.contains("+2 retries at gateway → &#60;b&#62;orders&#60;/b&#62; GET /orders in B")
                || page
                    .contains("+2 retries at gateway → &lt;b&gt;orders&lt;/b&gt; GET /orders in B"),
            "{backend}: {}",
            &page[page.find("differences").unwrap_or(0)..][..600]
        );
        assert!(
            !page.contains("<b>orders"),
            "{backend}: a service name became markup"
        );
        assert!(page.contains(r#"class="diff""#), "{backend}");
        // The same request twice: nothing to tell.
        let (_, _, same) = oneshot(&state, &format!("/compare?a={}&b={}", id(2), id(2))).await;
        assert!(
            same.contains("the two requests went the same way"),
            "{backend}"
        );
        // The trace page offers the comparison.
        let (_, _, trace) = oneshot(&state, &format!("/traces/{}", id(9))).await;
        assert!(trace.contains(&format!(r#"href="/compare?a={}&amp;b=typical""#, id(9))));

        // Bad input says what to do.
        let (status, _, page) = oneshot(&state, "/compare?a=abc").await;
        assert_eq!(status, 400);
        assert!(page.contains("b=typical"), "{page}");
        let (status, _, _) = oneshot(&state, &format!("/compare?a={}&b=zz", id(2))).await;
        assert_eq!(status, 400);
        let (status, _, page) = oneshot(&state, &format!("/compare?a={}&b={}", id(2), id(7))).await;
        assert_eq!(status, 404);
        assert!(page.contains("Search traces"), "{backend}");
        let (status, _, page) = oneshot(&state, &format!("/compare?a={}&b=typical", id(1))).await;
        assert_eq!(
            status, 404,
            "{backend}: nothing within budget before the first"
        );
        assert!(
            page.contains("answered within its budget in the hour"),
            "{backend}"
        );
    }
}

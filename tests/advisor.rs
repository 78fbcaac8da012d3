//! `GET /api/advisor` on analysed traffic, both stores: a proxy that cuts the budget and a
//! fixed timeout where the deadline should propagate are found, with their numbers and
//! example traces; the same system with both fixed gets no finding at all.

mod common;

use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::core::model::{Budget, Span, SpanKind};
use budgetscope::store;
use budgetscope::web::AppState;
use common::{TestDb, oneshot, span};

/// Request `n` (ids `tag + n`): gateway → orders → inventory (propagated) and → billing
/// (`fixed`: a fixed 5 s timeout); with `proxy`, every second request reaches orders with
/// 300 ms of its 990.
fn request(tag: u8, n: u8, start: u64, proxy: bool, fixed: bool) -> Vec<Span> {
    let ms = 1_000_000;
    let id = tag + n + 1;
    let with = |mut span: Span, budget: f64, kind: SpanKind, from: u64, len: u64| {
        span.budget = Some(Budget {
            ms: budget,
            source: "deadline.remaining_ms".into(),
        });
        span.kind = kind;
        span.start_unix_nano = start + from * ms;
        span.end_unix_nano = start + (from + len) * ms;
        span
    };
    let s = |sid: u8, parent: Option<u8>, service: &str, name: &str| {
        span(id, sid, parent, service, name, start)
    };
    let received = if proxy && n % 2 == 0 { 300.0 } else { 985.0 };
    let work = 10 + 5 * u64::from(n);
    let left_at_stock = received - work as f64;
    let left_at_charge = received - (34 + work) as f64;
    let charge = if fixed { 5000.0 } else { left_at_charge - 10.0 };
    vec![
        with(
            s(1, None, "gateway", "GET /cart"),
            1000.0,
            SpanKind::Server,
            0,
            600,
        ),
        with(
            s(2, Some(1), "gateway", "POST /orders"),
            990.0,
            SpanKind::Client,
            5,
            585,
        ),
        with(
            s(3, Some(2), "orders", "POST /orders"),
            received,
            SpanKind::Server,
            6,
            582,
        ),
        with(
            s(4, Some(3), "orders", "GET /stock"),
            left_at_stock - 10.0,
            SpanKind::Client,
            6 + work,
            30,
        ),
        with(
            s(5, Some(4), "inventory", "GET /stock"),
            left_at_stock - 11.0,
            SpanKind::Server,
            7 + work,
            28,
        ),
        with(
            s(6, Some(3), "orders", "Charge"),
            charge,
            SpanKind::Client,
            40 + work,
            40,
        ),
        with(
            s(7, Some(6), "billing", "Charge"),
            charge - 1.0,
            SpanKind::Server,
            41 + work,
            38,
        ),
    ]
}

async fn findings(state: &AppState) -> serde_json::Value {
    let (status, _, body) = oneshot(state, "/api/advisor?since=-1h").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["findings"].clone()
}

/// The findings of 30 requests on each store, with the `AppState` that answered them (and
/// the database, which lives as long as it).
async fn advice(proxy: bool, fixed: bool) -> Vec<(TestDb, AppState, serde_json::Value)> {
    let mut out = Vec::new();
    for db in TestDb::all().await {
        let start = common::now_nanos() - 600_000_000_000;
        let store = store::open(&db.url).await.unwrap();
        for n in 0..30u8 {
            let at = start + u64::from(n) * 1_000_000_000;
            store
                .write_spans(&request(0, n, at, proxy, fixed))
                .await
                .unwrap();
        }
        common::analyse_waiting(store.as_ref()).await;
        let state = AppState::new(store, AnalyzeOptions::default());
        let found = findings(&state).await;
        out.push((db, state, found));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_advisor_finds_a_clamping_proxy_and_a_fixed_timeout() {
    for (db, state, found) in advice(true, true).await {
        let backend = db.backend;
        let kinds: Vec<(&str, &str, &str)> = found
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["kind"].as_str().unwrap(),
                    f["caller"]["service"].as_str().unwrap(),
                    f["callee"]["service"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("clamped", "gateway", "orders"),
                ("fixed_timeout", "orders", "billing")
            ],
            "{backend}: {found:#}"
        );
        let clamped = &found[0];
        assert_eq!(clamped["requests"], 15, "{backend}");
        assert_eq!(clamped["calls"], 30, "{backend}");
        let received = clamped["value_ms"].as_f64().unwrap();
        assert!((received - 300.0).abs() < 15.0, "{backend}: {received}");
        let fixed = &found[1];
        let value = fixed["value_ms"].as_f64().unwrap();
        assert!((value - 5000.0).abs() / 5000.0 < 0.05, "{backend}: {value}");
        assert!(
            fixed["message"]
                .as_str()
                .unwrap()
                .contains("more than was left on 100 % of calls"),
            "{backend}: {fixed}"
        );
        assert_eq!(
            fixed["example_traces"].as_array().unwrap().len(),
            3,
            "{backend}"
        );
        let (status, _, body) = oneshot(&state, "/api/advisor?colour=red").await;
        assert_eq!(status, 400);
        assert!(body.contains("use since, until or service"), "{body}");
        // The page says the same, grouped by calling service, linking hops and traces.
        let (status, _, page) = oneshot(&state, "/advisor?range=1h").await;
        assert_eq!(status, 200, "{backend}");
        assert!(page.contains("2 findings."), "{backend}");
        assert!(page.contains(r#"<span class="badge kind">clamped</span>"#));
        assert!(page.contains(r#"<span class="badge kind">fixed_timeout</span>"#));
        assert!(
            page.contains(r#"href="/hops/billing/Charge?range=1h""#),
            "{backend}"
        );
        let trace = fixed["example_traces"][0].as_str().unwrap();
        assert!(
            page.contains(&format!(r#"href="/traces/{trace}""#)),
            "{backend}"
        );
        let (_, _, only) = oneshot(&state, "/advisor?range=1h&service=inventory").await;
        assert!(
            only.contains("Nothing to change in this range"),
            "{backend}"
        );
        // The map marks the two edges, by service and by operation, and links the advisor.
        for group in ["service", "operation"] {
            let (_, _, map) = oneshot(&state, &format!("/map?range=1h&group={group}")).await;
            assert_eq!(map.matches("⚑ clamped<").count(), 1, "{backend} {group}");
            assert_eq!(
                map.matches("⚑ fixed_timeout<").count(),
                1,
                "{backend} {group}"
            );
            assert!(
                map.contains(
                    r#"href="/advisor?range=1h&#38;service=orders">advice: fixed_timeout"#
                ),
                "{backend} {group}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_system_with_both_fixed_gets_no_finding() {
    for (db, state, found) in advice(false, false).await {
        let backend = db.backend;
        assert_eq!(found, serde_json::json!([]), "{backend}");
        let (_, _, page) = oneshot(&state, "/advisor").await;
        assert!(
            page.contains("Nothing to change in this range"),
            "{backend}"
        );
    }
}

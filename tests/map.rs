//! The service map (`/api/map`, `/map`) on analysed traffic, on both stores: its nodes and
//! edges with their numbers and health, grouping and filtering, bad parameters, and names
//! that must not become markup.

mod common;

use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::core::model::{AttrValue, Budget, Span, SpanKind};
use budgetscope::store;
use budgetscope::web::AppState;
use common::{TestDb, oneshot, span};

fn budget(span: &mut Span, ms: f64) {
    span.budget = Some(Budget {
        ms,
        source: "deadline.remaining_ms".into(),
    });
}

/// Request `n` through the shop: edge calls orders (through a proxy that cuts every
/// second request's budget to 300 ms), orders queries an uninstrumented database named
/// `db` and calls `<img src=x onerror=alert(1)>`, a hostile service name.
fn request(n: u8, start: u64) -> Vec<Span> {
    let ms = 1_000_000;
    let mut edge = span(n, 1, None, "edge", "GET /checkout", start);
    edge.end_unix_nano = start + 200 * ms;
    budget(&mut edge, 1000.0);
    let mut call = span(n, 2, Some(1), "edge", "POST /orders", start + 5 * ms);
    call.kind = SpanKind::Client;
    call.end_unix_nano = start + 190 * ms;
    budget(&mut call, 990.0);
    let mut orders = span(n, 3, Some(2), "orders", "POST /orders", start + 6 * ms);
    orders.end_unix_nano = start + 188 * ms;
    budget(&mut orders, if n % 2 == 0 { 300.0 } else { 988.0 });
    let mut db = span(n, 4, Some(3), "orders", "SELECT", start + 10 * ms);
    db.kind = SpanKind::Client;
    db.end_unix_nano = start + 40 * ms;
    db.attributes = vec![("server.address".into(), AttrValue::String("db".into()))];
    let mut hostile_call = span(n, 5, Some(3), "orders", "audit", start + 50 * ms);
    hostile_call.kind = SpanKind::Client;
    hostile_call.end_unix_nano = start + 60 * ms;
    let mut hostile = span(
        n,
        6,
        Some(5),
        "<img src=x onerror=alert(1)>",
        "POST /audit",
        start + 51 * ms,
    );
    hostile.end_unix_nano = start + 59 * ms;
    vec![edge, call, orders, db, hostile_call, hostile]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_map_shows_each_edge_with_its_budget_numbers_and_health() {
    for db in TestDb::all().await {
        let backend = db.backend;
        let store = store::open(&db.url).await.unwrap();
        let start = common::now_nanos() - 120_000_000_000;
        for n in 1..=10u8 {
            store
                .write_spans(&request(n, start + u64::from(n) * 1_000_000_000))
                .await
                .unwrap();
        }
        common::analyse_waiting(store.as_ref()).await;
        let state = AppState::new(store, AnalyzeOptions::default());

        let (status, _, body) = oneshot(&state, "/api/map?since=-1h").await;
        assert_eq!(status, 200, "{backend}: {body}");
        let map: serde_json::Value = serde_json::from_str(&body).unwrap();
        let services: Vec<&str> = map["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["service"].as_str().unwrap())
            .collect();
        assert_eq!(
            services,
            ["<img src=x onerror=alert(1)>", "db", "edge", "orders"],
            "{backend}"
        );
        let edge = |caller: &str, callee: &str| {
            map["edges"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["caller"]["service"] == caller && e["callee"]["service"] == callee)
                .unwrap_or_else(|| panic!("{backend}: no edge {caller} → {callee}: {body}"))
                .clone()
        };
        let orders = edge("edge", "orders");
        assert_eq!(orders["calls"], 10, "{backend}");
        assert_eq!(orders["requests"], 10, "{backend}");
        assert_eq!(orders["attempts_per_request"], 1.0, "{backend}");
        assert_eq!(
            orders["rates"]["clamped"], 0.5,
            "{backend}: every second request"
        );
        assert_eq!(orders["health"], "bad", "{backend}");
        assert_eq!(orders["label"], "50 % of calls clamped", "{backend}");
        let forwarded = orders["forwarded_ms"]["p50"].as_f64().unwrap();
        assert!(
            (forwarded - 990.0).abs() / 990.0 < 0.05,
            "{backend}: {forwarded}"
        );
        let database = edge("orders", "db");
        assert_eq!(database["callee"]["operation"], serde_json::Value::Null);
        assert_eq!(database["health"], "ok", "{backend}");
        let latency = database["latency_ms"]["p99"].as_f64().unwrap();
        assert!((latency - 30.0).abs() / 30.0 < 0.05, "{backend}: {latency}");
        let db_node = &map["nodes"][1];
        assert_eq!(db_node["instrumented"], false, "{backend}");

        // By operation, and one service's edges.
        let (_, _, body) = oneshot(&state, "/api/map?group=operation&service=orders").await;
        let by_op: serde_json::Value = serde_json::from_str(&body).unwrap();
        let names: Vec<String> = by_op["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| format!("{} {}", n["service"], n["operation"]))
            .collect();
        assert_eq!(names.len(), 4, "{backend}: {names:?}");
        assert_eq!(by_op["edges"].as_array().unwrap().len(), 3, "{backend}");

        // Bad parameters say what to use.
        let (status, _, body) = oneshot(&state, "/api/map?group=hops").await;
        assert_eq!(status, 400);
        assert!(body.contains("use service"), "{body}");
        let (status, _, body) = oneshot(&state, "/api/map?colour=red").await;
        assert_eq!(status, 400);
        assert!(body.contains("unknown; use since"), "{body}");

        // The page: the picture and the same numbers in words; names stay text.
        let (status, _, page) = oneshot(&state, "/map?range=1h").await;
        assert_eq!(status, 200, "{backend}");
        assert!(page.contains(r#"<svg class="map""#), "{backend}");
        assert_eq!(
            page.matches(r#"class="edge h-bad""#).count(),
            1,
            "{backend}"
        );
        assert!(page.contains("50 % of calls clamped"), "{backend}");
        assert!(page.contains("not instrumented"), "{backend}");
        assert!(
            !page.contains("<img src=x"),
            "{backend}: markup from a service name"
        );
        assert!(page.contains("&#60;img src=x") || page.contains("&lt;img src=x"));
        let (status, _, page) = oneshot(&state, "/map?range=1h&group=operation&service=edge").await;
        assert_eq!(status, 200);
        assert!(
            page.contains(r#"href="/hops/edge/GET%20%2Fcheckout?range=1h""#),
            "{backend}"
        );
        let (status, _, page) = oneshot(&state, "/map?group=everything").await;
        assert_eq!(status, 400);
        assert!(page.contains("group=service or group=operation"));
        let (_, _, empty) = oneshot(&state, "/map?service=nobody").await;
        assert!(empty.contains("No analysed request in this range touches nobody"));
    }
}

//! The JSON API driven as a router (`web::app(state).oneshot(…)`), no socket: the trace
//! with its analysis, search after the analyzer's pass, hop statistics, and errors.

mod common;

use axum::http::StatusCode;
use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::pipeline::analyzer::analysis_pass;
use budgetscope::store;
use budgetscope::web::AppState;
use common::{TestDb, checkout_a_minute_ago, oneshot};
use serde_json::Value;

async fn get(state: &AppState, uri: &str) -> (StatusCode, Value) {
    let (status, _, body) = oneshot(state, uri).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{uri}: {e}")),
    )
}

#[tokio::test]
async fn trace_search_and_hops_through_the_router() {
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.unwrap();
        let spans = checkout_a_minute_ago();
        store.write_spans(&spans).await.unwrap();
        let state = AppState::new(store.clone(), AnalyzeOptions::default());
        let trace_id = spans[0].trace_id.to_hex();

        let (status, trace) = get(&state, &format!("/api/traces/{trace_id}")).await;
        assert_eq!(status, StatusCode::OK, "{}", db.backend);
        let analysis = &trace["analysis"];
        assert_eq!(analysis["outcome"], "exceeded");
        assert_eq!(
            analysis["rows"][1]["flags"][0]["message"],
            "forwarded 5000 ms with 780 ms left"
        );
        assert_eq!(analysis["rows"][0]["self_ms"], 40.0);
        assert_eq!(analysis["rows"][2]["depth"], 2);

        // Search and hops answer after the background analyzer's pass.
        let (_, empty) = get(&state, "/api/traces").await;
        assert_eq!(empty["traces"], serde_json::json!([]), "not summarised yet");
        let options = common::analyzer_options();
        assert_eq!(
            analysis_pass(store.as_ref(), &options)
                .await
                .unwrap()
                .analysed,
            1
        );
        let (_, found) = get(
            &state,
            "/api/traces?flag=inflated&outcome=exceeded&attr=deadline.remaining_ms%3E%3D5000",
        )
        .await;
        assert_eq!(
            found["traces"][0]["trace_id"], trace_id,
            "{}: {found}",
            db.backend
        );
        let (_, hops) = get(&state, "/api/hops?since=-1h").await;
        let edge = hops["hops"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["service"] == "edge")
            .unwrap();
        assert_eq!(
            (
                edge["requests"].as_i64(),
                edge["overspent"].as_i64(),
                edge["inflated"].as_i64()
            ),
            (Some(1), Some(1), Some(1))
        );

        for (uri, status, code) in [
            (
                "/api/traces?outcome=late",
                StatusCode::BAD_REQUEST,
                "invalid_parameter",
            ),
            (
                "/api/traces/abc",
                StatusCode::BAD_REQUEST,
                "invalid_trace_id",
            ),
            (
                "/api/hops?since=now&until=-1h",
                StatusCode::BAD_REQUEST,
                "invalid_parameter",
            ),
            (
                "/api/hops?colour=red",
                StatusCode::BAD_REQUEST,
                "invalid_parameter",
            ),
            ("/api/nope", StatusCode::NOT_FOUND, "not_found"),
        ] {
            let (got, body) = get(&state, uri).await;
            assert_eq!(
                (got, body["error"]["code"].as_str()),
                (status, Some(code)),
                "{uri}: {body}"
            );
        }
    }
}

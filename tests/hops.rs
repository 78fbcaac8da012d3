//! Hop statistics end to end on both stores: rollups maintained by the background
//! analyzer, read through `GET /api/hops` and the per-hop series.

mod common;

use std::time::{Duration, Instant};

use common::{TestDb, fixture_trace as trace, get_json, otlp_request, post_otlp, start};
use serde_json::Value;

async fn hops_until(server: &budgetscope::server::RunningServer, requests: i64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get_json(server, "/api/hops?since=-1h").await;
        assert_eq!(status, 200, "{body}");
        let total: i64 = body["hops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["requests"].as_i64().unwrap())
            .sum();
        if total == requests || Instant::now() > deadline {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn hop<'a>(body: &'a Value, service: &str, operation: &str) -> &'a Value {
    body["hops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["service"] == service && h["operation"] == operation)
        .unwrap_or_else(|| panic!("no hop {service} {operation} in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_stats_count_exceeds_and_flags_per_hop() {
    for db in TestDb::all().await {
        let server = start(&db, &["--quiet-period", "100ms"]).await;
        // Late because of its own work: a local exceed at edge.
        let local = trace(1, r#"edge server "GET /checkout" 0 900 budget=700"#);
        // On time, but it calls billing after its deadline: billing inherits the exceed.
        let inherited = trace(
            2,
            r#"
edge server "GET /checkout" 0 800 budget=700
  edge client "billing" 760 30 budget=-60
    billing server "Charge" 761 28 budget=-61
"#,
        );
        let fine = trace(3, r#"edge server "GET /checkout" 0 300 budget=700"#);
        for (spans, ago) in [(&local, 5000), (&inherited, 4000), (&fine, 3000)] {
            post_otlp(&server, &otlp_request(spans, ago)).await;
        }
        let body = hops_until(&server, 4).await;
        let edge = hop(&body, "edge", "GET /checkout");
        assert_eq!(edge["requests"], 3, "{}: {body}", db.backend);
        assert_eq!(
            edge["local_exceed"], 2,
            "{}: own work, and the doomed call",
            db.backend
        );
        assert_eq!(edge["overspent"], 2, "{}", db.backend);
        assert_eq!(
            edge["doomed"], 1,
            "{}: call flags count for the hop that made the call",
            db.backend
        );
        assert_eq!(edge["inherited_exceed"], 0);
        assert_eq!(
            edge["origin"], 2,
            "{}: both exceeded requests ran out at edge",
            db.backend
        );
        let p50 = edge["budget_ms"]["p50"].as_f64().unwrap();
        assert!(
            (p50 - 700.0).abs() < 700.0 * 0.045,
            "{}: p50 {p50}",
            db.backend
        );
        let charge = hop(&body, "billing", "Charge");
        assert_eq!(charge["requests"], 1);
        assert_eq!(charge["inherited_exceed"], 1, "{}", db.backend);
        assert_eq!(
            charge["origin"], 0,
            "{}: a victim, not an origin",
            db.backend
        );
        assert!(charge["budget_ms"]["p50"].as_f64().unwrap() < 0.0);

        let (_, filtered) = get_json(&server, "/api/hops?since=-1h&service=billing").await;
        assert_eq!(filtered["hops"].as_array().unwrap().len(), 1);

        // The series buckets add up to the totals; '/' in the operation is percent-encoded.
        let (status, series) = get_json(
            &server,
            "/api/hops/edge/GET%20%2Fcheckout/series?since=-10m&step=1m",
        )
        .await;
        assert_eq!(status, 200, "{series}");
        assert_eq!(series["step_ms"], 60_000);
        let points = series["points"].as_array().unwrap();
        assert!(points.len() >= 10 && points.len() <= 11, "{}", points.len());
        let sum = |field: &str| {
            points
                .iter()
                .map(|p| p[field].as_i64().unwrap())
                .sum::<i64>()
        };
        assert_eq!(
            (
                sum("requests"),
                sum("local_exceed"),
                sum("inherited_exceed"),
                sum("origin")
            ),
            (3, 2, 0, 2),
            "{}",
            db.backend
        );

        // An older trace lands in a whole hour of a longer range: read from hourly rows.
        let older = trace(4, r#"edge server "GET /checkout" 0 300 budget=700"#);
        post_otlp(&server, &otlp_request(&older, 150 * 60 * 1000)).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, body) = get_json(&server, "/api/hops?since=-6h").await;
            if hop(&body, "edge", "GET /checkout")["requests"] == 4 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{}: hourly rollup never showed: {body}",
                db.backend
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (_, hourly) = get_json(
            &server,
            "/api/hops/edge/GET%20%2Fcheckout/series?since=-6h&step=1h",
        )
        .await;
        let (_, minutely) = get_json(
            &server,
            "/api/hops/edge/GET%20%2Fcheckout/series?since=-6h&step=1m",
        )
        .await;
        let total = |series: &Value| {
            series["points"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["requests"].as_i64().unwrap())
                .sum::<i64>()
        };
        assert_eq!((total(&hourly), total(&minutely)), (4, 4), "{}", db.backend);

        let (status, error) = get_json(&server, "/api/hops/edge/x/series?step=90s").await;
        assert_eq!(status, 400, "{error}");
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_analysed_trace_is_not_counted_twice() {
    for db in TestDb::all().await {
        let server = start(&db, &["--quiet-period", "100ms"]).await;
        let full = trace(
            7,
            r#"
edge server "GET /" 0 300 budget=800
  edge client "billing" 10 200 budget=790
    billing server "Charge" 12 190
"#,
        );
        let request = otlp_request(&full, 1000);
        // Edge's spans first: billing's hop arrives later.
        let mut early = request.clone();
        early.resource_spans.retain(|r| {
            r.resource.as_ref().unwrap().attributes[0]
                .value
                .as_ref()
                .unwrap()
                .value
                == Some(
                    opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                        "edge".into(),
                    ),
                )
        });
        post_otlp(&server, &early).await;
        let body = hops_until(&server, 1).await;
        assert_eq!(hop(&body, "edge", "GET /")["requests"], 1);
        post_otlp(&server, &request).await;
        let body = hops_until(&server, 2).await;
        assert_eq!(
            hop(&body, "edge", "GET /")["requests"],
            1,
            "{}: {body}",
            db.backend
        );
        let charge = hop(&body, "billing", "Charge");
        assert_eq!(charge["requests"], 1);
        assert_eq!(
            charge["dropped"], 1,
            "{}: billing recorded no budget",
            db.backend
        );
        server.shutdown().await;
    }
}

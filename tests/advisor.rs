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

/// `POST path` with a JSON body, through the router.
async fn post(state: &AppState, path: &str, body: &str) -> (u16, serde_json::Value) {
    use tower::ServiceExt as _;
    let response = budgetscope::web::app(state.clone())
        .oneshot(
            axum::http::Request::post(path)
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body.to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

async fn findings(state: &AppState) -> serde_json::Value {
    let (status, _, body) = oneshot(state, "/api/advisor?since=-1h").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["findings"].clone()
}

/// The findings on each store after writing and analysing the traces `traces(start)`
/// makes (`start`: 20 minutes ago), with the `AppState` that answered them (and the
/// database, which lives as long as it).
async fn advice_of(
    traces: impl Fn(u64) -> Vec<Vec<Span>>,
) -> Vec<(TestDb, AppState, serde_json::Value)> {
    let mut out = Vec::new();
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.unwrap();
        for spans in traces(common::now_nanos() - 1_200_000_000_000) {
            store.write_spans(&spans).await.unwrap();
        }
        common::analyse_waiting(store.as_ref()).await;
        let state = AppState::new(store, AnalyzeOptions::default());
        let found = findings(&state).await;
        out.push((db, state, found));
    }
    out
}

/// The findings of 30 requests, one a second, on each store.
async fn advice(proxy: bool, fixed: bool) -> Vec<(TestDb, AppState, serde_json::Value)> {
    advice_of(|start| {
        (0..30u8)
            .map(|n| request(0, n, start + u64::from(n) * 1_000_000_000, proxy, fixed))
            .collect()
    })
    .await
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
                    f["caller"]["service"]
                        .as_str()
                        .unwrap_or_else(|| f["hop"]["service"].as_str().unwrap()),
                    f["callee"]["service"].as_str().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("clamped", "gateway", "orders"),
                ("min_useful_budget", "orders", ""),
                ("fixed_timeout", "orders", "billing")
            ],
            "{backend}: {found:#}"
        );
        let clamped = &found[0];
        assert_eq!(clamped["requests"], 15, "{backend}");
        assert_eq!(clamped["out_of"], 30, "{backend}");
        let received = clamped["value_ms"].as_f64().unwrap();
        assert!((received - 300.0).abs() < 15.0, "{backend}: {received}");
        // Orders always exceeds with the 300 ms the proxy leaves it: refuse below that.
        let useful = &found[1];
        assert_eq!(useful["hop"]["operation"], "POST /orders", "{backend}");
        let threshold = useful["value_ms"].as_f64().unwrap();
        assert!((305.0..=330.0).contains(&threshold), "{backend}: {useful}");
        assert!(
            useful["message"]
                .as_str()
                .unwrap()
                .contains("end in a deadline exceed on 15 of 15 (100 %); with more, 0 of 15 do"),
            "{backend}: {useful}"
        );
        assert_eq!(useful["example_traces"].as_array().unwrap().len(), 3);
        let fixed = &found[2];
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
        // Alert rules watch finding kinds: an edge's at its calling hop, a hop's at itself.
        let rules = budgetscope::core::alerts::rules::parse_file(
            "rules:\n  - { name: fail-fast, signal: finding_min_useful_budget, op: \">\", threshold: 0, window: 1h }\n  - { name: proxy, signal: finding_clamped, op: \">\", threshold: 0, window: 1h }\n  - { name: stacked, signal: finding_retry_layers, op: \">\", threshold: 0, window: 1h }\n",
        )
        .unwrap();
        let options = budgetscope::pipeline::alerter::AlerterOptions {
            interval: std::time::Duration::from_secs(30),
            delay: std::time::Duration::ZERO,
            external_url: "http://budgetscope.test".into(),
            analyze: AnalyzeOptions::default(),
        };
        budgetscope::pipeline::alerter::evaluate_once(
            state.store.as_ref(),
            &rules,
            &options,
            common::now_nanos(),
        )
        .await
        .unwrap();
        let mut firing: Vec<(String, String, String, Option<f64>)> = state
            .store
            .alert_instances()
            .await
            .unwrap()
            .into_iter()
            .map(|i| (i.rule, i.service, i.operation, i.value))
            .collect();
        firing.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            firing,
            [
                (
                    "fail-fast".into(),
                    "orders".into(),
                    "POST /orders".into(),
                    Some(15.0)
                ),
                (
                    "proxy".into(),
                    "gateway".into(),
                    "GET /cart".into(),
                    Some(15.0)
                ),
            ],
            "{backend}"
        );
        // What if orders refused what it cannot finish: the 15 clamped requests fail fast;
        // past what the others bring, those would newly fail.
        let whatif = |value: u32| {
            format!(
                r#"{{"change": "min_useful_budget", "hop": {{"service": "orders", "operation": "POST /orders"}}, "value_ms": {value}, "since": "-1h"}}"#
            )
        };
        let (status, replay) = post(&state, "/api/advisor/whatif", &whatif(320)).await;
        assert_eq!(status, 200, "{backend}: {replay}");
        assert_eq!(replay["replayed_traces"], 30, "{backend}");
        assert_eq!(replay["requests"], 30, "{backend}");
        assert_eq!(
            (
                &replay["changed"],
                &replay["failed_fast"],
                &replay["newly_failed"]
            ),
            (
                &serde_json::json!(15),
                &serde_json::json!(15),
                &serde_json::json!(0)
            ),
            "{backend}: {replay}"
        );
        assert!(
            replay["saved_ms"].as_f64().unwrap() > 15.0 * 500.0,
            "{replay}"
        );
        assert_eq!(
            replay["example_traces"]["failed_fast"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
        assert!(
            replay["assumptions"]
                .as_str()
                .unwrap()
                .contains("keeps every recorded time")
        );
        let (_, too_far) = post(&state, "/api/advisor/whatif", &whatif(2000)).await;
        assert_eq!(
            (&too_far["failed_fast"], &too_far["newly_failed"]),
            (&serde_json::json!(15), &serde_json::json!(15))
        );
        // Retries off where nothing retried changes nothing.
        let (_, calm) = post(
            &state,
            "/api/advisor/whatif",
            r#"{"change": "retries_off", "caller": {"service": "orders", "operation": "POST /orders"}, "callee": {"service": "billing", "operation": "Charge"}}"#,
        )
        .await;
        assert_eq!(
            (&calm["requests"], &calm["changed"]),
            (&serde_json::json!(30), &serde_json::json!(0)),
            "{calm}"
        );
        for (body, says) in [
            ("[1, 2]", "the body is not a JSON object"),
            (
                r#"{"change": "more_cache"}"#,
                "use min_useful_budget, reserve, timeout or retries_off",
            ),
            (
                r#"{"change": "reserve", "hop": {"service": "orders", "operation": "POST /orders"}, "value_ms": -3}"#,
                "expected milliseconds",
            ),
            (
                r#"{"change": "timeout", "service": "orders", "operation": "POST /orders", "value_ms": 5}"#,
                "give the edge's callee",
            ),
            (
                r#"{"change": "reserve", "colour": "red"}"#,
                "parameter colour: unknown",
            ),
        ] {
            let (status, error) = post(&state, "/api/advisor/whatif", body).await;
            assert_eq!(status, 400, "{body}: {error}");
            assert!(error.to_string().contains(says), "{body}: {error}");
        }
        // The page: the finding's form leads to the same replay, kept in its URL.
        let (_, _, advisor_page) = oneshot(&state, "/advisor?range=1h").await;
        assert!(
            advisor_page
                .contains(r#"<input type="hidden" name="change" value="min_useful_budget">"#),
            "{backend}"
        );
        let (status, _, page) = oneshot(
            &state,
            "/advisor/whatif?range=1h&change=min_useful_budget&service=orders&operation=POST%20%2Forders&value_ms=320",
        )
        .await;
        assert_eq!(status, 200, "{backend}");
        assert!(
            page.contains(
                "orders POST /orders refuses requests that arrive with less than 320 ms left"
            ),
            "{backend}"
        );
        assert!(
            page.contains("Replayed the 30 most recent traces through it."),
            "{backend}"
        );
        assert!(
            page.contains("<dt>Would have failed fast instead of failing late</dt><dd>15</dd>"),
            "{backend}"
        );
        assert!(
            page.contains("<dt>Went well, would newly fail</dt><dd>0</dd>"),
            "{backend}"
        );
        let (status, _, page) = oneshot(&state, "/advisor/whatif?range=1h&change=reserve").await;
        assert_eq!(status, 400);
        assert!(page.contains("Open a what-if from a finding on the advisor page"));
        let (status, _, body) = oneshot(&state, "/api/advisor?colour=red").await;
        assert_eq!(status, 400);
        assert!(body.contains("use since, until or service"), "{body}");
        // The page says the same, grouped by calling service, linking hops and traces.
        let (status, _, page) = oneshot(&state, "/advisor?range=1h").await;
        assert_eq!(status, 200, "{backend}");
        assert!(page.contains("3 findings."), "{backend}");
        let useful_line = page
            .lines()
            .find(|l| l.contains(r#"<span class="badge kind">min_useful_budget</span>"#))
            .unwrap();
        assert!(
            useful_line.contains(
                r#"<a href="/hops/orders/POST%20%2Forders?range=1h">orders POST /orders</a>"#
            ),
            "{backend}: {useful_line}"
        );
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
        // The hop page tells the advice about the hop and the edges to and from it.
        let (_, _, hop) = oneshot(&state, "/hops/orders/POST%20%2Forders?range=1h").await;
        let advice = &hop[hop.find(r#"<h2 id="advice-h">"#).unwrap()..];
        let advice = &advice[..advice.find("</section>").unwrap()];
        for kind in ["clamped", "min_useful_budget", "fixed_timeout"] {
            assert!(
                advice.contains(&format!(r#"<span class="badge kind">{kind}</span>"#)),
                "{backend}: {kind} in {advice}"
            );
        }
        assert!(
            advice.contains(r#"href="/advisor?range=1h&#38;service=orders""#),
            "{backend}: {advice}"
        );
        let (_, _, calm) = oneshot(&state, "/hops/inventory/GET%20%2Fstock?range=1h").await;
        assert!(calm.contains("Nothing to change in this range for this hop or its calls"));
        let (_, _, only) = oneshot(&state, "/advisor?range=1h&service=inventory").await;
        assert!(
            only.contains("Nothing to change in this range"),
            "{backend}"
        );
        // The map marks the two edges, by service and by operation, and links the advisor.
        for group in ["service", "operation"] {
            let (_, _, map) = oneshot(&state, &format!("/map?range=1h&group={group}")).await;
            assert_eq!(map.matches("⚑ clamped<").count(), 1, "{backend} {group}");
            // The orders node carries its hop's finding.
            assert_eq!(
                map.matches("⚑ min_useful_budget<").count(),
                1,
                "{backend} {group}"
            );
            assert!(
                map.contains(
                    r#"href="/advisor?range=1h&#38;service=orders">advice: min_useful_budget"#
                ),
                "{backend} {group}"
            );
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

/// A fixture trace (`core::analyze::fixture`) as trace `id`, moved to start at `start`.
fn fixture_at(text: &str, id: u32, start: u64) -> Vec<Span> {
    let mut spans = budgetscope::core::analyze::fixture::parse(text);
    let shift = start - budgetscope::core::analyze::fixture::BASE_UNIX_NANO;
    let mut trace = [0u8; 16];
    trace[..4].copy_from_slice(&id.to_be_bytes());
    trace[15] = 0xad;
    for span in &mut spans {
        span.trace_id = budgetscope::core::model::TraceId(trace);
        span.start_unix_nano += shift;
        span.end_unix_nano += shift;
    }
    spans
}

/// The findings on each store of fixtures with their start offsets in seconds.
async fn advice_on(traces: &[(String, u64)]) -> Vec<(TestDb, AppState, serde_json::Value)> {
    advice_of(|start| {
        traces
            .iter()
            .enumerate()
            .map(|(n, (text, offset_s))| {
                fixture_at(text, n as u32 + 1, start + offset_s * 1_000_000_000)
            })
            .collect()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_that_propagates_700_630_450_365_advises_nothing() {
    // Each hop forwards what it has left less a reserve that covers its post-call work;
    // the work varies from request to request and always fits.
    let traces: Vec<(String, u64)> = (0..40u64)
        .map(|n| {
            let w = (n % 7) as f64 * 4.0;
            let text = format!(
                r#"
gateway server "POST /checkout" 0 {} budget=700
  gateway client "POST /orders" 60 {} budget=630
    orders server "POST /orders" 61 {} budget=629
      orders client "GET /price" 160 {} budget=450
        pricing server "GET /price" 161 {} budget=449
          pricing client "GET /stock" 240 {} budget=365
            inventory server "GET /stock" 241 {} budget=364
"#,
                400.0 + 3.0 * w,
                300.0 + 3.0 * w,
                298.0 + 3.0 * w,
                150.0 + 2.0 * w,
                148.0 + 2.0 * w,
                40.0 + w,
                38.0 + w,
            );
            (text, n * 20)
        })
        .collect();
    for (db, state, found) in advice_on(&traces).await {
        assert_eq!(found, serde_json::json!([]), "{}", db.backend);
        let (_, _, hops) = oneshot(&state, "/api/hops?since=-1h").await;
        assert!(hops.contains("\"inventory\""), "{}: {hops}", db.backend);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_healthy_system_gets_no_finding() {
    use budgetscope::otlp::normalize::{NormalizeOptions, normalize};
    let requests = budgetscope::otlp::generate::generate_over(
        6000,
        500,
        std::time::Duration::from_secs(1800),
        0.0,
    );
    let options = NormalizeOptions {
        budget_keys: budgetscope::core::budget::DEFAULT_BUDGET_KEYS
            .iter()
            .map(|k| k.to_string())
            .collect(),
        retention: None,
    };
    let spans: Vec<Span> = requests
        .into_iter()
        .flat_map(|r| normalize(r, &options, common::now_nanos()).spans)
        .collect();
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.unwrap();
        store.write_spans(&spans).await.unwrap();
        common::analyse_waiting(store.as_ref()).await;
        let state = AppState::new(store, AnalyzeOptions::default());
        let found = findings(&state).await;
        assert_eq!(found, serde_json::json!([]), "{}", db.backend);
        // The statistics are there: the hops were counted.
        let (_, _, hops) = oneshot(&state, "/api/hops?since=-1h").await;
        assert!(hops.contains("\"edge\""), "{}: {hops}", db.backend);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_27_call_storm_names_its_three_retrying_layers() {
    // Three layers each make three attempts, each with what is left: 27 calls at the leaf.
    let storm = budgetscope::core::analyze::fixture::retry_storm(false);
    for (db, _, found) in advice_on(&[(storm.clone(), 0), (storm, 30)]).await {
        let backend = db.backend;
        let layers = found
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["kind"] == "retry_layers")
            .unwrap_or_else(|| panic!("{backend}: {found:#}"));
        assert_eq!(layers["value"], 27.0, "{backend}");
        assert_eq!(layers["hop"]["service"], "edge", "{backend}");
        let named: Vec<&str> = layers["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["service"].as_str().unwrap())
            .collect();
        assert_eq!(named, ["edge", "a", "b"], "{backend}");
        assert_eq!(layers["requests"], 2, "{backend}");
        assert_eq!(layers["example_traces"].as_array().unwrap().len(), 2);
        assert!(
            layers["message"]
                .as_str()
                .unwrap()
                .contains("up to 27 calls reached one service for one request"),
            "{backend}: {layers}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_without_a_reserve_for_its_post_call_work_and_a_budget_short_of_the_work() {
    // orders forwards all it has to pricing, then works 100 ms after pricing answers: when
    // pricing takes most of its budget, orders answers late, and so does the request.
    let traces: Vec<(String, u64)> = (0..30u64)
        .map(|n| {
            let pricing = 480.0 + (n % 10) as f64 * 10.0;
            let text = format!(
                r#"
gateway server "POST /checkout" 0 {} budget=600
  gateway client "POST /orders" 5 {} budget=590
    orders server "POST /orders" 6 {} budget=589
      orders client "GET /price" 10 {pricing} budget=585
        pricing server "GET /price" 11 {} budget=584
"#,
                pricing + 130.0,
                pricing + 110.0,
                pricing + 104.0,
                pricing - 2.0,
            );
            (text, n * 20)
        })
        .collect();
    for (db, _, found) in advice_on(&traces).await {
        let backend = db.backend;
        let kinds: Vec<&str> = found
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["kind"].as_str().unwrap())
            .collect();
        // The work does not fit the budget either (pricing alone takes up to 570 of 600
        // ms): both are true, and both are told.
        let mut sorted = kinds.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            ["infeasible_budget", "reserve"],
            "{backend}: {found:#}"
        );
        let reserve = found
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["kind"] == "reserve")
            .unwrap();
        assert_eq!(reserve["hop"]["service"], "orders", "{backend}");
        let value = reserve["value_ms"].as_f64().unwrap();
        assert!((95.0..=110.0).contains(&value), "{backend}: {reserve}");
        assert_eq!(reserve["example_traces"].as_array().unwrap().len(), 3);
        let infeasible = found
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["kind"] == "infeasible_budget")
            .unwrap();
        // The slowest requests need 700 ms (within the histogram's 4.4 %).
        let need = infeasible["value_ms"].as_f64().unwrap();
        assert!((670.0..=735.0).contains(&need), "{backend}: {infeasible}");
        assert_eq!(infeasible["hop"]["service"], "gateway", "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgetscope_advise_prints_the_findings_from_a_database_or_a_running_server() {
    use std::process::Command;
    let bin = env!("CARGO_BIN_EXE_budgetscope");
    let db = TestDb::sqlite();
    {
        let start = common::now_nanos() - 600_000_000_000;
        let store = store::open(&db.url).await.unwrap();
        for n in 0..30u8 {
            let at = start + u64::from(n) * 1_000_000_000;
            store
                .write_spans(&request(0, n, at, true, true))
                .await
                .unwrap();
        }
        common::analyse_waiting(store.as_ref()).await;
    }
    let advise = |args: &[&str]| {
        let output = Command::new(bin).arg("advise").args(args).output().unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).to_string(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    let (code, text, err) = advise(&["--db", &db.url, "--since", "1h"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(text.starts_with("3 findings in the last 1h"), "{text}");
    assert!(
        text.contains("clamped  gateway GET /cart → orders POST /orders · 3"),
        "{text}"
    );
    assert!(
        text.contains("min_useful_budget  orders POST /orders · 3"),
        "{text}"
    );
    assert!(
        text.contains("  Change: refuse requests that arrive with less than"),
        "{text}"
    );
    assert!(text.contains("  Traces: "), "{text}");
    let from_db = text;
    let (code, json, _) = advise(&["--db", &db.url, "--json", "--fail-on-finding"]);
    assert_eq!(code, Some(3), "findings fail a CI job that asks");
    let answer: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(answer["findings"].as_array().unwrap().len(), 3);
    let (code, text, _) = advise(&[
        "--db",
        &db.url,
        "--service",
        "inventory",
        "--fail-on-finding",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(text, "Nothing to change in the last 1h.\n");
    let (code, _, err) = advise(&["--db", &db.url, "--since", "yesterday"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("invalid --since \"yesterday\": expected e.g. 1h, 24h or 7d"),
        "{err}"
    );
    // A server holds the file: the command says to ask it, and asking it answers the same.
    let server = common::start(&db, &[]).await;
    let (code, _, err) = advise(&["--db", &db.url]);
    assert_eq!(code, Some(1));
    assert!(err.contains("give --server"), "{err}");
    let url = format!("http://{}", server.http_addr);
    let (code, from_server, err) = advise(&["--server", &url, "--since", "1h"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(from_server, from_db);
    let (code, _, err) = advise(&["--server", "http://127.0.0.1:9"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("is `budgetscope serve` running there"),
        "{err}"
    );
}

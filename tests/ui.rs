//! The HTML pages: content through the router (`app(state).oneshot`) on both stores, the
//! friendly error pages, and escaping of hostile span data sent through real OTLP ingest.

mod common;

use axum::http::{StatusCode, header};
use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::core::analyze::fixture::parse;
use budgetscope::pipeline::analyzer::analysis_pass;
use budgetscope::store;
use budgetscope::web::AppState;
use common::{
    TestDb, checkout_a_minute_ago, get_text, oneshot, otlp_request, post_otlp, start,
    wait_until_searchable,
};

struct Page {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

/// A page through the router, checked as every response is: security headers, and in
/// HTML no inline style or script, which the Content-Security-Policy would refuse.
async fn get(state: &AppState, uri: &str) -> Page {
    let (status, headers, body) = oneshot(state, uri).await;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let policy = header("content-security-policy");
    assert!(
        policy.contains("default-src 'none'")
            && policy.contains("script-src 'self';")
            && policy.contains("style-src 'self';")
            && policy.contains("frame-ancestors 'none'"),
        "{uri}: {policy:?}"
    );
    assert_eq!(header("x-content-type-options"), "nosniff", "{uri}");
    assert_eq!(header("x-frame-options"), "DENY", "{uri}");
    assert_eq!(header("referrer-policy"), "same-origin", "{uri}");
    if header("content-type").starts_with("text/html") {
        assert_no_inline_style_or_script(uri, &body);
    }
    Page {
        status,
        headers,
        body,
    }
}

fn assert_no_inline_style_or_script(uri: &str, body: &str) {
    assert!(!body.contains(" style="), "{uri}: an inline style");
    assert!(!body.contains("<style"), "{uri}: a style element");
    for (at, _) in body.match_indices("<script") {
        assert!(
            body[at..].starts_with("<script src="),
            "{uri}: an inline script"
        );
    }
    for (at, _) in body.match_indices(" on") {
        let name: String = body[at + 3..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase())
            .collect();
        assert!(
            name.is_empty() || !body[at + 3 + name.len()..].starts_with("=\""),
            "{uri}: an event handler attribute on{name}"
        );
    }
}

#[tokio::test]
async fn every_page_shows_the_budget_story() {
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.unwrap();
        let state = AppState::new(store.clone(), AnalyzeOptions::default());
        let backend = db.backend;

        // A new installation: the overview says how to send traces.
        let first = get(&state, "/").await;
        assert_eq!(first.status, StatusCode::OK);
        assert!(
            first
                .body
                .contains("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318")
                && first.body.contains("deadline.remaining_ms"),
            "{backend}: empty state explains setup"
        );

        let spans = checkout_a_minute_ago();
        store.write_spans(&spans).await.unwrap();
        let options = common::analyzer_options();
        assert_eq!(
            analysis_pass(store.as_ref(), &options)
                .await
                .unwrap()
                .analysed,
            1
        );
        let id = spans[0].trace_id.to_hex();
        let inventory = spans[2].span_id.to_hex();

        let overview = get(&state, "/?range=1h").await;
        assert_eq!(overview.status, StatusCode::OK, "{backend}");
        assert!(
            overview.headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        assert!(!overview.body.contains("No traces yet"), "{backend}");
        assert!(
            overview
                .body
                .contains(r#"href="/hops/inventory/GET%20%2Fstock?range=1h""#),
            "{backend}: hop rows link to the hop page"
        );
        assert!(overview.body.contains(r#"<svg class="chart""#), "chart");
        assert!(
            overview
                .body
                .contains(r#"aria-current="true" class="on">1 hour"#)
        );
        // Sorting is a link that keeps the range.
        assert!(
            overview
                .body
                .contains(r#"href="/?range=1h&#38;sort=requests&#38;order=desc""#),
            "{backend}"
        );
        // Where the budget ran out: the request's origin hop, linked to its exceeded traces.
        assert!(
            overview.body.contains("Where the budget ran out"),
            "{backend}"
        );
        assert!(
            overview.body.contains(
                r#"href="/traces?origin_service=edge&#38;origin_operation=GET%20%2Fcheckout&#38;since=-1h">1 exceeded request</a> ran out here"#
            ),
            "{backend}: origins panel\n{}", &overview.body[overview.body.find("origins-h").unwrap()..][..1200]
        );
        let ran_out = get(
            &state,
            "/traces?origin_service=edge&origin_operation=GET%20%2Fcheckout",
        )
        .await;
        assert!(
            ran_out.body.contains(&format!(r#"href="/traces/{id}""#))
                && ran_out.body.contains("ran out at edge GET /checkout"),
            "{backend}: search by origin hop"
        );
        let elsewhere = get(
            &state,
            "/traces?origin_service=inventory&origin_operation=GET%20%2Fstock",
        )
        .await;
        assert!(
            elsewhere.body.contains("No analysed trace matches"),
            "{backend}: inventory is not where the budget ran out"
        );
        let half = get(&state, "/traces?origin_service=edge").await;
        assert_eq!(half.status, StatusCode::BAD_REQUEST);
        assert!(
            half.body.contains("needs origin_operation too"),
            "{backend}"
        );
        let sorted = get(&state, "/?range=1h&sort=service&order=asc").await;
        let (edge_at, inventory_at) = (
            sorted.body.find("<td>edge</td>").unwrap(),
            sorted.body.find("<td>inventory</td>").unwrap(),
        );
        assert!(edge_at < inventory_at, "sorted by service ascending");

        let traces = get(&state, "/traces?outcome=exceeded&flag=inflated").await;
        assert_eq!(traces.status, StatusCode::OK);
        assert!(
            traces.body.contains(&format!(r#"href="/traces/{id}""#)),
            "{backend}"
        );
        // A flag badge links to its meaning in the guide, which the server shows.
        assert!(
            traces
                .body
                .contains(r#"<a class="badge f-inflated" href="/help/budget-semantics#inflated""#)
        );
        let guide = get(&state, "/help/budget-semantics").await;
        assert_eq!(guide.status, StatusCode::OK);
        assert!(guide.body.contains(r#"<h3 id="inflated">"#), "{backend}");
        assert!(
            traces
                .body
                .contains(r#"<option value="exceeded" selected>"#)
        );
        let none = get(&state, "/traces?outcome=ok").await;
        assert!(none.body.contains("No analysed trace matches"));

        let trace = get(&state, &format!("/traces/{id}")).await;
        // The time axis reaches the end of the 1540 ms trace.
        assert!(
            trace
                .body
                .contains(r#"<span class="g-l1000">1.54 s</span>"#),
            "{backend}: the axis stops short:\n{}",
            &trace.body[trace.body.find("ticks").unwrap_or(0)..][..400]
        );
        assert_eq!(trace.status, StatusCode::OK, "{backend}");
        assert!(
            trace.body.contains(
                "Exceeded: answered in 1.54 s of its 800 ms budget. The budget ran out at edge GET /checkout \
                 (deadline passed while waiting on inventory, which was sent more time than was left). \
                 The critical path ran longest through inventory GET /stock (1.49 s on it)."
            ),
            "{backend}: verdict"
        );
        assert!(trace.body.contains("forwarded 5000 ms with 780 ms left"));
        assert_eq!(
            trace.body.matches(r#"<a class="badge origin""#).count(),
            1,
            "{backend}: the origin row is marked, once"
        );
        assert!(
            trace.body.contains(r#"<div class="waterfall g-d"#),
            "request deadline line"
        );
        assert!(
            trace.body.contains(r#"class="bar over g-l"#),
            "past-deadline part"
        );
        assert!(trace.body.contains("Show raw times"));
        assert!(
            trace
                .body
                .contains(&format!(r#"href="/api/traces/{id}/otlp" download"#))
        );

        let detail = get(&state, &format!("/traces/{id}?span={inventory}")).await;
        assert!(detail.body.contains(r#"<aside class="detail""#));
        assert!(
            detail
                .body
                .contains("<dt>Budget source</dt><dd>deadline.remaining_ms</dd>")
        );
        assert!(
            detail
                .body
                .contains(r#"href="/hops/inventory/GET%20%2Fstock""#)
        );
        assert!(
            detail
                .body
                .contains("<dt>Critical path</dt><dd>on it, 1.49 s of its own</dd>"),
            "{backend}"
        );
        let raw = get(&state, &format!("/traces/{id}?times=raw")).await;
        assert!(raw.body.contains("Show skew-adjusted times"));
        // The critical path (all three rows of this chain) is marked, and a link hides it
        // keeping the other choices; the link back shows it again.
        assert_eq!(
            trace
                .body
                .matches(r#"<span class="crit-mark" title="#)
                .count(),
            3,
            "{backend}"
        );
        assert!(trace.body.contains(&format!(
            r#"href="/traces/{id}?critical=off" id="critical-toggle">Hide the critical path<"#
        )));
        let hidden = get(&state, &format!("/traces/{id}?times=raw&critical=off")).await;
        assert!(!hidden.body.contains("crit-mark"), "{backend}");
        assert!(hidden.body.contains(&format!(
            r#"href="/traces/{id}?times=raw" id="critical-toggle">Show the critical path<"#
        )));
        assert!(
            hidden.body.contains("times=raw&#38;critical=off"),
            "{backend}: row links keep the choice"
        );
        let found = get(&state, &format!("/traces/{id}?q=inventory")).await;
        assert!(found.body.contains("1 matching span<"), "{backend}");

        let hop = get(&state, "/hops/inventory/GET%20%2Fstock?range=1h").await;
        assert_eq!(hop.status, StatusCode::OK);
        // inventory's own 1.49 s made the request late, though edge is where it ran out.
        assert!(
            hop.body.contains("<dd>100 % of 1 (on the path of 1)</dd>"),
            "{backend}: critical share on the hop page"
        );
        let api = get(&state, "/api/hops").await;
        let hops: serde_json::Value = serde_json::from_str(&api.body).unwrap();
        let critical = |service: &str| {
            hops["hops"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| h["service"] == service)
                .unwrap()["critical"]
                .clone()
        };
        assert_eq!(critical("inventory")["share"], 1.0, "{backend}");
        assert_eq!(critical("edge")["share"], 0.0, "{backend}");
        assert_eq!(critical("edge")["exceeded_on_path"], 1, "{backend}");
        assert!(hop.body.contains("Budget received") && hop.body.contains("Burn"));
        assert!(
            hop.body.contains(&format!(r#"href="/traces/{id}""#)),
            "recent flagged"
        );
        // Inventory holds none of the trace's flags: they are shown as elsewhere.
        assert!(
            hop.body
                .contains(r#"<td class="here"><span class="muted">none</span></td>"#),
            "{backend}: this hop's flags"
        );
        let elsewhere_at = hop.body.find(r#"<td class="elsewhere">"#).unwrap();
        assert!(hop.body[elsewhere_at..].contains("f-inflated"), "{backend}");
        let edge = get(&state, "/hops/edge/GET%20%2Fcheckout?range=1h").await;
        let here_at = edge.body.find(r#"<td class="here">"#).unwrap();
        assert!(
            edge.body[here_at..].starts_with(r#"<td class="here"><strong>ran out here</strong> "#)
                && edge.body[here_at..edge.body.find(r#"<td class="elsewhere">"#).unwrap()]
                    .contains("f-inflated"),
            "{backend}: the edge's own flags, and that the request ran out there"
        );
        assert!(
            edge.body.contains("<dt>Ran out here</dt><dd>1</dd>"),
            "{backend}"
        );

        let download = get(&state, &format!("/api/traces/{id}/otlp")).await;
        assert!(
            download.headers[header::CONTENT_DISPOSITION]
                .to_str()
                .unwrap()
                .contains(&format!("trace-{id}.otlp.json"))
        );
        let request: opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest =
            serde_json::from_str(&download.body).unwrap();
        let count: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        assert_eq!(count, 3);

        let go = get(
            &state,
            &format!("/traces/go?trace_id=%20{}%20", id.to_uppercase()),
        )
        .await;
        assert_eq!(go.status, StatusCode::SEE_OTHER);
        assert_eq!(go.headers[header::LOCATION], format!("/traces/{id}"));
    }
}

#[tokio::test]
async fn a_big_trace_opens_collapsed_and_loads_subtrees_on_demand() {
    let db = TestDb::sqlite();
    let store = store::open(&db.url).await.unwrap();
    let state = AppState::new(store.clone(), AnalyzeOptions::default());
    let spans = budgetscope::otlp::generate::large_trace(1000);
    store.write_spans(&spans).await.unwrap();
    let id = spans[0].trace_id.to_hex();
    let rows = |body: &str| body.matches(r#"<div class="wf-row"#).count();

    let page = get(&state, &format!("/traces/{id}")).await;
    assert_eq!(page.status, StatusCode::OK);
    let shown = rows(&page.body);
    assert!(
        (2..200).contains(&shown),
        "only the top of a 1000-span trace is in the page: {shown} rows"
    );
    assert!(
        page.body.contains("data-expand-all-link"),
        "expand all reloads"
    );
    // Take the first collapsed row's children from its data-lazy link.
    let start = page.body.find(r#"data-lazy=""#).unwrap() + r#"data-lazy=""#.len();
    let href = page.body[start..]
        .split('"')
        .next()
        .unwrap()
        .replace("&#38;", "&");
    assert!(
        href.starts_with(&format!("/traces/{id}/rows?parent=")),
        "{href}"
    );
    let children = get(&state, &href).await;
    assert_eq!(children.status, StatusCode::OK);
    assert!(!children.body.contains("<html"), "a fragment, not a page");
    assert!(rows(&children.body) >= 1, "{}", children.body);
    assert!(
        children.body.contains("data-lazy=") || !children.body.contains("data-collapsed"),
        "children with children come collapsed and lazy again"
    );

    let all = get(&state, &format!("/traces/{id}?expand=all")).await;
    let api = get(&state, &format!("/api/traces/{id}")).await;
    let analysed: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(
        rows(&all.body),
        analysed["analysis"]["rows"].as_array().unwrap().len(),
        "expand=all has every row"
    );
    assert!(!all.body.contains("data-lazy="));

    // Selecting a deep span opens the path to it.
    let deepest = spans
        .iter()
        .rev()
        .find(|s| s.parent_span_id.is_some())
        .unwrap();
    let selected = get(
        &state,
        &format!("/traces/{id}?span={}", deepest.span_id.to_hex()),
    )
    .await;
    assert!(
        selected
            .body
            .contains(&format!(r#"id="row-{}""#, deepest.span_id.to_hex()))
    );
    let missing = get(&state, &format!("/traces/{id}/rows")).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn errors_are_friendly_pages_that_say_what_to_do() {
    let db = TestDb::sqlite();
    let store = store::open(&db.url).await.unwrap();
    let state = AppState::new(store, AnalyzeOptions::default());
    for (uri, status, says) in [
        ("/traces/xyz", 400, "give the 32 hex digits"),
        (
            "/traces/0123456789abcdef0123456789abcdef",
            404,
            "Search traces to find it",
        ),
        ("/traces/go?trace_id=nope", 400, "give the 32 hex digits"),
        ("/nowhere", 404, "Start from the overview"),
        ("/?range=2y", 400, "use 15m, 1h, 6h, 24h or 7d"),
        ("/?since=-1h&until=-2h", 400, "choose a To later than From"),
        ("/traces?limit=0", 400, "parameter limit"),
        ("/traces?attr=novalue", 400, "expected KEY&#60;OP&#62;VALUE"),
    ] {
        let page = get(&state, uri).await;
        assert_eq!(page.status.as_u16(), status, "{uri}");
        assert!(
            page.headers[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{uri}"
        );
        assert!(page.body.contains(says), "{uri}: {}", page.body);
        assert!(page.body.contains(r#"href="/""#), "{uri}: a way out");
    }
    // API paths keep the JSON error shape.
    let api = get(&state, "/api/nowhere").await;
    assert_eq!(api.status, StatusCode::NOT_FOUND);
    assert!(api.body.starts_with(r#"{"error":"#), "{}", api.body);
    // The alert pages and forms, checked by `get` like every page here.
    for uri in ["/alerts", "/alerts/rules/new", "/help/budget-semantics"] {
        assert_eq!(get(&state, uri).await.status, StatusCode::OK, "{uri}");
    }
    // Bars are placed by classes, in steps of 0.1 %, and rows indented by depth.
    let geometry = get(&state, "/static/geometry.css").await;
    for rule in [
        ".g-l1000{left:100.0%}",
        ".g-w15{width:1.5%}",
        ".g-d0{--dl:0.0%}",
        ".g-i40{padding-left:560px}",
    ] {
        assert!(geometry.body.contains(rule), "{rule}");
    }
    let css = get(&state, "/static/app.css").await;
    assert_eq!(css.headers[header::CONTENT_TYPE], "text/css; charset=utf-8");
    assert_eq!(
        get(&state, "/static/nope.js").await.status,
        StatusCode::NOT_FOUND
    );
}

const HOSTILE: [&str; 3] = [
    "<script>alert('xss')</script>",
    "\"><img src=x onerror=alert(1)>",
    "javascript:alert(document.cookie)",
];

/// Hostile names and attributes go through the real OTLP/HTTP receiver; no page may carry
/// them as markup or as a link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_span_data_is_escaped_on_every_page() {
    let db = TestDb::sqlite();
    let server = start(&db, &["--quiet-period", "100ms"]).await;
    let mut spans = parse(
        r#"
edge server "GET /checkout" 0 900 budget=700
  edge client "GET /x" 20 850 budget=680
    inventory server "GET /x" 25 840 budget=679
"#,
    );
    // A right-to-left override in the name would reverse the text after it on the page.
    let service = &format!("{}\u{202E}kcolb", HOSTILE[0]);
    let name = HOSTILE[1];
    spans[2].service = service.to_string();
    spans[2].name = name.to_string();
    spans[0].attributes.push((
        "url.full".into(),
        budgetscope::core::model::AttrValue::String(HOSTILE[2].into()),
    ));
    spans[0].attributes.push((
        HOSTILE[1].into(),
        budgetscope::core::model::AttrValue::String(HOSTILE[0].into()),
    ));
    post_otlp(&server, &otlp_request(&spans, 3000)).await;
    let id = spans[0].trace_id.to_hex();
    // Wait for the analyzer so search, overview and hop pages have the trace.
    wait_until_searchable(&server, "limit=1", &id).await;
    let enc = budgetscope::web::pages::enc;
    let pages = [
        "/".to_string(),
        "/traces".to_string(),
        format!("/traces?service={}", enc(service)),
        format!("/traces/{id}"),
        format!("/traces/{id}?span={}", spans[0].span_id.to_hex()),
        format!(
            "/traces/{id}?span={}&q={}",
            spans[2].span_id.to_hex(),
            enc(HOSTILE[0])
        ),
        format!("/hops/{}/{}", enc(service), enc(name)),
        format!("/traces/{id}?span={}", enc(HOSTILE[1])),
        format!(
            "/traces?operation={}&attr={}",
            enc(HOSTILE[1]),
            enc(HOSTILE[0])
        ),
        format!("/nowhere/{}", enc(HOSTILE[0])),
    ];
    let trace_page = get_text(&server, &format!("/traces/{id}")).await;
    assert!(
        trace_page.contains("[U+202E]kcolb"),
        "the override is shown as a visible mark"
    );
    for path in pages {
        let body = get_text(&server, &path).await;
        let lower = body.to_lowercase();
        assert!(!lower.contains("<script>alert"), "{path}: raw script");
        assert!(!lower.contains("<img src=x"), "{path}: raw img");
        assert!(
            !lower.contains("href=\"javascript:"),
            "{path}: javascript link"
        );
        assert_eq!(
            lower.matches("<script").count(),
            1,
            "{path}: only our own script tag"
        );
        assert!(
            body.contains("&#60;script&#62;") || path == "/traces" || path.starts_with("/nowhere"),
            "{path}: the hostile text is shown, escaped"
        );
        assert!(
            !body.contains('\u{202E}'),
            "{path}: a bidirectional override reaches the page"
        );
    }
    server.shutdown().await;
}

/// While stored traces are re-analysed with the current rules, the overview says how far it
/// has got; once it has finished, it says nothing.
#[tokio::test]
async fn the_overview_says_while_stored_traces_are_re_analysed() {
    use budgetscope::pipeline::reanalysis::Progress;
    use budgetscope::web::pages::overview::reanalysing;
    let db = TestDb::sqlite();
    let store = store::open(&db.url).await.unwrap();
    let state = AppState::new(store, AnalyzeOptions::default());
    let mut status = state.status.measure().await.unwrap();
    assert_eq!(status.reanalysis, None);
    assert_eq!(reanalysing(&status), None);
    status.reanalysis = Some(Progress {
        rules_version: 2,
        tolerance_ms: 50.0,
        stale_at_start: 1200,
        done: 300,
        finished: false,
    });
    let banner = reanalysing(&status).unwrap();
    assert!(
        banner.contains("re-analysed with the current rules (version 2, tolerance 50 ms): 300 of 1200 done, newest first"),
        "{banner}"
    );
    status.reanalysis.as_mut().unwrap().finished = true;
    assert_eq!(reanalysing(&status), None);
}

/// When analysed statistics are more than a minute behind, the overview says by how much
/// and how many traces wait; once they are current, it says nothing.
#[tokio::test]
async fn the_overview_says_when_statistics_are_behind() {
    for db in TestDb::all().await {
        let store = store::open(&db.url).await.unwrap();
        let state = AppState::new(store.clone(), AnalyzeOptions::default());
        store.write_spans(&checkout_a_minute_ago()).await.unwrap();
        let current = state.status.measure().await.unwrap();
        assert!(!current.behind, "{}: {current:?}", db.backend);
        assert!(!get(&state, "/").await.body.contains("Statistics are"));
        // The trace's last commit, two minutes back: quiet for 110 s beyond the 10 s period.
        let marks = match db.backend {
            "sqlite" => "trace_marks",
            _ => "dirty_traces",
        };
        db.execute(&format!(
            "UPDATE {marks} SET received_unix_nano = received_unix_nano - 120000000000"
        ))
        .await;
        let behind = state.status.measure().await.unwrap();
        assert!(
            behind.behind && behind.analysis_lag_s >= 110.0,
            "{behind:?}"
        );
        assert_eq!(behind.traces_pending, 1);
        let page = get(&state, "/").await;
        assert!(
            page.body
                .contains(r#"<p class="behind" role="status">Statistics are 1m 5"#)
                && page.body.contains("1 traces wait for analysis"),
            "{}: {}",
            db.backend,
            page.body
        );
    }
}

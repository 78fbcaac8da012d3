//! The UI in a real browser: headless Chromium driven over WebDriver (chromedriver +
//! fantoccini). Traces come in through a real OpenTelemetry exporter and OTLP/HTTP; the
//! test opens the overview, follows a hop, searches, opens a waterfall, collapses and
//! expands a row, opens a span's details, toggles raw times, goes back, jumps by trace id,
//! finds no console errors, and writes screenshots of every page to target/screenshots/.
//!
//! Needs `chromium` and `chromedriver` (Debian: `apt-get install chromium chromium-driver`).
//! Without them the test is skipped with a message, unless `CI` or
//! `BUDGETSCOPE_REQUIRE_BROWSER` is set: then it fails.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{TestDb, post_otlp, say_skipped, start, wait_until_searchable};
use fantoccini::{Client, ClientBuilder, Locator};
use opentelemetry::trace::{
    Span as _, SpanKind, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use serde_json::{Value, json};

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

/// chromedriver, killed when dropped.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver(chromedriver: &Path) -> Driver {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    driver
}

/// edge (800 ms budget) → inventory, which takes `inventory_ms`: exported by the real SDK
/// with explicit times starting `ago` seconds ago. Returns (trace id, inventory span id).
fn export_checkout(endpoint: String, ago: u64, inventory_ms: u64) -> (String, String) {
    let edge = common::otel_provider(&endpoint, "edge");
    let inventory = common::otel_provider(&endpoint, "inventory");
    let t0 = SystemTime::now() - Duration::from_secs(ago);
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let tracer = edge.tracer("browser-test");
    let hop = tracer
        .span_builder("GET /checkout")
        .with_kind(SpanKind::Server)
        .with_start_time(at(0))
        .with_attributes([
            KeyValue::new("deadline.remaining_ms", 800_i64),
            KeyValue::new("http.request.method", "GET"),
        ])
        .start(&tracer);
    let cx = Context::current_with_span(hop);
    let call = tracer
        .span_builder("GET /stock")
        .with_kind(SpanKind::Client)
        .with_start_time(at(20))
        .with_attributes([
            KeyValue::new("deadline.remaining_ms", 780_i64),
            KeyValue::new("server.address", "inventory"),
        ])
        .start_with_context(&tracer, &cx);
    let call_cx = cx.with_span(call);
    let inventory_tracer = inventory.tracer("browser-test");
    let mut served = inventory_tracer
        .span_builder("GET /stock")
        .with_kind(SpanKind::Server)
        .with_start_time(at(22))
        .with_attributes([
            KeyValue::new("deadline.remaining_ms", 778_i64),
            KeyValue::new("db.system", "postgresql"),
        ])
        .start_with_context(&inventory_tracer, &call_cx);
    served.add_event("cache miss", vec![KeyValue::new("key", "sku-42")]);
    let span_id = served.span_context().span_id().to_string();
    served.end_with_timestamp(at(22 + inventory_ms));
    call_cx.span().end_with_timestamp(at(25 + inventory_ms));
    let trace_id = cx.span().span_context().trace_id().to_string();
    cx.span().end_with_timestamp(at(30 + inventory_ms));
    inventory.shutdown().unwrap();
    edge.shutdown().unwrap();
    (trace_id, span_id)
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("screenshot");
    std::fs::write(screenshots_dir().join(name), png).unwrap();
}

/// WebDriver endpoints fantoccini does not wrap: chromedriver's browser log and CDP.
async fn driver_call(driver: &Driver, client: &Client, path: &str, body: Value) -> Value {
    let session = client.session_id().await.unwrap().unwrap();
    let response = reqwest::Client::new()
        .post(format!("{}/session/{session}/{path}", driver.url))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

async fn console_errors(driver: &Driver, client: &Client) -> Vec<String> {
    let log = driver_call(driver, client, "se/log", json!({"type": "browser"})).await;
    log["value"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter(|e| e["level"] == "SEVERE" || e["level"] == "WARNING")
                .map(|e| e["message"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

async fn path_and_query(client: &Client) -> String {
    let url = client.current_url().await.unwrap();
    match url.query() {
        Some(q) => format!("{}?{q}", url.path()),
        None => url.path().to_string(),
    }
}

/// Waits (fantoccini's default 30 s) for the element a CSS selector finds.
async fn wait_for(client: &Client, css: &str) -> fantoccini::elements::Element {
    client
        .wait()
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css} never appeared: {e}"))
}

/// Waits (up to 30 s) until the page's path and query satisfy `done`, and returns them: a
/// submitted form's new page, not the old page that had the same elements.
async fn wait_for_url(client: &Client, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let url = path_and_query(client).await;
        if done(&url) {
            return url;
        }
        assert!(Instant::now() < deadline, "{what}: still at {url}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The text of the first element `css` selects.
async fn text_of(client: &Client, css: &str) -> String {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|_| panic!("no element {css}"))
        .text()
        .await
        .unwrap()
}

/// Clicks the element a CSS selector finds (panicking with the selector when there is none).
async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

async fn hidden_rows(client: &Client) -> u64 {
    client
        .execute(
            "return document.querySelectorAll('.wf-row[hidden]').length",
            vec![],
        )
        .await
        .unwrap()
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_in_a_real_browser() {
    let required = std::env::var_os("CI").is_some()
        || std::env::var_os("BUDGETSCOPE_REQUIRE_BROWSER").is_some();
    let (Some(chromium), Some(chromedriver)) = (
        std::env::var_os("BUDGETSCOPE_CHROMIUM")
            .map(PathBuf::from)
            .or_else(|| which("chromium"))
            .or_else(|| which("chromium-browser")),
        which("chromedriver"),
    ) else {
        assert!(
            !required,
            "chromium and chromedriver are required in CI: apt-get install -y chromium chromium-driver"
        );
        say_skipped(
            "browser test: chromium or chromedriver not found (apt-get install chromium chromium-driver)",
        );
        return;
    };

    let db = TestDb::sqlite();
    let server = start(
        &db,
        &[
            "--quiet-period",
            "200ms",
            "--alert-interval",
            "1s",
            "--alert-delay",
            "0s",
        ],
    )
    .await;
    let endpoint = format!("http://{}", server.otlp_http_addr);
    // A request of the same endpoint within budget, then the slow one (inventory 1.2 s).
    let healthy_endpoint = endpoint.clone();
    tokio::task::spawn_blocking(move || export_checkout(healthy_endpoint, 40, 100))
        .await
        .unwrap();
    let (trace_id, inventory_span) =
        tokio::task::spawn_blocking(move || export_checkout(endpoint, 8, 1200))
            .await
            .unwrap();
    // Background traffic so the charts and tables have content.
    for request in
        budgetscope::otlp::generate::generate_over(1500, 250, Duration::from_secs(3000), 0.2)
    {
        post_otlp(&server, &request).await;
    }
    // A 2,000-span trace, for the large-trace behaviour.
    let mut large = budgetscope::otlp::generate::large_trace(2000);
    let large_id = budgetscope::core::model::TraceId([0x42; 16]);
    for span in &mut large {
        span.trace_id = large_id;
    }
    for chunk in large.chunks(500) {
        post_otlp(&server, &budgetscope::otlp::download::to_request(chunk)).await;
    }
    let base = format!("http://{}", server.http_addr);
    wait_until_searchable(
        &server,
        "service=inventory&outcome=exceeded&limit=1000",
        &trace_id,
    )
    .await;

    let driver = start_driver(&chromedriver);
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("browserName".into(), json!("chrome"));
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     "--disable-background-networking", "--window-size=1280,1000",
                     "--hide-scrollbars"],
        }),
    );
    capabilities.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a WebDriver session in headless Chromium");

    // Overview → a hop.
    client.goto(&format!("{base}/?range=1h")).await.unwrap();
    wait_for(&client, "table.hops").await;
    assert_eq!(client.title().await.unwrap(), "Overview · budgetscope");
    // Every flag shows on the overview: counted per hop, or as a search.
    let columns = text_of(&client, "table.hops thead").await;
    for column in ["Doomed", "Refused", "Retries", "Wasted time"] {
        assert!(columns.contains(column), "{column} in {columns}");
    }
    for flag in ["unsafe_retry", "missing_parent"] {
        client
            .find(Locator::Css(&format!(r#"a[href*="flag={flag}"]"#)))
            .await
            .unwrap_or_else(|_| panic!("the overview links the {flag} search"));
    }
    screenshot(&client, "overview.png").await;
    client
        .find(Locator::Css(
            r#"table.hops a[href^="/hops/inventory/GET%20%2Fstock"]"#,
        ))
        .await
        .expect("the hops table lists inventory GET /stock")
        .click()
        .await
        .unwrap();
    wait_for(&client, "#budget-h").await;
    assert!(
        path_and_query(&client)
            .await
            .starts_with("/hops/inventory/GET%20%2Fstock")
    );
    let heading = text_of(&client, "h1").await;
    assert!(heading.contains("inventory GET /stock"), "{heading}");
    screenshot(&client, "hop.png").await;
    client.back().await.unwrap();
    wait_for(&client, "table.hops").await;
    assert_eq!(
        path_and_query(&client).await,
        "/?range=1h",
        "back returns to the overview"
    );
    // Where the budget ran out → the exceeded traces that ran out at that hop.
    client
        .find(Locator::Css(
            r#"ol.origins a[href^="/traces?origin_service="]"#,
        ))
        .await
        .expect("the overview lists where exceeded requests ran out")
        .click()
        .await
        .unwrap();
    wait_for_url(&client, "an origin search", |url| {
        url.contains("origin_service=") && url.contains("origin_operation=")
    })
    .await;
    wait_for(&client, "table.traces").await;
    let outcomes = client
        .find_all(Locator::Css("table.traces .outcome"))
        .await
        .unwrap();
    assert!(!outcomes.is_empty(), "the origin search finds traces");
    for outcome in outcomes {
        assert_eq!(outcome.text().await.unwrap(), "exceeded");
    }
    client.back().await.unwrap();
    wait_for(&client, "table.hops").await;

    // The service map, from the main navigation: edge calls inventory (among the other
    // tests' services), drawn and listed.
    click(&client, r#"header nav a[href="/map"]"#).await;
    wait_for(&client, "svg.map").await;
    let drawn = client
        .execute(
            "const svg = document.querySelector('svg.map');\
             const edge = svg.querySelector('.edge path');\
             return [svg.querySelectorAll('.node rect').length,\
                     edge.getBoundingClientRect().width,\
                     getComputedStyle(edge).stroke];",
            vec![],
        )
        .await
        .unwrap();
    assert!(drawn[0].as_u64().unwrap() >= 2, "the services: {drawn}");
    assert!(
        drawn[1].as_f64().unwrap() > 50.0,
        "the arrow is drawn: {drawn}"
    );
    assert_ne!(drawn[2], "none", "{drawn}");
    let edges = text_of(&client, "#edges-h + .table-wrap tbody").await;
    assert!(
        edges.contains("edge") && edges.contains("inventory"),
        "{edges}"
    );
    screenshot(&client, "map.png").await;
    click(&client, "#group-toggle").await;
    wait_for_url(&client, "the map by operation", |url| {
        url.contains("group=operation")
    })
    .await;
    wait_for(&client, "svg.map").await;
    client
        .find(Locator::Css(r#"svg.map a.node[href^="/hops/inventory/"]"#))
        .await
        .expect("an operation node opens its hop page");
    client.back().await.unwrap();
    wait_for_url(&client, "the map by service", |url| {
        !url.contains("group=operation")
    })
    .await;

    // The advisor, from the main navigation.
    click(&client, r#"header nav a[href="/advisor"]"#).await;
    wait_for(&client, "h1").await;
    let advice = text_of(&client, "main").await;
    assert!(
        advice.contains("What to change")
            && (advice.contains("finding") || advice.contains("Nothing to change")),
        "{advice}"
    );
    screenshot(&client, "advisor.png").await;
    // What if inventory refused requests with less than 500 ms: a finding's form leads
    // there when it has one; the same replay by its URL otherwise. Back returns.
    let replay = client.find(Locator::Css("form.whatif-form button")).await;
    match replay {
        Ok(button) => button.click().await.unwrap(),
        Err(_) => client
            .goto(&format!(
                "{base}/advisor/whatif?range=1h&change=min_useful_budget&service=inventory&operation=GET%20%2Fstock&value_ms=500"
            ))
            .await
            .unwrap(),
    }
    wait_for(&client, "dl.whatif").await;
    let whatif = text_of(&client, "main").await;
    assert!(
        whatif.contains("What if")
            && whatif.contains("Would have failed fast instead of failing late")
            && whatif.contains("The model."),
        "{whatif}"
    );
    screenshot(&client, "whatif.png").await;
    client.back().await.unwrap();
    wait_for_url(&client, "the advisor again", |url| {
        url.contains("/advisor") && !url.contains("whatif")
    })
    .await;

    // Search: exceeded traces of inventory, with the form.
    client.goto(&format!("{base}/traces")).await.unwrap();
    let form = client.form(Locator::Css("form.search")).await.unwrap();
    client
        .find(Locator::Css("select[name=outcome]"))
        .await
        .unwrap()
        .select_by_value("exceeded")
        .await
        .unwrap();
    client
        .find(Locator::Css("select[name=service]"))
        .await
        .unwrap()
        .select_by_value("inventory")
        .await
        .unwrap();
    form.submit().await.unwrap();
    // The page before the submit has the same table: wait for the new URL, not the table.
    wait_for_url(&client, "filters live in the URL", |url| {
        url.contains("service=inventory") && url.contains("outcome=exceeded")
    })
    .await;
    wait_for(&client, "table.traces").await;
    screenshot(&client, "traces.png").await;

    // The waterfall.
    client
        .find(Locator::Css(&format!(
            r#"table.traces a[href="/traces/{trace_id}"]"#
        )))
        .await
        .expect("the exported trace is in the results")
        .click()
        .await
        .unwrap();
    wait_for(&client, ".waterfall").await;
    let verdict = text_of(&client, ".verdict").await;
    assert!(
        verdict.starts_with("Exceeded: answered in ")
            && verdict
                .contains(" of its 800 ms budget. The budget ran out at inventory GET /stock ")
            && verdict.contains(
                ", which spent 1.2 s on its own work, the longest part of the critical path (1.2 s).",
            ),
        "{verdict}"
    );
    // Collapse the root: its descendants hide; expand: they come back.
    assert_eq!(hidden_rows(&client).await, 0);
    let toggle = client
        .find(Locator::Css(".wf-row button.tog"))
        .await
        .unwrap();
    toggle.click().await.unwrap();
    assert_eq!(
        hidden_rows(&client).await,
        2,
        "collapsed: the call and the inventory hop"
    );
    assert_eq!(
        toggle.attr("aria-expanded").await.unwrap().as_deref(),
        Some("false")
    );
    toggle.click().await.unwrap();
    assert_eq!(hidden_rows(&client).await, 0, "expanded again");
    click(&client, "[data-collapse-all]").await;
    assert_eq!(hidden_rows(&client).await, 2);
    click(&client, "[data-expand-all]").await;
    assert_eq!(hidden_rows(&client).await, 0);

    // A span's details.
    click(&client, &format!("#row-{inventory_span} .wf-name a")).await;
    let detail = wait_for(&client, "aside.detail").await;
    let text = detail.text().await.unwrap();
    assert!(
        text.contains("deadline.remaining_ms") && text.contains("cache miss"),
        "{text}"
    );
    assert!(
        path_and_query(&client)
            .await
            .contains(&format!("span={inventory_span}"))
    );
    client
        .execute("window.scrollTo(0, 0)", vec![])
        .await
        .unwrap();
    screenshot(&client, "trace.png").await;
    // Bars are placed by the stylesheet's classes (the policy allows no inline style):
    // inventory's own 1.49 s take most of the 1.54 s trace's width.
    let share = client
        .execute(
            "const bar = document.querySelector('#row-' + arguments[0] + ' .wf-bar .bar');\
             return bar.getBoundingClientRect().width / bar.parentElement.getBoundingClientRect().width;",
            vec![json!(inventory_span)],
        )
        .await
        .unwrap();
    assert!(share.as_f64().unwrap() > 0.5, "inventory's bar: {share}");

    // The critical path: every row of this chain, each bar underlined in its colour; the
    // toggle hides it and the browser's back button brings it back.
    let marked = |client: &Client| {
        let client = client.clone();
        async move {
            client
                .execute(
                    "return Array.from(document.querySelectorAll('.wf-row.crit .bar:not(.over)'))\
                     .filter(b => getComputedStyle(b).boxShadow !== 'none').length;",
                    vec![],
                )
                .await
                .unwrap()
                .as_u64()
                .unwrap()
        }
    };
    assert_eq!(marked(&client).await, 3, "the critical path is drawn");
    click(&client, "#critical-toggle").await;
    wait_for_url(&client, "the critical path hidden", |url| {
        url.contains("critical=off")
    })
    .await;
    wait_for(&client, ".waterfall").await;
    assert_eq!(marked(&client).await, 0, "hidden");
    client.back().await.unwrap();
    wait_for_url(&client, "the critical path shown", |url| {
        !url.contains("critical=off")
    })
    .await;
    wait_for(&client, ".waterfall").await;
    assert_eq!(marked(&client).await, 3, "back shows it again");

    // Beside a typical request of the same endpoint: the healthy one exported first.
    click(&client, "#compare-typical").await;
    wait_for(&client, "table.compare").await;
    let told = text_of(&client, "ul.differences").await;
    assert!(
        told.contains("inventory GET /stock spent 1.1 s less on its own work in B"),
        "{told}"
    );
    let marked_cells = client
        .execute(
            "return Array.from(document.querySelectorAll('table.compare td.diff'))\
             .filter(c => getComputedStyle(c).backgroundColor !== 'rgba(0, 0, 0, 0)').length;",
            vec![],
        )
        .await
        .unwrap();
    assert!(marked_cells.as_u64().unwrap() >= 2, "{marked_cells}");
    screenshot(&client, "compare.png").await;
    // The healthy request: 130 ms on the axis, budgets of about 800 ms. Each budget band
    // ends at the axis' end instead of running over the numbers beside it.
    click(&client, "#b-h a").await;
    wait_for(&client, ".waterfall").await;
    let overflow = client
        .execute(
            "return Array.from(document.querySelectorAll('.wf-bar .win')).map(w =>\
             w.getBoundingClientRect().right - w.parentElement.getBoundingClientRect().right);",
            vec![],
        )
        .await
        .unwrap();
    let bands = overflow.as_array().unwrap();
    assert!(!bands.is_empty(), "budget bands are drawn");
    assert!(
        // Within a pixel: left and width are each rounded to a thousandth of the column.
        bands.iter().all(|px| px.as_f64().unwrap() <= 1.0),
        "a band runs past the bar column: {overflow}"
    );
    client.back().await.unwrap();
    wait_for(&client, "table.compare").await;
    client.back().await.unwrap();
    wait_for(&client, ".waterfall").await;

    // Raw times, then back to the adjusted view with the browser's back button.
    client
        .find(Locator::Id("times-toggle"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .wait()
        .for_element(Locator::XPath(
            "//a[@id='times-toggle'][contains(., 'skew-adjusted')]",
        ))
        .await
        .unwrap();
    assert!(path_and_query(&client).await.contains("times=raw"));
    client.back().await.unwrap();
    client
        .wait()
        .for_element(Locator::XPath(
            "//a[@id='times-toggle'][contains(., 'raw times')]",
        ))
        .await
        .unwrap();
    assert!(!path_and_query(&client).await.contains("times=raw"));

    // The trace-id box.
    client.goto(&format!("{base}/traces")).await.unwrap();
    let jump = client.find(Locator::Id("jump-id")).await.unwrap();
    jump.send_keys(&trace_id).await.unwrap();
    client
        .form(Locator::Css("form.jump"))
        .await
        .unwrap()
        .submit()
        .await
        .unwrap();
    wait_for(&client, ".waterfall").await;
    assert_eq!(path_and_query(&client).await, format!("/traces/{trace_id}"));

    // A big trace opens with deep subtrees collapsed; expanding one fetches its rows.
    client
        .goto(&format!("{base}/traces/{}", large_id.to_hex()))
        .await
        .unwrap();
    wait_for(&client, ".waterfall").await;
    let count = |client: Client| async move {
        client
            .execute("return document.querySelectorAll('.wf-row').length", vec![])
            .await
            .unwrap()
            .as_u64()
            .unwrap()
    };
    let before = count(client.clone()).await;
    assert!(
        before < 200,
        "a 2,000-span trace starts collapsed: {before} rows"
    );
    client
        .find(Locator::Css(".wf-row[data-lazy] button.tog"))
        .await
        .expect("a collapsed row whose children load on demand")
        .click()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while count(client.clone()).await <= before {
        assert!(Instant::now() < deadline, "the children never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    screenshot(&client, "trace-large.png").await;

    // A friendly error page.
    client
        .goto(&format!("{base}/traces/0123456789abcdef0123456789abcdef"))
        .await
        .unwrap();
    let error = text_of(&client, ".error-page").await;
    assert!(error.contains("Trace not found"), "{error}");
    screenshot(&client, "not-found.png").await;
    // The 404 itself is logged by Chromium as a failed resource; it is the expected answer.
    let errors: Vec<String> = console_errors(&driver, &client)
        .await
        .into_iter()
        .filter(|e| !e.contains("status of 404"))
        .collect();
    assert!(errors.is_empty(), "console errors: {errors:#?}");

    // An alert rule from a hop page: the form comes filled in for the hop, the backtest
    // shows under it without saving, and saving (a same-origin form post, which the
    // cross-site check lets through) leads to the rule's page.
    client
        .goto(&format!("{base}/hops/inventory/GET%20%2Fstock"))
        .await
        .unwrap();
    click(&client, "a[href^='/alerts/rules/new']").await;
    wait_for_url(&client, "the new-rule form", |url| {
        url.starts_with("/alerts/rules/new")
    })
    .await;
    let service = wait_for(&client, "input[name=service]").await;
    assert_eq!(
        service.prop("value").await.unwrap().as_deref(),
        Some("inventory")
    );
    client
        .find(Locator::Css("input[name=name]"))
        .await
        .unwrap()
        .send_keys("inventory-burning")
        .await
        .unwrap();
    click(&client, "button[value=backtest]").await;
    let summary = wait_for(&client, "#bt-h + p").await.text().await.unwrap();
    assert!(
        summary.contains("in the last 24 hours") && summary.contains("over 1 hop)"),
        "{summary}"
    );
    screenshot(&client, "alert-rule-form.png").await;
    click(&client, "button[value=save]").await;
    wait_for_url(&client, "the saved rule's page", |url| {
        url == "/alerts/rules/inventory-burning"
    })
    .await;
    let facts = wait_for(&client, "dl.facts").await.text().await.unwrap();
    assert!(
        facts.contains("local_exceed_ratio > 0.05 over 5m for 2m"),
        "{facts}"
    );
    screenshot(&client, "alert-rule.png").await;
    client.goto(&format!("{base}/alerts")).await.unwrap();
    let rules = wait_for(&client, "#rules-h + div table")
        .await
        .text()
        .await
        .unwrap();
    assert!(rules.contains("inventory-burning"), "{rules}");
    screenshot(&client, "alerts.png").await;
    let errors = console_errors(&driver, &client).await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");

    // Dark mode and a phone-sized window.
    driver_call(
        &driver,
        &client,
        "goog/cdp/execute",
        json!({"cmd": "Emulation.setEmulatedMedia",
               "params": {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}}),
    )
    .await;
    client.goto(&format!("{base}/?range=1h")).await.unwrap();
    wait_for(&client, "table.hops").await;
    screenshot(&client, "overview-dark.png").await;
    client.set_window_size(390, 844).await.unwrap();
    client
        .goto(&format!("{base}/traces/{trace_id}?span={inventory_span}"))
        .await
        .unwrap();
    wait_for(&client, "aside.detail").await;
    client
        .execute("window.scrollTo(0, 0)", vec![])
        .await
        .unwrap();
    screenshot(&client, "trace-phone-dark.png").await;
    let errors = console_errors(&driver, &client).await;
    assert!(errors.is_empty(), "console errors: {errors:#?}");

    client.close().await.unwrap();
    server.shutdown().await;
}

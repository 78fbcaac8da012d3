//! What each page says: snapshots of the visible text of the pages, rendered through the
//! router (`web::app(state).oneshot`, no socket) from a small fixed trace. A change to a
//! page's words or numbers shows as a diff here; `UPDATE_EXPECT=1 cargo test --test
//! page_snapshots` accepts a deliberate one. Markup, styles and charts are left out (the
//! browser test looks at those).

mod common;

use budgetscope::core::analyze::AnalyzeOptions;
use budgetscope::web::AppState;
use common::{TestDb, fixture_trace, oneshot};
use expect_test::{Expect, expect};

/// The inflated checkout of docs/budget-semantics.md, at the fixtures' fixed time
/// (2023-11-14T22:13:20Z), and a healthy request a second later.
async fn state() -> (TestDb, AppState) {
    let db = TestDb::sqlite();
    let store = budgetscope::store::open(&db.url).await.unwrap();
    let mut spans = fixture_trace(
        1,
        r#"
edge server "GET /checkout" 0 1540 budget=800
  edge client "GET /stock" 20 1500 budget=5000
    inventory server "GET /stock" 25 1490 budget=5000
"#,
    );
    spans.extend(fixture_trace(
        2,
        r#"
edge server "GET /checkout" 1000 120 budget=800
  edge client "GET /stock" 1010 100 budget=700
    inventory server "GET /stock" 1012 96 budget=698
"#,
    ));
    store.write_spans(&spans).await.unwrap();
    common::analyse_waiting(store.as_ref()).await;
    (db, AppState::new(store, AnalyzeOptions::default()))
}

/// The fixtures' hour, as a custom range every page accepts.
const RANGE: &str = "since=2023-11-14T22:00:00Z&until=2023-11-14T23:00:00Z";

/// The text a reader sees: tags, scripts, styles and charts removed, one line per block.
fn visible_text(html: &str) -> String {
    let mut text = String::new();
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        text.push_str(&rest[..start]);
        let tag = &rest[start..];
        let name: String = tag[1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        // Whole elements whose content is not read as text.
        let skip_to = ["script", "style", "svg"]
            .iter()
            .find(|n| **n == name)
            .and_then(|n| tag.find(&format!("</{n}>")).map(|end| end + n.len() + 3));
        let end = match skip_to {
            Some(end) => end,
            None => tag.find('>').map_or(tag.len(), |end| end + 1),
        };
        if matches!(
            name.as_str(),
            "p" | "div" | "tr" | "li" | "h1" | "h2" | "h3" | "section" | "header" | "br" | "table"
        ) {
            text.push('\n');
        } else {
            text.push(' ');
        }
        rest = &tag[end..];
    }
    text.push_str(rest);
    let text = text
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#x27;", "'")
        .replace("&#39;", "'");
    text.lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

async fn check(state: &AppState, uri: &str, expected: Expect) {
    let (status, _, body) = oneshot(state, uri).await;
    assert_eq!(status, 200, "{uri}: {body}");
    expected.assert_eq(&visible_text(&body));
}

#[tokio::test]
async fn the_budget_waterfall_says_where_the_budget_went() {
    let (_db, state) = state().await;
    let id = budgetscope::core::model::TraceId([1; 16]).to_hex();
    check(&state, &format!("/traces/{id}"), expect![[r#"
        edge GET /checkout · budgetscope
        Skip to content
        budgetscope
        Overview
        Traces
        Map
        Advisor
        Alerts
        Trace id
        Open
        edge GET /checkout 01010101010101010101010101010101
        Exceeded: answered in 1.54 s of its 800 ms budget. The budget ran out at edge GET /checkout (deadline passed while waiting on inventory, which was sent more time than was left). The critical path ran longest through inventory GET /stock (1.49 s on it).
        Duration 1.54 s
        Request budget 800 ms
        Spans 3
        Services 2
        Started 2023-11-14 22:13:20 UTC
        inflated overspent local exceed
        Expand all
        Collapse all
        Show raw times
        Hide the critical path
        Highlight spans
        Find
        Download OTLP JSON
        API JSON
        Compare with a typical request within budget
        Service and span (skew-adjusted)
        0.0 ms 385 ms 770 ms 1.16 s 1.54 s
        Duration
        Budget
        Self
        Burn
        The vertical line marks the request deadline at 800 ms.
        ◆ critical path : the work that decided when the request answered
        ▾ ◆ On the critical path: 40 ms of its own edge GET /checkout hop ran out here overspent : answered 740 ms after its deadline (1540 ms of a 800 ms budget) local exceed : deadline passed while waiting on inventory, which was sent more time than was left
        ran 740 ms past its deadline
        1.54 s
        800 ms
        40 ms
        5.0 %
        ▾ ◆ On the critical path: 10 ms of its own edge GET /stock call inflated : forwarded 5000 ms with 780 ms left
        ran 720 ms past its deadline
        1.5 s
        5 s
        –
        –
        ◆ On the critical path: 1.49 s of its own inventory GET /stock hop
        1.49 s
        5 s
        1.49 s
        186 %
        budgetscope · times in UTC · What the flags mean · Instrumenting a service · JSON API"#]]).await;
}

#[tokio::test]
async fn the_hop_page_says_how_its_requests_went() {
    let (_db, state) = state().await;
    check(
        &state,
        &format!("/hops/edge/GET%20%2Fcheckout?{RANGE}"),
        expect![[r#"
            edge GET /checkout · budgetscope
            Skip to content
            budgetscope
            Overview
            Traces
            Map
            Advisor
            Alerts
            Trace id
            Open
            Overview › hop
            edge GET /checkout 2023-11-14 22:00:00 UTC to 2023-11-14 23:00:00 UTC
            15 min 1 hour 6 hours 24 hours 7 days
            Custom
            From
            To
            Apply
            Requests 2
            Ran out here 1
            Local exceed 1
            Inherited exceed 0
            Overspent 1
            Inflated 1
            Dropped 0
            Doomed 0
            Refused 0
            Retries 0
            Wasted 0.0 ms
            Budget p50 793 ms
            Budget p95 793 ms
            Budget p99 793 ms
            Burn p50 2.4 %
            Burn p95 4.8 %
            Self p95 42 ms
            Critical path, mean 37 ms
            Critical hop of exceeded 0.0 % of 1 (on the path of 1)
            All traces through this hop → · Alert on this hop…
            Advice
            Nothing to change in this range for this hop or its calls ( what the advisor checks ).
            Deadline exceeded over time
            From the analysed traces.
            Budget received
            Requests by the budget they arrived with; at or below 0 they were already spent.
            Burn
            Share of the request budget spent in this hop's own code (self time ÷ request budget).
            Who sends it already-spent requests
            No request arrived here with its budget already spent.
            Recent flagged traces
            Started Root Outcome Budget Answered in This hop Elsewhere in the trace
            2023-11-14 22:13:20 UTC edge GET /checkout exceeded 800 ms 1.54 s
            ran out here inflated overspent local exceed
            budgetscope · times in UTC · What the flags mean · Instrumenting a service · JSON API"#]],
    )
    .await;
}

#[tokio::test]
async fn the_overview_and_the_search_say_what_happened_in_the_range() {
    let (_db, state) = state().await;
    check(&state, &format!("/?{RANGE}"), expect![[r#"
        Overview · budgetscope
        Skip to content
        budgetscope
        Overview
        Traces
        Map
        Advisor
        Alerts
        Trace id
        Open
        Where the budget went 2023-11-14 22:00:00 UTC to 2023-11-14 23:00:00 UTC
        15 min 1 hour 6 hours 24 hours 7 days
        Custom
        From
        To
        Apply
        4 requests through hops
        1 local exceed deadline passed in the hop
        0 inherited exceed arrived already spent
        Exceeded traces →
        Deadline exceeded over time
        Numbers
        Interval Local Inherited
        22:13 1 0
        Where the budget ran out
        Exceeded requests by origin hop: where the budget ran out, not where it was noticed (hops called after it only inherited the exceed). How origins are found · How budget flows between services: the map
        edge GET /checkout
        1 exceeded request ran out here
        Top budget burners
        p95 share of the request budget a hop spends in its own code; a burner that is rarely the critical hop of exceeded requests did not make them late.
        inventory GET /stock
        burn p95 184 % · self p95 1.45 s · 2 requests · critical hop of 100 % of 1 exceeded
        edge GET /checkout
        burn p95 4.8 % · self p95 42 ms · 2 requests · critical hop of 0.0 % of 1 exceeded
        What the flags mean
        inflated forwarded more budget than it had left dropped called on without passing a budget overspent kept working past its own deadline inherited exceed arrived with its budget already spent upstream local exceed its deadline passed while it was working doomed called on when its own budget was already spent refused declined work it could not finish in time (good) retry a repeated call to the same target unsafe retry retried a non-idempotent call wasted kept working after its caller gave up missing parent its parent span was never received
        Hops
        Service Operation Requests Local exceed ▼ Inherited exceed Overspent Inflated Dropped Doomed Refused Retries Budget p50 Budget p95 Burn p95 Wasted time
        edge
        GET /checkout
        2
        1
        0
        1
        1
        0
        0
        0
        0
        793 ms
        793 ms
        4.8 %
        0.0 ms
        inventory
        GET /stock
        2
        0
        0
        0
        0
        0
        0
        0
        0
        727 ms
        4.89 s
        184 %
        0.0 ms
        Two flags are not counted per hop, being about a request rather than a hop's budget: traces with an unsafe retry (retried without an idempotency key after an unknown outcome) and traces with a missing parent (a span whose parent never arrived). Deadline metrics under a hop count what the service saw itself, for every request; the traces are sampled, but their analysis also finds exceeds a service cannot see itself (a deadline that passed while it waited on a call, an unattributed overrun), so they can count more.
        budgetscope · times in UTC · What the flags mean · Instrumenting a service · JSON API"#]]).await;
    check(
        &state,
        &format!("/traces?outcome=exceeded&{RANGE}"),
        expect![[r#"
            Traces · budgetscope
            Skip to content
            budgetscope
            Overview
            Traces
            Map
            Advisor
            Alerts
            Trace id
            Open
            Traces
            Service
            any service edge inventory
            Outcome
            any outcome exceeded within budget no budget too large to analyse
            Flag
            any flag inflated dropped overspent inherited exceed local exceed doomed refused retry unsafe retry wasted missing parent
            Min duration (ms)
            Max duration (ms)
            Min budget (ms)
            Max budget (ms)
            From
            To
            Operation
            Ran out at service
            Ran out at operation
            Results per page
            Attribute
            Search Reset
            1 newest matching traces, newest first.
            Started Root Outcome Budget Answered in Duration Budget used Flags Spans
            2023-11-14 22:13:20 UTC
            010101010101
            edge GET /checkout
            burner: inventory GET /stock (1.49 s)
            exceeded
            ran out at edge GET /checkout
            800 ms
            1.54 s
            1.54 s
            inflated overspent local exceed
            3
            budgetscope · times in UTC · What the flags mean · Instrumenting a service · JSON API"#]],
    )
    .await;
}

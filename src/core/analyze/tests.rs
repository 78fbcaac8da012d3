//! One test per flag (positive and negative) and the scenarios of the analysis issue, on
//! plain-text fixtures (`fixture.rs`).

use expect_test::{Expect, expect};

use super::fixture::{parse, shift_service};
use super::{AnalyzeOptions, Exceed, Flag, Outcome, analyze, text};
use crate::core::model::Span;

fn run(spans: &[Span]) -> super::Analysis {
    analyze(spans, &AnalyzeOptions::default())
}

/// The flags of the first span named `name`.
fn flags(spans: &[Span], name: &str) -> Vec<&'static str> {
    let analysis = run(spans);
    let row = analysis
        .rows
        .iter()
        .find(|row| spans[row.span].name == name)
        .unwrap_or_else(|| panic!("no span named {name}"));
    row.flags.iter().map(|f| f.flag.as_str()).collect()
}

fn all_flags(spans: &[Span]) -> Vec<(String, &'static str)> {
    let analysis = run(spans);
    analysis
        .rows
        .iter()
        .flat_map(|row| {
            row.flags
                .iter()
                .map(move |f| (spans[row.span].name.clone(), f.flag.as_str()))
        })
        .collect()
}

fn check(fixture: &str, expected: Expect) {
    let spans = parse(fixture);
    expected.assert_eq(&text::render(&spans, &run(&spans)));
}

pub(super) const CHAIN: &str = r#"
edge server "GET /checkout" 0 640 budget=700
  edge client "orders" 20 600 budget=680
    orders server "POST /orders" 22 596 budget=678
      orders client "inventory" 60 500 budget=640
        inventory server "GET /stock" 61 498 budget=639
          inventory client "pricing" 100 400 budget=600
            pricing server "GET /price" 101 398 budget=599
"#;

#[test]
fn a_chain_that_subtracts_its_own_time_has_no_flag() {
    check(
        CHAIN,
        expect![[r#"
            ok · budget 700 ms · 640 ms · burner pricing GET /price (398 ms self)
            edge GET /checkout hop @0.0 +640 budget=700 self=40 burn=0.06
              edge orders call @20 +600 budget=680 left=680
                orders POST /orders hop @22 +596 budget=678 self=96 burn=0.14
                  orders inventory call @60 +500 budget=640 left=640
                    inventory GET /stock hop @61 +498 budget=639 self=98 burn=0.14
                      inventory pricing call @100 +400 budget=600 left=600
                        pricing GET /price hop @101 +398 budget=599 self=398 burn=0.57
        "#]],
    );
}

#[test]
fn a_fresh_5s_timeout_inside_a_1s_budget_is_inflated() {
    let spans = parse(
        r#"
edge server "GET /" 0 300 budget=1000
  edge client "billing" 100 150 budget=5000
    billing server "Charge" 101 148 budget=5000
"#,
    );
    assert_eq!(flags(&spans, "billing"), ["inflated"]);
    let analysis = run(&spans);
    assert_eq!(
        analysis.rows[1].flags[0].message,
        "forwarded 5000 ms with 900 ms left"
    );
    assert!(
        flags(&spans, "Charge").is_empty(),
        "the hop got what its caller sent"
    );
}

#[test]
fn a_hop_that_receives_more_than_its_caller_sent_is_inflated() {
    let spans = parse(
        r#"
edge server "GET /" 0 300 budget=1000
  edge client "billing" 10 150 budget=310
    billing server "Charge" 11 148 budget=2000
"#,
    );
    let analysis = run(&spans);
    assert_eq!(analysis.rows[2].flags[0].flag, Flag::Inflated);
    assert_eq!(
        analysis.rows[2].flags[0].message,
        "received 2000 ms, caller sent 310 ms"
    );
}

#[test]
fn grpc_rounding_of_22ms_more_is_not_inflated() {
    let spans = parse(
        r#"
edge server "GET /" 0 300 budget=1000
  edge client "inventory.Reserve" 10 150 budget=985
    inventory server "inventory.Reserve" 11 148 budget=1007
"#,
    );
    assert!(all_flags(&spans).is_empty(), "{:?}", all_flags(&spans));
}

#[test]
fn a_budget_lost_between_services_is_dropped() {
    let spans = parse(
        r#"
orders server "POST /orders" 0 300 budget=800
  orders client "inventory" 10 150 budget=780
    inventory server "GET /stock" 11 148
"#,
    );
    assert_eq!(flags(&spans, "GET /stock"), ["dropped"]);
    assert_eq!(
        run(&spans).rows[2].flags[0].message,
        "budget lost between orders and inventory"
    );
    // A hop whose caller forwarded nothing has nothing to drop.
    let spans = parse(
        r#"
orders server "POST /orders" 0 300 budget=800
  orders client "inventory" 10 150
    inventory server "GET /stock" 11 148
"#,
    );
    assert!(all_flags(&spans).is_empty());
}

#[test]
fn answering_after_the_deadline_is_overspent_within_tolerance_is_not() {
    let late = parse(r#"edge server "GET /" 0 900 budget=700"#);
    assert_eq!(flags(&late, "GET /"), ["overspent", "local_exceed"]);
    assert_eq!(
        run(&late).rows[0].flags[0].message,
        "answered 200 ms after its deadline (900 ms of a 700 ms budget)"
    );
    assert_eq!(run(&late).outcome, Outcome::Exceeded);
    let close = parse(r#"edge server "GET /" 0 740 budget=700"#);
    assert!(flags(&close, "GET /").is_empty());
    assert_eq!(run(&close).outcome, Outcome::Ok);
}

#[test]
fn arriving_with_no_budget_left_is_inherited_not_local() {
    let spans = parse(
        r#"
edge server "GET /" 0 1200 budget=1000
  edge client "billing" 1100 60 budget=-100
    billing server "Charge" 1101 40 budget=-100
"#,
    );
    let analysis = run(&spans);
    let charge = &analysis.rows[2];
    assert_eq!(charge.exceed, Some(Exceed::Inherited));
    assert_eq!(
        charge.flags[0].message,
        "arrived with -100 ms: already spent upstream"
    );
    assert_eq!(flags(&spans, "Charge"), ["inherited_exceed"]);
    // The caller called 100 ms after its own deadline: doomed, and that exceed is its own.
    assert_eq!(flags(&spans, "billing"), ["doomed"]);
    assert_eq!(
        analysis.rows[1].flags[0].message,
        "called billing 100 ms after its deadline"
    );
    assert_eq!(analysis.rows[0].exceed, Some(Exceed::Local));
}

#[test]
fn the_exceed_belongs_downstream_when_the_deadline_passed_while_waiting() {
    let spans = parse(
        r#"
edge server "GET /" 0 1000 budget=800
  edge client "inventory" 10 980 budget=790
    inventory server "GET /stock" 11 978 budget=789
"#,
    );
    let analysis = run(&spans);
    assert_eq!(
        flags(&spans, "GET /"),
        ["overspent"],
        "late, but not its own doing"
    );
    assert_eq!(analysis.rows[0].exceed, None);
    assert_eq!(analysis.rows[2].exceed, Some(Exceed::Local));
    assert_eq!(flags(&spans, "GET /stock"), ["overspent", "local_exceed"]);
    assert_eq!(
        analysis.rows[2].flags[1].message,
        "deadline passed during its own work"
    );
    // Time in an uninstrumented dependency is the hop's own work.
    let spans = parse(
        r#"
edge server "GET /" 0 1000 budget=800
  edge client "redis GET" 10 980 budget=790
"#,
    );
    assert_eq!(flags(&spans, "GET /"), ["overspent", "local_exceed"]);
    assert_eq!(run(&spans).rows[0].self_ms, Some(1000.0));
}

#[test]
fn declining_work_that_cannot_finish_is_refused() {
    let spans = parse(r#"inventory server "GET /stock" 0 3 budget=40 grpc-status=4"#);
    assert_eq!(flags(&spans, "GET /stock"), ["refused"]);
    // Work that made calls, or took most of the budget, is not a refusal; the latter was
    // cancelled at its deadline, where its request ran out.
    let slow = parse(r#"inventory server "GET /stock" 0 30 budget=40 http-status=504"#);
    assert_eq!(flags(&slow, "GET /stock"), ["local_exceed"]);
    let called = parse(
        r#"
inventory server "GET /stock" 0 5 budget=400 http-status=504
  inventory client "db" 1 2
"#,
    );
    // It failed with a deadline status far from its deadline, after a call to an
    // uninstrumented dependency: nothing explains where the budget went, so the request
    // is counted at its edge hop as unattributed.
    assert_eq!(flags(&called, "GET /stock"), ["local_exceed"]);
    let analysis = run(&called);
    assert!(
        analysis.rows[0].flags[0]
            .message
            .starts_with("unattributed"),
        "{:?}",
        analysis.rows[0].flags
    );
}

#[test]
fn repeated_calls_to_one_target_are_retries() {
    let spans = parse(
        r#"
edge server "GET /" 0 700 budget=1000
  edge client "POST /charge" 10 200 budget=990 method=POST attr:server.address=billing
  edge client "POST /charge" 220 200 budget=780 method=POST attr:server.address=billing
  edge client "POST /charge" 430 200 budget=570 method=POST attr:server.address=billing attr:http.request.header.idempotency-key=k1
  edge client "GET /stock" 10 100 budget=990 attr:server.address=inventory
"#,
    );
    let analysis = run(&spans);
    let messages: Vec<(Option<u32>, Vec<String>)> = analysis.rows[1..]
        .iter()
        .map(|row| {
            (
                row.attempt,
                row.flags
                    .iter()
                    .map(|f| format!("{}: {}", f.flag.as_str(), f.message))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        messages,
        [
            (Some(1), vec![]),
            (Some(1), vec![]),
            (
                Some(2),
                vec![
                    "retry: attempt 2 of 3".into(),
                    "unsafe_retry: POST retried without an idempotency key after an attempt with no known outcome: may have charged twice".into()
                ]
            ),
            (Some(3), vec!["retry: attempt 3 of 3".into()]),
        ]
    );
}

#[test]
fn overlapping_calls_are_not_retries_and_answered_attempts_are_safe() {
    let parallel = parse(
        r#"
edge server "GET /" 0 700 budget=1000
  edge client "POST /charge" 10 200 method=POST attr:server.address=billing
  edge client "POST /charge" 20 200 method=POST attr:server.address=billing
"#,
    );
    assert!(
        all_flags(&parallel).is_empty(),
        "{:?}",
        all_flags(&parallel)
    );
    let answered = parse(
        r#"
edge server "GET /" 0 700 budget=1000
  edge client "POST /charge" 10 200 method=POST http-status=503 attr:server.address=billing
  edge client "POST /charge" 220 200 method=POST http-status=200 attr:server.address=billing
"#,
    );
    assert_eq!(
        all_flags(&answered),
        [("POST /charge".to_string(), "retry")]
    );
}

#[test]
fn several_child_hops_under_one_call_span_are_retries() {
    let spans = parse(
        r#"
edge server "GET /" 0 700 budget=1000
  edge client "POST /charge" 10 600 budget=990 method=POST
    billing server "POST /charge" 11 200 budget=989 http-status=504
    billing server "POST /charge" 220 200 budget=780 http-status=504
    billing server "POST /charge" 430 170 budget=570 http-status=200
"#,
    );
    let analysis = run(&spans);
    assert_eq!(flags(&spans, "POST /charge"), ["retry", "unsafe_retry"]);
    assert_eq!(
        analysis.rows[1].flags[0].message,
        "3 attempts in one call span"
    );
    let attempts: Vec<Option<u32>> = analysis.rows[2..].iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, [Some(1), Some(2), Some(3)]);
    assert_eq!(analysis.calls_reaching["billing"], 3);
}

#[test]
fn working_after_the_caller_gave_up_is_wasted() {
    let spans = parse(
        r#"
edge server "GET /" 0 300 budget=1000
  edge client "report" 10 100 budget=990
    reports server "POST /report" 11 1300 budget=989
"#,
    );
    let analysis = run(&spans);
    assert!(flags(&spans, "POST /report").contains(&"wasted"));
    assert_eq!(analysis.rows[2].wasted_ms, Some(1200.0));
    assert_eq!(
        analysis.rows[2]
            .flags
            .iter()
            .find(|f| f.flag == Flag::Wasted)
            .unwrap()
            .message,
        "1200 ms of work nobody read"
    );
    let fine = parse(
        r#"
edge server "GET /" 0 300 budget=1000
  edge client "report" 10 100 budget=990
    reports server "POST /report" 11 130 budget=989
"#,
    );
    assert!(all_flags(&fine).is_empty());
}

#[test]
fn a_parent_outside_the_trace_is_flagged_and_shown_as_a_root() {
    let spans = parse(
        r#"
edge server "GET /" 0 300 budget=1000
inventory server "GET /stock" 50 100 budget=500 parent=missing
"#,
    );
    let analysis = run(&spans);
    assert_eq!(analysis.rows[1].depth, 0);
    assert_eq!(flags(&spans, "GET /stock"), ["missing_parent"]);
    assert!(
        analysis.rows[1].flags[0]
            .message
            .starts_with("parent 000000000000dead is not in this trace")
    );
    assert!(flags(&spans, "GET /").is_empty());
}

#[test]
fn clock_skew_of_5s_either_way_raises_no_flag_and_is_shown_as_a_shift() {
    for skew in [5000.0, -5000.0] {
        let mut spans = parse(CHAIN);
        shift_service(&mut spans, "inventory", skew);
        assert!(
            all_flags(&spans).is_empty(),
            "skew {skew}: {:?}",
            all_flags(&spans)
        );
        let analysis = run(&spans);
        let stock = analysis
            .rows
            .iter()
            .find(|r| spans[r.span].name == "GET /stock")
            .unwrap();
        assert!(
            (stock.skew_shift_ms + skew).abs() < 2.0,
            "skew {skew}: shift {}",
            stock.skew_shift_ms
        );
        assert!(
            stock.start_offset_ms >= 60.0 && stock.start_offset_ms <= 62.0,
            "{}",
            stock.start_offset_ms
        );
        // Its own calls move with it; pricing, whose clock is right, ends up unshifted.
        let call = analysis
            .rows
            .iter()
            .find(|r| spans[r.span].name == "pricing")
            .unwrap();
        assert_eq!(call.skew_shift_ms, stock.skew_shift_ms);
        let price = analysis
            .rows
            .iter()
            .find(|r| spans[r.span].name == "GET /price")
            .unwrap();
        assert!(price.skew_shift_ms.abs() < 2.0, "{}", price.skew_shift_ms);
    }
}

#[test]
fn three_layers_each_retrying_twice_with_fresh_budgets_reach_the_leaf_27_times() {
    // Every layer makes 3 attempts downstream, each with a fresh 1 s timeout.
    let fixture = crate::core::analyze::fixture::retry_storm(true);
    let spans = parse(&fixture);
    let analysis = run(&spans);
    assert_eq!(analysis.calls_reaching["leaf"], 27);
    assert_eq!(analysis.calls_reaching["b"], 9);
    assert_eq!(analysis.calls_reaching["a"], 3);
    assert_eq!(analysis.flag_counts[&Flag::Retry], 2 + 3 * 2 + 9 * 2);
    assert!(
        analysis.flag_counts[&Flag::Inflated] > 0,
        "fresh budgets exceed what was left"
    );
}

#[test]
fn a_trace_without_budgets_has_no_budget_outcome() {
    let spans = parse(
        r#"
edge server "GET /" 0 300
  edge client "x" 10 100
"#,
    );
    let analysis = run(&spans);
    assert_eq!(analysis.outcome, Outcome::NoBudget);
    assert_eq!(analysis.budget_ms, None);
    assert!(analysis.rows.iter().all(|r| r.burn.is_none()));
}

#[test]
fn the_edge_hop_is_the_first_hop_with_a_budget_from_the_root() {
    let spans = parse(
        r#"
gateway server "GET /" 0 500
  gateway client "edge" 5 490
    edge server "GET /checkout" 6 480 budget=450
"#,
    );
    let analysis = run(&spans);
    assert_eq!(analysis.budget_ms, Some(450.0));
    assert_eq!(analysis.edge, Some(2));
    assert_eq!(
        analysis.outcome,
        Outcome::Ok,
        "480 ms against 450 is within τ (50 ms)"
    );
    let late = parse(
        r#"
gateway server "GET /" 0 600
  gateway client "edge" 5 590
    edge server "GET /checkout" 6 580 budget=450
"#,
    );
    assert_eq!(run(&late).outcome, Outcome::Exceeded);
}

#[test]
fn odd_links_never_panic_duplicates_and_cycles_become_warnings() {
    let mut spans = parse(
        r#"
a server "one" 0 10 id=1
a server "two" 1 10 id=2
a server "dup" 2 10 id=1
"#,
    );
    // one → two → one: a cycle.
    spans[0].parent_span_id = Some(spans[1].span_id);
    spans[1].parent_span_id = Some(spans[0].span_id);
    let analysis = run(&spans);
    assert_eq!(analysis.rows.len(), 3, "every span is shown once");
    let warnings: Vec<&String> = analysis.rows.iter().flat_map(|r| &r.warnings).collect();
    assert!(warnings.iter().any(|w| w.contains("cycle")), "{warnings:?}");
    assert!(
        warnings.iter().any(|w| w.contains("same id")),
        "{warnings:?}"
    );
    assert_eq!(run(&[]).rows.len(), 0);
    assert_eq!(run(&[]).outcome, Outcome::NoBudget);
}

#[test]
fn a_100k_deep_chain_does_not_overflow_the_stack() {
    let mut fixture = String::new();
    for depth in 0..2_000 {
        let service = if depth % 2 == 0 { "a" } else { "b" };
        let kind = if depth % 4 < 2 { "server" } else { "client" };
        fixture += &format!("{}{service} {kind} \"op\" {depth} 1\n", "  ".repeat(depth));
    }
    let mut spans = parse(&fixture);
    // Extend to 100k by linking more spans in a chain beyond what indentation is kind to.
    let template = spans[spans.len() - 1].clone();
    for i in spans.len()..100_000 {
        let mut span = template.clone();
        span.span_id = crate::core::model::SpanId((i as u64 + 1).to_be_bytes());
        span.parent_span_id = Some(spans[i - 1].span_id);
        spans.push(span);
    }
    let analysis = run(&spans);
    assert_eq!(analysis.rows.len(), 100_000);
    assert_eq!(analysis.rows[99_999].depth, 99_999);
}

/// The exceed's reason on the first span named `name`.
fn exceed_reason(spans: &[Span], name: &str) -> (Option<Exceed>, String) {
    let analysis = run(spans);
    let row = analysis
        .rows
        .iter()
        .find(|row| spans[row.span].name == name)
        .unwrap_or_else(|| panic!("no span named {name}"));
    let message = row
        .flags
        .iter()
        .find(|f| f.flag == Flag::LocalExceed)
        .map(|f| f.message.clone())
        .unwrap_or_default();
    (row.exceed, message)
}

#[test]
fn a_hop_that_sends_a_fixed_timeout_larger_than_its_budget_holds_the_exceed() {
    // edge has 700 ms left and sends inventory 3 s; inventory finishes within what it was
    // given, the request is late, and edge is where it ran out.
    let spans = parse(
        r#"
edge server "GET /checkout" 0 1200 budget=1000
  edge client "inventory" 300 880 budget=3000
    inventory server "GET /stock" 301 878 budget=2999
"#,
    );
    assert_eq!(run(&spans).outcome, Outcome::Exceeded);
    let (exceed, reason) = exceed_reason(&spans, "GET /checkout");
    assert_eq!(exceed, Some(Exceed::Local));
    assert_eq!(
        reason,
        "deadline passed while waiting on inventory, which was sent more time than was left"
    );
    assert_eq!(exceed_reason(&spans, "GET /stock").0, None);
    let analysis = run(&spans);
    assert_eq!(analysis.origins, [0], "the request's origin is edge");
    assert!(text::render(&spans, &analysis).contains(
        "origin: edge GET /checkout (deadline passed while waiting on inventory, which was sent more time than was left)"
    ));
}

#[test]
fn a_leaf_cancelled_at_its_deadline_holds_the_exceed() {
    let spans = parse(
        r#"
edge server "GET /checkout" 0 320 budget=400 http-status=504
  edge client "inventory" 10 306 budget=390
    inventory server "GET /stock" 11 303 budget=300 grpc-status=4
"#,
    );
    assert_eq!(run(&spans).outcome, Outcome::Exceeded);
    let (exceed, reason) = exceed_reason(&spans, "GET /stock");
    assert_eq!(exceed, Some(Exceed::Local));
    assert_eq!(
        reason,
        "cancelled at its deadline (ended 3.0 ms after it, with a deadline status)"
    );
    assert_eq!(exceed_reason(&spans, "GET /checkout").0, None);
}

#[test]
fn a_caller_that_gives_up_just_before_its_deadline_passes_the_exceed_on() {
    // Each hop forwards what it has left minus a 10 ms reserve and stops waiting when that
    // runs out: inventory is cancelled at its deadline; orders and edge answer 504 a few ms
    // before theirs, within τ, and are not origins.
    let spans = parse(
        r#"
edge server "GET /checkout" 0 985 budget=1000 http-status=504
  edge client "orders" 10 974 budget=980
    orders server "POST /orders" 11 972 budget=979 http-status=504
      orders client "inventory" 25 955 budget=955
        inventory server "GET /stock" 26 956 budget=954 http-status=504
"#,
    );
    let analysis = run(&spans);
    assert_eq!(analysis.outcome, Outcome::Exceeded);
    assert_eq!(exceed_reason(&spans, "GET /stock").0, Some(Exceed::Local));
    assert_eq!(exceed_reason(&spans, "POST /orders").0, None);
    assert_eq!(exceed_reason(&spans, "GET /checkout").0, None);
    assert_eq!(analysis.origins.len(), 1, "{:?}", analysis.origins);
}

#[test]
fn time_lost_between_a_caller_and_a_callee_that_answered_in_time_is_the_callers() {
    // orders starts 390 ms after edge called it (a queue, a proxy) and answers within the
    // 300 ms it was given: nothing downstream exceeded, so edge holds the exceed.
    let spans = parse(
        r#"
edge server "GET /checkout" 0 900 budget=700
  edge client "orders" 10 880 budget=690
    orders server "POST /orders" 400 300 budget=300
"#,
    );
    let (exceed, reason) = exceed_reason(&spans, "GET /checkout");
    assert_eq!(exceed, Some(Exceed::Local));
    assert!(
        reason.contains("answered within its own budget"),
        "{reason}"
    );
}

#[test]
fn a_callee_that_keeps_working_after_its_caller_gave_up_is_not_shifted_for_skew() {
    // Each layer of a retry storm gives up on its callee, which keeps working: the callees
    // start inside their calls and end after them.
    let spans = parse(
        r#"
edge server "GET /" 0 1000 budget=800
  edge client "orders" 10 300 budget=790
    orders server "POST /orders" 12 1700 budget=788
      orders client "inventory" 20 1650 budget=780
        inventory server "GET /stock" 22 1640 budget=778
"#,
    );
    let analysis = run(&spans);
    assert!(
        analysis.rows.iter().all(|row| row.skew_shift_ms == 0.0),
        "{:?}",
        analysis
            .rows
            .iter()
            .map(|r| r.skew_shift_ms)
            .collect::<Vec<_>>()
    );
    assert!(flags(&spans, "POST /orders").contains(&"wasted"));
}

/// A small deterministic generator (xorshift) of realistic request chains: each hop
/// forwards what it has left (or, sometimes, a fixed 3 s timeout), callees start a little
/// after their call, some leaves are cancelled at their deadline with a deadline status,
/// and a hop that runs out answers with one.
fn generated_trace(seed: u64) -> String {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    let mut next = move |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound.max(1)
    };
    let mut lines = Vec::new();
    // (indent, service, start, budget)
    fn hop(
        lines: &mut Vec<String>,
        next: &mut dyn FnMut(u64) -> u64,
        depth: usize,
        start: f64,
        budget: f64,
    ) -> f64 {
        let service = format!("svc{depth}");
        let pad = "  ".repeat(depth * 2);
        let deadline = start + budget;
        let mut t = start + next(30) as f64;
        let mut calls = Vec::new();
        if depth < 4 {
            for _ in 0..next(3) {
                let available = deadline - t;
                let forwarded = if next(6) == 0 { 3000.0 } else { available };
                let net = next(20) as f64;
                let child_start = t + net;
                let mut child = Vec::new();
                let child_end = hop(&mut child, next, depth + 1, child_start, forwarded - net);
                let call_end = child_end + net;
                calls.push(format!(
                    "{pad}  svc{depth} client \"call{depth}\" {t} {} budget={forwarded}",
                    call_end - t
                ));
                calls.extend(child);
                t = call_end + next(20) as f64;
            }
        }
        let mut end = t + next(400) as f64;
        let mut status = "";
        if calls.is_empty() && budget > 0.0 && next(3) == 0 && end > deadline {
            end = deadline + next(5) as f64;
            status = " grpc-status=4";
        } else if end > deadline && next(2) == 0 {
            status = " http-status=504";
        }
        lines.push(format!(
            "{pad}{service} server \"op{depth}\" {start} {}{}{status}",
            end - start,
            if budget.is_finite() {
                format!(" budget={budget}")
            } else {
                String::new()
            }
        ));
        lines.extend(calls);
        end
    }
    let budget = 200.0 + next(1500) as f64;
    hop(&mut lines, &mut next, 0, 0.0, budget);
    lines.join("\n")
}

#[test]
fn every_exceeded_generated_request_has_an_origin_and_spent_hops_are_downstream_of_one() {
    let mut exceeded = 0;
    for seed in 0..2000u64 {
        let text = generated_trace(seed);
        let spans = parse(&text);
        let analysis = run(&spans);
        let origin = |row: &super::Row| {
            row.exceed == Some(Exceed::Local) || row.flags.iter().any(|f| f.flag == Flag::Refused)
        };
        if analysis.outcome == Outcome::Exceeded {
            exceeded += 1;
            assert!(
                analysis.rows.iter().any(origin),
                "seed {seed}: an exceeded request without an origin\n{text}\n{}",
                text::render(&spans, &analysis)
            );
        }
        // A hop that arrived spent comes after an origin in the waterfall: upstream of it,
        // or in an earlier branch that used the time.
        for (r, row) in analysis.rows.iter().enumerate() {
            if row.exceed != Some(Exceed::Inherited) {
                continue;
            }
            let before = analysis.rows[..r].iter().any(origin);
            assert!(
                before,
                "seed {seed}: {} arrived spent with no origin before it\n{text}\n{}",
                spans[row.span].name,
                text::render(&spans, &analysis)
            );
        }
    }
    assert!(
        exceeded > 200,
        "the generator makes too few exceeded requests: {exceeded}"
    );
}

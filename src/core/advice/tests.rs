use super::*;

fn id(service: &str, operation: &str) -> HopId {
    (service.into(), operation.into())
}

/// `calls` calls forwarding `forwarded(i)` with `left(i)` left.
fn edge(calls: i64, forwarded: impl Fn(i64) -> f64, left: impl Fn(i64) -> f64) -> EdgeRollup {
    let mut edge = EdgeRollup {
        requests: calls,
        calls,
        ..Default::default()
    };
    for i in 0..calls {
        edge.forwarded.record(forwarded(i), 1);
        edge.left.record(left(i), 1);
        edge.shortfall.record(0.5, 1);
        edge.latency.record(40.0, 1);
    }
    edge
}

fn kinds(findings: &[Finding]) -> Vec<&str> {
    findings.iter().map(|f| f.kind).collect()
}

#[test]
fn a_healthy_edge_gets_no_finding() {
    // What is left varies; what is forwarded follows it less a 10 ms reserve.
    let left = |i: i64| 200.0 + 7.0 * i as f64;
    let healthy = edge(100, |i| left(i) - 10.0, left);
    let edges = BTreeMap::from([((id("a", "GET /"), id("b", "GET /")), healthy)]);
    assert!(edge_findings(&edges, &BTreeMap::new(), 50.0).is_empty());
    // Every request starts with the same budget: constant forwarded, constant left.
    let root = edge(100, |_| 990.0, |_| 1000.0);
    let edges = BTreeMap::from([((id("a", "GET /"), id("b", "GET /")), root)]);
    assert!(edge_findings(&edges, &BTreeMap::new(), 50.0).is_empty());
}

#[test]
fn a_fixed_timeout_is_told_with_how_often_it_exceeds_what_was_left() {
    let fixed = edge(100, |_| 5000.0, |i| 200.0 + 10.0 * i as f64);
    let edges = BTreeMap::from([((id("orders", "POST /"), id("billing", "Charge")), fixed)]);
    let found = edge_findings(&edges, &BTreeMap::new(), 50.0);
    assert_eq!(kinds(&found), ["fixed_timeout"]);
    let value = found[0].value_ms.unwrap();
    assert!((value - 5000.0).abs() / 5000.0 < 0.05, "{value}");
    assert!(
        found[0]
            .message
            .contains("more than was left on 100 % of calls"),
        "{}",
        found[0].message
    );
}

#[test]
fn dropped_clamped_and_retries_past_their_share() {
    let left = |i: i64| 300.0 + i as f64;
    let mut bad = edge(100, |i| left(i) - 10.0, left);
    bad.counts[2] = 10; // dropped
    bad.counts[1] = 20; // clamped
    for _ in 0..20 {
        bad.shortfall.unmerge(&{
            let mut one = Histogram::default();
            one.record(0.5, 1);
            one
        });
        bad.shortfall.record(300.0, 1);
    }
    bad.counts[4] = 15; // retries: 15 of 85 first attempts
    let edges = BTreeMap::from([((id("gw", "GET /"), id("orders", "POST /")), bad)]);
    let mut budgets = Histogram::default();
    for i in 0..100 {
        budgets.record(if i < 20 { 40.0 } else { 330.0 + i as f64 }, 1);
    }
    let received = BTreeMap::from([(id("orders", "POST /"), budgets)]);
    let found = edge_findings(&edges, &received, 50.0);
    let mut told = kinds(&found);
    told.sort();
    assert_eq!(told, ["clamped", "dropped", "retry_budget"]);
    let clamped = found.iter().find(|f| f.kind == "clamped").unwrap();
    // What the clamped fifth of calls arrived with: about 40 ms.
    let value = clamped.value_ms.unwrap();
    assert!((value - 40.0).abs() < 2.0, "{clamped:?}");
    assert_eq!(
        found[0].kind, "clamped",
        "ranked first: the most milliseconds at stake"
    );
    // Below the share, or too few calls: nothing.
    let mut few = edge(10, |i| left(i) - 10.0, left);
    few.counts[2] = 10;
    let mut rare = edge(100, |i| left(i) - 10.0, left);
    rare.counts[2] = 2;
    rare.counts[4] = 5;
    let edges = BTreeMap::from([
        ((id("a", "x"), id("b", "y")), few),
        ((id("c", "x"), id("d", "y")), rare),
    ]);
    assert!(edge_findings(&edges, &BTreeMap::new(), 50.0).is_empty());
}

/// A hop's rollup of `n` requests with budgets `budget(i)`, those where `exceeded(i)`
/// ending in a deadline exceed.
fn hop(n: i64, budget: impl Fn(i64) -> f64, exceeded: impl Fn(i64) -> bool) -> Rollup {
    let mut rollup = Rollup::default();
    for i in 0..n {
        rollup.requests += 1;
        rollup.budget.record(budget(i), 1);
        if exceeded(i) {
            rollup.advice.counts[0] += 1;
            rollup.advice.exceeded_budget.record(budget(i), 1);
        }
        rollup.advice.tail.record(5.0, 1);
        rollup.advice.kept.record(20.0, 1);
        *rollup.advice.reached.entry(1).or_default() += 1;
    }
    rollup
}

fn hop_kinds(
    hops: BTreeMap<HopId, Rollup>,
    edges: &BTreeMap<(HopId, HopId), EdgeRollup>,
) -> Vec<&'static str> {
    let mut kinds: Vec<&str> = findings(&hops, edges, 50.0)
        .iter()
        .map(|f| f.kind)
        .collect();
    kinds.sort();
    kinds
}

#[test]
fn a_healthy_hop_gets_no_finding() {
    // Budgets vary, a few exceeds at every budget, reserves kept, no retries.
    let healthy = hop(200, |i| 100.0 + 5.0 * i as f64, |i| i % 50 == 0);
    let hops = BTreeMap::from([(id("a", "GET /"), healthy)]);
    assert!(hop_kinds(hops, &BTreeMap::new()).is_empty());
}

#[test]
fn a_minimum_useful_budget_is_where_requests_start_to_succeed() {
    // Below 100 ms nearly all exceed; above, one in ten.
    let pricing = hop(
        200,
        |i| 20.0 + 2.0 * i as f64,
        |i| {
            let budget = 20.0 + 2.0 * i as f64;
            if budget < 100.0 {
                i % 20 != 0
            } else {
                i % 10 == 0
            }
        },
    );
    let found = findings(
        &BTreeMap::from([(id("pricing", "GET /price"), pricing)]),
        &BTreeMap::new(),
        50.0,
    );
    assert_eq!(kinds(&found), ["min_useful_budget"]);
    let value = found[0].value_ms.unwrap();
    assert!(
        (value - 100.0).abs() / 100.0 < 0.05,
        "{value}: {}",
        found[0].message
    );
    assert!(
        found[0].message.contains("with less than"),
        "{}",
        found[0].message
    );
}

#[test]
fn reserve_inflating_infeasible_and_stacked_retries() {
    let mut orders = hop(100, |_| 300.0, |_| false);
    orders.advice.tail = Histogram::default();
    for i in 0..100 {
        orders
            .advice
            .tail
            .record(if i < 90 { 30.0 } else { 90.0 }, 1);
    }
    orders.advice.counts[2] = 10; // short_reserve
    orders.advice.counts[1] = 10; // inflating
    let mut gateway = hop(100, |_| 300.0, |i| i < 10);
    gateway.advice.reached = BTreeMap::from([(1, 80), (9, 19), (27, 1)]);
    gateway.advice.counts[3] = 20; // stacked_retry
    gateway.advice.counts[4] = 10; // clean_exceeded
    for i in 0..100 {
        gateway
            .advice
            .need
            .record(if i < 80 { 200.0 } else { 520.0 }, 1);
    }
    let hops = BTreeMap::from([
        (id("gateway", "GET /"), gateway),
        (id("orders", "POST /"), orders),
    ]);
    let retried = |calls| {
        let mut e = edge(calls, |_| 100.0, |i| 200.0 + i as f64);
        e.counts[4] = calls / 3;
        e
    };
    let edges = BTreeMap::from([
        (
            (id("gateway", "GET /"), id("orders", "POST /")),
            retried(30),
        ),
        ((id("orders", "POST /"), id("stock", "GET /")), retried(90)),
        ((id("stock", "GET /"), id("inventory", "")), retried(270)),
    ]);
    let found = findings(&hops, &edges, 50.0);
    let of = |kind| {
        found
            .iter()
            .find(|f| f.kind == kind)
            .unwrap_or_else(|| panic!("{kind}: {found:#?}"))
    };
    let layers = of("retry_layers");
    assert_eq!(layers.value, Some(27.0));
    assert_eq!(
        layers.layers,
        [
            id("gateway", "GET /"),
            id("orders", "POST /"),
            id("stock", "GET /")
        ]
    );
    assert!(
        layers
            .message
            .contains("gateway GET /, orders POST / and stock GET / each retry"),
        "{}",
        layers.message
    );
    let reserve = of("reserve");
    assert_eq!(reserve.subject, Subject::Hop(id("orders", "POST /")));
    let needed = reserve.value_ms.unwrap();
    assert!((90.0..=100.0).contains(&needed), "{needed}");
    let infeasible = of("infeasible_budget");
    assert!(
        (infeasible.value_ms.unwrap() - 520.0).abs() < 25.0,
        "{infeasible:?}"
    );
    assert!(
        of("inflating_hop")
            .message
            .contains("on 10 of 100 requests")
    );
}

#[test]
fn a_backstop_for_calls_without_a_budget_ranks_last() {
    let mut plain = EdgeRollup {
        requests: 200,
        calls: 200,
        ..Default::default()
    };
    for i in 0..200 {
        plain.latency.record(10.0 + i as f64, 1);
    }
    let edges = BTreeMap::from([((id("a", "GET /"), id("db", "")), plain)]);
    let found = edge_findings(&edges, &BTreeMap::new(), 50.0);
    assert_eq!(kinds(&found), ["timeout_backstop"]);
    // p99.9 is the slowest, about 209 ms; plus a quarter, rounded up to 10 ms.
    let value = found[0].value_ms.unwrap();
    assert!((250.0..=280.0).contains(&value), "{value}");
    assert!(found[0].impact < 10.0);
}

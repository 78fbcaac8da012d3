//! The advisor's findings about call edges, from the edge statistics of a window
//! (docs/budget-semantics.md, "Advice"): a budget dropped or clamped between two hops, a
//! fixed timeout where a propagated deadline belongs, retries past a budget. Pure: rollups in,
//! findings out. Each finding rests on counts and quantiles the page shows, and a healthy
//! system (budgets propagated, reserves kept, few retries) yields none.

use std::collections::BTreeMap;

use crate::core::analyze::edges::EdgeRollup;
use crate::core::analyze::histogram::Histogram;

/// Fewer calls than this on an edge in the window: too few to advise on.
pub const MIN_CALLS: i64 = 20;
/// A budget dropped or clamped on this share of an edge's calls, and on at least
/// `MIN_PROBLEM_CALLS`, is a finding: neither happens where budgets propagate, so a small
/// share is already a misconfiguration, while a single odd call is not advice.
pub const PROBLEM_SHARE: f64 = 0.01;
pub const MIN_PROBLEM_CALLS: i64 = 5;
/// Retries past this share of first attempts are a finding (`retry_budget`).
pub const RETRY_SHARE: f64 = 0.10;

/// (service, operation); the operation is empty for a peer that is no instrumented hop.
pub type HopId = (String, String);

#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// `fixed_timeout`, `clamped`, `dropped` or `retry_budget`.
    pub kind: &'static str,
    pub caller: HopId,
    pub callee: HopId,
    pub value_ms: Option<f64>,
    /// Calls the finding is about (those with the problem).
    pub calls: i64,
    /// Calls on the edge in the window.
    pub of_calls: i64,
    pub message: String,
    pub recommendation: String,
    /// What ranks findings: calls affected, weighted by the milliseconds at stake where
    /// there are some.
    pub impact: f64,
}

fn name((service, operation): &HopId) -> String {
    if operation.is_empty() {
        service.clone()
    } else {
        format!("{service} {operation}")
    }
}

fn ms(value: f64) -> String {
    crate::core::analyze::fmt_ms(value) + " ms"
}

fn percent(share: f64) -> String {
    format!("{:.0} %", share * 100.0)
}

/// The share of a histogram's values below `limit`.
fn share_below(histogram: &Histogram, limit: f64) -> f64 {
    let total = histogram.count().max(1) as f64;
    let below: i64 = histogram
        .points()
        .iter()
        .filter(|(value, _)| *value < limit)
        .map(|(_, count)| count)
        .sum();
    below as f64 / total
}

/// The findings of every edge, ranked by impact, the largest first. `received` holds each
/// hop's received budgets over the window (its hop statistics).
pub fn edge_findings(
    edges: &BTreeMap<(HopId, HopId), EdgeRollup>,
    received: &BTreeMap<HopId, Histogram>,
    tolerance_ms: f64,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for ((caller, callee), edge) in edges {
        if edge.calls < MIN_CALLS {
            continue;
        }
        let finding = |kind, value_ms, calls: i64, message, recommendation, weight: f64| Finding {
            kind,
            caller: caller.clone(),
            callee: callee.clone(),
            value_ms,
            calls,
            of_calls: edge.calls,
            message,
            recommendation,
            impact: calls as f64 * weight.max(1.0),
        };
        let (from, to) = (name(caller), name(callee));
        let share = |n: i64| n as f64 / edge.calls as f64;
        let material = |n: i64| n >= MIN_PROBLEM_CALLS && share(n) >= PROBLEM_SHARE;

        let dropped = edge.count("dropped");
        if material(dropped) {
            out.push(finding(
                "dropped",
                None,
                dropped,
                format!(
                    "{from} forwards a budget to {to}, which arrives with none on {} of \
                     {} calls",
                    dropped, edge.calls
                ),
                format!(
                    "carry the deadline through whatever sits between {} and {} (a proxy, \
                     gateway or mesh that does not pass the header on)",
                    caller.0, callee.0
                ),
                1.0,
            ));
        }

        let clamped = edge.count("clamped");
        if material(clamped) {
            // The clamped calls are the top share of shortfalls, and the callee's lowest
            // received budgets: the middle one of each.
            let cut = edge
                .shortfall
                .quantile(1.0 - share(clamped) / 2.0)
                .unwrap_or(0.0);
            let received = received
                .get(callee)
                .and_then(|budgets| budgets.quantile(share(clamped) / 2.0));
            out.push(finding(
                "clamped",
                received,
                clamped,
                format!(
                    "{to} receives about {} less than {from} forwards on {} of {} calls",
                    ms(cut),
                    clamped,
                    edge.calls
                ),
                format!(
                    "a timeout between them (a proxy, gateway or mesh) cuts the deadline{}: \
                     make one layer authoritative and let the propagated deadline through",
                    received.map_or(String::new(), |r| format!(" to about {}", ms(r)))
                ),
                cut,
            ));
        }

        let retries = edge.count("retry");
        let unsafe_retries = edge.count("unsafe_retry");
        let first = (edge.calls - retries).max(1);
        if retries as f64 / first as f64 > RETRY_SHARE || unsafe_retries > 0 {
            out.push(finding(
                "retry_budget",
                None,
                retries,
                format!(
                    "{from} retried {to} {retries} times on {first} first attempts ({}){}",
                    percent(retries as f64 / first as f64),
                    if unsafe_retries > 0 {
                        format!(
                            ", {unsafe_retries} of them without an idempotency key after an \
                             unknown outcome"
                        )
                    } else {
                        String::new()
                    }
                ),
                format!(
                    "cap retries at {} of first attempts (a retry budget), retry only while \
                     the budget allows{}",
                    percent(RETRY_SHARE),
                    if unsafe_retries > 0 {
                        ", and send an idempotency key with every retried write"
                    } else {
                        ""
                    }
                ),
                1.0,
            ));
        }

        // A constant forwarded budget while what was left varies: a configured timeout.
        if let (Some(f10), Some(f50), Some(f90), Some(l10), Some(l90)) = (
            edge.forwarded.quantile(0.1),
            edge.forwarded.quantile(0.5),
            edge.forwarded.quantile(0.9),
            edge.left.quantile(0.1),
            edge.left.quantile(0.9),
        ) && edge.forwarded.count() >= MIN_CALLS
            && f90 - f10 <= tolerance_ms.max(0.05 * f50.abs())
            && l90 - l10 >= 4.0 * tolerance_ms
        {
            let over = share_below(&edge.left, f50 - tolerance_ms);
            out.push(finding(
                "fixed_timeout",
                Some(f50),
                (over * edge.calls as f64).round() as i64,
                format!(
                    "{from} sends {to} a fixed {} while what it has left varies from {} to \
                     {} (p10 to p90): more than was left on {} of calls",
                    ms(f50),
                    ms(l10),
                    ms(l90),
                    percent(over)
                ),
                format!(
                    "forward what is left minus a reserve, at most {} (propagate the deadline \
                     instead of a fixed timeout)",
                    ms(f50)
                ),
                1.0,
            ));
        }
    }
    out.sort_by(|a, b| b.impact.total_cmp(&a.impact));
    out
}

#[cfg(test)]
mod tests {
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
}

//! The findings of call edges: `dropped`, `clamped`, `retry_budget`, `fixed_timeout`,
//! `timeout_backstop`.

use std::collections::BTreeMap;

use super::{
    Finding, HopId, MIN_CALLS, MIN_PROBLEM_CALLS, PROBLEM_SHARE, RETRY_SHARE, Subject, hop_label,
    ms, percent, share_below,
};
use crate::core::analyze::edges::EdgeRollup;
use crate::core::analyze::histogram::Histogram;

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
            subject: Subject::Edge {
                caller: caller.clone(),
                callee: callee.clone(),
            },
            value_ms,
            value: None,
            requests: calls,
            out_of: edge.calls,
            layers: Vec::new(),
            message,
            recommendation,
            impact: calls as f64 * weight,
        };
        let (from, to) = (hop_label(caller), hop_label(callee));
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
                cut.max(1.0),
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

        // No budget on any call, and none lost on the way: a fixed timeout is the backstop.
        if edge.forwarded.count() == 0
            && dropped == 0
            && let (Some(p999), Some(max)) =
                (edge.latency.quantile(0.999), edge.latency.quantile(1.0))
        {
            let backstop = backstop_ms(p999, tolerance_ms);
            out.push(finding(
                "timeout_backstop",
                Some(backstop),
                edge.calls,
                format!(
                    "{from} calls {to} with no budget on {} calls: {to} answered within {} \
                     at p99.9 (slowest {})",
                    edge.calls,
                    ms(p999),
                    ms(max)
                ),
                format!(
                    "set a fixed timeout of {} on these calls as a backstop (p99.9 plus a \
                     margin), or propagate the deadline",
                    ms(backstop)
                ),
                // Advice for a call that has not gone wrong: ranked below every problem.
                0.01,
            ));
        }
    }
    out.sort_by(|a, b| b.impact.total_cmp(&a.impact));
    out
}

/// A backstop timeout from a callee's p99.9: plus a margin of a quarter (at least τ),
/// rounded up to 10 ms.
fn backstop_ms(p999: f64, tolerance_ms: f64) -> f64 {
    let with_margin = p999 + (0.25 * p999).max(tolerance_ms);
    (with_margin / 10.0).ceil() * 10.0
}

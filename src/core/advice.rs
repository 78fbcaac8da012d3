//! The advisor's findings about call edges, from the edge statistics of a window
//! (docs/budget-semantics.md, "Advice"): a budget dropped or clamped between two hops, a
//! fixed timeout where a propagated deadline belongs, retries past a budget. Pure: rollups in,
//! findings out. Each finding rests on counts and quantiles the page shows, and a healthy
//! system (budgets propagated, reserves kept, few retries) yields none.

use std::collections::BTreeMap;

use crate::core::analyze::edges::{EdgeKey, EdgeRollup};
use crate::core::analyze::histogram::Histogram;
use crate::core::analyze::hops::Rollup;
use crate::core::analyze::{Flag, Outcome};

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

/// What a finding is about: a call edge, or a hop.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    Edge { caller: HopId, callee: HopId },
    Hop(HopId),
}

impl Subject {
    /// The service a finding is grouped under: the calling service, or the hop's.
    pub fn service(&self) -> &str {
        match self {
            Subject::Edge { caller, .. } => &caller.0,
            Subject::Hop(hop) => &hop.0,
        }
    }

    /// The edge's ends, for an edge finding.
    pub fn edge(&self) -> Option<(&HopId, &HopId)> {
        match self {
            Subject::Edge { caller, callee } => Some((caller, callee)),
            Subject::Hop(_) => None,
        }
    }

    /// The hop, for a hop finding.
    pub fn hop(&self) -> Option<&HopId> {
        match self {
            Subject::Hop(hop) => Some(hop),
            Subject::Edge { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// One of `KINDS`.
    pub kind: &'static str,
    pub subject: Subject,
    pub value_ms: Option<f64>,
    /// A count rather than milliseconds (`retry_layers`: the most calls that reached one
    /// service for one request).
    pub value: Option<f64>,
    /// Requests (calls, for an edge) the finding is about: those with the problem.
    pub requests: i64,
    /// Requests (calls) of the hop (edge) in the window.
    pub out_of: i64,
    /// Hops the finding names besides its subject: the retrying layers, top down.
    pub layers: Vec<HopId>,
    pub message: String,
    pub recommendation: String,
    /// What ranks findings: requests affected, weighted by the milliseconds (or calls) at
    /// stake where there are some.
    pub impact: f64,
}

/// Every kind of finding, edge kinds first.
pub const KINDS: [&str; 10] = [
    "dropped",
    "clamped",
    "fixed_timeout",
    "retry_budget",
    "timeout_backstop",
    "inflating_hop",
    "min_useful_budget",
    "reserve",
    "retry_layers",
    "infeasible_budget",
];

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

/// The flag that marks, at the hop a finding names, the traces that show a finding of
/// `kind`; none for `clamped`, `timeout_backstop` and `infeasible_budget` (which the
/// exceeded outcome shows: `example_outcome`).
pub fn example_flag(kind: &str) -> Option<Flag> {
    match kind {
        "dropped" => Some(Flag::Dropped),
        "fixed_timeout" | "inflating_hop" => Some(Flag::Inflated),
        "retry_budget" | "retry_layers" => Some(Flag::Retry),
        "reserve" => Some(Flag::Overspent),
        "min_useful_budget" => Some(Flag::LocalExceed),
        _ => None,
    }
}

/// The outcome of the requests that show a finding of `kind`, where no flag does.
pub fn example_outcome(kind: &str) -> Option<Outcome> {
    (kind == "infeasible_budget").then_some(Outcome::Exceeded)
}

/// Per hop (an edge's finding at its calling hop), per kind: the requests (calls) the
/// findings are about. What the `finding_*` alert signals read.
pub type FindingCounts = BTreeMap<HopId, BTreeMap<&'static str, i64>>;

pub fn finding_counts(findings: &[Finding]) -> FindingCounts {
    let mut out = FindingCounts::new();
    for finding in findings {
        let at = match &finding.subject {
            Subject::Hop(hop) => hop,
            Subject::Edge { caller, .. } => caller,
        };
        *out.entry(at.clone())
            .or_default()
            .entry(finding.kind)
            .or_default() += finding.requests;
    }
    out
}

/// A backstop timeout from a callee's p99.9: plus a margin of a quarter (at least τ),
/// rounded up to 10 ms.
fn backstop_ms(p999: f64, tolerance_ms: f64) -> f64 {
    let with_margin = p999 + (0.25 * p999).max(tolerance_ms);
    (with_margin / 10.0).ceil() * 10.0
}

/// Edge rows (per minute or hour) merged per edge over their window.
pub fn merge_edges(rows: &[(EdgeKey, EdgeRollup)]) -> BTreeMap<(HopId, HopId), EdgeRollup> {
    let mut edges: BTreeMap<(HopId, HopId), EdgeRollup> = BTreeMap::new();
    for ((caller_service, caller_operation, callee_service, callee_operation, _), rollup) in rows {
        edges
            .entry((
                (caller_service.clone(), caller_operation.clone()),
                (callee_service.clone(), callee_operation.clone()),
            ))
            .or_default()
            .merge(rollup);
    }
    edges
}

/// Every finding of a window, ranked by impact, the largest first: those of the edges and
/// those of the hops (`hops`: each hop identity's rollup over the window).
pub fn findings(
    hops: &BTreeMap<HopId, Rollup>,
    edges: &BTreeMap<(HopId, HopId), EdgeRollup>,
    tolerance_ms: f64,
) -> Vec<Finding> {
    let received: BTreeMap<HopId, Histogram> = hops
        .iter()
        .map(|(hop, rollup)| (hop.clone(), rollup.budget.clone()))
        .collect();
    let mut out = edge_findings(edges, &received, tolerance_ms);
    for (hop, rollup) in hops {
        out.extend(hop_findings(hop, rollup, edges, tolerance_ms));
    }
    out.sort_by(|a, b| b.impact.total_cmp(&a.impact));
    out
}

/// The findings of one hop: `inflating_hop`, `min_useful_budget`, `reserve`, and for the
/// requests that enter at it, `retry_layers` and `infeasible_budget`.
fn hop_findings(
    hop: &HopId,
    rollup: &Rollup,
    edges: &BTreeMap<(HopId, HopId), EdgeRollup>,
    tolerance_ms: f64,
) -> Vec<Finding> {
    let advice = &rollup.advice;
    let at = name(hop);
    let mut out = Vec::new();
    let finding =
        |kind, value_ms, requests: i64, out_of: i64, message, recommendation, weight: f64| {
            Finding {
                kind,
                subject: Subject::Hop(hop.clone()),
                value_ms,
                value: None,
                requests,
                out_of,
                layers: Vec::new(),
                message,
                recommendation,
                impact: requests as f64 * weight,
            }
        };
    let material = |n: i64, of: i64| {
        of >= MIN_CALLS && n >= MIN_PROBLEM_CALLS && n as f64 / of as f64 >= PROBLEM_SHARE
    };

    let inflating = advice.count("inflating");
    if material(inflating, rollup.requests)
        && let Some(own) = rollup
            .budget
            .quantile(1.0 - inflating as f64 / rollup.requests as f64 / 2.0)
    {
        out.push(finding(
            "inflating_hop",
            Some(own),
            inflating,
            rollup.requests,
            format!(
                "{at} starts with a larger budget than its caller sent (about {}) on {} of {} \
                 requests: a budget of its own replaces the propagated deadline",
                ms(own),
                inflating,
                rollup.requests
            ),
            format!(
                "take the deadline from the request, and apply {}'s default only when none \
                 arrives",
                hop.0
            ),
            1.0,
        ));
    }

    if rollup.requests >= MIN_CALLS
        && let Some(cut) = fail_fast_cut(&rollup.budget, &advice.exceeded_budget)
    {
        out.push(finding(
            "min_useful_budget",
            Some(cut.threshold_ms),
            cut.below_exceeded,
            rollup.requests,
            format!(
                "requests that reach {at} with less than {} left end in a deadline exceed on \
                 {} of {} ({}); with more, {} of {} do",
                ms(cut.threshold_ms),
                cut.below_exceeded,
                cut.below,
                percent(cut.below_exceeded as f64 / cut.below as f64),
                cut.above_exceeded,
                cut.above
            ),
            format!(
                "refuse requests that arrive with less than {} left (fail fast with a \
                 deadline error) instead of starting work they cannot finish",
                ms(cut.threshold_ms)
            ),
            cut.threshold_ms / 2.0,
        ));
    }

    let short = advice.count("short_reserve");
    if material(short, advice.tail.count())
        && let (Some(tail), Some(kept)) = (advice.tail.quantile(0.99), advice.kept.quantile(0.5))
    {
        let needed = (tail / 5.0).ceil() * 5.0;
        out.push(finding(
            "reserve",
            Some(needed),
            short,
            advice.tail.count(),
            format!(
                "{at} works up to {} (p99) after its last call returns but keeps back {} \
                 (median) when it forwards: it answered past its deadline, its post-call \
                 work longer than its reserve, on {} of {} requests",
                ms(tail),
                ms(kept),
                short,
                advice.tail.count()
            ),
            format!(
                "keep {} back: forward what is left minus {}",
                ms(needed),
                ms(needed)
            ),
            (tail - kept).max(1.0),
        ));
    }

    let entered = advice.entered();
    let stacked = advice.count("stacked_retry");
    if stacked > 0
        && let Some(&worst) = advice.reached.keys().next_back()
    {
        // Stacked retries are two layers or more by construction; the edges name them
        // (an alert rule reads the hop alone, without its edges).
        let layers = retrying_layers(hop, edges);
        let named: Vec<String> = layers.iter().map(name).collect();
        let who = if named.len() >= 2 {
            format!("{} each retry the same failure", and_list(&named))
        } else {
            "more than one layer retries the same failure".to_string()
        };
        let mut found = finding(
            "retry_layers",
            None,
            stacked,
            entered,
            format!(
                "up to {worst} calls reached one service for one request to {at}: {who} ({} \
                 of {} requests had retries at more than one layer)",
                stacked, entered
            ),
            format!(
                "let one layer retry (the one nearest the failure) and have the others pass \
                 failures up, so one failure costs a few calls, not {worst}"
            ),
            f64::from(worst),
        );
        found.value = Some(f64::from(worst));
        found.layers = layers;
        out.push(found);
    }

    let clean_exceeded = advice.count("clean_exceeded");
    if material(clean_exceeded, entered)
        && let (Some(need), Some(budget)) =
            (advice.need.quantile(0.99), rollup.budget.quantile(0.5))
        && need > budget + tolerance_ms
    {
        out.push(finding(
            "infeasible_budget",
            Some(need),
            clean_exceeded,
            entered,
            format!(
                "requests to {at} need {} at p99 (their work uncut, nothing wasted) but get \
                 {} (median): {} of {} exceeded with no retry, dropped or inflated budget to \
                 blame",
                ms(need),
                ms(budget),
                clean_exceeded,
                entered
            ),
            format!(
                "no timeout tuning can save these requests: raise the budget to at least {}, \
                 or make the critical path faster",
                ms(need)
            ),
            need - budget,
        ));
    }
    out
}

/// "a", "a and b", "a, b and c".
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The hops below `root` (by the window's edges, breadth first) that retried a callee,
/// `root` first when it did.
fn retrying_layers(root: &HopId, edges: &BTreeMap<(HopId, HopId), EdgeRollup>) -> Vec<HopId> {
    let mut layers = Vec::new();
    let mut seen = vec![root.clone()];
    let mut next = 0;
    while next < seen.len() {
        let at = seen[next].clone();
        next += 1;
        for ((caller, callee), edge) in edges.range((at.clone(), (String::new(), String::new()))..)
        {
            if *caller != at {
                break;
            }
            if edge.count("retry") > 0 && !layers.contains(caller) {
                layers.push(caller.clone());
            }
            if !seen.contains(callee) {
                seen.push(callee.clone());
            }
        }
    }
    layers
}

/// Where failing fast pays: below `threshold_ms`, nearly every request exceeds; above it,
/// most do not.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FailFastCut {
    threshold_ms: f64,
    below: i64,
    below_exceeded: i64,
    above: i64,
    above_exceeded: i64,
}

/// Below the cut, this share of requests exceeding makes a minimum useful budget.
const FAIL_FAST_SHARE: f64 = 0.9;
/// Above the cut, at most this share may exceed.
const ABOVE_SHARE: f64 = 0.5;

/// The highest received budget below which ≥ 90 % of requests (at least
/// `MIN_PROBLEM_CALLS`) ended in a deadline exceed while at most half of those above it
/// (at least `MIN_PROBLEM_CALLS`) did, from two histograms with the same buckets.
fn fail_fast_cut(all: &Histogram, exceeded: &Histogram) -> Option<FailFastCut> {
    let exceeded_at: BTreeMap<u64, i64> = exceeded
        .points()
        .into_iter()
        .map(|(value, count)| (value.to_bits(), count))
        .collect();
    let points: Vec<(f64, i64, i64)> = all
        .points()
        .into_iter()
        .map(|(value, count)| {
            let failed = exceeded_at.get(&value.to_bits()).copied().unwrap_or(0);
            (value, count, failed.min(count))
        })
        .collect();
    let (total, total_exceeded) = points
        .iter()
        .fold((0, 0), |(a, e), (_, n, x)| (a + n, e + x));
    let (mut below, mut below_exceeded) = (0, 0);
    let mut best = None;
    for pair in points.windows(2) {
        let (_, n, x) = pair[0];
        below += n;
        below_exceeded += x;
        let (above, above_exceeded) = (total - below, total_exceeded - below_exceeded);
        // The upper edge of the highest failing bucket (its midpoint plus half a bucket):
        // budgets between it and the next bucket were not seen, so none is refused.
        let threshold_ms = pair[0].0 * (1.0f64 / 16.0).exp2();
        if threshold_ms > 0.0
            && below_exceeded >= MIN_PROBLEM_CALLS
            && below_exceeded as f64 >= FAIL_FAST_SHARE * below as f64
            && above >= MIN_PROBLEM_CALLS
            && above_exceeded as f64 <= ABOVE_SHARE * above as f64
        {
            best = Some(FailFastCut {
                threshold_ms,
                below,
                below_exceeded,
                above,
                above_exceeded,
            });
        }
    }
    best
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
}

//! The findings of hops: `inflating_hop`, `min_useful_budget`, `reserve`, and for the
//! requests that enter at a hop, `retry_layers` and `infeasible_budget`.

use std::collections::BTreeMap;

use super::{
    Finding, HopId, MIN_CALLS, MIN_PROBLEM_CALLS, PROBLEM_SHARE, Subject, hop_label, ms, percent,
};
use crate::core::analyze::edges::EdgeRollup;
use crate::core::analyze::histogram::Histogram;
use crate::core::analyze::hops::Rollup;

/// The findings of one hop: `inflating_hop`, `min_useful_budget`, `reserve`, and for the
/// requests that enter at it, `retry_layers` and `infeasible_budget`.
pub(super) fn hop_findings(
    hop: &HopId,
    rollup: &Rollup,
    edges: &BTreeMap<(HopId, HopId), EdgeRollup>,
    tolerance_ms: f64,
) -> Vec<Finding> {
    let advice = &rollup.advice;
    let at = hop_label(hop);
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
        let named: Vec<String> = layers.iter().map(hop_label).collect();
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

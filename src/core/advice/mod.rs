//! The advisor's findings about hops and call edges, from the hop and edge statistics of a
//! window (docs/budget-semantics.md, "Advice"): `edges.rs` tells budgets dropped or clamped
//! between two hops, fixed timeouts where a propagated deadline belongs, retries past a
//! budget and missing backstops; `hops.rs` tells inflating hops, fail-fast thresholds,
//! reserves, stacked retries and budgets the work cannot fit. Pure: rollups in, findings
//! out. Each finding rests on counts and quantiles the page shows, and a healthy system
//! (budgets propagated, reserves kept, few retries at one layer) yields none.

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

/// A hop as people read it: "service operation", or the peer alone.
pub fn hop_label((service, operation): &HopId) -> String {
    if operation.is_empty() {
        service.clone()
    } else {
        format!("{service} {operation}")
    }
}

/// Milliseconds as findings write them: "250 ms".
pub fn ms(value: f64) -> String {
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
        out.extend(hops::hop_findings(hop, rollup, edges, tolerance_ms));
    }
    out.sort_by(|a, b| b.impact.total_cmp(&a.impact));
    out
}

mod edges;
mod hops;

pub use edges::edge_findings;

#[cfg(test)]
mod tests;

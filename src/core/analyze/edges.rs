//! Per call edge: what one hop's calls to one callee contributed (`EdgeSample`, carried in
//! its hop sample) and the mergeable per-minute `EdgeRollup` they add up to: the service
//! map's and the advisor's statistics (docs/budget-semantics.md, "Edges"). Pure.

use std::collections::{BTreeMap, HashMap};

use super::histogram::Histogram;
use super::{Analysis, Flag, Role};
use crate::core::model::{Span, SpanId};

/// What one hop's calls to one callee contributed: the edge statistics of the service map
/// (docs/budget-semantics.md, "Edges").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeSample {
    /// The callee's hop identity; for a call that reached no instrumented hop, its peer as
    /// the call span names it (`server.address`, `peer.service`, `rpc.service`, else the
    /// span name) and an empty operation.
    pub callee_service: String,
    pub callee_operation: String,
    /// The calls of this one request (`requests` is 1).
    pub stats: EdgeRollup,
}

/// What an edge counts per call: `inflated` (the call forwarded more than was left, or the
/// callee took more than it was sent), `clamped` (the callee received less than was
/// forwarded, beyond the network time and τ), `dropped`, `doomed`, `retry`, `unsafe_retry`.
pub const EDGE_COUNTED: [&str; 6] = [
    "inflated",
    "clamped",
    "dropped",
    "doomed",
    "retry",
    "unsafe_retry",
];

/// Per call edge (caller hop identity → callee) and minute: `EdgeSample`s added up.
/// `add` with weight −1 removes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EdgeRollup {
    /// Requests of the caller that made these calls (attempts per request: calls ÷ this).
    pub requests: i64,
    /// Call spans (attempts) and, of them, each kind counted in `EDGE_COUNTED` order.
    pub calls: i64,
    pub counts: [i64; EDGE_COUNTED.len()],
    /// Per call: the budget it forwarded, what its caller had left, its duration, and for
    /// an instrumented callee with a budget, forwarded − network time − received.
    pub forwarded: Histogram,
    pub left: Histogram,
    pub latency: Histogram,
    pub shortfall: Histogram,
}

/// (caller service, caller operation, callee service, callee operation, minute).
pub type EdgeKey = (String, String, String, String, u64);

impl EdgeRollup {
    pub fn add(&mut self, sample: &EdgeSample, weight: i64) {
        self.merge_weighted(&sample.stats, weight);
    }

    pub fn merge(&mut self, other: &EdgeRollup) {
        self.merge_weighted(other, 1);
    }

    /// Adds `other` once (weight 1) or takes it back out (−1).
    fn merge_weighted(&mut self, other: &EdgeRollup, weight: i64) {
        self.requests += weight * other.requests;
        self.calls += weight * other.calls;
        for (total, count) in self.counts.iter_mut().zip(other.counts) {
            *total += weight * count;
        }
        for (total, part) in [
            (&mut self.forwarded, &other.forwarded),
            (&mut self.left, &other.left),
            (&mut self.latency, &other.latency),
            (&mut self.shortfall, &other.shortfall),
        ] {
            if weight >= 0 {
                total.merge(part);
            } else {
                total.unmerge(part);
            }
        }
    }

    fn tally(&mut self, name: &str) {
        if let Some(i) = EDGE_COUNTED.iter().position(|n| *n == name) {
            self.counts[i] += 1;
        }
    }

    pub fn count(&self, name: &str) -> i64 {
        EDGE_COUNTED
            .iter()
            .position(|n| *n == name)
            .map_or(0, |i| self.counts[i])
    }
}

/// One call span and the edge it is on.
pub struct CallEdge {
    /// Its row.
    pub call: usize,
    /// The span index of the hop that made it.
    pub owner: usize,
    /// The row of the first hop under it, when it reached an instrumented one.
    pub callee: Option<usize>,
    /// The callee's hop identity, or its peer and an empty operation (`EdgeSample`).
    pub callee_key: (String, String),
}

/// Every call span made by a hop, with the edge it is on, in waterfall order.
pub fn call_edges(spans: &[Span], analysis: &Analysis) -> Vec<CallEdge> {
    let row_of: HashMap<usize, usize> = analysis
        .rows
        .iter()
        .enumerate()
        .map(|(r, row)| (row.span, r))
        .collect();
    let mut span_index: HashMap<SpanId, usize> = HashMap::new();
    for (i, span) in spans.iter().enumerate() {
        span_index.entry(span.span_id).or_insert(i);
    }
    // The first hop under each call, in waterfall order.
    let mut callee_of: HashMap<usize, usize> = HashMap::new();
    for (r, row) in analysis.rows.iter().enumerate() {
        let parent = spans[row.span]
            .parent_span_id
            .and_then(|p| span_index.get(&p))
            .and_then(|p| row_of.get(p));
        if row.role == Role::Hop
            && let Some(&call) = parent
            && analysis.rows[call].role == Role::Call
        {
            callee_of.entry(call).or_insert(r);
        }
    }
    let mut out = Vec::new();
    for (c, call) in analysis.rows.iter().enumerate() {
        let Some(owner) = call.owner.filter(|_| call.role == Role::Call) else {
            continue;
        };
        let callee = callee_of.get(&c).copied();
        let callee_key = match callee {
            Some(h) => {
                let hop = &spans[analysis.rows[h].span];
                (hop.service.clone(), hop.name.clone())
            }
            None => (super::rules::peer_label(&spans[call.span]), String::new()),
        };
        out.push(CallEdge {
            call: c,
            owner,
            callee,
            callee_key,
        });
    }
    out
}

/// The edge samples of each hop, by the hop's span index.
pub(super) fn edge_samples(
    analysis: &Analysis,
    edges: &[CallEdge],
    tolerance_ms: f64,
) -> BTreeMap<usize, Vec<EdgeSample>> {
    let mut by_hop: BTreeMap<usize, BTreeMap<(String, String), EdgeRollup>> = BTreeMap::new();
    for found in edges {
        let call = &analysis.rows[found.call];
        let callee = found.callee.map(|h| &analysis.rows[h]);
        let edge = by_hop
            .entry(found.owner)
            .or_default()
            .entry(found.callee_key.clone())
            .or_default();
        edge.requests = 1;
        edge.calls += 1;
        let has = |row: &super::Row, flag: Flag| row.flags.iter().any(|f| f.flag == flag);
        if has(call, Flag::Inflated) || callee.is_some_and(|h| has(h, Flag::Inflated)) {
            edge.tally("inflated");
        }
        for (flag, name) in [
            (Flag::Doomed, "doomed"),
            (Flag::Retry, "retry"),
            (Flag::UnsafeRetry, "unsafe_retry"),
        ] {
            if has(call, flag) {
                edge.tally(name);
            }
        }
        if callee.is_some_and(|h| has(h, Flag::Dropped)) {
            edge.tally("dropped");
        }
        if let Some(forwarded) = call.budget_ms {
            edge.forwarded.record(forwarded, 1);
            if let Some(hop) = callee
                && let Some(received) = hop.budget_ms
            {
                let network = (hop.start_offset_ms - call.start_offset_ms).max(0.0);
                let shortfall = forwarded - network - received;
                edge.shortfall.record(shortfall, 1);
                if shortfall > tolerance_ms {
                    edge.tally("clamped");
                }
            }
        }
        if let Some(left) = call.available_ms {
            edge.left.record(left, 1);
        }
        edge.latency.record(call.duration_ms, 1);
    }
    by_hop
        .into_iter()
        .map(|(owner, edges)| {
            let edges = edges
                .into_iter()
                .map(|((service, operation), stats)| EdgeSample {
                    callee_service: service,
                    callee_operation: operation,
                    stats,
                })
                .collect();
            (owner, edges)
        })
        .collect()
}

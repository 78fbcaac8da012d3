//! What the advisor's hop findings read from each hop of a trace (`AdviceSample`, carried in
//! its hop sample) and the mergeable per-minute `AdviceRollup` they add up to
//! (docs/budget-semantics.md, "Advice"). Pure.

use std::collections::BTreeMap;

use super::edges::{CallEdge, EdgeSample};
use super::histogram::Histogram;
use super::{Analysis, Flag, Outcome, Role};
use crate::core::model::Span;

/// What an advice rollup counts, in `AdviceRollup::counts` order: requests that ended in a
/// deadline exceed at the hop; requests the hop gave itself a larger budget than it was
/// sent (`inflating`); requests it answered late while its post-call work outlasted the
/// reserve it kept (`short_reserve`); and, for requests that enter at the hop, those with
/// retries stacked at more than one layer (`stacked_retry`), and those that exceeded with
/// no waste in the trace (`clean_exceeded`: no retry, doomed, dropped or inflated call).
pub const ADVICE_COUNTED: [&str; 5] = [
    "exceeded",
    "inflating",
    "short_reserve",
    "stacked_retry",
    "clean_exceeded",
];

/// One hop of one trace, as the advisor's hop findings see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdviceSample {
    /// The hop ended in a deadline exceed (local, or cancelled/arrived spent: inherited).
    pub exceeded: bool,
    /// It received more than its caller forwarded: it replaced the budget with its own.
    pub inflating: bool,
    /// Its post-call work: from its last call's end to its answer (hops that made calls
    /// and answered after them).
    pub tail_ms: Option<f64>,
    /// What it kept back at its last call that carried a budget: left − forwarded.
    pub kept_ms: Option<f64>,
    /// It overspent, and its post-call work took more than it kept back (beyond τ), while
    /// its call forwarded no more than was left and the work fits in its budget.
    pub short_reserve: bool,
    /// Set on the hop the request entered at (the edge hop): the request's shape.
    pub request: Option<RequestShape>,
}

/// What one request looked like as a whole, recorded at its edge hop.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestShape {
    /// For a request with a budget and no waste in the trace: how long its work took
    /// uncut, from the edge hop's start to the last span's end.
    pub need_ms: Option<f64>,
    /// Such a request exceeded its budget.
    pub clean_exceeded: bool,
    /// The most calls that reached one service (hops of one service).
    pub reached: u32,
    /// The most hops on one chain of calls that each retried the call leading down it.
    pub layers: u32,
}

/// Per hop identity and minute: `AdviceSample`s added up. Only samples with a budget
/// feed `exceeded_budget`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdviceRollup {
    pub counts: [i64; ADVICE_COUNTED.len()],
    /// The received budgets of requests that ended in a deadline exceed (beside the hop
    /// rollup's `budget`, every request's).
    pub exceeded_budget: Histogram,
    pub tail: Histogram,
    pub kept: Histogram,
    /// `RequestShape::need_ms` of the requests entering at the hop.
    pub need: Histogram,
    /// Requests entering at the hop, by `RequestShape::reached` (exact: a worst case is
    /// reported as counted).
    pub reached: BTreeMap<u32, i64>,
}

impl AdviceRollup {
    pub fn add(&mut self, sample: &AdviceSample, budget_ms: Option<f64>, weight: i64) {
        let mut tally = |name: &str, on: bool| {
            if on && let Some(i) = ADVICE_COUNTED.iter().position(|n| *n == name) {
                self.counts[i] += weight;
            }
        };
        tally("exceeded", sample.exceeded);
        tally("inflating", sample.inflating);
        tally("short_reserve", sample.short_reserve);
        if let Some(request) = &sample.request {
            tally("stacked_retry", request.layers >= 2);
            tally("clean_exceeded", request.clean_exceeded);
        }
        if sample.exceeded
            && let Some(budget) = budget_ms
        {
            self.exceeded_budget.record(budget, weight);
        }
        if let Some(tail) = sample.tail_ms {
            self.tail.record(tail, weight);
        }
        if let Some(kept) = sample.kept_ms {
            self.kept.record(kept, weight);
        }
        if let Some(request) = &sample.request {
            if let Some(need) = request.need_ms {
                self.need.record(need, weight);
            }
            add_tally(&mut self.reached, request.reached, weight);
        }
    }

    /// Adds `other` once (weight 1) or takes it back out (−1).
    pub fn merge_weighted(&mut self, other: &AdviceRollup, weight: i64) {
        for (total, count) in self.counts.iter_mut().zip(other.counts) {
            *total += weight * count;
        }
        for (total, part) in [
            (&mut self.exceeded_budget, &other.exceeded_budget),
            (&mut self.tail, &other.tail),
            (&mut self.kept, &other.kept),
            (&mut self.need, &other.need),
        ] {
            if weight >= 0 {
                total.merge(part);
            } else {
                total.unmerge(part);
            }
        }
        for (&reached, &count) in &other.reached {
            add_tally(&mut self.reached, reached, weight * count);
        }
    }

    pub fn count(&self, name: &str) -> i64 {
        ADVICE_COUNTED
            .iter()
            .position(|n| *n == name)
            .map_or(0, |i| self.counts[i])
    }

    /// Requests that entered at the hop.
    pub fn entered(&self) -> i64 {
        self.reached.values().sum()
    }
}

fn add_tally(tally: &mut BTreeMap<u32, i64>, key: u32, weight: i64) {
    let count = tally.entry(key).or_insert(0);
    *count += weight;
    if *count == 0 {
        tally.remove(&key);
    }
}

/// Each hop's advice sample, by the hop's row index. `edges` are the trace's calls
/// (`call_edges`), `calls` each hop's edge samples by its span index (which callee it
/// retried).
pub(super) fn advice_samples(
    spans: &[Span],
    analysis: &Analysis,
    edges: &[CallEdge],
    calls: &BTreeMap<usize, Vec<EdgeSample>>,
) -> BTreeMap<usize, AdviceSample> {
    let rows = &analysis.rows;
    let tau = analysis.tolerance_ms;
    let has = |r: usize, flag: Flag| rows[r].flags.iter().any(|f| f.flag == flag);
    let end = |r: usize| rows[r].start_offset_ms + rows[r].duration_ms;
    // Each hop's calls, by its span index: one pass, not one per hop.
    let mut owned_by: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for edge in edges {
        owned_by.entry(edge.owner).or_default().push(edge.call);
    }
    let mut out = BTreeMap::new();
    for (h, hop) in rows.iter().enumerate() {
        if hop.role != Role::Hop {
            continue;
        }
        let owned = owned_by.get(&hop.span).map_or(&[][..], Vec::as_slice);
        let last_end = owned.iter().map(|&c| end(c)).reduce(f64::max);
        let tail_ms = last_end
            .map(|last| end(h) - last)
            .filter(|tail| *tail >= 0.0);
        let kept_ms = owned
            .iter()
            .filter_map(|&c| {
                Some((
                    rows[c].start_offset_ms,
                    rows[c].available_ms? - rows[c].budget_ms?,
                ))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, kept)| kept);
        // A reserve would have helped: the call took no more than was left, and the
        // post-call work fits in the budget the hop received.
        let short_reserve = has(h, Flag::Overspent)
            && matches!((tail_ms, kept_ms, hop.budget_ms), (Some(tail), Some(kept), Some(budget))
                if kept >= -tau && tail > kept.max(0.0) + tau && tail < budget);
        out.insert(
            h,
            AdviceSample {
                exceeded: hop.exceed.is_some(),
                inflating: has(h, Flag::Inflated),
                tail_ms,
                kept_ms,
                short_reserve,
                request: None,
            },
        );
    }
    if let Some(edge) = analysis.edge
        && let Some(sample) = out.get_mut(&edge)
    {
        sample.request = Some(request_shape(spans, analysis, calls, edge));
    }
    out
}

/// The shape of the request entering at row `edge`.
fn request_shape(
    spans: &[Span],
    analysis: &Analysis,
    calls: &BTreeMap<usize, Vec<EdgeSample>>,
    edge: usize,
) -> RequestShape {
    let rows = &analysis.rows;
    let wasteful = [Flag::Retry, Flag::Doomed, Flag::Dropped, Flag::Inflated];
    let clean = !wasteful
        .iter()
        .any(|flag| analysis.flag_counts.get(flag).is_some_and(|n| *n > 0));
    let start = rows[edge].start_offset_ms;
    let need_ms = (clean && rows[edge].budget_ms.is_some()).then(|| {
        rows.iter()
            .map(|row| row.start_offset_ms + row.duration_ms)
            .fold(start, f64::max)
            - start
    });
    RequestShape {
        need_ms,
        clean_exceeded: need_ms.is_some() && analysis.outcome == Outcome::Exceeded,
        reached: analysis
            .calls_reaching
            .values()
            .max()
            .map_or(1, |n| u32::try_from(*n).unwrap_or(u32::MAX)),
        layers: retry_layers(spans, analysis, calls),
    }
}

/// The most hops on one chain of calls that each retried the callee the chain goes on to.
fn retry_layers(
    spans: &[Span],
    analysis: &Analysis,
    calls: &BTreeMap<usize, Vec<EdgeSample>>,
) -> u32 {
    let rows = &analysis.rows;
    let row_of_span: BTreeMap<usize, usize> = rows
        .iter()
        .enumerate()
        .map(|(r, row)| (row.span, r))
        .collect();
    let span_of_id: BTreeMap<_, usize> = spans
        .iter()
        .enumerate()
        .map(|(i, span)| (span.span_id, i))
        .collect();
    // Whether a hop retried some callee (any, or the one named).
    let retried = |hop_span: usize, callee: Option<(&str, &str)>| -> bool {
        calls.get(&hop_span).is_some_and(|edges| {
            edges.iter().any(|e| {
                e.stats.count("retry") > 0
                    && callee.is_none_or(|(service, operation)| {
                        e.callee_service == service && e.callee_operation == operation
                    })
            })
        })
    };
    // Waterfall order puts children after their parents: walk it backwards.
    let mut layers: BTreeMap<usize, u32> = BTreeMap::new();
    for row in rows.iter().rev() {
        if row.role != Role::Hop {
            continue;
        }
        let own = layers
            .get(&row.span)
            .copied()
            .unwrap_or_else(|| u32::from(retried(row.span, None)));
        layers.insert(row.span, own);
        // The hop that called this one, through its call span.
        let span = &spans[row.span];
        let caller = span
            .parent_span_id
            .and_then(|p| span_of_id.get(&p))
            .and_then(|c| row_of_span.get(c))
            .filter(|&&c| rows[c].role == Role::Call)
            .and_then(|&c| rows[c].owner);
        if let Some(caller) = caller {
            let through = u32::from(retried(caller, Some((&span.service, &span.name)))) + own;
            let entry = layers
                .entry(caller)
                .or_insert_with(|| u32::from(retried(caller, None)));
            *entry = (*entry).max(through);
        }
    }
    analysis
        .edge
        .and_then(|e| layers.get(&rows[e].span))
        .copied()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::fixture::parse;
    use crate::core::analyze::hops::samples;
    use crate::core::analyze::{AnalyzeOptions, analyze};

    fn advice_of(fixture: &str) -> Vec<(String, AdviceSample)> {
        let spans = parse(fixture);
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        samples(&spans, &analysis)
            .into_iter()
            .map(|s| (s.service, s.advice))
            .collect()
    }

    #[test]
    fn three_retrying_layers_and_27_calls_are_the_requests_shape() {
        let fixture = crate::core::analyze::fixture::retry_storm(false);
        let advice = advice_of(&fixture);
        let edge = advice.iter().find(|(s, _)| s == "edge").unwrap();
        let request = edge.1.request.unwrap();
        assert_eq!((request.reached, request.layers), (27, 3));
        assert!(request.need_ms.is_none(), "retries are waste: no need");
        // Only the edge hop carries the request's shape.
        assert!(advice.iter().filter(|(_, a)| a.request.is_some()).count() == 1);
        // One layer retrying is one layer.
        let one = advice_of(
            r#"
edge server "GET /" 0 500 budget=1000
  edge client "x" 10 100 budget=900
    x server "X" 11 98 budget=899
  edge client "x" 120 100 budget=800
    x server "X" 121 98 budget=799
"#,
        );
        assert_eq!(one[0].1.request.unwrap().layers, 1);
    }

    #[test]
    fn a_short_reserve_is_post_call_work_past_what_was_kept() {
        // Kept 10 ms back at its call, worked 90 ms after it, answered 85 ms late.
        let advice = advice_of(
            r#"
edge server "GET /" 0 385 budget=300
  edge client "x" 5 285 budget=285
    x server "X" 6 283 budget=284
"#,
        );
        let edge = &advice[0].1;
        assert_eq!(edge.kept_ms, Some(10.0));
        assert!((edge.tail_ms.unwrap() - 95.0).abs() < 1e-9, "{edge:?}");
        assert!(edge.short_reserve);
        // The same work inside the budget: no short reserve, whatever was kept.
        let advice = advice_of(
            r#"
edge server "GET /" 0 385 budget=1000
  edge client "x" 5 285 budget=985
    x server "X" 6 283 budget=984
"#,
        );
        assert!(!advice[0].1.short_reserve);
    }

    #[test]
    fn a_clean_request_records_its_uncut_need_and_an_inflating_hop_is_marked() {
        // Work went on past the deadline below: the need is the last span's end.
        let advice = advice_of(
            r#"
edge server "GET /" 0 300 budget=300 grpc-status=4
  edge client "x" 5 295 budget=295
    x server "X" 6 450 budget=294
"#,
        );
        let request = advice[0].1.request.unwrap();
        assert_eq!(request.need_ms, Some(456.0));
        assert!(request.clean_exceeded);
        let advice = advice_of(
            r#"
edge server "GET /" 0 100 budget=300
  edge client "x" 5 90 budget=290
    x server "X" 6 88 budget=5000
"#,
        );
        let x = advice.iter().find(|(s, _)| s == "x").unwrap();
        assert!(x.1.inflating);
        assert!(
            advice[0].1.request.unwrap().need_ms.is_none(),
            "inflated: waste"
        );
    }
}

//! What if: a proposed change to one hop or call edge, replayed over recorded traces
//! (docs/budget-semantics.md, "What if"). Pure: a trace and its analysis in, the change's
//! effect on that trace out; the caller adds the effects of a window's traces up.
//!
//! The model: every hop's and call's recorded times stand; a refused request or a call cut
//! by a timeout ends at once with a deadline error that its caller passes on; nothing
//! downstream is re-timed, and a retry that is removed leaves the first attempt's result.

use crate::core::advice::HopId;
use crate::core::analyze::edges::{CallEdge, call_edges};
use crate::core::analyze::{Analysis, Flag, Role, Row, span_failed};
use crate::core::model::Span;

/// The model's assumptions, as the what-if page and answer state them.
pub const ASSUMPTIONS: &str = "The replay keeps every recorded time: the hops' work and \
    the calls' durations stay as they were. A refused request, or a call cut by a timeout or \
    by a smaller forwarded budget, ends at once with a deadline error, and its caller passes \
    that failure on; a request the change acts on fails fast if it failed (exceeded, \
    overspent or errored) as recorded, and newly fails if it went well. Without retries, \
    the first attempt's result stands. Nothing downstream is re-timed, load is not \
    modelled (fewer calls would not make the others faster), and only the most recent \
    traces of the range are replayed.";

/// A change to try.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The hop refuses requests that arrive with less than `ms` left.
    MinUsefulBudget { hop: HopId, ms: f64 },
    /// The hop keeps `ms` back when it forwards its budget.
    Reserve { hop: HopId, ms: f64 },
    /// The caller gives up on each call to the callee after `ms`.
    Timeout {
        caller: HopId,
        callee: HopId,
        ms: f64,
    },
    /// The caller stops retrying the callee.
    RetriesOff { caller: HopId, callee: HopId },
}

impl Change {
    /// The hop whose traces the change touches (an edge's caller).
    pub fn at(&self) -> &HopId {
        match self {
            Change::MinUsefulBudget { hop, .. } | Change::Reserve { hop, .. } => hop,
            Change::Timeout { caller, .. } | Change::RetriesOff { caller, .. } => caller,
        }
    }
}

/// What a change does to some requests: those replayed (the hop's requests, or the
/// caller's requests with calls on the edge), those the change acts on (refused, cut,
/// retries removed, forwarded less), of them those that would have failed fast instead of
/// failing late, the milliseconds of waiting or work that saves, and those that succeeded
/// and would fail.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Effect {
    pub seen: i64,
    pub touched: i64,
    pub failed_fast: i64,
    pub saved_ms: f64,
    pub newly_failed: i64,
}

impl Effect {
    pub fn add(&mut self, other: &Effect) {
        self.seen += other.seen;
        self.touched += other.touched;
        self.failed_fast += other.failed_fast;
        self.saved_ms += other.saved_ms;
        self.newly_failed += other.newly_failed;
    }
}

/// The caller's requests (hop spans) among some calls.
fn owners_of(edges: &[CallEdge]) -> i64 {
    let mut owners: Vec<usize> = edges.iter().map(|e| e.owner).collect();
    owners.sort_unstable();
    owners.dedup();
    owners.len() as i64
}

fn is(span: &Span, (service, operation): &HopId) -> bool {
    span.service == *service && span.name == *operation
}

/// Whether a hop's request (or a call with no instrumented callee) went well: no deadline
/// exceed, no overspending, no failure status.
fn went_well(span: &Span, row: &Row) -> bool {
    row.exceed.is_none()
        && !row.flags.iter().any(|f| f.flag == Flag::Overspent)
        && !span_failed(span)
}

/// Whether a call went well: its callee's request did, or (no instrumented callee) the
/// call span says so.
fn call_went_well(spans: &[Span], analysis: &Analysis, edge: &CallEdge) -> bool {
    let row = edge.callee.unwrap_or(edge.call);
    went_well(&spans[analysis.rows[row].span], &analysis.rows[row])
}

/// The change's effect on one analysed trace.
pub fn replay(change: &Change, spans: &[Span], analysis: &Analysis) -> Effect {
    let rows = &analysis.rows;
    let mut effect = Effect::default();
    let on_edge = |caller: &HopId, callee: &HopId| -> Vec<CallEdge> {
        call_edges(spans, analysis)
            .into_iter()
            .filter(|e| is(&spans[e.owner], caller) && e.callee_key == *callee)
            .collect()
    };
    match change {
        Change::MinUsefulBudget { hop, ms } => {
            for row in rows.iter().filter(|r| r.role == Role::Hop) {
                let span = &spans[row.span];
                if !is(span, hop) {
                    continue;
                }
                effect.seen += 1;
                if !row.budget_ms.is_some_and(|b| b < *ms) {
                    continue;
                }
                effect.touched += 1;
                if went_well(span, row) {
                    effect.newly_failed += 1;
                } else {
                    effect.failed_fast += 1;
                    effect.saved_ms += row.duration_ms;
                }
            }
        }
        Change::Timeout { caller, callee, ms } => {
            let edges = on_edge(caller, callee);
            effect.seen += owners_of(&edges);
            for edge in edges {
                let call = &rows[edge.call];
                if call.duration_ms <= *ms {
                    continue;
                }
                effect.touched += 1;
                if call_went_well(spans, analysis, &edge) {
                    effect.newly_failed += 1;
                } else {
                    effect.failed_fast += 1;
                    effect.saved_ms += call.duration_ms - ms;
                }
            }
        }
        Change::RetriesOff { caller, callee } => {
            let edges = on_edge(caller, callee);
            effect.seen += owners_of(&edges);
            // Each request of the caller: its attempts at the callee, in attempt order.
            let mut owners: Vec<usize> = edges.iter().map(|e| e.owner).collect();
            owners.sort_unstable();
            owners.dedup();
            for owner in owners {
                let mut attempts: Vec<&CallEdge> =
                    edges.iter().filter(|e| e.owner == owner).collect();
                attempts.sort_by_key(|e| rows[e.call].attempt.unwrap_or(1));
                if attempts.len() < 2 || call_went_well(spans, analysis, attempts[0]) {
                    continue;
                }
                effect.touched += 1;
                let last = attempts[attempts.len() - 1];
                if call_went_well(spans, analysis, last) {
                    effect.newly_failed += 1;
                } else {
                    effect.failed_fast += 1;
                    effect.saved_ms += attempts[1..]
                        .iter()
                        .map(|e| rows[e.call].duration_ms)
                        .sum::<f64>();
                }
            }
        }
        Change::Reserve { hop, ms } => {
            let edges = call_edges(spans, analysis);
            for row in rows.iter().filter(|r| r.role == Role::Hop) {
                let span = &spans[row.span];
                if !is(span, hop) {
                    continue;
                }
                effect.seen += 1;
                // Its last call that carried a budget.
                let Some(edge) = edges
                    .iter()
                    .filter(|e| e.owner == row.span)
                    .filter(|e| {
                        rows[e.call].budget_ms.is_some() && rows[e.call].available_ms.is_some()
                    })
                    .max_by(|a, b| {
                        rows[a.call]
                            .start_offset_ms
                            .total_cmp(&rows[b.call].start_offset_ms)
                    })
                else {
                    continue;
                };
                let call = &rows[edge.call];
                let (Some(forwarded), Some(left)) = (call.budget_ms, call.available_ms) else {
                    continue;
                };
                let reduced = forwarded.min(left - ms);
                if reduced >= forwarded {
                    continue;
                }
                effect.touched += 1;
                // The callee runs out at the reduced budget when it took longer.
                if call.duration_ms <= reduced.max(0.0) + analysis.tolerance_ms {
                    continue;
                }
                if went_well(span, row) {
                    effect.newly_failed += 1;
                } else {
                    effect.failed_fast += 1;
                    effect.saved_ms += call.duration_ms - reduced.max(0.0);
                }
            }
        }
    }
    effect
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::fixture::{parse, retry_storm};
    use crate::core::analyze::{AnalyzeOptions, analyze};

    fn id(service: &str, operation: &str) -> HopId {
        (service.into(), operation.into())
    }

    fn effect(change: &Change, fixture: &str) -> Effect {
        let spans = parse(fixture);
        replay(change, &spans, &analyze(&spans, &AnalyzeOptions::default()))
    }

    /// pricing receives `budget` and works `work` ms, ending with a deadline error when it
    /// runs past its budget.
    fn priced(budget: f64, work: f64) -> String {
        let status = if work > budget { " grpc-status=4" } else { "" };
        format!(
            r#"
orders server "POST /orders" 0 {} budget=1000
  orders client "GET /price" 5 {} budget={budget}
    pricing server "GET /price" 6 {} budget={}{status}
"#,
            work + 20.0,
            work + 4.0,
            work,
            budget - 1.0,
        )
    }

    #[test]
    fn refusing_below_a_minimum_fails_fast_what_would_exceed_and_fails_what_would_not() {
        let refuse = Change::MinUsefulBudget {
            hop: id("pricing", "GET /price"),
            ms: 250.0,
        };
        let hopeless = effect(&refuse, &priced(150.0, 300.0));
        assert_eq!(
            hopeless,
            Effect {
                seen: 1,
                touched: 1,
                failed_fast: 1,
                saved_ms: 300.0,
                newly_failed: 0
            }
        );
        let fine = effect(&refuse, &priced(150.0, 60.0));
        assert_eq!((fine.touched, fine.newly_failed), (1, 1));
        let above = effect(&refuse, &priced(400.0, 300.0));
        assert_eq!((above.seen, above.touched), (1, 0));
    }

    #[test]
    fn a_timeout_cuts_slow_calls_and_retries_off_keeps_the_first_attempt() {
        let timeout = Change::Timeout {
            caller: id("orders", "POST /orders"),
            callee: id("pricing", "GET /price"),
            ms: 200.0,
        };
        let slow_failure = effect(&timeout, &priced(250.0, 300.0));
        assert_eq!(
            (slow_failure.failed_fast, slow_failure.saved_ms),
            (1, 104.0)
        );
        let slow_success = effect(&timeout, &priced(1000.0, 300.0));
        assert_eq!(slow_success.newly_failed, 1);
        assert_eq!(effect(&timeout, &priced(1000.0, 100.0)).touched, 0);

        // The 27-call storm: each of b's 9 requests makes 3 failing attempts at the leaf.
        let off = Change::RetriesOff {
            caller: id("b", "B"),
            callee: id("leaf", "C"),
        };
        let storm = effect(&off, &retry_storm(false));
        assert_eq!(
            (
                storm.seen,
                storm.touched,
                storm.failed_fast,
                storm.newly_failed
            ),
            (9, 9, 9, 0)
        );
        assert_eq!(storm.saved_ms, 9.0 * 2.0 * 300.0);
        // A retry that saved the request: without it, the request fails.
        let saved = effect(
            &Change::RetriesOff {
                caller: id("a", "A"),
                callee: id("b", "B"),
            },
            r#"
a server "A" 0 500 budget=1000
  a client "B" 5 100 budget=990
    b server "B" 6 98 budget=989 grpc-status=14
  a client "B" 110 100 budget=885
    b server "B" 111 98 budget=884
"#,
        );
        assert_eq!((saved.touched, saved.newly_failed), (1, 1));
    }

    #[test]
    fn a_reserve_cuts_the_callee_so_a_late_hop_answers_in_time() {
        // orders forwards all 585 ms it has, pricing takes 560, then 100 ms of post-call
        // work make orders late; keeping 100 back cuts pricing at 485 instead.
        let late = r#"
orders server "POST /orders" 0 670 budget=590
  orders client "GET /price" 5 562 budget=585
    pricing server "GET /price" 6 560 budget=584
"#;
        let reserve = Change::Reserve {
            hop: id("orders", "POST /orders"),
            ms: 100.0,
        };
        let found = effect(&reserve, late);
        assert_eq!(
            (found.touched, found.failed_fast, found.newly_failed),
            (1, 1, 0)
        );
        assert!((found.saved_ms - 77.0).abs() < 1e-9, "{found:?}");
        // A callee fast enough for the reduced budget is not affected.
        let quick = late.replace("5 562", "5 200").replace("6 560", "6 198");
        assert_eq!(effect(&reserve, &quick).failed_fast, 0);
    }
}

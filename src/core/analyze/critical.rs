//! The critical path: the chain of work that decided when the edge hop answered, found as
//! Jaeger finds it. From a span's end, walk back through the child that finished last
//! before the point reached, then the child that finished last before that one started,
//! and so on to the span's start; the gaps are the span's own time on the path, and each
//! chosen child is walked the same way. A child that ends more than τ after its parent is
//! not on the path (work its caller did not wait for); one within τ is cut at the parent's
//! end. The walk starts at the edge hop (the first root without one) and reads the shown,
//! skew-adjusted times (docs/budget-semantics.md, "The critical path").
//!
//! Architecture invariant: runs after `skew::adjust`; it sets only `Row::critical_ms`,
//! `Analysis::critical_path` and `Analysis::critical_hop`, which no flag reads.

use std::collections::HashMap;

use super::Analysis;
use super::tree::Tree;

pub(super) fn mark(tree: &Tree, analysis: &mut Analysis) {
    let Some(start) = analysis.edge.or((!analysis.rows.is_empty()).then_some(0)) else {
        return;
    };
    let tolerance = analysis.tolerance_ms.max(0.0);
    let mut row_of = vec![usize::MAX; tree.parent.len()];
    for (r, row) in analysis.rows.iter().enumerate() {
        row_of[row.span] = r;
    }
    let times = |span: usize| {
        let row = &analysis.rows[row_of[span]];
        (
            row.start_offset_ms,
            row.start_offset_ms + row.duration_ms.max(0.0),
        )
    };
    let mut own: Vec<(usize, f64)> = Vec::new();
    // (span, the end of its part of the path); a stack, so depth costs no recursion.
    let mut stack = vec![(
        analysis.rows[start].span,
        times(analysis.rows[start].span).1,
    )];
    while let Some((span, end)) = stack.pop() {
        let (span_start, span_end) = times(span);
        let mut children: Vec<(usize, f64, f64)> = tree.children[span]
            .iter()
            .filter(|&&c| row_of[c] != usize::MAX)
            .filter_map(|&c| {
                let (child_start, child_end) = times(c);
                (child_end <= span_end + tolerance).then_some((c, child_start, child_end.min(end)))
            })
            .collect();
        // Latest end first; of equal ends, the later start (the shorter wait) first.
        children.sort_by(|a, b| b.2.total_cmp(&a.2).then(b.1.total_cmp(&a.1)));
        let mut cursor = end;
        let mut time = 0.0;
        for (child, child_start, child_end) in children {
            if child_end > cursor || child_start >= cursor {
                continue;
            }
            time += cursor - child_end;
            stack.push((child, child_end));
            cursor = child_start.max(span_start);
        }
        time += (cursor - span_start).max(0.0);
        own.push((row_of[span], time));
    }
    let mut per_hop: HashMap<usize, f64> = HashMap::new();
    for &(r, time) in &own {
        analysis.rows[r].critical_ms = Some(time);
        if let Some(owner) = analysis.rows[r].owner {
            *per_hop.entry(row_of[owner]).or_insert(0.0) += time;
        }
    }
    let mut path: Vec<usize> = own.iter().map(|&(r, _)| r).collect();
    path.sort_unstable();
    analysis.critical_path = path;
    // The hop with the most time of its own on the path; of equal times, the first row.
    analysis.critical_hop = per_hop
        .into_iter()
        .filter(|&(r, _)| r != usize::MAX)
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(r, _)| r);
}

#[cfg(test)]
mod tests {
    use crate::core::analyze::fixture::{parse, shift_service};
    use crate::core::analyze::{Analysis, AnalyzeOptions, analyze};
    use crate::core::model::Span;

    fn run(fixture: &str) -> (Vec<Span>, Analysis) {
        let spans = parse(fixture);
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        (spans, analysis)
    }

    /// "service kind name" of each row on the path, and of the critical hop.
    fn path(spans: &[Span], analysis: &Analysis) -> (Vec<String>, Option<String>) {
        let label = |r: usize| {
            let span = &spans[analysis.rows[r].span];
            format!("{} {:?} {}", span.service, span.kind, span.name)
        };
        (
            analysis.critical_path.iter().map(|&r| label(r)).collect(),
            analysis.critical_hop.map(label),
        )
    }

    fn own(spans: &[Span], analysis: &Analysis, name: &str) -> Option<f64> {
        let row = analysis.rows.iter().find(|r| spans[r.span].name == name)?;
        row.critical_ms.map(|ms| (ms * 1e3).round() / 1e3)
    }

    #[test]
    fn in_a_fan_out_the_slow_branch_is_on_the_path_and_the_fast_one_is_not() {
        let (spans, analysis) = run(r#"
checkout server "GET /page" 0 500 budget=1000
  checkout client "pricing" 5 402
    pricing server "GET /price" 6 400
  checkout client "stock" 5 480
    stock server "GET /stock" 6 478
      stock client "db" 10 150
        db server "GET /row" 11 148
      stock client "search" 162 310
        search server "GET /find" 163 308
"#);
        let (on, hop) = path(&spans, &analysis);
        assert_eq!(
            on,
            [
                "checkout Server GET /page",
                "checkout Client stock",
                "stock Server GET /stock",
                "stock Client db",
                "db Server GET /row",
                "stock Client search",
                "search Server GET /find",
            ]
        );
        // The burner (most self time) finished early, off the path; search made it late.
        let burner = analysis
            .burner
            .map(|r| spans[analysis.rows[r].span].service.as_str());
        assert_eq!(burner, Some("pricing"));
        assert_eq!(hop.as_deref(), Some("search Server GET /find"));
        // The edge's own time on the path: before its calls and after the slow one.
        assert_eq!(own(&spans, &analysis, "GET /page"), Some(20.0));
        // stock waited on db, then on search: its own time is the gaps.
        assert_eq!(own(&spans, &analysis, "GET /stock"), Some(18.0));
        assert_eq!(own(&spans, &analysis, "GET /price"), None);
        assert_eq!(
            analysis.critical_ms_of(analysis.critical_hop.unwrap()),
            308.0
        );
    }

    #[test]
    fn a_call_that_outlives_its_caller_is_not_on_the_path() {
        let (spans, analysis) = run(r#"
edge server "POST /order" 0 200 budget=1000
  edge client "audit" 10 890
    audit server "POST /audit" 12 880
  edge client "orders" 20 160
    orders server "POST /orders" 22 165
"#);
        let (on, hop) = path(&spans, &analysis);
        // The callee ends 7 ms after its call, within τ: on the path, cut at the call's end.
        assert_eq!(
            on,
            [
                "edge Server POST /order",
                "edge Client orders",
                "orders Server POST /orders"
            ]
        );
        assert_eq!(hop.as_deref(), Some("orders Server POST /orders"));
        assert_eq!(own(&spans, &analysis, "POST /order"), Some(40.0));
        assert_eq!(own(&spans, &analysis, "POST /orders"), Some(158.0));
    }

    #[test]
    fn a_chain_is_on_the_path_end_to_end() {
        let (spans, analysis) = run(super::super::tests::CHAIN);
        assert_eq!(analysis.critical_path.len(), spans.len());
        let total: f64 = analysis.rows.iter().filter_map(|r| r.critical_ms).sum();
        let edge = &analysis.rows[analysis.edge.unwrap()];
        assert!((total - edge.duration_ms).abs() < 1e-6, "{total}");
        assert_eq!(
            path(&spans, &analysis).1.as_deref(),
            Some("pricing Server GET /price")
        );
    }

    #[test]
    fn each_attempt_of_a_retry_is_on_the_path() {
        let (spans, analysis) = run(r#"
edge server "GET /x" 0 320 budget=1000
  edge client "GET /y" 10 100 budget=990
    y server "GET /y" 11 98 budget=989 http-status=504
  edge client "GET /y" 120 180 budget=880
    y server "GET /y" 121 178 budget=879
"#);
        assert_eq!(analysis.critical_path.len(), 5);
        assert_eq!(own(&spans, &analysis, "GET /x"), Some(40.0));
    }

    #[test]
    fn a_callee_with_a_skewed_clock_is_walked_where_it_is_shown() {
        let mut spans = parse(
            r#"
edge server "GET /s" 0 300 budget=1000
  edge client "GET /stock" 10 280
    inventory server "GET /stock" 12 276
"#,
        );
        shift_service(&mut spans, "inventory", -200.0);
        let analysis = analyze(&spans, &AnalyzeOptions::default());
        let (on, hop) = path(&spans, &analysis);
        assert_eq!(on.len(), 3, "{on:?}");
        assert_eq!(hop.as_deref(), Some("inventory Server GET /stock"));
        // Centred in its call (10–290): the edge's own time is before and after the call.
        assert_eq!(own(&spans, &analysis, "GET /s"), Some(20.0));
    }

    #[test]
    fn without_a_budget_the_path_starts_at_the_first_root() {
        let (spans, analysis) = run(r#"
web server "GET /" 0 100
  web client "db" 10 80
"#);
        assert_eq!(analysis.critical_path, [0, 1]);
        assert_eq!(own(&spans, &analysis, "GET /"), Some(20.0));
        assert!(run("").1.critical_path.is_empty());
    }
}

//! One line per trace for search: what the trace was, how its budget went, what was
//! flagged. Pure, like the rest of the analysis.

use std::collections::BTreeMap;

use super::{Analysis, AnalysisVersion, Flag, Outcome, RULES_VERSION, Role};
use crate::core::model::{Span, TraceId};

#[derive(Debug, Clone, PartialEq)]
pub struct TraceSummary {
    pub trace_id: TraceId,
    /// The service and name of the trace's first root (or first span when none).
    pub root_service: String,
    pub root_name: String,
    pub start_unix_nano: u64,
    pub duration_ms: f64,
    /// How long the edge hop took to answer; less than `duration_ms` when work went on after.
    pub answer_ms: Option<f64>,
    pub budget_ms: Option<f64>,
    pub outcome: Outcome,
    /// (service, name) of each origin hop of an exceeded request, in waterfall order.
    pub origins: Vec<(String, String)>,
    /// (service, name, self_ms) of the burner.
    pub burner: Option<(String, String, f64)>,
    pub flag_counts: BTreeMap<Flag, usize>,
    pub span_count: usize,
    /// Every service in the trace, sorted.
    pub services: Vec<String>,
    /// Every (service, span name) of hops and roots, sorted.
    pub operations: Vec<(String, String)>,
    /// The rules and τ that produced this summary.
    pub version: AnalysisVersion,
}

/// Summarises an analysed trace. `spans` must be the slice that was analysed, and non-empty.
pub fn summarize(spans: &[Span], analysis: &Analysis) -> Option<TraceSummary> {
    let first = analysis.rows.first()?;
    let root = &spans[first.span];
    let start_unix_nano = spans.iter().map(|s| s.start_unix_nano).min()?;
    let mut services: Vec<String> = spans.iter().map(|s| s.service.clone()).collect();
    services.sort();
    services.dedup();
    let mut operations: Vec<(String, String)> = analysis
        .rows
        .iter()
        .filter(|row| row.role == Role::Hop || row.depth == 0)
        .map(|row| {
            (
                spans[row.span].service.clone(),
                spans[row.span].name.clone(),
            )
        })
        .collect();
    operations.sort();
    operations.dedup();
    Some(TraceSummary {
        version: AnalysisVersion {
            rules: RULES_VERSION,
            tolerance_ms: analysis.tolerance_ms,
        },
        trace_id: root.trace_id,
        root_service: root.service.clone(),
        root_name: root.name.clone(),
        start_unix_nano,
        duration_ms: analysis.duration_ms,
        answer_ms: analysis.edge.map(|e| analysis.rows[e].duration_ms),
        budget_ms: analysis.budget_ms,
        outcome: analysis.outcome,
        origins: analysis
            .origins
            .iter()
            .map(|&r| {
                let span = &spans[analysis.rows[r].span];
                (span.service.clone(), span.name.clone())
            })
            .collect(),
        burner: analysis.burner.map(|r| {
            let row = &analysis.rows[r];
            let span = &spans[row.span];
            (
                span.service.clone(),
                span.name.clone(),
                row.self_ms.unwrap_or(0.0),
            )
        }),
        flag_counts: analysis.flag_counts.clone(),
        span_count: spans.len(),
        services,
        operations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::analyze::fixture::parse;
    use crate::core::analyze::{AnalyzeOptions, analyze};

    #[test]
    fn a_summary_names_root_budget_outcome_burner_and_flags() {
        let spans = parse(
            r#"
edge server "GET /checkout" 0 1540 budget=800
  edge client "GET /stock" 20 1500 budget=5000
    inventory server "GET /stock" 25 1490 budget=5000
"#,
        );
        let summary = summarize(&spans, &analyze(&spans, &AnalyzeOptions::default())).unwrap();
        assert_eq!(
            (summary.root_service.as_str(), summary.root_name.as_str()),
            ("edge", "GET /checkout")
        );
        assert_eq!(summary.budget_ms, Some(800.0));
        assert_eq!(summary.answer_ms, Some(1540.0));
        assert_eq!(summary.outcome, Outcome::Exceeded);
        assert_eq!(
            summary.origins,
            [("edge".to_string(), "GET /checkout".to_string())]
        );
        assert_eq!(
            summary.burner,
            Some(("inventory".into(), "GET /stock".into(), 1490.0))
        );
        assert_eq!(summary.flag_counts.get(&Flag::Inflated), Some(&1));
        assert_eq!(summary.services, ["edge", "inventory"]);
        assert_eq!(
            summary.operations,
            [
                ("edge".into(), "GET /checkout".into()),
                ("inventory".into(), "GET /stock".into())
            ]
        );
        assert_eq!(summary.span_count, 3);
        assert_eq!(
            summarize(&[], &analyze(&[], &AnalyzeOptions::default())),
            None
        );
    }
}

//! The sentence at the top of a trace's waterfall: the outcome against the budget, timed
//! by when the edge hop answered; where an exceeded request ran out; the hop that made it
//! take as long as it did (the critical path) and the one with the most work of its own.

use super::fmt_duration;
use crate::core::analyze::{Analysis, Outcome};
use crate::core::model::Span;

/// The verdict at the top of the page: the outcome against the budget, timed by when the
/// edge hop answered; where an exceeded request ran out; work that went on after the answer.
pub fn verdict(spans: &[Span], analysis: &Analysis) -> String {
    let label = |r: usize| {
        let span = &spans[analysis.rows[r].span];
        format!("{} {}", span.service, span.name)
    };
    // The hop that made the request take as long as it did, and the one with the most
    // work of its own when that is another (work off the critical path did not).
    let critical = analysis.critical_hop.map(|r| {
        format!(
            "critical path ran longest through {} ({} on it)",
            label(r),
            fmt_duration(analysis.critical_ms_of(r))
        )
    });
    let other_burner = analysis
        .burner
        .filter(|&b| {
            analysis
                .critical_hop
                .is_none_or(|c| analysis.rows[c].span != analysis.rows[b].span)
        })
        .map(|b| {
            let off = if analysis.rows[b].critical_ms.is_none() {
                ", off the critical path"
            } else {
                ""
            };
            format!(
                "{} did the most work of its own ({}){off}",
                label(b),
                fmt_duration(analysis.rows[b].self_ms.unwrap_or(0.0))
            )
        });
    let Some(budget) = analysis
        .budget_ms
        .filter(|_| analysis.outcome != Outcome::NoBudget)
    else {
        return "No budget recorded: add deadline.remaining_ms (the milliseconds left before the \
             caller's deadline) to each service's server span, or capture X-Request-Budget-Ms or grpc-timeout; \
             this trace is shown without budget analysis."
            .to_string();
    };
    let answered = analysis
        .edge
        .map_or(analysis.duration_ms, |e| analysis.rows[e].duration_ms);
    let (answered_s, budget_s) = (fmt_duration(answered), fmt_duration(budget));
    let mut text = if analysis.outcome == Outcome::Exceeded {
        let edge_overspent = analysis.edge.is_some_and(|e| {
            analysis.rows[e]
                .flags
                .iter()
                .any(|f| f.flag == crate::core::analyze::Flag::Overspent)
        });
        let mut text = if edge_overspent {
            format!("Exceeded: answered in {answered_s} of its {budget_s} budget.")
        } else {
            format!(
                "Exceeded: the request ended with a deadline-exceeded status after {answered_s} of its \
                 {budget_s} budget."
            )
        };
        let origins: Vec<String> = analysis
            .origins
            .iter()
            .map(|&r| {
                let reason = crate::core::analyze::origin_reason(&analysis.rows[r]);
                let mut told = label(r);
                if !reason.is_empty() {
                    told.push_str(&format!(" ({reason})"));
                }
                if Some(r) == analysis.burner {
                    let own = analysis.rows[r].self_ms.unwrap_or(0.0);
                    told.push_str(&format!(
                        ", which spent {} on its own work",
                        fmt_duration(own)
                    ));
                }
                if Some(r) == analysis.critical_hop {
                    told.push_str(&format!(
                        ", the longest part of the critical path ({})",
                        fmt_duration(analysis.critical_ms_of(r))
                    ));
                }
                told
            })
            .collect();
        if !origins.is_empty() {
            text.push_str(&format!(
                " The budget ran out at {}.",
                origins.join("; and at ")
            ));
        }
        if let Some(critical) = critical.filter(|_| {
            !analysis
                .critical_hop
                .is_some_and(|c| analysis.origins.contains(&c))
        }) {
            text.push_str(&format!(" The {critical}."));
        }
        if let Some(other) = other_burner.filter(|_| {
            !analysis
                .burner
                .is_some_and(|b| analysis.origins.contains(&b))
        }) {
            text.push_str(&format!(" {other}."));
        }
        text
    } else {
        let mut text = format!("Within budget: answered in {answered_s} of {budget_s}");
        if let Some(critical) = critical {
            text.push_str(&format!("; the {critical}"));
        }
        if let Some(other) = other_burner {
            text.push_str(&format!("; {other}"));
        }
        text.push('.');
        text
    };
    // Spans that ended after the edge answered, beyond the tolerance: the trace outlasts
    // its answer.
    let after = analysis.duration_ms - answered;
    if analysis.edge.is_some() && after > analysis.tolerance_ms.max(1.0) {
        text.push_str(&format!(
            " {} of work continued after the answer.",
            fmt_duration(after)
        ));
    }
    if let Some(n) = analysis
        .flag_counts
        .get(&crate::core::analyze::Flag::Wasted)
    {
        text.push_str(&format!(
            " {n} span{} kept working after {} caller gave up.",
            if *n == 1 { "" } else { "s" },
            if *n == 1 { "its" } else { "their" }
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::verdict;
    use crate::core::analyze::fixture::parse;
    use crate::core::analyze::{AnalyzeOptions, analyze};

    fn verdict_of(fixture: &str) -> String {
        let spans = parse(fixture);
        verdict(&spans, &analyze(&spans, &AnalyzeOptions::default()))
    }

    #[test]
    fn an_answer_in_time_with_work_going_on_after_it_says_both() {
        let text = verdict_of(
            r#"
edge server "GET /report" 0 56 budget=1450
  edge client "POST /render" 5 45 budget=1440
    render server "POST /render" 6 1750 budget=1440
"#,
        );
        assert_eq!(
            text,
            "Within budget: answered in 56 ms of 1.45 s; the critical path ran longest through \
             edge GET /report (56 ms on it); render POST /render did the most work of its own \
             (1.75 s), off the critical path. 1.7 s of work continued after the answer. 1 span \
             kept working after its caller gave up."
        );
    }

    #[test]
    fn a_burner_off_the_critical_path_is_named_apart_from_the_hop_that_made_it_late() {
        let text = verdict_of(
            r#"
checkout server "GET /page" 0 500 budget=1000
  checkout client "pricing" 5 402
    pricing server "GET /price" 6 400
  checkout client "stock" 5 480
    stock server "GET /stock" 6 478
      stock client "search" 162 310
        search server "GET /find" 163 308
"#,
        );
        assert_eq!(
            text,
            "Within budget: answered in 500 ms of 1 s; the critical path ran longest through \
             search GET /find (308 ms on it); pricing GET /price did the most work of its own \
             (400 ms), off the critical path."
        );
    }

    #[test]
    fn an_exceeded_request_names_where_its_budget_ran_out() {
        let text = verdict_of(
            r#"
edge server "GET /checkout" 0 900 budget=800
  edge client "GET /stock" 20 870 budget=780
    inventory server "GET /stock" 25 860 budget=775
"#,
        );
        assert_eq!(
            text,
            "Exceeded: answered in 900 ms of its 800 ms budget. The budget ran out at inventory \
             GET /stock (deadline passed during its own work), which spent 860 ms on its own \
             work, the longest part of the critical path (860 ms)."
        );
        assert!(!text.contains("continued after"), "{text}");
    }
}

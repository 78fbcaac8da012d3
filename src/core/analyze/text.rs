//! The waterfall as an indented text tree, for `budgetscope analyze` and for test snapshots.

use std::fmt::Write as _;

use super::{Analysis, Role, fmt_ms};
use crate::core::model::Span;

/// Renders one analysed trace. `spans` must be the slice that was analysed.
pub fn render(spans: &[Span], analysis: &Analysis) -> String {
    let mut out = String::new();
    let burner = analysis.burner.map(|r| {
        let row = &analysis.rows[r];
        let span = &spans[row.span];
        format!(
            "{} {} ({} ms self)",
            span.service,
            span.name,
            fmt_ms(row.self_ms.unwrap_or(0.0))
        )
    });
    let _ = writeln!(
        out,
        "{} · budget {} · {} ms · burner {}",
        analysis.outcome.as_str(),
        analysis
            .budget_ms
            .map_or("none".to_string(), |b| format!("{} ms", fmt_ms(b))),
        fmt_ms(analysis.duration_ms),
        burner.as_deref().unwrap_or("none"),
    );
    for &r in &analysis.origins {
        let row = &analysis.rows[r];
        let span = &spans[row.span];
        let _ = writeln!(
            out,
            "origin: {} {} ({})",
            span.service,
            span.name,
            super::origin_reason(row)
        );
    }
    for row in &analysis.rows {
        let span = &spans[row.span];
        let indent = "  ".repeat(row.depth.min(40));
        let _ = write!(
            out,
            "{indent}{} {} {} @{} +{}",
            span.service,
            span.name,
            row.role.as_str(),
            fmt_ms(row.start_offset_ms),
            fmt_ms(row.duration_ms)
        );
        let mut field = |name: &str, value: Option<String>| {
            if let Some(value) = value {
                let _ = write!(out, " {name}={value}");
            }
        };
        field("budget", row.budget_ms.map(fmt_ms));
        field(
            "left",
            row.available_ms
                .filter(|_| row.role != Role::Hop)
                .map(fmt_ms),
        );
        field("self", row.self_ms.map(fmt_ms));
        field("burn", row.burn.map(|b| format!("{b:.2}")));
        field(
            "attempt",
            row.attempt.filter(|a| *a > 1).map(|a| a.to_string()),
        );
        field(
            "skew",
            (row.skew_shift_ms != 0.0).then(|| fmt_ms(row.skew_shift_ms)),
        );
        out.push('\n');
        for note in &row.flags {
            let _ = writeln!(out, "{indent}  ! {}: {}", note.flag.as_str(), note.message);
        }
        for warning in &row.warnings {
            let _ = writeln!(out, "{indent}  ? {warning}");
        }
    }
    out
}

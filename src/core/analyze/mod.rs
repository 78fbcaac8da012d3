//! The budget analysis: from the spans of one trace, the waterfall rows, every flag of
//! docs/budget-semantics.md with a message a person understands, the per-hop numbers and the
//! request's outcome.
//!
//! Architecture invariant: pure. Spans in, `Analysis` out; no clock, database, network,
//! async or logging, so it cannot fail: odd data (missing parents, duplicate ids, cycles,
//! skew) becomes a flag or a warning on a row. `tests/layers.rs` checks that this
//! folder names no sqlx/axum/tonic/tokio item.
//!
//! Decisions where the contract leaves room (docs/budget-semantics.md has them all):
//! - `doomed` needs `A(c) < −τ`, like every other comparison: a handler reads its budget
//!   a few ms after its span starts, so a call right at the deadline is not flagged.
//! - "the deadline passed during the hop" (for `local_exceed`) means it ended more than τ
//!   after `D_h`, the same test as `overspent`.
//! - Calls without an owner hop (a root CLIENT span) group their retries by parent span.

pub mod advice_stats;
mod critical;
pub mod edges;
pub mod fixture;
pub mod histogram;
pub mod hops;
mod rules;
pub use rules::ATTRIBUTES_READ;
pub use rules::span_failed;
mod skew;
pub mod summary;
pub mod text;
mod tree;

use std::collections::BTreeMap;

use crate::core::model::{Span, SpanKind};

#[derive(Debug, Clone)]
pub struct AnalyzeOptions {
    /// τ: differences within it are never flagged (docs/budget-semantics.md).
    pub tolerance_ms: f64,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions { tolerance_ms: 50.0 }
    }
}

/// The version of the rules in this folder. Bump it with every change that makes a stored
/// trace analyse differently (a flag, an exceed, an origin, or a number that a summary, an
/// index term or a hop sample holds): summaries store it, and a server that finds summaries
/// analysed under other rules re-analyses them (docs/budget-semantics.md, "When the rules
/// change").
pub const RULES_VERSION: u32 = 5;

/// What a stored analysis was produced with: the rules' version and τ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnalysisVersion {
    pub rules: u32,
    pub tolerance_ms: f64,
}

impl AnalyzeOptions {
    /// The version of the analysis these options produce.
    pub fn version(&self) -> AnalysisVersion {
        AnalysisVersion {
            rules: RULES_VERSION,
            tolerance_ms: self.tolerance_ms,
        }
    }
}

/// Every flag of docs/budget-semantics.md, in the order the contract lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flag {
    Inflated,
    Dropped,
    Overspent,
    InheritedExceed,
    LocalExceed,
    Doomed,
    Refused,
    Retry,
    UnsafeRetry,
    Wasted,
    MissingParent,
}

impl Flag {
    pub const ALL: [Flag; 11] = [
        Flag::Inflated,
        Flag::Dropped,
        Flag::Overspent,
        Flag::InheritedExceed,
        Flag::LocalExceed,
        Flag::Doomed,
        Flag::Refused,
        Flag::Retry,
        Flag::UnsafeRetry,
        Flag::Wasted,
        Flag::MissingParent,
    ];

    /// The name used by the API, the UI and alert rules.
    pub fn as_str(self) -> &'static str {
        match self {
            Flag::Inflated => "inflated",
            Flag::Dropped => "dropped",
            Flag::Overspent => "overspent",
            Flag::InheritedExceed => "inherited_exceed",
            Flag::LocalExceed => "local_exceed",
            Flag::Doomed => "doomed",
            Flag::Refused => "refused",
            Flag::Retry => "retry",
            Flag::UnsafeRetry => "unsafe_retry",
            Flag::Wasted => "wasted",
            Flag::MissingParent => "missing_parent",
        }
    }

    pub fn from_name(name: &str) -> Option<Flag> {
        Flag::ALL.into_iter().find(|f| f.as_str() == name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// SERVER or CONSUMER: one service handling one request.
    Hop,
    /// CLIENT or PRODUCER: a request to another service.
    Call,
    /// INTERNAL with a budget: remaining time at that point.
    Checkpoint,
    Other,
}

impl Role {
    /// The span kinds that make a hop.
    pub const HOP_KINDS: [SpanKind; 2] = [SpanKind::Server, SpanKind::Consumer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Hop => "hop",
            Role::Call => "call",
            Role::Checkpoint => "checkpoint",
            Role::Other => "other",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceed {
    Inherited,
    Local,
}

impl Exceed {
    pub fn as_str(self) -> &'static str {
        match self {
            Exceed::Inherited => "inherited",
            Exceed::Local => "local",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Exceeded,
    NoBudget,
    /// Not analysed: the trace is larger than the analyzer reads whole (never the result
    /// of `analyze`; a stored summary says so).
    TooLarge,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Exceeded => "exceeded",
            Outcome::NoBudget => "no_budget",
            Outcome::TooLarge => "too_large",
        }
    }

    pub fn from_name(name: &str) -> Option<Outcome> {
        [
            Outcome::Ok,
            Outcome::Exceeded,
            Outcome::NoBudget,
            Outcome::TooLarge,
        ]
        .into_iter()
        .find(|o| o.as_str() == name)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct FlagNote {
    pub flag: Flag,
    pub message: String,
}

/// One waterfall row: a span, where it sits, and what its budget did.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Index of the span in the analysed slice.
    pub span: usize,
    pub depth: usize,
    pub role: Role,
    /// Span index of the owner hop: the nearest ancestor-or-self hop of the same service.
    pub owner: Option<usize>,
    /// Start, relative to the trace's earliest span, after the display skew shift.
    pub start_offset_ms: f64,
    pub duration_ms: f64,
    pub budget_ms: Option<f64>,
    /// Calls: `A(c)`, what the owner hop had left when it called. Hops: `B_recv`. Other spans
    /// of a hop with a budget: what the hop had left at their start.
    pub available_ms: Option<f64>,
    /// The deadline of this row's hop (its own for hops, its owner's otherwise), relative to
    /// the trace start, in the same shifted timeline as `start_offset_ms`.
    pub deadline_offset_ms: Option<f64>,
    /// Hops: duration minus time waiting on calls that reached an instrumented hop.
    pub self_ms: Option<f64>,
    /// Hops: `self_ms` ÷ the request budget.
    pub burn: Option<f64>,
    pub exceed: Option<Exceed>,
    /// Calls: which attempt at their target this is. Hops under a call span with several
    /// child hops: which of those attempts.
    pub attempt: Option<u32>,
    pub wasted_ms: Option<f64>,
    /// Display shift applied to this row for clock skew (0 when none).
    pub skew_shift_ms: f64,
    /// On the critical path: the time on it that is this span's own, not a child's.
    pub critical_ms: Option<f64>,
    pub flags: Vec<FlagNote>,
    /// Data-quality notes: the span's own warnings and what the analysis found odd.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    pub outcome: Outcome,
    /// The request budget: `B_recv` of the edge hop.
    pub budget_ms: Option<f64>,
    /// From the earliest start to the latest end, raw times.
    pub duration_ms: f64,
    pub tolerance_ms: f64,
    /// Index into `rows` of the hop with the largest `self_ms`.
    pub burner: Option<usize>,
    /// Index into `rows` of the edge hop.
    pub edge: Option<usize>,
    /// Indexes into `rows` of the request's origin hops when it exceeded its budget: where
    /// it ran out (a local exceed, or a refusal); empty otherwise.
    pub origins: Vec<usize>,
    pub flag_counts: BTreeMap<Flag, usize>,
    /// Hops per service: how many requests reached each service.
    pub calls_reaching: BTreeMap<String, usize>,
    /// Indexes into `rows` of the spans on the critical path, in waterfall order (the
    /// edge hop, or the first root without one, first); empty for no spans.
    pub critical_path: Vec<usize>,
    /// Index into `rows` of the hop with the most critical-path time of its own (its span
    /// and the calls and internal spans it owns).
    pub critical_hop: Option<usize>,
    /// Waterfall order: depth first, children by start time.
    pub rows: Vec<Row>,
}

impl Analysis {
    /// A hop's time on the critical path: its own row's and those of the rows it owns.
    pub fn critical_ms_of(&self, hop_row: usize) -> f64 {
        let hop = self.rows[hop_row].span;
        self.rows
            .iter()
            .filter(|row| row.owner == Some(hop))
            .filter_map(|row| row.critical_ms)
            .sum()
    }
}

/// Analyses one trace. Never panics, whatever the spans.
/// Why an origin row is where its request ran out: its local exceed's message, or that it
/// refused.
pub fn origin_reason(row: &Row) -> &str {
    row.flags
        .iter()
        .find(|f| f.flag == Flag::LocalExceed)
        .or_else(|| row.flags.iter().find(|f| f.flag == Flag::Refused))
        .map_or("", |f| f.message.as_str())
}

pub fn analyze(spans: &[Span], options: &AnalyzeOptions) -> Analysis {
    let tree = tree::Tree::build(spans);
    let mut analysis = rules::evaluate(spans, &tree, options);
    skew::adjust(spans, &tree, &mut analysis);
    critical::mark(&tree, &mut analysis);
    analysis
}

/// Milliseconds as people read them: whole numbers from 10 ms, one decimal below.
pub fn fmt_ms(ms: f64) -> String {
    if ms.abs() >= 10.0 {
        format!("{ms:.0}")
    } else {
        format!("{ms:.1}")
    }
}

#[cfg(test)]
mod tests;

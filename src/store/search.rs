//! Trace search over the term index, shared by both stores: the terms a summary is
//! indexed by (`terms`), how each backend's term rows name their trace (`TermLayout`), and
//! the statement a search runs (`start_search`, the backend's cursor, `finish_search`).

use sqlx::{Database, Encode, QueryBuilder, Type};

use super::query::{TraceQuery, summary_columns_ts};
use crate::core::analyze::Outcome;
use crate::core::analyze::summary::TraceSummary;

/// The index terms of a summary (migrations/*/0004_trace_terms.sql).
pub(crate) fn terms(summary: &TraceSummary) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    // No term per (service, operation): a search for one finds the operation's name and the
    // service, and keeps the traces that have the pair (`TraceQuery::pair_matches`).
    terms.extend(summary.services.iter().map(|s| format!("service:{s}")));
    terms.extend(
        summary
            .operations
            .iter()
            .map(|(_, n)| format!("opname:{n}")),
    );
    terms.extend(
        summary
            .flag_counts
            .keys()
            .map(|f| format!("flag:{}", f.as_str())),
    );
    terms.extend(
        summary
            .origins
            .iter()
            .map(|(s, n)| format!("origin:{s}\t{n}")),
    );
    terms.extend(outcome_term(summary.outcome));
    terms.sort();
    terms.dedup();
    terms
}

/// The index term of an outcome. None for the outcome most traces have: a search for it
/// reads the summaries in time order and keeps those with it, about as many as an index
/// would give.
fn outcome_term(outcome: Outcome) -> Option<String> {
    (outcome != Outcome::Ok).then(|| format!("outcome:{}", outcome.as_str()))
}

/// The terms a query asks a trace to have (`terms`), most selective first: an origin hop,
/// a flag, then an operation's name, then a service.
fn required_terms(query: &TraceQuery) -> Vec<String> {
    let mut required = Vec::new();
    if let Some((service, operation)) = &query.origin {
        required.push(format!("origin:{service}\t{operation}"));
    }
    if let Some(flag) = query.flag {
        required.push(format!("flag:{}", flag.as_str()));
    }
    if let Some(operation) = &query.operation {
        required.push(format!("opname:{operation}"));
    }
    if let Some(service) = &query.service {
        required.push(format!("service:{service}"));
    }
    required
}

/// How a backend's index terms name their trace (`Backend::TERMS`); every statement on
/// `trace_terms` takes its columns and joins from here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermLayout {
    /// (term id, start, trace id): Postgres, whose tables could then be distributed by trace
    /// id (docs/operations.md).
    ByTrace,
    /// (term id, start second, summary id): SQLite. Within a term's second new rows land
    /// at the end (summary ids grow), where a key on the exact start took the analyzer's
    /// inserts at random places within the export delay (`budgetscope-bench ingest --rate
    /// 10000`, the WAL's frames by table), and a row is about half as long. The price: a
    /// page of results sorts every match of each second it reaches (10,000 matches in one
    /// second, about 16 ms on this machine).
    BySummary,
}

impl TermLayout {
    /// The key columns of a term row.
    pub(crate) fn columns(self) -> &'static str {
        match self {
            TermLayout::ByTrace => "term_id, start_unix_nano, trace_id",
            TermLayout::BySummary => "term_id, start_second, summary_id",
        }
    }

    /// The key column that holds a start time (`time_of`).
    pub(crate) fn time_column(self) -> &'static str {
        match self {
            TermLayout::ByTrace => "start_unix_nano",
            TermLayout::BySummary => "start_second",
        }
    }

    /// What goes around a `VALUES` list of (term id, `time_of` the start, trace id) to make
    /// it rows of `columns`: the BySummary layout looks up each trace's summary, which must
    /// exist.
    pub(crate) fn rows_of_values(self) -> (&'static str, &'static str) {
        match self {
            TermLayout::ByTrace => ("", ""),
            TermLayout::BySummary => (
                "SELECT v.column1, v.column2, s.id FROM (",
                ") v JOIN trace_summaries s ON s.trace_id = v.column3 WHERE TRUE",
            ),
        }
    }

    /// A start time as the term rows hold it.
    pub(crate) fn time_of(self, start_unix_nano: i64) -> i64 {
        match self {
            TermLayout::ByTrace => start_unix_nano,
            TermLayout::BySummary => start_unix_nano / 1_000_000_000,
        }
    }

    /// The join of the term rows `t` to their summaries `ts`.
    fn join(self) -> &'static str {
        match self {
            TermLayout::ByTrace => "ts.trace_id = t.trace_id",
            TermLayout::BySummary => "ts.id = t.summary_id",
        }
    }

    /// The term row `x` of the trace of the driving term row `t` and its summary `ts`.
    fn same_trace(self) -> &'static str {
        match self {
            TermLayout::ByTrace => {
                "x.start_unix_nano = ts.start_unix_nano AND x.trace_id = ts.trace_id"
            }
            TermLayout::BySummary => {
                "x.start_second = t.start_second AND x.summary_id = t.summary_id"
            }
        }
    }
}

/// Which index drives a search, for the condition on its cursor and its order
/// (`Backend::push_after`, `finish_search`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchOrder {
    /// The summaries' start index (`ts`).
    Summaries,
    /// One term's rows (`t`), newest first.
    Terms(TermLayout),
}

impl SearchOrder {
    /// The alias whose `start_unix_nano` and `trace_id` give the exact order.
    pub(crate) fn exact(self) -> &'static str {
        match self {
            SearchOrder::Terms(TermLayout::ByTrace) => "t",
            SearchOrder::Summaries | SearchOrder::Terms(TermLayout::BySummary) => "ts",
        }
    }
}

/// The backend-neutral start of a trace search: the index of its most selective term (or,
/// with none, the summaries' start index), each other term it requires looked up by its
/// key, the summary filters and the time range. Returns the builder and the index that
/// orders the results; the caller adds the keyset cursor and attribute filters, then
/// `finish_search`.
pub(crate) fn start_search<DB: Database>(
    query: &TraceQuery,
    layout: TermLayout,
) -> (QueryBuilder<DB>, SearchOrder)
where
    String: for<'t> Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let columns = summary_columns_ts();
    let mut required = required_terms(query).into_iter();
    let term = required
        .next()
        .or_else(|| query.outcome.and_then(outcome_term));
    let order = match term {
        Some(_) => SearchOrder::Terms(layout),
        None => SearchOrder::Summaries,
    };
    let mut q: QueryBuilder<DB> = match term {
        Some(term) => {
            let mut q = QueryBuilder::new(format!(
                "SELECT {columns} FROM trace_terms t JOIN trace_summaries ts ON {} \
                 WHERE t.term_id = (SELECT id FROM search_terms WHERE term = ",
                layout.join()
            ));
            q.push_bind(term).push(")");
            q
        }
        None => QueryBuilder::new(format!(
            "SELECT {columns} FROM trace_summaries ts WHERE 1 = 1"
        )),
    };
    for term in required {
        q.push(
            " AND EXISTS (SELECT 1 FROM trace_terms x WHERE x.term_id = \
             (SELECT id FROM search_terms WHERE term = ",
        )
        .push_bind(term)
        .push(format!(") AND {})", layout.same_trace()));
    }
    if let Some(outcome) = query.outcome {
        q.push(" AND ts.outcome = ")
            .push_bind(outcome.as_str().to_string());
    }
    push_range(
        &mut q,
        "ts.duration_ms",
        query.min_duration_ms,
        query.max_duration_ms,
    );
    push_range(
        &mut q,
        "ts.budget_ms",
        query.min_budget_ms,
        query.max_budget_ms,
    );
    for (bound, op) in [(query.since_unix_nano, ">="), (query.until_unix_nano, "<")] {
        let Some(bound) = bound else { continue };
        let bound = i64::try_from(bound).unwrap_or(i64::MAX);
        // The driving index's own column bounds its range; the summary's start is exact.
        match order {
            SearchOrder::Terms(TermLayout::ByTrace) => {
                q.push(format!(" AND t.start_unix_nano {op} "))
                    .push_bind(bound);
            }
            SearchOrder::Terms(TermLayout::BySummary) => {
                let second_op = if op == "<" { "<=" } else { op };
                q.push(format!(" AND t.start_second {second_op} "))
                    .push_bind(layout.time_of(bound))
                    .push(format!(" AND ts.start_unix_nano {op} "))
                    .push_bind(bound);
            }
            SearchOrder::Summaries => {
                q.push(format!(" AND ts.start_unix_nano {op} "))
                    .push_bind(bound);
            }
        }
    }
    (q, order)
}

/// Newest first, at most `limit`: the end of every trace search.
pub(crate) fn finish_search<DB: Database>(q: &mut QueryBuilder<DB>, order: SearchOrder, limit: u32)
where
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    q.push(match order {
        SearchOrder::Summaries => " ORDER BY ts.start_unix_nano DESC, ts.trace_id DESC LIMIT ",
        SearchOrder::Terms(TermLayout::ByTrace) => {
            " ORDER BY t.start_unix_nano DESC, t.trace_id DESC LIMIT "
        }
        // The index gives the seconds in order; only each second's rows are sorted.
        SearchOrder::Terms(TermLayout::BySummary) => {
            " ORDER BY t.start_second DESC, ts.start_unix_nano DESC, ts.trace_id DESC LIMIT "
        }
    })
    .push_bind(i64::from(limit));
}

fn push_range<DB: Database>(
    q: &mut QueryBuilder<DB>,
    column: &str,
    min: Option<f64>,
    max: Option<f64>,
) where
    f64: for<'t> Encode<'t, DB> + Type<DB>,
{
    if let Some(min) = min {
        q.push(format!(" AND {column} >= ")).push_bind(min);
    }
    if let Some(max) = max {
        q.push(format!(" AND {column} <= ")).push_bind(max);
    }
}

//! `/traces`: the search form (every filter of `GET /api/traces`), results with outcome,
//! budget, duration, a mini budget bar and flag badges, and cursor pagination. Also
//! `/traces/go?trace_id=…`, the trace-id box.

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Redirect, Response};

use super::{
    Badge, PageError, enc, flag_meaning, fmt_duration, fmt_opt_duration, fmt_time, html, permille,
    query_string, trace_href,
};
use crate::clock::now_unix_nano;
use crate::core::analyze::summary::TraceSummary;
use crate::core::analyze::{Flag, Outcome};
use crate::store::query::Cursor;
use crate::web::AppState;
use crate::web::api::parse_trace_id;
use crate::web::search::parse_query;

/// The single-valued filters, in form order: (parameter, label, placeholder).
const FIELDS: [(&str, &str, &str); 10] = [
    ("min_duration_ms", "Min duration (ms)", "e.g. 500"),
    ("max_duration_ms", "Max duration (ms)", ""),
    ("min_budget_ms", "Min budget (ms)", ""),
    ("max_budget_ms", "Max budget (ms)", ""),
    ("since", "From", "-1h, RFC 3339 or unix ms"),
    ("until", "To", "now"),
    ("operation", "Operation", "e.g. GET /stock"),
    ("origin_service", "Ran out at service", "e.g. inventory"),
    (
        "origin_operation",
        "Ran out at operation",
        "e.g. GET /stock",
    ),
    ("limit", "Results per page", "20"),
];

pub struct Field {
    pub name: &'static str,
    pub label: &'static str,
    pub placeholder: &'static str,
    pub value: String,
}

pub struct Choice {
    pub value: String,
    pub label: String,
    pub selected: bool,
}

pub struct TraceRow {
    pub href: String,
    pub trace_id: String,
    pub short_id: String,
    pub start: String,
    pub root_service: String,
    pub root_name: String,
    pub outcome: &'static str,
    pub outcome_label: &'static str,
    pub budget: String,
    /// How long the edge hop took to answer (the duration when there is none).
    pub answered: String,
    /// Work that went on after the answer, e.g. "+1.7 s after"; empty when none.
    pub after: String,
    pub duration: String,
    /// Where an exceeded request ran out: "inventory GET /stock"; empty otherwise.
    pub origin: String,
    /// Mini budget bar: the answer time's width (`permille`) on a scale where the budget is
    /// at `budget_at`.
    pub used: u16,
    pub over: u16,
    pub budget_at: u16,
    pub has_budget: bool,
    pub bar_title: String,
    pub badges: Vec<Badge>,
    pub span_count: usize,
    pub burner: String,
}

#[derive(Template)]
#[template(path = "traces.html")]
pub struct TracesPage {
    pub nav: &'static str,
    pub services: Vec<Choice>,
    pub flags: Vec<Choice>,
    pub outcomes: Vec<Choice>,
    pub fields: Vec<Field>,
    pub attrs: Vec<String>,
    pub error: Option<String>,
    pub searched: bool,
    pub rows: Vec<TraceRow>,
    pub next_href: Option<String>,
    pub first_href: Option<String>,
    pub description: String,
    /// That healthy traces older than their retention are gone, when the search reaches
    /// back that far.
    pub healthy_note: Option<String>,
}

pub async fn traces(
    State(state): State<AppState>,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<Response, PageError> {
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let services = state.store.services().await?;
    let service = get("service");
    let flag = get("flag");
    let outcome = get("outcome");
    let attrs: Vec<String> = params
        .iter()
        .filter(|(k, v)| k == "attr" && !v.trim().is_empty())
        .map(|(_, v)| v.trim().to_string())
        .collect();
    let mut page = TracesPage {
        nav: "traces",
        services: std::iter::once(Choice {
            value: String::new(),
            label: "any service".into(),
            selected: service.is_empty(),
        })
        .chain(services.iter().map(|s| Choice {
            value: s.clone(),
            label: s.clone(),
            selected: *s == service,
        }))
        .collect(),
        flags: std::iter::once(("", "any flag"))
            .chain(Flag::ALL.iter().map(|f| (f.as_str(), f.as_str())))
            .map(|(value, label)| Choice {
                value: value.into(),
                label: label.replace('_', " "),
                selected: value == flag,
            })
            .collect(),
        outcomes: [
            ("", "any outcome"),
            ("exceeded", "exceeded"),
            ("ok", "within budget"),
            ("no_budget", "no budget"),
            ("too_large", "too large to analyse"),
        ]
        .into_iter()
        .map(|(value, label)| Choice {
            value: value.into(),
            label: label.into(),
            selected: value == outcome,
        })
        .collect(),
        fields: FIELDS
            .iter()
            .map(|(name, label, placeholder)| Field {
                name,
                label,
                placeholder,
                value: get(name),
            })
            .collect(),
        attrs: attrs.clone(),
        error: None,
        searched: false,
        rows: Vec::new(),
        next_href: None,
        first_href: None,
        description: String::new(),
        healthy_note: None,
    };
    let now = now_unix_nano();
    let mut query = match parse_query(&params, now) {
        Ok(query) => query,
        Err(error) => {
            page.error = Some(error.message().to_string());
            return Ok(html(StatusCode::BAD_REQUEST, &page));
        }
    };
    // Without a range the page shows the newest traces of any age.
    let limit = query.limit;
    query.limit = limit + 1;
    let mut found = state.store.search_traces(&query).await?;
    let more = found.len() > limit as usize;
    found.truncate(limit as usize);
    page.searched = true;
    page.healthy_note = state.healthy_note(query.since_unix_nano);
    let tolerance_ms = state.analyze.tolerance_ms;
    page.rows = found.iter().map(|t| row(t, tolerance_ms)).collect();
    // Pagination keeps every filter and replaces the cursor.
    let kept: Vec<(&str, &str)> = params
        .iter()
        .filter(|(k, v)| k != "cursor" && !v.trim().is_empty())
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if more && let Some(last) = found.last() {
        let cursor = Cursor {
            start_unix_nano: last.start_unix_nano,
            trace_id: last.trace_id,
        }
        .encode();
        let mut pairs = kept.clone();
        pairs.push(("cursor", &cursor));
        page.next_href = Some(format!("/traces{}", query_string(pairs)));
    }
    if query.cursor.is_some() {
        page.first_href = Some(format!("/traces{}", query_string(kept)));
    }
    page.description = match (page.rows.len(), query.cursor.is_some()) {
        (0, _) => String::new(),
        (n, false) => format!("{n} newest matching traces"),
        (n, true) => format!("{n} older matching traces"),
    };
    Ok(html(StatusCode::OK, &page))
}

/// A result row. Work after the answer shows once it exceeds the analysis tolerance, below
/// which spans ending a little after their parent is noise.
fn row(summary: &TraceSummary, tolerance_ms: f64) -> TraceRow {
    let id = summary.trace_id.to_hex();
    let answered = summary.answer_ms.unwrap_or(summary.duration_ms);
    // Spans that ended after the answer: work the caller no longer waited for.
    let after = summary.duration_ms - answered;
    let after = if after > tolerance_ms.max(1.0) {
        format!("+{} after", fmt_duration(after))
    } else {
        String::new()
    };
    let (used, over, budget_at, bar_title) = match summary.budget_ms {
        // Not analysed: when it answered is not known.
        _ if summary.outcome == Outcome::TooLarge => (0, 0, 0, "too large to analyse".to_string()),
        Some(budget) if budget > 0.0 => {
            let scale = budget.max(answered).max(1e-9);
            let used = answered.min(budget) / scale * 100.0;
            let over = (answered - budget).max(0.0) / scale * 100.0;
            (
                permille(used),
                permille(over),
                permille(budget / scale * 100.0),
                format!(
                    "answered in {} of a {} budget",
                    fmt_duration(answered),
                    fmt_duration(budget)
                ),
            )
        }
        _ => (0, 0, 0, "no budget recorded".to_string()),
    };
    let (outcome_label, outcome) = match summary.outcome.as_str() {
        "exceeded" => ("exceeded", "exceeded"),
        "ok" => ("within budget", "ok"),
        "too_large" => ("too large to analyse", "too_large"),
        _ => ("no budget", "no_budget"),
    };
    TraceRow {
        href: trace_href(&id),
        short_id: id[..12].to_string(),
        trace_id: id,
        start: fmt_time(summary.start_unix_nano),
        root_service: summary.root_service.clone(),
        root_name: summary.root_name.clone(),
        outcome,
        outcome_label,
        budget: fmt_opt_duration(summary.budget_ms),
        answered: fmt_duration(answered),
        after,
        duration: fmt_duration(summary.duration_ms),
        origin: summary
            .origins
            .iter()
            .map(|(service, name)| format!("{service} {name}"))
            .collect::<Vec<_>>()
            .join(", "),
        used,
        over,
        budget_at,
        has_budget: summary.budget_ms.is_some_and(|b| b > 0.0),
        bar_title,
        badges: summary
            .flag_counts
            .iter()
            .map(|(flag, n)| {
                Badge::new(
                    flag.as_str(),
                    Some(*n),
                    flag_meaning(flag.as_str()).to_string(),
                )
            })
            .collect(),
        span_count: summary.span_count,
        burner: summary
            .burner
            .as_ref()
            .map(|(service, name, own)| format!("{service} {name} ({})", fmt_duration(*own)))
            .unwrap_or_default(),
    }
}

/// `/traces/go?trace_id=…`: the trace-id box.
pub async fn go(Query(params): Query<Vec<(String, String)>>) -> Result<Response, PageError> {
    let text = params
        .iter()
        .find(|(k, _)| k == "trace_id")
        .map(|(_, v)| v.trim().to_lowercase())
        .unwrap_or_default();
    if text.is_empty() {
        return Ok(Redirect::to("/traces").into_response());
    }
    let id = parse_trace_id(&text)?;
    Ok(Redirect::to(&format!("/traces/{}", enc(&id.to_hex()))).into_response())
}

//! `/traces/{id}` of a trace too large to read whole under `--memory-limit` (`web::read`):
//! its spans in start order, `PAGE` at a time, without the budget analysis (which needs
//! every span at once), with a find that searches the whole trace in the database, a
//! selected span (`?span=`) shown with its attributes, and the streamed OTLP download.
//!
//! Architecture invariant: a page holds at most `PAGE + 1` spans, whatever the trace's
//! size; every page is a URL (`from`, `upto`, `find`, `span`), so back and a copied link
//! show the same rows.

use std::collections::BTreeMap;

use askama::Template;
use axum::http::StatusCode;
use axum::response::Response;

use super::trace::pairs;
use super::{PageError, enc, fmt_duration, html, query_string};
use crate::core::model::{Span, SpanId, StatusCode as SpanStatus, TraceId};
use crate::store::query::{SpanListQuery, SpanPosition, TraceSize};
use crate::web::AppState;

/// Spans per page.
pub const PAGE: u32 = 500;

pub struct ListRow {
    pub id: String,
    pub service: String,
    pub name: String,
    pub kind: &'static str,
    pub offset: String,
    pub duration: String,
    pub budget: String,
    pub error: bool,
    pub root: bool,
    pub href: String,
    pub selected: bool,
    /// The selected span's attributes, shown under its row.
    pub attributes: Vec<(String, String)>,
}

#[derive(Template)]
#[template(path = "trace_large.html")]
pub struct LargeTracePage {
    pub nav: &'static str,
    pub trace_id: String,
    pub spans: u64,
    pub stored_mb: String,
    pub find: String,
    pub matched: u64,
    pub first_index: u64,
    pub last_index: u64,
    pub rows: Vec<ListRow>,
    pub span_missing: bool,
    pub span_param: String,
    pub first_href: Option<String>,
    pub prev_href: Option<String>,
    pub next_href: Option<String>,
    pub download_href: String,
}

/// A position in a URL: `START-SPANID`.
fn position_param(position: SpanPosition) -> String {
    format!("{}-{}", position.start_unix_nano, position.span_id.to_hex())
}

fn parse_position(text: &str) -> Result<SpanPosition, PageError> {
    let parsed = text.split_once('-').and_then(|(start, id)| {
        Some(SpanPosition {
            start_unix_nano: start.parse().ok()?,
            span_id: SpanId::from_hex(id).ok()?,
        })
    });
    parsed.ok_or_else(|| {
        PageError::bad_request(format!(
            "{text:?} is not a position in this trace; follow the page's own links, or drop \
             from= and upto= to start at its first span."
        ))
    })
}

fn position(span: &Span) -> SpanPosition {
    SpanPosition {
        start_unix_nano: span.start_unix_nano,
        span_id: span.span_id,
    }
}

/// The page of a trace of `size` too large to read whole.
pub async fn render(
    state: &AppState,
    id: TraceId,
    size: TraceSize,
    params: &BTreeMap<String, String>,
) -> Result<Response, PageError> {
    let param = |key: &str| params.get(key).map(|v| v.trim()).filter(|v| !v.is_empty());
    let find = param("find");
    let selected = param("span")
        .map(SpanId::from_hex)
        .transpose()
        .map_err(|_| {
            PageError::bad_request("span= takes a span id of 16 hex digits; pick a row instead.")
        })?;
    let store = &state.store;
    let list = |from: Option<SpanPosition>, backwards: bool, limit: u32| SpanListQuery {
        find,
        from,
        backwards,
        limit,
    };
    // Where the page starts: a position given, or the selected span, or the first span.
    let mut span_missing = false;
    let mut spans = match (param("upto"), param("from")) {
        (Some(upto), _) => {
            let upto = parse_position(upto)?;
            let mut spans = store
                .trace_span_list(id, &list(Some(upto), true, PAGE))
                .await?;
            // Past the first page, a full page backwards; at the start, the first page.
            if (spans.len() as u32) < PAGE {
                spans = store
                    .trace_span_list(id, &list(None, false, PAGE + 1))
                    .await?;
            } else {
                spans.extend(
                    store
                        .trace_span_list(id, &list(Some(upto), false, 1))
                        .await?,
                );
            }
            spans
        }
        (None, Some(from)) => {
            let from = parse_position(from)?;
            store
                .trace_span_list(id, &list(Some(from), false, PAGE + 1))
                .await?
        }
        (None, None) => {
            let mut from = None;
            if let Some(selected) = selected {
                let hex = selected.to_hex();
                let found = store
                    .trace_span_list(
                        id,
                        &SpanListQuery {
                            find: Some(&hex),
                            from: None,
                            backwards: false,
                            limit: 1_000,
                        },
                    )
                    .await?;
                match found.iter().find(|s| s.span_id == selected) {
                    Some(span) => from = Some(position(span)),
                    None => span_missing = true,
                }
            }
            store
                .trace_span_list(id, &list(from, false, PAGE + 1))
                .await?
        }
    };
    let next = (spans.len() > PAGE as usize).then(|| position(&spans[PAGE as usize]));
    spans.truncate(PAGE as usize);
    let counts = store
        .trace_span_counts(id, find, spans.first().map(position))
        .await?;
    let trace_id = id.to_hex();
    let base = format!("/traces/{}", enc(&trace_id));
    let href = |extra: &[(&str, &str)]| {
        let mut pairs: Vec<(&str, &str)> = find.map(|f| ("find", f)).into_iter().collect();
        pairs.extend_from_slice(extra);
        format!("{base}{}", query_string(pairs))
    };
    let first_start = counts.first_start_unix_nano.unwrap_or(0);
    let rows = spans
        .iter()
        .map(|span| {
            let id = span.span_id.to_hex();
            let is_selected = selected == Some(span.span_id);
            let from = position_param(spans.first().map(position).unwrap_or(position(span)));
            ListRow {
                href: href(&[("from", &from), ("span", &id)]),
                id,
                service: span.service.clone(),
                name: span.name.clone(),
                kind: span.kind.as_str(),
                offset: fmt_duration(span.start_unix_nano.saturating_sub(first_start) as f64 / 1e6),
                duration: fmt_duration(
                    span.end_unix_nano.saturating_sub(span.start_unix_nano) as f64 / 1e6,
                ),
                budget: span
                    .budget
                    .as_ref()
                    .map_or(String::new(), |b| fmt_duration(b.ms)),
                error: span.status.code == SpanStatus::Error,
                root: span.parent_span_id.is_none(),
                selected: is_selected,
                attributes: match is_selected {
                    true => pairs(&span.attributes),
                    false => Vec::new(),
                },
            }
        })
        .collect();
    let first_index = counts.before + 1;
    let page = LargeTracePage {
        nav: "traces",
        stored_mb: format!("{:.0}", size.bytes as f64 / 1e6),
        spans: counts.spans,
        find: find.unwrap_or_default().to_string(),
        matched: counts.matched,
        first_index,
        last_index: counts.before + spans.len() as u64,
        rows,
        span_missing,
        span_param: param("span").unwrap_or_default().to_string(),
        first_href: (counts.before > 0).then(|| href(&[])),
        prev_href: match (counts.before > 0, spans.first()) {
            (true, Some(first)) => Some(href(&[("upto", &position_param(position(first)))])),
            _ => None,
        },
        next_href: next.map(|next| href(&[("from", &position_param(next))])),
        download_href: format!("/api/traces/{}/otlp", enc(&trace_id)),
        trace_id,
    };
    Ok(html(StatusCode::OK, &page))
}

//! `/traces/{id}`: the budget waterfall. A one-sentence verdict, then one row per span in
//! waterfall order with its time bar, its budget window (start to its deadline), the part
//! past its deadline, the request deadline as a vertical line, flag badges with messages,
//! self time and burn; a detail panel for the selected span (`?span=`); skew-adjusted or
//! raw times (`?times=raw`); text/attribute highlight (`?q=`); OTLP JSON download.
//!
//! Large traces stay usable: past `COLLAPSE_ABOVE` rows, subtrees below depth 2 start
//! collapsed (except the paths to the selected and the highlighted spans), and the browser
//! skips laying out rows off screen (`content-visibility` in the stylesheet).

use std::collections::{BTreeMap, HashMap};

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{
    Badge, MAX_INDENT, PageError, enc, fmt_duration, fmt_opt_duration, fmt_percent, fmt_time,
    hop_href, html, permille, query_string,
};
use crate::core::analyze::{Analysis, AnalyzeOptions, Role, analyze};
use crate::core::attr_json;
use crate::core::model::{AttrValue, Attributes, Span, StatusCode as SpanStatus, TraceId};
use crate::pipeline::memory::ReadRefused;
use crate::web::AppState;
use crate::web::api::{parse_trace_id, too_large_instead};
use crate::web::pages::large_trace;
use crate::web::pages::verdict::verdict;
use crate::web::read::{ReadError, whole_traces};

/// Traces with more rows than this start with deep subtrees collapsed.
pub const COLLAPSE_ABOVE: usize = 200;

pub struct WfRow {
    pub id: String,
    pub depth: usize,
    /// Depth, capped at `MAX_INDENT`: the row's `g-i` class.
    pub indent: usize,
    pub has_children: bool,
    pub collapsed: bool,
    pub hidden: bool,
    /// Collapsed with its children not in the page: where the script fetches them.
    pub lazy: Option<String>,
    pub service: String,
    pub name: String,
    pub role: &'static str,
    pub href: String,
    pub bar_left: u16,
    pub bar_width: u16,
    pub over_left: u16,
    pub over_width: u16,
    pub has_over: bool,
    pub over_text: String,
    pub window_left: u16,
    pub window_width: u16,
    pub has_window: bool,
    pub duration: String,
    pub budget: String,
    pub self_ms: String,
    pub burn: String,
    pub badges: Vec<Badge>,
    /// The request's budget ran out at this hop.
    pub origin: bool,
    pub error: bool,
    pub matched: bool,
    pub selected: bool,
    /// On the critical path (and the page shows it): the row's mark and what it says.
    pub critical: Option<String>,
}

pub struct Detail {
    pub id: String,
    pub parent: String,
    pub service: String,
    pub name: String,
    pub kind: &'static str,
    pub role: &'static str,
    pub status: String,
    pub start: String,
    pub offset: String,
    pub duration: String,
    pub numbers: Vec<(&'static str, String)>,
    pub flags: Vec<(&'static str, String)>,
    pub warnings: Vec<String>,
    pub attributes: Vec<(String, String)>,
    pub resource: Vec<(String, String)>,
    pub events: Vec<(String, String, String)>,
    pub links: Vec<(String, String)>,
    pub scope: String,
    pub hop_href: Option<String>,
    pub close_href: String,
}

#[derive(Template)]
#[template(path = "trace.html")]
pub struct TracePage {
    pub nav: &'static str,
    pub trace_id: String,
    pub title: String,
    pub verdict: String,
    pub outcome: &'static str,
    pub facts: Vec<(&'static str, String)>,
    pub flag_summary: Vec<Badge>,
    pub raw: bool,
    pub times_href: String,
    pub times_label: &'static str,
    /// The critical path is marked on the rows (not `?critical=off`, and there is one).
    pub show_critical: bool,
    pub critical_href: String,
    pub critical_label: &'static str,
    pub skewed_rows: usize,
    pub q: String,
    pub span_param: String,
    pub matches: usize,
    pub ticks: Vec<(u16, String)>,
    pub deadline_at: Option<u16>,
    pub deadline_label: String,
    pub rows: Vec<WfRow>,
    pub detail: Option<Detail>,
    pub span_missing: bool,
    /// Rows under collapsed ones are fetched on expand; "expand all" reloads with them.
    pub lazy: bool,
    pub expand_all_href: String,
    pub row_count: usize,
    pub download_href: String,
    pub json_href: String,
}

pub async fn trace(
    State(state): State<AppState>,
    Path(trace_id): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let view = View::from_params(&params);
    render(&state, &trace_id, view, Some(&params), |page| {
        html(StatusCode::OK, &page)
    })
    .await
}

/// Reads the trace, builds its page off the async workers (large traces take real CPU)
/// and hands it to `respond`; a trace with no spans is the friendly 404. A trace too large
/// to read whole is listed a page at a time when `large` holds the page's parameters.
async fn render(
    state: &AppState,
    trace_id: &str,
    view: View,
    large: Option<&BTreeMap<String, String>>,
    respond: impl FnOnce(TracePage) -> Response + Send + 'static,
) -> Result<Response, PageError> {
    let id = parse_trace_id(trace_id.trim())?;
    let read = match (whole_traces(state, &[id]).await, large) {
        (Ok(read), _) => read,
        // The page itself lists a trace too large to read whole a page at a time; the
        // rows of an expanded span need the whole trace.
        (Err(ReadError::Refused(size, ReadRefused::TooLarge { .. })), Some(params)) => {
            return large_trace::render(state, id, size, params).await;
        }
        (Err(error), _) => return Err(error.page(&format!("Trace {id}"), &too_large_instead(id))),
    };
    if read.spans.is_empty() {
        return Err(PageError::not_found(
            "Trace not found",
            format!(
                "No spans are stored for trace {id}. It may not have been exported yet (exporters batch for a few seconds), \
                 it may be older than the retention period, or the id may be mistyped. Search traces to find it."
            ),
        ));
    }
    let options = state.analyze.clone();
    tokio::task::spawn_blocking(move || respond(build(id, &read.spans, &options, &view)))
        .await
        .map_err(|_| PageError::bad_request("Drawing this trace was interrupted; reload the page."))
}

#[derive(Template)]
#[template(path = "rows.html")]
pub struct RowsFragment {
    pub rows: Vec<WfRow>,
}

/// `/traces/{id}/rows?parent=SPAN`: the waterfall rows of a span's children (each collapsed
/// with its own children left out), as the script inserts them when a row is expanded.
pub async fn rows(
    State(state): State<AppState>,
    Path(trace_id): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let view = View::from_params(&params);
    if view.parent.is_none() {
        return Err(PageError::bad_request(
            "Give the span whose children to show: ?parent=<16 hex digits>.",
        ));
    }
    render(&state, &trace_id, view, None, |page| {
        html(StatusCode::OK, &RowsFragment { rows: page.rows })
    })
    .await
}

/// What the URL asks to see.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub raw: bool,
    /// `?critical=off`: the critical path is not marked.
    pub hide_critical: bool,
    pub q: String,
    pub span: String,
    /// `?expand=all`: every row in the page, none collapsed, even in a big trace.
    pub expand_all: bool,
    /// For `/traces/{id}/rows?parent=…`: only this span's children, each collapsed.
    pub parent: Option<String>,
}

impl View {
    pub fn from_params(params: &BTreeMap<String, String>) -> View {
        let text = |name: &str| {
            params
                .get(name)
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        View {
            raw: text("times") == "raw",
            hide_critical: text("critical") == "off",
            q: text("q"),
            span: text("span").to_lowercase(),
            expand_all: text("expand") == "all",
            parent: Some(text("parent").to_lowercase()).filter(|p| !p.is_empty()),
        }
    }
}

impl View {
    fn query(&self, span: Option<&str>, raw: bool) -> String {
        self.query_with(span, raw, self.hide_critical)
    }

    fn query_with(&self, span: Option<&str>, raw: bool, hide_critical: bool) -> String {
        query_string([
            ("span", span.unwrap_or("")),
            ("times", if raw { "raw" } else { "" }),
            ("critical", if hide_critical { "off" } else { "" }),
            ("q", self.q.as_str()),
        ])
    }
}

/// The page for one trace; pure, so the benchmark and tests can call it.
pub fn build(id: TraceId, spans: &[Span], options: &AnalyzeOptions, view: &View) -> TracePage {
    let analysis = analyze(spans, options);
    let trace_id = id.to_hex();
    let base = format!("/traces/{}", enc(&trace_id));
    let (starts, deadlines) = offsets(spans, &analysis, view.raw);

    let scale = analysis
        .rows
        .iter()
        .enumerate()
        .map(|(r, row)| starts[r] + row.duration_ms)
        .chain(analysis.edge.and_then(|e| deadlines[e]))
        .fold(0.0f64, f64::max)
        .max(1e-6);
    let at = |ms: f64| ms / scale * 100.0;

    // Tree shape from depths (rows are depth-first).
    let n = analysis.rows.len();
    let mut parent_row: Vec<Option<usize>> = vec![None; n];
    let mut stack: Vec<usize> = Vec::new();
    for (r, row) in analysis.rows.iter().enumerate() {
        while stack
            .last()
            .is_some_and(|&p| analysis.rows[p].depth >= row.depth)
        {
            stack.pop();
        }
        parent_row[r] = stack.last().copied();
        stack.push(r);
    }
    let has_children: Vec<bool> = (0..n)
        .map(|r| r + 1 < n && analysis.rows[r + 1].depth > analysis.rows[r].depth)
        .collect();

    let needle = view.q.to_lowercase();
    let matched: Vec<bool> = analysis
        .rows
        .iter()
        .map(|row| !needle.is_empty() && matches(&spans[row.span], &needle))
        .collect();
    let selected_row = analysis
        .rows
        .iter()
        .position(|row| spans[row.span].span_id.to_hex() == view.span);

    // Which rows start collapsed: deep ones in big traces, never on the way to a selected
    // or highlighted span. Big traces leave the rows under a collapsed one out of the page
    // (`lazy`): the script fetches them from `/traces/{id}/rows` when it is expanded.
    let big = n > COLLAPSE_ABOVE && !view.expand_all;
    let fragment_root = view.parent.as_ref().map(|parent| {
        analysis
            .rows
            .iter()
            .position(|row| spans[row.span].span_id.to_hex() == *parent)
    });
    let mut collapsed: Vec<bool> = (0..n)
        .map(|r| match fragment_root {
            Some(_) => has_children[r],
            None => big && has_children[r] && analysis.rows[r].depth >= 2,
        })
        .collect();
    for r in (0..n).filter(|&r| matched[r] || Some(r) == selected_row) {
        let mut up = parent_row[r];
        while let Some(p) = up {
            collapsed[p] = fragment_root.is_some() && collapsed[p];
            up = parent_row[p];
        }
    }
    let mut hidden = vec![false; n];
    for r in 0..n {
        hidden[r] = parent_row[r].is_some_and(|p| hidden[p] || collapsed[p]);
    }
    let lazy = big || fragment_root.is_some();
    let rendered: Vec<usize> = match fragment_root {
        Some(Some(root)) => (0..n).filter(|&r| parent_row[r] == Some(root)).collect(),
        Some(None) => Vec::new(),
        None if lazy => (0..n).filter(|&r| !hidden[r]).collect(),
        None => (0..n).collect(),
    };

    let rows: Vec<WfRow> = rendered
        .iter()
        .map(|&r| {
            let row = &analysis.rows[r];
            let span = &spans[row.span];
            let id = span.span_id.to_hex();
            let start = starts[r];
            let end = start + row.duration_ms;
            let deadline = deadlines[r];
            let over_from = deadline.filter(|d| *d < end).map(|d| d.max(start));
            let over_ms = over_from.map_or(0.0, |from| end - from);
            WfRow {
                href: format!("{base}{}#row-{id}", view.query(Some(&id), view.raw)),
                depth: row.depth,
                indent: row.depth.min(MAX_INDENT),
                has_children: has_children[r],
                collapsed: collapsed[r],
                hidden: hidden[r],
                lazy: (lazy && collapsed[r]).then(|| {
                    format!(
                        "{base}/rows{}",
                        query_string([
                            ("parent", id.as_str()),
                            ("times", if view.raw { "raw" } else { "" }),
                            ("critical", if view.hide_critical { "off" } else { "" }),
                            ("q", view.q.as_str()),
                        ])
                    )
                }),
                service: span.service.clone(),
                name: span.name.clone(),
                role: row.role.as_str(),
                bar_left: permille(at(start)),
                bar_width: permille(at(row.duration_ms).max(0.15)),
                over_left: permille(at(over_from.unwrap_or(0.0))),
                over_width: permille(at(over_ms)),
                has_over: over_ms > 0.0,
                over_text: if over_ms > 0.0 {
                    format!("ran {} past its deadline", fmt_duration(over_ms))
                } else {
                    String::new()
                },
                window_left: permille(at(start)),
                // A deadline past the axis (a budget longer than the trace) ends the band
                // at the axis' end: it never runs into the numbers beside the bars.
                window_width: permille(at(
                    deadline.map_or(0.0, |d| (d.min(scale) - start).max(0.0))
                )),
                has_window: deadline.is_some_and(|d| d > start),
                duration: fmt_duration(row.duration_ms),
                budget: fmt_opt_duration(row.budget_ms),
                self_ms: fmt_opt_duration(row.self_ms),
                burn: fmt_percent(row.burn),
                badges: row
                    .flags
                    .iter()
                    .map(|f| Badge::new(f.flag.as_str(), None, f.message.clone()))
                    .collect(),
                origin: analysis.origins.contains(&r),
                error: span.status.code == SpanStatus::Error,
                matched: matched[r],
                selected: Some(r) == selected_row,
                critical: row
                    .critical_ms
                    .filter(|_| !view.hide_critical)
                    .map(|own| format!("On the critical path: {} of its own", fmt_duration(own))),
                id,
            }
        })
        .collect();

    let detail = selected_row.map(|r| detail(spans, &analysis, r, &base, view, starts[r]));
    let edge_deadline = analysis.edge.and_then(|e| deadlines[e]);
    let root_row = analysis.edge.or(if n > 0 { Some(0) } else { None });
    let title = root_row
        .map(|r| {
            let s = &spans[analysis.rows[r].span];
            format!("{} {}", s.service, s.name)
        })
        .unwrap_or_else(|| format!("Trace {trace_id}"));
    let mut facts = vec![
        ("Duration", fmt_duration(analysis.duration_ms)),
        ("Request budget", fmt_opt_duration(analysis.budget_ms)),
        ("Spans", spans.len().to_string()),
        (
            "Services",
            spans
                .iter()
                .map(|s| s.service.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                .to_string(),
        ),
        (
            "Started",
            spans
                .iter()
                .map(|s| s.start_unix_nano)
                .min()
                .map(fmt_time)
                .unwrap_or_default(),
        ),
    ];
    if !analysis.calls_reaching.is_empty() {
        let reaching: Vec<String> = analysis
            .calls_reaching
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(service, n)| format!("{service} ×{n}"))
            .collect();
        if !reaching.is_empty() {
            facts.push(("Requests reaching", reaching.join(", ")));
        }
    }
    let skewed_rows = analysis
        .rows
        .iter()
        .filter(|r| r.skew_shift_ms.abs() > 1e-9)
        .count();
    TracePage {
        nav: "traces",
        verdict: verdict(spans, &analysis),
        outcome: analysis.outcome.as_str(),
        facts,
        flag_summary: analysis
            .flag_counts
            .iter()
            .map(|(f, n)| {
                Badge::new(
                    f.as_str(),
                    Some(*n),
                    super::flag_meaning(f.as_str()).to_string(),
                )
            })
            .collect(),
        raw: view.raw,
        times_href: format!("{base}{}", view.query(Some(&view.span), !view.raw)),
        times_label: if view.raw {
            "Show skew-adjusted times"
        } else {
            "Show raw times"
        },
        show_critical: !view.hide_critical && !analysis.critical_path.is_empty(),
        critical_href: format!(
            "{base}{}",
            view.query_with(Some(&view.span), view.raw, !view.hide_critical)
        ),
        critical_label: if view.hide_critical {
            "Show the critical path"
        } else {
            "Hide the critical path"
        },
        skewed_rows,
        q: view.q.clone(),
        span_param: view.span.clone(),
        matches: matched.iter().filter(|m| **m).count(),
        // Five ticks, the last at the right edge: the axis reaches the end of the trace.
        ticks: (0..=4)
            .map(|k| {
                (
                    permille(k as f64 * 25.0),
                    fmt_duration(scale * k as f64 / 4.0),
                )
            })
            .collect(),
        deadline_at: edge_deadline.map(|d| permille(at(d))),
        deadline_label: edge_deadline
            .map(|d| format!("request deadline at {}", fmt_duration(d)))
            .unwrap_or_default(),
        rows,
        detail,
        span_missing: !view.span.is_empty() && selected_row.is_none(),
        lazy,
        expand_all_href: format!(
            "{base}{}",
            query_string([
                ("span", view.span.as_str()),
                ("times", if view.raw { "raw" } else { "" }),
                ("critical", if view.hide_critical { "off" } else { "" }),
                ("q", view.q.as_str()),
                ("expand", "all"),
            ])
        ),
        row_count: n,
        download_href: format!("/api/traces/{}/otlp", enc(&trace_id)),
        json_href: format!("/api/traces/{}", enc(&trace_id)),
        title,
        trace_id,
    }
}

/// Start and deadline offsets per row: the analysis' skew-adjusted ones, or raw times.
fn offsets(spans: &[Span], analysis: &Analysis, raw: bool) -> (Vec<f64>, Vec<Option<f64>>) {
    if !raw {
        return (
            analysis.rows.iter().map(|r| r.start_offset_ms).collect(),
            analysis.rows.iter().map(|r| r.deadline_offset_ms).collect(),
        );
    }
    let t0 = spans.iter().map(|s| s.start_unix_nano).min().unwrap_or(0);
    let raw_start: Vec<f64> = analysis
        .rows
        .iter()
        .map(|r| spans[r.span].start_unix_nano.saturating_sub(t0) as f64 / 1e6)
        .collect();
    // The adjusted timeline starts at `origin` = min(raw start + shift) of the raw one.
    let origin = analysis
        .rows
        .iter()
        .zip(&raw_start)
        .map(|(r, s)| s + r.skew_shift_ms)
        .fold(f64::INFINITY, f64::min);
    let origin = if origin.is_finite() { origin } else { 0.0 };
    let shift_of_span: HashMap<usize, f64> = analysis
        .rows
        .iter()
        .map(|r| (r.span, r.skew_shift_ms))
        .collect();
    let deadlines = analysis
        .rows
        .iter()
        .map(|r| {
            let owner = if r.role == Role::Hop {
                Some(r.span)
            } else {
                r.owner
            };
            let shift = owner
                .and_then(|o| shift_of_span.get(&o))
                .copied()
                .unwrap_or(0.0);
            r.deadline_offset_ms.map(|d| d - shift + origin)
        })
        .collect();
    (raw_start, deadlines)
}

fn matches(span: &Span, needle: &str) -> bool {
    let hit = |text: &str| text.to_lowercase().contains(needle);
    hit(&span.service)
        || hit(&span.name)
        || hit(&span.span_id.to_hex())
        || span
            .attributes
            .iter()
            .chain(span.resource.iter())
            .any(|(k, v)| hit(&format!("{k}={}", display_value(v))))
}

/// Attribute values as text: strings as they are, everything else as JSON.
fn display_value(value: &AttrValue) -> String {
    match value {
        AttrValue::String(s) => s.clone(),
        other => attr_json::value_to_json(other).to_string(),
    }
}

pub(super) fn pairs(attributes: &Attributes) -> Vec<(String, String)> {
    attributes
        .iter()
        .map(|(k, v)| (k.clone(), display_value(v)))
        .collect()
}

fn detail(
    spans: &[Span],
    analysis: &Analysis,
    r: usize,
    base: &str,
    view: &View,
    start_offset: f64,
) -> Detail {
    let row = &analysis.rows[r];
    let span = &spans[row.span];
    let ms = |v: Option<f64>| v.map(fmt_duration);
    let numbers: Vec<(&'static str, String)> = [
        ("Budget received", ms(row.budget_ms)),
        (
            "Budget source",
            span.budget.as_ref().map(|b| b.source.clone()),
        ),
        ("Available", ms(row.available_ms)),
        (
            "Deadline at",
            row.deadline_offset_ms
                .map(|d| format!("+{} (trace time)", fmt_duration(d))),
        ),
        ("Self time", ms(row.self_ms)),
        (
            "Critical path",
            row.critical_ms
                .map(|own| format!("on it, {} of its own", fmt_duration(own))),
        ),
        ("Burn", row.burn.map(|b| fmt_percent(Some(b)))),
        ("Exceed", row.exceed.map(|e| e.as_str().to_string())),
        ("Attempt", row.attempt.map(|a| a.to_string())),
        ("Wasted", ms(row.wasted_ms)),
        (
            "Skew shift",
            (row.skew_shift_ms.abs() > 1e-9).then(|| fmt_duration(row.skew_shift_ms)),
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, v)))
    .collect();
    let t0 = spans.iter().map(|s| s.start_unix_nano).min().unwrap_or(0);
    let mut warnings = row.warnings.clone();
    if span.warnings.iter().any(|w| !warnings.contains(w)) {
        warnings.extend(
            span.warnings
                .iter()
                .filter(|w| !row.warnings.contains(w))
                .cloned(),
        );
    }
    Detail {
        id: span.span_id.to_hex(),
        parent: span
            .parent_span_id
            .map(|p| p.to_hex())
            .unwrap_or_else(|| "none (root)".into()),
        service: span.service.clone(),
        name: span.name.clone(),
        kind: span.kind.as_str(),
        role: row.role.as_str(),
        status: if span.status.message.is_empty() {
            span.status.code.as_str().to_string()
        } else {
            format!("{}: {}", span.status.code.as_str(), span.status.message)
        },
        start: fmt_time(span.start_unix_nano),
        offset: fmt_duration(start_offset),
        duration: fmt_duration(row.duration_ms),
        numbers,
        flags: row
            .flags
            .iter()
            .map(|f| (f.flag.as_str(), f.message.clone()))
            .collect(),
        warnings,
        attributes: pairs(&span.attributes),
        resource: pairs(&span.resource),
        events: span
            .events
            .iter()
            .map(|e| {
                let offset = (e.time_unix_nano as f64 - t0 as f64) / 1e6;
                let attrs = pairs(&e.attributes)
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                (fmt_duration(offset), e.name.clone(), attrs)
            })
            .collect(),
        links: span
            .links
            .iter()
            .map(|l| {
                let trace = l.trace_id.to_hex();
                (
                    format!("/traces/{}?span={}", enc(&trace), enc(&l.span_id.to_hex())),
                    format!("trace {trace}, span {}", l.span_id.to_hex()),
                )
            })
            .collect(),
        scope: if span.scope.version.is_empty() {
            span.scope.name.clone()
        } else {
            format!("{} {}", span.scope.name, span.scope.version)
        },
        hop_href: (row.role == Role::Hop).then(|| hop_href(&span.service, &span.name, "")),
        close_href: format!("{base}{}", view.query(None, view.raw)),
    }
}

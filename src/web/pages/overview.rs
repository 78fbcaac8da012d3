//! `/`: the hops table, deadline-exceeded over time (inherited vs local), where exceeded
//! requests ran out (their origin hops), the top budget burners, and for a new installation
//! the steps to send the first traces.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{
    Badge, PageError, RangeLink, TimeRange, fmt_duration, fmt_opt_duration, fmt_percent, hop_href,
    html, permille, query_string,
};
use crate::core::analyze::hops::HopRollupRow;
use crate::core::analyze::hops::Rollup;
use crate::pipeline::status::Status;
use crate::web::AppState;

/// Sortable columns: (URL key, header, default order descending?).
/// The hops table: every flag a hop's statistics count, then the times (`wasted` is time,
/// so it stands with the times, not among the counts).
const COLUMNS: [(&str, &str, bool); 15] = [
    ("service", "Service", false),
    ("operation", "Operation", false),
    ("requests", "Requests", true),
    ("local_exceed", "Local exceed", true),
    ("inherited_exceed", "Inherited exceed", true),
    ("overspent", "Overspent", true),
    ("inflated", "Inflated", true),
    ("dropped", "Dropped", true),
    ("doomed", "Doomed", true),
    ("refused", "Refused", true),
    ("retry", "Retries", true),
    ("budget_p50", "Budget p50", true),
    ("budget_p95", "Budget p95", true),
    ("burn_p95", "Burn p95", true),
    ("wasted_ms", "Wasted time", true),
];

pub struct Header {
    pub label: &'static str,
    pub href: String,
    /// `ascending`, `descending` or `none`, for `aria-sort`.
    pub sort: &'static str,
    pub numeric: bool,
}

pub struct HopRow {
    pub service: String,
    pub operation: String,
    pub href: String,
    pub requests: i64,
    pub local: i64,
    pub inherited: i64,
    pub overspent: i64,
    pub inflated: i64,
    pub dropped: i64,
    pub doomed: i64,
    pub refused: i64,
    pub retry: i64,
    pub wasted: String,
    pub budget_p50: String,
    pub budget_p95: String,
    pub burn_p95: String,
    /// The hop's deadline metrics beside its traces' numbers, when it exports them.
    pub reported: Option<String>,
}

/// A hop where exceeded requests ran out.
pub struct Origin {
    pub service: String,
    pub operation: String,
    pub href: String,
    /// Search for the exceeded traces that ran out here.
    pub traces_href: String,
    pub count: i64,
    /// Width of the bar (`permille`).
    pub bar: u16,
}

pub struct Burner {
    pub service: String,
    pub operation: String,
    pub href: String,
    pub burn_p95: String,
    pub self_p95: String,
    /// Width of the bar (`permille`).
    pub bar: u16,
    pub requests: i64,
    /// "critical hop of 80 % of 12 exceeded": how often its work made exceeded requests late.
    pub critical: Option<String>,
}

#[derive(Template)]
#[template(path = "overview.html")]
pub struct OverviewPage {
    pub nav: &'static str,
    pub range: TimeRange,
    pub range_links: Vec<RangeLink>,
    /// Parameters the custom-range form carries along.
    pub range_keep: Vec<(String, String)>,
    pub range_description: String,
    /// Nothing was ever stored: show how to send traces.
    pub first_run: bool,
    pub headers: Vec<Header>,
    pub hops: Vec<HopRow>,
    pub total_requests: i64,
    pub total_local: i64,
    pub total_inherited: i64,
    /// All hops' deadline metrics beside the traces' local exceeds, when any were exported.
    pub total_reported: Option<String>,
    pub chart: String,
    pub chart_rows: Vec<(String, i64, i64)>,
    pub burners: Vec<Burner>,
    pub origins: Vec<Origin>,
    /// Exceeded requests counted at an origin hop in the range, all hops together.
    pub total_origins: i64,
    pub legend: Vec<Badge>,
    pub exceeded_href: String,
    /// The searches for the two flags not counted per hop.
    pub unsafe_retry_href: String,
    pub missing_parent_href: String,
    /// Firing alert instances (filled by the handler).
    pub firing: Vec<super::alerts::InstanceRow>,
    /// Set when analysis is more than a minute behind (filled by the handler).
    pub behind: Option<String>,
    /// Set while stored traces are re-analysed with the current rules (filled by the handler).
    pub reanalysing: Option<String>,
    /// That healthy traces older than their retention are gone, when the range reaches back
    /// that far (filled by the handler).
    pub healthy_note: Option<String>,
}

pub async fn overview(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let range = TimeRange::from_query(&params)?;
    let rows = range
        .rollups(state.store.as_ref(), None, None, false)
        .await?;
    let first_run = rows.is_empty() && state.store.services().await?.is_empty();
    let sort = params
        .get("sort")
        .map(String::as_str)
        .unwrap_or("local_exceed");
    let descending = params.get("order").map(String::as_str) != Some("asc");
    let mut page = build(range, &rows, first_run, sort, descending);
    page.firing = super::alerts::firing(&state, None).await?;
    let status = state.status.latest();
    page.behind = status.as_ref().and_then(behind);
    page.reanalysing = status.as_ref().and_then(reanalysing);
    page.healthy_note = state.healthy_note(Some(page.range.since));
    Ok(html(StatusCode::OK, &page))
}

/// What the banner says when analysed statistics are more than a minute behind.
pub fn behind(status: &Status) -> Option<String> {
    status.behind.then(|| {
        format!(
            "Statistics are {} behind: {} traces wait for analysis ({:.0} analysed per second). \
             This page, search and alerts do not count them yet. /api/status shows the lag.",
            humantime::format_duration(std::time::Duration::from_secs(
                status.analysis_lag_s as u64
            )),
            status.traces_pending,
            status.analyzed_traces_per_s,
        )
    })
}

/// What the banner says while stored traces are re-analysed with the current rules.
pub fn reanalysing(status: &Status) -> Option<String> {
    let progress = status.reanalysis.as_ref().filter(|p| !p.finished)?;
    Some(format!(
        "Stored traces are being re-analysed with the current rules (version {}, tolerance \
         {} ms): {} of {} done, newest first. Until it finishes, older traces count in \
         search, hop statistics and alerts as they were first analysed; their trace pages \
         already show the current analysis. /api/status shows the progress.",
        progress.rules_version, progress.tolerance_ms, progress.done, progress.stale_at_start,
    ))
}

/// The page from rollup rows; pure, so the benchmark and tests can call it.
pub fn build(
    range: TimeRange,
    rows: &[HopRollupRow],
    first_run: bool,
    sort: &str,
    descending: bool,
) -> OverviewPage {
    let mut merged: BTreeMap<(&str, &str), Rollup> = BTreeMap::new();
    for row in rows {
        merged
            .entry((&row.service, &row.operation))
            .or_default()
            .merge(&row.rollup);
    }
    let range_query = range.query();
    let mut hops: Vec<(HopRow, Vec<f64>)> = merged
        .iter()
        .map(|((service, operation), r)| {
            let q = |h: &crate::core::analyze::histogram::Histogram, p| h.quantile(p);
            let keys = vec![
                0.0,
                0.0,
                r.requests as f64,
                r.count("local_exceed") as f64,
                r.count("inherited_exceed") as f64,
                r.count("overspent") as f64,
                r.count("inflated") as f64,
                r.count("dropped") as f64,
                r.count("doomed") as f64,
                r.count("refused") as f64,
                r.count("retry") as f64,
                q(&r.budget, 0.5).unwrap_or(f64::NEG_INFINITY),
                q(&r.budget, 0.95).unwrap_or(f64::NEG_INFINITY),
                q(&r.burn, 0.95).unwrap_or(f64::NEG_INFINITY),
                r.wasted_ms,
            ];
            (
                HopRow {
                    service: service.to_string(),
                    operation: operation.to_string(),
                    href: hop_href(service, operation, &range_query),
                    requests: r.requests,
                    local: r.count("local_exceed"),
                    inherited: r.count("inherited_exceed"),
                    overspent: r.count("overspent"),
                    inflated: r.count("inflated"),
                    dropped: r.count("dropped"),
                    doomed: r.count("doomed"),
                    refused: r.count("refused"),
                    retry: r.count("retry"),
                    wasted: fmt_duration(r.wasted_ms),
                    budget_p50: fmt_opt_duration(q(&r.budget, 0.5)),
                    budget_p95: fmt_opt_duration(q(&r.budget, 0.95)),
                    burn_p95: fmt_percent(q(&r.burn, 0.95)),
                    reported: super::reported_line(r),
                },
                keys,
            )
        })
        .collect();
    let column = COLUMNS
        .iter()
        .position(|(key, _, _)| *key == sort)
        .unwrap_or(3);
    hops.sort_by(|(a, ka), (b, kb)| {
        let order = match column {
            0 => a
                .service
                .cmp(&b.service)
                .then(a.operation.cmp(&b.operation)),
            1 => a
                .operation
                .cmp(&b.operation)
                .then(a.service.cmp(&b.service)),
            c => ka[c]
                .total_cmp(&kb[c])
                .then(a.requests.cmp(&b.requests))
                .then(b.service.cmp(&a.service)),
        };
        if descending { order.reverse() } else { order }
    });
    let current = COLUMNS[column].0;
    let headers = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, (key, label, default_descending))| {
            // Clicking the current column flips its order; another column starts at its default.
            let next_descending = if *key == current {
                !descending
            } else {
                *default_descending
            };
            let mut pairs = range.pairs();
            pairs.push(("sort", key));
            pairs.push(("order", if next_descending { "desc" } else { "asc" }));
            Header {
                label,
                href: format!("/{}", query_string(pairs)),
                sort: match (*key == current, descending) {
                    (true, true) => "descending",
                    (true, false) => "ascending",
                    _ => "none",
                },
                numeric: i >= 2,
            }
        })
        .collect();

    let mut burners: Vec<(&(&str, &str), &Rollup, f64)> = merged
        .iter()
        .filter_map(|(key, r)| Some((key, r, r.burn.quantile(0.95)?)))
        .filter(|(_, _, burn)| *burn > 0.0)
        .collect();
    burners.sort_by(|a, b| b.2.total_cmp(&a.2));
    let top = burners.first().map_or(1.0, |b| b.2.max(1e-9));
    let burners = burners
        .into_iter()
        .take(5)
        .map(|((service, operation), r, burn)| Burner {
            service: service.to_string(),
            operation: operation.to_string(),
            href: hop_href(service, operation, &range_query),
            burn_p95: fmt_percent(Some(burn)),
            self_p95: fmt_opt_duration(r.self_ms.quantile(0.95)),
            bar: permille((burn / top * 100.0).clamp(1.0, 100.0)),
            requests: r.requests,
            critical: r.critical.share().map(|share| {
                format!(
                    "critical hop of {} of {} exceeded",
                    fmt_percent(Some(share)),
                    r.critical.exceeded
                )
            }),
        })
        .collect();

    let mut origins: Vec<(&(&str, &str), i64)> = merged
        .iter()
        .map(|(key, r)| (key, r.count("origin")))
        .filter(|(_, n)| *n > 0)
        .collect();
    origins.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let total_origins = origins.iter().map(|(_, n)| n).sum();
    let most = origins.first().map_or(1, |o| o.1).max(1) as f64;
    let origins = origins
        .into_iter()
        .take(8)
        .map(|((service, operation), count)| Origin {
            service: service.to_string(),
            operation: operation.to_string(),
            href: hop_href(service, operation, &range_query),
            traces_href: range
                .search_href(&[("origin_service", service), ("origin_operation", operation)]),
            count,
            bar: permille((count as f64 / most * 100.0).clamp(1.0, 100.0)),
        })
        .collect();

    let (chart, chart_rows) = super::exceeded_chart(&range, rows, super::Exceeds::Traces);
    let total_requests = hops.iter().map(|(h, _)| h.requests).sum();
    let total_local = hops.iter().map(|(h, _)| h.local).sum();
    let total_inherited = hops.iter().map(|(h, _)| h.inherited).sum();
    let mut all = Rollup::default();
    for r in merged.values() {
        all.merge(r);
    }
    let total_reported = super::reported_line(&all);
    let legend = crate::core::analyze::Flag::ALL
        .iter()
        .map(|f| {
            Badge::new(
                f.as_str(),
                None,
                super::flag_meaning(f.as_str()).to_string(),
            )
        })
        .collect();
    let exceeded_href = range.search_href(&[("outcome", "exceeded")]);
    let unsafe_retry_href = range.search_href(&[("flag", "unsafe_retry")]);
    let missing_parent_href = range.search_href(&[("flag", "missing_parent")]);
    OverviewPage {
        nav: "overview",
        range_links: range.links("/", &[]),
        range_keep: Vec::new(),
        range_description: range.description(),
        range,
        first_run,
        headers,
        hops: hops.into_iter().map(|(h, _)| h).collect(),
        total_requests,
        total_local,
        total_inherited,
        total_reported,
        chart,
        chart_rows,
        burners,
        origins,
        total_origins,
        legend,
        exceeded_href,
        unsafe_retry_href,
        missing_parent_href,
        firing: Vec::new(),
        behind: None,
        reanalysing: None,
        healthy_note: None,
    }
}

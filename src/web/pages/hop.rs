//! `/hops/{service}/{operation}`: one hop identity over a time range. Received-budget and
//! burn distributions, deadline-exceeded over time (inherited vs local), which callers send
//! it requests whose budget is already spent, and its recent flagged traces (with this
//! hop's flags told apart from the rest of the trace's).

use std::collections::{BTreeMap, HashMap};

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{
    Badge, PageError, RangeLink, TimeRange, flag_meaning, fmt_duration, fmt_opt_duration,
    fmt_percent, fmt_time, hop_href, html, trace_href,
};
use crate::core::advice::Subject;
use crate::core::analyze::Flag;
use crate::core::analyze::histogram::Histogram;
use crate::core::analyze::hops::{FlagsAt, Rollup, Spent};
use crate::core::model::TraceId;
use crate::store::query::TraceQuery;
use crate::web::AppState;
use crate::web::charts;

/// How many recent traces with an inherited exceed are analysed to find the callers.
const CALLER_TRACES: u32 = 50;
/// How many recent traces are listed.
const RECENT: usize = 20;

pub struct Caller {
    pub service: String,
    pub operation: String,
    pub href: Option<String>,
    pub count: usize,
    pub example: String,
}

pub struct SpentOrigin {
    pub service: String,
    pub operation: String,
    pub href: String,
    pub count: usize,
}

pub struct RecentTrace {
    pub href: String,
    pub start: String,
    pub root: String,
    pub outcome: &'static str,
    /// How long the edge hop took to answer (the trace's duration when there is none).
    pub answered: String,
    pub budget: String,
    /// Flags on this hop and the calls it made.
    pub here: Vec<Badge>,
    /// The rest of the trace's flags.
    pub elsewhere: Vec<Badge>,
    /// The request ran out at this hop.
    pub origin: bool,
}

#[derive(Template)]
#[template(path = "hop.html")]
pub struct HopPage {
    pub nav: &'static str,
    pub service: String,
    pub operation: String,
    pub range: TimeRange,
    pub range_links: Vec<RangeLink>,
    pub range_keep: Vec<(String, String)>,
    pub range_description: String,
    pub facts: Vec<(&'static str, String)>,
    pub has_data: bool,
    pub budget_chart: String,
    pub exceeded_chart: String,
    /// The same from the hop's deadline metrics, when it exports them.
    pub metrics_chart: Option<String>,
    pub burn_chart: String,
    pub callers: Vec<Caller>,
    /// Where the budget of the already-spent requests ran out, most first.
    pub spent_origins: Vec<SpentOrigin>,
    pub callers_scanned: usize,
    pub recent: Vec<RecentTrace>,
    pub traces_href: String,
    pub firing: Vec<super::alerts::InstanceRow>,
    /// The new-rule form, filled in for this hop.
    pub new_rule_href: String,
    /// The advisor's findings about this hop and the edges to and from it.
    pub advice: Vec<super::advisor::FindingView>,
    pub advisor_href: String,
}

pub async fn hop(
    State(state): State<AppState>,
    Path((service, operation)): Path<(String, String)>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let range = TimeRange::from_query(&params)?;
    let rows = range
        .rollups(state.store.as_ref(), Some(&service), Some(&operation), true)
        .await?;
    let base_query = TraceQuery {
        service: Some(service.clone()),
        operation: Some(operation.clone()),
        since_unix_nano: Some(range.since),
        until_unix_nano: Some(range.until),
        ..TraceQuery::default()
    };
    let recent = state
        .store
        .search_traces(&TraceQuery {
            limit: 200,
            ..base_query.clone()
        })
        .await?;
    let spent = state
        .store
        .search_traces(&TraceQuery {
            flag: Some(crate::core::analyze::Flag::InheritedExceed),
            limit: CALLER_TRACES,
            ..base_query
        })
        .await?;
    let recent: Vec<_> = recent
        .into_iter()
        .filter(|t| !t.flag_counts.is_empty() || t.outcome.as_str() == "exceeded")
        .take(RECENT)
        .collect();
    // The callers and this hop's flags come from the traces' stored hop samples (what the
    // analyzer wrote, as the statistics above), not from analysing each trace again.
    let mut ids: Vec<TraceId> = spent.iter().chain(&recent).map(|t| t.trace_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let samples = if ids.is_empty() {
        HashMap::new()
    } else {
        state.store.hop_samples(&ids).await?
    };
    let mut spent_here = Spent::default();
    for trace in &spent {
        if let Some(samples) = samples.get(&trace.trace_id) {
            spent_here.add(trace.trace_id, samples, &service, &operation);
        }
    }
    let mut flags: HashMap<TraceId, FlagsAt> = recent
        .iter()
        .filter_map(|t| {
            let samples = samples.get(&t.trace_id)?;
            Some((
                t.trace_id,
                FlagsAt::of(samples, &t.flag_counts, &service, &operation),
            ))
        })
        .collect();
    let badges = |counts: &BTreeMap<Flag, usize>| -> Vec<Badge> {
        counts
            .iter()
            .map(|(f, n)| Badge::new(f.as_str(), Some(*n), flag_meaning(f.as_str()).into()))
            .collect()
    };

    let mut merged = Rollup::default();
    for row in &rows {
        merged.merge(&row.rollup);
    }
    let (exceeded_chart, _) = super::exceeded_chart(&range, &rows, super::Exceeds::Traces);
    let metrics_chart = (!merged.reported.is_empty())
        .then(|| super::exceeded_chart(&range, &rows, super::Exceeds::Metrics).0);
    let range_query = range.query();
    let this = (service.clone(), operation.clone());
    let (since, until) = range.aligned();
    let advice =
        crate::web::advisor::load(&state, since, until, |finding| match &finding.subject {
            Subject::Hop(hop) => *hop == this,
            Subject::Edge { caller, callee } => *caller == this || *callee == this,
        })
        .await?
        .into_iter()
        .map(|(finding, examples)| super::advisor::view(finding, &examples, &range))
        .collect();
    let facts = vec![
        ("Requests", merged.requests.to_string()),
        ("Ran out here", merged.count("origin").to_string()),
        ("Local exceed", merged.count("local_exceed").to_string()),
        (
            "Inherited exceed",
            merged.count("inherited_exceed").to_string(),
        ),
        ("Overspent", merged.count("overspent").to_string()),
        ("Inflated", merged.count("inflated").to_string()),
        ("Dropped", merged.count("dropped").to_string()),
        ("Doomed", merged.count("doomed").to_string()),
        ("Refused", merged.count("refused").to_string()),
        ("Retries", merged.count("retry").to_string()),
        ("Wasted", fmt_duration(merged.wasted_ms)),
        ("Budget p50", fmt_opt_duration(merged.budget.quantile(0.5))),
        ("Budget p95", fmt_opt_duration(merged.budget.quantile(0.95))),
        ("Budget p99", fmt_opt_duration(merged.budget.quantile(0.99))),
        ("Burn p50", fmt_percent(merged.burn.quantile(0.5))),
        ("Burn p95", fmt_percent(merged.burn.quantile(0.95))),
        ("Self p95", fmt_opt_duration(merged.self_ms.quantile(0.95))),
        (
            "Critical path, mean",
            fmt_opt_duration(
                (merged.requests > 0).then(|| merged.critical.ms / merged.requests as f64),
            ),
        ),
        (
            "Critical hop of exceeded",
            match merged.critical.share() {
                Some(share) => format!(
                    "{} of {} (on the path of {})",
                    fmt_percent(Some(share)),
                    merged.critical.exceeded,
                    merged.critical.exceeded_on_path
                ),
                None => "no exceeded request".into(),
            },
        ),
    ];
    let mut facts = facts;
    if let Some(line) = super::reported_line(&merged) {
        let r = &merged.reported;
        facts.insert(0, ("Deadline metrics", line));
        facts.insert(
            1,
            (
                "Metrics: budget received mean",
                fmt_opt_duration(r.received_mean_ms()),
            ),
        );
        facts.insert(
            2,
            (
                "Metrics: budget left mean",
                fmt_opt_duration(r.remaining_mean_ms()),
            ),
        );
    }
    let page = HopPage {
        nav: "overview",
        has_data: merged.requests > 0 || !merged.reported.is_empty(),
        budget_chart: charts::histogram(
            "Budget received (requests per bucket)",
            &bins(&merged.budget, fmt_duration),
            charts::NEUTRAL,
        ),
        exceeded_chart,
        metrics_chart,
        burn_chart: charts::histogram(
            "Burn: share of the request budget spent in this hop",
            &bins(&merged.burn, |v| fmt_percent(Some(v))),
            charts::NEUTRAL,
        ),
        callers: spent_here
            .callers
            .into_iter()
            .map(|((service, operation), (count, example))| Caller {
                href: (!service.is_empty()).then(|| hop_href(&service, &operation, &range_query)),
                service,
                operation,
                count,
                example: trace_href(&example),
            })
            .collect(),
        spent_origins: {
            let mut origins: Vec<SpentOrigin> = spent_here
                .origins
                .into_iter()
                .map(|((service, operation), count)| SpentOrigin {
                    href: hop_href(&service, &operation, &range_query),
                    service,
                    operation,
                    count,
                })
                .collect();
            origins.sort_by_key(|o| std::cmp::Reverse(o.count));
            origins
        },
        callers_scanned: spent.len(),
        recent: recent
            .iter()
            .map(|t| {
                // A trace whose summary went (retention) between search and load shows its
                // summary's flags as elsewhere.
                let at = flags.remove(&t.trace_id).unwrap_or_else(|| FlagsAt {
                    elsewhere: t.flag_counts.clone(),
                    ..FlagsAt::default()
                });
                RecentTrace {
                    href: trace_href(&t.trace_id.to_hex()),
                    start: fmt_time(t.start_unix_nano),
                    root: format!("{} {}", t.root_service, t.root_name),
                    outcome: t.outcome.as_str(),
                    answered: fmt_duration(t.answer_ms.unwrap_or(t.duration_ms)),
                    budget: fmt_opt_duration(t.budget_ms),
                    here: badges(&at.here),
                    elsewhere: badges(&at.elsewhere),
                    origin: at.origin,
                }
            })
            .collect(),
        traces_href: range.search_href(&[
            ("service", service.as_str()),
            ("operation", operation.as_str()),
        ]),
        firing: super::alerts::firing(&state, Some((&service, &operation))).await?,
        new_rule_href: format!(
            "/alerts/rules/new{}",
            super::query_string([
                ("service", service.as_str()),
                ("operation", operation.as_str())
            ])
        ),
        advice,
        advisor_href: {
            let mut pairs = range.pairs();
            pairs.push(("service", service.as_str()));
            format!("/advisor{}", super::query_string(pairs))
        },
        range_links: range.links(&hop_href(&service, &operation, ""), &[]),
        range_keep: Vec::new(),
        range_description: range.description(),
        range,
        facts,
        service,
        operation,
    };
    Ok(html(StatusCode::OK, &page))
}

/// A histogram re-binned into at most 16 equal-width bins for display.
fn bins(histogram: &Histogram, label: impl Fn(f64) -> String) -> Vec<(String, f64)> {
    let points = histogram.points();
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return Vec::new();
    };
    let (low, high) = (first.0, last.0);
    let count = if high > low { 16 } else { 1 };
    let width = ((high - low) / count as f64).max(f64::MIN_POSITIVE);
    let mut out: Vec<(String, f64)> = (0..count)
        .map(|i| (label(low + i as f64 * width), 0.0))
        .collect();
    for (value, n) in points {
        let at = (((value - low) / width) as usize).min(count - 1);
        out[at].1 += n as f64;
    }
    out
}

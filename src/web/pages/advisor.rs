//! `/advisor`: the advisor's findings over a range (`web::advisor::load`), grouped by the
//! calling service, each with its numbers, what to change, and links to the edge's hops and
//! its example traces.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{PageError, RangeLink, TimeRange, hop_href, html, trace_href};
use crate::core::advice::HopId;
use crate::web::AppState;
use crate::web::advisor::load;

pub struct FindingView {
    pub kind: &'static str,
    pub caller: String,
    pub caller_href: String,
    pub callee: String,
    /// None for a peer that is no instrumented hop.
    pub callee_href: Option<String>,
    pub message: String,
    pub recommendation: String,
    pub value: String,
    pub examples: Vec<(String, String)>,
}

pub struct ServiceFindings {
    pub service: String,
    pub findings: Vec<FindingView>,
}

#[derive(Template)]
#[template(path = "advisor.html")]
pub struct AdvisorPage {
    pub nav: &'static str,
    pub range: TimeRange,
    pub range_links: Vec<RangeLink>,
    pub range_keep: Vec<(String, String)>,
    pub range_description: String,
    pub service: String,
    pub groups: Vec<ServiceFindings>,
    pub count: usize,
}

fn label((service, operation): &HopId) -> String {
    if operation.is_empty() {
        service.clone()
    } else {
        format!("{service} {operation}")
    }
}

pub async fn advisor(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let range = TimeRange::from_query(&params)?;
    let service = params
        .get("service")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let (since, until) = range.aligned();
    let found = load(
        &state,
        since,
        until,
        Some(service.as_str()).filter(|s| !s.is_empty()),
    )
    .await?;
    let count = found.len();
    let range_query = range.query();
    let mut groups: BTreeMap<String, Vec<FindingView>> = BTreeMap::new();
    for (finding, examples) in found {
        let view = FindingView {
            kind: finding.kind,
            caller: label(&finding.caller),
            caller_href: hop_href(&finding.caller.0, &finding.caller.1, &range_query),
            callee: label(&finding.callee),
            callee_href: (!finding.callee.1.is_empty())
                .then(|| hop_href(&finding.callee.0, &finding.callee.1, &range_query)),
            value: finding
                .value_ms
                .map(|v| format!("{} ms", crate::core::analyze::fmt_ms(v)))
                .unwrap_or_default(),
            message: finding.message,
            recommendation: finding.recommendation,
            examples: examples
                .iter()
                .map(|id| (id[..12].to_string(), trace_href(id)))
                .collect(),
        };
        groups.entry(finding.caller.0).or_default().push(view);
    }
    let mut keep = Vec::new();
    if !service.is_empty() {
        keep.push(("service", service.as_str()));
    }
    Ok(html(
        StatusCode::OK,
        &AdvisorPage {
            nav: "advisor",
            range_links: range.links("/advisor", &keep),
            range_keep: keep
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            range_description: range.description(),
            range,
            service,
            groups: groups
                .into_iter()
                .map(|(service, findings)| ServiceFindings { service, findings })
                .collect(),
            count,
        },
    ))
}

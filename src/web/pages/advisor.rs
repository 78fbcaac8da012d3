//! `/advisor`: the advisor's findings over a range (`web::advisor::load`), grouped by the
//! service they are about (an edge's caller), each with its numbers, what to change, and
//! links to its hops and example traces.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{PageError, RangeLink, TimeRange, hop_href, html, trace_href};
use crate::core::advice::{Finding, HopId, Subject};
use crate::web::AppState;
use crate::web::advisor::{load, of_service};

pub struct FindingView {
    pub kind: &'static str,
    /// The hop, or the edge's caller and callee: each with its hop page (none for a peer
    /// that is no instrumented hop).
    pub ends: Vec<(String, Option<String>)>,
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

/// A finding as the advisor page and the hop page show it (`templates/finding.html`).
pub fn view(finding: Finding, examples: &[String], range_query: &str) -> FindingView {
    let end = |hop: &HopId| {
        (
            label(hop),
            (!hop.1.is_empty()).then(|| hop_href(&hop.0, &hop.1, range_query)),
        )
    };
    let ends = match &finding.subject {
        Subject::Edge { caller, callee } => vec![end(caller), end(callee)],
        Subject::Hop(hop) => vec![end(hop)],
    };
    FindingView {
        kind: finding.kind,
        ends,
        value: match (finding.value_ms, finding.value) {
            (Some(ms), _) => format!("{} ms", crate::core::analyze::fmt_ms(ms)),
            (None, Some(n)) => format!("{n:.0} calls"),
            (None, None) => String::new(),
        },
        message: finding.message,
        recommendation: finding.recommendation,
        examples: examples
            .iter()
            .map(|id| (id[..12].to_string(), trace_href(id)))
            .collect(),
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
    let only = Some(service.as_str()).filter(|s| !s.is_empty());
    let found = load(&state, since, until, of_service(only)).await?;
    let count = found.len();
    let range_query = range.query();
    let mut groups: BTreeMap<String, Vec<FindingView>> = BTreeMap::new();
    for (finding, examples) in found {
        let service = finding.subject.service().to_string();
        groups
            .entry(service)
            .or_default()
            .push(view(finding, &examples, &range_query));
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

//! `/advisor`: the advisor's findings over a range (`web::advisor::load`), grouped by the
//! service they are about (an edge's caller), each with its numbers, what to change, and
//! links to its hops and example traces.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{PageError, RangeLink, TimeRange, hop_href, html, trace_href};
use crate::core::advice::{Finding, HopId, Subject, hop_label};
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
    /// The what-if form for the change the finding implies, when it has one.
    pub whatif: Option<WhatIfForm>,
}

/// A finding's what-if form: its hidden fields (the range, the change, the hop or edge)
/// and the milliseconds to try, when the change takes some.
pub struct WhatIfForm {
    pub fields: Vec<(String, String)>,
    pub value_ms: Option<String>,
}

/// The change a finding implies, as what-if parameters: refusing below the minimum,
/// keeping the reserve, the backstop timeout, or no retries; none for the others, whose
/// change is where the budget travels, not a number.
fn whatif_form(finding: &Finding, range: &TimeRange) -> Option<WhatIfForm> {
    let (change, with_value) = match finding.kind {
        "min_useful_budget" => ("min_useful_budget", true),
        "reserve" => ("reserve", true),
        "timeout_backstop" => ("timeout", true),
        "retry_budget" => ("retries_off", false),
        _ => return None,
    };
    let mut fields: Vec<(String, String)> = range
        .pairs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    fields.push(("change".into(), change.into()));
    let (at, callee) = match &finding.subject {
        Subject::Hop(hop) => (hop, None),
        Subject::Edge { caller, callee } => (caller, Some(callee)),
    };
    fields.push(("service".into(), at.0.clone()));
    fields.push(("operation".into(), at.1.clone()));
    if let Some(callee) = callee {
        fields.push(("callee_service".into(), callee.0.clone()));
        fields.push(("callee_operation".into(), callee.1.clone()));
    }
    Some(WhatIfForm {
        fields,
        value_ms: with_value
            .then(|| finding.value_ms.map(|v| format!("{:.0}", v.ceil())))
            .flatten(),
    })
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

/// A finding as the advisor page and the hop page show it (`templates/finding.html`).
pub fn view(finding: Finding, examples: &[String], range: &TimeRange) -> FindingView {
    let range_query = range.query();
    let range_query = range_query.as_str();
    let end = |hop: &HopId| {
        (
            hop_label(hop),
            (!hop.1.is_empty()).then(|| hop_href(&hop.0, &hop.1, range_query)),
        )
    };
    let ends = match &finding.subject {
        Subject::Edge { caller, callee } => vec![end(caller), end(callee)],
        Subject::Hop(hop) => vec![end(hop)],
    };
    FindingView {
        whatif: whatif_form(&finding, range),
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
    let mut groups: BTreeMap<String, Vec<FindingView>> = BTreeMap::new();
    for (finding, examples) in found {
        let service = finding.subject.service().to_string();
        groups
            .entry(service)
            .or_default()
            .push(view(finding, &examples, &range));
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

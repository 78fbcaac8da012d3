//! `/advisor/whatif`: one proposed change replayed over the range's recorded traces
//! (`web::whatif`), with what it would have done, example traces, the model's assumptions
//! and a form to try another value. Everything is in the URL, so back and a copied link
//! show the same replay.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{PageError, RangeLink, TimeRange, fmt_duration, hop_href, html, trace_href};
use crate::core::advice::{hop_label, ms};
use crate::core::whatif::{ASSUMPTIONS, Change};
use crate::web::AppState;
use crate::web::whatif::{PARAMS, REPLAY_TRACES, change_of, what_if};

#[derive(Template)]
#[template(path = "whatif.html")]
pub struct WhatIfPage {
    pub nav: &'static str,
    pub range: TimeRange,
    pub range_links: Vec<RangeLink>,
    pub range_keep: Vec<(String, String)>,
    pub range_description: String,
    /// "pricing GET /price refuses requests that arrive with less than 250 ms".
    pub description: String,
    pub hop_href: String,
    /// The change's parameters but `value_ms`, for the form.
    pub fixed: Vec<(String, String)>,
    /// The value the form holds, when the change has one.
    pub value_ms: Option<String>,
    pub replayed: usize,
    pub limited: bool,
    pub limit: u32,
    pub skipped: usize,
    pub rows: Vec<(&'static str, String)>,
    pub failed_fast: Vec<(String, String)>,
    pub newly_failed: Vec<(String, String)>,
    pub assumptions: &'static str,
    pub advisor_href: String,
}

/// What the change says, in a sentence.
pub fn describe(change: &Change) -> String {
    match change {
        Change::MinUsefulBudget { hop, ms: value } => format!(
            "{} refuses requests that arrive with less than {} left",
            hop_label(hop),
            ms(*value)
        ),
        Change::Reserve { hop, ms: value } => format!(
            "{} keeps {} back when it forwards its budget",
            hop_label(hop),
            ms(*value)
        ),
        Change::Timeout {
            caller,
            callee,
            ms: value,
        } => format!(
            "{} gives up on {} after {}",
            hop_label(caller),
            hop_label(callee),
            ms(*value)
        ),
        Change::RetriesOff { caller, callee } => {
            format!("{} does not retry {}", hop_label(caller), hop_label(callee))
        }
    }
}

pub async fn whatif(
    State(state): State<AppState>,
    Query(params): Query<BTreeMap<String, String>>,
) -> Result<Response, PageError> {
    let range = TimeRange::from_query(&params)?;
    let change = change_of(&params).map_err(|message| {
        PageError::bad_request(format!(
            "{message}. Open a what-if from a finding on the advisor page."
        ))
    })?;
    let (since, until) = range.aligned();
    let done = what_if(&state, change, since, until)
        .await
        .map_err(|e| e.page("the traces to replay", "Choose a shorter range."))?;
    // The change and where it applies: every parameter but the value and the range.
    let keys = PARAMS
        .iter()
        .filter(|k| !matches!(**k, "value_ms" | "since" | "until"));
    let fixed: Vec<(String, String)> = keys
        .filter_map(|k| params.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    let value_ms = match &done.change {
        Change::RetriesOff { .. } => None,
        Change::MinUsefulBudget { ms, .. }
        | Change::Reserve { ms, .. }
        | Change::Timeout { ms, .. } => Some(crate::core::analyze::fmt_ms(*ms)),
    };
    let mut keep: Vec<(&str, &str)> = fixed
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let value_text = value_ms.clone().unwrap_or_default();
    if value_ms.is_some() {
        keep.push(("value_ms", value_text.as_str()));
    }
    let at = done.change.at().clone();
    let range_query = range.query();
    let e = done.effect;
    let examples = |ids: &[String]| {
        ids.iter()
            .map(|id| (id[..12].to_string(), trace_href(id)))
            .collect::<Vec<_>>()
    };
    let mut advisor_pairs = range.pairs();
    advisor_pairs.push(("service", at.0.as_str()));
    let page = WhatIfPage {
        nav: "advisor",
        range_links: range.links("/advisor/whatif", &keep),
        range_keep: keep
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        range_description: range.description(),
        description: describe(&done.change),
        hop_href: hop_href(&at.0, &at.1, &range_query),
        advisor_href: format!("/advisor{}", super::query_string(advisor_pairs)),
        fixed,
        value_ms,
        replayed: done.replayed,
        limited: done.limited,
        limit: REPLAY_TRACES,
        skipped: done.skipped,
        rows: vec![
            ("Requests replayed", e.seen.to_string()),
            ("The change acts on", e.touched.to_string()),
            (
                "Would have failed fast instead of failing late",
                e.failed_fast.to_string(),
            ),
            ("Waiting and work saved", fmt_duration(e.saved_ms)),
            ("Went well, would newly fail", e.newly_failed.to_string()),
        ],
        failed_fast: examples(&done.failed_fast),
        newly_failed: examples(&done.newly_failed),
        assumptions: ASSUMPTIONS,
        range,
    };
    Ok(html(StatusCode::OK, &page))
}
